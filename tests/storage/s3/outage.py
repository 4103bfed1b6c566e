"""A loopback HTTP proxy in front of the moto server that can *stop and restart* like a server
does (tests/storage/s3/test_outage.py): while down its port refuses connections (the listening
socket is closed); `restart` listens again on the same port. The server behind keeps its
objects, which a restarted in-memory moto would not: what the client sees is a server that went
away and came back.

``stop_on(predicate)`` stops it the instant a request matching ``predicate(method, path)``
arrives, dropping that request unanswered (the server died while it was in flight)."""
from __future__ import annotations

import http.client
import http.server
import threading
from typing import Callable

from benchmarks._loopback_proxy import forward


class OutageProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._stop_on: Callable[[str, str], bool] | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.restart()
        self.endpoint = f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._server is not None

    def stop_on(self, predicate: Callable[[str, str], bool] | None) -> None:
        self._stop_on = predicate

    def restart(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="test-outage-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self.lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> OutageProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(proxy: OutageProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with proxy.lock:
                proxy.requests.append((self.command, self.path))
                dying = proxy._stop_on is not None and proxy._stop_on(self.command, self.path)
                if dying:
                    proxy.dropped.append((self.command, self.path))
                    proxy._stop_on = None
            if dying:  # the server dies with this request in flight: no answer, connection reset
                threading.Thread(target=proxy.stop, daemon=True).start()
                self.close_connection = True
                return
            self._forward(body)

        def _forward(self, body: bytes) -> None:
            forward(self, proxy.upstream_port, body)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Handler

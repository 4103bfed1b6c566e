"""One loopback HTTP proxy in front of the S3 server (benchmarks/_s3_server.py), for the
benchmarks and the object-store tests: it forwards every request and can

- limit the link's bandwidth (``bytes_per_sec``: `Link`, each direction shared by every
  connection, full duplex: two uploads at once each get half; benchmarks/tiers.py);
- answer ``503 SlowDown`` (the first ``fail_first`` requests, every one while ``fail_all``);
- refuse some requests with ``403 AccessDenied`` (``refuse(command, path)`` true: e.g. a bucket
  policy that denies writes under one prefix; clients do not retry it);
- go silent (``black_hole``: new connections accepted and never read, answered or closed;
  ``silence_on(command, path)``: the first request it matches is read and never answered, and
  ``black_hole`` is set from then, e.g. mid multipart upload);
- hold a request (``intercept(command, path)``: called before each request is forwarded, it may
  block, e.g. until a test releases a held manifest PUT);
- cut or change answer bodies (``body_filter(command, headers, body)``: what a forwarded answer's
  body becomes on the wire, its Content-Length still promising the whole body);
- count what crossed it: ``requests``, ``failed`` and one `Exchange` per forwarded request
  (``exchanges``; `bytes_read`: the answer bytes of GETs, e.g. what a restore read from the store).

    with LoopbackProxy(server.port, bytes_per_sec=100e6) as proxy:   # 100 MB/s each way
        options = server.storage_options(endpoint_url=proxy.endpoint)

A real link to an object store is much slower than loopback; without a limit every figure of a
benchmark would measure moto's CPU time, not the network a checkpoint has to cross.
"""
from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Exchange", "Link", "LoopbackProxy", "ThrottleProxy", "forward"]

#: About a request line and its headers: what a body-less request costs the link.
HEADER_BYTES = 200
SLOW_DOWN = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")
ACCESS_DENIED = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
                 b"<Message>Access Denied</Message></Error>")


class Link:
    """One direction of a link: ``carry(n)`` returns once ``n`` bytes have crossed it, behind
    every byte reserved before them (a FIFO at ``bytes_per_sec``)."""

    def __init__(self, bytes_per_sec: float) -> None:
        if bytes_per_sec <= 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_sec!r}")
        self.bytes_per_sec = bytes_per_sec
        self._lock = threading.Lock()
        self._free_at = 0.0
        self.carried = 0

    def carry(self, nbytes: int) -> None:
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = done = start + nbytes / self.bytes_per_sec
            self.carried += nbytes
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the transmission time of this body on the simulated link


@dataclass(frozen=True)
class Exchange:
    """One forwarded request: ``path`` with its query, the ``Range`` header (None: the whole
    object), the answer's ``status``, the request body's and the answer body's bytes."""

    command: str
    path: str
    range: str | None
    status: int
    sent: int
    received: int


class LoopbackProxy:
    """A threaded loopback proxy in front of ``upstream_port`` (see the module's docstring).
    ``bytes_per_sec``: None, no limit; ``upstream_timeout``: seconds a forwarded request may
    take; ``quiet``: a connection that fails mid-answer (a client SIGKILLed) prints nothing."""

    def __init__(self, upstream_port: int, fail_first: int = 0, fail_all: bool = False,
                 body_filter: Callable[[str, Any, bytes], bytes] | None = None, *,
                 bytes_per_sec: float | None = None, upstream_timeout: float = 30.0, quiet: bool = False) -> None:
        self.upstream_port, self.upstream_timeout = upstream_port, upstream_timeout
        self.body_filter = body_filter
        self.fail_first, self.fail_all = fail_first, fail_all
        self.up, self.down = (None, None) if bytes_per_sec is None else (Link(bytes_per_sec), Link(bytes_per_sec))
        self.requests = self.failed = 0
        self.exchanges: list[Exchange] = []
        self.black_hole = False
        self.silence_on: Callable[[str, str], bool] | None = None
        self.intercept: Callable[[str, str], None] | None = None
        self.refuse: Callable[[str, str], bool] | None = None
        self.lock = threading.Lock()
        self._held: list[socket.socket | None] = []
        self._closing = threading.Event()
        self.server = _server(self, quiet)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="loopback-proxy", daemon=True)

    def __enter__(self) -> LoopbackProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
        with self.lock:
            held, self._held = self._held, []
        for connection in held:
            if connection is not None:
                connection.close()

    @property
    def held(self) -> int:
        """Connections the black hole accepted (still open, silent)."""
        with self.lock:
            return len(self._held)

    def bytes_read(self, where: Callable[[str], bool] | None = None) -> int:
        """Answer bytes of the GETs forwarded so far (of those whose path ``where`` accepts)."""
        with self.lock:
            return sum(e.received for e in self.exchanges if e.command == "GET" and (where is None or where(e.path)))

    def _silences(self, command: str, path: str) -> bool:
        with self.lock:
            if self.silence_on is None or not self.silence_on(command, path):
                return False
            self.silence_on, self.black_hole = None, True
            self._held.append(None)  # counted; its handler thread keeps it open
            return True

    def _throttles(self) -> bool:
        with self.lock:
            self.requests += 1
            fail = self.fail_all or self.requests <= self.fail_first
            self.failed += fail
            return fail

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if self._silences(handler.command, handler.path):
            self._closing.wait()  # read, never answered, never closed while the proxy runs
            return
        if self._throttles():
            _answer(handler, 503, SLOW_DOWN, {"Content-Type": "application/xml"})
            return
        if self.refuse is not None and self.refuse(handler.command, handler.path):
            _answer(handler, 403, ACCESS_DENIED, {"Content-Type": "application/xml"})
            return
        if self.intercept is not None:
            self.intercept(handler.command, handler.path)
        if self.up is not None:
            self.up.carry(len(body) + HEADER_BYTES)
        status, received = forward(handler, self.upstream_port, body, self.body_filter, down=self.down,
                                   timeout=self.upstream_timeout)
        with self.lock:
            self.exchanges.append(Exchange(handler.command, handler.path, handler.headers.get("Range"),
                                           status, len(body), received))


class ThrottleProxy(LoopbackProxy):
    """`LoopbackProxy` limited to ``bytes_per_sec`` each way, as benchmarks/tiers.py runs it."""

    def __init__(self, upstream_port: int, bytes_per_sec: float) -> None:
        super().__init__(upstream_port, bytes_per_sec=bytes_per_sec, upstream_timeout=120.0, quiet=True)


def _server(proxy: LoopbackProxy, quiet: bool) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _any(self) -> None:
            proxy._handle(self)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def process_request(self, request: Any, client_address: Any) -> None:
            with proxy.lock:
                if proxy.black_hole:
                    proxy._held.append(request)  # accepted; never read, answered or closed
                    return
            super().process_request(request, client_address)

        def handle_error(self, request: Any, client_address: Any) -> None:
            if not quiet:  # quiet: a client SIGKILLed mid-request, its answer has nowhere to go
                super().handle_error(request, client_address)

    return Server(("127.0.0.1", 0), Handler)


def _answer(handler: http.server.BaseHTTPRequestHandler, status: int, payload: bytes, headers: dict[str, str]) -> None:
    handler.send_response(status)
    for k, v in headers.items():
        handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(payload)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    if handler.command != "HEAD":  # a HEAD answer has no body (S3's 503 to a HEAD neither)
        handler.wfile.write(payload)


def forward(handler: http.server.BaseHTTPRequestHandler, upstream_port: int, body: bytes,
            body_filter: Callable[[str, Any, bytes], bytes] | None = None, *, down: Link | None = None,
            timeout: float = 30.0) -> tuple[int, int]:
    """A loopback proxy's forwarding of one request: ``handler``'s request (``body`` already
    read) goes to the server on ``upstream_port``, its answer back (through ``down`` when given),
    one connection each (``body_filter`` as `LoopbackProxy`'s). Returns the answer's status and
    body bytes."""
    upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=timeout)
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("expect", "connection")}
    upstream.request(handler.command, handler.path, body=body, headers=headers)
    response = upstream.getresponse()
    data = response.read()
    upstream.close()
    if down is not None:
        down.carry(len(data) + HEADER_BYTES)
    handler.send_response(response.status, response.reason)
    for k, v in response.getheaders():
        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
            handler.send_header(k, v)
    # A HEAD answer has no body but the object's length (what stat reports).
    head_length = response.getheader("Content-Length") if handler.command == "HEAD" else None
    handler.send_header("Content-Length", head_length or str(len(data)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    if handler.command != "HEAD":
        handler.wfile.write(data if body_filter is None else body_filter(handler.command, handler.headers, data))
    return response.status, len(data)

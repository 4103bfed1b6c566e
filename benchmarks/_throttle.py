"""A loopback HTTP proxy with a bandwidth limit, for benchmarks/tiers.py: it forwards every
request to the S3 server (benchmarks/_s3_server.py) and holds each body for the time a link of
``bytes_per_sec`` needs to carry it. Uploads share one direction of the link and downloads the
other (full duplex, as a real link), across all connections: two uploads at once each get half.

A real link to an object store is much slower than loopback; without the limit every figure of
the benchmark would measure moto's CPU time, not the network a checkpoint has to cross.

    with ThrottleProxy(server.port, 100e6) as proxy:   # 100 MB/s each way
        options = server.storage_options(endpoint_url=proxy.endpoint)
"""
from __future__ import annotations

import http.client
import http.server
import threading
import time

__all__ = ["Link", "ThrottleProxy"]


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


class ThrottleProxy:
    """A threaded loopback proxy in front of ``upstream_port``, ``bytes_per_sec`` each way."""

    def __init__(self, upstream_port: int, bytes_per_sec: float) -> None:
        self.up, self.down = Link(bytes_per_sec), Link(bytes_per_sec)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                proxy.up.carry(len(body) + 200)  # the body and about a request line and headers
                self._forward(upstream_port, body)

            def _forward(self, port: int, body: bytes) -> None:
                upstream = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                upstream.close()
                proxy.down.carry(len(data) + 200)
                self.send_response(response.status, response.reason)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                head_length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", head_length or str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client SIGKILLed mid-request (the benchmark's point): its answer has nowhere to go

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="bench-throttle-proxy", daemon=True)

    def __enter__(self) -> ThrottleProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

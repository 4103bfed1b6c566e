"""Runs moto's S3 server (what ``python -m moto.server -H HOST -p PORT`` runs) with its writes
serialised: ``python tests/storage/moto_serial.py HOST PORT``.

moto 5.2.1 checks ``If-None-Match``/``If-Match`` and then stores the object in two steps with
no lock between them, on a threaded server; two conditional writes racing on one key could both
pass the check, which real S3 never allows. One lock around every PUT/POST/DELETE makes its
conditional writes atomic, as S3's are; reads and multipart part uploads (which name no
object yet) stay concurrent. Everything else is moto's own
application, unchanged.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Iterable

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

_WRITES = {"PUT", "POST", "DELETE"}


class SerialWrites:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in _WRITES or "partNumber=" in environ.get("QUERY_STRING", ""):
            return self.app(environ, start_response)  # reads and part uploads stay concurrent
        with self.lock:
            return list(self.app(environ, start_response))


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    run_simple(host, port, SerialWrites(DomainDispatcherApplication(create_backend_app)), threaded=True)


if __name__ == "__main__":
    main()

"""A key directory served over loopback (stdlib server, port 0), for processes that must know the
``Signature-Agent`` URL before they start."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from signing_proxy.core.jwk import SigningKey
from signing_proxy.core.keys import (
    DIRECTORY_MEDIA_TYPE,
    DIRECTORY_PATH,
    Directory,
    DirectoryKey,
    render_directory,
)
from tests.harness import WAIT_S


@contextlib.contextmanager
def served_directory(*keys: SigningKey) -> Iterator[str]:
    """Serve a directory holding ``keys`` (valid from a minute ago for an hour); yield its base URL."""
    now = int(time.time())
    body = render_directory(Directory(tuple(DirectoryKey(k.public, now - 60, now + 3600) for k in keys)))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == DIRECTORY_PATH
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", DIRECTORY_MEDIA_TYPE)
            self.send_header("Content-Length", str(len(body) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="directory-host", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)

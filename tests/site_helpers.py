"""The test "internet": a web site on a loopback address that answers every GET
with its path and notes what it was asked."""

from __future__ import annotations

import http.server
import threading


class Site(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("User-Agent", "")))
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class SiteServer(http.server.ThreadingHTTPServer):
    request_queue_size = 256  # the default 5 would drop a hundred connects at once, not the proxy

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.seen: list[tuple[str, str]] = []  # (path, User-Agent) of each request


def serve_site(address: str) -> SiteServer:
    """A site on `address`, on a free port, served by a thread of its own until shut down."""
    server = SiteServer((address, 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

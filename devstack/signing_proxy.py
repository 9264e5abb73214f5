"""A loopback proxy that signs every request it forwards with SigV4, for tools that cannot sign themselves.

schemathesis (``make fuzz``) generates requests from the OpenAPI document and sends them as they are; the API is
IAM-authorized, so each request must carry a signature over exactly what it sends. The proxy reads the request,
signs it for ``execute-api`` as a local identity (`devstack.identities.sign`, botocore's signer), and forwards it,
path and query untouched, to the API; the answer goes back unchanged.
"""

from __future__ import annotations

import http.server
import threading
from types import TracebackType
from typing import Any

import urllib3

from devstack.identities import sign

__all__ = ["SigningProxy"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        url = self.server.target + self.path
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        signed = sign(self.command, url, body=body, headers=headers, caller=self.server.caller)
        response = self.server.pool.request(
            self.command, url, body=body or None, headers=signed, retries=False, redirect=False, timeout=60.0
        )
        self.send_response(response.status)
        for name, value in response.headers.items():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("content-length", str(len(response.data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward  # noqa: N815


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    target: str
    caller: str
    pool: urllib3.PoolManager


class SigningProxy:
    """Serve ``http://127.0.0.1:<port>`` and forward everything to ``target``, signed by ``caller``.

    Use as a context manager; `url` is the proxy's base URL.
    """

    def __init__(self, target: str, *, caller: str = "client-a") -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.target = target.rstrip("/")
        self._server.caller = caller
        self._server.pool = urllib3.PoolManager(maxsize=8)
        self._thread = threading.Thread(target=self._server.serve_forever, name="signing-proxy", daemon=True)

    @property
    def url(self) -> str:
        """The proxy's base URL."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> SigningProxy:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

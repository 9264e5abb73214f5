"""An HTTP client of the local stack's API that signs every request with SigV4, as a caller of the deployed API.

Every route of the API is IAM-authorized (template ``ApiAuthorizer``), so the demo, the load run, fuzzing and the
tests call it like this::

    api = SignedHttp(stack.api_url)                    # client-a by default (devstack.identities)
    status, body = api.post("/workflows", request, headers={"Idempotency-Key": "trip-1"})
    status, body = api.get(f"/workflows/{workflow_id}", caller="client-b")   # 404: not B's workflow

The signature comes from botocore's signer (`devstack.identities.sign`), never from code of ours.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3

from devstack.identities import sign

__all__ = ["SignedHttp"]


class SignedHttp:
    """Signed JSON requests to one base URL.

    Parameters
    ----------
    base_url
        The API's URL, e.g. ``http://127.0.0.1:3000``.
    caller
        The local identity that signs by default (``client-a``, ``client-b`` or ``operator``).
    pool
        A urllib3 pool manager to share; a new one by default.
    region
        The API's region (part of the signature's scope).
    """

    def __init__(
        self,
        base_url: str,
        *,
        caller: str = "client-a",
        pool: urllib3.PoolManager | None = None,
        region: str = "us-east-1",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.caller = caller
        self.pool = pool or urllib3.PoolManager()
        self.region = region

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        caller: str | None = None,
        signed: bool = True,
        **urllib3_options: Any,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request; ``signed=False`` sends it unsigned (API Gateway answers 403).

        The URL is signed as urllib3 sends it (percent-escapes upper-cased, RFC 3986 section 6.2.2.1): signed as
        given, ``/workflows/%ff`` went out as ``%FF`` and its valid signature was refused 403, as AWS would refuse it.
        """
        url = urllib3.util.parse_url(self.base_url + path).url
        all_headers = dict(headers or {})
        if signed:
            all_headers = sign(
                method, url, body=body, headers=all_headers, caller=caller or self.caller, region=self.region
            )
        return self.pool.request(method, url, body=body, headers=all_headers, **urllib3_options)

    def post(
        self, path: str, document: Any = None, *, headers: dict[str, str] | None = None, **options: Any
    ) -> tuple[int, Any]:
        """POST ``document`` as JSON; return the status and the parsed JSON body (None when empty)."""
        body = b"" if document is None else json.dumps(document).encode()
        response = self.request(
            "POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})}, **options
        )
        return response.status, _parsed(response.data)

    def get(self, path: str, **options: Any) -> tuple[int, Any]:
        """GET ``path``; return the status and the parsed JSON body."""
        response = self.request("GET", path, **options)
        return response.status, _parsed(response.data)


def _parsed(data: bytes) -> Any:
    return json.loads(data) if data else None

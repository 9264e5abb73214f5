"""The remote-service client over HTTP (urllib3, no client-side retries: the agent runtime owns retrying).

Wire contract: ``POST {base_url}/{action}`` with ``Idempotency-Key: <token>`` and the JSON body
``{"token", "workflow_id", "step", "input", "original_token"}``. A 2xx JSON object is the step's output; 409 and
422 are business rejections (nothing happened); 408, 429 and 5xx, timeouts and connection errors are transient.
Other 4xx mean the request itself is wrong and are permanent rejections.

Authentication (agents.yaml ``auth``): none; SigV4 with the function's role (botocore's signer, for services behind
IAM: API Gateway ``execute-api`` or Lambda function URLs, service ``lambda``); or a header whose value is a secret.
Errors kept on a step are shown to API callers, so they never carry connection details (hosts, ports): those go to
the agent's log.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import HTTPError, ReadTimeoutError

from ..errors import RemoteRejectedError, RemoteTransientError
from ..messages import StepRequest

logger = logging.getLogger("sasflow.remote")

_TRANSIENT = {408, 425, 429}
_BUSINESS = {409, 422}


class RemoteAuth(Protocol):
    """Adds the headers that authenticate one request to the remote service."""

    def headers(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """Return ``headers`` with the authentication headers added."""
        ...


class NoAuth:
    """No authentication (a service on a private network, or the local stack's sample services)."""

    def headers(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """Return ``headers`` unchanged."""
        return headers


class SigV4Auth:
    """Signs each request with AWS Signature Version 4 (botocore's signer), with the function's credentials.

    Parameters
    ----------
    credentials:
        Returns botocore credentials (the standard chain's; on Lambda the function's role, refreshed as needed).
    region:
        The region to sign for; a URL of the form ``<id>.execute-api.<region>.amazonaws.com`` names its own.
    """

    def __init__(self, credentials: Callable[[], Any], region: str) -> None:
        self._credentials = credentials
        self.region = region

    def headers(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """Return ``headers`` with ``Authorization``, ``X-Amz-Date`` (and ``X-Amz-Security-Token``) added."""
        from botocore.auth import SigV4Auth as BotocoreSigV4
        from botocore.awsrequest import AWSRequest

        host = urlsplit(url).hostname or ""
        service = "lambda" if ".lambda-url." in host else "execute-api"
        parts = host.split(".")
        region = parts[2] if len(parts) > 3 and parts[1] in ("execute-api", "lambda-url") else self.region
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        BotocoreSigV4(self._credentials().get_frozen_credentials(), service, region).add_auth(request)
        return dict(request.headers.items())


class HeaderAuth:
    """Sends a fixed header whose value is a secret (an API key), read through ``secret`` (cached by its reader)."""

    def __init__(self, name: str, secret: Callable[[], str]) -> None:
        self.name = name
        self._secret = secret

    def headers(self, method: str, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        """Return ``headers`` with the secret header added."""
        return {**headers, self.name: self._secret()}


def default_sigv4() -> SigV4Auth:
    """SigV4 with the standard credential chain and the function's region (at the edge: bootstrap)."""
    import boto3

    session = boto3.session.Session()
    return SigV4Auth(session.get_credentials, session.region_name or os.environ.get("AWS_REGION", "us-east-1"))


class HttpRemoteClient:
    """Calls one remote service.

    Parameters
    ----------
    base_url:
        The service's base URL (no trailing slash).
    pool:
        A urllib3 pool manager, injected; one per cold start keeps connections alive between invocations.
    auth:
        How requests authenticate (``NoAuth`` by default).
    """

    def __init__(
        self, base_url: str, pool: urllib3.PoolManager | None = None, *, auth: RemoteAuth | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.pool = pool or urllib3.PoolManager(num_pools=4, maxsize=10)
        self.auth = auth or NoAuth()

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        """Perform ``request.action`` once.

        Parameters
        ----------
        request:
            The step request; its ``token`` is sent as the Idempotency-Key.
        timeout_seconds:
            Upper bound of the whole call (connect + read), seconds.

        Returns
        -------
        dict
            The service's JSON object (a non-object body is wrapped as ``{"result": body}``).

        Raises
        ------
        RemoteRejectedError
            On 409/422 (business) and other 4xx (bad request).
        RemoteTransientError
            On 408/425/429/5xx, a timeout or a connection error; ``outcome_unknown`` after a read timeout.
        """
        body = json.dumps(
            {
                "token": request.token,
                "workflow_id": request.workflow_id,
                "step": request.step,
                "input": request.input,
                "original_token": request.original_token,
            }
        ).encode()
        timeout = urllib3.Timeout(connect=min(2.0, timeout_seconds), read=timeout_seconds)
        url = f"{self.base_url}/{request.action}"
        headers = self.auth.headers(
            "POST", url, body, {"Content-Type": "application/json", "Idempotency-Key": request.token}
        )
        try:
            response = self.pool.request("POST", url, body=body, headers=headers, timeout=timeout, retries=False)
        except ReadTimeoutError as exc:
            raise RemoteTransientError(f"read timeout after {timeout_seconds:.1f}s", outcome_unknown=True) from exc
        except HTTPError as exc:
            # The detail names hosts and ports: it goes to the log; the step (shown to callers) gets the kind.
            logger.warning(
                "remote call failed",
                extra={"workflow_id": request.workflow_id, "step": request.step, "error": str(exc)[:500]},
            )
            raise RemoteTransientError(f"connection failed ({type(exc).__name__})") from exc
        status = response.status
        payload = _json(response.data)
        if 200 <= status < 300:
            return payload if isinstance(payload, dict) else {"result": payload}
        error = payload if isinstance(payload, dict) else {}
        code = str(error.get("error") or f"HTTP_{status}")[:64]
        message = str(error.get("message") or response.reason or "")[:2048]
        if status in _TRANSIENT or status >= 500:
            raise RemoteTransientError(f"{status} {code}: {message}", status=status)
        if status in _BUSINESS:
            raise RemoteRejectedError(code, message, status)
        raise RemoteRejectedError(f"HTTP_{status}", message or code, status)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return {"raw": data[:512].decode("utf-8", "replace")}

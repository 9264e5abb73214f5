"""The remote-service client over HTTP (urllib3, no client-side retries: the agent runtime owns retrying).

Wire contract: ``POST {base_url}/{action}`` with ``Idempotency-Key: <token>`` and the JSON body
``{"token", "workflow_id", "step", "input", "original_token"}``. A 2xx JSON object is the step's output; 409 and
422 are business rejections (nothing happened); 408, 429 and 5xx, timeouts and connection errors are transient.
Other 4xx mean the request itself is wrong and are permanent rejections.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from urllib3.exceptions import HTTPError, ReadTimeoutError

from ..errors import RemoteRejectedError, RemoteTransientError
from ..messages import StepRequest

_TRANSIENT = {408, 425, 429}
_BUSINESS = {409, 422}


class HttpRemoteClient:
    """Calls one remote service.

    Parameters
    ----------
    base_url:
        The service's base URL (no trailing slash).
    pool:
        A urllib3 pool manager, injected; one per cold start keeps connections alive between invocations.
    """

    def __init__(self, base_url: str, pool: urllib3.PoolManager | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.pool = pool or urllib3.PoolManager(num_pools=4, maxsize=10)

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
        try:
            response = self.pool.request(
                "POST",
                f"{self.base_url}/{request.action}",
                body=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": request.token},
                timeout=timeout,
                retries=False,
            )
        except ReadTimeoutError as exc:
            raise RemoteTransientError(f"read timeout after {timeout_seconds:.1f}s", outcome_unknown=True) from exc
        except HTTPError as exc:
            raise RemoteTransientError(f"connection failed: {exc}") from exc
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
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"raw": data[:512].decode("utf-8", "replace")}

"""The HTTP side of the CLI: one signed JSON request at a time, retried safely, errors as `ApiError`.

Every route of the API is IAM-authorized, so each request is signed with SigV4 for ``execute-api`` by a `Signer`
(`sasflow_cli.targets` builds one: a local identity for the local stack, the standard credential chain for a
deployed stack). A request is retried on a connection error or a 429/502/503/504 only when repeating it is safe:
a GET, or a POST that carries an ``Idempotency-Key`` (the same key on every try, so the API applies it once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import urllib3

__all__ = ["ApiError", "Routes", "SasflowClient", "Signer", "Transport", "UrllibTransport", "api_path", "query_string"]

#: Statuses worth another try: throttled, or a gateway/back end that did not answer.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


#: A skip with no ``--output``: the body has no ``output`` (JSON null is an output the server takes as given).
NO_OUTPUT: Any = object()


class ApiError(Exception):
    """The API refused a request (its ``error`` code and ``message``), or could not be reached (status 0)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: list[dict[str, Any]] | None = None,
        *,
        source: str = "api",
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        #: Who refused: the API, or a client of it that checked first (the console).
        self.source = source


class Signer(Protocol):
    """Signs one request; returns the headers to send (``headers`` plus the signature's)."""

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]: ...


class Transport(Protocol):
    """Sends one request; returns the status and the body (raises ``OSError`` when nothing answered)."""

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]: ...


class UrllibTransport:
    """`Transport` over urllib3 (no redirects, no urllib3 retries: `SasflowClient` decides what to retry)."""

    def __init__(self, timeout_seconds: float = 30.0, pool: urllib3.PoolManager | None = None) -> None:
        self.timeout_seconds = timeout_seconds
        self.pool = pool or urllib3.PoolManager()

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        try:
            response = self.pool.request(
                method,
                url,
                body=body or None,
                headers=dict(headers),
                retries=False,
                redirect=False,
                timeout=self.timeout_seconds,
            )
        except urllib3.exceptions.HTTPError as error:
            raise OSError(str(error)) from error
        return response.status, response.data


def api_path(*segments: str | int) -> str:
    """A path of the API from its segments, each percent-encoded per RFC 3986 (only the unreserved characters
    ``A-Z a-z 0-9 - . _ ~`` stay as they are; ``/``, ``:`` and a space are encoded).

    API Gateway checks a SigV4 signature against the path it receives, URI-encoded per RFC 3986 (the SigV4 guide,
    "Create a canonical request"). A segment sent unencoded, such as a definition name with a space, was signed
    as one string and checked as another, and refused with 403.

    Examples
    --------
    >>> api_path("definitions", "order saga", "versions", 2)
    '/definitions/order%20saga/versions/2'
    """
    return "".join("/" + quote(str(segment), safe="") for segment in segments)


def query_string(params: Mapping[str, Any]) -> str:
    """``params`` as a query string per RFC 3986 (a space is ``%20``, never ``+``), ``None`` values left out.

    SigV4 canonicalizes every query name and value with RFC 3986's encoding; ``urlencode``'s default writes a space
    as ``+``, which the service reads as a literal ``+`` of another canonical request, so the signature failed.
    """
    present = {key: value for key, value in params.items() if value is not None}
    return urlencode(present, quote_via=quote, safe="")


@dataclass(frozen=True)
class Routes:
    """Which routes a caller reads through: the operators' (``/ops``, any workflow) or the clients' (its own)."""

    operator: bool = True

    def workflow(self, workflow_id: str) -> str:
        return api_path("ops", "workflows", workflow_id) if self.operator else api_path("workflows", workflow_id)


class SasflowClient:
    """The sasflow API as Python calls returning parsed JSON.

    Parameters
    ----------
    base_url
        The API's URL, e.g. ``http://127.0.0.1:3000`` or ``https://<id>.execute-api.<region>.amazonaws.com``.
    signer
        Signs every request.
    transport
        Sends it (urllib3 by default).
    operator
        Read workflows through ``/ops`` (any owner; the default) or through the clients' routes (own ones only).
    attempts
        Tries per request, the first included (retries only where safe, see the module docstring).
    sleep
        Waits between tries (seconds; injected by tests).
    """

    def __init__(
        self,
        base_url: str,
        signer: Signer,
        *,
        transport: Transport | None = None,
        operator: bool = True,
        attempts: int = 3,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.signer = signer
        self.transport: Transport = transport or UrllibTransport()
        self.routes = Routes(operator=operator)
        self.attempts = max(1, attempts)
        self.sleep = sleep

    # ------------------------------------------------------------------ one request
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Send one request and return its parsed JSON body.

        ``path`` is already encoded (build it with `api_path`); ``query`` is encoded here (`query_string`). The URL
        signed is the URL sent, byte for byte.

        Raises
        ------
        ApiError
            A 4xx/5xx answer (its ``error`` and ``message``; API Gateway's own refusals carry only ``message``), or
            no answer after every try (status 0, ``UNREACHABLE``).
        """
        encoded_query = query_string(query or {})
        url = self.base_url + path + (f"?{encoded_query}" if encoded_query else "")
        data = b"" if body is None else json.dumps(body).encode()
        headers: dict[str, str] = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        safe = method in ("GET", "PUT") or bool(idempotency_key)  # PUT is idempotent (RFC 9110 9.2.2)
        tries = self.attempts if safe else 1
        for attempt in range(1, tries + 1):
            signed = self.signer(method, url, data, headers)  # signed again each try: a signature has a date
            try:
                status, raw = self.transport(method, url, data, signed)
            except OSError as error:
                if attempt == tries:
                    raise ApiError(0, "UNREACHABLE", f"{method} {url}: {error}{UNREACHABLE_HINT}") from error
            else:
                if status < 400:
                    return json.loads(raw) if raw else None
                if status not in RETRYABLE_STATUSES or attempt == tries:
                    raise _api_error(status, raw, path)
            self.sleep(min(4.0, 0.5 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    # ------------------------------------------------------------------ workflows
    def start(self, request: Mapping[str, Any], *, idempotency_key: str) -> Any:
        """``POST /workflows``: the started (or, for a key seen before, the existing) WorkflowView."""
        return self.request("POST", "/workflows", body=dict(request), idempotency_key=idempotency_key)

    def publish_definition(self, name: str, version: int, definition: Mapping[str, Any]) -> Any:
        """``PUT /definitions/{name}/versions/{version}``: the DefinitionVersionView (idempotent: sent again on a
        lost answer, the same body is 200)."""
        return self.request("PUT", api_path("definitions", name, "versions", version), body=dict(definition))

    def definitions(self, name: str | None = None) -> Any:
        """``GET /definitions`` (every name with its latest version) or ``GET /definitions/{name}`` (its versions)."""
        return self.request("GET", api_path("definitions", name) if name else api_path("definitions"))

    def callback(self, token: str, body: Mapping[str, Any]) -> Any:
        """``POST /callbacks/{token}``: the CallbackResult (sent once: a repeat of an applied use is a 409)."""
        return self.request("POST", api_path("callbacks", token), body=dict(body))

    def answer_callback(
        self,
        token: str,
        answer: str,
        *,
        reason: str,
        idempotency_key: str,
        output: Any = None,
        code: str | None = None,
    ) -> Any:
        """``POST /ops/callbacks/{token}``: an operator's ``approve`` (with ``output``) or ``reject`` (with ``code``) of
        any workflow's waiting callback step, audited with ``reason``; the CallbackResult (the same answer again is
        the first result, so it is retried safely)."""
        body: dict[str, Any] = {"answer": answer, "reason": reason}
        if answer == "approve":
            body["output"] = output
        elif code:
            body["code"] = code
        path = api_path("ops", "callbacks", token)
        return self.request("POST", path, body=body, idempotency_key=idempotency_key)

    def get(self, workflow_id: str) -> Any:
        """The WorkflowView of ``workflow_id``."""
        return self.request("GET", self.routes.workflow(workflow_id))

    def history_pages(self, workflow_id: str, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """Every HistoryPage of the workflow, following ``next_cursor``, oldest events first."""
        cursor: str | None = None
        while True:
            page = self.request(
                "GET", self.routes.workflow(workflow_id) + "/history", query={"cursor": cursor, "limit": limit}
            )
            yield page
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def history(self, workflow_id: str, *, limit: int | None = None) -> dict[str, Any]:
        """The whole history as one HistoryPage (every page's events, ``next_cursor`` null)."""
        pages = list(self.history_pages(workflow_id, limit=limit))
        merged = dict(pages[-1])
        merged["events"] = [event for page in pages for event in page["events"]]
        merged["next_cursor"] = None
        return merged

    def list_pages(
        self,
        *,
        status: str | None = None,
        definition: str | None = None,
        started_after: int | None = None,
        started_before: int | None = None,
        trigger: str | None = None,
        version: int | None = None,
        owner: str | None = None,
        error_code: str | None = None,
        step: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        counts: bool = True,
        follow: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Pages of ``GET /ops/workflows`` from ``cursor`` (None: the first); only one page unless ``follow``."""
        while True:
            page = self.request(
                "GET",
                "/ops/workflows",
                query={
                    "status": status,
                    "definition": definition,
                    "started_after": started_after,
                    "started_before": started_before,
                    "trigger": trigger,
                    "version": version,
                    "owner": owner,
                    "error_code": error_code,
                    "step": step,
                    "limit": limit,
                    "cursor": cursor,
                    "counts": None if counts else "false",
                },
            )
            yield page
            cursor = page.get("next_cursor")
            if not follow or not cursor:
                return

    def map_children(
        self, workflow_id: str, step: str, *, status: str | None = None, cursor: str | None = None, limit: int = 50
    ) -> Any:
        """``GET /ops/workflows/{id}/steps/{step}/children``: one MapChildrenPage of a map step's children."""
        path = api_path("ops", "workflows", workflow_id, "steps", step, "children")
        return self.request("GET", path, query={"status": status, "cursor": cursor, "limit": limit})

    def step_input(self, workflow_id: str, step: str) -> Any:
        """``GET /ops/workflows/{id}/steps/{step}/input``: the StepInputView (the input rendered now)."""
        return self.request("GET", api_path("ops", "workflows", workflow_id, "steps", step, "input"))

    def payload(self, workflow_id: str, digest: str) -> Any:
        """``GET /ops/workflows/{id}/payloads/{digest}``: a claim-checked payload of the workflow (PayloadView)."""
        return self.request("GET", api_path("ops", "workflows", workflow_id, "payloads", digest))

    def act(
        self,
        workflow_id: str,
        action: str,
        *,
        reason: str,
        idempotency_key: str,
        step: str | None = None,
        step_input: dict[str, Any] | None = None,
        output: Any = NO_OUTPUT,
    ) -> Any:
        """``POST /ops/workflows/{id}/{action}``: the WorkflowView after the action (`ApiError` 409 if it does not
        apply). A client identity's ``cancel`` goes to the clients' route, which takes no reason. ``output`` (a
        skip's) is sent when given, JSON null too; `NO_OUTPUT` leaves it out of the body."""
        if action == "cancel" and not self.routes.operator:
            return self.request("POST", self.routes.workflow(workflow_id) + "/cancel")
        body: dict[str, Any] = {"reason": reason}
        if step is not None:
            body["step"] = step
        if step_input is not None:
            body["input"] = step_input
        if output is not NO_OUTPUT:
            body["output"] = output
        path = api_path("ops", "workflows", workflow_id, action)
        return self.request("POST", path, body=body, idempotency_key=idempotency_key)

    # ------------------------------------------------------------------ operations
    def overdue(self, *, limit: int | None = None, older_than: int | None = None) -> Any:
        """``GET /ops/overdue`` (``older_than``: seconds overdue, at least)."""
        return self.request("GET", "/ops/overdue", query={"limit": limit, "older_than": older_than})

    def dead_letters(self, queue: str | None = None, *, limit: int | None = None) -> Any:
        """``GET /ops/dead-letters``: every queue's depth, or one queue's messages (``limit`` 0: only its depth and
        move tasks, no message received)."""
        return self.request("GET", "/ops/dead-letters", query={"queue": queue, "limit": limit if queue else None})

    def triggers(self) -> Any:
        """``GET /ops/triggers``: every trigger, paused or not, and what it skipped."""
        return self.request("GET", "/ops/triggers")

    def trigger_action(self, name: str, action: str, *, reason: str, idempotency_key: str) -> Any:
        """``POST /ops/triggers/{name}/{action}`` (pause, resume, run-now): the trigger, or the run-now sent."""
        path = api_path("ops", "triggers", name, action)
        return self.request("POST", path, body={"reason": reason}, idempotency_key=idempotency_key)

    # ------------------------------------------------------------------ batches
    def start_batch(
        self,
        action: str,
        where: dict[str, Any],
        *,
        reason: str,
        idempotency_key: str,
        step: str | None = None,
        max_per_second: int | None = None,
        dry_run: bool = False,
        **output: Any,
    ) -> Any:
        """``POST /ops/batches``: the BatchView of the batch started (or the one this key started already), or with
        ``dry_run`` the BatchPreview (counts; nothing written). ``output=...`` (a skip's, null too) is sent when
        given."""
        body: dict[str, Any] = {"action": action, "where": where, "reason": reason, "dry_run": dry_run, **output}
        if step is not None:
            body["step"] = step
        if max_per_second is not None:
            body["max_per_second"] = max_per_second
        return self.request("POST", "/ops/batches", body=body, idempotency_key=idempotency_key)

    def batches(self, *, limit: int | None = None, cursor: str | None = None) -> Any:
        """``GET /ops/batches``: one BatchList page, newest first."""
        return self.request("GET", "/ops/batches", query={"limit": limit, "cursor": cursor})

    def batch(self, batch_id: str) -> Any:
        """``GET /ops/batches/{id}``: the BatchView."""
        return self.request("GET", api_path("ops", "batches", batch_id))

    def batch_workflows(self, batch_id: str, *, cursor: str | None = None, limit: int | None = None) -> Any:
        """``GET /ops/batches/{id}/workflows``: one page of what the batch touched, with each outcome."""
        path = api_path("ops", "batches", batch_id, "workflows")
        return self.request("GET", path, query={"cursor": cursor, "limit": limit})

    def cancel_batch(self, batch_id: str, *, reason: str) -> Any:
        """``POST /ops/batches/{id}/cancel``: the BatchView, CANCELLED (again: as it is)."""
        return self.request("POST", api_path("ops", "batches", batch_id, "cancel"), body={"reason": reason})

    def redrive(self, queue: str, *, reason: str, max_per_second: int | None = None) -> Any:
        """``POST /ops/dead-letters/redrive`` (not retried: a second move of the same queue is not a no-op)."""
        body: dict[str, Any] = {"queue": queue, "reason": reason}
        if max_per_second is not None:
            body["max_per_second"] = max_per_second
        return self.request("POST", "/ops/dead-letters/redrive", body=body)


#: Added when nothing answered, after every try.
UNREACHABLE_HINT = " (nothing answered: is the stack up? `make up` prints its URL; a deployed stack: --stack NAME)"
#: Added to API Gateway's bare 403 on an operators' route: who may call it, and how to sign as them.
OPS_FORBIDDEN_HINT = (
    " (the /ops routes are the operators': IAM allows them to the operator role only. Sign as an operator: on the"
    " local stack --as operator, the default; on AWS credentials of a role granted execute-api:Invoke on /ops, see"
    " docs/security.md. A client reads its own workflows with get, watch and history)"
)


def _api_error(status: int, raw: bytes, path: str = "") -> ApiError:
    try:
        document = json.loads(raw) if raw else {}
    except ValueError:
        document = {}
    if not isinstance(document, dict):
        document = {}
    text = raw[:200].decode("utf-8", "replace")
    code = str(document.get("error") or f"HTTP_{status}")
    message = str(document.get("message") or text or "no body")
    details = document.get("details") if isinstance(document.get("details"), list) else None
    if status == 403 and path.startswith("/ops/") and "error" not in document:
        message += OPS_FORBIDDEN_HINT  # API Gateway's refusal, before any function: it says only "Forbidden"
    return ApiError(status, code, message, details)

"""The HTTP API: powertools ``APIGatewayHttpResolver`` with validation, so the OpenAPI spec comes from the models.

Routes
------
- ``POST /workflows``: start a workflow (201), or return the one an ``Idempotency-Key`` already started (200).
- ``GET /workflows/{workflow_id}``: the workflow and its steps (with their times).
- ``GET /workflows/{workflow_id}/history``: its history, oldest event first, a page at a time (``cursor``).
- ``PUT /definitions/{name}/versions/{version}``, ``GET /definitions``, ``GET /definitions/{name}``,
  ``GET /definitions/{name}/versions/{version}``: definitions registered by name and version (``registry``).
- ``POST /callbacks/{token}``: answer a callback step's attempt with its task token (``callbacks``): succeeded (an
  output), failed (an error), or a heartbeat. 200, or 404 / 409 (used already) / 410 (its attempt is over).
- ``POST /workflows/{workflow_id}/cancel``: stop a running workflow and compensate what may have happened (202;
  again on a cancelling or cancelled workflow, the same answer and nothing changes).

The operators' routes (``/ops``) are another function's: ``ops_api``.
- ``GET /openapi.json``: the OpenAPI 3 document.

Who may call: API Gateway authorizes every route (IAM or JWT, template ``ApiAuthorizer``); the function reads the
verified principal from the request context (``identity.principal_of``). A workflow belongs to the principal that
started it: for anyone else it does not exist (404 on every route of it, never 403, so ids cannot be probed).

Errors become HTTP status codes in exactly one place, the ``_REFUSALS`` table: one handler is registered for its
exceptions and every route documents its statuses, so each refusal is a documented 4xx with a JSON ``ErrorResponse``
body. A refused request writes nothing and sends nothing (DESIGN Rule 9). Request bodies are strict JSON
(``parse_json_body``) sent as ``application/json`` in UTF-8; anything else is a 400 or a 415, never a 500.
"""

from __future__ import annotations

import binascii
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, unquote

from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.event_handler.api_gateway import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.middlewares.openapi_validation import OpenAPIRequestValidationMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from .api_models import ErrorResponse, HistoryPage, StartWorkflowRequest, WorkflowView
from .callbacks import (
    MAX_TOKEN_CHARS,
    CallbackExpiredError,
    CallbackNotFoundError,
    CallbackRequest,
    CallbackResult,
    CallbackUsedError,
)
from .clock import epoch_seconds
from .definition import WorkflowDefinition
from .errors import (
    BatchNotFoundError,
    ConditionFailedError,
    ConditionNotEvaluatedError,
    DeadLetterQueueNotFoundError,
    IdempotencyKeyConflictError,
    InvalidCursorError,
    InvalidDefinitionError,
    MissingReferenceError,
    PayloadNotFoundError,
    PayloadTooLargeError,
    StepNotDispatchedError,
    StepNotFoundError,
    TenantKeyError,
    TenantLimitError,
    TriggerAlreadyPausedError,
    TriggerNotFoundError,
    TriggerNotRunnableError,
    UnauthenticatedError,
    UnknownStepError,
    WaitNotEvaluatedError,
    WorkflowNotFoundError,
)
from .identity import principal_of
from .limits import MAX_REQUEST_BYTES
from .messages import canonical_hash
from .ports import MessageBus
from .registry import (
    DefinitionList,
    DefinitionName,
    DefinitionNameTakenError,
    DefinitionNotFoundError,
    DefinitionNotRegisteredError,
    DefinitionRef,
    DefinitionRegistry,
    DefinitionVersionConflictError,
    DefinitionVersionList,
    DefinitionVersionView,
)
from .scheduler import SchedulerService
from .strict_json import parse_json_body
from .types import IdempotencyKey, WorkflowId

logger = logging.getLogger("sasflow.api")

#: Most events one history page holds.
MAX_HISTORY_PAGE = 500


# ------------------------------------------------------------------------------------------ refusals (one place)
@dataclass(frozen=True)
class _Refusal:
    status: int
    code: str
    description: str
    message: Callable[[Exception], str] = str


#: The same words for every token the caller may not answer (its owner's or forged alike: nothing tells them apart).
_CALLBACK_HINT = (
    " for this caller: a task token is answered as the principal that started its workflow (its owner), with the"
    " token exactly as the callback step received it"
)


def _validation_message(exc: Exception) -> str:
    return "the request does not match the schema"


#: Every exception the API turns into an HTTP status, and nowhere else: the handlers are registered from this table
#: and the documented error responses of every route are generated from it, so the two cannot drift apart.
#: Powertools picks the entry of the nearest class in the exception's MRO.
_REFUSALS: dict[type[Exception], _Refusal] = {
    NotFoundError: _Refusal(404, "NOT_FOUND", "No such route", lambda exc: "no such route"),
    WorkflowNotFoundError: _Refusal(404, "WORKFLOW_NOT_FOUND", "No such workflow", lambda exc: f"no workflow {exc}"),
    StepNotFoundError: _Refusal(404, "STEP_NOT_FOUND", "The workflow has no such step"),
    StepNotDispatchedError: _Refusal(409, "STEP_NOT_DISPATCHED", "The step was not dispatched yet"),
    PayloadNotFoundError: _Refusal(404, "PAYLOAD_NOT_FOUND", "No such claim-checked payload of the workflow"),
    DeadLetterQueueNotFoundError: _Refusal(404, "QUEUE_NOT_FOUND", "No such dead-letter queue"),
    TriggerNotFoundError: _Refusal(404, "TRIGGER_NOT_FOUND", "No such trigger (triggers.yaml)"),
    BatchNotFoundError: _Refusal(404, "BATCH_NOT_FOUND", "No such batch of operator actions"),
    TriggerAlreadyPausedError: _Refusal(409, "TRIGGER_ALREADY_PAUSED", "Another pause holds the trigger"),
    TriggerNotRunnableError: _Refusal(409, "TRIGGER_NOT_RUNNABLE", "An event or queue trigger starts on what arrives"),
    InvalidCursorError: _Refusal(400, "INVALID_CURSOR", "A cursor this API did not give"),
    IdempotencyKeyConflictError: _Refusal(409, "IDEMPOTENCY_KEY_REUSED", "Idempotency-Key used with another body"),
    TenantLimitError: _Refusal(429, "TENANT_LIMIT", "The tenant runs its definition's tenancy.max_running already"),
    TenantKeyError: _Refusal(422, "TENANT_KEY_NOT_EVALUATED", "The definition's tenancy.tenant_key names no tenant"),
    ConditionFailedError: _Refusal(409, "CONFLICT", "The workflow is not in a state that allows this"),
    UnauthenticatedError: _Refusal(403, "FORBIDDEN", "No verified caller identity"),
    PayloadTooLargeError: _Refusal(413, "PAYLOAD_TOO_LARGE", "Payload too large (body, step input, SQS, DynamoDB)"),
    RequestUnsupportedContentType: _Refusal(415, "UNSUPPORTED_MEDIA_TYPE", "The body is not application/json"),
    InvalidDefinitionError: _Refusal(422, "INVALID_DEFINITION", "The definition cannot run here"),
    CallbackNotFoundError: _Refusal(
        404, "CALLBACK_NOT_FOUND", "No such task token", lambda exc: f"{exc}{_CALLBACK_HINT}"
    ),
    DefinitionNotFoundError: _Refusal(404, "DEFINITION_NOT_FOUND", "No such registered definition"),
    DefinitionNotRegisteredError: _Refusal(422, "DEFINITION_NOT_FOUND", "A start names an unregistered definition"),
    DefinitionNameTakenError: _Refusal(409, "DEFINITION_NAME_TAKEN", "The definition name is another principal's"),
    DefinitionVersionConflictError: _Refusal(
        409, "DEFINITION_VERSION_EXISTS", "A version is immutable; a name is its publisher's"
    ),
    CallbackUsedError: _Refusal(409, "CALLBACK_ALREADY_USED", "The task token was used already"),
    CallbackExpiredError: _Refusal(410, "CALLBACK_EXPIRED", "The task token's attempt is over"),
    MissingReferenceError: _Refusal(422, "MISSING_REFERENCE", "A reference of the first step's input found nothing"),
    UnknownStepError: _Refusal(422, "NO_SUCH_STEP", "The action names a step the workflow does not have"),
    ConditionNotEvaluatedError: _Refusal(422, "CONDITION_NOT_EVALUATED", "A first step's when could not be evaluated"),
    WaitNotEvaluatedError: _Refusal(422, "WAIT_NOT_EVALUATED", "A first step's until is not a time"),
    RequestValidationError: _Refusal(422, "VALIDATION_ERROR", "Invalid request", _validation_message),
}
#: A ``RequestValidationError`` whose body is not JSON text at all (RFC 9110: the request is malformed).
_MALFORMED_JSON = _Refusal(
    400, "MALFORMED_JSON", "Malformed JSON body", lambda exc: "the request body is not valid JSON"
)


def _refusal_of(exc: Exception) -> _Refusal:
    if isinstance(exc, RequestValidationError) and any(e.get("type") == "json_invalid" for e in exc.errors()):
        return _MALFORMED_JSON
    return next(_REFUSALS[cls] for cls in type(exc).__mro__ if cls in _REFUSALS)


def _details(exc: Exception) -> list[dict[str, Any]] | None:
    if not isinstance(exc, RequestValidationError):
        return None
    details = []
    for error in exc.errors():
        message = str(error.get("msg", ""))
        reason = (error.get("ctx") or {}).get("error")
        details.append(
            {
                "loc": [str(part) for part in error.get("loc", ())],
                # pydantic's "Value error, <reason>" already holds the reason: never say it twice
                "msg": f"{message}: {reason}" if reason and str(reason) not in message else message,
                "type": str(error.get("type", "")),
            }
        )
    return details


def _refuse(exc: Exception) -> Response[Any]:
    refusal = _refusal_of(exc)
    body = ErrorResponse(error=refusal.code, message=refusal.message(exc), details=_details(exc))
    return Response(
        status_code=refusal.status,
        content_type=content_types.APPLICATION_JSON,
        body=body.model_dump_json(exclude_none=True),
        headers={"Retry-After": str(exc.retry_after)} if isinstance(exc, TenantLimitError) else None,
    )


def _documented_errors() -> dict[int, OpenAPIResponse]:
    descriptions: dict[int, list[str]] = {}
    for refusal in (_MALFORMED_JSON, *_REFUSALS.values()):
        descriptions.setdefault(refusal.status, []).append(refusal.description)
    return {status: doc(ErrorResponse, "; ".join(texts)) for status, texts in sorted(descriptions.items())}


def doc(model: type[Any], description: str) -> OpenAPIResponse:
    """A documented JSON response of ``model`` (for a route's ``responses``)."""
    return {"description": description, "content": {"application/json": {"model": model}}}


ERROR_RESPONSES = _documented_errors()


# ------------------------------------------------------------------------------------------ request bodies
class _JsonBodyValidation(OpenAPIRequestValidationMiddleware):
    """Powertools' request validation, reading a body only as ``application/json`` in UTF-8 (RFC 8259 section 8.1).

    Powertools would also parse form and multipart bodies (a multipart type without a boundary raises a bare
    ``ValueError``) and lets a base64 body that is not UTF-8 raise ``UnicodeDecodeError``: both were 500s. Here the
    first is refused as 415 and the second as 400, through the refusals table.
    """

    def handler(self, app: Any, next_middleware: Any) -> Any:
        # Every request's body obeys the same rules, a route that takes none included (a cancel with 2 MB of
        # text/plain was accepted): checked here, before the route's own parameters.
        if app.current_event.body:
            _checked_body(app)
        return super().handler(app, next_middleware)

    def _get_body(self, app: Any) -> dict[str, Any]:
        _checked_body(app)
        return self._parse_json_data(app)


def _checked_body(app: Any) -> str:
    """The request body as text, once it is known to be JSON's media type, UTF-8 and within `MAX_REQUEST_BYTES`.

    Raises
    ------
    RequestUnsupportedContentType
        When the body is sent as another media type (415).
    PayloadTooLargeError
        When it is larger than `MAX_REQUEST_BYTES` (413).
    RequestValidationError
        When it is not UTF-8, or not base64 where it says it is (400).
    """
    content_type = app.current_event.headers.get("content-type", "")
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type not in ("", content_types.APPLICATION_JSON):
        raise RequestUnsupportedContentType(
            f"the request body must be application/json, not {media_type}",
            errors=[{"type": "unsupported_content_type", "loc": ("header", "content-type"), "msg": media_type}],
        )
    raw = app.current_event.body or ""
    # A base64 body decodes to 3/4 of its length: refuse what cannot fit before decoding or parsing it.
    if len(raw) * (3 if app.current_event.is_base64_encoded else 4) > 4 * MAX_REQUEST_BYTES:
        raise PayloadTooLargeError("the request body", len(raw), MAX_REQUEST_BYTES)
    try:
        text: str = app.current_event.decoded_body  # decodes (and caches) base64 + UTF-8
    except (UnicodeDecodeError, binascii.Error) as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": "JSON decode error", "ctx": {"error": str(exc)}}]
        ) from exc
    size = len(text.encode("utf-8", "surrogatepass")) if text else 0
    if size > MAX_REQUEST_BYTES:
        raise PayloadTooLargeError("the request body", size, MAX_REQUEST_BYTES)
    return text or ""


def _document_agents(document: dict[str, Any], agents: list[str]) -> None:
    # The agents are deployment configuration (one request queue each), so the model can only give their pattern;
    # the served document names them, and a definition with any other agent is refused 422 INVALID_DEFINITION.
    agent = document["components"]["schemas"]["TaskStep"]["properties"]["agent"]
    agent["enum"] = agents
    agent["description"] = "The agent (remote service) that does the step: one of this deployment's agents."


class _DecodedPathResolver(APIGatewayHttpResolver):
    """Powertools' HTTP API resolver, routing on the path decoded once.

    API Gateway HTTP APIs deliver ``rawPath`` percent-decoded (payload format 2.0), while a REST API, a function URL
    or a hand-made test event may carry it still encoded. A map child's id holds ``:`` (``wf:1:0``), which a client
    may send as ``%3A``: routed as it came, the id failed the id pattern (422). Ids never hold ``%``, so decoding once
    is right for both forms, and a path already decoded is unchanged.
    """

    def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        return super().resolve(routed_path_event(event), context)


#: What a path parameter may hold for powertools' route patterns besides letters and digits (RFC 3986's unreserved
#: and sub-delims, ``:`` and ``@``): everything else is percent-encoded when the path is rebuilt (`routed_path_event`).
_PATH_PARAMETER_SAFE = "-._~()'!*:@,;=+&$"
_ROUTE_PARAMETER = re.compile(r"\{([A-Za-z0-9_]+)(\+?)\}")


def routed_path_event(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """``event`` with the path API Gateway routed it by: its route's template (``routeKey``) with each path parameter
    put back, percent-encoded where a route pattern could not hold it; `decoded_path_event` without a route.

    API Gateway matched the route on the path as sent and hands the function each path parameter decoded. Routed
    again on the decoded path, an id that holds ``/`` (``..%2Fx``), NUL or an emoji matched no route and was 404
    ``no such route``; an id must instead be refused 422 by the id rule, on every route. Rebuilt from the route,
    such an id reaches its route and its validation, and a valid id is unchanged.
    """
    route_key = event.get("routeKey")
    parameters = event.get("pathParameters")
    if not (isinstance(route_key, str) and " /" in route_key and isinstance(parameters, dict)):
        return decoded_path_event(event)
    template = route_key.split(" ", 1)[1]
    names = [match.group(1) for match in _ROUTE_PARAMETER.finditer(template)]
    if not names or not all(isinstance(parameters.get(name), str) for name in names):
        return decoded_path_event(event)

    def put_back(match: re.Match[str]) -> str:
        safe = _PATH_PARAMETER_SAFE + ("/" if match.group(2) else "")  # a greedy {name+} spans segments
        return quote(parameters[match.group(1)], safe=safe)

    path = _ROUTE_PARAMETER.sub(put_back, template)
    routed = dict(event)
    routed["rawPath"] = path
    context = event.get("requestContext")
    if isinstance(context, dict) and isinstance(context.get("http"), dict):
        routed["requestContext"] = {**context, "http": {**context["http"], "path": path}}
    return routed


def decoded_path_event(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """``event`` with its ``rawPath`` (and ``requestContext.http.path``) percent-decoded once; the same event when
    the path holds no ``%``.

    Parameters
    ----------
    event
        An API Gateway HTTP API (payload format 2.0) proxy event.

    Returns
    -------
    Mapping
        A shallow copy with the decoded path, or ``event`` itself.
    """
    raw_path = event.get("rawPath")
    if not isinstance(raw_path, str) or "%" not in raw_path:
        return event
    decoded = dict(event)
    decoded["rawPath"] = unquote(raw_path)
    context = event.get("requestContext")
    if isinstance(context, dict) and isinstance(context.get("http"), dict):
        http = dict(context["http"])
        if isinstance(http.get("path"), str):
            http["path"] = unquote(http["path"])
        decoded["requestContext"] = {**context, "http": http}
    return decoded


def api_resolver() -> APIGatewayHttpResolver:
    """A resolver with validation, strict JSON bodies and the body rules of `_JsonBodyValidation` (both APIs')."""
    app = _DecodedPathResolver(enable_validation=True, json_body_deserializer=parse_json_body)
    # The request validation middleware is created by the resolver and run before any user middleware, so the
    # body rules above can only take its place. Fail at cold start, not per request, if powertools renames it.
    if not isinstance(getattr(app, "_request_validation_middleware", None), OpenAPIRequestValidationMiddleware):
        raise RuntimeError("aws-lambda-powertools no longer has APIGatewayHttpResolver._request_validation_middleware")
    app._request_validation_middleware = _JsonBodyValidation()
    return app


def build_app(services: Callable[[], tuple[SchedulerService, MessageBus]]) -> APIGatewayHttpResolver:
    """Create the resolver; ``services`` returns the scheduler and the bus, built lazily on first request.

    Returns
    -------
    APIGatewayHttpResolver
        Resolve HTTP API (payload v2) events with ``app.resolve(event, context)``.
    """
    app = api_resolver()

    def caller() -> str:
        scheduler, _ = services()
        return principal_of(app.current_event.raw_event.get("requestContext") or {}, scheduler.config.api_authorizer)

    def owned(snapshot: Any, workflow_id: str, principal: str) -> Any:
        if snapshot is None or snapshot.workflow.owner != principal:
            raise WorkflowNotFoundError(workflow_id)  # another principal's workflow does not exist for this one
        return snapshot

    @app.post(
        "/workflows",
        summary="Start a workflow",
        responses={
            200: doc(WorkflowView, "Already started with this Idempotency-Key"),
            201: doc(WorkflowView, "Started (or QUEUED behind its tenant's running workflows: queue_position)"),
            **ERROR_RESPONSES,
        },
    )
    def start_workflow(
        request: StartWorkflowRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[WorkflowView]:
        principal = caller()
        scheduler, bus = services()
        body = request.model_dump(mode="json")
        if body.get("priority") is None:
            del body["priority"]  # a start without one hashes as it did before priorities existed
        request_hash = canonical_hash(body)
        definition = request.definition
        if isinstance(definition, DefinitionRef):
            definition = DefinitionRegistry(scheduler.store).resolve(definition)
        result = scheduler.start_workflow(
            definition,
            request.input,
            request_hash=request_hash,
            owner=principal,
            idempotency_key=idempotency_key,
            priority=request.priority,
        )
        if result.messages:
            failed = bus.send(result.messages)
            if failed:
                # The steps are durable as PROCESSING: the supervisor resends them after complete-by (Rule 1).
                logger.warning("start messages not sent", extra={"workflow_id": result.workflow.workflow_id})
        # Read nothing we already hold: a start shows what it wrote, a repeat what the conflicting write found.
        position = result.queue_position
        if position is None:  # a repeat of a queued start: its place now
            position = scheduler.queue_position(result.snapshot)
        view = WorkflowView.from_snapshot(result.snapshot, queue_position=position)
        return Response(
            status_code=201 if result.created else 200,
            content_type=content_types.APPLICATION_JSON,
            body=view,
            headers={"Location": f"/workflows/{view.workflow_id}"},
        )

    @app.get(
        "/workflows/<workflow_id>",
        summary="Read a workflow and its steps",
        responses={200: doc(WorkflowView, "The workflow"), **ERROR_RESPONSES},
    )
    def get_workflow(workflow_id: Annotated[WorkflowId, Path()]) -> WorkflowView:
        principal = caller()
        scheduler, _ = services()
        snapshot = owned(scheduler.store.load(workflow_id), workflow_id, principal)
        return WorkflowView.from_snapshot(snapshot, queue_position=scheduler.queue_position(snapshot))

    @app.get(
        "/workflows/<workflow_id>/history",
        summary="Read a workflow's history, oldest event first",
        responses={200: doc(HistoryPage, "One page of events; next_cursor continues it"), **ERROR_RESPONSES},
    )
    def get_history(
        workflow_id: Annotated[WorkflowId, Path()],
        cursor: Annotated[str | None, Query(max_length=16, description="next_cursor of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_PAGE)] = MAX_HISTORY_PAGE,
    ) -> HistoryPage:
        principal = caller()
        scheduler, _ = services()
        after = history_cursor(cursor)
        snapshot = owned(scheduler.store.load(workflow_id), workflow_id, principal)
        return HistoryPage.of(snapshot, after=after, limit=limit)

    @app.post(
        "/workflows/<workflow_id>/cancel",
        summary="Cancel a running workflow (it compensates what may have happened)",
        responses={202: doc(WorkflowView, "Cancelling"), **ERROR_RESPONSES},
    )
    def cancel_workflow(workflow_id: Annotated[WorkflowId, Path()]) -> Response[WorkflowView]:
        principal = caller()
        scheduler, bus = services()
        snapshot, messages = scheduler.cancel(workflow_id, owner=principal)
        if messages:
            bus.send(messages)  # a compensation that is not sent is resent by the supervisor after complete-by
        view = WorkflowView.from_snapshot(snapshot)
        return Response(status_code=202, content_type=content_types.APPLICATION_JSON, body=view)

    # ------------------------------------------------------------------ definitions (registry.py)
    @app.put(
        "/definitions/<name>/versions/<version>",
        summary="Publish a definition version (immutable: the same body again is 200, another one 409)",
        responses={
            200: doc(DefinitionVersionView, "Published already, with this very definition"),
            201: doc(DefinitionVersionView, "Published"),
            **ERROR_RESPONSES,
        },
    )
    def publish_definition(
        name: Annotated[DefinitionName, Path()],
        version: Annotated[int, Path(ge=1, le=2_147_483_647)],
        definition: WorkflowDefinition,
    ) -> Response[DefinitionVersionView]:
        principal = caller()
        scheduler, _ = services()
        scheduler.check_agents(definition)
        created, view = DefinitionRegistry(scheduler.store).publish(
            name, version, definition, owner=principal, now=epoch_seconds(scheduler.clock)
        )
        return Response(
            status_code=201 if created else 200,
            content_type=content_types.APPLICATION_JSON,
            body=view,
            headers={"Location": f"/definitions/{name}/versions/{version}"},
        )

    @app.get(
        "/definitions",
        summary="List the registered definitions",
        responses={200: doc(DefinitionList, "Names"), **ERROR_RESPONSES},
    )
    def list_definitions() -> DefinitionList:
        caller()
        scheduler, _ = services()
        return DefinitionRegistry(scheduler.store).names()

    @app.get(
        "/definitions/<name>",
        summary="The versions of a registered definition",
        responses={200: doc(DefinitionVersionList, "Versions, oldest first"), **ERROR_RESPONSES},
    )
    def definition_versions(name: Annotated[DefinitionName, Path()]) -> DefinitionVersionList:
        caller()
        scheduler, _ = services()
        return DefinitionRegistry(scheduler.store).versions(name)

    @app.get(
        "/definitions/<name>/versions/<version>",
        summary="A registered definition version",
        responses={200: doc(WorkflowDefinition, "The definition"), **ERROR_RESPONSES},
    )
    def get_definition(
        name: Annotated[DefinitionName, Path()], version: Annotated[int, Path(ge=1, le=2_147_483_647)]
    ) -> WorkflowDefinition:
        caller()
        scheduler, _ = services()
        return DefinitionRegistry(scheduler.store).get(name, version)

    @app.post(
        "/callbacks/<token>",
        summary="Answer a callback step: complete it, fail it, or send a heartbeat (the token works once)",
        responses={200: doc(CallbackResult, "Applied"), **ERROR_RESPONSES},
    )
    def answer_callback(
        token: Annotated[str, Path(min_length=1, max_length=MAX_TOKEN_CHARS)], request: CallbackRequest
    ) -> Response[CallbackResult]:
        principal = caller()
        scheduler, bus = services()
        _, result, messages = scheduler.callback(token, request, owner=principal)
        if messages:
            bus.send(messages)  # what the answer let start; a message not sent is resent by the supervisor
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=result)

    @app.get("/openapi.json", summary="OpenAPI document", include_in_schema=False)
    def openapi() -> Response[str]:
        scheduler, _ = services()
        document = json.loads(app.get_openapi_json_schema(title="sasflow", version="1.0.0"))
        _document_agents(document, sorted(scheduler.config.agent_queue_urls))
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=json.dumps(document))

    install_error_handlers(app)
    return app


def install_error_handlers(app: APIGatewayHttpResolver) -> None:
    """Register the refusals table's handler and the catch-all that answers 500 with the request id only."""
    app.exception_handler(list(_REFUSALS))(_refuse)

    @app.exception_handler(Exception)
    def _internal(exc: Exception) -> Response[Any]:
        # The details (a stack, a host) go to the log only; the caller gets a code and the request id to quote.
        request_id = (app.current_event.raw_event.get("requestContext") or {}).get("requestId", "")
        logger.exception("unexpected error", extra={"request_id": request_id})
        body = ErrorResponse(error="INTERNAL_ERROR", message=f"internal error (request {request_id})")
        return Response(
            status_code=500, content_type=content_types.APPLICATION_JSON, body=body.model_dump_json(exclude_none=True)
        )


def history_cursor(cursor: str | None) -> int:
    """The history position a ``cursor`` of `HistoryPage` stands for (0 for the first page).

    Raises
    ------
    InvalidCursorError
        When the cursor is not one a history page gave.
    """
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 9:
        raise InvalidCursorError("the cursor is not one this API gave")
    return int(cursor)

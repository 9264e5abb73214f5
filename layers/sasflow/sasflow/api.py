"""The HTTP API: powertools ``APIGatewayHttpResolver`` with validation, so the OpenAPI spec comes from the models.

Routes
------
- ``POST /workflows``: start a workflow (201), or return the one an ``Idempotency-Key`` already started (200).
- ``GET /workflows/{workflow_id}``: the workflow and its steps.
- ``POST /workflows/{workflow_id}/cancel``: stop a running workflow and compensate what may have happened (202).
- ``GET /openapi.json``: the OpenAPI 3 document.

Domain errors become HTTP status codes in exactly one place (the exception handlers below), always with a JSON
``ErrorResponse`` body; a refused request writes nothing and sends nothing (DESIGN Rule 9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Header, Path
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from .api_models import ErrorResponse, StartWorkflowRequest, WorkflowView
from .errors import (
    ConditionFailedError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    PayloadTooLargeError,
    WorkflowNotFoundError,
)
from .messages import canonical_hash
from .ports import MessageBus
from .scheduler import SchedulerService
from .types import IdempotencyKey, WorkflowId

logger = logging.getLogger("sasflow.api")


def _doc(model: type[Any], description: str) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": model}}}


_ERRORS: dict[int, OpenAPIResponse] = {
    400: _doc(ErrorResponse, "Malformed request"),
    404: _doc(ErrorResponse, "No such workflow"),
    409: _doc(ErrorResponse, "Conflict"),
    413: _doc(ErrorResponse, "Payload too large"),
    422: _doc(ErrorResponse, "Invalid request"),
}


def _error(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> Response[Any]:
    body = ErrorResponse(error=code, message=message, details=details).model_dump_json(exclude_none=True)
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


def build_app(services: Callable[[], tuple[SchedulerService, MessageBus]]) -> APIGatewayHttpResolver:
    """Create the resolver; ``services`` returns the scheduler and the bus, built lazily on first request.

    Returns
    -------
    APIGatewayHttpResolver
        Resolve HTTP API (payload v2) events with ``app.resolve(event, context)``.
    """
    app = APIGatewayHttpResolver(enable_validation=True)

    @app.post(
        "/workflows",
        summary="Start a workflow",
        responses={
            200: _doc(WorkflowView, "Already started with this Idempotency-Key"),
            201: _doc(WorkflowView, "Started"),
            **_ERRORS,
        },
    )
    def start_workflow(
        request: StartWorkflowRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[WorkflowView]:
        scheduler, bus = services()
        request_hash = canonical_hash(request.model_dump(mode="json"))
        result = scheduler.start_workflow(
            request.definition, request.input, request_hash=request_hash, idempotency_key=idempotency_key
        )
        if result.messages:
            failed = bus.send(result.messages)
            if failed:
                # The steps are durable as PROCESSING: the supervisor resends them after complete-by (Rule 1).
                logger.warning("start messages not sent", extra={"workflow_id": result.workflow.workflow_id})
        snapshot = scheduler.store.load(result.workflow.workflow_id)
        assert snapshot is not None
        view = WorkflowView.from_snapshot(snapshot)
        return Response(
            status_code=201 if result.created else 200,
            content_type=content_types.APPLICATION_JSON,
            body=view,
            headers={"Location": f"/workflows/{view.workflow_id}"},
        )

    @app.get(
        "/workflows/<workflow_id>",
        summary="Read a workflow and its steps",
        responses={200: _doc(WorkflowView, "The workflow"), **_ERRORS},
    )
    def get_workflow(workflow_id: Annotated[WorkflowId, Path()]) -> WorkflowView:
        scheduler, _ = services()
        snapshot = scheduler.store.load(workflow_id)
        if snapshot is None:
            raise WorkflowNotFoundError(workflow_id)
        return WorkflowView.from_snapshot(snapshot)

    @app.post(
        "/workflows/<workflow_id>/cancel",
        summary="Cancel a running workflow (it compensates what may have happened)",
        responses={202: _doc(WorkflowView, "Cancelling"), **_ERRORS},
    )
    def cancel_workflow(workflow_id: Annotated[WorkflowId, Path()]) -> Response[WorkflowView]:
        scheduler, bus = services()
        _, messages = scheduler.cancel(workflow_id)
        if messages:
            bus.send(messages)
        snapshot = scheduler.store.load(workflow_id)
        assert snapshot is not None
        view = WorkflowView.from_snapshot(snapshot)
        return Response(status_code=202, content_type=content_types.APPLICATION_JSON, body=view)

    @app.get("/openapi.json", summary="OpenAPI document", include_in_schema=False)
    def openapi() -> Response[str]:
        return Response(
            status_code=200,
            content_type=content_types.APPLICATION_JSON,
            body=app.get_openapi_json_schema(title="sasflow", version="1.0.0"),
        )

    @app.exception_handler(RequestValidationError)
    def invalid_request(exc: RequestValidationError) -> Response[Any]:
        details = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        if any(d["type"] == "json_invalid" for d in details):
            return _error(400, "MALFORMED_JSON", "the request body is not valid JSON", details)
        return _error(422, "VALIDATION_ERROR", "the request does not match the schema", details)

    @app.exception_handler(InvalidDefinitionError)
    def invalid_definition(exc: InvalidDefinitionError) -> Response[Any]:
        return _error(422, "INVALID_DEFINITION", str(exc))

    @app.exception_handler(PayloadTooLargeError)
    def too_large(exc: PayloadTooLargeError) -> Response[Any]:
        return _error(413, "PAYLOAD_TOO_LARGE", str(exc))

    @app.exception_handler(IdempotencyKeyConflictError)
    def key_conflict(exc: IdempotencyKeyConflictError) -> Response[Any]:
        return _error(409, "IDEMPOTENCY_KEY_REUSED", str(exc))

    @app.exception_handler(WorkflowNotFoundError)
    def not_found(exc: WorkflowNotFoundError) -> Response[Any]:
        return _error(404, "WORKFLOW_NOT_FOUND", f"no workflow {exc}")

    @app.exception_handler(ConditionFailedError)
    def conflict(exc: ConditionFailedError) -> Response[Any]:
        return _error(409, "CONFLICT", str(exc))

    @app.not_found
    def no_route(exc: Exception) -> Response[Any]:
        return _error(404, "NOT_FOUND", "no such route")

    return app

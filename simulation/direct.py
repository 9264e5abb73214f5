"""A DynamoDB client for the simulation's fast world: boto3's low-level client surface, answered by moto's backend in
process, without botocore's HTTP layer or moto's response serializer.

Why: on in-process moto, about 70 % of a simulated workflow's time went to moto serializing each response through
the botocore model and to botocore building and parsing the HTTP request around it (profile of one seed of 30
workflows: 12.9 of 18.5 s). DynamoDB's wire format is its JSON, so nothing is lost by skipping the round trip:
moto's ``DynamoHandler`` methods take the request parameters exactly as botocore's parser hands them over (blobs as
``bytes``) and return the response as a dict. The DynamoDB semantics are moto's own, unchanged: key schemas, GSIs,
condition and update expressions, conditional-check failures with the old item, the 400 KB item limit.

What the real client does and this one repeats, because the simulation's fault hooks rely on it: the same events on
``meta.events`` (a botocore ``HierarchicalEmitter``), with the same arguments, in the same order:

- ``before-parameter-build.dynamodb.<Operation>``: ``params`` (the caller's parameters), ``model``, ``context``;
- ``before-call.dynamodb.<Operation>``: ``params`` = ``{"body": <the JSON request body, bytes>}``, ``model``,
  ``context``; the first handler that returns ``(http_response, parsed)`` answers the call instead of DynamoDB;
- ``after-call.dynamodb.<Operation>``: ``http_response`` (``status_code`` 200, or the error's 4xx), ``parsed``,
  ``model``, ``context``; emitted for errors too, then the error is raised as ``botocore.exceptions.ClientError``.

Not repeated: botocore's parameter validation and retries (the simulation's calls never hit a throttle). The
differential test (tests/simulation) runs the same seeds through this client and through boto3 on moto and requires
identical reports, which is what shows that nothing the engine relies on differs.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Iterator
from typing import Any

import botocore.session
from botocore.exceptions import ClientError
from botocore.hooks import HierarchicalEmitter
from moto.core.exceptions import JsonRESTError
from moto.dynamodb.responses import DynamoHandler

#: moto's default account and the region of ``FAKE_AWS_ENV``: where ``provision`` created the tables.
ACCOUNT = "123456789012"

#: boto3 method name -> DynamoDB operation name (the operations the engine, powertools and the simulation call).
OPERATIONS = {
    "get_item": "GetItem",
    "put_item": "PutItem",
    "update_item": "UpdateItem",
    "delete_item": "DeleteItem",
    "query": "Query",
    "scan": "Scan",
    "batch_get_item": "BatchGetItem",
    "batch_write_item": "BatchWriteItem",
    "transact_write_items": "TransactWriteItems",
    "transact_get_items": "TransactGetItems",
    "describe_table": "DescribeTable",
}

_HANDLER_METHODS = {name: method for method, name in OPERATIONS.items()}


class _Operation:
    """What the hooks read of botocore's ``OperationModel``: its ``name``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _HttpResponse:
    """What the hooks read of botocore's ``AWSResponse``."""

    __slots__ = ("content", "headers", "status_code", "text")

    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""
        self.text = ""


class _Meta:
    def __init__(self, region_name: str) -> None:
        self.events = HierarchicalEmitter()
        self.region_name = region_name


class _Paginator:
    """``get_paginator("query" | "scan")``: pages until ``LastEvaluatedKey`` is absent, as botocore's do."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        params = dict(kwargs)
        params.pop("PaginationConfig", None)
        while True:
            page = self._call(**params)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            params["ExclusiveStartKey"] = last


class DirectDynamoDB:
    """``boto3.client("dynamodb")`` for code running inside ``moto.mock_aws``, minus the HTTP round trip.

    Usage: ``client = DirectDynamoDB("us-east-1")``, then ``client.put_item(TableName=..., Item=...)`` as with boto3.
    Errors raise ``botocore.exceptions.ClientError`` with the code, message and extra fields (``Item`` of a failed
    condition with ``ReturnValuesOnConditionCheckFailure``, ``CancellationReasons`` of a transaction) that botocore
    parses from DynamoDB's error body.
    """

    def __init__(self, region_name: str = "us-east-1") -> None:
        self.meta = _Meta(region_name)
        self._handler = DynamoHandler()
        self._handler.current_account = ACCOUNT
        self._handler.region = region_name
        self._models = {name: _Operation(name) for name in OPERATIONS.values()}

    def __getattr__(self, method: str) -> Any:
        name = OPERATIONS.get(method)
        if name is None:
            raise AttributeError(f"DirectDynamoDB has no operation {method!r}")

        def call(**params: Any) -> dict[str, Any]:
            return self._call(name, params)

        call.__name__ = method
        return call

    def get_paginator(self, operation: str) -> _Paginator:
        if operation not in ("query", "scan"):
            raise NotImplementedError(f"DirectDynamoDB paginates query and scan, not {operation!r}")
        return _Paginator(getattr(self, operation))

    def _call(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        model = self._models[name]
        context: dict[str, Any] = {}
        events = self.meta.events
        events.emit(f"before-parameter-build.dynamodb.{name}", params=params, model=model, context=context)
        request = {"body": json.dumps(params, default=_blob_to_text).encode()}
        answered = events.emit_until_response(
            f"before-call.dynamodb.{name}", model=model, params=request, request_signer=None, context=context
        )[1]
        http: Any
        parsed: dict[str, Any]
        if answered is not None:
            http, parsed = answered
        else:
            http, parsed = self._dispatch(name, params)
        events.emit(f"after-call.dynamodb.{name}", http_response=http, parsed=parsed, model=model, context=context)
        if http.status_code >= 300:
            raise ClientError(parsed, name)  # type: ignore[arg-type]  # DynamoDB JSON, as botocore parses it
        return parsed

    def _dispatch(self, name: str, params: dict[str, Any]) -> tuple[_HttpResponse, dict[str, Any]]:
        handler = self._handler
        handler.body = _copy(params)  # moto must not share the caller's dicts, as after a real round trip
        try:
            result = getattr(handler, _HANDLER_METHODS[name])()
        except JsonRESTError as error:
            return _HttpResponse(error.code), _error_response(error)
        output = _output_members(name)  # moto's serializer writes only the members of the output shape
        parsed = {key: _copy(value) for key, value in result.result.items() if key in output}
        parsed["ResponseMetadata"] = {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}
        return _HttpResponse(200), parsed


def _error_response(error: JsonRESTError) -> dict[str, Any]:
    """What botocore parses from a DynamoDB error body: ``Error`` (Code, Message) beside the body's fields (the
    lowercase ``message``, a failed condition's ``Item``, a transaction's ``CancellationReasons``)."""
    body = json.loads(error.get_body())
    code = str(body.pop("__type", error.error_type)).split("#")[-1]
    message = body.get("message") or body.get("Message") or error.message
    modeled = _error_members().get(code, set())  # botocore keeps only the members of a modeled error's shape
    parsed: dict[str, Any] = {key: _blobs_to_bytes(value) for key, value in body.items() if key in modeled}
    parsed["Error"] = {"Code": code, "Message": message}
    parsed["ResponseMetadata"] = {"HTTPStatusCode": error.code, "HTTPHeaders": {}, "RetryAttempts": 0}
    return parsed


@functools.cache
def _service_model() -> Any:
    return botocore.session.get_session().get_service_model("dynamodb")


@functools.cache
def _output_members(operation: str) -> frozenset[str]:
    """The members of ``operation``'s output shape (botocore's service model)."""
    shape = _service_model().operation_model(operation).output_shape
    return frozenset(shape.members) if shape is not None else frozenset()


@functools.cache
def _error_members() -> dict[str, set[str]]:
    """DynamoDB's modeled errors (botocore's service model): error code -> the members of its shape."""
    return {shape.name: set(shape.members) for shape in _service_model().error_shapes}


def _copy(value: Any) -> Any:
    """A copy of a JSON-shaped value (dicts, lists, sets of scalars); scalars and bytes are immutable, so shared."""
    if isinstance(value, dict):
        return {key: _copy(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple | set):
        return [_copy(inner) for inner in value]
    return value


def _blob_to_text(value: Any) -> str:
    """JSON for a blob, as botocore's serializer writes it (base64)."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _blobs_to_bytes(value: Any) -> Any:
    """DynamoDB JSON from an error body with its blobs (base64 text) as bytes, as botocore's parser returns them."""
    if isinstance(value, list):
        return [_blobs_to_bytes(inner) for inner in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((kind, inner),) = value.items()
        if kind == "B" and isinstance(inner, str):
            return {"B": base64.b64decode(inner)}
        if kind == "BS" and isinstance(inner, list) and all(isinstance(each, str) for each in inner):
            return {"BS": [base64.b64decode(each) for each in inner]}
    return {key: _blobs_to_bytes(inner) for key, inner in value.items()}


def table_items(table_name: str, region_name: str = "us-east-1") -> Iterator[dict[str, Any]]:
    """Every item of ``table_name`` as DynamoDB JSON, read from moto's backend: what a strongly consistent Scan of the
    whole table returns (every page), without its per-item size accounting, filter evaluation and copies.

    For the simulation's own reads (which workflows exist, in which status), never for the engine's.
    """
    from moto.dynamodb.models import dynamodb_backends

    table = dynamodb_backends[ACCOUNT][region_name].get_table(table_name)
    for item in table.all_items():
        yield {name: _attribute_json(value) for name, value in item.attrs.items()}


def _attribute_json(value: Any) -> dict[str, Any]:
    """A moto ``DynamoType`` as DynamoDB JSON (blobs as bytes, as boto3 returns them)."""
    kind = value.type
    inner = value.value
    if kind == "M":
        return {"M": {name: _attribute_json(each) for name, each in inner.items()}}
    if kind == "L":
        return {"L": [_attribute_json(each) for each in inner]}
    if kind in ("SS", "NS", "BS"):
        return {kind: list(inner)}
    if kind == "B" and isinstance(inner, str):
        return {"B": base64.b64decode(inner)}
    return {kind: inner}

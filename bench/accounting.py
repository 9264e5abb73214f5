"""Request accounting: every AWS call the product makes, by service and operation, and what AWS would bill for it.

One botocore event hook sees every call: `Meter.installed` wraps ``botocore.session.Session.create_client``, so each
client created inside it (the handlers', powertools', the event-source emulation's) gets a ``before-parameter-build``
and an ``after-call`` handler. The handlers run in process, so nothing escapes the count.

DynamoDB capacity is computed from item sizes by AWS's rules, because moto does not report consumed capacity for
every operation. Sources: DynamoDB Developer Guide, "Read/write capacity mode: on-demand" (request units),
"Item sizes and formats", "Managing throughput capacity for global secondary indexes" and "Amazon DynamoDB
transactions: capacity management":

- a write costs 1 WRU per 1 KB (rounded up) of the larger of the item before and after the write; a conditional
  write whose condition fails still costs the same;
- each write to a global secondary index costs 1 WRU per 1 KB of the projected item; an update that changes an
  index key is a delete plus a put in the index;
- a strongly consistent read costs 1 RRU per 4 KB (rounded up), an eventually consistent one half that; a Query's
  item sizes are summed before rounding, and a read that finds nothing still costs the minimum;
- transactions cost twice (this count doubles index writes too, which can only overstate our cost).

SQS requests are billed per 64 KB chunk of the payload (Amazon SQS pricing): ``ceil(bytes / 65,536)``, at least 1.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import botocore.session

from sasflow import prices
from sasflow.cost import attribute_size, item_size, sqs_requests
from sasflow.cost import read_units as _read_units
from sasflow.cost import write_units as _write_units

__all__ = ["Meter", "Usage", "attribute_size", "item_size"]


# ---------------------------------------------------------------------------------------------------- usage
@dataclass
class Usage:
    """What was used: requests by (service, operation), capacity, Lambda time and API requests.

    ``lambda_ms`` holds billed milliseconds (each invocation's duration rounded up to 1 ms, as Lambda bills).
    """

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls_by_function: Counter[tuple[str, str]] = field(default_factory=Counter)
    billed_by_function: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    sqs_billed: int = 0
    sqs_messages: Counter[str] = field(default_factory=Counter)
    wru: Counter[str] = field(default_factory=Counter)
    rru: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    items_read: Counter[str] = field(default_factory=Counter)
    lambda_invocations: Counter[str] = field(default_factory=Counter)
    lambda_ms: Counter[str] = field(default_factory=Counter)
    api_requests: int = 0
    #: Custom events put on an EventBridge bus (an event trigger's occurrences).
    eventbridge_events: int = 0
    #: Bytes each function wrote to its log (log lines and EMF metrics): what CloudWatch Logs ingests.
    log_bytes: Counter[str] = field(default_factory=Counter)
    #: The agents' call limits (their ``call-limits#`` items): requests and their capacity, also in the totals.
    call_limit_requests: int = 0
    call_limit_wru: int = 0
    call_limit_rru: float = 0.0
    #: The tenants' items (``TENANCY#``: slots, queue entries, the supervisor's looks at the queues): requests and
    #: their capacity, also in the totals.
    tenancy_requests: int = 0
    tenancy_wru: int = 0
    tenancy_rru: float = 0.0

    def requests(self, service: str | None = None) -> int:
        """AWS requests made (of one service, or all), each call counted once."""
        return sum(n for (svc, _), n in self.calls.items() if service is None or svc == service)

    def merge(self, other: Usage) -> None:
        self.calls.update(other.calls)
        self.calls_by_function.update(other.calls_by_function)
        for key, value in other.billed_by_function.items():
            self.billed_by_function[key] += value
        self.sqs_billed += other.sqs_billed
        self.sqs_messages.update(other.sqs_messages)
        self.wru.update(other.wru)
        for name, units in other.rru.items():
            self.rru[name] += units
        self.items_read.update(other.items_read)
        self.lambda_invocations.update(other.lambda_invocations)
        self.lambda_ms.update(other.lambda_ms)
        self.api_requests += other.api_requests
        self.eventbridge_events += other.eventbridge_events
        self.log_bytes.update(other.log_bytes)
        self.call_limit_requests += other.call_limit_requests
        self.call_limit_wru += other.call_limit_wru
        self.call_limit_rru += other.call_limit_rru
        self.tenancy_requests += other.tenancy_requests
        self.tenancy_wru += other.tenancy_wru
        self.tenancy_rru += other.tenancy_rru

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": {f"{svc}.{op}": n for (svc, op), n in sorted(self.calls.items())},
            "calls_by_function": {f"{fn} {call}": n for (fn, call), n in sorted(self.calls_by_function.items())},
            "billed_by_function": {f"{fn} {unit}": n for (fn, unit), n in sorted(self.billed_by_function.items())},
            "sqs_billed_requests": self.sqs_billed,
            "sqs_messages": dict(sorted(self.sqs_messages.items())),
            "dynamodb_wru": dict(sorted(self.wru.items())),
            "dynamodb_rru": dict(sorted(self.rru.items())),
            "dynamodb_items_read": dict(sorted(self.items_read.items())),
            "lambda_invocations": dict(sorted(self.lambda_invocations.items())),
            "lambda_billed_ms": dict(sorted(self.lambda_ms.items())),
            "api_requests": self.api_requests,
            "eventbridge_events": self.eventbridge_events,
            "log_bytes": dict(sorted(self.log_bytes.items())),
            "call_limits": {
                "requests": self.call_limit_requests,
                "wru": self.call_limit_wru,
                "rru": self.call_limit_rru,
            },
            "tenancy": {
                "requests": self.tenancy_requests,
                "wru": self.tenancy_wru,
                "rru": self.tenancy_rru,
            },
        }


@dataclass(frozen=True)
class Cost:
    """Dollars by line item. ``total`` is their sum."""

    lambda_requests: float
    lambda_compute: float
    dynamodb_writes: float
    dynamodb_reads: float
    sqs: float
    api: float
    logs: float = 0.0
    s3: float = 0.0
    events: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.lambda_requests
            + self.lambda_compute
            + self.dynamodb_writes
            + self.dynamodb_reads
            + self.sqs
            + self.api
            + self.logs
            + self.s3
            + self.events
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "lambda_requests": self.lambda_requests,
            "lambda_compute": self.lambda_compute,
            "dynamodb_writes": self.dynamodb_writes,
            "dynamodb_reads": self.dynamodb_reads,
            "sqs": self.sqs,
            "api": self.api,
            "cloudwatch_logs": self.logs,
            "s3": self.s3,
            "eventbridge": self.events,
            "total": self.total,
        }


def bill(usage: Usage, memory_mb: dict[str, int], *, lambdas: set[str] | None = None) -> Cost:
    """Price ``usage`` with `sasflow.prices`. ``lambdas`` limits the Lambda and log lines to these functions (logical
    ids)."""
    functions = [f for f in usage.lambda_invocations if lambdas is None or f in lambdas]
    gb_seconds = sum(usage.lambda_ms[f] / 1000 * memory_mb[f] / 1024 for f in functions)
    return Cost(
        lambda_requests=sum(usage.lambda_invocations[f] for f in functions) * prices.LAMBDA_PER_REQUEST,
        lambda_compute=gb_seconds * prices.LAMBDA_PER_GB_SECOND,
        dynamodb_writes=sum(usage.wru.values()) * prices.DYNAMODB_PER_WRU,
        dynamodb_reads=sum(usage.rru.values()) * prices.DYNAMODB_PER_RRU,
        sqs=usage.sqs_billed * prices.SQS_PER_REQUEST,
        api=usage.api_requests * prices.HTTP_API_PER_REQUEST,
        logs=sum(n for f, n in usage.log_bytes.items() if lambdas is None or f in lambdas)
        * prices.CLOUDWATCH_LOGS_PER_BYTE,
        s3=s3_cost(usage),
        events=usage.eventbridge_events * prices.EVENTBRIDGE_PER_EVENT,
    )


def s3_cost(usage: Usage) -> float:
    """The S3 requests of ``usage`` (claim-checked payloads), each at its request tier (`sasflow.prices`)."""
    return sum(
        n * (prices.S3_PER_WRITE_REQUEST if operation in prices.S3_WRITE_OPERATIONS else prices.S3_PER_READ_REQUEST)
        for (service, operation), n in usage.calls.items()
        if service == "s3"
    )


# ---------------------------------------------------------------------------------------------------- the meter
class _Tables:
    """Read-only access to moto's DynamoDB backend (the items before and after a write, the index definitions).

    It never goes through botocore, so it is never counted.
    """

    def __init__(self, account: str, region: str) -> None:
        from moto.dynamodb.models import dynamodb_backends

        self._backend = dynamodb_backends[account][region]

    def image(self, table_name: str, key: dict[str, Any]) -> dict[str, Any] | None:
        from moto.dynamodb.models.dynamo_type import DynamoType

        table = self._backend.get_table(table_name)
        hash_key = DynamoType(key[table.hash_key_attr])
        range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
        item = table.get_item(hash_key, range_key)
        return None if item is None else item.to_json()["Attributes"]

    def key_of(self, table_name: str, item: dict[str, Any]) -> dict[str, Any]:
        table = self._backend.get_table(table_name)
        names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
        return {name: item[name] for name in names}

    def index_projection(self, table_name: str, item: dict[str, Any] | None) -> dict[str, tuple[Any, dict[str, Any]]]:
        """For each global secondary index the item appears in: (its index key values, the projected item)."""
        if item is None:
            return {}
        table = self._backend.get_table(table_name)
        table_keys = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
        result: dict[str, tuple[Any, dict[str, Any]]] = {}
        for index in table.global_indexes:
            keys = [k["AttributeName"] for k in index.schema]
            if not all(k in item for k in keys):
                continue  # a sparse index: the item is not in it
            projection = index.projection or {}
            kind = projection.get("ProjectionType", "ALL")
            if kind == "ALL":
                projected = item
            else:
                names = set(keys) | set(table_keys) | set(projection.get("NonKeyAttributes", []))
                projected = {k: v for k, v in item.items() if k in names}
            result[index.name] = (tuple(repr(item[k]) for k in keys), projected)
        return result


class Meter:
    """Counts every AWS call made by clients created while it is installed, and the capacity they consume.

    Calls made inside `paused` (the benchmark's own observations) are not counted.
    """

    def __init__(self, *, account: str = "123456789012", region: str = "us-east-1") -> None:
        self.usage = Usage()
        self.account = account
        self.region = region
        self._local = threading.local()
        self._tables: _Tables | None = None

    @property
    def tables(self) -> _Tables:
        if self._tables is None:
            self._tables = _Tables(self.account, self.region)
        return self._tables

    @contextlib.contextmanager
    def installed(self) -> Iterator[Meter]:
        """Count the calls of every botocore client created inside this block."""
        original = botocore.session.Session.create_client
        meter = self

        def create_client(session: Any, *args: Any, **kwargs: Any) -> Any:
            client = original(session, *args, **kwargs)
            client.meta.events.register("before-parameter-build", meter._before)
            client.meta.events.register("after-call", meter._after)
            return client

        botocore.session.Session.create_client = create_client  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            botocore.session.Session.create_client = original  # type: ignore[method-assign]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made in this block (on this thread) are not counted."""
        previous = getattr(self._local, "paused", False)
        self._local.paused = True
        try:
            yield
        finally:
            self._local.paused = previous

    def current_function(self) -> str | None:
        """The function (logical id) whose invocation this thread is in, if any."""
        return getattr(self._local, "function", None)

    @contextlib.contextmanager
    def attributed(self, caller: str) -> Iterator[None]:
        """Calls made in this block (on this thread) are ``caller``'s: a function's (`lambda_invocation` bills its
        Lambda time around it), a trigger's event source mapping's, the delivery of an occurrence."""
        previous = getattr(self._local, "function", None)
        self._local.function = caller
        try:
            yield
        finally:
            self._local.function = previous

    @contextlib.contextmanager
    def lambda_invocation(self, function: str) -> Iterator[None]:
        """Time one Lambda invocation of ``function`` (logical id); billed in whole milliseconds, rounded up."""
        import time

        started = time.perf_counter()
        try:
            with self.attributed(function):
                yield
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.usage.lambda_invocations[function] += 1
            self.usage.lambda_ms[function] += max(1, math.ceil(elapsed_ms))

    # ------------------------------------------------------------------ hooks
    def _before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if getattr(self._local, "paused", False):
            context["bench_skip"] = True
            return
        context["bench_params"] = params
        if model.service_model.service_name == "dynamodb":
            context["bench_before"] = [self._image(t, k) for t, k in _written_keys(model.name, params, self.tables)]

    def _after(self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if context.get("bench_skip"):
            return
        service = model.service_model.service_name
        operation = model.name
        params = context.get("bench_params", {})
        self.usage.calls[(service, operation)] += 1
        caller = getattr(self._local, "function", None) or "event-source-mapping"
        self.usage.calls_by_function[(caller, f"{service}.{operation}")] += 1
        before = (
            float(sum(self.usage.wru.values())),
            float(sum(self.usage.rru.values())),
            float(self.usage.sqs_billed),
        )
        if service == "sqs":
            self._sqs(operation, params, parsed, http_response)
        elif service == "dynamodb":
            self._dynamodb(operation, params, parsed, context.get("bench_before", []))
        after = (float(sum(self.usage.wru.values())), float(sum(self.usage.rru.values())), float(self.usage.sqs_billed))
        for unit, old, new in zip(("wru", "rru", "sqs_requests"), before, after, strict=True):
            if new != old:
                self.usage.billed_by_function[(caller, unit)] += new - old

    def _image(self, table: str, key: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
        return table, key, self.tables.image(table, key)

    def _sqs(self, operation: str, params: dict[str, Any], parsed: dict[str, Any], http_response: Any) -> None:
        if operation == "SendMessageBatch":
            payload = sum(_sqs_message_bytes(e) for e in params.get("Entries", []))
            self.usage.sqs_messages["sent"] += len(params.get("Entries", []))
        elif operation == "SendMessage":
            payload = _sqs_message_bytes(params)
            self.usage.sqs_messages["sent"] += 1
        elif operation == "ReceiveMessage":
            messages = parsed.get("Messages", [])
            payload = sum(_sqs_message_bytes(m) for m in messages)
            self.usage.sqs_messages["received"] += len(messages)
        else:
            payload = 0
            if operation == "DeleteMessageBatch":
                self.usage.sqs_messages["deleted"] += len(params.get("Entries", []))
        self.usage.sqs_billed += sqs_requests(payload)

    def _dynamodb(self, operation: str, params: dict[str, Any], parsed: dict[str, Any], before: list[Any]) -> None:
        limits = str(params.get("Key", {}).get("id", {}).get("S", "")).startswith("call-limits#")
        self.usage.call_limit_requests += limits
        tenancy = _of_tenancy(params)
        self.usage.tenancy_requests += tenancy
        if operation in ("GetItem",):
            item = parsed.get("Item")
            units = _read_units(item_size(item) if item else 0, bool(params.get("ConsistentRead")))
            self.usage.rru[operation] += units
            self.usage.call_limit_rru += units if limits else 0.0
            self.usage.tenancy_rru += units if tenancy else 0.0
            self.usage.items_read[operation] += 1 if item else 0
            return
        if operation in ("Query", "Scan"):
            items = parsed.get("Items", [])
            consistent = bool(params.get("ConsistentRead")) and "IndexName" not in params
            units = _read_units(sum(item_size(i) for i in items), consistent)
            self.usage.rru[operation] += units
            self.usage.tenancy_rru += units if tenancy else 0.0
            where = f"{operation}:{params.get('IndexName', 'table')}"
            self.usage.items_read[where] += int(parsed.get("ScannedCount", len(items)))
            return
        if operation == "BatchGetItem":
            for items in parsed.get("Responses", {}).values():
                for item in items:
                    self.usage.rru[operation] += _read_units(item_size(item), False)
                    self.usage.items_read[operation] += 1
            return
        if operation == "TransactGetItems":
            for response in parsed.get("Responses", []):
                item = response.get("Item")
                self.usage.rru[operation] += 2 * _read_units(item_size(item) if item else 0, True)
            return
        factor = 2 if operation == "TransactWriteItems" else 1
        attempted = _attempted_items(operation, params)
        for position, (table, key, old) in enumerate(before):
            new = self.tables.image(table, key)
            tried = attempted[position] if position < len(attempted) else None
            size = max(item_size(old) if old else 0, item_size(new) if new else 0, item_size(tried) if tried else 0)
            self.usage.wru[operation] += factor * _write_units(size)
            self.usage.call_limit_wru += factor * _write_units(size) if limits else 0
            self.usage.tenancy_wru += factor * _write_units(size) if tenancy else 0
            self.usage.wru[f"{operation}:index"] += factor * _index_writes(self.tables, table, old, new)


def _sqs_message_bytes(message: dict[str, Any]) -> int:
    size = len(str(message.get("MessageBody", message.get("Body", ""))).encode())
    for name, attribute in (message.get("MessageAttributes") or {}).items():
        size += len(name.encode()) + len(str(attribute.get("DataType", "")).encode())
        size += len(str(attribute.get("StringValue", attribute.get("BinaryValue", ""))).encode())
    return size


def _written_keys(operation: str, params: dict[str, Any], tables: _Tables) -> list[tuple[str, dict[str, Any]]]:
    if operation == "PutItem":
        return [(params["TableName"], tables.key_of(params["TableName"], params["Item"]))]
    if operation in ("UpdateItem", "DeleteItem"):
        return [(params["TableName"], params["Key"])]
    if operation == "TransactWriteItems":
        keys = []
        for entry in params.get("TransactItems", []):
            ((kind, body),) = entry.items()
            key = tables.key_of(body["TableName"], body["Item"]) if kind == "Put" else body["Key"]
            keys.append((body["TableName"], key))
        return keys
    if operation == "BatchWriteItem":
        keys = []
        for table, requests in params.get("RequestItems", {}).items():
            for request in requests:
                if "PutRequest" in request:
                    keys.append((table, tables.key_of(table, request["PutRequest"]["Item"])))
                else:
                    keys.append((table, request["DeleteRequest"]["Key"]))
        return keys
    return []


def _attempted_items(operation: str, params: dict[str, Any]) -> list[dict[str, Any] | None]:
    """The items a put tried to write (a failed conditional put is billed for their size too)."""
    if operation == "PutItem":
        return [params["Item"]]
    if operation == "TransactWriteItems":
        return [entry.get("Put", {}).get("Item") for entry in params.get("TransactItems", [])]
    if operation == "BatchWriteItem":
        return [
            request.get("PutRequest", {}).get("Item")
            for requests in params.get("RequestItems", {}).values()
            for request in requests
        ]
    return [None]


def _index_writes(tables: _Tables, table: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> int:
    """WRU spent on global secondary indexes by a write that turned ``old`` into ``new``."""
    if old == new:
        return 0  # nothing changed (for example a failed condition): no index write
    before = tables.index_projection(table, old)
    after = tables.index_projection(table, new)
    units = 0
    for index in set(before) | set(after):
        if index in before and index in after and before[index][0] == after[index][0]:
            if before[index][1] != after[index][1]:  # a projected attribute changed: updated in place
                units += _write_units(max(item_size(before[index][1]), item_size(after[index][1])))
            continue
        if index in before:
            units += _write_units(item_size(before[index][1]))  # removed from the index (or its key moved)
        if index in after:
            units += _write_units(item_size(after[index][1]))
    return units


def _of_tenancy(params: dict[str, Any]) -> bool:
    """Whether a DynamoDB request is about the tenants' items (``sasflow.tenancy``): their key, a queue's head (a
    Query of the tenant's partition), or the supervisor's read of the due queues (the deadline index's ``TQ``)."""
    values = params.get("ExpressionAttributeValues", {})
    keys = [params.get("Key", {}).get("pk", {}), params.get("Item", {}).get("pk", {}), values.get(":pk", {})]
    if any(str(key.get("S", "")).startswith("TENANCY#") for key in keys if isinstance(key, dict)):
        return True
    return values.get(":shard", {}).get("S") == "TQ" if isinstance(values.get(":shard"), dict) else False

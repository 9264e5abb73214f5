"""In-process emulation of the event sources moto cannot run: SQS event source mappings, schedules, HTTP APIs.

Each emulator turns its input into the exact event Lambda would deliver and calls an `Invoker` (in the local stack a
`devstack.lambda_runtime.FunctionPool`). Every thread here is stoppable and every loop is bounded by a stop event,
a receive wait of one second, or a function timeout.

Sources of the rules:

* SQS: Lambda developer guide, "Using Lambda with Amazon SQS" (event shape, batching window, partial batch
  responses with ``ReportBatchItemFailures``);
* schedules: EventBridge user guide, "Creating an Amazon EventBridge rule that runs on a schedule" (event shape,
  ``rate`` / ``cron`` expressions);
* HTTP API: API Gateway developer guide, "Working with AWS Lambda proxy integrations for HTTP APIs" (payload format
  2.0, response mapping, route selection) and "Quotas" (10 MB payload).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import logging
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from devstack import _aws, identities
from devstack.iam.guard import acting_as
from devstack.iam.roles import Principal
from devstack.lambda_runtime import InvokeResult
from devstack.template import ACCOUNT_ID, FunctionSpec, HttpApiEventSpec, ScheduleEventSpec, SqsEventSpec

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

    from devstack.swagger import SwaggerPages

__all__ = [
    "MAX_HTTP_BODY_BYTES",
    "HttpApiServer",
    "HttpRoute",
    "Invoker",
    "PollerStats",
    "ScheduleEmulator",
    "SqsPoller",
    "batch_item_failures",
    "build_http_api_event",
    "build_scheduled_event",
    "build_sqs_record",
    "http_api_response",
    "parse_schedule_interval",
]

logger = logging.getLogger(__name__)

MAX_HTTP_BODY_BYTES: Final = 10 * 1024 * 1024
"""API Gateway's payload quota for HTTP APIs: 10 MiB (bytes)."""


class Invoker(Protocol):
    """Anything that runs a function synchronously (`devstack.lambda_runtime.FunctionPool`, or a test fake)."""

    def invoke(self, event: Mapping[str, Any]) -> InvokeResult:
        """Invoke with ``event`` and return the outcome; never raises for handler failures."""
        ...


# ================================================================================================ SQS


def build_sqs_record(message: MessageTypeDef | Mapping[str, Any], *, queue_arn: str, region: str) -> dict[str, Any]:
    """Turn one ``ReceiveMessage`` message into a record of Lambda's SQS event.

    Parameters
    ----------
    message
        A message as boto3 returns it (received with all attributes and message attributes).
    queue_arn
        ARN of the source queue (``eventSourceARN``).
    region
        Region of the queue (``awsRegion``).

    Returns
    -------
    dict
        ``{"messageId", "receiptHandle", "body", "attributes", "messageAttributes", "md5OfBody", "eventSource",
        "eventSourceARN", "awsRegion"}`` (plus ``md5OfMessageAttributes`` when the message has attributes).
        Message attributes take Lambda's shape: ``{"stringValue" | "binaryValue" (base64), "stringListValues": [],
        "binaryListValues": [], "dataType"}``.
    """
    system = dict(message.get("Attributes") or {})
    attribute_names = (
        "ApproximateReceiveCount",
        "SentTimestamp",
        "SenderId",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageGroupId",
        "MessageDeduplicationId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    )
    attributes = {name: str(system[name]) for name in attribute_names if name in system}
    message_attributes: dict[str, dict[str, Any]] = {}
    for name, value in (message.get("MessageAttributes") or {}).items():
        converted: dict[str, Any] = {}
        if "StringValue" in value:
            converted["stringValue"] = value["StringValue"]
        if "BinaryValue" in value:
            raw = value["BinaryValue"]
            converted["binaryValue"] = base64.b64encode(raw if isinstance(raw, bytes) else bytes(raw)).decode()
        converted["stringListValues"] = list(value.get("StringListValues") or [])
        converted["binaryListValues"] = [
            base64.b64encode(item).decode() for item in value.get("BinaryListValues") or []
        ]
        converted["dataType"] = value["DataType"]
        message_attributes[name] = converted
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message.get("Body", ""),
        "attributes": attributes,
        "messageAttributes": message_attributes,
    }
    if message.get("MD5OfMessageAttributes"):
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    record["md5OfBody"] = message.get("MD5OfBody") or hashlib.md5(record["body"].encode()).hexdigest()
    record.update(eventSource="aws:sqs", eventSourceARN=queue_arn, awsRegion=region)
    return record


def batch_item_failures(payload: Any, message_ids: Sequence[str]) -> set[str] | None:
    """Read a partial batch response the way the SQS event source mapping does.

    Parameters
    ----------
    payload
        The function's result.
    message_ids
        The ids of the batch's records.

    Returns
    -------
    set of str or None
        The ids to keep in the queue; ``None`` when the response is invalid and the whole batch counts as failed.
        An empty or null response, or an empty or null ``batchItemFailures``, is complete success; an
        ``itemIdentifier`` that is missing, empty, or not in the batch fails the whole batch.
    """
    if payload is None or payload == "":
        return set()
    if not isinstance(payload, Mapping):
        return None
    items = payload.get("batchItemFailures")
    if items is None:
        return set()
    if not isinstance(items, list):
        return None
    failed: set[str] = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not isinstance(identifier, str) or not identifier or identifier not in message_ids:
            return None
        failed.add(identifier)
    return failed


@dataclass
class PollerStats:
    """Counters of one SQS poller (thread-safe through ``lock``).

    Attributes
    ----------
    received
        Messages received.
    invocations
        Function invocations.
    deleted
        Messages deleted after a successful invocation.
    kept
        Messages left in the queue: reported batch item failures, or every record of a failed invocation.
    failed_invocations
        Invocations that returned an error (or an invalid partial batch response).
    """

    received: int = 0
    invocations: int = 0
    deleted: int = 0
    kept: int = 0
    failed_invocations: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to several counters at once."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class SqsPoller:
    """Emulate a Lambda SQS event source mapping: poll, invoke with a batch, delete what succeeded.

    Parameters
    ----------
    spec
        The mapping as written in the template.
    invoker
        The function.
    region
        Region of the queue.
    endpoint_url
        The moto server; ``None`` uses boto3's defaults (``AWS_ENDPOINT_URL``).
    concurrency
        Poll threads, each with at most one invocation in flight (``ScalingConfig.MaximumConcurrency`` lowers it).
    visibility_timeout_seconds
        Override of the queue's visibility timeout for received messages (seconds), so failed records come back
        sooner in demos. ``None`` keeps the queue's value, as Lambda does.
    client_factory
        Builds the SQS client of each poll thread (tests); by default a new boto3 session per thread.
    name
        Label for logs.
    principal
        The function's role (`devstack.iam.roles`): the poll threads' calls are checked against it, as Lambda polls
        with the function's execution role. ``None`` checks nothing.

    Notes
    -----
    Records of a failed invocation are not deleted: they come back after the visibility timeout, and the queue's
    ``RedrivePolicy`` moves them to the dead-letter queue after ``maxReceiveCount`` receives. That move is SQS's
    job, not the mapping's; moto 5 does it on receive as SQS does (``tests/devstack`` checks it), so the poller
    does not emulate it.
    """

    def __init__(
        self,
        spec: SqsEventSpec,
        invoker: Invoker,
        *,
        region: str,
        endpoint_url: str | None = None,
        concurrency: int = 2,
        visibility_timeout_seconds: int | None = None,
        client_factory: Callable[[], SQSClient] | None = None,
        name: str = "",
        principal: Principal | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.spec = spec
        self.invoker = invoker
        self.region = region
        self.endpoint_url = endpoint_url
        self.concurrency = min(concurrency, spec.maximum_concurrency or concurrency)
        self.visibility_timeout_seconds = visibility_timeout_seconds
        self.name = name or spec.queue_logical_id
        self.principal = principal
        self.stats = PollerStats()
        self._client_factory = client_factory or self._default_client
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _default_client(self) -> SQSClient:
        sqs: SQSClient = _aws.client("sqs", region=self.region, endpoint_url=self.endpoint_url, new_session=True)
        return sqs

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the poll threads (nothing happens for a mapping with ``Enabled: false``)."""
        if not self.spec.enabled or self._threads:
            return
        self._stop.clear()
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._run, name=f"sqs-{self.name}-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling and wait for the threads (seconds, shared by all threads).

        A thread in the middle of an invocation finishes it first; its wait is bounded by the function timeout,
        so a caller that must not wait that long gets control back after ``timeout``.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = [thread for thread in self._threads if thread.is_alive()]

    @property
    def running(self) -> bool:
        """Whether a poll thread is alive."""
        return any(thread.is_alive() for thread in self._threads)

    # ------------------------------------------------------------------ polling

    def _run(self) -> None:
        # Lambda polls with the function's execution role: so does this thread (devstack.iam).
        with acting_as(self.principal):
            self._poll()

    def _poll(self) -> None:
        client = self._client_factory()
        while not self._stop.is_set():
            try:
                messages = self._receive_batch(client)
                if messages:
                    self.process(client, messages)
            except Exception:  # a poller never dies on a transient error; it backs off and retries
                logger.exception("%s: poll failed", self.name)
                self._stop.wait(1.0)

    def _receive(self, client: SQSClient, count: int, wait_seconds: int) -> list[MessageTypeDef]:
        request: dict[str, Any] = {
            "QueueUrl": self.spec.queue_url,
            "MaxNumberOfMessages": max(1, min(count, 10)),
            "WaitTimeSeconds": wait_seconds,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
        }
        if self.visibility_timeout_seconds is not None:
            request["VisibilityTimeout"] = self.visibility_timeout_seconds
        return list(client.receive_message(**request).get("Messages", []))

    def _receive_batch(self, client: SQSClient) -> list[MessageTypeDef]:
        """One long poll of 1 s, then more receives until the batch is full or the batching window has passed."""
        batch = self._receive(client, self.spec.batch_size, wait_seconds=1)
        if not batch:
            return []
        window_end = time.monotonic() + self.spec.batching_window_seconds
        while len(batch) < self.spec.batch_size and not self._stop.is_set():
            remaining = window_end - time.monotonic()
            if remaining <= 0:
                break
            more = self._receive(client, self.spec.batch_size - len(batch), wait_seconds=1 if remaining >= 1 else 0)
            if more:
                batch.extend(more)
            elif remaining < 1:
                self._stop.wait(min(remaining, 0.05))
        return batch

    def process(self, client: SQSClient, messages: Sequence[MessageTypeDef]) -> InvokeResult:
        """Invoke the function with one batch and settle the batch in the queue.

        Parameters
        ----------
        client
            SQS client of the calling thread.
        messages
            Received messages.

        Returns
        -------
        InvokeResult
            The invocation's result.
        """
        records = [build_sqs_record(message, queue_arn=self.spec.queue_arn, region=self.region) for message in messages]
        self.stats.add(received=len(records), invocations=1)
        result = self.invoker.invoke({"Records": records})
        ids = [record["messageId"] for record in records]
        if not result.ok:
            logger.warning("%s: invocation failed, %d records stay in the queue: %s", self.name, len(ids), result.error)
            self.stats.add(failed_invocations=1, kept=len(ids))
            return result
        failed: set[str] | None = set()
        if self.spec.report_batch_item_failures:
            failed = batch_item_failures(result.payload, ids)
        if failed is None:
            logger.warning("%s: invalid partial batch response %r; the whole batch failed", self.name, result.payload)
            self.stats.add(failed_invocations=1, kept=len(ids))
            return result
        to_delete = [record for record in records if record["messageId"] not in failed]
        self._delete(client, [record["receiptHandle"] for record in to_delete])
        self.stats.add(deleted=len(to_delete), kept=len(failed))
        return result

    def _delete(self, client: SQSClient, receipt_handles: Sequence[str]) -> None:
        for start in range(0, len(receipt_handles), 10):
            chunk = receipt_handles[start : start + 10]
            entries = [{"Id": f"m{start + index}", "ReceiptHandle": handle} for index, handle in enumerate(chunk)]
            response = client.delete_message_batch(QueueUrl=self.spec.queue_url, Entries=entries)  # type: ignore[arg-type]
            for failure in response.get("Failed", []):
                logger.warning("%s: delete failed for %s: %s", self.name, failure["Id"], failure.get("Message"))


# ================================================================================================ schedules

_RATE_RE: Final = re.compile(
    r"rate\(\s*(\d+)\s+(second|seconds|minute|minutes|hour|hours|day|days)\s*\)", re.IGNORECASE
)
_UNIT_SECONDS: Final = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def parse_schedule_interval(expression: str) -> float:
    """The period of a schedule expression, in seconds.

    Parameters
    ----------
    expression
        ``rate(N minute|minutes|second|seconds|hour|hours|day|days)`` or ``cron(...)``.

    Returns
    -------
    float
        Seconds between runs. A ``cron(...)`` expression is treated as every 60 s (its finest granularity).

    Raises
    ------
    ValueError
        The expression is neither ``rate(...)`` nor ``cron(...)``, or its rate is zero.
    """
    text = expression.strip()
    match = _RATE_RE.fullmatch(text)
    if match:
        amount = int(match.group(1))
        if amount <= 0:
            raise ValueError(f"schedule {expression!r}: the rate must be positive")
        return float(amount * _UNIT_SECONDS[match.group(2).lower().rstrip("s")])
    if text.lower().startswith("cron(") and text.endswith(")"):
        return 60.0
    raise ValueError(f"unsupported schedule expression {expression!r}")


def build_scheduled_event(
    *, rule_arn: str, region: str, account_id: str = ACCOUNT_ID, source: str = "aws.events", now: datetime | None = None
) -> dict[str, Any]:
    """The event EventBridge sends to a target of a scheduled rule.

    Parameters
    ----------
    rule_arn
        ARN of the rule (the single item of ``resources``).
    region, account_id
        Where the rule lives.
    source
        ``aws.events`` (rules) or ``aws.scheduler`` (EventBridge Scheduler).
    now
        Time of the event (UTC); defaults to now.

    Returns
    -------
    dict
        ``{"version": "0", "id", "detail-type": "Scheduled Event", "source", "account", "time"
        (ISO-8601, seconds, ``Z``), "region", "resources": [rule_arn], "detail": {}}``.
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": source,
        "account": account_id,
        "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


class ScheduleEmulator:
    """Fire a function on its schedule with EventBridge's "Scheduled Event", never two runs at once.

    Parameters
    ----------
    function_logical_id
        The function (names the rule).
    spec
        The schedule from the template.
    invoker
        The function.
    region
        AWS region.
    stack_name
        Prefix of the rule name, as SAM names rules ``<stack>-<Function><Event>-<suffix>``.
    interval_seconds
        Override of the period (seconds), e.g. a few seconds in demo mode; ``None`` uses the expression's period.

    Notes
    -----
    The first run happens one period after `start`, as a new EventBridge rule does. A run that lasts longer than
    the period delays the next one (this emulator never overlaps runs of one schedule; EventBridge itself may).
    """

    def __init__(
        self,
        function_logical_id: str,
        spec: ScheduleEventSpec,
        invoker: Invoker,
        *,
        region: str,
        stack_name: str = "sasflow",
        account_id: str = ACCOUNT_ID,
        interval_seconds: float | None = None,
    ) -> None:
        self.function_logical_id = function_logical_id
        self.spec = spec
        self.invoker = invoker
        self.region = region
        self.account_id = account_id
        self.interval_seconds = (
            float(interval_seconds) if interval_seconds else parse_schedule_interval(spec.expression)
        )
        if self.interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        rule_name = f"{stack_name}-{function_logical_id}{spec.name}"[:64]
        kind = "schedule/default" if spec.source == "aws.scheduler" else "rule"
        service = "scheduler" if spec.source == "aws.scheduler" else "events"
        self.rule_arn = f"arn:aws:{service}:{region}:{account_id}:{kind}/{rule_name}"
        self.runs = 0
        self.last_result: InvokeResult | None = None
        self._run_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def build_event(self) -> dict[str, Any]:
        """The next event: the template's ``Input`` when set, else a "Scheduled Event"."""
        if self.spec.input is not None:
            loaded: dict[str, Any] = json.loads(self.spec.input)
            return loaded
        return build_scheduled_event(
            rule_arn=self.rule_arn, region=self.region, account_id=self.account_id, source=self.spec.source
        )

    def fire_now(self) -> InvokeResult:
        """Run the function once now, after any run in progress has finished; returns its result."""
        with self._run_lock:
            result = self.invoker.invoke(self.build_event())
            self.runs += 1
            self.last_result = result
        if not result.ok:
            logger.warning("schedule %s: run failed: %s", self.rule_arn, result.error)
        return result

    def start(self) -> None:
        """Start firing every ``interval_seconds`` (nothing happens for a disabled schedule; `fire_now` works)."""
        if not self.spec.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"schedule-{self.function_logical_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop firing and wait for a run in progress (up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._thread = None

    def _run(self) -> None:
        next_fire = time.monotonic() + self.interval_seconds
        while not self._stop.wait(max(0.0, next_fire - time.monotonic())):
            try:
                self.fire_now()
            except Exception:  # the next period runs whatever this one raised
                logger.exception("schedule %s: run raised", self.rule_arn)
            # No catch-up burst after a long run: the next run is one period after this one at the earliest.
            next_fire = max(next_fire + self.interval_seconds, time.monotonic())


# ================================================================================================ HTTP API

_TEXT_SUBTYPES: Final = ("json", "xml", "javascript", "ecmascript")


@dataclass(frozen=True)
class HttpRoute:
    """One route of the emulated HTTP API.

    Attributes
    ----------
    function_logical_id
        The function behind the route.
    event
        The route as the template declares it.
    """

    function_logical_id: str
    event: HttpApiEventSpec

    @property
    def is_default(self) -> bool:
        """The ``$default`` catch-all route."""
        return self.event.path == "$default"

    @property
    def greedy(self) -> bool:
        """The path ends with a greedy variable such as ``{proxy+}``."""
        return self.event.path.rstrip("/").endswith("+}")

    @property
    def literal_segments(self) -> int:
        """Number of path segments that are not variables."""
        return sum(1 for segment in self.event.path.split("/") if segment and not segment.startswith("{"))

    def match(self, method: str, raw_path: str) -> dict[str, str] | None:
        """The path parameters (URL-decoded) if this route takes the request, else ``None``."""
        if self.event.method not in {"ANY", method.upper()}:
            return None
        if self.is_default:
            return {}
        names: list[str] = []
        parts: list[str] = []
        for segment in self.event.path.split("/"):
            if segment.startswith("{") and segment.endswith("}"):
                name = segment[1:-1]
                greedy = name.endswith("+")
                names.append(name.rstrip("+"))
                parts.append(f"(?P<g{len(names) - 1}>{'.+' if greedy else '[^/]+'})")
            else:
                parts.append(re.escape(segment))
        match = re.fullmatch("/".join(parts), raw_path)
        if match is None:
            return None
        return {name: unquote(match.group(f"g{index}")) for index, name in enumerate(names)}

    def specificity(self) -> tuple[int, int, int, int]:
        """Sort key, most specific first: API Gateway prefers literal paths over variables over greedy variables,
        a method over ``ANY``, and ``$default`` last."""
        return (
            int(self.is_default),
            int(self.greedy),
            -self.literal_segments,
            int(self.event.method == "ANY"),
        )


def _is_text(content_type: str) -> bool:
    main, _, rest = content_type.partition("/")
    subtype = rest.split(";", 1)[0].strip().lower()
    return main.strip().lower() == "text" or subtype in _TEXT_SUBTYPES or subtype.endswith(("+json", "+xml"))


def build_http_api_event(
    *,
    route: HttpRoute,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    path_parameters: Mapping[str, str],
    source_ip: str,
    region: str,
    account_id: str = ACCOUNT_ID,
    protocol: str = "HTTP/1.1",
    now: datetime | None = None,
    authorizer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An API Gateway HTTP API proxy event, payload format version 2.0.

    Parameters
    ----------
    route
        The selected route.
    method
        HTTP method of the request.
    raw_path, raw_query
        The path as API Gateway passes it (percent-decoded by the caller, as HTTP APIs do) and the query string
        as sent (still percent-encoded).
    headers
        Request headers in order; duplicates are joined with commas and ``cookie`` headers become ``cookies``.
    body
        Request body (bytes). Text content types are passed as text, others base64-encoded.
    path_parameters
        Values of the route's path variables.
    source_ip
        Client address.
    region, account_id
        Where the API lives.
    protocol
        HTTP version of the request.
    now
        Request time (UTC); defaults to now.
    authorizer
        ``requestContext.authorizer`` of an authorized route (the verified identity), when there is one.

    Returns
    -------
    dict
        The event; ``queryStringParameters``, ``pathParameters``, ``cookies`` and ``body`` are present only when
        non-empty, as in API Gateway.
    """
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    merged: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        merged[key] = f"{merged[key]},{value}" if key in merged else value
    merged.setdefault("x-forwarded-for", source_ip)
    merged.setdefault("x-forwarded-proto", "http")
    api_id = route.event.api_id
    domain_name = merged.get("host") or f"{api_id}.execute-api.{region}.amazonaws.com"
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route.event.route_key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
    }
    if cookies:
        event["cookies"] = cookies
    event["headers"] = merged
    if raw_query:
        query: dict[str, str] = {}
        for key, value in parse_qsl(raw_query, keep_blank_values=True):
            query[key] = f"{query[key]},{value}" if key in query else value
        event["queryStringParameters"] = query
    event["requestContext"] = {
        "accountId": account_id,
        "apiId": api_id,
        "domainName": domain_name,
        "domainPrefix": domain_name.split(".", 1)[0],
        "http": {
            "method": method.upper(),
            "path": raw_path,
            "protocol": protocol,
            "sourceIp": source_ip,
            "userAgent": merged.get("user-agent", ""),
        },
        "requestId": base64.b64encode(secrets.token_bytes(10)).decode().rstrip("="),
        "routeKey": route.event.route_key,
        "stage": "$default",
        "time": moment.strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(moment.timestamp() * 1000),
    }
    if authorizer is not None:
        event["requestContext"]["authorizer"] = dict(authorizer)
    if path_parameters:
        event["pathParameters"] = dict(path_parameters)
    if body:
        content_type = merged.get("content-type", "")
        text: str | None = None
        if _is_text(content_type):
            with contextlib.suppress(UnicodeDecodeError):
                text = body.decode("utf-8")
        event["body"] = text if text is not None else base64.b64encode(body).decode()
        event["isBase64Encoded"] = text is None
    else:
        event["isBase64Encoded"] = False
    return event


def http_api_response(payload: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Map a function result to an HTTP response with the payload 2.0 rules.

    Parameters
    ----------
    payload
        The function's JSON result.

    Returns
    -------
    tuple
        ``(status code, headers, body bytes)``. A dict with ``statusCode`` gives that status, its ``headers``, one
        ``set-cookie`` header per item of ``cookies`` and its ``body`` (base64-decoded when ``isBase64Encoded``).
        Any other result is a 200 ``application/json`` response whose body is the result: a string as it is,
        anything else as JSON.

    Raises
    ------
    ValueError
        The result has ``statusCode`` but is malformed (API Gateway answers 500 then).
    """
    if not (isinstance(payload, dict) and "statusCode" in payload):
        body = payload if isinstance(payload, str) else json.dumps(payload)
        return 200, [("content-type", "application/json")], body.encode()
    status = payload["statusCode"]
    if isinstance(status, bool) or not isinstance(status, (int, str)) or not str(status).isdigit():
        raise ValueError(f"statusCode must be an integer, got {status!r}")
    code = int(status)
    if not 100 <= code <= 599:
        raise ValueError(f"statusCode {code} is out of range")
    headers: list[tuple[str, str]] = []
    raw_headers = payload.get("headers") or {}
    if not isinstance(raw_headers, dict):
        raise ValueError("headers must be an object")
    for name, value in raw_headers.items():
        headers.append((str(name), value if isinstance(value, str) else json.dumps(value).strip('"')))
    cookies = payload.get("cookies") or []
    if not isinstance(cookies, list):
        raise ValueError("cookies must be a list")
    headers.extend(("set-cookie", str(cookie)) for cookie in cookies)
    raw_body = payload.get("body")
    if raw_body is None:
        data = b""
    elif isinstance(raw_body, str):
        data = base64.b64decode(raw_body) if payload.get("isBase64Encoded") else raw_body.encode()
    else:
        raise ValueError(f"body must be a string, got {type(raw_body).__name__}")
    return code, headers, data


class _BodyTooLargeError(Exception):
    pass


class _ApiRequestHandler(http.server.BaseHTTPRequestHandler):
    """Turns each request into a payload 2.0 event for the route's function."""

    protocol_version = "HTTP/1.1"
    server_version = "devstack-httpapi"
    sys_version = ""  # no Python version in the Server header (the trial found it there)
    timeout = 60  # seconds an idle keep-alive connection may hold its thread
    server: _ApiHttpServer

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def handle_expect_100(self) -> bool:
        # Refuse an oversized body before the client sends it.
        if self._declared_length() > self.server.api.max_body_bytes:
            self._send_json(413, {"message": "Request Entity Too Large"}, close=True)
            return False
        return super().handle_expect_100()

    def _declared_length(self) -> int:
        try:
            return int(self.headers.get("content-length") or 0)
        except ValueError:
            return 0

    def _read_body(self) -> bytes:
        limit = self.server.api.max_body_bytes
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:  # bounded: each chunk adds to total, which is capped by limit
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > limit:
                    raise _BodyTooLargeError
                chunks.append(self._read_exactly(size))
                self.rfile.readline(65537)
        length = self._declared_length()
        if length > limit:
            raise _BodyTooLargeError
        return self._read_exactly(length)

    def _read_exactly(self, length: int) -> bytes:
        parts: list[bytes] = []
        remaining = length
        while remaining > 0:
            part = self.rfile.read(remaining)
            if not part:
                raise ConnectionError("client closed the connection before sending the whole body")
            parts.append(part)
            remaining -= len(part)
        return b"".join(parts)

    def _send(
        self, code: int, headers: Sequence[tuple[str, str]], body: bytes, *, close: bool = False, request_id: str = ""
    ) -> None:
        self.send_response(code)
        for name, value in headers:
            if name.lower() not in {"content-length", "connection", "transfer-encoding"}:
                self.send_header(name, value)
        if request_id:
            self.send_header("apigw-requestid", request_id)
        self.send_header("content-length", str(len(body)))
        if close:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, code: int, document: Any, *, close: bool = False, request_id: str = "") -> None:
        body = json.dumps(document).encode()
        self._send(code, [("content-type", "application/json")], body, close=close, request_id=request_id)

    def _handle(self) -> None:
        api = self.server.api
        split = urlsplit(self.path)
        raw_path, raw_query = split.path or "/", split.query
        try:
            body = self._read_body()
        except _BodyTooLargeError:
            self._send_json(413, {"message": "Request Entity Too Large"}, close=True)
            return
        except (ValueError, ConnectionError):
            self._send_json(400, {"message": "Bad Request"}, close=True)
            return
        taken_as: identities.Identity | None = None
        if api.swagger is not None:  # local only (devstack.swagger): the page, and its "Try it out" prefix
            if api.swagger.ours(raw_path):
                refused = api.swagger.refusal(dict(self.headers.items()), self.server.server_address[1])
                if refused is not None:
                    self._send_json(403, {"message": f"Forbidden: {refused}"})
                    return
            page = api.swagger.page(self.command, raw_path, raw_query)
            if page is not None:
                self._send(*page)
                return
            unsigned = api.swagger.taken_as(raw_path)
            if unsigned is not None:
                taken_as, raw_path = unsigned
        selected = api.select_route(self.command, raw_path)
        if selected is None:
            self._send_json(404, {"message": "Not Found"})
            return
        route, path_parameters = selected
        authorizer: dict[str, Any] | None = None
        if route.event.authorization == "AWS_IAM":
            # As API Gateway: a valid SigV4 signature of a known identity whose policy allows this route, or 403.
            headers = list(self.headers.items())
            try:
                caller = taken_as or identities.verify(
                    self.command, identities.host_url(headers, raw_path, raw_query), headers, body, region=api.region
                )
            except identities.SignatureError as error:
                logger.debug("%s %s refused: %s", self.command, raw_path, error)
                self._send_json(403, {"message": "Forbidden"})
                return
            if not identities.allows(
                caller, region=api.region, api_id=route.event.api_id, method=self.command, path=raw_path
            ):
                self._send_json(403, {"message": "Forbidden"})
                return
            authorizer = identities.request_context_authorizer(caller)
        elif route.event.authorization != "NONE":
            # JWT: the local stack has no token issuer to trust; deploy to try it.
            self._send_json(401, {"message": "Unauthorized"})
            return
        event = build_http_api_event(
            route=route,
            method=self.command,
            # API Gateway HTTP APIs hand the function the path percent-decoded (rawPath and
            # requestContext.http.path alike); the signature above was checked on the path as sent.
            raw_path=unquote(raw_path),
            raw_query=raw_query,
            headers=list(self.headers.items()),
            body=body,
            path_parameters=path_parameters,
            source_ip=self.client_address[0],
            region=api.region,
            account_id=api.account_id,
            protocol=self.request_version,
            authorizer=authorizer,
        )
        request_id = event["requestContext"]["requestId"]
        result = api.invokers[route.function_logical_id].invoke(event)
        if not result.ok:
            logger.warning("%s %s -> %s failed: %s", self.command, raw_path, route.function_logical_id, result.error)
            self._send_json(500, {"message": "Internal Server Error"}, request_id=request_id)
            return
        try:
            code, headers, data = http_api_response(result.payload)
        except ValueError as error:
            logger.warning("%s %s: malformed Lambda response: %s", self.command, raw_path, error)
            self._send_json(500, {"message": "Internal Server Error"}, request_id=request_id)
            return
        self._send(code, headers, data, request_id=request_id)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle  # noqa: N815 - http.server names


class _ApiHttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    api: HttpApiServer


class HttpApiServer:
    """An API Gateway HTTP API on loopback: routes from the template, one proxy event per request.

    Parameters
    ----------
    routes
        The routes of every emulated API (see `HttpApiServer.routes_from_functions`).
    invokers
        Function logical id → invoker.
    host
        Address to bind (loopback only).
    port
        TCP port; 0 picks a free one.
    region, account_id
        Reported in the events.
    max_body_bytes
        Largest request body (bytes); larger ones get 413.

    Raises
    ------
    ValueError
        Two routes have the same route key, or a route's function has no invoker.
    """

    def __init__(
        self,
        routes: Sequence[HttpRoute],
        invokers: Mapping[str, Invoker],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        region: str = "us-east-1",
        account_id: str = ACCOUNT_ID,
        max_body_bytes: int = MAX_HTTP_BODY_BYTES,
    ) -> None:
        self.routes: list[HttpRoute] = []
        self.invokers: dict[str, Invoker] = {}
        self.set_routes(routes, invokers)
        self.host = host
        self.port = port
        self.region = region
        self.account_id = account_id
        self.max_body_bytes = max_body_bytes
        #: Swagger UI pages (local only, `devstack.swagger`); None serves none.
        self.swagger: SwaggerPages | None = None
        self._server: _ApiHttpServer | None = None
        self._thread: threading.Thread | None = None

    def set_routes(self, routes: Sequence[HttpRoute], invokers: Mapping[str, Invoker]) -> None:
        """Replace the routes and invokers (e.g. once the workers exist, after `bind` gave the URL).

        Raises
        ------
        ValueError
            Two routes have the same route key, or a route's function has no invoker.
        """
        seen: dict[str, str] = {}
        for route in routes:
            key = route.event.route_key
            if key in seen:
                raise ValueError(f"route {key!r} is declared by {seen[key]} and {route.function_logical_id}")
            seen[key] = route.function_logical_id
            if route.function_logical_id not in invokers:
                raise ValueError(f"route {key!r}: no invoker for {route.function_logical_id}")
        self.routes = sorted(routes, key=HttpRoute.specificity)
        self.invokers = dict(invokers)

    @staticmethod
    def routes_from_functions(functions: Iterable[FunctionSpec]) -> list[HttpRoute]:
        """Every ``HttpApi`` event of the functions as a route."""
        return [
            HttpRoute(spec.logical_id, event)
            for spec in functions
            for event in spec.events
            if isinstance(event, HttpApiEventSpec)
        ]

    def select_route(self, method: str, raw_path: str) -> tuple[HttpRoute, dict[str, str]] | None:
        """The most specific route that takes ``method raw_path``, and its path parameters."""
        for route in self.routes:
            params = route.match(method, raw_path)
            if params is not None:
                return route, params
        return None

    def get_as(self, path: str, caller: str = "operator") -> Any:
        """``GET path`` through its route's function as if signed by a local identity; its JSON body.

        For the emulator's own pages (`devstack.swagger`), which read the API's OpenAPI documents.

        Raises
        ------
        LookupError
            No route takes ``GET path``, or its function did not answer 200.
        """
        selected = self.select_route("GET", path)
        if selected is None:
            raise LookupError(f"no route GET {path}")
        route, path_parameters = selected
        event = build_http_api_event(
            route=route,
            method="GET",
            raw_path=path,
            raw_query="",
            headers=[("host", f"{self.host}:{self.port}"), ("accept", "application/json")],
            body=b"",
            path_parameters=path_parameters,
            source_ip="127.0.0.1",
            region=self.region,
            account_id=self.account_id,
            authorizer=identities.request_context_authorizer(identities.identity(caller)),
        )
        result = self.invokers[route.function_logical_id].invoke(event)
        if not result.ok:
            raise LookupError(f"GET {path}: {result.error}")
        status, _, data = http_api_response(result.payload)
        if status != 200:
            raise LookupError(f"GET {path}: {status} {data[:200]!r}")
        return json.loads(data)

    def bind(self) -> None:
        """Bind the socket now (so `url` is known before serving starts)."""
        if self._server is None:
            self._server = _ApiHttpServer((self.host, self.port), _ApiRequestHandler)
            self._server.api = self
            self.port = int(self._server.server_address[1])

    def start(self) -> None:
        """Bind (if needed) and serve in a background thread."""
        self.bind()
        if self._thread is None:
            assert self._server is not None
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="http-api", daemon=True
            )
            self._thread.start()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:3000`` (valid after `bind`)."""
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop serving and close the socket (requests in flight finish on their daemon threads)."""
        if self._server is not None:
            if self._thread is not None:
                self._server.shutdown()
                self._thread.join(5.0)
            self._server.server_close()
        self._server = None
        self._thread = None

"""The cost of every workflow (issue 44): what its work spent on AWS, tallied where the work is done and carried by
the writes and messages the engine makes anyway, so the tally costs no write of its own.

A `Tally` counts units, never dollars: DynamoDB write and read request units, SQS requests (64 KB chunks; a batch's
request shared by its messages), S3 requests and bytes, Lambda invocations (a batch's shared by its records) and
MB-milliseconds (time at the function's memory), log bytes (lines and metrics), HTTP API requests, and the events
published or the schedule tick that started it (an event trigger's PutEvents, a schedule trigger's EventBridge
Scheduler invocation, each $1.00 per million). `Tally.lines`
prices them with `sasflow.prices`, the list the bench bills with.

Where each unit is counted:

- **DynamoDB**: `meter` registers a botocore hook on the functions' clients. A read costs 1 RRU per 4 KB of what it
  returned (half when eventually consistent, at least the minimum when it finds nothing), a write 1 WRU per KB of the
  item it writes, a transaction twice (DynamoDB Developer Guide, "Read/write capacity mode: on-demand"). A call on a
  workflow's item (``pk`` ``WF#<id>``) is that workflow's; any other (an idempotency record, the circuit breaker, a
  definition) is the work in hand's (`Ledger`). The state store counts its own writes of a workflow's item, where it
  knows what the hook cannot: the item it replaces (a write costs the larger of the two) and the index entries it
  moves; the hook leaves those writes alone.
- **SQS**: the bus shares each SendMessageBatch request (its 64 KB chunks) among the messages it carries; a
  function started by an event source shares the mapping's receive (its chunks) and delete among the batch's records.
- **S3**: the claim-check's PutObject (and its bytes) and GetObject requests, through the same hook.
- **Lambda and logs**: `Ledger.invocation` times the invocation (rounded up to the millisecond, as Lambda bills) and
  counts the bytes its log lines and metrics write.

How the tally reaches the workflow's item: the work of an invocation is pending on the `Ledger`, by workflow, until
the state store writes that workflow's item (the write adds what is pending to the item's ``cost``) or the bus sends
a message for it (the message carries what is pending in its ``sasflow-cost`` attribute; the function that receives
it takes it over). So an agent's work rides on its reply, and the scheduler's write of the reply's outcome adds it
to the item. Work that is no single workflow's (a batch's set-up, the sends and the metrics at its end) is taken by
the next write or message of the same sandbox: nothing is lost, and each workflow pays about its share. A function
whose work is not a workflow's (the supervisor's sweep, an operator's listing) drops what it did not attribute:
those are fixed costs, the bench's "fixed costs" row.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .prices import S3_WRITE_OPERATIONS, SQS_CHUNK_BYTES

__all__ = [
    "COST_ATTRIBUTE",
    "LOG_STREAM",
    "CostLine",
    "Ledger",
    "Tally",
    "attribute_size",
    "body_workflow",
    "carried",
    "forget_ledgers",
    "item_size",
    "ledger",
    "meter",
    "metered",
    "read_units",
    "sqs_records",
    "sqs_requests",
    "write_units",
]

#: The SQS message attribute a message's pending cost rides in.
COST_ATTRIBUTE = "sasflow-cost"
_WRITE_UNIT = 1024
_READ_UNIT = 4096
_PACK_VERSION = 1
_FORMAT = "<B11f"  # version, then the 11 fields as float32: 45 bytes whatever the values (a stable item size)


# ---------------------------------------------------------------------------------------------------- the tally
_FIELDS = (
    "wru",
    "rru",
    "sqs",
    "s3_writes",
    "s3_reads",
    "s3_bytes",
    "invocations",
    "mb_ms",
    "log_bytes",
    "api",
    "events",
)


class Tally:
    """Units of AWS work (see the module's docstring), immutable. Adds with ``+``; falsy when it is all zeros.

    A plain class with slots, not a dataclass or a named tuple: every engine function imports it, and building
    either takes milliseconds of a cold start (bench/cold_start.py).
    """

    __slots__ = _FIELDS
    _fields = _FIELDS
    wru: float
    rru: float
    sqs: float
    s3_writes: float
    s3_reads: float
    s3_bytes: float
    invocations: float
    mb_ms: float
    log_bytes: float
    api: float
    events: float

    def __init__(
        self,
        wru: float = 0.0,
        rru: float = 0.0,
        sqs: float = 0.0,
        s3_writes: float = 0.0,
        s3_reads: float = 0.0,
        s3_bytes: float = 0.0,
        invocations: float = 0.0,
        mb_ms: float = 0.0,
        log_bytes: float = 0.0,
        api: float = 0.0,
        events: float = 0.0,
    ) -> None:
        values = (wru, rru, sqs, s3_writes, s3_reads, s3_bytes, invocations, mb_ms, log_bytes, api, events)
        for name, value in zip(_FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Tally is immutable: {name}")

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(a + b for a, b in zip(self.values(), other.values(), strict=True)))

    def __bool__(self) -> bool:
        return any(self.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tally) and self.values() == other.values()

    def __hash__(self) -> int:
        return hash(self.values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in zip(_FIELDS, self.values(), strict=True) if value)
        return f"Tally({shown})"

    @property
    def gb_seconds(self) -> float:
        """The Lambda time as Lambda bills it: GB-seconds (``mb_ms`` is MB-milliseconds)."""
        return self.mb_ms / 1024 / 1000

    def values(self) -> tuple[float, ...]:
        """The fields' values, in order."""
        return tuple(getattr(self, name) for name in _FIELDS)

    # -- stored forms
    def pack(self) -> bytes:
        """The item's ``cost`` attribute: a version byte and the 11 fields as float32 (45 bytes whatever the values,
        so a write's size never depends on a timing)."""
        return struct.pack(_FORMAT, _PACK_VERSION, *self.values())

    @classmethod
    def unpack(cls, data: bytes | None) -> Tally:
        """Read `pack`'s form back (an item without one, or of another version, has no tally: zeros)."""
        if not data or len(data) != struct.calcsize(_FORMAT) or data[0] != _PACK_VERSION:
            return cls()
        return cls(*struct.unpack(_FORMAT, data)[1:])

    def attribute(self) -> str:
        """A message's ``sasflow-cost`` attribute: the fields, comma-separated, in short decimal form."""
        return ",".join(f"{value:.6g}" if value else "" for value in self.values()).rstrip(",")

    @classmethod
    def from_attribute(cls, text: str | None) -> Tally:
        """Read `attribute`'s form back; a value that is not one (a sender of another version) is no tally."""
        if not text:
            return cls()
        try:
            values = [float(part) if part else 0.0 for part in text.split(",")]
        except ValueError:
            return cls()
        count = len(cls._fields)
        if len(values) > count or not all(math.isfinite(v) and v >= 0 for v in values):
            return cls()
        return cls(*values, *([0.0] * (count - len(values))))

    # -- dollars
    def lines(self, prices: Any | None = None) -> list[CostLine]:
        """The tally priced line by line with ``prices`` (a `sasflow.prices.PriceList`, or the module; None: the
        deployment's, `sasflow.prices.price_list`)."""
        if prices is None:
            from .prices import price_list

            prices = price_list()
        gb_seconds = self.gb_seconds
        return [
            CostLine("DynamoDB writes", f"{self.wru:,.0f} WRU", self.wru * prices.DYNAMODB_PER_WRU),
            CostLine("DynamoDB reads", f"{self.rru:,.1f} RRU", self.rru * prices.DYNAMODB_PER_RRU),
            CostLine("SQS", f"{self.sqs:,.2f} requests", self.sqs * prices.SQS_PER_REQUEST),
            CostLine(
                "S3",
                f"{self.s3_writes:,.0f} writes, {self.s3_reads:,.0f} reads, {self.s3_bytes:,.0f} bytes written",
                self.s3_writes * prices.S3_PER_WRITE_REQUEST + self.s3_reads * prices.S3_PER_READ_REQUEST,
            ),
            CostLine(
                "Lambda requests", f"{self.invocations:,.2f} invocations", self.invocations * prices.LAMBDA_PER_REQUEST
            ),
            CostLine("Lambda compute", f"{gb_seconds:,.4f} GB-s", gb_seconds * prices.LAMBDA_PER_GB_SECOND),
            CostLine(
                "CloudWatch Logs", f"{self.log_bytes:,.0f} bytes", self.log_bytes * prices.CLOUDWATCH_LOGS_PER_BYTE
            ),
            CostLine("API Gateway", _count(self.api, "HTTP API request"), self.api * prices.HTTP_API_PER_REQUEST),
            CostLine(
                "EventBridge",
                _count(self.events, "event or schedule tick"),
                self.events * prices.EVENTBRIDGE_PER_EVENT,
            ),
        ]

    def dollars(self, prices: Any | None = None) -> float:
        """The tally's price in dollars (the sum of its `lines`)."""
        return sum(line.dollars for line in self.lines(prices))


def _count(n: float, what: str) -> str:
    """``1 HTTP API request``, ``2 HTTP API requests``."""
    return f"{n:,.0f} {what}" + ("" if round(n) == 1 else "s")


class CostLine:
    """One priced line of a tally: what, how much of it, and its dollars."""

    __slots__ = ("dollars", "name", "quantity")

    def __init__(self, name: str, quantity: str, dollars: float) -> None:
        self.name = name
        self.quantity = quantity
        self.dollars = dollars


# ---------------------------------------------------------------------------------------------------- DynamoDB units
def attribute_size(value: dict[str, Any]) -> int:
    """Size in bytes of one attribute value in DynamoDB JSON (``{"S": "x"}``), by the Developer Guide's rules.

    Strings and binary are their UTF-8/byte length; a number is about one byte per two significant digits plus one;
    booleans and null are 1 byte; a list or map is 3 bytes plus 1 byte per element plus its elements (and, for a
    map, its key names). Sets are the sum of their elements.
    """
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return _number_size(str(raw))
    if kind == "B":
        return len(raw) if isinstance(raw, bytes | bytearray) else len(str(raw))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(v).encode()) for v in raw)
    if kind == "NS":
        return sum(_number_size(str(v)) for v in raw)
    if kind == "BS":
        return sum(len(v) for v in raw)
    if kind == "L":
        return 3 + sum(1 + attribute_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + attribute_size(v) for k, v in raw.items())
    raise ValueError(f"unknown DynamoDB type {kind!r}")


def _number_size(text: str) -> int:
    digits = text.lstrip("-").split("e")[0].split("E")[0].replace(".", "").strip("0") or "0"
    return math.ceil(len(digits) / 2) + 1 + (1 if text.startswith("-") else 0)


def item_size(item: dict[str, dict[str, Any]]) -> int:
    """Size in bytes of an item in DynamoDB JSON: attribute names plus values."""
    return sum(len(name.encode()) + attribute_size(value) for name, value in item.items())


def write_units(size: int) -> int:
    """WRU of writing an item of ``size`` bytes: 1 per KB, rounded up, at least 1."""
    return max(1, math.ceil(size / _WRITE_UNIT))


def read_units(size: int, consistent: bool) -> float:
    """RRU of reading ``size`` bytes: 1 per 4 KB, rounded up, at least 1; half when eventually consistent."""
    units = max(1, math.ceil(size / _READ_UNIT))
    return float(units) if consistent else units / 2


# ---------------------------------------------------------------------------------------------------- the ledger
class Ledger:
    """What the work of one sandbox has cost, by workflow, until a write or a message carries it.

    An agent works on a batch's records at once, a thread each (`sasflow.batch.AtOnce`): each thread's block
    (`working_on`) is its record's workflow's, so each thread's calls and log lines are charged to the workflow in its
    hands, and a stretch of the invocation's time is shared equally by the blocks open during it (Lambda bills the
    invocation's duration once, whatever runs in it). The worker threads use their caller's ledger (`adopted`).

    Parameters
    ----------
    timer:
        Seconds, monotonic (``time.perf_counter``; tests inject their own).
    """

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self._timer = timer
        self._lock = threading.RLock()
        self._threads = threading.local()  # this thread's ``precounted`` depth
        self._open: dict[int, str] = {}  # thread -> the workflow of its open block (NOBODY: no workflow's)
        self._pending: dict[str, Tally] = {}
        self._unattributed = Tally()
        self._mark: float | None = None
        self._memory_mb = 0
        self._served = False  # this invocation worked for a workflow (took its work, or a block for it)

    @property
    def _current(self) -> str | None:
        """The workflow of this thread's open block (None: none is open)."""
        return self._open.get(threading.get_ident())

    # -- invocations
    @contextlib.contextmanager
    def invocation(self, memory_mb: int, *, carry: bool = True) -> Iterator[None]:
        """Time one Lambda invocation at ``memory_mb``: each stretch of it is charged to the workflow that takes it
        (`take`), the rest (and the rounding up to a whole millisecond) to the next workflow that does.

        With ``carry=False`` (a function whose work is not a workflow's), what is still unattributed when it ends is
        dropped: a fixed cost, never a workflow's. So is the unattributed work of an invocation that worked for no
        workflow at all (a batch of poison messages, a refused occurrence): no workflow's, whoever comes next.
        """
        with self._lock:
            self._memory_mb = memory_mb
            self._served = False
            started = self._mark = self._timer()
        try:
            yield
        finally:
            with self._lock:
                ended = self._timer()
                self._close_segment(ended)
                elapsed_ms = (ended - started) * 1000
                self._unattributed += Tally(mb_ms=(math.ceil(elapsed_ms) - elapsed_ms) * memory_mb)
                for pending in self._pending.values():
                    self._unattributed += pending
                self._pending.clear()
                if not carry or not self._served:
                    self._unattributed = Tally()
                self._mark = None
                self._open.clear()

    @contextlib.contextmanager
    def working_on(self, workflow_id: str | None) -> Iterator[None]:
        """Charge this thread's calls and logs in this block to ``workflow_id``, and its share of the time (one
        record of a batch whose result is sent later: an agent's request, whose reply carries them). None: a record
        of no workflow (a poison message), whose work no workflow pays."""
        thread = threading.get_ident()
        block = workflow_id if workflow_id is not None else NOBODY
        with self._lock:
            self._close_segment()
            previous = self._current
            self._open[thread] = block
            if workflow_id is not None:
                self._served = True
                self.charge(workflow_id, self._unattributed)
                self._unattributed = Tally()
        try:
            yield
        finally:
            with self._lock:
                self._close_segment()
                if previous is None:
                    self._open.pop(thread, None)
                else:
                    self._open[thread] = previous

    def _close_segment(self, now: float | None = None) -> None:
        """Charge the time since the last mark: shared by the open blocks, else this thread's (caller holds the
        lock)."""
        if self._mark is None:
            return
        now = self._timer() if now is None else now
        mb_ms = (now - self._mark) * 1000 * self._memory_mb
        self._mark = now
        if not self._open:
            self.charge(self._current, Tally(mb_ms=mb_ms))
            return
        share = Tally(mb_ms=mb_ms / len(self._open))
        for block in list(self._open.values()):
            self.charge(block, share)

    # -- charging and taking
    def charge(self, workflow_id: str | None, tally: Tally) -> None:
        """Add ``tally`` to what ``workflow_id`` owes (None: the work in hand's, see the module's docstring)."""
        if not tally:
            return
        with self._lock:
            if workflow_id is None:
                workflow_id = self._current
            if workflow_id is None:
                self._unattributed += tally
            elif workflow_id != NOBODY:
                self._pending[workflow_id] = self._pending.get(workflow_id, Tally()) + tally

    def log(self, nbytes: int) -> None:
        """Count ``nbytes`` written to the function's log."""
        self.charge(None, Tally(log_bytes=nbytes))

    def take(self, workflow_id: str) -> Tally:
        """What ``workflow_id`` owes now, for a write or a message to carry: its pending work, and, unless another
        workflow's block is open, the invocation's time so far and the work no workflow has taken."""
        with self._lock:
            if self._current in (None, workflow_id):
                self._close_segment()
            self._served = True
            owed = self._pending.pop(workflow_id, Tally())
            if self._current is None:
                owed += self._unattributed
                self._unattributed = Tally()
            return owed

    def give_back(self, workflow_id: str, tally: Tally) -> None:
        """Return what a write or a message took but could not carry (a lost race, a failed send)."""
        self.charge(workflow_id, tally)

    @contextlib.contextmanager
    def precounted(self) -> Iterator[None]:
        """This thread's calls in this block are counted by their caller (the state store's writes): `meter` leaves
        them alone."""
        depth = getattr(self._threads, "precounted", 0)
        self._threads.precounted = depth + 1
        try:
            yield
        finally:
            self._threads.precounted = depth

    @property
    def is_precounted(self) -> bool:
        """Whether this thread has a `precounted` block open."""
        return getattr(self._threads, "precounted", 0) > 0

    @contextlib.contextmanager
    def adopted(self) -> Iterator[Ledger]:
        """Make this ledger the ledger of the calling thread (a worker of a batch's records) for the block."""
        previous = getattr(_LOCAL, "adopted", None)
        _LOCAL.adopted = self
        try:
            yield self
        finally:
            _LOCAL.adopted = previous


class _LogStream:
    """The stream the functions' log lines go to: whatever ``sys.stdout`` is when a line is written (Lambda's
    stdout, a test's capture), each line's bytes counted on this thread's ledger."""

    def write(self, text: str) -> int:
        ledger().log(len(text.encode("utf-8", "surrogatepass")))
        return int(sys.stdout.write(text))

    def flush(self) -> None:
        sys.stdout.flush()


#: Where a metered function's Logger writes (`metered`).
LOG_STREAM = _LogStream()


def metered(
    *,
    logger: Any = None,
    metrics: Any = None,
    carry: bool = True,
    records: Callable[[dict[str, Any]], Iterable[tuple[str | None, Tally]]] | None = None,
    request: Tally | None = None,
    records_charged_by_handler: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a Lambda handler (outermost) so that its invocations are tallied (see the module's docstring).

    Parameters
    ----------
    logger:
        The function's powertools Logger: its lines are counted (its handler writes through `LOG_STREAM`).
    metrics:
        The function's powertools Metrics: the EMF line each flush prints is counted.
    carry:
        False for a function whose work is not a workflow's (`Ledger.invocation`).
    records:
        For a function an SQS event source invokes: the workflow of each record of the event and what the record
        brings (the share of the mapping's receive and delete, of the invocation, and the cost its message carries),
        charged when the invocation starts.
    request:
        What the request that invokes the function costs besides (an HTTP API request), charged to the first
        workflow the invocation writes.
    records_charged_by_handler:
        The handler charges each record's share itself, when it starts the record (`sqs_records`: a trigger, whose
        records' workflows are known only once they start).
    """
    if logger is not None:
        logger.registered_handler.setStream(LOG_STREAM)
    if metrics is not None:
        _count_flushes(metrics.provider)

    def wrap(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def metered_handler(event: Any, context: Any) -> Any:
            book = ledger()
            memory = int(getattr(context, "memory_limit_in_mb", 0) or os.environ.get(_MEMORY_VARIABLE) or 0)
            with book.invocation(memory, carry=carry):
                if request is not None:
                    book.charge(None, request)
                if records is not None and isinstance(event, dict):
                    for workflow_id, tally in records(event):
                        # the records' shares of the invocation add up to one; a poison record's is no workflow's
                        book.charge(NOBODY if workflow_id is None else workflow_id, tally)
                elif not records_charged_by_handler:
                    book.charge(None, Tally(invocations=1))
                return handler(event, context)

        return metered_handler

    return wrap


_MEMORY_VARIABLE = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"


def _count_flushes(provider: Any) -> None:
    """Count the bytes of the EMF line each flush of ``provider`` (powertools' CloudWatch EMF provider) prints."""
    if getattr(provider, "_sasflow_counted", False):
        return
    flush = provider.flush_metrics

    def counted_flush(raise_on_empty_metrics: bool = False) -> None:
        from aws_lambda_powertools.metrics.functions import is_metrics_disabled

        if provider.metric_set and not is_metrics_disabled():
            line = json.dumps(provider.serialize_metric_set(), separators=(",", ":"))
            ledger().log(len(line.encode()) + 1)
        flush(raise_on_empty_metrics=raise_on_empty_metrics)

    provider.flush_metrics = counted_flush
    provider._sasflow_counted = True


def sqs_records(
    workflow_of: Callable[[dict[str, Any]], str | None], *, delivered: bool = False, published: bool = False
) -> Callable[[dict[str, Any]], list[Any]]:
    """`metered`'s ``records`` for an SQS batch: each record's workflow (``workflow_of``), its share of the
    invocation and of the mapping's ReceiveMessage (its 64 KB chunks) and DeleteMessageBatch, and the cost its
    message carries (``sasflow-cost``). ``delivered``: each record also brings the SendMessage that delivered it (a
    trigger's occurrence: the EventBridge rule's, S3's notification's or the producer's send to the trigger's queue),
    and ``published`` the PutEvents that published it or the EventBridge Scheduler invocation that sent it (an event
    or a schedule trigger's occurrence).
    """

    def each(event: dict[str, Any]) -> list[tuple[str | None, Tally]]:
        batch = [record for record in event.get("Records") or [] if isinstance(record, dict)]
        if not batch:
            return []
        payload = sum(len(str(record.get("body", "")).encode()) for record in batch)
        requests = sqs_requests(payload) + 1  # the receive's chunks and the delete
        share = Tally(invocations=1 / len(batch), sqs=requests / len(batch))
        return [
            (
                workflow_of(record),
                share
                + carried(record)
                + (_delivery(record) if delivered else Tally())
                + Tally(events=1 if published else 0),
            )
            for record in batch
        ]

    return each


def _delivery(record: dict[str, Any]) -> Tally:
    return Tally(sqs=sqs_requests(len(str(record.get("body", "")).encode())))


def sqs_requests(payload_bytes: int) -> int:
    """Requests SQS bills for one request carrying ``payload_bytes``: one per 64 KB chunk, at least one."""
    return max(1, math.ceil(payload_bytes / SQS_CHUNK_BYTES))


def carried(record: dict[str, Any]) -> Tally:
    """The cost a received SQS record (as Lambda passes it) carries in its ``sasflow-cost`` attribute."""
    attribute = (record.get("messageAttributes") or {}).get(COST_ATTRIBUTE) or {}
    return Tally.from_attribute(attribute.get("stringValue") if isinstance(attribute, dict) else None)


def body_workflow(record: dict[str, Any]) -> str | None:
    """The ``workflow_id`` of an SQS record's JSON body (a step request or reply), or None."""
    try:
        found = json.loads(record.get("body") or "").get("workflow_id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


#: What `Ledger.charge` drops: the work of a record of no workflow (a poison message), which no workflow pays.
NOBODY = "\x00nobody"

_LOCAL = threading.local()


def ledger() -> Ledger:
    """The ledger of this thread's function (a Lambda sandbox runs one invocation at a time; the local stack runs one
    a thread; the bench and the simulation run every function in one thread, each with its own ledger, as each has
    its own sandboxes on Lambda); in a worker thread of a batch's records, its caller's (`Ledger.adopted`)."""
    adopted: Ledger | None = getattr(_LOCAL, "adopted", None)
    if adopted is not None:
        return adopted  # a worker thread of a batch (`Ledger.adopted`)
    ledgers: dict[str, Ledger] | None = getattr(_LOCAL, "ledgers", None)
    if ledgers is None:
        ledgers = _LOCAL.ledgers = {}
    function = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "")
    found = ledgers.get(function)
    if found is None:
        found = ledgers[function] = Ledger()
    return found


def forget_ledgers() -> None:
    """Drop this thread's ledgers (a test's, or a run's of the bench, before the next)."""
    _LOCAL.ledgers = {}


# ---------------------------------------------------------------------------------------------------- the hook
_WORKFLOW_PK = "WF#"


def meter(client: Any) -> Any:
    """Count the DynamoDB and S3 work of ``client``'s calls on this thread's ledger (see the module's docstring);
    return ``client``."""
    events = client.meta.events
    events.register("before-parameter-build", _remember_params)
    events.register("after-call", _after_call)
    return client


def _remember_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["sasflow_cost_params"] = params
    context["sasflow_cost_skip"] = ledger().is_precounted


def _after_call(model: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if context.get("sasflow_cost_skip"):
        return
    params = context.get("sasflow_cost_params") or {}
    service = model.service_model.service_name
    if service == "dynamodb":
        _dynamodb(model.name, params, parsed)
    elif service == "s3":
        _s3(model.name, params)


def _owner(key: dict[str, Any] | None) -> str | None:
    pk = ((key or {}).get("pk") or {}).get("S")
    return pk[len(_WORKFLOW_PK) :] if isinstance(pk, str) and pk.startswith(_WORKFLOW_PK) else None


def _dynamodb(operation: str, params: dict[str, Any], parsed: dict[str, Any]) -> None:
    book = ledger()
    if operation == "GetItem":
        item = parsed.get("Item")
        units = read_units(item_size(item) if item else 0, bool(params.get("ConsistentRead")))
        book.charge(_owner(params.get("Key")), Tally(rru=units))
    elif operation in ("Query", "Scan"):
        items = parsed.get("Items", [])
        consistent = bool(params.get("ConsistentRead")) and "IndexName" not in params
        book.charge(None, Tally(rru=read_units(sum(item_size(i) for i in items), consistent)))
    elif operation == "BatchGetItem":
        for items in (parsed.get("Responses") or {}).values():
            for item in items:
                book.charge(_owner(item), Tally(rru=read_units(item_size(item), False)))
    elif operation == "PutItem":
        item = params.get("Item") or {}
        book.charge(_owner(item), Tally(wru=write_units(item_size(item))))
    elif operation in ("UpdateItem", "DeleteItem"):
        # the item after an update is at least its key and the values it sets (the idempotency record's result, the
        # breaker's counters): the write is priced on them
        written = {**(params.get("Key") or {}), **(params.get("ExpressionAttributeValues") or {})}
        book.charge(_owner(params.get("Key")), Tally(wru=write_units(item_size(written))))
    elif operation == "TransactWriteItems":
        for entry in params.get("TransactItems", []):
            ((_kind, body),) = entry.items()
            written = body.get("Item") or {**(body.get("Key") or {}), **(body.get("ExpressionAttributeValues") or {})}
            owner = _owner(body.get("Item") or body.get("Key"))
            book.charge(owner, Tally(wru=2 * write_units(item_size(written))))


def _body_size(body: Any) -> int:
    """Bytes of a request's body: bytes as given, or the file-like object botocore wraps them in."""
    if isinstance(body, bytes | bytearray | str):
        return len(body)
    if hasattr(body, "seek") and hasattr(body, "tell"):
        position = body.tell()
        size = int(body.seek(0, 2))
        body.seek(position)
        return size
    return 0


def _s3(operation: str, params: dict[str, Any]) -> None:
    size = _body_size(params.get("Body"))
    if operation in S3_WRITE_OPERATIONS:
        ledger().charge(None, Tally(s3_writes=1, s3_bytes=size))
    else:
        ledger().charge(None, Tally(s3_reads=1))

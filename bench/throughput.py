"""Throughput (issue 4): steps per second on the local stack, against the same AWS calls made back to back.

**Ours.** The sample services on loopback without faults, the local stack from template.yaml (`devstack`) with every
execution environment started, a warm-up of trip bookings that is discarded, then ``workflows`` 3-step trip bookings
started over HTTP as fast as the API takes them. The clock starts at the first start request and stops when the
driver sees the last workflow terminal: steps/s = completed steps / elapsed seconds.

**The calls.** Every AWS call the product makes is recorded: in each function's worker processes through the
``DEVSTACK_WORKER_INIT`` hook (`install_worker_hook`), and in the main process, where the SQS event-source pollers run,
through `record_calls`. A call is one JSON line (start time, duration, service, operation, parameters, error code,
messages received) appended to a per-process file as soon as it returns, so a killed worker loses at most the call
it was making. The driver's own calls (it starts workflows over HTTP; it reads status, scans and cleans up through
clients made under `uncounted`) are not recorded.

**The ceiling.** On the same moto server, with the event sources stopped, the queues purged and the items the run
wrote deleted (so every table has the size it had when the run started: moto's queries and transactions cost more
as a table grows), a separate process replays the run's DynamoDB and SQS calls, causes before effects, back to
back, from one client per service: the same tables, queues, items, condition expressions and batch sizes. Receives
use ``WaitTimeSeconds=0``, and deletes use receipt handles that the replay itself received. A receive that returned
nothing (an event source's idle long poll) did no work, so it is counted apart and not replayed.
ceiling steps/s = steps / replay seconds; ratio = ours / ceiling. The product spreads its calls over several
processes, so a ratio above 1 is possible: the ceiling is one client's, not the server's.

**Per-step overhead** (issue 13), from the same run (zero-latency services): the recorder also writes the message
ids of every send and receive, and each worker the start of each handler invocation with its records' message ids
(`_record_invocations`), so `per_step_latency` measures *reply received -> next request sent* and *request sent ->
agent start* from those timestamps, shown against the template's batching windows (`batching_windows`) and the
same calls back to back.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bench.report import Row, markdown
from devstack.template import remote_service_parameters

if TYPE_CHECKING:
    from devstack.stack import LocalStack

__all__ = [
    "CALLS_DIR_VARIABLE",
    "TARGET_RATIO",
    "WORKER_HOOK",
    "Call",
    "CallRecorder",
    "WorkflowDriver",
    "install_worker_hook",
    "measure_throughput",
    "read_calls",
    "record_calls",
    "replay",
    "uncounted",
]

CALLS_DIR_VARIABLE: Final = "SASFLOW_BENCH_CALLS_DIR"
"""Folder where each recording process writes ``calls-<pid>.jsonl`` (given to the workers in their environment)."""
WORKER_HOOK: Final = "bench.throughput:install_worker_hook"
"""The ``DEVSTACK_WORKER_INIT`` entry that records the calls of a function's worker."""
TARGET_RATIO: Final = 0.5
"""Issue 4: steps/s on the local stack >= half the ceiling."""
REPLAYED_SERVICES: Final = frozenset({"dynamodb", "sqs"})

START_CONCURRENCY: Final = 2
"""HTTP clients starting workflows at once (the API function has two execution environments)."""
POLL_SECONDS: Final = (0.5, 0.1)
"""How often the driver reads the status of the workflows not yet seen terminal (seconds): while many run, and once
at most `FEW` are left. The reads go to the moto server that the run is using, so they are few while it is busy, and
the end of the run is still seen within 0.1 s."""
FEW: Final = 5
SETTLE_SECONDS: Final = 1.5
"""Wait after the last workflow is terminal, so the pollers settle its last batches before they are stopped."""

_CONTEXT_KEY: Final = "sasflow_bench_call"
_PARAMS_KEY: Final = "sasflow_bench_params"
_BYTES_KEY: Final = "__bytes__"
_RECEIPT_BATCHES: Final = frozenset({"DeleteMessageBatch", "ChangeMessageVisibilityBatch"})
_RECEIPT_SINGLES: Final = frozenset({"DeleteMessage", "ChangeMessageVisibility"})


# ------------------------------------------------------------------------------------------------ recording


def _step_key(body: str | None) -> str:
    """``workflow/step/phase/attempt/kind`` of a step request or reply body, or "" for any other message."""
    try:
        message = json.loads(body or "")
        return "/".join(str(message[k]) for k in ("workflow_id", "step", "phase", "attempt", "kind"))
    except (ValueError, TypeError, KeyError):
        return ""


def _message_keys(operation: str, params: dict[str, Any], parsed: dict[str, Any]) -> list[list[str]] | None:
    """``[message id, step key]`` of each message a send sent or a receive returned (see `_step_key`)."""
    if operation == "SendMessage" and parsed.get("MessageId"):
        return [[parsed["MessageId"], _step_key(params.get("MessageBody"))]]
    if operation == "SendMessageBatch":
        bodies = {entry.get("Id"): entry.get("MessageBody") for entry in params.get("Entries") or []}
        return [[ok["MessageId"], _step_key(bodies.get(ok.get("Id")))] for ok in parsed.get("Successful") or []]
    if operation == "ReceiveMessage":
        return [[m["MessageId"], _step_key(m.get("Body"))] for m in parsed.get("Messages") or []]
    return None


def _encode_bytes(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {_BYTES_KEY: base64.b64encode(value).decode()}
    raise TypeError(f"cannot record a parameter of type {type(value).__name__}")


def _decode_bytes(value: dict[str, Any]) -> Any:
    if len(value) == 1 and _BYTES_KEY in value:
        return base64.b64decode(value[_BYTES_KEY])
    return value


class CallRecorder:
    """Appends one JSON line per AWS API call of the clients it is attached to, to ``<directory>/calls-<pid>.jsonl``.

    A line holds ``started`` (epoch seconds), ``seconds`` (duration seen by the client, retries included),
    ``service``, ``operation``, ``error`` (the error code, or null), ``received`` (messages returned by a
    ReceiveMessage, else null), ``retries`` (botocore's retry attempts), ``cpu`` (the process's CPU seconds when the
    call returned) and ``params`` (the API parameters, or null when they are not JSON). Lines are flushed one by one
    (thread-safe).

    Parameters
    ----------
    directory
        Folder of the call files (exists).
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / f"calls-{os.getpid()}.jsonl"
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def attach(self, events: Any) -> None:
        """Register on a client's event emitter (``client.meta.events``)."""
        events.register("before-parameter-build", self._before)
        events.register("after-call", self._after)
        events.register("after-call-error", self._after_error)

    def close(self) -> None:
        """Close the file (later calls of attached clients are dropped)."""
        with self._lock:
            self._file.close()

    def _before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        try:
            text = json.dumps(params, default=_encode_bytes)
        except (TypeError, ValueError):  # the product's call must go on; it is counted, but cannot be replayed
            text = "null"
        context[_CONTEXT_KEY] = (time.time(), time.perf_counter(), text)
        context[_PARAMS_KEY] = params

    def _after(self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        error = (parsed.get("Error") or {}).get("Code") if http_response.status_code >= 300 else None
        received = len(parsed.get("Messages") or []) if model.name == "ReceiveMessage" else None
        retries = int((parsed.get("ResponseMetadata") or {}).get("RetryAttempts", 0))
        messages = _message_keys(model.name, context.get(_PARAMS_KEY) or {}, parsed) if error is None else None
        self._write(context, model.service_model.service_name, model.name, error, received, retries, messages)

    def _after_error(self, exception: Exception, context: dict[str, Any], event_name: str, **_: Any) -> None:
        service, operation = event_name.split(".", 2)[1:]
        self._write(context, service, operation, type(exception).__name__, None, 0)

    def _write(
        self,
        context: dict[str, Any],
        service: str,
        operation: str,
        error: str | None,
        received: Any,
        retries: int,
        messages: list[list[str]] | None = None,
    ) -> None:
        context.pop(_PARAMS_KEY, None)
        begun = context.pop(_CONTEXT_KEY, None)
        if begun is None:
            return
        started, perf_started, params = begun
        head = {
            "started": started,
            "seconds": time.perf_counter() - perf_started,
            "service": service,
            "operation": operation,
            "error": error,
            "received": received,
            "retries": retries,
            "cpu": time.process_time(),
        }
        if messages:
            head["messages"] = messages
        line = json.dumps(head)[:-1] + ', "params": ' + params + "}\n"
        with self._lock, contextlib.suppress(ValueError):  # ValueError: closed
            self._file.write(line)
            self._file.flush()


_LOCAL = threading.local()


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Clients created in this block, on this thread, are not recorded (the benchmark driver's own)."""
    _LOCAL.uncounted = True
    try:
        yield
    finally:
        _LOCAL.uncounted = False


def _install(recorder: CallRecorder) -> Callable[[], None]:
    """Attach ``recorder`` to every botocore client created from now on, whatever its session; return the undo."""
    from botocore.session import Session

    original = Session.create_client

    def create_client(self: Session, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        if not getattr(_LOCAL, "uncounted", False):
            recorder.attach(client.meta.events)
        return client

    Session.create_client = create_client  # type: ignore[method-assign]

    def undo() -> None:
        Session.create_client = original  # type: ignore[method-assign]

    return undo


def install_worker_hook() -> None:
    """``DEVSTACK_WORKER_INIT`` hook: record every call of this worker's clients in ``$SASFLOW_BENCH_CALLS_DIR``.

    Runs before the handler is imported, so before the handler creates its clients. Does nothing when the variable
    is unset.
    """
    directory = os.environ.get(CALLS_DIR_VARIABLE)
    if directory:
        _install(CallRecorder(Path(directory)))
        _record_invocations(Path(directory))


def _record_invocations(directory: Path) -> None:
    """Append ``{"started", "message_ids"}`` to ``invocations-<pid>.jsonl`` as each invocation of this worker starts.

    Wraps the handler the devstack worker imports (``devstack.lambda_runtime._import_handler``), so the time is the
    handler's own start, in this process, before any of its work.
    """
    import devstack.lambda_runtime as runtime

    path = directory / f"invocations-{os.getpid()}.jsonl"
    original = runtime._import_handler

    def import_handler(spec: Any) -> Any:
        handler = original(spec)

        def timed(event: Any, context: Any) -> Any:
            started = time.time()
            ids = [r.get("messageId") for r in (event or {}).get("Records", [])] if isinstance(event, dict) else []
            with path.open("a", encoding="utf-8") as file:
                file.write(json.dumps({"started": started, "message_ids": ids}) + "\n")
            return handler(event, context)

        return timed

    runtime._import_handler = import_handler


@contextlib.contextmanager
def record_calls(directory: Path) -> Iterator[CallRecorder]:
    """Record the calls of every client this process creates in the block (except under `uncounted`)."""
    recorder = CallRecorder(directory)
    undo = _install(recorder)
    try:
        yield recorder
    finally:
        undo()
        recorder.close()


@dataclass(frozen=True)
class Call:
    """One recorded AWS call (see `CallRecorder` for the fields; ``pid`` is the process that made it)."""

    started: float
    seconds: float
    pid: int
    service: str
    operation: str
    error: str | None
    received: int | None
    retries: int
    cpu: float
    params: dict[str, Any] | None
    messages: list[list[str]] | None = None

    @property
    def key(self) -> str:
        """``service:Operation``, e.g. ``dynamodb:PutItem``."""
        return f"{self.service}:{self.operation}"

    @property
    def ended(self) -> float:
        """When the call returned (epoch seconds)."""
        return self.started + self.seconds

    @property
    def order(self) -> float:
        """Sort key that puts every cause before its effects: the end of a receive, the start of anything else.

        If call A led to call B, A ended before B started. A receive returns a message at the latest when it ends,
        and the message was sent after its SendMessage started (a long poll may even start before the send and
        return before the sender has read its response).
        """
        return self.ended if self.operation == "ReceiveMessage" else self.started

    @property
    def idle(self) -> bool:
        """A receive that returned no message: an idle long poll, which did no work."""
        return self.operation == "ReceiveMessage" and self.error is None and not self.received


def read_calls(directory: Path) -> list[Call]:
    """The calls recorded in ``directory``, causes before effects (`Call.order`).

    A line cut short (a worker killed while writing) is skipped.
    """
    calls: list[Call] = []
    for path in sorted(Path(directory).glob("calls-*.jsonl")):
        pid = int(path.stem.removeprefix("calls-"))
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                raw = json.loads(line, object_hook=_decode_bytes)
            except ValueError:
                continue
            calls.append(Call(pid=pid, **raw))
    calls.sort(key=lambda call: call.order)
    return calls


# ------------------------------------------------------------------------------------------------ replay


def _receipt_params(call: Call, handles: dict[str, deque[str]]) -> dict[str, Any] | None:
    """The call's parameters for the replay, with the replay's own receipt handles; None when it cannot be made."""
    if call.params is None:
        return None
    params = dict(call.params)
    if call.operation == "ReceiveMessage":
        params["WaitTimeSeconds"] = 0
    elif call.operation in _RECEIPT_BATCHES:
        pool = handles[params["QueueUrl"]]
        entries = []
        for entry in params["Entries"]:
            if not pool:
                break
            entries.append({**entry, "ReceiptHandle": pool.popleft()})
        if not entries:
            return None
        params["Entries"] = entries
    elif call.operation in _RECEIPT_SINGLES:
        pool = handles[params["QueueUrl"]]
        if not pool:
            return None
        params["ReceiptHandle"] = pool.popleft()
    return params


def replay(calls: Sequence[Call], *, endpoint_url: str, region: str) -> dict[str, Any]:
    """Make ``calls`` again, back to back, in their order, from one client per service; time them.

    Parameters
    ----------
    calls
        Recorded calls (idle receives already left out).
    endpoint_url
        The moto server.
    region
        AWS region.

    Returns
    -------
    dict
        ``seconds`` (wall time of the calls), ``client_cpu_seconds`` (this process's CPU meanwhile),
        ``seconds_by_operation`` (``service:Operation`` → seconds spent in those calls), ``calls`` (made),
        ``skipped`` (deletes left with no receipt handle to use, calls whose parameters were not recorded),
        ``received`` (messages), ``errors`` (``service:Operation:Code`` → count).
    """
    from botocore import xform_name
    from botocore.exceptions import ClientError

    from devstack._aws import client

    clients = {service: client(service, region=region, endpoint_url=endpoint_url) for service in REPLAYED_SERVICES}
    # A client's first call loads its endpoint rules and response parsers; the product's clients are warm too.
    clients["dynamodb"].list_tables(Limit=1)
    clients["sqs"].list_queues(MaxResults=1)
    plan = [(getattr(clients[call.service], xform_name(call.operation)), call) for call in calls]
    handles: dict[str, deque[str]] = defaultdict(deque)
    errors: Counter[str] = Counter()
    by_operation: defaultdict[str, float] = defaultdict(float)
    made = skipped = received = 0
    cpu = time.process_time()
    started = time.perf_counter()
    for method, call in plan:
        params = _receipt_params(call, handles)
        if params is None:
            skipped += 1
            continue
        made += 1
        before = time.perf_counter()
        try:
            response = method(**params)
        except ClientError as error:
            errors[f"{call.key}:{error.response.get('Error', {}).get('Code', '?')}"] += 1
            continue
        finally:
            by_operation[call.key] += time.perf_counter() - before
        if call.operation == "ReceiveMessage":
            messages = response.get("Messages", [])
            received += len(messages)
            handles[params["QueueUrl"]].extend(message["ReceiptHandle"] for message in messages)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "client_cpu_seconds": time.process_time() - cpu,
        "seconds_by_operation": dict(sorted(by_operation.items())),
        "calls": made,
        "skipped": skipped,
        "received": received,
        "errors": dict(errors),
    }


# ------------------------------------------------------------------------------------------------ the run


class WorkflowDriver:
    """Starts workflows over HTTP and watches them with BatchGetItem through a client that is not recorded."""

    def __init__(self, stack: LocalStack, definition: dict[str, Any]) -> None:
        import urllib3

        from devstack.client import SignedHttp

        self.stack = stack
        self.definition = definition
        self.http = SignedHttp(stack.api_url, pool=urllib3.PoolManager(maxsize=START_CONCURRENCY, retries=False))
        with uncounted():
            self.dynamodb = stack.client("dynamodb")
            self.sqs = stack.client("sqs")
        self.table = stack.physical_ids["StateTable"]

    def run(self, count: int, label: str, time_limit_seconds: float) -> tuple[list[str], float, float]:
        """Start ``count`` workflows and wait until each is terminal.

        Returns
        -------
        tuple
            Workflow ids, epoch seconds of the first start request, epoch seconds when the last was seen terminal.

        Raises
        ------
        RuntimeError
            A start failed, or the workflows were not all terminal within ``time_limit_seconds``.
        """
        first = time.time()
        deadline = time.monotonic() + time_limit_seconds
        with ThreadPoolExecutor(START_CONCURRENCY, thread_name_prefix="bench-start") as starters:
            futures = [starters.submit(self._start, f"{label}-{index}", index) for index in range(count)]
            pending: list[Future[str]] = list(futures)
            running: set[str] = set()
            while True:
                for future in [f for f in pending if f.done()]:
                    running.add(future.result())
                    pending.remove(future)
                running -= self._terminal(sorted(running))
                if not pending and not running:
                    return [future.result() for future in futures], first, time.time()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(running) + len(pending)} of {count} workflows not terminal in time")
                time.sleep(POLL_SECONDS[len(running) + len(pending) <= FEW])

    def _start(self, key: str, index: int) -> str:
        trip = {
            "traveller": f"traveller-{index:04d}",
            "route": "LHR-JFK",
            "nights": 1 + index % 5,
            "amount": 100 + index,
        }
        body = {"definition": self.definition, "input": trip}
        status, view = self.http.post("/workflows", body, headers={"Idempotency-Key": f"bench-{key}"}, timeout=60.0)
        if status not in (200, 201):
            raise RuntimeError(f"start {key}: HTTP {status} {str(view)[:200]}")
        return str(view["workflow_id"])

    def _terminal(self, workflow_ids: list[str]) -> set[str]:
        from devstack.demo import TERMINAL

        ended: set[str] = set()
        for offset in range(0, len(workflow_ids), 100):
            keys = [{"pk": {"S": f"WF#{wid}"}, "sk": {"S": "#WF"}} for wid in workflow_ids[offset : offset + 100]]
            request: dict[str, Any] = {
                self.table: {
                    "Keys": keys,
                    "ConsistentRead": True,
                    "ProjectionExpression": "pk, #s",
                    "ExpressionAttributeNames": {"#s": "status"},
                }
            }
            items = self.dynamodb.batch_get_item(RequestItems=request)["Responses"].get(self.table, [])
            ended.update(item["pk"]["S"].removeprefix("WF#") for item in items if item["status"]["S"] in TERMINAL)
        return ended

    # -------------------------------------------------------------- the state the ceiling starts from

    def resources(self, resource_type: str) -> list[str]:
        """Physical ids of the stack's active resources of one type."""
        return [
            self.stack.physical_ids[logical_id]
            for logical_id, rtype, _condition, active in self.stack.stack.template_resources()
            if active and rtype == resource_type and logical_id in self.stack.physical_ids
        ]

    def table_keys(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every item key of every table: table → (key as JSON → key)."""
        keys: dict[str, dict[str, dict[str, Any]]] = {}
        for table in self.resources("AWS::DynamoDB::Table"):
            names = [k["AttributeName"] for k in self.dynamodb.describe_table(TableName=table)["Table"]["KeySchema"]]
            projection: dict[str, Any] = {
                "ProjectionExpression": ", ".join(f"#k{i}" for i in range(len(names))),
                "ExpressionAttributeNames": {f"#k{i}": name for i, name in enumerate(names)},
            }
            keys[table] = {}
            for page in self.dynamodb.get_paginator("scan").paginate(TableName=table, **projection):
                for item in page["Items"]:
                    keys[table][json.dumps(item, sort_keys=True)] = item
        return keys

    def restore(self, before: dict[str, dict[str, dict[str, Any]]]) -> int:
        """Delete the items written since ``before`` was read and purge the queues; return the items deleted."""
        deleted = 0
        for table, now in self.table_keys().items():
            new = [key for text, key in now.items() if text not in before.get(table, {})]
            for offset in range(0, len(new), 25):
                chunk = [{"DeleteRequest": {"Key": key}} for key in new[offset : offset + 25]]
                self.dynamodb.batch_write_item(RequestItems={table: chunk})
            deleted += len(new)
        for queue_url in self.resources("AWS::SQS::Queue"):
            self.sqs.purge_queue(QueueUrl=queue_url)
        return deleted


def _stop_event_sources(stack: LocalStack) -> None:
    for poller in stack.pollers:
        poller.stop()
    for schedules in stack.schedules.values():
        for schedule in schedules:
            schedule.stop()


MAIN_PROCESS: Final = "main process (moto, event sources, HTTP API, sample services)"


def _owners(stack: LocalStack) -> dict[int, str]:
    """Process id → what runs in it: a function's logical id, or the main process."""
    owners = {os.getpid(): MAIN_PROCESS}
    for logical_id, pool in stack.pools.items():
        owners.update(dict.fromkeys(pool.worker_pids(), logical_id))
    return owners


def _worker_cpu(calls: Sequence[Call], since: float, owners: dict[int, str]) -> defaultdict[str, float]:
    """CPU seconds of each function's workers from ``since`` to their last call, read from the call lines."""
    baseline: dict[int, float] = {}
    last: dict[int, float] = {}
    for call in calls:  # one worker makes one call at a time, so its calls come in the order they ended
        if call.ended < since:
            baseline[call.pid] = call.cpu
        else:
            baseline.setdefault(call.pid, call.cpu)
            last[call.pid] = call.cpu
    cpu: defaultdict[str, float] = defaultdict(float)
    for pid, value in last.items():
        if owners.get(pid, MAIN_PROCESS) != MAIN_PROCESS:
            cpu[owners[pid]] += value - baseline[pid]
    return cpu


@contextlib.contextmanager
def _server_errors_to(path: Path) -> Iterator[None]:
    """Send the moto server's request errors (werkzeug, e.g. a 500 that botocore retries) to a file."""
    import logging

    handler = logging.FileHandler(path)
    werkzeug = logging.getLogger("werkzeug")
    propagate = werkzeug.propagate
    werkzeug.addHandler(handler)
    werkzeug.propagate = False
    try:
        yield
    finally:
        werkzeug.removeHandler(handler)
        werkzeug.propagate = propagate
        handler.close()


def measure_throughput(
    workflows: int = 60,
    *,
    warmup_workflows: int = 12,
    time_limit_seconds: float = 300.0,
    log_dir: Path | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """Measure steps/s on the local stack and the ceiling of the same DynamoDB and SQS calls back to back.

    Parameters
    ----------
    workflows
        3-step trip bookings in the measured run.
    warmup_workflows
        Trip bookings run first and discarded (cold starts, the second execution environment of each function).
    time_limit_seconds
        Longest wait for each batch of workflows to end (seconds).
    log_dir
        Per-function logs and the moto server's errors (default ``.devstack/bench/logs``).

    Returns
    -------
    tuple
        The rows (steps/s against the ceiling, with the ratio and target >= 0.5; requests per step) and the raw
        figures: ``steps``, ``elapsed_seconds``, ``steps_per_second``, ``calls`` (``service:Operation`` → count,
        idle receives left out), ``calls_per_step``, ``calls_by_function``, ``seconds_in_calls_by_function`` and
        ``seconds_in_calls_by_operation`` (time the clients waited on AWS), ``cpu_seconds`` (by process kind, during
        the run), ``idle_receives``, ``product_errors``, ``product_retries``, ``ceiling_seconds``,
        ``ceiling_steps_per_second``, ``replay`` (what `replay` returned, plus ``server_cpu_seconds``: the main
        process's CPU meanwhile, which is moto's), ``ratio``, ``phase_seconds``.

    Raises
    ------
    RuntimeError
        A start failed, a workflow did not end in time, or a workflow did not complete.
    """
    from devstack.demo import ROOT, demo_definition, sample_services_importable
    from devstack.lambda_runtime import INIT_HOOK_VARIABLE
    from devstack.load import read_final_state
    from devstack.stack import LocalStack

    sample_services_importable()
    from http_server import serve_all

    phases: dict[str, float] = {}
    clock = time.monotonic()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[name] = now - clock
        clock = now

    log_dir = log_dir or ROOT / ".devstack" / "bench" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob("*.log"):  # the previous run's; the workers append to theirs
        old.unlink()
    definition = demo_definition(timeout_seconds=60)
    calls_dir = Path(tempfile.mkdtemp(prefix="sasflow-bench-calls-"))
    label = uuid.uuid4().hex[:8]
    servers = serve_all()  # no faults, no latency
    try:
        parameters = {
            **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
            "LogLevel": "WARN",
        }
        extra_env = {INIT_HOOK_VARIABLE: WORKER_HOOK, CALLS_DIR_VARIABLE: str(calls_dir)}
        stack = LocalStack(parameters=parameters, extra_env=extra_env, log_dir=log_dir)
        with _server_errors_to(log_dir / "moto-errors.log"), record_calls(calls_dir), stack:
            for pool in stack.pools.values():  # every execution environment imports its handler before the run
                pool.start(prewarm=pool.max_workers)
            driver = WorkflowDriver(stack, definition)
            phase("start the local stack")
            if warmup_workflows:
                driver.run(warmup_workflows, f"{label}-warmup", time_limit_seconds)
                time.sleep(SETTLE_SECONDS)
            before = driver.table_keys()
            phase("warm-up")
            main_cpu = sum(os.times()[:2])
            workflow_ids, first_start, last_terminal = driver.run(workflows, label, time_limit_seconds)
            main_cpu = sum(os.times()[:2]) - main_cpu
            time.sleep(SETTLE_SECONDS)
            _stop_event_sources(stack)
            until = time.time()
            phase("measured run")
            final = read_final_state(driver.dynamodb, driver.table)
            owners = _owners(stack)
            every_call = read_calls(calls_dir)
            invocations = read_invocations(calls_dir)
            calls = [call for call in every_call if first_start <= call.order <= until]
            working = [call for call in calls if call.service in REPLAYED_SERVICES and not call.idle]
            driver.restore(before)
            phase("restore the tables")
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as executor:
                executor.submit(time.sleep, 0).result()  # the replay process is up before the main CPU is read
                server_cpu = sum(os.times()[:2])
                replayed = executor.submit(replay, working, endpoint_url=stack.endpoint_url, region=stack.region)
                replay_result = replayed.result()
                replay_result["server_cpu_seconds"] = sum(os.times()[:2]) - server_cpu
            phase("replay (the ceiling)")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(calls_dir, ignore_errors=True)
    phase("stop")

    not_completed = [wid for wid in workflow_ids if wid not in final or final[wid].status != "COMPLETED"]
    if not_completed:
        raise RuntimeError(f"{len(not_completed)} workflow(s) did not complete: {not_completed[:5]}")
    steps = sum(1 for wid in workflow_ids for step in final[wid].steps.values() if step.status == "COMPLETED")
    elapsed = last_terminal - first_start
    ours = steps / elapsed
    ceiling = steps / replay_result["seconds"]

    by_operation = Counter(call.key for call in working)
    by_function: dict[str, Counter[str]] = defaultdict(Counter)
    waited: defaultdict[str, float] = defaultdict(float)
    waited_by_operation: defaultdict[str, float] = defaultdict(float)
    for call in working:
        owner = owners.get(call.pid, "replaced worker")
        by_function[owner][call.key] += 1
        waited[owner] += call.seconds
        waited_by_operation[call.key] += call.seconds
    measured = [i for i in invocations if first_start <= i["started"] <= until]
    latency = per_step_latency(calls, measured, owners)
    windows = batching_windows(parameters)
    cpu = _worker_cpu(every_call, first_start, owners)
    cpu[MAIN_PROCESS] = main_cpu
    raw: dict[str, Any] = {
        "workflows": workflows,
        "warmup_workflows": warmup_workflows,
        "steps": steps,
        "elapsed_seconds": elapsed,
        "steps_per_second": ours,
        "calls": dict(sorted(by_operation.items())),
        "calls_total": len(working),
        "calls_per_step": {key: n / steps for key, n in sorted(by_operation.items())},
        "calls_by_function": {owner: dict(sorted(c.items())) for owner, c in sorted(by_function.items())},
        "seconds_in_calls_by_function": dict(sorted(waited.items())),
        "seconds_in_calls_by_operation": dict(sorted(waited_by_operation.items())),
        "cpu_seconds": dict(sorted(cpu.items())),
        "idle_receives": sum(1 for call in calls if call.idle),
        "other_calls": dict(Counter(call.key for call in calls if call.service not in REPLAYED_SERVICES)),
        "product_errors": dict(Counter(f"{call.key}:{call.error}" for call in working if call.error)),
        "product_retries": sum(call.retries for call in working),
        "ceiling_seconds": replay_result["seconds"],
        "ceiling_steps_per_second": ceiling,
        "replay": replay_result,
        "ratio": ours / ceiling,
        "phase_seconds": phases,
        "latency": latency,
        "batching_windows": windows,
    }
    rows = [
        Row.compare(
            f"steps/s on the local stack ({workflows} warm 3-step workflows) vs ceiling steps/s "
            "(the same DynamoDB + SQS calls back to back)",
            ours,
            ceiling,
            at_least=TARGET_RATIO,
        ),
        Row("DynamoDB + SQS requests per step on the local stack", len(working) / steps),
        *latency_rows(latency, windows),
    ]
    return rows, raw


# ------------------------------------------------------------------------------------------------ per-step latency


def read_invocations(directory: Path) -> list[dict[str, Any]]:
    """The invocation starts the workers recorded (`_record_invocations`), each with its ``pid``."""
    found = []
    for path in sorted(Path(directory).glob("invocations-*.jsonl")):
        pid = int(path.stem.removeprefix("invocations-"))
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                found.append({**json.loads(line), "pid": pid})
    return found


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank (the value a ``q`` share of samples is at or below)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = math.ceil(round(q * len(ordered), 9))
    return ordered[max(0, min(len(ordered) - 1, rank - 1))]


def per_step_latency(
    calls: Sequence[Call], invocations: Sequence[dict[str, Any]], owners: dict[int, str]
) -> dict[str, Any]:
    """Per-step overhead measured from the run's own timestamps (epoch seconds, one machine's clock).

    - **reply -> next request** (the scheduler): from the end of the event source mapping's ``ReceiveMessage`` that
      returned an agent's reply to the end of the ``SendMessage(Batch)`` that sent the same workflow's next step
      request. The same calls back to back: the scheduler's own AWS calls in that time (from its invocation's start
      to that send), their durations summed.
    - **request -> agent start**: from the end of the send of a step request to the start of the agent's handler
      invocation whose records hold that message (the worker records it before the handler runs). The same calls
      back to back: the part of the mapping's ``ReceiveMessage`` that returned the message after it was sent.

    Returns ``reply_to_next_request`` and ``request_to_agent_start``, each with ``samples``, ``p50``, ``p95`` and
    ``calls_p50``, ``calls_p95`` (seconds).
    """
    sent: dict[str, tuple[float, str]] = {}
    received: dict[str, Call] = {}
    for call in calls:
        for message_id, key in call.messages or []:
            if call.operation == "ReceiveMessage":
                if owners.get(call.pid) == MAIN_PROCESS and message_id not in received:
                    received[message_id] = call
            elif message_id not in sent:
                sent[message_id] = (call.ended, key)
    started: dict[str, dict[str, Any]] = {}
    for each in sorted(invocations, key=lambda i: i["started"]):
        for message_id in each.get("message_ids") or []:
            started.setdefault(message_id, each)
    requests_by_workflow: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
    for message_id, (at, key) in sent.items():
        if key.endswith("/step.request"):
            requests_by_workflow[key.split("/", 1)[0]].append((at, message_id))
    for requests in requests_by_workflow.values():
        requests.sort()
    by_pid: defaultdict[int, list[Call]] = defaultdict(list)
    for call in calls:
        by_pid[call.pid].append(call)

    to_agent: list[float] = []
    to_agent_calls: list[float] = []
    to_next: list[float] = []
    to_next_calls: list[float] = []
    for message_id, (at, key) in sent.items():
        found = started.get(message_id)
        receive = received.get(message_id)
        if found is None or receive is None:
            continue
        invocation: dict[str, Any] = found
        if key.endswith("/step.request"):
            to_agent.append(invocation["started"] - at)
            to_agent_calls.append(max(0.0, receive.ended - max(receive.started, at)))
            continue
        if not key.endswith("/step.reply"):
            continue
        workflow, step = key.split("/")[:2]
        later = [(t, mid) for t, mid in requests_by_workflow.get(workflow, []) if t > receive.ended]
        if not later or sent[later[0][1]][1].split("/")[1] == step:
            continue  # the last step's reply (the workflow completes) or a resend of the same step
        next_sent = later[0][0]
        to_next.append(next_sent - receive.ended)
        own = [c for c in by_pid[invocation["pid"]] if invocation["started"] <= c.started and c.ended <= next_sent]
        to_next_calls.append(sum(c.seconds for c in own))

    def summary(values: list[float], same_calls: list[float]) -> dict[str, Any]:
        return {
            "samples": len(values),
            "p50": percentile(values, 0.50),
            "p95": percentile(values, 0.95),
            "calls_p50": percentile(same_calls, 0.50),
            "calls_p95": percentile(same_calls, 0.95),
        }

    return {
        "reply_to_next_request": summary(to_next, to_next_calls),
        "request_to_agent_start": summary(to_agent, to_agent_calls),
    }


def batching_windows(parameters: dict[str, str]) -> dict[str, float]:
    """``MaximumBatchingWindowInSeconds`` of the engine's and the agents' SQS event source mappings of template.yaml,
    by function (seconds), with the template's parameters resolved (its defaults, overridden by ``parameters``). A
    trigger's is left out: a workflow's steps never pass through it (``bench.scenarios.workflow_consumers``)."""
    from bench.scenarios import workflow_consumers
    from devstack.demo import ROOT
    from devstack.template import Stack

    stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
    return {logical_id: event.batching_window_seconds for logical_id, event in workflow_consumers(stack.functions())}


def latency_rows(latency: dict[str, Any], windows: dict[str, float]) -> list[Row]:
    """The two latency rows: p50 / p95 against the configured windows and the same calls back to back."""
    scheduler_window = windows.get("SchedulerFunction", float("nan"))
    agent_windows = sorted({w for fn, w in windows.items() if fn != "SchedulerFunction"})
    agents = "/".join(f"{w:g}" for w in agent_windows) or "?"
    rows = []
    for key, title, window in (
        ("reply_to_next_request", "reply received -> next request sent (scheduler)", f"{scheduler_window:g} s"),
        ("request_to_agent_start", "request sent -> agent start", f"{agents} s"),
    ):
        figures = latency[key]
        rows.append(
            Row(
                f"per-step overhead on the local stack, {title}, p50 / p95 (s; {figures['samples']} steps; "
                f"anchor: the batching window; the same calls back to back)",
                f"{figures['p50']:.3f} / {figures['p95']:.3f}",
                f"window {window}; calls {figures['calls_p50']:.3f} / {figures['calls_p95']:.3f}",
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.throughput``: print the rows as markdown, the call mix per step, and the raw figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=main.__doc__)
    parser.add_argument("--workflows", type=int, default=60, help="3-step workflows in the measured run")
    parser.add_argument("--warmup", type=int, default=12, help="workflows run first and discarded")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON too")
    args = parser.parse_args(argv)
    rows, raw = measure_throughput(args.workflows, warmup_workflows=args.warmup)
    print(markdown(rows))
    print()
    print(
        f"{raw['steps']} steps in {raw['elapsed_seconds']:.1f} s; the same {raw['calls_total']} DynamoDB + SQS calls "
        f"back to back in {raw['ceiling_seconds']:.1f} s ({raw['idle_receives']} idle receives not replayed); "
        f"{sum(raw['phase_seconds'].values()):.0f} s in all"
    )
    print("calls per step:", ", ".join(f"{key} {n:.2f}" for key, n in raw["calls_per_step"].items()))
    if args.json:
        print(json.dumps(raw, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

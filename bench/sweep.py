"""Sweep scaling (issue 4): what one supervisor sweep reads as the state table grows.

DESIGN Rule 3 says the sweep's cost grows with the number of overdue steps, not with the table. This measures it
offline, with the real code: the tables are created from template.yaml inside ``moto.mock_aws``, the state table
is filled with N finished steps and a few overdue ones, and one sweep of the real ``SupervisorService`` (built by
``sasflow.bootstrap.build_engine`` from the SupervisorFunction's environment) runs against it. A botocore event hook
on the DynamoDB client handed to the supervisor counts what every call read:

- on the deadline index: the items each Query read (``ScannedCount``; ``Count`` too) and the pages;
- everything else while handling the overdue entries (the GetItem that loads each workflow, and its definition once).

The figure that must stay flat is ``index items read / overdue``. The sweep is also checked: it must resend exactly
the overdue steps, each as attempt 2, or the run raises (a benchmark of a broken sweep would be worthless).

``python -m bench.sweep`` prints the rows.
"""

from __future__ import annotations

import base64
import json
import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.table import Table as MotoTable

from bench.report import Row, markdown
from devstack.inprocess import function_environment, offline_aws
from devstack.provision import provision
from devstack.template import Stack, remote_service_parameters
from sasflow.adapters.dynamodb_store import DEADLINE_INDEX, workflow_key
from sasflow.adapters.memory import InMemoryBus
from sasflow.bootstrap import EngineServices, build_engine
from sasflow.clock import ManualClock
from sasflow.definition import parse_definition
from sasflow.messages import StepReply, canonical_hash, decode_request
from sasflow.states import Outcome, WorkflowStatus
from simulation.run import START

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000, 10_000, 100_000)
#: The ratio must not grow with the table: at the largest size, index items read per overdue step <= this.
RATIO_TARGET = 1.05
_MOTO_ACCOUNT = "123456789012"  # moto's default account


@dataclass
class ReadCounter:
    """Counts what a DynamoDB client's calls read, from botocore's ``after-call`` events (only while ``armed``).

    Attributes
    ----------
    index_pages:
        Query calls on the deadline index (one per page).
    index_scanned, index_count:
        Sum of ``ScannedCount`` and of ``Count`` over those pages (items read, items returned).
    other_reads:
        Items read by every other call, by operation (base-table Query: ``ScannedCount``; GetItem: 0 or 1;
        BatchGetItem: the items returned).
    calls:
        Every call by operation (``Query@deadline-index`` for the index), including writes.
    """

    armed: bool = False
    index_pages: int = 0
    index_scanned: int = 0
    index_count: int = 0
    other_reads: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def install(self, client: Any) -> None:
        """Register the hooks on ``client`` (a boto3 DynamoDB client)."""
        client.meta.events.register("before-parameter-build.dynamodb.*", self._remember_index)
        client.meta.events.register("after-call.dynamodb.*", self._count)

    @staticmethod
    def _remember_index(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        # after-call does not see the request parameters, but it gets the same per-request context dict.
        context["bench_index"] = params.get("IndexName")

    def _count(self, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if not self.armed:
            return
        operation = model.name
        index = context.get("bench_index")
        if operation == "Query" and index == DEADLINE_INDEX:
            self.calls[f"Query@{index}"] += 1
            self.index_pages += 1
            self.index_scanned += int(parsed.get("ScannedCount", 0))
            self.index_count += int(parsed.get("Count", 0))
            return
        self.calls[operation] += 1
        if operation in ("Query", "Scan"):
            self.other_reads[operation] += int(parsed.get("ScannedCount", 0))
        elif operation == "GetItem":
            self.other_reads[operation] += 1 if parsed.get("Item") else 0
        elif operation == "BatchGetItem":
            self.other_reads[operation] += sum(len(items) for items in parsed.get("Responses", {}).values())
        elif operation == "TransactGetItems":
            self.other_reads[operation] += len(parsed.get("Responses", []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "index_pages": self.index_pages,
            "index_items_read": self.index_scanned,
            "index_items_returned": self.index_count,
            "handling_items_read": sum(self.other_reads.values()),
            "handling_items_read_by_operation": dict(self.other_reads),
            "calls": dict(self.calls),
        }


@contextmanager
def _moto_item_order_by_strings() -> Iterator[None]:
    """Make moto's ``Table.all_items`` sort string keys as plain strings: the same order, much faster.

    moto (5.2) sorts every item of the table with ``DynamoType`` comparisons (Python, per comparison) at the start
    of every Query, before it even looks at the key condition. At 133,000 items that is about 11 s per Query on
    this 2-core machine, so one sweep (8 index pages + 10 workflow loads) took 196 s and the whole run 4.3 min.
    For a table whose keys are both strings (the state table: ``pk``, ``sk``) ``DynamoType`` compares ``str``
    values, so sorting by the plain strings gives exactly the same order. Nothing else changes: the key
    condition, ``ScannedCount``, ``Count`` and paging are still moto's own (the results do not depend on this
    order anyway: moto sorts the matching items again afterwards). Other tables keep moto's sort.
    """
    original = MotoTable.all_items

    def all_items(self: Any) -> list[Any]:
        if self.hash_key_type != "S" or self.range_key_type != "S":
            return original(self)
        items = [item for by_range in self.items.values() for item in by_range.values()]
        return sorted(items, key=lambda item: (item.hash_key.value, item.range_key.value))

    MotoTable.all_items = all_items  # type: ignore[method-assign]
    try:
        yield
    finally:
        MotoTable.all_items = original  # type: ignore[method-assign]


def _trip_request() -> dict[str, Any]:
    request: dict[str, Any] = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    return request


def _engine(stack: Stack, logical_id: str, clock: ManualClock, bus: InMemoryBus, client: Any) -> EngineServices:
    spec = next(spec for spec in stack.functions() if spec.logical_id == logical_id)
    return build_engine(function_environment(spec), clock=clock, bus=bus, dynamodb=client, rng=random.Random(7))


#: The principal the bench's workflows belong to (as the API would record the caller).
BENCH_PRINCIPAL = "arn:aws:iam::123456789012:user/bench"


def _start(engine: EngineServices, body: dict[str, Any]) -> str:
    """Start the sample trip the way the API does, and send its first request."""
    result = engine.scheduler.start_workflow(
        parse_definition(body["definition"]), body["input"], request_hash=canonical_hash(body), owner=BENCH_PRINCIPAL
    )
    engine.bus.send(result.messages)
    return result.workflow.workflow_id


def _finished_workflow(engine: EngineServices, bus: InMemoryBus, body: dict[str, Any]) -> str:
    """Drive one trip to COMPLETED through the real scheduler; each request gets the reply its agent would send.

    The agents themselves are not run (the state table is what is measured, and only the scheduler writes it); the
    reply's output has the shape the sample services return.
    """
    workflow_id = _start(engine, body)
    for _ in range(10):
        messages = [m for url in list(bus.queues) for m in bus.drain(url)]
        if not messages:
            break
        for message in messages:
            request = decode_request(message.body)
            output = {
                "service": request.agent,
                "action": request.action,
                "confirmation": f"{request.agent[:2].upper()}-{uuid.uuid5(uuid.NAMESPACE_URL, request.token).hex[:8]}",
                "token": request.token,
                "replayed": False,
            }
            reply = StepReply(
                workflow_id=request.workflow_id,
                step=request.step,
                phase=request.phase,
                attempt=request.attempt,
                outcome=Outcome.SUCCEEDED,
                output=output,
                calls=1,
            )
            bus.send(engine.scheduler.on_reply(reply))
    snapshot = engine.store.load(workflow_id)
    if snapshot is None or snapshot.workflow.status is not WorkflowStatus.COMPLETED:
        raise RuntimeError(f"template workflow did not complete: {snapshot}")
    return workflow_id


def _workflow_item(client: Any, table: str, workflow_id: str) -> dict[str, Any]:
    item: dict[str, Any] = client.get_item(TableName=table, Key=workflow_key(workflow_id), ConsistentRead=True)["Item"]
    return item


def _cloned(value: Any, old: str, new: str) -> Any:
    """An attribute value as botocore parsed it, with ``old`` replaced by ``new`` in its strings, in moto's form.

    moto's backend keeps the JSON wire form, where binary values are base64 text; botocore hands them back as bytes.
    """
    if not isinstance(value, dict):
        return value
    (kind, inner), *_ = value.items()
    if kind == "S":
        return {"S": inner.replace(old, new)}
    if kind == "SS":
        return {"SS": [v.replace(old, new) for v in inner]}
    if kind == "B":
        return {"B": base64.b64encode(bytes(inner)).decode()}
    if kind == "BS":
        return {"BS": [base64.b64encode(bytes(v)).decode() for v in inner]}
    if kind == "M":
        return {"M": {k: _cloned(v, old, new) for k, v in inner.items()}}
    if kind == "L":
        return {"L": [_cloned(v, old, new) for v in inner]}
    return value


def _fill(table: Any, template: dict[str, Any], template_id: str, steps: int, rng: random.Random) -> int:
    """Clone the finished template workflow under new ids until the table holds ``steps`` finished steps.

    The template itself counts; the last clone keeps only as many of its steps as are still needed, so the count is
    exact (it is a finished workflow either way, outside the deadline index). Returns the items written.

    The clones are written into moto's backend table directly (``Table.put_item``, which still validates keys and
    types) instead of through boto3 ``batch_write_item``: measured on this 2-core machine, boto3 loads about 1,500
    items/s in process, the backend about 5,400 items/s.
    """
    template_steps = template["steps"]["M"]
    per_workflow = len(template_steps)
    remaining = steps - per_workflow
    written = 0
    for _ in range(math.ceil(max(0, remaining) / per_workflow)):
        new_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        take = min(per_workflow, remaining)
        item = {**template, "steps": {"M": dict(list(template_steps.items())[:take])}}
        table.put_item({name: _cloned(value, template_id, new_id) for name, value in item.items()})
        written += 1
        remaining -= take
    return written


def _measure_one(steps: int, overdue: int) -> dict[str, Any]:
    timings: dict[str, float] = {}
    began = time.perf_counter()
    agents = ("flights", "hotels", "payments")
    parameters = remote_service_parameters({agent: f"https://{agent}.bench.invalid" for agent in agents})
    stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
    physical = provision(stack, secret_values={"WorkflowIdSecret": "bench-workflow-id-key"})
    table_name = physical["StateTable"]
    timings["provision_seconds"] = time.perf_counter() - began

    # Produce the items through the real scheduler while the table is small (moto's queries scan the whole table).
    began = time.perf_counter()
    clock = ManualClock(START)
    loader_client = boto3.client("dynamodb")
    loader_bus = InMemoryBus()
    loader = _engine(stack, "SchedulerFunction", clock, loader_bus, loader_client)
    body = _trip_request()
    template_id = _finished_workflow(loader, loader_bus, body)
    template = _workflow_item(loader_client, table_name, template_id)
    # The overdue steps: first requests dispatched (write-ahead PROCESSING, complete_by set) and never answered.
    stuck = {_start(loader, body) for _ in range(overdue)}
    first_step = body["definition"]["steps"][0]
    timings["produce_seconds"] = time.perf_counter() - began

    began = time.perf_counter()
    backend_table = dynamodb_backends[_MOTO_ACCOUNT]["us-east-1"].get_table(table_name)
    written = _fill(backend_table, template, template_id, steps, random.Random(steps))
    timings["fill_seconds"] = time.perf_counter() - began

    # What the index holds: the stuck workflows only (finished ones are not in it).
    index_entries = loader_client.scan(TableName=table_name, IndexName=DEADLINE_INDEX, Select="COUNT")["Count"]

    # Past complete_by + grace of the stuck steps.
    sweep_client = boto3.client("dynamodb")
    counter = ReadCounter()
    counter.install(sweep_client)
    sweep_bus = InMemoryBus()
    supervisor = _engine(stack, "SupervisorFunction", clock, sweep_bus, sweep_client)
    clock.advance(first_step["timeout_seconds"] + supervisor.config.deadline_grace_seconds + 1)

    began = time.perf_counter()
    counter.armed = True
    report = supervisor.supervisor.sweep(owner="bench")
    counter.armed = False
    timings["sweep_seconds"] = time.perf_counter() - began

    sent = [decode_request(m.body) for queue in sweep_bus.queues.values() for m in queue]
    resent = sorted((r.workflow_id, r.step, r.attempt) for r in sent)
    expected = sorted((workflow_id, first_step["name"], 2) for workflow_id in stuck)
    # Only the resends are checked here: extra entries read from the index must show in the ratio, not abort it.
    if resent != expected or report.errors or not report.complete:
        raise RuntimeError(
            f"the sweep did not resend exactly the {overdue} overdue steps: report={report}, resent={resent}"
        )
    return {
        "finished_steps": steps,
        "overdue": overdue,
        "items_in_table": 1 + written + overdue + 1,  # the template, the clones, the stuck ones, the definition
        "index_entries": index_entries,
        "shards": supervisor.config.deadline_shards,
        "messages": len(sent),
        "sweep_report": {"overdue": report.overdue, "messages": report.messages, "pages": report.pages},
        **counter.as_dict(),
        **{k: round(v, 3) for k, v in timings.items()},
    }


def measure_sweep(sizes: Sequence[int] = SIZES, overdue: int = 10) -> tuple[list[Row], dict[str, Any]]:
    """Measure what one supervisor sweep reads with ``sizes`` finished steps and ``overdue`` overdue ones.

    Each size gets a fresh moto account, tables from template.yaml, one finished trip made by the real scheduler and
    cloned to ``size`` finished steps, and ``overdue`` trips whose first step is PROCESSING past complete-by + grace.

    Parameters
    ----------
    sizes:
        Finished steps in the state table, one measurement each (the target is checked at the largest). The one
        trip made by the scheduler is always there, so a size below its 3 steps still holds 3.
    overdue:
        Overdue steps (one per workflow) in the table at each size.

    Returns
    -------
    tuple[list[Row], dict[str, Any]]
        One row per size (deadline-index items read per sweep, / overdue), one row with the items read while
        handling the overdue steps at the largest size (per overdue step, no target), and the raw counts and
        timings (seconds) per size for the JSON results file.

    Raises
    ------
    ValueError
        When ``overdue`` is below 1.
    RuntimeError
        When the trip did not complete, or the sweep did not resend exactly the overdue steps (each as attempt 2).
    """
    if overdue < 1:
        raise ValueError("overdue must be at least 1: the ratio divides by it")
    began = time.perf_counter()
    per_size: dict[str, Any] = {}
    rows: list[Row] = []
    largest = max(sizes)
    for size in sizes:
        with offline_aws(), _moto_item_order_by_strings():
            result = _measure_one(size, overdue)
        per_size[str(size)] = result
        metric = f"sweep, {size:,} finished + {overdue} overdue steps: deadline-index items read / overdue"
        at_most = RATIO_TARGET if size == largest else None
        rows.append(Row.compare(metric, result["index_items_read"], overdue, at_most=at_most))
    top = per_size[str(largest)]
    rows.append(
        Row.compare(
            f"sweep, {largest:,} finished + {overdue} overdue steps: items read handling them / overdue",
            top["handling_items_read"],
            overdue,
        )
    )
    raw = {"sizes": per_size, "overdue": overdue, "target": RATIO_TARGET, "seconds": time.perf_counter() - began}
    return rows, raw


def main() -> None:
    """Print the rows (markdown), then per size the pages, items read and seconds taken."""
    rows, raw = measure_sweep()
    print(markdown(rows))
    for size, counts in raw["sizes"].items():
        print(
            f"{int(size):>7,} finished steps, {counts['items_in_table']:,} items,"
            f" {counts['index_entries']} in the index: {counts['index_pages']} index pages,"
            f" {counts['index_items_read']} index items read, {counts['handling_items_read']} read handling them;"
            f" fill {counts['fill_seconds']:.1f} s, sweep {counts['sweep_seconds']:.1f} s"
        )
    print(f"took {raw['seconds']:.0f} s")


if __name__ == "__main__":
    main()

"""``make map``: one workflow whose map step runs a child workflow per item on the local stack, then checks it.

The run: the sample services on loopback without faults, the local stack from template.yaml, and one workflow
started over the signed HTTP API: reserve a flight, then a map step over ``input.orders`` (one child workflow per
order, each charging it with the payments service), then book a hotel. It waits for the workflow to end and reads
the stack's own records to check:

* the workflow COMPLETED, its map step counted every child (``total == succeeded == items``) and holds a result for
  each (``results``, read from the payload bucket when claim-checked);
* every child is a workflow of its own, COMPLETED, with no supervisor resend (0 resends: no report was lost) and
  each charge applied once in the payments ledger (0 lost, 0 done twice);
* no child is orphaned: the children found are exactly ``<workflow id>:1:0 .. <workflow id>:1:<items-1>``;
* the parent stays one item under DynamoDB's 400 KB (its size is printed).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from random import Random
from typing import Any

import urllib3
from rich.console import Console
from rich.table import Table

from devstack.client import SignedHttp
from devstack.demo import sample_services_importable
from devstack.template import remote_service_parameters
from sasflow.adapters.dynamodb_store import DynamoDBStateStore, item_size, workflow_item
from sasflow.claim_check import REFERENCE_KEY, is_reference
from sasflow.fanout import child_id

CHILD = {
    "name": "charge-order",
    "steps": [
        {
            "name": "charge",
            "agent": "payments",
            "action": "charge",
            "input": {"amount.$": "input.item", "currency": "EUR"},
            "timeout_seconds": 120,
            "compensation": {"action": "refund", "input": {"amount.$": "input.item"}},
        }
    ],
}


def map_definition(concurrency: int) -> dict[str, Any]:
    """Reserve a flight, charge every order (a map step of ``concurrency``), book the hotel."""
    return {
        "name": "charge-every-order",
        "steps": [
            {"name": "reserve_flight", "agent": "flights", "action": "reserve",
             "input": {"traveller.$": "input.traveller"}, "compensation": {"action": "cancel_reservation"}},
            {"name": "charge_orders", "type": "map", "items": "input.orders", "definition": CHILD,
             "max_concurrency": concurrency, "timeout_seconds": 600},
            {"name": "book_hotel", "agent": "hotels", "action": "book", "input": {"traveller.$": "input.traveller"},
             "compensation": {"action": "cancel_booking"}},
        ],
    }  # fmt: skip


@dataclass
class MapRunResult:
    """What ``run_map`` measured and found (``problems`` empty: every check passed)."""

    items: int
    concurrency: int
    workflow_id: str = ""
    status: str = ""
    seconds: float = 0.0
    children: int = 0
    children_completed: int = 0
    resends: int = 0
    charges: int = 0
    parent_bytes: int = 0
    results: int = 0
    claim_checked: bool = False
    problems: list[str] = field(default_factory=list)


def run_map(items: int, concurrency: int, time_limit: float, console: Console) -> MapRunResult:
    """Run one map workflow of ``items`` children on a fresh local stack, then check it (see the module)."""
    from devstack.stack import LocalStack

    sample_services_importable()
    from http_server import serve
    from travel_services import SERVICES, FaultKnobs, InMemoryLedger, SystemClock, TravelService

    result = MapRunResult(items=items, concurrency=concurrency)
    ledgers = {name: InMemoryLedger() for name in SERVICES}
    knobs = FaultKnobs(latency_ms=0, transient_error_rate=0.0)
    services = {name: TravelService(name, ledgers[name], knobs, Random(name), SystemClock()) for name in SERVICES}
    servers = {name: serve(service) for name, service in services.items()}
    try:
        parameters = {**remote_service_parameters({n: s.base_url for n, s in servers.items()}), "LogLevel": "WARN"}
        with LocalStack(parameters=parameters) as stack:
            http = SignedHttp(stack.api_url, pool=urllib3.PoolManager(maxsize=2, retries=False))
            body = {
                "definition": map_definition(concurrency),
                "input": {"traveller": "map-run", "orders": [100 + i for i in range(items)]},
            }
            began = time.monotonic()
            response = http.request(
                "POST", "/workflows", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            if response.status != 201:
                result.problems.append(f"start answered {response.status}: {response.data[:300]!r}")
                return result
            result.workflow_id = json.loads(response.data)["workflow_id"]
            console.print(f"started {result.workflow_id}: a map of {items} items, {concurrency} at once")
            store = DynamoDBStateStore(stack.physical_ids["StateTable"], stack.client("dynamodb"))
            last = ""
            while time.monotonic() - began < time_limit:
                snapshot = store.load(result.workflow_id)
                assert snapshot is not None  # nosec B101 # it was just started
                record = snapshot.steps.get("charge_orders")
                progress = record.map if record is not None else None
                line = f"{snapshot.workflow.status.value}, children ended {progress.reported if progress else 0}"
                if line != last:
                    console.print(f"  {time.monotonic() - began:6.1f} s  {line}")
                    last = line
                if snapshot.workflow.status.value in ("COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"):
                    break
                time.sleep(5.0)  # polling a real local stack on the wall clock, not a test's time
            result.seconds = time.monotonic() - began
            _check(result, store, services["payments"], _payloads(stack))
    finally:
        for server in servers.values():
            server.stop()
    return result


def _payloads(stack: Any) -> Any:
    """A reader of claim-checked payloads of the local stack's bucket (moto's S3): reference -> value."""
    s3, bucket = stack.client("s3"), stack.physical_ids["PayloadBucket"]

    def read(value: Any) -> Any:
        if not is_reference(value):
            return value
        body = s3.get_object(Bucket=bucket, Key=value[REFERENCE_KEY]["key"])["Body"].read()
        return json.loads(body)

    return read


def _check(result: MapRunResult, store: DynamoDBStateStore, payments: Any, payloads: Any) -> None:
    snapshot = store.load(result.workflow_id)
    assert snapshot is not None  # nosec B101 # it was started
    result.status = snapshot.workflow.status.value
    result.parent_bytes = item_size(workflow_item(snapshot, version=snapshot.version, shards=store.shards))
    if result.status != "COMPLETED":
        result.problems.append(f"the workflow is {result.status}: {snapshot.workflow.reason}")
    record = snapshot.steps["charge_orders"]
    result.resends = record.resends
    result.claim_checked = is_reference(record.output)
    output = payloads(record.output) or {}  # 10,000 results are over the claim-check threshold: in S3
    result.results = sum(1 for r in output.get("results") or [] if r is not None)
    if (output.get("total"), output.get("succeeded")) != (result.items, result.items):
        result.problems.append(f"the map step counted {output.get('total')} / {output.get('succeeded')}")
    ids = [child_id(result.workflow_id, 1, i) for i in range(result.items)]
    children = store.load_many(ids)
    result.children = len(children)
    result.children_completed = sum(1 for c in children.values() if c.workflow.status.value == "COMPLETED")
    result.resends += sum(r.resends for c in children.values() for r in c.steps.values())
    orphans = [w for w in store.load_many([child_id(result.workflow_id, 1, result.items)])]
    if result.children != result.items or result.children_completed != result.items or orphans:
        result.problems.append(
            f"{result.children} children found, {result.children_completed} COMPLETED, orphans {orphans[:3]}"
        )
    if result.resends:
        result.problems.append(f"{result.resends} supervisor resends (a lost message)")
    if result.parent_bytes >= 400_000:
        result.problems.append(f"the parent item is {result.parent_bytes} bytes")
    effects = payments.effects()
    result.charges = len(effects)
    twice = sorted(token for token, count in effects.items() if count > 1)
    if result.charges != result.items or twice:
        result.problems.append(f"{result.charges} charges applied for {result.items} orders; twice: {twice[:3]}")


def render(result: MapRunResult, console: Console) -> None:
    """Print the figures as a table, and each problem."""
    table = Table(title=f"map of {result.items} items on the local stack")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in (
        ("workflow", result.workflow_id),
        ("status", result.status),
        ("max_concurrency", f"{result.concurrency:,}"),
        ("wall seconds", f"{result.seconds:,.1f}"),
        ("children per second", f"{result.items / result.seconds:,.1f}" if result.seconds else "-"),
        ("children found / COMPLETED", f"{result.children:,} / {result.children_completed:,}"),
        ("results collected", f"{result.results:,}" + (" (claim-checked in S3)" if result.claim_checked else "")),
        ("supervisor resends (parent and children)", f"{result.resends:,}"),
        ("parent item bytes", f"{result.parent_bytes:,}"),
    ):
        table.add_row(name, value)
    console.print(table)
    for problem in result.problems:
        console.print(f"[red]problem:[/] {problem}", markup=True, highlight=False)

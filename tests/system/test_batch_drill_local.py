"""System tier: the fleet drill of docs/batches.md on the local stack (template.yaml over HTTP, each function in its
role). An outage of payments holds every trip that reaches its charge (``on_failure: hold``); once the outage ends,
one batch retries them all: its dry run counts them, its runner is killed midway (SQS gives the run to a new
execution environment once the message's visibility timeout ends), and still each trip is acted on once, charged once
and COMPLETED.

The number of trips is ``SASFLOW_BATCH_DRILL_WORKFLOWS``: 100 in ``make test``, 500 (the issue's drill) in ``make
batch-drill``. Time is real here; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
TRIPS = int(os.environ.get("SASFLOW_BATCH_DRILL_WORKFLOWS", "100"))
#: The batch's rate: its run takes about 20 s, so it is still at work when the test kills it.
RATE = max(1, min(25, TRIPS // 20))
#: The messages' visibility timeout on the local stack (the template's 540 s for the batch queue would make the
#: drill wait nine minutes for the killed run's message); longer than a run (30 s at most).
VISIBILITY_SECONDS = 45
#: The charge's complete-by (seconds after its dispatch).
CHARGE_SECONDS = 120


@dataclass
class Drill:
    stack: LocalStack
    servers: dict[str, RunningServer]
    client: SignedHttp
    operator: SignedHttp


@pytest.fixture(scope="module")
def drill() -> Iterator[Drill]:
    servers = serve_all(rng_seed=40)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
        # a run killed between a workflow's write and its dispatch's send leaves that dispatch to the supervisor:
        # found at complete-by + grace, resent
        "DeadlineGraceSeconds": "6",
        "MaxClockSkewSeconds": "0",
    }
    try:
        with LocalStack(
            parameters=parameters,
            schedule_interval_seconds=3.0,
            sqs_visibility_timeout_seconds=VISIBILITY_SECONDS,
            # every trip meets the outage itself: an open circuit would make the later ones wait instead of failing
            extra_env={"BREAKER_FAILURE_THRESHOLD": str(10 * TRIPS)},
        ) as stack:
            yield Drill(stack, servers, SignedHttp(stack.api_url), SignedHttp(stack.api_url, caller="operator"))
    finally:
        for server in servers.values():
            server.stop()


def trip(n: int) -> dict[str, Any]:
    """The tour's trip under the hold policy, its charge made once per attempt (no retry within the attempt).

    The flight's and the hotel's complete-by are far enough that the backlog of hundreds of starts on two cores
    times none out (a trial of 500 held some at those steps, TIMED_OUT, while their requests waited in the queues);
    the charge's is two minutes: long enough for the retries' backlog, short enough that a dispatch whose send the
    kill cut off is resent by the supervisor within the test."""
    body: dict[str, Any] = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    body["definition"]["on_failure"] = "hold"
    for step in body["definition"]["steps"]:
        step["timeout_seconds"] = 900
    [charge] = [step for step in body["definition"]["steps"] if step["name"] == "charge_card"]
    charge["retry"] = {"max_attempts": 1}
    charge["timeout_seconds"] = CHARGE_SECONDS
    body["input"]["traveller"] = f"drill traveller {n}"
    return body


def until(what: str, seconds: float, check: Callable[[], Any], shown: Callable[[], Any] | None = None) -> Any:
    """``check()`` once it is true, polled every 0.5 s for at most ``seconds``; else fail, with ``shown()``."""
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {seconds} s: {what}" + (f": {shown()}" if shown else ""))
        time.sleep(0.5)


def in_flight(operator: SignedHttp) -> dict[str, int]:
    """The listing's counts of the workflows in flight or waiting, by status (none of them: {})."""
    answer, page = operator.get("/ops/workflows?limit=1")
    assert answer == 200, page
    return {status: n for status, n in page["counts"].items() if n}


def held_by(operator: SignedHttp) -> dict[str, int]:
    """The HELD workflows by their steps' error codes (what a failed expectation prints)."""
    codes: dict[str, int] = {}
    cursor = ""
    while cursor is not None:
        answer, page = operator.get(
            "/ops/workflows?status=HELD&limit=200" + (f"&cursor={quote(cursor)}" if cursor else "")
        )
        assert answer == 200, page
        for summary in page["workflows"]:
            key = ",".join(summary.get("error_codes") or [])
            codes[key] = codes.get(key, 0) + 1
        cursor = page["next_cursor"]
    return codes


def charges(payments: Any) -> dict[str, int]:
    """Charges applied by payments, by workflow (its ledger)."""
    applied: dict[str, int] = {}
    for record in payments.history():
        if record.kind == "response" and record.effect and record.action == "charge":
            applied[record.workflow_id] = applied.get(record.workflow_id, 0) + 1
    return applied


def test_one_batch_retries_every_trip_an_outage_held_each_once_through_a_killed_runner(drill: Drill) -> None:
    payments = drill.servers["payments"].service
    operator = drill.operator
    # Given payments down, and the trips started: each is HELD at its charge, the flight and hotel booked
    payments.start_outage(3600)
    with ThreadPoolExecutor(4) as pool:
        started = list(pool.map(lambda n: drill.client.post("/workflows", trip(n)), range(TRIPS)))
    assert {status for status, _ in started} == {201}
    ids = {view["workflow_id"] for _, view in started}
    until(f"{TRIPS} trips HELD", 60 + TRIPS * 0.5, lambda: in_flight(operator) == {"HELD": TRIPS})
    assert charges(payments) == {}

    # When the outage ends, the dry run counts exactly them, and writes nothing
    payments.update_knobs({"outage_start": None, "outage_end": None})
    where = {"status": "HELD", "definition": "trip-booking", "error_code": "TRANSIENT_EXHAUSTED"}
    request = {"action": "retry", "where": where, "reason": "payments are back", "step": "charge_card"}
    status, seen = operator.post("/ops/batches", {**request, "dry_run": True})
    assert status == 200, seen
    assert (seen["matched"], seen["by_status"], seen["truncated"]) == (TRIPS, {"HELD": TRIPS}, False), held_by(operator)
    status, listing = operator.get("/ops/batches")
    assert (status, listing["batches"]) == (200, [])

    # And one batch retries them, its runner killed once it has acted on some and not all
    status, batch = operator.post(
        "/ops/batches", {**request, "max_per_second": RATE}, headers={"Idempotency-Key": "drill-payments-outage"}
    )
    assert status == 202, batch
    batch_id = batch["batch_id"]

    def progress() -> dict[str, Any]:
        answer, view = operator.get(f"/ops/batches/{batch_id}")
        assert answer == 200, view
        return view  # type: ignore[no-any-return]

    runner = drill.stack.pools["BatchFunction"]
    midway = until("the batch's first page claimed", 60, lambda: (view := progress())["pages"] >= 1 and view)
    killed = [pid for pid in runner.worker_pids()]
    assert killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    assert progress()["status"] == "RUNNING"  # killed with work left
    # Then the batch ends all the same, a new execution environment going on from the page the killed one claimed
    ended = until(
        "the batch COMPLETED", VISIBILITY_SECONDS + 120 + TRIPS / RATE, lambda: progress()["status"] == "COMPLETED"
    )
    view = progress()
    assert ended and view["counts"] == {"matched": TRIPS, "done": TRIPS, "refused": 0, "failed": 0}, view
    assert midway["counts"]["done"] < TRIPS
    assert not set(killed) & set(runner.worker_pids())  # the killed environments were replaced

    # And every trip COMPLETED, charged once, with one retry of this batch in its history
    # (a dispatch the kill cut off is resent by the supervisor once the charge's complete-by and the grace are past)
    until(
        "no trip in flight",
        60 + TRIPS * 0.3 + CHARGE_SECONDS + 6 + 3,
        lambda: in_flight(operator) == {},
        lambda: in_flight(operator),
    )
    with ThreadPoolExecutor(4) as pool:
        views = list(pool.map(lambda wid: drill.client.get(f"/workflows/{wid}"), sorted(ids)))
    assert {(status, view["status"]) for status, view in views} == {(200, "COMPLETED")}
    assert charges(payments) == dict.fromkeys(ids, 1)
    touched: list[dict[str, str]] = []
    cursor = ""
    while cursor is not None:
        answer, page = operator.get(
            f"/ops/batches/{batch_id}/workflows?limit=200" + (f"&cursor={cursor}" if cursor else "")
        )
        assert answer == 200, page
        touched += page["workflows"]
        cursor = page["next_cursor"]
    assert sorted(w["workflow_id"] for w in touched) == sorted(ids)  # each once
    assert {w["outcome"] for w in touched} == {"done"}
    for workflow_id in sorted(ids)[:: max(1, TRIPS // 25)]:  # a sample of their histories
        answer, history = operator.get(f"/ops/workflows/{workflow_id}/history")
        assert answer == 200
        actions = [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]
        assert [(a["action"], a["batch"], a["replaced_attempt"]) for a in actions] == [("retry", batch_id, 1)]

"""Batches of operator actions (sasflow.batches) through the scheduler over in-memory adapters.

A batch acts on every workflow its filter matches, a page at a time; a run that stops anywhere is continued by the
next, and no workflow is acted on twice (each action's Idempotency-Key derives from the batch and the workflow).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import sasflow.batches
from sasflow.adapters.memory import InMemoryBatchStore
from sasflow.api_models import events_of
from sasflow.batches import (
    Batch,
    BatchFilter,
    BatchPage,
    BatchRunner,
    Counts,
    action_key,
    cancel,
    new_batch,
    preview,
    touched,
)
from sasflow.clock import epoch_seconds
from sasflow.errors import BatchNotFoundError, ConditionFailedError
from sasflow.finding import WorkflowFinder
from sasflow.states import WorkflowStatus
from tests.support.pipeline import TRIP_INPUT, Pipeline, trip_definition

OPERATOR = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


def held_trips(p: Pipeline, n: int) -> list[str]:
    """``n`` trips held at the hotel (it refused each once): the flight done, the hotel FAILED."""
    p.services["hotels"].script["book"] = ["reject"] * n
    ids = [p.start({**trip_definition(), "on_failure": "hold"}, {**TRIP_INPUT, "n": i}) for i in range(n)]
    p.pump()
    assert {p.snapshot(w).workflow.status for w in ids} == {WorkflowStatus.HELD}
    return ids


def batch_events(p: Pipeline, wid: str) -> list[dict[str, Any]]:
    return [e.detail or {} for e in events_of(p.snapshot(wid)) if e.kind == "operator_action"]


class Crash(BaseException):
    """The runner's sandbox stops (a timeout, an out-of-memory) in the middle of an action."""


def runner(p: Pipeline, store: InMemoryBatchStore, **kwargs: Any) -> BatchRunner:
    return BatchRunner(
        store, WorkflowFinder(p.store, p.config.deadline_shards), p.scheduler, p.bus, p.clock, page_size=4, **kwargs
    )


def start(store: InMemoryBatchStore, p: Pipeline, batch_id: str = "b-1", **kwargs: Any) -> Batch:
    where = kwargs.pop("where", BatchFilter(status="HELD"))
    return store.create(
        new_batch(
            batch_id, "retry", where, principal=OPERATOR, reason="hotels are back", now=epoch_seconds(p.clock), **kwargs
        )
    )


def test_a_batch_retries_every_held_workflow_once_with_its_lineage_in_the_history() -> None:
    # Given ten trips held at the hotel, and a batch that retries what is HELD, four workflows a page
    p = Pipeline()
    ids = held_trips(p, 10)
    store = InMemoryBatchStore()
    start(store, p)
    # When one run works it through
    result = runner(p, store).run("b-1", "m-1")
    # Then it acted on all ten, three pages, and the batch COMPLETED with its counts
    assert result.acted == 10
    assert result.delay is None
    batch = store.get("b-1")
    assert batch is not None
    assert (batch.status, batch.pages, batch.settled, batch.counts) == ("COMPLETED", 3, 3, Counts(10, 10, 0, 0))
    assert sorted(w for w, _ in touched(store, "b-1")) == sorted(ids)
    assert {outcome for _, outcome in touched(store, "b-1")} == {"done"}
    # and each history holds one retry with the batch id, its derived key and the attempt it replaced
    for wid in ids:
        assert batch_events(p, wid) == [
            {
                "action": "retry",
                "principal": OPERATOR,
                "reason": "hotels are back",
                "id": action_key("b-1", wid),
                "batch": "b-1",
                "step": "book_hotel",
                "replaced_attempt": 1,
            }
        ]
    # and the trips complete
    p.pump()
    assert {p.snapshot(w).workflow.status for w in ids} == {WorkflowStatus.COMPLETED}


@pytest.mark.parametrize("crash_at", [1, 4, 5, 9])
def test_a_runner_that_crashes_midway_is_continued_and_acts_on_no_workflow_twice(crash_at: int) -> None:
    # Given nine held trips whose hotel refuses again at the first retry (so a second retry would apply)
    p = Pipeline()
    ids = held_trips(p, 9)
    store = InMemoryBatchStore()
    start(store, p)
    calls = {"n": 0}
    operate = p.scheduler.operate

    def crashing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        result = operate(*args, **kwargs)
        if calls["n"] == crash_at:
            raise Crash  # after the write: the action is done, the page is not settled
        return result

    p.scheduler.operate = crashing  # type: ignore[method-assign]
    p.services["hotels"].script["book"] = ["reject"] * 9
    # When the run crashes after its crash_at-th action, the pipeline runs, and the message's next delivery runs
    with pytest.raises(Crash):
        runner(p, store).run("b-1", "m-1")
    p.pump()  # the retried ones fail again: HELD again, so a retry under another key would apply
    p.scheduler.operate = operate  # type: ignore[method-assign]
    runner(p, store).run("b-1", "m-1")
    # Then each workflow was retried once by the batch, and counted once
    for wid in ids:
        assert [e["id"] for e in batch_events(p, wid)] == [action_key("b-1", wid)]
    batch = store.get("b-1")
    assert batch is not None
    assert batch.status == "COMPLETED"
    assert batch.counts == Counts(9, 9, 0, 0)
    assert len(list(touched(store, "b-1"))) == 9


def test_a_workflow_no_longer_held_is_refused_with_its_reason_and_the_batch_goes_on() -> None:
    p = Pipeline()
    ids = held_trips(p, 3)
    p.scheduler.operate(ids[1], "cancel", principal=OPERATOR, reason="by hand", action_id="single-1")
    store = InMemoryBatchStore()
    # A filter read before the cancel (the index lags): the batch is given the three, one of them cancelling
    start(store, p, where=BatchFilter(status="HELD", definition="trip-booking"))
    page = BatchPage("b-1", 1, tuple(ids))
    batch = store.get("b-1")
    assert batch is not None
    store.claim(
        Batch(**{**batch.__dict__, "pages": 1, "exhausted": True}),  # type: ignore[arg-type]
        page,
    )
    runner(p, store).run("b-1", "m-1")
    outcomes = dict(touched(store, "b-1"))
    assert outcomes[ids[0]] == outcomes[ids[2]] == "done"
    assert (
        outcomes[ids[1]] == "refused: workflow is CANCELLING: only a step of a HELD workflow can be retried or skipped"
    )
    stored = store.get("b-1")
    assert stored is not None
    assert stored.counts == Counts(3, 2, 1, 0)


def test_a_run_acts_on_its_share_and_the_next_message_is_delayed_to_keep_the_rate() -> None:
    # Given 10 held trips and a batch at 1 workflow a second: a run's share is 30 s of it
    p = Pipeline()
    held_trips(p, 10)
    store = InMemoryBatchStore()
    start(store, p, max_per_second=1)
    ticks = iter([0.0, 2.0])  # the run takes 2 s of the sandbox's time
    result = runner(p, store, monotonic=lambda: next(ticks)).run("b-1", "m-1")
    # Then the ten are done in one run, and no message continues it
    assert (result.acted, result.delay) == (10, None)
    # A batch with more than a run's share: 40 held at 1 a second: pages of 4 until 30 are done, then a delay
    q = Pipeline()
    held_trips(q, 40)
    big = InMemoryBatchStore()
    start(big, q, max_per_second=1)
    ticks = iter([0.0, 5.0])
    first = runner(q, big, monotonic=lambda: next(ticks)).run("b-1", "m-1")
    assert (first.acted, first.delay) == (32, 27)  # pages of 4 until 30 are done: 32; 32 s of rate less 5 s run
    assert first.batch is not None and first.batch.status == "RUNNING"


def test_only_the_message_that_holds_the_batch_continues_it() -> None:
    # Given a batch longer than one run's share (40 held, 1 a second: 32 in the first run)
    p = Pipeline()
    held_trips(p, 40)
    store = InMemoryBatchStore()
    start(store, p, max_per_second=1)
    run = runner(p, store)
    first = run.run("b-1", "m-1")
    assert first.batch is not None and first.batch.runner == "m-1" and first.batch.status == "RUNNING"
    # A duplicate of an older message, or one never handed over, does nothing
    assert run.run("b-1", "m-0") == type(first)(first.batch, 0, None)
    # The run hands the batch over to the message it sent; only that one continues it
    handed = run.hand_over(first.batch, "m-1", "m-2")
    assert handed is not None and handed.runner == "m-2"
    assert run.run("b-1", "m-1").acted == 0
    assert run.hand_over(handed, "m-1", "m-3") is None
    last = run.run("b-1", "m-2")
    assert last.acted == 8 and last.batch is not None and last.batch.counts == Counts(40, 40, 0, 0)


def test_a_cancelled_batch_claims_no_page_and_a_dry_run_counts_what_a_batch_would_touch() -> None:
    p = Pipeline()
    ids = held_trips(p, 6)
    store = InMemoryBatchStore()
    finder = WorkflowFinder(p.store, p.config.deadline_shards)
    seen = preview(finder, BatchFilter(status="HELD"))
    assert (seen.matched, seen.by_status, sorted(seen.sample), seen.truncated) == (6, {"HELD": 6}, sorted(ids), False)
    assert preview(finder, BatchFilter(status="HELD"), limit=4).truncated is False  # one finder page holds all six
    start(store, p)
    stopped = cancel(store, "b-1", principal=OPERATOR, reason="wrong filter", now=epoch_seconds(p.clock))
    assert (stopped.status, stopped.cancelled_by, stopped.cancel_reason) == ("CANCELLED", OPERATOR, "wrong filter")
    assert runner(p, store).run("b-1", "m-1").acted == 0
    assert all(batch_events(p, w) == [] for w in ids)
    assert (
        cancel(store, "b-1", principal=OPERATOR, reason="again", now=epoch_seconds(p.clock)).cancel_reason
        == "wrong filter"
    )
    with pytest.raises(BatchNotFoundError):
        cancel(store, "nope", principal=OPERATOR, reason="x", now=epoch_seconds(p.clock))


def test_a_completed_batch_cannot_be_cancelled_and_a_batch_needs_a_status() -> None:
    p = Pipeline()
    held_trips(p, 1)
    store = InMemoryBatchStore()
    start(store, p)
    runner(p, store).run("b-1", "m-1")
    with pytest.raises(ConditionFailedError, match="COMPLETED already"):
        cancel(store, "b-1", principal=OPERATOR, reason="late", now=epoch_seconds(p.clock))
    with pytest.raises(ValueError, match="needs a status"):
        new_batch("b-2", "retry", BatchFilter(), principal=OPERATOR, reason="x", now=0)
    with pytest.raises(ValueError, match="unknown action"):
        new_batch("b-2", "explode", BatchFilter(status="HELD"), principal=OPERATOR, reason="x", now=0)
    with pytest.raises(ValueError, match="max_per_second must be 1 to 500"):
        new_batch("b-2", "retry", BatchFilter(status="HELD"), principal=OPERATOR, reason="x", now=0, max_per_second=0)


def test_a_running_workflow_met_again_on_a_later_page_is_a_repeat_not_counted_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The in-flight listing is in deadline order: a workflow whose earliest complete-by moved past the cursor comes
    # back on a later page. Given pages that list one workflow twice (as that listing can)
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)  # RUNNING: its first step dispatched, not pumped
    other = p.start(trip_definition(), {**TRIP_INPUT, "n": 2})
    a, b = SimpleNamespace(workflow_id=wid), SimpleNamespace(workflow_id=other)
    scripted = iter([([a], "c-1"), ([a, b], None)])
    monkeypatch.setattr(sasflow.batches, "_pages", lambda finder, where, cursor, limit: next(scripted))
    store = InMemoryBatchStore()
    store.create(new_batch("b-1", "pause", BatchFilter(status="RUNNING"), principal=OPERATOR, reason="freeze", now=0))
    runner(p, store).run("b-1", "m-1")
    # Then it was paused once, and counted once; the second meeting is a repeat
    assert [e["id"] for e in batch_events(p, wid)] == [action_key("b-1", wid)]
    outcomes = [o for _, o in touched(store, "b-1")]
    assert outcomes == ["done", "repeat: acted on in an earlier page of this batch", "done"]
    batch = store.get("b-1")
    assert batch is not None and batch.counts == Counts(2, 2, 0, 0)


def test_a_batch_cancelled_with_a_page_claimed_settles_that_page_and_claims_no_other() -> None:
    p = Pipeline()
    ids = held_trips(p, 8)
    store = InMemoryBatchStore()
    start(store, p)
    steps = iter([False, True])  # the run stops after its first move: the claim of page 1
    runner(p, store).run("b-1", "m-1", should_stop=lambda: next(steps))
    claimed = store.get("b-1")
    assert claimed is not None and (claimed.pages, claimed.settled) == (1, 0)
    cancel(store, "b-1", principal=OPERATOR, reason="stop", now=epoch_seconds(p.clock))
    result = runner(p, store).run("b-1", "m-1")
    batch = store.get("b-1")
    assert batch is not None
    assert (batch.status, batch.pages, batch.settled, batch.counts) == ("CANCELLED", 1, 1, Counts(4, 4, 0, 0))
    assert (result.acted, result.delay) == (4, None)
    assert sum(1 for w in ids if batch_events(p, w)) == 4


def test_a_batch_whose_first_message_is_not_sent_is_cancelled_unless_its_request_can_be_repeated() -> None:
    from sasflow.batches import BatchService
    from sasflow.errors import RetryableError

    p = Pipeline()
    held_trips(p, 2)
    store = InMemoryBatchStore()
    tokens = iter(f"m-{n}" for n in range(10))
    service = BatchService(runner(p, store), "batch-queue", tokens=lambda: next(tokens))
    where = BatchFilter(status="HELD")
    now = epoch_seconds(p.clock)

    def batch(batch_id: str) -> Batch:
        return new_batch(batch_id, "retry", where, principal=OPERATOR, reason="hotels are back", now=now)

    # A request without an Idempotency-Key (nobody can repeat it) whose message is not sent: cancelled, saying why
    p.bus.fail_next = 1
    with pytest.raises(RetryableError, match="was not sent"):
        service.start(batch("b-once"), repeatable=False)
    stopped = store.get("b-once", consistent=True)
    assert stopped is not None and (stopped.status, stopped.counts) == ("CANCELLED", Counts())
    assert stopped.cancel_reason is not None and stopped.cancel_reason.startswith(
        "not started: its first run's message"
    )
    # One with a key stays RUNNING: the same request again sends its message, and it runs
    p.bus.fail_next = 1
    with pytest.raises(RetryableError):
        service.start(batch("b-keyed"))
    again, created = service.start(batch("b-keyed"))
    assert (again.status, again.runner, created) == ("RUNNING", "m-1", False)
    result = runner(p, store).run("b-keyed", "m-1")
    assert result.batch is not None and result.batch.counts == Counts(2, 2, 0, 0)
    # The same key with another skip output is another request: refused
    from sasflow.errors import IdempotencyKeyConflictError

    def skip(output: Any) -> Batch:
        return new_batch(
            "b-skip", "skip", where, principal=OPERATOR, reason="r", now=now, step="book_hotel", output=output
        )

    assert service.start(skip({"booked_by": "phone"}))[1] is True
    assert service.start(skip({"booked_by": "phone"}))[1] is False
    with pytest.raises(IdempotencyKeyConflictError, match="another batch"):
        service.start(skip({"booked_by": "mail"}))

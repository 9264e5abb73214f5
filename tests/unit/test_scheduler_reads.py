"""The scheduler reads a workflow eventually consistently first; a stale view must never drop or misapply a reply.

The in-memory store's ``stale_reads`` makes an eventually consistent read return an older version (or nothing),
as DynamoDB may for a short while after a write.
"""

from __future__ import annotations

from sasflow.states import Outcome, StepStatus, WorkflowStatus
from tests.support.pipeline import OWNER, Pipeline


def test_a_reply_newer_than_a_stale_view_is_confirmed_by_a_strong_read_and_applied() -> None:
    # Given the supervisor resent the flight as attempt 2, but eventually consistent reads still show attempt 1
    p = Pipeline()
    wid = p.start()
    p.bus.receive("queue/flights")  # attempt 1 is lost with its invocation
    before_resend = p.snapshot(wid)
    flight = before_resend.steps["reserve_flight"]
    assert flight.complete_by is not None
    p.clock.set(flight.complete_by + 31)
    p.sweep()
    p.store.stale_reads[wid] = before_resend
    # When the reply of attempt 2 arrives
    [reply] = p.run_agent("flights", lose_replies=True)
    assert reply.attempt == 2
    messages = p.scheduler.on_reply(reply)
    # Then it was not dropped as stale: the strong read saw attempt 2, and the hotel was dispatched
    assert [m.queue_url for m in messages] == ["queue/hotels"]
    assert p.snapshot(wid).steps["reserve_flight"].status is StepStatus.COMPLETED
    assert p.metrics["StaleReplies"] == 0


def test_a_reply_for_a_workflow_missing_from_a_stale_view_is_applied() -> None:
    p = Pipeline()
    wid = p.start()
    p.store.stale_reads[wid] = None  # just created: an eventually consistent read may not find it yet
    [reply] = p.run_agent("flights", lose_replies=True)
    assert [m.queue_url for m in p.scheduler.on_reply(reply)] == ["queue/hotels"]


def test_a_stale_view_that_writes_loses_and_the_reply_applies_once_from_the_fresh_state() -> None:
    # Given a cancel was stored after the view the eventually consistent read returns
    p = Pipeline()
    wid = p.start()
    stale = p.snapshot(wid)
    [reply] = p.run_agent("flights", lose_replies=True)
    p.scheduler.cancel(wid, owner=OWNER)
    p.store.stale_reads[wid] = stale
    saves = p.store.writes["save"]
    # When the flight's reply is applied
    messages = p.scheduler.on_reply(reply)
    # Then the write from the stale view lost, and the fresh one compensated the flight instead of booking a hotel
    assert [m.queue_url for m in messages] == ["queue/flights"]
    assert p.store.writes["save"] == saves + 1
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.CANCELLING
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPENSATING
    assert "book_hotel" not in snapshot.steps or snapshot.steps["book_hotel"].status is StepStatus.SKIPPED


def test_a_truly_stale_reply_is_dropped_after_the_strong_read_confirms_it() -> None:
    p = Pipeline()
    wid = p.start()
    p.bus.receive("queue/flights")
    first = p.snapshot(wid).steps["reserve_flight"]
    assert first.complete_by is not None
    p.clock.set(first.complete_by + 31)
    p.sweep()  # attempt 2 dispatched
    p.services["flights"].script["reserve"] = ["reject"]
    late = p.runtimes["flights"].handle(
        p.requests("flights")[0].model_copy(update={"attempt": 1}), lambda: 30.0
    )  # attempt 1's refusal, late (an earlier attempt's success would complete the step)
    assert late.outcome is Outcome.REJECTED
    p.store.stale_reads[wid] = p.snapshot(wid)  # the stale view happens to be current
    assert p.scheduler.on_reply(late) == []
    assert p.metrics["StaleReplies"] == 1
    assert p.snapshot(wid).steps["reserve_flight"].attempt == 2

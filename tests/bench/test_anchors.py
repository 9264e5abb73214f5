"""The new anchors' prices, recomputed by hand from the published prices, and the durable saga's counts as the SDK's
local testing runner reports them."""

from __future__ import annotations

import pytest

from bench import cost
from bench.asl import StateVisit, StepObservation, saga_asl, walk
from bench.cost import figures
from bench.durable_saga import StepPlan, run_plans
from bench.scenarios import callback_definition, chain_definition, run_scenario, scenarios

GIB = 1024**3
TRIP = {"traveller": "t-1", "route": "LHR-JFK", "nights": 2, "amount": 101}


# ---------------------------------------------------------------------------------------------------- Express
def test_express_bills_100_ms_increments_of_one_64_mb_block() -> None:
    # Given a 0.25 s execution of a few KB / When billed / Then 0.3 s at 64 MB: 0.3 * 64 / 1024 GB-seconds
    assert cost.express_billed_gb_seconds(0.25, 3_000) == pytest.approx(0.01875)
    assert cost.express_billed_gb_seconds(0.3, 3_000) == pytest.approx(0.01875)  # exactly 3 increments: no more
    # 50 MB + 20 MB of data is two blocks
    assert cost.express_billed_gb_seconds(0.1, 20 * 1024 * 1024) == pytest.approx(0.1 * 128 / 1024)
    # $1 per 1M requests, $0.00001667 per GB-second, $0.50 per GiB of logs
    assert cost.express_dollars(1, 0.01875) == pytest.approx(1e-6 + 0.01875 * 0.00001667)
    assert cost.express_dollars(1, 0.01875, log_bytes=GIB) == pytest.approx(1e-6 + 0.01875 * 0.00001667 + 0.50)


def test_express_duration_and_log_events_follow_the_walk() -> None:
    # Given a 3-step saga whose second step was retried twice (intervals 1 s and 2 s) / When walked
    asl = saga_asl(chain_definition(3))
    names = [step["name"] for step in chain_definition(3)["steps"]]
    observed = {name: StepObservation(ran=True, calls=3 if name == names[1] else 1, outcome="ok") for name in names}
    visits = walk(asl, observed)
    # Then the duration is 5 attempts at 0.1 s plus the 1 + 2 s waited, and the log has 2 + 3 * 5 + 2 * 3 events
    assert [v.attempts for v in visits] == [1, 3, 1]
    assert cost.express_duration_seconds(visits, 0.1) == pytest.approx(0.5 + 3.0)
    assert len(cost.express_log_events(visits, failed=False)) == 2 + 3 * 5 + 2 * 3


def test_express_cannot_run_a_callback_or_a_workflow_over_5_minutes() -> None:
    s5 = next(s for s in scenarios(scale=0.02) if s.name == "S5")
    data = cost.express_anchor(run_scenario(s5))
    assert (data["can_run"], data["cannot_run"]) == (False, "callback step: Express does not support .waitForTaskToken")
    long_wait = [StateVisit("Do_a", "Task", 2, "ok", (301.0,))]
    assert cost.express_duration_seconds(long_wait, 0.1) > 300


# ---------------------------------------------------------------------------------------------------- durable functions
def test_durable_functions_bill_operations_bytes_written_and_invocations() -> None:
    # $8 per 1M operations, $0.25 per GiB written, $0.20 per 1M Lambda requests
    assert cost.durable_dollars(3, 469, 1) == pytest.approx(3 * 8e-6 + 469 * 0.25 / GIB + 0.2e-6)
    # about $8.25 per million 1 KB steps (GiB here, so a little less)
    assert cost.durable_dollars(1_000_000, 1024 * 1_000_000, 0) == pytest.approx(8.0 + 0.25 * 1024e6 / GIB)


def test_the_runner_counts_one_operation_per_step_of_the_s1_saga() -> None:
    # Given S1's saga on the happy path / When the SDK's local runner runs it
    counts = run_plans((StepPlan("reserve_flight"), StepPlan("book_hotel"), StepPlan("charge_card")), TRIP)
    # Then 3 step operations, no retry, one invocation; the bytes are the input, 3 results and the execution's result
    assert (counts.operations, counts.retries, counts.invocations) == (3, 0, 1)
    assert counts.statuses == {"COMPLETED": 1}
    assert 300 < counts.bytes_written < 1_000


def test_a_retry_and_a_rejection_are_operations_and_the_retry_a_replay() -> None:
    # Given a first step that needs 2 calls and a second step the service rejects / When run
    plans = (StepPlan("reserve_flight", calls=2), StepPlan("book_hotel", outcome="rejected"), StepPlan("charge_card"))
    counts = run_plans(plans, TRIP)
    # Then 2 attempts + 1 rejected step + 1 compensation of the first; the retry's delay ends the first invocation
    assert (counts.operations, counts.retries, counts.invocations) == (4, 1, 2)
    assert counts.statuses == {"COMPENSATED": 1}


def test_a_callback_is_a_context_a_callback_and_a_submitter_step() -> None:
    plans = (StepPlan("reserve_flight"), StepPlan("approval", "callback", 0), StepPlan("book_hotel"))
    counts = run_plans(plans, TRIP)
    # 2 steps + wait_for_callback's child context, callback and submitter step; the answer is a second invocation
    assert (counts.operations, counts.invocations) == (5, 2)


# ---------------------------------------------------------------------------------------------------- Distributed Map
def test_distributed_map_with_standard_children_is_one_transition_per_child_plus_theirs() -> None:
    # Given 1,000 items whose child workflow is 3 transitions / When priced
    data = cost.distributed_map_anchor(1_000, 3)
    # Then 1,000 map-run transitions + 3,000 children's at $0.025 per 1,000: $0.10, $0.0001 per item
    assert data["standard_children"]["transitions"] == 4_000
    assert data["standard_children"]["dollars"] == pytest.approx(0.10)
    assert data["standard_children"]["dollars_per_item"] == pytest.approx(0.0001)
    # Express children: the 1,000 map-run transitions, 1,000 requests and 0.1 s at 64 MB each
    express = data["express_children"]
    assert express["gb_seconds"] == pytest.approx(1_000 * 0.1 * 64 / 1024)
    assert express["dollars"] == pytest.approx(0.025 + 1_000 * 1e-6 + 6.25 * 0.00001667)
    with pytest.raises(ValueError, match="items must be positive"):
        cost.distributed_map_anchor(0, 3)


# ---------------------------------------------------------------------------------------------------- S5
def test_s5_runs_a_callback_step_answered_through_the_api() -> None:
    # Given S5 at a tiny scale / When run
    s5 = next(s for s in scenarios(scale=0.02) if s.name == "S5")
    result = run_scenario(s5)
    data = figures(result)
    # Then every workflow completes its 4 steps; Step Functions enters 4 Tasks; the durable saga records 6 operations
    assert dict(result.statuses) == {"COMPLETED": 2}
    assert result.steps_run == 2 * 4
    assert data["step_functions_transitions"] == 2 * 4
    assert data["durable"]["operations"] == 2 * 6
    assert [step["type"] for step in callback_definition(3)["steps"] if "type" in step] == ["callback"]
    assert result.usage.api_requests == 2 + 2  # the starts and the answers

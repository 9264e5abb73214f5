"""The product's own tally of each workflow's cost (sasflow.cost) against the bench's accounting of the same runs
(issue 44: within 5 %, S1 to S5, and the trigger scenarios)."""

from __future__ import annotations

import pytest

from bench.accounting import bill
from bench.scenarios import run_scenario, scenarios
from sasflow import prices
from sasflow.cost import Tally

SUPERVISOR = "SupervisorFunction"


def _fixed(result) -> float:  # type: ignore[no-untyped-def]
    """The run's fixed costs, no workflow's: the supervisor's sweeps (its invocations, time, logs and requests)."""
    usage = result.usage
    own = bill(usage, result.memory_mb, lambdas={SUPERVISOR})
    requests = (
        usage.billed_by_function[(SUPERVISOR, "wru")] * prices.DYNAMODB_PER_WRU
        + usage.billed_by_function[(SUPERVISOR, "rru")] * prices.DYNAMODB_PER_RRU
        + usage.billed_by_function[(SUPERVISOR, "sqs_requests")] * prices.SQS_PER_REQUEST
    )
    return own.lambda_requests + own.lambda_compute + own.logs + requests


@pytest.mark.parametrize("name", ["S1", "S2", "S3", "S4", "S5", "S6", "S6-sqs", "S6-s3"])
def test_the_tally_on_the_workflows_is_within_5_percent_of_the_bench_for_the_same_run(name: str) -> None:
    # Given a scenario run through the real handlers, every AWS call metered by the bench
    scenario = next(s for s in scenarios(scale=0.05) if s.name == name)
    result = run_scenario(scenario)
    assert result.tallies and all(t.wru >= 1 and t.invocations > 0 for t in result.tallies.values())
    # When the workflows' own tallies (read from their items) are priced and summed
    tallied = sum((t for t in result.tallies.values()), Tally())
    # Then they are what the bench billed for the run, less its fixed costs (the modelled idle polls are not in
    # the bench's bill either), within 5 %
    billed = bill(result.usage, result.memory_mb).total - _fixed(result)
    assert tallied.dollars() == pytest.approx(billed, rel=0.05)
    # And the requests are counted, not estimated: DynamoDB units within 1 %, SQS requests within 2 % (the tally
    # also counts the delivery of S3's test event, which the bench's set-up makes uncounted)
    usage = result.usage
    assert tallied.wru == pytest.approx(
        sum(usage.wru.values()) - usage.billed_by_function[(SUPERVISOR, "wru")], rel=0.01
    )
    assert tallied.sqs == pytest.approx(
        usage.sqs_billed - usage.billed_by_function[(SUPERVISOR, "sqs_requests")], rel=0.02
    )
    assert tallied.invocations == pytest.approx(
        sum(n for f, n in usage.lambda_invocations.items() if f != SUPERVISOR), rel=0.01
    )

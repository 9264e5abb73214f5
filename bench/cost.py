"""Cost per step of S1/S2/S3, side by side with Step Functions Standard, and requests per step against the minimum.

Definitions (printed with the table, so a reader can recompute any figure from the raw counts in results.json):

- **Steps** are the forward steps that ran (a step sealed SKIPPED by a compensation never ran and is not counted).
  Both sides are divided by the same number.
- **Our orchestration cost** is every request the product makes, billed with `bench.prices`: DynamoDB WRU and RRU
  (state, idempotency records, circuit breaker, lease), SQS requests in 64 KB chunks (sends, the event source
  mappings' receives and deletes, and the modelled empty long polls), the HTTP API requests, and the Lambda requests
  and GB-seconds of the API, scheduler and supervisor functions, and the CloudWatch Logs they write (their log lines
  at the template's LogLevel INFO, one per applied transition, and their metrics' EMF lines). Left out on both
  sides: the agents' own Lambda invocations, compute and logs.
- **Step Functions' cost** is the transitions of the ASL in `bench.asl` walked with the same outcomes, at
  $0.025 per 1,000.
- **Minimal requests per step**: 2 state writes (dispatch, completion) + 2 idempotency writes (claim,
  result) + send, receive and delete of the request and of the reply, each amortised by the mean batch size that
  operation had in the same run: ``4 + 2/b_send + 2/b_receive + 2/b_delete``. **Actual** is every DynamoDB and
  SQS request (modelled empty polls included) divided by the steps.
"""

from __future__ import annotations

from typing import Any

from bench import prices
from bench.accounting import bill
from bench.asl import StepObservation, count_transitions, saga_asl
from bench.report import Row
from bench.scenarios import ScenarioResult, engine_functions

COST_TARGET = 0.20
REQUEST_TARGET = 1.25


def observations(result: ScenarioResult, workflow_id: str) -> dict[str, StepObservation]:
    """What happened to each step of one workflow, in the terms the ASL walk needs."""
    observed = {}
    for step, fact in result.facts.get(workflow_id, {}).items():
        ran = fact.status != "SKIPPED"
        compensated = fact.status in ("COMPENSATED", "COMPENSATION_FAILED", "COMPENSATING")
        if fact.forward_ok:
            outcome = "ok"
        elif compensated:
            outcome = "failed"  # gave up on an attempt that may have happened: it is undone too
        else:
            outcome = "rejected"
        observed[step] = StepObservation(
            ran=ran,
            calls=fact.action_calls + fact.lost_invocations,
            outcome=outcome,
            compensation_calls=fact.compensation_calls,
            compensation_ok=fact.status != "COMPENSATION_FAILED",
        )
    return observed


def step_functions_transitions(result: ScenarioResult) -> int:
    """Transitions Step Functions Standard would bill for every workflow of the run."""
    asl = saga_asl(result.definition)
    return sum(count_transitions(asl, observations(result, workflow_id)) for workflow_id in result.facts)


def figures(result: ScenarioResult) -> dict[str, Any]:
    """The raw counts and the derived figures of one scenario (what results.json holds)."""
    usage = result.usage
    cost = bill(usage, result.memory_mb, lambdas=engine_functions())
    empty_poll_dollars = result.empty_polls * prices.SQS_PER_REQUEST
    ours = cost.total + empty_poll_dollars
    transitions = step_functions_transitions(result)
    anchor = transitions * prices.STEP_FUNCTIONS_PER_TRANSITION
    steps = result.steps_run
    sent = usage.sqs_messages["sent"]
    received = usage.sqs_messages["received"]
    deleted = usage.sqs_messages["deleted"]
    b_send = sent / max(1, usage.calls[("sqs", "SendMessageBatch")] + usage.calls[("sqs", "SendMessage")])
    b_receive = received / max(1, usage.calls[("sqs", "ReceiveMessage")])
    b_delete = deleted / max(1, usage.calls[("sqs", "DeleteMessageBatch")] + usage.calls[("sqs", "DeleteMessage")])
    minimal = 4 + 2 / b_send + 2 / b_receive + 2 / b_delete
    actual_requests = usage.requests("dynamodb") + usage.requests("sqs") + result.empty_polls
    # Fixed costs: what the run pays whatever the traffic (the supervisor's schedule and the idle long polls).
    supervisor = "SupervisorFunction"
    supervisor_lambda = bill(usage, result.memory_mb, lambdas={supervisor})
    fixed = (
        supervisor_lambda.lambda_requests
        + supervisor_lambda.lambda_compute
        + usage.billed_by_function[(supervisor, "wru")] * prices.DYNAMODB_PER_WRU
        + usage.billed_by_function[(supervisor, "rru")] * prices.DYNAMODB_PER_RRU
        + usage.billed_by_function[(supervisor, "sqs_requests")] * prices.SQS_PER_REQUEST
        + empty_poll_dollars
    )
    return {
        "scenario": result.scenario.name,
        "title": result.scenario.title,
        "workflows": result.workflows,
        "statuses": dict(result.statuses),
        "steps_run": steps,
        "simulated_seconds": result.simulated_seconds,
        "wall_seconds": round(result.wall_seconds, 1),
        "usage": usage.as_dict(),
        "empty_polls_modelled": result.empty_polls,
        "supervisor_runs": usage.lambda_invocations[supervisor],
        "supervisor_resends": result.supervisor_resends,
        "fixed_dollars": fixed,
        "fixed_share": fixed / ours if ours else 0.0,
        "asl": saga_asl(result.definition),
        "ours_dollars": {**cost.as_dict(), "sqs_empty_polls": empty_poll_dollars, "total": ours},
        "step_functions_transitions": transitions,
        "step_functions_dollars": anchor,
        "mean_batch": {"send": b_send, "receive": b_receive, "delete": b_delete},
        "minimal_requests_per_step": minimal,
        "actual_requests_per_step": actual_requests / steps,
        "ours_per_step": ours / steps,
        "anchor_per_step": anchor / steps,
        "ours_per_workflow": ours / result.workflows,
        "log_bytes_per_workflow": sum(usage.log_bytes[f] for f in engine_functions()) / result.workflows,
        "logs_share": cost.logs / ours if ours else 0.0,
        "anchor_per_workflow": anchor / result.workflows,
    }


def rows(result: ScenarioResult, data: dict[str, Any]) -> list[Row]:
    """The table rows of one scenario."""
    name = result.scenario.name
    per_million = 1_000_000
    cost_target = COST_TARGET if name in ("S1", "S2") else None
    request_target = REQUEST_TARGET if name in ("S1", "S3") else None
    return [
        Row.with_ratio(
            f"{name} orchestration $ per 1M steps (anchor: Step Functions Standard)",
            data["ours_per_step"] * per_million,
            data["anchor_per_step"] * per_million,
            data["ours_per_step"] / data["anchor_per_step"],
            at_most=cost_target,
        ),
        Row.with_ratio(
            f"{name} $ per 1M workflows ({result.scenario.steps} steps)",
            data["ours_per_workflow"] * per_million,
            data["anchor_per_workflow"] * per_million,
            data["ours_per_workflow"] / data["anchor_per_workflow"],
        ),
        Row(
            f"{name} fixed costs (supervisor schedule, idle long polls), share of ours",
            f"{data['fixed_share']:.1%} ({data['supervisor_runs']} supervisor runs)",
        ),
        Row(
            f"{name} CloudWatch Logs per workflow (engine functions' lines and metrics, at LogLevel INFO)",
            f"{data['log_bytes_per_workflow']:,.0f} bytes, {data['logs_share']:.1%} of ours",
        ),
        Row.with_ratio(
            f"{name} AWS requests per step (anchor: minimal)",
            data["actual_requests_per_step"],
            data["minimal_requests_per_step"],
            data["actual_requests_per_step"] / data["minimal_requests_per_step"],
            at_most=request_target,
        ),
    ]

"""Cost per step of S1/S2/S3/S5, side by side with Step Functions Standard and Express and with Lambda durable
functions, and requests per step against the minimum.

Definitions (printed with the table, so a reader can recompute any figure from the raw counts in results.json):

- **Steps** are the forward steps that ran (a step sealed SKIPPED by a compensation never ran and is not counted).
  Both sides are divided by the same number.
- **Our orchestration cost** is every request the product makes, billed with `sasflow.prices`: DynamoDB WRU and RRU
  (state, idempotency records, circuit breaker, lease), SQS requests in 64 KB chunks (sends, the event source
  mappings' receives and deletes, and the modelled empty long polls), the HTTP API requests, and the Lambda requests
  and GB-seconds of the API, scheduler and supervisor functions, and the CloudWatch Logs they write (their log lines
  at the template's LogLevel INFO, one per applied transition, and their metrics' EMF lines). Left out on both
  sides: the agents' own Lambda invocations, compute and logs.
- **Step Functions' cost** is the transitions of the ASL in `bench.asl` walked with the same outcomes, at
  $0.025 per 1,000.
- **Step Functions Express** runs the same ASL: one request per workflow, plus its duration billed in 100 ms
  increments at one 64 MB block (50 MB + the definition + the execution data, well under 64 MB for these sagas),
  the duration being each Task attempt at a remote latency of `EXPRESS_REMOTE_LATENCY_SECONDS` (0.1 s, printed in
  the row) plus the Retry intervals the walk waited: ``requests * $1/1M + GB-seconds * $0.00001667`` where
  ``GB-seconds = sum over workflows of ceil(duration / 0.1) * 0.1 * 64 / 1024``. **With logging** adds the
  execution history Express writes to CloudWatch Logs (log level ALL, without execution data): the events of the
  walk (ExecutionStarted/Succeeded or Failed; per Task state TaskStateEntered, per attempt TaskScheduled,
  TaskStarted and TaskSucceeded or TaskFailed, TaskStateExited; FailStateEntered), each the JSON line of
  `express_log_event`, at $0.50 per GB (GiB here, which can only make the anchor cheaper). Express cannot run a
  workflow over 5 minutes or with a callback (``.waitForTaskToken``): such a scenario gets a "cannot run" row. A
  lost invocation is billed as one more attempt at the same latency, not as the Task's timeout it would wait
  (which can only make the anchor cheaper).
- **Lambda durable functions** run the same saga (`bench.durable_saga`, the SDK's local testing runner):
  ``operations * $8/1M + bytes written * $0.25/GiB + invocations * $0.20/1M`` (the function's own Lambda requests:
  its first invocation and every replay). Its Lambda GB-seconds are left out: while a step runs they are the remote
  call's time, which is the agents' compute, left out for us and for Step Functions too.
- **Step Functions Distributed Map** (the anchor S4 plugs its counts into, `distributed_map_anchor`): one transition
  per child workflow started, plus each Standard child's own transitions; the Express-children figure is given
  for reference.
- **The whole bill** (the "whole bill" rows): everything a user pays per step when the remote services answer in
  `EXPRESS_REMOTE_LATENCY_SECONDS` (0.1 s, as the Express rows). **Ours** adds to the orchestration cost the agents'
  Lambda requests, their GB-seconds (each invocation's measured time, plus 0.1 s for each call of its longest chain:
  an agent calls its batch's records at once, ``AGENT_CONCURRENCY`` at a time, each record's retries one after the
  other, so an invocation waits for its busiest worker, `scenarios.calls_waited`; the bench runs the records on one
  thread and bills the wait they would share; an invocation lost before its call is billed as a request that waited
  0.1 s, as the durable function's extra attempt is) and their logs (each invocation's metrics line).
  **Step Functions Standard with HTTP Tasks** calls the services with no Lambda at all: its bill is the same
  transitions (an HTTP Task is billed as its transitions; its EventBridge connection's secret is a monthly fixed
  cost, like our workflow-id secret, left out on both sides). **Lambda durable functions** add to their bill the
  GB-seconds their invocation spends waiting: 0.1 s for every call the function made (every attempt of every step
  and compensation, and a callback's notification) at our agents' memory (the same function size on both sides);
  the time it spends on its own code and checkpoints is left out, which can only make it cheaper.
- **Minimal requests per step**: 2 state writes (dispatch, completion) + 2 idempotency writes (claim,
  result) + send, receive and delete of the request and of the reply, each amortised by the mean batch size that
  operation had in the same run: ``4 + 2/b_send + 2/b_receive + 2/b_delete``. **Actual** is every DynamoDB and
  SQS request (modelled empty polls included) divided by the steps.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from bench.accounting import bill
from bench.asl import StateVisit, StepObservation, count_transitions, saga_asl, walk
from bench.report import Row
from bench.scenarios import ScenarioResult, agent_functions, engine_functions
from sasflow import prices

#: Our cost per step over Step Functions Standard's, at most (by scenario).
COST_TARGETS = {"S1": 0.17, "S2": 0.20, "S6": 0.17}
#: Our cost per step over Lambda durable functions', at most (by scenario).
DURABLE_TARGETS = {"S1": 0.50}
#: The whole bill per step (`whole_bill`): ours over Step Functions Standard with HTTP Tasks, and over Lambda durable
#: functions waiting for their calls, at most (by scenario).
WHOLE_STANDARD_TARGETS = {"S1": 0.25}
WHOLE_DURABLE_TARGETS = {"S1": 0.50}
REQUEST_TARGET = 1.25
#: S7: the quiet tenant's p95 from start to end beside the bursting tenant, over its p95 alone, at most (issue 39).
FAIRNESS_TARGET = 1.5
#: The remote service's latency per Task attempt an Express workflow is billed for (seconds, stated in the row).
EXPRESS_REMOTE_LATENCY_SECONDS = 0.1
_GIB = 1024**3
#: Step Functions' largest execution data (256 KiB): the memory estimate uses it, and is still one 64 MB block.
MAX_PAYLOAD_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------------- Express
def express_log_event(event_type: str, event_id: int, details: dict[str, Any]) -> str:
    """One execution-history event as Express writes it to CloudWatch Logs (level ALL, no execution data).

    The shape is the one of the Step Functions developer guide, "Logging in CloudWatch Logs" (``id``, ``type``,
    ``details``, ``previous_event_id``, ``event_timestamp``, ``execution_arn``), with an ARN of the lengths AWS uses.
    """
    arn = (
        "arn:aws:states:us-east-1:123456789012:express:trip-booking:"
        "4b1f3c0e-6a53-4f2e-9c1d-2f6f0b8a7e11:9a0d7c52-1b3e-4c89-8f10-6d2e5a4b3c21"
    )
    return json.dumps(
        {
            "id": str(event_id),
            "type": event_type,
            "details": details,
            "previous_event_id": str(event_id - 1),
            "event_timestamp": "1764619200123",
            "execution_arn": arn,
        },
        separators=(",", ":"),
    )


def express_log_events(visits: list[StateVisit], failed: bool) -> list[str]:
    """The CloudWatch Logs lines of one Express execution that entered ``visits`` (see `express_log_event`)."""
    role = "arn:aws:iam::123456789012:role/trip-booking-express"
    events: list[tuple[str, dict[str, Any]]] = [("ExecutionStarted", {"roleArn": role})]
    for visit in visits:
        if visit.type == "Fail":
            events.append(("FailStateEntered", {"name": visit.name}))
            continue
        events.append(("TaskStateEntered", {"name": visit.name}))
        resource: dict[str, Any] = {"resourceType": "lambda", "resource": "invoke", "region": "us-east-1"}
        for attempt in range(visit.attempts):
            events.append(("TaskScheduled", {**resource, "timeoutInSeconds": 30}))
            events.append(("TaskStarted", resource))
            last = attempt + 1 == visit.attempts
            if last and visit.outcome == "ok":
                events.append(("TaskSucceeded", resource))
            else:
                events.append(("TaskFailed", {**resource, "error": "Remote.Transient"}))
        events.append(("TaskStateExited", {"name": visit.name}))
    events.append(("ExecutionFailed" if failed else "ExecutionSucceeded", {}))
    return [express_log_event(kind, index + 1, details) for index, (kind, details) in enumerate(events)]


def express_duration_seconds(visits: list[StateVisit], latency_seconds: float) -> float:
    """An Express execution's duration: each Task attempt at ``latency_seconds`` plus the Retry intervals waited."""
    tasks = [visit for visit in visits if visit.type == "Task"]
    return sum(visit.attempts * latency_seconds + sum(visit.retry_intervals) for visit in tasks)


def express_billed_gb_seconds(duration_seconds: float, memory_bytes: int) -> float:
    """GB-seconds billed for one execution: duration rounded up to 100 ms, memory in 64 MB blocks.

    ``memory_bytes`` is the definition's and the execution data's size, on top of the 50 MB base of the AWS Step
    Functions pricing page's estimate (example 3).
    """
    increment = prices.EXPRESS_DURATION_ROUNDING_SECONDS
    billed_seconds = math.ceil(round(duration_seconds / increment, 9)) * increment
    memory_mb = prices.EXPRESS_BASE_MEMORY_MB + memory_bytes / (1024 * 1024)
    blocks = math.ceil(memory_mb / prices.EXPRESS_MEMORY_BLOCK_MB)
    return billed_seconds * blocks * prices.EXPRESS_MEMORY_BLOCK_MB / 1024


def express_dollars(requests: int, gb_seconds: float, log_bytes: int = 0) -> float:
    """Express's bill: ``requests * $1/1M + gb_seconds * $0.00001667``, plus ``log_bytes`` of CloudWatch Logs."""
    return (
        requests * prices.EXPRESS_PER_REQUEST
        + gb_seconds * prices.EXPRESS_PER_GB_SECOND
        + log_bytes * prices.CLOUDWATCH_LOGS_PER_BYTE * 1_000_000_000 / _GIB
    )


def express_anchor(result: ScenarioResult, latency_seconds: float = EXPRESS_REMOTE_LATENCY_SECONDS) -> dict[str, Any]:
    """The raw counts and dollars of the scenario run as Step Functions Express workflows.

    Returns a dict with ``can_run`` (False, with ``cannot_run`` saying why, for a callback step or a workflow over
    5 minutes), ``requests``, ``gb_seconds``, ``log_events``, ``log_bytes``, ``dollars`` and
    ``dollars_with_logging``.
    """
    asl = saga_asl(result.definition)
    reasons = []
    if any(step.get("type") == "callback" for step in result.definition["steps"]):
        reasons.append("callback step: Express does not support .waitForTaskToken")
    definition_bytes = len(json.dumps(asl).encode())
    requests = 0
    gb_seconds = 0.0
    log_events = 0
    log_bytes = 0
    over_limit = 0
    longest = 0.0
    for workflow_id in result.facts:
        visits = walk(asl, observations(result, workflow_id))
        duration = express_duration_seconds(visits, latency_seconds)
        longest = max(longest, duration)
        over_limit += duration > prices.EXPRESS_MAX_SECONDS
        requests += 1
        gb_seconds += express_billed_gb_seconds(duration, definition_bytes + MAX_PAYLOAD_BYTES)
        lines = express_log_events(visits, failed=visits[-1].type == "Fail")
        log_events += len(lines)
        log_bytes += sum(len(line) + 1 for line in lines)
    if over_limit:
        reasons.append(f"{over_limit} workflows over 5 minutes")
    dollars = express_dollars(requests, gb_seconds)
    return {
        "can_run": not reasons,
        "cannot_run": "; ".join(reasons),
        "remote_latency_seconds": latency_seconds,
        "requests": requests,
        "gb_seconds": gb_seconds,
        "memory_block_mb": prices.EXPRESS_MEMORY_BLOCK_MB,
        "definition_bytes": definition_bytes,
        "longest_duration_seconds": longest,
        "log_events": log_events,
        "log_bytes": log_bytes,
        "dollars": dollars,
        "dollars_with_logging": express_dollars(requests, gb_seconds, log_bytes),
    }


# ---------------------------------------------------------------------------------------------------- durable functions
def durable_dollars(operations: int, bytes_written: int, invocations: int) -> float:
    """Lambda durable functions' bill: ``operations * $8/1M + bytes_written * $0.25/GiB + invocations * $0.20/1M``.

    Data retained (per GB-month) and the function's GB-seconds are left out (see the module's definitions).
    """
    return (
        operations * prices.DURABLE_PER_OPERATION
        + bytes_written * prices.DURABLE_PER_BYTE_WRITTEN * 1_000_000_000 / _GIB
        + invocations * prices.LAMBDA_PER_REQUEST
    )


def durable_anchor(result: ScenarioResult) -> dict[str, Any]:
    """The scenario's saga run as a Lambda durable function by the SDK's local testing runner: counts and dollars."""
    from bench.durable_saga import durable_counts

    workflows = {workflow_id: observations(result, workflow_id) for workflow_id in result.facts}
    sample_input = {"traveller": "t-0", "route": "LHR-JFK", "nights": 1, "amount": 100}
    counts = durable_counts(result.definition, workflows, sample_input)
    total = counts["total"]
    return {
        **total,
        "dollars": durable_dollars(total["operations"], total["bytes_written"], total["invocations"]),
        "by_plan": counts["plans"],
    }


# ---------------------------------------------------------------------------------------------------- the whole bill
def whole_bill(
    result: ScenarioResult,
    orchestration: float,
    standard: float,
    durable: dict[str, Any],
    latency_seconds: float = EXPRESS_REMOTE_LATENCY_SECONDS,
) -> dict[str, Any]:
    """Everything a user pays for the scenario's workflows when each call to a remote service takes
    ``latency_seconds``, on each side (dollars, with what they are made of; see the module's definitions).

    ``orchestration`` is our orchestration cost, ``standard`` Step Functions Standard's (its transitions, which is
    all an HTTP Task costs), ``durable`` the `durable_anchor` of the same run.
    """
    agents = agent_functions()
    agent_cost = bill(result.usage, result.memory_mb, lambdas=agents)
    # an invocation waits for its batch's calls, made at once (AGENT_CONCURRENCY records at a time): its longest
    # chain of calls (`scenarios.calls_waited`); an invocation lost before its call is billed as one that waited as
    # long as a call (the durable function retries it as one more attempt of the same latency)
    waits = Counter(result.remote_waits) + Counter(result.lost_invocations)
    waiting_gb_seconds = sum(
        waited * latency_seconds * result.memory_mb[function] / 1024 for function, waited in waits.items()
    )
    lost = sum(result.lost_invocations.values())
    agents_dollars = (
        lost * prices.LAMBDA_PER_REQUEST
        + agent_cost.lambda_requests
        + agent_cost.lambda_compute
        + agent_cost.logs
        + waiting_gb_seconds * prices.LAMBDA_PER_GB_SECOND
    )
    memory_mb = max(result.memory_mb[function] for function in agents)
    durable_waiting_gb_seconds = durable["remote_calls"] * latency_seconds * memory_mb / 1024
    durable_whole = durable["dollars"] + durable_waiting_gb_seconds * prices.LAMBDA_PER_GB_SECOND
    return {
        "remote_latency_seconds": latency_seconds,
        "agents": {
            "invocations": sum(result.usage.lambda_invocations[f] for f in agents) + lost,
            "lost_invocations": lost,
            "billed_ms": sum(result.usage.lambda_ms[f] for f in agents),
            "log_bytes": sum(result.usage.log_bytes[f] for f in agents),
            "remote_calls": sum(result.remote_calls.values()),
            "calls_waited": sum(result.remote_waits.values()),
            "waiting_gb_seconds": waiting_gb_seconds,
            "lambda_requests": agent_cost.lambda_requests + lost * prices.LAMBDA_PER_REQUEST,
            "lambda_compute": agent_cost.lambda_compute + waiting_gb_seconds * prices.LAMBDA_PER_GB_SECOND,
            "cloudwatch_logs": agent_cost.logs,
            "dollars": agents_dollars,
        },
        "ours": orchestration + agents_dollars,
        "standard_http_tasks": standard,
        "durable": {
            "memory_mb": memory_mb,
            "remote_calls": durable["remote_calls"],
            "waiting_gb_seconds": durable_waiting_gb_seconds,
            "dollars": durable_whole,
        },
    }


# ---------------------------------------------------------------------------------------------------- Distributed Map
def distributed_map_anchor(
    items: int,
    child_transitions_per_item: float,
    *,
    parent_transitions: int = 0,
    express_child_seconds: float = EXPRESS_REMOTE_LATENCY_SECONDS,
    express_child_memory_bytes: int = 0,
) -> dict[str, Any]:
    """Step Functions' bill for a Distributed Map over ``items`` items (the anchor of S4's cost per item).

    Parameters
    ----------
    items:
        Child workflow executions the Map Run starts (one per item, no batching).
    child_transitions_per_item:
        Transitions of one child workflow when it is a Standard workflow (from `bench.asl`'s walk of the item's
        steps: 1 for a single Task that succeeds first time).
    parent_transitions:
        The parent's other transitions (the Map state's own entry and the states around it), if any.
    express_child_seconds, express_child_memory_bytes:
        Duration and data of one child as an Express workflow, for the reference figure.

    Returns
    -------
    dict
        ``standard_children`` (the priced anchor: ``parent_transitions + items * (1 + child_transitions_per_item)``
        transitions at $0.025 per 1,000), ``express_children`` (``parent_transitions + items`` transitions, plus
        ``items`` Express requests and their GB-seconds), each with its raw counts, and the per-item dollars.

    Source: AWS Step Functions developer guide, "Transitions": a Distributed Map is charged one state transition for
    each child workflow execution it starts; the children are billed as their workflow type.
    """
    if items <= 0:
        raise ValueError(f"items must be positive, not {items}")
    map_run = items * prices.DISTRIBUTED_MAP_TRANSITIONS_PER_CHILD
    standard_transitions = parent_transitions + map_run + items * child_transitions_per_item
    standard = standard_transitions * prices.STEP_FUNCTIONS_PER_TRANSITION
    gb_seconds = items * express_billed_gb_seconds(express_child_seconds, express_child_memory_bytes)
    express = (parent_transitions + map_run) * prices.STEP_FUNCTIONS_PER_TRANSITION + express_dollars(items, gb_seconds)
    return {
        "items": items,
        "standard_children": {
            "transitions": standard_transitions,
            "dollars": standard,
            "dollars_per_item": standard / items,
        },
        "express_children": {
            "transitions": parent_transitions + map_run,
            "requests": items,
            "gb_seconds": gb_seconds,
            "dollars": express,
            "dollars_per_item": express / items,
        },
    }


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


#: S4's cost per item over Step Functions Distributed Map's (Standard children), at most.
MAP_TARGET = 0.20


def map_figures(result: ScenarioResult) -> dict[str, Any]:
    """S4's raw counts and figures: our cost per item of a map step, against a Distributed Map's.

    The anchor runs the same fan-out as a Distributed Map whose child workflows are Standard workflows (the child
    type with the same guarantees: exactly-once steps, callbacks, runs over 5 minutes); each child's transitions are
    the walk of the child definition's ASL with that child's outcomes, as in S1. The Express-children figure is given
    for reference.
    """
    usage = result.usage
    cost = bill(usage, result.memory_mb, lambdas=engine_functions())
    empty_poll_dollars = result.empty_polls * prices.SQS_PER_REQUEST
    ours = cost.total + empty_poll_dollars
    map_step = result.definition["steps"][0]
    child_asl = saga_asl(map_step["definition"])
    parents = {w for w, steps in result.facts.items() if map_step["name"] in steps}
    child_transitions = [
        count_transitions(child_asl, observations(result, workflow_id))
        for workflow_id in result.facts
        if workflow_id not in parents
    ]
    items = len(child_transitions)
    anchor = distributed_map_anchor(
        items,
        sum(child_transitions) / max(1, items),
        parent_transitions=len(parents),  # each parent enters its Map state once
        express_child_seconds=EXPRESS_REMOTE_LATENCY_SECONDS,
    )
    requests = usage.requests("dynamodb") + usage.requests("sqs") + usage.requests("s3") + result.empty_polls
    return {
        "scenario": result.scenario.name,
        "title": result.scenario.title,
        "workflows": result.workflows,
        "statuses": dict(result.statuses),
        "children": dict(result.children),
        "items": items,
        "steps_run": result.steps_run,
        "simulated_seconds": result.simulated_seconds,
        "wall_seconds": round(result.wall_seconds, 1),
        "usage": usage.as_dict(),
        "empty_polls_modelled": result.empty_polls,
        "supervisor_resends": result.supervisor_resends,
        "ours_dollars": {**cost.as_dict(), "sqs_empty_polls": empty_poll_dollars, "total": ours},
        "ours_per_item": ours / max(1, items),
        "requests_per_item": requests / max(1, items),
        "child_transitions": sum(child_transitions),
        "distributed_map": anchor,
        "anchor_per_item": anchor["standard_children"]["dollars_per_item"],
        "express_children_per_item": anchor["express_children"]["dollars_per_item"],
        "parent_item_bytes": result.parent_item_bytes,
        "child_asl": child_asl,
    }


def map_rows(result: ScenarioResult, data: dict[str, Any]) -> list[Row]:
    """S4's table rows."""
    name = result.scenario.name
    per_million = 1_000_000
    ours = data["ours_per_item"]
    return [
        Row.with_ratio(
            f"{name} orchestration $ per 1M map items (anchor: Step Functions Distributed Map, Standard children)",
            ours * per_million,
            data["anchor_per_item"] * per_million,
            ours / data["anchor_per_item"],
            at_most=MAP_TARGET,
        ),
        Row.with_ratio(
            f"{name} orchestration $ per 1M map items (reference: Distributed Map, Express children, "
            f"{EXPRESS_REMOTE_LATENCY_SECONDS * 1000:g} ms each)",
            ours * per_million,
            data["express_children_per_item"] * per_million,
            ours / data["express_children_per_item"],
        ),
        Row(
            f"{name} map items: children COMPLETED, supervisor resends, parent item",
            f"{data['children'].get('COMPLETED', 0):,} of {data['items']:,}, {data['supervisor_resends']} resends, "
            f"{data['parent_item_bytes']:,} bytes",
        ),
        Row(f"{name} AWS requests per map item (DynamoDB, SQS, S3)", f"{data['requests_per_item']:.2f}"),
    ]


def figures(result: ScenarioResult) -> dict[str, Any]:
    """The raw counts and the derived figures of one scenario (what results.json holds)."""
    if result.scenario.map_items:
        return map_figures(result)
    usage = result.usage
    orchestration = engine_functions() | ({result.trigger_function} if result.trigger_function else set())
    cost = bill(usage, result.memory_mb, lambdas=orchestration)
    empty_poll_dollars = result.empty_polls * prices.SQS_PER_REQUEST
    ours = cost.total + empty_poll_dollars
    transitions = step_functions_transitions(result)
    anchor = transitions * prices.STEP_FUNCTIONS_PER_TRANSITION + step_functions_start_dollars(result)
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
    express = express_anchor(result)
    durable = durable_anchor(result)
    whole = whole_bill(result, ours, anchor, durable)
    return {
        "whole_bill": whole,
        "whole_per_step": whole["ours"] / steps,
        "whole_standard_per_step": whole["standard_http_tasks"] / steps,
        "whole_durable_per_step": whole["durable"]["dollars"] / steps,
        "express": express,
        "durable": durable,
        "express_per_step": express["dollars"] / steps,
        "express_logged_per_step": express["dollars_with_logging"] / steps,
        "durable_per_step": durable["dollars"] / steps,
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
        "call_limits": {
            "requests_per_step": usage.call_limit_requests / steps,
            "dollars_per_step": (
                usage.call_limit_wru * prices.DYNAMODB_PER_WRU + usage.call_limit_rru * prices.DYNAMODB_PER_RRU
            )
            / steps,
        },
        "tenancy": {
            "max_running": result.scenario.max_running,
            "queued": result.queued,
            "requests_per_step": usage.tenancy_requests / steps,
            "dollars_per_step": (
                usage.tenancy_wru * prices.DYNAMODB_PER_WRU + usage.tenancy_rru * prices.DYNAMODB_PER_RRU
            )
            / steps,
            "durations": result.durations,
        },
        "ours_per_step": ours / steps,
        "anchor_per_step": anchor / steps,
        "ours_per_workflow": ours / result.workflows,
        "log_bytes_per_workflow": sum(usage.log_bytes[f] for f in engine_functions()) / result.workflows,
        "logs_share": cost.logs / ours if ours else 0.0,
        "anchor_per_workflow": anchor / result.workflows,
        "start": start_cost(result),
    }


#: How a scenario's workflows started, in its "start's own cost" row.
_START_LABEL = {
    "api": "through the API: HTTP API request, API function, its writes and sends",
    "event": "an event: PutEvents, the rule's send, the trigger's mapping, function, writes and sends",
    "sqs": "a message: the producer's send, the trigger's mapping, function, writes and sends",
    "s3": "an upload: S3's notification, the trigger's mapping, function, writes and sends",
}


def step_functions_start_dollars(result: ScenarioResult) -> float:
    """What starting the anchor's executions costs besides their transitions (S6): an event's PutEvents (the rule's
    StartExecution is free), a message's share of an EventBridge Pipes request (SQS to a state machine takes a
    pipe), an upload nothing (S3's Object Created events on the default bus are free, and so is the rule); an API
    start: nothing counted on either side but ours (its HTTP API request)."""
    per_start = {
        "event": prices.EVENTBRIDGE_PER_EVENT,
        "sqs": prices.EVENTBRIDGE_PIPES_PER_REQUEST / 10,  # the pipe's batch of ten small messages: one request
        "s3": 0.0,
    }.get(result.scenario.trigger, 0.0)
    return per_start * result.workflows


def start_cost(result: ScenarioResult) -> dict[str, Any]:
    """What one start costs, by itself (dollars per start): through the API, its HTTP API request and the API
    function's invocation, time and requests; through a trigger, the occurrence's delivery (and an event's
    PutEvents), the trigger's mapping (receives, deletes) and the trigger function's invocation, time and requests.
    Both include the workflow's first write and its first steps' sends, which the starting function makes."""
    usage = result.usage
    function = result.trigger_function or "ApiFunction"
    callers = {function}
    if result.trigger_function:
        callers |= {f"{function} mapping", f"{result.scenario.trigger} delivery"}
    lambda_cost = bill(usage, result.memory_mb, lambdas={function})
    requests = sum(
        usage.billed_by_function[(caller, "wru")] * prices.DYNAMODB_PER_WRU
        + usage.billed_by_function[(caller, "rru")] * prices.DYNAMODB_PER_RRU
        + usage.billed_by_function[(caller, "sqs_requests")] * prices.SQS_PER_REQUEST
        for caller in callers
    )
    api = 0.0 if result.trigger_function else usage.api_requests * prices.HTTP_API_PER_REQUEST
    starts = result.workflows
    dollars = (
        lambda_cost.lambda_requests + lambda_cost.lambda_compute + lambda_cost.logs + requests + api
        + usage.eventbridge_events * prices.EVENTBRIDGE_PER_EVENT
    )  # fmt: skip
    return {
        "through": result.scenario.trigger or "api",
        "function": function,
        "dollars_per_start": dollars / starts,
        "invocations_per_start": usage.lambda_invocations[function] / starts,
    }


def rows(result: ScenarioResult, data: dict[str, Any]) -> list[Row]:
    """The table rows of one scenario."""
    if result.scenario.map_items:
        return map_rows(result, data)
    name = result.scenario.name
    per_million = 1_000_000
    request_target = REQUEST_TARGET if name in ("S1", "S3") else None
    ours = data["ours_per_step"]
    table = [
        Row.with_ratio(
            f"{name} orchestration $ per 1M steps (anchor: Step Functions Standard)",
            ours * per_million,
            data["anchor_per_step"] * per_million,
            ours / data["anchor_per_step"],
            at_most=COST_TARGETS.get(name),
        ),
        Row.with_ratio(
            f"{name} orchestration $ per 1M steps (anchor: Lambda durable functions, "
            f"{data['durable']['operations']:,} operations by its local runner)",
            ours * per_million,
            data["durable_per_step"] * per_million,
            ours / data["durable_per_step"],
            at_most=DURABLE_TARGETS.get(name),
        ),
    ]
    express = data["express"]
    if express["can_run"]:
        latency = f"{express['remote_latency_seconds'] * 1000:g} ms"
        table += [
            Row.with_ratio(
                f"{name} orchestration $ per 1M steps (anchor: Step Functions Express, {latency} per call, no logging)",
                ours * per_million,
                data["express_per_step"] * per_million,
                ours / data["express_per_step"],
            ),
            Row.with_ratio(
                f"{name} orchestration $ per 1M steps (anchor: Step Functions Express, {latency} per call, "
                "execution history to CloudWatch Logs)",
                ours * per_million,
                data["express_logged_per_step"] * per_million,
                ours / data["express_logged_per_step"],
            ),
        ]
    else:
        table.append(Row(f"{name} Step Functions Express", f"cannot run: {express['cannot_run']}"))
    whole = data["whole_bill"]
    latency = f"{whole['remote_latency_seconds'] * 1000:g} ms"
    table += [
        Row.with_ratio(
            f"{name} whole bill $ per 1M steps, {latency} per call, agents' Lambda included "
            "(anchor: Step Functions Standard with HTTP Tasks)",
            data["whole_per_step"] * per_million,
            data["whole_standard_per_step"] * per_million,
            data["whole_per_step"] / data["whole_standard_per_step"],
            at_most=WHOLE_STANDARD_TARGETS.get(name),
        ),
        Row.with_ratio(
            f"{name} whole bill $ per 1M steps, {latency} per call, agents' Lambda included "
            f"(anchor: Lambda durable functions waiting for each call at {whole['durable']['memory_mb']} MB)",
            data["whole_per_step"] * per_million,
            data["whole_durable_per_step"] * per_million,
            data["whole_per_step"] / data["whole_durable_per_step"],
            at_most=WHOLE_DURABLE_TARGETS.get(name),
        ),
    ]
    table += [
        Row.with_ratio(
            f"{name} $ per 1M workflows ({len(result.definition['steps'])} steps)",
            data["ours_per_workflow"] * per_million,
            data["anchor_per_workflow"] * per_million,
            data["ours_per_workflow"] / data["anchor_per_workflow"],
        ),
        Row(
            f"{name} a start's own cost ({_START_LABEL[data['start']['through']]})",
            f"${data['start']['dollars_per_start'] * per_million:,.2f} per 1M starts "
            f"({data['start']['invocations_per_start']:.2f} invocations of {data['start']['function']} a start)",
        ),
        Row(
            f"{name} fixed costs (supervisor schedule, idle long polls), share of ours",
            f"{data['fixed_share']:.1%} ({data['supervisor_runs']} supervisor runs)",
        ),
        Row(
            f"{name} CloudWatch Logs per workflow (engine functions' lines and metrics, at LogLevel INFO)",
            f"{data['log_bytes_per_workflow']:,.0f} bytes, {data['logs_share']:.1%} of ours",
        ),
        Row(
            f"{name} the agents' call limits (hotels: 5 in flight, 10/s), included above, per step",
            f"{data['call_limits']['requests_per_step']:.3f} requests, "
            f"${data['call_limits']['dollars_per_step'] * per_million:.3f} per 1M steps",
        ),
        *_tenancy_rows(name, data, result),
        Row.with_ratio(
            f"{name} AWS requests per step (anchor: minimal)",
            data["actual_requests_per_step"],
            data["minimal_requests_per_step"],
            data["actual_requests_per_step"] / data["minimal_requests_per_step"],
            at_most=request_target,
        ),
    ]
    return table


def _tenancy_rows(name: str, data: dict[str, Any], result: ScenarioResult) -> list[Row]:
    """What the tenants' limits cost, included in the scenario's figures (a scenario whose definition has them)."""
    if not result.scenario.max_running:
        return []
    tenancy = data["tenancy"]
    return [
        Row(
            f"{name} the tenants' limits (their TENANCY# items: slots, queue entries, the queues' looks), included "
            "above, per step",
            f"{tenancy['requests_per_step']:.3f} requests, ${tenancy['dollars_per_step'] * 1_000_000:.3f} per 1M "
            f"steps; {tenancy['queued']:,} of {result.workflows:,} workflows queued",
        )
    ]


def p95(values: list[float]) -> float:
    """The 95th percentile by nearest rank (of 20 values: the 19th smallest)."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)])


def fairness_row(together: dict[str, Any], alone: dict[str, Any]) -> Row:
    """S7: the quiet tenant's p95 from start to end beside the bursting tenant's burst, over its p95 alone."""
    beside = p95(together["tenancy"]["durations"]["quiet"])
    baseline = p95(alone["tenancy"]["durations"]["quiet"])
    burst = together["tenancy"]["durations"].get("burst", [])
    return Row.with_ratio(
        f"S7 the quiet tenant's p95 start to end, s ({len(together['tenancy']['durations']['quiet'])} workflows beside "
        f"{len(burst):,} the other tenant started at once, whose last ended after {max(burst, default=0):,.0f} s; "
        "anchor: the same alone, S7-alone)",
        beside,
        baseline,
        beside / baseline if baseline else math.inf,
        at_most=FAIRNESS_TARGET,
    )

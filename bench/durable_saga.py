"""The anchor: the same saga written as an AWS Lambda durable function, run by the SDK's local testing runner.

`trip_saga` is real ``aws-durable-execution-sdk-python`` code, written the way its README writes a workflow: one
``context.step`` per task step (the remote call, with a retry strategy of the same call budget our definition
gives the step, retrying only transient errors), ``context.wait_for_callback`` for a callback step (its submitter
step hands the callback id to the notifier, as our ``notify`` and Step Functions' ``.waitForTaskToken`` do), and,
when a step is rejected or given up, one ``context.step`` per compensation, in reverse order.

The remote services are a script: for each step, how many calls the service received in our run and how the last
one ended (`StepPlan`), so the durable function makes exactly the calls our run made (an invocation of ours lost
before its call is one more failed attempt there, retried like a transient error). `run_plans` runs the function
with ``DurableFunctionTestRunner`` (real clock: the runner's skip clock fires the execution timeout while a
callback waits) and reads what the runner recorded in the execution's history:

- **operations**: every ``*Started`` event but the execution's own (a step's, a retry attempt's, a callback's, the
  child context ``wait_for_callback`` runs in); not counting the start of the execution can only make the anchor
  cheaper;
- **bytes written**: the payloads the history holds (the execution's input and result, each step's result or
  error, each callback's result), with ``include_execution_data``;
- **invocations**: the ``InvocationCompleted`` events (the first invocation and every replay after a retry's
  delay or a callback).

Workflows with the same plan have the same counts, so each distinct plan runs once and is weighted by how many
workflows had it (`durable_counts`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aws_durable_execution_sdk_python.config import (
    Duration,
    JitterStrategy,
    StepConfig,
    WaitForCallbackConfig,
)
from aws_durable_execution_sdk_python.context import DurableContext, durable_step
from aws_durable_execution_sdk_python.exceptions import CallbackError, StepError
from aws_durable_execution_sdk_python.execution import durable_execution
from aws_durable_execution_sdk_python.lambda_service import InvocationStatus
from aws_durable_execution_sdk_python.retries import RetryStrategyConfig, create_retry_strategy
from aws_durable_execution_sdk_python.types import StepContext
from aws_durable_execution_sdk_python_testing.runner import DurableFunctionTestRunner

from bench.asl import DEFAULT_COMPENSATION_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, StepObservation

#: Real seconds to wait for one execution in the runner.
RUN_TIMEOUT_SECONDS = 120
#: Runners at once (they mostly sleep through their retries' delays).
PARALLEL_RUNS = 8


@dataclass(frozen=True)
class StepPlan:
    """What the remote service does for one step of one workflow (from our run).

    Attributes
    ----------
    name:
        The step's name.
    kind:
        ``"task"`` or ``"callback"``.
    calls:
        Calls the service receives for the forward action; every call but the last fails transiently.
    outcome:
        How the last call ends: ``"ok"``, ``"rejected"`` (nothing happened) or ``"failed"`` (gave up: the
        action may have happened, so it is undone too).
    budget:
        The step's call budget (the retry strategy's ``max_attempts``).
    compensation_calls, compensation_ok:
        Calls the compensation receives (every one but the last fails transiently) and whether it succeeds.
    """

    name: str
    kind: str = "task"
    calls: int = 1
    outcome: str = "ok"
    budget: int = DEFAULT_MAX_ATTEMPTS * DEFAULT_MAX_ATTEMPTS
    compensation_calls: int = 0
    compensation_ok: bool = True
    compensation_budget: int = DEFAULT_COMPENSATION_ATTEMPTS


@dataclass(frozen=True)
class DurableCounts:
    """What the runner recorded for one execution (or the sum over a scenario's workflows)."""

    executions: int
    operations: int
    retries: int
    bytes_written: int
    invocations: int
    statuses: dict[str, int]
    #: Calls the function made to remote services (every attempt of every step and compensation, and a callback's
    #: notification): each one keeps its invocation waiting for the service's answer.
    remote_calls: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "operations": self.operations,
            "retries": self.retries,
            "bytes_written": self.bytes_written,
            "invocations": self.invocations,
            "statuses": dict(self.statuses),
            "remote_calls": self.remote_calls,
        }


class RemoteTransient(Exception):
    """The remote service answered 5xx: the step's retry strategy retries it."""


class RemoteRejected(Exception):
    """The remote service refused the action: nothing happened, not retried."""


class RemoteGaveUp(Exception):
    """The call budget ran out on an attempt whose effect is unknown: not retried, undone."""


class _Script:
    """The calls each (workflow, step, phase) has received, shared by the invocations of one runner."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.plans: dict[str, tuple[StepPlan, ...]] = {}
        self.notified: dict[str, str] = {}
        self.lock = threading.Lock()

    def reset(self, workflow: str, plans: tuple[StepPlan, ...]) -> None:
        """Start ``workflow`` over with ``plans``: no call made yet."""
        with self.lock:
            self.plans[workflow] = plans
            self.notified.pop(workflow, None)
            for key in [key for key in self.calls if key[0] == workflow]:
                del self.calls[key]

    def call(self, workflow: str, step: str, phase: str) -> dict[str, Any]:
        plan = next(p for p in self.plans[workflow] if p.name == step)
        with self.lock:
            self.calls[(workflow, step, phase)] += 1
            made = self.calls[(workflow, step, phase)]
        planned = plan.calls if phase == "action" else plan.compensation_calls
        if made < planned:
            raise RemoteTransient("503 transient")
        if phase == "compensation":
            if not plan.compensation_ok:
                raise RemoteGaveUp("compensation gave up")
            return {"undone": step}
        if plan.outcome == "rejected":
            raise RemoteRejected("rejected")
        if plan.outcome == "failed":
            raise RemoteGaveUp("gave up, outcome unknown")
        return {"confirmation": f"{step}-{workflow}"}


_SCRIPT = _Script()


def _retry(budget: int) -> StepConfig:
    # Retries without delay (the runner waits real seconds): the count of attempts is what is billed.
    config = RetryStrategyConfig(
        max_attempts=budget,
        initial_delay=Duration.from_seconds(0),
        jitter_strategy=JitterStrategy.NONE,
        retryable_error_types=[RemoteTransient],
    )
    return StepConfig(retry_strategy=create_retry_strategy(config))


@durable_step
def remote_call(step_context: StepContext, workflow: str, step: str, phase: str) -> dict[str, Any]:
    """The agent's call to the remote service (the part Step Functions' Task and our agent make too)."""
    return _SCRIPT.call(workflow, step, phase)


@durable_execution
def trip_saga(event: dict[str, Any], context: DurableContext) -> dict[str, Any]:
    """The saga of one workflow (a chain: its steps are the code's, here `StepPlan`s looked up by the workflow),
    compensated in reverse order when a step is rejected or gives up. ``event`` is the workflow's input."""
    workflow = event["workflow"]
    done: list[StepPlan] = []
    outputs: dict[str, Any] = {}
    for plan in _SCRIPT.plans[workflow]:
        try:
            if plan.kind == "callback":
                outputs[plan.name] = context.wait_for_callback(
                    _notifier(workflow), name=plan.name, config=WaitForCallbackConfig()
                )
                continue
            outputs[plan.name] = context.step(
                remote_call(workflow, plan.name, "action"), name=plan.name, config=_retry(plan.budget)
            )
            done.append(plan)
        except (StepError, CallbackError) as error:
            if "RemoteGaveUp" in getattr(error, "error_type", ""):
                done.append(plan)
            for undo in reversed(done):
                context.step(
                    remote_call(workflow, undo.name, "compensation"),
                    name=f"undo {undo.name}",
                    config=_retry(undo.compensation_budget),
                )
            return {"status": "COMPENSATED"}
    return {"status": "COMPLETED", "steps": outputs}


def _notifier(workflow: str) -> Any:
    """The submitter: hands the callback id to whoever answers it (here the runner's caller, `run_plans`)."""

    def notify(callback_id: str, _context: Any) -> None:
        _SCRIPT.notified[workflow] = callback_id

    return notify


def plans_for(definition: dict[str, Any], observed: dict[str, StepObservation]) -> tuple[StepPlan, ...]:
    """The plans of one workflow: its steps that ran, with what the remote service did in our run."""
    plans = []
    for step in definition["steps"]:
        fact = observed.get(step["name"])
        if fact is None or not fact.ran:
            break
        retry = step.get("retry") or {}
        if step.get("type") == "callback":
            plans.append(StepPlan(step["name"], "callback", 0, fact.outcome, 1))
            continue
        per_attempt = int(retry.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
        comp_retry = (step.get("compensation") or {}).get("retry") or {}
        plans.append(
            StepPlan(
                step["name"],
                calls=max(1, fact.calls),
                outcome=fact.outcome,
                budget=per_attempt * per_attempt,
                compensation_calls=fact.compensation_calls,
                compensation_ok=fact.compensation_ok,
                compensation_budget=int(comp_retry.get("max_attempts", DEFAULT_COMPENSATION_ATTEMPTS)),
            )
        )
    return tuple(plans)


def run_plans(plans: tuple[StepPlan, ...], workflow_input: dict[str, Any], *, workflow: str = "w-1") -> DurableCounts:
    """Run `trip_saga` once with ``plans`` in the SDK's local testing runner and count what it recorded.

    Raises
    ------
    RuntimeError
        When the execution does not succeed (the saga returns COMPLETED or COMPENSATED; anything else is a bug).
    """
    # The SDK logs every failed attempt with its traceback; the planned failures are not news.
    logging.getLogger("aws_durable_execution_sdk_python").setLevel(logging.CRITICAL)
    logging.getLogger("aws_durable_execution_sdk_python_testing").setLevel(logging.CRITICAL)
    _SCRIPT.reset(workflow, plans)
    event = {"workflow": workflow, **workflow_input}
    with DurableFunctionTestRunner(handler=trip_saga, skip_time=False, poll_interval=0.01) as runner:
        arn = runner.run_async(input=json.dumps(event), execution_timeout=RUN_TIMEOUT_SECONDS)
        for plan in plans:
            if plan.kind != "callback":
                continue
            callback_id = runner.wait_for_callback(arn, timeout=RUN_TIMEOUT_SECONDS)
            if plan.outcome == "ok":
                runner.send_callback_success(callback_id, json.dumps({"approved_by": "approver"}).encode())
            else:
                runner.send_callback_failure(callback_id)
            break  # one callback per workflow in our scenarios; the next would need the first answered
        result = runner.wait_for_result(arn, timeout=RUN_TIMEOUT_SECONDS)
        history = runner.get_execution_history(arn, include_execution_data=True)
    if result.status is not InvocationStatus.SUCCEEDED:
        raise RuntimeError(f"the durable saga ended {result.status}: {result.error}")
    with _SCRIPT.lock:
        calls = sum(n for (called, _step, _phase), n in _SCRIPT.calls.items() if called == workflow)
    notifications = sum(1 for plan in plans if plan.kind == "callback")  # the submitter's call to the notifier
    events = [event.to_dict() for event in history.events]
    started = [e for e in events if e["EventType"].endswith("Started") and e["EventType"] != "ExecutionStarted"]
    first_starts = {e["Id"] for e in started}
    status = json.loads(result.result or "{}").get("status", "?")
    return DurableCounts(
        executions=1,
        operations=len(started),
        retries=len(started) - len(first_starts),
        bytes_written=sum(_payload_bytes(e) for e in events),
        invocations=sum(1 for e in events if e["EventType"] == "InvocationCompleted"),
        statuses={status: 1},
        remote_calls=calls + notifications,
    )


def _payload_bytes(event: dict[str, Any]) -> int:
    """Bytes of the payloads one history event carries (inputs, results, errors)."""
    total = 0
    stack: list[Any] = [event]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "Payload":
                    text = item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))
                    total += len(text.encode())
                else:
                    stack.append(item)
        elif isinstance(value, list):
            stack.extend(value)
    return total


def durable_counts(
    definition: dict[str, Any],
    workflows: dict[str, dict[str, StepObservation]],
    workflow_input: dict[str, Any],
) -> dict[str, Any]:
    """The runner's counts summed over the workflows of one scenario (each distinct plan run once, weighted).

    Returns
    -------
    dict
        ``total`` (a `DurableCounts` as a dict) and ``plans`` (each distinct plan's counts and how many workflows
        had it), so results.json carries what each figure is made of.
    """
    by_plan: Counter[tuple[StepPlan, ...]] = Counter(plans_for(definition, observed) for observed in workflows.values())
    ordered = sorted(by_plan.items(), key=lambda item: -item[1])
    # Each retry waits a real second in the runner (the SDK's least delay): the plans run side by side.
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        runs = list(
            pool.map(lambda item: run_plans(item[1][0], workflow_input, workflow=f"w-{item[0]}"), enumerate(ordered))
        )
    totals = Counter[str]()
    statuses: Counter[str] = Counter()
    per_plan = []
    for (plans, weight), counts in zip(ordered, runs, strict=True):
        for key in ("executions", "operations", "retries", "bytes_written", "invocations", "remote_calls"):
            totals[key] += getattr(counts, key) * weight
        for status, n in counts.statuses.items():
            statuses[status] += n * weight
        per_plan.append({"workflows": weight, "plans": [p.__dict__ for p in plans], "counts": counts.as_dict()})
    total = DurableCounts(
        executions=totals["executions"],
        operations=totals["operations"],
        retries=totals["retries"],
        bytes_written=totals["bytes_written"],
        invocations=totals["invocations"],
        statuses=dict(statuses),
        remote_calls=totals["remote_calls"],
    )
    return {"total": total.as_dict(), "plans": per_plan}

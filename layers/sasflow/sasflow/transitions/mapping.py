"""Transitions of map steps: starting children in order under the concurrency, their reports, their unwind.

A map step (``definition.MapStep``) is in flight while its children run. Its own transitions only count
(``fanout.MapProgress``); what is done to a child (start it, check it, unwind it, collect the outputs) is a
``fanout.ChildCommand`` the scheduler carries out once the parent's write is stored (write-ahead, DESIGN Rule 1):
a crash between the two leaves the step in flight with a command not done, and the supervisor's check, once the
step's complete-by has passed, does it again (a start finds the child started; a child's report is applied once).

A child reports its end with a ``StepReply`` to its parent's step (``child``, ``child_status``), sent by the write
that ends it. A map step's reply without ``child`` is its tick: a message it sends itself to start what its
concurrency allows beyond the `LAUNCH_BATCH` one call starts.
"""

from __future__ import annotations

from typing import Any

from jmespath.exceptions import JMESPathError

from ..definition import MAX_MAP_ITEMS, MapStep
from ..errors import ClaimCheckMissingError, MapItemsNotEvaluatedError, PayloadTooLargeError
from ..expressions import RenderBudget, evaluate
from ..fanout import ChildCommand, MapProgress, ParentRef, child_id
from ..messages import StepError, StepReply, encode
from ..ports import Outgoing
from ..records import StepRecord
from ..states import Outcome, Phase, StepStatus, WorkflowStatus
from .base import TransitionBase, _output_too_large, _preparation_error, _settled

#: Children one call starts (or asks to unwind) at most: the rest follow by the step's tick, so no call runs long.
LAUNCH_BATCH = 100
_UNWOUND = frozenset({"COMPENSATED", "CANCELLED", "COMPENSATION_FAILED"})
#: The error of a map step whose child's id is held by another workflow (``SchedulerService._start_child``).
MAP_CHILD_ID_TAKEN = "MAP_CHILD_ID_TAKEN"


class MapTransitions(TransitionBase):
    """What happens to a map step: its children's starts and reports, its checks, its unwind."""

    _items_cache: list[Any] | None = None

    def _map_items(self, step: MapStep) -> list[Any]:
        """The step's items (its ``items`` evaluated over ``{input, steps}``; deterministic, as a step's input is).

        Raises
        ------
        MapItemsNotEvaluatedError
            When the value is not a list, or holds more than `MAX_MAP_ITEMS` items.
        ClaimCheckMissingError
            When a claim-checked payload it reads is missing.
        """
        if self._items_cache is not None:
            return self._items_cache
        context = self.context()  # claim-checked input and outputs resolved (ClaimCheckMissingError otherwise)
        try:
            value = evaluate(step.items, context, RenderBudget())
        except (JMESPathError, PayloadTooLargeError, RecursionError, TypeError, ValueError) as exc:
            raise MapItemsNotEvaluatedError(f"steps[{step.name}].items could not be evaluated: {exc}") from None
        if not isinstance(value, list):
            raise MapItemsNotEvaluatedError(
                f"steps[{step.name}].items is {type(value).__name__ if value is not None else 'null'}, not a list"
            )
        if len(value) > MAX_MAP_ITEMS:
            raise MapItemsNotEvaluatedError(
                f"steps[{step.name}].items holds {len(value)} items; a map step runs at most {MAX_MAP_ITEMS}"
            )
        self._items_cache = value
        return value

    def _parent_ref(self, step: MapStep, record: StepRecord, index: int) -> ParentRef:
        return ParentRef(workflow_id=self.workflow_id, step=step.name, attempt=record.attempt, index=index)

    def _child_id(self, step: MapStep, index: int) -> str:
        return child_id(self.workflow_id, self.definition.order.index(step.name), index)

    # ------------------------------------------------------------------ forward
    def _start_map(self, step: MapStep, attempt: int, base: StepRecord | None) -> None:
        """Put the map step in flight over its items; its tick starts the first children (never the start call)."""
        pending = base or StepRecord(step=step.name, status=StepStatus.PENDING)
        try:
            items = self._map_items(step)
        except (MapItemsNotEvaluatedError, ClaimCheckMissingError) as error:
            self._refuse(step.name, error)
            self.set_step(
                _settled(pending, StepStatus.FAILED, error=_preparation_error(error), may_have_happened=False)
            )
            return
        complete_by = self.now + step.timeout_seconds
        self.history.dispatched(step.name, Phase.ACTION, attempt, complete_by)
        record = pending.evolve(
            status=StepStatus.PROCESSING, attempt=attempt, complete_by=complete_by, map=MapProgress(total=len(items))
        )
        self.set_step(
            record
        )  # an empty list too: its tick completes it (a step completes by a write after its dispatch)
        self._tick(step, record)
        self.count("MapStepsStarted")

    def _tick(self, step: MapStep, record: StepRecord) -> None:
        tick = StepReply(
            workflow_id=self.workflow_id,
            step=step.name,
            phase=record.phase,
            attempt=record.attempt,
            outcome=Outcome.SUCCEEDED,
        )
        tock = Outgoing(queue_url=self.config.response_queue_url, body=encode(tick), workflow_id=self.workflow_id)
        self.messages.append(tock)

    def _launch(self, step: MapStep, record: StepRecord) -> None:
        """Start the children the concurrency has room for (at most `LAUNCH_BATCH`; the tick starts more)."""
        assert record.map is not None  # nosec B101 # narrows the type: a map step in flight has its progress
        progress, started = record.map.launch(LAUNCH_BATCH, step.max_concurrency)
        if not started:
            return
        items = self._map_items(step)
        for index in started:
            self.children.append(
                ChildCommand(
                    "start",
                    self._parent_ref(step, record, index),
                    self._child_id(step, index),
                    input={"item": items[index], "index": index},
                )
            )
        record = record.evolve(map=progress)
        self.set_step(record)
        self.count("MapChildrenStarted", len(started))
        if progress.launched < progress.total and progress.in_flight < step.max_concurrency:
            self._tick(step, record)  # room for more than one call starts: the next call starts them

    def _map_reply(self, record: StepRecord, reply: StepReply) -> None:
        """A map step's tick, or a child's report of its end."""
        step = self.definition.step(record.step)
        assert isinstance(step, MapStep)  # nosec B101 # narrows the type: only map steps' replies come here
        if reply.attempt != record.attempt:
            self.count("StaleReplies")
            return
        if record.status is StepStatus.PROCESSING:
            if reply.child is None:
                self._ticked(step, record)
                return
            if reply.child_status is None and reply.error is not None:
                self._child_refused(step, record, reply.error)
                return
            self._child_ended(step, record, reply.child, reply.child_status)
        elif record.status is StepStatus.COMPENSATING:
            if reply.child is None:
                self._launch_unwinds(step, record)
                return
            self._child_unwound(step, record, reply.child, reply.child_status)
        # a report to a map step that ended (completed, failed): its unwind, if any, asks every child again

    def _child_ended(self, step: MapStep, record: StepRecord, index: int, status: str | None) -> None:
        assert record.map is not None  # nosec B101 # narrows the type: a map step in flight has its progress
        progress = record.map.record(index, failed=status != WorkflowStatus.COMPLETED.value)
        if progress is None:
            self.count("DuplicateChildReports")
            return
        record = record.evolve(map=progress, complete_by=self.now + step.timeout_seconds)
        self.count("MapChildrenEnded")
        if progress.failed > step.tolerated(progress.total):
            error = StepError(
                code="MAP_FAILURE_TOLERANCE_EXCEEDED",
                message=f"{progress.failed} of {progress.total} children did not complete; "
                f"{step.tolerated(progress.total)} may (tolerated_failure {step.tolerated_failure!r})",
            ).model_dump()
            self.history.reply(step.name, Phase.ACTION, record.attempt, Outcome.REJECTED, 0, error["code"])
            self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=True))
            return
        self.set_step(record)
        self._ticked(step, record)

    def _child_refused(self, step: MapStep, record: StepRecord, error: StepError) -> None:
        """A child could not be started (its id is held by another workflow): the map step fails with the reason,
        and its unwind undoes the children that did run."""
        self.history.reply(step.name, Phase.ACTION, record.attempt, Outcome.REJECTED, 0, error.code)
        self.set_step(_settled(record, StepStatus.FAILED, error=error.model_dump(), may_have_happened=True))
        self.count("MapChildrenRefused")

    def _ticked(self, step: MapStep, record: StepRecord) -> None:
        """Start what the concurrency allows; once every child reported, collect their outputs or complete."""
        assert record.map is not None  # nosec B101 # narrows the type: a map step in flight has its progress
        if not record.map.finished:
            self._launch(step, record)
        elif step.collect and record.map.total:
            self._collect(step, record)
        else:
            self._map_completed(record, step, [] if step.collect else None)

    def _collect(self, step: MapStep, record: StepRecord) -> None:
        """Ask the scheduler to read the children's outputs (`complete_map` then completes the step)."""
        self.children.append(ChildCommand("collect", self._parent_ref(step, record, 0), ""))

    def complete_map(self, name: str, attempt: int, results: list[Any]) -> None:
        """Complete map step ``name`` (attempt ``attempt``) with its children's outputs, collected by the scheduler.

        Changes nothing unless that attempt is in flight with every child reported (a repeated collection).
        """
        record = self.snapshot.steps.get(name)
        step = self.definition.step(name)
        if (
            record is None
            or not isinstance(step, MapStep)
            or record.status is not StepStatus.PROCESSING
            or record.attempt != attempt
            or record.map is None
            or not record.map.finished
        ):
            return
        self._map_completed(record, step, results)
        self.advance()

    def _map_completed(self, record: StepRecord, step: MapStep, results: list[Any] | None) -> None:
        progress = record.map or MapProgress(total=0)
        output: dict[str, Any] = {
            "total": progress.total,
            "succeeded": progress.total - progress.failed,
            "failed": progress.failed,
        }
        if results is not None:
            output["results"] = results
        self.history.reply(step.name, Phase.ACTION, record.attempt, Outcome.SUCCEEDED, 0, None)
        if self.oversized:
            self.set_step(_settled(record, StepStatus.FAILED, error=_output_too_large(), may_have_happened=True))
            return
        value: Any = output
        if self.claims is not None:
            # Collected results above the claim-check threshold leave the parent's item (written before the write
            # that names them, as an agent writes its large output before its reply).
            try:
                value = self.claims.offload(self.workflow_id, output, what=f"the results of map step {step.name}")
            except PayloadTooLargeError:
                self.set_step(_settled(record, StepStatus.FAILED, error=_output_too_large(), may_have_happened=True))
                return
            if value is not output and not self.snapshot.workflow.claim_checked:
                self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(claim_checked=True))
        self.set_step(_settled(record, StepStatus.COMPLETED, output=value))
        self.count("MapStepsCompleted")

    def _map_timed_out(self, record: StepRecord, step: MapStep) -> None:
        """No child ended within the step's timeout: check the children in flight (never a failure by itself)."""
        self.history.resent(step.name, record.phase, record.attempt_for(record.phase))
        record = record.evolve(resends=record.resends + 1, complete_by=self.now + step.timeout_seconds)
        self.set_step(record)
        self.count("SupervisorResends")
        if record.status is StepStatus.PROCESSING:
            assert record.map is not None  # nosec B101 # narrows the type
            if record.map.finished:
                self._collect(step, record)
                return
            items = self._map_items(step)
            for index in record.map.pending():
                self.children.append(
                    ChildCommand(
                        "check",
                        self._parent_ref(step, record, index),
                        self._child_id(step, index),
                        input={"item": items[index], "index": index},
                    )
                )
            self._launch(step, record)
        else:
            assert record.comp_map is not None  # nosec B101 # narrows the type
            for index in record.comp_map.pending():
                self._unwind_command(step, record, index)
            self._launch_unwinds(step, record)

    # ------------------------------------------------------------------ unwind
    def _start_map_compensation(self, record: StepRecord) -> None:
        """Unwind the children started: each running one is cancelled, each completed one compensated."""
        step = self.definition.step(record.step)
        assert isinstance(step, MapStep)  # nosec B101 # narrows the type
        started = record.map.launched if record.map is not None else 0
        complete_by = self.now + step.timeout_seconds
        record = record.evolve(
            status=StepStatus.COMPENSATING, comp_attempt=1, complete_by=complete_by, comp_map=MapProgress(total=started)
        )
        self.history.dispatched(step.name, Phase.COMPENSATION, 1, complete_by)
        if started == 0:
            self._map_unwound(step, record)
            return
        self.set_step(record)
        self._launch_unwinds(step, record)

    def _launch_unwinds(self, step: MapStep, record: StepRecord) -> None:
        assert record.comp_map is not None  # nosec B101 # narrows the type
        progress, started = record.comp_map.launch(LAUNCH_BATCH, step.max_concurrency)
        if not started:
            return
        record = record.evolve(comp_map=progress)
        for index in started:
            self._unwind_command(step, record, index)
        self.set_step(record)
        if progress.launched < progress.total and progress.in_flight < step.max_concurrency:
            self._tick(step, record)

    def _unwind_command(self, step: MapStep, record: StepRecord, index: int) -> None:
        reported = record.map is not None and record.map.has(index)
        self.children.append(
            ChildCommand(
                "unwind", self._parent_ref(step, record, index), self._child_id(step, index), reported=reported
            )
        )

    def _child_unwound(self, step: MapStep, record: StepRecord, index: int, status: str | None) -> None:
        assert record.comp_map is not None  # nosec B101 # narrows the type
        if status not in _UNWOUND:
            return  # a completion reported before the unwind reached the child: it reports again once unwound
        progress = record.comp_map.record(index, failed=status == WorkflowStatus.COMPENSATION_FAILED.value)
        if progress is None:
            self.count("DuplicateChildReports")
            return
        record = record.evolve(comp_map=progress, complete_by=self.now + step.timeout_seconds)
        if progress.finished:
            self._map_unwound(step, record)
            return
        self.set_step(record)
        self._launch_unwinds(step, record)

    def _map_unwound(self, step: MapStep, record: StepRecord) -> None:
        progress = record.comp_map or MapProgress(total=0)
        if progress.failed:
            error = StepError(
                code="CHILD_COMPENSATION_FAILED",
                message=f"{progress.failed} of {progress.total} children could not be compensated: see them with "
                "their ids (<workflow id>:<step index>:<item index>)",
            ).model_dump()
            self.history.reply(step.name, Phase.COMPENSATION, record.comp_attempt, Outcome.REJECTED, 0, error["code"])
            self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=error))
            return
        self.history.reply(step.name, Phase.COMPENSATION, record.comp_attempt, Outcome.SUCCEEDED, 0, None)
        self.set_step(_settled(record, StepStatus.COMPENSATED))

    # ------------------------------------------------------------------ the child's side
    def unwind_by_parent(self) -> None:
        """This workflow is a child whose parent unwinds: cancel it if running or held, compensate it if completed.

        One that unwinds or has unwound already is left as it is (its report goes, or went, to the parent).
        """
        workflow = self.snapshot.workflow
        if workflow.status in (WorkflowStatus.RUNNING, WorkflowStatus.HELD):
            self.history.parent_unwound()
            self.set_status(WorkflowStatus.CANCELLING, reason="its parent unwound")
            self.advance()
        elif workflow.status is WorkflowStatus.COMPLETED:
            self.history.parent_unwound()
            self.snapshot = self.snapshot.with_workflow(workflow.evolve(expires_at=None))
            self.set_status(WorkflowStatus.COMPENSATING, reason="its parent unwound")
            self.advance()

"""Batches: one operator action on every workflow a filter matches, resumable, acting on no workflow twice.

A batch is an item of its own (DESIGN "Batches"): the action, the filter (the listing's: ``finding.WorkflowFinder``),
who asked and why, and its progress. A runner works through it a page at a time:

1. **claim** a page: the finder's next page of matching workflow ids is written as a page item, and the batch's
   cursor moves past it, in one transaction conditional on the batch's version (two runners cannot claim one page);
2. **act** on each workflow of the page with ``SchedulerService.operate``, under an Idempotency-Key derived from the
   batch id and the workflow id (`action_key`): an action the workflow's history holds already changes nothing;
3. **settle** the page: its outcomes (done, refused with the reason, failed with the error) are written to the page
   item and added to the batch's counts, conditional on the batch's version.

A runner that stops anywhere (a crash, a timeout) leaves at most one page claimed and not settled; the next run acts
on that page again, which changes nothing for the workflows acted on already (their histories hold the key), then
settles it. So each workflow is counted once and acted on at most once, whatever stops where. A workflow is "done"
when its history holds an operator action with the batch's key for it: the answer is read from the workflow as
stored, never assumed.

Runs are chained by messages (the batch function's queue, one message a run): a run acts for at most
``max_per_second * RUN_SECONDS`` workflows, and the next run's message is delayed so that the batch stays under its
rate. Only the message whose token the batch holds continues it (`Batch.runner`): a duplicate of an older message,
or one sent by a run that then failed to hand the batch over, is dropped, so one chain runs a batch.

Lineage: each action's history event carries the batch id (``batch``), and the page items list what the batch
touched (``sasflow list --batch``).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, astuple, dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .clock import Clock, epoch_seconds
from .errors import (
    BatchNotFoundError,
    ConditionFailedError,
    ConfigurationError,
    IdempotencyKeyConflictError,
    MalformedMessageError,
    PermanentError,
    RetryableError,
)
from .finding import WorkflowFinder
from .limits import DEFAULT_BATCH_RATE as DEFAULT_RATE
from .limits import MAX_BATCH_RATE as MAX_RATE
from .limits import MAX_STEP_INPUT_BYTES, json_size
from .ports import BatchStore, MessageBus, Outgoing
from .scheduler import OPERATOR_ACTIONS, SchedulerService
from .transitions import NO_OUTPUT

__all__ = [
    "BATCH_ACTIONS",
    "DEFAULT_RATE",
    "MAX_RATE",
    "PAGE_SIZE",
    "Batch",
    "BatchFilter",
    "BatchPage",
    "BatchRun",
    "BatchRunner",
    "BatchService",
    "Counts",
    "Preview",
    "RunResult",
    "action_key",
    "batch_id_for",
    "cancel",
    "new_batch",
    "preview",
    "touched",
]

#: The actions a batch can take: the operator actions (``scheduler.OPERATOR_ACTIONS``).
BATCH_ACTIONS = OPERATOR_ACTIONS
#: Workflows a page holds: one claim, one settle and this many actions.
PAGE_SIZE = 25
#: What one run acts on, at most: this many seconds at the batch's rate (the next run's message is delayed for the
#: rest of them, if the run was faster).
RUN_SECONDS = 30
#: The longest delay of an SQS message (the next run's).
MAX_DELAY_SECONDS = 900
#: A dry run counts at most this many matching workflows (it pages through the finder as a batch would).
MAX_PREVIEW = 100_000
#: Sample ids a dry run answers with.
PREVIEW_SAMPLE = 20
#: Tries of an action that fails with a retryable error (contention, throttling) before it counts as failed.
ACTION_TRIES = 3

BatchStatus = Literal["RUNNING", "COMPLETED", "CANCELLED"]
#: Statuses of ended workflows: a batch's filter cannot name them (no action applies; listing them is a table scan).
FINISHED = ("COMPLETED", "COMPENSATED", "CANCELLED")
#: Statuses listed from the attention index, newest first (``finding``): a workflow never comes back after the cursor.
ATTENTION_STATUSES = ("HELD", "PAUSED", "COMPENSATION_FAILED")


def action_key(batch_id: str, workflow_id: str) -> str:
    """The Idempotency-Key of a batch's action on one workflow: derived from both, so any run of the batch, and only
    that batch, finds its own action in the workflow's history.

    Returns
    -------
    str
        ``batch:<batch id>:<24 hex digits of the workflow id's SHA-256>`` (an ``IdempotencyKey``).
    """
    digest = hashlib.sha256(workflow_id.encode()).hexdigest()[:24]
    return f"batch:{batch_id}:{digest}"


_BATCH_NAMESPACE = uuid.UUID("0b7c3e52-9d0e-4f0a-8a3c-6d1f5b2e7a41")


def batch_id_for(principal: str, idempotency_key: str | None) -> str:
    """A new batch's id: derived from the caller and its Idempotency-Key (a repeated request names the same batch),
    or random without a key.

    Returns
    -------
    str
        ``b-`` and 20 hex digits.
    """
    if idempotency_key is None:
        return f"b-{uuid.uuid4().hex[:20]}"
    name = principal + "\n" + idempotency_key
    return "b-" + uuid.uuid5(_BATCH_NAMESPACE, name).hex[:20]


@dataclass(frozen=True)
class BatchFilter:
    """Which workflows a batch acts on: the listing's filters (``GET /ops/workflows``), each optional."""

    status: str | None = None
    definition: str | None = None
    version: int | None = None
    error_code: str | None = None
    trigger: str | None = None
    owner: str | None = None
    started_after: int | None = None
    started_before: int | None = None
    step: str | None = None

    def given(self) -> dict[str, Any]:
        """The filters given (None left out), as the finder takes them."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> BatchFilter:
        """The filter of stored ``values`` (unknown names are an error)."""
        return cls(**dict(values))


@dataclass(frozen=True)
class Counts:
    """A batch's progress: workflows matched (claimed in pages), acted on (done), refused (the action did not
    apply: the reason is in the page), failed (an error: retry the batch's workflows later)."""

    matched: int = 0
    done: int = 0
    refused: int = 0
    failed: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class Batch:
    """A batch as stored (``ports.BatchStore``). Times are epoch seconds.

    ``pages`` counts the pages claimed, ``settled`` those whose outcomes are in ``counts``: ``settled <= pages <=
    settled + 1``. ``cursor`` is the finder's where the next page starts (None: from the start, unless
    ``exhausted``). ``runner``: the token of the message that continues the batch. ``version`` orders its writes.
    """

    batch_id: str
    action: str
    where: BatchFilter
    principal: str
    reason: str
    created_at: int
    step: str | None = None
    max_per_second: int = DEFAULT_RATE
    status: BatchStatus = "RUNNING"
    counts: Counts = field(default_factory=Counts)
    cursor: str | None = None
    exhausted: bool = False
    pages: int = 0
    settled: int = 0
    runner: str | None = None
    updated_at: int = 0
    ended_at: int | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    #: A skip's output, as JSON text (None: the skip gives none).
    output: str | None = None
    version: int = 0

    @property
    def finished(self) -> bool:
        """Whether it ended (COMPLETED or CANCELLED): no run continues it."""
        return self.status != "RUNNING"


@dataclass(frozen=True)
class BatchPage:
    """A page of a batch: the workflows it claimed, in the finder's order, and once settled what became of each:
    ``done``, ``refused: <reason>`` or ``failed: <error>``."""

    batch_id: str
    number: int
    workflow_ids: tuple[str, ...]
    outcomes: Mapping[str, str] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Whether every workflow of the page has its outcome."""
        return len(self.outcomes) == len(self.workflow_ids)

    def counts(self) -> Counts:
        """What the page adds to its batch's counts (a ``repeat``, met again on a later page, is not counted)."""
        kinds = [o.partition(":")[0] for o in self.outcomes.values()]
        matched = len(self.workflow_ids) - kinds.count("repeat")
        return Counts(matched, kinds.count("done"), kinds.count("refused"), kinds.count("failed"))


@dataclass(frozen=True)
class RunResult:
    """What a run did: the batch as it left it, the workflows it acted on, and the delay of the next run's message
    (None: nothing continues it, as it ended or another run holds it)."""

    batch: Batch | None
    acted: int
    delay: int | None


@dataclass(frozen=True)
class Preview:
    """A dry run: how many workflows the filter matches now (at most `MAX_PREVIEW`), by status, and the first ids."""

    matched: int
    by_status: dict[str, int]
    sample: list[str]
    truncated: bool
    #: Of those matched, the workflows whose step (the batch's) holds no failure: a step action would refuse them.
    step_not_failed: int = 0


def _pages(finder: WorkflowFinder, where: BatchFilter, cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
    page = finder.find(**where.given(), limit=limit, cursor=cursor, counts=False)
    return page.workflows, page.cursor


def preview(
    finder: WorkflowFinder, where: BatchFilter, *, step: str | None = None, limit: int = MAX_PREVIEW
) -> Preview:
    """What a batch with this filter would act on now, counted by the same pages a run reads (a dry run); with the
    ``step`` of a step action, how many of them it would refuse because that step holds no failure (a workflow whose
    item predates the failed steps' attribute, errors but no failed step recorded, is not counted: unknown)."""
    by_status: dict[str, int] = {}
    sample: list[str] = []
    matched = 0
    not_failed = 0
    cursor: str | None = None
    while True:
        summaries, cursor = _pages(finder, where, cursor, 1000)
        for summary in summaries:
            matched += 1
            known = bool(summary.error_steps) or not summary.error_codes
            if step is not None and known and step not in summary.error_steps:
                not_failed += 1
            status = summary.attention if where.status == "PAUSED" and summary.attention else summary.status
            by_status[status] = by_status.get(status, 0) + 1
            if len(sample) < PREVIEW_SAMPLE:
                sample.append(summary.workflow_id)
        if cursor is None or matched >= limit:
            return Preview(matched, by_status, sample, truncated=cursor is not None, step_not_failed=not_failed)


class BatchRunner:
    """Work a batch through, a page at a time (module docstring).

    Parameters
    ----------
    store:
        The batches' items.
    finder:
        The workflows' listing (its pages are the batch's).
    scheduler:
        What acts on a workflow (``SchedulerService.operate``).
    bus:
        Sends what an action dispatches (a message not sent is resent by the supervisor after its complete-by).
    clock:
        The time (injected).
    page_size:
        Workflows a page claims.
    monotonic:
        Seconds, to time a run (the clock's by default).
    """

    def __init__(
        self,
        store: BatchStore,
        finder: WorkflowFinder,
        scheduler: SchedulerService,
        bus: MessageBus,
        clock: Clock,
        *,
        page_size: int = PAGE_SIZE,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.finder = finder
        self.scheduler = scheduler
        self.bus = bus
        self.clock = clock
        self.page_size = page_size
        #: Seconds, for a run's elapsed time (the injected clock's unless given).
        self.monotonic = monotonic or clock.now
        #: The pages this runner claimed (batch id, number): acted on by none before.
        self._claimed: set[tuple[str, int]] = set()

    def now(self) -> int:
        """Epoch seconds."""
        return epoch_seconds(self.clock)

    # ------------------------------------------------------------------ one run
    def run(self, batch_id: str, token: str, *, should_stop: Callable[[], bool] = lambda: False) -> RunResult:
        """One run of the batch under message ``token``: settle a page left claimed, then claim, act and settle
        pages until the run's share (``max_per_second * RUN_SECONDS`` workflows) is done, ``should_stop`` says so
        (the function's time is running out), or the batch ends.

        A batch held by another token is left alone (``delay`` None): its own chain continues it.
        """
        started = self.monotonic()
        self._claimed.clear()
        batch = self.store.get(batch_id, consistent=True)
        if batch is None or (batch.finished and batch.pages == batch.settled):
            return RunResult(batch, 0, None)
        if batch.runner is None:
            try:
                batch = self.store.put(replace(batch, runner=token), expect=batch.version)
            except ConditionFailedError:
                return self.run(batch_id, token, should_stop=should_stop)
        if batch.runner != token:
            return RunResult(batch, 0, None)
        share = batch.max_per_second * RUN_SECONDS
        acted = 0
        # A cancelled batch claims nothing more, but the page it claimed is acted on and settled (its workflows
        # may have been acted on already by a run that stopped: their outcomes are counted).
        while (not batch.finished or batch.pages > batch.settled) and acted < share and not should_stop():
            try:
                batch, n = self._step(batch)
            except ConditionFailedError:
                # Another write came first (a cancel, or a run of an older token before it saw ours): read again.
                fresh = self.store.get(batch_id, consistent=True)
                if fresh is None or fresh.runner != token:
                    return RunResult(fresh, acted, None)
                batch = fresh
                continue
            acted += n
        if batch.finished and batch.pages == batch.settled:
            return RunResult(batch, acted, None)
        elapsed = self.monotonic() - started
        delay = min(MAX_DELAY_SECONDS, max(0, math.ceil(acted / batch.max_per_second - elapsed)))
        return RunResult(batch, acted, delay)

    def hand_over(self, batch: Batch, token: str, next_token: str) -> Batch | None:
        """Make ``next_token`` (the message just sent for the next run) the batch's runner, if ``token`` still is.

        Returns the batch as stored, or None when another token holds it or it ended (that message is then dropped
        when it arrives).
        """
        while True:
            if (batch.finished and batch.pages == batch.settled) or batch.runner != token:
                return None
            try:
                return self.store.put(replace(batch, runner=next_token, updated_at=self.now()), expect=batch.version)
            except ConditionFailedError:
                fresh = self.store.get(batch.batch_id, consistent=True)
                if fresh is None:
                    return None
                batch = fresh

    def _step(self, batch: Batch) -> tuple[Batch, int]:
        """One move: settle the claimed page, or claim the next, or complete the batch. Returns the batch and the
        workflows acted on."""
        if batch.pages > batch.settled:
            page = self.store.page(batch.batch_id, batch.pages)
            if page is None:  # never: the claim writes the page and the batch together
                raise ConditionFailedError(f"batch {batch.batch_id} lost its page {batch.pages}")
            settled = self._act(batch, page, fresh=(batch.batch_id, page.number) in self._claimed)
            counts = batch.counts + settled.counts()
            after = replace(batch, settled=page.number, counts=counts, updated_at=self.now())
            return self.store.settle(after, settled), len(page.workflow_ids)
        if batch.finished:  # cancelled, its claimed page settled above: nothing more
            return batch, 0
        if batch.exhausted:
            ended = replace(batch, status="COMPLETED", ended_at=self.now(), updated_at=self.now())
            return self.store.put(ended, expect=batch.version), 0
        summaries, cursor = _pages(self.finder, batch.where, batch.cursor, self.page_size)
        ids = tuple(dict.fromkeys(s.workflow_id for s in summaries))
        claimed = replace(batch, pages=batch.pages + 1, cursor=cursor, exhausted=cursor is None, updated_at=self.now())
        if not ids:
            # An empty page (the filter matched none of the items a page read): nothing to act on or settle.
            return self.store.put(replace(claimed, pages=batch.pages), expect=batch.version), 0
        stored = self.store.claim(claimed, BatchPage(batch.batch_id, claimed.pages, ids))
        self._claimed.add((batch.batch_id, claimed.pages))
        return stored, 0

    def _act(self, batch: Batch, page: BatchPage, *, fresh: bool) -> BatchPage:
        """Act on each workflow of the page (again, for those acted on by a run that stopped): its outcomes.

        A workflow of the in-flight listing can come back on a later page (its earliest complete-by moved past the
        cursor): on a page this run claimed (``fresh``: nothing of it was acted on yet), a workflow whose history
        holds the batch's action already is a ``repeat``, not counted again. The attention listing is newest
        first: a workflow held again comes back before the cursor, never after it.
        """
        check = fresh and batch.where.status not in ATTENTION_STATUSES
        outcomes: dict[str, str] = {}
        for workflow_id in page.workflow_ids:
            if check:
                before = self.scheduler.store.load(workflow_id, consistent=True)
                if before is not None and before.operator_action(action_key(batch.batch_id, workflow_id)) is not None:
                    outcomes[workflow_id] = "repeat: acted on in an earlier page of this batch"
                    continue
            outcomes[workflow_id] = self._act_on(batch, workflow_id)
        return replace(page, outcomes=outcomes)

    def _act_on(self, batch: Batch, workflow_id: str) -> str:
        key = action_key(batch.batch_id, workflow_id)
        error: Exception | None = None
        for _ in range(ACTION_TRIES):
            try:
                stored, messages = self.scheduler.operate(
                    workflow_id,
                    batch.action,
                    principal=batch.principal,
                    reason=batch.reason,
                    action_id=key,
                    step=batch.step,
                    output=NO_OUTPUT if batch.output is None else json.loads(batch.output),
                    batch=batch.batch_id,
                )
            except (PermanentError, ConditionFailedError) as exc:
                return f"refused: {exc}"
            except RetryableError as exc:
                error = exc
                continue
            except Exception as exc:  # one workflow's error is its outcome, not the batch's end
                return f"failed: {type(exc).__name__}: {exc}"
            if messages:
                self.bus.send(messages)
            if stored.operator_action(key) is not None:
                return "done"
            return f"refused: workflow is {stored.workflow.status.value}: nothing to {batch.action}"
        return f"failed: {type(error).__name__}: {error}"


class BatchRun(BaseModel):
    """The message of one run of a batch (the batch function's queue): the batch, and the token that must hold it.
    Its validator is built on first use (``defer_build``): the operators' function imports this module at its cold
    start and validates no run's message."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    kind: Literal["batch.run"] = "batch.run"
    batch_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    token: str = Field(min_length=1, max_length=64)


class BatchService:
    """Start batches and run them from their messages (the operators' function starts, the batch function runs).

    Parameters
    ----------
    runner:
        Works a batch through.
    queue_url:
        The batch function's queue (``BATCH_QUEUE_URL``).
    tokens:
        Makes the token of each message (injected in tests).
    """

    def __init__(
        self, runner: BatchRunner, queue_url: str, *, tokens: Callable[[], str] = lambda: uuid.uuid4().hex
    ) -> None:
        if not queue_url:
            raise ConfigurationError("BATCH_QUEUE_URL is not set: this function cannot start or run batches")
        self.runner = runner
        self.store = runner.store
        self.queue_url = queue_url
        self.tokens = tokens

    def _send(self, batch_id: str, token: str, delay: int = 0) -> None:
        body = BatchRun(batch_id=batch_id, token=token).model_dump_json()
        if self.runner.bus.send([Outgoing(self.queue_url, body, delay_seconds=delay)]):
            raise RetryableError(f"the run of batch {batch_id} was not sent; send the request again")

    def start(self, batch: Batch, *, repeatable: bool = True) -> tuple[Batch, bool]:
        """Store a new batch, held by the token of its first run's message, and send that message.

        A batch of that id stored already (a request repeated with its Idempotency-Key) is answered as it is, if it
        is the same request; one that has claimed no page yet gets its first message again (a duplicate of a message
        is harmless: runs of one token claim each page once). A batch nobody can ask for again (``repeatable``
        false: a request without an Idempotency-Key) whose first message is not sent is cancelled, saying so: no
        message would ever continue it, and a new request is a new batch.

        Returns
        -------
        tuple[Batch, bool]
            The batch, and whether this call created it.

        Raises
        ------
        IdempotencyKeyConflictError
            When the id holds another request's batch.
        RetryableError
            When the message was not sent (the batch is stored: the same request again sends it; not repeatable:
            the batch is CANCELLED, nothing was acted on).
        """
        try:
            stored = self.store.create(replace(batch, runner=self.tokens()))
            created = True
        except ConditionFailedError:
            found = self.store.get(batch.batch_id, consistent=True)
            assert found is not None  # nosec B101 # a batch is never deleted
            same = (found.action, found.where, found.step, found.principal, found.output) == (
                batch.action,
                batch.where,
                batch.step,
                batch.principal,
                batch.output,
            )
            if not same:
                raise IdempotencyKeyConflictError(
                    f"the Idempotency-Key of batch {batch.batch_id} was used for another batch ({found.action} of "
                    f"{found.where.given()})"
                ) from None
            stored, created = found, False
        if stored.runner is not None and stored.pages == 0 and not stored.finished:
            try:
                self._send(stored.batch_id, stored.runner)
            except Exception:
                if created and not repeatable:
                    why = "not started: its first run's message was not sent (nothing was acted on); start it again"
                    now = epoch_seconds(self.runner.clock)
                    cancel(self.store, stored.batch_id, principal=stored.principal, reason=why, now=now)
                raise
        return stored, created

    def on_message(self, body: str, *, should_stop: Callable[[], bool] = lambda: False) -> RunResult:
        """Run the batch a message names, then send its next run's message (delayed to keep its rate) and hand the
        batch over to it.

        Raises
        ------
        MalformedMessageError
            When the body is not a run's message (the record fails, then goes to the dead-letter queue).
        RetryableError
            When the next message was not sent (the record is delivered again: its token still holds the batch).
        """
        try:
            message = BatchRun.model_validate_json(body)
        except ValidationError as exc:
            raise MalformedMessageError(f"not a batch run's message: {exc.errors()[0]['msg']}") from None
        result = self.runner.run(message.batch_id, message.token, should_stop=should_stop)
        if result.delay is None or result.batch is None:
            return result
        next_token = self.tokens()
        self._send(message.batch_id, next_token, result.delay)
        self.runner.hand_over(result.batch, message.token, next_token)
        return result


def touched(store: BatchStore, batch_id: str) -> Iterator[tuple[str, str | None]]:
    """The workflows a batch claimed, page by page, with their outcomes (None: its page is not settled yet)."""
    for page in store.pages(batch_id):
        for workflow_id in page.workflow_ids:
            yield workflow_id, page.outcomes.get(workflow_id)


def new_batch(
    batch_id: str,
    action: str,
    where: BatchFilter,
    *,
    principal: str,
    reason: str,
    now: int,
    step: str | None = None,
    max_per_second: int = DEFAULT_RATE,
    output: Any = NO_OUTPUT,
) -> Batch:
    """A batch about to start (validated: a known action, a rate within bounds, a filter that narrows, an output
    only for a skip).

    Raises
    ------
    ValueError
        When the action is unknown, the rate out of bounds, the filter gives nothing (a batch over every workflow in
        flight is refused: name at least a status), or an output is given to another action than a skip.
    PayloadTooLargeError
        When the output is larger than a step's input may be (`limits.MAX_STEP_INPUT_BYTES`): it is written to
        every workflow the batch acts on.
    """
    if action not in BATCH_ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {list(BATCH_ACTIONS)}")
    if not 1 <= max_per_second <= MAX_RATE:
        raise ValueError(f"max_per_second must be 1 to {MAX_RATE}, not {max_per_second}")
    if where.status is None:
        raise ValueError("a batch needs a status in its filter (what it acts on: HELD to retry, RUNNING to pause...)")
    if where.status in FINISHED:
        raise ValueError(f"a {where.status} workflow has ended: no operator action applies to it")
    if output is not NO_OUTPUT and action != "skip":
        raise ValueError(f"only a skip takes an output, not a {action}")
    if output is not NO_OUTPUT:
        json_size(output, MAX_STEP_INPUT_BYTES, what="a batch's skip output")
    return Batch(
        batch_id,
        action,
        where,
        principal,
        reason,
        now,
        step=step,
        max_per_second=max_per_second,
        updated_at=now,
        output=None if output is NO_OUTPUT else json.dumps(output, separators=(",", ":")),
    )


def cancel(store: BatchStore, batch_id: str, *, principal: str, reason: str, now: int) -> Batch:
    """Stop a running batch: no page is claimed after this (a page being acted on is settled). Cancelling one that
    is CANCELLED already changes nothing.

    Raises
    ------
    BatchNotFoundError
        When there is no such batch.
    ConditionFailedError
        When it COMPLETED.
    """
    while True:
        batch = store.get(batch_id, consistent=True)
        if batch is None:
            raise BatchNotFoundError(f"no batch {batch_id}")
        if batch.status == "CANCELLED":
            return batch
        if batch.status == "COMPLETED":
            raise ConditionFailedError(f"batch {batch_id} COMPLETED already: nothing to cancel")
        stopped = replace(
            batch, status="CANCELLED", cancelled_by=principal, cancel_reason=reason, ended_at=now, updated_at=now
        )
        try:
            return store.put(stopped, expect=batch.version)
        except ConditionFailedError:
            continue  # a run moved it on: read again

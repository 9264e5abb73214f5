"""Finding workflows for a person on call: by status, definition and start time, what is overdue, what is stuck.

Each question is answered from the cheapest place that holds the answer at any table size:

- waiting for a person (``HELD``, ``COMPENSATION_FAILED``, ``PAUSED``): the sparse *attention index*, which holds
  exactly those workflows (a workflow enters it in the write that makes it wait, so the happy path never writes it);
- in flight (``RUNNING``, ``COMPENSATING``, ``CANCELLING``): the sparse *deadline index*, which holds every workflow
  that is not terminal and projects its status, definition, start and trouble (resends and deferrals); projecting
  them costs no write on the happy path, where they do not change while the entry exists;
- finished (``COMPLETED``, ``COMPENSATED``, ``CANCELLED``) and ``QUEUED`` (waiting for its tenant's slot, in no
  index): a scan of the table, whose cost grows with the table. That listing is for occasional use; a finished
  workflow is found by its id, and the metrics count them;
- started by a trigger (``--trigger``), in any status: the sparse *trigger index*, which holds the keys of exactly
  those workflows, newest first (written once, by the start).

Every page is re-read from its items, which also answer what no index projects: the definition's version, the
owner, and the codes of the steps' last errors (a page may then hold fewer workflows than its limit; the cursor goes
on). Pages are bounded; a ``cursor`` (opaque to callers) continues where a page stopped.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidCursorError
from .ports import WorkflowIndex, WorkflowSummary
from .states import ENDED_RUN, NEEDS_A_PERSON, TERMINAL_WORKFLOW, WorkflowStatus

#: What the attention index holds: the statuses that wait for a person, and PAUSED.
ATTENTION_KINDS = tuple(sorted({s.value for s in NEEDS_A_PERSON} | {"PAUSED"}))
IN_FLIGHT = tuple(sorted(s.value for s in WorkflowStatus if s not in TERMINAL_WORKFLOW | {WorkflowStatus.QUEUED}))
FINISHED = tuple(sorted(s.value for s in ENDED_RUN))
#: Listed by a scan of the table: the finished, and QUEUED (in no index: a queued workflow has no deadline).
SCANNED = (*FINISHED, WorkflowStatus.QUEUED.value)
MAX_PAGE = 200


@dataclass
class Page:
    """One page of workflows: the summaries, the cursor of the next page (None on the last), and counts by status
    of what the cheap indexes hold (on the first page only; finished workflows are counted by the metrics)."""

    workflows: list[WorkflowSummary]
    cursor: str | None
    counts: dict[str, int] | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)


#: Children a call of `WorkflowFinder.children` reads at most (ten BatchGetItem requests of 100 keys).
CHILDREN_READ_BUDGET = 1_000


@dataclass
class ChildrenPage:
    """A page of a map step's children: (item index, summary) pairs, where the next page starts (None: no more),
    and how many children this page read."""

    children: list[tuple[int, WorkflowSummary]]
    next_index: int | None
    examined: int


def _encode(state: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode().rstrip("=")


def _decode(cursor: str) -> dict[str, Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        state = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursorError("the cursor is not one this API gave") from None
    # Every cursor this API gives holds where to go on: "k" (a key), with "s" (a shard) for the in-flight listing
    if not isinstance(state, dict) or "k" not in state or not set(state) <= {"s", "k"}:
        raise InvalidCursorError("the cursor is not one this API gave")
    return state


def key_cursor(key: Any) -> str:
    """The cursor of a one-partition listing that goes on from ``key`` (a store's page key)."""
    return _encode({"k": key})


def cursor_key(cursor: str) -> Any:
    """The key a cursor of `key_cursor` holds.

    Raises
    ------
    InvalidCursorError
        When the cursor was not given by this API.
    """
    return _decode(cursor)["k"]


def _resume_key(state: dict[str, Any]) -> Any:
    """The key a one-partition listing goes on from (None: from the start, no cursor given). Its cursors always hold
    one: only the in-flight listing's may end a shard with none."""
    if state and state["k"] is None:
        raise InvalidCursorError("the cursor is not one this API gave")
    return state.get("k")


class WorkflowFinder:
    """Lists workflows for the operator routes.

    Parameters
    ----------
    index:
        The store's indexes (``adapters.dynamodb_store.DynamoDBStateStore`` or the in-memory store).
    shards:
        Partitions of the deadline index.
    """

    def __init__(self, index: WorkflowIndex, shards: int) -> None:
        self.index = index
        self.shards = shards

    def find(
        self,
        *,
        status: str | None = None,
        definition: str | None = None,
        started_after: int | None = None,
        started_before: int | None = None,
        trigger: str | None = None,
        version: int | None = None,
        owner: str | None = None,
        error_code: str | None = None,
        step: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        counts: bool = True,
    ) -> Page:
        """One page of workflows, newest attention first, or in deadline order, or in table order (finished).

        Parameters
        ----------
        status:
            A workflow status, ``PAUSED``, or None for every workflow in flight or waiting.
        definition:
            Only workflows of this definition name.
        started_after:
            Only workflows created after this time (epoch seconds).
        started_before:
            Only workflows created before this time (epoch seconds).
        trigger:
            Only workflows this trigger started, in any status unless ``status`` is given (the trigger index).
        version, owner, error_code, step:
            Only workflows of this definition version, started by this principal, with a step whose last error
            (action or compensation) has this code, or whose step of this name failed last (its error is the last
            thing it did: the step a person would act on). No index projects them: they are matched on the items the
            page re-reads (`WorkflowIndex.current`), so a page may hold fewer workflows than ``limit``.
        limit:
            Workflows per page, at most `MAX_PAGE`.
        cursor:
            Where the previous page stopped.
        counts:
            Count the workflows in flight or waiting, by status, on a first page (one query per attention kind and
            per deadline shard); a caller that has them already says False.

        Raises
        ------
        ValueError
            When ``status`` is not a known status.
        InvalidCursorError
            When ``cursor`` was not given by this API.
        """
        limit = max(1, min(MAX_PAGE, limit))
        state = _decode(cursor) if cursor else {}
        if status is not None and status not in ATTENTION_KINDS + IN_FLIGHT + SCANNED:
            raise ValueError(f"unknown status {status!r}; one of {sorted(ATTENTION_KINDS + IN_FLIGHT + SCANNED)}")

        def wanted(summary: WorkflowSummary) -> bool:
            return (
                (definition is None or summary.definition_name == definition)
                and (started_after is None or summary.created_at > started_after)
                and (started_before is None or summary.created_at < started_before)
                and (status is None or status in (summary.status, summary.attention))
                and (trigger is None or summary.trigger == trigger)
            )

        def matches(summary: WorkflowSummary) -> bool:
            """`wanted`, and what only the item holds."""
            return (
                wanted(summary)
                and (version is None or summary.definition_version == version)
                and (owner is None or summary.owner == owner)
                and (error_code is None or error_code in summary.error_codes)
                and (step is None or step in summary.error_steps)
            )

        # Any filter beyond the status: what a page leaves out was left out by it, not by the index's lag (a trial
        # read "the index lags" for workflows that were simply of another definition).
        given = (definition, started_after, started_before, version, owner, error_code, step)
        filtering = any(f is not None for f in given)
        if trigger is not None:
            found, next_key = self.index.by_trigger(trigger, limit, _resume_key(state))
            page = self._current(found, matches, source="trigger index", filtered=True)
            page.cursor = _encode({"k": next_key}) if next_key is not None else None
        elif status in ATTENTION_KINDS:
            found, next_key = self.index.attention(str(status), limit, _resume_key(state))
            page = self._current(found, matches, source="attention index", filtered=filtering)
            page.cursor = _encode({"k": next_key}) if next_key is not None else None
        elif status in SCANNED:
            found, next_key = self.index.finished(str(status), limit, _resume_key(state))
            page = Page([s for s in found if matches(s)], None, source="table scan")
            page.cursor = _encode({"k": next_key}) if next_key is not None else None
            what = "queued" if status == WorkflowStatus.QUEUED.value else "finished"
            page.notes.append(f"{what} workflows are listed by a scan of the table: its cost grows with the table")
        else:
            page = self._in_flight(state, limit, wanted, matches, filtered=filtering)
            if status is None:
                page.notes.append("without a status: the workflows in flight; finished ones are listed by status")
        if cursor is None and counts:
            page.counts = self.counts()
        return page

    def _in_flight(self, state: dict[str, Any], limit: int, wanted: Any, matches: Any, *, filtered: bool) -> Page:
        shard = state.get("s", 0)
        if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < self.shards:
            raise InvalidCursorError("the cursor is not one this API gave")
        key = state.get("k")
        found: list[WorkflowSummary] = []
        while shard < self.shards and len(found) < limit:
            entries, key = self.index.in_flight(f"{shard:02d}", limit - len(found), key, None)
            found += [entry for entry in entries if wanted(entry)]
            if key is None:
                shard += 1
        page = self._current(
            found, lambda now: matches(now) and now.status not in FINISHED, source="deadline index", filtered=filtered
        )
        page.cursor = None if shard >= self.shards else _encode({"s": shard, "k": key})
        return page

    def _current(self, found: list[WorkflowSummary], wanted: Any, *, source: str, filtered: bool = False) -> Page:
        """A page of what the index listed, each entry as its item is now.

        The indexes are GSIs, eventually consistent: a workflow retried a moment ago can still be listed as HELD.
        The page's items are re-read (``WorkflowIndex.current``, a strongly consistent BatchGetItem); an entry
        whose workflow no longer matches the filter, or no longer exists, is left out and counted in a note. The
        cursor stays the index's, so paging is unchanged. An index that holds every status (the trigger index), or a
        filter only the item answers (``filtered``: owner, version, error code), leaves out what does not match,
        which is no lag.
        """
        if not found:
            return Page([], None, source=source)
        now = self.index.current([summary.workflow_id for summary in found])
        kept = [now[s.workflow_id] for s in found if s.workflow_id in now and wanted(now[s.workflow_id])]
        page = Page(kept, None, source=source)
        if len(kept) < len(found) and filtered:
            page.notes.append(f"{len(found) - len(kept)} of this page's workflows do not match the filter: left out")
        elif len(kept) < len(found):
            page.notes.append(
                f"{len(found) - len(kept)} listed by the {source} changed since it was written (the index lags its "
                "table) and no longer match: left out"
            )
        return page

    def children(self, prefix: str, started: int, *, status: str | None, start: int, limit: int) -> ChildrenPage:
        """One page of a map step's children ``prefix + i`` for ``i`` in ``[start, started)``, in item order, those
        of ``status`` (a status or an attention kind; None: every child).

        Children are found by their ids (no index holds them): each round re-reads 100 of them from their items
        (``WorkflowIndex.current``, one BatchGetItem), at most `CHILDREN_READ_BUDGET` a call, so a page filtered by a
        rare status may come back short with a cursor to go on from.
        """
        limit = max(1, min(MAX_PAGE, limit))
        kept: list[tuple[int, WorkflowSummary]] = []
        position, examined = start, 0
        while position < started and len(kept) < limit and examined < CHILDREN_READ_BUDGET:
            indexes = range(position, min(started, position + 100))
            now = self.index.current([f"{prefix}{i}" for i in indexes])
            examined += len(indexes)
            for i in indexes:
                position = i + 1
                summary = now.get(f"{prefix}{i}")
                if summary is not None and (status is None or status in (summary.status, summary.attention)):
                    kept.append((i, summary))
                    if len(kept) == limit:
                        break
        return ChildrenPage(kept, position if position < started else None, examined)

    def counts(self) -> dict[str, int]:
        """Workflows by status of what the indexes hold: every workflow in flight or waiting (not the finished)."""
        counts: dict[str, int] = {}
        for kind in ATTENTION_KINDS:
            counts[kind] = self.index.count_attention(kind)
        for shard in range(self.shards):
            for status, number in self.index.count_in_flight(f"{shard:02d}").items():
                if status not in counts:
                    counts[status] = 0
                if status not in ATTENTION_KINDS:
                    counts[status] += number
        return {status: counts[status] for status in sorted(counts)}

    def overdue(
        self, now: int, grace: int, *, stuck_at: int, limit: int = 100, older_than: int = 0
    ) -> dict[str, list[WorkflowSummary]]:
        """What the supervisor finds overdue now, oldest complete-by first across the shards, and what looks stuck.

        Overdue: ``complete_by < now - max(grace, older_than)`` (epoch seconds; ``older_than`` in seconds overdue,
        never less than the supervisor's own grace). Each shard's index answers in complete-by order, so the first
        ``limit`` of each shard, merged, hold the ``limit`` oldest of all (issue 19: shard order left the oldest
        off a page). Stuck: workflows in flight whose steps were resent or deferred ``stuck_at`` times or more in
        all (an agent that keeps failing, an open circuit that does not close).
        """
        before = overdue_before(now, grace, older_than)
        overdue: list[WorkflowSummary] = []
        stuck: list[WorkflowSummary] = []
        for shard in range(self.shards):
            found: list[WorkflowSummary] = []
            key = None
            while len(found) < limit:
                entries, key = self.index.in_flight(f"{shard:02d}", limit - len(found), key, before)
                found += entries
                if key is None:
                    break
            overdue += found[:limit]
            key = None
            while len(stuck) < limit:
                entries, key = self.index.in_flight(f"{shard:02d}", limit, key, None)
                stuck += [entry for entry in entries if entry.trouble >= stuck_at]
                if key is None:
                    break
        overdue.sort(key=by_complete_by)
        return {"overdue": overdue[:limit], "stuck": stuck[:limit]}


def overdue_before(now: int, grace: int, older_than: int = 0) -> int:
    """The complete-by (epoch seconds) before which a workflow is listed as overdue: overdue by more than
    ``older_than`` seconds, and never less than the supervisor's own ``grace``."""
    return now - max(grace, older_than)


def by_complete_by(summary: WorkflowSummary) -> tuple[int, str]:
    """Sort key of the overdue listing: oldest complete-by first, then by id (a stable order for equal times)."""
    return (summary.complete_by if summary.complete_by is not None else 0, summary.workflow_id)

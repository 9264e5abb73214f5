"""Map steps' bookkeeping: a parent's progress over its children, and a child's link to its parent.

A map step (``definition.MapStep``) runs one child workflow per item. The children are workflows of their own (their
own items in the store), so the parent's item holds only counters whatever the number of items: the children
started so far (``launched``, always a prefix ``[0, launched)`` of the items, started in order), and the ones that
reported their end, as a prefix ``[0, low)`` plus the few beyond it (at most the concurrency, since no more are in
flight). A report is applied once (``record``), whatever SQS redelivers. The unwind of a map step walks its children
the same way with a progress of its own (``StepRecord.comp_map``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class MapProgress:
    """How far one phase of a map step got over its ``total`` children.

    Attributes
    ----------
    total:
        Children this phase walks: the items (forward), or the children started (unwind).
    launched:
        Children ``[0, launched)`` were started (forward) or asked to unwind (unwind).
    low, done:
        Children ``[0, low)`` reported, and those of ``done`` (sorted, all >= ``low``).
    failed:
        Reports of a child that did not end as this phase wants (not COMPLETED forward; COMPENSATION_FAILED
        in the unwind).
    """

    total: int
    launched: int = 0
    low: int = 0
    done: tuple[int, ...] = ()
    failed: int = 0

    @property
    def reported(self) -> int:
        """Children that reported."""
        return self.low + len(self.done)

    @property
    def in_flight(self) -> int:
        """Children started and not reported yet."""
        return self.launched - self.reported

    @property
    def finished(self) -> bool:
        """Every child of this phase reported."""
        return self.low >= self.total

    def has(self, index: int) -> bool:
        """Whether child ``index`` reported."""
        return index < self.low or index in self.done

    def record(self, index: int, *, failed: bool) -> MapProgress | None:
        """This progress with child ``index``'s report applied; None when it reported already or was not started."""
        if index >= self.launched or self.has(index):
            return None
        done = sorted((*self.done, index))
        low = self.low
        while done and done[0] == low:
            done.pop(0)
            low += 1
        return replace(self, low=low, done=tuple(done), failed=self.failed + (1 if failed else 0))

    def launch(self, limit: int, concurrency: int) -> tuple[MapProgress, range]:
        """Start what the concurrency allows, at most ``limit`` now: the new progress and the children to start."""
        room = max(0, min(concurrency - self.in_flight, self.total - self.launched, limit))
        started = range(self.launched, self.launched + room)
        return replace(self, launched=self.launched + room), started

    def pending(self) -> list[int]:
        """Children started that have not reported (what a check of the children in flight looks at)."""
        return [i for i in range(self.low, self.launched) if i not in self.done]

    def doc(self) -> dict[str, Any]:
        """The stored form (plain JSON)."""
        return {"n": self.total, "l": self.launched, "lo": self.low, "d": list(self.done), "f": self.failed}

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> MapProgress | None:
        """Read the stored form back (None stays None)."""
        if doc is None:
            return None
        return cls(
            total=int(doc["n"]),
            launched=int(doc["l"]),
            low=int(doc["lo"]),
            done=tuple(int(i) for i in doc.get("d") or ()),
            failed=int(doc.get("f", 0)),
        )


@dataclass(frozen=True)
class ParentRef:
    """A child workflow's parent: the workflow, its map step, the step's attempt and the child's index."""

    workflow_id: str
    step: str
    attempt: int
    index: int

    def doc(self) -> dict[str, Any]:
        """The stored form."""
        return {"w": self.workflow_id, "s": self.step, "a": self.attempt, "i": self.index}

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> ParentRef | None:
        """Read the stored form back (None stays None)."""
        if doc is None:
            return None
        return cls(workflow_id=doc["w"], step=doc["s"], attempt=int(doc["a"]), index=int(doc["i"]))


def child_id(parent_id: str, step_index: int, index: int) -> str:
    """The id of child ``index`` of the map step at ``step_index`` (its place in ``definition.order``) of workflow
    ``parent_id``: ``<parent>:<step index>:<i>``.

    Deterministic, so starting a child again (after a crash, or by the supervisor's check) finds the one started.
    """
    return f"{parent_id}:{step_index}:{index}"


@dataclass(frozen=True)
class ChildCommand:
    """What the scheduler does to a child once the parent's write that decided it is stored (write-ahead).

    ``kind``: ``start`` (create child ``index`` with ``input`` unless it exists; report it when it has ended),
    ``check`` (the supervisor's check: start it if missing, report it if it has ended), ``unwind`` (cancel it if
    running, compensate it if completed; report it once unwound; a child never started is created CANCELLED, so it
    never starts). ``reported`` tells ``unwind`` whether the child reported its end before (so it existed).
    """

    kind: str
    parent: ParentRef
    child_id: str
    input: dict[str, Any] | None = None
    reported: bool = False

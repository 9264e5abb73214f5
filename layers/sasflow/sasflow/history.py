"""The history of a workflow: every change, with its time, kept in the workflow's item and written with it.

Each transition appends its events to the snapshot it writes, so the events of a write are stored by that same
conditional write (DESIGN "History": never by a second write that could disagree with the state). The alternative,
deriving them from the table's stream, needs a consumer and a write per event; in the item they cost bytes only.

They are kept compact, because every write of a workflow rewrites its item and DynamoDB bills a write per started
1 KB: one event is one line of a few fields, its time in seconds since the workflow started and its step by its
index in the definition, so the eight events of a three-step trip take about 90 bytes. `decode` turns them back
into `HistoryEvent` records for the API and the CLI.

Line format (fields separated by one space; ``i`` step index, ``a`` attempt, ``b`` complete-by offset)::

    <dt> S [{json}]             started (by a trigger: {"trigger": name, "occurrence": identity})
    <dt> D i a b                the action dispatched (attempt a, complete-by created_at + b)
    <dt> C i a b                the compensation dispatched
    <dt> R i a o n [code]       a reply of the action applied: outcome o (s r f d), n calls, error code
    <dt> r i a o n [code]       a reply of the compensation applied
    <dt> T i a                  the action's attempt a timed out and was resent by the supervisor
    <dt> t i a                  the compensation's attempt a timed out and was resent
    <dt> O i a                  the action's attempt a timed out, no attempt left
    <dt> o i a                  the compensation's attempt a timed out, no attempt left
    <dt> N i p code             the request of phase p (a c) could not be prepared
    <dt> A i a o [code]         a callback step's token was answered (attempt a): outcome o (s: succeeded, r: failed)
    <dt> B i a                  a heartbeat of a callback step's attempt a (its complete-by moved on)
    <dt> K i                    the step was skipped: its condition (when) was false
    <dt> W i a                  a wait step resumed: its time came (attempt a)
    <dt> U [code]               unwinding started (the workflow's reason says why)
    <dt> X                      a map step's child: its parent unwound, so it unwinds too
    <dt> H [code]               the workflow is held for a person
    <dt> E STATUS               the workflow reached STATUS (terminal)
    <dt> P {json}               an operator action: action, principal, reason, step, id
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .states import Outcome, Phase

if TYPE_CHECKING:
    from .records import TriggerRef

_OUTCOMES = {
    Outcome.SUCCEEDED: "s",
    Outcome.REJECTED: "r",
    Outcome.FAILED: "f",
    Outcome.DEFERRED: "d",
}
_OUTCOME_OF = {letter: outcome for outcome, letter in _OUTCOMES.items()}

#: Event kinds as the API names them, by line code.
KINDS = {
    "S": "started",
    "D": "dispatched",
    "C": "compensation_dispatched",
    "R": "reply_applied",
    "r": "compensation_reply_applied",
    "T": "resent",
    "t": "compensation_resent",
    "O": "timed_out",
    "o": "compensation_timed_out",
    "N": "not_prepared",
    "K": "skipped",
    "A": "callback_applied",
    "B": "heartbeat",
    "W": "resumed",
    "U": "unwinding",
    "X": "parent_unwound",
    "H": "held",
    "E": "finished",
    "P": "operator_action",
    "Q": "queued",
    "G": "dequeued",
}


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a workflow's history, as the API shows it.

    Attributes
    ----------
    seq:
        Its place in the history, from 1.
    time:
        When it happened (epoch seconds).
    kind:
        One of `KINDS`' values.
    step, phase, attempt:
        The step it is about (its name), the phase (``action`` or ``compensation``) and the attempt, when any.
    complete_by:
        The deadline of a dispatched attempt (epoch seconds).
    outcome, calls, error_code:
        For an applied reply: what the agent reported, how many remote calls it made, its error code.
    status:
        For ``finished``: the terminal status.
    detail:
        For an operator action: ``action``, ``principal``, ``reason`` and ``id``; for a start by a trigger:
        ``trigger`` and ``occurrence``; for ``queued``: its ``ticket``; for others, empty.
    """

    seq: int
    time: int
    kind: str
    step: str | None = None
    phase: str | None = None
    attempt: int | None = None
    complete_by: int | None = None
    outcome: str | None = None
    calls: int | None = None
    error_code: str | None = None
    status: str | None = None
    detail: dict[str, Any] | None = None


class HistoryWriter:
    """Encodes the events of one write for a workflow that started at ``created_at``, happening ``now``.

    Step names are encoded as their index in ``steps`` (the definition's list of steps, which never changes). Each
    line goes to ``emit`` (the transition appends it to the snapshot it writes).
    """

    def __init__(self, created_at: int, now: int, steps: list[str], emit: Callable[[str], None]) -> None:
        self.base = created_at
        self.dt = str(max(0, now - created_at))
        self.index = {name: i for i, name in enumerate(steps)}
        self.emit = emit

    def _add(self, *fields: object) -> None:
        self.emit(" ".join([self.dt, *(str(f) for f in fields if f is not None and f != "")]))

    def started(self, trigger: TriggerRef | None = None) -> None:
        """The workflow was created (by ``trigger``'s occurrence, when a trigger started it)."""
        if trigger is None:
            self._add("S")
            return
        document = {"trigger": trigger.name, "occurrence": trigger.occurrence}
        self._add("S", json.dumps(document, separators=(",", ":"), ensure_ascii=False))

    def dispatched(self, step: str, phase: Phase, attempt: int, complete_by: int) -> None:
        """An attempt of ``phase`` was put in flight, due by ``complete_by`` (epoch seconds)."""
        self._add("C" if phase is Phase.COMPENSATION else "D", self.index[step], attempt, complete_by - self.base)

    def reply(self, step: str, phase: Phase, attempt: int, outcome: Outcome, calls: int, code: str | None) -> None:
        """A reply was applied."""
        letter = "r" if phase is Phase.COMPENSATION else "R"
        self._add(letter, self.index[step], attempt, _OUTCOMES[outcome], calls, _code(code))

    def resent(self, step: str, phase: Phase, attempt: int) -> None:
        """Attempt ``attempt`` passed its complete-by; the supervisor resends the step."""
        self._add("t" if phase is Phase.COMPENSATION else "T", self.index[step], attempt)

    def timed_out(self, step: str, phase: Phase, attempt: int) -> None:
        """Attempt ``attempt`` passed its complete-by and was the last one."""
        self._add("o" if phase is Phase.COMPENSATION else "O", self.index[step], attempt)

    def not_prepared(self, step: str, phase: Phase, code: str) -> None:
        """The request of ``phase`` could not be prepared (its error code)."""
        self._add("N", self.index[step], "c" if phase is Phase.COMPENSATION else "a", _code(code))

    def callback(self, step: str, attempt: int, outcome: Outcome, code: str | None) -> None:
        """A callback step's token was answered (its success or failure applied)."""
        self._add("A", self.index[step], attempt, _OUTCOMES[outcome], _code(code))

    def heartbeat(self, step: str, attempt: int) -> None:
        """A heartbeat of a callback step's attempt."""
        self._add("B", self.index[step], attempt)

    def skipped(self, step: str) -> None:
        """The step's condition was false: it is SKIPPED and counts as done."""
        self._add("K", self.index[step])

    def resumed(self, step: str, attempt: int) -> None:
        """A wait step's time came (by its timer or by the supervisor)."""
        self._add("W", self.index[step], attempt)

    def unwinding(self, code: str | None = None) -> None:
        """The workflow started to unwind."""
        self._add("U", _code(code))

    def parent_unwound(self) -> None:
        """A map step's child is asked to unwind by its parent (cancelled if running, compensated if completed)."""
        self._add("X")

    def held(self, code: str | None = None) -> None:
        """The workflow waits for a person."""
        self._add("H", _code(code))

    def queued(self, ticket: int) -> None:
        """The workflow waits in its tenant's queue with ``ticket`` (``tenancy.py``)."""
        self._add("Q", ticket)

    def dequeued(self) -> None:
        """The workflow left its tenant's queue: it holds a slot and starts."""
        self._add("G")

    def finished(self, status: str) -> None:
        """The workflow reached a terminal status."""
        self._add("E", status)

    def operator(
        self,
        action: str,
        principal: str,
        reason: str,
        *,
        step: str | None = None,
        id: str = "",
        compensated_on_unwind: bool | None = None,
        input_edited: bool | None = None,
        replaced_attempt: int | None = None,
        batch: str | None = None,
    ) -> None:
        """An operator acted on the workflow (audited with who, why and the action's id); a skip also says whether
        the skipped step is compensated if the workflow unwinds later (``compensated_on_unwind``), a retry whether it
        was given an edited input (``input_edited``) and which attempt it replaces (``replaced_attempt``: the step's
        last attempt, the failed one). ``batch``: the batch (``batches.py``) the action is part of."""
        document: dict[str, Any] = {"action": action, "principal": principal, "reason": reason, "id": id}
        if batch is not None:
            document["batch"] = batch
        if step is not None:
            document["step"] = step
        if replaced_attempt is not None:
            document["replaced_attempt"] = replaced_attempt
        if compensated_on_unwind is not None:
            document["compensated_on_unwind"] = compensated_on_unwind
        if input_edited is not None:
            document["input_edited"] = input_edited
        self._add("P", json.dumps(document, separators=(",", ":"), ensure_ascii=False))


def _code(code: str | None) -> str:
    return "" if not code else "".join(c if c.isalnum() or c in "_.-" else "_" for c in code)[:64]


def decode(lines: tuple[str, ...] | list[str], created_at: int, steps: list[str]) -> list[HistoryEvent]:
    """Turn stored history lines back into events, oldest first.

    Raises
    ------
    ValueError
        When a line is not one `HistoryWriter` writes.
    """
    events: list[HistoryEvent] = []
    for seq, line in enumerate(lines, start=1):
        dt, _, rest = line.partition(" ")
        code, _, tail = rest.partition(" ")
        time = created_at + int(dt)
        kind = KINDS.get(code)
        if kind is None:
            raise ValueError(f"history line {seq}: unknown event {code!r}")
        fields = tail.split(" ") if tail else []
        if code == "P":
            events.append(HistoryEvent(seq, time, kind, step=json.loads(tail).get("step"), detail=json.loads(tail)))
            continue
        if code == "S" and tail.startswith("{"):
            events.append(HistoryEvent(seq, time, kind, detail=json.loads(tail)))
            continue
        if code in "SUHX":
            events.append(HistoryEvent(seq, time, kind, error_code=fields[0] if fields else None))
            continue
        if code == "E":
            events.append(HistoryEvent(seq, time, kind, status=fields[0]))
            continue
        if code == "Q":
            events.append(HistoryEvent(seq, time, kind, detail={"ticket": int(fields[0])}))
            continue
        if code == "G":
            events.append(HistoryEvent(seq, time, kind))
            continue
        step = steps[int(fields[0])]
        if code == "K":
            events.append(HistoryEvent(seq, time, kind, step=step, phase=Phase.ACTION.value))
            continue
        if code == "N":
            phase = Phase.COMPENSATION if fields[1] == "c" else Phase.ACTION
            events.append(HistoryEvent(seq, time, kind, step=step, phase=phase.value, error_code=fields[2]))
            continue
        phase = Phase.COMPENSATION if code in "Crto" else Phase.ACTION
        attempt = int(fields[1])
        if code == "A":
            fields.insert(3, "0")  # an answered callback made no call: read it as a reply's line
        if code in "DC":
            events.append(
                HistoryEvent(
                    seq,
                    time,
                    kind,
                    step=step,
                    phase=phase.value,
                    attempt=attempt,
                    complete_by=created_at + int(fields[2]),
                )
            )
        elif code in "RrA":
            events.append(
                HistoryEvent(
                    seq,
                    time,
                    kind,
                    step=step,
                    phase=phase.value,
                    attempt=attempt,
                    outcome=_OUTCOME_OF[fields[2]].value,
                    calls=int(fields[3]),
                    error_code=fields[4] if len(fields) > 4 else None,
                )
            )
        else:  # T t O o W B
            events.append(HistoryEvent(seq, time, kind, step=step, phase=phase.value, attempt=attempt))
    return events


@dataclass
class StepTimes:
    """When a step's phases ran, derived from the history (epoch seconds; None while not yet)."""

    started_at: int | None = None
    finished_at: int | None = None
    compensation_started_at: int | None = None
    compensation_finished_at: int | None = None


#: Events that end a phase's attempt for good, or settle it by hand.
_SETTLING = {"reply_applied", "timed_out", "not_prepared", "resumed", "skipped", "callback_applied"}
_COMP_SETTLING = {"compensation_reply_applied", "compensation_timed_out"}


def step_times(events: list[HistoryEvent]) -> dict[str, StepTimes]:
    """Each step's start (its first dispatch) and end (the last event that settled an attempt of it), per phase.

    An end is the time of the last applied reply, final timeout or refusal of the phase; a step still in flight
    may show the end of an earlier attempt, which the step's status tells apart. An operator's ``skip`` ends the
    action and a ``resolve`` the compensation.
    """
    times: dict[str, StepTimes] = {}
    for event in events:
        if event.step is None:
            continue
        entry = times.setdefault(event.step, StepTimes())
        compensation = event.phase == Phase.COMPENSATION.value
        if event.kind == "dispatched" and entry.started_at is None:
            entry.started_at = event.time
        elif event.kind == "compensation_dispatched" and entry.compensation_started_at is None:
            entry.compensation_started_at = event.time
        elif event.kind in _SETTLING and not compensation:
            entry.finished_at = event.time
        elif event.kind in _COMP_SETTLING or (event.kind == "not_prepared" and compensation):
            entry.compensation_finished_at = event.time
        elif event.kind == "operator_action":
            action = (event.detail or {}).get("action")
            if action == "skip":
                entry.finished_at = event.time
            elif action == "resolve":
                entry.compensation_finished_at = event.time
    return times

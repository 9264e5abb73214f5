"""Limits on the calls an agent makes to its remote service, shared by every instance of the agent (issue 38).

An agent declares them in agents.yaml: ``max_in_flight`` (calls to the service at once) and ``rate`` (calls per
second, with a ``burst``). Both are divided into **units**: ``max_in_flight`` units when it is declared, else
``burst`` units. A unit is one call in flight and ``rate / units`` calls per second with ``burst / units`` tokens.

The units live in one shared item (``call-limits#<agent>``) as **leases**: each agent instance (a Lambda sandbox)
holds some units until a time, renews them while it works (every ``refresh_seconds``) and lets them lapse when it
stops, so an instance that crashes or is frozen frees its units when its lease ends, never later. Every change of
the item is a conditional write on its version, so two instances never hand out the same unit. The limits are then
kept in each instance without a write per call: its calls in flight never exceed its units, its calls per second
never exceed its share of the rate, and its calls end before its lease does. This is how lease-based capacity
allocators work (Google's Doorman, for one); a write per call (taking and giving back a slot around it) would add
two write units to every step, more than the whole orchestration's margin against the managed engines.

An instance asks for what its records need (its peak demand since its last write), and gets its fair share: the
units times its demand over all instances' demands, at least one, never more than the units nobody else holds. An
instance that gets none is listed as waiting, so the others shrink to their fair share when they renew. A record
that cannot get a unit and a token within ``max_wait_seconds`` is deferred (``CallsLimitedError``): the agent replies
DEFERRED with the wait, and the scheduler sends it again then without using an attempt (docs/agents.md, "Limits").

Tokens move with units: a unit handed over starts with the tokens it can have earned since the last unit was given
back (``released_at``), so units changing hands never add to the burst. Clocks are trusted to ``guard_seconds``:
an instance stops calling ``guard_seconds`` before its lease ends, the others count it until ``guard_seconds``
after.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .clock import Clock
from .errors import CallsLimitedError

logger = logging.getLogger("sasflow.call_limits")

#: How long a waiting instance's demand is listed when it got no unit (seconds): long enough for every holder to
#: renew once and see it.
WAITING_SECONDS = 25.0
#: The difference between two instances' clocks the leases tolerate (seconds): a holder stops calling this long
#: before its lease ends by its clock, the others count it this long after by theirs. Lambda's clocks agree within
#: milliseconds; the simulation skews each instance's by up to 4 s either way.
GUARD_SECONDS = 4.0
#: What `CallLimiter._try_take` answers when the instance has no unit to wait for: the record is deferred.
_DEFER = -1.0
#: Conditional writes an instance tries before it defers its record (each failure returns the item as it is).
WRITE_TRIES = 3
#: How much longer a deferred record of each priority waits before it is tried again than one of the default, 3:
#: where the service is limited, the steps of higher priority come back sooner and take the units first.
PRIORITY_WAIT = {1: 0.5, 2: 0.75, 3: 1.0, 4: 1.5, 5: 2.0}


@dataclass(frozen=True)
class CallLimits:
    """An agent's declared limits; None: not limited on that axis.

    Raises
    ------
    ValueError
        When nothing is limited, or a value is out of its range, or ``burst`` is below ``max_in_flight`` (the calls
        in flight may all start at once).
    """

    max_in_flight: int | None = None
    rate: float | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight is None and self.rate is None:
            raise ValueError("declare max_in_flight, rate or both")
        if self.max_in_flight is not None and not 1 <= self.max_in_flight <= 1_000:
            raise ValueError(f"max_in_flight must be 1 to 1000, not {self.max_in_flight}")
        if self.rate is not None and not 0.01 <= self.rate <= 10_000:
            raise ValueError(f"rate must be 0.01 to 10000 calls per second, not {self.rate}")
        if self.burst is not None:
            if self.rate is None:
                raise ValueError("burst is the calls a rate lets through at once: declare rate with it")
            if not 1 <= self.burst <= 10_000:
                raise ValueError(f"burst must be 1 to 10000, not {self.burst}")
            if self.max_in_flight is not None and self.burst < self.max_in_flight:
                raise ValueError(
                    f"burst ({self.burst}) must be at least max_in_flight ({self.max_in_flight}): the calls in flight "
                    "may all start at once"
                )

    @property
    def burst_calls(self) -> int:
        """The burst in effect: ``burst``, else the larger of one second's calls and ``max_in_flight``."""
        if self.burst is not None:
            return self.burst
        return max(math.ceil(self.rate or 1), self.max_in_flight or 1)

    @property
    def units(self) -> int:
        """How many units the limits divide into: ``max_in_flight``, else the burst."""
        return self.max_in_flight if self.max_in_flight is not None else self.burst_calls

    @property
    def unit_rate(self) -> float:
        """Calls per second one unit may make (infinite without ``rate``)."""
        return math.inf if self.rate is None else self.rate / self.units

    @property
    def unit_burst(self) -> float:
        """Tokens one unit holds at most (infinite without ``rate``); at least 1 (``burst`` >= units)."""
        return math.inf if self.rate is None else self.burst_calls / self.units

    def describe(self) -> str:
        """For log lines and errors: ``5 in flight, 10/s (burst 10)``."""
        parts = []
        if self.max_in_flight is not None:
            parts.append(f"{self.max_in_flight} in flight")
        if self.rate is not None:
            parts.append(f"{self.rate:g}/s (burst {self.burst_calls})")
        return ", ".join(parts)


@dataclass(frozen=True)
class Lease:
    """One instance's entry in the shared item: ``units`` until ``until`` (epoch seconds), wanting ``want``."""

    units: int
    want: int
    until: float


@dataclass(frozen=True)
class LimitsRecord:
    """The shared item: every instance's lease, the item's ``version`` (for the conditional writes) and
    ``released_at``, the last time a unit was given back or lapsed (its tokens count from then)."""

    leases: Mapping[str, Lease] = field(default_factory=dict)
    version: int = 0
    released_at: float = 0.0


@dataclass(frozen=True)
class Grant:
    """What one write gave an instance: its units until ``until``, and the tokens its new units bring."""

    units: int
    until: float
    new_tokens: float
    retry_at: float


def allocate(
    record: LimitsRecord,
    holder: str,
    want: int,
    in_flight: int,
    now: float,
    limits: CallLimits,
    *,
    lease_seconds: float,
    guard_seconds: float,
) -> tuple[LimitsRecord, Grant]:
    """The item after ``holder`` asks for ``want`` units with ``in_flight`` calls running, and what it gets.

    Leases that ended (``guard_seconds`` ago, by this clock) are dropped and their units are free. The holder gets
    its fair share of the units (``units * want / all wants``, rounded down, at least one; all it wants when everyone
    else has their share) within those nobody else holds, and never fewer than its calls in flight (they run on
    units it holds). An instance that gets none is listed with its demand for `WAITING_SECONDS`, so the holders
    give back what is over their share when they renew.
    """
    released_at = record.released_at
    others: dict[str, Lease] = {}
    held = 0
    for name, lease in record.leases.items():
        ended = lease.until + guard_seconds <= now
        if name == holder:
            if ended and lease.units:
                released_at = max(released_at, lease.until + guard_seconds)
            elif not ended:
                held = lease.units
            continue
        if ended:
            if lease.units:
                released_at = max(released_at, lease.until + guard_seconds)
            continue
        others[name] = lease
    free = limits.units - sum(lease.units for lease in others.values())
    wants = want + sum(lease.want for lease in others.values())
    fair = math.floor(limits.units * want / wants) if wants else 0
    target = min(want, max(fair, 1)) if want > 0 else 0
    if all(
        lease.units >= min(lease.want, max(1, math.floor(limits.units * lease.want / wants)))
        for lease in others.values()
    ):
        target = want  # everyone else has their share: what the rounding down left over is free to take
    units = max(min(in_flight, held), min(target, free))
    if units < held:
        released_at = max(released_at, now)  # what it gives back earns tokens again from now
    gained = max(0, units - held)
    new_tokens = _earned(limits, released_at, now - 2 * guard_seconds) * gained if gained else 0.0
    leases = dict(others)
    if units or want:
        until = now + (lease_seconds if units else WAITING_SECONDS)
        leases[holder] = Lease(units=units, want=want, until=until)
    else:
        until = now
    # Without a unit, look again when the first other lease could lapse (the caller caps it at a renewal's time).
    lapses = [lease.until + guard_seconds for lease in others.values() if lease.units]
    retry_at = max(now + 1.0, min(lapses)) if lapses and not units else now + 1.0
    new = LimitsRecord(leases=leases, version=record.version + 1, released_at=released_at)
    return new, Grant(units=units, until=until, new_tokens=new_tokens, retry_at=retry_at)


def _earned(limits: CallLimits, released_at: float, now: float) -> float:
    """Tokens a free unit holds at ``now``: full if no unit was ever given back, else what it earned since the last
    was (`allocate` passes its time less twice the guard: the clock that gave it back may be ahead of this one)."""
    if limits.rate is None:
        return math.inf
    if released_at <= 0:
        return limits.unit_burst
    return min(limits.unit_burst, max(0.0, now - released_at) * limits.unit_rate)


class LimitsStore(Protocol):
    """Where the shared item of each limited agent lives (DynamoDB in Lambda)."""

    def read(self, agent: str) -> LimitsRecord:
        """Return the item (an empty record, version 0, when there is none)."""
        ...

    def write(self, agent: str, expect_version: int, record: LimitsRecord) -> LimitsRecord | None:
        """Replace the item if its version is still ``expect_version``: None when written, else the item as it is."""
        ...


class CallLimiter:
    """The limits as one agent instance keeps them around each call (thread-safe: a batch's records run at once).

    Parameters
    ----------
    agent:
        The agent's name (the item's key).
    limits:
        Its declared limits.
    store:
        The shared item.
    clock:
        Injected time; ``clock.sleep`` waits for a token or a unit.
    holder:
        This instance's name in the item (default: a random one per instance, logged with each write).
    lease_seconds:
        How long a write holds the units; at least a call's longest time plus a renewal and the guard.
    refresh_seconds:
        How often a working instance renews its lease and gives back what it no longer needs.
    guard_seconds:
        The clock difference between instances the leases tolerate.
    max_wait_seconds:
        How long a record may wait in the instance for a unit or a token before it is deferred.
    want_at_once:
        The most units an instance asks for when it needs more: the records it works on at once
        (``AGENT_CONCURRENCY``); it asks for its batch's records (`expect`) up to that.
    rng:
        Spreads the deferrals' waits, so records deferred together do not come back together.
    metrics:
        Counts ``CallLimitWritesLost`` (the agent counts ``CallLimitDeferrals``, once per deferred reply).
    """

    def __init__(
        self,
        agent: str,
        limits: CallLimits,
        store: LimitsStore,
        clock: Clock,
        *,
        holder: str | None = None,
        lease_seconds: float = 30.0,
        refresh_seconds: float = 10.0,
        guard_seconds: float = GUARD_SECONDS,
        max_wait_seconds: float = 2.0,
        want_at_once: int = 1,
        rng: random.Random | None = None,
        metrics: Callable[..., None] | None = None,
    ) -> None:
        self.agent = agent
        self.limits = limits
        self.store = store
        self.clock = clock
        self.holder = holder or uuid.uuid4().hex[:12]
        self.lease_seconds = lease_seconds
        self.refresh_seconds = refresh_seconds
        self.guard_seconds = guard_seconds
        self.max_wait_seconds = max_wait_seconds
        self.want_at_once = want_at_once
        self._expected = want_at_once
        self.rng = rng or random.Random()  # nosec B311 # spreads waits only
        self.metrics = metrics
        # notified when one of this instance's calls ends: a record waiting for a unit of its own instance waits for
        # that, not for the clock (a call's end is another thread's doing)
        self._lock = threading.Condition(threading.Lock())
        self._record: LimitsRecord | None = None
        self._units = 0
        self._until = 0.0
        self._written_at = -math.inf
        self._ask_after = -math.inf
        self._retry_at = 0.0
        self._in_flight = 0
        self._waiting = 0
        self._peak = 0
        self._tokens = 0.0
        self._tokens_at = 0.0

    @property
    def units(self) -> int:
        """The units this instance holds now (0 after its lease ended)."""
        with self._lock:
            return self._units if self._covers(self.clock.now(), 0.0) else 0

    def expect(self, records: int) -> None:
        """A batch of ``records`` is starting: grow to that many units at once (never more than ``want_at_once``),
        so its threads, arriving one by one, cost one write, and an instance with one record takes one unit. The
        batch counts as demand until the next one starts, also where its records ask one after the other (a
        runner that handles them in turn, calls that end before the next record asks)."""
        with self._lock:
            self._expected = max(1, min(records, self.want_at_once))

    @property
    def calls_in_flight(self) -> int:
        """This instance's calls running now (each holds a unit until its permit is released)."""
        with self._lock:
            return self._in_flight

    @property
    def records_waiting(self) -> int:
        """This instance's records waiting now for a unit or a token."""
        with self._lock:
            return self._waiting

    def acquire(self, call_seconds: float, deadline: float, *, priority: int = 3) -> Permit:
        """Wait for a unit and a token for one call of at most ``call_seconds``; give it back with the permit.

        Raises
        ------
        CallsLimitedError
            When none comes within ``max_wait_seconds`` (nor before ``deadline`` less the call's time): the
            record is deferred, ``retry_at`` says when to try again (sooner for a higher ``priority``, 1 to 5:
            `PRIORITY_WAIT`).
        """
        give_up_at = min(self.clock.now() + self.max_wait_seconds, deadline - call_seconds)
        patience = time.monotonic() + self.max_wait_seconds  # for a call of this instance to end
        with self._lock:
            self._waiting += 1
            self._peak = max(self._peak, self._in_flight + self._waiting)
        try:
            while True:
                with self._lock:
                    now = self.clock.now()
                    wait = self._try_take(now, call_seconds)
                    if wait == 0.0:
                        return Permit(self)
                    if wait == math.inf:  # every unit of this instance is calling: wait for one of them to end
                        left = min(patience - time.monotonic(), give_up_at - now)
                        if left <= 0:
                            raise self._deferred(now, wait, priority)
                        self._lock.wait(timeout=left)
                        continue
                    # a token comes at a known time (never less than a millisecond away: a float's rounding must
                    # not make a wait of nothing)
                    pause = max(wait, 0.001)
                    if wait == _DEFER or now + pause > give_up_at:
                        raise self._deferred(now, wait, priority)
                self.clock.sleep(pause)
        finally:
            with self._lock:
                self._waiting -= 1

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify()

    def _covers(self, now: float, call_seconds: float) -> bool:
        """Whether the lease outlasts a call started now (by ``guard_seconds``)."""
        return self._units > 0 and now + call_seconds < self._until - self.guard_seconds

    def _try_take(self, now: float, call_seconds: float) -> float:
        """Take a unit and a token (0.0), or say how long to wait for them (``math.inf``: until one of this
        instance's calls ends; `_DEFER`: this instance has no unit to wait for)."""
        demand = max(self._in_flight + self._waiting, self._expected)  # the batch's records, at once or in turn
        renew = now - self._written_at >= self.refresh_seconds
        grow = demand > self._units and now >= self._ask_after
        if (renew or grow or not self._covers(now, call_seconds)) and (now >= self._ask_after or self._units > 0):
            # A renewal asks for the peak since the last write; growing asks for a whole batch's records at once
            # (the demand counts them), so the threads of one batch, arriving one by one, cost one write and not one
            # each.
            self._write(now, max(self._peak, demand))
        if not self._covers(now, call_seconds):
            return _DEFER
        if self.limits.max_in_flight is not None and self._in_flight >= self._units:
            return math.inf
        tokens = self._refill(now)
        if tokens < 1.0:
            return (1.0 - tokens) / (self.limits.unit_rate * self._units)
        self._tokens, self._tokens_at = tokens - 1.0, now
        self._in_flight += 1
        return 0.0

    def _refill(self, now: float) -> float:
        if self.limits.rate is None:
            return math.inf
        capacity = self.limits.unit_burst * self._units
        return min(capacity, self._tokens + max(0.0, now - self._tokens_at) * self.limits.unit_rate * self._units)

    def _write(self, now: float, want: int) -> None:
        """Renew, grow or shrink this instance's lease by a conditional write (read first in a new instance)."""
        record = self._record if self._record is not None else self.store.read(self.agent)
        for _ in range(WRITE_TRIES):
            new, grant = allocate(
                record,
                self.holder,
                want,
                self._in_flight,
                now,
                self.limits,
                lease_seconds=self.lease_seconds,
                guard_seconds=self.guard_seconds,
            )
            current = self.store.write(self.agent, record.version, new)
            if current is None:
                self._apply(now, new, grant, want)
                return
            record = current
        self._record = record  # others are writing right now: this instance keeps its lease, and asks again later
        self._ask_after = now + 1.0
        self._retry_at = now + 1.0
        if self.metrics is not None:
            self.metrics("CallLimitWritesLost")

    def _apply(self, now: float, record: LimitsRecord, grant: Grant, want: int) -> None:
        if self.limits.rate is not None:
            tokens = self._refill(now) if self._units else 0.0
            if grant.units < self._units:
                tokens = min(tokens, self.limits.unit_burst * grant.units)
            else:
                tokens += grant.new_tokens
            self._tokens, self._tokens_at = tokens, now
        before = self._units
        self._record, self._units, self._until = record, grant.units, grant.until
        self._written_at = now
        self._peak = self._in_flight + self._waiting
        # Fewer units than asked for: the others hold the rest until they renew, so ask again in a second at most.
        self._ask_after = now + 1.0 if grant.units < want else -math.inf
        self._retry_at = min(grant.retry_at, now + self.refresh_seconds)
        if grant.units != before:
            logger.info(
                "call limit units",
                extra={"agent": self.agent, "holder": self.holder, "units": grant.units, "until": grant.until},
            )

    def _deferred(self, now: float, wait: float, priority: int = 3) -> CallsLimitedError:
        """The record's deferral: until a unit may be free (none here), or until this instance's token or unit;
        scaled by its priority (`PRIORITY_WAIT`), never under a second."""
        if wait in (_DEFER, math.inf):
            wait = max(1.0, self._retry_at - now) if self._units == 0 else 1.0
        spread = max(1.0, max(1.0, wait) * PRIORITY_WAIT.get(priority, 1.0) * self.rng.uniform(1.0, 1.5))
        return CallsLimitedError(self.agent, math.ceil(now + spread), self.limits.describe())


class Permit:
    """One call's unit and token; ``release`` (or the ``with`` block's end) gives the unit back to the instance."""

    def __init__(self, limiter: CallLimiter) -> None:
        self._limiter = limiter
        self._released = False

    def release(self) -> None:
        """Give the unit back (once)."""
        if not self._released:
            self._released = True
            self._limiter._release()

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

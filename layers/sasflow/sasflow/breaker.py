"""A circuit breaker per remote service whose state every agent instance shares (Circuit Breaker pattern).

States: CLOSED (calls go through; consecutive failures are counted), OPEN (no calls until ``open_until``),
HALF_OPEN (one instance holds the probe until ``probe_until``; success closes, failure re-opens). The state lives in
a store (DynamoDB in Lambda) so that all concurrent agent instances see the same breaker; every change is a
compare-and-set, so two instances cannot both become the prober. The happy path writes nothing: only failures and
recoveries do. Time comes from the injected clock (DESIGN Rule 7).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from .clock import Clock
from .errors import CircuitOpenError


class BreakerState(StrEnum):
    """Circuit breaker states."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerRecord:
    """Shared breaker state: ``failures`` in a row, ``open_until`` and ``probe_until`` in epoch seconds (float)."""

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    open_until: float = 0.0
    probe_until: float = 0.0


class BreakerStore(Protocol):
    """Where the breaker of each agent lives."""

    def get(self, agent: str) -> BreakerRecord:
        """Return the breaker of ``agent`` (CLOSED when none is stored)."""
        ...

    def record_failure(self, agent: str) -> int:
        """Atomically add one to the failure count; return the new count."""
        ...

    def transition(self, agent: str, expect: BreakerRecord, new: BreakerRecord) -> bool:
        """Compare-and-set on ``state``, ``open_until`` and ``probe_until``; return whether it won."""
        ...

    def reset(self, agent: str) -> None:
        """Close the breaker and clear its failure count."""
        ...


class CircuitBreaker:
    """The breaker one agent instance consults around each remote call.

    Parameters
    ----------
    agent:
        The remote service's agent name.
    store:
        Shared state.
    clock:
        Injected time.
    failure_threshold:
        Consecutive transient failures that open the breaker.
    open_seconds:
        How long it stays open before a half-open probe (seconds).
    probe_seconds:
        How long one instance may hold the probe before another may take it (seconds).
    cache_seconds:
        How long a read of the shared state is reused before reading again (seconds).
    """

    def __init__(
        self,
        agent: str,
        store: BreakerStore,
        clock: Clock,
        *,
        failure_threshold: int = 5,
        open_seconds: float = 30.0,
        probe_seconds: float = 10.0,
        cache_seconds: float = 1.0,
    ) -> None:
        self.agent = agent
        self.store = store
        self.clock = clock
        self.failure_threshold = failure_threshold
        self.open_seconds = open_seconds
        self.probe_seconds = probe_seconds
        self.cache_seconds = cache_seconds
        self._record: BreakerRecord | None = None
        self._read_at = -math.inf
        # The thread that holds this instance's half-open probe: an agent works on a batch's records at once, and a
        # probe is one call, so only the record that won it calls until it ends (its retries included).
        self._prober: int | None = None
        self._lock = threading.RLock()

    @property
    def _probing(self) -> bool:
        return self._prober == threading.get_ident()

    @property
    def state(self) -> BreakerState:
        """The state as this instance last saw it."""
        return self._current().state

    def _current(self) -> BreakerRecord:
        now = self.clock.now()
        if self._record is None or now - self._read_at >= self.cache_seconds:
            self._record = self.store.get(self.agent)
            self._read_at = now
        return self._record

    def _remember(self, record: BreakerRecord) -> None:
        self._record = record
        self._read_at = self.clock.now()

    def before_call(self) -> None:
        """Let a call through, or raise.

        Raises
        ------
        CircuitOpenError
            When the breaker is open, or half-open with another instance probing; ``retry_at`` says when to try
            again (epoch seconds, rounded up).
        """
        with self._lock:
            self._before_call()

    def _before_call(self) -> None:
        record = self._current()
        now = self.clock.now()
        if record.state is BreakerState.CLOSED or self._probing:
            return
        if record.state is BreakerState.OPEN and now < record.open_until:
            raise CircuitOpenError(self.agent, math.ceil(record.open_until))
        if record.state is BreakerState.HALF_OPEN and now < record.probe_until:
            raise CircuitOpenError(self.agent, math.ceil(record.probe_until))
        # Open and cooled down, or a half-open probe that expired: try to become the (only) prober.
        probe = replace(record, state=BreakerState.HALF_OPEN, probe_until=now + self.probe_seconds)
        if self.store.transition(self.agent, record, probe):
            self._remember(probe)
            self._prober = threading.get_ident()
            return
        # Another instance moved the breaker first: read what it did and wait for the real reopening, not a guess
        # (a winner that already failed its probe has reopened the breaker for open_seconds, not probe_seconds).
        current = self.store.get(self.agent)
        self._remember(current)
        if current.state is BreakerState.CLOSED:
            return  # its probe succeeded meanwhile
        if current.state is BreakerState.OPEN and now < current.open_until:
            raise CircuitOpenError(self.agent, math.ceil(current.open_until))
        if current.state is BreakerState.HALF_OPEN and now < current.probe_until:
            raise CircuitOpenError(self.agent, math.ceil(current.probe_until))
        raise CircuitOpenError(self.agent, math.ceil(now + 1))  # it is moving right now: look again in a second

    def on_success(self) -> None:
        """Record a call that reached a healthy service (a success or a business rejection)."""
        with self._lock:
            record = self._current()
            if self._probing:
                self._prober = None
            if record.state is not BreakerState.CLOSED or record.failures > 0:
                self.store.reset(self.agent)
                self._remember(BreakerRecord())

    def on_failure(self) -> None:
        """Record a transient failure; open the breaker at the threshold, or re-open it after a failed probe."""
        with self._lock:
            self._on_failure()

    def _on_failure(self) -> None:
        record = self._current()
        now = self.clock.now()
        if self._probing or record.state is BreakerState.HALF_OPEN:
            if self._probing:
                self._prober = None
            reopened = replace(record, state=BreakerState.OPEN, open_until=now + self.open_seconds, probe_until=0.0)
            if self.store.transition(self.agent, record, reopened):
                self._remember(reopened)
            else:
                self._record = None
            return
        failures = self.store.record_failure(self.agent)
        record = replace(record, failures=failures)
        self._remember(record)
        if record.state is BreakerState.CLOSED and failures >= self.failure_threshold:
            opened = replace(record, state=BreakerState.OPEN, open_until=now + self.open_seconds)
            if self.store.transition(self.agent, record, opened):
                self._remember(opened)
            else:
                self._record = None

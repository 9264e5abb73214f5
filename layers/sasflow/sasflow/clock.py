"""Injected time (DESIGN Rule 7): scheduler, supervisor, agent retry and circuit breaker take a ``Clock``.

Tests move a ``ManualClock``; nothing sleeps to wait for a deadline.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Source of wall time in epoch seconds and of sleeping."""

    def now(self) -> float:
        """Return the current time in epoch seconds (float)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (float, >= 0)."""
        ...


def epoch_seconds(clock: Clock) -> int:
    """Return ``clock.now()`` as whole epoch seconds (int), the unit of every complete-by in the store."""
    return int(clock.now())


class SystemClock:
    """The real clock: ``time.time`` and ``time.sleep``."""

    def now(self) -> float:
        """Return ``time.time()`` (epoch seconds)."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` for real (only the agent's retry backoff does this in production)."""
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that only moves when told to; ``sleep`` advances it instantly.

    Parameters
    ----------
    start:
        Initial time in epoch seconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        """Return the current manual time (epoch seconds)."""
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        """Advance the clock by ``seconds`` without waiting."""
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            raise ValueError("time never goes backwards")
        with self._lock:
            self._now += seconds

    def set(self, epoch: float) -> None:
        """Jump to ``epoch`` (must not be earlier than now)."""
        with self._lock:
            if epoch < self._now:
                raise ValueError("time never goes backwards")
            self._now = float(epoch)


class OffsetClock:
    """A clock skewed against another by a fixed offset (positive = ahead), for clock-skew tests."""

    def __init__(self, base: Clock, offset_seconds: float) -> None:
        self._base = base
        self._offset = offset_seconds

    def now(self) -> float:
        """Return the base clock's time plus the offset (epoch seconds)."""
        return self._base.now() + self._offset

    def sleep(self, seconds: float) -> None:
        """Delegate to the base clock."""
        self._base.sleep(seconds)

"""Fakes of the sample services' tests: clocks that tests move (epoch seconds), and outcome counters."""

from __future__ import annotations

import threading

from travel_services import Outcome

START = 1_700_000_000.0


class FakeClock:
    """A clock whose ``sleep`` advances ``now`` at once and records how long it slept (seconds)."""

    def __init__(self, start: float = START) -> None:
        self._lock = threading.Lock()
        self._now = start
        self.slept: list[float] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self._now += seconds

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def set(self, epoch_seconds: float) -> None:
        with self._lock:
            self._now = epoch_seconds


class GatedClock(FakeClock):
    """A fake clock whose ``sleep`` blocks until the test opens the gate: a hang the test can interleave with."""

    def __init__(self, start: float = START) -> None:
        super().__init__(start)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.entered.set()
        # A safety net against a deadlocked test, not a wait for time: the test opens the gate explicitly.
        if not self.gate.wait(timeout=30):
            raise AssertionError("the test never opened the gate")
        super().sleep(seconds)


def outcomes(**nonzero: int) -> dict[str, int]:
    """Return ``stats()["by_outcome"]`` as expected: every outcome 0 except those given."""
    counts = {outcome.value: 0 for outcome in Outcome}
    unknown = set(nonzero) - set(counts)
    if unknown:
        raise KeyError(f"no outcomes {sorted(unknown)}")
    return {**counts, **nonzero}

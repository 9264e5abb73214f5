"""``sasflow watch``: read a workflow every few seconds until it is terminal (or waits for a person).

The loop takes its clock and its sleep, so a test runs it through a whole workflow without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["STOP_STATUSES", "TERMINAL_STATUSES", "WatchResult", "watch"]

#: A workflow in one of these never changes again, except through an operator action.
TERMINAL_STATUSES: Final = frozenset({"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"})
#: Where watching stops: the terminal states, and HELD (it waits for a person).
STOP_STATUSES: Final = TERMINAL_STATUSES | {"HELD"}


@dataclass(frozen=True)
class WatchResult:
    """The last view read, how many reads it took, and whether the watch timed out first."""

    view: dict[str, Any]
    reads: int
    timed_out: bool


def watch(
    fetch: Callable[[], dict[str, Any]],
    show: Callable[[dict[str, Any], float], None],
    *,
    interval_seconds: float = 2.0,
    timeout_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchResult:
    """Read with ``fetch`` and ``show`` each view (with the epoch time of the read), until a stop status.

    Parameters
    ----------
    fetch
        Returns the WorkflowView.
    show
        Draws it (``now`` in epoch seconds is passed so lateness can be shown).
    interval_seconds
        Wait between reads (seconds).
    timeout_seconds
        Give up after this long (seconds, by ``clock``); None watches until the workflow stops.
    clock, now, sleep
        Monotonic clock, wall clock (epoch seconds) and sleep; injected by tests.
    """
    started = clock()
    reads = 0
    while True:
        view = fetch()
        reads += 1
        show(view, now())
        if view.get("status") in STOP_STATUSES:
            return WatchResult(view, reads, timed_out=False)
        if timeout_seconds is not None and clock() - started + interval_seconds > timeout_seconds:
            return WatchResult(view, reads, timed_out=True)
        sleep(interval_seconds)

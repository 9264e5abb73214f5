"""Waiting for something the local stack does in threads of its own (a poller, a schedule): poll, never sleep a
guess."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 60.0, interval: float = 0.05) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy, and return that; fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not reached within {timeout} s")

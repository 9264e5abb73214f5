"""devstack.uplock: one `make up` per checkout; a dead process's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.uplock import StackAlreadyRunningError, UpLock, read_running

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_second_lock_in_the_same_checkout_is_refused_with_the_holders_pid_and_url(tmp_path: Path) -> None:
    # Given a `make up` that holds the lock and published its URL
    path = tmp_path / ".devstack" / "up.lock"
    with UpLock(path) as first:
        first.publish(api_url="http://127.0.0.1:3106", services={"flights": "http://127.0.0.1:41001"})
        # When a second one tries
        with pytest.raises(StackAlreadyRunningError) as refused:
            UpLock(path).acquire()
        running = read_running(path)
    # Then it is refused with a message that names the holder, and other terminals read the holder's URLs
    assert refused.value.holder["pid"] == os.getpid()
    assert f"pid {os.getpid()}, API http://127.0.0.1:3106" in str(refused.value)
    assert f"kill {os.getpid()}" in str(refused.value)
    assert running is not None
    assert (running["pid"], running["services"]) == (os.getpid(), {"flights": "http://127.0.0.1:41001"})
    # And once released nobody holds it: the next one takes it without calling it stale
    assert read_running(path) is None
    with UpLock(path) as again:
        assert again.stale_pid is None


def test_the_lock_of_a_killed_process_is_taken_over_and_its_pid_reported(tmp_path: Path) -> None:
    # Given a process that took the lock and was killed without releasing it (SIGKILL: no cleanup ran)
    path = tmp_path / ".devstack" / "up.lock"
    code = (
        "import sys, time; from pathlib import Path; from devstack.uplock import UpLock; "
        f"UpLock(Path({str(path)!r})).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert read_running(path) == {"pid": holder.pid, "started_at": json.loads(path.read_text())["started_at"]}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # When a new `make up` starts in the same checkout
    assert json.loads(path.read_text())["pid"] == holder.pid  # the file outlived its process
    assert read_running(path) is None
    with UpLock(path) as lock:
        # Then it takes the lock over and says whose it was
        assert lock.stale_pid == holder.pid
        assert json.loads(path.read_text())["pid"] == os.getpid()

"""One ``make up`` per checkout: the lock file ``.devstack/up.lock`` and what it tells other terminals.

Two stacks started from one checkout would share ``.devstack/`` (the function logs, this file), so the second one
refuses. The lock is an advisory ``flock`` on the file, held for the life of the process: the kernel drops it when
the process ends, however it ends, so a lock left by a dead process (its file still there, with its pid) is simply
taken over. The file's content is JSON for people and for ``python -m devstack faults``:

``{"pid": 1234, "started_at": 1764745200, "api_url": "http://127.0.0.1:3000",
"services": {"flights": "http://127.0.0.1:41001", ...}}``

(``started_at`` in epoch seconds; ``api_url`` and ``services`` once the stack is up.)
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final

__all__ = ["DEFAULT_LOCK_PATH", "StackAlreadyRunningError", "UpLock", "read_running"]

#: The lock of the checkout's ``make up`` (relative to the working directory, like the function logs).
DEFAULT_LOCK_PATH: Final = Path(".devstack") / "up.lock"


class StackAlreadyRunningError(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote (``{}`` while it is still starting)."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        pid = holder.get("pid", "unknown")
        where = f", API {holder['api_url']}" if holder.get("api_url") else ""
        super().__init__(
            f"another `make up` is running in this checkout (pid {pid}{where}; lock {path}). Stop it first "
            f"(Ctrl-C in its terminal, or kill {pid}), or start this one from another checkout."
        )
        self.path = path
        self.holder = holder


class UpLock:
    """The lock of one ``make up``: `acquire` it before starting anything, `publish` the URLs once up.

    Parameters
    ----------
    path
        The lock file; its folder is created.

    Attributes
    ----------
    stale_pid : int or None
        After `acquire`: the pid of a dead process whose lock this one took over, else None.
    """

    def __init__(self, path: Path = DEFAULT_LOCK_PATH) -> None:
        self.path = Path(path)
        self.stale_pid: int | None = None
        self._fd: int | None = None
        self._content: dict[str, Any] = {}

    def acquire(self) -> UpLock:
        """Take the lock and write this process's pid.

        Raises
        ------
        StackAlreadyRunningError
            A live process holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StackAlreadyRunningError(self.path, _read(self.path)) from None
        self._fd = fd
        previous = _read(self.path).get("pid")
        # The file outlived its process: the kernel released that process's lock when it ended.
        self.stale_pid = previous if isinstance(previous, int) and previous != os.getpid() else None
        self._content = {"pid": os.getpid(), "started_at": int(time.time())}
        self._write()
        return self

    def publish(self, **values: Any) -> None:
        """Add ``values`` (JSON-able: ``api_url``, ``services``) to the file, for other terminals."""
        self._content.update(values)
        self._write()

    def release(self) -> None:
        """Empty the file and drop the lock. Idempotent.

        The file stays: removing it would let a newcomer that opened it just before lock an unlinked file while a
        third process creates a new one, and both would run.
        """
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> UpLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def _write(self) -> None:
        assert self._fd is not None
        data = json.dumps(self._content).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)


def read_running(path: Path = DEFAULT_LOCK_PATH) -> dict[str, Any] | None:
    """What the live ``make up`` of this checkout wrote to its lock, or None when none holds it.

    A file whose lock nobody holds (its process ended) counts as none.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read(path)  # held: a live stack
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}  # being written, or not ours: the caller's message says what it knows
    return content if isinstance(content, dict) else {}

"""`make up` as a person runs it, for the system tests that run documented commands (the README's tour, the
on-call drills of docs/operate.md): the stack in a process of its own, in a folder laid out like the repository's
root, and the ``bash`` blocks of a document's section read as the commands to run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.lambdas import ROOT

PYTHON = ROOT / ".venv" / "bin" / "python"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class RunningUp:
    """A running ``python -m devstack up``: its process, the API's URL, its folder and what it printed until ready."""

    process: subprocess.Popen[str]
    url: str
    folder: Path
    printed: list[str]

    def run(self, command: str, *, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run one documented command line through bash in the stack's folder, ``$URL`` set, 160 columns (the
        environment's PATH as it is: a document's bare ``sasflow`` would be ``command not found``, as for a reader)."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env={**os.environ, "URL": self.url, "COLUMNS": "160"},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> str:
        """Ctrl-C in its terminal (SIGINT to the process group); return what it printed from then on."""
        os.killpg(self.process.pid, signal.SIGINT)
        rest, _ = self.process.communicate(timeout=60)
        return rest


def bash_blocks(text: str) -> list[list[str]]:
    """The ``bash`` code blocks of ``text``, each as its non-empty command lines."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


@contextmanager
def make_up(folder: Path, arguments: list[str]) -> Iterator[RunningUp]:
    """Start ``python -m devstack up ARGUMENTS --port 0`` in ``folder`` (linked to the repository's .venv, events,
    devstack and definitions) and yield it once it printed ``ready``; kill its process group at the end."""
    for name in (".venv", "events", "devstack", "definitions"):
        (folder / name).symlink_to(ROOT / name)
    environment = {**os.environ, "PYTHONPATH": f"{ROOT / 'layers' / 'sasflow'}:{ROOT}"}
    process = subprocess.Popen(
        [str(PYTHON), "-m", "devstack", "up", *arguments, "--port", "0"],
        cwd=folder,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    printed: list[str] = []
    url = None
    assert process.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        printed.append(line)
        found = re.match(r"HTTP API\s+(http://127\.0\.0\.1:\d+)", line)
        url = found.group(1) if found else url
        if line.startswith("ready"):
            break
    try:
        assert url is not None and printed[-1].startswith("ready"), "".join(printed)
        yield RunningUp(process, url, folder, printed)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)

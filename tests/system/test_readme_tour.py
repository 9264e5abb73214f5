"""System tier: the README's five-minute tour, run as written, on the local stack that `make up` starts.

From a clean-clone trial: the tour was not copy-pasteable (a bare ``sasflow`` is ``command not found`` outside the
venv). This test reads the tour's shell blocks out of README.md, starts the stack with the first block's ARGS (as
``make up`` runs it: ``python -m devstack up``), runs every other line through bash in a folder laid out like the
repository's root, with ``$URL`` the stack's URL and ``ID`` the workflow id the previous ``start`` printed, and
checks each exit code. Then it stops the stack as Ctrl-C does (SIGINT to the process group): it says "stopped".
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lambdas import ROOT

PYTHON = ROOT / ".venv" / "bin" / "python"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: What the README says of each command of the tour, in order: `watch` exits 3 when the trip ends COMPENSATED.
EXPECTED_EXIT_CODES = [0, 0, 3, 0, 0, 0]


def tour_blocks() -> list[list[str]]:
    """The ``bash`` blocks of the README's "A five-minute tour", each as its command lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path, list[str]]]:
    # A folder laid out like the repository's root (the tour's relative paths, and its own .devstack/ lock and logs)
    for name in (".venv", "events", "devstack", "definitions"):
        (tmp_path / name).symlink_to(ROOT / name)
    [make_up] = tour_blocks()[0]
    arguments = shlex.split(re.fullmatch(r'make up ARGS="(.*)"', make_up).group(1))  # type: ignore[union-attr]
    environment = {**os.environ, "PYTHONPATH": f"{ROOT / 'layers' / 'sasflow'}:{ROOT}"}
    process = subprocess.Popen(
        [str(PYTHON), "-m", "devstack", "up", *arguments, "--port", "0"],
        cwd=tmp_path,
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
        yield process, url, tmp_path, printed
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def test_the_readme_tour_runs_as_written_and_the_stack_stops_cleanly(
    stack: tuple[subprocess.Popen[str], str, Path, list[str]],
) -> None:
    process, url, folder, printed = stack
    commands = [line for block in tour_blocks()[1:] for line in block if not line.startswith("URL=")]
    workflow_id = ""
    codes = []
    for command in commands:
        if re.search(r"\bID\b", command.split("#")[0]):
            assert workflow_id, f"{command}: no workflow id was printed before it"
            command = re.sub(r"\bID\b", workflow_id, command)
        ran = subprocess.run(
            ["bash", "-c", command],
            cwd=folder,
            env={**os.environ, "URL": url, "COLUMNS": "160"},
            capture_output=True,
            text=True,
            timeout=180,
        )
        codes.append(ran.returncode)
        assert ran.returncode in (0, 3), f"{command}\n{ran.stdout}\n{ran.stderr}"
        if " start " in command:
            found = UUID.search(ran.stdout)
            assert found, ran.stdout
            workflow_id = found.group(0)
    assert codes == EXPECTED_EXIT_CODES
    assert (folder / "trip.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Ctrl-C in its terminal: the whole process group gets SIGINT; the stack stops and says so, and nothing failed
    os.killpg(process.pid, signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert "stopped" in rest.splitlines(), rest
    assert process.returncode == 0, rest
    assert "Runtime.ExitError" not in "".join(printed) + rest

"""System tier: the README's five-minute tour, run as written, on the local stack that `make up` starts.

From a clean-clone trial: the tour was not copy-pasteable (a bare ``sasflow`` is ``command not found`` outside the
venv). This test reads the tour's shell blocks out of README.md, starts the stack with the first block's ARGS (as
``make up`` runs it: ``python -m devstack up``), runs every other line through bash in a folder laid out like the
repository's root, with ``$URL`` the stack's URL and ``ID`` the workflow id the previous ``start`` printed, and
checks each exit code. Then it stops the stack as Ctrl-C does (SIGINT to the process group): it says "stopped".
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lambdas import ROOT
from tests.support.up_stack import UUID, RunningUp, bash_blocks, make_up

#: What the README says of each command of the tour, in order: `watch` exits 3 when the trip ends COMPENSATED.
EXPECTED_EXIT_CODES = [0, 0, 3, 0, 0, 0]


def tour_blocks() -> list[list[str]]:
    """The ``bash`` blocks of the README's "A five-minute tour", each as its command lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return bash_blocks(text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0])


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[RunningUp]:
    [up] = tour_blocks()[0]
    arguments = shlex.split(re.fullmatch(r'make up ARGS="(.*)"', up).group(1))  # type: ignore[union-attr]
    with make_up(tmp_path, arguments) as running:
        yield running


def test_the_readme_tour_runs_as_written_and_the_stack_stops_cleanly(stack: RunningUp) -> None:
    # the banner says which batching windows run (the default Profile: no window anywhere)
    assert "windows       Profile=latency: scheduler 0 s, agents 0 s\n" in stack.printed, stack.printed
    commands = [line for block in tour_blocks()[1:] for line in block if not line.startswith("URL=")]
    workflow_id = ""
    codes = []
    for command in commands:
        if re.search(r"\bID\b", command.split("#")[0]):
            assert workflow_id, f"{command}: no workflow id was printed before it"
            command = re.sub(r"\bID\b", workflow_id, command)
        ran = stack.run(command)
        codes.append(ran.returncode)
        assert ran.returncode in (0, 3), f"{command}\n{ran.stdout}\n{ran.stderr}"
        if " start " in command:
            found = UUID.search(ran.stdout)
            assert found, ran.stdout
            workflow_id = found.group(0)
    assert codes == EXPECTED_EXIT_CODES
    assert (stack.folder / ".devstack" / "trip.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Ctrl-C in its terminal: the whole process group gets SIGINT; the stack stops and says so, and nothing failed
    rest = stack.stop()
    assert "stopped" in rest.splitlines(), rest
    assert stack.process.returncode == 0, rest
    assert "Runtime.ExitError" not in "".join(stack.printed) + rest

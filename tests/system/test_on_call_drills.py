"""System tier: the on-call drills of docs/operate.md, run as written, on the local stack that `make up` starts.

A clean-clone trial could not drill a dead letter (it needed a restart with a short visibility timeout, losing all
state, and a hand-written send of a bad body) nor a COMPENSATION_FAILED workflow (a definition of its own and a timed
polling loop). This test reads each drill's ``bash`` block out of docs/operate.md, starts one stack with the
service-down drill's ARGS, and runs every line through bash, with ``$URL`` the stack's URL and ``ID``/``ID2`` the ids
the drill's starts printed. Each line's exit code and what it prints are checked against what the document says of
it; a line the document says settles "within seconds" is run again until it does, for at most a minute (a person
runs it again too).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator

import pytest

from tests.support.lambdas import ROOT
from tests.support.up_stack import UUID, RunningUp, bash_blocks, make_up

OPERATE = ROOT / "docs" / "operate.md"
#: How long a line that settles "within seconds" may take to show what the document says (seconds).
SETTLES_WITHIN = 60.0


def drill(title: str) -> list[str]:
    """The command lines of the drill ``**Drill: TITLE.**`` of docs/operate.md."""
    text = OPERATE.read_text(encoding="utf-8")
    section = text.split(f"**Drill: {title}.**", 1)[1].split("**Drill: ", 1)[0]
    return bash_blocks(section)[0]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningUp]:
    text = OPERATE.read_text(encoding="utf-8")
    arguments = re.search(r'\*\*Drill: a service goes down\.\*\* .*?`make up ARGS="(.*?)"`', text, flags=re.DOTALL)
    assert arguments is not None
    with make_up(tmp_path_factory.mktemp("drills"), shlex.split(arguments.group(1))) as running:
        yield running


def bare(line: str) -> str:
    """A drill's command line without its trailing comment."""
    return line.split("  #", 1)[0].rstrip()


def run_until(stack: RunningUp, command: str, code: int, pattern: str, *, settles: bool = False) -> str:
    """Run ``command``; require exit ``code`` and ``pattern`` in its output (again until both hold when it
    ``settles``, for at most `SETTLES_WITHIN`); return its output."""
    deadline = time.monotonic() + (SETTLES_WITHIN if settles else 0)
    while True:
        ran = stack.run(command)
        output = ran.stdout + ran.stderr
        if ran.returncode == code and re.search(pattern, output, flags=re.DOTALL):
            return output
        if time.monotonic() >= deadline:
            raise AssertionError(f"{command}\nexit {ran.returncode} (expected {code}), no {pattern!r} in:\n{output}")
        time.sleep(1)


def test_the_poison_message_drill_runs_as_written(stack: RunningUp) -> None:
    poison, depth, peek, redrive, back = drill("a poison message")
    # The fault command puts it on flights' request queue and says where it will end
    sent = run_until(stack, poison, 0, r"poison message \S+ sent to \S*FlightsRequestQueue")
    assert "sasflow dlq list FlightsDeadLetterQueue" in sent
    # Within seconds (not 5 x 180 s), without a restart, the dead-letter queue holds it
    started = time.monotonic()
    run_until(stack, depth, 0, r"FlightsDeadLetterQueue\W+1\b", settles=True)
    assert time.monotonic() - started < SETTLES_WITHIN
    # Peeking shows a message that is no workflow's, received five times or more, and takes nothing
    run_until(stack, peek, 0, r"unreadable")
    as_json = json.loads(stack.run(bare(peek) + " --json").stdout)
    [message] = as_json["queues"][0]["messages"]
    assert (message["kind"], message["workflow_id"]) == ("unreadable", None)
    assert message["receive_count"] >= 5
    # The redrive moves it back and says so; being poison, it is in the dead-letter queue again within seconds
    run_until(stack, redrive, 0, r"move COMPLETED: 1 of 1 moved")
    run_until(stack, back, 0, r"unreadable", settles=True)


def test_the_compensation_drill_runs_as_written(stack: RunningUp) -> None:
    lines = drill("a compensation fails")
    refuse, cannot_cancel, first, second, find, history, fix, retry, watch, resolve = lines
    run_until(stack, refuse, 0, r"payments")
    run_until(stack, cannot_cancel, 0, r"flights")
    # Each trip unwinds, and the flight's compensation gives up after its 3 attempts: watch exits 3
    ids = []
    for start in (first, second):
        ended = run_until(stack, start, 3, r"COMPENSATION_FAILED")
        found = UUID.search(ended)
        assert found, ended
        ids.append(found.group(0))
    wid, wid2 = ids
    # Both are found waiting for a person
    listed = run_until(stack, find, 0, r"COMPENSATION_FAILED")
    assert wid in listed and wid2 in listed
    # The history shows the flight's three failed attempts to cancel, with their error code
    shown = run_until(stack, history.replace("ID", wid), 0, r"TRANSIENT_EXHAUSTED")
    events = json.loads(stack.run(bare(history).replace("ID", wid) + " --json").stdout)["events"]
    replies = [e for e in events if e["kind"] == "compensation_reply_applied" and e["step"] == "reserve_flight"]
    assert [(e["attempt"], e["error_code"]) for e in replies] == [(n, "TRANSIENT_EXHAUSTED") for n in (1, 2, 3)]
    assert "COMPENSATION_FAILED" in shown
    # The cause fixed, the retry undoes the flight: COMPENSATED, the operator's action in the history
    run_until(stack, fix, 0, r"flights")
    run_until(stack, retry.replace("ID", wid), 0, r"COMPENSATING")
    run_until(stack, watch.replace("ID", wid), 3, r"COMPENSATED")
    view = json.loads(stack.run(f".venv/bin/sasflow --url $URL get {wid} --json").stdout)
    assert (view["status"], view["steps"][0]["compensation_status"]) == ("COMPENSATED", "COMPENSATED")
    events = json.loads(stack.run(f".venv/bin/sasflow --url $URL history {wid} --json").stdout)["events"]
    [audit] = [e for e in events if e["kind"] == "operator_action"]
    assert (audit["detail"]["action"], audit["detail"]["reason"]) == ("retry-compensation", "flights is back")
    # The other is resolved by hand: COMPENSATED at once, the flight's compensation marked done by the operator
    run_until(stack, resolve.replace("ID2", wid2), 0, r"COMPENSATED")
    view = json.loads(stack.run(f".venv/bin/sasflow --url $URL get {wid2} --json").stdout)
    assert view["status"] == "COMPENSATED"
    assert view["steps"][0]["compensation_status"] == "COMPENSATED"

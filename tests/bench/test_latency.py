"""bench.throughput's per-step overhead: the two paths measured from recorded calls and invocation starts."""

from __future__ import annotations

import pytest

from bench.throughput import MAIN_PROCESS, Call, latency_rows, per_step_latency, percentile

SCHEDULER, AGENT, MAIN = 11, 22, 1
OWNERS = {SCHEDULER: "SchedulerFunction", AGENT: "FlightsAgentFunction", MAIN: MAIN_PROCESS}


def _call(pid: int, operation: str, started: float, seconds: float, messages: list[list[str]] | None) -> Call:
    return Call(started, seconds, pid, "sqs", operation, None, None, 0, 0.0, None, messages)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 1.0)) == (10.0, 19.0, 20.0)
    assert percentile([3.0], 0.95) == 3.0


def test_both_paths_are_measured_from_the_run_timestamps() -> None:
    # Given: the scheduler sends w1's request for s1 (ends at 10.0); the mapping receives it (10.2 -> 10.3); the
    # agent's handler starts at 10.9 and its reply is sent at 11.0; the mapping receives the reply (11.1 -> 11.2);
    # the scheduler's invocation starts at 11.6, reads and writes (0.05 s each) and sends s2's request (ends 11.8)
    request_1 = ["m1", "w1/s1/action/1/step.request"]
    reply_1 = ["m2", "w1/s1/action/1/step.reply"]
    request_2 = ["m3", "w1/s2/action/1/step.request"]
    calls = [
        _call(SCHEDULER, "SendMessageBatch", 9.99, 0.01, [request_1]),
        _call(MAIN, "ReceiveMessage", 10.2, 0.1, [request_1]),
        _call(AGENT, "SendMessageBatch", 10.99, 0.01, [reply_1]),
        _call(MAIN, "ReceiveMessage", 11.1, 0.1, [reply_1]),
        _call(SCHEDULER, "GetItem", 11.6, 0.05, None),
        _call(SCHEDULER, "PutItem", 11.65, 0.05, None),
        _call(SCHEDULER, "SendMessageBatch", 11.7, 0.1, [request_2]),
    ]
    invocations = [
        {"started": 10.9, "message_ids": ["m1"], "pid": AGENT},
        {"started": 11.6, "message_ids": ["m2"], "pid": SCHEDULER},
    ]
    # When measured
    latency = per_step_latency(calls, invocations, OWNERS)
    # Then reply received (11.2) -> next request sent (11.8): 0.6 s, of which the scheduler's calls 0.2 s
    to_next = latency["reply_to_next_request"]
    assert to_next["samples"] == 1
    assert to_next["p50"] == pytest.approx(0.6)
    assert to_next["calls_p50"] == pytest.approx(0.2)
    # and request sent (10.0) -> agent start (10.9): 0.9 s; the receive after the send: 0.1 s (s2's never started)
    to_agent = latency["request_to_agent_start"]
    assert to_agent["samples"] == 1
    assert to_agent["p95"] == pytest.approx(0.9)
    assert to_agent["calls_p95"] == pytest.approx(0.1)
    rows = latency_rows(latency, {"SchedulerFunction": 1.0, "FlightsAgentFunction": 0.5})
    assert [row.ours for row in rows] == ["0.600 / 0.600", "0.900 / 0.900"]
    assert [row.anchor for row in rows] == ["window 1 s; calls 0.200 / 0.200", "window 0.5 s; calls 0.100 / 0.100"]

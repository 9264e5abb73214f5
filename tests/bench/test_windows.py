"""bench.windows: the per-step overhead of chains, the configurations measured, the rows and their targets."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from bench.windows import (
    COST_TARGET,
    LATENCY_TARGET_SECONDS,
    NOT_DEPLOYABLE,
    Configuration,
    Measured,
    ServiceCall,
    configurations,
    deployed_parameters,
    latency_summary,
    measure_chains,
    parse_pairs,
    rows,
    s1_cost,
    step_overheads,
    timed_services,
)
from http_server import serve_all

ORDER = ["a", "b", "c"]


def _call(workflow: str, step: str, started: float, ended: float) -> ServiceCall:
    return ServiceCall(workflow, step, "reserve", started, ended)


def test_a_steps_overhead_is_its_calls_start_minus_the_previous_steps_end() -> None:
    # Given two chains: w1's steps called at 10.0-10.1, 10.5-10.7, 13.0-13.0; w2's first step called twice (a
    # resend: the first call counts) and its last step never called
    calls = [
        _call("w1", "c", 13.0, 13.0),
        _call("w1", "a", 10.0, 10.1),
        _call("w1", "b", 10.5, 10.7),
        _call("w2", "a", 20.0, 20.2),
        _call("w2", "a", 25.0, 25.1),
        _call("w2", "b", 21.0, 21.5),
    ]
    # When the overheads are measured
    measured = step_overheads(calls, ORDER)
    # Then each step after the first gives one sample: w1 b 10.5 - 10.1, w1 c 13.0 - 10.7, w2 b 21.0 - 20.2
    assert measured["overhead"] == pytest.approx([0.4, 2.3, 0.8])
    assert measured["step_seconds"] == pytest.approx([0.5, 2.5, 1.0])  # start to start: the service's time added
    assert sorted(measured["service_seconds"]) == pytest.approx([0.0, 0.1, 0.2, 0.2, 0.5])
    assert measured["extra_calls"] == 1


def test_a_chain_that_stopped_gives_no_sample_past_the_gap() -> None:
    # Given a chain whose step b was never called, and c was (it cannot be: c needs b's output)
    calls = [_call("w1", "a", 1.0, 1.1), _call("w1", "c", 3.0, 3.1)]
    # Then it gives no sample
    assert step_overheads(calls, ORDER)["overhead"] == []


def test_the_summary_gives_nearest_rank_percentiles_of_the_overhead() -> None:
    # Given 20 overheads 0.01 .. 0.20 s, steps 0.1 s longer, services of 0.1 s
    overhead = [index / 100 for index in range(1, 21)]
    measured = {
        "overhead": overhead,
        "step_seconds": [value + 0.1 for value in overhead],
        "service_seconds": [0.1] * 21,
        "extra_calls": 0,
    }
    # When summed up
    summary = latency_summary(measured)
    # Then p50 is the 10th value, p95 the 19th (nearest rank), and the mean and max are the plain ones
    assert summary["samples"] == 20
    assert (summary["p50"], summary["p95"], summary["max"]) == (0.10, 0.19, 0.20)
    assert summary["mean"] == pytest.approx(0.105)
    assert summary["step_p50"] == pytest.approx(0.20)
    assert summary["service_p50"] == pytest.approx(0.1)


def test_window_pairs_are_seconds_and_a_fraction_is_not_deployable() -> None:
    assert parse_pairs("0/0, 1/2,") == [(0.0, 0.0), (1.0, 2.0)]
    assert parse_pairs("0.5/0.5") == [(0.5, 0.5)]
    with pytest.raises(ValueError, match=r"0\.\.300"):
        parse_pairs("301/0")
    with pytest.raises(ValueError, match=r"0\.\.300"):
        parse_pairs("-1/0")
    with pytest.raises(ValueError, match="expected scheduler/agent windows"):
        parse_pairs("2")
    with pytest.raises(ValueError, match="expected scheduler/agent windows"):
        parse_pairs("half/0")
    # AWS takes MaximumBatchingWindowInSeconds in whole seconds: 0.5 s runs on the local stack only
    [half] = [c for c in configurations([(0.5, 0.5)]) if c.profile is None]
    assert (half.pair, half.deployable, half.name) == ((0.5, 0.5), False, "0.5 s / 0.5 s")
    assert half.parameters == {"SchedulerBatchingWindowSeconds": "0.5", "AgentBatchingWindowSeconds": "0.5"}
    assert all(c.deployable for c in configurations([(1, 1)]))


def test_the_configurations_are_the_templates_profiles_then_the_pairs_no_profile_deploys() -> None:
    # When the profiles and the diagonal are asked for
    found = configurations([(0, 0), (1, 1), (0, 2), (2, 2)])
    # Then the profiles come first with their windows from template.yaml's BatchingProfiles, and 0/0 and 0/2 are
    # not measured twice
    assert [(c.name, c.pair, c.profile) for c in found] == [
        ("Profile=latency", (0.0, 0.0), "latency"),
        ("Profile=cost", (0.0, 2.0), "cost"),
        ("1 s / 1 s", (1.0, 1.0), None),
        ("2 s / 2 s", (2.0, 2.0), None),
    ]
    assert found[0].parameters == {"Profile": "latency"}
    assert found[2].parameters == {"SchedulerBatchingWindowSeconds": "1", "AgentBatchingWindowSeconds": "1"}
    assert found[1].label == "windows 0 s / 2 s (Profile=cost)"


def _measured(config: Configuration, p50: float, vs_durable: float) -> Measured:
    latency = {"p50": p50, "p95": p50 + 0.1, "samples": 36, "chains": 4, "steps": 10, "step_p50": p50,
               "service_p50": 0.0}  # fmt: skip
    s1 = {"ours_per_step": vs_durable * 8e-6, "durable_per_step": 8e-6, "standard_per_step": 25e-6,
          "vs_durable": vs_durable, "vs_standard": vs_durable * 8 / 25}  # fmt: skip
    return Measured(config, latency, s1)


def test_the_latency_profile_carries_the_latency_target_and_the_cost_profile_the_cost_target() -> None:
    latency = Configuration("Profile=latency", {"Profile": "latency"}, 0.0, 0.0, profile="latency")
    cheap = Configuration("Profile=cost", {"Profile": "cost"}, 0.0, 2.0, profile="cost")
    pair = Configuration("1 s / 1 s", {}, 1.0, 1.0)
    # Given the latency profile at p50 0.2 s and 0.72 of durable functions, the cost profile at 2.2 s and 0.49,
    # and a pair at 1.2 s and 0.53
    table = rows([_measured(latency, 0.2, 0.72), _measured(cheap, 2.2, 0.49), _measured(pair, 1.2, 0.53)])
    # Then three rows each: overhead, vs durable functions, vs Step Functions Standard
    assert len(table) == 9
    overhead, durable, standard = table[:3]
    assert overhead.ours == "0.200 / 0.300"
    assert (overhead.target, overhead.met) == (f"p50 <= {LATENCY_TARGET_SECONDS:g} s", True)
    assert durable.ratio == pytest.approx(0.72)
    assert (durable.target, durable.met) == ("", None)  # no cost target here
    assert standard.ratio == pytest.approx(0.72 * 8 / 25) and standard.anchor == pytest.approx(25.0)
    # and the cost profile's durable row is checked against 0.50, its overhead row not checked at all
    assert (table[3].target, table[3].met) == ("", None)
    assert (table[4].target, table[4].met) == (f"<= {COST_TARGET:g}", True)
    assert table[4].ours == pytest.approx(0.49 * 8) and table[4].anchor == pytest.approx(8.0)
    # and a pair has no target
    assert all(row.met is None for row in table[6:])


def test_a_missed_target_is_a_no_on_either_side() -> None:
    latency = Configuration("Profile=latency", {"Profile": "latency"}, 0.0, 0.0, profile="latency")
    cheap = Configuration("Profile=cost", {"Profile": "cost"}, 0.0, 2.0, profile="cost")
    table = rows([_measured(latency, 0.51, 0.72), _measured(cheap, 2.2, 0.501)])
    assert (table[0].met, table[4].met) == (False, False)


def test_the_services_time_each_steps_call() -> None:
    # Given the sample services on loopback, timed
    servers = serve_all()
    try:
        with timed_services(servers) as calls:
            # When flights is called for one step of a workflow
            token = uuid.uuid4().hex
            body = json.dumps({"token": token, "workflow_id": "w-1", "step": "book_flight", "input": {}}).encode()
            request = urllib.request.Request(
                f"{servers['flights'].base_url}/reserve",
                data=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": token},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200
        # Then the call is recorded with its step and a duration, and the service is unwrapped again
        assert [(c.workflow_id, c.step, c.action) for c in calls] == [("w-1", "book_flight", "reserve")]
        assert 0 <= calls[0].ended - calls[0].started < 5
        assert all("handle" not in vars(server.service) for server in servers.values())
    finally:
        for server in servers.values():
            server.stop()


def test_s1_is_not_run_again_for_a_deployment_already_measured() -> None:
    # Given S1's figures from the cost part, deployed with Profile=cost (what the cost part deploys by default)
    figures = {"ours_per_step": 4e-6, "durable_per_step": 8e-6, "anchor_per_step": 25e-6, "mean_batch": {},
               "actual_requests_per_step": 6.4, "steps_run": 600, "wall_seconds": 12.0}  # fmt: skip
    known = {deployed_parameters({}): figures}
    # When the cost profile's S1 is asked for
    s1 = s1_cost({"Profile": "cost"}, 1.0, known)
    # Then those figures are used
    assert s1["reused"] is True
    assert (s1["vs_durable"], s1["vs_standard"]) == (pytest.approx(0.5), pytest.approx(0.16))


def test_the_local_stack_runs_with_the_profiles_windows_and_the_cost_profile_adds_its_agent_window() -> None:
    # Given the local stack deployed with the template's defaults, then with Profile=cost
    default = measure_chains({}, 2, 3)
    cheap = measure_chains({"Profile": "cost"}, 2, 3, warmup=False)
    # Then the pollers ran with the latency profile's windows (0 s everywhere), then with 2 s on every agent
    assert set(default["poller_windows"]) >= {"SchedulerFunction", "FlightsAgentFunction", "PaymentsAgentFunction"}
    assert all(windows == [0.0] for windows in default["poller_windows"].values())
    assert cheap["poller_windows"]["SchedulerFunction"] == [0.0]
    assert all(w == [2.0] for fn, w in cheap["poller_windows"].items() if fn != "SchedulerFunction")
    # and each of the 2 chains of 3 steps gave 2 samples; with a 2 s agent window every step waits at least 2 s
    # (fewer than 10 requests arrive, so the mapping gathers for its whole window), and the overheads at 0 s are
    # all shorter than that
    assert default["samples"] == cheap["samples"] == 4
    assert default["extra_calls"] == cheap["extra_calls"] == 0
    assert cheap["p50"] >= 2.0
    assert 0 < default["p50"] <= default["p95"] < 2.0


def test_windows_aws_cannot_deploy_get_an_overhead_row_and_a_cost_row_that_says_why() -> None:
    half = Configuration("0.5 s / 0.5 s", {}, 0.5, 0.5)
    table = rows([Measured(half, _measured(half, 1.09, 0.0).latency, {})])
    assert [row.metric.split(":")[0] for row in table] == ["windows 0.5 s / 0.5 s"] * 2
    assert table[0].ours == "1.090 / 1.190"
    assert (table[1].ours, table[1].met) == (NOT_DEPLOYABLE, None)
    assert "whole seconds" in NOT_DEPLOYABLE

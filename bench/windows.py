"""Batching windows (issues 20 and 43): per-step overhead on the local stack and S1's cost per step, pair by pair.

A step waits in two queues, its request in the agent's and its reply in the scheduler's, and each event source
mapping gathers messages for up to its window (``MaximumBatchingWindowInSeconds``) before it invokes. Longer windows
mean fuller batches (fewer SQS requests and invocations per step) and, at low load, up to the two windows more per
step. The template's ``Profile`` parameter picks the windows of every mapping (``latency`` or ``cost``); this module
measures both profiles and a few other window pairs, on the two sides of that trade-off:

**Per-step overhead** (local stack, zero-latency services). The local stack from template.yaml deployed with the
configuration's parameters, every execution environment started, the sample services on loopback without faults or
latency; ``chains`` workflows of ``steps`` steps each (`bench.scenarios.chain_definition`: each step needs the
previous one's output), started together over HTTP. Each sample service records when it began and finished serving
each step's call (`timed_services`, in the services' own process and clock). A step's overhead is the time from the
end of the previous step's call to the start of its own: *time per step minus the service's time*
(`step_overheads`), which covers the agent's reply, the reply queue and the scheduler's window, the scheduler's
transition, the request queue and the agent's window, and the agent's own work before it calls out. The first step
of each chain has no previous call and is not a sample. p50 and p95 are nearest-rank (`bench.throughput.percentile`).
The windows in force are read from the local stack's own pollers (the ``SqsEventSpec`` each was given).

**Cost** (S1 of `bench.scenarios`: 3-step workflows, happy path, 2 starts per simulated second) run with the same
parameters: our orchestration $ per step over Lambda durable functions' and over Step Functions Standard's
(`bench.cost.figures`).

**Targets** (issue 43): with ``Profile=latency`` (the default) the p50 per-step overhead is at most
`LATENCY_TARGET_SECONDS`; with ``Profile=cost`` S1 costs at most `COST_TARGET` of Lambda durable functions per step.
No one pair of windows meets both (0 s / 0 s is fast and costs more than `COST_TARGET`; any agent window of 1 s or
more adds about that window to every step), hence the two profiles.

AWS takes whole seconds only (``MaximumBatchingWindowInSeconds`` is an integer, 0 to 300: AWS Lambda API Reference,
``CreateEventSourceMapping``), so a pair with a fraction of a second (the issue's 0.5 s) cannot be deployed: the
local stack, which emulates any window, measures its per-step overhead, and its cost row says why it has no figure
(the cost scenarios refuse what AWS would not deploy, `bench.scenarios.check_mappings`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench import cost
from bench.report import Row
from bench.throughput import percentile

__all__ = [
    "CHAINS",
    "CHAIN_STEPS",
    "COST_TARGET",
    "LATENCY_TARGET_SECONDS",
    "WINDOW_CHOICES",
    "Configuration",
    "ServiceCall",
    "configurations",
    "deployed_parameters",
    "latency_summary",
    "measure_windows",
    "parse_pairs",
    "profile_windows",
    "rows",
    "step_overheads",
    "timed_services",
]

LATENCY_TARGET_SECONDS: Final = 0.5
"""Issue 20: p50 per-step overhead on the local stack with zero-latency services, at most (seconds), Profile=latency."""
COST_TARGET: Final = cost.DURABLE_TARGETS["S1"]
"""Issue 20: S1's cost per step over Lambda durable functions', at most, Profile=cost."""
WINDOW_CHOICES: Final = (0.0, 0.5, 1.0, 2.0)
"""The windows measured (seconds): the issue's 0, 0.5, 1 and 2 s (0.5 s on the local stack only, see the module)."""
DIAGONAL: Final = tuple((window, window) for window in WINDOW_CHOICES)
"""The pairs measured besides the profiles: both windows alike."""
DEFAULT_PAIRS: Final = ",".join(f"{s:g}/{a:g}" for s, a in DIAGONAL)
"""``0/0,0.5/0.5,1/1,2/2``: what ``--windows`` measures besides the profiles by default."""
CHAINS: Final = 4
"""Workflows run at once for the per-step overhead, at ``--scale 1``."""
CHAIN_STEPS: Final = 10
"""Steps of each of those workflows, at ``--scale 1``."""
PROFILES_PARAMETER: Final = "Profile"
NOT_DEPLOYABLE: Final = (
    "no figure: AWS cannot deploy it (MaximumBatchingWindowInSeconds takes whole seconds, 0 to 300: AWS Lambda API "
    "Reference, CreateEventSourceMapping)"
)
"""The cost row of windows with a fraction of a second."""
SCHEDULER: Final = "SchedulerFunction"
TIME_LIMIT_SECONDS: Final = 300.0


# ------------------------------------------------------------------------------------------------ configurations


@dataclass(frozen=True)
class Configuration:
    """One deployment measured: template parameters and the windows they give.

    Attributes
    ----------
    name:
        ``Profile=latency`` or ``0 s / 1 s`` (scheduler / agents).
    parameters:
        Template parameter overrides (``Profile=...``, or both window parameters).
    scheduler_window, agent_window:
        The windows the template resolves them to (seconds): the scheduler's mapping, every agent's mapping.
    profile:
        The profile it deploys, or None for an explicit pair.
    """

    name: str
    parameters: Mapping[str, str]
    scheduler_window: float
    agent_window: float
    profile: str | None = None

    @property
    def pair(self) -> tuple[float, float]:
        """``(scheduler window, agent window)`` in seconds."""
        return (self.scheduler_window, self.agent_window)

    @property
    def deployable(self) -> bool:
        """Whether AWS deploys these windows (whole seconds): otherwise only the local stack runs them."""
        return all(window == int(window) for window in self.pair)

    @property
    def label(self) -> str:
        """``windows 0 s / 2 s (Profile=cost)`` or ``windows 1 s / 1 s``."""
        windows = f"windows {self.scheduler_window:g} s / {self.agent_window:g} s"
        return f"{windows} (Profile={self.profile})" if self.profile else windows


def _template_windows(parameters: Mapping[str, str]) -> tuple[float, float]:
    """The scheduler's window and the agents' (one value for every agent) under ``parameters`` (seconds).

    Raises
    ------
    ValueError
        When the agents' mappings do not all have the same window.
    """
    from bench.throughput import batching_windows

    windows = batching_windows(dict(parameters))
    agents = {window for function, window in windows.items() if function != SCHEDULER}
    if len(agents) != 1:
        raise ValueError(f"the agents' mappings have different windows under {dict(parameters)}: {windows}")
    return windows[SCHEDULER], agents.pop()


def profiles() -> list[str]:
    """The values of the template's ``Profile`` parameter (its ``AllowedValues``, in their order)."""
    from devstack.demo import ROOT
    from devstack.template import load_template

    declared = (load_template(ROOT / "template.yaml").get("Parameters") or {}).get(PROFILES_PARAMETER) or {}
    return [str(value) for value in declared.get("AllowedValues") or []]


def profile_windows(profile: str) -> tuple[float, float]:
    """``(scheduler window, agent window)`` that template.yaml deploys with ``Profile=profile`` (seconds)."""
    return _template_windows({PROFILES_PARAMETER: profile})


def parse_pairs(text: str) -> list[tuple[float, float]]:
    """``"0/0,0.5/0.5"`` as ``[(0.0, 0.0), (0.5, 0.5)]``: scheduler / agent windows in seconds (a fraction is
    measured on the local stack only: `Configuration.deployable`).

    Raises
    ------
    ValueError
        When an item is not ``S/A`` with two numbers of seconds in 0..300.
    """
    from bench.scenarios import MAX_BATCHING_WINDOW

    pairs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        scheduler, sep, agent = item.partition("/")
        try:
            pair = (float(scheduler), float(agent))
        except ValueError:
            raise ValueError(f"{item!r}: expected scheduler/agent windows in seconds, e.g. 0/2") from None
        if not sep:
            raise ValueError(f"{item!r}: expected scheduler/agent windows in seconds, e.g. 0/2")
        if not all(0 <= w <= MAX_BATCHING_WINDOW for w in pair):
            raise ValueError(f"{item!r}: windows are seconds in 0..{MAX_BATCHING_WINDOW}")
        pairs.append(pair)
    return pairs


def configurations(pairs: Sequence[tuple[float, float]]) -> list[Configuration]:
    """Every profile of the template, then each of ``pairs`` that no profile already deploys."""
    found = [
        Configuration(
            f"{PROFILES_PARAMETER}={profile}", {PROFILES_PARAMETER: profile}, *profile_windows(profile), profile=profile
        )
        for profile in profiles()
    ]
    for scheduler, agent in pairs:
        if any(c.pair == (scheduler, agent) for c in found):
            continue
        parameters = {"SchedulerBatchingWindowSeconds": f"{scheduler:g}", "AgentBatchingWindowSeconds": f"{agent:g}"}
        resolved = _template_windows(parameters)
        found.append(Configuration(f"{scheduler:g} s / {agent:g} s", parameters, *resolved))
    return found


# ------------------------------------------------------------------------------------------------ per-step overhead


@dataclass(frozen=True)
class ServiceCall:
    """One call a sample service served: which step, and when it began and finished (epoch seconds)."""

    workflow_id: str
    step: str
    action: str
    started: float
    ended: float


@contextlib.contextmanager
def timed_services(servers: Mapping[str, Any]) -> Iterator[list[ServiceCall]]:
    """Record every action call of the sample servers (``http_server.RunningServer``) in the block.

    Wraps each server's ``TravelService.handle`` (the call's whole service time, from the parsed request to the
    answer), so the times are the services' own. The list is filled as calls finish; the wrappers go on leaving.
    """
    calls: list[ServiceCall] = []
    own: dict[str, Any] = {}  # a handle already set on the instance, put back as it was
    for name, server in servers.items():
        service = server.service
        if "handle" in vars(service):
            own[name] = service.handle

        def timed(action: str, headers: Any, body: bytes, *, _handle: Any = service.handle) -> Any:
            started = time.time()
            answer = _handle(action, headers, body)
            ended = time.time()
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                request = json.loads(body)
                calls.append(ServiceCall(str(request["workflow_id"]), str(request["step"]), action, started, ended))
            return answer

        service.handle = timed
    try:
        yield calls
    finally:
        for name, server in servers.items():
            if name in own:
                server.service.handle = own[name]
            else:
                del server.service.handle


def step_overheads(calls: Sequence[ServiceCall], order: Sequence[str]) -> dict[str, Any]:
    """Per-step overhead of chains of steps, from the calls their services served (seconds).

    For each workflow, step ``order[k]`` (k >= 1) gives one sample: the start of its first call minus the end of
    the first call of ``order[k - 1]`` (time per step minus the service's time). A step without a call (the chain did
    not get there) ends its workflow's samples.

    Returns
    -------
    dict
        ``overhead`` (the samples), ``step_seconds`` (start to start of the same calls) and ``service_seconds``
        (each first call's duration), and ``extra_calls`` (calls beyond the first of a step: retries, resends).
    """
    first: dict[tuple[str, str], ServiceCall] = {}
    extra = 0
    for call in sorted(calls, key=lambda c: c.started):
        key = (call.workflow_id, call.step)
        if key in first:
            extra += 1
        else:
            first[key] = call
    workflows = sorted({workflow_id for workflow_id, _ in first})
    overhead: list[float] = []
    step_seconds: list[float] = []
    service_seconds = [call.ended - call.started for call in first.values()]
    for workflow_id in workflows:
        for before, after in itertools.pairwise(order):
            previous, current = first.get((workflow_id, before)), first.get((workflow_id, after))
            if previous is None or current is None:
                break
            overhead.append(current.started - previous.ended)
            step_seconds.append(current.started - previous.started)
    return {
        "overhead": overhead,
        "step_seconds": step_seconds,
        "service_seconds": service_seconds,
        "extra_calls": extra,
    }


def latency_summary(measured: Mapping[str, Any]) -> dict[str, Any]:
    """`step_overheads`' samples as figures: ``samples``, ``p50``, ``p95``, ``mean``, ``max`` of the overhead, and
    ``step_p50`` and ``service_p50`` (seconds), ``extra_calls``."""
    overhead = measured["overhead"]
    return {
        "samples": len(overhead),
        "p50": percentile(overhead, 0.50),
        "p95": percentile(overhead, 0.95),
        "mean": statistics.fmean(overhead) if overhead else float("nan"),
        "max": max(overhead, default=float("nan")),
        "step_p50": percentile(measured["step_seconds"], 0.50),
        "service_p50": percentile(measured["service_seconds"], 0.50),
        "extra_calls": measured["extra_calls"],
    }


def measure_chains(
    parameters: Mapping[str, str],
    chains: int,
    steps: int,
    *,
    warmup: bool = True,
    log_dir: Path | None = None,
    time_limit_seconds: float = TIME_LIMIT_SECONDS,
) -> dict[str, Any]:
    """Run ``chains`` workflows of ``steps`` steps on the local stack deployed with ``parameters``; time each step.

    With ``warmup``, ``chains`` workflows of 3 steps run first and are not measured.

    Returns
    -------
    dict
        `latency_summary`'s figures plus ``chains``, ``steps``, ``poller_windows`` (each SQS poller's window, by
        function: what the local stack really uses), ``wall_seconds`` (first start to last seen terminal) and
        ``phase_seconds``.

    Raises
    ------
    RuntimeError
        A workflow did not complete, or not within ``time_limit_seconds``.
    """
    from bench.scenarios import chain_definition, workflow_consumers
    from bench.throughput import WorkflowDriver
    from devstack.demo import ROOT, sample_services_importable
    from devstack.load import read_final_state
    from devstack.stack import LocalStack
    from devstack.template import remote_service_parameters

    sample_services_importable()
    from http_server import serve_all

    log_dir = log_dir or ROOT / ".devstack" / "bench" / "windows-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    definition = chain_definition(steps)
    order = [step["name"] for step in definition["steps"]]
    phases: dict[str, float] = {}
    clock = time.monotonic()
    servers = serve_all()  # no faults, no latency
    try:
        deployed = {
            **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
            "LogLevel": "WARN",
            **parameters,
        }
        with timed_services(servers) as calls, LocalStack(parameters=deployed, log_dir=log_dir) as stack:
            for pool in stack.pools.values():  # every execution environment imports its handler first
                pool.start(prewarm=pool.max_workers)
            windows: dict[str, set[float]] = defaultdict(set)
            stepping = {logical_id for logical_id, _ in workflow_consumers(stack.stack.functions())}
            for poller in stack.pollers:
                function = poller.name.split(".", 1)[0]
                if function in stepping:  # a trigger's queue carries no step (bench.scenarios.workflow_consumers)
                    windows[function].add(poller.spec.batching_window_seconds)
            phases["start the local stack"] = time.monotonic() - clock
            clock = time.monotonic()
            label = f"windows-{uuid.uuid4().hex[:8]}"
            if warmup:
                # Each execution environment's first invocations build its clients and open its connections (the
                # cold-start rows measure that): 3-step chains, one per agent's step, warm them and are not samples.
                WorkflowDriver(stack, chain_definition(3)).run(chains, f"{label}-warmup", time_limit_seconds)
                phases["warm-up"] = time.monotonic() - clock
                clock = time.monotonic()
            driver = WorkflowDriver(stack, definition)
            workflow_ids, first_start, last_terminal = driver.run(chains, label, time_limit_seconds)
            final = read_final_state(driver.dynamodb, driver.table)
            phases["chains"] = time.monotonic() - clock
            clock = time.monotonic()
        phases["stop"] = time.monotonic() - clock
    finally:
        for server in servers.values():
            server.stop()
    not_completed = [wid for wid in workflow_ids if wid not in final or final[wid].status != "COMPLETED"]
    if not_completed:
        raise RuntimeError(f"{len(not_completed)} chain(s) did not complete: {not_completed[:5]}")
    mine = [call for call in calls if call.workflow_id in set(workflow_ids)]
    return {
        **latency_summary(step_overheads(mine, order)),
        "chains": chains,
        "steps": steps,
        "poller_windows": {function: sorted(values) for function, values in sorted(windows.items())},
        "wall_seconds": last_terminal - first_start,
        "phase_seconds": phases,
    }


# ------------------------------------------------------------------------------------------------ cost


def deployed_parameters(parameters: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """The parameters a cost scenario deploys with ``parameters`` (`bench.scenarios.COST_PARAMETERS` updated)."""
    from bench.scenarios import COST_PARAMETERS

    return frozenset({**COST_PARAMETERS, **parameters}.items())


def s1_cost(
    parameters: Mapping[str, str], scale: float, known: Mapping[frozenset[tuple[str, str]], Any] | None = None
) -> dict[str, Any]:
    """S1 (`bench.scenarios`, scaled by ``scale``) deployed with ``parameters``: our $ per step and the anchors'.

    ``known`` holds S1 figures (`bench.cost.figures`) already measured in this run at the same scale, by
    `deployed_parameters`: a configuration deployed the same way is not run again (``reused`` says so).

    Returns ``ours_per_step``, ``durable_per_step``, ``standard_per_step`` (dollars), ``vs_durable`` and
    ``vs_standard`` (ratios), ``mean_batch``, ``requests_per_step``, ``steps``, ``wall_seconds``, ``reused``.
    """
    from bench.scenarios import run_scenario, scenarios

    data = (known or {}).get(deployed_parameters(parameters))
    reused = data is not None
    if data is None:
        scenario = next(s for s in scenarios(scale, dict(parameters)) if s.name == "S1")
        data = cost.figures(run_scenario(scenario))
    return {
        "reused": reused,
        "ours_per_step": data["ours_per_step"],
        "durable_per_step": data["durable_per_step"],
        "standard_per_step": data["anchor_per_step"],
        "vs_durable": data["ours_per_step"] / data["durable_per_step"],
        "vs_standard": data["ours_per_step"] / data["anchor_per_step"],
        "mean_batch": data["mean_batch"],
        "requests_per_step": data["actual_requests_per_step"],
        "steps": data["steps_run"],
        "wall_seconds": data["wall_seconds"],
    }


# ------------------------------------------------------------------------------------------------ the rows


@dataclass
class Measured:
    """One configuration's figures: ``latency`` (`measure_chains`) and ``cost`` (`s1_cost`)."""

    configuration: Configuration
    latency: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)


def rows(measured: Sequence[Measured]) -> list[Row]:
    """Three rows per configuration: per-step overhead, S1 vs Lambda durable functions, S1 vs Step Functions Standard
    (one row instead of the two for windows AWS cannot deploy, saying so).

    The ``latency`` profile's overhead row carries the latency target (p50 at most `LATENCY_TARGET_SECONDS`), the
    ``cost`` profile's durable-functions row the cost target (at most `COST_TARGET`).
    """
    table = []
    per_million = 1_000_000
    for each in measured:
        config, latency, s1 = each.configuration, each.latency, each.cost
        latency_target = config.profile == "latency"
        p50 = latency["p50"]
        table.append(
            Row(
                f"{config.label}: per-step overhead on the local stack, p50 / p95 (s; {latency['samples']} steps of "
                f"{latency['chains']} {latency['steps']}-step chains of zero-latency services: time per step minus "
                "the service's)",
                f"{p50:.3f} / {latency['p95']:.3f}",
                f"p50 step {latency['step_p50']:.3f}, service {latency['service_p50']:.3f}",
                None,
                f"p50 <= {LATENCY_TARGET_SECONDS:g} s" if latency_target else "",
                (p50 <= LATENCY_TARGET_SECONDS) if latency_target else None,
            )
        )
        if not config.deployable:
            table.append(Row(f"{config.label}: S1 orchestration $ per 1M steps", NOT_DEPLOYABLE))
            continue
        table.append(
            Row.with_ratio(
                f"{config.label}: S1 orchestration $ per 1M steps (anchor: Lambda durable functions)",
                s1["ours_per_step"] * per_million,
                s1["durable_per_step"] * per_million,
                s1["vs_durable"],
                at_most=COST_TARGET if config.profile == "cost" else None,
            )
        )
        table.append(
            Row.with_ratio(
                f"{config.label}: S1 orchestration $ per 1M steps (anchor: Step Functions Standard)",
                s1["ours_per_step"] * per_million,
                s1["standard_per_step"] * per_million,
                s1["vs_standard"],
            )
        )
    return table


def measure_windows(
    pairs: Sequence[tuple[float, float]] = DIAGONAL,
    *,
    scale: float = 1.0,
    chains: int = CHAINS,
    steps: int = CHAIN_STEPS,
    log_dir: Path | None = None,
    progress: Any = None,
    known_s1: Mapping[frozenset[tuple[str, str]], Any] | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """Measure every profile and each of ``pairs``: per-step overhead on the local stack and S1's cost per step.

    Parameters
    ----------
    pairs
        ``(scheduler, agent)`` windows in seconds, measured besides the profiles (a pair a profile deploys is
        measured once, as the profile; a fraction of a second on the local stack only).
    scale
        Multiplies ``chains``, ``steps`` (at least 2 chains of 3 steps) and S1's workflows.
    chains, steps
        The chains of the per-step overhead at scale 1.
    log_dir
        The local stack's per-function logs (default ``.devstack/bench/windows-logs``).
    progress
        Called with one line of text as each configuration starts (the CLI prints it).
    known_s1
        S1 figures this run already has (see `s1_cost`).

    Returns
    -------
    tuple
        `rows`, and the raw figures: ``configurations`` (each with ``name``, ``parameters``, ``windows``,
        ``profile``, ``latency``, ``cost``), ``targets``, ``chains``, ``steps``.

    Raises
    ------
    RuntimeError
        A chain did not complete, or the local stack's pollers did not get the windows the template resolves.
    """
    chains = max(2, round(chains * scale))
    steps = max(3, round(steps * scale))
    measured = []
    for config in configurations(pairs):
        if progress is not None:
            then = ", then S1" if config.deployable else " (not deployable on AWS: no S1)"
            progress(f"{config.label}: {chains} chains of {steps} steps on the local stack{then} ...")
        latency = measure_chains(config.parameters, chains, steps, log_dir=log_dir)
        expected = {SCHEDULER: [config.scheduler_window]}
        got = latency["poller_windows"]
        if got.get(SCHEDULER) != expected[SCHEDULER] or any(
            values != [config.agent_window] for function, values in got.items() if function != SCHEDULER
        ):
            raise RuntimeError(f"{config.name}: the local stack's pollers got windows {got}, not {config.pair}")
        s1 = s1_cost(config.parameters, scale, known_s1) if config.deployable else {}
        measured.append(Measured(config, latency, s1))
    raw = {
        "chains": chains,
        "steps": steps,
        "targets": {"latency_p50_seconds": LATENCY_TARGET_SECONDS, "cost_vs_durable": COST_TARGET},
        "configurations": [
            {
                "name": m.configuration.name,
                "parameters": dict(m.configuration.parameters),
                "profile": m.configuration.profile,
                "windows": {"scheduler": m.configuration.scheduler_window, "agents": m.configuration.agent_window},
                "latency": m.latency,
                "cost": m.cost,
            }
            for m in measured
        ],
    }
    return rows(measured), raw


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.windows``: measure and print the rows (the same as ``python -m bench --only windows``)."""
    import argparse

    from bench.report import markdown

    parser = argparse.ArgumentParser(prog="python -m bench.windows", description=main.__doc__)
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help="scheduler/agent windows besides the profiles")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON too")
    args = parser.parse_args(argv)
    table, raw = measure_windows(parse_pairs(args.pairs), scale=args.scale, progress=print)
    print(markdown(table))
    if args.json:
        print(json.dumps(raw, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

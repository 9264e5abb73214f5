"""Cold start: each handler's import time in a fresh interpreter, against a bare ``import boto3, pydantic``.

What Lambda does before the first invocation is start Python and import the handler module (the init phase). This
module repeats that for the API, scheduler, agent and supervisor handlers, each in a new interpreter, the way the
function would see it:

* ``sys.path`` is the function's code dir (``/var/task``), then the layer (``/opt/python``: ``layers/sasflow`` and
  the layer's requirements), then the standard library. The requirements are the running interpreter's installed
  copies of exactly the distributions that ``layers/sasflow/requirements.txt`` pulls in, linked into a temporary
  directory; nothing else from the dev venv is importable. That matters: X-Ray's ``patch_all`` patches every
  library it can import, so a dev venv with ``requests`` or ``httpx`` in it would time imports Lambda never does.
* The environment is the template's (``Globals`` + the function's ``Environment.Variables``, references resolved
  by `devstack.template.Stack`) plus what the Lambda runtime sets itself (``LAMBDA_TASK_ROOT``,
  ``AWS_LAMBDA_FUNCTION_NAME``, the X-Ray daemon address because the template has ``Tracing: Active`` ...), with
  fake credentials and region. Importing a handler sends nothing; no real endpoint is named anywhere.

Each import is timed with ``time.perf_counter`` around ``importlib.import_module`` in the child. The figure is a
median of *pair ratios*: for each handler, ``pairs`` times, the baseline and the handler are imported one right after
the other (which goes first alternates), and the pair's ratio is handler seconds / baseline seconds. Both halves of
a pair see about the same load on the machine, so the ratio keeps little of it, and the median of many pairs keeps
none of a burst. A best-of-N of each side, taken at different moments, read the same build anywhere from 1.08 to
1.51 on a busy machine; the spread of the pair ratios (their interquartile range) is printed with the median so a
reader sees how much a figure is worth.
Both sides import with the bytecode caches that exist on this machine (the installed packages' ``.pyc``, and those
Python writes for ``sasflow`` on the first run). On Lambda neither has any (``sam build`` unpacks wheels without
compiling and ``/opt`` is read-only), so absolute times there are higher; the ratio compares like with like.

The layer's size is that of ``.aws-sam/build/CoreLayer`` when ``make build`` has produced it. Otherwise it is that
of an equivalent assembled from the same installed distributions (the files each one's ``RECORD`` lists, without
bytecode, as ``sam build`` unpacks them) plus the ``sasflow`` sources, zipped with ``ZIP_DEFLATED``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bench.report import Row, markdown
from devstack.template import FunctionSpec, Stack

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "template.yaml"
LAYER_SOURCE = ROOT / "layers" / "sasflow"
LAYER_REQUIREMENTS = LAYER_SOURCE / "requirements.txt"
BUILT_LAYER = ROOT / ".aws-sam" / "build" / "CoreLayer"

#: The handler modules timed, in table order. Each is found in the template by its ``Handler``; the three agent
#: functions share ``agent_handler`` and differ only in variables, so the first of them stands for all.
HANDLER_MODULES: tuple[str, ...] = (
    "api_handler",
    "scheduler_handler",
    "agent_handler",
    "supervisor_handler",
    "ops_handler",
)
BASELINE_MODULES: tuple[str, ...] = ("boto3", "pydantic")
TARGET_RATIO = 1.3
#: Baseline-handler pairs per handler. Measured on the bench's 2-core machine with other jobs on it (three runs
#: each): at 20 pairs a handler's median moved by up to 0.073 between runs, at 40 by up to 0.067 (0.019 to 0.067 by
#: handler; a fourth run read the agent 0.10 lower) in about 140 s for the five. More pairs barely help there: what
#: is left is the machine's load changing between runs, not the sampling (README, Benchmarks).
DEFAULT_PAIRS = 40
MB = 1_000_000

#: What the Lambda runtime sets in every function's environment (the reserved variables of the Lambda developer
#: guide, "Defined runtime environment variables"), with fake credentials and the region of `Stack`.
_RUNTIME_ENVIRONMENT: dict[str, str] = {
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
    "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
    "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
    "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001",
    "LANG": "en_US.UTF-8",
    "TZ": ":UTC",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    # Not set by Lambda; they keep botocore away from ~/.aws and the instance-metadata endpoint all the same.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}

#: Set by Lambda when the function has ``Tracing: Active`` (the X-Ray daemon in the sandbox).
_XRAY_ENVIRONMENT: dict[str, str] = {
    "AWS_XRAY_DAEMON_ADDRESS": "169.254.79.129:2000",
    "_AWS_XRAY_DAEMON_ADDRESS": "169.254.79.129",
    "_AWS_XRAY_DAEMON_PORT": "2000",
    "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
}

# Runs in the fresh interpreter (python -I -S): argv[1] is {"path": [...], "modules": [...]}; prints the wall-clock
# and CPU seconds of the imports.
_CHILD = """\
import importlib, json, sys, time
args = json.loads(sys.argv[1])
sys.path[:0] = args["path"]
wall, cpu = time.perf_counter(), time.process_time()
for name in args["modules"]:
    importlib.import_module(name)
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]))
"""


@dataclass(frozen=True)
class ImportProbe:
    """One import to time: the modules, the directories put first on ``sys.path``, and the environment."""

    label: str
    modules: tuple[str, ...]
    path: tuple[Path, ...]
    environment: dict[str, str]


def lambda_environment(spec: FunctionSpec, *, tracing: bool) -> dict[str, str]:
    """The environment ``spec`` has on Lambda: the runtime's variables, then the template's.

    ``tracing`` is whether the function has ``Tracing: Active`` (then Lambda also names the X-Ray daemon).

    Returns
    -------
    dict
        Variable name to value; credentials and region are fake.
    """
    environment = {
        **_RUNTIME_ENVIRONMENT,
        "AWS_LAMBDA_FUNCTION_NAME": spec.function_name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.function_name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": "2026/01/01/[$LATEST]0123456789abcdef",
        "LAMBDA_TASK_ROOT": str(spec.code_dir),
        "_HANDLER": spec.handler,
        **spec.environment,
    }
    if tracing:
        environment.update(_XRAY_ENVIRONMENT)
    return environment


def handler_function(stack: Stack, module: str) -> FunctionSpec:
    """The first function of ``stack`` whose ``Handler`` lives in ``module``.

    Raises
    ------
    LookupError
        No function of the template uses the module.
    """
    for spec in stack.functions():
        if spec.handler.rsplit(".", 1)[0] == module:
            return spec
    raise LookupError(f"no function in {TEMPLATE.name} has its handler in {module}")


# ------------------------------------------------------------------------------------------- the layer's packages


def layer_distributions(requirements: Path = LAYER_REQUIREMENTS) -> list[importlib.metadata.Distribution]:
    """The installed distributions that ``requirements`` pulls in, transitively, with their extras.

    Markers are evaluated for the running interpreter.

    Raises
    ------
    importlib.metadata.PackageNotFoundError
        A distribution the layer needs is not installed here (``make venv`` installs them all).
    """
    pending = [Requirement(line) for line in _requirement_lines(requirements)]
    seen: set[tuple[str, frozenset[str]]] = set()
    found: dict[str, importlib.metadata.Distribution] = {}
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        distribution = found.get(name) or importlib.metadata.distribution(name)
        found[name] = distribution
        for text in distribution.requires or []:
            dependency = Requirement(text)
            wanted = dependency.marker is None or any(
                dependency.marker.evaluate({"extra": extra}) for extra in (requirement.extras or {""})
            )
            if wanted:
                pending.append(dependency)
    return [found[name] for name in sorted(found)]


def _requirement_lines(requirements: Path) -> Iterator[str]:
    for raw in requirements.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            yield line


def _layer_files(distributions: Sequence[importlib.metadata.Distribution]) -> Iterator[tuple[Path, str]]:
    """``(file, path inside site-packages)`` for what unpacking each wheel gives: no bytecode, no scripts."""
    for distribution in distributions:
        for entry in distribution.files or []:
            parts = Path(entry).parts
            if not parts or parts[0] == ".." or "__pycache__" in parts or entry.suffix == ".pyc":
                continue
            path = Path(str(distribution.locate_file(entry)))
            if path.is_file():
                yield path, Path(entry).as_posix()


def link_layer_packages(distributions: Sequence[importlib.metadata.Distribution], target: Path) -> Path:
    """Make ``target`` a directory that imports exactly ``distributions``, by links to their installed files.

    Top-level packages and modules are linked as they are; top-level ``__pycache__`` entries of single-module
    distributions (``six.py``) are linked one by one, so their bytecode is found as in site-packages.

    Returns
    -------
    Path
        ``target``, to put on ``sys.path``.
    """
    target.mkdir(parents=True, exist_ok=True)
    for distribution in distributions:
        for entry in distribution.files or []:
            parts = Path(entry).parts
            if not parts or parts[0] == "..":
                continue
            if parts[0] == "__pycache__":
                (target / "__pycache__").mkdir(exist_ok=True)
                link, source = target / "__pycache__" / parts[-1], distribution.locate_file(entry)
            else:
                link, source = target / parts[0], distribution.locate_file(parts[0])
            if not link.exists() and not link.is_symlink():
                link.symlink_to(Path(str(source)))
    return target


# ------------------------------------------------------------------------------------------- import timing


def baseline_probe(packages: Path) -> ImportProbe:
    """The anchor: ``import boto3, pydantic`` with only the layer's packages, in the runtime's environment."""
    return ImportProbe("baseline", BASELINE_MODULES, (packages,), dict(_RUNTIME_ENVIRONMENT))


def handler_probe(stack: Stack, spec: FunctionSpec, packages: Path) -> ImportProbe:
    """The import of ``spec``'s handler module as its Lambda init phase does it (``packages``: the layer's)."""
    module = spec.handler.rsplit(".", 1)[0]
    tracing = stack.properties(spec.logical_id).get("Tracing") == "Active"
    return ImportProbe(
        module, (module,), (spec.code_dir, LAYER_SOURCE, packages), lambda_environment(spec, tracing=tracing)
    )


def time_import(probe: ImportProbe) -> tuple[float, float]:
    """Seconds that importing ``probe.modules`` takes in a new interpreter (this one's executable).

    The child runs isolated (``-I -S``): no site-packages, no ``PYTHON*`` variables, only ``probe.path`` before
    the standard library.

    Returns
    -------
    wall, cpu
        Wall-clock seconds (``time.perf_counter``) and the child's CPU seconds (``time.process_time``). Wall-clock
        is the figure; CPU time is kept because it moves less when other processes load the machine.

    Raises
    ------
    RuntimeError
        The import failed in the child (its stderr is in the message).
    """
    wall, cpu = json.loads(_run_child(probe).stdout.strip().splitlines()[-1])
    return float(wall), float(cpu)


def import_profile(probe: ImportProbe) -> list[tuple[int, int, str]]:
    """``python -X importtime`` of ``probe``: ``(self µs, cumulative µs, module)``, largest cumulative first.

    The module names keep their indentation (the depth at which they were first imported).

    Raises
    ------
    RuntimeError
        The import failed in the child.
    """
    lines = _run_child(probe, "-X", "importtime").stderr.splitlines()
    profile = []
    for line in lines:
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[0].strip().isdigit():
            profile.append((int(fields[0]), int(fields[1]), fields[2].rstrip()))
    return sorted(profile, key=lambda entry: -entry[1])


def _run_child(probe: ImportProbe, *options: str) -> subprocess.CompletedProcess[str]:
    argument = json.dumps({"path": [str(path) for path in probe.path], "modules": list(probe.modules)})
    done = subprocess.run(
        [sys.executable, "-I", "-S", *options, "-c", _CHILD, argument],
        env=probe.environment,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"importing {probe.label} failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class PairedTimes:
    """One handler's pairs: ``handler[i]`` and ``baseline[i]`` were timed back to back (seconds, wall or CPU)."""

    handler: tuple[float, ...]
    baseline: tuple[float, ...]
    handler_cpu: tuple[float, ...]
    baseline_cpu: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        """Each pair's handler seconds / baseline seconds (wall-clock), in run order."""
        return [handler / baseline for handler, baseline in zip(self.handler, self.baseline, strict=True)]

    @property
    def cpu_ratios(self) -> list[float]:
        """The same of the children's CPU seconds."""
        return [handler / baseline for handler, baseline in zip(self.handler_cpu, self.baseline_cpu, strict=True)]


def paired_times(baseline: ImportProbe, probes: Sequence[ImportProbe], pairs: int) -> dict[str, PairedTimes]:
    """Time every probe ``pairs`` times, each run right beside a run of ``baseline``.

    Round ``i`` times, for each probe in turn, the baseline then the probe, or the probe then the baseline: the
    order alternates from pair to pair, so neither side is always the one that starts on a machine just freed (or
    just loaded) by the pair before.

    Returns
    -------
    dict
        Probe label to its `PairedTimes`.
    """
    runs: dict[str, list[tuple[float, float, float, float]]] = {probe.label: [] for probe in probes}
    for round_number in range(pairs):
        for index, probe in enumerate(probes):
            if (round_number + index) % 2 == 0:
                base_wall, base_cpu = time_import(baseline)
                wall, cpu = time_import(probe)
            else:
                wall, cpu = time_import(probe)
                base_wall, base_cpu = time_import(baseline)
            runs[probe.label].append((wall, base_wall, cpu, base_cpu))
    return {
        label: PairedTimes(*(tuple(column) for column in zip(*samples, strict=True))) for label, samples in runs.items()
    }


@dataclass(frozen=True)
class Spread:
    """The median of some figures and their interquartile range (``q1``, ``q3``: the 25th and 75th percentiles)."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one); quartiles by ``statistics.quantiles`` (method "inclusive").

        Raises
        ------
        ValueError
            ``values`` is empty.
        """
        if not values:
            raise ValueError("no values")
        if len(values) == 1:
            return cls(values[0], values[0], values[0])
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(statistics.median(values), q1, q3)


# ------------------------------------------------------------------------------------------- layer size


@dataclass(frozen=True)
class LayerSize:
    """The layer's size: ``unzipped`` (sum of file sizes) and ``zipped`` (``ZIP_DEFLATED``), in bytes."""

    source: str
    files: int
    unzipped: int
    zipped: int


def layer_size(distributions: Sequence[importlib.metadata.Distribution]) -> LayerSize:
    """Measure ``.aws-sam/build/CoreLayer`` when it exists, else the equivalent of it built from ``distributions``.

    The equivalent is laid out as ``sam build`` lays out the layer (``python/`` + the ``ContentUri`` folder without
    ``__pycache__`` + the unpacked wheels).
    """
    if BUILT_LAYER.is_dir():
        members = [(path, path.relative_to(BUILT_LAYER).as_posix()) for path in _files_under(BUILT_LAYER)]
        source = ".aws-sam/build (make build)"
    else:
        members = [(path, f"python/{name}") for path, name in _layer_files(distributions)]
        members += [
            (path, f"python/{path.relative_to(LAYER_SOURCE).as_posix()}")
            for path in _files_under(LAYER_SOURCE)
            if "__pycache__" not in path.parts
        ]
        source = "equivalent from installed requirements"
    with tempfile.TemporaryDirectory(prefix="sasflow-layer-") as scratch:
        archive = Path(scratch) / "layer.zip"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for path, name in members:
                zipped.write(path, name)
        zipped_bytes = archive.stat().st_size
    return LayerSize(source, len(members), sum(path.stat().st_size for path, _ in members), zipped_bytes)


def _files_under(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


# ------------------------------------------------------------------------------------------- the bench


def measure_cold_start(
    pairs: int = DEFAULT_PAIRS, handlers: Sequence[str] = HANDLER_MODULES
) -> tuple[list[Row], dict[str, Any]]:
    """Time each handler's import in pairs with ``import boto3, pydantic`` and measure the layer.

    Parameters
    ----------
    pairs:
        Baseline-handler pairs per handler (see `paired_times`); the median of their ratios is the figure.
    handlers:
        Handler modules to time, a subset of `HANDLER_MODULES`.

    Returns
    -------
    rows, raw
        One row per handler (its median seconds, the baseline's median seconds over the same pairs, the median of
        the pair ratios with their interquartile range in the metric, target ``<= 1.3``), then two plain rows for
        the layer (unzipped and zipped). ``raw`` holds the figures for a JSON results file: per handler every
        pair's seconds (wall and CPU) and ratio, the medians and quartiles, and the layer's bytes.

    Raises
    ------
    ValueError
        ``pairs`` is below 1.
    RuntimeError
        An import failed in its child interpreter.
    LookupError
        A handler module is not in the template.
    """
    if pairs < 1:
        raise ValueError("pairs must be >= 1")
    stack = Stack.from_file(TEMPLATE)
    functions = {module: handler_function(stack, module) for module in handlers}
    distributions = layer_distributions()
    with tempfile.TemporaryDirectory(prefix="sasflow-cold-start-") as scratch:
        packages = link_layer_packages(distributions, Path(scratch) / "python")
        probes = [handler_probe(stack, spec, packages) for spec in functions.values()]
        timed = paired_times(baseline_probe(packages), probes, pairs)
    anchor = "import " + ", ".join(BASELINE_MODULES)
    rows: list[Row] = []
    raw_handlers: dict[str, Any] = {}
    for module in handlers:
        times = timed[module]
        ratio, cpu_ratio = Spread.of(times.ratios), Spread.of(times.cpu_ratios)
        handler_seconds, baseline_seconds = statistics.median(times.handler), statistics.median(times.baseline)
        rows.append(
            Row.with_ratio(
                f"cold start: import {module} (s, vs {anchor}; median of {pairs} pair ratios, "
                f"IQR {ratio.q1:.3f}-{ratio.q3:.3f})",
                handler_seconds,
                baseline_seconds,
                ratio.median,
                at_most=TARGET_RATIO,
            )
        )
        raw_handlers[module] = {
            "function": functions[module].logical_id,
            "seconds": handler_seconds,
            "baseline_seconds": baseline_seconds,
            "ratio": ratio.median,
            "ratio_q1": ratio.q1,
            "ratio_q3": ratio.q3,
            "cpu_ratio": cpu_ratio.median,
            "samples": list(times.handler),
            "baseline_samples": list(times.baseline),
            "cpu_samples": list(times.handler_cpu),
            "baseline_cpu_samples": list(times.baseline_cpu),
            "ratios": times.ratios,
        }
    size = layer_size(distributions)
    rows += [
        Row(f"CoreLayer size, unzipped ({size.source})", _bytes_text(size.unzipped)),
        Row(f"CoreLayer size, zipped ({size.source})", _bytes_text(size.zipped)),
    ]
    raw: dict[str, Any] = {
        "python": sys.version.split()[0],
        "pairs": pairs,
        "baseline": {"modules": list(BASELINE_MODULES)},
        "handlers": raw_handlers,
        "target_ratio": TARGET_RATIO,
        "layer": {
            "source": size.source,
            "files": size.files,
            "bytes_unzipped": size.unzipped,
            "bytes_zipped": size.zipped,
            "distributions": [f"{dist.metadata['Name']}=={dist.version}" for dist in distributions],
        },
    }
    return rows, raw


def _bytes_text(size: int) -> str:
    return f"{size / MB:.1f} MB ({size:,} bytes)"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.cold_start [--pairs N] [--handler MODULE ...] [--json PATH]``: print the rows.

    Returns 1 when a handler misses the target ratio, else 0.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description="Cold start of the handlers.")
    parser.add_argument(
        "--pairs", type=int, default=DEFAULT_PAIRS, help=f"baseline-handler pairs per handler (default {DEFAULT_PAIRS})"
    )
    parser.add_argument("--handler", action="append", choices=HANDLER_MODULES, help="time only this handler")
    parser.add_argument("--json", type=Path, help="also write the raw figures to this file")
    parser.add_argument(
        "--importtime", metavar="MODULE", choices=HANDLER_MODULES, help="print what importing MODULE imports, instead"
    )
    parser.add_argument("--top", type=int, default=40, help="lines of --importtime to print (default 40)")
    args = parser.parse_args(argv)
    if args.importtime:
        stack = Stack.from_file(TEMPLATE)
        with tempfile.TemporaryDirectory(prefix="sasflow-cold-start-") as scratch:
            packages = link_layer_packages(layer_distributions(), Path(scratch) / "python")
            profile = import_profile(handler_probe(stack, handler_function(stack, args.importtime), packages))
        print(f"{'self us':>9} {'cumul. us':>10}  module")
        for own, cumulative, name in profile[: args.top]:
            print(f"{own:>9} {cumulative:>10}  {name}")
        return 0
    rows, raw = measure_cold_start(args.pairs, tuple(args.handler or HANDLER_MODULES))
    print(markdown(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(raw, indent=2) + "\n")
    return 1 if any(row.met is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

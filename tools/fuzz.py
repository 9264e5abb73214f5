"""API fuzzing: schemathesis against the OpenAPI document the API serves, through the local stack.

    python tools/fuzz.py [--max-examples N] [--max-time SECONDS] [--min-cases N] [--seed N]

Starts the sample services and `devstack.stack.LocalStack` (the template on loopback), then runs
``schemathesis run <api_url>/openapi.json`` in a child process with the checks in `CHECKS` and the settings in
tests/fuzz/schemathesis.toml. The run is bounded three ways: examples per operation and phase (``--max-examples``),
schemathesis' own time budget (``--max-time``, within which fuzzing and stateful testing repeat), and a hard
timeout of the child process. The summary comes from schemathesis' JSON report: test cases, then failures by
check. Exit status 1 when any check failed, a test errored, schemathesis itself failed, or fewer than
``--min-cases`` test cases ran; 0 otherwise. Everything listens on and talks to 127.0.0.1 only; every process
started here is stopped before the command returns.

`make fuzz` runs it with at least 2,000 test cases; tests/fuzz/test_api_fuzz.py runs a small bounded round of the
same thing in `make test`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "fuzz" / "schemathesis.toml"

#: What every response must satisfy. ``negative_data_rejection``: a request that breaks the schema gets a 4xx
#: (statuses in CONFIG). Not run: ``positive_data_acceptance`` (JSON Schema cannot say what the definition
#: validators refuse with a documented 422: unknown or cyclic depends_on, a reference to a step that is not an
#: earlier dependency, a backoff cap below its base), ``unsupported_method`` (API Gateway answers an undeclared
#: method with 404, not 405), ``use_after_free`` (no DELETE) and the auth checks (the API has no auth).
CHECKS: tuple[str, ...] = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
)
PHASES: tuple[str, ...] = ("examples", "coverage", "fuzzing", "stateful")
#: Seconds the child process may run past ``--max-time`` (schema loading, the last requests, the report).
GRACE_SECONDS = 120.0


@dataclass(frozen=True)
class Failure:
    """One kind of failure in a run: schemathesis' code and title, how many unique failures, where."""

    code: str
    title: str
    count: int
    operations: tuple[str, ...]


@dataclass
class FuzzResult:
    """What one schemathesis run found, read from its JSON report."""

    cases: int
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    exit_code: int = 0
    seconds: float = 0.0
    stop_reason: str = ""
    output: str = ""

    @property
    def ok(self) -> bool:
        """No failure, no error, and schemathesis exited 0."""
        return not self.failures and not self.errors and self.exit_code == 0


def run_schemathesis(
    api_url: str,
    *,
    max_examples: int,
    max_time: float,
    seed: int,
    phases: Sequence[str] = PHASES,
    workers: int = 1,
    request_timeout: float = 30.0,
) -> FuzzResult:
    """Fuzz the API at ``api_url`` with schemathesis in a child process and read its JSON report.

    Parameters
    ----------
    api_url
        Base URL of the API on loopback (``/openapi.json`` is loaded from it).
    max_examples
        Test cases per operation and phase (schemathesis ``--max-examples``).
    max_time
        Time budget of the run (seconds); the child is killed ``GRACE_SECONDS`` after it.
    seed
        Hypothesis seed: the same seed against the same API generates the same cases.
    phases
        Schemathesis phases to run.
    workers
        Concurrent schemathesis workers.
    request_timeout
        Timeout of one request (seconds): 30, the longest API Gateway HTTP API waits for its integration. A slower
        answer is a network error in the report.

    Returns
    -------
    FuzzResult
        Test cases, failures by kind, errors, exit code and the console output.

    Raises
    ------
    ValueError
        ``api_url`` is not on loopback.
    """
    if not api_url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        raise ValueError(f"fuzzing is for the local API on loopback only, not {api_url}")
    with tempfile.TemporaryDirectory(prefix="sasflow-fuzz-") as tmp:
        report = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(CONFIG),
            "--no-color",
            "run",
            f"{api_url}/openapi.json",
            "--checks",
            ",".join(CHECKS),
            "--phases",
            ",".join(phases),
            "--max-examples",
            str(max_examples),
            "--max-time",
            str(max(1, int(max_time))),
            "--seed",
            str(seed),
            "--workers",
            str(workers),
            "--request-timeout",
            str(request_timeout),
            "--report",
            "json",
            "--report-json-path",
            str(report),
        ]
        started = time.monotonic()
        try:
            completed = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=max_time + GRACE_SECONDS,
                cwd=tmp,  # anything schemathesis writes lands in the temporary folder
                check=False,
            )
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
            output = exc.stdout if isinstance(exc.stdout, str) else ""
            return FuzzResult(
                cases=0,
                errors=[f"schemathesis did not finish within {max_time + GRACE_SECONDS:.0f} s"],
                exit_code=-1,
                seconds=time.monotonic() - started,
                output=output,
            )
        seconds = time.monotonic() - started
        output = completed.stdout + completed.stderr
        if not report.exists():
            return FuzzResult(
                cases=0,
                errors=["schemathesis wrote no report (see its output)"],
                exit_code=completed.returncode,
                seconds=seconds,
                output=output,
            )
        data = json.loads(report.read_text())
    return _result(data, completed.returncode, seconds, output)


def _result(data: dict[str, Any], exit_code: int, seconds: float, output: str) -> FuzzResult:
    failures = [
        Failure(str(f["code"]), str(f["title"]), int(f["count"]), tuple(str(o) for o in f.get("operations", ())))
        for f in data.get("failures", [])
    ]
    errors = [json.dumps(error, sort_keys=True)[:500] for error in data.get("errors", [])]
    return FuzzResult(
        cases=int(data["test_cases"]["generated"]),
        failures=failures,
        errors=errors,
        exit_code=exit_code,
        seconds=seconds,
        stop_reason=str(data.get("stop_reason") or ""),
        output=output,
    )


def summary(result: FuzzResult, *, min_cases: int = 0) -> str:
    """A plain-text summary: test cases, the checks, failures by check, errors, and the verdict."""
    lines = [
        f"test cases: {result.cases} in {result.seconds:.0f} s (stop: {result.stop_reason or 'n/a'})",
        f"checks: {', '.join(CHECKS)}",
        f"failures: {sum(f.count for f in result.failures)}",
    ]
    lines += [f"  {f.code} {f.title}: {f.count} ({'; '.join(f.operations)})" for f in result.failures]
    lines.append(f"errors: {len(result.errors)}")
    lines += [f"  {error}" for error in result.errors]
    verdict = "OK" if result.ok and result.cases >= min_cases else "FAILED"
    if result.cases < min_cases:
        verdict += f" (fewer than {min_cases} test cases)"
    lines.append(f"{result.cases} cases, {sum(f.count for f in result.failures)} failures: {verdict}")
    return "\n".join(lines)


@contextlib.contextmanager
def local_api(log_dir: Path | None = None) -> Iterator[str]:
    """Run the sample services and the local stack on loopback; yield a base URL of the API; stop them all.

    The URL is a signing proxy's (`devstack.signing_proxy`): the API is IAM-authorized, and schemathesis sends its
    requests unsigned. Must be used under ``if __name__ == "__main__":`` in a script (the stack spawns its Lambda
    workers).
    """
    from devstack.signing_proxy import SigningProxy
    from devstack.stack import LocalStack
    from devstack.template import remote_service_parameters
    from http_server import serve_all

    servers = serve_all(rng_seed=11)
    try:
        parameters = {
            **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
            "LogLevel": "WARN",
        }
        logs = log_dir or ROOT / ".devstack" / "logs" / "fuzz"
        with (
            LocalStack(parameters=parameters, schedule_interval_seconds=2.0, log_dir=logs) as stack,
            SigningProxy(stack.api_url) as proxy,
        ):
            yield proxy.url
    finally:
        for server in servers.values():
            server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=250, help="test cases per operation and phase")
    parser.add_argument("--max-time", type=float, default=900.0, help="time budget of the run (seconds)")
    parser.add_argument("--min-cases", type=int, default=2000, help="fail when fewer test cases ran")
    parser.add_argument("--seed", type=int, default=1, help="hypothesis seed")
    # One worker: with more, hypothesis' lambda descriptions sometimes hit CPython 3.11's "AST constructor recursion
    # depth mismatch" SystemError in schemathesis' coverage phase (a schemathesis error, not an API failure).
    parser.add_argument("--workers", type=int, default=1, help="concurrent schemathesis workers")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated schemathesis phases")
    parser.add_argument("--verbose", action="store_true", help="print schemathesis' own output too")
    args = parser.parse_args(argv)
    for path in (ROOT, ROOT / "layers" / "sasflow", ROOT / "functions" / "sample_services"):  # as `make fuzz` sets
        if str(path) not in sys.path:
            sys.path.append(str(path))

    print("starting the local stack (moto, Lambda workers, HTTP API) and the sample services on 127.0.0.1", flush=True)
    with local_api() as api_url:
        print(f"fuzzing {api_url}/openapi.json (seed {args.seed}, up to {args.max_time:.0f} s)", flush=True)
        result = run_schemathesis(
            api_url,
            max_examples=args.max_examples,
            max_time=args.max_time,
            seed=args.seed,
            phases=args.phases.split(","),
            workers=args.workers,
        )
    if args.verbose or not result.ok:
        print(result.output)
    print(summary(result, min_cases=args.min_cases))
    return 0 if result.ok and result.cases >= args.min_cases else 1


if __name__ == "__main__":
    sys.exit(main())

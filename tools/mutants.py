"""A standing mutation check (``make mutants``): break one core rule at a time and see the tests catch it.

Each entry of ``tools/mutations.toml`` names a rule, one exact piece of code that keeps it (``find``, which must
occur exactly once in ``file``), the code that breaks it (``replace``), and the tests that must then fail. For
every entry, on a temporary copy of the working tree (the repository itself is never edited), the runner applies
the replacement, runs those tests, and restores the file. A mutation is *killed* when pytest reports failing tests
(exit code 1); it *survives* when they pass; anything else (the code to mutate is gone or ambiguous, a collection
error, a timeout) is an *error*. First it runs every listed test on the unmutated copy: a kill means nothing if the
tests fail anyway.

Why not mutmut: it mutates every operator of a file and needs hours for a suite like this one; the point here is a
short list of named rules, each checked by the tests that claim to guard it, within minutes.

Usage: ``python tools/mutants.py [--fast] [--only NAME]... [--jobs N]``. Exit code 0 when every mutation is killed,
1 when one survives or errs, 2 when the unmutated tests fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MUTATIONS = ROOT / "tools" / "mutations.toml"
#: Seconds one mutation's tests may take before the run counts as an error.
TIMEOUT_SECONDS = 600
#: Never copied into the scratch trees: environments, build output, caches.
_SKIP_DIRS = {".git", ".venv", ".venv-sam", ".aws-sam", ".devstack", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


@dataclass(frozen=True)
class Mutation:
    """One named way to break a rule: replace ``find`` by ``replace`` in ``file``; ``tests`` must then fail."""

    name: str
    rule: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    fast: bool = False


@dataclass
class Outcome:
    """What running one mutation's tests gave: ``killed``, ``survived`` or ``error``, with pytest's summary."""

    mutation: Mutation
    verdict: str
    seconds: float
    summary: str = ""
    failed: list[str] = field(default_factory=list)


def load_mutations(path: Path = MUTATIONS) -> list[Mutation]:
    """Read the mutation list.

    Raises
    ------
    ValueError
        When an entry misses a field, repeats a name, or lists no test.
    """
    data = tomllib.loads(path.read_text())
    mutations: list[Mutation] = []
    for entry in data.get("mutation", []):
        missing = {"name", "rule", "file", "find", "replace", "tests"} - set(entry)
        if missing:
            raise ValueError(f"mutation {entry.get('name', '?')!r} misses {sorted(missing)}")
        if not entry["tests"]:
            raise ValueError(f"mutation {entry['name']!r} lists no test")
        mutations.append(
            Mutation(
                name=entry["name"],
                rule=entry["rule"],
                file=entry["file"],
                find=entry["find"],
                replace=entry["replace"],
                tests=tuple(entry["tests"]),
                fast=bool(entry.get("fast", False)),
            )
        )
    names = [m.name for m in mutations]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"mutation names used twice: {duplicated}")
    return mutations


def copy_tree(destination: Path) -> None:
    """Copy the working tree (tracked and untracked files, as they are now) to ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        if relative.split("/", 1)[0] in _SKIP_DIRS:
            continue
        source = ROOT / relative
        if not source.is_file():
            continue  # deleted in the working tree
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """Run ``tests`` with the repository's interpreter inside ``tree``; return (exit code, summary, failed ids)."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "--no-header",
        "-rf",
        "--durations=0",
        *tests,
    ]
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    # The copy has no environments of its own: the SAM translator (the functions' roles, devstack/sam.py) is ours.
    environment.setdefault("SASFLOW_SAM_PYTHON", str(ROOT / ".venv-sam" / "bin" / "python"))
    try:
        finished = subprocess.run(
            command, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, env=environment
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {TIMEOUT_SECONDS} s", []
    lines = finished.stdout.strip().splitlines()
    failed = [line.split(" ", 2)[1] for line in lines if line.startswith("FAILED ")]
    summary = lines[-1] if lines else finished.stderr.strip()[-200:]
    return finished.returncode, summary.strip("= "), failed


def run_mutation(tree: Path, mutation: Mutation) -> Outcome:
    """Apply ``mutation`` in ``tree``, run its tests, restore the file."""
    started = time.monotonic()
    path = tree / mutation.file
    try:
        original = path.read_text()
    except FileNotFoundError:
        return Outcome(mutation, "error", 0.0, f"{mutation.file} does not exist")
    count = original.count(mutation.find)
    if count != 1:
        return Outcome(mutation, "error", 0.0, f"the code to mutate occurs {count} times in {mutation.file}")
    path.write_text(original.replace(mutation.find, mutation.replace))
    try:
        code, summary, failed = run_tests(tree, mutation.tests)
    finally:
        path.write_text(original)
    verdict = {0: "survived", 1: "killed"}.get(code, "error")
    return Outcome(mutation, verdict, time.monotonic() - started, summary, failed)


def main(argv: list[str] | None = None) -> int:
    """Run the mutation check; see the module docstring for the exit codes."""
    parser = argparse.ArgumentParser(description="Break one core rule at a time; the tests must catch each.")
    parser.add_argument("--fast", action="store_true", help="only the mutations marked fast (make test runs these)")
    parser.add_argument("--only", action="append", default=[], help="run only the mutation of this name")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (each on its own copy)")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=200)
    mutations = load_mutations()
    if args.fast:
        mutations = [m for m in mutations if m.fast]
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutations})
        if unknown:
            console.print(f"unknown mutation(s): {unknown}")
            return 2
        mutations = [m for m in mutations if m.name in args.only]
    jobs = max(1, min(args.jobs, len(mutations)))
    console.print(f"{len(mutations)} mutation(s) of the core rules, {jobs} at a time, on copies of the working tree")
    with tempfile.TemporaryDirectory(prefix="sasflow-mutants-") as scratch:
        trees = [Path(scratch) / f"tree{index}" for index in range(jobs)]
        for tree in trees:
            copy_tree(tree)
        every_test = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
        code, summary, failed = run_tests(trees[0], every_test)
        if code != 0:
            console.print(f"[red]the unmutated tests do not pass[/] ({summary}): {failed}")
            return 2
        console.print(f"unmutated: {summary}")
        outcomes: list[Outcome] = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            free = list(trees)

            def work(mutation: Mutation) -> Outcome:
                tree = free.pop()
                try:
                    outcome = run_mutation(tree, mutation)
                finally:
                    free.append(tree)
                colour = {"killed": "green", "survived": "red", "error": "yellow"}[outcome.verdict]
                console.print(f"[{colour}]{outcome.verdict:8}[/] {mutation.name} ({outcome.seconds:.0f} s)")
                return outcome

            outcomes = list(pool.map(work, mutations))
    table = Table(title="Mutations of the core rules")
    for column in ("mutation", "rule", "verdict", "tests that failed", "seconds"):
        table.add_column(column)
    for outcome in outcomes:
        failed_tests = ", ".join(name.rsplit("::", 1)[-1] for name in outcome.failed) or outcome.summary
        table.add_row(
            outcome.mutation.name,
            outcome.mutation.rule,
            outcome.verdict,
            failed_tests,
            f"{outcome.seconds:.0f}",
        )
    console.print(table)
    survivors = [o for o in outcomes if o.verdict != "killed"]
    console.print(f"{len(outcomes) - len(survivors)} of {len(outcomes)} killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())

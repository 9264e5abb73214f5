"""The mutation list of `make mutants` stays in step with the code it mutates (tools/mutations.toml)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutants_tool"] = module
    spec.loader.exec_module(module)
    return module


def test_every_mutation_finds_its_code_exactly_once_and_names_existing_tests() -> None:
    mutants = _mutants()
    mutations = mutants.load_mutations()
    assert len(mutations) >= 8
    for mutation in mutations:
        source = (ROOT / mutation.file).read_text()
        assert source.count(mutation.find) == 1, mutation.name
        assert mutation.replace != mutation.find, mutation.name
        for test in mutation.tests:
            assert (ROOT / test.split("::", 1)[0]).is_file(), (mutation.name, test)
    names = {m.name for m in mutations}
    # the list the issue starts it with
    for required in (
        "version condition dropped from the workflow write",
        "remote token includes the attempt",
        "stale reply applied",
        "compensation in forward order",
        "register_lambda_context removed from the agent handler",
        "compensation skipped for a step whose outcome is unknown",
        "idempotency key built from the SQS message id",
    ):
        assert required in names
    assert any(m.fast for m in mutations)


def test_an_entry_without_tests_or_a_repeated_name_is_refused(tmp_path: Path) -> None:
    mutants = _mutants()
    entry = 'name = "x"\nrule = "r"\nfile = "f"\nfind = "a"\nreplace = "b"\n'
    empty = tmp_path / "empty.toml"
    empty.write_text(f"[[mutation]]\n{entry}tests = []\n")
    with pytest.raises(ValueError, match="lists no test"):
        mutants.load_mutations(empty)
    twice = tmp_path / "twice.toml"
    twice.write_text(f'[[mutation]]\n{entry}tests = ["t"]\n[[mutation]]\n{entry}tests = ["t"]\n')
    with pytest.raises(ValueError, match="used twice"):
        mutants.load_mutations(twice)
    missing = tmp_path / "missing.toml"
    missing.write_text('[[mutation]]\nname = "y"\n')
    with pytest.raises(ValueError, match="misses"):
        mutants.load_mutations(missing)

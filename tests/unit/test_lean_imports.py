"""sasflow.lean_imports: a package's submodules imported without its __init__'s eager re-exports."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.lean_imports import defer_package_init


def _package(root: Path, init: str) -> str:
    name = f"pkg_{uuid.uuid4().hex[:8]}"
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text(init)
    (folder / "light.py").write_text("IMPORTED.append('light')\nclass Light: ...\n")
    (folder / "heavy.py").write_text("IMPORTED.append('heavy')\nclass Heavy: ...\n")
    return name


@pytest.fixture
def imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    monkeypatch.syspath_prepend(str(tmp_path))
    record: list[str] = []
    monkeypatch.setattr("builtins.IMPORTED", record, raising=False)
    yield record
    for name in [n for n in sys.modules if n.startswith("pkg_")]:
        del sys.modules[name]


def test_a_submodule_is_imported_without_the_packages_other_reexports(tmp_path: Path, imported: list[str]) -> None:
    # Given a package whose __init__ re-exports a light and a heavy submodule
    name = _package(
        tmp_path, '"""doc"""\nfrom .light import Light\nfrom .heavy import Heavy\n__all__ = ["Light", "Heavy"]\n'
    )
    # When it is deferred and its light submodule imported
    defer_package_init(name)
    light = importlib.import_module(f"{name}.light")
    # Then only that submodule ran
    assert imported == ["light"]
    # and a re-exported name still resolves to the same object, importing its submodule then
    package = sys.modules[name]
    assert package.Light is light.Light
    assert imported == ["light"]
    assert package.Heavy is importlib.import_module(f"{name}.heavy").Heavy
    assert imported == ["light", "heavy"]
    assert package.__all__ == ["Light", "Heavy"]
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        _ = package.Nothing


def test_a_package_whose_init_does_more_than_reexport_is_imported_as_usual(tmp_path: Path, imported: list[str]) -> None:
    name = _package(tmp_path, "from .light import Light\nIMPORTED.append('init')\n")
    defer_package_init(name)
    assert imported == ["light", "init"]
    assert sys.modules[name].Light.__name__ == "Light"


def test_an_unknown_package_is_an_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        defer_package_init(f"no_such_package_{uuid.uuid4().hex[:8]}")

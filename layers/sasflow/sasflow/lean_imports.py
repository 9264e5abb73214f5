"""Import a package's submodules without its ``__init__``'s eager re-exports: a shorter cold start.

``aws_lambda_powertools.event_handler``'s ``__init__`` imports every resolver it re-exports (AppSync, AppSync events
and the asyncio they import, Bedrock, VPC Lattice, Lambda function URLs, ...), and Python runs a package's
``__init__`` before any of its submodules, so ``from aws_lambda_powertools.event_handler.api_gateway import ...``
pays for all of them too. An HTTP API handler needs ``api_gateway`` and the OpenAPI modules only (issue 13: about a
fifth of the API's and the operators' import time).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


def defer_package_init(name: str) -> None:
    """Register package ``name`` so that importing its submodules skips its ``__init__`` re-exports.

    The package gets its real spec and search path (so ``import name.sub`` works as usual) and a module
    ``__getattr__`` (PEP 562) that imports a re-exported name from the submodule that defines it the first time it
    is asked for: ``from name import X`` still gives the same object. A package whose ``__init__`` does anything
    but re-export (``from .sub import X``, ``__all__``, a docstring) is imported as usual, as is one imported
    already. Call it before the first import of ``name`` (at the top of a handler module).

    Parameters
    ----------
    name:
        A package's dotted name, e.g. ``"aws_lambda_powertools.event_handler"``.

    Raises
    ------
    ModuleNotFoundError
        When ``name`` cannot be found.
    """
    if name in sys.modules:
        return
    parent, _, leaf = name.rpartition(".")
    if parent:
        importlib.import_module(parent)
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    exports = None
    if spec.origin is not None and spec.submodule_search_locations is not None:
        exports = _reexports(Path(spec.origin).read_text(encoding="utf-8"), name)
    if exports is None:
        importlib.import_module(name)
        return
    module = importlib.util.module_from_spec(spec)

    def reexported(attribute: str) -> Any:
        origin = exports.get(attribute)
        if origin is None:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        value = getattr(importlib.import_module(origin), attribute)
        setattr(module, attribute, value)
        return value

    module.__getattr__ = reexported  # type: ignore[method-assign]
    module.__all__ = list(exports)  # type: ignore[attr-defined]
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], leaf, module)


def _reexports(source: str, package: str) -> dict[str, str] | None:
    """``{name: module}`` of an ``__init__`` that only re-exports, or None when it does anything else."""
    exports: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and all(a.name != "*" for a in node.names):
            origin = node.module if node.level == 0 else f"{package}.{node.module}"
            if node.level > 1 or not origin.startswith(f"{package}."):
                return None
            for alias in node.names:
                exports[alias.asname or alias.name] = origin
            continue
        return None
    return exports

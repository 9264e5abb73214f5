"""Strict JSON (RFC 8259): what the API takes as a request body and a trigger as an occurrence's body.

Python's ``json`` also reads ``NaN`` and ``Infinity``, numbers beyond a double (as ``inf``), duplicate keys (the last
wins) and lone UTF-16 surrogates, and nests until the interpreter's recursion limit; none of them survives the way
back out (JSON responses, UTF-8 in DynamoDB and SQS), so they are refused here rather than stored. A lean module: the
trigger function imports it without the API's web framework.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: Deepest nesting of objects and arrays accepted in a request body (RFC 8259 section 9 lets a parser set it).
#: The body's own envelope takes five levels (body, definition, steps, step, input); deeper documents would reach
#: pydantic's serialisation depth and Python's recursion limit further down the line and fail there as 500s.
MAX_JSON_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # RFC 8259 section 4: names SHOULD be unique, and parsers differ on which duplicate wins; refuse them instead.
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {duplicate[:64]!r}")
    return document


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} does not fit in a double")
    return value


def parse_json_body(text: str) -> Any:
    """Parse a request body as strict JSON (RFC 8259), the ``json_body_deserializer`` of the resolver.

    Python's ``json`` also reads ``NaN`` and ``Infinity``, numbers beyond a double (as ``inf``) and lone UTF-16
    surrogates; none of them survives the way back out (JSON responses, UTF-8 in DynamoDB and SQS), so they are
    refused here rather than stored. Nesting is capped at `MAX_JSON_DEPTH` levels, and an object may not repeat a
    key (which of two duplicates a reader keeps differs between parsers).

    Parameters
    ----------
    text
        The decoded request body.

    Returns
    -------
    Any
        The parsed document.

    Raises
    ------
    json.JSONDecodeError
        When the body is not strict JSON; powertools reports it as a ``json_invalid`` validation error (400).
    """
    try:
        document = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except json.JSONDecodeError:
        raise
    except RecursionError as exc:
        raise json.JSONDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels", text, 0) from exc
    except ValueError as exc:  # NaN / Infinity, a float overflow, an integer over Python's 4,300-digit limit
        raise json.JSONDecodeError(str(exc), text, 0) from exc
    problem = _strict_json_problem(document)
    if problem:
        raise json.JSONDecodeError(problem, text, 0)
    return document


def _strict_json_problem(document: Any) -> str | None:
    # Iterative, so a deep document cannot exhaust the stack here.
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list) and depth > MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(node, dict):
            for key, value in node.items():
                if not _is_unicode(key):
                    return "a key is not valid Unicode (lone surrogate)"
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str) and not _is_unicode(node):
            return "a string is not valid Unicode (lone surrogate)"
    return None


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

"""Bounds on the work one request or one message can cause, and a size measure that respects them.

Every limit is a plain constant here, so the API, the definition validator and the scheduler refuse the same
things, and the "Limits" list of docs/definitions.md has one source. The sizes follow the AWS quotas they protect:
an SQS message holds at most 262,144 bytes (SQS developer guide, "Quotas"), a DynamoDB item 400 KB (DynamoDB
developer guide, "Service quotas").
"""

from __future__ import annotations

from typing import Any

from .errors import PayloadTooLargeError

#: Largest request body the API reads, in bytes (384 KiB); a larger one is refused with 413 before it is parsed. A
#: start's input lives in the workflow's item (400 KB at most), so a larger body could never be stored; what each step
#: sends is bounded apart (`MAX_STEP_INPUT_BYTES`).
MAX_REQUEST_BYTES = 393_216
#: Largest rendered input of a step, in bytes of compact JSON: it must fit in one SQS message with its envelope.
MAX_STEP_INPUT_BYTES = 253_952
#: JMESPath expressions in one definition, and characters in one expression.
MAX_EXPRESSIONS = 256
MAX_EXPRESSION_CHARS = 512
#: Deepest nesting of brackets, parentheses and braces in one expression; the parser recurses once per level.
MAX_EXPRESSION_NESTING = 32
#: Bytes the compiled-expression cache and the parsed-definition caches may hold (per Lambda sandbox).
EXPRESSION_CACHE_BYTES = 1_048_576
DEFINITION_CACHE_BYTES = 8_388_608
#: Workflows a second a batch of operator actions acts on unless it says otherwise, and at most (docs/batches.md).
DEFAULT_BATCH_RATE = 50
MAX_BATCH_RATE = 500


def json_size(value: Any, limit: int, *, what: str = "value") -> int:
    """The size of ``value`` as compact JSON (UTF-8 bytes, approximately), refusing it once it passes ``limit``.

    A JMESPath result may name the same object many times (``[input, input, input]``): it is cheap in memory and
    huge once serialised, so the size is added up without serialising, each container's size is remembered by
    identity, and the walk stops as soon as the total passes ``limit``.

    Parameters
    ----------
    value:
        A JSON-compatible value (dicts, lists, strings, numbers, booleans, None).
    limit:
        Largest size accepted, in bytes.
    what:
        What the value is, for the error message.

    Returns
    -------
    int
        The size in bytes (at most ``limit``).

    Raises
    ------
    PayloadTooLargeError
        When the size passes ``limit`` (``size`` is then the size counted when the walk stopped, at least
        ``limit + 1``), or the value nests too deeply to measure.
    """
    known: dict[int, int] = {}

    def size(item: Any) -> int:
        if isinstance(item, str):
            # Quotes, and one more byte for each character JSON escapes (quote, backslash, control characters).
            escaped = sum(1 for char in item if char in '"\\' or char < " ")
            return len(item.encode("utf-8", "surrogatepass")) + 2 + escaped
        if isinstance(item, bool):
            return 4 if item else 5
        if item is None:
            return 4
        if isinstance(item, int | float):
            return len(repr(item))
        key = id(item)
        if key in known:
            return known[key]
        if isinstance(item, dict):
            measured = 1 + len(item) + sum(size(str(k)) + 1 + size(v) for k, v in item.items()) if item else 2
        elif isinstance(item, list | tuple):
            measured = 1 + len(item) + sum(size(v) for v in item) if item else 2
        else:
            measured = len(str(item)) + 2
        known[key] = measured
        if measured > limit:
            raise PayloadTooLargeError(what, measured, limit)
        return measured

    try:
        total = size(value)
    except RecursionError:
        raise PayloadTooLargeError(f"{what} (nested too deeply to measure)", limit + 1, limit) from None
    if total > limit:
        raise PayloadTooLargeError(what, total, limit)
    return total


def nesting_depth(expression: str) -> int:
    """How deeply a JMESPath expression nests: brackets ``()``, ``[]``, ``{}`` and runs of ``!`` (each a level the
    parser and the interpreter recurse into); quoted text is not counted."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    nots = 0
    for char in expression:
        if not quote:
            nots = nots + 1 if char == "!" else (nots if char.isspace() else 0)
            deepest = max(deepest, depth + nots)
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
            continue
        if char in "'\"`":
            quote = char
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest

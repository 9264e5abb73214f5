"""JMESPath evaluation whose work is bounded: what an expression builds is counted before it is built.

The limits on a definition (`limits.MAX_EXPRESSIONS`, `MAX_EXPRESSION_CHARS`, `MAX_EXPRESSION_NESTING`) bound the
expressions, not what they build while they run. Two JMESPath primitives make values larger than their operands:
``join`` (``join(@, [@, @])`` triples a string, so twelve of them in a row build 531,441 times the input) and
``flatten`` (``[@, @][]`` doubles a list). ``to_string`` serialises a value whose parts may be one object named many
times (``[[@, @], [@, @]]``), so its text can be exponentially larger than its memory. Everything else JMESPath does
selects, reorders or counts what its operands hold.

So this interpreter works out the size of each of those results from its operands **before** building it, and
refuses (`PayloadTooLargeError`) a result, or a running total for one rendering, over its limit:

- one built value: at most `MAX_BUILT_BYTES` (a string's characters, a list's elements counted as 8 bytes each,
  the JSON size of what ``to_string`` serialises): as large as a DynamoDB item, so nothing read from a workflow's
  context is ever refused;
- all the values one rendering builds: at most `MAX_RENDER_BUILT_BYTES`.
"""

from __future__ import annotations

import json
from typing import Any

import jmespath
from jmespath import functions, visitor

from .cache import BoundedCache
from .errors import PayloadTooLargeError
from .limits import EXPRESSION_CACHE_BYTES, json_size

#: Largest value one expression may build (bytes): a DynamoDB item's 400 KB, the largest value a context can hold.
MAX_BUILT_BYTES = 409_600
#: Largest total one rendering (a step's or a compensation's input) may build (bytes).
MAX_RENDER_BUILT_BYTES = 2 * MAX_BUILT_BYTES
#: What a list element costs in memory, as counted here (bytes: one reference).
_ELEMENT_BYTES = 8


class RenderBudget:
    """What the expressions of one rendering have built so far (bytes), refused past `MAX_RENDER_BUILT_BYTES`."""

    def __init__(self, limit: int = MAX_RENDER_BUILT_BYTES) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, size: int, what: str) -> None:
        """Count a value of ``size`` bytes about to be built.

        Raises
        ------
        PayloadTooLargeError
            When the value alone passes `MAX_BUILT_BYTES`, or the rendering's total passes its limit.
        """
        if size > MAX_BUILT_BYTES:
            raise PayloadTooLargeError(f"a value an input expression builds ({what})", size, MAX_BUILT_BYTES)
        self.spent += size
        if self.spent > self.limit:
            raise PayloadTooLargeError("the values one input's expressions build", self.spent, self.limit)


class _BoundedFunctions(functions.Functions):
    """JMESPath's built-in functions; ``join`` and ``to_string`` measure their result before building it."""

    def __init__(self, budget: RenderBudget) -> None:
        super().__init__()
        self.budget = budget

    @functions.signature({"types": ["string"]}, {"types": ["array-string"]})
    def _func_join(self, separator: str, array: list[str]) -> str:
        size = sum(len(part) for part in array) + len(separator) * max(0, len(array) - 1)
        self.budget.spend(size, "join")
        return separator.join(array)

    @functions.signature({"types": []})
    def _func_to_string(self, arg: Any) -> str:
        if isinstance(arg, str):
            return arg
        # Measured without serialising (each container once, by identity), so a value that names one object many
        # times is refused before its text is built.
        try:
            size = json_size(arg, MAX_BUILT_BYTES)
        except PayloadTooLargeError as exc:
            size = exc.size
        self.budget.spend(size, "to_string")
        return json.dumps(arg, separators=(",", ":"), default=str)


class _BoundedInterpreter(visitor.TreeInterpreter):
    """JMESPath's tree interpreter; ``flatten`` counts the list it builds first."""

    def __init__(self, budget: RenderBudget) -> None:
        super().__init__(visitor.Options(custom_functions=_BoundedFunctions(budget)))
        self.budget = budget

    def visit_flatten(self, node: Any, value: Any) -> Any:
        base = self.visit(node["children"][0], value)
        if not isinstance(base, list):
            return None
        count = sum(len(element) if isinstance(element, list) else 1 for element in base)
        self.budget.spend(count * _ELEMENT_BYTES, "flatten")
        merged: list[Any] = []
        for element in base:
            if isinstance(element, list):
                merged.extend(element)
            else:
                merged.append(element)
        return merged


#: Compiled expressions, kept per sandbox; an entry is weighed at 64 bytes per character of its expression (the
#: parsed tree and its nodes), so the cache stays within `EXPRESSION_CACHE_BYTES` whatever the expressions.
_COMPILED: BoundedCache[str, Any] = BoundedCache(EXPRESSION_CACHE_BYTES)


def compiled(expression: str) -> Any:
    """The parsed expression (``jmespath.parser.ParsedResult``), from the sandbox's bounded cache.

    Raises
    ------
    jmespath.exceptions.JMESPathError
        When the expression does not parse.
    """
    return _COMPILED.get_or_build(expression, lambda: jmespath.compile(expression), lambda _: 64 * len(expression))


def evaluate(expression: str, context: Any, budget: RenderBudget) -> Any:
    """Evaluate ``expression`` against ``context``, its built values counted against ``budget``.

    Raises
    ------
    PayloadTooLargeError
        When a value it would build, or the rendering's total, passes its limit (nothing that large is built).
    jmespath.exceptions.JMESPathError
        When it does not parse, or a function is given a wrong type.
    """
    return _BoundedInterpreter(budget).visit(compiled(expression).parsed, context)

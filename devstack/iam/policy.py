"""Identity-policy evaluation as IAM does it, for one request: an explicit Deny wins, then any Allow, else denied.

Source: IAM User Guide, "Policy evaluation logic" (identity-based policies only, same account) and "IAM JSON policy
elements" (``Action`` / ``NotAction``, ``Resource`` / ``NotResource``, ``Condition``). Actions match without regard to
case, resources with it; ``*`` and ``?`` are the only wildcards in both.

Conditions: every operator of the String, Arn, Bool and Null families, with the ``ForAllValues:`` /
``ForAnyValue:`` set prefixes and the ``...IfExists`` suffix ("Condition operators" and "Multivalued context keys").
A key that the request does not carry makes its condition false, except ``ForAllValues:`` (true on an empty set),
``...IfExists`` (true) and ``Null``. An operator outside those families cannot be evaluated here: the policy is refused
with `PolicyError` naming the statement, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

__all__ = ["AuthRequest", "Decision", "PolicyError", "Statement", "evaluate", "statements_of"]


class PolicyError(ValueError):
    """A policy statement this evaluator cannot read (its text says which and why)."""


@dataclass(frozen=True)
class AuthRequest:
    """One authorization IAM makes for an API call: an action on a resource, with its request context.

    Attributes
    ----------
    action
        ``service:Action`` as the Service Authorization Reference names it, e.g. ``dynamodb:BatchGetItem``.
    resource
        The resource ARN (``*`` for actions with no resource type).
    context
        Condition keys and their values (a list: a key may carry several, e.g. ``dynamodb:LeadingKeys``).
    """

    action: str
    resource: str
    context: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Statement:
    """One statement of a policy, with where it came from (for reports)."""

    effect: str
    actions: tuple[str, ...]
    not_actions: tuple[str, ...]
    resources: tuple[str, ...]
    not_resources: tuple[str, ...]
    condition: Mapping[str, Mapping[str, Any]]
    sid: str
    source: str

    @property
    def name(self) -> str:
        """``source#Sid`` (or its position), e.g. ``SchedulerFunctionRole/SchedulerFunctionRolePolicy0#OwnQueue``."""
        return f"{self.source}#{self.sid}"


@dataclass(frozen=True)
class Decision:
    """The outcome: ``allowed``, and the statement that decided it (an Allow, a Deny, or none: implicitly denied)."""

    allowed: bool
    statement: Statement | None

    @property
    def reason(self) -> str:
        """IAM's wording of why, as in an AccessDenied message."""
        if self.allowed:
            return f"allowed by {self.statement.name if self.statement else '?'}"
        if self.statement is not None:
            return f"with an explicit deny in an identity-based policy ({self.statement.name})"
        return "because no identity-based policy allows the action"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in items):
        raise PolicyError(f"{where}: expected a string or a list of strings, got {value!r}")
    return tuple(items)


def statements_of(document: Mapping[str, Any], source: str) -> list[Statement]:
    """The statements of a policy document, checked for the shape IAM accepts.

    Parameters
    ----------
    document
        ``{"Statement": [...]}`` or ``{"Statement": {...}}``, with no intrinsic functions left.
    source
        Where the document comes from (a role and policy name), kept in each statement for reports.

    Raises
    ------
    PolicyError
        A statement without Effect, without one of Action/NotAction or Resource/NotResource, with both of a pair, or
        with a condition operator that `evaluate` cannot evaluate.
    """
    raw = document.get("Statement")
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise PolicyError(f"{source}: statement {position} is not an object: {item!r}")
        sid = str(item.get("Sid") or position)
        where = f"{source}#{sid}"
        effect = item.get("Effect")
        if effect not in ("Allow", "Deny"):
            raise PolicyError(f"{where}: Effect must be Allow or Deny, got {effect!r}")
        if ("Action" in item) == ("NotAction" in item):
            raise PolicyError(f"{where}: exactly one of Action and NotAction is needed")
        if ("Resource" in item) == ("NotResource" in item):
            raise PolicyError(f"{where}: exactly one of Resource and NotResource is needed")
        condition = item.get("Condition") or {}
        if not isinstance(condition, dict):
            raise PolicyError(f"{where}: Condition must be an object")
        for operator in condition:
            _operator(operator, where)
        out.append(
            Statement(
                effect=effect,
                actions=_strings(item.get("Action"), where),
                not_actions=_strings(item.get("NotAction"), where),
                resources=_strings(item.get("Resource"), where),
                not_resources=_strings(item.get("NotResource"), where),
                condition=condition,
                sid=sid,
                source=source,
            )
        )
    return out


@lru_cache(maxsize=4096)
def _pattern(glob: str, ignore_case: bool) -> re.Pattern[str]:
    # IAM wildcards are * and ? only: fnmatch's [...] classes must not apply.
    text = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(text, re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _matches(glob: str, value: str, *, ignore_case: bool = False) -> bool:
    return _pattern(glob, ignore_case).fullmatch(value) is not None


def _any_match(globs: Iterable[str], value: str, *, ignore_case: bool = False) -> bool:
    return any(_matches(glob, value, ignore_case=ignore_case) for glob in globs)


_STRING_TESTS = {
    "StringEquals": lambda policy, value: policy == value,
    "StringNotEquals": lambda policy, value: policy != value,
    "StringEqualsIgnoreCase": lambda policy, value: policy.lower() == value.lower(),
    "StringNotEqualsIgnoreCase": lambda policy, value: policy.lower() != value.lower(),
    "StringLike": lambda policy, value: _matches(policy, value),
    "StringNotLike": lambda policy, value: not _matches(policy, value),
    "ArnEquals": lambda policy, value: policy == value,
    "ArnNotEquals": lambda policy, value: policy != value,
    "ArnLike": lambda policy, value: _matches(policy, value),
    "ArnNotLike": lambda policy, value: not _matches(policy, value),
    "Bool": lambda policy, value: policy.lower() == value.lower(),
}
#: Negated operators: a value passes when it matches none of the policy's values (IAM's "not any" reading).
_NEGATED = {"StringNotEquals", "StringNotEqualsIgnoreCase", "StringNotLike", "ArnNotEquals", "ArnNotLike"}


def _operator(text: str, where: str) -> tuple[str, str, bool]:
    """Split ``ForAllValues:StringLikeIfExists`` into (set prefix, base operator, if-exists)."""
    prefix, _, base = text.rpartition(":")
    if prefix not in ("", "ForAllValues", "ForAnyValue"):
        raise PolicyError(f"{where}: unknown condition set operator {prefix!r} in {text!r}")
    if_exists = base.endswith("IfExists") and base != "IfExists"
    base = base.removesuffix("IfExists") if if_exists else base
    if base not in _STRING_TESTS and base != "Null":
        raise PolicyError(
            f"{where}: condition operator {text!r} cannot be evaluated locally "
            "(String*, Arn*, Bool and Null are; see docs/security.md)"
        )
    return prefix, base, if_exists


def _value_passes(base: str, policy_values: Sequence[str], value: str) -> bool:
    test = _STRING_TESTS[base]
    if base in _NEGATED:
        return all(test(p, value) for p in policy_values)
    return any(test(p, value) for p in policy_values)


def _condition_holds(operator: str, key: str, policy_value: Any, context: Mapping[str, Sequence[str]]) -> bool:
    prefix, base, if_exists = _operator(operator, "condition")
    policy_values = [str(v).lower() if isinstance(v, bool) else str(v) for v in _as_list(policy_value)]
    present = key in context
    values = list(context.get(key, ()))
    if base == "Null":
        # "true": the key must be absent, "false": present (IAM, "Condition operator to check existence").
        wants_absent = policy_values and policy_values[0].lower() == "true"
        return (not present) if wants_absent else present
    if prefix == "ForAllValues":
        return all(_value_passes(base, policy_values, value) for value in values)
    if not present:
        return if_exists
    # ForAnyValue, or a plain operator (on a multivalued key IAM passes it when any value passes).
    return any(_value_passes(base, policy_values, value) for value in values)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _conditions_hold(statement: Statement, context: Mapping[str, Sequence[str]]) -> bool:
    # Every operator block, and every key within a block, must hold (they are ANDed; a key's values are ORed).
    return all(
        _condition_holds(operator, key, value, context)
        for operator, block in statement.condition.items()
        for key, value in block.items()
    )


def _applies(statement: Statement, request: AuthRequest) -> bool:
    if statement.actions:
        if not _any_match(statement.actions, request.action, ignore_case=True):
            return False
    elif _any_match(statement.not_actions, request.action, ignore_case=True):
        return False
    if statement.resources:
        if not _any_match(statement.resources, request.resource):
            return False
    elif _any_match(statement.not_resources, request.resource):
        return False
    return _conditions_hold(statement, request.context)


def evaluate(statements: Iterable[Statement], request: AuthRequest) -> Decision:
    """Decide ``request`` against a principal's identity-policy statements.

    Returns
    -------
    Decision
        Denied by the first explicit Deny that applies; else allowed by the first Allow that applies; else an
        implicit deny (``statement`` None).
    """
    allow: Statement | None = None
    for statement in statements:
        if not _applies(statement, request):
            continue
        if statement.effect == "Deny":
            return Decision(False, statement)
        allow = allow or statement
    return Decision(allow is not None, allow)

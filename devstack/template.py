"""Load a SAM/CloudFormation template and resolve it the way CloudFormation would, for one local stack.

The template is the single list of resources: provisioning, the Lambda workers and the event sources all read
`Stack`, so nothing is kept by hand twice.

What is resolved (the rules come from the CloudFormation intrinsic function reference and the SAM specification):

* short tags (``!Ref``, ``!GetAtt``, ``!Sub``, ``!If`` ...) are turned into their long form while loading;
* parameters fall back to ``Default`` and are validated (``AllowedValues``, ``AllowedPattern``, lengths, numeric
  bounds). Values stay strings, so a ``Number`` parameter reaches an environment variable as ``"30"``;
* ``Conditions`` are evaluated, and a resource or output whose condition is false does not exist;
* ``Globals.Function`` is merged into every ``AWS::Serverless::Function``: maps are merged (the function wins), lists
  are appended after the global items, scalars are replaced;
* physical names are ``f"{stack_name}-{LogicalId}"`` unless the template names the resource itself.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

import yaml

__all__ = [
    "ACCOUNT_ID",
    "EMULATED_EVENT_TYPES",
    "EventSpec",
    "FunctionSpec",
    "HttpApiEventSpec",
    "ScheduleEventSpec",
    "SqsEventSpec",
    "Stack",
    "TemplateError",
    "load_template",
    "remote_service_parameters",
]

logger = logging.getLogger(__name__)

ACCOUNT_ID: Final = "123456789012"
"""The account id of the local stack (moto's default account)."""

EMULATED_EVENT_TYPES: Final = frozenset({"SQS", "Schedule", "ScheduleV2", "HttpApi"})
"""SAM function event types that the local stack can drive."""

IMPLICIT_HTTP_API: Final = "ServerlessHttpApi"
"""Logical id SAM gives the HTTP API it creates for ``HttpApi`` events without an ``ApiId``."""

_QUEUE_NAME_MAX: Final = 80
_TABLE_NAME_MAX: Final = 255
_FUNCTION_NAME_MAX: Final = 64
_STACK_NAME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,127}")
_QUEUE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,80}")
_SUB_VAR_RE: Final = re.compile(r"\$\{([^}]*)\}")


def remote_service_parameters(base_urls: Mapping[str, str]) -> dict[str, str]:
    """Template parameters that point the agents at your own services instead of deploying the sample ones.

    ``base_urls`` maps an agent name (``flights``, ``hotels``, ``payments``) to its service's base URL; the result is
    ``{"DeploySampleServices": "false", "FlightsBaseUrl": ..., ...}``.
    """
    parameters = {"DeploySampleServices": "false"}
    for agent, url in base_urls.items():
        parameters[f"{agent.capitalize()}BaseUrl"] = url
    return parameters


class TemplateError(ValueError):
    """The template (or a parameter override) cannot be resolved, or uses something devstack cannot emulate."""


# --------------------------------------------------------------------------------------------------- YAML loading

_SHORT_TAGS: Final = {
    "Ref": "Ref",
    "Condition": "Condition",
    "GetAtt": "Fn::GetAtt",
    "Sub": "Fn::Sub",
    "If": "Fn::If",
    "Equals": "Fn::Equals",
    "Join": "Fn::Join",
    "Select": "Fn::Select",
    "Split": "Fn::Split",
    "Not": "Fn::Not",
    "And": "Fn::And",
    "Or": "Fn::Or",
    "FindInMap": "Fn::FindInMap",
    "Base64": "Fn::Base64",
    "GetAZs": "Fn::GetAZs",
    "ImportValue": "Fn::ImportValue",
    "Cidr": "Fn::Cidr",
    "Transform": "Fn::Transform",
    "Length": "Fn::Length",
    "ToJsonString": "Fn::ToJsonString",
}


class _CfnLoader(yaml.SafeLoader):
    """A SafeLoader that knows the CloudFormation short tags and keeps timestamps as strings."""


# CloudFormation reads ``2010-09-09`` as a string: drop the timestamp resolver from this loader only.
_CfnLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _make_tag_constructor(long_name: str) -> Any:
    def construct(loader: _CfnLoader, node: yaml.Node) -> dict[str, Any]:
        value: Any
        if isinstance(node, yaml.ScalarNode):
            value = loader.construct_scalar(node)
            if long_name == "Fn::GetAtt":
                # ``!GetAtt Res.Attr`` splits at the first dot; attributes may contain dots themselves.
                logical_id, _, attribute = str(value).partition(".")
                value = [logical_id, attribute]
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        return {long_name: value}

    return construct


for _short, _long in _SHORT_TAGS.items():
    _CfnLoader.add_constructor(f"!{_short}", _make_tag_constructor(_long))


def load_template(path: str | Path) -> dict[str, Any]:
    """Read a CloudFormation/SAM template in YAML or JSON, with short tags turned into their long form.

    Parameters
    ----------
    path
        Path of the template file.

    Returns
    -------
    dict
        The template as plain data, e.g. ``!Ref X`` becomes ``{"Ref": "X"}`` and ``!GetAtt A.B`` becomes
        ``{"Fn::GetAtt": ["A", "B"]}``.

    Raises
    ------
    TemplateError
        The file is not a mapping with a ``Resources`` section.
    """
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_CfnLoader)  # a SafeLoader subclass: no arbitrary objects
    if not isinstance(data, dict) or not isinstance(data.get("Resources"), dict):
        raise TemplateError(f"{path}: not a CloudFormation template (no Resources mapping)")
    return data


# ---------------------------------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class ExistingQueue:
    """A queue outside the stack that a function reads (an sqs trigger's ``queue``), and its dead-letter queue: on
    AWS they exist already; the local stack creates stand-ins of the same names (five receives, then the
    dead-letter queue)."""

    name: str
    url: str
    arn: str
    dead_letter_name: str
    dead_letter_url: str
    dead_letter_arn: str


@dataclass(frozen=True)
class ExistingBucket:
    """A bucket outside the stack whose uploads an s3 trigger's queue takes (``bucket: {parameter: ...}``): on AWS
    its owner configures its notifications; the local stack creates a stand-in of the parameter's name, versioned,
    that notifies the queue of the uploads under ``prefix`` and ending in ``suffix``."""

    name: str
    queue_arn: str
    prefix: str
    suffix: str


@dataclass(frozen=True)
class SqsEventSpec:
    """An SQS event source mapping (SAM ``Type: SQS``), resolved.

    Attributes
    ----------
    queue_logical_id, queue_url, queue_arn
        The queue in this stack that feeds the function.
    batch_size
        Largest number of records in one invocation (``BatchSize``, default 10).
    batching_window_seconds
        How long the mapping gathers records before it invokes (``MaximumBatchingWindowInSeconds``, seconds).
    report_batch_item_failures
        ``FunctionResponseTypes`` contains ``ReportBatchItemFailures``: the function returns the ids that failed.
    name
        The event's key under ``Events``.
    enabled
        ``Enabled`` (default true).
    maximum_concurrency
        ``ScalingConfig.MaximumConcurrency``, when set.
    """

    queue_logical_id: str
    queue_url: str
    queue_arn: str
    batch_size: int = 10
    batching_window_seconds: float = 0.0
    report_batch_item_failures: bool = False
    name: str = ""
    enabled: bool = True
    maximum_concurrency: int | None = None


@dataclass(frozen=True)
class ScheduleEventSpec:
    """An EventBridge schedule (SAM ``Type: Schedule`` or ``ScheduleV2``), resolved.

    Attributes
    ----------
    expression
        ``rate(...)`` or ``cron(...)``.
    enabled
        Whether the rule fires on its own (``Enabled`` / ``State``).
    name
        The event's key under ``Events``.
    input
        ``Input``: a JSON text that replaces the scheduled event, when set.
    source
        ``aws.events`` for ``Schedule``, ``aws.scheduler`` for ``ScheduleV2``.
    """

    expression: str
    enabled: bool = True
    name: str = ""
    input: str | None = None
    source: str = "aws.events"


@dataclass(frozen=True)
class EventRuleSpec:
    """An EventBridge rule (``AWS::Events::Rule``) whose targets are queues of the stack.

    Attributes
    ----------
    logical_id
        The rule.
    bus
        The name of the bus it is on (``default``, or a bus of the stack: its physical name).
    pattern
        Its event pattern (``devstack.events`` matches events against it).
    enabled
        ``State`` is ``ENABLED``.
    queue_urls
        Its target queues (the event goes to each as it is).
    """

    logical_id: str
    bus: str
    pattern: dict[str, Any]
    enabled: bool
    queue_urls: tuple[str, ...]


@dataclass(frozen=True)
class SchedulerScheduleSpec:
    """An EventBridge Scheduler schedule (``AWS::Scheduler::Schedule``) whose target is a queue of the stack.

    Attributes
    ----------
    logical_id
        The schedule.
    expression, timezone, start_date, end_date
        When it ticks (``devstack.schedules.ScheduleTicks``).
    enabled
        ``State`` is ``ENABLED``.
    input
        The target's ``Input`` (``<aws.scheduler.scheduled-time>`` is the tick's time).
    queue_url
        The target queue.
    """

    logical_id: str
    expression: str
    timezone: str
    start_date: str | None
    end_date: str | None
    enabled: bool
    input: str
    queue_url: str


@dataclass(frozen=True)
class HttpApiEventSpec:
    """A route of an API Gateway HTTP API (SAM ``Type: HttpApi``), resolved.

    Attributes
    ----------
    api_logical_id
        The ``AWS::Serverless::HttpApi`` (``ServerlessHttpApi`` for SAM's implicit API).
    path
        Route path template, e.g. ``/workflows/{workflow_id}`` or ``/{proxy+}``; ``$default`` for the catch-all.
    method
        Upper-case HTTP method, or ``ANY``.
    name
        The event's key under ``Events``.
    api_id
        What ``!Ref`` of the API gives in this stack.
    authorization
        What API Gateway checks before the function runs: ``AWS_IAM`` (a SigV4 signature and an IAM policy),
        ``JWT`` or ``NONE``.
    """

    api_logical_id: str
    path: str
    method: str
    name: str = ""
    api_id: str = ""
    authorization: str = "NONE"

    @property
    def route_key(self) -> str:
        """The route key API Gateway puts in the event, e.g. ``"POST /workflows"`` or ``"$default"``."""
        return "$default" if self.path == "$default" else f"{self.method} {self.path}"


EventSpec: TypeAlias = SqsEventSpec | ScheduleEventSpec | HttpApiEventSpec


@dataclass(frozen=True)
class FunctionSpec:
    """One ``AWS::Serverless::Function`` with Globals merged and intrinsics resolved.

    Attributes
    ----------
    logical_id
        The function's logical id.
    code_dir
        Absolute path of ``CodeUri``.
    handler
        ``"module.func"``.
    runtime
        E.g. ``python3.12``.
    timeout_seconds
        ``Timeout`` in seconds (Lambda's default is 3).
    memory_mb
        ``MemorySize`` in MiB (Lambda's default is 128).
    environment
        ``Environment.Variables``, every value a string as in CloudFormation.
    layer_dirs
        Absolute paths of the stack's layers, in the order listed, each as it appears on ``sys.path`` in Lambda.
    events
        The function's triggers that the local stack drives.
    function_name
        The physical function name (``FunctionName`` or ``f"{stack_name}-{LogicalId}"``).
    reserved_concurrency
        ``ReservedConcurrentExecutions``, when set.
    external_layer_arns
        Layers referenced by ARN outside the stack; locally their packages must be installed in the environment.
    """

    logical_id: str
    code_dir: Path
    handler: str
    runtime: str
    timeout_seconds: int
    memory_mb: int
    environment: dict[str, str]
    layer_dirs: list[Path]
    events: list[EventSpec]
    function_name: str = ""
    reserved_concurrency: int | None = None
    external_layer_arns: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------- helpers


class _NoValue:
    """``AWS::NoValue``: the property that holds it is removed."""

    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE: Final = _NoValue()


def _is_intrinsic(value: Any) -> bool:
    return (
        isinstance(value, dict) and len(value) == 1 and next(iter(value)) in {"Ref", "Condition", *_SHORT_TAGS.values()}
    )


def _bounded_name(base: str, limit: int, suffix: str = "") -> str:
    """Keep a generated name within ``limit`` characters; a hash keeps truncated names unique."""
    if len(base) + len(suffix) <= limit:
        return base + suffix
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    return f"{base[: limit - len(suffix) - 9]}-{digest}{suffix}"


def _as_string(value: Any) -> str:
    """CloudFormation's view of a scalar as a string: booleans are lower case, numbers keep their digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise TemplateError(f"expected a scalar, got {value!r}")


def _as_bool(value: Any) -> bool:
    return _as_string(value).lower() == "true"


def merge_globals(global_value: Any, local_value: Any) -> Any:
    """Merge a ``Globals`` value into a resource value with SAM's rules.

    Maps merge key by key (the resource wins), lists are appended after the global items, and scalars or
    intrinsic functions from the resource replace the global value. Source: SAM specification, "Globals section".

    Parameters
    ----------
    global_value
        The value under ``Globals.Function``.
    local_value
        The function's own value, or ``None`` when it has none.

    Returns
    -------
    Any
        The merged value (new objects; the inputs are not modified).
    """
    if local_value is None:
        return copy.deepcopy(global_value)
    if (
        isinstance(global_value, dict)
        and isinstance(local_value, dict)
        and not _is_intrinsic(global_value)
        and not _is_intrinsic(local_value)
    ):
        merged = copy.deepcopy(global_value)
        for key, value in local_value.items():
            merged[key] = merge_globals(global_value[key], value) if key in global_value else copy.deepcopy(value)
        return merged
    if isinstance(global_value, list) and isinstance(local_value, list):
        return copy.deepcopy(global_value) + copy.deepcopy(local_value)
    return copy.deepcopy(local_value)


def _referenced_logical_ids(value: Any) -> set[str]:
    """Logical ids named by ``Ref``, ``Fn::GetAtt`` and ``Fn::Sub`` anywhere inside ``value``."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "Ref" and isinstance(item, str):
                found.add(item)
            elif key == "Fn::GetAtt":
                parts = item if isinstance(item, list) else str(item).split(".", 1)
                if parts and isinstance(parts[0], str):
                    found.add(parts[0])
            elif key == "Fn::Sub":
                text = item[0] if isinstance(item, list) else item
                local_names = set(item[1]) if isinstance(item, list) and len(item) > 1 else set()
                if isinstance(text, str):
                    for name in _SUB_VAR_RE.findall(text):
                        if not name.startswith("!") and name.split(".", 1)[0] not in local_names:
                            found.add(name.split(".", 1)[0])
                found |= _referenced_logical_ids(item[1:] if isinstance(item, list) else [])
            else:
                found |= _referenced_logical_ids(item)
    elif isinstance(value, list):
        for item in value:
            found |= _referenced_logical_ids(item)
    return found


# ------------------------------------------------------------------------------------------------------ Stack


class Stack:
    """A template resolved for one stack name, parameter set and region.

    Parameters
    ----------
    template
        The template as returned by `load_template`.
    template_dir
        Directory that relative ``CodeUri`` / ``ContentUri`` paths start from.
    stack_name
        CloudFormation stack name; it prefixes every generated physical name.
    parameters
        Parameter overrides (strings, as ``sam deploy --parameter-overrides`` takes them).
    region
        AWS region of the stack.
    endpoint_url
        The endpoint that serves SQS (the moto server), or ``None`` for AWS's own. It decides the form of the
        queue URLs that ``!Ref`` gives, so they match what ``CreateQueue`` returns there.

    Raises
    ------
    TemplateError
        An override names an unknown parameter, a parameter has no value, or a value breaks its constraints.
    """

    def __init__(
        self,
        template: Mapping[str, Any],
        *,
        template_dir: str | Path,
        stack_name: str = "sasflow",
        parameters: Mapping[str, str] | None = None,
        region: str = "us-east-1",
        endpoint_url: str | None = None,
    ) -> None:
        if not _STACK_NAME_RE.fullmatch(stack_name):
            raise TemplateError(f"invalid stack name {stack_name!r}: letters, digits and '-', starting with a letter")
        self.template: dict[str, Any] = copy.deepcopy(dict(template))
        self.template_dir = Path(template_dir).resolve()
        self.stack_name = stack_name
        self.region = region
        self.account_id = ACCOUNT_ID
        self.endpoint_url = endpoint_url.rstrip("/") if endpoint_url else None
        self._raw_resources: dict[str, dict[str, Any]] = self.template.get("Resources") or {}
        self._mappings: dict[str, Any] = self.template.get("Mappings") or {}
        self._condition_defs: dict[str, Any] = self.template.get("Conditions") or {}
        self.parameters: dict[str, str | list[str]] = self._resolve_parameters(dict(parameters or {}))
        self._conditions: dict[str, bool] = {}
        for name in self._condition_defs:
            self.condition(name)
        self._merged_properties: dict[str, dict[str, Any]] = {
            logical_id: self._merge_resource_globals(resource) for logical_id, resource in self._raw_resources.items()
        }
        self._resolved: dict[str, dict[str, Any]] = {}
        self._resolving: set[str] = set()

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        stack_name: str = "sasflow",
        parameters: dict[str, str] | None = None,
        region: str = "us-east-1",
        *,
        endpoint_url: str | None = None,
    ) -> Stack:
        """Load and resolve a template file.

        Parameters
        ----------
        path
            The template (``template.yaml``); relative code paths start from its directory.
        stack_name
            CloudFormation stack name, the prefix of physical names.
        parameters
            Parameter overrides; parameters not given take their ``Default``.
        region
            AWS region.
        endpoint_url
            See `Stack`; ``None`` gives AWS-form queue URLs (what moto's in-process ``mock_aws`` returns).

        Returns
        -------
        Stack

        Raises
        ------
        TemplateError
            See `Stack`.
        """
        path = Path(path)
        return cls(
            load_template(path),
            template_dir=path.resolve().parent,
            stack_name=stack_name,
            parameters=parameters,
            region=region,
            endpoint_url=endpoint_url,
        )

    def _resolve_parameters(self, overrides: dict[str, str]) -> dict[str, str | list[str]]:
        declared: dict[str, Any] = self.template.get("Parameters") or {}
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise TemplateError(f"unknown parameter(s) {unknown}; the template declares {sorted(declared)}")
        values: dict[str, str | list[str]] = {}
        for name, spec in declared.items():
            spec = spec or {}
            if name in overrides:
                raw: Any = overrides[name]
            elif "Default" in spec:
                raw = spec["Default"]
            else:
                raise TemplateError(
                    f'parameter {name} has no Default and no override: give it one (make up ARGS="--param '
                    f'{name}=VALUE", or --param {name}=VALUE)'
                )
            if isinstance(raw, list):
                raw = ",".join(_as_string(item) for item in raw)
            text = _as_string(raw)
            self._check_parameter(name, spec, text)
            ptype = str(spec.get("Type", "String"))
            if ptype == "CommaDelimitedList" or ptype.startswith("List<"):
                values[name] = [item.strip() for item in text.split(",")] if text else []
            else:
                values[name] = text
        return values

    @staticmethod
    def _check_parameter(name: str, spec: Mapping[str, Any], text: str) -> None:
        ptype = str(spec.get("Type", "String"))
        allowed = spec.get("AllowedValues")
        if allowed is not None and text not in {_as_string(item) for item in allowed}:
            raise TemplateError(f"parameter {name}={text!r} is not one of {allowed}")
        pattern = spec.get("AllowedPattern")
        if pattern is not None and not re.fullmatch(str(pattern), text):
            raise TemplateError(f"parameter {name}={text!r} does not match {pattern!r}")
        if "MinLength" in spec and len(text) < int(spec["MinLength"]):
            raise TemplateError(f"parameter {name} is shorter than {spec['MinLength']}")
        if "MaxLength" in spec and len(text) > int(spec["MaxLength"]):
            raise TemplateError(f"parameter {name} is longer than {spec['MaxLength']}")
        if ptype == "Number":
            try:
                number = float(text)
            except ValueError:
                raise TemplateError(f"parameter {name}={text!r} is not a Number") from None
            if "MinValue" in spec and number < float(spec["MinValue"]):
                raise TemplateError(f"parameter {name}={text} is below MinValue {spec['MinValue']}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                raise TemplateError(f"parameter {name}={text} is above MaxValue {spec['MaxValue']}")

    def _merge_resource_globals(self, resource: Mapping[str, Any]) -> dict[str, Any]:
        properties = copy.deepcopy(resource.get("Properties") or {})
        if resource.get("Type") != "AWS::Serverless::Function":
            return dict(properties)
        global_function = ((self.template.get("Globals") or {}).get("Function")) or {}
        merged = copy.deepcopy(global_function)
        for key, value in properties.items():
            merged[key] = merge_globals(global_function[key], value) if key in global_function else value
        return dict(merged)

    # ------------------------------------------------------------------ conditions

    def condition(self, name: str) -> bool:
        """Evaluate a named condition of the template.

        Raises
        ------
        TemplateError
            The condition does not exist.
        """
        if name not in self._conditions:
            if name not in self._condition_defs:
                raise TemplateError(f"unknown condition {name!r}")
            self._conditions[name] = False  # guards against a self-referencing condition
            self._conditions[name] = self._eval_condition(self._condition_defs[name])
        return self._conditions[name]

    def _eval_condition(self, expr: Any) -> bool:
        if isinstance(expr, dict) and len(expr) == 1:
            key, arg = next(iter(expr.items()))
            if key == "Condition":
                return self.condition(str(arg))
            if key == "Fn::Equals":
                left, right = (self.resolve(item) for item in arg)
                return _as_string(left) == _as_string(right)
            if key == "Fn::Not":
                return not self._eval_condition(arg[0])
            if key == "Fn::And":
                return all(self._eval_condition(item) for item in arg)
            if key == "Fn::Or":
                return any(self._eval_condition(item) for item in arg)
        if isinstance(expr, bool):
            return expr
        raise TemplateError(f"unsupported condition expression {expr!r}")

    @property
    def conditions(self) -> dict[str, bool]:
        """Every named condition and its value."""
        return dict(self._conditions)

    def is_active(self, logical_id: str) -> bool:
        """Whether a resource of the template exists in this stack (its ``Condition`` holds, or it has none).

        Raises
        ------
        TemplateError
            The template has no such resource.
        """
        resource = self._raw_resources.get(logical_id)
        if resource is None:
            raise TemplateError(f"unknown resource {logical_id!r}")
        cond = resource.get("Condition")
        return cond is None or self.condition(str(cond))

    # ------------------------------------------------------------------ resources

    def resource_type(self, logical_id: str) -> str:
        """The ``Type`` of a resource of the template (active or not)."""
        if logical_id not in self._raw_resources:
            raise TemplateError(f"unknown resource {logical_id!r}")
        return str(self._raw_resources[logical_id].get("Type"))

    def template_resources(self) -> list[tuple[str, str, str | None, bool]]:
        """Every resource of the template, in template order.

        Returns
        -------
        list of (logical_id, type, condition name or None, active)
        """
        return [
            (logical_id, str(resource.get("Type")), resource.get("Condition"), self.is_active(logical_id))
            for logical_id, resource in self._raw_resources.items()
        ]

    def raw_properties(self, logical_id: str) -> dict[str, Any]:
        """A resource's properties before intrinsics are resolved (Globals already merged into functions)."""
        if logical_id not in self._merged_properties:
            raise TemplateError(f"unknown resource {logical_id!r}")
        return copy.deepcopy(self._merged_properties[logical_id])

    def metadata(self, logical_id: str) -> dict[str, Any]:
        """A resource's ``Metadata`` section (empty when it has none)."""
        return dict(self._raw_resources[logical_id].get("Metadata") or {})

    def properties(self, logical_id: str) -> dict[str, Any]:
        """A resource's resolved properties.

        Raises
        ------
        TemplateError
            The resource does not exist in this stack, or its properties cannot be resolved.
        """
        if not self.is_active(logical_id):
            raise TemplateError(f"resource {logical_id} is not in this stack (its condition is false)")
        if logical_id not in self._resolved:
            if logical_id in self._resolving:
                raise TemplateError(f"circular reference through the properties of {logical_id}")
            self._resolving.add(logical_id)
            try:
                resolved = self.resolve(self._merged_properties[logical_id])
            finally:
                self._resolving.discard(logical_id)
            self._resolved[logical_id] = resolved if isinstance(resolved, dict) else {}
        return copy.deepcopy(self._resolved[logical_id])

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        """Logical id → resolved properties, for the resources whose condition holds (template order)."""
        return {
            logical_id: self.properties(logical_id) for logical_id in self._raw_resources if self.is_active(logical_id)
        }

    def dependencies(self, logical_id: str) -> set[str]:
        """Resources of this stack that a resource refers to (``Ref``, ``GetAtt``, ``Sub``) or ``DependsOn``."""
        resource = self._raw_resources[logical_id]
        found = _referenced_logical_ids(self._merged_properties[logical_id])
        depends_on = resource.get("DependsOn") or []
        found |= {depends_on} if isinstance(depends_on, str) else set(depends_on)
        return {item for item in found if item in self._raw_resources and item != logical_id}

    # ------------------------------------------------------------------ names and references

    def _explicit_name(self, logical_id: str, key: str) -> str | None:
        raw = self._merged_properties[logical_id].get(key)
        if raw is None:
            return None
        value = self.resolve(raw)
        return None if value is _NO_VALUE else _as_string(value)

    def queue_name(self, logical_id: str) -> str:
        """The SQS queue name (``QueueName`` or ``f"{stack_name}-{LogicalId}"``, at most 80 characters)."""
        explicit = self._explicit_name(logical_id, "QueueName")
        if explicit is not None:
            return explicit
        fifo = _as_bool(self.resolve(self._merged_properties[logical_id].get("FifoQueue", False)))
        suffix = ".fifo" if fifo else ""
        name = _bounded_name(f"{self.stack_name}-{logical_id}", _QUEUE_NAME_MAX, suffix)
        if not _QUEUE_NAME_RE.fullmatch(name.removesuffix(".fifo")):
            raise TemplateError(f"generated queue name {name!r} is not a valid SQS queue name")
        return name

    def api_id(self, logical_id: str) -> str:
        """A stable 10-character id for an HTTP API, shaped like API Gateway's (lower-case letters and digits)."""
        digest = hashlib.sha256(f"{self.stack_name}/{logical_id}".encode()).digest()
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        return "".join(alphabet[byte % len(alphabet)] for byte in digest[:10])

    def _queue_url(self, name: str) -> str:
        base = self.endpoint_url or f"https://sqs.{self.region}.amazonaws.com"
        return f"{base}/{self.account_id}/{name}"

    def physical_id(self, logical_id: str) -> str:
        """The physical id of a resource: what ``!Ref`` gives, as in CloudFormation.

        Table → table name, queue → queue URL, function → function name, HTTP API → api id, layer → layer
        version ARN, alarm → alarm name.

        Raises
        ------
        TemplateError
            The resource is unknown or not in this stack.
        """
        if logical_id == IMPLICIT_HTTP_API and logical_id not in self._raw_resources:
            return self.api_id(logical_id)
        if not self.is_active(logical_id):
            raise TemplateError(f"resource {logical_id} is not in this stack (its condition is false)")
        rtype = self.resource_type(logical_id)
        default_name = f"{self.stack_name}-{logical_id}"
        if rtype == "AWS::DynamoDB::Table":
            return self._explicit_name(logical_id, "TableName") or _bounded_name(default_name, _TABLE_NAME_MAX)
        if rtype == "AWS::SQS::Queue":
            return self._queue_url(self.queue_name(logical_id))
        if rtype in {"AWS::Serverless::Function", "AWS::Lambda::Function"}:
            explicit = self._explicit_name(logical_id, "FunctionName")
            return explicit or _bounded_name(default_name, _FUNCTION_NAME_MAX)
        if rtype in {"AWS::Serverless::HttpApi", "AWS::Serverless::Api", "AWS::ApiGatewayV2::Api"}:
            return self.api_id(logical_id)
        if rtype == "AWS::Logs::LogGroup":
            return self._explicit_name(logical_id, "LogGroupName") or f"/aws/{default_name}"
        if rtype == "AWS::SecretsManager::Secret":
            # A name, where CloudFormation gives the ARN: Secrets Manager takes either, and moto picks the ARN.
            return self._explicit_name(logical_id, "Name") or default_name
        if rtype == "AWS::SNS::Topic":
            name = self._explicit_name(logical_id, "TopicName") or default_name
            return f"arn:aws:sns:{self.region}:{self.account_id}:{name}"
        if rtype == "AWS::IAM::ManagedPolicy":
            name = self._explicit_name(logical_id, "ManagedPolicyName") or default_name
            return f"arn:aws:iam::{self.account_id}:policy/{name}"
        if rtype in {"AWS::Serverless::LayerVersion", "AWS::Lambda::LayerVersion"}:
            name = self._explicit_name(logical_id, "LayerName") or default_name
            return f"arn:aws:lambda:{self.region}:{self.account_id}:layer:{name}:1"
        if rtype == "AWS::CloudWatch::Alarm":
            return self._explicit_name(logical_id, "AlarmName") or default_name
        if rtype == "AWS::Events::EventBus":
            return self._explicit_name(logical_id, "Name") or default_name
        if rtype == "AWS::S3::Bucket":
            # CloudFormation's generated names are lower case and at most 63 characters (bucket naming rules).
            return self._explicit_name(logical_id, "BucketName") or _bounded_name(default_name.lower(), 63)
        return default_name

    def ref(self, name: str) -> Any:
        """``!Ref name``: a parameter value, a pseudo parameter or a resource's physical id.

        Raises
        ------
        TemplateError
            Nothing of that name exists in this stack.
        """
        pseudo = {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account_id,
            "AWS::StackName": self.stack_name,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": (
                f"arn:aws:cloudformation:{self.region}:{self.account_id}:stack/{self.stack_name}/"
                f"{hashlib.sha256(self.stack_name.encode()).hexdigest()[:32]}"
            ),
        }
        if name in pseudo:
            return pseudo[name]
        if name == "AWS::NotificationARNs":
            return []
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in self.parameters:
            return self.parameters[name]
        if name in self._raw_resources or name == IMPLICIT_HTTP_API:
            return self.physical_id(name)
        raise TemplateError(f"!Ref {name}: no such parameter or resource")

    def get_att(self, logical_id: str, attribute: str) -> str:
        """``!GetAtt logical_id.attribute`` for the resource types the local stack knows.

        Raises
        ------
        TemplateError
            Unknown resource, or an attribute devstack does not model.
        """
        rtype = self.resource_type(logical_id)
        region, account = self.region, self.account_id
        if rtype == "AWS::SQS::Queue":
            name = self.queue_name(logical_id)
            by_attr = {
                "Arn": f"arn:aws:sqs:{region}:{account}:{name}",
                "QueueName": name,
                "QueueUrl": self._queue_url(name),
            }
        elif rtype == "AWS::DynamoDB::Table":
            table = self.physical_id(logical_id)
            arn = f"arn:aws:dynamodb:{region}:{account}:table/{table}"
            by_attr = {"Arn": arn}
            if self._merged_properties[logical_id].get("StreamSpecification"):
                # The real label is a timestamp chosen when the stream is created; this one is only stable.
                by_attr["StreamArn"] = f"{arn}/stream/1970-01-01T00:00:00.000"
        elif rtype in {"AWS::Serverless::Function", "AWS::Lambda::Function"}:
            by_attr = {"Arn": f"arn:aws:lambda:{region}:{account}:function:{self.physical_id(logical_id)}"}
        elif rtype == "AWS::Serverless::HttpApi":
            by_attr = {"ApiEndpoint": f"https://{self.physical_id(logical_id)}.execute-api.{region}.amazonaws.com"}
        elif rtype == "AWS::CloudWatch::Alarm":
            by_attr = {"Arn": f"arn:aws:cloudwatch:{region}:{account}:alarm:{self.physical_id(logical_id)}"}
        elif rtype == "AWS::Logs::LogGroup":
            by_attr = {"Arn": f"arn:aws:logs:{region}:{account}:log-group:{self.physical_id(logical_id)}:*"}
        elif rtype == "AWS::ApiGatewayV2::Api":
            by_attr = {"ApiEndpoint": f"https://{self.physical_id(logical_id)}.execute-api.{region}.amazonaws.com"}
        elif rtype == "AWS::SNS::Topic":
            by_attr = {"TopicArn": self.physical_id(logical_id)}
        elif rtype == "AWS::S3::Bucket":
            bucket = self.physical_id(logical_id)
            by_attr = {"Arn": f"arn:aws:s3:::{bucket}", "DomainName": f"{bucket}.s3.amazonaws.com"}
        elif rtype == "AWS::Events::Rule":
            bus = self._merged_properties[logical_id].get("EventBusName") or "default"
            bus_name = self.resolve(bus) if not isinstance(bus, str) else bus
            rule = f"rule/{bus_name}/" if bus_name != "default" else "rule/"
            by_attr = {"Arn": f"arn:aws:events:{region}:{account}:{rule}{self.physical_id(logical_id)}"}
        elif rtype == "AWS::Events::EventBus":
            name = self.physical_id(logical_id)
            by_attr = {"Arn": f"arn:aws:events:{region}:{account}:event-bus/{name}", "Name": name}
        elif rtype == "AWS::IAM::Role":
            name = self._explicit_name(logical_id, "RoleName") or f"{self.stack_name}-{logical_id}"
            by_attr = {"Arn": f"arn:aws:iam::{account}:role/{name}"}
        else:
            by_attr = {}
        if attribute not in by_attr:
            raise TemplateError(f"!GetAtt {logical_id}.{attribute}: not modelled for {rtype}")
        if not self.is_active(logical_id):
            raise TemplateError(f"!GetAtt {logical_id}.{attribute}: the resource's condition is false")
        return by_attr[attribute]

    # ------------------------------------------------------------------ intrinsic functions

    def resolve(self, value: Any) -> Any:
        """Resolve every intrinsic function inside ``value``; ``AWS::NoValue`` removes its key or list item.

        Parameters
        ----------
        value
            Template data (dicts, lists, scalars).

        Returns
        -------
        Any
            Plain data without intrinsics.

        Raises
        ------
        TemplateError
            An intrinsic is malformed, names something unknown, or is not supported locally.
        """
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if _is_intrinsic(value):
            key, arg = next(iter(value.items()))
            return self._resolve_intrinsic(key, arg)
        resolved: dict[str, Any] = {}
        for key, item in value.items():
            result = self.resolve(item)
            if result is not _NO_VALUE:
                resolved[key] = result
        return resolved

    def _resolve_intrinsic(self, key: str, arg: Any) -> Any:
        if key == "Ref":
            return self.ref(str(arg))
        if key == "Fn::GetAtt":
            parts = arg if isinstance(arg, list) else str(arg).split(".", 1)
            logical_id, attribute = (self.resolve(part) for part in parts)
            return self.get_att(str(logical_id), str(attribute))
        if key == "Fn::Sub":
            return self._sub(arg)
        if key == "Fn::If":
            cond, when_true, when_false = arg
            return self.resolve(when_true if self.condition(str(cond)) else when_false)
        if key == "Fn::Join":
            delimiter, items = arg
            values = self.resolve(items)
            if not isinstance(values, list):
                raise TemplateError(f"Fn::Join needs a list, got {values!r}")
            return str(delimiter).join(_as_string(item) for item in values)
        if key == "Fn::Select":
            index, items = (self.resolve(part) for part in arg)
            if not isinstance(items, list) or not 0 <= int(index) < len(items):
                raise TemplateError(f"Fn::Select index {index} out of range of {items!r}")
            return items[int(index)]
        if key == "Fn::Split":
            delimiter, text = arg
            return _as_string(self.resolve(text)).split(str(delimiter))
        if key == "Fn::FindInMap":
            map_name, top, second = (_as_string(self.resolve(part)) for part in arg[:3])
            try:
                return self._mappings[map_name][top][second]
            except KeyError:
                raise TemplateError(f"Fn::FindInMap {map_name}/{top}/{second}: not in Mappings") from None
        if key == "Fn::Base64":
            return base64.b64encode(_as_string(self.resolve(arg)).encode()).decode()
        if key == "Fn::GetAZs":
            return [f"{self.region}{letter}" for letter in "abc"]
        if key == "Fn::Length":
            items = self.resolve(arg)
            return len(items) if isinstance(items, list) else 1
        if key == "Fn::ToJsonString":
            return json.dumps(self.resolve(arg), separators=(",", ":"))
        if key in {"Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition"}:
            return self._eval_condition({key: arg})
        raise TemplateError(f"{key} cannot be resolved locally (no other stacks or macros exist offline)")

    def _sub(self, arg: Any) -> str:
        if isinstance(arg, list):
            text, variables = arg[0], (arg[1] if len(arg) > 1 else {})
        else:
            text, variables = arg, {}
        local = {name: self.resolve(value) for name, value in (variables or {}).items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in local:
                return _as_string(local[name])
            if "." in name and not name.startswith("AWS::"):
                logical_id, attribute = name.split(".", 1)
                return self.get_att(logical_id, attribute)
            value = self.ref(name)
            if isinstance(value, list):
                raise TemplateError(f"Fn::Sub ${{{name}}}: a list cannot be substituted into a string")
            return _as_string(value)

        return _SUB_VAR_RE.sub(replace, str(text))

    # ------------------------------------------------------------------ outputs and functions

    def outputs(self) -> dict[str, str]:
        """Resolved ``Outputs`` whose condition holds (output name → value).

        Raises
        ------
        TemplateError
            An output's value cannot be resolved.
        """
        result: dict[str, str] = {}
        for name, spec in (self.template.get("Outputs") or {}).items():
            cond = (spec or {}).get("Condition")
            if cond is not None and not self.condition(str(cond)):
                continue
            value = self.resolve(spec.get("Value"))
            result[name] = (
                ",".join(_as_string(item) for item in value) if isinstance(value, list) else _as_string(value)
            )
        return result

    def functions(self) -> list[FunctionSpec]:
        """The stack's ``AWS::Serverless::Function`` resources as runnable specs (those whose condition holds).

        Returns
        -------
        list of FunctionSpec
            In template order.

        Raises
        ------
        TemplateError
            A function uses something devstack cannot run: code outside the working tree, an image, an event
            type it does not emulate, or an SQS event whose queue is not in this stack.
        """
        return [
            self._function_spec(logical_id)
            for logical_id, (rtype, active) in (
                (lid, (self.resource_type(lid), self.is_active(lid))) for lid in self._raw_resources
            )
            if active and rtype == "AWS::Serverless::Function"
        ]

    def function(self, logical_id: str) -> FunctionSpec:
        """One ``AWS::Serverless::Function`` as a runnable spec.

        Raises
        ------
        TemplateError
            The resource is not an active function, or it uses something devstack cannot run (see `functions`).
        """
        if self.resource_type(logical_id) != "AWS::Serverless::Function":
            raise TemplateError(f"{logical_id} is not an AWS::Serverless::Function")
        return self._function_spec(logical_id)

    def _function_spec(self, logical_id: str) -> FunctionSpec:
        props = self.properties(logical_id)
        raw = self._merged_properties[logical_id]
        where = f"function {logical_id}"
        if props.get("PackageType", "Zip") != "Zip":
            raise TemplateError(f"{where}: PackageType {props['PackageType']} is not emulated (only Zip)")
        code_uri = props.get("CodeUri")
        if not isinstance(code_uri, str):
            raise TemplateError(f"{where}: CodeUri must be a local path, got {code_uri!r}")
        handler = props.get("Handler")
        if not isinstance(handler, str) or "." not in handler:
            raise TemplateError(f"{where}: Handler must look like 'module.function', got {handler!r}")
        variables = (props.get("Environment") or {}).get("Variables") or {}
        environment = {str(name): _as_string(value) for name, value in variables.items()}
        layer_dirs: list[Path] = []
        external_layers: list[str] = []
        for raw_layer, resolved_layer in zip(raw.get("Layers") or [], props.get("Layers") or [], strict=False):
            layer_id = raw_layer.get("Ref") if isinstance(raw_layer, dict) else None
            if layer_id in self._raw_resources:
                layer_dirs.append(self._layer_dir(str(layer_id)))
            else:
                external_layers.append(str(resolved_layer))
        events = [
            self._event_spec(logical_id, name, event, raw_events=raw.get("Events") or {})
            for name, event in (props.get("Events") or {}).items()
        ]
        events += self._mapped_events(logical_id)
        reserved = props.get("ReservedConcurrentExecutions")
        return FunctionSpec(
            logical_id=logical_id,
            code_dir=(self.template_dir / code_uri).resolve(),
            handler=handler,
            runtime=str(props.get("Runtime", "")),
            timeout_seconds=int(props.get("Timeout", 3)),
            memory_mb=int(props.get("MemorySize", 128)),
            environment=environment,
            layer_dirs=layer_dirs,
            events=events,
            function_name=self.physical_id(logical_id),
            reserved_concurrency=int(reserved) if reserved is not None else None,
            external_layer_arns=external_layers,
        )

    def _layer_dir(self, layer_id: str) -> Path:
        rtype = self.resource_type(layer_id)
        if rtype != "AWS::Serverless::LayerVersion":
            raise TemplateError(f"layer {layer_id}: {rtype} is not emulated (use AWS::Serverless::LayerVersion)")
        content_uri = self.properties(layer_id).get("ContentUri")
        if not isinstance(content_uri, str):
            raise TemplateError(f"layer {layer_id}: ContentUri must be a local path, got {content_uri!r}")
        content = (self.template_dir / content_uri).resolve()
        build_method = str(self.metadata(layer_id).get("BuildMethod", ""))
        # ``sam build`` with a python BuildMethod puts the ContentUri folder under python/ (so on sys.path);
        # without one the folder is zipped as it is and only its python/ sub-folder is on sys.path.
        if not build_method.startswith("python") and (content / "python").is_dir():
            return content / "python"
        return content

    def _event_spec(
        self, function_id: str, name: str, event: Mapping[str, Any], raw_events: Mapping[str, Any]
    ) -> EventSpec:
        etype = str(event.get("Type"))
        props: dict[str, Any] = dict(event.get("Properties") or {})
        raw_props: dict[str, Any] = dict((raw_events.get(name) or {}).get("Properties") or {})
        where = f"function {function_id}, event {name} ({etype})"
        if etype == "SQS":
            if props.get("FilterCriteria"):
                raise TemplateError(f"{where}: FilterCriteria is not emulated")
            queue_id = self._queue_logical_id(raw_props.get("Queue"), props.get("Queue"), where)
            scaling = props.get("ScalingConfig") or {}
            return SqsEventSpec(
                queue_logical_id=queue_id,
                queue_url=self.physical_id(queue_id),
                queue_arn=self.get_att(queue_id, "Arn"),
                batch_size=int(props.get("BatchSize", 10)),
                batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0)),
                report_batch_item_failures="ReportBatchItemFailures" in (props.get("FunctionResponseTypes") or []),
                name=name,
                enabled=_as_bool(props.get("Enabled", True)),
                maximum_concurrency=int(scaling["MaximumConcurrency"]) if "MaximumConcurrency" in scaling else None,
            )
        if etype in {"Schedule", "ScheduleV2"}:
            expression = props.get("Schedule" if etype == "Schedule" else "ScheduleExpression")
            if not isinstance(expression, str):
                raise TemplateError(f"{where}: no schedule expression")
            enabled = _as_bool(props.get("Enabled", True))
            if "State" in props:
                enabled = str(props["State"]).upper() == "ENABLED"
            raw_input = props.get("Input")
            return ScheduleEventSpec(
                expression=expression,
                enabled=enabled,
                name=name,
                input=None if raw_input is None else str(raw_input),
                source="aws.events" if etype == "Schedule" else "aws.scheduler",
            )
        if etype == "HttpApi":
            api_ref = raw_props.get("ApiId")
            api_id = api_ref.get("Ref") if isinstance(api_ref, dict) else None
            if api_ref is not None and (
                api_id not in self._raw_resources or self.resource_type(str(api_id)) != "AWS::Serverless::HttpApi"
            ):
                raise TemplateError(f"{where}: ApiId must be !Ref of an AWS::Serverless::HttpApi in this template")
            api_logical_id = str(api_id) if api_id else IMPLICIT_HTTP_API
            path = str(props.get("Path", "$default"))
            method = str(props.get("Method", "ANY")).upper()
            return HttpApiEventSpec(
                api_logical_id=api_logical_id,
                path=path,
                method=method,
                name=name,
                api_id=self.physical_id(api_logical_id),
            )
        raise TemplateError(f"{where}: event type {etype} is not emulated (supported: {sorted(EMULATED_EVENT_TYPES)})")

    def _mapped_events(self, function_id: str) -> list[EventSpec]:
        """The function's triggers declared as resources of their own: ``AWS::Lambda::EventSourceMapping`` of an
        SQS queue, and ``AWS::ApiGatewayV2::Route`` whose integration invokes it."""
        events: list[EventSpec] = []
        for logical_id, rtype, _cond, active in self.template_resources():
            if not active:
                continue
            raw = self._merged_properties[logical_id]
            where = f"{rtype} {logical_id}"
            if rtype == "AWS::Lambda::EventSourceMapping" and raw.get("FunctionName") == {"Ref": function_id}:
                props = self.properties(logical_id)
                if props.get("FilterCriteria"):
                    raise TemplateError(f"{where}: FilterCriteria is not emulated")
                existing = self.existing_queue(logical_id)
                if existing is not None:  # the local stack's stand-in for a queue outside the stack
                    queue_id, queue_url, queue_arn = existing.name, existing.url, existing.arn
                else:
                    queue_id = self._queue_logical_id(raw.get("EventSourceArn"), props.get("EventSourceArn"), where)
                    queue_url, queue_arn = self.physical_id(queue_id), self.get_att(queue_id, "Arn")
                scaling = props.get("ScalingConfig") or {}
                events.append(
                    SqsEventSpec(
                        queue_logical_id=queue_id,
                        queue_url=queue_url,
                        queue_arn=queue_arn,
                        batch_size=int(props.get("BatchSize", 10)),
                        batching_window_seconds=float(props.get("MaximumBatchingWindowInSeconds", 0)),
                        report_batch_item_failures="ReportBatchItemFailures"
                        in (props.get("FunctionResponseTypes") or []),
                        name=logical_id,
                        enabled=_as_bool(props.get("Enabled", True)),
                        maximum_concurrency=(
                            int(scaling["MaximumConcurrency"]) if "MaximumConcurrency" in scaling else None
                        ),
                    )
                )
            elif rtype == "AWS::ApiGatewayV2::Route" and self._route_function(logical_id) == function_id:
                props = self.properties(logical_id)
                route_key = str(props["RouteKey"])
                method, _, path = route_key.partition(" ") if route_key != "$default" else ("ANY", "", "$default")
                api_ref = raw.get("ApiId")
                api_logical_id = str(api_ref.get("Ref")) if isinstance(api_ref, dict) else ""
                events.append(
                    HttpApiEventSpec(
                        api_logical_id=api_logical_id,
                        path=path,
                        method=method.upper(),
                        name=logical_id,
                        api_id=self.physical_id(api_logical_id),
                        authorization=str(props.get("AuthorizationType", "NONE")),
                    )
                )
        return events

    def existing_queue(self, mapping_id: str) -> ExistingQueue | None:
        """The existing queue an event source mapping reads (its Metadata names the queue's dead-letter queue, see
        ``devstack.triggers.STAND_IN_METADATA``), as the local stack stands in for it; None for a queue of the stack.

        Raises
        ------
        TemplateError
            When the mapping's queue ARN is not of this account and region, where the stand-in lives.
        """
        from devstack.triggers import STAND_IN_METADATA

        declared = self.metadata(mapping_id).get(STAND_IN_METADATA)
        if not isinstance(declared, dict):
            return None
        arn = str(self.properties(mapping_id).get("EventSourceArn"))
        *_, region, account, name = arn.split(":")
        if (region, account) != (self.region, self.account_id):
            raise TemplateError(
                f"AWS::Lambda::EventSourceMapping {mapping_id}: the local stack stands in for existing queues of its "
                f"own account and region ({self.account_id}, {self.region}), not {arn}: write the queue's ARN with "
                "${AWS::Region} and ${AWS::AccountId}"
            )
        dead_letters = str(declared["dead_letter_queue"])
        return ExistingQueue(
            name=name,
            url=self._queue_url(name),
            arn=arn,
            dead_letter_name=dead_letters,
            dead_letter_url=self._queue_url(dead_letters),
            dead_letter_arn=f"arn:aws:sqs:{self.region}:{self.account_id}:{dead_letters}",
        )

    def existing_queues(self) -> list[ExistingQueue]:
        """Every existing queue an event source mapping of the stack reads (the local stack creates stand-ins)."""
        found = []
        for logical_id, rtype, _cond, active in self.template_resources():
            if active and rtype == "AWS::Lambda::EventSourceMapping":
                existing = self.existing_queue(logical_id)
                if existing is not None:
                    found.append(existing)
        return found

    def existing_buckets(self) -> list[ExistingBucket]:
        """Every existing bucket an s3 trigger's queue policy lets send (its Metadata names the bucket's parameter,
        see ``devstack.triggers.STAND_IN_BUCKET_METADATA``), as the local stack stands in for it."""
        from devstack.triggers import STAND_IN_BUCKET_METADATA

        found = []
        for logical_id, rtype, _cond, active in self.template_resources():
            declared = self.metadata(logical_id).get(STAND_IN_BUCKET_METADATA) if active else None
            if rtype != "AWS::SQS::QueuePolicy" or not isinstance(declared, dict):
                continue
            [statement] = self.properties(logical_id)["PolicyDocument"]["Statement"]
            found.append(
                ExistingBucket(
                    name=str(self.ref(str(declared["bucket_parameter"]))),
                    queue_arn=str(statement["Resource"]),
                    prefix=str(declared.get("prefix", "")),
                    suffix=str(declared.get("suffix", "")),
                )
            )
        return found

    def _route_function(self, route_id: str) -> str | None:
        """The function a route's ``Target: integrations/<Integration>`` invokes (``IntegrationUri`` its ARN)."""
        target = self._merged_properties[route_id].get("Target")
        text = target.get("Fn::Sub") if isinstance(target, dict) else target
        match = re.fullmatch(r"integrations/\$\{(\w+)\}", str(text or ""))
        if match is None or match.group(1) not in self._raw_resources:
            return None
        uri = self._merged_properties[match.group(1)].get("IntegrationUri")
        if isinstance(uri, dict) and "Fn::GetAtt" in uri:
            parts = uri["Fn::GetAtt"]
            parts = parts if isinstance(parts, list) else str(parts).split(".", 1)
            return str(parts[0])
        return None

    def _queue_logical_id(self, raw_queue: Any, resolved_queue: Any, where: str) -> str:
        if isinstance(raw_queue, dict) and "Fn::GetAtt" in raw_queue:
            parts = raw_queue["Fn::GetAtt"]
            parts = parts if isinstance(parts, list) else str(parts).split(".", 1)
            return str(parts[0])
        for logical_id, rtype, _cond, active in self.template_resources():
            if active and rtype == "AWS::SQS::Queue" and self.get_att(logical_id, "Arn") == resolved_queue:
                return logical_id
        raise TemplateError(f"{where}: queue {resolved_queue!r} is not an AWS::SQS::Queue of this stack")

    def scheduler_schedules(self) -> list[SchedulerScheduleSpec]:
        """The stack's EventBridge Scheduler schedules (``AWS::Scheduler::Schedule``) whose target is a queue of the
        stack, resolved (``devstack.schedules`` ticks them).

        Raises
        ------
        TemplateError
            When a schedule's target is not a queue of this stack.
        """
        found = []
        for logical_id, rtype, _cond, active in self.template_resources():
            if not active or rtype != "AWS::Scheduler::Schedule":
                continue
            props = self.properties(logical_id)
            target = props.get("Target") or {}
            raw_target = self._merged_properties[logical_id].get("Target") or {}
            queue_id = self._queue_logical_id(
                raw_target.get("Arn"), target.get("Arn"), f"AWS::Scheduler::Schedule {logical_id}"
            )
            found.append(
                SchedulerScheduleSpec(
                    logical_id=logical_id,
                    expression=str(props["ScheduleExpression"]),
                    timezone=str(props.get("ScheduleExpressionTimezone") or "UTC"),
                    start_date=props.get("StartDate"),
                    end_date=props.get("EndDate"),
                    enabled=str(props.get("State", "ENABLED")).upper() == "ENABLED",
                    input=str(target.get("Input") or ""),
                    queue_url=self.physical_id(queue_id),
                )
            )
        return found

    def event_rules(self) -> list[EventRuleSpec]:
        """The stack's EventBridge rules (``AWS::Events::Rule``) whose targets are queues of the stack, resolved
        (``python -m devstack emit`` puts events on their buses).

        Raises
        ------
        TemplateError
            When a rule's target is not a queue of this stack, or it has no event pattern.
        """
        found = []
        for logical_id, rtype, _cond, active in self.template_resources():
            if not active or rtype != "AWS::Events::Rule":
                continue
            props = self.properties(logical_id)
            raw_targets = self._merged_properties[logical_id].get("Targets") or []
            queues = tuple(
                self.physical_id(
                    self._queue_logical_id(raw.get("Arn"), target.get("Arn"), f"AWS::Events::Rule {logical_id}")
                )
                for raw, target in zip(raw_targets, props.get("Targets") or [], strict=True)
            )
            pattern = props.get("EventPattern")
            if isinstance(pattern, str):
                pattern = json.loads(pattern)
            if not isinstance(pattern, dict):
                raise TemplateError(
                    f"AWS::Events::Rule {logical_id}: no EventPattern (a schedule rule is not emulated)"
                )
            found.append(
                EventRuleSpec(
                    logical_id=logical_id,
                    bus=str(props.get("EventBusName") or "default"),
                    pattern=pattern,
                    enabled=str(props.get("State", "ENABLED")).upper() == "ENABLED",
                    queue_urls=queues,
                )
            )
        return found

    def queue_logical_ids(self) -> Iterable[str]:
        """Logical ids of the stack's SQS queues (condition holds), in template order."""
        return [lid for lid, rtype, _c, active in self.template_resources() if active and rtype == "AWS::SQS::Queue"]

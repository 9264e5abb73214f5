"""Each function's identity policies as they would deploy: the SAM-translated template, resolved for one stack.

SAM turns a function's ``Policies`` into an ``AWS::IAM::Role`` of its own (``<Function>Role``: inline policies, the
managed policies it names, and ``AWSLambdaBasicExecutionRole`` / ``AWSXrayWriteOnlyAccess`` that SAM adds). This
module reads that role from `devstack.sam.translate`'s output and resolves its intrinsics with the stack's
`devstack.template.Stack` (conditions, parameters, physical names). Managed policies of the template are read from
their resources; AWS managed policies from `AWS_MANAGED_POLICIES` (their documents as AWS publishes them). A managed
policy this module does not know, or an intrinsic it cannot resolve, raises `PolicyError` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from devstack.iam.policy import PolicyError, Statement, statements_of
from devstack.iam.requests import CallContext, secret_arn
from devstack.sam import translate
from devstack.template import Stack, TemplateError

__all__ = ["AWS_MANAGED_POLICIES", "Principal", "principals"]

_LOGS: Final = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]
#: AWS managed policies the template's roles may carry (IAM console, "AWS managed policies", current versions).
AWS_MANAGED_POLICIES: Final[dict[str, dict[str, Any]]] = {
    "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole": {
        "Statement": [{"Effect": "Allow", "Action": _LOGS, "Resource": "*"}]
    },
    "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess": {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "xray:PutTraceSegments",
                    "xray:PutTelemetryRecords",
                    "xray:GetSamplingRules",
                    "xray:GetSamplingTargets",
                    "xray:GetSamplingStatisticSummaries",
                ],
                "Resource": ["*"],
            }
        ]
    },
    "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole": {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes", *_LOGS],
                "Resource": "*",
            }
        ]
    },
}


@dataclass(frozen=True)
class Principal:
    """A function's identity as the check sees it.

    Attributes
    ----------
    function
        The function's logical id.
    role
        The role's logical id in the translated template (``SchedulerFunctionRole``).
    arn
        The assumed-role ARN AWS names in an AccessDenied message.
    statements
        Every statement of its identity policies, resolved.
    where
        Region, account and key schemas for the ARNs of its calls.
    """

    function: str
    role: str
    arn: str
    statements: tuple[Statement, ...]
    where: CallContext

    def to_json(self) -> str:
        """The principal as JSON text (`from_json` reads it back): how a worker process receives its role."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Principal:
        """Read `to_json`'s text."""
        data = json.loads(text)
        listed = ("actions", "not_actions", "resources", "not_resources")
        statements = tuple(
            Statement(**{key: tuple(value) if key in listed else value for key, value in item.items()})  # type: ignore[arg-type]
            for item in data["statements"]
        )
        return cls(data["function"], data["role"], data["arn"], statements, CallContext(**data["where"]))

    def without(self, action: str) -> Principal:
        """The same role with ``action`` taken out of every statement that names it (a policy mutation).

        Raises
        ------
        ValueError
            No statement names ``action``: the mutation would change nothing.
        """
        changed = [
            replace(s, actions=tuple(a for a in s.actions if a.lower() != action.lower())) for s in self.statements
        ]
        if changed == list(self.statements):
            raise ValueError(f"{self.role} names no {action}: nothing to take out")
        return replace(self, statements=tuple(s for s in changed if s.actions or s.not_actions))


def _secret_arns(stack: Stack) -> dict[str, str]:
    """Secret name → ARN: ``!Ref`` of a secret is its ARN in CloudFormation, its name on the local stack."""
    out = {}
    for logical_id, rtype, _condition, active in stack.template_resources():
        if active and rtype == "AWS::SecretsManager::Secret":
            name = stack.physical_id(logical_id)
            out[name] = secret_arn(stack.region, stack.account_id, name)
    return out


def _as_arns(document: Any, secrets: Mapping[str, str]) -> Any:
    if isinstance(document, dict):
        return {key: _as_arns(value, secrets) for key, value in document.items()}
    if isinstance(document, list):
        return [_as_arns(value, secrets) for value in document]
    return secrets.get(document, document) if isinstance(document, str) else document


def partition_keys(stack: Stack) -> dict[str, dict[str, str]]:
    """``{table name: {"": partition key, index name: its partition key}}`` for the stack's tables."""
    out: dict[str, dict[str, str]] = {}
    for logical_id, rtype, _condition, active in stack.template_resources():
        if not (active and rtype == "AWS::DynamoDB::Table"):
            continue
        properties = stack.properties(logical_id)

        def hash_key(schema: list[dict[str, str]]) -> str:
            return next(k["AttributeName"] for k in schema if k["KeyType"] == "HASH")

        keys = {"": hash_key(properties["KeySchema"])}
        for index in properties.get("GlobalSecondaryIndexes", []) + properties.get("LocalSecondaryIndexes", []):
            keys[index["IndexName"]] = hash_key(index["KeySchema"])
        out[stack.physical_id(logical_id)] = keys
    return out


def principals(stack: Stack) -> dict[str, Principal]:
    """Every active function of ``stack`` (logical id) with its role's statements, as SAM would deploy them.

    Raises
    ------
    PolicyError
        A role, managed policy or intrinsic that cannot be read (named), or a statement `statements_of` refuses.
    devstack.sam.SamTranslationError
        The template cannot be translated.
    """
    resources: dict[str, Any] = translate(stack.template)["Resources"]
    managed = {
        stack.physical_id(logical_id): logical_id
        for logical_id, resource in resources.items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy" and stack.is_active(logical_id)
    }
    secrets = _secret_arns(stack)
    where = CallContext(stack.region, stack.account_id, partition_keys(stack))

    def resolved(value: Any, what: str) -> Any:
        try:
            return _as_arns(stack.resolve(value), secrets)
        except TemplateError as error:
            raise PolicyError(f"{what}: {error}") from error

    out = {}
    for function, resource in resources.items():
        if resource["Type"] != "AWS::Lambda::Function" or not stack.is_active(function):
            continue
        role_ref = resource["Properties"].get("Role")
        if not (isinstance(role_ref, dict) and "Fn::GetAtt" in role_ref):
            raise PolicyError(f"{function}: its Role {role_ref!r} is not a role of this template; it cannot be checked")
        role = role_ref["Fn::GetAtt"][0]
        properties = resources[role]["Properties"]
        statements: list[Statement] = []
        for policy in resolved(properties.get("Policies", []), f"{role} Policies"):
            statements += statements_of(policy["PolicyDocument"], f"{role}/{policy['PolicyName']}")
        for arn in resolved(properties.get("ManagedPolicyArns", []), f"{role} ManagedPolicyArns"):
            if arn in managed:
                document = resolved(resources[managed[arn]]["Properties"]["PolicyDocument"], managed[arn])
                statements += statements_of(document, managed[arn])
            elif arn in AWS_MANAGED_POLICIES:
                statements += statements_of(AWS_MANAGED_POLICIES[arn], arn.rsplit("/", 1)[-1])
            else:
                raise PolicyError(f"{role}: managed policy {arn} is unknown offline (add it to AWS_MANAGED_POLICIES)")
        name = stack.physical_id(function)
        arn = f"arn:aws:sts::{stack.account_id}:assumed-role/{stack.stack_name}-{role}/{name}"
        out[function] = Principal(function, role, arn, tuple(statements), where)
    return out

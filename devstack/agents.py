"""The agents of a deployment, declared once in ``agents.yaml``, and the parts of ``template.yaml`` made from them.

Every agent needs the same dozen things in the template: a request queue and its dead-letter queue, a function, an
SQS event source mapping scoped to its own queue, a log group, policies, alarms, its place in the engine's agent list
(the ``AGENTS`` variable: each agent's queue and allowed actions) and outputs. Writing them by hand took nine edits per
agent. Here they are rendered from ``agents.yaml`` between ``# >>> agents:<part>`` and ``# <<< agents:<part>``
markers of ``template.yaml``, which stays a plain template that ``sam validate``, ``sam build``, ``sam deploy`` and
the local stack read as it is (``Fn::ForEach`` was the alternative: its collections hold only strings, so the
engine's list of agents and actions could not be built from it, and every tool would have to expand it).

``python -m devstack template`` rewrites the parts (every make target that reads the template runs it first);
``render_template`` is the same function for tests, and ``check_template`` tells whether the file is up to date.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

if TYPE_CHECKING:
    from devstack.triggers import TriggerDeclaration

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
AGENTS_FILE: Final = REPO_ROOT / "agents.yaml"
TEMPLATE_FILE: Final = REPO_ROOT / "template.yaml"
PARTS: Final = ("parameters", "globals", "ops", "resources", "outputs")
_NAME = r"^[a-z][a-z0-9]*$"
_LOOPBACK = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?(/|$)")


def _call_limits() -> Any:
    """The engine's ``CallLimits``, whose rules the declarations follow (a burst below max_in_flight, ...): from the
    layer of this checkout when ``python -m devstack`` runs without it on the path (make puts it there)."""
    try:
        from sasflow.call_limits import CallLimits
    except ModuleNotFoundError:
        sys.path.append(str(REPO_ROOT / "layers" / "sasflow"))
        from sasflow.call_limits import CallLimits
    return CallLimits


class AgentsFileError(ValueError):
    """``agents.yaml`` is malformed, or ``template.yaml`` lacks the markers of a generated part."""


class AgentDeclaration(BaseModel):
    """One entry of ``agents.yaml`` (see the comments at the top of that file for each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, max_length=32)
    description: str = Field(min_length=1, max_length=200)
    kind: Literal["http", "python"] = "http"
    base_url: str | None = Field(default=None, min_length=1)
    code_uri: str | None = Field(default=None, pattern=r"^functions/[a-z0-9_]+/$")
    handler: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
    tables: dict[str, str] = Field(default_factory=dict)
    actions: tuple[str, ...] = Field(min_length=1)
    auth: Literal["none", "sigv4", "header"] = "none"
    auth_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    auth_secret: str | None = Field(default=None, pattern=r"^(secretsmanager|ssm):.+$")
    invoke_arn: str | None = Field(default=None, pattern=r"^arn:aws[a-z-]*:execute-api:.+$")
    concurrency: int | None = Field(default=None, ge=1, le=10)
    # strict: YAML's `true` is no count (it was taken for 1)
    max_in_flight: StrictInt | None = Field(default=None, ge=1, le=1_000)
    rate: float | None = Field(default=None, ge=0.01, le=10_000)
    burst: StrictInt | None = Field(default=None, ge=1, le=10_000)
    call_wait_seconds: float | None = Field(default=None, ge=0, le=10)

    @model_validator(mode="after")
    def _limits(self) -> AgentDeclaration:
        if self.max_in_flight is not None or self.rate is not None or self.burst is not None:
            _call_limits()(max_in_flight=self.max_in_flight, rate=self.rate, burst=self.burst)
        elif self.call_wait_seconds is not None:
            raise ValueError("call_wait_seconds is how long a record waits for the call limits: declare them with it")
        return self

    @property
    def limited(self) -> bool:
        """Whether the agent declares call limits (``max_in_flight`` or ``rate``)."""
        return self.max_in_flight is not None or self.rate is not None

    def call_limits(self) -> Any:
        """The engine's ``CallLimits`` of these declarations (its ``burst_calls`` is the burst in effect), or None
        when the agent declares none."""
        if not self.limited:
            return None
        return _call_limits()(max_in_flight=self.max_in_flight, rate=self.rate, burst=self.burst)

    @model_validator(mode="after")
    def _consistent(self) -> AgentDeclaration:
        if self.kind == "python":
            if self.code_uri is None or self.handler is None:
                raise ValueError(f"agent {self.name}: a python agent needs code_uri and handler")
            if self.base_url is not None or self.auth != "none":
                raise ValueError(f"agent {self.name}: a python agent calls no service: no base_url, no auth")
            for variable, table in self.tables.items():
                if not re.fullmatch(r"[A-Z][A-Z0-9_]*", variable) or not re.fullmatch(r"[A-Z][A-Za-z0-9]*", table):
                    raise ValueError(f"agent {self.name}: tables maps VARIABLE_NAME to a table's LogicalId")
        elif self.base_url is None:
            raise ValueError(f"agent {self.name}: an http agent needs base_url")
        elif self.code_uri is not None or self.handler is not None or self.tables:
            raise ValueError(f"agent {self.name}: code_uri, handler and tables are for python agents")
        elif self.base_url not in ("sample", "parameter") and not (
            self.base_url.startswith("https://") or _LOOPBACK.match(self.base_url)
        ):
            raise ValueError(f"agent {self.name}: base_url must be sample, parameter or an https URL")
        for action in self.actions:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,63}", action):
                raise ValueError(f"agent {self.name}: invalid action name {action!r}")
        if len(set(self.actions)) != len(self.actions):
            raise ValueError(f"agent {self.name}: an action is listed twice")
        if (self.auth == "header") != (self.auth_header is not None and self.auth_secret is not None):
            raise ValueError(f"agent {self.name}: auth header needs auth_header and auth_secret (and only it does)")
        return self

    @property
    def pascal(self) -> str:
        """The name as it starts logical ids: ``flights`` → ``Flights``."""
        return self.name[:1].upper() + self.name[1:]

    @property
    def records_at_once(self) -> int:
        """``AGENT_CONCURRENCY``: ``concurrency``, else 10 for an HTTP agent (its calls wait on the network) and 1
        for a Python agent (your functions need not be thread-safe)."""
        if self.concurrency is not None:
            return self.concurrency
        return 1 if self.kind == "python" else 10

    @property
    def base_url_parameter(self) -> str | None:
        """The template parameter holding the base URL, or None for a fixed URL."""
        return f"{self.pascal}BaseUrl" if self.base_url in ("sample", "parameter") else None

    @property
    def code(self) -> tuple[str, str]:
        """The function's ``CodeUri`` and ``Handler``: the shared HTTP agent's, or the Python agent's own."""
        if self.kind == "python":
            assert self.code_uri is not None and self.handler is not None  # nosec B101 # checked by _consistent
            return self.code_uri, self.handler
        return "functions/agent/", "agent_handler.handler"


_Declaration = TypeVar("_Declaration", bound=BaseModel)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a mapping with a key twice (YAML keeps the last one, silently)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    twice = sorted({str(key) for key in keys if keys.count(key) > 1})
    if twice:
        raise yaml.constructor.ConstructorError(
            None, None, f"{', '.join(twice)} declared twice (the second would replace the first)", node.start_mark
        )
    return dict(yaml.SafeLoader.construct_mapping(loader, node, deep=deep))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_declarations(path: Path, error: type[ValueError]) -> Any:
    """The YAML document of a declarations file (agents.yaml, triggers.yaml), or ``error`` naming the file, the
    line and what is wrong (a syntax error, a key declared twice)."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"{path.name}{where}: not valid YAML: {problem}") from None


def validated_entries(
    path: Path, entries: dict[Any, Any], model: type[_Declaration], error: type[ValueError], what: str
) -> list[_Declaration]:
    """Each entry of a declarations file (name → its fields) as ``model``, in file order; ``error`` names the
    file, the ``what`` (agent, trigger), its name and every field refused."""
    found = []
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise error(f"{path.name}: {what} {name!r} must be a mapping")
        try:
            found.append(model.model_validate({"name": name, **entry}))
        except ValidationError as refused:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or name}: {e['msg']}" for e in refused.errors())
            raise error(f"{path.name}: {what} {name!r}: {problems}") from None
    return found


def load_agents(path: Path = AGENTS_FILE) -> list[AgentDeclaration]:
    """Read ``agents.yaml``: a mapping of agent name to its declaration, in file order.

    Raises
    ------
    AgentsFileError
        When the file is not a mapping, or an entry is invalid (the message names the agent and the field).
    """
    data = read_declarations(path, AgentsFileError)
    if not isinstance(data, dict) or not data:
        raise AgentsFileError(f"{path.name}: expected a mapping of agent name to its declaration")
    return validated_entries(path, data, AgentDeclaration, AgentsFileError, "agent")


# ------------------------------------------------------------------------------------------------ rendering


def _alarm(logical_id: str, description: str, namespace: str, metric: str, dimension: str, value: str) -> str:
    statistic = "Maximum" if namespace == "AWS/SQS" else "Sum"
    # A description that names a CLI command names this stack in it (the command lists what the alarm is about).
    tag = "!Sub " if "${AWS::StackName}" in description else ""
    return f"""\
  {logical_id}:
    Type: AWS::CloudWatch::Alarm
    Properties:
      AlarmDescription: {tag}{json.dumps(description)}
      Namespace: {namespace}
      MetricName: {metric}
      Dimensions:
        - Name: {dimension}
          Value: {value}
      Statistic: {statistic}
      Period: 60
      EvaluationPeriods: 1
      Threshold: 1
      ComparisonOperator: GreaterThanOrEqualToThreshold
      TreatMissingData: notBreaching
      AlarmActions: [!Ref AlarmTopic]
"""


def _base_url(agent: AgentDeclaration) -> str:
    if agent.base_url == "sample":
        sample = (
            '!Sub "https://${SampleServicesApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}'
            f'/sample/{agent.name}"'
        )
        return f"!If [SampleServices, {sample}, !Ref {agent.base_url_parameter}]"
    if agent.base_url == "parameter":
        return f"!Ref {agent.base_url_parameter}"
    return json.dumps(agent.base_url)


_SAMPLE_API_ARN = "arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${SampleServicesApi}"


def _invoke_policy(agent: AgentDeclaration) -> str:
    if agent.auth != "sigv4":
        return ""
    if agent.invoke_arn:
        return f"""\
        - Statement:
            - Sid: InvokeRemoteService
              Effect: Allow
              Action: execute-api:Invoke
              Resource: {json.dumps(agent.invoke_arn)}
"""
    if agent.base_url != "sample":
        return ""
    return f"""\
        - !If
          - SampleServices
          - Statement:
              - Sid: InvokeSampleService
                Effect: Allow
                Action: execute-api:Invoke
                Resource: !Sub "{_SAMPLE_API_ARN}/*/POST/sample/{agent.name}/*"
          - !Ref AWS::NoValue
"""


def _secret_policy(agent: AgentDeclaration) -> str:
    if agent.auth != "header" or agent.auth_secret is None:
        return ""
    source, _, name = agent.auth_secret.partition(":")
    if source == "secretsmanager":
        action = "secretsmanager:GetSecretValue"
        resource = f'!Sub "arn:${{AWS::Partition}}:secretsmanager:${{AWS::Region}}:${{AWS::AccountId}}:secret:{name}*"'
    else:
        action = "ssm:GetParameter"
        resource = (
            f'!Sub "arn:${{AWS::Partition}}:ssm:${{AWS::Region}}:${{AWS::AccountId}}:parameter/{name.lstrip("/")}"'
        )
    return f"""\
        - Statement:
            - Sid: RemoteAuthSecret
              Effect: Allow
              Action: {action}
              Resource: {resource}
"""


def _limits_environment(agent: AgentDeclaration) -> str:
    """MAX_IN_FLIGHT, CALL_RATE, CALL_BURST and CALL_WAIT_SECONDS of an agent that declares them
    (sasflow.call_limits)."""
    values = (
        ("MAX_IN_FLIGHT", agent.max_in_flight),
        ("CALL_RATE", agent.rate),
        ("CALL_BURST", agent.burst),
        ("CALL_WAIT_SECONDS", agent.call_wait_seconds),
    )
    return "".join(f"          {variable}: {value:g}\n" for variable, value in values if value is not None)


def _remote_environment(agent: AgentDeclaration) -> str:
    if agent.kind == "python":
        return "".join(f"          {variable}: !Ref {table}\n" for variable, table in agent.tables.items())
    return f"          REMOTE_BASE_URL: {_base_url(agent)}\n" + _auth_environment(agent)


def _tables_policy(agent: AgentDeclaration) -> str:
    if not agent.tables:
        return ""
    resources = "\n".join(f"                - !GetAtt {table}.Arn" for table in agent.tables.values())
    actions = ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem")
    return (
        "        - Statement:\n"
        "            # its own tables: items read and written one by one or in transactions, never scanned\n"
        "            - Sid: OwnTables\n"
        "              Effect: Allow\n"
        "              Action:\n"
        + "".join(f"                - dynamodb:{action}\n" for action in actions)
        + "              Resource:\n"
        + f"{resources}\n"
    )


def _auth_environment(agent: AgentDeclaration) -> str:
    lines = [f"          REMOTE_AUTH: {agent.auth}"]
    if agent.auth == "header":
        lines.append(f"          REMOTE_AUTH_HEADER: {agent.auth_header}")
        lines.append(f"          REMOTE_AUTH_SECRET: {json.dumps(agent.auth_secret)}")
    return "\n".join(lines) + "\n"


def _reason(text: str) -> str:
    """``text`` as a folded YAML scalar for a checkov skip's ``comment``, wrapped to the template's width."""
    indent = " " * 14
    lines = textwrap.wrap(text, width=120 - len(indent), break_on_hyphens=False)
    return ">-\n" + "\n".join(indent + line for line in lines)


# Why the scanners' findings on every agent's resources are accepted (make security prints each reason).
_SSE_SQS = _reason(
    "Encrypted at rest with SSE-SQS (SqsManagedSseEnabled); CKV_AWS_27 counts only SSE-KMS (KmsMasterKeyId), whose "
    "KMS requests would add a charge for the same protection at rest."
)
_NO_VPC = _reason(
    "It reaches only AWS APIs and its remote service over HTTPS, nothing private; a VPC would need a NAT gateway or "
    "interface endpoints (an hourly cost). Known gap: its egress is not restricted."
)
_ENV_KEY = _reason(
    "Lambda encrypts environment variables at rest with its AWS managed key; they hold names, URLs and ARNs, never a "
    "secret (REMOTE_AUTH_SECRET says where one lives), so a customer managed key would only add a monthly cost."
)
_TRACING = "tracing follows the Tracing parameter (PassThrough by default; Tracing=Active records traces)"


def queue_pair(queue: str, dead_letters: str, function: str, alarm: str, dead_letters_comment: str = "") -> str:
    """A consumed queue and its dead-letter queue (five receives, then there; 4 days and 14 days of retention; SQS
    managed encryption), as every agent and every trigger has them; ``dead_letters_comment`` goes above the
    dead-letter queue."""
    return f"""\
  {queue}:
    Type: AWS::SQS::Queue
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_27
            comment: {_SSE_SQS}
    Properties:
      VisibilityTimeout: 180 # >= 6 x {function} timeout (30 s)
      MessageRetentionPeriod: 345600
      SqsManagedSseEnabled: true
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt {dead_letters}.Arn
        maxReceiveCount: 5

{dead_letters_comment}  {dead_letters}:
    Type: AWS::SQS::Queue
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_27
            comment: {_SSE_SQS}
      cfn-lint:
        config:
          ignore_checks:
            - ES6000 # the end of the line: messages stay 14 days and {alarm} notifies
    Properties:
      MessageRetentionPeriod: 1209600
      SqsManagedSseEnabled: true
"""


def _agent_resources(agent: AgentDeclaration) -> str:
    p, name = agent.pascal, agent.name
    function = f"{p}AgentFunction"
    # its idempotency records, its circuit breaker and, when it declares limits, their shared item
    limits_too = " and call limits" if agent.limited else ""
    leading_keys = json.dumps(
        [f"agent#{name}#*", f"circuit-breaker#{name}"] + ([f"call-limits#{name}"] if agent.limited else [])
    )
    not_async = _reason(
        f"Not invoked asynchronously: its SQS event source returns a failed request to {p}RequestQueue, whose "
        f"RedrivePolicy moves it to {p}DeadLetterQueue after 5 receives."
    )
    return (
        f"""\
  # ---------------------------------------------------------------- agent: {name}
{queue_pair(f"{p}RequestQueue", f"{p}DeadLetterQueue", function, f"{p}DeadLetterAlarm")}
  {function}:
    Type: AWS::Serverless::Function
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_116
            comment: {not_async}
          - id: CKV_AWS_117
            comment: {_NO_VPC}
          - id: CKV_AWS_173
            comment: {_ENV_KEY}
      cfn-lint:
        config:
          ignore_checks:
            - WS1000 # {_TRACING}
            - WS1004 # false positive: LoggingConfig sends its logs to {p}AgentLogGroup, which has RetentionInDays
    Properties:
      Description: {json.dumps(agent.description)}
      CodeUri: {agent.code[0]}
      Handler: {agent.code[1]}
      ReservedConcurrentExecutions: !If [ReserveAgentConcurrency, !Ref AgentReservedConcurrency, !Ref AWS::NoValue]
      Environment:
        Variables:
          AGENT_NAME: {name}
          AGENT_ACTIONS: {",".join(agent.actions)}
          AGENT_CONCURRENCY: {agent.records_at_once}
{_limits_environment(agent)}          IDEMPOTENCY_TABLE: !Ref IdempotencyTable
"""
        + _remote_environment(agent)
        + f"""\
      LoggingConfig:
        LogGroup: !Ref {p}AgentLogGroup
      Policies:
        - Statement:
            # powertools idempotency reads, claims, completes and (when the action raises) deletes its records;
            # the agent may touch only its own records and its own circuit breaker{limits_too}.
            - Sid: OwnIdempotencyAndBreakerRecords
              Effect: Allow
              Action: [dynamodb:GetItem, dynamodb:PutItem, dynamodb:UpdateItem, dynamodb:DeleteItem]
              Resource: !GetAtt IdempotencyTable.Arn
              Condition:
                ForAllValues:StringLike:
                  dynamodb:LeadingKeys: {leading_keys}
            - Sid: Replies
              Effect: Allow
              Action: sqs:SendMessage
              Resource: !GetAtt ResponseQueue.Arn
            - Sid: OwnQueue
              Effect: Allow
              Action: [sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility, sqs:GetQueueAttributes]
              Resource: !GetAtt {p}RequestQueue.Arn
        - !Ref PayloadObjectsAgentPolicy
"""
        + _invoke_policy(agent)
        + _secret_policy(agent)
        + _tables_policy(agent)
        + f"""\

  # Its own event source mapping (not a SAM SQS event, whose managed policy allows every queue): see SchedulerReplies.
  {p}AgentRequests:
    Type: AWS::Lambda::EventSourceMapping
    DependsOn: {function}Role
    Metadata:
      cfn-lint:
        config:
          ignore_checks:
            - ES1001 # SQS sources take no OnFailure destination: the queue's RedrivePolicy moves it to the DLQ
    Properties:
      EventSourceArn: !GetAtt {p}RequestQueue.Arn
      FunctionName: !Ref {function}
      BatchSize: 10
      # Gather requests for up to this window per invocation: fewer receives, deletes, replies and invocations
      # (each billed) for at most the window more per step at low load; the Profile's unless the parameter
      # overrides it (docs/deploy.md, "Latency and cost").
      MaximumBatchingWindowInSeconds: !If
        - AgentWindowFromProfile
        - !FindInMap [BatchingProfiles, !Ref Profile, AgentWindow]
        - !Ref AgentBatchingWindowSeconds
      FunctionResponseTypes: [ReportBatchItemFailures]
      ScalingConfig:
        MaximumConcurrency: !Ref AgentMaximumConcurrency

  {p}AgentLogGroup:
    Type: AWS::Logs::LogGroup
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_158
            comment: CloudWatch Logs encrypts every log group at rest; step inputs and outputs are never logged.
    Properties:
      LogGroupName: !Sub "/sasflow/${{AWS::StackName}}/{function}"
      RetentionInDays: !Ref LogRetentionDays

"""
        + _alarm(
            f"{function}ErrorsAlarm",
            f"{function} invocations failed (its log group has the errors); the steps they left overdue: "
            "sasflow --stack ${AWS::StackName} overdue (docs/operate.md).",
            "AWS/Lambda",
            "Errors",
            "FunctionName",
            f"!Ref {function}",
        )
        + "\n"
        + _alarm(
            f"{function}ThrottlesAlarm",
            f"{function} invocations were throttled (its requests wait in {p}RequestQueue).",
            "AWS/Lambda",
            "Throttles",
            "FunctionName",
            f"!Ref {function}",
        )
        + "\n"
        + _alarm(
            f"{p}DeadLetterAlarm",
            f"Step requests wait in {p}DeadLetterQueue. List them: sasflow --stack ${{AWS::StackName}} dlq list "
            f"{p}DeadLetterQueue; once the cause is fixed, move them back: sasflow --stack ${{AWS::StackName}} dlq "
            f"redrive {p}DeadLetterQueue --reason WHY (docs/operate.md).",
            "AWS/SQS",
            "ApproximateNumberOfMessagesVisible",
            "QueueName",
            f"!GetAtt {p}DeadLetterQueue.QueueName",
        )
    )


def _base_url_description(agent: AgentDeclaration) -> str:
    when = " (used when DeploySampleServices is false)" if agent.base_url == "sample" else ""
    return f"Base URL of the {agent.name} service{when}; https, or http on loopback only."


def render_parts(agents: list[AgentDeclaration], triggers: Sequence[TriggerDeclaration] = ()) -> dict[str, str]:
    """The text of each generated part of ``template.yaml`` (without its markers), by part name: the agents', and
    the triggers' of ``triggers.yaml`` (``devstack.triggers``)."""
    from devstack.triggers import (
        QueueRef,
        bucket_outputs,
        bucket_parameters,
        event_buses,
        sample_parameter,
        slots_policy,
        trigger_outputs,
        trigger_resources,
        upload_buckets,
    )

    parameters = (
        "".join(
            f"""\
  {agent.base_url_parameter}:
    Type: String
    Default: ""
    Description: {json.dumps(_base_url_description(agent))}
"""
            for agent in agents
            if agent.base_url_parameter
        )
        + sample_parameter(list(triggers))
        + bucket_parameters(triggers)
    )
    entries = ",\n          ".join(
        f'"{agent.name}": {{"queue_url": "${{{agent.pascal}RequestQueue}}", '
        f'"actions": {json.dumps(list(agent.actions))}}}'
        for agent in agents
    )
    globals_part = f"""\
        # Each agent's request queue and the actions it accepts (a definition naming another action is refused).
        AGENTS: !Sub >-
          {{{entries}}}
"""
    dead_letter_queues = (
        [QueueRef("ResponseDeadLetterQueue"), QueueRef("BatchDeadLetterQueue")]
        + [QueueRef(f"{agent.pascal}DeadLetterQueue") for agent in agents]
        + [trigger.dead_letters for trigger in triggers]
    )
    dlq_entries = ",\n            ".join(
        f'"{queue.logical_id}": {{"url": "{queue.url_in_sub}", "arn": "{queue.arn_in_sub}"}}'
        for queue in dead_letter_queues
    )
    trigger_entries = ",\n            ".join(
        f'"{trigger.name}": {json.dumps(trigger.route())[:-1]}, "queue_url": "{trigger.source_queue.url_in_sub}"}}'
        for trigger in triggers
    )
    ops_part = f"""\
          # Every dead-letter queue, for the operators' listing and redrive (/ops/dead-letters).
          DEAD_LETTER_QUEUES: !Sub >-
            {{{dlq_entries}}}
          # Every trigger of triggers.yaml, for sasflow triggers list, pause, resume and run-now (/ops/triggers).
          TRIGGERS: !Sub >-
            {{{trigger_entries}}}
"""
    dlq_arns = "\n".join(f"              - {queue.arn_value}" for queue in dead_letter_queues)
    sources = (
        [QueueRef("ResponseQueue"), QueueRef("BatchQueue")]
        + [QueueRef(f"{agent.pascal}RequestQueue") for agent in agents]
        + [trigger.source_queue for trigger in triggers]
    )
    source_arns = "\n".join(f"              - {queue.arn_value}" for queue in sources)
    queues = "\n".join(f"              - !GetAtt {agent.pascal}RequestQueue.Arn" for agent in agents)
    resources = (
        f"""\
  # The API, scheduler and supervisor send step requests to every agent's queue, wait steps' timers to the
  # response queue, and nowhere else.
  AgentRequestQueuesSendPolicy:
    Type: AWS::IAM::ManagedPolicy
    Properties:
      Description: Send step requests to the agents' request queues, and wait timers to the response queue.
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: AgentRequestQueues
            Effect: Allow
            Action: sqs:SendMessage
            Resource:
{queues}
          # A wait step's timer: a message to the scheduler's own queue, delayed until the wait's time.
          - Sid: WaitTimers
            Effect: Allow
            Action: sqs:SendMessage
            Resource: !GetAtt ResponseQueue.Arn

"""
        + slots_policy(triggers)
        + f"""\
  # The operators' function lists dead letters and moves them back to the queues they came from
  # (SQS StartMessageMoveTask: receive and delete on the dead-letter queue, send to the source queue).
  DeadLetterRedrivePolicy:
    Type: AWS::IAM::ManagedPolicy
    Properties:
      Description: List dead-letter queues and redrive them to their source queues (OpsFunction).
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: DeadLetterQueues
            Effect: Allow
            Action:
              - sqs:ReceiveMessage
              - sqs:ChangeMessageVisibility
              - sqs:GetQueueAttributes
              - sqs:DeleteMessage
              - sqs:StartMessageMoveTask
              - sqs:ListMessageMoveTasks
              - sqs:CancelMessageMoveTask
            Resource:
{dlq_arns}
          - Sid: SourceQueues
            Effect: Allow
            Action: sqs:SendMessage
            Resource:
{source_arns}

"""
        + "\n".join(_agent_resources(agent) for agent in agents)
        + "".join("\n" + trigger_resources(trigger) for trigger in triggers)
        + ("\n" + event_buses(triggers) if any(t.kind == "event" and t.bus for t in triggers) else "")
        + ("\n" + upload_buckets(triggers) if any(t.kind == "s3" for t in triggers) else "")
    )
    dead_letters = "\n".join(f"        - {queue.url_value}" for queue in dead_letter_queues[1:])
    outputs = (
        "".join(
            f"""\
  {agent.pascal}RequestQueueUrl:
    Value: !Ref {agent.pascal}RequestQueue
"""
            for agent in agents
        )
        + "".join(trigger_outputs(trigger) for trigger in triggers)
        + bucket_outputs(triggers)
        + f"""\
  DeadLetterQueueUrls:
    Description: Every dead-letter queue of the stack, comma-separated.
    Value: !Join
      - ","
      - - !Ref ResponseDeadLetterQueue
{dead_letters}
"""
    )
    return {
        "parameters": parameters,
        "globals": globals_part,
        "ops": ops_part,
        "resources": resources,
        "outputs": outputs,
    }


def _marker_re(part: str) -> re.Pattern[str]:
    return re.compile(
        rf"(?P<open>^[ \t]*# >>> agents:{part}\b[^\n]*\n)(?P<body>.*?)(?P<close>^[ \t]*# <<< agents:{part}\b[^\n]*$)",
        re.MULTILINE | re.DOTALL,
    )


def _replacer(body: str) -> Any:
    def replace(match: re.Match[str]) -> str:
        return match.group("open") + body + match.group("close")

    return replace


def render_template(
    template_text: str, agents: list[AgentDeclaration], triggers: Sequence[TriggerDeclaration] = ()
) -> str:
    """Return ``template_text`` with every generated part replaced by the one ``agents`` and ``triggers`` give.

    Raises
    ------
    AgentsFileError
        When a part's pair of markers is missing or appears twice.
    """
    parts = render_parts(agents, triggers)
    text = template_text
    for part in PARTS:
        pattern = _marker_re(part)
        found = pattern.findall(text)
        if len(found) != 1:
            raise AgentsFileError(f"template.yaml needs one '# >>> agents:{part}' ... '# <<< agents:{part}' pair")
        text = pattern.sub(_replacer(parts[part]), text)
    _check_bucket_names(template_text, triggers, parts["resources"])
    return text


def _check_bucket_names(template_text: str, triggers: Sequence[TriggerDeclaration], generated: str = "") -> None:
    """Refuse an s3 trigger whose bucket names a resource the template has outside its generated parts (found by
    a trial: ``bucket: PayloadBucket`` rendered the engine's claim-check bucket a second time, versioned and
    notifying, and ``make template`` said nothing).

    Raises
    ------
    AgentsFileError
        Naming the trigger, the resource and what to do.
    """
    from devstack.triggers import TriggersFileError

    outside = _marker_re("parameters").sub("", _marker_re("resources").sub("", template_text))
    for trigger in triggers:
        bucket = trigger.created_bucket
        for logical_id in (bucket, f"{bucket}Policy") if bucket else ():
            if re.search(rf"^  {re.escape(logical_id)}:\s*$", outside, re.MULTILINE):
                raise TriggersFileError(
                    f"trigger {trigger.name}: bucket {bucket}: template.yaml already has a resource "
                    f"{logical_id} of its own; an s3 trigger creates its bucket: give it a logical id of its own"
                )
        parameter = trigger.bucket_parameter
        # the template's own parameters and resources, and those agents.yaml and triggers.yaml give it (found by a
        # trial: TripUploadsTriggerQueue was taken, and only cfn-lint said so)
        if parameter and re.search(rf"^  {re.escape(parameter)}:\s*$", outside + generated, re.MULTILINE):
            raise TriggersFileError(
                f"trigger {trigger.name}: bucket parameter {parameter}: template.yaml already has a parameter or "
                "resource of that name; give the bucket's parameter a name of its own"
            )


@dataclass(frozen=True)
class TemplateCheck:
    """Whether ``template.yaml`` holds the parts ``agents.yaml`` gives: ``current`` and the text it should have."""

    current: bool
    expected: str


def check_template(template: Path = TEMPLATE_FILE, agents_file: Path = AGENTS_FILE) -> TemplateCheck:
    """Compare ``template`` with what ``agents_file`` and the ``triggers.yaml`` beside it render, without writing."""
    from devstack.triggers import load_triggers, triggers_file

    text = template.read_text(encoding="utf-8")
    expected = render_template(text, load_agents(agents_file), load_triggers(triggers_file(agents_file)))
    return TemplateCheck(current=expected == text, expected=expected)


def write_template(template: Path = TEMPLATE_FILE, agents_file: Path = AGENTS_FILE) -> bool:
    """Render the generated parts into ``template``; return True when the file changed."""
    check = check_template(template, agents_file)
    if not check.current:
        template.write_text(check.expected, encoding="utf-8")
    return not check.current


def agent_names(agents_file: Path = AGENTS_FILE) -> list[str]:
    """The agents' names, in declaration order (for the demo, the tests and the alarms)."""
    return [agent.name for agent in load_agents(agents_file)]


def parameters_for_base_urls(base_urls: dict[str, str], agents_file: Path = AGENTS_FILE) -> dict[str, Any]:
    """The template parameters that point each agent with a base-URL parameter at ``base_urls[agent]``."""
    return {
        agent.base_url_parameter: base_urls[agent.name]
        for agent in load_agents(agents_file)
        if agent.base_url_parameter and agent.name in base_urls
    }

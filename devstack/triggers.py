"""The triggers of a deployment, declared once in ``triggers.yaml`` beside ``agents.yaml``, and the resources of
``template.yaml`` made from them (rendered with the agents' parts by ``python -m devstack template``).

A trigger starts workflows of one registered definition (``sasflow.triggers``). Its occurrences land in a queue of
the trigger's own, read by the trigger's own function under its own role, which starts workflows as the principal
``trigger:<name>`` (so ownership, the listing and the history say which trigger started what):

- ``schedule``: an EventBridge Scheduler schedule (cron, rate or at; a time zone; start and end dates; flexible time
  window off) whose target is the queue, with a retry policy and the trigger's dead-letter queue, and a role that may
  send to those two queues only.
- ``event``: an EventBridge rule on a bus (the account's default bus, or one the template creates, named
  ``<stack>-<bus>``, one per name) whose pattern picks the events; its target is the queue (the event as it is),
  with a retry policy and the trigger's dead-letter queue, and the two queues' policy lets that rule alone send
  (``aws:SourceArn``).
- ``sqs``: the trigger's queue is the source: whatever sends a message to it starts a workflow (one per message id);
  its event source mapping reads ``batch_size`` messages at a time.
- ``s3``: a bucket the template creates (``bucket``: its logical id; named from the stack's id, versioned, encrypted,
  private, TLS only) sends an event notification of every upload whose key has the trigger's ``prefix`` and
  ``suffix`` to the trigger's queue, whose policy lets that bucket alone send (``aws:SourceArn``, and the account).
  One bucket may serve several triggers, with keys S3 can tell apart (filters that do not overlap).

Removing a trigger from the file removes all of it from the template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jmespath
from pydantic import BaseModel, ConfigDict, Field, model_validator

from devstack.agents import (
    _ENV_KEY,
    _NO_VPC,
    _TRACING,
    AgentsFileError,
    _alarm,
    queue_pair,
    read_declarations,
    validated_entries,
)

_NAME: Final = r"^[a-z][a-z0-9-]*$"
_SCHEDULE: Final = re.compile(
    r"^(cron\([^()]+\)|rate\([1-9]\d* (minute|minutes|hour|hours|day|days)\)|at\(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\))$"
)
#: EventBridge Scheduler retries a target for up to 24 hours (MaximumEventAgeInSeconds 60..86400) and 185 times.
_MAX_EVENT_AGE: Final = 86_400
_MAX_RETRIES: Final = 185
_DURATION: Final = re.compile(r"^(?P<n>[1-9]\d*)(?P<unit>[smhd])$")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
#: The longest catch-up window: the trigger queue's retention (4 days) keeps a tick no longer anyway.
_MAX_CATCH_UP: Final = 345_600


def catch_up_seconds(window: str) -> int | None:
    """``all`` → None (however late), ``none`` → 0, ``90s``, ``15m``, ``2h``, ``1d`` → seconds.

    Raises
    ------
    ValueError
        When it is none of these, or longer than the queue keeps a tick (4 days).
    """
    if window == "all":
        return None
    if window == "none":
        return 0
    match = _DURATION.match(window)
    if match is None:
        raise ValueError(f"catch_up_window {window!r}: all, none, or a duration (90s, 15m, 2h, 1d)")
    seconds = int(match["n"]) * _UNIT_SECONDS[match["unit"]]
    if seconds > _MAX_CATCH_UP:
        raise ValueError(f"catch_up_window {window!r}: at most 4d (the trigger's queue keeps a tick 4 days)")
    return seconds


#: The parameter that turns the sample triggers (``sample: true``) on; off by default in a deployment.
SAMPLE_TRIGGERS_PARAMETER: Final = "SampleTriggersState"
#: The principal a trigger starts its workflows as (never an IAM ARN nor ``jwt:``: no caller of the API can be it).
PRINCIPAL_PREFIX: Final = "trigger:"


#: An existing queue's ARN: literal, or with CloudFormation's pseudo parameters for its partition, region and account
#: (``arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders``), so one file serves every account.
_QUEUE_ARN: Final = (
    r"^arn:(?P<partition>aws|aws-cn|aws-us-gov|\$\{AWS::Partition\}):sqs:"
    r"(?P<region>[a-z]{2}(-[a-z]+)+-\d|\$\{AWS::Region\}):(?P<account>\d{12}|\$\{AWS::AccountId\}):"
    r"(?P<name>[A-Za-z0-9_-]{1,80}(\.fifo)?)$"
)


@dataclass(frozen=True)
class QueueRef:
    """A queue a trigger reads or sends to, as the template names it: one the template creates (``logical_id``), or
    an existing one (``arn``, from ``triggers.yaml``), named under the logical id it would have had."""

    logical_id: str
    arn: str | None = None

    @property
    def arn_value(self) -> str:
        """Its ARN as a YAML value (a policy's Resource, a mapping's EventSourceArn)."""
        if self.arn is None:
            return f"!GetAtt {self.logical_id}.Arn"
        return f"!Sub {json.dumps(self.arn)}" if "${" in self.arn else json.dumps(self.arn)

    @property
    def url_value(self) -> str:
        """Its URL as a YAML value (an output)."""
        return f"!Ref {self.logical_id}" if self.arn is None else f"!Sub {json.dumps(self.url_in_sub)}"

    @property
    def name_value(self) -> str:
        """Its name as a YAML value (an alarm's QueueName dimension)."""
        return f"!GetAtt {self.logical_id}.QueueName" if self.arn is None else self.name

    @property
    def arn_in_sub(self) -> str:
        """Its ARN inside a ``!Sub`` string."""
        return f"${{{self.logical_id}.Arn}}" if self.arn is None else self.arn

    @property
    def url_in_sub(self) -> str:
        """Its URL inside a ``!Sub`` string: an existing queue's, from its ARN as SQS forms it
        (``https://sqs.<region>.<domain>/<account>/<name>``)."""
        if self.arn is None:
            return f"${{{self.logical_id}}}"
        match = re.match(_QUEUE_ARN, self.arn)
        assert match is not None  # a declaration's ARN was checked by the same pattern
        return f"https://sqs.{match['region']}.${{AWS::URLSuffix}}/{match['account']}/{match['name']}"

    @property
    def title(self) -> str:
        """What an alarm's text calls it: the logical id of a queue the template creates, an existing one's name."""
        return self.logical_id if self.arn is None else self.name

    @property
    def name(self) -> str:
        """An existing queue's name (the last part of its ARN)."""
        return (self.arn or "").rsplit(":", 1)[-1]


class BucketParameter(BaseModel):
    """``bucket: {parameter: IncomingBucketName}``: a bucket that exists already, named at deployment by that
    template parameter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameter: str = Field(pattern=r"^[A-Z][A-Za-z0-9]{0,254}$")


class TriggersFileError(AgentsFileError):
    """``triggers.yaml`` is malformed (the message names the trigger and the field)."""


class TriggerDeclaration(BaseModel):
    """One entry of ``triggers.yaml`` (the comments at the top of that file describe each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, max_length=40)
    kind: Literal["schedule", "event", "sqs", "s3"]
    definition: str = Field(min_length=1, max_length=64)
    version: int | None = Field(default=None, ge=1)
    description: str = Field(default="", max_length=200)
    input: dict[str, Any] | str | None = None
    sample: bool = False
    expression: str | None = None
    bus: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,39}$")
    pattern: dict[str, Any] | None = None
    timezone: str = Field(default="UTC", pattern=r"^[A-Za-z_]+(/[A-Za-z0-9_+-]+)*$")
    start_date: str | None = Field(default=None, pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)?$")
    end_date: str | None = Field(default=None, pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)?$")
    catch_up_window: str = "all"
    overlap: Literal["allow", "skip", "buffer_one"] = "allow"
    batch_size: int = Field(default=10, ge=1, le=10)
    queue: str | None = None
    dead_letter_queue: str | None = None
    bucket: str | BucketParameter | None = None
    prefix: str = Field(default="", max_length=1024)
    suffix: str = Field(default="", max_length=1024)

    @model_validator(mode="after")
    def _consistent(self) -> TriggerDeclaration:
        if self.kind == "event":
            return self._event()
        if self.kind == "sqs":
            return self._queue()
        if self.kind == "s3":
            return self._uploads()
        self._no_queue_nor_upload_fields()
        if self.bus is not None or self.pattern is not None:
            raise ValueError("bus and pattern: an event trigger's (kind: event); a schedule has an expression")
        if self.expression is None:
            raise ValueError("expression: a schedule needs one (cron(...), rate(...) or at(...))")
        if not _SCHEDULE.match(self.expression):
            raise ValueError(
                "expression: cron(minutes hours day-of-month month day-of-week year), rate(N minute|minutes|hour|"
                "hours|day|days) or at(yyyy-mm-ddThh:mm:ss)"
            )
        cron = re.fullmatch(r"cron\((.+)\)", self.expression)
        if cron is not None:
            fields = cron[1].split()
            if len(fields) != 6:
                raise ValueError(
                    "expression: cron( ) takes 6 fields: minutes hours day-of-month month day-of-week year"
                )
            if (fields[2] == "?") == (fields[4] == "?"):
                raise ValueError("expression: one of day-of-month and day-of-week must be '?' (EventBridge's cron)")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone: {self.timezone!r} is not an IANA time zone (e.g. UTC, Europe/Paris)") from None
        if self.start_date and self.end_date and _instant(self.end_date) <= _instant(self.start_date):
            raise ValueError("end_date: it must come after start_date")
        catch_up_seconds(self.catch_up_window)
        _check_expressions(self.input)
        return self

    def _event(self) -> TriggerDeclaration:
        """An event trigger: a pattern (checked as EventBridge checks one), a bus, and none of a schedule's fields."""
        schedule_only = {"expression", "timezone", "start_date", "end_date", "catch_up_window", "overlap"}
        given = sorted(schedule_only & self.model_fields_set)
        if given:
            raise ValueError(f"{', '.join(given)}: a schedule's; an event trigger starts one workflow per event")
        self._no_queue_nor_upload_fields()
        if not self.pattern:
            raise ValueError("pattern: an event trigger needs an EventBridge event pattern (e.g. source: [my.app])")
        check_pattern(self.pattern)
        _check_expressions(self.input)
        return self

    def _no_queue_nor_upload_fields(self) -> None:
        """Refuse an sqs or s3 trigger's fields on a schedule or an event trigger."""
        if "batch_size" in self.model_fields_set:
            raise ValueError("batch_size: an sqs or s3 trigger's (the messages its function reads at a time)")
        queue_only = sorted({"queue", "dead_letter_queue"} & self.model_fields_set)
        if queue_only:
            raise ValueError(f"{', '.join(queue_only)}: an sqs trigger's (kind: sqs)")
        upload_only = sorted({"bucket", "prefix", "suffix"} & self.model_fields_set)
        if upload_only:
            raise ValueError(f"{', '.join(upload_only)}: an s3 trigger's (kind: s3)")

    def _queue(self) -> TriggerDeclaration:
        """An sqs trigger: its queue is its source (one the template creates, or an existing one with its dead-letter
        queue), so none of a schedule's, an event's or an upload's fields."""
        self._only_its_own(
            "an sqs trigger starts one per message", "what is sent to its queue", {"bucket", "prefix", "suffix"}
        )
        for field, arn in (("queue", self.queue), ("dead_letter_queue", self.dead_letter_queue)):
            if arn is not None and not re.match(_QUEUE_ARN, arn):
                raise ValueError(
                    f"{field}: {arn!r} is not an SQS queue's ARN: arn:aws:sqs:<region>:<account>:<name>, the region "
                    "and account written or as ${AWS::Region} and ${AWS::AccountId} (a queue URL is not one)"
                )
        if (self.queue is None) != (self.dead_letter_queue is None):
            raise ValueError(
                "queue and dead_letter_queue: an existing queue needs both (its ARN and the ARN of the dead-letter "
                "queue its RedrivePolicy moves failed messages to, where refused messages go too); omit both and "
                "the template creates the pair"
            )
        if (self.queue or "").endswith(".fifo") or (self.dead_letter_queue or "").endswith(".fifo"):
            raise ValueError(
                "queue: a FIFO queue cannot hold a message while the trigger is paused (SQS refuses a message's own "
                "delay there), and a standard queue's dead-letter queue is standard too; use standard queues"
            )
        if self.queue is not None and self.queue == self.dead_letter_queue:
            raise ValueError("dead_letter_queue: another queue than queue (where its failed messages go)")
        return self

    def _uploads(self) -> TriggerDeclaration:
        """An s3 trigger: a bucket of the template, and the keys (prefix, suffix) whose uploads start workflows."""
        for field, value in (("prefix", self.prefix), ("suffix", self.suffix)):
            if "*" in value:
                raise ValueError(
                    f"{field}: {value!r}: S3 matches a key's {field} as it is, with no wildcard (a '*' would have to "
                    f"be in the key); write the {field} alone, e.g. prefix: requests/ and suffix: .json"
                )
            if "${" in value:
                raise ValueError(f"{field}: {value!r}: '${{' is not allowed (the function's configuration is a !Sub)")
        self._only_its_own(
            "an s3 trigger starts one per upload", "what is uploaded to its bucket", {"queue", "dead_letter_queue"}
        )
        if self.bucket is None:
            raise ValueError(
                "bucket: an s3 trigger needs the logical id of the bucket the template creates for it, or "
                "{parameter: Name} for a bucket that exists already"
            )
        if isinstance(self.bucket, str) and not re.fullmatch(r"[A-Z][A-Za-z0-9]{0,25}", self.bucket):
            raise ValueError(
                f"bucket: {self.bucket!r} is not a logical id for the bucket the template creates: a capital letter, "
                "then letters and digits, at most 26 in all (its name is the stack id's UUID, '-' and the id in lower "
                "case: at most 63 characters); or {parameter: Name} for a bucket that exists already"
            )
        return self

    def _only_its_own(self, what: str, starts: str, others: set[str]) -> None:
        """Refuse a schedule's and an event's fields (and ``others``) and ``sample`` on a queue's or a bucket's
        trigger, and check its input's expressions."""
        others |= {"expression", "timezone", "start_date", "end_date", "catch_up_window", "overlap", "bus", "pattern"}
        given = sorted(others & self.model_fields_set)
        if given:
            raise ValueError(f"{', '.join(given)}: another kind's; {what}")
        if self.sample:
            raise ValueError(
                f"sample: turns a schedule or an event rule on with SampleTriggersState; an {self.kind} trigger starts "
                f"only {starts}"
            )
        _check_expressions(self.input)

    @property
    def state(self) -> str:
        """Its source's ``State``: a sample's follows the sample parameter (off in a deployment), any other's ticks."""
        return f"!Ref {SAMPLE_TRIGGERS_PARAMETER}" if self.sample else "ENABLED"

    @property
    def bus_name(self) -> str:
        """The bus its rule is on: ``default``, or a name the template creates (``bus``)."""
        return self.bus or "default"

    @property
    def pascal(self) -> str:
        """The name as it starts logical ids: ``nightly-report`` → ``NightlyReport``."""
        return "".join(part[:1].upper() + part[1:] for part in self.name.split("-"))

    @property
    def source_queue(self) -> QueueRef:
        """The queue its function reads: its own, or the existing one it names (``queue``)."""
        return QueueRef(f"{self.pascal}TriggerQueue", self.queue)

    @property
    def dead_letters(self) -> QueueRef:
        """Where its refused and failed occurrences go: its own, or the existing one it names."""
        return QueueRef(f"{self.pascal}TriggerDeadLetterQueue", self.dead_letter_queue)

    @property
    def created_bucket(self) -> str | None:
        """The logical id of the bucket the template creates for it (an s3 trigger's, unless it names a parameter)."""
        return self.bucket if isinstance(self.bucket, str) else None

    @property
    def bucket_parameter(self) -> str | None:
        """The template parameter that names the existing bucket it watches (``bucket: {parameter: ...}``)."""
        return self.bucket.parameter if isinstance(self.bucket, BucketParameter) else None

    @property
    def bucket_id(self) -> str:
        """What ``!Ref`` names its bucket by: the created bucket's logical id, or the parameter (both give its
        name)."""
        return self.created_bucket or self.bucket_parameter or ""

    @property
    def principal(self) -> str:
        """Who its workflows belong to."""
        return f"{PRINCIPAL_PREFIX}{self.name}"

    def route(self) -> dict[str, Any]:
        """The trigger in the operators' ``TRIGGERS`` (``sasflow.settings.TriggerRoute``), without its queue URL."""
        if self.kind == "event":
            source = f"bus {self.bus_name}: {json.dumps(self.pattern, separators=(',', ':'))}"
        elif self.kind == "sqs":
            source = f"queue {self.source_queue.url_in_sub}, batch {self.batch_size}"
        elif self.kind == "s3":
            source = f"bucket ${{{self.bucket_id}}}, keys {self.prefix}*{self.suffix}, batch {self.batch_size}"
        else:
            source = f"{self.expression} {self.timezone}, catch-up {self.catch_up_window}, overlap {self.overlap}"
        return {"principal": self.principal, "kind": self.kind, "definition": self.definition, "source": source}

    def config(self) -> dict[str, Any]:
        """The trigger function's ``TRIGGER`` configuration (``sasflow.triggers.TriggerConfig``), without its
        queues' URLs, which the template fills in."""
        document: dict[str, Any] = {"name": self.name, "kind": self.kind, "definition": self.definition}
        if self.version is not None:
            document["version"] = self.version
        if self.input is not None:
            document["input"] = self.input
        window = catch_up_seconds(self.catch_up_window) if self.kind == "schedule" else None
        if window is not None:
            document["catch_up_seconds"] = window
        if self.overlap != "allow":
            document["overlap"] = self.overlap
        if self.kind == "s3":  # the function refuses a notification of another bucket, or of keys it does not watch
            document["bucket"] = f"${{{self.bucket_id}}}"
            document.update({key: value for key, value in (("prefix", self.prefix), ("suffix", self.suffix)) if value})
        return document


def _instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _check_expressions(template: Any, where: str = "input") -> None:
    """Compile every JMESPath expression of an input template (``"key.$"`` values, or one expression), so a typo
    is refused by ``make template``, not by every tick."""
    if isinstance(template, str):
        expressions: list[tuple[str, Any]] = [(where, template)]
    elif isinstance(template, dict):
        expressions = []
        for key, value in template.items():
            if key.endswith(".$"):
                text = value.get("expression") if isinstance(value, dict) else value
                expressions.append((f"{where}.{key}", text))
            elif isinstance(value, dict):
                _check_expressions(value, f"{where}.{key}")
    else:
        return
    for place, text in expressions:
        if not isinstance(text, str):
            raise ValueError(f"{place}: a JMESPath expression (text)")
        try:
            jmespath.compile(text)
        except jmespath.exceptions.ParseError as exc:
            raise ValueError(f"{place}: {text!r} is not a JMESPath expression: {exc}") from None


def triggers_file(agents_file: Path) -> Path:
    """Where the triggers of the deployment whose agents are in ``agents_file`` are declared: beside it."""
    return agents_file.parent / "triggers.yaml"


def load_triggers(path: Path) -> list[TriggerDeclaration]:
    """Read ``triggers.yaml``: its ``triggers``, a mapping of name to declaration, in file order. A missing file
    declares none.

    Raises
    ------
    TriggersFileError
        When the file is malformed or an entry is invalid.
    """
    if not path.exists():
        return []
    data = read_declarations(path, TriggersFileError) or {}
    if not isinstance(data, dict) or set(data) - {"triggers"}:
        raise TriggersFileError(f"{path.name}: expected a mapping with triggers")
    entries = data.get("triggers") or {}
    if not isinstance(entries, dict):
        raise TriggersFileError(f"{path.name}: triggers must be a mapping of name to declaration")
    triggers = validated_entries(path, entries, TriggerDeclaration, TriggersFileError, "trigger")
    check_buckets(triggers)
    check_queues(triggers)
    return triggers


# ------------------------------------------------------------------------------------------------ rendering


def _event_age(trigger: TriggerDeclaration) -> int:
    """How long EventBridge Scheduler retries a tick it cannot deliver: its catch-up window (at least a minute, at
    most the service's 24 hours); a later tick would be missed anyway."""
    window = catch_up_seconds(trigger.catch_up_window)
    return _MAX_EVENT_AGE if window is None else min(_MAX_EVENT_AGE, max(60, window))


def _schedule(trigger: TriggerDeclaration) -> str:
    p = trigger.pascal
    dates = "".join(
        f"      {key}: {json.dumps(value)}\n"
        for key, value in (("StartDate", trigger.start_date), ("EndDate", trigger.end_date))
        if value
    )
    state = trigger.state
    description = f"Ticks of trigger {trigger.name}: {trigger.expression} ({trigger.timezone})"
    return f"""\
  {p}Schedule:
    Type: AWS::Scheduler::Schedule
    Properties:
      Description: {json.dumps(description)}
      ScheduleExpression: {json.dumps(trigger.expression)}
      ScheduleExpressionTimezone: {trigger.timezone}
{dates}      FlexibleTimeWindow:
        Mode: "OFF"
      State: {state}
      Target:
        Arn: !GetAtt {p}TriggerQueue.Arn
        RoleArn: !GetAtt {p}ScheduleRole.Arn
        # The tick's time, from which the trigger derives its Idempotency-Key (a retried tick starts nothing new).
        Input: '{{"scheduled_time": "<aws.scheduler.scheduled-time>"}}'
        RetryPolicy:
          MaximumEventAgeInSeconds: {_event_age(trigger)}
          MaximumRetryAttempts: {_MAX_RETRIES}
        DeadLetterConfig:
          Arn: !GetAtt {p}TriggerDeadLetterQueue.Arn

  # EventBridge Scheduler sends the ticks as this role: to the trigger's queue, and to its dead-letter queue.
  {p}ScheduleRole:
    Type: AWS::IAM::Role
    Properties:
      AssumeRolePolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Effect: Allow
            Principal:
              Service: scheduler.amazonaws.com
            Action: sts:AssumeRole
            Condition:
              StringEquals:
                aws:SourceAccount: !Ref AWS::AccountId
      Policies:
        - PolicyName: SendTicks
          PolicyDocument:
            Version: "2012-10-17"
            Statement:
              - Effect: Allow
                Action: sqs:SendMessage
                Resource:
                  - !GetAtt {p}TriggerQueue.Arn
                  - !GetAtt {p}TriggerDeadLetterQueue.Arn

"""


def _waiting_tick(trigger: TriggerDeclaration) -> str:
    """``buffer_one``: the trigger sends the tick kept waiting to its own queue again when its message was lost; an
    sqs trigger sends a message back to its queue while it is paused."""
    if trigger.kind in ("sqs", "s3"):
        return f"""\
            # While it is paused, a message goes back to its queue to wait (its occurrence kept).
            - Sid: HeldMessages
              Effect: Allow
              Action: sqs:SendMessage
              Resource: {trigger.source_queue.arn_value}
"""
    if trigger.overlap != "buffer_one":
        return ""
    return f"""\
            # buffer_one: a waiting tick whose message was lost is sent to its queue again.
            - Sid: WaitingTick
              Effect: Allow
              Action: sqs:SendMessage
              Resource: !GetAtt {trigger.pascal}TriggerQueue.Arn
"""


def slots_policy(triggers: Sequence[TriggerDeclaration]) -> str:
    """``TriggerSlotsPolicy``: the engine's functions (API, operators, scheduler, supervisor) end workflows, and a
    run that holds its trigger's slot gives it back when it ends (``overlap``), sending the tick waiting for it."""
    queues = "".join(
        f"              - !GetAtt {trigger.pascal}TriggerQueue.Arn\n"
        for trigger in triggers
        if trigger.overlap == "buffer_one"
    )
    waiting = (
        f"""\
          # buffer_one: the tick waiting for the slot goes to its trigger's queue.
          - Sid: WaitingTicks
            Effect: Allow
            Action: sqs:SendMessage
            Resource:
{queues}"""
        if queues
        else ""
    )
    return f"""\
  # A run that holds its trigger's slot (overlap skip or buffer_one) gives it back when it ends, in whichever of the
  # engine's functions ended it.
  TriggerSlotsPolicy:
    Type: AWS::IAM::ManagedPolicy
    Properties:
      Description: Give back a trigger's slot when the run that holds it ends, and send the tick waiting for it.
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: TriggerSlots
            Effect: Allow
            Action: dynamodb:UpdateItem
            Resource: !GetAtt StateTable.Arn
            Condition:
              ForAllValues:StringLike:
                dynamodb:LeadingKeys: ["TRIGGER#*"]
{waiting}
"""


def trigger_resources(trigger: TriggerDeclaration) -> str:
    """The template text of one trigger: its queues, source, function, event source mapping, log group, alarms."""
    p, name = trigger.pascal, trigger.name
    function = f"{p}TriggerFunction"
    description = trigger.description or f"Starts {trigger.definition} workflows: trigger {name} ({trigger.kind})."
    config = json.dumps(trigger.config(), separators=(", ", ": "))[:-1]
    if trigger.overlap == "buffer_one" or trigger.kind in ("sqs", "s3"):
        config += f', "queue_url": "{trigger.source_queue.url_in_sub}"'
    config += f', "dead_letter_url": "{trigger.dead_letters.url_in_sub}"}}'
    config = config.replace("'", "''")
    sender = {
        "schedule": " and ticks that\n  # EventBridge Scheduler could not deliver",
        "event": " and events that\n  # its rule could not deliver",
        "sqs": "",
        "s3": "",
    }[trigger.kind]
    dlq_comment = (
        f"  # Occurrences refused with their reason (sasflow dlq list), those that failed five times{sender}.\n"
    )
    source = {"schedule": _schedule, "event": _event_rule, "sqs": _queue_source, "s3": _upload_source}[trigger.kind](
        trigger
    )
    queues = (
        ""
        if trigger.queue is not None  # an existing queue and its dead-letter queue: the template names them only
        else queue_pair(
            f"{p}TriggerQueue", f"{p}TriggerDeadLetterQueue", function, f"{p}TriggerDeadLetterAlarm", dlq_comment
        )
        + "\n"
    )
    return (
        f"""\
  # ---------------------------------------------------------------- trigger: {name} ({trigger.kind})
{queues}{source}  {function}:
    Type: AWS::Serverless::Function
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_115
            comment: Its event source mapping's MaximumConcurrency bounds it; reserved concurrency takes from the pool.
          - id: CKV_AWS_116
            comment: Not invoked asynchronously; a failed occurrence returns to its queue, then its dead-letter queue.
          - id: CKV_AWS_117
            comment: {_NO_VPC}
          - id: CKV_AWS_173
            comment: {_ENV_KEY}
      cfn-lint:
        config:
          ignore_checks:
            - WS1000 # {_TRACING}
            - WS1004 # false positive: LoggingConfig sends its logs to {p}TriggerLogGroup, which has RetentionInDays
    Properties:
      Description: {json.dumps(description)}
      CodeUri: functions/trigger/
      Handler: trigger_handler.handler
      Environment:
        Variables:
          TRIGGER: !Sub '{config}'
          # Its workflows belong to this principal (no caller of the API can be it).
          TRIGGER_PRINCIPAL: {trigger.principal}
          WORKFLOW_ID_SECRET: !Ref WorkflowIdSecret
      LoggingConfig:
        LogGroup: !Ref {p}TriggerLogGroup
      Policies:
        - Statement:
            # A start is a conditional PutItem (a repeat reads the workflow it finds); the definitions it resolves.
            - Sid: WorkflowItems
              Effect: Allow
              Action: [dynamodb:GetItem, dynamodb:PutItem]
              Resource: !GetAtt StateTable.Arn
            # Its own item: a tick skipped while an operator paused it is counted there.
            - Sid: OwnTriggerItem
              Effect: Allow
              Action: dynamodb:UpdateItem
              Resource: !GetAtt StateTable.Arn
              Condition:
                ForAllValues:StringEquals:
                  dynamodb:LeadingKeys: ["TRIGGER#{name}"]
            - Sid: RegisteredDefinitions
              Effect: Allow
              Action: dynamodb:Query
              Resource: !GetAtt StateTable.Arn
              Condition:
                ForAllValues:StringLike:
                  dynamodb:LeadingKeys: ["DEFNAME#*"]
            - Sid: Occurrences
              Effect: Allow
              Action: [sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility, sqs:GetQueueAttributes]
              Resource: {trigger.source_queue.arn_value}
            # A refused occurrence goes to its dead-letter queue with its reason.
            - Sid: RefusedOccurrences
              Effect: Allow
              Action: sqs:SendMessage
              Resource: {trigger.dead_letters.arn_value}
{_waiting_tick(trigger)}\
            # Its workflows' ids derive from the occurrence under this key (scheduler.workflow_id_for).
            - Sid: WorkflowIdKey
              Effect: Allow
              Action: [secretsmanager:GetSecretValue]
              Resource: !Ref WorkflowIdSecret
        # The first steps' requests; a claim-checked input (written, never listed: it ends no workflow); the slot of
        # its workflow's tenant (a definition with tenancy).
        - !Ref AgentRequestQueuesSendPolicy
        - !Ref PayloadObjectsAgentPolicy
        - !Ref TenantSlotsPolicy

  # Its own event source mapping (not a SAM SQS event, whose managed policy allows every queue).
  {p}TriggerOccurrences:
    Type: AWS::Lambda::EventSourceMapping
    DependsOn: {function}Role
    Metadata:
{_stand_in(trigger)}      cfn-lint:
        config:
          ignore_checks:
            - ES1001 # SQS sources take no OnFailure destination: the queue's RedrivePolicy moves it to the DLQ
    Properties:
      EventSourceArn: {trigger.source_queue.arn_value}
      FunctionName: !Ref {function}
      BatchSize: {trigger.batch_size}
      # It gathers occurrences as an agent's mapping gathers requests (the Profile, or AgentBatchingWindowSeconds): a
      # start may wait that long, and a burst of them shares receives, deletes and invocations.
      MaximumBatchingWindowInSeconds: !If
        - AgentWindowFromProfile
        - !FindInMap [BatchingProfiles, !Ref Profile, AgentWindow]
        - !Ref AgentBatchingWindowSeconds
      FunctionResponseTypes: [ReportBatchItemFailures]
      ScalingConfig:
        MaximumConcurrency: 2

  {p}TriggerLogGroup:
    Type: AWS::Logs::LogGroup
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_158
            comment: CloudWatch Logs encrypts every log group at rest; workflow inputs are never logged.
    Properties:
      LogGroupName: !Sub "/sasflow/${{AWS::StackName}}/{function}"
      RetentionInDays: !Ref LogRetentionDays

"""
        + _alarm(
            f"{function}ErrorsAlarm",
            f"{function} invocations failed (its log group has the errors); its occurrences are delivered again, then "
            f"go to {p}TriggerDeadLetterQueue.",
            "AWS/Lambda",
            "Errors",
            "FunctionName",
            f"!Ref {function}",
        )
        + "\n"
        + _alarm(
            f"{function}ThrottlesAlarm",
            f"{function} invocations were throttled (its occurrences wait in {trigger.source_queue.title}).",
            "AWS/Lambda",
            "Throttles",
            "FunctionName",
            f"!Ref {function}",
        )
        + "\n"
        + _alarm(
            f"{p}TriggerDeadLetterAlarm",
            f"Occurrences of trigger {name} were refused (each message says why) or failed "
            f"{'five times' if trigger.queue is None else 'as often as its queue RedrivePolicy allows'}. List them: "
            f"sasflow --stack ${{AWS::StackName}} dlq list {p}TriggerDeadLetterQueue; once fixed, start them: sasflow "
            f"--stack ${{AWS::StackName}} dlq redrive {p}TriggerDeadLetterQueue --reason WHY (docs/triggers.md).",
            "AWS/SQS",
            "ApproximateNumberOfMessagesVisible",
            "QueueName",
            trigger.dead_letters.name_value,
        )
    )


#: The key of an event source mapping's Metadata that names the dead-letter queue of an existing queue it reads.
STAND_IN_METADATA: Final = "sasflow-existing-queue"


#: The key of an s3 trigger's queue policy's Metadata that names the parameter of the existing bucket it watches.
STAND_IN_BUCKET_METADATA: Final = "sasflow-existing-bucket"


def _stand_in(trigger: TriggerDeclaration) -> str:
    """An existing queue's mapping names the queue's dead-letter queue, so the local stack can stand in for both."""
    if trigger.queue is None:
        return ""
    return f"""\
      # An existing queue: the local stack (no account, no such queue) creates a stand-in for it and for its
      # dead-letter queue, where failed messages go after five receives.
      {STAND_IN_METADATA}:
        dead_letter_queue: {trigger.dead_letters.name}
"""


def check_pattern(pattern: dict[str, Any]) -> None:
    """Refuse an event pattern EventBridge would refuse (moto's parser, EventBridge's rules: every value an object or
    a non-empty array), so a typo fails ``make template``, not the deployment."""
    from moto.events.models import EventPatternParser

    try:
        EventPatternParser(json.dumps(pattern)).parse()
    except Exception as exc:  # moto's InvalidEventPatternException (a JsonRESTError) and its kin
        reason = getattr(exc, "message", None) or str(exc)
        raise ValueError(f"pattern: not an EventBridge event pattern: {reason}") from None


def bus_logical_id(bus: str) -> str:
    """The logical id of a bus the template creates: ``orders`` → ``OrdersEventBus``."""
    return "".join(part[:1].upper() + part[1:] for part in bus.split("-")) + "EventBus"


def event_buses(triggers: Sequence[TriggerDeclaration]) -> str:
    """One ``AWS::Events::EventBus`` per bus an event trigger names (not the default bus), named ``<stack>-<bus>``."""
    names = sorted({trigger.bus for trigger in triggers if trigger.kind == "event" and trigger.bus})
    return "".join(
        f"""\
  # A bus the event triggers of triggers.yaml name: put events on it (aws events put-events --event-bus-name ...).
  {bus_logical_id(name)}:
    Type: AWS::Events::EventBus
    Properties:
      Name: !Sub "${{AWS::StackName}}-{name}"

"""
        for name in names
    )


def _queue_source(trigger: TriggerDeclaration) -> str:
    """An sqs trigger's source is its queue, to which whatever its account allows sends: the policy to attach to a
    producer's role (send to this queue, nothing else)."""
    p = trigger.pascal
    return f"""\
  # Attach to the role of what sends the messages that start {trigger.name}'s workflows: this queue, nothing else.
  {p}TriggerSendPolicy:
    Type: AWS::IAM::ManagedPolicy
    Properties:
      Description: Send messages that start workflows of trigger {trigger.name} (its queue only).
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: StartWorkflows
            Effect: Allow
            Action: sqs:SendMessage
            Resource: {trigger.source_queue.arn_value}

"""


def _bucket_name(logical_id: str) -> str:
    """A bucket's name, from the stack's id (unique, lower case, known before the bucket exists, so the trigger's
    queue policy can name the bucket that will send to it): ``<stack id's uuid>-<logical id, lower case>``."""
    return f'!Join ["-", [!Select [2, !Split ["/", !Ref AWS::StackId]], "{logical_id.lower()}"]]'


def _upload_source(trigger: TriggerDeclaration) -> str:
    """An s3 trigger's source: the policy of its queues that lets its bucket, and only it, send notifications (the
    bucket, created after it, is rendered once per bucket by `upload_buckets`)."""
    p, bucket = trigger.pascal, trigger.bucket_id
    if trigger.bucket_parameter is None:
        arn = (
            f'!Join ["", ["arn:", !Ref AWS::Partition, ":s3:::", !Select [2, !Split ["/", !Ref AWS::StackId]], '
            f'"-{bucket.lower()}"]]'
        )
        stand_in = ""
    else:
        arn = f'!Sub "arn:${{AWS::Partition}}:s3:::${{{bucket}}}"'
        stand_in = f"""\
    Metadata:
      # The bucket exists already: its owner sends its uploads here (docs/triggers.md). The local stack creates a
      # stand-in bucket of the parameter's name and configures that, as its owner would.
      {STAND_IN_BUCKET_METADATA}:
        bucket_parameter: {bucket}
        prefix: {json.dumps(trigger.prefix)}
        suffix: {json.dumps(trigger.suffix)}
"""
    return f"""\
  # S3 sends the notifications of {bucket}'s uploads to the trigger's queue: that bucket of this account only.
  {p}TriggerQueuePolicy:
    Type: AWS::SQS::QueuePolicy
{stand_in}    Properties:
      Queues:
        - !Ref {p}TriggerQueue
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: BucketSendsUploads
            Effect: Allow
            Principal:
              Service: s3.amazonaws.com
            Action: sqs:SendMessage
            Resource: !GetAtt {p}TriggerQueue.Arn
            Condition:
              ArnEquals:
                aws:SourceArn: {arn}
              StringEquals:
                aws:SourceAccount: !Ref AWS::AccountId

"""


def _overlap(a: TriggerDeclaration, b: TriggerDeclaration) -> bool:
    """Whether S3 could not tell two triggers' keys apart (it refuses overlapping notifications of one event type):
    one prefix starts the other and one suffix ends the other."""
    prefixes = a.prefix.startswith(b.prefix) or b.prefix.startswith(a.prefix)
    suffixes = a.suffix.endswith(b.suffix) or b.suffix.endswith(a.suffix)
    return prefixes and suffixes


def check_queues(triggers: Sequence[TriggerDeclaration]) -> None:
    """Refuse two sqs triggers of one existing queue, naming both (found by a trial: each function would take a share
    of its messages, and start the other's definition for none of them).

    Raises
    ------
    TriggersFileError
        When two read one queue.
    """
    readers: dict[str, str] = {}
    for trigger in triggers:
        if trigger.queue is None:
            continue
        if trigger.queue in readers:
            raise TriggersFileError(
                f"triggers {readers[trigger.queue]} and {trigger.name} read the same queue {trigger.queue}: each would "
                "take a share of its messages; give one of them another queue, or one trigger a definition for both"
            )
        readers[trigger.queue] = trigger.name


def check_buckets(triggers: Sequence[TriggerDeclaration]) -> None:
    """Refuse two s3 triggers of one bucket whose keys overlap, naming both (S3 would refuse the deployment).

    Raises
    ------
    TriggersFileError
        When two overlap.
    """
    uploads = [trigger for trigger in triggers if trigger.kind == "s3"]
    for index, first in enumerate(uploads):
        for second in uploads[index + 1 :]:
            if first.bucket == second.bucket and _overlap(first, second):
                raise TriggersFileError(
                    f"triggers {first.name} and {second.name} watch overlapping keys of bucket {first.bucket_id} "
                    f"({first.prefix or '(any)'}*{first.suffix} and {second.prefix or '(any)'}*{second.suffix}): S3 "
                    "refuses overlapping notifications; give them prefixes or suffixes that do not overlap"
                )


def upload_buckets(triggers: Sequence[TriggerDeclaration]) -> str:
    """One ``AWS::S3::Bucket`` per bucket the s3 triggers name (versioned, encrypted, private, TLS only), whose
    notification configuration sends each trigger's uploads to its queue, and its policy."""
    by_bucket: dict[str, list[TriggerDeclaration]] = {}
    for trigger in triggers:
        if trigger.kind == "s3" and trigger.created_bucket:
            by_bucket.setdefault(trigger.created_bucket, []).append(trigger)
    parts = []
    for bucket, watchers in sorted(by_bucket.items()):
        policies = ", ".join(f"{t.pascal}TriggerQueuePolicy" for t in watchers)
        configurations = "".join(_queue_configuration(t) for t in watchers)
        names = ", ".join(t.name for t in watchers)
        parts.append(f"""\
  # The bucket of triggers.yaml's s3 triggers ({names}): each upload of their keys starts a workflow.
  {bucket}:
    Type: AWS::S3::Bucket
    DependsOn: [{policies}]
    DeletionPolicy: Retain
    UpdateReplacePolicy: Retain
    Metadata:
      checkov:
        skip:
          - id: CKV_AWS_18
            comment: >-
              Access logs would need a second bucket; each upload's workflow names its object, and CloudTrail data
              events can be turned on where an audit needs every read.
    Properties:
      BucketName: {_bucket_name(bucket)}
      BucketEncryption:
        ServerSideEncryptionConfiguration:
          - ServerSideEncryptionByDefault:
              SSEAlgorithm: AES256
      PublicAccessBlockConfiguration:
        BlockPublicAcls: true
        BlockPublicPolicy: true
        IgnorePublicAcls: true
        RestrictPublicBuckets: true
      OwnershipControls:
        Rules:
          - ObjectOwnership: BucketOwnerEnforced
      # Every upload has its own version id: the occurrence its workflow is named by (a key uploaded again is
      # another workflow, a notification sent twice is not).
      VersioningConfiguration:
        Status: Enabled
      NotificationConfiguration:
        QueueConfigurations:
{configurations}
  {bucket}Policy:
    Type: AWS::S3::BucketPolicy
    Properties:
      Bucket: !Ref {bucket}
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: TlsOnly
            Effect: Deny
            Principal: "*"
            Action: "s3:*"
            Resource:
              - !GetAtt {bucket}.Arn
              - !Sub "${{{bucket}.Arn}}/*"
            Condition:
              Bool:
                aws:SecureTransport: "false"

""")
    return "".join(parts)


def _queue_configuration(trigger: TriggerDeclaration) -> str:
    rules = "".join(
        f"                  - Name: {name}\n                    Value: {json.dumps(value)}\n"
        for name, value in (("prefix", trigger.prefix), ("suffix", trigger.suffix))
        if value
    )
    key_filter = (
        f"""\
            Filter:
              S3Key:
                Rules:
{rules}"""
        if rules
        else ""
    )
    return f"""\
          - Event: s3:ObjectCreated:*
            Queue: !GetAtt {trigger.pascal}TriggerQueue.Arn
{key_filter}"""


def _event_rule(trigger: TriggerDeclaration) -> str:
    """An event trigger's source: its rule (pattern, bus, target the queue with retries and the dead-letter queue)
    and the queues' policy that lets that rule alone send to them."""
    p = trigger.pascal
    state = trigger.state
    bus = "default" if trigger.bus is None else f"!Ref {bus_logical_id(trigger.bus)}"
    description = f"Events of trigger {trigger.name} on bus {trigger.bus_name}"
    return f"""\
  {p}Rule:
    Type: AWS::Events::Rule
    Properties:
      Description: {json.dumps(description)}
      EventBusName: {bus}
      EventPattern: {json.dumps(trigger.pattern, separators=(", ", ": "))}
      State: {state}
      Targets:
        # The event as it is: its id names the occurrence (a redelivered event starts nothing new).
        - Id: {trigger.name}
          Arn: !GetAtt {p}TriggerQueue.Arn
          RetryPolicy:
            MaximumEventAgeInSeconds: {_MAX_EVENT_AGE}
            MaximumRetryAttempts: {_MAX_RETRIES}
          DeadLetterConfig:
            Arn: !GetAtt {p}TriggerDeadLetterQueue.Arn

  # EventBridge sends the rule's events to the trigger's queue, and what it cannot deliver to its dead-letter queue:
  # this rule only (aws:SourceArn), no other rule, account or service.
  {p}TriggerQueuePolicy:
    Type: AWS::SQS::QueuePolicy
    Properties:
      Queues:
        - !Ref {p}TriggerQueue
        - !Ref {p}TriggerDeadLetterQueue
      PolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Sid: RuleSendsEvents
            Effect: Allow
            Principal:
              Service: events.amazonaws.com
            Action: sqs:SendMessage
            Resource:
              - !GetAtt {p}TriggerQueue.Arn
              - !GetAtt {p}TriggerDeadLetterQueue.Arn
            Condition:
              ArnEquals:
                aws:SourceArn: !GetAtt {p}Rule.Arn

"""


def trigger_outputs(trigger: TriggerDeclaration) -> str:
    """A trigger's outputs: its queue (where its occurrences wait: an existing bucket's owner sends its uploads to
    that ARN), an sqs trigger's send policy (for its producers' roles), the bucket the template creates for it."""
    p, queue = trigger.pascal, trigger.source_queue
    text = f"""\
  {p}TriggerQueueUrl:
    Description: {json.dumps(f"The queue of trigger {trigger.name}'s occurrences.")}
    Value: {queue.url_value}
  {p}TriggerQueueArn:
    Value: {queue.arn_value}
"""
    if trigger.kind == "sqs":
        text += f"""\
  {p}TriggerSendPolicyArn:
    Description: {json.dumps(f"Attach to the role of what sends trigger {trigger.name}'s messages.")}
    Value: !Ref {p}TriggerSendPolicy
"""
    return text


def bucket_outputs(triggers: Sequence[TriggerDeclaration]) -> str:
    """The name of each bucket the template creates for s3 triggers (upload to it)."""
    buckets = sorted({t.created_bucket for t in triggers if t.kind == "s3" and t.created_bucket})
    return "".join(
        f"""\
  {bucket}Name:
    Description: Uploads to this bucket start workflows (triggers.yaml's s3 triggers).
    Value: !Ref {bucket}
"""
        for bucket in buckets
    )


def bucket_parameters(triggers: Sequence[TriggerDeclaration]) -> str:
    """One parameter per existing bucket the s3 triggers name (``bucket: {parameter: ...}``): its name."""
    watchers: dict[str, list[str]] = {}
    for trigger in triggers:
        if trigger.kind == "s3" and trigger.bucket_parameter:
            watchers.setdefault(trigger.bucket_parameter, []).append(trigger.name)
    parts = []
    for parameter, names in sorted(watchers.items()):
        description = (
            f"The existing bucket whose uploads start the workflows of trigger {', '.join(names)}; its owner sends "
            "them to the trigger's queue (docs/triggers.md)"
        )
        parts.append(f"""\
  {parameter}:
    Type: String
    AllowedPattern: "^[a-z0-9][a-z0-9.-]{{1,61}}[a-z0-9]$"
    ConstraintDescription: an S3 bucket's name (3 to 63 lower-case letters, digits, dots and hyphens)
    Description: {json.dumps(description)}
""")
    return "".join(parts)


def sample_parameter(triggers: list[TriggerDeclaration]) -> str:
    """The parameter that turns the sample triggers on (none when no trigger is a sample)."""
    if not any(trigger.sample for trigger in triggers):
        return ""
    return f"""\
  {SAMPLE_TRIGGERS_PARAMETER}:
    Type: String
    Default: DISABLED
    AllowedValues: [ENABLED, DISABLED]
    Description: The sample triggers of triggers.yaml (sample true) tick when ENABLED (the local stack's make up).
"""

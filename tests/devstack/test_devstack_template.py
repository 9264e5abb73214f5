"""devstack.template: loading short tags, resolving intrinsics, conditions, Globals and physical names."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.template import (
    HttpApiEventSpec,
    ScheduleEventSpec,
    SqsEventSpec,
    Stack,
    TemplateError,
    load_template,
    merge_globals,
)

REPO_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def _stack(body: str, tmp_path: Path, **kwargs: object) -> Stack:
    path = tmp_path / "t.yaml"
    path.write_text(body)
    return Stack.from_file(path, **kwargs)  # type: ignore[arg-type]


def test_short_tags_load_as_long_form(tmp_path: Path) -> None:
    # Given a template with short tags (and a date-like version that must stay a string)
    path = tmp_path / "t.yaml"
    path.write_text(
        "AWSTemplateFormatVersion: 2010-09-09\n"
        "Resources:\n"
        "  Q:\n"
        "    Type: AWS::SQS::Queue\n"
        "    Properties:\n"
        "      A: !Ref X\n"
        "      B: !GetAtt Res.Attr.Sub\n"
        "      C: !Sub '${AWS::Region}-x'\n"
        "      D: !If [Cond, !Join ['-', [a, b]], !Select [0, !Split [',', 'p,q']]]\n"
        "      E: !FindInMap [M, k, v]\n"
    )
    # When it is loaded
    data = load_template(path)
    # Then every short tag is the long-form dict CloudFormation documents
    props = data["Resources"]["Q"]["Properties"]
    assert data["AWSTemplateFormatVersion"] == "2010-09-09"
    assert props["A"] == {"Ref": "X"}
    assert props["B"] == {"Fn::GetAtt": ["Res", "Attr.Sub"]}
    assert props["C"] == {"Fn::Sub": "${AWS::Region}-x"}
    assert props["D"] == {
        "Fn::If": ["Cond", {"Fn::Join": ["-", ["a", "b"]]}, {"Fn::Select": [0, {"Fn::Split": [",", "p,q"]}]}]
    }
    assert props["E"] == {"Fn::FindInMap": ["M", "k", "v"]}


INTRINSICS = """\
Parameters:
  Env:
    Type: String
    Default: dev
  Size:
    Type: Number
    Default: 30
  Names:
    Type: CommaDelimitedList
    Default: "x,y,z"
Mappings:
  Sizes:
    dev:
      memory: 256
    prod:
      memory: 1024
Conditions:
  IsDev: !Equals [!Ref Env, dev]
  IsProd: !Not [!Condition IsDev]
  Both: !And [!Condition IsDev, !Or [!Equals [a, b], !Equals [!Ref Size, "30"]]]
Resources:
  Table:
    Type: AWS::DynamoDB::Table
    Properties:
      KeySchema: []
  Queue:
    Type: AWS::SQS::Queue
  ProdQueue:
    Type: AWS::SQS::Queue
    Condition: IsProd
  Alarm:
    Type: AWS::CloudWatch::Alarm
    Properties:
      AlarmDescription: !Sub
        - "${Q} in ${Where} (${!Literal}) for ${AWS::StackName}"
        - Where: !Ref AWS::Region
          Q: !GetAtt Queue.QueueName
      Namespace: !Join ["/", [!Ref AWS::AccountId, !Select [1, !Ref Names], !Ref AWS::Partition]]
      Period: !FindInMap [Sizes, !Ref Env, memory]
      Threshold: !If [IsProd, 1, !Ref Size]
      Dropped: !If [IsDev, !Ref AWS::NoValue, kept]
      Url: !Sub "${Queue}|${Table}|${Table.Arn}|${Queue.Arn}|${AWS::URLSuffix}"
      Parts: !Split ["|", "a|b"]
      Both: !If [Both, yes-both, no-both]
Outputs:
  QueueUrl:
    Value: !Ref Queue
  ProdOnly:
    Condition: IsProd
    Value: !Ref ProdQueue
"""


def test_intrinsics_resolve_like_cloudformation(tmp_path: Path) -> None:
    # Given a template exercising every intrinsic devstack supports
    stack = _stack(INTRINSICS, tmp_path, stack_name="demo", region="eu-west-1")

    # When the alarm's properties are resolved
    props = stack.resources["Alarm"]

    # Then each intrinsic has CloudFormation's value
    assert props["AlarmDescription"] == "demo-Queue in eu-west-1 (${Literal}) for demo"
    assert props["Namespace"] == "123456789012/y/aws"
    assert props["Period"] == 256
    assert props["Threshold"] == "30"  # Number parameters stay strings
    assert "Dropped" not in props  # AWS::NoValue removes the key
    assert props["Url"] == (
        "https://sqs.eu-west-1.amazonaws.com/123456789012/demo-Queue|demo-Table|"
        "arn:aws:dynamodb:eu-west-1:123456789012:table/demo-Table|arn:aws:sqs:eu-west-1:123456789012:demo-Queue|"
        "amazonaws.com"
    )
    assert props["Parts"] == ["a", "b"]
    assert props["Both"] == "yes-both"
    assert stack.conditions == {"IsDev": True, "IsProd": False, "Both": True}


def test_condition_false_removes_resources_and_outputs(tmp_path: Path) -> None:
    # Given the default parameters (Env=dev, so IsProd is false)
    stack = _stack(INTRINSICS, tmp_path)
    # Then the conditional resource and output do not exist
    assert set(stack.resources) == {"Table", "Queue", "Alarm"}
    assert stack.outputs() == {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/sasflow-Queue"}
    with pytest.raises(TemplateError, match="condition is false"):
        stack.physical_id("ProdQueue")

    # When Env is overridden, the resource and output appear
    prod = _stack(INTRINSICS, tmp_path, parameters={"Env": "prod"})
    assert "ProdQueue" in prod.resources
    assert prod.outputs()["ProdOnly"].endswith("/sasflow-ProdQueue")


def test_queue_urls_follow_the_endpoint(tmp_path: Path) -> None:
    stack = _stack(INTRINSICS, tmp_path, endpoint_url="http://127.0.0.1:5000/")
    assert stack.physical_id("Queue") == "http://127.0.0.1:5000/123456789012/sasflow-Queue"
    assert stack.get_att("Queue", "QueueUrl") == stack.physical_id("Queue")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"Nope": "1"}, "unknown parameter"),
        ({"Size": "abc"}, "is not a Number"),
    ],
)
def test_bad_parameter_overrides_are_refused(tmp_path: Path, overrides: dict[str, str], message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        _stack(INTRINSICS, tmp_path, parameters=overrides)


def test_parameter_constraints_are_checked(mini_template: Path) -> None:
    with pytest.raises(TemplateError, match="above MaxValue"):
        Stack.from_file(mini_template, parameters={"Shards": "17"})
    with pytest.raises(TemplateError, match="is not one of"):
        Stack.from_file(mini_template, parameters={"WithExtras": "maybe"})


def test_long_queue_names_are_bounded_and_unique(tmp_path: Path) -> None:
    # Given logical ids long enough to push the generated name past SQS's 80 characters
    long_a, long_b = "A" * 70 + "One", "A" * 70 + "Two"
    body = f"Resources:\n  {long_a}:\n    Type: AWS::SQS::Queue\n  {long_b}:\n    Type: AWS::SQS::Queue\n"
    stack = _stack(body, tmp_path, stack_name="a-rather-long-stack-name")
    names = {stack.queue_name(long_a), stack.queue_name(long_b)}
    assert len(names) == 2
    assert all(len(name) <= 80 for name in names)
    assert all(name.startswith("a-rather-long-stack-name-AAAA") for name in names)


def test_merge_globals_follows_sam_rules() -> None:
    merged = merge_globals(
        {"Timeout": 30, "Layers": ["L1"], "Environment": {"Variables": {"A": "g", "B": "g"}}},
        {"Timeout": 10, "Layers": ["L2"], "Environment": {"Variables": {"B": "f", "C": "f"}}},
    )
    assert merged == {
        "Timeout": 10,
        "Layers": ["L1", "L2"],
        "Environment": {"Variables": {"A": "g", "B": "f", "C": "f"}},
    }


def test_function_specs_of_the_mini_project(mini_template: Path) -> None:
    # Given the tiny project with Globals, a layer and three kinds of events
    stack = Stack.from_file(mini_template, stack_name="mini", parameters={"Greeting": "hi"})

    # When its functions are read
    specs = {spec.logical_id: spec for spec in stack.functions()}

    # Then Globals are merged (function wins), values are strings and paths are absolute
    root = mini_template.parent
    agent_b = specs["AgentBFunction"]
    assert agent_b.code_dir == root / "code"
    assert agent_b.layer_dirs == [root / "layer"]
    assert agent_b.handler == "mini_agent_handler.handler"
    assert (agent_b.runtime, agent_b.timeout_seconds, agent_b.memory_mb) == ("python3.12", 5, 512)
    assert agent_b.function_name == "mini-AgentBFunction"
    assert agent_b.environment == {
        "AGENT_NAME": "b",
        "GREETING": "hi, b",
        "SHARDS": "4",
        "ITEMS_TABLE": "mini-ItemsTable",
        "WORK_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/mini-WorkQueue",
    }
    assert specs["AgentAFunction"].environment["GREETING"] == "hi"
    assert specs["AgentAFunction"].memory_mb == 128
    assert specs["ApiFunction"].timeout_seconds == 10
    api_id = stack.physical_id("Api")
    assert specs["ApiFunction"].events == [
        HttpApiEventSpec(api_logical_id="Api", path="/items", method="POST", name="Create", api_id=api_id),
        HttpApiEventSpec(api_logical_id="Api", path="/items/{item_id}", method="GET", name="Read", api_id=api_id),
    ]
    assert specs["WorkerFunction"].events == [
        SqsEventSpec(
            queue_logical_id="WorkQueue",
            queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/mini-WorkQueue",
            queue_arn="arn:aws:sqs:us-east-1:123456789012:mini-WorkQueue",
            batch_size=5,
            batching_window_seconds=0.0,
            report_batch_item_failures=True,
            name="Work",
        )
    ]
    assert specs["TickFunction"].events == [ScheduleEventSpec(expression="rate(5 minutes)", enabled=True, name="Tick")]
    assert len(api_id) == 10 and api_id.isalnum() and api_id.islower()
    assert stack.outputs()["ApiUrl"] == f"https://{api_id}.execute-api.us-east-1.amazonaws.com"


def test_unsupported_event_type_is_an_error(tmp_path: Path) -> None:
    body = (
        "Resources:\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      CodeUri: c/\n"
        "      Handler: m.h\n      Runtime: python3.12\n      Events:\n        S3:\n          Type: S3\n"
        "          Properties: {Bucket: b, Events: 's3:ObjectCreated:*'}\n"
    )
    with pytest.raises(TemplateError, match="event type S3 is not emulated"):
        _stack(body, tmp_path).functions()


def test_repository_template_resolves(tmp_path: Path) -> None:
    # Given the real template with the sample services switched off
    stack = Stack.from_file(
        REPO_TEMPLATE, parameters={"DeploySampleServices": "false", "FlightsBaseUrl": "http://127.0.0.1:1/f"}
    )
    # Then the three agents share a module but not their AGENT_NAME, and numbers reach env vars as strings
    agents = {spec.logical_id: spec for spec in stack.functions() if spec.handler == "agent_handler.handler"}
    assert {spec.environment["AGENT_NAME"] for spec in agents.values()} == {"flights", "hotels", "payments"}
    assert agents["FlightsAgentFunction"].environment["REMOTE_BASE_URL"] == "http://127.0.0.1:1/f"
    assert agents["FlightsAgentFunction"].environment["DEADLINE_GRACE_SECONDS"] == "30"
    assert "SampleServicesFunction" not in stack.resources
    assert "SampleServicesUrl" not in stack.outputs()


def test_remote_service_parameters_point_each_agent_at_its_own_service() -> None:
    from devstack.template import remote_service_parameters

    parameters = remote_service_parameters({"flights": "http://127.0.0.1:1/f", "hotels": "http://127.0.0.1:2/h"})
    assert parameters == {
        "DeploySampleServices": "false",
        "FlightsBaseUrl": "http://127.0.0.1:1/f",
        "HotelsBaseUrl": "http://127.0.0.1:2/h",
    }
    stack = Stack.from_file(REPO_TEMPLATE, parameters={**parameters, "PaymentsBaseUrl": "http://127.0.0.1:3/p"})
    flights = next(spec for spec in stack.functions() if spec.logical_id == "FlightsAgentFunction")
    assert flights.environment["REMOTE_BASE_URL"] == "http://127.0.0.1:1/f"


def test_offline_aws_fakes_credentials_drops_real_endpoints_and_restores_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from devstack.inprocess import offline_aws

    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "https://example.invalid")
    monkeypatch.setenv("AWS_PROFILE", "production")
    before = dict(os.environ)
    with offline_aws():
        assert os.environ["AWS_ACCESS_KEY_ID"] == "FOOBARKEY"  # moto's own fake key, set over ours
        assert os.environ["AWS_DEFAULT_REGION"] == "us-east-1"
        assert os.environ["AWS_CONFIG_FILE"] == os.devnull
        assert "AWS_ENDPOINT_URL_DYNAMODB" not in os.environ and "AWS_PROFILE" not in os.environ
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    ("parameters", "scheduler", "agents"),
    [
        ({}, 0.0, 0.0),  # Profile=latency, the default
        ({"Profile": "latency"}, 0.0, 0.0),
        ({"Profile": "cost"}, 0.0, 2.0),
        ({"SchedulerBatchingWindowSeconds": "1", "AgentBatchingWindowSeconds": "0"}, 1.0, 0.0),
        ({"Profile": "cost", "AgentBatchingWindowSeconds": "1"}, 0.0, 1.0),  # a window set overrides the profile's
        ({"Profile": "cost", "SchedulerBatchingWindowSeconds": "3"}, 3.0, 2.0),
    ],
)
def test_the_batching_window_parameters_reach_every_event_source_mapping(
    parameters: dict[str, str], scheduler: float, agents: float
) -> None:
    # Given the real template deployed with its defaults, a profile, or windows of its own
    stack = Stack.from_file(REPO_TEMPLATE, parameters={"DeploySampleServices": "false", **parameters})
    windows = {
        spec.logical_id: {event.batching_window_seconds for event in spec.events if isinstance(event, SqsEventSpec)}
        for spec in stack.functions()
        if any(isinstance(event, SqsEventSpec) for event in spec.events)
    }
    # Then the scheduler's mapping has its window, and each agent's (rendered from agents.yaml) and each trigger's
    # (triggers.yaml: a burst of events, messages or uploads shares receives and invocations) the agents' one
    assert windows.pop("SchedulerFunction") == {scheduler}
    # the batches' runs go one at a time as they come (a run is a batch's whole page loop: nothing to gather)
    assert windows.pop("BatchFunction") == {0.0}
    triggers = [name for name in windows if name.endswith("TriggerFunction")]
    assert len(triggers) == 4 and all(windows[name] == {agents} for name in triggers)
    assert len(windows) > 4 and all(value == {agents} for value in windows.values()), windows

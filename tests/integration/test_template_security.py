"""What would really deploy, checked on the template as SAM translates it (tools/translate_template.py).

SAM adds roles, policies and permissions of its own; the checks read the CloudFormation it produces, with each
condition decided for the parameters of the case:

- every route of every API is authorized (AWS_IAM by default, JWT when chosen), and the template's routes are the
  API function's routes;
- each function's policies name exact actions on its own resources: no wildcard resource, no Scan, no DeleteItem on
  the state table, no ``index/*``; the managed policies SAM attaches are AWS's logging and X-Ray ones, and nothing
  polls a queue but through its own event source mapping;
- every function logs to a log group of the template that has a retention;
- every alarm notifies someone (AlarmActions), and the state table cannot be deleted by accident.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from devstack.agents import load_agents
from devstack.sam import translate
from devstack.template import Stack, load_template
from devstack.triggers import load_triggers
from tests.support.lambdas import ROOT

#: AWS managed policies SAM attaches to the roles it makes, and why they are allowed (their wildcards are AWS's).
ALLOWED_MANAGED = {
    # CloudWatch Logs for the function (SAM adds it to every role it generates; its log group is set explicitly).
    "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole",
    # X-Ray segments (the Tracing parameter); X-Ray has no resource-level permissions.
    "arn:aws:iam::aws:policy/AWSXrayWriteOnlyAccess",
}
ENGINE = ("ApiFunction", "SchedulerFunction", "SupervisorFunction")


@cache
def translated() -> dict[str, Any]:
    """template.yaml as SAM translates it (devstack.sam: aws-sam-translator in .venv-sam, cached)."""
    return translate(load_template(ROOT / "template.yaml"))


def resolved(parameters: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The translated resources whose condition holds, with every ``Fn::If`` decided for ``parameters``."""
    conditions = Stack.from_file(ROOT / "template.yaml", parameters=parameters).conditions

    def decide(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"Fn::If"}:
                name, when_true, when_false = value["Fn::If"]
                return decide(when_true if conditions[name] else when_false)
            out = {key: decide(item) for key, item in value.items()}
            return {key: item for key, item in out.items() if item != {"Ref": "AWS::NoValue"}}
        if isinstance(value, list):
            return [decide(item) for item in value if decide(item) != {"Ref": "AWS::NoValue"}]
        return value

    return {
        logical_id: decide(resource)
        for logical_id, resource in translated()["Resources"].items()
        if conditions.get(resource.get("Condition", ""), True)
    }


CASES = {
    "IAM, sample services": {"DeploySampleServices": "true"},
    "JWT, own services": {
        "DeploySampleServices": "false",
        "ApiAuthorizer": "JWT",
        "JwtIssuer": "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_example",
        "JwtAudience": "client-1",
    },
}


def of_type(resources: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {logical_id: r for logical_id, r in resources.items() if r["Type"] == kind}


def statements(role: dict[str, Any], resources: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every statement a role grants: its inline policies and the managed policies of this template it names."""
    found = [s for policy in role["Properties"].get("Policies", []) for s in policy["PolicyDocument"]["Statement"]]
    for arn in role["Properties"].get("ManagedPolicyArns", []):
        if isinstance(arn, dict):  # !Ref of an AWS::IAM::ManagedPolicy of the template
            found += resources[arn["Ref"]]["Properties"]["PolicyDocument"]["Statement"]
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("case", CASES)
def test_every_route_is_authorized(case: str) -> None:
    resources = resolved(CASES[case])
    routes = of_type(resources, "AWS::ApiGatewayV2::Route")
    assert len(routes) >= 4
    expected = "JWT" if CASES[case].get("ApiAuthorizer") == "JWT" else "AWS_IAM"
    for logical_id, route in routes.items():
        assert route["Properties"]["AuthorizationType"] == expected, logical_id
        if expected == "JWT":
            assert route["Properties"]["AuthorizerId"] == {"Ref": "HttpApiJwtAuthorizer"}, logical_id
    for logical_id, api in of_type(resources, "AWS::ApiGatewayV2::Api").items():
        body = api["Properties"].get("Body")
        if body is None:
            continue  # routes of their own, checked above
        for path, methods in body["paths"].items():
            for method, operation in methods.items():
                assert operation["security"] == [{"AWS_IAM": []}], (logical_id, path, method)


def app_routes(app: Any) -> set[str]:
    return {
        f"{method} {route.openapi_path}"
        for route in app._static_routes + app._dynamic_routes
        for method in ([route.method] if isinstance(route.method, str) else route.method)
    }


def test_the_template_routes_are_the_functions_routes_each_to_its_own_function() -> None:
    from api_handler import app  # the deployed handlers' resolvers
    from ops_handler import app as ops_app

    by_target: dict[str, set[str]] = {}
    for route in of_type(resolved(CASES["IAM, sample services"]), "AWS::ApiGatewayV2::Route").values():
        target = json.dumps(route["Properties"]["Target"], sort_keys=True)
        by_target.setdefault(target, set()).add(route["Properties"]["RouteKey"])
    ops_routes = app_routes(ops_app)
    assert all(route.split(" ", 1)[1].startswith("/ops/") for route in ops_routes)
    assert sorted(by_target.values(), key=len) == sorted([app_routes(app), ops_routes], key=len)


@pytest.mark.parametrize("case", CASES)
def test_each_function_may_do_exactly_what_it_needs_and_no_wildcard_resource(case: str) -> None:
    resources = resolved(CASES[case])
    roles = of_type(resources, "AWS::IAM::Role")
    functions = of_type(resources, "AWS::Lambda::Function")
    granted: dict[str, set[tuple[str, str]]] = {}
    for logical_id in functions:
        role = roles[f"{logical_id}Role"]
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert isinstance(arn, dict) or arn in ALLOWED_MANAGED, (logical_id, arn)
        pairs: set[tuple[str, str]] = set()
        for statement in statements(role, resources):
            assert statement["Effect"] == "Allow"
            for resource in as_list(statement["Resource"]):
                text = json.dumps(resource)
                assert resource != "*" and '"*"' not in text, (logical_id, statement)
                assert "index/*" not in text, (logical_id, statement)
                for action in as_list(statement["Action"]):
                    assert "*" not in action, (logical_id, action)
                    pairs.add((action, text))
        granted[logical_id] = pairs
    table = json.dumps({"Fn::GetAtt": ["StateTable", "Arn"]})
    index = json.dumps({"Fn::Sub": "${StateTable.Arn}/index/deadline-index"})
    for logical_id in ENGINE:
        on_table = {action for action, resource in granted[logical_id] if resource == table}
        # UpdateItem on the triggers' items only (TriggerSlotsPolicy, below): a run's end gives its slot back
        expected = {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"}
        # Query and DeleteItem on the tenants' items only (TenantSlotsPolicy, below): a tenant's queue
        expected |= {"dynamodb:Query", "dynamodb:DeleteItem"}
        if logical_id in ("SchedulerFunction", "SupervisorFunction"):
            expected.add("dynamodb:BatchGetItem")  # a map step's children (collected, given their retention)
        if logical_id == "SupervisorFunction":
            expected.add("dynamodb:UpdateItem")  # its lease
            assert ("dynamodb:Query", index) in granted[logical_id]
        if logical_id == "ApiFunction":
            expected |= {"dynamodb:Query", "dynamodb:UpdateItem"}  # registered definitions, their keys only (below)
        assert on_table == expected, logical_id
    for logical_id in ENGINE:
        role = roles[f"{logical_id}Role"]
        updates = [s for s in statements(role, resources) if "dynamodb:UpdateItem" in as_list(s["Action"])]
        conditions = {json.dumps(s.get("Condition"), sort_keys=True) for s in updates}
        slots = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TRIGGER#*"]}}
        assert json.dumps(slots, sort_keys=True) in conditions, logical_id
        assert "null" not in conditions or logical_id == "SupervisorFunction", logical_id  # its lease: its own item
        deletes = [s for s in statements(role, resources) if "dynamodb:DeleteItem" in as_list(s["Action"])]
        tenants = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANCY#*"]}}
        assert [s.get("Condition") for s in deletes] == [tenants], logical_id
    api = roles["ApiFunctionRole"]
    [registry] = [s for s in statements(api, resources) if s.get("Sid") == "RegisteredDefinitions"]
    assert registry["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"] == ["DEFNAMES", "DEFNAME#*"]
    assert sorted(as_list(registry["Action"])) == ["dynamodb:Query", "dynamodb:UpdateItem"]
    # The operators' function reads any workflow (and a listing's page again, by BatchGetItem), writes its actions,
    # queries both indexes, and scans only to list finished workflows (an operator's occasional request,
    # docs/operate.md, "Finding workflows").
    attention = json.dumps({"Fn::Sub": "${StateTable.Arn}/index/attention-index"})
    by_trigger = json.dumps({"Fn::Sub": "${StateTable.Arn}/index/trigger-index"})
    on_state = {(a, r) for a, r in granted["OpsFunction"] if "StateTable" in r}
    assert on_state == {
        ("dynamodb:GetItem", table),
        ("dynamodb:PutItem", table),
        ("dynamodb:BatchGetItem", table),  # a listing's page re-read from the items
        ("dynamodb:UpdateItem", table),  # the triggers' items only (below)
        ("dynamodb:Query", table),  # a tenant's queue (TenantSlotsPolicy): a cancel's give-back starts its head
        ("dynamodb:DeleteItem", table),  # a queued workflow's entry, when it is cancelled or started
        ("dynamodb:Query", index),
        ("dynamodb:Query", attention),
        ("dynamodb:Query", by_trigger),
        ("dynamodb:Scan", table),
    }
    ops = roles["OpsFunctionRole"]
    [trigger_items] = [s for s in statements(ops, resources) if s.get("Sid") == "TriggerItems"]
    assert trigger_items["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TRIGGER#*"]}}
    # A trigger's function starts workflows (a conditional PutItem, a repeat's GetItem), reads the definitions' keys
    # and updates its own item only (a tick skipped while paused)
    for trigger in load_triggers(ROOT / "triggers.yaml"):
        function = f"{trigger.pascal}TriggerFunction"
        on_table = {action for action, resource in granted[function] if resource == table}
        assert on_table == {
            "dynamodb:GetItem",
            "dynamodb:PutItem",
            "dynamodb:Query",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",  # a tenant's queue (TenantSlotsPolicy)
        }
        role = roles[f"{function}Role"]
        by_sid = {s.get("Sid"): s for s in statements(role, resources)}
        assert by_sid["OwnTriggerItem"]["Condition"] == {
            "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [f"TRIGGER#{trigger.name}"]}
        }
        assert by_sid["RegisteredDefinitions"]["Condition"] == {
            "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["DEFNAME#*"]}
        }
    for logical_id, pairs in granted.items():
        assert not any(action == "dynamodb:BatchWriteItem" for action, _ in pairs), logical_id
        if logical_id != "OpsFunction":
            assert not any(action == "dynamodb:Scan" for action, _ in pairs), logical_id
        # DeleteItem on the state table only on the tenants' queues (TenantSlotsPolicy): never a workflow
        deletes = [
            s
            for s in statements(roles[f"{logical_id}Role"], resources)
            if "dynamodb:DeleteItem" in as_list(s["Action"]) and table in json.dumps(s["Resource"])
        ]
        tenants = {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["TENANCY#*"]}}
        assert all(s.get("Condition") == tenants for s in deletes), logical_id
        if logical_id.endswith("AgentFunction"):
            assert not any("StateTable" in resource for _, resource in pairs), logical_id
    # an agent's idempotency rights stop at its own records and its own breaker
    flights = roles["FlightsAgentFunctionRole"]
    [own] = [s for s in statements(flights, resources) if s.get("Sid") == "OwnIdempotencyAndBreakerRecords"]
    assert own["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"] == [
        "agent#flights#*",
        "circuit-breaker#flights",
    ]


@pytest.mark.parametrize("case", CASES)
def test_payload_objects_are_granted_per_role_exactly_and_the_bucket_is_private_and_tls_only(case: str) -> None:
    resources = resolved(CASES[case])
    roles = of_type(resources, "AWS::IAM::Role")
    objects = json.dumps({"Fn::Sub": "${PayloadBucket.Arn}/*"})
    bucket = json.dumps({"Fn::GetAtt": ["PayloadBucket", "Arn"]})
    engine = {("s3:GetObject", objects), ("s3:PutObject", objects), ("s3:PutObjectTagging", objects)}
    for logical_id in of_type(resources, "AWS::Lambda::Function"):
        on_s3 = {
            (action, json.dumps(resource))
            for statement in statements(roles[f"{logical_id}Role"], resources)
            for action in as_list(statement["Action"])
            for resource in as_list(statement["Resource"])
            if action.startswith("s3:")
        }
        if logical_id in (*ENGINE, "OpsFunction", "BatchFunction"):
            # write and read payloads, and list one workflow's prefix to re-stamp its objects when it ends (an
            # operator's action, alone or in a batch, may end a workflow)
            assert on_s3 == engine | {("s3:ListBucket", bucket)}, logical_id
        elif logical_id.endswith(("AgentFunction", "TriggerFunction")):
            # an agent reads its inputs and writes its outputs, a trigger writes a large input; no listing
            assert on_s3 == engine, logical_id
        else:
            assert on_s3 == set(), logical_id
    props = resources["PayloadBucket"]["Properties"]
    assert props["PublicAccessBlockConfiguration"] == dict.fromkeys(
        ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"), True
    )
    [sse] = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert sse["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    [deny] = resources["PayloadBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == ("Deny", "*", "s3:*")
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    [ended] = [r for r in props["LifecycleConfiguration"]["Rules"] if r["Id"] == "EndedWorkflowsPayloads"]
    assert ended["TagFilters"] == [{"Key": "claim-check", "Value": "terminal"}]
    assert ended["ExpirationInDays"] == {"Ref": "TerminalRetentionDays"}
    # an object written before the workflow that names it exists, and never made its, expires after a day
    [pending] = [r for r in props["LifecycleConfiguration"]["Rules"] if r["Id"] == "PendingPayloads"]
    assert pending["TagFilters"] == [{"Key": "claim-check", "Value": "pending"}]
    assert (pending["Status"], pending["ExpirationInDays"]) == ("Enabled", 1)
    assert "VersioningConfiguration" not in props  # objects are immutable; see the template's comment


@pytest.mark.parametrize("case", CASES)
def test_each_function_polls_only_its_own_queue_through_its_own_event_source_mapping(case: str) -> None:
    resources = resolved(CASES[case])
    roles = of_type(resources, "AWS::IAM::Role")
    mappings = of_type(resources, "AWS::Lambda::EventSourceMapping")
    # the scheduler, the batches' runs, every agent of agents.yaml and every trigger of triggers.yaml
    assert len(mappings) == 2 + len(load_agents()) + len(load_triggers(ROOT / "triggers.yaml"))
    for logical_id, mapping in mappings.items():
        function = mapping["Properties"]["FunctionName"]["Ref"]
        queue = mapping["Properties"]["EventSourceArn"]
        receive = [
            s for s in statements(roles[f"{function}Role"], resources) if "sqs:ReceiveMessage" in as_list(s["Action"])
        ]
        assert [s["Resource"] for s in receive] == [queue], logical_id
        if function.endswith("AgentFunction"):
            assert mapping["Properties"]["ScalingConfig"] == {"MaximumConcurrency": {"Ref": "AgentMaximumConcurrency"}}


@pytest.mark.parametrize("case", CASES)
def test_every_function_logs_to_a_log_group_with_retention(case: str) -> None:
    resources = resolved(CASES[case])
    for logical_id, function in of_type(resources, "AWS::Lambda::Function").items():
        group = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert resources[group]["Type"] == "AWS::Logs::LogGroup", logical_id
        assert resources[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, logical_id
    stage = next(iter(of_type(resources, "AWS::ApiGatewayV2::Stage").values()))
    access = stage["Properties"]["AccessLogSettings"]
    assert access["DestinationArn"] == {"Fn::GetAtt": ["HttpApiAccessLogGroup", "Arn"]}
    fields = json.loads(access["Format"])
    assert {"requestId", "route", "status", "caller"} <= set(fields)
    assert stage["Properties"]["DefaultRouteSettings"] == {
        "ThrottlingBurstLimit": {"Ref": "ApiThrottlingBurstLimit"},
        "ThrottlingRateLimit": {"Ref": "ApiThrottlingRateLimit"},
    }


@pytest.mark.parametrize("case", CASES)
def test_every_alarm_notifies_the_alarm_topic(case: str) -> None:
    resources = resolved(CASES[case])
    alarms = of_type(resources, "AWS::CloudWatch::Alarm")
    functions = of_type(resources, "AWS::Lambda::Function")
    # errors and throttles of every function, a dead-letter alarm per DLQ, COMPENSATION_FAILED, API 5xx
    names = set(alarms)
    for logical_id in functions:
        if logical_id == "SampleServicesFunction":
            continue  # the demo's own service
        assert {f"{logical_id}ErrorsAlarm", f"{logical_id}ThrottlesAlarm"} <= names, logical_id
    for queue in of_type(resources, "AWS::SQS::Queue"):
        if queue.endswith("DeadLetterQueue"):
            assert queue.removesuffix("Queue") + "Alarm" in names, queue  # a trigger may be named trip-queue
    assert {"CompensationFailedAlarm", "ApiServerErrorsAlarm"} <= names
    for logical_id, alarm in alarms.items():
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": "AlarmTopic"}], logical_id


def test_the_state_table_is_protected_and_responses_never_reach_traces() -> None:
    resources = resolved(CASES["IAM, sample services"])
    table = resources["StateTable"]
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == "Retain"
    for logical_id, function in of_type(resources, "AWS::Lambda::Function").items():
        if logical_id == "SampleServicesFunction":
            continue
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false", logical_id
        assert variables.get("POWERTOOLS_LOGGER_LOG_EVENT", "false") == "false", logical_id


def test_the_translation_is_of_this_template() -> None:
    # the check reads what SAM makes of today's file (a stale copy would pass anything)
    assert Path(ROOT / "template.yaml").read_text().count("AWS::ApiGatewayV2::Route") == len(
        of_type(resolved(CASES["IAM, sample services"]), "AWS::ApiGatewayV2::Route")
    )


def test_every_alarm_about_workflows_or_dead_letters_names_the_cli_command_that_lists_them() -> None:
    from devstack.template import load_template

    resources = load_template(ROOT / "template.yaml")["Resources"]
    alarms = {k: v["Properties"] for k, v in resources.items() if v["Type"] == "AWS::CloudWatch::Alarm"}
    expected = {
        "CompensationFailedAlarm": "list --status COMPENSATION_FAILED",
        "WorkflowsHeldAlarm": "list --status HELD",
        "ResponseDeadLetterAlarm": "dlq list ResponseDeadLetterQueue",
        "FlightsDeadLetterAlarm": "dlq list FlightsDeadLetterQueue",
        "SupervisorFunctionErrorsAlarm": "overdue",
    }
    for logical_id, command in expected.items():
        description = alarms[logical_id]["AlarmDescription"]
        assert isinstance(description, dict), logical_id  # !Sub: the command names this stack
        assert f"sasflow --stack ${{AWS::StackName}} {command}" in " ".join(description["Fn::Sub"].split()), logical_id
    # every dead-letter queue's alarm tells how to redrive it
    for logical_id, alarm in alarms.items():
        if alarm.get("Namespace") == "AWS/SQS":
            assert "dlq redrive" in json.dumps(alarm["AlarmDescription"]), logical_id
            assert "--reason WHY" in json.dumps(alarm["AlarmDescription"]), logical_id


def test_the_line_of_each_workflows_end_is_the_workflow_cost_metric_of_its_definition() -> None:
    from devstack.template import load_template

    template = load_template(ROOT / "template.yaml")
    resources = template["Resources"]
    filters = {k: v["Properties"] for k, v in resources.items() if v["Type"] == "AWS::Logs::MetricFilter"}
    # every engine function that can end a workflow (a reply, a timeout, a cancel, an operator's action) has one
    assert {f["LogGroupName"]["Ref"] for f in filters.values()} == {
        "SchedulerLogGroup",
        "SupervisorLogGroup",
        "ApiLogGroup",
        "OpsLogGroup",
    }
    for logical_id, metric_filter in filters.items():
        # the scheduler's "moved" line of a workflow's end carries "cost" and "definition" (scheduler.log_moves)
        assert metric_filter["FilterPattern"] == '{ $.message = "moved" && $.cost > 0 }', logical_id
        [metric] = metric_filter["MetricTransformations"]
        assert (metric["MetricNamespace"], metric["MetricName"], metric["MetricValue"]) == (
            "Sasflow",
            "WorkflowCost",
            "$.cost",
        )
        assert metric["Dimensions"] == [{"Key": "Definition", "Value": "$.definition"}], logical_id
    # the alarm is there only when a definition is named, and a rule refuses it without a baseline
    alarm = resources["WorkflowCostAlarm"]
    assert alarm["Condition"] == "CostAlarm"
    assert template["Conditions"]["CostAlarm"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "CostAlarmDefinition"}, ""]}]}
    rule = template["Rules"]["CostAlarmNeedsABaseline"]
    assert rule["Assertions"][0]["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "CostAlarmBaselineDollars"}, "0"]}]}
    [stat, ratio] = alarm["Properties"]["Metrics"]
    assert stat["MetricStat"]["Stat"] == "p50" and stat["MetricStat"]["Period"] == 3600
    assert ratio["Expression"] == {"Fn::Sub": "cost / ${CostAlarmBaselineDollars}"}
    assert (alarm["Properties"]["Threshold"], alarm["Properties"]["ComparisonOperator"]) == (
        2,
        "GreaterThanOrEqualToThreshold",
    )

"""The role check (devstack.iam): IAM's evaluation, the mapping of API calls to what IAM authorizes, the roles read
from the translated template, and the botocore hook that refuses a call as AWS would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from devstack.iam.guard import acting_as, clear_refusals, event_source_refusals, install
from devstack.iam.policy import AuthRequest, PolicyError, evaluate, statements_of
from devstack.iam.requests import CallContext, UnmappedOperation, authorizations
from devstack.iam.roles import Principal, principals
from devstack.inprocess import FAKE_AWS_ENV, environment
from devstack.template import Stack
from tests.support.lambdas import ROOT

TABLE = "arn:aws:dynamodb:us-east-1:123456789012:table/T"
WHERE = CallContext("us-east-1", "123456789012", {"T": {"": "pk", "by-shard": "shard"}})


def policy(*statements: dict[str, object]) -> list:  # type: ignore[type-arg]
    return statements_of({"Statement": list(statements)}, "test")


def test_an_explicit_deny_wins_then_any_allow_else_the_request_is_implicitly_denied() -> None:
    allow = {"Sid": "A", "Effect": "Allow", "Action": "dynamodb:Get*", "Resource": TABLE}
    deny = {"Sid": "D", "Effect": "Deny", "Action": "dynamodb:GetItem", "Resource": "*"}
    get = AuthRequest("dynamodb:GetItem", TABLE)
    assert evaluate(policy(allow), get).statement.sid == "A"  # type: ignore[union-attr]
    denied = evaluate(policy(allow, deny), get)
    assert (denied.allowed, denied.statement.sid) == (False, "D")  # type: ignore[union-attr]
    put = evaluate(policy(allow), AuthRequest("dynamodb:PutItem", TABLE))
    assert (put.allowed, put.statement) == (False, None)
    assert put.reason == "because no identity-based policy allows the action"
    # actions ignore case, resources do not; ? is one character and [..] is no wildcard in IAM
    assert evaluate(policy(allow), AuthRequest("DynamoDB:getitem", TABLE)).allowed
    assert not evaluate(policy(allow), AuthRequest("dynamodb:GetItem", TABLE.lower())).allowed
    one = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/[ab]?"}
    assert evaluate(policy(one), AuthRequest("s3:GetObject", "arn:aws:s3:::b/[ab]x")).allowed
    assert not evaluate(policy(one), AuthRequest("s3:GetObject", "arn:aws:s3:::b/ax")).allowed


def test_a_table_grant_is_not_an_index_grant_and_notaction_excludes() -> None:
    statements = policy(
        {"Effect": "Allow", "Action": "dynamodb:Query", "Resource": TABLE},
        {"Effect": "Allow", "NotAction": "dynamodb:Delete*", "Resource": "arn:aws:s3:::*"},
    )
    assert evaluate(statements, AuthRequest("dynamodb:Query", TABLE)).allowed
    assert not evaluate(statements, AuthRequest("dynamodb:Query", f"{TABLE}/index/by-shard")).allowed
    assert evaluate(statements, AuthRequest("s3:GetObject", "arn:aws:s3:::b/k")).allowed
    assert not evaluate(statements, AuthRequest("dynamodb:DeleteItem", "arn:aws:s3:::b/k")).allowed


def test_leading_keys_conditions_pass_only_the_keys_they_name() -> None:
    statements = policy(
        {
            "Effect": "Allow",
            "Action": ["dynamodb:GetItem", "dynamodb:BatchGetItem"],
            "Resource": TABLE,
            "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["agent#flights#*", "cb#flights"]}},
        }
    )

    def allowed(action: str, *keys: str) -> bool:
        return evaluate(statements, AuthRequest(action, TABLE, {"dynamodb:LeadingKeys": list(keys)})).allowed

    assert allowed("dynamodb:GetItem", "agent#flights#wf-1")
    assert allowed("dynamodb:GetItem", "cb#flights")
    assert not allowed("dynamodb:GetItem", "agent#hotels#wf-1")
    assert allowed("dynamodb:BatchGetItem", "agent#flights#1", "agent#flights#2")
    assert not allowed("dynamodb:BatchGetItem", "agent#flights#1", "agent#hotels#2")


def test_bool_null_and_ifexists_conditions_and_an_operator_it_cannot_evaluate_is_refused_by_name() -> None:
    tls = policy(
        {"Effect": "Deny", "Action": "*", "Resource": "*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
    )
    assert evaluate(tls, AuthRequest("s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": ["false"]})).statement
    assert (
        evaluate(tls, AuthRequest("s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": ["true"]})).statement
        is None
    )
    prefix = policy(
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "*",
            "Condition": {"StringLikeIfExists": {"s3:prefix": "wf/*"}},
        }
    )
    assert evaluate(prefix, AuthRequest("s3:ListBucket", "arn:aws:s3:::b")).allowed  # absent key: IfExists holds
    assert evaluate(prefix, AuthRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["wf/1/"]})).allowed
    assert not evaluate(prefix, AuthRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": ["other/"]})).allowed
    with pytest.raises(PolicyError, match=r"test#Dated: condition operator 'DateGreaterThan' cannot be evaluated"):
        policy(
            {
                "Sid": "Dated",
                "Effect": "Allow",
                "Action": "*",
                "Resource": "*",
                "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2026-01-01"}},
            }
        )
    with pytest.raises(PolicyError, match="exactly one of Action and NotAction"):
        policy({"Effect": "Allow", "Resource": "*"})


def test_api_calls_map_to_what_iam_authorizes_not_to_their_own_names() -> None:
    def pairs(service: str, operation: str, params: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
        return [(r.action, r.resource) for r in authorizations(service, operation, params, WHERE)]

    queue = "https://sqs.us-east-1.amazonaws.com/123456789012/requests"
    queue_arn = "arn:aws:sqs:us-east-1:123456789012:requests"
    assert pairs("sqs", "SendMessageBatch", {"QueueUrl": queue, "Entries": []}) == [("sqs:SendMessage", queue_arn)]
    local = "http://127.0.0.1:4566/123456789012/requests"
    assert pairs("sqs", "DeleteMessageBatch", {"QueueUrl": local, "Entries": []}) == [("sqs:DeleteMessage", queue_arn)]
    batch = {"RequestItems": {"T": {"Keys": [{"pk": {"S": "a"}}]}, "U": {"Keys": []}}}
    assert pairs("dynamodb", "BatchGetItem", batch) == [
        ("dynamodb:BatchGetItem", TABLE),
        ("dynamodb:BatchGetItem", "arn:aws:dynamodb:us-east-1:123456789012:table/U"),
    ]
    query = {
        "TableName": "T",
        "IndexName": "by-shard",
        "KeyConditionExpression": "#s = :s AND due <= :now",
        "ExpressionAttributeNames": {"#s": "shard"},
        "ExpressionAttributeValues": {":s": {"N": "7"}, ":now": {"N": "1"}},
    }
    [request] = authorizations("dynamodb", "Query", query, WHERE)
    assert (request.resource, request.context["dynamodb:LeadingKeys"]) == (f"{TABLE}/index/by-shard", ["7"])
    transact = {
        "TransactItems": [
            {"Put": {"TableName": "T", "Item": {"pk": {"S": "a"}}}},
            {"ConditionCheck": {"TableName": "T", "Key": {"pk": {"S": "b"}}, "ConditionExpression": "x"}},
        ]
    }
    assert [
        (r.action, r.context["dynamodb:LeadingKeys"])
        for r in authorizations("dynamodb", "TransactWriteItems", transact, WHERE)
    ] == [
        ("dynamodb:PutItem", ["a"]),
        ("dynamodb:ConditionCheckItem", ["b"]),
    ]
    copy = {
        "Bucket": "b",
        "Key": "new",
        "CopySource": {"Bucket": "src", "Key": "old"},
        "TaggingDirective": "REPLACE",
        "Tagging": "a=b",
    }
    assert pairs("s3", "CopyObject", copy) == [
        ("s3:GetObject", "arn:aws:s3:::src/old"),
        ("s3:PutObject", "arn:aws:s3:::b/new"),
        ("s3:PutObjectTagging", "arn:aws:s3:::b/new"),
    ]
    assert pairs("s3", "HeadObject", {"Bucket": "b", "Key": "k"}) == [("s3:GetObject", "arn:aws:s3:::b/k")]
    assert pairs("cloudwatch", "PutMetricData", {"Namespace": "Sasflow", "MetricData": []}) == [
        ("cloudwatch:PutMetricData", "*")
    ]
    with pytest.raises(UnmappedOperation, match=r"dynamodb:DeleteTable has no IAM mapping"):
        authorizations("dynamodb", "DeleteTable", {"TableName": "T"}, WHERE)


@pytest.fixture(scope="module")
def roles() -> dict[str, Principal]:
    return principals(Stack.from_file(ROOT / "template.yaml"))


def test_each_functions_role_is_read_from_the_translated_template_with_sams_additions(
    roles: dict[str, Principal],
) -> None:
    scheduler = roles["SchedulerFunction"]
    assert scheduler.role == "SchedulerFunctionRole"
    assert (
        scheduler.arn
        == "arn:aws:sts::123456789012:assumed-role/sasflow-SchedulerFunctionRole/sasflow-SchedulerFunction"
    )
    sources = {s.source for s in scheduler.statements}
    assert {"AWSLambdaBasicExecutionRole", "AgentRequestQueuesSendPolicy", "PayloadObjectsEnginePolicy"} <= sources
    state = "arn:aws:dynamodb:us-east-1:123456789012:table/sasflow-StateTable"
    assert evaluate(scheduler.statements, AuthRequest("dynamodb:BatchGetItem", state)).allowed
    assert not evaluate(scheduler.statements, AuthRequest("dynamodb:Scan", state)).allowed
    assert not evaluate(
        scheduler.without("dynamodb:BatchGetItem").statements, AuthRequest("dynamodb:BatchGetItem", state)
    ).allowed
    with pytest.raises(ValueError, match="names no dynamodb:Scan"):
        scheduler.without("dynamodb:Scan")
    # the API reads its secret by the ARN CloudFormation's !Ref gives
    secret = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sasflow-WorkflowIdSecret"
    assert evaluate(roles["ApiFunction"].statements, AuthRequest("secretsmanager:GetSecretValue", secret)).allowed
    assert not evaluate(
        roles["SchedulerFunction"].statements, AuthRequest("secretsmanager:GetSecretValue", secret)
    ).allowed


@pytest.fixture
def aws() -> Iterator[None]:
    with environment(FAKE_AWS_ENV), mock_aws():
        install()
        clear_refusals()
        yield
        clear_refusals()


def test_a_refused_call_raises_the_services_own_access_denied_inside_the_function_and_is_recorded(
    aws: None, roles: dict[str, Principal]
) -> None:
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    dynamodb.create_table(
        TableName="sasflow-StateTable",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with acting_as(roles["SchedulerFunction"]):
        dynamodb.get_item(TableName="sasflow-StateTable", Key={"pk": {"S": "WF#1"}})  # allowed: no refusal
        with pytest.raises(ClientError) as refused:
            dynamodb.scan(TableName="sasflow-StateTable")
    error = refused.value.response["Error"]
    assert error["Code"] == "AccessDeniedException"
    assert error["Message"] == (
        "User: arn:aws:sts::123456789012:assumed-role/sasflow-SchedulerFunctionRole/sasflow-SchedulerFunction is not "
        "authorized to perform: dynamodb:Scan on resource: arn:aws:dynamodb:us-east-1:123456789012:table/"
        "sasflow-StateTable because no identity-based policy allows the action"
    )
    [refusal] = clear_refusals()
    assert (refusal.function, refusal.action) == ("SchedulerFunction", "dynamodb:Scan")
    assert json.loads(refusal.missing)["Resource"] == "arn:aws:dynamodb:us-east-1:123456789012:table/sasflow-StateTable"
    # outside a function nothing is checked
    assert dynamodb.scan(TableName="sasflow-StateTable")["Count"] == 0
    # SQS answers AccessDenied, and an unmapped operation is refused by name
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="other")["QueueUrl"]
    with acting_as(roles["SchedulerFunction"]):
        with pytest.raises(ClientError) as denied:
            sqs.send_message(QueueUrl=url, MessageBody="{}")
        with pytest.raises(ClientError, match="sqs:PurgeQueue has no IAM mapping"):
            sqs.purge_queue(QueueUrl=url)
    assert denied.value.response["Error"]["Code"] == "AccessDenied"
    assert [r.operation for r in clear_refusals()] == ["sqs:SendMessage", "sqs:PurgeQueue"]


def test_a_role_crosses_to_a_worker_process_as_json_unchanged(roles: dict[str, Principal]) -> None:
    agent = roles["FlightsAgentFunction"]
    assert Principal.from_json(agent.to_json()) == agent


def test_an_sqs_event_source_needs_receive_delete_and_attributes_on_its_queue_as_lambda_checks_at_creation(
    roles: dict[str, Principal],
) -> None:
    queue = "arn:aws:sqs:us-east-1:123456789012:sasflow-ResponseQueue"
    assert event_source_refusals(roles["SchedulerFunction"], queue) == []
    [refusal] = event_source_refusals(roles["SchedulerFunction"].without("sqs:ReceiveMessage"), queue)
    assert (refusal.operation, refusal.action, refusal.resource) == (
        "lambda:CreateEventSourceMapping",
        "sqs:ReceiveMessage",
        queue,
    )
    other = "arn:aws:sqs:us-east-1:123456789012:sasflow-FlightsRequestQueue"
    assert [r.action for r in event_source_refusals(roles["SchedulerFunction"], other)] == [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
    ]


def test_a_policy_whose_intrinsic_cannot_be_resolved_fails_naming_the_role(tmp_path: Any) -> None:
    # Given a template whose function's policy names a resource the template does not have
    template = tmp_path / "template.yaml"
    template.write_text(
        "Transform: AWS::Serverless-2016-10-31\n"
        "Resources:\n"
        "  Fn:\n"
        "    Type: AWS::Serverless::Function\n"
        "    Properties:\n"
        "      Runtime: python3.12\n"
        "      Handler: app.handler\n"
        "      CodeUri: code/\n"
        "      Policies:\n"
        "        - Statement:\n"
        "            - Effect: Allow\n"
        "              Action: s3:GetObject\n"
        "              Resource: !GetAtt MissingBucket.Arn\n"
    )
    # When its roles are read / Then the run fails, naming the role and the reference
    with pytest.raises(PolicyError, match=r"FnRole Policies: .*MissingBucket"):
        principals(Stack.from_file(template))

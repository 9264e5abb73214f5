"""devstack.provision: tables, queues and alarms built from template.yaml inside moto.mock_aws."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from devstack.provision import ProvisionError, UnsupportedResourceError, describe, provision
from devstack.template import Stack, load_template

REPO_TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
REQUEST_QUEUES = {
    "ResponseQueue": "ResponseDeadLetterQueue",
    "FlightsRequestQueue": "FlightsDeadLetterQueue",
    "HotelsRequestQueue": "HotelsDeadLetterQueue",
    "PaymentsRequestQueue": "PaymentsDeadLetterQueue",
}


@pytest.fixture
def provisioned() -> Iterator[tuple[Stack, dict[str, str]]]:
    """The repository's template provisioned into moto's in-process mock, as integration tests do it."""
    with mock_aws():
        stack = Stack.from_file(REPO_TEMPLATE)
        yield stack, provision(stack)


def _client(service: str) -> Any:
    return boto3.client(service, region_name="us-east-1")


def test_state_table_has_the_sparse_deadline_index(provisioned: tuple[Stack, dict[str, str]]) -> None:
    _, physical = provisioned
    # When the state table is described
    table = _client("dynamodb").describe_table(TableName=physical["StateTable"])["Table"]
    # Then its keys, billing and the deadline index match the template
    assert physical["StateTable"] == "sasflow-StateTable"
    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    assert table["SSEDescription"]["Status"] == "ENABLED"
    indexes = {index["IndexName"]: index for index in table["GlobalSecondaryIndexes"]}
    deadline = indexes["deadline-index"]
    assert deadline["KeySchema"] == [
        {"AttributeName": "dl_shard", "KeyType": "HASH"},
        {"AttributeName": "complete_by", "KeyType": "RANGE"},
    ]
    # The keys and what the operators' listing shows, none of which changes on the happy path while the entry
    # exists: a write that leaves the earliest complete-by where it was does not touch the index
    projection = {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["status", "dname", "created_at", "trouble"]}
    assert deadline["Projection"] == projection
    declared = load_template(REPO_TEMPLATE)["Resources"]["StateTable"]["Properties"]["GlobalSecondaryIndexes"][0]
    assert declared["Projection"] == projection
    # and the sparse attention index: only the workflows that wait for a person
    attention = indexes["attention-index"]
    assert attention["KeySchema"] == [
        {"AttributeName": "attn", "KeyType": "HASH"},
        {"AttributeName": "attn_since", "KeyType": "RANGE"},
    ]
    attribute_types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert attribute_types["complete_by"] == "N"


def test_ttl_and_point_in_time_recovery_are_enabled(provisioned: tuple[Stack, dict[str, str]]) -> None:
    _, physical = provisioned
    dynamodb = _client("dynamodb")
    ttl = dynamodb.describe_time_to_live(TableName=physical["StateTable"])["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}
    idempotency_ttl = dynamodb.describe_time_to_live(TableName=physical["IdempotencyTable"])["TimeToLiveDescription"]
    assert idempotency_ttl["AttributeName"] == "expiration"
    backups = dynamodb.describe_continuous_backups(TableName=physical["StateTable"])["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"


@pytest.mark.parametrize(("queue", "dead_letter_queue"), sorted(REQUEST_QUEUES.items()))
def test_each_queue_redrives_to_its_dead_letter_queue(
    provisioned: tuple[Stack, dict[str, str]], queue: str, dead_letter_queue: str
) -> None:
    _, physical = provisioned
    sqs = _client("sqs")
    attributes = sqs.get_queue_attributes(QueueUrl=physical[queue], AttributeNames=["All"])["Attributes"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=physical[dead_letter_queue], AttributeNames=["QueueArn"])
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"],
        "maxReceiveCount": 5,
    }
    assert dlq_arn["Attributes"]["QueueArn"] == f"arn:aws:sqs:us-east-1:123456789012:sasflow-{dead_letter_queue}"
    assert attributes["VisibilityTimeout"] == "180"
    assert attributes["MessageRetentionPeriod"] == "345600"
    assert attributes["SqsManagedSseEnabled"] == "true"


def test_returned_physical_ids_are_the_stack_references(provisioned: tuple[Stack, dict[str, str]]) -> None:
    stack, physical = provisioned
    queue_urls = set(_client("sqs").list_queues()["QueueUrls"])
    # Every queue of the template exists, under the URL that !Ref gives the functions
    for logical_id in stack.queue_logical_ids():
        assert physical[logical_id] == stack.physical_id(logical_id)
        assert physical[logical_id] in queue_urls
    assert stack.functions()[0].environment["RESPONSE_QUEUE_URL"] == physical["ResponseQueue"]


def test_alarms_are_created_with_their_actions_and_the_alarm_topic_exists(
    provisioned: tuple[Stack, dict[str, str]],
) -> None:
    _, physical = provisioned
    alarms = {a["AlarmName"]: a for a in _client("cloudwatch").describe_alarms()["MetricAlarms"]}
    single = alarms[physical["CompensationFailedAlarm"]]
    declared = load_template(REPO_TEMPLATE)["Resources"]["CompensationFailedAlarm"]["Properties"]
    assert (single["Namespace"], single["MetricName"]) == (declared["Namespace"], declared["MetricName"])
    assert (single["Threshold"], single["ComparisonOperator"]) == (1.0, "GreaterThanOrEqualToThreshold")
    topics = [t["TopicArn"] for t in _client("sns").list_topics()["Topics"]]
    assert physical["AlarmTopic"] in topics
    for name in (physical["CompensationFailedAlarm"], physical["FlightsDeadLetterAlarm"]):
        assert alarms[name]["AlarmActions"] == [physical["AlarmTopic"]]
    dead = alarms[physical["FlightsDeadLetterAlarm"]]
    assert dead["Dimensions"] == [{"Name": "QueueName", "Value": "sasflow-FlightsDeadLetterQueue"}]


def test_a_metric_math_alarm_is_created_with_its_queries(tmp_path: Path) -> None:
    template = tmp_path / "template.yaml"
    template.write_text(
        json.dumps(
            {
                "Resources": {
                    "Dlq": {"Type": "AWS::SQS::Queue", "Properties": {}},
                    "Total": {
                        "Type": "AWS::CloudWatch::Alarm",
                        "Properties": {
                            "EvaluationPeriods": 1,
                            "Threshold": 1,
                            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                            "Metrics": [
                                {"Id": "total", "Expression": "dlq", "Label": "all"},
                                {
                                    "Id": "dlq",
                                    "ReturnData": False,
                                    "MetricStat": {
                                        "Metric": {
                                            "Namespace": "AWS/SQS",
                                            "MetricName": "ApproximateNumberOfMessagesVisible",
                                            "Dimensions": [
                                                {"Name": "QueueName", "Value": {"Fn::GetAtt": ["Dlq", "QueueName"]}}
                                            ],
                                        },
                                        "Period": 60,
                                        "Stat": "Maximum",
                                    },
                                },
                            ],
                        },
                    },
                }
            }
        )
    )
    with mock_aws():
        physical = provision(Stack.from_file(template))
        [alarm] = _client("cloudwatch").describe_alarms(AlarmNames=[physical["Total"]])["MetricAlarms"]
    assert [query["Id"] for query in alarm["Metrics"]] == ["total", "dlq"]
    assert alarm["Metrics"][1]["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "QueueName", "Value": "sasflow-Dlq"}]


def test_condition_false_resources_are_not_created() -> None:
    with mock_aws():
        stack = Stack.from_file(REPO_TEMPLATE, parameters={"DeploySampleServices": "false"})
        physical = provision(stack)
        assert "SampleLedgerTable" not in physical
        assert "sasflow-SampleLedgerTable" not in _client("dynamodb").list_tables()["TableNames"]


def test_unsupported_resource_type_fails_before_creating_anything(tmp_path: Path) -> None:
    # Given a template with a queue and a type devstack neither creates nor emulates
    path = tmp_path / "t.yaml"
    path.write_text("Resources:\n  Q:\n    Type: AWS::SQS::Queue\n  B:\n    Type: AWS::Kinesis::Stream\n")
    with mock_aws():
        stack = Stack.from_file(path)
        # When it is provisioned, Then the error names the resource, and no queue was created
        with pytest.raises(UnsupportedResourceError, match=r"B \(AWS::Kinesis::Stream\)"):
            provision(stack)
        assert _client("sqs").list_queues().get("QueueUrls", []) == []
    assert describe(stack)[1] == (
        "B",
        "AWS::Kinesis::Stream",
        "unsupported: provision() raises for AWS::Kinesis::Stream",
    )


def test_unmapped_property_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("Resources:\n  Q:\n    Type: AWS::SQS::Queue\n    Properties:\n      Surprise: 1\n")
    with mock_aws(), pytest.raises(UnsupportedResourceError, match=r"\['Surprise'\]"):
        provision(Stack.from_file(path))


def test_without_a_local_target_nothing_is_attempted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with pytest.raises(ProvisionError, match="no local AWS target"):
        provision(Stack.from_file(REPO_TEMPLATE))


def test_describe_accounts_for_every_template_resource() -> None:
    stack = Stack.from_file(REPO_TEMPLATE, parameters={"DeploySampleServices": "false"})
    rows = {logical_id: (rtype, how) for logical_id, rtype, how in describe(stack)}
    assert set(rows) == set(load_template(REPO_TEMPLATE)["Resources"])
    assert rows["StateTable"] == ("AWS::DynamoDB::Table", "created in moto: table sasflow-StateTable")
    assert rows["SampleLedgerTable"][1] == "skipped: condition SampleServices is false"
    assert rows["SchedulerFunction"][1].startswith("emulated in-process: worker processes running scheduler_handler")
    assert "SQS ResponseQueue (batch 10)" in rows["SchedulerFunction"][1]
    assert not [row for row in rows.values() if row[1].startswith("unsupported")]


def test_describe_names_http_api_properties_that_are_not_emulated(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "Resources:\n  Api:\n    Type: AWS::Serverless::HttpApi\n    Properties:\n      Description: d\n"
        "      StageName: prod\n      CorsConfiguration: {AllowOrigins: ['*']}\n"
    )
    (_, _, how) = describe(Stack.from_file(path))[0]
    assert how.endswith("(not emulated: CorsConfiguration, StageName)")


def test_the_payload_bucket_is_encrypted_private_tls_only_and_expires_ended_workflows_payloads(
    provisioned: tuple[Stack, dict[str, str]],
) -> None:
    # Given the repo's template provisioned in moto
    stack, physical = provisioned
    bucket = physical["PayloadBucket"]
    s3 = _client("s3")
    # Then the bucket is the one the functions are given, encrypted with SSE-S3, and blocks every public access
    assert stack.function("SchedulerFunction").environment["PAYLOAD_BUCKET"] == bucket
    [rule] = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert block == dict.fromkeys(
        ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"), True
    )
    # And its TLS-only policy is left out locally (plain HTTP on loopback; moto would refuse every request)
    with pytest.raises(s3.exceptions.ClientError, match="NoSuchBucketPolicy"):
        s3.get_bucket_policy(Bucket=bucket)
    # And only objects re-stamped terminal expire, after the workflows' retention
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    ended = rules["EndedWorkflowsPayloads"]
    assert ended["Filter"] == {"Tag": {"Key": "claim-check", "Value": "terminal"}}
    assert ended["Expiration"] == {"Days": int(stack.parameters["TerminalRetentionDays"])}
    pending = rules["PendingPayloads"]
    assert (pending["Filter"], pending["Expiration"]) == (
        {"Tag": {"Key": "claim-check", "Value": "pending"}},
        {"Days": 1},
    )
    assert rules["IncompleteUploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}

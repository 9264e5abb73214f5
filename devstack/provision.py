"""Create the template's tables, queues and alarms in the current AWS target (a moto server or ``mock_aws``).

Every resource type of the template is accounted for: it is either created here (`CREATED_IN_MOTO`), emulated
in-process by the local stack (`EMULATED_IN_PROCESS`), or refused with `UnsupportedResourceError` before anything
is created, so nothing in the template is skipped silently. The same holds for properties: a property this module
does not map raises instead of being dropped.

Integration tests build their tables and queues from the template with::

    with moto.mock_aws():
        provision(Stack.from_file("template.yaml"))
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from devstack import _aws
from devstack.template import ExistingBucket, ExistingQueue, ScheduleEventSpec, SqsEventSpec, Stack, TemplateError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

__all__ = [
    "CREATED_IN_MOTO",
    "EMULATED_IN_PROCESS",
    "ProvisionError",
    "UnsupportedResourceError",
    "describe",
    "provision",
]

logger = logging.getLogger(__name__)

CREATED_IN_MOTO: Final = frozenset(
    {
        "AWS::DynamoDB::Table",
        "AWS::SQS::Queue",
        "AWS::CloudWatch::Alarm",
        "AWS::SecretsManager::Secret",
        "AWS::Logs::LogGroup",
        "AWS::Logs::MetricFilter",
        "AWS::SNS::Topic",
        "AWS::SNS::Subscription",
        "AWS::S3::Bucket",
        "AWS::S3::BucketPolicy",
    }
)
"""Resource types that `provision` creates through the AWS API."""

_HTTP_API_EMULATOR: Final = "API Gateway HTTP API emulator on 127.0.0.1 (devstack.event_sources)"
EMULATED_IN_PROCESS: Final = {
    "AWS::Serverless::Function": "Lambda worker processes (devstack.lambda_runtime) driven by its events",
    "AWS::Serverless::HttpApi": _HTTP_API_EMULATOR,
    "AWS::Serverless::LayerVersion": "layer folder put on the workers' sys.path",
    "AWS::ApiGatewayV2::Api": _HTTP_API_EMULATOR,
    "AWS::ApiGatewayV2::Stage": f"{_HTTP_API_EMULATOR}: the $default stage (throttling and access logs not emulated)",
    "AWS::ApiGatewayV2::Route": f"{_HTTP_API_EMULATOR}: the route, its function and its authorization (SigV4)",
    "AWS::ApiGatewayV2::Integration": f"{_HTTP_API_EMULATOR}: the Lambda proxy integration of its routes",
    "AWS::ApiGatewayV2::Authorizer": f"{_HTTP_API_EMULATOR}: JWT routes are refused locally (IAM only)",
    "AWS::Lambda::EventSourceMapping": "SQS poller threads (devstack.event_sources.SqsPoller) with its settings",
    "AWS::Scheduler::Schedule": "a thread that sends its input to its target queue at each tick (devstack.schedules)",
    "AWS::Events::Rule": "python -m devstack emit matches its pattern and sends the event to its target queues",
    "AWS::Events::EventBus": "a bus name python -m devstack emit puts events on (--bus)",
}
"""Resource types that the local stack runs in-process instead of creating them, and how."""

NOT_ENFORCED_OFFLINE: Final = {
    "AWS::IAM::ManagedPolicy": "IAM is not enforced offline; tests check the translated policies",
    "AWS::Lambda::Permission": "the emulators invoke functions directly",
    "AWS::IAM::Role": "a role a service assumes (EventBridge Scheduler's); the local emulators act without it",
    "AWS::SQS::QueuePolicy": "who may send to a queue (an EventBridge rule); the local emit sends without it",
}
"""Resource types that only grant permissions, which nothing checks offline (the template tests read them)."""

_HTTP_API_EMULATED: Final = frozenset({"Description", "Tags"})
"""HttpApi properties that change nothing locally (``StageName: $default`` neither)."""

HOW_CREATED: Final = "created in moto"
HOW_EMULATED: Final = "emulated in-process"
HOW_SKIPPED: Final = "skipped"
HOW_UNSUPPORTED: Final = "unsupported"


class ProvisionError(RuntimeError):
    """A resource could not be created in the target."""


class UnsupportedResourceError(ProvisionError):
    """The template holds a resource type or property that the local stack can neither create nor emulate."""


# ------------------------------------------------------------------------------------------------- clients


def _check_local_target(endpoint_url: str | None) -> None:
    """Refuse to run against a real account: there must be an endpoint, or moto's mock must be active."""
    if endpoint_url or os.environ.get("AWS_ENDPOINT_URL"):
        return
    try:
        from moto.core.models import botocore_stubber

        mocked = bool(botocore_stubber.enabled)
    except ImportError:  # pragma: no cover - moto is a dev dependency
        mocked = False
    if not mocked:
        raise ProvisionError(
            "no local AWS target: pass endpoint_url (a moto server), set AWS_ENDPOINT_URL, or call provision() "
            "inside moto.mock_aws(); devstack never creates resources in a real account"
        )


def _client(service: str, stack: Stack, endpoint_url: str | None) -> Any:
    return _aws.client(service, region=stack.region, endpoint_url=endpoint_url)


# ------------------------------------------------------------------------------------------------- mapping


def _unknown_properties(logical_id: str, props: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(props) - known)
    if unknown:
        raise UnsupportedResourceError(
            f"{logical_id}: properties {unknown} are not mapped by devstack.provision; map them there "
            "rather than letting the local stack differ from the deployed one"
        )


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() == "true"


def _table_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::DynamoDB::Table`` properties to a ``CreateTable`` request (the CloudFormation → API names)."""
    _unknown_properties(
        logical_id,
        props,
        {
            "TableName",
            "AttributeDefinitions",
            "KeySchema",
            "BillingMode",
            "GlobalSecondaryIndexes",
            "LocalSecondaryIndexes",
            "ProvisionedThroughput",
            "StreamSpecification",
            "SSESpecification",
            "TimeToLiveSpecification",
            "PointInTimeRecoverySpecification",
            "Tags",
            "TableClass",
            "DeletionProtectionEnabled",
        },
    )
    billing = str(props.get("BillingMode", "PROVISIONED"))
    request: dict[str, Any] = {
        "TableName": stack.physical_id(logical_id),
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": billing,
    }
    if billing == "PROVISIONED":
        request["ProvisionedThroughput"] = _throughput(props.get("ProvisionedThroughput"), logical_id)
    gsis = []
    for index in props.get("GlobalSecondaryIndexes") or []:
        gsi: dict[str, Any] = {
            "IndexName": index["IndexName"],
            "KeySchema": index["KeySchema"],
            "Projection": _projection(index.get("Projection")),
        }
        if billing == "PROVISIONED":
            gsi["ProvisionedThroughput"] = _throughput(index.get("ProvisionedThroughput"), logical_id)
        gsis.append(gsi)
    if gsis:
        request["GlobalSecondaryIndexes"] = gsis
    lsis = [
        {
            "IndexName": index["IndexName"],
            "KeySchema": index["KeySchema"],
            "Projection": _projection(index["Projection"]),
        }
        for index in props.get("LocalSecondaryIndexes") or []
    ]
    if lsis:
        request["LocalSecondaryIndexes"] = lsis
    stream = props.get("StreamSpecification")
    if stream:
        request["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    sse = props.get("SSESpecification")
    if sse:
        spec: dict[str, Any] = {"Enabled": _as_bool(sse.get("SSEEnabled", False))}
        if "SSEType" in sse:
            spec["SSEType"] = sse["SSEType"]
        if "KMSMasterKeyId" in sse:
            spec["KMSMasterKeyId"] = sse["KMSMasterKeyId"]
        request["SSESpecification"] = spec
    if props.get("Tags"):
        request["Tags"] = [{"Key": str(tag["Key"]), "Value": str(tag["Value"])} for tag in props["Tags"]]
    if "TableClass" in props:
        request["TableClass"] = props["TableClass"]
    if "DeletionProtectionEnabled" in props:
        request["DeletionProtectionEnabled"] = _as_bool(props["DeletionProtectionEnabled"])
    return request


def _throughput(value: Any, logical_id: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ProvisionError(f"{logical_id}: BillingMode PROVISIONED needs ProvisionedThroughput")
    return {
        "ReadCapacityUnits": int(value["ReadCapacityUnits"]),
        "WriteCapacityUnits": int(value["WriteCapacityUnits"]),
    }


def _projection(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {"ProjectionType": "ALL"}
    projection: dict[str, Any] = {"ProjectionType": str(value.get("ProjectionType", "ALL"))}
    if value.get("NonKeyAttributes"):
        projection["NonKeyAttributes"] = [str(name) for name in value["NonKeyAttributes"]]
    return projection


_QUEUE_ATTRIBUTES: Final = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
)


def _queue_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::SQS::Queue`` properties to a ``CreateQueue`` request: every property becomes a string attribute."""
    _unknown_properties(
        logical_id, props, {*_QUEUE_ATTRIBUTES, "QueueName", "RedrivePolicy", "RedriveAllowPolicy", "Tags"}
    )
    attributes: dict[str, str] = {}
    for name in _QUEUE_ATTRIBUTES:
        if name in props:
            value = props[name]
            attributes[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    for name in ("RedrivePolicy", "RedriveAllowPolicy"):
        if name in props:
            policy = props[name]
            if isinstance(policy, str):
                policy = json.loads(policy)
            if name == "RedrivePolicy" and "maxReceiveCount" in policy:
                policy = {**policy, "maxReceiveCount": int(policy["maxReceiveCount"])}
            attributes[name] = json.dumps(policy)
    request: dict[str, Any] = {"QueueName": stack.queue_name(logical_id), "Attributes": attributes}
    if props.get("Tags"):
        request["tags"] = {str(tag["Key"]): str(tag["Value"]) for tag in props["Tags"]}
    return request


_ALARM_KEYS: Final = {
    "AlarmName",
    "AlarmDescription",
    "ActionsEnabled",
    "AlarmActions",
    "OKActions",
    "InsufficientDataActions",
    "MetricName",
    "Namespace",
    "Statistic",
    "ExtendedStatistic",
    "Dimensions",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "EvaluateLowSampleCountPercentile",
    "Metrics",
    "ThresholdMetricId",
    "Tags",
}


def _alarm_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::CloudWatch::Alarm`` properties to ``PutMetricAlarm`` (both the single-metric and Metrics forms)."""
    _unknown_properties(logical_id, props, set(_ALARM_KEYS))
    request: dict[str, Any] = {key: props[key] for key in _ALARM_KEYS if key in props}
    request["AlarmName"] = stack.physical_id(logical_id)
    for key in ("Period", "EvaluationPeriods", "DatapointsToAlarm"):
        if key in request:
            request[key] = int(request[key])
    if "Threshold" in request:
        request["Threshold"] = float(request["Threshold"])
    if "ActionsEnabled" in request:
        request["ActionsEnabled"] = _as_bool(request["ActionsEnabled"])
    if "Dimensions" in request:
        request["Dimensions"] = [{"Name": str(d["Name"]), "Value": str(d["Value"])} for d in request["Dimensions"]]
    metrics = []
    for query in request.get("Metrics") or []:
        query = dict(query)
        if "ReturnData" in query:
            query["ReturnData"] = _as_bool(query["ReturnData"])
        if "Period" in query:
            query["Period"] = int(query["Period"])
        if "MetricStat" in query:
            stat = dict(query["MetricStat"])
            stat["Period"] = int(stat["Period"])
            metric = dict(stat["Metric"])
            if "Dimensions" in metric:
                metric["Dimensions"] = [
                    {"Name": str(d["Name"]), "Value": str(d["Value"])} for d in metric["Dimensions"]
                ]
            stat["Metric"] = metric
            query["MetricStat"] = stat
        metrics.append(query)
    if metrics:
        request["Metrics"] = metrics
    if props.get("Tags"):
        request["Tags"] = [{"Key": str(tag["Key"]), "Value": str(tag["Value"])} for tag in props["Tags"]]
    return request


def _secret_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::SecretsManager::Secret`` to ``CreateSecret``; ``GenerateSecretString`` draws a random value here,
    as CloudFormation does (letters and digits, of the asked length)."""
    _unknown_properties(logical_id, props, {"Description", "GenerateSecretString", "SecretString", "Name", "Tags"})
    request: dict[str, Any] = {"Name": stack.physical_id(logical_id)}
    if "Description" in props:
        request["Description"] = str(props["Description"])
    if "SecretString" in props:
        request["SecretString"] = str(props["SecretString"])
    else:
        generate = dict(props.get("GenerateSecretString") or {})
        _unknown_properties(
            f"{logical_id}.GenerateSecretString", generate, {"PasswordLength", "ExcludePunctuation", "IncludeSpace"}
        )
        alphabet = string.ascii_letters + string.digits
        if not _as_bool(generate.get("ExcludePunctuation", False)):
            alphabet += "!#$%&()*+,-./:;<=>?@[]^_{|}~"
        length = int(generate.get("PasswordLength", 32))
        request["SecretString"] = "".join(secrets.choice(alphabet) for _ in range(length))
    return request


def _log_group_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::Logs::LogGroup`` (name and retention; the functions write their logs to files locally)."""
    _unknown_properties(logical_id, props, {"LogGroupName", "RetentionInDays", "Tags"})
    request: dict[str, Any] = {"logGroupName": stack.physical_id(logical_id)}
    if "RetentionInDays" in props:
        request["retentionInDays"] = int(props["RetentionInDays"])
    return request


def _metric_filter_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::Logs::MetricFilter`` to ``PutMetricFilter`` (stored; locally the functions' logs go to files, so
    nothing is filtered)."""
    _unknown_properties(logical_id, props, {"LogGroupName", "FilterName", "FilterPattern", "MetricTransformations"})
    names = {"MetricName": "metricName", "MetricNamespace": "metricNamespace", "MetricValue": "metricValue"}
    transformations = []
    for transformation in props["MetricTransformations"]:
        request: dict[str, Any] = {names[key]: str(transformation[key]) for key in names}
        if "Unit" in transformation:
            request["unit"] = str(transformation["Unit"])
        if "Dimensions" in transformation:
            request["dimensions"] = {str(d["Key"]): str(d["Value"]) for d in transformation["Dimensions"]}
        transformations.append(request)
    return {
        "logGroupName": str(props["LogGroupName"]),
        "filterName": str(props.get("FilterName") or stack.physical_id(logical_id)),
        "filterPattern": str(props["FilterPattern"]),
        "metricTransformations": transformations,
    }


def _topic_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::SNS::Topic`` to ``CreateTopic`` (moto keeps what is published; nothing is delivered)."""
    _unknown_properties(logical_id, props, {"TopicName", "DisplayName", "KmsMasterKeyId", "Tags"})
    attributes = {key: str(props[key]) for key in ("DisplayName", "KmsMasterKeyId") if key in props}
    return {"Name": stack.physical_id(logical_id).rsplit(":", 1)[1], "Attributes": attributes}


def _subscription_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::SNS::Subscription`` to ``Subscribe``."""
    _unknown_properties(logical_id, props, {"TopicArn", "Protocol", "Endpoint"})
    return {"TopicArn": str(props["TopicArn"]), "Protocol": str(props["Protocol"]), "Endpoint": str(props["Endpoint"])}


_BUCKET_PROPERTIES: Final = {
    "BucketName",
    "BucketEncryption",
    "PublicAccessBlockConfiguration",
    "OwnershipControls",
    "LifecycleConfiguration",
    "VersioningConfiguration",
    "NotificationConfiguration",
    "Tags",
}


def _bucket_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::S3::Bucket`` to ``CreateBucket`` and the calls that configure it (encryption, public access block,
    ownership, lifecycle): ``{"Bucket": name, "calls": [(operation, request), ...]}``."""
    _unknown_properties(logical_id, props, set(_BUCKET_PROPERTIES))
    name = stack.physical_id(logical_id)
    calls: list[tuple[str, dict[str, Any]]] = []
    if "BucketEncryption" in props:
        rules = [
            {
                "ApplyServerSideEncryptionByDefault": dict(rule["ServerSideEncryptionByDefault"]),
                **({"BucketKeyEnabled": _as_bool(rule["BucketKeyEnabled"])} if "BucketKeyEnabled" in rule else {}),
            }
            for rule in props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        ]
        calls.append(("put_bucket_encryption", {"ServerSideEncryptionConfiguration": {"Rules": rules}}))
    if "PublicAccessBlockConfiguration" in props:
        block = {key: _as_bool(value) for key, value in props["PublicAccessBlockConfiguration"].items()}
        calls.append(("put_public_access_block", {"PublicAccessBlockConfiguration": block}))
    if "OwnershipControls" in props:
        calls.append(("put_bucket_ownership_controls", {"OwnershipControls": dict(props["OwnershipControls"])}))
    if "LifecycleConfiguration" in props:
        rules = []
        for rule in props["LifecycleConfiguration"]["Rules"]:
            converted: dict[str, Any] = {"ID": str(rule["Id"]), "Status": str(rule["Status"])}
            tags = [{"Key": str(t["Key"]), "Value": str(t["Value"])} for t in rule.get("TagFilters", [])]
            if len(tags) == 1:
                converted["Filter"] = {"Tag": tags[0]}
            elif tags:
                converted["Filter"] = {"And": {"Tags": tags, "Prefix": str(rule.get("Prefix", ""))}}
            else:
                converted["Filter"] = {"Prefix": str(rule.get("Prefix", ""))}
            if "ExpirationInDays" in rule:
                converted["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
            if "AbortIncompleteMultipartUpload" in rule:
                days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
                converted["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
            rules.append(converted)
        calls.append(("put_bucket_lifecycle_configuration", {"LifecycleConfiguration": {"Rules": rules}}))
    if "VersioningConfiguration" in props:
        status = str(props["VersioningConfiguration"]["Status"])
        calls.append(("put_bucket_versioning", {"VersioningConfiguration": {"Status": status}}))
    if "NotificationConfiguration" in props:
        _unknown_properties(logical_id, props["NotificationConfiguration"], {"QueueConfigurations"})
        queues = []
        for configuration in props["NotificationConfiguration"].get("QueueConfigurations", []):
            rules = configuration.get("Filter", {}).get("S3Key", {}).get("Rules", [])
            queues.append(
                _queue_notification(
                    str(configuration["Queue"]),
                    str(configuration["Event"]),
                    [(str(rule["Name"]), str(rule["Value"])) for rule in rules],
                )
            )
        from devstack import moto_s3

        moto_s3.install()  # moto's notifications then carry the version id and sequencer S3's do
        # last: moto then sends S3's test event to each queue, as S3 does
        calls.append(
            ("put_bucket_notification_configuration", {"NotificationConfiguration": {"QueueConfigurations": queues}})
        )
    return {"Bucket": name, "calls": calls}


def _queue_notification(queue_arn: str, event: str, rules: list[tuple[str, str]]) -> dict[str, Any]:
    """One queue configuration of a bucket's notification (``PutBucketNotificationConfiguration``): the queue, the
    event, and the key's filter rules (name, value), none when there are none."""
    configuration: dict[str, Any] = {"QueueArn": queue_arn, "Events": [event]}
    if rules:
        configuration["Filter"] = {"Key": {"FilterRules": [{"Name": name, "Value": value} for name, value in rules]}}
    return configuration


def _bucket_policy_request(stack: Stack, logical_id: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """Map ``AWS::S3::BucketPolicy`` to ``PutBucketPolicy``, without its statements on ``aws:SecureTransport``.

    The local stack speaks plain HTTP on loopback, and moto evaluates bucket policies: a TLS-only statement would
    refuse every local request. It is left out here only (tests/integration/test_template_security.py checks it
    in what deploys); ``Policy`` is None when nothing else remains.
    """
    _unknown_properties(logical_id, props, {"Bucket", "PolicyDocument"})
    document = dict(props["PolicyDocument"])
    kept = [s for s in document.get("Statement", []) if "aws:SecureTransport" not in json.dumps(s.get("Condition", {}))]
    policy = json.dumps({**document, "Statement": kept}) if kept else None
    return {"Bucket": str(props["Bucket"]), "Policy": policy}


def _create_bucket(client: Any, request: dict[str, Any], exist_ok: bool) -> str:
    name = str(request["Bucket"])
    try:
        client.create_bucket(Bucket=name)  # us-east-1: no LocationConstraint
    except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
        if not exist_ok:
            raise ProvisionError(f"bucket {name} already exists in the target (same stack name twice?)") from None
    for operation, call in request["calls"]:
        getattr(client, operation)(Bucket=name, **call)
    return name


# ------------------------------------------------------------------------------------------------- creation


def _create_secret(client: Any, request: dict[str, Any], exist_ok: bool) -> str:
    try:
        client.create_secret(**request)
    except client.exceptions.ResourceExistsException:
        if not exist_ok:
            raise ProvisionError(f"secret {request['Name']} already exists in the target") from None
    return str(request["Name"])


def _create_log_group(client: Any, request: dict[str, Any], exist_ok: bool) -> str:
    name = str(request["logGroupName"])
    try:
        client.create_log_group(logGroupName=name)
    except client.exceptions.ResourceAlreadyExistsException:
        if not exist_ok:
            raise ProvisionError(f"log group {name} already exists in the target") from None
    if "retentionInDays" in request:
        client.put_retention_policy(logGroupName=name, retentionInDays=request["retentionInDays"])
    return name


def _create_table(client: DynamoDBClient, request: dict[str, Any], props: Mapping[str, Any], exist_ok: bool) -> str:
    name = str(request["TableName"])
    try:
        client.create_table(**request)
    except client.exceptions.ResourceInUseException:
        if not exist_ok:
            raise ProvisionError(f"table {name} already exists in the target (same stack name twice?)") from None
        return name
    ttl = props.get("TimeToLiveSpecification")
    if ttl and _as_bool(ttl.get("Enabled", False)):
        client.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"AttributeName": str(ttl["AttributeName"]), "Enabled": True},
        )
    pitr = props.get("PointInTimeRecoverySpecification")
    if pitr and _as_bool(pitr.get("PointInTimeRecoveryEnabled", False)):
        client.update_continuous_backups(
            TableName=name,
            PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
        )
    return name


def _create_queue(client: SQSClient, request: dict[str, Any], expected_url: str, exist_ok: bool) -> str:
    name = str(request["QueueName"])
    if not exist_ok:
        try:
            client.get_queue_url(QueueName=name)
        except client.exceptions.QueueDoesNotExist:
            pass
        else:
            raise ProvisionError(f"queue {name} already exists in the target (same stack name twice?)")
    url = client.create_queue(**request)["QueueUrl"]
    if url != expected_url:
        # moto finds a queue by the last path segment, so either form works; the template's form is kept.
        logger.debug("queue %s: target returned %s, the stack resolves %s", name, url, expected_url)
    return expected_url


def _creation_order(stack: Stack, logical_ids: list[str]) -> list[str]:
    """Order resources so that each comes after the resources it refers to (e.g. a DLQ before its source)."""
    wanted = set(logical_ids)
    ordered: list[str] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(logical_id: str) -> None:
        if state.get(logical_id) == 2:
            return
        if state.get(logical_id) == 1:
            raise ProvisionError(f"circular dependency through {logical_id}")
        state[logical_id] = 1
        for dependency in sorted(stack.dependencies(logical_id) & wanted):
            visit(dependency)
        state[logical_id] = 2
        ordered.append(logical_id)

    for logical_id in logical_ids:
        visit(logical_id)
    return ordered


def _check_supported(stack: Stack) -> list[str]:
    """The active resources to create; raises before anything is created if one is not supported."""
    to_create: list[str] = []
    unsupported: list[str] = []
    for logical_id, rtype, _cond, active in stack.template_resources():
        if not active or rtype in EMULATED_IN_PROCESS or rtype in NOT_ENFORCED_OFFLINE:
            continue
        if rtype in CREATED_IN_MOTO:
            to_create.append(logical_id)
        else:
            unsupported.append(f"{logical_id} ({rtype})")
    if unsupported:
        raise UnsupportedResourceError(
            f"the local stack can neither create nor emulate: {', '.join(unsupported)}; add the type to "
            "devstack.provision (created in moto) or to the in-process emulation"
        )
    return to_create


def provision(
    stack: Stack,
    *,
    endpoint_url: str | None = None,
    exist_ok: bool = False,
    secret_values: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Create every table, queue and alarm of the stack in the current AWS target.

    Parameters
    ----------
    stack
        The resolved template.
    endpoint_url
        A moto server's URL. ``None`` uses boto3's defaults, which must point at a local target: moto's in-process
        ``mock_aws`` or ``AWS_ENDPOINT_URL``.
    exist_ok
        Accept tables and queues that already exist instead of raising.
    secret_values
        Logical id → value of secrets whose value CloudFormation would generate (``GenerateSecretString``): a
        seeded simulation or bench run must not depend on a random key.

    Returns
    -------
    dict
        Logical id → physical id of each created resource (table name, queue URL, alarm name).

    Raises
    ------
    UnsupportedResourceError
        A resource type or property is neither created nor emulated (raised before anything is created).
    ProvisionError
        No local target is configured, or a resource already exists and ``exist_ok`` is false.
    TemplateError
        The template cannot be resolved.
    """
    _check_local_target(endpoint_url)
    to_create = _check_supported(stack)
    requests: dict[str, tuple[str, dict[str, Any]]] = {}
    builders: dict[str, Callable[[Stack, str, Mapping[str, Any]], dict[str, Any]]] = {
        "AWS::DynamoDB::Table": _table_request,
        "AWS::SQS::Queue": _queue_request,
        "AWS::CloudWatch::Alarm": _alarm_request,
        "AWS::SecretsManager::Secret": _secret_request,
        "AWS::Logs::LogGroup": _log_group_request,
        "AWS::Logs::MetricFilter": _metric_filter_request,
        "AWS::SNS::Topic": _topic_request,
        "AWS::SNS::Subscription": _subscription_request,
        "AWS::S3::Bucket": _bucket_request,
        "AWS::S3::BucketPolicy": _bucket_policy_request,
    }
    for logical_id in to_create:  # map everything first, so a bad property fails before any call
        rtype = stack.resource_type(logical_id)
        requests[logical_id] = (rtype, builders[rtype](stack, logical_id, stack.properties(logical_id)))
        if secret_values and logical_id in secret_values:
            requests[logical_id][1]["SecretString"] = secret_values[logical_id]

    clients: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in clients:
            clients[service] = _client(service, stack, endpoint_url)
        return clients[service]

    physical: dict[str, str] = {}
    for logical_id in _creation_order(stack, to_create):
        rtype, request = requests[logical_id]
        if rtype == "AWS::DynamoDB::Table":
            physical[logical_id] = _create_table(client("dynamodb"), request, stack.properties(logical_id), exist_ok)
        elif rtype == "AWS::SQS::Queue":
            physical[logical_id] = _create_queue(client("sqs"), request, stack.physical_id(logical_id), exist_ok)
        elif rtype == "AWS::SecretsManager::Secret":
            physical[logical_id] = _create_secret(client("secretsmanager"), request, exist_ok)
        elif rtype == "AWS::Logs::LogGroup":
            physical[logical_id] = _create_log_group(client("logs"), request, exist_ok)
        elif rtype == "AWS::Logs::MetricFilter":
            client("logs").put_metric_filter(**request)  # a put: running make up again replaces it
            physical[logical_id] = str(request["filterName"])
        elif rtype == "AWS::SNS::Topic":
            physical[logical_id] = str(client("sns").create_topic(**request)["TopicArn"])
        elif rtype == "AWS::SNS::Subscription":
            physical[logical_id] = str(client("sns").subscribe(**request)["SubscriptionArn"])
        elif rtype == "AWS::S3::Bucket":
            physical[logical_id] = _create_bucket(client("s3"), request, exist_ok)
        elif rtype == "AWS::S3::BucketPolicy":
            if request["Policy"] is not None:
                client("s3").put_bucket_policy(**request)
            physical[logical_id] = str(request["Bucket"])
        else:
            client("cloudwatch").put_metric_alarm(**request)
            physical[logical_id] = str(request["AlarmName"])
        logger.debug("created %s %s as %s", rtype, logical_id, physical[logical_id])
    for existing in stack.existing_queues():
        _stand_in(client("sqs"), existing, exist_ok)
    buckets: dict[str, list[ExistingBucket]] = {}
    for bucket in stack.existing_buckets():
        buckets.setdefault(bucket.name, []).append(bucket)
    for name, watchers in buckets.items():
        _stand_in_bucket(client("s3"), name, watchers)
    return physical


#: What a bucket's notification configuration holds besides the queues (kept as they are).
_NOTIFICATION_KEYS: Final = ("TopicConfigurations", "LambdaFunctionConfigurations", "EventBridgeConfiguration")


def _stand_in_bucket(client: Any, name: str, watchers: list[ExistingBucket]) -> None:
    """Create the stand-in of an existing bucket s3 triggers watch (versioned, as such a bucket should be), and add
    to its notification configuration what its owner adds on AWS: each trigger's queue, for the uploads of its keys
    (the configurations already there are kept)."""
    from devstack import moto_s3

    _create_bucket(client, {"Bucket": name, "calls": []}, exist_ok=True)  # it may well exist: it is the owner's
    client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    moto_s3.install()  # moto's notifications then carry the version id and sequencer S3's do
    current = client.get_bucket_notification_configuration(Bucket=name)
    queues = [q for q in current.get("QueueConfigurations", []) if q["QueueArn"] not in {w.queue_arn for w in watchers}]
    for watcher in watchers:
        rules = [(name, value) for name, value in (("prefix", watcher.prefix), ("suffix", watcher.suffix)) if value]
        queues.append(_queue_notification(watcher.queue_arn, "s3:ObjectCreated:*", rules))
    client.put_bucket_notification_configuration(
        Bucket=name,
        NotificationConfiguration={
            **{key: value for key, value in current.items() if key in _NOTIFICATION_KEYS},
            "QueueConfigurations": queues,
        },
    )
    logger.debug("stood in for the existing bucket %s, notifying %s", name, [w.queue_arn for w in watchers])


def _stand_in(client: SQSClient, existing: ExistingQueue, exist_ok: bool) -> None:
    """Create the stand-ins of an existing queue a function reads and of its dead-letter queue (on AWS they exist
    already; here nothing does): the queue gives a message to its dead-letter queue after five receives, as the
    template's own queues do."""
    _create_queue(  # one dead-letter queue may serve several existing queues
        client, {"QueueName": existing.dead_letter_name, "Attributes": {}}, existing.dead_letter_url, exist_ok=True
    )
    redrive = json.dumps({"deadLetterTargetArn": existing.dead_letter_arn, "maxReceiveCount": 5})
    attributes = {"VisibilityTimeout": "180", "RedrivePolicy": redrive}
    _create_queue(client, {"QueueName": existing.name, "Attributes": attributes}, existing.url, exist_ok)
    logger.debug(
        "stood in for the existing queue %s and its dead-letter queue %s", existing.arn, existing.dead_letter_arn
    )


# ------------------------------------------------------------------------------------------------- describe


def _describe_function(stack: Stack, logical_id: str) -> str:
    spec = stack.function(logical_id)
    triggers: list[str] = []
    for event in spec.events:
        if isinstance(event, SqsEventSpec):
            triggers.append(f"SQS {event.queue_logical_id} (batch {event.batch_size})")
        elif isinstance(event, ScheduleEventSpec):
            triggers.append(f"schedule {event.expression}")
        else:
            triggers.append(f"HTTP {event.route_key}")
    trigger_text = "; ".join(triggers) if triggers else "no triggers (invoke directly)"
    return f"{HOW_EMULATED}: worker processes running {spec.handler} ({spec.runtime}); {trigger_text}"


def describe(stack: Stack) -> list[tuple[str, str, str]]:
    """How each resource of the template is realised locally, for the CLI's table.

    Parameters
    ----------
    stack
        The resolved template.

    Returns
    -------
    list of (logical_id, type, how)
        ``how`` starts with one of ``"created in moto"``, ``"emulated in-process"``, ``"skipped"`` (its condition
        is false) or ``"unsupported"`` (`provision` would raise), followed by details.
    """
    rows: list[tuple[str, str, str]] = []
    for logical_id, rtype, cond, active in stack.template_resources():
        try:
            if not active:
                how = f"{HOW_SKIPPED}: condition {cond} is false"
            elif rtype == "AWS::DynamoDB::Table":
                how = f"{HOW_CREATED}: table {stack.physical_id(logical_id)}"
            elif rtype == "AWS::SQS::Queue":
                how = f"{HOW_CREATED}: queue {stack.queue_name(logical_id)}"
            elif rtype == "AWS::CloudWatch::Alarm":
                how = f"{HOW_CREATED}: alarm {stack.physical_id(logical_id)} (stored, never evaluated)"
            elif rtype == "AWS::S3::Bucket":
                how = f"{HOW_CREATED}: bucket {stack.physical_id(logical_id)} (lifecycle stored, never run)"
            elif rtype == "AWS::S3::BucketPolicy":
                how = f"{HOW_CREATED}: without its aws:SecureTransport statements (plain HTTP on loopback)"
            elif rtype == "AWS::Serverless::Function":
                how = _describe_function(stack, logical_id)
            elif rtype == "AWS::Serverless::HttpApi":
                how = f"{HOW_EMULATED}: HTTP API {stack.physical_id(logical_id)} served on 127.0.0.1"
                api_props = stack.properties(logical_id)
                ignored = sorted(set(api_props) - _HTTP_API_EMULATED)
                if api_props.get("StageName", "$default") == "$default":
                    ignored = [name for name in ignored if name != "StageName"]
                if ignored:
                    how += f" (not emulated: {', '.join(ignored)})"
            elif rtype == "AWS::Serverless::LayerVersion":
                content = stack.properties(logical_id).get("ContentUri")
                how = f"{HOW_EMULATED}: {content} on the workers' sys.path"
            elif rtype in EMULATED_IN_PROCESS:
                how = f"{HOW_EMULATED}: {EMULATED_IN_PROCESS[rtype]}"
            elif rtype in CREATED_IN_MOTO:
                how = f"{HOW_CREATED}: {stack.physical_id(logical_id)}"
            elif rtype in NOT_ENFORCED_OFFLINE:
                how = f"{HOW_SKIPPED}: {NOT_ENFORCED_OFFLINE[rtype]}"
            else:
                how = f"{HOW_UNSUPPORTED}: provision() raises for {rtype}"
        except (TemplateError, ProvisionError) as error:
            how = f"{HOW_UNSUPPORTED}: {error}"
        rows.append((logical_id, rtype, how))
    return rows

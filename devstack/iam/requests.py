"""What IAM authorizes for each AWS API call the product makes: the action, the resource ARN and the condition keys.

An API call is not always one authorization of an action of its own name (Service Authorization Reference, each
service's "Actions, resources, and condition keys" page, and each API's "Permissions" section):

* DynamoDB authorizes the table's ARN, or the index's (``table/T/index/I``) for a Query or Scan of an index;
  ``BatchGetItem`` and ``BatchWriteItem`` once per table they touch; ``TransactWriteItems`` and ``TransactGetItems``
  as the ``PutItem``, ``UpdateItem``, ``DeleteItem``, ``ConditionCheckItem`` and ``GetItem`` of each item. The
  ``dynamodb:LeadingKeys`` key carries the partition key values the call touches.
* SQS authorizes the queue's ARN (never its URL); ``SendMessageBatch``, ``DeleteMessageBatch`` and
  ``ChangeMessageVisibilityBatch`` are ``sqs:SendMessage``, ``sqs:DeleteMessage`` and ``sqs:ChangeMessageVisibility``;
  a message move task is authorized on its source queue (``StartMessageMoveTask`` also needs receive, delete and
  attributes there, and send on its destination).
* S3 authorizes ``arn:aws:s3:::bucket/key`` for object calls and the bucket's ARN for listings (with ``s3:prefix``);
  ``HeadObject`` is ``s3:GetObject``; ``CopyObject`` is ``s3:GetObject`` on the source and ``s3:PutObject`` on the
  target, plus ``s3:PutObjectTagging`` when it writes tags; a ``PutObject`` with tags also needs
  ``s3:PutObjectTagging``.
* CloudWatch's ``PutMetricData`` is ``cloudwatch:PutMetricData`` on ``*`` (with ``cloudwatch:namespace``).

Every request also carries ``aws:SecureTransport`` true (the SDK calls AWS over HTTPS). An operation with no entry
here raises `UnmappedOperation`: the check fails closed rather than pass a call it does not understand.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from devstack.iam.policy import AuthRequest

__all__ = ["CallContext", "UnmappedOperation", "authorizations", "mapped_operations", "secret_arn"]


class UnmappedOperation(LookupError):
    """An API call the check does not know how IAM authorizes (add it to `devstack.iam.requests`)."""


@dataclass(frozen=True)
class CallContext:
    """Where a call is made: the region and account of its ARNs, and the key schemas of the stack's tables.

    Attributes
    ----------
    partition_keys
        ``{table name: {"": partition key attribute, index name: the index's partition key attribute}}``.
    """

    region: str
    account: str
    partition_keys: Mapping[str, Mapping[str, str]]


Mapper = Callable[[Mapping[str, Any], CallContext], list[AuthRequest]]
_SECURE: Final = {"aws:SecureTransport": ["true"]}


def _request(action: str, resource: str, **context: list[str]) -> AuthRequest:
    return AuthRequest(action, resource, {**_SECURE, **{k.replace("__", ":"): v for k, v in context.items()}})


# ----------------------------------------------------------------------------------------------------- DynamoDB


def _table_arn(name: str, where: CallContext) -> str:
    return name if name.startswith("arn:") else f"arn:aws:dynamodb:{where.region}:{where.account}:table/{name}"


def _table_name(name: str) -> str:
    return name.rsplit("/", 1)[-1] if name.startswith("arn:") else name


def _scalar(attribute: Any) -> str:
    """The text of a DynamoDB attribute value (``{"S": "x"}`` → ``x``); LeadingKeys compares it as a string."""
    if isinstance(attribute, dict) and len(attribute) == 1:
        return str(next(iter(attribute.values())))
    return str(attribute)


def _leading_key(table: str, item: Mapping[str, Any] | None, where: CallContext) -> list[str]:
    key_name = (where.partition_keys.get(_table_name(table)) or {}).get("")
    if not key_name or not item or key_name not in item:
        return []
    return [_scalar(item[key_name])]


def _dynamodb_item(action: str, key_field: str) -> Mapper:
    def mapper(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
        table = str(params["TableName"])
        keys = _leading_key(table, params.get(key_field), where)
        return [_request(action, _table_arn(table, where), dynamodb__LeadingKeys=keys)]

    return mapper


_EQUALS: Final = re.compile(r"(#?[A-Za-z0-9_.\-]+)\s*=\s*(:[A-Za-z0-9_]+)")


def _query_leading_keys(params: Mapping[str, Any], where: CallContext) -> list[str]:
    """The partition key value a Query's key condition names (``pk = :v``, names and values substituted)."""
    table = _table_name(str(params["TableName"]))
    key_name = (where.partition_keys.get(table) or {}).get(str(params.get("IndexName") or ""))
    names = params.get("ExpressionAttributeNames") or {}
    values = params.get("ExpressionAttributeValues") or {}
    for name, placeholder in _EQUALS.findall(str(params.get("KeyConditionExpression") or "")):
        if names.get(name, name) == key_name and placeholder in values:
            return [_scalar(values[placeholder])]
    return []


def _dynamodb_read_many(action: str) -> Mapper:
    def mapper(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
        arn = _table_arn(str(params["TableName"]), where)
        if params.get("IndexName"):
            arn = f"{arn}/index/{params['IndexName']}"
        keys = _query_leading_keys(params, where) if action == "dynamodb:Query" else []
        return [_request(action, arn, dynamodb__LeadingKeys=keys)]

    return mapper


def _batch_get(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    out = []
    for table, request in (params.get("RequestItems") or {}).items():
        keys = sorted({k for item in request.get("Keys", []) for k in _leading_key(table, item, where)})
        out.append(_request("dynamodb:BatchGetItem", _table_arn(table, where), dynamodb__LeadingKeys=keys))
    return out


def _batch_write(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    out = []
    for table, writes in (params.get("RequestItems") or {}).items():
        keys: set[str] = set()
        for write in writes:
            item = (write.get("PutRequest") or {}).get("Item") or (write.get("DeleteRequest") or {}).get("Key")
            keys.update(_leading_key(table, item, where))
        out.append(_request("dynamodb:BatchWriteItem", _table_arn(table, where), dynamodb__LeadingKeys=sorted(keys)))
    return out


_TRANSACT_MEMBERS: Final = {
    "Put": ("dynamodb:PutItem", "Item"),
    "Update": ("dynamodb:UpdateItem", "Key"),
    "Delete": ("dynamodb:DeleteItem", "Key"),
    "ConditionCheck": ("dynamodb:ConditionCheckItem", "Key"),
    "Get": ("dynamodb:GetItem", "Key"),
}


def _transact(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    out = []
    for entry in params.get("TransactItems") or []:
        for member, request in entry.items():
            action, key_field = _TRANSACT_MEMBERS[member]
            table = str(request["TableName"])
            keys = _leading_key(table, request.get(key_field), where)
            out.append(_request(action, _table_arn(table, where), dynamodb__LeadingKeys=keys))
    return out


# ----------------------------------------------------------------------------------------------------- SQS


def _queue_arn(url_or_arn: str, where: CallContext) -> str:
    if url_or_arn.startswith("arn:"):
        return url_or_arn
    # https://sqs.<region>.amazonaws.com/<account>/<name>, or a local endpoint's http://127.0.0.1:port/<account>/<name>
    parts = [part for part in urlsplit(url_or_arn).path.split("/") if part]
    account, name = (parts[-2], parts[-1]) if len(parts) >= 2 else (where.account, parts[-1])
    return f"arn:aws:sqs:{where.region}:{account}:{name}"


def _sqs(action: str, field: str = "QueueUrl") -> Mapper:
    def mapper(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
        return [_request(action, _queue_arn(str(params[field]), where))]

    return mapper


def _get_queue_url(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    account = str(params.get("QueueOwnerAWSAccountId") or where.account)
    return [_request("sqs:GetQueueUrl", f"arn:aws:sqs:{where.region}:{account}:{params['QueueName']}")]


def _start_move_task(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    source = str(params["SourceArn"])
    out = [
        _request(action, source)
        for action in ("sqs:StartMessageMoveTask", "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")
    ]
    if params.get("DestinationArn"):
        out.append(_request("sqs:SendMessage", str(params["DestinationArn"])))
    return out


# ----------------------------------------------------------------------------------------------------- S3


def _object_arn(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def _s3_object(action: str, *, tagging_field: str | None = None) -> Mapper:
    def mapper(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
        arn = _object_arn(str(params["Bucket"]), str(params["Key"]))
        out = [_request(action, arn)]
        if tagging_field and params.get(tagging_field):
            out.append(_request("s3:PutObjectTagging", arn))
        return out

    return mapper


def _copy_object(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    source = params["CopySource"]
    if isinstance(source, str):
        bucket, _, key = source.lstrip("/").partition("/")
        key = key.split("?versionId=", 1)[0]
    else:
        bucket, key = str(source["Bucket"]), str(source["Key"])
    target = _object_arn(str(params["Bucket"]), str(params["Key"]))
    out = [_request("s3:GetObject", _object_arn(bucket, key)), _request("s3:PutObject", target)]
    if params.get("TaggingDirective") == "REPLACE" and params.get("Tagging"):
        out.append(_request("s3:PutObjectTagging", target))
    return out


def _list_objects(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    prefix = [str(params["Prefix"])] if params.get("Prefix") is not None else []
    return [_request("s3:ListBucket", f"arn:aws:s3:::{params['Bucket']}", s3__prefix=prefix)]


# ----------------------------------------------------------------------------------------------------- others


def secret_arn(region: str, account: str, secret: str) -> str:
    """The ARN of the secret ``secret`` (a name, or already an ARN) in ``region`` and ``account``. Its ARN ends with
    a random suffix on AWS; the local stack's has none, and policies written as ``!Ref`` of the secret name it."""
    return secret if secret.startswith("arn:") else f"arn:aws:secretsmanager:{region}:{account}:secret:{secret}"


def _secret(action: str) -> Mapper:
    def mapper(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
        return [_request(action, secret_arn(where.region, where.account, str(params["SecretId"])))]

    return mapper


def _put_metric_data(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    return [_request("cloudwatch:PutMetricData", "*", cloudwatch__namespace=[str(params.get("Namespace", ""))])]


def _no_authorization(params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    return []  # STS GetCallerIdentity needs no permission (STS API reference)


_MAPPERS: Final[dict[tuple[str, str], Mapper]] = {
    ("dynamodb", "GetItem"): _dynamodb_item("dynamodb:GetItem", "Key"),
    ("dynamodb", "PutItem"): _dynamodb_item("dynamodb:PutItem", "Item"),
    ("dynamodb", "UpdateItem"): _dynamodb_item("dynamodb:UpdateItem", "Key"),
    ("dynamodb", "DeleteItem"): _dynamodb_item("dynamodb:DeleteItem", "Key"),
    ("dynamodb", "Query"): _dynamodb_read_many("dynamodb:Query"),
    ("dynamodb", "Scan"): _dynamodb_read_many("dynamodb:Scan"),
    ("dynamodb", "DescribeTable"): _dynamodb_read_many("dynamodb:DescribeTable"),
    ("dynamodb", "BatchGetItem"): _batch_get,
    ("dynamodb", "BatchWriteItem"): _batch_write,
    ("dynamodb", "TransactWriteItems"): _transact,
    ("dynamodb", "TransactGetItems"): _transact,
    ("sqs", "SendMessage"): _sqs("sqs:SendMessage"),
    ("sqs", "SendMessageBatch"): _sqs("sqs:SendMessage"),
    ("sqs", "ReceiveMessage"): _sqs("sqs:ReceiveMessage"),
    ("sqs", "DeleteMessage"): _sqs("sqs:DeleteMessage"),
    ("sqs", "DeleteMessageBatch"): _sqs("sqs:DeleteMessage"),
    ("sqs", "ChangeMessageVisibility"): _sqs("sqs:ChangeMessageVisibility"),
    ("sqs", "ChangeMessageVisibilityBatch"): _sqs("sqs:ChangeMessageVisibility"),
    ("sqs", "GetQueueAttributes"): _sqs("sqs:GetQueueAttributes"),
    ("sqs", "ListDeadLetterSourceQueues"): _sqs("sqs:ListDeadLetterSourceQueues"),
    ("sqs", "GetQueueUrl"): _get_queue_url,
    ("sqs", "StartMessageMoveTask"): _start_move_task,
    ("sqs", "ListMessageMoveTasks"): _sqs("sqs:ListMessageMoveTasks", "SourceArn"),
    ("s3", "GetObject"): _s3_object("s3:GetObject"),
    ("s3", "HeadObject"): _s3_object("s3:GetObject"),
    ("s3", "PutObject"): _s3_object("s3:PutObject", tagging_field="Tagging"),
    ("s3", "DeleteObject"): _s3_object("s3:DeleteObject"),
    ("s3", "PutObjectTagging"): _s3_object("s3:PutObjectTagging"),
    ("s3", "GetObjectTagging"): _s3_object("s3:GetObjectTagging"),
    ("s3", "CopyObject"): _copy_object,
    ("s3", "ListObjectsV2"): _list_objects,
    ("s3", "ListObjects"): _list_objects,
    ("secretsmanager", "GetSecretValue"): _secret("secretsmanager:GetSecretValue"),
    ("secretsmanager", "DescribeSecret"): _secret("secretsmanager:DescribeSecret"),
    ("cloudwatch", "PutMetricData"): _put_metric_data,
    ("sts", "GetCallerIdentity"): _no_authorization,
}


def mapped_operations() -> list[tuple[str, str]]:
    """Every (service, operation) the check knows, sorted."""
    return sorted(_MAPPERS)


def authorizations(service: str, operation: str, params: Mapping[str, Any], where: CallContext) -> list[AuthRequest]:
    """The authorizations IAM makes for one API call.

    Parameters
    ----------
    service
        botocore's service name (``dynamodb``, ``sqs``, ``s3``, ``secretsmanager``, ``cloudwatch`` ...).
    operation
        The API operation (``BatchGetItem``).
    params
        The call's parameters as the caller passed them.
    where
        Region, account and key schemas.

    Raises
    ------
    UnmappedOperation
        The check does not know this operation: it is refused rather than passed.
    """
    mapper = _MAPPERS.get((service, operation))
    if mapper is None:
        raise UnmappedOperation(
            f"{service}:{operation} has no IAM mapping in devstack/iam/requests.py: add how AWS authorizes it"
        )
    return mapper(params, where)

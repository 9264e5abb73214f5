"""Fixtures for the devstack tests: a tiny SAM project (template + throwaway handlers) and a moto server.

The tiny project never depends on the real handlers: it has its own layer, an HTTP API function, an SQS worker
with partial batch responses, a scheduled function and two functions that share one handler module.
"""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # devstack lives at the repo root (pyproject's pythonpath has it too)
    sys.path.insert(0, str(REPO_ROOT))

MINI_TEMPLATE = """\
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  Greeting:
    Type: String
    Default: hello
  Shards:
    Type: Number
    Default: 4
    MinValue: 1
    MaxValue: 16
  WithExtras:
    Type: String
    Default: "false"
    AllowedValues: ["true", "false"]
Conditions:
  Extras: !Equals [!Ref WithExtras, "true"]
  NoExtras: !Not [!Condition Extras]
Globals:
  Function:
    Runtime: python3.12
    Timeout: 5
    MemorySize: 128
    Layers:
      - !Ref SharedLayer
    Environment:
      Variables:
        GREETING: !Ref Greeting
        SHARDS: !Ref Shards
        ITEMS_TABLE: !Ref ItemsTable
        WORK_QUEUE_URL: !Ref WorkQueue
Resources:
  SharedLayer:
    Type: AWS::Serverless::LayerVersion
    Properties:
      ContentUri: layer/
    Metadata:
      BuildMethod: python3.12
  ItemsTable:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions:
        - AttributeName: pk
          AttributeType: S
      KeySchema:
        - AttributeName: pk
          KeyType: HASH
      TimeToLiveSpecification:
        AttributeName: expires_at
        Enabled: true
  WorkDeadLetterQueue:
    Type: AWS::SQS::Queue
  WorkQueue:
    Type: AWS::SQS::Queue
    Properties:
      VisibilityTimeout: 30
      RedrivePolicy:
        deadLetterTargetArn: !GetAtt WorkDeadLetterQueue.Arn
        maxReceiveCount: 2
  ExtraQueue:
    Type: AWS::SQS::Queue
    Condition: Extras
  Api:
    Type: AWS::Serverless::HttpApi
  ApiFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: mini_api_handler.handler
      Timeout: 10
      Policies:
        - SQSSendMessagePolicy:
            QueueName: !GetAtt WorkQueue.QueueName
        - DynamoDBReadPolicy:
            TableName: !Ref ItemsTable
      Events:
        Create:
          Type: HttpApi
          Properties:
            ApiId: !Ref Api
            Path: /items
            Method: POST
        Read:
          Type: HttpApi
          Properties:
            ApiId: !Ref Api
            Path: /items/{item_id}
            Method: GET
  WorkerFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: mini_worker_handler.handler
      Policies:
        - DynamoDBWritePolicy:
            TableName: !Ref ItemsTable
      Events:
        Work:
          Type: SQS
          Properties:
            Queue: !GetAtt WorkQueue.Arn
            BatchSize: 5
            FunctionResponseTypes: [ReportBatchItemFailures]
  TickFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: mini_tick_handler.handler
      Policies:
        - DynamoDBWritePolicy:
            TableName: !Ref ItemsTable
      Events:
        Tick:
          Type: Schedule
          Properties:
            Schedule: rate(5 minutes)
  AgentAFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: mini_agent_handler.handler
      Environment:
        Variables:
          AGENT_NAME: a
  AgentBFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: mini_agent_handler.handler
      MemorySize: 512
      Environment:
        Variables:
          AGENT_NAME: b
          GREETING: !Sub "${Greeting}, b"
Outputs:
  ApiUrl:
    Value: !Sub "https://${Api}.execute-api.${AWS::Region}.${AWS::URLSuffix}"
  WorkQueueUrl:
    Value: !Ref WorkQueue
  ExtraQueueUrl:
    Condition: Extras
    Value: !Ref ExtraQueue
"""

LAYER_INIT = '''\
"""Shared code of the tiny project (its layer)."""
import os

import boto3


def items_table():
    return boto3.resource("dynamodb").Table(os.environ["ITEMS_TABLE"])
'''

API_HANDLER = """\
import json
import os

import boto3
from minishared import items_table


def handler(event, context):
    if event["routeKey"] == "POST /items":
        body = json.loads(event["body"])
        boto3.client("sqs").send_message(QueueUrl=os.environ["WORK_QUEUE_URL"], MessageBody=json.dumps(body))
        headers = {"content-type": "application/json"}
        return {"statusCode": 202, "headers": headers, "body": json.dumps({"id": body["id"]})}
    item = items_table().get_item(Key={"pk": event["pathParameters"]["item_id"]}).get("Item")
    if item is None:
        return {"statusCode": 404, "body": json.dumps({"message": "no such item"})}
    return {"id": item["pk"], "greeting": item["greeting"]}
"""

WORKER_HANDLER = """\
import json
import os

from minishared import items_table


def handler(event, context):
    failures = []
    for record in event["Records"]:
        body = json.loads(record["body"])
        if body.get("fail"):
            failures.append({"itemIdentifier": record["messageId"]})
            continue
        items_table().put_item(Item={"pk": body["id"], "greeting": os.environ["GREETING"]})
    return {"batchItemFailures": failures}
"""

TICK_HANDLER = """\
from minishared import items_table

RUNS = 0


def handler(event, context):
    global RUNS
    RUNS += 1
    items_table().put_item(Item={"pk": "tick", "runs": RUNS, "detail_type": event["detail-type"]})
    return {"runs": RUNS}
"""

AGENT_HANDLER = """\
import os

NAME_AT_IMPORT = os.environ["AGENT_NAME"]
CALLS = 0


def handler(event, context):
    global CALLS
    CALLS += 1
    return {
        "agent": NAME_AT_IMPORT,
        "calls": CALLS,
        "pid": os.getpid(),
        "greeting": os.environ["GREETING"],
        "shards": os.environ["SHARDS"],
        "function_name": context.function_name,
        "memory": context.memory_limit_in_mb,
        "memory_env": os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"],
        "endpoint": os.environ.get("AWS_ENDPOINT_URL"),
    }
"""


def write_mini_project(root: Path) -> Path:
    """Write the tiny SAM project under ``root`` and return the template's path."""
    (root / "layer" / "minishared").mkdir(parents=True)
    (root / "code").mkdir()
    (root / "layer" / "minishared" / "__init__.py").write_text(LAYER_INIT)
    (root / "code" / "mini_api_handler.py").write_text(API_HANDLER)
    (root / "code" / "mini_worker_handler.py").write_text(WORKER_HANDLER)
    (root / "code" / "mini_tick_handler.py").write_text(TICK_HANDLER)
    (root / "code" / "mini_agent_handler.py").write_text(AGENT_HANDLER)
    template = root / "template.yaml"
    template.write_text(MINI_TEMPLATE)
    return template


@pytest.fixture(scope="session")
def mini_project() -> Callable[[Path], Path]:
    """`write_mini_project`, for fixtures of a wider scope than a test."""
    return write_mini_project


@pytest.fixture
def mini_template(tmp_path: Path) -> Path:
    """The tiny project in a fresh folder."""
    return write_mini_project(tmp_path)


@pytest.fixture
def write_handler(tmp_path: Path) -> Any:
    """Write a throwaway handler module ``<name>.py`` into ``tmp_path/code`` and return that folder."""

    def write(name: str, source: str) -> Path:
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        (code / f"{name}.py").write_text(textwrap.dedent(source))
        return code

    return write


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """A moto server on loopback for the module; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def sqs(moto_server: str) -> Any:
    """An SQS client for the module's moto server."""
    import boto3

    return boto3.client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=moto_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def unique() -> str:
    """A short id unique to this test run, for resource names."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
def clean_env() -> Iterator[None]:
    """Restore os.environ after a test that starts a LocalStack (it sets and restores variables itself)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

"""The price list: one place, with its source and the date it was read. The bench bills its runs with it, and the
product prices each workflow's tally (`sasflow.cost`) with it.

Source: the public AWS pricing pages for US East (N. Virginia), read 2026-11-29:

- AWS Lambda pricing: $0.20 per 1M requests, $0.0000166667 per GB-second (x86, first pricing tier).
- Amazon DynamoDB pricing, on-demand capacity: $0.625 per 1M write request units, $0.125 per 1M read request units.
- Amazon SQS pricing, standard queues: $0.40 per 1M requests (after the free tier); each 64 KB chunk of a request's
  payload is billed as one request.
- Amazon API Gateway pricing: HTTP APIs $1.00 per 1M requests (first 300M), REST APIs $3.50 per 1M.
- AWS Step Functions pricing, Standard workflows: $0.025 per 1,000 state transitions (retries are transitions too).
- AWS Step Functions pricing, Express workflows: $1.00 per 1M requests (each execution started) and duration at
  $0.00001667 per GB-second for the first 1,000 GB-hours a month ($0.06 per GB-hour), "calculated from the time your
  workflow begins executing until it completes or otherwise terminates, rounded up to the nearest 100ms, and the
  amount of memory used in the execution of your workflow, billed in 64-MB chunks"; memory used is estimated as
  "50 MB + state machine definition size + execution data size" (pricing example 3), so a saga of a few KB is one
  64 MB chunk. An Express workflow runs at most 5 minutes and does not support ``.waitForTaskToken`` (Step Functions
  developer guide, "Choosing workflow type"); its execution history is kept only in CloudWatch Logs, at the Logs
  ingestion price below.
- AWS Step Functions developer guide, "Transitions", Distributed Map: "you're charged one state transition for each
  child workflow execution that the Distributed Map state starts"; the child workflows are billed as their type
  (Standard: their own transitions; Express: requests and duration).
- AWS Lambda pricing, durable functions: $8.00 per 1M durable operations (each step, wait, callback and retry
  attempt), $0.25 per GB of data written by durable operations (which is what makes "about $8.25 per million steps
  with 1 KB checkpoints"), and data retained per GB-month (left out here, as our DynamoDB storage is). The durable
  function's own invocations (the first and every replay) are Lambda requests.
- Amazon EventBridge: scheduled rules invoke their targets at no charge (the supervisor's Lambda time is billed).
- Amazon S3 pricing, S3 Standard: $0.005 per 1,000 PUT, COPY, POST and LIST requests, $0.0004 per 1,000 GET and
  all other requests, $0.023 per GB-month stored (claim-checked payloads only: below the threshold there is none).
- Amazon CloudWatch pricing, Logs: $0.50 per GB ingested (Standard log class; counted as 10^9 bytes, which can only
  overstate it). Lambda's own START/END/REPORT lines are not written (template: SystemLogLevel WARN).

Free tiers are left out on both sides: they would flatter whichever side uses less.
"""

from __future__ import annotations

from typing import Final

PRICES_READ_ON: Final = "2026-11-29"
REGION: Final = "us-east-1"

LAMBDA_PER_REQUEST: Final = 0.20 / 1_000_000
LAMBDA_PER_GB_SECOND: Final = 0.0000166667
DYNAMODB_PER_WRU: Final = 0.625 / 1_000_000
DYNAMODB_PER_RRU: Final = 0.125 / 1_000_000
SQS_PER_REQUEST: Final = 0.40 / 1_000_000
SQS_CHUNK_BYTES: Final = 64 * 1024
HTTP_API_PER_REQUEST: Final = 1.00 / 1_000_000
REST_API_PER_REQUEST: Final = 3.50 / 1_000_000
STEP_FUNCTIONS_PER_TRANSITION: Final = 0.025 / 1_000
EVENTBRIDGE_SCHEDULED_INVOCATION: Final = 0.0
#: A custom event put on a bus (PutEvents, per 64 KB chunk); a rule's delivery to its targets (an SQS queue, a state
#: machine) is free, and so are the events AWS services publish (S3's Object Created).
EVENTBRIDGE_PER_EVENT: Final = 1.00 / 1_000_000
#: An EventBridge Pipes request (a batch of up to 10 SQS messages under 64 KB is one request per message chunk).
EVENTBRIDGE_PIPES_PER_REQUEST: Final = 0.40 / 1_000_000
CLOUDWATCH_LOGS_PER_BYTE: Final = 0.50 / 1_000_000_000
EXPRESS_PER_REQUEST: Final = 1.00 / 1_000_000
EXPRESS_PER_GB_SECOND: Final = 0.00001667
EXPRESS_MEMORY_BLOCK_MB: Final = 64
EXPRESS_BASE_MEMORY_MB: Final = 50
EXPRESS_DURATION_ROUNDING_SECONDS: Final = 0.1
EXPRESS_MAX_SECONDS: Final = 300
DISTRIBUTED_MAP_TRANSITIONS_PER_CHILD: Final = 1
DURABLE_PER_OPERATION: Final = 8.00 / 1_000_000
DURABLE_PER_BYTE_WRITTEN: Final = 0.25 / 1_000_000_000
S3_PER_WRITE_REQUEST: Final = 0.005 / 1_000
S3_PER_READ_REQUEST: Final = 0.0004 / 1_000
S3_PER_GB_MONTH: Final = 0.023
#: The S3 operations billed at the PUT, COPY, POST and LIST rate; every other one at the GET rate.
S3_WRITE_OPERATIONS: Final = frozenset(
    {
        "PutObject",
        "CopyObject",
        "ListObjectsV2",
        "ListObjects",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "PutObjectTagging",
    }
)

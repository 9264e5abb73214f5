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

The product's other price lists (`PRICE_LISTS`, the ``PriceRegion`` parameter), read 2026-12-07 from public copies
of the AWS Price List API's offers for each region (DynamoDB of 2026-08-15, S3 of 2026-08-07, CloudWatch of
2026-08-06, EventBridge of 2026-05-29, SQS of 2025-08-28, Lambda from the AWS pricing calculator's data), the HTTP
API's from public price summaries:

- Europe (Ireland), eu-west-1: Lambda $0.20 per 1M requests and $0.0000166667 per GB-second; DynamoDB on-demand
  $0.705 per 1M WRU and $0.1415 per 1M RRU; SQS $0.40 per 1M; HTTP API $1.11 per 1M (first 300M); S3 $0.005 per
  1,000 PUT and $0.0004 per 1,000 GET; CloudWatch Logs $0.57 per GB; EventBridge $1.00 per 1M events.
- Europe (Frankfurt), eu-central-1: Lambda as above; DynamoDB $0.7625 per 1M WRU and $0.1525 per 1M RRU; SQS $0.40
  per 1M; HTTP API $1.20 per 1M; S3 $0.0054 per 1,000 PUT and $0.00043 per 1,000 GET; CloudWatch Logs $0.63 per GB;
  EventBridge $1.00 per 1M events (its Scheduler's invocations are $1.15 per 1M there: a schedule tick's line
  is priced as an event, $0.15 per million ticks under).

Other regions are priced at us-east-1's list, and say so; a region joins `PRICE_LISTS` when every one of its prices
is sourced (us-east-2, us-west-2 and ap-northeast-1 lacked some on 2026-12-07).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PriceList:
    """The unit prices a workflow's tally is priced with (`sasflow.cost.Tally.lines`), in one region: the names are
    this module's, so the module itself (us-east-1, the bench's) and a `PriceList` price alike."""

    REGION: str
    PRICES_READ_ON: str
    LAMBDA_PER_REQUEST: float
    LAMBDA_PER_GB_SECOND: float
    DYNAMODB_PER_WRU: float
    DYNAMODB_PER_RRU: float
    SQS_PER_REQUEST: float
    S3_PER_WRITE_REQUEST: float
    S3_PER_READ_REQUEST: float
    CLOUDWATCH_LOGS_PER_BYTE: float
    HTTP_API_PER_REQUEST: float
    EVENTBRIDGE_PER_EVENT: float
    #: When the deployment's region has no list of its own: the region asked for (the list is us-east-1's)
    ASKED_FOR: str = ""

    @property
    def label(self) -> str:
        """Whose prices, read when: ``us-east-1, read 2026-11-29``; says so when they stand in for another
        region's."""
        stands_in = f" (no price list for {self.ASKED_FOR})" if self.ASKED_FOR else ""
        return f"{self.REGION}{stands_in}, read {self.PRICES_READ_ON}"


US_EAST_1: Final = PriceList(
    REGION=REGION,
    PRICES_READ_ON=PRICES_READ_ON,
    LAMBDA_PER_REQUEST=LAMBDA_PER_REQUEST,
    LAMBDA_PER_GB_SECOND=LAMBDA_PER_GB_SECOND,
    DYNAMODB_PER_WRU=DYNAMODB_PER_WRU,
    DYNAMODB_PER_RRU=DYNAMODB_PER_RRU,
    SQS_PER_REQUEST=SQS_PER_REQUEST,
    S3_PER_WRITE_REQUEST=S3_PER_WRITE_REQUEST,
    S3_PER_READ_REQUEST=S3_PER_READ_REQUEST,
    CLOUDWATCH_LOGS_PER_BYTE=CLOUDWATCH_LOGS_PER_BYTE,
    HTTP_API_PER_REQUEST=HTTP_API_PER_REQUEST,
    EVENTBRIDGE_PER_EVENT=EVENTBRIDGE_PER_EVENT,
)

_OTHER_LISTS_READ_ON: Final = "2026-12-07"

#: The price list of each region sasflow has one for (see this module's docstring for their sources).
PRICE_LISTS: Final[dict[str, PriceList]] = {
    US_EAST_1.REGION: US_EAST_1,
    "eu-west-1": PriceList(
        REGION="eu-west-1",
        PRICES_READ_ON=_OTHER_LISTS_READ_ON,
        LAMBDA_PER_REQUEST=0.20 / 1_000_000,
        LAMBDA_PER_GB_SECOND=0.0000166667,
        DYNAMODB_PER_WRU=0.705 / 1_000_000,
        DYNAMODB_PER_RRU=0.1415 / 1_000_000,
        SQS_PER_REQUEST=0.40 / 1_000_000,
        S3_PER_WRITE_REQUEST=0.005 / 1_000,
        S3_PER_READ_REQUEST=0.0004 / 1_000,
        CLOUDWATCH_LOGS_PER_BYTE=0.57 / 1_000_000_000,
        HTTP_API_PER_REQUEST=1.11 / 1_000_000,
        EVENTBRIDGE_PER_EVENT=1.00 / 1_000_000,
    ),
    "eu-central-1": PriceList(
        REGION="eu-central-1",
        PRICES_READ_ON=_OTHER_LISTS_READ_ON,
        LAMBDA_PER_REQUEST=0.20 / 1_000_000,
        LAMBDA_PER_GB_SECOND=0.0000166667,
        DYNAMODB_PER_WRU=0.7625 / 1_000_000,
        DYNAMODB_PER_RRU=0.1525 / 1_000_000,
        SQS_PER_REQUEST=0.40 / 1_000_000,
        S3_PER_WRITE_REQUEST=0.0054 / 1_000,
        S3_PER_READ_REQUEST=0.00043 / 1_000,
        CLOUDWATCH_LOGS_PER_BYTE=0.63 / 1_000_000_000,
        HTTP_API_PER_REQUEST=1.20 / 1_000_000,
        EVENTBRIDGE_PER_EVENT=1.00 / 1_000_000,
    ),
}

#: The variable that names the region whose prices a deployment's tallies are shown at (template parameter
#: ``PriceRegion``; empty: the deployment's own region, ``AWS_REGION``).
PRICE_REGION_VARIABLE: Final = "SASFLOW_PRICE_REGION"


def price_list(region: str | None = None) -> PriceList:
    """The price list of ``region`` (None: ``SASFLOW_PRICE_REGION``, else the function's ``AWS_REGION``, else
    us-east-1). A region without a list of its own is priced at us-east-1's, and its `PriceList.label` says so."""
    if region is None:
        region = os.environ.get(PRICE_REGION_VARIABLE) or os.environ.get("AWS_REGION") or REGION
    found = PRICE_LISTS.get(region)
    if found is not None:
        return found
    return PriceList(**{**US_EAST_1.__dict__, "ASKED_FOR": region})

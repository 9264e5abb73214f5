"""The price list the bench bills with: one place, with its source and the date it was read.

Source: the public AWS pricing pages for US East (N. Virginia), read 2026-11-29:

- AWS Lambda pricing: $0.20 per 1M requests, $0.0000166667 per GB-second (x86, first pricing tier).
- Amazon DynamoDB pricing, on-demand capacity: $0.625 per 1M write request units, $0.125 per 1M read request units.
- Amazon SQS pricing, standard queues: $0.40 per 1M requests (after the free tier); each 64 KB chunk of a request's
  payload is billed as one request.
- Amazon API Gateway pricing: HTTP APIs $1.00 per 1M requests (first 300M), REST APIs $3.50 per 1M.
- AWS Step Functions pricing, Standard workflows: $0.025 per 1,000 state transitions (retries are transitions too).
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
CLOUDWATCH_LOGS_PER_BYTE: Final = 0.50 / 1_000_000_000
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

"""Lambda handler of the sample services on AWS: HTTP API route ``POST /sample/{service}/{action}``.

Environment: ``SAMPLE_LEDGER_TABLE`` (required) and ``SAMPLE_FAULTS_JSON`` (optional, ``{"flights": {...}}``,
see ``travel_services.faults_from_json``). The services are built once per cold start, on the first request.

On AWS a hang really sleeps: keep ``hang_seconds`` below the function timeout (10 s in template.yaml) and above the
agent's HTTP timeout, or Lambda ends the invocation before the late effect is applied.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import random
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, Field

from sample_ledger_dynamodb import DynamoDBLedger
from travel_services import SERVICES, SystemClock, TravelService, faults_from_json

logger = Logger()
app = APIGatewayHttpResolver()


class SampleServicesEnv(BaseModel):
    """Typed view of the function's environment."""

    model_config = ConfigDict(extra="ignore")

    sample_ledger_table: str = Field(min_length=1, alias="SAMPLE_LEDGER_TABLE")
    sample_faults_json: str | None = Field(default=None, alias="SAMPLE_FAULTS_JSON")


@functools.cache
def bootstrap() -> dict[str, TravelService]:
    """Wire the three services over the DynamoDB ledger (once per cold start).

    Raises
    ------
    pydantic.ValidationError
        ``SAMPLE_LEDGER_TABLE`` is missing or empty.
    ValueError
        ``SAMPLE_FAULTS_JSON`` is invalid.
    """
    env = SampleServicesEnv.model_validate(dict(os.environ))
    ledger = DynamoDBLedger(env.sample_ledger_table)
    knobs = faults_from_json(env.sample_faults_json)
    clock = SystemClock()
    return {name: TravelService(name, ledger, knobs[name], random.Random(), clock) for name in SERVICES}  # nosec B311 # the demo services' fault draws


@app.post("/sample/<service>/<action>")
def call_service(service: str, action: str) -> Response[str]:
    """Pass the request to the named service and answer its status and JSON body."""
    target = bootstrap().get(service)
    if target is None:
        status, body = 404, {"error": "UNKNOWN_SERVICE", "message": f"no service {service!r}"}
    else:
        event = app.current_event
        raw = event.body or ""
        payload = base64.b64decode(raw) if event.is_base64_encoded else raw.encode()
        status, body = target.handle(action, event.headers, payload)
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Lambda entry point (HTTP API payload v2.0)."""
    return app.resolve(event, context)

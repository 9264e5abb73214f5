"""Local stack runtime for sasflow: the template that deploys is the template that runs offline.

The package turns ``template.yaml`` into a running stack on loopback: DynamoDB tables, SQS queues and CloudWatch
alarms are created in a moto server, and what moto cannot run (Lambda functions, SQS event source mappings,
EventBridge schedules and the API Gateway HTTP API) is emulated in-process.

Modules
-------
template
    Load the template and resolve CloudFormation intrinsics (`Stack`, `FunctionSpec`).
provision
    Create the template's tables, queues and alarms in the current AWS target (`provision`, `describe`).
lambda_runtime
    Run a function in its own worker processes, like a Lambda execution environment (`FunctionPool`).
event_sources
    SQS pollers, schedules and the HTTP API server that turn their inputs into Lambda events.
stack
    `LocalStack`, which wires all of the above behind one context manager.

Nothing heavy is imported here, so that worker processes start quickly.
"""

from __future__ import annotations

__all__: list[str] = []

"""Agent Lambda: performs step requests on one remote service (AGENT_NAME) over HTTP and replies to the scheduler.

The wiring (powertools Logger, Tracer, Metrics, batch processing, idempotency) is ``sasflow.agent_lambda``'s, shared
with the Python agents (``sasflow.python_agent.AgentApp``).
"""

from __future__ import annotations

from sasflow.agent_lambda import agent_handler, agent_services
from sasflow.bootstrap import AgentServices, Lazy

#: The handler; `agent` is looked up at each invocation, so a test may swap it for services of its own.
handler = agent_handler(lambda: agent())
agent: Lazy[AgentServices] = agent_services(handler)

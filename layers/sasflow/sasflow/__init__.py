"""sasflow: workflows across remote services on the Scheduler Agent Supervisor pattern.

The package is the core that the Lambda layer ships: models, the state machine, the store and bus adapters,
the scheduler and supervisor services, and the agent runtime. Handlers in ``functions/`` stay thin and call it.
"""

__version__ = "0.1.0"

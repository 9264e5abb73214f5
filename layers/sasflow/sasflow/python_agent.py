"""Agents written as Python functions in their own Lambda, beside the HTTP agents (agents.yaml ``kind: python``).

::

    app = AgentApp("inventory")

    @app.action("reserve")
    def reserve(request: ActionRequest) -> dict: ...

    @app.compensation("reserve")          # the compensating action is named after the function: release
    def release(request: ActionRequest) -> dict: ...

    handler = app.handler

The actions run inside the same ``AgentRuntime`` as the HTTP agent's calls, so they keep every guarantee of it:
powertools idempotency on the business identity (``[workflow_id, step, phase, action, token]``: a resend or a
duplicate delivery returns the stored result, never runs the function again), retries with backoff bounded by
complete-by and the Lambda time left, and the circuit breaker shared by the agent's instances. What the function
raises tells the outcomes apart:

======================================= ================================================================
the function                            the attempt
======================================= ================================================================
returns a JSON object                   SUCCEEDED with it as the step's output
raises ``BusinessRejection(code, msg)`` REJECTED: nothing happened, definitive (the workflow unwinds)
raises ``TransientError(msg)``          retried; FAILED once retries or time run out (the breaker counts it)
raises anything else                    as ``TransientError`` with its outcome unknown: the step is compensated if
                                        the workflow unwinds (an exception half-way may have left an effect)
======================================= ================================================================

Make an action idempotent in its own store too: ``request.token`` is the same for every attempt of the step's
action (and ``request.original_token`` names the action a compensation undoes), so a conditional write keyed by
it makes a repeated call a no-op even when the idempotency record has expired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from .errors import ConfigurationError, RemoteRejectedError, RemoteTransientError
from .messages import StepRequest
from .states import Phase

ActionFunction = Callable[["ActionRequest"], dict[str, Any]]


class ActionRequest(BaseModel):
    """What an action function is given: the step's identity, its rendered input and its budget.

    ``token`` is the idempotency token of this step's action (the same for every attempt: pass it on, key your
    writes by it); ``original_token`` is, for a compensation, the token of the action to undo. ``complete_by`` and
    ``seconds_left`` bound the work (epoch seconds, seconds): the engine times out an attempt after complete-by.
    """

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    step: str
    phase: Phase
    action: str
    attempt: int
    token: str
    original_token: str | None = None
    input: dict[str, Any]
    complete_by: int
    seconds_left: float


class BusinessRejection(Exception):  # a user-facing name: what the function means, not an "Error"
    """Raise from an action to refuse it for a business reason (nothing happened): the step is REJECTED."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TransientError(Exception):
    """Raise from an action when a later try may succeed (a dependency is down, throttled, timed out).

    ``outcome_unknown``: the action may have taken effect before it failed (the workflow then compensates the step
    if it unwinds).
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


@dataclass(frozen=True)
class _Registered:
    function: ActionFunction
    compensates: str | None = None


class AgentApp:
    """The actions and compensations of one Python agent, and its Lambda handler.

    Parameters
    ----------
    name:
        The agent's name, as in agents.yaml and the definitions (``AGENT_NAME`` must be the same).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.actions: dict[str, _Registered] = {}
        self._handler: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
        #: The agent's services (built on the first invocation); a test may swap them for its own.
        self.services: Any = None

    def action(self, name: str) -> Callable[[ActionFunction], ActionFunction]:
        """Register the decorated function as action ``name``.

        Raises
        ------
        ValueError
            When ``name`` is registered already.
        """

        def register(function: ActionFunction) -> ActionFunction:
            self._add(name, _Registered(function))
            return function

        return register

    def compensation(self, action: str, *, name: str | None = None) -> Callable[[ActionFunction], ActionFunction]:
        """Register the decorated function as the compensation of ``action``, named ``name`` (default: the
        function's own name), the action a definition's ``compensation.action`` names.

        Raises
        ------
        ValueError
            When the name is registered already.
        """

        def register(function: ActionFunction) -> ActionFunction:
            self._add(name or function.__name__, _Registered(function, compensates=action))
            return function

        return register

    def _add(self, name: str, registered: _Registered) -> None:
        if name in self.actions:
            raise ValueError(f"agent {self.name}: action {name!r} is registered twice")
        self.actions[name] = registered

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        """Run the function of ``request.action`` once (``agent.RemoteClient``): the runtime retries and guards it.

        Raises
        ------
        RemoteRejectedError
            When the function raised ``BusinessRejection``, or no function has that action.
        RemoteTransientError
            When it raised anything else (``TransientError`` or an unexpected exception), or returned a non-object.
        """
        registered = self.actions.get(request.action)
        if registered is None:
            raise RemoteRejectedError("UNKNOWN_ACTION", f"agent {self.name} has no action {request.action!r}", 404)
        given = ActionRequest(
            workflow_id=request.workflow_id,
            step=request.step,
            phase=request.phase,
            action=request.action,
            attempt=request.attempt,
            token=request.token,
            original_token=request.original_token,
            input=request.input,
            complete_by=request.complete_by,
            seconds_left=timeout_seconds,
        )
        try:
            output = registered.function(given)
        except BusinessRejection as exc:
            raise RemoteRejectedError(exc.code, exc.message, 409) from exc
        except TransientError as exc:
            raise RemoteTransientError(str(exc), outcome_unknown=exc.outcome_unknown) from exc
        except Exception as exc:  # a bug or an unexpected failure half-way: it may have had an effect
            raise RemoteTransientError(f"{type(exc).__name__}: {exc}", outcome_unknown=True) from exc
        if not isinstance(output, dict):
            raise RemoteTransientError(f"action {request.action} returned {type(output).__name__}, not an object")
        return output

    def check(self, actions: tuple[str, ...]) -> None:
        """Refuse a deployment whose agents.yaml actions (``AGENT_ACTIONS``) this app does not implement.

        Raises
        ------
        ConfigurationError
            Naming the actions that have no function.
        """
        missing = sorted(set(actions) - set(self.actions))
        if missing:
            raise ConfigurationError(f"agent {self.name}: no function for action(s) {missing} (AGENT_ACTIONS)")

    @property
    def handler(self) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
        """The Lambda handler: SQS batches of step requests, each answered on the response queue."""
        if self._handler is None:
            from .agent_lambda import agent_handler, agent_services

            self._handler = agent_handler(lambda: self.services())
            self.services = agent_services(self._handler, remote=self)
        return self._handler

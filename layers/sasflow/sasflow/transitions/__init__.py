"""Every decision about a workflow's next state, in one place (STYLE "Growing the house").

`Transition` is the one entry point: the scheduler builds one per read, applies the call's change to it, and stores
its snapshot. Each concern is a module: ``base`` (shared bookkeeping, routing a reply or a timeout, advancing),
``forward`` (actions), ``mapping`` (map steps and their children), ``compensation`` (unwinding),
``operator`` (cancel and operator actions).
"""

from __future__ import annotations

from .base import MIN_DEFERRAL_SECONDS, TransitionBase, backoff_seconds
from .compensation import CompensationTransitions
from .forward import ForwardTransitions
from .mapping import MapTransitions
from .operator import NO_OUTPUT, OperatorTransitions

__all__ = ["MIN_DEFERRAL_SECONDS", "NO_OUTPUT", "Transition", "TransitionBase", "backoff_seconds"]


class Transition(OperatorTransitions, MapTransitions, ForwardTransitions, CompensationTransitions):
    """The transitions of one call to one workflow (see `base.TransitionBase`)."""

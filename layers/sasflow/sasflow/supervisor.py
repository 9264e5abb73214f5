"""The supervisor: a scheduled sweep of the deadline index (Scheduler Agent Supervisor pattern).

Each run takes the supervisor lease (Leader Election pattern), reads the overdue entries of every shard of the
sparse deadline index (``complete_by < now - grace``, so only overdue items are read: DESIGN Rule 3), and hands
each one to the scheduler. An entry is a workflow keyed by the earliest complete-by of its steps in flight, so it is
overdue exactly when one of its steps is; the scheduler resends those steps or gives up and unwinds the workflow,
all in one write. Then it looks at the tenants' queues that are due (``tenancy.py``: their own shard of the index),
so a queued workflow starts even when the give-back that should have started it was lost. The lease only avoids
wasted work: safety comes from the scheduler's conditional writes, so a supervisor that lost its lease mid-sweep,
or two that overlap, still resend a step exactly once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from .clock import Clock, epoch_seconds
from .errors import LeaseNotAcquiredError
from .ports import Counter, MessageBus, Outgoing, StateStore, no_metrics
from .scheduler import SchedulerService
from .settings import EngineConfig

logger = logging.getLogger("sasflow.supervisor")

LEASE_NAME = "supervisor"
_PAGE = 100


@dataclass
class SweepReport:
    """What one supervisor run did.

    Attributes
    ----------
    acquired:
        Whether this run held the lease (False: another supervisor was sweeping; nothing was read).
    overdue:
        Overdue index entries read (each a workflow with at least one overdue step, or one stalled).
    messages:
        Messages sent (resends and compensations); ``send_failures`` of them could not be sent.
    complete:
        False when the run stopped at the per-run cap or for lack of time; the next run takes the rest.
    """

    acquired: bool = False
    overdue: int = 0
    messages: int = 0
    send_failures: int = 0
    errors: int = 0
    pages: int = 0
    #: Tenants' queues looked at (``tenancy.py``).
    queues: int = 0
    complete: bool = True
    workflows: list[str] = field(default_factory=list)


class SupervisorService:
    """Finds overdue steps and stalled workflows and lets the scheduler act on them.

    Parameters
    ----------
    store, bus:
        State store and message bus ports.
    scheduler:
        The service that owns the transitions.
    clock:
        Injected time; the sweep's cutoff is ``epoch_seconds(clock) - grace``.
    config:
        Engine settings (shards, grace, per-run cap, lease length).
    """

    def __init__(
        self,
        store: StateStore,
        bus: MessageBus,
        scheduler: SchedulerService,
        clock: Clock,
        config: EngineConfig,
        *,
        metrics: Counter = no_metrics,
    ) -> None:
        self.store = store
        self.bus = bus
        self.scheduler = scheduler
        self.clock = clock
        self.config = config
        self.metrics = metrics

    def sweep(
        self,
        *,
        owner: str | None = None,
        time_left: Callable[[], float] | None = None,
        use_lease: bool = True,
    ) -> SweepReport:
        """Run one sweep.

        Parameters
        ----------
        owner:
            Lease owner id (the Lambda request id); random when omitted.
        time_left:
            Seconds left before the invocation's deadline; the sweep stops with 5 s to spare.
        use_lease:
            False skips leader election (tests of overlapping supervisors use it to prove the writes alone are safe).

        Returns
        -------
        SweepReport
        """
        report = SweepReport()
        owner = owner or str(uuid.uuid4())
        now = epoch_seconds(self.clock)
        if use_lease:
            try:
                self.store.acquire_lease(LEASE_NAME, owner, now, self.config.lease_seconds)
            except LeaseNotAcquiredError:
                logger.debug("another supervisor holds the lease")
                return report
        report.acquired = True
        try:
            self._sweep(report, now, time_left)
        finally:
            if use_lease:
                self.store.release_lease(LEASE_NAME, owner, epoch_seconds(self.clock))
        self.metrics("SweepOverdue", report.overdue)
        return report

    def _sweep(self, report: SweepReport, now: int, time_left: Callable[[], float] | None) -> None:
        # Overdue means now > complete_by + grace, i.e. complete_by < now - grace (whole epoch seconds).
        before = now - self.config.deadline_grace_seconds
        budget = self.config.max_overdue_per_sweep
        for shard_number in range(self.config.deadline_shards):
            shard = f"{shard_number:02d}"
            start = None
            while True:
                if report.overdue >= budget or (time_left is not None and time_left() < 5):
                    report.complete = False
                    return
                entries, start = self.store.overdue(shard, before, min(_PAGE, budget - report.overdue), start)
                report.pages += 1
                outgoing: list[Outgoing] = []
                for entry in entries:
                    report.overdue += 1
                    try:
                        outgoing += self.scheduler.on_overdue(entry.workflow_id)
                    except Exception:  # one bad workflow must not stop the sweep of the others
                        report.errors += 1
                        logger.exception("overdue entry failed", extra={"workflow_id": entry.workflow_id})
                    report.workflows.append(entry.workflow_id)
                self._send(report, outgoing)
                if start is None:
                    break
        self._sweep_queues(report, now, budget)

    def _sweep_queues(self, report: SweepReport, now: int, budget: int) -> None:
        """Look at the tenants' queues that are due: start their heads while slots are free (``tenancy.py``)."""
        tenants = self.scheduler.tenants
        if tenants is None:
            return
        outgoing: list[Outgoing] = []
        for definition, tenant in tenants.slots.due_queues(now, min(_PAGE, budget)):
            report.queues += 1
            try:
                outgoing += self.scheduler.check_queue(definition, tenant)
            except Exception:  # one tenant's queue must not stop the others'
                report.errors += 1
                logger.exception("tenant queue check failed", extra={"tenant": tenant, "definition": definition})
        self._send(report, outgoing)

    def _send(self, report: SweepReport, outgoing: list[Outgoing]) -> None:
        """Send what a page of the sweep decided, counting what went and what could not."""
        if outgoing:
            failed = self.bus.send(outgoing)
            report.messages += len(outgoing) - len(failed)
            report.send_failures += len(failed)

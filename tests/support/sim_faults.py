"""Fault mixes of the simulation's tests (tests/simulation), shared by the seeded runs and the differential test."""

from __future__ import annotations

from simulation.world import Faults

#: The operator's and the payloads' checks need no new step kinds (the seeded runs have them): without them each run
#: is faster.
#: Nor tenants' limits (invariant 22 has runs of its own): every start is accepted.
PLAIN_STEPS = {"conditional": 0.0, "wait_step": 0.0, "callback_step": 0.0, "tenancy": 0.0}
#: Every workflow under the hold policy, some refused by their services, and the operator acting at every tick.
OPERATOR_HEAVY = Faults(hold_policy=1.0, remote_reject=0.15, operator_action=1.0, **PLAIN_STEPS)
#: Every workflow with a payload above the claim-check threshold.
LARGE_PAYLOADS = Faults(large_payload=1.0, operator_action=0.0, hold_policy=0.0, **PLAIN_STEPS)
#: A poison message on some consumer's queue for every other workflow started, under every other fault.
POISONED = Faults(poison_message=0.5, **PLAIN_STEPS)
#: As many ticks of the trigger as workflows started, each delivered twice half the time, a fifth of them not ticks,
#: and the operator pausing, resuming or running the trigger now at most supervisor ticks.
TRIGGER_HEAVY = Faults(triggered=1.0, trigger_duplicate=0.5, trigger_bad=0.2, trigger_operator=0.6, **PLAIN_STEPS)
#: A second instance of a consumer (the hotels agent's among them) running in the middle of most invocations: two
#: instances share the hotels agent's call limits (invariant 21).
LIMITED = Faults(concurrent_invocation=0.6, **PLAIN_STEPS)
#: Every workflow's definition limits its tenants (max_running 1 or 2 per customer of five): many starts refused.
TENANTS = Faults(**{**PLAIN_STEPS, "tenancy": 1.0})
#: Every workflow under the hold policy, three in ten refused by their services (a retried one may be held again),
#: and the operator starting, repeating or cancelling a batch at most supervisor ticks (invariant 23).
BATCH_HEAVY = Faults(hold_policy=1.0, remote_reject=0.3, operator_action=0.0, operator_batch=0.6, **PLAIN_STEPS)

"""Tenants' limits (``tenancy.max_running``): through the scheduler, the agents and the supervisor on one clock."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from sasflow.definition import WorkflowDefinition, parse_definition
from sasflow.errors import InvalidDefinitionError, TenantKeyError, TenantLimitError
from sasflow.states import WorkflowStatus
from sasflow.tenancy import HOLDER_GRACE_SECONDS, PRUNE_SECONDS, RETRY_AFTER_SECONDS, Released
from tests.support.pipeline import OWNER, TRIP_INPUT, Pipeline, trip_definition


def limited(max_running: int = 2, **tenancy: Any) -> dict[str, Any]:
    """The sample trip, at most ``max_running`` per tenant."""
    return {**trip_definition(), "tenancy": {"max_running": max_running, **tenancy}}


def holders(p: Pipeline, tenant: str, definition: str = "trip-booking") -> set[str]:
    return set(p.tenancy.slots(definition, tenant).holders)


def statuses(p: Pipeline, *ids: str) -> list[WorkflowStatus]:
    return [p.snapshot(workflow_id).workflow.status for workflow_id in ids]


# --------------------------------------------------------------------------------------------- the definition
def test_a_definition_declares_max_running_and_a_tenant_key_that_parses() -> None:
    definition = parse_definition(limited(3, tenant_key="customer.id"))
    assert definition.tenancy is not None
    assert (definition.tenancy.max_running, definition.tenancy.tenant_key, definition.tenancy.over_limit) == (
        3,
        "customer.id",
        "refuse",
    )
    for bad, says in [
        ({"max_running": 0}, "greater than or equal to 1"),
        ({"max_running": 1001}, "less than or equal to 1000"),
        ({"max_running": 2, "tenant_key": "customer.["}, "tenant_key is not JMESPath"),
        ({"max_running": 2, "over_limit": "drop"}, "'refuse'"),
        ({"max_running": "2"}, "valid integer"),
    ]:
        with pytest.raises(InvalidDefinitionError, match=says):
            parse_definition({**trip_definition(), "tenancy": bad})


def test_a_definition_without_tenancy_keeps_the_content_id_it_had_before_tenancy_existed() -> None:
    definition = parse_definition(trip_definition())
    document = definition.model_dump(mode="json")
    del document["tenancy"]
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert definition.content_id == hashlib.sha256(text.encode()).hexdigest()[:32]
    assert parse_definition(limited(2)).content_id != definition.content_id


# --------------------------------------------------------------------------------------------- max_running
def test_a_start_over_its_tenants_limit_is_refused_and_writes_nothing_while_another_tenant_starts() -> None:
    # Given a trip limited to 2 running per tenant (the principal), and 2 of client-a's running
    p = Pipeline()
    first, second = p.start(limited(2)), p.start(limited(2))
    workflows_before = set(p.store.workflows)

    # When client-a starts a third, and client-b one
    with pytest.raises(TenantLimitError) as refused:
        p.start(limited(2))
    other = p.start(limited(2), owner="client-b")

    # Then the third is refused naming the tenant, the limit and when to try again, and nothing of it was written
    assert refused.value.retry_after == RETRY_AFTER_SECONDS
    assert str(refused.value) == (
        f"tenant principal#{OWNER} runs 2 or more workflow(s) of trip-booking, at its tenancy.max_running (2): start "
        "again "
        f"after {RETRY_AFTER_SECONDS} s, when one has ended"
    )
    assert set(p.store.workflows) == workflows_before | {other}
    assert holders(p, f"principal#{OWNER}") == {first, second}
    assert holders(p, "principal#client-b") == {other}
    assert p.snapshot(first).workflow.tenant == f"principal#{OWNER}"


def test_a_workflow_gives_its_slot_back_when_it_ends_and_the_next_start_takes_it() -> None:
    # Given client-a's one allowed trip running, and its payment refused so that it compensates
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    first = p.start(limited(1))
    with pytest.raises(TenantLimitError):
        p.start(limited(1))

    # When it runs to its end (COMPENSATED)
    p.pump()

    # Then its slot was given back, and the next start takes it
    assert statuses(p, first) == [WorkflowStatus.COMPENSATED]
    assert holders(p, f"principal#{OWNER}") == set()
    second = p.start(limited(1))
    assert holders(p, f"principal#{OWNER}") == {second}
    p.pump()
    assert statuses(p, second) == [WorkflowStatus.COMPLETED]
    assert holders(p, f"principal#{OWNER}") == set()


def test_a_cancelled_workflow_gives_its_slot_back() -> None:
    p = Pipeline()
    first = p.start(limited(1))
    _, messages = p.scheduler.cancel(first, owner=OWNER, reason="changed plans")
    p.bus.send(messages)
    p.pump()
    assert statuses(p, first) == [WorkflowStatus.CANCELLED]
    assert holders(p, f"principal#{OWNER}") == set()


def test_a_held_workflow_keeps_its_slot_until_it_ends() -> None:
    # Given a trip under the hold policy whose payment is refused: it waits for a person, HELD
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    first = p.start({**limited(1), "on_failure": "hold"})
    p.pump()
    assert statuses(p, first) == [WorkflowStatus.HELD]

    # Then it keeps the slot (it may run again), so another start of its tenant is refused
    assert holders(p, f"principal#{OWNER}") == {first}
    with pytest.raises(TenantLimitError):
        p.start({**limited(1), "on_failure": "hold"})


def test_a_repeated_start_with_its_idempotency_key_gets_its_workflow_not_a_refusal() -> None:
    # Given client-a's one allowed trip, started with a key
    p = Pipeline()
    first = p.start(limited(1), key="order-1")

    # When the same start comes again (the client's retry), and then another with a new key
    again = p.start(limited(1), key="order-1")
    with pytest.raises(TenantLimitError):
        p.start(limited(1), key="order-2")

    # Then the repeat is the same workflow, holding one slot
    assert again == first
    assert holders(p, f"principal#{OWNER}") == {first}


def test_a_repeat_of_an_ended_start_takes_no_slot() -> None:
    p = Pipeline()
    first = p.start(limited(1), key="order-1")
    p.pump()
    assert p.start(limited(1), key="order-1") == first
    assert holders(p, f"principal#{OWNER}") == set()


# --------------------------------------------------------------------------------------------- the tenant key
def test_the_tenant_key_on_the_input_makes_one_tenant_of_every_principal_starting_for_it() -> None:
    # Given a trip limited to 1 per customer
    p = Pipeline()
    definition = limited(1, tenant_key="customer.id")
    acme = p.start(definition, {**TRIP_INPUT, "customer": {"id": "acme"}})

    # When another principal starts one for the same customer, and one for another customer
    with pytest.raises(TenantLimitError, match="tenant key#acme"):
        p.start(definition, {**TRIP_INPUT, "customer": {"id": "acme"}}, owner="client-b")
    numbered = p.start(definition, {**TRIP_INPUT, "customer": {"id": 42}}, owner="client-b")

    # Then the customer is the tenant, whoever starts it
    assert holders(p, "key#acme") == {acme}
    assert holders(p, "key#42") == {numbered}


@pytest.mark.parametrize(
    ("customer", "says"),
    [
        (None, "gives null (nothing) on this input"),
        ({"id": {"nested": 1}}, "gives an object"),
        ({"id": True}, "gives a boolean"),
        ({"id": ""}, "gives a tenant of 0 characters"),
        ({"id": "x" * 257}, "gives a tenant of 257 characters"),
    ],
)
def test_a_tenant_key_that_names_no_tenant_refuses_the_start_and_says_why(customer: Any, says: str) -> None:
    p = Pipeline()
    workflow_input = dict(TRIP_INPUT) if customer is None else {**TRIP_INPUT, "customer": customer}
    with pytest.raises(TenantKeyError, match=re.escape(says)):
        p.start(limited(1, tenant_key="customer.id"), workflow_input)
    assert p.store.workflows == {}
    assert p.tenancy.items == {}


# --------------------------------------------------------------------------------------------- no slot leaks
def test_a_slot_whose_give_back_was_lost_is_given_back_by_the_next_start_that_needs_it() -> None:
    # Given client-a's one allowed trip, ended, whose give-back was lost (the function crashed after its write)
    p = Pipeline()
    first = p.start(limited(1))
    release = p.tenancy.release
    p.tenancy.release = lambda *args: Released(False)  # type: ignore[method-assign]
    p.pump()
    p.tenancy.release = release  # type: ignore[method-assign]
    assert statuses(p, first) == [WorkflowStatus.COMPLETED]
    assert holders(p, f"principal#{OWNER}") == {first}

    # When the next start finds every slot taken
    second = p.start(limited(1))

    # Then it looked at the holder, gave its slot back and took it
    assert holders(p, f"principal#{OWNER}") == {second}


def test_a_slot_of_a_start_that_never_wrote_its_workflow_is_given_back_after_the_grace() -> None:
    # Given a slot taken by a start that crashed before writing its workflow
    p = Pipeline()
    now = int(p.clock.now())
    assert p.tenancy.take("trip-booking", f"principal#{OWNER}", "never-written", 1, now)

    # When a start comes within the grace (its write may be in flight), then one after the grace and the pruning period
    with pytest.raises(TenantLimitError):
        p.start(limited(1))
    p.clock.advance(max(HOLDER_GRACE_SECONDS, PRUNE_SECONDS) + 1)
    started = p.start(limited(1))

    # Then the first was refused and the second took the slot of the workflow that never came
    assert holders(p, f"principal#{OWNER}") == {started}


def test_a_burst_over_the_limit_looks_at_the_holders_once_per_period() -> None:
    # Given client-a's one allowed trip running
    p = Pipeline()
    p.start(limited(1))
    looked: list[str] = []
    slots = p.tenancy.slots

    def counted(definition: str, tenant: str) -> Any:
        looked.append(tenant)
        return slots(definition, tenant)

    p.tenancy.slots = counted  # type: ignore[method-assign]

    # When 20 starts come within the pruning period, then one after it
    for _ in range(20):
        with pytest.raises(TenantLimitError):
            p.start(limited(1))
    p.clock.advance(PRUNE_SECONDS)
    with pytest.raises(TenantLimitError):
        p.start(limited(1))

    # Then the holders were read once per period: twice
    assert looked == [f"principal#{OWNER}"] * 2


def test_a_definition_without_tenancy_takes_no_slot() -> None:
    p = Pipeline()
    workflow_id = p.start()
    assert p.snapshot(workflow_id).workflow.tenant is None
    assert p.tenancy.items == {}
    assert isinstance(parse_definition(trip_definition()), WorkflowDefinition)

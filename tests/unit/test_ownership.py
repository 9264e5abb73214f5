"""Who owns a workflow, how its id is made, which actions an agent accepts, and who may be the caller."""

from __future__ import annotations

import uuid

import pytest

from sasflow.errors import ConfigurationError, InvalidDefinitionError, UnauthenticatedError, WorkflowNotFoundError
from sasflow.identity import normalise_arn, principal_of
from sasflow.scheduler import workflow_id_for
from sasflow.states import WorkflowStatus
from tests.support.pipeline import OWNER, TRIP_INPUT, Pipeline, trip_definition

OTHER = "arn:aws:iam::123456789012:user/someone-else"


def test_the_same_key_from_two_principals_gives_two_workflows_and_from_one_the_same() -> None:
    p = Pipeline()
    first = p.start(key="order-1")
    again = p.start(key="order-1")
    other = p.start(key="order-1", owner=OTHER)
    assert first == again
    assert other != first
    assert (p.snapshot(first).workflow.owner, p.snapshot(other).workflow.owner) == (OWNER, OTHER)


def test_an_id_cannot_be_computed_from_a_key_without_the_secret() -> None:
    # the id is HMAC-SHA256(secret, owner || key): another secret, or another owner, gives an unrelated id
    one = workflow_id_for(OWNER, "order-1", lambda: b"secret-1")
    assert one == workflow_id_for(OWNER, "order-1", lambda: b"secret-1")
    assert one != workflow_id_for(OWNER, "order-1", lambda: b"secret-2")
    assert one != workflow_id_for(OTHER, "order-1", lambda: b"secret-1")
    assert str(uuid.UUID(one)) == one
    # the build this replaces derived it from the key alone (uuid5 under a namespace fixed in the code)
    legacy = str(uuid.uuid5(uuid.UUID("0d4f7a3e-8a54-4a43-b1c6-7e4fd1b3c2aa"), "order-1"))
    assert one != legacy
    # without a key it is random
    assert workflow_id_for(OWNER, None, None) != workflow_id_for(OWNER, None, None)
    with pytest.raises(ConfigurationError, match="WORKFLOW_ID_SECRET"):
        workflow_id_for(OWNER, "order-1", None)


def test_another_principal_cannot_cancel_a_workflow_and_nothing_changes() -> None:
    p = Pipeline()
    wid = p.start()
    before = p.snapshot(wid)
    with pytest.raises(WorkflowNotFoundError):
        p.scheduler.cancel(wid, owner=OTHER)
    assert p.snapshot(wid) == before
    snapshot, _ = p.scheduler.cancel(wid, owner=OWNER)
    assert snapshot.workflow.status is WorkflowStatus.CANCELLING


def test_an_action_its_agent_does_not_accept_is_refused_and_nothing_is_written() -> None:
    p = Pipeline()
    definition = trip_definition()
    definition["steps"][2]["action"] = "refund_everything"
    definition["steps"][0]["compensation"]["action"] = "drop_table"
    with pytest.raises(InvalidDefinitionError) as refused:
        p.start(definition, TRIP_INPUT)
    message = str(refused.value)
    assert "reserve_flight: flights.drop_table" in message
    assert "charge_card: payments.refund_everything" in message
    assert "payments: charge, refund" in message
    assert p.store.writes == {}


def test_the_principal_is_the_verified_iam_arn_and_an_assumed_role_keeps_its_role_only() -> None:
    user = {"authorizer": {"iam": {"userArn": "arn:aws:iam::123456789012:user/alice"}}}
    role = {"authorizer": {"iam": {"userArn": "arn:aws:sts::123456789012:assumed-role/checkout/i-0abc123"}}}
    assert principal_of(user, "AWS_IAM") == "arn:aws:iam::123456789012:user/alice"
    assert principal_of(role, "AWS_IAM") == "arn:aws:sts::123456789012:assumed-role/checkout"
    assert normalise_arn("arn:aws:iam::123456789012:root") == "arn:aws:iam::123456789012:root"


def test_the_principal_of_a_jwt_is_its_issuer_and_subject() -> None:
    context = {"authorizer": {"jwt": {"claims": {"iss": "https://idp.example/pool", "sub": "u-1"}, "scopes": []}}}
    assert principal_of(context, "JWT") == "jwt:https://idp.example/pool#u-1"


@pytest.mark.parametrize(
    ("context", "mode"),
    [
        ({}, "AWS_IAM"),
        ({"authorizer": {"iam": {"userArn": None}}}, "AWS_IAM"),
        ({"authorizer": {"jwt": {"claims": {"iss": "x", "sub": "y"}}}}, "AWS_IAM"),  # the wrong kind of identity
        ({"authorizer": {"iam": {"userArn": "arn:aws:iam::1:user/a"}}}, "JWT"),
        ({"authorizer": {"jwt": {"claims": {"sub": "y"}}}}, "JWT"),
        ({"authorizer": {"iam": {"userArn": "arn:aws:iam::123456789012:user/" + "a" * 600}}}, "AWS_IAM"),
    ],
)
def test_a_request_without_the_identity_its_mode_needs_is_refused(context: dict[str, object], mode: str) -> None:
    with pytest.raises(UnauthenticatedError):
        principal_of(context, mode)  # type: ignore[arg-type]

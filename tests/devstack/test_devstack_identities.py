"""The local stack's SigV4 check (devstack.identities.verify): what the security trial got past it, refused."""

from __future__ import annotations

import hashlib

import pytest

from devstack.identities import SignatureError, sign, verify

URL = "http://127.0.0.1:3000/workflows"
REGION = "us-east-1"


def signed(body: bytes, extra: dict[str, str]) -> dict[str, str]:
    """Headers of a POST of ``body`` signed by client-a, with ``extra`` headers signed too."""
    return sign(
        "POST",
        URL,
        body=body,
        headers={"host": "127.0.0.1:3000", "content-type": "application/json", **extra},
        region=REGION,
    )


def check(headers: dict[str, str], body: bytes) -> str:
    return verify("POST", URL, list(headers.items()), body, region=REGION).name


def test_a_signed_payload_hash_that_matches_the_body_is_accepted() -> None:
    body = b'{"amount": 1}'
    headers = signed(body, {"X-Amz-Content-Sha256": hashlib.sha256(body).hexdigest()})
    assert check(headers, body) == "client-a"


@pytest.mark.parametrize("claimed", ["signed body", "UNSIGNED-PAYLOAD"])
def test_a_body_other_than_the_one_hashed_is_refused(claimed: str) -> None:
    # The trial signed body A with X-Amz-Content-Sha256 (A's hash, or UNSIGNED-PAYLOAD) and sent body B: 201 before.
    body_a, body_b = b'{"amount": 1}', b'{"amount": 999999}'
    value = hashlib.sha256(body_a).hexdigest() if claimed == "signed body" else claimed
    headers = signed(body_a, {"X-Amz-Content-Sha256": value})
    with pytest.raises(SignatureError, match="X-Amz-Content-Sha256 does not match the body"):
        check(headers, body_b)


def test_a_session_token_with_long_term_keys_is_refused() -> None:
    # The trial's bogus X-Amz-Security-Token on an IAM user's key was accepted; AWS refuses it.
    body = b"{}"
    headers = signed(body, {"X-Amz-Security-Token": "bogus"})
    with pytest.raises(SignatureError, match="security token is not valid"):
        check(headers, body)

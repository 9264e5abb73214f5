"""boto3 clients for the local target, built only when called (never at import).

boto3 is imported through importlib because it ships no type information in this project's venv; callers type the
clients with ``mypy-boto3-*`` under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

FAKE_CREDENTIALS: Final = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "aws_session_token": "testing",
}
"""Credentials for moto; moto maps any unknown key to its default account 123456789012."""


def client(service: str, *, region: str, endpoint_url: str | None = None, new_session: bool = False) -> Any:
    """A boto3 client for ``service``.

    Parameters
    ----------
    service
        E.g. ``"sqs"``.
    region
        AWS region.
    endpoint_url
        A moto server: the client gets this endpoint and fake credentials. ``None`` keeps boto3's defaults (moto's
        ``mock_aws``, or ``AWS_ENDPOINT_URL``).
    new_session
        Build the client from its own session, as a thread other than the one that created the default session
        must (boto3's default session is not thread-safe).
    """
    boto3 = importlib.import_module("boto3")
    factory = boto3.session.Session() if new_session else boto3
    if endpoint_url:
        return factory.client(service, region_name=region, endpoint_url=endpoint_url, **FAKE_CREDENTIALS)
    return factory.client(service, region_name=region)

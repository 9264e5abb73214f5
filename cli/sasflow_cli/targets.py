"""Where the CLI sends its requests, and who signs them.

- ``--url URL`` (or ``SASFLOW_URL``): the local stack (``make up``). Requests are signed by one of its local
  identities (``--as operator|client-a|client-b``, `devstack.identities`), whose keys mean nothing to AWS.
- ``--stack NAME`` (or ``SASFLOW_STACK``): a deployed stack. The API's URL is the stack's ``ApiUrl`` output
  (template.yaml ``Outputs``), read with CloudFormation ``DescribeStacks``; requests are signed for
  ``execute-api`` by botocore's SigV4 signer with the standard credential chain (environment, profile, SSO, role),
  in the session's region (``--region`` or the profile's).
- Neither: the ``make up`` running in this folder, found through its lock file ``.devstack/up.lock`` (its
  ``api_url``; the file is emptied when that stack stops), as ``python -m devstack faults`` finds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .client import SasflowClient, Signer, Transport

if TYPE_CHECKING:
    import boto3

__all__ = [
    "API_URL_OUTPUT",
    "LOCAL_IDENTITIES",
    "AwsSigner",
    "LocalSigner",
    "TargetError",
    "api_url_of_stack",
    "build_client",
]

#: The stack output that holds the API's base URL (template.yaml ``Outputs``).
API_URL_OUTPUT = "ApiUrl"
#: The local stack's identities (`devstack.identities`).
LOCAL_IDENTITIES = ("operator", "client-a", "client-b")


class TargetError(Exception):
    """No API to talk to: neither --url nor --stack, both, or a stack without its ``ApiUrl`` output."""


def _local_identities() -> ModuleType:
    """`devstack.identities`, from the sasflow repository this CLI is installed from (an editable install)."""
    try:
        from devstack import identities
    except ImportError:
        # `make venv` installs the CLI editable from cli/; the local stack's identities live at the repo's root.
        root = Path(__file__).resolve().parents[2]
        if not (root / "devstack" / "identities.py").is_file():
            raise TargetError(
                "--url signs as a local-stack identity (devstack.identities), which only the sasflow repository "
                "has; use --stack for a deployed API"
            ) from None
        sys.path.append(str(root))
        from devstack import identities
    return identities


@dataclass(frozen=True)
class LocalSigner:
    """Signs as one of the local stack's identities (botocore's signer, as `devstack.identities.sign`)."""

    caller: str
    region: str = "us-east-1"

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        signed: dict[str, str] = _local_identities().sign(
            method, url, body=body, headers=dict(headers), caller=self.caller, region=self.region
        )
        return signed


class AwsSigner:
    """Signs for ``execute-api`` with a boto3 session's credentials (refreshed by botocore when they expire)."""

    def __init__(self, session: boto3.Session, region: str) -> None:
        credentials = session.get_credentials()
        if credentials is None:
            raise TargetError("no AWS credentials found (environment, profile, SSO or role)")
        self.credentials = credentials
        self.region = region

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        SigV4Auth(self.credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())


def api_url_of_stack(session: boto3.Session, stack_name: str) -> str:
    """The ``ApiUrl`` output of CloudFormation stack ``stack_name``.

    Raises
    ------
    TargetError
        The stack does not exist or has no such output.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except (ClientError, BotoCoreError) as error:
        raise TargetError(f"stack {stack_name}: {error}") from error
    outputs: list[Any] = stacks[0].get("Outputs", []) if stacks else []
    for output in outputs:
        if output.get("OutputKey") == API_URL_OUTPUT:
            return str(output["OutputValue"])
    raise TargetError(f"stack {stack_name} has no {API_URL_OUTPUT} output (is it a sasflow stack?)")


#: The lock file of the ``make up`` of a checkout, relative to it (devstack.uplock writes it).
UP_LOCK = Path(".devstack") / "up.lock"


def running_local_url(lock: Path = UP_LOCK) -> str | None:
    """The API URL of the ``make up`` running in this folder, or None: no lock file, one nobody holds (its stack
    stopped, however it ended), or one still starting (no ``api_url`` yet).

    Live means what ``devstack.uplock.read_running`` means (this package does not import devstack): ``make up``
    holds an ``flock`` on the file for its life, which the kernel drops when the process ends.
    """
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: a live stack
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        running = json.loads(lock.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    api_url = running.get("api_url") if isinstance(running, dict) else None
    return api_url if isinstance(api_url, str) else None


def build_client(
    *,
    url: str | None,
    stack: str | None,
    caller: str = "operator",
    region: str | None = None,
    transport: Transport | None = None,
    session: boto3.Session | None = None,
) -> SasflowClient:
    """The client of one target (see the module docstring).

    Raises
    ------
    TargetError
        Neither or both of ``url`` and ``stack``, an unknown local identity, or a stack that cannot be read.
    """
    if not url and not stack:
        url = running_local_url()
    if bool(url) == bool(stack):
        raise TargetError(
            "give the API with --url URL (local stack) or --stack NAME (deployed), exactly one"
            + ("" if stack else "; no `make up` is running in this folder to default to")
        )
    signer: Signer
    if url:
        parsed = urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise TargetError(
                f"--url {url}: expected the API's URL with its scheme, as make up prints it (http://127.0.0.1:3000)"
            )
        if caller not in LOCAL_IDENTITIES:
            raise TargetError(f"--as {caller}: the local identities are {', '.join(LOCAL_IDENTITIES)}")
        signer = LocalSigner(caller, region or "us-east-1")
        return SasflowClient(url, signer, transport=transport, operator=caller == "operator")
    import boto3

    session = session or boto3.Session(region_name=region)
    if not session.region_name:
        raise TargetError("no AWS region: pass --region or set one in your profile or AWS_REGION")
    assert stack is not None  # nosec B101 # narrowed: exactly one of url and stack is set
    base_url = api_url_of_stack(session, stack)
    return SasflowClient(base_url, AwsSigner(session, session.region_name), transport=transport)

"""The local stack's IAM: a few identities, their execute-api policies, and SigV4 checked as API Gateway does.

API Gateway answers an ``AWS_IAM`` route only for a request signed with Signature Version 4 by credentials whose
policies allow ``execute-api:Invoke`` on ``arn:aws:execute-api:<region>:<account>:<api id>/<stage>/<METHOD>/<path>``
(API Gateway developer guide, "Control access to HTTP APIs with IAM authorization"); anything else gets 403
``{"message":"Forbidden"}``. The emulator does the same with the identities below, so the demo, the load run, fuzzing
and the tests sign their requests (with botocore's signer, `sign`) exactly as they would against AWS.

The signature is recomputed by botocore's own SigV4 code (``botocore.auth.SigV4Auth``) over the headers the request
names in ``SignedHeaders``, at the request's ``X-Amz-Date``; it is never written by hand here. A request older or
newer than five minutes is refused, as AWS refuses it.

Identities (access keys are for this machine only, never real):

- ``client-a`` and ``client-b``: two callers with the client policy of docs/security.md (``/workflows`` routes
  and the OpenAPI document), so ownership can be shown: B cannot see A's workflows;
- ``operator``: an assumed role with the operator policy (every route, ``/ops`` included).
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from devstack.template import ACCOUNT_ID

__all__ = ["IDENTITIES", "Identity", "SignatureError", "sign", "verify"]

#: How far a signed request's X-Amz-Date may be from now (AWS's limit for SigV4).
MAX_SKEW: Final = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Identity:
    """A local caller: its credentials, the ARN API Gateway reports for it, and its execute-api policy."""

    name: str
    access_key: str
    secret_key: str
    arn: str
    user_id: str
    #: ``execute-api:Invoke`` resources it is allowed (IAM wildcards: ``*`` and ``?`` match any characters).
    allowed: tuple[str, ...]

    @property
    def credentials(self) -> Credentials:
        """botocore credentials, for signing."""
        return Credentials(self.access_key, self.secret_key)


def _api_arn(path: str) -> str:
    return f"arn:aws:execute-api:*:{ACCOUNT_ID}:*/*/{path}"


#: The client policy of docs/security.md: start, read and cancel workflows, answer callbacks, publish and read
#: definitions, read the OpenAPI document.
CLIENT_POLICY: Final = (
    _api_arn("POST/workflows"),
    _api_arn("GET/workflows/*"),
    _api_arn("POST/workflows/*/cancel"),
    _api_arn("POST/callbacks/*"),
    _api_arn("GET/definitions"),
    _api_arn("GET/definitions/*"),
    _api_arn("PUT/definitions/*"),
    _api_arn("GET/openapi.json"),
)
#: The operator policy: every route, the operator routes under /ops among them.
OPERATOR_POLICY: Final = (_api_arn("*"),)

IDENTITIES: Final = {
    identity.access_key: identity
    for identity in (
        Identity(
            "client-a",
            "AKIALOCALCLIENTA0001",
            "local-client-a-secret-not-for-aws",
            f"arn:aws:iam::{ACCOUNT_ID}:user/client-a",
            "AIDALOCALCLIENTA0001",
            CLIENT_POLICY,
        ),
        Identity(
            "client-b",
            "AKIALOCALCLIENTB0002",
            "local-client-b-secret-not-for-aws",
            f"arn:aws:iam::{ACCOUNT_ID}:user/client-b",
            "AIDALOCALCLIENTB0002",
            CLIENT_POLICY,
        ),
        Identity(
            "operator",
            "AKIALOCALOPERATOR003",
            "local-operator-secret-not-for-aws",
            f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/sasflow-operator/oncall",
            "AROALOCALOPERATOR003:oncall",
            OPERATOR_POLICY,
        ),
    )
}


def identity(name: str) -> Identity:
    """The local identity called ``name`` (``client-a``, ``client-b``, ``operator``).

    Raises
    ------
    KeyError
        When there is no such identity.
    """
    for candidate in IDENTITIES.values():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no local identity {name!r}; there are {sorted(i.name for i in IDENTITIES.values())}")


def sign(
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    caller: str = "client-a",
    region: str = "us-east-1",
) -> dict[str, str]:
    """The headers of a request to ``url`` signed for ``execute-api`` by a local identity (botocore's signer).

    Returns
    -------
    dict
        ``headers`` with ``Authorization`` and ``X-Amz-Date`` (and the host) added.
    """
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    SigV4Auth(identity(caller).credentials, "execute-api", region).add_auth(request)
    return dict(request.headers.items())


class SignatureError(Exception):
    """The request is not signed, or not signed validly, by a known identity (API Gateway's 403)."""


def verify(
    method: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body: bytes,
    *,
    region: str,
    now: datetime.datetime | None = None,
) -> Identity:
    """Check a request's SigV4 signature as API Gateway does; return the identity that signed it.

    Parameters
    ----------
    method, url, headers, body
        The request as received (``url`` with the host the client used and the raw path and query).
    region
        The API's region (part of the credential scope).
    now
        The current time (UTC); defaults to the clock.

    Raises
    ------
    SignatureError
        No or malformed Authorization header, an unknown access key, a scope of another region or service, a date
        more than five minutes away, a session token with long-term keys, an ``X-Amz-Content-Sha256`` that is not the
        body's hash, or a signature that does not match.
    """
    received = {name.lower(): value for name, value in headers}
    authorization = received.get("authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        raise SignatureError("missing or unsupported Authorization header")
    fields = dict(
        part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 ") :].split(",") if "=" in part
    )
    try:
        access_key, date, scope_region, service, terminator = fields["Credential"].split("/")
        signed_headers = fields["SignedHeaders"].split(";")
        signature = fields["Signature"]
    except (KeyError, ValueError):
        raise SignatureError("malformed Authorization header") from None
    caller = IDENTITIES.get(access_key)
    if caller is None:
        raise SignatureError("unknown access key")
    if (scope_region, service, terminator) != (region, "execute-api", "aws4_request"):
        raise SignatureError("credential scope is not this API's")
    amz_date = received.get("x-amz-date", "")
    try:
        stamped = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise SignatureError("missing or malformed X-Amz-Date") from None
    moment = now or datetime.datetime.now(datetime.UTC)
    if abs(moment - stamped) > MAX_SKEW or not amz_date.startswith(date):
        raise SignatureError("signature expired or not yet valid")
    if "host" not in signed_headers or any(name not in received for name in signed_headers):
        raise SignatureError("a signed header is missing")
    if "x-amz-security-token" in received:
        # The local identities are long-term keys (an IAM user's, or a role's stand-in): a session token belongs to
        # temporary credentials only, and AWS refuses one that is not theirs.
        raise SignatureError("the security token is not valid for these credentials")
    claimed = received.get("x-amz-content-sha256")
    if claimed is not None and claimed != hashlib.sha256(body).hexdigest():
        # botocore (as any signer) takes the payload's hash from this header when it is there: a request must not
        # pass with a body other than the one hashed (nor with UNSIGNED-PAYLOAD, which execute-api does not take).
        raise SignatureError("X-Amz-Content-Sha256 does not match the body")
    # Rebuild the request with exactly the headers it signed, and let botocore compute the signature it should have.
    request = AWSRequest(method=method, url=url, data=body, headers={name: received[name] for name in signed_headers})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(caller.credentials, "execute-api", region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, signature):
        raise SignatureError("signature does not match")
    return caller


def allows(caller: Identity, *, region: str, api_id: str, method: str, path: str) -> bool:
    """Whether the caller's policy allows ``execute-api:Invoke`` of ``METHOD path`` on the ``$default`` stage."""
    resource = f"arn:aws:execute-api:{region}:{ACCOUNT_ID}:{api_id}/$default/{method.upper()}{path}"
    return any(fnmatch.fnmatchcase(resource, pattern) for pattern in caller.allowed)


def request_context_authorizer(caller: Identity) -> dict[str, Any]:
    """``requestContext.authorizer`` of an IAM-authorized HTTP API request (payload 2.0), for ``caller``."""
    return {
        "iam": {
            "accessKey": caller.access_key,
            "accountId": ACCOUNT_ID,
            "callerId": caller.user_id,
            "cognitoIdentity": None,
            "principalOrgId": None,
            "userArn": caller.arn,
            "userId": caller.user_id,
        }
    }


def host_url(headers: Iterable[tuple[str, str]], raw_path: str, raw_query: str) -> str:
    """The URL a client signed: ``http://<Host header><path>[?query]``."""
    host = next((value for name, value in headers if name.lower() == "host"), "127.0.0.1")
    query = f"?{raw_query}" if raw_query else ""
    return f"http://{host}{raw_path}{query}"


def path_of(url: str) -> str:
    """The path of ``url`` (for policy checks)."""
    return urlsplit(url).path or "/"

"""Who is calling the API: the principal a workflow belongs to, taken from what API Gateway verified.

API Gateway authorizes every route (template ``ApiAuthorizer``: ``AWS_IAM`` by default, or ``JWT``) before the
function runs, and puts the verified identity into the request context of the HTTP API payload 2.0 (API Gateway
developer guide, "Working with AWS Lambda proxy integrations for HTTP APIs"). The principal is:

- IAM: the caller's ARN (``requestContext.authorizer.iam.userArn``). An assumed role's session name is dropped
  (``arn:aws:sts::<account>:assumed-role/<role>/<session>`` becomes ``.../assumed-role/<role>``): a client's role
  gets new session names as its credentials rotate, and must keep reaching its own workflows.
- JWT: ``jwt:<issuer>#<subject>`` from the token's ``iss`` and ``sub`` claims.

A request without the identity its mode requires is refused (``UnauthenticatedError``), never served anonymously:
only a misconfigured route or a direct invocation can produce one.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from .errors import UnauthenticatedError

AuthorizerMode = Literal["AWS_IAM", "JWT"]
_ASSUMED_ROLE = re.compile(r"^(arn:aws[a-z-]*:sts::\d{12}:assumed-role/[^/]+)/.+$")
#: A principal is stored with every workflow and compared on every read; bound its size.
MAX_PRINCIPAL_CHARS = 512


def normalise_arn(arn: str) -> str:
    """The principal of an IAM caller's ARN: an assumed role without its session name, anything else as it is."""
    match = _ASSUMED_ROLE.match(arn)
    return match.group(1) if match else arn


def principal_of(request_context: dict[str, Any], mode: AuthorizerMode, *, keep_session: bool = False) -> str:
    """The principal of a request, from its ``requestContext`` (payload 2.0), for the deployment's authorizer.

    Parameters
    ----------
    request_context:
        The event's ``requestContext`` as Lambda received it.
    mode:
        The deployment's authorizer (environment ``API_AUTHORIZER``).
    keep_session:
        Keep an assumed role's session name: an operator's audit names the person (``.../sasflow-operator/ada``),
        where ownership needs the role.

    Returns
    -------
    str
        The principal (at most `MAX_PRINCIPAL_CHARS` characters).

    Raises
    ------
    UnauthenticatedError
        When the context lacks the identity the mode requires, or it is malformed.
    """
    authorizer = request_context.get("authorizer") or {}
    if mode == "AWS_IAM":
        arn = str(((authorizer.get("iam") or {}).get("userArn")) or "")
        if not arn.startswith("arn:"):
            raise UnauthenticatedError("the request carries no verified IAM identity")
        principal = arn if keep_session else normalise_arn(arn)
    else:
        claims = (authorizer.get("jwt") or {}).get("claims") or {}
        issuer, subject = str(claims.get("iss") or ""), str(claims.get("sub") or "")
        if not issuer or not subject:
            raise UnauthenticatedError("the request carries no verified token (iss and sub claims)")
        principal = f"jwt:{issuer}#{subject}"
    if len(principal) > MAX_PRINCIPAL_CHARS:
        raise UnauthenticatedError("the caller's identity is too long")
    return principal

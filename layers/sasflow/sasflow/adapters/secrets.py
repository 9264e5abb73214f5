"""Secret values for agents' remote-service credentials, read through powertools' parameters utility.

A source is ``secretsmanager:<secret id or ARN>`` or ``ssm:<parameter name>`` (a SecureString, read decrypted). The
utility caches each value for ``max_age`` seconds per Lambda sandbox, so a warm agent reads it once per period, not
once per call (powertools documentation, "Parameters": caching).
"""

from __future__ import annotations

from collections.abc import Callable


def secret_reader(source: str, *, max_age: int) -> Callable[[], str]:
    """Return a function that reads the secret of ``source`` (cached for ``max_age`` seconds).

    Raises
    ------
    ValueError
        When ``source`` is neither ``secretsmanager:...`` nor ``ssm:...``.
    """
    kind, _, name = source.partition(":")
    if not name or kind not in ("secretsmanager", "ssm"):
        raise ValueError(f"a secret source is secretsmanager:<id> or ssm:<name>, not {source!r}")

    def read() -> str:
        from aws_lambda_powertools.utilities import parameters

        if kind == "secretsmanager":
            return str(parameters.get_secret(name, max_age=max_age))
        return str(parameters.get_parameter(name, decrypt=True, max_age=max_age))

    return read

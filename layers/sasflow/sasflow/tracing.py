"""The powertools Tracer of every handler, without the X-Ray SDK when tracing is off; and lean log lines.

Powertools builds its X-Ray provider (``aws_xray_sdk.core``: the recorder, its sampler and a botocore session, about
15 ms of a cold start) even when tracing is disabled, and then merely switches the SDK off. The template turns tracing
off by default (parameter ``Tracing=PassThrough`` sets ``POWERTOOLS_TRACE_DISABLED=true``), so a handler built with
`build_tracer` then gets powertools' Tracer over a provider whose segments record nothing, and the X-Ray SDK is never
imported. With ``Tracing=Active`` it is powertools' Tracer as usual.

The decision is read from the environment when the handler module is imported, as powertools' own ``Tracer()`` does
(Lambda sets the function's environment before the init phase).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.shared.functions import resolve_truthy_env_var_choice
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment

#: The variable powertools reads to disable tracing (set by template.yaml from the ``Tracing`` parameter).
TRACE_DISABLED_ENV = "POWERTOOLS_TRACE_DISABLED"


class _UnrecordedSegment(BaseSegment):
    """A segment of a disabled tracer: nothing it is given is kept or sent."""

    def close(self, end_time: int | None = None) -> None:
        """Nothing to close."""

    def add_subsegment(self, subsegment: Any) -> None:
        """Subsegments are not recorded."""

    def remove_subsegment(self, subsegment: Any) -> None:
        """Subsegments are not recorded."""

    def put_annotation(self, key: str, value: Any) -> None:
        """Annotations are not recorded."""

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        """Metadata is not recorded."""

    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None:
        """Exceptions are not recorded (the handler's logs still have them)."""


class DisabledTracingProvider(BaseProvider):
    """A powertools tracing provider for a function whose tracing is off: it records nothing and imports nothing."""

    @contextlib.contextmanager
    def in_subsegment(self, name: str | None = None, **kwargs: Any) -> Iterator[BaseSegment]:
        """Yield a segment that records nothing."""
        yield _UnrecordedSegment()

    @contextlib.asynccontextmanager
    async def in_subsegment_async(self, name: str | None = None, **kwargs: Any) -> AsyncIterator[BaseSegment]:
        """Yield a segment that records nothing."""
        yield _UnrecordedSegment()

    def put_annotation(self, key: str, value: Any) -> None:
        """Annotations are not recorded."""

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        """Metadata is not recorded."""

    def patch(self, modules: Sequence[str]) -> None:
        """Nothing is instrumented."""

    def patch_all(self) -> None:
        """Nothing is instrumented."""


def tracing_disabled() -> bool:
    """Whether ``POWERTOOLS_TRACE_DISABLED`` turns tracing off (powertools' own reading of the variable)."""
    return bool(resolve_truthy_env_var_choice(env=os.getenv(TRACE_DISABLED_ENV, "false")))


def build_tracer() -> Tracer:
    """Return powertools' ``Tracer``; when tracing is off, over `DisabledTracingProvider` (no X-Ray SDK import).

    Returns
    -------
    Tracer
        Use it as usual: ``@tracer.capture_lambda_handler``.
    """
    if tracing_disabled():
        return Tracer(disabled=True, auto_patch=False, provider=DisabledTracingProvider())
    return Tracer()


#: Keys powertools adds to every log line that CloudWatch Logs already holds or that never vary in a function: the
#: log group names the function (its ARN and memory are the function's configuration, its service is the stack's),
#: CloudWatch stamps every event with its time (``@timestamp``, when the runtime wrote the line), and the code
#: location of a line is fixed. About 250 of a line's 520 bytes; CloudWatch Logs bills ingestion by the byte.
REDUNDANT_LOG_KEYS = (
    "function_arn",
    "function_memory_size",
    "function_name",
    "location",
    "cold_start",
    "service",
    "timestamp",
)


def lean_log_keys(logger: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a handler, below ``@logger.inject_lambda_context``, to drop `REDUNDANT_LOG_KEYS` from its lines.

    The request id (``function_request_id``), the correlation id, the level and the message stay.
    """

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(handler)
        def lean(event: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
            logger.remove_keys(list(REDUNDANT_LOG_KEYS))
            return handler(event, context, *args, **kwargs)

        return lean

    return decorate

"""Run a function of the template the way Lambda runs it: one process per execution environment.

Each `FunctionPool` owns a few worker processes (``multiprocessing`` *spawn*, never fork). A worker is one Lambda
execution environment: its ``os.environ`` is the parent's plus the function's variables, the Lambda runtime's
variables and the caller's extra variables; its ``sys.path`` starts with the code folder and the layer folders; it
imports the handler once (the cold start) and then serves one invocation at a time. Module-level state therefore
belongs to one function, even when several functions share a handler module (the three agents run
``agent_handler.py`` with different ``AGENT_NAME``).

What is emulated (source: the Lambda developer guide, "Lambda execution environment" and "Python handler"):

* the context object (``function_name``, ``aws_request_id``, ``get_remaining_time_in_millis()`` ...);
* events and results cross a JSON boundary, as in Lambda, so a handler never shares objects with its caller;
* a handler that raises gives an error result, and the environment keeps serving;
* a handler that runs past its ``Timeout`` is stopped (its process is killed and replaced), as Lambda does;
* START / END / REPORT lines and everything the handler prints go to ``<log_dir>/<LogicalId>.log``; REPORT's
  ``Max Memory Used`` is the invocation's own peak resident set (``_max_memory_text``).

A worker also calls the hooks named by ``DEVSTACK_WORKER_INIT`` (``module:function``, comma-separated) before it
imports the handler; the local stack has no other way to reach inside a function's process.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from devstack.template import ACCOUNT_ID, FunctionSpec

__all__ = ["INIT_HOOK_VARIABLE", "FunctionPool", "InvokeResult", "LambdaContext", "lambda_environment"]

logger = logging.getLogger(__name__)

INIT_HOOK_VARIABLE: Final = "DEVSTACK_WORKER_INIT"
"""Environment variable naming ``module:function`` hooks (comma-separated) that a worker calls once, after its
environment is set and before it imports the handler: e.g. fault injection for a demo (``devstack.chaos:install``).
A hook that raises fails the init phase like an import error."""

_INIT_TIMEOUT_SECONDS: Final = 60.0
"""How long a worker may take to import its handler before an invocation gives up on it (seconds)."""
_TIMEOUT_SLACK_SECONDS: Final = 0.25
"""Extra wait past the function timeout for the result to cross the pipe (seconds)."""
_STOP_GRACE_SECONDS: Final = 3.0


@dataclass(frozen=True)
class InvokeResult:
    """The outcome of one synchronous invocation.

    Attributes
    ----------
    ok
        The handler returned (``payload`` is its JSON-decoded result).
    payload
        The result, or on error Lambda's error object ``{"errorMessage", "errorType", "stackTrace"}``.
    error
        ``"<errorType>: <errorMessage>"`` when not ok.
    duration_ms
        Time in the handler (milliseconds), or the time waited for a timeout or throttle.
    cold_start
        This invocation was the first one served by its execution environment.
    request_id
        The ``aws_request_id`` given to the handler.
    """

    ok: bool
    payload: Any
    error: str | None
    duration_ms: float
    cold_start: bool
    request_id: str = ""


class LambdaContext:
    """The context object Lambda passes to a Python handler (the attributes powertools reads).

    Parameters
    ----------
    function_name, function_version, invoked_function_arn
        Identity of the function.
    memory_limit_in_mb
        ``MemorySize`` in MiB.
    aws_request_id
        Id of this invocation.
    log_group_name, log_stream_name
        Where Lambda would send the logs.
    deadline_ms
        Epoch milliseconds at which the invocation times out.
    """

    def __init__(
        self,
        *,
        function_name: str,
        function_version: str,
        invoked_function_arn: str,
        memory_limit_in_mb: int,
        aws_request_id: str,
        log_group_name: str,
        log_stream_name: str,
        deadline_ms: int,
    ) -> None:
        self.function_name = function_name
        self.function_version = function_version
        self.invoked_function_arn = invoked_function_arn
        self.memory_limit_in_mb = memory_limit_in_mb
        self.aws_request_id = aws_request_id
        self.log_group_name = log_group_name
        self.log_stream_name = log_stream_name
        self.identity: Any = None
        self.client_context: Any = None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the function times out (never negative)."""
        return max(0, self._deadline_ms - int(time.time() * 1000))

    def __repr__(self) -> str:
        return f"LambdaContext({self.function_name!r}, request_id={self.aws_request_id!r})"


def lambda_environment(spec: FunctionSpec, *, region: str, log_stream_name: str = "") -> dict[str, str]:
    """The variables the Lambda runtime sets for a function, besides its own ``Environment``.

    Parameters
    ----------
    spec
        The function.
    region
        AWS region.
    log_stream_name
        The environment's log stream.

    Returns
    -------
    dict
        ``AWS_LAMBDA_FUNCTION_NAME``, ``AWS_LAMBDA_FUNCTION_MEMORY_SIZE`` (MiB), ``AWS_LAMBDA_FUNCTION_TIMEOUT``
        (seconds), ``AWS_REGION`` ... and ``POWERTOOLS_TRACE_DISABLED=true`` (there is no X-Ray daemon offline).
    """
    name = spec.function_name or spec.logical_id
    return {
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_LAMBDA_FUNCTION_NAME": name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(spec.timeout_seconds),
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": log_stream_name,
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime}",
        "LAMBDA_TASK_ROOT": str(spec.code_dir),
        "_HANDLER": spec.handler,
        "TZ": ":UTC",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }


# ----------------------------------------------------------------------------------------- worker process side


def _error_object(error: BaseException, request_id: str) -> dict[str, Any]:
    return {
        "errorMessage": str(error),
        "errorType": type(error).__name__,
        "requestId": request_id,
        "stackTrace": traceback.format_tb(error.__traceback__),
    }


def _redirect_output(log_path: str) -> None:
    """Send this process's fd 1 and 2 (so also C extensions and subprocesses) to the function's log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _import_handler(spec: FunctionSpec) -> Any:
    module_name, _, function_name = spec.handler.rpartition(".")
    module = importlib.import_module(module_name)
    handler = getattr(module, function_name, None)
    if not callable(handler):
        raise AttributeError(f"Handler '{function_name}' missing on module '{module_name}'")
    return handler


def _run_init_hooks(value: str) -> None:
    """Call each ``module:function`` of a comma-separated list (the function defaults to ``install``)."""
    for entry in (part.strip() for part in value.split(",")):
        if entry:
            module_name, _, function_name = entry.partition(":")
            getattr(importlib.import_module(module_name), function_name or "install")()


_PROC_STATUS = "/proc/self/status"
_PROC_CLEAR_REFS = "/proc/self/clear_refs"


def _reset_peak_memory() -> bool:
    """Reset this process's peak resident set (``VmHWM``) to its current one; False where Linux's
    ``/proc/self/clear_refs`` (value 5, Linux 4.0+, proc(5)) is missing. It costs one write: no page is walked."""
    try:
        with open(_PROC_CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return _peak_memory_kb() is not None


def _peak_memory_kb() -> int | None:
    """``VmHWM`` of ``/proc/self/status`` (kB): the peak resident set since the process started or its last reset."""
    try:
        with open(_PROC_STATUS) as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _max_memory_text(per_invocation: bool) -> str:
    """The REPORT line's memory field (MB = 2**20 bytes, as Lambda's).

    ``Max Memory Used`` is this invocation's own peak resident set (``VmHWM`` reset when it started; a cold start's
    includes its init). Where that cannot be measured, the figure is the worker's peak since it started and says so:
    ``ru_maxrss``, which on Linux also keeps the peak of the parent's copy that the worker was forked from before its
    exec (the local stack's own, often larger than the function's ``MemorySize``).
    """
    if per_invocation:
        peak_kb = _peak_memory_kb()
        if peak_kb is not None:
            return f"Max Memory Used: {-(-peak_kb // 1024)} MB"
    try:
        import resource
    except ImportError:  # not a Unix
        return "Max Memory Used: unknown"
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mb = max_rss // 2**20 if sys.platform == "darwin" else max_rss // 1024  # bytes on macOS, kB on Linux
    return f"Worker Max Memory Used (since its start, not this invocation's): {mb} MB"


def _worker_main(  # pragma: no cover - runs in the child process
    conn: Connection, spec: FunctionSpec, env: dict[str, str], log_path: str, hidden_paths: list[str]
) -> None:
    """Entry point of a worker process: init once, then serve invocations until the pipe closes."""
    # Ctrl-C (SIGINT), or a SIGTERM sent to the whole process group (timeout, kill -- -PGID), reaches the workers too;
    # the parent decides when they stop (a None message, then SIGKILL), so an invocation in flight finishes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _redirect_output(log_path)
    os.environ.update(env)
    if hasattr(time, "tzset"):
        time.tzset()
    # Lambda's sys.path holds the function's own code and its layers, not the code of the other functions.
    hidden = {os.path.realpath(path) for path in hidden_paths}
    sys.path[:] = [entry for entry in sys.path if not entry or os.path.realpath(entry) not in hidden]
    sys.path[:0] = [str(spec.code_dir), *(str(path) for path in spec.layer_dirs)]
    importlib.invalidate_caches()
    function_name = env.get("AWS_LAMBDA_FUNCTION_NAME", spec.logical_id)
    arn = f"arn:aws:lambda:{env.get('AWS_REGION', 'us-east-1')}:{ACCOUNT_ID}:function:{function_name}"

    hooks_done = False

    def init() -> tuple[Any, dict[str, Any] | None, float]:
        nonlocal hooks_done
        started = time.perf_counter()
        try:
            if not hooks_done:
                _run_init_hooks(env.get(INIT_HOOK_VARIABLE, ""))
                hooks_done = True
            return _import_handler(spec), None, (time.perf_counter() - started) * 1000
        except Exception as error:  # any init failure is the function's, reported by each invocation
            traceback.print_exc()
            obj = _error_object(error, "")
            if hooks_done:
                module_name = spec.handler.rpartition(".")[0]
                obj.update(errorType="Runtime.ImportModuleError")
                obj.update(errorMessage=f"Unable to import module '{module_name}': {error}")
            else:
                obj.update(errorType="Runtime.InitError")
                obj.update(errorMessage=f"{INIT_HOOK_VARIABLE} hook failed: {type(error).__name__}: {error}")
            return None, obj, (time.perf_counter() - started) * 1000

    handler, init_error, init_ms = init()
    conn.send({"type": "ready", "init_error": init_error, "init_ms": init_ms})
    invocations = 0
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        request_id = str(message["request_id"])
        cold_start = invocations == 0
        invocations += 1
        if handler is None:  # Lambda retries the init phase on the next invocation
            handler, init_error, init_ms = init()
            if handler is None:
                assert init_error is not None
                conn.send(
                    {
                        "ok": False,
                        "payload": {**init_error, "requestId": request_id},
                        "duration_ms": 0.0,
                        "cold_start": cold_start,
                    }
                )
                continue
        context = LambdaContext(
            function_name=function_name,
            function_version="$LATEST",
            invoked_function_arn=arn,
            memory_limit_in_mb=spec.memory_mb,
            aws_request_id=request_id,
            log_group_name=env.get("AWS_LAMBDA_LOG_GROUP_NAME", ""),
            log_stream_name=env.get("AWS_LAMBDA_LOG_STREAM_NAME", ""),
            deadline_ms=int(message["deadline_ms"]),
        )
        print(f"START RequestId: {request_id} Version: $LATEST", flush=True)
        # A cold start's peak includes its init, as Lambda's does; a warm one's starts from what is resident now.
        per_invocation = cold_start or _reset_peak_memory()
        started = time.perf_counter()
        reply: dict[str, Any]
        try:
            result = handler(json.loads(message["event"]), context)
        except Exception as error:  # a failing handler is an error result, like Lambda's
            print(f"[ERROR] {type(error).__name__}: {error}", file=sys.stderr)
            traceback.print_exc()
            reply = {"ok": False, "payload": _error_object(error, request_id)}
        else:
            try:
                reply = {"ok": True, "payload": json.dumps(result)}
            except (TypeError, ValueError) as error:
                obj = _error_object(error, request_id)
                obj.update(errorType="Runtime.MarshalError", errorMessage=f"Unable to marshal response: {error}")
                reply = {"ok": False, "payload": obj}
        duration_ms = (time.perf_counter() - started) * 1000
        print(f"END RequestId: {request_id}", flush=True)
        init_text = f"\tInit Duration: {init_ms:.2f} ms" if cold_start else ""
        print(
            f"REPORT RequestId: {request_id}\tDuration: {duration_ms:.2f} ms"
            f"\tBilled Duration: {int(duration_ms) + 1} ms\tMemory Size: {spec.memory_mb} MB"
            f"\t{_max_memory_text(per_invocation)}{init_text}",
            flush=True,
        )
        reply.update(duration_ms=duration_ms, cold_start=cold_start)
        conn.send(reply)


# ----------------------------------------------------------------------------------------- parent side


class _WorkerDiedError(Exception):
    pass


class _Worker:
    """The parent's handle on one worker process (one execution environment)."""

    def __init__(
        self, spec: FunctionSpec, env: dict[str, str], log_path: Path, index: int, hidden_paths: list[str]
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.spec = spec
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, spec, env, str(log_path), hidden_paths),
            name=f"devstack-{spec.logical_id}-{index}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.ready = False
        self.init_error: dict[str, Any] | None = None
        self.invocations = 0
        self._ready_lock = threading.Lock()

    def wait_ready(self, timeout: float) -> None:
        with self._ready_lock:  # one reader of the "ready" message, even if an invocation races pool.wait_ready()
            if self.ready:
                return
            if not self._conn.poll(timeout):
                raise TimeoutError(f"{self.spec.logical_id}: worker did not start within {timeout:.0f} s")
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                raise _WorkerDiedError("worker exited during init") from None
            self.init_error = message.get("init_error")
            self.ready = True

    def invoke(self, event_text: str, request_id: str, deadline_ms: int, wait_seconds: float) -> dict[str, Any]:
        """Send one invocation and wait for its reply; raises TimeoutError or _WorkerDiedError."""
        self.invocations += 1
        try:
            self._conn.send({"request_id": request_id, "event": event_text, "deadline_ms": deadline_ms})
            answered = self._conn.poll(wait_seconds)
            reply: dict[str, Any] | None = self._conn.recv() if answered else None
        except (EOFError, OSError):
            raise _WorkerDiedError(f"exit code {self.process.exitcode}") from None
        if reply is None:
            raise TimeoutError(f"no reply within {wait_seconds:.2f} s")
        return reply

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        self.process.join(_STOP_GRACE_SECONDS)
        with contextlib.suppress(Exception):
            self._conn.close()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.send(None)
        self.process.join(_STOP_GRACE_SECONDS)
        if self.process.is_alive():
            self.kill()
        with contextlib.suppress(Exception):
            self._conn.close()


class FunctionPool:
    """The execution environments of one function: up to ``max_workers`` worker processes, started on demand.

    Parameters
    ----------
    spec
        The function to run.
    log_dir
        Folder of the log file ``<LogicalId>.log`` (created if missing).
    extra_env
        Variables for every worker, applied last (``AWS_ENDPOINT_URL``, fake credentials ...).
    max_workers
        Largest number of concurrent invocations (execution environments); ``ReservedConcurrentExecutions``
        lowers it.
    region
        AWS region reported to the function.
    init_timeout_seconds
        Largest time a worker may take to import its handler (seconds).
    hidden_paths
        Folders removed from the workers' ``sys.path`` (the other functions' code folders, which Lambda would not
        have), so an import that works only locally fails locally too.

    Raises
    ------
    ValueError
        The runtime is not Python, or ``max_workers`` is below 1.

    Examples
    --------
    >>> with FunctionPool(spec, log_dir=Path(".devstack/logs")) as pool:  # doctest: +SKIP
    ...     result = pool.invoke({"hello": "world"})
    """

    def __init__(
        self,
        spec: FunctionSpec,
        *,
        log_dir: str | Path,
        extra_env: Mapping[str, str] | None = None,
        max_workers: int = 2,
        region: str = "us-east-1",
        init_timeout_seconds: float = _INIT_TIMEOUT_SECONDS,
        hidden_paths: Sequence[str | Path] = (),
    ) -> None:
        if spec.runtime and not spec.runtime.startswith("python"):
            raise ValueError(f"{spec.logical_id}: runtime {spec.runtime} cannot run locally (Python only)")
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.spec = spec
        self.region = region
        self.max_workers = min(max_workers, spec.reserved_concurrency or max_workers)
        self.init_timeout_seconds = init_timeout_seconds
        self.log_dir = Path(log_dir)
        self.log_path = self.log_dir / f"{spec.logical_id}.log"
        self._extra_env = dict(extra_env or {})
        own = {str(spec.code_dir), *(str(path) for path in spec.layer_dirs)}
        self._hidden_paths = [str(path) for path in hidden_paths if str(path) not in own]
        self._idle: list[_Worker] = []
        self._workers: list[_Worker] = []
        self._retired_invocations = 0
        self._starting = 0
        self._started = 0
        self._stopped = False
        self._cond = threading.Condition()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FunctionPool:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _environment(self, index: int) -> dict[str, str]:
        stream = f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{uuid.uuid4().hex}"
        env = dict(self.spec.environment)
        env.update(lambda_environment(self.spec, region=self.region, log_stream_name=stream))
        env.update(self._extra_env)
        env["DEVSTACK_WORKER_INDEX"] = str(index)
        return env

    def _spawn(self) -> _Worker:
        self._started += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return _Worker(self.spec, self._environment(self._started), self.log_path, self._started, self._hidden_paths)

    def start(self, prewarm: int = 1, wait: bool = True) -> None:
        """Start ``prewarm`` workers now, so the first invocation does not pay for process start-up.

        Parameters
        ----------
        prewarm
            Workers to start (at most ``max_workers``).
        wait
            Wait until they have imported the handler (bounded by ``init_timeout_seconds``). An import error is
            logged, not raised: as in Lambda, it is reported by each invocation.
        """
        workers = []
        with self._cond:
            while len(self._workers) < min(prewarm, self.max_workers):
                worker = self._spawn()
                self._workers.append(worker)
                self._idle.append(worker)
                workers.append(worker)
        if wait:
            for worker in workers:
                self._wait_ready(worker)

    def wait_ready(self) -> None:
        """Wait until every started worker has run its init phase (bounded by ``init_timeout_seconds`` each)."""
        with self._cond:
            workers = list(self._workers)
        for worker in workers:
            self._wait_ready(worker)

    def _wait_ready(self, worker: _Worker) -> None:
        try:
            worker.wait_ready(self.init_timeout_seconds)
        except (TimeoutError, _WorkerDiedError) as error:
            logger.warning("%s: %s (see %s)", self.spec.logical_id, error, self.log_path)
            return
        if worker.init_error:
            logger.warning(
                "%s: init failed: %s (see %s)", self.spec.logical_id, worker.init_error["errorMessage"], self.log_path
            )

    def stop(self) -> None:
        """Stop every worker (bounded: each gets a few seconds to exit, then it is killed)."""
        with self._cond:
            self._stopped = True
            workers = list(self._workers)
            self._workers.clear()
            self._idle.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.stop()

    @property
    def worker_count(self) -> int:
        """Worker processes currently alive or starting."""
        with self._cond:
            return len(self._workers) + self._starting

    def invocation_count(self) -> int:
        """Invocations so far, over every execution environment this pool started (workers replaced included)."""
        with self._cond:
            return self._retired_invocations + sum(worker.invocations for worker in self._workers)

    @property
    def idle_count(self) -> int:
        """Workers waiting for an invocation."""
        with self._cond:
            return len(self._idle)

    def worker_pids(self) -> list[int]:
        """Process ids of the workers (for tests and diagnostics)."""
        with self._cond:
            return [worker.process.pid for worker in self._workers if worker.process.pid is not None]

    # ------------------------------------------------------------------ invocation

    def _acquire(self, timeout: float) -> _Worker | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._stopped:
                if self._idle:
                    return self._idle.pop()
                if len(self._workers) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            else:
                return None
        try:
            worker = self._spawn()
        finally:
            with self._cond:
                self._starting -= 1
        with self._cond:
            self._workers.append(worker)
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._stopped:
                self._idle.append(worker)
            elif worker in self._workers:
                self._workers.remove(worker)
                self._retired_invocations += worker.invocations
            self._cond.notify()
        if not healthy or self._stopped:
            worker.kill()

    def invoke(self, event: Mapping[str, Any], *, acquire_timeout_seconds: float | None = None) -> InvokeResult:
        """Invoke the function synchronously (``RequestResponse``), like ``lambda:Invoke``.

        Parameters
        ----------
        event
            A JSON-serialisable event.
        acquire_timeout_seconds
            Longest wait for a free execution environment when all ``max_workers`` are busy (seconds; default:
            the function timeout). Past it the result is a ``TooManyRequestsException`` error, as a throttle.

        Returns
        -------
        InvokeResult
            Never raises for handler failures: errors, timeouts and throttles are error results.
        """
        request_id = str(uuid.uuid4())
        event_text = json.dumps(event)
        timeout = float(self.spec.timeout_seconds)
        started = time.monotonic()
        worker = self._acquire(timeout if acquire_timeout_seconds is None else acquire_timeout_seconds)
        if worker is None:
            waited_ms = (time.monotonic() - started) * 1000
            reason = "the function is stopped" if self._stopped else "Rate Exceeded."
            return self._failure("TooManyRequestsException", reason, request_id, waited_ms, cold_start=False)
        cold_start = worker.invocations == 0
        try:
            worker.wait_ready(self.init_timeout_seconds)
            deadline_ms = int(time.time() * 1000) + self.spec.timeout_seconds * 1000
            reply = worker.invoke(event_text, request_id, deadline_ms, timeout + _TIMEOUT_SLACK_SECONDS)
        except TimeoutError:
            self._release(worker, healthy=False)
            message = f"Task timed out after {timeout:.2f} seconds"
            self._log_line(f"{datetime.now(UTC).isoformat()} {request_id} {message}")
            return self._failure("Sandbox.Timedout", message, request_id, timeout * 1000, cold_start)
        except _WorkerDiedError as error:
            self._release(worker, healthy=False)
            message = f"Runtime exited without providing a reason ({error})"
            return self._failure(
                "Runtime.ExitError", message, request_id, (time.monotonic() - started) * 1000, cold_start
            )
        self._release(worker, healthy=True)
        if reply["ok"]:
            return InvokeResult(
                ok=True,
                payload=json.loads(reply["payload"]),
                error=None,
                duration_ms=float(reply["duration_ms"]),
                cold_start=bool(reply["cold_start"]),
                request_id=request_id,
            )
        payload = reply["payload"]
        return InvokeResult(
            ok=False,
            payload=payload,
            error=f"{payload.get('errorType')}: {payload.get('errorMessage')}",
            duration_ms=float(reply["duration_ms"]),
            cold_start=bool(reply["cold_start"]),
            request_id=request_id,
        )

    def _log_line(self, line: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("a", encoding="utf-8") as log:
            log.write(line + "\n")

    @staticmethod
    def _failure(error_type: str, message: str, request_id: str, duration_ms: float, cold_start: bool) -> InvokeResult:
        return InvokeResult(
            ok=False,
            payload={"errorMessage": message, "errorType": error_type, "requestId": request_id},
            error=f"{error_type}: {message}",
            duration_ms=duration_ms,
            cold_start=cold_start,
            request_id=request_id,
        )

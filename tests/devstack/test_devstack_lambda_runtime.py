"""devstack.lambda_runtime: one worker process per execution environment, with the function's own environment."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devstack.lambda_runtime import INIT_HOOK_VARIABLE, FunctionPool
from devstack.template import FunctionSpec

SHARED_MODULE = """
import os
import pathlib
import time

AGENT_AT_IMPORT = os.environ["AGENT_NAME"]
CALLS = 0


def _wait_for(condition):
    # Bounded by the test's own timeouts; the test releases the handler explicitly, it does not wait for a time.
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)
    raise TimeoutError("the test never released the handler")


def handler(event, context):
    global CALLS
    CALLS += 1
    if event.get("raise"):
        raise ValueError("boom: " + event["raise"])
    if event.get("sleep"):
        time.sleep(event["sleep"])
    if event.get("started"):
        pathlib.Path(event["started"]).touch()
    if event.get("allocate_mb"):
        held = b"x" * (event["allocate_mb"] << 20)  # written, so every page is resident
        del held
    if event.get("rendezvous"):
        # Meet the other invocations: each leaves a file named by its pid and waits until all have arrived.
        folder = pathlib.Path(event["rendezvous"])
        (folder / str(os.getpid())).touch()
        _wait_for(lambda: len(list(folder.iterdir())) >= event["parties"])
    if event.get("wait_for"):
        _wait_for(pathlib.Path(event["wait_for"]).exists)
    print("handled", event.get("n"))
    return {
        "agent": AGENT_AT_IMPORT,
        "calls": CALLS,
        "pid": os.getpid(),
        "extra": os.environ.get("EXTRA"),
        "function_env": os.environ["AWS_LAMBDA_FUNCTION_NAME"],
        "timeout_env": os.environ["AWS_LAMBDA_FUNCTION_TIMEOUT"],
        "trace_disabled": os.environ["POWERTOOLS_TRACE_DISABLED"],
        "context": {
            "function_name": context.function_name,
            "function_version": context.function_version,
            "invoked_function_arn": context.invoked_function_arn,
            "memory_limit_in_mb": context.memory_limit_in_mb,
            "aws_request_id": context.aws_request_id,
            "log_group_name": context.log_group_name,
            "log_stream_name": context.log_stream_name,
            "remaining": context.get_remaining_time_in_millis(),
        },
    }
"""


def _spec(
    code_dir: Path, logical_id: str, agent: str, *, timeout: int = 5, handler: str = "shared_agent.handler"
) -> FunctionSpec:
    return FunctionSpec(
        logical_id=logical_id,
        code_dir=code_dir,
        handler=handler,
        runtime="python3.12",
        timeout_seconds=timeout,
        memory_mb=256,
        environment={"AGENT_NAME": agent},
        layer_dirs=[],
        events=[],
        function_name=f"test-{logical_id}",
    )


def test_functions_sharing_a_module_keep_their_own_environment_and_state(
    write_handler: Callable[[str, str], Path], tmp_path: Path
) -> None:
    # Given two functions that run the same handler module with different AGENT_NAME
    code = write_handler("shared_agent", SHARED_MODULE)
    logs = tmp_path / "logs"
    with (
        FunctionPool(_spec(code, "FlightsFn", "flights"), log_dir=logs, extra_env={"EXTRA": "x"}) as flights,
        FunctionPool(_spec(code, "HotelsFn", "hotels"), log_dir=logs) as hotels,
    ):
        # When each is invoked
        first = flights.invoke({"n": 1})
        second = flights.invoke({"n": 2})
        other = hotels.invoke({"n": 3})

    # Then module-level state and os.environ belong to each function's own process
    assert first.ok and second.ok and other.ok
    assert (first.payload["agent"], first.payload["calls"], first.cold_start) == ("flights", 1, True)
    assert (second.payload["agent"], second.payload["calls"], second.cold_start) == ("flights", 2, False)
    assert (other.payload["agent"], other.payload["calls"], other.cold_start) == ("hotels", 1, True)
    assert first.payload["pid"] == second.payload["pid"] != other.payload["pid"] != os.getpid()
    assert (first.payload["extra"], other.payload["extra"]) == ("x", None)
    assert first.payload["function_env"] == "test-FlightsFn"
    assert first.payload["timeout_env"] == "5"
    assert first.payload["trace_disabled"] == "true"
    assert "AGENT_NAME" not in os.environ  # the parent is untouched

    # And the context object carries what powertools reads
    context = first.payload["context"]
    assert context["function_name"] == "test-FlightsFn"
    assert context["function_version"] == "$LATEST"
    assert context["invoked_function_arn"] == "arn:aws:lambda:us-east-1:123456789012:function:test-FlightsFn"
    assert context["memory_limit_in_mb"] == 256
    assert context["aws_request_id"] == first.request_id
    assert context["log_group_name"] == "/aws/lambda/test-FlightsFn"
    assert "[$LATEST]" in context["log_stream_name"]
    assert 4000 < context["remaining"] <= 5000

    # And the output went to the function's own log file, with Lambda's START/END/REPORT lines
    log = (logs / "FlightsFn.log").read_text()
    assert "handled 1" in log and "handled 2" in log and "handled 3" not in log
    assert f"START RequestId: {first.request_id} Version: $LATEST" in log
    assert f"REPORT RequestId: {first.request_id}\tDuration: " in log
    assert "handled 3" in (logs / "HotelsFn.log").read_text()


def _max_memory_used_mb(log: str, request_id: str) -> int:
    report = next(line for line in log.splitlines() if line.startswith(f"REPORT RequestId: {request_id}\t"))
    return int(re.search(r"\tMax Memory Used: (\d+) MB", report).group(1))  # type: ignore[union-attr]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the per-invocation peak needs Linux's /proc")
def test_max_memory_used_is_each_invocations_own_peak_not_the_workers(
    write_handler: Callable[[str, str], Path], tmp_path: Path
) -> None:
    # Given one execution environment (one worker)
    code = write_handler("shared_agent", SHARED_MODULE)
    with FunctionPool(_spec(code, "Fn", "a"), log_dir=tmp_path, max_workers=1) as pool:
        # When a warm invocation allocates 96 MB, and the next one allocates nothing
        cold = pool.invoke({"n": 1})
        big = pool.invoke({"allocate_mb": 96})
        small = pool.invoke({"n": 3})
    log = (tmp_path / "Fn.log").read_text()
    cold_mb, big_mb, small_mb = (_max_memory_used_mb(log, r.request_id) for r in (cold, big, small))
    # Then each REPORT gives that invocation's own peak: the 96 MB show in the big one only, and the small one is
    # back at the worker's resident size (a worker's high-water mark would have kept the 96 MB, and more)
    assert big_mb - small_mb >= 90
    assert abs(small_mb - cold_mb) < 20
    assert small_mb < 256  # the worker's interpreter and handler, within its MemorySize


def test_a_raising_handler_is_an_error_result_and_the_worker_keeps_running(
    write_handler: Callable[[str, str], Path], tmp_path: Path
) -> None:
    code = write_handler("shared_agent", SHARED_MODULE)
    with FunctionPool(_spec(code, "Fn", "a"), log_dir=tmp_path, max_workers=1) as pool:
        failed = pool.invoke({"raise": "bad input"})
        after = pool.invoke({"n": 1})
    assert not failed.ok
    assert failed.error == "ValueError: boom: bad input"
    assert failed.payload["errorType"] == "ValueError"
    assert failed.payload["errorMessage"] == "boom: bad input"
    assert after.ok and after.payload["calls"] == 2  # same process, state kept
    assert "[ERROR] ValueError: boom: bad input" in (tmp_path / "Fn.log").read_text()


def test_a_handler_past_its_timeout_is_stopped_and_replaced(
    write_handler: Callable[[str, str], Path], tmp_path: Path
) -> None:
    code = write_handler("shared_agent", SHARED_MODULE)
    with FunctionPool(_spec(code, "Fn", "a", timeout=1), log_dir=tmp_path, max_workers=1) as pool:
        timed_out = pool.invoke({"sleep": 30})
        after = pool.invoke({"n": 1})
    assert not timed_out.ok
    assert timed_out.error == "Sandbox.Timedout: Task timed out after 1.00 seconds"
    assert after.ok and after.cold_start and after.payload["calls"] == 1  # a fresh execution environment


def test_import_error_is_reported_by_each_invocation(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    spec = _spec(tmp_path / "code", "Missing", "a", handler="not_there.handler")
    with FunctionPool(spec, log_dir=tmp_path) as pool:
        result = pool.invoke({})
    assert not result.ok
    assert result.payload["errorType"] == "Runtime.ImportModuleError"
    assert result.error is not None and "Unable to import module 'not_there'" in result.error


def test_concurrent_invocations_use_separate_workers(write_handler: Callable[[str, str], Path], tmp_path: Path) -> None:
    # Given a pool of two execution environments, and two invocations that each wait inside the handler until
    # both are there (so they overlap however slowly the machine runs)
    code = write_handler("shared_agent", SHARED_MODULE)
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    results = []
    with FunctionPool(_spec(code, "Fn", "a", timeout=60), log_dir=tmp_path, max_workers=2) as pool:
        barrier = threading.Barrier(2)

        def call() -> None:
            barrier.wait(5)
            results.append(pool.invoke({"rendezvous": str(meeting), "parties": 2}))

        threads = [threading.Thread(target=call) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert pool.worker_count == 2
    # Then both ran at once, each in its own process
    assert [result.ok for result in results] == [True, True]
    assert len({result.payload["pid"] for result in results}) == 2
    assert sorted(path.name for path in meeting.iterdir()) == sorted(str(r.payload["pid"]) for r in results)


def test_throttle_when_every_worker_is_busy(write_handler: Callable[[str, str], Path], tmp_path: Path) -> None:
    # Given the only execution environment busy in a handler that runs until the test releases it
    code = write_handler("shared_agent", SHARED_MODULE)
    started, release = tmp_path / "started", tmp_path / "release"
    busy_results = []
    with FunctionPool(_spec(code, "Fn", "a", timeout=60), log_dir=tmp_path, max_workers=1) as pool:
        thread = threading.Thread(
            target=lambda: busy_results.append(pool.invoke({"started": str(started), "wait_for": str(release)}))
        )
        thread.start()
        _wait_until(started.exists)
        # When another invocation waits 0.1 s for an environment
        throttled = pool.invoke({}, acquire_timeout_seconds=0.1)
        release.touch()
        thread.join(30)
    # Then it is throttled, and the busy one went on to finish
    assert not throttled.ok
    assert throttled.error == "TooManyRequestsException: Rate Exceeded."
    assert [result.ok for result in busy_results] == [True]


def _wait_until(condition: Callable[[], bool], attempts: int = 3000) -> None:
    """Poll a condition, at most ``attempts`` times 10 ms apart (a bound against a hung test, not a wait)."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_init_hooks_run_before_the_handler_import(write_handler: Callable[[str, str], Path], tmp_path: Path) -> None:
    # Given a hook that changes the environment, named by DEVSTACK_WORKER_INIT
    write_handler("hook_module", "import os\n\ndef install():\n    os.environ['AGENT_NAME'] = 'hooked'\n")
    code = write_handler("shared_agent", SHARED_MODULE)
    extra = {INIT_HOOK_VARIABLE: "hook_module:install"}
    with FunctionPool(_spec(code, "Fn", "a"), log_dir=tmp_path, extra_env=extra) as pool:
        result = pool.invoke({})
    # Then the handler module saw the hook's effect at import time
    assert result.ok and result.payload["agent"] == "hooked"

    with FunctionPool(_spec(code, "Bad", "a"), log_dir=tmp_path, extra_env={INIT_HOOK_VARIABLE: "nope:x"}) as pool:
        failed = pool.invoke({})
    assert failed.payload["errorType"] == "Runtime.InitError"
    assert failed.error is not None and "hook failed: ModuleNotFoundError" in failed.error


def test_non_python_runtime_is_refused(tmp_path: Path) -> None:
    spec = FunctionSpec("Js", tmp_path, "index.handler", "nodejs20.x", 3, 128, {}, [], [])
    with pytest.raises(ValueError, match="Python only"):
        FunctionPool(spec, log_dir=tmp_path)


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_to_the_process_group_does_not_kill_an_invocation_in_flight(
    write_handler: Callable[[str, str], Path], tmp_path: Path, signal_name: str
) -> None:
    # Regression (a clean-clone trial): stopping `make up` with SIGTERM (timeout, kill of the group) reached the
    # workers too, and a supervisor sweep in flight failed with Runtime.ExitError. The parent alone decides when its
    # workers stop (FunctionPool.stop), so a signal meant for the stack lets the invocation finish.
    import signal

    code = write_handler("shared_agent", SHARED_MODULE)
    started, release = tmp_path / "started", tmp_path / "release"
    results = []
    with FunctionPool(_spec(code, "Fn", "a", timeout=60), log_dir=tmp_path, max_workers=1) as pool:
        thread = threading.Thread(
            target=lambda: results.append(pool.invoke({"started": str(started), "wait_for": str(release)}))
        )
        thread.start()
        for _ in range(1000):
            if started.exists():
                break
            time.sleep(0.01)
        [pid] = pool.worker_pids()
        os.kill(pid, getattr(signal, signal_name))
        release.touch()
        thread.join(30)
    [result] = results
    assert result.ok, result.error
    assert result.payload["pid"] == pid

"""`LocalStack`: the whole template running on loopback, behind one context manager.

Start order: moto server → environment for boto3 → template → tables/queues/alarms → HTTP API socket (its URL goes
into the functions' environment) → function workers → HTTP API serving → SQS pollers → schedules. `LocalStack.stop`
undoes it in reverse, restores ``os.environ`` and is safe to call twice.

moto keeps its state in module-level backends, which a moto server thread and ``moto.mock_aws`` share inside one
process; so only one `LocalStack` may run per process at a time, and a ``mock_aws`` opened while it runs would
reset its state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from devstack import _aws
from devstack._aws import FAKE_CREDENTIALS
from devstack.event_sources import HttpApiServer, ScheduleEmulator, SqsPoller
from devstack.iam import guard
from devstack.iam.guard import PRINCIPAL_FILE_VARIABLE, REFUSALS_FILE_VARIABLE, Refusal, read_refusals
from devstack.iam.roles import Principal
from devstack.lambda_runtime import INIT_HOOK_VARIABLE, FunctionPool, InvokeResult
from devstack.provision import provision
from devstack.schedules import SchedulerEmulator, ScheduleTicks
from devstack.template import FunctionSpec, ScheduleEventSpec, SqsEventSpec, Stack

__all__ = ["DEFAULT_LOG_DIR", "DEFAULT_TEMPLATE", "LocalStack", "RoleRefusalError", "local_aws_environment"]

logger = logging.getLogger(__name__)

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_TEMPLATE: Final = REPO_ROOT / "template.yaml"
DEFAULT_LOG_DIR: Final = Path(".devstack") / "logs"

_ACTIVE_LOCK: Final = threading.Lock()
"""Held while a LocalStack runs in this process (moto's state is per process)."""

_REMOVED_ENV_PREFIXES: Final = ("AWS_ENDPOINT_URL_",)
_REMOVED_ENV: Final = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE")


def local_aws_environment(endpoint_url: str, region: str) -> dict[str, str]:
    """The variables that point boto3 at the moto server with fake credentials.

    Parameters
    ----------
    endpoint_url
        The moto server, e.g. ``http://127.0.0.1:41234``.
    region
        AWS region.

    Returns
    -------
    dict
        ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``
        (``testing``), ``AWS_DEFAULT_REGION``, ``AWS_REGION`` and ``AWS_EC2_METADATA_DISABLED``.
    """
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ACCESS_KEY_ID": FAKE_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": FAKE_CREDENTIALS["aws_secret_access_key"],
        "AWS_SESSION_TOKEN": FAKE_CREDENTIALS["aws_session_token"],
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def _send_to(sqs: Any, queue_url: str, body: str) -> None:
    """Send ``body`` to ``queue_url`` (a schedule's tick to its target queue)."""
    sqs.send_message(QueueUrl=queue_url, MessageBody=body)


class RoleRefusalError(RuntimeError):
    """A function of the local stack made AWS calls its role in the template does not allow (each one named)."""

    def __init__(self, refusals: list[Refusal]) -> None:
        self.refusals = refusals
        lines = "\n".join(f"  {refusal}" for refusal in refusals)
        super().__init__(f"{len(refusals)} AWS call(s) refused by the functions' roles in the template:\n{lines}")


class LocalStack:
    """The template's stack on loopback: moto for tables and queues, in-process emulation for the rest.

    Parameters
    ----------
    template_path
        The SAM template (default: ``template.yaml`` at the repository root).
    parameters
        Parameter overrides, as ``sam deploy --parameter-overrides`` takes them.
    schedule_interval_seconds
        Period of every schedule (seconds), overriding the template's expression; ``None`` keeps the template's.
    sqs_concurrency
        Poll threads per SQS event source mapping.
    log_dir
        Folder of the per-function logs ``<LogicalId>.log``.
    extra_env
        Variables given to every function worker, after the function's own and the local AWS variables.
    api_port
        TCP port of the HTTP API emulator; 0 picks a free one.
    stack_name
        Stack name (prefix of every physical name).
    region
        AWS region.
    max_workers_per_function
        Execution environments per function (raised to cover the function's SQS poll threads).
    sqs_visibility_timeout_seconds
        Override of the visibility timeout used when polling (seconds), so records of a failed batch come back
        sooner; ``None`` keeps each queue's own (what Lambda does).
    start_schedules
        Run the schedules on their timers; when false only `fire_schedule` runs them (deterministic tests).
    rewrite_api_urls
        Replace ``https://<api id>.execute-api.<region>.amazonaws.com`` in the functions' environment and in
        `outputs` by the emulator's URL, so functions that call a stack's own API reach it offline.
    swagger
        Serve Swagger UI at ``/swagger`` for the clients' and the operators' routes, unauthenticated, with its "Try
        it out" taken as signed by a local identity (`devstack.swagger`; local only, not in template.yaml).
    check_roles
        Check every AWS call of every function against that function's role as the template deploys it
        (`devstack.iam`, docs/security.md): a call the role does not allow raises AccessDenied inside the function,
        as on AWS; `role_refusals` lists them, and leaving the ``with`` block raises `RoleRefusalError` naming each.
    role_mutations
        Function logical id → IAM actions taken out of its role for this run (a policy mutation, for `make mutants`
        and the tests that show the check sees a missing grant).

    Examples
    --------
    >>> with LocalStack(parameters={"LogLevel": "DEBUG"}, schedule_interval_seconds=5) as stack:  # doctest: +SKIP
    ...     print(stack.api_url)
    """

    def __init__(
        self,
        template_path: str | Path = DEFAULT_TEMPLATE,
        parameters: Mapping[str, str] | None = None,
        *,
        schedule_interval_seconds: float | None = None,
        sqs_concurrency: int = 2,
        log_dir: str | Path = DEFAULT_LOG_DIR,
        extra_env: Mapping[str, str] | None = None,
        api_port: int = 0,
        stack_name: str = "sasflow",
        region: str = "us-east-1",
        max_workers_per_function: int = 2,
        sqs_visibility_timeout_seconds: int | None = None,
        start_schedules: bool = True,
        rewrite_api_urls: bool = True,
        swagger: bool = False,
        check_roles: bool = True,
        role_mutations: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.template_path = Path(template_path)
        self.parameters = dict(parameters or {})
        self.schedule_interval_seconds = schedule_interval_seconds
        self.sqs_concurrency = sqs_concurrency
        self.log_dir = Path(log_dir)
        self.extra_env = dict(extra_env or {})
        self.api_port = api_port
        self.stack_name = stack_name
        self.region = region
        self.max_workers_per_function = max_workers_per_function
        self.sqs_visibility_timeout_seconds = sqs_visibility_timeout_seconds
        self.start_schedules = start_schedules
        self.rewrite_api_urls = rewrite_api_urls
        self.swagger = swagger
        self.check_roles = check_roles
        self.role_mutations = {function: list(actions) for function, actions in (role_mutations or {}).items()}
        self.roles: dict[str, Principal] = {}
        # One stack runs per process at a time, but several processes (test workers) may share a log folder.
        self.refusals_path = self.log_dir / "iam" / f"refusals-{os.getpid()}.jsonl"

        self.pools: dict[str, FunctionPool] = {}
        self.pollers: list[SqsPoller] = []
        self.schedules: dict[str, list[ScheduleEmulator]] = {}
        self.scheduler_schedules: dict[str, SchedulerEmulator] = {}
        self.physical_ids: dict[str, str] = {}
        self._stack: Stack | None = None
        self._moto: Any = None
        self._endpoint_url: str | None = None
        self._http: HttpApiServer | None = None
        self._saved_env: dict[str, str | None] | None = None
        self._holds_lock = False

    # ------------------------------------------------------------------ properties

    @property
    def stack(self) -> Stack:
        """The resolved template (after `start`)."""
        if self._stack is None:
            raise RuntimeError("the local stack is not started")
        return self._stack

    @property
    def endpoint_url(self) -> str:
        """URL of the moto server, e.g. ``http://127.0.0.1:41234`` (after `start`)."""
        if self._endpoint_url is None:
            raise RuntimeError("the local stack is not started")
        return self._endpoint_url

    @property
    def api_url(self) -> str:
        """Base URL of the HTTP API emulator, e.g. ``http://127.0.0.1:3000`` (after `start`)."""
        if self._http is None:
            raise RuntimeError("the local stack is not started")
        return self._http.url

    @property
    def outputs(self) -> dict[str, str]:
        """The template's ``Outputs``, with API URLs pointing at the emulator when ``rewrite_api_urls``."""
        return {name: self._rewrite(value) for name, value in self.stack.outputs().items()}

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        refused = self.role_refusals()
        if refused and exc_type is None:
            raise RoleRefusalError(refused)

    def role_refusals(self) -> list[Refusal]:
        """The AWS calls the functions' roles refused since `start`: in the functions, then in the event source
        mappings' pollers (empty when ``check_roles`` is off)."""
        return [*read_refusals(self.refusals_path), *guard.refusals()] if self.check_roles else []

    def start(self) -> LocalStack:
        """Start everything (see the module docstring for the order); on failure, stop what was started.

        Returns
        -------
        LocalStack
            ``self``.

        Raises
        ------
        RuntimeError
            Another LocalStack runs in this process.
        devstack.template.TemplateError, devstack.provision.ProvisionError
            The template cannot be resolved or provisioned.
        """
        if not _ACTIVE_LOCK.acquire(blocking=False):
            raise RuntimeError("a LocalStack is already running in this process (moto's state is per process)")
        self._holds_lock = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        from moto.server import ThreadedMotoServer

        from devstack import fair_queues, moto_sqs

        moto_sqs.install()  # DLQ redrive (StartMessageMoveTask...), which moto lacks, before the server serves
        fair_queues.install()  # a quiet tenant's messages before a noisy one's backlog, as SQS fair queues
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per AWS call otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self._endpoint_url = f"http://{host}:{port}"
        # The backends outlive a server in this process; start from an empty account.
        reset = urllib.request.Request(f"{self._endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(reset, timeout=10):
            pass
        self._set_environment(local_aws_environment(self._endpoint_url, self.region))

        self._stack = Stack.from_file(
            self.template_path,
            stack_name=self.stack_name,
            parameters=self.parameters,
            region=self.region,
            endpoint_url=self._endpoint_url,
        )
        functions = self._stack.functions()
        self.physical_ids = provision(self._stack, endpoint_url=self._endpoint_url)

        self._http = HttpApiServer([], {}, port=self.api_port, region=self.region, account_id=self._stack.account_id)
        self._http.bind()

        worker_env = {**local_aws_environment(self._endpoint_url, self.region), **self.extra_env}
        role_env = self._role_environment(worker_env.get(INIT_HOOK_VARIABLE, ""))
        code_dirs = sorted({str(spec.code_dir) for spec in functions})
        for spec in functions:
            spec = dataclasses.replace(spec, environment={k: self._rewrite(v) for k, v in spec.environment.items()})
            sqs_events = sum(1 for event in spec.events if isinstance(event, SqsEventSpec))
            pool = FunctionPool(
                spec,
                log_dir=self.log_dir,
                extra_env={**worker_env, **role_env.get(spec.logical_id, {})},
                max_workers=max(self.max_workers_per_function, self.sqs_concurrency * sqs_events),
                region=self.region,
                hidden_paths=code_dirs,
            )
            self.pools[spec.logical_id] = pool
            pool.start(prewarm=1, wait=False)
        for pool in self.pools.values():  # the workers import their handlers in parallel
            pool.wait_ready()

        self._http.set_routes(HttpApiServer.routes_from_functions(functions), self.pools)
        if self.swagger:
            from devstack.swagger import SwaggerPages

            self._http.swagger = SwaggerPages(self._http.get_as)
        self._http.start()

        self._check_event_sources(functions)
        for spec in functions:
            for event in spec.events:
                if isinstance(event, SqsEventSpec):
                    poller = SqsPoller(
                        event,
                        self.pools[spec.logical_id],
                        region=self.region,
                        endpoint_url=self._endpoint_url,
                        concurrency=self.sqs_concurrency,
                        visibility_timeout_seconds=self.sqs_visibility_timeout_seconds,
                        name=f"{spec.logical_id}.{event.name}",
                        principal=self.roles.get(spec.logical_id),
                    )
                    self.pollers.append(poller)
                    poller.start()
                elif isinstance(event, ScheduleEventSpec):
                    schedule = ScheduleEmulator(
                        spec.logical_id,
                        event,
                        self.pools[spec.logical_id],
                        region=self.region,
                        stack_name=self.stack_name,
                        account_id=self._stack.account_id,
                        interval_seconds=self.schedule_interval_seconds,
                    )
                    self.schedules.setdefault(spec.logical_id, []).append(schedule)
                    if self.start_schedules:
                        schedule.start()
        self._start_scheduler_schedules()
        logger.info("local stack up: api %s, moto %s, logs %s", self.api_url, self._endpoint_url, self.log_dir)

    def stop(self) -> None:
        """Stop schedules, pollers, the HTTP API, the workers and moto; restore ``os.environ``. Idempotent."""
        for schedules in self.schedules.values():
            for schedule in schedules:
                schedule.stop()
        for emulator in self.scheduler_schedules.values():
            emulator.stop()
        self.scheduler_schedules = {}
        for poller in self.pollers:
            poller.stop()
        if self._http is not None:
            self._http.stop()
        for pool in self.pools.values():
            pool.stop()
        if self._moto is not None:
            try:
                self._moto.stop()
            except Exception:  # stopping must go on
                logger.exception("stopping the moto server failed")
        self._restore_environment()
        self.schedules = {}
        self.pollers = []
        self.pools = {}
        self._moto = None
        if self._holds_lock:
            self._holds_lock = False
            _ACTIVE_LOCK.release()

    # ------------------------------------------------------------------ helpers

    def _start_scheduler_schedules(self) -> None:
        """Tick each enabled EventBridge Scheduler schedule of the template into its target queue, on the wall clock
        (a trigger's ticks: devstack.schedules)."""
        assert self._stack is not None
        sqs = self.client("sqs")
        for spec in self._stack.scheduler_schedules():
            if not spec.enabled:
                continue
            emulator = SchedulerEmulator(
                spec.logical_id,
                ScheduleTicks(spec.expression, spec.timezone, spec.start_date, spec.end_date),
                functools.partial(_send_to, sqs, spec.queue_url),
                spec.input,
            )
            self.scheduler_schedules[spec.logical_id] = emulator
            if self.start_schedules:
                emulator.start()

    def _check_event_sources(self, functions: Sequence[FunctionSpec]) -> None:
        """Refuse to start, as CloudFormation's CreateEventSourceMapping would, an SQS event source whose function's
        role may not receive, delete and read the attributes of its queue."""
        refused = [
            refusal
            for spec in functions
            if spec.logical_id in self.roles
            for event in spec.events
            if isinstance(event, SqsEventSpec)
            for refusal in guard.event_source_refusals(self.roles[spec.logical_id], event.queue_arn)
        ]
        if refused:
            raise RoleRefusalError(refused)

    def _role_environment(self, hooks: str) -> dict[str, dict[str, str]]:
        """Per function: the variables that make its workers check every AWS call against its role."""
        if not self.check_roles:
            return {}
        from devstack.iam.roles import principals

        folder = self.log_dir / "iam" / f"roles-{os.getpid()}"
        folder.mkdir(parents=True, exist_ok=True)
        self.refusals_path.unlink(missing_ok=True)
        out = {}
        roles = principals(self.stack)
        unknown = sorted(set(self.role_mutations) - set(roles))
        if unknown:
            raise ValueError(f"role_mutations names functions the template does not have: {', '.join(unknown)}")
        guard.install()  # the pollers run in this process
        guard.clear_refusals()
        for function, principal in roles.items():
            for action in self.role_mutations.get(function, []):
                principal = principal.without(action)
            self.roles[function] = principal
            path = folder / f"{function}.json"
            path.write_text(principal.to_json(), encoding="utf-8")
            out[function] = {
                PRINCIPAL_FILE_VARIABLE: str(path.resolve()),
                REFUSALS_FILE_VARIABLE: str(self.refusals_path.resolve()),
                INIT_HOOK_VARIABLE: ",".join(filter(None, ["devstack.iam.guard:install_for_worker", hooks])),
            }
        return out

    def _set_environment(self, values: Mapping[str, str]) -> None:
        names = [*values, *_REMOVED_ENV, *(n for n in os.environ if n.startswith(_REMOVED_ENV_PREFIXES))]
        self._saved_env = {name: os.environ.get(name) for name in names}
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(values)

    def _restore_environment(self) -> None:
        if self._saved_env is None:
            return
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = None

    def _rewrite(self, value: str) -> str:
        if not self.rewrite_api_urls or self._http is None or self._stack is None:
            return value
        for logical_id, rtype, _cond, active in self._stack.template_resources():
            if active and rtype == "AWS::Serverless::HttpApi":
                remote = f"https://{self._stack.api_id(logical_id)}.execute-api.{self.region}.amazonaws.com"
                value = value.replace(remote, self._http.url)
        return value

    def function(self, logical_id: str) -> FunctionSpec:
        """The spec of a running function, with its local environment."""
        return self.pools[logical_id].spec

    def invoke(self, logical_id: str, event: Mapping[str, Any]) -> InvokeResult:
        """Invoke a function directly (like ``aws lambda invoke``)."""
        return self.pools[logical_id].invoke(event)

    def fire_schedule(self, logical_id: str, event_name: str | None = None) -> InvokeResult:
        """Run a function's schedule now (waiting for a run in progress) and return the invocation's result.

        Parameters
        ----------
        logical_id
            The function with a ``Schedule`` event.
        event_name
            Which of its schedules, when it has several (default: the first).

        Raises
        ------
        KeyError
            The function has no such schedule.
        """
        for schedule in self.schedules.get(logical_id, []):
            if event_name is None or schedule.spec.name == event_name:
                return schedule.fire_now()
        raise KeyError(f"{logical_id} has no schedule{f' named {event_name}' if event_name else ''}")

    def client(self, service: str) -> Any:
        """A boto3 client for the moto server (e.g. ``stack.client("sqs")``)."""
        return _aws.client(service, region=self.region, endpoint_url=self.endpoint_url)

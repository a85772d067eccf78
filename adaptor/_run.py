"""The one run pipeline behind ``Agent.run``/``stream`` and ``Thread.run``/``stream``.

Phases: static checks (no events, nothing touched) → admission (``RunStarted``) → preparation
→ driver entry → verdict (``RunFinished``).  Failures before driver entry raise the
pre-invocation identities without a Result; after entry every failure is a ``RunError`` with
the Result gathered so far.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import logging
import math
import os
import secrets as _secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from adaptor import _exiting, _private_dirs, _procfs, _thread, errors
from adaptor import mcp as _mcp
from adaptor import skill as _skill
from adaptor import tool as _tool
from adaptor._redact import Redactor, StreamRedactor, redact_error
from adaptor.approval import Outcome, Responder
from adaptor.driver import (
    DecisionRequest,
    DecisionResponse,
    Descriptor,
    Driver,
    InvalidDriverConfigError,
    OutputSchema,
    Request,
    Response,
    SessionContext,
)
from adaptor.driver._spi import MCPServerSpec, ResolvedSkill, ToolsEndpoint, check_emitted
from adaptor.events import (
    ApprovalRequest,
    Choice,
    Dropped,
    Event,
    EventMeta,
    Notice,
    RunFinished,
    RunStarted,
    format_time,
    parse_time,
)
from adaptor.policy import EffectiveApprovals, explicit_ask_kinds, validate
from adaptor.result import Result, TranscriptItem
from adaptor.stream import _STOP_WAIT, Broker, Stream

if TYPE_CHECKING:
    from adaptor._gateway import Admission
    from adaptor._options import RunOptions
    from adaptor._thread import ThreadSpec
    from adaptor.policy import Policy
    from adaptor.schema import CompiledSchema, Mechanism


def _text_of(error: BaseException) -> str:
    """``str(error)`` for the run's RunFinished, which must be delivered whatever it raises."""
    try:
        return str(error)
    except Exception:
        return f"{type(error).__name__} (its str() failed)"


def new_run_id() -> str:
    return "run_" + _secrets.token_hex(8)


_preset_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("adaptor_run_id", default=None)


@contextlib.contextmanager
def run_id_as(run_id: str) -> Iterator[None]:
    """The run started in this block (on this thread) gets ``run_id``: for a host that must
    record the run's id durably before the run can start (the daemon, whose crash recovery
    must find every attempt whose agent may have started)."""
    token = _preset_run_id.set(run_id)
    try:
        yield
    finally:
        _preset_run_id.reset(token)


class RunHost(Protocol):
    """What the pipeline needs from the Agent that owns it."""

    driver: Driver
    event_buffer: int
    blocking_events: bool
    thread_store: Any
    lease_ttl: float
    lease_renewal: float
    tools: tuple[Any, ...]
    skill_provider: Any

    @property
    def closed(self) -> bool: ...

    def _register(self, run: RunPipeline) -> None: ...
    def _unregister(self, run: RunPipeline) -> None: ...
    def _tools_endpoint(
        self, tools: Sequence[_tool.Definition], ended: threading.Event
    ) -> tuple[ToolsEndpoint, Admission]: ...


@dataclass
class _Terminal:
    """The first confirmed cause that ends a run; later causes never replace it."""

    kind: str  # cancelled | deadline | budget | approval_denied | approval_timeout | handler
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    cause: BaseException | None = None


class _CancelSignal(threading.Event):
    """A run's cancel signal (its driver's ``sink.cancelled``), and whether its stop is to be at
    once: ``at_once``, read by the process runner, kills the agent without its grace period."""

    at_once = False


_FOREVER = 10 * 365 * 24 * 3600.0


def _interval(seconds: float) -> float:
    """A timer interval the platform accepts: a budget of 1e40 s is simply "never"."""
    return min(max(float(seconds), 0.0), threading.TIMEOUT_MAX)


_IDLE_SECONDS = 60.0
"""How long a pipeline thread waits for the next run before it exits."""


class _RunThreads:
    """The threads that run pipelines, each kept for the next run once its run ends.

    ``Thread.start`` waits until the new thread has started running, which under load costs
    the caller of ``Agent.stream`` a GIL handoff or more (6% of a daemon worker's time at
    150 requests/s went there, measured).  A run handed to an idle thread starts without
    that wait.  A thread idle for :data:`_IDLE_SECONDS` exits, so only a busy process keeps
    them.  The thread is named after the run it is running (``adaptor-run-idle`` between runs).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every thread: a forked child has none of them, so no run may wait for one."""
        self._cond = threading.Condition(threading.Lock())
        self._runs: deque[tuple[Callable[[], None], str]] = deque()
        self._idle = 0

    def start(self, run: Callable[[], None], name: str) -> None:
        entry = (run, name)
        with self._cond:
            self._runs.append(entry)
            if self._idle >= len(self._runs):
                self._cond.notify()
                return
        # The run is queued, not passed: a thread's arguments live as long as the thread.
        try:
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        except RuntimeError:  # "can't start new thread": a process or cgroup task limit
            with self._cond:
                try:
                    self._runs.remove(entry)  # or a later thread would run it after all
                except ValueError:
                    return  # a thread that had just become idle took it meanwhile
            raise

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                try:
                    if not self._cond.wait_for(lambda: self._runs, _IDLE_SECONDS):
                        return
                    run, name = self._runs.popleft()
                finally:
                    self._idle -= 1
            thread = threading.current_thread()
            thread.name = name
            run()
            del run  # an idle thread must not keep its last run alive
            thread.name = _IDLE_NAME  # a thread dump must not show an ended run as running


_IDLE_NAME = "adaptor-run-idle"
_run_threads = _RunThreads()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_threads.reset)

# The run whose on_approval callback the current thread is running, if any: an Agent.close()
# called from inside it must not wait for that run, which cannot end before the callback does.
_in_callback = threading.local()


def run_in_callback() -> RunPipeline | None:
    """The run whose approval callback this thread is inside (see ``Agent.close``)."""
    found: RunPipeline | None = getattr(_in_callback, "run", None)
    return found


class _Unsettled:
    """The runs admitted and not settled yet, which the interpreter's exit stops.

    Their threads are daemon threads, which an exiting interpreter just abandons: a program
    ending while a run goes on (an exception out of its ``for event in stream`` loop, a
    ``sys.exit``) would leave the agent CLI running on its own, still changing the workspace,
    its answer read by nobody.  At exit each such run is cancelled, and the exit waits up to
    :data:`~adaptor.stream._STOP_WAIT` seconds in all for them to stop, as ``run()`` does when
    interrupted.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every run: a forked child has none of their threads to wait for."""
        self._lock = threading.Lock()
        self._runs: set[RunPipeline] = set()

    def add(self, run: RunPipeline) -> None:
        with self._lock:
            self._runs.add(run)

    def discard(self, run: RunPipeline) -> None:
        with self._lock:
            self._runs.discard(run)

    def stop_all(self) -> None:
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.cancel()
        deadline = time.monotonic() + _STOP_WAIT
        try:
            for run in runs:
                run.stream._done.wait(max(deadline - time.monotonic(), 0.0))
        except BaseException:
            # A second Ctrl-C, or a SIGTERM handler's sys.exit(), while waiting: the agents are
            # killed now rather than left running on their own once the interpreter is gone
            # (and the exception, which an exit handler cannot pass on, is not printed).
            _exiting.cut_the_wait_short()
            with contextlib.suppress(BaseException):
                deadline = time.monotonic() + _CUT_SHORT_WAIT
                for run in runs:
                    run.stream._done.wait(max(deadline - time.monotonic(), 0.0))


# How long an exit whose wait was cut short still gives its runs to have their agents killed.
_CUT_SHORT_WAIT = 1.0
# How often a run waiting for its on_approval callback looks whether the request is settled.
_HANDLER_POLL = 0.05


_unsettled = _Unsettled()
atexit.register(_unsettled.stop_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unsettled.reset)

# Held while a run imports what serves host tools (the MCP SDK: about a second the first time),
# and by os.fork() until it has: a copy forked mid-import inherits the module locks of a thread
# it does not have, and its own first run with tools waited on them for ever.
_importing_tools = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_importing_tools.acquire,
        after_in_parent=_importing_tools.release,
        after_in_child=_importing_tools.release,
    )


def _no_thread(error: RuntimeError) -> RuntimeError:
    # Before the driver is entered an infrastructure failure is a plain exception, with context.
    failure = RuntimeError(
        f"cannot start a thread for the run ({error}): the process or its cgroup may be at its "
        "task limit (ulimit -u, systemd TasksMax, a container's pids.max), or its address-space "
        "limit (ulimit -v), which each thread's stack counts against"
    )
    failure.__cause__ = error
    return failure


class _Budget:
    """The policy's active-execution budget: a timer that approvals can pause."""

    def __init__(self, limit: float, on_exhausted: Callable[[], None]) -> None:
        self.limit = limit
        self._remaining = limit
        self._on_exhausted = on_exhausted
        self._lock = threading.Lock()
        self._pauses = 0
        self._started_at = 0.0
        self._timer: threading.Timer | None = None
        self._sealed = False

    def start(self) -> None:
        with self._lock:
            self._arm()

    def _arm(self) -> None:
        self._started_at = time.monotonic()
        self._timer = threading.Timer(_interval(self._remaining), self._on_exhausted)
        self._timer.daemon = True
        self._timer.start()

    def pause(self) -> None:
        with self._lock:
            self._pauses += 1
            if self._pauses == 1 and self._timer is not None and not self._sealed:
                self._timer.cancel()
                self._remaining -= time.monotonic() - self._started_at
                self._timer = None

    def resume(self) -> None:
        with self._lock:
            self._pauses -= 1
            if self._pauses == 0 and not self._sealed:
                self._arm()

    def seal(self) -> None:
        with self._lock:
            self._sealed = True
            if self._timer is not None:
                self._timer.cancel()


def checked_descriptor(driver: Driver) -> Descriptor:
    """``driver``'s descriptor, its configuration checked: a run's first check after the closed
    agent, and the daemon's preflight of a request (one rule for both).  A failure is
    ``InvalidDriverConfigError`` naming the driver (its descriptor's type once it has one)."""
    # Named by its module before it has a descriptor ("claude" for adaptor.drivers.claude),
    # by its class when that says nothing ("__main__", a driver of one's own).
    module = type(driver).__module__.rsplit(".", 1)[-1]
    named = type(driver).__qualname__ if module.startswith("__") else module
    try:
        descriptor = driver.descriptor()
        if not isinstance(descriptor, Descriptor):
            raise TypeError(
                f"descriptor() must return an adaptor.driver.Descriptor, not {type(descriptor).__name__}"
            )
    except Exception as exc:  # a descriptor built from bad configuration, or none at all
        raise _config_refused(driver, named, exc) from exc
    try:
        driver.validate_config(None)
    except errors.AdaptorError:
        raise
    except Exception as exc:
        raise _config_refused(driver, descriptor.type, exc) from exc
    return descriptor


def _config_refused(driver: Driver, driver_type: str, cause: Exception) -> InvalidDriverConfigError:
    """The error for a configuration the driver refused, without the secrets it names: the
    refusal comes before the run knows them, and a custom driver's message may quote one."""
    error = InvalidDriverConfigError(driver_type, cause)
    error.__cause__ = cause
    try:
        values = _named_secrets(driver)
    except Exception:  # as bad as the rest of the configuration: nothing more to go by
        values = []
    redact_error(error, Redactor(values))
    return error


def _named_secrets(driver: Driver) -> list[str]:
    """The values the driver's optional ``secret_values()`` names (raises what it raises)."""
    named = getattr(driver, "secret_values", None)
    if not callable(named):
        return []
    values = named()
    if isinstance(values, str | bytes):
        # Read as its characters, each too short to redact: every secret would have shown.
        raise TypeError(
            f"secret_values() must return a sequence of strings, not one {type(values).__name__}"
        )
    return [str(v) for v in values]


def checked_schema(
    schema: Mapping[str, Any],
    descriptor: Descriptor,
    approvals: EffectiveApprovals,
    policy: Policy | None,
) -> tuple[CompiledSchema, Mechanism]:
    """The output schema compiled, and how the driver will meet it (a run's last static check,
    and the daemon's preflight's)."""
    from adaptor import schema as _schema

    compiled = _schema.compile_schema(schema)
    source = _schema.negotiate(
        descriptor,
        ask_kinds=approvals.ask_kinds,
        explicit_ask_kinds=explicit_ask_kinds(policy),
        streaming=True,
        schema=compiled,
    )
    return compiled, source


def _cut_context(error: BaseException, handling: BaseException) -> None:
    """Keep the exception the caller was handling out of ``error``'s chain.

    Raised while the caller handles an exception of its own, a refusal (and whatever it was
    raised from) takes that one as its implicit ``__context__``: an unrelated host error read
    as the refusal's cause (``errors.find``, the wire's ``cause``), which the same refusal made
    anywhere else does not have.
    """
    seen: set[int] = set()
    node: BaseException | None = error
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if node.__cause__ is None and node.__context__ is handling:
            node.__suppress_context__ = True
            return
        node = node.__cause__ if node.__cause__ is not None else node.__context__

class RunPipeline:
    """One admitted-or-refused run.  Created by ``Agent.stream``; lives until its verdict."""

    def __init__(
        self,
        host: RunHost,
        prompt: str,
        options: RunOptions,
        *,
        thread: ThreadSpec | None = None,
    ) -> None:
        if not isinstance(prompt, str):
            raise TypeError("prompt must be a str")
        self.host = host
        self.prompt = prompt
        self.options = options
        self.thread = thread
        self.thread_key = "" if thread is None else thread.key
        self._plan: _thread.ThreadPlan | None = None
        self._prelaunch: tuple[str, str] = ("", "")  # codec name, driver config fingerprint
        self._thread_identity: tuple[str, _thread.Fingerprints] | None = None  # codec, fps
        self._renewer: threading.Thread | None = None
        self._leased_at = 0.0
        self._released = threading.Event()
        self._fresh_session = False
        # The agent's session this run ended in, as its driver's checkpoint names it: the
        # thread_id of RunFinished, so a log tells which session each turn ran in.
        self._session_id = ""
        self.run_id = _preset_run_id.get() or new_run_id()
        self.started = time.monotonic()
        # A deadline beyond any real run (e.g. 1e40 s from a config file) is no deadline at all;
        # datetime and timer arithmetic would overflow on it.
        self.timeout = options.timeout if options.timeout is None or options.timeout < _FOREVER else None
        self.deadline = None if self.timeout is None else self.started + self.timeout
        self.cancelled = _CancelSignal()
        self._lock = threading.Lock()
        self._terminal: _Terminal | None = None
        self._responders: list[Responder] = []
        self._decisions = 0
        self._retry_warned: set[str] = set()
        self._timer: threading.Timer | None = None
        self._budget: _Budget | None = None
        self.broker: Broker | None = None
        self.stream = Stream(self.run_id, None, self.cancel, self.stop_at_once)
        # Filled by the static checks.
        self.descriptor: Descriptor | None = None
        self.approvals = EffectiveApprovals()
        self.compiled: CompiledSchema | None = None
        self.schema_source: str = ""
        self._tools: tuple[_tool.Definition, ...] = ()
        self._mcp: tuple[MCPServerSpec, ...] = ()
        self._skills: tuple[_skill.Skill, ...] = ()
        # Filled by the preparation, released by the teardown.
        self._scratch: str | None = None
        self._resolved_skills: tuple[ResolvedSkill, ...] = ()
        self._endpoint: ToolsEndpoint | None = None
        self._tool_env: Mapping[str, str] = {}
        self._admission: Admission | None = None
        # The tool calls' cancellation (adaptor.tool.cancelled): set when the run ends, however.
        self._calls_ended = threading.Event()
        # The run's secrets (see _driver_secrets) and what replaces them in everything the run
        # hands out: its events, its Result and its error.
        self._secrets: list[str] = []
        self._redactor = _NO_SECRETS
        self._streams: StreamRedactor | None = None  # while the driver runs, with secrets

    # -- phases ------------------------------------------------------------------------------

    def start(self) -> Stream:
        handling = sys.exc_info()[1]  # the caller's own, when it starts a run in an `except` block
        try:
            self._static_checks()
        except BaseException as exc:  # refused before admission: no events at all
            if handling is not None:
                _cut_context(exc, handling)
            redact_error(exc, self._redactor)
            self.stream._settle(None, exc)
            return self.stream
        self.broker = Broker(
            self.run_id, self.thread_key, self.host.event_buffer, self.host.blocking_events
        )
        self.stream._broker = self.broker
        _unsettled.add(self)
        self.broker.publish(RunStarted(run_id=self.run_id))
        try:
            if self.deadline is not None:
                # From the deadline taken when the run was made, not from now: the static
                # checks in between are the run's time too.
                self._timer = threading.Timer(_interval(self.deadline - time.monotonic()), self._on_deadline)
                self._timer.daemon = True
                self._timer.start()
            _run_threads.start(self._execute, f"adaptor-{self.run_id}")
        except RuntimeError as exc:  # no thread for the run: it ends here, as any failed run
            self._teardown()
            self._finish(None, _no_thread(exc))
        return self.stream

    def _static_checks(self) -> None:
        """Every check made before admission (no events, nothing started), first problem
        wins: closed agent, driver config, policy, thread contract, tool definitions (and
        tool revisions for threads), MCP declarations (the tool gateway's included), the MCP
        SDK when there are tools, skill resolution (its one provider lookup), output schema."""
        if self.host.closed:
            raise errors.AgentClosedError()
        driver = self.host.driver
        self.descriptor = descriptor = checked_descriptor(driver)
        # Known from here on, so a refusal below that quotes one (a policy value) hides it too.
        self._secrets = _driver_secrets(driver, descriptor.type)
        self._redactor = Redactor(self._secrets)
        self.approvals = validate(self.options.policy, descriptor)
        if self.thread is not None:
            self._prelaunch = _thread.prelaunch(self.host, descriptor)  # type: ignore[arg-type]
        self._tools = _tool.check_catalogue(self.host.tools)
        if self._tools and self.thread is not None:
            _thread.require_tool_revisions(self._tools)
        self._mcp = _mcp.validate(self.options.mcp, descriptor, tools=bool(self._tools))
        if self._mcp:
            self._secrets = [*self._secrets, *_mcp_secrets(self._mcp)]
            self._redactor = Redactor(self._secrets)
        if self._tools:
            with _importing_tools:
                from adaptor import _gateway

                _gateway.require_sdk()
        self._skills = _skill.resolve(self.options.skills, self.host.skill_provider)
        if self.options.schema is not None:
            self.compiled, self.schema_source = checked_schema(
                self.options.schema, descriptor, self.approvals, self.options.policy
            )
        if self.timeout is not None and self.timeout <= 0:
            raise errors.DeadlineExceededError()
        self.host._register(self)

    def _execute(self) -> None:
        result: Result | None = None
        error: BaseException | None = None
        try:
            result = self._prepare_and_run()
        except BaseException as exc:
            error = exc
        finally:
            self._teardown()
        self._finish(result, error)

    def _finish(self, result: Result | None, error: BaseException | None) -> None:
        if error is not None:
            # Its message may quote the agent (a provider's 401 quoting the key), and so may a
            # cause from anywhere; the Result it carries is redacted already.
            try:
                redact_error(error, self._redactor)
            except Exception as exc:
                # Never a run left unsettled (its result() waited for ever), nor a secret shown:
                # the error that could not be redacted is not passed on.
                error = errors.RunError(
                    "infrastructure_error",
                    f"the run failed with a {type(error).__name__}, not shown: redacting it failed "
                    f"({type(exc).__name__})",
                    result=error.result if isinstance(error, errors.RunError) else result,
                )
        result_for_event: Result | None = error.result if isinstance(error, errors.RunError) else result
        self.stream._settle(result, error)
        _unsettled.discard(self)
        assert self.broker is not None
        self.broker.finish(lambda: self._redactor.value(self._run_finished(result_for_event, error)))
        self.host._unregister(self)

    def _prepare_and_run(self) -> Result:
        policy = self.options.policy
        budget_limit = None if policy is None else policy.active_execution_timeout
        if budget_limit:
            self._budget = _Budget(float(budget_limit), self._on_budget)
            self._budget.start()
        self._raise_if_ended_before_entry()
        self._prepare_resources()
        self._raise_if_ended_before_entry()
        if self.thread is not None:
            self._thread_identity = (self._prelaunch[0], self._thread_fingerprints())
            self._plan_thread(self.thread)
            restarted = None if self._plan is None else self._plan.restarted_because
            if restarted is not None:
                # Otherwise nothing tells the host its conversation's history was left behind.
                self.publish(
                    Notice(
                        kind="lifecycle",
                        text=f"starting a new session: the stored one does not fit ({restarted})",
                        data={"phase": "thread.new_session", "reason": restarted},
                    )
                )
        self._raise_if_ended_before_entry()
        request = self._request()
        with self._lock:
            self._raise_if_ended_before_entry()
        self.publish(Notice(kind="lifecycle", text="driver started", data={"phase": "driver.started"}))
        response, driver_error = self._call_driver(request)
        if isinstance(driver_error, errors.ResumeRejectedError) and self._may_start_fresh():
            # The stored session was refused: start a fresh one in the same invocation.  The
            # prompt was never delivered to the refused session, so nothing is replayed twice.
            self.publish(
                Notice(
                    kind="lifecycle",
                    text="stored session rejected; starting a fresh session",
                    data={"phase": "thread.resume_rejected", "reason": driver_error.reason},
                )
            )
            self._fresh_session = True
            fresh_request = dataclasses.replace(
                request, session=self._plan.session_context(fresh=True)  # type: ignore[union-attr]
            )
            response, driver_error = self._call_driver(fresh_request)
        return self._verdict(response, driver_error)

    def _prepare_resources(self) -> None:
        """Stage skills and start the tool gateway: after admission, before driver entry."""
        assert self.descriptor is not None
        skills = self._skills
        if skills and not self.descriptor.skills.supported:
            required = [s for s in skills if s.required]
            if required:
                # A skill the run was told it needs must not be dropped with a warning.
                raise _skill.SkillMaterializationError(
                    required[0].key,
                    _skill.runtime_name(required[0]),
                    cause=RuntimeError(
                        f"driver {self.descriptor.type!r} does not load skills "
                        f"(required: {required[0].reason or 'no reason given'})"
                    ),
                )
            self.publish(
                Notice(
                    kind="lifecycle",
                    text=f"driver {self.descriptor.type!r} does not load skills; "
                    f"{len(skills)} skill(s) not delivered",
                    data={"warning": "skills_unsupported", "keys": [s.key for s in skills]},
                )
            )
            skills = ()
        if skills or self._mcp or self._tools:
            self._scratch = _private_dirs.make("run")
        if skills:
            assert self._scratch is not None
            self._resolved_skills = _skill.materialize(skills, Path(self._scratch) / "skills")
        if self._tools:
            if any(t._checks_in_child for t in self._tools):
                from adaptor import _schema_checker

                _schema_checker.warm()  # ready by the model's first call
            try:
                self._endpoint, self._admission = self.host._tools_endpoint(
                    self._tools, self._calls_ended
                )
                self._tool_env = self._admission.env
            except errors.AgentClosedError:
                # close() cancelled this run first: report that, as for any pre-entry cancel.
                self._raise_if_ended_before_entry()
                raise
            # The gateway's token reaches the agent's environment like a key.
            self._redactor = Redactor([*self._secrets, *self._tool_env.values()])

    def _thread_fingerprints(self) -> _thread.Fingerprints:
        assert self.descriptor is not None
        codec_name, config_fingerprint = self._prelaunch
        return _thread.fingerprints(
            self.descriptor,
            codec_name,
            config_fingerprint,
            self.options,
            skills=_skill.fingerprint(self._resolved_skills) if self._resolved_skills else "",
            mcp=_mcp.fingerprint(self._mcp) if self._mcp else "",
            tools=_tool.catalogue_fingerprint(self._tools) if self._tools else "",
        )

    def _call_driver(self, request: Request) -> tuple[Response | None, BaseException | None]:
        sink = _Sink(self)
        if self._redactor:
            # A secret the model writes out comes in pieces, one per delta.
            self._streams = StreamRedactor(self._redactor)
        try:
            response = self.host.driver.run(request, sink)
            # Output, raw streams, transcript, failure: the Result and the error are made of it.
            # Not the checkpoint: it goes back to the driver to resume, and a session id that
            # happens to equal an env value must still name the session.
            if self._redactor and isinstance(response, Response):  # (else _verdict names it)
                shown = self._redactor.value(dataclasses.replace(response, checkpoint=None))
                response = dataclasses.replace(shown, checkpoint=response.checkpoint)
            return response, None
        except BaseException as exc:
            return None, exc
        finally:
            sink.closed = True
            streams, self._streams = self._streams, None
            if streams is not None:
                assert self.broker is not None
                for held in streams.flush():  # the ends of streams the driver left open
                    self.broker.publish(held)
            self._expire_open_requests()

    def _may_start_fresh(self) -> bool:
        plan = self._plan
        return (
            plan is not None
            and plan.session_mode == "continue_or_start"
            and plan.resumed is not None
            and not self._fresh_session
            and self._terminal is None
        )

    def _plan_thread(self, spec: ThreadSpec) -> None:
        assert self.descriptor is not None
        store = self.host.thread_store
        assert self._thread_identity is not None
        codec_name, fingerprint = self._thread_identity
        # Taken before the store's clock starts the leases' TTL, so never later than it.
        self._leased_at = time.monotonic()
        self._plan = _thread.plan(
            spec,
            store,
            driver_type=self.descriptor.type,
            codec_name=codec_name,
            fingerprint=fingerprint,
            lease_ttl=self.host.lease_ttl,
            codec=_thread.codec_of(self.host.driver),
        )
        self._renewer = threading.Thread(
            target=self._renew_leases, name=f"adaptor-lease-{self.run_id}", daemon=True
        )
        self._renewer.start()

    def _renew_leases(self) -> None:
        interval = self.host.lease_renewal
        if interval >= self.host.lease_ttl:
            interval = self.host.lease_ttl / 2
        plan = self._plan
        ttl = self.host.lease_ttl
        expires = self._leased_at + ttl
        wait = interval
        failure: Exception | None = None  # the last renewal's, while they fail
        while plan is not None and not self._released.wait(wait):
            attempted = time.monotonic()
            if failure is not None and attempted >= expires:
                # Renewals failed (a full disk) until the lease expired: another owner may take
                # the key now and drive the same session, so the run must not go on.  Asking
                # the store again would only race its own clock to say so.
                lost = errors.ThreadLeaseLostError(cause=failure)
                message = "thread lease expired: it could not be renewed; nothing was persisted"
                self.end(_Terminal("lease_lost", message, cause=lost))
                return
            try:
                _thread.renew(plan, ttl)
            except errors.ThreadLeaseLostError as exc:
                self.end(_Terminal("lease_lost", "thread lease lost; nothing was persisted", cause=exc))
                return
            except Exception as exc:  # it may pass: try again sooner, until the lease expires
                failure = exc
                left = expires - time.monotonic()
                wait = max(min(interval, left, max(left / 4, 0.05)), 0.0)
                continue
            failure = None
            expires = attempted + ttl
            wait = interval

    def _raise_if_ended_before_entry(self) -> None:
        terminal = self._terminal
        if terminal is None:
            return
        if terminal.kind == "deadline":
            raise errors.DeadlineExceededError()
        if terminal.kind == "budget" and self._budget is not None:
            # The budget counts from before staging and the lease, so it can run out first.
            # The identity stays the policy's (not the host's DeadlineExceededError), and as
            # every RunError it carries a Result: an empty one, nothing ran.
            limit = self._budget.limit
            raise errors.ActiveExecutionTimeoutError(
                limit,
                f"active execution budget of {limit:g}s exhausted before the agent started",
                details={"limit": limit},
                result=self._result(None),
            )
        if terminal.kind == "lease_lost" and terminal.cause is not None:
            raise terminal.cause
        raise errors.CancelledError()

    def _request(self) -> Request:
        prompt = self.prompt
        output_schema: OutputSchema | None = None
        if self.compiled is not None:
            from adaptor import _schema_checker
            from adaptor import schema as _schema

            _schema_checker.warm()  # ready by the time the agent answers
            schema_options = self.options.schema_options or _schema.SchemaOptions()
            output_schema = self.compiled.to_output_schema(schema_options)
            if self.schema_source == "prompt_validate":
                prompt = _schema.instruct(prompt, self.compiled, schema_options)
        return Request(
            run_id=self.run_id,
            prompt=prompt,
            config=None,
            workspace_cwd=self.options.workspace,
            session=SessionContext(mode="stateless")
            if self._plan is None
            else self._plan.session_context(),
            policy=self.options.policy,
            skills=self._resolved_skills,
            mcp=self._mcp,
            tools_endpoint=self._endpoint,
            scratch_dir=self._scratch,
            # The starter's mark too: a driver of one's own that hands Request.env to its CLI,
            # as it must, keeps the thread leased while that CLI outlives a killed host.
            env={**_procfs.started_by_me(), **self._tool_env},
            output_schema=output_schema,
            structured_output_source=self.schema_source,  # type: ignore[arg-type]
            spawn=self.options.spawn,
            model_override=self.options.model or "",
            append_system_prompt=self.options.append_system_prompt,
            instructions=self.options.instructions,
            metadata=dict(self.options.metadata),
            deadline=None
            if self.deadline is None
            else datetime.now(UTC) + timedelta(seconds=self.deadline - time.monotonic()),
        )

    # -- verdict -----------------------------------------------------------------------------

    def _verdict(self, response: Response | None, driver_error: BaseException | None) -> Result:
        # A driver's bug (typically a forgotten ``return``): named below, after the host's own
        # cancel or deadline, instead of failing an assertion with no message.
        returned = None
        if driver_error is None and not isinstance(response, Response):
            returned, response = type(response).__name__, None
        result = self._result(response)
        checkpoint = None if response is None else response.checkpoint
        if checkpoint is not None and checkpoint.state is not None:
            self._session_id = checkpoint.state.resume_id
        if self.deadline is not None and (
            (response is not None and response.timed_out) or time.monotonic() >= self.deadline
        ):
            # The driver was given this run's deadline and stopped its process when it passed,
            # which can happen just before this pipeline's own timer fires: the same deadline.
            # Or the deadline passed while the program was stopped (SIGSTOP, a suspended
            # laptop), and the driver's own wait ended before the timer's when it went on.
            with self._lock:
                if self._terminal is None:
                    self._terminal = _Terminal("deadline")
        terminal = self._terminal
        if self._budget is not None:
            self._budget.seal()
        if terminal is not None:
            raise self._terminal_error(terminal, result)
        if isinstance(driver_error, errors.ResumeRejectedError):
            raise driver_error
        assert self.descriptor is not None
        if driver_error is not None:
            # The exception's type only: its text could quote anything the driver held (its
            # environment's secrets) and this message reaches events and logs; the cause has it.
            raise errors.RunError(
                "infrastructure_error",
                f"execution failed: driver {self.descriptor.type!r} raised "
                f"{type(driver_error).__name__}",
                result=result,
                cause=driver_error,
            ) from driver_error
        if returned is not None:
            raise errors.RunError(
                "infrastructure_error",
                f"execution failed: driver {self.descriptor.type!r} returned {returned} from "
                "run(), not an adaptor.driver.Response",
                result=result,
            )
        assert response is not None
        if response.failure is not None:
            failure = response.failure
            raise errors.run_error_for_driver_code(
                failure.code,
                failure.message,
                details=dict(failure.details),
                result=result,
            )
        if response.exit_code != 0 or response.signal is not None or response.timed_out:
            raise errors.AgentFailedError(
                "driver process ended unsuccessfully: " + _describe_exit(response),
                details={
                    "exit_code": response.exit_code,
                    "signal": response.signal,
                    "timed_out": response.timed_out,
                },
                result=result,
            )
        if self.compiled is not None:
            source: Literal["native", "prompt_validate"] = (
                "native" if self.schema_source == "native" else "prompt_validate"
            )
            remaining = None if self.deadline is None else self.deadline - time.monotonic()
            record = self.compiled.validate_text(response.output, source, timeout=remaining)
            native = response.structured_output
            if source == "native" and native is not None and not native.valid and native.errors \
                    and not record.valid:
                # The provider's own verdict first, in the record too: without it the errors
                # (all a return_invalid caller or a verdict reader gets) only said the agent's
                # closing words were no JSON, not that the CLI returned no value.
                record = dataclasses.replace(record, errors=(*native.errors, *record.errors))
            result = result._with(structured=record)
            if not record.valid and self.deadline is not None and time.monotonic() >= self.deadline:
                # Output not shown valid before the deadline (a slow pattern check is cut
                # there): the run did not finish in time.
                raise self._terminal_error(_Terminal("deadline"), result)
            return_invalid = bool(
                self.options.schema_options and self.options.schema_options.return_invalid
            )
            if not record.valid and not return_invalid:
                problems = list(record.errors)
                if source == "native" and native is not None and not native.valid and native.errors:
                    # The text judged here is then only what the agent said instead (often why
                    # the value failed), so quote its start.
                    said = " ".join(response.output.split())
                    if said:
                        problems.append(f"the agent's final text: {said[:300]}")
                raise errors.PolicyViolationError(
                    "structured output invalid: " + ("; ".join(problems) or "no value"),
                    details={"errors": list(record.errors)},
                    result=result,
                )
        if self._plan is not None:
            try:
                _thread.finalize(self._plan, response, fresh=self._fresh_session)
            except (
                errors.ThreadCheckpointMissingError,
                errors.ThreadLeaseLostError,
                errors.ThreadAlreadyExistsError,
            ) as exc:
                raise errors.RunError(
                    "infrastructure_error", "thread coordination failed: " + str(exc),
                    result=result, cause=exc,
                ) from exc
            except Exception as exc:
                # The store could not save the thread (a full disk, a checkpoint it cannot
                # write): the agent's answer is still this run's, and the failure one of the
                # infrastructure after entry, like any other.
                raise errors.RunError(
                    "infrastructure_error",
                    f"the thread could not be saved: {type(exc).__name__}: {exc}",
                    result=result, cause=exc,
                ) from exc
        return result

    def _result(self, response: Response | None) -> Result:
        assert self.descriptor is not None
        if response is None:
            return Result(run_id=self.run_id, provider=self.descriptor.type,
                          model=self.options.model or "")
        return Result(
            run_id=self.run_id,
            model=response.model or self.options.model or "",
            provider=response.provider or self.descriptor.type,
            text=response.output,
            summary=response.summary,
            usage=response.usage,
            metadata=dict(response.metadata),
            _raw=response.raw_streams,
            _transcript=tuple(response.transcript),
        )

    def _terminal_error(self, terminal: _Terminal, result: Result) -> errors.RunError:
        if terminal.kind == "cancelled":
            return errors.RunCancelledError(
                terminal.message or "run cancelled", details=terminal.details, result=result,
                cause=errors.CancelledError(),
            )
        if terminal.kind == "deadline":
            return errors.RunDeadlineExceededError(
                f"run deadline of {self.timeout or 0:g}s exceeded" + _last_error(result),
                # As the active-execution budget does: callers (the A2A bridge's limit_ms)
                # can say which limit ran out without parsing the message.
                details={} if self.timeout is None else {"limit": self.timeout},
                result=result,
                cause=errors.DeadlineExceededError(),
            )
        if terminal.kind == "budget":
            assert self._budget is not None
            limit = self._budget.limit
            return errors.ActiveExecutionTimeoutError(
                limit, f"active execution budget of {limit:g}s exhausted" + _last_error(result),
                details={"limit": limit}, result=result,
            )
        if terminal.kind == "approval_denied":
            return errors.ApprovalDeniedError(terminal.message, details=terminal.details, result=result)
        if terminal.kind == "approval_timeout":
            return errors.ApprovalTimeoutError(terminal.message, details=terminal.details, result=result)
        if terminal.kind == "lease_lost" or (
            # The callback's own I/O failed (the daemon's pending file on a full disk): an
            # infrastructure failure, as errors.md has every I/O error once the driver runs,
            # not the agent's.
            terminal.kind == "handler" and isinstance(terminal.cause, OSError)
        ):
            return errors.RunError(
                "infrastructure_error", terminal.message, result=result, cause=terminal.cause
            )
        return errors.AgentFailedError(
            terminal.message, details=terminal.details, result=result, cause=terminal.cause
        )

    def _run_finished(self, result: Result | None, error: BaseException | None) -> RunFinished:
        reason = ""
        if isinstance(error, errors.RunError):
            reason = error.reason
        return RunFinished(
            run_id=self.run_id,
            thread_id=self._session_id,
            usage=None if result is None else result.usage,
            failed=error is not None,
            reason=reason,
            message="" if error is None else _text_of(error),
        )

    # -- ending a run ------------------------------------------------------------------------

    def end(self, terminal: _Terminal) -> None:
        """Record the first terminal cause and stop the driver."""
        with self._lock:
            if self._terminal is None:
                self._terminal = terminal
        self.cancelled.set()
        self._calls_ended.set()
        if self.broker is not None:
            self.broker.cancel()
        self._expire_open_requests()

    def cancel(self, message: str = "", details: Mapping[str, Any] | None = None) -> None:
        if self.stream._done.is_set():
            return
        self.end(_Terminal("cancelled", message, dict(details or {})))

    def stop_at_once(self) -> None:
        """:meth:`cancel`, and the agent is killed now instead of being given its grace."""
        self.cancelled.at_once = True
        self.cancel()

    def _on_deadline(self) -> None:
        self.end(_Terminal("deadline"))

    def _on_budget(self) -> None:
        self.end(_Terminal("budget"))

    def _expire_open_requests(self) -> None:
        with self._lock:
            responders = list(self._responders)
        for responder in responders:
            responder.expire("aborted")

    def _teardown(self) -> None:
        self._released.set()
        self._calls_ended.set()
        if self._admission is not None:
            self._admission.dismiss()  # a CLI that outlived its run calls no tool
        if self._plan is not None:
            _thread.release(self._plan)
        if self._timer is not None:
            self._timer.cancel()
        if self._budget is not None:
            self._budget.seal()
        if self._scratch is not None:
            _private_dirs.remove(self._scratch)

    # -- events and approvals from the driver ------------------------------------------------

    def publish(self, event: Event, *, deadline: float | None = None) -> bool:
        assert self.broker is not None
        streams = self._streams
        if streams is None:
            return self.broker.publish(self._redactor.value(event), deadline=deadline)
        published = True
        for shown in streams.events(event):
            published = self.broker.publish(shown, deadline=deadline) and published
        return published

    def decide(self, request: DecisionRequest) -> DecisionResponse:
        """Route one driver decision through the policy; see ``adaptor.approval``."""
        # Before the handler sees it: a tool's input may hold a key the agent read.
        request = self._redactor.value(request)
        attempt = 0
        while True:
            outcome, approval = self._ask(request, attempt)
            if outcome.result == "aborted" and self.deadline is not None and time.monotonic() >= self.deadline:
                # Refused a response after the run's deadline, before its timer (late on a busy
                # machine) ended the run: it ends now, as the deadline says.
                self._on_deadline()
            if outcome.result in ("approved", "answered", "aborted"):
                return _response(approval.id, outcome)
            timed_out = outcome.result == "timed_out"
            action = self.approvals.on_timeout if timed_out else self.approvals.on_reject
            auto = self.approvals.mode(request.kind) == "auto_reject"
            if action == "continue":
                return _response(approval.id, outcome)
            if action == "retry" and not auto:
                caps = self.descriptor.run_policy_caps if self.descriptor else None
                supported = bool(caps and getattr(caps, request.kind).retry)
                if supported and attempt < self.approvals.max_retries:
                    attempt += 1
                    continue
                if not supported:
                    self._warn_retry_unsupported(request.kind, action)
            self._abort_for(approval, outcome, attempt, exhausted=action == "retry" and not auto)
            return _response(approval.id, Outcome("aborted"))

    def _ask(self, request: DecisionRequest, attempt: int) -> tuple[Outcome, ApprovalRequest]:
        with self._lock:
            self._decisions += 1
            number = self._decisions
        # The clock the responder enforces is read before the one the request shows, so the
        # instant enforced is never later than the deadline shown: a response after the shown
        # deadline never wins, however long a busy machine took between the two readings.
        clock = time.monotonic()
        now = datetime.now(UTC)
        timeout = self.approvals.timeout
        deadline = None if timeout is None else _shown_after(now, timeout)
        if self.deadline is not None:
            # No response is taken once the run's own deadline ends it: a request showing a
            # later one (10 minutes, in a run with 2 left) promised time that was not there.
            ends = _shown_after(now, max(self.deadline - clock, 0.0))
            deadline = ends if deadline is None else min(deadline, ends)
        request_id = (
            request.request_id if request.request_id and attempt == 0 else f"{self.run_id}-dec-{number}"
        )
        responder = Responder(
            request.kind,
            tuple(c.key for c in request.choices),
            None if timeout is None else clock + timeout,
            run_ends=self.deadline,
        )
        approval = ApprovalRequest(
            id=request_id,
            run_id=self.run_id,
            kind=request.kind,
            title=request.title,
            source=request.source or request.kind,
            tool_call_id=request.tool_call_id,
            choices=tuple(Choice(c.key, c.label, c.description) for c in request.choices),
            details=dict(request.payload),
            created_at=now,
            deadline=deadline,
            attempt=attempt,
            _responder=responder,
            # What a callback sees (and the daemon's pending file holds); sequence 0 until the
            # event form publishes it, which numbers it like every event.
            meta=EventMeta(
                run_id=self.run_id,
                thread_key=self.thread_key,
                time=now,
                turn_id=self.broker.turn_id if self.broker is not None else "",
            ),
        )
        mode = self.approvals.mode(request.kind)
        self._notice_requested(approval, mode)
        if mode != "ask":
            result = "approved" if mode == "auto_approve" and request.kind != "question" else "rejected"
            outcome = Outcome(result, resolved_at=datetime.now(UTC))  # type: ignore[arg-type]
            self._notice_resolved(approval, outcome)
            return outcome, approval
        with self._lock:
            if self.cancelled.is_set():
                responder.expire("aborted")
            self._responders.append(responder)
        if self._budget is not None:
            self._budget.pause()
        try:
            outcome = self._wait_for_answer(approval, responder, timeout)
        finally:
            if self._budget is not None:
                self._budget.resume()
            with self._lock:
                self._responders.remove(responder)
        self._notice_resolved(approval, outcome)
        return outcome, approval

    def _call_handler(
        self, handler: Callable[[ApprovalRequest], object], approval: ApprovalRequest, responder: Responder
    ) -> tuple[object, BaseException | None] | None:
        """Call ``on_approval`` in a thread of its own: ``(returned, raised)`` once it returns,
        or None as soon as the request is settled while it still runs (answered by it, which
        may go on with other work, or expired: its deadline, the run's end, a cancel).

        Called on the run's thread, a callback blocked on a human made the run's timeout and
        cancel() wait for it to return: the run could not end before the callback did.
        """
        outcome: list[tuple[object, BaseException | None]] = []
        done = threading.Event()
        moved_on = threading.Event()

        def call() -> None:
            # Agent.close() from inside the callback must not wait for this run.
            outer, _in_callback.run = getattr(_in_callback, "run", None), self
            try:
                outcome.append((handler(approval), None))
            except BaseException as exc:
                outcome.append((None, exc))
                if moved_on.is_set():
                    self._raised_after_settling(approval, exc)
            finally:
                _in_callback.run = outer
                done.set()

        try:
            threading.Thread(target=call, name=f"adaptor-approval_{approval.id}", daemon=True).start()
        except RuntimeError:  # no thread to be had (a task limit): called here, as before
            call()
        while not done.wait(_HANDLER_POLL):
            if responder.outcome is not None:
                moved_on.set()
                return None
        return outcome[0]

    def _raised_after_settling(self, approval: ApprovalRequest, exc: BaseException) -> None:
        """Say what a callback raised once its request was settled, which no run takes up
        (it went unnoticed)."""
        if not isinstance(exc, errors.ApprovalResolvedError):  # (a late answer: it lost)
            _approval_log.warning(
                "on_approval callback raised after its request %s was settled: %s: %s",
                approval.id, type(exc).__name__, self._redactor.text(str(exc)),
            )

    def _wait_for_answer(
        self, approval: ApprovalRequest, responder: Responder, timeout: float | None
    ) -> Outcome:
        handler = self.options.on_approval
        if handler is not None:
            # Expired at its deadline while the callback still runs, so that request.wait()
            # and request.settled tell a callback waiting for a human that it is too late.
            expiry = None
            if timeout is not None:
                expiry = threading.Timer(timeout, responder.expire, ("timed_out",))
                expiry.daemon = True
                expiry.start()
            try:
                called = self._call_handler(handler, approval, responder)
            finally:
                if expiry is not None:
                    expiry.cancel()
            if called is None:
                # Settled while the callback still runs (it answered and went on with other
                # work, or it waits for a human and the request expired): the run goes on
                # without it.
                outcome = responder.outcome
                assert outcome is not None
                return outcome
            returned, raised = called
            if isinstance(raised, errors.ApprovalResolvedError):
                # A response too late (or a second one): the outcome that won stands.
                raised = None
            if raised is not None and responder.outcome is not None and not responder.expired:
                # It answered, then raised: the answer stands, as when the raise comes after
                # the run went on (whether it did depended on a poll's timing).
                self._raised_after_settling(approval, raised)
                raised = None
            if raised is not None:
                # KeyboardInterrupt and SystemExit too: the callback's thread is no main
                # thread, where signals land, so the callback raised them itself.  Let
                # through, they would unwind the driver (the error then blaming it) and
                # leave the request open, a response after the run's end taken as if it
                # counted.
                responder.expire("aborted")
                # Named in the message: the one line a log or `adaptor run` shows of it.
                try:
                    said = str(raised)
                except Exception:  # (its type alone, then)
                    said = ""
                why = f"approval handler raised {type(raised).__name__}" + (f": {_one_line(said)}" if said else "")
                self.end(_Terminal("handler", why, cause=raised))
                return Outcome("aborted")
            outcome = responder.outcome
            if outcome is None and responder.overdue:
                # A handler that waited out the deadline (a human who never answered).
                return responder.expire("timed_out")
            if outcome is None:
                responder.expire("aborted")
                why = "approval handler returned without resolving the request"
                if callable(returned):
                    # on_approval=deny_all: the factory itself, which returns the handler.
                    why += " (it returned a function: pass a handler factory called, e.g. deny_all(\"why\"))"
                self.end(_Terminal("handler", why))
                return Outcome("aborted")
            return outcome
        bound = None if timeout is None else time.monotonic() + timeout
        if not self.publish(approval, deadline=bound):
            return responder.expire("timed_out" if not self.cancelled.is_set() else "aborted")
        remaining = None if bound is None else max(bound - time.monotonic(), 0.0)
        settled = responder.wait(remaining)
        if settled is not None:
            return settled
        return responder.expire("timed_out")

    def _abort_for(
        self, approval: ApprovalRequest, outcome: Outcome, attempt: int, *, exhausted: bool
    ) -> None:
        timed_out = outcome.result == "timed_out"
        word = "timed out" if timed_out else "rejected"
        if exhausted and attempt >= self.approvals.max_retries and attempt > 0:
            message = f"approval {word} {attempt + 1} times: retries exhausted"
        else:
            message = f"approval {word}: kind={approval.kind} source={approval.source}"
        if outcome.text:
            # The reason given to deny(), which the person reading the error wants first.
            message += f"; reason: {_one_line(outcome.text)}"
        details: dict[str, Any] = {"kind": approval.kind, "source": approval.source,
                                   "request_id": approval.id, "attempts": attempt + 1}
        if outcome.text:
            details["text"] = outcome.text
        self.end(_Terminal("approval_timeout" if timed_out else "approval_denied", message, details))

    def _warn_retry_unsupported(self, kind: str, action: str) -> None:
        if kind in self._retry_warned:
            return
        self._retry_warned.add(kind)
        self.publish(
            Notice(
                kind="lifecycle",
                text=f"the driver cannot retry {kind} approvals; aborting instead",
                data={"warning": "human_decision_retry_unsupported", "kind": kind, "action": action},
            )
        )

    def _notice_requested(self, approval: ApprovalRequest, mode: str) -> None:
        self.publish(requested_notice(approval, mode))

    def _notice_resolved(self, approval: ApprovalRequest, outcome: Outcome) -> None:
        self.publish(resolved_notice(approval, outcome))


def requested_notice(approval: ApprovalRequest, mode: str) -> Notice:
    """``approval``'s ``notice.approval.requested`` under approval mode ``mode`` (adaptord's
    too, for one a crash kept out of its run's log)."""
    return Notice(
        kind="approval.requested",
        text=approval.title,
        data={**_approval_data(approval), "default_result": "ask" if mode == "ask" else mode},
    )


def resolved_notice(approval: ApprovalRequest, outcome: Outcome) -> Notice:
    """``approval``'s ``notice.approval.resolved`` (adaptord's too, for one a crash ended)."""
    return _resolution(_approval_data(approval), approval.created_at, outcome)


def resolution_of(requested: Notice, outcome: Outcome) -> Notice:
    """The ``notice.approval.resolved`` that ends a logged ``notice.approval.requested``
    (adaptord's, for an approval a crash ended when only its run's log still knew of it)."""
    data = {key: value for key, value in requested.data.items() if key != "default_result"}
    try:
        created_at: datetime | None = parse_time(data["created_at"])
    except Exception:  # (written by hand: no latency then)
        created_at = None
    return _resolution(data, created_at, outcome)


def _shown_after(now: datetime, seconds: float) -> datetime:
    # Rounded up, and a microsecond more for the wall clock's own rounding to the nearest one:
    # a deadline shown may be a little late, never early.
    return now + timedelta(microseconds=math.ceil(seconds * 1_000_000) + 1)


def _resolution(approval_data: dict[str, Any], created_at: datetime | None, outcome: Outcome) -> Notice:
    resolved_at = outcome.resolved_at or datetime.now(UTC)
    if created_at is not None and created_at.tzinfo is None:
        created_at = None  # (a date written by hand without its zone: no latency then)
    return Notice(
        kind="approval.resolved",
        text=outcome.result,
        data={
            **approval_data,
            "result": outcome.result,
            "choice": outcome.choice,
            "text": outcome.text,
            "resolved_at": format_time(resolved_at),
            "latency": None if created_at is None else (resolved_at - created_at).total_seconds(),
        },
    )


_NO_SECRETS = Redactor(())
# A driver's misuse the SDK survives (a late emit): a warning, never a failed run.
_log = logging.getLogger("adaptor.driver")
_approval_log = logging.getLogger("adaptor.approval")


# The values a run hands its agent that no event, Result or error may show: those the driver
# names (_driver_secrets), and those of the run's MCP servers (_mcp_secrets).


def _driver_secrets(driver: Driver, driver_type: str) -> list[str]:
    """The values the driver names: its config's env, the credentials its CLI inherits."""
    try:
        return _named_secrets(driver)
    except Exception as exc:  # built from bad configuration, like a descriptor
        raise InvalidDriverConfigError(driver_type, exc) from exc


def _mcp_secrets(servers: Sequence[MCPServerSpec]) -> list[str]:
    """The env values, headers, URL passwords and bearer tokens of the run's MCP servers."""
    values: list[str] = []
    for server in servers:
        values.extend(server.env.values())
        values.extend(server.headers.values())
        values.extend(_mcp.url_passwords(server.url))
        token = os.environ.get(server.bearer_token_env) if server.bearer_token_env else None
        if token:
            values.append(token)
    return values


def _approval_data(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "request_id": approval.id,
        "kind": approval.kind,
        "source": approval.source,
        "tool_call_id": approval.tool_call_id,
        "payload": approval.details,
        "choices": [c.key for c in approval.choices],
        "created_at": format_time(approval.created_at),
        "deadline": None if approval.deadline is None else format_time(approval.deadline),
        "attempt": approval.attempt,
    }


def _response(request_id: str, outcome: Outcome) -> DecisionResponse:
    return DecisionResponse(
        request_id=request_id, result=outcome.result, choice=outcome.choice, text=outcome.text
    )


def _one_line(text: str, limit: int = 300) -> str:
    said = " ".join(text.split())
    return said if len(said) <= limit else said[:limit] + "..."


def _last_error(result: Result) -> str:
    """The agent's last reported error, for the message of a run a time limit ended: a CLI that
    retries a bad key or a rate limit until then has said nothing else about why."""
    said = _one_line(str(result.metadata.get("last_error") or ""))
    return f"; the agent's last error: {said}" if said else ""


def _describe_exit(response: Response) -> str:
    if response.timed_out:
        return "timed out"
    if response.signal is not None:
        return f"killed by signal {response.signal}"
    return f"exit code {response.exit_code}"


# Notices only the SDK publishes (a driver's transcript items become the last one).
_SDK_NOTICES: Final = frozenset({"approval.requested", "approval.resolved", "transcript.item"})


class _Sink:
    """The EventSink handed to the driver for one run."""

    def __init__(self, run: RunPipeline) -> None:
        self._run = run
        self.closed = False
        self._late = False  # an emit after run() returned was reported

    @property
    def cancelled(self) -> threading.Event:
        return self._run.cancelled

    def emit(self, payload: Event | TranscriptItem) -> None:
        check_emitted(payload)
        if self.closed:
            if not self._late:  # once a run: a stray thread of the driver may go on emitting
                self._late = True
                _log.warning(
                    "driver %r emitted %s after its run() returned; dropped (run %s)",
                    self._run.descriptor.type if self._run.descriptor else "?",
                    type(payload).__name__,
                    self._run.run_id,
                )
            return
        if isinstance(payload, TranscriptItem):
            self._run.publish(Notice(kind="transcript.item", text=payload.text, data=payload.to_json()))
            return
        if isinstance(payload, RunStarted | RunFinished | Dropped) or (
            isinstance(payload, Notice) and payload.kind in _SDK_NOTICES
        ):
            # The SDK's own reports: a driver's would tell a consumer of approvals never asked,
            # or of events lost that were not.
            return
        self._run.publish(payload)

    def request_decision(self, request: DecisionRequest) -> DecisionResponse:
        if self.closed or self._run.cancelled.is_set():
            return DecisionResponse(request_id=request.request_id, result="aborted")
        return self._run.decide(request)

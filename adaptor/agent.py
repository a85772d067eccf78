"""Agent: the one constructor and the entry point of every run."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from adaptor import _options, _waiting
from adaptor._options import RunOptions
from adaptor._run import RunPipeline, run_in_callback
from adaptor._thread import DEFAULT_LEASE_RENEWAL, DEFAULT_LEASE_TTL, Thread, codec_name_of
from adaptor.driver import Driver
from adaptor.errors import AgentClosedError
from adaptor.skill import Provider
from adaptor.threadstore import Store
from adaptor.threadstore._types import MAX_TTL

if TYPE_CHECKING:
    from adaptor._gateway import Admission, Gateway
    from adaptor.driver._spi import ToolsEndpoint
    from adaptor.events import ApprovalRequest
    from adaptor.policy import Policy
    from adaptor.result import Result
    from adaptor.schema import SchemaOptions
    from adaptor.stream import Stream
    from adaptor.tool import Definition

__all__ = ["Agent", "Runner", "Thread"]


@runtime_checkable
class Runner(Protocol):
    """Anything that runs prompts: ``Agent`` and ``Thread``.  ``isinstance`` works with it."""

    def run(self, prompt: str, **options: Any) -> Result: ...
    def stream(self, prompt: str, **options: Any) -> Stream: ...


class Agent:
    """Runs prompts through one driver.

    Construction does no environment I/O.  Shared options set here are defaults for every run
    and can be overridden per call with keyword arguments of the same name; per-call options
    never change these defaults.  Safe to use from several threads.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        workspace: str | os.PathLike[str] | None = None,
        model: str | None = None,
        timeout: float | None = None,
        policy: Policy | None = None,
        instructions: str | None = None,
        append_system_prompt: str | None = None,
        metadata: Mapping[str, str] | None = None,
        skills: Sequence[Any] = (),
        mcp: Sequence[Any] | None = None,
        on_approval: Callable[[ApprovalRequest], None] | None = None,
        spawn: bool = False,
        thread_store: Store | None = None,
        tools: Sequence[Definition] | None = (),
        skill_provider: Provider | None = None,
        event_buffer: int = 1024,
        blocking_events: bool = False,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        lease_renewal: float = DEFAULT_LEASE_RENEWAL,
    ) -> None:
        if driver is None:
            raise TypeError("Agent needs a driver, e.g. Agent(claude.Driver(claude.Config()))")
        if isinstance(driver, type):
            # Its methods are there, unbound: the mistake would show only at the first run.
            raise TypeError(
                f"Agent needs a driver object, not the class {driver.__module__}."
                f"{driver.__qualname__}: pass an instance, {driver.__qualname__}(...)"
            )
        for method in ("descriptor", "validate_config", "run"):
            if not callable(getattr(driver, method, None)):
                raise TypeError(f"driver {driver!r} has no {method}() method")
        self.driver = driver
        if isinstance(event_buffer, bool) or not isinstance(event_buffer, int):
            raise TypeError(f"event_buffer takes a number of events, not {_options.kind_of(event_buffer)}")
        if event_buffer < 1:
            raise ValueError(f"event_buffer must be at least 1, not {event_buffer}")
        self.event_buffer = event_buffer
        if not isinstance(blocking_events, bool):
            # Truthiness would read blocking_events="no" as yes.
            raise TypeError(f"blocking_events takes True or False, not {_options.kind_of(blocking_events)}")
        self.blocking_events = blocking_events
        if thread_store is not None and not _options.provides(thread_store, Store):
            # A directory passed as is would fail every thread run, after it started, in the
            # store's first call.
            raise TypeError(
                "thread_store takes a store, e.g. adaptor.threadstore.JSONLStore(directory) or "
                f"adaptor.memory.Store(); got {_options.kind_of(thread_store)}"
            )
        self.thread_store = thread_store
        ttl = _waiting.seconds("lease_ttl", lease_ttl)
        renewal = _waiting.seconds("lease_renewal", lease_renewal)
        if ttl is None or renewal is None or ttl <= 0 or renewal <= 0:
            raise ValueError("lease_ttl and lease_renewal must be positive")
        if ttl > MAX_TTL:
            # Every store refuses a longer lease: each thread run failed, after it started.
            raise ValueError(f"lease_ttl must be at most ten years ({MAX_TTL:,.0f} s), not {ttl!r}")
        self.lease_ttl = float(ttl)
        self.lease_renewal = float(renewal)
        # Construction does no I/O: tools are checked, and their gateway started, by the first
        # run that needs them.
        self.tools = () if tools is None else _options.sequence(tools, "tools")
        if skill_provider is not None and not _options.provides(skill_provider, Provider):
            raise TypeError(
                f"skill_provider needs a get_skills(keys) method, e.g. skill.Set({{...}}); "
                f"got {type(skill_provider).__name__}"
            )
        self.skill_provider = skill_provider
        self._gateway: Gateway | None = None
        self._gateway_lock = threading.Lock()
        self._defaults = _options.defaults(
            workspace=workspace,
            model=model,
            timeout=timeout,
            policy=policy,
            instructions=instructions,
            append_system_prompt=append_system_prompt,
            metadata=metadata,
            skills=skills,
            mcp=mcp,
            on_approval=on_approval,
            spawn=spawn,
        )
        self._closed = False
        # Set once the driver's close_processes() returned: a close() that did not get that
        # far (a Ctrl-C in its wait, a closer that raised) leaves it to the next call.
        self._processes_closed = False
        self._lock = threading.Lock()
        self._active: set[RunPipeline] = set()
        self._idle = threading.Condition(self._lock)

    # -- running -------------------------------------------------------------------------------

    def run(
        self,
        prompt: str,
        *,
        schema: Any = None,
        schema_options: SchemaOptions | None = None,
        **options: Any,
    ) -> Result:
        """Run ``prompt`` to completion: exactly ``stream``, drain every event, ``result()``.

        Interrupted while it waits (Ctrl-C), it cancels the run and waits up to 10 s for it to
        stop before the exception goes on.
        """
        stream = self.stream(prompt, schema=schema, schema_options=schema_options, **options)
        return stream._result_for_run()

    def stream(
        self,
        prompt: str,
        *,
        schema: Any = None,
        schema_options: SchemaOptions | None = None,
        **options: Any,
    ) -> Stream:
        """Start a run and return its live Stream.  Never raises for run failures:
        ``result()`` raises them."""
        effective = self._options(options, schema=schema, schema_options=schema_options)
        return RunPipeline(self, prompt, effective).start()

    def thread(self, key: str, *, resume_only: bool = False) -> Thread:
        """A durable conversation under ``key`` (needs ``thread_store``).

        By default a run continues the stored conversation or starts one; with
        ``resume_only=True`` a missing conversation is ``ThreadNotFoundError`` and an
        incompatible one ``ThreadIncompatibleError``.
        """
        if not isinstance(resume_only, bool):
            raise TypeError(f"resume_only takes True or False, not {_options.kind_of(resume_only)}")
        return Thread(self, key, "continue_only" if resume_only else "continue_or_start")

    def driver_codec_name(self) -> str | None:
        return codec_name_of(self.driver)

    def _options(self, call: Mapping[str, Any], **call_only: Any) -> RunOptions:
        merged = self._defaults.merged(call)
        return merged.merged({k: v for k, v in call_only.items() if v is not None} or {})

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 10) -> None:
        """Refuse new runs, cancel active ones and wait up to ``timeout`` seconds for them.

        Idempotent.  Drivers with persistent processes get ``close_processes(timeout)``, once,
        by the first call that gets that far; then the tool gateway, if a run started one, is
        shut down.
        """
        # Checked first: a wrong one found after the runs were cancelled left the agent half
        # closed (refusing runs, its CLI processes and gateway still up).
        limit = _waiting.seconds("timeout", timeout)
        if limit is None:
            raise TypeError("close(timeout) takes a number of seconds, not None")
        with self._lock:
            self._closed = True
            active = list(self._active)
        for run in active:
            run.cancel()
        deadline = time.monotonic() + limit

        def left() -> float:
            # (Capped: an infinite timeout, "as long as it takes", overflows a thread wait.)
            return min(max(deadline - time.monotonic(), 0.0), threading.TIMEOUT_MAX)

        # Called from a run's own approval callback: that run ends only once the callback
        # returns, so it is cancelled and not waited for.
        own = run_in_callback()
        with self._idle:
            while any(run is not own for run in self._active):
                remaining = left()
                if remaining <= 0:
                    break
                _waiting.wait_condition(self._idle, remaining)
        closer = getattr(self.driver, "close_processes", None)
        if callable(closer) and not self._processes_closed:
            closer(left())
            self._processes_closed = True
        # After the runs and the CLI processes: a CLI still running may still call a tool.
        with self._gateway_lock:
            gateway, self._gateway = self._gateway, None
        if gateway is not None:
            gateway.close(left())

    def _tools_endpoint(
        self, tools: Sequence[Definition], ended: threading.Event
    ) -> tuple[ToolsEndpoint, Admission]:
        """The running tool gateway (started on first use) and one run's admission to it."""
        from adaptor._gateway import Gateway

        with self._gateway_lock:
            # close() marks the agent closed before it takes this lock, so a gateway started
            # here is always seen (and stopped) by it.
            if self._closed:
                raise AgentClosedError()
            if self._gateway is None:
                self._gateway = Gateway(tools)
                # An Agent dropped without close() must not leave its server listening.
                weakref.finalize(self, self._gateway.close, 1.0)
            return self._gateway.start(), self._gateway.admit(ended)

    def _register(self, run: RunPipeline) -> None:
        with self._lock:
            if self._closed:
                raise AgentClosedError()
            self._active.add(run)

    def _unregister(self, run: RunPipeline) -> None:
        with self._idle:
            self._active.discard(run)
            self._idle.notify_all()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


"""The driver conformance suite: the rules every driver keeps, checked against one driver.

::

    from adaptor.testing import conformance

    conformance.run(lambda: mydriver.Driver(mydriver.Config(...))).raise_for_failures()

The suite calls the driver directly through :class:`~adaptor.testing.RecordingSink` (no Agent):
it inspects the descriptor, config validation and capability declarations, then makes one run
with ``prompt`` in a fresh temporary working directory and checks the events, the transcript and
the response.  When that run checkpoints, a fresh driver resumes the stored session with a
second turn in the same directory (``RES-01``).  Another run of the prompt is cancelled
(``sink.cancelled`` set) as soon as the driver emits anything.  After each run, no process the
run started may still be running: they are found by a variable of the run's ``Request.env``,
which the driver must hand to its process (only on Linux, through ``/proc``; elsewhere
``PRC-01`` and ``CAN-01`` pass).

With ``stub_driver`` (a function of an executable's path returning the driver set up to start
that executable in place of its CLI), one more run starts the suite's stub agent, which records
whether ``Request.env`` reached it (``ENV-01``) and prints malformed output: half a JSON line,
a line that looks like JSON but does not parse, and non-JSON text, then exits 0 (``MAL-01``).
Clause ids follow the reference suite where one exists (see :data:`CLAUSES`).

A clause that does not apply passes: ``CAP-11`` for a driver without persistent processes,
``RES-01`` when the driver does not resume or the run is not a success with a valid checkpoint
(which a thread would store), ``ENV-01``
and ``MAL-01`` without ``stub_driver`` (a driver starting no process).  When the run itself
fails (``RUN-00``), the clauses that inspect it are not reported at all.  Failure messages name
ids, kinds and sizes only, never provider text.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import orjson

from adaptor import _procfs
from adaptor.driver import (
    Descriptor,
    Driver,
    InvalidDriverConfigError,
    Request,
    Response,
    SessionCodec,
    SessionContext,
)
from adaptor.errors import ResumeRejectedError
from adaptor.events import (
    Event,
    EventMeta,
    ProcessInfo,
    TextDelta,
    Thinking,
    ToolCall,
    ToolResult,
)
from adaptor.result import TranscriptItem
from adaptor.testing import RecordingSink

__all__ = ["CLAUSES", "ConformanceError", "Report", "run"]

CLAUSES: Final[Mapping[str, str]] = {
    "DRV-01": "descriptor type and display_name are non-empty strings",
    "DRV-02": "descriptor is deterministic across calls and across fresh instances",
    "DRV-03": "each descriptor() call returns an independent copy",
    "CFG-01": "validate_config(None) accepts the captured config",
    "CFG-02": "validate_config rejects a foreign config type",
    "CAP-01": "sessions.supports_resume <=> a session codec; resume => stable config fingerprint",
    "CAP-11": "process.persistent => close_processes(), idempotent",
    "RUN-00": "run() returns a Response without raising, within the time limit",
    "EVT-03": "text lifecycle: start once per message id; content/end only while open",
    "EVT-04": "content deltas are non-empty",
    "EVT-05": "tool lifecycle: start has id and name; content/end/result only for known ids",
    "EVT-06": "thinking lifecycle like text",
    "EVT-10": "drivers leave event meta at its default (the SDK assigns it)",
    "EVT-11": "every lifecycle is closed when run() returns",
    "RUN-04": "transcript items emitted equal Response.transcript, in order",
    "TRN-01": "text-bearing transcript items have text",
    "TRN-02": "tool_call items name the tool",
    "TRN-03": "tool_result items carry the tool use id",
    "RSP-01": "a valid checkpoint needs exit 0, no signal/timeout/failure and a resume id",
    "RSP-03": "output is never the raw stdout or the terminal JSON",
    "RSP-04": "a valid checkpoint round-trips through the session codec",
    "RSP-05": "a terminal payload has an event name and valid JSON",
    "RES-01": "a fresh driver given the stored checkpoint continues that session",
    "SEC-01": "environment values never appear in events, transcript or output",
    "ENV-01": "Request.env reaches the agent process",
    "MAL-01": "malformed agent output ends the run: no hang, no raise, no checkpoint, agent_error",
    "PRC-01": "no process started by the run is left running when run() returns",
    "CAN-01": "a run cancelled at its first event returns in time and leaves no process running",
}

_TEXT_KINDS: Final = frozenset({"assistant", "thinking", "user", "summary", "question"})
_CANARY_NAME: Final = "ADAPTOR_CONFORMANCE_SECRET"
_CANCEL_GRACE: Final = 10.0
# How long processes of a run that has returned may take to finish dying (a SIGTERM in flight).
_EXIT_GRACE: Final = 3.0


class ConformanceError(AssertionError):
    """Raised by :meth:`Report.raise_for_failures`; ``failed`` maps clause ids to reasons."""

    def __init__(self, failed: Mapping[str, str]) -> None:
        self.failed = dict(failed)
        lines = "\n".join(f"  {clause}: {why}" for clause, why in self.failed.items())
        super().__init__(f"driver conformance failed ({len(self.failed)} clause(s)):\n{lines}")


@dataclass
class Report:
    """Clause ids that passed, in check order, and the failed ones with their reasons."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    def raise_for_failures(self) -> None:
        if self.failed:
            raise ConformanceError(self.failed)


def run(
    driver_factory: Callable[[], Driver],
    *,
    prompt: str = "Say hello",
    timeout: float = 120.0,
    stub_driver: Callable[[str], Driver] | None = None,
) -> Report:
    """Check the driver ``driver_factory()`` builds; ``prompt`` must make it produce text.

    Each clause needing a pristine instance gets a fresh one.  ``timeout`` bounds each run;
    past it the sink's ``cancelled`` is set and ``RUN-00`` fails.  ``stub_driver(path)``, when
    given, builds the same driver starting the executable ``path`` instead of its CLI.
    """
    report = Report()
    suite = _Suite(report)

    try:
        # A private copy: DRV-03 scrambles returned descriptors, possibly this very object.
        descriptor = copy.deepcopy(driver_factory().descriptor())
    except Exception as exc:
        report.failed["DRV-01"] = f"descriptor() raised {_describe(exc)}"
        return report
    suite.check("DRV-01", lambda: _names(descriptor))
    suite.check("DRV-02", lambda: _deterministic(driver_factory))
    suite.check("DRV-03", lambda: _independent(driver_factory))
    suite.check("CFG-01", lambda: driver_factory().validate_config(None))
    suite.check("CFG-02", lambda: _rejects_foreign_config(driver_factory()))
    suite.check("CAP-01", lambda: _session_support(driver_factory, descriptor))
    suite.check("CAP-11", lambda: _process_lifecycle(driver_factory(), descriptor))

    driver = driver_factory()
    canary = secrets.token_hex(16)
    sink = RecordingSink()
    with tempfile.TemporaryDirectory(prefix="adaptor-conformance-") as cwd:
        request = _request(prompt, cwd, descriptor, canary)
        try:
            response = _call(driver, request, sink, timeout)
        except _Violation as violation:
            report.failed["RUN-00"] = str(violation)
            # A run that hung may have left its agent running: stopped, and named, as after
            # any other run.
            try:
                _no_survivors(driver, descriptor, canary)
            except _Violation as left:
                report.failed["RUN-00"] += f"; {left}"
            return report
        report.passed.append("RUN-00")
        suite.check("PRC-01", lambda: _no_survivors(driver, descriptor, canary))
        # In the first run's directory: a CLI may keep its sessions per working directory.
        suite.check(
            "RES-01", lambda: _resumed_run(driver_factory, descriptor, request, response, timeout)
        )

    payloads = sink.payloads
    events = sink.events
    lifecycles = _Lifecycles()
    lifecycles.feed(events)
    for clause in ("EVT-03", "EVT-04", "EVT-05", "EVT-06", "EVT-11"):
        suite.check(clause, functools.partial(lifecycles.verdict, clause))
    suite.check("EVT-10", lambda: _default_meta(events))
    suite.check("RUN-04", lambda: _mirrored(sink.transcript, response.transcript))
    suite.check("TRN-01", lambda: _text_items(response.transcript))
    suite.check("TRN-02", lambda: _tool_call_items(response.transcript))
    suite.check("TRN-03", lambda: _tool_result_items(response.transcript))
    suite.check("RSP-01", lambda: _checkpoint_clean(response))
    suite.check("RSP-03", lambda: _output_layer(response))
    suite.check("RSP-04", lambda: _checkpoint_codec(driver, response))
    suite.check("RSP-05", lambda: _terminal(response))
    suite.check("CAN-01", lambda: _cancelled_run(driver_factory(), descriptor, prompt, timeout))
    stub = None if stub_driver is None else _stub_run(stub_driver, descriptor, prompt, timeout)
    suite.check("SEC-01", lambda: _no_secrets(canary, payloads, response, stub))
    suite.check("ENV-01", lambda: _env_reached(stub))
    # Only a driver whose run ended in an official terminal event speaks a protocol (see RSP-03).
    speaks_protocol = response.raw_streams.terminal is not None
    suite.check("MAL-01", lambda: _malformed_ends(stub, speaks_protocol))
    return report


def _request(prompt: str, cwd: str, descriptor: Descriptor, canary: str) -> Request:
    return Request(
        run_id="run_" + secrets.token_hex(8),
        prompt=prompt,
        workspace_cwd=cwd,
        session=SessionContext("continue_or_start") if descriptor.sessions.supports_resume else None,
        env={_CANARY_NAME: canary},
    )


# --- machinery ----------------------------------------------------------------------------------


class _Violation(Exception):
    pass


class _Raised(_Violation):
    """run() raised ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"run() raised {_describe(exc)}")
        self.exc = exc


def _fail(why: str) -> NoReturn:
    raise _Violation(why)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Suite:
    def __init__(self, report: Report) -> None:
        self.report = report

    def check(self, clause: str, probe: Callable[[], None]) -> None:
        try:
            probe()
        except _Violation as violation:
            self.report.failed[clause] = str(violation)
        except Exception as exc:  # a crashing driver fails the clause, not the suite
            self.report.failed[clause] = f"raised {_describe(exc)}"
        else:
            self.report.passed.append(clause)


def _call(driver: Driver, request: Request, sink: RecordingSink, timeout: float) -> Response:
    """``driver.run(request, sink)``; a hang, a raise or anything but a Response is a violation."""
    outcome: list[Response | BaseException] = []

    def target() -> None:
        try:
            outcome.append(driver.run(request, sink))
        except BaseException as exc:
            outcome.append(exc)

    # A thread, so a hung driver costs the caller ``timeout`` and not the whole test session.
    worker = threading.Thread(target=target, name="conformance-run", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        sink.cancelled.set()
        worker.join(_CANCEL_GRACE)
        _fail(f"run() did not return within {timeout:g}s")
    result = outcome[0]
    if isinstance(result, BaseException):
        raise _Raised(result)
    if not isinstance(result, Response):
        _fail(f"run() returned {type(result).__name__}, not Response")
    return result


# --- processes ----------------------------------------------------------------------------------


class _CancelAtFirstPayload(RecordingSink):
    cancelled_at: float | None = None  # monotonic

    def emit(self, payload: Event | TranscriptItem) -> None:
        super().emit(payload)
        if self.cancelled_at is None:
            self.cancelled_at = time.monotonic()
        self.cancelled.set()


def _cancelled_run(driver: Driver, descriptor: Descriptor, prompt: str, timeout: float) -> None:
    canary = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="adaptor-conformance-") as cwd:
        request = _request(prompt, cwd, descriptor, canary)
        # Raising is allowed: the SDK reports a cancelled run as cancelled whatever run() did.
        done = threading.Event()

        def target() -> None:
            try:
                driver.run(request, sink)
            except BaseException:
                pass
            finally:
                done.set()

        sink = _CancelAtFirstPayload()
        threading.Thread(target=target, name="conformance-cancel", daemon=True).start()
        if not done.wait(timeout):
            sink.cancelled.set()
            with contextlib.suppress(_Violation):  # stops what it left; the hang is the news
                _no_survivors(driver, descriptor, canary)
            _fail(f"run() did not return within {timeout:g}s of being cancelled")
        returned = time.monotonic()
        _no_survivors(driver, descriptor, canary)
        if sink.cancelled_at is not None and returned - sink.cancelled_at > _CANCEL_GRACE:
            # Within the whole run's timeout, a driver that ignores the sink's cancelled and
            # lets its agent finish passed: a cancel is for now, not for the end of the run.
            _fail(
                f"run() returned {returned - sink.cancelled_at:.1f}s after being cancelled "
                f"(at most {_CANCEL_GRACE:g}s: stop the agent when sink.cancelled is set)"
            )


def _no_survivors(driver: Driver, descriptor: Descriptor, canary: str) -> None:
    if not _procfs.usable():
        return  # no /proc of our own: nothing can be judged
    if descriptor.process.persistent:
        # A process kept for the session's next turn is legitimate until it is closed.
        close = getattr(driver, "close_processes", None)
        if callable(close):
            close(_CANCEL_GRACE)
    entry = f"{_CANARY_NAME}={canary}".encode()
    deadline = time.monotonic() + _EXIT_GRACE
    left = _procfs.carrying(entry)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _procfs.carrying(entry)
    if not left:
        return
    for pid, _ in left:
        # The suite's own leftovers (nobody else carries this run's secret): not the caller's.
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    # Reported once they are really gone: a SIGKILL takes effect when the kernel next runs
    # the process, and the caller may look right after.
    deadline = time.monotonic() + _EXIT_GRACE
    while time.monotonic() < deadline and any(_running(pid) for pid, _ in left):
        time.sleep(0.01)
    _fail(
        f"{len(left)} process(es) the run started still running after run() returned "
        f"(pids {', '.join(str(pid) for pid, _ in left)})"
    )


def _running(pid: int) -> bool:
    found = _procfs.stat(pid)
    return found is not None and not found.zombie


# --- descriptor, config, capabilities -----------------------------------------------------------


def _names(descriptor: Descriptor) -> None:
    for name in ("type", "display_name"):
        value = getattr(descriptor, name)
        if not isinstance(value, str) or not value.strip():
            _fail(f"descriptor.{name} is empty or not a string")


def _deterministic(factory: Callable[[], Driver]) -> None:
    driver = factory()
    first = dataclasses.asdict(driver.descriptor())
    if dataclasses.asdict(driver.descriptor()) != first:
        _fail("two descriptor() calls on one instance differ")
    if dataclasses.asdict(factory().descriptor()) != first:
        _fail("descriptors of two fresh instances differ")


def _independent(factory: Callable[[], Driver]) -> None:
    driver = factory()
    returned = driver.descriptor()
    baseline = dataclasses.asdict(returned)
    _scramble(returned)
    if dataclasses.asdict(driver.descriptor()) != baseline:
        _fail("mutating a returned descriptor changed the next one (shared objects)")


def _scramble(obj: Any) -> None:
    """Change every mutable part of a descriptor in place."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool):
            setattr(obj, f.name, not value)
        elif isinstance(value, str):
            setattr(obj, f.name, value + "~")
        elif isinstance(value, list):
            for item in value:
                if dataclasses.is_dataclass(item) and not isinstance(item, type):
                    _scramble(item)
            value.append(None)
        elif isinstance(value, dict):
            value["~conformance"] = True
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            _scramble(value)


def _rejects_foreign_config(driver: Driver) -> None:
    try:
        driver.validate_config(object())
    except (TypeError, ValueError, InvalidDriverConfigError):
        return
    _fail("validate_config(object()) did not raise TypeError or ValueError")


def _codec(driver: Driver) -> SessionCodec | None:
    # Optional SPI methods: absent, or present and returning None, both mean "not supported".
    provider = getattr(driver, "session_codec", None)
    return provider() if callable(provider) else None


def _fingerprint(driver: Driver) -> Any:
    fingerprinter = getattr(driver, "session_config_fingerprint", None)
    if not callable(fingerprinter):
        _fail("supports_resume but no session_config_fingerprint()")
    return fingerprinter()


def _session_support(factory: Callable[[], Driver], descriptor: Descriptor) -> None:
    driver = factory()
    codec = _codec(driver)
    if not descriptor.sessions.supports_resume:
        if codec is not None:
            _fail("a session codec without sessions.supports_resume")
        return
    if codec is None:
        _fail("sessions.supports_resume without a session codec")
    name = codec.name()
    if not isinstance(name, str) or not name:
        _fail("session codec name is empty")
    other = _codec(factory())
    if other is None or other.name() != name:
        _fail("session codec differs across fresh instances")
    fingerprint = _fingerprint(driver)
    if not isinstance(fingerprint, str) or not fingerprint.startswith("sha256:"):
        _fail('session config fingerprint is not a "sha256:" string')
    if len(fingerprint) <= len("sha256:"):
        _fail("session config fingerprint has no digest")
    if _fingerprint(driver) != fingerprint or _fingerprint(factory()) != fingerprint:
        _fail("session config fingerprint is not stable")


def _process_lifecycle(driver: Driver, descriptor: Descriptor) -> None:
    if not descriptor.process.persistent:
        return
    close = getattr(driver, "close_processes", None)
    if not callable(close):
        _fail("process.persistent without close_processes()")
    close(10.0)
    close(10.0)


# --- events -------------------------------------------------------------------------------------


class _Lifecycle:
    """Open/seen ids of one lifecycle family; problems are filed under clause ids."""

    def __init__(self, label: str, clause: str, problems: dict[str, list[str]]) -> None:
        self.label = label
        self.clause = clause
        self.problems = problems
        self.open: list[str] = []
        self.seen: set[str] = set()

    def file(self, clause: str, why: str) -> None:
        self.problems.setdefault(clause, []).append(why)

    def start(self, ident: str) -> None:
        if not ident:
            self.file(self.clause, f"{self.label}.start without an id")
        elif ident in self.seen:
            self.file(self.clause, f"{self.label}.start repeated for {ident!r}")
        else:
            self.seen.add(ident)
            self.open.append(ident)

    def touch(self, ident: str, phase: str) -> bool:
        if ident not in self.open:
            self.file(self.clause, f"{self.label}.{phase} for {ident!r} outside an open lifecycle")
            return False
        return True

    def end(self, ident: str) -> None:
        if self.touch(ident, "end"):
            self.open.remove(ident)

    def close_out(self) -> None:
        for ident in self.open:
            self.file("EVT-11", f"{self.label} {ident!r} never ended")


class _Lifecycles:
    def __init__(self) -> None:
        self.problems: dict[str, list[str]] = {}
        self.text = _Lifecycle("text", "EVT-03", self.problems)
        self.thinking = _Lifecycle("thinking", "EVT-06", self.problems)
        self.tool = _Lifecycle("tool_call", "EVT-05", self.problems)

    def feed(self, events: Sequence[Event]) -> None:
        for event in events:
            match event:
                case TextDelta():
                    self._message(self.text, event.phase, event.message_id, event.text)
                case Thinking():
                    self._message(self.thinking, event.phase, event.message_id, event.text)
                case ToolCall():
                    self._tool(event)
                case ToolResult():
                    if event.id not in self.tool.seen:
                        self.tool.file("EVT-05", f"tool_result for unknown id {event.id!r}")
        for family in (self.text, self.thinking, self.tool):
            family.close_out()

    def _message(self, family: _Lifecycle, phase: str, ident: str, text: str) -> None:
        if phase == "start":
            family.start(ident)
        elif phase == "content":
            family.touch(ident, "content")
            if not text:
                family.file("EVT-04", f"empty {family.label}.content delta for {ident!r}")
        elif phase == "end":
            family.end(ident)
        else:
            family.file(family.clause, f"unknown {family.label} phase {phase!r}")

    def _tool(self, event: ToolCall) -> None:
        if event.phase == "start":
            if not event.name:
                self.tool.file("EVT-05", f"tool_call.start for {event.id!r} without a name")
            self.tool.start(event.id)
        elif event.phase == "content":
            self.tool.touch(event.id, "content")
            if not event.args_delta:
                self.tool.file("EVT-04", f"empty tool_call.content args delta for {event.id!r}")
        elif event.phase == "end":
            self.tool.end(event.id)
        else:
            self.tool.file("EVT-05", f"unknown tool_call phase {event.phase!r}")

    def verdict(self, clause: str) -> None:
        problems = self.problems.get(clause)
        if problems:
            _fail("; ".join(problems))


def _default_meta(events: Sequence[Event]) -> None:
    default = EventMeta()
    for index, event in enumerate(events):
        if event.meta != default:
            _fail(f"event #{index} ({type(event).__name__}) carries meta")


# --- transcript and response --------------------------------------------------------------------


def _mirrored(emitted: Sequence[TranscriptItem], returned: Sequence[TranscriptItem]) -> None:
    returned = list(returned)
    if list(emitted) == returned:
        return
    for index, (a, b) in enumerate(zip(emitted, returned, strict=False)):
        if a != b:
            _fail(f"item #{index} differs (emitted {a.kind!r}, returned {b.kind!r})")
    _fail(f"{len(emitted)} item(s) emitted but {len(returned)} returned")


def _text_items(items: Sequence[TranscriptItem]) -> None:
    for index, item in enumerate(items):
        if item.kind in _TEXT_KINDS and not item.text:
            _fail(f"item #{index} ({item.kind}) has no text")


def _tool_call_items(items: Sequence[TranscriptItem]) -> None:
    for index, item in enumerate(items):
        if item.kind == "tool_call" and not item.tool_name:
            _fail(f"tool_call item #{index} has no tool_name")


def _tool_result_items(items: Sequence[TranscriptItem]) -> None:
    for index, item in enumerate(items):
        if item.kind == "tool_result" and not item.tool_use_id:
            _fail(f"tool_result item #{index} has no tool_use_id")


def _checkpoint_clean(response: Response) -> None:
    checkpoint = response.checkpoint
    if checkpoint is None or not checkpoint.valid:
        return
    if response.exit_code != 0:
        _fail(f"valid checkpoint with exit code {response.exit_code}")
    if response.signal is not None:
        _fail(f"valid checkpoint with signal {response.signal}")
    if response.timed_out:
        _fail("valid checkpoint on a timed-out run")
    if response.failure is not None:
        _fail(f"valid checkpoint with failure {response.failure.code!r}")
    if not checkpoint.state.resume_id:
        _fail("valid checkpoint without a resume id")


def _output_layer(response: Response) -> None:
    output = response.output
    if not output:
        return
    raw = response.raw_streams
    # Only a driver that saw an official terminal event speaks a protocol; for a plain-text
    # driver (``command``) the whole stdout legitimately is the answer.
    if raw.terminal is not None and raw.stdout and output.strip() == raw.stdout.strip():
        _fail(f"output is the raw stdout ({len(output)} chars)")
    if raw.terminal is not None and output.strip() == raw.terminal.json.strip():
        _fail("output is the terminal JSON")


def _checkpoint_codec(driver: Driver, response: Response) -> None:
    checkpoint = response.checkpoint
    if checkpoint is None or not checkpoint.valid:
        return
    codec = _codec(driver)
    if codec is None:
        _fail("valid checkpoint from a driver without a session codec")
    params = codec.encode(checkpoint.state)
    state = codec.decode(params)
    if state is None:
        _fail("the codec decoded the checkpoint's parameters to nothing")
    if state.resume_id != checkpoint.state.resume_id or dict(state.data) != dict(
        checkpoint.state.data
    ):
        _fail("resume_id or data changed through the codec")
    if codec.encode(state) != params:
        _fail("parameters changed through a decode/encode round trip")


def _terminal(response: Response) -> None:
    terminal = response.raw_streams.terminal
    if terminal is None:
        return
    if not terminal.event:
        _fail("terminal payload without an event name")
    try:
        orjson.loads(terminal.json)
    except orjson.JSONDecodeError:
        _fail(f"terminal payload JSON does not parse ({len(terminal.json)} chars)")


def _no_secrets(
    canary: str, payloads: Sequence[object], response: Response, stub: _StubRun | None
) -> None:
    _no_secret(canary, payloads, response)
    if stub is not None and isinstance(stub.outcome, Response):
        # A driver's error path (here: malformed output) must not dump its environment either.
        _no_secret(stub.canary, stub.sink.payloads, stub.outcome)


def _no_secret(canary: str, payloads: Sequence[object], response: Response) -> None:
    # Raw chunks and raw streams keep every byte the process printed, by design.
    for index, payload in enumerate(payloads):
        if isinstance(payload, ProcessInfo) and payload.kind in ("stdout", "stderr"):
            continue
        if canary in repr(payload):
            _fail(f"payload #{index} ({type(payload).__name__}) contains an environment value")
    public = (
        response.output,
        response.summary,
        response.transcript,
        response.metadata,
        response.failure,
        response.checkpoint,
    )
    if any(canary in repr(part) for part in public):
        _fail("the response contains an environment value")


# --- sessions -----------------------------------------------------------------------------------


def _resumed_run(
    factory: Callable[[], Driver],
    descriptor: Descriptor,
    first: Request,
    response: Response,
    timeout: float,
) -> None:
    checkpoint = response.checkpoint
    if not descriptor.sessions.supports_resume or checkpoint is None or not checkpoint.valid:
        return
    if not _clean(response):
        return  # a thread stores no checkpoint of a failed run (RSP-01 judges this one)
    # What a thread does at its next turn, possibly in another process: a fresh driver gets
    # the state as the store gives it back, through the codec.
    driver = factory()
    codec = _codec(driver)
    if codec is None:
        _fail("no session codec to store the checkpoint with")
    stored = codec.decode(codec.encode(checkpoint.state))
    if stored is None:
        _fail("the codec decoded the checkpoint's parameters to nothing")
    canary = secrets.token_hex(16)
    request = dataclasses.replace(
        first,
        run_id="run_" + secrets.token_hex(8),
        session=SessionContext("continue_or_start", stored),
        env={_CANARY_NAME: canary},
    )
    try:
        resumed = _call(driver, request, RecordingSink(), timeout)
    except _Raised as raised:
        if isinstance(raised.exc, ResumeRejectedError):
            _fail("the driver rejected the session its own run had checkpointed")
        raise
    finally:
        _no_survivors(driver, descriptor, canary)
    if not _clean(resumed):
        _fail(f"the resumed run did not succeed ({_outcome(resumed)})")
    again = resumed.checkpoint
    if again is None or not again.valid:
        _fail("the resumed run returned no valid checkpoint")
    if again.state.resume_id != stored.resume_id:
        # The agent was not given the session, or started a fresh one instead.
        _fail("the resumed run ended in another session than the one it was given")


def _clean(response: Response) -> bool:
    return (
        response.exit_code == 0
        and response.signal is None
        and not response.timed_out
        and response.failure is None
    )


def _outcome(response: Response) -> str:
    failure = response.failure
    code = "none" if failure is None else repr(failure.code)
    return f"exit {response.exit_code}, signal {response.signal}, failure {code}"


# --- the stub agent -----------------------------------------------------------------------------

# What the stub prints: non-JSON text, JSON that is no event object, a line that looks like JSON
# (naming a session, for a driver that fishes ids out of any line) but does not parse, bytes that
# are not UTF-8, and a half line cut off by the exit.  Then it exits 0, as a CLI that crashed in
# its printing might.
_GARBAGE: Final = (
    b"this is not the protocol\n"
    b'["valid JSON", "but no event"]\n'
    b'{"type": "result", "subtype": "success", "session_id": "conformance-garbage", "result": \n'
    b"\xff\xfe\x00 binary\n"
    b'{"type": "assistant", "message": {"content": [{"type": "te'
)
# How long the stub waits for the driver's first line on stdin: a driver writing its prompt to
# a pipe its agent already closed would be judged on a race, not on its output handling.
_STUB_STDIN_WAIT: Final = 5.0
_STUB: Final = """\
import os, select, sys
with open({record!r}, "w") as f:
    f.write(os.environ.get({name!r}, ""))
if select.select([sys.stdin], [], [], {wait!r})[0]:
    sys.stdin.buffer.readline()
sys.stdout.buffer.write({garbage!r})
sys.stdout.flush()
"""


@dataclass
class _StubRun:
    canary: str
    sink: RecordingSink
    outcome: Response | _Violation
    env_seen: str | None  # the canary as the stub saw it; None: the stub never started
    survivors: _Violation | None


def _stub_run(
    stub_driver: Callable[[str], Driver], descriptor: Descriptor, prompt: str, timeout: float
) -> _StubRun:
    canary = secrets.token_hex(16)
    sink = RecordingSink()
    with tempfile.TemporaryDirectory(prefix="adaptor-conformance-") as cwd:
        # Not in the workspace: a driver or CLI may look at what is there.
        home = os.path.join(cwd, "stub")
        workspace = os.path.join(cwd, "workspace")
        os.mkdir(home)
        os.mkdir(workspace)
        record = os.path.join(home, "env")
        path = os.path.join(home, "agent")
        source = _STUB.format(
            record=record, name=_CANARY_NAME, wait=_STUB_STDIN_WAIT, garbage=_GARBAGE
        )
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n{source}")
        os.chmod(path, 0o700)
        outcome: Response | _Violation
        survivors = None
        try:
            driver = stub_driver(path)
            outcome = _call(driver, _request(prompt, workspace, descriptor, canary), sink, timeout)
        except _Violation as violation:
            outcome = violation
        except Exception as exc:  # stub_driver itself raised
            outcome = _Violation(f"stub_driver() raised {_describe(exc)}")
        else:
            try:
                _no_survivors(driver, descriptor, canary)
            except _Violation as violation:
                survivors = violation
        try:
            with open(record) as f:
                env_seen: str | None = f.read()
        except FileNotFoundError:
            env_seen = None
    return _StubRun(canary, sink, outcome, env_seen, survivors)


def _env_reached(stub: _StubRun | None) -> None:
    if stub is None:
        return
    if stub.env_seen is None:
        if isinstance(stub.outcome, _Violation):
            _fail(f"the stub agent never started: {stub.outcome}")
        _fail("the driver did not start the executable it was given")
    if stub.env_seen != stub.canary:
        _fail(f"{_CANARY_NAME}, set in Request.env, did not reach the agent's environment")


def _malformed_ends(stub: _StubRun | None, speaks_protocol: bool) -> None:
    if stub is None:
        return
    outcome = stub.outcome
    if isinstance(outcome, _Raised):
        # Its type only: the message may quote what the agent printed.
        _fail(f"run() raised {type(outcome.exc).__name__} on malformed output")
    if isinstance(outcome, _Violation):
        _fail(f"on malformed output: {outcome}")
    if stub.survivors is not None:
        _fail(f"on malformed output: {stub.survivors}")
    checkpoint = outcome.checkpoint
    if checkpoint is not None and checkpoint.valid:
        _fail("a valid checkpoint from malformed output")
    if not speaks_protocol:
        return  # plain text (``command``): any stdout is an answer
    failure = outcome.failure
    if failure is None:
        _fail(f"malformed output without a failure ({_outcome(outcome)})")
    if failure.code not in ("agent_error", ""):
        _fail(f"malformed output failed with {failure.code!r}, not 'agent_error'")

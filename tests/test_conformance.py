"""adaptor.testing.conformance: the script driver passes; each broken toy fails its clause."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import pytest

from adaptor import _procfs
from adaptor.driver import (
    Checkpoint,
    Descriptor,
    Driver,
    EventSink,
    ProcessCaps,
    Request,
    Response,
    RunFailure,
    SessionCaps,
    SessionCodec,
    SessionState,
    canonical_fingerprint,
)
from adaptor.errors import ResumeRejectedError
from adaptor.events import EventMeta, ProcessInfo, TextDelta
from adaptor.result import RawStreams, TerminalPayload, TranscriptItem
from adaptor.testing import ScriptedDriver, conformance

EVERY_STEP: tuple[Mapping[str, Any], ...] = (
    {"thinking": "plan"},
    {"tool_call": {"name": "Bash", "args": {"cmd": "ls"}, "result": "a b"}},
    {"approval": {"kind": "permission", "title": "run ls?"}},
    {"approval": {"kind": "question", "choices": ["yes", "no"]}},
    {"stdout": '{"type": "noise"}'},
    {"stderr": "warning"},
    {"sleep": 0},
    {"text": "Hello"},
    {"output_json": {"ok": True}},
)


@pytest.mark.parametrize(
    ("steps", "descriptor", "session"),
    [
        pytest.param([{"text": "Hello"}], None, None, id="text"),
        pytest.param([], None, None, id="empty"),
        pytest.param(EVERY_STEP, None, "auto", id="every-step-auto-session"),
        pytest.param([{"text": "Hello"}], None, "fixed-id", id="fixed-session"),
        pytest.param([{"text": "Hi"}, {"fail": {"message": "x"}}], None, "auto", id="fail"),
        pytest.param([{"text": "Hi"}, {"exit": 3}], None, "auto", id="exit"),
        pytest.param(
            [{"text": "Hello"}], {"sessions": {"supports_resume": False}}, "auto", id="no-resume"
        ),
        pytest.param(
            [{"text": "Hello"}],
            {"process": {"persistent": True}, "structured_output": {"native_hitl": {}}},
            "auto",
            id="persistent",
        ),
    ],
)
def test_script_driver_conforms(
    steps: Sequence[Mapping[str, Any]], descriptor: Mapping[str, Any] | None, session: str | None
) -> None:
    report = conformance.run(lambda: ScriptedDriver(steps, descriptor, session=session))
    report.raise_for_failures()
    assert report.ok
    assert sorted(report.passed) == sorted(conformance.CLAUSES)


# --- toy drivers --------------------------------------------------------------------------------


class ToyCodec:
    def name(self) -> str:
        return "toy"

    def encode(self, state: SessionState | None) -> dict[str, Any]:
        return {} if state is None else {"resume_id": state.resume_id, "data": dict(state.data)}

    def decode(self, params: Mapping[str, Any]) -> SessionState | None:
        if not params:
            return None
        return SessionState(resume_id=params["resume_id"], data=params["data"])


class ToyDriver:
    """A minimal compliant driver; each subclass below breaks exactly one rule."""

    def descriptor(self) -> Descriptor:
        return Descriptor(
            type="toy", display_name="Toy", sessions=SessionCaps(supports_resume=True)
        )

    def validate_config(self, config: object | None = None) -> None:
        if config is not None:
            raise TypeError("toy takes no config")

    def session_codec(self) -> SessionCodec | None:
        return ToyCodec()

    def session_config_fingerprint(self) -> str:
        return canonical_fingerprint("toy/v1", {})

    def run(self, request: Request, sink: EventSink) -> Response:
        self.speak(sink, "hi")
        item = TranscriptItem(kind="assistant", text="hi")
        sink.emit(item)
        return self.respond([item])

    def speak(self, sink: EventSink, text: str) -> None:
        sink.emit(TextDelta(message_id="m1", phase="start"))
        sink.emit(TextDelta(message_id="m1", text=text, phase="content"))
        sink.emit(TextDelta(message_id="m1", phase="end"))

    def respond(self, transcript: Sequence[TranscriptItem], **fields: Any) -> Response:
        state = SessionState(resume_id="toy-1", data={"cwd": "/"})
        terminal = '{"type":"done","session_id":"toy-1"}'
        defaults: dict[str, Any] = {
            "output": "hi",
            "transcript": tuple(transcript),
            "checkpoint": Checkpoint(state, valid=True),
            "raw_streams": RawStreams(stdout=terminal, terminal=TerminalPayload("done", terminal)),
        }
        return Response(**(defaults | fields))


_instances = itertools.count()


class NondeterministicDescriptor(ToyDriver):
    def __init__(self) -> None:
        self.serial = next(_instances)

    def descriptor(self) -> Descriptor:
        return dataclasses.replace(super().descriptor(), display_name=f"Toy #{self.serial}")


_SHARED = ToyDriver().descriptor()


class SharedDescriptor(ToyDriver):
    def descriptor(self) -> Descriptor:
        return _SHARED


class AcceptsForeignConfig(ToyDriver):
    def validate_config(self, config: object | None = None) -> None:
        pass


class ResumeWithoutCodec(ToyDriver):
    def session_codec(self) -> SessionCodec | None:
        return None

    def run(self, request: Request, sink: EventSink) -> Response:
        return self.respond([], checkpoint=None)  # a checkpoint would also break RSP-04


class UnstableFingerprint(ToyDriver):
    def session_config_fingerprint(self) -> str:
        return canonical_fingerprint("toy/v1", {"n": next(_instances)})


class PersistentWithoutClose(ToyDriver):
    def descriptor(self) -> Descriptor:
        return dataclasses.replace(super().descriptor(), process=ProcessCaps(persistent=True))


class UnclosedText(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        sink.emit(TextDelta(message_id="m1", phase="start"))
        sink.emit(TextDelta(message_id="m1", text="hi", phase="content"))
        return self.respond([])


class ContentOutsideLifecycle(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        sink.emit(TextDelta(message_id="m9", text="hi", phase="content"))
        return self.respond([])


class EmptyDelta(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        self.speak(sink, "")
        return self.respond([])


class MetaOnEvents(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        sink.emit(ProcessInfo(kind="spawn", meta=EventMeta(run_id=request.run_id, sequence=1)))
        return self.respond([])


class TranscriptMismatch(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        hidden = TranscriptItem(kind="assistant", text="hidden")
        return self.respond([hidden])


class ToolCallItemWithoutName(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        item = TranscriptItem(kind="tool_call", tool_use_id="t1")
        sink.emit(item)
        return self.respond([item])


class CheckpointOnFailure(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        return self.respond([], exit_code=1, failure=RunFailure(message="boom"))


class OutputIsRawStdout(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        stdout = '{"type":"text","text":"hi"}\n{"type":"result"}\n'
        raw = RawStreams(stdout=stdout, terminal=TerminalPayload("result", '{"type":"result"}'))
        return self.respond([], output=stdout, raw_streams=raw)


class BadTerminalJSON(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        raw = RawStreams(stdout="{", terminal=TerminalPayload("result", "{"))
        return self.respond([], raw_streams=raw)


class LeaksEnvironment(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        sink.emit(ProcessInfo(kind="spawn", data={"env": dict(request.env)}))
        return self.respond([])


class StartsAFreshSessionEveryRun(ToyDriver):
    """Never hands the stored session to its agent: every turn starts a new one."""

    def respond(self, transcript: Sequence[TranscriptItem], **fields: Any) -> Response:
        state = SessionState(resume_id=f"toy-{next(_instances)}", data={"cwd": "/"})
        return super().respond(transcript, checkpoint=Checkpoint(state, valid=True), **fields)


class RejectsItsOwnCheckpoint(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        if request.session is not None and request.session.state is not None:
            raise ResumeRejectedError("no such session")
        return super().run(request, sink)


def _agent_process(request: Request) -> subprocess.Popen[bytes]:
    """A stand-in for the agent CLI: runs until stopped, with the run's environment."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(600)"],
        env={**os.environ, **request.env},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    # Popen may return while the exec is still setting up the new image, whose environment
    # /proc shows empty until then: the suite, looking right after run(), would miss it.
    assert child.stdout is not None
    child.stdout.readline()
    return child


class LeavesItsProcessRunning(ToyDriver):
    """Returns once the answer is in, neither waiting for nor stopping the agent's process."""

    def run(self, request: Request, sink: EventSink) -> Response:
        _agent_process(request)
        return super().run(request, sink)


class AbandonsItsProcessOnCancel(ToyDriver):
    """Stops its process after the answer, but at a cancel returns and leaves it running."""

    def run(self, request: Request, sink: EventSink) -> Response:
        child = _agent_process(request)
        sink.emit(ProcessInfo(kind="spawn"))
        if sink.cancelled.is_set():
            return Response(exit_code=None, signal=15)
        child.kill()
        child.wait()
        return super().run(request, sink)


@pytest.mark.parametrize(
    ("toy", "clause"),
    [
        (AbandonsItsProcessOnCancel, "CAN-01"),
        (NondeterministicDescriptor, "DRV-02"),
        (SharedDescriptor, "DRV-03"),
        (AcceptsForeignConfig, "CFG-02"),
        (ResumeWithoutCodec, "CAP-01"),
        (UnstableFingerprint, "CAP-01"),
        (PersistentWithoutClose, "CAP-11"),
        (UnclosedText, "EVT-11"),
        (ContentOutsideLifecycle, "EVT-03"),
        (EmptyDelta, "EVT-04"),
        (MetaOnEvents, "EVT-10"),
        (TranscriptMismatch, "RUN-04"),
        (ToolCallItemWithoutName, "TRN-02"),
        (CheckpointOnFailure, "RSP-01"),
        (OutputIsRawStdout, "RSP-03"),
        (BadTerminalJSON, "RSP-05"),
        (LeaksEnvironment, "SEC-01"),
        (StartsAFreshSessionEveryRun, "RES-01"),
        (RejectsItsOwnCheckpoint, "RES-01"),
    ],
)
def test_broken_driver_fails_exactly_its_clause(toy: Callable[[], Driver], clause: str) -> None:
    report = conformance.run(toy)

    assert list(report.failed) == [clause], report.failed
    assert clause not in report.passed
    with pytest.raises(conformance.ConformanceError) as caught:
        report.raise_for_failures()
    assert isinstance(caught.value, AssertionError)
    assert caught.value.failed == report.failed
    assert clause in str(caught.value)


def test_a_process_left_running_fails_both_process_clauses_and_is_stopped() -> None:
    # The suite accepted a driver that returned with its agent process still working in the
    # workspace, the one thing every driver must never do (docs/drivers.md).
    report = conformance.run(LeavesItsProcessRunning)
    # The resumed turn leaves its process running too.
    assert sorted(report.failed) == ["CAN-01", "PRC-01", "RES-01"], report.failed
    assert "still running after run() returned" in report.failed["PRC-01"]
    pids = [int(p) for why in report.failed.values() for p in re.findall(r"\d{2,}", why)]
    assert pids
    # The suite stopped them (SIGKILL): nothing of the test is left behind either.
    for pid in pids:
        state = _procfs.stat(pid)
        assert state is None or state.zombie


def test_the_compliant_toy_passes() -> None:
    report = conformance.run(ToyDriver)
    assert report.failed == {}
    assert sorted(report.passed) == sorted(conformance.CLAUSES)


def test_failure_messages_withhold_provider_text() -> None:
    report = conformance.run(OutputIsRawStdout)
    assert '"type"' not in report.failed["RSP-03"]


class RaisesInRun(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        raise RuntimeError("process exploded")


class HangsUntilCancelled(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        sink.cancelled.wait()
        return self.respond([])


class DescriptorRaises(ToyDriver):
    def descriptor(self) -> Descriptor:
        raise RuntimeError("no descriptor")


def test_a_run_that_raises_fails_run_00_and_skips_run_clauses() -> None:
    report = conformance.run(RaisesInRun)
    assert report.failed == {"RUN-00": "run() raised RuntimeError: process exploded"}
    assert "RUN-04" not in report.passed and "EVT-03" not in report.passed


def test_a_hanging_run_is_cancelled_after_the_timeout() -> None:
    report = conformance.run(HangsUntilCancelled, timeout=0.01)
    assert list(report.failed) == ["RUN-00"]
    assert "did not return" in report.failed["RUN-00"]


class IgnoresCancel(ToyDriver):
    """Cancelled, it lets its agent finish (well within the run's timeout)."""

    def run(self, request: Request, sink: EventSink) -> Response:
        sink.emit(TextDelta(message_id="m1", phase="start"))
        if sink.cancelled.is_set():
            time.sleep(1.0)  # "the agent" goes on to its end
        sink.emit(TextDelta(message_id="m1", text="hi", phase="content"))
        sink.emit(TextDelta(message_id="m1", phase="end"))
        item = TranscriptItem(kind="assistant", text="hi")
        sink.emit(item)
        return self.respond([item])


def test_a_driver_that_ignores_a_cancel_fails_can_01(monkeypatch: pytest.MonkeyPatch) -> None:
    # "In time" was the suite's whole timeout (120 s by default): a driver finishing its agent's
    # work after a cancel passed.
    monkeypatch.setattr(conformance, "_CANCEL_GRACE", 0.3)
    report = conformance.run(IgnoresCancel)
    assert list(report.failed) == ["CAN-01"], report.failed
    assert "after being cancelled (at most 0.3s" in report.failed["CAN-01"]


class HangsLeavingItsProcess(ToyDriver):
    def run(self, request: Request, sink: EventSink) -> Response:
        self.child = _agent_process(request)
        sink.cancelled.wait()
        return self.respond([])


def test_a_hanging_run_has_its_process_stopped_and_named() -> None:
    # RUN-00 failed and the suite returned with the hung run's agent still running.
    driver = HangsLeavingItsProcess()
    report = conformance.run(lambda: driver, timeout=0.5)
    assert list(report.failed) == ["RUN-00"]
    assert "did not return" in report.failed["RUN-00"]
    assert str(driver.child.pid) in report.failed["RUN-00"]
    assert driver.child.wait(timeout=10) is not None  # stopped (SIGKILL)


def test_a_descriptor_that_raises_stops_the_suite() -> None:
    report = conformance.run(DescriptorRaises)
    assert list(report.failed) == ["DRV-01"]
    assert report.passed == []


# --- the stub agent: ENV-01 and MAL-01 ----------------------------------------------------------


class StubRunner(ToyDriver):
    """Starts the executable it is given like a JSON-lines CLI driver: with the run's env, the
    prompt on stdin; a line that does not parse or a missing terminal event is an agent_error."""

    def __init__(self, command: str) -> None:
        self.command = command

    def spawn_env(self, request: Request) -> dict[str, str]:
        return {**os.environ, **request.env}

    def run(self, request: Request, sink: EventSink) -> Response:
        done = subprocess.run(
            [self.command],
            input=request.prompt.encode(),
            capture_output=True,
            cwd=request.workspace_cwd,
            env=self.spawn_env(request),
            start_new_session=True,
            check=False,
        )
        return self.parse(done.stdout, done.returncode)

    def parse(self, stdout: bytes, exit_code: int) -> Response:
        try:
            events = [orjson.loads(line) for line in stdout.splitlines()]
        except orjson.JSONDecodeError:
            return self.malformed(exit_code)
        if not any(isinstance(e, dict) and e.get("type") == "done" for e in events):
            return self.malformed(exit_code)
        return self.respond([])

    def malformed(self, exit_code: int) -> Response:
        failure = RunFailure(message="malformed output")
        return Response(exit_code=exit_code, failure=failure)


class DropsRequestEnv(StubRunner):
    def spawn_env(self, request: Request) -> dict[str, str]:
        return dict(os.environ)


class NeverStartsTheAgent(StubRunner):
    def run(self, request: Request, sink: EventSink) -> Response:
        return self.parse(b'{"type":"done"}', 0)


class TrustsTheExitStatus(StubRunner):
    def parse(self, stdout: bytes, exit_code: int) -> Response:
        return self.respond([]) if exit_code == 0 else self.malformed(exit_code)


class RaisesOnGarbage(StubRunner):
    def parse(self, stdout: bytes, exit_code: int) -> Response:
        for line in stdout.splitlines():
            orjson.loads(line)
        return super().parse(stdout, exit_code)


class WaitsForATerminalEvent(StubRunner):
    """Reads until the terminal event, which never comes: hangs until cancelled."""

    def run(self, request: Request, sink: EventSink) -> Response:
        response = super().run(request, sink)
        if response.failure is not None:
            sink.cancelled.wait()
        return response


class BlamesTheInfrastructure(StubRunner):
    def malformed(self, exit_code: int) -> Response:
        return Response(exit_code=exit_code, failure=RunFailure(code="infrastructure_error"))


def test_a_driver_running_the_stub_agent_properly_passes() -> None:
    report = conformance.run(ToyDriver, stub_driver=StubRunner)
    assert report.failed == {}
    assert sorted(report.passed) == sorted(conformance.CLAUSES)


@pytest.mark.parametrize(
    ("toy", "clause"),
    [
        (DropsRequestEnv, "ENV-01"),
        (TrustsTheExitStatus, "MAL-01"),
        (RaisesOnGarbage, "MAL-01"),
        (WaitsForATerminalEvent, "MAL-01"),
        (BlamesTheInfrastructure, "MAL-01"),
    ],
)
def test_broken_stub_run_fails_exactly_its_clause(
    toy: Callable[[str], Driver], clause: str
) -> None:
    report = conformance.run(ToyDriver, stub_driver=toy, timeout=8)
    assert list(report.failed) == [clause], report.failed
    assert clause not in report.passed


def test_a_driver_that_never_starts_its_agent_fails_env_01() -> None:
    report = conformance.run(ToyDriver, stub_driver=NeverStartsTheAgent)
    assert report.failed == {
        "ENV-01": "the driver did not start the executable it was given",
        "MAL-01": "a valid checkpoint from malformed output",
    }


def test_malformed_output_needs_an_agent_error_only_from_a_protocol_driver() -> None:
    class PlainText(ToyDriver):
        def respond(self, transcript: Sequence[TranscriptItem], **fields: Any) -> Response:
            return super().respond(transcript, raw_streams=RawStreams(), **fields)

    class PlainTextStub(PlainText, StubRunner):
        def parse(self, stdout: bytes, exit_code: int) -> Response:
            return self.respond([], checkpoint=None)

    assert conformance.run(PlainText, stub_driver=PlainTextStub).ok
    # The same stub run judged after a protocol driver's run.
    report = conformance.run(ToyDriver, stub_driver=PlainTextStub)
    assert list(report.failed) == ["MAL-01"]
    assert "without a failure" in report.failed["MAL-01"]


def test_a_stub_run_that_dumps_its_environment_fails_sec_01() -> None:
    class DumpsEnvOnError(StubRunner):
        def run(self, request: Request, sink: EventSink) -> Response:
            sink.emit(ProcessInfo(kind="spawn", data={"env": dict(request.env)}))
            return super().run(request, sink)

    report = conformance.run(ToyDriver, stub_driver=DumpsEnvOnError)
    assert list(report.failed) == ["SEC-01"]

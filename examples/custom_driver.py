"""A driver of your own: plugging an agent CLI into adaptor with public names only.

    python examples/custom_driver.py

The "CLI" is examples/echo_agent.py (JSON lines on stdout, ``--resume ID``, non-zero exit on
failure).  docs/drivers.md#writing-your-own-driver explains each part.  The demo runs it
in-process (a run, a stream, a thread of two turns, a failure) and through the conformance
suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adaptor
import adaptor.memory
from adaptor.driver import (
    Checkpoint,
    Descriptor,
    EventSink,
    Request,
    Response,
    RunFailure,
    SessionCaps,
    SessionState,
    StandardSessionCodec,
    StructuredOutputCaps,
    canonical_fingerprint,
)
from adaptor.errors import ResumeRejectedError
from adaptor.events import ProcessInfo, TextDelta
from adaptor.result import RawStreams, TerminalPayload, TranscriptItem, Usage
from adaptor.testing import conformance

ECHO_AGENT = str(Path(__file__).with_name("echo_agent.py"))


@dataclass(frozen=True)
class Config:
    command: str = ECHO_AGENT
    env: Mapping[str, str] = field(default_factory=dict)
    grace_period: float = 2.0  # SIGTERM to SIGKILL when a run is stopped


class Driver:
    def __init__(self, config: Config | None = None) -> None:
        self._config = config or Config()

    def descriptor(self) -> Descriptor:
        # Only what run() honours: the SDK refuses everything else before the run starts.
        return Descriptor(
            type="echo",
            display_name="Echo Agent",
            sessions=SessionCaps(supports_resume=True),
            instructions=True,
            structured_output=StructuredOutputCaps(prompt_validate=True),
        )

    def validate_config(self, config: object | None = None) -> None:
        config = self._config if config is None else config
        if not isinstance(config, Config):
            raise TypeError(f"expected a custom_driver.Config, not {type(config).__name__}")
        if not config.command:
            raise ValueError("command is empty")

    def session_codec(self) -> StandardSessionCodec:
        return StandardSessionCodec("echo")

    def session_config_fingerprint(self) -> str:
        # What changes the session: env *names* count, values (keys) and the binary's path not.
        return canonical_fingerprint("echo/config/v1", sorted(self._config.env))

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config
        if request.append_system_prompt or request.model_override:
            return Response(exit_code=None, failure=RunFailure(
                code="unsupported_driver", message="echo_agent has no system prompt or model"))
        argv = [sys.executable, config.command]
        state = request.session.state if request.session else None
        if state is not None:
            argv += ["--resume", state.resume_id]
        prompt = request.prompt
        if request.instructions:
            prompt = f"{request.instructions}\n\n{prompt}"
        extra = {**config.env, **request.env}  # request.env must reach the CLI (tool gateway)
        sink.emit(ProcessInfo(kind="spawn", data={"argv": argv, "env": sorted(extra)}))
        if not os.path.exists(config.command):
            return Response(exit_code=None, failure=RunFailure(
                code="infrastructure_error", message=f"{config.command} not found",
                details={"kind": "binary_not_found", "binary": config.command}))
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=request.workspace_cwd, env={**os.environ, **extra},
            start_new_session=True,  # its own process group: stopped as a whole
        )
        stopper = threading.Thread(target=_stop_on_cancel, args=(proc, sink, config.grace_period))
        stopper.start()
        stderr = _Collect(proc.stderr)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(prompt.encode())
        proc.stdin.close()  # never leave stdin open and idle

        parser = _Parser(sink, request.run_id)
        stdout = bytearray()
        for line in proc.stdout:
            stdout += line
            sink.emit(ProcessInfo(kind="stdout", text=line.decode(errors="replace")))
            parser.feed(line.decode(errors="replace"))
        code = proc.wait()
        _signal_group(proc, signal.SIGKILL)  # whatever it left behind in its group
        stopper.join()
        err = stderr.text()
        if state is not None and "not found" in err:
            raise ResumeRejectedError(f"echo_agent does not know session {state.resume_id}")
        return parser.response(code, stdout.decode(errors="replace"), err, sink.cancelled.is_set())


class _Parser:
    def __init__(self, sink: EventSink, run_id: str) -> None:
        self.sink, self.message_id = sink, f"{run_id}/text"
        self.transcript: list[TranscriptItem] = []
        self.text_open = False
        self.terminal: dict[str, Any] | None = None
        self.terminal_line = ""
        self.malformed = False

    def feed(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            self.malformed = True
            return
        if not isinstance(event, dict):  # valid JSON, but no event of the protocol
            self.malformed = True
            return
        if self.terminal is not None:
            self.malformed = True  # nothing may follow the terminal event
        elif event.get("type") == "text":
            if not self.text_open:
                self.text_open = True
                self.sink.emit(TextDelta(message_id=self.message_id, phase="start"))
            self.sink.emit(TextDelta(message_id=self.message_id, text=event["delta"]))
        elif event.get("type") == "done":
            self.terminal, self.terminal_line = event, line.strip()

    def item(self, item: TranscriptItem) -> None:
        self.transcript.append(item)
        self.sink.emit(item)  # the same items, in the same order, as Response.transcript

    def response(self, code: int, stdout: str, stderr: str, cancelled: bool) -> Response:
        if self.text_open:
            self.sink.emit(TextDelta(message_id=self.message_id, phase="end"))
        for line in stderr.splitlines():
            self.item(TranscriptItem(kind="stderr", text=line))
        done = self.terminal or {}
        output = str(done.get("text", ""))
        if output:
            self.item(TranscriptItem(kind="assistant", text=output))
        ok = code == 0 and self.terminal is not None and not self.malformed
        failure = None
        if not ok and not cancelled:  # a cancel keeps the host's own identity
            why = stderr.strip().splitlines()[-1:] or ["no terminal event"]
            failure = RunFailure(
                code="agent_error", message=f"echo_agent failed (exit {code}): {why[0]}",
                details={"exit_code": code if code >= 0 else None,
                         "signal": -code if code < 0 else None})
        session = str(done.get("session_id", ""))
        usage = done.get("usage")
        return Response(
            output=output,
            raw_streams=RawStreams(
                stdout=stdout, stderr=stderr,
                terminal=TerminalPayload("done", self.terminal_line) if self.terminal else None),
            transcript=tuple(self.transcript),
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            usage=Usage(usage["input"], usage["output"]) if usage else None,
            # Valid only for a clean success whose terminal event named the session.
            checkpoint=Checkpoint(SessionState(resume_id=session), valid=True)
            if ok and session else None,
            failure=failure,
        )


class _Collect:
    """Reads a pipe to its end on a thread of its own (a full pipe would block the CLI)."""

    def __init__(self, pipe: Any) -> None:
        self.data = b""
        self.thread = threading.Thread(target=self._read, args=(pipe,))
        self.thread.start()

    def _read(self, pipe: Any) -> None:
        self.data = pipe.read()

    def text(self) -> str:
        self.thread.join()
        return self.data.decode(errors="replace")


def _stop_on_cancel(proc: subprocess.Popen[bytes], sink: EventSink, grace: float) -> None:
    # Cancel, the run's timeout, an aborted approval and agent.close() all set sink.cancelled.
    while proc.poll() is None:
        if sink.cancelled.wait(0.1):
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
            return


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def main() -> None:
    os.environ["ECHO_AGENT_HOME"] = tempfile.mkdtemp()
    agent = adaptor.Agent(Driver(), workspace=tempfile.mkdtemp(),
                          thread_store=adaptor.memory.Store())
    print("run:", agent.run("hello").text)
    stream = agent.stream("streamed")
    print("deltas:", "".join(e.text for e in stream if isinstance(e, adaptor.TextDelta)).strip())
    thread = agent.thread("issue-1")
    thread.run("first")
    print("thread:", thread.run("second").text)
    try:
        agent.run("please fail")
    except adaptor.AgentFailedError as err:
        print("failed:", err.reason, err.details)
    agent.close()
    # With a stub agent in place of echo_agent: Request.env reaches it, garbage fails typed.
    conformance.run(Driver, stub_driver=lambda path: Driver(Config(command=path))
                    ).raise_for_failures()
    print("conformance: ok")


if __name__ == "__main__":
    main()

"""The ``command`` driver: any executable as an agent.

::

    from adaptor.drivers import command

    agent = adaptor.Agent(command.Driver(command.Config("./review.sh", extra_args=("--strict",))))

Each run starts ``command *extra_args`` in its own process group with the prompt (after the
run's ``instructions`` and a blank line, if any) on stdin followed by EOF.  Whatever the process
prints on stdout **is the answer**: every stdout line is streamed as a ``text.content`` delta of
one text lifecycle, and ``Result.text`` is the whole of stdout with trailing newlines removed
(like a shell's ``$(...)``).  stderr lines become ``stderr`` transcript items.

- **Exit status.**  0 is success; anything else, or death by a signal, fails the run with an
  ``agent_error`` whose ``details`` carry ``exit_code``/``signal`` (and the last stderr line in
  the message).  A cancelled or timed-out run keeps the host's cancellation or deadline identity.
- **What it cannot do is refused, never dropped.**  No sessions (threads are refused by the SDK),
  no approvals, sandbox, web search, browser, MCP or skills (refused or reported by the SDK from
  the descriptor); structured output is prompt-validate only.  A run with
  ``append_system_prompt`` or a ``model`` fails before anything starts with
  ``RunError(reason="unsupported_driver")``: a plain executable has neither.

The environment is this process's plus ``Config.env`` plus the run's own variables; only their
names appear in the ``process.spawn`` event.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from adaptor.driver import (
    Descriptor,
    EventSink,
    Request,
    Response,
    RunFailure,
    StructuredOutputCaps,
)
from adaptor.drivers import _cli, _process
from adaptor.drivers._lines import NullSink, Protocol
from adaptor.drivers._process import Exit, Line, Spec
from adaptor.events import TextDelta
from adaptor.result import RawStreams, TranscriptItem

__all__ = ["TYPE", "Config", "Driver", "replay"]

TYPE: Final = "command"


@dataclass(frozen=True)
class Config(_cli.ProcessConfig):
    """An executable (``command``: a name looked up on ``PATH`` or a path) and its arguments."""


class Driver:
    """Runs ``config.command`` once per run.  Construction snapshots the config and does no I/O."""

    def __init__(self, config: Config | Mapping[str, Any]) -> None:
        self._config: Config = copy.deepcopy(_as_config(config))

    def __repr__(self) -> str:
        return f"command.Driver(command={self._config.command!r})"

    def descriptor(self) -> Descriptor:
        # Every capability off except prompt-validated structured output: the SDK refuses
        # policies, threads and MCP servers from this before anything starts.
        return Descriptor(
            type=TYPE,
            display_name="Command",
            instructions=True,
            workspace=True,
            structured_output=StructuredOutputCaps(prompt_validate=True),
        )

    def validate_config(self, config: object | None = None) -> None:
        """Check ``config`` (``None``: the captured one); raise ``TypeError``/``ValueError``."""
        c = self._config if config is None else _as_config(config)
        _process.check_common(c.command, c.env, c.extra_args, c.cwd, c.grace_period)

    def secret_values(self) -> list[str]:
        """Values no event, result or error of a run may show (SPI, optional)."""
        return _process.secret_values(self._config.env)

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config if request.config is None else _as_config(request.config)
        self.validate_config(config)
        refused = _unsupported(request)
        if refused is not None:
            return refused
        prompt = _cli.prompt_of(request)
        env, names = _process.child_env(config.env, request.env)
        spec = Spec(argv=[config.command, *config.extra_args], env=env, env_names=names,
                    cwd=request.workspace_cwd or config.cwd, stdin=prompt.encode(),
                    grace_period=config.grace_period)
        return _cli.run_child(spec, sink, request, _Parser(sink, request.run_id))


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
) -> Response:
    """The Response a run printing ``stdout``/``stderr`` and exiting ``exit_code`` produces."""
    parser = _Parser(sink or NullSink(), "replay")
    data = [stdout.encode() if isinstance(stdout, str) else stdout,
            stderr.encode() if isinstance(stderr, str) else stderr]
    for stream, blob in zip(("stdout", "stderr"), data, strict=True):
        *lines, tail = blob.split(b"\n")
        for raw in lines:
            parser.feed(Line(stream, raw))  # type: ignore[arg-type]
        if tail:
            parser.feed(Line(stream, tail, partial=True, ending=b""))  # type: ignore[arg-type]
    exit_ = Exit(exit_code=exit_code, signal=None if exit_code is not None else 15)
    return parser.response(exit_, *(b.decode("utf-8", "replace") for b in data))


def _as_config(config: object) -> Config:
    return _process.coerce_config(Config, config, "command")


def _unsupported(request: Request) -> Response | None:
    """A refusal, before anything starts, of request parts an executable cannot honour."""
    what = ("append_system_prompt" if request.append_system_prompt
            else "model" if request.model_override else "")
    if not what:
        return None
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"the command driver cannot honour {what}: a plain executable has no such input",
        details={"kind": f"{what}_unsupported"},
    ))


class _Parser:
    """stdout lines → one text lifecycle; stderr lines → transcript items."""

    def __init__(self, sink: EventSink, run_id: str) -> None:
        self.sink = sink
        self.protocol = Protocol(sink)
        self.message_id = f"{run_id}/stdout"
        self.started = False

    def feed(self, line: Line) -> None:
        if line.stream == "stderr":
            self.protocol.feed_stderr(line.data)
            return
        # Its stdout is the answer: the text events carry its bytes as they are, \r\n included.
        text = (line.data + line.ending).decode("utf-8", "replace")
        if not text:
            return
        if not self.started:
            self.started = True
            self.sink.emit(TextDelta(message_id=self.message_id, phase="start"))
        self.sink.emit(TextDelta(message_id=self.message_id, text=text, phase="content"))

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response:
        if self.started:
            self.sink.emit(TextDelta(message_id=self.message_id, phase="end"))
        output = stdout.rstrip("\n")
        if output:
            self.protocol.item(TranscriptItem(kind="assistant", text=output))
        return Response(
            output=output,
            raw_streams=RawStreams(stdout=stdout, stderr=stderr),
            transcript=tuple(self.protocol.transcript),
            exit_code=exit_.exit_code,
            signal=exit_.signal,
            timed_out=exit_.timed_out,
            failure=self._failure(exit_),
        )

    def _failure(self, exit_: Exit) -> RunFailure | None:
        if exit_.clean or exit_.cancelled or exit_.timed_out:
            return None  # a cancellation or deadline keeps the host's own identity
        why = f": {self.protocol.stderr_reason[:300]}" if self.protocol.stderr_reason else ""
        return RunFailure(code="agent_error",
                          message=f"the command failed ({exit_.describe()}){why}",
                          details={"exit_code": exit_.exit_code, "signal": exit_.signal})

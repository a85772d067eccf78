"""The ``script`` driver: deterministic, offline runs played from a list of steps.

No process is started; each step stands for something an agent CLI would do, and the driver
reports it exactly like a real driver would (events, transcript items, raw streams, response)::

    from adaptor.drivers import script

    driver = script.Driver(script.Config(steps=({"text": "hello"},), session="auto"))

Steps (each a dict with exactly one key), played in order:

=================  ===========================================================================
``text``           assistant text: ``text.start``/``content``/``end`` plus an ``assistant`` item
``thinking``       reasoning: ``thinking.*`` events plus a ``thinking`` item
``tool_call``      ``{"name", "args"?, "result"?, "is_error"?}``: tool call start/end, a tool
                   result, and ``tool_call``/``tool_result`` items
``call_tool``      ``{"name", "args"?}``: calls the host tool ``name`` through the run's tool
                   gateway (``Request.tools_endpoint``) with the official MCP client, like a
                   CLI would, and reports it as ``tool_call`` ``mcp__adaptor__<name>`` with
                   the gateway's answer; without a gateway the result is an error.  Needs the
                   ``mcp`` extra.
``approval``       ``{"kind": "permission"|"plan_review"|"question", "title"?, "choices"?}``:
                   asks through the sink; ``aborted`` stops the script (the SDK owns the
                   verdict), any other answer moves on to the next step
``sleep``          seconds (>= 0); a cancellation interrupts it
``stdout``         one raw line on stdout (``stderr`` likewise)
``fail``           ``{"code"?, "message"?, "details"?}``: a classified failure, exit status 1
``exit``           a process-like exit status (0-255); non-zero stops with ``agent_error``
``output_json``    any JSON value, emitted as assistant text (its compact JSON encoding)
``reject_resume``  a reason: a run that resumes a stored session raises ``ResumeRejectedError``
=================  ===========================================================================

``output`` is the text of the last ``text``/``output_json`` step.  A cancelled or aborted run
stops like a process killed with SIGTERM (``signal=15``, no exit status).

The ``process.spawn`` event lists what a real CLI would have been given, when present: the
skills' runtime names (``skills``), the MCP server keys (``mcp``, the tool gateway's
``adaptor`` included) and the host tool names (``tools``).

Sessions: with ``session="<id>"`` every clean run returns a valid checkpoint for that id; with
``session="auto"`` a fresh session (or a fork) gets a new random id and a continued one keeps the
stored id.  No checkpoint is returned when the descriptor overrides turn ``supports_resume`` off.

Session compatibility: :meth:`Driver.session_config_fingerprint` covers the session setting, the
descriptor overrides, ``cwd`` and ``extra_args`` only.  The steps are left out on purpose so a
test can change what the "agent" does between turns of one thread without the stored session
turning incompatible; ``env`` is left out because it names no session identity here and its
values may be secrets.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import secrets
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast, get_args

import orjson

from adaptor.driver import (
    CancelSignal,
    Checkpoint,
    DecisionChoice,
    DecisionKind,
    DecisionRequest,
    Descriptor,
    EventSink,
    HumanDecisionSupport,
    MCPCaps,
    ModelInfo,
    ProcessCaps,
    QuestionSupport,
    Request,
    Response,
    RunFailure,
    RunPolicyCaps,
    SessionCaps,
    SessionCodec,
    SessionContext,
    SessionState,
    SkillCaps,
    StandardSessionCodec,
    StreamCaps,
    StructuredOutputCaps,
    SystemPromptCaps,
    canonical_fingerprint,
)
from adaptor.drivers import _process
from adaptor.errors import ResumeRejectedError
from adaptor.events import ProcessInfo, TextDelta, Thinking, ToolCall, ToolResult
from adaptor.result import RawStreams, TerminalPayload, TranscriptItem, Usage

__all__ = ["AUTO_SESSION", "DEFAULT_MODEL", "TYPE", "Config", "Driver"]

TYPE: Final = "script"
DEFAULT_MODEL: Final = "script-1"
AUTO_SESSION: Final = "auto"

_FINGERPRINT_DOMAIN: Final = "script/config/v1"
_SKILL_MODES: Final = ("unsupported", "ephemeral", "persistent")


@dataclass(frozen=True)
class Config:
    """The script driver's configuration; ``command`` is accepted for symmetry and unused."""

    steps: tuple[Mapping[str, Any], ...] = ()
    session: str | None = None
    descriptor: Mapping[str, Any] | None = None
    command: str = ""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # values are secrets
    extra_args: tuple[str, ...] = ()
    cwd: str | None = None
    grace_period: float = 2.0

    def __post_init__(self) -> None:
        # Lists are the natural literal in Python and JSON; store the declared tuple type so
        # the snapshot cannot be confused with a caller's list.
        if isinstance(self.steps, list):
            object.__setattr__(self, "steps", tuple(self.steps))
        if isinstance(self.extra_args, list):
            object.__setattr__(self, "extra_args", tuple(self.extra_args))

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Config:
        """Build a config from a request's JSON ``config`` object; unknown keys are refused.

        Only the shape is checked here; :meth:`Driver.validate_config` checks the values.
        """
        if not isinstance(obj, Mapping):
            raise TypeError(f"script config must be an object, not {type(obj).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in obj if key not in known)
        if unknown:
            raise ValueError(f"unknown script config key(s): {', '.join(unknown)}")
        return cls(**obj)


class Driver:
    """The script driver.  Construction snapshots the config and does nothing else."""

    def __init__(self, config: Config | Mapping[str, Any] | None = None) -> None:
        try:
            self._config: Config = copy.deepcopy(
                Config() if config is None else _as_config(config)
            )
        except RecursionError:
            # Said here: the step parser would say which value, but it never gets to see it.
            raise ValueError(
                "script config: a value nests too deeply to copy (JSON holds at most 255 levels)"
            ) from None

    def __repr__(self) -> str:
        return f"script.Driver(steps={len(self._config.steps)}, session={self._config.session!r})"

    # --- SPI: description and validation --------------------------------------------------------

    def descriptor(self) -> Descriptor:
        """A fresh descriptor: the defaults with the config's overrides merged in.

        Raises ``ValueError``/``TypeError`` when the overrides are invalid, like
        :meth:`validate_config`.
        """
        return _build_descriptor(self._config.descriptor)

    def validate_config(self, config: object | None = None) -> None:
        """Check ``config`` (``None``: the captured one); raise ``TypeError``/``ValueError``."""
        _validate(self._config if config is None else _as_config(config))

    def secret_values(self) -> list[str]:
        """Values no event, result or error of a run may show (SPI, optional): ``env``'s,
        as a process driver's, so tests can script an agent that prints them."""
        return _process.secret_values(self._config.env)

    def session_codec(self) -> SessionCodec | None:
        """The session codec, or ``None`` when the descriptor overrides turn resume off."""
        if not self.descriptor().sessions.supports_resume:
            return None
        return StandardSessionCodec(TYPE)

    def session_config_fingerprint(self) -> str:
        """What a stored session must match to be resumed (see the module docstring)."""
        config = self._config
        return canonical_fingerprint(
            _FINGERPRINT_DOMAIN,
            {
                "session": config.session,
                "descriptor": config.descriptor,
                "cwd": config.cwd,
                "extra_args": config.extra_args,
            },
        )

    def close_processes(self, timeout: float | None = None) -> None:
        """Nothing to close; present so a ``process.persistent`` override stays truthful."""

    # --- SPI: running ---------------------------------------------------------------------------

    def run(self, request: Request, sink: EventSink) -> Response:
        # An explicit config from a direct SPI caller wins over the captured one.
        config = self._config if request.config is None else _as_config(request.config)
        steps = _validate(config)
        session = request.session
        if session is not None and session.state is not None:
            for step in steps:
                if isinstance(step, _RejectResume):
                    raise ResumeRejectedError(step.reason)

        # A driver that declares no resume support must not hand out checkpoints either.
        resumable = _build_descriptor(config.descriptor).sessions.supports_resume
        resume_id = _resume_id(config.session, session) if resumable else None
        cwd = config.cwd or request.workspace_cwd
        problem = _process.workspace_problem(cwd) if cwd else None
        if cwd and problem:
            # As a CLI driver's child would fail to start there: a dry run catches it too.
            return _process.cannot_start(_process.CannotStart.workspace("script", cwd, problem))
        player = _Player(sink, request)
        spawn: dict[str, Any] = {
            "argv": ["script", *config.extra_args],
            "env": sorted({*config.env, *request.env}),
        }
        endpoint = request.tools_endpoint
        servers = [s.key for s in request.mcp] + ([endpoint.server.key] if endpoint else [])
        for name, values in (
            ("skills", [s.runtime_name for s in request.skills]),
            ("mcp", sorted(servers)),
            ("tools", list(endpoint.tools) if endpoint else []),
        ):
            if values:
                spawn[name] = values
        sink.emit(ProcessInfo(kind="spawn", data=spawn))
        player.play(steps)

        clean = player.exit_code == 0 and player.signal is None and player.failure is None
        usage = Usage(input_tokens=len(request.prompt.split()), output_tokens=player.words)
        terminal = None
        checkpoint = None
        if clean:
            terminal = TerminalPayload(
                event="script.finished",
                json=orjson.dumps(
                    {
                        "type": "script.finished",
                        "session_id": resume_id,
                        "usage": usage.to_json(),
                    }
                ).decode(),
            )
            if resume_id is not None:
                state = SessionState(
                    resume_id=resume_id,
                    display_id=resume_id,
                    data={"cwd": request.workspace_cwd or ""},
                )
                checkpoint = Checkpoint(state, valid=True)
        return Response(
            output=player.output,
            raw_streams=RawStreams(
                stdout="".join(player.stdout),
                stderr="".join(player.stderr),
                terminal=terminal,
            ),
            transcript=tuple(player.transcript),
            exit_code=player.exit_code,
            signal=player.signal,
            usage=usage,
            checkpoint=checkpoint,
            provider=TYPE,
            model=request.model_override or DEFAULT_MODEL,
            failure=player.failure,
        )


def _as_config(config: object) -> Config:
    return _process.coerce_config(Config, config, "script")


# --- descriptor ---------------------------------------------------------------------------------


def _default_descriptor() -> Descriptor:
    def every_mode() -> HumanDecisionSupport:
        return HumanDecisionSupport(ask=True, auto_approve=True, auto_reject=True, retry=True)

    return Descriptor(
        type=TYPE,
        display_name="Script (deterministic, offline)",
        models=[ModelInfo(id=DEFAULT_MODEL, label="Scripted model")],
        sessions=SessionCaps(supports_resume=True),
        skills=SkillCaps(supported=True, mode="ephemeral"),
        mcp=MCPCaps(supported=True, stdio=True, http=True, sse=True),
        instructions=True,
        workspace=True,
        process=ProcessCaps(persistent=False),
        run_policy_caps=RunPolicyCaps(
            isolation=True,
            web_search=True,
            browser=True,
            permission=every_mode(),
            plan_review=every_mode(),
            question=QuestionSupport(ask=True, auto_reject=True, retry=True),
        ),
        structured_output=StructuredOutputCaps(
            native=True, prompt_validate=True, works_with_streaming=True
        ),
        system_prompt=SystemPromptCaps(append=True),
        stream=StreamCaps(native=True, token_level=True, reasoning=True, tool_call_args=True),
    )


def _build_descriptor(overrides: Mapping[str, Any] | None) -> Descriptor:
    base = _default_descriptor()
    if overrides is None:
        return base
    if not isinstance(overrides, Mapping):
        raise TypeError("descriptor: expected an object of overrides")
    rest = dict(overrides)
    # ``Descriptor.merged`` would assign a list verbatim; models need converting to ModelInfo.
    models = _parse_models(rest.pop("models")) if "models" in rest else None
    descriptor = base.merged(rest)
    if models is not None:
        descriptor.models = models
    _string(descriptor.type, "descriptor.type", empty=False)
    _string(descriptor.display_name, "descriptor.display_name", empty=False)
    if descriptor.skills.mode not in _SKILL_MODES:
        raise ValueError(f"descriptor.skills.mode: expected one of {', '.join(_SKILL_MODES)}")
    return descriptor


def _parse_models(models: Any) -> list[ModelInfo]:
    if not isinstance(models, list | tuple):
        raise TypeError("descriptor.models: expected a list")
    parsed = []
    for index, model in enumerate(models):
        path = f"descriptor.models[{index}]"
        if isinstance(model, ModelInfo):
            parsed.append(ModelInfo(id=model.id, label=model.label))
        elif isinstance(model, str) and model:
            parsed.append(ModelInfo(id=model))
        elif isinstance(model, Mapping):
            _only_keys(model, {"id", "label"}, path)
            parsed.append(
                ModelInfo(
                    id=_string(model.get("id"), f"{path}.id", empty=False),
                    label=_string(model.get("label", ""), f"{path}.label"),
                )
            )
        else:
            raise TypeError(f"{path}: expected a model id or {{id, label}}")
    return parsed


# --- steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Thinking:
    text: str


@dataclass(frozen=True)
class _ToolCall:
    name: str
    args: dict[str, Any]
    result: Any
    is_error: bool


@dataclass(frozen=True)
class _CallTool:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class _Approval:
    kind: DecisionKind
    title: str
    choices: tuple[DecisionChoice, ...]


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Chunk:
    stream: Literal["stdout", "stderr"]
    line: str


@dataclass(frozen=True)
class _Fail:
    failure: RunFailure


@dataclass(frozen=True)
class _Exit:
    status: int


@dataclass(frozen=True)
class _RejectResume:
    reason: str


_Step = (
    _Text | _Thinking | _ToolCall | _CallTool | _Approval | _Sleep | _Chunk | _Fail | _Exit
    | _RejectResume
)


def _validate(config: Config) -> list[_Step]:
    """Check every field of ``config`` and return its steps in parsed form."""
    _string(config.command, "command")
    if not isinstance(config.env, Mapping):
        raise TypeError("env: expected an object of strings")
    for name, value in config.env.items():
        # Names are safe to show (they are emitted anyway); values may be secrets.
        if not isinstance(name, str) or not name:
            raise TypeError("env: variable names must be non-empty strings")
        if not isinstance(value, str):
            raise TypeError(f"env: the value of {name} must be a string")
    if not isinstance(config.extra_args, tuple) or not all(
        isinstance(arg, str) for arg in config.extra_args
    ):
        raise TypeError("extra_args: expected a list of strings")
    if config.cwd is not None:
        _string(config.cwd, "cwd")
    _process.check_grace_period(config.grace_period)
    if config.session is not None:
        _string(config.session, "session", empty=False)
    _build_descriptor(config.descriptor)
    if not isinstance(config.steps, tuple):
        raise TypeError("steps: expected a list of steps")
    return [_parse_step(step, f"steps[{index}]") for index, step in enumerate(config.steps)]


def _parse_step(step: object, path: str) -> _Step:
    if not isinstance(step, Mapping):
        raise TypeError(f"{path}: expected an object with one step key")
    if len(step) != 1:
        raise ValueError(f"{path}: expected exactly one of {', '.join(_PARSERS)}")
    ((key, value),) = step.items()
    parser = _PARSERS.get(key) if isinstance(key, str) else None
    if parser is None:
        raise ValueError(
            f"{path}: unknown step {str(key)!r}; expected one of {', '.join(_PARSERS)}"
        )
    return parser(value, f"{path}.{key}")


def _parse_tool_call(value: Any, path: str) -> _ToolCall:
    _only_keys(value, {"name", "args", "result", "is_error"}, path)
    args = value.get("args", {})
    if not isinstance(args, Mapping):
        raise TypeError(f"{path}.args: expected an object")
    is_error = value.get("is_error", False)
    if not isinstance(is_error, bool):
        raise TypeError(f"{path}.is_error: expected true or false")
    return _ToolCall(
        name=_string(value.get("name"), f"{path}.name", empty=False),
        args=copy.deepcopy(dict(args)),
        result=copy.deepcopy(value.get("result")),
        is_error=is_error,
    )


def _parse_call_tool(value: Any, path: str) -> _CallTool:
    _only_keys(value, {"name", "args"}, path)
    args = value.get("args", {})
    if not isinstance(args, Mapping):
        raise TypeError(f"{path}.args: expected an object")
    return _CallTool(
        name=_string(value.get("name"), f"{path}.name", empty=False),
        args=copy.deepcopy(dict(args)),
    )


def _parse_approval(value: Any, path: str) -> _Approval:
    _only_keys(value, {"kind", "title", "choices"}, path)
    kinds = get_args(DecisionKind)
    kind = value.get("kind")
    if kind not in kinds:
        raise ValueError(f"{path}.kind: expected one of {', '.join(kinds)}")
    raw_choices = value.get("choices", ())
    if not isinstance(raw_choices, list | tuple):
        raise TypeError(f"{path}.choices: expected a list")
    choices = []
    for index, choice in enumerate(raw_choices):
        where = f"{path}.choices[{index}]"
        if isinstance(choice, str) and choice:
            choices.append(DecisionChoice(key=choice, label=choice))
        elif isinstance(choice, Mapping):
            _only_keys(choice, {"key", "label", "description"}, where)
            choices.append(
                DecisionChoice(
                    key=_string(choice.get("key"), f"{where}.key", empty=False),
                    label=_string(choice.get("label", ""), f"{where}.label"),
                    description=_string(choice.get("description", ""), f"{where}.description"),
                )
            )
        else:
            raise TypeError(f"{where}: expected a non-empty string or {{key, label, description}}")
    return _Approval(
        kind=cast(DecisionKind, kind),
        title=_string(value.get("title", ""), f"{path}.title"),
        choices=tuple(choices),
    )


def _parse_sleep(value: Any, path: str) -> _Sleep:
    if not _is_number(value) or not 0 <= value < math.inf:
        raise ValueError(f"{path}: expected a finite number of seconds >= 0")
    return _Sleep(float(value))


def _parse_fail(value: Any, path: str) -> _Fail:
    _only_keys(value, {"code", "message", "details"}, path)
    details = value.get("details", {})
    if not isinstance(details, Mapping):
        raise TypeError(f"{path}.details: expected an object")
    return _Fail(
        RunFailure(
            # An empty code is what a driver that could not classify a failure reports.
            code=_string(value.get("code", "agent_error"), f"{path}.code"),
            message=_string(value.get("message", ""), f"{path}.message"),
            details=copy.deepcopy(dict(details)),
        )
    )


def _parse_exit(value: Any, path: str) -> _Exit:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise ValueError(f"{path}: expected an exit status from 0 to 255")
    return _Exit(value)


def _parse_output_json(value: Any, path: str) -> _Text:
    try:
        return _Text(orjson.dumps(value).decode())
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"{path}: not encodable as JSON ({exc})") from None


_PARSERS: Final[dict[str, Callable[[Any, str], _Step]]] = {
    "text": lambda value, path: _Text(_string(value, path, empty=False)),
    "thinking": lambda value, path: _Thinking(_string(value, path, empty=False)),
    "tool_call": _parse_tool_call,
    "call_tool": _parse_call_tool,
    "approval": _parse_approval,
    "sleep": _parse_sleep,
    "stdout": lambda value, path: _Chunk("stdout", _string(value, path)),
    "stderr": lambda value, path: _Chunk("stderr", _string(value, path)),
    "fail": _parse_fail,
    "exit": _parse_exit,
    "output_json": _parse_output_json,
    "reject_resume": lambda value, path: _RejectResume(_string(value, path)),
}


def _string(value: Any, path: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{path}: expected a {'' if empty else 'non-empty '}string")
    if not empty and not value:
        raise ValueError(f"{path}: expected a non-empty string")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _only_keys(value: Any, allowed: set[str], path: str) -> None:
    if not isinstance(value, Mapping):
        raise TypeError(f"{path}: expected an object")
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}")


# --- running ------------------------------------------------------------------------------------


def _resume_id(configured: str | None, session: SessionContext | None) -> str | None:
    if configured != AUTO_SESSION:
        return configured
    if (
        session is not None
        and session.state is not None
        and session.mode in ("continue_or_start", "continue_only")
    ):
        return session.state.resume_id
    # A fork must not share the parent's id: both would then append to one provider session.
    return "script-" + secrets.token_hex(8)


class _Player:
    """Plays parsed steps into one sink and remembers what a Response needs."""

    def __init__(self, sink: EventSink, request: Request) -> None:
        self.sink = sink
        self.request = request
        self.transcript: list[TranscriptItem] = []
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.output = ""
        self.words = 0
        self.exit_code: int | None = 0
        self.signal: int | None = None
        self.failure: RunFailure | None = None
        self._messages = 0
        self._calls = 0

    def play(self, steps: list[_Step]) -> None:
        for step in steps:
            if self.sink.cancelled.is_set():
                self._stopped()
                return
            match step:
                case _Text(text=text):
                    self._text(text)
                case _Thinking(text=text):
                    self._thinking(text)
                case _ToolCall():
                    self._tool_call(step)
                case _CallTool():
                    self._call_tool(step)
                    if self.sink.cancelled.is_set():
                        self._stopped()
                        return
                case _Approval():
                    if not self._approval(step):
                        self._stopped()
                        return
                case _Sleep(seconds=seconds):
                    # Past TIMEOUT_MAX (~292 years) a lock's wait raises OverflowError.
                    if self.sink.cancelled.wait(None if seconds >= threading.TIMEOUT_MAX else seconds):
                        self._stopped()
                        return
                case _Chunk(stream=stream, line=line):
                    chunk = line + "\n"
                    (self.stdout if stream == "stdout" else self.stderr).append(chunk)
                    self.sink.emit(ProcessInfo(kind=stream, text=chunk))
                case _Fail(failure=failure):
                    self.failure = failure
                    self.exit_code = 1
                    return
                case _Exit(status=status):
                    self.exit_code = status
                    if status != 0:
                        self.failure = RunFailure(
                            code="agent_error",
                            message=f"script exited with status {status}",
                            details={"exit_code": status},
                        )
                        return
                case _RejectResume():
                    pass  # only refuses resumed sessions, which run() checked before starting

    def _stopped(self) -> None:
        # Like an agent process terminated by the SDK's cancellation.
        self.exit_code = None
        self.signal = signal.SIGTERM.value

    def _item(self, item: TranscriptItem) -> None:
        self.transcript.append(item)
        self.sink.emit(item)

    def _next_message_id(self) -> str:
        self._messages += 1
        return f"msg_{self._messages}"

    def _text(self, text: str) -> None:
        message_id = self._next_message_id()
        self.sink.emit(TextDelta(message_id=message_id, phase="start"))
        self.sink.emit(TextDelta(message_id=message_id, text=text, phase="content"))
        self.sink.emit(TextDelta(message_id=message_id, phase="end"))
        self._item(TranscriptItem(kind="assistant", text=text))
        self.output = text
        self.words += len(text.split())

    def _thinking(self, text: str) -> None:
        message_id = self._next_message_id()
        self.sink.emit(Thinking(message_id=message_id, phase="start"))
        self.sink.emit(Thinking(message_id=message_id, text=text, phase="content"))
        self.sink.emit(Thinking(message_id=message_id, phase="end"))
        self._item(TranscriptItem(kind="thinking", text=text))

    def _tool_call(self, step: _ToolCall) -> None:
        call_id = self._tool_started(step.name, step.args)
        self._tool_ended(call_id, step.name, copy.deepcopy(step.result), step.is_error)

    def _call_tool(self, step: _CallTool) -> None:
        endpoint = self.request.tools_endpoint
        name = f"mcp__{endpoint.server.key if endpoint else 'adaptor'}__{step.name}"
        call_id = self._tool_started(name, step.args)
        if endpoint is None:
            self._tool_ended(call_id, name, "no tool gateway in this run", True)
            return
        token = self.request.env.get(endpoint.server.bearer_token_env, "")
        text, is_error = _call_gateway(
            endpoint.server.url, token, step.name, step.args, self.sink.cancelled
        )
        self._tool_ended(call_id, name, text, is_error)

    def _tool_started(self, name: str, args: Mapping[str, Any]) -> str:
        self._calls += 1
        call_id = f"call_{self._calls}"
        # Every consumer gets its own copy: events are shared with the host's handlers.
        self.sink.emit(ToolCall(id=call_id, name=name, args=copy.deepcopy(dict(args)),
                                phase="start"))
        self._item(
            TranscriptItem(
                kind="tool_call",
                tool_use_id=call_id,
                tool_name=name,
                input=copy.deepcopy(dict(args)),
            )
        )
        return call_id

    def _tool_ended(self, call_id: str, name: str, result: Any, is_error: bool) -> None:
        self.sink.emit(ToolCall(id=call_id, name=name, result=result, phase="end"))
        self.sink.emit(ToolResult(id=call_id, result=copy.deepcopy(result), is_error=is_error))
        self._item(
            TranscriptItem(
                kind="tool_result",
                tool_use_id=call_id,
                tool_name=name,
                text=_result_text(result),
                is_error=is_error,
            )
        )

    def _approval(self, step: _Approval) -> bool:
        """Ask; ``False`` when the SDK aborted the run (its verdict is already decided)."""
        response = self.sink.request_decision(
            DecisionRequest(kind=step.kind, title=step.title, source=TYPE, choices=step.choices)
        )
        metadata: dict[str, Any] = {"kind": step.kind, "result": response.result}
        if response.choice:
            metadata["choice"] = response.choice
        self._item(
            TranscriptItem(
                kind="system",
                subtype="decision",
                text=f"{step.kind}: {response.result}",
                metadata=metadata,
            )
        )
        return response.result != "aborted"


_CONNECT_TIMEOUT = 30.0  # and for each write; reading the answer waits on the tool


def _call_gateway(
    url: str, token: str, name: str, args: Mapping[str, Any], cancelled: CancelSignal
) -> tuple[str, bool]:
    """One ``tools/call`` on the gateway: (the text the model would see, is_error).  The call
    waits for the tool as long as the run lasts (httpx's default would give up after 5 s); a
    cancellation abandons it; a transport failure is reported as an error result, as a CLI
    would report it to its model."""
    import anyio
    import httpx2  # the MCP SDK's HTTP client
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    outcome: list[tuple[str, bool]] = []

    async def call() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        timeout = httpx2.Timeout(_CONNECT_TIMEOUT, read=None)
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    result = await session.call_tool(name, dict(args))
        text = "\n".join(getattr(part, "text", "") for part in result.content)
        outcome.append((text, bool(result.is_error)))

    async def main() -> None:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while not cancelled.is_set():
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await call()
            finally:
                group.cancel_scope.cancel()

    try:
        anyio.run(main)
    except Exception as exc:  # reported to the "model" like a CLI would; the run goes on
        while isinstance(exc, ExceptionGroup) and exc.exceptions:  # anyio's task groups
            exc = exc.exceptions[0]
        return f"tool call failed: {type(exc).__name__}", True
    return outcome[0] if outcome else ("tool call cancelled", True)


def _result_text(result: Any) -> str:
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    return orjson.dumps(result, option=orjson.OPT_SORT_KEYS).decode()

"""The ``cursor`` driver: Cursor Agent CLI (``cursor-agent``, also installed as ``agent``).

::

    from adaptor.drivers import cursor

    agent = adaptor.Agent(cursor.Driver(cursor.Config(model="gpt-5")))

**Format-verified, not binary-verified**: the CLI cannot be installed from the package
registries this project builds with, so this driver follows the stream-json format documented
in shared/reference/upstream-drivers.md §2.3 and is tested against fake executables that print
it.  The exact argv is built in one place, :func:`_argv`.

Each run is one ``cursor-agent -p --output-format stream-json --workspace DIR ...`` process with
the prompt on stdin followed by EOF.  The parser is strict, because a format this driver has
not seen a real binary print must fail loudly rather than half-work:

- every JSON line must carry ``session_id``, and it must never change;
- ``assistant`` frames are text *deltas*: ``Result.text`` is their plain concatenation, or the
  terminal ``result`` string when there were none;
- ``tool_call`` (``started``/``completed``) nests exactly one variant key (``readToolCall``,
  ``shellToolCall``, ``mcpToolCall``, ...) holding ``args`` and, once completed, ``result`` with
  ``success`` | ``failure`` | ``error``; the tool is reported under the variant's name without
  the ``ToolCall`` suffix;
- the only terminal is ``result``/``success`` with a boolean ``is_error``, a string ``result``
  and a non-empty ``session_id``; ``is_error: true`` fails the run;
- anything else (``thinking``, other ``result`` subtypes) becomes a ``system`` transcript item.

Any violation marks the stream malformed: no checkpoint, and an ``agent_error``.

- **Approvals.**  The CLI never asks in print mode.  Permission ``auto_approve`` adds ``--force``
  (commands run unless explicitly denied); plan review has nothing to stop at in ``-p`` mode, so
  ``auto_approve`` is all it offers.  ``ask``/``auto_reject`` and questions are refused by the SDK.
- **Sessions.**  ``--resume ID``; the checkpoint holds the terminal's ``session_id``.  Forks are
  refused (the CLI has no fork), as is resuming from another working directory.  A refusal of the
  stored id ("session not found"-class messages) raises ``ResumeRejectedError``.
- **Not supported** (refused, never dropped): ``append_system_prompt``, native structured output
  (prompt-validate only), sandbox / web-search / browser policies, MCP servers and skills from
  the SDK.

Session compatibility covers ``cwd``, ``extra_args``, ``model``, ``mode`` and the *names* of
``env``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from adaptor import _nesting
from adaptor.driver import (
    Descriptor,
    EventSink,
    HumanDecisionSupport,
    Request,
    Response,
    RunFailure,
    RunPolicyCaps,
    SessionCaps,
    StreamCaps,
    StructuredOutputCaps,
)
from adaptor.drivers import _cli, _process
from adaptor.drivers._lines import (
    NullSink,
    Protocol,
    as_dict,
    as_list,
    as_str,
    died_as,
    provider_failure,
)
from adaptor.drivers._process import Exit, Line, Spec
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, ToolCall, ToolResult
from adaptor.result import TranscriptItem

__all__ = ["MODES", "PROVIDER", "TYPE", "VERIFICATION", "Config", "Driver", "replay"]

TYPE: Final = "cursor"
PROVIDER: Final = "cursor"
VERIFICATION: Final = "format-verified, not binary-verified (upstream-drivers.md §2.3)"
MODES: Final = ("agent", "ask")

_OWNED_FLAGS: Final = frozenset({
    "-p", "--print", "--output-format", "--stream-partial-output", "--workspace", "--resume",
    "-m", "--model", "--mode", "-f", "--force", "--yolo",
})
_RESUME_REJECTED = re.compile(
    r"(session|chat|conversation)\b.{0,60}\bnot found|no (such )?(session|chat|conversation)|"
    r"invalid (session|chat)|unknown (session|chat)",
    re.IGNORECASE,
)
# The CLI's vocabulary for failures it reports on stderr or in an error result.
_FAILURES: Final = _cli.FailureShapes(
    auth=re.compile(r"unauthori[sz]ed|forbidden|authentication required|"
                    r"not (logged in|authenticated)|please log ?in|\brun\W+\S*\s*login\b|"
                    r"invalid api key|CURSOR_API_KEY",
                    re.IGNORECASE),
    rate_limit=re.compile(r"too many requests|rate limit|usage limit", re.IGNORECASE),
    unavailable=re.compile(r"overloaded|unavailable|internal server error|"
                           r"connection (refused|failed|reset)|network error|ECONNREFUSED|"
                           r"ETIMEDOUT|fetch failed", re.IGNORECASE),
)


@dataclass(frozen=True)
class Config(_cli.CliConfig):
    """Cursor Agent's configuration: ``model`` (``--model``; a run's ``model=`` wins) and
    ``mode`` (``--mode``, one of :data:`MODES`; empty: the CLI's default agent mode)."""

    command: str = "cursor-agent"
    mode: str = ""


class Driver(_cli.CliDriver[Config]):
    """The Cursor Agent driver.  Construction snapshots the config and does no I/O."""

    _type = TYPE
    _config_type = Config
    _fingerprint_domain = "cursor/config/v1"
    _fingerprint_fields = ("cwd", "extra_args", "model", "mode")
    # The key cursor-agent's own "not authenticated" message tells users to set.
    _credentials = ("CURSOR_API_KEY",)

    def descriptor(self) -> Descriptor:
        return Descriptor(
            type=TYPE,
            display_name="Cursor Agent",
            sessions=SessionCaps(supports_resume=True),
            instructions=True,
            workspace=True,
            run_policy_caps=RunPolicyCaps(
                permission=HumanDecisionSupport(auto_approve=True),
                plan_review=HumanDecisionSupport(auto_approve=True),
            ),
            structured_output=StructuredOutputCaps(prompt_validate=True),
            stream=StreamCaps(native=True),
        )

    def _check(self, config: Config) -> None:
        _cli.check_config(config)
        _cli.check_choice("mode", config.mode, MODES)
        _cli.check_owned_flags(config.extra_args, _OWNED_FLAGS)

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config_for(request)
        if request.append_system_prompt:
            return _cli.no_append("cursor-agent")
        plan = _plan(config, request)
        env, names = _process.child_env(config.env, request.env)
        spec = Spec(argv=_argv(config, plan), env=env, env_names=names, cwd=plan.cwd,
                    stdin=plan.prompt.encode(), grace_period=config.grace_period)
        return _cli.run_child(spec, sink, request, _Parser(sink, plan))


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
    request: Request | None = None,
) -> Response:
    """Parse captured ``cursor-agent -p --output-format stream-json`` output as if a run had
    produced it; raises ``ResumeRejectedError`` like ``run`` for a refused resume."""
    plan = _plan(Config(), request or Request(run_id="replay", prompt=""))
    return _cli.replay(_Parser(sink or NullSink(), plan), stdout, stderr, exit_code)


# --- plan and argv ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    prompt: str
    model: str
    cwd: str
    resume_id: str | None
    force: bool


def _plan(config: Config, request: Request) -> _Plan:
    # --workspace and the spawn directory are the same absolute path: the CLI keys its chats
    # by workspace, and a resumed chat must find the same one.
    _, cwd = _cli.cwds(config, request)
    resume_id, _ = _cli.resume_target(request, cwd, no_fork="cursor-agent cannot fork a chat")
    approvals = None if request.policy is None else request.policy.approvals
    return _Plan(
        prompt=_cli.prompt_of(request),
        model=request.model_override or config.model,
        cwd=cwd,
        resume_id=resume_id,
        force=approvals is not None and approvals.permission == "auto_approve",
    )


def _argv(config: Config, plan: _Plan) -> list[str]:
    """The command line, per the Cursor Agent CLI format in shared/reference/upstream-drivers.md
    §2.3 (no binary was available to check it against): keep every flag decision here."""
    argv = [config.command, "-p", "--output-format", "stream-json", "--workspace", plan.cwd]
    if plan.resume_id is not None:
        argv += ["--resume", plan.resume_id]
    if plan.model:
        argv += ["--model", plan.model]
    if config.mode:
        argv += ["--mode", config.mode]
    if plan.force:
        argv.append("--force")
    return argv + list(config.extra_args)


# --- parsing ------------------------------------------------------------------------------------

_TOOL_RESULT_BRANCHES: Final = ("success", "failure", "error")


class _Parser:
    """Cursor stream-json → events, transcript items and, at the end, a Response."""

    def __init__(self, sink: EventSink, plan: _Plan) -> None:
        self.sink = sink
        self.plan = plan
        self.protocol = Protocol(sink)
        self.session_id = ""
        self.model = plan.model
        self.text: list[str] = []  # every assistant delta, in order
        self.segment: list[str] = []
        self.text_id = ""
        self.tools: dict[str, str] = {}  # call id -> tool name
        self.open_tools: set[str] = set()
        self.result: dict[str, Any] | None = None
        self.other_result = ""
        self.resume_problem = ""

    def _item(self, **fields: Any) -> None:
        self.protocol.item(TranscriptItem(**fields))

    def feed(self, line: Line) -> None:
        if line.stream == "stderr":
            self.protocol.feed_stderr(line.data)
            self._check_resume(line.text)
            return
        decoded = self.protocol.feed_stdout(line.data)
        if decoded is None or decoded.event is None:
            return
        event = decoded.event
        kind = as_str(event.get("type"))
        if not self._same_session(event, kind):
            return
        handler = self._HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        else:
            self._other(event)
        if self.result is event:
            self.protocol.set_terminal(event, decoded.text)

    def _same_session(self, event: Mapping[str, Any], kind: str) -> bool:
        session_id = event.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            self.protocol.mark_malformed(f"{kind or 'event'!r} line without a session_id")
            return False
        if self.session_id and session_id != self.session_id:
            self.protocol.mark_malformed(f"session_id changed in a {kind or 'event'!r} line")
            return False
        self.session_id = session_id
        return True

    def _check_resume(self, text: str) -> None:
        if self.plan.resume_id and not self.resume_problem and _RESUME_REJECTED.search(text):
            self.resume_problem = text.strip()

    # -- event handlers --

    def _system(self, event: dict[str, Any]) -> None:
        if event.get("subtype") != "init":
            self._other(event)
            return
        self.model = as_str(event.get("model")) or self.model
        self._item(kind="init", session_id=self.session_id, model=self.model,
                   metadata={k: as_str(event.get(k)) for k in ("cwd", "apiKeySource",
                                                                "permissionMode")})

    def _user(self, event: dict[str, Any]) -> None:
        text = _text_of(as_dict(event.get("message")).get("content"))
        if text:
            self._item(kind="user", text=text)

    def _assistant(self, event: dict[str, Any]) -> None:
        text = _text_of(as_dict(event.get("message")).get("content"))
        if not text:
            return
        if not self.text_id:
            self.text_id = self.protocol.fresh_id(f"{self.session_id}/text")
            self.sink.emit(TextDelta(message_id=self.text_id, phase="start"))
        self.sink.emit(TextDelta(message_id=self.text_id, text=text, phase="content"))
        self.segment.append(text)
        self.text.append(text)

    def _close_text(self) -> None:
        if not self.text_id:
            return
        self.sink.emit(TextDelta(message_id=self.text_id, phase="end"))
        self._item(kind="assistant", text="".join(self.segment), model=self.model)
        self.text_id, self.segment = "", []

    def _tool_call(self, event: dict[str, Any]) -> None:
        self._close_text()
        subtype = as_str(event.get("subtype"))
        ident = as_str(event.get("call_id"))
        call = as_dict(event.get("tool_call"))
        if subtype not in ("started", "completed") or not ident or len(call) != 1:
            self.protocol.mark_malformed(
                f"tool_call {subtype or '?'} needs a call_id and exactly one variant key")
            return
        [(variant, raw)] = call.items()
        body = as_dict(raw)
        name = self.tools.get(ident) or variant.removesuffix("ToolCall") or variant
        if ident not in self.tools:
            args = body.get("args")
            args = _nesting.copy(args) if isinstance(args, dict) else None
            self.tools[ident] = name
            self.open_tools.add(ident)
            self.sink.emit(ToolCall(id=ident, name=name, args=args, phase="start"))
            self._item(kind="tool_call", tool_use_id=ident, tool_name=name, input=args)
        if subtype != "completed":
            return
        outcome = as_dict(body.get("result"))
        branches = [b for b in _TOOL_RESULT_BRANCHES if b in outcome]
        if len(branches) != 1:
            self.protocol.mark_malformed(f"tool_call {ident!r} completed without one result")
            return
        branch = outcome[branches[0]]
        content = as_dict(branch).get("content")
        text = content if isinstance(content, str) else _nesting.dumps(branch).decode()
        is_error = branches[0] != "success" or as_dict(branch).get("isError") is True
        if ident in self.open_tools:
            self.open_tools.discard(ident)
            self.sink.emit(ToolCall(id=ident, name=name, result=text, phase="end"))
            self.sink.emit(ToolResult(id=ident, result=text, is_error=is_error))
        self._item(kind="tool_result", tool_use_id=ident, tool_name=name, text=text,
                   is_error=is_error)

    def _result(self, event: dict[str, Any]) -> None:
        if event.get("subtype") != "success":
            self._other(event)  # not a terminal, but the likeliest explanation of what follows
            self.other_result = as_str(event.get("result")) or self.other_result
            return
        self._close_text()
        if not isinstance(event.get("is_error"), bool) or not isinstance(event.get("result"), str):
            self.protocol.mark_malformed("terminal result needs a boolean is_error and a string"
                                         " result")
        self.result = event
        if event.get("is_error") is True:
            self._check_resume(as_str(event.get("result")))
        self._item(kind="result", subtype="success", is_error=event.get("is_error") is True,
                   session_id=self.session_id, text=as_str(event.get("result")),
                   metadata={k: event[k] for k in ("duration_ms", "request_id") if k in event})

    def _other(self, event: dict[str, Any]) -> None:
        parts = (as_str(event.get("type")), as_str(event.get("subtype")))
        subtype = "/".join(part for part in parts if part)
        self._item(kind="system", subtype=subtype or "unknown")

    _HANDLERS: Final[Mapping[str, Callable[[_Parser, dict[str, Any]], None]]] = {
        "system": _system,
        "user": _user,
        "assistant": _assistant,
        "tool_call": _tool_call,
        "result": _result,
    }

    # -- the Response --

    @property
    def _error_result(self) -> bool:
        return self.result is not None and self.result.get("is_error") is True

    @property
    def succeeded(self) -> bool:
        return (self.result is not None and self.result.get("is_error") is False
                and not self.protocol.malformed)

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response:
        self._close_text()
        for ident in sorted(self.open_tools):  # started, never completed
            self.sink.emit(ToolCall(id=ident, name=self.tools[ident], phase="end"))
        self.open_tools = set()
        if self.resume_problem and not self.succeeded:
            raise ResumeRejectedError(self.resume_problem)
        failure = self._failure(exit_)
        checkpoint = None
        if failure is None and exit_.clean and self.succeeded:
            checkpoint = _cli.checkpoint(self.session_id, self.plan.cwd)
        # The terminal's text stands in for deltas only on success: an error terminal's text
        # is the failure's message, not an answer.
        output = "".join(self.text) or (as_str((self.result or {}).get("result"))
                                        if self.result is not None and not self._error_result
                                        else "")
        metadata: dict[str, str] = {}
        if self.session_id:
            metadata["session_id"] = self.session_id
        if self.protocol.malformed:
            metadata["protocol"] = "malformed"
        return _cli.response(exit_, self.protocol, stdout, stderr,
                             terminal_event=None if self.result is None else "result",
                             output=output, checkpoint=checkpoint, metadata=metadata,
                             provider=PROVIDER, model=self.model, failure=failure)

    def _failure(self, exit_: Exit) -> RunFailure | None:
        result = self.result
        reported = None
        if result is not None and result.get("is_error") is True:
            text = as_str(result.get("result"))
            message = "cursor terminal result reported an error" + (f": {text}" if text else "")
            reported = _classify(message, exit_code=exit_.exit_code)
        return _cli.run_failure("cursor-agent", exit_, self.protocol, reported=reported,
                                terminal=result is not None, died=self._died)

    def _died(self, died: RunFailure) -> RunFailure:
        if self.other_result:
            died = RunFailure(code=died.code, message=f"{died.message} ({self.other_result})",
                              details=died.details)
        return died_as(died, _FAILURES.kind(died.message),
                       provider_status=_cli.quoted_status(died.message))


def _classify(message: str, **details: Any) -> RunFailure:
    return provider_failure(message, _FAILURES.kind(message),
                            provider_status=_cli.quoted_status(message), **details)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(as_str(as_dict(block).get("text")) for block in as_list(content)
                   if as_dict(block).get("type") == "text")

"""The ``codebuddy`` driver: CodeBuddy Code (``codebuddy``), a Claude-Code-compatible CLI.

::

    from adaptor.drivers import codebuddy

    agent = adaptor.Agent(codebuddy.Driver(codebuddy.Config(model="glm-5.2-ioa")))

**Format-verified, not binary-verified**: the CLI cannot be installed from the package
registries this project builds with, so this driver follows the formats documented in
shared/reference/upstream-drivers.md §2.4 and is tested against fake executables that speak
them.  The exact argv is built in one place, :func:`_argv`.

CodeBuddy prints Claude Code's stream-json envelope (``system``/``init``, ``stream_event``,
``assistant``, ``user``, ``result``, ``control_request``), so a run looks like a claude run with
two transports:

- **Headless** (no approval needs an answer): ``--print --output-format stream-json --verbose
  [--include-partial-messages]`` with **the prompt as the last argv element**, after ``--``
  (the spawn event shows a placeholder).  ``--permission-mode`` is ``Config.permission_mode``, else
  ``bypassPermissions`` for permission ``auto_approve``, else ``default``.  Native structured
  output uses ``--print --output-format json --json-schema SCHEMA`` instead: one JSON result.
- **Control** (permission, plan review or question set to ``ask``/``auto_reject``):
  ``--input-format=stream-json --output-format=stream-json --verbose`` with
  ``CODEBUDDY_CODE_ENTRYPOINT=sdk-py``.  The driver sends ``initialize``, waits for its
  ``control_response``, then sends the prompt as a ``user`` frame.  Every ``can_use_tool``
  request becomes a ``sink.request_decision`` (``AskUserQuestion`` → question,
  ``ExitPlanMode`` → plan review with the last plan written under ``.codebuddy/plans/``,
  anything else → permission) answered with ``allowed: true|false`` (CodeBuddy's field; Claude
  Code says ``behavior``).  The terminal ``result`` closes stdin.

Sessions: ``--resume ID``; the checkpoint needs a ``result``/``success`` without ``is_error``
carrying ``session_id``, no malformed line and a clean exit.  Forks are refused (no fork flag
is documented), as is resuming from another working directory; "no conversation found"-class
messages raise ``ResumeRejectedError``.

Failures: an error ``result`` or an ``error`` frame is an ``agent_error`` classified from the
API status it carries (401/403 → ``auth``, 429 → ``rate_limit``, 5xx →
``provider_unavailable``) or, lacking one, from its message; a message naming a spent quota, an
unknown model or a prompt over the context window (the provider's words, see
``_cli.lasting_kind``) is ``quota``, ``model_not_found`` or ``context_too_long`` whatever the
status.

Session compatibility covers ``cwd``, ``extra_args``, ``model``, ``effort``,
``permission_mode``, ``max_turns`` and the *names* of ``env``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from adaptor import _nesting
from adaptor.driver import (
    DecisionChoice,
    DecisionKind,
    Descriptor,
    EventSink,
    HumanDecisionSupport,
    QuestionSupport,
    Request,
    Response,
    RunFailure,
    RunPolicyCaps,
    SessionCaps,
    StreamCaps,
    StructuredOutputCaps,
    StructuredOutputHITL,
    SystemPromptCaps,
)
from adaptor.drivers import _cli, _process

# CodeBuddy speaks Claude Code's stream-json envelope.
from adaptor.drivers._cli import content_text as _content_text
from adaptor.drivers._cli import control_response as _control_response
from adaptor.drivers._cli import envelope_usage as _usage
from adaptor.drivers._cli import snake as _snake
from adaptor.drivers._lines import (
    FailureKind,
    NullSink,
    Protocol,
    as_dict,
    as_list,
    as_str,
    died_as,
    provider_failure,
)
from adaptor.drivers._process import Child, Exit, Line, Spec
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, Thinking, ToolCall, ToolResult
from adaptor.result import StructuredOutput, TranscriptItem

__all__ = ["EFFORTS", "PERMISSION_MODES", "PROVIDER", "TYPE", "VERIFICATION", "Config", "Driver",
           "replay"]

TYPE: Final = "codebuddy"
PROVIDER: Final = "codebuddy"
VERIFICATION: Final = "format-verified, not binary-verified (upstream-drivers.md §2.4)"
EFFORTS: Final = ("minimal", "low", "medium", "high", "xhigh", "max")
PERMISSION_MODES: Final = (
    "default", "acceptEdits", "plan", "auto", "dontAsk", "bypassPermissions"
)

_INITIALIZE_ID: Final = "agent-adaptor-initialize"
_INITIALIZE: Final = orjson.dumps({
    "type": "control_request", "request_id": _INITIALIZE_ID,
    "request": {"subtype": "initialize", "hasPrompt": True,
                "capabilities": {"askUserQuestion": True}},
}) + b"\n"
# Inline argv carriers: the reference's limit for the appended prompt, and a prompt well below
# Linux's 128 KiB per-argument limit (E2BIG would otherwise surface as a crash at spawn).
_APPEND_LIMIT: Final = 32 * 1024
_PROMPT_ARG_LIMIT: Final = 100 * 1024
# Flags the driver sets itself, and those that switch the CLI to another protocol.
_OWNED_FLAGS: Final = frozenset({
    "-p", "--print", "--output-format", "--input-format", "--verbose", "--include-partial-messages",
    "--json-schema", "-r", "--resume", "-c", "--continue", "--fork-session", "--session-id",
    "--model", "--effort", "--max-turns", "--permission-mode", "--append-system-prompt",
    "--dangerously-skip-permissions", "--permission-prompt-tool", "--acp", "--acp-transport",
    "--setting-sources",
})
_PLAN_FILE = re.compile(r"(^|/)\.codebuddy/plans/[^/]+\.md$")
_RESUME_REJECTED = re.compile(
    r"no conversation found|(session|conversation)\b.{0,60}\bnot found|failed to resume|"
    r"invalid session",
    re.IGNORECASE,
)
# How messages without an API status word the failure.
_FAILURES: Final = _cli.FailureShapes(
    auth=re.compile(r"unauthori[sz]ed|forbidden|not logged in|authentication|"
                    r"invalid api key", re.IGNORECASE),
    rate_limit=re.compile(r"too many requests|rate limit|quota", re.IGNORECASE),
    unavailable=re.compile(r"overloaded|unavailable|internal server error|"
                           r"connection (refused|failed|error)|ECONNREFUSED|fetch failed",
                           re.IGNORECASE),
)


@dataclass(frozen=True)
class Config(_cli.CliConfig):
    """CodeBuddy Code's configuration.

    ``model`` (``--model``; a run's ``model=`` wins), ``effort`` (``--effort``, one of
    :data:`EFFORTS`), ``permission_mode`` (``--permission-mode``, one of
    :data:`PERMISSION_MODES`; overrides the mode the driver derives from the policy, except
    that a mode deciding without asking yields to permission ``ask``/``auto_reject``) and
    ``max_turns`` (``--max-turns``).
    """

    command: str = "codebuddy"
    effort: str = ""
    permission_mode: str = ""
    max_turns: int | None = None


class Driver(_cli.CliDriver[Config]):
    """The CodeBuddy Code driver.  Construction snapshots the config and does no I/O."""

    _type = TYPE
    _config_type = Config
    _fingerprint_domain = "codebuddy/config/v1"
    _fingerprint_fields = ("cwd", "extra_args", "model", "effort", "permission_mode", "max_turns")
    # The API key and OAuth token variables CodeBuddy Code's documentation names (its
    # "identity and access management" page; no binary was at hand to check).
    _credentials = ("CODEBUDDY_API_KEY", "CODEBUDDY_AUTH_TOKEN")

    def descriptor(self) -> Descriptor:
        every_mode = HumanDecisionSupport(ask=True, auto_approve=True, auto_reject=True)
        return Descriptor(
            type=TYPE,
            display_name="CodeBuddy Code",
            sessions=SessionCaps(supports_resume=True),
            instructions=True,
            workspace=True,
            run_policy_caps=RunPolicyCaps(
                permission=every_mode,
                plan_review=copy.copy(every_mode),
                question=QuestionSupport(ask=True, auto_reject=True),
            ),
            structured_output=StructuredOutputCaps(
                native=True, prompt_validate=True, works_with_streaming=True,
                # The native path is print mode, which has no control channel: any ask
                # (inherited ones included) makes the SDK pick prompt-validate instead.
                native_hitl=StructuredOutputHITL(),
            ),
            system_prompt=SystemPromptCaps(append=True),
            stream=StreamCaps(native=True, token_level=True, reasoning=True, tool_call_args=True),
        )

    def _check(self, config: Config) -> None:
        _cli.check_config(config)
        _cli.check_choice("effort", config.effort, EFFORTS)
        _cli.check_choice("permission_mode", config.permission_mode, PERMISSION_MODES)
        turns = config.max_turns
        if turns is not None and (not isinstance(turns, int) or isinstance(turns, bool)
                                  or turns < 1):
            raise ValueError("max_turns: expected a positive integer or null")
        _cli.check_owned_flags(config.extra_args, _OWNED_FLAGS)

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config_for(request)
        plan = _plan(config, request)
        refused = _refusal(plan)
        if refused is not None:
            return refused
        argv, shown = _argv(config, plan)
        env, names = _process.child_env(*plan.env_layers)
        spec = Spec(argv=argv, shown_argv=shown, env=env, env_names=names, cwd=plan.spawn_cwd,
                    stdin="driven" if plan.control else "closed",
                    grace_period=config.grace_period)

        def converse(child: Child, parser: _Parser) -> None:
            _converse(child, parser, plan, sink)

        return _cli.run_child(spec, sink, request, _Parser(sink, plan),
                              converse if plan.control else None)


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
    request: Request | None = None,
) -> Response:
    """Parse captured CodeBuddy output (stream-json, or the single JSON object of native
    structured output when ``request`` asks for it) as if a run had produced it; control
    requests are recorded, not answered.  Raises ``ResumeRejectedError`` like ``run``."""
    plan = _plan(Config(), request or Request(run_id="replay", prompt=""))
    return _cli.replay(_Parser(sink or NullSink(), plan), stdout, stderr, exit_code)


# --- plan and argv ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    prompt: str
    model: str
    spawn_cwd: str | None
    session_cwd: str
    resume_id: str | None
    control: bool
    schema: str | None  # native structured output: print mode with one JSON result
    partial: bool
    permission_mode: str
    # An explicit permission policy of ask or auto_reject: its mode is always on the command line.
    guarded: bool
    append: str | None
    env_layers: tuple[Mapping[str, str], ...]


def _plan(config: Config, request: Request) -> _Plan:
    spawn_cwd, session_cwd = _cli.cwds(config, request)
    resume_id, _ = _cli.resume_target(request, session_cwd,
                                      no_fork="codebuddy cannot fork a session")
    approvals = None if request.policy is None else request.policy.approvals
    # Only modes that need an answer from the host take the control transport; inherited
    # modes keep the CLI's own permission handling (no prompt nobody would answer).
    control = approvals is not None and any(
        mode in ("ask", "auto_reject")
        for mode in (approvals.permission, approvals.plan_review, approvals.question)
    )
    schema = None
    if request.output_schema is not None and request.structured_output_source == "native":
        # Claude-compatible validators reject the 2020-12 meta-schema id; the SDK validates.
        document = {k: v for k, v in request.output_schema.schema.items() if k != "$schema"}
        schema = orjson.dumps(document).decode()
    auto_approve = approvals is not None and approvals.permission == "auto_approve"
    guarded = approvals is not None and approvals.permission in ("ask", "auto_reject")
    permission_mode = config.permission_mode or ("bypassPermissions" if auto_approve else "default")
    if guarded and permission_mode not in _cli.ASKING_PERMISSION_MODES:
        # The run's explicit policy wins over a configured mode that would decide without
        # asking, and over a default mode in the user's settings (said on the command line).
        permission_mode = "default"
    prompt = _cli.prompt_of(request)
    owned = {"CODEBUDDY_CODE_ENTRYPOINT": "sdk-py"} if control else {}
    return _Plan(
        prompt=prompt,
        model=request.model_override or config.model,
        spawn_cwd=spawn_cwd,
        session_cwd=session_cwd,
        resume_id=resume_id,
        control=control,
        schema=schema,
        partial=request.streaming,
        permission_mode=permission_mode,
        guarded=guarded,
        append=request.append_system_prompt or None,
        env_layers=(dict(config.env), dict(request.env), owned),
    )


def _refusal(plan: _Plan) -> Response | None:
    """Request parts this driver cannot honour, refused before anything starts."""
    if plan.control and plan.schema is not None:
        # Reachable with auto_reject (not an ask, so the SDK may pick native): print mode, the
        # only native path, has no channel to reject anything through.
        why, kind = ("native structured output with an approval mode that needs the host",
                     "structured_output_with_control")
    elif plan.append is not None and (len(plan.append.encode()) > _APPEND_LIMIT
                                      or "\0" in plan.append):
        why, kind = "an append_system_prompt over 32 KiB or with a NUL byte", "argument_limit"
    elif not plan.control and (len(plan.prompt.encode()) > _PROMPT_ARG_LIMIT
                               or "\0" in plan.prompt):
        why, kind = ("a prompt over 100 KiB or with a NUL byte (it travels as a command-line "
                     "argument)", "argument_limit")
    else:
        return None
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver", message=f"codebuddy cannot take {why}", details={"kind": kind},
    ))


def _argv(config: Config, plan: _Plan) -> tuple[list[str], list[str]]:
    """The command line and the form a spawn event shows.  Follows the CodeBuddy Code formats in
    shared/reference/upstream-drivers.md §2.4 (captured upstream: ``--print --output-format
    stream-json --verbose --include-partial-messages --model M "<prompt>"``; no binary was
    available here to check against): keep every flag decision here."""
    if plan.control:
        argv = [config.command, "--input-format=stream-json", "--output-format=stream-json",
                "--verbose"]
    elif plan.schema is not None:
        argv = [config.command, "--print", "--output-format", "json", "--json-schema",
                plan.schema]
    else:
        argv = [config.command, "--print", "--output-format", "stream-json", "--verbose"]
        if plan.partial:
            argv.append("--include-partial-messages")
    if plan.resume_id is not None:
        argv += ["--resume", plan.resume_id]
    if not plan.control or config.permission_mode or plan.guarded:
        argv += ["--permission-mode", plan.permission_mode]
    if plan.model:
        argv += ["--model", plan.model]
    if config.effort:
        argv += ["--effort", config.effort]
    if config.max_turns is not None:
        argv += ["--max-turns", str(config.max_turns)]
    shown = list(argv)
    if plan.append is not None:
        argv += ["--append-system-prompt", plan.append]
        shown += ["--append-system-prompt", f"<{len(plan.append)} characters>"]
    argv += config.extra_args
    shown += config.extra_args
    if not plan.control:
        # "--" ends the options: a prompt starting with "-" (a markdown list, "--help") was
        # parsed as a flag, and the run failed with an unknown option or did something else.
        argv += ["--", plan.prompt]
        shown += ["--", f"<prompt: {len(plan.prompt)} characters>"]
    return argv, shown


# --- the control conversation -------------------------------------------------------------------


def _converse(child: Child, parser: _Parser, plan: _Plan, sink: EventSink) -> None:
    """Handshake, prompt and approvals on the control transport, up to the terminal result;
    the caller drains whatever follows."""
    child.send(_INITIALIZE)
    for line in child.lines(sink):
        control = parser.feed(line)
        if parser.initialized and not parser.prompted:
            parser.prompted = True
            frame = {"type": "user", "session_id": "",
                     "message": {"role": "user", "content": plan.prompt},
                     "parent_tool_use_id": None}
            child.send(orjson.dumps(frame) + b"\n")
        if _cli.stopped_at_unreadable(child, parser.protocol, line):
            break
        if control is not None:
            _answer(child, control, parser, sink)
        if parser.result is not None:
            break
    child.close_stdin()  # the turn is over: EOF lets the CLI exit


def _answer(child: Child, control: dict[str, Any], parser: _Parser, sink: EventSink) -> None:
    request_id = control.get("request_id")
    body = as_dict(control.get("request"))
    if body.get("subtype") != "can_use_tool":
        child.send(_control_response(request_id, error=f"unsupported: {body.get('subtype')}"))
        return
    tool = as_str(body.get("tool_name")) or "tool"
    tool_input = as_dict(body.get("input"))
    tool_use_id = as_str(body.get("tool_use_id"))
    kind: DecisionKind = (
        "question" if tool == "AskUserQuestion"
        else "plan_review" if tool == "ExitPlanMode"
        else "permission"
    )
    payload: dict[str, Any] = {"tool_name": tool, "input": _nesting.copy(tool_input)}
    asked: list[tuple[str, tuple[DecisionChoice, ...], str]] = [(f"Allow {tool}?", (), "")]
    if kind == "question":
        asked = _cli.asked_questions(tool_input, "CodeBuddy has a question")
    elif kind == "plan_review":
        asked = [("Review CodeBuddy's plan", (), "")]
        payload["plan"] = as_str(tool_input.get("plan")) or parser.last_plan
    elif as_str(body.get("description")):
        asked = [(as_str(body["description"]), (), "")]
    decision, answers = _cli.decide_in_turn(
        sink, kind, asked, source=f"codebuddy.{_snake(tool)}", tool_call_id=tool_use_id,
        payload=payload,
        decided=lambda made: parser.decision(kind, tool, tool_use_id, made.result, made.choice))
    reply: dict[str, Any]
    if decision.result in ("approved", "answered"):
        updated = dict(tool_input)
        if kind == "question":
            updated["answers"] = answers
            updated["choice"] = next(iter(answers.values()), "")  # (the first question's)
        reply = {"allowed": True, "tool_use_id": tool_use_id, "updatedInput": updated}
    else:
        reply = {"allowed": False, "tool_use_id": tool_use_id,
                 "reason": decision.text or f"The user did not allow {tool}.",
                 "interrupt": decision.result == "aborted"}
    child.send(_control_response(request_id, response=reply))
    if decision.result == "aborted":
        # The SDK has already decided the verdict; the process must not go on.
        child.terminate("cancelled")


# --- parsing ------------------------------------------------------------------------------------


class _Parser:
    """CodeBuddy stream-json (or native-schema JSON) → events, transcript and a Response."""

    def __init__(self, sink: EventSink, plan: _Plan) -> None:
        self.sink = sink
        self.plan = plan
        self.protocol = Protocol(sink)
        self.model = plan.model
        self.final: list[str] = []
        self.result: dict[str, Any] | None = None
        self.provider_error: dict[str, Any] = {}
        self.rejected_resume = ""
        self.tool_names: dict[str, str] = {}
        self.open_tools: set[str] = set()
        self.open_blocks: dict[int, tuple[str, str]] = {}  # index -> (kind, lifecycle id)
        self.streamed: set[str] = set()
        self.message = ""
        self.last_plan = ""
        self.initialized = False
        self.prompted = False
        self.json_lines: list[bytes] = []

    @property
    def succeeded(self) -> bool:
        result = self.result
        return (result is not None and result.get("subtype") == "success"
                and result.get("is_error") is not True and not self.protocol.malformed)

    def _item(self, **fields: Any) -> None:
        self.protocol.item(TranscriptItem(**fields))

    def feed(self, line: Line) -> dict[str, Any] | None:
        """One line; returns a control request the caller must answer."""
        if line.stream == "stderr":
            self.protocol.feed_stderr(line.data)
            self._check_resume(line.text)
            return None
        if self.plan.schema is not None:
            self.json_lines.append(line.data)  # one JSON document, maybe pretty-printed
            return None
        decoded = self.protocol.feed_stdout(line.data)
        if decoded is None or decoded.event is None:
            return None
        return self._dispatch(decoded.event, decoded.text)

    def _dispatch(self, event: dict[str, Any], text: str) -> dict[str, Any] | None:
        kind = as_str(event.get("type"))
        if kind == "control_request":
            return event
        if kind == "control_response":
            response = as_dict(event.get("response"))
            if response.get("request_id") == _INITIALIZE_ID:
                self.initialized = True
                if response.get("subtype") == "error":
                    self._item(kind="system", subtype="initialize_error",
                               text=as_str(response.get("error")) or "initialize failed")
            return None
        handler = self._HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        elif kind:
            self._item(kind="system", subtype=kind)
        if kind == "result":
            self.protocol.set_terminal(event, text)
        return None

    def _finish_json(self) -> None:
        """Native structured output: the whole stdout is one result object (or a list of
        events ending with one), possibly pretty-printed over several lines."""
        blob = b"\n".join(self.json_lines).strip()
        self.json_lines = []
        if not blob:
            return
        try:
            value = orjson.loads(blob)
        except orjson.JSONDecodeError:
            value = None
        events = [value] if isinstance(value, dict) else value
        if not isinstance(events, list):
            self.protocol.mark_malformed("native structured output is not one JSON document")
            self._item(kind="stdout", text=blob.decode("utf-8", "replace")[:2000])
            return
        for event in events:
            if isinstance(event, dict):
                self._dispatch(event, _nesting.dumps(event).decode())

    def _check_resume(self, text: str) -> None:
        if self.plan.resume_id and not self.rejected_resume and _RESUME_REJECTED.search(text):
            self.rejected_resume = text.strip()

    # -- event handlers --

    def _system(self, event: dict[str, Any]) -> None:
        subtype = as_str(event.get("subtype"))
        if subtype == "init":
            self.model = as_str(event.get("model")) or self.model
            self._item(kind="init", model=self.model, session_id=as_str(event.get("session_id")),
                       metadata={"cwd": as_str(event.get("cwd")),
                                 "permission_mode": as_str(event.get("permissionMode"))})
        elif subtype and subtype != "status":  # "status" is a progress ping
            self._item(kind="system", subtype=subtype, text=as_str(event.get("message")))

    def _stream_event(self, event: dict[str, Any]) -> None:
        inner = as_dict(event.get("event"))
        kind = inner.get("type")
        if kind == "message_start":
            self.message = (as_str(as_dict(inner.get("message")).get("id"))
                            or self.protocol.fresh_id("message"))
            self.streamed.add(self.message)
            self.open_blocks = {}
            return
        index = inner.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start":
            self._end_block(index)
            block = as_dict(inner.get("content_block"))
            btype = as_str(block.get("type"))
            if btype in ("text", "thinking"):
                ident = self.protocol.fresh_id(f"{self.message}/{index}")
                self.open_blocks[index] = (btype, ident)
                self._delta(btype, ident, "start")
            elif btype == "tool_use":
                ident = as_str(block.get("id"))
                if ident and ident not in self.tool_names:
                    self.tool_names[ident] = as_str(block.get("name")) or "tool"
                    self.open_tools.add(ident)
                    self.open_blocks[index] = ("tool", ident)
                    self.sink.emit(ToolCall(id=ident, name=self.tool_names[ident], phase="start"))
        elif kind == "content_block_delta" and index in self.open_blocks:
            btype, ident = self.open_blocks[index]
            delta = as_dict(inner.get("delta"))
            if btype == "tool":
                if ident in self.open_tools and as_str(delta.get("partial_json")):
                    self.sink.emit(ToolCall(id=ident, args_delta=as_str(delta["partial_json"]),
                                            phase="content"))
            else:
                self._delta(btype, ident, "content", as_str(delta.get(btype)))
        elif kind == "content_block_stop":
            self._end_block(index)

    def _end_block(self, index: int) -> None:
        if index in self.open_blocks:
            btype, ident = self.open_blocks.pop(index)
            if btype != "tool":
                self._delta(btype, ident, "end")

    def _delta(self, kind: str, ident: str, phase: str, text: str = "") -> None:
        if phase == "content" and not text:
            return  # empty deltas carry nothing
        cls = TextDelta if kind == "text" else Thinking
        self.sink.emit(cls(message_id=ident, text=text, phase=phase))  # type: ignore[arg-type]

    def _assistant(self, event: dict[str, Any]) -> None:
        message = as_dict(event.get("message"))
        if event.get("error") or event.get("is_api_error_message"):
            # A synthetic message standing for an API failure: not the model's words.
            self.provider_error = {"message": _content_text(message.get("content")),
                                   "status": event.get("api_error_status")}
            self._item(kind="failure", text=self.provider_error["message"] or "API error",
                       metadata={"code": "agent_error"})
            return
        self.model = as_str(message.get("model")) or self.model
        message_id = as_str(message.get("id"))
        live = message_id not in self.streamed
        for position, block in enumerate(map(as_dict, as_list(message.get("content")))):
            btype = as_str(block.get("type"))
            if btype in ("text", "thinking") and as_str(block.get(btype)):
                text = as_str(block[btype])
                if live:
                    ident = self.protocol.fresh_id(f"{message_id or 'message'}/{position}")
                    for phase, piece in (("start", ""), ("content", text), ("end", "")):
                        self._delta(btype, ident, phase, piece)
                if btype == "text":
                    self._item(kind="assistant", text=text, model=self.model)
                    self.final.append(text)
                else:
                    self._item(kind="thinking", text=text)
            elif btype == "tool_use":
                self._tool_use(block)

    def _tool_use(self, block: Mapping[str, Any]) -> None:
        ident = as_str(block.get("id"))
        name = as_str(block.get("name")) or "tool"
        tool_input = block.get("input")
        args = _nesting.copy(tool_input) if isinstance(tool_input, dict) else None
        if ident and ident not in self.tool_names:
            self.tool_names[ident] = name
            self.open_tools.add(ident)
            self.sink.emit(ToolCall(id=ident, name=name, args=args, phase="start"))
        if name == "Write" and args and _PLAN_FILE.search(as_str(args.get("file_path"))):
            self.last_plan = as_str(args.get("content"))  # what ExitPlanMode asks to approve
        self._item(kind="tool_call", tool_use_id=ident, tool_name=name, input=args)
        self.final = []  # text before a tool call is not the final answer

    def _user(self, event: dict[str, Any]) -> None:
        content = as_dict(event.get("message")).get("content")
        if isinstance(content, str):
            if content:
                self._item(kind="user", text=content)
            return
        for block in map(as_dict, as_list(content)):
            if block.get("type") != "tool_result":
                if block.get("type") == "text" and as_str(block.get("text")):
                    self._item(kind="user", text=as_str(block["text"]))
                continue
            ident = as_str(block.get("tool_use_id"))
            text = _content_text(block.get("content"))
            is_error = block.get("is_error") is True
            name = self.tool_names.get(ident, "")
            if ident in self.open_tools:
                self.open_tools.discard(ident)
                self.sink.emit(ToolCall(id=ident, name=name, result=text, phase="end"))
                self.sink.emit(ToolResult(id=ident, result=text, is_error=is_error))
            self._item(kind="tool_result", tool_use_id=ident or "unknown", tool_name=name,
                       text=text, is_error=is_error)
            self.final = []

    def _error(self, event: dict[str, Any]) -> None:
        error = event.get("error")
        details = as_dict(error)
        message = (as_str(details.get("message")) or as_str(error) or as_str(event.get("message"))
                   or "error")
        status = details.get("status") or details.get("code") or event.get("status")
        self.provider_error = {"message": message, "status": status,
                               "type": as_str(details.get("type")) or None}
        self._check_resume(message)
        self._item(kind="failure", text=message, metadata={"code": "agent_error"})

    def _result(self, event: dict[str, Any]) -> None:
        self.result = event
        if event.get("subtype") != "success" or event.get("is_error") is True:
            for message in (*as_list(event.get("errors")), event.get("result")):
                if isinstance(message, str):
                    self._check_resume(message)
        text = event.get("result")
        if (self.plan.schema is not None and not self.final and isinstance(text, str) and text
                and event.get("is_error") is not True):
            # Print-mode JSON has no assistant events: the result text is the answer.
            ident = self.protocol.fresh_id(f"{as_str(event.get('session_id')) or 'result'}/text")
            for phase, piece in (("start", ""), ("content", text), ("end", "")):
                self._delta("text", ident, phase, piece)
            self._item(kind="assistant", text=text, model=self.model)
            self.final.append(text)
        self._item(kind="result", text=text if isinstance(text, str) else "",
                   subtype=as_str(event.get("subtype")), is_error=event.get("is_error") is True,
                   session_id=as_str(event.get("session_id")), usage=_usage(event))

    _HANDLERS: Final[Mapping[str, Callable[[_Parser, dict[str, Any]], None]]] = {
        "system": _system,
        "stream_event": _stream_event,
        "assistant": _assistant,
        "user": _user,
        "error": _error,
        "result": _result,
    }

    def decision(self, kind: str, tool: str, tool_use_id: str, result: str, choice: str) -> None:
        metadata: dict[str, Any] = {"kind": kind, "result": result}
        if choice:
            metadata["choice"] = choice
        self._item(kind="system", subtype="decision", text=f"{kind}: {result}", tool_name=tool,
                   tool_use_id=tool_use_id, metadata=metadata)

    # -- the Response --

    def _close_lifecycles(self) -> None:
        for index in sorted(self.open_blocks):
            self._end_block(index)
        for ident in sorted(self.open_tools):
            self.sink.emit(ToolCall(id=ident, name=self.tool_names.get(ident, ""), phase="end"))
        self.open_tools = set()

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response:
        if self.plan.schema is not None:
            self._finish_json()
        self._close_lifecycles()
        if self.rejected_resume and not self.succeeded:
            raise ResumeRejectedError(self.rejected_resume)
        result = self.result or {}
        failure = self._failure(exit_)
        session_id = as_str(result.get("session_id"))
        checkpoint = None
        if failure is None and exit_.clean and self.succeeded and session_id:
            checkpoint = _cli.checkpoint(session_id, self.plan.session_cwd)
        output = "\n\n".join(self.final)
        structured = None
        if self.plan.schema is not None:
            value = result.get("structured_output")
            if value is not None:
                output = _nesting.dumps(value).decode()
            structured = StructuredOutput(
                source="native", valid=value is not None, value=value,
                raw_json=output if value is not None else "",
                errors=() if value is not None else ("the CLI returned no structured_output",),
            )
        metadata: dict[str, str] = {k: str(result[k]) for k in
                                    ("session_id", "subtype", "num_turns", "stop_reason")
                                    if result.get(k) is not None}
        if self.protocol.malformed:
            metadata["protocol"] = "malformed"
        if self.plan.control:
            metadata["transport"] = "control"
        return _cli.response(exit_, self.protocol, stdout, stderr,
                             terminal_event=None if self.result is None else "result",
                             output=output,
                             usage=None if self.result is None else _usage(self.result),
                             checkpoint=checkpoint, metadata=metadata, provider=PROVIDER,
                             model=self.model, structured_output=structured, failure=failure)

    def _failure(self, exit_: Exit) -> RunFailure | None:
        result = self.result
        reported = None
        if result is not None and not (result.get("subtype") == "success"
                                       and result.get("is_error") is not True):
            errors = as_list(result.get("errors"))
            message = (as_str(result.get("result")) or "; ".join(map(str, errors))
                       or as_str(self.provider_error.get("message"))
                       or "codebuddy reported an error")
            status = result.get("api_error_status") or self.provider_error.get("status")
            reported = _classify(message, status, subtype=as_str(result.get("subtype")) or None)
        return _cli.run_failure("codebuddy", exit_, self.protocol, reported=reported,
                                terminal=result is not None, died=self._died)

    def _died(self, died: RunFailure) -> RunFailure:
        # An `error` frame before the end says more than the exit.
        if self.provider_error:
            died = RunFailure(code=died.code,
                              message=as_str(self.provider_error.get("message"))
                              or died.message,
                              details=died.details)
            kind, code = _kind(died.message, self.provider_error.get("status"))
        else:
            kind, code = _kind(died.message, None)
        return died_as(died, kind, provider_status=code)


def _classify(message: str, status: Any, **details: Any) -> RunFailure:
    kind, code = _kind(message, status)
    return provider_failure(message, kind, provider_status=code, **details)


def _kind(message: str, status: Any) -> tuple[FailureKind, int | None]:
    """The failure class and HTTP status of an error: a failure no retry mends that its message
    names (a spent quota is a 429 too), else the status the CLI reported, else the one its
    message quotes, else its words."""
    code = status if isinstance(status, int) and not isinstance(status, bool) else None
    if code is None:
        return _FAILURES.kind(message), _cli.quoted_status(message)
    return _cli.lasting_kind(message) or _cli.status_kind(code), code

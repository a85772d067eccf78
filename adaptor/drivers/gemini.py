"""The ``gemini`` driver: Gemini CLI (npm ``@google/gemini-cli``) in headless stream-json mode.

::

    from adaptor.drivers import gemini

    agent = adaptor.Agent(gemini.Driver(gemini.Config(model="gemini-2.5-flash")))

Each run is one ``gemini -p "" -o stream-json ...`` process with the prompt on stdin followed by
EOF.  The exact argv is built in one place, :func:`_argv`, checked against Gemini CLI 0.61.0.
The npm launcher re-spawns node with a larger heap and ignores SIGTERM itself, which is why the
runner signals the whole process group.

- **Output.**  ``init`` (session id, model), ``message`` (the user prompt echoed, then assistant
  text as ``delta`` chunks), ``tool_use``/``tool_result``, ``error`` (warnings, or the reason of
  an error ``result``) and the terminal ``result`` (``status``, ``stats`` with token counts).
  ``Result.text`` is the assistant text after the last tool call.
- **Approvals.**  Headless Gemini never asks: tools needing confirmation are simply not offered
  to the model unless the approval mode allows them.  Permission ``auto_approve`` runs with
  ``--approval-mode yolo`` and ``auto_reject`` with ``--approval-mode default``; ``ask``, plan
  review and questions are refused by the SDK before anything starts.  Without an explicit
  permission mode ``Config.approval_mode`` (or the CLI's settings) decides.
- **Sessions.**  ``--resume ID`` (the CLI accepts the session UUID).  A checkpoint needs the
  ``init`` session id, a ``result`` with ``status: "success"`` and a clean exit.  Gemini keeps
  sessions per project directory, so resuming from another directory is refused before the CLI
  starts, and so is a fork: the CLI cannot branch a session.  "Error resuming session" (exit 42)
  raises ``ResumeRejectedError``.
- **Not supported** (refused, never dropped): ``append_system_prompt`` (the CLI can only
  *replace* its system prompt), native structured output (prompt-validate only), MCP servers and
  skills from the SDK (the descriptor says so), sandbox / web-search / browser policies.

Failures: an error ``result`` is an ``agent_error`` classified from the API error it quotes
(``"code": 401`` / ``UNAUTHENTICATED`` → ``auth``; 429 / ``RESOURCE_EXHAUSTED`` →
``rate_limit``; 5xx and "fetch failed" → ``provider_unavailable``; a quota the CLI gives up on,
"exhausted your daily quota" or "limit: 0", → ``quota``, "models/x is not found" →
``model_not_found``, "exceeds the maximum number of tokens" → ``context_too_long``).  For API
errors the CLI exits with the HTTP status truncated to 8 bits (401 → 145), which also
identifies the status when the message does not.  Exit 41 without a result is the CLI's own authentication failure
(no ``GEMINI_API_KEY``, an auth method not selected): ``auth`` too.  Gemini retries 5xx and network errors with backoff for minutes; its
``general.maxAttempts`` / ``general.retryFetchErrors`` settings or the run's ``timeout`` bound
that.

Session compatibility covers ``cwd``, ``extra_args``, ``model``, ``approval_mode``, ``home`` and
the *names* of ``env``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from adaptor import _durable, _nesting
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
    FailureKind,
    NullSink,
    Protocol,
    as_dict,
    as_int,
    as_str,
    died_as,
    provider_failure,
)
from adaptor.drivers._process import Exit, Line, Spec
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, ToolCall, ToolResult
from adaptor.result import TranscriptItem, Usage

__all__ = ["APPROVAL_MODES", "CLI_VERSION", "PROVIDER", "TYPE", "Config", "Driver", "replay"]

TYPE: Final = "gemini"
PROVIDER: Final = "google"
CLI_VERSION: Final = "0.61.0"
APPROVAL_MODES: Final = ("default", "auto_edit", "yolo", "plan")

# Flags the driver sets itself, and those that would make the CLI do something other than one
# headless turn (interactive, ACP, session management).
_OWNED_FLAGS: Final = frozenset({
    "-p", "--prompt", "-i", "--prompt-interactive", "-o", "--output-format", "-m", "--model",
    "-r", "--resume", "--session-id", "--session-file", "--list-sessions", "--delete-session",
    "--approval-mode", "-y", "--yolo", "--acp", "--experimental-acp",
})
_RESUME_REJECTED = re.compile(
    r"error resuming session|invalid session identifier|no previous sessions found",
    re.IGNORECASE,
)
_AUTH = re.compile(r"UNAUTHENTICATED|PERMISSION_DENIED|api key not valid|invalid api key|"
                   r"unauthori[sz]ed", re.IGNORECASE)
_RATE_LIMIT = re.compile(r"RESOURCE_EXHAUSTED|quota|rate limit|too many requests", re.IGNORECASE)
# "API Error: terminated" and the rest: undici's words for a response body cut mid-way.
# The CLI's FatalAuthenticationError (0.61.0): no key for the selected auth method, or none
# selected; it exits before any request, with no result.
_EXIT_AUTH: Final = 41
_LOOP_DETECTED = re.compile(r"\bloop detected\b", re.IGNORECASE)
# A stream that ends without a finish reason, or with an event that is not JSON (the CLI's
# JSON.parse words inside its "[API Error: ...]"), is broken too.
_UNAVAILABLE = re.compile(r"\bINTERNAL\b|\bUNAVAILABLE\b|overloaded|fetch failed|ECONNREFUSED|"
                          r"ECONNRESET|ETIMEDOUT|ENOTFOUND|EAI_AGAIN|API Error: terminated|"
                          r"other side closed|UND_ERR_SOCKET|socket hang up|premature close|"
                          r"stream ended without a finish reason|"
                          r"API Error: [^\]\n]*(?:in JSON at position|end of JSON input)",
                          re.IGNORECASE)


@dataclass(frozen=True)
class Config(_cli.CliConfig):
    """Gemini CLI's configuration.

    ``model`` is passed as ``-m`` (a run's ``model=`` wins; empty: the CLI's ``auto`` routing,
    which costs an extra classifier request per turn); ``approval_mode`` as ``--approval-mode``
    (one of :data:`APPROVAL_MODES`) unless the run's policy sets the permission mode; ``home``
    becomes ``GEMINI_CLI_HOME``, the directory whose ``.gemini/`` holds settings, credentials and
    sessions (``None``: the user's home).
    """

    command: str = "gemini"
    approval_mode: str = ""
    home: str | None = None


class Driver(_cli.CliDriver[Config]):
    """The Gemini CLI driver.  Construction snapshots the config and does no I/O."""

    _type = TYPE
    _config_type = Config
    _fingerprint_domain = "gemini/config/v1"
    _fingerprint_fields = ("cwd", "extra_args", "model", "approval_mode", "home")
    # Read by gemini 0.61.0 (found in its bundle): the two API keys and a Cloud access token.
    _credentials = ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_CLOUD_ACCESS_TOKEN")

    def descriptor(self) -> Descriptor:
        return Descriptor(
            type=TYPE,
            display_name="Gemini CLI",
            sessions=SessionCaps(supports_resume=True),
            instructions=True,
            workspace=True,
            run_policy_caps=RunPolicyCaps(
                # Headless mode never asks; the approval mode decides what the model may call.
                permission=HumanDecisionSupport(auto_approve=True, auto_reject=True),
            ),
            structured_output=StructuredOutputCaps(prompt_validate=True),
            stream=StreamCaps(native=True, token_level=True),
        )

    def _check(self, config: Config) -> None:
        _cli.check_config(config)
        _cli.check_choice("approval_mode", config.approval_mode, APPROVAL_MODES)
        _cli.check_optional_path("home", config.home)
        _cli.check_owned_flags(config.extra_args, _OWNED_FLAGS,
                               "is set by the driver or leaves headless mode", flags_of=_flags_in)

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config_for(request)
        if request.append_system_prompt:
            # GEMINI_SYSTEM_MD replaces the whole system prompt; nothing appends to it.
            return _cli.no_append("gemini")
        plan = _plan(config, request)
        env, names = _process.child_env(*plan.env_layers)
        # (The directory whose .gemini/ holds the CLI's user settings.)
        home = env.get("GEMINI_CLI_HOME") or env.get("HOME") or os.path.expanduser("~")
        refused = (_permission_overridden(request, config.extra_args)
                   or _workspace_settings_override(request, plan.session_cwd, home))
        if refused is not None:
            return refused
        spec = Spec(argv=_argv(config, plan), env=env, env_names=names, cwd=plan.spawn_cwd,
                    stdin=plan.prompt.encode(), grace_period=config.grace_period,
                    stdout_capacity=_STDOUT_CAPACITY)
        return _cli.run_child(spec, sink, request, _Parser(sink, plan))


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
    request: Request | None = None,
) -> Response:
    """Parse captured ``gemini -o stream-json`` output as if a run had produced it (tests,
    diagnostics); raises ``ResumeRejectedError`` like ``run`` for a refused resume."""
    plan = _plan(Config(), request or Request(run_id="replay", prompt=""))
    return _cli.replay(_Parser(sink or NullSink(), plan), stdout, stderr, exit_code)


# The CLI echoes the prompt on stdout and exits with what a full pipe could not take still
# queued in node, which drops it: with Linux's default 64 KiB pipe a prompt of a few hundred KB
# lost the answer.  A mebibyte (Linux's default /proc/sys/fs/pipe-max-size) takes such an echo.
_STDOUT_CAPACITY: Final = 1 << 20

# extra_args that allow tools past the approval mode: the deprecated allow-list, policy files
# whose rules may say "allow", and MCP servers named allowed (an allow rule for their tools).
_PRE_APPROVING: Final = frozenset(
    {"--allowed-tools", "--policy", "--admin-policy", "--allowed-mcp-server-names"}
)


def _permission_overridden(request: Request, extra_args: Sequence[str]) -> Response | None:
    """A refusal when the run's explicit ``auto_reject`` (tools needing approval withheld)
    meets ``extra_args`` that could allow such a tool: the CLI would run it."""
    return _cli.permission_overridden("gemini", request, _flags_in(extra_args), _PRE_APPROVING,
                                      frozenset({"auto_reject"}), "they may allow tools")


_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])[A-Z]")


def _flags_in(extra_args: Sequence[str]) -> Iterator[str]:
    """The flags ``extra_args`` set as the CLI's parser (yargs) reads them: ``--allowedTools``
    is ``--allowed-tools`` (an option answers to both spellings), ``--flag=value`` is ``--flag``,
    and ``-dy`` is ``-d -y`` (a group of short flags, up to a value attached to one)."""
    for arg in extra_args:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0][2:]
            yield "--" + _CAMEL_HUMP.sub(lambda hump: "-" + hump.group(0).lower(), name)
        elif arg.startswith("-"):
            for letter in arg[1:]:
                if not letter.isalpha():
                    break  # (-m=x, -e/path: a value)
                yield "-" + letter


# A workspace's settings (a cloned repository's .gemini/settings.json, which the CLI loads from
# its working directory once that is trusted, as headless runs need) that make allow rules in
# Gemini CLI 0.61.0's policy engine: tools allowed or made core, policy files whose rules may
# say "allow", MCP servers trusted or allowed (their tools never confirmed; headless too with
# autoAllowInHeadless).  The user's own settings (under GEMINI_CLI_HOME) are theirs, as claude
# keeps the user's.
_ALLOWING_PATHS: Final = (("tools", "allowed"), ("tools", "core"), ("policyPaths",),
                          ("adminPolicyPaths",), ("mcp", "allowed"), ("mcp", "autoAllowInHeadless"))
_SETTINGS_LIMIT: Final = 1 << 20
# JSON strings (kept whole, so that no comment is seen inside one) and the comments the CLI
# strips before JSON.parse.
_STRING_OR_COMMENT = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', re.DOTALL)


def _allowing_settings(text: str) -> list[str]:
    """The settings in ``text`` that make allow rules, read as the CLI reads the file (comments
    stripped, then JSON); one it could not parse either counts, as it may say anything."""
    plain = _STRING_OR_COMMENT.sub(lambda m: m[0] if m[0].startswith('"') else " ", text)
    try:
        settings = as_dict(orjson.loads(plain))
    except ValueError:
        return ["(not JSON the driver can read)"]
    found = []
    for path in _ALLOWING_PATHS:
        value: Any = settings
        for key in path:
            value = as_dict(value).get(key)
        if _truthy(value):
            found.append(".".join(path))
    servers = settings.get("mcpServers")
    # (The CLI walks a list's entries too, named by index.)
    named = enumerate(servers) if isinstance(servers, list) else as_dict(servers).items()
    found += [f"mcpServers.{name}.trust" for name, server in named
              if _truthy(as_dict(server).get("trust"))]
    return found


def _truthy(value: object) -> bool:
    """Whether the CLI (JavaScript) takes ``value`` as set: an empty list or object is."""
    return not (value is None or value is False or value == ""
                or (type(value) in (int, float) and value == 0))


def _workspace_settings_override(request: Request, workspace: str, home: str) -> Response | None:
    """A refusal when the run's explicit ``auto_reject`` meets workspace settings that may allow
    tools past it.  A workspace that is the CLI's ``home`` has none: the CLI reads that file as
    the user's own settings."""
    approvals = None if request.policy is None else request.policy.approvals
    if approvals is None or approvals.permission != "auto_reject":
        return None
    if os.path.realpath(home) == workspace:
        return None
    path = os.path.join(workspace, ".gemini", "settings.json")
    try:
        # A dotfiles manager may link the file; a FIFO must not hold the run.
        text = _durable.read_small(path, _SETTINGS_LIMIT, follow_links=True).decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # unreadable: it may say anything
        found = [f"cannot be read: {exc}"]
    else:
        found = _allowing_settings(text)
        if not found:
            return None
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=(f"gemini cannot honour the policy's permission 'auto_reject': the workspace's "
                 f"settings {path} may allow tools ({', '.join(found)}); the CLI would obey them"),
        details={"kind": "policy_in_workspace_settings", "settings": path, "found": found},
    ))


# --- plan and argv ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    prompt: str
    model: str
    spawn_cwd: str | None
    session_cwd: str
    resume_id: str | None
    approval_mode: str
    env_layers: tuple[Mapping[str, str], ...]


def _plan(config: Config, request: Request) -> _Plan:
    spawn_cwd, session_cwd = _cli.cwds(config, request)
    resume_id, _ = _cli.resume_target(request, session_cwd,
                                      no_fork="gemini cannot fork a session")
    approvals = None if request.policy is None else request.policy.approvals
    permission = None if approvals is None else approvals.permission
    approval_mode = {"auto_approve": "yolo", "auto_reject": "default"}.get(
        permission or "", config.approval_mode)
    owned = {"GEMINI_CLI_HOME": config.home} if config.home else {}
    return _Plan(
        prompt=_cli.prompt_of(request),
        model=request.model_override or config.model,
        spawn_cwd=spawn_cwd,
        session_cwd=session_cwd,
        resume_id=resume_id,
        approval_mode=approval_mode,
        env_layers=(dict(config.env), dict(request.env), owned),
    )


def _argv(config: Config, plan: _Plan) -> list[str]:
    """The command line.  Checked against Gemini CLI 0.61.0 (``gemini --help``,
    shared/reference/real-clis.md §5): keep every flag decision here.  ``-p ""`` forces headless
    mode and leaves the prompt to stdin (``-p`` text is *appended* to stdin input), which keeps
    it out of argv and the spawn event."""
    argv = [config.command, "-p", "", "-o", "stream-json"]
    if plan.model:
        argv += ["-m", plan.model]
    if plan.resume_id is not None:
        argv += ["--resume", plan.resume_id]
    if plan.approval_mode:
        argv += ["--approval-mode", plan.approval_mode]
    return argv + list(config.extra_args)


# --- parsing ------------------------------------------------------------------------------------


class _Parser:
    """``gemini -o stream-json`` → events, transcript items and, at the end, a Response."""

    def __init__(self, sink: EventSink, plan: _Plan) -> None:
        self.sink = sink
        self.plan = plan
        self.protocol = Protocol(sink)
        self.session_id = ""
        self.model = plan.model
        self.segment: list[str] = []  # the assistant text being streamed
        self.text_id = ""
        self.final = ""
        self.open_tools: dict[str, str] = {}  # id -> name
        self.tool_names: dict[str, str] = {}
        self.result: dict[str, Any] | None = None
        self.last_error = ""
        # The CLI's own stop of a turn it judged looping: it still reports "success".
        self.stopped_looping = ""
        self.resume_problem = ""
        self.cut_mid_line = False  # stdout ended without its last line's newline

    def _item(self, **fields: Any) -> None:
        self.protocol.item(TranscriptItem(**fields))

    def feed(self, line: Line) -> None:
        if line.stream == "stderr":
            self.protocol.feed_stderr(line.data)
            if self.plan.resume_id and _RESUME_REJECTED.search(line.text):
                self.resume_problem = self.resume_problem or line.text.strip()
            return
        self.cut_mid_line = line.partial
        decoded = self.protocol.feed_stdout(line.data)
        if decoded is None or decoded.event is None:
            return
        event = decoded.event
        kind = as_str(event.get("type"))
        handler = self._HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)
        else:
            self._item(kind="system", subtype=kind or "unknown")
        if kind == "result":
            self.protocol.set_terminal(event, decoded.text)

    # -- event handlers --

    def _init(self, event: dict[str, Any]) -> None:
        self.session_id = as_str(event.get("session_id"))
        self.model = as_str(event.get("model")) or self.model
        self._item(kind="init", session_id=self.session_id, model=self.model)

    def _message(self, event: dict[str, Any]) -> None:
        content = as_str(event.get("content"))
        if event.get("role") != "assistant":
            if content:
                self._item(kind="user", text=content)
            return
        if not content:
            return
        if not self.text_id:
            self.text_id = self.protocol.fresh_id(f"{self.session_id or 'gemini'}/text")
            self.sink.emit(TextDelta(message_id=self.text_id, phase="start"))
        self.sink.emit(TextDelta(message_id=self.text_id, text=content, phase="content"))
        self.segment.append(content)

    def _close_text(self) -> None:
        if not self.text_id:
            return
        self.sink.emit(TextDelta(message_id=self.text_id, phase="end"))
        self.final = "".join(self.segment)
        self._item(kind="assistant", text=self.final, model=self.model)
        self.text_id, self.segment = "", []

    def _tool_use(self, event: dict[str, Any]) -> None:
        self._close_text()
        self.final = ""  # text before a tool call is not the final answer
        ident = as_str(event.get("tool_id")) or self.protocol.fresh_id("tool")
        name = as_str(event.get("tool_name")) or "tool"
        params = event.get("parameters")
        args = _nesting.copy(params) if isinstance(params, dict) else None
        if ident not in self.tool_names:
            self.tool_names[ident] = name
            self.open_tools[ident] = name
            self.sink.emit(ToolCall(id=ident, name=name, args=args, phase="start"))
        self._item(kind="tool_call", tool_use_id=ident, tool_name=name, input=args)

    def _tool_result(self, event: dict[str, Any]) -> None:
        self._close_text()
        ident = as_str(event.get("tool_id"))
        is_error = event.get("status") == "error"
        text = as_str(event.get("output"))
        if is_error and not text:
            text = as_str(as_dict(event.get("error")).get("message"))
        name = self.tool_names.get(ident, "")
        if ident in self.open_tools:
            del self.open_tools[ident]
            self.sink.emit(ToolCall(id=ident, name=name, result=text, phase="end"))
            self.sink.emit(ToolResult(id=ident, result=text, is_error=is_error))
        self._item(kind="tool_result", tool_use_id=ident or "unknown", tool_name=name, text=text,
                   is_error=is_error)

    def _error(self, event: dict[str, Any]) -> None:
        severity = as_str(event.get("severity")) or "error"
        message = as_str(event.get("message")) or "error"
        if severity == "error":
            self.last_error = message  # an error `result` that follows carries no message
        elif _LOOP_DETECTED.search(message):
            self.stopped_looping = message
        self._item(kind="system", subtype=severity, text=message)

    def _result(self, event: dict[str, Any]) -> None:
        self._close_text()
        self.result = event
        error = as_dict(event.get("error"))
        self._item(kind="result", subtype=as_str(event.get("status")),
                   is_error=event.get("status") != "success", session_id=self.session_id,
                   usage=_usage(event), text=as_str(error.get("message")))

    _HANDLERS: Final[Mapping[str, Callable[[_Parser, dict[str, Any]], None]]] = {
        "init": _init,
        "message": _message,
        "tool_use": _tool_use,
        "tool_result": _tool_result,
        "error": _error,
        "result": _result,
    }

    # -- the Response --

    @property
    def succeeded(self) -> bool:
        return self.result is not None and self.result.get("status") == "success"

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response:
        self._close_text()
        for ident, name in self.open_tools.items():  # started, never finished
            self.sink.emit(ToolCall(id=ident, name=name, phase="end"))
        self.open_tools = {}
        if self.resume_problem and not self.succeeded:
            raise ResumeRejectedError(self.resume_problem)
        failure = self._failure(exit_)
        checkpoint = None
        if failure is None and exit_.clean and self.succeeded and self.session_id:
            checkpoint = _cli.checkpoint(self.session_id, self.plan.session_cwd)
        metadata: dict[str, str] = {}
        if self.session_id:
            metadata["session_id"] = self.session_id
        models = as_dict(as_dict((self.result or {}).get("stats")).get("models"))
        if models:
            metadata["models"] = ",".join(models)
        if self.last_error:
            metadata["last_error"] = self.last_error
        if self.protocol.malformed:
            metadata["protocol"] = "malformed"
        return _cli.response(exit_, self.protocol, stdout, stderr,
                             terminal_event=None if self.result is None else "result",
                             output=self.final,
                             usage=None if self.result is None else _usage(self.result),
                             checkpoint=checkpoint, metadata=metadata, provider=PROVIDER,
                             model=self.model, failure=failure)

    def _failure(self, exit_: Exit) -> RunFailure | None:
        reported = None
        if self.result is not None and self.succeeded and self.stopped_looping:
            # The answer stops where the CLI cut the turn: a success would pass it off whole.
            reported = RunFailure(
                code="agent_error",
                message=f"gemini stopped the turn: {self.stopped_looping}",
                details={"kind": "loop_detected"},
            )
        elif self.result is not None and self.succeeded and not self.final \
                and not self.tool_names and not as_dict(self.result.get("stats")).get("models"):
            # No model was called, yet "success": the CLI judged (by its own estimate) that the
            # prompt would overflow the model's context window, and said nothing else.
            reported = provider_failure(
                "gemini answered without calling the model: the prompt does not fit the "
                "model's context window, by the CLI's estimate", "context_too_long")
        elif self.result is None and self.cut_mid_line and self.protocol.malformed \
                and exit_.exit_code == 0:
            # The CLI drops what its stdout pipe cannot take when it exits: a prompt over about
            # 1 MiB, which it echoes first, leaves its output cut there.
            reported = RunFailure(
                code="agent_error",
                message=("gemini exited with its output cut off mid-line (the CLI drops what its "
                         "stdout pipe cannot take when it exits; a prompt of over about 1 MiB, "
                         f"which it echoes, does that): {self.protocol.problems[0]}"),
                details={"kind": "protocol", "problems": self.protocol.problems[:5]})
        elif self.result is not None and not self.succeeded:
            error = as_dict(self.result.get("error"))
            message = as_str(error.get("message")) or self.last_error or "gemini reported an error"
            kind, status = _kind_of(message, exit_.exit_code)
            reported = provider_failure(message, kind, provider_status=status,
                                        error_type=as_str(error.get("type")) or None,
                                        exit_code=exit_.exit_code)
        return _cli.run_failure("gemini", exit_, self.protocol, reported=reported,
                                terminal=self.result is not None, died=_died)


def _died(died: RunFailure) -> RunFailure:
    """A death whose last words quote a provider error, or the CLI's own authentication exit,
    is that error."""
    kind, status = _kind_of(died.message, None)
    if not kind and died.details.get("exit_code") == _EXIT_AUTH:
        kind = "auth"
    if not kind:
        return died
    return died_as(died, kind, provider_status=status)


def _kind_of(message: str, exit_code: int | None) -> tuple[FailureKind, int | None]:
    """The failure class and HTTP status of an error the CLI reported.

    The status comes from the quoted API error (``"code": 401``), else from the exit code: for
    API errors the CLI calls ``process.exit(status)``, which the OS truncates to 8 bits, so
    exit 144-255 after an ``[API Error`` stands for HTTP 400-511.
    """
    # Only numbers the API or the CLI present as a status: stderr also holds timestamps and pids.
    status = _cli.quoted_status(message)
    if status is None and exit_code is not None and 144 <= exit_code <= 255 \
            and "[API Error" in message:
        status = exit_code + 256
    kind: FailureKind = _cli.lasting_kind(message)
    if not kind:
        if status in (401, 403) or _AUTH.search(message):
            kind = "auth"
        elif status == 429 or _RATE_LIMIT.search(message):
            kind = "rate_limit"
        elif (status is not None and status >= 500) or _UNAVAILABLE.search(message):
            kind = "provider_unavailable"
    return kind, status


def _usage(result: Mapping[str, Any]) -> Usage | None:
    stats = as_dict(result.get("stats"))
    if not stats:
        return None
    return Usage(
        input_tokens=as_int(stats.get("input_tokens")),
        output_tokens=as_int(stats.get("output_tokens")),
        cached_input_tokens=as_int(stats.get("cached")),
    )

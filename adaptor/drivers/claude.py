"""The ``claude`` driver: Claude Code (npm ``@anthropic-ai/claude-code``) in print mode.

::

    from adaptor.drivers import claude

    agent = adaptor.Agent(claude.Driver(claude.Config(model="claude-sonnet-4-5")))

Every run speaks stream-json both ways (``-p --input-format stream-json --output-format
stream-json --verbose``): the prompt goes in as one ``user`` frame on stdin, and the CLI's
NDJSON comes back as events, transcript items and a Response.  The exact argv is built in one
place, :func:`_argv`, checked against Claude Code 2.1.332.

- **Approvals.**  When the run's policy sets an approval mode that needs an answer from the
  host (permission ``ask``/``auto_reject``, any plan_review mode, any question mode), the CLI
  also gets ``--permission-prompt-tool stdio``: every ``can_use_tool`` control request becomes
  a ``sink.request_decision`` (``ExitPlanMode`` → plan_review with the plan in
  ``details["plan"]``, ``AskUserQuestion`` → question, anything else → permission) and the
  answer goes back as a ``control_response`` allow/deny.
  With no approval policy the CLI's own permission mode decides; a write it denies silently is
  kept visible as ``permission_denied`` transcript items and ``Result.metadata
  ["permission_denials"]``.  Permission ``auto_approve`` alone runs with
  ``--dangerously-skip-permissions`` (plus ``IS_SANDBOX=1`` as root, which the CLI requires).
- **Structured output.**  Native via ``--json-schema``.  The CLI reports
  ``structured_output: null`` and still says success when the model never produced a valid
  value, so ``output`` is then the final text and the SDK's own validation fails the run.
- **Sessions.**  ``--resume ID`` (fork adds ``--fork-session``).  A checkpoint is valid only
  when the turn ended with ``result``/``success`` carrying ``session_id``, with no failure, no
  malformed line and a clean exit.  "No conversation found" raises ``ResumeRejectedError``.
- **MCP servers and host tools.**  ``Request.mcp`` and the tool gateway
  (``Request.tools_endpoint.server``) are written to one ``--mcp-config`` JSON file (0600, in
  the process's private 0700 directory): stdio servers with their ``env``, http/sse servers
  with their headers, and a bearer variable as ``Authorization: Bearer ${VAR}``, which the CLI
  expands from its own environment, so the gateway's token is never written anywhere.  Host
  tools are pre-approved with ``--allowedTools mcp__adaptor__<name>`` (the host defined them;
  their handler refuses with ``tool.reject``); tools of declared servers go through the run's
  permission policy like any other CLI tool.  A required server (and the gateway) that the
  ``init`` event does not report ``connected`` fails the run: the CLI is stopped right there
  (its first model request may already be on its way).
- **Skills.**  Each ``Request.skills`` entry is linked as ``<dir>/.claude/skills/<runtime
  name>`` in the private directory and ``<dir>`` is passed with ``--add-dir``, from which Claude
  Code loads skills like project skills (they show in the ``init`` event's ``skills``).
- **Process reuse.**  A thread turn keeps its process alive afterwards (stream-json input
  accepts further ``user`` frames); the next turn of the same session with the same settings
  reuses it instead of starting the CLI again.  Idle processes are stopped after
  ``Config.idle_timeout`` seconds; ``close_processes`` (called by ``agent.close()``) stops all
  of them and no process is started for this driver's threads afterwards.  A run with skills,
  MCP servers or host tools never keeps its process: the staged skills and the tool gateway
  belong to that run (and its Agent), and a kept process would go on referring to them after
  they are gone.  Any process kept for the session by an earlier turn is stopped first, since
  its in-memory conversation would miss the turn made by the new one.

Failures follow drivers.md: API errors come back as ``subtype: "success"`` with
``is_error: true`` and ``api_error_status``; 401/403 and "Not logged in" are
``details.kind = "auth"``, 429 ``rate_limit`` and 5xx or an unreachable server
``provider_unavailable`` (both ``retryable``); a spent credit balance (``billing_error``), an
unknown model (``model_not_found``) and a prompt over the context window (``terminal_reason``
``prompt_too_long``) are ``quota``, ``model_not_found`` and ``context_too_long``, which no
retry mends.

Session compatibility (:meth:`Driver.session_config_fingerprint`) covers ``cwd``,
``extra_args``, ``model``, ``permission_mode``, ``config_dir`` and the *names* of ``env``;
``command``, ``grace_period`` and ``idle_timeout`` do not change a conversation.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import re
import secrets
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from adaptor import _durable, _nesting, _private_dirs
from adaptor.driver import (
    DecisionChoice,
    DecisionKind,
    DecisionResponse,
    Descriptor,
    EventSink,
    HumanDecisionSupport,
    MCPCaps,
    MCPServerSpec,
    ProcessCaps,
    QuestionSupport,
    Request,
    ResolvedSkill,
    Response,
    RunFailure,
    RunPolicyCaps,
    SessionCaps,
    SkillCaps,
    StreamCaps,
    StructuredOutputCaps,
    SystemPromptCaps,
)
from adaptor.drivers import _cli, _process
from adaptor.drivers._cli import content_text as _content_text
from adaptor.drivers._cli import control_response as _control_response
from adaptor.drivers._cli import envelope_usage as _usage
from adaptor.drivers._cli import snake as _snake
from adaptor.drivers._lines import (
    FailureKind,
    NullSink,
    Protocol,
    as_dict,
    as_int,
    as_list,
    as_str,
    lean,
    line_text,
    provider_failure,
    split_lines,
)
from adaptor.drivers._process import CannotStart, Child, Exit, Line, Spec
from adaptor.errors import ResumeRejectedError
from adaptor.events import Notice, SubagentUpdate, TextDelta, Thinking, ToolCall, ToolResult
from adaptor.result import StructuredOutput, TranscriptItem, Usage

__all__ = ["CLI_VERSION", "PERMISSION_MODES", "PROVIDER", "TYPE", "Config", "Driver", "replay"]

TYPE: Final = "claude"
PROVIDER: Final = "anthropic"
CLI_VERSION: Final = "2.1.332"

PERMISSION_MODES: Final = (
    "default", "acceptEdits", "auto", "bypassPermissions", "manual", "dontAsk", "plan"
)
# Flags the driver sets itself; in extra_args they would contradict what it parses or decides.
_OWNED_FLAGS: Final = frozenset({
    "-p", "--print", "--output-format", "--input-format", "--verbose",
    "--include-partial-messages", "--replay-user-messages", "--permission-prompt-tool",
    "-r", "--resume", "-c", "--continue", "--fork-session", "--session-id", "--json-schema",
    "--append-system-prompt", "--append-system-prompt-file", "--model", "--permission-mode",
    "--dangerously-skip-permissions", "--permission-prompts",
})
_NO_CONVERSATION = re.compile(
    r"no conversation found with session id|conversation with id .* not found|"
    r"failed to resume session",
    re.IGNORECASE,
)
_NOT_IN_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
_INITIALIZE: Final = orjson.dumps(
    {"type": "control_request", "request_id": "adaptor_init",
     "request": {"subtype": "initialize", "hooks": None}}
) + b"\n"


@dataclass(frozen=True)
class Config(_cli.CliConfig):
    """Claude Code's configuration.

    ``model`` is passed as ``--model`` (a run's ``model=`` wins); ``permission_mode`` as
    ``--permission-mode`` (one of :data:`PERMISSION_MODES`; empty: the CLI's default; one that
    decides without asking yields to permission ``ask``/``auto_reject``);
    ``config_dir`` becomes ``CLAUDE_CONFIG_DIR`` (the profile holding sessions, settings and
    credentials; ``None``: the CLI's default under ``$HOME``).  ``idle_timeout`` is how long a
    thread's process is kept for its next turn (0 turns reuse off).
    """

    command: str = "claude"
    permission_mode: str = ""
    config_dir: str | None = None
    idle_timeout: float = 300.0


class Driver(_cli.CliDriver[Config]):
    """The Claude Code driver.  Construction snapshots the config and does no I/O."""

    _type = TYPE
    _config_type = Config
    _fingerprint_domain = "claude/config/v1"
    _fingerprint_fields = ("cwd", "extra_args", "model", "permission_mode", "config_dir")
    # Read by claude 2.1.332 (found in its binary): an API key, a bearer token, an OAuth token.
    _credentials = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")

    def __init__(self, config: Config | Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self._pool = _Pool()

    # --- SPI: description and validation --------------------------------------------------------

    def descriptor(self) -> Descriptor:
        every_mode = HumanDecisionSupport(ask=True, auto_approve=True, auto_reject=True)
        return Descriptor(
            type=TYPE,
            display_name="Claude Code",
            sessions=SessionCaps(supports_resume=True),
            # Staged per run (--add-dir), nothing is left in the profile afterwards.
            skills=SkillCaps(supported=True, mode="ephemeral"),
            mcp=MCPCaps(supported=True, stdio=True, http=True, sse=True),
            instructions=True,
            workspace=True,
            process=ProcessCaps(persistent=True),
            # No sandbox, web-search or browser switch the driver can honour with a real flag.
            run_policy_caps=RunPolicyCaps(
                permission=every_mode,
                plan_review=copy.copy(every_mode),
                question=QuestionSupport(ask=True, auto_reject=True),
            ),
            structured_output=StructuredOutputCaps(
                native=True, prompt_validate=True, works_with_streaming=True
            ),
            system_prompt=SystemPromptCaps(append=True),
            stream=StreamCaps(native=True, token_level=True, reasoning=True, tool_call_args=True),
        )

    def _check(self, config: Config) -> None:
        _cli.check_config(config)
        _cli.check_choice("permission_mode", config.permission_mode, PERMISSION_MODES)
        _cli.check_optional_path("config_dir", config.config_dir)
        idle = config.idle_timeout
        if (not isinstance(idle, int | float) or isinstance(idle, bool)
                or not 0 <= idle < float("inf")):
            raise ValueError("idle_timeout: expected a finite number of seconds >= 0")
        _cli.check_owned_flags(config.extra_args, _OWNED_FLAGS)

    def close_processes(self, timeout: float | None = None) -> None:
        """Stop every kept process (idempotent); later thread turns start none to keep."""
        self._pool.close(timeout)

    # --- SPI: running ---------------------------------------------------------------------------

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config_for(request)
        refusal = _permission_overridden(request, config) or _tool_names_too_long(request)
        if refusal is not None:
            return refusal
        plan = _plan(config, request, persistent_allowed=not self._pool.closed)
        live = None
        if not plan.fork:
            # A process another Driver keeps for this session (its Agent's config differs by a
            # value that leaves the thread compatible, a rotated API key say) would miss this
            # turn in its in-memory conversation if a later turn of that Agent reused it.
            _Pool.discard_elsewhere(plan.resume_id, self._pool)
        if plan.reusable:
            live = self._pool.take(plan.resume_id, plan.signature, plan.resumed_turn)
        elif not plan.fork:
            # This turn continues the session in a new process: likewise for our own.
            self._pool.discard(plan.resume_id)
        if live is not None:
            sink.emit(Notice(kind="lifecycle", text="reusing the thread's claude process",
                             data={"phase": "driver.process_reused", "pid": live.child.pid}))
        else:
            try:
                live = _Live.start(config, plan, sink)
            except CannotStart as exc:
                return _process.cannot_start(exc)
        try:
            response, keep = _turn(live, plan, request, sink)
        except BaseException:
            live.close(config.grace_period)
            raise
        if keep and response.checkpoint is not None:
            live.session_id = response.checkpoint.state.resume_id
            live.turn = response.checkpoint.state.data.get(_TURN_KEY)
            self._pool.put(live, config.idle_timeout)
        else:
            live.close(config.grace_period)
        return response


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
    request: Request | None = None,
) -> Response:
    """Parse captured Claude Code stream-json output as if a run had produced it.

    For tests and diagnostics: the same parser and Response rules as a live run (control
    requests are recorded, not answered).  Raises ``ResumeRejectedError`` like ``run`` when
    ``request`` resumed a session the output says does not exist.
    """
    sink = sink or NullSink()
    request = request or Request(run_id="replay", prompt="")
    plan = _plan(Config(), request, persistent_allowed=False)
    parser = _Parser(sink, plan)
    lines = split_lines(stdout.encode() if isinstance(stdout, str) else stdout)
    while parser.feed_lines(lines) is not None:
        pass  # a control request: recorded, not answered
    for raw in split_lines(stderr.encode() if isinstance(stderr, str) else stderr):
        parser.feed_stderr(raw)
    exit_ = Exit(exit_code=exit_code, signal=None if exit_code is not None else 15)
    # The raw streams as given: text as it is (what decoding its encoding gives back), bytes
    # decoded only if the Response's raw_streams are read.
    return parser.response(exit_, stdout, stderr)


# --- one run's plan and argv --------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    prompt: str
    argv_model: str
    spawn_cwd: str | None
    session_cwd: str
    resume_id: str | None
    fork: bool
    interactive: bool
    skip_permissions: bool
    # An explicit permission policy of ask or auto_reject: no settings file of the workspace
    # may pre-approve tools past it (see _argv).
    guarded: bool
    permission_mode: str
    partial: bool
    schema: str | None
    append: str | None
    env_layers: tuple[Mapping[str, str], ...]
    persistent: bool
    spawn: bool
    signature: str
    mcp: tuple[MCPServerSpec, ...] = ()
    # The gateway token's variable: declared stdio servers (third-party code) must not get it.
    tools_token_env: str | None = None
    required_mcp: frozenset[str] = frozenset()
    allowed_tools: tuple[str, ...] = ()
    skills: tuple[ResolvedSkill, ...] = ()
    # False with extra_args' --no-session-persistence: no later process could resume a session
    # the CLI did not keep, so no turn of it makes a checkpoint.
    saves_sessions: bool = True
    # The resumed session's total_cost_usd as its last saved turn left it: a process that
    # resumes (or forks) the session counts on from it (see _Parser._usage).
    session_cost: float = 0.0
    # The token of the saved turn this run resumes (its checkpoint's "turn"): a kept process
    # is reused only when it made that very turn (see _Pool.take).
    resumed_turn: str | None = None

    @property
    def reusable(self) -> bool:
        return self.persistent and not self.spawn and self.resume_id is not None


def _plan(config: Config, request: Request, *, persistent_allowed: bool) -> _Plan:
    spawn_cwd, session_cwd = _cli.cwds(config, request)
    resume_id, fork = _cli.resume_target(request, session_cwd)
    session = request.session

    interactive, skip_permissions = _approval_transport(request)
    approvals = None if request.policy is None else request.policy.approvals
    guarded = approvals is not None and approvals.permission in ("ask", "auto_reject")
    permission_mode = config.permission_mode
    if guarded and (permission_mode or _settings_default_mode(config, request)) not in _cli.ASKING_PERMISSION_MODES:
        # The run's explicit policy wins over a configured mode that would decide without
        # asking, and over such a defaultMode in the user's settings (or one that cannot be
        # read: said on the command line, whatever the settings say).
        permission_mode = "default"
    schema = None
    if request.output_schema is not None and request.structured_output_source == "native":
        # Claude Code validates with a draft-07 engine that rejects the 2020-12 meta-schema id.
        document = {k: v for k, v in request.output_schema.schema.items() if k != "$schema"}
        schema = orjson.dumps(document).decode()
    prompt = _cli.prompt_of(request)
    owned: dict[str, str] = {}
    if config.config_dir:
        owned["CLAUDE_CONFIG_DIR"] = config.config_dir
    if skip_permissions and hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root the CLI refuses --dangerously-skip-permissions unless told it is sandboxed,
        # and only "1" tells it so: an inherited IS_SANDBOX=yes (some containers export it)
        # failed every such run.
        env_now = {**os.environ, **config.env, **request.env}
        if env_now.get("IS_SANDBOX") != "1" and "CLAUDE_CODE_BUBBLEWRAP" not in env_now:
            owned["IS_SANDBOX"] = "1"
    layers = (dict(config.env), dict(request.env), owned)
    servers = list(request.mcp)
    required = {s.key for s in request.mcp if s.required}
    allowed: tuple[str, ...] = ()
    endpoint = request.tools_endpoint
    if endpoint is not None:
        servers.append(endpoint.server)
        required.add(endpoint.server.key)  # without it the host's tools are missing
        allowed = tuple(_mcp_tool_name(endpoint.server.key, name) for name in endpoint.tools)
        if _TOOL_TIMEOUT_VAR not in {**os.environ, **config.env, **request.env}:
            # Claude Code gives up on an MCP call after 60 s by default and hands the model
            # "The operation timed out." while the host's handler runs on: a host tool (a
            # delegation to another agent) may take as long as its run.
            owned[_TOOL_TIMEOUT_VAR] = str(_tool_call_limit_ms(request))
    persistent = (
        persistent_allowed
        and config.idle_timeout > 0
        and session is not None
        and session.mode in ("continue_or_start", "continue_only")
        and schema is None
        # Per-run resources (staged skills, the Agent's gateway) must not outlive their run
        # inside a kept process.
        and not (request.skills or servers)
    )
    model = request.model_override or config.model
    signature = hashlib.sha256(
        orjson.dumps(
            [config.command, list(config.extra_args), permission_mode, model,
             interactive, skip_permissions, guarded, request.streaming, request.append_system_prompt or "",
             session_cwd, sorted({k: v for layer in layers for k, v in layer.items()}.items())]
        )
    ).hexdigest()
    return _Plan(
        prompt=prompt,
        argv_model=model,
        spawn_cwd=spawn_cwd,
        session_cwd=session_cwd,
        resume_id=resume_id,
        fork=fork,
        interactive=interactive,
        skip_permissions=skip_permissions,
        guarded=guarded,
        permission_mode=permission_mode,
        partial=request.streaming,
        schema=schema,
        append=request.append_system_prompt or None,
        env_layers=layers,
        persistent=persistent,
        spawn=request.spawn,
        signature=signature,
        mcp=tuple(servers),
        tools_token_env=None if endpoint is None else endpoint.server.bearer_token_env,
        required_mcp=frozenset(required),
        allowed_tools=allowed,
        skills=tuple(request.skills),
        saves_sessions="--no-session-persistence" not in _cli.flags_in(config.extra_args),
        session_cost=0.0 if resume_id is None else _stored_cost(request),
        resumed_turn=None if resume_id is None else _cli.stored_in_checkpoint(request, _TURN_KEY),
    )


_COST_KEY: Final = "cost_usd"
# A token of each saved turn, new every turn: a kept process made the thread's last saved turn
# only if it holds the token the thread's checkpoint has.  Another process (another program,
# the daemon) that ran a turn of the session since saved another token, and a process kept
# here never saw that turn.
_TURN_KEY: Final = "turn"


def _stored_cost(request: Request) -> float:
    """The session's running total_cost_usd its checkpoint keeps (0: none, or changed by hand)."""
    try:
        cost = float(_cli.stored_in_checkpoint(request, _COST_KEY) or 0.0)
    except ValueError:
        return 0.0
    return cost if math.isfinite(cost) and cost >= 0 else 0.0


# What extra_args may hold under an explicit permission policy of ask or auto_reject: flags
# known not to pre-approve tools.  Others may: a settings object or file (permissions.allow,
# hooks that allow), a plugin's or a session agent's hooks, a permission bypass to switch on,
# and flags its --help does not list load plugins and settings too (--plugin-dir-no-mcp,
# --managed-settings), so the CLI would never ask and the policy would not hold.
_SAFE_WHEN_GUARDED: Final = frozenset({
    "--add-dir", "--autocompact", "--ax-screen-reader", "--bare", "--betas", "--brief",
    "-d", "--debug", "--debug-file", "--disable-slash-commands", "--disallowed-tools",
    "--disallowedTools", "--effort", "--exclude-dynamic-system-prompt-sections",
    "--fallback-model", "--forward-subagent-text", "--include-hook-events", "--max-budget-usd",
    "--max-turns", "--max-thinking-tokens", "--mcp-config", "--strict-mcp-config", "-n", "--name",
    "--no-chrome", "--no-session-persistence", "--prompt-suggestions", "--restricted",
    "--safe-mode", "--system-prompt", "--system-prompt-file", "--system-prompt-snapshot",
    "--tools",
})
# Variables that load plugins or settings, or skip permission checks, as Claude Code 2.1.332
# reads them: refused under such a policy when the run's config sets them, and kept from the
# CLI when it would inherit them.
_PRE_APPROVING_ENV: Final = frozenset({
    "CLAUDE_CODE_PLUGIN_DIRS", "CLAUDE_CODE_PLUGIN_SEED_DIR", "CLAUDE_CODE_DESKTOP_SKILLS_PLUGIN_DIR",
    "CLAUDE_CODE_USE_COWORK_PLUGINS", "CLAUDE_CODE_SYNC_PLUGINS", "CLAUDE_CODE_SYNC_PLUGIN_INSTALL",
    "CLAUDE_CODE_REMOTE_SETTINGS_PATH", "CLAUDE_CODE_MOCK_REMOTE_SETTINGS",
    "CLAUDE_CODE_MANAGED_SETTINGS_PATH", "CLAUDE_CODE_EVEN_MORE_DANGEROUSLY_SKIP_PERMISSIONS",
    "CLAUDE_BG_SESSION_PERMISSION_RULES",
})
_GUARDED_PERMISSIONS: Final = frozenset({"ask", "auto_reject"})
_FLAG: Final = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")


def _permission_overridden(request: Request, config: Config) -> Response | None:
    """A refusal when the run's explicit permission policy asks or rejects and the config's
    ``extra_args`` or ``env`` could pre-approve tools past it."""
    # (A separate value that starts with "-" but names no flag, "- be terse", is a value.)
    flags = [flag for flag in _cli.flags_in(config.extra_args) if _FLAG.fullmatch(flag)]
    refusal = _cli.permission_overridden(
        "claude", request, flags, frozenset(flags) - _SAFE_WHEN_GUARDED, _GUARDED_PERMISSIONS,
        "they may pre-approve tools: only flags known not to may go with it")
    if refusal is not None:
        return refusal
    approvals = None if request.policy is None else request.policy.approvals
    found = sorted(_PRE_APPROVING_ENV & {*config.env, *request.env})
    if approvals is None or approvals.permission not in _GUARDED_PERMISSIONS or not found:
        return None
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"claude cannot honour the policy's permission {approvals.permission!r}: the "
                f"config's env sets {', '.join(found)}, which may pre-approve tools",
        details={"kind": "policy_in_env", "env": found},
    ))


_TOOL_TIMEOUT_VAR: Final = "MCP_TOOL_TIMEOUT"
# Node's timers take at most 2**31-1 ms (about 24.8 days); a longer delay fires at once.
_LONGEST_TIMER_MS: Final = 2**31 - 1


def _tool_call_limit_ms(request: Request) -> int:
    """How long claude may wait on one MCP tool call: until the run's deadline (the run ends
    the call then), or as long as its timers go."""
    if request.deadline is None:
        return _LONGEST_TIMER_MS
    left = (request.deadline - datetime.now(UTC)).total_seconds()
    return min(max(int(left * 1000) + 1000, 60_000), _LONGEST_TIMER_MS)


# The longest tool name Anthropic's API takes: Claude Code leaves out, without a word to the
# run, an MCP tool whose mcp__<server>__<tool> name is longer.
_MAX_TOOL_NAME: Final = 128


def _tool_names_too_long(request: Request) -> Response | None:
    """A refusal for host tools whose names claude would drop: the model could never call them."""
    endpoint = request.tools_endpoint
    if endpoint is None:
        return None
    longest = _MAX_TOOL_NAME - len(_mcp_tool_name(endpoint.server.key, ""))
    dropped = sorted(name for name in endpoint.tools if len(_mcp_tool_name(endpoint.server.key, name)) > _MAX_TOOL_NAME)
    if not dropped:
        return None
    shown = ", ".join(repr(name[:40] + "...") for name in dropped[:3])
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"claude cannot offer host tools with names over {longest} characters (its API takes "
                f"mcp__{endpoint.server.key}__<name> names up to {_MAX_TOOL_NAME}): {shown}",
        details={"kind": "tool_name_too_long", "tools": dropped},
    ))


_SETTINGS_LIMIT: Final = 1024 * 1024


def _settings_default_mode(config: Config, request: Request) -> str:
    """``permissions.defaultMode`` of the user's settings the CLI loads (``<profile>/settings.json``),
    or ``""`` when there is none or it cannot be read."""
    env = {**os.environ, **config.env, **request.env}
    profile = (config.config_dir or env.get("CLAUDE_CONFIG_DIR")
               or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".claude"))
    try:
        # A dotfiles manager may link the file; a FIFO must not hold the run.
        data = _durable.read_small(os.path.join(profile, "settings.json"), _SETTINGS_LIMIT,
                                   follow_links=True)
        mode = as_dict(as_dict(orjson.loads(data)).get("permissions")).get("defaultMode")
    except (OSError, ValueError):  # (orjson.JSONDecodeError is a ValueError)
        return ""
    return mode if isinstance(mode, str) else ""


def _approval_transport(request: Request) -> tuple[bool, bool]:
    """(interactive, skip_permissions) from the run's *explicit* approval modes.

    Inherited modes keep the CLI's own permission handling: a run without an approval policy
    must not hang on a prompt nobody will answer.
    """
    approvals = None if request.policy is None else request.policy.approvals
    if approvals is None:
        return False, False
    interactive = (
        approvals.permission in ("ask", "auto_reject")
        or approvals.plan_review is not None
        or approvals.question is not None
    )
    return interactive, not interactive and approvals.permission == "auto_approve"


def _argv(config: Config, plan: _Plan, files: _Files) -> list[str]:
    """The command line.  Checked against Claude Code 2.1.332 (``claude --help``,
    shared/reference/real-clis.md §3): keep every flag decision here.

    ``--add-dir``, ``--mcp-config`` and ``--allowedTools`` take several values; each is followed
    by another flag, and the prompt travels on stdin, so none of them swallows an argument.
    Repeated in ``extra_args`` they add to the driver's values."""
    argv = [config.command, "-p", "--input-format", "stream-json",
            "--output-format", "stream-json", "--verbose"]
    if plan.partial:
        argv.append("--include-partial-messages")
    if plan.interactive:
        argv += ["--permission-prompt-tool", "stdio"]
    if plan.skip_permissions:
        argv.append("--dangerously-skip-permissions")
    if plan.guarded:
        # The workspace's .claude/settings.json and settings.local.json (a cloned repository's)
        # may allow tools or hold hooks that approve them: only the user's own settings load.
        argv += ["--setting-sources", "user"]
    if plan.permission_mode:
        argv += ["--permission-mode", plan.permission_mode]
    if plan.argv_model:
        argv += ["--model", plan.argv_model]
    if plan.resume_id is not None:
        argv += ["--resume", plan.resume_id]
        if plan.fork:
            argv.append("--fork-session")
    if plan.schema is not None:
        argv += ["--json-schema", plan.schema]
    if files.append is not None:
        argv += ["--append-system-prompt-file", files.append]
    if files.mcp_config is not None:
        argv += ["--mcp-config", files.mcp_config]
    if plan.allowed_tools:
        argv += ["--allowedTools", ",".join(plan.allowed_tools)]
    if files.skills_dir is not None:
        argv += ["--add-dir", files.skills_dir]
    argv += config.extra_args
    return argv


def _mcp_tool_name(server: str, tool: str) -> str:
    # Claude Code's own normalization of MCP names (checked with a tool named "my.tool").
    return f"mcp__{_NOT_IN_TOOL_NAME.sub('_', server)}__{_NOT_IN_TOOL_NAME.sub('_', tool)}"


def _mcp_config(servers: tuple[MCPServerSpec, ...], withheld: str | None = None) -> dict[str, Any]:
    """The ``--mcp-config`` document.  ``env`` and header values are secrets: the caller
    writes this to a 0600 file only.  A bearer variable becomes ``${VAR}``, which the CLI
    expands from its own environment, so the token itself is never written.  ``withheld``
    (the tool gateway's token variable) is emptied for stdio servers, which start with the
    CLI's environment: a declared server does not inherit the token (code running as the same
    user can still read the CLI's environment)."""
    rendered: dict[str, Any] = {}
    for server in servers:
        entry: dict[str, Any]
        if server.transport == "stdio":
            entry = {"type": "stdio", "command": server.command, "args": list(server.args)}
            env = {**({withheld: ""} if withheld else {}), **server.env}
            if env:
                entry["env"] = env
        else:
            entry = {"type": server.transport, "url": server.url}
            headers = dict(server.headers)
            if server.bearer_token_env:
                headers["Authorization"] = "Bearer ${" + server.bearer_token_env + "}"
            if headers:
                entry["headers"] = headers
        rendered[server.key] = entry
    return {"mcpServers": rendered}


# --- the process and one turn -------------------------------------------------------------------


@dataclass(frozen=True)
class _Files:
    """The per-process files the command line points at, all inside the process's private
    (0700) directory, which is removed with the process."""

    append: str | None = None
    mcp_config: str | None = None
    skills_dir: str | None = None

    @classmethod
    def write(cls, private: str, plan: _Plan) -> _Files:
        append = mcp_config = skills_dir = None
        if plan.append is not None:
            # A file, not an argv element: no command-line limit, and the text stays out of
            # the spawn event.
            append = os.path.join(private, "append-system-prompt.txt")
            # 0600 whatever the umask, as every file of the run (open() made it 0666 under 000).
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            with os.fdopen(os.open(append, flags, 0o600), "w", encoding="utf-8") as handle:
                handle.write(plan.append)
        if plan.mcp:
            # mkstemp creates the file 0600: it may hold env and header values.
            fd, mcp_config = tempfile.mkstemp(prefix="mcp-", suffix=".json", dir=private)
            with os.fdopen(fd, "wb") as handle:
                handle.write(orjson.dumps(_mcp_config(plan.mcp, plan.tools_token_env)))
        if plan.skills:
            # Claude Code loads <dir>/.claude/skills/* from every --add-dir directory.  The
            # directory holds only these links, so the access --add-dir grants covers nothing
            # else of this run (the MCP config stays outside it).
            skills_dir = os.path.join(private, "skills")
            root = os.path.join(skills_dir, ".claude", "skills")
            os.makedirs(root, mode=0o700)
            for skill in plan.skills:
                os.symlink(skill.path, os.path.join(root, skill.runtime_name),
                           target_is_directory=True)
        return cls(append, mcp_config, skills_dir)


class _Live:
    """One Claude Code process and the private directory its files live in."""

    def __init__(self, child: Child, private: str, signature: str) -> None:
        self.child = child
        self.private = private
        self.signature = signature
        self.session_id = ""
        self.turn: str | None = None  # the token of the saved turn this process made last
        self.idle_since = time.monotonic()
        self.turns = 0
        self.cost_reported = 0.0  # the process's running total_cost_usd, as its last turn said

    @classmethod
    def start(cls, config: Config, plan: _Plan, sink: EventSink) -> _Live:
        private = _private_dirs.make("claude")
        try:
            files = _Files.write(private, plan)
            env, names = _process.child_env(*plan.env_layers)
            if plan.guarded:
                for name in _PRE_APPROVING_ENV:  # inherited (the config's refused the run)
                    env.pop(name, None)
            spec = Spec(
                argv=_argv(config, plan, files),
                env=env,
                env_names=names,
                cwd=plan.spawn_cwd,
                stdin="driven",
                grace_period=config.grace_period,
            )
            child = Child.start(spec, sink)
        except BaseException:
            _private_dirs.remove(private)
            raise
        return cls(child, private, plan.signature)

    def close(self, grace: float | None = None) -> None:
        """End the process (EOF first, the group's SIGTERM/SIGKILL if it lingers), reap it and
        remove its private files.  Safe on a process that already ended."""
        if self.child.alive:
            self.child.close_stdin()
            until = time.monotonic() + (self.child.spec.grace_period if grace is None else grace)
            while self.child.alive and time.monotonic() < until:
                time.sleep(0.02)
            if self.child.alive:
                self.child.terminate()
            for _ in self.child.lines(NullSink()):
                pass
        self.child.finish()
        _private_dirs.remove(self.private)


def _turn(live: _Live, plan: _Plan, request: Request, sink: EventSink) -> tuple[Response, bool]:
    """Deliver one prompt and read its turn; returns the Response and whether to keep the
    process for the next turn."""
    child = live.child
    parser = _Parser(sink, plan)
    if live.turns == 0:
        live.cost_reported = plan.session_cost  # a resumed session counts on from its total
    parser.cost_before = live.cost_reported
    deadline = _process.monotonic_deadline(request.deadline)
    keep = False
    with child.watch(sink.cancelled, deadline):
        if live.turns == 0:
            child.send(_INITIALIZE)
        live.turns += 1
        frame = {"type": "user", "message": {"role": "user", "content": plan.prompt},
                 "parent_tool_use_id": None, "session_id": ""}
        child.send(orjson.dumps(frame) + b"\n")
        for line in child.lines(sink):
            control = parser.feed(line)
            if parser.mcp_unavailable:
                child.terminate()
                break
            if _cli.stopped_at_unreadable(child, parser.protocol, line):
                break
            if control is not None:
                _answer(child, control, parser, sink)
            # A subagent still running after the prompt's result may need approvals: the
            # input stays open for them until it ends.
            if parser.terminal_seen and not parser.may_still_ask:
                break
        keep = (
            plan.persistent
            # (Background tasks' outcomes come in turns of the CLI's own, even while it idles.)
            and not parser.tasks_started
            and parser.succeeded
            and child.alive
            and not sink.cancelled.is_set()
        )
        if keep:
            exit_ = Exit(exit_code=0, signal=None)
        else:
            # The turn is over (or the process is): EOF lets the CLI exit; anything it prints
            # on the way out is still parsed (an event after the terminal is malformed).
            child.close_stdin()
            if not parser.end_process:
                for line in child.lines(sink):
                    parser.feed(line)
                    if parser.end_process:
                        break
            if parser.end_process:
                # The answer is in, and the CLI would wait for its background shells (for
                # ever, a server's): they end with the run, as every process of a run does.
                child.terminate()
                for _ in child.lines(NullSink()):
                    pass
                child.finish()
                exit_ = Exit(exit_code=0, signal=None)
            else:
                exit_ = child.finish()
    if parser.cost_total is not None:
        live.cost_reported = parser.cost_total
    stdout, stderr = child.take_raw()
    response = parser.response(exit_, stdout, stderr)
    metadata = dict(response.metadata)
    metadata.update(pid=str(child.pid), process="reused" if live.turns > 1 else "spawned")
    response = dataclasses.replace(response, metadata=metadata)
    return response, keep


def _answer(child: Child, control: dict[str, Any], parser: _Parser, sink: EventSink) -> None:
    """Answer one control request from the CLI on its stdin."""
    request_id = control.get("request_id")
    body = as_dict(control.get("request"))
    if body.get("subtype") != "can_use_tool":
        child.send(_control_response(request_id, error=f"unsupported: {body.get('subtype')}"))
        return
    tool = as_str(body.get("tool_name")) or "tool"
    tool_input = as_dict(body.get("input"))
    tool_use_id = as_str(body.get("tool_use_id"))
    kind: DecisionKind = (
        "plan_review" if tool == "ExitPlanMode"
        else "question" if tool == "AskUserQuestion"
        else "permission"
    )
    payload: dict[str, Any] = {"tool_name": tool, "input": _nesting.copy(tool_input)}
    for key in ("description", "blocked_path", "decision_reason"):
        if isinstance(body.get(key), str):
            payload[key] = body[key]
    if kind == "plan_review":
        # The CLI puts the plan file's text in the input; else the model's own argument.
        payload["plan"] = as_str(tool_input.get("plan")) or parser.exit_plans.get(tool_use_id, "")
    # (An AskUserQuestion call takes up to four questions: each is a decision.)
    decision, answers = _cli.decide_in_turn(
        sink, kind, _decision_texts(kind, tool, body, tool_input), source=f"claude.{_snake(tool)}",
        tool_call_id=tool_use_id, payload=payload,
        decided=lambda made: parser.decision(kind, tool, tool_use_id, made))
    reply: dict[str, Any]
    if decision.result in ("approved", "answered"):
        updated = dict(tool_input)
        if kind == "question":
            updated["answers"] = answers
        reply = {"behavior": "allow", "updatedInput": updated}
    else:
        reply = {"behavior": "deny", "message": decision.text or _DENY_MESSAGES[kind]}
        if decision.result == "aborted":
            reply["interrupt"] = True
    child.send(_control_response(request_id, response=reply))
    if decision.result == "aborted":
        # The SDK has already decided the verdict; the process must not go on.
        child.terminate("cancelled")


_DENY_MESSAGES: Final[Mapping[str, str]] = {
    "permission": "Permission denied by user.",
    "plan_review": "User rejected the plan.",
    "question": "User declined to answer.",
}


def _decision_texts(
    kind: DecisionKind, tool: str, body: Mapping[str, Any], tool_input: Mapping[str, Any]
) -> list[tuple[str, tuple[DecisionChoice, ...], str]]:
    """What to ask, one ``(title, choices, question)`` per decision: one per question of an
    ``AskUserQuestion`` call (at least one), else one."""
    if kind == "question":
        return _cli.asked_questions(tool_input, "Claude has a question")
    if kind == "plan_review":
        return [("Review Claude's plan", (), "")]
    description = as_str(body.get("description"))
    return [(description or f"Allow {tool}?", (), "")]


# --- parsing ------------------------------------------------------------------------------------


# Events and transcript items built without the dataclass __init__ (see lean): the parser makes
# one per streamed token.
_TextDelta: Final = lean(TextDelta)
_Thinking: Final = lean(Thinking)
_ToolCall: Final = lean(ToolCall)
_Item: Final = lean(TranscriptItem)
_DELTAS: Final[Mapping[str, Callable[..., TextDelta | Thinking]]] = {
    "text": _TextDelta, "thinking": _Thinking,
}
# The same, for the shapes the parser builds once or more per line (a token, a block's start and
# end, a tool call, an assistant message): taking their fields positionally is measurably cheaper.
_text_content: Final = lean(TextDelta, "message_id", "text", phase="content")
_thinking_content: Final = lean(Thinking, "message_id", "text", phase="content")
_STARTS: Final[Mapping[str, Callable[[str], TextDelta | Thinking]]] = {
    "text": lean(TextDelta, "message_id", phase="start"),
    "thinking": lean(Thinking, "message_id", phase="start"),
}
_ENDS: Final[Mapping[str, Callable[[str], TextDelta | Thinking]]] = {
    "text": lean(TextDelta, "message_id", phase="end"),
    "thinking": lean(Thinking, "message_id", phase="end"),
}
_tool_start: Final = lean(ToolCall, "id", "name", "args", phase="start")
_tool_args: Final = lean(ToolCall, "id", "args_delta", phase="content")
_tool_end: Final = lean(ToolCall, "id", "name", "result", phase="end")
_tool_result: Final = lean(ToolResult, "id", "result", "is_error")
_assistant_item: Final = lean(TranscriptItem, "text", "model", kind="assistant")
_tool_call_item: Final = lean(TranscriptItem, "tool_use_id", "tool_name", "input",
                              kind="tool_call")
_tool_result_item: Final = lean(TranscriptItem, "tool_use_id", "tool_name", "text", "is_error",
                                kind="tool_result")
_loads: Final = orjson.loads


class _Parser:
    """Claude stream-json → events, transcript items and, at the end, a Response."""

    def __init__(self, sink: EventSink, plan: _Plan) -> None:
        self.sink = sink
        self.emit = sink.emit
        self.plan = plan
        self.protocol = Protocol(sink)
        self.model = ""
        self.version = ""
        self.final: list[str] = []
        self.result: dict[str, Any] | None = None
        self.api_error: dict[str, Any] = {}
        self.rejected_resume = ""
        self.tool_names: dict[str, str] = {}
        self.open_tools: set[str] = set()
        self.open_blocks: dict[int, tuple[str, str]] = {}  # index -> (kind, lifecycle id)
        self.streamed: set[str] = set()
        # Streamed messages no assistant line has confirmed yet -> their text and thinking
        # lifecycle ids: a block cut off before the CLI retried or resumed its call never is.
        self.unconfirmed: dict[str, list[str]] = {}
        self.unconfirmed_tools: dict[str, list[str]] = {}  # ... and their tool calls' ids
        self.message = ""
        self.assistant_lines = 0
        self.denials: list[Any] = []
        # tool_use id -> the plan the model passed to ExitPlanMode, which the CLI leaves out
        # of its can_use_tool request when no plan file was written.
        self.exit_plans: dict[str, str] = {}
        self.mcp_unavailable: dict[str, str] = {}  # required server -> status the CLI reported
        # The CLI's latest retried API failure: all a run that its deadline ends while the CLI
        # backs off (a bad key, a rate limit) can say about why it never answered.
        self.last_error = ""
        # Background tasks the run started (task_started) or heard of, by id, until their
        # outcome was handed over (task_notification): the Agent tool's subagents (local_agent),
        # workflows, background shells (local_bash), monitors.  The CLI hands each outcome to
        # the model in a turn of its own after the result, so once one was started a result is
        # provisional (the latest kept with its line) and the run ends at the CLI's last; but a
        # shell or a monitor may run for ever (a server, a WebSocket), so a result with only
        # such tasks still running (none of _AGENT_TASKS) ends the run, and the process with
        # them (end_process).
        self.tasks_started = False
        self.pending_tasks: dict[str, str] = {}
        self.end_process = False
        # A task's outcome came (task_notification) after the model's last request of the
        # turn (system status "requesting"): the CLI hands it over in a turn of its own next.
        self.outcome_to_hand_over = False
        # Whether the current turn called the model, and whether the prompt's turn has ended:
        # a resumed CLI first hands an earlier process's task outcome over in a turn of its
        # own, without the model; its result is not the prompt's (whose approvals are still
        # to be answered, so the input stays open).
        self.turn_called_model = False
        self.prompt_turn_ended = False
        # A turn has begun (init, or the model called) and its result has not come yet.
        self.turn_open = False
        self.provisional: tuple[dict[str, Any], str] | None = None
        self.usages: list[Usage] = []
        # A result's total_cost_usd counts every turn of its process so far: what a kept
        # process had reported before this turn, and what this turn's last result says.
        self.cost_before = 0.0
        self.cost_total: float | None = None

    @property
    def terminal_seen(self) -> bool:
        return self.prompt_turn_ended

    @property
    def may_still_ask(self) -> bool:
        """Whether the CLI may still ask for an approval that its input must carry back: a
        subagent runs (the CLI tells when it ends), or a turn is under way (its result will
        come).  A shell asks nothing once started, and an outcome still to be handed over is
        no sure sign of a turn to come: the input is closed then, as the CLI needs to exit."""
        return self.turn_open or self._agents_pending()

    def _agents_pending(self) -> bool:
        """Whether a background task of an agent's kind runs (a subagent, a workflow of them):
        such a task ends on its own and reports back; a shell or a monitor may run for ever."""
        return any(task_type in _AGENT_TASKS for task_type in self.pending_tasks.values())

    @property
    def succeeded(self) -> bool:
        result = self.result
        return (
            result is not None
            and result.get("subtype") == "success"
            and result.get("is_error") is not True
            and not self.protocol.malformed
        )

    def _item(self, **fields: Any) -> None:
        self.protocol.item(_Item(**fields))

    def feed(self, line: Line) -> dict[str, Any] | None:
        """One line; returns a control request the caller must answer."""
        if line.stream == "stderr":
            self.feed_stderr(line.data)
            return None
        return self.feed_stdout(line.data)

    def feed_stderr(self, data: bytes) -> None:
        self.protocol.feed_stderr(data)
        if self.plan.resume_id:
            text = data.decode("utf-8", "replace")
            if _NO_CONVERSATION.search(text):
                self.rejected_resume = text.strip()

    def feed_stdout(self, data: bytes) -> dict[str, Any] | None:
        """One stdout line; returns a control request the caller must answer."""
        return self.feed_lines((data,))

    def feed_lines(self, lines: Iterable[bytes]) -> dict[str, Any] | None:
        """Stdout lines, until one is a control request, which is returned (an iterator keeps
        the lines after it); None when ``lines`` ran out.

        Each line is decoded here first: a long run is all JSON objects.  Any line that is not
        one, and any line after the terminal event, goes to ``Protocol.event``, whose rules
        decide it (text, blank, malformed, after the terminal).  For an object before the
        terminal both routes give the same event (see ``Protocol.event``).

        Most lines of a streamed run are token deltas: they are handled right in this loop,
        with what they need in local variables and every check inline (no ``as_*`` helpers),
        in the order that decides a delta soonest."""
        protocol = self.protocol
        emit = self.emit
        open_blocks = self.open_blocks
        loads = _loads
        for data in lines:
            try:
                event = loads(data)
            except orjson.JSONDecodeError:
                event = None
            if type(event) is not dict or protocol.terminal is not None:
                event = protocol.event(data)
                if event is None:
                    continue
            kind = event.get("type")
            if kind == "stream_event":
                inner = event.get("event")
                if type(inner) is not dict or event.get("parent_tool_use_id"):
                    continue  # (a subagent's: its assistant lines say what it wrote)
                what = inner.get("type")
                index = inner.get("index")
                if what != "content_block_delta":
                    if what == "content_block_stop":  # one per block: inline too
                        if isinstance(index, int) and index in open_blocks:
                            btype, ident = open_blocks.pop(index)
                            if btype != "tool":
                                emit(_ENDS[btype](ident))
                    # message_delta and message_stop change nothing the parser keeps.
                    elif what == "message_start" or what == "content_block_start":
                        self._stream_event(what, index, inner)
                    continue
                delta = inner.get("delta")
                if not (isinstance(index, int) and index in open_blocks
                        and type(delta) is dict):
                    continue
                btype, ident = open_blocks[index]
                if btype == "text":
                    text = delta.get("text")
                    if text and type(text) is str:  # empty deltas carry nothing
                        emit(_text_content(ident, text))
                elif btype == "thinking":
                    text = delta.get("thinking")
                    if text and type(text) is str:
                        emit(_thinking_content(ident, text))
                elif ident in self.open_tools:
                    partial = delta.get("partial_json")
                    if partial and type(partial) is str:
                        emit(_tool_args(ident, partial))
                continue
            # The other events by how often they come (no table lookup: a few per turn).
            if kind == "assistant":
                self._assistant(event)
            elif kind == "user":
                self._user(event)
            elif kind == "system":
                if event.get("subtype") != "status":
                    self._system(event)
                elif event.get("status") == "requesting":  # the model is called
                    self.turn_called_model = True
                    self.turn_open = True
                    self.outcome_to_hand_over = False  # (the request carries what came)
            elif kind == "result":
                self.turn_open = False
                self._result(event)
                handed_over = self.outcome_to_hand_over and not self.turn_called_model
                self.prompt_turn_ended = self.prompt_turn_ended or not (
                    handed_over and event.get("subtype") == "success")
                if self.tasks_started and (
                    not self.pending_tasks or self._agents_pending() or self.outcome_to_hand_over
                    or not self.prompt_turn_ended
                ):
                    self.provisional = (event, line_text(data))  # turns of the CLI's may follow
                else:
                    self.end_process = self.tasks_started  # (only shells or monitors still running)
                    self.provisional = None
                    protocol.set_terminal(event, line_text(data))
            elif kind == "control_request":
                control: dict[str, Any] = event
                return control
        return None

    # -- event handlers --

    def _system(self, event: dict[str, Any]) -> None:
        subtype = as_str(event.get("subtype"))  # not "status": feed_lines skips those
        if subtype == "init":
            self.turn_called_model = False
            self.turn_open = True
            if self.provisional is not None:
                self.final = []  # a follow-up turn (see background): its answer is the run's
            self.model = as_str(event.get("model")) or self.model
            self.version = as_str(event.get("claude_code_version"))
            servers = [
                {"name": as_str(s.get("name")), "status": as_str(s.get("status"))}
                for s in event.get("mcp_servers") or () if isinstance(s, dict)
            ]
            skills = [name for name in as_list(event.get("skills")) if isinstance(name, str)]
            self._item(kind="init", model=self.model, session_id=as_str(event.get("session_id")),
                       metadata={"cwd": as_str(event.get("cwd")),
                                 "permission_mode": as_str(event.get("permissionMode")),
                                 "claude_code_version": self.version, "mcp_servers": servers,
                                 "skills": skills})
            status = {s["name"]: s["status"] for s in servers}
            self.mcp_unavailable = {
                key: status.get(key) or "missing"
                for key in sorted(self.plan.required_mcp) if status.get(key) != "connected"
            }
        elif subtype == "api_retry":
            meta = {k: event.get(k) for k in ("attempt", "max_retries", "retry_delay_ms",
                                              "error_status", "error")}
            http = as_int(event.get("error_status"))
            why = as_str(event.get("error")) or "unknown"
            self.last_error = (f"API request failed ({why}{f', HTTP {http}' if http else ''});"
                               f" retry {event.get('attempt')} of {event.get('max_retries')}")
            self._abandon_unconfirmed()
            self._item(kind="system", subtype="api_retry", metadata=meta, text=self.last_error)
        elif subtype in _BACKGROUND_SUBTYPES:
            task_id = as_str(event.get("task_id"))
            if subtype == "task_started" and task_id:
                self.tasks_started = True
                self.pending_tasks[task_id] = as_str(event.get("task_type"))
            elif subtype == "task_notification":
                # (Also of a task an earlier process of the session started: a resumed CLI hands
                # it over in a turn of its own before the prompt's.)
                self.tasks_started = True
                self.outcome_to_hand_over = True
                self.pending_tasks.pop(task_id, None)
            self._item(kind="system", subtype=subtype)
        elif subtype == "permission_denied":
            self._item(kind="system", subtype="permission_denied",
                       text=as_str(event.get("message")) or "permission denied",
                       tool_name=as_str(event.get("tool_name")),
                       tool_use_id=as_str(event.get("tool_use_id")))
        elif subtype:
            self._item(kind="system", subtype=subtype)

    def _stream_event(self, kind: str, index: object, inner: dict[str, Any]) -> None:
        """A ``stream_event`` of type ``kind`` that starts a message or a block (``feed_lines``
        handles the others)."""
        if kind == "message_start":
            message = inner.get("message")
            message_id = message.get("id") if isinstance(message, dict) else None
            self.message = (message_id if message_id and isinstance(message_id, str)
                            else f"m{self.assistant_lines}")
            self.streamed.add(self.message)
            # A message cut after a finished block is resumed by the CLI in a new one: the
            # model is given the finished blocks only, so the cut one's text is abandoned.
            self._abandon_unconfirmed()
            self.unconfirmed[self.message] = []
            self.unconfirmed_tools.pop(self.message, None)
            self.open_blocks.clear()
        elif not isinstance(index, int):
            return
        elif kind == "content_block_start":
            if index in self.open_blocks:  # restarted without a stop: close the old one
                old_type, old_ident = self.open_blocks.pop(index)
                if old_type != "tool":
                    self.emit(_ENDS[old_type](old_ident))
            block = inner.get("content_block")
            start_type = block.get("type") if isinstance(block, dict) else None
            if start_type == "text" or start_type == "thinking":
                ident = self.protocol.fresh_id(f"{self.message}/{index}")
                self.open_blocks[index] = (start_type, ident)
                self.unconfirmed.setdefault(self.message, []).append(ident)
                self.emit(_STARTS[start_type](ident))
            elif start_type == "tool_use":
                ident = as_str(block.get("id"))  # type: ignore[union-attr]
                name = as_str(block.get("name")) or "tool"  # type: ignore[union-attr]
                if ident and ident not in self.tool_names:
                    self.tool_names[ident] = name
                    self.open_tools.add(ident)
                    self.open_blocks[index] = ("tool", ident)
                    self.unconfirmed_tools.setdefault(self.message, []).append(ident)
                    self.emit(_tool_start(ident, name, None))

    def _delta(self, kind: str, ident: str, phase: str, text: str = "") -> None:
        if phase == "content" and not text:
            return  # empty deltas carry nothing (and consumers may not see them)
        self.emit(_DELTAS[kind](message_id=ident, text=text, phase=phase))

    def _assistant(self, event: dict[str, Any]) -> None:
        self.assistant_lines += 1
        message = event.get("message")
        if not isinstance(message, dict):
            message = {}
        content = message.get("content")
        if not isinstance(content, list):
            content = []
        if event.get("error") or event.get("is_api_error_message"):
            # A synthetic message standing for an API failure: not the model's words.
            texts = [as_str(b.get("text")) for b in content if isinstance(b, dict)
                     and b.get("type") == "text" and as_str(b.get("text"))]
            self.api_error = {"error": event.get("error"),
                              "api_error_status": event.get("api_error_status"),
                              "api_error_type": event.get("api_error_type")}
            self._item(kind="failure", text="\n\n".join(texts) or "API error",
                       metadata={"code": "agent_error", **self.api_error})
            return
        parent = event.get("parent_tool_use_id")
        if parent and isinstance(parent, str):
            self._subagent_said(parent, content)
            return
        model = message.get("model")
        if model and isinstance(model, str) and model != "<synthetic>":
            self.model = model
        message_id = message.get("id")
        if not isinstance(message_id, str):  # as_str, inline: once per assistant line
            message_id = ""
        live = message_id not in self.streamed
        if live:
            # The CLI fell back to a request that does not stream: what it streamed before
            # was cut off and is not part of the answer.
            self._abandon_unconfirmed()
        else:
            self.unconfirmed.pop(message_id, None)
            self.unconfirmed_tools.pop(message_id, None)
        item = self.protocol.item
        for position, block in enumerate(content):
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text":
                text = block.get("text")
                if text and isinstance(text, str):
                    if live:
                        self._whole_block("text", f"{message_id or 'msg'}/{position}", text)
                    item(_assistant_item(text, self.model))
                    self.final.append(text)
            elif btype == "thinking":
                text = block.get("thinking")
                if text and isinstance(text, str):
                    if live:
                        self._whole_block("thinking", f"{message_id or 'msg'}/{position}", text)
                    item(_Item(kind="thinking", text=text))
            elif btype == "tool_use":
                ident = block.get("id")
                if not isinstance(ident, str):  # as_str, inline: once per tool call
                    ident = ""
                name = block.get("name")
                if not (name and isinstance(name, str)):
                    name = "tool"
                tool_input = block.get("input")
                if ident and ident not in self.tool_names:
                    self.tool_names[ident] = name
                    self.open_tools.add(ident)
                    # The event and the transcript item each get their own copy; the decoded
                    # line is ours alone (orjson built it), so the item may keep it.
                    args = _nesting.copy_json(tool_input) if isinstance(tool_input, dict) else None
                    self.emit(_tool_start(ident, name, args))
                item(_tool_call_item(ident, name, tool_input))
                self.final = []  # text before a tool call is not the final answer
                if name == "ExitPlanMode" and isinstance(tool_input, dict):
                    self.exit_plans[ident] = as_str(tool_input.get("plan"))

    def _abandon_unconfirmed(self) -> None:
        """Tell consumers that the text streamed for blocks no assistant line confirmed is not
        the answer (the stream was cut, and the CLI retried or resumed the API call), and end
        the tool calls such blocks had started (the model's next message makes its own)."""
        abandoned = [ident for idents in self.unconfirmed.values() for ident in idents]
        self.unconfirmed.clear()
        tools = [ident for idents in self.unconfirmed_tools.values() for ident in idents
                 if ident in self.open_tools]
        self.unconfirmed_tools.clear()
        if abandoned or tools:
            self.emit(Notice(
                kind="lifecycle",
                text="text streamed before the CLI retried or resumed its API call is not part of the answer",
                data={"warning": "streamed_text_abandoned", "message_ids": abandoned,
                      "tool_call_ids": tools},
            ))
        self._end_tool_calls(tools)

    def _end_tool_calls(self, idents: list[str]) -> None:
        """End tool calls whose lifecycle was left open (no result will come for them)."""
        for ident in idents:
            self.open_tools.discard(ident)
            self.emit(_ToolCall(id=ident, name=self.tool_names.get(ident, ""), phase="end"))

    def _whole_block(self, kind: str, base: str, text: str) -> None:
        """A block that was not streamed: its whole lifecycle at once."""
        ident = self.protocol.fresh_id(base)
        for phase, piece in (("start", ""), ("content", text), ("end", "")):
            self._delta(kind, ident, phase, piece)

    def _subagent_said(self, parent: str, content: list[Any], *, by_user: bool = False) -> None:
        """A subagent's message (its line names the Agent tool call that started it): its own
        updates, not the agent's answer, events or tool calls.  A ``user`` line's text is what
        the subagent was told (its prompt, "[Request interrupted by user]"), not what it said."""
        for block in content:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and not by_user:
                text = block.get("text")
                if text and isinstance(text, str):
                    self.emit(SubagentUpdate(agent=parent, kind="delta", delta=text))
            elif btype in ("tool_use", "tool_result"):
                self.emit(SubagentUpdate(agent=parent, kind=btype, data=_nesting.copy_json(block)))

    def _user(self, event: dict[str, Any]) -> None:
        message = event.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            if content:
                self._item(kind="user", text=content)
            return
        if not isinstance(content, list):
            return
        parent = event.get("parent_tool_use_id")
        if parent and isinstance(parent, str):
            self._subagent_said(parent, content, by_user=True)
            return
        item = self.protocol.item
        for block in content:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "tool_result":
                ident = block.get("tool_use_id")
                if not isinstance(ident, str):
                    ident = ""
                body = block.get("content")
                text = body if isinstance(body, str) else _content_text(body)
                is_error = block.get("is_error") is True
                name = self.tool_names.get(ident, "")
                if ident in self.open_tools:
                    self.open_tools.discard(ident)
                    self.emit(_tool_end(ident, name, text))
                if ident in self.tool_names:
                    self.emit(_tool_result(ident, text, is_error))
                item(_tool_result_item(ident or "unknown", name, text, is_error))
                self.final = []
            elif btype == "text":
                said = block.get("text")
                if said and isinstance(said, str):
                    item(_Item(kind="user", text=said))
                    if said.lstrip().startswith(_ENFORCE_STRUCTURED_OUTPUT):
                        self.final = []  # the model is asked again: its next answer is the final

    def _result(self, event: dict[str, Any]) -> None:
        self.result = event
        usage = _usage(event)
        if usage is not None and self.protocol.terminal is None:  # (not a result after the last)
            self.usages.append(usage)
            if usage.cost_usd is not None:
                self.cost_total = usage.cost_usd
        # Each result lists its own turn's denials; the run's are every turn's.
        denials = event.get("permission_denials")
        denials = list(denials) if isinstance(denials, list) else []
        if self.protocol.terminal is None:
            self.denials.extend(denials)
        errors = as_list(event.get("errors"))
        if self.plan.resume_id and event.get("subtype") != "success":
            for message in (*errors, event.get("result")):
                if isinstance(message, str) and _NO_CONVERSATION.search(message):
                    self.rejected_resume = message
        meta: dict[str, Any] = {
            k: event[k] for k in ("stop_reason", "terminal_reason", "num_turns",
                                  "total_cost_usd", "api_error_status")
            if event.get(k) is not None
        }
        if denials:
            meta["permission_denials"] = _nesting.copy(denials)
        if errors:
            meta["errors"] = [str(e) for e in errors]
        text = event.get("result")
        self._item(kind="result", text=text if isinstance(text, str) else "",
                   subtype=as_str(event.get("subtype")), is_error=event.get("is_error") is True,
                   session_id=as_str(event.get("session_id")), usage=_usage(event),
                   metadata=meta)

    def decision(
        self, kind: str, tool: str, tool_use_id: str, decision: DecisionResponse
    ) -> None:
        metadata: dict[str, Any] = {"kind": kind, "result": decision.result}
        if decision.choice:
            metadata["choice"] = decision.choice
        self._item(kind="system", subtype="decision", text=f"{kind}: {decision.result}",
                   tool_name=tool, tool_use_id=tool_use_id, metadata=metadata)

    # -- the Response --

    def _close_lifecycles(self) -> None:
        for btype, ident in self.open_blocks.values():
            if btype != "tool":
                self._delta(btype, ident, "end")
        self.open_blocks.clear()
        self._end_tool_calls(sorted(self.open_tools))

    def response(self, exit_: Exit, stdout: str | bytes, stderr: str | bytes) -> Response:
        self._close_lifecycles()
        if self.provisional is not None and self.protocol.terminal is None:
            # No follow-up turn came after a turn with background tasks: its result was last.
            self.protocol.set_terminal(*self.provisional)
        if self.rejected_resume and not self.succeeded:
            raise ResumeRejectedError(self.rejected_resume)
        result = self.result
        failure = self._failure(exit_)
        clean = failure is None and exit_.clean and self.succeeded
        session_id = as_str((result or {}).get("session_id"))
        if self.plan.fork and session_id == self.plan.resume_id:
            clean = False  # a fork that kept the parent's id would write into the parent
        checkpoint = None
        if clean and session_id and self.plan.saves_sessions:
            kept = {} if self.cost_total is None else {_COST_KEY: repr(self.cost_total)}
            kept[_TURN_KEY] = secrets.token_hex(8)
            checkpoint = _cli.checkpoint(session_id, self.plan.session_cwd, **kept)
        output = "\n\n".join(self.final)
        structured = None
        if self.plan.schema is not None:
            value = (result or {}).get("structured_output")
            if value is not None:
                output = _nesting.dumps(value).decode()
            structured = StructuredOutput(
                source="native", valid=value is not None, value=value,
                raw_json=output if value is not None else "",
                errors=() if value is not None else ("the CLI returned no structured_output",),
            )
        metadata: dict[str, str] = {}
        if result is not None:
            for key in ("session_id", "stop_reason", "terminal_reason", "num_turns", "subtype"):
                if result.get(key) is not None:
                    metadata[key] = str(result[key])
        if self.denials:
            metadata["permission_denials"] = _nesting.dumps(self.denials).decode()
        if self.version:
            metadata["claude_code_version"] = self.version
        if self.last_error:
            metadata["last_error"] = self.last_error
        if self.protocol.malformed:
            metadata["protocol"] = "malformed"
        summary = as_str((result or {}).get("result")) if self.succeeded else ""
        return _cli.response(exit_, self.protocol, stdout, stderr,
                             terminal_event=None if result is None else "result",
                             output=output, usage=self._usage(),
                             checkpoint=checkpoint, metadata=metadata, provider=PROVIDER,
                             model=self.model, summary=summary, structured_output=structured,
                             failure=failure)

    def _usage(self) -> Usage | None:
        """The turn's usage: its results' tokens (one result, unless the CLI took turns of its
        own), and the cost they added to the process's running total."""
        if not self.usages:
            return None
        cost = self.cost_total
        if cost is not None and cost >= self.cost_before:  # (below it: the CLI counted afresh)
            cost -= self.cost_before
        return Usage(
            input_tokens=sum(u.input_tokens for u in self.usages),
            output_tokens=sum(u.output_tokens for u in self.usages),
            cached_input_tokens=sum(u.cached_input_tokens for u in self.usages),
            cost_usd=cost,
        )

    def _failure(self, exit_: Exit) -> RunFailure | None:
        if self.mcp_unavailable:
            # The root cause: the driver stopped the CLI for it, whatever followed.
            names = ", ".join(f"{k} ({v})" for k, v in self.mcp_unavailable.items())
            return RunFailure(code="agent_error",
                              message=f"required MCP server(s) not connected: {names}",
                              details={"mcp_servers": dict(self.mcp_unavailable)})
        result = self.result
        if result is not None and not (result.get("subtype") == "success"
                                       and result.get("is_error") is not True):
            return self._provider_failure(result)
        if self.protocol.malformed and not _cli.killed_early(exit_, self.protocol,
                                                             terminal=result is not None):
            return _cli.malformed("claude", self.protocol)
        if exit_.cancelled or exit_.timed_out:
            return None  # the host's cancellation or deadline keeps its own identity
        if result is None:
            return self.protocol.died("claude", exit_.describe(), exit_code=exit_.exit_code,
                                      signal=exit_.signal)
        if exit_.exit_code not in (0, None) or exit_.signal is not None:
            # Not `exit_.clean`: a process kept for the next turn has not exited at all.
            return _cli.exited_unsuccessfully("claude", exit_)
        return None

    def _provider_failure(self, result: Mapping[str, Any]) -> RunFailure:
        status = result.get("api_error_status") or self.api_error.get("api_error_status")
        error_type = as_str(result.get("api_error_type") or self.api_error.get("api_error_type"))
        error = as_str(self.api_error.get("error") or result.get("api_error"))
        text = as_str(result.get("result"))
        errors = as_list(result.get("errors"))
        message = text or "; ".join(str(e) for e in errors) or "claude reported an error"
        terminal_reason = as_str(result.get("terminal_reason"))
        kind = (_LASTING_ERRORS.get(error) or _LASTING_ERRORS.get(terminal_reason)
                or _cli.lasting_kind(message)
                or _passing_kind(status, error_type, error, text))
        return provider_failure(
            message, kind,
            subtype=as_str(result.get("subtype")) or None,
            provider_status=status if isinstance(status, int) else None,
            provider_error=error_type or error or None,
            terminal_reason=terminal_reason or None,
        )


# How the CLI's own user turn starts when it asks a model that answered in text (a schema's
# run) once more to call StructuredOutput.
_ENFORCE_STRUCTURED_OUTPUT: Final = "[structured-output-enforce]"
# The background tasks of an agent's kind, as Claude Code 2.1.332 groups its task types (its
# process-like ones, a shell or a monitor of a command or a WebSocket, may run for ever).
_AGENT_TASKS: Final = frozenset({"local_agent", "remote_agent", "in_process_teammate", "local_workflow"})
# System events of background tasks (the Agent tool's subagents, which Claude Code 2.1.332 runs
# in the background): their outcomes come to the model in turns of the CLI's own.
_BACKGROUND_SUBTYPES: Final = frozenset(
    {"task_started", "task_updated", "task_notification", "background_tasks_changed"}
)

# Claude Code's own names for the failures no retry mends: the ``error`` of the assistant message
# that reports an API error ("Credit balance is too low" is a 400 it calls ``billing_error``),
# and the result's ``terminal_reason`` for a prompt over the context window.
_LASTING_ERRORS: Final[Mapping[str, FailureKind]] = {
    "billing_error": "quota",
    "model_not_found": "model_not_found",
    "prompt_too_long": "context_too_long",
}


def _passing_kind(status: object, error_type: str, error: str, text: str) -> FailureKind:
    """The class of an API error a wait or a fix of the setup may mend."""
    if (status in (401, 403) or error_type in ("authentication_error", "permission_error")
            or error == "authentication_failed" or text.startswith("Not logged in")):
        return "auth"
    if status == 429 or error_type == "rate_limit_error" or error == "rate_limit":
        return "rate_limit"
    if ((isinstance(status, int) and status >= 500)
            or error_type in ("api_error", "overloaded_error")
            or error in ("server_error", "connection_failed", "overloaded")
            # A broken stream, and a body its retry could not read: the CLI's words for it
            # ("API returned an empty or malformed response (HTTP 200)", error "unknown").
            or "empty or malformed response" in text):
        return "provider_unavailable"
    return ""


# --- the process pool ---------------------------------------------------------------------------


class _Pool:
    """Processes kept between thread turns, keyed by the session they last continued."""

    # Every Driver's pool in this process, so a turn can stop the processes others keep for
    # its session; weak, so a pool goes with its Driver.
    _all: weakref.WeakSet[_Pool] = weakref.WeakSet()
    _all_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, tuple[_Live, float]] = {}
        self._closed = False
        self._evictor: threading.Thread | None = None
        self._wake = threading.Event()
        with _Pool._all_lock:
            _Pool._all.add(self)

    @classmethod
    def discard_elsewhere(cls, session_id: str | None, own: _Pool) -> None:
        """Stop the processes every other pool keeps for ``session_id``."""
        if session_id is None:
            return
        with cls._all_lock:
            others = [pool for pool in cls._all if pool is not own]
        for pool in others:
            pool.discard(session_id)

    @property
    def closed(self) -> bool:
        return self._closed

    def take(self, session_id: str | None, signature: str, turn: str | None) -> _Live | None:
        """The kept process for ``session_id`` if it still fits, and made the saved ``turn``
        the run resumes (else a turn saved since, by another process, is not in its
        conversation); a misfit is stopped."""
        if session_id is None:
            return None
        with self._lock:
            entry = self._live.pop(session_id, None)
        if entry is None:
            return None
        live = entry[0]
        fits = live.signature == signature and turn is not None and live.turn == turn
        if fits and live.child.alive and live.child.quiet:
            return live
        live.close()
        return None

    def discard(self, session_id: str | None) -> None:
        """Stop the process kept for ``session_id``, if any."""
        if session_id is None:
            return
        with self._lock:
            entry = self._live.pop(session_id, None)
        if entry is not None:
            entry[0].close()

    def put(self, live: _Live, idle_timeout: float) -> None:
        """Keep ``live`` for the next turn; or stop it, when nothing could evict it later."""
        live.idle_since = time.monotonic()
        with self._lock:
            if self._closed or not self._evictor_running():
                stale: _Live | None = live
            else:
                previous = self._live.pop(live.session_id, None)
                stale = None if previous is None else previous[0]
                self._live[live.session_id] = (live, idle_timeout)
        if stale is not None:
            stale.close()

    def _evictor_running(self) -> bool:
        # Called holding the lock.  Without a thread (a task limit) a kept process would never
        # be stopped when idle: keeping it is an optimization, so the turn simply ends it.
        if self._evictor is None:
            evictor = threading.Thread(target=self._evict_loop, name="adaptor-claude-evictor",
                                       daemon=True)
            try:
                evictor.start()
            except RuntimeError:
                return False
            self._evictor = evictor
        return True

    @classmethod
    def forget_in_forked_copy(cls) -> None:
        """After ``os.fork()``, in the copy: the kept processes are the parent's.  The copy
        neither reuses nor stops them (their pipes are disowned with every child, see
        ``_process``), and its pools start afresh, evictor thread included."""
        cls._all_lock = threading.Lock()
        for pool in list(cls._all):
            pool._lock = threading.Lock()
            pool._live.clear()
            pool._evictor = None
            pool._wake = threading.Event()

    def _evict_loop(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            now = time.monotonic()
            with self._lock:
                expired = [key for key, (live, idle) in self._live.items()
                           if now - live.idle_since >= idle]
                victims = [self._live.pop(key)[0] for key in expired]
            for live in victims:
                live.close()

    def close(self, timeout: float | None = None) -> None:
        with self._lock:
            self._closed = True
            victims = [live for live, _ in self._live.values()]
            self._live.clear()
        self._wake.set()
        grace = None if timeout is None else max(timeout, 0.0) / max(len(victims), 1)
        for live in victims:
            live.close(grace)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Pool.forget_in_forked_copy)

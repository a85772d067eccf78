"""The ``codex`` driver: the Codex CLI (npm ``@openai/codex``) in ``exec --json`` mode.

::

    from adaptor.drivers import codex

    agent = adaptor.Agent(codex.Driver(codex.Config(model="gpt-5.5")))

Each run is one ``codex exec --json --skip-git-repo-check ... -`` process with the prompt on
stdin followed by EOF (an idle open stdin makes codex wait forever).  The exact argv is built in
one place, :func:`_argv`, checked against codex-cli 0.171.0.  ``.bin/codex`` is a Node launcher
that spawns the real Rust binary, which is why the runner stops the whole process group.

- **Policy.**  ``sandbox`` maps to ``-c sandbox_mode="read-only"|"workspace-write"|
  "danger-full-access"`` and ``web_search`` to ``-c web_search="live"|"disabled"`` (both also
  accepted by ``exec resume``).  ``codex exec`` has no approval channel: it never asks, so only
  ``auto_approve`` is offered for permission and plan_review, and an explicit ``ask`` is
  refused by the SDK with ``HumanDecisionModeUnsupportedError`` before anything starts.
  Never asked is not always allowed: codex itself refuses a command asking to leave the
  sandbox, and the model's questions, and tells the model so.
- **Structured output.**  Native via ``--output-schema FILE``; the file is written into a
  private per-run temporary directory, never into ``CODEX_HOME``.  codex sends it as a strict
  response format, which the provider refuses (HTTP 400) unless every object is closed and
  requires all its properties, so the descriptor says ``native_strict`` and other schemas go
  through the prompt.
- **Append system prompt.**  ``-c developer_instructions=<TOML string>``; the spawn event shows
  a placeholder instead of the text.
- **MCP servers and host tools.**  ``Request.mcp`` and the tool gateway become
  ``-c mcp_servers.<key>.*`` overrides, so the user's ``CODEX_HOME`` (sessions, credentials)
  stays in use and is never written to.  Nothing secret goes on the command line: a bearer
  variable is named by ``bearer_token_env_var``; header values travel in the process
  environment under generated names (``env_http_headers``); a stdio server's ``env`` is
  written to a 0600 file in the run's private directory, which ``/bin/sh`` sources before
  exec'ing the server (codex can only forward variables under their own names), with the
  run's ``ADAPTOR_RUN_MARK``: codex starts each server in a session of its own, so only the
  mark finds one that outlives a cancelled run.  Every server
  gets ``default_tools_approval_mode="approve"``: ``exec`` cannot ask, and a tool needing
  approval would otherwise always fail.  Required servers and the gateway are
  ``required = true``: codex then refuses to start without them.  A key that the user's
  ``config.toml`` also gives a server, or that ``extra_args`` set with ``-c``, refuses the run
  (``unsupported_driver``): codex would merge the two tables (``_key_taken``).  SSE servers
  are not supported by this codex (stdio and streamable HTTP only).
- **Skills.**  codex only loads skills from ``CODEX_HOME``, ``~/.agents`` and the workspace,
  none of them private to a run, so the staged skills are announced in the developer
  instructions instead: name, description (from ``SKILL.md``'s front matter) and the absolute
  path of each ``SKILL.md``, which the model reads with its own tools, as it does for codex's
  native skills.
- **Sessions.**  ``exec resume ID -`` (fork: ``exec fork ID -``).  A checkpoint needs
  ``thread.started.thread_id`` and ``turn.completed`` with a clean exit.  codex prints nothing
  on stdout for an unknown id (only an error and a backtrace on stderr); that, or any of the
  "no rollout found"-class messages, raises ``ResumeRejectedError``.

Failures: ``turn.failed`` (and a bare ``error`` when the process dies before its terminal) is
an ``agent_error`` classified from the message: 401/403 and a missing key variable are
``auth``; 429 is ``rate_limit``; 5xx, "high demand" and broken streams are
``provider_unavailable``; a spent quota ("Quota exceeded. Check your plan and billing
details."), an unknown model ("The model `x` does not exist") and a prompt over the context
window ("ran out of room in the model's context window") are ``quota``, ``model_not_found`` and
``context_too_long``.  An unreachable server makes codex retry forever ("Reconnecting...
waiting for network"): only the run's ``timeout`` (or a cancel) ends it, and the message is
kept in ``Result.metadata["last_error"]``.

Session compatibility covers ``cwd``, ``extra_args``, ``model``, ``home`` and the *names* of
``env``.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from adaptor import _nesting, _private_dirs
from adaptor.driver import (
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
from adaptor.drivers._lines import (
    NullSink,
    Protocol,
    as_dict,
    as_int,
    as_list,
    as_str,
    died_as,
    provider_failure,
)
from adaptor.drivers._process import Exit, Line, Spec
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, Thinking, ToolCall, ToolResult
from adaptor.result import StructuredOutput, TranscriptItem, Usage

__all__ = ["CLI_VERSION", "PROVIDER", "TYPE", "Config", "Driver", "replay"]

TYPE: Final = "codex"
PROVIDER: Final = "openai"
CLI_VERSION: Final = "0.171.0"

_SANDBOX_MODES: Final = {
    "read_only": "read-only",
    "workspace_write": "workspace-write",
    "unrestricted": "danger-full-access",
}
# Flags the driver sets itself, and those `exec resume` and `exec fork` do not accept (a run
# that works fresh must keep working when it resumes; a provider is named in the config instead
# of `--oss`).
_OWNED_FLAGS: Final = frozenset({
    "--json", "--output-schema", "-o", "--output-last-message", "--skip-git-repo-check",
    "-m", "--model", "-s", "--sandbox", "-C", "--cd", "--add-dir", "-p", "--profile",
    "--last", "--ephemeral", "--color", "--oss", "--local-provider", "--approve-for-me",
    "-V", "--version",
})
# (codex 0.171.0's words, a session gone or damaged: its rollout file deleted, emptied or not
# JSON; a fork's source rollout gone.)
_RESUME_REJECTED = re.compile(
    r"no rollout found for thread id|missing rollout path for thread|"
    r"state db missing rollout path|unknown (session|thread)|"
    r"(session|thread|conversation) .{0,80}not found|"
    r"failed to read session metadata|missing source rollout",
    re.IGNORECASE,
)
_FAILURES: Final = _cli.FailureShapes(
    auth=re.compile(r"unauthori[sz]ed|forbidden|missing environment variable|"
                    r"invalid api key|incorrect api key|not logged in", re.IGNORECASE),
    # A quota exceeded without the words of a spent one (OpenAI's insufficient_quota, which
    # codex 0.171.0 reports as "Quota exceeded. Check your plan and billing details.": that is
    # ``quota``, see _cli.lasting_kind) passes like a rate limit; a disk quota is an OS error.
    # codex 0.171.0 words a ChatGPT plan's spent usage (a 429 usage_limit_reached, which it
    # says resets) "You've hit your usage limit. ... or try again later.", and an overloaded
    # model (server_is_overloaded) "Selected model is at capacity.", without the status.
    rate_limit=re.compile(
        r"too many requests|rate limit|usage limit|(?<!disk )quota exceeded|"
        r"exceeded your current quota",
        re.IGNORECASE,
    ),
    unavailable=re.compile(
        r"high demand|overloaded|at capacity|internal server error|service unavailable|"
        r"bad gateway|stream disconnected|connection failed|waiting for network|"
        r"error sending request|connection refused",
        re.IGNORECASE,
    ),
    # A ChatGPT plan that does not include Codex (usage_not_included): no retry mends it.
    quota=re.compile(r"to use codex with your chatgpt plan, upgrade", re.IGNORECASE),
)


@dataclass(frozen=True)
class Config(_cli.CliConfig):
    """The Codex CLI's configuration.

    ``model`` is passed as ``-m`` (a run's ``model=`` wins); ``home`` becomes ``CODEX_HOME``
    (sessions, config.toml, credentials; ``None``: the CLI's default ``~/.codex``).  Provider
    settings and other ``config.toml`` overrides go in ``extra_args`` as ``-c key=value``.
    """

    command: str = "codex"
    home: str | None = None


class Driver(_cli.CliDriver[Config]):
    """The Codex driver.  Construction snapshots the config and does no I/O."""

    _type = TYPE
    _config_type = Config
    _fingerprint_domain = "codex/config/v1"
    _fingerprint_fields = ("cwd", "extra_args", "model", "home")
    # Read by codex 0.171.0 (found in its binary).  A custom provider's ``env_key`` names a
    # variable of its own choosing: given in ``env``, its value is a secret like every other.
    _credentials = ("OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN")

    def descriptor(self) -> Descriptor:
        return Descriptor(
            type=TYPE,
            display_name="Codex CLI",
            sessions=SessionCaps(supports_resume=True),
            # Announced per run in the developer instructions (see the module docstring).
            skills=SkillCaps(supported=True, mode="ephemeral"),
            mcp=MCPCaps(supported=True, stdio=True, http=True, sse=False),
            instructions=True,
            workspace=True,
            process=ProcessCaps(persistent=False),
            run_policy_caps=RunPolicyCaps(
                isolation=True,
                web_search=True,
                # exec never asks: everything inside the sandbox just runs.
                permission=HumanDecisionSupport(auto_approve=True),
                plan_review=HumanDecisionSupport(auto_approve=True),
                question=QuestionSupport(),
            ),
            # codex sends --output-schema as a strict response format (real-clis.md §4.4).
            structured_output=StructuredOutputCaps(
                native=True, prompt_validate=True, works_with_streaming=True, native_strict=True
            ),
            system_prompt=SystemPromptCaps(append=True),
            stream=StreamCaps(native=True, reasoning=True),
        )

    def _check(self, config: Config) -> None:
        _cli.check_config(config)
        _cli.check_optional_path("home", config.home)
        _cli.check_owned_flags(config.extra_args, _OWNED_FLAGS,
                               "is set by the driver or breaks `exec resume`")

    def run(self, request: Request, sink: EventSink) -> Response:
        config = self._config_for(request)
        plan = _plan(config, request)
        if config.home:
            # codex refuses a CODEX_HOME that does not exist; a configured profile is ours to make.
            os.makedirs(config.home, mode=0o700, exist_ok=True)
        with _private_dirs.used("codex") as private:
            schema_file = None
            if plan.schema is not None:
                schema_file = os.path.join(private, "output-schema.json")
                with open(schema_file, "wb") as handle:
                    handle.write(plan.schema)
            mark = _process.new_mark()
            mcp_args, mcp_env = _mcp_overrides(plan.mcp, plan.required_mcp, private, mark)
            argv, shown = _argv(config, plan, schema_file, mcp_args)
            env, names = _process.child_env(*plan.env_layers, mcp_env)
            refusal = _overridden(plan, config.extra_args) or _key_taken(plan, env, config.extra_args)
            if refusal is not None:
                return refusal
            spec = Spec(argv=argv, shown_argv=shown, env=env, env_names=names,
                        cwd=plan.spawn_cwd, stdin=plan.prompt.encode(),
                        grace_period=config.grace_period, mark=mark)
            return _cli.run_child(spec, sink, request, _Parser(sink, plan))


def replay(
    stdout: str | bytes,
    stderr: str | bytes = b"",
    exit_code: int | None = 0,
    *,
    sink: EventSink | None = None,
    request: Request | None = None,
) -> Response:
    """Parse captured ``codex exec --json`` output as if a run had produced it (tests,
    diagnostics); raises ``ResumeRejectedError`` like ``run`` for a refused resume."""
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
    fork: bool
    sandbox: str | None
    web_search: str | None
    schema: bytes | None
    developer: str | None  # append_system_prompt, then the skills catalogue
    env_layers: tuple[Mapping[str, str], ...]
    mcp: tuple[MCPServerSpec, ...] = ()
    required_mcp: frozenset[str] = frozenset()
    # The resumed session's token totals as its last turn left them (see _stored_usage).
    usage_before: Usage | None = None


def _plan(config: Config, request: Request) -> _Plan:
    spawn_cwd, session_cwd = _cli.cwds(config, request)
    resume_id, fork = _cli.resume_target(request, session_cwd)
    policy = request.policy
    sandbox = None if policy is None else _SANDBOX_MODES.get(policy.sandbox)
    web_search = None
    if policy is not None and policy.web_search in ("allow", "deny"):
        web_search = "live" if policy.web_search == "allow" else "disabled"
    schema = None
    if request.output_schema is not None and request.structured_output_source == "native":
        schema = orjson.dumps(dict(request.output_schema.schema))
    owned = {"CODEX_HOME": config.home} if config.home else {}
    developer = "\n\n".join(
        part for part in (request.append_system_prompt, _skills_catalogue(request.skills)) if part
    )
    servers = list(request.mcp)
    required = {s.key for s in request.mcp if s.required}
    if request.tools_endpoint is not None:
        servers.append(request.tools_endpoint.server)
        required.add(request.tools_endpoint.server.key)  # without it the host's tools are missing
    return _Plan(
        prompt=_cli.prompt_of(request),
        model=request.model_override or config.model,
        spawn_cwd=spawn_cwd,
        session_cwd=session_cwd,
        resume_id=resume_id,
        fork=fork,
        sandbox=sandbox,
        web_search=web_search,
        schema=schema,
        developer=developer or None,
        env_layers=(dict(config.env), dict(request.env), owned),
        mcp=tuple(servers),
        required_mcp=frozenset(required),
        usage_before=None if resume_id is None else _stored_usage(request),
    )


# codex's turn.completed carries the session's running token totals (a resumed or forked
# session's include its earlier turns'), so each checkpoint keeps them, and a resumed turn
# reports what it added.
_USAGE_KEY: Final = "usage"


def _stored_usage(request: Request) -> Usage | None:
    stored = _cli.stored_in_checkpoint(request, _USAGE_KEY)
    try:
        totals = None if stored is None else orjson.loads(stored)
        usage = None if totals is None else _usage({"usage": totals})
    except (TypeError, ValueError):  # a checkpoint from before, or changed by hand
        return None
    if usage is None or min(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) < 0:
        return None  # (changed by hand)
    return usage


def _turn_usage(totals: Usage | None, before: Usage | None) -> Usage | None:
    """The turn's share of the session ``totals``; the totals themselves when they are not
    past ``before`` (codex started counting afresh)."""
    if totals is None or before is None:
        return totals
    fields = ("input_tokens", "output_tokens", "cached_input_tokens")
    if any(getattr(totals, f) < getattr(before, f) for f in fields):
        return totals
    return Usage(**{f: getattr(totals, f) - getattr(before, f) for f in fields})


def _argv(
    config: Config, plan: _Plan, schema_file: str | None, mcp_args: list[str]
) -> tuple[list[str], list[str]]:
    """The command line and the form a spawn event may show.  Checked against codex-cli
    0.171.0 (``codex exec --help``, ``codex exec resume --help``, shared/reference/real-clis.md
    §4): keep every flag decision here.  Every option used is accepted by ``exec``,
    ``exec resume`` and ``exec fork`` alike.  ``mcp_args`` (from :func:`_mcp_overrides`) holds
    no secret and is shown as is."""
    argv = [config.command, "exec"]
    if plan.resume_id is not None:
        argv.append("fork" if plan.fork else "resume")
    argv += ["--json", "--skip-git-repo-check"]
    if plan.model:
        argv += ["-m", plan.model]
    if plan.sandbox is not None:
        argv += ["-c", f'sandbox_mode="{plan.sandbox}"']
    if plan.web_search is not None:
        argv += ["-c", f'web_search="{plan.web_search}"']
    if schema_file is not None:
        argv += ["--output-schema", schema_file]
    argv += mcp_args
    shown = list(argv)
    if plan.developer is not None:
        argv += ["-c", "developer_instructions=" + _toml(plan.developer)]
        shown += ["-c", f"developer_instructions=<{len(plan.developer)} characters>"]
    tail = [*config.extra_args, *(() if plan.resume_id is None else (plan.resume_id,)), "-"]
    return argv + tail, shown + tail


def _key_taken(plan: _Plan, env: Mapping[str, str], extra_args: Sequence[str]) -> Response | None:
    """The refusal of a server whose key something else also gives codex a server under.

    codex merges ``-c mcp_servers.<key>.*`` into the user's ``config.toml`` table of that key
    field by field (also given as one inline table): the user's ``env`` reached the declared
    server, their ``enabled = false`` or ``enabled_tools`` silently took its tools away, their
    ``url`` beside its ``command`` stopped codex at start.  ``extra_args`` come after the
    driver's overrides and so do the same, or worse: ``-c mcp_servers.<key>={...}`` replaces
    the declared table and ``-c mcp_servers={...}`` every one of them.  None of it can be
    undone from the command line, so the run is refused before codex starts.  An unreadable
    or invalid file is left for codex to report.
    """
    if not plan.mcp:
        return None
    paths = list(_mcp_overrides_in(extra_args))
    taken = [s.key for s in plan.mcp if any(not path or path[0] == s.key for path in paths)]
    if taken:
        return _refusal(taken, "mcp_key_in_extra_args",
                        "extra_args set them too (-c mcp_servers.<key>... or -c mcp_servers=...), "
                        "and codex would merge or replace them; give your own servers as "
                        "-c mcp_servers.<key>... under other keys")
    home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"),
                                                 ".codex")
    path = os.path.join(plan.spawn_cwd or os.getcwd(), home, "config.toml")  # codex's cwd
    try:
        with open(path, "rb") as handle:
            servers = tomllib.load(handle).get("mcp_servers")
    except (OSError, ValueError):  # TOMLDecodeError is a ValueError
        return None
    taken = [s.key for s in plan.mcp if isinstance(servers, dict) and s.key in servers]
    if not taken:
        return None
    return _refusal(taken, "mcp_key_in_codex_config",
                    f"{path} declares a server under the same key, and codex would merge the "
                    "two; use another key")


def _refusal(taken: list[str], kind: str, why: str) -> Response:
    names = ", ".join(map(repr, taken))
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"codex cannot take MCP server(s) {names}: {why}",
        details={"kind": kind, "mcp_servers": taken},
    ))


# What the run's explicit settings are, and the extra_args that would override each: a -c key
# path (its first segments) or a flag.  codex takes the last -c of a key, and extra_args come
# after the driver's own.
# (the _Plan attribute, what it is, -c keys that set it, -c tables below which a key does,
# flags that override it)
_OVERRIDES: Final[tuple[tuple[str, str, set[str], set[str], set[str]], ...]] = (
    # (codex 0.171.0 takes a permission profile, built in or a [permissions] table's, over
    # sandbox_mode.)
    ("sandbox", "the policy's sandbox",
     {"sandbox_mode", "default_permissions", "permission_profile"},
     {"sandbox_workspace_write", "permissions"},
     {"--dangerously-bypass-approvals-and-sandbox", "--approve-for-me", "--full-auto", "--yolo"}),
    ("web_search", "the policy's web_search", {"web_search", "tools.web_search"}, set(), set()),
    ("developer", "append_system_prompt and the skills catalogue", {"developer_instructions"},
     set(), set()),
)


def _overridden(plan: _Plan, extra_args: Sequence[str]) -> Response | None:
    """A refusal when ``extra_args`` set what the run's explicit settings set (a Policy's
    sandbox or web_search, the developer instructions): codex would quietly obey them."""
    keys = [".".join(path) for path in _config_overrides_in(extra_args)]
    flags = set(_cli.flags_in(extra_args))
    for attribute, what, whole, tables, dangerous in _OVERRIDES:
        if getattr(plan, attribute) is None:
            continue
        found = [k for k in keys if k in whole or any(k == t or k.startswith(t + ".") for t in tables)]
        found += sorted(flags & dangerous)
        if found:
            return _cli.overridden_by_extra_args("codex", what, found)
    return None


def _mcp_overrides_in(extra_args: Sequence[str]) -> Iterator[list[str]]:
    """The path below ``mcp_servers`` of each ``-c`` in ``extra_args`` that sets something
    there (``[]``: the whole table)."""
    for path in _config_overrides_in(extra_args):
        if path[0] == "mcp_servers":
            yield path[1:]


def _config_overrides_in(extra_args: Sequence[str]) -> Iterator[list[str]]:
    """The key path of each ``-c`` in ``extra_args`` that sets something.  Read as codex
    0.171.0 does: ``-c V``, ``-cV``, ``-c=V``, ``--config V`` and ``--config=V``; the key is
    what precedes the first ``=``, trimmed, cut at every dot (no TOML quoting:
    ``mcp_servers."k"`` names a server ``"k"``, quotes and all).
    """
    args = iter(extra_args)
    for arg in args:
        if arg == "--":
            return
        if arg in ("-c", "--config"):
            override = next(args, "")
        elif arg.startswith("--config="):
            override = arg.removeprefix("--config=")
        elif arg.startswith("-c"):
            override = arg[2:].removeprefix("=")
        else:
            continue
        key, equals, _ = override.partition("=")
        if equals:
            yield key.strip().split(".")


_REQUIRED_MCP_FAILED: Final = "required MCP servers failed to initialize: "

# Sources the 0600 env file ($0) and becomes the server ("$@"): the values never reach argv.
_SOURCE_AND_EXEC: Final = '. "$0" && exec "$@"'
_HEADER_VAR: Final = "ADAPTOR_MCP_HEADER_"


def _toml(value: str | bool | list[str] | Mapping[str, str]) -> str:
    """A TOML value for ``-c``: JSON strings, booleans and string arrays are valid TOML."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return orjson.dumps(value).decode()


def _mcp_overrides(
    servers: tuple[MCPServerSpec, ...], required: frozenset[str], private: str, mark: str
) -> tuple[list[str], dict[str, str]]:
    """``-c mcp_servers.<key>...`` arguments and the environment they rely on (header values
    under generated names).  A stdio server's env, with the run's ``mark``, is written into
    ``private`` (see the module docstring), which must outlive the process."""
    args: list[str] = []
    env: dict[str, str] = {}
    for server in servers:
        settings: dict[str, str | bool | list[str] | dict[str, str]] = {}
        if server.transport == "stdio":
            # codex starts each server in a session of its own and with only the variables it
            # names: without the mark, a server that outlives a cancelled run is found by
            # nothing (neither the group kill nor the mark sweep).
            exported = {**server.env, _process.MARK_VAR: mark}
            fd, path = tempfile.mkstemp(prefix="mcp-env-", dir=private)  # created 0600
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(f"export {name}={shlex.quote(value)}\n"
                                  for name, value in exported.items())
            command = "/bin/sh"
            arguments = ["-c", _SOURCE_AND_EXEC, path, server.command, *server.args]
            settings.update(command=command, args=arguments)
        else:
            settings["url"] = server.url
            if server.bearer_token_env:
                settings["bearer_token_env_var"] = server.bearer_token_env
            if server.headers:
                carriers: dict[str, str] = {}
                for header, value in server.headers.items():
                    name = f"{_HEADER_VAR}{len(env) + 1}"
                    env[name] = value
                    carriers[header] = name
                settings["env_http_headers"] = carriers
        settings["default_tools_approval_mode"] = "approve"
        if server.key in required:
            settings["required"] = True
        for field_name, setting in settings.items():
            args += ["-c", f"mcp_servers.{server.key}.{field_name}={_toml(setting)}"]
    return args, env


_SKILLS_PREAMBLE: Final = (
    "## Skills for this run\n"
    "The host selected these skills. Each is a directory with a `SKILL.md` file holding its "
    "instructions. When the task matches a skill's description, or a skill is marked "
    "required, read its `SKILL.md` completely before acting, and resolve relative paths in it "
    "against the skill's directory."
)
_DESCRIPTION_LIMIT: Final = 1024  # what Claude Code allows for a skill description
_SKILL_HEAD: Final = 65536


def _skills_catalogue(skills: Sequence[ResolvedSkill]) -> str:
    if not skills:
        return ""
    lines = [_SKILLS_PREAMBLE]
    for skill in skills:
        skill_md = os.path.join(skill.path, "SKILL.md")
        entry = f"- {skill.runtime_name}: {_skill_description(skill_md)} (file: {skill_md})"
        if skill.required:
            entry += " Required" + (f": {skill.reason}" if skill.reason else ".")
        lines.append(entry)
    return "\n".join(lines)


def _skill_description(skill_md: str) -> str:
    """The front matter's ``description`` (plain, quoted or a folded/literal block), else the
    first line of text of the body; one line, at most :data:`_DESCRIPTION_LIMIT` characters.

    A byte order mark (as Windows editors write) is not text, and front matter never closed
    still is front matter: neither may leave ``---`` as the description."""
    try:
        with open(skill_md, encoding="utf-8-sig", errors="replace") as handle:
            lines = handle.read(_SKILL_HEAD).splitlines()
    except OSError:
        return "(SKILL.md unreadable)"
    body = lines
    if lines and lines[0].strip() == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
        header = lines[1:end] if end is not None else lines[1:]
        body = lines[end + 1:] if end is not None else lines[1:]
        for i, line in enumerate(header):
            key, colon, value = line.partition(":")
            if not colon or key.strip() != "description" or line[:1].isspace():
                continue
            value = value.strip()
            if value[:1] in ("|", ">"):
                block = []
                for follower in header[i + 1:]:
                    if follower.strip() and not follower[:1].isspace():
                        break
                    block.append(follower.strip())
                value = " ".join(part for part in block if part)
            elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            if value:
                return _one_line(value)
    first = next((line.strip().lstrip("#").strip() for line in body if line.strip()), "")
    return _one_line(first) or "(no description)"


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DESCRIPTION_LIMIT else text[: _DESCRIPTION_LIMIT - 3] + "..."


# --- parsing ------------------------------------------------------------------------------------

# Item types that stand for a tool the agent used, and the tool name each is reported under.
_TOOL_ITEMS: Final[Mapping[str, str]] = {
    "command_execution": "shell",
    "file_change": "apply_patch",
    "mcp_tool_call": "mcp",
    "web_search": "web_search",
}


class _Parser:
    """``codex exec --json`` → events, transcript items and, at the end, a Response."""

    def __init__(self, sink: EventSink, plan: _Plan) -> None:
        self.sink = sink
        self.plan = plan
        self.protocol = Protocol(sink)
        self.thread_id = ""
        self.final = ""
        self.completed: dict[str, Any] | None = None
        self.failed: dict[str, Any] | None = None
        self.last_error = ""
        self.started_tools: dict[str, str] = {}
        self.reasoning = 0
        self.resume_problem = ""
        self.mcp_failed = ""  # what codex said after _REQUIRED_MCP_FAILED

    def _item(self, **fields: Any) -> None:
        self.protocol.item(TranscriptItem(**fields))

    def feed(self, line: Line) -> None:
        if line.stream == "stderr":
            self.protocol.feed_stderr(line.data)
            if self.plan.resume_id and _RESUME_REJECTED.search(line.text):
                self.resume_problem = self.resume_problem or line.text.strip()
            _, found, failed = line.text.partition(_REQUIRED_MCP_FAILED)
            if found:
                self.mcp_failed = self.mcp_failed or failed
            return
        decoded = self.protocol.feed_stdout(line.data)
        if decoded is None or decoded.event is None:
            return
        event = decoded.event
        kind = as_str(event.get("type"))
        handler = self._HANDLERS.get(kind.split(".", 1)[0] if kind.startswith("item.") else kind)
        if handler is not None:
            handler(self, event)
        if kind in ("turn.completed", "turn.failed"):
            self.protocol.set_terminal(event, decoded.text)

    def _thread_started(self, event: dict[str, Any]) -> None:
        self.thread_id = as_str(event.get("thread_id")) or self.thread_id
        self._item(kind="init", session_id=self.thread_id, model=self.plan.model)

    def _turn_completed(self, event: dict[str, Any]) -> None:
        self.completed = event
        self._item(kind="result", subtype="success", session_id=self.thread_id,
                   usage=_turn_usage(_usage(event), self.plan.usage_before), text=self.final)

    def _turn_failed(self, event: dict[str, Any]) -> None:
        self.failed = event
        message = as_str(as_dict(event.get("error")).get("message")) or self.last_error
        self._item(kind="failure", text=message or "turn failed",
                   metadata={"code": "agent_error"})

    def _error(self, event: dict[str, Any]) -> None:
        # Retries announce themselves as `error` too; only turn.failed (or dying) ends a turn.
        self.last_error = as_str(event.get("message")) or self.last_error
        self._item(kind="system", subtype="error", text=self.last_error or "error")

    def _item_event(self, event: dict[str, Any]) -> None:
        phase = as_str(event.get("type")).removeprefix("item.")
        item = as_dict(event.get("item"))
        itype = as_str(item.get("type"))
        ident = as_str(item.get("id")) or f"item@{len(self.protocol.transcript)}"
        if itype == "agent_message":
            text = as_str(item.get("text"))
            if phase == "completed" and text:
                lifecycle = self.protocol.fresh_id(ident)
                for step, piece in (("start", ""), ("content", text), ("end", "")):
                    self.sink.emit(TextDelta(message_id=lifecycle, text=piece, phase=step))  # type: ignore[arg-type]
                self._item(kind="assistant", text=text, model=self.plan.model)
                self.final = text
        elif itype == "reasoning":
            text = as_str(item.get("text"))
            if phase == "completed" and text:
                self.reasoning += 1
                lifecycle = self.protocol.fresh_id(ident)
                for step, piece in (("start", ""), ("content", text), ("end", "")):
                    self.sink.emit(Thinking(message_id=lifecycle, text=piece, phase=step))  # type: ignore[arg-type]
                self._item(kind="thinking", text=text)
        elif itype in _TOOL_ITEMS:
            self._tool(phase, ident, itype, item)
        elif itype == "error":
            self._item(kind="system", subtype="warning", text=as_str(item.get("message")))
        elif phase == "completed" and itype:
            self._item(kind="system", subtype=itype, metadata={"item": _nesting.copy(item)})

    def _tool(self, phase: str, ident: str, itype: str, item: dict[str, Any]) -> None:
        name, args = _tool_call(itype, item)
        if self.started_tools.get(ident) == "":
            return  # already completed: a repeated event must not reopen the call
        if ident not in self.started_tools:
            self.started_tools[ident] = name
            self.sink.emit(ToolCall(id=ident, name=name, args=_nesting.copy(args), phase="start"))
            self._item(kind="tool_call", tool_use_id=ident, tool_name=name, input=args)
        if phase != "completed":
            return
        text, is_error = _tool_result(itype, item)
        self.sink.emit(ToolCall(id=ident, name=name, result=text, phase="end"))
        self.sink.emit(ToolResult(id=ident, result=text, is_error=is_error))
        self._item(kind="tool_result", tool_use_id=ident, tool_name=name, text=text,
                   is_error=is_error)
        self.started_tools[ident] = ""  # ended

    _HANDLERS: Final[Mapping[str, Callable[[_Parser, dict[str, Any]], None]]] = {
        "thread.started": _thread_started,
        "turn.completed": _turn_completed,
        "turn.failed": _turn_failed,
        "error": _error,
        "item": _item_event,
    }

    # -- the Response --

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response:
        for ident, name in self.started_tools.items():
            if name:  # started, never completed: close the lifecycle
                self.sink.emit(ToolCall(id=ident, name=name, phase="end"))
        self.started_tools = {}
        if self.resume_problem and self.completed is None and not exit_.clean:
            # codex prints nothing on stdout for an unknown thread id; stderr says why.
            raise ResumeRejectedError(self.resume_problem)
        failure = self._failure(exit_)
        clean = failure is None and exit_.clean and self.completed is not None
        totals = None if self.completed is None else _usage(self.completed)
        checkpoint = None
        if clean and self.thread_id:
            kept = {} if totals is None else {_USAGE_KEY: orjson.dumps({
                "input_tokens": totals.input_tokens, "output_tokens": totals.output_tokens,
                "cached_input_tokens": totals.cached_input_tokens}).decode()}
            checkpoint = _cli.checkpoint(self.thread_id, self.plan.session_cwd, **kept)
        structured = None
        if self.plan.schema is not None:
            try:
                value = orjson.loads(self.final) if self.final else None
            except orjson.JSONDecodeError:
                value = None
            structured = StructuredOutput(source="native", valid=value is not None, value=value,
                                          raw_json=self.final)
        metadata: dict[str, str] = {}
        if self.thread_id:
            metadata["thread_id"] = self.thread_id
        if self.last_error:
            metadata["last_error"] = self.last_error
        if self.protocol.malformed:
            metadata["protocol"] = "malformed"
        terminal = self.completed or self.failed
        return _cli.response(exit_, self.protocol, stdout, stderr,
                             terminal_event=None if terminal is None
                             else as_str(terminal.get("type")),
                             output=self.final,
                             usage=_turn_usage(totals, self.plan.usage_before),
                             checkpoint=checkpoint, metadata=metadata, provider=PROVIDER,
                             model=self.plan.model, structured_output=structured, failure=failure)

    def _failure(self, exit_: Exit) -> RunFailure | None:
        reported = None
        if self.failed is not None:
            message = as_str(as_dict(self.failed.get("error")).get("message")) or self.last_error
            reported = _classify(message or "codex reported a failed turn")
        return _cli.run_failure("codex", exit_, self.protocol, reported=reported,
                                terminal=self.completed is not None, died=self._died)

    def _died(self, died: RunFailure) -> RunFailure:
        # The bare `error` codex printed before dying says more than its exit.
        if self.last_error:
            return replace(_died_as(died, self.last_error), message=self.last_error)
        if self.mcp_failed:
            # Which server, as claude's driver says it: codex's own words are in the message
            # only, cut short when long.
            failed = {key: "failed" for key in sorted(self.plan.required_mcp)
                      if re.search(rf"(?:^|[;,]\s*){re.escape(key)}: ", self.mcp_failed)}
            if failed:
                return replace(died, details={**died.details, "mcp_servers": failed})
        if _cli.lasting_kind(died.message):
            # Refused before any request, in words only its stderr has (a prompt over its
            # input limit): no retry mends it, which the caller must be able to tell.
            return _died_as(died, died.message)
        return died


def _classify(message: str) -> RunFailure:
    return provider_failure(message, _FAILURES.kind(message),
                            provider_status=_cli.quoted_status(message))


def _died_as(died: RunFailure, said: str) -> RunFailure:
    """``died`` classified by what codex ``said`` (its exit code and signal kept)."""
    return died_as(died, _FAILURES.kind(said), provider_status=_cli.quoted_status(said))


def _tool_call(itype: str, item: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if itype == "command_execution":
        return "shell", {"command": as_str(item.get("command"))}
    if itype == "file_change":
        return "apply_patch", {"changes": _nesting.copy(as_list(item.get("changes")))}
    if itype == "mcp_tool_call":
        name = f"mcp__{as_str(item.get('server'))}__{as_str(item.get('tool'))}"
        arguments = item.get("arguments")
        return name, _nesting.copy(arguments) if isinstance(arguments, dict) else {}
    return _TOOL_ITEMS.get(itype, itype), {"query": as_str(item.get("query"))}


def _tool_result(itype: str, item: Mapping[str, Any]) -> tuple[str, bool]:
    failed = as_str(item.get("status")) == "failed"
    if itype == "command_execution":
        code = item.get("exit_code")
        return as_str(item.get("aggregated_output")), failed or (isinstance(code, int) and code != 0)
    if itype == "mcp_tool_call":
        error = as_dict(item.get("error"))
        if error:
            return as_str(error.get("message")) or "MCP tool call failed", True
        content = as_list(as_dict(item.get("result")).get("content"))
        return "\n".join(as_str(as_dict(p).get("text")) for p in content), failed
    if itype == "file_change":
        changes = as_list(item.get("changes"))
        text = "\n".join(f"{as_str(as_dict(c).get('kind'))} {as_str(as_dict(c).get('path'))}"
                         for c in changes)
        return text, failed
    return as_str(item.get("status")), failed


def _usage(event: Mapping[str, Any]) -> Usage | None:
    usage = as_dict(event.get("usage"))
    if not usage:
        return None
    return Usage(
        input_tokens=as_int(usage.get("input_tokens")),
        output_tokens=as_int(usage.get("output_tokens")),
        cached_input_tokens=as_int(usage.get("cached_input_tokens")),
    )

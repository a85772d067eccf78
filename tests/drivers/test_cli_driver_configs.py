"""Configuration, session identity and a missing binary, the same for the gemini, cursor and
codebuddy drivers (the command driver's are in test_command.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import errors
from adaptor.driver import SessionState, StandardSessionCodec
from adaptor.drivers import claude, codebuddy, codex, cursor, gemini

MODULES = [gemini, cursor, codebuddy]
# One value per driver-specific field that validate_config must refuse.
BAD_FIELDS: dict[Any, list[dict[str, Any]]] = {
    gemini: [{"approval_mode": "sometimes"}, {"home": ""}, {"extra_args": ["--yolo"]},
             {"extra_args": ["--output-format=json"]}, {"extra_args": ["-mgemini-pro"]}],
    cursor: [{"mode": "debug"}, {"extra_args": ["--force"]}, {"extra_args": ["--resume=x"]},
             {"extra_args": ["-mgpt-5"]}],
    codebuddy: [{"effort": "huge"}, {"permission_mode": "yes"}, {"max_turns": 0},
                {"extra_args": ["--print"]}, {"extra_args": ["--json-schema={}"]},
                {"extra_args": ["-rabc"]}],
}


@pytest.mark.parametrize("module", MODULES)
def test_config_validation_and_json_form(module: Any) -> None:
    config = module.Config.from_dict({"command": "x", "extra_args": ["--a", "b"],
                                      "env": {"K": "v"}, "model": "m"})
    assert config.extra_args == ("--a", "b")
    module.Driver(config).validate_config()
    with pytest.raises(ValueError, match="unknown config key"):
        module.Config.from_dict({"comand": "x"})
    common_bad: list[dict[str, Any]] = [{"grace_period": -1}, {"command": ""}, {"env": {"K": 1}},
                                        {"cwd": ""}, {"model": 3},
                                        # no environment or argument list can hold a NUL
                                        {"env": {"K\0B": "v"}}, {"env": {"K": "a\0b"}},
                                        {"extra_args": ["a\0b"]}]
    for bad in common_bad + BAD_FIELDS[module]:
        with pytest.raises((TypeError, ValueError)):
            module.Driver(module.Config.from_dict(bad)).validate_config()
    with pytest.raises(adaptor.InvalidDriverConfigError):
        adaptor.Agent(module.Driver(module.Config(grace_period=-1))).run("x")


# A short flag each driver sets itself, written with its value attached.
ATTACHED_OWNED = {claude: "-rsession-1", codex: "-mgpt-5", gemini: "-mgemini-pro",
                  cursor: "-mgpt-5", codebuddy: "-pc"}


def test_claude_refuses_a_permission_prompts_target_of_its_own() -> None:
    # "--permission-prompts none" denies whatever would prompt without asking: an ask policy's
    # on_approval was never called (the driver answers the prompts it routes to the host).
    with pytest.raises(ValueError, match="extra_args: --permission-prompts "):
        claude.Driver(claude.Config(extra_args=("--permission-prompts", "none"))).validate_config()


@pytest.mark.parametrize("module", list(ATTACHED_OWNED), ids=lambda m: m.__name__.rsplit(".")[-1])
def test_an_owned_short_flag_with_its_value_attached_is_refused(module: Any) -> None:
    # The CLIs' parsers read "-mgpt-5" as "-m gpt-5": the driver's own -m would be overridden.
    with pytest.raises(ValueError, match=f"extra_args: {ATTACHED_OWNED[module][:2]} "):
        module.Driver(module.Config(extra_args=(ATTACHED_OWNED[module],))).validate_config()
    # A value attached with "=" to a long option is that option's, whatever it starts with.
    module.Driver(module.Config(extra_args=("--add-note=-mine", "-Z1"))).validate_config()


@pytest.mark.parametrize(
    ("extra_args", "flag"),
    [(("--approvalMode", "yolo"), "--approval-mode"), (("-dy",), "-y"),
     (("--outputFormat=text",), "--output-format"), (("--sessionId", "x"), "--session-id")],
)
def test_gemini_owned_flags_are_refused_as_its_parser_reads_them(
    extra_args: tuple[str, ...], flag: str
) -> None:
    # yargs takes camelCase for an option's kebab-case name and "-dy" as "-d -y": these ran
    # the CLI in yolo mode (the shell ran) or left stream-json behind, with no word.
    with pytest.raises(ValueError, match=f"extra_args: {flag} "):
        gemini.Driver(gemini.Config(extra_args=extra_args)).validate_config()


@pytest.mark.parametrize("module", MODULES)
def test_session_fingerprint_and_codec(module: Any) -> None:
    def fingerprint(**fields: Any) -> str:
        return str(module.Driver(module.Config(**fields)).session_config_fingerprint())

    base = fingerprint(env={"API_KEY": "one"})
    assert base.startswith("sha256:") and base == fingerprint(env={"API_KEY": "one"})
    assert base == fingerprint(env={"API_KEY": "two"})  # values never count (nor leak)
    assert base == fingerprint(env={"API_KEY": "one"}, command="/other/cli", grace_period=9)
    assert base != fingerprint(env={"API_KEY": "one", "MORE": "x"})
    assert base != fingerprint(env={"API_KEY": "one"}, model="m")
    assert base != fingerprint(env={"API_KEY": "one"}, cwd="/w")
    codec = module.Driver().session_codec()
    assert codec == StandardSessionCodec(module.TYPE)
    state = SessionState("sid", data={"cwd": "/w"})
    assert codec.decode(codec.encode(state)) == dataclasses.replace(state, display_id="sid")
    assert module.Driver().descriptor().sessions.supports_resume is True


@pytest.mark.parametrize("module", MODULES)
def test_binary_not_found_exits_69(module: Any, tmp_path: Path) -> None:
    driver = module.Driver(module.Config(command="adaptor-missing-cli"))
    with pytest.raises(adaptor.RunError) as caught:
        adaptor.Agent(driver, workspace=str(tmp_path)).run("x")
    assert caught.value.reason == "infrastructure_error"
    assert caught.value.details == {"kind": "binary_not_found", "binary": "adaptor-missing-cli"}
    assert errors.exit_code_for(caught.value) == 69


def test_format_only_drivers_say_so() -> None:
    for module in (cursor, codebuddy):
        assert module.VERIFICATION.startswith("format-verified, not binary-verified")
    assert gemini.CLI_VERSION == "0.61.0"


def _never_started(tmp_path: Path) -> str:
    """A CLI that records being started: a refusal must come before it."""
    marker = tmp_path / "started"
    cli = tmp_path / "cli"
    cli.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    cli.chmod(0o755)
    return str(cli)


@pytest.mark.parametrize(
    ("module", "extra_args", "policy", "found"),
    [
        # The QA runs that showed it: each overrode what the run asked for, and the run passed.
        (codex, ("-c", 'sandbox_mode="danger-full-access"'), adaptor.Policy(sandbox="read_only"),
         ["sandbox_mode"]),
        (codex, ("--dangerously-bypass-approvals-and-sandbox",), adaptor.Policy(sandbox="read_only"),
         ["--dangerously-bypass-approvals-and-sandbox"]),
        (codex, ("-csandbox_workspace_write.network_access=true",),
         adaptor.Policy(sandbox="workspace_write"), ["sandbox_workspace_write.network_access"]),
        (codex, ("--config=web_search=\"live\"",), adaptor.Policy(web_search="deny"), ["web_search"]),
        # codex 0.171.0's permission profiles, which it takes over sandbox_mode.
        (codex, ("-c", 'permission_profile=":workspace"', "-cpermissions.mine.network=true"),
         adaptor.Policy(sandbox="read_only"), ["permission_profile", "permissions.mine.network"]),
        (claude, ("--allowedTools", "Bash"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")), ["--allowedTools"]),
        (claude, ("--settings={\"permissions\": {\"allow\": [\"Bash\"]}}",),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask")), ["--settings"]),
        # A plugin's hooks, and a session agent's, answer "allow" as a settings file's do: the
        # shell ran past ask and auto_reject, on_approval never called.
        (claude, ("--plugin-dir", "plugin", "--plugin-url=https://example.invalid/p.zip"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask")),
         ["--plugin-dir", "--plugin-url"]),
        (claude, ("--agents", '{"yolo": {"description": "d", "prompt": "p"}}', "--agent", "yolo"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")),
         ["--agent", "--agents"]),
        (claude, ("--allow-dangerously-skip-permissions",),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask")),
         ["--allow-dangerously-skip-permissions"]),
        # Flags its --help does not list load plugins and settings too: only those known not
        # to pre-approve tools pass under such a policy.
        (claude, ("--plugin-dir-no-mcp", "plugin", "--max-turns", "3", "--managed-settings={}"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask")),
         ["--managed-settings", "--plugin-dir-no-mcp"]),
        (gemini, ("--allowed-tools", "run_shell_command"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")), ["--allowed-tools"]),
        (gemini, ("--policy=allow-shell.toml", "--admin-policy", "more.toml"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")),
         ["--admin-policy", "--policy"]),
        (gemini, ("--allowedTools", "run_shell_command", "--adminPolicy=more.toml"),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")),
         ["--admin-policy", "--allowed-tools"]),
        (gemini, ("--allowedMcpServerNames=srv",),
         adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject")),
         ["--allowed-mcp-server-names"]),
    ],
)
def test_extra_args_that_override_an_explicit_policy_refuse_the_run(
    module: Any, extra_args: tuple[str, ...], policy: adaptor.Policy, found: list[str], tmp_path: Path
) -> None:
    config = module.Config(command=_never_started(tmp_path), extra_args=extra_args)
    with adaptor.Agent(module.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("go", policy=policy)
        assert caught.value.reason == "unsupported_driver"
        assert caught.value.details == {"kind": "policy_in_extra_args", "extra_args": found}
        assert not (tmp_path / "started").exists()
        # Without that explicit setting the CLI decides, and extra_args are its to set.
        with pytest.raises(adaptor.AgentFailedError):
            agent.run("go")
        assert (tmp_path / "started").exists()


def test_claude_flags_that_cannot_pre_approve_pass_under_an_asking_policy(tmp_path: Path) -> None:
    config = claude.Config(command=_never_started(tmp_path), extra_args=(
        "--max-turns", "3", "--debug", "--effort=high", "--mcp-config", "servers.json",
        "--disallowed-tools", "WebFetch", "--add-dir", str(tmp_path),
        # (a value that starts with "-" but names no flag was refused, as flag "- ")
        "--system-prompt", "- be brief"))
    asking = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask"))
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.AgentFailedError):  # (the CLI started, and failed)
            agent.run("go", policy=asking)
    assert (tmp_path / "started").exists()


def test_claude_refuses_an_env_that_loads_plugins_under_an_asking_policy(tmp_path: Path) -> None:
    # CLAUDE_CODE_PLUGIN_DIRS loads plugins as --plugin-dir does: their hooks let the shell
    # run past ask, on_approval never called.
    plugins = {"CLAUDE_CODE_PLUGIN_DIRS": str(tmp_path / "plugin")}
    config = claude.Config(command=_never_started(tmp_path), env=plugins)
    asking = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask"))
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("go", policy=asking)
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details == {"kind": "policy_in_env", "env": ["CLAUDE_CODE_PLUGIN_DIRS"]}
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    ("settings", "found"),
    [
        ('{"tools": {"allowed": ["run_shell_command"]}}', ["tools.allowed"]),
        ('{"mcpServers": {"deploy": {"command": "d", "trust": true}}}', ["mcpServers.deploy.trust"]),
        ('{"policyPaths": ["allow.toml"]}', ["policyPaths"]),
        ('{"tools": {"core": ["run_shell_command"]}}', ["tools.core"]),
        ('{"mcp": {"allowed": ["srv"], "autoAllowInHeadless": true}}',
         ["mcp.allowed", "mcp.autoAllowInHeadless"]),
        # Comments, which the CLI strips before it parses; a key may be written escaped.
        ('// shared\n{"tools": {/* mine */ "\\u0061llowed": ["run_shell_command"]}, "x": "//"}',
         ["tools.allowed"]),
        # Set as JavaScript reads it: an empty list or object is true; a list of servers
        # is walked by index.
        ('{"mcpServers": {"srv": {"command": "s", "trust": []}}, "mcp": {"autoAllowInHeadless": {}}}',
         ["mcp.autoAllowInHeadless", "mcpServers.srv.trust"]),
        ('{"mcpServers": [{"command": "s", "trust": true}]}', ["mcpServers.0.trust"]),
        # One the CLI could not parse either (a trailing comma) may say anything.
        ('{"tools": {"allowed": ["run_shell_command"],},}', ["(not JSON the driver can read)"]),
    ],
)
def test_gemini_auto_reject_refuses_a_workspace_whose_settings_allow_tools(
    settings: str, found: list[str], tmp_path: Path
) -> None:
    # The CLI loads a trusted workspace's .gemini/settings.json (headless runs need the trust):
    # a cloned repository's tools.allowed let the shell run under auto_reject, the run a success.
    workspace = tmp_path / "repo"
    (workspace / ".gemini").mkdir(parents=True)
    (workspace / ".gemini" / "settings.json").write_text(settings)
    strict = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject"))
    config = gemini.Config(command=_never_started(tmp_path))
    with adaptor.Agent(gemini.Driver(config), workspace=str(workspace)) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("go", policy=strict)
        assert caught.value.reason == "unsupported_driver"
        assert caught.value.details == {"kind": "policy_in_workspace_settings", "found": found,
                                        "settings": str(workspace / ".gemini" / "settings.json")}
        assert not (tmp_path / "started").exists()
        # Without auto_reject the settings are the CLI's to apply.
        with pytest.raises(adaptor.AgentFailedError):
            agent.run("go")
        assert (tmp_path / "started").exists()
    # Settings that allow nothing do not stand in the way.
    (workspace / ".gemini" / "settings.json").write_text('{"tools": {"exclude": ["web_fetch"]}}')
    (tmp_path / "started").unlink()
    with adaptor.Agent(gemini.Driver(config), workspace=str(workspace)) as agent:
        with pytest.raises(adaptor.AgentFailedError):
            agent.run("go", policy=strict)
    assert (tmp_path / "started").exists()
    # Nor do the user's own, which the CLI reads there when the workspace is its home.
    (workspace / ".gemini" / "settings.json").write_text(settings)
    (tmp_path / "started").unlink()
    home_config = gemini.Config(command=_never_started(tmp_path), home=str(workspace))
    with adaptor.Agent(gemini.Driver(home_config), workspace=str(workspace)) as agent:
        with pytest.raises(adaptor.AgentFailedError):
            agent.run("go", policy=strict)
    assert (tmp_path / "started").exists()


def test_codex_extra_args_cannot_replace_the_runs_developer_instructions(tmp_path: Path) -> None:
    config = codex.Config(command=_never_started(tmp_path), extra_args=("-c", 'developer_instructions="mine"'))
    with adaptor.Agent(codex.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("go", append_system_prompt="be brief")
    assert caught.value.details == {"kind": "policy_in_extra_args", "extra_args": ["developer_instructions"]}
    assert "append_system_prompt" in str(caught.value) and not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    ("tool", "source"),
    [("AskUserQuestion", "ask_user_question"), ("Bash", "bash"), ("ExitPlanMode", "exit_plan_mode"),
     ("mcp__ADAPTOR__echo", "mcp__adaptor__echo"), ("mcp__files__read_file", "mcp__files__read_file"),
     ("WebFetch2Go", "web_fetch2_go")],
)
def test_a_decision_source_names_the_tool_in_snake_case(tool: str, source: str) -> None:
    # An upper-case MCP key came out letter by letter: claude.mcp___a_d_a_p_t_o_r__echo.
    from adaptor.drivers import _cli

    assert _cli.snake(tool) == source

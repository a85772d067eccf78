"""Both drivers end to end through ``adaptor.Agent`` with fake executables replaying captures:
argv, stdin protocol, approvals, sessions, policy and conformance without the real CLIs."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import _nesting, errors
from adaptor.driver import Request, StandardSessionCodec
from adaptor.drivers import claude, codex, gemini
from adaptor.events import ProcessInfo, ToolCall
from adaptor.memory import Store
from adaptor.testing import conformance
from tests.drivers.conftest import FakeCLI, claude_with_deep_input, group_members

MakeFake = Callable[..., FakeCLI]
ASK = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask"))


@dataclasses.dataclass
class Item:
    name: str
    count: int


def claude_agent(fake: FakeCLI, tmp_path: Path, **options: Any) -> adaptor.Agent:
    config = claude.Config(command=fake.path, config_dir=str(tmp_path / "profile"),
                           env={"ANTHROPIC_API_KEY": "sk-test-secret"})
    return adaptor.Agent(claude.Driver(config), workspace=str(tmp_path), **options)


def codex_agent(fake: FakeCLI, tmp_path: Path, **options: Any) -> adaptor.Agent:
    config = codex.Config(command=fake.path, model="gpt-5.5", home=str(tmp_path / "codex-home"))
    return adaptor.Agent(codex.Driver(config), workspace=str(tmp_path), **options)


def spawn_argv(stream: adaptor.Stream) -> list[str]:
    spawns = [e for e in stream if isinstance(e, ProcessInfo) and e.kind == "spawn"]
    assert len(spawns) == 1
    return list(spawns[0].data["argv"])


# --- claude -------------------------------------------------------------------------------------


def test_claude_argv_stdin_and_env(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("claude-text", stdin_protocol=True)
    with claude_agent(fake, tmp_path, model="claude-test") as agent:
        stream = agent.stream("Say hello")
        argv = spawn_argv(stream)
        result = stream.result()
    assert result.text == "Hello from the mock Anthropic server."
    assert argv[1:8] == ["-p", "--input-format", "stream-json", "--output-format",
                         "stream-json", "--verbose", "--include-partial-messages"]
    assert argv[-2:] == ["--model", "claude-test"]
    assert "--permission-prompt-tool" not in argv  # no approval policy: the CLI's own rules
    init, user = fake.records("stdin")[:2]
    assert init["request"]["subtype"] == "initialize"
    assert user["message"] == {"role": "user", "content": "Say hello"}
    assert fake.records("cwd") == [str(tmp_path)]
    env = fake.records("env")[0]
    assert "CLAUDE_CONFIG_DIR" in env and "ANTHROPIC_API_KEY" in env
    assert "sk-test-secret" not in repr(result.to_json())


@pytest.mark.parametrize("env", [{}, {"ANTHROPIC_API_KEY": "sk-test-secret"}])
def test_claude_tool_input_nested_deeper_than_python_recurses(tmp_path: Path, env: dict[str, str]) -> None:
    # The parser's copy of the input and the transcript item's to_json recursed: the run
    # failed with a RecursionError wrapped as an infrastructure error.  With a secret, the
    # run's redaction walks the input too.
    exe = claude_with_deep_input(tmp_path, 1000)
    config = claude.Config(command=exe, config_dir=str(tmp_path / "profile"), env=env)
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        stream = agent.stream("Write hello.txt")
        calls = [e for e in stream if isinstance(e, ToolCall) and e.args is not None]
        result = stream.result()
    assert result.text.startswith("Tool result was: File created successfully")
    (tool_use,) = [item for item in result.transcript() if item.kind == "tool_call"]
    for value in (calls[0].args, tool_use.input, tool_use.to_json()["input"]):
        assert _nesting.deeper_than(value, 1000) and not _nesting.deeper_than(value, 1001)


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_claude_permission_prompt_round_trip(
    fake_cli: MakeFake, tmp_path: Path, answer: str
) -> None:
    name = "claude-perm-stdio-allow" if answer == "approve" else "claude-perm-stdio-deny"
    fake = fake_cli(name, stdin_protocol=True)
    asked: list[adaptor.ApprovalRequest] = []

    def decide(request: adaptor.ApprovalRequest) -> None:
        asked.append(request)
        request.approve() if answer == "approve" else request.deny("not today")

    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask",
                                                             on_reject="continue"))
    with claude_agent(fake, tmp_path, policy=policy, on_approval=decide) as agent:
        stream = agent.stream("please create perm.txt")
        argv = spawn_argv(stream)
        result = stream.result()
    assert argv[argv.index("--permission-prompt-tool") + 1] == "stdio"
    (request,) = asked
    assert (request.kind, request.title, request.source) == ("permission", "Create perm.txt",
                                                            "claude.bash")
    assert request.details["input"]["command"] == "touch /scratch/work/perm.txt"
    reply = fake.records("stdin")[2]["response"]
    assert reply["subtype"] == "success"
    if answer == "approve":
        assert reply["response"] == {"behavior": "allow", "updatedInput": {
            "command": "touch /scratch/work/perm.txt", "description": "Create perm.txt"}}
    else:
        assert reply["response"] == {"behavior": "deny", "message": "not today"}
        assert "permission_denials" in result.metadata
    decisions = [i for i in result.transcript() if i.subtype == "decision"]
    assert decisions[0].metadata["result"] == ("approved" if answer == "approve" else "rejected")


def test_claude_rejection_with_abort_stops_the_process(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("claude-perm-stdio-deny", stdin_protocol=True)
    with claude_agent(fake, tmp_path, policy=ASK) as agent:
        stream = agent.stream("please create perm.txt", on_approval=lambda r: r.deny("no"))
        events = list(stream)
        with pytest.raises(adaptor.ApprovalDeniedError) as caught:
            stream.result()
    pid = next(e.data["pid"] for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert group_members(pid) == []
    assert caught.value.result is not None and caught.value.result.raw().stdout
    # The group is stopped at once, so the CLI may die before it reads the answer; when it did
    # read it, it was a deny that also interrupts the turn.
    replies = fake.records("stdin")[2:3]
    if replies and replies[0] is not None:
        reply = replies[0]["response"]["response"]
        assert reply["behavior"] == "deny" and reply["interrupt"] is True


def test_claude_flags_for_schema_append_resume_and_fork(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("claude-json-schema", stdin_protocol=True)
    with claude_agent(fake, tmp_path, append_system_prompt="Be terse.") as agent:
        stream = agent.stream("give me structured data", schema=Item)
        argv = spawn_argv(stream)
        result = stream.result()
    assert result.decode(Item) == Item(name="mock", count=3)
    schema = argv[argv.index("--json-schema") + 1]
    assert '"$schema"' not in schema and '"count"' in schema
    append_file = argv[argv.index("--append-system-prompt-file") + 1]
    assert "Be terse." not in " ".join(argv)
    assert not os.path.exists(append_file)  # private per-run file, removed with the process

    store = Store()
    first = fake_cli("claude-text", stdin_protocol=True)
    with claude_agent(first, tmp_path, thread_store=store) as agent:
        agent.thread("t").run("hello")
    again = fake_cli("claude-resume", stdin_protocol=True)
    with claude_agent(again, tmp_path, thread_store=store) as agent:
        assert agent.thread("t").run("say it again").text == "Resumed reply."
        argv = again.records("argv")[0]
        assert argv[argv.index("--resume") + 1] == "1015e1df-1450-4cbf-a1da-79cc1a9c7cee"
        forked = fake_cli("claude-text", stdin_protocol=True)
    with claude_agent(forked, tmp_path, thread_store=store) as agent:
        # The fake answers with the parent's own id: a fork must not checkpoint that.
        with pytest.raises(adaptor.RunError) as caught:
            agent.thread("t").fork("t2").run("branch off")
        assert "checkpoint" in str(caught.value)
        assert "--fork-session" in forked.records("argv")[0]


def test_claude_bad_resume_falls_back_to_a_fresh_session(fake_cli: MakeFake, tmp_path: Path) -> None:
    store = Store()
    with claude_agent(fake_cli("claude-text", stdin_protocol=True), tmp_path,
                      thread_store=store) as agent:
        agent.thread("t").run("hello")
    refused = fake_cli("claude-resume-bad-id", stdin_protocol=True)
    with claude_agent(refused, tmp_path, thread_store=store) as agent:
        # continue-only surfaces the refusal; the fresh retry replays the same capture and so
        # fails the same way here, which is enough to see the fallback was taken.
        with pytest.raises(adaptor.ResumeRejectedError):
            agent.thread("t", resume_only=True).run("again")


def test_claude_api_error_is_classified(fake_cli: MakeFake, tmp_path: Path) -> None:
    with claude_agent(fake_cli("claude-err-429", stdin_protocol=True), tmp_path) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    assert caught.value.details["kind"] == "rate_limit"
    assert caught.value.details["retryable"] is True
    assert "429" in str(caught.value)


@pytest.mark.parametrize("limit", ["timeout", "budget"])
def test_claude_retrying_until_the_deadline_says_why(
    fake_exe: Callable[[str, str], str], tmp_path: Path, limit: str
) -> None:
    # With the CLI's default retries a bad key or a rate limit is retried for minutes: the
    # run's timeout ended it with only "run deadline of 3s exceeded", the 401 nowhere.
    retry = {"type": "system", "subtype": "api_retry", "attempt": 2, "max_retries": 10,
             "retry_delay_ms": 1100, "error_status": 401, "error": "authentication_failed"}
    exe = fake_exe("claude-retrying", f"""
        import sys, time
        print('{{"type":"system","subtype":"init","session_id":"s1","model":"m"}}', flush=True)
        print({json.dumps(json.dumps(retry))}, flush=True)
        time.sleep(60)
        """)
    config = claude.Config(command=exe, config_dir=str(tmp_path / "profile"))
    expected: type[adaptor.RunError] = adaptor.RunDeadlineExceededError
    options: dict[str, Any] = {"timeout": 3}
    said = "run deadline of 3s exceeded"
    if limit == "budget":
        expected = adaptor.ActiveExecutionTimeoutError
        options = {"policy": adaptor.Policy(active_execution_timeout=3)}
        said = "active execution budget of 3s exhausted"
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(expected) as caught:
            agent.run("say hello", **options)
    last = "API request failed (authentication_failed, HTTP 401); retry 2 of 10"
    assert str(caught.value) == f"{said}; the agent's last error: {last}"
    assert caught.value.result is not None
    assert caught.value.result.metadata["last_error"] == last


def test_claude_crash_report_names_the_crash(
    fake_exe: Callable[[str, str], str], tmp_path: Path
) -> None:
    # The real claude (a Bun executable) killed by SIGSEGV prints a crash report whose first
    # line is a rule of "=": the message quoted that rule as the reason.
    report = ["=" * 60, "Bun v1.4.6 (358d8293c) Linux x64", "",
              "panic(main thread): Segmentation fault at address 0x3F42",
              "oh no: Bun has crashed. This indicates a bug in Bun, not your code.",
              " https://bun.report/1.4.6/la1358d829kgggggBugogCg965wD4"]
    stderr = "\n".join(report) + "\n"
    exe = fake_exe("claude-crashing", f"""
        import os, signal, sys
        sys.stderr.write({stderr!r})
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
        """)
    config = claude.Config(command=exe, config_dir=str(tmp_path / "profile"))
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    assert str(caught.value) == ("claude ended without a result (killed by signal 11): "
                                 "panic(main thread): Segmentation fault at address 0x3F42")
    assert caught.value.details == {"exit_code": None, "signal": 11}


@pytest.mark.parametrize("module", [claude, codex, gemini], ids=lambda m: m.TYPE)
def test_a_cli_killed_mid_line_fails_by_its_signal(
    fake_exe: Callable[[str, str], str], tmp_path: Path, module: Any
) -> None:
    # Killed (the OOM killer, a crash) while writing a line: the run failed as "printed a
    # malformed stream" over the torn line, and the signal was nowhere in the error.
    exe = fake_exe("torn", """
        import os, signal, sys
        sys.stdout.write('{"type":"assistant","message":{"content":[{"type":"te')
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    config = module.Config(command=exe)
    with adaptor.Agent(module.Driver(config), workspace=str(tmp_path)) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    cli = os.path.basename(module.Config().command)
    assert str(caught.value) == f"{cli} ended without a result (killed by signal 9)"
    assert caught.value.details == {"exit_code": None, "signal": 9}
    assert caught.value.result is not None
    assert caught.value.result.metadata["protocol"] == "malformed"  # still said, and no checkpoint


@pytest.mark.parametrize("result_line", [
    b'{"type":"result","subtype":"success","is_error":false,"result":"hi \\xff","session_id":"s1"}',
    b'{"type":"result","subtype":"success","is_error":false,"res',
], ids=["not-utf8", "cut-short"])
def test_claude_unreadable_result_line_ends_the_run(
    fake_exe: Callable[[str, str], str], tmp_path: Path, result_line: bytes
) -> None:
    # claude waits on stdin for its next user frame after a result: a result line we could not
    # read left the run waiting on it until the run's deadline (for ever without one).
    exe = fake_exe("claude-unreadable", f"""
        import subprocess, sys
        sys.stdin.readline(), sys.stdin.readline()  # initialize, then the user frame
        subprocess.Popen(["sleep", "300"])  # a helper of the CLI's, in its process group
        out = sys.stdout.buffer
        out.write(b'{{"type":"system","subtype":"init","session_id":"s1","model":"m"}}\\n')
        out.write({result_line!r} + b"\\n")
        out.flush()
        sys.stdin.read()
        """)
    config = claude.Config(command=exe, config_dir=str(tmp_path / "profile"))
    with adaptor.Agent(claude.Driver(config), workspace=str(tmp_path)) as agent:
        stream = agent.stream("say hello", timeout=60)
        events = list(stream)
        with pytest.raises(adaptor.AgentFailedError) as caught:
            stream.result()
    assert str(caught.value).startswith("claude printed a malformed stream: unparsable JSON line")
    assert caught.value.details["kind"] == "protocol"
    assert caught.value.result is not None
    assert caught.value.result.metadata["protocol"] == "malformed"
    pid = next(e.data["pid"] for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert group_members(pid) == []


def test_claude_capabilities_are_honest(fake_cli: MakeFake, tmp_path: Path) -> None:
    with claude_agent(fake_cli("claude-text", stdin_protocol=True), tmp_path) as agent:
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(sandbox="read_only"))
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(web_search="deny"))


# --- codex --------------------------------------------------------------------------------------


def test_codex_argv_stdin_and_policy(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("codex-text")
    policy = adaptor.Policy(sandbox="workspace_write", web_search="deny")
    with codex_agent(fake, tmp_path, append_system_prompt="Be terse.") as agent:
        stream = agent.stream("say hello", policy=policy)
        shown = spawn_argv(stream)
        result = stream.result()
    assert result.text == "Hello from the mock OpenAI server."
    argv = fake.records("argv")[0]
    assert argv[1:4] == ["exec", "--json", "--skip-git-repo-check"]
    assert argv[-1] == "-"
    assert 'sandbox_mode="workspace-write"' in argv and 'web_search="disabled"' in argv
    assert 'developer_instructions="Be terse."' in argv
    assert "developer_instructions=<9 characters>" in shown
    assert "Be terse." not in " ".join(shown)
    assert fake.records("stdin") == ["say hello"]
    assert "CODEX_HOME" in fake.records("env")[0]


def test_codex_schema_file_and_resume(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("codex-output-schema")
    with codex_agent(fake, tmp_path) as agent:
        assert agent.run("give", schema=Item).decode(Item) == Item(name="mock", count=3)
    argv = fake.records("argv")[0]
    schema_file = argv[argv.index("--output-schema") + 1]
    assert not os.path.exists(schema_file)  # private per-run dir, removed after the run
    assert "codex-home" not in schema_file

    store = Store()
    with codex_agent(fake_cli("codex-text"), tmp_path, thread_store=store) as agent:
        agent.thread("t").run("hello")
    again = fake_cli("codex-resume")
    with codex_agent(again, tmp_path, thread_store=store) as agent:
        assert agent.thread("t").run("again").text == "Resumed reply."
    argv = again.records("argv")[0]
    assert argv[1:3] == ["exec", "resume"]
    assert argv[-2:] == ["01a2362d-3ecd-7163-ac4a-f9331fbe9570", "-"]


def test_codex_refuses_ask_before_starting(fake_cli: MakeFake, tmp_path: Path) -> None:
    fake = fake_cli("codex-text")
    with codex_agent(fake, tmp_path) as agent:
        with pytest.raises(adaptor.HumanDecisionModeUnsupportedError):
            agent.run("x", policy=ASK)
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(browser="allow"))
        auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
        assert agent.run("x", policy=auto).text
    assert len(fake.records("argv")) == 1


def test_codex_bad_resume_is_rejected(fake_cli: MakeFake, tmp_path: Path) -> None:
    store = Store()
    with codex_agent(fake_cli("codex-text"), tmp_path, thread_store=store) as agent:
        agent.thread("t").run("hello")
    with codex_agent(fake_cli("codex-resume-bad-id"), tmp_path, thread_store=store) as agent:
        with pytest.raises(adaptor.ResumeRejectedError) as caught:
            agent.thread("t", resume_only=True).run("again")
    assert "no rollout found" in caught.value.reason


# --- shared -------------------------------------------------------------------------------------


def test_binary_not_found_exits_69(tmp_path: Path) -> None:
    for driver in (claude.Driver(claude.Config(command="adaptor-missing-cli")),
                   codex.Driver(codex.Config(command="adaptor-missing-cli"))):
        with pytest.raises(adaptor.RunError) as caught:
            adaptor.Agent(driver, workspace=str(tmp_path)).run("x")
        assert caught.value.reason == "infrastructure_error"
        assert caught.value.details == {"kind": "binary_not_found",
                                        "binary": "adaptor-missing-cli"}
        assert errors.exit_code_for(caught.value) == 69


@pytest.mark.parametrize("module", [claude, codex])
def test_config_validation_and_json_form(module: Any) -> None:
    config = module.Config.from_dict({"command": "x", "extra_args": ["--a", "b"], "env": {"K": "v"}})
    assert config.extra_args == ("--a", "b")
    module.Driver(config).validate_config()
    with pytest.raises(ValueError, match="unknown config key"):
        module.Config.from_dict({"comand": "x"})
    for bad in ({"extra_args": ["--output-format=json" if module is claude else "--json"]},
                {"grace_period": -1}, {"command": ""}, {"env": {"K": 1}}):
        with pytest.raises((TypeError, ValueError)):
            module.Driver(module.Config.from_dict(bad)).validate_config()
    with pytest.raises(adaptor.InvalidDriverConfigError):
        adaptor.Agent(module.Driver(module.Config(grace_period=-1))).run("x")


@pytest.mark.parametrize("module", [claude, codex])
def test_session_fingerprint_and_codec(module: Any) -> None:
    def fingerprint(**fields: Any) -> str:
        return str(module.Driver(module.Config(**fields)).session_config_fingerprint())

    base = fingerprint(env={"API_KEY": "one"})
    assert base.startswith("sha256:") and base == fingerprint(env={"API_KEY": "one"})
    assert base == fingerprint(env={"API_KEY": "two"})  # values never count (nor leak)
    assert base == fingerprint(env={"API_KEY": "one"}, command="/other/cli", grace_period=9)
    assert base != fingerprint(env={"API_KEY": "one", "MORE": "x"})
    assert base != fingerprint(env={"API_KEY": "one"}, model="m")
    codec = module.Driver().session_codec()
    assert codec == StandardSessionCodec(module.TYPE)
    state = adaptor.driver.SessionState("sid", data={"cwd": "/w"})
    assert codec.decode(codec.encode(state)) == dataclasses.replace(state, display_id="sid")
    assert codec.encode(None) == {} and codec.decode({}) is None
    assert module.Driver().descriptor().sessions.supports_resume


def test_resume_from_another_directory_is_rejected(tmp_path: Path) -> None:
    state = adaptor.driver.SessionState("sid", data={"cwd": str(tmp_path / "elsewhere")})
    request = Request(run_id="r", prompt="x", workspace_cwd=str(tmp_path),
                      session=adaptor.driver.SessionContext("continue_or_start", state))
    from adaptor.testing import RecordingSink

    for driver in (claude.Driver(), codex.Driver()):
        with pytest.raises(adaptor.ResumeRejectedError, match="working directory"):
            driver.run(request, RecordingSink())


def test_conformance_with_replaying_fakes(fake_cli: MakeFake) -> None:
    claude_fake = fake_cli("claude-text", stdin_protocol=True)
    codex_fake = fake_cli("codex-text")
    made: list[claude.Driver] = []

    def make_claude() -> claude.Driver:
        made.append(claude.Driver(claude.Config(command=claude_fake.path)))
        return made[-1]

    def make_claude_stub(path: str) -> claude.Driver:
        made.append(claude.Driver(claude.Config(command=path)))
        return made[-1]

    conformance.run(make_claude, stub_driver=make_claude_stub).raise_for_failures()
    conformance.run(
        lambda: codex.Driver(codex.Config(command=codex_fake.path)),
        stub_driver=lambda path: codex.Driver(codex.Config(command=path)),
    ).raise_for_failures()
    for driver in made:
        driver.close_processes(5)


def test_claude_private_files_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    # Under umask 000 the append-system-prompt file was 0666 (open()'s default), beside an
    # MCP config made 0600.
    import stat
    import types

    from adaptor.drivers.claude import _Files

    plan = types.SimpleNamespace(append="Be terse.", mcp=(), skills=())
    before = os.umask(0)
    try:
        files = _Files.write(str(tmp_path), plan)  # type: ignore[arg-type]
    finally:
        os.umask(before)
    assert files.append is not None
    assert stat.S_IMODE(os.stat(files.append).st_mode) == 0o600
    assert Path(files.append).read_text() == "Be terse."

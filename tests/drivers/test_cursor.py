"""The ``cursor`` driver end to end through ``adaptor.Agent`` against ``fake_cursor.py``, a fake
``cursor-agent`` printing the documented stream-json format (format-verified only: the real CLI
cannot be installed here)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor.drivers import cursor
from adaptor.events import Notice, TextDelta, ToolCall, ToolResult
from adaptor.memory import Store
from adaptor.testing import conformance
from tests.drivers._fakes import module_cli, records
from tests.drivers.conftest import FakeCLI

SESSION = "cursor-happy"
MakeAgent = Callable[..., adaptor.Agent]



@pytest.fixture
def fake(fake_exe: Callable[[str, str], str], tmp_path: Path) -> FakeCLI:
    return module_cli(fake_exe, "cursor-agent", "fake_cursor", tmp_path / "record.jsonl")


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    path = tmp_path / "work"
    path.mkdir()
    return str(path)


@pytest.fixture
def make_agent(fake: FakeCLI, tmp_path: Path, workspace: str,
               monkeypatch: pytest.MonkeyPatch) -> MakeAgent:
    def make(scenario: str = "text", *, known: str = "", model: str = "",
             **options: Any) -> adaptor.Agent:
        # The fake's controls are inherited, not config env: every config env value is a
        # secret of the run, and the session id or scenario name would show as <redacted>.
        for name, value in {"FAKE_SCENARIO": scenario, "FAKE_RECORD": str(tmp_path / "record.jsonl"),
                            "FAKE_SESSION_ID": SESSION, "FAKE_KNOWN_SESSIONS": known}.items():
            monkeypatch.setenv(name, value)
        driver = cursor.Driver(cursor.Config(command=fake.path, model=model))
        return adaptor.Agent(driver, workspace=workspace, **options)

    return make


def test_text_argv_stdin_and_resume(make_agent: MakeAgent, fake: FakeCLI, workspace: str) -> None:
    store = Store()
    with make_agent(model="gpt-5", thread_store=store, instructions="Be brief.") as agent:
        stream = agent.thread("t").stream("Say hello")
        events = list(stream)
        result = stream.result()
    assert result.text == "Cursor says hi."
    assert (result.provider, result.model) == ("cursor", "GPT-5")
    assert records(fake, "argv")[0] == ["-p", "--output-format", "stream-json", "--workspace",
                                       os.path.realpath(workspace), "--model", "gpt-5"]
    assert records(fake, "stdin") == ["Be brief.\n\nSay hello"]
    assert records(fake, "cwd") == [os.path.realpath(workspace)]
    deltas = [(e.phase, e.text) for e in events if isinstance(e, TextDelta)]
    assert deltas == [("start", ""), ("content", "Cursor "), ("content", "says hi."), ("end", "")]
    assert [i.kind for i in result.transcript()] == ["init", "user", "assistant", "result"]
    terminal = result.raw().terminal
    assert terminal is not None and terminal.event == "result"

    with make_agent(model="gpt-5", thread_store=store, instructions="Be brief.",
                    known=SESSION) as agent:
        again = agent.thread("t").run("again")
    argv = records(fake, "argv")[1]
    assert argv[argv.index("--resume") + 1] == SESSION
    assert again.metadata["session_id"] == SESSION


def test_tool_calls(make_agent: MakeAgent) -> None:
    with make_agent("tool") as agent:
        stream = agent.stream("read the notes")
        events = list(stream)
        result = stream.result()
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.phase, c.id, c.name) for c in calls] == [("start", "call_1", "read"),
                                                        ("end", "call_1", "read")]
    assert calls[0].args == {"path": "notes.txt"}
    assert [(r.result, r.is_error) for r in events if isinstance(r, ToolResult)] == [
        ("the notes", False)]
    # Assistant frames are deltas of one answer, tool calls or not (cursor's `result` agrees).
    assert result.text == "Let me look. Cursor says hi."
    kinds = [i.kind for i in result.transcript()]
    assert kinds == ["init", "user", "assistant", "tool_call", "tool_result", "assistant", "result"]

    with make_agent("tool_failure") as agent:
        failed = agent.run("run false")
    item = next(i for i in failed.transcript() if i.kind == "tool_result")
    assert item.is_error and item.tool_name == "shell"
    assert item.text == '{"exitCode":1,"stderr":"boom"}'


@pytest.mark.parametrize("scenario", ["malformed", "session_change", "missing_session",
                                      "after_terminal"])
def test_protocol_violations_fail_the_run(make_agent: MakeAgent, scenario: str) -> None:
    with make_agent(scenario, thread_store=Store()) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.thread("t").run("hi")
        with pytest.raises(adaptor.ThreadNotFoundError):
            agent.thread("t").checkpoint()  # a malformed run never stores a session
    assert caught.value.details["kind"] == "protocol"
    assert caught.value.result is not None
    assert caught.value.result.metadata["protocol"] == "malformed"


def test_missing_terminal_error_terminal_and_login(make_agent: MakeAgent) -> None:
    with make_agent("no_terminal") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.details["exit_code"] == 1
    assert caught.value.details["kind"] == "provider_unavailable"
    assert "ended without a result (exit code 1)" in str(caught.value)

    with make_agent("error_terminal") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert str(caught.value).startswith("cursor terminal result reported an error")
    assert caught.value.details["kind"] == "rate_limit"
    assert caught.value.details["retryable"] is True

    with make_agent("not_logged_in") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.details["kind"] == "auth"


@pytest.mark.parametrize(("error", "kind"), [
    ("Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing "
     "to upgrade or purchase credits.", "quota"),
    ("Error: 429 {\"error\":{\"message\":\"You exceeded your current quota, please check your "
     "plan and billing details.\",\"type\":\"insufficient_quota\",\"code\":"
     "\"insufficient_quota\"}}", "quota"),
    ("The model `gpt-9` does not exist or you do not have access to it.", "model_not_found"),
    ("prompt is too long: 215000 tokens > 200000 maximum", "context_too_long"),
], ids=["credit_balance", "insufficient_quota", "model_not_found", "context_too_long"])
def test_errors_no_retry_mends_have_their_own_kinds(
        make_agent: MakeAgent, monkeypatch: pytest.MonkeyPatch, error: str, kind: str) -> None:
    # The provider's words as the error result relays them: the quota was a retryable
    # rate_limit (its 429), the others had no kind.
    monkeypatch.setenv("FAKE_ERROR", error)
    with make_agent("error_terminal") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.reason == "agent_error"
    assert (caught.value.details["kind"], caught.value.details["retryable"]) == (kind, False)
    assert error in str(caught.value)


# A CLI that prints nothing and dies with $DIE_WITH on stderr.
DIES = """\
import os, sys
sys.stdin.read()
sys.stderr.write(os.environ["DIE_WITH"] + "\\n")
sys.exit(1)
"""


@pytest.mark.parametrize(("stderr", "kind"), [
    # Numbers that only look like HTTP statuses made a deterministic failure retryable or auth.
    ("Error: config parse error at line 512", None),
    ("Error: tool output exceeded 401 tokens", None),
    ("Error: could not open login.txt", None),
    ("Error: 503 Service Unavailable", "provider_unavailable"),
    ("Error: request failed with status 429", "rate_limit"),
    ("Error: Please run 'cursor-agent login' first", "auth"),
])
def test_a_death_is_classified_by_what_it_says_and_keeps_both_keys(
        fake_exe: Callable[[str, str], str], stderr: str, kind: str | None) -> None:
    exe = fake_exe("cursor-agent", DIES)
    with adaptor.Agent(cursor.Driver(cursor.Config(command=exe, env={"DIE_WITH": stderr}))) \
            as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    details = caught.value.details
    assert details.get("kind") == kind
    assert details.get("retryable") == (None if kind is None else kind != "auth")
    # drivers.md: a CLI that ends without its terminal has both keys, like claude's and codex's.
    assert (details["exit_code"], details["signal"]) == (1, None)


def test_an_error_terminal_is_no_answer(fake_exe: Callable[[str, str], str]) -> None:
    # Its text stood in for the missing deltas: the failed run's result.text was the error.
    exe = fake_exe("cursor-agent", """\
        import sys
        sys.stdin.read()
        print('{"type":"system","subtype":"init","session_id":"s"}')
        print('{"type":"result","subtype":"success","is_error":true,'
              '"result":"Invalid API key provided","session_id":"s"}')
        sys.exit(1)
    """)
    with adaptor.Agent(cursor.Driver(cursor.Config(command=exe))) as agent, \
            pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.result is not None and caught.value.result.text == ""
    assert str(caught.value) == ("cursor terminal result reported an error: "
                                 "Invalid API key provided")
    assert caught.value.details["kind"] == "auth"


def test_other_events_are_kept_as_system_items(make_agent: MakeAgent) -> None:
    with make_agent("thinking") as agent:
        result = agent.run("think")
    assert [i.subtype for i in result.transcript() if i.kind == "system"] == ["thinking/delta"]


def test_refused_resume_falls_back_or_raises(make_agent: MakeAgent) -> None:
    store = Store()
    with make_agent(thread_store=store) as agent:
        agent.thread("t").run("hello")
    with make_agent(thread_store=store) as agent:  # the CLI no longer knows the chat
        with pytest.raises(adaptor.ResumeRejectedError) as caught:
            agent.thread("t", resume_only=True).run("again")
        assert f"chat {SESSION} not found" in caught.value.reason
        stream = agent.thread("t").stream("again")
        notices = [e for e in stream if isinstance(e, Notice)]
        assert stream.result().text == "Cursor says hi."
    assert any(n.data.get("phase") == "thread.resume_rejected" for n in notices)


def test_honest_capabilities(make_agent: MakeAgent, fake: FakeCLI) -> None:
    auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with make_agent(thread_store=Store()) as agent:
        assert agent.run("x", policy=auto).text == "Cursor says hi."
        assert records(fake, "argv")[-1][-1] == "--force"
        with pytest.raises(adaptor.HumanDecisionModeUnsupportedError):
            agent.run("x", policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(
                permission="ask")))
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(web_search="allow"))
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("x", append_system_prompt="Be terse.")
        assert caught.value.reason == "unsupported_driver"
        agent.thread("parent").run("x")
        with pytest.raises(adaptor.ResumeRejectedError, match="cannot fork"):
            agent.thread("parent").fork("child").run("x")
        # No native schema: the SDK validates a prompt-instructed answer (this one is not JSON).
        with pytest.raises(adaptor.PolicyViolationError):
            agent.run("x", schema=dict)
    assert "JSON Schema" in str(records(fake, "stdin")[-1])
    assert len(records(fake, "argv")) == 3  # the refused runs started nothing


def test_conformance(fake: FakeCLI, tmp_path: Path) -> None:
    # The fake knows the session it starts, which RES-01 resumes.
    session = {"FAKE_SESSION_ID": "conformance-1", "FAKE_KNOWN_SESSIONS": "conformance-1"}
    env = {"FAKE_RECORD": str(tmp_path / "record.jsonl"), **session}
    conformance.run(
        lambda: cursor.Driver(cursor.Config(command=fake.path, env=env)),
        stub_driver=lambda path: cursor.Driver(cursor.Config(command=path)),
    ).raise_for_failures()


def test_other_result_subtypes_are_not_terminal() -> None:
    lines = [b'{"type":"system","subtype":"init","session_id":"s"}',
             b'{"type":"result","subtype":"error","is_error":true,"result":"Rate limit hit",'
             b'"session_id":"s"}']
    response = cursor.replay(b"\n".join(lines), b"", 1)
    assert response.raw_streams.terminal is None and response.checkpoint is None
    assert [i.subtype for i in response.transcript] == ["", "result/error"]
    assert response.failure is not None
    assert response.failure.message == ("cursor-agent ended without a result (exit code 1) "
                                        "(Rate limit hit)")
    assert response.failure.details["kind"] == "rate_limit"

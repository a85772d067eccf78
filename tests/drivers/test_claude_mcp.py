"""Host tools, declared MCP servers and skills delivered to the real ``claude`` binary.

The mock Anthropic server scripts the model's tool_use turns; what reached the next model turn
is read back from the requests the mock received.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import adaptor
from adaptor import mcp, skill, tool
from adaptor.drivers import claude
from adaptor.memory import Store
from tests.drivers.mock_anthropic import AnthropicMock
from tests.drivers.mock_tools import (
    admissions,
    anthropic_tool_results,
    echo_server,
    run,
    spawn,
    tool_events,
)
from tests.drivers.test_real_clis import wait_until_gone
from tests.host_tools import REJECTION, add

pytestmark = pytest.mark.slow

pytest.importorskip("mcp", reason="host tools and the echo server need the mcp extra")

def test_the_model_calls_a_host_tool(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admitted = admissions(monkeypatch)
    anthropic.configure(tool=("mcp__adaptor__add", {"a": 2, "b": 3}))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[add]) as agent:
        result, events = run(agent, "add 2 and 3")
    ((token_env, token),) = admitted[0].items()
    assert result.text == 'Tool result was: {"total":5}'
    # The handler's answer reached the model's next turn.
    assert anthropic_tool_results(anthropic.messages()[-1]["messages"]) == [('{"total":5}', False)]
    assert tool_events(events) == [
        ("call", "mcp__adaptor__add", "start", None),
        ("call", "mcp__adaptor__add", "end", None),
        ("result", "mcp__adaptor__add", '{"total":5}', False),
    ]
    argv = spawn(events).data["argv"]
    assert argv[argv.index("--allowedTools") + 1] == "mcp__adaptor__add"
    assert "--mcp-config" in argv and token_env in spawn(events).data["env"]
    init = next(i for i in result.transcript() if i.kind == "init")
    assert {"name": "adaptor", "status": "connected"} in init.metadata["mcp_servers"]
    # The gateway's secret travels by variable name only.
    assert all(token not in json.dumps(adaptor.events.to_json(e)) for e in events)
    assert token not in " ".join(argv)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [({"a": -1, "b": 0}, REJECTION), ({"a": "SECRET-ARG", "b": 0}, "wrong type")],
    ids=["rejection", "invalid-arguments"],
)
def test_refusals_reach_the_model(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    arguments: dict[str, object], expected: str,
) -> None:
    anthropic.configure(tool=("mcp__adaptor__add", arguments))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[add]) as agent:
        result, events = run(agent, "add")
    ((text, is_error),) = anthropic_tool_results(anthropic.messages()[-1]["messages"])
    assert is_error and expected in text and "SECRET-ARG" not in text
    ((_, name, reported, flagged),) = [t for t in tool_events(events) if t[0] == "result"]
    assert (name, reported, flagged) == ("mcp__adaptor__add", text, True)
    assert result.text == f"Tool result was: {text}"


def test_a_result_over_the_limit_reaches_the_model_as_an_error(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str
) -> None:
    # 2 MB: claude itself would keep it in a file of its profile and hand the model the path.
    big = tool.define("big", "A whole file", lambda value: "SECRET-ROW\n" * 200_000)
    anthropic.configure(tool=("mcp__adaptor__big", {}))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[big]) as agent:
        result, events = run(agent, "read it")
    expected = ("the tool's result was 2200000 bytes, over this tool's limit of 1048576 bytes, so "
                "it was not sent; call the tool again asking for less (a narrower query, or one "
                "page at a time)")
    # claude adds a hint of its own on a deferred tool's error (its input schema).
    ((text, is_error),) = anthropic_tool_results(anthropic.messages()[-1]["messages"])
    assert is_error and text.startswith(expected + "\n") and "SECRET-ROW" not in text
    # Nor does the run's record hold the result.
    assert [t for t in tool_events(events) if t[0] == "result"] == [
        ("result", "mcp__adaptor__big", text, True)]
    assert result.text == f"Tool result was: {text}"


def test_a_declared_stdio_server_is_started_and_used(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    tmp_path: Path,
) -> None:
    anthropic.configure(tool=("mcp__echo__echo", {"text": "ping"}))
    server = mcp.stdio("echo", sys.executable, [echo_server(tmp_path)],
                       env={"ECHO_PREFIX": "from-env:"})
    asked: list[adaptor.ApprovalRequest] = []

    def approve(request: adaptor.ApprovalRequest) -> None:
        asked.append(request)
        request.approve()

    # Tools of declared servers go through the run's permission policy like any CLI tool.
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask"))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, mcp=[server],
                       policy=policy, on_approval=approve) as agent:
        result, events = run(agent, "echo ping")
    assert [(r.kind, r.details["tool_name"]) for r in asked] == [("permission", "mcp__echo__echo")]
    ((text, is_error),) = anthropic_tool_results(anthropic.messages()[-1]["messages"])
    assert "from-env:ping" in text and not is_error  # what the model got: env reached the server
    # An MCP server's env values are secrets of the run: the events show them redacted.
    assert ("result", "mcp__echo__echo", text.replace("from-env:", "<redacted>"), False) \
        in tool_events(events)
    assert "from-env:" not in json.dumps(spawn(events).data)  # env values stay in the 0600 file


PEEK_SERVER = """
import json, os
from mcp.server.mcpserver import MCPServer

server = MCPServer("peek")

@server.tool()
def peek() -> str:
    \"\"\"What of claude's environment this server was started with.\"\"\"
    seen = {k: v for k, v in os.environ.items() if k.startswith("ADAPTOR_TOOLS_TOKEN") or k == "MCP_TOOL_TIMEOUT"}
    return json.dumps(seen)

server.run()
"""


def test_a_declared_server_gets_no_tool_token_and_host_tools_may_take_their_run(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A declared stdio server starts with claude's environment: it got the gateway's token
    # (so its code could call every host tool), which mcp.validate refuses to hand any server.
    # And claude gave up on a host tool after 60 s ("The operation timed out.") while the
    # handler ran on: a delegation to another agent could not take longer.
    admitted = admissions(monkeypatch)
    anthropic.configure(tool=("mcp__peek__peek", {}))
    script = tmp_path / "peek_server.py"
    script.write_text(PEEK_SERVER)
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[add],
                       mcp=[mcp.stdio("peek", sys.executable, [str(script)])], policy=policy) as agent:
        run(agent, "peek", timeout=600)
    ((token_env, _),) = admitted[0].items()
    ((text, is_error),) = anthropic_tool_results(anthropic.messages()[-1]["messages"])
    seen = json.loads(json.loads(text)["result"])  # (the server's structured result)
    assert not is_error and seen[token_env] == ""
    assert 540_000 < int(seen["MCP_TOOL_TIMEOUT"]) <= 601_000  # until the run's deadline


def test_a_host_tool_whose_name_claude_would_drop_is_refused(
    claude_config: Callable[..., claude.Config], workspace: str
) -> None:
    # mcp__adaptor__<name> over 128 characters: claude left the tool out without a word, the
    # run succeeded, and the model answered "No such tool available".
    long_name = "t" * 115
    handler = tool.define(long_name, "a tool with a long name", lambda args: {"ok": True})
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[handler]) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("go")
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details == {"kind": "tool_name_too_long", "tools": [long_name]}
    assert "names over 114 characters" in str(caught.value)


def test_a_skill_is_visible_to_the_cli(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str
) -> None:
    style = skill.inline("house-style", "---\nname: house-style\ndescription: Use for prose "
                         "in this repository.\n---\nAlways write MAGENTA-ZEBRA at the end.\n")
    anthropic.configure(tool=("Skill", {"skill": "house-style"}))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace,
                       skills=[style]) as agent:
        result, _ = run(agent, "write something")
    init = next(i for i in result.transcript() if i.kind == "init")
    assert "house-style" in init.metadata["skills"]  # the CLI's own init event lists it
    first, last = anthropic.messages()[0], anthropic.messages()[-1]
    assert "Use for prose in this repository." in json.dumps(first)  # the skill listing
    assert "MAGENTA-ZEBRA" in json.dumps(last["messages"])  # the body, once the model invoked it


def test_a_required_server_that_does_not_connect_fails_the_run(
    claude_config: Callable[..., claude.Config], workspace: str
) -> None:
    broken = mcp.stdio("broken", "/bin/false", required=True, required_reason="the test says so")
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace,
                       mcp=[broken]) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("hello")
    assert caught.value.details == {"mcp_servers": {"broken": "failed"}}
    assert "required MCP server(s) not connected: broken (failed)" in str(caught.value)


def test_thread_turns_with_tools_never_reuse_a_process(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str
) -> None:
    anthropic.configure(tool=("mcp__adaptor__add", {"a": 1, "b": 1}))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace, tools=[add],
                       thread_store=Store()) as agent:
        first = agent.thread("t").run("one")
        second = agent.thread("t").run("two")
        assert (first.metadata["process"], second.metadata["process"]) == ("spawned", "spawned")
        assert first.metadata["session_id"] == second.metadata["session_id"]
        # Nothing is kept that would refer to the first run's files or the gateway later on.
        assert wait_until_gone(int(first.metadata["pid"])) == []
        assert wait_until_gone(int(second.metadata["pid"])) == []
    assert second.text == 'Tool result was: {"total":2}'

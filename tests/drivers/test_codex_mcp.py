"""Host tools, declared MCP servers and skills delivered to the real ``codex`` binary.

:class:`MCPOpenAIMock` scripts the model: a ``tool_search`` for the MCP tool, then the call in
the namespace codex returned; or a ``cat`` of the announced ``SKILL.md``.  What reached the
next model turn is read back from the requests the mock received.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import adaptor
from adaptor import _gateway, mcp, skill, tool
from adaptor.drivers import codex
from adaptor.memory import Store
from tests.drivers.mock_tools import (
    MCPOpenAIMock,
    admissions,
    echo_server,
    openai_texts,
    openai_tool_outputs,
    run,
    spawn,
    tool_events,
)
from tests.host_tools import REJECTION, add

pytestmark = pytest.mark.slow

pytest.importorskip("mcp", reason="host tools and the echo server need the mcp extra")


@pytest.fixture
def openai() -> Iterator[MCPOpenAIMock]:
    """Overrides the conftest's ``openai`` (and so ``codex_config``'s): the mock that speaks MCP."""
    with MCPOpenAIMock() as mock:
        yield mock


def last_output(mock: MCPOpenAIMock) -> str:
    return openai_tool_outputs(mock.responses()[-1])[-1]


def test_the_model_calls_a_host_tool(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admitted = admissions(monkeypatch)
    openai.mcp_tool = ("add", {"a": 2, "b": 3})
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace, tools=[add]) as agent:
        result, events = run(agent, "add 2 and 3")
    ((token_env, token),) = admitted[0].items()
    assert '{"total":5}' in last_output(openai)  # the handler's answer reached the model
    assert result.text.startswith("Tool output was: ") and '{"total":5}' in result.text
    assert tool_events(events) == [
        ("call", "mcp__adaptor__add", "start", None),
        ("call", "mcp__adaptor__add", "end", None),
        ("result", "mcp__adaptor__add", '{"total":5}', False),
    ]
    argv = spawn(events).data["argv"]
    assert f'mcp_servers.adaptor.bearer_token_env_var="{token_env}"' in argv
    assert "mcp_servers.adaptor.required=true" in argv
    assert token_env in spawn(events).data["env"]
    assert all(token not in json.dumps(adaptor.events.to_json(e)) for e in events)


def test_a_thread_resumes_with_its_tools(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str
) -> None:
    openai.mcp_tool = ("add", {"a": 1, "b": 1})
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace, tools=[add],
                       thread_store=Store()) as agent:
        first = agent.thread("t").run("one")
        second = agent.thread("t").run("two")  # exec resume takes the same -c overrides
    assert first.metadata["thread_id"] == second.metadata["thread_id"]
    assert '{"total":2}' in last_output(openai)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [({"a": -1, "b": 0}, REJECTION), ({"a": "SECRET-ARG", "b": 0}, "wrong type")],
    ids=["rejection", "invalid-arguments"],
)
def test_refusals_reach_the_model(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    arguments: dict[str, object], expected: str,
) -> None:
    openai.mcp_tool = ("add", arguments)
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace, tools=[add]) as agent:
        _, events = run(agent, "add")
    sent = last_output(openai)
    assert expected in sent and "SECRET-ARG" not in sent
    ((_, name, reported, flagged),) = [t for t in tool_events(events) if t[0] == "result"]
    assert name == "mcp__adaptor__add" and expected in str(reported) and flagged is True


def test_declared_stdio_and_http_servers_are_used(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    tmp_path: Path,
) -> None:
    # An http server that needs a header: another gateway, whose token the test knows.
    remote = _gateway.Gateway(tool.check_catalogue([add]))
    endpoint = remote.start()
    header = "Bearer " + remote.admit(threading.Event()).env[endpoint.server.bearer_token_env]
    # Required: codex waits for those before the first model request, and only for those.
    servers = [
        mcp.stdio("echo", sys.executable, [echo_server(tmp_path)], env={"ECHO_PREFIX": "it's $x:"},
                  required=True),
        mcp.http("remote", endpoint.server.url, headers={"Authorization": header}, required=True),
    ]
    try:
        with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace,
                           mcp=servers) as agent:
            openai.mcp_tool = ("echo", {"text": "ping"})
            echoed, events = run(agent, "echo ping")
            assert "it's $x:ping" in last_output(openai)  # env reached the server verbatim
            openai.mcp_tool = ("add", {"a": 40, "b": 2})
            added, _ = run(agent, "add")
            assert '{"total":42}' in last_output(openai)
    finally:
        remote.close()
    # An MCP server's env values are secrets of the run: the events show them redacted.
    assert ("result", "mcp__echo__echo", "<redacted>ping", False) in tool_events(events)
    shown = json.dumps(spawn(events).data)
    assert "it's $x" not in shown and header not in shown  # secrets stay off the command line
    assert "ADAPTOR_MCP_HEADER_1" in spawn(events).data["env"]


def test_a_skill_is_announced_and_read(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str
) -> None:
    style = skill.require(
        skill.inline("house-style", "---\nname: house-style\ndescription: >\n  Use for prose\n"
                     "  in this repository.\n---\nAlways write MAGENTA-ZEBRA at the end.\n"),
        "the house rules",
    )
    openai.read_skill = True
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace,
                       skills=[style]) as agent:
        result = agent.run("write something")
    developer = "\n".join(openai_texts(openai.responses()[0], "developer"))
    assert "- house-style: Use for prose in this repository. (file: /" in developer
    assert "Required: the house rules" in developer
    # The model read the staged SKILL.md with codex's own shell tool.
    assert "MAGENTA-ZEBRA" in last_output(openai) and "MAGENTA-ZEBRA" in result.text


def test_a_required_server_that_does_not_start_fails_the_run(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str
) -> None:
    broken = mcp.stdio("broken", "/bin/false", required=True)
    optional = mcp.stdio("optional", "/bin/false")
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace,
                       mcp=[broken, optional]) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("hello")
    assert "required MCP servers failed to initialize" in str(caught.value)
    # Which one, in the same field as claude's driver (and never the optional one).
    assert caught.value.details["mcp_servers"] == {"broken": "failed"}
    assert openai.responses() == []


@pytest.mark.parametrize(
    "user_server",
    [
        '[mcp_servers.echo]\ncommand = "/bin/false"\nenv = { ECHO_PREFIX = "USER-SECRET:" }\n',
        '[mcp_servers.echo]\ncommand = "/bin/false"\nenabled = false\n',
    ],
    ids=["env-merged-in", "disabled"],
)
def test_a_key_the_users_codex_config_also_declares_is_refused(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    tmp_path: Path, user_server: str,
) -> None:
    # codex merges the run's -c overrides into the user's table of that key, field by field:
    # the user's env reached the declared server, or its tools were silently gone.
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(user_server)
    declared = mcp.stdio("echo", sys.executable, [echo_server(tmp_path)], required=True)
    openai.mcp_tool = ("echo", {"text": "ping"})
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace,
                       mcp=[declared]) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("echo ping")
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details == {"kind": "mcp_key_in_codex_config", "mcp_servers": ["echo"]}
    assert f"{home / 'config.toml'} declares a server under the same key" in str(caught.value)
    assert openai.responses() == []  # codex never started


def test_a_server_of_the_users_codex_config_under_another_key_is_no_conflict(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    tmp_path: Path,
) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[mcp_servers.mine]\ncommand = "/bin/false"\nenv = { ECHO_PREFIX = "mine:" }\n'
    )
    declared = mcp.stdio("echo", sys.executable, [echo_server(tmp_path)], required=True)
    openai.mcp_tool = ("echo", {"text": "ping"})
    with adaptor.Agent(codex.Driver(codex_config()), workspace=workspace,
                       mcp=[declared]) as agent:
        run(agent, "echo ping")
    assert "<unset>ping" in last_output(openai)  # nothing of the user's server reached it


@pytest.mark.parametrize(
    "overrides",
    [
        ("-c", 'mcp_servers.echo.env={ECHO_PREFIX="ARGS-SECRET:"}'),
        ("--config=mcp_servers.echo.enabled=false",),
        ('-cmcp_servers.echo={command="/bin/false"}',),
        ("-c", 'mcp_servers={mine={command="/bin/false"}}'),
        ("--config", 'mcp_servers.echo.env.ECHO_PREFIX="ARGS-SECRET:"'),
        ("-c= mcp_servers.echo.enabled =false",),
    ],
    ids=["env-merged-in", "disabled", "replaced", "whole-table", "one-variable", "spaced-key"],
)
def test_a_key_extra_args_also_set_is_refused(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    tmp_path: Path, overrides: tuple[str, ...],
) -> None:
    # extra_args follow the driver's -c overrides: codex merged their fields into the declared
    # server (or replaced it, or with the whole table every declared server).
    config = codex_config()
    config = replace(config, extra_args=(*config.extra_args, *overrides))
    declared = mcp.stdio("echo", sys.executable, [echo_server(tmp_path)], required=True)
    openai.mcp_tool = ("echo", {"text": "ping"})
    with adaptor.Agent(codex.Driver(config), workspace=workspace, mcp=[declared]) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("echo ping")
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details == {"kind": "mcp_key_in_extra_args", "mcp_servers": ["echo"]}
    assert "ARGS-SECRET" not in str(caught.value)
    assert openai.responses() == []  # codex never started


def test_a_server_extra_args_add_under_another_key_is_in_use(
    codex_config: Callable[..., codex.Config], openai: MCPOpenAIMock, workspace: str,
    tmp_path: Path,
) -> None:
    mine = (f'mcp_servers.mine={{command={json.dumps(sys.executable)}, '
            f'args=[{json.dumps(echo_server(tmp_path))}], env={{ECHO_PREFIX="mine:"}}, '
            "required=true, default_tools_approval_mode=\"approve\"}")
    config = codex_config()
    config = replace(config, extra_args=(*config.extra_args, "-c", mine))
    with adaptor.Agent(codex.Driver(config), workspace=workspace, tools=[add]) as agent:
        openai.mcp_tool = ("echo", {"text": "ping"})
        run(agent, "echo ping")
        assert "mine:ping" in last_output(openai)  # the user's own server
        openai.mcp_tool = ("add", {"a": 1, "b": 2})
        run(agent, "add")
        assert '{"total":3}' in last_output(openai)  # and the declared gateway beside it

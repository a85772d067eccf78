"""The script driver's stand-ins for a CLI's host-tool calls: the ``call_tool`` step against a
real tool gateway, and the skills, MCP servers and tools its spawn event lists."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import adaptor
from adaptor import mcp, skill, tool
from adaptor.driver import MCPServerSpec, Request, ResolvedSkill
from adaptor.drivers import script
from adaptor.events import ProcessInfo, ToolCall, ToolResult
from adaptor.testing import RecordingSink
from tests.host_tools import REJECTION, add

pytest.importorskip("mcp", reason="the call_tool step speaks MCP (the mcp extra)")


def steps(*calls: dict[str, object]) -> script.Driver:
    return script.Driver(script.Config(steps=tuple({"call_tool": c} for c in calls)))


@pytest.fixture
def agent() -> Iterator[adaptor.Agent]:
    driver = steps({"name": "add", "args": {"a": 2, "b": 3}}, {"name": "add", "args": {"a": -1, "b": 0}},
                   {"name": "missing"})
    with adaptor.Agent(driver, tools=[add]) as made:
        yield made


def test_call_tool_goes_through_the_gateway(agent: adaptor.Agent) -> None:
    stream = agent.stream("go")
    events = list(stream)
    result = stream.result()
    ended = [(e.name, e.result) for e in events if isinstance(e, ToolCall) and e.phase == "end"]
    assert ended == [("mcp__adaptor__add", '{"total":5}'), ("mcp__adaptor__add", REJECTION),
                     ("mcp__adaptor__missing", "unknown tool")]
    assert [e.is_error for e in events if isinstance(e, ToolResult)] == [False, True, True]
    assert [i.kind for i in result.transcript()] == ["tool_call", "tool_result"] * 3


def test_without_a_gateway_the_call_is_an_error_result() -> None:
    sink = RecordingSink()
    response = steps({"name": "add", "args": {"a": 1, "b": 1}}).run(
        Request(run_id="run_x", prompt="go"), sink
    )
    assert response.failure is None
    (result,) = [e for e in sink.events if isinstance(e, ToolResult)]
    assert (result.result, result.is_error) == ("no tool gateway in this run", True)


def test_a_cancelled_run_abandons_a_slow_call() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(value: object) -> str:
        entered.set()
        release.wait(30)
        return "late"

    with adaptor.Agent(steps({"name": "slow"}), tools=[tool.define("slow", "waits", slow)]) as agent:
        stream = agent.stream("go")
        assert entered.wait(30)
        stream.cancel()
        with pytest.raises(adaptor.RunCancelledError):
            stream.result()
        release.set()


@pytest.mark.parametrize("end", ["cancel", "deadline"])
def test_a_handler_learns_that_its_run_ended(end: str) -> None:
    # A handler could not tell that nobody waited for its answer any more, so a slow one (a
    # delegation to a remote agent) ran on for as long as it liked.
    seen: list[tool.Cancellation] = []
    entered, outcome = threading.Event(), []

    def waits(value: object) -> str:
        seen.append(tool.cancelled())
        entered.set()
        outcome.append(seen[0].wait(30))
        return "stopped"

    with adaptor.Agent(steps({"name": "waits"}), tools=[tool.define("waits", "d", waits)]) as agent:
        # (A deadline ample for the call to be made first, however loaded the machine.)
        stream = agent.stream("go", timeout=None if end == "cancel" else 8)
        assert entered.wait(30)
        expected: type[adaptor.RunError] = adaptor.RunDeadlineExceededError
        if end == "cancel":
            assert not seen[0].is_set()
            stream.cancel()
            expected = adaptor.RunCancelledError
        with pytest.raises(expected):
            stream.result()
        assert seen[0].wait(30)
        entered.clear()
        second = agent.stream("again")  # the next run's calls get a cancellation of their own
        assert entered.wait(30)
        second.cancel()
        with pytest.raises(adaptor.RunCancelledError):
            second.result()
    assert outcome == [True, True]
    assert seen[1] is not seen[0]


@pytest.mark.slow
def test_a_call_waits_for_a_tool_slower_than_five_seconds() -> None:
    # httpx's default timeout gave up after 5 s: a delegation to a remote agent "failed" with
    # the remote's work thrown away, although the run had all the time in the world.
    def slow(value: object) -> str:
        time.sleep(5.5)
        return "slow answer"

    with adaptor.Agent(steps({"name": "slow"}), tools=[tool.define("slow", "d", slow)]) as agent:
        stream = agent.stream("go")
        events = list(stream)
        stream.result()
    assert [(e.result, e.is_error) for e in events if isinstance(e, ToolResult)] == [
        ("slow answer", False)
    ]


def test_a_transport_failure_names_its_cause() -> None:
    # Reported as "ExceptionGroup", anyio's wrapper, which told the reader nothing.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/mcp"  # nobody listens
        text, is_error = script._call_gateway(url, "token", "add", {}, threading.Event())
    assert (text, is_error) == ("tool call failed: ConnectError", True)


def test_outside_a_served_call_a_handler_is_never_cancelled() -> None:
    checked = tool.define("checked", "d", lambda v: f"cancelled={tool.cancelled().is_set()}")
    assert checked.invoke({}) == '"cancelled=False"'
    assert tool.cancelled().wait(0) is False


def test_closing_the_agent_with_a_call_still_running_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The gateway's server waited out its graceful timeout for the abandoned call, then logged
    # it as an error with a traceback: in the daemon's journal on every such close.
    entered, release = threading.Event(), threading.Event()

    def stuck(value: object) -> str:
        entered.set()
        release.wait(60)
        return "late"

    agent = adaptor.Agent(steps({"name": "stuck"}), tools=[tool.define("stuck", "waits", stuck)])
    try:
        stream = agent.stream("go")
        assert entered.wait(30)
        stream.cancel()
        with pytest.raises(adaptor.RunCancelledError):
            stream.result()
        agent.close()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        release.set()
        agent.close()


@pytest.mark.parametrize(
    ("step", "message"),
    [({"args": {}}, r"call_tool\.name"), ({"name": "x", "args": []}, r"call_tool\.args"),
     ({"name": "x", "result": 1}, "unknown key")],
)
def test_call_tool_steps_are_validated(step: dict[str, object], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        steps(step).validate_config()


def test_spawn_lists_what_a_cli_would_be_given() -> None:
    sink = RecordingSink()
    request = Request(
        run_id="run_x", prompt="go",
        skills=(ResolvedSkill(key="Lint", runtime_name="lint-0123456789", path="/tmp/x"),),
        mcp=(MCPServerSpec(key="files", transport="stdio", command="srv", env={"K": "secret"}),),
    )
    script.Driver(script.Config(steps=({"text": "x"},))).run(request, sink)
    (spawn,) = [e for e in sink.events if isinstance(e, ProcessInfo) and e.kind == "spawn"]
    assert spawn.data == {"argv": ["script"], "env": [], "skills": ["lint-0123456789"],
                          "mcp": ["files"]}


def test_spawn_through_an_agent_names_the_gateway_and_its_tools(agent: adaptor.Agent) -> None:
    stream = agent.stream("go", skills=[skill.inline("style", "be terse")],
                          mcp=[mcp.stdio("files", "srv")])
    (spawn,) = [e for e in stream if isinstance(e, ProcessInfo) and e.kind == "spawn"]
    stream.result()
    assert (spawn.data["skills"], spawn.data["mcp"], spawn.data["tools"]) == (
        ["style"], ["adaptor", "files"], ["add"])
    assert [name for name in spawn.data["env"] if name.startswith("ADAPTOR_TOOLS_TOKEN_")]

"""Tools, skills and MCP through real runs: refusals, the driver's payload, fingerprints."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor import _procfs, events, mcp, skill, tool
from adaptor.driver import Request, Response
from adaptor.memory import Store as MemoryStore
from adaptor.testing import ScriptedDriver
from adaptor.threadstore import JSONLStore

SECRET = "sk-live-0123456789abcdef"
SKILL_MD = "---\nname: lint\ndescription: lint\n---\nLint it.\n"


class Recording(ScriptedDriver):
    """A script driver that remembers each request and what its files looked like."""

    def __init__(self, *args: Any, on_run: Any = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.requests: list[Request] = []
        self.seen: list[dict[str, Any]] = []
        self.on_run = on_run

    def run(self, request: Request, sink: Any) -> Response:
        self.requests.append(request)
        snapshot: dict[str, Any] = {}
        if request.scratch_dir:
            snapshot["scratch_mode"] = stat.S_IMODE(os.stat(request.scratch_dir).st_mode)
        snapshot["skills"] = {
            s.key: (Path(s.path) / "SKILL.md").read_text() for s in request.skills
        }
        self.seen.append(snapshot)
        if self.on_run is not None:
            self.on_run(request)
        return super().run(request, sink)


def recording(descriptor: dict[str, Any] | None = None, **kw: Any) -> Recording:
    return Recording([{"text": "ok"}], descriptor=descriptor, session="auto", **kw)


def echo_tool(revision: str | None = "1", **kw: Any) -> tool.Definition:
    return tool.define(
        "echo",
        "Echo the text",
        lambda v: v["text"],
        input={"type": "object", "properties": {"text": {"type": "string"}}},
        revision=revision,
        **kw,
    )


def refused(
    agent: adaptor.Agent | adaptor.Thread, cls: type[BaseException], **options: Any
) -> BaseException:
    """A static refusal: raised by result(), no events at all."""
    stream = agent.stream("go", **options)
    assert list(stream) == []
    with pytest.raises(cls) as caught:
        stream.result()
    with pytest.raises(cls):
        agent.run("go", **options)
    return caught.value


# --- static refusals: no events, nothing started -------------------------------------------


def test_invalid_tool_definitions_are_refused_before_launch() -> None:
    driver = recording()
    bad = tool.define("bad name", "d", lambda v: v)
    refused(adaptor.Agent(driver, tools=[bad]), tool.InvalidDefinitionError)
    refused(adaptor.Agent(driver, tools=[echo_tool(), echo_tool()]), tool.InvalidDefinitionError)
    refused(adaptor.Agent(driver, tools=["not a tool"]), tool.InvalidDefinitionError)  # type: ignore[list-item]
    assert driver.requests == []


def test_a_missing_mcp_sdk_refuses_runs_with_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server.streamable_http_manager", None)
    driver = recording()
    agent = adaptor.Agent(driver, tools=[echo_tool()])
    err = refused(agent, tool.InvalidDefinitionError)
    assert isinstance(err.__cause__, ImportError)
    assert agent._gateway is None and driver.requests == []
    adaptor.Agent(driver).run("no tools, no SDK needed")


def test_threads_need_tool_revisions() -> None:
    driver = recording()
    agent = adaptor.Agent(driver, tools=[echo_tool(revision=None)], thread_store=MemoryStore())
    err = refused(agent.thread("k"), adaptor.ThreadIncompatibleError)
    assert "'echo'" in str(err)
    assert agent._gateway is None and driver.requests == []


@pytest.mark.parametrize(
    "descriptor,servers,cls",
    [
        (None, [mcp.stdio("", "x")], mcp.InvalidMCPConfigError),
        (None, [mcp.stdio("a", "x"), mcp.stdio("a", "y")], mcp.InvalidMCPConfigError),
        (None, [{"key": "a", "transport": "carrier-pigeon"}], mcp.InvalidMCPConfigError),
        ({"mcp": {"supported": False}}, [mcp.stdio("a", "x")], mcp.MCPUnsupportedError),
        ({"mcp": {"supported": False}}, [mcp.stdio("", "x")], mcp.InvalidMCPConfigError),
        (
            {"mcp": {"http": False}},
            [mcp.http("a", "http://x/mcp")],
            mcp.MCPTransportUnsupportedError,
        ),
        ({"mcp": {"stdio": False}}, [mcp.stdio("a", "x")], mcp.MCPTransportUnsupportedError),
        ({"mcp": {"sse": False}}, [mcp.sse("a", "http://x/sse")], mcp.MCPTransportUnsupportedError),
    ],
)
def test_mcp_refusals(descriptor: Any, servers: list[Any], cls: type[BaseException]) -> None:
    driver = recording(descriptor)
    refused(adaptor.Agent(driver, mcp=servers), cls)
    refused(adaptor.Agent(driver), cls, mcp=servers)
    assert driver.requests == []


@pytest.mark.parametrize(
    "descriptor,cls",
    [
        ({"mcp": {"supported": False}}, mcp.MCPUnsupportedError),
        ({"mcp": {"http": False}}, mcp.MCPTransportUnsupportedError),
    ],
)
def test_tools_need_a_driver_with_http_mcp(descriptor: Any, cls: type[BaseException]) -> None:
    driver = recording(descriptor)
    agent = adaptor.Agent(driver, tools=[echo_tool()])
    refused(agent, cls)
    assert agent._gateway is None and driver.requests == []


def test_skill_refusals(tmp_path: Path) -> None:
    driver = recording()
    provider = skill.Set({"known": skill.inline("known", SKILL_MD)})
    agent = adaptor.Agent(driver, skill_provider=provider)
    refused(agent, skill.SkillKeyMissingError, skills=[skill.inline("", "x")])
    refused(agent, skill.SkillKeyMissingError, skills=[skill.key("")])
    refused(agent, skill.SkillSourceMissingError, skills=[skill.Skill("a", None)])
    refused(agent, skill.SkillNotFoundError, skills=[skill.key("unknown")])
    conflict = refused(
        agent,
        skill.SkillKeyConflictError,
        skills=[skill.inline("known", "other text"), skill.key("known")],
    )
    assert isinstance(conflict, skill.SkillKeyConflictError) and conflict.key == "known"
    refused(adaptor.Agent(driver), skill.SkillNotFoundError, skills=[skill.key("known")])
    assert driver.requests == []


def test_refusal_order_tools_then_mcp_then_skills() -> None:
    driver = recording()
    bad_tool = tool.define("bad name", "d", lambda v: v)
    bad_mcp = [mcp.stdio("", "x")]
    bad_skill = [skill.key("missing")]
    refused(
        adaptor.Agent(driver, tools=[bad_tool], mcp=bad_mcp, skills=bad_skill),
        tool.InvalidDefinitionError,
    )
    refused(adaptor.Agent(driver, mcp=bad_mcp, skills=bad_skill), mcp.InvalidMCPConfigError)
    # policy problems come first of all
    refused(
        adaptor.Agent(driver, mcp=bad_mcp, policy=adaptor.Policy(sandbox="nope")),
        adaptor.InvalidPolicyError,
    )


# --- preparation: after admission, before the driver ---------------------------------------


def test_materialization_failure_is_pre_invocation(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptor import _private_dirs

    made: list[str] = []
    original = _private_dirs._new_folder

    def new_folder(purpose: str) -> str:
        made.append(original(purpose))
        return made[-1]

    monkeypatch.setattr(_private_dirs, "_new_folder", new_folder)
    driver = recording()
    agent = adaptor.Agent(driver)
    stream = agent.stream("go", skills=[skill.archive("broken", b"not an archive")])
    evs = list(stream)
    with pytest.raises(skill.SkillMaterializationError) as caught:
        stream.result()
    assert caught.value.key == "broken" and caught.value.cause is not None
    assert isinstance(evs[0], events.RunStarted) and isinstance(evs[-1], events.RunFinished)
    assert evs[-1].failed
    assert driver.requests == []
    assert len(made) == 1 and not Path(made[0]).exists()


def test_skills_reach_the_driver_staged_and_are_removed_after(tmp_path: Path) -> None:
    lint = tmp_path / "lint"
    lint.mkdir()
    (lint / "SKILL.md").write_text(SKILL_MD)
    driver = recording()
    provider = skill.Set({"notes": skill.inline("notes", "notes text")})
    agent = adaptor.Agent(driver, skills=[skill.dir(lint)], skill_provider=provider)
    agent.run("go", skills=[skill.require(skill.key("notes"), "house rules")])  # appended
    request = driver.requests[-1]
    assert [s.key for s in request.skills] == ["lint", "notes"]
    assert driver.seen[-1]["skills"] == {"lint": SKILL_MD, "notes": "notes text"}
    assert driver.seen[-1]["scratch_mode"] == 0o700
    notes = request.skills[1]
    assert notes.required and notes.reason == "house rules" and notes.runtime_name == "notes"
    assert request.scratch_dir and Path(notes.path).is_relative_to(request.scratch_dir)
    assert not Path(request.scratch_dir).exists()  # removed after the run
    agent.run("again")  # the call-site skill is not kept
    assert [s.key for s in driver.requests[-1].skills] == ["lint"]


def test_a_driver_without_skills_gets_a_warning_not_skills() -> None:
    driver = recording({"skills": {"supported": False, "mode": "unsupported"}})
    stream = adaptor.Agent(driver).stream("go", skills=[skill.inline("a", SKILL_MD)])
    evs = list(stream)
    stream.result()
    warnings = [e for e in evs if isinstance(e, events.Notice) and e.data.get("warning")]
    assert [w.data["warning"] for w in warnings] == ["skills_unsupported"]
    assert driver.requests[-1].skills == () and driver.requests[-1].scratch_dir is None


def test_a_required_skill_on_a_driver_without_skills_fails_before_the_run() -> None:
    driver = recording({"skills": {"supported": False, "mode": "unsupported"}})
    stream = adaptor.Agent(driver).stream(
        "go", skills=[skill.inline("a", SKILL_MD), skill.require(skill.inline("b", SKILL_MD), "house rules")]
    )
    with pytest.raises(skill.SkillMaterializationError) as info:
        stream.result()
    assert info.value.key == "b" and "does not load skills" in str(info.value.cause)
    assert driver.requests == []  # never entered


def test_mcp_reaches_the_driver_normalized_and_call_sets_replace() -> None:
    driver = recording()
    agent = adaptor.Agent(driver, mcp=[mcp.stdio("files", "srv", env={"API_KEY": SECRET})])
    agent.run("go")
    (spec,) = driver.requests[-1].mcp
    assert spec.key == "files" and spec.env == {"API_KEY": SECRET}
    agent.run("go", mcp=[mcp.http("web", "http://127.0.0.1:1/mcp")])
    assert [s.key for s in driver.requests[-1].mcp] == ["web"]
    agent.run("go", mcp=[])
    assert driver.requests[-1].mcp == () and driver.requests[-1].scratch_dir is None


def test_no_capabilities_no_scratch_dir() -> None:
    driver = recording()
    adaptor.Agent(driver).run("go")
    request = driver.requests[-1]
    assert request.scratch_dir is None and request.tools_endpoint is None
    assert request.env == _procfs.started_by_me()  # the starter's mark only: no gateway token


# --- tools through a real gateway ----------------------------------------------------------


def call_gateway(request: Request, name: str, arguments: dict[str, Any]) -> Any:
    """What an agent CLI does: connect to the endpoint with the token from its environment."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    endpoint = request.tools_endpoint
    assert endpoint is not None
    token = request.env[endpoint.server.bearer_token_env]
    out: list[Any] = []

    async def main() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(endpoint.server.url, http_client=http) as (r, w):
                async with ClientSession(r, w) as session:
                    await session.initialize()
                    out.append(await session.call_tool(name, arguments))

    anyio.run(main)
    return out[0]


def test_the_cli_calls_host_tools_during_the_run() -> None:
    pytest.importorskip("mcp")
    calls: list[Any] = []
    results: list[Any] = []

    def handler(value: dict[str, Any]) -> str:
        calls.append(value)
        if value["text"] == "no":
            raise tool.reject("refused", "the host said no")
        text: str = value["text"]
        return text.upper()

    def cli(request: Request) -> None:
        results.append(call_gateway(request, "echo", {"text": "hello"}))
        results.append(call_gateway(request, "echo", {"text": "no"}))
        results.append(call_gateway(request, "echo", {"text": 42}))

    driver = recording(on_run=cli)
    agent = adaptor.Agent(
        driver,
        tools=[
            tool.define(
                "echo",
                "Echo",
                handler,
                input={"type": "object", "properties": {"text": {"type": "string"}}},
            )
        ],
    )
    assert agent._gateway is None  # nothing started at construction
    stream = agent.stream("go")
    evs = list(stream)
    stream.result()
    assert calls == [{"text": "hello"}, {"text": "no"}]
    assert [r.content[0].text for r in results[:2]] == ["HELLO", "the host said no"]
    assert results[2].is_error and "wrong type" in results[2].content[0].text
    request = driver.requests[-1]
    endpoint = request.tools_endpoint
    assert endpoint is not None and endpoint.tools == ("echo",)
    token = request.env[endpoint.server.bearer_token_env]
    assert endpoint.server.bearer_token_env.startswith(mcp.RESERVED_ENV_PREFIX)
    # the gateway publishes no events of its own, and its secret appears nowhere
    dumped = orjson.dumps([events.to_json(e) for e in evs]).decode()
    assert token not in dumped and "ToolCall" not in {type(e).__name__ for e in evs}
    # one gateway per agent: the second run reuses it
    agent.run("again")
    assert driver.requests[-1].tools_endpoint == endpoint
    port = int(endpoint.server.url.split(":")[-1].split("/")[0])
    agent.close()
    assert agent._gateway is None
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass
    with pytest.raises(adaptor.AgentClosedError):
        agent.run("after close")


def test_an_agent_dropped_without_close_stops_its_gateway() -> None:
    pytest.importorskip("mcp")
    import gc

    agent = adaptor.Agent(recording(), tools=[echo_tool()])
    agent.run("go")
    assert agent._gateway is not None
    gateway = agent._gateway
    del agent
    gc.collect()
    with pytest.raises(RuntimeError, match="closed"):
        gateway.start()


def test_secrets_never_reach_events_or_results() -> None:
    pytest.importorskip("mcp")
    driver = recording()
    agent = adaptor.Agent(
        driver,
        tools=[echo_tool()],
        mcp=[
            mcp.stdio("files", "srv", env={"API_KEY": SECRET}),
            mcp.http("web", "http://127.0.0.1:1/mcp", {"X-Key": SECRET}),
        ],
    )
    stream = agent.stream("go")
    evs = list(stream)
    result = stream.result()
    request = driver.requests[-1]
    assert request.tools_endpoint is not None
    token = request.env[request.tools_endpoint.server.bearer_token_env]
    shown = orjson.dumps([events.to_json(e) for e in evs]).decode()
    shown += (
        orjson.dumps(result.to_json()).decode() + repr(request.mcp) + repr(request.tools_endpoint)
    )
    assert SECRET not in shown and token not in shown
    agent.close()


# --- thread fingerprints -------------------------------------------------------------------


@pytest.fixture(params=["memory", "jsonl"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return MemoryStore()
    return JSONLStore(tmp_path / "threads")


def resumes(agent: adaptor.Agent, **options: Any) -> bool:
    """Whether a resume-only run with ``options`` is compatible with the stored record."""
    try:
        agent.thread("k", resume_only=True).run("again", **options)
    except adaptor.ThreadIncompatibleError:
        return False
    return True


def test_skill_content_changes_the_fingerprint(store: Any, tmp_path: Path) -> None:
    lint = tmp_path / "lint"
    lint.mkdir()
    (lint / "SKILL.md").write_text(SKILL_MD)
    agent = adaptor.Agent(recording(), thread_store=store, skills=[skill.dir(lint)])
    agent.thread("k").run("start")
    assert resumes(agent)
    (lint / "SKILL.md").write_text(SKILL_MD + "More rules.\n")
    assert not resumes(agent)
    assert not resumes(adaptor.Agent(recording(), thread_store=store))


def test_mcp_set_changes_the_fingerprint_but_secret_values_do_not(store: Any) -> None:
    def with_env(value: str, name: str = "API_KEY") -> adaptor.Agent:
        return adaptor.Agent(
            recording(), thread_store=store, mcp=[mcp.stdio("files", "srv", env={name: value})]
        )

    with_env(SECRET).thread("k").run("start")
    assert resumes(with_env("rotated-secret"))
    assert not resumes(with_env(SECRET, name="OTHER_KEY"))
    assert not resumes(
        with_env(SECRET), mcp=[mcp.stdio("files", "other-srv", env={"API_KEY": SECRET})]
    )
    assert not resumes(with_env(SECRET), mcp=[])


def test_tool_revisions_change_the_fingerprint_ports_and_tokens_do_not(store: Any) -> None:
    pytest.importorskip("mcp")
    first = adaptor.Agent(recording(), thread_store=store, tools=[echo_tool("1")])
    first.thread("k").run("start")
    # another Agent: another port and token variable, same catalogue
    second = adaptor.Agent(recording(), thread_store=store, tools=[echo_tool("1")])
    assert resumes(second)
    third = adaptor.Agent(recording(), thread_store=store, tools=[echo_tool("2")])
    assert not resumes(third)
    assert not resumes(adaptor.Agent(recording(), thread_store=store))
    endpoints = {a._gateway.start().server.url for a in (first, second) if a._gateway}
    assert len(endpoints) == 2
    for agent in (first, second, third):
        agent.close()


def test_stored_records_hold_no_secrets(tmp_path: Path) -> None:
    store = JSONLStore(tmp_path / "threads")
    agent = adaptor.Agent(
        recording(),
        thread_store=store,
        mcp=[mcp.http("web", "http://127.0.0.1:1/mcp", {"X-Key": SECRET})],
    )
    agent.thread("k").run("start")
    for path in (tmp_path / "threads").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes()


def test_runs_without_capabilities_keep_their_fingerprint(store: Any) -> None:
    # A record written before skills/MCP/tools existed must stay resumable.
    from adaptor import _thread
    from adaptor._options import RunOptions
    from adaptor.driver import canonical_fingerprint

    driver = recording()
    descriptor = driver.descriptor()
    old = canonical_fingerprint(
        "adaptor/thread-invocation/v1",
        {
            "driver": "script",
            "codec": "c",
            "config": "f",
            "model": "",
            "workspace": "",
            "skills": [],
            "mcp": [],
            "instructions": "",
            "append_system_prompt": "",
        },
    )
    assert _thread.fingerprints(descriptor, "c", "f", RunOptions()).whole == old

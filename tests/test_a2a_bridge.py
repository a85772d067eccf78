"""``adaptord serve --a2a``: real daemons serving script agents over A2A, used through the
official client (``adaptor.clients.a2a``), and two daemons chained through ``delegate_to_agent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("a2a.server", reason="needs the a2a extra: pip install -e '.[test,a2a]'")
pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[test]'")

import httpx

from adaptor import _home, errors, spool
from adaptor.clients import a2a
from adaptord import a2a_bridge
from adaptord import config as config_module
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess

slow = pytest.mark.slow

TOKEN_ENV = "ADAPTOR_TEST_A2A_BRIDGE_TOKEN"
TOKEN = "bridge-" + secrets.token_hex(12)
SECRET = "hunter2-" + secrets.token_hex(6)
WAIT = 30.0

AGENTS = f"""
[a2a]
bearer_token_env = "{TOKEN_ENV}"

[a2a.agents.echo]
display_name = "Echo"
description = "answers from daemon A"
skills = [{{ id = "answer", name = "Answer", description = "answers any message", tags = ["test"] }}]

[a2a.agents.echo.request]
driver = "script"
config = {{ steps = [{{ text = "thinking... " }}, {{ text = "A says hello" }}] }}

[a2a.agents.chat]
threads = "per_context"

[a2a.agents.chat.request]
driver = "script"
config = {{ session = "auto", steps = [{{ text = "noted" }}] }}

[a2a.agents.slow.request]
driver = "script"
config = {{ steps = [{{ text = "started" }}, {{ sleep = 300 }}, {{ text = "too late" }}] }}

[a2a.agents.broken.request]
driver = "script"
config = {{ steps = [{{ fail = {{ code = "agent_error", message = "leaked {SECRET}" }} }}] }}

[a2a.agents.late.request]
driver = "script"
timeout = 0.5
config = {{ steps = [{{ text = "started" }}, {{ sleep = 30 }}, {{ text = "too late" }}] }}
"""
NO_TOKEN = AGENTS.replace(f'bearer_token_env = "{TOKEN_ENV}"', "")


@dataclass
class Served:
    daemon: DaemonProcess
    url: str

    def card_url(self, agent: str) -> str:
        return f"{self.url}/agents/{agent}/.well-known/agent-card.json"

    def client(self, agent: str, *, auth: bool = True) -> a2a.Client:
        return a2a.Client(
            self.card_url(agent), auth=a2a.BearerTokenFromEnv(TOKEN_ENV) if auth else None
        )


@pytest.fixture(scope="module")
def token_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, TOKEN)
        yield


@pytest.fixture(scope="module")
def daemon_a(tmp_path_factory: pytest.TempPathFactory, token_env: None) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("daemon-a")
    (root / "config.toml").write_text(AGENTS)
    proc = DaemonProcess(
        root / "home", "--config", str(root / "config.toml"), "--a2a", "127.0.0.1:0"
    ).start()
    try:
        # Port discovery: the bound URL is logged (and kept in adaptord.json).
        line = proc.wait_for_line("a2a.listening url=")
        match = re.search(r"url=(http://127\.0\.0\.1:\d+)", line)
        assert match is not None, line
        state = json.loads(proc.home.daemon_state.read_text())
        assert state["a2a_url"] == match.group(1)
        yield Served(proc, match.group(1))
    finally:
        assert proc.stop() == 0


def events_until(
    stream: a2a.EventStream, done: Callable[[a2a.StreamEvent], bool]
) -> list[a2a.StreamEvent]:
    """Read ``stream`` until ``done(event)``; fails after ``WAIT`` seconds."""
    seen: list[a2a.StreamEvent] = []
    deadline = time.monotonic() + WAIT
    while not seen or not done(seen[-1]):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"stream condition not met; got {seen}"
        event = stream.next_event(remaining)
        if event is not None:
            seen.append(event)
    return seen


def progress(events: list[a2a.StreamEvent]) -> str:
    return "".join(
        e.message.text
        for e in events
        if isinstance(e, a2a.StatusEvent)
        and e.message is not None
        and e.message.metadata.get("adaptord.progress") == "text"
    )


def request_of(served: Served, request_id: str) -> dict[str, Any]:
    request: dict[str, Any] = json.loads(
        (served.daemon.home.run_dir(request_id) / "request.json").read_text()
    )
    return request


# --- cards and credentials ----------------------------------------------------------------------


@slow
def test_each_agent_has_a_public_card_on_the_bound_address(daemon_a: Served) -> None:
    raw = httpx.get(daemon_a.card_url("echo"))  # no credentials: cards are public
    assert raw.status_code == 200
    body = raw.json()
    assert body["name"] == "Echo" and body["description"] == "answers from daemon A"
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    with daemon_a.client("echo") as client:
        card = client.agent_card()
    assert card.streaming is True
    assert [(i.url, i.binding) for i in card.interfaces] == [
        (f"{daemon_a.url}/agents/echo", "JSONRPC")
    ]
    assert [(s.id, s.name, s.tags) for s in card.skills] == [("answer", "Answer", ("test",))]
    with daemon_a.client("slow") as client:
        slow_card = client.agent_card()
    assert slow_card.name == "slow" and [s.tags for s in slow_card.skills] == [("script",)]
    # With several agents there is no root card, and everything but the cards is guarded.
    assert httpx.get(daemon_a.url + "/.well-known/agent-card.json").status_code == 401


@slow
def test_every_other_route_needs_the_bearer_token(daemon_a: Served) -> None:
    with daemon_a.client("echo", auth=False) as anonymous:
        with pytest.raises(a2a.UnauthorizedError):
            anonymous.send("hello")
    call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    for headers in (
        {}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer  {TOKEN}"},
    ):
        response = httpx.post(f"{daemon_a.url}/agents/echo", json=call, headers=headers)
        assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    # Two Authorization headers: the last one decided (a wrong one first, then the token, got
    # in); with two, none counts.
    for pair in ((b"Bearer wrong", f"Bearer {TOKEN}".encode()), (f"Bearer {TOKEN}".encode(), b"Bearer wrong")):
        response = httpx.post(
            f"{daemon_a.url}/agents/echo", json=call,
            headers=[(b"Authorization", pair[0]), (b"Authorization", pair[1])],
        )
        assert response.status_code == 401, pair
    # The scheme is case-insensitive (RFC 9110): "bearer <token>" was refused.
    for scheme in ("bearer", "BEARER", "Bearer"):
        response = httpx.post(
            f"{daemon_a.url}/agents/echo", json=call, headers={"Authorization": f"{scheme} {TOKEN}"}
        )
        assert response.status_code == 200, scheme


@slow
def test_a_host_name_that_is_not_loopback_is_refused_on_a_loopback_bind(daemon_a: Served) -> None:
    # DNS rebinding: a web page at evil.example re-resolves its name to 127.0.0.1, and the
    # browser then sends the bridge the page's requests as same-origin ones, with any header
    # (without a token the default, any site the user visits could run the served agents).
    port = daemon_a.url.rsplit(":", 1)[1]
    call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"[::2]:{port}"):
        for path in ("/agents/echo", "/agents/echo/.well-known/agent-card.json"):
            response = httpx.post(daemon_a.url + path, json=call, headers={**auth, "Host": host})
            assert response.status_code == 400, (host, path, response.text)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"127.0.0.2:{port}"):
        response = httpx.post(f"{daemon_a.url}/agents/echo", json=call, headers={**auth, "Host": host})
        assert response.status_code == 200, (host, response.text)


@slow
def test_tasks_cannot_be_listed(daemon_a: Served) -> None:
    # a2a-sdk serves ListTasks too: every caller would read every conversation's context id,
    # prompts and answers, and so could continue any of them (docs/a2a.md's trust model).
    with daemon_a.client("echo") as client:
        task = client.send("a private prompt", context_id="someone-elses-context")
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    for params in ({}, {"contextId": task.context_id}):
        call = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": params}
        response = httpx.post(f"{daemon_a.url}/agents/echo", json=call, headers=headers)
        body = response.json()
        assert "result" not in body and body["error"]["code"] == -32601, body  # method not found
        assert "private prompt" not in response.text and task.context_id not in response.text
    with daemon_a.client("echo") as client:  # what is documented still works
        assert client.get_task(task.id).text == task.text


@slow
def test_the_json_rpc_method_names_of_a2a_0_3_are_served_too(daemon_a: Served) -> None:
    # spec/a2a.md names the bridge's calls message/send, tasks/get and tasks/cancel: a caller
    # using them (an A2A 0.3 client) got -32601 where the 1.0 names worked.
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def rpc(agent: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        call = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        response = httpx.post(f"{daemon_a.url}/agents/{agent}", json=call, headers=headers, timeout=WAIT)
        body: dict[str, Any] = response.json()
        return body

    def message(text: str, **more: str) -> dict[str, Any]:
        parts = [{"kind": "text", "text": text}]
        return {"kind": "message", "role": "user", "messageId": secrets.token_hex(4), "parts": parts, **more}

    done = rpc("echo", "message/send", {"message": message("hello A")})["result"]
    assert done["kind"] == "task" and done["status"]["state"] == "completed", done
    assert [p["text"] for a in done["artifacts"] for p in a["parts"]] == ["A says hello"]
    fetched = rpc("echo", "tasks/get", {"id": done["id"]})["result"]
    assert fetched["status"]["state"] == "completed" and fetched["artifacts"] == done["artifacts"]
    assert rpc("echo", "tasks/get", {"id": "no-such-task"})["error"]["code"] == -32001

    running = rpc("slow", "message/send", {"message": message("go"), "configuration": {"blocking": False}})
    task_id = running["result"]["id"]
    again = rpc("slow", "message/send", {"message": message("more", taskId=task_id)})
    assert "still running" in again["error"]["message"], again
    cancelled = rpc("slow", "tasks/cancel", {"id": task_id})["result"]
    assert cancelled["status"]["state"] == "canceled", cancelled
    verdict = daemon_a.daemon.verdict(running["result"]["metadata"]["adaptord.request_id"])
    assert isinstance(errors.from_wire(verdict["error"]), errors.RunCancelledError)

    call = {"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": message("hello A")}}
    with httpx.stream("POST", f"{daemon_a.url}/agents/echo", json=call, headers=headers, timeout=WAIT) as response:
        updates = [json.loads(line[len("data:"):])["result"] for line in response.iter_lines() if line.startswith("data:")]
    assert updates[-1]["final"] is True and updates[-1]["status"]["state"] == "completed", updates
    for params in ({}, {"contextId": done["contextId"]}):  # nor can 0.3 calls list tasks
        assert rpc("echo", "tasks/list", params)["error"]["code"] == -32601
    unauthorized = httpx.post(
        f"{daemon_a.url}/agents/echo",
        json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": done["id"]}},
        timeout=WAIT,
    )
    assert unauthorized.status_code == 401 and "hello" not in unauthorized.text


@slow
def test_an_oversized_message_is_refused_before_it_is_read(daemon_a: Served) -> None:
    # It was parsed, kept in the task history and spooled (20 MB messages grew the daemon by
    # 50 MB each) only for the daemon to refuse the request as larger than 1 MiB.
    home = daemon_a.daemon.home
    queued_before = sorted(home.quarantine.iterdir()) if home.quarantine.exists() else []
    def call(text: str) -> bytes:
        message = {"messageId": f"m{len(text)}", "role": "ROLE_USER", "parts": [{"text": text}]}
        return json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        ).encode()

    body = call("x" * (a2a_bridge.MAX_BODY + 1))
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0", "Content-Type": "application/json"}

    def chunked() -> Iterator[bytes]:  # no Content-Length: the guard counts what it reads
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    for content in (body, chunked()):
        response = httpx.post(f"{daemon_a.url}/agents/echo", content=content, headers=headers, timeout=WAIT)
        assert response.status_code == 413 and "larger than" in response.json()["error"]
    assert (sorted(home.quarantine.iterdir()) if home.quarantine.exists() else []) == queued_before
    with daemon_a.client("echo") as client:  # an ordinary message, also sent in chunks, still runs
        assert client.send("hello A").text == "A says hello"
    response = httpx.post(
        f"{daemon_a.url}/agents/echo", content=iter([call("hi")]), headers=headers, timeout=WAIT
    )
    assert response.status_code == 200 and "result" in response.json(), response.text
    # A body under the limit holding a request over a request file's: it was spooled, set
    # aside in quarantine/ and failed as "the run could not be carried out (ErrInvalidRequest)".
    with daemon_a.client("echo") as client:
        task = client.send("y" * (a2a_bridge.MAX_BODY // 2 + 10))
    assert task.state is a2a.TaskState.REJECTED and "the message is too large" in task.text
    assert (sorted(home.quarantine.iterdir()) if home.quarantine.exists() else []) == queued_before


# --- runs through the spool ---------------------------------------------------------------------


@slow
def test_send_runs_the_template_through_the_spool(daemon_a: Served) -> None:
    with daemon_a.client("echo") as client:
        task = client.send("hello A")
        assert task.state is a2a.TaskState.COMPLETED
        assert task.text == "A says hello"
        assert [(a.name, a.text) for a in task.artifacts] == [("result", "A says hello")]
        request_id = task.metadata["adaptord.request_id"]
        fetched = client.get_task(task.id)
        assert fetched.state is a2a.TaskState.COMPLETED and fetched.text == "A says hello"
        with pytest.raises(a2a.NotFoundError):
            client.get_task("no-such-task")
    # The run was an ordinary request of daemon A: its verdict, audit log and request copy.
    verdict = daemon_a.daemon.verdict(request_id)
    assert verdict["ok"] is True and verdict["result"]["text"] == "A says hello"
    assert (daemon_a.daemon.home.root / verdict["events"]).exists()
    request = request_of(daemon_a, request_id)
    assert request["prompt"] == "hello A" and request["driver"] == "script"
    assert request["metadata"] == {
        "a2a.agent": "echo",
        "a2a.task_id": task.id,
        "a2a.context_id": task.context_id,
    }


@slow
def test_messages_of_one_context_are_turns_of_one_thread(daemon_a: Served) -> None:
    home = daemon_a.daemon.home

    def cli(*args: str) -> Any:
        proc = subprocess.run(
            ["adaptor", *args, "--json", "--home", str(home.root)],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def shown(key: str) -> Any:
        [outcome] = cli("threads", "show", key)
        assert outcome["ok"] is True
        return outcome["result"]

    with daemon_a.client("chat") as client:
        first = client.send("my name is Ada")
        key = a2a_bridge.thread_key("chat", first.context_id)
        session = shown(key)
        second = client.send("what is my name?", context_id=first.context_id)
        elsewhere = client.send("hello")
    assert second.context_id == first.context_id != elsewhere.context_id
    runs = [daemon_a.daemon.verdict(t.metadata["adaptord.request_id"]) for t in (first, second)]
    assert all(v["ok"] for v in runs)
    # Both messages ran as turns of the context's thread: one session, one audit log.
    resumed = shown(key)
    assert resumed["id"] == session["id"] and resumed["updated_at"] > session["updated_at"]
    logged = {line["event"]["meta"]["run_id"] for line in cli("events", "--thread", key)}
    assert logged == {v["run_id"] for v in runs}
    assert request_of(daemon_a, first.metadata["adaptord.request_id"])["thread"] == {"key": key}
    other = request_of(daemon_a, elsewhere.metadata["adaptord.request_id"])["thread"]
    assert other == {"key": a2a_bridge.thread_key("chat", elsewhere.context_id)} != {"key": key}
    # An agent without the setting keeps every message on its own.
    with daemon_a.client("echo") as client:
        task = client.send("hello", context_id=first.context_id)
    assert "thread" not in request_of(daemon_a, task.metadata["adaptord.request_id"])


def test_a_context_id_becomes_a_short_plain_thread_key() -> None:
    uuid = "6f1c1b5e-7f1a-4a43-9c1e-2b9f0e4d8a11"
    assert a2a_bridge.thread_key("chat", uuid) == f"a2a/chat/{uuid}"
    for odd in ("../../etc", "x" * 500, "tab\there", "ünï"):
        key = a2a_bridge.thread_key("chat", odd)
        assert re.fullmatch(r"a2a/chat/sha256-[0-9a-f]{32}", key), key
    assert a2a_bridge.thread_key("chat", "a/b") != a2a_bridge.thread_key("chat", "a/c")


@slow
def test_a_stream_shows_the_runs_text_then_the_result(daemon_a: Served) -> None:
    with daemon_a.client("echo") as client, client.send_stream("stream please") as stream:
        events = events_until(stream, lambda e: isinstance(e, a2a.TerminalEvent))
    assert isinstance(events[0], a2a.TaskEvent)
    assert events[0].task.state is a2a.TaskState.SUBMITTED
    assert progress(events) == "thinking... A says hello"
    artifacts = [e for e in events if isinstance(e, a2a.ArtifactEvent)]
    assert [(a.artifact.name, a.artifact.text, a.last_chunk) for a in artifacts] == [
        ("result", "A says hello", True)
    ]
    terminal = events[-1]
    assert isinstance(terminal, a2a.TerminalEvent)
    assert terminal.state is a2a.TaskState.COMPLETED and not terminal.recovered


@slow
def test_cancel_cancels_the_run_and_ends_the_task_canceled(daemon_a: Served) -> None:
    with daemon_a.client("slow") as client, client.send_stream("take your time") as stream:
        # Running for real: its first text reached the stream through the audit log.
        started = events_until(stream, lambda e: progress([e]) == "started")
        task_id = stream.task_id
        cancelled = client.cancel_task(task_id)
        assert cancelled.state is a2a.TaskState.CANCELED
        assert cancelled.status_message is not None
        assert cancelled.status_message.text.startswith("cancelled: the run was cancelled")
        end = events_until(stream, lambda e: isinstance(e, a2a.TerminalEvent))[-1]
        assert isinstance(end, a2a.TerminalEvent) and end.state is a2a.TaskState.CANCELED
        assert client.get_task(task_id).state is a2a.TaskState.CANCELED
    first = started[0]
    assert isinstance(first, a2a.TaskEvent)
    request_id = first.task.metadata["adaptord.request_id"]
    verdict = daemon_a.daemon.verdict(request_id)
    assert verdict["ok"] is False
    assert isinstance(errors.from_wire(verdict["error"]), errors.RunCancelledError)
    assert "too late" not in json.dumps(verdict)


@slow
def test_a_failed_run_fails_the_task_with_a_fixed_text(daemon_a: Served) -> None:
    with daemon_a.client("broken") as client:
        task = client.send("fail please")
        fetched = client.get_task(task.id)
    assert task.state is a2a.TaskState.FAILED and fetched.state is a2a.TaskState.FAILED
    assert task.status_message is not None
    part = task.status_message.parts[0]
    assert part.text == "agent_error: the agent run failed (ErrAgentFailed)"
    assert dict(part.metadata) == {"agentadaptor.failure": {"code": "agent_error"}}
    for snapshot in (task, fetched):
        assert SECRET not in repr(snapshot)
    # The operator still has the whole story in daemon A's own verdict.
    verdict = daemon_a.daemon.verdict(task.metadata["adaptord.request_id"])
    assert SECRET in verdict["error"]["message"]


# --- refusing to start --------------------------------------------------------------------------


@slow
@pytest.mark.parametrize(
    ("config", "listen", "why"),
    [
        (NO_TOKEN, "0.0.0.0:0", "refusing to serve A2A on a non-loopback address"),
        ("", "127.0.0.1:0", "no agents to serve"),
        (AGENTS, "127.0.0.1:nope", "expected HOST:PORT"),
    ],
    ids=["non-loopback-without-token", "no-agents", "bad-address"],
)
def test_serve_refuses_to_start(tmp_path: Path, config: str, listen: str, why: str) -> None:
    (tmp_path / "config.toml").write_text(config)
    proc = DaemonProcess(
        tmp_path / "home", "--config", str(tmp_path / "config.toml"), "--a2a", listen
    ).start(wait_ready=False)
    assert proc.proc is not None and proc.proc.wait(WAIT) == 2
    proc.wait_for_line(why)
    assert not proc.home.daemon_state.exists()  # nothing was started


def test_a_reload_that_changes_the_served_agents_says_they_wait_for_a_restart(tmp_path: Path) -> None:
    # Served agents are fixed at start; a reload changing them said only "config reloaded".
    # The remotes (the delegation tool's) change at once and need nothing.
    agent = '[a2a.agents.echo.request]\ndriver = "script"\n'
    remote = '[a2a.remotes.r]\ncard_url = "http://127.0.0.1:9/agents/{}/.well-known/agent-card.json"\n'
    config = tmp_path / "config.toml"
    config.write_text(agent + remote.format("one"))
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--a2a", "127.0.0.1:0").start()
    proc.wait_for_line("a2a.listening url=")
    assert "restart_needed_for" not in proc.reload(config, agent + remote.format("two"))
    changed = proc.reload(config, '[a2a.agents.echo]\ndescription = "new"\n' + agent + remote.format("two"))
    assert changed.startswith("adaptord: config reloaded") and "restart_needed_for=a2a" in changed, changed
    assert proc.stop() == 0


# Loaded by every Python process whose PYTHONPATH leads with its folder: once the trigger file
# exists, uvicorn's main loop raises in the daemon's A2A server thread, as a crash would.
_LISTENER_CRASH = """
import os
import pathlib

_trigger = os.environ.get("ADAPTOR_TEST_A2A_CRASH")
if _trigger:
    import uvicorn.server

    _tick = uvicorn.server.Server.on_tick

    async def _on_tick(self, counter):
        if pathlib.Path(_trigger).exists():
            raise RuntimeError("injected: the A2A server loop failed")
        return await _tick(self, counter)

    uvicorn.server.Server.on_tick = _on_tick
"""


def _daemon_whose_listener_crashes(tmp_path: Path) -> tuple[DaemonProcess, Path]:
    """A daemon serving A2A whose listener fails once the returned trigger file exists."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_LISTENER_CRASH)
    trigger = tmp_path / "crash-now"
    config = tmp_path / "config.toml"
    config.write_text('[a2a.agents.echo.request]\ndriver = "script"\n')
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    proc = DaemonProcess(
        tmp_path / "home", "--config", str(config), "--a2a", "127.0.0.1:0",
        env={"PYTHONPATH": path, "ADAPTOR_TEST_A2A_CRASH": str(trigger)},
    ).start()
    url = re.search(r"url=(\S+)", proc.wait_for_line("a2a.listening url="))
    assert url is not None
    assert httpx.get(url.group(1) + "/.well-known/agent-card.json", timeout=WAIT).status_code == 200
    return proc, trigger


def test_a_listener_that_dies_stops_the_daemon_with_a_restartable_exit(tmp_path: Path) -> None:
    # The daemon served on without its A2A listener and said nothing: callers were refused
    # while systemd (Restart=on-failure) saw a healthy service.
    proc, trigger = _daemon_whose_listener_crashes(tmp_path)
    trigger.touch()
    died = proc.wait_for_line("adaptord: a2a.died ")
    assert "injected: the A2A server loop failed" in died and "then=stopping exit_code=70" in died
    assert proc.proc is not None
    assert proc.proc.wait(timeout=60) == 70  # it stops by itself: no signal sent
    assert proc.stop() == 70
    recorder = sr.EventRecorder(sr.JSONLEventBackend(proc.home.events))
    phases = [getattr(record.event, "data", {}).get("phase") for record in recorder.since("adaptord")]
    recorder.close()
    assert phases.index("a2a.died") < phases.index("daemon.stopped"), phases


def test_a_stop_signal_after_the_listener_died_keeps_the_restartable_exit(tmp_path: Path) -> None:
    # systemd's stop (or a script's kill) reaching the daemon on its way out after the
    # listener died killed it by SIGTERM (-15) instead of letting it exit 70: a stop the
    # unit does not restart from, with the listener gone.
    proc, trigger = _daemon_whose_listener_crashes(tmp_path)
    trigger.touch()
    proc.wait_for_line("adaptord: a2a.died ")
    assert proc.signal_until_gone(signal.SIGTERM, signal.SIGINT) == 70


# --- two daemons --------------------------------------------------------------------------------


@slow
def test_daemon_b_delegates_to_daemon_a(daemon_a: Served, tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        f"""
[a2a.remotes.a]
card_url = "{daemon_a.card_url("echo")}"
display_name = "Daemon A"
bearer_token_env = "{TOKEN_ENV}"
policy = {{ max_timeout = 60 }}
"""
    )
    b = DaemonProcess(tmp_path / "home", "--config", str(tmp_path / "config.toml")).start()
    try:
        # The agent of B calls the host tool through its run's tool gateway, like a CLI would.
        call = {"name": "delegate_to_agent", "args": {"agent": "a", "prompt": "hello from B"}}
        request_id = b.submit(
            {
                "driver": "script",
                "prompt": "ask A",
                "tools": ["delegate_to_agent"],
                "config": {"steps": [{"call_tool": call}]},
            }
        )
        verdict = b.verdict(request_id)
        assert verdict["ok"] is True, verdict["error"]
        result = spool.Client(b.home.root).wait(request_id)
    finally:
        assert b.stop() == 0
    (outcome,) = [item for item in result.transcript() if item.kind == "tool_result"]
    assert not outcome.is_error
    delegated = json.loads(outcome.text)
    assert delegated["agent"] == "a" and delegated["status"] == "completed"
    assert delegated["text"] == "A says hello"
    assert TOKEN not in json.dumps(verdict) and TOKEN not in outcome.text
    # A ran it as one of its own requests, for the task B's delegation created.
    runs = [
        request_of(daemon_a, path.name)
        for path in daemon_a.daemon.home.runs.iterdir()
        if (path / "request.json").exists()
    ]
    (asked,) = [r for r in runs if r["prompt"] == "hello from B"]
    assert asked["metadata"]["a2a.task_id"] == delegated["remote_task_id"]


def _remote_run(served: Served, prompt: str) -> str:
    """The id of the request ``served`` runs for a delegation of ``prompt``, once it started."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for path in served.daemon.home.runs.iterdir():
            if (path / "request.json").exists() and request_of(served, path.name)["prompt"] == prompt:
                return path.name
        time.sleep(0.05)
    raise AssertionError(f"no run of {prompt!r} started on {served.url}")


@slow
def test_cancelling_the_leader_cancels_its_delegation_in_flight(
    daemon_a: Served, tmp_path: Path
) -> None:
    # The delegation ran on until the remote answered or max_timeout ended it: the leader's
    # cancel never reached the tool's handler.
    (tmp_path / "config.toml").write_text(
        f"""
[a2a.remotes.slow]
card_url = "{daemon_a.card_url("slow")}"
bearer_token_env = "{TOKEN_ENV}"
policy = {{ max_timeout = 600 }}
"""
    )
    prompt = "take all the time you need " + secrets.token_hex(4)
    b = DaemonProcess(tmp_path / "home", "--config", str(tmp_path / "config.toml")).start()
    try:
        call = {"name": "delegate_to_agent", "args": {"agent": "slow", "prompt": prompt}}
        leader = b.submit(
            {
                "driver": "script",
                "prompt": "ask A",
                "tools": ["delegate_to_agent"],
                "config": {"steps": [{"call_tool": call}, {"text": "A answered"}]},
            }
        )
        remote = _remote_run(daemon_a, prompt)
        spool.Client(b.home.root).cancel(leader)
        leader_verdict = b.verdict(leader)
    finally:
        assert b.stop() == 0
    # A's run (300 s of sleep) was cancelled by the delegation's remote cancel, not run out.
    remote_verdict = daemon_a.daemon.verdict(remote, timeout=WAIT)
    assert isinstance(errors.from_wire(remote_verdict["error"]), errors.RunCancelledError)
    assert isinstance(errors.from_wire(leader_verdict["error"]), errors.RunCancelledError)
    assert "A answered" not in json.dumps(leader_verdict)


@slow
@pytest.mark.parametrize(
    ("agent", "code"), [("late", "deadline_exceeded"), ("broken", "agent_error")]
)
def test_a_delegation_keeps_the_remote_failures_code(daemon_a: Served, agent: str, code: str) -> None:
    # The bridge states the run's failure code on its FAILED status; the delegator made every
    # one of them "remote_failed", so a leader could not tell a remote timeout from a crash.
    from hosttools import a2adelegation as d

    spec = d.RemoteAgentSpec.from_mapping(
        {"key": agent, "card_url": daemon_a.card_url(agent), "bearer_token_env": TOKEN_ENV}
    )
    with d.Delegator(d.Registry([spec])) as delegator:
        with pytest.raises(d.DelegationError) as caught:
            delegator.delegate(d.DelegationRequest(agent, "go"))
    err = caught.value
    assert (err.code, err.remote_status, err.metadata["reason"]) == (code, "failed", f"remote_{code}")
    assert SECRET not in str(err) and SECRET not in json.dumps(err.to_wire())
    if code == "deadline_exceeded":  # the request's timeout, 0.5 s
        assert err.metadata["limit_ms"] == 500


@slow
def test_a_message_to_a_running_task_is_refused_at_once(daemon_a: Served) -> None:
    # One message, one run: a follow-up to a task that still runs starts nothing.  The call was
    # held until the run ended (five minutes here), then answered with a stale WORKING task.
    with daemon_a.client("slow") as client:
        task = client.send("first", return_immediately=True)
        try:
            with pytest.raises(a2a.UnsupportedError):
                client.send("more input", task_id=task.id, context_id=task.context_id,
                            return_immediately=True)
            with pytest.raises(a2a.UnsupportedError):
                client.send("more input", task_id=task.id, context_id=task.context_id)
            with pytest.raises(a2a.UnsupportedError):
                with client.send_stream("more input", task_id=task.id, context_id=task.context_id) as stream:
                    list(stream)
            assert client.get_task(task.id).state is a2a.TaskState.WORKING  # the run goes on
        finally:
            client.cancel_task(task.id)
    prompts = [
        request_of(daemon_a, path.name)["prompt"]
        for path in daemon_a.daemon.home.runs.iterdir()
        if (path / "request.json").exists()
    ]
    assert "more input" not in prompts


@slow
def test_a_task_still_queued_when_the_daemon_stops_ends_failed(
    tmp_path: Path, token_env: None
) -> None:
    # Its stream just ended (StreamRecoveryError for the caller) and the task kept no final
    # state: a caller could not tell "the daemon went away" from a dropped connection.
    (tmp_path / "config.toml").write_text("workers = 1\ngrace = 1\n" + AGENTS)
    proc = DaemonProcess(
        tmp_path / "home", "--config", str(tmp_path / "config.toml"), "--a2a", "127.0.0.1:0"
    ).start()
    match = re.search(r"url=(http://127\.0\.0\.1:\d+)", proc.wait_for_line("a2a.listening url="))
    assert match is not None
    served = Served(proc, match.group(1))
    try:
        with served.client("slow") as client:
            running = client.send("occupy the only worker", return_immediately=True)
            with client.send_stream("wait in line") as stream:
                first = events_until(stream, lambda e: isinstance(e, a2a.TaskEvent))[-1]
                assert isinstance(first, a2a.TaskEvent)
                request_id = first.task.metadata["adaptord.request_id"]
                proc.wait_for_line(f"request.queued id={request_id}")
                proc.signal(signal.SIGTERM)
                end = events_until(stream, lambda e: isinstance(e, a2a.TerminalEvent))[-1]
    finally:
        assert proc.stop() == 0
    assert isinstance(end, a2a.TerminalEvent) and end.state is a2a.TaskState.FAILED
    assert end.message is not None
    assert end.message.text.startswith("infrastructure_error: ")
    assert end.message.text.endswith("(daemon_stopping)")
    assert running.id != end.task_id
    # Handed back to the spool, marked: the next start cancels it rather than running it.
    again = DaemonProcess(tmp_path / "home", "--config", str(tmp_path / "config.toml")).start()
    try:
        verdict = again.verdict(request_id)
    finally:
        assert again.stop() == 0
    assert isinstance(errors.from_wire(verdict["error"]), errors.CancelledError)


def test_a_message_refused_while_stopping_names_no_request(tmp_path: Path) -> None:
    # Its task named a request id that was never made: no spool file, no verdict, and
    # `adaptor wait` on it said there is no such request.
    (tmp_path / "config.toml").write_text(NO_TOKEN)
    agents = config_module.load(tmp_path / "config.toml").a2a.agents
    sock = a2a_bridge.listening_socket(a2a_bridge.Listen("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app, _ = a2a_bridge.build_app(
        agents[:1], url, spool.Client(tmp_path / "home"), stopping=lambda: True
    )
    server = a2a_bridge.ServerThread(app, sock, name="stopping")
    server.start()
    try:
        with a2a.Client(url + a2a_bridge.card_path(agents[0].key)) as client:
            task = client.send("too late")
    finally:
        server.stop()
    assert task.state is a2a.TaskState.FAILED
    assert task.status_message is not None
    assert task.status_message.text.endswith("(daemon_stopping)")
    assert a2a_bridge.REQUEST_ID_KEY not in task.metadata
    assert not (tmp_path / "home").exists()  # nothing was submitted


def test_a_message_refused_as_too_large_names_no_request(tmp_path: Path) -> None:
    # Its REJECTED task named the request id minted for it, though no request was ever made
    # under it: `adaptor events <id>` and the run folders knew nothing of it.
    (tmp_path / "config.toml").write_text(NO_TOKEN)
    agents = config_module.load(tmp_path / "config.toml").a2a.agents
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    sock = a2a_bridge.listening_socket(a2a_bridge.Listen("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app, _ = a2a_bridge.build_app(agents[:1], url, spool.Client(home.root))
    server = a2a_bridge.ServerThread(app, sock, name="too-large")
    server.start()
    try:
        with a2a.Client(url + a2a_bridge.card_path(agents[0].key)) as client:
            task = client.send("y" * (a2a_bridge.MAX_BODY // 2 + 10))
    finally:
        server.stop()
    assert task.state is a2a.TaskState.REJECTED and "the message is too large" in task.text
    assert a2a_bridge.REQUEST_ID_KEY not in task.metadata
    assert list(home.spool_new.iterdir()) == []  # nothing was submitted


def test_only_the_latest_finished_tasks_stay_in_memory(tmp_path: Path) -> None:
    # The SDK's store kept every task, with its prompt and answer, for the life of the daemon:
    # serving for weeks, it grew by some 40 KB per 20 KB prompt, for ever.
    from a2a.server.context import ServerCallContext
    from a2a.types import Task, TaskState, TaskStatus

    (tmp_path / "config.toml").write_text(AGENTS)
    agents = config_module.load(tmp_path / "config.toml").a2a.agents
    _, handlers = a2a_bridge.build_app(agents[:1], "http://127.0.0.1:1", spool.Client(tmp_path / "home"))
    assert isinstance(handlers[0], a2a_bridge._Handler)
    store = handlers[0]._tasks  # the store the served handler keeps its tasks in
    context = ServerCallContext()

    def task(task_id: str, state: TaskState) -> Task:
        return Task(id=task_id, context_id="ctx", status=TaskStatus(state=state))

    async def serve_tasks() -> list[int]:
        await store.save(task("running", TaskState.TASK_STATE_WORKING), context)
        for i in range(1050):
            await store.save(task(f"t{i}", TaskState.TASK_STATE_WORKING), context)
            await store.save(task(f"t{i}", TaskState.TASK_STATE_COMPLETED), context)
        running = await store.get("running", context)  # still running: never let go
        assert running is not None and running.status.state == TaskState.TASK_STATE_WORKING
        return [i for i in range(1050) if await store.get(f"t{i}", context) is not None]

    assert asyncio.run(serve_tasks()) == list(range(50, 1050))  # the latest 1000 finished


# --- parsing (no processes) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        ("8080", "127.0.0.1", 8080),
        (":0", "127.0.0.1", 0),
        ("[::1]:9", "::1", 9),
        ("localhost:7", "localhost", 7),
    ],
)
def test_listen_addresses(text: str, host: str, port: int) -> None:
    assert a2a_bridge.Listen.parse(text) == a2a_bridge.Listen(host, port)


@pytest.mark.parametrize("text", ["", "host:", "host:70000", "[::1]", "a:b:c"])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        a2a_bridge.Listen.parse(text)


def test_only_loopback_goes_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    agents = config_module._parse(
        {"a2a": {"agents": {"x": {"request": {"driver": "script"}}}}}, "t"
    ).a2a
    assert a2a_bridge.check(a2a_bridge.Listen("127.0.0.1", 0), agents) is None
    assert a2a_bridge.check(a2a_bridge.Listen("localhost", 0), agents) is None
    with pytest.raises(config_module.ConfigError, match="non-loopback"):
        a2a_bridge.check(a2a_bridge.Listen("0.0.0.0", 0), agents)
    with_env = config_module._parse(
        {
            "a2a": {
                "bearer_token_env": "NOPE_UNSET_VAR",
                "agents": {"x": {"request": {"driver": "script"}}},
            }
        },
        "t",
    ).a2a
    monkeypatch.delenv("NOPE_UNSET_VAR", raising=False)
    with pytest.raises(config_module.ConfigError, match="unset or empty"):
        a2a_bridge.check(a2a_bridge.Listen("0.0.0.0", 0), with_env)
    monkeypatch.setenv("NOPE_UNSET_VAR", "value")
    assert a2a_bridge.check(a2a_bridge.Listen("0.0.0.0", 0), with_env) == "value"


@pytest.mark.parametrize(
    ("a2a_table", "why"),
    [
        ({"agents": {"x": {"request": {"driver": "nope"}}}}, "/driver: unknown driver"),
        ({"agents": {"x": {"request": {"driver": "script", "prompt": "p"}}}}, "set by the bridge"),
        ({"agents": {"x": {}}}, "request template table is required"),
        ({"agents": {"x y": {"request": {"driver": "script"}}}}, "the name must match"),
        # A path segment: /agents/.. is /, the agent advertised there could not be reached.
        ({"agents": {"..": {"request": {"driver": "script"}}}}, "and not be . or .."),
        ({"agents": {".": {"request": {"driver": "script"}}}}, "and not be . or .."),
        # orjson wrote them as null, which passed; then every message failed ("too large: ...").
        ({"agents": {"x": {"request": {"driver": "script", "timeout": float("inf")}}}},
         "request value at /timeout is inf, which JSON cannot hold"),
        ({"agents": {"x": {"request": {"driver": "script", "timeout": float("nan")}}}},
         "request value at /timeout is nan, which JSON cannot hold"),
        # Passed, then every message failed: "working directory ... holds a NUL character".
        ({"agents": {"x": {"request": {"driver": "script", "config": {"cwd": "/tmp\0x"}}}}},
         "a2a.agents.x.request: /config/cwd: holds a NUL character"),
        ({"agents": {"x": {"request": {"driver": "script", "tools": ["t"]}}}}, "no host tool"),
        ({"agents": {"x": {"request": {"driver": "script"}, "skills": [{}]}}}, "non-empty id"),
        ({"remotes": {"r": {"card_url": "ftp://x"}}}, "a2a.remotes.r"),
        ({"remotes": {"r": {"card_url": "http://h/", "policy": {"max_polls": 0}}}}, "max_polls"),
        ({"remotes": {"r": {"key": "s", "card_url": "http://h/"}}}, "table name"),
        ({"bearer_token": "a", "bearer_token_env": "B"}, "not both"),
        ({"public_url": "not a url"}, "public_url"),
        ({"listen": "x"}, "unknown a2a setting"),
        ({"agents": {"x": {"request": {"driver": "script"}, "threads": "all"}}}, "threads must"),
        (
            {
                "agents": {
                    "x": {
                        "request": {"driver": "script", "thread": {"key": "k"}},
                        "threads": "per_context",
                    }
                }
            },
            "thread: set by the bridge",
        ),
    ],
)
def test_bad_a2a_tables_are_refused(a2a_table: dict[str, Any], why: str) -> None:
    with pytest.raises(config_module.ConfigError, match=re.escape(why)):
        config_module._parse({"a2a": a2a_table}, "t")


def _agent(template: dict[str, Any], threads: str = "none") -> dict[str, Any]:
    return {"agents": {"x": {"request": template, "threads": threads}}}


# What a run checks before it starts, from the template alone, used to fail every task of the
# agent (as each one ran); the config is refused at load instead, with the run's own reason.
@pytest.mark.parametrize(
    ("a2a_table", "why"),
    [
        (
            _agent({"driver": "script", "config": {"stpes": []}}),
            "a2a.agents.x.request.config: unknown setting(s): 'stpes' (did you mean 'steps'?)",
        ),
        (
            _agent({"driver": "claude", "config": {"modle": "opus"}}),
            "'modle' (did you mean 'model'?)",
        ),
        (
            _agent({"driver": "claude", "config": {"permission_mode": "yolo"}}),
            "a2a.agents.x.request: invalid configuration for driver 'claude': permission_mode",
        ),
        (_agent({"driver": "script", "timeout": 0}), "a2a.agents.x.request: /timeout: must be more than 0"),
        (
            _agent({"driver": "script", "policy": {"approvals": {"permission": "always"}}}),
            "invalid policy value for Policy.Approvals.Permission: 'always'",
        ),
        (
            _agent({"driver": "claude", "policy": {"sandbox": "read_only"}}),
            "driver 'claude' cannot honour sandbox='read_only'",
        ),
        (
            _agent({"driver": "command", "config": {"command": "true"}}, threads="per_context"),
            "driver 'command' cannot resume sessions",
        ),
        (_agent({"driver": "script", "mcp": [{"name": "x"}]}), "mcp[0]: unknown field(s) name"),
        (_agent({"driver": "script", "skills": [{"nmae": "x"}]}), "/skills/0: unknown skill field(s): nmae"),
        (_agent({"driver": "script", "schema": {"type": "text"}}), "invalid output schema"),
    ],
    ids=[
        "config-key", "config-key-claude", "config-value", "timeout", "policy-value",
        "policy-capability", "threads", "mcp", "skills", "schema",
    ],
)
def test_a_template_that_would_fail_every_task_is_refused(a2a_table: dict[str, Any], why: str) -> None:
    with pytest.raises(config_module.ConfigError, match=re.escape(why)):
        config_module._parse({"a2a": a2a_table}, "t")


def test_a_template_is_checked_over_its_drivers_defaults() -> None:
    template: dict[str, Any] = {"driver": "claude", "policy": {"sandbox": "readonly"}}
    raw: dict[str, Any] = {"a2a": _agent(template), "drivers": {"claude": {"permission_mode": "plan"}}}
    with pytest.raises(config_module.ConfigError, match=re.escape("a2a.agents.x.request (over [drivers.claude])")):
        config_module._parse(raw, "t")
    del template["policy"]
    template["config"] = {"permission_mode": "default"}
    assert config_module._parse(raw, "t").a2a.agents[0].request["config"] == {"permission_mode": "default"}
    # A default the driver refuses fails every run that takes it: refused at its own table,
    # even where a template overrides it.
    raw["drivers"]["claude"]["permission_mode"] = "yolo"
    with pytest.raises(config_module.ConfigError, match=re.escape("t: [drivers.claude]: invalid configuration")):
        config_module._parse(raw, "t")


def test_a_template_error_does_not_show_a_secret() -> None:
    # A secret pasted into the wrong field is quoted by the policy check's message.
    template = {"driver": "script", "config": {"env": {"API_KEY": SECRET}}, "policy": {"sandbox": SECRET}}
    with pytest.raises(config_module.ConfigError) as refused:
        config_module._parse({"a2a": _agent(template)}, "t")
    assert "Policy.Sandbox: '<redacted>'" in str(refused.value) and SECRET not in str(refused.value)


def test_a_template_a_task_can_run_is_accepted() -> None:
    template = {
        "driver": "claude",
        "timeout": 900,
        "policy": {"approvals": {"permission": "auto_reject"}},
        "config": {"model": "opus", "env": {"ANTHROPIC_API_KEY": SECRET}},
        "mcp": [{"key": "docs", "transport": "http", "url": "http://127.0.0.1:9/mcp"}],
        "schema": {"type": "object"},
    }
    agent = config_module._parse({"a2a": _agent(template, threads="per_context")}, "t").a2a.agents[0]
    assert agent.request == template


def test_remotes_make_the_delegate_tool_selectable() -> None:
    remote = {"remotes": {"r": {"card_url": "http://127.0.0.1:9/card.json"}}}
    cfg = config_module._parse(
        {
            "a2a": {
                **remote,
                "agents": {"x": {"request": {"driver": "script", "tools": ["delegate_to_agent"]}}},
            }
        },
        "t",
    )
    tool = cfg.load_tools()["delegate_to_agent"]
    assert "- r (r)" in tool.description
    taken = config_module._parse({"a2a": remote, "tools": {"delegate_to_agent": "os:getcwd"}}, "t")
    with pytest.raises(config_module.ConfigError, match="taken"):
        taken.load_tools()


# A remote's value of the wrong type crashed `adaptord check`/`serve` with a traceback (a number
# as card_url), was read character by character (a string for trusted_origins or policy), or was
# taken for its truthiness (require_streaming = "no" meant yes); each is a config error now.
@pytest.mark.parametrize(
    ("remote", "why"),
    [
        ({"card_url": 5}, "card_url must be a URL string"),
        ({"card": "not a card"}, "card must be an agent card"),
        ({"display_name": 5}, "display_name must be a string"),
        ({"trusted_origins": "https://box.example"}, "trusted_origins must be a list of origin URL strings"),
        ({"trusted_origins": [1]}, "trusted_origins must be a list of origin URL strings"),
        ({"policy": "fast"}, "policy must be a table of Policy fields"),
        ({"policy": {"require_streaming": "no"}}, "Policy.require_streaming must be true or false"),
        ({"policy": {"allow_input_required": "false"}}, "Policy.allow_input_required must be true or false"),
        # "" sent no token at all, without a word ([a2a] bearer_token_env = "" is refused).
        ({"bearer_token_env": ""}, "bearer_token_env must name an environment variable"),
        ({"bearer_token_env": 5}, "bearer_token_env must name an environment variable"),
    ],
    ids=["card-url", "card", "display-name", "origins-string", "origins-number", "policy", "streaming", "input",
         "token-env-empty", "token-env-number"],
)
def test_a_remote_value_of_the_wrong_type_is_refused(remote: dict[str, Any], why: str) -> None:
    table = {"card_url": "https://box.example/.well-known/agent-card.json", **remote}
    with pytest.raises(config_module.ConfigError, match=re.escape(f"t: a2a.remotes.r: {why}")):
        config_module._parse({"a2a": {"remotes": {"r": table}}}, "t")


@pytest.mark.parametrize("token", ["secret ", " secret", "sec\nret", "sec\tret"])
def test_a_bearer_token_no_header_can_carry_is_refused(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # "super secret " passed `adaptord check`, yet no caller could ever present it: HTTP drops
    # a header value's surrounding whitespace, so every call got 401.
    with pytest.raises(config_module.ConfigError, match="a2a.bearer_token (begins|holds)"):
        config_module._parse({"a2a": {"bearer_token": token}}, "t")
    monkeypatch.setenv("QA_TOKEN", token)
    config = config_module._parse({"a2a": {"bearer_token_env": "QA_TOKEN"}}, "t")
    with pytest.raises(config_module.ConfigError, match="the value of 'QA_TOKEN' (begins|holds)"):
        config.a2a.token()


def test_check_reports_a_remote_of_the_wrong_type(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[a2a.remotes.r]\ncard_url = 5\n")
    check = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=WAIT,
    )
    assert check.returncode == 2, check.stderr
    assert "a2a.remotes.r: card_url must be a URL string" in check.stdout + check.stderr
    assert "Traceback" not in check.stderr


# public_url is advertised in every card (public, no token needed), logged, and kept in
# adaptord.json: a user:password@ in it was published as it was, and a query ended up in front
# of each card's path ("...?x=1/agents/echo").
@pytest.mark.parametrize(
    "url",
    [
        "https://admin:pw-9f8e7d@box.example:8443",
        "https://pw-9f8e7d@box.example",
        "https://box.example/?token=pw-9f8e7d",
        "https://box.example/#pw-9f8e7d",
    ],
    ids=["user-password", "user", "query", "fragment"],
)
def test_a_public_url_with_credentials_or_a_query_is_refused(url: str) -> None:
    with pytest.raises(config_module.ConfigError, match="public_url must be a base URL") as caught:
        config_module._parse({"a2a": {"public_url": url}}, "t")
    assert "pw-9f8e7d" not in str(caught.value)


def test_a_public_url_with_a_path_is_the_cards_base() -> None:
    parsed = config_module._parse(
        {"a2a": {"public_url": "https://box.example:8443/a2a/", "agents": {"echo": {"request": {"driver": "script"}}}}},
        "t",
    ).a2a
    card = a2a_bridge.agent_card(parsed.agents[0], str(parsed.public_url), bearer=False)
    assert card.supported_interfaces[0].url == "https://box.example:8443/a2a/agents/echo"


def _echo_bridge(tmp_path: Path) -> tuple[DaemonProcess, str]:
    """A daemon serving one script-driver agent, ``echo``, over A2A; and that agent's URL."""
    config = tmp_path / "config.toml"
    config.write_text('[a2a.agents.echo.request]\ndriver = "script"\n')
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--a2a", "127.0.0.1:0").start()
    match = re.search(r"url=(\S+)", proc.wait_for_line("a2a.listening url="))
    assert match is not None
    return proc, f"{match.group(1)}/agents/echo"


def test_a_malformed_call_is_one_prefixed_log_line(tmp_path: Path) -> None:
    # The a2a-sdk logged a caller's malformed request through Python logging, which reached the
    # daemon's stderr as bare text and a multi-line traceback quoting what the caller sent.
    proc, rpc = _echo_bridge(tmp_path)
    try:
        bad_params = {
            "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": 5}]}},
        }
        assert httpx.post(rpc, content=b"{not json\nxyzzy").json()["error"]["code"] == -32700
        assert httpx.post(rpc, json=bad_params).json()["error"]["code"] == -32602
        proc.wait_for_line("adaptord: a2a.server_log level=error")
    finally:
        assert proc.stop() == 0
    assert [line for line in proc.lines if not line.startswith("adaptord: ")] == []


def test_refused_calls_about_a_finished_task_leave_no_traceback(tmp_path: Path) -> None:
    # A message naming a finished task was refused by the a2a-sdk only after it had set up the
    # task's event queue, whose pending dispatch task was later reported on stderr as bare
    # multi-line text ("Failed to detach context", "Task was destroyed but it is pending!").
    proc, rpc = _echo_bridge(tmp_path)
    try:
        with a2a.Client(f"{rpc}/.well-known/agent-card.json") as client:
            done = client.send("hi")
            assert done.state.terminal
            for _ in range(3):
                with pytest.raises(a2a.UnsupportedError):
                    client.send("again", task_id=done.id)
                with pytest.raises(a2a.UnsupportedError):
                    list(client.send_stream("again", task_id=done.id))
                assert client.cancel_task(done.id).state is done.state
            # What the refusals left behind is collected meanwhile, or at the stop at the latest.
            for _ in range(5):
                assert client.send("more").state.terminal
    finally:
        assert proc.stop() == 0
    assert [line for line in proc.lines if not line.startswith("adaptord: ")] == []


def test_the_bridges_own_failures_are_one_daemon_fact_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two went to the "adaptord.a2a" Python logger instead of the daemon's log: unprefixed on
    # the daemon's stderr, and the server thread's as a multi-line traceback.
    from adaptord._lifecycle import line as fact_line

    facts: list[tuple[str, dict[str, Any]]] = []

    def log(fact: str, **fields: Any) -> None:
        facts.append((fact, fields))

    # A run whose events cannot be followed (here: no spool at all).
    posted: list[Any] = []
    a2a_bridge._follow(spool.Client(tmp_path / "no-home"), "r-1", posted.append, log)
    assert len(posted) == 1 and posted[0].error is not None  # the outcome still arrives
    # A server thread that dies (here: its socket was closed under it).
    sock = a2a_bridge.listening_socket(a2a_bridge.Listen("127.0.0.1", 0))
    sock.close()
    from starlette.applications import Starlette

    server = a2a_bridge.ServerThread(Starlette(), sock, name="doomed", log=log)
    with contextlib.suppress(RuntimeError):
        server.start()
    server.stop()
    assert [fact for fact, _ in facts] == [
        "a2a: cannot follow a request's events", "a2a.server_failed"
    ]
    assert facts[0][1]["id"] == "r-1"
    for fact, fields in facts:
        line = fact_line(fact, fields)
        assert line.startswith("adaptord: ") and "\n" not in line, line
    assert [r for r in caplog.records if r.name.startswith("adaptord")] == []


def test_peers_that_never_finish_a_request_cannot_take_the_daemons_descriptors(tmp_path: Path) -> None:
    # Connections sending the start of a request and never its end (no token is checked before
    # the headers end) were kept for ever: some 1,100 of them took every descriptor of a daemon
    # under a limit of 1,024, and no request ran, A2A or spool, until the peer let go.
    import socket

    (tmp_path / "config.toml").write_text(NO_TOKEN)
    daemon = DaemonProcess(
        tmp_path / "home", "--config", str(tmp_path / "config.toml"), "--a2a", "127.0.0.1:0",
        prefix=("prlimit", "--nofile=128:128", "--"),
    ).start()
    peers: list[socket.socket] = []
    try:
        match = re.search(r"url=http://127\.0\.0\.1:(\d+)", daemon.wait_for_line("a2a.listening url="))
        assert match is not None
        port = int(match.group(1))
        for _ in range(150):  # more than the daemon has descriptors
            peer = socket.create_connection(("127.0.0.1", port), timeout=30)
            peer.sendall(b"POST /agents/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            peers.append(peer)
        request = {"driver": "script", "prompt": "x", "config": {"steps": [{"text": "served meanwhile"}]}}
        assert daemon.verdict(daemon.submit(request))["result"]["text"] == "served meanwhile"
        # A quarter of the limit is kept, the others are told at once and let go; the ones kept
        # are closed once their headers are late (10 s).
        answers = [peer.recv(1024) for peer in peers]
        assert all(answer == b"" or answer.startswith(b"HTTP/1.1 503 ") for answer in answers), set(answers)
        assert 0 < answers.count(b"") <= 32
        head, _, body = next(answer for answer in answers if answer).partition(b"\r\n\r\n")
        assert b"\r\nretry-after: 1\r\n" in head and f"content-length: {len(body)}".encode() in head
        with a2a.Client(f"http://127.0.0.1:{port}{a2a_bridge.card_path('echo')}") as client:
            assert client.send("after them").state is a2a.TaskState.COMPLETED
    finally:
        for peer in peers:
            peer.close()
        assert daemon.stop() == 0, "\n".join(daemon.lines)
    assert not any("out of system resource" in line for line in daemon.lines)

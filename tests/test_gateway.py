"""The tool gateway: a real MCP server on 127.0.0.1, exercised with the official MCP client."""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the tool gateway needs the mcp extra")

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from adaptor import _gateway, tool


@dataclass
class Add:
    a: int
    b: int


@dataclass
class Sum:
    total: int


def add(args: Add) -> Sum:
    if args.a < 0:
        raise tool.reject("negative", "only non-negative numbers, please")
    if args.a == 13:
        raise RuntimeError("unlucky: connection string postgres://admin:pw@db")
    return Sum(args.a + args.b)


TOOLS = [
    tool.define(
        "add",
        "Add two numbers",
        add,
        input=Add,
        output=Sum,
        revision="1",
        read_only=True,
        idempotent=True,
        title="Adder",
    ),
    tool.define(
        "shout",
        "Upper-case a text",
        lambda v: v["text"].upper(),
        input={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
]


@pytest.fixture(scope="module")
def gateway() -> Iterator[_gateway.Gateway]:
    gw = _gateway.Gateway(tool.check_catalogue(TOOLS))
    gw.start()
    yield gw
    gw.close()


def admit(gateway: _gateway.Gateway, ended: threading.Event | None = None) -> str:
    """A secret the gateway accepts, as a run's CLI gets it."""
    env = gateway.admit(ended or threading.Event()).env
    return env[gateway.start().server.bearer_token_env]


def session_call(gateway: _gateway.Gateway, fn: Any, *, token: str | None = None) -> Any:
    endpoint = gateway.start()
    secret = admit(gateway) if token is None else token
    result: list[Any] = []

    async def main() -> None:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(endpoint.server.url, http_client=http) as (r, w):
                async with ClientSession(r, w) as session:
                    await session.initialize()
                    result.append(await fn(session))

    anyio.run(main)
    return result[0]


def test_endpoint_shape(gateway: _gateway.Gateway) -> None:
    endpoint = gateway.start()
    assert gateway.start() is endpoint  # idempotent
    server = endpoint.server
    assert server.key == "adaptor" and server.transport == "http"
    assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/mcp")
    assert server.bearer_token_env.startswith("ADAPTOR_TOOLS_TOKEN_")
    assert endpoint.tools == ("add", "shout")
    token = admit(gateway)
    assert len(token) >= 32
    for shown in (repr(endpoint), repr(gateway), server.url):
        assert token not in shown


def test_list_tools(gateway: _gateway.Gateway) -> None:
    async def list_tools(session: ClientSession) -> Any:
        return await session.list_tools()

    listed = {t.name: t for t in session_call(gateway, list_tools).tools}
    assert set(listed) == {"add", "shout"}
    adder = listed["add"]
    assert adder.title == "Adder" and adder.description == "Add two numbers"
    assert adder.input_schema["required"] == ["a", "b"]
    assert adder.output_schema is not None and adder.output_schema["type"] == "object"
    assert adder.annotations is not None
    assert adder.annotations.read_only_hint is True and adder.annotations.idempotent_hint is True
    assert adder.annotations.destructive_hint is None  # unset: the MCP default applies
    assert listed["shout"].output_schema is None


def call(gateway: _gateway.Gateway, name: str, arguments: dict[str, Any]) -> Any:
    async def run(session: ClientSession) -> Any:
        return await session.call_tool(name, arguments)

    return session_call(gateway, run)


def test_call_a_tool(gateway: _gateway.Gateway) -> None:
    result = call(gateway, "add", {"a": 2, "b": 3})
    assert result.is_error is False
    assert result.structured_content == {"total": 5}
    assert result.content[0].text == '{"total":5}'
    shouted = call(gateway, "shout", {"text": "hi"})
    assert shouted.content[0].text == "HI" and shouted.structured_content is None


def test_bad_input_gets_the_safe_message(gateway: _gateway.Gateway) -> None:
    result = call(gateway, "add", {"a": "SECRET-ARG", "b": 1})
    assert result.is_error is True
    text = result.content[0].text
    assert "wrong type" in text and "SECRET-ARG" not in text
    extra = call(gateway, "add", {"a": 1, "b": 1, "c": "SECRET-ARG"})
    assert extra.content[0].text.startswith('invalid field "c"')


def test_handler_exceptions_get_the_generic_message(gateway: _gateway.Gateway) -> None:
    result = call(gateway, "add", {"a": 13, "b": 0})
    assert result.is_error is True
    assert result.content[0].text == tool.GENERIC_FAILURE
    assert "postgres" not in result.content[0].text


def _exits(args: dict[str, Any]) -> str:
    if args.get("how") == "exit":
        raise SystemExit(2)  # what argparse does with bad arguments
    if args.get("how") == "interrupt":
        raise KeyboardInterrupt
    return "fine"


def test_a_handler_that_raises_systemexit_does_not_end_the_gateway() -> None:
    # SystemExit and KeyboardInterrupt passed the handler's `except Exception` and ended the
    # gateway's event loop: every later call of every tool failed, for the agent's whole life.
    schema = {"type": "object", "properties": {"how": {"type": "string"}}, "required": ["how"]}
    gw = _gateway.Gateway(
        tool.check_catalogue([tool.define("exits", "Maybe exits", _exits, input=schema)])
    )
    gw.start()
    try:
        for how in ("exit", "interrupt", "exit"):
            failed = call(gw, "exits", {"how": how})
            assert failed.is_error is True and failed.content[0].text == tool.GENERIC_FAILURE
            served = call(gw, "exits", {"how": "stay"})
            assert served.is_error is False and served.content[0].text == "fine"
    finally:
        gw.close()


def test_a_schema_nested_too_deeply_is_an_invalid_definition_not_a_crash() -> None:
    # define() is documented never to raise; jsonschema's own recursion at ~100 levels did.
    for levels in (100, 120, 500):
        schema: dict[str, Any] = {"type": "object"}
        inner = schema
        for _ in range(levels):
            inner["properties"] = {"a": {"type": "object"}}
            inner = inner["properties"]["a"]
        for defined in (
            tool.define("deep", "Deep", lambda args: "x", input=schema),
            tool.define("deep", "Deep", lambda args: "x", output=schema),
        ):
            with pytest.raises(tool.InvalidDefinitionError):
                tool.check_catalogue([defined])


def test_rejections_reach_the_model(gateway: _gateway.Gateway) -> None:
    result = call(gateway, "add", {"a": -1, "b": 0})
    assert result.is_error is True
    assert result.content[0].text == "only non-negative numbers, please"


def test_unknown_tools(gateway: _gateway.Gateway) -> None:
    result = call(gateway, "nope", {})
    assert result.is_error is True and "nope" not in result.content[0].text


@pytest.mark.parametrize("token", ["", "wrong-token"])
def test_wrong_or_missing_bearer_is_refused(gateway: _gateway.Gateway, token: str) -> None:
    async def list_tools(session: ClientSession) -> Any:
        return await session.list_tools()

    # The client reports the refusal as an error (in exception groups); the status shows below.
    with pytest.raises(Exception):  # noqa: B017
        session_call(gateway, list_tools, token=token)
    url = gateway.start().server.url
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    refused = httpx2.post(
        url, json=body, headers={**headers, "Accept": "application/json, text/event-stream"}
    )
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"


def _list_status(gateway: _gateway.Gateway, token: str) -> int:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    return httpx2.post(gateway.start().server.url, json=body, headers=headers).status_code


def test_each_run_has_its_own_secret_refused_once_dismissed(gateway: _gateway.Gateway) -> None:
    # One secret per Agent let a CLI outliving its run (a leftover) go on calling tools.
    first, second = gateway.admit(threading.Event()), gateway.admit(threading.Event())
    variable = gateway.start().server.bearer_token_env
    assert list(first.env) == list(second.env) == [variable]  # one name: fingerprints keep
    assert first.env[variable] != second.env[variable]
    assert first.env[variable] not in repr(first)
    assert _list_status(gateway, first.env[variable]) == 200
    first.dismiss()
    first.dismiss()  # idempotent
    assert _list_status(gateway, first.env[variable]) == 401
    assert _list_status(gateway, second.env[variable]) == 200


def test_a_call_sees_the_cancellation_of_the_run_whose_secret_it_carried() -> None:
    seen: list[tool.Cancellation] = []
    entered = threading.Event()

    def waits(value: object) -> str:
        seen.append(tool.cancelled())
        entered.set()
        return "stopped" if seen[-1].wait(30) else "waited out"

    quick = tool.define("quick", "d", lambda value: "quick")
    gw = _gateway.Gateway(tool.check_catalogue([tool.define("waits", "d", waits), quick]))
    try:
        mine, other = threading.Event(), threading.Event()
        token = admit(gw, mine)
        admit(gw, other)
        results: list[Any] = []

        async def run(session: ClientSession) -> Any:
            return await session.call_tool("waits", {})

        caller = threading.Thread(target=lambda: results.append(session_call(gw, run, token=token)))
        caller.start()
        assert entered.wait(30)
        other.set()
        assert not seen[0].is_set()  # another run's end is not this call's
        mine.set()
        caller.join(60)
        # Its run ended: the answer is not handed to whatever still holds the call.
        assert [(r.content[0].text, r.is_error) for r in results] == [
            ("the run this call was made for has ended; the tool's result was dropped", True)
        ]
        assert call(gw, "quick", {}).content[0].text == "quick"  # a run still going: answered
    finally:
        gw.close()


def test_a_call_arriving_after_its_run_ended_is_not_run() -> None:
    # Between a run's end (a cancel, say) and its teardown the secret was still good and the
    # handler ran: a deploy for a run the user had already cancelled.
    ran: list[object] = []
    gw = _gateway.Gateway(tool.check_catalogue([tool.define("deploy", "d", ran.append)]))
    try:
        ended = threading.Event()
        token = admit(gw, ended)
        ended.set()

        async def run(session: ClientSession) -> Any:
            return await session.call_tool("deploy", {})

        result = session_call(gw, run, token=token)
    finally:
        gw.close()
    assert (result.content[0].text, result.is_error) == (
        "this call was not run: the run it was made for has ended", True
    )
    assert ran == []


def test_other_paths_are_not_found(gateway: _gateway.Gateway) -> None:
    url = gateway.start().server.url.replace("/mcp", "/other")
    assert httpx2.get(url).status_code == 404


def test_concurrent_calls_do_not_block_each_other() -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow(value: Any) -> str:
        entered.set()
        release.wait(10)
        return "slow done"

    gw = _gateway.Gateway(
        tool.check_catalogue(
            [
                tool.define("slow", "waits", slow),
                tool.define("fast", "returns", lambda v: "fast done"),
            ]
        )
    )
    try:
        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(call(gw, "slow", {})))
        worker.start()
        assert entered.wait(10)
        assert call(gw, "fast", {}).content[0].text == "fast done"
        release.set()
        worker.join(10)
        assert results[0].content[0].text == "slow done"
    finally:
        release.set()
        gw.close()


def test_close_stops_the_server_and_start_is_refused_after() -> None:
    gw = _gateway.Gateway(tool.check_catalogue([tool.define("x", "d", lambda v: "x")]))
    port = int(gw.start().server.url.split(":")[-1].split("/")[0])
    gw.close(5)
    gw.close(5)  # idempotent
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass
    with pytest.raises(RuntimeError):
        gw.start()


def test_a_missing_sdk_is_an_invalid_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server.streamable_http_manager", None)
    # Named by what fetches it ('adaptor[mcp]' on the package index is another project).
    with pytest.raises(tool.InvalidDefinitionError, match=r"pip install 'mcp>=2,<3'") as caught:
        _gateway.require_sdk()
    assert isinstance(caught.value.__cause__, ImportError)


class Blocked:
    """A tool handler that waits for ``release``; counts the calls that have entered it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._entered = 0
        self._changed = threading.Condition()

    def handler(self, value: Any) -> str:
        with self._changed:
            self._entered += 1
            self._changed.notify_all()
        self.release.wait(60)
        return "released"

    @property
    def entered(self) -> int:
        with self._changed:
            return self._entered

    def wait_entered(self, count: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._entered >= count, 30)

    def gateway(self, **options: Any) -> _gateway.Gateway:
        return _gateway.Gateway(
            tool.check_catalogue(
                [
                    tool.define("blocked", "waits", self.handler),
                    tool.define("fast", "returns", lambda v: "fast done"),
                ]
            ),
            **options,
        )


def wait_handler_threads(gw: _gateway.Gateway, count: int) -> None:
    deadline = time.monotonic() + 30
    while gw._handler_threads != count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gw._handler_threads == count


def fast_call(gw: _gateway.Gateway) -> Any:
    async def run(session: ClientSession) -> Any:
        with anyio.fail_after(30):  # a guard against hanging forever, not a timing assertion
            return await session.call_tool("fast", {})

    return session_call(gw, run)


def test_more_stuck_handlers_than_anyios_default_limiter_do_not_starve_later_calls() -> None:
    # anyio's default limiter has 40 tokens for the whole event loop: 40 handlers that did not
    # return held them all and every later call of the Agent hung.
    blocked = Blocked()
    gw = blocked.gateway()
    stuck = 41
    results: list[Any] = []
    try:

        async def block_many(session: ClientSession) -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(stuck):
                    tg.start_soon(lambda: _append(results, session.call_tool("blocked", {})))

        caller = threading.Thread(target=session_call, args=(gw, block_many))
        caller.start()
        assert blocked.wait_entered(stuck)
        answered = fast_call(gw)
        assert answered.is_error is False and answered.content[0].text == "fast done"
        blocked.release.set()
        caller.join(60)
        assert [r.content[0].text for r in results] == ["released"] * stuck
        assert gw._handler_threads == 0
    finally:
        blocked.release.set()
        gw.close()


async def _append(results: list[Any], call: Any) -> None:
    results.append(await call)


def test_calls_the_client_cancelled_keep_running_without_holding_up_the_gateway() -> None:
    # The CLI gave up on its calls (its run was cancelled or timed out): the handlers cannot be
    # stopped and run on, but new calls are served and the threads still count until they end.
    blocked = Blocked()
    gw = blocked.gateway()
    abandoned = 41
    try:

        async def abandon_many(session: ClientSession) -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(abandoned):
                    tg.start_soon(session.call_tool, "blocked", {})
                with anyio.fail_after(30):
                    while blocked.entered < abandoned:
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()

        session_call(gw, abandon_many)
        answered = fast_call(gw)
        assert answered.is_error is False and answered.content[0].text == "fast done"
        assert gw._handler_threads == abandoned  # still running, still counted
        blocked.release.set()
        wait_handler_threads(gw, 0)
        assert fast_call(gw).content[0].text == "fast done"
    finally:
        blocked.release.set()
        gw.close()


def test_a_call_past_the_bound_of_running_handlers_is_an_error_result_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocked = Blocked()
    gw = blocked.gateway(max_handler_threads=2)
    results: list[Any] = []
    try:

        async def block_two(session: ClientSession) -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(lambda: _append(results, session.call_tool("blocked", {})))

        caller = threading.Thread(target=session_call, args=(gw, block_two))
        caller.start()
        assert blocked.wait_entered(2)
        refused = fast_call(gw)
        assert refused.is_error is True
        text = refused.content[0].text
        assert "too many tool calls still running" in text and "not run" in text
        assert "Bearer" not in text
        assert "'fast' not run: 2 handler threads are still running" in caplog.text
        blocked.release.set()
        caller.join(60)
        assert [r.content[0].text for r in results] == ["released"] * 2
        served = fast_call(gw)  # the bound counts running threads: a finished one frees its place
        assert served.is_error is False and served.content[0].text == "fast done"
    finally:
        blocked.release.set()
        gw.close()


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def test_close_answers_a_call_in_flight_and_logs_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # uvicorn waited out its graceful timeout for the call, then cancelled it and logged
    # "Exception in ASGI application" with a traceback: the daemon's journal got one every time
    # an Agent with a stuck tool call was closed.
    blocked = Blocked()
    gw = blocked.gateway()
    outcome: list[Any] = []

    def caller() -> None:
        try:
            outcome.append(call(gw, "blocked", {}))
        except BaseException as exc:  # the assertions below show what it was
            outcome.append(exc)

    worker = threading.Thread(target=caller)
    try:
        worker.start()
        assert blocked.wait_entered(1)
        gw.close()
        worker.join(30)
        assert _errors(caplog) == []
        result = outcome[0]
        assert not isinstance(result, BaseException), repr(result)
        assert result.is_error is True
        assert result.content[0].text == (
            "the host closed its tool server before this call finished; "
            "the tool may still be running, its result is lost"
        )
        assert gw._handler_threads == 1  # the handler cannot be stopped: it still counts
        blocked.release.set()  # its late answer goes nowhere, quietly
        wait_handler_threads(gw, 0)
        assert _errors(caplog) == []
    finally:
        blocked.release.set()
        gw.close()
        worker.join(30)


def _read_until(sock: socket.socket, marker: bytes | None) -> bytes:
    """What the server sent up to ``marker``, or until it closed the connection (``None``)."""
    data = b""
    while marker is None or marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_close_ends_a_request_still_sending_its_body_and_an_open_event_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = Blocked().gateway()
    server = gw.start().server
    port = int(server.url.split(":")[-1].split("/")[0])
    token = admit(gw)
    head = f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), 30) as sending,
        socket.create_connection(("127.0.0.1", port), 30) as streaming,
    ):
        # "100 Continue" comes once the server reads the body: the request is in flight.
        sending.sendall(
            f"POST /mcp HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
            "Accept: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        assert b" 100 " in _read_until(sending, b"\r\n\r\n")
        sending.sendall(b'{"jsonrpc": ')
        # A stateless server has nothing to send on this stream: it lasts until the client goes.
        streaming.sendall(f"GET /mcp HTTP/1.1\r\n{head}Accept: text/event-stream\r\n\r\n".encode())
        opened = _read_until(streaming, b"\r\n\r\n")
        assert opened.startswith(b"HTTP/1.1 200") and b"text/event-stream" in opened
        gw.close()
        refused, ended = _read_until(sending, None), _read_until(streaming, None)
    assert _errors(caplog) == []
    assert refused.startswith(b"HTTP/1.1 503")
    assert refused.endswith(b"the tool server is closed\r\n0\r\n\r\n")
    assert ended.endswith(b"0\r\n\r\n")  # the last chunk: the stream was ended, not cut

"""``adaptor.clients.a2a`` against a real a2a-sdk server on 127.0.0.1 (see ``a2a_server``)."""

from __future__ import annotations

import email.utils
import json
import subprocess
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("a2a.server", reason="needs the a2a extra: pip install -e '.[test,a2a]'")
pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[test]'")

from adaptor import errors
from adaptor.clients import a2a
from tests import a2a_server as srv

TOKEN = "s3cr3t-token-value"
TOKEN_ENV = "ADAPTOR_TEST_A2A_TOKEN"


@pytest.fixture(scope="module")
def executor() -> srv.ScriptedExecutor:
    return srv.ScriptedExecutor()


@pytest.fixture(scope="module")
def server(executor: srv.ScriptedExecutor) -> Iterator[srv.Running]:
    with srv.scripted_server(executor=executor) as running:
        yield running


@pytest.fixture
def client(server: srv.Running) -> Iterator[a2a.Client]:
    with a2a.Client(server.card_url) as c:
        yield c


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN_ENV


def _wire_text(err: BaseException) -> str:
    return json.dumps(
        err.to_wire() if isinstance(err, errors.AdaptorError) else errors.to_wire(err)
    )


# --- discovery ---------------------------------------------------------------------------------


def test_discovery_is_lazy_and_the_card_is_validated() -> None:
    log = srv.HeaderLog()
    with srv.scripted_server(header_log=log) as running, a2a.Client(running.card_url) as c:
        assert log.seen == []  # constructing a client talks to nobody
        card = c.agent_card()
        assert card.name == "scripted"
        assert card.streaming
        assert card.url == running.card_url
        assert [(i.url, i.binding) for i in card.interfaces] == [
            (running.base_url + "/", "JSONRPC")
        ]
        assert card.raw["name"] == "scripted"
        c.agent_card()
        assert [path for path, _ in log.seen] == [srv.CARD_PATH]  # fetched once


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda card: card.pop("name"), id="no-name"),
        pytest.param(lambda card: card.update(supportedInterfaces=[]), id="no-interface"),
        pytest.param(
            lambda card: card["supportedInterfaces"][0].update(url="/relative"), id="relative-url"
        ),
        pytest.param(
            lambda card: card["supportedInterfaces"][0].update(protocolBinding="CARRIER-PIGEON"),
            id="unknown-binding",
        ),
        pytest.param(lambda card: card.update(capabilities={"streaming": "yes"}), id="bad-type"),
    ],
)
def test_an_invalid_card_is_refused(server: srv.Running, mutate: Any) -> None:
    card = srv.card_json(srv.agent_card(server.base_url))
    mutate(card)
    with a2a.Client(card=card) as c, pytest.raises(a2a.InvalidAgentCardError):
        c.agent_card()


def test_a_card_url_serving_no_card_is_refused() -> None:
    routes = [_text_route("/not-a-card.json", "{not json")]
    with srv.scripted_server(extra_routes=routes) as running:
        with a2a.Client(running.base_url + "/not-a-card.json") as c:
            with pytest.raises(a2a.InvalidAgentCardError):
                c.agent_card()
        with a2a.Client(running.base_url + "/missing.json") as c:
            with pytest.raises(a2a.InvalidAgentCardError):
                c.agent_card()


def test_an_unreachable_agent_is_a_connection_error() -> None:
    port = _closed_port()
    with a2a.Client(f"http://127.0.0.1:{port}/.well-known/agent-card.json") as c:
        with pytest.raises(ConnectionError):
            c.agent_card()


def _slow_call(op: str) -> Callable[[a2a.Client], object]:
    calls: dict[str, Callable[[a2a.Client], object]] = {
        "agent_card": lambda c: c.agent_card(),
        "agent_card(timeout)": lambda c: c.agent_card(timeout=0.5),
        "send": lambda c: c.send("echo hi"),
        "send(timeout)": lambda c: c.send("echo hi", timeout=0.5),
        "get_task": lambda c: c.get_task("t-1"),
        "get_task(timeout)": lambda c: c.get_task("t-1", timeout=0.5),
        "cancel_task": lambda c: c.cancel_task("t-1"),
        "cancel_task(timeout)": lambda c: c.cancel_task("t-1", timeout=0.5),
    }
    return calls[op]


@pytest.mark.parametrize(
    "op",
    [
        "agent_card",
        "agent_card(timeout)",
        "send",
        "send(timeout)",
        "get_task",
        "get_task(timeout)",
        "cancel_task",
        "cancel_task(timeout)",
    ],
)
def test_a_remote_answering_a_byte_at_a_time_is_bounded_as_a_whole(op: str) -> None:
    # httpx's timeouts bound each read: a remote sending a byte a second held Client(timeout=2)
    # .agent_card() for a minute.  The call's bound covers the whole answer.
    trickle = srv.Trickle("/slow")
    per_call = op.endswith("(timeout)")
    with srv.scripted_server(extra_routes=[trickle.route()]) as running:
        if op.startswith("agent_card"):
            c = a2a.Client(running.base_url + "/slow", timeout=30 if per_call else 0.5)
        else:
            card = srv.card_json(
                srv.agent_card(running.base_url, interface_url=running.base_url + "/slow")
            )
            c = a2a.Client(card=card, timeout=30 if per_call else 0.5)
        with c, pytest.raises(TimeoutError, match="timed out"):
            _slow_call(op)(c)
        assert trickle.requests == 1
        assert trickle.gave_up_early(), trickle.sent


def test_an_endless_agent_card_is_refused_at_its_bound() -> None:
    # The SDK read a card whole into memory: a remote sending a 4 GiB one took 4 GiB.
    endless = srv.Trickle.endless("/card", b'{"name": "')
    with srv.scripted_server(extra_routes=[endless.route()]) as running:
        with (
            a2a.Client(running.base_url + "/card") as c,
            pytest.raises(a2a.ProtocolError) as caught,
        ):
            c.agent_card()
        assert endless.gave_up_early(), endless.sent
    assert caught.value.reason == f"the answer larger than {a2a.MAX_CARD_BYTES} bytes"


@pytest.mark.parametrize("op", ["send", "get_task", "send_stream"])
def test_an_endless_answer_or_event_is_refused_at_its_bound(
    op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One endless SSE line (or JSON body) was read whole before anything looked at it, whatever
    # a delegation's max_artifact_bytes.  The bound (32 MiB) is lowered to keep the test light.
    limit = 256 << 10
    monkeypatch.setattr(a2a, "MAX_RESPONSE_BYTES", limit, raising=False)
    if op == "send_stream":
        endless = srv.Trickle.endless("/rpc", srv.SSE_EVENT_HEAD, "text/event-stream")
    else:
        endless = srv.Trickle.endless("/rpc", b'{"jsonrpc": "2.0", "id": 1, "result": {"id": "')
    with srv.scripted_server(extra_routes=[endless.route()]) as running:
        card = srv.agent_card(running.base_url, interface_url=running.base_url + "/rpc")
        with (
            a2a.Client(card=srv.card_json(card)) as c,
            pytest.raises(a2a.ProtocolError) as caught,
        ):
            if op == "send":
                c.send("hi")
            elif op == "get_task":
                c.get_task("t-1")
            else:
                list(c.send_stream("hi"))
        assert endless.gave_up_early(), endless.sent
    what = "an event" if op == "send_stream" else "the answer"
    assert caught.value.reason == f"{what} larger than {limit} bytes"


def test_the_event_bound_is_per_event(client: a2a.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long stream of small events is no endless answer.
    monkeypatch.setattr(a2a, "MAX_RESPONSE_BYTES", 4096, raising=False)
    with client.send_stream("tokens 2000") as stream:
        events = list(stream)
    assert isinstance(events[-1], a2a.TerminalEvent)
    assert sum(isinstance(e, a2a.ArtifactEvent) for e in events) == 2000


# --- operations --------------------------------------------------------------------------------


def test_send_returns_the_final_task(client: a2a.Client) -> None:
    task = client.send("echo hello")
    assert task.state is a2a.TaskState.COMPLETED
    assert task.text == "echo: hello"
    assert [a.artifact_id for a in task.artifacts] == [f"{task.id}-out"]
    assert task.status_message is not None and task.status_message.text == "done"
    again = client.send("echo more", context_id=task.context_id)
    assert again.context_id == task.context_id and again.id != task.id


def test_a_bare_message_reply_becomes_a_completed_task(client: a2a.Client) -> None:
    task = client.send("message hi")
    assert task.state is a2a.TaskState.COMPLETED
    assert task.text == "message: hi"


def test_send_stream_yields_task_status_artifacts_and_one_terminal(client: a2a.Client) -> None:
    with client.send_stream("echo world") as stream:
        events = list(stream)
        assert stream.ended
    assert [e.kind for e in events] == ["task", "status", "artifact", "artifact", "terminal"]
    task_event, status, first, second, terminal = events
    assert isinstance(task_event, a2a.TaskEvent) and isinstance(status, a2a.StatusEvent)
    assert status.state is a2a.TaskState.WORKING
    assert isinstance(first, a2a.ArtifactEvent) and isinstance(second, a2a.ArtifactEvent)
    assert not first.append and second.append and second.last_chunk
    assert first.artifact.text + second.artifact.text == "echo: world"
    assert isinstance(terminal, a2a.TerminalEvent)
    assert terminal.state is a2a.TaskState.COMPLETED and not terminal.recovered
    assert stream.task_id == task_event.task.id == terminal.task_id


def test_a_task_streamed_whole_and_final_ends_the_stream(client: a2a.Client) -> None:
    # An agent answering in one piece: the stream holds the final task, then the server closes
    # it.  That close is the end, not a drop to recover from with a fetch.
    events = list(client.send_stream("whole the answer"))
    assert [e.kind for e in events] == ["task", "terminal"]
    task_event, terminal = events
    assert isinstance(task_event, a2a.TaskEvent) and isinstance(terminal, a2a.TerminalEvent)
    assert terminal.state is a2a.TaskState.COMPLETED and not terminal.recovered
    assert terminal.task is task_event.task and terminal.task.text == "the answer"


def test_a_stream_stops_at_input_required(client: a2a.Client) -> None:
    events = list(client.send_stream("input"))
    terminal = events[-1]
    assert isinstance(terminal, a2a.TerminalEvent)
    assert terminal.state is a2a.TaskState.INPUT_REQUIRED and terminal.state.interrupted
    assert terminal.message is not None and terminal.message.text == "which branch?"


def test_next_event_waits_with_a_bound(client: a2a.Client) -> None:
    with client.send_stream("hang") as stream:
        assert isinstance(stream.next_event(), a2a.TaskEvent)
        assert isinstance(stream.next_event(), a2a.StatusEvent)
        assert stream.next_event(timeout=0.05) is None
        assert not stream.ended
        task_id = stream.task_id
    assert stream.ended and stream.next_event() is None
    assert client.cancel_task(task_id).state is a2a.TaskState.CANCELED


def test_get_cancel_and_subscribe(client: a2a.Client, executor: srv.ScriptedExecutor) -> None:
    started = client.send("hang", return_immediately=True)
    assert not started.state.final
    assert client.get_task(started.id).id == started.id
    with client.subscribe(started.id) as subscription:
        first = subscription.next_event()
        assert isinstance(first, a2a.TaskEvent) and first.task.id == started.id
        cancelled = client.cancel_task(started.id)
        assert cancelled.state is a2a.TaskState.CANCELED
        # The SDK may close the subscription before the CANCELED write reaches it; then the
        # client's one-fetch recovery supplies the terminal.
        last = list(subscription)[-1]
    assert isinstance(last, a2a.TerminalEvent) and last.state is a2a.TaskState.CANCELED
    assert executor.wait_cancelled(started.id)
    # Cancelling a terminal task is idempotent.
    assert client.cancel_task(started.id).state is a2a.TaskState.CANCELED
    assert client.get_task(started.id).state is a2a.TaskState.CANCELED


def test_an_unknown_task_is_not_found(client: a2a.Client) -> None:
    with pytest.raises(a2a.NotFoundError):
        client.get_task("no-such-task")
    with pytest.raises(a2a.NotFoundError):
        client.cancel_task("no-such-task")


def test_the_http_json_binding(server: srv.Running, executor: srv.ScriptedExecutor) -> None:
    card = srv.card_json(
        srv.agent_card(server.base_url, rpc_path=srv.REST_PREFIX, binding="HTTP+JSON")
    )
    with a2a.Client(card=card) as c:
        assert [i.binding for i in c.agent_card().interfaces] == ["HTTP+JSON"]
        assert c.send("echo rest").text == "echo: rest"
        events = list(c.send_stream("echo rest stream"))
        assert isinstance(events[-1], a2a.TerminalEvent)
        assert events[-1].state is a2a.TaskState.COMPLETED
        with pytest.raises(a2a.NotFoundError):
            c.get_task("no-such-task")
        started = c.send("hang", return_immediately=True)
        assert c.cancel_task(started.id).state is a2a.TaskState.CANCELED
        assert executor.wait_cancelled(started.id)


def test_streaming_is_unsupported_when_the_card_says_so() -> None:
    with srv.scripted_server(streaming=False) as running, a2a.Client(running.card_url) as c:
        with pytest.raises(a2a.UnsupportedError):
            c.send_stream("echo x")
        with pytest.raises(a2a.UnsupportedError):
            c.subscribe("any")
        assert c.send("echo x").text == "echo: x"


def test_subscribing_to_a_finished_task_is_unsupported(client: a2a.Client) -> None:
    task = client.send("echo done")
    with pytest.raises(a2a.UnsupportedError):
        list(client.subscribe(task.id))


# A caller's wrong argument used to surface as the remote's fault (get_task(123): "malformed
# response"), as "bad argument type for built-in operation", or as a TimeoutError (timeout=-1).
@pytest.mark.parametrize(
    ("call", "error", "names"),
    [
        (lambda c: c.get_task(123), TypeError, "task id must be a str"),
        (lambda c: c.cancel_task(123), TypeError, "task id must be a str"),
        (lambda c: c.subscribe(123), TypeError, "task id must be a str"),
        (lambda c: c.send("echo x", 5), TypeError, "context_id must be a str"),
        (lambda c: c.send("echo x", task_id=5), TypeError, "task_id must be a str"),
        (lambda c: c.send_stream("echo x", 5), TypeError, "context_id must be a str"),
        (lambda c: c.send(None), TypeError, "text must be a str"),
        (lambda c: c.get_task("t", timeout=-1), ValueError, "timeout must be positive"),
        (lambda c: c.cancel_task("t", timeout="1"), TypeError, "timeout must be a number"),
        (lambda c: c.send_stream("echo x").next_event("1"), TypeError, "timeout must be a number"),
        (lambda c: c.send_stream("echo x").next_event(float("nan")), ValueError, "timeout"),
    ],
    ids=[
        "get-id", "cancel-id", "subscribe-id", "context", "task", "stream-context", "text",
        "negative-timeout", "string-timeout", "next-event-string", "next-event-nan",
    ],
)
def test_a_wrong_argument_is_named_and_sends_nothing(
    call: Any, error: type[Exception], names: str
) -> None:
    log = srv.HeaderLog()
    with srv.scripted_server(header_log=log) as running, a2a.Client(running.card_url) as c:
        c.agent_card()
        with pytest.raises(error, match=names):
            call(c)
        assert [path for path, _ in log.seen] == [srv.CARD_PATH]


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"agent_card_url": 123}, TypeError, "agent_card_url must be a str"),
        ({"trusted_origins": "http://127.0.0.1:1"}, TypeError, "trusted_origins must be a list"),
        ({"trusted_origins": [1]}, TypeError, "trusted_origins must be a list"),
        ({"timeout": True}, TypeError, "timeout must be a number"),
        ({"timeout": "5"}, TypeError, "timeout must be a number"),
    ],
    ids=["url", "origins-string", "origins-number", "timeout-bool", "timeout-string"],
)
def test_a_wrong_client_option_is_named(
    kwargs: dict[str, Any], error: type[Exception], names: str
) -> None:
    options = {"agent_card_url": "http://127.0.0.1:1/.well-known/agent-card.json", **kwargs}
    with pytest.raises(error, match=names):
        a2a.Client(**options)


def test_close_is_idempotent_and_final(server: srv.Running) -> None:
    c = a2a.Client(server.card_url)
    stream = c.send_stream("hang")
    assert isinstance(stream.next_event(), a2a.TaskEvent)
    c.close()
    c.close()
    assert stream.ended
    with pytest.raises(RuntimeError):
        c.send("echo x")


# --- credentials -------------------------------------------------------------------------------


def test_a_bearer_token_is_read_at_request_time(monkeypatch: pytest.MonkeyPatch) -> None:
    log = srv.HeaderLog()
    with srv.scripted_server(bearer_token=TOKEN, header_log=log) as running:
        c = a2a.Client(running.card_url, auth=a2a.BearerTokenFromEnv(TOKEN_ENV))
        with c:
            monkeypatch.delenv(TOKEN_ENV, raising=False)
            with pytest.raises(a2a.UnauthorizedError) as missing:
                c.send("echo x")
            monkeypatch.setenv(TOKEN_ENV, TOKEN)
            assert c.send("echo x").text == "echo: x"
            assert f"Bearer {TOKEN}" in log.authorizations("/")
            for text in (repr(c), repr(c._auth), str(missing.value), _wire_text(missing.value)):
                assert TOKEN not in text


def test_a_refused_token_is_unauthorized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "wrong-token-value")
    with srv.scripted_server(bearer_token=TOKEN) as running:
        with a2a.Client(running.card_url) as anonymous, pytest.raises(a2a.UnauthorizedError):
            anonymous.send("echo x")
        auth = a2a.BearerTokenFromEnv(TOKEN_ENV)
        with a2a.Client(running.card_url, auth=auth) as c:
            with pytest.raises(a2a.UnauthorizedError) as refused:
                c.send("echo x")
            with pytest.raises(a2a.UnauthorizedError):
                list(c.send_stream("echo x"))
    assert "wrong-token-value" not in _wire_text(refused.value)


def test_a_card_pointing_credentials_elsewhere_is_untrusted(token_env: str) -> None:
    elsewhere_log = srv.HeaderLog()
    with srv.scripted_server(header_log=elsewhere_log) as elsewhere:
        with srv.scripted_server(card_interface_url=elsewhere.base_url + "/") as running:
            auth = a2a.BearerTokenFromEnv(token_env)
            with a2a.Client(running.card_url, auth=auth) as c:
                with pytest.raises(a2a.UntrustedOriginError):
                    c.agent_card()
                with pytest.raises(a2a.UntrustedOriginError):
                    c.send("echo x")
            assert elsewhere_log.seen == []
            # Without credentials there is nothing to leak; an explicit trust also allows it.
            with a2a.Client(running.card_url) as c:
                assert c.send("echo x").text == "echo: x"
            trusted = [elsewhere.base_url]
            with a2a.Client(running.card_url, auth=auth, trusted_origins=trusted) as c:
                assert c.send("echo y").text == "echo: y"
            assert elsewhere_log.authorizations("/") == [None, f"Bearer {TOKEN}"]


def test_redirects_to_another_origin_drop_the_authorization_header(token_env: str) -> None:
    other_log, home_log = srv.HeaderLog(), srv.HeaderLog()
    with srv.scripted_server(header_log=other_log) as other:

        def make(base_url: str) -> Any:
            card = srv.agent_card(base_url, rpc_path="/hop")
            routes = [srv.redirect_route("/hop", other.base_url + "/")]
            return srv.build_app(
                srv.ScriptedExecutor(), card, extra_routes=routes, header_log=home_log
            )

        with srv.serve(make) as home:
            with a2a.Client(home.card_url, auth=a2a.BearerTokenFromEnv(token_env)) as c:
                assert c.send("echo via redirect").text == "echo: via redirect"
                events = list(c.send_stream("echo streamed"))
    assert isinstance(events[-1], a2a.TerminalEvent)
    assert home_log.authorizations("/hop") == [f"Bearer {TOKEN}"] * 2
    assert other_log.authorizations("/") == [None, None]


def test_same_origin_redirects_keep_the_authorization_header(token_env: str) -> None:
    log = srv.HeaderLog()

    def make(base_url: str) -> Any:
        card = srv.agent_card(base_url, rpc_path="/hop")
        routes = [srv.redirect_route("/hop", base_url + "/")]
        return srv.build_app(
            srv.ScriptedExecutor(), card, bearer_token=TOKEN, extra_routes=routes, header_log=log
        )

    with srv.serve(make) as home:
        with a2a.Client(home.card_url, auth=a2a.BearerTokenFromEnv(token_env)) as c:
            assert c.send("echo kept").text == "echo: kept"
    assert log.authorizations("/") == [f"Bearer {TOKEN}"]


def test_a_missing_token_is_unauthorized_and_not_its_own_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The auth's own UnauthorizedError was re-raised "from" itself: a cause chain that loops.
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    log = srv.HeaderLog()
    with srv.scripted_server(bearer_token=TOKEN, header_log=log) as running:
        auth = a2a.BearerTokenFromEnv(TOKEN_ENV)
        caught: list[a2a.UnauthorizedError] = []
        with a2a.Client(running.card_url, auth=auth) as c:
            for call in (c.agent_card, lambda: c.get_task("t"), lambda: c.cancel_task("t")):
                with pytest.raises(a2a.UnauthorizedError) as missing:
                    call()
                caught.append(missing.value)
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        with a2a.Client(running.card_url, auth=auth) as c:
            c.agent_card()
            monkeypatch.delenv(TOKEN_ENV)
            with pytest.raises(a2a.UnauthorizedError) as missing:
                list(c.send_stream("echo x"))
            caught.append(missing.value)
    assert log.authorizations("/") == []  # nothing was sent without the token
    for err in caught:
        assert err.__cause__ is None and err.cause is None
        assert TOKEN_ENV in str(err)
        assert err.to_wire()["cause"] is None


@pytest.mark.parametrize("token", ["tök-secret-123456", "tok-secret\r\nX-Injected: 1"], ids=["non-ascii", "line-break"])
def test_a_token_no_header_can_carry_is_our_unauthorized_not_the_remotes_fault(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    # HTTP's encoding failed deep in the request: "malformed response" blamed the remote, and
    # the encoding error behind it kept the token.
    monkeypatch.setenv(TOKEN_ENV, token)
    log = srv.HeaderLog()
    with srv.scripted_server(bearer_token=TOKEN, header_log=log) as running:
        with a2a.Client(running.card_url, auth=a2a.BearerTokenFromEnv(TOKEN_ENV)) as c:
            with pytest.raises(a2a.UnauthorizedError) as caught:
                c.send("echo x")
    assert log.authorizations("/") == []  # nothing was sent
    err = caught.value
    assert TOKEN_ENV in str(err) and "nothing was sent" in str(err)
    assert err.__cause__ is None and "secret" not in _wire_text(err)


# --- server failures and remote errors ---------------------------------------------------------


@pytest.mark.parametrize("status", [404, 429, 503])
def test_a_key_in_a_url_stays_out_of_the_errors_traceback(status: int) -> None:
    # httpx names the URL a request failed on and the a2a-sdk repeats it: the wire form hid
    # the key, but the chained exceptions kept it for every traceback and log line.
    route = srv.status_route("/failing", status, body="<html><h1>Oops</h1></html>")
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/failing?api_key=K3Y-rpc"))
        caught: list[BaseException] = []
        with a2a.Client(card=card) as c:
            for call in (lambda: c.send("echo x"), lambda: list(c.send_stream("echo x"))):
                with pytest.raises(Exception) as raised:
                    call()
                caught.append(raised.value)
        with a2a.Client(running.base_url + "/nowhere?api_key=K3Y-card") as c:
            with pytest.raises(Exception) as raised:
                c.agent_card()
            caught.append(raised.value)
    for err in caught:
        shown = "".join(traceback.format_exception(err)) + _wire_text(err)
        assert "K3Y" not in shown and "api_key=<redacted>" in shown, shown


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 507])
@pytest.mark.parametrize("op", ["send", "send_stream", "subscribe"])
def test_a_server_failure_is_a_connection_error_naming_the_status(status: int, op: str) -> None:
    # A 500 was a ProtocolError ("unexpected HTTP status"), which delegation reports as a
    # malformed response that is not worth retrying, while 502-504 were a ConnectionError.  A
    # subscribe refused so (a 429 with its Retry-After) was a StreamRecoveryError, as if a
    # stream that never started had dropped.
    route = srv.status_route("/failing", status, headers={"Retry-After": "7"})
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/failing"))
        with a2a.Client(card=card) as c, pytest.raises(ConnectionError) as caught:
            if op == "send":
                c.send("echo x")
            elif op == "send_stream":
                list(c.send_stream("echo x"))
            else:
                list(c.subscribe("task-1"))
    assert type(caught.value) is ConnectionError  # not a StreamRecoveryError
    assert f"HTTP {status}" in str(caught.value) and getattr(caught.value, "retry_after", None) == 7.0


def _http_date_in(seconds: float) -> str:
    return email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        ("30", 30, 30),
        # An HTTP date two minutes ahead, one a minute ago (the wait counts from now).
        (lambda: _http_date_in(120), 100, 120),
        (lambda: _http_date_in(-60), 0, 0),
        ("99999999", 86400, 86400),  # no more than a day on the server's word
        ("soon", None, None),
        ("-5", None, None),
    ],
    ids=["seconds", "date-ahead", "date-past", "too-long", "not-a-time", "negative"],
)
def test_a_throttled_or_failing_server_s_retry_after_is_carried(
    header: str | Callable[[], str], low: float | None, high: float | None
) -> None:
    # A 429 or 503 saying when to come back was reported as any other: a caller retrying at
    # once only hammered the server that asked it to wait.
    if callable(header):
        header = header()  # a date made when the test runs, not when it is collected
    route = srv.status_route("/throttled", 429, headers={"Retry-After": header})
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/throttled"))
        with a2a.Client(card=card) as c, pytest.raises(ConnectionError) as caught:
            c.send("echo x")
    err = caught.value
    assert "HTTP 429" in str(err)
    if low is None or high is None:
        assert not hasattr(err, "retry_after") and "retry after" not in str(err)
    else:
        retry_after = err.retry_after  # type: ignore[attr-defined]
        assert isinstance(retry_after, float) and low <= retry_after <= high
        assert f"retry after {retry_after:g} s" in str(err)


@pytest.mark.parametrize("status", [429, 503])
def test_a_throttled_card_fetch_says_its_status_and_retry_after(status: int) -> None:
    # The card fetch (every delegation's first call) said only "the agent card is unavailable":
    # no status, no retry_after, so a rate limiter in front of the remote always lost its hint.
    route = srv.status_route("/card.json", status, headers={"Retry-After": "7"}, methods=["GET"])
    with srv.scripted_server(extra_routes=[route]) as running:
        with a2a.Client(running.base_url + "/card.json") as c, pytest.raises(ConnectionError) as caught:
            c.send("echo x")
    err = caught.value
    assert f"HTTP {status}" in str(err) and "agent_card" in str(err)
    assert err.retry_after == 7.0  # type: ignore[attr-defined]


def test_http_501_is_unsupported() -> None:
    route = srv.status_route("/unimplemented", 501)
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/unimplemented"))
        with a2a.Client(card=card) as c, pytest.raises(a2a.UnsupportedError, match="HTTP 501"):
            c.send("echo x")


def _protocol_error_for(error: dict[str, Any], token_env: str, op: str) -> a2a.ProtocolError:
    """What ``op`` raises when the remote answers the JSON-RPC ``error`` (as a body or an SSE
    event), called with the bearer token in ``token_env``."""
    body = {"jsonrpc": "2.0", "id": "1", "error": error}
    routes = [srv.raw_json_route("/err", body), srv.raw_sse_route("/err-sse", [json.dumps(body)])]
    with srv.scripted_server(extra_routes=routes) as running:
        path = "/err" if op == "send" else "/err-sse"
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path=path))
        auth = a2a.BearerTokenFromEnv(token_env)
        with a2a.Client(card=card, auth=auth, trusted_origins=[running.base_url]) as c:
            with pytest.raises(a2a.ProtocolError) as caught:
                if op == "send":
                    c.send("echo x")
                else:
                    list(c.send_stream("echo x"))
    return caught.value


@pytest.mark.parametrize("op", ["send", "send_stream"])
def test_a_server_defined_json_rpc_error_is_the_remotes_answer(token_env: str, op: str) -> None:
    # A valid error answer whose code the a2a-sdk has no class for was "malformed response".
    err = _protocol_error_for({"code": -32050, "message": f"queue full ({TOKEN})"}, token_env, op)
    assert (err.op, err.reason) == (op, "remote error -32050")
    assert err.raw == "queue full (<redacted>)"
    assert TOKEN not in _wire_text(err)


@pytest.mark.parametrize(
    "error",
    [{"code": "busy", "message": "not a number"}, {"code": None, "message": "no code"}],
    ids=["string-code", "null-code"],
)
def test_a_json_rpc_error_without_an_integer_code_is_malformed(error: dict[str, Any]) -> None:
    route = srv.raw_json_route("/err", {"jsonrpc": "2.0", "id": "1", "error": error})
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/err"))
        with a2a.Client(card=card) as c, pytest.raises(a2a.ProtocolError) as caught:
            c.send("echo x")
    assert caught.value.reason == "malformed response"


# --- malformed traffic -------------------------------------------------------------------------

_BAD_FRAMES = {
    "bad-state": {"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_BOGUS"}}},
    "empty-part": {
        "artifactUpdate": {
            "taskId": "t1",
            "artifact": {"artifactId": "a1", "parts": [{"metadata": {"echo": f"Bearer {TOKEN}"}}]},
        }
    },
    "no-payload": {},
}


@pytest.mark.parametrize("frame", [*_BAD_FRAMES, "not-json"])
def test_a_malformed_event_is_a_protocol_error(token_env: str, frame: str) -> None:
    data = (
        "{not json " + TOKEN
        if frame == "not-json"
        else json.dumps({"jsonrpc": "2.0", "id": "1", "result": _BAD_FRAMES[frame]})
    )
    route = srv.raw_sse_route("/bad", [data])
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/bad"))
        auth = a2a.BearerTokenFromEnv(token_env)
        with a2a.Client(card=card, auth=auth, trusted_origins=[running.base_url]) as c:
            with pytest.raises(a2a.ProtocolError) as caught:
                list(c.send_stream("echo x"))
    err = caught.value
    assert err.op == "send_stream"
    assert err.reason
    assert TOKEN not in (err.raw or "") and TOKEN not in _wire_text(err)
    if frame == "empty-part":
        assert err.raw is not None and "<redacted>" in err.raw
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, a2a.ProtocolError) and rebuilt.raw == err.raw


@pytest.mark.parametrize("op", ["send", "send_stream", "get_task", "cancel_task"])
def test_a_number_json_has_no_value_for_in_metadata_is_a_protocol_error(op: str) -> None:
    # Python's json and the a2a-sdk take Infinity and NaN; the conversion of the task then
    # raised a bare ValueError from send_stream, get_task and cancel_task (send alone said
    # ProtocolError), and a delegation passed it on as it was.
    task = {"id": "t-inf", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"},
            "metadata": {"n": float("inf"), "m": float("nan")}}
    result: dict[str, Any] = {"task": task} if op.startswith("send") else task
    body = {"jsonrpc": "2.0", "id": "1", "result": result}
    routes = [srv.raw_json_route("/inf", body), srv.raw_sse_route("/inf-sse", [json.dumps(body)])]
    with srv.scripted_server(extra_routes=routes) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/inf-sse" if op == "send_stream" else "/inf"))
        with a2a.Client(card=card) as c, pytest.raises(a2a.ProtocolError) as caught:
            if op == "send":
                c.send("echo x")
            elif op == "send_stream":
                list(c.send_stream("echo x"))
            else:
                getattr(c, op)("t-inf")
    assert (caught.value.op, caught.value.reason) == (op, "malformed response")


def test_json_nested_past_the_parsers_depth_is_the_remotes_fault() -> None:
    # A card, an answer or an event nested 100,000 levels deep raised a bare RecursionError
    # from agent_card, send and send_stream (and a delegation passed it on as it was).
    from starlette.responses import Response
    from starlette.routing import Route

    deep = '{"a":' * 100_000 + "1" + "}" * 100_000

    async def deep_card(_: Any) -> Response:
        return Response('{"name": "x", "metadata": ' + deep + "}", media_type="application/json")

    def task(state: str) -> str:
        status = '{"state": "' + state + '"}'
        return '{"jsonrpc": "2.0", "id": "1", "result": {"task": {"id": "t", "contextId": "c", "status": ' \
            + status + ', "metadata": ' + deep + "}}}"

    async def deep_answer(_: Any) -> Response:
        return Response(task("TASK_STATE_COMPLETED"), media_type="application/json")

    routes = [Route("/deep-card", deep_card, methods=["GET"]), Route("/deep", deep_answer, methods=["POST"]),
              srv.raw_sse_route("/deep-sse", [task("TASK_STATE_WORKING")])]
    with srv.scripted_server(extra_routes=routes) as running:
        with a2a.Client(running.base_url + "/deep-card") as c, pytest.raises(a2a.InvalidAgentCardError) as refused:
            c.agent_card()
        assert str(refused.value) == "the agent card is nested too deeply to read"
        for path, op in (("/deep", "send"), ("/deep-sse", "send_stream")):
            card = srv.card_json(srv.agent_card(running.base_url, rpc_path=path))
            with a2a.Client(card=card) as c, pytest.raises(a2a.ProtocolError) as caught:
                list(c.send_stream("x")) if op == "send_stream" else c.send("x")
            kind = "event" if op == "send_stream" else "response"
            assert (caught.value.op, caught.value.reason) == (op, f"malformed {kind}: nested too deeply to read")


def test_an_answer_for_another_task_is_never_the_asked_ones() -> None:
    # GetTask("t1") answered with a finished task "someone-else": get_task returned it as t1's,
    # and a dropped stream of t1 "recovered" with it, ending as if t1 had (a delegation gave
    # the other task's text as its answer, and left t1 running).
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def task(task_id: str, state: str) -> dict[str, Any]:
        return {"id": task_id, "contextId": "c", "status": {"state": state}}

    async def endpoint(request: Request) -> Response:
        call = await request.json()
        if call["method"] == "SendStreamingMessage":  # t1 is working, then the stream drops
            frame = json.dumps({"jsonrpc": "2.0", "id": call["id"], "result": {"task": task("t1", "TASK_STATE_WORKING")}})
            return Response(f"data: {frame}\n\n", media_type="text/event-stream")
        return JSONResponse({"jsonrpc": "2.0", "id": call["id"], "result": task("someone-else", "TASK_STATE_COMPLETED")})

    with srv.scripted_server(extra_routes=[Route("/mixed-up", endpoint, methods=["POST"])]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/mixed-up"))
        with a2a.Client(card=card) as c:
            for call in (c.get_task, c.cancel_task):
                with pytest.raises(a2a.ProtocolError) as caught:
                    call("t1")
                assert caught.value.reason == "answer for another task ('someone-else', not 't1')"
            with pytest.raises(a2a.StreamRecoveryError) as lost:
                list(c.send_stream("x"))
            assert lost.value.task_id == "t1"


def test_an_event_of_another_task_is_a_protocol_error_not_the_streams_end() -> None:
    # The stream named task t1, then sent a final status for another task: that ended the
    # stream as if t1 had completed (a delegation reported success for the other task and
    # left its own running).
    data = srv.another_tasks_end_frames()
    with srv.scripted_server(extra_routes=[srv.raw_sse_route("/other", data)]) as running:
        card = srv.card_json(srv.agent_card(running.base_url, rpc_path="/other"))
        with a2a.Client(card=card) as c:
            seen: list[a2a.StreamEvent] = []
            with pytest.raises(a2a.ProtocolError) as caught:
                for event in c.send_stream("echo x"):
                    seen.append(event)
    assert [type(e).__name__ for e in seen] == ["TaskEvent"]
    assert caught.value.op == "send_stream" and "another task" in caught.value.reason


@pytest.mark.parametrize("code", [-32603, -32000], ids=["internal-error", "unknown-code"])
@pytest.mark.parametrize("op", ["send", "send_stream"])
def test_a_remote_error_echoing_the_token_does_not_carry_it(
    token_env: str, code: int, op: str
) -> None:
    # The remote answers with an error whose text holds the bare token: ProtocolError.raw was
    # redacted, but the SDK exception behind it (its cause) kept the token for the wire form,
    # tracebacks and logs.
    err = _protocol_error_for(
        {"code": code, "message": f"denied {TOKEN}", "data": _error_info({"seen": TOKEN})},
        token_env,
        op,
    )
    assert err.__cause__ is not None
    shown = [_wire_text(err), "".join(traceback.format_exception(err))]
    node: BaseException | None = err
    while node is not None:
        shown += [str(node), repr(node)]
        node = node.__cause__
    assert all(TOKEN not in text for text in shown), shown


# Credential-looking text in what a remote answers, and what ``raw`` shows of it: the same as
# ``errors.to_wire`` shows of a foreign exception's message (one list of patterns for both).
CREDENTIAL_TEXTS = {
    "url-userinfo": (
        "fetch https://alice:hunter2pw@proxy.example/x failed",
        "fetch https://<redacted>@proxy.example/x failed",
    ),
    "sk-key": ("key sk-live-0123456789abc rejected", "key sk-<redacted> rejected"),
    "quoted-header": (
        "headers {'Proxy-Authorization': 'Basic YWxhZGRpbjpvcGVu'}",
        "headers {'Proxy-Authorization': '<redacted>'}",
    ),
    "json-header": ('{"authorization": "Token abc123def"}', '{"authorization": "<redacted>"}'),
    "auth-token": ("auth_token=abcdef123456; retry", "auth_token=<redacted>; retry"),
    "other-scheme": ("Authorization: SSWS 00abcDEFghi123", "Authorization: <redacted>"),
    "bearer": ("sent Bearer tok-AAAA1234 to it", "sent Bearer <redacted> to it"),
    "basic": ("sent basic YWxhZGRpbjpvcGVu to it", "sent basic <redacted> to it"),
    # ... but "basic" is a word too: a message about it keeps its words.
    "basic-word": ("Basic authentication required", "Basic authentication required"),
    "basic-capital": ("basic Authentication failed", "basic Authentication failed"),
}


@pytest.mark.parametrize("case", list(CREDENTIAL_TEXTS))
def test_credentials_in_a_remote_answer_are_redacted_as_in_any_foreign_error(
    token_env: str, case: str
) -> None:
    # The client kept its own list of patterns beside the error codec's: each missed some of
    # what the other caught (a URL's password and quoted headers on the wire, sk- keys and
    # auth_token= in raw).
    text, expected = CREDENTIAL_TEXTS[case]
    err = _protocol_error_for({"code": -32050, "message": text}, token_env, "send")
    assert err.raw == expected
    assert errors.to_wire(RuntimeError(text))["message"] == expected


def _error_info(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON-RPC error's ``data`` as the a2a-sdk reads it into its exception's ``data``."""
    return [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "metadata": metadata}]


@pytest.fixture
def short_token_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, "k3y5x")
    return TOKEN_ENV


def _shown(err: BaseException) -> list[str]:
    shown = [_wire_text(err), "".join(traceback.format_exception(err))]
    node: BaseException | None = err
    while node is not None:
        shown += [str(node), repr(node), repr(getattr(node, "data", None))]
        node = node.__cause__
    return shown


@pytest.mark.parametrize("op", ["send", "send_stream"])
def test_a_token_shorter_than_the_secret_minimum_is_still_redacted(
    short_token_env: str, op: str
) -> None:
    # The daemon leaves values under 6 characters alone (they may be configuration), but an
    # auth header's value is a credential whatever its length.
    err = _protocol_error_for(
        {"code": -32603, "message": "denied k3y5x", "data": _error_info({"seen": "k3y5x"})}, short_token_env, op
    )
    assert err.raw is not None and "<redacted>" in err.raw
    assert all("k3y5x" not in text for text in _shown(err)), _shown(err)


def test_remote_error_data_holding_the_token_where_it_cannot_be_redacted_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A number is not text to replace a secret in; repr() of the SDK error would show it.
    monkeypatch.setenv(TOKEN_ENV, "987654321")
    err = _protocol_error_for(
        {"code": -32603, "message": "denied", "data": _error_info({"retry_after": 987654321})}, TOKEN_ENV, "send"
    )
    assert err.__cause__ is not None and getattr(err.__cause__, "data", "absent") is None
    assert all("987654321" not in text for text in _shown(err)), _shown(err)


def test_remote_error_data_keeps_what_is_not_the_token(token_env: str) -> None:
    # The SDK error's data was dropped whole when it held the token; it is redacted like
    # everything else now, so what the remote said beside it stays for diagnosis.
    err = _protocol_error_for(
        {"code": -32603, "message": "denied", "data": _error_info({"seen": TOKEN, "queue": "full"})},
        token_env,
        "send",
    )
    assert err.__cause__ is not None
    assert getattr(err.__cause__, "data", None) == {"seen": "<redacted>", "queue": "full"}
    assert all(TOKEN not in text for text in _shown(err)), _shown(err)


def test_the_token_is_redacted_in_json_text_a_remote_escaped_it_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A remote quoting a request it received as JSON text writes "/" as "\/" (PHP) or
    # non-ASCII as \u escapes: raw and the chain looked for the token as given only.
    token = "tok/en+value=="
    monkeypatch.setenv(TOKEN_ENV, token)
    escaped = token.replace("/", "\\/")
    err = _protocol_error_for(
        {"code": -32050, "message": f'rejected {{"auth": "{escaped}"}}'}, TOKEN_ENV, "send"
    )
    assert err.raw == 'rejected {"auth": "<redacted>"}'
    assert all(escaped not in text for text in _shown(err)), _shown(err)


# --- closing --------------------------------------------------------------------------------------


def test_closing_closes_the_async_generators_still_open_on_the_loop() -> None:
    # The SDK's and httpx's streams are async generators: one left open when the loop stopped
    # was finalized later as a task on a stopped loop ("Task was destroyed but it is pending!
    # ... async_generator_athrow" at exit, intermittently), its cleanup never run.
    from adaptor.clients.a2a import _LoopThread

    cleaned = threading.Event()

    async def stream() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            cleaned.set()

    async def first(events: AsyncIterator[int]) -> int:
        return await anext(events)

    runner = _LoopThread()
    left_open = stream()
    assert runner.run(first(left_open)) == 1
    runner.stop()
    assert cleaned.is_set()


_CLOSE_SCRIPT = """
import sys
from adaptor.clients import a2a
from tests import a2a_server as srv

with srv.scripted_server() as running:
    for _ in range(int(sys.argv[1])):
        with a2a.Client(running.card_url) as c, c.send_stream("echo hi") as stream:
            events = list(stream)
        assert isinstance(events[-1], a2a.TerminalEvent)
print("closed")
"""


def test_the_documented_usage_closes_without_noise() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSE_SCRIPT, "20"],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "closed", proc.stderr
    assert "Task was destroyed" not in proc.stderr, proc.stderr


# --- stream recovery after the server is killed ------------------------------------------------


@pytest.fixture(scope="module")
def process_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[srv.ServerProcess]:
    proc = srv.ServerProcess(tmp=tmp_path_factory.mktemp("a2a-seed"))
    yield proc
    proc.close()


def _hang_until_working(c: a2a.Client) -> tuple[a2a.EventStream, str, str]:
    stream = c.send_stream("hang")
    assert isinstance(stream.next_event(), a2a.TaskEvent)
    working = stream.next_event()
    assert isinstance(working, a2a.StatusEvent) and working.state is a2a.TaskState.WORKING
    return stream, stream.task_id, stream.context_id


def test_a_killed_stream_recovers_a_finished_task(process_server: srv.ServerProcess) -> None:
    process_server.ensure_running()
    with a2a.Client(process_server.card_url) as c:
        stream, task_id, context_id = _hang_until_working(c)
        # The task finished while the connection was down: the restarted server knows it.
        process_server.restart(seed=[srv.finished_task(task_id, context_id)])
        events = list(stream)
    assert len(events) == 1
    terminal = events[0]
    assert isinstance(terminal, a2a.TerminalEvent)
    assert terminal.recovered and terminal.state is a2a.TaskState.COMPLETED
    assert terminal.task is not None and terminal.task.text == "finished offline"


@pytest.mark.parametrize("after", ["unknown", "still-working", "gone"])
def test_a_killed_stream_that_cannot_recover_fails(
    process_server: srv.ServerProcess, after: str
) -> None:
    process_server.ensure_running()
    with a2a.Client(process_server.card_url) as c:
        stream, task_id, context_id = _hang_until_working(c)
        if after == "gone":
            process_server.kill()
        else:
            working = srv.finished_task(task_id, context_id, "TASK_STATE_WORKING")
            seed = [] if after == "unknown" else [working]
            process_server.restart(seed=seed)
        with pytest.raises(a2a.StreamRecoveryError) as caught:
            list(stream)
    err = caught.value
    assert err.task_id == task_id
    assert isinstance(err.__cause__, ConnectionError) and err.cause is err.__cause__
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, a2a.StreamRecoveryError) and rebuilt.task_id == task_id


# --- packaging ---------------------------------------------------------------------------------


def test_the_error_identities_import_without_the_sdk() -> None:
    code = """
import sys
for name in ("a2a", "httpx", "google.protobuf"):
    sys.modules[name] = None  # any import of these now fails
from adaptor import errors
from adaptor.clients import a2a
import hosttools.a2adelegation as d
err = errors.from_wire(a2a.StreamRecoveryError("t", ConnectionError("x")).to_wire())
assert isinstance(err, a2a.StreamRecoveryError)
assert isinstance(errors.from_wire(d.DelegationError("cancelled").to_wire()), d.DelegationError)
print("ok")
"""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "ok", proc.stderr


# --- helpers -----------------------------------------------------------------------------------


def _text_route(path: str, body: str) -> Any:
    from starlette.responses import Response
    from starlette.routing import Route

    async def endpoint(_: Any) -> Response:
        return Response(body, media_type="application/json")

    return Route(path, endpoint, methods=["GET"])


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

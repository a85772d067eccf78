"""``hosttools.a2adelegation`` against a real a2a-sdk server on 127.0.0.1 (see ``a2a_server``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("a2a.server", reason="needs the a2a extra: pip install -e '.[test,a2a]'")
pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[test]'")

from adaptor import errors
from adaptor.clients import a2a
from adaptor.events import SubagentUpdate
from hosttools import a2adelegation as d
from tests import a2a_server as srv

TOKEN = "delegation-token-value"
TOKEN_ENV = "ADAPTOR_TEST_A2A_DELEGATION_TOKEN"
FAST = d.Policy(poll_interval=0.01)


@pytest.fixture(scope="module")
def executor() -> srv.ScriptedExecutor:
    return srv.ScriptedExecutor()


@pytest.fixture(scope="module")
def server(executor: srv.ScriptedExecutor) -> Iterator[srv.Running]:
    with srv.scripted_server(executor=executor) as running:
        yield running


@pytest.fixture(scope="module")
def polling_server(executor: srv.ScriptedExecutor) -> Iterator[srv.Running]:
    with srv.scripted_server(executor=executor, streaming=False) as running:
        yield running


class Updates(list[SubagentUpdate]):
    """A progress sink that records every update."""

    def __call__(self, update: SubagentUpdate) -> None:
        self.append(update)

    def kinds(self) -> list[str]:
        return [u.kind for u in self]


def _delegator(*specs: d.RemoteAgentSpec, on_update: Any = None) -> d.Delegator:
    return d.Delegator(d.Registry(specs), on_update=on_update)


def _fails(delegator: d.Delegator, request: d.DelegationRequest) -> d.DelegationError:
    with pytest.raises(d.DelegationError) as caught:
        delegator.delegate(request)
    return caught.value


def _no_remote_text(err: d.DelegationError) -> None:
    for text in (str(err), err.message, json.dumps(err.to_wire())):
        assert srv.SECRET_FAILURE_TEXT not in text and "hunter2" not in text


# --- success -----------------------------------------------------------------------------------


def test_a_streamed_delegation_reports_progress(server: srv.Running) -> None:
    updates = Updates()
    spec = d.RemoteAgentSpec("echo", card_url=server.card_url, display_name="Echo")
    with _delegator(spec, on_update=updates) as delegator:
        result = delegator.delegate(d.DelegationRequest("echo", "echo hello"))
    assert result.status is a2a.TaskState.COMPLETED
    assert result.text == "echo: hello"
    assert result.streamed and not result.recovered
    assert result.remote_task_id and result.remote_context_id
    assert [a.text for a in result.artifacts] == ["echo: hello"]
    assert updates.kinds()[0] == "started" and updates.kinds()[-1] == "finished"
    assert "delta" in updates.kinds() and "status" in updates.kinds()
    assert {u.agent for u in updates} == {"echo"}
    assert {u.data["delegation_id"] for u in updates} == {result.delegation_id}
    assert "".join(u.delta for u in updates if u.kind == "delta") == "echo: hello"
    states = [u.data["state"] for u in updates if u.kind == "status"]
    assert states[:2] == ["submitted", "working"]


def test_a_task_streamed_whole_completes_the_delegation_unrecovered(server: srv.Running) -> None:
    with _delegator(d.RemoteAgentSpec("echo", card_url=server.card_url)) as delegator:
        result = delegator.delegate(d.DelegationRequest("echo", "whole in one piece"))
    assert result.status is a2a.TaskState.COMPLETED and result.text == "in one piece"
    assert result.streamed and not result.recovered
    assert result.task is not None and result.task.id == result.remote_task_id


@pytest.mark.parametrize("how", ["card-without-streaming", "stream-false"])
def test_a_polled_delegation(server: srv.Running, polling_server: srv.Running, how: str) -> None:
    url = polling_server.card_url if how == "card-without-streaming" else server.card_url
    spec = d.RemoteAgentSpec("echo", card_url=url, policy=FAST)
    with _delegator(spec) as delegator:
        result = delegator.delegate(d.DelegationRequest("echo", "echo polled", stream=False))
    assert result.status is a2a.TaskState.COMPLETED
    assert result.text == "echo: polled"
    assert not result.streamed
    assert result.task is not None and result.task.id == result.remote_task_id


@pytest.mark.parametrize("stream", [True, False])
def test_a_message_reply_completes_the_delegation(server: srv.Running, stream: bool) -> None:
    with _delegator(d.RemoteAgentSpec("echo", card_url=server.card_url, policy=FAST)) as dg:
        result = dg.delegate(d.DelegationRequest("echo", "message hi", stream=stream))
    assert result.status is a2a.TaskState.COMPLETED and result.text == "message: hi"


def test_input_required_is_a_result_only_when_allowed(server: srv.Running) -> None:
    allowed = d.RemoteAgentSpec(
        "asks", card_url=server.card_url, policy=d.Policy(allow_input_required=True)
    )
    strict = d.RemoteAgentSpec("strict", card_url=server.card_url)
    with _delegator(allowed, strict) as delegator:
        result = delegator.delegate(d.DelegationRequest("asks", "input"))
        assert result.status is a2a.TaskState.INPUT_REQUIRED and result.text == "which branch?"
        err = _fails(delegator, d.DelegationRequest("strict", "input"))
    assert err.code == "remote_failed" and err.remote_status == "input_required"


def test_a_failing_progress_sink_does_not_fail_the_delegation(server: srv.Running) -> None:
    def broken(_: SubagentUpdate) -> None:
        raise RuntimeError("sink down")

    with _delegator(d.RemoteAgentSpec("echo", card_url=server.card_url), on_update=broken) as dg:
        assert dg.delegate(d.DelegationRequest("echo", "echo ok")).text == "echo: ok"


def test_bind_routes_progress_to_another_sink(server: srv.Running) -> None:
    first, second = Updates(), Updates()
    with _delegator(d.RemoteAgentSpec("echo", card_url=server.card_url), on_update=first) as dg:
        dg.bind(second).delegate(d.DelegationRequest("echo", "echo bound"))
    assert first == [] and second.kinds()[-1] == "finished"


# --- failures ----------------------------------------------------------------------------------


def test_an_unknown_agent_is_not_found() -> None:
    updates = Updates()
    with _delegator(on_update=updates) as delegator:
        err = _fails(delegator, d.DelegationRequest("nobody", "echo x"))
    assert err.code == "agent_not_found" and not err.retryable
    assert updates.kinds() == ["failed"]


def test_an_unreachable_agent_is_unavailable_and_retryable() -> None:
    spec = d.RemoteAgentSpec("down", card_url=f"http://127.0.0.1:{_closed_port()}/card.json")
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("down", "echo x"))
    assert err.code == "agent_unavailable" and err.retryable
    assert errors.matches(err, ConnectionError)


def test_an_invalid_card_is_unavailable_but_not_retryable(server: srv.Running) -> None:
    card = srv.card_json(srv.agent_card(server.base_url))
    card["supportedInterfaces"] = []
    with _delegator(d.RemoteAgentSpec("bad", card=card)) as delegator:
        err = _fails(delegator, d.DelegationRequest("bad", "echo x"))
    assert err.code == "agent_unavailable" and not err.retryable
    assert err.metadata["reason"] == "invalid_agent_card"
    assert errors.find(err, a2a.InvalidAgentCardError) is not None


def test_a_refused_credential_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    with srv.scripted_server(bearer_token=TOKEN) as running:
        spec = d.RemoteAgentSpec(
            "guarded", card_url=running.card_url, auth=a2a.BearerTokenFromEnv(TOKEN_ENV)
        )
        with _delegator(spec) as delegator:
            err = _fails(delegator, d.DelegationRequest("guarded", "echo x"))
            assert err.code == "configuration_error" and err.metadata["reason"] == "unauthorized"
            assert errors.find(err, a2a.UnauthorizedError) is not None
            monkeypatch.setenv(TOKEN_ENV, TOKEN)
            assert delegator.delegate(d.DelegationRequest("guarded", "echo y")).text == "echo: y"
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, d.DelegationError) and rebuilt.code == "configuration_error"
    assert errors.find(rebuilt, a2a.UnauthorizedError) is not None
    assert "not-the-token" not in json.dumps(err.to_wire())


def test_an_untrusted_interface_origin_is_a_configuration_error(
    server: srv.Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with srv.scripted_server(card_interface_url=server.base_url + "/") as pointing_away:
        spec = d.RemoteAgentSpec(
            "away", card_url=pointing_away.card_url, auth=a2a.BearerTokenFromEnv(TOKEN_ENV)
        )
        with _delegator(spec) as delegator:
            err = _fails(delegator, d.DelegationRequest("away", "echo x"))
    assert err.code == "configuration_error" and err.metadata["reason"] == "untrusted_origin"


def test_streaming_required_but_not_offered(polling_server: srv.Running) -> None:
    required = d.RemoteAgentSpec(
        "must", card_url=polling_server.card_url, policy=d.Policy(require_streaming=True)
    )
    plain = d.RemoteAgentSpec("plain", card_url=polling_server.card_url)
    with _delegator(required, plain) as delegator:
        err = _fails(delegator, d.DelegationRequest("must", "echo x"))
        assert err.code == "capability_unsupported"
        err = _fails(delegator, d.DelegationRequest("plain", "echo x", stream=True))
        assert err.code == "capability_unsupported"


def test_a_stream_that_cannot_open(server: srv.Running) -> None:
    # The card says "streaming" but its interface is a closed port: nothing ever reaches us.
    card = srv.card_json(srv.agent_card(f"http://127.0.0.1:{_closed_port()}"))
    required = d.RemoteAgentSpec("must", card=card, policy=d.Policy(require_streaming=True))
    fallback = d.RemoteAgentSpec("may", card=card, policy=FAST)
    updates = Updates()
    with _delegator(required, fallback, on_update=updates) as delegator:
        err = _fails(delegator, d.DelegationRequest("must", "echo x"))
        assert err.code == "stream_unavailable" and err.retryable
        # Without the requirement the delegator falls back to polling, which fails too.
        err = _fails(delegator, d.DelegationRequest("may", "echo x"))
        assert err.code == "agent_unavailable" and err.retryable
    assert "stream.unavailable" in updates.kinds()


@pytest.mark.parametrize("streaming", [True, False])
def test_a_remote_answering_http_500_is_unavailable_and_retryable(streaming: bool) -> None:
    # It was protocol_error ("malformed response"), not retryable, unlike a 503.
    with srv.scripted_server(extra_routes=[srv.status_route("/failing", 500)]) as running:
        card = srv.agent_card(running.base_url, rpc_path="/failing", streaming=streaming)
        spec = d.RemoteAgentSpec("failing", card=srv.card_json(card), policy=FAST)
        with _delegator(spec) as delegator:
            err = _fails(delegator, d.DelegationRequest("failing", "echo x"))
    assert err.code == "agent_unavailable" and err.retryable
    assert "HTTP 500" in str(err.cause)


def test_a_remote_asking_to_retry_later_says_when_in_the_metadata() -> None:
    route = srv.status_route("/throttled", 503, headers={"Retry-After": "7"})
    with srv.scripted_server(extra_routes=[route]) as running:
        card = srv.agent_card(running.base_url, rpc_path="/throttled", streaming=False)
        spec = d.RemoteAgentSpec("throttled", card=srv.card_json(card), policy=FAST)
        with _delegator(spec) as delegator:
            err = _fails(delegator, d.DelegationRequest("throttled", "echo x"))
    assert err.code == "agent_unavailable" and err.retryable
    assert err.metadata["retry_after_s"] == 7.0
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, d.DelegationError) and rebuilt.metadata["retry_after_s"] == 7.0


@pytest.mark.parametrize(
    ("prompt", "code", "remote_status", "retryable"),
    [
        ("fail now", "remote_failed", "failed", False),
        ("reject now", "remote_failed", "rejected", False),
        ("canceled", "cancelled", "canceled", True),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_remote_outcomes_become_typed_failures_with_safe_messages(
    server: srv.Running, prompt: str, code: str, remote_status: str, retryable: bool, stream: bool
) -> None:
    updates = Updates()
    spec = d.RemoteAgentSpec("remote", card_url=server.card_url, policy=FAST)
    with _delegator(spec, on_update=updates) as delegator:
        err = _fails(delegator, d.DelegationRequest("remote", prompt, stream=stream))
    assert (err.code, err.remote_status, err.retryable) == (code, remote_status, retryable)
    assert err.metadata["remote_task_id"]
    _no_remote_text(err)
    assert updates.kinds()[-1] == ("cancelled" if code == "cancelled" else "failed")


def test_artifacts_over_the_limit_are_a_policy_violation(server: srv.Running) -> None:
    spec = d.RemoteAgentSpec(
        "big", card_url=server.card_url, policy=d.Policy(max_artifact_bytes=100)
    )
    with _delegator(spec) as delegator:
        assert delegator.delegate(d.DelegationRequest("big", "big 100")).text == "x" * 100
        err = _fails(delegator, d.DelegationRequest("big", "big 101"))
    assert err.code == "policy_violation" and err.metadata["limit_bytes"] == 100


def test_an_answer_streamed_in_many_chunks_is_assembled_and_bounded(server: srv.Running) -> None:
    expected = "".join(f"t{index} " for index in range(1000))
    roomy = d.RemoteAgentSpec("tokens", card_url=server.card_url)
    tight = d.RemoteAgentSpec(
        "tight", card_url=server.card_url, policy=d.Policy(max_artifact_bytes=len(expected) - 1)
    )
    with _delegator(roomy, tight) as delegator:
        result = delegator.delegate(d.DelegationRequest("tokens", "tokens 1000"))
        assert result.text == expected and len(result.artifacts) == 1
        assert len(result.artifacts[0].parts) == 1000
        # The limit counts every appended chunk, the last one included.
        err = _fails(delegator, d.DelegationRequest("tight", "tokens 1000"))
    assert err.code == "policy_violation"


def test_an_endless_event_is_a_protocol_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # One endless SSE line was read whole (1 GiB under max_artifact_bytes=1 MiB) before the
    # policy could look at it.  The client's bound (32 MiB) is lowered to keep the test light.
    monkeypatch.setattr(a2a, "MAX_RESPONSE_BYTES", 256 << 10, raising=False)
    endless = srv.Trickle.endless("/rpc", srv.SSE_EVENT_HEAD, "text/event-stream")
    with srv.scripted_server(extra_routes=[endless.route()]) as running:
        card = srv.agent_card(running.base_url, interface_url=running.base_url + "/rpc")
        spec = d.RemoteAgentSpec(
            "endless", card=srv.card_json(card), policy=d.Policy(max_artifact_bytes=1 << 20)
        )
        with _delegator(spec) as delegator:
            err = _fails(delegator, d.DelegationRequest("endless", "hi"))
        assert endless.gave_up_early(), endless.sent
    assert err.code == "protocol_error"


def test_a_remote_sending_a_number_json_has_no_value_for_is_a_protocol_error() -> None:
    # The client's conversion raised a bare ValueError, which delegate() passed on as it was
    # (a host tool's "the tool failed" to the model) instead of a DelegationError.
    task = {"id": "t-inf", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"},
            "metadata": {"n": float("inf")}}
    frame = json.dumps({"jsonrpc": "2.0", "id": "1", "result": {"task": task}})
    with srv.scripted_server(extra_routes=[srv.raw_sse_route("/inf", [frame])]) as running:
        card = srv.agent_card(running.base_url, interface_url=running.base_url + "/inf")
        with _delegator(d.RemoteAgentSpec("inf", card=srv.card_json(card))) as delegator:
            err = _fails(delegator, d.DelegationRequest("inf", "hi"))
    assert err.code == "protocol_error"


def test_a_remote_finishing_another_task_is_no_success_of_this_one() -> None:
    data = srv.another_tasks_end_frames()
    with srv.scripted_server(extra_routes=[srv.raw_sse_route("/other", data)]) as running:
        card = srv.agent_card(running.base_url, interface_url=running.base_url + "/other")
        with _delegator(d.RemoteAgentSpec("other", card=srv.card_json(card))) as delegator:
            err = _fails(delegator, d.DelegationRequest("other", "hi"))
    assert err.code == "protocol_error"


@pytest.mark.parametrize("timeout", [float("nan"), 0.0, -1.0])
def test_a_timeout_that_is_no_positive_number_is_refused_before_anything_is_sent(timeout: float) -> None:
    # NaN passed the "<= 0" check: streaming then failed with a bare ValueError, and polling
    # had no deadline at all (max_timeout ignored).
    spec = d.RemoteAgentSpec("a", card_url="http://127.0.0.1:9/.well-known/agent-card.json")
    with _delegator(spec) as delegator, pytest.raises(ValueError, match="positive number of seconds"):
        delegator.delegate(d.DelegationRequest("a", "hi", timeout=timeout))


class _CountedText(str):
    """Text that counts how often its bytes are measured."""

    measured = 0

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        type(self).measured += 1
        return super().encode(encoding, errors)


def test_each_streamed_chunk_is_measured_once() -> None:
    # A remote streaming its answer a token at a time sends thousands of chunks; re-measuring
    # all that was held on each one made a delegation quadratic (20,000 chunks: a minute).
    from hosttools.a2adelegation._delegator import _Delegation

    registry = d.Registry([d.RemoteAgentSpec("x", card_url="http://127.0.0.1:9/card")])
    delegation = _Delegation(registry, None, None, d.DelegationRequest("x", "go"))  # type: ignore[arg-type]
    for index in range(500):
        part = a2a.Part("text", text=_CountedText("tok "))
        delegation.add_artifact(a2a.Artifact("out", parts=(part,)), append=index > 0)
    assert _CountedText.measured == 500


class _CountedMessage(a2a.Message):
    """A message that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        type(self).compared += 1
        return super().__eq__(other)

    __hash__ = a2a.Message.__hash__


def test_status_messages_are_kept_once_each_and_bounded() -> None:
    # The adaptord bridge sends one status message per text delta: looking each up in the list
    # of all before it made a delegation quadratic (20,000 updates: a minute), and all were kept.
    from hosttools.a2adelegation._delegator import _Delegation

    registry = d.Registry([d.RemoteAgentSpec("x", card_url="http://127.0.0.1:9/card")])
    delegation = _Delegation(registry, None, None, d.DelegationRequest("x", "go"))  # type: ignore[arg-type]
    count = 3000

    def message(index: int) -> a2a.Message:
        part = a2a.Part("text", text=f"tok{index} ")
        return _CountedMessage(f"m{index}", "agent", parts=(part,))

    for index in range(count):
        delegation.set_state(a2a.TaskState.WORKING, message(index))
        delegation.set_state(a2a.TaskState.WORKING, message(index))  # the same one, again
    final = a2a.Message("last", "agent", parts=(a2a.Part("text", text="done"),))
    result = delegation.finish(a2a.TaskState.COMPLETED, final, task=None, recovered=False)
    assert _CountedMessage.compared <= 2 * count  # linear: one lookup per update
    assert result.text == "done"
    assert len(result.messages) == 1000  # the latest, each once
    assert result.messages[-1] == final
    assert [m.message_id for m in result.messages[:2]] == [f"m{count - 999}", f"m{count - 998}"]


def test_messages_with_data_parts_are_kept_once_each() -> None:
    from hosttools.a2adelegation._delegator import _Delegation

    registry = d.Registry([d.RemoteAgentSpec("x", card_url="http://127.0.0.1:9/card")])
    delegation = _Delegation(registry, None, None, d.DelegationRequest("x", "go"))  # type: ignore[arg-type]
    for data in ({"a": [1]}, {"a": [1]}, {"a": [2]}):
        part = a2a.Part("data", data=data)
        delegation.set_state(a2a.TaskState.WORKING, a2a.Message("m", "agent", parts=(part,)))
    result = delegation.finish(a2a.TaskState.COMPLETED, None, task=None, recovered=False)
    assert [m.parts[0].data for m in result.messages] == [{"a": [1]}, {"a": [2]}]


# --- local cancellation and deadlines ----------------------------------------------------------


class ExpiringClock:
    """The delegation clock, frozen until the remote task exists, then far past any deadline.

    Deadlines are wall-clock by design; expiring them on cue keeps the tests independent of
    machine speed (a real 0.3 s budget may run out before the remote task even exists).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from hosttools.a2adelegation import _delegator

        self.now = 0.0
        monkeypatch.setattr(_delegator, "_now", lambda: self.now)

    def sink(self, update: SubagentUpdate) -> None:
        if update.kind == "status":
            self.now += 1e9


@pytest.mark.parametrize("stream", [True, False])
def test_a_local_timeout_cancels_the_remote_task(
    server: srv.Running,
    executor: srv.ScriptedExecutor,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    clock = ExpiringClock(monkeypatch)
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)
    with _delegator(spec, on_update=clock.sink) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", timeout=30, stream=stream))
    assert err.code == "deadline_exceeded" and err.metadata["limit_ms"] == 30_000
    assert executor.wait_cancelled(err.metadata["remote_task_id"])


def test_the_policy_caps_the_timeout(
    server: srv.Running, executor: srv.ScriptedExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ExpiringClock(monkeypatch)
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=d.Policy(max_timeout=20))
    with _delegator(spec, on_update=clock.sink) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", timeout=3600))
    assert err.code == "deadline_exceeded" and err.metadata["limit_ms"] == 20_000
    assert executor.wait_cancelled(err.metadata["remote_task_id"])


def test_a_real_deadline_expires(server: srv.Running) -> None:
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", timeout=0.2))
    assert err.code == "deadline_exceeded" and err.metadata["limit_ms"] == 200


@pytest.mark.parametrize("bound", ["request-timeout", "policy-max-timeout", "client-timeout"])
@pytest.mark.parametrize("what", ["card", "send"])
def test_a_request_the_remote_answers_a_byte_at_a_time_ends_at_the_deadline(
    what: str, bound: str
) -> None:
    # The card fetch and the polling send are requests, not stream reads: they ran on the
    # client's 30 s bound, so timeout=2 failed after 30 s as agent_unavailable (retryable).
    trickle = srv.Trickle("/slow")
    with srv.scripted_server(extra_routes=[trickle.route()]) as running:
        if what == "card":
            where: dict[str, Any] = {"card_url": running.base_url + "/slow"}
        else:
            card = srv.agent_card(
                running.base_url, interface_url=running.base_url + "/slow", streaming=False
            )
            where = {"card": srv.card_json(card)}
        policy = d.Policy(max_timeout=1) if bound == "policy-max-timeout" else d.Policy()
        spec = d.RemoteAgentSpec("slow", policy=policy, **where)
        timeout = 1.0 if bound == "request-timeout" else None
        client_timeout = 1.0 if bound == "client-timeout" else 30.0
        with d.Delegator(d.Registry([spec]), client_timeout=client_timeout) as delegator:
            err = _fails(delegator, d.DelegationRequest("slow", "hi", timeout=timeout))
        assert trickle.gave_up_early(), trickle.sent
    if bound == "client-timeout":
        # The client's own bound, well before the deadline: the remote is slow, try again.
        assert err.code == "agent_unavailable" and err.retryable
    else:
        assert err.code == "deadline_exceeded" and not err.retryable
        assert err.metadata["limit_ms"] == 1000


def test_a_request_that_fails_after_a_local_cancel_is_cancelled() -> None:
    # The card fetch cannot be interrupted (it finishes first, within the client's bound): its
    # failure then was reported as agent_unavailable, retryable, though the leader had given up.
    trickle = srv.Trickle("/slow")
    cancel = threading.Event()
    with srv.scripted_server(extra_routes=[trickle.route()]) as running:
        spec = d.RemoteAgentSpec("slow", card_url=running.base_url + "/slow")

        def cancel_once_the_fetch_is_under_way() -> None:
            if trickle.started.wait(60):
                cancel.set()

        threading.Thread(target=cancel_once_the_fetch_is_under_way).start()
        with d.Delegator(d.Registry([spec]), client_timeout=1.0) as delegator:
            err = _fails(delegator, d.DelegationRequest("slow", "hi", cancel=cancel))
        assert trickle.gave_up_early(), trickle.sent
    assert err.code == "cancelled"


def test_polls_are_bounded(server: srv.Running, executor: srv.ScriptedExecutor) -> None:
    spec = d.RemoteAgentSpec(
        "slow", card_url=server.card_url, policy=d.Policy(poll_interval=0.01, max_polls=3)
    )
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", stream=False))
    assert err.code == "deadline_exceeded" and err.metadata["max_polls"] == 3
    assert executor.wait_cancelled(err.metadata["remote_task_id"])


def test_a_cancel_before_the_stream_named_its_task_still_cancels_it(
    server: srv.Running, executor: srv.ScriptedExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leader gave up after the message went out but before the stream's first event: the
    # delegation knew no task id, cancelled nothing, and the remote task ran on (a daemon's
    # cancelled leader left its remote agent working).
    cancel = threading.Event()
    next_event = a2a.EventStream.next_event
    first: list[a2a.StreamEvent | None] = []

    def sent_then_cancelled(self: a2a.EventStream, timeout: float | None = None) -> Any:
        if first:
            return next_event(self, timeout)
        first.append(next_event(self, 0))  # sends the message; its answer is still to come
        assert executor.wait_started(before + 1)
        cancel.set()
        return first[0]

    monkeypatch.setattr(a2a.EventStream, "next_event", sent_then_cancelled)
    before = len(executor.started)  # (the executor serves the whole module)
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", stream=True, cancel=cancel))
    assert first == [None] and err.code == "cancelled"
    (started,) = executor.started[before:]
    assert err.metadata["remote_task_id"] == started
    assert executor.wait_cancelled(started)


@pytest.mark.slow
def test_a_remote_slow_to_name_its_task_still_has_it_cancelled(
    server: srv.Running, executor: srv.ScriptedExecutor
) -> None:
    # The delegation waited 5 s for the stream to name the task, then gave up and left the
    # remote task running.
    cancel = threading.Event()
    before = len(executor.started)
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)

    def cancel_once_started() -> None:
        assert executor.wait_started(before + 1)
        cancel.set()

    helper = threading.Thread(target=cancel_once_started)
    helper.start()
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "late 6", stream=True, cancel=cancel))
    helper.join()
    assert err.code == "cancelled"
    (started,) = executor.started[before:]
    assert executor.wait_cancelled(started)


@pytest.mark.parametrize("when", ["before the send", "between opening the stream and its first read"])
def test_a_cancel_before_the_message_went_out_creates_no_remote_task(
    server: srv.Running,
    executor: srv.ScriptedExecutor,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    # The message goes out at the stream's first read: reading it only to learn the task id
    # would make a remote task just to cancel it.
    cancel = threading.Event()
    if when == "before the send":
        cancel.set()
    else:
        send_stream = a2a.Client.send_stream

        def opened_then_cancelled(self: a2a.Client, *args: Any, **kwargs: Any) -> a2a.EventStream:
            stream = send_stream(self, *args, **kwargs)
            cancel.set()
            return stream

        monkeypatch.setattr(a2a.Client, "send_stream", opened_then_cancelled)
    before = len(executor.started)
    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)
    with _delegator(spec) as delegator:
        err = _fails(delegator, d.DelegationRequest("slow", "hang", stream=True, cancel=cancel))
    assert err.code == "cancelled" and "remote_task_id" not in err.metadata
    assert not executor.wait_started(before + 1, timeout=1)


@pytest.mark.parametrize("stream", [True, False])
def test_local_cancellation_cancels_the_remote_task(
    server: srv.Running, executor: srv.ScriptedExecutor, stream: bool
) -> None:
    cancel = threading.Event()
    updates = Updates()

    def on_update(update: SubagentUpdate) -> None:
        updates(update)
        if update.kind == "status" and update.data.get("state") in ("working", "submitted"):
            cancel.set()  # the leader gives up once the remote task exists

    spec = d.RemoteAgentSpec("slow", card_url=server.card_url, policy=FAST)
    with _delegator(spec, on_update=on_update) as delegator:
        request = d.DelegationRequest("slow", "hang", stream=stream, cancel=cancel)
        err = _fails(delegator, request)
    assert err.code == "cancelled" and err.remote_status is None
    assert executor.wait_cancelled(err.metadata["remote_task_id"])
    assert updates.kinds()[-1] == "cancelled"


# --- dropped streams ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def process_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[srv.ServerProcess]:
    proc = srv.ServerProcess(tmp=tmp_path_factory.mktemp("a2a-seed"))
    yield proc
    proc.close()


def _restart_when_working(
    proc: srv.ServerProcess, seed: Callable[[str], list[Any]], updates: Updates
) -> Callable[[SubagentUpdate], None]:
    """A sink that restarts the server once the remote task is working.  The delegation thread
    is inside the sink meanwhile, so it reads the stream again only after the restart."""

    def on_update(update: SubagentUpdate) -> None:
        updates(update)
        if update.kind == "status" and update.data["state"] == "working":
            proc.restart(seed=seed(update.data["task_id"]))

    return on_update


def test_a_dropped_stream_is_recovered(process_server: srv.ServerProcess) -> None:
    process_server.ensure_running()
    updates = Updates()
    finished = _restart_when_working(
        process_server, lambda task_id: [srv.finished_task(task_id, "")], updates
    )
    spec = d.RemoteAgentSpec("flaky", card_url=process_server.card_url, policy=FAST)
    with _delegator(spec, on_update=finished) as delegator:
        result = delegator.delegate(d.DelegationRequest("flaky", "hang"))
    assert result.status is a2a.TaskState.COMPLETED and result.recovered
    assert result.text == "finished offline"
    assert updates.kinds()[-1] == "finished"


def test_a_dropped_stream_whose_task_is_lost_fails(process_server: srv.ServerProcess) -> None:
    process_server.ensure_running()
    updates = Updates()
    forgotten = _restart_when_working(process_server, lambda _: [], updates)
    spec = d.RemoteAgentSpec("flaky", card_url=process_server.card_url, policy=FAST)
    with _delegator(spec, on_update=forgotten) as delegator:
        err = _fails(delegator, d.DelegationRequest("flaky", "hang"))
    assert err.code == "remote_failed" and err.metadata["reason"] == "task_not_found"
    assert "stream.dropped" in updates.kinds()


# --- the registry and the host tool ------------------------------------------------------------


def test_registry_rules() -> None:
    spec = d.RemoteAgentSpec("a", card_url="http://127.0.0.1:1/card.json")
    registry = d.Registry([spec])
    with pytest.raises(ValueError):
        registry.add(d.RemoteAgentSpec("a", card_url="http://127.0.0.1:2/card.json"))
    with pytest.raises(ValueError):
        d.RemoteAgentSpec("bad key", card_url="http://127.0.0.1:1/")
    with pytest.raises(ValueError):
        d.RemoteAgentSpec("nocard")
    with pytest.raises(ValueError):
        d.Policy(poll_interval=0)
    assert "a" in registry and registry.keys() == ["a"] and list(registry) == [spec]
    loaded = d.RemoteAgentSpec.from_mapping(
        {
            "key": "b",
            "card_url": "http://127.0.0.1:3/card.json",
            "bearer_token_env": "B_TOKEN",
            "policy": {"max_timeout": 5, "require_streaming": True},
        }
    )
    assert loaded.auth == a2a.BearerTokenFromEnv("B_TOKEN")
    assert loaded.policy.require_streaming and loaded.policy.max_timeout == 5
    with pytest.raises(ValueError):
        d.RemoteAgentSpec.from_mapping({"key": "c", "card_url": "http://h/", "polcy": {}})


def test_delegate_to_agent_as_a_host_tool(server: srv.Running) -> None:
    tool = pytest.importorskip("adaptor.tool")
    if not hasattr(tool, "define"):
        pytest.skip("adaptor.tool.define is not available yet")
    specs = [
        d.RemoteAgentSpec("echo", card_url=server.card_url, description="echoes text"),
        d.RemoteAgentSpec("failing", card_url=server.card_url),
    ]
    with _delegator(*specs) as delegator:
        definition = d.delegate_to_agent(delegator)
        descriptor = definition.descriptor()
        assert descriptor.name == "delegate_to_agent" and "echoes text" in descriptor.description
        ok = definition.call({"agent": "echo", "prompt": "echo via tool"})
        assert not ok.is_error and ok.structured is not None
        assert ok.structured["text"] == "echo: via tool" and ok.structured["status"] == "completed"
        failed = definition.call({"agent": "failing", "prompt": "fail now"})
        assert failed.is_error and failed.text == "the remote agent failed the task"
        unknown = definition.call({"agent": "nobody", "prompt": "x"})
        assert unknown.is_error


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_only_a_well_formed_failure_statement_is_promoted() -> None:
    from hosttools.a2adelegation._delegator import _promoted

    def status(control: Any, data: bool = False) -> a2a.Message:
        metadata = {"agentadaptor.failure": control}
        part = a2a.Part("data", data={}, metadata=metadata) if data else a2a.Part("text", text="x", metadata=metadata)
        return a2a.Message("m", "agent", (part,))

    failed, canceled = a2a.TaskState.FAILED, a2a.TaskState.CANCELED
    assert _promoted(failed, status({"code": "approval_denied"})) == ("approval_denied", None)
    assert _promoted(failed, status({"code": "active_execution_timeout", "limit_ms": 999.2})) == (
        "active_execution_timeout", 1000)
    for control in ({"code": "made_up"}, {"code": "agent_error", "extra": 1}, "agent_error",
                    {"code": "agent_error", "limit_ms": -1}, {"code": "agent_error", "limit_ms": True},
                    {"code": "cancelled"}):
        assert _promoted(failed, status(control)) is None, control
    assert _promoted(canceled, status({"code": "agent_error"})) is None  # a state mismatch
    assert _promoted(failed, status({"code": "agent_error"}, data=True)) is None  # text parts only
    assert _promoted(failed, None) is None


_WITHOUT_THE_EXTRA = """
import sys
sys.modules["httpx"] = None  # what a venv without the a2a extra has: no httpx, no a2a-sdk
sys.modules["a2a"] = None
from adaptor.clients import a2a
from hosttools import a2adelegation as d
from adaptord import config as config_module
try:
    a2a.Client("http://127.0.0.1:9/.well-known/agent-card.json")
except ImportError as exc:
    print("client:", exc)
registry = d.Registry([d.RemoteAgentSpec(key="r", card_url="http://127.0.0.1:9/.well-known/agent-card.json")])
try:
    d.Delegator(registry).delegate(d.DelegationRequest("r", "hi"))
except d.DelegationError as exc:
    print("delegation:", exc.code, exc.metadata["reason"])
raw = {"a2a": {"remotes": {"r": {"card_url": "http://127.0.0.1:9/.well-known/agent-card.json"}}}}
try:
    config_module._parse(raw, "c.toml").load_tools()
except config_module.ConfigError as exc:
    print("config:", exc)
"""


def test_without_the_a2a_extra_each_use_says_so() -> None:
    # A raw ModuleNotFoundError came at the client's first call, escaped the Delegator (whose
    # failures are DelegationError), and `adaptord check` said ok for a config delegating.
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", _WITHOUT_THE_EXTRA], capture_output=True, text=True, timeout=60)
    lines = ran.stdout.splitlines()
    assert ran.returncode == 0 and len(lines) == 3, ran.stdout + ran.stderr
    assert lines[0].startswith("client: the A2A client needs the a2a extra")
    assert lines[1] == "delegation: configuration_error a2a_sdk_missing"
    assert lines[2].startswith("config: c.toml: a2a.remotes: the A2A client needs the a2a extra")

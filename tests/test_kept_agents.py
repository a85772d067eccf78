"""Agents kept between daemon requests (``adaptor._request.KeptAgents``) for drivers whose CLI
processes persist: shared by identical configs, separate otherwise, bounded, closed on close."""

from __future__ import annotations

from typing import Any

import adaptor
from adaptor import _request as requests
from adaptor import memory
from adaptor.threadstore import Query

PERSISTENT = {"process": {"persistent": True}}


def request(text: str, *, descriptor: dict[str, Any] | None = PERSISTENT, **fields: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"steps": [{"text": text}], "session": "auto"}
    if descriptor is not None:
        config["descriptor"] = descriptor
    return {"id": "r1", "driver": "script", "prompt": "hi", "config": config, **fields}


def build(req: dict[str, Any], kept: requests.KeptAgents | None, store: Any = None) -> requests.Call:
    return requests.build(req, driver_defaults={}, thread_store=store, on_approval=lambda r: None,
                          tools={}, kept=kept)


def run(call: requests.Call) -> adaptor.Result:
    try:
        return call.start().result()
    finally:
        call.close(5.0)


def test_identical_configs_share_one_agent_and_it_stays_open() -> None:
    kept = requests.KeptAgents()
    first, second = build(request("same"), kept), build(request("same"), kept)
    assert first.agent is second.agent
    assert run(first).text == "same" and run(second).text == "same"
    assert not first.agent.closed  # kept for the next request
    kept.close()
    assert first.agent.closed


def test_per_request_options_still_apply_on_a_shared_agent() -> None:
    kept = requests.KeptAgents()
    store = memory.Store()
    plain = build(request("a"), kept, store)
    threaded = build(request("a", thread={"key": "k"}, model="m-2", metadata={"who": "me"}), kept, store)
    assert plain.agent is threaded.agent
    assert run(threaded).model == "m-2"
    assert store.resolve(Query(key="k")) is not None
    assert run(plain).model != "m-2"  # one request's options never leak into the next


def test_different_configs_and_non_persistent_drivers_get_their_own_agents() -> None:
    kept = requests.KeptAgents()
    one, other = build(request("one"), kept), build(request("other"), kept)
    assert one.agent is not other.agent
    fresh = build(request("x", descriptor=None), kept)
    again = build(request("x", descriptor=None), kept)
    assert fresh.agent is not again.agent
    run(fresh)
    assert fresh.agent.closed  # not kept: closed after its run, as before


def test_the_least_recently_used_idle_agent_is_closed_to_make_room() -> None:
    kept = requests.KeptAgents(limit=2)
    busy = build(request("busy"), kept)  # checked out, not given back
    idle = build(request("idle"), kept)
    run(idle)
    third = build(request("third"), kept)
    assert idle.agent.closed and not busy.agent.closed and not third.agent.closed
    # The busy agent was never given back, so it is not evicted even over the limit.
    fourth = build(request("fourth"), kept)
    assert not busy.agent.closed
    run(busy), run(third), run(fourth)
    kept.close()
    assert busy.agent.closed and third.agent.closed and fourth.agent.closed


def test_after_close_nothing_is_kept() -> None:
    kept = requests.KeptAgents()
    kept.close()
    call = build(request("late"), kept)
    assert run(call).text == "late"
    assert call.agent.closed


def test_the_key_does_not_hold_config_values() -> None:
    kept = requests.KeptAgents()
    secret = "sk-very-secret-value"
    req = request("s")
    req["config"]["env"] = {"TOKEN": secret}
    build(req, kept)
    assert len(kept._agents) == 1
    assert all(secret.encode() not in key for key in kept._agents)

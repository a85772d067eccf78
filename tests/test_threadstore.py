"""The thread store contract (memory and JSONL stores) and the JSONL store's durability."""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any

import filelock
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor import _durable, memory
from adaptor._durable import frame, scan, unframe
from adaptor.driver import SessionState
from adaptor.errors import from_wire, to_wire
from adaptor.threadstore import (
    AlreadyExistsError,
    BusyError,
    CorruptLogError,
    FinalizeRequest,
    JSONLStore,
    Lease,
    LeaseLostError,
    Query,
    Record,
    Store,
    _jsonl,
)
from adaptor.threadstore._state import RESERVE_BLOCK
from adaptord._store import ReopeningStore
from tests.daemon_harness import identities
from tests.durable_hooks import (
    count_datasyncs,
    count_releases,
    hook_datasyncs,
    past_the_maximum_hold,
)
from tests.unwritable import unwritable

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "threadstore_child.py"
CHILD_TIMEOUT = 60

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
START = 1_800_000_000.0

OPAQUE_KEYS = [
    "../x",
    "a/b",
    "/etc/passwd",
    "..",
    ".",
    "with spaces",
    "tab\tnew\nline",
    "nul\x00byte",
    "back\\slash",
    "ünïcødé 🧵 ключ",
    "snapshot.json",
    "store.lock",
    "log-000001.jsonl",
    "k" * 1024,
    "é" * 512,  # 1 KiB of UTF-8
]


class FakeClock:
    """Wall clock the tests move by hand, so leases expire without sleeping."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_record(
    record_id: str,
    key: str,
    *,
    status: str = "active",
    data: dict[str, str] | None = None,
    at: datetime = T0,
) -> Record:
    return Record(
        id=record_id,
        key=key,
        status=status,  # type: ignore[arg-type]
        driver_type="script",
        agent="agent-1",
        fingerprint=f"fp-{record_id}",
        compatibility_fingerprint="cfp",
        session_codec="script/v1",
        state=SessionState(resume_id=f"resume-{record_id}", display_id="d", data=data or {}),
        created_at=at,
        updated_at=at,
    )


def at(clock_value: float) -> datetime:
    return datetime.fromtimestamp(clock_value, tz=UTC)


def start(store: Store, record_id: str, key: str, owner: str = "setup") -> Record:
    """Create ``record_id`` as the active record of ``key`` the way the Thread layer would."""
    lease = store.acquire_lease(f"key:{key}", owner, 60)
    record = make_record(record_id, key)
    store.finalize(
        FinalizeRequest(record=record, key=key, held_leases=(lease,), rebind_active=True)
    )
    store.release_lease(lease)
    return record


# --- the contract suite, run against both stores ---------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "jsonl", "daemon"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[Callable[[], Store]]:
    """A factory: every call gives a store over the same data (a reopen, for the JSONL ones).

    ``daemon`` is adaptord's store, a JSONLStore opened afresh after a failed write.
    """
    opened: list[JSONLStore | ReopeningStore] = []
    if request.param == "memory":
        shared = memory.Store(clock=clock)
        yield lambda: shared
    else:
        kind = JSONLStore if request.param == "jsonl" else ReopeningStore

        def reopen() -> Store:
            opened.append(kind(tmp_path / "threads", clock=clock))
            return opened[-1]

        yield reopen
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    return make_store()


def test_both_stores_satisfy_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_missing_records_resolve_to_none(store: Store) -> None:
    assert store.resolve(Query(id="nope")) is None
    assert store.resolve(Query(key="nope", include_archived=True)) is None


def test_busy_until_released(store: Store) -> None:
    lease = store.acquire_lease("key:k", "alice", 30)
    with pytest.raises(BusyError) as info:
        store.acquire_lease("key:k", "bob", 30)
    assert info.value.target == "key:k"
    store.acquire_lease("key:other", "bob", 30)  # other targets are independent
    store.release_lease(lease)
    assert store.acquire_lease("key:k", "bob", 30).owner == "bob"


def test_self_reacquire_keeps_the_token_and_extends(store: Store, clock: FakeClock) -> None:
    first = store.acquire_lease("t", "alice", 10)
    clock.advance(8)
    again = store.acquire_lease("t", "alice", 10)
    assert again == first
    clock.advance(8)  # past the first expiry, inside the extended one
    with pytest.raises(BusyError):
        store.acquire_lease("t", "bob", 10)
    store.renew_lease(first, 10)


def test_expired_lease_is_granted_anew_with_a_higher_generation(
    store: Store, clock: FakeClock
) -> None:
    first = store.acquire_lease("t", "alice", 10)
    clock.advance(10)  # expiry is exclusive: at exactly the deadline the lease is gone
    second = store.acquire_lease("t", "bob", 10)
    assert second.token != first.token
    assert second.generation > first.generation
    clock.advance(11)
    third = store.acquire_lease("t", "bob", 10)  # own but expired: also a new grant
    assert third.token != second.token
    assert third.generation > second.generation


def test_generation_increases_on_every_grant_across_targets(store: Store) -> None:
    generations = [store.acquire_lease(f"t{i}", "o", 10).generation for i in range(5)]
    assert generations == sorted(set(generations))


def test_renew_requires_owner_token_and_time(store: Store, clock: FakeClock) -> None:
    lease = store.acquire_lease("t", "alice", 10)
    clock.advance(9)
    store.renew_lease(lease, 10)
    clock.advance(9)  # alive only thanks to the renewal
    store.renew_lease(lease, 10)
    for forged in (
        dataclasses.replace(lease, token="999-forged"),
        dataclasses.replace(lease, owner="mallory"),
        dataclasses.replace(lease, target="elsewhere"),
    ):
        with pytest.raises(LeaseLostError) as info:
            store.renew_lease(forged, 10)
        assert info.value.target == forged.target
    clock.advance(10)
    with pytest.raises(LeaseLostError):
        store.renew_lease(lease, 10)


def test_takeover_fences_the_old_owner(store: Store, clock: FakeClock) -> None:
    start(store, "r1", "k")
    stale = store.acquire_lease("key:k", "alice", 10)
    clock.advance(11)
    fresh = store.acquire_lease("key:k", "bob", 10)
    assert fresh.generation > stale.generation
    # Alice never noticed she lost it; every write she attempts is refused.
    with pytest.raises(LeaseLostError):
        store.renew_lease(stale, 10)
    with pytest.raises(LeaseLostError) as info:
        store.finalize(
            FinalizeRequest(
                record=make_record("r2", "k"),
                previous_id="r1",
                key="k",
                held_leases=(stale,),
                archive_old=True,
                rebind_active=True,
            )
        )
    assert info.value.target == "key:k"
    assert store.resolve(Query(key="k")) == make_record("r1", "k")
    assert store.resolve(Query(id="r2", include_archived=True)) is None
    # Her stale release is ignored and leaves Bob's lease in place.
    store.release_lease(stale)
    with pytest.raises(BusyError):
        store.acquire_lease("key:k", "carol", 10)
    store.renew_lease(fresh, 10)


def test_finalize_with_an_expired_lease_is_lost_even_without_takeover(
    store: Store, clock: FakeClock
) -> None:
    lease = store.acquire_lease("key:k", "alice", 10)
    clock.advance(10)
    with pytest.raises(LeaseLostError):
        store.finalize(
            FinalizeRequest(
                record=make_record("r1", "k"), key="k", held_leases=(lease,), rebind_active=True
            )
        )
    assert store.resolve(Query(id="r1", include_archived=True)) is None


def test_finalize_checks_every_held_lease(store: Store) -> None:
    good = store.acquire_lease("key:k", "alice", 10)
    never = Lease("rec:r1", "alice", "1-never-granted")
    with pytest.raises(LeaseLostError) as info:
        store.finalize(
            FinalizeRequest(
                record=make_record("r1", "k"),
                key="k",
                held_leases=(good, never),
                rebind_active=True,
            )
        )
    assert info.value.target == "rec:r1"
    assert store.resolve(Query(key="k")) is None


def test_release_is_idempotent(store: Store, clock: FakeClock) -> None:
    store.release_lease(Lease("never", "alice", "1-abc"))
    lease = store.acquire_lease("t", "alice", 10)
    store.release_lease(lease)
    store.release_lease(lease)
    clock.advance(100)
    store.release_lease(lease)
    taken = store.acquire_lease("t", "bob", 10)
    store.release_lease(lease)  # stale after a takeover: ignored
    with pytest.raises(BusyError):
        store.acquire_lease("t", "carol", 10)
    store.release_lease(taken)
    store.acquire_lease("t", "carol", 10)


def test_already_exists_changes_nothing(store: Store) -> None:
    start(store, "r1", "k")
    lease = store.acquire_lease("key:k", "forker", 10)
    with pytest.raises(AlreadyExistsError) as info:
        store.finalize(
            FinalizeRequest(
                record=make_record("fork", "k"),
                previous_id="r1",
                key="k",
                held_leases=(lease,),
                archive_old=True,
                rebind_active=True,
                require_key_absent=True,
            )
        )
    assert info.value.key == "k"
    assert store.resolve(Query(key="k")) == make_record("r1", "k")
    assert store.resolve(Query(id="fork", include_archived=True)) is None


def test_lease_is_checked_before_key_absence(store: Store, clock: FakeClock) -> None:
    start(store, "r1", "k")
    lease = store.acquire_lease("key:k", "alice", 10)
    clock.advance(10)
    with pytest.raises(LeaseLostError):
        store.finalize(
            FinalizeRequest(
                record=make_record("r2", "k"),
                key="k",
                held_leases=(lease,),
                rebind_active=True,
                require_key_absent=True,
            )
        )


def test_start_new_archives_the_previous_record_and_rebinds(store: Store, clock: FakeClock) -> None:
    old = start(store, "r1", "k")
    clock.advance(5)
    lease = store.acquire_lease("key:k", "alice", 10)
    new = make_record("r2", "k", data={"turn": "1"})
    store.finalize(
        FinalizeRequest(
            record=new,
            previous_id="r1",
            key="k",
            held_leases=(lease,),
            archive_old=True,
            rebind_active=True,
        )
    )
    assert store.resolve(Query(key="k")) == new
    assert store.resolve(Query(id="r2")) == new
    assert store.resolve(Query(id="r1")) is None
    archived = store.resolve(Query(id="r1", include_archived=True))
    assert archived == dataclasses.replace(old, status="archived", updated_at=at(clock.now))


def test_without_rebind_the_key_keeps_its_record(store: Store) -> None:
    old = start(store, "r1", "k")
    lease = store.acquire_lease("key:k", "alice", 10)
    store.finalize(FinalizeRequest(record=make_record("r2", "k"), held_leases=(lease,)))
    assert store.resolve(Query(key="k")) == old
    assert store.resolve(Query(id="r2")) == make_record("r2", "k")


def test_archive_without_rebind_hides_the_key_unless_asked(store: Store, clock: FakeClock) -> None:
    start(store, "r1", "k")
    store.finalize(
        FinalizeRequest(record=make_record("r2", "k"), previous_id="r1", archive_old=True)
    )
    assert store.resolve(Query(key="k")) is None
    found = store.resolve(Query(key="k", include_archived=True))
    assert found is not None and found.id == "r1" and found.status == "archived"
    # An archived mapping does not block a new active record for the key.
    store.finalize(
        FinalizeRequest(
            record=make_record("r3", "k"), key="k", rebind_active=True, require_key_absent=True
        )
    )
    assert store.resolve(Query(key="k")) == make_record("r3", "k")


def test_continue_updates_the_same_record_in_place(store: Store) -> None:
    start(store, "r1", "k")
    lease = store.acquire_lease("key:k", "alice", 10)
    turn2 = make_record("r1", "k", data={"turn": "2"})
    store.finalize(
        FinalizeRequest(
            record=turn2, previous_id="r1", key="k", held_leases=(lease,), rebind_active=True
        )
    )
    assert store.resolve(Query(key="k")) == turn2


def test_fork_by_finalize_leaves_the_parent_unchanged(store: Store) -> None:
    parent = start(store, "p", "parent")
    parent_lease = store.acquire_lease("rec:p", "forker", 10)
    key_lease = store.acquire_lease("key:child", "forker", 10)
    child = make_record("c", "child", data={"forked_from": "p"})
    store.finalize(
        FinalizeRequest(
            record=child,
            previous_id="p",
            key="child",
            held_leases=(key_lease, parent_lease),
            rebind_active=True,
            require_key_absent=True,
        )
    )
    assert store.resolve(Query(key="parent")) == parent
    assert store.resolve(Query(id="p")) == parent
    assert store.resolve(Query(key="child")) == child
    with pytest.raises(AlreadyExistsError):
        store.finalize(
            FinalizeRequest(
                record=make_record("c2", "child"),
                key="child",
                held_leases=(key_lease,),
                rebind_active=True,
                require_key_absent=True,
            )
        )
    assert store.resolve(Query(key="child")) == child


def test_resolve_returns_copies(store: Store) -> None:
    record = make_record("r1", "k", data={"a": "1"})
    store.finalize(FinalizeRequest(record=record, key="k", rebind_active=True))
    record.state.data["a"] = "changed by the caller"  # type: ignore[index, union-attr]
    found = store.resolve(Query(id="r1"))
    assert found is not None and found.state is not None
    assert found.state.data == {"a": "1"}
    found.state.data["a"] = "changed again"  # type: ignore[index]
    again = store.resolve(Query(key="k"))
    assert again is not None and again.state is not None
    assert again.state.data == {"a": "1"}
    assert again is not found


def test_records_without_state_round_trip(store: Store) -> None:
    record = dataclasses.replace(make_record("r1", "k"), state=None)
    store.finalize(FinalizeRequest(record=record))
    assert store.resolve(Query(id="r1")) == record


def test_timestamps_come_back_in_utc(store: Store) -> None:
    local = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=5)))
    record = dataclasses.replace(make_record("r1", "k"), created_at=local, updated_at=local)
    store.finalize(FinalizeRequest(record=record))
    found = store.resolve(Query(id="r1"))
    assert found is not None
    assert found.created_at == local and found.created_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("key", OPAQUE_KEYS, ids=range(len(OPAQUE_KEYS)))
def test_any_opaque_key_works(make_store: Callable[[], Store], key: str) -> None:
    store = make_store()
    lease = store.acquire_lease(key, "alice", 10)
    with pytest.raises(BusyError) as info:
        store.acquire_lease(key, "bob", 10)
    assert info.value.target == key
    record = make_record(key, key)  # as a record id too
    store.finalize(
        FinalizeRequest(record=record, key=key, held_leases=(lease,), rebind_active=True)
    )
    with pytest.raises(AlreadyExistsError) as exists:
        store.finalize(
            FinalizeRequest(
                record=make_record("other", key),
                key=key,
                rebind_active=True,
                require_key_absent=True,
            )
        )
    assert exists.value.key == key
    reopened = make_store()
    assert reopened.resolve(Query(key=key)) == record
    assert reopened.resolve(Query(id=key)) == record
    assert reopened.resolve(Query(key=key + "x")) is None
    reopened.release_lease(lease)
    reopened.acquire_lease(key, "bob", 10)


def test_query_needs_exactly_one_non_empty_selector() -> None:
    for bad in ({}, {"id": "a", "key": "b"}, {"id": ""}, {"key": ""}, {"include_archived": True}):
        with pytest.raises(ValueError):
            Query(**bad)
    with pytest.raises(TypeError):
        Query(key=1)  # type: ignore[arg-type]
    assert Query(key="k").include_archived is False


def test_invalid_arguments_are_rejected_before_anything_changes(store: Store) -> None:
    with pytest.raises(ValueError):
        store.acquire_lease("t", "o", 0)
    with pytest.raises(ValueError):
        store.acquire_lease("t", "o", float("nan"))
    with pytest.raises(ValueError):
        store.acquire_lease("t", "o", 1e300)
    with pytest.raises(TypeError):
        store.acquire_lease("t", "o", "60")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.acquire_lease("", "o", 1)
    with pytest.raises(ValueError):
        store.acquire_lease("t", "\ud800", 1)  # cannot be written as UTF-8 JSON
    record = make_record("r1", "k")
    with pytest.raises(ValueError):  # the key index would disagree with the record
        store.finalize(FinalizeRequest(record=record, key="other", rebind_active=True))
    with pytest.raises(ValueError):
        store.finalize(FinalizeRequest(record=record, rebind_active=True))
    with pytest.raises(ValueError):
        store.finalize(FinalizeRequest(record=record, previous_id="r1", archive_old=True))
    with pytest.raises(TypeError):
        store.finalize(
            FinalizeRequest(
                record=dataclasses.replace(record, state=SessionState("x", data={"n": 1}))  # type: ignore[dict-item]
            )
        )
    with pytest.raises(ValueError):
        dataclasses.replace(record, created_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        dataclasses.replace(record, status="deleted")  # type: ignore[arg-type]
    assert store.resolve(Query(id="r1", include_archived=True)) is None
    store.acquire_lease("t", "o", 1)


def test_threads_racing_for_one_lease_get_exactly_one_winner(
    make_store: Callable[[], Store],
) -> None:
    stores = [make_store() for _ in range(2)]  # two JSONL instances share the directory
    barrier = threading.Barrier(8)
    winners: list[str] = []
    errors: list[BaseException] = []

    def contend(i: int) -> None:
        barrier.wait()
        try:
            stores[i % 2].acquire_lease("contested", f"owner-{i}", 30)
        except BusyError:
            return
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        else:
            winners.append(f"owner-{i}")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(winners) == 1


def test_store_errors_travel_on_the_wire(store: Store) -> None:
    store.acquire_lease("t", "alice", 10)
    with pytest.raises(BusyError) as info:
        store.acquire_lease("t", "bob", 10)
    back = from_wire(to_wire(info.value))
    assert type(back) is BusyError and back.target == "t"


def test_lease_generation_parses_the_token() -> None:
    assert Lease("t", "o", "42-abcdef").generation == 42
    for token in ("", "abc", "x-1", "-1", "٣-arabic-digit"):
        with pytest.raises(ValueError):
            _ = Lease("t", "o", token).generation


# --- hypothesis: random operation sequences against a simple model ---------------------------

TARGETS = ["key:a", "key:../b", "rec:r1"]
OWNERS = ["o1", "o2"]
IDS = ["r1", "r2", "r3"]
KEYS = ["a", "../b"]
TTLS = [1.0, 5.0, 30.0]


class Model:
    """The contract written as plainly as possible, independent of the stores' shared code."""

    def __init__(self) -> None:
        self.now = START
        self.records: dict[str, Record] = {}
        self.keys: dict[str, str] = {}
        self.leases: dict[str, tuple[str, str, float]] = {}  # target -> owner, token, until
        self.top_generation = 0

    def live(self, target: str) -> tuple[str, str, float] | None:
        lease = self.leases.get(target)
        return lease if lease is not None and self.now < lease[2] else None

    def holds(self, lease: Lease) -> bool:
        current = self.live(lease.target)
        return current is not None and current[:2] == (lease.owner, lease.token)

    def resolve(self, query: Query) -> Record | None:
        record_id = query.id if query.id is not None else self.keys.get(query.key or "")
        record = self.records.get(record_id or "")
        if record is None or (record.status == "archived" and not query.include_archived):
            return None
        return record

    def finalize(self, request: FinalizeRequest) -> None:
        for held in request.held_leases:
            if not self.holds(held):
                raise LeaseLostError(held.target)
        active = self.resolve(Query(key=request.key)) if request.key else None
        if request.require_key_absent and active is not None:
            raise AlreadyExistsError(request.key)
        self.records[request.record.id] = request.record
        previous = self.records.get(request.previous_id or "")
        if request.archive_old and previous is not None:
            self.records[previous.id] = dataclasses.replace(
                previous, status="archived", updated_at=at(self.now)
            )
        if request.rebind_active:
            self.keys[request.key] = request.record.id


# Picks are resolved against the model at run time (see _pick) so that most commits hold
# live leases and name existing records; otherwise random sequences almost never archive.
_lease_pick = st.tuples(st.sampled_from([True, True, True, False]), st.integers(0, 6))


def _finalize() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        st.just("finalize"),
        st.sampled_from(IDS),
        st.sampled_from(KEYS),
        st.none() | st.integers(0, 3),
        st.lists(_lease_pick, max_size=2),
        st.sampled_from(["plain", "keyed", "rebind", "fork", "archive+rebind", "archive"]),
    )


OPS = st.one_of(
    st.tuples(
        st.just("acquire"), st.sampled_from(TARGETS), st.sampled_from(OWNERS), st.sampled_from(TTLS)
    ),
    st.tuples(st.just("renew"), _lease_pick, st.sampled_from(TTLS)),
    st.tuples(st.just("release"), _lease_pick),
    # Three times as likely as the other operations: the interesting state comes from commits.
    _finalize(),
    _finalize(),
    _finalize(),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, 10.0, 40.0])),
    st.tuples(st.just("resolve"), st.booleans(), st.sampled_from(IDS + KEYS), st.booleans()),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("switch")),
    st.tuples(st.just("compact")),
)


def _pick(model: Model, pool: list[Lease], pick: tuple[bool, int]) -> Lease | None:
    """A lease the model says is held (``None`` if there is none), or with ``live`` false any
    lease seen so far, stale and forged ones included."""
    live, index = pick
    choices = [lease for lease in pool if model.holds(lease)] if live else pool
    return choices[index % len(choices)] if choices else None


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except (BusyError, LeaseLostError, AlreadyExistsError) as exc:
        return (type(exc).__name__, exc.fields())


def _run_against_model(ops: list[tuple[Any, ...]], make: Callable[[FakeClock], Store]) -> None:
    model = Model()
    clock = FakeClock()
    # Two instances over the same data, used in turns: each must see the other's writes and
    # compactions (for the memory store both are the same object).
    stores = [make(clock), make(clock)]
    store = stores[0]
    pool = [Lease("key:a", "o1", "0-forged")]
    for step, op in enumerate(ops):
        kind = op[0]
        if kind == "acquire":
            _, target, owner, ttl = op
            current = model.live(target)
            got = _outcome(partial(store.acquire_lease, target, owner, ttl))
            if current is not None and current[0] != owner:
                assert got == ("BusyError", {"target": target})
                continue
            assert got[0] == "ok"
            lease = got[1]
            if current is not None:
                assert lease.token == current[1]
            else:
                assert lease.generation > model.top_generation
                model.top_generation = lease.generation
            model.leases[target] = (owner, lease.token, model.now + ttl)
            pool.append(lease)
        elif kind == "renew":
            lease, ttl = _pick(model, pool, op[1]) or pool[0], op[2]
            expected = model.holds(lease)
            got = _outcome(partial(store.renew_lease, lease, ttl))
            if expected:
                assert got == ("ok", None)
                model.leases[lease.target] = (lease.owner, lease.token, model.now + ttl)
            else:
                assert got == ("LeaseLostError", {"target": lease.target})
        elif kind == "release":
            lease = _pick(model, pool, op[1]) or pool[0]
            store.release_lease(lease)
            current = model.leases.get(lease.target)
            if current is not None and current[:2] == (lease.owner, lease.token):
                del model.leases[lease.target]
        elif kind == "finalize":
            _, record_id, key, previous, picks, shape = op
            held = tuple(filter(None, (_pick(model, pool, pick) for pick in picks)))
            known = sorted(model.records) or IDS
            previous_id = None if previous is None else known[previous % len(known)]
            archive = shape.startswith("archive") and previous_id != record_id
            request = FinalizeRequest(
                record=make_record(record_id, key, data={"step": str(step)}),
                previous_id=previous_id,
                key="" if shape in ("plain", "archive") else key,
                held_leases=held,
                archive_old=archive,
                rebind_active=shape in ("rebind", "fork", "archive+rebind"),
                require_key_absent=shape == "fork",
            )
            assert _outcome(partial(store.finalize, request)) == _outcome(
                partial(model.finalize, request)
            )
        elif kind == "tick":
            model.now += op[1]
            clock.now = model.now
        elif kind == "resolve":
            _, by_id, value, include_archived = op
            query = (
                Query(id=value, include_archived=include_archived)
                if by_id
                else Query(key=value, include_archived=include_archived)
            )
            assert store.resolve(query) == model.resolve(query)
        elif kind == "compact":
            if isinstance(store, JSONLStore):
                store.compact()
        elif kind == "switch":
            store = stores[1] if store is stores[0] else stores[0]
        else:
            index = stores.index(store)
            store = stores[index] = make(clock)
    for value in IDS:
        query = Query(id=value, include_archived=True)
        assert store.resolve(query) == model.resolve(query)


MODEL_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@MODEL_SETTINGS
@given(st.lists(OPS, min_size=5, max_size=40))
def test_memory_store_matches_the_model(ops: list[tuple[Any, ...]]) -> None:
    shared: list[memory.Store] = []

    def make(clock: FakeClock) -> Store:
        if not shared:
            shared.append(memory.Store(clock=clock))
        return shared[0]

    _run_against_model(ops, make)


@MODEL_SETTINGS
@given(st.lists(OPS, min_size=5, max_size=40))
def test_jsonl_store_matches_the_model_across_reopens_and_compactions(
    ops: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        opened: list[JSONLStore] = []

        def make(clock: FakeClock) -> Store:
            store = JSONLStore(Path(tmp) / "threads", clock=clock)
            store._compact_after = 3  # compact constantly: snapshots must lose nothing
            opened.append(store)
            return store

        try:
            _run_against_model(ops, make)
        finally:
            for store in opened:
                store.close()


# --- JSONL store: persistence, files, compaction ---------------------------------------------


def test_restart_keeps_records_and_leases(tmp_path: Path) -> None:
    clock = FakeClock()
    with JSONLStore(tmp_path / "threads", clock=clock) as first:
        record = start(first, "r1", "k")
        lease = first.acquire_lease("key:k", "daemon", 60)
    with JSONLStore(tmp_path / "threads", clock=clock) as second:
        assert second.resolve(Query(key="k")) == record
        with pytest.raises(BusyError):
            second.acquire_lease("key:k", "program", 60)
        second.renew_lease(lease, 60)
        assert second.acquire_lease("key:k", "daemon", 60) == lease
        assert second.acquire_lease("elsewhere", "x", 60).generation > lease.generation


def test_a_lease_from_a_previous_boot_is_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "boot-A")
    with JSONLStore(tmp_path / "threads") as before:
        lease = before.acquire_lease("key:k", "daemon", 3600)
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "boot-B")
    with JSONLStore(tmp_path / "threads") as after:
        with pytest.raises(LeaseLostError):
            after.renew_lease(lease, 60)
        taken = after.acquire_lease("key:k", "program", 60)
        assert taken.generation > lease.generation


def test_compaction_keeps_resolve_cost_flat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Line counts are the subject here, not durability (tested above and below): skipping the
    # fsyncs keeps 10,000 turns cheap on slow disks.
    hook_datasyncs(monkeypatch, lambda fd: None)
    directory = tmp_path / "threads"
    writer = JSONLStore(directory)
    lease = writer.acquire_lease("key:k", "alice", 600)
    cost_after: dict[int, int] = {}
    done = 0
    for checkpoint in (1_500, 10_000):
        for turn in range(done + 1, checkpoint + 1):
            writer.finalize(
                FinalizeRequest(
                    record=make_record("r1", "k", data={"turn": str(turn)}),
                    key="k",
                    held_leases=(lease,),
                    rebind_active=True,
                )
            )
        done = checkpoint
        with JSONLStore(directory) as reader:
            found = reader.resolve(Query(key="k"))
            assert found is not None and found.state is not None
            assert found.state.data["turn"] == str(checkpoint)
            cost_after[checkpoint] = reader.lines_read
    # A fresh reader parses the snapshot plus less than one compaction interval of lines.
    assert all(cost < _jsonl._COMPACT_MIN_LINES for cost in cost_after.values()), cost_after
    logs = sorted(p.name for p in directory.iterdir() if p.name.endswith(".jsonl"))
    assert len(logs) == 2  # the current log and the one compacted last (kept until the next)
    assert (directory / "snapshot.json").stat().st_size < 4096
    # A long-lived instance pays only for lines it has not seen yet.
    before = writer.lines_read
    writer.resolve(Query(key="k"))
    assert writer.lines_read == before
    writer.close()


def test_instances_follow_each_others_writes_and_compactions(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as a, JSONLStore(directory) as b:
        start(a, "r1", "k1")
        a.compact()
        assert b.resolve(Query(key="k1")) == make_record("r1", "k1")  # b now holds snapshot 2
        start(a, "r2", "k2")
        a.compact()  # replaces the snapshot b holds open and deletes the log b was reading
        start(a, "r3", "k3")
        for key in ("k1", "k2", "k3"):
            found = b.resolve(Query(key=key))
            assert found is not None and found.key == key
        lease = b.acquire_lease("t", "b", 60)
        b.compact()
        with pytest.raises(BusyError):
            a.acquire_lease("t", "a", 60)
        b.release_lease(lease)
        a.acquire_lease("t", "a", 60)


def test_files_are_private_and_readable_with_jq_style_tools(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "../escape")
        store.acquire_lease("rec:r1", "o", 60)
        store.compact()
        start(store, "r2", "a/b")
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    names = sorted(os.listdir(directory))
    assert names == ["log-000001.jsonl", "log-000002.jsonl", "snapshot.json", "store.lock"]
    for name in names:
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
    assert not (tmp_path / "escape").exists()
    snapshot = json.loads((directory / "snapshot.json").read_text())
    assert snapshot["keys"] == {"../escape": "r1"}
    assert snapshot["log"] == "log-000002.jsonl"
    events = [record for _, record in scan(directory / "log-000002.jsonl")]
    assert [e["kind"] for e in events] == ["lease", "finalize", "lease"]


def test_an_empty_directory_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An unset variable's "" made the current directory a store (its log and lock written there).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="a thread store needs a directory, not an empty path"):
        JSONLStore("")
    assert os.listdir(tmp_path) == []


def test_symlinked_snapshot_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
        store.compact()
    victim = tmp_path / "elsewhere.json"
    (directory / "snapshot.json").rename(victim)
    (directory / "snapshot.json").symlink_to(victim)
    with JSONLStore(directory) as store, pytest.raises(OSError) as info:
        store.resolve(Query(key="k"))
    assert info.value.errno == errno.ELOOP


def test_torn_tail_is_ignored_then_repaired_and_corruption_is_reported(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        record = start(store, "r1", "k")
    log = directory / "log-000001.jsonl"
    whole = log.stat().st_size
    with log.open("ab") as f:
        f.write(b'{"kind":"finalize","rec')  # a crash mid-append
    with JSONLStore(directory) as store:
        assert store.resolve(Query(key="k")) == record
        assert store.repairs == []  # reading cuts nothing
        second = start(store, "r2", "k2")
        assert store.resolve(Query(key="k2")) == second
        # The cut is recorded (storage.md: writers record that they did); it went unsaid.
        [repair] = store.repairs
        assert (repair.path, repair.offset, repair.dropped_bytes) == (str(log), whole, 23)
        assert repair.dropped_preview == '{"kind":"finalize","rec'
    assert len(list(scan(log))) == 6  # strict: the torn bytes are gone
    lines = log.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"finalize", b"finalizE")  # the crc no longer matches
    log.write_bytes(b"".join(lines))
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError) as info:
        store.resolve(Query(key="k"))
    assert info.value.line == 2


@pytest.mark.parametrize(
    "tail",
    ["a newer version's", "a note by hand", "a note of two lines", "a newer version's, then torn",
     "the last two run together"],
)
def test_lines_no_crash_leaves_at_the_end_are_corruption_to_readers_as_to_writers(
    tmp_path: Path, tail: str
) -> None:
    # Readers took any bad last line for a torn append and skipped it: the thread it saved
    # read as missing (`adaptor threads show` exit 4, "offer a new thread") while every write
    # refused the store as corrupt.  Two lines of a note, or a newer adaptor's whole record
    # with a torn one after it, were taken for power-cut damage and cut by the next writer.
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
    log = directory / "log-000001.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    line = len(lines)
    if tail.startswith("a newer version's"):
        newer = unframe(lines[-1].rstrip(b"\n"))
        lines[-1] = frame({**newer, "v": 2})  # whole, in sequence, its crc valid
        if tail.endswith("then torn"):
            lines.append(b'{"crc":1')
        why = "unsupported format version 2"
    elif tail == "the last two run together":
        # (The newline between them changed: the last line began as a record does, and the
        # next writer cut it as torn, the synced finalize before it with it.)
        lines[-2:] = [lines[-2][:-1] + b" " + lines[-1]]
        line -= 1
        why = "invalid json; not a torn record of this log (it holds a whole JSON object and more"
    else:
        lines.append(b"restored from a backup by ops\n")
        if tail == "a note of two lines":
            lines.append(b"see ticket OPS-42\n")
        line += 1
        why = "invalid json; not a torn record of this log"
    log.write_bytes(b"".join(lines))
    damaged = log.read_bytes()
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError) as read:
        store.resolve(Query(key="k"))
    assert read.value.line == line and read.value.why.startswith(why)
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError) as written:
        start(store, "r2", "k2")
    assert written.value.line == line
    assert log.read_bytes() == damaged  # kept as it is: nothing cut


def test_an_empty_last_line_is_torn_to_readers_and_cut_by_the_next_writer(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        record = start(store, "r1", "k")
    log = directory / "log-000001.jsonl"
    whole = log.read_bytes()
    log.write_bytes(whole + b"\n")
    with JSONLStore(directory) as store:
        assert store.resolve(Query(key="k")) == record
        start(store, "r2", "k2")
    assert log.read_bytes().startswith(whole) and b"\n\n" not in log.read_bytes()


def test_an_instance_reads_the_files_afresh_after_reporting_them_changed_under_it(
    tmp_path: Path,
) -> None:
    # A long-lived instance (the daemon's) whose files were restored from a backup or removed
    # failed every later call ("log shrank", "appended line did not read back") until the
    # process was restarted, while any new process read the store fine; and its appends after
    # a removal left leases in the new file that nobody would release.
    directory = tmp_path / "threads"
    log = directory / "log-000001.jsonl"
    store = JSONLStore(directory)
    first = start(store, "r1", "k")
    backup = log.read_bytes()
    start(store, "r2", "k2")

    def changed_by_hand() -> None:
        # A person's edit takes longer than the store's lock lingers; let it go now.
        _durable.release_lingering(directory / "store.lock")

    log.write_bytes(backup)  # restored in place: an acknowledged finalize is gone
    changed_by_hand()
    with pytest.raises(CorruptLogError, match="shrank"):
        store.resolve(Query(key="k2"))
    # Said once; then the files as they stand, as a new instance reads them.
    assert store.resolve(Query(key="k2")) is None
    assert store.resolve(Query(key="k")) == first
    start(store, "r3", "k3")

    log.unlink()  # the store cleared by hand
    changed_by_hand()
    with pytest.raises(CorruptLogError, match="removed or replaced"):
        store.acquire_lease("key:k4", "o", 60)
    assert not log.exists()  # nothing appended to a file this instance had not read
    lease = store.acquire_lease("key:k4", "o", 60)
    assert store.resolve(Query(key="k")) is None
    store.release_lease(lease)
    store.close()
    with JSONLStore(directory) as fresh:
        assert fresh.resolve(Query(key="k3")) is None
        fresh.acquire_lease("key:k4", "other", 60)  # released: no lease left behind


def test_missing_snapshot_with_later_logs_is_corruption_not_an_empty_store(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
        store.compact()
        start(store, "r2", "k2")
    (directory / "snapshot.json").unlink()
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError):
        store.resolve(Query(key="k"))


def test_a_snapshot_lost_right_after_its_compaction_never_looks_like_an_empty_store(
    tmp_path: Path,
) -> None:
    # Until the next write made the new log, nothing showed a snapshot had ever existed: the
    # store came back empty (every thread gone), and its next write started generation 1 again.
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
        store.compact()
    (directory / "snapshot.json").unlink()
    with JSONLStore(directory) as store:  # log 1, the whole history, is still there: read it
        found = store.resolve(Query(key="k"))
        assert found is not None and found.id == "r1"
        start(store, "r2", "k2")
        store.compact()
        store.compact()  # nothing written since the last: its log is still the newest kept
    (directory / "snapshot.json").unlink()
    with JSONLStore(directory) as store:
        assert [store.resolve(Query(key=key)) is not None for key in ("k", "k2")] == [True, True]
        start(store, "r3", "k3")
        store.compact()
        start(store, "r4", "k4")  # now in log 2: log 1 alone would no longer be the history
        store.compact()
    (directory / "snapshot.json").unlink()
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError, match="missing"):
        store.resolve(Query(key="k"))


def test_the_current_log_removed_by_hand_is_damage_not_an_older_state(tmp_path: Path) -> None:
    # The newest log-NNNNNN.jsonl removed ("cleaning up old logs") read as "nothing appended
    # since the compaction": every turn saved since went back to the snapshot's state, and
    # `adaptor threads` listed one thread fewer, exit 0.
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
        store.compact()
        assert (directory / "log-000002.jsonl").read_bytes() == b""  # made with the snapshot
        start(store, "r2", "newest")
    (directory / "log-000002.jsonl").unlink()
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError) as info:
        store.resolve(Query(key="newest"))
    assert info.value.path == str(directory / "log-000002.jsonl")
    assert info.value.why == "the log is missing; snapshot.json names it (made with it)"
    # A snapshot an earlier version wrote made no log: its missing log is no damage.
    snapshot = json.loads((directory / "snapshot.json").read_text())
    del snapshot["log_made"]
    (directory / "snapshot.json").write_text(json.dumps(snapshot))
    with JSONLStore(directory) as store:
        found = store.resolve(Query(key="k"))
        assert found is not None and found.id == "r1"


def test_a_compaction_that_failed_after_making_its_log_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")

        def failing(path: Any, obj: Any, durable: bool = True) -> None:
            raise OSError(errno.ENOSPC, "injected")

        monkeypatch.setattr(_jsonl, "atomic_write_json", failing)
        with pytest.raises(OSError, match="injected"):
            store.compact()
        monkeypatch.undo()
        assert (directory / "log-000002.jsonl").read_bytes() == b"" and not (directory / "snapshot.json").exists()
    with JSONLStore(directory) as store:  # the empty log of the failed compaction is nothing
        start(store, "r2", "k2")
        store.compact()
        start(store, "r3", "k3")
        assert [store.resolve(Query(key=k)) is not None for k in ("k", "k2", "k3")] == [True] * 3
    (directory / "log-000003.jsonl").write_bytes(b"{}\n")  # the next generation's, not empty
    with JSONLStore(directory) as store:
        # (An OSError: one after a commit is a warning, the commit standing; see _commit.)
        with pytest.raises(FileExistsError, match="not empty"):
            store.compact()
        start(store, "r4", "k4")
        assert store.resolve(Query(key="k4")) is not None


def test_a_lock_file_without_its_log_does_not_count_as_the_log_kept(tmp_path: Path) -> None:
    # The newest earlier log is kept through a compaction; a stray lock of a later generation
    # (its log never written) made it delete log 1, the only one holding the history.
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k")
        store.compact()
        store.compact()
        (directory / "log-000002.jsonl.lock").touch()
        store.compact()
    assert (directory / "log-000001.jsonl").exists()


def _finalize_failing_its_sync(
    store: Store, request: FinalizeRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``store.finalize(request)`` with its data sync failing, as a full or failing disk does."""

    def broken_sync(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    hook_datasyncs(monkeypatch, broken_sync)
    with pytest.raises(OSError, match="injected"):
        store.finalize(request)
    monkeypatch.undo()


def test_a_failed_fsync_fails_loudly_and_the_instance_stops_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    store = JSONLStore(directory)
    kept = start(store, "r1", "k")
    _finalize_failing_its_sync(store, FinalizeRequest(record=make_record("r2", "k2"), key="k2"), monkeypatch)
    # Never retried as if nothing happened: this instance refuses every later write ...
    with pytest.raises(OSError, match="earlier write"):
        store.acquire_lease("t", "o", 10)
    store.close()
    # ... and a fresh one re-reads the files: the unacknowledged finalize is not there.
    with JSONLStore(directory) as fresh:
        assert fresh.resolve(Query(key="k")) == kept
        assert fresh.resolve(Query(key="k2")) is None
        fresh.acquire_lease("t", "o", 10)


def test_the_daemons_store_opens_afresh_after_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A JSONLStore stops writing after a failed write (above); the daemon's store fails that
    # call too, then goes on with a new instance, which reads the files again.
    directory = tmp_path / "threads"
    store = ReopeningStore(directory)
    kept = start(store, "r1", "k")
    held = store.acquire_lease("key:k2", "o", 60)
    request = FinalizeRequest(record=make_record("r2", "k2"), key="k2", held_leases=(held,))
    _finalize_failing_its_sync(store, request, monkeypatch)
    store.release_lease(held)  # a plain JSONLStore: "an earlier write to this store failed"
    assert store.resolve(Query(key="k")) == kept
    assert store.resolve(Query(key="k2")) is None  # the failed finalize is not there
    start(store, "r3", "k2")
    store.close()
    with JSONLStore(directory) as fresh:
        assert fresh.resolve(Query(key="k2")) == make_record("r3", "k2")
        fresh.acquire_lease("key:k2", "other", 60)  # released, not left to expire


def test_a_failed_compaction_does_not_fail_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    store = JSONLStore(directory)
    store._compact_after = 3

    def full_disk(path: object, obj: object) -> None:
        raise OSError(errno.ENOSPC, "injected")

    monkeypatch.setattr(_jsonl, "atomic_write_json", full_disk)
    with pytest.warns(RuntimeWarning, match="compaction failed"):
        record = start(store, "r1", "k")
    assert store.resolve(Query(key="k")) == record
    assert not (directory / "snapshot.json").exists()
    monkeypatch.undo()
    store.acquire_lease("t", "o", 10)  # the next append compacts
    assert (directory / "snapshot.json").exists()
    store.close()
    with JSONLStore(directory) as fresh:
        assert fresh.resolve(Query(key="k")) == record
        with pytest.raises(BusyError):
            fresh.acquire_lease("t", "other", 10)


@pytest.mark.parametrize("first_compaction", [True, False])
def test_a_compaction_that_failed_after_replacing_the_snapshot_stops_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_compaction: bool
) -> None:
    # The rename happened, the directory sync did not: the new snapshot is what everybody
    # follows now.  Appending to the old log would write lines nobody reads.
    directory = tmp_path / "threads"
    store = JSONLStore(directory)
    kept = start(store, "r1", "k")
    if not first_compaction:
        store.compact()
    real_fsync_dir = _durable.fsync_dir

    def fails_for_the_store(path: Any) -> None:
        if os.path.samefile(path, directory):
            raise OSError(errno.EIO, "injected directory fsync failure")
        real_fsync_dir(path)

    monkeypatch.setattr(_durable, "fsync_dir", fails_for_the_store)
    with pytest.raises(OSError, match="injected"):
        store.compact()
    monkeypatch.undo()
    with pytest.raises(OSError, match="earlier write"):
        store.finalize(FinalizeRequest(record=make_record("r2", "k2"), key="k2"))
    store.close()
    with JSONLStore(directory) as fresh:
        assert fresh.resolve(Query(key="k")) == kept
        later = start(fresh, "r2", "k2")
    with JSONLStore(directory) as reader:
        assert reader.resolve(Query(key="k2")) == later


def test_closed_store_refuses_calls_without_taking_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JSONLStore(tmp_path / "threads")
    store.close()
    released = count_releases(monkeypatch, tmp_path / "threads" / "store.lock")
    store.close()  # idempotent, and as quick
    with pytest.raises(ValueError, match="closed"):
        store.resolve(Query(key="k"))
    with pytest.raises(ValueError, match="closed"):
        store.acquire_lease("key:k", "owner", 60)
    _durable.release_lingering(tmp_path / "threads" / "store.lock")
    assert released == []  # never taken, so it kept nobody waiting and nothing lingers


def test_a_store_dropped_without_close_leaves_no_descriptor_open(tmp_path: Path) -> None:
    # A program making a JSONLStore per request (as sdk.md's `Agent(driver,
    # thread_store=JSONLStore(dir))` invites) and never closing it kept two or three descriptors
    # per store (the log it read, the log it wrote, the snapshot) until it ran out of them.
    import gc

    directory = tmp_path / "threads"

    def open_descriptors() -> int:
        # The lock's own descriptor stays open while it lingers (a few ms after each call).
        _durable.release_lingering(directory / "store.lock")
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    def one_request(n: int) -> None:
        store = JSONLStore(directory)
        store._compact_after = 4  # so the snapshot is opened too
        for i in range(3):
            lease = store.acquire_lease("key:k", f"owner-{n}", 60)
            store.finalize(
                FinalizeRequest(
                    record=make_record(f"r{n}-{i}", "k"), key="k", held_leases=(lease,),
                    rebind_active=True,
                )
            )
            store.release_lease(lease)

    one_request(0)  # the lock registry, the reaper thread and the like, made once
    before = open_descriptors()
    for n in range(1, 21):
        one_request(n)
    assert open_descriptors() == before
    with JSONLStore(directory) as reader:
        assert reader.resolve(Query(key="k")) is not None


def test_a_process_gives_the_store_lock_away_between_cycles_not_within_a_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every plain hold is past the maximum; one within a lease is not.  Had the lock gone to
    # another process mid-cycle, it would have found this key busy.
    past_the_maximum_hold(monkeypatch)
    with JSONLStore(tmp_path / "threads") as store:
        start(store, "r0", "k")  # the flock is taken, and lingers from here on
        released = count_releases(monkeypatch, tmp_path / "threads" / "store.lock")
        lease = store.acquire_lease("key:k", "owner", 60)
        assert len(released) == 1  # a cycle's start: given away (and taken again)
        store.renew_lease(lease, 60)
        store.finalize(
            FinalizeRequest(
                record=make_record("r1", "k"), key="k", held_leases=(lease,), rebind_active=True
            )
        )
        store.release_lease(lease)
        assert len(released) == 1  # kept within the lease
        assert store.resolve(Query(key="k")) == make_record("r1", "k")
        assert len(released) == 2  # the next plain hold gives it away again


# --- JSONL store: real processes -------------------------------------------------------------


def _child(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _child_op(
    directory: Path, spec: dict[str, Any], clock_offset: float | str = 0.0, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``spec`` done by a process of its own; ``clock_offset``: seconds its store's wall clock is
    ahead, or ``"real"`` (the store's own clocks); ``env``: its environment."""
    proc = _child("op", str(directory), str(clock_offset), json.dumps(spec), env=env)
    out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def test_two_processes_get_busy_lease_lost_and_already_exists(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as daemon:
        mine = daemon.acquire_lease("key:k", "daemon", 600)
        assert _child_op(
            directory, {"op": "acquire", "target": "key:k", "owner": "program", "ttl": 600}
        ) == {"ok": False, "error": "BusyError", "fields": {"target": "key:k"}}
        daemon.finalize(
            FinalizeRequest(
                record=make_record("r1", "k"), key="k", held_leases=(mine,), rebind_active=True
            )
        )
        assert _child_op(
            directory, {"op": "finalize", "id": "fork", "key": "k", "require_key_absent": True}
        ) == {"ok": False, "error": "AlreadyExistsError", "fields": {"key": "k"}}
        # The program's clock is 20 minutes ahead: to it the daemon's lease has expired.
        taken = _child_op(
            directory, {"op": "acquire", "target": "key:k", "owner": "program", "ttl": 600}, 1200
        )
        assert taken["ok"] is True
        assert Lease("key:k", "program", taken["token"]).generation > mine.generation
        with pytest.raises(LeaseLostError):
            daemon.finalize(
                FinalizeRequest(
                    record=make_record("r2", "k"),
                    previous_id="r1",
                    key="k",
                    held_leases=(mine,),
                    archive_old=True,
                    rebind_active=True,
                )
            )
        assert daemon.resolve(Query(key="k")) == make_record("r1", "k")
        with pytest.raises(LeaseLostError):
            daemon.renew_lease(mine, 600)
        daemon.release_lease(mine)  # stale: ignored
    stale = {"target": "key:k", "owner": "daemon", "token": mine.token}
    assert _child_op(directory, {"op": "renew", "held": [stale], "ttl": 60}, 1200) == {
        "ok": False,
        "error": "LeaseLostError",
        "fields": {"target": "key:k"},
    }


def _faketime() -> str:
    """libfaketime, which makes a process's wall clock what a file or variable says."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("needs libfaketime (apt: libfaketime)")
    return found[0]


def test_a_wall_clock_step_neither_frees_a_live_lease_nor_takes_it_from_its_holder(tmp_path: Path) -> None:
    # Leases expired by the wall clock alone: stepped an hour forward (NTP correcting a skewed
    # clock, a VM resumed), a live lease looked expired; another process took the thread while
    # its holder's agent still worked, and the holder's renewal and save failed with
    # LeaseLostError, its turn thrown away.  Every process of one boot shares the monotonic clock.
    directory, step = tmp_path / "threads", tmp_path / "step"
    step.write_text("+0")
    holding = {
        **os.environ, "LD_PRELOAD": _faketime(), "FAKETIME_TIMESTAMP_FILE": str(step), "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    holder = _child("hold-across", str(directory), "key:k", "k", env=holding, stdin=subprocess.PIPE)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        started = json.loads(holder.stdout.readline())["time"]
        assert abs(started - time.time()) < 600
        step.write_text("+3600")  # its wall clock an hour ahead from now on; so another process's
        ahead = {**os.environ, "LD_PRELOAD": holding["LD_PRELOAD"], "FAKETIME": "+3600",
                 "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        assert _child_op(directory, {"op": "now"}, "real", ahead)["time"] > time.time() + 3000
        taken = _child_op(directory, {"op": "acquire", "target": "key:k", "owner": "other", "ttl": 300}, "real", ahead)
        assert taken == {"ok": False, "error": "BusyError", "fields": {"target": "key:k"}}
        holder.stdin.write("go on\n")
        holder.stdin.flush()
        ended = json.loads(holder.stdout.readline())
        assert ended["ok"] is True, ended
        assert ended["time"] > time.time() + 3000  # (it did see the step)
        assert holder.wait(timeout=CHILD_TIMEOUT) == 0
    finally:
        holder.kill()
        holder.communicate()
    with JSONLStore(directory) as store:
        saved = store.resolve(Query(key="k"))
        assert saved is not None and saved.id == "r1"
    # Released, the thread is free to any clock.
    taken = _child_op(directory, {"op": "acquire", "target": "key:k", "owner": "other", "ttl": 300}, "real", ahead)
    assert taken["ok"] is True


_PROC = pytest.mark.skipif(not os.path.isdir("/proc/self/ns"), reason="holders are told in /proc")


@_PROC
def test_a_lease_whose_holding_process_died_is_free_at_once(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    child = _child("hold", str(directory), "key:k", "crashed")
    try:
        assert child.stdout is not None
        held = Lease(**json.loads(child.stdout.readline()))
        with JSONLStore(directory) as store, pytest.raises(BusyError):
            store.acquire_lease("key:k", "next", 60)  # its holder is alive: a TTL of an hour
    finally:
        child.kill()
        child.communicate(timeout=CHILD_TIMEOUT)
    with JSONLStore(directory) as store:
        taken = store.acquire_lease("key:k", "next", 60)
        assert taken.generation > held.generation
        # Fenced as ever: the dead holder's token is refused.
        with pytest.raises(LeaseLostError):
            store.renew_lease(held, 60)
        with pytest.raises(LeaseLostError):
            store.finalize(
                FinalizeRequest(
                    record=make_record("r1", "k"), key="k", held_leases=(held,), rebind_active=True
                )
            )


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _lease_held_by(holder: dict[str, Any] | None) -> dict[str, Any]:
    lease: dict[str, Any] = {
        "owner": "other",
        "token": "1-x",
        "generation": 1,
        "expires": datetime.now(UTC).timestamp() + 3600,
        "expires_at": "",
        "boot_id": _jsonl.current_boot_id(),
    }
    if holder is not None:
        lease["holder"] = holder
    return lease


@_PROC
def test_a_holder_is_judged_dead_only_when_that_is_certain() -> None:
    from adaptor.threadstore import _holder
    from adaptor.threadstore._state import State

    mine = _holder.current()
    assert mine is not None
    dead = {**mine, "pid": _dead_pid()}
    [(parent, parent_start)] = identities([os.getppid()])
    cases = {
        # name: (the lease's holder, whether the lease is then gone)
        "no holder recorded (an older log)": (None, False),
        "a live process": ({**mine, "pid": parent, "start": parent_start}, False),
        "a dead process": (dead, True),
        "its pid reused by a later process": ({**mine, "start": mine["start"] - 1}, True),
        "another pid namespace": ({**dead, "pidns": "pid:[1]"}, False),
        "another user": ({**dead, "uid": mine["uid"] + 1}, False),
    }
    now = datetime.now(UTC).timestamp()
    for name, (holder, gone) in cases.items():
        state = State()
        state.leases["key:k"] = _lease_held_by(holder)
        state.next_generation = 2
        if gone:
            lease, _ = state.plan_acquire("key:k", "me", 60, now, _jsonl.current_boot_id(), mine)
            assert lease.generation == 2, name
        else:
            with pytest.raises(BusyError):
                state.plan_acquire("key:k", "me", 60, now, _jsonl.current_boot_id(), mine)


def test_processes_racing_never_share_a_lease_and_lose_no_finalize(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    witness = tmp_path / "witness.jsonl"
    keys = ["a", "b/../c", "ü"]
    workers, cycles = 4, 25
    procs = [
        _child("cycles", str(directory), str(witness), f"w{i}", str(cycles), "8", *keys)
        for i in range(workers)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == 0, err
        assert json.loads(out)["cycles"] == cycles
    holder: dict[str, str | None] = dict.fromkeys(keys)
    commits: dict[str, int] = dict.fromkeys(keys, 0)
    for _, event in scan(witness):
        key, owner = event["key"], event["owner"]
        if event["event"] == "enter":
            assert holder[key] is None, f"{owner} entered while {holder[key]} held {key!r}"
            holder[key] = owner
        elif event["event"] == "commit":
            assert holder[key] == owner
            # Each holder saw the previous holder's finalize: no update was lost.
            assert event["n"] == commits[key] + 1
            commits[key] += 1
        else:
            assert holder[key] == owner
            holder[key] = None
    assert sum(commits.values()) == workers * cycles
    with JSONLStore(directory) as store:
        for key in keys:
            found = store.resolve(Query(key=key))
            assert found is not None and found.state is not None
            assert found.state.data["n"] == str(commits[key])


class _Acks:
    """The numbers a child prints, read straight from the pipe's descriptor.

    Going through ``proc.stdout`` would buffer lines the parent never looks at, and
    ``communicate`` reads the descriptor, not that buffer: acknowledgements would go missing.
    """

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._pending = b""
        self.last = 0

    def wait_for(self, wanted: int) -> None:
        while self.last < wanted:
            ready, _, _ = select.select([self._fd], [], [], CHILD_TIMEOUT)
            assert ready, "child produced no output in time"
            chunk = os.read(self._fd, 65536)
            assert chunk, "child exited early"
            self._take(chunk)

    def drain(self) -> None:
        while chunk := os.read(self._fd, 65536):
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            self.last = int(line)


def test_sigkill_mid_finalize_loses_nothing_acknowledged(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    # Different kill points per round; compaction every 16 lines in the child, so some kills
    # land in or next to a compaction.
    n = 0
    for round_, more in enumerate((3, 17, 40, 9, 33, 25)):
        proc = _child("finalize-loop", str(directory), "the/key")
        acks = _Acks(proc)
        try:
            acks.wait_for(n + more)
        finally:
            proc.send_signal(signal.SIGKILL)
            acks.drain()  # anything printed before the kill was acknowledged too
            _, err = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == -signal.SIGKILL, err
        acked = acks.last
        with JSONLStore(directory) as store:
            active = store.resolve(Query(key="the/key"))
            assert active is not None, f"round {round_}"
            n = int(active.id.removeprefix("r"))
            # The last acknowledged finalize is there; at most one more (done, not yet printed).
            assert acked <= n <= acked + 1
            assert active.state is not None and active.state.data["n"] == str(n)
            # Nothing half-applied: every earlier record archived, no later record saved.
            for i in range(1, n):
                assert store.resolve(Query(id=f"r{i}")) is None
                old = store.resolve(Query(id=f"r{i}", include_archived=True))
                assert old is not None and old.status == "archived"
            assert store.resolve(Query(id=f"r{n + 1}", include_archived=True)) is None
    for path in directory.glob("log-*.jsonl"):
        for _ in scan(path, strict=False):
            pass


# --- JSONL store: which appends are synced, and power cuts -----------------------------------


def test_only_finalizes_and_reservations_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = count_datasyncs(monkeypatch, tmp_path)
    with JSONLStore(tmp_path / "threads") as store:
        first = store.acquire_lease("key:a", "o", 60)  # reserves a block of generations
        assert len(syncs) == 1
        store.finalize(
            FinalizeRequest(
                record=make_record("r1", "a"), key="a", held_leases=(first,), rebind_active=True
            )
        )
        assert len(syncs) == 2
        store.renew_lease(first, 60)
        store.release_lease(first)
        second = store.acquire_lease("key:b", "o", 60)  # within the reservation
        store.release_lease(second)
        assert len(syncs) == 2
        assert second.generation == first.generation + 1
    events = [record for _, record in scan(tmp_path / "threads" / "log-000001.jsonl")]
    assert [("reserve" in e, "boot" in e) for e in events] == [
        (True, False),  # grant with a reservation: synced, needs no boot stamp
        (False, False),  # finalize: synced
        (False, True),  # renew, release, grant, release: unsynced, stamped with their boot
        (False, True),
        (False, True),
        (False, True),
    ]
    assert events[0]["reserve"] == first.generation + RESERVE_BLOCK - 1


def _power_cut_log(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Lease:
    """A store written under boot "old": a synced finalize, then unsynced lease events."""
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "old")
    with JSONLStore(directory) as store:
        start(store, "r1", "k")  # grant (synced: reservation), finalize (synced), release
        lease = store.acquire_lease("key:other", "o", 600)
        store.renew_lease(lease, 600)
        store.release_lease(lease)
    return lease


def _damage_line(path: Path, index: int) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    # What a power cut can leave in a page that never reached the disk: zeros.
    lines[index] = b"\0" * (len(lines[index]) - 1) + b"\n"
    path.write_bytes(b"".join(lines))


def test_power_cut_damage_in_unsynced_lease_events_is_cut_after_a_reboot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    lost = _power_cut_log(directory, monkeypatch)
    log = directory / "log-000001.jsonl"
    synced = sum(map(len, log.read_bytes().splitlines(keepends=True)[:2]))
    _damage_line(log, 3)  # the grant of key:other; its renew and release follow intact
    damaged = log.stat().st_size
    cut_at = sum(map(len, log.read_bytes().splitlines(keepends=True)[:3]))
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "new")
    with JSONLStore(directory) as store:
        assert store.resolve(Query(key="k")) == make_record("r1", "k")
        fresh = store.acquire_lease("key:other", "p", 60)
        [repair] = store.repairs  # the damage and the lines after it, cut: recorded
        assert (repair.offset, repair.dropped_bytes) == (cut_at, damaged - cut_at)
        assert repair.dropped_preview.startswith("\0")
        # Past every generation the old boot could have handed out without a sync.
        assert fresh.generation > lost.generation
        assert fresh.generation == RESERVE_BLOCK + 1
    events = [record for _, record in scan(log)]  # valid again, damage and all after it gone
    assert [e["kind"] for e in events] == ["lease", "finalize", "lease", "lease"]
    assert len(log.read_bytes()) > synced


def test_damage_that_no_power_cut_explains_stays_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    _power_cut_log(directory, monkeypatch)
    log = directory / "log-000001.jsonl"
    _damage_line(log, 3)
    before = log.read_bytes()
    # Same boot: the page cache never lost anything, so this is not a crash artifact.
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError):
        store.resolve(Query(key="k"))
    # Another boot, but a synced line (the finalize) follows the damage: it flushed the line.
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "new")
    _damage_line(log, 0)
    damaged = log.read_bytes()
    with JSONLStore(directory) as store, pytest.raises(CorruptLogError):
        store.acquire_lease("key:x", "o", 60)
    assert log.read_bytes() == damaged != before


def test_a_damaged_synced_finalize_is_corruption_though_only_old_lease_events_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The finalize was on disk before the release after it was written (its writer synced it),
    # so no power cut can have damaged it: skipping it would lose an acknowledged record.
    directory = tmp_path / "threads"
    _power_cut_log(directory, monkeypatch)
    log = directory / "log-000001.jsonl"
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "new")
    _damage_line(log, 1)
    damaged = log.read_bytes()
    with JSONLStore(directory) as store:
        with pytest.raises(CorruptLogError) as caught:
            store.resolve(Query(key="k"))
        assert caught.value.line == 2
        with pytest.raises(CorruptLogError):
            store.acquire_lease("key:x", "o", 60)
    assert log.read_bytes() == damaged  # nothing cut


def test_unsynced_lease_events_say_how_much_of_the_log_was_synced_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    log = directory / "log-000001.jsonl"

    def line_ends() -> list[int]:
        ends, total = [], 0
        for line in log.read_bytes().splitlines(keepends=True):
            total += len(line)
            ends.append(total)
        return ends

    with JSONLStore(directory) as store:
        start(store, "r1", "k")  # grant (synced), finalize (synced), release
    finalized = line_ends()[1]
    # Another instance (as another process would) learns it from the release it reads.
    with JSONLStore(directory) as other:
        lease = other.acquire_lease("key:other", "o", 600)
        other.release_lease(lease)
    events = [record for _, record in scan(log)]
    assert [e.get("synced") for e in events] == [None, None, finalized, finalized, finalized]
    # A synced append by this instance moves it on.
    with JSONLStore(directory) as store:
        start(store, "r2", "k")
    events = [record for _, record in scan(log)]
    assert events[-1]["kind"] == "lease" and events[-1]["synced"] == line_ends()[-2]


_FIFO_AS_STORE_FILE = """
import errno, json, sys
from adaptor.threadstore import JSONLStore, Query
outcomes = []
with JSONLStore(sys.argv[1]) as store:
    for step in (lambda: store.resolve(Query(key="k")), lambda: store.acquire_lease("k", "o", 60)):
        try:
            step()
            outcomes.append("ok")
        except OSError as exc:
            outcomes.append(f"{errno.errorcode[exc.errno]}: {exc.strerror}: {exc.filename}")
print(json.dumps(outcomes))
"""


@pytest.mark.parametrize("name", ["log-000001.jsonl", "snapshot.json"])
def test_a_fifo_at_a_store_file_is_refused_not_waited_on(tmp_path: Path, name: str) -> None:
    # The store opened its files without O_NONBLOCK: a FIFO at the log's (or the snapshot's)
    # path made every call, and `adaptor threads list` and `adaptor run --thread` on that home,
    # wait in open() forever for a writer.  Each is refused at once, naming the file, which is
    # left as it was.
    directory = tmp_path / "threads"
    directory.mkdir()
    fifo = directory / name
    os.mkfifo(fifo)
    refused = f"EINVAL: is not a regular file: {fifo}"
    proc = subprocess.run(
        [sys.executable, "-c", _FIFO_AS_STORE_FILE, str(directory)],
        cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [refused] * 2
    for command in (
        ["adaptor", "threads", "list", "--home", str(tmp_path)],
        ["adaptor", "run", "--no-daemon", "--home", str(tmp_path), "--thread", "k", "--driver", "script", "go"],
    ):
        proc = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        assert proc.returncode == 70, proc.stderr[-2000:]
        assert f"is not a regular file: '{fifo}'" in proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --- a store this process may read but not write ---------------------------------------------


def test_a_store_it_may_not_write_is_read_and_refuses_only_writes(tmp_path: Path) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k1")
        start(store, "r2", "k2")
    files = sorted(directory.iterdir())
    with unwritable(*files, directory), JSONLStore(directory) as store:
        assert store.keys() == ["k1", "k2"]
        found = store.resolve(Query(key="k1"))
        assert found is not None and found.id == "r1"
        with pytest.raises(OSError) as refused:
            store.acquire_lease("key:k1", "me", 60)
        assert refused.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        assert store.keys() == ["k1", "k2"]  # a refused write changed nothing it reads


def test_a_copy_without_its_lock_file_that_it_may_not_write_is_read_without_the_lock(
    tmp_path: Path,
) -> None:
    # (A copy of the data files alone, say: no one can be writing a store with no lock file,
    # and the reader may not make one.)
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k1")
    (directory / "store.lock").unlink()
    with unwritable(*sorted(directory.iterdir()), directory), JSONLStore(directory) as store:
        assert store.keys() == ["k1"]
    assert not (directory / "store.lock").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with unwritable(empty), JSONLStore(empty) as store:
        assert store.keys() == [] and store.resolve(Query(key="k1")) is None


def test_a_reader_that_may_not_write_polls_the_lock_as_often_as_the_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy writer lets the lock go for a few milliseconds in every 100; filelock's default
    # 50 ms poll rarely met such a gap: `adaptor threads` took seconds beside a busy daemon.
    polls: list[float] = []
    real = filelock.lock_descriptor

    def recording(fd: int, **options: Any) -> bool:
        polls.append(options.get("poll_interval", 0.05))
        return bool(real(fd, **options))

    monkeypatch.setattr(filelock, "lock_descriptor", recording)
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k1")
    with unwritable(*sorted(directory.iterdir()), directory), JSONLStore(directory) as store:
        assert store.keys() == ["k1"]
    assert polls and set(polls) == {_durable._POLL_INTERVAL}


def test_a_store_whose_lock_file_cannot_be_opened_says_so_once(tmp_path: Path) -> None:
    # Closing took the lock again and failed the same way: `adaptor threads --json` showed one
    # error nested four times over.
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        start(store, "r1", "k1")
    (directory / "store.lock").unlink()
    (directory / "store.lock").symlink_to(tmp_path / "elsewhere.lock")  # never followed
    with pytest.raises(OSError) as refused, JSONLStore(directory) as store:
        store.keys()
    assert refused.value.__context__ is None and refused.value.__cause__ is None
    with pytest.raises(ValueError, match="is closed"):  # closed all the same, without the lock
        store.keys()

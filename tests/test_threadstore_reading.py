"""How a JSONLStore follows what other processes write: reading ahead while it waits for the
lock, adopting a compaction of the log it has read, and the lean check of replayed lines."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from adaptor import _durable
from adaptor._durable import frame
from adaptor.threadstore import (
    BusyError,
    FinalizeRequest,
    JSONLStore,
    Query,
    _jsonl,
)
from adaptor.threadstore._state import State
from adaptor.threadstore._types import check_record_json, record_from_json, record_to_json
from tests.durable_hooks import hook_datasyncs
from tests.test_threadstore import (
    ROOT,
    FakeClock,
    _damage_line,
    _power_cut_log,
    make_record,
    start,
)

TIMEOUT = 60.0


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --- reading ahead while another process holds the lock ----------------------------------------

_HOLDER = """
import sys
from adaptor._durable import exclusive
from adaptor.threadstore import JSONLStore
from tests.test_threadstore import start
store = JSONLStore(sys.argv[1])
with exclusive(store._lock_path):  # the whole time, as a long turn of a busy process would
    print("holding", flush=True)
    sys.stdin.readline()
    for i in range(int(sys.argv[2])):
        start(store, f"r{i}", f"k{i}")
    print("written", flush=True)
    sys.stdin.readline()
store.close()
"""


def test_a_waiting_store_applies_the_holders_lines_before_it_gets_the_lock(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "threads"
    reader = JSONLStore(directory)
    start(reader, "r-first", "first")
    reader.close()  # lets go of the lock at once
    reader = JSONLStore(directory)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory), "10"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "holding\n"
        found: list[Any] = []
        waiter = threading.Thread(target=lambda: found.append(reader.resolve(Query(key="k9"))))
        waiter.start()
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "written\n"
        # Still waiting for the lock, the reader has applied everything written so far:
        # the first record's three lines and three for each of the holder's ten.
        _wait_for(lambda: reader.lines_read == 33, "the read-ahead")
        assert waiter.is_alive()
        holder.stdin.write("release\n")
        holder.stdin.flush()
        waiter.join(TIMEOUT)
        assert found == [make_record("r9", "k9")]
        assert reader.lines_read == 33  # nothing read twice
    finally:
        holder.kill()
        holder.wait()
        reader.close()


def test_a_line_read_ahead_then_rolled_back_by_its_writer_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    writer, reader = JSONLStore(directory), JSONLStore(directory)
    start(writer, "r1", "k")
    assert reader.resolve(Query(key="k")) == make_record("r1", "k")

    def sync_fails_after_a_read_ahead(fd: int) -> None:
        # The finalize line is complete in the file: a process waiting for the lock reads it.
        reader._read_ahead()
        raise OSError(errno.EIO, "injected")

    hook_datasyncs(monkeypatch, sync_fails_after_a_read_ahead)
    lease = writer.acquire_lease("key:k2", "w", 60)
    seen_before = reader.lines_read
    with pytest.raises(OSError):
        writer.finalize(
            FinalizeRequest(
                record=make_record("ghost", "k2"), key="k2", held_leases=(lease,), rebind_active=True
            )
        )
    assert reader.lines_read > seen_before  # it did read the line, before the rollback
    monkeypatch.undo()
    writer.close()
    # Another writer puts a line of the same length where the rolled-back one was.
    with JSONLStore(directory) as other:
        other.finalize(
            FinalizeRequest(
                record=make_record("ghosT", "k2"), key="k2", held_leases=(lease,), rebind_active=True
            )
        )
    assert reader.resolve(Query(id="ghost")) is None
    assert reader.resolve(Query(key="k2")) == make_record("ghosT", "k2")
    reader.close()


_FLOCKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[2] == "try" else 0))
except BlockingIOError:
    print("busy", flush=True)
    sys.exit(0)
print("locked", flush=True)
sys.stdin.readline()
"""


def _flocker(path: Path, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _FLOCKER, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_cheap_poll_tells_a_held_lock_from_a_free_one_and_holds_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.lock"
    path.touch()
    entry = _durable._entry(str(path))
    holder = _flocker(path, "wait")
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    assert not entry._free_now()
    holder.communicate("done\n", timeout=TIMEOUT)
    assert entry._free_now()
    # The probe let go at once: another process takes the lock without waiting.
    other = _flocker(path, "try")
    out, _ = other.communicate("done\n", timeout=TIMEOUT)
    assert out == "locked\n"


# --- following compactions ---------------------------------------------------------------------


def _count_snapshot_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    parsed: list[int] = []
    real = State.from_snapshot.__func__  # type: ignore[attr-defined]

    def counting(cls: type[State], obj: Any, known: Any = None) -> State:
        parsed.append(1)
        result: State = real(cls, obj, known)
        return result

    monkeypatch.setattr(State, "from_snapshot", classmethod(counting))
    return parsed


def test_a_store_that_read_the_whole_log_adopts_its_compaction_without_parsing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    clock = FakeClock()
    with JSONLStore(directory, clock=clock) as a, JSONLStore(directory, clock=clock) as b:
        start(a, "r1", "k1")
        expiring = a.acquire_lease("short", "a", 10)
        kept = a.acquire_lease("long", "a", 600)
        assert b.resolve(Query(key="k1")) is not None  # b has read the whole log
        parsed = _count_snapshot_parses(monkeypatch)
        clock.advance(20)  # "short" is dead by now
        a.compact()
        assert b.resolve(Query(key="k1")) == make_record("r1", "k1")
        assert parsed == []  # b kept its own state
        assert set(b._state.leases) == {"long"}  # less what the compaction dropped
        with pytest.raises(BusyError):
            b.acquire_lease("long", "b", 60)
        b.acquire_lease("short", "b", 60)
        a.release_lease(expiring)  # a no-op: it is b's now
        with pytest.raises(BusyError):
            a.acquire_lease("short", "a", 60)
        a.release_lease(kept)
        # b appended to the new log; a fresh instance sees the same store.
        with JSONLStore(directory, clock=clock) as fresh:
            assert fresh.resolve(Query(key="k1")) == make_record("r1", "k1")
            assert parsed == [1]
            b.resolve(Query(key="k1"))  # catch up with a's release
            assert fresh._state.leases == b._state.leases


def test_a_store_that_missed_part_of_the_log_parses_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "threads"
    with JSONLStore(directory) as a, JSONLStore(directory) as b:
        start(a, "r1", "k1")
        assert b.resolve(Query(key="k1")) is not None
        parsed = _count_snapshot_parses(monkeypatch)
        start(a, "r2", "k2")
        a.compact()
        start(a, "r3", "k3")
        a.compact()  # two compactions: b never saw the log between them
        for key, record_id in (("k1", "r1"), ("k2", "r2"), ("k3", "r3")):
            assert b.resolve(Query(key=key)) == make_record(record_id, key)
        assert parsed == [1]


def _rebooted_after_a_power_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store directory whose log ends in power-cut damage, seen from the next boot."""
    directory = tmp_path / "threads"
    _power_cut_log(directory, monkeypatch)
    _damage_line(directory / "log-000001.jsonl", 3)
    monkeypatch.setattr(_jsonl, "current_boot_id", lambda: "new")
    return directory


def test_a_compaction_that_left_damage_behind_is_parsed_not_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _rebooted_after_a_power_cut(tmp_path, monkeypatch)
    with JSONLStore(directory) as a, JSONLStore(directory) as b:
        assert b.resolve(Query(key="k")) is not None  # stopped at the damage
        a.compact()  # the snapshot says what the damaged suffix meant (nothing)
        parsed = _count_snapshot_parses(monkeypatch)
        assert b.resolve(Query(key="k")) == make_record("r1", "k")
        assert parsed == [1]
        lease = b.acquire_lease("key:other", "b", 60)
        assert lease.generation > 1


# --- a power-cut artifact cut by another process ----------------------------------------------


def test_a_power_cut_artifact_another_process_cut_is_not_cut_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _rebooted_after_a_power_cut(tmp_path, monkeypatch)
    with JSONLStore(directory) as a, JSONLStore(directory) as b:
        assert a.resolve(Query(key="k")) == make_record("r1", "k")  # a finds the artifact
        held = b.acquire_lease("key:other", "b", 600)  # b cuts it and appends its grant there
        a.acquire_lease("key:z", "a", 600)  # must append after b's grant, not cut it away
        with JSONLStore(directory) as c, pytest.raises(BusyError):
            c.acquire_lease("key:other", "c", 600)
        b.release_lease(held)


# --- the lean checks of replayed lines ----------------------------------------------------------


def _record_variants() -> list[Any]:
    good = record_to_json(make_record("r1", "k", data={"a": "b"}))
    variants: list[Any] = [good, None, [], "x", {}]
    for name in good:
        variants.append({k: v for k, v in good.items() if k != name})
        values: tuple[Any, ...] = (None, 1, 1.5, True, "", "x", [], {}, {"data": None}, {"data": {"x": 1}})
        for value in values:
            variants.append({**good, name: value})
    for stamp in ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05.123456", "2026-13-02T03:04:05Z"):
        variants.append({**good, "created_at": stamp})
        variants.append({**good, "updated_at": stamp})
    variants.append({**good, "status": "archived", "extra": 1})
    variants.append({**good, "state": {"resume_id": 7, "data": {"k": 1}}})
    return variants


@pytest.mark.parametrize("obj", _record_variants())
def test_the_lean_record_check_accepts_exactly_what_a_resolve_can_rebuild(obj: Any) -> None:
    try:
        record_from_json(obj)
    except ValueError:
        with pytest.raises(ValueError):
            check_record_json(obj)
    else:
        check_record_json(obj)


def test_lines_are_checked_on_their_text_and_anything_else_falls_back() -> None:
    event = {"kind": "lease", "target": "t", "lease": None, "boot": "b", "v": 1, "seq": 1}
    line = frame(event)
    assert not line.startswith(b'{"crc"')  # "boot" sorts first: the cut, not unframe's shortcut
    assert _jsonl._parse_event(line, 1)["target"] == "t"
    # Same content from another serializer: not the canonical text, still the canonical crc.
    parsed = orjson.loads(line)
    spaced = (json.dumps(parsed, sort_keys=True) + "\n").encode()
    assert spaced != line
    assert _jsonl._parse_event(spaced, 1)["target"] == "t"
    with pytest.raises(ValueError, match="bad crc"):
        _jsonl._parse_event(line.replace(b'"t"', b'"u"'), 1)

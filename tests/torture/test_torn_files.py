"""Torn and corrupted files: readers say exactly where, writers repair only torn tails, and
the thread store comes back with its last acknowledged state."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adaptor._durable import scan
from adaptor.driver import SessionState
from adaptor.events import TextDelta
from adaptor.threadstore import CorruptLogError, FinalizeRequest, JSONLStore, Query, Record
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess


def _run_once(daemon: DaemonProcess, text: str) -> str:
    rid = daemon.submit(
        {"driver": "script", "prompt": "x", "config": {"steps": [{"text": text}] * 5}}
    )
    assert daemon.verdict(rid)["ok"]
    return rid


@pytest.mark.parametrize("seed", range(6))
def test_truncated_or_corrupted_audit_logs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = _run_once(daemon, "hello")
    assert daemon.stop() == 0
    log = daemon.home.events / f"{rid}.jsonl"
    data = log.read_bytes()
    lines = data.count(b"\n")
    if seed % 2 == 0:
        cut = rng.randrange(1, len(data) - 1)
        log.write_bytes(data[:cut])
        torn_line = data[:cut].count(b"\n") + 1
        ends_clean = data[:cut].endswith(b"\n")
        verify = subprocess.run(
            [sys.executable, "-m", "adaptor", "verify-log", str(log)],
            capture_output=True,
            text=True,
        )
        if ends_clean:
            assert verify.returncode == 0
        elif seed % 4 == 0:
            assert verify.returncode == 70
            assert f" line {torn_line}: torn tail" in verify.stderr
            repaired = subprocess.run(
                [sys.executable, "-m", "adaptor", "verify-log", "--repair", str(log)],
                capture_output=True,
                text=True,
            )
            assert repaired.returncode == 0, repaired.stderr
            assert sr.verify(log) == torn_line - 1
        else:
            # The next writer cuts the torn tail itself, says so, and appends after it.
            assert verify.returncode == 70
            backend = sr.JSONLEventBackend(log.parent)
            with sr.EventRecorder(backend, key_validator=lambda key: None) as recorder:
                record = recorder.record(rid, TextDelta(text="after the tear"))
            assert record.host_seq == torn_line
            assert [report.offset for report in backend.repairs] == [data[:cut].rfind(b"\n") + 1]
            assert sr.verify(log) == torn_line
    else:
        target = rng.randrange(1, lines)  # never the last line: corruption, not a torn write
        offsets = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]
        start = offsets[target - 1]
        position = start + rng.randrange(5, offsets[target] - start - 2)
        corrupted = bytearray(data)
        corrupted[position] = ord("#") if corrupted[position] != ord("#") else ord("%")
        log.write_bytes(bytes(corrupted))
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            sr.verify(log)
        assert info.value.line == target
        with pytest.raises(sr.JSONLEventLogCorruptError):
            sr.repair(log)
        assert log.read_bytes() == bytes(corrupted)  # corruption before the tail is never cut
        # Nor by a writer: it appends after it (checking the tail only), cutting nothing.
        backend = sr.JSONLEventBackend(log.parent)
        with sr.EventRecorder(backend, key_validator=lambda key: None) as recorder:
            recorder.record(rid, TextDelta(text="after the damage"))
        assert backend.repairs == []
        assert log.read_bytes().startswith(bytes(corrupted))

    # the daemon keeps serving on the same home
    again = DaemonProcess(tmp_path / "home").start()
    _run_once(again, "still working")
    assert again.stop() == 0


def _finalize(store: JSONLStore, record_id: str, key: str) -> Record:
    """What a thread's turn does to the store: lease the key, finalize a record, release."""
    lease = store.acquire_lease(f"key:{key}", "torture", 60)
    now = datetime.now(UTC)
    record = Record(
        id=record_id,
        key=key,
        status="active",
        driver_type="script",
        agent="a",
        fingerprint=f"fp-{record_id}",
        compatibility_fingerprint="cfp",
        session_codec="script/v1",
        state=SessionState(resume_id=f"resume-{record_id}", display_id="d", data={}),
        created_at=now,
        updated_at=now,
    )
    store.finalize(
        FinalizeRequest(record=record, key=key, held_leases=(lease,), rebind_active=True)
    )
    store.release_lease(lease)
    return record


def _latest_log(directory: Path) -> Path:
    return sorted(directory.glob("log-*.jsonl"))[-1]


@pytest.mark.parametrize("seed", range(8))
def test_a_thread_store_torn_mid_finalize_comes_back_with_its_acknowledged_state(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "threads"
    keys = ["k/0", "k/../1", "k 2"]
    acknowledged: dict[str, Record] = {}
    with JSONLStore(directory) as store:
        for i in range(rng.randrange(2, 14)):
            key = rng.choice(keys)
            acknowledged[key] = _finalize(store, f"r{i}", key)
            if rng.random() < 0.15:
                store.compact()
    log = _latest_log(directory)
    # The bytes the next turn appends, taken from a copy: its lease grant, then the finalize,
    # which a crash tears somewhere inside (anything before the finalize line was written).
    shutil.copytree(directory, tmp_path / "copy")
    before = log.read_bytes()
    with JSONLStore(tmp_path / "copy") as store:
        _finalize(store, "unacknowledged", rng.choice(keys))
    appended = (tmp_path / "copy" / log.name).read_bytes()[len(before) :]
    start = appended.index(b'"kind":"finalize"')
    start = appended.rindex(b"\n", 0, start) + 1
    end = appended.index(b"\n", start) + 1
    cut = rng.randrange(start + 1, end)  # at least one byte of it, never all of it
    log.write_bytes(before + appended[:cut])

    with JSONLStore(directory) as store:
        for key in keys:
            assert store.resolve(Query(key=key)) == acknowledged.get(key)
        assert store.resolve(Query(id="unacknowledged", include_archived=True)) is None
        # The next writer cuts exactly the torn bytes and appends after them.
        key = rng.choice(keys)
        acknowledged[key] = _finalize(store, "after", key)
        for key in keys:
            assert store.resolve(Query(key=key)) == acknowledged.get(key)
    if _latest_log(directory) == log:  # (unless that turn compacted the store)
        assert log.read_bytes().startswith(before + appended[:start])
    # Strictly valid again: a torn line left in the middle would be corruption.
    for _ in scan(_latest_log(directory)):
        pass


@pytest.mark.parametrize("seed", range(6))
def test_a_corrupted_thread_store_line_is_reported_never_cut(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        for i in range(rng.randrange(3, 10)):
            _finalize(store, f"r{i}", rng.choice(["a", "b"]))
    log = _latest_log(directory)
    data = bytearray(log.read_bytes())
    starts = [0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == 0x0A]
    target = rng.randrange(len(starts) - 1)  # any line but the last: not what a crash leaves
    position = rng.randrange(starts[target], starts[target + 1] - 1)
    data[position] = ord("#") if data[position] != ord("#") else ord("%")
    log.write_bytes(bytes(data))
    with JSONLStore(directory) as store:
        with pytest.raises(CorruptLogError) as info:
            store.resolve(Query(key="a"))
        assert info.value.line == target + 1
        with pytest.raises(CorruptLogError):
            _finalize(store, "refused", "a")
    assert log.read_bytes() == bytes(data)  # nothing was cut or appended


def _damage_last_line(data: bytes, how: str) -> bytes:
    """A last line damaged in a way no crash mid-append leaves: a torn write begins as a record
    does and holds at most one (a bad terminated record is a torn write too, storage.md: a
    power cut may persist its end and not its middle, and it is cut)."""
    lines = data.splitlines(keepends=True)
    if how == "joined":  # the newline between the last two records lost (an editor's join)
        return b"".join(lines[:-2]) + lines[-2][:-1] + lines[-1]
    assert how == "text"  # a line that was never a record, terminated
    return data + b"not a record\n"


@pytest.mark.parametrize("how", ["joined", "text"])
def test_a_damaged_last_line_no_crash_leaves_is_refused_by_writers_never_cut(tmp_path: Path, how: str) -> None:
    # Acknowledged records at the tail: a writer that took such damage for a torn tail cut
    # them, and handed their sequence numbers out again.
    events_dir = tmp_path / "events"
    with sr.EventRecorder(sr.JSONLEventBackend(events_dir), key_validator=lambda key: None) as recorder:
        for i in range(4):
            recorder.record("s", TextDelta(text=f"acknowledged {i}"))
    audit = events_dir / "s.jsonl"
    damaged = _damage_last_line(audit.read_bytes(), how)
    audit.write_bytes(damaged)
    backend = sr.JSONLEventBackend(events_dir)
    with sr.EventRecorder(backend, key_validator=lambda key: None) as recorder:
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            recorder.record("s", TextDelta(text="after the damage"))
    assert "torn tail" not in info.value.why and backend.repairs == []
    with pytest.raises(sr.JSONLEventLogCorruptError):
        sr.repair(audit)
    repaired = subprocess.run(
        [sys.executable, "-m", "adaptor", "verify-log", "--repair", str(audit)], capture_output=True, text=True
    )
    assert repaired.returncode == 70 and "torn tail" not in repaired.stderr, repaired.stderr
    assert audit.read_bytes() == damaged

    directory = tmp_path / "threads"
    with JSONLStore(directory) as store:
        for i in range(4):
            _finalize(store, f"r{i}", "a")
    log = _latest_log(directory)
    damaged = _damage_last_line(log.read_bytes(), how)
    log.write_bytes(damaged)
    with JSONLStore(directory) as store:
        with pytest.raises(CorruptLogError):
            _finalize(store, "refused", "a")
        assert store.repair_count == 0
    assert log.read_bytes() == damaged

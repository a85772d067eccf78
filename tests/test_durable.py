"""adaptor._durable: atomic files, locks, framed append-only logs, torn tails and corruption."""

from __future__ import annotations

import errno
import gc
import os
import pickle
import platform
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor import _durable
from adaptor._durable import (
    CorruptLogError,
    DurableLog,
    RepairReport,
    atomic_write,
    atomic_write_json,
    crc_matches_text,
    ensure_dir,
    exclusive,
    frame,
    inspect_tail,
    read_json,
    repair,
    scan,
    unframe,
)
from tests.durable_hooks import (
    count_releases,
    hook_datasyncs,
    past_the_maximum_hold,
    record_fsyncs,
)
from tests.task_limit import HeldChild

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 120

HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _python(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, **kwargs)


def _write_log(path: Path, n: int, **extra: Any) -> None:
    with DurableLog(path, sync=False) as log:
        log.append_many([{"i": i, **extra} for i in range(n)])


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _assert_seqs(path: Path, expected: int) -> list[dict[str, Any]]:
    records = [record for _, record in scan(path)]
    assert [r["seq"] for r in records] == list(range(1, expected + 1))
    return records


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "log.jsonl"


# --- directories and whole files -------------------------------------------------------------


def test_ensure_dir_creates_private_nested_dirs_and_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert ensure_dir(target) == target
    for directory in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert directory.is_dir()
        assert _mode(directory) == 0o700
    ensure_dir(target)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(OSError):
        ensure_dir(tmp_path / "file")


def test_atomic_write_replaces_content_with_mode_0600_and_no_leftovers(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    target.chmod(0o644)
    atomic_write(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert _mode(target) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]


def test_atomic_write_json_is_sorted_indented_and_read_back(tmp_path: Path) -> None:
    target = tmp_path / "v.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]})
    assert target.read_bytes() == b'{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert read_json(target) == {"a": [1, 2], "b": 1}


def test_read_json_does_not_follow_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(OSError) as info:
        read_json(link)
    assert info.value.errno == errno.ELOOP


def test_atomic_write_refuses_a_planted_tmp_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "state"
    target.write_bytes(b"old")
    monkeypatch.setattr(_durable, "_random_suffix", lambda: "guessed")
    planted = tmp_path / "state.tmp-guessed"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        atomic_write(target, b"attacker wants this in victim")
    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"old"
    # Not ours to remove: we never created it.
    assert planted.is_symlink()


def test_atomic_write_failure_removes_tmp_and_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="injected"):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state"]


# --- framing ---------------------------------------------------------------------------------


_AWKWARD_KEYS = ["", "c", "cr", "crb", "crd", "crc ", "crc!", "crc#", "crca", "crc\u0001", "a", "z"]


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.one_of(st.text(max_size=6), st.sampled_from([*_AWKWARD_KEYS, "\\", '"', "é"])).filter(
            lambda key: key != "crc"
        ),
        st.integers(-5, 5),
        max_size=5,
    )
)
def test_frame_is_the_sorted_serialization_with_the_crc_in_its_place(body: dict[str, int]) -> None:
    # frame() splices the crc into the body's own serialization when "crc" sorts first; the
    # result must be exactly what serializing the body with its crc gives.
    plain = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    expected = orjson.dumps(
        {**body, "crc": zlib.crc32(plain)}, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
    )
    assert frame(body) == expected


_LONG_FRAME = r"""
import resource, sys
from adaptor import _durable
body = {"event": {"text": "x" * (64 << 20)}, "kind": "text.content"}
_durable.frame({"warm": 1})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
line = _durable.frame(body)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
assert line.startswith(b'{"crc":') and line.endswith(b'"},"kind":"text.content"}\n')
assert _durable.unframe(line)["event"] == body["event"]
print(grown / len(line))
"""


def test_a_long_line_is_framed_with_one_copy_beside_its_serialization() -> None:
    # An agent's whole answer is one event, one line: the daemon framed a 100 MB answer with
    # three line-sized buffers alive at once (the serialization, a slice of it and the line).
    # Peak RSS, not tracemalloc: orjson reserves far more than it touches.
    done = subprocess.run(
        [sys.executable, "-c", _LONG_FRAME], capture_output=True, text=True, check=True, timeout=120
    )
    assert float(done.stdout) < 2.5, done.stdout

@HYPOTHESIS
@given(st.binary(max_size=3000), st.integers(0, 2**32 - 1), st.integers(0, 40))
def test_the_logs_crc_is_zlibs_from_any_start_and_offset(data: bytes, start: int, cut: int) -> None:
    # Logs written with zlib's crc32 (or by another tool) must read back, and the readers
    # carry a crc on from a value and over memoryview slices.
    assert _durable.crc32(data, start) == zlib.crc32(data, start)
    assert _durable.crc32(memoryview(data)[cut:]) == zlib.crc32(data[cut:])


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"),
    reason="pyproject.toml asks for isal only where it has wheels",
)
def test_the_logs_crc_is_isal_where_pyproject_installs_it() -> None:
    # Every log reader checks every line's crc: zlib's takes ~4x as long (docs/storage.md).
    from isal import isal_zlib

    assert _durable.crc32 is isal_zlib.crc32


def test_the_crc_is_checked_on_the_text_wherever_frame_put_it() -> None:
    # Keys sorting before "crc" put its member in the middle; the check must not need the
    # record serialized again, and must still reject a line whose text does not match.
    for body in ({"a": 1, "bind": "k", "z": [1]}, {"v": 1}, {"boot": "b", "crc2": 3}):
        line = frame(body)
        crc = unframe(line)["crc"]
        assert crc_matches_text(line.rstrip(b"\n"), crc), line
        assert not crc_matches_text(line.rstrip(b"\n"), crc ^ 1)
        assert not crc_matches_text(line.rstrip(b"\n").replace(b"1", b"2", 1), crc)


def test_frame_sorts_keys_and_recomputes_crc() -> None:
    line = frame({"b": 1, "a": {"y": 2, "x": 1}, "crc": 12345})
    assert line.endswith(b"\n")
    assert line.startswith(b'{"a":{"x":1,"y":2},"b":1,"crc":')
    record = unframe(line)
    assert record["a"] == {"x": 1, "y": 2}
    assert record["crc"] != 12345
    assert unframe(line.rstrip(b"\n")) == record
    assert frame(record) == line


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"{not json", "invalid json"),
        (b"[1,2]", "not an object"),
        (b'{"a":1}', "missing crc"),
        (b'{"a":1,"crc":1}', "bad crc"),
        (b'{"a":1,"crc":"x"}', "bad crc"),
    ],
)
def test_unframe_rejects(line: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        unframe(line)


def test_corrupt_log_error_fields_str_and_pickle() -> None:
    exc = CorruptLogError("/x/log", 3, "bad crc")
    assert (exc.path, exc.line, exc.why) == ("/x/log", 3, "bad crc")
    assert str(exc) == "/x/log:3: bad crc"
    again = pickle.loads(pickle.dumps(exc))
    assert (again.path, again.line, again.why) == ("/x/log", 3, "bad crc")


# --- DurableLog basics -----------------------------------------------------------------------


def test_append_and_append_many_number_records(log_path: Path) -> None:
    log = DurableLog(log_path)
    assert not log_path.exists()  # no I/O before the first append
    first = log.append({"kind": "a", "seq": 99, "crc": 1})
    batch = log.append_many([{"kind": "b"}, {"kind": "c"}])
    assert log.append_many([]) == []
    log.close()
    log.close()
    assert [r["seq"] for r in [first, *batch]] == [1, 2, 3]
    assert all(r["v"] == 1 for r in [first, *batch])
    assert _assert_seqs(log_path, 3) == [first, *batch]
    assert _mode(log_path) == 0o600
    assert _mode(Path(str(log_path) + ".lock")) == 0o600
    assert log.repaired == []


def test_a_closed_log_refuses_without_taking_the_lock(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DurableLog(log_path)
    log.append({"kind": "a"})
    log.close()
    lock = str(log_path) + ".lock"
    released = count_releases(monkeypatch, lock)
    with pytest.raises(ValueError, match="closed"):
        log.append({})
    _durable.release_lingering(lock)
    assert released == []  # never taken, so it kept nobody waiting and nothing lingers


def test_custom_seq_key_and_no_version(log_path: Path) -> None:
    with DurableLog(log_path, seq_key="host_seq", version=None) as log:
        record = log.append({"event": "x"})
    assert record == {"event": "x", "host_seq": 1, "crc": record["crc"]}
    assert [r for _, r in scan(log_path, seq_key="host_seq")] == [record]
    with pytest.raises(CorruptLogError, match="missing seq"):
        list(scan(log_path))


def test_append_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "log.jsonl"
    with DurableLog(path) as log:
        log.append({})
    assert _mode(path.parent) == 0o700


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_an_empty_log_another_writer_left_has_its_name_synced_before_the_first_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer killed between creating the log (O_EXCL) and syncing its folder leaves an empty
    # file; the next writer opened it and acknowledged appends whose file name was never synced.
    path = tmp_path / "log.jsonl"
    path.touch(mode=0o600)
    synced = record_fsyncs(monkeypatch, tmp_path)
    with DurableLog(path) as log:
        log.append({"n": 1})
    assert os.path.basename(synced[0]) == tmp_path.name, synced


def test_two_instances_in_one_process_interleave(log_path: Path) -> None:
    a, b = DurableLog(log_path), DurableLog(log_path)
    for i in range(20):
        (a if i % 3 else b).append({"i": i})
        if i % 5 == 0:
            a.append_many([{"i": i, "batch": j} for j in range(3)])
    a.close()
    b.close()
    records = _assert_seqs(log_path, 20 + 4 * 3)
    assert [r["i"] for r in records if "batch" not in r] == list(range(20))


def test_threads_sharing_and_not_sharing_an_instance(log_path: Path) -> None:
    shared = DurableLog(log_path, sync=False)
    own = [DurableLog(log_path, sync=False) for _ in range(3)]
    writers = [shared, shared, *own]

    def work(n: int, log: DurableLog) -> None:
        for i in range(100):
            log.append({"t": n, "i": i})

    threads = [threading.Thread(target=work, args=(n, log)) for n, log in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = _assert_seqs(log_path, 500)
    for n in range(len(writers)):
        assert [r["i"] for r in records if r["t"] == n] == list(range(100))


_COMPACT_UNDER_LOCK = """
import sys
from adaptor._durable import atomic_write, exclusive, frame
with exclusive(sys.argv[1] + ".lock"):
    atomic_write(sys.argv[1], frame({"snapshot": True, "seq": 1, "v": 1}))
"""


def test_writer_follows_a_file_replaced_by_compaction(log_path: Path) -> None:
    log = DurableLog(log_path)
    log.append_many([{"i": i} for i in range(3)])
    # A compactor (another process, under the lock) writes a fresh log atomically under the
    # same name.
    subprocess.run([sys.executable, "-c", _COMPACT_UNDER_LOCK, str(log_path)], check=True)
    assert log.append({"i": 3})["seq"] == 2
    log.close()
    assert [r.get("snapshot", r.get("i")) for r in _assert_seqs(log_path, 2)] == [True, 3]


@pytest.mark.parametrize("rotation", ["moved away", "moved away, a new file made"])
def test_writer_follows_the_path_when_its_file_is_moved_away(log_path: Path, rotation: str) -> None:
    # `mv log log.1` (logrotate's rename, with or without its `create`): the file still had a
    # name, so the writer went on appending to log.1 while readers of `log` saw nothing, and
    # a second writer started `log` over from seq 1 beside it.
    log = DurableLog(log_path)
    log.append({"i": 0})
    first = log.file_id
    rotated = log_path.with_name(log_path.name + ".1")
    log_path.rename(rotated)
    if rotation != "moved away":
        log_path.touch()
    _durable.release_lingering(str(log_path) + ".lock")  # as any other process might take it now
    assert log.append({"i": 1})["seq"] == 1  # a new file: its own sequence
    assert log.file_id != first
    log.close()
    assert [r["i"] for r in _assert_seqs(log_path, 1)] == [1]
    assert [r["i"] for r in _assert_seqs(rotated, 1)] == [0]


def test_writer_refuses_a_symlinked_log(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_bytes(b"")
    link = tmp_path / "log.jsonl"
    link.symlink_to(real)
    with pytest.raises(OSError) as info:
        DurableLog(link).append({})
    assert info.value.errno == errno.ELOOP
    assert real.read_bytes() == b""
    with pytest.raises(OSError):
        list(scan(link))


def _spy_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record which form each synced append took: "two calls" or "one call" (RWF_DSYNC)."""
    calls: list[str] = []
    datasync, write_datasync = _durable._datasync, _durable._write_datasync

    def two_calls(fd: int) -> None:
        calls.append("two calls")
        datasync(fd)

    def one_call(fd: int, data: bytes) -> int:
        calls.append("one call")
        return write_datasync(fd, data)

    monkeypatch.setattr(_durable, "_datasync", two_calls)
    monkeypatch.setattr(_durable, "_write_datasync", one_call)
    return calls


@pytest.mark.skipif(_durable._RWF_DSYNC is None, reason="needs pwritev2 with RWF_DSYNC")
def test_an_append_syncs_in_one_call_only_when_everything_before_it_is_durable(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RWF_DSYNC syncs the range written, not the file: after an unsynced append, or a write
    # by someone else, only a real fdatasync makes the earlier bytes durable too.
    calls = _spy_syncs(monkeypatch)
    log = DurableLog(log_path)
    log.append({"i": 1})  # a new file: its size was never synced by this instance
    log.append({"i": 2})
    assert calls == ["two calls", "one call"]
    log.append({"i": 3}, sync=False)
    log.append({"i": 4})
    log.append({"i": 5})
    assert calls[2:] == ["two calls", "one call"]
    with DurableLog(log_path) as other:
        other.append({"i": 6}, sync=False)
    log.append({"i": 7})
    log.append({"i": 8})
    assert calls[4:] == ["two calls", "one call"]
    # The lock let go and taken again with nobody appending meanwhile (a writer idle for a
    # while): the file is as this instance synced it.
    _durable.release_lingering(str(log_path) + ".lock")
    log.append({"i": 9})
    assert calls[6:] == ["one call"]
    log.close()
    assert [r["i"] for _, r in scan(log_path)] == [1, 2, 3, 4, 5, 6, 7, 8, 9]


@pytest.mark.skipif(_durable._RWF_DSYNC is None, reason="needs pwritev2 with RWF_DSYNC")
def test_a_short_one_call_write_is_finished_and_synced(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _durable._write_datasync
    calls = _spy_syncs(monkeypatch)
    log = DurableLog(log_path)
    log.append({"i": 1})
    log.append({"i": 2})

    def short(fd: int, data: bytes) -> int:
        calls.append("short")
        return real(fd, data[:7])

    monkeypatch.setattr(_durable, "_write_datasync", short)
    log.append({"i": 3})
    assert calls[-2:] == ["short", "two calls"]  # the rest written, then the whole file synced
    log.close()
    assert [r["i"] for _, r in scan(log_path)] == [1, 2, 3]


@pytest.mark.skipif(_durable._RWF_DSYNC is None, reason="needs pwritev2 with RWF_DSYNC")
@pytest.mark.parametrize("wrote", [False, True])
def test_a_failed_one_call_write(
    log_path: Path, monkeypatch: pytest.MonkeyPatch, wrote: bool
) -> None:
    # Nothing written (a full disk): the log stays usable.  Written but the sync failed: the
    # record is rolled back and this instance refuses to append, as after a failed fsync.
    log = DurableLog(log_path)
    log.append({"i": 1})
    log.append({"i": 2})
    size = log_path.stat().st_size

    def failing(fd: int, data: bytes) -> int:
        if wrote:
            os.write(fd, data)
            raise OSError(errno.EIO, "injected sync failure")
        raise OSError(errno.ENOSPC, "injected full disk")

    monkeypatch.setattr(_durable, "_write_datasync", failing)
    with pytest.raises(OSError, match="injected"):
        log.append({"i": 3})
    monkeypatch.undo()
    assert log_path.stat().st_size == size
    if wrote:
        with pytest.raises(OSError, match="suspect"):
            log.append({"i": 3})
    else:
        assert log.append({"i": 3})["seq"] == 3
    log.close()


def test_failed_fsync_makes_the_log_suspect(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DurableLog(log_path)
    log.append({"i": 0})
    size = log_path.stat().st_size

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "injected fsync failure")

    hook_datasyncs(monkeypatch, failing_sync)
    with pytest.raises(OSError, match="injected") as first:
        log.append({"i": 1})
    monkeypatch.undo()
    # The unacknowledged record is not left behind for readers.
    assert log_path.stat().st_size == size
    with pytest.raises(OSError, match="suspect") as later:
        log.append({"i": 2})
    assert later.value.__cause__ is first.value
    assert log_path.stat().st_size == size
    log.close()
    # Another writer (after whatever check the owner decides on) continues the sequence.
    with DurableLog(log_path) as fresh:
        assert fresh.append({"i": 3})["seq"] == 2


def test_unserializable_batch_writes_nothing(log_path: Path) -> None:
    with DurableLog(log_path) as log:
        log.append({"i": 0})
        with pytest.raises(TypeError):
            log.append_many([{"i": 1}, {"i": {1, 2}}])
        assert log.append({"i": 2})["seq"] == 2
    _assert_seqs(log_path, 2)


# --- real cross-process behaviour ------------------------------------------------------------

_APPENDER = """
import sys
from adaptor._durable import DurableLog
path, worker = sys.argv[1], int(sys.argv[2])
with DurableLog(path) as log:
    for i in range(200):
        log.append({"w": worker, "i": i})
"""


def test_four_processes_race_on_one_log(log_path: Path) -> None:
    procs = [_python(_APPENDER, str(log_path), str(w)) for w in range(4)]
    for proc in procs:
        assert proc.wait(timeout=CHILD_TIMEOUT) == 0
    records = _assert_seqs(log_path, 800)  # scan checks every crc
    for w in range(4):
        assert [r["i"] for r in records if r["w"] == w] == list(range(200))


_TIGHT_LOOP = """
import sys
from adaptor._durable import DurableLog
log = DurableLog(sys.argv[1])
i = 0
while True:
    log.append({"i": i, "pad": "x" * 64})
    i += 1
    if i == 150:
        print("ready", flush=True)
"""


def test_sigkill_mid_append_leaves_a_recoverable_log(log_path: Path) -> None:
    proc = _python(_TIGHT_LOOP, str(log_path), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT)
        assert readable, "appender never got going"
        assert proc.stdout.readline() == b"ready\n"
        assert log_path.read_bytes().count(b"\n") > 100
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=CHILD_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    with DurableLog(log_path) as log:
        record = log.append({"after": "kill"})
    records = _assert_seqs(log_path, record["seq"])
    assert records[-1]["after"] == "kill"
    assert [r["i"] for r in records[:-1]] == list(range(len(records) - 1))


def _fd_targets(pid: int | str) -> set[str]:
    targets = set()
    directory = f"/proc/{pid}/fd"
    for name in os.listdir(directory):
        try:
            targets.add(os.readlink(f"{directory}/{name}"))
        except FileNotFoundError:  # the listing's own descriptor, already closed
            pass
    return targets


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_lock_and_log_fds_are_not_inherited(log_path: Path) -> None:
    lock_path = str(log_path) + ".lock"
    with DurableLog(log_path) as log:
        log.append({})  # leaves the log descriptor open
        with exclusive(lock_path):
            mine = {
                int(name)
                for name in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{name}") in {lock_path, str(log_path)}
            }
            assert len(mine) == 2
            assert not any(os.get_inheritable(fd) for fd in mine)
            # close_fds=False: only close-on-exec stands between the child and our fds.
            child = _python("import sys; sys.stdin.read()", stdin=subprocess.PIPE, close_fds=False)
            try:
                # Popen returns after the exec succeeded, so the child's table is final.
                leaked = _fd_targets(child.pid) & {lock_path, str(log_path)}
            finally:
                assert child.stdin is not None
                child.stdin.close()
                child.wait(timeout=CHILD_TIMEOUT)
            assert leaked == set()


# As another program would take it: filelock's own lock object, whose flock must exclude ours.
_TRY_LOCK = """
import sys, filelock
try:
    filelock.FileLock(sys.argv[1], thread_local=False).acquire(blocking=False)
except filelock.Timeout:
    print("busy")
else:
    print("free")
"""


def _probe_lock(path: str | os.PathLike[str]) -> bytes:
    """``b"free\n"`` or ``b"busy\n"``: whether another process can take ``path``'s flock now."""
    return subprocess.run(
        [sys.executable, "-c", _TRY_LOCK, os.fspath(path)],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=CHILD_TIMEOUT,
    ).stdout


def test_lock_excludes_other_processes_and_is_one_object_per_path(tmp_path: Path) -> None:
    lock_path = tmp_path / "x.lock"
    assert _durable._entry(lock_path) is _durable._entry(str(tmp_path / "sub" / ".." / "x.lock"))

    with exclusive(lock_path), exclusive(lock_path):  # reentrant in one thread
        assert _probe_lock(lock_path) == b"busy\n"
    assert _probe_lock(lock_path) == b"free\n"
    assert lock_path.exists()  # lock files are never deleted


def test_a_lock_held_for_reading_keeps_other_processes_writers_out(tmp_path: Path) -> None:
    lock_path = tmp_path / "x.lock"
    with exclusive(lock_path):
        pass
    _durable.release_lingering(lock_path)
    # (Opened read-only: tests/test_cli_daemon.py holds it on a store no one may write to.)
    with _durable.held_for_reading(lock_path):
        assert _probe_lock(lock_path) == b"busy\n"
    assert _probe_lock(lock_path) == b"free\n"
    with pytest.raises(FileNotFoundError), _durable.held_for_reading(tmp_path / "none.lock"):
        pass
    assert not (tmp_path / "none.lock").exists()  # a reader creates nothing


# --- strict reading, torn tails, corruption --------------------------------------------------


def test_scan_missing_file_yields_nothing(tmp_path: Path) -> None:
    assert list(scan(tmp_path / "absent")) == []
    assert inspect_tail(tmp_path / "absent") is None
    assert repair(tmp_path / "absent") is None
    assert not (tmp_path / "absent.lock").exists()


@pytest.mark.parametrize(
    ("seqs", "line", "why"),
    [
        ([1, 2, 4], 3, "sequence gap: expected 3 got 4"),
        ([1, 2, 2], 3, "sequence went backwards: expected 3 got 2"),
        ([2], 1, "sequence gap: expected 1 got 2"),
    ],
)
def test_scan_checks_the_sequence(log_path: Path, seqs: list[int], line: int, why: str) -> None:
    log_path.write_bytes(b"".join(frame({"seq": s}) for s in [*seqs, seqs[-1] + 1]))
    with pytest.raises(CorruptLogError) as info:
        list(scan(log_path))
    assert (info.value.line, info.value.why) == (line, why)


def test_scan_start_seq(log_path: Path) -> None:
    log_path.write_bytes(frame({"seq": 7}) + frame({"seq": 8}))
    assert [n for n, _ in scan(log_path, start_seq=7)] == [1, 2]


@pytest.mark.parametrize(
    ("tail", "why"),
    [
        (b'{"seq":4', "unterminated last line"),
        (b"\n", "empty line"),
        (b'{"seq":4,"i"\n', "invalid json"),
        (b"\x00" * 40, "unterminated last line"),  # what a power cut leaves of unsynced data
    ],
)
def test_torn_tail_strict_lenient_inspect_and_repair(log_path: Path, tail: bytes, why: str) -> None:
    _write_log(log_path, 3)
    good = log_path.read_bytes()
    log_path.write_bytes(good + tail)
    with pytest.raises(CorruptLogError) as info:
        list(scan(log_path))
    assert (info.value.line, info.value.why) == (4, why)
    assert len(list(scan(log_path, strict=False))) == 3
    expected = RepairReport(str(log_path), len(good), len(tail), tail.decode())
    assert inspect_tail(log_path) == expected
    assert log_path.read_bytes() == good + tail  # inspecting changed nothing
    assert repair(log_path) == expected
    assert log_path.read_bytes() == good
    assert repair(log_path) is None
    _assert_seqs(log_path, 3)


@pytest.mark.parametrize("records", [0, 3])
@pytest.mark.parametrize("tail", [b"my notes", b"my notes\n", b"[1, 2]\n"])
def test_a_last_line_that_is_no_record_of_ours_is_corruption_never_cut(
    log_path: Path, records: int, tail: bytes
) -> None:
    # A stray text file at the log's path (or a note appended to a log) was emptied by the
    # next writer or repair() as if a crash had torn it: a torn write begins as a record does.
    if records:
        _write_log(log_path, records)
    before = (log_path.read_bytes() if records else b"") + tail
    log_path.write_bytes(before)
    _assert_refused_by_all_and_kept(log_path, before, line=records + 1, says="not a torn record of this log")


def _assert_refused_by_all_and_kept(log_path: Path, content: bytes, *, line: int, says: str) -> None:
    """Every reader, repair and the next writer refuse the log as corrupt at ``line`` (the
    reason saying ``says``), and it stays byte for byte ``content``."""
    for check in (lambda: list(scan(log_path)), lambda: list(scan(log_path, strict=False)),
                  lambda: inspect_tail(log_path), lambda: repair(log_path),
                  lambda: DurableLog(log_path).append({"i": "new"})):
        with pytest.raises(CorruptLogError) as info:
            check()
        assert info.value.line == line
        assert says in info.value.why
    assert log_path.read_bytes() == content


@pytest.mark.parametrize("joint", [b" ", b"", b"\r"], ids=["newline changed", "newline deleted", "newline to CR"])
@pytest.mark.parametrize("terminated", [True, False])
def test_the_last_two_records_run_together_are_corruption_never_cut(
    log_path: Path, joint: bytes, terminated: bool
) -> None:
    # The newline between the last two records changed (a flipped byte, an editor's line
    # join) made a last line beginning with "{" that the next writer and repair() cut as a
    # torn append: two records acknowledged and synced were lost, their seqs handed out again.
    # A crash leaves a prefix of one record, which holds a whole object only as the whole line.
    _write_log(log_path, 4)
    good = log_path.read_bytes()
    cut = good.rstrip(b"\n").rfind(b"\n")
    damaged = good[:cut] + joint + good[cut + 1 :]
    if not terminated:
        damaged = damaged.rstrip(b"\n")
    log_path.write_bytes(damaged)
    _assert_refused_by_all_and_kept(
        log_path, damaged, line=3, says="not a torn record of this log (it holds a whole JSON object and more"
    )


def test_a_torn_last_record_after_whole_ones_is_still_cut(log_path: Path) -> None:
    # (The rule above looks at the last line alone: a prefix of a record, however long, and
    # one of nested values or with zeros after a whole object, stays a torn tail.)
    _write_log(log_path, 3)
    good = log_path.read_bytes()
    whole = frame({"seq": 4, "i": {"deep": [[1, {"x": "}{"}]]}})
    for tail in (whole[: len(whole) // 2], whole[:-2], whole[:-1] + b"\x00" * 8):
        log_path.write_bytes(good + tail)
        assert repair(log_path) == RepairReport(str(log_path), len(good), len(tail), ANY)
        assert log_path.read_bytes() == good


def test_empty_line_in_the_middle_is_corruption(log_path: Path) -> None:
    log_path.write_bytes(frame({"seq": 1}) + b"\n" + frame({"seq": 2}))
    with pytest.raises(CorruptLogError, match="empty line") as info:
        list(scan(log_path, strict=False))
    assert info.value.line == 2


def _flip_payload(line: bytes) -> bytes:
    return line.replace(b'"i":', b'"j":', 1)


def _break_json(line: bytes) -> bytes:
    return b"\xff" + line[1:]


@pytest.mark.parametrize("damage", [_flip_payload, _break_json])
def test_corrupt_middle_line_is_never_repaired(log_path: Path, damage: Any) -> None:
    _write_log(log_path, 6)
    lines = _lines(log_path)
    lines[2] = damage(lines[2])
    log_path.write_bytes(b"".join(lines))
    before = log_path.read_bytes()
    for lenient in (True, False):
        with pytest.raises(CorruptLogError) as info:
            list(scan(log_path, strict=not lenient))
        assert info.value.line == 3
    with pytest.raises(CorruptLogError) as info:
        inspect_tail(log_path)
    assert info.value.line == 3
    with pytest.raises(CorruptLogError) as info:
        repair(log_path)
    assert info.value.line == 3
    assert log_path.read_bytes() == before


@pytest.mark.parametrize("damage", [_flip_payload, _break_json])
def test_writer_refuses_corruption_before_the_last_line(log_path: Path, damage: Any) -> None:
    _write_log(log_path, 6)
    lines = _lines(log_path)
    lines[4] = damage(lines[4])  # the writer checks the last two lines
    log_path.write_bytes(b"".join(lines))
    before = log_path.read_bytes()
    log = DurableLog(log_path)
    for _ in range(2):  # and keeps refusing
        with pytest.raises(CorruptLogError) as info:
            log.append({"i": 99})
        assert info.value.line == 5
    assert log_path.read_bytes() == before
    assert log.repaired == []


def test_writer_treats_a_bad_terminated_last_line_as_torn(log_path: Path) -> None:
    _write_log(log_path, 3)
    lines = _lines(log_path)
    lines[2] = _flip_payload(lines[2])
    log_path.write_bytes(b"".join(lines))
    with DurableLog(log_path) as log:
        assert log.append({"i": "new"})["seq"] == 3
        (report,) = log.repaired
    assert report.offset == len(lines[0]) + len(lines[1])
    assert report.dropped_preview == lines[2].decode()
    _assert_seqs(log_path, 3)


_TEAR_UNDER_LOCK = """
import sys
from adaptor._durable import exclusive, frame
with exclusive(sys.argv[1] + ".lock"):
    with open(sys.argv[1], "ab") as f:
        f.write(frame({"seq": 2})[:-5])
"""


def test_writer_notices_another_writers_torn_tail(log_path: Path) -> None:
    log = DurableLog(log_path)
    log.append({"i": 0})
    # Another process takes the lock (waiting out our linger) and crashes mid-append.
    subprocess.run([sys.executable, "-c", _TEAR_UNDER_LOCK, str(log_path)], check=True)
    assert log.append({"i": 1})["seq"] == 2
    assert len(log.repaired) == 1
    log.close()
    _assert_seqs(log_path, 2)


def test_repair_preview_is_bounded(log_path: Path) -> None:
    _write_log(log_path, 1)
    good = log_path.stat().st_size
    with log_path.open("ab") as f:
        f.write(b'{"' + "é".encode() * 10_000)
    report = repair(log_path)
    assert report is not None
    assert (report.offset, report.dropped_bytes) == (good, 20_002)
    assert report.dropped_preview == '{"' + "é" * 198


# --- properties ------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)


def _containers_of(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # A named function: hypothesis cannot see a multi-line lambda use its argument.
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)


_values = st.recursive(_scalars, _containers_of, max_leaves=12)
_records = st.dictionaries(
    st.text(max_size=8).filter(lambda key: key not in {"seq", "v", "crc"}), _values, max_size=5
)


@HYPOTHESIS
@given(batches=st.lists(st.lists(_records, min_size=1, max_size=4), min_size=1, max_size=6))
def test_records_round_trip_through_append_and_scan(batches: list[list[dict[str, Any]]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "log.jsonl"
        with DurableLog(path, sync=False) as log:
            written = [r for batch in batches for r in log.append_many(batch)]
        read = [record for _, record in scan(path)]
    assert read == written
    originals = [r for batch in batches for r in batch]
    assert [{k: v for k, v in r.items() if k not in {"seq", "v", "crc"}} for r in read] == originals


@HYPOTHESIS
@given(n=st.integers(1, 8), data=st.data())
def test_truncation_anywhere_is_a_torn_tail_at_worst(n: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "log.jsonl"
        _write_log(path, n, text="ü€")
        blob = path.read_bytes()
        cut = data.draw(st.integers(0, len(blob)), label="cut")
        os.truncate(path, cut)
        prefix = blob[:cut]
        complete = prefix.count(b"\n")
        on_boundary = cut == 0 or prefix.endswith(b"\n")
        if on_boundary:
            assert len(list(scan(path))) == complete
            assert inspect_tail(path) is None
        else:
            with pytest.raises(CorruptLogError) as info:
                list(scan(path))
            assert info.value.line == complete + 1  # always the last line
            assert len(list(scan(path, strict=False))) == complete
        predicted = inspect_tail(path)
        with DurableLog(path) as log:
            assert log.append({"after": True})["seq"] == complete + 1
            repaired = log.repaired
        if on_boundary:
            assert repaired == []
        else:
            start = prefix.rfind(b"\n") + 1
            assert repaired == [predicted]
            assert (repaired[0].offset, repaired[0].dropped_bytes) == (start, cut - start)
        _assert_seqs(path, complete + 1)


# --- memory ----------------------------------------------------------------------------------


def test_scan_streams_in_constant_memory(log_path: Path) -> None:
    pad = "p" * 200
    with DurableLog(log_path, sync=False) as log:
        for start in range(0, 50_000, 5_000):
            log.append_many([{"i": i, "pad": pad} for i in range(start, start + 5_000)])
    assert log_path.stat().st_size > 10 * 2**20
    tracemalloc.start()
    try:
        count = sum(1 for _ in scan(log_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    assert peak < 2 * 2**20


# --- lingering locks -------------------------------------------------------------------------


def test_back_to_back_appends_take_the_flock_once_and_close_lets_it_go(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock_path = str(log_path) + ".lock"
    acquired: list[object] = []
    real_take = _durable._Exclusive._take_file

    def counting_take(entry: _durable._Exclusive, *, blocking: bool) -> bool:
        if entry.path == lock_path:
            acquired.append(None)
        return real_take(entry, blocking=blocking)

    monkeypatch.setattr(_durable._Exclusive, "_take_file", counting_take)
    with DurableLog(log_path, sync=False) as log:
        log.append({})
        acquired.clear()
        for _ in range(100):
            log.append({})
        # The reaper may let go if this thread is descheduled for a while, but not every time.
        assert len(acquired) < 50
    # close() releases at once: another process gets the lock without waiting.
    assert _probe_lock(lock_path) == b"free\n"


def test_a_continuing_hold_keeps_a_flock_held_past_the_maximum_until_the_next_plain_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every plain hold is past the maximum; a continuing one is not.
    past_the_maximum_hold(monkeypatch)
    lock = str(tmp_path / "work.lock")
    released = count_releases(monkeypatch, lock)
    with exclusive(lock, linger=True):
        pass
    for _ in range(3):
        with exclusive(lock, linger=True, continuing=True):
            pass
    assert released == []  # held throughout: nobody else could have had it in between
    with exclusive(lock, linger=True):
        pass
    assert released == [lock]  # the plain hold gave it away first, then took it again
    _durable.release_lingering(lock)


_APPEND = """
import sys
from adaptor._durable import DurableLog
with DurableLog(sys.argv[1]) as log:
    print(log.append({"who": sys.argv[2]})["seq"])
"""


def test_an_idle_writer_lets_another_process_append_without_closing(log_path: Path) -> None:
    log = DurableLog(log_path)
    log.append({"who": "first"})  # the flock lingers; this writer never calls again until below
    other = subprocess.run(
        [sys.executable, "-c", _APPEND, str(log_path), "second"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=CHILD_TIMEOUT,
    )
    assert other.stdout == b"2\n"
    log.append({"who": "third"})
    assert [r["who"] for r in _assert_seqs(log_path, 3)] == ["first", "second", "third"]
    log.close()


def test_flocks_left_lingering_one_after_another_are_all_let_go_when_idle(
    tmp_path: Path,
) -> None:
    # The reaper is woken only for the first; the later ones wait for its next round.
    locks = [str(tmp_path / f"{i}.lock") for i in range(3)]
    for lock in locks:
        with exclusive(lock, linger=True):
            pass
    deadline = time.monotonic() + 30
    free: list[str] = []
    while len(free) < len(locks) and time.monotonic() < deadline:
        for lock in locks:
            if lock in free:
                continue
            if _probe_lock(lock) == b"free\n":
                free.append(lock)
    assert sorted(free) == locks


_LINGER_AT_THE_TASK_LIMIT = """
import sys
from adaptor._durable import exclusive
print("ready", flush=True)
sys.stdin.readline()  # the test caps the tasks meanwhile: no reaper thread can start
with exclusive(sys.argv[1], linger=True):
    pass
print("done", flush=True)
sys.stdin.readline()
"""


def test_a_flock_left_to_linger_is_let_go_at_once_when_no_reaper_can_start(tmp_path: Path) -> None:
    lock = str(tmp_path / "x.lock")
    with HeldChild(_LINGER_AT_THE_TASK_LIMIT, lock, cwd=ROOT) as child:
        assert child.first_line == b"ready\n" and child.limit is not None
        child.limit.cap()
        assert child.step() == b"done\n"
        assert _probe_lock(lock) == b"free\n"  # while the child lives on


def test_closing_a_log_whose_flock_was_let_go_makes_no_new_lock_object(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daemon closes an idle audit log with every request; a filelock object costs ~0.1 ms.
    log = DurableLog(log_path, sync=False)
    log.append({"n": 1})
    _durable.release_lingering(str(log_path) + ".lock")  # as the reaper does once it is idle
    gc.collect()
    made: list[str] = []
    real_init = _durable._Exclusive.__init__

    def counting_init(self: _durable._Exclusive, path: str) -> None:
        made.append(path)
        real_init(self, path)

    monkeypatch.setattr(_durable._Exclusive, "__init__", counting_init)
    log.append({"n": 2})
    log.close()
    assert made == []
    assert _probe_lock(str(log_path) + ".lock") == b"free\n"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settles(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``check()`` comes true once the reaper thread has gone round (or at once)."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if check() or time.monotonic() > deadline:
            return bool(check())
        time.sleep(0.01)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_process_writing_many_logs_keeps_no_lock_state_for_logs_it_is_done_with(
    tmp_path: Path,
) -> None:
    # A daemon writes a new event log for every request: what it keeps per log it ever
    # wrote (a lock object, a probe descriptor) would grow for the life of the process.
    gc.collect()
    fds, locks = _open_fds(), len(_durable._locks)
    for i in range(40):
        log = DurableLog(tmp_path / f"run-{i}.jsonl")
        log.append({"i": i})
        log.close()  # lets the lingering flock go
        with exclusive(tmp_path / f"store-{i}.lock", while_waiting=lambda: None):
            pass  # the waiting path opens a probe descriptor
    assert _settles(lambda: len(_durable._locks) <= locks and _open_fds() <= fds)


def test_a_lock_in_use_keeps_its_one_object(tmp_path: Path) -> None:
    lock_path = tmp_path / "x.lock"
    with exclusive(lock_path, linger=True):
        held = _durable._entry(lock_path)
    gc.collect()
    # Lingering: still held by this process, so the same object answers for the path.
    assert _durable._entry(str(lock_path)) is held
    _durable.release_lingering(lock_path)
    del held
    assert _settles(lambda: str(lock_path) not in _durable._locks)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_appends_with_fresh_locks(log_path: Path) -> None:
    log = DurableLog(log_path)
    log.append({"who": "parent"})  # the parent's flock lingers across the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            log.append({"who": "child"})
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    log.append({"who": "parent"})
    assert [r["who"] for r in _assert_seqs(log_path, 3)] == ["parent", "child", "parent"]
    log.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_lets_go_of_the_parents_flock(tmp_path: Path) -> None:
    # The child shares the parent's lock descriptor (and so its flock): it must close it
    # without unlocking, or the parent would go on writing under a lock it no longer has.
    lock_path = tmp_path / "x.lock"
    with exclusive(lock_path, linger=True):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            status = 1
            try:
                with exclusive(tmp_path / "other.lock"):  # the child's own locks work
                    status = 0
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _probe_lock(lock_path) == b"busy\n"
    _durable.release_lingering(lock_path)
    assert _probe_lock(lock_path) == b"free\n"


def test_write_once_never_replaces_and_runs_linked_before_returning(tmp_path: Path) -> None:
    target = tmp_path / "verdict.json"
    seen: list[bytes] = []
    assert _durable.write_once(target, b"first\n", linked=lambda: seen.append(target.read_bytes()))
    assert seen == [b"first\n"]  # visible and complete when ``linked`` runs
    assert not _durable.write_once(target, b"second\n", linked=lambda: seen.append(b"called"))
    assert target.read_bytes() == b"first\n" and seen == [b"first\n"]
    assert [p.name for p in tmp_path.iterdir()] == ["verdict.json"]  # no temporary left
    assert target.stat().st_mode & 0o777 == 0o600

@pytest.mark.parametrize("failing", ["_write_all", "fsync"])
def test_write_once_on_a_full_disk_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "injected full disk")

    if failing == "fsync":
        monkeypatch.setattr(os, "fsync", full)
    else:
        monkeypatch.setattr(_durable, failing, full)
    target = tmp_path / "verdict.json"
    with pytest.raises(OSError, match="injected full disk"):
        _durable.write_once(target, b"{}\n")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    assert _durable.write_once(target, b"{}\n")  # and the next try succeeds



@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_sync_batch_syncs_each_file_then_its_folders_and_a_verdict_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _durable.ensure_dir(tmp_path / "runs" / "r1", durable=False)
    verdicts = _durable.ensure_dir(tmp_path / "verdicts")
    _durable.atomic_write_json(folder / "request.json", {"id": "r1"}, durable=False)
    (folder / "result.json").write_bytes(b"an earlier attempt's, longer than the new one\n")
    done: list[str] = []  # each fsync (by name) and the verdict's link, in order
    hinted: list[str] = []
    real_fsync, real_hint, real_link = os.fsync, _durable._start_writeback, os.link

    def name_of(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).split(".tmp-")[0]

    def fsync(fd: int) -> None:
        done.append(name_of(fd))
        real_fsync(fd)

    def hint(fd: int) -> None:
        hinted.append(name_of(fd))
        real_hint(fd)

    def link(src: Any, dst: Any) -> None:
        done.append(f"link {os.path.basename(dst)}")
        real_link(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(_durable, "_start_writeback", hint)
    batch = _durable.SyncBatch([folder])
    batch.write(folder / "stdout", b"out\n")
    assert hinted == []  # a lone file: its fsync would follow with nothing to overlap
    batch.write(folder / "result.json", b"{}\n")
    for path in (folder / "request.json", folder / "gone"):
        batch.add(path)
    batch.add_directory(folder.parent)
    batch.add_directory(folder)
    assert hinted == ["stdout", "result.json", "request.json"] and done == []
    assert _durable.write_once(verdicts / "r1.json", b"{}\n", synced_with=batch)
    # Every file, the verdict's content included, then the folders, then the verdict appears.
    assert done == [
        "stdout", "result.json", "request.json", ".r1.json", "r1", "runs", "link r1.json", "verdicts"
    ]
    assert (folder / "stdout").read_bytes() == b"out\n"
    assert (folder / "result.json").read_bytes() == b"{}\n"  # truncated, not appended
    assert (folder / "stdout").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in verdicts.iterdir()) == ["r1.json"]
    assert batch.files == 0  # synced and closed
    done.clear()
    with pytest.raises(RuntimeError), _durable.SyncBatch([folder]) as failed:
        failed.write(folder / "stderr", b"err\n")
        failed.add(folder / "request.json")
        raise RuntimeError("the verdict could not be built")
    assert done == [] and failed.files == 0  # nothing synced, nothing left open


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_new_empty_file_is_only_created_and_an_old_one_is_truncated_and_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stderr").write_bytes(b"an earlier attempt's output\n")
    synced = record_fsyncs(monkeypatch, tmp_path)
    with _durable.SyncBatch([tmp_path]) as batch:
        batch.write(tmp_path / "stdout", b"")  # new and empty: its folder's sync covers it
        batch.write(tmp_path / "stderr", b"")  # an old one: its emptiness must be durable
    assert list(map(os.path.basename, synced)) == ["stderr", tmp_path.name]
    assert (tmp_path / "stdout").read_bytes() == b"" == (tmp_path / "stderr").read_bytes()
    assert (tmp_path / "stdout").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo", "folder"])
def test_a_file_written_in_place_is_never_one_the_writer_did_not_make(tmp_path: Path, kind: str) -> None:
    # The daemon writes a run's side files in place.  A symbolic link there made it defer the
    # verdict forever (ELOOP every retry); a hard link was emptied and written, changing the
    # file's other name outside the home; a FIFO held the worker waiting for a reader forever.
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    folder = _durable.ensure_dir(tmp_path / "runs" / "r1")
    planted = folder / "stdout"
    if kind == "symlink":
        planted.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, planted)
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    before = os.lstat(planted)
    with _durable.SyncBatch([folder]) as batch:
        with pytest.raises(_durable.ForeignFileError) as info:
            batch.write(planted, b"the run's output")
        assert info.value.filename == str(planted)
        batch.write(folder / "stderr", b"")  # the batch goes on with the writer's own files
    assert victim.read_bytes() == b"precious\n"
    after = os.lstat(planted)
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)
    # A run folder that is a link is refused as well (its files would land where it points).
    linked = tmp_path / "runs" / "r2"
    linked.symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(_durable.ForeignFileError):
        _durable.ensure_dir(linked, durable=False, follow_links=False)
    assert _durable.ensure_dir(linked) == linked  # followed unless asked not to


_BATCH_SHORT_OF_DESCRIPTORS = """
import os, resource, sys
from pathlib import Path
from adaptor._durable import SyncBatch
folder = Path(sys.argv[1])
(folder / "written-before").write_bytes(b"earlier")
# Room for three more descriptors: a batch of six files held them all open at once.
free = resource.getrlimit(resource.RLIMIT_NOFILE)
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 2, free[1]))
with SyncBatch([folder]) as batch:
    for n in range(6):
        batch.write(folder / f"file-{n}", b"content %d" % n)
    batch.add(folder / "written-before")
print("synced")
"""


def test_a_batch_short_of_descriptors_syncs_what_it_holds_and_goes_on(tmp_path: Path) -> None:
    # A daemon whose thread store held most of its descriptors (ulimit -n 20) failed at the
    # same file of a deferred verdict's batch at every retry, for ever.
    done = subprocess.run(
        [sys.executable, "-c", _BATCH_SHORT_OF_DESCRIPTORS, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )
    assert done.returncode == 0 and done.stdout == "synced\n", done.stderr
    assert [(tmp_path / f"file-{n}").read_bytes() for n in range(6)] == [b"content %d" % n for n in range(6)]


def test_deferred_writes_are_complete_files_and_sync_paths_skips_missing(tmp_path: Path) -> None:
    folder = _durable.ensure_dir(tmp_path / "runs" / "r1", durable=False)
    _durable.atomic_write_json(folder / "state.json", {"b": 1, "a": [1]}, durable=False)
    with _durable.SyncBatch() as batch:
        batch.write(folder / "stdout", b"out")
    with _durable.SyncBatch() as batch:
        batch.write(folder / "stdout", b"o")  # truncated, not appended
    _durable.sync_paths([folder / "state.json", folder / "gone"], [folder, folder.parent])
    assert (folder / "state.json").read_bytes() == _durable.json_bytes({"a": [1], "b": 1})
    assert (folder / "stdout").read_bytes() == b"o"
    assert sorted(p.name for p in folder.iterdir()) == ["state.json", "stdout"]
    with pytest.raises(FileNotFoundError):
        _durable.sync_paths([], [folder / "missing-dir"])

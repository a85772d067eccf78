"""``adaptor verify-log``: the real console script on real event logs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adaptor import errors
from adaptor._durable import frame
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
from tests.unwritable import unwritable

TIMEOUT = 120


def _adaptor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["adaptor", "verify-log", *args], capture_output=True, text=True, timeout=TIMEOUT
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """A valid log of five records, written by the recorder itself."""
    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        for i in range(5):
            recorder.record("sess", TextDelta(text=f"line {i}"))
    return tmp_path / "events" / "sess.jsonl"


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _corrupt_line(path: Path, line: int) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(b"line", b"LINE")  # keeps the old crc
    path.write_bytes(b"".join(lines))


def test_valid_log(log: Path) -> None:
    proc = _adaptor(str(log))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ok: 5 records\n", "")
    as_json = _json(_adaptor("--json", str(log)))
    assert as_json == {"ok": True, "exit_code": 0, "result": {"records": 5, "repaired": None}}


def test_empty_log_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    proc = _adaptor(str(path))
    assert (proc.returncode, proc.stdout) == (0, "ok: 0 records\n")


def test_torn_tail_is_reported_then_repaired(log: Path) -> None:
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"crc": 1, "host_seq": 6, "ev')  # a crash mid-append

    proc = _adaptor(str(log))
    assert proc.returncode == 70
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"corrupt: {log} line 6: torn tail: unterminated last line")
    assert "--repair" in proc.stderr
    assert log.read_bytes() != whole  # reporting changes nothing

    as_json = _json(_adaptor("--json", str(log)))
    assert as_json["ok"] is False and as_json["exit_code"] == 70
    assert as_json["result"] == {"records": 5, "repaired": None}
    err = errors.from_wire(as_json["error"])
    assert isinstance(err, sr.JSONLEventLogCorruptError)
    assert (err.key, err.line) == ("sess", 6)

    proc = _adaptor("--repair", str(log))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"repaired: cut a torn line 6 (29 bytes at offset {len(whole)})",
        "ok: 5 records",
    ]
    assert log.read_bytes() == whole


def test_repair_json_reports_what_was_cut(log: Path) -> None:
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"half')
    proc = _adaptor("--repair", "--json", str(log))
    assert proc.returncode == 0
    assert _json(proc) == {
        "ok": True,
        "exit_code": 0,
        "result": {
            "records": 5,
            "repaired": {
                "line": 6,
                "offset": len(whole),
                "dropped_bytes": 6,
                "dropped_preview": '{"half',
            },
        },
    }
    # Nothing left to repair: a second run is a plain success.
    assert _json(_adaptor("--repair", "--json", str(log)))["result"]["repaired"] is None


def test_corruption_before_the_tail_is_never_repaired(log: Path) -> None:
    _corrupt_line(log, 3)
    damaged = log.read_bytes()
    for flags in ([], ["--repair"]):
        proc = _adaptor(*flags, str(log))
        assert proc.returncode == 70
        assert proc.stderr == f"corrupt: {log} line 3: bad crc\n"
        assert proc.stdout == ""
    as_json = _json(_adaptor("--repair", "--json", str(log)))
    assert as_json["ok"] is False and as_json["result"] == {"records": 2, "repaired": None}
    assert as_json["error"]["code"] == "sessionrecorder.ErrJSONLEventLogCorrupt"
    assert as_json["error"]["fields"] == {"key": "sess", "line": 3}
    assert log.read_bytes() == damaged


def test_a_well_framed_but_meaningless_last_line_is_corruption_not_a_torn_tail(log: Path) -> None:
    bogus = frame(
        {
            "v": 1,
            "host_seq": 6,
            "recorded_at": "2026-12-02T10:00:00.000000Z",
            "kind": "no.such.kind",
            "meta": None,
            "event": {"kind": "no.such.kind", "meta": None},
        }
    )
    log.write_bytes(log.read_bytes() + bogus)
    before = log.read_bytes()
    proc = _adaptor("--repair", str(log))
    assert proc.returncode == 70
    assert proc.stderr.startswith(f"corrupt: {log} line 6: bad event: unknown event kind")
    assert log.read_bytes() == before


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = _adaptor(str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr


def test_unreadable_file_is_an_infrastructure_error() -> None:
    proc = _adaptor("--json", "/proc/self/mem")  # a regular file whose first read fails (EIO)
    assert proc.returncode == 70
    out = _json(proc)
    assert out["ok"] is False and out["error"]["code"] == "external"
    assert out["error"]["type"] == "OSError"


def test_a_symlink_checks_and_repairs_the_log_it_names(tmp_path: Path, log: Path) -> None:
    # It was refused with "[Errno 40] Too many levels of symbolic links", exit 70.
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    assert _adaptor(str(link)).stdout == "ok: 5 records\n"
    with log.open("ab") as f:
        f.write(b'{"crc": 1')  # a torn tail
    repaired = _adaptor("--repair", str(link))
    assert repaired.returncode == 0 and repaired.stdout.endswith("ok: 5 records\n")
    assert link.is_symlink() and sr.verify(log) == 5


def test_a_log_read_through_a_pipe(log: Path) -> None:
    # `adaptor verify-log <(zcat events.jsonl.gz)`; a pipe can be checked, not repaired.
    script = 'adaptor verify-log <(cat "$1") && adaptor verify-log --repair <(cat "$1")'
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(log)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.stdout == "ok: 5 records\n"
    assert proc.returncode == 2 and "--repair needs a regular file" in proc.stderr


def test_help_documents_the_exit_codes() -> None:
    proc = subprocess.run(
        ["adaptor", "verify-log", "--help"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0
    assert "exits 70" in " ".join(proc.stdout.split())
    assert "--repair" in proc.stdout and "--json" in proc.stdout


def test_a_thread_store_log_is_named_as_such_not_called_corrupt(tmp_path: Path) -> None:
    # Its lines are framed with a crc too: it was "corrupt ... line 1: missing host_seq", exit
    # 70, as if a healthy store were damaged.
    import adaptor
    from adaptor.drivers import script
    from adaptor.threadstore import JSONLStore

    store = JSONLStore(tmp_path / "threads")
    driver = script.Driver(script.Config(steps=({"text": "x"},), session="auto"))
    adaptor.Agent(driver, thread_store=store).thread("k").run("go")
    store.close()
    checked = _adaptor(str(tmp_path / "threads" / "log-000001.jsonl"))
    assert checked.returncode == 2, checked.stderr
    assert "thread-store log" in checked.stderr and "corrupt" not in checked.stderr
    # So does `adaptor events --file`, which said the same "missing host_seq" (exit 70).
    shown = subprocess.run(["adaptor", "events", "--file", str(tmp_path / "threads" / "log-000001.jsonl")],
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert shown.returncode == 2, shown.stderr
    assert "thread-store log" in shown.stderr and "corrupt" not in shown.stderr


def test_dash_reads_the_log_from_stdin(log: Path) -> None:
    # `zcat log.jsonl.gz | adaptor verify-log -`, as `events --file -` reads it: '-' was taken
    # for a file name ("File '-' does not exist.", exit 2).
    def verify(*args: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["adaptor", "verify-log", *args], input=data, capture_output=True, timeout=TIMEOUT)

    whole = log.read_bytes()
    assert verify("-", data=whole).stdout == b"ok: 5 records\n"
    torn = verify("--json", "-", data=whole[:-3])
    assert torn.returncode == 70 and json.loads(torn.stdout)["result"]["records"] == 4
    said = verify("-", data=whole[:-3]).stderr
    assert b"torn tail" in said and b"--repair" not in said  # which stdin would refuse
    # Nothing on stdin can be cut: the log's own path is needed.
    refused = verify("--repair", "-", data=whole[:-3])
    assert refused.returncode == 2 and b"not stdin" in refused.stderr


def test_a_log_whose_lock_file_the_user_may_not_write_is_verified(log: Path, tmp_path: Path) -> None:
    # A copy of logs shared read-only (chmod a+rX): verify-log exited 70 with "Permission
    # denied: ...jsonl.lock" on a clean log, and `events --file` on a torn copy ended in the
    # same error instead of naming the torn tail.
    torn = tmp_path / "events" / "torn.jsonl"
    torn.write_bytes(log.read_bytes() + b'{"crc":1,"ev')
    torn_lock = Path(str(torn) + ".lock")
    torn_lock.write_bytes(b"")
    lock = Path(str(log) + ".lock")
    assert lock.exists()
    with unwritable(lock, torn_lock):
        clean = _adaptor(str(log))
        assert (clean.returncode, clean.stdout, clean.stderr) == (0, "ok: 5 records\n", "")
        damaged = _adaptor(str(torn))
        assert damaged.returncode == 70, damaged.stderr
        assert damaged.stderr.startswith(f"corrupt: {torn} line 6: torn tail"), damaged.stderr
        read = subprocess.run(["adaptor", "events", "--file", str(torn)], capture_output=True,
                              text=True, timeout=TIMEOUT)
        assert read.returncode == damaged.returncode and "torn tail" in read.stderr, read.stderr
        assert "Permission denied" not in damaged.stderr + read.stderr


def test_a_repair_that_cannot_be_written_still_counts_the_valid_records(log: Path) -> None:
    # --repair --json on a torn log the user may not write (a read-only mount) said
    # "records": 0 beside the OSError, where --json alone said 4.
    log.write_bytes(log.read_bytes()[:-3])
    with unwritable(log):
        checked = _adaptor("--repair", "--json", str(log))
    assert checked.returncode == 70, checked.stderr
    outcome = _json(checked)
    assert outcome["result"] == {"records": 4, "repaired": None}
    assert outcome["error"]["type"] in ("PermissionError", "OSError"), outcome["error"]

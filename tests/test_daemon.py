"""adaptord end to end: a real daemon process, used only through its files."""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import errno
import glob
import importlib
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import filelock
import orjson
import pytest

import adaptor
from adaptor import _durable, _home, _nesting, errors, events
from adaptor import _request as requests
from adaptor.driver import InvalidOutputSchemaError
from adaptor.drivers import NAMES as DRIVER_NAMES
from adaptor.drivers import script as script_driver
from adaptor.spool import Client, InvalidRequestError
from adaptor.threadstore import JSONLStore
from adaptord import config as config_module
from hosttools import sessionrecorder as sr
from tests.costly_schemas import doubling_chain
from tests.daemon_harness import DaemonProcess, identities, marked_processes, processes_with_env
from tests.drivers.conftest import claude_with_deep_input
from tests.inotify_hog import InotifyHog
from tests.mounts import exfat, fat, tmpfs
from tests.task_limit import TaskLimit
from tests.unwritable import unwritable

pytestmark = pytest.mark.slow

SECRET = "sk-test-Zq8Y3vW1secretvalue"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(tmp_path / "home", "--workers", "4", "--grace", "5").start()
    yield proc
    assert proc.stop() == 0


def _fact(record: sr.EventRecord) -> dict[str, Any]:
    """The data of one of the daemon's lifecycle records (each is a ``Notice``)."""
    assert isinstance(record.event, events.Notice), record
    return record.event.data


def script(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"driver": "script", "prompt": "go", "config": {"steps": list(steps)}, **extra}


def test_success_verdict_side_files_and_audit_log(daemon: DaemonProcess) -> None:
    rid = daemon.submit(script({"stdout": "raw line"}, {"text": "hello"}))
    verdict = daemon.verdict(rid)
    assert verdict["format"] == "adaptord.verdict/1" and verdict["id"] == rid
    assert verdict["ok"] is True and verdict["error"] is None and verdict["exit_code"] == 0
    assert verdict["run_id"].startswith("run_")
    result = verdict["result"]
    assert result["text"] == "hello" and result["provider"] == "script"
    assert (daemon.home.root / result["raw"]["stdout"]).read_text() == "raw line\n"
    assert verdict["events"] == f"events/{rid}.jsonl"
    records = sr.EventRecorder(sr.JSONLEventBackend(daemon.home.events), key_validator=lambda k: None).since(rid)
    kinds = [r.event.meta.sequence for r in records]
    assert kinds == sorted(kinds) and records[0].event.meta.run_id == verdict["run_id"]
    assert sr.verify(daemon.home.root / verdict["events"]) == len(records)
    daemon.wait_for_line(f"verdict.written id={rid}")  # recorded before it is logged
    assert not (daemon.home.claimed / f"{rid}.json").exists()
    facts = [
        r
        for r in sr.EventRecorder(sr.JSONLEventBackend(daemon.home.events), key_validator=lambda k: None).since("adaptord")
        if _fact(r).get("request_id") == rid
    ]
    lifecycle = [_fact(r)["phase"] for r in facts]
    assert lifecycle[0] == "request.received" and lifecycle[-1] == "verdict.written"
    assert "request.started" in lifecycle
    # Each fact carries when it happened (it said 1970-01-01), no later than its record.
    times = [r.event.meta.time for r in facts]
    assert times == sorted(times) and times[0].year > 1970
    assert all(r.event.meta.time <= r.recorded_at for r in facts)


def test_run_error_verdict_rebuilds_the_same_exception(daemon: DaemonProcess) -> None:
    rid = daemon.submit(script({"text": "partial"}, {"fail": {"code": "agent_error", "message": "boom"}}))
    verdict = daemon.verdict(rid)
    assert verdict["ok"] is False and verdict["exit_code"] == 1 and verdict["result"] is not None
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.AgentFailedError and err.reason == "agent_error" and str(err) == "boom"


def test_a_schema_pattern_that_backtracks_holds_up_neither_the_daemon_nor_the_deadline(
    daemon: DaemonProcess,
) -> None:
    # Checked in the daemon's process, this output would stop all its threads for minutes.
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": r"^(\w+\s?)+$"}}}
    slow = daemon.submit(script({"output_json": {"name": "a" * 30 + "!"}}, schema=schema, timeout=5))
    daemon.wait_for_line(f"request.started id={slow}")
    quick = daemon.submit(script({"text": "still serving"}))
    assert daemon.verdict(quick)["ok"] is True
    assert not daemon.home.verdict(slow).exists()
    verdict = daemon.verdict(slow)
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunDeadlineExceededError
    structured = verdict["result"]["structured"]
    assert structured["valid"] is False and structured["value"] == {"name": "a" * 30 + "!"}
    assert "validation did not finish" in structured["errors"][0]


def test_costly_looping_or_deep_schema_checks_end_in_their_own_verdicts(
    daemon: DaemonProcess,
) -> None:
    # ~40 s of a worker's thread in process.
    costly = daemon.submit(script({"text": '"no integer"'}, schema=doubling_chain(18), timeout=3))
    looping = daemon.submit(
        script({"text": "[]"}, schema={"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}},
                                      "$ref": "#/$defs/a"})
    )
    deep = daemon.submit(script({"text": "[" * 300 + "]" * 300}, schema={"type": "array"}))

    verdict = daemon.verdict(costly)
    assert type(errors.from_wire(verdict["error"])) is errors.RunDeadlineExceededError
    assert verdict["result"]["structured"]["errors"][0].startswith(
        "$: validation did not finish within"
    )
    verdict = daemon.verdict(looping)
    err = errors.from_wire(verdict["error"])
    assert type(err) is InvalidOutputSchemaError and verdict["exit_code"] == 3
    assert "leads back to where it started" in str(err)
    verdict = daemon.verdict(deep)
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.PolicyViolationError
    assert verdict["result"]["structured"]["errors"] == [
        "output nests arrays and objects deeper than 128 levels"
    ]


@pytest.mark.parametrize("levels", [300, 1000])
def test_agent_values_nested_too_deeply_for_files_are_cut_in_them_only(
    daemon: DaemonProcess, tmp_path: Path, levels: int
) -> None:
    # orjson writes 254 levels, and the redactor (this request has a secret) recursed: the
    # tool call went unrecorded and the verdict of a successful run said "TypeError" (300)
    # or "execution failed" (1000).
    exe = claude_with_deep_input(tmp_path, levels)
    rid = daemon.submit({
        "driver": "claude", "prompt": "Write hello.txt", "workspace": str(tmp_path),
        "config": {"command": exe, "config_dir": str(tmp_path / "profile"),
                   "env": {"ANTHROPIC_API_KEY": "sk-deep-secret-value"}},
    })
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["text"].startswith("Tool result was: File created successfully")
    note = "<nested deeper than 200 levels: not kept>"
    transcript = orjson.loads((daemon.home.root / "runs" / rid / "transcript.json").read_bytes())
    (call,) = [item for item in transcript if item["kind"] == "tool_call"]
    assert note in repr(call["input"]) and not _nesting.deeper_than(call["input"], 200)
    log = daemon.home.root / verdict["events"]
    sr.verify(log)
    recorded = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert "event not recorded" not in "".join(daemon.lines)
    tool_calls = [r["event"] for r in recorded if r["event"]["kind"].startswith("tool_call") and r["event"].get("args")]
    assert tool_calls and all(note in repr(e["args"]) for e in tool_calls)


def test_a_permission_request_with_too_deep_an_input_still_reaches_its_file(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # Its pending file could not be written (orjson stops at 254 levels): the run failed.
    exe = claude_with_deep_input(tmp_path, 1000, capture="claude-perm-stdio-allow")
    rid = daemon.submit({
        "driver": "claude", "prompt": "please create perm.txt", "workspace": str(tmp_path),
        "config": {"command": exe, "config_dir": str(tmp_path / "profile")},
        "policy": {"approvals": {"permission": "ask", "timeout": 60}},
    })
    approval_id = _pending_approval(daemon)
    record = orjson.loads((daemon.home.approvals_pending / f"{approval_id}.json").read_bytes())
    assert record["request_id"] == rid and record["approval_kind"] == "permission"
    assert "<nested deeper than 200 levels: not kept>" in repr(record["details"])
    _home.respond(daemon.home, approval_id, "approve")
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]


def test_thread_runs_share_one_audit_log(daemon: DaemonProcess) -> None:
    first = daemon.submit(script({"text": "one"}, thread={"key": "tenant/7"}, config={"steps": [{"text": "one"}], "session": "auto"}))
    assert daemon.verdict(first)["ok"]
    second = daemon.submit(
        {"driver": "script", "prompt": "again", "thread": {"key": "tenant/7", "resume_only": True},
         "config": {"steps": [{"text": "two"}], "session": "auto"}}
    )
    verdict = daemon.verdict(second)
    assert verdict["ok"], verdict["error"]
    assert verdict["events"] == f"events/{_home.session_for_thread('tenant/7')}.jsonl"
    records = sr.verify(daemon.home.root / verdict["events"])
    assert records > 0


def test_a_thread_store_cleared_by_hand_is_served_without_a_restart(daemon: DaemonProcess) -> None:
    # The daemon's store went on from what it had read: once its log was removed (or a backup
    # put back) every thread run failed with exit 70 ("appended line did not read back")
    # until adaptord was restarted, and each of them left a lease behind in the new file.
    def turn(key: str) -> dict[str, Any]:
        return daemon.verdict(daemon.submit(
            {"driver": "script", "prompt": "go", "thread": {"key": key},
             "config": {"steps": [{"text": "ok"}], "session": "auto"}}
        ))

    assert turn("by-hand")["ok"]
    threads = daemon.home.root / "threads"
    # Taken, so that the daemon takes it anew (as after any pause) rather than lingering on.
    with filelock.FileLock(str(threads / "store.lock"), thread_local=False):
        (threads / "log-000001.jsonl").unlink()
    verdicts = [turn("by-hand") for _ in range(2)]
    assert all(v["ok"] for v in verdicts), [v["error"] for v in verdicts]
    daemon.wait_for_line("thread store damaged or changed by hand; reading it afresh")
    store = JSONLStore(threads)
    agent = adaptor.Agent(script_driver.Driver(script_driver.Config(steps=({"text": "mine"},), session="auto")),
                          thread_store=store, workspace=str(daemon.home.root / "workspace"))
    try:
        assert agent.thread("by-hand").run("go").text == "mine"  # no lease left behind
    finally:
        agent.close()
        store.close()


def test_a_thread_stays_busy_while_the_agent_of_its_killed_holder_runs(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # A program killed -9 mid-turn freed its lease at once, though the agent CLI it had started
    # (a session of its own) went on working on the conversation: the daemon's next turn of the
    # thread resumed the same session beside it, two agents in one workspace.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    gate = tmp_path / "gate"
    transcript = Path(__file__).parent / "drivers" / "transcripts" / "claude-text.jsonl"
    cli = tmp_path / "claude"
    cli.write_text(
        "#!/bin/sh\n"  # held only in the killed program (FAKE_GATE is in its environment)
        'if [ -n "$FAKE_GATE" ]; then echo $$ > "$FAKE_GATE.pid"\n'
        '  while [ ! -e "$FAKE_GATE.go" ]; do sleep 0.05; done; fi\n'
        f"cat {transcript}\n"
    )
    cli.chmod(0o755)
    program = (
        "import sys, adaptor\n"
        "from adaptor.drivers import claude\n"
        "from adaptor.threadstore import JSONLStore\n"
        "agent = adaptor.Agent(claude.Driver(claude.Config(command=sys.argv[1])),\n"
        "                      thread_store=JSONLStore(sys.argv[2]), workspace=sys.argv[3])\n"
        "agent.thread('shared').run('the turn that is killed')\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", program, str(cli), str(daemon.home.threads), str(workspace)],
        env={**os.environ, "FAKE_GATE": str(gate)},
    )
    deadline = time.monotonic() + 30
    while not gate.with_suffix(".pid").exists() or not gate.with_suffix(".pid").read_text().strip():
        assert holder.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    agent_pid = int(gate.with_suffix(".pid").read_text())
    holder.kill()
    holder.wait(timeout=30)
    turn = {"driver": "claude", "prompt": "next", "thread": {"key": "shared"},
            "workspace": str(workspace), "config": {"command": str(cli)}}
    try:
        assert [pid for pid, _ in identities([agent_pid])] == [agent_pid]  # orphaned, working
        verdict = daemon.verdict(daemon.submit(turn))
        assert verdict["exit_code"] == 75, verdict
        assert verdict["error"]["type"] == "ThreadBusyError"
    finally:
        gate.with_suffix(".go").touch()
    while identities([agent_pid]):
        assert time.monotonic() < deadline + 30, "the orphaned agent did not end"
        time.sleep(0.02)
    verdict = daemon.verdict(daemon.submit(turn))  # free once that agent is gone
    assert verdict["ok"], verdict["error"]


def test_a_torn_tail_the_next_thread_run_cuts_from_the_store_is_recorded(daemon: DaemonProcess) -> None:
    # Cut without a word (storage.md: writers record that they did, as the audit logs' cuts
    # are, lifecycle_log.repaired and audit_log.repaired).
    request = {"driver": "script", "prompt": "go", "thread": {"key": "torn"},
               "config": {"steps": [{"text": "ok"}], "session": "auto"}}
    assert daemon.verdict(daemon.submit(request))["ok"]
    log = daemon.home.root / "threads" / "log-000001.jsonl"
    # What a crash mid-append leaves, under the lock so the daemon looks at the file anew.
    torn = b'{"crc":1,"kind":"finalize","reco'
    with filelock.FileLock(str(log.parent / "store.lock"), thread_local=False):
        whole = log.stat().st_size
        with log.open("ab") as f:
            f.write(torn)
    assert daemon.verdict(daemon.submit(request))["ok"]
    daemon.wait_for_line(
        f"adaptord: thread_store.repaired log=log-000001.jsonl offset={whole} dropped_bytes={len(torn)}"
    )
    facts = [r.event for r in sr.EventRecorder(sr.JSONLEventBackend(daemon.home.events)).iter_since("adaptord")]
    [repaired] = [f.data for f in facts if isinstance(f, events.Notice) and f.data.get("phase") == "thread_store.repaired"]
    assert (repaired["log"], repaired["offset"], repaired["dropped_bytes"]) == ("log-000001.jsonl", whole, len(torn))
    assert torn not in log.read_bytes()


def test_a_damaged_thread_store_fails_a_run_with_the_stores_public_error(daemon: DaemonProcess) -> None:
    # The verdict (and `adaptor run` and repr) named the internal adaptor._durable.CorruptLogError.
    request = {"driver": "script", "prompt": "go", "thread": {"key": "damaged"},
               "config": {"steps": [{"text": "ok"}], "session": "auto"}}
    assert daemon.verdict(daemon.submit(request))["ok"]
    log = daemon.home.root / "threads" / "log-000001.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"kind"', b'"kinD"', 1)  # the crc no longer matches
    # A damaged copy put in its place (a new file, so the daemon reads it from the start),
    # under the lock, so that the daemon takes it anew and looks at the files again.
    with filelock.FileLock(str(log.parent / "store.lock"), thread_local=False):
        log.with_name("copy").write_bytes(b"".join(lines))
        log.with_name("copy").replace(log)
    verdict = daemon.verdict(daemon.submit(request))
    assert verdict["exit_code"] == 70, verdict
    error = verdict["error"]
    assert (error["code"], error["type"]) == ("external", "adaptor.threadstore.CorruptLogError")
    assert error["message"] == f"{log}:2: bad crc"  # the file and its line
    # What Client.wait raises is the class the run raised in process (it was an ExternalError).
    rebuilt = errors.from_wire(error)
    assert type(rebuilt) is adaptor.threadstore.CorruptLogError
    assert (rebuilt.path, rebuilt.line, rebuilt.why) == (str(log), 2, "bad crc")
    with JSONLStore(log.parent) as store, pytest.raises(adaptor.threadstore.CorruptLogError) as info:
        store.resolve(adaptor.threadstore.Query(key="damaged"))
    assert type(info.value) is adaptor.threadstore.CorruptLogError
    assert (info.value.path, info.value.line) == (str(log), 2)


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("bad-json.json", b"{not json", "invalid JSON"),
        ("wrong-types.json", orjson.dumps({"driver": 5, "prompt": ["x"]}), "is not of type"),
        # Said in JSON, as written: it said "True is not of type 'string'".
        ("json-values.json", orjson.dumps({"driver": "script", "prompt": True}), '/prompt: true is not of type "string"'),
        ("json-null.json", orjson.dumps({"driver": "script", "prompt": "x", "metadata": None}), "null is not of type"),
        ("non-utf8.json", b'{"driver": "script", "prompt": "\xff\xfe"}', "not UTF-8"),
        ("not-object.json", b"[1, 2]", "JSON object"),
        ("unknown-field.json", orjson.dumps({"driver": "script", "prompt": "x", "surprise": 1}), "Additional properties"),
        ("deep.json", b'{"driver": "script", "prompt": "x", "metadata": ' + b"[" * 1000 + b"]" * 1000 + b"}", ""),
        ("id-mismatch.json", orjson.dumps({"driver": "script", "prompt": "x", "id": "other"}), "must equal"),
        ("relative-ws.json", orjson.dumps({"driver": "script", "prompt": "x", "workspace": "rel/dir"}), "absolute"),
        # Relative to the daemon's working directory, which the request's author cannot know.
        ("relative-skill.json", orjson.dumps({"driver": "script", "prompt": "x", "skills": [{"dir": "skills/lint"}]}), "/skills/0/dir"),
        ("relative-archive.json", orjson.dumps({"driver": "script", "prompt": "x", "skills": [{"key": "k", "archive": "k.zip"}]}), "/skills/0/archive"),
        # The working directory in place of a workspace: relative to the daemon's, as above.
        ("relative-cwd.json", orjson.dumps({"driver": "command", "prompt": "x", "config": {"command": "/bin/true", "cwd": "rel"}}), "/config/cwd"),
        # It failed at the run's start (exit 1), after the request was taken as valid.
        ("nul-cwd.json", orjson.dumps({"driver": "command", "prompt": "x", "config": {"command": "/bin/true", "cwd": "/tmp\0x"}}), "/config/cwd: holds a NUL character"),
        ("bad-driver.json", orjson.dumps({"driver": "nope", "prompt": "x"}), "driver"),
        # resume_only was silently ignored: a fork always starts a new thread.
        ("resume-fork.json", orjson.dumps({"driver": "script", "prompt": "x", "thread": {"key": "k", "resume_only": True, "fork_from": "p"}}), "/thread/resume_only"),
        # orjson read it as 1.8446744073709552e+19 and the agent got that (a prompt of digits
        # is fine: only numbers count).
        ("big-int.json", b'{"driver": "script", "prompt": "12345678901234567890123", "config": {"steps": [{"output_json": {"n": 18446744073709551617}}]}}', "/config/steps/0/output_json/n"),
        # orjson refused these as "number is infinity when parsed as double", naming no place.
        pytest.param("huge-int.json", b'{"driver": "script", "prompt": "x", "timeout": ' + b"9" * 400 + b"}",
                     "/timeout: an integer outside", id="huge-int"),
        pytest.param("huge-float.json", b'{"driver": "script", "prompt": "x", "metadata": {"n": [-1e999]}}',
                     "/metadata/n/0: a number past the range", id="huge-float"),
    ],
)
def test_hostile_files_get_rejection_verdicts(daemon: DaemonProcess, name: str, content: bytes, why: str) -> None:
    daemon.drop(name, content)
    verdict = daemon.verdict(name[: -len(".json")])
    assert verdict["ok"] is False and verdict["exit_code"] == 2
    err = errors.from_wire(verdict["error"])
    assert isinstance(err, errors.AdaptorError) and err.wire_code == "ErrInvalidRequest"
    assert why in str(verdict["error"])
    # the daemon keeps serving
    assert daemon.verdict(daemon.submit(script({"text": "still here"})))["ok"]


def test_a_spool_name_that_is_not_utf8_loses_no_fact(tmp_path: Path) -> None:
    # Its quarantine fact (file="b\udcfe.json") could not be written, and every fact after it
    # in the same batch was lost with it, verdict.written of other requests among them.
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    for name in (b"a1.json", b"b\xfe.json", b"good.json"):
        (home.spool_new / os.fsdecode(name)).write_bytes(orjson.dumps(script({"text": "t"})))
    daemon = DaemonProcess(home.root).start()  # its first scan takes all three in one batch
    try:
        assert daemon.verdict("good")["ok"] and daemon.verdict("a1")["ok"]
        daemon.wait_for_line("verdict.written id=good")
        daemon.wait_for_line("verdict.written id=a1")
    finally:
        assert daemon.stop() == 0
    assert not any("audit log write failed" in line for line in daemon.lines), daemon.lines
    reader = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    facts = [_fact(r) for r in reader.since("adaptord")]
    (aside,) = [f for f in facts if f["phase"] == "request.quarantined"]
    assert aside["file"].endswith("b\\udcfe.json"), aside
    for rid in ("a1", "good"):
        assert [f["phase"] for f in facts if f["request_id"] == rid].count("verdict.written") == 1, facts


def test_a_request_written_with_a_byte_order_mark_runs(daemon: DaemonProcess, tmp_path: Path) -> None:
    # Windows editors and PowerShell's Out-File write one; such a request was rejected as
    # invalid JSON (exit 2) while an approval response written the same way was accepted.
    with_bom = codecs.BOM_UTF8 + orjson.dumps(script({"text": "from a BOM"}))
    daemon.drop("bom.json", with_bom)
    assert daemon.verdict("bom")["result"]["text"] == "from a BOM"
    request = tmp_path / "request.json"
    request.write_bytes(with_bom)
    env = dict(os.environ, ADAPTORD_HOME=str(daemon.home.root))
    submitted = subprocess.run(
        ["adaptor", "submit", str(request)], capture_output=True, text=True, env=env, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    assert daemon.verdict(submitted.stdout.strip())["result"]["text"] == "from a BOM"


def _without_owner_override() -> tuple[str, ...]:
    """A prefix starting the daemon as root without the capabilities that let root link any
    user's file (as an ordinary user runs it), or a skip saying why it cannot be had here."""
    try:
        protected = Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    except OSError:
        protected = False
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not protected:
        pytest.skip("needs root, setpriv and fs.protected_hardlinks = 1")
    return ("setpriv", "--bounding-set", "-fowner,-dac_override", "--")


def test_a_request_file_of_another_user_runs(tmp_path: Path) -> None:
    # `sudo cp request.json spool/new/` leaves a root-owned file in a user's spool (a file
    # another user wrote and moved in is the same).  A system protecting hard links (most
    # distributions) lets only a file's owner link it, so the claim's link failed, was tried
    # again at every scan, for ever, and the request never got a verdict.
    daemon = DaemonProcess(tmp_path / "home", prefix=_without_owner_override()).start()
    try:
        staged = daemon.home.spool_tmp / "foreign.json"
        staged.write_bytes(orjson.dumps(script({"text": "from another user"})))
        os.chown(staged, 12345, 12345)
        os.rename(staged, daemon.home.spool_new / "foreign.json")
        assert daemon.verdict("foreign")["result"]["text"] == "from another user"
        assert not (daemon.home.spool_new / "foreign.json").exists()
        assert daemon.verdict(daemon.submit(script({"text": "own"})))["ok"]
    finally:
        assert daemon.stop() == 0
    assert not any("could not take a spool entry" in line for line in daemon.lines), daemon.lines


def test_hostile_entries_are_quarantined(daemon: DaemonProcess, tmp_path: Path) -> None:
    new = daemon.home.spool_new
    outside = tmp_path / "outside.json"
    outside.write_bytes(orjson.dumps(script({"text": "x"})))
    os.symlink(outside, new / "symlinked.json")
    os.mkfifo(new / "fifo.json")
    (new / "directory.json").mkdir()
    daemon.drop("huge.json", b'{"driver": "script", "prompt": "' + b"x" * (10 * 1024 * 1024) + b'"}')
    (new / "no extension").write_bytes(b"{}")
    (new / "..weird.json").write_bytes(b"{}")
    for rid in ("symlinked", "fifo", "directory", "huge"):
        verdict = daemon.verdict(rid)
        assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest"
    assert daemon.verdict(daemon.submit(script({"text": "fine"})))["ok"]
    quarantined = sorted(p.name for p in daemon.home.quarantine.iterdir())
    assert any(n.endswith("no extension") for n in quarantined)
    assert any(n.endswith("..weird.json") for n in quarantined)
    assert list(new.iterdir()) == []
    assert outside.exists()  # a symlink target is never touched


def test_a_misnamed_entry_long_in_bytes_is_quarantined(daemon: DaemonProcess) -> None:
    # 83 CJK characters and ".json": 254 bytes, a valid name, but its first 150 characters
    # were too long a name for quarantine/ (ENAMETOOLONG): it stayed in spool/new, its failure
    # logged at every scan, for ever.
    name = "\u65e5" * 83 + ".json"
    daemon.drop(name, orjson.dumps(script({"text": "x"})))
    deadline = time.monotonic() + 60
    while list(daemon.home.spool_new.iterdir()) and time.monotonic() < deadline:
        if any("cannot quarantine" in line for line in daemon.lines):
            break
        time.sleep(0.02)
    assert list(daemon.home.spool_new.iterdir()) == [], daemon.lines
    [quarantined] = daemon.home.quarantine.iterdir()
    cut = quarantined.name.partition("-")[2]
    assert name.startswith(cut) and len(cut.encode()) <= 150 and len(cut) == 50
    assert not any("cannot quarantine" in line for line in daemon.lines), daemon.lines


def test_a_quarantined_request_keeps_no_secret(daemon: DaemonProcess) -> None:
    # A file dropped for an id already used, or under a name that is no <id>.json, went to
    # quarantine/ as written, its env values with it, for the 30 days quarantine is kept.
    request = {"driver": "script", "prompt": "x", "config": {"env": {"TOKEN": SECRET}, "steps": [{"text": "one"}]}}
    rid = daemon.submit(request)
    assert daemon.verdict(rid)["ok"]
    daemon.drop(f"{rid}.json", orjson.dumps({**request, "id": rid}))  # the id is taken
    daemon.wait_for_line(f"id_in_use={rid}")
    daemon.drop("notes.txt", orjson.dumps(request))  # no request's name
    deadline = time.monotonic() + 60
    while len(list(daemon.home.quarantine.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    kept = [orjson.loads(p.read_bytes()) for p in daemon.home.quarantine.iterdir()]
    assert len(kept) == 2 and all(k["config"]["env"] == {"TOKEN": "<redacted>"} for k in kept)
    assert all(k["config"]["steps"] == [{"text": "one"}] for k in kept)  # the rest as written
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []


def test_a_hard_linked_request_is_rejected_and_its_file_left_alone(daemon: DaemonProcess, tmp_path: Path) -> None:
    # A request file in spool/new/ that is another name of a file outside the spool was run as
    # the daemon's own, and chmodded to 0600: the file outside changed mode.
    outside = tmp_path / "elsewhere.json"
    content = orjson.dumps(script({"text": "ran"}))
    outside.write_bytes(content)
    outside.chmod(0o644)
    os.link(outside, daemon.home.spool_new / "hardlinked.json")
    verdict = daemon.verdict("hardlinked")
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
    assert "another name outside the spool (a hard link)" in verdict["error"]["message"]
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644 and outside.read_bytes() == content
    assert list(daemon.home.spool_new.iterdir()) == []
    # Still named in spool/tmp/, where its writer staged it (`ln` without the `rm`, or the
    # moment between the two): the spool's own file, so it runs.
    staged = daemon.home.spool_tmp / "staged.json"
    staged.write_bytes(orjson.dumps(script({"text": "staged"})))
    os.link(staged, daemon.home.spool_new / "staged.json")
    assert daemon.verdict("staged")["result"]["text"] == "staged"


def test_a_refused_request_still_named_where_it_was_staged_gets_its_verdict(daemon: DaemonProcess) -> None:
    # Client.submit stages spool/tmp/<id>.json, links it into spool/new/, then removes the
    # staged name.  A daemon quarantining the file (too large) in between took the staged name
    # for another request with that id and wrote no verdict: the submitter waited forever.
    too_large = b'{"driver": "script", "prompt": "' + b"x" * (_home.MAX_REQUEST_BYTES + 1) + b'"}'
    staged = daemon.home.spool_tmp / "big.json"
    staged.write_bytes(too_large)
    os.link(staged, daemon.home.spool_new / "big.json")
    verdict = daemon.verdict("big")
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
    assert f"larger than {_home.MAX_REQUEST_BYTES} bytes" in verdict["error"]["message"]
    # Another file on its way in under that id is another request: it keeps the id.
    (daemon.home.spool_tmp / "twin.json").write_bytes(orjson.dumps(script({"text": "the twin"})))
    (daemon.home.spool_new / "twin.json").write_bytes(too_large)
    daemon.wait_for_line("id_in_use=twin")
    assert not daemon.home.verdict("twin").exists()


def test_a_symlinked_run_folder_is_never_written_through(daemon: DaemonProcess, tmp_path: Path) -> None:
    # runs/<id> a symbolic link to a folder elsewhere: the run's request copy, state and side
    # files were all written there.  Now nothing runs: the request is rejected.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # What a run folder holds, as if an earlier request's: taken for one, it was removed (the
    # link) at the request's receipt, and the request ran.  A plain file there went the same way.
    (elsewhere / "state.json").write_bytes(orjson.dumps({"id": "linked", "status": "done", "attempt": 1}))
    (elsewhere / "notes.tmp-1").write_text("someone's notes\n")
    (daemon.home.runs / "linked").symlink_to(elsewhere)
    (daemon.home.runs / "filed").write_text("a file of someone's\n")
    rid = daemon.submit(script({"text": "x"}, id="linked"))
    verdict = daemon.verdict(rid)
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
    assert "runs/linked is a symbolic link" in verdict["error"]["message"]
    assert verdict["run_id"] is None and verdict["result"] is None
    assert sorted(p.name for p in elsewhere.iterdir()) == ["notes.tmp-1", "state.json"]
    assert (daemon.home.runs / "linked").is_symlink()
    filed = daemon.verdict(daemon.submit(script({"text": "x"}, id="filed")))
    assert "runs/filed is not a folder" in filed["error"]["message"], filed
    assert (daemon.home.runs / "filed").read_text() == "a file of someone's\n"
    assert daemon.verdict(daemon.submit(script({"text": "still here"})))["ok"]


def test_a_restart_never_follows_a_link_at_a_claimed_requests_run_folder(tmp_path: Path) -> None:
    # Its sweep of half-written temporary files followed runs/<id> as a link and removed a
    # `notes.tmp-1` of someone's outside the home.
    home = tmp_path / "home"
    proc = DaemonProcess(home, "--workers", "1").start()
    blocker = proc.submit(script({"sleep": 60}))
    proc.wait_for_line(f"request.started id={blocker}")
    queued = proc.submit(script({"text": "x"}))
    proc.wait_for_line(f"request.queued id={queued}")
    proc.kill9()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.tmp-1").write_text("someone's notes\n")
    (proc.home.runs / queued).symlink_to(elsewhere)
    restarted = DaemonProcess(home).start()
    try:
        assert "is a symbolic link" in restarted.verdict(queued)["error"]["message"]
    finally:
        assert restarted.stop() == 0
    assert (elsewhere / "notes.tmp-1").read_text() == "someone's notes\n"


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo"])
def test_a_link_among_a_run_s_files_fails_the_run_and_is_never_written_through(
    daemon: DaemonProcess, tmp_path: Path, kind: str
) -> None:
    # A side file planted in runs/<id>/ before the run: a symbolic link deferred the verdict
    # forever (ELOOP at every retry), a hard link had the file outside emptied and written, a
    # FIFO held the worker forever.  Now the run's verdict is written at once, as an
    # infrastructure failure naming the file.
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    planted = daemon.home.runs / "planted" / "stdout"
    planted.parent.mkdir(mode=0o700)
    if kind == "symlink":
        planted.symlink_to(victim)
    elif kind == "hard link":
        os.link(victim, planted)
    else:
        os.mkfifo(planted)
    rid = daemon.submit(script({"stdout": "out"}, {"text": "done"}, id="planted"))
    verdict = daemon.verdict(rid)
    assert (verdict["ok"], verdict["exit_code"]) == (False, 1), verdict
    assert verdict["error"]["code"] == "RunError" and verdict["error"]["reason"] == "infrastructure_error"
    assert verdict["error"]["details"] == {"path": "runs/planted/stdout"}
    assert verdict["result"]["text"] == "done"  # what the run said is kept; no file is named
    assert verdict["result"]["raw"] == {"stdout": None, "stderr": None, "terminal": None}
    with pytest.raises(errors.RunError) as info:
        Client(daemon.home.root).wait(rid, timeout=60)
    assert info.value.reason == "infrastructure_error" and info.value.result is not None
    assert victim.read_bytes() == b"precious\n"
    assert daemon.verdict(daemon.submit(script({"text": "still here"})))["ok"]
    assert not any("verdict.deferred" in line for line in daemon.lines)


def test_a_symlink_at_a_verdict_s_name_is_moved_aside_for_the_verdict(daemon: DaemonProcess, tmp_path: Path) -> None:
    # verdicts/<id>.json planted as a symbolic link: the verdict could never be linked into
    # place, so the request never got one, and reading it was an untyped ELOOP (exit 70).
    nowhere = tmp_path / "nowhere.json"
    (daemon.home.verdicts / "named.json").symlink_to(nowhere)
    client = Client(daemon.home.root)
    assert client.verdict("named") is None  # a link is no verdict
    rid = daemon.submit(script({"text": "x"}, id="named"))
    with pytest.raises(InvalidRequestError) as info:
        client.wait(rid, timeout=60)
    assert "verdicts/named.json is a symbolic link" in str(info.value)
    assert not (daemon.home.verdicts / "named.json").is_symlink()
    assert not nowhere.exists()
    moved = [p for p in daemon.home.quarantine.iterdir() if p.name.endswith("-verdict-named.json")]
    assert len(moved) == 1 and moved[0].readlink() == nowhere


def test_a_verdict_written_while_its_request_ran_is_moved_aside_for_the_runs(daemon: DaemonProcess, tmp_path: Path) -> None:
    # An agent may write anything its user may: its own request's verdict, forged, was kept
    # (write_once keeps what is there) and the run's own thrown away, without a word.
    forge = tmp_path / "forge.sh"
    forge.write_text(
        '#!/bin/sh\nf="$ADAPTORD_OWNER/verdicts/.forged"\n'
        'printf \'{"format": "adaptord.verdict/1", "id": "forged", "ok": true}\' > "$f"\n'
        'mv "$f" "$ADAPTORD_OWNER/verdicts/forged.json"\necho the real answer\n'
    )
    forge.chmod(0o755)
    rid = daemon.submit({"id": "forged", "driver": "command", "config": {"command": str(forge)}, "prompt": "x"})
    daemon.wait_for_line(f"verdict.written id={rid} ok=True")
    assert daemon.verdict(rid)["result"]["text"] == "the real answer"
    [moved] = [p for p in daemon.home.quarantine.iterdir() if p.name.endswith("-verdict-forged.json")]
    assert b'"ok": true' in moved.read_bytes()
    [said] = [line for line in daemon.lines if "verdict.set_aside" in line]
    assert f"file={moved.name}" in said and 'why="a verdict this daemon did not write"' in said, said


def test_a_run_folder_its_agent_replaced_with_a_link_is_not_written_through(daemon: DaemonProcess, tmp_path: Path) -> None:
    # The agent moved its runs/<id>/ aside and put a link to another folder there: the
    # daemon wrote the run's output, result and state through it, without a word.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    swap = tmp_path / "swap.sh"
    swap.write_text(
        '#!/bin/sh\nrun="$ADAPTORD_OWNER/runs/swapped"\n'
        f'mv "$run" "$run.aside" && ln -s {elsewhere} "$run"\necho done\n'
    )
    swap.chmod(0o755)
    rid = daemon.submit({"id": "swapped", "driver": "command", "config": {"command": str(swap)}, "prompt": "x"})
    verdict = daemon.verdict(rid)
    assert verdict["ok"] is False and verdict["error"]["reason"] == "infrastructure_error", verdict
    assert "the run's files were not written: runs/swapped is a symbolic link" in verdict["error"]["message"]
    assert list(elsewhere.iterdir()) == []
    daemon.wait_for_line("run.files_refused id=swapped")


def test_a_request_without_workspace_runs_in_the_homes_workspace(tmp_path: Path) -> None:
    # It ran in the daemon's own working directory (/ under systemd), outside its home.
    started_in = tmp_path / "daemon-cwd"
    started_in.mkdir()
    configured = tmp_path / "configured"
    configured.mkdir()
    pwd = tmp_path / "pwd.sh"
    pwd.write_text("#!/bin/sh\npwd -P\n")
    pwd.chmod(0o755)
    daemon = DaemonProcess(tmp_path / "home", cwd=started_in).start()
    workspace = daemon.home.root / "workspace"

    def ran_in(**config: Any) -> tuple[str, dict[str, Any]]:
        rid = daemon.submit({"driver": "command", "config": {"command": str(pwd), **config}, "prompt": "x"})
        verdict = daemon.verdict(rid)
        assert verdict["ok"], verdict["error"]
        return verdict["result"]["text"], orjson.loads((daemon.home.run_dir(rid) / "request.json").read_bytes())

    text, copy = ran_in()
    assert text == os.path.realpath(workspace) != os.path.realpath(started_in)
    assert copy["workspace"] == str(workspace)  # the request copy says where it ran
    assert stat.S_IMODE(os.lstat(workspace).st_mode) == 0o700
    # A cwd in the driver config is where it runs, as in-process.
    text, copy = ran_in(cwd=str(configured))
    assert text == os.path.realpath(configured) and copy.get("workspace") is None
    shutil.rmtree(workspace)  # cleaned up by hand: made again for the next run
    text, _ = ran_in()
    assert text == os.path.realpath(workspace)
    assert daemon.stop() == 0
    # Part of the layout: a symbolic link there is refused like any other.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(workspace)
    workspace.symlink_to(elsewhere)
    refused = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(daemon.home.root)],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2 and f"{workspace} is a symbolic link" in refused.stderr


def test_secrets_appear_nowhere(daemon: DaemonProcess) -> None:
    request = script(
        {"stdout": f"leaking {SECRET} to stdout"},
        {"text": f"the token is {SECRET}"},
        {"fail": {"code": "agent_error", "message": f"failed with {SECRET}"}},
    )
    request["config"]["env"] = {"API_TOKEN": SECRET}
    rid = daemon.submit(request)
    verdict = daemon.verdict(rid)
    assert verdict["error"]["code"] == "ErrAgentFailed"
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []
    assert all(SECRET not in line for line in daemon.lines)
    kept = orjson.loads((daemon.home.run_dir(rid) / "request.json").read_bytes())
    assert kept["config"]["env"] == {"API_TOKEN": "<redacted>"}


def test_an_mcp_servers_url_password_appears_nowhere(daemon: DaemonProcess) -> None:
    # A header's value was a secret, the password of an http://user:password@ URL was not:
    # it stayed in runs/<id>/request.json and wherever the request was shown.
    password = "pw%2FZq81-" + SECRET[-12:]  # percent-escaped as a URL carries a "/"
    request = script({"text": "ok"})
    request["mcp"] = [{"key": "docs", "transport": "http", "url": f"http://alice:{password}@127.0.0.1:9/mcp"}]
    rid = daemon.submit(request)
    assert daemon.verdict(rid)["ok"] is True
    kept = orjson.loads((daemon.home.run_dir(rid) / "request.json").read_bytes())
    assert kept["mcp"][0]["url"] == "http://alice:<redacted>@127.0.0.1:9/mcp"
    assert daemon.stop() == 0
    for shown in (password, "pw/Zq81-" + SECRET[-12:]):
        assert daemon.files_holding(shown) == []
        assert all(shown not in line for line in daemon.lines)


def test_a_deny_reason_quoting_a_secret_is_kept_redacted(daemon: DaemonProcess) -> None:
    # approvals/resolved/ keeps the outcome the run took, for a restart to log (a week long):
    # redacted as the run's log has it, not as the responder wrote it.
    request = script({"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
                     policy={"approvals": {"timeout": 600, "on_reject": "continue"}})
    request["config"]["env"] = {"API_TOKEN": SECRET}
    rid = daemon.submit(request)
    approval_id = _pending_approval(daemon)
    _home.respond(daemon.home, approval_id, "deny", text=f"not with {SECRET}")
    assert daemon.verdict(rid)["ok"]
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []
    resolved = orjson.loads((daemon.home.approvals_resolved / f"{approval_id}.json").read_bytes())
    assert resolved["result"] == "deny" and resolved["outcome"]["text"] == "not with <redacted>"


def test_env_secrets_from_the_daemon_config_appear_nowhere(tmp_path: Path) -> None:
    # API keys usually live in the config's driver table, not in each request.
    config = tmp_path / "config.toml"
    config.write_text(f'[drivers.command]\nenv = {{API_TOKEN = "{SECRET}"}}\n')
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    echo = 'printf "token=%s\\n" "$API_TOKEN"; printf "err %s\\n" "$API_TOKEN" >&2'
    # The prompt quotes it too: the request copy in runs/<id>/ kept it (only the request's own
    # env values were redacted there).
    rid = daemon.submit(
        {"driver": "command", "prompt": f"deploy with {SECRET}",
         "config": {"command": "/bin/sh", "extra_args": ["-c", echo]}}
    )
    verdict = daemon.verdict(rid)
    assert daemon.stop() == 0
    assert verdict["ok"] and verdict["result"]["text"] == "token=<redacted>"  # the agent had it
    kept = orjson.loads((daemon.home.run_dir(rid) / "request.json").read_bytes())
    assert kept["prompt"] == "deploy with <redacted>"
    assert daemon.files_holding(SECRET) == []
    assert all(SECRET not in line for line in daemon.lines)


def test_the_daemons_own_a2a_credentials_reach_no_agent_and_no_file(tmp_path: Path) -> None:
    # a2a.md has the delegation token read from adaptord's environment: every agent inherited
    # it (an agent told to print its environment showed it), and it was kept unredacted in the
    # verdict, the audit log and the run's files (and so reached A2A callers).
    remote_token, bridge_token = "remote-cred-" + SECRET, "bridge-cred-" + SECRET
    config = tmp_path / "config.toml"
    config.write_text(
        '[a2a]\nbearer_token_env = "QA_BRIDGE_TOKEN"\n'
        '[a2a.agents.echo.request]\ndriver = "script"\n'
        '[a2a.remotes.helper]\ncard_url = "http://127.0.0.1:9/agents/helper/.well-known/agent-card.json"\n'
        'bearer_token_env = "QA_REMOTE_TOKEN"\n'
    )
    daemon = DaemonProcess(
        tmp_path / "home", "--config", str(config),
        env={"QA_REMOTE_TOKEN": remote_token, "QA_BRIDGE_TOKEN": bridge_token},
    ).start()
    show = 'printf "remote=%s bridge=%s\n" "${QA_REMOTE_TOKEN-unset}" "${QA_BRIDGE_TOKEN-unset}"'
    rid = daemon.submit({"driver": "command", "prompt": "x", "config": {"command": "/bin/sh", "extra_args": ["-c", show]}})
    verdict = daemon.verdict(rid)
    # A driver's own env may still hand one on: redacted like any secret.
    quoted = daemon.submit(script({"text": f"the token is {remote_token}"}))
    quoted_verdict = daemon.verdict(quoted)
    assert daemon.stop() == 0
    assert verdict["ok"] and verdict["result"]["text"] == "remote=unset bridge=unset"
    assert quoted_verdict["result"]["text"] == "the token is <redacted>"
    assert daemon.files_holding(remote_token, bridge_token) == []


def test_a_secret_of_several_lines_appears_in_no_file_line_by_line(daemon: DaemonProcess) -> None:
    lines = ["-----BEGIN PRIVATE KEY-----", "MIIEvQIBADANBgkqhkiG9w0BAQEF", "-----END PRIVATE KEY-----"]
    echo = 'printf "%s\\n" "$KEY"; printf "%s\\n" "$KEY" >&2; exit 1'
    rid = daemon.submit(
        {"driver": "command", "prompt": "x",
         "config": {"command": "/bin/sh", "extra_args": ["-c", echo], "env": {"KEY": "\n".join(lines)}}}
    )
    assert daemon.verdict(rid)["ok"] is False
    assert daemon.stop() == 0
    assert daemon.files_holding(*lines) == []
    assert not any(lines[1] in line for line in daemon.lines)


def test_no_request_or_config_may_set_the_mark_of_the_daemons_processes(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    # Set to another home, the agent would be stopped by that home's daemon at its next start.
    other = str(tmp_path / "other-home")
    rid = daemon.submit(
        {"driver": "command", "prompt": "x", "config": {"command": "/bin/cat", "env": {"ADAPTORD_OWNER": other}},
         "mcp": [{"key": "m", "transport": "stdio", "command": "/bin/true", "env": {"ADAPTORD_OWNER": other}}]}
    )
    verdict = daemon.verdict(rid)
    assert verdict["exit_code"] == 2
    assert [e["path"] for e in verdict["error"]["fields"]["errors"]] == [
        "/config/env/ADAPTORD_OWNER", "/mcp/0/env/ADAPTORD_OWNER"
    ]
    config = tmp_path / "config.toml"
    config.write_text(f'[drivers.command]\nenv = {{ADAPTORD_OWNER = "{other}"}}\n')
    refused = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "h2"), "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2 and "ADAPTORD_OWNER is set by adaptord itself" in refused.stderr


def test_secrets_of_malformed_env_values_are_not_quoted_back(daemon: DaemonProcess) -> None:
    rid = daemon.submit({"driver": "script", "prompt": "x", "config": {"env": {"TOKEN": [SECRET, 12345678]}}})
    verdict = daemon.verdict(rid)
    assert verdict["exit_code"] == 2
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []


@pytest.mark.parametrize(
    "misshapen",
    [
        {"mcp": {"key": "gh", "transport": "stdio", "command": "gh-mcp", "env": {"GITHUB_TOKEN": SECRET}}},
        {"mcp": [[{"key": "gh", "transport": "http", "url": "http://127.0.0.1:9", "headers": {"A": SECRET}}]]},
        {"config": [{"env": {"TOKEN": SECRET}}]},
    ],
    ids=["one-server-without-its-list", "servers-nested-once-more", "config-as-a-list"],
)
def test_secrets_in_a_misshapen_container_are_not_quoted_back(
    daemon: DaemonProcess, tmp_path: Path, misshapen: dict[str, Any]
) -> None:
    # The schema error quotes the whole misshapen value; only env and headers in a config
    # object and in a list of servers were known as secrets: the verdict, `adaptor wait` and
    # `adaptor run --no-daemon` showed the token.
    request = {"driver": "script", "prompt": "x", **misshapen}
    rid = daemon.submit(request)
    verdict = daemon.verdict(rid)
    assert verdict["exit_code"] == 2 and "<redacted>" in verdict["error"]["message"]
    path = tmp_path / "request.json"
    path.write_bytes(orjson.dumps(request))
    inside = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--json", "--request", str(path)],
        capture_output=True, text=True, timeout=60,
    )
    assert inside.returncode == 2 and SECRET not in inside.stdout + inside.stderr
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []


def test_second_daemon_on_the_same_home_exits_69(daemon: DaemonProcess) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(daemon.home.root)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 69
    assert "already running" in proc.stderr


def test_status_reports_the_daemon(daemon: DaemonProcess, tmp_path: Path) -> None:
    running = subprocess.run([sys.executable, "-m", "adaptord", "status", "--home", str(daemon.home.root)], capture_output=True, text=True)
    assert running.returncode == 0 and "running" in running.stdout
    idle = subprocess.run([sys.executable, "-m", "adaptord", "status", "--home", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert idle.returncode == 69


def test_status_json_has_one_shape_running_or_not(daemon: DaemonProcess, tmp_path: Path) -> None:
    # A stopped daemon's report lacked pid, workers, ...: `jq .pid` scripts met two shapes.
    def report(home: Path) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "adaptord", "status", "--json", "--home", str(home)], capture_output=True, text=True, timeout=60
        )
        parsed: dict[str, Any] = orjson.loads(proc.stdout)
        return parsed

    assert daemon.proc is not None
    running = report(daemon.home.root)
    idle = report(tmp_path / "nothing")
    assert list(idle) == list(running)
    assert running["running"] is True and running["pid"] == daemon.proc.pid and running["workers"] == 4
    assert idle == {"running": False, "home": str(tmp_path / "nothing"), **{key: None for key in list(running)[2:]}}


def test_adaptord_home_takes_precedence_over_the_flag_and_says_so(daemon: DaemonProcess, tmp_path: Path) -> None:
    # daemon.md: ADAPTORD_HOME, else --home.  The flag won before, against the spec.
    elsewhere = str(tmp_path / "elsewhere")
    env = {**os.environ, "ADAPTORD_HOME": str(daemon.home.root)}
    for program in (["-m", "adaptord", "status"], ["-m", "adaptor", "status"]):
        proc = subprocess.run([sys.executable, *program, "--home", elsewhere], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert str(daemon.home.root) in proc.stdout and elsewhere not in proc.stdout
        assert f"ADAPTORD_HOME={daemon.home.root} takes precedence over --home {elsewhere}" in proc.stderr
        same = subprocess.run([sys.executable, *program, "--home", str(daemon.home.root)], capture_output=True, text=True, env=env, timeout=60)
        assert same.returncode == 0 and same.stderr == ""  # nothing to say when they agree
        link = tmp_path / f"link-{program[1]}"
        link.symlink_to(daemon.home.root)  # the same directory by another name agrees too
        linked = subprocess.run([sys.executable, *program, "--home", str(link)], capture_output=True, text=True, env=env, timeout=60)
        assert linked.returncode == 0 and linked.stderr == ""
    unset = {k: v for k, v in os.environ.items() if k != "ADAPTORD_HOME"} | {"ADAPTORD_HOME": ""}
    flag = subprocess.run([sys.executable, "-m", "adaptord", "status", "--home", str(daemon.home.root)], capture_output=True, text=True, env=unset, timeout=60)
    assert flag.returncode == 0 and flag.stderr == ""  # an empty variable is no variable


def test_an_empty_home_is_a_usage_error_not_the_current_directory(tmp_path: Path) -> None:
    for program in (["-m", "adaptord", "serve"], ["-m", "adaptord", "status"], ["-m", "adaptor", "status"]):
        proc = subprocess.run([sys.executable, *program, "--home", ""], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "--home" in proc.stderr and "is empty" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # served the current directory before


def test_status_of_a_damaged_daemon_state_is_running_without_details(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path / "home").start()
    proc.home.daemon_state.write_bytes(b'{"pid": 12')
    status = subprocess.run([sys.executable, "-m", "adaptord", "status", "--json", "--home", str(proc.home.root)], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "Traceback" not in status.stderr
    fields = ("pid", "started_at", "workers", "cpu", "version", "a2a_url")
    assert orjson.loads(status.stdout) == {"running": True, "home": str(proc.home.root), **dict.fromkeys(fields)}
    assert "is unreadable" in status.stderr
    assert proc.stop() == 0


def test_same_thread_key_runs_in_arrival_order(daemon: DaemonProcess) -> None:
    ids = [
        daemon.submit(
            {"driver": "script", "prompt": str(i), "thread": {"key": "ordered"},
             "config": {"steps": [{"sleep": 0.05}, {"text": f"turn {i}"}], "session": "auto"}}
        )
        for i in range(4)
    ]
    verdicts = [daemon.verdict(rid) for rid in ids]
    assert all(v["ok"] for v in verdicts), [v["error"] for v in verdicts]
    spans = [(v["started_at"], v["finished_at"]) for v in verdicts]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_a_threads_next_turn_starts_before_requests_that_arrived_after_it(tmp_path: Path) -> None:
    # The next turn of a thread, ready once the turn before it ended, went behind every request
    # queued meanwhile: turns queued before 800 one-off requests started 803rd and 804th.
    proc = DaemonProcess(tmp_path / "home", "--workers", "1").start()
    try:
        def turn(i: int, *steps: dict[str, Any]) -> str:
            return proc.submit({"driver": "script", "prompt": str(i), "thread": {"key": "fair"},
                                "policy": {"approvals": {"timeout": 60}},
                                "config": {"steps": [*steps, {"text": f"turn {i}"}], "session": "auto"}})

        first = turn(0, {"approval": {"kind": "permission", "title": "hold the only worker"}})
        approval = _pending_approval(proc)  # the one worker is busy with it
        second = turn(1)
        later = [proc.submit(script({"text": f"later {i}"})) for i in range(3)]
        proc.wait_for_line(f"request.received id={later[-1]}")
        _home.respond(proc.home, approval, "approve")
        order = [first, second, *later]
        verdicts = [proc.verdict(rid) for rid in order]
        assert all(v["ok"] for v in verdicts), [v["error"] for v in verdicts]
        started = [v["started_at"] for v in verdicts]
        assert started == sorted(started), list(zip(order, started, strict=True))
    finally:
        assert proc.stop() == 0


def test_a_fork_waits_for_its_parents_earlier_requests_and_later_ones_wait_for_it(
    daemon: DaemonProcess,
) -> None:
    # The fork reads (and leases) its parent: inside one daemon it takes its turn on the
    # parent's key too, rather than finding the lease taken by a sibling worker (exit 75).
    def turn(key: str, text: str, sleep: float = 0.0, fork_from: str | None = None) -> str:
        thread: dict[str, Any] = {"key": key}
        if fork_from is not None:
            thread["fork_from"] = fork_from
        steps: list[dict[str, Any]] = [{"sleep": sleep}] if sleep else []
        return daemon.submit(
            {"driver": "script", "prompt": text, "thread": thread,
             "config": {"steps": [*steps, {"text": text}], "session": "auto"}}
        )

    first = turn("fork/parent", "first")
    daemon.verdict(first)
    running = turn("fork/parent", "second", sleep=1.0)
    daemon.wait_for_line(f"request.started id={running}")
    fork = turn("fork/child", "forked", fork_from="fork/parent")
    dropped = turn("fork/child-2", "never", fork_from="fork/parent")
    _home.request_cancel(daemon.home, dropped)  # its place in both lines goes with it
    after = turn("fork/parent", "third")
    other = turn("fork/elsewhere", "unrelated")
    assert daemon.verdict(dropped)["error"]["code"] == errors.CancelledError.code
    verdicts = {rid: daemon.verdict(rid) for rid in (running, fork, after, other)}
    assert all(v["ok"] for v in verdicts.values()), [v["error"] for v in verdicts.values()]
    spans = {rid: (v["started_at"], v["finished_at"]) for rid, v in verdicts.items()}
    assert spans[running][1] <= spans[fork][0]  # waited for the parent's running turn
    assert spans[fork][1] <= spans[after][0]  # the parent's next turn waited for the fork
    assert spans[other][0] < spans[running][1]  # an unrelated key did not wait at all


def test_sigterm_drains_running_work_and_writes_its_verdict(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path / "home", "--grace", "30").start()
    rid = proc.submit(script({"text": "started"}, {"sleep": 0.5}, {"text": "finished"}))
    on_thread = proc.submit(
        {"driver": "script", "prompt": "x", "thread": {"key": "drained"},
         "config": {"steps": [{"sleep": 0.5}, {"text": "finished too"}], "session": "auto"}}
    )
    proc.wait_for_line(f"request.started id={rid}")
    proc.wait_for_line(f"request.started id={on_thread}")
    behind = proc.submit({"driver": "script", "prompt": "x", "thread": {"key": "drained"}, "config": {"steps": []}})
    proc.wait_for_line(f"request.queued id={behind}")
    proc.signal(signal.SIGTERM)
    # Not stop(): its SIGTERM, handled after this one (a loaded machine), ends the drain's grace.
    assert proc.wait_exit() == 0
    verdict = orjson.loads(proc.home.verdict(rid).read_bytes())
    assert verdict["ok"] and verdict["result"]["text"] == "finished"
    verdict = orjson.loads(proc.home.verdict(on_thread).read_bytes())
    assert verdict["ok"] and verdict["result"]["text"] == "finished too"
    assert not [line for line in proc.lines if "worker failed" in line]
    # The one queued behind its thread went back to the spool, which the log says: it showed
    # it received twice, with nothing in between, once the next start claimed it again.
    assert (proc.home.spool_new / f"{behind}.json").exists()
    assert _lifecycle(proc.home, behind) == ["request.received", "request.queued", "request.requeued"]


def test_a_burst_of_signals_cannot_deadlock_the_main_loop(tmp_path: Path) -> None:
    # The handler set threading.Events.  It runs in the main thread between two bytecodes,
    # perhaps while that thread holds the Event's lock (in its wait, or in the handler itself
    # interrupted by the next signal): the daemon then waited on itself forever.  A drain
    # begun with SIGTERM twice (a supervisor, then its stop) hung the suite once.
    proc = DaemonProcess(tmp_path / "home", "--grace", "30").start()
    rid = proc.submit(script({"text": "started"}, {"sleep": 0.5}, {"text": "finished"}))
    proc.wait_for_line(f"request.started id={rid}")
    for _ in range(500):
        proc.signal(signal.SIGHUP)
    proc.signal(signal.SIGTERM)
    assert proc.stop() == 0  # (a second SIGTERM, at once)
    verdict = orjson.loads(proc.home.verdict(rid).read_bytes())
    if verdict["ok"]:
        assert verdict["result"]["text"] == "finished"
    else:  # the second SIGTERM ends the drain's grace when it lands before the run ends
        error = errors.from_wire(verdict["error"])
        assert type(error) is errors.RunCancelledError and error.details["daemon_stopped"] is True


def test_signals_while_it_exits_leave_its_exit_status_alone(tmp_path: Path) -> None:
    # The handlers went back to the defaults once the drain was done, and a SIGTERM landing
    # in the last moments (systemd's stop; a script signalling until the pid is gone) killed
    # the exiting daemon: -15 instead of the 0 it had decided, so Restart=on-failure and
    # scripts saw a failure.  A SIGHUP then did the same (-1), a SIGINT raised KeyboardInterrupt.
    proc = DaemonProcess(tmp_path / "home").start()
    assert proc.signal_until_gone(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) == 0
    assert "adaptord: daemon.stopped" in "\n".join(proc.lines)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
def test_a_verdict_the_disk_refuses_keeps_its_outcome_until_it_can_be_written(tmp_path: Path) -> None:
    # RLIMIT_FSIZE 0 makes every write into a regular file fail (EFBIG), as a full disk would,
    # without root; tests/torture/test_disk_full.py fills a real filesystem.
    proc = DaemonProcess(tmp_path / "home", "--grace", "30").start()
    assert proc.proc is not None
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # The limit must be set before the run ends: the sleep leaves room for the start's log
    # line to reach this process on a loaded machine (0.5 s was not always enough).
    rid = proc.submit(script({"text": "started"}, {"sleep": 3}, {"text": "finished"}))
    proc.wait_for_line(f"request.started id={rid}")
    resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (0, hard))
    try:
        assert os.strerror(errno.EFBIG) in proc.wait_for_line(f"verdict.deferred id={rid} ")
        assert not proc.home.verdict(rid).exists()
        assert (proc.home.claimed / f"{rid}.json").exists()
        assert [p.name for p in proc.home.verdicts.iterdir()] == []  # no temporary file either
    finally:
        resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
    verdict = proc.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "finished"
    proc.wait_for_line(f"verdict.undeferred id={rid}")
    assert proc.stop() == 0
    assert not (proc.home.claimed / f"{rid}.json").exists()
    assert sum(f"verdict.deferred id={rid} " in line for line in proc.lines) == 1
    for log in proc.home.events.glob("*.jsonl"):
        sr.verify(log)


@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="needs resource.prlimit (Linux)")
def test_a_verdict_larger_than_the_file_size_limit_is_written_without_its_files(tmp_path: Path) -> None:
    # A daemon under `ulimit -f` (50 kB here) whose agent printed more: its stdout file could
    # never be written, and the verdict was deferred for ever, tried again every scan
    # interval, while `adaptor wait` waited and `status` said finished.
    proc = DaemonProcess(tmp_path / "home").start()
    assert proc.proc is not None
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (50_000, hard))
    big = proc.submit({
        "driver": "command", "prompt": "p",
        "config": {"command": sys.executable, "extra_args": ["-c", "print('x' * 120_000)"]},
    })
    verdict = proc.verdict(big)
    error = errors.from_wire(verdict["error"])
    assert type(error) is errors.RunError and error.reason == "infrastructure_error"
    assert str(error) == (
        "the run ended ok, but its verdict's files are larger than this daemon may write "
        "(its file-size limit, ulimit -f, is 50000 bytes): File too large"
    )
    assert error.details == {"too_large": True, "run_ok": True}
    assert verdict["result"] is None and verdict["exit_code"] == 1
    proc.wait_for_line(f"verdict too large; written without its files id={big} ")
    assert not (proc.home.claimed / f"{big}.json").exists()
    # The next request, small enough, is answered as ever.
    assert proc.verdict(proc.submit(script({"text": "small"})))["result"]["text"] == "small"
    assert proc.stop() == 0
    assert not any(f"verdict.deferred id={big} " in line for line in proc.lines)


def test_a_schema_nested_within_the_limit_is_checked_under_a_small_stack_limit(tmp_path: Path) -> None:
    # `ulimit -s 128`: every thread got a 128 KiB stack, and checking an output schema nested
    # 60 levels (of the 64 allowed) overflowed the worker's: SIGSEGV, the daemon gone, and each
    # restart under the same limit claimed the request again and died again.
    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit")
    schema: dict[str, Any] = {}
    for _ in range(60):
        schema = {"type": "array", "items": schema}
    proc = DaemonProcess(tmp_path / "home", prefix=["prlimit", "--stack=131072", "--"]).start()
    verdict = proc.verdict(proc.submit({**script({"text": "[[]]"}), "schema": schema}))
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["structured"]["raw_json"] == "[[]]"
    assert verdict["result"]["structured"]["errors"] == []
    assert proc.stop() == 0


def test_an_approval_whose_shown_deadline_a_clock_step_passed_times_out_then(tmp_path: Path) -> None:
    # The wall clock stepped an hour forward while a run waited on an approval (600 s): the
    # pending file's deadline had passed, so `adaptor approvals` listed nothing and `approve`
    # said expired, yet the run waited out its own timer (the monotonic clock), its worker held
    # for ten minutes, and a response written by hand meanwhile still won.
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("needs libfaketime (apt: libfaketime)")
    step = tmp_path / "step"
    step.write_text("+0")
    faked = {"LD_PRELOAD": found[0], "FAKETIME_TIMESTAMP_FILE": str(step), "FAKETIME_NO_CACHE": "1",
             "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    daemon = DaemonProcess(tmp_path / "home", env=faked).start()
    rid = daemon.submit(script({"approval": {"kind": "permission", "title": "may I?"}}, {"text": "went on"},
                               policy={"approvals": {"timeout": 600}}))
    daemon.wait_for_line(f"approval.pending id={rid}")
    step.write_text("+3600")
    verdict = daemon.verdict(rid, timeout=60)
    assert verdict["error"]["code"] == "ErrApprovalTimeout", verdict
    assert 'why=deadline' in daemon.wait_for_line(f"approval.expired id={rid}")
    assert daemon.stop() == 0


def test_an_approval_the_daemon_cannot_write_fails_its_run_saying_so(tmp_path: Path) -> None:
    # A disk out of inodes (here: a pending folder that takes no new file): the run failed with
    # "approval handler raised OSError: [Errno 28] No space left on device:
    # '.../approvals/pending/<id>.json.tmp-...'", a file name deep in the home for a cause.
    daemon = DaemonProcess(tmp_path / "home").start()
    with unwritable(daemon.home.approvals_pending):
        rid = daemon.submit(script({"approval": {"kind": "permission", "title": "may I?"}}, {"text": "went on"},
                                   policy={"approvals": {"timeout": 600}}))
        error = daemon.verdict(rid)["error"]
    assert error["code"] == "RunError" and error["reason"] == "infrastructure_error"
    assert error["message"] == (
        "approval handler raised PermissionError: [Errno 1] adaptord could not write the approval request: "
        "Operation not permitted"
    ), error["message"]
    assert "approvals/pending" not in error["message"]
    assert daemon.stop() == 0


def _reloaded(tmp_path: Path, before: str, after: str) -> DaemonProcess:
    """A daemon started on a config file holding ``before``, then sent SIGHUP with ``after``
    in its place (the reload's outcome is the caller's to wait for)."""
    config = tmp_path / "config.toml"
    config.write_text(before)
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    config.write_text(after)
    proc.signal(signal.SIGHUP)
    return proc


def test_a_reload_that_shortens_scan_interval_applies_it_at_once(tmp_path: Path) -> None:
    # The checks made every scan_interval kept the time the old interval had set: with 300 s
    # before a reload to 0.1 s, a removed folder came back only up to 300 s later (docs:
    # scan_interval "takes effect at once").
    proc = _reloaded(tmp_path, "scan_interval = 300\n", "scan_interval = 0.1\n")
    proc.wait_for_line("config reloaded")
    shutil.rmtree(proc.home.quarantine)
    # Well within the old interval, however loaded the machine.
    proc.wait_for_line("a folder of the home was missing; created it again", timeout=100)
    assert proc.home.quarantine.is_dir()
    assert proc.stop() == 0


def test_folders_removed_from_under_the_daemon_are_created_again(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path / "home", "--grace", "30").start()
    home = proc.home
    shutil.rmtree(home.root / "spool")  # a cleanup script gone too far
    proc.wait_for_line("a folder of the home was missing; created it again")
    assert home.spool_new.is_dir() and home.spool_tmp.is_dir()
    rid = proc.submit(script({"text": "served"}))  # picked up by the new folder's watch
    assert proc.verdict(rid)["ok"]

    rid = proc.submit(script({"text": "started"}, {"sleep": 0.5}, {"text": "finished"}))
    proc.wait_for_line(f"request.started id={rid}")
    shutil.rmtree(home.verdicts)
    proc.wait_for_line(f"verdict.deferred id={rid} ")
    verdict = proc.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "finished"
    assert proc.stop() == 0
    assert not (home.claimed / f"{rid}.json").exists()


def test_under_journald_each_line_carries_its_priority(tmp_path: Path) -> None:
    # Every line went out at one priority: `journalctl -p warning` could not pick out a
    # deferred verdict or an interrupted run.  systemd names the journal's stream in
    # JOURNAL_STREAM; a "<N>" prefix then sets the line's priority.
    read_end, write_end = os.pipe()
    found = os.fstat(write_end)
    home = _home.Home.at(tmp_path / "home")
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(home.root), "--grace", "5"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_end,
        env={**os.environ, "JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}"},
    )
    os.close(write_end)
    try:
        with os.fdopen(read_end, "r", encoding="utf-8", errors="replace") as lines:
            deadline = time.monotonic() + 60
            while not _home.daemon_running(home) and time.monotonic() < deadline:
                time.sleep(0.05)
            Client(home.root).run(script({"text": "x"}), timeout=60)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            shown = lines.read().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert shown and all(re.match(r"<[46]>adaptord: ", line) for line in shown), shown
    assert any(line.startswith("<6>adaptord: ready ") for line in shown), shown
    assert any(line.startswith("<6>adaptord: verdict.written ") for line in shown), shown
    # A stop as systemd makes it is no problem: its "draining" line was a warning, so
    # `journalctl -p warning` showed one for every `systemctl stop`.
    assert not [line for line in shown if line.startswith("<4>")], shown
    # Why it would not start at all (the unit does not restart on 2) had no priority: info.
    config = tmp_path / "bad.toml"
    config.write_text("workerz = 2\n")
    with open(tmp_path / "journal", "w+b") as journal:
        found = os.fstat(journal.fileno())
        refused = subprocess.run(
            [sys.executable, "-m", "adaptord", "serve", "--home", str(home.root), "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=journal, timeout=60,
            env={**os.environ, "JOURNAL_STREAM": f"{found.st_dev}:{found.st_ino}"},
        )
        journal.seek(0)
        said = journal.read().decode().splitlines()
    assert refused.returncode == 2
    assert said and all(line.startswith("<4>adaptord: ") for line in said), said
    assert _fact_priority("adaptord: verdict.deferred id=x error=No space") == 4
    assert _fact_priority("adaptord: verdict.written id=x ok=True") == 6


def _fact_priority(line: str) -> int:
    from adaptord import _lifecycle

    return _lifecycle.fact_priority(line)


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A folder and a read-only bind mount of it (root only)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only mount needs root")
    source, view = tmp_path / "home", tmp_path / "view"
    source.mkdir(mode=0o700)
    view.mkdir()
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(view)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    try:
        yield source, view
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


def test_status_of_a_home_on_a_read_only_mount(read_only_view: tuple[Path, Path]) -> None:
    # `adaptord status` printed a traceback (EROFS opening adaptord.lock for writing) and
    # `adaptor status` exited 70; a read-only home is one no daemon serves, unless one started
    # before the remount, which the lock still shows.
    source, view = read_only_view
    daemon = DaemonProcess(source, "--grace", "5").start()
    try:
        for command in (["adaptord", "status", "--json"], ["adaptor", "status", "--json"]):
            shown = subprocess.run([*command, "--home", str(view)], capture_output=True, text=True)
            out = orjson.loads(shown.stdout)
            running = out["running"] if command[0] == "adaptord" else out["result"]["running"]
            assert (shown.returncode, running) == (0, True), shown.stderr
    finally:
        assert daemon.stop() == 0
    for command in (["adaptord", "status", "--json"], ["adaptor", "status", "--json"]):
        shown = subprocess.run([*command, "--home", str(view)], capture_output=True, text=True)
        assert shown.returncode == 69 and "Traceback" not in shown.stderr, shown.stderr


def test_a_daemon_started_with_stdout_and_stderr_closed_serves(tmp_path: Path) -> None:
    # `adaptord serve >&- 2>&-`: sys.stderr was None, the lifecycle writer died printing its
    # first line, and the daemon held its home's lock while claiming nothing; SIGTERM then
    # took ~25 s and exited 1.  Files opened later also took the numbers 1 and 2.
    home = _home.Home.at(tmp_path / "home")
    proc = subprocess.Popen(
        ["/bin/sh", "-c", 'exec "$@" >&- 2>&-', "sh", sys.executable, "-m", "adaptord", "serve",
         "--home", str(home.root), "--grace", "5"],
        stdin=subprocess.DEVNULL,
    )
    try:
        client = Client(home.root)
        deadline = time.monotonic() + 60
        while not _home.daemon_running(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.run(script({"text": "served"}), timeout=60).text == "served"
        for fd in (1, 2):
            assert os.readlink(f"/proc/{proc.pid}/fd/{fd}") == os.devnull
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("folder", ["spool/tmp", "quarantine", "approvals/responses"])
def test_folders_no_request_reads_are_created_again_too(tmp_path: Path, folder: str) -> None:
    # spool/tmp/ removed stayed missing (every submit failed: exit 70), and so did quarantine/
    # (a misnamed file then stayed in spool/new/ for ever), until a restart.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "30").start()
    shutil.rmtree(proc.home.root / folder)
    proc.wait_for_line("a folder of the home was missing; created it again")
    assert (proc.home.root / folder).is_dir()
    assert proc.verdict(proc.submit(script({"text": "served"})))["ok"]
    misnamed = proc.home.spool_new / "not a request id"
    misnamed.write_text("{}")
    deadline = time.monotonic() + 30
    while misnamed.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not misnamed.exists() and any(proc.home.quarantine.iterdir())
    assert proc.stop() == 0


@pytest.mark.parametrize("how", ["home removed", "home made again", "lock removed", "lock replaced"])
def test_a_daemon_whose_home_lock_is_gone_stops_with_70(tmp_path: Path, how: str) -> None:
    # It served on: `adaptor status` said no daemon, a second one could take a lock of its own
    # on the same home, and under systemd nothing restarted it (the home removed: it logged
    # "restart the daemon" and waited; made again by hand, it served it without any lock).
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5").start()
    home = proc.home
    rid = proc.submit(script({"text": "served"}))
    assert proc.verdict(rid)["ok"]
    if how.startswith("home"):
        # The daemon writes into the home (its log) and makes removed folders again meanwhile,
        # as it would under a user's `rm -rf`: removed until it stays removed.
        _remove_for_good(home.root)
        if how == "home made again":
            # (The daemon may have made it again itself in the meantime, before it noticed.)
            home.root.mkdir(mode=0o700, exist_ok=True)
    elif how == "lock removed":
        home.daemon_lock.unlink()
    else:
        home.daemon_lock.unlink()
        home.daemon_lock.touch(mode=0o600)
    assert proc.proc is not None and proc.proc.wait(timeout=60) == 70
    reasons = {
        # rmtree removes the files before their folder: a check in between finds the lock
        # file gone and the folder still there.
        "home removed": ("the home folder is gone, its lock file with it",
                         "the home's lock file adaptord.lock was removed"),
        "home made again": ("the home's lock file adaptord.lock was removed",),
        "lock removed": ("the home's lock file adaptord.lock was removed",),
        "lock replaced": ("the home's lock file adaptord.lock was replaced",),
    }[how]
    stopping = proc.wait_for_line("; stopping (a new start makes the home again)")
    assert any(f"adaptord: {reason}; stopping" in stopping for reason in reasons), stopping
    if how == "home made again":  # the stopping daemon made no layout in it: not its home
        assert not (home.root / "spool").exists() and not home.claimed.exists()
    restarted = DaemonProcess(home.root, "--config", str(config), "--grace", "5").start()
    assert restarted.verdict(restarted.submit(script({"text": "again"})))["ok"]
    assert restarted.stop() == 0


def _remove_for_good(root: Path) -> None:
    """Remove a served home as `rm -rf` would, again until it stays removed (its daemon may
    write into it meanwhile, as it would under a user's `rm -rf`)."""
    deadline = time.monotonic() + 30
    while root.exists() and time.monotonic() < deadline:
        shutil.rmtree(root, ignore_errors=True)
    assert not root.exists()


@pytest.mark.parametrize("stopped", ["its lock lost", "SIGTERM first"])
def test_a_daemon_whose_home_was_made_again_writes_nothing_into_the_new_one(
    tmp_path: Path, stopped: str
) -> None:
    # Its home removed while a run went on, and a second daemon serving a home made again at
    # that path: the first one's drain wrote its verdict over the second one's request of the
    # same id, removed that request's claimed copy (the second run then got no verdict at all)
    # and appended its own facts to the new home's lifecycle log.  So too when the first one
    # had been stopped with SIGTERM and was still draining when the home was replaced.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    first = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "30").start()
    home = first.home  # (its paths are the new home's too)
    first.drop("X.json", orjson.dumps({**script({"sleep": 4}, {"text": "from the first"}), "id": "X"}))
    first.wait_for_line("request.started id=X")
    if stopped == "SIGTERM first":
        first.signal(signal.SIGTERM)
        first.wait_for_line("draining")
    _remove_for_good(home.root)
    second = DaemonProcess(home.root, "--config", str(config), "--grace", "30").start()
    try:
        second.drop("X.json", orjson.dumps({**script({"sleep": 6}, {"text": "from the second"}), "id": "X"}))
        second.wait_for_line("request.started id=X")
        assert first.proc is not None
        first.proc.wait(timeout=60)
        first.wait_for_line("verdict not written id=X")
        verdict = second.verdict("X")
        assert verdict["ok"] and verdict["result"]["text"] == "from the second", verdict
        facts = [orjson.loads(line) for line in (home.events / "adaptord.jsonl").read_bytes().splitlines()]
        phases = [f["event"]["data"]["phase"] for f in facts]
        assert "daemon.stopped" not in phases and "lifecycle_log.reopened" not in phases, phases
    finally:
        assert second.stop() == 0


def test_a_daemon_whose_home_was_made_again_leaves_its_approvals_threads_and_queue_alone(
    tmp_path: Path,
) -> None:
    # Knowing its home lost, it still expired a waiting approval into the new home's
    # approvals/resolved, made the new home's threads/store.lock releasing a thread run's
    # lease, and dropped its queued requests without a word.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    first = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "30", "--workers", "2").start()
    home = first.home
    asking = script({"approval": {"kind": "permission", "title": "x"}}, policy={"approvals": {"timeout": 600}})
    first.drop("P.json", orjson.dumps({**asking, "id": "P", "thread": {"key": "lost-home"}}))
    first.drop("L.json", orjson.dumps({**script({"sleep": 30}), "id": "L"}))
    first.wait_for_line("approval.pending id=P")
    first.wait_for_line("request.started id=L")
    first.drop("Q.json", orjson.dumps({**script({"text": "queued"}), "id": "Q"}))
    first.wait_for_line("request.queued id=Q")
    _remove_for_good(home.root)
    second = DaemonProcess(home.root, "--config", str(config), "--grace", "30").start()
    try:
        assert first.proc is not None and first.proc.wait(timeout=60) == 70
        for request_id in ("P", "L"):
            first.wait_for_line(f"verdict not written id={request_id}")
        first.wait_for_line("request not requeued id=Q")
        assert list(home.approvals_resolved.iterdir()) == []
        assert not (home.threads / "store.lock").exists()
        assert not list(home.events.glob("[PLQ].jsonl*"))
    finally:
        assert second.stop() == 0


def test_a_daemon_whose_home_is_gone_starts_nothing_more_there(tmp_path: Path) -> None:
    # Before its main loop noticed (every scan_interval), a worker starting the next queued
    # request made the removed home again: its workspace, then the run's folder and copy.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 60\n")
    first = DaemonProcess(tmp_path / "home", "--config", str(config), "--workers", "1").start()
    home = first.home
    first.drop("L.json", orjson.dumps({**script({"sleep": 2}, {"text": "done"}), "id": "L"}))
    first.wait_for_line("request.started id=L")
    first.drop("Q.json", orjson.dumps({**script({"text": "queued"}), "id": "Q"}))
    first.wait_for_line("request.queued id=Q")
    _remove_for_good(home.root)
    try:
        first.wait_for_line("verdict not written id=L")
        first.wait_for_line("request not started id=Q")
        assert not home.root.exists()
    finally:
        assert first.stop() in (0, 70)


@pytest.mark.alone  # holds every inotify instance of this user
def test_daemon_and_client_serve_without_a_file_watcher_until_one_can_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    with InotifyHog() as hog:
        proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
        proc.wait_for_line('file watcher unavailable; scanning instead error="inotify instance limit reached"')
        client = Client(proc.home.root)
        rid = client.submit(script({"text": "found by a scan"}))
        assert client.wait(rid, timeout=60).text == "found by a scan"  # the client polls too
        hog.release()
        proc.wait_for_line("file watcher running again")
    rid = client.submit(script({"text": "watched"}))
    assert client.wait(rid, timeout=60).text == "watched"
    assert proc.stop() == 0
    assert sum("file watcher unavailable" in line for line in proc.lines) == 1


def _serving_with_descriptors(tmp_path: Path, limit: int) -> DaemonProcess:
    """A daemon with 4 workers whose descriptor limit is ``limit`` from its first moment."""
    proc = DaemonProcess(tmp_path / "home", "--workers", "4").start(held=True)
    assert proc.proc is not None
    resource.prlimit(proc.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
    proc.let_go()
    proc.wait_for_line("adaptord: ready")
    return proc


def test_a_low_descriptor_limit_slows_nothing_down_for_good(tmp_path: Path) -> None:
    # Under `ulimit -n 40` the daemon used every descriptor on idle audit logs (two each, kept
    # for 64 logs) and then could write no verdict, ever: they stayed deferred.
    proc = _serving_with_descriptors(tmp_path, 40)
    ids = [proc.submit(script({"text": f"plain {i}"})) for i in range(40)]
    ids += [
        proc.submit(
            {"driver": "script", "prompt": "x", "thread": {"key": f"fds/{i % 5}"},
             "config": {"steps": [{"text": f"turn {i}"}], "session": "auto"}}
        )
        for i in range(10)
    ]
    verdicts = [proc.verdict(rid) for rid in ids]
    assert [v["ok"] for v in verdicts] == [True] * len(ids), [v["error"] for v in verdicts if not v["ok"]]
    for verdict in verdicts:  # and every run's events are all there
        assert sr.verify(proc.home.root / verdict["events"]) > 0
    assert proc.proc is not None and len(os.listdir(f"/proc/{proc.proc.pid}/fd")) < 40
    assert proc.stop() == 0


def test_a_burst_under_a_very_low_descriptor_limit_gets_every_verdict(tmp_path: Path) -> None:
    # Under `ulimit -n 20` a burst jammed the daemon for good: the shortage poisoned audit
    # logs, which were then never closed (a poisoned key kept its descriptors), so every
    # deferred verdict failed again (EMFILE) every 2 s; 48 of 50 runs stayed claimed, and only
    # a restart, failing them all as interrupted, ended it.  Events may go unrecorded at such a
    # limit (said on stderr); verdicts may not.
    proc = _serving_with_descriptors(tmp_path, 20)
    ids = [f"burst-{i}" for i in range(100)]
    for rid in ids:
        request = script({"text": rid}, {"thinking": "more events"}, {"text": "done"})
        proc.drop(f"{rid}.json", orjson.dumps({**request, "id": rid}))
    verdicts = [proc.verdict(rid, timeout=120) for rid in ids]
    assert [v["ok"] for v in verdicts] == [True] * len(ids), [v["error"] for v in verdicts if not v["ok"]]
    assert proc.stop() == 0
    assert list(proc.home.claimed.iterdir()) == []
    for log in proc.home.events.glob("*.jsonl"):
        sr.verify(log)


_DESCRIPTORS_RUN_OUT = """
import errno
import os

_plan = os.environ.get("ADAPTOR_TEST_OUT_OF_DESCRIPTORS")
if _plan:
    from adaptor import _durable, _request

    # name=N: the next N calls fail; name=K+N: K calls succeed first.
    _left = {}
    for _name, _count in (part.split("=") for part in _plan.split(",")):
        _skip, _, _fail = _count.rpartition("+")
        _left[_name] = [int(_skip or 0), int(_fail)]

    def _short(what, path):
        left = _left.get(what)
        if left is None:
            return
        if left[0] > 0:
            left[0] -= 1
        elif left[1] > 0:
            left[1] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))

    _read, _write = _request.read_limited, _durable.atomic_write

    def read_limited(path, limit):
        if path.parent.name == "claimed":
            _short("read", path)
        return _read(path, limit)

    def atomic_write(path, data, **options):
        _short(os.path.basename(path), path)
        return _write(path, data, **options)

    _request.read_limited, _durable.atomic_write = read_limited, atomic_write
"""


def test_descriptors_running_out_for_a_moment_fail_no_run_and_refuse_no_request(tmp_path: Path) -> None:
    # Under a low `ulimit -n`, workers writing their runs' files at once can take every
    # descriptor for a moment (seen with `ulimit -n 40` and four workers): a run whose
    # state.json could not be written then failed ("Too many open files"), and a request read
    # then was refused as an unreadable file (exit 2).  Both are tried again now.  The shortage
    # is injected (EMFILE from the daemon's own reads and writes), as the moment cannot be
    # made to come on cue: lowering the daemon's limit to its lowest free descriptor for those
    # calls was tried, and another thread closing one meanwhile let a call through.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_DESCRIPTORS_RUN_OUT)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    # The read outlasts the tries in a row (the request waits, read again shortly); the
    # request copy and the state are written at a later try.
    plan = "read=6,request.json=2,state.json=3"
    proc = DaemonProcess(
        tmp_path / "home", env={"PYTHONPATH": path, "ADAPTOR_TEST_OUT_OF_DESCRIPTORS": plan}
    ).start()
    rid = proc.submit(script({"text": "ran anyway"}))
    verdict = proc.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "ran anyway", verdict
    assert f"out of file descriptors; the request is read again shortly id={rid}" in "\n".join(proc.lines)
    assert proc.stop() == 0  # (the state says done once the verdict is written: after it)
    assert orjson.loads((proc.home.run_dir(rid) / "state.json").read_bytes())["status"] == "done"
    assert orjson.loads((proc.home.run_dir(rid) / "request.json").read_bytes())["prompt"] == "go"


def test_a_run_state_the_disk_refuses_fails_no_run(tmp_path: Path) -> None:
    # The state written once the driver started (entered: the agent may have the prompt) was
    # not guarded: refused (a full disk, here every state.json write after the start's out of
    # descriptors for good), it failed the run itself, whose verdict then said OSError.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_DESCRIPTORS_RUN_OUT)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    proc = DaemonProcess(
        tmp_path / "home", env={"PYTHONPATH": path, "ADAPTOR_TEST_OUT_OF_DESCRIPTORS": "state.json=1+1000"}
    ).start()
    rid = proc.submit(script({"text": "ran anyway"}))
    verdict = proc.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "ran anyway", verdict
    proc.wait_for_line(f"cannot write the run state id={rid}")
    assert proc.stop() == 0


def test_a_task_limit_fails_only_the_runs_it_stops_and_leaves_no_agent_behind(tmp_path: Path) -> None:
    # systemd's TasksMax counts the agents' processes with the daemon's threads; a busy agent
    # can use it up.  Workers are started at start, so only runs can meet the limit.
    proc = DaemonProcess(tmp_path / "home", "--grace", "5").start()
    marker = f"task-limit-{os.getpid()}"
    sleeper = {
        "driver": "command", "prompt": "x",
        "config": {"command": "/bin/sleep", "extra_args": ["300"], "env": {"MARK": marker}},
    }
    assert proc.proc is not None
    with TaskLimit(proc.proc.pid) as limit:
        limit.cap()  # no thread at all for the run
        verdict = proc.verdict(proc.submit(script({"text": "never"})))
        assert (verdict["ok"], verdict["exit_code"], verdict["error"]["type"]) == (False, 70, "RuntimeError")
        assert "cannot start a thread for the run" in verdict["error"]["message"]
        limit.lift()
        assert proc.verdict(proc.submit(script({"text": "served again"})))["result"]["text"] == "served again"

        causes = []
        for _ in range(5):
            # One task to spare: the agent's process starts (on the run thread kept from the last
            # run), the thread to read its output cannot.  Should the last run's thread not be
            # idle yet, a new one takes the spare and the fork is refused instead: again.
            limit.cap(spare=1)
            verdict = proc.verdict(proc.submit(sleeper))
            assert verdict["ok"] is False and processes_with_env("MARK", marker) == []
            causes.append(verdict["error"]["cause"]["type"])
            limit.lift()
            assert proc.verdict(proc.submit(script({"text": "and again"})))["result"]["text"] == "and again"
            if causes[-1] == "RuntimeError":
                break
        assert causes[-1] == "RuntimeError", causes  # "can't start new thread"

        # A cancel needs a thread to stop the agent: none left.  The cap waits for the agent's
        # first line in the audit log, which the run reads only once every thread of the run
        # (output pump, deadline watch) is going; capping at "request.started" could come first.
        announcing = {
            "driver": "command", "prompt": "x",
            "config": {"command": "/bin/sh", "extra_args": ["-c", "echo ready; exec /bin/sleep 300"],
                       "env": {"MARK": marker}},
        }
        running = proc.submit(announcing)
        audit_log = proc.home.events / f"{running}.jsonl"
        deadline = time.monotonic() + 60
        while not (audit_log.exists() and b"ready" in audit_log.read_bytes()):
            assert time.monotonic() < deadline, "\n".join(proc.lines)
            time.sleep(0.02)
        limit.cap()
        _home.request_cancel(proc.home, running)
        assert errors.from_wire(proc.verdict(running)["error"]).__class__ is errors.RunCancelledError
        assert processes_with_env("MARK", marker) == []
    assert proc.stop() == 0
    assert not any("Traceback" in line for line in proc.lines)


def test_a_daemon_started_at_its_task_limit_serves_and_starts_the_rest_later(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5").start(held=True)
    assert proc.proc is not None
    with TaskLimit(proc.proc.pid) as limit:
        limit.cap(spare=2)  # the main thread and two more: not the four workers and the watcher
        proc.let_go()
        proc.wait_for_line('cannot start a worker thread; serving with fewer error="can\'t start new thread"')
        proc.wait_for_line('file watcher unavailable; scanning instead error="can\'t start new thread"')
        proc.wait_for_line("adaptord: ready")
        limit.lift()
        proc.wait_for_line("all workers started workers=4")
        proc.wait_for_line("file watcher running again")
    rids = [proc.submit(script({"text": f"hi {i}"}, {"sleep": 0.2})) for i in range(8)]
    assert [proc.verdict(rid)["result"]["text"] for rid in rids] == [f"hi {i}" for i in range(8)]
    assert proc.stop() == 0


def test_sigterm_after_grace_cancels(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path / "home", "--grace", "0.2").start()
    rid = proc.submit(script({"text": "started"}, {"sleep": 60}))
    proc.wait_for_line(f"request.started id={rid}")
    assert proc.stop() == 0
    verdict = orjson.loads(proc.home.verdict(rid).read_bytes())
    assert verdict["error"]["code"] == "ErrRunCancelled" and verdict["exit_code"] == 1


def _daemon_importing_a_gated_tool(tmp_path: Path) -> tuple[DaemonProcess, Path]:
    """A daemon held in its start-up (importing a host tool) until the returned gate is removed."""
    gate, importing = tmp_path / "gate", tmp_path / "importing"
    gate.touch()
    (tmp_path / "gated_start_module.py").write_text(
        "import os, time\n"
        f"open({str(importing)!r}, 'w').close()\n"
        f"while os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
        "tool = None\n"
    )
    config = tmp_path / "config.toml"
    config.write_text('[tools]\ngated = "gated_start_module:tool"\n')
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), cwd=tmp_path).start(wait_ready=False)
    deadline = time.monotonic() + 60
    while not importing.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert importing.exists()
    return proc, gate


def test_status_never_shows_the_previous_daemons_pid_while_a_new_one_starts(tmp_path: Path) -> None:
    # Until the new daemon wrote its state (after stopping leftovers and importing its host
    # tools, which may take a while), `adaptord status` said "running (pid N)" with the pid
    # of the daemon before it, long gone: one to kill by mistake once reused.
    home = tmp_path / "home"
    first = DaemonProcess(home).start()
    old_pid = _home.daemon_state(first.home)["pid"]
    assert first.stop() == 0
    second, gate = _daemon_importing_a_gated_tool(tmp_path)
    status = subprocess.run(
        [sys.executable, "-m", "adaptord", "status", "--home", str(home), "--json"],
        capture_output=True, timeout=60,
    )
    assert status.returncode == 0
    assert orjson.loads(status.stdout).get("pid") != old_pid
    gate.unlink()
    second.wait_for_line("adaptord: ready")
    assert second.proc is not None
    assert _home.daemon_state(second.home)["pid"] == second.proc.pid
    assert second.stop() == 0


def test_status_never_shows_the_previous_daemons_pid_in_a_home_that_cannot_be_written(tmp_path: Path) -> None:
    # A home whose folder may not be written (mode 0500, a read-only bind of its top): the
    # new daemon could neither remove its predecessor's adaptord.json nor write its own, and
    # serves anyway, so `status` went on showing the old pid, workers and start time.
    home = tmp_path / "home"
    first = DaemonProcess(home).start()
    old_pid = _home.daemon_state(first.home)["pid"]
    assert first.stop() == 0
    with unwritable(home):
        second = DaemonProcess(home).start()
        try:
            status = subprocess.run(
                [sys.executable, "-m", "adaptord", "status", "--home", str(home), "--json"],
                capture_output=True, text=True, timeout=60,
            )
            assert second.verdict(second.submit(script({"text": "served"})))["ok"]
        finally:
            assert second.stop() == 0
    assert status.returncode == 0 and status.stderr == "", status
    shown = orjson.loads(status.stdout)
    assert shown["running"] is True and shown["pid"] is None and shown["workers"] is None, shown
    assert old_pid is not None


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_during_the_start_up_is_acted_on_once_serving(tmp_path: Path, sig: int) -> None:
    # The handlers were set only after the start-up: a SIGHUP (a reload) while host tools
    # were imported killed the daemon silently (exit 129), a SIGTERM with no drain (-15).
    proc, gate = _daemon_importing_a_gated_tool(tmp_path)
    assert proc.proc is not None
    proc.proc.send_signal(sig)
    gate.unlink()
    if sig == signal.SIGHUP:
        proc.wait_for_line("adaptord: ready")
        assert proc.verdict(proc.submit(script({"text": "still serving"})))["ok"]
        assert proc.stop() == 0
    else:
        assert proc.proc.wait(timeout=60) == 0


def test_a_run_the_drain_cancels_says_the_daemon_stopped(tmp_path: Path) -> None:
    # Its verdict read "run cancelled", as after `adaptor cancel`: nothing said the daemon's
    # stop did it, so the request looked withdrawn rather than worth submitting again.
    proc = DaemonProcess(tmp_path / "home", "--grace", "0.2").start()
    rid = proc.submit(script({"text": "started"}, {"sleep": 60}))
    proc.wait_for_line(f"request.started id={rid}")
    assert proc.stop() == 0
    error = errors.from_wire(orjson.loads(proc.home.verdict(rid).read_bytes())["error"])
    assert type(error) is errors.RunCancelledError and error.details["daemon_stopped"] is True
    assert error.message == "run cancelled: adaptord stopped (the run outlasted the stop's grace of 0.2 s)"
    # Its audit log's run.finished mirrors the verdict (it said "run cancelled", as after
    # `adaptor cancel`).
    ended = list(Client(proc.home.root).events(rid))[-1]
    assert isinstance(ended, events.RunFinished) and (ended.reason, ended.message) == ("cancelled", error.message)


def test_a_second_stop_signal_ends_the_drain_grace(tmp_path: Path) -> None:
    # An operator's second Ctrl-C (or SIGTERM) during a long grace was ignored: the daemon sat
    # silent until the grace ran out.  Now it cancels running work at once.
    proc = DaemonProcess(tmp_path / "home", "--grace", "3600").start()
    rid = proc.submit(script({"text": "started"}, {"sleep": 3600}))
    proc.wait_for_line(f"request.started id={rid}")
    proc.signal(signal.SIGINT)
    proc.wait_for_line("draining running=1")
    proc.signal(signal.SIGINT)
    proc.wait_for_line("signalled again; cancelling running work now running=1")
    verdict = proc.verdict(rid)
    assert verdict["error"]["code"] == "ErrRunCancelled"
    assert verdict["error"]["message"] == "run cancelled: adaptord stopped (signalled again)"
    ended = list(Client(proc.home.root).events(rid))[-1]
    assert isinstance(ended, events.RunFinished) and ended.message == verdict["error"]["message"]
    assert proc.proc is not None and proc.proc.wait(timeout=60) == 0


def test_a_run_that_outlasts_its_cancel_is_killed_within_the_drain(tmp_path: Path) -> None:
    # An agent ignoring SIGTERM, with a grace_period longer than any stop timeout: the drain
    # waited 30 s for it, then exited without its verdict and left it running in the workspace.
    marker = tmp_path / "started"
    proc = DaemonProcess(tmp_path / "home", "--grace", "0").start()
    rid = proc.submit({
        "driver": "command", "prompt": "x",
        "config": {"command": "/bin/sh", "grace_period": 300,
                   "extra_args": ["-c", f"trap '' TERM; : > {marker}; sleep 1000"]},
    })
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists()
    assert proc.stop() == 0
    assert any("drain: runs did not stop when cancelled; killing their processes" in line for line in proc.lines)
    verdict = orjson.loads(proc.home.verdict(rid).read_bytes())
    assert verdict["error"]["code"] == "ErrRunCancelled"
    assert marked_processes(proc.home.root) == []


def test_a_requeued_request_cancelled_while_the_daemon_was_down_says_which_attempt_never_started(tmp_path: Path) -> None:
    # Its verdict said "cancelled before it started" of a request whose first attempt ran.
    proc = DaemonProcess(tmp_path / "home").start()
    rid = proc.submit(script({"text": "working"}, {"sleep": 60}, on_interrupt="requeue"))
    proc.wait_for_line(f"request.started id={rid}")
    proc.kill9()
    _home.request_cancel(proc.home, rid)
    again = DaemonProcess(tmp_path / "home").start()
    try:
        error = errors.from_wire(again.verdict(rid)["error"])
        assert type(error) is errors.CancelledError and str(error) == "cancelled before its attempt 2 started"
    finally:
        assert again.stop() == 0


def _children(pid: int) -> list[str]:
    found: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += (task / "children").read_text().split()
    return found


def test_a_request_whose_copy_cannot_be_written_never_starts_its_agent(tmp_path: Path) -> None:
    # Its copy written after the agent's start, a copy the disk refused (here a folder in its
    # way) failed the request with its agent already started: it ran while its verdict and its
    # log said it never had.
    marker = tmp_path / "ran.log"
    agent = tmp_path / "agent.sh"
    agent.write_text(f'#!/bin/sh\necho ran >> {marker}\n')
    agent.chmod(0o755)
    proc = DaemonProcess(tmp_path / "home", "--workers", "1").start()
    try:
        blocker = proc.submit(script({"sleep": 60}))
        proc.wait_for_line(f"request.started id={blocker}")
        (proc.home.runs / "blocked" / "request.json").mkdir(parents=True)
        proc.submit({"id": "blocked", "driver": "command", "prompt": "x", "config": {"command": str(agent)}})
        proc.wait_for_line("request.queued id=blocked")
        _home.request_cancel(proc.home, blocker)
        verdict = proc.verdict("blocked")
        assert verdict["exit_code"] == 70 and "IsADirectoryError" in str(verdict["error"]), verdict
    finally:
        assert proc.stop() == 0
    assert not marker.exists()


def test_a_kill9_as_the_agent_starts_never_runs_it_a_second_time(tmp_path: Path) -> None:
    # The run state was written only after the driver had been started: a kill -9 between the
    # agent's start and that write left the request with no attempt on record, so the restart
    # ran its agent again (and its verdict was the second run's success).
    marker = tmp_path / "runs.log"
    agent = tmp_path / "agent.sh"
    agent.write_text(f'#!/bin/sh\necho "ran $$" >> {marker}\nexec sleep 60\n')
    agent.chmod(0o755)
    for attempt in range(3):
        home = tmp_path / f"home{attempt}"
        marker.unlink(missing_ok=True)
        proc = DaemonProcess(home, "--workers", "1").start()
        assert proc.proc is not None
        # A large prompt: its redacted copy, written before the state, took long enough for
        # the agent to start first every time.
        rid = proc.submit({"driver": "command", "prompt": "x" * 500_000, "config": {"command": str(agent)}})
        while not _children(proc.proc.pid):  # the agent's process exists from here on
            assert proc.proc.poll() is None
        proc.proc.send_signal(signal.SIGSTOP)  # the moment itself, as a kill -9 would leave it
        recorded = proc.home.run_state(rid).exists() and orjson.loads(proc.home.run_state(rid).read_bytes())
        proc.kill9()
        assert recorded and recorded["run_id"], recorded
        restarted = DaemonProcess(home, "--workers", "1").start()
        try:
            error = errors.from_wire(restarted.verdict(rid)["error"])
            assert type(error) is errors.RunError and error.details["interrupted"] is True, error
        finally:
            assert restarted.stop() == 0
        ran = marker.read_text().splitlines() if marker.exists() else []
        assert len(ran) <= 1, ran  # (none: killed before its shell got that far)


def test_kill9_mid_run_gives_exactly_one_verdict(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = DaemonProcess(home).start()
    failing = proc.submit(script({"stdout": "printed"}, {"text": "working"}, {"sleep": 60}))
    requeued = proc.submit(script({"text": "working"}, {"sleep": 60}, on_interrupt="requeue"))
    proc.wait_for_line(f"request.started id={failing}")
    proc.wait_for_line(f"request.started id={requeued}")
    # wait until the driver is entered for both (the audit log says so)
    for rid in (failing, requeued):
        path = proc.home.run_state(rid)
        proc_state = {}
        for _ in range(500):
            proc_state = orjson.loads(path.read_bytes())
            if proc_state.get("entered"):
                break
            __import__("time").sleep(0.02)
        assert proc_state.get("entered"), proc_state
    first_run = proc_state["run_id"]

    def said_working() -> bool:
        return any(isinstance(e, events.TextDelta) and e.text == "working" for e in Client(home).events(failing))

    for _ in range(500):
        if said_working():
            break
        __import__("time").sleep(0.02)
    proc.kill9()
    assert not proc.home.verdict(failing).exists()
    # What a kill -9 (a power cut) mid-append leaves: a torn last line, which the next append
    # cuts, recording that it did (it went without a trace).
    for log in (proc.home.events / f"{failing}.jsonl", proc.home.events / "adaptord.jsonl"):
        with log.open("ab") as torn:
            torn.write(b'{"crc":12,"event":{"kind":"te')

    restarted = DaemonProcess(home).start()
    restarted.wait_for_line("adaptord: lifecycle_log.repaired offset=")
    restarted.wait_for_line(f"adaptord: audit_log.repaired log={failing}.jsonl offset=")
    # The requeued one is counted with the requests recovery queued again (it was not).
    restarted.wait_for_line("adaptord: recovered queued requests count=1")
    verdict = restarted.verdict(failing)
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunError and err.reason == "infrastructure_error"
    assert err.details["interrupted"] is True
    # The answer as far as it got (its result had no text at all), and what it printed (its
    # runs/<id>/stdout was empty while the audit log held it).
    assert verdict["result"]["text"] == "working"
    assert (home / verdict["result"]["raw"]["stdout"]).read_text() == "printed\n"
    # ... and its transcript as far as it got (runs/<id>/transcript.json was empty).
    with pytest.raises(errors.RunError) as waited:
        Client(home).wait(failing, timeout=10)
    transcript = waited.value.result.transcript()
    assert [item.text for item in transcript if item.kind == "assistant"] == ["working"], transcript
    assert verdict["events"] == f"events/{failing}.jsonl"
    # Its audit log ends as every run's does, with run.finished (it had no end at all).
    ended = list(Client(home).events(failing))[-1]
    assert isinstance(ended, events.RunFinished) and ended.failed
    assert (ended.reason, ended.meta.run_id) == ("infrastructure_error", verdict["run_id"])
    # the requeued one runs again (second attempt) and is interrupted again below
    restarted.wait_for_line(f"request.started id={requeued} attempt=2")
    restarted.kill9()
    third = DaemonProcess(home).start()
    third.wait_for_line(f"request.started id={requeued} attempt=3")
    third.kill9()
    last = DaemonProcess(home).start()
    verdict = last.verdict(requeued)
    assert verdict["error"]["details"]["attempts"] == 3
    state = orjson.loads(last.home.run_state(requeued).read_bytes())
    assert state["run_ids"][0] == first_run  # earlier attempts' events stay findable
    assert last.stop() == 0

    assert sorted(p.name for p in last.home.verdicts.iterdir()) == sorted([f"{failing}.json", f"{requeued}.json"])
    assert list(last.home.claimed.iterdir()) == []
    # As docs/daemon.md says: request.received counts the attempts made, request.started the
    # one starting.
    reader = sr.EventRecorder(sr.JSONLEventBackend(last.home.events), key_validator=lambda k: None)
    facts = [_fact(r) for r in reader.since("adaptord") if _fact(r).get("request_id") == requeued]
    counted = [(f["phase"], f["attempt"]) for f in facts if f["phase"] in ("request.received", "request.started")]
    assert counted == [("request.received", 0), ("request.started", 1), ("request.received", 1),
                       ("request.started", 2), ("request.received", 2), ("request.started", 3)], counted


def test_interrupted_verdict_rewrites_a_lost_request_copy(tmp_path: Path) -> None:
    # The start syncs only the run state; the request copy is synced with the verdict.  A
    # power loss mid-run may lose the copy: the interrupted verdict's folder still has it.
    home = tmp_path / "home"
    proc = DaemonProcess(home).start()
    secret = "s3cret-value-123"
    request = script({"text": "working"}, {"sleep": 60})
    request["config"]["env"] = {"TOKEN": secret}
    rid = proc.submit(request)
    proc.wait_for_line(f"request.started id={rid}")
    proc.kill9()
    copy = proc.home.run_dir(rid) / "request.json"
    copy.unlink()  # what a power loss may leave of an unsynced copy
    restarted = DaemonProcess(home).start()
    verdict = restarted.verdict(rid)
    assert verdict["error"]["details"]["interrupted"] is True
    kept = orjson.loads(copy.read_bytes())
    assert kept["id"] == rid and kept["config"]["env"] == {"TOKEN": "<redacted>"}
    assert secret not in copy.read_text()
    assert restarted.stop() == 0


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_queued_requests_with_long_prompts_leave_them_on_disk_until_they_start(tmp_path: Path) -> None:
    # A script queueing requests that each paste a file: the daemon must not hold them all.
    proc = DaemonProcess(tmp_path / "home", "--workers", "1", "--grace", "5").start()
    assert proc.proc is not None
    blocker = proc.submit(script({"sleep": 60}))
    proc.wait_for_line(f"request.started id={blocker}")
    before = _rss_bytes(proc.proc.pid)
    prompts = [f"{i:03d}" + "long prompt " * 75_000 for i in range(40)]  # 900 kB each
    echoed = proc.submit({"driver": "command", "prompt": prompts[0], "config": {"command": "/bin/cat"}})
    cancelled = proc.submit(script({"text": "never"}, prompt=prompts[1]))
    rest = [proc.submit(script({"text": "done"}, prompt=p)) for p in prompts[2:]]
    proc.wait_for_line(f"request.queued id={rest[-1]}")
    grown = _rss_bytes(proc.proc.pid) - before
    shared = proc.home.spool_tmp / "shared.json"  # the shell recipe: the writer's umask, 0644
    shared.write_bytes(orjson.dumps(script({"text": "done"}, config={"env": {"TOKEN": "sk-0123456789"}})))
    shared.chmod(0o644)
    os.link(shared, proc.home.spool_new / "shared.json")
    proc.wait_for_line("request.queued id=shared")
    assert stat.S_IMODE((proc.home.claimed / "shared.json").stat().st_mode) == 0o600
    assert grown < sum(map(len, prompts)) / 4, grown  # 36 MB of prompts: at least 27 MB stay out

    _home.request_cancel(proc.home, cancelled)
    assert errors.from_wire(proc.verdict(cancelled)["error"]).__class__ is errors.CancelledError
    copy = orjson.loads((proc.home.run_dir(cancelled) / "request.json").read_bytes())
    assert copy["prompt"] == prompts[1]
    _home.request_cancel(proc.home, blocker)
    assert proc.verdict(echoed)["result"]["text"] == prompts[0]
    assert all(proc.verdict(rid)["ok"] for rid in rest)
    copy = orjson.loads((proc.home.run_dir(rest[-1]) / "request.json").read_bytes())
    assert copy["prompt"] == prompts[-1]
    assert proc.stop() == 0


def test_a_request_written_straight_into_the_spool_is_read_once_its_writer_is_done(
    daemon: DaemonProcess,
) -> None:
    # The documented way links a whole file in; a shell script's `cat > spool/new/x.json` does
    # not, and the daemon may claim the file between two of its writes.
    with open(daemon.home.spool_new / "direct.json", "w") as writer:
        writer.write('{"driver": "script", "prompt": "x", ')
        writer.flush()
        daemon.wait_for_line("request.received id=direct ")  # claimed, half written
        writer.write('"config": {"steps": [{"text": "whole"}]}}')
    assert daemon.verdict("direct")["result"]["text"] == "whole"
    with open(daemon.home.spool_new / "direct2.json", "w") as writer:
        writer.write('{"driver": "script", "prompt": "x", ')
        writer.flush()
        daemon.wait_for_line("request.received id=direct2 ")
        _home.request_cancel(daemon.home, "direct2")  # cancelled before it could be read
        time.sleep(0.3)  # the daemon's turn to see the marker first (no harm if it does not)
        writer.write('"config": {"steps": [{"text": "whole"}]}}')
    assert errors.from_wire(daemon.verdict("direct2")["error"]).__class__ is errors.CancelledError
    daemon.drop("cut.json", b'{"driver": ')  # and one that stays cut short
    verdict = daemon.verdict("cut")
    assert verdict["exit_code"] == 2 and "invalid JSON: unexpected end of data" in verdict["error"]["message"]


def _started_order(proc: DaemonProcess, rids: list[str]) -> list[str]:
    return sorted(rids, key=lambda rid: proc.verdict(rid)["started_at"])


def test_a_threads_requests_run_in_arrival_order_not_name_order(tmp_path: Path) -> None:
    def request(rid: str, *steps: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": rid, "driver": "script", "prompt": "go", "thread": {"key": "ordered"},
            "config": {"steps": [*steps, {"text": rid}], "session": "auto"},
        }

    home = tmp_path / "home"
    # Arrived while no daemon ran: the start's one scan sees them all at once.
    proc = DaemonProcess(home, "--grace", "10").start()
    assert proc.stop() == 0
    arrived = ["zz-first", "mm-second", "aa-third", "qq-fourth"]
    for rid in arrived:
        proc.submit(request(rid))
        time.sleep(0.02)  # a clock tick apart
    proc = DaemonProcess(home, "--grace", "10").start()
    assert _started_order(proc, arrived) == arrived

    def queue_behind(blocker: str, seconds: float, waiting: list[str]) -> None:
        proc.wait_for_line(f"request.started id={proc.submit(request(blocker, {'sleep': seconds}))}")
        for rid in waiting:
            proc.submit(request(rid))
            proc.wait_for_line(f"request.queued id={rid}")

    # Put back in the spool by a SIGTERM, and claimed again by the next start.
    queue_behind("k-blocker", 1.5, waiting := ["zz-5", "mm-6", "aa-7"])
    proc.signal(signal.SIGTERM)
    assert proc.proc is not None and proc.proc.wait(60) == 0
    proc = DaemonProcess(home, "--grace", "10").start()
    assert _started_order(proc, waiting) == waiting

    # Claimed, then recovered after a kill -9.
    queue_behind("k-blocker-2", 30, waiting := ["zz-8", "mm-9", "aa-10"])
    proc.kill9()
    proc = DaemonProcess(home, "--grace", "10").start()
    assert _started_order(proc, waiting) == waiting
    assert proc.stop() == 0


def test_cancel_marker_cancels_a_running_request(daemon: DaemonProcess) -> None:
    rid = daemon.submit(script({"text": "started"}, {"sleep": 60}))
    daemon.wait_for_line(f"request.started id={rid}")
    _home.request_cancel(daemon.home, rid)
    verdict = daemon.verdict(rid)
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunCancelledError or type(err) is errors.CancelledError


def test_cancelling_a_running_request_again_is_one_cancel_requested_fact(daemon: DaemonProcess, tmp_path: Path) -> None:
    # The agent holds out past SIGTERM until the test lets it go, so the second cancel is
    # swept while the run still goes.  Each was logged, as if cancelled twice.
    termed, release = tmp_path / "termed", tmp_path / "release"
    script_text = f"trap ': > {termed}' TERM; echo going; while [ ! -e {release} ]; do sleep 0.05; done"
    rid = daemon.submit({
        "driver": "command", "prompt": "x", "workspace": str(tmp_path),
        "config": {"command": "/bin/sh", "extra_args": ["-c", script_text], "grace_period": 120},
    })
    daemon.wait_for_line(f"request.started id={rid}")
    marker = daemon.home.cancels / rid
    _home.request_cancel(daemon.home, rid)
    while not termed.exists():
        time.sleep(0.02)
    _home.request_cancel(daemon.home, rid)
    while marker.exists():  # swept while the run holds out
        time.sleep(0.02)
    release.touch()
    assert type(errors.from_wire(daemon.verdict(rid)["error"])) is errors.RunCancelledError
    facts = [
        record["event"]["data"]
        for record in map(orjson.loads, (daemon.home.events / "adaptord.jsonl").read_bytes().splitlines())
    ]
    assert [f["phase"] for f in facts if f["request_id"] == rid].count("request.cancel_requested") == 1


def test_a_request_cancelled_while_the_daemon_was_down_never_starts(tmp_path: Path) -> None:
    # The next start queued it and handed it to a worker before it read the cancels: the
    # agent ran (its side effects happened) and was killed, or even succeeded.
    proc = DaemonProcess(tmp_path / "home").start()
    assert proc.stop() == 0
    side_effect = tmp_path / "ran"
    rids = [
        _home.submit(proc.home, {"driver": "command", "prompt": "x", "workspace": str(tmp_path),
                                 "config": {"command": "/bin/sh", "extra_args": ["-c", f": > {side_effect}-{i}"]}})
        for i in range(8)
    ]
    for rid in rids:
        _home.request_cancel(proc.home, rid)
    proc = DaemonProcess(tmp_path / "home").start()
    for rid in rids:
        verdict = proc.verdict(rid)
        assert verdict["error"]["code"] == errors.CancelledError.code, verdict["error"]
        assert verdict["exit_code"] == 70 and verdict["run_id"] is None
    assert list(tmp_path.glob("ran-*")) == []
    assert proc.stop() == 0
    assert list(proc.home.cancels.iterdir()) == []  # every marker was swept


def test_approval_file_answered_by_a_responder(daemon: DaemonProcess) -> None:
    rid = daemon.submit(
        script(
            {"approval": {"kind": "permission", "title": "edit main.py"}},
            {"text": "edited"},
            policy={"approvals": {"timeout": 60}},
        )
    )
    pending = daemon.home.approvals_pending
    for _ in range(1500):
        entries = list(pending.glob("*.json"))
        if entries:
            break
        __import__("time").sleep(0.02)
    (entry,) = entries
    record = orjson.loads(entry.read_bytes())
    assert record["request_id"] == rid and record["approval_kind"] == "permission"
    # The run's meta, not a blank one (run_id "", time 1970).
    assert record["meta"]["run_id"] == record["run_id"] != ""
    assert record["meta"]["time"] == record["created_at"]
    approval_id = entry.name[: -len(".json")]
    _home.respond(daemon.home, approval_id, "approve")
    with pytest.raises(errors.ApprovalResolvedError):
        _home.respond(daemon.home, approval_id, "deny")
    verdict = daemon.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "edited"
    assert not entry.exists()
    with pytest.raises(errors.ApprovalResolvedError, match=r"already resolved \(approved\)"):
        _home.respond(daemon.home, approval_id, "deny")


def _pending_approval(daemon: DaemonProcess) -> str:
    deadline = time.monotonic() + 60
    while not (entries := list(daemon.home.approvals_pending.glob("*.json"))):
        assert time.monotonic() < deadline, "no pending approval"
        time.sleep(0.02)
    (entry,) = entries
    return entry.name[: -len(".json")]


def _write_response(daemon: DaemonProcess, approval_id: str, data: bytes) -> None:
    # As documented: written under another name, then renamed into place.
    tmp = daemon.home.approvals_responses / f".{approval_id}.tmp"
    tmp.write_bytes(data)
    tmp.rename(daemon.home.approvals_responses / f"{approval_id}.json")


def _set_aside(daemon: DaemonProcess, approval_id: str) -> None:
    deadline = time.monotonic() + 60
    while (daemon.home.approvals_responses / f"{approval_id}.json").exists() or os.path.islink(
        daemon.home.approvals_responses / f"{approval_id}.json"
    ):
        assert time.monotonic() < deadline, "the response was not set aside"
        time.sleep(0.02)
    assert list(daemon.home.quarantine.glob(f"approval-response-{approval_id}-*"))
    assert (daemon.home.approvals_pending / f"{approval_id}.json").exists()  # still open


def test_hand_written_and_hostile_response_files(daemon: DaemonProcess, tmp_path: Path) -> None:
    # A FIFO was opened for reading under the approvals lock: the worker and every later
    # `adaptor approve` waited forever.  Bad responses are set aside; the request stays open.
    rid = daemon.submit(script(
        {"approval": {"kind": "question", "title": "which?", "choices": ["a", "b"]}},
        {"text": "done"}, policy={"approvals": {"question": "ask", "timeout": 120}},
    ))
    approval_id = _pending_approval(daemon)
    response = daemon.home.approvals_responses / f"{approval_id}.json"
    os.mkfifo(response)
    _set_aside(daemon, approval_id)
    response.mkdir()
    _set_aside(daemon, approval_id)
    (tmp_path / "elsewhere.json").write_bytes(b'{"action": "deny"}')
    response.symlink_to(tmp_path / "elsewhere.json")
    _set_aside(daemon, approval_id)
    for bad in (b'{"action": "approve"}',  # a question is answered or denied
                b'{"action": "launch"}', b'["approve"]', b'{"action": "deny", "text": 5}',
                b"{" + b" " * (64 * 1024) + b"}"):
        _write_response(daemon, approval_id, bad)
        _set_aside(daemon, approval_id)
    _write_response(daemon, approval_id, b'{"action": "answer", "text": "b"}')
    verdict = daemon.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "done"
    assert not (daemon.home.approvals_pending / f"{approval_id}.json").exists()
    with pytest.raises(errors.ApprovalResolvedError):
        _home.respond(daemon.home, approval_id, "deny")


def test_a_response_file_set_aside_is_said_in_the_logs(daemon: DaemonProcess) -> None:
    # It was moved to quarantine/ without a word: whoever wrote it by hand only saw the
    # request stay pending, with nothing in the log or the audit log to say why.
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
        policy={"approvals": {"timeout": 120}},
    ))
    approval_id = _pending_approval(daemon)
    _write_response(daemon, approval_id, b'{"action": "approved"}')
    _set_aside(daemon, approval_id)
    # The fact is recorded by the lifecycle writer after the move (seen once in CI: read too
    # soon); its line is printed only once it is written, so that is what to wait for.
    daemon.wait_for_line(f"approval.response_refused id={rid} approval_id={approval_id}")
    (fact,) = [f for f in _approval_facts(daemon.home, approval_id) if f["phase"] == "approval.response_refused"]
    assert fact["request_id"] == rid and "approve, deny or answer" in fact["why"]
    assert (daemon.home.quarantine / fact["quarantined"]).read_bytes() == b'{"action": "approved"}'
    # With the byte-order mark Windows editors write: it was set aside too.
    _write_response(daemon, approval_id, b'\xef\xbb\xbf{"action": "approve"}')
    assert daemon.verdict(rid)["ok"]


def test_a_response_to_a_request_whose_file_a_script_left_half_written_wins(daemon: DaemonProcess) -> None:
    # `adaptor approve` took a response file still being written in place (not valid JSON
    # yet) for the winner: "already resolved", exit 5, though the daemon set the file aside
    # once it stayed half written and the request stayed open until it timed out.
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
        policy={"approvals": {"timeout": 120}},
    ))
    approval_id = _pending_approval(daemon)
    response = daemon.home.approvals_responses / f"{approval_id}.json"
    response.write_bytes(b'{"action": "de')  # in place, and the script died there
    assert _home.respond(daemon.home, approval_id, "approve") is True  # the run took it
    assert daemon.verdict(rid)["ok"]
    (quarantined,) = daemon.home.quarantine.glob(f"approval-response-{approval_id}-*")
    assert quarantined.read_bytes() == b'{"action": "de'


def test_a_response_file_no_request_waits_for_is_set_aside_and_said(daemon: DaemonProcess) -> None:
    # One written by hand after its approval was settled, or for an id with no request (a
    # typo), stayed in responses/ for ever, never read: whoever wrote it learnt nothing.
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
        policy={"approvals": {"timeout": 120}},
    ))
    approval_id = _pending_approval(daemon)
    _home.respond(daemon.home, approval_id, "approve")
    assert daemon.verdict(rid)["ok"]
    _write_response(daemon, approval_id, b'{"action": "deny"}')
    _write_response(daemon, "no-such-approval", b'{"action": "approve"}')
    deadline = time.monotonic() + 60
    while list(daemon.home.approvals_responses.iterdir()):
        assert time.monotonic() < deadline, "the responses were left in responses/"
        time.sleep(0.02)
    # (Their facts are recorded after the moves; each line is printed once its fact is written.)
    daemon.wait_for_line(f"approval.response_refused approval_id={approval_id} ")
    daemon.wait_for_line("approval.response_refused approval_id=no-such-approval")
    (late,) = [f for f in _approval_facts(daemon.home, approval_id) if f["phase"] == "approval.response_refused"]
    assert "already resolved (approved)" in late["why"]
    assert (daemon.home.quarantine / late["quarantined"]).read_bytes() == b'{"action": "deny"}'
    (unknown,) = _approval_facts(daemon.home, "no-such-approval")
    assert unknown["phase"] == "approval.response_refused" and "no pending approval" in unknown["why"]
    assert (daemon.home.quarantine / unknown["quarantined"]).read_bytes() == b'{"action": "approve"}'


def _approve_while_the_daemon_is_stopped(daemon: DaemonProcess, approval_timeout: float) -> tuple[str, subprocess.CompletedProcess[str]]:
    """A request waiting on an approval, and `adaptor approve --json` of it run while the daemon
    is stopped (SIGSTOP: a starved machine); the daemon goes on afterwards."""
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
        policy={"approvals": {"timeout": approval_timeout}},
    ))
    approval_id = _pending_approval(daemon)
    env = {**os.environ, "ADAPTORD_HOME": str(daemon.home.root)}
    assert daemon.proc is not None
    daemon.stop_off_the_approvals_lock()
    try:
        return rid, subprocess.run(
            ["adaptor", "approve", approval_id, "--json"], capture_output=True, text=True, env=env, timeout=60
        )
    finally:
        daemon.proc.send_signal(signal.SIGCONT)


def test_a_response_the_daemon_does_not_take_in_time_is_reported_so(daemon: DaemonProcess) -> None:
    # `adaptor approve` said "approved", exit 0, exactly as for a response the run took; the
    # run could then time out all the same.
    rid, approved = _approve_while_the_daemon_is_stopped(daemon, 120)
    assert approved.returncode == 0, approved.stderr
    result = orjson.loads(approved.stdout)["result"]
    assert (result["action"], result["taken"]) == ("approved", False), result
    assert "adaptord did not take the response within 10 s" in approved.stderr, approved.stderr
    assert daemon.verdict(rid)["ok"]  # taken once the daemon went on, before the deadline


def test_approve_does_not_wait_for_ever_on_a_daemon_stopped_holding_the_approvals_lock(daemon: DaemonProcess) -> None:
    # A daemon stopped (SIGSTOP, starved) in the milliseconds it keeps the approvals lock after
    # using it: `adaptor approve` waited for the lock for ever (a CI run's approve timed out).
    import fcntl

    rid = daemon.submit(script({"approval": {"kind": "permission", "title": "x"}}, {"text": "done"}))
    approval_id = _pending_approval(daemon)
    env = {**os.environ, "ADAPTORD_HOME": str(daemon.home.root)}
    with open(daemon.home.approvals_lock, "a") as held:  # as the stopped daemon holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        refused = subprocess.run(["adaptor", "approve", approval_id], capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 70, refused.stderr
    assert "adaptord held the approvals lock for 10 s (stopped or starved?); the response was not written" in refused.stderr
    approved = subprocess.run(["adaptor", "approve", approval_id], capture_output=True, text=True, env=env, timeout=60)
    assert approved.returncode == 0, approved.stderr  # not written before: this one counts
    assert daemon.verdict(rid)["ok"]


def test_a_response_the_daemon_did_not_take_before_the_deadline_is_refused(daemon: DaemonProcess) -> None:
    # Written in time, but the stopped daemon did not take it before the deadline, which passed
    # meanwhile: it was reported written (exit 0), though the run then timed the request out.
    rid, approved = _approve_while_the_daemon_is_stopped(daemon, 3)
    out = orjson.loads(approved.stdout)
    assert approved.returncode == 5 and out["error"]["code"] == "ErrApprovalExpired", approved.stdout
    assert "expired before adaptord took this response" in out["error"]["message"]
    assert daemon.verdict(rid)["error"]["code"] == "ErrApprovalTimeout"


def test_the_cli_replaces_a_response_file_the_daemon_would_set_aside(tmp_path: Path) -> None:
    # It took any file there for a winning response: "already resolved" while the request
    # was still open (for good with no daemon to set the file aside).
    home = _home.Home.at(tmp_path / "home")
    for directory in (home.approvals_pending, home.approvals_responses, home.approvals_resolved):
        directory.mkdir(parents=True)  # (no quarantine/ yet: no daemon has served this home)
    for approval_id in ("ap-1", "ap-2"):
        pending = {"id": approval_id, "approval_kind": "permission", "request_id": "r"}
        (home.approvals_pending / f"{approval_id}.json").write_bytes(orjson.dumps(pending))
    os.mkfifo(home.approvals_responses / "ap-1.json")
    (home.approvals_responses / "ap-2.json").mkdir()
    (home.approvals_responses / "ap-2.json" / "inside").write_text("")
    # A stand-in for the daemon: with none serving the home, its runs have ended (expired).
    serving = filelock.FileLock(str(home.daemon_lock), mode=0o600, thread_local=False)
    with serving:
        for approval_id in ("ap-1", "ap-2"):
            assert _home.respond(home, approval_id, "approve") is False  # the stand-in takes none
            response = home.approvals_responses / f"{approval_id}.json"
            assert orjson.loads(response.read_bytes())["action"] == "approve"
            assert list(home.quarantine.glob(f"approval-response-{approval_id}-*"))
            with pytest.raises(errors.ApprovalResolvedError):  # a usable response did win
                _home.respond(home, approval_id, "deny")


@pytest.mark.parametrize("stopped", ["before the write", "in the folder's sync after it"])
def test_a_responder_stopped_while_writing_says_what_became_of_its_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: str
) -> None:
    # Stopped in the few milliseconds of the write (the file is in place before the folder's
    # sync ends), it said "not written", yet the response stood and the run went on approved.
    home = _home.Home.at(tmp_path / "home")
    for directory in (home.approvals_pending, home.approvals_responses, home.approvals_resolved):
        directory.mkdir(parents=True)
    pending = {"id": "ap-1", "approval_kind": "permission", "request_id": "r"}
    (home.approvals_pending / "ap-1.json").write_bytes(orjson.dumps(pending))
    response = home.approvals_responses / "ap-1.json"
    sync_folder = _durable.fsync_dir

    def ctrl_c(*_: object) -> None:
        raise KeyboardInterrupt

    if stopped == "before the write":
        monkeypatch.setattr(_durable, "atomic_write", ctrl_c)
    else:
        def sync_then_stop(directory: Any) -> None:
            sync_folder(directory)
            if os.path.samefile(directory, home.approvals_responses):
                assert response.exists()
                raise KeyboardInterrupt

        monkeypatch.setattr(_durable, "fsync_dir", sync_then_stop)
    serving = filelock.FileLock(str(home.daemon_lock), mode=0o600, thread_local=False)
    with serving, pytest.raises(KeyboardInterrupt) as stop:
        _home.respond(home, "ap-1", "approve")
    assert not response.exists()  # nothing the responder gave up on counts
    expected = None if stopped == "before the write" else True  # never written / taken back
    assert stop.value.response_taken_back is expected  # type: ignore[attr-defined]


def test_the_lifecycle_log_joins_the_audit_logs_and_names_every_id(daemon: DaemonProcess) -> None:
    # No fact carried a run id and no event a request id: once retention removed the verdict,
    # a request's facts could not be tied to its events.  A request refused before its driver
    # started had a verdict naming an audit log that never came (`tail -F` waited for ever), and
    # a resubmitted id's quarantine fact did not name it.
    ran = daemon.submit(script({"text": "x"}))
    refused = daemon.submit(script({"text": "x"}, policy={"sandbox": "nope"}))
    verdict, refusal = daemon.verdict(ran), daemon.verdict(refused)
    assert refusal["error"]["code"] == "ErrInvalidPolicy" and refusal["events"] is None, refusal
    # Nor a thread's turn refused so: its log holds the earlier turns, none of this one.
    turn = {"driver": "script", "prompt": "x", "thread": {"key": "joined"}, "config": {"steps": [{"text": "x"}], "session": "auto"}}
    assert daemon.verdict(daemon.submit(turn))["events"] is not None
    refused_turn = daemon.verdict(daemon.submit({**turn, "policy": {"sandbox": "nope"}}))
    assert refused_turn["error"]["code"] == "ErrInvalidPolicy" and refused_turn["events"] is None, refused_turn
    daemon.drop(f"{ran}.json", orjson.dumps(script({"text": "again"})))
    daemon.wait_for_line(f"id_in_use={ran}")
    daemon.wait_for_line(f"verdict.written id={refused}")
    reader = sr.EventRecorder(sr.JSONLEventBackend(daemon.home.events), key_validator=lambda k: None)
    facts = [_fact(r) for r in reader.since("adaptord")]
    started = [f for f in facts if f["phase"] == "request.started" and f["request_id"] == ran]
    written = [f for f in facts if f["phase"] == "verdict.written" and f["request_id"] == ran]
    assert [f["run_id"] for f in started + written] == [verdict["run_id"]] * 2, facts
    events = [r.event for r in reader.since(ran)]
    assert {e.meta.run_id for e in events} == {verdict["run_id"]}
    refused_started = [f for f in facts if f["phase"] == "request.started" and f["request_id"] == refused]
    assert [f["run_id"] for f in refused_started] == [refusal["run_id"]]
    assert not (daemon.home.events / f"{refused}.jsonl").exists()
    (again,) = [f for f in facts if f["phase"] == "request.quarantined" and f.get("id_in_use") == ran]
    assert "already received" in again["why"]


def _approval_facts(home: _home.Home, approval_id: str) -> list[dict[str, Any]]:
    reader = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    return [_fact(r) for r in reader.since("adaptord") if _fact(r).get("approval_id") == approval_id]


def test_a_response_the_ended_run_never_took_is_audited_as_expired(daemon: DaemonProcess) -> None:
    # The route noticed the run's end only at its next poll: a response written meanwhile was
    # taken, resolved/ said "approve" and the audit log "approval.resolved action=approve",
    # though the cancelled run never got it.
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "never"},
        policy={"approvals": {"timeout": 60}},
    ))
    approval_id = _pending_approval(daemon)
    # Holding the approvals lock keeps the daemon from acting on the approval meanwhile.
    with _durable.exclusive(daemon.home.approvals_lock):
        _home.respond(daemon.home, approval_id, "approve")  # in time: the run still waits
        _home.request_cancel(daemon.home, rid)
        deadline = time.monotonic() + 60
        while (daemon.home.cancels / rid).exists():  # removed once the run was cancelled
            assert time.monotonic() < deadline, "the cancel was not applied"
            time.sleep(0.01)
    assert daemon.verdict(rid)["error"]["code"] == "ErrRunCancelled"
    daemon.wait_for_line(f"verdict.written id={rid}")  # its approval's facts come before it
    facts = _approval_facts(daemon.home, approval_id)
    assert [f["phase"] for f in facts] == ["approval.pending", "approval.expired"], facts
    assert facts[-1]["why"] == "run ended" and facts[-1]["ignored_response"] == "approve"
    resolved = orjson.loads((daemon.home.approvals_resolved / f"{approval_id}.json").read_bytes())
    assert resolved["result"] == "expired"
    assert not (daemon.home.approvals_responses / f"{approval_id}.json").exists()
    with pytest.raises(errors.ApprovalExpiredError):
        _home.respond(daemon.home, approval_id, "deny")


def _killed_while_an_approval_waits(
    tmp_path: Path, listed: Callable[[Client], list[str]] | None = None
) -> tuple[DaemonProcess, str, str]:
    """A daemon kill -9ed while a run (entered, so a restart fails it) waits for an approval:
    the daemon, the request id and the approval id.  ``listed`` sees the listing before the
    kill, which must be exactly that approval."""
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, policy={"approvals": {"timeout": 600}},
    ))
    approval_id = _pending_approval(daemon)
    if listed is not None:
        assert listed(Client(daemon.home.root)) == [approval_id]
    # The fact is printed once it is in the lifecycle log, which a kill -9 before its write
    # (its writer gathers facts for a few ms) would lose, and with it the "approval.pending".
    daemon.wait_for_line(f"approval.pending id={rid}")
    state = daemon.home.run_state(rid)
    deadline = time.monotonic() + 60
    while not orjson.loads(state.read_bytes()).get("entered"):  # so the restart fails it
        assert time.monotonic() < deadline, "the run was not entered"
        time.sleep(0.02)
    # The run's log gets its notice.approval.requested from the worker reading the run's
    # events, which may come a moment after the pending file (the run's own thread writes
    # that): waited for, so the crash is the same every time (the restart mends a log
    # without it: see the tests below).
    while not any(isinstance(e, events.Notice) and e.kind == "approval.requested"
                  for e in Client(daemon.home.root).events(rid)):
        assert time.monotonic() < deadline, "the run's log has no approval.requested"
        time.sleep(0.02)
    daemon.kill9()
    return daemon, rid, approval_id


def test_a_restart_expires_a_dead_runs_approval_whatever_response_was_left(tmp_path: Path) -> None:
    # The leftover response won: resolved/ said "approve" for a run that never got it, and the
    # audit fact had no request id.
    daemon, rid, approval_id = _killed_while_an_approval_waits(tmp_path)
    _write_response(daemon, approval_id, b'{"action": "approve"}')  # a script's, as documented
    restarted = DaemonProcess(tmp_path / "home").start()  # its stale approvals are audited before "ready"
    try:
        assert not restarted.verdict(rid)["ok"]
        resolved = orjson.loads((daemon.home.approvals_resolved / f"{approval_id}.json").read_bytes())
        assert resolved["result"] == "expired"
        assert not (daemon.home.approvals_responses / f"{approval_id}.json").exists()
        assert not (daemon.home.approvals_pending / f"{approval_id}.json").exists()
        expired = _approval_facts(daemon.home, approval_id)[-1]
        assert expired["phase"] == "approval.expired" and expired["request_id"] == rid
        assert expired["why"] == "daemon restart" and expired["ignored_response"] == "approve"
        # The run's own log says how its approval ended, as after any other end: it stopped
        # at notice.approval.requested, the outcome only in the lifecycle log.
        logged = list(Client(daemon.home.root).events(rid))
    finally:
        assert restarted.stop() == 0
    notices = [(e.kind, e.data["request_id"], e.data.get("result")) for e in logged
               if isinstance(e, events.Notice) and e.kind.startswith("approval.")]
    assert notices == [("approval.requested", approval_id, None),
                       ("approval.resolved", approval_id, "aborted")]
    assert isinstance(logged[-1], events.RunFinished) and logged[-1].reason == "infrastructure_error"
    # Numbered on from the run's own events (they had sequence 0 and sorted first).
    sequences = [e.meta.sequence for e in logged if e.meta.run_id == logged[-1].run_id]
    assert sequences == list(range(1, len(sequences) + 1)), sequences


def _approval_notices(logged: list[events.Event]) -> list[tuple[str, str, str | None]]:
    return [(e.kind, e.data["request_id"], e.data.get("result")) for e in logged
            if isinstance(e, events.Notice) and e.kind.startswith("approval.")]


def _run_log(daemon: DaemonProcess, rid: str) -> Path:
    session = orjson.loads(daemon.home.run_state(rid).read_bytes())["session"]
    return daemon.home.events / f"{session}.jsonl"


def _drop_the_runs_approval_request(daemon: DaemonProcess, rid: str) -> None:
    """Cut the run's notice.approval.requested, its log's last record, as a crash before the
    worker recorded it would have left the log."""
    log = _run_log(daemon, rid)
    data = log.read_bytes()
    cut = data.rstrip(b"\n").rfind(b"\n") + 1
    assert orjson.loads(data[cut:])["kind"] == "notice.approval.requested"
    os.truncate(log, cut)


def _killed_before_the_request_was_logged(tmp_path: Path) -> tuple[DaemonProcess, str, str, dict[str, Any]]:
    """:func:`_killed_while_an_approval_waits`, the run's log cut back to before its
    notice.approval.requested: the daemon, the request id, the approval id and its pending file."""
    daemon, rid, approval_id = _killed_while_an_approval_waits(tmp_path)
    _drop_the_runs_approval_request(daemon, rid)
    return daemon, rid, approval_id, _home.read_pending(daemon.home, approval_id)


def _restart_and_read(tmp_path: Path, daemon: DaemonProcess, rid: str) -> list[events.Event]:
    restarted = DaemonProcess(tmp_path / "home").start()
    try:
        assert not restarted.verdict(rid)["ok"]
        logged = list(Client(daemon.home.root).events(rid))
    finally:
        assert restarted.stop() == 0
    assert isinstance(logged[-1], events.RunFinished) and logged[-1].reason == "infrastructure_error"
    sequences = [e.meta.sequence for e in logged if e.meta.run_id == logged[-1].run_id]
    assert sequences == list(range(1, len(sequences) + 1)), sequences
    return logged


def test_a_restart_logs_the_request_of_an_approval_the_crash_kept_out_of_the_runs_log(
    tmp_path: Path,
) -> None:
    # The run's own thread writes the pending file; the worker records the run's
    # notice.approval.requested a moment later.  Killed in between, the restart logged the
    # approval's "aborted" end for a request the log never showed.
    daemon, rid, approval_id, pending = _killed_before_the_request_was_logged(tmp_path)
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, "aborted")]
    (requested,) = [e for e in logged if isinstance(e, events.Notice) and e.kind == "approval.requested"]
    assert requested.text == "x" and requested.data["kind"] == "permission"
    assert requested.data["default_result"] == "ask" and requested.data["attempt"] == 0
    assert requested.data["created_at"] == pending["created_at"]


def test_a_restart_logs_the_request_of_an_approval_whose_pending_file_was_changed_by_hand(
    tmp_path: Path,
) -> None:
    # A date without its zone (TypeError): the run got no verdict from that start.
    daemon, rid, approval_id = _killed_while_an_approval_waits(tmp_path)
    _drop_the_runs_approval_request(daemon, rid)
    pending = daemon.home.approvals_pending / f"{approval_id}.json"
    record = orjson.loads(pending.read_bytes())
    record["created_at"] = "2026-12-06T10:00:00"
    pending.write_bytes(orjson.dumps(record))
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, "aborted")]


def test_a_restart_resolves_an_approval_the_runs_log_shows_asked_without_a_pending_file(
    tmp_path: Path,
) -> None:
    # Killed after the log got notice.approval.requested but before the route wrote the
    # pending file: the restart found nothing to expire and the log's request stayed open.
    daemon, rid, approval_id = _killed_while_an_approval_waits(tmp_path)
    (daemon.home.approvals_pending / f"{approval_id}.json").unlink()
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, "aborted")]


def test_a_start_that_fails_after_expiring_an_approval_leaves_its_request_for_the_next(
    tmp_path: Path,
) -> None:
    # A crash between the pending file and the run's notice.approval.requested, then a start
    # that expired the pending file but stopped before the run's recovery (here: its --a2a
    # port taken): the next start had nothing left to log the request from, and the run's log
    # never showed the approval it had waited on.
    daemon, rid, approval_id, pending = _killed_before_the_request_was_logged(tmp_path)
    (tmp_path / "a2a.toml").write_text(
        '[a2a.agents.echo.request]\ndriver = "script"\nconfig = { steps = [{ text = "hi" }] }\n'
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = DaemonProcess(
            tmp_path / "home", "--config", str(tmp_path / "a2a.toml"), "--a2a", f"127.0.0.1:{port}"
        ).start(wait_ready=False)
        assert failed.proc is not None and failed.proc.wait(timeout=60) == 2
        failed.wait_for_line("cannot listen")
    assert not (daemon.home.approvals_pending / f"{approval_id}.json").exists()  # expired by it
    assert not (daemon.home.verdicts / f"{rid}.json").exists()  # and not recovered
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, "aborted")]
    (requested,) = [e for e in logged if isinstance(e, events.Notice) and e.kind == "approval.requested"]
    assert requested.text == "x" and requested.data["created_at"] == pending["created_at"]


def test_a_requeued_runs_restart_does_not_end_an_earlier_attempts_approval_again(tmp_path: Path) -> None:
    # Found by the crash torture: the restart that requeued the request kept its first
    # attempt's approval in resolved/ (and logged its end); the next restart, recovering the
    # second attempt, logged that approval asked and aborted a second time.
    def waiting(daemon: DaemonProcess, rid: str, asked: int) -> str:
        """The id of the approval the run waits on once the log shows ``asked`` requests."""
        deadline = time.monotonic() + 60
        while True:
            pending = list(daemon.home.approvals_pending.glob("*.json"))
            notices = _approval_notices(list(Client(daemon.home.root).events(rid)))
            if pending and sum(kind == "approval.requested" for kind, _, _ in notices) == asked:
                return pending[0].name[: -len(".json")]
            assert time.monotonic() < deadline, (notices, daemon.lines)
            time.sleep(0.02)

    daemon = DaemonProcess(tmp_path / "home").start()
    rid = daemon.submit({**script({"approval": {"kind": "permission", "title": "x"}},
                                  policy={"approvals": {"timeout": 600}}), "on_interrupt": "requeue"})
    first = waiting(daemon, rid, 1)
    daemon.kill9()
    daemon = DaemonProcess(tmp_path / "home").start()  # ends the first attempt, runs a second
    second = waiting(daemon, rid, 2)
    daemon.kill9()
    # Ends the second attempt and runs a third, which its stop ends (without the drain's wait).
    daemon = DaemonProcess(tmp_path / "home", "--grace", "0.5").start()
    third = waiting(daemon, rid, 3)
    assert daemon.stop() == 0
    notices = _approval_notices(list(Client(daemon.home.root).events(rid)))
    assert len({first, second, third}) == 3
    assert notices == [("approval.requested", first, None), ("approval.resolved", first, "aborted"),
                       ("approval.requested", second, None), ("approval.resolved", second, "aborted"),
                       ("approval.requested", third, None), ("approval.resolved", third, "aborted")], notices


def _cut_the_runs_log_at(daemon: DaemonProcess, rid: str, kind: str) -> None:
    """Cut the run's log from its first record of ``kind`` on, as a crash (a power loss: the
    log is synced only at the run's end) before the worker recorded it would have left it."""
    log = _run_log(daemon, rid)
    data = log.read_bytes()
    offset = 0
    for line in data.splitlines(keepends=True):
        if orjson.loads(line)["kind"] == kind:
            os.truncate(log, offset)
            return
        offset += len(line)
    raise AssertionError(f"no {kind} in the run's log")


@pytest.mark.parametrize(
    ("step", "action", "text", "outcome"),
    [
        ({"kind": "permission", "title": "x"}, "approve", "", ("approved", "", "")),
        ({"kind": "permission", "title": "x"}, "deny", "not on a Friday", ("rejected", "", "not on a Friday")),
        ({"kind": "question", "title": "x", "choices": ["red", "blue"]}, "answer", "blue", ("answered", "blue", "blue")),
        ({"kind": "question", "title": "x", "choices": ["red"]}, "answer", "green", ("answered", "", "green")),
    ],
    ids=["approve", "deny", "answer-choice", "answer-free"],
)
def test_a_restart_logs_the_answer_a_run_took_before_its_log_showed_it(
    tmp_path: Path, step: dict[str, Any], action: str, text: str, outcome: tuple[str, str, str],
) -> None:
    # The run took the answer (resolved/ said so) but the crash came before its log had the
    # notice.approval.resolved: the restart logged the approval "aborted", as if nobody had
    # answered, and the run's log contradicted the outcome the responder was told.
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = daemon.submit(script({"approval": step}, {"sleep": 600}, policy={
        "approvals": {"timeout": 600, "question": "ask", "on_reject": "continue"},
    }))
    approval_id = _pending_approval(daemon)
    _home.respond(daemon.home, approval_id, action, text=text)
    deadline = time.monotonic() + 60
    while not any(n[0] == "approval.resolved" for n in _approval_notices(list(Client(daemon.home.root).events(rid)))):
        assert time.monotonic() < deadline, "the run's log has no approval.resolved"
        time.sleep(0.02)
    daemon.kill9()
    (taken,) = [e for e in Client(daemon.home.root).events(rid)
                if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    _cut_the_runs_log_at(daemon, rid, "notice.approval.resolved")
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, outcome[0])]
    (resolved,) = [e for e in logged if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    assert (resolved.data["result"], resolved.data["choice"], resolved.data["text"]) == outcome
    # Dated when the run took it, as the lost notice was, not when the restart wrote it.
    assert resolved.data["resolved_at"] == taken.data["resolved_at"]
    assert resolved.data["latency"] == taken.data["latency"]


def _append_to_run_log(daemon: DaemonProcess, rid: str, *made: events.Event) -> None:
    """Events written by hand (through the recorder: framed and checksummed) after the run's
    last, numbered on from it."""
    logged = list(Client(daemon.home.root).events(rid))
    run_id = orjson.loads(daemon.home.run_state(rid).read_bytes())["run_id"]
    last = max(e.meta.sequence for e in logged if e.meta.run_id == run_id)
    session = orjson.loads(daemon.home.run_state(rid).read_bytes())["session"]
    with sr.EventRecorder(sr.JSONLEventBackend(daemon.home.events)) as recorder:
        for number, event in enumerate(made, start=last + 1):
            recorder.record(session, dataclasses.replace(
                event, meta=events.EventMeta(run_id=run_id, sequence=number, time=datetime.now(UTC))))


def _asked(approval_id: object, **data: Any) -> events.Notice:
    return events.Notice(kind="approval.requested", text="by hand",
                         data={"request_id": approval_id, "kind": "permission", **data})


@pytest.mark.parametrize(
    "odd",
    [
        # The restart failed on each (AttributeError, TypeError): no verdict, on any later start.
        _asked("hand-1", created_at=12345),
        _asked("hand-1", created_at=None),
        _asked("hand-1", created_at="2026-12-06T10:00:00"),  # no time zone
        # Ended the reading of the log: the restart's events numbered as if it ended there.
        events.Notice(kind="approval.requested", text="by hand", data={}),
        # Never ended.
        _asked(7, created_at="2026-12-06T10:00:00Z"),
    ],
    ids=["created-int", "created-null", "created-naive", "no-id", "id-int"],
)
def test_a_restart_ends_the_runs_log_whatever_approval_notices_were_written_into_it(
    tmp_path: Path, odd: events.Notice,
) -> None:
    daemon, rid, approval_id = _killed_while_an_approval_waits(tmp_path)
    _append_to_run_log(daemon, rid, odd, _asked("hand-2", created_at="2026-12-06T10:00:00Z"))
    logged = _restart_and_read(tmp_path, daemon, rid)
    asked = [e.data.get("request_id") for e in logged
             if isinstance(e, events.Notice) and e.kind == "approval.requested"]
    ended = [e.data.get("request_id") for e in logged
             if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    assert sorted(map(repr, ended)) == sorted(map(repr, asked)), (asked, ended)
    assert approval_id in ended and "hand-2" in ended


@pytest.mark.parametrize("on_interrupt", ["fail", "requeue"])
def test_a_run_whose_restart_was_killed_after_ending_its_log_is_still_interrupted(
    tmp_path: Path, on_interrupt: str,
) -> None:
    # The restart's own run.finished (written before the verdict or the requeue) was taken
    # by the next start for the run's: "the run finished, but the daemon stopped before it
    # wrote the run's verdict", and a requeued run was not run again.
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = daemon.submit({**script({"sleep": 600}), "on_interrupt": on_interrupt})
    state = daemon.home.run_state(rid)
    deadline = time.monotonic() + 60
    while not (state.exists() and orjson.loads(state.read_bytes()).get("entered")):
        assert time.monotonic() < deadline, "the run was not entered"
        time.sleep(0.02)
    first_run = orjson.loads(state.read_bytes())["run_id"]
    daemon.kill9()
    # What the next start writes first, killed before its verdict or requeue.
    _append_to_run_log(daemon, rid, events.RunFinished(
        run_id=first_run, failed=True, reason="infrastructure_error",
        message="the daemon stopped while the run was in progress",
    ))
    request = orjson.loads((daemon.home.claimed / f"{rid}.json").read_bytes())
    if on_interrupt == "requeue":
        # The second attempt must end: the same request, without the long sleep.
        request["config"]["steps"] = [{"text": "second"}]
        (daemon.home.claimed / f"{rid}.json").write_bytes(orjson.dumps(request))
    restarted = DaemonProcess(tmp_path / "home").start()
    try:
        verdict = restarted.verdict(rid)
        logged = list(Client(daemon.home.root).events(rid))
    finally:
        assert restarted.stop() == 0
    ends = [e.meta.run_id for e in logged if isinstance(e, events.RunFinished)]
    if on_interrupt == "requeue":
        assert verdict["ok"] and verdict["result"]["text"] == "second", verdict
        assert ends[0] == first_run and len(ends) == 2 and ends[1] != first_run, ends
    else:
        assert not verdict["ok"]
        error = verdict["error"]
        assert error["message"].startswith("the daemon stopped while the run was in progress"), error
        assert error["details"].get("interrupted") is True and "finished" not in error["details"]
        assert ends == [first_run]  # not ended twice


def test_a_restart_does_not_end_again_an_approval_the_runs_log_shows_resolved(tmp_path: Path) -> None:
    # Killed after the answer reached the run's log but before the route removed the pending
    # file: the restart logged a second, contradicting "aborted" after the "approved".
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"sleep": 600},
        policy={"approvals": {"timeout": 600}},
    ))
    approval_id = _pending_approval(daemon)
    kept = (daemon.home.approvals_pending / f"{approval_id}.json").read_bytes()
    _home.respond(daemon.home, approval_id, "approve")
    deadline = time.monotonic() + 60
    while ("approval.resolved", approval_id, "approved") not in _approval_notices(
        list(Client(daemon.home.root).events(rid))
    ):
        assert time.monotonic() < deadline, "the run's log has no approval.resolved"
        time.sleep(0.02)
    daemon.kill9()
    (daemon.home.approvals_pending / f"{approval_id}.json").write_bytes(kept)
    logged = _restart_and_read(tmp_path, daemon, rid)
    assert _approval_notices(logged) == [("approval.requested", approval_id, None),
                                         ("approval.resolved", approval_id, "approved")]


def test_an_approval_a_response_expired_while_the_daemon_was_down_is_audited_and_not_listed(
    tmp_path: Path,
) -> None:
    # A response after a crash expired the approval and removed its pending file itself, so
    # the restart found nothing to expire: the audit log said "approval.pending" and never how
    # it ended.  And while the daemon was down, `adaptor approvals` listed it as open though
    # every response to it was refused.
    daemon, rid, approval_id = _killed_while_an_approval_waits(
        tmp_path, listed=lambda client: [a["id"] for a in client.approvals()]
    )
    client = Client(daemon.home.root)
    assert client.approvals() == []
    listed = subprocess.run(
        [sys.executable, "-m", "adaptor", "approvals", "--home", str(daemon.home.root)],
        capture_output=True, text=True, timeout=60,
    )
    assert (listed.returncode, listed.stdout) == (0, ""), listed.stderr
    assert "adaptord is not running" in listed.stderr
    with pytest.raises(errors.ApprovalExpiredError):
        client.approve(approval_id)
    restarted = DaemonProcess(tmp_path / "home").start()  # its stale approvals are audited before "ready"
    try:
        assert not restarted.verdict(rid)["ok"]
        facts = _approval_facts(daemon.home, approval_id)
        assert [fact["phase"] for fact in facts] == ["approval.pending", "approval.expired"]
        assert facts[-1]["request_id"] == rid and "ignored_response" not in facts[-1]
        assert not (daemon.home.approvals_pending / f"{approval_id}.json").exists()
        with pytest.raises(errors.ApprovalExpiredError):
            client.deny(approval_id)  # expired for good
    finally:
        assert restarted.stop() == 0


def test_an_approval_shows_its_runs_deadline_when_that_comes_first(daemon: DaemonProcess) -> None:
    # The pending file and `adaptor approvals` said "until" the approval's own 10 minutes in a
    # run with 2 left: no response was taken after the run's end, whatever they promised.
    rid = daemon.submit(script(
        {"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
        timeout=120, policy={"approvals": {"timeout": 600}},
    ))
    approval_id = _pending_approval(daemon)
    pending = _home.read_pending(daemon.home, approval_id)
    created = datetime.fromisoformat(pending["created_at"])
    deadline = datetime.fromisoformat(pending["deadline"])
    assert created < deadline <= created + timedelta(seconds=120), pending
    (listed,) = Client(daemon.home.root).approvals()
    assert listed["deadline"] == pending["deadline"]
    _home.respond(daemon.home, approval_id, "approve")
    assert daemon.verdict(rid)["ok"]


def test_approval_expiry_is_a_timeout_verdict(daemon: DaemonProcess) -> None:
    rid = daemon.submit(script({"approval": {"kind": "permission", "title": "x"}}, policy={"approvals": {"timeout": 0.3}}))
    verdict = daemon.verdict(rid)
    assert verdict["error"]["code"] == "ErrApprovalTimeout"
    assert list(daemon.home.approvals_pending.iterdir()) == []


def test_resolved_approvals_are_forgotten_after_a_week_and_not_before(tmp_path: Path) -> None:
    # approvals/resolved/ kept one file per approval for ever: a daemon serving for months
    # grew it without bound.
    daemon = DaemonProcess(tmp_path / "home").start()
    answered = daemon.submit(script({"approval": {"kind": "permission", "title": "x"}}, {"text": "done"},
                                    policy={"approvals": {"timeout": 60}}))
    old = _pending_approval(daemon)
    _home.respond(daemon.home, old, "approve")
    assert daemon.verdict(answered)["ok"]
    timed_out = daemon.submit(script({"approval": {"kind": "permission", "title": "y"}},
                                     policy={"approvals": {"timeout": 0.3}}))
    assert daemon.verdict(timed_out)["error"]["code"] == "ErrApprovalTimeout"
    (recent,) = {p.name[: -len(".json")] for p in daemon.home.approvals_resolved.glob("*.json")} - {old}
    assert daemon.stop() == 0
    resolved = daemon.home.approvals_resolved
    leftover = resolved / f"{old}.json.tmp-0123abcd"  # a crash's, next to the file it was for
    leftover.write_bytes(b"{")
    week = 7 * 24 * 3600
    now = time.time()
    for path, age in ((resolved / f"{old}.json", week + 60), (leftover, week + 60),
                      (resolved / f"{recent}.json", week - 3600)):
        os.utime(path, (now - age, now - age))
    restarted = DaemonProcess(tmp_path / "home").start()  # it prunes at its main loop's first turn
    try:
        deadline = time.monotonic() + 60
        while (resolved / f"{old}.json").exists() or leftover.exists():
            assert time.monotonic() < deadline, f"not pruned: {sorted(p.name for p in resolved.iterdir())}"
            time.sleep(0.05)
        # Within the week a late response still learns why it came too late...
        assert (resolved / f"{recent}.json").exists()
        with pytest.raises(errors.ApprovalExpiredError):
            _home.respond(restarted.home, recent, "approve")
        # ... and after it the id is unknown, as one that never existed.
        with pytest.raises(errors.ApprovalUnavailableError):
            _home.respond(restarted.home, old, "deny")
    finally:
        assert restarted.stop() == 0


def test_sd_notify_ready_and_stopping(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    proc = DaemonProcess(tmp_path / "home", env={"NOTIFY_SOCKET": sock_path}).start()
    assert b"READY=1" in sock.recv(4096)
    assert proc.stop() == 0
    assert b"STOPPING=1" in sock.recv(4096)
    sock.close()


class _NotifySocket:
    """The systemd end of sd_notify: a real AF_UNIX datagram socket the daemon sends to."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)

    def until(self, needle: bytes, timeout: float = 60.0) -> list[bytes]:
        """The datagrams up to the first holding ``needle``, which arrives within ``timeout``."""
        seen: list[bytes] = []
        deadline = time.monotonic() + timeout
        while not seen or needle not in seen[-1]:
            left = deadline - time.monotonic()
            self._sock.settimeout(max(left, 0.001))
            try:
                seen.append(self._sock.recv(4096))
            except TimeoutError:
                raise AssertionError(f"no {needle!r} within {timeout:g} s; got {seen}") from None
        return seen

    def pings(self, count: int, timeout: float = 60.0) -> None:
        for _ in range(count):
            self.until(b"WATCHDOG=1", timeout)

    def during(self, seconds: float) -> list[bytes]:
        """Every datagram arriving within the next ``seconds``."""
        seen: list[bytes] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._sock.settimeout(left)
            try:
                seen.append(self._sock.recv(4096))
            except TimeoutError:
                break
        return seen

    def close(self) -> None:
        self._sock.close()


_WATCHDOG = {"WATCHDOG_USEC": "400000"}  # pings every 0.1 s


def test_the_watchdog_is_pinged_while_idle_running_and_draining(tmp_path: Path) -> None:
    # With WatchdogSec= in its unit, systemd restarts a daemon whose main loop hangs; but the
    # daemon sent no WATCHDOG=1 at all, so systemd killed a healthy one after WatchdogSec.
    notify = _NotifySocket(tmp_path / "notify.sock")
    proc = DaemonProcess(
        tmp_path / "home", "--grace", "3", env={"NOTIFY_SOCKET": notify.path, **_WATCHDOG}
    ).start()
    notify.until(b"READY=1")
    notify.pings(5)  # idle: the loop's wait (scan_interval, 2 s by default) is cut short
    rid = proc.submit(script({"text": "started"}, {"sleep": 60}))
    proc.wait_for_line(f"request.started id={rid}")
    notify.pings(5)
    proc.signal(signal.SIGTERM)
    notify.until(b"STOPPING=1")
    notify.pings(5)  # the drain waits up to --grace for the run: not a hang either
    assert proc.wait_exit() == 0
    assert proc.verdict(rid)["error"]["type"] == "RunCancelledError"
    notify.close()


@pytest.mark.parametrize(
    "env",
    [
        {},  # no WatchdogSec=
        {**_WATCHDOG, "WATCHDOG_PID": "1"},  # meant for another process (the daemon's parent)
        {**_WATCHDOG, "WATCHDOG_PID": "x"},
        {"WATCHDOG_USEC": "0.4"},
        {"WATCHDOG_USEC": "0"},
    ],
)
def test_no_watchdog_pings_unless_asked_for_this_process(tmp_path: Path, env: dict[str, str]) -> None:
    notify = _NotifySocket(tmp_path / "notify.sock")
    proc = DaemonProcess(tmp_path / "home", env={"NOTIFY_SOCKET": notify.path, **env}).start()
    notify.until(b"READY=1")
    assert notify.during(2.0) == []
    assert proc.stop() == 0
    assert b"STOPPING=1" in notify.until(b"STOPPING=1")[-1]
    notify.close()


def test_the_watchdog_is_for_this_process_when_it_names_its_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptord.daemon import _Watchdog

    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert _Watchdog.from_environment().interval == 7.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert _Watchdog.from_environment().interval is None


def test_a_stuck_main_loop_stops_the_watchdog_pings(tmp_path: Path) -> None:
    # The point of the watchdog: the main loop stuck in a system call (here a write to a full
    # stderr pipe, as when journald does not read) must go quiet, whatever the other threads do.
    notify = _NotifySocket(tmp_path / "notify.sock")
    read_end, write_end = os.pipe()
    # A [tools] entry that is no tool: each reload's main loop says so on stderr itself (its
    # "config reloaded" is a lifecycle fact, printed by the lifecycle log's own thread).
    config = tmp_path / "config.toml"
    config.write_text('[tools]\nplain = "os.path:join"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "home"), "--config", str(config)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=write_end,
        env={**os.environ, "NOTIFY_SOCKET": notify.path, **_WATCHDOG},
    )
    drained = bytearray()
    reader = threading.Thread(target=lambda: _read_all(read_end, drained), daemon=True)
    try:
        notify.until(b"READY=1")
        notify.pings(3)
        # Filled through a description of its own: O_NONBLOCK on the daemon's would make its
        # writes fail (and be skipped) rather than wait.
        filler = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(filler, b"x" * 4096)
        os.close(filler)
        proc.send_signal(signal.SIGHUP)  # the main loop logs "not a valid tool": it blocks there
        deadline = time.monotonic() + 60
        while notify.during(1.0):  # pings sent before it got there
            assert time.monotonic() < deadline, "the pings went on"
        assert notify.during(2.0) == []
        assert proc.poll() is None
        reader.start()  # unblocked, the same loop goes on pinging
        notify.pings(3)
    finally:
        if reader.ident is None:  # failed before: a daemon blocked on its stderr cannot stop
            reader.start()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        os.close(write_end)
        reader.join(timeout=60)
        os.close(read_end)
        notify.close()
    assert b"adaptord: config reloaded" in drained


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into += chunk


def test_a_home_others_can_write_to_is_refused(tmp_path: Path) -> None:
    # A home made by hand (or by a script) with mode 0777 was served as it was: any local user
    # could drop a command-driver request and have it run as the daemon's user.
    home = tmp_path / "home"
    home.mkdir()
    serve = [sys.executable, "-m", "adaptord", "serve", "--home", str(home)]
    # Every folder of the layout counts, parents too: with approvals/ writable, another user
    # swapped responses/ for a folder of their own and approved a run.
    for path, mode in (
        (home, 0o777), (home, 0o770), (home / "spool" / "new", 0o733),
        (home / "approvals", 0o777), (home / "control", 0o777), (home / "runs", 0o775),
    ):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        refused = subprocess.run(serve, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert "refusing a home others can write to" in refused.stderr
        assert f"chmod go-w {path}" in refused.stderr
        assert not (home / "adaptord.lock").exists()  # nothing was served from it
        os.chmod(path, 0o700)
    # A folder of the layout that is a symbolic link: the daemon would write through it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (home / "runs").rmdir()
    (home / "runs").symlink_to(elsewhere)
    refused = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and f"{home / 'runs'} is a symbolic link" in refused.stderr
    (home / "runs").unlink()
    proc = DaemonProcess(home).start()  # private now: served
    assert proc.verdict(proc.submit(script({"text": "served"})))["result"]["text"] == "served"
    assert proc.stop() == 0
    assert list(elsewhere.iterdir()) == []


def test_a_home_on_a_filesystem_keeping_no_modes_is_refused_from_the_first_start(tmp_path: Path) -> None:
    # NTFS or exFAT with their defaults: the first start made the home's folders 0700, which
    # such a filesystem shows as 0777, and served them (another user's request dropped into
    # spool/new ran as the daemon's user); the next start refused it with advice (chmod go-w)
    # that changes nothing there.
    with exfat(tmp_path) as mounted:
        home = mounted / "home"
        for start in ("first", "second"):
            refused = subprocess.run(
                [sys.executable, "-m", "adaptord", "serve", "--home", str(home)],
                capture_output=True, text=True, timeout=60,
            )
            assert refused.returncode == 2, (start, refused.stderr)
            assert "refusing a home others can write to" in refused.stderr
            assert (
                f"{home} is writable by others (mode 777), and its filesystem keeps no file modes (a file "
                "made 0600 there shows 777): put the home on one that does (ext4, xfs, btrfs, tmpfs)"
            ) in refused.stderr, refused.stderr
            assert "ready" not in refused.stderr
            # (The folders it made there are gone again: the user puts the home elsewhere.)
            assert not home.exists(), sorted(home.rglob("*"))


@contextlib.contextmanager
def _spool_mounted_apart(tmp_path: Path) -> Iterator[Path]:
    """A home whose ``spool/`` is a filesystem of its own (a tmpfs mounted there)."""
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    with tmpfs(home.root / "spool", "size=8m,mode=0700"):
        home.ensure()  # spool/new and spool/tmp, on the new filesystem
        yield home.root


@pytest.mark.parametrize("where", ["a spool mounted apart", "exFAT"])
def test_a_home_whose_requests_cannot_be_linked_along_their_way_is_refused(tmp_path: Path, where: str) -> None:
    # A submitted request is linked into spool/new, and claimed by a link into claimed/: on a
    # filesystem without hard links (exFAT), or with spool/ mounted apart (EXDEV), the daemon
    # said "ready" and never took a request (each `adaptor submit` exit 70 with a bare
    # PermissionError; a request moved in by hand "queued" for ever).
    with (_spool_mounted_apart(tmp_path) if where != "exFAT" else exfat(tmp_path, "-o", "umask=077")) as mounted:
        home = mounted if where != "exFAT" else mounted / "home"
        refused = subprocess.run(
            [sys.executable, "-m", "adaptord", "serve", "--home", str(home)], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 69, refused.stderr
        said = refused.stderr.strip().splitlines()[-1]
        expected = (
            "Invalid cross-device link linking spool/new/ to claimed/" if where != "exFAT"
            else "Operation not permitted linking spool/tmp/ to spool/new/"
        )
        assert said.startswith(f"adaptord: cannot use the home home={home} error=\"{expected}: requests are hard-linked "
                               "along their way, so the home must be on one filesystem that has hard links\""), said
        assert "ready" not in refused.stderr
        assert not [path for path in home.rglob(".adaptord-link-probe*")]
        # A home made by this start goes again; one that was there stays as it was.
        assert home.exists() == (where != "exFAT")
        if where != "exFAT":
            assert (home / "claimed").is_dir() and (home / "adaptord.lock").exists()


def test_a_home_on_a_filesystem_without_chmod_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    # FAT through FUSE implements no chmod: the start said only error="Function not implemented"
    # (no operation, no file, no way out) and left a home's worth of empty folders behind.
    with fat(tmp_path) as mounted:
        home = mounted / "home"
        (mounted / "kept").mkdir()
        for named in (home, mounted / "kept"):
            refused = subprocess.run(
                [sys.executable, "-m", "adaptord", "serve", "--home", str(named)],
                capture_output=True, text=True, timeout=60,
            )
            assert refused.returncode == 69, refused.stderr
            assert refused.stderr.strip().splitlines()[-1] == (
                f'adaptord: cannot use the home home={named} error="taking its lock adaptord.lock: Function not '
                'implemented: its filesystem lacks what a home needs; put the home on ext4, xfs, btrfs or tmpfs"'
            ), refused.stderr
        assert not home.exists()
        assert list((mounted / "kept").iterdir()) == []  # emptied, and the user's own folder kept


def test_a_home_that_cannot_be_made_is_one_line_and_exit_69(tmp_path: Path) -> None:
    # A traceback and exit 1 (a "business failure", restarted by systemd every 2 s) before.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(blocker / "home")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 69 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("adaptord: cannot use the home")
    # The file itself named as the home: the same (click refused it with exit 2 before, which
    # a systemd unit restarts on forever).
    for env in ({}, {"ADAPTORD_HOME": str(blocker)}):
        args = [] if env else ["--home", str(blocker)]
        proc = subprocess.run(
            [sys.executable, "-m", "adaptord", "serve", *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )
        assert proc.returncode == 69, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("adaptord: cannot use the home")


def test_a_home_named_relative_to_a_directory_since_removed_keeps_serving(tmp_path: Path) -> None:
    # `--home ../home` was kept as START/../home: once START was removed the home looked gone,
    # and the daemon stopped with exit 70 (a restart under systemd) though the home was intact.
    start = tmp_path / "start"
    start.mkdir()
    daemon = DaemonProcess(tmp_path / "home", "--home", "../home", cwd=start).start()
    try:
        daemon.wait_for_line(f"adaptord: ready home={tmp_path / 'home'} ")
        start.rmdir()
        assert daemon.verdict(daemon.submit(script({"text": "still serving"})))["ok"]
    finally:
        assert daemon.stop() == 0, "\n".join(daemon.lines)


def test_a_home_whose_path_is_not_utf8_is_one_line_and_exit_69(tmp_path: Path) -> None:
    # It made the home, then failed writing adaptord.json: a traceback and exit 1 at every start.
    home = os.path.join(os.fsencode(tmp_path), b"lat\xe9home")
    proc = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", home], capture_output=True, timeout=60
    )
    assert proc.returncode == 69 and b"Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(b"adaptord: cannot use the home"), proc.stderr
    assert b'error="its path is not UTF-8"' in proc.stderr
    assert not os.path.exists(home)


def test_a_home_too_long_for_its_files_paths_is_one_line_and_exit_69(tmp_path: Path) -> None:
    # Near PATH_MAX, a request with a long id got no verdict (File name too long), was listed
    # as queued though it ran, and ran again at every start.
    home = tmp_path.joinpath(*["d" * 200] * 19)
    assert 3696 < len(os.fsencode(home)) < 4096
    proc = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(home)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 69 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("adaptord: cannot use the home"), proc.stderr
    assert f"its path is {len(os.fsencode(home))} bytes long; at most 3696" in proc.stderr
    assert not tmp_path.joinpath("d" * 200).exists()


def test_every_file_of_the_home_is_private(daemon: DaemonProcess) -> None:
    # daemon.md: created 0700, files 0600.  The daemon lock was 0644 (filelock's default).
    rid = daemon.submit(script({"text": "x"}, thread={"key": "private"}, config={"steps": [{"text": "x"}], "session": "auto"}))
    assert daemon.verdict(rid)["ok"]
    # Looked at while it runs (its status file is there), so a file listed may be gone before
    # it is looked at: the claimed copy removed after the verdict, a state's temporary file
    # renamed into place.
    exposed = []
    for path in [daemon.home.root, *daemon.home.root.rglob("*")]:
        try:
            mode = stat.S_IMODE(path.lstat().st_mode)
        except FileNotFoundError:
            continue
        if not path.is_symlink() and mode & 0o077:
            exposed.append((str(path.relative_to(daemon.home.root)), oct(mode)))
    assert exposed == []


def test_a_lock_file_an_earlier_build_made_0644_is_made_private(tmp_path: Path) -> None:
    # Builds before filelock was given a mode left adaptord.lock 0644, for good.
    first = DaemonProcess(tmp_path / "home").start()
    assert first.stop() == 0
    first.home.daemon_lock.chmod(0o644)
    again = DaemonProcess(tmp_path / "home").start()
    try:
        assert stat.S_IMODE(again.home.daemon_lock.stat().st_mode) == 0o600
    finally:
        assert again.stop() == 0


@pytest.mark.parametrize("limit", [6, 8, 15])
def test_a_start_short_of_descriptors_ends_69_never_a_traceback_nor_deaf(tmp_path: Path, limit: int) -> None:
    # Under `ulimit -n 6` the start-up ran out of descriptors listing the approvals: a
    # traceback and exit 1, which the systemd unit restarts for ever.  From 7 to 9 it said
    # "ready" and then never took a request: listing the spool found no descriptor left.
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "home")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, preexec_fn=low_limit,
    )
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 69, err
    assert f"adaptord: too few file descriptors limit={limit} needed=16" in err, err
    assert "ready" not in err and "Traceback" not in err, err


_SLOW_START = """
import builtins, sys, time
real_import = builtins.__import__

def slow_import(name, *args, **kwargs):
    if name == "adaptord.cli":  # the daemon's own imports, made slow enough to signal in
        print("importing", flush=True)
        time.sleep(1)
    return real_import(name, *args, **kwargs)

builtins.__import__ = slow_import
sys.argv = ["adaptord", "serve", "--home", sys.argv[1]]
from adaptord._entry import main
main()
"""


def test_signals_while_the_command_imports_the_daemon_are_acted_on_once_it_serves(tmp_path: Path) -> None:
    # A SIGHUP or SIGTERM in the first few hundred milliseconds (the imports) ended the
    # process without a word, exit 129 or 143: a supervisor reads that as a crash.
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_START, str(tmp_path / "home")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "importing\n"
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [line.split(" ", 2)[1] for line in err.splitlines()]
    assert lines.index("ready") < lines.index("draining") < lines.index("daemon.stopped"), err


def test_a_failure_of_several_lines_is_one_log_line_naming_the_config(tmp_path: Path) -> None:
    # A host tool module raising a message of several lines split the reload's fact over
    # several stderr lines (journald records each as its own, unprefixed entry), and the
    # fact did not say which file was at fault.
    config = tmp_path / "config.toml"
    config.write_text("workers = 2\n")
    (tmp_path / "multiline_tool_module.py").write_text("raise ValueError('first line\\nsecond line')\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), cwd=tmp_path).start()
    line = proc.reload(config, '[tools]\nx = "multiline_tool_module:tool"\n')
    assert line == (
        f'adaptord: config reload failed; keeping the old config error="{config}: tools.x: cannot load '
        "'multiline_tool_module:tool': ValueError: first line\\nsecond line\""
    )
    assert proc.stop() == 0
    assert all(line.startswith("adaptord: ") for line in proc.lines), proc.lines
    for command in (["serve", "--home", str(tmp_path / "other")], ["check"]):
        done = subprocess.run(
            [sys.executable, "-m", "adaptord", *command, "--config", str(config)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
        assert done.returncode == 2
        reported = [line for line in (done.stdout + done.stderr).splitlines() if "cannot load" in line]
        assert len(reported) == 1 and reported[0].endswith("ValueError: first line\\nsecond line"), done
        assert "second line" not in (done.stdout + done.stderr).replace(reported[0], "")


def test_sighup_reloads_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[drivers.script]\nsteps = [{text = "from config v1"}]\n')
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    first = proc.submit({"driver": "script", "prompt": "x"})
    assert proc.verdict(first)["result"]["text"] == "from config v1"
    config.write_text('[drivers.script]\nsteps = [{text = "from config v2"}]\n')
    proc.signal(signal.SIGHUP)
    proc.wait_for_line("config reloaded")
    second = proc.submit({"driver": "script", "prompt": "x"})
    assert proc.verdict(second)["result"]["text"] == "from config v2"
    config.write_text("workers = [broken")
    proc.signal(signal.SIGHUP)
    proc.wait_for_line("config reload failed")
    third = proc.submit({"driver": "script", "prompt": "x"})
    assert proc.verdict(third)["result"]["text"] == "from config v2"
    # A host tool whose module fails in its own code (a relative name, an error at import)
    # ended the daemon: only a missing module was kept out.
    (tmp_path / "broken_tool_module.py").write_text("raise RuntimeError('at import')\n")
    for target in (".relative:tool", "broken_tool_module:tool"):
        config.write_text(f'[tools]\nx = "{target}"\n[drivers.script]\nsteps = [{{text = "v3"}}]\n')
        proc.signal(signal.SIGHUP)
        line = proc.wait_for_line(f"cannot load '{target}'")
        assert "config reload failed; keeping the old config" in line
        served = proc.submit({"driver": "script", "prompt": "x"})
        assert proc.verdict(served)["result"]["text"] == "from config v2"
    # workers and grace take effect at the next start: a reload says so.
    config.write_text('workers = 2\n[drivers.script]\nsteps = [{text = "v4"}]\n')
    proc.signal(signal.SIGHUP)
    assert "config reloaded" in proc.wait_for_line("restart_needed_for=workers")
    assert proc.stop() == 0
    # Each reload is a lifecycle fact too (its line alone left no trace in the files).
    reader = sr.EventRecorder(sr.JSONLEventBackend(proc.home.events), key_validator=lambda k: None)
    reloads = [f for f in map(_fact, reader.since("adaptord")) if f["phase"].startswith("config.")]
    assert [f["phase"] for f in reloads] == ["config.reloaded", "config.reload_failed", "config.reload_failed",
                                            "config.reload_failed", "config.reloaded"], reloads
    assert reloads[0]["source"] == str(config) and "restart_needed_for" not in reloads[0]
    assert "cannot load 'broken_tool_module:tool'" in reloads[3]["error"]
    assert reloads[4]["restart_needed_for"] == "workers"
    check = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    config.write_text('[tools]\nx = "broken_tool_module:tool"\n')
    check = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert check.returncode == 2 and "RuntimeError: at import" in check.stderr + check.stdout
    assert "Traceback" not in check.stderr
    # A driver command the config names that is not there: every run of it would fail (69),
    # and check said "not found on PATH" of an absolute path, exit 0.
    config.write_text('[drivers.claude]\ncommand = "/no/such/claude"\n')
    check = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert check.returncode == 2, check.stdout
    assert "claude: /no/such/claude is not an executable file (drivers.claude.command" in check.stdout


def _wait_for_file(path: Path, proc: DaemonProcess) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared; daemon log:\n" + "\n".join(proc.lines))
        time.sleep(0.02)


def test_a_reload_importing_a_stuck_host_tool_leaves_the_daemon_serving(tmp_path: Path) -> None:
    # A reload imported the host tools in the main loop: a module whose import waited (on a
    # network share, a lock) held it, so no request was claimed, and a SIGTERM was not acted
    # on, until the import ended, if ever; systemd then killed the daemon mid-run.
    for name in ("stuck_tool_a", "stuck_tool_b"):
        (tmp_path / f"{name}.py").write_text(
            "import pathlib, time\n"
            f"pathlib.Path({str(tmp_path / name)!r} + '.importing').touch()\n"
            f"while not pathlib.Path({str(tmp_path / name)!r} + '.go').exists():\n"
            "    time.sleep(0.05)\n"
            "from adaptor import tool\n"
            "nothing = tool.define('nothing', 'does nothing', lambda value: '')\n"
        )
    config = tmp_path / "config.toml"
    config.write_text('[drivers.script]\nsteps = [{text = "v1"}]\n')
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), cwd=tmp_path).start()
    config.write_text('[tools]\nx = "stuck_tool_a:nothing"\n[drivers.script]\nsteps = [{text = "v2"}]\n')
    proc.signal(signal.SIGHUP)
    _wait_for_file(tmp_path / "stuck_tool_a.importing", proc)
    served = proc.submit({"driver": "script", "prompt": "x"})
    assert proc.verdict(served)["result"]["text"] == "v1"  # the old config, until the import ends
    proc.signal(signal.SIGHUP)  # during the import: read again once it is done
    (tmp_path / "stuck_tool_a.go").touch()
    proc.wait_for_line("config reloaded")
    after = proc.submit({"driver": "script", "prompt": "x"})
    assert proc.verdict(after)["result"]["text"] == "v2"
    assert sum("config reload" in line for line in proc.lines) <= 2
    # A stop during an import that never ends drains and exits as ever.
    config.write_text('[tools]\nx = "stuck_tool_b:nothing"\n')
    proc.signal(signal.SIGHUP)
    _wait_for_file(tmp_path / "stuck_tool_b.importing", proc)
    assert proc.stop() == 0
    assert "adaptord: daemon.stopped" in proc.lines


def test_a_reload_after_the_default_config_file_went_says_defaults_apply(tmp_path: Path) -> None:
    # It said "config reloaded" and nothing else while its tools and driver tables went.
    config = tmp_path / "xdg" / "adaptord" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[drivers.script]\nsteps = [{text = "from the file"}]\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    proc = DaemonProcess(tmp_path / "home", env=env).start()
    assert proc.verdict(proc.submit({"driver": "script", "prompt": "x"}))["result"]["text"] == "from the file"
    config.unlink()
    proc.signal(signal.SIGHUP)
    line = proc.wait_for_line("config reloaded")
    assert f"no_config_file={config}" in line, line
    kept = proc.reload(config, '[drivers.script]\nsteps = [{text = "back"}]\n')
    assert f"source={config}" in kept and "no_config_file" not in kept, kept
    assert proc.stop() == 0


def test_a_reload_says_what_waits_for_a_restart_by_what_is_in_effect(tmp_path: Path) -> None:
    # The reload compared the file with its previous text, not with what the daemon runs: a
    # second reload of workers = 8 said nothing though 4 workers still ran, and going back to
    # 4 asked for a restart that would change nothing.  A value the command line sets was
    # said to need a restart, which keeps the command line's.
    config = tmp_path / "config.toml"
    config.write_text("")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5").start()
    assert "restart_needed_for=workers " in proc.reload(config, "workers = 8\n") + " "
    assert "restart_needed_for=workers " in proc.reload(config, "workers = 8\nscan_interval = 1\n") + " "
    back = proc.reload(config, "workers = 4\n")
    assert back.startswith("adaptord: config reloaded") and "restart_needed_for" not in back, back
    kept = proc.reload(config, "grace = 7\n")
    assert "command_line_keeps=grace" in kept and "restart_needed_for" not in kept, kept
    assert proc.stop() == 0


def test_a_start_says_which_settings_of_the_file_the_command_line_overrides(tmp_path: Path) -> None:
    # The systemd unit starts `adaptord serve --grace 30`: a `grace = 120` in the config file
    # was silently without effect (running work was cancelled after 30 s at a stop), and only
    # a later reload said `command_line_keeps=grace`.
    config = tmp_path / "config.toml"
    config.write_text("grace = 120\nworkers = 2\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "30", "--workers", "2").start()
    started = proc.wait_for_line("daemon.started")
    assert started.endswith(" command_line_keeps=grace"), started
    assert proc.stop() == 0
    record = next(
        line["event"]["data"] for line in map(orjson.loads, (proc.home.events / "adaptord.jsonl").read_bytes().splitlines())
        if line["event"]["data"]["phase"] == "daemon.started"
    )
    assert record["command_line_keeps"] == "grace"
    # The same values, or no file: nothing is overridden, nothing said.
    config.write_text("grace = 30\n")
    for args in (("--config", str(config)), ()):
        again = DaemonProcess(tmp_path / "other", *args, "--grace", "30", "--workers", "2").start()
        assert "command_line_keeps" not in again.wait_for_line("daemon.started")
        assert again.stop() == 0


def test_a_reload_during_a_run_keeps_the_runs_own_secrets_redacted(tmp_path: Path) -> None:
    # The run's secrets were looked up again in the config at each later redaction: after a
    # reload that rotated a key in [drivers.x] env, the run's approval file showed the old key.
    old_key, new_key = "sk-old-0123456789abcdef", "sk-new-0123456789abcdef"
    config = tmp_path / "config.toml"
    config.write_text(f'[drivers.script]\nenv = {{TOKEN = "{old_key}"}}\n')
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    rid = proc.submit(script(
        {"approval": {"kind": "permission", "title": "first"}},
        {"approval": {"kind": "permission", "title": f"uses {old_key}"}},
        {"text": "done"},
        policy={"approvals": {"timeout": 60}},
    ))
    first = _pending_approval(proc)
    proc.reload(config, f'[drivers.script]\nenv = {{TOKEN = "{new_key}"}}\n')
    _home.respond(proc.home, first, "approve")
    deadline = time.monotonic() + 60
    while not (later := [p for p in proc.home.approvals_pending.glob("*.json") if p.stem != first]):
        assert time.monotonic() < deadline, "no second approval"
        time.sleep(0.02)
    pending = later[0].read_text()
    assert old_key not in pending and "uses <redacted>" in pending, pending
    _home.respond(proc.home, later[0].stem, "approve")
    assert proc.verdict(rid)["ok"]
    assert proc.stop() == 0


# A typo inside [skills] or [drivers.<name>] was accepted and the setting silently did nothing;
# an unknown driver name too.  Each is refused, naming the table, the key and the likely one.
MISSPELT_CONFIGS = [
    ('[drivers.claude]\nmodle = "opus"\n', ["[drivers.claude]", "'modle'", "did you mean 'model'?"]),
    ('[drivers.script]\nstep = [{text = "x"}]\n', ["[drivers.script]", "'step'", "did you mean 'steps'?"]),
    ('[drivers.claud]\ncommand = "claude"\n', ["[drivers.claud]", "unknown driver", "did you mean 'claude'?"]),
    ('[drivers.nothing]\ncommand = "x"\n', ["[drivers.nothing]", "unknown driver", "known: claude, codex"]),
    ('[skills]\ndir = ["/srv/skills"]\n', ["[skills]", "'dir'", "did you mean 'dirs'?"]),
    # An A2A agent's request template: its driver config was only checked when a task ran.
    (
        '[a2a.agents.r.request]\ndriver = "claude"\n[a2a.agents.r.request.config]\nmodle = "opus"\n',
        ["a2a.agents.r.request.config", "'modle'", "did you mean 'model'?"],
    ),
    # No request can select it: it was accepted, and said nothing.
    ('[tools]\n"" = "tests.host_tools:add"\n', ["[tools] has an empty name"]),
    # A key set twice: tomllib says only where the second value ends (a multi-line one here).
    (
        '[drivers.claude]\ncommand = "claude"\nmodel = "opus"\ncommand = """\nx = y\n"""\n',
        ["Cannot overwrite a value (at line 6, column 4), setting command: that key, or a table "
         "holding it, is defined twice"],
    ),
]


@pytest.mark.parametrize(
    "text,expected", MISSPELT_CONFIGS,
    ids=["claude", "script", "driver", "no-driver", "skills", "a2a-template", "empty-tool-name", "set-twice"],
)
def test_a_misspelt_config_key_or_driver_is_refused(tmp_path: Path, text: str, expected: list[str]) -> None:
    reported, check, serve = _refused_by_check_and_serve(tmp_path, text)
    assert all(fragment in reported for fragment in expected), reported
    assert all(fragment in serve.stderr for fragment in expected), serve.stderr


def _adaptord_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(
    ("command", "expected"),
    [(["check", "--config", "{dir}/refused.toml"], 2), (["check", "--config", "{dir}/fine.toml"], 0),
     (["status", "--home", "{dir}/home"], 69)],
)
def test_a_verdict_stays_the_exit_status_when_the_reader_is_gone(
    tmp_path: Path, command: list[str], expected: int
) -> None:
    # `adaptord check | head -1` of a refused config exited 0: a reader gone ended it "quietly
    # with 0" at its next write, before its verdict (and before that, click's own handling of
    # the closed pipe exited 1).  Here the reader is gone before anything is written, so the
    # first write meets it.
    (tmp_path / "refused.toml").write_text("wrokers = 2\n")
    (tmp_path / "fine.toml").write_text("workers = 2\n")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "adaptord", *(part.format(dir=tmp_path) for part in command)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (expected, "")


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # Refused as "Invalid statement (at line 1, column 1)", where request files may carry one.
    from adaptord import config as config_module

    config = tmp_path / "config.toml"
    config.write_bytes(codecs.BOM_UTF8 + b"workers = 3\n[drivers.script]\nsteps = [{text = 'hi'}]\n")
    assert config_module.load(config, required=True).workers == 3
    check = _adaptord_check(config)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_config_file_that_never_ends_is_refused_not_read_for_ever() -> None:
    # `adaptord check --config /dev/zero` read until memory ran out.
    from adaptord import config as config_module

    with pytest.raises(config_module.ConfigError, match="larger than 1048576 bytes"):
        config_module.load("/dev/zero", required=True)


def _refused_by_check_and_serve(
    tmp_path: Path, text: str
) -> tuple[str, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """``adaptord check`` and ``adaptord serve`` of a config file holding ``text``, both of which
    must refuse it (exit 2, no traceback): check's ``config:`` line and both processes."""
    config = tmp_path / "config.toml"
    config.write_text(text)
    check = _adaptord_check(config)
    assert check.returncode == 2, check.stdout + check.stderr
    (reported,) = [line for line in check.stdout.splitlines() if line.startswith("config:")]
    serve = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "home"), "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert serve.returncode == 2 and "Traceback" not in serve.stderr, serve.stderr
    return reported, check, serve


def test_a_driver_config_its_descriptor_refuses_is_the_same_error_as_in_process(daemon: DaemonProcess) -> None:
    # Through the daemon the descriptor was first built outside the run's checks: exit 70
    # "external ValueError" instead of the InvalidDriverConfigError (exit 3) a program gets.
    config = {"steps": [{"text": "x"}], "descriptor": {"sessions": {"bogus": 1}}}
    with pytest.raises(adaptor.InvalidDriverConfigError):
        adaptor.Agent(requests.make_driver("script", config)).run("x")
    verdict = daemon.verdict(daemon.submit({"driver": "script", "prompt": "x", "config": config}))
    assert verdict["error"]["code"] == "ErrInvalidDriverConfig" and verdict["exit_code"] == 3


def test_check_stages_each_catalogue_skill_and_fails_on_one_that_cannot_be(tmp_path: Path) -> None:
    # It only counted folders: one without a SKILL.md was "a skill" that every request
    # selecting it would fail on (exit 3).
    catalogue = tmp_path / "skills"
    (catalogue / "lint").mkdir(parents=True)
    (catalogue / "lint" / "SKILL.md").write_text("# lint\n")
    (catalogue / "notes").mkdir()
    (catalogue / "notes" / "README").write_text("no SKILL.md here\n")
    (catalogue / ".git").mkdir()  # hidden: not a skill at all
    config = tmp_path / "config.toml"
    config.write_text(f'[skills]\ndirs = ["{catalogue}"]\n')
    check = _adaptord_check(config)
    assert check.returncode == 2, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert f"skills: {catalogue} (2 skill(s), 1 of them cannot be staged)" in lines
    assert f"skills: {catalogue / 'notes'}: cannot be staged: the skill has no SKILL.md at its top level" in lines
    assert not any(".git" in line for line in lines)
    (catalogue / "notes" / "SKILL.md").write_text("# notes\n")
    again = _adaptord_check(config)
    assert again.returncode == 0 and f"skills: {catalogue} (2 skill(s))" in again.stdout.splitlines()


def test_skill_catalogue_directories_serve_requests_naming_a_key(tmp_path: Path) -> None:
    # [skills] dirs was parsed and then never used: every {"key": ...} skill was not found.
    catalogue, missing = tmp_path / "skills", tmp_path / "no-such-folder"
    for name in ("lint", "notes"):
        (catalogue / name).mkdir(parents=True)
        (catalogue / name / "SKILL.md").write_text(f"# {name}\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "SKILL.md").write_text("# not in the catalogue\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[skills]\ndirs = ["{catalogue}", "{missing}"]\n')
    check = _adaptord_check(config)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"skills: {catalogue} (2 skill(s))" in check.stdout.splitlines()
    assert f"skills: {missing} (missing: offers nothing)" in check.stdout.splitlines()
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    rid = proc.submit(script({"text": "staged"}, skills=[{"key": "notes"}, {"key": "lint"}]))
    verdict = proc.verdict(rid)
    assert verdict["ok"] is True, verdict["error"]
    records = sr.EventRecorder(sr.JSONLEventBackend(proc.home.events)).since(rid)
    spawns = [r.event for r in records if isinstance(r.event, events.ProcessInfo) and r.event.kind == "spawn"]
    assert spawns[0].data["skills"] == ["lint", "notes"]
    # A key is a folder name in the catalogue, never a path out of it.
    for key in ("../outside", "absent"):
        refused = proc.verdict(proc.submit(script({"text": "x"}, skills=[{"key": key}])))
        assert refused["error"]["code"] == "ErrSkillNotFound", refused["error"]
    assert proc.stop() == 0


@pytest.mark.parametrize(
    ("text", "why"),
    [('[skills]\ndirs = ["skills"]\n', "must be absolute"), ("skills = 5\n", r"\[skills\] must be a table")],
)
def test_skill_catalogue_settings_that_cannot_work_are_refused(tmp_path: Path, text: str, why: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    with pytest.raises(config_module.ConfigError, match=why):
        config_module.load(config, required=True)


# A [drivers.<name>] value of the wrong type or out of range was accepted by `adaptord check`,
# `serve` and a reload; then every run using the table failed with ErrInvalidDriverConfig.
BAD_DRIVER_VALUES = [
    (f'[drivers.claude]\nenv = {{API_KEY = "{SECRET}", DEBUG = 1}}\n', "env: the value of DEBUG must be a string"),
    (f'[drivers.claude]\ncommand = 5\nenv = {{API_KEY = "{SECRET}"}}\n', "command: expected a non-empty string"),
    ('[drivers.codex]\ngrace_period = -1.0\n', "grace_period: expected a number of seconds from 0 to 300"),
    ('[drivers.script]\nsteps = [{txet = "x"}]\n', "steps[0]: unknown step 'txet'"),
    (f'[drivers.command]\nextra_args = "-c"\nenv = {{T = "{SECRET}"}}\n', "extra_args: expected a list of strings"),
    # Accepted, and every run without a workspace went to the daemon's own directory.
    ('[drivers.command]\ncwd = "rel/dir"\n', "cwd must be an absolute path"),
    # Accepted; then every run failed: "working directory ... holds a NUL character".
    ('[drivers.script]\ncwd = "/tmp\\u0000x"\n', "cwd holds a NUL character"),
]


@pytest.mark.parametrize(
    "text,why", BAD_DRIVER_VALUES, ids=["env", "command", "grace", "steps", "args", "cwd", "cwd-nul"]
)
def test_a_driver_table_value_the_driver_refuses_is_refused_at_load(tmp_path: Path, text: str, why: str) -> None:
    reported, check, serve = _refused_by_check_and_serve(tmp_path, text)
    table = text.splitlines()[0]
    assert table in reported and why in reported, reported
    assert SECRET not in check.stdout + check.stderr
    assert why in serve.stderr and SECRET not in serve.stderr, serve.stderr


def test_a_default_config_that_is_a_fifo_is_refused_by_a_run_without_the_daemon(tmp_path: Path) -> None:
    # `adaptor run --no-daemon` opened it and waited for a writer for ever; serve refuses it.
    (tmp_path / "adaptord").mkdir()
    os.mkfifo(tmp_path / "adaptord" / "config.toml")
    ran = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "script", "go"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert ran.returncode == 2 and "config.toml: not a regular file" in ran.stderr, ran.stderr
    # Its reason is the run's, not serve's reload (which this run has nothing to do with).
    assert "takes its driver tables from it" in ran.stderr and "reload" not in ran.stderr, ran.stderr
    # So does `adaptord check` of the default file (a pipe it reads only when named).
    checked = subprocess.run(["adaptord", "check"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert checked.returncode == 2 and "config.toml: not a regular file" in checked.stdout, checked.stdout


@pytest.mark.parametrize(("mode", "who"), [(0o666, "others"), (0o664, "its group")])
def test_a_config_others_can_write_is_refused_by_check_and_serve(tmp_path: Path, mode: int, who: str) -> None:
    # It names the commands the daemon runs: served without a word, whoever could write it
    # had the daemon run their program as its user (a home like that is refused).
    config = tmp_path / "config.toml"
    config.write_text("workers = 2\n")
    config.chmod(mode)
    reported, _, serve = _refused_by_check_and_serve(tmp_path, "workers = 2\n")
    said = f"config.toml: writable by {who} (mode {mode:o})"
    assert said in reported and said in serve.stderr, (reported, serve.stderr)
    config.chmod(0o644)
    assert _adaptord_check(config).stdout.startswith("config: ok")


def test_the_advice_for_a_config_others_can_write_names_the_file_itself(tmp_path: Path) -> None:
    # `check --config /dev/stdin < config.toml` advised `chmod go-w /dev/stdin`, which in the
    # user's shell changes their terminal.
    config = tmp_path / "my configs" / "config.toml"
    config.parent.mkdir()
    config.write_text("workers = 2\n")
    config.chmod(0o664)
    with config.open("rb") as stdin:
        check = subprocess.run([sys.executable, "-m", "adaptord", "check", "--config", "/dev/stdin"],
                               stdin=stdin, capture_output=True, text=True, timeout=60)
    assert check.returncode == 2
    assert f"make it private: chmod go-w '{config}'" in check.stdout, check.stdout


def test_a_config_others_can_read_that_holds_secrets_is_served_with_a_warning(tmp_path: Path) -> None:
    # An API key in [drivers.*] env or the A2A bridge's token in a mode 644 file was served
    # without a word: anyone on the machine could read them.  Served still (refusing would
    # stop yesterday's daemon at its next start), said by check, at the start and at reloads.
    config = tmp_path / "config.toml"
    key = "sk-ant-" + "k3y" * 8
    config.write_text(f'[drivers.claude]\nenv = {{ANTHROPIC_API_KEY = "{key}"}}\n')
    config.chmod(0o644)
    check = _adaptord_check(config)
    warning = (f"warning: {config}: readable by others (mode 644) and holds secrets (drivers.claude.env); "
               f"make it private: chmod go-rwx {config}")
    assert warning in check.stdout.splitlines() and check.returncode == 0, check.stdout
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        said = proc.wait_for_line("the config's secrets are not private")
        assert "readable by others (mode 644)" in said and key not in said, said
        # A token of the bridge's own counts too, and the group is named when only it may read.
        config.chmod(0o640)
        proc.reload(config, f'[a2a]\nbearer_token = "{key}"\n')
        said = proc.wait_for_line("readable by its group (mode 640) and holds secrets (a2a.bearer_token)")
        assert key not in said, said
        config.chmod(0o600)
        before = len(proc.lines)
        proc.reload(config, f'[drivers.claude]\nenv = {{ANTHROPIC_API_KEY = "{key}"}}\n')
        assert not any("not private" in line for line in proc.lines[before:]), proc.lines[before:]
    finally:
        assert proc.stop() == 0
    assert key not in "\n".join(proc.lines)
    # Nothing secret in a file others may read (DEBUG=1 is no secret): no warning.
    config.write_text('[drivers.claude]\nenv = {DEBUG = "1"}\n')
    config.chmod(0o644)
    assert "warning" not in _adaptord_check(config).stdout
    # `adaptor run --no-daemon` takes its driver tables from the default file: it says so too.
    (tmp_path / "adaptord").mkdir()
    default = tmp_path / "adaptord" / "config.toml"
    default.write_text(f'[drivers.claude]\nenv = {{ANTHROPIC_API_KEY = "{key}"}}\n')
    default.chmod(0o604)
    ran = subprocess.run(
        [sys.executable, "-m", "adaptor", "run", "--no-daemon", "--driver", "script", "go"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert ran.returncode == 0, ran.stderr
    assert f"adaptor: warning: {default}: readable by others (mode 604)" in ran.stderr and key not in ran.stderr


def test_a_config_nested_too_deeply_to_read_is_refused_by_check_and_serve(tmp_path: Path) -> None:
    # A RecursionError traceback and exit 1, which systemd's unit restarted every 2 s.
    reported, _, serve = _refused_by_check_and_serve(tmp_path, "x = " + "[" * 600 + "]" * 600 + "\n")
    assert reported.endswith("config.toml: nested too deeply to read"), reported
    assert "nested too deeply to read" in serve.stderr


def test_a_config_that_is_no_regular_file_is_refused_by_serve_and_its_reloads(tmp_path: Path) -> None:
    # A FIFO held `serve` before it served (SIGTERM deferred until then: only SIGKILL ended
    # it) and, at a reload, the reload thread for good: every later SIGHUP went unheard.  A
    # pipe (<(cat config.toml)) read empty at a reload: the built-in defaults, said as
    # "config reloaded".  `check` still reads a pipe once.
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    serve = subprocess.run(
        [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "home"), "--config", str(fifo)],
        capture_output=True, text=True, timeout=60,
    )
    assert serve.returncode == 2 and f"{fifo}: not a regular file" in serve.stderr, serve.stderr
    piped = subprocess.run(["adaptord", "check", "--config", "/dev/stdin"], input="workers = 2\n",
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and piped.stdout.startswith("config: ok (/dev/stdin)"), piped.stdout
    config = tmp_path / "config.toml"
    config.write_text("workers = 2\n")
    proc = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        config.unlink()
        os.mkfifo(config)
        proc.signal(signal.SIGHUP)
        failed = proc.wait_for_line("config reload failed")
        assert "not a regular file" in failed, failed
        config.unlink()
        assert proc.reload(config, "workers = 2\n[drivers.script]\nsession = \"auto\"\n").startswith(
            "adaptord: config reloaded"
        )  # the reload thread was not held: a later SIGHUP is heard
    finally:
        assert proc.stop() == 0


def test_check_looks_at_the_command_drivers_configured_command_without_running_it(tmp_path: Path) -> None:
    # `[drivers.command] command` was never looked at: "config: ok" for a path not there.
    config = tmp_path / "config.toml"
    for command, fine in (("/nonexistent/bin/agent", False), ("/etc/passwd", False), ("/bin/true", True)):
        config.write_text(f'[drivers.command]\ncommand = "{command}"\n')
        check = _adaptord_check(config)
        assert check.returncode == (0 if fine else 2), check.stdout
        line = next(line for line in check.stdout.splitlines() if line.startswith("command: "))
        assert line == ("command: /bin/true" if fine else f"command: {command} is not an executable file "
                        "(drivers.command.command: every command run would fail)"), line
    config.write_text("workers = 2\n")
    assert not any(line.startswith("command") for line in _adaptord_check(config).stdout.splitlines())


def test_check_of_a_config_whose_tools_do_not_load_still_checks_its_drivers_and_skills(tmp_path: Path) -> None:
    # The tools' import error replaced the whole config with the defaults: the configured
    # claude command was reported as "claude not found on PATH" and the skills not at all.
    skills = tmp_path / "skills"
    (skills / "lint").mkdir(parents=True)
    (skills / "lint" / "SKILL.md").write_text("# lint\n")
    config = tmp_path / "config.toml"
    config.write_text(
        f'[tools]\nsearch = "no_such_module_here:search"\n[drivers.claude]\ncommand = "{tmp_path}/claude"\n'
        f'[skills]\ndirs = ["{skills}"]\n'
    )
    check = _adaptord_check(config)
    assert check.returncode == 2, check.stdout
    lines = check.stdout.splitlines()
    assert lines[0].startswith("config: ") and "no_such_module_here" in lines[0], lines
    assert f"claude: {tmp_path}/claude is not an executable file (drivers.claude.command: every claude run would fail)" in lines
    assert f"skills: {skills} (1 skill(s))" in lines


def test_a_driver_table_is_refused_with_the_error_a_run_of_it_fails_with(tmp_path: Path) -> None:
    # The daemon's preflight restated the run's driver check and named the driver by its
    # table ('script') where the run names it by its descriptor's type, as the verdict shows.
    config = tmp_path / "config.toml"
    config.write_text('[drivers.script]\ngrace_period = -1.0\ndescriptor = {type = "custom-agent"}\n')
    with pytest.raises(config_module.ConfigError) as refused:
        config_module.load(config, required=True)
    driver = script_driver.Driver(script_driver.Config(grace_period=-1.0, descriptor={"type": "custom-agent"}))
    with pytest.raises(errors.AdaptorError) as failed:
        adaptor.Agent(driver).run("probe")
    assert str(failed.value).startswith("invalid configuration for driver 'custom-agent'")
    assert str(failed.value) in str(refused.value), (str(failed.value), str(refused.value))


def test_a_driver_table_may_leave_a_required_field_to_each_request(tmp_path: Path) -> None:
    # The command driver has no default command: a table giving only env is complete per request.
    config = tmp_path / "config.toml"
    config.write_text('[drivers.command]\nenv = {GREETING = "hi"}\n')
    assert config_module.load(config, required=True).drivers["command"] == {"env": {"GREETING": "hi"}}


def test_a_misspelt_key_on_reload_keeps_the_old_config(tmp_path: Path) -> None:
    proc = _reloaded(tmp_path, '[drivers.script]\nsteps = [{text = "v1"}]\n', '[drivers.script]\nstpes = [{text = "v2"}]\n')
    line = proc.wait_for_line("config reload failed")
    assert "'stpes' (did you mean 'steps'?)" in line
    assert proc.verdict(proc.submit({"driver": "script", "prompt": "x"}))["result"]["text"] == "v1"
    assert proc.stop() == 0


def test_a_bad_a2a_template_on_reload_keeps_the_old_config(tmp_path: Path) -> None:
    proc = _reloaded(
        tmp_path,
        '[drivers.script]\nsteps = [{text = "v1"}]\n',
        '[drivers.script]\nsteps = [{text = "v2"}]\n'
        '[a2a.agents.r.request]\ndriver = "script"\npolicy = { sandbox = "readonly" }\n',
    )
    line = proc.wait_for_line("config reload failed")
    assert "a2a.agents.r.request (over [drivers.script]): invalid policy value for Policy.Sandbox" in line
    assert proc.verdict(proc.submit({"driver": "script", "prompt": "x"}))["result"]["text"] == "v1"
    assert proc.stop() == 0


def test_every_driver_config_field_is_accepted_in_the_config_file(tmp_path: Path) -> None:
    # The accepted keys are each driver's Config fields, the keys a request's "config" takes
    # (each with a value of its type: the values are checked too).
    values = {
        "env": "{}", "extra_args": "[]", "steps": "[]", "descriptor": "{}", "grace_period": "1",
        "idle_timeout": "60", "max_turns": "3", "session": '"auto"', "cwd": '"/tmp"',
        "config_dir": '"/tmp"', "home": '"/tmp"', "command": '"x"',
    }
    tables = []
    for name in DRIVER_NAMES:
        fields = dataclasses.fields(importlib.import_module(f"adaptor.drivers.{name}").Config)
        tables.append(f"[drivers.{name}]\n" + "".join(f'{f.name} = {values.get(f.name, chr(34) * 2)}\n' for f in fields))
    config = tmp_path / "config.toml"
    config.write_text("".join(tables))
    loaded = config_module.load(config, required=True)
    assert sorted(loaded.drivers) == sorted(DRIVER_NAMES)


def test_the_documented_example_configs_load(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    for doc in ("docs/daemon.md", "adaptord/config.py"):
        (block,) = re.findall(r"```toml\n(.*?)```", (root / doc).read_text(), re.S)
        config = tmp_path / "config.toml"
        config.write_text(block)
        assert config_module.load(config, required=True).source == str(config), doc


@pytest.mark.parametrize("grace", ["nan", "inf", "1e12"])
def test_a_grace_the_drain_cannot_keep_is_refused(tmp_path: Path, grace: str) -> None:
    # --grace inf or 1e12 crashed the drain at SIGTERM (OverflowError, no verdicts); nan made
    # a stop wait for the running work however long it took.
    serve = [sys.executable, "-m", "adaptord", "serve", "--home", str(tmp_path / "home")]
    refused = subprocess.run([*serve, "--grace", grace], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--grace" in refused.stderr
    config = tmp_path / "config.toml"
    config.write_text(f"grace = {grace}\n")
    refused = subprocess.run([*serve, "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "grace must be" in refused.stderr


# -- what each crash point leaves behind ------------------------------------------------------
#
# The daemon fsyncs the claim before anything else happens to a request, the attempt's state
# once its driver started, and the run files before the verdict; everything else is written
# without waiting for the disk.  These tests build the files a kill -9 at each step leaves and
# check the restarted daemon gives exactly one verdict, running the request at most once more.


def _lifecycle(home: _home.Home, rid: str) -> list[str]:
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    return [
        _fact(r)["phase"] for r in recorder.since("adaptord") if _fact(r).get("request_id") == rid
    ]


def _claimed_only(home: _home.Home, rid: str, request: dict[str, Any]) -> None:
    home.ensure()
    (home.claimed / f"{rid}.json").write_bytes(orjson.dumps({**request, "id": rid}))


def test_crash_after_the_claim_runs_the_request_once(tmp_path: Path) -> None:
    """Killed right after the claim was synced: no state, no run folder; it simply runs."""
    home = _home.Home.at(tmp_path / "home")
    _claimed_only(home, "claimed-only", script({"text": "ran"}))
    claimed_at = datetime.fromtimestamp(os.lstat(home.claimed / "claimed-only.json").st_ctime, UTC)
    proc = DaemonProcess(home.root).start()
    verdict = proc.verdict("claimed-only")
    assert verdict["ok"] and verdict["result"]["text"] == "ran"
    # One line for all of them (a crash may leave thousands), each with its request.queued fact.
    proc.wait_for_line("adaptord: recovered queued requests count=1")
    assert verdict["received_at"] == events.format_time(claimed_at)  # the claim's time, not the restart's
    proc.wait_for_line("verdict.written id=claimed-only")
    assert _lifecycle(home, "claimed-only").count("request.started") == 1
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    received = [_fact(r) for r in recorder.since("adaptord") if _fact(r)["phase"] == "request.received"]
    assert [f.get("recovered") for f in received] == [True]  # received before the crash
    assert proc.stop() == 0
    assert list(home.claimed.iterdir()) == []


def test_crash_between_claim_and_spool_unlink_runs_once(tmp_path: Path) -> None:
    """Both names left (claimed, not yet removed from the spool): one run, and the spool name
    removed without a word.  It was quarantined as "a request with this id was already
    received": after a kill -9 during a backlog, dozens of duplicates nobody submitted."""
    home = _home.Home.at(tmp_path / "home")
    _claimed_only(home, "twin", script({"text": "once"}))
    os.link(home.claimed / "twin.json", home.spool_new / "twin.json")
    proc = DaemonProcess(home.root).start()
    assert proc.verdict("twin")["ok"]
    proc.wait_for_line("verdict.written id=twin")
    assert _lifecycle(home, "twin").count("request.started") == 1
    assert proc.stop() == 0
    assert [p.name for p in home.verdicts.iterdir()] == ["twin.json"]
    assert list(home.spool_new.iterdir()) == []
    assert list(home.quarantine.iterdir()) == []
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    assert not [f for f in map(_fact, recorder.since("adaptord")) if f["phase"] == "request.quarantined"]


def test_crash_after_the_start_sync_is_an_interrupted_run(tmp_path: Path) -> None:
    """The started attempt's state is what recovery reads: a run id means the driver ran."""
    home = _home.Home.at(tmp_path / "home")
    _claimed_only(home, "started", script({"text": "x"}))
    run_dir = home.run_dir("started")
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_bytes(orjson.dumps({
        "id": "started", "status": "running", "attempt": 1, "run_ids": ["run_0123456789abcdef"],
        "run_id": "run_0123456789abcdef", "on_interrupt": "fail", "received_at": "2026-12-02T10:00:00.000000Z",
    }))
    proc = DaemonProcess(home.root).start()
    verdict = proc.verdict("started")
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunError and err.reason == "infrastructure_error" and err.details["interrupted"]
    assert verdict["run_id"] == "run_0123456789abcdef"
    assert verdict["received_at"] == "2026-12-02T10:00:00.000000Z"
    assert _lifecycle(home, "started").count("request.started") == 0  # not run again
    assert proc.stop() == 0


@pytest.mark.parametrize("state_says", [_home.FINISHED, "running"])
def test_a_finished_run_whose_verdict_was_never_written_is_not_called_in_progress(tmp_path: Path, state_says: str) -> None:
    """Stopped while the run's verdict was deferred (a full disk): the run had finished, its
    state says finished.  (A state of "done" is written only once the verdict is: beside a
    claimed request without one, it is an earlier request's of the same id, whose verdict was
    removed by hand; see test_an_id_submitted_again_after_its_verdict_was_removed_...)  Its
    verdict said "stopped while the run was in progress" and its log got
    a second run.finished.  Killed (kill -9) between the run's end in its log and its verdict,
    its state still says running: the same, and a requeue request was run again."""
    home = _home.Home.at(tmp_path / "home")
    first = DaemonProcess(home.root).start()
    # on_interrupt requeue is for runs cut short: this one ran to its end, and running it
    # again would repeat all it did.
    rid = first.submit({**script({"text": "the answer"}), "on_interrupt": "requeue"})
    run_id = first.verdict(rid)["run_id"]
    assert first.stop() == 0
    # What the stop leaves: the claim and a state of "finished", but no verdict.
    request = orjson.loads((home.run_dir(rid) / "request.json").read_bytes())
    home.verdict(rid).unlink()
    (home.claimed / f"{rid}.json").write_bytes(orjson.dumps(request))
    state = orjson.loads(home.run_state(rid).read_bytes())
    assert state["status"] == "done"
    home.run_state(rid).write_bytes(orjson.dumps({**state, "status": state_says}))

    # A kill -9 mid-write leaves its temporary file (a redacted request copy): it stayed for good.
    half_written = home.run_dir(rid) / "request.json.tmp-0123456789abcdef"
    half_written.write_bytes(b'{"prompt": "half')
    proc = DaemonProcess(home.root).start()
    verdict = proc.verdict(rid)
    assert not half_written.exists()
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunError and err.reason == "infrastructure_error"
    assert err.details["interrupted"] and err.details["finished"]
    # Said for what happened: a deferred verdict (the state says finished) was refused by the
    # disk; a kill left no trace but the run's end in its log (it was said refused too).
    if state_says == _home.FINISHED:
        assert "the daemon stopped before its verdict could be written (the disk" in str(err)
    else:
        assert "the daemon stopped (it was killed, or crashed) before it wrote" in str(err)
        assert "refused" not in str(err)
    assert verdict["run_id"] == run_id and verdict["result"]["text"] == "the answer"
    assert _lifecycle(home, rid).count("request.started") == 1  # the first daemon's only
    assert proc.stop() == 0
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda k: None)
    finished = [r.event for r in recorder.since(rid) if isinstance(r.event, events.RunFinished)]
    assert [(e.run_id, e.failed) for e in finished] == [(run_id, False)]


def test_a_run_whose_verdict_is_deferred_shows_as_finished_and_is_never_run_again(tmp_path: Path) -> None:
    """What a first deferral leaves (the run's state says finished; the verdict is refused):
    `adaptor status` listed the request as running, and a restart could run it again."""
    home = _home.Home.at(tmp_path / "home")
    proc = DaemonProcess(home.root).start()
    rid = "deferred-1"
    (home.claimed / f"{rid}.json").write_bytes(
        orjson.dumps({**script({"text": "done once"}), "id": rid, "on_interrupt": "requeue"})
    )
    home.run_dir(rid).mkdir(parents=True)
    home.run_state(rid).write_bytes(orjson.dumps({
        "id": rid, "status": "finished", "attempt": 1, "run_ids": ["run_0123456789abcdef"],
        "run_id": "run_0123456789abcdef", "on_interrupt": "requeue", "entered": True,
        "received_at": "2026-12-02T10:00:00.000000Z",
    }))
    shown = subprocess.run(["adaptor", "status", "--home", str(home.root), "--json"], capture_output=True, text=True)
    info = orjson.loads(shown.stdout)["result"]
    assert info["in_progress"] == [rid] and info["verdict_deferred"] == [rid]
    text = subprocess.run(["adaptor", "status", "--home", str(home.root)], capture_output=True, text=True)
    assert f"  finished {rid}  (verdict deferred)" in text.stdout, text.stdout
    assert proc.stop() == 0

    again = DaemonProcess(home.root).start()
    verdict = again.verdict(rid)
    assert verdict["error"]["details"]["finished"] is True, verdict
    assert _lifecycle(home, rid).count("request.started") == 0  # requeue or not: never again
    assert again.stop() == 0


def _thread_mark(home: _home.Home, key: str) -> dict[str, Any]:
    from adaptor.threadstore import JSONLStore, Query

    with JSONLStore(home.threads) as store:
        record = store.resolve(Query(key=key))
    return {"id": None} if record is None else {"id": record.id, "updated_at": record.updated_at.isoformat()}


def _started_turn(
    home: _home.Home, rid: str, key: str, thread_before: dict[str, Any], *, entered: bool = True
) -> None:
    """What a kill -9 during a thread turn leaves: the claim and the started attempt's state
    (``entered``: the SDK had admitted the run, so its agent may have had the prompt)."""
    turn = script({"text": f"{rid} ran"}, thread={"key": key}, on_interrupt="requeue")
    turn["config"]["session"] = "auto"
    _claimed_only(home, rid, turn)
    home.run_dir(rid).mkdir(parents=True)
    state: dict[str, Any] = {
        "id": rid, "status": "running", "attempt": 1, "on_interrupt": "requeue",
        "received_at": "2026-12-02T10:00:00.000000Z", "session": _home.session_for_thread(key),
        "thread_before": thread_before,
    }
    if entered:
        state |= {"run_ids": [f"run_{rid}"], "run_id": f"run_{rid}", "entered": True}
    home.run_state(rid).write_bytes(orjson.dumps(state))


def test_crash_after_a_thread_turn_was_saved_does_not_run_it_again(tmp_path: Path) -> None:
    """Killed after the turn's save to its thread, before its verdict: requeued, the turn ran
    again and its prompt went into the conversation twice."""
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    before = _thread_mark(home, "conversation")
    # The interrupted turn's save, as it reached the store before the crash.
    from adaptor.drivers import script as script_driver
    from adaptor.threadstore import JSONLStore

    agent = adaptor.Agent(
        script_driver.Driver(script_driver.Config(steps=({"text": "saved"},), session="auto")),
        thread_store=JSONLStore(home.threads),
    )
    agent.thread("conversation").run("the turn")
    agent.close()
    _started_turn(home, "saved-turn", "conversation", before)
    # Not saved, but its agent may have had the prompt: a CLI keeps the conversation itself
    # (claude's session file), so a second attempt resuming it sent the prompt in twice.
    _started_turn(home, "unsaved-turn", "other", _thread_mark(home, "other"))
    # A turn the daemon lost before the SDK admitted it never reached an agent: run again.
    _started_turn(home, "unadmitted-turn", "third", _thread_mark(home, "third"), entered=False)
    proc = DaemonProcess(home.root).start()
    verdict = proc.verdict("saved-turn")
    err = errors.from_wire(verdict["error"])
    assert type(err) is errors.RunError and err.details["interrupted"] is True
    assert err.details["thread_changed"] is True and "not run again" in str(err)
    unsaved = errors.from_wire(proc.verdict("unsaved-turn")["error"])
    assert type(unsaved) is errors.RunError and unsaved.details["thread_turn"] is True
    assert "may have had the prompt is not run again" in str(unsaved)
    assert proc.verdict("unadmitted-turn")["result"]["text"] == "unadmitted-turn ran"
    proc.wait_for_line("verdict.written id=unadmitted-turn")
    for rid in ("saved-turn", "unsaved-turn"):
        assert "request.started" not in _lifecycle(home, rid)
    assert _lifecycle(home, "unadmitted-turn").count("request.started") == 1
    assert proc.stop() == 0


def test_crash_after_the_verdict_leaves_it_alone(tmp_path: Path) -> None:
    """Verdict linked, claimed copy not yet removed: cleaned up, never a second verdict."""
    home = _home.Home.at(tmp_path / "home")
    _claimed_only(home, "finished", script({"text": "x"}))
    verdict = b'{"format": "adaptord.verdict/1", "id": "finished", "ok": true}\n'
    home.verdict("finished").write_bytes(verdict)
    proc = DaemonProcess(home.root).start()
    assert proc.stop() == 0
    assert home.verdict("finished").read_bytes() == verdict
    assert list(home.claimed.iterdir()) == []
    assert "request.started" not in _lifecycle(home, "finished")


def test_kill9_right_after_claiming_gives_exactly_one_verdict(tmp_path: Path) -> None:
    """A burst is claimed in one batch (one sync of claimed/); kill -9 the moment claims
    appear, while runs are starting: every request still gets exactly one verdict."""
    home = tmp_path / "home"
    proc = DaemonProcess(home, "--workers", "2").start()
    paths = proc.home
    ids = [f"burst-{i:02d}" for i in range(30)]
    for rid in ids:  # written first, then linked at once: the daemon sees a burst
        (paths.spool_tmp / f"{rid}.json").write_bytes(
            orjson.dumps(script({"text": rid}, {"sleep": 0.05}, id=rid, on_interrupt="requeue"))
        )
    for rid in ids:
        os.link(paths.spool_tmp / f"{rid}.json", paths.spool_new / f"{rid}.json")
        os.unlink(paths.spool_tmp / f"{rid}.json")
    deadline = time.monotonic() + 30
    while not any(paths.claimed.iterdir()):  # no sleep: the point is to kill at the claim
        assert time.monotonic() < deadline, "nothing was claimed"
    proc.kill9()
    restarted = DaemonProcess(home, "--workers", "4").start()
    verdicts = {rid: restarted.verdict(rid) for rid in ids}
    assert restarted.stop() == 0
    assert sorted(p.name for p in paths.verdicts.iterdir()) == sorted(f"{rid}.json" for rid in ids)
    assert all(v["ok"] for v in verdicts.values()), {r: v["error"] for r, v in verdicts.items() if not v["ok"]}
    assert list(paths.claimed.iterdir()) == [] and list(paths.spool_new.iterdir()) == []


def test_lifecycle_log_group_commits_and_prints_each_line_after_its_record(tmp_path: Path) -> None:
    from adaptord._lifecycle import LifecycleLog

    reader = sr.EventRecorder(sr.JSONLEventBackend(tmp_path), key_validator=lambda k: None)
    printed: list[tuple[str, int]] = []
    failures: list[BaseException] = []
    log = LifecycleLog(
        tmp_path, "adaptord",
        emit=lambda lines: printed.extend((line, len(reader.since("adaptord"))) for line, _ in lines),
        on_error=lambda what, exc: failures.append(exc),
    )
    for i in range(50):
        log.record(events.Notice(kind="lifecycle", text="fact", data={"phase": "fact", "i": i}), f"line {i}")
    assert log.barrier(timeout=30)
    log.close()
    assert failures == []
    assert [line for line, _ in printed] == [f"line {i}" for i in range(50)]
    assert all(in_file >= i + 1 for i, (_, in_file) in enumerate(printed))  # record first, then line
    assert sr.verify(tmp_path / "adaptord.jsonl") == 50
    assert [_fact(r)["i"] for r in reader.since("adaptord")] == list(range(50))


def test_a_daemon_line_said_while_facts_wait_is_printed_after_them_unrecorded(tmp_path: Path) -> None:
    from adaptord._lifecycle import INFO, WARNING, LifecycleLog

    printed: list[tuple[str, int]] = []
    log = LifecycleLog(tmp_path, "adaptord", emit=printed.extend, on_error=lambda what, exc: None, linger=0.2)
    assert not log.say("nothing waits", WARNING)  # the caller prints it at once
    for i in range(3):
        log.record(events.Notice(kind="lifecycle", text="fact", data={"phase": "fact", "i": i}), f"fact {i}")
    assert log.say("about fact 2", WARNING)
    log.record(events.Notice(kind="lifecycle", text="fact", data={"phase": "fact", "i": 3}), "fact 3")
    assert log.barrier(timeout=30)
    log.close()
    assert printed == [("fact 0", INFO), ("fact 1", INFO), ("fact 2", INFO), ("about fact 2", WARNING), ("fact 3", INFO)]
    assert sr.verify(tmp_path / "adaptord.jsonl") == 4
    assert not log.say("after the close", WARNING)


def test_cancelling_a_waiting_request_keeps_the_rest_of_its_thread_queue(daemon: DaemonProcess) -> None:
    def turn(*steps: dict[str, Any]) -> dict[str, Any]:
        return {"driver": "script", "prompt": "x", "thread": {"key": "line"}, "config": {"steps": list(steps), "session": "auto"}}

    holder = daemon.submit(turn({"text": "holding"}, {"sleep": 60}))
    daemon.wait_for_line(f"request.started id={holder}")
    second = daemon.submit(turn({"text": "never"}))
    third = daemon.submit(turn({"text": "third"}))
    daemon.wait_for_line(f"request.queued id={third}")
    _home.request_cancel(daemon.home, second)
    assert daemon.verdict(second)["error"]["code"] == errors.CancelledError("x").wire_code
    _home.request_cancel(daemon.home, holder)
    assert daemon.verdict(holder)["error"]["code"] == "ErrRunCancelled"
    verdict = daemon.verdict(third)
    assert verdict["ok"] and verdict["result"]["text"] == "third"


def test_an_id_submitted_again_after_its_verdict_was_removed_is_never_taken_for_the_earlier_run(tmp_path: Path) -> None:
    # Its verdict removed by hand (the docs allow the id to be submitted again then), the
    # earlier run's folder stayed: a restart while the new request was queued read that run's
    # "done" state as this request's run, finished with its verdict unwritten, and gave it the
    # earlier answer and run id without running it.
    home = tmp_path / "home"
    proc = DaemonProcess(home, "--workers", "1").start()
    first = proc.verdict(proc.submit({**script({"text": "OLD answer"}), "id": "again"}))
    assert first["result"]["text"] == "OLD answer"
    proc.home.verdict("again").unlink()
    blocker = proc.submit(script({"sleep": 60}))
    proc.wait_for_line(f"request.started id={blocker}")
    proc.submit({**script({"text": "NEW answer"}), "id": "again"})
    deadline = time.monotonic() + 60
    while sum("request.queued id=again" in line for line in proc.lines) < 2:  # the first's, then this
        assert time.monotonic() < deadline, proc.lines
        time.sleep(0.01)
    assert not (proc.home.run_dir("again") / "result.json").exists()  # the earlier run's files went
    proc.kill9()
    restarted = DaemonProcess(home).start()
    try:
        verdict = restarted.verdict("again")
        assert verdict["ok"] is True and verdict["result"]["text"] == "NEW answer", verdict
        assert verdict["run_id"] != first["run_id"]
    finally:
        assert restarted.stop() == 0


def test_a_recovered_attempt_a_stop_puts_back_keeps_counting(tmp_path: Path) -> None:
    # A request recovered with an attempt behind it, then put back in the spool by a stop
    # before it started again, started over at attempt 1 at the next start: four runs of an
    # `on_interrupt: "requeue"` request promised at most three.
    home = tmp_path / "home"
    first = DaemonProcess(home, "--workers", "2").start()
    holder = first.submit({**script({"sleep": 60}), "thread": {"key": "k1"}})
    first.wait_for_line(f"request.started id={holder}")
    behind = first.submit({**script({"sleep": 60}), "thread": {"key": "k1"}})  # waits for the key
    first.wait_for_line(f"request.queued id={behind}")
    requeued = first.submit(script({"text": "working"}, {"sleep": 60}, on_interrupt="requeue"))
    first.wait_for_line(f"request.started id={requeued} attempt=1")
    first.kill9()
    # One worker: the request behind the key (claimed first, never started) takes it, and the
    # recovered one waits, queued, until the stop puts it back in the spool.
    second = DaemonProcess(home, "--workers", "1", "--grace", "0.2").start()
    second.wait_for_line(f"request.started id={behind}")
    second.wait_for_line(f"request.queued id={requeued}")
    assert second.stop() == 0
    assert any(f"request.requeued id={requeued}" in line for line in second.lines), second.lines
    third = DaemonProcess(home).start()
    try:
        third.wait_for_line(f"request.started id={requeued} attempt=2")
        assert any(f"request.received id={requeued} attempt=1 recovered=True" in line for line in third.lines), third.lines
    finally:
        third.kill9()

"""A daemon that serves for months: files of finished requests removed by hand or by retention,
and its lifecycle log moved away or rotated.  A real daemon, real files, the real CLI."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adaptor.spool import Client, UnknownRequestError
from adaptord import config as config_module
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow

TIMEOUT = 60.0


def script(text: str, **extra: Any) -> dict[str, Any]:
    return {"driver": "script", "prompt": "go", "config": {"steps": [{"stdout": "raw"}, {"text": text}]}, **extra}


def adaptor_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ADAPTORD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "adaptor", *args], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def wait_until(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def facts(path: Path) -> list[dict[str, Any]]:
    """The data of each lifecycle record in ``path``, strictly read."""
    found = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            record = orjson.loads(raw)
            assert record["host_seq"] == n
            found.append(record["event"]["data"])
    return found


def settled(daemon: DaemonProcess, request_id: str) -> dict[str, Any]:
    """The request's verdict, once the daemon has also marked its run folder done.

    The folder's ``state.json`` is rewritten just after the verdict appears: removing the folder
    in between races that write ("Directory not empty").
    """
    verdict = daemon.verdict(request_id)
    state = daemon.home.run_state(request_id)
    wait_until(lambda: state.exists() and orjson.loads(state.read_bytes())["status"] == "done", "the run state")
    return verdict


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(tmp_path / "home", "--workers", "2", "--grace", "5").start()
    yield proc
    assert proc.stop() == 0, "\n".join(proc.lines)


# --- files of finished requests removed by hand ----------------------------------------------


def test_each_kind_of_file_of_a_finished_request_removed_by_hand(daemon: DaemonProcess) -> None:
    # A finished request whose verdict was removed kept its run folder, which made the id
    # "known" for ever: `adaptor wait ID` waited until its --timeout (exit 124, blaming a run
    # that "may still be running"), and without one for ever; `events ID -f` likewise.
    home = daemon.home
    no_verdict, no_run, no_log, nothing = (daemon.submit(script(f"r{i}")) for i in range(4))
    for rid in (no_verdict, no_run, no_log, nothing):
        settled(daemon, rid)
    home.verdict(no_verdict).unlink()
    shutil.rmtree(home.run_dir(no_run))
    (home.events / f"{no_log}.jsonl").unlink()
    home.verdict(nothing).unlink()
    shutil.rmtree(home.run_dir(nothing))
    (home.events / f"{nothing}.jsonl").unlink()
    for rid in (no_verdict, nothing):
        waited = adaptor_cli(home.root, "wait", rid, "--timeout", "20")
        assert (waited.returncode, waited.stderr) == (2, f"adaptor: no request {rid!r} under {home.root}\n")
        for follow in ((), ("-f",)):
            followed = adaptor_cli(home.root, "events", rid, *follow)
            assert followed.returncode == 2 and "no request" in followed.stderr, followed
        with pytest.raises(UnknownRequestError):
            Client(home.root).wait(rid, timeout=20)
    # The verdict alone still answers: its summary, and the stdout that is gone reads empty.
    waited = adaptor_cli(home.root, "wait", no_run, "--json")
    assert waited.returncode == 0 and orjson.loads(waited.stdout)["result"]["text"] == "r1"
    assert Client(home.root).wait(no_run).raw().stdout == ""
    assert "r1" in adaptor_cli(home.root, "events", no_run).stdout  # its log is there
    shown = adaptor_cli(home.root, "events", no_log)
    assert (shown.returncode, shown.stdout) == (0, "")  # nothing recorded any more
    status = adaptor_cli(home.root, "status", "--json")
    assert status.returncode == 0
    assert {r["id"] for r in orjson.loads(status.stdout)["result"]["recent"]} == {no_run, no_log}
    # A quarantined file removed: its rejection verdict still answers.
    daemon.drop("stray", b"{}")
    assert "quarantine/" in daemon.verdict("stray")["error"]["message"]
    for entry in home.quarantine.iterdir():
        entry.unlink()
    assert adaptor_cli(home.root, "wait", "stray").returncode == 2  # ErrInvalidRequest, as before
    # ... and the daemon serves on, a forgotten id included.
    again = daemon.submit({**script("again"), "id": nothing})
    assert again == nothing and daemon.verdict(nothing)["result"]["text"] == "again"
    assert Client(home.root).wait(daemon.submit(script("later"))).text == "later"


def test_a_verdict_removed_while_its_files_are_read_is_an_unknown_request(daemon: DaemonProcess) -> None:
    # Retention removes the verdict first, then the run's files: a reader that got the verdict
    # just before must not return a Result whose stdout and transcript silently went missing.
    client = Client(daemon.home.root)
    rid = daemon.submit(script("whole"))
    verdict = settled(daemon, rid)
    assert client._outcome(verdict).raw().stdout == "raw\n"
    daemon.home.verdict(rid).unlink()
    shutil.rmtree(daemon.home.run_dir(rid))
    with pytest.raises(UnknownRequestError):
        client._outcome(verdict)


# --- the lifecycle log moved away ------------------------------------------------------------


class _Tail:
    """``tail -F`` of a file, its lines gathered by a thread."""

    def __init__(self, path: Path) -> None:
        self.lines: list[str] = []
        self._proc = subprocess.Popen(
            ["tail", "-F", "-n", "+1", "-s", "0.1", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line)

    def saw(self, needle: str) -> bool:
        return any(needle in line for line in list(self.lines))

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)


def test_a_lifecycle_log_moved_away_starts_afresh_under_its_name(daemon: DaemonProcess) -> None:
    # The daemon went on appending to the moved file through its open descriptor, for as long
    # as it ran: events/adaptord.jsonl never came back, and `tail -F` saw nothing more.
    log = daemon.home.events / "adaptord.jsonl"
    before = daemon.submit(script("before"))
    daemon.verdict(before)
    daemon.wait_for_line(f"verdict.written id={before}")
    tail = _Tail(log)
    try:
        wait_until(lambda: tail.saw(f'"request_id":"{before}"'), "tail -F to show the log")
        moved = daemon.home.root / "adaptord-by-hand.jsonl"
        os.rename(log, moved)
        ended_at = len(facts(moved))
        after = daemon.submit(script("after"))
        daemon.verdict(after)
        daemon.wait_for_line(f"verdict.written id={after}")
        wait_until(lambda: tail.saw(f'"request_id":"{after}"'), "tail -F to show the fresh file")
    finally:
        tail.stop()
    fresh = facts(log)
    assert fresh[0]["phase"] == "lifecycle_log.reopened"
    assert fresh[0]["previous_last_host_seq"] == ended_at
    assert {"request.received", "verdict.written"} <= {f["phase"] for f in fresh if f["request_id"] == after}
    assert len(facts(moved)) == ended_at  # nothing more went where nobody looks
    assert sr.verify(log) == len(fresh) and sr.verify(moved) == ended_at
    daemon.wait_for_line("lifecycle_log.reopened")


def test_a_lifecycle_log_cut_short_starts_afresh_and_loses_no_fact(daemon: DaemonProcess) -> None:
    # A log rotator's copytruncate: the writer refused to append to a log shorter than what it
    # had acknowledged, so that batch of facts was lost ("audit log write failed"), and the
    # file went on without a word of why it began again.
    log = daemon.home.events / "adaptord.jsonl"
    before = daemon.submit(script("before"))
    daemon.verdict(before)
    daemon.wait_for_line(f"verdict.written id={before}")
    with open(log, "r+b") as cut:
        cut.truncate(0)
    after = daemon.submit(script("after"))
    daemon.verdict(after)
    daemon.wait_for_line(f"verdict.written id={after}")
    fresh = facts(log)
    assert fresh[0]["phase"] == "lifecycle_log.reopened" and "cut short" in fresh[0]["why"], fresh[0]
    assert {"request.received", "request.queued", "verdict.written"} <= {f["phase"] for f in fresh if f["request_id"] == after}
    assert sr.verify(log) == len(fresh)
    assert not any("audit log write failed" in line for line in daemon.lines), daemon.lines



# --- retention ---------------------------------------------------------------------------------

DAY = 86400.0


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then), follow_symlinks=False)


def pruned_line(daemon: DaemonProcess, seen: int = 0) -> str:
    """The daemon's next ``retention.pruned`` line after the ``seen`` first ones."""
    wait_until(lambda: sum("retention.pruned" in line for line in daemon.lines) > seen, "a prune pass\n" + "\n".join(daemon.lines))
    return [line for line in daemon.lines if "retention.pruned" in line][seen]


def test_retention_removes_exactly_the_old_finished_files(tmp_path: Path) -> None:
    # Nothing pruned them: a daemon serving for months kept every verdict, run folder, audit
    # log and quarantined file it ever made.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")  # the [retention] defaults: 30 days
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5").start()
    home = daemon.home
    try:
        old = [daemon.submit(script(f"old{i}")) for i in range(3)]
        recent = daemon.submit(script("recent"))
        turn = script("turn", thread={"key": "kept/conversation"})
        turn["config"]["session"] = "auto"
        threaded = daemon.submit(turn)
        for rid in (*old, recent, threaded):
            assert daemon.verdict(rid)["ok"], daemon.verdict(rid)
        # Turns that found no conversation to resume: their runs' records made a log for a key
        # that has none, kept for good (one per key a script polls for).
        missed = [daemon.submit(script("m", thread={"key": key, "resume_only": True})) for key in ("never/had/one", "busy/key")]
        for rid in missed:
            assert daemon.verdict(rid)["error"]["code"] == "ErrThreadNotFound"
        missed_log, busy_log = (home.events / f"{daemon.verdict(rid)['events'].removeprefix('events/')}" for rid in missed)
        running = daemon.submit({"driver": "script", "prompt": "go", "config": {"steps": [{"text": "x"}, {"sleep": 120}]}})
        daemon.wait_for_line(f"request.started id={running}")
        # A first turn on the busy key, running (no conversation saved yet): its log stays.
        busy = daemon.submit({**script("b", thread={"key": "busy/key"}), "config": {"steps": [{"text": "x"}, {"sleep": 120}]}})
        daemon.wait_for_line(f"request.started id={busy}")
        # Its audit log is made at its first event, a moment after the start.
        wait_until((home.events / f"{running}.jsonl").exists, "the running request's audit log")
        wait_until(lambda: busy_log.stat().st_size > 2000, "the busy turn's records")
        thread_log = home.events / f"{daemon.verdict(threaded)['events'].removeprefix('events/')}"
        # Made old: the finished ones by their verdicts (the rest of their files too, which
        # decides nothing), and everything of the running request and of the thread.
        for rid in (*old, threaded, *missed):
            for path in (home.verdict(rid), home.run_dir(rid), home.events / f"{rid}.jsonl"):
                if path.exists():
                    age(path, 31)
        for path in (home.run_dir(running), home.run_state(running), home.events / f"{running}.jsonl",
                     thread_log, missed_log, busy_log, *home.threads.iterdir()):
            age(path, 400)
        age(home.verdict(recent), 29)
        orphan = home.run_dir("forgotten-by-hand")  # its verdict removed by hand long ago
        orphan.mkdir()
        (orphan / "stdout").write_text("x")
        age(orphan, 31)
        (home.runs / ".pruning-crashed-0123abcd").mkdir()  # a pass a crash interrupted
        stamp = time.time_ns()
        quarantined = {
            "old": home.quarantine / f"{stamp - int(31 * DAY * 1e9)}-a.json",
            "written long ago, quarantined now": home.quarantine / f"{stamp}-b.json",
            "set aside response": home.quarantine / "approval-response-x-0123abcd",
        }
        for path in quarantined.values():
            path.write_text("{}")
            age(path, 31)
        rotated_old = home.events / "adaptord-20200101T000000Z.jsonl"
        rotated_new = home.events / "adaptord-20991231T000000Z.jsonl"
        for path in (rotated_old, rotated_new):
            shutil.copyfile(home.events / "adaptord.jsonl", path)
        age(rotated_old, 31)
        before = set(home.root.rglob("*"))

        daemon.reload(config, config.read_text())  # a reload prunes at once, as the hourly tick does
        line = pruned_line(daemon)
        assert "verdicts=6 runs=7 events=3 quarantine=2 lifecycle_logs=1 thread_logs=1" in line, line

        gone = {path for path in before if not os.path.lexists(path)}
        expected_gone = {
            home.runs / ".pruning-crashed-0123abcd", orphan, orphan / "stdout",
            quarantined["old"], quarantined["set aside response"], rotated_old,
            missed_log, missed_log.with_name(missed_log.name + ".lock"),
        }
        for rid in (*old, threaded, *missed):
            assert not home.verdict(rid).exists() and not home.run_dir(rid).exists()
        for rid in old:
            assert not (home.events / f"{rid}.jsonl").exists()
            assert not (home.events / f"{rid}.jsonl.lock").exists()
        # ... and nothing else.
        assert {
            p for p in gone if not any(rid in p.name or rid in p.parent.name for rid in (*old, threaded, *missed))
        } == expected_gone
        # What stays: the recent request, the running ones, the threads' logs and store.
        assert sr.verify(busy_log) > 0
        assert Client(home.root).wait(recent).raw().stdout == "raw\n"
        assert "recent" in adaptor_cli(home.root, "events", recent).stdout
        assert sr.verify(thread_log) > 0 and any(home.threads.iterdir())
        assert home.run_state(running).exists() and (home.events / f"{running}.jsonl").exists()
        assert quarantined["written long ago, quarantined now"].exists() and rotated_new.exists()
        # The forgotten ones are unknown, as if never submitted.
        waited = adaptor_cli(home.root, "wait", old[0])
        assert waited.returncode == 2 and "no request" in waited.stderr
        # The running request is unharmed, and one fact says what a pass removed.
        for rid in (running, busy):
            Client(home.root).cancel(rid)
            assert daemon.verdict(rid)["error"]["code"] == "ErrRunCancelled"
            daemon.wait_for_line(f"verdict.written id={rid}")
        # The key that had no conversation starts a new log, numbered from 1.
        again = daemon.submit(script("m", thread={"key": "never/had/one", "resume_only": True}))
        assert daemon.verdict(again)["error"]["code"] == "ErrThreadNotFound"
        assert sr.verify(missed_log) == 2
    finally:
        assert daemon.stop() == 0, "\n".join(daemon.lines)
    (record,) = [f for f in facts(home.events / "adaptord.jsonl") if f["phase"] == "retention.pruned"]
    assert {k: record[k] for k in ("verdicts", "runs", "events", "quarantine", "lifecycle_logs", "thread_logs")} == {
        "verdicts": 6, "runs": 7, "events": 3, "quarantine": 2, "lifecycle_logs": 1, "thread_logs": 1,
    }


def test_readers_racing_a_prune_see_a_request_whole_or_not_at_all(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n")
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        client = Client(daemon.home.root)
        ids = [client.submit(script(f"t{i}")) for i in range(40)]
        for rid in ids:
            daemon.verdict(rid)
            age(daemon.home.verdict(rid), 31)
        seen: list[str] = []
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                for n, rid in enumerate(ids):
                    try:
                        result = client.wait(rid, timeout=0)
                        whole = result.text == f"t{n}" and result.raw().stdout == "raw\n" and len(result.transcript()) > 0
                        seen.append("whole" if whole else f"partial {rid}")
                    except UnknownRequestError:
                        seen.append("unknown")
                    try:
                        kinds = [type(event).__name__ for event in client.events(rid)]
                        seen.append("whole" if kinds and kinds[-1] == "RunFinished" else f"partial events {rid}: {kinds}")
                    except UnknownRequestError:
                        seen.append("unknown")

        readers = [threading.Thread(target=read, daemon=True) for _ in range(3)]
        for reader in readers:
            reader.start()
        wait_until(lambda: "whole" in seen, "the readers to read")
        daemon.reload(config, config.read_text())
        assert "verdicts=40 runs=40 events=40" in pruned_line(daemon)
        wait_until(lambda: seen.count("unknown") >= 3 * 2 * len(ids), "the readers to see every request gone")
        done.set()
        for reader in readers:
            reader.join(timeout=TIMEOUT)
        assert set(seen) == {"whole", "unknown"}, sorted(set(seen) - {"whole", "unknown"})
    finally:
        assert daemon.stop() == 0


def test_files_writers_left_staged_go_after_a_day(tmp_path: Path) -> None:
    # A writer killed between staging its file and moving it into place (`adaptor submit` or
    # `adaptor approve` killed -9, a script stopped between `cat >` and `mv`) left it there for
    # ever: nothing removed spool/tmp/ or a response's temporary file, whatever [retention]
    # said, and a staged <id>.json kept its id from being submitted again.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n[retention]\nkeep_days = inf\nquarantine_days = inf\n")
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5").start()
    home = daemon.home
    try:
        abandoned = [
            home.spool_tmp / "abandoned-1.json", home.spool_tmp / ".half-written",
            home.approvals_responses / "appr_1.json.tmp-0123abcd", home.approvals_responses / ".appr_2.tmp",
        ]
        fresh = [home.spool_tmp / "being-written.json", home.approvals_responses / ".appr_3.tmp"]
        for path in (*abandoned, *fresh):
            path.write_text('{"driver": "script", "prompt": "go"}')
        # Before they are aged: the daemon's first pass of retention may come at any moment
        # (late on a loaded machine), and would take them first.
        with pytest.raises(FileExistsError):
            Client(home.root).submit(script("again", id="abandoned-1"))
        for path in abandoned:
            age(path, 1.01)
        folder = home.spool_tmp / "someones-folder"  # not a staged file: left alone
        folder.mkdir()
        age(folder, 3)

        daemon.reload(config, config.read_text())
        assert "staged=4" in pruned_line(daemon)
        assert [p for p in abandoned if os.path.lexists(p)] == []
        assert all(p.exists() for p in (*fresh, folder))
        rid = Client(home.root).submit(script("again", id="abandoned-1"))
        assert daemon.verdict(rid)["result"]["text"] == "again"
    finally:
        assert daemon.stop() == 0, "\n".join(daemon.lines)


def test_retention_settings_are_checked_and_inf_keeps_for_ever(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[retention]\nkeep_days = 0.5\n")
    checked = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert checked.returncode == 2, checked.stdout
    assert "retention.keep_days must be a number of days, at least 1, or inf" in checked.stdout
    # The other refusals, from the loader `adaptord check`, serve and a reload share.
    for text, why in (
        ("[retention]\nkeep_days = nan\n", "retention.keep_days must be a number of days"),
        ("[retention]\nlifecycle_log_mb = 0\n", "retention.lifecycle_log_mb must be a number of MiB, more than 0"),
        ("[retention]\nkeep = 3\n", "[retention]: unknown setting(s): 'keep' (did you mean 'keep_days'?)"),
    ):
        config.write_text(text)
        with pytest.raises(config_module.ConfigError) as loading:
            config_module.load(config, required=True)
        assert why in str(loading.value), text
    good = "scan_interval = 0.2\n[retention]\nkeep_days = inf\nquarantine_days = 1\n"
    config.write_text(good)
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        rid = daemon.submit(script("kept"))
        daemon.verdict(rid)
        age(daemon.home.verdict(rid), 4000)
        stray = daemon.home.quarantine / "1-stray.json"
        stray.write_text("{}")
        age(stray, 2)
        refused = daemon.reload(config, "[retention]\nkeep_days = 0\n")
        assert "config reload failed; keeping the old config" in refused, refused
        daemon.reload(config, good)
        assert "verdicts=0 runs=0 events=0 quarantine=1 lifecycle_logs=0" in pruned_line(daemon)
        assert Client(daemon.home.root).wait(rid).text == "kept"
    finally:
        assert daemon.stop() == 0


# --- the lifecycle log rotated by size ---------------------------------------------------------


def test_a_log_holding_only_its_rotated_fact_is_not_rotated_again(tmp_path: Path) -> None:
    # Under a limit smaller than that fact, an idle daemon rotated its log every scan interval
    # for ever (a file a second, each holding the one fact that the previous one was rotated).
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.05\n[retention]\nlifecycle_log_mb = 0.0001\n")  # 104 bytes
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        # Its facts come at the start and the end; in between, 0.6 s (12 scan intervals) idle.
        rid = daemon.submit({**script("done"), "config": {"steps": [{"sleep": 0.6}, {"text": "done"}]}})
        daemon.verdict(rid)
        daemon.wait_for_line(f"verdict.written id={rid}")
    finally:
        assert daemon.stop() == 0, "\n".join(daemon.lines)
    started = next(i for i, line in enumerate(daemon.lines) if f"request.started id={rid}" in line)
    ended = next(i for i, line in enumerate(daemon.lines) if f"verdict.written id={rid}" in line)
    rotations = [line for line in daemon.lines[started:ended] if "lifecycle_log.rotated" in line]
    assert len(rotations) <= 1, rotations  # (the one the start's facts may make)


def test_the_lifecycle_log_is_rotated_by_size_and_both_files_verify(tmp_path: Path) -> None:
    # events/adaptord.jsonl grew for ever (about 2.5 KB a request: 25 MB a day at 10,000).
    config = tmp_path / "config.toml"
    text = "scan_interval = 0.2\n[retention]\nlifecycle_log_mb = 0.004\n"  # 4 KiB
    config.write_text(text)
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    log = daemon.home.events / "adaptord.jsonl"
    tail = _Tail(log)
    try:
        # Looked at every scan interval: it was hourly, and a busy daemon wrote the log far
        # past its limit meanwhile (19 MB for a 1 MB limit in a soak).
        for i in range(40):
            rid = daemon.submit(script(f"r{i}"))
            daemon.verdict(rid)
            daemon.wait_for_line(f"verdict.written id={rid}")
            if any("lifecycle_log.rotated" in line for line in daemon.lines):
                break
        daemon.reload(config, "scan_interval = 0.2\n")  # no more rotations from here
        after = daemon.submit(script("after"))
        daemon.verdict(after)
        daemon.wait_for_line(f"verdict.written id={after}")
        line = [line for line in daemon.lines if "lifecycle_log.rotated" in line][-1]
        found = re.search(r"continues_from=(\S+)", line)
        assert found is not None, line
        rotated = daemon.home.events / found[1]
        assert re.fullmatch(r"adaptord-\d{8}T\d{6}Z(-\d+)?\.jsonl", rotated.name), rotated.name
        wait_until(lambda: tail.saw(f'"request_id":"{after}"'), "tail -F to follow the fresh file")
    finally:
        tail.stop()
        assert daemon.stop() == 0, "\n".join(daemon.lines)
    old, fresh = facts(rotated), facts(log)
    assert fresh[0]["phase"] == "lifecycle_log.rotated"
    assert fresh[0]["continues_from"] == rotated.name and fresh[0]["previous_last_host_seq"] == len(old)
    assert any(f["request_id"] == after for f in fresh) and not any(f["request_id"] == after for f in old)
    for path, count in ((rotated, len(old)), (log, len(fresh))):
        verified = adaptor_cli(daemon.home.root, "verify-log", str(path))
        assert verified.returncode == 0, verified.stderr
        assert sr.verify(path) == count
    # A request cannot take a rotated log's name for its own audit log.
    with pytest.raises(ValueError, match="invalid request id"):
        Client(daemon.home.root).submit({**script("x"), "id": rotated.name.removesuffix(".jsonl")})


@pytest.mark.parametrize("missing", ["runs", "events", "verdicts", "quarantine", "spool/tmp", "approvals/responses"])
def test_a_pass_goes_on_when_a_folder_of_the_home_was_removed(tmp_path: Path, missing: str) -> None:
    # A folder removed by hand failed every pass with UnboundLocalError ("cannot prune the
    # home"), so nothing else was pruned either.
    from adaptor import _home
    from adaptord import _retention

    home = _home.Home.at(tmp_path / "home")
    for folder in ("runs", "events", "verdicts", "quarantine", "spool/tmp", "approvals/responses"):
        (home.root / folder).mkdir(parents=True)
    (home.runs / ".pruning-crashed-0123abcd").mkdir()
    old_log = home.events / "adaptord-20200101T000000Z.jsonl"
    old_log.write_text("")
    os.utime(old_log, (time.time() - 400 * DAY, time.time() - 400 * DAY))
    shutil.rmtree(home.root / missing)

    @contextlib.contextmanager
    def hold(request_id: str) -> Iterator[bool]:
        yield True

    pruned, more = _retention.prune(
        home, config_module.Retention(), hold=hold, hold_thread=hold, conversations=set, stopping=lambda: False
    )
    assert not more and pruned.failed == 0
    assert pruned.lifecycle_logs == (0 if missing == "events" else 1)
    assert not (home.runs / ".pruning-crashed-0123abcd").exists()


def test_a_home_shipped_in_an_image_layer_is_pruned(tmp_path: Path) -> None:
    # A used home baked into a container image: its folders sit in overlayfs's lower layer,
    # which (without redirect_dir, the kernel's default) refuses to rename a folder (EXDEV).
    # Every pass removed the old verdicts, failed on their run folders ("Invalid cross-device
    # link") and left those and their audit logs for good.
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount for overlayfs")
    lower, upper, work, merged = (tmp_path / name for name in ("lower", "upper", "work", "merged"))
    for folder in (upper, work, merged):
        folder.mkdir()
    built = DaemonProcess(lower / "home").start()
    old = [built.submit(script(f"old{i}")) for i in range(2)]
    for rid in old:
        assert built.verdict(rid)["ok"]
    assert built.stop() == 0
    for rid in old:
        for path in (built.home.verdict(rid), built.home.run_dir(rid), built.home.events / f"{rid}.jsonl"):
            age(path, 31)
    shown = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
        capture_output=True, text=True, timeout=60,
    )
    if shown.returncode != 0:
        pytest.skip(f"cannot mount an overlayfs here: {shown.stderr.strip()}")
    try:
        daemon = DaemonProcess(merged / "home").start()
        line = pruned_line(daemon)
        assert daemon.stop() == 0
        assert "verdicts=2 runs=2 events=2" in line and "failed" not in line, line
        for rid in old:
            assert not os.path.lexists(daemon.home.run_dir(rid))
            assert not os.path.lexists(daemon.home.events / f"{rid}.jsonl")
        assert not [name for name in os.listdir(daemon.home.runs) if name.startswith(".pruning-")]
    finally:
        subprocess.run(["umount", str(merged)], check=True, timeout=60)


def test_a_request_dated_in_the_future_is_kept_from_today_not_until_then(tmp_path: Path) -> None:
    # Files written while the clock was a year ahead (a lost battery-backed clock, set right a
    # day later) kept their future times: retention took them for new for a year, whatever
    # keep_days said.  A pass dates such a file today, so its keep_days count from then.
    config = tmp_path / "config.toml"
    config.write_text("scan_interval = 0.2\n[retention]\nkeep_days = 1\n")
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    home = daemon.home
    try:
        rid = daemon.submit(script("from the future"))
        assert daemon.verdict(rid)["ok"]
        daemon.wait_for_line(f"verdict.written id={rid}")
        for path in (home.verdict(rid), home.run_dir(rid), home.events / f"{rid}.jsonl"):
            age(path, -400)
        daemon.reload(config, config.read_text())  # a pass at once
        wait_until(lambda: home.verdict(rid).stat().st_mtime < time.time() + DAY, "the verdict dated today")
        assert Client(home.root).wait(rid).text == "from the future"  # kept: today is its first day
        for path in (home.verdict(rid), home.run_dir(rid), home.events / f"{rid}.jsonl"):
            age(path, 2)  # two days on
        daemon.reload(config, config.read_text())
        assert "verdicts=1 runs=1 events=1" in pruned_line(daemon)
        assert not home.verdict(rid).exists() and not home.run_dir(rid).exists()
    finally:
        assert daemon.stop() == 0

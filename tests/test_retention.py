"""A daemon that serves for months: files of finished requests removed by hand or by retention,
and its lifecycle log moved away or rotated.  A real daemon, real files, the real CLI."""

from __future__ import annotations

import os
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
        daemon.verdict(rid)
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
    verdict = client.verdict(rid) or daemon.verdict(rid)
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


"""What is on the disk before a verdict appears, read from the daemon's own system calls.

A ``kill -9`` cannot show a missing fsync: the page cache outlives the process, so the crash
test passes without any.  Only a power cut can, and what survives one is what was synced,
in the order storage.md requires.  So this test runs ``adaptord serve`` under ``strace`` and
checks, for every verdict, the calls of the thread that wrote it: the verdict's content, the
files it points to (its run's side files and audit log) and the run folder's entries were
fsynced before its name was linked into ``verdicts/``, and that folder was fsynced after.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from adaptor import _home


def _strace_unusable() -> str | None:
    if shutil.which("strace") is None:
        return "strace is not installed (.ci/run installs it)"
    probe = subprocess.run(["strace", "-f", "-qq", "-e", "trace=none", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # (ptrace refused: a container's seccomp profile, say)
        return f"strace cannot trace here: {probe.stderr.strip()[:200]}"
    return None


_UNUSABLE = _strace_unusable()
pytestmark = pytest.mark.skipif(_UNUSABLE is not None, reason=_UNUSABLE or "")

# "1234 fsync(7</home/verdicts/.x.json.tmp-ab>) = 0", or the start of an unfinished call (the
# thread makes no other call before it returns, so its place in the thread's order is kept);
# an append written and synced in one call (pwritev2 with RWF_DSYNC) counts as a sync.
_SYNC = re.compile(r"^(\d+) +(?:fsync|fdatasync)\(\d+<([^>]*)>")
_SYNCED_WRITE = re.compile(r"^(\d+) +pwritev2\(\d+<([^>]*)>.*RWF_DSYNC")
_LINK = re.compile(r'^(\d+) +link(?:at)?\((?:AT_FDCWD, )?"([^"]*)", (?:AT_FDCWD, )?"([^"]*)"(?!.*= -1)')


def _calls(trace: Path) -> list[tuple[str, str, str]]:
    """The syncs and links of every thread in the order they began: ``(thread, "sync",
    path)`` and ``(thread, "link", target)``."""
    calls: list[tuple[str, str, str]] = []
    for line in trace.read_text(errors="replace").splitlines():
        if found := _SYNC.match(line) or _SYNCED_WRITE.match(line):
            calls.append((found[1], "sync", found[2]))
        elif found := _LINK.match(line):
            calls.append((found[1], "link", found[3]))
    return calls


def _wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_every_verdict_appears_only_after_what_it_points_to_is_synced(tmp_path: Path) -> None:
    home = _home.Home.at(tmp_path / "home")
    trace = tmp_path / "trace.txt"
    stderr = (tmp_path / "stderr.txt").open("wb")
    tracer = subprocess.Popen(
        [
            "strace", "-f", "-qq", "-y", "-o", str(trace),
            "-e", "trace=fsync,fdatasync,pwritev2,link,linkat", "-s", "0",
            sys.executable, "-m", "adaptord", "serve", "--home", str(home.root), "--workers", "2",
        ],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
    )
    try:
        _wait_for(lambda: b"adaptord: ready" in (tmp_path / "stderr.txt").read_bytes(), "the daemon")
        steps = [{"text": "one"}, {"text": "two"}]
        requests: list[dict[str, Any]] = [
            {"driver": "script", "prompt": "plain", "config": {"steps": steps}},
            {"driver": "script", "prompt": "fails", "config": {"steps": [{"text": "half"}, {"fail": {"message": "boom"}}]}},
            {"driver": "script", "prompt": "turn", "config": {"steps": steps, "session": "auto"},
             "thread": {"key": "sync/order"}},
            {"driver": "command", "prompt": "real process",
             "config": {"command": "/bin/sh", "extra_args": ["-c", "cat >/dev/null; echo out; echo err >&2"]}},
            {"driver": "nope", "prompt": "rejected"},
            {"driver": "script", "prompt": "refused by its driver", "config": {"steps": [{"dance": True}]}},
        ]
        ids = [_home.submit(home, request) for request in requests]
        _wait_for(lambda: all(home.verdict(rid).exists() for rid in ids), "every verdict")
        daemon_pid = orjson.loads(home.daemon_state.read_bytes())["pid"]
        os.kill(daemon_pid, signal.SIGTERM)
        assert tracer.wait(timeout=120) == 0
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        stderr.close()

    calls = _calls(trace)
    threads_folder = os.path.realpath(home.threads)
    checked = 0
    for rid in ids:
        verdict_path = os.path.realpath(home.verdict(rid))
        verdict = orjson.loads(home.verdict(rid).read_bytes())
        linked = [index for index, (_, call, path) in enumerate(calls) if call == "link" and path == verdict_path]
        assert len(linked) == 1, (rid, verdict_path, linked)  # linked into place once
        [at] = linked
        thread = calls[at][0]
        before = {path for tid, call, path in calls[:at] if tid == thread and call == "sync"}
        after = {path for tid, call, path in calls[at + 1 :] if tid == thread and call == "sync"}
        folder = os.path.dirname(verdict_path)
        # Its content, under the temporary name it was linked from.
        assert any(os.path.basename(path).startswith(f".{rid}.json.tmp-") for path in before), (rid, before)
        # Its name, once linked.
        assert folder in after, (rid, after)
        # What it points to: the audit log it names, and its run's side files and their entries.
        if verdict["events"] is not None:
            assert os.path.realpath(home.root / verdict["events"]) in before, (rid, verdict["events"], before)
        run_dir = os.path.realpath(home.run_dir(rid))
        # (An empty one has no content to sync: its entry is made durable with the folder's.)
        side_files = {
            os.path.join(run_dir, name)
            for name in ("stdout", "stderr", "terminal.json", "transcript.json", "result.json")
            if os.path.exists(os.path.join(run_dir, name)) and os.path.getsize(os.path.join(run_dir, name))
        }
        assert side_files <= before, (rid, side_files - before)
        if verdict["result"] is not None:
            assert side_files and run_dir in before, (rid, side_files, before)
        # A thread's turn: its record in the thread store was synced (by the run, before it
        # ended) before the verdict saying it went well appeared.
        if "thread" in requests[ids.index(rid)] and verdict["ok"]:
            assert any(
                call == "sync" and path.startswith(threads_folder + os.sep) for _, call, path in calls[:at]
            ), (rid, "no sync of the thread store before its verdict")
        checked += 1
    assert checked == len(requests)

"""A full disk: verdicts wait for space, none is lost or doubled, and the daemon keeps serving.

The daemon's home is a small filesystem filled to the last byte, which needs root (``mount``);
the tests are skipped with the reason where that is not allowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import orjson
import pytest

from adaptor import _home, errors, events
from adaptor.spool import Client
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess

_NO_SPACE = os.strerror(28)  # ENOSPC


@pytest.fixture(params=["tmpfs", "ext4"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A small filesystem of its own (tmpfs, or ext4 on a loop device), unmounted afterwards.

    Both: ext4 reserves blocks as it writes and then allocates them, and a full ext4 fails
    other writes than a full tmpfs does.
    """
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small filesystem needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if request.param == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount_point)]
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("no mkfs.ext4 (e2fsprogs)")
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(16 * 2**20)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        command = ["mount", "-o", "loop", str(image), str(mount_point)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {request.param} here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def _fill(disk: Path) -> Path:
    """Take every free byte of ``disk``; deleting the returned file gives them back."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for chunk in (b"\0" * 65536, b"\0"):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == 28, exc
    finally:
        os.close(fd)
    return filler


def _stage(home: _home.Home, request_id: str, request: Mapping[str, object]) -> Path:
    """A request written into spool/tmp, to be linked into spool/new once the disk is full."""
    staged = home.spool_tmp / f"{request_id}.json"
    staged.write_bytes(orjson.dumps(request))
    return staged


def _deliver(home: _home.Home, staged: Path) -> None:
    os.link(staged, home.spool_new / staged.name)  # a link takes no space
    staged.unlink()


def _hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def _logs_verify(home: _home.Home) -> None:
    for log in home.events.glob("*.jsonl"):
        sr.verify(log)


_HI = {"driver": "script", "prompt": "hi", "config": {"steps": [{"text": "hi"}]}}


def test_verdicts_wait_for_space_then_arrive_once(disk: Path) -> None:
    daemon = DaemonProcess(disk / "home", "--workers", "2").start()
    home = daemon.home
    try:
        assert daemon.verdict(daemon.submit(_HI))["ok"] is True
        ids = [f"full-{n}" for n in range(3)]
        staged = [_stage(home, rid, _HI) for rid in ids]
        filler = _fill(disk)
        for path in staged:
            _deliver(home, path)
        for rid in ids:
            line = daemon.wait_for_line(f"verdict.deferred id={rid} ")
            assert _NO_SPACE in line
        daemon.wait_for_line("audit log write failed")

        # Nothing is lost while the disk is full: each request stays claimed, no verdict
        # (whole or partial) exists, and no half-written temporary file is left behind.
        assert sorted(p.name for p in home.claimed.iterdir()) == sorted(f"{rid}.json" for rid in ids)
        assert not any(home.verdict(rid).exists() for rid in ids)
        assert _hidden(home.verdicts) == []
        assert daemon.proc is not None and daemon.proc.poll() is None

        filler.unlink()
        for rid in ids:
            verdict = daemon.verdict(rid, timeout=60)
            assert verdict["id"] == rid and verdict["ok"] is False
            err = errors.from_wire(verdict["error"])
            assert _NO_SPACE in str(err)
            daemon.wait_for_line(f"verdict.undeferred id={rid}")
        daemon.wait_for_line("audit log writable again")
        # The daemon serves on as before.
        assert daemon.verdict(daemon.submit(_HI))["ok"] is True
    finally:
        code = daemon.stop()
    assert code == 0
    for rid in ids:  # reported once, however often the verdict was tried again
        assert sum(f"verdict.deferred id={rid} " in line for line in daemon.lines) == 1
    assert sum("audit log write failed" in line for line in daemon.lines) == 1
    assert list(home.claimed.iterdir()) == []
    assert _hidden(home.verdicts) == []
    _logs_verify(home)


def test_a_conversation_caught_by_a_full_disk_goes_on_once_there_is_room(disk: Path) -> None:
    # Its run fails; the lease its end could not release must not keep the thread busy (for
    # the lease's five minutes) once the disk has room again.
    def turn(text: str) -> dict[str, object]:
        return {
            "driver": "script", "prompt": text, "thread": {"key": "chat"},
            "config": {"steps": [{"text": text}, {"sleep": 0.5}, {"text": text}], "session": "auto"},
        }

    daemon = DaemonProcess(disk / "home", "--workers", "2").start()
    try:
        assert daemon.verdict(daemon.submit(turn("first")))["ok"] is True
        caught = daemon.submit(turn("caught"))
        daemon.wait_for_line(f"request.started id={caught} ")
        filler = _fill(disk)
        daemon.wait_for_line(f"verdict.deferred id={caught} ")
        filler.unlink()
        daemon.verdict(caught, timeout=60)
        rid = daemon.submit(turn("after"))
        after = daemon.verdict(rid, timeout=60)
        assert after["ok"] is True, after["error"]
        assert after["result"]["text"] == "after"
        # and the conversation's audit log records it in full, as before the disk filled
        streamed = [e for e in Client(daemon.home.root).events(rid) if isinstance(e, events.TextDelta)]
        assert "".join(e.text for e in streamed if e.phase == "content") == "afterafter"
    finally:
        assert daemon.stop() == 0
    _logs_verify(daemon.home)


def test_a_restart_on_a_full_disk_serves_and_gives_the_interrupted_their_verdicts(disk: Path) -> None:
    sleeper = {"driver": "script", "prompt": "hi", "config": {"steps": [{"sleep": 120}]}}
    daemon = DaemonProcess(disk / "home", "--workers", "2").start()
    home = daemon.home
    ids = [daemon.submit(sleeper) for _ in range(2)]
    for rid in ids:
        daemon.wait_for_line(f"request.started id={rid} ")
    daemon.kill9()

    filler = _fill(disk)
    restarted = DaemonProcess(disk / "home", "--workers", "2").start()  # reaches "ready"
    try:
        for rid in ids:
            assert _NO_SPACE in restarted.wait_for_line(f"verdict.deferred id={rid} ")
        assert not any(home.verdict(rid).exists() for rid in ids)
        assert _hidden(home.verdicts) == []

        filler.unlink()
        for rid in ids:
            verdict = restarted.verdict(rid, timeout=60)
            err = errors.from_wire(verdict["error"])
            assert isinstance(err, errors.RunError), verdict["error"]
            assert err.reason == "infrastructure_error" and err.details.get("interrupted") is True
    finally:
        code = restarted.stop()
    assert code == 0
    assert list(home.claimed.iterdir()) == []
    _logs_verify(home)


def test_a_daemon_stopped_with_verdicts_unwritten_leaves_them_claimed(disk: Path) -> None:
    daemon = DaemonProcess(disk / "home", "--workers", "1").start()
    home = daemon.home
    staged = _stage(home, "full-stop", _HI)
    filler = _fill(disk)
    _deliver(home, staged)
    daemon.wait_for_line("verdict.deferred id=full-stop ")
    assert daemon.stop() == 0
    assert "verdict.unwritten id=full-stop" in "\n".join(daemon.lines)
    assert [p.name for p in home.claimed.iterdir()] == ["full-stop.json"]

    filler.unlink()
    restarted = DaemonProcess(disk / "home", "--workers", "1").start()
    try:
        # As after a crash: its state never reached the disk, so it is queued and runs again.
        assert restarted.verdict("full-stop", timeout=60)["id"] == "full-stop"
    finally:
        assert restarted.stop() == 0
    assert list(home.claimed.iterdir()) == []

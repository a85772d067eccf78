"""adaptor._watch: a watch the system refuses raises, and leaves nothing running behind it."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from watchdog.events import FileSystemEvent, FileSystemEventHandler

from adaptor._watch import start_observer
from tests.inotify_hog import InotifyHog


def _inotify_descriptors() -> int:
    return sum(
        os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    )


class _Seen(FileSystemEventHandler):
    def __init__(self) -> None:
        self.arrived = threading.Event()

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.arrived.set()


def test_a_started_observer_reports_changes(tmp_path: Path) -> None:
    handler = _Seen()
    observer = start_observer(handler, [tmp_path])
    try:
        (tmp_path / "new").write_text("x")
        assert handler.arrived.wait(30)
    finally:
        observer.stop()
        observer.join()


@pytest.mark.alone  # holds every inotify instance of this user
@pytest.mark.parametrize("refusal", ["watch", "instance"])
def test_a_refused_start_leaves_no_thread_or_descriptor(tmp_path: Path, refusal: str) -> None:
    threads, descriptors = set(threading.enumerate()), _inotify_descriptors()
    if refusal == "watch":  # the instance is taken; adding a watch fails
        # watchdog left the instance open about one time in four (its reader had not read
        # yet): forty tries make a leak certain to show.
        for _ in range(40):
            with pytest.raises(OSError) as info:
                start_observer(_Seen(), [tmp_path, tmp_path / "gone"])
            assert info.value.errno == errno.ENOENT
    else:
        with InotifyHog(), pytest.raises(OSError) as info:
            start_observer(_Seen(), [tmp_path])
        assert info.value.errno == errno.EMFILE
    assert set(threading.enumerate()) == threads
    assert _inotify_descriptors() == descriptors


def test_client_waits_share_one_watch_and_leak_no_inotify_instance(tmp_path: Path) -> None:
    # Each wait started and stopped an observer of its own; watchdog leaks the inotify
    # instance of one stopped before its reader first read (here 1 to 30 in 600): a service
    # making many waits used up the user's inotify instances (128 by default).
    from adaptor.spool import _Wakeup

    stop = threading.Event()

    def busy() -> None:  # a home where runs are writing
        count = 0
        while not stop.is_set():
            (tmp_path / f"f{count % 5}").write_text("x")
            count += 1

    with _Wakeup(tmp_path):  # the process's one instance, if none was made yet
        pass
    # Threads by identity: one left by an earlier test may end meanwhile (seen under load).
    descriptors, threads = _inotify_descriptors(), set(threading.enumerate())
    writer = threading.Thread(target=busy)
    writer.start()
    try:
        for _ in range(600):
            with _Wakeup(tmp_path):
                # No observer of its own (its threads were four), only the directory's
                # emitter: the leak needs a stop before the reader's first read, so counting
                # descriptors alone would leave this test to luck.
                assert len(set(threading.enumerate()) - threads) <= 2  # the writer, the emitter
    finally:
        stop.set()
        writer.join()
    assert _inotify_descriptors() == descriptors
    assert not set(threading.enumerate()) - threads

    # Two waiters on one directory are both woken; the watch outlives neither.
    with _Wakeup(tmp_path) as first, _Wakeup(tmp_path) as second:
        (tmp_path / "change").write_text("x")
        assert first._changed.wait(30) and second._changed.wait(30)
    with _Wakeup(tmp_path) as third:
        (tmp_path / "again").write_text("x")
        assert third._changed.wait(30)

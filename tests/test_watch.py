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


@pytest.mark.parametrize("refusal", ["watch", "instance"])
def test_a_refused_start_leaves_no_thread_or_descriptor(tmp_path: Path, refusal: str) -> None:
    threads, descriptors = set(threading.enumerate()), _inotify_descriptors()
    if refusal == "watch":  # the instance is taken; adding a watch fails
        with pytest.raises(OSError) as info:
            start_observer(_Seen(), [tmp_path, tmp_path / "gone"])
        assert info.value.errno == errno.ENOENT
    else:
        with InotifyHog(), pytest.raises(OSError) as info:
            start_observer(_Seen(), [tmp_path])
        assert info.value.errno == errno.EMFILE
    assert set(threading.enumerate()) == threads
    assert _inotify_descriptors() == descriptors

"""Starting a watchdog observer, which the system may refuse; for the daemon and the client.

Both use file events only as a hint and re-check the files on a timer, so a refused watch
only makes them slower.  It is refused for real on busy workstations: editors, language
servers and build tools share the per-user inotify limits (``fs.inotify.max_user_instances``,
``fs.inotify.max_user_watches``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

__all__ = ["hints", "start_observer", "stop_observer"]


def start_observer(
    handler: FileSystemEventHandler,
    directories: Iterable[os.PathLike[str] | str],
    *,
    event_filter: list[type[FileSystemEvent]] | None = None,
) -> BaseObserver:
    """A running observer calling ``handler`` for changes in each of ``directories`` (not below).

    Raises :class:`OSError` if the system refuses: watchdog's inotify observer takes its
    inotify instance when built (``EMFILE``, "inotify instance limit reached") and its watches
    when started (``ENOSPC``, "inotify watch limit reached").  :class:`RuntimeError` means it
    could not start its threads (a task limit).  A refused start leaves no thread and no
    descriptor behind, so the caller may simply try again later.
    """
    _quiet_watchdog_stop_race()
    observer = Observer()
    try:
        for directory in directories:
            observer.schedule(
                handler, os.fspath(directory), recursive=False, event_filter=event_filter
            )
        observer.daemon = True
        observer.start()
    except BaseException:
        stop_observer(observer)
        raise
    return observer


def stop_observer(observer: BaseObserver, timeout: float = 2) -> None:
    """Stop ``observer`` and its threads, and close its inotify instance.

    watchdog (7.x) closes the instance from its reader thread when that thread is reading; one
    stopped before it first read (a refused start, or a stop just after a start: about one
    in four) leaves the instance and its wake-up pipe open for the life of the process.  A
    daemon retrying a refused watch every few seconds used up its descriptors that way.
    """
    reader = getattr(observer, "_inotify_fd", None)  # watchdog's InotifyFD, if it made one
    pipe = _still_open_pipe(reader)
    with contextlib.suppress(Exception):
        observer.stop()
        if observer.is_alive():
            observer.join(timeout=timeout)
    if pipe is not None and reader is not None and not reader.is_alive():
        fd, inode = pipe
        # The pipe still being the one read before the stop (its inode is unique while it is
        # open) means the reader closed nothing; a number reused since is someone else's.
        if _still_open_pipe(reader) == (fd, inode):
            with contextlib.suppress(Exception):
                reader._close_resources()


def _still_open_pipe(reader: object) -> tuple[int, int] | None:
    """The reader's wake-up pipe (descriptor, inode) while it is open, else None."""
    fd = getattr(reader, "_kill_r", None)
    if not isinstance(fd, int) or not hasattr(reader, "_close_resources"):
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return (fd, info.st_ino) if stat.S_ISFIFO(info.st_mode) else None


class _StopRaceFilter(logging.Filter):
    # watchdog (7.x) logs an *error* when a file event arrives while an observer stops
    # ("queue_events() called when the thread is inactive"); nothing is wrong, and short-lived
    # observers stop often, so that one message is dropped.
    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


_stop_race_filter = _StopRaceFilter()


def _quiet_watchdog_stop_race() -> None:
    logger = logging.getLogger("watchdog.observers.inotify")
    if _stop_race_filter not in logger.filters:
        logger.addFilter(_stop_race_filter)


class _Fanout(FileSystemEventHandler):
    """Sets the event of every waiter on one directory."""

    def __init__(self) -> None:
        self.waiters: frozenset[threading.Event] = frozenset()  # replaced, never mutated

    def on_any_event(self, event: FileSystemEvent) -> None:
        for waiter in self.waiters:
            waiter.set()


class _Hints:
    """One watchdog observer for every wait of the process, started once, never stopped.

    An observer per wait (as before) cost three threads each time, and watchdog leaks an
    observer's inotify instance when it is stopped before its reader thread first reads
    (about one wait in 200 under load): a service making many waits ran out of the user's
    inotify instances (128 by default), for itself, the daemon and the user's editors alike.
    A directory's watch is dropped once nobody waits on it, so a deleted home keeps none.
    """

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of the parent's threads (its lock may even be held by one).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._observer: BaseObserver | None = None
        self._watches: dict[str, tuple[ObservedWatch, _Fanout]] = {}

    def add(self, directories: list[str], waiter: threading.Event) -> list[str]:
        """Watch ``directories`` for ``waiter``; the ones now watched (maybe none)."""
        watching: list[str] = []
        with self._lock:
            if self._observer is None or not self._observer.is_alive():
                self._observer, self._watches = None, {}
                try:
                    self._observer = start_observer(FileSystemEventHandler(), ())
                except (OSError, RuntimeError):
                    return []  # no thread to spare: polling only
            for directory in directories:
                entry = self._watches.get(directory)
                if entry is None:
                    fanout = _Fanout()
                    try:
                        watch = self._observer.schedule(fanout, directory, recursive=False)
                    except (OSError, RuntimeError):
                        continue  # the inotify limits, or the directory went away: polling
                    entry = self._watches[directory] = (watch, fanout)
                entry[1].waiters = entry[1].waiters | {waiter}
                watching.append(directory)
        return watching

    def remove(self, directories: list[str], waiter: threading.Event) -> None:
        with self._lock:
            for directory in directories:
                entry = self._watches.get(directory)
                if entry is None:
                    continue  # the observer was replaced meanwhile
                watch, fanout = entry
                fanout.waiters = fanout.waiters - {waiter}
                if not fanout.waiters and self._observer is not None:
                    del self._watches[directory]
                    with contextlib.suppress(Exception):  # its emitter died with its directory
                        self._observer.unschedule(watch)


hints = _Hints()

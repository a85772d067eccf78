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
from collections.abc import Iterable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

__all__ = ["start_observer"]


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
        # stop() also stops the thread that reads the inotify descriptor, and closes it.
        with contextlib.suppress(Exception):
            observer.stop()
            if observer.is_alive():
                observer.join(timeout=2)
        raise
    return observer


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

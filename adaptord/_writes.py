"""The daemon's deferred-durability writes: files synced in groups, a group-committed log.

``adaptor._durable`` makes every write durable before it returns (fsync of the file and of its
directory), which is right for anything acknowledged on its own.  The daemon's run files are
acknowledged together, by the verdict, so they are written plainly and synced in one batch
just before it (:func:`write_unsynced`, :func:`write_synced`, :func:`sync`), and its own
lifecycle log is written by one thread that commits whatever queued up meanwhile with one
write and one fsync (:class:`LifecycleLog`).

These are private to adaptord for now: the file primitives belong in ``adaptor._durable``
beside the others, and the batch append in ``hosttools.sessionrecorder`` (an
``EventRecorder.record_many``); other changes own those modules at the moment.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import orjson

from adaptor import events
from adaptor._durable import DurableLog
from hosttools import sessionrecorder as sr
from hosttools.sessionrecorder import _format

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Temporary names only need to be unique among this process's writers (O_EXCL refuses any
# clash, and the pid separates processes): a counter, not a random-number syscall per file.
_tmp_numbers = itertools.count()


def write_unsynced(path: Path, data: bytes) -> Path:
    """Replace ``path`` atomically (temporary sibling + rename), without any fsync.

    Readers see the old or the new content, never a mix, and a ``kill -9`` loses nothing (the
    page cache outlives the process); only a power loss can lose the file, until :func:`sync`.
    Returns ``path`` so the caller can remember it for that sync.
    """
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{next(_tmp_numbers)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError("write accepted no bytes")
                view = view[written:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_json_unsynced(path: Path, obj: object) -> Path:
    """:func:`write_unsynced` of ``obj`` in ``_durable.atomic_write_json``'s layout."""
    return write_unsynced(path, json_bytes(obj))


def write_synced(path: Path, data: bytes) -> Path:
    """Write ``path`` in place (created ``0o600`` or truncated) and fsync it; no rename.

    For files nobody reads before something written after them points at them (a run's side
    files and its verdict): a crash mid-write leaves a partial file that nothing refers to,
    and the next writer truncates it.  One open, one write, one fsync: the cheapest way to
    make new content durable.  The directory entry still needs :func:`sync` of its folder.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError("write accepted no bytes")
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def json_bytes(obj: object) -> bytes:
    """``obj`` in ``_durable.atomic_write_json``'s layout (sorted, indented, final newline)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE | orjson.OPT_INDENT_2)


def make_dir(path: Path) -> None:
    """``mkdir`` (``0o700``) without syncing the parent; :func:`sync` that parent later."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)


def sync(files: Iterable[Path], directories: Iterable[Path]) -> None:
    """Make files written by :func:`write_unsynced` and directory entries durable.

    Files first, then directories (a name must not become durable before its content).  A
    missing file is skipped (nothing to make durable); any other error is raised, and an
    fsync error is never retried (the kernel may have dropped the pages it failed to write).
    """
    for path in dict.fromkeys(files):
        try:
            fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in dict.fromkeys(directories):
        fd = os.open(directory, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class LifecycleLog:
    """``events/<session>.jsonl`` for the daemon's own facts, written by one background thread.

    :meth:`record` queues a fact and returns at once.  The writer lingers ``linger`` seconds
    after the first fact of a batch, so it stays off the path of the request that caused the
    fact (it would compete for the GIL) and more facts share the batch; then it appends the
    whole batch with one lock, one ``write`` and one fsync (group commit), and prints each
    fact's log line: whoever sees a line finds the record in the file.  Nothing is recovered
    from this log, so nobody waits for it; a power loss can lose the last facts not yet
    synced (the torn tail is repaired by the next append), never a request or a verdict.

    The file is the session recorder's (same records, same ``host_seq``, same lock file), so
    ``EventRecorder.since(session)``, ``adaptor events`` and ``verify-log`` read it as before;
    only the batching is ours.  ``EventRecorder`` has no batch append yet: this writes the
    recorder's own encoding through ``adaptor._durable.DurableLog.append_many``.
    """

    def __init__(
        self,
        directory: Path,
        session: str,
        *,
        emit: Callable[[str], None],
        on_error: Callable[[str, BaseException], None],
        linger: float = 0.005,
    ) -> None:
        sr.check_contained(session)
        self._path = directory / f"{session}{_format.SUFFIX}"
        self._log: DurableLog | None = None
        self._emit = emit
        self._on_error = on_error
        self._linger = linger
        self._pending: deque[tuple[events.Notice, str]] = deque()
        self._cond = threading.Condition()
        self._queued = 0
        self._done = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="adaptord-lifecycle", daemon=True)
        self._thread.start()

    def record(self, notice: events.Notice, line: str) -> None:
        """Queue ``notice`` for the log and ``line`` for stderr; never blocks on the disk."""
        with self._cond:
            self._pending.append((notice, line))
            self._queued += 1
            if len(self._pending) == 1:  # later facts join the lingering batch quietly
                self._cond.notify_all()

    def barrier(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is written, synced and its line printed."""
        with self._cond:
            target = self._queued
            self._cond.notify_all()  # cut the writer's linger short
            return self._cond.wait_for(lambda: self._done >= target or not self._thread.is_alive(), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, sync, stop the writer and close the file."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        log, self._log = self._log, None
        if log is not None:
            log.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if not self._closing and self._linger > 0:
                    self._cond.wait(self._linger)  # woken early only by close or a barrier
                batch = list(self._pending)
                self._pending.clear()
                if not batch and self._closing:
                    return
            self._append([notice for notice, _ in batch])
            for _, line in batch:
                self._emit(line)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _append(self, notices: list[events.Notice]) -> None:
        now = datetime.now(UTC)
        try:
            bodies = [_format.encode(sr.EventRecord(0, now, notice)) for notice in notices]
            if self._log is None:
                self._log = DurableLog(self._path, seq_key=_format.SEQ_KEY, version=_format.FORMAT_VERSION)
            self._log.append_many(bodies)
        except Exception as exc:  # the audit log must never take the daemon down
            # A DurableLog that failed may refuse every later append (a failed fsync makes it
            # suspect); the next batch starts afresh, re-checking the file's tail first.
            log, self._log = self._log, None
            if log is not None:
                with contextlib.suppress(Exception):
                    log.close()
            self._on_error("audit log write failed", exc)

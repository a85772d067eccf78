"""The daemon's deferred-durability writes: files synced in groups, a group-committed log.

``adaptor._durable`` makes every write durable before it returns (fsync of the file and of its
directory), which is right for anything acknowledged on its own.  The daemon's run files are
acknowledged together, by the verdict, so they are written plainly and synced in one batch
just before it (:func:`write_unsynced`, :func:`sync`), and its own lifecycle log is written by
one thread that commits whatever queued up meanwhile with one fsync (:class:`LifecycleLog`).

These are private to adaptord for now; they belong in ``adaptor._durable`` beside the other
primitives (another change owns that module at the moment).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from adaptor import events
from hosttools import sessionrecorder as sr

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def write_unsynced(path: Path, data: bytes) -> Path:
    """Replace ``path`` atomically (temporary sibling + rename), without any fsync.

    Readers see the old or the new content, never a mix, and a ``kill -9`` loses nothing (the
    page cache outlives the process); only a power loss can lose the file, until :func:`sync`.
    Returns ``path`` so the caller can remember it for that sync.
    """
    tmp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(8)}")
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

    :meth:`record` queues a fact and returns at once.  The writer appends each queued fact as
    it comes (one ``write`` each, so ``tail -f`` shows it), then makes the whole batch durable
    with one fsync (group commit), then prints each fact's log line: whoever sees a line finds
    the record in the file.  Nothing is recovered from this log, so nobody waits for it; a
    power loss can lose the last facts not yet synced (the torn tail is repaired by the next
    append), never a request or a verdict.
    """

    def __init__(
        self,
        directory: Path,
        session: str,
        *,
        key_validator: Callable[[str], None],
        emit: Callable[[str], None],
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self._backend = sr.JSONLEventBackend(directory, sync_on_append=False)
        self._recorder = sr.EventRecorder(self._backend, key_validator=key_validator)
        self._session = session
        self._emit = emit
        self._on_error = on_error
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
            self._cond.notify_all()

    def barrier(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is written, synced and its line printed."""
        with self._cond:
            target = self._queued
            return self._cond.wait_for(lambda: self._done >= target or not self._thread.is_alive(), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, sync, stop the writer and close the file."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        self._recorder.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                batch = list(self._pending)
                self._pending.clear()
                if not batch and self._closing:
                    return
            for notice, _ in batch:
                try:
                    self._recorder.record(self._session, notice)
                except Exception as exc:  # the audit log must never take the daemon down
                    self._on_error("audit log write failed", exc)
            try:
                self._backend.flush()
            except Exception as exc:
                self._on_error("audit log sync failed", exc)
            for _, line in batch:
                self._emit(line)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

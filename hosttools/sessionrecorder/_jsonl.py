"""``JSONLEventBackend``: one durable, human-readable log file per session key."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NoReturn

import orjson

from adaptor._durable import (
    SHRANK,
    CorruptLogError,
    DurableLog,
    RepairReport,
    ensure_dir,
    exclusive,
    open_regular,
    touch_epoch,
)

from . import _format
from ._format import SEQ_KEY, SUFFIX, StrPath
from ._model import (
    EventRecord,
    InvalidSessionKeyError,
    JSONLEventBackendClosedError,
    JSONLEventLogCorruptError,
    SessionInfo,
    check_contained,
    make_record,
)

_log = logging.getLogger("hosttools.sessionrecorder")


class _Retired(Exception):
    """The session object was evicted between lookup and use; look the key up again."""


@dataclass(frozen=True)
class _Failure:
    """An exception kept to be raised again later, with the traceback of its first raise."""

    error: BaseException
    traceback: TracebackType | None

    @classmethod
    def of(cls, error: BaseException) -> _Failure:
        return cls(error, error.__traceback__)

    def raise_(self) -> NoReturn:
        # Re-raising one object repeatedly would chain every raise site onto its traceback.
        raise self.error.with_traceback(self.traceback)


class _Pending:
    """One record waiting to be written; ``wake`` is held by its caller while it waits."""

    __slots__ = ("body", "failure", "wake", "writer", "written")

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.writer = threading.get_ident()
        self.written: dict[str, Any] | None = None
        self.failure: _Failure | None = None
        self.wake: threading.Lock | None = None

    @property
    def done(self) -> bool:
        return self.written is not None or self.failure is not None

    def result(self) -> dict[str, Any]:
        if self.failure is not None:
            self.failure.raise_()
        assert self.written is not None
        return self.written


def _size(path: str) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except FileNotFoundError:
        return 0


def _open_for_sync(path: str) -> int:
    return open_regular(path, os.O_RDONLY)[0]


# How many batches a writer may commit for others after its own before it steps down (so its
# own caller is not kept waiting indefinitely while others keep appending).
_BATCHES_PER_LEADER = 8

# The longest a leader waits for the writers of the previous batch to queue again (below).
_GATHER_MAX = 0.005


@dataclass(eq=False)
class _Session:
    """Per-key writer state: group commit, the open log, and poison.

    An append that finds the key idle, nobody queued and no gathering due (below) writes its
    record alone (:meth:`_append_alone`), and writers that queue meanwhile are woken when it is
    done.  Otherwise the append that finds the key idle becomes the *leader*: it writes its
    record, then whatever queued meanwhile, one write and one sync per batch (group commit), so
    concurrent writers to a key share syncs.  Waiting writers sleep on a lock of their own,
    released once their record is durable (or failed), so a commit wakes exactly the writers it
    finished and nobody fights over a shared condition.  After :data:`_BATCHES_PER_LEADER` batches the
    leader steps down and wakes the queued writers, and one of them takes over.

    With syncing on, and once a synced batch held records of several threads, a leader first
    waits for the threads of the last two batches to queue again (at most one sync's duration,
    never over :data:`_GATHER_MAX`).  Without that wait, writers just woken come back while the
    next sync runs, so they split into two cohorts that alternate, each paying a sync of its
    own.  Records made one at a time never wait, whichever threads make them.
    """

    key: str
    path: str
    sync: bool
    _mutex: threading.Lock = field(default_factory=threading.Lock)
    # Signalled when the leader steps down; flush and shutdown wait on it.
    _idle: threading.Condition = field(init=False)
    _idle_waiters: int = 0
    _queue: list[_Pending] = field(default_factory=list)
    _writing: bool = False
    # Group commit's gathering: the threads of the last two synced batches, how long the last
    # one of several records took to write and sync, and how many queued records the waiting
    # leader wants (0: none).  A batch holds one record per thread.
    _arrived: threading.Condition = field(init=False)
    _last_writers: tuple[int, ...] = ()
    _writers_before: tuple[int, ...] = ()
    _last_sync: float = 0.0
    _gather_for: int = 0
    _state: Literal["open", "retired", "closed"] = "open"
    _log: DurableLog | None = None
    # Buffered mode only: opened right after the first append so a later write-back error is
    # reported to it (an fd opened after the error would never see it).
    _sync_fd: int | None = None
    _sync_file: tuple[int, int] | None = None  # (st_dev, st_ino) of _sync_fd
    _dirty: bool = False
    # Buffered mode: where this key's lines written since its last good sync begin and end in
    # the file; the start is None once another writer's lines sit between them (then they
    # cannot be cut away alone, see _roll_back_unsynced).
    _unsynced_from: int | None = None
    _unsynced_end: int = -1
    poison: _Failure | None = None
    # A failed sync nobody could be told of when it happened (an eviction's), its lines cut
    # away: raised once, to the key's next append or flush.
    owed: _Failure | None = None
    # The backend's list, shared by all its sessions so evicting one loses nothing.
    repairs: list[RepairReport] = field(default_factory=list)
    last_used: int = 0
    # The backend's way to have its other idle sessions close their files (returns how many
    # did), for when this process runs out of descriptors.
    free_descriptors: Callable[[_Session], int] | None = None
    lock_path: str = field(init=False)

    def __post_init__(self) -> None:
        self._idle = threading.Condition(self._mutex)
        self._arrived = threading.Condition(self._mutex)
        self.lock_path = self.path + ".lock"

    def check_poison(self) -> None:
        if self.poison is not None:
            self.poison.raise_()

    def _pay_owed(self) -> None:
        # Called holding the mutex, so the failure is reported exactly once.
        owed, self.owed = self.owed, None
        if owed is not None:
            owed.raise_()

    # --- appending --------------------------------------------------------------------------

    def append(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._mutex:
            if self._state != "open" or self.poison is not None or self.owed is not None:
                self._refuse()
            pending = None
            if self._writing:
                pending = _Pending(body)
                wake = pending.wake = threading.Lock()
                wake.acquire()
                self._queue.append(pending)
                if self._gather_for and len(self._queue) >= self._gather_for:
                    self._arrived.notify()
            else:
                self._writing = True
                wake = None
                # Normally empty; after a step-down its writers may not have woken yet.
                if self._queue or (self.sync and len(self._last_writers) > 1):
                    pending = _Pending(body)
                    batch = [pending, *self._queue]
                    self._queue = []
        if pending is None:
            return self._append_alone(body)
        if wake is not None:
            batch = self._await_turn(pending, wake)
            if not batch:
                return pending.result()
        self._lead(batch, pending)
        return pending.result()

    def _append_alone(self, body: dict[str, Any]) -> dict[str, Any]:
        """Write ``body`` as a batch of its own: the key was idle, nobody queued, nobody to
        gather.  The one-writer case, without what sharing a sync needs (a pending record, a
        batch, the leader's loop)."""
        try:
            return self._append_many((body,))[0]
        finally:
            with self._mutex:
                if self.sync:
                    self._writers_before, self._last_writers = self._last_writers, (threading.get_ident(),)
                self._step_down(())

    def _refuse(self) -> NoReturn:
        if self._state == "retired":
            raise _Retired
        if self._state == "closed":
            raise JSONLEventBackendClosedError()
        self.check_poison()
        self._pay_owed()
        raise AssertionError("_refuse() called on an appendable session")

    def _await_turn(self, pending: _Pending, wake: threading.Lock) -> list[_Pending]:
        """Sleep until ``pending`` is finished (``[]``) or this caller must lead (the batch)."""
        while True:
            wake.acquire()
            # Whoever released the lock finished the record first: no mutex needed to see it.
            if pending.done:
                return []
            with self._mutex:
                if pending.done:
                    return []
                if not self._writing:
                    # The leader stepped down; our record is still queued.
                    self._writing = True
                    self._queue.remove(pending)
                    batch, self._queue = [pending, *self._queue], []
                    return batch
            # Another woken writer took over first; keep waiting for it.

    def _lead(self, batch: list[_Pending], own: _Pending) -> None:
        rounds = 0
        leading = True
        try:
            while True:
                if self.sync:
                    if len(self._last_writers) > 1:
                        batch = self._gather(batch, own)
                    if len(batch) > 1:
                        started = time.monotonic()
                        self._write_batch(batch)
                        self._last_sync = time.monotonic() - started
                    else:  # (one writer's path: nothing to time, no wait will follow)
                        self._write_batch(batch)
                    self._writers_before = self._last_writers
                    self._last_writers = tuple([pending.writer for pending in batch])
                else:
                    self._write_batch(batch)
                rounds += 1
                with self._mutex:
                    following, self._queue = self._queue, []
                    if following and rounds < _BATCHES_PER_LEADER:
                        # Under the mutex, so a lock is only ever released by its holder.
                        for pending in batch:
                            _signal(pending)
                        batch = following
                        continue
                    self._queue = following
                    leading = False
                    self._step_down(batch)
                    return
        finally:
            if leading:  # interrupted (KeyboardInterrupt and the like): let others go on
                with self._mutex:
                    unwritten = [p for p in batch if not p.done and p is not own]
                    self._queue = unwritten + self._queue
                    self._step_down(batch)

    def _gather(self, batch: list[_Pending], own: _Pending) -> list[_Pending]:
        """``batch`` and what queues while it waits (bounded) for the recent writers' return."""
        recent = {*self._last_writers, *self._writers_before}
        # The leader's own thread comes back only once it stops leading.
        expected = len(recent) - (own.writer in recent) + (own in batch)
        if len(batch) >= expected:
            return batch
        deadline = time.monotonic() + min(self._last_sync, _GATHER_MAX)
        with self._mutex:
            self._gather_for = expected - len(batch)
            try:
                while len(self._queue) < self._gather_for:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._arrived.wait(remaining)
            finally:
                self._gather_for = 0
            batch, self._queue = [*batch, *self._queue], []
        return batch

    def _step_down(self, finished: Sequence[_Pending]) -> None:
        # Called holding the mutex: wake the writers just served, and those still queued so
        # that one of them takes over.
        self._writing = False
        for pending in finished:
            _signal(pending)
        for pending in self._queue:
            _signal(pending)
        if self._idle_waiters:
            self._idle.notify_all()

    def _write_batch(self, batch: list[_Pending]) -> None:
        try:
            written = self._append_many([p.body for p in batch])
        except orjson.JSONEncodeError as exc:
            # DurableLog serializes the whole batch before writing any of it, so nothing was
            # written; one event that cannot be serialized must not fail those queued with it.
            good: list[_Pending] = []
            for pending in batch:
                try:
                    orjson.dumps(pending.body, option=orjson.OPT_SORT_KEYS)
                except orjson.JSONEncodeError as own:
                    pending.failure = _Failure.of(own)
                else:
                    good.append(pending)
            if len(good) == len(batch):  # not reproducible one by one: fail them all
                failure = _Failure.of(exc)
                for pending in batch:
                    pending.failure = failure
            elif good:
                self._write_batch(good)
        except BaseException as exc:
            failure = _Failure.of(exc)
            for pending in batch:
                pending.failure = failure
        else:
            for pending, record in zip(batch, written, strict=True):
                pending.written = record

    def _append_many(self, bodies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.check_poison()
        if self._log is None:
            self._log = DurableLog(
                self.path, seq_key=SEQ_KEY, version=_format.FORMAT_VERSION, sync=self.sync
            )
        log = self._log
        # Only this session appends through ``log``, one batch at a time, so the repairs
        # counted here are the ones this append made.
        known_repairs = log.repair_count
        try:
            try:
                written = log.append_many(bodies)
            except OSError as exc:
                if not self._freed_descriptors(exc):
                    raise
                written = log.append_many(bodies)
        except CorruptLogError as exc:
            self._drop_log()
            try:
                raise JSONLEventLogCorruptError(self.key, exc.line, why=exc.why) from exc
            except JSONLEventLogCorruptError as error:
                if exc.why == SHRANK:
                    # Kept for every later call on the key: the shrunk log reads as whole, and
                    # the next writer went on from its last record, handing out the sequence
                    # numbers this backend had acknowledged again.
                    self.poison = _Failure.of(error)
                raise
        except OSError as exc:
            # The flock still lingers from the failed append, so checking the rollback under
            # it normally sees the file as that append left it; if another writer got in
            # between, the size check fails and the key is poisoned: never wrongly cleared.
            with exclusive(self.lock_path, linger=True):
                cut = log.repaired[known_repairs:]
                self.repairs.extend(cut)
                # The size DurableLog found under the lock before touching the file; when it
                # failed before looking, it had not touched the file, so the size now is it.
                before = log.found_size if log.found_size >= 0 else _size(self.path)
                self._drop_log()
                # Errors naming a path come from open/stat/mkdir, before DurableLog writes a
                # byte; only descriptor-level failures (write, fsync, truncate) can leave
                # something behind to roll back.
                if exc.filename is None:
                    self._settle_rollback(exc, cut[-1].offset if cut else before)
            raise
        if log.repair_count != known_repairs:
            self.repairs.extend(log.repaired[known_repairs:])
        if not self.sync:
            if self._sync_fd is not None and self._sync_file != log.file_id:
                # The append went to another file (the log was replaced, moved away or
                # deleted): syncing the old one from now on would leave these lines unsynced
                # while flush() said they were durable.
                self._follow_the_log()
            if not self._dirty:
                self._unsynced_from = log.appended_at
            elif log.appended_at != self._unsynced_end:
                self._unsynced_from = None
            self._unsynced_end = log.size
            self._dirty = True
            if self._sync_fd is None:
                try:
                    # The very file this append wrote to, not the path's file of a moment later.
                    try:
                        self._sync_fd = log.duplicate_descriptor()
                    except OSError as exc:
                        if not self._freed_descriptors(exc, None):
                            raise
                        self._sync_fd = log.duplicate_descriptor()
                    self._sync_file = log.file_id
                except OSError as exc:
                    # The record is written (and must be reported as such), but this key's
                    # buffered data can no longer be made durable: say so from now on.
                    self.poison = _Failure.of(exc)
        return written

    def _follow_the_log(self) -> None:
        """Sync what this key wrote to the file it wrote to before, and sync the log's new
        file from now on (opened by the caller)."""
        fd, self._sync_fd, self._sync_file = self._sync_fd, None, None
        assert fd is not None
        try:
            if self._dirty:
                # Those lines were acknowledged; the file holding them is no longer the key's
                # log, so a failure cannot be cut away there: it poisons the key.
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self.poison = _Failure.of(exc)
                self._dirty = False
        finally:
            os.close(fd)

    def _freed_descriptors(self, error: OSError, *opened: str | None) -> bool:
        """Whether ``error`` is this process out of descriptors when opening the log, its lock
        or its directory (so nothing was written; ``None``: duplicating one), and other
        sessions have now closed some of theirs."""
        return (
            error.errno in (errno.EMFILE, errno.ENFILE)
            and error.filename in (opened or (self.path, self.lock_path, os.path.dirname(self.path)))
            and self.free_descriptors is not None
            and self.free_descriptors(self) > 0
        )

    def _settle_rollback(self, error: OSError, expected_size: int) -> None:
        """After a failed append: poison the key unless the file is back to its old size, durably.

        DurableLog truncates a failed append away; whether that worked is read off the file
        rather than trusted, and the truncation is synced so a crash cannot resurrect the
        unacknowledged record.  A DurableLog that saw a failed fsync refuses to append again,
        so the next append gets a fresh instance, which re-checks the tail first.
        """
        try:
            if _size(self.path) != expected_size:
                raise OSError(errno.EIO, "rollback did not restore the previous size")
            if os.path.lexists(self.path):
                fd = _open_for_sync(self.path)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError:
            self.poison = _Failure.of(error)

    def _drop_log(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            log.close()

    # --- syncing and closing ----------------------------------------------------------------

    def flush(self) -> None:
        """Make buffered appends durable; a failure cuts them (or poisons the key) and raises."""
        with self._mutex:
            self._wait_idle()
            self._flush_locked()

    def _flush_locked(self) -> None:
        self.check_poison()
        if self._dirty and self._sync_fd is not None:
            try:
                os.fsync(self._sync_fd)
            except OSError as exc:
                # Never retried: the kernel may have dropped the dirty pages while reporting
                # the error once, so a second fsync could "succeed" without the data.
                self._roll_back_unsynced(exc)
                raise
            self._dirty = False
        # After the sync, so what was written since the earlier failure is durable all the same.
        self._pay_owed()

    def _roll_back_unsynced(self, error: OSError) -> None:
        """After a failed sync: cut this key's lines written since its last good sync, or
        poison the key.

        Those lines may never reach the disk (the kernel may have dropped them while reporting
        the error once) and may even vanish from the page cache later, leaving a hole before
        whatever is appended after them: corruption, which no reader skips.  Cut, the file ends where this key's last good sync left it and the
        key goes on, like a synced append whose fsync failed (:meth:`_settle_rollback`); the
        next append checks the tail afresh.  Only a run of this key's own lines reaching the
        end of the file is cut: with another writer's lines among or after them, the key is
        poisoned instead.
        """
        start, end = self._unsynced_from, self._unsynced_end
        self._drop_log()
        if start is not None and self._cut(start, end):
            self._dirty = False
        else:
            self.poison = _Failure.of(error)

    def _cut(self, start: int, end: int) -> bool:
        """Truncate the file from ``start``, durably, if it still ends at ``end``."""
        assert self._sync_fd is not None
        try:
            with exclusive(self.lock_path, linger=True):
                # Not a plain open: one for writing waits on a FIFO until a reader comes.
                fd, _ = open_regular(self.path, os.O_WRONLY)
                try:
                    found = os.fstat(fd)
                    if found.st_size != end or not os.path.samestat(found, os.fstat(self._sync_fd)):
                        return False
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                touch_epoch(self.lock_path)  # other logs of this process look at the file again
        except OSError:
            return False
        return True

    def _wait_idle(self) -> None:
        # Called holding the mutex.
        self._idle_waiters += 1
        try:
            while self._writing:
                self._idle.wait()
        finally:
            self._idle_waiters -= 1

    def try_retire(self) -> bool:
        """Stop this object taking appends if it is idle; the caller must then :meth:`release`.

        A poisoned key, or one owing a failure, retires too: its descriptors go, and the
        failure passes to the key's next session (see ``JSONLEventBackend._retire``).  Kept
        open, such keys held their descriptors for good, so a process short of descriptors,
        whose shortage had poisoned them, stayed short.
        """
        with self._mutex:
            if self._writing or self._queue or self._state != "open":
                return False
            self._state = "retired"
            return True

    def release(self) -> None:
        """Sync and close the file descriptors of a retired or closed session."""
        with self._mutex:
            try:
                self._flush_locked()
            finally:
                self._drop_log()
                if self._sync_fd is not None:
                    fd, self._sync_fd = self._sync_fd, None
                    os.close(fd)

    def shutdown(self) -> None:
        with self._mutex:
            self._wait_idle()
            self._state = "closed"
            closed = _Failure.of(JSONLEventBackendClosedError())
            for pending in self._queue:
                pending.failure = closed
                _signal(pending)
            self._queue.clear()
        self.release()


def _signal(pending: _Pending) -> None:
    # Callers hold the session's mutex, so no two release one lock.  An unlocked wake lock
    # has a signal its waiter has not picked up yet; a second would be lost anyway.
    wake = pending.wake
    if wake is not None and wake.locked():
        wake.release()


class JSONLEventBackend:
    """Events stored as ``<directory>/<key>.jsonl``, one framed record per line.

    ``host_seq`` is the log's own sequence number, allocated under the file's lock, so any
    number of backends in any number of processes may append to one key and the log stays
    1, 2, 3, ...  Every append is written with a single ``write`` (``tail -f`` sees it at once)
    and, with ``sync_on_append`` (the default), fsynced before it returns.  Without it appends
    are synced by :meth:`flush` and :meth:`close`.

    Concurrent appends to one key from threads of this process are group-committed: one write
    and one fsync per batch, each caller still returns only once its record is durable.

    At most ``max_open_files`` sessions keep their files open; the least recently used idle
    ones are closed (and reopened on demand), so a long-lived process with many sessions does
    not run out of descriptors.

    The directory (and missing parents, mode ``0o700``) is created on the first append; files
    are ``0o600``.  Keys must name a file inside the directory (:func:`check_contained`),
    whatever validator the recorder uses.
    """

    def __init__(
        self,
        directory: StrPath,
        sync_on_append: bool = True,
        *,
        max_open_files: int = 64,
    ) -> None:
        # Truthiness would read sync_on_append="no" as yes; "3" failed as "'<' not supported".
        if not isinstance(sync_on_append, bool):
            raise TypeError(f"sync_on_append must be True or False, not {type(sync_on_append).__name__}")
        if isinstance(max_open_files, bool) or not isinstance(max_open_files, int):
            raise TypeError(f"max_open_files must be an int, not {type(max_open_files).__name__}")
        if max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        if isinstance(os.fspath(directory), bytes):
            # Said now: the first append failed with "Can't mix strings and bytes".
            raise TypeError("directory must be a str or a str path, not bytes")
        if not os.fspath(directory):
            # (An unset variable's "" was the current directory: logs where the program ran.)
            raise ValueError("directory is empty; name the folder the logs go to")
        self._directory = os.path.abspath(os.fspath(directory))
        if os.path.lexists(self._directory) and not os.path.isdir(self._directory):
            # Fail now rather than on the first append, possibly hours into a daemon's life.
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", self._directory)
        self._sync = sync_on_append
        self._max_open = max_open_files
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        # Recency for eviction, stamped without the lock (an approximate order is enough).
        self._use_counter = itertools.count()
        self._repairs: list[RepairReport] = []
        self._dir_ready = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._close_failure: _Failure | None = None

    def __repr__(self) -> str:
        return f"JSONLEventBackend({self._directory!r}, sync_on_append={self._sync})"

    @property
    def directory(self) -> Path:
        return Path(self._directory)

    def path_for(self, key: str) -> Path:
        """The log file of ``key`` (raises :class:`InvalidSessionKeyError` for a bad key, and,
        as every operation, :class:`JSONLEventBackendClosedError` once closed)."""
        with self._lock:
            self._check_open()
        return Path(self._path(key))

    def _path(self, key: str) -> str:
        check_contained(key)
        # Plain strings: this runs on every append, and pathlib's parsing is not free.
        return os.path.join(self._directory, key + SUFFIX)

    @property
    def repairs(self) -> list[RepairReport]:
        """Torn tails (crash artifacts) this backend cut before appending, oldest first."""
        return list(self._repairs)

    @property
    def repair_count(self) -> int:
        """``len(self.repairs)`` without copying the list (to look after every append)."""
        return len(self._repairs)

    # --- the EventBackend protocol ----------------------------------------------------------

    def load(self, key: str) -> Generator[EventRecord, None, None]:
        """Stream ``key``'s records, strictly validated; nothing for a key never recorded.

        The key, the closed state and poison are checked at the call; the file is read lazily,
        up to its size when iteration starts.
        """
        path = self._path(key)
        with self._lock:
            self._check_open()
            session = self._sessions.get(key)
        if session is not None:
            session.check_poison()
        return _format.load(path, key)

    def append(self, key: str, record: EventRecord) -> EventRecord:
        """Append ``record`` (its ``host_seq`` must be 0) and return it with its ``host_seq``."""
        # A key with a live session was validated when the session was made; looking the
        # session up first saves re-validating and re-joining the path on every append.
        session = self._sessions.get(key) if type(key) is str and not self._closed else None
        path = session.path if session is not None else self._path(key)
        if record.host_seq != 0:
            raise ValueError(f"the backend allocates host_seq; pass 0, not {record.host_seq}")
        # Serialization work stays outside every lock.
        body = _format.encode(record)
        while True:
            if session is None:
                session = self._session(key, path)
            else:
                # Without the backend's lock: a session closed or evicted meanwhile refuses
                # the append itself (closed, or _Retired: look it up again).
                session.last_used = next(self._use_counter)
            try:
                written = session.append(body)
            except _Retired:
                session = None
                continue
            if len(self._sessions) > self._max_open:
                self._evict_idle(keep=session)
            return make_record(written[SEQ_KEY], record.recorded_at, record.event)

    def sessions(self) -> list[SessionInfo]:
        """Every key with at least one record, from each file's tail (no full replay).

        A key whose log cannot be read (corrupt, or an ``OSError``) is left out with a warning
        on the ``hosttools.sessionrecorder`` logger; reading it (:meth:`load`) raises the error.
        """
        with self._lock:
            self._check_open()
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            return []
        infos: list[SessionInfo] = []
        for entry in entries:
            if not entry.name.endswith(SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            key = entry.name[: -len(SUFFIX)]
            try:
                check_contained(key)
            except InvalidSessionKeyError:
                continue
            last = _last_record_or_warn(entry.path, key)
            if last is not None:
                infos.append(SessionInfo(key, last[0], last[1]))
        return infos

    def flush(self, *keys: str) -> None:
        """Sync appends made with ``sync_on_append=False``; a no-op otherwise.

        With ``keys``, only those keys' appends (a key this backend has not written is
        skipped); without, every key's.  Naming the key a caller is done with spares it
        visiting every open session and waiting on other threads' writes to other keys.
        """
        sessions = self._open_sessions(keys)
        _raise_all([_attempt(session.flush) for session in sessions], "flushing event logs")

    def close_idle(self, *keys: str) -> int:
        """Sync and close the files of keys no thread is appending to; returns how many.

        With ``keys``, only those keys'; without, every idle key's.  A closed key opens its
        file again on its next append.  For a process that is done with a key (a daemon after
        a request's verdict) or short of descriptors; this backend also does it by itself when
        opening a log fails for want of descriptors.  A failed sync is not raised here: the
        key's next append or flush reports it once, as after an eviction (every later use,
        when the key is poisoned; see :meth:`_Session._roll_back_unsynced`).
        """
        return self._retire(self._open_sessions(keys))

    def _open_sessions(self, keys: Sequence[str]) -> list[_Session]:
        """The sessions of ``keys`` this backend has (every one without keys)."""
        for key in keys:
            if not isinstance(key, str):
                # flush(("a", "b")) for flush("a", "b"): skipped as a key never written, it
                # synced nothing and said nothing.
                raise TypeError(f"a session key is a str, not {type(key).__name__} (pass keys as separate arguments)")
        with self._lock:
            self._check_open()
            if keys:
                return [s for s in map(self._sessions.get, keys) if s is not None]
            return list(self._sessions.values())

    def close(self) -> None:
        """Sync, close every file and refuse further use.  Idempotent.

        Raises what went wrong (a failed sync, a poisoned key) to this and every later caller.
        """
        with self._close_lock:
            with self._lock:
                first = not self._closed
                self._closed = True
                sessions = sorted(self._sessions.values(), key=lambda s: s.key)
            if first:
                errors = [_attempt(session.shutdown) for session in sessions]
                try:
                    _raise_all(errors, "closing event backend")
                except BaseException as exc:
                    self._close_failure = _Failure.of(exc)
            if self._close_failure is not None:
                self._close_failure.raise_()

    def __enter__(self) -> JSONLEventBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise JSONLEventBackendClosedError(f"{self!r} is closed")

    def _session(self, key: str, path: str) -> _Session:
        with self._lock:
            self._check_open()
            if not self._dir_ready:
                # Here rather than in __init__: a rejected key or a read must create nothing.
                ensure_dir(self._directory)
                self._dir_ready = True
            session = self._sessions.get(key)
            if session is None:
                session = self._new_session(key, path)
                self._sessions[key] = session
            session.last_used = next(self._use_counter)
            return session

    def _new_session(self, key: str, path: str) -> _Session:
        return _Session(
            key, path, self._sync, repairs=self._repairs, free_descriptors=self._free_for
        )

    def _free_for(self, session: _Session) -> int:
        with self._lock:
            candidates = list(self._sessions.values())
        return self._retire(candidates, keep=session)

    def _evict_idle(self, keep: _Session) -> None:
        if len(self._sessions) <= self._max_open:
            return  # the common case, checked without the lock: eviction is best effort
        with self._lock:
            excess = len(self._sessions) - self._max_open
            oldest = sorted(self._sessions.values(), key=_last_used)
        self._retire(oldest, keep=keep, limit=excess)

    def _retire(
        self, candidates: Sequence[_Session], *, keep: _Session | None = None, limit: int = -1
    ) -> int:
        """Sync and close the files of up to ``limit`` (-1: all) idle ``candidates``; how many.

        A retired session leaves the table; its key gets a fresh one on its next use.
        """
        retired: list[_Session] = []
        with self._lock:
            for session in candidates:
                if len(retired) == limit:
                    break
                if (
                    session is not keep
                    and self._sessions.get(session.key) is session
                    and session.try_retire()
                ):
                    del self._sessions[session.key]
                    retired.append(session)
        for session in retired:
            try:
                session.release()
            except Exception as exc:  # an OSError, or a poisoned key's own failure
                # The key's buffered lines were cut (or, when they could not be, may be lost):
                # whoever writes the key next must hear it, once (for good when poisoned).
                with self._lock:
                    current = self._sessions.setdefault(
                        session.key, self._new_session(session.key, session.path)
                    )
                    if session.poison is not None:
                        current.poison = session.poison
                    else:
                        current.owed = _Failure.of(exc)
        return len(retired)


def _last_record_or_warn(path: str, key: str) -> tuple[int, datetime] | None:
    """:func:`_format.last_record`, or None with a warning when the log cannot be read.

    One damaged or unreadable log must not hide every other session from a listing.  The
    warning names the key, the line and the reason, never the events' content.
    """
    try:
        return _format.last_record(path, key)
    except JSONLEventLogCorruptError as exc:
        _log.warning(
            "sessions: left out %r: its event log is corrupt at line %d: %s",
            key,
            exc.line,
            exc.why,
        )
    except OSError as exc:
        _log.warning("sessions: left out %r: its event log cannot be read: %s", key, exc)
    return None


def _last_used(session: _Session) -> int:
    return session.last_used


def _attempt(step: Any) -> BaseException | None:
    try:
        step()
    except Exception as exc:
        return exc
    return None


def _raise_all(errors: list[BaseException | None], what: str) -> None:
    found = [error for error in errors if error is not None]
    if len(found) == 1:
        raise found[0]
    if found:
        raise ExceptionGroup(what, [e for e in found if isinstance(e, Exception)])

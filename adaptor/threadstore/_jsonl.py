"""The durable thread store: one snapshot plus one append-only framed log, under one lock.

Layout of ``directory`` (``0700``; every file ``0600``)::

    store.lock            flock held for every operation, by every process and thread
    snapshot.json         the whole state as of the start of the current log (indented JSON)
    log-000007.jsonl      every change since that snapshot, one event per line
    log-000007.jsonl.lock left by versions that took a second lock for appends (unused)

``snapshot.json`` names the log it continues (``"generation": 7, "log": "log-000007.jsonl"``);
a store that has never compacted has no snapshot and generation 1.  Keys, record ids and lease
targets only ever appear *inside* JSON, never in a file name, so any opaque string works and
none can reach outside the directory.  Read it with ``jq . snapshot.json`` and
``jq -c . log-*.jsonl``.

Why this is atomic.  Every operation runs under ``store.lock`` and first brings this process's
in-memory state up to date (reload the snapshot if the file was replaced, then read the log
lines it has not seen).  A mutation is planned against that state (:mod:`._state`) and becomes
exactly one framed line (``v``, ``seq``, ``crc``), appended with one ``write``.  So a finalize
that saves the new record, archives the previous one and rebinds the key is one line: after a
``kill -9`` it is either whole (CRC and newline intact) or a torn tail, which readers ignore and
the next writer truncates.  Lease checks and the append happen in the same critical section,
which is what makes finalize a compare-and-swap.

Durability.  A finalize (and a grant that reserves generations, see :mod:`._state`) is
acknowledged only after ``fdatasync``.  Other lease events (grants within the reservation,
renewals, releases) are written but not synced: a ``kill -9`` loses nothing that reached the
page cache, and whatever loses the page cache is a reboot, which expires every lease through
the boot id anyway.  Such lines carry ``"boot"``, the boot id they were written under.  An
``fdatasync`` flushes every earlier line of the file too, so a power cut can only damage the
suffix after the last synced line, and that suffix is nothing but unsynced lease events of the
previous boot.  That is how the reader tells the damage from corruption: a bad line counts as
a crash artifact when every line after it is bad or an unsynced lease event stamped with
another boot, and none of those says (``"synced"``: the bytes of the log its writer knew to be
on disk) that the bad line was synced before it was written; the next writer truncates from
the bad line on (those leases were dead anyway).  Anything else before the last line is
corruption, as before.  See ``docs/storage.md``.

Locking.  ``store.lock`` lingers (:func:`adaptor._durable.exclusive`): a process that works
on the store again within a few milliseconds does not take the flock again, and the log's
appends re-enter that same lock.  A busy process gives it away between its cycles, not within
a lease (renew, finalize and release hold it ``continuing``), where the others would only find
the leased key busy.  While another process holds it, a waiting instance reads
ahead between its polls: it applies the lines appended so far, so that taking the lock back
costs it only the last few lines instead of everything the holder wrote in its turn.  Lines
read without the lock are compared byte for byte with the file once the lock is taken (a
writer whose write or sync failed truncates its line again), and a mismatch reloads the
store from its files.

Compaction.  Once the log holds more lines than the state has entries (and at least
``1024``), the next generation's log is made (empty) and the state is written to
``snapshot.json`` with :func:`atomic_write_json` naming it (``"log_made": true``: a reader
then takes that log missing for damage), and only then are older logs deleted.  Replacing the snapshot is the single
commit point: a crash before it leaves the old snapshot and its complete log; after it, the new
snapshot is complete and the old log is garbage that the next compaction removes.  Resolve
therefore never reads more than one compaction interval of lines.  Other processes notice a
replaced snapshot because each keeps the snapshot it loaded open and compares it with the file
at the path (the inode cannot be reused while it is open).  One that has applied the whole log
the new snapshot compacts (its generation is the next one, read from the file's first line,
and the old log, still open, has nothing past what it applied) already holds that state and
keeps it, less the leases that have expired, as the compactor does; any other loads the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import orjson

from adaptor import threadstore as _public
from adaptor._durable import (
    CorruptLogError,
    DurableLog,
    RepairReport,
    atomic_write_json,
    close_quietly,
    cut_tail,
    ensure_dir,
    exclusive,
    held_to_read,
    lock_epoch,
    may_be_torn,
    not_torn,
    open_for_read,
    open_regular,
    release_lingering,
    touch_epoch,
    unframe,
)
from adaptor.threadstore import _holder
from adaptor.threadstore._state import Event, State, check_event, steady_clock
from adaptor.threadstore._types import (
    FinalizeRequest,
    Lease,
    Query,
    Record,
    check_finalize,
    check_lease,
    check_text,
    check_ttl,
    format_time,
    record_from_json,
    time_of,
)

__all__ = ["JSONLStore"]

_FORMAT = "adaptor.threadstore"
_VERSION = 1
_SNAPSHOT = "snapshot.json"
_LOCK = "store.lock"
_LOG_NAME = re.compile(r"log-(\d+)\.jsonl(?:\.lock)?")
_COMPACT_MIN_LINES = 1024
# How json_bytes starts and ends a snapshot (sorted keys, two-space indent): enough to tell
# its generation and version without parsing the rest.  Anything else is parsed in full.
_SNAPSHOT_HEAD = re.compile(
    rb'\{\n  "format": "adaptor\.threadstore",\n  "generation": ([1-9][0-9]{0,17}),\n'
)
_SNAPSHOT_TAIL = re.compile(rb'\n  "v": 1,\n  "written_at": "[^"\n]*"\n\}\n\Z')


def _open_read(path: str) -> int:
    """A descriptor to read the store's file at ``path``: a symbolic link, a FIFO or anything
    else that is not a regular file raises :class:`adaptor._durable.ForeignFileError` at once
    (a plain ``open`` of a FIFO waits forever for a writer nobody starts)."""
    return open_regular(path, os.O_RDONLY)[0]


@cache
def _read_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError:
        # Without a boot id only the wall clock ends a lease, which is still safe: it only
        # delays a takeover after a reboot until the TTL runs out.
        return ""


def current_boot_id() -> str:
    """This boot's id; a lease granted under another one is expired."""
    return _read_boot_id()


@cache
def _steady_scope() -> str | None:
    """Which processes share this one's monotonic clock: those of its boot and time namespace
    (``None`` without a boot id, where that cannot be told)."""
    boot = current_boot_id()
    if not boot:
        return None
    try:
        namespace = os.readlink("/proc/self/ns/time")
    except FileNotFoundError:
        namespace = "time:[none]"  # a kernel without time namespaces: one clock for all
    except OSError:
        return None
    return f"{boot} {namespace}"


def _log_name(generation: int) -> str:
    return f"log-{generation:06d}.jsonl"


# A snapshot's field saying its log was made with it (older versions made it on the first
# append after the compaction, so their snapshots may name a log not there yet).
_LOG_MADE = "log_made"


def _make_empty_log(path: str) -> None:
    """Make the log ``path`` for a compaction, empty; one that is there already must be
    empty too (made by a compaction that then failed: nobody appends to a log before a
    snapshot names it)."""
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o600)  # (O_EXCL: never through a link at the path)
    except FileExistsError:
        if not _is_empty_file(path):
            # An OSError, as any failed compaction: the commit before it stands, and the next
            # one tries again (see _commit).
            raise FileExistsError(
                errno.EEXIST, "the next generation's log is there already and not empty", path
            ) from None
        return
    os.close(fd)


def _is_empty_file(path: str) -> bool:
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(found.st_mode) and found.st_size == 0


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _parse_event(raw: bytes, expected_seq: int) -> Event:
    """Check one line as read from the log, given without its newline."""
    event = unframe(raw)
    seq = event.get("seq")
    if seq != expected_seq or type(seq) is not int:
        raise ValueError(f"expected seq {expected_seq}, got {seq!r}")
    if event.get("v") != _VERSION:
        raise ValueError(f"unsupported format version {event.get('v')!r}")
    try:
        check_event(event)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed event: {exc}") from None
    return event


def _torn_tail(raw: bytes, terminated: bool, expected_seq: int) -> bool:
    """Whether a bad last line (``raw``, without its newline) is what a crash mid-append leaves,
    judged as the writer judges it (DurableLog's tail check): the beginning of a record, zeros
    or an empty line, never a whole record in sequence (of another format version, or of a
    shape this version does not know) nor text another hand wrote."""
    if not terminated:
        return may_be_torn(raw)
    if _crash_leftover(raw):
        return True
    try:  # a whole record out of sequence: the writer's tail check cuts it as torn too
        return unframe(raw).get("seq") != expected_seq
    except ValueError:
        return False  # text another hand wrote


def _crash_leftover(raw: bytes) -> bool:
    """Whether a line (without its newline) holds only what a crash can leave where a line was
    being written: the beginning of a record, zeros or nothing.  Not a whole record, nor a note
    someone appended (text of several lines is no power-cut damage either)."""
    if raw and not may_be_torn(raw):
        return False
    try:
        unframe(raw)
    except ValueError:
        return True
    return False


def is_store_log(path: str) -> bool:
    """Whether the regular file at ``path`` begins as a store log does: its first line one of
    this store's events (a session-recorder log is framed with a crc too)."""
    try:
        with open_for_read(path) as f:
            event = unframe(f.readline(1 << 20))
        check_event(event)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return event.get("v") == _VERSION and type(event.get("seq")) is int


def _power_cut_suffix(lines: list[bytes], damage_at: int) -> bool:
    """Whether every line is bad or an unsynced lease event written under another boot, by a
    writer that did not know the bytes at ``damage_at`` (the bad line's offset) to be synced."""
    boot = current_boot_id()
    for raw in lines:
        try:
            event = unframe(raw)
        except ValueError:
            if not _crash_leftover(raw):
                return False  # text someone appended: no power cut wrote it
            continue
        if event.get("kind") != "lease" or "reserve" in event:
            return False  # synced: everything before it was flushed with it
        written_under = event.get("boot")
        if not isinstance(written_under, str) or written_under == boot or not boot:
            return False  # written since the last boot (or unknowable): no power cut explains it
        if event.get("synced", 0) > damage_at:
            return False  # the damaged bytes were on disk before the power went
    return True


class JSONLStore:
    """The thread store in plain files under ``directory``, safe across processes and threads.

    Every call takes ``store.lock`` (blocking, no timeout; it is held for one small read or
    one append).  The store keeps a few file descriptors open; :meth:`close` them when done
    (a store dropped without it closes them when it is garbage collected).
    Corruption that a crash cannot explain raises :class:`adaptor.threadstore.CorruptLogError`;
    a failed write or fsync raises ``OSError`` and makes this instance refuse further writes
    (open a new one to re-read the files and carry on).
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        path = os.fspath(directory)
        if path == "":
            # (abspath would make it the current directory: an unset variable's "" turned the
            # working directory into a store.)
            raise ValueError("a thread store needs a directory, not an empty path")
        self._dir = os.path.abspath(path)
        ensure_dir(self._dir)
        self._clock = clock
        # Leases also expire by the monotonic clock, unless the caller keeps time itself.
        self._steady = steady_clock(clock, _steady_scope)
        self._lock_path = os.path.join(self._dir, _LOCK)
        self._snapshot_path = os.path.join(self._dir, _SNAPSHOT)
        # Tests lower this to show compaction without writing thousands of lines.
        self._compact_after = _COMPACT_MIN_LINES
        self._state = State()
        self._generation = 0  # 0: nothing loaded yet
        self._snapshot_fd: int | None = None
        self._log_fd: int | None = None
        self._offset = 0  # bytes of the current log applied to _state
        self._seq = 0  # seq of the last applied line
        # What _read_ahead applied without the lock: exactly the log's bytes up to _offset, to
        # compare with the file once the lock is ours (see _confirm_ahead).
        self._ahead: list[bytes] = []
        self._log: DurableLog | None = None
        # Offset of a power-cut artifact found by _read_log, cut before the next append.
        self._artifact_at: int | None = None
        # How much of the current log is known to be on disk: synced by this instance, or
        # claimed so by a line another writer stamped (see _commit).
        self._synced = 0
        self._broken: OSError | None = None
        # The last refresh found the files not as this instance left them (damage, a log
        # removed or replaced, acknowledged lines gone): the next one reads them from scratch.
        self._reread = False
        self._closed = False
        self._epoch = -1  # lock_epoch() when the files were last known as read
        self.lines_read = 0  # log lines parsed by this instance, for cost checks
        self._repairs: list[RepairReport] = []
        # The snapshot says its log was made with it: a missing log is then damage (a file
        # removed by hand), not "nothing appended since the compaction".
        self._log_made = False

    def __repr__(self) -> str:
        return f"JSONLStore({self._dir!r})"

    def __enter__(self) -> JSONLStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def repairs(self) -> list[RepairReport]:
        """What this instance cut from the log before appending, oldest first: a torn last
        line (a crash mid-append), or a power cut's unsynced suffix (see the module doc).
        Nothing acknowledged is ever among it; the record storage.md has writers keep."""
        return list(self._repairs)

    @property
    def repair_count(self) -> int:
        """``len(self.repairs)`` without copying the list."""
        return len(self._repairs)

    def close(self) -> None:
        """Close the file descriptors; idempotent.  Later calls raise ``ValueError``."""
        if self._closed:
            return  # closed already: nothing to wait on another process for
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self._held(reading=True))
            except OSError:
                # A lock file this process cannot open at all (unreadable): then none of its
                # threads can be inside the store either, and closing needs no lock.
                pass
            self._closed = True
            self._forget_files()
        release_lingering(self._lock_path)

    def __del__(self) -> None:
        # A program that makes a store per request and never closes it (nothing says it must)
        # ran out of descriptors: each kept the logs and the snapshot it had open.  Nobody can
        # be inside a call now (it holds a reference), so no lock is taken.  The log we append
        # through closes its own as it goes with us.
        for name in ("_snapshot_fd", "_log_fd"):
            close_quietly(getattr(self, name, None))
            setattr(self, name, None)

    # --- the contract ---------------------------------------------------------------------------

    def resolve(self, query: Query) -> Record | None:
        if not isinstance(query, Query):
            raise TypeError(f"expected a Query, not {type(query).__name__}")
        with self._locked(reading=True):
            found = self._state.lookup(query)
            return None if found is None else record_from_json(found)

    def keys(self) -> list[str]:
        """The thread keys that have an active record, sorted (read-only; for listings)."""
        with self._locked(reading=True):
            return sorted(
                key for key in self._state.keys if self._state.lookup(Query(key=key)) is not None
            )

    def acquire_lease(self, target: str, owner: str, ttl: float) -> Lease:
        check_text("target", target)
        check_text("owner", owner)
        ttl = check_ttl(ttl)
        with self._locked():
            lease, event = self._state.plan_acquire(
                target, owner, ttl, self._clock(), current_boot_id(), _holder.current(), self._steady()
            )
            self._commit(event)
        return lease

    def renew_lease(self, lease: Lease, ttl: float) -> None:
        check_lease(lease)
        ttl = check_ttl(ttl)
        with self._locked(within_lease=True):
            event = self._state.plan_renew(
                lease, ttl, self._clock(), current_boot_id(), _holder.current(), self._steady()
            )
            self._commit(event)

    def release_lease(self, lease: Lease) -> None:
        check_lease(lease)
        with self._locked(within_lease=True):
            event = self._state.plan_release(lease)
            if event is not None:
                self._commit(event)

    def finalize(self, request: FinalizeRequest) -> None:
        check_finalize(request)
        with self._locked(within_lease=True):
            event = self._state.plan_finalize(request, self._clock(), current_boot_id(), self._steady())
            self._commit(event)

    def compact(self) -> None:
        """Write a snapshot and start a fresh log now (it also happens on its own)."""
        with self._locked():
            self._compact()

    # --- reading --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _held(self, *, within_lease: bool = False, reading: bool = False) -> Iterator[bool]:
        """The store's lock; yields whether it is the writers' own (False: held for reading,
        on a store this process may not write to: a read-only mount, a copy it may only read).
        """
        # Within a lease (renew, finalize, release) this process is mid-cycle: were it to give
        # the lock away now, the others would find that lease's key busy until it got the lock
        # back, so it keeps the lock until its next hold outside a lease (``continuing``).
        lock, wait = self._lock_path, self._read_ahead
        if reading:
            with held_to_read(lock, linger=True, while_waiting=wait, continuing=within_lease) as own:
                yield own
        else:
            with exclusive(lock, linger=True, while_waiting=wait, continuing=within_lease):
                yield True

    @contextlib.contextmanager
    def _locked(self, *, within_lease: bool = False, reading: bool = False) -> Iterator[None]:
        self._refuse_if_closed()  # before the lock too: no waiting on others only to refuse
        with self._held(within_lease=within_lease, reading=reading) as own:
            self._refuse_if_closed()  # another thread may have closed it while this one waited
            # Unchanged epoch: this process held the flock throughout since our last look
            # and no other instance here wrote, so the files are as we left them.  Held only
            # for reading, the epoch tells nothing: the files are read afresh each time.
            try:
                if not own or self._reread or lock_epoch(self._lock_path) != self._epoch:
                    self._refresh()
                    self._epoch = lock_epoch(self._lock_path) if own else -1
                yield
            except CorruptLogError as exc:
                # Said once, then the files are read as they stand, as a new instance reads
                # them: still damaged, the next call says so again; mended (a backup restored,
                # the store moved aside) they are served.  Holding on to what this instance
                # had read failed every later call of a long-lived process (the daemon) until
                # it was restarted, while every other process read the store fine.
                self._reread = True
                if isinstance(exc, _public.CorruptLogError):
                    raise
                # The durable layer's class is internal: callers (and the wire's ``type``)
                # see the store's public one, with the same path, line and reason.
                raise _public.CorruptLogError(exc.path, exc.line, exc.why) from None

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def _refresh(self) -> None:
        if self._reread:
            self._reread = False
            self._restart()
        try:
            on_disk = os.stat(self._snapshot_path, follow_symlinks=False)
        except FileNotFoundError:
            on_disk = None
        if on_disk is None:
            if self._snapshot_fd is not None:
                raise CorruptLogError(self._snapshot_path, 1, "snapshot disappeared")
            if self._generation == 0:
                self._start_without_snapshot()
        elif self._snapshot_fd is None or not os.path.samestat(
            on_disk, os.fstat(self._snapshot_fd)
        ):
            self._follow_snapshot()
        if not self._following_log():
            # Only a compaction retires a log, and it replaces the snapshot first (followed
            # above).  Reading on from the old file would hide what is at the path now, and
            # an append would start that file at a sequence its readers refuse.
            raise CorruptLogError(self._log_path(), 1, "the log was removed or replaced")
        if self._ahead and not self._confirm_ahead():
            self._restart()
        self._read_log()

    def _following_log(self) -> bool:
        """Whether the file at the log's path is the one this instance has read."""
        if self._log_fd is None:
            if not self._offset:
                return True  # none of it applied yet: it is read from its start
            # Only written through the log so far: _read_log checks that the file at the path
            # still holds what we applied (not shorter, our lines followed by good ones).
            try:
                self._log_fd = _open_read(self._log_path())
            except FileNotFoundError:
                return False
            return True
        try:
            on_disk = os.stat(self._log_path(), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return os.path.samestat(on_disk, os.fstat(self._log_fd))

    # --- reading ahead without the lock ---------------------------------------------------------

    def _read_ahead(self) -> None:
        """While another process holds ``store.lock``, apply what it has appended so far.

        Called between polls for the lock (with this process's thread lock held, so nothing
        else here touches the state).  Catching up on the lines the other processes wrote
        during their turn is most of the work of taking the lock back; done here, it overlaps
        their turn instead of delaying ours.  It is safe without the lock because the files
        only grow, a snapshot is replaced whole, and a complete line is a committed one,
        except in one case: a writer whose write or sync failed cuts its unacknowledged line
        off again.  So nothing read here is trusted until :meth:`_confirm_ahead` has compared
        it with the file under the lock, and anything unexpected (a bad or unterminated line,
        a missing file) just ends the read-ahead: the locked read decides, as without it.
        """
        if self._closed or self._broken is not None:
            return
        try:
            if self._log_fd is not None and os.fstat(self._log_fd).st_size > self._offset:
                # Still growing, so not compacted before these lines: one system call less.
                self._read_log(ahead=True)
                return
            on_disk = os.stat(self._snapshot_path, follow_symlinks=False)
        except FileNotFoundError:
            on_disk = None
        except OSError:
            return
        try:
            if on_disk is None:
                if self._snapshot_fd is not None:
                    return  # "snapshot disappeared": the locked read reports it
                if self._generation == 0:
                    # Its "missing snapshot" check can be fooled by a compaction between the
                    # stat and the listing; then it raises, changing nothing.
                    self._start_without_snapshot()
            elif self._snapshot_fd is None or not os.path.samestat(
                on_disk, os.fstat(self._snapshot_fd)
            ):
                self._follow_snapshot()  # complete (replaced atomically) and kept open
            self._read_log(ahead=True)
        except (OSError, ValueError, CorruptLogError):
            # Torn reads of a file being replaced and the like; each step above leaves a
            # consistent state (a snapshot switch or a line is applied whole or not at all).
            return

    def _confirm_ahead(self) -> bool:
        """Under the lock: whether the bytes :meth:`_read_ahead` applied are still the log's."""
        ahead = b"".join(self._ahead)
        self._ahead = []
        if self._log_fd is None:
            return False
        start = self._offset - len(ahead)
        return _pread_exact(self._log_fd, len(ahead), start) == ahead

    def _restart(self) -> None:
        """Drop everything read and load the files afresh (records already checked stay so)."""
        self._forget_files()
        self._generation = 0
        self._offset = 0
        self._seq = 0
        self._artifact_at = None
        try:
            on_disk = os.stat(self._snapshot_path, follow_symlinks=False)
        except FileNotFoundError:
            on_disk = None
        if on_disk is None:
            self._start_without_snapshot()
        else:
            self._load_snapshot()

    def _start_without_snapshot(self) -> None:
        # Only a store that has never compacted lacks a snapshot; a later log without one means
        # the snapshot was lost, and starting empty would silently drop every thread.
        for name in os.listdir(self._dir):
            match = _LOG_NAME.fullmatch(name)
            if match and int(match.group(1)) > 1 and not name.endswith(".lock"):
                path = os.path.join(self._dir, name)
                if _is_empty_file(path):
                    # Made by a compaction (one that then failed, or whose snapshot was lost
                    # before anything was appended): it holds nothing, and the newest log
                    # holding lines is kept past every compaction (_remove_stale).
                    continue
                raise CorruptLogError(path, 1, f"{_SNAPSHOT} is missing for this log")
        self._switch(1, State(), None)

    def _follow_snapshot(self) -> None:
        """Switch to the snapshot at the path, which is not the one we hold (if any).

        When it is the compaction of exactly the log we have read to its end, it holds the
        state we hold (the compactor replayed the same lines, then saved its state), so we
        keep ours, as the compactor does, instead of parsing back a file as large as the
        whole store; with a store that grows, every process doing that after every
        compaction cost more than all the other reading put together.  Otherwise (a fresh
        instance, two compactions since we last looked, a log we did not get to the end of)
        it is loaded.
        """
        fd = _open_read(self._snapshot_path)
        try:
            continues = self._continues_our_log(fd)
        except BaseException:
            os.close(fd)
            raise
        if not continues:
            self._load_snapshot(fd)
            return
        state = self._state
        # What the compactor dropped from its own state, by our clock rather than its.
        state.leases = state.live_leases(self._clock(), current_boot_id(), self._steady())
        self._switch(self._generation + 1, state, fd)

    def _continues_our_log(self, fd: int) -> bool:
        """Whether snapshot ``fd`` is the compaction of our log, all of which we have applied."""
        match = _SNAPSHOT_HEAD.match(os.pread(fd, 128, 0))
        if match is None or int(match.group(1)) != self._generation + 1:
            return False
        size = os.fstat(fd).st_size
        if _SNAPSHOT_TAIL.search(os.pread(fd, 128, max(0, size - 128))) is None:
            return False
        if self._log_fd is None:
            return False  # it may have been written and removed before we ever opened it
        # Nobody appends to a log once a snapshot names the next one (the compactor wrote it
        # to the end first, under the lock), so the file we hold open is complete.
        self._read_log(ahead=True)
        if self._offset != os.fstat(self._log_fd).st_size:
            return False  # a bad line we stopped at: only the snapshot knows what it meant
        return not self._ahead or self._confirm_ahead()

    def _load_snapshot(self, fd: int | None = None) -> None:
        """Parse the snapshot (``fd``: opened on it already, closed on failure) and switch."""
        if fd is None:
            fd = _open_read(self._snapshot_path)
        try:
            try:
                obj = orjson.loads(_read_all(fd))
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
                if obj.get("format") != _FORMAT or obj.get("v") != _VERSION:
                    raise ValueError("not a version 1 thread store snapshot")
                generation = obj.get("generation")
                if type(generation) is not int or generation < 2:
                    raise ValueError("bad generation")
                state = State.from_snapshot(obj, known=self._state.records)
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptLogError(self._snapshot_path, 1, str(exc)) from None
        except BaseException:
            os.close(fd)
            raise
        self._switch(generation, state, fd, log_made=obj.get(_LOG_MADE) is True)

    def _switch(
        self, generation: int, state: State, snapshot_fd: int | None, *, log_made: bool = False
    ) -> None:
        self._forget_files()
        self._generation = generation
        self._log_made = log_made
        self._state = state
        self._snapshot_fd = snapshot_fd
        self._offset = 0
        self._seq = 0
        self._artifact_at = None
        self._synced = 0
        self._ahead = []

    def _forget_files(self) -> None:
        if self._log is not None:
            log, self._log = self._log, None
            log.close()
        for name in ("_snapshot_fd", "_log_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    def _log_path(self) -> str:
        return os.path.join(self._dir, _log_name(self._generation))

    def _read_log(self, *, ahead: bool = False) -> None:
        """Apply the log lines appended since the last call (by anyone).

        ``ahead``: called without the lock (:meth:`_read_ahead`); stop quietly at anything
        but a complete good line and keep the bytes applied for :meth:`_confirm_ahead`.
        """
        if not ahead:
            # Found again below if it is still there.  Another process may have cut it and
            # appended over it since: cutting there again would destroy committed lines.
            self._artifact_at = None
        path = self._log_path()
        if self._log_fd is None:
            try:
                self._log_fd = _open_read(path)
            except FileNotFoundError:
                if self._log_made and not ahead:
                    # Made with the snapshot that names it: removed since, and every change
                    # since the compaction with it.  Read as "nothing appended yet", those
                    # threads went back to the snapshot without a word.
                    raise CorruptLogError(
                        path, 1, f"the log is missing; {_SNAPSHOT} names it (made with it)"
                    ) from None
                return  # nothing written in this generation yet
        size = os.fstat(self._log_fd).st_size
        if size == self._offset:
            return
        if size < self._offset:
            if ahead:
                return
            raise CorruptLogError(path, self._seq, "log shrank below acknowledged data")
        start = self._offset
        data = _pread_exact(self._log_fd, size - start, start)
        # Split on b"\n" only: bytes.splitlines would also split on a stray b"\r" in damage.
        # The last part is what follows the last newline: empty unless an append was torn.
        lines = data.split(b"\n")
        if not lines[-1]:
            lines.pop()
        state = self._state
        try:
            for index, raw in enumerate(lines):
                last = index == len(lines) - 1
                terminated = not (last and self._offset + len(raw) == size)
                try:
                    if not terminated:
                        raise ValueError("unterminated last line")
                    event = _parse_event(raw, self._seq + 1)
                except ValueError as exc:
                    # We hold the lock, so no append is in progress: a bad last line is what
                    # a crash mid-append leaves (never acknowledged; the next append
                    # truncates it), and a bad line followed only by unsynced lease events of
                    # an earlier boot is what a power cut leaves (see the module docstring).
                    # Anything else is corruption and must not be skipped.
                    if ahead:
                        return
                    # (A last line no crash leaves is corruption as the next writer finds it:
                    # a reader that skipped it said a thread did not exist, exit 4, while every
                    # write said the store is corrupt.)
                    if last and _torn_tail(raw, terminated, self._seq + 1):
                        return
                    if not last and _crash_leftover(raw) and _power_cut_suffix(lines[index + 1 :], self._offset):
                        self._artifact_at = self._offset
                        return
                    why = str(exc) if not raw or may_be_torn(raw) else not_torn(str(exc), raw)
                    raise CorruptLogError(path, self._seq + 1, why) from None
                synced = event.get("synced")
                if synced is not None and synced > self._synced:
                    self._synced = synced
                state.apply(event, owned=True)
                self._offset += len(raw) + 1
                self._seq += 1
                self.lines_read += 1
        finally:
            if ahead and self._offset > start:
                self._ahead.append(data[: self._offset - start])

    # --- writing --------------------------------------------------------------------------------

    def _commit(self, event: Event) -> None:
        if self._broken is not None:
            raise OSError(
                self._broken.errno,
                "an earlier write to this store failed; open a new JSONLStore to continue",
                self._dir,
            ) from self._broken
        if self._log is None:
            self._log = DurableLog(self._log_path(), lock_path=self._lock_path)
        sync = event["kind"] != "lease" or "reserve" in event
        if not sync:
            # "synced" lets a reader after a power cut tell damage to this line's predecessors
            # that the cut cannot explain (bytes already on disk) from what it can.
            event = {**event, "boot": current_boot_id()}
            if self._synced:
                event["synced"] = self._synced
        log = self._log
        known_repairs = log.repair_count
        try:
            if self._artifact_at is not None:
                self._repairs.append(cut_tail(self._log_path(), self._artifact_at))
                self._synced = max(self._synced, self._artifact_at)
                self._artifact_at = None
                # The log must look at the file again rather than trust what it last wrote.
                touch_epoch(self._lock_path)
            written = log.append(event, sync=sync)
        except OSError as exc:
            # The write may or may not be on disk; only re-reading the files can tell.
            self._broken = exc
            touch_epoch(self._lock_path)  # other instances here must re-read too
            raise
        finally:
            # A torn tail the append cut first (a failed write after it cut it too).
            self._repairs.extend(log.repaired[known_repairs:])
        if sync:  # an fdatasync flushes the whole file as it stands
            self._synced = max(self._synced, self._log.size)
        if written["seq"] == self._seq + 1:
            # We hold store.lock and had read the log to its end (a torn tail or power-cut
            # artifact ends where our offset is, and the append cut it there), so the line
            # just written is the only one past our offset: apply the event in hand instead
            # of reading back and re-validating what we serialized ourselves.
            self._state.apply(written)
            self._offset = self._log.size
            self._seq += 1
        else:
            self._read_log()
            if self._seq != written["seq"]:
                raise CorruptLogError(
                    self._log_path(), written["seq"], "appended line did not read back"
                )
        # The append advanced the epoch (every DurableLog append does), which tells other
        # instances in this process to re-read; reading it here rather than advancing it again
        # keeps the log's own "nobody touched the file" shortcut valid for our next append.
        self._epoch = lock_epoch(self._lock_path)
        if self._seq >= max(self._compact_after, len(self._state)):
            try:
                self._compact()
            except OSError as exc:
                # The commit above is durable and must not be reported as failed.  A failed
                # compaction changed nothing (the snapshot is replaced atomically) and is
                # retried after the next append, unless it failed after the replacement (see
                # _compact): then the next write says so.
                warnings.warn(f"thread store compaction failed: {exc}", RuntimeWarning, 2)

    def _compact(self) -> None:
        now = self._clock()
        generation = self._generation + 1
        snapshot: dict[str, Any] = {
            "format": _FORMAT,
            "v": _VERSION,
            "generation": generation,
            "log": _log_name(generation),
            "written_at": format_time(time_of(now)),
            **self._state.snapshot(now, current_boot_id(), self._steady()),
            _LOG_MADE: True,
        }
        # The next log is made before the snapshot names it (empty: no sync of its own; the
        # snapshot's directory sync below makes its name durable too), so that a reader can
        # tell it removed from not yet appended to.
        _make_empty_log(os.path.join(self._dir, _log_name(generation)))
        try:
            atomic_write_json(self._snapshot_path, snapshot)
        except OSError as exc:
            if self._snapshot_replaced():
                # Only the directory sync failed: the new snapshot is what other processes
                # follow now, but it may not survive a power cut.  Appending to the old log
                # would hide lines from them, appending to the new one could lose lines to a
                # power cut, so this instance stops writing; a new one reads what is there.
                self._broken = exc
                touch_epoch(self._lock_path)
            raise
        # The snapshot is now the truth.  Keep the file open (other processes compare it with
        # theirs to notice a compaction) and hold the same state it has, dead leases dropped;
        # parsing back what we just serialized would cost more than the compaction itself as
        # the store grows.  Nobody can replace the file before us: we hold store.lock.
        fd = _open_read(self._snapshot_path)
        state = self._state
        state.leases = dict(snapshot["leases"])
        self._switch(generation, state, fd, log_made=True)
        self._epoch = touch_epoch(self._lock_path)
        self._remove_stale(generation)

    def _snapshot_replaced(self) -> bool:
        """Whether ``snapshot.json`` is no longer the file this instance follows."""
        try:
            on_disk = os.stat(self._snapshot_path, follow_symlinks=False)
        except FileNotFoundError:
            return self._snapshot_fd is not None
        except OSError:
            return True  # cannot tell: assume the worst
        return self._snapshot_fd is None or not os.path.samestat(
            on_disk, os.fstat(self._snapshot_fd)
        )

    def _remove_stale(self, generation: int) -> None:
        """Remove the logs before ``generation`` but the newest holding lines, the empty ones
        earlier compactions made, and stray temp files.

        The newest earlier log holding lines stays (until a later compaction), so a store whose
        snapshot is then lost never looks empty, which would drop every thread: it shows log 1,
        the whole history, read as such, or a later log holding lines, which
        _start_without_snapshot refuses.
        """
        names = os.listdir(self._dir)
        earlier = [
            int(match.group(1))
            for match in map(_LOG_NAME.fullmatch, names)
            # A log's lock file may outlive it: only the logs themselves count here.
            if match is not None and not match.group(0).endswith(".lock")
            and int(match.group(1)) < generation
        ]
        # The newest holding lines: a compaction makes its log empty, and one with nothing
        # appended before the next compaction would otherwise be kept instead of the history.
        empty = {n for n in earlier if _is_empty_file(os.path.join(self._dir, _log_name(n)))}
        kept = max(set(earlier) - empty, default=0)
        for name in names:
            match = _LOG_NAME.fullmatch(name)
            number = int(match.group(1)) if match is not None else None
            stale = name.startswith(f"{_SNAPSHOT}.tmp-") or (
                number is not None and (number < kept or (number in empty and name == _log_name(number)))
            )
            if stale:
                # Only ever created or used under store.lock, which we hold: nobody is using
                # them, and a crash between the snapshot and this point just leaves garbage.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self._dir, name))

"""Durable file primitives shared by every writer of state under a state directory.

Atomic whole-file replacement, per-path locks, and an append-only JSONL log whose lines carry
a CRC and a strict sequence number, so a crash mid-append is detectable (a torn tail, which
writers truncate) and distinguishable from corruption (a bad line before the tail, which is
never skipped or truncated).  Higher layers translate :class:`CorruptLogError` and ``OSError``
into their own error taxonomy.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import secrets
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, TypeAlias, TypeVar

import filelock
import orjson

try:
    # ISA-L's CRC-32: zlib's checksum, bit for bit, about 4x faster on a log line (see
    # docs/storage.md, "Checksums"); every reader of every log checks every line with it.
    from isal.isal_zlib import crc32 as crc32
except ImportError:  # a platform without an isal wheel, where pyproject.toml does not ask for it
    from zlib import crc32 as crc32

try:
    import fcntl
except ImportError:  # not POSIX: waiting polls with filelock's own attempts only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CorruptLogError",
    "DurableLog",
    "ForeignFileError",
    "RepairReport",
    "atomic_write",
    "atomic_write_json",
    "crc_matches_text",
    "ensure_dir",
    "exclusive",
    "frame",
    "fsync_dir",
    "held_for_reading",
    "held_to_read",
    "inspect_tail",
    "is_no_write_access",
    "lock_epoch",
    "may_be_torn",
    "not_torn",
    "open_regular",
    "read_json",
    "release_lingering",
    "rename",
    "repair",
    "scan",
    "touch_epoch",
    "unframe",
]

_T = TypeVar("_T")
_StrPath: TypeAlias = "str | os.PathLike[str]"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

_LINE_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
_BLOCK = 64 * 1024
_PREVIEW_CHARS = 200
# Worst case UTF-8 needs 4 bytes per character; reading more than this for a preview is waste.
_PREVIEW_BYTES = 4 * _PREVIEW_CHARS
# How much of an unterminated last line a writer reads to judge it (may_be_torn()).
_TAIL_CHECK_BYTES = 1024 * 1024

# fdatasync flushes the new length along with the data, which is all an append needs.
_datasync = getattr(os, "fdatasync", os.fsync)
_RWF_DSYNC: int | None = getattr(os, "RWF_DSYNC", None) if hasattr(os, "pwritev") else None


def _write_datasync(fd: int, data: bytes) -> int:
    """Append ``data`` and sync it as ``write`` + ``fdatasync`` would, in one system call.

    ``RWF_DSYNC`` syncs only the range written (and the metadata needed to read it back), so
    this is a whole fdatasync only when everything before that range is durable already.
    Returns the number of bytes written, like ``os.write``.
    """
    assert _RWF_DSYNC is not None
    # Offset -1: the file position, which O_APPEND keeps at the end.
    return os.pwritev(fd, (data,), -1, _RWF_DSYNC)


class CorruptLogError(Exception):
    """A log line failed validation where a crash cannot explain it (or a strict reader saw it).

    ``line`` is 1-based; ``why`` is a short reason such as ``"bad crc"``.
    """

    def __init__(self, path: str, line: int, why: str) -> None:
        super().__init__(path, line, why)  # keeps the exception picklable
        self.path = path
        self.line = line
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


@dataclass(frozen=True, slots=True)
class RepairReport:
    """A torn tail: the bytes from ``offset`` to the end of the file that were (or would be) cut."""

    path: str
    offset: int
    dropped_bytes: int
    dropped_preview: str


# ---------------------------------------------------------------------------------------------
# Directories and whole files


def fsync_dir(path: _StrPath) -> None:
    """Make the directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ForeignFileError(OSError):
    """Something the writer did not make stands where it writes a file or folder of its own: a
    symbolic link, a file with another name (a hard link), or not a regular file at all.

    Refused rather than written through: writing through it would change a file elsewhere.
    An ``OSError``, so a caller that knows only disk errors still stops; unlike most of them,
    trying again does not help while the thing stays there.
    """


def ensure_dir(path: _StrPath, *, durable: bool = True, follow_links: bool = True) -> Path:
    """Create ``path`` and any missing parents with mode ``0o700``.

    Each directory this call creates has its parent fsynced, so the new entry survives a crash;
    with ``durable=False`` the caller syncs the parent later (:func:`sync_paths`).  With
    ``follow_links=False``, a symbolic link at ``path`` itself is refused
    (:class:`ForeignFileError`): for folders whose files the caller writes as its own.
    """
    target = Path(path)
    if not follow_links:
        try:
            found = os.lstat(target)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(found.st_mode):
                raise ForeignFileError(errno.ELOOP, "is a symbolic link, not a folder", str(target))
    missing: list[Path] = []
    probe = Path(os.path.abspath(target))
    while not probe.is_dir():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            # Another process may have won the race; only a non-directory is an error.
            if not directory.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(directory)) from None
            continue
        if durable:
            fsync_dir(directory.parent)
    return target


def _random_suffix() -> str:
    return secrets.token_hex(8)


def close_quietly(fd: int | None, _close: Callable[[int], None] = os.close) -> None:
    """Close ``fd`` (if any) from a finalizer, where an error has nobody to go to.  (``_close``
    is bound early: at interpreter exit a finalizer may run after this module's globals went.)"""
    if fd is not None:
        try:
            _close(fd)
        except OSError:
            pass


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written == len(data):
        return  # the usual case: no view, no loop
    if written <= 0:
        raise OSError(errno.EIO, "write accepted no bytes")
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        if written <= 0:
            # A regular file never legitimately accepts zero bytes; looping would spin forever.
            raise OSError(errno.EIO, "write accepted no bytes")
        view = view[written:]


def atomic_write(path: _StrPath, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new content, never a mix.

    The content is written to a fresh sibling temporary file, fsynced, renamed over ``path``
    and the directory is fsynced.  A symlink at ``path`` is replaced, not followed.  The file
    gets exactly ``mode`` (the umask is not applied).

    ``durable=False`` skips both fsyncs, for files that a later :func:`sync_paths` makes
    durable together with others: a ``kill -9`` still loses nothing (the page cache outlives
    the process), only a power loss before that sync can.
    """
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    tmp = os.path.join(directory, f"{name}.tmp-{_random_suffix()}")
    # O_EXCL|O_NOFOLLOW: a name planted by someone else (a symlink to a victim file) is refused
    # instead of written through.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode)
    try:
        try:
            # The umask may have narrowed ``mode``; the caller asked for exactly this mode.
            os.fchmod(fd, mode)
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)


def rename(source: _StrPath, target: _StrPath) -> None:
    """Give the file ``source`` the new name ``target`` in the same folder, durably: renamed,
    then the folder fsynced, so a crash finds it under one name or the other, never both.

    An existing ``target`` is never replaced (``FileExistsError``); the check and the rename
    are two steps, so this is for names only the caller makes (a rotated log's).
    """
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "already exists", os.fspath(target))
    os.rename(source, target)
    fsync_dir(os.path.dirname(os.path.abspath(target)))


def json_bytes(obj: object) -> bytes:
    """``obj`` as the JSON of state files: sorted, indented (stable diffs), final newline."""
    return orjson.dumps(
        obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE | orjson.OPT_INDENT_2
    )


def atomic_write_json(path: _StrPath, obj: object, *, durable: bool = True) -> None:
    """:func:`atomic_write` of :func:`json_bytes` of ``obj``."""
    atomic_write(path, json_bytes(obj), durable=durable)


class SyncBatch:
    """Files made durable together, then folders: the writeback of every file starts as it
    joins, and :meth:`sync` fsyncs each file, then each folder.

    Whatever runs between the writes and the sync overlaps with the disk writing the files,
    and the fsyncs mostly find their data written already: for a daemon verdict's four files
    on ext4 that took about two thirds of the time of four write+fsync in turn (measured).
    What becomes durable, and in which order (files before folders), is the same as with one
    write+fsync per file.  As a context manager it syncs on a clean exit; after an exception
    it only closes the files.
    """

    def __init__(self, directories: Iterable[_StrPath] = ()) -> None:
        self._descriptors: list[int] = []
        self._hinted = 0
        self._directories: dict[_StrPath, None] = dict.fromkeys(directories)

    def write(self, path: _StrPath, data: bytes, *, exclusive: bool = False) -> None:
        """Write ``path`` (``0o600``) as a new file if ``exclusive``, else in place: created or
        truncated, no rename.

        In place is for files nobody reads before something written after them points at
        them (a daemon run's side files, which only its verdict names): a crash mid-write
        leaves a partial file nothing refers to, and the next writer truncates it.  A new
        empty file is only created: it has no content to sync, and its creation is made
        durable with its folder's entries (journaling filesystems commit a new inode with
        its entry), so the folder must be in the batch.

        In place, only a file of the writer's own is written: a symbolic link, a file with
        another name (a hard link) or a FIFO at ``path`` raises :class:`ForeignFileError`, and
        is left as it was.
        """
        fd = self._opened(lambda: self._open_for_write(path, data, exclusive))
        if fd is None:
            return
        self._descriptors.append(fd)
        _write_all(fd, data)
        self._start_writeback()

    def _opened(self, open_file: Callable[[], _T]) -> _T:
        """``open_file()``, tried once more when the process had no descriptor left for it,
        after the files held so far are synced and closed (see :meth:`_make_room`)."""
        try:
            return open_file()
        except OSError as exc:
            if not self._make_room(exc):
                raise
            return open_file()

    def _make_room(self, exc: OSError) -> bool:
        """After an open the process had no descriptor left for: sync and close the files held
        so far, so the open can be tried again (False: no help in that, the error stands).

        A process short of descriptors (a low ``ulimit -n``, a daemon whose other work holds
        most of them) could otherwise never complete a batch: each try opened the same files
        and failed at the same one.  What becomes durable, and in which order, is unchanged.
        """
        if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._descriptors:
            return False
        descriptors, self._descriptors, self._hinted = self._descriptors, [], 0
        try:
            for fd in descriptors:
                os.fsync(fd)
        finally:
            for fd in descriptors:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return True

    def _open_for_write(self, path: _StrPath, data: bytes, exclusive: bool) -> int | None:
        """The descriptor :meth:`write` writes ``path`` through; None for a new empty file."""
        flags = os.O_WRONLY | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC
        try:
            # Usually the file is new (a run's side files): created here, it is the writer's
            # own and empty, with nothing to look at before writing.
            fd = os.open(path, flags | os.O_EXCL, 0o600)
        except FileExistsError:
            if exclusive:
                raise
            # An earlier writer's: truncated and synced like any other.  Not O_TRUNC: nothing
            # is emptied before it is known to be the writer's own.
            fd, found = open_regular(path, flags)
            try:
                if found.st_nlink != 1:
                    raise ForeignFileError(errno.EMLINK, "has another name (a hard link)", os.fspath(path))
                if found.st_size:
                    os.ftruncate(fd, 0)
            except BaseException:
                os.close(fd)
                raise
        else:
            if not data and not exclusive:
                # A new empty file has no content to sync (see above).
                os.close(fd)
                return None
        return fd

    def add(self, path: _StrPath) -> None:
        """A file written earlier without fsync; a missing one has nothing to make durable."""
        try:
            fd = self._opened(lambda: open_regular(path, os.O_RDONLY)[0])
        except (FileNotFoundError, ForeignFileError):
            # Replaced since by a symbolic link or a FIFO (whose open would wait forever for a
            # writer): nothing of the writer's is there to sync.
            return
        self._descriptors.append(fd)
        self._start_writeback()

    def add_directory(self, path: _StrPath) -> None:
        self._directories[path] = None

    @property
    def files(self) -> int:
        return len(self._descriptors)

    def sync(self) -> None:
        """Fsync every file, then every folder; an fsync error is raised, never retried."""
        try:
            for fd in self._descriptors:
                os.fsync(fd)
        finally:
            self.close()
        directories, self._directories = self._directories, {}
        for directory in directories:
            fsync_dir(directory)

    def close(self) -> None:
        """Close the files without syncing (the batch is then empty)."""
        descriptors, self._descriptors, self._hinted = self._descriptors, [], 0
        for fd in descriptors:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _start_writeback(self) -> None:
        # Not for a lone file: its fsync follows, with nothing to overlap.
        if len(self._descriptors) < 2:
            return
        for fd in self._descriptors[self._hinted :]:
            _start_writeback(fd)
        self._hinted = len(self._descriptors)

    def __enter__(self) -> SyncBatch:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.sync()
        else:
            self.close()


_FADV_DONTNEED: int | None = (
    getattr(os, "POSIX_FADV_DONTNEED", None) if sys.platform == "linux" else None
)


def _start_writeback(fd: int) -> None:
    """Start writing the file's dirty pages to the disk, without waiting (a hint only).

    Python has no ``sync_file_range``; on Linux ``POSIX_FADV_DONTNEED`` starts the writeback of
    dirty pages the same way (pages still being written stay cached), which is also what
    PostgreSQL falls back to for this.  Elsewhere, or on failure, the fsync does it all.
    """
    if _FADV_DONTNEED is not None:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, _FADV_DONTNEED)


def sync_paths(files: Iterable[_StrPath], directories: Iterable[_StrPath] = ()) -> None:
    """Make files written with ``durable=False`` and directory entries durable.

    Files first, then directories (a name must not become durable before its content).  A
    missing file is skipped (nothing to make durable); any other error is raised, and an
    fsync error is never retried (the kernel may have dropped the pages it failed to write).
    """
    with SyncBatch(directories) as batch:
        for path in dict.fromkeys(files):
            batch.add(path)


def write_once(
    path: _StrPath,
    data: bytes,
    *,
    linked: Callable[[], None] | None = None,
    synced_with: SyncBatch | None = None,
) -> bool:
    """Create ``path`` with ``data`` unless it exists; ``False`` (nothing written) if it does.

    The content is fsynced under a temporary name and hard-linked into place, so ``path``
    appears complete or not at all and two writers never both succeed.  ``linked`` runs right
    after the link, before the one directory fsync that makes both durable (the daemon removes
    a request's claimed copy there); journaling filesystems (ext4, xfs, btrfs) never persist a
    later unlink without the earlier link.  With ``synced_with`` the content joins that batch,
    which is synced (its folders included) before ``path`` appears.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{_random_suffix()}")
    batch = SyncBatch() if synced_with is None else synced_with
    try:
        batch.write(tmp, data, exclusive=True)
        batch.sync()
    except FileExistsError:
        raise  # not ours to remove
    except BaseException:
        # A full disk, say: the half-written temporary file is not left behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        os.link(tmp, target)
    except FileExistsError:
        os.unlink(tmp)
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:
        if linked is not None:
            linked()
    finally:
        os.unlink(tmp)
        fsync_dir(target.parent)
    return True


def read_small(path: _StrPath, limit: int, *, follow_links: bool = False) -> bytes:
    """A regular file's bytes, read without following a link at ``path`` (unless
    ``follow_links``) or waiting on a FIFO.

    Raises ``ValueError`` for anything that is not a regular file or holds more than ``limit``
    bytes (files a person or a script drops where the daemon reads).
    """
    nofollow = 0 if follow_links else _O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | nofollow | _O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 65536):
            total += len(chunk)
            if total > limit:
                raise ValueError(f"larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: _StrPath) -> Any:
    """Parse a JSON file: only a regular one, never through a symlink nor waiting on a FIFO
    (:class:`ForeignFileError`, ``errno`` ``ELOOP`` for a symlink, ``EINVAL`` otherwise)."""
    with open_for_read(path) as f:
        return orjson.loads(f.read())


# ---------------------------------------------------------------------------------------------
# Locks


def _open_lock_file(path: str) -> int:
    """A descriptor on the lock file ``path``: created ``0o600`` (and its missing folders) when
    there is none, never through a symbolic link, never inherited by a child process.

    A lock descriptor inherited by an agent child would keep the flock alive after this
    process died.  As ``filelock.FileLock`` does (which this replaced for its cost: ~150 us of
    CPU per acquisition and release, 30 system calls, against 5): the folders are made, and a
    file this call creates gets exactly ``0o600`` whatever the umask.
    """
    flags = os.O_RDWR | os.O_NONBLOCK | _O_CLOEXEC | _O_NOFOLLOW
    while True:
        # The file is there almost every time: opened first, it costs one system call, not a
        # refused creation and an exception before it.  (The opens are made outside the
        # handlers: an error they raise is the error, not one "during handling of" another.)
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            pass
        folder_missing = False
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue  # made by someone else between the two opens: open theirs
        except FileNotFoundError:
            folder_missing = True
        if folder_missing:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            continue
        try:
            os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            raise
        return fd


# Lingering (see docs/storage.md).  A writer that appends again within _LINGER_IDLE keeps the
# flock instead of paying filelock's ~100 us acquire+release each time; a reaper thread lets
# go once the lock has been idle that long.  A continuously busy writer lets go after
# _LINGER_MAX and then stays off the lock for _LINGER_YIELD, which is longer than a waiter's
# poll interval, so another process that wants the lock gets it within about _LINGER_MAX.
_LINGER_IDLE = 0.005
_LINGER_MAX = 0.1
_POLL_INTERVAL = 0.002
_LINGER_YIELD = 0.003
# A hold that continues work begun under an earlier one (exclusive(continuing=True)) lets go
# only after this long: giving the lock away in the middle of such work makes the others wait
# on its result anyway (the thread store's leases), so it waits for the work's next boundary.
_LINGER_MAX_CONTINUING = 0.2
# Epoch values (see lock_epoch) come from one counter for the whole process, and a forked
# child keeps counting from where its parent was, so an epoch remembered from before a fork
# (or from another lock's entry) can never match a fresh one by accident.
_epochs = itertools.count(1)


class _Exclusive:
    """The lock on one lock file: a thread lock, then the process's flock on the file.

    The flock (taken and let go with ``filelock``'s descriptor functions) excludes other
    processes; the reentrant thread lock in front of it excludes this process's other threads.
    The file is opened for each physical acquisition and closed when it is let go, as
    ``filelock.FileLock`` does.  The flock itself is taken once per *hold*: a hold that asked
    to linger stays physically locked after its last exit until :data:`_LINGER_IDLE` passes
    unused (the reaper thread releases it) or :data:`_LINGER_MAX` passes (the next entry
    releases it).
    ``epoch`` takes a new value on every physical acquisition, so a caller can tell whether
    another process may have had the lock since it last looked.
    """

    __slots__ = (
        "_depth",
        "_held",
        "_held_since",
        "_idle_since",
        "_linger",
        "_probe",
        "_fd",
        "epoch",
        "path",
        "scheduled",
        "thread_lock",
        "__weakref__",
    )

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None  # open while this process holds the flock
        self.thread_lock = threading.RLock()
        self._depth = 0
        self._held = False  # this process holds the flock
        self._held_since = 0.0
        self._idle_since = 0.0
        self._linger = False  # the current outermost hold asked to linger
        self.scheduled = False  # in the reaper's set
        self._probe: int | None = None  # descriptor for _free_now, opened on first use
        self.epoch = 0

    def enter(
        self,
        linger: bool,
        while_waiting: Callable[[], object] | None = None,
        continuing: bool = False,
    ) -> None:
        self.thread_lock.acquire()
        try:
            if self._depth == 0:
                longest = _LINGER_MAX_CONTINUING if continuing else _LINGER_MAX
                if self._held and time.monotonic() - self._held_since >= longest:
                    self._release_file()
                    time.sleep(_LINGER_YIELD)  # let a process polling for the lock in
                if not self._held:
                    if while_waiting is None:
                        self._take_file(blocking=True)
                    else:
                        self._acquire_working(while_waiting)
                    self._held = True
                    self._held_since = time.monotonic()
                    self.epoch = next(_epochs)
                self._linger = linger
            elif linger:
                self._linger = True
            self._depth += 1
        except BaseException:
            self.thread_lock.release()
            raise

    def _acquire_working(self, while_waiting: Callable[[], object]) -> None:
        """Take the flock, calling ``while_waiting`` before each poll while others hold it."""
        while True:
            if self._free_now() and self._take_file(blocking=False):
                return
            while_waiting()
            time.sleep(_POLL_INTERVAL)

    def _take_file(self, *, blocking: bool) -> bool:
        """Take the flock (waiting for it when ``blocking``); whether it was taken."""
        fd = _open_lock_file(self.path)
        try:
            # Waiters poll with LOCK_NB: every _POLL_INTERVAL, which is far below the fsync a
            # writer waits on and below _LINGER_YIELD, so a poll lands in a busy holder's yield.
            if filelock.lock_descriptor(fd, blocking=blocking, poll_interval=_POLL_INTERVAL):
                self._fd = fd
                return True
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return False

    def _free_now(self) -> bool:
        """Whether nobody holds the flock right now (``True`` when that cannot be told).

        A shared flock on a descriptor of our own, dropped at once, costs two system calls;
        a failed attempt costs an open and a close of the file too.
        Waiting processes poll every few milliseconds all the time another one works, so on
        a busy store their polls took a fifth of a core away from the holder.
        """
        if fcntl is None:
            return True
        if self._probe is None:
            self._probe = _open_lock_file(self.path)
        try:
            fcntl.flock(self._probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            return True  # no flock here: the attempt itself raises what it must
        fcntl.flock(self._probe, fcntl.LOCK_UN)
        return True

    def exit(self) -> None:
        try:
            self._depth -= 1
            if self._depth == 0 and self._held:
                if self._linger:
                    self._idle_since = time.monotonic()
                    if not self.scheduled:
                        self.scheduled = True
                        try:
                            _reaper.add(self)
                        except RuntimeError:  # no thread for the reaper (a task limit)
                            self.scheduled = False
                            self._release_file()  # released now rather than never
                else:
                    self._release_file()
        finally:
            self.thread_lock.release()

    @property
    def lingering(self) -> _Lingering:
        # Made on demand rather than kept: a kept one would be a reference cycle, and an
        # entry nobody uses should go with its last reference, not at the next full GC.
        return _Lingering(self)

    def __enter__(self) -> None:
        self.enter(False)

    def __exit__(self, *exc_info: object) -> None:
        self.exit()

    def release_idle(self) -> None:
        """Release a lingering flock now unless a thread of this process is inside (never waits)."""
        if self.reap(idle_for=0.0) is None:
            _reaper.forget(self)

    def reap(self, *, idle_for: float) -> float | None:
        """Release the flock if it has lingered unused for ``idle_for`` seconds.

        Returns ``None`` when nothing is held any more, else when to look again.  Never waits
        for the thread lock: a thread inside (or about to enter) keeps the lock, and its exit
        sets a new idle deadline anyway.
        """
        now = time.monotonic()
        if not self.thread_lock.acquire(blocking=False):
            return now + _LINGER_IDLE
        try:
            if self._depth:
                return now + _LINGER_IDLE
            if self._held:
                deadline = self._idle_since + idle_for
                if now < deadline:
                    return deadline
                self._release_file()
            self.scheduled = False
            return None
        finally:
            self.thread_lock.release()

    def _release_file(self) -> None:
        self._held = False
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                filelock.unlock_descriptor(fd)
            finally:
                os.close(fd)  # (which lets go of the flock too, should the unlock fail)

    def forget_in_child(self) -> None:
        """In a forked child: close what the parent's entry had open, letting go of nothing
        (the flock belongs to the parent, whose descriptor shares it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.close_probe()

    def close_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(OSError):
                os.close(probe)

    def __del__(self) -> None:
        # Nobody uses this entry any more (see _locks), so nobody holds or awaits its flock.
        self.close_probe()


class _Lingering:
    """``with entry.lingering:``: like ``with entry:`` but keeps the flock after the exit."""

    __slots__ = ("_entry",)

    def __init__(self, entry: _Exclusive) -> None:
        self._entry = entry

    def __enter__(self) -> None:
        self._entry.enter(True)

    def __exit__(self, *exc_info: object) -> None:
        self._entry.exit()


class _Working:
    """``with _Working(...):``: :meth:`_Exclusive.enter` with a waiting hook or ``continuing``."""

    __slots__ = ("_continuing", "_entry", "_linger", "_while_waiting")

    def __init__(
        self,
        entry: _Exclusive,
        linger: bool,
        while_waiting: Callable[[], object] | None,
        continuing: bool,
    ) -> None:
        self._entry = entry
        self._linger = linger
        self._while_waiting = while_waiting
        self._continuing = continuing

    def __enter__(self) -> None:
        self._entry.enter(self._linger, self._while_waiting, self._continuing)

    def __exit__(self, *exc_info: object) -> None:
        self._entry.exit()


class _Reaper:
    """One daemon thread that releases lingering flocks once they have been idle long enough.

    Started on first use (and again in a forked child, where threads do not survive).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._pending: set[_Exclusive] = set()
        self._thread: threading.Thread | None = None

    def add(self, entry: _Exclusive) -> None:
        with self._cond:
            first = not self._pending
            self._pending.add(entry)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="adaptor-lock-reaper", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # tried again by the next add
                    self._pending.discard(entry)
                    raise
                self._thread = thread
            if first:
                # Otherwise the thread already sleeps until an earlier entry's idle deadline,
                # which is no later than this one's: waking it for every entry (a daemon
                # makes a few per request) only cost context switches.
                self._cond.notify()

    def forget(self, entry: _Exclusive) -> None:
        """Stop watching ``entry``, which lingers no more."""
        with self._cond:
            # An exit after reap() may have scheduled it again; keep that one.
            if not entry.scheduled:
                self._pending.discard(entry)

    def _reap_pending(self) -> float:
        """Release what lingered long enough; returns when to look again.

        A method of its own so that no local variable keeps an entry alive while the thread
        sleeps: the registry drops entries nobody holds (see ``_locks``).
        """
        with self._cond:
            pending = list(self._pending)
        wake = time.monotonic() + _LINGER_IDLE
        for entry in pending:
            again = entry.reap(idle_for=_LINGER_IDLE)
            if again is None:
                self.forget(entry)
            else:
                wake = min(wake, again)
        return wake

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
            wake = self._reap_pending()
            delay = wake - time.monotonic()
            if delay > 0:
                with self._cond:
                    self._cond.wait(delay)


_reaper = _Reaper()
# The registry holds its entries weakly.  Whoever uses an entry holds it (a ``with`` block, the
# reaper while the flock lingers), and so does this registry for as long as it is in use, so
# a path still has exactly one entry at a time; one nobody uses any more goes away instead of
# staying for the life of the process (a daemon writes a new event log for every request).
_locks: weakref.WeakValueDictionary[str, _Exclusive] = weakref.WeakValueDictionary()
_locks_guard = threading.Lock()


def _reset_locks_in_child() -> None:
    # A forked child has neither the threads that held these nor the reaper, and must not
    # hold (nor ever unlock) the parent's flocks: it closes the inherited descriptors, so a
    # flock lives on in the parent alone, and starts over with fresh, unheld locks.
    global _locks_guard, _reaper
    _locks_guard = threading.Lock()
    _reaper = _Reaper()
    for old in list(_locks.values()):
        old.forget_in_child()
    _locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_in_child)


def _registered(path: _StrPath) -> _Exclusive | None:
    """``path``'s entry if one is in use, else None."""
    # Registered keys are absolute paths: a string found as it is needs no abspath().
    found = _locks.get(path) if isinstance(path, str) else None
    return found if found is not None else _locks.get(os.path.abspath(path))


def _entry(path: _StrPath) -> _Exclusive:
    found = _registered(path)
    if found is None:
        key = os.path.abspath(path)
        with _locks_guard:
            found = _locks.get(key)
            if found is None:
                # This registry is the singleton: filelock's is_singleton would rebuild a
                # lock whose object was dropped while its flock is still held (it only
                # remembers the object), and it rejects differing options.
                found = _locks[key] = _Exclusive(key)
    return found


def exclusive(
    path: _StrPath,
    *,
    linger: bool = False,
    while_waiting: Callable[[], object] | None = None,
    continuing: bool = False,
) -> contextlib.AbstractContextManager[None]:
    """Hold the lock file ``path`` against other processes and other threads of this process.

    Reentrant in the holding thread.  Blocks without a timeout.  The file is created ``0o600``
    if missing and never deleted.  With ``linger=True`` the flock outlives the block for a few
    milliseconds (see :data:`_LINGER_IDLE`), so a caller that comes straight back skips
    re-acquiring it; other processes wait at most about :data:`_LINGER_MAX` for it.

    ``continuing=True`` says this hold continues work begun under an earlier one, which others
    would only wait on if they got the lock now: a lingering flock held longer than
    :data:`_LINGER_MAX` is then kept (up to :data:`_LINGER_MAX_CONTINUING`) and given away at
    the next hold that is not continuing.

    ``while_waiting`` is called (holding this process's thread lock, not the flock) each
    time the flock turns out to be held by another process, before waiting a poll interval:
    work that needs no lock, such as reading ahead what the holder appends, is then done
    while waiting rather than after.  An exception from it propagates, lock not taken.
    """
    entry = _entry(path)
    if while_waiting is not None or continuing:
        return _Working(entry, linger, while_waiting, continuing)
    return entry.lingering if linger else entry


def lock_epoch(path: _StrPath) -> int:
    """A number that changes whenever another holder may have had the lock file ``path``.

    It moves on every physical acquisition of the flock by this process (another process
    may have held it in between), on every :class:`DurableLog` append, and on
    :func:`touch_epoch`, which any other in-process writer must call after changing what the
    lock guards (a :class:`DurableLog` trusts an unchanged epoch to mean an unchanged file).
    Equal readings taken while holding the lock mean nobody else changed the guarded files in
    between.
    """
    return _entry(path).epoch


def touch_epoch(path: _StrPath) -> int:
    """Advance :func:`lock_epoch` (call it holding the lock, after a change); returns it."""
    entry = _entry(path)
    entry.epoch = next(_epochs)
    return entry.epoch


_NO_WRITE_ACCESS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def is_no_write_access(exc: BaseException) -> bool:
    """Whether ``exc`` says this process may not write there (permissions, a read-only mount,
    an immutable file)."""
    return isinstance(exc, OSError) and exc.errno in _NO_WRITE_ACCESS


@contextlib.contextmanager
def held_for_reading(path: _StrPath) -> Iterator[None]:
    """Hold the existing lock file ``path`` that this process may not open for writing (a
    read-only mount, a copy it may only read), for a read of what the lock guards.

    The file is opened read-only and flocked as :func:`exclusive` flocks it (``flock`` takes
    no write access), so a writer in another process waits until the read is done.  Nothing is
    created, nothing lingers, and no epoch moves: a reader holding it must read the guarded
    files afresh.  Raises the ``OSError`` of the open (``FileNotFoundError``: no lock file).
    """
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    try:
        # Polled as often as the writers poll: a busy writer lets the lock go only for a few
        # milliseconds in every _LINGER_MAX, which filelock's default 50 ms poll rarely meets.
        filelock.lock_descriptor(fd, poll_interval=_POLL_INTERVAL)
        try:
            yield
        finally:
            filelock.unlock_descriptor(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def held_to_read(
    path: _StrPath,
    *,
    linger: bool = False,
    while_waiting: Callable[[], object] | None = None,
    continuing: bool = False,
) -> Iterator[bool]:
    """:func:`exclusive` for a read; yields whether it is the writers' own hold.

    Where this process may not open the lock file for writing (:func:`is_no_write_access`: a
    read-only mount, a copy it may only read, an immutable file) the lock is held for reading
    instead (:func:`held_for_reading`), and without a lock file nothing is held: a writer makes
    it before it touches anything, so none is inside.  Either way it yields ``False``, and the
    reader must read the guarded files afresh.
    """
    refused = False
    with contextlib.ExitStack() as hold:
        try:
            hold.enter_context(
                exclusive(path, linger=linger, while_waiting=while_waiting, continuing=continuing)
            )
        except OSError as exc:
            if not is_no_write_access(exc):
                raise
            refused = True
        if refused:  # (outside the handler: an error of the reader's is not one "during" it)
            with contextlib.suppress(FileNotFoundError):
                hold.enter_context(held_for_reading(path))
        yield not refused


def release_lingering(path: _StrPath) -> None:
    """Let go of ``path``'s flock now if it is only lingering (nobody here is inside)."""
    found = _registered(path)
    if found is not None:
        found.release_idle()


# ---------------------------------------------------------------------------------------------
# Framed records


def frame(obj: Mapping[str, Any]) -> bytes:
    """One JSONL line: ``obj`` plus ``crc`` (CRC32 of the sorted-key JSON of ``obj`` without it).

    An existing ``crc`` key in ``obj`` is ignored and recomputed.
    """
    return _seal({key: value for key, value in obj.items() if key != "crc"})


def _seal(body: dict[str, Any]) -> bytes:
    """Add ``crc`` to ``body`` (which must not have one) in place and serialize it."""
    data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    crc = crc32(data)
    # With sorted keys, "crc" comes first whenever every other key sorts after it (orjson
    # orders keys by code point, as str comparison does), and then the line is the body's own
    # serialization with the crc spliced in after the brace: one serialization instead of two.
    # The smallest key is the first one serialized, so its text, compared as bytes, decides
    # (UTF-8 keeps code point order).  Whatever could mislead the comparison says "no":
    # escapes start with a backslash and a short key ends with a quote, both below "c"; a
    # longer key "crc<space>..." or "crc!..." is merely taken the slow way.
    spliceable = data[2:6] > b'crc"'
    body["crc"] = crc
    if spliceable:
        # A long line (an agent's whole answer, a tool's output) is spliced from a view: a
        # slice would be one more copy of it in memory, as large as the line.
        if len(data) >= _VIEW_FROM:
            return b"".join((b'{"crc":%d,' % crc, memoryview(data)[1:], b"\n"))
        return b'{"crc":%d,%b\n' % (crc, data[1:])
    return orjson.dumps(body, option=_LINE_OPTS)


# Below this, a slice and one format cost less than a view and a join.
_VIEW_FROM: Final = 64 * 1024


_CRC_OF_BRACE = crc32(b"{")


def crc_matches_text(line: bytes, crc: int) -> bool:
    """Whether ``line`` with its ``"crc":<crc>,`` member cut out has that crc.

    :func:`frame` writes the body's sorted-key serialization with the crc member added in key
    order, so cutting the member out gives back exactly the bytes the crc covers, and a line
    this module wrote needs no re-serialization to check: the member is usually first (then
    the check is a prefix test), or after keys that sort before ``"crc"`` (such as ``"bind"``).
    A ``False`` is not a verdict: the caller falls back to re-serializing the parsed record,
    which accepts exactly what it always accepted (a line a different serializer wrote with
    the canonical crc, say, or one whose first ``"crc":<crc>,`` text is nested deeper).
    """
    head = b'{"crc":%d,' % crc
    if line.startswith(head):
        return crc32(line[len(head) :], _CRC_OF_BRACE) == crc
    member = head[1:]
    at = line.find(member)
    return at > 0 and crc32(line[at + len(member) :], crc32(line[:at])) == crc


def unframe(line: bytes) -> dict[str, Any]:
    """Parse a line made by :func:`frame` (trailing newline optional) and verify its crc.

    Raises ``ValueError`` with a short reason.  The returned dict includes ``crc``.
    """
    if line.endswith(b"\n"):
        line = line[:-1]
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ValueError("invalid json") from None
    if not isinstance(record, dict):
        raise ValueError("not an object")
    if "crc" not in record:
        raise ValueError("missing crc")
    crc = record.pop("crc")
    # bool is an int subclass; True must not pass for a crc of 1.
    if type(crc) is not int or not (
        crc_matches_text(line, crc)
        or crc == crc32(orjson.dumps(record, option=orjson.OPT_SORT_KEYS))
    ):
        raise ValueError("bad crc")
    record["crc"] = crc
    return record


def _parse(raw: bytes, seq_key: str, expected: int | None) -> dict[str, Any]:
    """Validate one raw line as read from the file; ``expected=None`` skips the sequence check."""
    if not raw.endswith(b"\n"):
        raise ValueError("unterminated last line")
    if raw == b"\n":
        raise ValueError("empty line")
    record = unframe(raw)
    seq = record.get(seq_key)
    if type(seq) is not int:
        raise ValueError(f"missing {seq_key}" if seq is None else f"bad {seq_key}: {seq!r}")
    if expected is not None and seq != expected:
        kind = "sequence gap" if seq > expected else "sequence went backwards"
        raise ValueError(f"{kind}: expected {expected} got {seq}")
    return record


def may_be_torn(raw: bytes) -> bool:
    """Whether a bad last line (``raw``: the line, or as much of its beginning as was read) can
    be what a crash mid-append left: a prefix of one of our records (each is a JSON object, so
    it begins with ``{``), the zeros a power cut leaves where unsynced data was, or a bare
    newline.

    Any other tail was never written by a DurableLog: a stray text file at the log's path, a
    note someone appended.  Nor is a line holding a whole JSON object and more after it: a
    prefix of one record is a whole object only when it is the whole record, so that is
    records run together (the newline between the last two changed, an editor's line join).
    Cutting either would destroy data (acknowledged records, in the latter), so it is
    corruption instead.
    """
    first = raw[:1]
    if first == b"{":
        return not _whole_object_and_more(raw)
    return first in (b"\x00", b"\n")


_json_scanner = json.JSONDecoder()


def _whole_object_and_more(raw: bytes) -> bool:
    """Whether ``raw`` begins with a whole JSON value followed by anything but the zeros and
    line ends a crash may leave after it."""
    text = raw.decode("utf-8", errors="replace")  # a torn multi-byte character is no verdict
    try:
        _, end = _json_scanner.raw_decode(text)
    except (ValueError, RecursionError):  # no whole value at its start (or no verdict)
        return False
    return bool(text[end:].strip("\x00\r\n"))


def not_torn(why: str, raw: bytes) -> str:
    """The reason given for a bad last line ``raw`` that :func:`may_be_torn` refuses (corruption)."""
    if raw[:1] == b"{":
        return (f"{why}; not a torn record of this log (it holds a whole JSON object and more after "
                "it: lines run together), so it is kept")
    return f"{why}; not a torn record of this log (it does not begin as one does), so it is kept"


def _preview(raw: bytes) -> str:
    return raw[:_PREVIEW_BYTES].decode("utf-8", errors="replace")[:_PREVIEW_CHARS]


# ---------------------------------------------------------------------------------------------
# Streaming readers


@dataclass(frozen=True, slots=True)
class _Bad:
    line: int
    offset: int
    why: str
    torn: bool  # the last line, and may_be_torn(): a crash artifact, not corruption
    head: bytes


def _checked(
    f: IO[bytes], seq_key: str, start_seq: int
) -> Iterator[tuple[int, dict[str, Any] | _Bad]]:
    """Yield ``(line_no, record)``; the first invalid line is yielded as :class:`_Bad` and ends it.

    Holds at most two lines in memory: one line of lookahead tells a bad *last* line (a crash
    artifact) from a bad line with more data after it (corruption).
    """
    expected = start_seq
    offset = 0
    line_no = 0
    upcoming = f.readline()
    while upcoming:
        raw, upcoming = upcoming, f.readline()
        line_no += 1
        try:
            record = _parse(raw, seq_key, expected)
        except ValueError as exc:
            torn = not upcoming and may_be_torn(raw)
            why = str(exc) if torn or upcoming else not_torn(str(exc), raw)
            yield line_no, _Bad(line_no, offset, why, torn, raw[:_PREVIEW_BYTES])
            return
        yield line_no, record
        expected += 1
        offset += len(raw)


def open_for_read(path: _StrPath, flags: int = os.O_RDONLY) -> IO[bytes]:
    """A log opened to be read (``flags`` may add write access, for a repair).

    Only a regular file is opened: a symbolic link at ``path`` or anything else standing
    there (a FIFO, a folder, a socket) raises :class:`ForeignFileError`.  ``O_NONBLOCK``
    makes a FIFO one of those instead of an ``open`` (or a read) that waits forever for a
    writer nobody will start.  ``FileNotFoundError`` passes through.
    """
    fd, _ = open_regular(path, flags)
    return os.fdopen(fd, "rb", buffering=_BLOCK)


def open_regular(path: _StrPath, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
    """Open ``path`` only if a regular file is (or, with ``O_CREAT``, comes to be) there:
    the descriptor and its stat.  A symbolic link, a folder, a FIFO or a socket raises
    :class:`ForeignFileError` and is left as it was; ``O_NONBLOCK`` refuses a FIFO (``ENXIO``,
    or the type check) instead of waiting on it, and changes nothing for a regular file."""
    try:
        fd = os.open(path, flags | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            what = "is a symbolic link" if exc.errno == errno.ELOOP else "is not a regular file"
            raise ForeignFileError(exc.errno, what, os.fspath(path)) from None
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ForeignFileError(errno.EINVAL, "is not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, found


def scan(
    path: _StrPath, *, seq_key: str = "seq", start_seq: int = 1, strict: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream ``(line_no, record)`` from a framed log, validating every line.

    Raises :class:`CorruptLogError` on an unterminated last line, an empty line, invalid JSON,
    a non-object, a bad or missing crc, or a sequence that is not exactly previous + 1 (the
    first record must carry ``start_seq``).  With ``strict=False`` a bad *last* line is taken
    to be an append in progress (or a crash artifact) and ends the iteration quietly; a bad line
    anywhere else still raises.  A missing file yields nothing.  Memory use is bounded by the
    longest line, not the file size.
    """
    name = os.fspath(path)
    try:
        f = open_for_read(name)
    except FileNotFoundError:
        return
    with f:
        for line_no, item in _checked(f, seq_key, start_seq):
            if isinstance(item, _Bad):
                if item.torn and not strict:
                    return
                raise CorruptLogError(name, item.line, item.why)
            yield line_no, item


def _find_torn(f: IO[bytes], path: str, seq_key: str, start_seq: int) -> RepairReport | None:
    for _, item in _checked(f, seq_key, start_seq):
        if isinstance(item, _Bad):
            if not item.torn:
                raise CorruptLogError(path, item.line, item.why)
            size = os.fstat(f.fileno()).st_size
            return RepairReport(path, item.offset, size - item.offset, _preview(item.head))
    return None


def cut_tail(path: str, offset: int) -> RepairReport:
    """Truncate the regular file at ``path`` to ``offset``, durably; what was cut.

    For a caller that judged the bytes past ``offset`` a crash's leftovers under the file's
    lock (the thread store's power-cut suffix), and records the cut as every repair is.
    """
    fd, found = open_regular(path, os.O_RDWR)
    try:
        head = os.pread(fd, _PREVIEW_BYTES, offset)
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return RepairReport(path, offset, max(0, found.st_size - offset), _preview(head))


def inspect_tail(
    path: _StrPath, *, seq_key: str = "seq", start_seq: int = 1
) -> RepairReport | None:
    """What :func:`repair` would cut, without taking the lock or changing anything.

    Reads the whole file (streaming) so corruption anywhere raises :class:`CorruptLogError`.
    Without the lock, a writer's append in progress can show up as a torn tail.
    """
    name = os.fspath(path)
    try:
        f = open_for_read(name)
    except FileNotFoundError:
        return None
    with f:
        return _find_torn(f, name, seq_key, start_seq)


def repair(path: _StrPath, *, seq_key: str = "seq", start_seq: int = 1) -> RepairReport | None:
    """Under the log's lock, truncate a torn tail (and only that) and fsync.

    Returns what was cut, or ``None`` when the log is intact or missing.  Corruption before
    the last line raises :class:`CorruptLogError` and leaves the file untouched.
    """
    name = os.fspath(path)
    if not os.path.lexists(name):
        return None  # don't create a lock file next to a log that does not exist
    with exclusive(name + ".lock"):
        try:
            f = open_for_read(name, os.O_RDWR)
        except FileNotFoundError:
            return None
        with f:
            report = _find_torn(f, name, seq_key, start_seq)
            if report is not None:
                os.ftruncate(f.fileno(), report.offset)
                os.fsync(f.fileno())
                touch_epoch(name + ".lock")  # writers here must look at the file again
        return report


# ---------------------------------------------------------------------------------------------
# The writer


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


def _rfind_newline(fd: int, end: int) -> int:
    """Offset of the last ``\\n`` in ``[0, end)``, or -1; reads backwards one block at a time."""
    pos = end
    while pos > 0:
        start = max(0, pos - _BLOCK)
        found = _pread_exact(fd, pos - start, start).rfind(b"\n")
        if found >= 0:
            return start + found
        pos = start
    return -1


def _line_number(fd: int, offset: int) -> int:
    # Only on the error path: counting newlines is the one reason to read the whole prefix.
    count = 0
    pos = 0
    while pos < offset:
        chunk = _pread_exact(fd, min(_BLOCK, offset - pos), pos)
        if not chunk:
            break
        count += chunk.count(b"\n")
        pos += len(chunk)
    return count + 1


def _check_tail(
    fd: int, size: int, path: str, seq_key: str, version: int | None = None
) -> tuple[int, RepairReport | None]:
    """Return ``(last_good_seq, torn)`` from the last two lines only.

    The line before the last must be valid (else :class:`CorruptLogError`); the last line is a
    torn tail if it is unterminated or fails JSON, crc or sequence checks, and
    :func:`may_be_torn` (else :class:`CorruptLogError` too).  A whole line of another format
    ``version`` (a newer adaptor's) is :class:`CorruptLogError` as well: appended after, a
    record would be acknowledged that no reader of this version can reach.
    """
    if size == 0:
        return 0, None
    terminated = _pread_exact(fd, 1, size - 1) == b"\n"
    boundary = _rfind_newline(fd, size - 1 if terminated else size)
    last_start = boundary + 1
    prev_seq = 0
    if boundary >= 0:
        prev_start = _rfind_newline(fd, boundary) + 1
        try:
            prev = _parse(_pread_exact(fd, last_start - prev_start, prev_start), seq_key, None)
        except ValueError as exc:
            raise CorruptLogError(path, _line_number(fd, prev_start), str(exc)) from None
        _require_version(prev, version, path, fd, prev_start)
        prev_seq = prev[seq_key]
    if terminated:
        raw = _pread_exact(fd, size - last_start, last_start)
        try:
            last = _parse(raw, seq_key, prev_seq + 1)
        except ValueError as exc:
            why = str(exc)
        else:
            _require_version(last, version, path, fd, last_start)
            return prev_seq + 1, None
    else:
        # Enough of it to see a whole record with more after it (records run together).
        raw = _pread_exact(fd, min(size - last_start, _TAIL_CHECK_BYTES), last_start)
        why = "unterminated last line"
    if not may_be_torn(raw):
        raise CorruptLogError(path, _line_number(fd, last_start), not_torn(why, raw))
    return prev_seq, RepairReport(path, last_start, size - last_start, _preview(raw))


def _require_version(record: Mapping[str, Any], version: int | None, path: str, fd: int, offset: int) -> None:
    if version is not None and record.get("v") != version:
        why = f"unsupported format version {record.get('v')!r:.40}"
        raise CorruptLogError(path, _line_number(fd, offset), why)


SHRANK: Final = "log shrank below acknowledged data"
"""The ``why`` of the :class:`CorruptLogError` of a file that shrank under its writer: unlike
other corruption, the file may read as whole, so only the writer's memory knows."""


class DurableLog:
    """Append-only framed JSONL file.

    Every record gets ``v`` (when ``version`` is not None), a per-file sequence field
    (``seq_key``, strictly 1, 2, 3, ...) and ``crc``; those keys in the caller's objects are
    overwritten.  Appends from any number of instances, threads and processes are serialized by
    :func:`exclusive` on ``<path>.lock``.  An append returns only after the batch is written
    with one ``write`` and (with ``sync=True``) fdatasynced.

    Before writing, whenever the file is new to this instance or changed size since its last
    append, the last two lines are checked: a torn last line is truncated away (see
    :attr:`repaired`), a bad line before it raises :class:`CorruptLogError` and nothing is
    written.  Corruption deeper in the file is not looked for here; :func:`scan` finds it.
    While :func:`lock_epoch` has not moved since this instance's last append (the flock was
    held throughout and nobody here wrote), the file is not looked at at all.  Every append
    advances the epoch, so other instances in this process look again.

    A failed write is rolled back to the previous size; a failed fsync (or a failed rollback)
    makes this instance refuse every later append, because the kernel may have dropped the data
    while reporting the error only once.
    """

    def __init__(
        self,
        path: _StrPath,
        *,
        seq_key: str = "seq",
        version: int | None = 1,
        sync: bool = True,
        lock_path: _StrPath | None = None,
    ) -> None:
        self._path = os.fspath(path)
        # A caller that already serializes every writer of this file under a lock of its own
        # names it here, so an append re-enters that lock instead of taking a second one.
        self._lock_path = os.path.abspath(
            self._path + ".lock" if lock_path is None else os.fspath(lock_path)
        )
        self._seq_key = seq_key
        self._version = version
        self._sync = sync
        self._fd: int | None = None
        self._dir_ready = False
        # Size of the file after this instance's last check or append; -1 forces a tail check.
        self._seen_size = -1
        # The file is known durable up to here (-1: not known).  Only when it is durable up to
        # where an append starts may that append sync with RWF_DSYNC, which syncs its own range.
        self._durable_size = -1
        # lock_epoch() right after this instance's last append (0: none).  Every append
        # advances the epoch, and so does every physical acquisition of the flock, so finding
        # it unchanged under the lock means nobody (no other process, no other instance here)
        # has touched the file since: the next append needs not even an fstat.
        self._epoch = 0
        self._last_seq = 0
        self._repaired: list[RepairReport] = []
        self._found_size = -1
        self._appended_at = -1
        self._suspect: OSError | None = None
        self._closed = False
        self._lock_entry: _Exclusive | None = None
        self._file_id: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"DurableLog({self._path!r})"

    def _lock(self) -> _Exclusive:
        """This log's lock entry, kept for the instance's life.

        Looked up once: otherwise every close of a log idle long enough for the reaper to let
        its entry go (a daemon closes one with every request) built a filelock object again
        only to find nothing to release.  A fork resets the registry; the child takes the
        fresh entry.
        """
        entry = self._lock_entry
        if entry is None or _locks.get(self._lock_path) is not entry:
            entry = self._lock_entry = _entry(self._lock_path)
        return entry

    def __enter__(self) -> DurableLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def repaired(self) -> list[RepairReport]:
        """Torn tails this instance truncated, oldest first."""
        return list(self._repaired)

    @property
    def size(self) -> int:
        """The file's size right after this instance's last append (-1 before the first)."""
        return self._seen_size

    @property
    def file_id(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the file the last append wrote to (None before the first):
        another file once the path was replaced, or the file moved away or deleted."""
        return self._file_id

    def duplicate_descriptor(self) -> int:
        """A new descriptor of the file the last append wrote to (``os.dup``), for syncing it
        later whatever happens to its path or to this instance; the caller closes it."""
        if self._fd is None:
            raise ValueError(f"{self!r} has no file open")
        return os.dup(self._fd)

    @property
    def repair_count(self) -> int:
        """``len(self.repaired)`` without copying the list."""
        return len(self._repaired)

    @property
    def found_size(self) -> int:
        """The file's size when the last append took the lock, before any repair; -1 if that
        append failed before it could look (so it had not touched the file)."""
        return self._found_size

    @property
    def appended_at(self) -> int:
        """Where the last successful append's batch begins in the file (-1 before the first)."""
        return self._appended_at

    def append(self, obj: Mapping[str, Any], *, sync: bool | None = None) -> dict[str, Any]:
        """Append one record; returns it as written (with ``v``, the sequence field and ``crc``).

        ``sync`` overrides the instance's setting for this append (``False``: written, not
        fdatasynced; a later synced append to this file makes it durable too).
        """
        return self.append_many([obj], sync=sync)[0]

    def append_many(
        self, objs: Sequence[Mapping[str, Any]], *, sync: bool | None = None
    ) -> list[dict[str, Any]]:
        """Append a batch with one write and one fsync (group commit); all or nothing.

        The lock lingers (see :func:`exclusive`): back-to-back appends take the flock once.
        """
        if not objs:
            return []
        if self._closed:
            self._check_usable()  # before the lock too: no waiting on others only to refuse
        if not self._dir_ready:
            ensure_dir(os.path.dirname(os.path.abspath(self._path)))
            self._dir_ready = True
        entry = self._lock()
        # entry.enter/exit rather than `with entry.lingering`: this runs once per append, and
        # the context manager's object and two calls were 3% of an append's instructions.
        entry.enter(True)
        try:
            self._check_usable()
            self._found_size = -1
            if self._fd is not None and entry.epoch == self._epoch:
                # Nobody has had the lock since our last append (see _epoch): the file is
                # exactly as that append left it, so skip the fstat and the tail check.
                fd, size = self._fd, self._seen_size
                self._found_size = size
            else:
                fd, size = self._open()
                self._found_size = size
                if size != self._seen_size:
                    # Someone else appended, perhaps without syncing.  (An unchanged size
                    # means nobody did, see _check_file: what this instance synced still is.)
                    self._durable_size = -1
                self._check_file(fd, size)
            self._epoch = 0  # until this append has succeeded
            records: list[dict[str, Any]] = []
            lines: list[bytes] = []
            number = self._last_seq
            version = self._version
            seq_key = self._seq_key
            for obj in objs:
                number += 1
                record = dict(obj)
                record.pop("crc", None)
                if version is not None:
                    record["v"] = version
                record[seq_key] = number
                lines.append(_seal(record))
                records.append(record)
            self._commit(
                fd,
                lines[0] if len(lines) == 1 else b"".join(lines),
                len(records),
                self._sync if sync is None else sync,
            )
            # Other instances in this process appending under the same lock must notice.
            entry.epoch = self._epoch = next(_epochs)
            return records
        finally:
            entry.exit()

    def close(self) -> None:
        """Close the file descriptor; idempotent.  Later appends raise ``ValueError``."""
        # Only the thread half of the lock: closing must not wait on another process.
        lock = self._lock()
        with lock.thread_lock:
            self._closed = True
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
        # Whoever else in this process still appends takes it again; another process should
        # not have to wait out the linger for a writer that is done.
        lock.release_idle()
        self._lock_entry = None  # the entry may go now, unless someone else still uses it

    def __del__(self) -> None:
        # Dropped without close(): nobody can be inside an append (it holds a reference), so
        # the descriptor goes without the lock, which here could wait on another thread.
        close_quietly(getattr(self, "_fd", None))
        self._fd = None

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError(f"{self!r} is closed")
        if self._suspect is not None:
            raise OSError(
                self._suspect.errno,
                "log is suspect after a failed write or fsync; verify it before appending again",
                self._path,
            ) from self._suspect

    def _open(self) -> tuple[int, int]:
        """The descriptor to append through and the file's current size."""
        if self._fd is not None:
            # A compactor may rename a fresh file over the path, a person delete the file or
            # move it away (logrotate's rename); appending through the old descriptor would
            # write into an orphaned inode, or into the file under its new name while the
            # path holds another.  (Only after the lock epoch moved: a compactor holds the
            # lock; a person's change is noticed once the flock is taken anew.)
            mine = os.fstat(self._fd)
            if mine.st_nlink > 0:
                try:
                    there = os.stat(self._path, follow_symlinks=False)
                except FileNotFoundError:
                    there = None
                if there is not None and os.path.samestat(mine, there):
                    self._file_id = (mine.st_dev, mine.st_ino)
                    return self._fd, mine.st_size
            fd, self._fd = self._fd, None
            self._seen_size = -1
            os.close(fd)
        # O_RDWR rather than O_WRONLY: the tail check reads through this same descriptor, so it
        # cannot inspect a different inode than the one it appends to.
        flags = os.O_RDWR | os.O_APPEND | _O_NOFOLLOW | _O_CLOEXEC
        try:
            fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # A FIFO would make every later step (the tail check's read, a rollback's reopen)
            # wait forever: refused, like any file that is not regular, before it is touched.
            fd, found = open_regular(self._path, flags)
            if found.st_size == 0:
                # Perhaps made by a writer killed before it synced its folder: the name this
                # append's data is acknowledged under must be durable too.
                try:
                    fsync_dir(os.path.dirname(os.path.abspath(self._path)))
                except BaseException:
                    os.close(fd)
                    raise
            self._fd = fd
            self._file_id = (found.st_dev, found.st_ino)
            return fd, found.st_size
        else:
            try:
                fsync_dir(os.path.dirname(os.path.abspath(self._path)))
            except BaseException:
                os.close(fd)
                # Nothing made the new name durable: take it back, so the next append
                # creates the file again and syncs its directory (an existing file is not).
                with contextlib.suppress(OSError):
                    os.unlink(self._path)
                raise
        self._fd = fd
        made = os.fstat(fd)
        self._file_id = (made.st_dev, made.st_ino)
        # Created empty just now (O_EXCL), under the lock every writer takes.
        return fd, 0

    def _check_file(self, fd: int, size: int) -> None:
        # Every writer holds the lock, acknowledged data is never removed and a torn tail only
        # sits past it, so an unchanged size means nobody else appended since our last append.
        if size == self._seen_size:
            return
        if size < self._seen_size:
            # Acknowledged data is never cut (a torn tail only sits past it): the file was
            # replaced or cut by hand, and appending would hand out its sequence numbers again.
            raise CorruptLogError(self._path, _line_number(fd, size), SHRANK)
        last_seq, torn = _check_tail(fd, size, self._path, self._seq_key, self._version)
        if torn is not None:
            try:
                os.ftruncate(fd, torn.offset)
                os.fsync(fd)
            except OSError as exc:
                self._suspect = exc
                raise
            self._repaired.append(torn)
            size = torn.offset
        self._last_seq = last_seq
        self._seen_size = size

    def _commit(self, fd: int, data: bytes, count: int, sync: bool) -> None:
        before = self._seen_size
        if sync and before == self._durable_size and _RWF_DSYNC is not None:
            self._commit_in_one_call(fd, data, before)
        else:
            self._write_or_roll_back(fd, data, before)
            if sync:
                self._sync_or_roll_back(fd, before)
        self._seen_size = before + len(data)
        self._appended_at = before
        self._last_seq += count
        if sync:
            self._durable_size = self._seen_size

    def _commit_in_one_call(self, fd: int, data: bytes, before: int) -> None:
        # One system call instead of write + fdatasync: under load from other threads every
        # call that drops the GIL costs a wait to get it back.
        try:
            written = _write_datasync(fd, data)
        except OSError as exc:
            # The error may come from the write (nothing written: the file is as durable as
            # before, e.g. a full disk) or from the sync (written, durability unknown: as
            # after a failed fsync, this instance must not append again).
            try:
                untouched = os.fstat(fd).st_size == before
            except OSError:
                untouched = False
            if not untouched:
                self._suspect = exc
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, before)
            raise
        if written != len(data):
            self._durable_size = -1
            self._write_or_roll_back(fd, data[written:], before)
            self._sync_or_roll_back(fd, before)

    def _write_or_roll_back(self, fd: int, data: bytes, before: int) -> None:
        try:
            _write_all(fd, data)
        except OSError as exc:
            # A partial batch must not stay visible: the caller was told the append failed.
            try:
                os.ftruncate(fd, before)
            except OSError:
                self._suspect = exc
            raise

    def _sync_or_roll_back(self, fd: int, before: int) -> None:
        try:
            _datasync(fd)
        except OSError as exc:
            # Never retry: after a failed fsync the page cache may already have dropped the
            # dirty pages, so a second fsync can "succeed" without the data (fsyncgate).
            self._suspect = exc
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
            raise

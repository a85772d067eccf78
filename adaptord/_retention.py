"""Retention: the files of finished requests, quarantined files and rotated lifecycle logs
removed once older than the ``[retention]`` settings (docs/daemon.md, "Disk use"), and files
writers left staged once a day old.

A request is forgotten whole, its verdict first: a reader (``adaptor wait``, ``events``) finds
the verdict and then reads the run's files, and checks the verdict is still there afterwards
(``adaptor.spool``), so it sees the request whole or not at all.  Its run folder and audit log
are renamed out of the way in the same step and removed afterwards, so an id submitted again
right then starts in a clean folder.  Nothing of a request on its way (in the spool, claimed:
queued, running, or with a verdict not yet written) is touched, nor ``threads/``, nor the log
of a thread that has a conversation (``events/thread=*.jsonl``): a thread log goes only when
its key has none in the store (every turn on it failed before one was saved, such as
``resume_only`` requests for a key that never had one) and nothing was appended to it for
``keep_days``.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final

from adaptor import _durable, _home
from adaptord.config import Retention

BATCH: Final = 10_000
"""Requests forgotten per pass at most (so a pass's memory is bounded on a home never pruned
before); a pass that reaches it is followed by another at the main loop's next turn."""

_DAY: Final = 86400.0
STAGED_KEPT_FOR: Final = _DAY
"""Seconds a file staged by a writer (in ``spool/tmp/``, or a response's temporary file in
``approvals/responses/``) may stay untouched before it counts as abandoned: a writer moves its
file into place within seconds, and one killed first never comes back for it."""
_TRASH: Final = ".pruning-"
_LOG: Final = ".jsonl"
_LOCK: Final = ".lock"
_ROTATED = re.compile(rf"^{_home.DAEMON_SESSION}-\d{{8}}T\d{{6}}Z(-\d+)?\.jsonl(\.lock)?$")


@dataclass
class Pruned:
    """What one pass removed (and how many removals failed, with the first reason)."""

    verdicts: int = 0
    runs: int = 0
    events: int = 0
    quarantine: int = 0
    lifecycle_logs: int = 0
    thread_logs: int = 0
    staged: int = 0
    failed: int = 0
    error: str | None = None

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("failed", "error")}

    def __bool__(self) -> bool:
        return any(self.counts().values())

    def _failed(self, exc: OSError) -> None:
        self.failed += 1
        if self.error is None:
            self.error = exc.strerror or type(exc).__name__


Hold = Callable[[str], AbstractContextManager[bool]]
"""``hold(request_id)``: a block during which no request with that id can start on its way
(the daemon's schedule lock); it yields whether none is on its way now.  For a thread's log,
``hold(session)``: no request of that session can start (nor is one queued or running), and
nothing in this process keeps its log open."""


def prune(
    home: _home.Home, retention: Retention, *, hold: Hold, hold_thread: Hold,
    conversations: Callable[[], Collection[str]], stopping: Callable[[], bool], now: float | None = None,
) -> tuple[Pruned, bool]:
    """One pass, oldest first; returns what it removed and whether more is left for another.

    ``conversations()``: the session names (``thread=...``) of the thread keys that have a
    conversation in the store; their logs are kept.
    """
    now = time.time() if now is None else now
    pruned = Pruned()
    for folder in (home.runs, home.events):
        _clear_trash(folder, pruned)
    more = False
    if retention.keep_days != float("inf"):
        cutoff = now - retention.keep_days * _DAY
        due = heapq.nsmallest(BATCH, _finished(home, cutoff, now))
        more = len(due) == BATCH
        for _, request_id in due:
            if stopping():
                return pruned, False
            _forget(home, request_id, cutoff, hold, pruned)
        for name in _old(home.events, cutoff, lambda name: _ROTATED.fullmatch(name) is not None, now=now):
            _remove(home.events / name, pruned, "lifecycle_logs" if name.endswith(_LOG) else None)
        if not _forget_thread_logs(home, cutoff, hold_thread, conversations, stopping, now=now, pruned=pruned):
            return pruned, False
    if retention.quarantine_days != float("inf"):
        cutoff = now - retention.quarantine_days * _DAY
        for name in _old(home.quarantine, cutoff, lambda name: True, now=now, stamped=True):
            if stopping():
                return pruned, False
            _remove(home.quarantine / name, pruned, "quarantine")
    # Whatever [retention] says: these were never requests nor responses, and nothing else
    # removes them (each leftover staged request also keeps its id from being submitted).
    cutoff = now - STAGED_KEPT_FOR
    for folder, wanted in ((home.spool_tmp, _any), (home.approvals_responses, _not_a_response)):
        for name in _old(folder, cutoff, wanted, now=now, hidden=True):
            if stopping():
                return pruned, False
            _remove(folder / name, pruned, "staged")
    return pruned, more


def _any(name: str) -> bool:
    return True


def _not_a_response(name: str) -> bool:
    """A temporary file in ``approvals/responses/`` (``<id>.json.tmp-...``, a script's
    ``.<id>.tmp``), which the daemon never reads (see ``_home.refuse_unawaited``)."""
    return name.startswith(".") or not name.endswith(".json")


def _finished(home: _home.Home, cutoff: float, now: float) -> Iterator[tuple[float, str]]:
    """``(time, id)`` of each finished request last written before ``cutoff``: one with a
    verdict, or what is left of one whose verdict went (a run folder, an audit log).

    Whether it is on its way after all is looked at under the hold (:func:`_forget`).
    """
    for name, mtime in _entries(home.verdicts, now=now):
        request_id = name.removesuffix(".json")
        if name.endswith(".json") and mtime < cutoff and _home.is_request_id(request_id):
            yield mtime, request_id
    for name, mtime in _entries(home.runs, now=now):
        if mtime < cutoff and _home.is_request_id(name) and not os.path.lexists(home.verdict(name)):
            yield mtime, name
    for name, mtime in _entries(home.events, now=now):
        request_id = name.removesuffix(_LOCK).removesuffix(_LOG)
        if (
            name.endswith((_LOG, _LOG + _LOCK))
            and mtime < cutoff
            and _home.is_request_id(request_id)  # never a thread's log (thread=...), nor the daemon's
            and not os.path.lexists(home.verdict(request_id))
            and not os.path.lexists(home.run_dir(request_id))
        ):
            yield mtime, request_id


def _forget(home: _home.Home, request_id: str, cutoff: float, hold: Hold, pruned: Pruned) -> None:
    """Remove the request's verdict, then its run folder and audit log, unless it is on its way."""
    log = home.events / f"{request_id}{_LOG}"
    lock = home.events / f"{request_id}{_LOG}{_LOCK}"
    moved: list[tuple[str, str]] = []
    try:
        with hold(request_id) as free:
            if not free:
                return
            try:
                found = os.lstat(home.verdict(request_id))
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISREG(found.st_mode) or found.st_mtime >= cutoff:
                    return  # written since it was listed; or no verdict of the daemon's (a link)
                os.unlink(home.verdict(request_id))
                pruned.verdicts += 1
            for path, what in ((home.run_dir(request_id), "runs"), (log, "events")):
                trash = _aside_or_remove(path, pruned, what)
                if trash is not None:
                    moved.append((trash, what))
            # Nobody appends to the log of a finished request.
            _drop_lock(lock)
    except OSError as exc:
        pruned._failed(exc)
    for renamed, what in moved:
        _remove(renamed, pruned, what)


def _aside_or_remove(path: Path, pruned: Pruned, what: str) -> str | None:
    """:func:`_aside`, or ``path`` removed where it is when it cannot be renamed; returns the
    trash name left to remove."""
    trash = _aside(path)
    if trash is None and os.path.lexists(path):  # (see _aside)
        _remove(str(path), pruned, what)
    return trash


def _drop_lock(lock: Path) -> None:
    """Remove a log's lock file, this process's own flock of it (lingering after the log's
    last append) let go first."""
    _durable.release_lingering(lock)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)


def _is_thread_log(name: str) -> bool:
    return name.endswith(_LOG) and _home.THREAD_SESSION.fullmatch(name[: -len(_LOG)]) is not None


def _forget_thread_logs(
    home: _home.Home, cutoff: float, hold: Hold, conversations: Callable[[], Collection[str]],
    stopping: Callable[[], bool], *, now: float, pruned: Pruned,
) -> bool:
    """Remove the logs of threads without a conversation, unwritten since ``cutoff``; returns
    False when the pass is to stop."""
    due = _old(home.events, cutoff, _is_thread_log, now=now)
    if not due:
        return True
    try:
        kept = set(conversations())
    except Exception:  # (the store unreadable now) nothing is removed on a guess
        return True
    for name in due:
        if stopping():
            return False
        session = name[: -len(_LOG)]
        if session not in kept:
            _forget_thread_log(home, session, cutoff, hold, pruned)
    return True


def _forget_thread_log(home: _home.Home, session: str, cutoff: float, hold: Hold, pruned: Pruned) -> None:
    """Remove a thread's log as :func:`_forget` does a request's: while held, nobody appends
    to it, and a reader opening it finds it whole or gone (a rename)."""
    log = home.events / f"{session}{_LOG}"
    trash = None
    try:
        with hold(session) as free:
            if not free:
                return
            found = os.lstat(log)
            if not stat.S_ISREG(found.st_mode) or found.st_mtime >= cutoff:
                return  # appended to since it was listed (a turn may have saved a conversation)
            trash = _aside_or_remove(log, pruned, "thread_logs")
            _drop_lock(home.events / f"{session}{_LOG}{_LOCK}")
    except FileNotFoundError:
        return
    except OSError as exc:
        pruned._failed(exc)
    if trash is not None:
        _remove(trash, pruned, "thread_logs")


def _old(
    folder: os.PathLike[str], cutoff: float, wanted: Callable[[str], bool], *, now: float, stamped: bool = False,
    hidden: bool = False,
) -> list[str]:
    """Names in ``folder`` that ``wanted`` picks, written before ``cutoff``, oldest first.

    ``stamped``: a name ``<time_ns>-...`` (a quarantined file) counts from that time when it is
    later than the file's own (a file written long ago and quarantined today is not old).
    """
    found = []
    for name, mtime in _entries(folder, hidden=hidden, now=now):
        if not wanted(name):
            continue
        stamp, _, rest = name.partition("-")
        if stamped and rest and stamp.isdigit():
            mtime = max(mtime, int(stamp) / 1e9)
        if mtime < cutoff:
            found.append((mtime, name))
    return [name for _, name in heapq.nsmallest(BATCH, found)]


def _entries(
    folder: os.PathLike[str], *, hidden: bool = False, now: float | None = None
) -> Iterator[tuple[str, float]]:
    """``(name, mtime)`` of each entry (not following links); nothing for a missing folder.

    With ``hidden``, names starting with a dot too, and no folders.  With ``now``, an entry
    dated more than a day after it (written while the clock was far ahead) is dated ``now``
    first: its age counts from today, or it would be kept as long as the clock was ahead.
    """
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                if entry.name.startswith(".") and not hidden:
                    continue  # temporary files being written, and our own trash
                try:
                    found = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if hidden and stat.S_ISDIR(found.st_mode):
                    continue  # (a staging area holds files; a folder there is someone's own)
                mtime = found.st_mtime
                if now is not None and mtime > now + _DAY:
                    with contextlib.suppress(OSError):
                        os.utime(entry.path, (now, now), follow_symlinks=False)
                        mtime = now
                yield entry.name, mtime
    except FileNotFoundError:
        return


def _clear_trash(folder: os.PathLike[str], pruned: Pruned) -> None:
    """What a pass interrupted by a crash had renamed but not yet removed."""
    leftovers: list[str] = []
    # A folder removed by hand has none (the suppressed error left the list unbound, and the
    # whole pass failed with UnboundLocalError).
    with contextlib.suppress(FileNotFoundError), os.scandir(folder) as listing:
        leftovers = [entry.path for entry in listing if entry.name.startswith(_TRASH)]
    for path in leftovers:
        _remove(path, pruned, None)


def discard_run_dir(home: _home.Home, request_id: str) -> None:
    """Remove ``runs/<id>/`` at once (renamed aside first, so a name left by an error is only
    a leftover a later pass clears); raises the ``OSError`` that stopped it."""
    path = home.run_dir(request_id)
    trash = _aside(path)
    remove_entry(path if trash is None else trash)


def _aside(path: Path) -> str | None:
    """Rename ``path`` to a trash name beside it, which a pass interrupted before removing it
    clears later; ``None`` when there is nothing there, or when it cannot be renamed there: a
    folder of an overlayfs lower layer (a home shipped in an image, without ``redirect_dir``,
    the kernel's default) refuses with ``EXDEV``, and is then removed where it is."""
    trash = path.with_name(f"{_TRASH}{path.name}-{secrets.token_hex(4)}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return None
    return str(trash)


def remove_entry(path: str | os.PathLike[str]) -> bool:
    """Remove a file, a link (never followed) or a whole folder; ``False`` when it was gone
    already.  Raises the ``OSError`` that stopped it."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _remove(path: str | os.PathLike[str], pruned: Pruned, what: str | None) -> None:
    """:func:`remove_entry`, counted under ``what`` (a failure: in ``pruned.failed``)."""
    try:
        removed = remove_entry(path)
    except OSError as exc:
        pruned._failed(exc)
        return
    if removed and what is not None:
        setattr(pruned, what, getattr(pruned, what) + 1)

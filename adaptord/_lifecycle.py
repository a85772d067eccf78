"""The daemon's lifecycle log (``events/adaptord.jsonl``), group-committed off the request path."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from adaptor import _durable, events
from adaptord.config import one_line
from hosttools import sessionrecorder as sr


def line(fact: str, fields: Mapping[str, Any]) -> str:
    """A fact's log line for stderr (journald): ``adaptord: FACT key=value ...``, one line.

    A value with a space, quote, ``=`` or line break, or an empty one, is written in double
    quotes with JSON's escapes (logfmt's convention), so each ``key=value`` reads back whole.
    """
    extra = " ".join(f"{k}={_logfmt(v)}" for k, v in fields.items() if v is not None)
    return one_line(f"adaptord: {fact}" + (f" {extra}" if extra else ""))


def _logfmt(value: object) -> str:
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return orjson.dumps(text).decode()


_NEEDS_QUOTES = re.compile(r'[\s"=]')


# Lifecycle facts a reader of the journal is warned of; every other fact is informational.
_WARNING_FACTS = frozenset(
    {"verdict.deferred", "verdict.unwritten", "request.interrupted", "a2a.died", "leftovers.stopped"}
)
WARNING, INFO = 4, 6
"""Syslog priorities of the daemon's log lines."""


def fact_priority(fact_line: str) -> int:
    """The priority of a lifecycle fact's line (:func:`fact`), by its phase."""
    phase = fact_line.removeprefix("adaptord: ").split(" ", 1)[0]
    return WARNING if phase in _WARNING_FACTS else INFO


def to_journal() -> bool:
    """Whether stderr is connected to systemd's journal (``JOURNAL_STREAM`` names it), which
    reads a ``<N>`` prefix as the line's priority (``journalctl -p warning``)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        found = os.fstat(2)
    except OSError:
        return False
    return expected == f"{found.st_dev}:{found.st_ino}"


def fact(phase: str, request_id: str | None = None, **data: Any) -> tuple[events.Notice, str]:
    """A lifecycle fact: its record (a ``notice.lifecycle`` event) and its log line."""
    data = {name: _utf8(value) for name, value in data.items()}
    notice = events.Notice(
        kind="lifecycle",
        text=phase,
        data={"phase": phase, "request_id": request_id, **data},
        # When the fact happened (the record's recorded_at is when its batch was written).
        meta=events.EventMeta(time=datetime.now(UTC)),
    )
    shown = {k: v for k, v in data.items() if isinstance(v, str | int | float)}
    return notice, line(phase, {"id": request_id, **shown})


def _utf8(value: Any) -> Any:
    """``value`` with every str UTF-8 can write: a file name that is not UTF-8 (``b\\xfe.json``
    in spool/new, read as ``"b\\udcfe.json"``) failed its fact's record, and every fact after it
    in the batch was lost with it."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, list | tuple):
        return [_utf8(item) for item in value]
    if isinstance(value, dict):
        return {_utf8(key): _utf8(item) for key, item in value.items()}
    return value


_LOGGED_MESSAGE_LIMIT = 200


class OneLineLogging(logging.Handler):
    """Routes warnings and errors of Python loggers the daemon does not own into its log, one
    line each: ``FACT level=... logger=... message='<first line>' error=<exception type>``.

    Unconfigured, their records reached stderr through logging's last-resort handler, as bare
    text and multi-line tracebacks (a host tool that raised printed one), some quoting what a
    caller or a tool said: lines without the ``adaptord: `` prefix or a journald priority.
    """

    def __init__(self, log: Callable[..., None], fact: str, loggers: Sequence[str]) -> None:
        super().__init__(logging.WARNING)
        self._log = log
        self._fact = fact
        self._names = tuple(loggers)
        self._saved: list[tuple[logging.Logger, bool]] = []

    def install(self) -> None:
        for name in self._names:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.propagate))
            logger.addHandler(self)
            logger.propagate = False

    def uninstall(self) -> None:
        saved, self._saved = self._saved, []
        for logger, propagate in saved:
            logger.removeHandler(self)
            logger.propagate = propagate

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lines = record.getMessage().strip().splitlines()
            fields: dict[str, Any] = {
                "level": record.levelname.lower(),
                "logger": record.name,
                # Quoted by line(): the text may hold what a caller sent.
                "message": lines[0][:_LOGGED_MESSAGE_LIMIT] if lines else "",
            }
            if record.exc_info and record.exc_info[0] is not None:
                fields["error"] = record.exc_info[0].__name__
            self._log(self._fact, **fields)
        except Exception:
            self.handleError(record)


def _identity(path: str) -> tuple[int, int, int] | None:
    """The file at ``path`` (device, inode) and its size, or ``None`` when there is none."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_size


class LifecycleLog:
    """``events/<session>.jsonl`` for the daemon's own facts, written by one background thread.

    :meth:`record` queues a fact and returns at once.  The writer lingers ``linger`` seconds
    after the first fact of a batch, so it stays off the path of the request that caused the
    fact (it would compete for the GIL) and more facts share the batch; then it records the
    batch through a session recorder that does not sync per append, syncs once (group
    commit), and prints the batch's log lines with one call of ``emit`` (each with its syslog
    priority): whoever sees a line finds the record in the file.  The daemon's other lines
    join the queue by :meth:`say` while facts wait, so they keep their place.  Nothing
    is recovered from this log, so nobody waits for it; a power loss can lose the last facts
    not yet synced (the torn tail is repaired by the next append), never a request or a
    verdict.

    The log stays at its name: a file moved away or removed (``mv``, logrotate, ``rm``) is
    noticed at the next batch, which starts a fresh file rather than appending on where
    nobody looks (``tail -F`` follows the name).  :meth:`rotate` renames a file grown too
    large to ``<session>-<UTC time>.jsonl`` and starts a fresh one; either way the fresh
    file's first record says why, and which host_seq the old file ended at.
    """

    def __init__(
        self,
        directory: Path,
        session: str,
        *,
        emit: Callable[[Sequence[tuple[str, int]]], None],
        on_error: Callable[[str, BaseException], None],
        on_recovered: Callable[[], None] = lambda: None,
        linger: float = 0.005,
    ) -> None:
        sr.check_contained(session)
        self._directory = directory
        self._session = session
        self._path = os.path.join(directory, session + ".jsonl")
        self._lock_path = self._path + ".lock"  # the session recorder's writers' lock
        self._recorder: sr.EventRecorder | None = None
        self._backend: sr.JSONLEventBackend | None = None
        # The file the recorder appends to, as its name showed it after the last batch
        # (None: not known, so the next batch opens the name afresh).
        self._identity: tuple[int, int, int] | None = None
        self._last_seq = 0  # the host_seq of the last record this log appended
        self._emit = emit
        self._on_error = on_error
        self._on_recovered = on_recovered
        self._failing = False  # the last batch failed; reported once until one succeeds
        self._linger = linger
        # Facts to record, and log lines of the daemon's (no notice) to print in their turn,
        # each with its syslog priority.
        self._pending: deque[tuple[events.Notice | None, str, int]] = deque()
        self._cond = threading.Condition()
        self._queued = 0
        self._done = 0
        self._closing = False
        self._rotate_above: int | None = None  # a rotation asked for: above this many bytes
        # Whether the file holds facts beyond the one that began it (unknown: yes).  A file
        # holding only its "rotated" fact is never rotated again: under a limit smaller than
        # that fact, an idle daemon rotated its log every scan interval, for ever.
        self._grown = True
        self._thread = threading.Thread(target=self._run, name="adaptord-lifecycle", daemon=True)
        self._thread.start()

    def record(self, notice: events.Notice, line: str, priority: int | None = None) -> None:
        """Queue ``notice`` for the log and ``line`` for stderr (at ``priority``, by default
        its fact's); never blocks on the disk."""
        with self._cond:
            self._pending.append((notice, line, fact_priority(line) if priority is None else priority))
            self._queued += 1
            if len(self._pending) == 1:  # later facts join the lingering batch quietly
                self._cond.notify_all()

    def say(self, line: str, priority: int) -> bool:
        """Queue ``line`` for stderr behind the facts queued before it, not recorded.

        False when the caller should print it itself: every fact's line is printed already,
        the log is closing, or the caller is the writer (reporting its own trouble).
        """
        with self._cond:
            if (
                self._done >= self._queued
                or self._closing
                or threading.current_thread() is self._thread
                or not self._thread.is_alive()
            ):
                return False
            self._pending.append((None, line, priority))
            self._queued += 1
            if len(self._pending) == 1:
                self._cond.notify_all()
            return True

    def rotate(self, larger_than: int) -> None:
        """Have the writer rotate the file if it is larger than ``larger_than`` bytes; never waits.

        Done by the writer itself, between two batches, so no fact is appended to a file
        while it is renamed.
        """
        with self._cond:
            self._rotate_above = larger_than
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
        self._drop_recorder()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing or self._rotate_above is not None)
                if self._pending and not self._closing and self._linger > 0:
                    self._cond.wait(self._linger)  # woken early only by close or a barrier
                batch = list(self._pending)
                self._pending.clear()
                rotate_above, self._rotate_above = self._rotate_above, None
                if not batch and self._closing:
                    return
            rotated = self._rotate(rotate_above) if rotate_above is not None else None
            facts = [(notice, line) for notice, line, _ in batch if notice is not None]
            own = self._append([rotated] if rotated is not None else [], facts)
            self._grown = bool(facts) or (self._grown and rotated is None)
            # The log's own facts (a fresh file's first) come first, then the batch in order.
            lines = [(line, fact_priority(line)) for _, line in own]
            lines += [(line, priority) for _, line, priority in batch]
            if lines:
                # The batch's lines in one write: each stays whole, and a burst of facts costs
                # one system call (and one wake-up of whoever reads the log), not one per fact.
                with contextlib.suppress(Exception):  # a dead writer would stall every barrier
                    self._emit(lines)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _append(
        self, own: list[tuple[events.Notice, str]], batch: list[tuple[events.Notice, str]]
    ) -> list[tuple[events.Notice, str]]:
        """Record ``own`` (this log's facts) then ``batch``; returns ``own``, led by one more when
        this started a fresh file."""
        if not own and not batch:
            return own
        changed = self._changed_by_hand() if self._recorder is not None else None
        if changed is not None:
            self._drop_recorder()
            own = [self._fresh_file("lifecycle_log.reopened", why=changed), *own]
        try:
            if self._recorder is None or self._backend is None:
                self._backend = sr.JSONLEventBackend(self._directory, sync_on_append=False)
                self._recorder = sr.EventRecorder(self._backend, key_validator=lambda key: None)
            known_repairs = len(self._backend.repairs)
            for notice, _ in [*own, *batch]:
                self._last_seq = self._recorder.record(self._session, notice).host_seq
            # A torn tail a crash left is cut by the first append (storage.md: "and record that
            # they did"): said in the log itself and on stderr, or it went without a trace.
            for report in self._backend.repairs[known_repairs:]:
                repaired = fact("lifecycle_log.repaired", None, offset=report.offset,
                                dropped_bytes=report.dropped_bytes)
                self._last_seq = self._recorder.record(self._session, repaired[0]).host_seq
                own = [*own, repaired]
            self._backend.flush()
            # The next batch is at least a linger away, longer than the lock would linger
            # unused: let it go now rather than have the reaper thread woken to do it.
            _durable.release_lingering(self._lock_path)
        except Exception as exc:  # the audit log must never take the daemon down
            # A backend that failed may refuse every later append (a failed fsync whose lines
            # could not be cut away poisons the key); the next batch starts afresh,
            # re-checking the file's tail first.
            self._drop_recorder()
            if not self._failing:  # a full disk fails every batch: one line, not hundreds
                self._failing = True
                self._on_error("audit log write failed", exc)
            return own
        # Looked at after the append: a file moved away meanwhile leaves None, so the next
        # batch opens the name afresh rather than trusting the file it appended to.
        self._identity = _identity(self._path)
        if self._failing:
            self._failing = False
            self._on_recovered()
        return own

    def _changed_by_hand(self) -> str | None:
        """Why the file the recorder appends to is no longer the log as this writer left it:
        moved away or removed (the open file no longer has the log's name), or cut short (a
        log rotator's copytruncate: appended to, it would refuse, the batch lost)."""
        now = _identity(self._path)
        if self._identity is None or now is None or now[:2] != self._identity[:2]:
            return "the file was moved away or removed"
        if now[2] < self._identity[2]:
            return "the file was cut short (a copytruncate?)"
        return None

    def _rotate(self, larger_than: int) -> tuple[events.Notice, str] | None:
        """Rename the file if larger than ``larger_than`` bytes; the fresh file's first fact."""
        try:
            if not self._grown or os.lstat(self._path).st_size <= larger_than:
                return None
            self._drop_recorder()  # synced and closed: nothing is appended to the old name
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            name, n = f"{self._session}-{stamp}.jsonl", 1
            while os.path.lexists(os.path.join(self._directory, name)):  # (rotated twice in a second)
                name, n = f"{self._session}-{stamp}-{n}.jsonl", n + 1
            # Under the writers' lock: `adaptor verify-log --repair` may be cutting a torn tail.
            with _durable.exclusive(self._lock_path):
                _durable.rename(self._path, os.path.join(self._directory, name))
        except FileNotFoundError:
            return None  # removed by hand: the next batch starts a fresh file anyway
        except OSError as exc:
            self._on_error("cannot rotate the lifecycle log", exc)
            return None
        return self._fresh_file("lifecycle_log.rotated", continues_from=name)

    def _fresh_file(self, phase: str, **data: Any) -> tuple[events.Notice, str]:
        """The first fact of a fresh file: why it began, and where the old one ended."""
        self._identity = None
        ended = {"previous_last_host_seq": self._last_seq} if self._last_seq else {}
        return fact(phase, None, **data, **ended)

    def _drop_recorder(self) -> None:
        recorder, self._recorder, self._backend = self._recorder, None, None
        if recorder is not None:
            with contextlib.suppress(Exception):
                recorder.close()

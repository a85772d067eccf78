"""adaptord serve: the spool watcher, the scheduler, the workers and crash recovery.

Life of a request: ``spool/new/<id>.json`` → claimed by an atomic link into ``claimed/`` →
validated (a rejection verdict if not) → queued (same thread key: arrival order) → run through
the SDK with its events recorded live → side files under ``runs/<id>/`` → ``verdicts/<id>.json``
written once, atomically → the claimed copy (which may hold secrets) removed.

The watcher is only a wake-up hint: the spool is also scanned at start, periodically, and after
any watcher failure.  Crash recovery at start first stops the agents a killed predecessor left
running (:mod:`adaptord._leftovers`), then gives every claimed request without a verdict exactly
one outcome (``on_interrupt``: fail, or requeue up to three attempts in all).

What is fsynced when (docs/daemon.md, "What is on disk when"): the claim (the ``claimed/`` link)
before anything else happens to the request; the started attempt's ``state.json`` (written
before the driver starts) right after the driver starts, off the pickup path; the run's audit
log, the request copy, its side files and the verdict before the verdict appears.  Everything
else (later state updates, the daemon's lifecycle log) is written without waiting for the
disk: a ``kill -9`` loses none of it once written (the page cache outlives the process; the
lifecycle log's writer thread holds its last few milliseconds of facts), and recovery relies
on none of it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import itertools
import logging
import math
import os
import queue
import resource
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, TextIO, TypeVar

import filelock
import orjson

import adaptor
from adaptor import _cpus, _durable, _home, _nesting, _redact, _watch, errors, events, skill
from adaptor import _request as requests
from adaptor._run import new_run_id, requested_notice, resolution_of, resolved_notice, run_id_as
from adaptor.approval import Outcome
from adaptor.drivers import _process
from adaptor.spool import InvalidRequestError
from adaptor.threadstore import CorruptLogError as StoreCorruptLogError
from adaptor.threadstore import Query, Record
from adaptord import _entry, _leftovers, _lifecycle, _retention, _tempfiles
from adaptord import config as config_module
from adaptord._lifecycle import LifecycleLog
from adaptord._store import ReopeningStore
from adaptord.config import A2AConfig, DaemonConfig
from hosttools import sessionrecorder as sr

if TYPE_CHECKING:
    from adaptord.a2a_bridge import Bridge, Listen

_T = TypeVar("_T")

_CLAIM_BATCH = 256
"""Spool entries claimed per fsync of ``claimed/`` when many arrive at once."""
_APPROVAL_POLL = 0.25
_STOP_TAIL = 15.0
"""Seconds a drain takes at most after its grace: cancelled runs end, kept CLI processes stop.
The systemd unit's TimeoutStopSec (60) is above the default grace (30) plus this."""
_CANCEL_WAIT = 8.0
"""Of the tail, what cancelled runs get to stop by themselves (their SIGTERM, grace_period, SIGKILL)."""
_DRAIN_SLICE = 0.2
"""Seconds between two looks for a second stop signal while the drain waits for running work."""
_KEPT_SHARE = 2.0
"""Of the tail, what is left at least for closing the CLI processes kept between turns."""
EXIT_HOME_LOST = 70
"""The exit after the home's lock file was removed or replaced while serving (the whole home
removed, say): another daemon may serve it now, so this one stops; a restart (Restart=on-failure)
makes the home again, lock first."""
EXIT_A2A_DIED = 70
"""The exit after the ``--a2a`` listener died while serving: an internal failure (errors.md's
70), which the systemd unit's ``Restart=on-failure`` restarts, unlike 69 and 2."""
_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The process signals :meth:`Daemon.serve` owns: a stop (SIGTERM, SIGINT) or a reload (SIGHUP)."""
_LEFTOVER_GRACE = 10.0
"""The longest a start waits for a killed predecessor's agents to stop on SIGTERM."""
_PRUNE_INTERVAL = 3600.0
"""Seconds between two passes of retention (``[retention]``, and ``approvals/resolved/``: see
_home.RESOLVED_KEPT_FOR) and two looks at the lifecycle log's size; the first is made at the
first turn of the main loop, and one after every reload."""
_FILE_DEPTH = 200
"""How deeply a value an agent made may nest in the run's files and audit log, where it sits a
few levels down in a record or verdict: orjson encodes at most 254 levels."""


def _now() -> str:
    return events.format_time(datetime.now(UTC))


class _Wakeup:
    """Wakes the main loop, from other threads and from signal handlers, without a lock.

    A byte in a pipe: setting it is one non-blocking write, which a signal handler may do at
    any moment; waiting drains the pipe.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poller = select.poll()
        self._poller.register(self._read, select.POLLIN)

    def set(self) -> None:
        if self._write >= 0:
            with contextlib.suppress(OSError):  # full: a wake is pending anyway
                os.write(self._write, b"\0")

    def wait(self, timeout: float) -> None:
        """Return when set since the last wait, or after ``timeout`` seconds; clears it."""
        self._poller.poll(max(0, math.ceil(timeout * 1000)))
        with contextlib.suppress(OSError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        fds, self._read, self._write = (self._read, self._write), -1, -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _as_recorded(event: events.Event, redactor: _redact.Redactor, *, bound: bool) -> events.Event:
    """``event`` as the audit log keeps it: secrets redacted, with ``bound`` nesting cut."""
    if not redactor and not bound:
        return event
    wire = events.to_json(event)
    # Only the payload can carry a secret or an agent's value: kind and meta are the SDK's own.
    payload: Any = {k: v for k, v in wire.items() if k not in ("kind", "meta")}
    if bound:
        payload = _nesting.copy(payload, depth=_FILE_DEPTH)
    payload = redactor.value(payload)
    return events.from_json({**payload, "kind": wire["kind"], "meta": wire["meta"]})


# The fewest descriptors a daemon serves with (its own take about a dozen).
_FEWEST_DESCRIPTORS = 16


def _descriptor_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE``; ``None`` when unlimited or unknown."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _open_logs_allowed() -> int:
    """How many audit logs may stay open at once: 64, fewer under a low ``ulimit -n``.

    Each open log holds two descriptors; a sixteenth of the limit leaves the rest to the
    agents' pipes, the spool and the verdicts.
    """
    soft = _descriptor_limit()
    return 64 if soft is None else max(4, min(64, soft // 16))


def _keys_of(thread: object) -> tuple[str, ...]:
    """The thread keys a request takes its turn on: its own and a fork's parent."""
    if not isinstance(thread, Mapping):
        return ()
    key, parent = str(thread["key"]), thread.get("fork_from")
    return (key, str(parent)) if parent and str(parent) != key else (key,)


def _session_key_ok(key: str) -> None:
    """Session names: request ids, ``thread=<base32>`` and the daemon's own log."""
    if not (_home.REQUEST_ID.fullmatch(key) or _home.THREAD_SESSION.fullmatch(key)):
        raise ValueError("not a request id or thread session name")


@dataclass
class _LoggedRun:
    """What an interrupted run's audit log holds of it, for its recovery."""

    last_sequence: int = 0  # its highest meta.sequence (0: no event)
    finished: bool = False  # its own run.finished is there
    # The run.finished an earlier restart gave it (killed before its verdict or requeue).
    ended_by_restart: bool = False
    # Its approvals the log shows asked (their notice) and resolved, by _approval_key.
    asked: dict[str, events.Notice] = field(default_factory=dict)
    resolved: set[str] = field(default_factory=set)


def _approval_key(approval_id: object) -> str:
    """An approval's id as a key, whatever a log written by hand holds (none, a number)."""
    try:
        return orjson.dumps(approval_id).decode()
    except Exception:
        return repr(approval_id)


@dataclass(eq=False)  # identity: the schedule finds and removes jobs by ``is``, not by value
class Job:
    id: str
    request: dict[str, Any]
    received_at: str
    attempt: int = 0
    # The thread keys the job takes its turn on, in arrival order with every other job on
    # them: its thread's, and a fork's parent (which the fork reads and leases).
    keys: tuple[str, ...] = ()
    stream: adaptor.Stream | None = None
    cancel_requested: bool = False
    # Cancelled by the drain (its grace ran out, or a second signal): its verdict says so.
    stopped_by_drain: bool = False
    run_ids: list[str] = field(default_factory=list)
    # runs/<id>/state.json as last written: kept here so no write has to read it back first.
    state: dict[str, Any] = field(default_factory=dict)
    # Files of runs/<id>/ written without fsync; synced together just before the verdict.
    unsynced: list[Path] = field(default_factory=list)
    run_dir_ready: bool = False
    run_dir_synced: bool = False
    # Events the audit log refused (a full disk): the first failure is logged, the rest counted.
    unrecorded: int = 0
    recorded: bool = False  # any of its run's events is in its audit log
    # host_seq of the first of its records in its session log (see "events_from" below).
    first_host_seq: int | None = None
    arrival: int = 0  # its place in the daemon's arrival order, which ready jobs start in
    routes: int = 0  # its approvals' routes still going (each on a thread of the SDK's)
    # A long prompt is not kept while the request waits (see _accept): read again at its start.
    prompt_left_on_disk: bool = False
    # The run's secret values, fixed at its start with the config it runs with: a reload during
    # the run (a rotated key in [drivers.x] env) must not take the old value out of redaction.
    secrets: list[str] | None = None


def _served(a2a: A2AConfig) -> A2AConfig:
    """What ``--a2a`` serves of an ``[a2a]`` table: all but the remotes, which are the
    delegation tool's and change at a reload."""
    return replace(a2a, remotes=())


class Daemon:
    def __init__(
        self,
        home: _home.Home,
        config: DaemonConfig,
        *,
        workers: int | None = None,
        grace: float | None = None,
        config_path: str | None = None,
        log: Any = None,
        a2a: Listen | None = None,
    ) -> None:
        self.home = home
        self.config = config
        self.workers = workers or config.workers
        self.grace = config.grace if grace is None else grace
        # What the command line set wins over the file, at a reload as at the next start.
        self._set_on_command_line = {
            key for key, value in (("workers", workers), ("grace", grace)) if value is not None
        }
        self.config_path = config_path
        self.a2a = a2a
        self._bridge: Bridge | None = None
        self._log_stream: TextIO | None = log or sys.stderr
        self._daemon_log: LifecycleLog | None = None  # made by serve(), once the home is ours
        self._journal = log is None and _lifecycle.to_journal()
        self._wake = _Wakeup()
        self._stop = threading.Event()
        # Set by the signal handler; the main loop turns them into _stop and a reload.
        self._stop_signalled = False
        # Stop signals seen: a second one during the drain ends its grace at once.
        self._stop_signals = 0
        self._reload_signalled = False
        # A reload reads the file and imports its host tools in a thread of its own (an import
        # may take long, or never end); the main loop applies what it read once the thread has
        # ended.  Set by that thread: the fresh config and its tools, or why they were refused.
        self._reloader: threading.Thread | None = None
        self._reloaded: tuple[DaemonConfig, dict[str, Any]] | str | None = None
        # How many of the audit logs' torn-tail repairs were told (see _tell_repairs).
        self._repairs_told = 0
        self._repairs_lock = threading.Lock()
        self._lock = threading.Lock()
        # The schedule (under _lock): jobs that may start now, the line of jobs on each thread
        # key in arrival order (its first holds the key, or is next to: a job may start once
        # it is first on every one of its keys), and every not-started job by id (for cancel
        # and drain).  Dispatch never walks the lines, so a thousand jobs waiting on one key
        # cost nothing per pickup.  Jobs join every line they wait in at once, in one global
        # arrival order, so no two jobs can each be waiting for the other.
        # Ready jobs start in arrival order (a heap by it): a thread's next turn, ready once
        # the turn before it ends, goes before the requests that arrived after it, not behind
        # every request queued meanwhile.
        self._ready: list[tuple[int, Job]] = []
        self._arrivals = itertools.count(1)
        self._lines: dict[str, deque[Job]] = {}
        self._queued: dict[str, Job] = {}
        self._running: dict[str, Job] = {}
        self._approval_changed = threading.Condition()
        self._idle = threading.Condition(self._lock)
        self._observer: Any = None
        self._tools: dict[str, Any] = {}
        self._skills: skill.Directories | None = None
        self._kept = requests.KeptAgents()
        # Where this daemon's agents run, recorded in each run's state (see _leftovers.out_of_sight).
        self._where_agents_run: dict[str, str | bool | None] = {}
        # Verdicts that could not be written (a full or failing disk), by request id, each
        # tried again every scan interval (under _lock).  Their requests stay claimed.
        self._deferred: dict[str, Callable[[], None]] = {}
        # The requests whose verdict this daemon linked into place while its writing failed
        # after (the folder's sync): found there at the retry, it is this daemon's own.
        self._linked_verdicts: set[str] = set()
        self._next_retry = 0.0  # monotonic; the main loop wakes for every arrival, not only then
        self._lock_identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the lock file held
        # Why the home is no longer this daemon's (its lock file removed or replaced), once
        # known: from then on it writes nothing there (see _home_gone).
        self._home_lost: str | None = None
        self._next_layout_check = 0.0  # monotonic
        self._watcher_refused = False
        # Claimed requests whose files did not parse yet and were written moments ago, by id:
        # each is read again every _REREAD_INTERVAL until it parses or _WRITE_GRACE has passed.
        self._being_written: dict[str, Callable[[], None]] = {}
        # Worker threads, started at start; jobs go to them through _jobs (None: stop).
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._worker_threads: list[threading.Thread] = []
        self._workers_short = False
        # The CPU the daemon's threads are kept on (config one_cpu), None when not narrowed.
        self._one_cpu = False
        self._cpu: int | None = None
        # What adaptord.json says besides the CPU (see _write_state).
        self._daemon_state: dict[str, Any] = {}
        self._next_worker_try = 0.0  # monotonic; when a refused worker thread is tried again
        self._next_watch_try = 0.0  # monotonic; when a refused watcher is tried again
        self._next_prune = 0.0  # monotonic; when the next pass of retention starts
        self._next_rotation_check = 0.0  # monotonic; when the lifecycle log's size is looked at next
        self._pruner: threading.Thread | None = None  # the pass in progress
        # The approvals restarts expired, by request id, for their runs' logs (recovery reads
        # them once, when it first needs them: see _home.kept_requests).
        self._kept_requests: dict[str, list[dict[str, Any]]] | None = None
        # Off until READY=1: systemd arms its watchdog then, and a ping before would arm it
        # during the start-up, which its start timeout bounds instead.
        self._watchdog = _Watchdog(None)

    # -- logging and audit -------------------------------------------------------------------

    def log(self, fact: str, *, info: bool = False, **fields: Any) -> None:
        """One line of the daemon's own on stderr: a problem, unless ``info`` (all is well).

        Printed after the lines of the facts recorded before it, which the lifecycle log
        prints only once they are written: ``cannot write the request copy`` never comes
        before the ``request.received`` it is about.
        """
        line = _lifecycle.line(fact, fields)
        priority = _lifecycle.INFO if info else _lifecycle.WARNING
        if self._daemon_log is None or not self._daemon_log.say(line, priority):
            self._emit([(line, priority)])

    def _emit(self, lines: Sequence[tuple[str, int]]) -> None:
        """Print ``lines``, each at its syslog priority, with one write."""
        stream = self._log_stream
        if stream is None:  # started with stderr closed: the interpreter made sys.stderr None
            return
        if self._journal:  # systemd reads a "<N>" prefix as the line's priority
            text = "\n".join(f"<{priority}>{line}" for line, priority in lines)
        else:
            text = "\n".join(line for line, _ in lines)
        try:
            # One write per batch: lines printed by different threads never interleave.
            stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):  # journald gone or stderr closed: keep serving
            pass

    def _log_and_record(self, fact: str, phase: str, *, info: bool, **fields: Any) -> None:
        """:meth:`log`'s line, its fields also recorded as the lifecycle fact ``phase`` (for
        whoever follows the lifecycle log, where the line alone left no trace)."""
        shown = {key: value for key, value in fields.items() if value is not None}
        notice, _ = _lifecycle.fact(phase, **shown)
        line = _lifecycle.line(fact, fields)
        priority = _lifecycle.INFO if info else _lifecycle.WARNING
        if self._daemon_log is None:
            self._emit([(line, priority)])
        else:
            self._daemon_log.record(notice, line, priority)

    def audit(self, phase: str, request_id: str | None = None, **data: Any) -> None:
        """One lifecycle fact in events/adaptord.jsonl (and one log line), never waited for.

        The lifecycle writer prints the line after recording the fact, so whoever sees the
        line finds the record.
        """
        notice, line = _lifecycle.fact(phase, request_id, **data)
        if self._daemon_log is None or self._home_lost is not None:  # (before serve() made the log)
            self._emit([(line, _lifecycle.fact_priority(line))])
        else:
            self._daemon_log.record(notice, line)

    # -- serve -------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve until stopped; the process's exit status.

        Call it once, from the main thread of the process that then exits: it owns the
        process's SIGTERM, SIGINT and SIGHUP, and leaves them ignored.
        """
        # From the first moment to the last: a SIGHUP or SIGTERM during the start-up (waiting
        # for the home's lock, stopping a predecessor's leftovers, importing host tools) killed
        # the daemon without a word, and one during the last clean-up skipped closing the logs.
        # Set early, they are acted on once serving (a stop then drains at once).
        for sig in _HANDLED_SIGNALS:
            signal.signal(sig, self._on_signal)
        for signum in _entry.take_early_signals():  # (the command's own start-up)
            self._on_signal(signum, None)
        try:
            return self._serve_home()
        finally:
            # The exit status is decided.  The default dispositions back would let a signal
            # arriving now (systemd's stop, a second Ctrl-C) kill the exiting process, and its
            # supervisor would read that death instead: exit 70 (restart me) as a clean stop,
            # exit 0 as a failure.  Ignored, not handled: the interpreter puts Python handlers
            # back to the default while it finalizes, which is also on the way out.
            for sig in _HANDLED_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            self._wake.close()

    def leave(self, code: int) -> NoReturn:
        """End the process with ``code`` (what :meth:`serve` returned), without waiting for
        threads a host tool's handler started and left running: Python's exit waits for every
        such thread, so a stopped daemon lived on, deaf to signals, until systemd killed it."""
        left = sorted(
            thread.name for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
        )
        if not left:
            sys.exit(code)
        self.log("exiting without the threads left running", threads=",".join(left))
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    def _serve_home(self) -> int:
        _thread_stacks_of_at_least(_THREAD_STACK)
        limit = _descriptor_limit()
        if limit is not None and limit < _FEWEST_DESCRIPTORS:
            # Below this the daemon's own descriptors left none to list the spool with: it
            # said "ready" and never took a request.
            self.log("too few file descriptors", limit=limit, needed=_FEWEST_DESCRIPTORS,
                     error=f"ulimit -n is {limit}; give the daemon at least 64")
            return 69
        unservable = _home.unservable_path(self.home.root)
        if unservable is not None:
            # Its path goes into adaptord.json, its audit logs and every verdict's events, all
            # UTF-8 JSON: refused here, it was a traceback (exit 1, restarted under systemd).
            self.log("cannot use the home", home=self.home.root, error=unservable.reason)
            return 69
        length = len(os.fsencode(self.home.root))
        if length > _LONGEST_HOME:
            # Its files' paths would pass PATH_MAX: a request with a long id then got no
            # verdict at all (ENAMETOOLONG), and ran again at every start.
            self.log("cannot use the home", home=self.home.root, error=(
                f"its path is {length} bytes long; at most {_LONGEST_HOME} leave room for its "
                f"files' paths ({_PATH_MAX} bytes in all)"
            ))
            return 69
        unsafe = _home.not_private(self.home)
        if unsafe is not None:
            self.log("refusing a home others can write to", why=unsafe)
            return 2
        instance = filelock.FileLock(str(self.home.daemon_lock), mode=0o600, thread_local=False)
        # A home refused once its folders were made here leaves nothing behind: the user puts
        # it elsewhere, and an empty layout left on the old place looked like a home in use.
        root_missing = not os.path.lexists(self.home.root)
        new_home = self.home.absent()
        refused = True
        try:
            try:
                self.home.ensure()
            except OSError as exc:  # a read-only or missing filesystem, no permission: no spool
                self.log("cannot use the home", home=self.home.root,
                         error=_home_error_text(exc, self.home, "making its folders"))
                return 69
            try:
                # A short wait: `daemon_running` probes take it shared for an instant.
                instance.acquire(timeout=2)
                held = os.stat(self.home.daemon_lock)
                self._lock_identity = (held.st_dev, held.st_ino)
                if held.st_mode & 0o077:  # made 0644 by an earlier build: every file of a home is 0600
                    os.chmod(self.home.daemon_lock, 0o600)
            except filelock.Timeout:
                new_home = False  # (another daemon's)
                self.log("another adaptord is already running for this home", home=self.home.root)
                return 69
            except OSError as exc:
                self.log("cannot use the home", home=self.home.root,
                         error=_home_error_text(exc, self.home, "taking its lock adaptord.lock"))
                return 69
            # Again, now that every folder exists: a filesystem that keeps no modes (NTFS, exFAT)
            # shows the folders just made 0700 as 0777, and the first start served them.
            unsafe = _home.not_private(self.home)
            if unsafe is not None:
                self.log("refusing a home others can write to", why=unsafe)
                return 2
            unlinkable = _links_refused(self.home)
            if unlinkable is not None:
                # Submitting links a request into spool/new, claiming links it into claimed/: it
                # said "ready" and never took one (exFAT has no links; a spool mounted apart, EXDEV).
                self.log("cannot use the home", home=self.home.root, error=unlinkable)
                return 69
            refused = False
        finally:
            if refused:
                instance.release()  # (first: a FUSE filesystem keeps an open file's folder busy)
                if new_home:
                    self.home.unmake(root_too=root_missing)
        # The predecessor's pid and start time: `status` would show them as this daemon's
        # until it writes its own, once serving (its start may take seconds: leftovers, tools).
        try:
            os.unlink(self.home.daemon_state)
        except FileNotFoundError:
            pass
        except OSError:
            # A home whose folder may not be written (its mode, chattr +i): the file itself
            # may be, in place; empty, it says nothing (see _home.daemon_state).
            with contextlib.suppress(OSError):
                fd, _ = _durable.open_regular(self.home.daemon_state, os.O_WRONLY)
                try:
                    os.ftruncate(fd, 0)
                finally:
                    os.close(fd)
        # The SDK's own warnings (a host tool that raised, a log it could not list) in this
        # log's form, one line each, rather than logging's bare multi-line fallback.
        library_log = _lifecycle.OneLineLogging(self.log, "library_log", ("adaptor", "hosttools"))
        library_log.install()
        try:
            # Every process this daemon starts carries the mark; see _stop_leftovers.  Its
            # temporary files go where the next start finds them; see _clear_tmp.
            with _leftovers.marking(_leftovers.owner_mark(self.home.root)), _tempfiles.kept_in(self.home.tmp):
                return self._serve_locked()
        except OSError as exc:
            if not _out_of_descriptors(exc):
                raise
            # So few descriptors (ulimit -n 6) that the start-up itself ran out: said as a
            # home it cannot use, as when the first of them fails, never as a traceback.
            self.log("cannot use the home", home=self.home.root, error=_os_error_text(exc))
            return 69
        finally:
            library_log.uninstall()
            instance.release()

    def _serve_locked(self) -> int:
        # Before any of the daemon's threads starts, so each inherits it.
        self._place_threads(self.config.one_cpu)
        # Before the slower start-up below: while this daemon holds the home's lock, `adaptor
        # approve` takes a pending approval's run for alive, and none of these runs is.
        stale_approvals = self._expire_stale_approvals()
        self._where_agents_run = _leftovers.where_agents_run()
        self._daemon_log = daemon_log = LifecycleLog(
            self.home.events, _home.DAEMON_SESSION, emit=self._emit,
            on_error=lambda what, exc: self.log(
                what, error=_os_error_text(exc) if isinstance(exc, OSError) else type(exc).__name__
            ),
            on_recovered=lambda: self.log("audit log writable again", info=True),
        )
        # Run events are written as they happen (tail -f shows them live) and fsynced once,
        # before the verdict: per-event fsync would cap a streaming run at the disk's sync rate.
        self._events_backend = sr.JSONLEventBackend(
            self.home.events, sync_on_append=False, max_open_files=_open_logs_allowed()
        )
        self._events = sr.EventRecorder(self._events_backend, key_validator=_session_key_ok)
        self._store = ReopeningStore(
            self.home.threads, gone=lambda: self._home_lost, repaired=self._tell_store_repair
        )
        self._stop_leftovers()
        self._clear_tmp()
        self._tools = self.config.load_tools()
        self._warn_of_config(self.config, self._tools)
        self._skills = self.config.skill_catalogue()
        self._withhold_credentials()
        self._ensure_workers()
        try:
            a2a_url = self._start_bridge()
            self._daemon_state = {
                "pid": os.getpid(), "started_at": _now(), "home": str(self.home.root), "workers": self.workers,
                "version": adaptor.__version__, **({"a2a_url": a2a_url} if a2a_url else {}),
            }
            self._write_state()
            # A file's grace or workers the command line overrides (the systemd unit's --grace)
            # was set for nothing, and only a reload said so.
            overridden = self._command_line_keeps(self.config)
            started: dict[str, Any] = {} if self._cpu is None else {"cpu": self._cpu}
            if overridden:
                started["command_line_keeps"] = ",".join(overridden)
            self.audit(
                "daemon.started", workers=self.workers, pid=os.getpid(), **started,
            )
            if a2a_url:
                self.audit("a2a.listening", url=a2a_url, agents=",".join(a.key for a in self.config.a2a.agents))
            for fact in stale_approvals:
                self.audit("approval.expired", **fact)
            self._recover()
            self._start_observer()
            self._scan()
            daemon_log.barrier(timeout=30)  # the start-up facts come before "ready"
            _notify("READY=1\nSTATUS=serving")
            self._watchdog = _Watchdog.from_environment()
            self.log("ready", info=True, home=self.home.root, workers=self.workers, cpu=self._cpu)
            exit_code = 0
            while True:
                self._watchdog.ping()
                self._wake.wait(self._watchdog.bound(
                    _REREAD_INTERVAL if self._being_written else self.config.scan_interval
                ))
                if self._stop_signalled:
                    self._stop.set()
                    break
                if self._home_gone():
                    # Serving on would serve a home another daemon may hold (a home made
                    # again by hand has no lock of this one's).  Told on stderr: the home's
                    # lifecycle log may have gone with it.
                    self.log(
                        f"{self._home_lost}; stopping (a new start makes the home again)", home=self.home.root
                    )
                    self._stop.set()
                    exit_code = EXIT_HOME_LOST
                    break
                self._check_layout()
                listener_died = self._bridge.died if self._bridge is not None else None
                if listener_died is not None:
                    # Serving on without the listener it was started with would leave A2A
                    # callers refused with nobody told; a non-zero exit makes a supervisor
                    # (systemd's Restart=on-failure) start it again, listener included.
                    self.audit("a2a.died", error=listener_died, then="stopping", exit_code=EXIT_A2A_DIED)
                    self._stop.set()
                    exit_code = EXIT_A2A_DIED
                    break
                self._reload_config()
                self._check_observer()
                self._ensure_workers()
                self._read_again()
                self._retry_verdicts()
                self._scan()
                self._refuse_unawaited_responses()
                self._prune()
            _notify("STOPPING=1")
            self._stop_pruning()
            self._drain()
            self._retry_verdicts(last=True)
            self.audit("daemon.stopped")
            return exit_code
        finally:
            self._stop_bridge()  # after the drain: open A2A tasks get their runs' verdicts first
            self._stop_observer()
            for _ in self._worker_threads:
                self._jobs.put(None)
            with contextlib.suppress(Exception):
                self._events.close()
            self._store.close()
            with contextlib.suppress(Exception):
                daemon_log.close()

    def _stop_leftovers(self) -> None:
        """Stop the agents a killed predecessor left running (see :mod:`adaptord._leftovers`).

        Called before this daemon starts any process, so every marked process is an old one.
        """
        owner = _leftovers.owner_mark(self.home.root)
        found = _leftovers.find(owner)
        # Also when the look found none: one that lives milliseconds before a copy of it takes
        # over may be missed by a look, not by the stop's own looks.
        killed, found_later = _leftovers.stop(owner, found, min(self.grace, _LEFTOVER_GRACE))
        if found or found_later:
            pids = ",".join(str(leftover.pid) for leftover in found)
            self.audit("leftovers.stopped", processes=len(found) + found_later, killed=killed, pids=pids)

    def _clear_tmp(self) -> None:
        """Remove the temporary files a killed predecessor left (see :mod:`adaptord._tempfiles`).

        Called once its leftover agents are stopped (they may still read them), and before this
        daemon makes any: its workers have not started yet.
        """
        cleared = _tempfiles.clear(self.home.tmp)
        if cleared.error is not None:  # logged, never fatal: the next start tries again
            self.audit("tmp.cleared", removed=cleared.removed, failed=cleared.failed,
                       error=_os_error_text(cleared.error))
        elif cleared.removed:
            self.audit("tmp.cleared", removed=cleared.removed)

    def _stopping(self) -> bool:
        return self._stop_signalled or self._stop.is_set()

    def _warn_of_config(self, config: DaemonConfig, tools: Mapping[str, Any]) -> None:
        if config.exposed is not None:
            self.log("the config's secrets are not private", why=config.exposed)
        for name, why in config_module.invalid_tools(tools).items():
            self.log("not a valid tool: requests selecting it fail with ErrInvalidDefinition", tool=name, why=why)
        for name, keys in config_module.shared_tool_names(tools).items():
            self.log("tools serving one tool name: a request may select only one of them", name=name, tools=",".join(keys))

    def _on_signal(self, signum: int, frame: object) -> None:
        # No lock may be taken here.  The handler runs in the main thread between any two of
        # its bytecodes, perhaps while that thread holds the very lock (a threading.Event's,
        # say: in its wait() or set(), or in this handler interrupted by a second signal,
        # which is how a drain began with SIGTERM twice) and would wait on itself forever.
        if signum == signal.SIGHUP:
            self._reload_signalled = True
        else:
            self._stop_signalled = True
            self._stop_signals += 1
        self._wake.set()

    def _reload_config(self) -> None:
        """Apply a reload that has been read, and start one a SIGHUP asked for.

        Reading happens in a thread of its own: a host tool's module imported in the main loop
        held it for as long as the import took (one waiting on a network share, or on a lock,
        for ever), and meanwhile nothing was claimed, no verdict retried, no SIGTERM acted on.
        A SIGHUP during a reload in progress is served by another one once it is done: the
        file may have changed after it was read.
        """
        if self._reloader is not None:
            if self._reloaded is None and self._reloader.is_alive():
                return
            # What it read is here, and it writes nothing more (or it died: nothing to apply).
            self._reloader.join()
            reloaded, self._reloader, self._reloaded = self._reloaded, None, None
            if reloaded is not None:
                self._apply_reload(reloaded)
        if not self._reload_signalled:
            return
        reloader = threading.Thread(target=self._read_config, name="adaptord-reload", daemon=True)
        try:
            reloader.start()
        except RuntimeError:  # at a task limit (see _ensure_workers): the next turn tries again
            return
        self._reload_signalled = False
        self._reloader = reloader

    def _read_config(self) -> None:
        """The reload thread: read the file and import its tools, for the main loop to apply."""
        result: tuple[DaemonConfig, dict[str, Any]] | str
        try:
            fresh = config_module.load(self.config_path, required=self.config_path is not None, regular=True)
            result = (fresh, fresh.load_tools())
        except Exception as exc:  # never the daemon's end: a reload keeps what it had
            result = str(exc) if isinstance(exc, config_module.ConfigError) else f"{type(exc).__name__}: {exc}"
        self._reloaded = result
        self._wake.set()

    def _apply_reload(self, reloaded: tuple[DaemonConfig, dict[str, Any]] | str) -> None:
        if isinstance(reloaded, str):
            self._log_and_record(
                "config reload failed; keeping the old config", "config.reload_failed", info=False, error=reloaded
            )
            return
        fresh, tools = reloaded
        # The workers are started, the drain's grace and the served A2A agents fixed at start:
        # a file value that differs from the one in effect waits for the next start, and the
        # line says so; one the command line sets is never the file's.  Compared with what is
        # in effect, not with the file's previous text, which may never have taken effect.
        differing = self._differing(fresh)
        restart = [key for key in differing if key not in self._set_on_command_line]
        if self._bridge is not None and _served(fresh.a2a) != _served(self._bridge.config):
            restart.append("a2a")
        interval_was = self.config.scan_interval
        self.config = fresh
        if fresh.scan_interval < interval_was:
            self._bring_scans_forward(fresh.scan_interval)
        if fresh.one_cpu != self._one_cpu:
            self._place_threads(fresh.one_cpu)
            self._write_state()  # its "cpu"
        self._tools = tools
        self._skills = fresh.skill_catalogue()
        self._withhold_credentials()
        self._next_prune = 0.0  # [retention] may have changed: applied at the next turn
        self._warn_of_config(fresh, tools)
        self._log_and_record(
            "config reloaded",
            "config.reloaded",
            info=True,
            source=fresh.source,
            # The default file removed: built-in defaults now, its tools and drivers gone.
            no_config_file=None if fresh.source else str(config_module.default_config_path()),
            restart_needed_for=",".join(restart) or None,
            command_line_keeps=",".join(self._command_line_keeps(fresh)) or None,
        )

    def _bring_scans_forward(self, interval: float) -> None:
        """A shorter ``scan_interval`` applies at once: nothing waits on a time the longer one
        set (a removed folder's check, the lifecycle log's size, a deferred verdict's retry,
        a refused watcher or worker thread tried again)."""
        due = time.monotonic() + interval
        self._next_layout_check = min(self._next_layout_check, due)
        self._next_rotation_check = min(self._next_rotation_check, due)
        self._next_retry = min(self._next_retry, due)
        self._next_watch_try = min(self._next_watch_try, due)
        self._next_worker_try = min(self._next_worker_try, due)

    def _write_state(self) -> None:
        """Write ``adaptord.json``: what ``adaptor status`` says of this daemon."""
        try:
            _durable.atomic_write_json(self.home.daemon_state, {**self._daemon_state, "cpu": self._cpu})
        except OSError as exc:  # a full disk: serve anyway, and give the claimed their verdicts
            self.log("cannot write the daemon state", error=_os_error_text(exc))

    def _place_threads(self, one_cpu: bool) -> None:
        """Keep the daemon's threads on one CPU (``one_cpu``), or let them use every CPU it may.

        Its threads take turns on one interpreter lock; spread over CPUs, each hand-over wakes
        one on another CPU, which cost more than half the daemon's CPU time under load.  The
        agent processes it starts get every CPU the daemon may use (see :mod:`adaptor._cpus`).
        """
        self._one_cpu = one_cpu
        if one_cpu:
            try:
                self._cpu = _cpus.keep_threads_on_one_cpu()
            except OSError as exc:  # (a seccomp filter, say): serving goes on unpinned
                self.log("cannot keep the threads on one CPU", error=_os_error_text(exc))
        else:
            self._cpu = None
            _cpus.let_threads_use_every_cpu()

    def _differing(self, config: DaemonConfig) -> list[str]:
        """The settings fixed at start (``workers``, ``grace``) whose value in ``config`` is not
        the one in effect."""
        in_effect = {"workers": self.workers, "grace": self.grace}
        return [key for key, value in in_effect.items() if getattr(config, key) != value]

    def _command_line_keeps(self, config: DaemonConfig) -> list[str]:
        """The settings ``config``'s file gives a value the command line overrides."""
        return [key for key in self._differing(config) if key in self._set_on_command_line and key in config.given]

    # -- A2A (--a2a) ---------------------------------------------------------------------------

    def _start_bridge(self) -> str | None:
        """Serve the ``[a2a.agents]`` over A2A; their runs come back in through the spool.

        The served agents are fixed at start: a SIGHUP reload does not change them.
        """
        if self.a2a is None:
            return None
        from adaptord.a2a_bridge import Bridge

        self._bridge = Bridge(
            self.home, self.config.a2a, self.a2a, stopping=self._stopping, log=self.log, on_death=self._wake.set
        )
        return self._bridge.start()

    def _stop_bridge(self) -> None:
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            bridge.stop()

    # -- watching ------------------------------------------------------------------------------

    def _start_observer(self) -> None:
        from watchdog.events import (
            DirCreatedEvent,
            DirMovedEvent,
            FileClosedEvent,
            FileCreatedEvent,
            FileMovedEvent,
            FileSystemEventHandler,
        )

        daemon = self
        responses = os.fsencode(self.home.approvals_responses)

        class Hint(FileSystemEventHandler):
            # Only a wake-up: no I/O and no lock held for long here, the observer thread must
            # stay free to deliver the next event.
            def on_any_event(self, event: Any) -> None:
                try:
                    path = os.fsencode(getattr(event, "dest_path", "") or event.src_path)
                    if path.startswith(responses):
                        with daemon._approval_changed:
                            daemon._approval_changed.notify_all()
                    # (a response no run waits for is the main loop's to set aside)
                    daemon._wake.set()
                except Exception:  # an exception here would kill the observer thread
                    pass

        # Arrivals only (created, moved in, closed after writing): the daemon's own unlinks
        # and renames out of these folders would otherwise wake it, and keep its watcher
        # threads busy, once per request.
        arrivals = [FileCreatedEvent, FileMovedEvent, FileClosedEvent, DirCreatedEvent, DirMovedEvent]
        watched = (self.home.spool_new, self.home.cancels, self.home.approvals_responses)
        self._next_watch_try = time.monotonic() + self.config.scan_interval
        try:
            self._observer = _watch.start_observer(Hint(), watched, event_filter=arrivals)
        except (OSError, RuntimeError) as exc:  # inotify limits; RuntimeError: no thread
            # Serving goes on by scanning; the start is tried again every scan_interval.
            if not self._watcher_refused:
                self._watcher_refused = True
                self.log(
                    "file watcher unavailable; scanning instead",
                    error=_os_error_text(exc) if isinstance(exc, OSError) else str(exc),
                    retry=f"every {self.config.scan_interval:g}s",
                )
            return
        if self._watcher_refused:
            self._watcher_refused = False
            self.log("file watcher running again", info=True)

    def _check_observer(self) -> None:
        if self._observer is None:
            if self._watcher_refused and time.monotonic() >= self._next_watch_try:
                self._start_observer()
        elif not self._observer.is_alive():
            self.log("file watcher died; restarting it and rescanning")
            self._stop_observer()
            self._start_observer()

    def _stop_observer(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            _watch.stop_observer(observer)

    # -- claiming ------------------------------------------------------------------------------

    def _scan(self) -> None:
        try:
            names = _in_arrival_order(self.home.spool_new)
        except FileNotFoundError:
            if not self._restore_home():
                return
            names = []
        except OSError as exc:
            self.log("cannot list the spool", error=str(exc))
            return
        # Claim in batches: every entry of a batch is linked into claimed/, then one fsync of
        # claimed/ makes all those claims durable at once (a burst of N requests costs one
        # sync, not N), then each is accepted and dispatched at once.
        for start in range(0, len(names), _CLAIM_BATCH):
            if self._stopping():
                return
            self._watchdog.ping()  # a burst of thousands is claimed in one turn of the loop
            claimed: list[tuple[str, str, Path]] = []
            for name in names[start : start + _CLAIM_BATCH]:
                try:
                    taken = self._take(name)
                except Exception as exc:  # the daemon never dies of a request
                    self.log("could not take a spool entry", name=repr(name), error=f"{type(exc).__name__}: {exc}")
                    continue
                if taken is not None:
                    claimed.append((name, *taken))
            if not claimed:
                continue
            received_at = _now()
            try:
                _durable.fsync_dir(self.home.claimed)
            except OSError as exc:
                # The claims are not known to be durable: undo them and leave the spool entries
                # where they are for the next scan to try again.
                self.log("cannot sync the claimed folder", error=str(exc))
                for name, _, path in claimed:
                    with contextlib.suppress(OSError):
                        if os.path.lexists(self.home.spool_new / name):
                            os.unlink(path)
                        else:  # taken by its name (another user's file, see _take)
                            os.rename(path, self.home.spool_new / name)
                return
            for name, _, _ in claimed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.home.spool_new / name)
            for _, request_id, path in claimed:
                try:
                    prior = self._carried_state(request_id)
                    if prior is None:
                        self._accept(request_id, path, attempt=0, received_at=received_at)
                    else:
                        self._accept(
                            request_id, path, attempt=int(prior.get("attempt") or 0),
                            received_at=str(prior.get("received_at") or received_at), prior=prior,
                        )
                except Exception as exc:
                    self.log("could not accept a request", id=request_id, error=f"{type(exc).__name__}: {exc}")
                self._dispatch()
        self._apply_cancels()
        self._dispatch()

    def _carried_state(self, request_id: str) -> dict[str, Any] | None:
        """The run state a request just claimed from the spool goes on with: its own earlier
        attempts' when a stop put it back there (status ``requeued``: a restart had recovered
        it), so its attempts go on counting; ``None`` otherwise.  Any other state under its id
        is an earlier request's, whose verdict was removed by hand before the id was submitted
        again: that run folder goes, so nothing of it is taken for this request's (a restart
        read its ``done`` as this request's run, finished with its verdict unwritten)."""
        state = self._state_in_own_folder(request_id)
        if state is None:
            return None
        if state.get("status") == "requeued":
            return state
        self._discard_earlier_run(request_id)
        return None

    def _state_in_own_folder(self, request_id: str) -> dict[str, Any] | None:
        """``runs/<id>/state.json`` when ``runs/<id>`` is a folder (not a link, not a file: a
        request finding one of those is refused at its start, as ever, and nothing of it is
        touched) holding a readable state; ``None`` otherwise."""
        try:
            if not stat.S_ISDIR(os.lstat(self.home.run_dir(request_id)).st_mode):
                return None
            state = _durable.read_json(self.home.run_state(request_id))
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def _discard_earlier_run(self, request_id: str) -> None:
        try:
            _retention.discard_run_dir(self.home, request_id)
        except OSError as exc:
            self.log("cannot remove an earlier request's run folder", id=request_id, error=_os_error_text(exc))

    def _lock_lost(self) -> str | None:
        """Why this daemon no longer holds its home's lock file, if it does not."""
        try:
            now = os.stat(self.home.daemon_lock)
        except FileNotFoundError:
            if not self.home.root.is_dir():
                return "the home folder is gone, its lock file with it"
            return "the home's lock file adaptord.lock was removed"
        except OSError:
            return None  # not known to be lost (EIO, say): the next look decides
        if (now.st_dev, now.st_ino) != self._lock_identity:
            return "the home's lock file adaptord.lock was replaced"
        return None

    def _home_gone(self) -> bool:
        """Whether the home is no longer this daemon's (see :meth:`_lock_lost`), remembered once
        known.  From then on the daemon writes nothing there (a lifecycle fact goes to stderr
        only): another daemon may serve a home made again at that path, with requests of the
        same ids.  The main loop looks every scan interval, a draining daemon's not at all, so
        whatever would write there first looks itself: a request's start, an approval poll,
        each event recorded, each verdict, the drain."""
        if self._home_lost is None:
            self._home_lost = self._lock_lost()
        return self._home_lost is not None

    def _check_layout(self) -> None:
        """Every scan interval: make a folder of the layout removed by hand again.

        Those the daemon reads all the time come back as soon as a read misses them; this
        covers the rest (``spool/tmp/``, which every submit needs, ``quarantine/``, ...).
        """
        now = time.monotonic()
        if now < self._next_layout_check:
            return
        self._next_layout_check = now + self.config.scan_interval
        if not all(folder.is_dir() for folder in self.home.folders):
            self._restore_home()

    def _restore_home(self) -> bool:
        """Create the home's folders again (someone removed one); ``False`` if that failed.

        The watcher is started again too: its watch went with the removed folder.  Nothing is
        created once this daemon's lock file is gone (the whole home removed, or made again by
        hand): only a new start can make a home whose daemon is known to be alone, and the main
        loop stops this one (see :meth:`_lock_lost`).
        """
        if self._lock_lost() is not None:
            return False
        try:
            self.home.ensure()
        except OSError as exc:
            self.log("cannot create the home's folders again", error=_os_error_text(exc))
            return False
        self.log("a folder of the home was missing; created it again")
        self._stop_observer()
        self._start_observer()
        return True

    def _take(self, name: str) -> tuple[str, Path] | None:
        """Link a valid spool entry into claimed/ (not yet synced); quarantine anything else."""
        source = self.home.spool_new / name
        request_id = _home.request_id_in_name(name)
        if request_id is None:
            self._quarantine(source, name, None, "the name is not <id>.json with a valid id")
            return None
        if name != f"{request_id}.json":
            self._quarantine(source, name, request_id, f"the file name must be {request_id}.json, not {name}")
            return None
        try:
            info = os.lstat(source)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(info.st_mode):
            kind = "symlink" if stat.S_ISLNK(info.st_mode) else "directory" if stat.S_ISDIR(info.st_mode) else "special file"
            self._quarantine(source, name, request_id, f"not a regular file ({kind})")
            return None
        if info.st_size > _home.MAX_REQUEST_BYTES:
            self._quarantine(source, name, request_id, f"larger than {_home.MAX_REQUEST_BYTES} bytes")
            return None
        claimed = self.home.claimed / name
        if _same_file(info, claimed):
            # The spool name a crash left next to its claim (another name of the very file: the
            # claim links it, then unlinks this one once the link is durable).  Its claim is
            # the request; this name only finishes going, no duplicate of anyone's.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(source)
            return None
        if self.home.has_verdict(request_id) or os.path.lexists(claimed):
            self._quarantine(source, name, None, "a request with this id was already received", id_in_use=request_id)
            return None
        if info.st_nlink > 1 and not self._only_staged(source, info):
            # Another name outside the spool: changing the file (its mode, below) would change
            # that one too, and its content is not the submitter's to hand over alone.
            self._quarantine(source, name, request_id, "the file has another name outside the spool (a hard link)")
            return None
        # link + unlink rather than rename: watchdog holds an unpaired move-out event for half a
        # second and every later event on the watch queues behind it, which would delay the
        # pickup of the next request.  The spool name is unlinked only once the claimed one is
        # durable (the caller's fsync); a crash in between leaves both names, and the next
        # pass removes the spool name (see above).
        try:
            os.link(source, claimed)
        except FileNotFoundError:
            return None  # taken by an earlier pass
        except PermissionError:
            if info.st_uid == os.geteuid():
                raise
            # Another user's file (root's, from `sudo cp`), which a system protecting hard
            # links (fs.protected_hardlinks, most distributions' default) lets only its owner
            # link: taken by its name instead (it was tried again at every scan, for ever).
            try:
                os.rename(source, claimed)
            except FileNotFoundError:
                return None
        if info.st_mode & 0o077:  # written with the writer's umask (the shell recipe's 0644)
            with contextlib.suppress(OSError):  # it may hold secrets: only the owner reads it
                os.chmod(claimed, 0o600, follow_symlinks=False)
        return request_id, claimed

    def _only_staged(self, source: Path, info: os.stat_result) -> bool:
        """Whether the other name of a spool entry is the one it was staged under in
        ``spool/tmp/`` (its writer links it into ``spool/new/``, then removes that one), so
        the file is the spool's alone."""
        if info.st_nlink == 2:
            with contextlib.suppress(OSError), os.scandir(self.home.spool_tmp) as staged:
                for entry in staged:
                    if entry.inode() == info.st_ino and entry.stat(follow_symlinks=False).st_dev == info.st_dev:
                        return True
        # The staged name may have gone since the entry was looked at.
        try:
            return os.lstat(source).st_nlink == 1
        except OSError:
            return False

    def _accept(
        self, request_id: str, claimed: Path, *, attempt: int, received_at: str,
        prior: Mapping[str, Any] | None = None, again: bool = False,
    ) -> None:
        """Read and validate a claimed request, then queue it (or write its rejection)."""
        if not again:
            # (A request found claimed at a start was received before: said, or the log showed
            # it received twice with nothing in between.)
            self.audit("request.received", request_id, attempt=attempt, **({} if prior is None else {"recovered": True}))
        self._being_written.pop(request_id, None)
        try:
            body = requests.read_limited(claimed, _home.MAX_REQUEST_BYTES)
            request = requests.parse(body, request_id)
        except InvalidRequestError as exc:
            if requests.maybe_cut_short(exc) and _written_lately(claimed):
                # Written straight into spool/new/ rather than linked in whole: its writer may
                # still be at it (through its descriptor, the claim does not stop it).
                self._being_written[request_id] = functools.partial(
                    self._accept, request_id, claimed, attempt=attempt, received_at=received_at,
                    prior=prior, again=True,
                )
                return
            self._reject(request_id, exc, received_at)
            return
        except OSError as exc:
            if _out_of_descriptors(exc):
                # The daemon's shortage, not the request's fault: read again shortly (the main
                # loop does not wait for descriptors here).
                self._let_idle_logs_go()
                if not again:
                    self.log("out of file descriptors; the request is read again shortly", id=request_id)
                self._being_written[request_id] = functools.partial(
                    self._accept, request_id, claimed, attempt=attempt, received_at=received_at,
                    prior=prior, again=True,
                )
                return
            self._reject(
                request_id,
                InvalidRequestError([{"path": "", "message": f"unreadable request file: {exc.strerror}"}]),
                received_at,
            )
            return
        except Exception as exc:  # whatever a hostile file does, it gets a verdict
            self.log("request could not be read", id=request_id, error=type(exc).__name__)
            self._reject(
                request_id,
                InvalidRequestError([{"path": "", "message": f"request could not be processed ({type(exc).__name__})"}]),
                received_at,
            )
            return
        thread = request.get("thread")
        prompt = request.get("prompt")
        # A queued request costs its prompt's size in memory: a script queueing a thousand
        # requests that each paste a file would cost the daemon a gigabyte.  A long prompt
        # stays in the claimed file until the request starts.
        left_on_disk = isinstance(prompt, str) and len(prompt) > _PROMPT_KEPT_WHILE_QUEUED
        job = Job(
            id=request_id,
            request={**request, "prompt": ""} if left_on_disk else request,
            received_at=received_at,
            attempt=attempt,
            keys=_keys_of(thread),
            run_ids=list((prior or {}).get("run_ids") or ()),
            state=dict(prior or {}),
            prompt_left_on_disk=left_on_disk,
        )
        # Nothing is written here: the durable claim is all a queued request needs (recovery
        # queues a claimed request without a state file again, received at the claim's time).
        # Its run folder is made once it starts, off the pickup path.  Only a request
        # recovered with an earlier attempt's state says it is queued again.
        if self._cancel_marked(job):
            # Cancelled before it was read (while no daemon ran, say): it never queues, so no
            # worker can start it before the main loop reads the cancels.
            self._cancel_unstarted(job)
            return
        if prior:
            try:
                self._save_state(job, "queued")
            except OSError as exc:  # the earlier state stays: its attempt count is still right
                self.log("cannot write the run state", id=request_id, error=_os_error_text(exc))
        self._enqueue(job)
        self.audit("request.queued", request_id)

    def _read_again(self) -> None:
        """Accept (or reject) again the claimed requests whose files were still being written."""
        waiting, self._being_written = self._being_written, {}
        for accept in waiting.values():
            try:
                accept()
            except Exception as exc:  # as in _scan: never the daemon's end
                self.log("could not accept a request", error=f"{type(exc).__name__}: {exc}")
        if waiting:
            self._apply_cancels()  # one may have come while its file was being written
            self._dispatch()

    def _quarantine(
        self, source: Path, name: str, request_id: str | None, why: str, *, id_in_use: str | None = None
    ) -> None:
        """Move a spool entry aside; with ``request_id`` (the id its name carries), give that
        id a rejection verdict, unless the id is another request's (``id_in_use``: known to be,
        said in the fact)."""
        target = self.home.quarantine / f"{time.time_ns()}-{_name_cut(name, 150) or 'unnamed'}"
        try:
            redacted = self._redacted_entry(source)
            if redacted is None:
                os.rename(source, target)
            else:
                # Its secrets may stay on disk only while a request is queued or running.
                _durable.atomic_write(target, redacted)
                os.unlink(source)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.log("cannot quarantine a spool entry", name=repr(name), error=str(exc))
            return
        if request_id is not None and self._id_in_use(request_id, moved=target):
            # A verdict here would be a second one for that request, or would take the id from
            # it: a request has exactly one verdict, its own.
            self.audit("request.quarantined", None, why=why, file=target.name, id_in_use=request_id)
            return
        in_use = {} if id_in_use is None else {"id_in_use": id_in_use}
        self.audit("request.quarantined", request_id, why=why, file=target.name, **in_use)
        if request_id is not None:
            problem = f"{why}; the file was moved to quarantine/{target.name}"
            self._reject(request_id, InvalidRequestError([{"path": "", "message": problem}]), _now())

    def _redacted_entry(self, source: Path) -> bytes | None:
        """A quarantined entry's content with its secrets redacted, as the request copy shows
        them, when it is a request (a regular file of JSON, not too large to read) holding
        any; else None: it is moved as it was written."""
        try:
            # (Read as every request file is: no link followed, no FIFO waited on, bounded.)
            request = requests.decode(requests.read_limited(source, _home.MAX_REQUEST_BYTES))
        except (InvalidRequestError, OSError, ValueError):
            return None
        defaults = self.config.driver_defaults(str(request.get("driver", "")))
        secrets = requests.secrets_of(request, defaults)
        if not secrets:
            return None
        return orjson.dumps(requests.redacted_request(request, secrets), option=orjson.OPT_APPEND_NEWLINE)

    def _id_in_use(self, request_id: str, *, moved: Path) -> bool:
        """Whether another request with this id is on its way in through the spool, claimed
        (queued, running, read again, its verdict deferred) or has a verdict.

        ``moved`` is the quarantined file: still named in ``spool/tmp/`` where its writer
        staged it (``Client.submit`` links it into ``spool/new/``, then removes that name), it
        is no other request, and its submitter waits for this verdict.
        """
        staged = self.home.spool_tmp / f"{request_id}.json"
        for place in self.home.places(request_id):
            try:
                found = os.lstat(place)
            except FileNotFoundError:
                continue
            except OSError:
                return True
            if place == staged and _same_file(found, moved):
                continue
            return True
        return False

    def _reject(self, request_id: str, error: InvalidRequestError, received_at: str) -> None:
        self._write_verdict(
            request_id,
            run_id=None,
            result=None,
            error=error,
            received_at=received_at,
            started_at=None,
            session=None,
            secrets=[],
        )

    # -- scheduling --------------------------------------------------------------------------

    def _enqueue(self, job: Job) -> None:
        with self._lock:
            job.arrival = next(self._arrivals)
            self._queued[job.id] = job
            for key in job.keys:
                self._lines.setdefault(key, deque()).append(job)
            if self._first_on_its_keys(job):
                heapq.heappush(self._ready, (job.arrival, job))

    def _first_on_its_keys(self, job: Job) -> bool:
        """(Under _lock.)"""
        return all(self._lines[key][0] is job for key in job.keys)

    def _leave_lines(self, job: Job) -> None:
        """(Under _lock.)  ``job`` is done with its keys (finished, or taken out unstarted).

        Whoever it leaves first on all of their keys becomes ready.
        """
        promoted: list[Job] = []
        for key in job.keys:
            line = self._lines.get(key)
            if line is None:  # a drain emptied the schedule while the job ran
                continue
            was_first = line[0] is job
            line.remove(job)
            if not line:
                del self._lines[key]
            elif was_first and line[0] not in promoted and self._first_on_its_keys(line[0]):
                promoted.append(line[0])
        for ready in promoted:
            heapq.heappush(self._ready, (ready.arrival, ready))

    def _unqueue(self, request_id: str) -> Job | None:
        """(Under _lock.)  Take a not-started job out of the schedule."""
        job = self._queued.pop(request_id, None)
        if job is None:
            return None
        if not job.keys or self._first_on_its_keys(job):
            self._ready.remove((job.arrival, job))
            heapq.heapify(self._ready)
        self._leave_lines(job)
        return job

    def _dispatch(self) -> None:
        started: list[Job] = []
        with self._lock:
            if self._stopping():
                return
            while self._ready and len(self._running) < len(self._worker_threads):
                _, job = heapq.heappop(self._ready)
                del self._queued[job.id]
                self._running[job.id] = job
                started.append(job)
        for job in started:
            self._jobs.put(job)

    def _ensure_workers(self) -> None:
        """Start the worker threads still missing; a refused one is tried again every scan_interval.

        A task limit refuses threads for real: systemd's ``TasksMax`` or a container's
        ``pids.max`` counts the agents' processes too, so a busy agent can use it up.  The
        daemon then serves with the workers it has (requests wait in the queue meanwhile).
        """
        if len(self._worker_threads) == self.workers or time.monotonic() < self._next_worker_try:
            return
        while len(self._worker_threads) < self.workers:
            thread = threading.Thread(
                target=self._worker_loop, name=f"adaptord-worker_{len(self._worker_threads)}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread"
                self._next_worker_try = time.monotonic() + self.config.scan_interval
                if not self._workers_short:
                    self._workers_short = True
                    self.log(
                        "cannot start a worker thread; serving with fewer", error=str(exc),
                        started=len(self._worker_threads), workers=self.workers,
                        retry=f"every {self.config.scan_interval:g}s",
                    )
                return
            self._worker_threads.append(thread)
        if self._workers_short:
            self._workers_short = False
            self.log("all workers started", workers=self.workers)
        self._dispatch()

    def _worker_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._work(job)
            except Exception as exc:  # even its failure handling failed: the worker stays
                self.log("worker failed", id=job.id, error=type(exc).__name__)

    def _work(self, job: Job) -> None:
        try:
            self._execute(job)
        except Exception as exc:  # a bug here must not lose the request: it still gets a verdict
            secrets = self._job_secrets(job)
            self.log("worker failed", id=job.id, error=_redact.Redactor(secrets).text(f"{type(exc).__name__}: {exc}"))
            if not self.home.has_verdict(job.id):
                with contextlib.suppress(Exception):
                    self._write_verdict(
                        job.id, run_id=None, result=None, error=exc, received_at=job.received_at,
                        started_at=None, session=None, secrets=secrets,
                    )
        finally:
            with self._lock:
                self._running.pop(job.id, None)
                self._leave_lines(job)
                self._idle.notify_all()
            # This worker is free: start what is ready now rather than waking the main loop.
            self._dispatch()

    def _whole_request(self, job: Job) -> dict[str, Any]:
        """The job's request, with a prompt left on disk while it was queued read back in."""
        if job.prompt_left_on_disk:
            body = requests.read_limited(self.home.claimed / f"{job.id}.json", _home.MAX_REQUEST_BYTES)
            job.request = requests.parse(body, job.id)
            job.prompt_left_on_disk = False
        return job.request

    def _execute(self, job: Job) -> None:
        if self._home_gone():
            # (Looked at here too, one stat: starting it would make the removed home again
            # before the main loop noticed, its workspace and run folder first.)
            self.log("request not started", id=job.id, why=self._home_lost)
            return
        if job.cancel_requested or self._cancel_marked(job):
            # Cancelled between its dispatch and now: its agent must not start.
            self._cancel_unstarted(job)
            return
        refused = self._link_in_the_way(job.id)
        if refused is not None:
            self._reject(job.id, InvalidRequestError([{"path": "", "message": refused}]), job.received_at)
            return
        request = self._whole_request(job)
        # One look at the config (a reload may replace it at any moment): the run's driver
        # table, and with it its secrets, are those it runs with.
        defaults = self.config.driver_defaults(str(request["driver"]))
        tools, skills = self._tools, self._skills
        self._default_workspace(request, defaults)  # before the request copy is written: it says so
        secrets = job.secrets = self._secrets_of(request, defaults)
        redactor = _redact.Redactor(secrets)
        session = requests.session_of(request)
        started_at = _now()
        job.attempt += 1
        result: adaptor.Result | None = None
        error: BaseException | None = None
        try:
            call = requests.build(
                request,
                driver_defaults=defaults,
                thread_store=self._store,
                on_approval=lambda req: self._route_approval(job, req),
                tools=tools,
                kept=self._kept,
                skill_provider=skills,
            )
        except BaseException as exc:
            error = exc
        else:
            # Before the run can save anything: recovery tells from it whether a crash came
            # after this turn was saved to its thread (then it must not run again).
            thread_before = self._thread_mark(request)
            try:
                # The run folder and its state, with the run's id, are written before the run
                # can start (a kill -9 between its agent's start and this write ran it again:
                # recovery found no attempt) and before any of its events (readers of the
                # audit log rely on it); made durable only once the driver starts: the pickup
                # waits for no fsync.  A crash from here on is an interrupted run, never a
                # silent second one.
                attempt_run_id = new_run_id()
                job.run_ids.append(attempt_run_id)
                self._prepare_run_dir(job)
                self._save_state(
                    job, "running", started_at=started_at, session=session, thread_before=thread_before
                )
                with run_id_as(attempt_run_id):
                    stream = call.start()
                job.stream = stream
                # Its line: state.json exists.  The run id joins the fact to the run's events.
                self.audit("request.started", job.id, attempt=job.attempt, run_id=attempt_run_id)
                self._sync_state(job)
                if job.cancel_requested:
                    self._cancel_run(job, stream)
                for event in stream:
                    self._record(session, event, redactor, job)
                if job.unrecorded > 1:
                    self.log("events not recorded", id=job.id, count=job.unrecorded)
                result = stream.result()
            except BaseException as exc:
                error = exc
                if job.stream is None:  # it never started (its folder could not be written)
                    job.run_ids.pop()
            finally:
                call.close(self.grace)
        if not job.run_dir_ready:  # the run never started; the folder still gets its request copy
            if self._prepare_run_dir_or_log(job):
                with contextlib.suppress(OSError):  # the verdict says what went wrong
                    self._save_state(job, "running", started_at=started_at, session=session)
            self.audit("request.started", job.id, attempt=job.attempt)
        if isinstance(error, errors.RunError):
            result = error.result
        run_id = job.run_ids[-1] if job.run_ids else None
        self._routes_ended(job)
        self._write_verdict(
            job.id, run_id=run_id, result=result, error=error, received_at=job.received_at,
            started_at=started_at, session=session, secrets=secrets, job=job, flush_events=True,
        )  # the claimed copy is removed with the verdict

    def _cancel_run(self, job: Job, stream: adaptor.Stream) -> None:
        """Cancel ``job``'s run; one the daemon's stop cancels says so, in its ``RunFinished``
        and its verdict alike: it is not to be taken for an ``adaptor cancel`` (the request
        may be worth submitting again)."""
        if not job.stopped_by_drain:
            stream.cancel()
            return
        why = "signalled again" if self._stop_signals >= 2 else f"the run outlasted the stop's grace of {self.grace:g} s"
        stream._cancel_as(f"run cancelled: adaptord stopped ({why})", {"daemon_stopped": True})

    def _link_in_the_way(self, request_id: str) -> str | None:
        """Why the request cannot start: a link where its run folder or its verdict goes (or a
        file where its run folder goes), or ``None``.

        The daemon writes a request's files only as its own, so nothing runs; its rejection
        verdict is written once the link at the verdict's name is moved aside.
        """
        run_dir = self.home.run_dir(request_id)
        for path in (run_dir, self.home.verdict(request_id)):
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(found.st_mode):
                what = "a symbolic link"
            elif path is run_dir and not stat.S_ISDIR(found.st_mode):
                what = "not a folder"
            else:
                continue
            return (
                f"{path.relative_to(self.home.root)} is {what}; the daemon writes a request's files "
                "only where it made them (remove it, or submit under another id)"
            )
        return None

    def _default_workspace(self, request: dict[str, Any], defaults: Mapping[str, Any]) -> None:
        """Give a request that names no working directory the home's ``workspace/``.

        Left to the SDK, its agent would work in the daemon's own directory (``/`` under
        systemd), outside the home.  A ``cwd`` in its driver config (the request's or the
        daemon config's) is the directory it names, as in-process.
        """
        if request.get("workspace") is not None:
            return
        if requests.driver_config(request, defaults).get("cwd") is not None:
            return
        request["workspace"] = str(self.home.workspace)
        with contextlib.suppress(OSError):  # removed by hand, say; else the run says what is wrong
            _durable.ensure_dir(self.home.workspace, durable=False)

    def _secrets_of(self, request: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> list[str]:
        """The request's secret values, those its driver gets from the daemon config (its
        ``defaults``), and the daemon's own credentials (kept from agents, redacted should one
        reach a run anyway)."""
        if defaults is None:
            defaults = self.config.driver_defaults(str(request.get("driver", "")))
        return requests.secrets_of(request, defaults) + self.config.a2a.credential_values()

    def _withhold_credentials(self) -> None:
        _process.withhold_from_agents(self.config.a2a.credential_variables())

    def _job_secrets(self, job: Job) -> list[str]:
        """The secrets of a job's run: those it started with, once it started."""
        return job.secrets if job.secrets is not None else self._secrets_of(job.request)

    def _record(self, session: str, event: events.Event, redactor: _redact.Redactor, job: Job) -> None:
        if self._home_gone():
            # (A log of that name there is another daemon's.)  Looked at for each event, one
            # stat: the recorder takes the log's lock again after every idle gap, and making
            # a lock file makes the folders above it, the removed home included.
            return
        try:
            try:
                recorded = self._events.record(session, _as_recorded(event, redactor, bound=False))
            except (RecursionError, orjson.JSONEncodeError):
                # Nested deeper than the encoder's 254 levels (or, redacted, than Python's
                # stack): an agent's tool arguments can be.  Recorded with its deepest parts
                # replaced by a note, as in the run's files.
                recorded = self._events.record(session, _as_recorded(event, redactor, bound=True))
            job.recorded = True
            if job.first_host_seq is None:
                job.first_host_seq = recorded.host_seq
        except Exception as exc:
            job.unrecorded += 1
            if job.unrecorded == 1:
                self.log("event not recorded", id=job.id, error=f"{type(exc).__name__}: {exc}")
        if self._events_backend.repair_count != self._repairs_told:
            self._tell_repairs()
        if isinstance(event, events.Notice) and event.data.get("phase") == "driver.started":
            try:
                # "events_from": where the request's records begin in its session log, so a
                # reader of a long thread's turn need not read the conversation's whole history
                # (an earlier attempt's, when there was one, is kept).
                self._save_state(job, "running", entered=True, session=session,
                                 events_from=job.state.get("events_from", job.first_host_seq))
            except OSError as exc:
                # The run goes on: recovery counts a run with a run id as entered anyway
                # (see _home.run_entered), which is what this state would have said.
                self.log("cannot write the run state", id=job.id, error=_os_error_text(exc))

    def _tell_repairs(self) -> None:
        """Say which audit logs had a torn tail cut (a crash's, found by the first append after
        it: a requeued run's, an interrupted run's record): storage.md has writers record that
        they did, and it went without a trace."""
        with self._repairs_lock:
            told = self._repairs_told
            cut = self._events_backend.repairs[told:]
            self._repairs_told = told + len(cut)
        for report in cut:
            self._audit_cut("audit_log.repaired", report)

    def _tell_store_repair(self, report: _durable.RepairReport) -> None:
        """A thread run's store write cut a crash's leftovers from the store's log first (a
        torn last line, a power cut's unsynced lease lines): said as audit logs' cuts are."""
        self._audit_cut("thread_store.repaired", report)

    def _audit_cut(self, phase: str, report: _durable.RepairReport) -> None:
        self.audit(phase, log=os.path.basename(report.path), offset=report.offset,
                   dropped_bytes=report.dropped_bytes)

    # -- approvals as files --------------------------------------------------------------------

    def _route_approval(self, job: Job, req: adaptor.ApprovalRequest) -> None:
        """The ``on_approval`` handler of daemon runs: a pending file answered by the CLI."""
        with self._approval_changed:
            job.routes += 1
        try:
            self._route(job, req)
        finally:
            with self._approval_changed:
                job.routes -= 1
                self._approval_changed.notify_all()

    def _routes_ended(self, job: Job) -> None:
        """Wait (a few seconds at most) until the job's approval routes have ended: the run
        goes on once a request is settled, without waiting for its route, whose last fact
        (`approval.expired`) must still come before the verdict's."""
        with self._approval_changed:
            self._approval_changed.notify_all()  # a route waiting for its next poll looks now
            self._approval_changed.wait_for(lambda: job.routes == 0, timeout=_ROUTES_END_WITHIN)

    def _route(self, job: Job, req: adaptor.ApprovalRequest) -> None:
        if self._home_lost is not None:
            return  # (the run is being cancelled: nothing of it is written there any more)
        redactor = _redact.Redactor(self._job_secrets(job))
        # The tool input in its details is the agent's, which may nest too deeply to write.
        record = redactor.value(_nesting.copy(events.to_json(req), depth=_FILE_DEPTH))
        record["request_id"] = job.id
        pending = self.home.approvals_pending / f"{req.id}.json"
        try:
            _durable.atomic_write_json(pending, record)
        except OSError as exc:
            # The run fails with what its approval route raised ("approval handler raised ..."):
            # said as the daemon's own failure to ask, not as a file name deep in its home.
            raise OSError(exc.errno, f"adaptord could not write the approval request: {_os_error_text(exc)}") from exc
        self.audit("approval.pending", job.id, approval_id=req.id, kind=req.kind)
        self._wake_routes_when_settled(req)
        hand_over = functools.partial(_hand_over, req, redactor)
        while True:
            # Looked at each time (one stat): taking the approvals lock in a removed home would
            # make it again, folders and all.  An approval of that id there is another daemon's.
            if self._home_gone():
                return
            # The deadline its pending file shows, by which `adaptor approvals` and `approve`
            # judge it, has passed while the run's own timer (the monotonic clock) has not: the
            # wall clock was stepped forward.  No response can be given any more, so it times
            # out now, as every reader was told, rather than hold its run until that timer.
            if not req.settled and req.deadline is not None and datetime.now(UTC) >= req.deadline:
                req._live().expire("timed_out")
            # The SDK settles the request at its deadline too (this route is the run's
            # on_approval callback): then, or once the run ended, a response comes too late.
            if req.settled:
                why = _why_settled(req)
                late = _home.abandon(self.home, req.id, _EXPIRED_BECAUSE[why])
                self._audit_expired(job, req, why, late)
                return
            taken = _home.take_response(self.home, req.id, hand_over, functools.partial(self._refused, job, req))
            if taken is not None:
                self._audit_taken(job, req, *taken)
                return
            with self._approval_changed:
                # Checked holding the condition: a settle's wake-up cannot slip in before the wait.
                if not req.settled:
                    self._approval_changed.wait(_APPROVAL_POLL)

    def _refused(self, job: Job, req: adaptor.ApprovalRequest, why: str, quarantined: str) -> None:
        """A response file written by hand was set aside (the request stays pending): said in
        the log and the audit log, or whoever wrote it only saw the request stay open."""
        self.audit("approval.response_refused", job.id, approval_id=req.id, why=why, quarantined=quarantined)

    def _refuse_unawaited_responses(self) -> None:
        """Set aside the response files written by hand for an approval no run waits for (settled
        already, or never pending), saying why: else they stayed there, unread and unanswered."""
        try:
            refused = _home.refuse_unawaited(self.home)
        except Exception as exc:  # a folder it cannot read is looked at again next turn
            self.log("cannot check the approval responses", error=_os_error_text(exc) if isinstance(exc, OSError) else type(exc).__name__)
            return
        for approval_id, why, quarantined in refused:
            self.audit("approval.response_refused", None, approval_id=approval_id, why=why, quarantined=quarantined)

    def _wake_routes_when_settled(self, req: adaptor.ApprovalRequest) -> None:
        """Wake the routes as soon as ``req`` settles (the run's end expires it), so its pending
        file is expired at once rather than at the next poll, still taking responses."""

        def wait_then_wake() -> None:
            req.wait()  # every request settles: answered, timed out, or expired by the run's end
            with self._approval_changed:
                self._approval_changed.notify_all()

        threading.Thread(target=wait_then_wake, name=f"approval-{req.id}", daemon=True).start()

    def _audit_taken(self, job: Job, req: adaptor.ApprovalRequest, response: Mapping[str, Any], won: bool) -> None:
        if won:
            self.audit("approval.resolved", job.id, approval_id=req.id, action=str(response.get("action")))
        else:
            self._audit_expired(job, req, _why_settled(req), response)

    def _audit_expired(
        self, job: Job, req: adaptor.ApprovalRequest, why: str, late: Mapping[str, Any] | None
    ) -> None:
        self.audit("approval.expired", job.id, approval_id=req.id, why=why, **_ignored(late))

    # -- retention -----------------------------------------------------------------------------

    def _prune(self) -> None:
        """Every scan interval, have the lifecycle log rotated if it grew too large (checked
        hourly, a busy daemon wrote it far past its limit); every _PRUNE_INTERVAL (and at the
        first turn of the main loop, and after a reload), start a pass removing what is past
        retention, so a daemon that runs for months does not fill its disk.

        The pass runs in a thread of its own: on a home with months of requests it may take
        a while, and the main loop goes on claiming meanwhile.
        """
        retention = self.config.retention
        now = time.monotonic()
        if now >= self._next_rotation_check:
            self._next_rotation_check = now + self.config.scan_interval
            if retention.lifecycle_log_bytes != math.inf and self._daemon_log is not None:
                self._daemon_log.rotate(int(retention.lifecycle_log_bytes))  # the writer looks, off this loop
        if now < self._next_prune or (self._pruner is not None and self._pruner.is_alive()):
            return
        self._next_prune = now + _PRUNE_INTERVAL
        pruner = threading.Thread(target=self._prune_pass, args=(retention,), name="adaptord-prune", daemon=True)
        try:
            pruner.start()
        except RuntimeError:  # at a task limit (see _ensure_workers): the next turn tries again
            self._next_prune = time.monotonic() + self.config.scan_interval
            return
        self._pruner = pruner

    def _prune_pass(self, retention: config_module.Retention) -> None:
        try:
            _home.prune_resolved(self.home)
        except Exception as exc:  # a folder it cannot read is tried again next time
            self.log("cannot prune resolved approvals", error=_os_error_text(exc) if isinstance(exc, OSError) else type(exc).__name__)
        try:
            pruned, more = _retention.prune(
                self.home, retention, hold=self._unless_on_its_way, hold_thread=self._unless_thread_on_its_way,
                conversations=self._conversations, stopping=self._stopping,
            )
        except Exception as exc:  # (a bug) never the daemon's end; the next pass tries again
            self.log("cannot prune the home", error=f"{type(exc).__name__}: {exc}")
            return
        if pruned or pruned.failed:
            counts: dict[str, Any] = pruned.counts()
            if pruned.failed:
                counts.update(failed=pruned.failed, error=pruned.error)
            self.audit("retention.pruned", None, **counts)
        if more:  # a home never pruned before: go on at the main loop's next turn
            self._next_prune = 0.0

    @contextlib.contextmanager
    def _unless_on_its_way(self, request_id: str) -> Iterator[bool]:
        """Hold the schedule: ``True`` when no request ``request_id`` is on its way (in the
        spool, claimed, queued, running, or with its verdict deferred), so its files may go.

        A request is claimed before it is queued, and queued (under this lock) before a
        worker makes its run folder, so none can start on its way while this is held.
        """
        with self._lock:
            yield not (
                request_id in self._queued
                or request_id in self._running
                or request_id in self._deferred
                or any(os.path.lexists(place) for place in self.home.places(request_id)[:-1])
            )

    @contextlib.contextmanager
    def _unless_thread_on_its_way(self, session: str) -> Iterator[bool]:
        """Hold the schedule: ``True`` when no request of thread ``session`` is queued or
        running and no verdict waits to be written (it may point at the log), the log then
        closed in this process, so it may go; a request claimed meanwhile starts a new one."""
        with self._lock:
            free = not self._deferred and not any(
                _home.session_for_thread(key) == session
                for job in (*self._queued.values(), *self._running.values())
                for key in job.keys
            )
            if free:
                # (Closed after its run's verdict already, unless that failed: the appender
                # here must not go on numbering a file that is gone.)
                self._events_backend.close_idle(session)
            yield free

    def _conversations(self) -> set[str]:
        """The log names of the thread keys with a conversation in the store."""
        return {_home.session_for_thread(key) for key in self._store.keys()}

    def _stop_pruning(self) -> None:
        """Let a pass in progress stop (it looks at _stopping between removals) before the drain."""
        pruner, self._pruner = self._pruner, None
        if pruner is not None:
            pruner.join(timeout=_STOP_TAIL)

    # -- cancellation ---------------------------------------------------------------------------

    def _apply_cancels(self) -> None:
        try:
            names = [entry.name for entry in os.scandir(self.home.cancels)]
        except OSError:
            return
        for request_id in names:
            if not _home.REQUEST_ID.fullmatch(request_id):
                with contextlib.suppress(OSError):
                    os.unlink(self.home.cancels / request_id)
                continue
            with self._lock:
                running = self._running.get(request_id)
                queued = self._unqueue(request_id)
            if running is not None:
                # A second `adaptor cancel` of the same run (its mark is made again once this
                # sweep took the first) asks for nothing new: one fact per cancelled run.
                if not running.cancel_requested:
                    running.cancel_requested = True
                    if running.stream is not None:
                        running.stream.cancel()
                    self.audit("request.cancel_requested", request_id)
            elif queued is not None:
                self._cancel_unstarted(queued)
                self._dispatch()  # a job waiting behind it on its thread key may be ready now
            elif request_id in self._being_written or (self.home.spool_new / f"{request_id}.json").exists():
                continue  # not queued yet: it is once its file is read whole, then this applies
            with contextlib.suppress(OSError):
                os.unlink(self.home.cancels / request_id)

    def _cancel_marked(self, job: Job) -> bool:
        """Whether a cancel of ``job`` waits in ``control/cancel/`` (swept by _apply_cancels)."""
        return os.path.lexists(self.home.cancels / job.id)

    def _cancel_unstarted(self, job: Job) -> None:
        """The verdict of a job cancelled before it started: ``CancelledError``, nothing run."""
        self.audit("request.cancel_requested", job.id)
        self._prepare_run_dir_or_log(job)
        # A requeued request whose earlier attempt a crash interrupted did start, once.
        why = f"cancelled before its attempt {job.attempt + 1} started" if job.attempt else "cancelled before it started"
        self._write_verdict(
            job.id, run_id=None, result=None, error=errors.CancelledError(why),
            received_at=job.received_at, started_at=None, session=None,
            secrets=self._secrets_of(job.request), job=job,
        )

    # -- verdicts ------------------------------------------------------------------------------

    def _write_verdict(self, request_id: str, **verdict: Any) -> None:
        """Write the request's verdict (see :meth:`_try_write_verdict`), or defer it.

        A verdict the disk refuses (full, failing) is not lost: its request stays claimed and
        the verdict is tried again every scan interval until it is written.  Were the daemon
        to stop first, the next start gives the claimed request its verdict (see _recover).
        """
        if self._home_gone():
            self.log("verdict not written", id=request_id, why=self._home_lost)
            return
        try:
            self._write_verdict_that_fits(request_id, verdict)
        except OSError as exc:
            if _out_of_descriptors(exc):
                self._let_idle_logs_go()  # before the retry
            with self._lock:
                first = request_id not in self._deferred
                self._deferred[request_id] = functools.partial(self._write_verdict_that_fits, request_id, verdict)
            if first:
                # A few bytes the disk may still take: `adaptor status` then shows the run as
                # finished, and a restart knows it finished (never run again, nor called cut
                # short) even if the verdict is still refused then.
                with contextlib.suppress(OSError):
                    self._write_state_raw(request_id, {"status": _home.FINISHED}, merge=True)
                self.audit(
                    "verdict.deferred", request_id, error=_os_error_text(exc),
                    retry=f"every {self.config.scan_interval:g}s",
                )

    def _retry_verdicts(self, *, last: bool = False) -> None:
        """Try the deferred verdicts again; with ``last`` (shutdown), say which stay claimed."""
        with self._lock:
            pending = list(self._deferred.items())
        if not pending or (not last and time.monotonic() < self._next_retry):
            return
        self._next_retry = time.monotonic() + self.config.scan_interval
        if self._home_gone():
            for request_id, _ in pending:
                self.log("verdict not written", id=request_id, why=self._home_lost)
            with self._lock:
                self._deferred.clear()
            return
        if not all(folder.is_dir() for folder in (self.home.verdicts, self.home.runs, self.home.events)):
            self._restore_home()
        for request_id, write in pending:
            self._watchdog.ping()  # each verdict is a few fsyncs, and a full disk defers many
            try:
                write()
            except OSError as exc:
                if _out_of_descriptors(exc):
                    self._let_idle_logs_go()  # as at the first try
                if last:
                    self.audit(
                        "verdict.unwritten", request_id,
                        note="claimed; the next start fails it as interrupted, keeping the text "
                        "its audit log holds (or runs it again: on_interrupt requeue)",
                    )
                continue
            except Exception as exc:  # a bug must not stop the others or the main loop
                self.log("verdict retry failed", id=request_id, error=type(exc).__name__)
                continue
            with self._lock:
                self._deferred.pop(request_id, None)
            self.audit("verdict.undeferred", request_id)

    def _write_verdict_that_fits(self, request_id: str, verdict: Mapping[str, Any]) -> None:
        """:meth:`_try_write_verdict`; when its files are larger than this process may write
        (``EFBIG``: the file-size limit, ``ulimit -f``, or the file system's own), which no
        retry mends, a verdict without them says so: the request gets its one verdict."""
        try:
            self._try_write_verdict(request_id, **verdict)
        except OSError as exc:
            if exc.errno != errno.EFBIG:
                raise
            too_large = _verdict_too_large(verdict.get("error"), exc)
            self._try_write_verdict(request_id, **{**verdict, "result": None, "error": too_large})
            self.log("verdict too large; written without its files", id=request_id, error=_os_error_text(exc))

    def _try_write_verdict(
        self,
        request_id: str,
        *,
        run_id: str | None,
        result: adaptor.Result | None,
        error: BaseException | None,
        received_at: str,
        started_at: str | None,
        session: str | None,
        secrets: list[str],
        job: Job | None = None,
        flush_events: bool = False,
    ) -> None:
        """Write the request's verdict, exactly once, after everything it points to is durable.

        The side files are written in place, the request copy joins them, and with
        ``flush_events`` the audit log is synced while the disk writes them; then the side
        files, the request copy and the verdict's content are fsynced, then the run folder
        (one sync for all their entries), and only then does the verdict appear.  ``job`` is
        the request's in-memory job when there is one (its state is then not read back).
        """
        redactor = _redact.Redactor(secrets)
        run_dir = self.home.run_dir(request_id)
        batch = _durable.SyncBatch()
        try:
            try:
                result_json, refused = self._write_side_files(request_id, result, redactor, job, batch)
            except (RecursionError, orjson.JSONEncodeError):
                # The result holds a value nested too deeply to write (see _record): the side
                # files, written again over the same paths, keep a bounded copy of it.
                result_json, refused = self._write_side_files(request_id, result, redactor, job, batch, bound=True)
            if refused is not None:
                # Trying again would find the same link: the verdict is written now, and says so.
                error = self._files_refused(request_id, refused, error, result)
            # Files written earlier without fsync (the request copy, when the start's sync did
            # not happen).
            for path in job.unsynced if job is not None else ():
                batch.add(path)
            if batch.files:
                # The folder's entries, and the folder's own entry in runs/ unless the start's
                # sync made it durable already.
                batch.add_directory(run_dir)
                if job is None or not job.run_dir_synced:
                    batch.add_directory(self.home.runs)
            if flush_events and session is not None:
                try:
                    self._events_backend.flush(session)
                except Exception as exc:
                    self.log("audit log sync failed", id=request_id, error=f"{type(exc).__name__}: {exc}")
                # Its run is over: the log's descriptors go now, not once 64 others are open
                # (a thread's next run opens it again).
                with contextlib.suppress(Exception):
                    self._events_backend.close_idle(session)
            wire = None if error is None else errors.to_wire(error, secrets=secrets)
            verdict = {
                "format": _home.VERDICT_FORMAT,
                "id": request_id,
                "run_id": run_id,
                "ok": error is None,
                "result": result_json,
                "error": wire,
                "exit_code": 0 if error is None else errors.exit_code_for(error),
                # None too when the run recorded nothing (refused before its driver started):
                # a path to a file that never comes kept `tail -F` waiting for ever.
                "events": None if session is None or not self._recorded(session, job) else f"events/{session}.jsonl",
                "received_at": received_at,
                "started_at": started_at,
                "finished_at": _now(),
            }
            # (Its result and error are redacted already; the rest is the daemon's own: the
            # request's id names the very file, and its format and paths are not the run's.)
            data = orjson.dumps(verdict, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
            self._set_aside_foreign_verdict(request_id)
            written = _durable.write_once(
                self.home.verdict(request_id), data, linked=lambda: self._verdict_linked(request_id), synced_with=batch
            )
        finally:
            batch.close()
        self._linked_verdicts.discard(request_id)
        if not written:  # (when written, the claimed copy went with the verdict's link)
            self._cleanup_claim(request_id)  # the claimed copy may hold secrets: gone with the verdict
        else:
            self.audit(
                "verdict.written", request_id, ok=error is None,
                code=None if wire is None else wire["code"], exit_code=verdict["exit_code"],
                **({} if run_id is None else {"run_id": run_id}),
            )
        # Once the verdict exists the state no longer matters to recovery: no sync, and a
        # state the disk refuses now stays as it was.
        done = {"id": request_id, "status": "done", "run_id": run_id, "session": session}
        with contextlib.suppress(OSError):
            if job is not None:
                job.state.update(done)
                self._write_state_raw(request_id, job.state)  # (its folder looked at again, as above)
            else:
                self._write_state_raw(request_id, done, merge=True)

    def _recorded(self, session: str, job: Job | None) -> bool:
        """Whether the run recorded anything: its job says (a thread's log holds earlier
        turns, not this one's, for a turn refused before its driver started); without one (a
        run recovered after a crash), whether its log exists."""
        if job is not None:
            return job.recorded
        return os.path.lexists(self.home.events / f"{session}.jsonl")

    def _write_side_files(
        self, request_id: str, result: adaptor.Result | None, redactor: _redact.Redactor,
        job: Job | None, batch: _durable.SyncBatch, *, bound: bool = False,
    ) -> tuple[dict[str, Any] | None, _durable.ForeignFileError | None]:
        """The run's side files, written into ``batch``; the verdict's ``result`` (None: none),
        and what stood in the way of writing them (a link: the result then names no files).

        With ``bound``, values nested deeper than :data:`_FILE_DEPTH` are cut there.
        """
        if result is None:
            return None, None
        run_dir = self.home.run_dir(request_id)
        raw = result.raw()
        value = result.to_json()
        full = redactor.value(_nesting.copy(value, depth=_FILE_DEPTH) if bound else value)
        full["raw"] = {
            "stdout": f"runs/{request_id}/stdout",
            "stderr": f"runs/{request_id}/stderr",
            "terminal": None if raw.terminal is None else f"runs/{request_id}/terminal.json",
        }
        summary = {key: full[key] for key in ("text", "summary", "model", "provider", "usage", "metadata", "structured", "raw")}
        try:
            # Written in place, no rename: only this verdict will point at them, and it is
            # written after they are durable (see _durable.SyncBatch.write).
            # Looked at again also when made at the start: the run's agent may have put a link
            # in its place meanwhile (the files went where it pointed).
            _durable.ensure_dir(run_dir, durable=False, follow_links=False)
            for name, text in (("stdout", raw.stdout), ("stderr", raw.stderr)):
                batch.write(run_dir / name, redactor.text(text).encode())
            if raw.terminal is not None:
                terminal: Any = {"event": raw.terminal.event, "json": raw.terminal.json}
                terminal = redactor.value(_nesting.copy(terminal, depth=_FILE_DEPTH) if bound else terminal)
                batch.write(run_dir / "terminal.json", _durable.json_bytes(terminal))
            batch.write(run_dir / "transcript.json", _durable.json_bytes(full.pop("transcript")))
            batch.write(run_dir / "result.json", _durable.json_bytes({**full, "transcript": f"runs/{request_id}/transcript.json"}))
        except _durable.ForeignFileError as exc:
            return {**summary, "raw": {"stdout": None, "stderr": None, "terminal": None}}, exc
        return summary, None

    def _files_refused(
        self, request_id: str, refused: _durable.ForeignFileError, error: BaseException | None,
        result: adaptor.Result | None,
    ) -> errors.RunError:
        """The outcome of a run whose files met a link the daemon did not make: an
        infrastructure failure (the run's own outcome, if a failure, is its cause)."""
        where = os.path.relpath(refused.filename, self.home.root) if refused.filename else f"runs/{request_id}"
        self.audit("run.files_refused", request_id, path=where, why=refused.strerror)
        return errors.RunError(
            "infrastructure_error",
            f"the run's files were not written: {where} {refused.strerror}, and the daemon "
            "writes a run's files only where it made them",
            details={"path": where},
            result=result,
            cause=error,
        )

    def _verdict_linked(self, request_id: str) -> None:
        self._linked_verdicts.add(request_id)
        self._cleanup_claim(request_id)

    def _set_aside_foreign_verdict(self, request_id: str) -> None:
        """Move whatever is at the verdict's name and is not this daemon's verdict to
        ``quarantine/``: a symbolic link (the verdict is never written through it), or a file
        written there while the request ran (by its own agent, say, which may write anything
        its user may): a request has one verdict, the one its run gave it, which took the
        other's place silently before (``adaptor wait`` had the other, the run's was lost)."""
        path = self.home.verdict(request_id)
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return
        regular = stat.S_ISREG(found.st_mode)
        if regular and request_id in self._linked_verdicts:
            return  # this daemon's own, linked before its folder's sync failed: write_once keeps it
        target = self.home.quarantine / f"{time.time_ns()}-verdict-{request_id}.json"
        _durable.ensure_dir(self.home.quarantine)  # (a cleanup script may have removed it)
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return  # gone meanwhile
        why = {"why": "a verdict this daemon did not write"} if regular else {}
        self.audit("verdict.set_aside", request_id, file=target.name, **why)

    def _prepare_run_dir(self, job: Job) -> None:
        """``runs/<id>/`` with the request's redacted copy (no fsync: synced with the verdict)."""
        run_dir = self.home.run_dir(job.id)
        try:
            # A request's first start finds no run folder (_link_in_the_way has just looked):
            # one mkdir, where ensure_dir would look at the folder and runs/ again first.
            os.mkdir(run_dir, 0o700)
        except OSError:  # there already (an earlier attempt's), or runs/ removed by hand
            _durable.ensure_dir(run_dir, durable=False, follow_links=False)
        whole = self._sparing_descriptors(lambda: self._whole_request(job))
        copy = requests.redacted_request(whole, self._job_secrets(job))
        self._sparing_descriptors(
            lambda: _durable.atomic_write_json(run_dir / "request.json", copy, durable=False)
        )
        job.unsynced.append(run_dir / "request.json")
        job.run_dir_ready = True

    def _prepare_run_dir_or_log(self, job: Job) -> bool:
        """:meth:`_prepare_run_dir` where a verdict follows anyway: a failure is only logged."""
        try:
            self._prepare_run_dir(job)
        except Exception as exc:  # a disk error, or a claimed file no longer readable
            error = _os_error_text(exc) if isinstance(exc, OSError) else type(exc).__name__
            self.log("cannot write the request copy", id=job.id, error=error)
            return False
        return True

    def _save_state(self, job: Job, status: str, **extra: Any) -> None:
        """Write the job's ``state.json`` (no fsync; see :meth:`_sync_state`)."""
        state = job.state
        state.update(
            {
                "id": job.id,
                "status": status,
                "attempt": job.attempt,
                "run_ids": list(job.run_ids),
                "run_id": job.run_ids[-1] if job.run_ids else None,
                "on_interrupt": job.request.get("on_interrupt", "fail"),
                "received_at": job.received_at,
                **self._where_agents_run,
            }
        )
        state.update({k: v for k, v in extra.items() if v is not None})
        if state.get("session"):
            state["events"] = f"events/{state['session']}.jsonl"
        self._write_state_raw(job.id, state, folder_exists=job.run_dir_ready)

    def _sync_state(self, job: Job) -> None:
        """Make the job's state durable (with the folder's entries and its entry in ``runs/``).

        The request copy's content stays unsynced (``job.unsynced``) until the verdict: nothing
        recovers from it, and recovery writes it again for the interrupted verdict.
        """
        try:
            _durable.sync_paths([self.home.run_state(job.id)], (self.home.run_dir(job.id), self.home.runs))
            job.run_dir_synced = True
        except OSError as exc:
            # The run goes on; only a power loss before the verdict would now run it again.
            self.log("cannot sync the run state", id=job.id, error=str(exc))

    def _write_state_raw(
        self, request_id: str, state: Mapping[str, Any], *, merge: bool = False, folder_exists: bool = False
    ) -> None:
        if self._home_lost is not None:
            return
        path = self.home.run_state(request_id)
        if not folder_exists:
            _durable.ensure_dir(path.parent, durable=False, follow_links=False)
        if merge:
            with contextlib.suppress(OSError, ValueError):
                state = {**_durable.read_json(path), **state}
        written = dict(state)
        self._sparing_descriptors(lambda: _durable.atomic_write_json(path, written, durable=False))

    def _sparing_descriptors(self, action: Callable[[], _T]) -> _T:
        """``action()``, tried again while this process is out of file descriptors
        (a low ``ulimit -n``, the workers' writes all at once): after idle audit logs let
        theirs go, then after short pauses in which the other workers' writes end.  A run's
        bookkeeping must not fail it for that.  The last error is raised after about half a
        second."""
        for pause in _DESCRIPTOR_PAUSES:
            try:
                return action()
            except OSError as exc:
                if not _out_of_descriptors(exc):
                    raise
            self._let_idle_logs_go()
            time.sleep(pause)
        return action()

    def _let_idle_logs_go(self) -> None:
        """Out of descriptors: the audit logs no run is writing close theirs."""
        with contextlib.suppress(Exception):
            self._events_backend.close_idle()

    def _cleanup_claim(self, request_id: str) -> None:
        if self._home_lost is not None:
            return  # (a claimed copy of the same id there is another daemon's)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.home.claimed / f"{request_id}.json")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.home.cancels / request_id)

    # -- crash recovery ------------------------------------------------------------------------

    def _expire_stale_approvals(self) -> list[dict[str, Any]]:
        """No run is live at start, so every pending approval left by a crash has expired,
        whatever response was written for it meanwhile: the run that asked is gone.

        Each resolved file keeps the pending file's content, for its run's log (see
        _record_interrupted): a start that fails, or a second crash, before the run's recovery
        must not lose it.  Returns the audit facts, recorded once the audit log is open.
        """
        expired: list[dict[str, Any]] = []
        for entry in sorted(self.home.approvals_pending.glob("*.json")):
            approval_id = entry.name[: -len(".json")]
            try:
                pending = _home.read_pending(self.home, approval_id)
                request_id = pending.get("request_id")
            except (OSError, ValueError):
                request_id, pending = None, {}
            try:
                late = _home.abandon(self.home, approval_id, _EXPIRED_BECAUSE["daemon restart"], keep=pending or None)
            except Exception as exc:
                self.log("cannot expire a stale approval", approval_id=approval_id, error=type(exc).__name__)
                continue
            expired.append({
                "request_id": request_id if _home.is_request_id(request_id) else None,
                "approval_id": approval_id, "why": "daemon restart", **_ignored(late),
            })
        return expired

    def _approvals_kept_for(self, request_id: str) -> list[events.ApprovalRequest]:
        """The approvals of request ``request_id``'s runs that restarts expired, as asked."""
        if self._kept_requests is None:
            try:
                self._kept_requests = _home.kept_requests(self.home)
            except OSError as exc:  # (the log then lacks only what its own notices lack)
                self.log("cannot read the resolved approvals", error=_os_error_text(exc))
                self._kept_requests = {}
        approvals = []
        for pending in self._kept_requests.pop(request_id, []):
            with contextlib.suppress(Exception):  # a file that is not an approval: no notice
                approval = events.from_json({k: v for k, v in pending.items() if k != "request_id"})
                if isinstance(approval, events.ApprovalRequest):
                    approvals.append(approval)
        return approvals

    def _sweep_temp_files(self) -> None:
        """Remove half-written temp files a crash left next to verdicts and approvals."""
        for directory in (self.home.verdicts, self.home.approvals_pending):
            _remove_temp_files(directory)

    def _recover(self) -> None:
        self._sweep_temp_files()
        queued = 0
        for name in _in_arrival_order(self.home.claimed):
            try:
                queued += self._recover_one(name)
            except Exception as exc:  # one request must not keep the daemon from starting
                self.log("could not recover a claimed request", name=repr(name), error=type(exc).__name__)
        if queued:
            # One line, not one per request: a restart after a crash may find thousands
            # (each has its request.queued fact).
            self.log("recovered queued requests", info=True, count=queued)

    def _recover_one(self, name: str) -> bool:
        """The claimed request ``name`` after a restart: queued again (True), or its verdict."""
        request_id = name[: -len(".json")]
        claimed = self.home.claimed / name
        if not name.endswith(".json") or not _home.REQUEST_ID.fullmatch(request_id):
            self._quarantine(claimed, name, None, "unexpected file in the claimed folder")
            return False
        # What a crash left half written in its run folder (a request copy or a state being
        # replaced: request.json.tmp-<hex>, a redacted copy of the request, stayed for good).
        _remove_temp_files(self.home.run_dir(request_id))
        if self.home.has_verdict(request_id):
            self._cleanup_claim(request_id)  # crashed between the verdict and the cleanup
            return False
        # (A state seen through a link at runs/<id> is nobody's: as none.)
        state = self._state_in_own_folder(request_id) or {}
        if state.get("status") == "done":
            # A verdict was written for that run (and its claimed copy removed): this claimed
            # request is a later one of the same id, received before the earlier run's folder
            # could be discarded (see _carried_state).
            self._discard_earlier_run(request_id)
            state = {}
        received_at = state.get("received_at") or _claimed_at(claimed)
        attempt = int(state.get("attempt") or 0)
        outcome = _home.after_restart(state)  # `adaptor wait` tells its user from the same rule
        if outcome == "queued":
            self._accept(request_id, claimed, attempt=attempt, received_at=received_at, prior=state)
            return True
        return self._interrupted(request_id, claimed, state, attempt, received_at, requeue=outcome == "requeue")

    def _interrupted(
        self, request_id: str, claimed: Path, state: Mapping[str, Any], attempt: int, received_at: str, *, requeue: bool
    ) -> bool:
        """Give an interrupted run its verdict, or queue it again (True: counted with the
        requests recovery queued)."""
        entered = _home.run_entered(state)
        try:
            request = orjson.loads(requests.read_limited(claimed, _home.MAX_REQUEST_BYTES))
            secrets = self._secrets_of(request)
        except Exception:
            request, secrets = None, []
        thread_changed = entered and self._thread_changed(request, state)
        # Its verdict was being written when the daemon stopped (deferred by a full disk): the
        # run's own run.finished is in its log already.
        # Or killed between the run's end, in its log, and its verdict: it is not run again,
        # and its log is not given a second, contradicting run.finished.
        logged = self._run_in_log(state) if entered else _LoggedRun()
        # Its state says finished only when its verdict was deferred (the disk refused it).
        deferred = _home.run_finished(state)
        finished = deferred or logged.finished
        # What it started may still work in its workspace, where _stop_leftovers could not see it
        # (an `adaptor wait` cannot know where the next start runs, so only recovery judges this).
        unseen = _leftovers.out_of_sight(state) if entered and not finished else None
        self.audit(
            "request.interrupted", request_id, attempt=attempt, entered=entered,
            **({"thread_changed": True} if thread_changed else {}),
            **({"agents_unseen": True} if unseen else {}),
        )
        if entered and not finished and not logged.ended_by_restart:
            self._record_interrupted(request_id, state, request, logged)
        if requeue and not thread_changed and not finished and unseen is None:
            self._accept(request_id, claimed, attempt=attempt, received_at=received_at, prior=state)
            return True
        run_id = state.get("run_id")
        if entered:
            details: dict[str, Any] = {"interrupted": True, "attempts": attempt}
            message = _INTERRUPTED
            if finished:
                details["finished"] = True
                message = _VERDICT_REFUSED if deferred else _VERDICT_CUT_OFF
            if unseen is not None:
                details["agents_unseen"] = True
                message += f"; {unseen}: what it started may still be running, so it was not run again"
            if thread_changed:
                # Most likely this turn, saved just before the crash: running it again would
                # send its prompt into the conversation twice.
                details["thread_changed"] = True
                message += "; its thread was saved after the run started, so it was not run again"
            elif _home.thread_turn_kept_back(state):
                # Its agent may have the prompt in its own session already (see after_restart).
                details["thread_turn"] = True
                message += "; a thread's turn whose agent may have had the prompt is not run again"
            error: BaseException = errors.RunError(
                "infrastructure_error",
                message,
                details=details,
                result=self._result_so_far(state),
            )
        else:
            error = errors.AdaptorError("the daemon stopped before the agent started")
        job: Job | None = None
        if isinstance(request, dict):
            with contextlib.suppress(Exception):  # the copy names its workspace, as the start's did
                self._default_workspace(request, self.config.driver_defaults(str(request["driver"])))
            # The request copy is written again: the start did not sync it (a power loss may
            # have lost it); the verdict syncs it with the run folder.
            job = Job(id=request_id, request=request, received_at=received_at, attempt=attempt, state=dict(state))
            job.recorded = entered  # (and its log was given the run.finished it lacked)
            if not self._prepare_run_dir_or_log(job):
                job = None
        result = error.result if isinstance(error, errors.RunError) else None
        self._write_verdict(
            request_id, run_id=run_id, result=result, error=error, received_at=received_at,
            started_at=state.get("started_at"), session=state.get("session"), secrets=secrets, job=job,
        )
        return False

    def _result_so_far(self, state: Mapping[str, Any]) -> adaptor.Result:
        """The interrupted run's Result as far as its audit log has it: the text of its last
        assistant message (a Result's ``text`` is the final message only), its raw output and
        its transcript (``runs/<id>/stdout`` and ``transcript.json`` were empty while the log
        held what the agent printed and said).  Empty
        when the log has none or cannot be read (the verdict does not wait on a damaged log)."""
        run_id, session = state.get("run_id"), state.get("session")
        if not isinstance(run_id, str) or not isinstance(session, str) or not session:
            return adaptor.Result(run_id=run_id if isinstance(run_id, str) else "")
        message: str | None = None
        pieces: list[str] = []
        raw: dict[str, list[str]] = {"stdout": [], "stderr": []}
        transcript: list[Any] = []
        try:
            for record in self._events.iter_since(session):
                event = record.event
                if event.meta.run_id != run_id:
                    continue
                if isinstance(event, events.TextDelta) and event.phase == "content":
                    if event.message_id != message:
                        message, pieces = event.message_id, []
                    pieces.append(event.text)
                elif isinstance(event, events.ProcessInfo) and event.kind in raw:
                    raw[event.kind].append(event.text)
                elif isinstance(event, events.Notice) and event.kind == "transcript.item":
                    transcript.append(event.data)
            return adaptor.Result.from_json({
                "run_id": run_id,
                "text": "".join(pieces),
                "raw": {stream: "".join(chunks) for stream, chunks in raw.items()},
                "transcript": transcript,
            })
        except Exception:  # corrupt, unreadable: the text is a courtesy, the verdict is not
            return adaptor.Result(run_id=run_id)

    def _run_in_log(self, state: Mapping[str, Any]) -> _LoggedRun:
        """What the run's audit log holds of it (nothing when unreadable)."""
        run_id, session = state.get("run_id"), state.get("session")
        logged = _LoggedRun()
        if not isinstance(run_id, str) or not isinstance(session, str) or not session:
            return logged
        with contextlib.suppress(Exception):  # unreadable: numbered from 1, the log still ends
            for record in self._events.iter_since(session):
                event = record.event
                if event.meta.run_id != run_id:
                    continue
                logged.last_sequence = max(logged.last_sequence, event.meta.sequence)
                if isinstance(event, events.RunFinished):
                    if event.failed and event.reason == "infrastructure_error" and event.message == _INTERRUPTED:
                        logged.ended_by_restart = True
                    else:
                        logged.finished = True
                elif (
                    isinstance(event, events.Notice)
                    and event.kind in ("approval.requested", "approval.resolved")
                    and isinstance(event.data, Mapping)  # (a notice written by hand: skipped)
                ):
                    key = _approval_key(event.data.get("request_id"))
                    if event.kind == "approval.requested":
                        logged.asked.setdefault(key, event)
                    else:
                        logged.resolved.add(key)
        return logged

    def _record_interrupted(
        self, request_id: str, state: Mapping[str, Any], request: Any, logged: _LoggedRun
    ) -> None:
        """End the interrupted run's events as every other run's end: each approval it was
        waiting on resolved ``aborted``, then its ``run.finished``, so a reader of the audit
        log (``tail -F | jq``, a follower) sees how it ended.

        The waiting approvals are those its log shows asked and not resolved, and those a
        pending file showed (the run's thread writes that, the worker the log's notice: a crash
        in between leaves either without the other; a restart keeps the file's content when
        it expires it); one the log lacks is logged asked first.  One the run was given an
        answer to (resolved/ says so) before its log got the notice is logged with that
        answer, not as aborted.
        """
        run_id, session = state.get("run_id"), state.get("session")
        kept = self._approvals_kept_for(request_id)
        if not isinstance(run_id, str) or not isinstance(session, str) or not session:
            return
        # Only this run's: a requeued request's earlier attempt ended its own approvals (the
        # restart that requeued it logged them), and resolved/ keeps those too.
        pending = {_approval_key(a.id): a for a in kept if a.meta.run_id in (run_id, "")}
        key = _thread_key(request) if isinstance(request, Mapping) else None
        now = datetime.now(UTC)
        meta = events.EventMeta(run_id=run_id, thread_key=key or "", time=now)
        aborted = Outcome("aborted", text=_INTERRUPTED, resolved_at=now)
        ended: list[events.Event] = []
        for approval_key, requested in logged.asked.items():
            if approval_key not in logged.resolved:
                outcome = self._answer_taken(requested.data.get("request_id")) or aborted
                ended.append(replace(resolution_of(requested, outcome), meta=meta))
        for approval_key, approval in pending.items():
            if approval_key in logged.asked or approval_key in logged.resolved:
                continue
            try:
                # Dated as the run dated it; "ask": the daemon's runs route only those here.
                asked_at = approval.created_at if approval.created_at.tzinfo is not None else now
                asked = replace(requested_notice(approval, "ask"), meta=replace(meta, time=asked_at))
                ended += [asked, replace(resolved_notice(approval, aborted), meta=meta)]
            except Exception as exc:  # a pending file changed by hand: the run still ends
                self.log("approval not logged", id=state.get("id"), approval_id=approval.id, error=type(exc).__name__)
        finished = events.RunFinished(
            run_id=run_id, failed=True, reason="infrastructure_error", message=_INTERRUPTED, meta=meta
        )
        # Numbered on from the run's last event: recorded with sequence 0, they sorted first.
        try:
            for number, event in enumerate([*ended, finished], start=logged.last_sequence + 1):
                self._events.record(session, replace(event, meta=replace(event.meta, sequence=number)))
        except Exception as exc:  # the verdict still says it; the log only misses its end
            self.log("event not recorded", id=state.get("id"), error=f"{type(exc).__name__}: {exc}")
        if self._events_backend.repair_count != self._repairs_told:
            self._tell_repairs()

    def _answer_taken(self, approval_id: object) -> Outcome | None:
        """The outcome of the answer the run was given to approval ``approval_id``, as the
        resolved file keeps it; ``None`` when it was given none (or the file does not say)."""
        if not isinstance(approval_id, str) or not _home.APPROVAL_ID.fullmatch(approval_id):
            return None
        resolved = _home.read_resolved(self.home, approval_id)
        if resolved is None:
            return None
        result, kept = _home.RESOLVED_AS.get(resolved.get("result")), resolved.get("outcome")
        if result is None or not isinstance(kept, Mapping):
            return None  # expired, or resolved before the outcome was kept: aborted
        try:
            resolved_at: datetime | None = events.parse_time(kept["resolved_at"])
        except (KeyError, TypeError, ValueError, AttributeError):  # (a file changed by hand)
            resolved_at = None
        if resolved_at is not None and resolved_at.tzinfo is None:
            resolved_at = None
        return Outcome(result, choice=str(kept.get("choice") or ""), text=str(kept.get("text") or ""),
                       resolved_at=resolved_at)

    def _thread_mark(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The thread's active record as the run starts (``{"id": None}``: none yet), for
        :meth:`_thread_changed`; ``None`` for a request without a thread or a store that
        cannot be read now."""
        key = _thread_key(request)
        if key is None:
            return None
        try:
            record = self._store.resolve(Query(key=key))
        except StoreCorruptLogError as exc:
            # The store says it once and then reads its files as they stand: the run goes on
            # with them (mended by hand, or still damaged and failing), so say it here.
            self.log("thread store damaged or changed by hand; reading it afresh", error=exc)
            return None
        except Exception:  # the run itself will report the store's problem
            return None
        return _record_mark(record)

    def _thread_changed(self, request: Any, state: Mapping[str, Any]) -> bool:
        """Whether the interrupted run's thread was saved after it started (by the run itself,
        unless another process wrote the key while the daemon was down)."""
        before = state.get("thread_before")
        now = self._thread_mark(request) if isinstance(request, Mapping) else None
        # Not a thread run, or nothing known then or now: as before.
        return isinstance(before, Mapping) and now is not None and now != dict(before)

    # -- shutdown ------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Stop claiming; let running work finish within the grace period, then cancel it."""
        with self._lock:
            queued = list(self._queued.values())  # arrival order
            self._queued.clear()
            self._ready.clear()
            self._lines.clear()
        stamp = time.time_ns()
        if self._home_gone():
            for job in queued:  # their claimed copies went with the home
                self.log("request not requeued", id=job.id, why=self._home_lost)
            queued = []
        for order, job in enumerate(queued):  # not started: back to the spool for the next daemon
            with contextlib.suppress(OSError):
                requeued = self.home.spool_new / f"{job.id}.json"
                os.rename(self.home.claimed / f"{job.id}.json", requeued)
                # Renamed within one clock tick, they would share a ctime: their mtimes keep
                # the order they arrived in (see _in_arrival_order).
                os.utime(requeued, ns=(stamp, stamp + order), follow_symlinks=False)
                if job.state:  # a recovered attempt's state; a fresh request has none
                    job.state["status"] = "requeued"
                    self._write_state_raw(job.id, job.state)
                self.audit("request.requeued", job.id, why="adaptord stopped before it started; the next start runs it")
        self.log("draining", info=True, running=len(self._running), grace=self.grace)
        # The handler takes no lock (see _on_signal), so it cannot wake this wait: the wait
        # looks for a second signal between short slices.
        grace_ends = time.monotonic() + self.grace
        with self._idle:
            while self._running and self._stop_signals < 2:
                left = grace_ends - time.monotonic()
                if left <= 0 or self._home_gone():  # (no verdict can be written any more)
                    break
                # A long --grace is the runs' time, not a hang of the daemon.
                self._watchdog.ping()
                self._idle.wait(self._watchdog.bound(min(left, _DRAIN_SLICE)))
            running = list(self._running.values())
        if running and self._stop_signals >= 2:
            self.log("signalled again; cancelling running work now", running=len(running))
        for job in running:
            job.cancel_requested = True
            job.stopped_by_drain = True
            if job.stream is not None:
                self._cancel_run(job, job.stream)
        # From here the drain is bounded by _STOP_TAIL whatever the requests ask for, so that
        # a unit's TimeoutStopSec above grace + _STOP_TAIL never has to SIGKILL the daemon
        # before its verdicts are written.
        tail_ends = time.monotonic() + _STOP_TAIL
        with self._idle:
            stopped = self._idle.wait_for(lambda: not self._running, timeout=_CANCEL_WAIT)
        if not stopped:
            # A run whose agent ignores SIGTERM and whose grace_period outlasts the drain: its
            # processes are killed now, so its verdict is still this daemon's to write and no
            # agent goes on in the workspace after the daemon is gone.
            owner = _leftovers.owner_mark(self.home.root)
            found = _leftovers.find(owner)
            self.log("drain: runs did not stop when cancelled; killing their processes",
                     running=len(self._running), processes=len(found))
            _leftovers.stop(owner, found, 0.0)
            with self._idle:
                self._idle.wait_for(lambda: not self._running, timeout=max(tail_ends - time.monotonic() - _KEPT_SHARE, 0.0))
        # CLI processes kept for the next turn of a thread stop with the daemon.
        self._kept.close(max(tail_ends - time.monotonic(), _KEPT_SHARE))


def _hand_over(
    req: adaptor.ApprovalRequest, redactor: _redact.Redactor, response: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Give ``req`` a response read from its file: the outcome as the run's log shows it, for
    the resolved file, or ``None`` when the run no longer takes it."""
    action = response.get("action")
    text = str(response.get("text") or "")
    try:
        if action == "approve":
            req.approve()
        elif action == "answer":
            req.answer(text)
        else:
            req.deny(text)
    except errors.ApprovalResolvedError:  # (and ApprovalExpiredError) the run settled it first
        return None
    outcome = req._live().outcome
    assert outcome is not None  # (settled by this very response)
    return {
        "choice": outcome.choice,
        "text": redactor.text(outcome.text),
        "resolved_at": events.format_time(outcome.resolved_at or datetime.now(UTC)),
    }



def _ignored(late: Mapping[str, Any] | None) -> dict[str, str]:
    """The audit field naming a response the run never took, so the log says it was not acted on."""
    return {} if late is None else {"ignored_response": str(late.get("action"))}


# What a response to an expired approval is told, by the audit log's ``why``.
_EXPIRED_BECAUSE = {
    "deadline": "its deadline passed",
    "run ended": "the run that asked has ended",
    "daemon restart": "adaptord stopped while the run that asked was going, which ended it",
}


def _why_settled(req: adaptor.ApprovalRequest) -> str:
    """Why a request settled without a response: its deadline, else the end of its run."""
    if req.deadline is not None and datetime.now(UTC) >= req.deadline:
        return "deadline"
    return "run ended"


# Linux's PATH_MAX, and the longest path the home's files add to its own (a quarantined
# approval response: "quarantine/approval-response-" + a 201-character id + a stamp + ".json",
# then a temporary suffix while it is written), with room to spare.
_PATH_MAX = 4096
_LONGEST_HOME = _PATH_MAX - 400

_ROUTES_END_WITHIN = 5.0


def _remove_temp_files(folder: Path) -> None:
    """Remove the temporary files (``*.tmp-<hex>``, hidden or not) a crash left half written in
    ``folder``; a link at ``folder`` is never followed (a run folder may be one a user put)."""
    try:
        opened = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(opened):
            if ".tmp-" in name:
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(name, dir_fd=opened)
    except OSError:
        pass
    finally:
        os.close(opened)

_INTERRUPTED = "the daemon stopped while the run was in progress"
_VERDICT_REFUSED = (
    "the run finished, but the daemon stopped before its verdict could be written (the disk "
    "or the system refused it: full, read-only, out of descriptors); only the text its audit "
    "log holds is kept"
)
_VERDICT_CUT_OFF = (
    "the run finished, but the daemon stopped (it was killed, or crashed) before it wrote the "
    "run's verdict; only the text its audit log holds is kept"
)


def _record_mark(record: Record | None) -> dict[str, Any]:
    """What tells one saved state of a thread from another (``{"id": None}``: none)."""
    if record is None:
        return {"id": None}
    return {"id": record.id, "updated_at": record.updated_at.isoformat()}


def _thread_key(request: Mapping[str, Any]) -> str | None:
    thread = request.get("thread")
    key = thread.get("key") if isinstance(thread, Mapping) else None
    return key if isinstance(key, str) and key else None


def _in_arrival_order(folder: Path) -> list[str]:
    """The names in ``folder``, oldest link first (a thread's requests run in arrival order).

    A link or rename into the folder sets the file's ctime, so ctime orders arrivals.
    Requests put back by a drain may share one clock tick: _drain gives them mtimes that
    increase in their arrival order.  Names break the remaining ties.
    """
    entries = []
    with os.scandir(folder) as listing:
        for entry in listing:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:  # gone meanwhile
                continue
            entries.append((info.st_ctime_ns, info.st_mtime_ns, entry.name))
    return [name for *_, name in sorted(entries)]


_WRITE_GRACE = 2.0
"""Seconds since its last change a request file that does not parse may still be being written."""
_REREAD_INTERVAL = 0.1


def _written_lately(path: Path) -> bool:
    try:
        changed = os.lstat(path).st_mtime
    except OSError:
        return False
    return abs(time.time() - changed) < _WRITE_GRACE


_DESCRIPTOR_PAUSES = (0.01, 0.05, 0.1, 0.3)
"""Seconds between the tries of an action that found this process out of file descriptors."""


def _out_of_descriptors(exc: OSError) -> bool:
    return exc.errno in (errno.EMFILE, errno.ENFILE)


def _same_file(found: os.stat_result, path: Path) -> bool:
    try:
        return os.path.samestat(found, os.lstat(path))
    except OSError:
        return False


_PROMPT_KEPT_WHILE_QUEUED = 16 * 1024
"""Characters of a queued request's prompt the daemon keeps in memory (longer: left on disk)."""


_LINK_PROBE: Final = ".adaptord-link-probe"


def _links_refused(home: _home.Home) -> str | None:
    """Why files cannot be hard-linked along a request's way (``spool/tmp`` to ``spool/new``, as
    a client submits, then to ``claimed/``, as the daemon claims), or ``None`` when they can."""
    # One name, under the home's lock: what a start killed mid-probe left goes now, before the
    # recovery would take it in claimed/ for a request's file.
    way = [folder / _LINK_PROBE for folder in (home.spool_tmp, home.spool_new, home.claimed)]
    for path in way:
        with contextlib.suppress(OSError):
            os.unlink(path)
    try:
        os.close(os.open(way[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError:
        return None  # (what cannot be written says so where it is written)
    try:
        for source, target in itertools.pairwise(way):
            try:
                os.link(source, target, follow_symlinks=False)
            except OSError as exc:
                return _home.unlinkable(home, exc, source, target)
        return None
    finally:
        for path in way:
            with contextlib.suppress(OSError):
                os.unlink(path)


# A request's schema may nest 64 levels (see adaptor._nesting), checked in a worker thread by
# recursion through C code: with `ulimit -s 128` every thread got that 128 KiB stack (glibc's
# default is the limit), and a schema 60 levels deep overflowed it (SIGSEGV, the daemon gone).
_THREAD_STACK: Final = 1 << 20


def _thread_stacks_of_at_least(size: int) -> None:
    """Give the threads started from now on a stack of ``size`` bytes when the stack limit
    (which they get otherwise) is smaller; address space only, until used."""
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if soft != resource.RLIM_INFINITY and soft < size:
        threading.stack_size(size)


def _verdict_too_large(error: BaseException | None, exc: OSError) -> errors.RunError:
    """The error a run's verdict carries when its files were too large to write (see
    _write_verdict_that_fits); the run's own error, if any, is its cause."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    allowed = (
        "the file system allows" if limit == resource.RLIM_INFINITY
        else f"this daemon may write (its file-size limit, ulimit -f, is {limit} bytes)"
    )
    ended = "ok" if error is None else f"with {type(error).__name__}"
    return errors.RunError(
        "infrastructure_error",
        f"the run ended {ended}, but its verdict's files are larger than {allowed}: {_os_error_text(exc)}",
        details={"too_large": True, "run_ok": error is None},
        cause=error,
    )


def _name_cut(name: str, most: int) -> str:
    """``name``'s first characters that take at most ``most`` bytes on disk: a file name's
    limit counts bytes (255), and a character may take four (cut at 150 characters, a name of
    CJK characters was too long to quarantine, and was tried again at every scan)."""
    taken = 0
    for index, char in enumerate(name):
        taken += len(os.fsencode(char))
        if taken > most:
            return name[:index]
    return name


# What the home's filesystem lacks when an operation on it is not implemented there (FAT
# through FUSE has no chmod), not something the user can mend in place.
_NOT_IMPLEMENTED: Final = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def _home_error_text(exc: OSError, home: _home.Home, doing: str) -> str:
    """Why the home cannot be used: what the start was ``doing``, the file (relative to the
    home) and the reason, with where to go when its filesystem cannot do it at all."""
    text = f"{doing}: {_os_error_text(exc)}"
    if exc.filename is not None and (path := Path(os.fsdecode(exc.filename))) != home.root:
        text += f" ({path.relative_to(home.root) if path.is_relative_to(home.root) else path})"
    if exc.errno in _NOT_IMPLEMENTED:
        text += ": its filesystem lacks what a home needs; put the home on ext4, xfs, btrfs or tmpfs"
    return text


def _os_error_text(exc: OSError) -> str:
    """``exc``'s reason without the file names (a request's ids and paths stay out of it)."""
    return exc.strerror or type(exc).__name__


def _claimed_at(claimed: Path) -> str:
    """When a request without a state file was claimed: its claimed link's ctime."""
    try:
        return events.format_time(datetime.fromtimestamp(os.lstat(claimed).st_ctime, UTC))
    except OSError:
        return _now()


class _Watchdog:
    """systemd's watchdog (``WatchdogSec=``): ``WATCHDOG=1`` as the main loop turns.

    Only the main thread pings, between pieces of its own work: pings from a thread of their
    own would go on while the loop is stuck (a deadlock, a hung filesystem call), and a daemon
    that claims nothing would never be restarted.
    """

    def __init__(self, interval: float | None) -> None:
        self.interval = interval
        """Seconds between two pings, or ``None`` when no watchdog is asked for."""
        self._due = 0.0  # monotonic

    @classmethod
    def from_environment(cls) -> _Watchdog:
        """sd_watchdog_enabled(3) without libsystemd: ``$WATCHDOG_USEC``, for this process
        only if ``$WATCHDOG_PID`` is unset or its pid; an invalid value means no watchdog."""
        pid = os.environ.get("WATCHDOG_PID")
        if pid is not None and _unsigned(pid) != os.getpid():
            return cls(None)
        usec = _unsigned(os.environ.get("WATCHDOG_USEC", ""))
        if usec is None or usec == 0 or usec >= 2**64 - 1:  # 0 and USEC_INFINITY: none
            return cls(None)
        # A quarter: pings then come at most half of WATCHDOG_USEC apart (sd_watchdog_enabled's
        # advice) even when the loop's turn after a wait takes another quarter.
        return cls(usec / 1e6 / 4)

    def ping(self) -> None:
        """Tell systemd the loop is alive, unless it did less than ``interval`` ago."""
        if self.interval is None:
            return
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.interval
            # Never waited for: a ping the socket's full queue drops matters less than a main
            # loop held by a busy manager, and the next one comes an interval later.
            _notify("WATCHDOG=1", wait=False)

    def bound(self, timeout: float) -> float:
        """``timeout`` cut short to when the next ping is due: the wait of a loop that pings."""
        if self.interval is None:
            return timeout
        return min(timeout, max(self._due - time.monotonic(), 0.0))


def _unsigned(text: str) -> int | None:
    """``text`` as a decimal integer of ASCII digits only, or ``None``."""
    return int(text) if text.isascii() and text.isdigit() else None


def _notify(message: str, *, wait: bool = True) -> None:
    """sd_notify(3) without libsystemd: one datagram to ``$NOTIFY_SOCKET``; ``wait=False``
    drops it rather than wait for room in the socket's queue."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.send(message.encode(), 0 if wait else socket.MSG_DONTWAIT)
    except OSError:
        pass


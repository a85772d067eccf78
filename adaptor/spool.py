"""The client of the adaptord spool daemon.

Everything goes through the home directory's public file layout (docs/daemon.md), so
a client needs no connection to the daemon and works across restarts::

    from adaptor.spool import Client

    client = Client()                          # $ADAPTORD_HOME, else $XDG_STATE_HOME/adaptord
    request_id = client.submit({"driver": "script", "prompt": "hi",
                                "config": {"steps": [{"text": "hello"}]}})
    for event in client.events(request_id, follow=True):
        print(event)
    result = client.wait(request_id, timeout=600)   # or raises what the run raised

``wait`` raises exactly the exception the same request raises in-process (rebuilt from the
verdict with :func:`adaptor.errors.from_wire`, ``RunError.result`` included), so one
``except`` clause serves both paths.  Two conditions are the client's own and stay outside the
error taxonomy: :class:`WaitTimeoutError` (the caller's deadline passed) and
:class:`UnknownRequestError` (no such request in this home); :class:`SpoolNotFoundError` means
the home has no spool at all, :class:`ForeignHomeError` (a ``PermissionError``) that it is another
user's, which this one may not use, :class:`UnservableHomeError` (an ``OSError``) that it is
where no daemon can serve it, and :class:`DaemonNotRunningError` (raised by the ``adaptor``
CLI) that no daemon serves it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Concatenate, NoReturn, ParamSpec, TypeVar

import orjson

from adaptor import _durable, _home, _waiting, errors
from adaptor._one_line import one_line
from adaptor.errors import AdaptorError
from adaptor.events import Event
from adaptor.result import Result

if TYPE_CHECKING:
    from hosttools.sessionrecorder import EventRecord

__all__ = [
    "Client",
    "DaemonNotRunningError",
    "ForeignHomeError",
    "InvalidRequestError",
    "SpoolNotFoundError",
    "UnknownRequestError",
    "UnservableHomeError",
    "WaitTimeoutError",
]

# How often waiting re-checks the files when no file event woke it.  The watcher is only a
# hint (it misses events on overflow, on network filesystems, or when inotify is exhausted).
_P = ParamSpec("_P")
_R = TypeVar("_R")

_VERDICT_POLL = 0.5
_EVENTS_POLL = 0.25
_RECENT_VERDICTS = 10
# How long a quarantined entry carrying an id keeps the id known: the daemon writes the entry's
# rejection verdict right after moving it aside, so a waiter may find the entry first.  Older,
# the entry is no request's in flight: a duplicate quarantined beside a request that had its
# verdict (id_in_use) never gets one, and kept the id known once that verdict was removed (by
# hand or by retention), so `adaptor wait` waited for ever.
_QUARANTINE_IN_FLIGHT = 60.0


class InvalidRequestError(AdaptorError):
    """A spool request file failed the request schema or could not be read; nothing ran.

    ``errors`` lists ``{"path": ..., "message": ...}`` entries, one per schema violation.
    """

    code = "ErrInvalidRequest"
    exit_code = 2
    default_message = "invalid request"
    _fields = {"errors": (list,)}

    def __init__(self, errors: Sequence[Mapping[str, str]], message: str = "") -> None:
        self.errors = [{"path": str(e["path"]), "message": str(e["message"])} for e in errors]
        if not message:
            first = self.errors[0] if self.errors else None
            message = "invalid request" + (
                f": {first['path'] or '<root>'}: {first['message']}" if first else ""
            )
            if len(self.errors) > 1:
                message += f" (and {len(self.errors) - 1} more)"
        super().__init__(message)


class WaitTimeoutError(TimeoutError):
    """:meth:`Client.wait` gave up: no verdict within ``timeout`` seconds.

    The request may still be queued or running; wait again or cancel it.  Not an
    ``AdaptorError``: it reports the caller's own deadline, never an outcome of the request
    (``adaptor wait --timeout`` exits 124 on it, like ``timeout(1)``).
    """

    def __init__(self, request_id: str, timeout: float) -> None:
        self.request_id = request_id
        self.timeout = timeout
        super().__init__(
            f"no verdict for request {request_id!r} after {timeout:g}s (it may still be running)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own would call the class with the message, which it does not take
        # (docs/errors.md: every error pickles; a process pool passes them back that way).
        return type(self), (self.request_id, self.timeout)


def _home_shown(home: Path) -> tuple[str, str]:
    """``home`` as a message shows it, and as a shell argument: JSON-quoted (both) when it
    holds a newline, a terminal escape or another unprintable character, so the message stays
    one line that cannot drive a terminal."""
    text = str(home)
    shown = one_line(text)
    return shown, shlex.quote(text) if shown is text else shown


class SpoolNotFoundError(FileNotFoundError):
    """The home has no spool: the path is wrong or no daemon was ever started on it.

    ``home`` is the directory looked at.  The ``adaptor`` CLI exits 69 on it.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        shown, argument = _home_shown(home)
        if os.path.lexists(home) and not home.is_dir():  # no daemon could start there either
            hint = f"{shown} is not a directory: name the home a daemon serves with ADAPTORD_HOME or --home"
        else:
            hint = (f"start the daemon with `adaptord serve --home {argument}`, or name the home a "
                    "daemon serves with ADAPTORD_HOME or --home")
        super().__init__(errno.ENOENT, f"no adaptord spool under {shown} ({hint})", str(home))

    def __reduce__(self) -> tuple[Any, ...]:
        # (As WaitTimeoutError's: by the constructor's arguments.)
        return type(self), (self.home,)

    def __str__(self) -> str:
        # OSError's own form, "[Errno 2] <message>: '<home>'", says the home twice.
        return str(self.strerror)


class DaemonNotRunningError(Exception):
    """No daemon serves ``home``, and the ``adaptor`` command needs one: to run a request, or to
    wait for a verdict nobody else would write.

    Not an ``AdaptorError``: the situation of the home, never an outcome of a request.  The
    ``adaptor`` CLI exits 69 on it (``status`` too, with its report).
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        shown, argument = _home_shown(home)
        super().__init__(
            f"adaptord is not running for {shown} (start it with `adaptord serve --home {argument}`"
            " or `systemctl --user start adaptord`; `adaptor run --no-daemon` runs in-process)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # (As WaitTimeoutError's: by the constructor's arguments.)
        return type(self), (self.home,)


class UnknownRequestError(LookupError):
    """No request with id ``request_id`` was submitted to this home (or the id is malformed).

    The ``adaptor`` CLI exits 2 on it (bad arguments).
    """

    def __init__(self, request_id: str, home: Path) -> None:
        self.request_id = request_id
        self.home = home
        super().__init__(f"no request {request_id!r} under {home}")

    def __reduce__(self) -> tuple[Any, ...]:
        # (As WaitTimeoutError's: by the constructor's arguments.)
        return type(self), (self.request_id, self.home)


ForeignHomeError = _home.ForeignHomeError
UnservableHomeError = _home.UnservableHomeError


def _refused_as_foreign(method: Callable[Concatenate[Client, _P], _R]) -> Callable[Concatenate[Client, _P], _R]:
    """A refused access inside another user's home raised as :class:`ForeignHomeError`,
    which says whose home it is, instead of a bare ``PermissionError`` on one of its files."""

    @functools.wraps(method)
    def checked(self: Client, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._foreign_home_named():
            return method(self, *args, **kwargs)

    return checked


class Client:
    """Talks to the adaptord daemon serving ``home`` through its files.

    ``home`` defaults to ``$ADAPTORD_HOME``, else ``$XDG_STATE_HOME/adaptord``.  A client is
    cheap, holds no resources between calls and may be shared by threads.
    """

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        if home is not None and os.fspath(home) == "":
            # (As the CLI's --home '' is: never the current directory by accident.)
            raise ValueError("home is empty; name a directory (an empty path would be the current one)")
        self._home = _home.Home.at(home)
        unservable = _home.unservable_path(self._home.root)
        if unservable is not None:
            # (Every command said "TypeError: str is not valid UTF-8", exit 70.)
            raise unservable

    def __repr__(self) -> str:
        return f"Client({str(self._home.root)!r})"

    @property
    def home(self) -> Path:
        """The home directory this client uses."""
        return self._home.root

    # -- requests ------------------------------------------------------------------------------

    @_refused_as_foreign
    def submit(self, request: Mapping[str, Any]) -> str:
        """Drop ``request`` (the request JSON object) into the spool and return its id.

        A time-sortable id is minted when the request has none.  The daemon validates it: a
        request it rejects gets a verdict raising :class:`InvalidRequestError` from
        :meth:`wait`.  Raises :class:`SpoolNotFoundError` when the home has no spool,
        :class:`UnservableHomeError` when it is where no daemon can serve it (its filesystem
        has no hard links),
        ``ValueError`` for a malformed ``id``, a NaN or infinity anywhere in the request (JSON
        has none; it would be written as ``null``), an integer outside -2**63 .. 2**64-1 (not
        kept exactly), text that is not UTF-8 (a lone surrogate) or a request over 1 MiB (the daemon sets such
        a file aside unread), ``TypeError`` when ``request`` is no mapping
        or holds what is not JSON, and ``FileExistsError`` when the id is taken.  Interrupted
        (a Ctrl-C, a SIGTERM handler's exit) once its file may be queued, it takes the request
        back, cancelling it if the daemon claimed it already: whatever ``submit`` raises, no
        request of it runs on unasked.
        """
        self._require_spool()
        try:
            return _home.submit(self._home, request)
        except FileNotFoundError:
            if not self._home.spool_new.is_dir():  # removed under us
                raise SpoolNotFoundError(self._home.root) from None
            raise

    @_refused_as_foreign
    def verdict(self, request_id: str) -> dict[str, Any] | None:
        """The request's verdict file as JSON, or ``None`` while it has none.

        ``ValueError`` (naming the file) for one that is not valid JSON or of another
        ``format``: another version's verdict, read as this version's, could mean something
        else.
        """
        self._check_id(request_id)
        path = self._home.verdict(request_id)
        try:
            verdict = _read_object(path)
        except FileNotFoundError:
            self._require_spool()  # a home with no spool is no "no verdict yet"
            return None
        except NotADirectoryError:
            self._require_spool()  # (a file where the home should be)
            raise
        except _durable.ForeignFileError:
            # A symbolic link or a FIFO is no verdict (and a FIFO's open would wait forever):
            # the daemon replaces it with one.
            return None
        written_as = verdict.get("format")
        if written_as != _home.VERDICT_FORMAT:
            shown = repr(written_as)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            said = "has no format" if written_as is None else f"is of format {shown}"
            raise ValueError(
                f"{path} {said}, not {_home.VERDICT_FORMAT!r}: a verdict of another version of adaptord?"
            )
        damage = _damaged_verdict(verdict)
        if damage is not None:
            # (Read on, wait failed deep inside with an AttributeError, and --json said ok.)
            raise ValueError(f"{path} is damaged: {damage}; the daemon never writes such a verdict")
        return verdict

    @_refused_as_foreign
    def wait(self, request_id: str, timeout: float | None = None) -> Result:
        """Wait for the request's verdict; return its :class:`Result` or raise its error.

        The error is the in-process one, rebuilt with :func:`adaptor.errors.from_wire`; a
        ``RunError``'s ``result`` is the rebuilt Result, whose ``raw()`` and ``transcript()``
        are read back from ``runs/<id>/``.  ``timeout`` (seconds, ``None``: no limit) bounds
        this wait only, not the run: :class:`WaitTimeoutError` when it passes first.  Raises
        :class:`UnknownRequestError` for an id never submitted here, and while waiting
        :class:`SpoolNotFoundError` or :class:`UnknownRequestError` when the home, or the
        queued request's file, is removed: nothing could write the verdict any more.
        """
        return self._outcome(self._await_verdict(request_id, timeout))

    @_refused_as_foreign
    def run(self, request: Mapping[str, Any], timeout: float | None = None) -> Result:
        """:meth:`submit` then :meth:`wait` (``timeout`` bounds the wait, as there).

        Interrupted while it waits (Ctrl-C, a SIGTERM handler's ``sys.exit``, anything raised
        in this thread), it cancels the request before the exception goes on, as ``Agent.run``
        and ``adaptor run`` do: the caller never learnt its id.  :class:`WaitTimeoutError`
        names the request, which goes on.
        """
        request_id: str | None = None
        try:
            # Inside the try: an interrupt just after submit returned must cancel too (one
            # within it finds the request taken back by submit itself).
            request_id = self.submit(request)
            return self.wait(request_id, timeout)
        except WaitTimeoutError:
            raise
        except BaseException:
            # A verdict's own error finds nothing to cancel (cancel() returns False).
            if request_id is not None:
                with contextlib.suppress(Exception):  # (gone with its home, say): it goes on
                    self.cancel(request_id)
            raise

    def events(self, request_id: str, follow: bool = False) -> Iterator[Event]:
        """The events of the request's run(s), in order, read from its audit log.

        Without ``follow``: what is recorded now.  With it, like ``tail -F``: keeps reading
        (the log may not exist yet while the request is queued) until the verdict exists and
        the log is drained, or raises as :meth:`wait` does when the home or the request is
        removed meanwhile.  Approval requests read back cannot be answered through the event;
        use :meth:`approve` and friends.
        """
        with self._foreign_home_named():
            for record in _request_records(self, request_id, follow=follow):
                yield record.event

    @_refused_as_foreign
    def cancel(self, request_id: str) -> bool:
        """Ask the daemon to cancel a queued or running request.

        Returns ``False`` when the request already has a verdict (nothing to cancel).  A
        request cancelled before its driver started ends with ``adaptor.CancelledError``,
        after that with ``RunCancelledError``.
        """
        self._require_spool()
        if self.verdict(request_id) is not None:
            return False
        self._require_known(request_id)
        _home.request_cancel(self._home, request_id)
        return True

    # -- approvals -----------------------------------------------------------------------------

    @_refused_as_foreign
    def approvals(self) -> list[dict[str, Any]]:
        """The open approval requests, oldest first: those a response could still win.

        Each is the ``approvals/pending/<id>.json`` object: the ``ApprovalRequest``'s JSON
        form (``id``, ``run_id``, ``approval_kind``, ``title``, ``choices``, ``details``,
        ``deadline``, ...) plus the spool ``request_id``.  A pending file whose deadline has
        passed, or that a response already found expired, is left out until the daemon
        removes it, and so is every one while no daemon serves the home (the runs that asked
        have ended; its next start expires them).
        """
        self._require_spool()
        if not _home.daemon_running(self._home):
            return []
        found: list[tuple[str, str, dict[str, Any]]] = []
        for path in _listing(self._home.approvals_pending):
            if path.name.startswith(".") or not path.name.endswith(".json"):
                continue
            try:
                pending = _read_object(path)
            except (OSError, ValueError):
                continue  # resolved (removed) while we listed, or not ours to read
            if not _pending_as_written(pending):
                continue  # not the daemon's (a file put there by hand): nothing asked it
            if not _home.answerable(self._home, pending):
                continue
            found.append((str(pending.get("created_at") or ""), path.name, pending))
        return [pending for _, _, pending in sorted(found, key=lambda entry: entry[:2])]

    @_refused_as_foreign
    def approve(self, approval_id: str) -> bool:
        """Approve a permission or plan-review request.

        Returns True once the daemon handed the response to the run that asked.  It waits up
        to 10 s for that: a daemon that does not get to it meanwhile (stopped, starved) leaves
        the response written, and False is returned: the response counts only if the run
        takes it before the request's deadline (:meth:`wait` on the request tells).
        Raises ``ApprovalResolvedError`` (another response won), ``ApprovalExpiredError``
        (deadline or run end came first, also between the writing and the taking, or no
        daemon serves the home: its runs have ended),
        ``ApprovalKindMismatchError`` (a question; it stays open) or
        ``ApprovalUnavailableError`` (no such request).
        """
        return self._respond(approval_id, "approve")

    @_refused_as_foreign
    def deny(self, approval_id: str, reason: str = "") -> bool:
        """Deny any kind of request; raises like :meth:`approve` (never a kind mismatch), and
        ``ValueError``, writing nothing, for a ``reason`` that is not UTF-8 or too long for a
        response file (64 KiB), ``TypeError`` for one that is no ``str``."""
        return self._respond(approval_id, "deny", reason)

    @_refused_as_foreign
    def answer(self, approval_id: str, option: str) -> bool:
        """Answer a question with ``option``; raises like :meth:`deny`, and ``ValueError`` for
        an empty option (deny the question instead)."""
        return self._respond(approval_id, "answer", option)

    def _respond(self, approval_id: str, action: str, text: str = "") -> bool:
        self._require_spool()
        return _home.respond(self._home, approval_id, action, text=text)

    # -- the daemon --------------------------------------------------------------------------

    @_refused_as_foreign
    def status(self) -> dict[str, Any]:
        """The daemon and its queue.

        ``{"home", "running", "pid", "started_at", "workers", "cpu", "queued": [ids],
        "in_progress": [ids], "verdict_deferred": [ids], "recent": [{"id", "ok", "exit_code",
        "code", "finished_at"}]}``; ``verdict_deferred`` are those of ``in_progress`` whose run
        has finished and whose verdict the disk refused so far; ``cpu`` is the CPU the
        daemon's own threads are kept on (``one_cpu``), ``None`` when they are not narrowed;
        ``pid``, ``started_at``, ``workers`` and ``cpu`` are ``None`` while no daemon runs (or when its
        ``adaptord.json`` is damaged), ``recent`` holds the latest verdicts, newest first.  A
        home that does not exist yet has no daemon; a file in its place raises
        :class:`SpoolNotFoundError`.
        """
        return self._status()[0]

    def _status(self) -> tuple[dict[str, Any], str | None]:
        """:meth:`status`, and why the daemon's own details are unknown when its state file
        cannot be read (``None`` when nothing is wrong)."""
        home = self._home
        if os.path.lexists(home.root) and not home.root.is_dir():
            raise SpoolNotFoundError(home.root)
        running = _home.daemon_running(home)
        info: dict[str, Any] = {}
        problem = None
        if running:
            try:
                info = _home.daemon_state(home)
            except ValueError as exc:
                problem = str(exc)
        queued = _request_ids(home.spool_new)
        in_progress: list[str] = []
        deferred: list[str] = []
        for request_id in _request_ids(home.claimed):
            status = _read_state(home, request_id).get("status")
            if status in ("running", _home.FINISHED):
                in_progress.append(request_id)
                if status == _home.FINISHED:  # its verdict waits for room on the disk
                    deferred.append(request_id)
            elif status != "done":  # done: the verdict is written, the claim not yet removed
                queued.append(request_id)
        return _status_report(
            home, running=running, info=info, queued=queued, in_progress=in_progress,
            deferred=deferred, recent=self._recent_verdicts(),
        ), problem

    def _recent_verdicts(self) -> list[dict[str, Any]]:
        entries: list[tuple[int, str]] = []
        try:
            with os.scandir(self._home.verdicts) as listing:
                for entry in listing:
                    if entry.name.startswith(".") or not entry.name.endswith(".json"):
                        continue  # a verdict being written
                    try:
                        entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:
            return []
        recent: list[dict[str, Any]] = []
        for _, name in heapq.nlargest(_RECENT_VERDICTS, entries):
            try:
                verdict = _read_object(self._home.verdicts / name)
            except (OSError, ValueError):
                continue
            if verdict.get("format") != _home.VERDICT_FORMAT or _damaged_verdict(verdict) is not None:
                continue  # another version's, or damaged: not shown (wait refuses it, naming it)
            error = verdict.get("error")
            recent.append(
                {
                    "id": verdict.get("id", name[: -len(".json")]),
                    "ok": verdict.get("ok"),
                    "exit_code": verdict.get("exit_code"),
                    "code": error.get("code") if isinstance(error, dict) else None,
                    "finished_at": verdict.get("finished_at"),
                }
            )
        return recent

    # -- internals -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _foreign_home_named(self) -> Iterator[None]:
        """A refused access inside another user's home raised as :class:`ForeignHomeError`."""
        try:
            yield
        except PermissionError as exc:
            foreign = _home.foreign_home(self._home, exc)
            if foreign is None:
                raise
            raise foreign from None

    def _require_spool(self) -> None:
        if not self._home.spool_new.is_dir():
            raise SpoolNotFoundError(self._home.root)

    def _check_id(self, request_id: str) -> None:
        # Ids name files under the home; anything else can never have been submitted.
        if not _home.is_request_id(request_id):
            raise UnknownRequestError(str(request_id), self._home.root)

    def _known(self, request_id: str) -> bool:
        """Whether the id is anywhere in the pipeline.

        Checked in the order a request moves (spool, claimed, verdict); every move
        creates the next place before leaving the last, so a request in flight is never missed.
        """
        home = self._home
        if any(os.path.lexists(place) for place in home.places(request_id)):
            return True
        # A misnamed entry ("abc.JSON", "abc") is renamed from spool/new/ into quarantine/ (as
        # "<time_ns>-<its name>"), as a hostile one is, before its rejection verdict is
        # written.  Its whole name must carry the id, as the daemon reads it: "team-a-42.json"
        # is not request 42's, and waiting for it would wait for a verdict that never comes.
        if any(_home.request_id_in_name(path.name) == request_id for path in _listing(home.spool_new)):
            return True
        for path in _listing(home.quarantine):
            stamp, _, original = path.name.partition("-")
            if stamp.isdigit() and _home.request_id_in_name(original) == request_id:
                try:
                    moved = os.lstat(path).st_ctime  # the rename into quarantine sets it
                except OSError:
                    continue
                if time.time() - moved < _QUARANTINE_IN_FLIGHT:
                    return True
        return False

    def _require_known(self, request_id: str) -> None:
        self._check_id(request_id)
        if not self._known(request_id):
            raise UnknownRequestError(request_id, self._home.root)

    def _require_present(self, request_id: str) -> None:
        # Re-checked while waiting: a home deleted (or a queued file removed) under a waiter
        # leaves nothing that could ever write the verdict, and waiting on would last forever.
        self._require_spool()
        self._require_known(request_id)

    def _await_verdict(self, request_id: str, timeout: float | None) -> dict[str, Any]:
        # Checked first: a verdict already there must not hide the mistake until a slow run.
        timeout = _waiting.seconds("timeout", timeout)
        self._require_spool()
        verdict = self.verdict(request_id)
        if verdict is not None:
            return verdict
        self._require_known(request_id)
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        # Armed before the next look, so a verdict written in between still wakes us.
        with _Wakeup(self._home.verdicts) as wake:
            while True:
                verdict = self.verdict(request_id)
                if verdict is not None:
                    return verdict
                self._require_present(request_id)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeoutError(request_id, max(timeout or 0.0, 0.0))
                wake.wait(_VERDICT_POLL if remaining is None else min(_VERDICT_POLL, remaining))

    def _outcome(self, verdict: Mapping[str, Any]) -> Result:
        """The verdict's Result, or raise its error (``RunError.result`` attached).

        Raises :class:`UnknownRequestError` when the verdict is gone once the run's files
        are read: retention removes a request's verdict first, then its files, so what was
        read may miss some of them, and the request is forgotten anyway.
        """
        result = self._rebuild_result(verdict)
        request_id = verdict.get("id")
        if _home.is_request_id(request_id) and not self._home.has_verdict(request_id):
            raise UnknownRequestError(request_id, self._home.root)
        if verdict.get("ok") is True:
            return result if result is not None else Result(run_id=str(verdict.get("run_id") or ""))
        raise errors.from_wire(verdict.get("error") or {}, result=result)

    def _rebuild_result(self, verdict: Mapping[str, Any]) -> Result | None:
        """The full Result: ``runs/<id>/result.json`` with its raw streams and transcript.

        Side files removed since (retention) read as empty; the verdict's summary is used
        when ``result.json`` itself is gone.
        """
        summary = verdict.get("result")
        if not isinstance(summary, dict):
            return None
        request_id = str(verdict.get("id") or "")
        obj: dict[str, Any]
        try:
            obj = _read_object(self._home.run_dir(request_id) / "result.json")
        except (OSError, ValueError):
            obj = {**summary, "run_id": verdict.get("run_id") or ""}
        raw_paths = obj.get("raw")
        raw: dict[str, Any] = raw_paths if isinstance(raw_paths, dict) else {}
        terminal = self._side_json(raw.get("terminal"))
        obj["raw"] = {
            "stdout": self._side_text(raw.get("stdout")),
            "stderr": self._side_text(raw.get("stderr")),
            "terminal": {
                "event": str(terminal.get("event", "")),
                "json": str(terminal.get("json", "")),
            }
            if isinstance(terminal, dict)
            else None,
        }
        transcript = obj.get("transcript")
        if isinstance(transcript, str):
            transcript = self._side_json(transcript)
        obj["transcript"] = transcript if isinstance(transcript, list) else []
        return Result.from_json(obj)

    def _side_path(self, relative: object) -> Path | None:
        # Paths in verdicts are relative to the home; never follow one out of it.
        if not isinstance(relative, str) or not relative:
            return None
        root = self._home.root.resolve()
        path = (root / relative).resolve()
        return path if path.is_relative_to(root) else None

    def _side_text(self, relative: object) -> str:
        path = self._side_path(relative)
        if path is None:
            return ""
        try:
            with _durable.open_for_read(path) as f:
                return f.read().decode("utf-8", errors="replace")
        except (FileNotFoundError, _durable.ForeignFileError):
            return ""  # a FIFO or the like is nothing the daemon wrote (and would block a read)

    def _side_json(self, relative: object) -> Any:
        path = self._side_path(relative)
        if path is None:
            return None
        try:
            return _durable.read_json(path)
        except (FileNotFoundError, _durable.ForeignFileError):
            return None


# --- reading the audit log ----------------------------------------------------------------------


def _request_records(
    client: Client, request_id: str, *, follow: bool, since: int = 0,
    wanted: Callable[[], bool] = lambda: True,
) -> Iterator[EventRecord]:
    """``EventRecord``s of one request's runs (``host_seq > since``), optionally followed
    while ``wanted()`` (asked between waits: the reader of what is followed may be gone).

    The request's session log may hold other runs (a thread's earlier turns), so records are
    kept by ``meta.run_id``.  The daemon writes a run id into ``state.json`` before recording
    any of the run's events, so an id still unknown after re-reading the state is foreign for
    good.
    """
    home = client._home
    client._require_spool()
    client._require_known(request_id)
    ours: set[str] = set()
    foreign: set[str] = set()
    reader: _LogReader | None = None
    begins: list[int] = []  # where the request's records begin in the log, once known

    def refresh() -> str | None:
        state = _read_state(home, request_id)
        ours.update(run_id for run_id in state.get("run_ids") or () if isinstance(run_id, str))
        if type(state.get("events_from")) is int:
            begins[:] = [state["events_from"]]
        verdict = client.verdict(request_id)
        if verdict is not None and isinstance(verdict.get("run_id"), str):
            ours.add(verdict["run_id"])
        session = state.get("session")
        if not session and verdict is not None and isinstance(verdict.get("events"), str):
            session = verdict["events"].removeprefix("events/").removesuffix(".jsonl")
        return session if isinstance(session, str) and session else None

    watched = (home.events, home.verdicts) if follow else ()
    try:
        with _Wakeup(*watched) as wake:
            while True:
                # Looked at before reading: a verdict seen here means every event of the run
                # was already appended, so the read below drains the log.
                finished = client.verdict(request_id) is not None
                if reader is None:
                    session = refresh()
                    # Begun once the daemon says where the request's records begin (as its
                    # agent starts); a run that ended before that is read whole.
                    if session is not None and (begins or finished or not follow):
                        start_at = max(begins[0], since + 1) if begins else 1
                        reader = _LogReader(home.events / f"{session}.jsonl", after=since, start_at=start_at)
                if reader is not None:
                    final = finished or not follow
                    for record in reader.read_to_the_end() if final else reader.read():
                        run_id = record.event.meta.run_id
                        if run_id not in ours and run_id not in foreign:
                            refresh()
                            if run_id not in ours:
                                foreign.add(run_id)
                        if run_id in ours:
                            yield record
                if finished or not follow:
                    if reader is None or not reader.opened:
                        # Nothing read: perhaps retention removed the request meanwhile (its
                        # verdict first, then its files).  A log opened before its removal
                        # is read whole through the open file.
                        client._require_known(request_id)
                    return
                client._require_present(request_id)
                wake.wait(_EVENTS_POLL)
                if not wanted():
                    return
    finally:
        if reader is not None:
            reader.close()


def _log_records(
    path: Path, *, follow: bool, since: int = 0, stream: IO[bytes] | None = None,
    wanted: Callable[[], bool] = lambda: True,
) -> Iterator[EventRecord]:
    """Every ``EventRecord`` of one session log (``host_seq > since``); with ``follow``,
    while ``wanted()``, like ``tail -F`` (the file may appear later or be replaced).

    A ``stream`` (stdin; ``path`` then only names it in errors), or a ``path`` that is a pipe
    or a device (``<(zcat x.jsonl.gz)``), is read once, to its end, ``follow`` or not: it
    cannot be reopened, and once its writer has closed it nothing more can come.
    """
    from hosttools.sessionrecorder import _format as log_format

    opened = None
    if stream is None:
        with contextlib.suppress(FileNotFoundError):  # with follow, it may appear later
            stream = opened = log_format.open_stream(path)
    if stream is not None:
        try:
            yield from _LogReader(path, after=since, stream=stream).read_to_the_end()
        finally:
            if opened is not None:
                opened.close()
        return
    reader = _LogReader(path, after=since)
    try:
        with _Wakeup(*((path.parent,) if follow else ())) as wake:
            while True:
                if not follow:
                    yield from reader.read_to_the_end()
                    return
                yield from reader.read()
                wake.wait(_EVENTS_POLL)
                if not wanted():
                    return
    finally:
        reader.close()


class _LogReader:
    """Reads a session-recorder log incrementally: each :meth:`read` yields the records
    appended since the last one, strictly validated.

    Only complete lines are taken, so a record being appended is read on the next call.  A
    replaced or shortened file holding the same history (a repaired torn tail, a restored
    copy: the same first record) is read again from its start, skipping what was already
    returned; one holding another history (the log was rotated or deleted, and a new one
    began at ``host_seq`` 1) is read whole, as ``tail -F`` reads a new file.

    A ``stream`` (a pipe) is read where it stands, never reopened nor closed; ``path`` names
    it in errors.
    """

    def __init__(
        self, path: Path, *, after: int = 0, stream: IO[bytes] | None = None, start_at: int = 1
    ) -> None:
        self.path = path
        self._after = after
        self._stream = stream
        # The host_seq to begin reading at, found by its position (see _seek): the records
        # before it are another request's, and a long thread holds a great many of them.
        self._start_at = start_at
        self._file: IO[bytes] | None = None
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._expected = 1
        self._first: bytes | None = None  # the first line of the history returned so far
        self._partial: bytes | None = None  # where the last read stopped: a line without its newline

    def read_to_the_end(self) -> Iterator[EventRecord]:
        """:meth:`read`, for a reading that is final: an unterminated last line that no append
        is writing (none is in flight, or none can come: a pipe) is a torn tail, reported as
        the strict readers report it, never taken for the end of the history."""
        yield from self.read()
        if self._partial is None:
            return
        if self._stream is None:
            from hosttools.sessionrecorder import _format as log_format

            assert self._file is not None
            # Under the writers' lock: an append in flight is complete once it is given.
            settled = log_format.settled_size(self._file, self.path)
            if settled is None:  # no writer ever locked it: what is there is all there is
                settled = os.fstat(self._file.fileno()).st_size
            yield from self.read()
            if self._offset >= settled:
                return  # the unterminated line was begun after that instant: still being written
        self._torn()

    def _torn(self) -> NoReturn:
        """Raise for the unterminated last line what the strict readers raise for it (a torn
        tail when a crash can have left it, else corruption kept as it is)."""
        from hosttools.sessionrecorder import _format as log_format

        raw = self._partial
        assert raw is not None
        try:
            log_format.decode(raw, self._expected)
        except log_format._LineError as exc:
            key = log_format.key_of(self.path)
            raise log_format._corrupt(key, self._expected, exc, is_last=True, raw=raw) from None
        raise AssertionError("an unterminated line decoded")

    def read(self) -> Iterator[EventRecord]:
        file = self._stream  # a pipe has no offset to go back to: it is read where it stands
        if file is None:
            if self._file is not None and self._moved_away():
                # Rotated or removed: what was appended to it since the last read comes first,
                # as tail -F reads a file to its end before it goes on with the new one.
                self._file.seek(self._offset)
                yield from self._records_from(self._file)
                self.close()
            file = self._reopen()
            if file is None:
                return
            file.seek(self._offset)
        yield from self._records_from(file)

    def _moved_away(self) -> bool:
        """Whether ``path`` no longer names the open file (it was rotated, replaced or removed)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (info.st_dev, info.st_ino) != self._identity

    def _records_from(self, file: IO[bytes]) -> Iterator[EventRecord]:
        # Imported here: importing adaptor must not load the host tools.  The recorder has no
        # public incremental reader; its line decoder is the one strict definition of a record,
        # so following a log uses it rather than a second parser.
        from hosttools import sessionrecorder
        from hosttools.sessionrecorder import _format as log_format

        self._partial = None
        for raw in iter(file.readline, b""):
            if not raw.endswith(b"\n"):
                # Being appended right now, or a torn tail the next writer cuts (see
                # read_to_the_end): read again from its start next time.
                self._partial = raw
                return
            try:
                record = log_format.decode(raw, self._expected)
            except log_format._LineError as exc:
                raise sessionrecorder.JSONLEventLogCorruptError(
                    log_format.key_of(self.path), self._expected, why=exc.why
                ) from None
            if self._expected == 1:
                if self._first is not None and raw != self._first:
                    self._after = 0  # another history: none of it was returned yet
                self._first = raw
            self._offset += len(raw)
            self._expected += 1
            if record.host_seq > self._after:
                self._after = record.host_seq
                yield record

    @property
    def opened(self) -> bool:
        """Whether a file was ever found at ``path`` (or a stream given) to read."""
        return self._stream is not None or self._identity is not None

    def _reopen(self) -> IO[bytes] | None:
        from hosttools.sessionrecorder import _format as log_format

        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self.close()
            return None
        if self._file is not None and (
            (info.st_dev, info.st_ino) != self._identity or info.st_size < self._offset
        ):
            self.close()
        if self._file is None:
            try:
                # The file a symlink names is read, as verify-log reads it (reading cannot be
                # redirected into harm; only writers refuse links).
                self._file = log_format.open_log(os.path.realpath(self.path))
            except FileNotFoundError:
                return None
            opened = os.fstat(self._file.fileno())
            self._identity = (opened.st_dev, opened.st_ino)
            self._offset = 0
            self._expected = 1
            if self._start_at > 1:
                found = _seek(self._file, self._start_at, opened.st_size)
                if found is not None:
                    self._offset, self._expected = found, self._start_at
        return self._file

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


_SEEK_SPAN = 64 * 1024  # below this, the last of a search reads line by line


def _seek(file: IO[bytes], host_seq: int, size: int) -> int | None:
    """The offset of the line holding ``host_seq`` in a log (a binary search over its lines,
    whose host_seq only grows), or None to read from the start: a line looked at that is no
    record (a torn tail, corruption) or a history without that record.  The records before it
    go unchecked; those from it on are read strictly as ever.
    """
    low, high = 0, size  # the line sought begins in [low, high)
    while high - low > _SEEK_SPAN:
        middle = (low + high) // 2
        file.seek(middle - 1)
        start = middle - 1 + len(file.readline())  # the first line beginning at or after middle
        if start >= high:
            high = middle
            continue
        found = _host_seq_at(file, start)
        if found is None:
            return None
        if found == host_seq:
            return start
        if found < host_seq:
            low = start
        else:
            high = start
    file.seek(low)
    offset = low
    while offset < high:
        found = _host_seq_at(file, offset)
        if found is None or found > host_seq:
            return None
        if found == host_seq:
            return offset
        offset = file.tell()
    return None


def _host_seq_at(file: IO[bytes], offset: int) -> int | None:
    """The host_seq of the whole line at ``offset`` (the file is left after it), or None."""
    file.seek(offset)
    line = file.readline()
    if not line.endswith(b"\n"):
        return None
    try:
        found = orjson.loads(line).get("host_seq")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return found if type(found) is int else None


# --- waking up ----------------------------------------------------------------------------------


class _Wakeup:
    """Cuts a wait short when something changes in some directories.

    Only a hint: callers re-check their condition after every :meth:`wait` and bound each wait,
    so a missed or impossible watch (inotify limits, network filesystems) only makes them
    slower.  With no directories it is a plain bounded sleep.  Every wakeup in the process
    shares one observer (``adaptor._watch.hints``).
    """

    def __init__(self, *directories: Path) -> None:
        self._directories = directories
        self._changed = threading.Event()
        self._watching: list[str] = []

    def __enter__(self) -> _Wakeup:
        directories = [os.fspath(d) for d in self._directories if d.is_dir()]
        if directories:
            from adaptor import _watch  # (loads watchdog)

            self._watching = _watch.hints.add(directories, self._changed)
        return self

    def wait(self, timeout: float) -> None:
        self._changed.wait(timeout)
        self._changed.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        watching, self._watching = self._watching, []
        if watching:
            from adaptor import _watch

            _watch.hints.remove(watching, self._changed)


# --- small file helpers -------------------------------------------------------------------------


def _status_report(
    home: _home.Home,
    *,
    running: bool = False,
    info: Mapping[str, Any] | None = None,
    queued: Sequence[str] = (),
    in_progress: Sequence[str] = (),
    deferred: Sequence[str] = (),
    recent: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """:meth:`Client.status`'s report (with no argument but ``home``: nothing running, nothing
    waiting, as ``adaptor status --json`` reports a file standing where the home should be)."""
    info = info or {}
    return {
        "home": str(home.root),
        "running": running,
        "pid": info.get("pid"),
        "started_at": info.get("started_at"),
        "workers": info.get("workers"),
        "cpu": info.get("cpu"),
        "queued": sorted(queued),
        "in_progress": sorted(in_progress),
        "verdict_deferred": sorted(deferred),
        "recent": list(recent),
    }


def _pending_as_written(pending: Mapping[str, Any]) -> bool:
    """Whether a pending approval file has what the daemon writes in every one: its id, the
    request it belongs to and a kind a response can be for."""
    return (
        isinstance(pending.get("id"), str)
        and isinstance(pending.get("request_id"), str)
        and pending.get("approval_kind") in ("permission", "plan_review", "question")
    )


def _damaged_verdict(verdict: Mapping[str, Any]) -> str | None:
    """What in a verdict of this format is not as the daemon writes it (None: nothing)."""
    if not isinstance(verdict.get("ok"), bool):
        return '"ok" is not true or false'
    code = verdict.get("exit_code")
    if isinstance(code, bool) or not isinstance(code, int):
        return '"exit_code" is not an integer'
    result = verdict.get("result")
    if result is not None and not (isinstance(result, dict) and isinstance(result.get("text", ""), str)):
        return '"result" is not a result (an object whose "text" is text)'
    error = verdict.get("error")
    if error is not None and not (isinstance(error, dict) and isinstance(error.get("code"), str)):
        return '"error" is not an error (an object with a "code")'
    if verdict["ok"] != (error is None):
        return '"ok" contradicts "error"'
    return None


def _read_object(path: Path) -> dict[str, Any]:
    try:
        value = _durable.read_json(path)
    except orjson.JSONDecodeError as exc:  # never written so by the daemon: damaged since
        raise ValueError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


def _read_state(home: _home.Home, request_id: str) -> dict[str, Any]:
    try:
        return _read_object(home.run_state(request_id))
    except (OSError, ValueError):
        return {}


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def _request_ids(directory: Path) -> list[str]:
    ids = []
    for path in _listing(directory):
        stem = path.name[: -len(".json")]
        if path.name.endswith(".json") and _home.REQUEST_ID.fullmatch(stem):
            ids.append(stem)
    return ids

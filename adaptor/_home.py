"""The adaptord home directory: its layout and the file protocols shared by the daemon and
its clients (request submission, cancel requests, approvals as files).

Public layout (scripts may rely on it): ``spool/tmp``, ``spool/new``, ``verdicts/<id>.json``,
``events/<session>.jsonl``, ``runs/<id>/``, ``threads/``, ``approvals/pending/<id>.json``, and
``workspace/``, where the runs of requests naming no workspace work.  Everything else here is
internal.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import errno
import fcntl
import hashlib
import os
import pwd
import re
import secrets
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal, TypeGuard

import orjson

from adaptor import _durable, _nesting, _procfs
from adaptor._one_line import one_line
from adaptor.errors import (
    ApprovalExpiredError,
    ApprovalKindMismatchError,
    ApprovalResolvedError,
    ApprovalUnavailableError,
)

# Ids name files, and the three patterns below are always used with ``fullmatch``: Python's
# ``$`` also matches before a final newline, so ``match`` took "job-1\n" for an id (JSON
# Schema's ``$``, the spec's, does not).
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_REQUEST_BYTES = 1024 * 1024
REQUEST_FORMAT = "adaptord.request/1"
VERDICT_FORMAT = "adaptord.verdict/1"
OWNER_VAR = "ADAPTORD_OWNER"
"""The variable adaptord marks every process it starts with (see adaptord._leftovers)."""

DAEMON_SESSION = "adaptord"


def is_request_id(value: object) -> TypeGuard[str]:
    """Whether ``value`` can name a request: it matches :data:`REQUEST_ID` and is not the
    daemon's own session name (its audit log is ``events/adaptord.jsonl``) nor starts like the
    name of one of its rotated logs (``events/adaptord-<UTC time>.jsonl``), in any letter case
    (on a case-insensitive filesystem ``ADAPTORD.jsonl`` is the daemon's log)."""
    if not isinstance(value, str) or REQUEST_ID.fullmatch(value) is None:
        return False
    folded = value.lower()
    return folded != DAEMON_SESSION and not folded.startswith(DAEMON_SESSION + "-")


def request_id_in_name(name: str) -> str | None:
    """The request id a spool entry's name carries, or ``None`` when it carries none.

    ``<id>.json`` carries ``id``; so, for a rejection verdict that tells its writer what went
    wrong, does a name that misses only the suffix's spelling: ``<id>.JSON`` (any letter
    case), or the bare ``<id>``.  Any other name is taken whole (``notes.txt`` carries
    ``notes.txt``): the only id a stray file can stand for is one its name spells out.
    """
    stem = name[: -len(".json")] if name.lower().endswith(".json") else name
    return stem if is_request_id(stem) else None


def default_home() -> Path:
    """``ADAPTORD_HOME``, else ``$XDG_STATE_HOME/adaptord``, else ``~/.local/state/adaptord``."""
    explicit = os.environ.get("ADAPTORD_HOME")
    if explicit:
        return _absolute(explicit)
    return xdg_base("XDG_STATE_HOME", ".local/state") / "adaptord"


def _absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` absolute and without ``..``: ``cwd/../h`` kept the directory it was named from
    in the home's path, and a daemon whose starting directory was then removed took its home
    for gone and stopped."""
    text = os.fspath(path)
    if text == "~" or text.startswith("~/"):
        text = user_home() + text[1:]
    return Path(os.path.abspath(os.path.expanduser(text)))


def xdg_base(variable: str, default: str) -> Path:
    """The XDG base directory ``variable`` names, else ``~/default``.

    A relative value is ignored, as the XDG spec asks: resolved against the current directory,
    `adaptord serve` and `adaptor status` started in two directories would use two homes.
    """
    value = os.environ.get(variable, "")
    if os.path.isabs(value):
        return Path(value)
    return Path(user_home(), default)


def user_home() -> str:
    """``$HOME`` when it is an absolute path, else the user's home in the password database.

    An empty ``HOME`` made the home ``/.local/state/adaptord`` (at the root), a relative one a
    home under each current directory, the very thing a relative ``XDG_STATE_HOME`` is ignored
    for; both are taken as unset, as the XDG rule takes those.
    """
    value = os.environ.get("HOME", "")
    if os.path.isabs(value):
        return value
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # (a uid without an entry: a container's)
        return os.path.abspath(value or os.sep)


def new_request_id() -> str:
    """A time-sortable id: ``20261202T101500123456Z-1a2b3c``."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


THREAD_SESSION = re.compile(r"^thread=[a-z2-7]{1,200}$|^thread=sha256-[0-9a-f]{64}$")


def session_for_thread(key: str) -> str:
    """The audit-log session name of a thread key: one file per conversation.

    The key's UTF-8 bytes, base32-encoded (lowercase, no padding) behind ``thread=``; a request
    id can never contain ``=``, so the two kinds of session names never collide.  Keys too long
    for one file name are hashed instead.
    """
    encoded = base64.b32encode(key.encode()).decode().rstrip("=").lower()
    if len(encoded) <= 200:
        return "thread=" + encoded
    return "thread=sha256-" + hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Home:
    """Paths under one adaptord home.

    The folders are computed once per ``Home`` (``cached_property`` stores them in the
    instance's ``__dict__``, which a frozen dataclass allows): the daemon asks for them
    several times per request, and building a ``Path`` is not free.
    """

    root: Path

    @classmethod
    def at(cls, root: str | os.PathLike[str] | None = None) -> Home:
        return cls(_absolute(root) if root is not None else default_home())

    # public
    @cached_property
    def spool_tmp(self) -> Path:
        return self.root / "spool" / "tmp"

    @cached_property
    def spool_new(self) -> Path:
        return self.root / "spool" / "new"

    @cached_property
    def verdicts(self) -> Path:
        return self.root / "verdicts"

    @cached_property
    def events(self) -> Path:
        return self.root / "events"

    @cached_property
    def runs(self) -> Path:
        return self.root / "runs"

    @cached_property
    def threads(self) -> Path:
        return self.root / "threads"

    @cached_property
    def approvals_pending(self) -> Path:
        return self.root / "approvals" / "pending"

    @cached_property
    def workspace(self) -> Path:
        """The working directory of every run whose request names none (and whose driver
        config names no ``cwd``): private to the home, one for all of them, so that the turns
        of a thread keep one directory (CLIs keep their sessions per directory)."""
        return self.root / "workspace"

    # internal
    @cached_property
    def claimed(self) -> Path:
        return self.root / "claimed"

    @cached_property
    def quarantine(self) -> Path:
        return self.root / "quarantine"

    @cached_property
    def tmp(self) -> Path:
        """The daemon's own temporary files (drivers' private folders), emptied at its start."""
        return self.root / "tmp"

    @cached_property
    def cancels(self) -> Path:
        return self.root / "control" / "cancel"

    @cached_property
    def approvals_responses(self) -> Path:
        return self.root / "approvals" / "responses"

    @cached_property
    def approvals_resolved(self) -> Path:
        return self.root / "approvals" / "resolved"

    @cached_property
    def approvals_lock(self) -> Path:
        return self.root / "approvals" / "approvals.lock"

    @cached_property
    def daemon_lock(self) -> Path:
        return self.root / "adaptord.lock"

    @cached_property
    def daemon_state(self) -> Path:
        return self.root / "adaptord.json"

    def verdict(self, request_id: str) -> Path:
        return self.verdicts / f"{request_id}.json"

    def places(self, request_id: str) -> tuple[Path, ...]:
        """Every name a request with this id may have on its way, in the order it moves
        (spool, claimed, verdict); each move makes the next before leaving the last.

        Not its run folder: a request keeps its claimed copy until its verdict is linked, so
        a run folder alone is what is left of a request whose verdict was removed (by
        retention, or by hand), and no verdict will ever come for it.
        """
        name = f"{request_id}.json"
        return (
            self.spool_tmp / name,
            self.spool_new / name,
            self.claimed / name,
            self.verdict(request_id),
        )

    def has_verdict(self, request_id: str) -> bool:
        """Whether the request's verdict was written: a regular file at its name.

        Anything else there (a symbolic link, a folder) is not one: the daemon moves it to
        ``quarantine/`` when it writes the request's verdict, never writing through it.
        """
        try:
            return stat.S_ISREG(os.lstat(self.verdict(request_id)).st_mode)
        except OSError:
            return False

    def run_dir(self, request_id: str) -> Path:
        return self.runs / request_id

    def run_state(self, request_id: str) -> Path:
        return self.runs / request_id / "state.json"

    @property
    def folders(self) -> tuple[Path, ...]:
        """Every folder of the layout below the root, each after its parent."""
        leaves = (
            self.spool_tmp,
            self.spool_new,
            self.verdicts,
            self.events,
            self.runs,
            self.threads,
            self.approvals_pending,
            self.workspace,
            self.approvals_responses,
            self.approvals_resolved,
            self.claimed,
            self.quarantine,
            self.cancels,
            self.tmp,
        )
        found: dict[Path, None] = {}
        for leaf in leaves:
            for folder in (*reversed(leaf.relative_to(self.root).parents[:-1]), None):
                found[leaf if folder is None else self.root / folder] = None
        return tuple(found)

    def ensure(self) -> None:
        for directory in self.folders:
            _durable.ensure_dir(directory)

    def absent(self) -> bool:
        """Whether nothing of a home is there yet: no root, or an empty folder."""
        try:
            with os.scandir(self.root) as entries:
                return next(entries, None) is None
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def unmake(self, *, root_too: bool) -> None:
        """Undo :meth:`ensure` (and the daemon's lock file) for a home that was :meth:`absent`:
        each folder removed while empty (``rmdir``: what anyone else put there meanwhile stays),
        and the root too with ``root_too``."""
        with contextlib.suppress(OSError):
            os.unlink(self.daemon_lock)
        for folder in (*reversed(self.folders), *([self.root] if root_too else [])):
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def not_private(home: Home) -> str | None:
    """Why the home cannot be trusted with requests, or ``None``.

    Whoever can write into it can make the daemon run commands as its own user: a home (or any
    folder of its layout: a writable parent lets another user swap the folder for their own)
    that another user owns or that is writable by group or others is refused, not served, and
    so is a folder of the layout that is a symbolic link (the daemon would write through it).
    Folders that do not exist yet are made 0700.
    """
    me = os.geteuid()
    for path in (home.root, *home.folders):
        try:
            found = os.lstat(path) if path != home.root else os.stat(path)
        except OSError:  # missing, or not reachable: making the home reports that
            continue
        if found.st_uid != me:
            return f"{path} belongs to uid {found.st_uid}, not to this user (uid {me})"
        if stat.S_ISLNK(found.st_mode):
            return f"{path} is a symbolic link"
        writable = writable_by(found)
        if writable is not None:
            ignored = _modes_ignored(path) if stat.S_ISDIR(found.st_mode) else None
            if ignored is not None:
                # (chmod succeeds there and changes nothing: its advice would be no help.)
                return (
                    f"{path} is {writable}, and its filesystem keeps no file modes (a file made 0600 "
                    f"there shows {ignored:o}): put the home on one that does (ext4, xfs, btrfs, tmpfs)"
                )
            return f"{path} is {writable}; make it private: chmod go-w {path}"
    return None


def _modes_ignored(directory: Path) -> int | None:
    """The mode a file made 0600 in ``directory`` shows when its filesystem keeps no modes of
    its own (NTFS, exFAT or FAT mounted with their defaults: every file 0777), else ``None``."""
    probe = directory / f".adaptord-mode-probe-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        os.fchmod(fd, 0o600)
        shown = stat.S_IMODE(os.fstat(fd).st_mode)
    except OSError:
        shown = 0o600
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return shown if shown & 0o077 else None


def writable_by(found: os.stat_result) -> str | None:
    """``"writable by others (mode 666)"`` (or ``by its group``) for what someone besides its
    owner may write, else ``None``: what the daemon must not trust (its home, its config)."""
    if not found.st_mode & 0o022:
        return None
    who = "others" if found.st_mode & 0o002 else "its group"
    return f"writable by {who} (mode {stat.S_IMODE(found.st_mode):o})"


def daemon_running(home: Home) -> bool:
    """True while some process holds the home's daemon lock (the daemon is serving it).

    Looked at with a shared lock, which only the daemon's exclusive one refuses: probes never
    take each other for a daemon (with the exclusive lock the daemon takes, one in a
    moment's hold of it did), and one needs no write access (a home on a read-only mount).
    Raises :class:`ForeignHomeError` when the home is another user's, which this one may not
    look into: whether its daemon serves cannot be told.
    """
    try:
        fd = os.open(home.daemon_lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except PermissionError as exc:
        foreign = foreign_home(home, exc)
        if foreign is not None:
            raise foreign from None
        return False  # this user's own, unreadable: no daemon of this user serves through it
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # held exclusively: the daemon's lock
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


class ForeignHomeError(PermissionError):
    """The home is another user's, and this user may not use it (a daemon serves its own user
    only): ``root`` is the home, ``owner`` its owner's uid, ``filename`` the file refused and
    ``reason`` why.  The ``adaptor`` CLI exits 69 on it ("spool not reachable")."""

    __module__ = "adaptor.spool"  # its public name (defined here, where the home is looked at)

    def __init__(self, root: Path, owner: int, denied: OSError) -> None:
        self.root, self.owner = root, owner
        self.reason = denied.strerror or "not permitted"
        try:
            owner_shown = f"uid {owner}, {pwd.getpwuid(owner).pw_name}"
        except KeyError:
            owner_shown = f"uid {owner}"
        refused = self.reason if denied.filename is None else f"{self.reason}: {os.fsdecode(denied.filename)}"
        super().__init__(
            denied.errno,
            f"{root} is another user's adaptord home ({owner_shown}), which this user (uid {os.geteuid()}) "
            f"may not use ({refused}): run as that user, or use a home of your own",
            denied.filename,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.root, self.owner, PermissionError(self.errno, self.reason, self.filename))

    def __str__(self) -> str:
        return str(self.strerror)  # (OSError's own form puts "[Errno 13]" first and the file last)


class UnservableHomeError(OSError):
    """The home is where no adaptord can serve it (a filesystem without hard links, such as
    exFAT or FAT, or ``spool/`` mounted apart), so nothing queued there would ever run:
    ``root`` is the home, ``reason`` why.  The ``adaptor`` CLI exits 69 on it ("spool not
    reachable"); ``adaptord serve`` refuses such a home at its start."""

    __module__ = "adaptor.spool"  # its public name (defined here, where requests are queued)

    def __init__(self, root: Path, errno_: int, reason: str) -> None:
        self.root, self.reason = root, reason
        super().__init__(errno_, f"no adaptord can serve {one_line(os.fspath(root))}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.root, self.errno, self.reason)

    def __str__(self) -> str:
        return str(self.strerror)  # (without OSError's "[Errno 1]" first)


def foreign_home(home: Home, denied: OSError) -> ForeignHomeError | None:
    """``denied`` (a refused access inside ``home``) as a :class:`ForeignHomeError` when the
    home belongs to another user; ``None`` otherwise (this user's own home, or a path elsewhere)."""
    if not isinstance(denied, PermissionError) or isinstance(denied, ForeignHomeError):
        return None
    root = os.path.abspath(home.root)
    if denied.filename is not None:
        path = os.path.abspath(os.fsdecode(denied.filename))
        if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
            return None
    try:
        owner = os.stat(root).st_uid
    except OSError:
        return None
    if owner == os.geteuid():
        return None
    return ForeignHomeError(home.root, owner, denied)


def _not_to_be_given_requests(home: Home) -> ForeignHomeError | None:
    """Why this process submits nothing into ``home``: it is another user's, who would read every
    request, secrets included (a home someone made ready in ``/tmp`` for others to name), unless
    this process may write any file anyway (root, handing a user's daemon a request)."""
    try:
        owner = os.stat(home.root).st_uid
    except OSError:
        return None
    if owner == os.geteuid() or _procfs.overrides_file_modes():
        return None
    refused = PermissionError(
        errno.EPERM, "not this user's, and its owner reads every request, secrets and all", os.fspath(home.spool_new)
    )
    return ForeignHomeError(home.root, owner, refused)


def daemon_state(home: Home) -> dict[str, Any]:
    """What the serving daemon says of itself in ``adaptord.json`` (pid, workers, started_at,
    ...); ``{}`` when there is no such file (a daemon that could not write it serves anyway).

    Raises ``ValueError``, its message naming the file, when the file is there but cannot be
    read or holds no JSON object.
    """
    path = home.daemon_state
    try:
        state = _durable.read_json(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # orjson's decode error is a ValueError
        with contextlib.suppress(OSError):
            if os.stat(path).st_size == 0:
                # A predecessor's, emptied by a daemon that could not remove it (a home whose
                # folder may not be written) nor write its own: nothing known, nothing damaged.
                return {}
        raise ValueError(f"{path} is unreadable ({exc}); pid and details unknown") from exc
    if not isinstance(state, dict):
        raise ValueError(f"{path} is unreadable (not a JSON object); pid and details unknown")
    wrong = [name for name, kinds in _STATE_FIELDS.items()
             if name in state and state[name] is not None
             and (isinstance(state[name], bool) or not isinstance(state[name], kinds))]
    if wrong:
        # (Shown as they were, `status` said "pid x, y workers".)
        raise ValueError(f"{path} is damaged ({', '.join(wrong)} of another type); pid and details unknown")
    return state


# What the daemon writes in adaptord.json, and the types it writes them as.
_STATE_FIELDS: Final[Mapping[str, type | tuple[type, ...]]] = {
    "pid": int, "workers": int, "started_at": str, "cpu": int, "a2a_url": str,
}


MAX_ATTEMPTS = 3
"""How many runs a request with ``on_interrupt: "requeue"`` gets in all, interrupted ones included."""


FINISHED: Final = "finished"
"""A run state's status once its run has ended and its verdict was refused by the disk (the
daemon tries it again); ``"done"`` once the verdict is written."""


def after_restart(state: Mapping[str, Any]) -> Literal["queued", "requeue", "verdict"]:
    """What the next daemon start does with a claimed request without a verdict, from its run
    state (``runs/<id>/state.json``; ``{}`` when it has none):

    ``"queued"``: it never started, so it queues again; ``"requeue"``: an interrupted run with
    ``on_interrupt: "requeue"`` and attempts left runs again, unless it is a thread's turn that
    may have reached its agent, or it had finished (its verdict was never written);
    ``"verdict"``: an interrupted or finished run gets its failure verdict.
    The daemon's recovery decides by this, and ``adaptor`` tells a waiting user from it what
    the restart will do.

    A thread's turn is not run again once its agent may have had the prompt: the agent keeps
    the conversation itself (claude and codex in their session files, resumed by id), so a
    second attempt resuming the same session would send the prompt into it twice, whether or
    not the thread's record was saved.
    """
    attempt = int(state.get("attempt") or 0)
    # "done": that run's verdict was written and its claimed copy removed, so the claimed
    # request is a later one of the same id (the earlier verdict removed by hand).
    if state.get("status") in (None, "queued", "done") or attempt == 0:
        return "queued"
    if run_finished(state):
        # Running it again would repeat all it did: on_interrupt is for runs cut short.
        return "verdict"
    if _may_requeue(state) and not thread_turn_kept_back(state):
        return "requeue"
    return "verdict"


def run_finished(state: Mapping[str, Any]) -> bool:
    """Whether a claimed request's run had ended; only its verdict was never written (the disk
    refused it until the daemon stopped)."""
    return state.get("status") in ("done", FINISHED)


def _may_requeue(state: Mapping[str, Any]) -> bool:
    """``on_interrupt: "requeue"`` with attempts left."""
    return state.get("on_interrupt", "fail") == "requeue" and int(state.get("attempt") or 0) < MAX_ATTEMPTS


def thread_turn_kept_back(state: Mapping[str, Any]) -> bool:
    """Whether an interrupted run that asked to run again is not, being a thread's turn whose
    agent may have had the prompt (see :func:`after_restart`)."""
    return _may_requeue(state) and is_thread_session(state.get("session")) and run_entered(state)


def run_entered(state: Mapping[str, Any]) -> bool:
    """Whether an interrupted run may have reached its agent, from its run state.

    The driver-entry fact is recorded by the event consumer, which can lag the driver: a run
    the SDK admitted (it has a run id) counts as entered unless proven otherwise.
    """
    return bool(state.get("entered") or state.get("run_ids") or state.get("run_id"))


def is_thread_session(session: object) -> bool:
    """Whether an audit-log session name is a thread's (see :func:`session_for_thread`)."""
    return isinstance(session, str) and session.startswith("thread=")


# --- submitting -------------------------------------------------------------------------------


def submit(home: Home, request: Mapping[str, Any]) -> str:
    """Drop ``request`` into the spool: write under ``spool/tmp``, fsync, link into ``spool/new``.

    Returns the request id (minted when the request has none).  Raises ``FileExistsError`` when a
    request with that id is already queued, ``TypeError`` when ``request`` is no mapping and
    ``ValueError`` for a NaN or infinity in it, or when it is larger than the daemon takes
    (:data:`MAX_REQUEST_BYTES`: such a file is set aside unread).
    """
    # dict() would take a list of pairs as a request, and fail on a str with its own riddle.
    if not isinstance(request, Mapping):
        raise TypeError(f"a request is a mapping (the JSON object), not {type(request).__name__}")
    body = dict(request)
    request_id = body.get("id")
    if request_id is None:
        request_id = new_request_id()
        body["id"] = request_id
    if not is_request_id(request_id):
        raise ValueError(f"invalid request id {request_id!r}")
    body.setdefault("format", REQUEST_FORMAT)
    data = request_file_bytes(body)
    if not home.spool_tmp.is_dir() or not home.spool_new.is_dir():
        raise FileNotFoundError(f"no adaptord spool under {home.root}")
    refused = _not_to_be_given_requests(home)
    if refused is not None:
        raise refused
    if _taken(home, request_id, None):
        raise FileExistsError(f"request {request_id!r} was already submitted")
    tmp = home.spool_tmp / f"{request_id}.json"
    queued = home.spool_new / f"{request_id}.json"
    ours: int | None = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                ours = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            try:
                os.link(tmp, queued)
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                # (A bare "Operation not permitted" named the spool file, as if its mode were wrong.)
                raise UnservableHomeError(
                    home.root, exc.errno, f"{unlinkable(home, exc, tmp, queued)}; nothing was queued"
                ) from None
        finally:
            # Also after a failed write (a full disk): a retry with the same id must find no
            # half-written file in its way.
            os.unlink(tmp)
        # The link fails only while the other request is still queued; once the daemon claimed
        # it the spool name is free again.  A request with this id claimed (or answered)
        # meanwhile makes this one a duplicate, which the daemon would only set aside: take it
        # back.
        if _lost_to_another(home, request_id, queued, ours):
            with contextlib.suppress(FileNotFoundError):  # (set aside by the daemon already)
                if os.lstat(queued).st_ino == ours:
                    os.unlink(queued)
            raise FileExistsError(f"request {request_id!r} was already submitted")
        try:
            _durable.fsync_dir(home.spool_new)
        except OSError:
            # Queued, but not known to stay queued (a spool/new this user may not read, an I/O
            # error): taken back, so that the failure means nothing was queued.
            _take_back(home, request_id, queued, ours)
            raise
    except BaseException as exc:
        if ours is not None and not isinstance(exc, Exception):
            # Interrupted (a Ctrl-C, a SIGTERM handler's exit) once the file may be queued:
            # the caller never learns the id, so the request must not run on unasked.
            _take_back(home, request_id, queued, ours)
        raise
    return request_id


def unservable_path(root: Path) -> UnservableHomeError | None:
    """Why no daemon can serve a home at ``root`` for its path alone, else ``None``."""
    try:
        os.fspath(root).encode()
    except UnicodeEncodeError:
        # (adaptord serve refuses it: the path goes into its state, logs and verdicts, UTF-8 JSON.)
        return UnservableHomeError(root, errno.EILSEQ, "its path is not UTF-8")
    return None


def unlinkable(home: Home, exc: OSError, source: Path, target: Path) -> str:
    """Why a request's file could not be linked from ``source`` to ``target`` (``exc``), for a
    home whose filesystem has no hard links (exFAT, FAT) or a folder mounted apart (EXDEV)."""
    return (
        f"{exc.strerror or type(exc).__name__} linking {source.parent.relative_to(home.root)}/ to "
        f"{target.parent.relative_to(home.root)}/: requests are hard-linked along their way, "
        "so the home must be on one filesystem that has hard links"
    )


# What link(2) says where the filesystem has no hard links, or the two folders are on two.
_NO_LINKS: Final = frozenset({errno.EPERM, errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def _take_back(home: Home, request_id: str, queued: Path, ours: int) -> None:
    """Withdraw the request this submitter linked (inode ``ours``): removed while still queued,
    and cancelled if the daemon claimed it already (a verdict already written stays)."""
    with contextlib.suppress(OSError):
        if os.lstat(queued).st_ino == ours:
            os.unlink(queued)
    with contextlib.suppress(OSError):
        # The daemon claims by linking the file into claimed/ before it unlinks the spool
        # name: the claimed file is the linked one, and may be there with the spool name still.
        if os.lstat(home.claimed / f"{request_id}.json").st_ino == ours:
            request_cancel(home, request_id)


def _lost_to_another(home: Home, request_id: str, queued: Path, ours: int) -> bool:
    """Whether, once this submitter linked its file (inode ``ours``) at ``queued``, the id
    turned out to be another request's.

    The daemon may claim the file, and even answer it (a request it refuses), at once: a
    claim or a verdict is another's only if it was there while this file still waited in the
    spool (the daemon removes the spool name before it answers).  A file that left the spool
    is this request's claim or verdict, unless the daemon set it aside as a duplicate.
    """
    taken = _taken(home, request_id, ours)
    try:
        still_queued = os.lstat(queued).st_ino == ours
    except FileNotFoundError:
        still_queued = False
    if still_queued:
        return taken
    suffix = f"-{request_id}.json"
    with contextlib.suppress(OSError), os.scandir(home.quarantine) as aside:
        return any(entry.name.endswith(suffix) and entry.inode() == ours for entry in aside)
    return False


def _taken(home: Home, request_id: str, ours: int | None) -> bool:
    """Whether another request with this id was claimed or has its verdict (``ours``: the
    inode of the file this submitter linked, which the daemon's claim keeps)."""
    if home.has_verdict(request_id):
        return True
    try:
        claimed = os.lstat(home.claimed / f"{request_id}.json")
    except FileNotFoundError:
        return False
    return claimed.st_ino != ours


def request_file_bytes(request: Mapping[str, Any]) -> bytes:
    """``request`` as its request file holds it; ``ValueError`` for what the daemon would not
    run as given: a NaN or infinity, an integer past 64 bits, text that is not UTF-8, or more
    than :data:`MAX_REQUEST_BYTES`."""
    try:
        data = orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        _require_writable(request)  # says where an integer past 64 bits, or bad text, is
        raise
    if b"null" in data:  # only then can a NaN have been written; dumps refused cycles already
        _require_writable(request)
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError(f"the request is larger than {MAX_REQUEST_BYTES} bytes ({len(data)})")
    return data


def _require_writable(request: Mapping[str, Any]) -> None:
    """``ValueError`` for what a request file cannot carry as it is: orjson writes NaN and
    infinities as ``null``, so ``"timeout": nan`` (a ``ValueError`` in-process) would run with
    no deadline at all, and it writes no integer past 64 bits nor text that is not UTF-8."""
    found = _nesting.unwritable_number_at(request)
    if found is not None:
        where, value = found
        raise ValueError(f"request value at {where or '/'} is {_nesting.describe_number(value)}")
    text_at = _nesting.unwritable_text_at(request)
    if text_at is not None:  # (the text itself is not shown: it may be a secret)
        raise ValueError(f"request value at {text_at or '/'} is not valid UTF-8 (it holds a lone surrogate)")


def request_cancel(home: Home, request_id: str) -> None:
    """Ask the daemon to cancel a queued or running request (idempotent)."""
    if not REQUEST_ID.fullmatch(request_id):
        raise ValueError(f"invalid request id {request_id!r}")
    # An empty marker needs no temporary file, and must not use one: the daemon scans this
    # folder, and a temporary name is itself a valid request id, so it was taken for a stale
    # marker and deleted before it could be renamed into place.
    # O_NONBLOCK: opened for writing, a FIFO at the name waited forever for a reader (`adaptor
    # cancel` and a Ctrl-C'd `adaptor run` hung).  The daemon goes by the name alone, so
    # whatever stands there (that FIFO, a symlink O_NOFOLLOW refuses) already asks for the cancel.
    try:
        fd = os.open(
            home.cancels / request_id,
            os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            0o600,
        )
    except OSError as exc:
        if exc.errno not in (errno.ENXIO, errno.ELOOP):  # a FIFO nobody reads, a symlink
            raise
    else:
        os.close(fd)
    _durable.fsync_dir(home.cancels)


# --- approvals as files ---------------------------------------------------------------------------
#
# Exactly-once is decided under one lock (approvals.lock) by whoever acts first: a responder
# (the CLI) writes responses/<id>.json; the daemon hands it to the run that asked and writes
# resolved/<id>.json with the outcome: the response's action, or "expired" when the run had
# ended or timed the request out first; when the run settles the request without a response
# (its deadline, its end) the daemon abandons it, writing "expired" whatever was written.

APPROVAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


class ResponseTextError(ValueError):
    """A reason or answer no response file can carry (not UTF-8, or too long): a usage error,
    raised before anything is written."""


def respond(home: Home, approval_id: str, action: str, *, text: str = "") -> bool:
    """Record a human response to a pending approval (``approve``, ``deny`` or ``answer``).

    True once the run took it; False when the daemon did not get to it within
    :data:`RESPONSE_TAKEN_WITHIN` (stopped, starved): the response stays written, and counts
    only if the run takes it before its deadline.

    Raises the approval responder errors: ``ApprovalUnavailableError`` (no such request),
    ``ApprovalResolvedError`` (another response won), ``ApprovalExpiredError`` (deadline or run
    end came first; no daemon serving the home means the run has ended),
    ``ApprovalKindMismatchError`` (wrong action for the kind; still open); and
    ``ResponseTextError`` for a ``text`` the daemon could not act on.
    """
    if action not in _ACTIONS:
        raise ValueError(f"unknown approval action {action!r}")
    if not APPROVAL_ID.fullmatch(approval_id):
        raise ApprovalUnavailableError(f"no pending approval {approval_id!r}")
    response = {
        "id": approval_id,
        "action": action,
        "text": text,
        "responded_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    data = _response_bytes(response)
    # A response file a script is still writing in place (not valid JSON yet) may be about to
    # win, or to be set aside: it is waited for, outside the lock (the daemon needs it), rather
    # than reported as the winner while the request may stay open.
    settles_by = time.monotonic() + 2 * RESPONSE_SETTLE
    handed_over_by = time.monotonic() + RESPONSE_TAKEN_WITHIN
    written = False
    try:
        while not _respond_once(
            home, approval_id, action, data,
            wait=time.monotonic() < settles_by, wait_handover=time.monotonic() < handed_over_by,
        ):
            time.sleep(0.05)
        written = True
        return _await_taken(home, approval_id, action)
    except KeyboardInterrupt as stop:
        # Stopped (Ctrl-C, a signal) while the daemon had not taken it: taken back, as a
        # stopped submit takes its request back, so that nothing the responder gave up on counts.
        # Stopped while writing it, too: the file is in place before the folder's sync ends.
        # ``response_taken_back``: True, False (it stands: written, perhaps taken), or None
        # (never written).
        try:
            removed = _take_back_response(home, approval_id, data)
        except KeyboardInterrupt:  # stopped again meanwhile: told by what is left
            removed = False
        taken_back: bool | None
        if removed:
            taken_back = True
        elif _stands(home, approval_id, action, data):
            taken_back = False
        else:
            taken_back = True if written else None
        stop.response_taken_back = taken_back  # type: ignore[attr-defined]
        raise


def _stands(home: Home, approval_id: str, action: str, data: bytes) -> bool:
    """Whether the response ``data`` is in force: still waiting for the daemon, or taken."""
    with contextlib.suppress(OSError):
        if (home.approvals_responses / f"{approval_id}.json").read_bytes() == data:
            return True
    try:
        if not (home.approvals_resolved / f"{approval_id}.json").exists():
            return False
        return _settled(home, approval_id, won_by=action) is None
    except (OSError, ValueError):
        return False


def _take_back_response(home: Home, approval_id: str, data: bytes) -> bool:
    """Remove the response ``data`` written for ``approval_id`` if the daemon has not taken it
    (False: it had, or the lock stayed held, by a stopped daemon, for a moment too long)."""
    give_up = time.monotonic() + RESPONSE_SETTLE
    path = home.approvals_responses / f"{approval_id}.json"
    try:
        with _durable.exclusive(home.approvals_lock, while_waiting=_lock_waited_too_long(give_up)):
            if path.read_bytes() != data:
                return False
            path.unlink()
            return True
    except (OSError, ApprovalsLockedError):
        return False


# How long a responder waits for the daemon to hand its response to the run (it looks for
# responses every quarter second, sooner when woken): only a daemon that does not get to run
# (stopped, starved) takes longer, and then the response is reported written, as before.
RESPONSE_TAKEN_WITHIN = 10.0


def _await_taken(home: Home, approval_id: str, action: str) -> bool:
    """Wait until the daemon took the response just written: True when the run took it, False
    when the daemon did not get to it within :data:`RESPONSE_TAKEN_WITHIN`; raise
    ``ApprovalExpiredError`` when it no longer could (its deadline fell between the writing
    and the taking, its run ended, the daemon stopped).

    Without this wait a response written a moment before the deadline was reported approved
    while the run failed with ``ApprovalTimeoutError``.
    """
    resolved = home.approvals_resolved / f"{approval_id}.json"
    give_up = time.monotonic() + RESPONSE_TAKEN_WITHIN
    while time.monotonic() < give_up:
        running = daemon_running(home)  # asked first: a daemon that took it and then stopped
        if resolved.exists():
            settled = _settled(home, approval_id, won_by=action)
            if settled is not None:
                raise settled
            return True  # the run took it
        if not running:
            # Gone before it took the response: its next start expires the request.
            raise ApprovalExpiredError(
                f"approval {approval_id!r} expired before this response: adaptord stopped "
                "before it took the response, which ended the run that asked"
            )
        time.sleep(0.02)
    # Not taken yet (a daemon stopped or starved).  Past the deadline it never counts: the run
    # times the request out once the daemon goes on.
    with contextlib.suppress(OSError, ValueError):
        past = _past_deadline(_read(home.approvals_pending / f"{approval_id}.json"))
        if past is not None:
            raise ApprovalExpiredError(
                f"approval {approval_id!r} expired before adaptord took this response: {past} "
                "while adaptord did not get to it (stopped or starved?)"
            )
    return False


class ApprovalsLockedError(TimeoutError):
    """The daemon held the approvals lock for :data:`RESPONSE_TAKEN_WITHIN` seconds (stopped or
    starved while holding it): the response was not written."""


def _lock_waited_too_long(give_up: float) -> Callable[[], None]:
    def check() -> None:
        if time.monotonic() >= give_up:
            raise ApprovalsLockedError(
                f"adaptord held the approvals lock for {RESPONSE_TAKEN_WITHIN:g} s (stopped or "
                "starved?); the response was not written: try again"
            )
    return check


def _respond_once(
    home: Home, approval_id: str, action: str, data: bytes, *, wait: bool, wait_handover: bool
) -> bool:
    """One try of :func:`respond`, under the lock: True once written, False when a response
    file still being written is to be waited for (only if ``wait``), or one waiting to be
    handed over to the run, whose outcome decides what this responder is told (only if
    ``wait_handover``, while a daemon serves the home).  A daemon stopped while it held the
    lock (its reaper lets it go a few milliseconds after its last use) is waited for
    :data:`RESPONSE_TAKEN_WITHIN` seconds at most: ``adaptor approve`` waited for ever."""
    give_up = time.monotonic() + RESPONSE_TAKEN_WITHIN
    with _durable.exclusive(home.approvals_lock, while_waiting=_lock_waited_too_long(give_up)):
        response_path = home.approvals_responses / f"{approval_id}.json"
        settled = _settled(home, approval_id)
        if settled is not None:
            raise settled
        held = _holds_response(home, response_path, approval_id)
        pending_path = home.approvals_pending / f"{approval_id}.json"
        try:
            pending: Mapping[str, Any] | None = _read(pending_path)
        except FileNotFoundError:
            pending = None
        # Asked before the response held: one that no run can take any more (its deadline
        # passed while the daemon did not get to it) won nothing, and a second responder told
        # "already resolved" would take it that someone's answer counted.
        ended = None if pending is None else _why_ended(home, pending)
        if ended is None and held == "writing" and wait:
            return False
        if ended is None and held == "usable" and wait_handover and daemon_running(home):
            # Won only once the run takes it: a run that ends first (cancelled, its daemon
            # stopping) expires it, and every responder was told "already resolved" before.
            return False
        if ended is None and held is not None:
            raise ApprovalResolvedError(
                f"approval {approval_id!r} was already resolved (a response is being handed over)"
            )
        if pending is None:
            raise ApprovalUnavailableError(f"no pending approval {approval_id!r}")
        if ended is not None:
            # Written now, the response would be reported accepted and never acted on.  The
            # pending file stays for the daemon, which expires it when the run ends or, for a
            # run a crash ended, at its next start: either way with the outcome in the audit
            # log, which a responder cannot write.  Listings leave it out meanwhile.
            _write_resolved(home, approval_id, "expired", why=ended)
            raise ApprovalExpiredError(f"approval {approval_id!r} expired before this response: {ended}")
        kind = pending.get("approval_kind")
        if action == "approve" and kind == "question":
            raise ApprovalKindMismatchError(
                f"approval {approval_id!r} is a question: answer it or deny it"
            )
        if action == "answer" and kind != "question":
            raise ApprovalKindMismatchError(
                f"approval {approval_id!r} is a {kind} request: approve or deny it"
            )
        _durable.atomic_write(response_path, data)
        return True


def _settled(home: Home, approval_id: str, won_by: str = "") -> ApprovalResolvedError | None:
    """What a response to ``approval_id`` gets once it is settled (its outcome is kept
    :data:`RESOLVED_KEPT_FOR`), or ``None`` while it is not, or when it was settled by the
    action ``won_by`` (the caller's own response)."""
    resolved_path = home.approvals_resolved / f"{approval_id}.json"
    if not resolved_path.exists():
        return None
    resolved = _read(resolved_path)
    result = resolved.get("result")
    if won_by and result == won_by:
        return None
    if result == "expired":
        # Every later responder is told why too, not only the one whose response found it.
        why = resolved.get("why")
        said = f": {why}" if isinstance(why, str) and why else ""
        return ApprovalExpiredError(f"approval {approval_id!r} expired before this response{said}")
    how = f" ({RESOLVED_AS[result]})" if result in RESOLVED_AS else ""
    return ApprovalResolvedError(f"approval {approval_id!r} was already resolved{how}")


def _response_bytes(response: Mapping[str, Any]) -> bytes:
    """The response file's content; ``ResponseTextError`` unless the daemon will act on it."""
    text: str = response["text"]
    what = "reason" if response["action"] == "deny" else "answer"
    if not isinstance(text, str):  # (an AttributeError from .encode() below, else)
        raise TypeError(f"the {what} must be a str, not {type(text).__name__}")
    if response["action"] == "answer" and not text:
        raise ResponseTextError("an answer needs an option (deny the question instead)")
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # (a non-UTF-8 command-line argument, surrogate-escaped)
        raise ResponseTextError(
            f"the {what} is not valid UTF-8 (character {exc.start + 1} of {len(text)})"
        ) from None
    data = _durable.json_bytes(response)
    if len(data) > RESPONSE_LIMIT:
        encoded = len(orjson.dumps(text)) - 2  # the text as it stands in the file
        room = RESPONSE_LIMIT - (len(data) - encoded)
        raise ResponseTextError(
            f"the {what} is too long: {len(text)} characters take {encoded} bytes in the "
            f"response file, and at most {room} fit (a response file holds at most "
            f"{RESPONSE_LIMIT} bytes; a character outside ASCII takes 2 to 4, a control "
            "character up to 6)"
        )
    return data


def answerable(home: Home, pending: Mapping[str, Any]) -> bool:
    """Whether a response to ``pending`` (a pending file's object) could still win, as far as
    the files tell: not settled, its deadline not passed.  Whether a daemon serves the home,
    which every run needs too, is the caller's to ask once for a whole listing."""
    approval_id = pending.get("id")
    if not isinstance(approval_id, str) or not APPROVAL_ID.fullmatch(approval_id):
        return False
    if (home.approvals_resolved / f"{approval_id}.json").exists():
        return False  # expired by a responder; the daemon removes the file when it audits it
    if os.path.lexists(home.approvals_responses / f"{approval_id}.json"):
        return False  # a response is being handed over: a later one is refused as resolved
    return _past_deadline(pending) is None


def _why_ended(home: Home, pending: Mapping[str, Any]) -> str | None:
    """Why the run that asked can no longer take a response, or ``None`` while it can."""
    past = _past_deadline(pending)
    if past is not None:
        return past
    # The daemon holds its lock for as long as it serves the home, and every run of a daemon
    # ends with it: with no holder, the run that asked is gone (a kill -9, a crash).
    if not daemon_running(home):
        return "adaptord is not running for this home, so the run that asked has ended"
    return None


def _past_deadline(pending: Mapping[str, Any]) -> str | None:
    deadline = _deadline_of(pending)
    if deadline is not None and datetime.now(UTC) >= deadline:
        return f"its deadline {pending['deadline']} has passed"
    return None


def _deadline_of(pending: Mapping[str, Any]) -> datetime | None:
    value = pending.get("deadline")
    if not isinstance(value, str):
        return None
    try:
        deadline = datetime.fromisoformat(value)
    except ValueError:
        return None  # not written by the daemon: the daemon's own clock still applies
    return deadline if deadline.tzinfo is not None else deadline.replace(tzinfo=UTC)


def take_response(
    home: Home,
    approval_id: str,
    apply: Callable[[dict[str, Any]], Mapping[str, Any] | None],
    refused: Callable[[str, str], None] | None = None,
) -> tuple[dict[str, Any], bool] | None:
    """The daemon's side: hand a written response to the run (``apply``) and mark the request
    resolved, or expired when ``apply`` says the run no longer took it (``None``).

    What ``apply`` returns for a response the run took (the outcome's ``choice``, ``text`` and
    ``resolved_at``, as the run's log would show them) is kept in the resolved file, so a
    restart after a crash can log the outcome the run's log missed (:func:`read_resolved`).
    Returns the response and whether it won, or ``None`` when none was written or the one
    written was set aside; ``refused(why, quarantined_name)`` is then told why, so the person
    who wrote it by hand can learn it.  ``apply`` runs under the approvals lock, so the
    resolved file always says what the run did.
    """
    with _durable.exclusive(home.approvals_lock):
        return _consume(home, approval_id, apply, refused)


def abandon(
    home: Home, approval_id: str, why: str, *, keep: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The run that asked has ended: expire the approval whatever response was written.

    ``why`` is what a response written later is told.  Returns the response that came too
    late (removed, never acted on), for the audit log.  ``keep``: the pending file's content,
    for the resolved file to keep (a restart's: see :func:`kept_requests`).
    """
    with _durable.exclusive(home.approvals_lock):
        response_path = home.approvals_responses / f"{approval_id}.json"
        try:
            late: dict[str, Any] | None = _read_response(response_path, home, approval_id)
        except FileNotFoundError:
            late = None
        except _Unusable:
            late = None
            _set_aside(home, response_path, approval_id)
        _write_resolved(home, approval_id, "expired", why=why, request=keep)
        _remove(home.approvals_pending / f"{approval_id}.json")
        _remove(response_path)
        return late


def refuse_unawaited(home: Home) -> list[tuple[str, str, str]]:
    """Set aside the response files no request waits for: each ``responses/<id>.json`` with no
    pending request, written by hand after its approval was settled, or for an id that never
    had one.  Nothing else would ever read them, and whoever wrote one would learn nothing.

    Returns ``(approval_id, why, quarantined_name)`` for each, ``why`` being what the CLI
    would have said.  Under the approvals lock a response file with no pending file is never
    one being handed over: :func:`respond` writes one only next to its pending file, and the
    daemon removes both at once.
    """
    try:
        names = sorted(entry.name for entry in os.scandir(home.approvals_responses))
    except FileNotFoundError:
        return []
    refused: list[tuple[str, str, str]] = []
    for name in names:
        # (".<id>.tmp": a script's response before its rename into place)
        if name.startswith(".") or not name.endswith(".json"):
            continue
        approval_id = name[: -len(".json")]
        if os.path.lexists(home.approvals_pending / name):
            continue  # its run's route reads it (or the next start expires it)
        with _durable.exclusive(home.approvals_lock):
            path = home.approvals_responses / name
            if os.path.lexists(home.approvals_pending / name) or not os.path.lexists(path):
                continue
            try:
                settled = _settled(home, approval_id) if APPROVAL_ID.fullmatch(approval_id) else None
            except (OSError, ValueError):
                settled = None
            why = str(settled) if settled is not None else f"no pending approval {approval_id!r}"
            quarantined = _set_aside(home, path, approval_id)
        refused.append((approval_id, why, quarantined))
    return refused


# How long the outcome of an approval is kept in ``resolved/`` (by the file's mtime, the moment
# it was resolved or expired): a response in that time still learns it came too late
# (ApprovalResolvedError, ApprovalExpiredError); after it, the id is unknown
# (ApprovalUnavailableError), as for an id that never existed.  A week outlasts a weekend
# and a stale notification; the daemon prunes at start and hourly (adaptord.daemon).
RESOLVED_KEPT_FOR = 7 * 24 * 3600.0


def prune_resolved(home: Home) -> None:
    """Remove the entries of ``approvals/resolved/`` last written more than
    :data:`RESOLVED_KEPT_FOR` ago (a crash's leftover temporary files included).

    Each is looked at again under the approvals lock before it goes, so :func:`respond`, which
    reads the file under that lock, never finds it half gone; the listing is made outside the
    lock, so responders are held up only by the removals.
    """

    def stale(path: str) -> bool:
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return False
        age = time.time() - found.st_mtime
        return not stat.S_ISDIR(found.st_mode) and age > RESOLVED_KEPT_FOR

    try:
        with os.scandir(home.approvals_resolved) as entries:
            candidates = [entry.path for entry in entries if stale(entry.path)]
    except FileNotFoundError:
        return
    if not candidates:
        return
    with _durable.exclusive(home.approvals_lock):
        for path in candidates:
            if stale(path):  # (written again meanwhile: kept)
                # Not synced: a removal a crash undoes is simply made again by the next prune.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def read_pending(home: Home, approval_id: str) -> dict[str, Any]:
    """The ``approvals/pending/<id>.json`` object (raises ``OSError``/``ValueError``)."""
    return _read(home.approvals_pending / f"{approval_id}.json")


# A response file a person or a script wrote by hand is acted on only if it is a regular file
# of at most RESPONSE_LIMIT bytes holding what the CLI would have written (_read_response).
# Anything else is set aside in quarantine/ at once, and the request stays pending; only
# invalid JSON younger than RESPONSE_SETTLE seconds is left for a writer that may be at it.
# respond() refuses to write a larger file (ResponseTextError).
RESPONSE_LIMIT = 64 * 1024
RESPONSE_SETTLE = 2.0
_ACTIONS = ("approve", "deny", "answer")
# A resolved file's result (the winning response's action) as the outcome's own word.
RESOLVED_AS: Final[dict[object, Literal["approved", "rejected", "answered"]]] = {
    "approve": "approved", "deny": "rejected", "answer": "answered",
}


def _consume(
    home: Home,
    approval_id: str,
    apply: Callable[[dict[str, Any]], Mapping[str, Any] | None],
    refused: Callable[[str, str], None] | None,
) -> tuple[dict[str, Any], bool] | None:
    response_path = home.approvals_responses / f"{approval_id}.json"
    try:
        response = _read_response(response_path, home, approval_id)
    except FileNotFoundError:
        return None
    except _Unusable as exc:
        if exc.final:
            name = _set_aside(home, response_path, approval_id)
            if refused is not None:
                refused(exc.why, name)
        return None
    kept = apply(response)
    won = kept is not None
    if kept is not None:
        _write_resolved(home, approval_id, str(response.get("action")), outcome=kept)
    else:
        _write_resolved(
            home, approval_id, "expired", why="the run no longer took it (its deadline or its end came first)"
        )
    _remove(home.approvals_pending / f"{approval_id}.json")
    _remove(response_path)
    return response, won


def _write_resolved(
    home: Home,
    approval_id: str,
    result: str,
    *,
    why: str = "",
    outcome: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
) -> None:
    """Record how an approval ended: the winning response's action (and ``outcome``, the
    settled outcome's details), or ``expired`` and why (and ``request``, the pending file's
    content, when a restart expired it)."""
    resolved: dict[str, Any] = {"id": approval_id, "result": result}
    if why:
        resolved["why"] = why
    if outcome is not None:
        resolved["outcome"] = dict(outcome)
    if request is not None:
        resolved["request"] = dict(request)
    _durable.atomic_write_json(home.approvals_resolved / f"{approval_id}.json", resolved)


def read_resolved(home: Home, approval_id: str) -> dict[str, Any] | None:
    """The ``approvals/resolved/<id>.json`` object, or ``None`` when there is none or it
    cannot be read (a restart's recovery decides without it)."""
    try:
        return _read(home.approvals_resolved / f"{approval_id}.json")
    except (OSError, ValueError):
        return None


def kept_requests(home: Home) -> dict[str, list[dict[str, Any]]]:
    """The approvals a restart expired, as their pending files held them, by the request id
    of the run that asked: what a run's log may lack (a crash between the pending file and
    the log's notice) once the pending file is gone (a second crash, or a start that failed,
    before that run's recovery logged it).

    Reads every resolved file: called only when a restart recovers a run that was going."""
    kept: dict[str, list[dict[str, Any]]] = {}
    try:
        names = sorted(entry.name for entry in os.scandir(home.approvals_resolved))
    except FileNotFoundError:
        return kept
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue  # (a crash's temporary file)
        resolved = read_resolved(home, name[: -len(".json")])
        request = None if resolved is None else resolved.get("request")
        if isinstance(request, dict) and is_request_id(request.get("request_id")):
            kept.setdefault(request["request_id"], []).append(request)
    return kept


class _Unusable(Exception):
    """A response file that cannot be acted on; ``final`` once waiting cannot mend it."""

    def __init__(self, final: bool, why: str) -> None:
        super().__init__(why)
        self.final = final
        self.why = why


def _read_response(path: Path, home: Home, approval_id: str) -> dict[str, Any]:
    """The response in ``path``, checked as the CLI would have checked it before writing it.

    Never blocks: a FIFO is opened without waiting for a writer and refused, like a directory,
    a device, a symlink or an oversized file.
    """
    try:
        data = _durable.read_small(path, RESPONSE_LIMIT)
    except FileNotFoundError:
        raise
    except (OSError, ValueError):  # a symlink (ELOOP), a FIFO, a directory, too large, ...
        raise _Unusable(
            final=True, why=f"not a regular file of at most {RESPONSE_LIMIT} bytes"
        ) from None
    try:
        # Windows editors and PowerShell's Out-File start UTF-8 text with a byte-order mark.
        response = orjson.loads(data.removeprefix(codecs.BOM_UTF8))
    except orjson.JSONDecodeError:
        # Perhaps still being written by a script that does not rename into place.
        try:
            young = time.time() - os.lstat(path).st_mtime < RESPONSE_SETTLE
        except OSError:
            young = False
        raise _Unusable(final=not young, why="not valid JSON") from None
    if not isinstance(response, dict) or response.get("action") not in _ACTIONS:
        raise _Unusable(
            final=True, why='not a JSON object whose "action" is approve, deny or answer'
        )
    if not isinstance(response.get("text", ""), str):
        raise _Unusable(final=True, why='its "text" is not a string')
    if response["action"] == "answer" and not response.get("text"):
        # an answer needs an option (the CLI refuses it too)
        raise _Unusable(final=True, why='an answer needs a non-empty "text"')
    try:
        kind = _read(home.approvals_pending / f"{approval_id}.json").get("approval_kind")
    except (OSError, ValueError):
        kind = None  # resolved or expired meanwhile: the caller's outcome stands either way
    action = response["action"]
    if (action == "approve" and kind == "question") or (
        action == "answer" and kind not in (None, "question")
    ):
        # the CLI refuses these and leaves the request open
        raise _Unusable(final=True, why=f"{action} does not fit a {kind} request")
    return response


def _holds_response(home: Home, path: Path, approval_id: str) -> Literal["usable", "writing"] | None:
    """Whether ``path`` holds a response the daemon will act on, or one that may be still
    being written (not valid JSON yet); ``None`` when neither (an unusable one is set aside)."""
    try:
        _read_response(path, home, approval_id)
    except FileNotFoundError:
        return None
    except _Unusable as exc:
        if not exc.final:
            return "writing"  # perhaps a script's response: it came first if it turns out whole
        _set_aside(home, path, approval_id)
        return None
    return "usable"


def _set_aside(home: Home, path: Path, approval_id: str) -> str:
    """Move a response file to ``quarantine/``; returns the name it has there ("" when it
    could not be moved, and was removed or left to be looked at again)."""
    target = home.quarantine / f"approval-response-{approval_id}-{secrets.token_hex(4)}"
    try:
        _durable.ensure_dir(home.quarantine)  # (a home no daemon has served yet lacks it)
        os.rename(path, target)
    except FileNotFoundError:
        return ""
    except OSError:
        with contextlib.suppress(OSError):  # (left in place, it is looked at again next time)
            os.unlink(path)
        return ""
    return target.name


def _read(path: Path) -> dict[str, Any]:
    value = _durable.read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

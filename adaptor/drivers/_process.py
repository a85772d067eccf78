"""The one subprocess runner every CLI driver uses.

A :class:`Child` is an agent CLI started in its own process group (``start_new_session``) with
stdout and stderr piped and stdin either closed at once (``/dev/null``), fed a fixed input and
closed, or driven by the driver (a stream-json control channel).  One pump thread reads both
pipes and splits them into lines; the driver's thread consumes them with :meth:`Child.lines`,
which also emits every chunk as a ``ProcessInfo`` event and keeps every byte for
``Response.raw_streams``.

Stopping is always about the group, never one pid: the npm launchers (``codex``) and node
wrappers re-spawn the real binary, and killing only the launcher leaves the model process
running.  :meth:`Child.terminate` sends SIGTERM to the group and SIGKILL after the grace
period; :meth:`Child.finish` reaps the leader and then clears whatever is left of the group the
same way, so no orphan outlives a run.

Cancellation and deadlines are watched by :meth:`Child.watch` on a thread of their own, so a
driver blocked in ``sink.request_decision`` or in a slow parser still gets its process stopped.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import errno
import os
import re
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Final, Literal, TypeVar

from adaptor import _cpus, _exiting, _procfs
from adaptor.driver import CancelSignal, EventSink, Response, RunFailure
from adaptor.events import ProcessInfo

try:
    import fcntl
except ImportError:  # not POSIX: pipes keep their size
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CannotStart",
    "Child",
    "Exit",
    "Line",
    "Spec",
    "cannot_start",
    "check_common",
    "check_grace_period",
    "child_env",
    "config_from_dict",
    "monotonic_deadline",
]

StreamName = Literal["stdout", "stderr"]

_READ_SIZE: Final = 65536
_POLL: Final = 0.05
# After the leader exits, how long the pipes may stay open (a grandchild holding them) before
# the rest of the group is stopped so the pump can see EOF.
_DRAIN_AFTER_EXIT: Final = 0.2
_KILL_WAIT: Final = 5.0
# How many bytes of read but unparsed output may wait for the driver.  Past it the pump stops
# reading, the pipe fills and the child waits in its write: a CLI (or something it started)
# printing faster than its driver parses held it all in memory, without bound, and after a
# deadline the driver still parsed the whole backlog (a 2 s deadline ended after 11 s).
_BACKLOG_BYTES: Final = 2 * 1024 * 1024
# What a queued line costs besides its bytes (the Line, its event, its parse): a flood of empty
# lines is held back too.
_LINE_COST: Final = 256
# A grace period past minutes would make a run's timeout and its cancel mean nothing for an
# agent that ignores SIGTERM (its worker taken for as long).
MAX_GRACE_PERIOD: Final = 300.0
MARK_VAR: Final = _procfs.MARK_VAR


@dataclass(frozen=True)
class Spec:
    """What to start.  ``env`` is the child's complete environment; ``env_names`` the names of
    the variables the driver added on top of the inherited ones (the only ones reported)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(repr=False)  # the child's, secrets included
    env_names: Sequence[str] = ()
    cwd: str | None = None
    stdin: bytes | Literal["closed", "driven"] = "closed"
    grace_period: float = 2.0
    shown_argv: Sequence[str] | None = None  # what the spawn event reports, if not ``argv``
    # The run's mark (MARK_VAR's value), when the driver must hand it on itself to processes
    # the CLI starts with an environment of its own making (codex's MCP servers); else new.
    mark: str | None = None
    # Bytes the stdout pipe should hold (best effort; None: the system's default, 64 KiB on
    # Linux), for a CLI that exits with what a full pipe could not take still queued and lost.
    stdout_capacity: int | None = None


def new_mark() -> str:
    """A fresh value for :data:`MARK_VAR`: what finds a run's processes that left its group."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Line:
    """One line of output (bytes, newline stripped); ``partial`` when the stream ended first.

    ``ending`` is what followed ``data`` in the stream (``\n``, ``\r\n``, or nothing for a
    partial line): parsers read ``data``, the captured raw streams keep every byte.
    """

    stream: StreamName
    data: bytes
    partial: bool = False
    ending: bytes = b"\n"

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True)
class Exit:
    """How the child ended.  ``exit_code`` is ``None`` when a signal ended it, or when its
    status could not be known (``unknown`` says why): never a clean exit then."""

    exit_code: int | None
    signal: int | None
    timed_out: bool = False
    cancelled: bool = False
    unknown: str = ""

    @property
    def clean(self) -> bool:
        return self.exit_code == 0 and self.signal is None and not self.timed_out

    def describe(self) -> str:
        if self.timed_out:
            return "timed out"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        if self.unknown:
            return f"exit status unknown: {self.unknown}"
        return f"exit code {self.exit_code}"


_RUNNING: Final = object()  # Child._status before the leader is reaped
_REAPED_ELSEWHERE: Final = (
    "something else in this program reaped the process (SIGCHLD ignored, or a handler or "
    "child watcher that waits for every child)"
)
_FORKED: Final = "the process belongs to the program that forked this one"


_CWD_PROBLEMS: Final = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "is not a directory",
    errno.EACCES: "cannot be entered (permission denied)",
}


class CannotStart(Exception):
    """The agent's process could not be started: its binary, or its working directory."""

    def __init__(self, message: str, details: Mapping[str, str], code: str = "infrastructure_error") -> None:
        super().__init__(message)
        self.details = dict(details)
        self.code = code

    @classmethod
    def binary(cls, binary: str, why: str, cwd: str | None = None) -> CannotStart:
        """Missing, or not executable: ``details.kind == "binary_not_found"`` (CLI exit 69).
        ``cwd``: the directory the child was started in."""
        interpreter = _missing_interpreter(binary, cwd) if why == "missing" else None
        if why != "missing":
            message = f"{binary}: {why}"
        elif interpreter is not None and interpreter.endswith("\r") and os.path.exists(interpreter[:-1]):
            message = (f"{binary}: its #! line ends in a carriage return (the file has Windows line "
                       f"ends), so its interpreter is {interpreter[:-1]} followed by one, which does not exist")
        elif interpreter is not None:
            # The file is there: exec's ENOENT is about the interpreter its #! line names.
            shown = interpreter if interpreter.isprintable() else repr(interpreter)  # (a "\r" in it)
            message = f"{binary}: its interpreter {shown} does not exist"
        elif os.sep in binary and not os.path.isabs(binary) and cwd is not None:
            # exec resolves it from the child's directory (the workspace), not from the
            # caller's: say where it was looked for, or "./review.sh: no such file" reads as
            # a lie to someone who has ./review.sh right there.
            message = (f"{binary}: no such file in {os.path.abspath(cwd)} (a relative command"
                       " is found from the run's working directory)")
        elif os.sep in binary:  # a path: PATH was never searched
            message = f"{binary}: no such file"
        else:
            # Whose PATH: a daemon's or a service's, which is seldom the shell's that found it.
            message = (f"{binary} not found on PATH (the PATH of the process that starts it, which a "
                       "service's or a daemon's may not share with your shell: give the driver's "
                       "command as the binary's full path)")
        return cls(message, {"kind": "binary_not_found", "binary": binary})

    @classmethod
    def too_long(cls, binary: str, argv: Sequence[str], env: Mapping[str, str]) -> CannotStart:
        """A command line the system refuses (E2BIG): ``unsupported_driver``, ``kind ==
        "argument_limit"``, as a driver's own size checks say it (codebuddy's)."""
        # Each string with its NUL, as the kernel counts them.  Shown by position or name and
        # size only: an argument may be a prompt, a variable's value a secret.
        arguments = [len(os.fsencode(arg)) + 1 for arg in argv]
        variables = {name: len(os.fsencode(f"{name}={value}")) + 1 for name, value in env.items()}
        longest = max(range(len(arguments)), key=arguments.__getitem__)
        biggest = max(variables, key=variables.__getitem__, default=None)
        limit = f"over the system's limit of {_MAX_ARG_BYTES - 1:,} bytes for one"
        if arguments[longest] > _MAX_ARG_BYTES:
            why = f"its argument {longest} is {arguments[longest] - 1:,} bytes, {limit}"
        elif biggest is not None and variables[biggest] > _MAX_ARG_BYTES:
            why = f"its environment variable {biggest} is {variables[biggest] - 1:,} bytes, {limit}"
        else:
            total = sum(arguments) + sum(variables.values())
            why = f"its command line and environment together ({total:,} bytes) are over the system's limit"
        return cls(f"{binary} cannot be started: {why} (E2BIG)", {"kind": "argument_limit"},
                   code="unsupported_driver")

    @classmethod
    def workspace(cls, binary: str, cwd: str, problem: str) -> CannotStart:
        """The working directory is missing or unusable: ``kind == "workspace_unusable"``."""
        return cls(
            f"{binary}: working directory {cwd} {problem}",
            {"kind": "workspace_unusable", "workspace": cwd},
        )


# What Linux reads of a #! line (BINPRM_BUF_SIZE), its newline included.
_SHEBANG_BYTES: Final = 256


def _head(binary: str, cwd: str | None) -> bytes | None:
    """The first line (at most 256 bytes) of the file exec ran for ``binary``, if readable."""
    found = os.path.join(cwd or "", binary) if os.sep in binary else shutil.which(binary)
    if found is None:
        return None
    try:
        with open(found, "rb") as program:
            return program.readline(_SHEBANG_BYTES)
    except OSError:
        return None


# How programs of other systems begin: ELF (another architecture), Windows' PE, Mach-O (32 and
# 64 bits, either byte order) and its universal binaries.
_PROGRAM_MAGICS: Final = (
    b"\x7fELF", b"MZ", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xce",
    b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe",
)


def _not_a_program(binary: str, cwd: str | None) -> str:
    """Why exec refused ``binary`` as a program (ENOEXEC), as far as its first bytes tell."""
    head = _head(binary, cwd)
    if head is None:
        return "not a program this system can run"
    if head.startswith(_PROGRAM_MAGICS):
        return "a program built for another system (its architecture or format cannot run here)"
    if head == b"":
        return "an empty file, not a program"
    if head.startswith(b"#!"):
        if len(head) >= _SHEBANG_BYTES and not head.endswith(b"\n"):
            return f"its #! line is longer than the system reads ({_SHEBANG_BYTES - 1} bytes)"
        # (A venv copied from another machine: its python is that machine's.)
        return f"its interpreter {_interpreter(head) or '(none named)'} is not a program this system can run"
    # A shell script without its #! line (a shell would run it; exec cannot).
    return "not a program this system can run (a script must begin with a #! line)"


def _interpreter(head: bytes) -> str | None:
    """The interpreter a ``#!`` line names, as exec reads it: up to a space, a tab or the
    newline, so a carriage return (a file with Windows line ends) is part of the name."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].lstrip(b" \t")
    name = re.split(rb"[ \t]", line, maxsplit=1)[0]
    return os.fsdecode(name) if name else None


def _missing_interpreter(binary: str, cwd: str | None) -> str | None:
    """The interpreter a ``#!`` script at ``binary`` names, when the script exists and that does not."""
    head = _head(binary, cwd)
    interpreter = None if head is None else _interpreter(head)
    if interpreter is None:
        return None
    return None if os.path.exists(interpreter) else interpreter


_NUL_IN_CWD = "holds a NUL character"
# Linux's limit on one argument or environment string, with its NUL (MAX_ARG_STRLEN).
_MAX_ARG_BYTES: Final = 32 * 4096


def workspace_problem(cwd: str) -> str | None:
    """What makes ``cwd`` unusable as a working directory (as a child's chdir would fail), or
    ``None``: for a driver that starts no process and must fail as one that does."""
    if "\0" in cwd:
        return _NUL_IN_CWD  # (os.stat raises ValueError for it, not OSError)
    try:
        found = os.stat(cwd)
    except OSError as exc:
        return _CWD_PROBLEMS.get(exc.errno or 0, exc.strerror or "cannot be used")
    if not stat.S_ISDIR(found.st_mode):
        return _CWD_PROBLEMS[errno.ENOTDIR]
    if not os.access(cwd, os.X_OK):
        return _CWD_PROBLEMS[errno.EACCES]
    return None


def cannot_start(error: CannotStart) -> Response:
    """The Response every driver returns when its CLI cannot be started."""
    return Response(
        exit_code=None,
        failure=RunFailure(code=error.code, message=str(error), details=error.details),
    )


def monotonic_deadline(deadline: datetime | None) -> float | None:
    """A request's wall-clock deadline on the monotonic clock the runner uses."""
    if deadline is None:
        return None
    return time.monotonic() + (deadline - datetime.now(UTC)).total_seconds()


# --- configuration plumbing every CLI driver's Config shares ------------------------------------

C = TypeVar("C")


def coerce_config(cls: type[C], config: object, driver: str) -> C:
    """A driver's ``Config``: given as is, or built from a JSON object with ``from_dict``."""
    if isinstance(config, cls):
        return config
    if isinstance(config, Mapping):
        built: C = cls.from_dict(config)  # type: ignore[attr-defined]
        return built
    raise TypeError(f"the {driver} driver expects a {driver}.Config, not {type(config).__name__}")


def config_from_dict(cls: type[C], obj: object) -> C:
    """Build a driver ``Config`` from a JSON object (daemon requests); unknown keys refused.

    JSON has lists where the dataclasses declare tuples; only the shape is fixed here, the
    driver's ``validate_config`` checks the values.
    """
    if not isinstance(obj, Mapping):
        raise TypeError(f"driver config must be an object, not {type(obj).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(key) for key in obj if key not in fields)
    if unknown:
        raise ValueError(f"unknown config key(s): {', '.join(unknown)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in obj.items()}
    return cls(**values)


def check_common(
    command: object, env: object, extra_args: object, cwd: object, grace_period: object
) -> None:
    """Validate the fields every CLI driver config has; ``TypeError``/``ValueError``."""
    if not isinstance(command, str) or not command:
        raise TypeError("command: expected a non-empty string (a binary name or path)")
    if not isinstance(env, Mapping):
        raise TypeError("env: expected an object of strings")
    for name, value in env.items():
        # Names are safe to show (they are reported anyway); values may be secrets.
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise TypeError("env: variable names must be non-empty strings without '=' or NUL")
        if not isinstance(value, str):
            raise TypeError(f"env: the value of {name} must be a string")
        if "\0" in value:  # no process environment can hold one: refused before anything starts
            raise ValueError(f"env: the value of {name} holds a NUL character")
    if not isinstance(extra_args, tuple) or not all(isinstance(a, str) for a in extra_args):
        raise TypeError("extra_args: expected a list of strings")
    if any("\0" in arg for arg in (command, *extra_args)):
        raise ValueError("command and extra_args cannot hold a NUL character")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise TypeError("cwd: expected a non-empty string or null")
    check_grace_period(grace_period)


def check_grace_period(grace_period: object) -> None:
    """``ValueError`` unless ``grace_period`` is a number of seconds from 0 to :data:`MAX_GRACE_PERIOD`."""
    if (
        not isinstance(grace_period, int | float)
        or isinstance(grace_period, bool)
        or not 0 <= grace_period <= MAX_GRACE_PERIOD
    ):
        raise ValueError(f"grace_period: expected a number of seconds from 0 to {MAX_GRACE_PERIOD:g}")


_withheld: frozenset[str] = frozenset()


def withhold_from_agents(names: Iterable[str]) -> None:
    """Keep these variables of this process's environment from every agent started from now
    on (in place of those given before): credentials of the host's own (a daemon's A2A
    tokens) that no agent needs, and that an agent told to print its environment would
    otherwise show.  A driver's ``Config.env`` may still set them."""
    global _withheld
    _withheld = frozenset(names)


def child_env(*layers: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The child's environment (this process's but what :func:`withhold_from_agents` keeps
    back, then each layer on top) and the names the layers set — the only names a spawn event
    reports, and never a value."""
    withheld = _withheld
    env = {k: v for k, v in os.environ.items() if k not in withheld} if withheld else dict(os.environ)
    names: set[str] = set()
    for layer in layers:
        env.update(layer)
        names.update(layer)
    return env, sorted(names)


def secret_values(env: Mapping[str, str], credentials: Iterable[str] = ()) -> list[str]:
    """What a driver's ``secret_values()`` returns: every value of its config's ``env`` (where
    keys are given; which of them are secret cannot be told apart) and the values of the
    ``credentials`` variables its CLI reads that this process's environment holds, which the
    child inherits.  Other inherited variables are not secrets: the SDK would otherwise have
    to treat PATH and HOME like keys."""
    values = [v for v in env.values() if isinstance(v, str)]
    values += [os.environ[name] for name in credentials if os.environ.get(name)]
    return values


_EOF: Final = object()


class _Backlog:
    """The lines the pump read and the driver has not taken yet, bounded by
    :data:`_BACKLOG_BYTES` (one line always fits, however long) until :meth:`unbound`."""

    def __init__(self) -> None:
        self._items: collections.deque[Line | object] = collections.deque()
        self._bytes = 0
        self._bounded = True
        self._full = False  # the pump waits for room: the pipes hold what it has not read
        # The pump holds stdout bytes after the last newline (a line still being written):
        # set by the pump alone, read by may_hold_stdout().
        self.partial_stdout = False
        self._changed = threading.Condition()

    def put(self, line: Line) -> None:
        """Queue ``line``, waiting while the backlog is full."""
        size = len(line.data) + _LINE_COST
        with self._changed:
            while self._bounded and self._items and self._bytes + size > _BACKLOG_BYTES:
                self._full = True
                self._changed.wait()
            self._full = False
            self._items.append(line)
            self._bytes += size
            self._changed.notify_all()

    def end(self) -> None:
        with self._changed:
            self._items.append(_EOF)
            self._changed.notify_all()

    def get(self) -> Line | object:
        """The next line, or :data:`_EOF` (which stays queued for later calls)."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item = self._items[0]
            if item is not _EOF:
                self._items.popleft()
                assert isinstance(item, Line)
                self._bytes -= len(item.data) + _LINE_COST
                self._changed.notify_all()
            return item

    def unbound(self) -> None:
        """Let the pump queue without waiting: nobody may read any more (the run is over), and
        a pump waiting for room would never see the pipes close."""
        with self._changed:
            self._bounded = False
            self._changed.notify_all()

    def may_hold_stdout(self) -> bool:
        """A stdout line is waiting, or may be: while the backlog is full (of stderr, say), what
        the pipes hold is not read; bytes without their newline yet are a line begun."""
        with self._changed:
            return self._full or self.partial_stdout or any(
                isinstance(item, Line) and item.stream == "stdout" for item in self._items
            )


@dataclass
class _Capture:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)


_F_SETPIPE_SZ: Final[int | None] = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl else None


def _widen_pipe(pipe: IO[bytes] | None, capacity: int | None) -> None:
    """Let ``pipe`` hold ``capacity`` bytes; done before any input is fed, so before the CLI
    can print what answers it."""
    if pipe is None or capacity is None or _F_SETPIPE_SZ is None:
        return
    # Refused past /proc/sys/fs/pipe-max-size for an unprivileged user, or once the user's
    # pipes hold their soft limit of pages (EPERM): the pipe stays as it was.  (Only the CLIs
    # that need it ask: every widened pipe counts against that limit while it lives.)
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, capacity)


class Child:
    """A running agent CLI.  Create with :meth:`start`; always end with :meth:`finish`."""

    def __init__(self, spec: Spec, proc: subprocess.Popen[bytes], mark: bytes = b"") -> None:
        self.spec = spec
        self.pid = proc.pid
        self._proc = proc
        self._mark = mark  # b"ADAPTOR_RUN_MARK=<value>" as its environment holds it
        self._lines = _Backlog()
        self._stdin_lock = threading.Lock()
        self._capture = _Capture()
        self._capture_lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._stopping: threading.Thread | None = None
        self._reason: Literal["", "cancelled", "timed_out"] = ""
        self._cancelled: CancelSignal | None = None  # the run's, once watched
        # The leader's exit code as os.waitstatus_to_exitcode gives it, None once it is known
        # to be lost (see _reaped), _RUNNING before.
        self._status: int | None | object = _RUNNING
        self._reap_lock = threading.Lock()
        self._disowned = ""  # why not: in a forked copy of the program that started it
        _agents[self.pid] = self
        self._pump = threading.Thread(target=self._pump_loop, name=f"adaptor-pump-{proc.pid}",
                                      daemon=True)
        self._pump.start()
        if isinstance(spec.stdin, bytes):
            threading.Thread(target=self._feed, args=(spec.stdin,), daemon=True).start()

    # --- starting -------------------------------------------------------------------------------

    @classmethod
    def start(cls, spec: Spec, sink: EventSink) -> Child:
        """Start ``spec`` and emit its ``process.spawn`` event; raises :class:`BinaryNotFound`."""
        binary = spec.argv[0]
        if spec.cwd is not None and "\0" in spec.cwd:
            # No path holds one (Popen's ValueError "embedded null byte" failed the run as the
            # driver's own error): the directory is unusable, as a missing one is.
            raise CannotStart.workspace(binary, spec.cwd.replace("\0", "\\0"), _NUL_IN_CWD)
        stdin: int = subprocess.DEVNULL if spec.stdin == "closed" else subprocess.PIPE
        mark = spec.mark or new_mark()
        env = {**spec.env, MARK_VAR: mark, **_procfs.started_by_me()}
        try:
            with _cpus.for_children(), _spawning():
                proc = subprocess.Popen(
                    list(spec.argv),
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=spec.cwd,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                )
                _agents[proc.pid] = None
        except OSError as exc:
            # subprocess names the path that failed: the working directory (the child's chdir)
            # or the binary (its exec).  Each fails with the same errors, for other reasons.
            if spec.cwd is not None and exc.filename == spec.cwd:
                problem = _CWD_PROBLEMS.get(exc.errno or 0, exc.strerror or "cannot be used")
                raise CannotStart.workspace(binary, spec.cwd, problem) from exc
            if isinstance(exc, FileNotFoundError):
                raise CannotStart.binary(binary, "missing", spec.cwd) from exc
            if isinstance(exc, PermissionError):
                raise CannotStart.binary(binary, _why_not_executable(binary, spec.cwd)) from exc
            if exc.errno == errno.ENOEXEC:
                raise CannotStart.binary(binary, _not_a_program(binary, spec.cwd)) from exc
            if exc.errno == errno.E2BIG:
                raise CannotStart.too_long(binary, spec.argv, env) from exc
            raise
        _widen_pipe(proc.stdout, spec.stdout_capacity)
        sink.emit(
            ProcessInfo(
                kind="spawn",
                data={
                    "argv": list(spec.argv if spec.shown_argv is None else spec.shown_argv),
                    "env": sorted(spec.env_names),
                    "cwd": spec.cwd or os.getcwd(),
                    "pid": proc.pid,
                },
            )
        )
        _note_exits()
        try:
            return cls(spec, proc, f"{MARK_VAR}={mark}".encode())
        except BaseException:  # no thread for its pipes (a task limit): it must not run unread
            _procfs.send_group(proc.pid, signal.SIGKILL)
            proc.wait()
            _agents.pop(proc.pid, None)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            raise

    # --- stdin ----------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self.send(data)
        self.close_stdin()

    def send(self, data: bytes) -> bool:
        """Write to a piped stdin; ``False`` once it is closed or the child went away."""
        with self._stdin_lock:
            pipe = self._proc.stdin
            if pipe is None or pipe.closed:
                return False
            try:
                pipe.write(data)
                pipe.flush()
            except (BrokenPipeError, OSError, ValueError):
                return False
            return True

    def close_stdin(self) -> None:
        with self._stdin_lock:
            pipe = self._proc.stdin
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()

    # --- output ---------------------------------------------------------------------------------

    def _pump_loop(self) -> None:
        selector = selectors.DefaultSelector()
        # A line's pieces until its newline arrives.  Only each new chunk is searched and a
        # line is joined once: re-joining and re-splitting the whole pending line per chunk
        # was quadratic, and bytes work holds the GIL (a 32 MB line without a newline took
        # 9 s and starved every other thread of the process for most of it).
        pending: dict[StreamName, list[bytes]] = {"stdout": [], "stderr": []}
        assert self._proc.stdout is not None and self._proc.stderr is not None
        for pipe, name in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ, name)
        exited_at: float | None = None
        escaped_stopped = False
        next_check = 0.0
        try:
            while selector.get_map():
                ready = selector.select(timeout=_POLL * 2)
                for key, _ in ready:
                    stream: StreamName = key.data
                    try:
                        chunk = os.read(key.fd, _READ_SIZE)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        selector.unregister(key.fileobj)
                        self._put_partial(stream, pending[stream])
                        continue
                    pieces = pending[stream]
                    if b"\n" not in chunk:
                        pieces.append(chunk)
                        if stream == "stdout":
                            self._lines.partial_stdout = True
                        continue
                    *complete, tail = chunk.split(b"\n")
                    if pieces:
                        complete[0] = b"".join((*pieces, complete[0]))
                        pieces.clear()
                    if tail:
                        pieces.append(tail)
                    if stream == "stdout":
                        self._lines.partial_stdout = bool(tail)
                    for data in complete:
                        if data.endswith(b"\r"):
                            self._lines.put(Line(stream, data[:-1], ending=b"\r\n"))
                        else:
                            self._lines.put(Line(stream, data))
                now = time.monotonic()
                if ready and now < next_check:
                    continue
                # Quiet pipes, or a while of output: if the leader is gone, whoever still holds
                # them is a leftover of its group.  Stop the group so the pipes close; give up
                # on a process that escaped the group (setsid) once the stop sequence is over.
                # (Looked at only when the pipes fell quiet, a leftover that kept writing, a
                # dev server's log, kept the run from ending for ever, past its deadline.)
                next_check = now + _POLL * 2
                if exited_at is None and self._reaped(block=False):
                    exited_at = now
                if exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT:
                    self.terminate(self._reason)
                    if not escaped_stopped and not self._group_alive():
                        # Only processes that left the group (`setsid server &`) hold the
                        # pipes: stop them now.  Waiting out the group's grace first delayed
                        # every such run by it, long enough for its deadline to pass.
                        escaped_stopped = True
                        self._stop_escaped()
                    if now > self._kill_at(exited_at + _DRAIN_AFTER_EXIT) + 1.0:
                        break
        finally:
            for stream, pieces in pending.items():
                self._put_partial(stream, pieces)
            selector.close()
            self._lines.end()

    def _put_partial(self, stream: StreamName, pieces: list[bytes]) -> None:
        """Queue what was read after a stream's last newline, if anything, as a partial line."""
        if pieces:
            self._lines.put(Line(stream, b"".join(pieces), partial=True, ending=b""))
            pieces.clear()

    def lines(self, sink: EventSink) -> Iterator[Line]:
        """Every output line until both pipes close; each is emitted and captured first.

        A persistent child's driver stops iterating at its turn's terminal event instead.
        """
        while True:
            item = self._lines.get()
            if item is _EOF:
                return
            assert isinstance(item, Line)
            raw = item.data + item.ending
            with self._capture_lock:
                (self._capture.stdout if item.stream == "stdout" else self._capture.stderr).extend(raw)
            sink.emit(ProcessInfo(kind=item.stream, text=raw.decode("utf-8", "replace")))
            yield item

    def take_raw(self) -> tuple[str, str]:
        """The stdout and stderr captured since the last call (a persistent child's turn)."""
        with self._capture_lock:
            out, err = bytes(self._capture.stdout), bytes(self._capture.stderr)
            self._capture = _Capture()
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    # --- stopping -------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._disowned and not self._reaped(block=False)

    def _reaped(self, *, block: bool) -> bool:
        """Whether the leader has exited, reaping it (waiting for that if ``block``).

        Not ``Popen.poll``/``wait``: when something else in the program reaps every child
        (SIGCHLD set to ``SIG_IGN``, a handler or an asyncio child watcher calling
        ``waitpid(-1)``) they take the status nobody can read any more for exit code 0, and a
        failed agent passed for a successful one.  Here that status is unknown: never clean.
        """
        if self._status is not _RUNNING:
            return True
        if not self._reap_lock.acquire(blocking=block):
            return False  # another thread is reaping it right now
        try:
            if self._status is _RUNNING:
                try:
                    pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
                except ChildProcessError:
                    self._status = None
                else:
                    if pid == 0:
                        return False
                    self._status = os.waitstatus_to_exitcode(status)
                # Popen must not wait for it again, nor keep it as a child still to reap.
                self._proc.returncode = -1 if self._status is None else self._status
        finally:
            self._reap_lock.release()
        return True

    def _group_alive(self) -> bool:
        """Whether a process of the agent's group still runs.  Its ended members that are this
        process's own children (re-parented to it as PID 1, or as a subreaper) are reaped first:
        without a /proc of ours to tell a zombie from a process, ``killpg`` answers for them,
        and every run waited out its grace.  Never before the leader is reaped: its status is
        the run's."""
        if self._status is not _RUNNING:
            _reap_ended_members(self.pid)
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if not _procfs.usable():
            return True  # no /proc of ours: trust killpg
        return _procfs.group_running(self.pid)  # (zombies cannot be killed anyway)

    @property
    def quiet(self) -> bool:
        """No stdout line is waiting to be read: a persistent child printed nothing after its
        turn's terminal event (what it did print would be read as the next turn's)."""
        return not self._lines.may_hold_stdout()

    @contextlib.contextmanager
    def watch(self, cancelled: CancelSignal, deadline: float | None) -> Iterator[None]:
        """While inside, stop the group when ``cancelled`` is set or ``deadline`` passes."""
        self._cancelled = cancelled
        done = threading.Event()

        def watchdog() -> None:
            while not done.is_set():
                wait = _POLL if deadline is None else min(_POLL, max(deadline - time.monotonic(), 0))
                if cancelled.wait(wait):
                    if not done.is_set():
                        self.terminate("cancelled")
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    self.terminate("timed_out")
                    return

        thread = threading.Thread(target=watchdog, name=f"adaptor-watch-{self.pid}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def terminate(self, reason: Literal["", "cancelled", "timed_out"] = "") -> None:
        """Stop the whole group: SIGTERM now, SIGKILL after the grace period.  Returns at once
        (:meth:`finish` waits for it), unless no thread can be started to do it (a task limit):
        then it returns once the group is gone."""
        if self._disowned:
            return
        with self._stop_lock:
            if self._stopping is not None:
                return
            self._reason = reason
            # stdin is left to finish(): a writer blocked on a full pipe holds its lock, and the
            # signals below are what unblock it.
            stopping = threading.Thread(target=self._stop_group, daemon=True)
            try:
                stopping.start()
            except RuntimeError:
                pass
            else:
                self._stopping = stopping
                return
        self._stop_group()  # outside the lock: finish() may be waiting for it

    def _kill_at(self, began: float) -> float:
        """When a SIGTERM sent at ``began`` is followed by SIGKILL: after the grace period, or
        :data:`GRACE_AT_EXIT` into the program's exit, whichever comes first; at once when the
        exit's wait was cut short, or the run's stop is to be (its cancel signal's ``at_once``:
        a second Ctrl-C).  Asked on every poll, as either may come meanwhile."""
        if _exiting.cut_short or getattr(self._cancelled, "at_once", False):
            return began
        if _exiting.began is None:
            return began + self.spec.grace_period
        return min(began + self.spec.grace_period, _exiting.began + GRACE_AT_EXIT)

    def _stop_group(self) -> None:
        if self._disowned:
            return
        _procfs.send_group(self.pid, signal.SIGTERM)
        began = time.monotonic()
        while time.monotonic() < self._kill_at(began):
            self._reaped(block=False)
            if not self._group_alive():
                return
            time.sleep(_POLL)
        _procfs.send_group(self.pid, signal.SIGKILL)
        # SIGKILL is asynchronous: return only once the group is really gone (or clearly stuck
        # in the kernel), so a finished run never leaves a live process behind.
        until = time.monotonic() + _KILL_WAIT
        while time.monotonic() < until:
            self._reaped(block=False)
            if not self._group_alive():
                return
            time.sleep(_POLL / 5)

    def abandon(self) -> None:
        """Stop the whole group and reap it, from this thread: the run failed with it still up.

        Needs no thread of its own (:meth:`terminate` starts one), so it also works when the
        failure was that no thread could be started.
        """
        self._stop_group()
        with contextlib.suppress(Exception):
            self.finish()

    def finish(self) -> Exit:
        """Wait for the leader, stop what is left of its group and what escaped it, drain the
        pipes and reap."""
        if self._disowned:
            return Exit(exit_code=None, signal=None, unknown=self._disowned)
        self._lines.unbound()
        self._reaped(block=True)
        self._pump.join()  # ends by itself: EOF, or the leftover group stopped (see the pump)
        if self._group_alive():
            self.terminate(self._reason)
        with self._stop_lock:
            stopping = self._stopping
        if stopping is not None:
            stopping.join()
        self._stop_escaped()
        self.close_stdin()
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        _agents.pop(self.pid, None)
        reap_orphans()
        code = self._status
        assert code is None or isinstance(code, int)
        return Exit(
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            timed_out=self._reason == "timed_out",
            cancelled=self._reason == "cancelled",
            unknown=_REAPED_ELSEWHERE if code is None else "",
        )

    def _disown(self, null: int) -> None:
        """In a forked copy of the program: leave the process to the program that started it.

        The copy's descriptors of its pipes now read ``/dev/null`` (so the copy holds no end
        of them: the agent still sees the end of its input when its program closes it, not
        when every forked worker has exited), and nothing here signals or reaps it.
        """
        self._disowned = _FORKED
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if pipe is not None and not pipe.closed:
                # dup2 over the same number rather than close: the file object still closes
                # that number one day, which must not be some other file's by then.
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(null, pipe.fileno(), inheritable=False)


    def _stop_escaped(self) -> None:
        """Stop the processes that left the group but carry this child's mark: SIGTERM, then
        SIGKILL after the grace period.  (Another user's processes cannot be read, nor could
        they be signalled.)"""
        if self._disowned or not self._mark or not _procfs.usable():
            return
        escaped = [(pid, found.start) for pid, found in _procfs.carrying(self._mark)]
        for pid, _ in escaped:
            _procfs.send(pid, signal.SIGTERM)
        began = time.monotonic()
        while escaped and time.monotonic() < self._kill_at(began):
            time.sleep(_POLL)
            escaped = [(pid, start) for pid, start in escaped if _procfs.running(pid, start)]
        # Looked for again (more than once), not only those found: a process that forks a copy
        # of itself and exits, again and again, is another process by now, and a look may miss
        # one that lives a few milliseconds.
        _procfs.kill_carrying(self._mark)


# Every agent this process started and has not finished: its pid from the moment Popen returns
# (None until its Child is made), for the reaping below to leave alone and for a forked copy
# of the program to disown (see _disown_in_forked_copy).
_agents: dict[int, Child | None] = {}

# As PID 1 (a container's main process with no init), the processes the agents leave behind
# are re-parented to this one, and nobody else reaps them: their zombies piled up (two per
# request of an agent that starts a background job).  They are reaped here: those of other
# sessions than the program's (every agent starts a session of its own; the program's own
# children stay its to wait for), never an agent in _agents (its Child reaps it, and needs its
# status); a spawn and a reaping exclude each other, so no agent is seen before it is listed.
_reaping = threading.Lock()


def _spawning() -> contextlib.AbstractContextManager[object]:
    return _reaping if os.getpid() == 1 else contextlib.nullcontext()


def reap_orphans() -> None:
    """As PID 1, reap the ended processes re-parented to this one (see above)."""
    if os.getpid() != 1 or not _procfs.usable():
        return
    with _reaping:
        for pid in _procfs.zombie_children(1, outside_session=os.getsid(0)):
            if pid not in _agents:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def _disown_in_forked_copy() -> None:
    global _reaping
    _reaping = threading.Lock()  # perhaps held by a thread the copy does not have
    children = [child for child in _agents.values() if child is not None]
    _agents.clear()
    if not children:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        for child in children:
            child._disown(null)
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disown_in_forked_copy)


GRACE_AT_EXIT: Final = 5.0
"""Seconds an agent still running when the program exits gets between SIGTERM and SIGKILL, at
most: the SDK waits 10 s at exit for its runs to stop (a daemon thread dies with the program),
and a longer ``grace_period`` left a SIGTERM-ignoring agent running on its own, for good."""

_exits_noted = False


def _note_exits() -> None:
    """Have the exit noted, before the SDK's own exit handler waits for the runs to stop.

    Registered at the first start, after the SDK's handler (imported with ``adaptor``):
    exit handlers run last-registered first.
    """
    global _exits_noted
    if not _exits_noted:
        _exits_noted = True
        atexit.register(_exiting.begin)


def _why_not_executable(binary: str, cwd: str | None) -> str:
    """Why exec refused ``binary`` (EACCES): its mode, or, for a file whose mode lets it run, the
    filesystem it is on (mounted ``noexec``, as /tmp often is)."""
    if os.sep in binary:
        path = os.path.join(cwd or "", binary)  # (as exec finds a relative one: from the child's cwd)
    else:
        path = shutil.which(binary) or binary
    try:
        if os.stat(path).st_mode & 0o111 and os.statvfs(path).f_flag & os.ST_NOEXEC:
            return "not executable: the filesystem it is on is mounted noexec"
    except OSError:
        pass
    return "not executable"


def _reap_ended_members(pgid: int) -> None:
    """Reap the ended processes of group ``pgid`` that are children of this one (none, unless
    they were re-parented to it)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return



"""What every ``adaptor`` command shares: the ``--home``/``--json`` options, exit codes, error
reports (``--json`` shape on stdout, human text on stderr) and one-line event summaries."""

from __future__ import annotations

import functools
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, cast

import click
import orjson

from adaptor import _exiting, _home, _nesting, errors, events
from adaptor.spool import (
    Client,
    DaemonNotRunningError,
    ForeignHomeError,
    SpoolNotFoundError,
    UnknownRequestError,
    UnservableHomeError,
    WaitTimeoutError,
    _read_state,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

P = ParamSpec("P")
R = TypeVar("R")

EXIT_UNAVAILABLE = 69
EXIT_WAIT_TIMEOUT = 124
EXIT_INTERRUPTED = 128 + signal.SIGINT

# Exits by a signal, 128 + its number as shells report them: not outcomes, so not in the
# spec's table (errors.EXIT_CODES), but printed with it by `adaptor exit-codes`.
SIGNAL_EXITS: tuple[tuple[int, str], ...] = (
    (128 + signal.SIGHUP, "SIGHUP (the terminal closed): as SIGTERM"),
    (
        EXIT_INTERRUPTED,
        "Ctrl-C (SIGINT): the command stopped; adaptor run cancels its request first (with "
        "--json, the object says CancelledError)",
    ),
    (128 + signal.SIGTERM, "SIGTERM (kill, timeout --preserve-status): as Ctrl-C"),
)


def _home_named(ctx: click.Context, param: click.Parameter, flag: str | None) -> str | None:
    # daemon.md fixes the order: ADAPTORD_HOME, else --home, else the XDG default.  A flag the
    # variable overrides is said out loud, so that nobody serves or reads a home they did not mean.
    if flag == "":
        raise click.BadParameter("is empty; name a directory (an empty path would be the current one)", ctx=ctx, param=param)
    variable = os.environ.get("ADAPTORD_HOME")
    if not variable:
        if flag is None and os.environ.get("ADAPTOR_HOME"):
            # Named by analogy with ADAPTOR_DRIVER, it sent every command to the default home
            # without a word.
            echo(f"{ctx.find_root().info_name}: ADAPTOR_HOME is not read; the home is named by "
                 f"ADAPTORD_HOME (the daemon's) or --home, else {_home.default_home()}", err=True)
        return flag
    # (The same directory by another path, a symlink say, is no conflict.)
    if flag is not None and os.path.realpath(_home.Home.at(flag).root) != os.path.realpath(_home.Home.at(variable).root):
        echo(f"{ctx.find_root().info_name}: ADAPTORD_HOME={variable} takes precedence over --home {flag}", err=True)
    return variable


def home_option(func: Callable[P, R]) -> Callable[P, R]:
    return click.option(
        "--home",
        # Any path: one that cannot be a home (a file in the way) is the daemon's to refuse
        # (exit 69, which a systemd unit does not restart on), not a usage error.
        type=click.Path(),
        callback=_home_named,
        help="The daemon's home directory, used when $ADAPTORD_HOME is not set (default: "
        "$XDG_STATE_HOME/adaptord).",
    )(func)


def json_option(func: Callable[P, R]) -> Callable[P, R]:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help='Print one JSON object on stdout: {"ok": true, ...} or '
        '{"ok": false, "exit_code": N, "error": {...}}.',
    )(func)


def read_request(file: IO[bytes]) -> dict[str, Any]:
    """The JSON object of a request file, read as the daemon reads one (``_request.decode``);
    ``InvalidRequestError`` (exit 2) when it holds none."""
    # Imported here: its schema validation is not what every command's start should pay for.
    from adaptor import _request

    return _request.decode(file.read())


def require_daemon(client: Client) -> None:
    if not _home.daemon_running(_home.Home.at(client.home)):
        raise DaemonNotRunningError(client.home)


_DAEMON_CHECK_INTERVAL = 2.0


@contextmanager
def telling_when_the_daemon_stops(
    client: Client, request_id: str, say: Callable[[str], None], *, ctrl_c: str
) -> Iterator[None]:
    """While the body waits for ``request_id``'s verdict, ``say`` when the daemon stops serving
    the home (and what its next start will do with the request), and when it serves again.
    ``ctrl_c`` says what an interrupt would do.

    The wait goes on either way: the next start runs a queued request and gives an interrupted
    one its verdict (or runs it again), as a supervisor restarting the daemon expects.  Without
    a word, a person at the terminal could not tell a stopped daemon from a slow agent.
    """
    home = _home.Home.at(client.home)
    done = threading.Event()
    said_stopped = threading.Event()

    def watch() -> None:
        serving = True
        while not done.wait(_DAEMON_CHECK_INTERVAL):
            try:
                now = _home.daemon_running(home)
            except OSError:
                continue
            if now == serving:
                continue
            serving = now
            if serving:
                said_stopped.clear()
                say("adaptor: adaptord serves again")
            else:
                said_stopped.set()
                say(f"adaptor: adaptord stopped; {_after_restart(home, request_id)} (Ctrl-C {ctrl_c})")

    watcher = threading.Thread(target=watch, name="adaptor-daemon-watch", daemon=True)
    try:
        watcher.start()
    except RuntimeError:  # no thread to spare (a task limit): the wait goes on without notices
        yield
        return
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=1)
        # A restart whose verdict came before the next look: said all the same, or the last
        # word about the daemon would be that it stopped.
        if said_stopped.is_set() and not watcher.is_alive():
            with suppress(OSError):
                if _home.daemon_running(home):
                    say("adaptor: adaptord serves again")


def _after_restart(home: _home.Home, request_id: str) -> str:
    """What the daemon's next start does with ``request_id``, said as the daemon stops.

    A queued request runs then; a running one was interrupted, and the restart gives it its
    verdict unless it asked to run again: the rule the daemon's recovery follows.
    """
    if home.verdict(request_id).exists():
        return f"{request_id} has its verdict"
    state = {}
    if not (home.spool_new / f"{request_id}.json").exists():  # else not claimed, or handed back
        state = _read_state(home, request_id)
    try:
        outcome = _home.after_restart(state)
    except (TypeError, ValueError):  # an attempt count that is no number: nothing to promise
        return f"{request_id} waits for the daemon's next start"
    if outcome == "queued":
        return f"{request_id} keeps its place and runs when the daemon starts again"
    if outcome == "requeue":
        return (
            f"{request_id} was running: the next start runs it again (on_interrupt requeue, "
            f"attempt {int(state['attempt']) + 1} of {_home.MAX_ATTEMPTS})"
        )
    if state.get("on_interrupt", "fail") != "requeue":
        why = "on_interrupt fail"
    elif _home.thread_turn_kept_back(state):
        why = "a thread's turn, whose agent may already have the prompt"
    else:
        why = "its attempts are used up"
    return f"{request_id} was running and does not run again ({why}): the next start gives it its verdict (interrupted)"


# --- output -------------------------------------------------------------------------------------


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` on stdout (or stderr): every line of text ``adaptor`` prints goes through
    here (JSON goes through :func:`emit_json`, and ``run``'s live view draws on the terminal).

    To a pipe or a file the text goes out as it is, byte for byte (``click.echo`` alone strips
    ANSI escapes there, so an answer captured with ``$(adaptor run ...)`` lost them).  On a
    terminal, the control characters of :func:`shown` are escaped: whatever an agent wrote
    (an answer, an approval's title, an error message) cannot drive the terminal.
    """
    stream = sys.stderr if err else sys.stdout
    if stream is not None and stream.isatty():  # None: started with it closed
        text = shown(text)
    click.echo(text, err=err, nl=nl, color=True)  # color=True: strip nothing


def shown(text: str) -> str:
    """``text`` for a terminal: every control character but newline and tab escaped
    (``\\x1b``, ``\\r``), as in an event line (:func:`clip`), which also escapes the newline."""
    return text.translate(_ESCAPED_IN_TEXT)


class _Stdout(io.FileIO):
    """The descriptor under ``sys.stdout`` once :func:`guard_stdout` ran: whatever writes to
    stdout (``echo``, ``emit_json``, ``run``'s live text, click's own help) meets a refusal here."""

    def __init__(self, replaced: IO[str]) -> None:
        super().__init__(replaced.fileno(), "w", closefd=False)
        self._replaced = replaced  # it owns the descriptor: collected, it would close it

    def write(self, data: ReadableBuffer, /) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:
            end_as_reader_gone()
        except OSError as exc:
            _cannot_write(exc)


class _Stderr(io.FileIO):
    """The descriptor under ``sys.stderr`` once :func:`guard_stderr` ran: a diagnostic that
    cannot be written (``2>&-``, a reader of ``2>&1 |`` gone, a descriptor open for reading)
    is dropped, and the command ends with the exit status it decided.  Unguarded, the failed
    report raised instead, and every such command exited 1, the code of a ``RunError``."""

    def __init__(self, replaced: IO[str]) -> None:
        super().__init__(replaced.fileno(), "w", closefd=False)
        self._replaced = replaced

    def write(self, data: ReadableBuffer, /) -> int:
        try:
            return super().write(data)
        except OSError:
            _to_devnull(self.fileno())  # and so is everything after it
            return memoryview(data).nbytes


_prog = "adaptor"
"""The command whose output :func:`guard_stdout` guards, to name in its one report."""


def guard_stdout(prog: str = "adaptor") -> None:
    """Route every write to stdout through :class:`_Stdout`, so that output that cannot be
    written ends the command one way, whichever command wrote it and wherever: quietly with 0
    when the reader went away (``| head``), and otherwise (a full disk) reported once on stderr
    with exit 70.  Click's own handling would exit 1, the code of a ``RunError``."""
    global _prog
    _prog = prog
    sys.stdout = _guarded(sys.stdout, _Stdout)


def guard_stderr() -> None:
    """Route every write to stderr through :class:`_Stderr`, which drops what it cannot write."""
    sys.stderr = _guarded(sys.stderr, _Stderr)


def unguard() -> None:
    """Give stdout and stderr back as the interpreter opened them (``adaptord serve``: a write
    that fails must neither end the thread that made it nor silence the log for good)."""
    for name in ("stdout", "stderr"):
        original = getattr(sys, f"__{name}__")
        current = getattr(sys, name)
        if original is not None and isinstance(getattr(current, "buffer", None), io.BufferedWriter) and isinstance(
            current.buffer.raw, _Stdout | _Stderr
        ):
            current.flush()
            setattr(sys, name, original)


def _guarded(stream: IO[str], raw_class: type[_Stdout | _Stderr]) -> IO[str]:
    try:
        stream.flush()
        raw = raw_class(stream)
    except (AttributeError, OSError, ValueError):
        return stream  # not a descriptor (an embedding host's stream): left as it is
    return io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=getattr(stream, "encoding", None) or "utf-8",
        errors=getattr(stream, "errors", None),
        line_buffering=bool(getattr(stream, "line_buffering", False)),
        write_through=bool(getattr(stream, "write_through", False)),
    )


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader went away (or a terminal hung up): what a
    follower that has nothing to write asks between waits, as only a write would tell it."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: errors and hang-ups are always reported
    return any(found & (select.POLLERR | select.POLLHUP) for _, found in poller.poll(0))


def end_as_reader_gone() -> NoReturn:
    """The reader went away (a write found it, or :func:`stdout_reader_gone`): end quietly, with
    0 unless the command already knows its outcome (:func:`note_outcome`)."""
    _stdout_to_devnull()
    sys.exit(_outcome)


_outcome = 0
"""The exit status of a command whose reader went away: 0, or what :func:`note_outcome` said."""


def note_outcome(code: int) -> None:
    """Have the command exit ``code`` should its reader go away before it printed everything:
    a checker's verdict is its exit status (``adaptord check | head -1`` of a refused config
    exited 0)."""
    global _outcome
    _outcome = code


_done_before_output = ""
"""What the command did before printing, said with an output that cannot be written."""


def note_done_before_output(text: str) -> None:
    """Have an output that cannot be written also say ``text`` (``request ID was queued``): a
    script reading exit 70 as "nothing happened" would do it again."""
    global _done_before_output
    _done_before_output = text


def _cannot_write(exc: OSError) -> NoReturn:
    _stdout_to_devnull()
    done = f"; {_done_before_output}" if _done_before_output else ""
    with suppress(OSError):  # stderr may be gone too: the exit code still says it
        echo(f"{_prog}: cannot write the output: {exc.strerror or exc}{done}", err=True)
    sys.exit(errors.exit_code_for(exc))


def _stdout_to_devnull() -> None:
    # Whatever is still to be written (a `finally`, the interpreter's final flush) goes
    # nowhere: no second report, no "Exception ignored ... BrokenPipeError".
    try:
        _to_devnull(sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def emit_json(obj: Any) -> None:
    """One JSON document and a newline on stdout, flushed (scripts read it line by line).

    A stdout that refuses it ends the command in :class:`_Stdout`, as for any other output.
    """
    try:
        data = orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        if _nesting.unwritable_text_at(obj) is None:
            raise
        # An undecodable argument or file name (a lone surrogate) quoted in a message or an
        # id: shown escaped, as the text output shows it, rather than no object at all.
        data = orjson.dumps(_escaped(obj), option=orjson.OPT_APPEND_NEWLINE)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _escaped(value: Any) -> Any:
    """``value`` with its text (keys too) made UTF-8 by backslash-escaping lone surrogates."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {_escaped(key): _escaped(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(item) for item in value]
    return value


def emit_result(
    result: Any, *, exit_code: int = 0, error: Mapping[str, Any] | None = None, **extra: Any
) -> None:
    """A command's ``--json`` outcome: ``{"ok": true, "exit_code": 0, "result": ...}``.

    ``error`` (a wire form) makes it ``"ok": false`` with that exit code while keeping the
    ``result``: a report that is the command's answer even then (``status`` of a stopped
    daemon, ``verify-log`` of a corrupt file).
    """
    obj: dict[str, Any] = {"ok": error is None, "exit_code": exit_code, **extra}
    if error is not None:
        obj["error"] = dict(error)
    obj["result"] = result
    emit_json(obj)


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived while :func:`stopping_like_ctrl_c` was in force.

    A ``KeyboardInterrupt``, so whatever a Ctrl-C would cancel, this cancels too.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_owns_process = False
"""Set by ``adaptor.cli.main``: the process ends when the command does, so it may leave the
signals ignored (a command invoked in-process, by click's CliRunner, must not)."""


def status_decided() -> None:
    """The command's exit status is decided: no signal may change it any more.

    SIGTERM, SIGINT and SIGHUP are ignored from here to the process's end, as adaptord's
    serve() leaves them: a ``kill`` or a second Ctrl-C landing while the command prints its
    answer or exits turned a decided 0 (or the run's own code) into 143 or 130.  Ignored, not
    handled: the interpreter puts Python handlers back to the default while it finalizes.
    Only in the process :func:`adaptor.cli.main` runs, and from its main thread.
    """
    if _owns_process and threading.current_thread() is threading.main_thread():
        for signum in _EXIT_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def exiting_after_a_signal() -> None:
    """A signal stopped the command, which now exits with that signal's status: the runs it
    leaves stop as at a program's exit (their agents get SIGKILL at most
    ``GRACE_AT_EXIT`` seconds in, whatever their grace period), and a further signal kills
    them at once instead of stopping the command a second time (a second ``--json`` object,
    another exit status).  Only in the process :func:`adaptor.cli.main` runs, and from its
    main thread; elsewhere only the first half applies.
    """
    _exiting.begin()
    if _owns_process and threading.current_thread() is threading.main_thread():
        for signum in _EXIT_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _kill_the_agents_now)


def _kill_the_agents_now(signum: int, frame: object) -> None:
    _exiting.cut_the_wait_short()


_REDELIVER_AFTER = 0.05
"""Seconds before a stop signal Python swallowed is delivered again (see stopping_like_ctrl_c)."""


@contextmanager
def stopping_like_ctrl_c() -> Iterator[None]:
    """Within: SIGTERM and SIGHUP stop the command as a Ctrl-C does (:class:`StopSignal`).

    For ``adaptor run``, whose run must not outlive it unasked: ``timeout 60 adaptor run``,
    ``kill``, a closed terminal.  Only the first signal raises (a second one must not cut the
    cancel short); a signal already ignored (``nohup``) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread (CliRunner in a thread)
        return
    raised = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise StopSignal(signum)

    previous_hook = sys.unraisablehook

    def swallowed(info: Any) -> None:
        # The signal landed where Python ignores exceptions (a weakref callback of the import
        # machinery, a __del__): the command never saw it, and the run went on unwatched.  It
        # is delivered again from outside that context.  A Ctrl-C too: Python's own SIGINT
        # handler raised it there (its KeyboardInterrupt was printed, and the run went on).
        nonlocal raised
        if isinstance(info.exc_value, StopSignal):
            raised = False
            signum = info.exc_value.signum
        elif (
            type(info.exc_value) is KeyboardInterrupt
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            signum = signal.SIGINT
        else:
            previous_hook(info)
            return
        again = threading.Timer(
            _REDELIVER_AFTER, signal.pthread_kill, (threading.main_thread().ident, signum)
        )
        again.daemon = True
        again.start()

    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    sys.unraisablehook = swallowed
    try:
        yield
    finally:
        if sys.unraisablehook is swallowed:
            sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            if signal.getsignal(signum) is stop:  # not once status_decided() ignored it
                signal.signal(signum, handler)


def interrupted(
    as_json: bool, cause: BaseException | None = None, *, cancelled: bool = True, **extra: Any
) -> NoReturn:
    """Exit after a Ctrl-C (130) or a :class:`StopSignal` (128 + its number).

    With ``--json``, as every outcome, with its JSON object; ``cancelled``: whether the command
    cancelled what it was about (``run`` does; ``wait`` only stops waiting).
    """
    if isinstance(cause, StopSignal):
        code, how = 128 + cause.signum, signal.Signals(cause.signum).name
    else:
        code, how = EXIT_INTERRUPTED, "Ctrl-C"
    if as_json:
        message = f"cancelled by {how}" if cancelled else f"stopped by {how}"
        error = errors.to_wire(errors.CancelledError(message))
        emit_json({"ok": False, "exit_code": code, **extra, "error": error})
    sys.exit(code)


def exit_code_of(exc: BaseException) -> int:
    """The documented exit code (``adaptor exit-codes``) for an error outcome."""
    if isinstance(exc, WaitTimeoutError):
        return EXIT_WAIT_TIMEOUT
    if isinstance(exc, SpoolNotFoundError | DaemonNotRunningError | ForeignHomeError | UnservableHomeError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, UnknownRequestError | click.UsageError):
        return 2
    return errors.exit_code_for(exc)


def describe(exc: BaseException, secrets: Iterable[str] = ()) -> str:
    """Human text for an error: class, code and message, then its cause chain."""
    wire = errors.to_wire(exc, secrets=secrets)
    lines: list[str] = []
    node: Mapping[str, Any] | None = wire
    while isinstance(node, Mapping):
        line = _describe_one(node, exc if not lines else None)
        if lines and node.get("code") == "external" and "\n" in line:
            # A library's cause is one line: its multi-line message (jsonschema's dump of
            # the metaschema) says what it is about first; --json keeps it whole.
            line = line.split("\n", 1)[0].rstrip() + " [...]"
        # A library re-raising its cause as is (filelock's IsADirectoryError from the same
        # one) would print one line twice, as if it were its own cause.
        if not lines or line != lines[-1]:
            lines.append(line)
        cause = node.get("cause")
        node = cause if isinstance(cause, Mapping) else None
    return "\n  caused by: ".join(lines)


def _describe_one(wire: Mapping[str, Any], exc: BaseException | None) -> str:
    message = str(wire.get("message") or "")
    if wire.get("code") == "external":
        # The client's own conditions read best as their message alone.
        if exc is not None and isinstance(exc, _CLIENT_ERRORS):
            return message
        return f"{wire.get('type')}: {message}"
    label = f"{wire.get('type')} [{wire.get('code')}"
    if "reason" in wire:
        label += f", reason {wire.get('reason')}"
    label += "]"
    fields = wire.get("fields")
    if isinstance(fields, Mapping) and fields and wire.get("code") != "ErrInvalidRequest":
        label += " " + ", ".join(f"{key}={value!r}" for key, value in fields.items())
    text = f"{label}: {message}"
    if wire.get("code") == "ErrInvalidRequest" and isinstance(fields, Mapping):
        problems = [
            f"{problem.get('path') or '<root>'}: {problem.get('message')}"
            for problem in fields.get("errors") or ()
            if isinstance(problem, Mapping)
        ]
        if problems != [message.removeprefix("invalid request: ")]:  # not said already
            text += "".join(f"\n  {problem}" for problem in problems)
    return text


_CLIENT_ERRORS = (
    WaitTimeoutError, SpoolNotFoundError, UnknownRequestError, DaemonNotRunningError, ForeignHomeError,
    UnservableHomeError,
)


def fail(
    exc: BaseException,
    *,
    as_json: bool,
    exit_code: int | None = None,
    wire: Mapping[str, Any] | None = None,
    secrets: Iterable[str] = (),
    **extra: Any,
) -> NoReturn:
    """Report ``exc`` and exit: the ``--json`` object on stdout, human text on stderr.

    ``wire`` (a verdict's error) is printed verbatim instead of re-encoding ``exc``.
    """
    secret_values = tuple(secrets)
    code = exit_code_of(exc) if exit_code is None else exit_code
    if as_json:
        emit_json(
            {
                "ok": False,
                "exit_code": code,
                "error": dict(wire)
                if wire is not None
                else errors.to_wire(exc, secrets=secret_values),
                **extra,
            }
        )
    echo(f"adaptor: {describe(exc, secret_values)}", err=True)
    sys.exit(code)


@contextmanager
def interrupts_unwrapped() -> Iterator[None]:
    """Raise a Ctrl-C (or a :class:`StopSignal`) that another exception wraps as itself.

    Python 3.11 wraps an exception raised in a class's ``__set_name__`` in a ``RuntimeError``
    ("Error calling __set_name__ ..."): a Ctrl-C landing while a module defined such a class
    (watchdog's, imported when ``adaptor run`` starts waiting) came out as an external error,
    exit 70, and the run it was about went on.
    """
    try:
        yield
    except Exception as exc:
        node = exc.__cause__
        for _ in range(_MAX_CAUSES):
            if node is None:
                break
            if isinstance(node, KeyboardInterrupt):
                raise node from None
            node = node.__cause__
        raise


_MAX_CAUSES = 64  # (a chain is never this long, but may loop)


def guarded(func: Callable[P, R]) -> Callable[P, R]:
    """Turn whatever a command raises into its documented exit code and report.

    Ctrl-C exits 130 without a traceback, and SIGTERM and SIGHUP stop the command the same way
    (143, 129), with its ``--json`` object: ``timeout 60 adaptor wait ID --json | jq`` gets one.
    (Output that cannot be written never gets here: :class:`_Stdout` ends the command.)
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            with stopping_like_ctrl_c(), interrupts_unwrapped():
                return func(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except KeyboardInterrupt as stop:
            # A command that cancels what it is about (run) says so itself, before this.
            interrupted(bool(kwargs.get("as_json")), stop, cancelled=False, **_about(kwargs))
        except Exception as exc:
            usage = cwd_gone(exc)
            if usage is not None:
                raise usage from None
            if "home" in kwargs and isinstance(exc, PermissionError):
                # (What no client call said already: `threads` reads the store itself.)
                exc = _home.foreign_home(_home.Home.at(cast(str | None, kwargs["home"])), exc) or exc
            fail(exc, as_json=bool(kwargs.get("as_json")), **_about(kwargs))

    return wrapper


def cwd_gone(exc: BaseException) -> click.UsageError | None:
    """The usage error a ``FileNotFoundError`` is when it comes of a current directory that was
    removed (a relative path, ``--workspace ..``, ``ADAPTORD_HOME=../h``, cannot be resolved
    from it): it was a traceback, or a bare ``[Errno 2] No such file or directory``."""
    if not isinstance(exc, FileNotFoundError):
        return None
    try:
        os.getcwd()
    except FileNotFoundError:
        return click.UsageError(
            "the current directory no longer exists, so a relative path cannot be resolved: "
            "cd to a directory, or give absolute paths"
        )
    return None


def _about(arguments: Mapping[str, object]) -> dict[str, Any]:
    """The request a command was about, for its ``--json`` object (``"id"``), when it names one."""
    request_id = arguments.get("request_id")
    return {"id": request_id} if isinstance(request_id, str) else {}


def refuse_a_store_log(path: str, param_hint: str) -> None:
    """A usage error when the regular file at ``path`` is a thread store's log, which the
    session-recorder readers would call corrupt at its first line ("missing host_seq")."""
    from adaptor.threadstore._jsonl import is_store_log

    if is_store_log(path):
        raise click.BadParameter(
            "this is a thread-store log (threads/log-*.jsonl), not a session-recorder event "
            "log; `adaptor threads` reads the store, which checks its own files",
            param_hint=param_hint,
        )


def not_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A ``FloatRange`` option's callback: NaN compares false with both bounds, so it passes."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number of seconds", ctx=ctx, param=param)
    return value


# --- events as one line each --------------------------------------------------------------------


def event_line(host_seq: int, recorded_at: datetime, event: events.Event) -> str:
    """``  12 10:00:01.123 tool_call.start   grep {"pattern": "x"}``"""
    moment = recorded_at.astimezone().strftime("%H:%M:%S.%f")[:-3]
    kind = events.event_kind(event).translate(_ESCAPED)  # (a driver's word; escaped all the same)
    return f"{host_seq:>6} {moment} {kind:<22} {summary(event)}".rstrip()


def summary(event: events.Event) -> str:
    """The few words of an event a human scanning a log wants, on one line: every part an
    agent named (a tool, an id, a message's) is escaped and cut as its text is."""
    match event:
        case events.TextDelta(phase="content") | events.Thinking(phase="content"):
            return clip(event.text)
        case events.TextDelta() | events.Thinking():
            return clip(event.message_id)
        case events.ToolCall(phase="start"):
            return f"{clip(event.name)} {compact(event.args)}" if event.args is not None else clip(event.name)
        case events.ToolCall(phase="end"):
            return f"{clip(event.name)} -> {compact(event.result)}"
        case events.ToolCall():
            return clip(event.args_delta)
        case events.ToolResult():
            return f"{clip(event.id)}{' (error)' if event.is_error else ''} {compact(event.result)}"
        case events.ProcessInfo(kind="spawn"):
            argv = event.data.get("argv")
            shown = " ".join(map(str, argv)) if isinstance(argv, list) else ""
            pid = event.data.get("pid")
            return clip(shown + (f" (pid {pid})" if pid is not None else ""))
        case events.ProcessInfo():
            return clip(event.text)
        case events.Notice():
            return clip(" ".join(part for part in (event.text, compact(event.data)) if part))
        case events.ApprovalRequest():
            return clip(f"{event.id} {event.kind} {event.title}")
        case events.RunStarted():
            return clip(event.run_id)
        case events.RunFinished():
            if not event.failed:
                return "ok"
            return clip("failed: " + ": ".join(part for part in (event.reason, event.message) if part))
        case events.Dropped():
            return f"{event.count} dropped {compact(event.by_kind)}"
        case events.SubagentUpdate():
            return clip(f"{event.agent} {event.delta or compact(event.data)}")
    return ""


def compact(value: Any) -> str:
    if value is None or value == {}:
        return ""
    if isinstance(value, str):
        return clip(value)
    try:
        return clip(orjson.dumps(value, default=str).decode())
    except TypeError:
        return clip(repr(value))


# One line per event, and nothing an agent printed may drive the terminal (clear it, retitle
# it, move the cursor): every control character but tab is shown escaped.
_ESCAPED = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code != 0x09}
_ESCAPED |= {0x0A: "\\n", 0x0D: "\\r"}
# Nor reorder it: the bidirectional embeddings, overrides and isolates ("Trojan Source") turn
# the rest of a line around (an approval prompt's title, a tool call's arguments).
_ESCAPED |= {code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
# Text of many lines (an answer) keeps its newlines.
_ESCAPED_IN_TEXT = {code: escaped for code, escaped in _ESCAPED.items() if code != 0x0A}


def clip(text: str, limit: int = 160) -> str:
    text = text.translate(_ESCAPED)
    return text if len(text) <= limit else text[: limit - 1] + "…"

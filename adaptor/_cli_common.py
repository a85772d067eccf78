"""What every ``adaptor`` command shares: the ``--home``/``--json`` options, exit codes, error
reports (``--json`` shape on stdout, human text on stderr) and one-line event summaries."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn, ParamSpec, TypeVar

import click
import orjson

from adaptor import _home, errors, events
from adaptor.spool import Client, SpoolNotFoundError, UnknownRequestError, WaitTimeoutError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_UNAVAILABLE = 69
EXIT_WAIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130


class DaemonNotRunningError(Exception):
    """The command needs a serving daemon (to wait for a verdict) and none holds the home."""

    def __init__(self, home: os.PathLike[str] | str) -> None:
        super().__init__(
            f"adaptord is not running for {home} (start it with `adaptord serve --home {home}`"
            " or `systemctl --user start adaptord`; `adaptor run --no-daemon` runs in-process)"
        )


def _home_named(ctx: click.Context, param: click.Parameter, flag: str | None) -> str | None:
    # daemon.md fixes the order: ADAPTORD_HOME, else --home, else the XDG default.  A flag the
    # variable overrides is said out loud, so that nobody serves or reads a home they did not mean.
    if flag == "":
        raise click.BadParameter("is empty; name a directory (an empty path would be the current one)", ctx=ctx, param=param)
    variable = os.environ.get("ADAPTORD_HOME")
    if not variable:
        return flag
    if flag is not None and _home.Home.at(flag).root != _home.Home.at(variable).root:
        click.echo(f"{ctx.find_root().info_name}: ADAPTORD_HOME={variable} takes precedence over --home {flag}", err=True)
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


def require_daemon(client: Client) -> None:
    if not _home.daemon_running(_home.Home.at(client.home)):
        raise DaemonNotRunningError(client.home)


_DAEMON_CHECK_INTERVAL = 2.0


@contextmanager
def telling_when_the_daemon_stops(
    client: Client, request_id: str, say: Callable[[str], None], *, ctrl_c: str
) -> Iterator[None]:
    """While the body waits for ``request_id``'s verdict, ``say`` when the daemon stops serving
    the home, and when it serves again.  ``ctrl_c`` says what an interrupt would do.

    The wait goes on either way: the request keeps its place and the next start serves it, as
    a supervisor restarting the daemon expects.  Without a word, a person at the terminal
    could not tell a stopped daemon from a slow agent.
    """
    home = _home.Home.at(client.home)
    done = threading.Event()

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
                say("adaptor: adaptord serves again")
            else:
                say(
                    f"adaptor: adaptord stopped; {request_id} keeps its place and runs when the "
                    f"daemon starts again (Ctrl-C {ctrl_c})"
                )

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


# --- output -------------------------------------------------------------------------------------


def emit_json(obj: Any) -> None:
    """One JSON document and a newline on stdout, flushed (scripts read it line by line).

    A stdout that refuses it (a full disk) raises ``OSError`` on to ``adaptor.cli.main``,
    which reports it once; reporting it as JSON here would only fail again.
    """
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE))
    sys.stdout.buffer.flush()


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

    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupted(as_json: bool, cause: BaseException | None = None, **extra: Any) -> NoReturn:
    """Exit after a Ctrl-C (130) or a :class:`StopSignal` (128 + its number).

    With ``--json``, as every outcome, with its JSON object.
    """
    if isinstance(cause, StopSignal):
        code, how = 128 + cause.signum, signal.Signals(cause.signum).name
    else:
        code, how = EXIT_INTERRUPTED, "Ctrl-C"
    if as_json:
        error = errors.to_wire(errors.CancelledError(f"cancelled by {how}"))
        emit_json({"ok": False, "exit_code": code, **extra, "error": error})
    sys.exit(code)


def exit_code_of(exc: BaseException) -> int:
    """The documented exit code (``adaptor exit-codes``) for an error outcome."""
    if isinstance(exc, WaitTimeoutError):
        return EXIT_WAIT_TIMEOUT
    if isinstance(exc, SpoolNotFoundError | DaemonNotRunningError):
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
        lines.append(_describe_one(node, exc if not lines else None))
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
        for problem in fields.get("errors") or ():
            if isinstance(problem, Mapping):
                text += f"\n  {problem.get('path') or '<root>'}: {problem.get('message')}"
    return text


_CLIENT_ERRORS = (WaitTimeoutError, SpoolNotFoundError, UnknownRequestError, DaemonNotRunningError)


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
    click.echo(f"adaptor: {describe(exc, secret_values)}", err=True)
    sys.exit(code)


def guarded(func: Callable[P, R]) -> Callable[P, R]:
    """Turn whatever a command raises into its documented exit code and report.

    Ctrl-C exits 130 without a traceback; a closed stdout (``| head``) ends the command
    quietly with 0.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except KeyboardInterrupt as stop:
            interrupted(bool(kwargs.get("as_json")), stop, **_about(kwargs))
        except BrokenPipeError:
            quiet_broken_pipe()
        except Exception as exc:
            fail(exc, as_json=bool(kwargs.get("as_json")), **_about(kwargs))

    return wrapper


def _about(arguments: Mapping[str, object]) -> dict[str, Any]:
    """The request a command was about, for its ``--json`` object (``"id"``), when it names one."""
    request_id = arguments.get("request_id")
    return {"id": request_id} if isinstance(request_id, str) else {}


def not_nan(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A ``FloatRange`` option's callback: NaN compares false with both bounds, so it passes."""
    if value is not None and value != value:
        raise click.BadParameter("nan is not a number of seconds", ctx=ctx, param=param)
    return value


def quiet_broken_pipe() -> NoReturn:
    # The reader went away.  Point stdout at /dev/null so the interpreter's final flush does
    # not raise a second time and print "Exception ignored ... BrokenPipeError".
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)
    sys.exit(0)


# --- events as one line each --------------------------------------------------------------------


def event_line(host_seq: int, recorded_at: datetime, event: events.Event) -> str:
    """``  12 10:00:01.123 tool_call.start   grep {"pattern": "x"}``"""
    moment = recorded_at.astimezone().strftime("%H:%M:%S.%f")[:-3]
    kind = events.event_kind(event)
    return f"{host_seq:>6} {moment} {kind:<22} {summary(event)}".rstrip()


def summary(event: events.Event) -> str:
    """The few words of an event a human scanning a log wants."""
    match event:
        case events.TextDelta(phase="content") | events.Thinking(phase="content"):
            return clip(event.text)
        case events.TextDelta() | events.Thinking():
            return event.message_id
        case events.ToolCall(phase="start"):
            return f"{event.name} {compact(event.args)}" if event.args is not None else event.name
        case events.ToolCall(phase="end"):
            return f"{event.name} -> {compact(event.result)}"
        case events.ToolCall():
            return clip(event.args_delta)
        case events.ToolResult():
            return f"{event.id}{' (error)' if event.is_error else ''} {compact(event.result)}"
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
            return event.run_id
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


def clip(text: str, limit: int = 160) -> str:
    text = text.translate(_ESCAPED)
    return text if len(text) <= limit else text[: limit - 1] + "…"

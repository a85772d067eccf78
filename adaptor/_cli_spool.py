"""``adaptor`` commands that work on the daemon's home: submit, wait, events, cancel, approvals,
approve/deny/answer, threads, status."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click
import orjson

from adaptor import _home, errors
from adaptor._cli_common import (
    EXIT_UNAVAILABLE,
    echo,
    emit_json,
    emit_result,
    end_as_reader_gone,
    event_line,
    fail,
    guarded,
    home_option,
    interrupted,
    json_option,
    not_nan,
    note_done_before_output,
    read_request,
    refuse_a_store_log,
    require_daemon,
    status_decided,
    stdout_reader_gone,
    telling_when_the_daemon_stops,
)
from adaptor._one_line import one_line, quoted
from adaptor.events import to_json
from adaptor.spool import (
    Client,
    DaemonNotRunningError,
    InvalidRequestError,
    SpoolNotFoundError,
    UnknownRequestError,
    _log_records,
    _request_records,
    _status_report,
)


@click.command()
@click.argument("file", type=click.File("rb"), default="-", required=False)
@json_option
@home_option
@guarded
def submit(file: IO[bytes], as_json: bool, home: str | None) -> None:
    """Queue the request JSON in FILE (default: stdin) and print its id.

    The request is linked into spool/new atomically; a new time-sortable id is minted when it
    has none.  Without a running daemon it waits in the spool.  Exit 2 when FILE is not a JSON
    object or its id is malformed or taken (schema problems come back in the verdict), 69 when
    the home has no spool, 70 when the disk refused the file (nothing queued) or the id could
    not be printed (queued all the same, which stderr says, naming it).  With --json the
    result is {"id", "daemon_running"}.
    """
    request = read_request(file)
    client = Client(home)
    request_id = submit_request(client, request)
    note_done_before_output(f"request {request_id} was queued all the same")
    running = _home.daemon_running(_home.Home.at(client.home))
    if as_json:
        emit_result({"id": request_id, "daemon_running": running}, id=request_id)
        return
    echo(request_id)
    if not running:
        echo(f"adaptor: queued; adaptord is not running for {one_line(str(client.home))}", err=True)


def submit_request(client: Client, request: dict[str, Any]) -> str:
    """``client.submit``, with an id that cannot be used reported as the daemon would."""
    request_id = request.get("id")
    if request_id is not None and not _home.is_request_id(request_id):
        raise InvalidRequestError(
            [
                {
                    "path": "/id",
                    "message": f"must match {_home.REQUEST_ID.pattern} and not be "
                    f"{_home.DAEMON_SESSION!r} nor start with '{_home.DAEMON_SESSION}-', in "
                    "any letter case (the daemon's own logs)",
                }
            ]
        )
    try:
        return client.submit(request)
    except FileExistsError:
        raise InvalidRequestError(
            [{"path": "/id", "message": "a request with this id was already submitted"}]
        ) from None
    except ValueError as exc:  # too large (JSON text holds no NaN)
        raise InvalidRequestError([{"path": "", "message": str(exc)}]) from None


@click.command()
@click.argument("request_id", metavar="ID")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    callback=not_nan,
    help="Give up after S seconds with exit 124 (the run goes on).",
)
@json_option
@home_option
@guarded
def wait(request_id: str, timeout: float | None, as_json: bool, home: str | None) -> None:
    """Wait for request ID's verdict; print its result text and exit with its exit code.

    The error of a failed run goes to stderr (with --json: the verdict's error on stdout).
    Exit 124 when --timeout passes first, 69 when there is no verdict yet and no daemon to
    write one, 2 for an unknown ID.
    """
    client = Client(home)
    verdict = _verdict_or_daemon(client, request_id)
    if verdict is None:
        with _told_when_the_daemon_stops(
            client, request_id, as_json, ctrl_c=f"stops waiting; `adaptor wait {request_id}` waits again"
        ):
            verdict = client._await_verdict(request_id, timeout)
    report_verdict(client, verdict, as_json=as_json)


def _told_when_the_daemon_stops(
    client: Client, request_id: str, as_json: bool, *, ctrl_c: str
) -> contextlib.AbstractContextManager[None]:
    """:func:`telling_when_the_daemon_stops` for a command that waits for a verdict: on
    stderr, and not with --json (as documented for ``wait``)."""
    say = (lambda text: None) if as_json else (lambda text: echo(text, err=True))
    return telling_when_the_daemon_stops(client, request_id, say, ctrl_c=ctrl_c)


def _verdict_or_daemon(client: Client, request_id: str) -> dict[str, Any] | None:
    """Request ID's verdict, or ``None`` once it is known that a daemon serves the home to
    write it (an unknown ID, a missing spool, no daemon: each raises its own error)."""
    verdict = client.verdict(request_id) if client.home.is_dir() else None
    if verdict is None:
        client._require_spool()
        client._require_known(request_id)
        require_daemon(client)
    return verdict


def report_verdict(
    client: Client,
    verdict: dict[str, Any],
    *,
    as_json: bool,
    text_shown: bool = False,
    quiet: bool = False,
) -> None:
    """Print a verdict's outcome as ``run``/``wait`` do and exit with its exit code."""
    status_decided()  # the verdict's: a signal while it is printed must not replace it
    request_id = verdict.get("id")
    summary = verdict.get("result")
    result_json = (
        {**summary, "run_id": verdict.get("run_id")} if isinstance(summary, dict) else None
    )
    try:
        result = client._outcome(verdict)
    except UnknownRequestError:
        raise  # removed while it was read: the client's own error, not the verdict's
    except Exception as exc:
        code = verdict.get("exit_code")
        fail(
            exc,
            as_json=as_json,
            exit_code=code if isinstance(code, int) else None,
            wire=verdict.get("error") if isinstance(verdict.get("error"), dict) else None,
            id=request_id,
            result=result_json,
        )
    if as_json:
        emit_result(result_json, id=request_id)
    else:
        if not text_shown:
            print_text(result.text)
        if not quiet:
            note_invalid_output(result_json)
    sys.exit(0)


def note_invalid_output(summary: Any) -> None:
    """Say on stderr that a run kept by ``return_invalid`` printed output that failed its
    schema: exit 0 and the text alone look like a valid answer.  ``summary`` is a verdict's
    ``result`` object (secrets already redacted)."""
    structured = summary.get("structured") if isinstance(summary, dict) else None
    if isinstance(structured, dict) and structured.get("valid") is False:
        problems = "; ".join(str(e) for e in structured.get("errors") or ()) or "no value"
        echo(f"adaptor: the structured output is invalid (kept by return_invalid): {problems}", err=True)


def print_text(text: str) -> None:
    """A run's answer, ending with a newline: to a pipe or a file, its text byte for byte."""
    if text:
        echo(text if text.endswith("\n") else text + "\n", nl=False)


@click.command()
@click.argument("request_id", metavar="[ID]", required=False)
@click.option("--thread", "thread_key", metavar="KEY", help="Every run of this thread key.")
@click.option(
    "--file",
    "log_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Any session-recorder log (events/<session>.jsonl); - (stdin) or a pipe is read "
    "once, to its end, -f or not.",
)
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing new events, like tail -F; for an ID, until its verdict exists.",
)
@click.option(
    "--since",
    type=click.IntRange(min=0),
    default=0,
    metavar="SEQ",
    help="Only records after this host_seq cursor.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='NDJSON: one {"host_seq": N, "event": {...}} per line; a failure (a damaged log: '
    'exit 70) ends it with the {"ok": false, "exit_code": N, "error": {...}} line.',
)
@home_option
@guarded
def events(
    request_id: str | None,
    thread_key: str | None,
    log_file: str | None,
    follow: bool,
    since: int,
    as_json: bool,
    home: str | None,
) -> None:
    """Print the audit-log events of request ID, of a thread, or of a log file.

    One line per event (host_seq, time, kind, summary), or NDJSON with --json; each line is
    flushed as it is written.  A host_seq from an earlier line resumes with --since.  ID -f
    exits 69 when there is no verdict and no daemon to write one; a daemon that stops while it
    follows is said on stderr, and it follows on until a restart writes the verdict, as wait does.
    Exit 2 for an unknown ID, 4 for a --thread with no events, 70 for a damaged log.
    """
    chosen = [
        name
        for name, value in (("ID", request_id), ("--thread", thread_key), ("--file", log_file))
        if value is not None
    ]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of ID, --thread KEY and --file PATH")
    told: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if request_id is not None:
        client = Client(home)
        # As for wait: with nobody to run it, following would wait forever (exit 69); a daemon
        # that stops on the way is said, and following goes on until a restart writes the verdict.
        if follow and _verdict_or_daemon(client, request_id) is None:
            told = _told_when_the_daemon_stops(
                client,
                request_id,
                as_json,
                ctrl_c=f"stops following; `adaptor events {request_id} -f` follows again",
            )
        records = _request_records(client, request_id, follow=follow, since=since, wanted=_still_read)
    elif thread_key is not None:
        _check_key(thread_key, "--thread")
        client = Client(home)
        client._require_spool()
        session = _home.session_for_thread(thread_key)
        log = client.home / "events" / f"{session}.jsonl"
        if not follow and not log.is_file():  # with -f its first run may be yet to come
            raise errors.ThreadNotFoundError(f"no events recorded for thread key {thread_key!r}")
        records = _log_records(log, follow=follow, since=since, wanted=_still_read)
    else:
        assert log_file is not None
        if log_file == "-":
            records = _log_records(
                Path("/dev/stdin"), follow=follow, since=since, stream=sys.stdin.buffer
            )
        else:
            path = Path(log_file).absolute()
            # With -f it may appear later, as for tail -F.  Not is_file(): a pipe is read too.
            if not follow and not path.exists():
                raise click.BadParameter(f"no such file: {log_file}", param_hint="--file")
            if path.is_file():
                refuse_a_store_log(str(path), "--file")
            records = _log_records(path, follow=follow, since=since, wanted=_still_read)
    printed = 0
    with told:
        for record in records:
            printed += 1
            if as_json:
                emit_json({"host_seq": record.host_seq, "event": to_json(record.event)})
            else:
                echo(event_line(record.host_seq, record.recorded_at, record.event))
    if follow and stdout_reader_gone():  # (`events -f | grep -q x`: found, and gone)
        end_as_reader_gone()
    if request_id is not None and not printed and since == 0:
        _say_why_no_events(Client(home), request_id)


def _still_read() -> bool:
    return not stdout_reader_gone()


def _say_why_no_events(client: Client, request_id: str) -> None:
    """A request that ended before it ran (refused, cancelled in the queue) has a verdict but
    no events: say so, rather than print nothing."""
    verdict = client.verdict(request_id)
    if verdict is None or verdict.get("ok") is not False:
        return
    error = verdict.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    echo(
        f"adaptor: request {request_id} recorded no events: it ended before it ran "
        f"({code}; `adaptor wait {request_id}` shows why)",
        err=True,
    )


@click.command()
@click.argument("request_id", metavar="ID")
@json_option
@home_option
@guarded
def cancel(request_id: str, as_json: bool, home: str | None) -> None:
    """Cancel a queued or running request (a no-op once it has a verdict).

    Its verdict then says CancelledError (it never started) or RunCancelledError.  Exit 2
    for an unknown ID, 69 when the home has no spool.  With --json the result is
    {"id", "requested"}: false when the request already had its verdict.
    """
    requested = Client(home).cancel(request_id)
    if as_json:
        emit_result({"id": request_id, "requested": requested}, id=request_id)
    elif requested:
        echo(f"adaptor: cancel requested for {request_id}", err=True)
    else:
        echo(f"adaptor: {request_id} already has a verdict", err=True)


# --- approvals ----------------------------------------------------------------------------------


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the outcome object; its result is the pending requests.",
)
@home_option
@guarded
def approvals(as_json: bool, home: str | None) -> None:
    """List the open approval requests, oldest first.

    None while no daemon serves the home (its runs have ended: a line on stderr says so).
    Exit 69 when the home has no spool.
    """
    client = Client(home)
    client._require_spool()
    pending = client.approvals()
    if as_json:
        emit_result(pending)
        return
    if not _home.daemon_running(_home.Home.at(client.home)):
        echo(
            f"adaptor: adaptord is not running for {one_line(str(client.home))}: the runs that asked have "
            "ended, so no approval can be answered",
            err=True,
        )
    for request in pending:
        kind = request.get("approval_kind", "")
        line = f"{request.get('id')}  {kind}  request {request.get('request_id')}"
        if request.get("title"):
            line += f"  {one_line(str(request['title']))}"  # the agent's words: on one line
        if request.get("deadline"):
            line += f"  (until {request['deadline']})"
        echo(line)
        for choice_line in _choice_lines(request.get("choices")):
            echo(choice_line)


def _choice_lines(raw: object) -> list[str]:
    """A question's choices under its listing line: their keys on one line, or one choice a
    line with its label and description when they say more than the key."""
    choices = [
        (str(c.get("key") or ""), str(c.get("label") or ""), str(c.get("description") or ""))
        for c in (raw if isinstance(raw, list) else ())
        if isinstance(c, dict)
    ]
    if not choices:
        return []
    if all(label in ("", key) and not description for key, label, description in choices):
        return [f"    choices: {', '.join(one_line(key) for key, _, _ in choices)}"]
    width = max(len(one_line(key)) for key, _, _ in choices)
    lines = ["    choices:"]
    for key, label, description in choices:
        line = f"      {one_line(key):<{width}}"
        if label and label != key:
            line += f"  {one_line(label)}"
        if description:
            line += f" - {one_line(description)}"
        lines.append(line.rstrip())
    return lines


@contextlib.contextmanager
def _text_argument(param_hint: str) -> Iterator[None]:
    """A reason or answer no response file can carry is a usage error (exit 2), naming it."""
    try:
        yield
    except _home.ResponseTextError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None


def _responded(approval_id: str, action: str, as_json: bool, taken: bool) -> None:
    if not taken:
        echo(
            f"adaptor: adaptord did not take the response within {_home.RESPONSE_TAKEN_WITHIN:g} s "
            "(stopped or starved?); it stays written, and counts only if the run takes it before "
            "the request's deadline: `adaptor wait` on the request tells",
            err=True,
        )
    if as_json:
        emit_result({"id": approval_id, "action": action, "taken": taken})
    else:
        echo(f"{action}: {approval_id}")


@contextlib.contextmanager
def _saying_if_stopped(approval_id: str, action: str, as_json: bool) -> Iterator[None]:
    """Say what became of the response when the command is stopped (Ctrl-C, a signal) while
    it waits for the daemon to take it: on stderr, and with ``--json`` as the outcome's
    ``result`` (its ``response``: ``taken_back``, ``stays_written`` or ``not_written``)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        taken_back = getattr(stop, "response_taken_back", None)
        if taken_back is True:
            echo("adaptor: stopped; the response was taken back (the request stays open)", err=True)
        elif taken_back is False:
            echo("adaptor: stopped; the response stays written: adaptord had taken it, or may "
                 "still take it (`adaptor approvals` shows whether the request is open)", err=True)
        response = {True: "taken_back", False: "stays_written", None: "not_written"}[taken_back]
        result = {"id": approval_id, "action": action, "response": response}
        interrupted(as_json, stop, cancelled=False, result=result)


@click.command()
@click.argument("approval_id", metavar="ID")
@json_option
@home_option
@guarded
def approve(approval_id: str, as_json: bool, home: str | None) -> None:
    """Approve a pending permission or plan-review request.

    Exit 5 when another response won, the request expired (its deadline passed, its run
    ended, or no adaptord serves the home), it is a question (answer it), or there is no such
    request.
    """
    with _saying_if_stopped(approval_id, "approved", as_json):
        taken = Client(home).approve(approval_id)
    _responded(approval_id, "approved", as_json, taken)


@click.command()
@click.argument("approval_id", metavar="ID")
@click.option("--reason", default="", help="Why; the agent may see it.")
@json_option
@home_option
@guarded
def deny(approval_id: str, reason: str, as_json: bool, home: str | None) -> None:
    """Deny a pending request of any kind (exit 5 as for approve; 2 when the reason is not
    UTF-8 or longer than a response file holds, 64 KiB)."""
    with _text_argument("--reason"), _saying_if_stopped(approval_id, "denied", as_json):
        taken = Client(home).deny(approval_id, reason)
    _responded(approval_id, "denied", as_json, taken)


@click.command()
@click.argument("approval_id", metavar="ID")
@click.argument("option")
@json_option
@home_option
@guarded
def answer(approval_id: str, option: str, as_json: bool, home: str | None) -> None:
    """Answer a pending question with OPTION (exit 5 as for approve; 2 as for deny, or for an
    empty OPTION)."""
    with _text_argument("OPTION"), _saying_if_stopped(approval_id, "answered", as_json):
        taken = Client(home).answer(approval_id, option)
    _responded(approval_id, "answered", as_json, taken)


# --- threads ------------------------------------------------------------------------------------


@click.group(invoke_without_command=True)
@home_option
@click.option("--json", "as_json", is_flag=True, help="As the subcommand's --json (`threads --json` is `threads list --json`).")
@click.pass_context
def threads(ctx: click.Context, home: str | None, as_json: bool) -> None:
    """The thread store: `threads list` (the default) and `threads show KEY`.

    Exit 69 when the home does not exist; `show` exits 4 for a key with no conversation.
    """
    ctx.obj = {"home": home}
    if as_json:  # `threads --json show K` printed text: the subcommands take it as their own
        ctx.default_map = {name: {"as_json": True} for name in ("list", "show")}
    if ctx.invoked_subcommand is None:
        ctx.invoke(threads_list, as_json=as_json)


def _store_home(ctx: click.Context, home: str | None) -> Path:
    parent = (ctx.obj or {}).get("home") if home is None else home
    client = Client(parent)
    if not (client.home / "threads").is_dir():
        # A mistyped home must not look like a home whose conversations are gone.
        client._require_spool()
    return client.home


def _check_key(key: str, hint: str) -> None:
    """A usage error (exit 2) for a key no run can have, as `adaptor run --thread` says it."""
    from adaptor.threadstore._types import check_text

    if not key:  # with -f, `events` would wait forever for it
        raise click.BadParameter("a thread key is never empty", param_hint=hint)
    try:
        check_text("a thread key", key)
    except ValueError:
        # Bytes that are not UTF-8 reach us as lone surrogates, which no request can carry.
        raise click.BadParameter(
            "a thread key is UTF-8 text and this one is not (is every argument UTF-8?)",
            param_hint=hint,
        ) from None


def _open_store(root: Path) -> Any:
    from adaptor.threadstore import JSONLStore

    # Opening creates the directory; a home without threads has none to list.
    folder = root / "threads"
    if not os.path.lexists(folder):
        return None
    if not folder.is_dir():
        # (Something else standing there was read as "no threads", exit 0.)
        raise NotADirectoryError(errno.ENOTDIR, "the thread store is not a folder", str(folder))
    return JSONLStore(folder)


@threads.command("list")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the outcome object; its result is the active records.",
)
@home_option
@click.pass_context
@guarded
def threads_list(ctx: click.Context, as_json: bool = False, home: str | None = None) -> None:
    """The thread keys with an active conversation: key, driver, last update, session."""
    from adaptor.threadstore import Query
    from adaptor.threadstore._types import record_to_json

    store = _open_store(_store_home(ctx, home))
    records = []
    if store is not None:
        with store:
            for key in store.keys():
                record = store.resolve(Query(key=key))
                if record is not None:
                    records.append(record_to_json(record))
    if as_json:
        emit_result(records)
        return
    for record in records:
        state = record.get("state") or {}
        session = state.get("display_id") or state.get("resume_id") or "-"
        echo(f"{_shown_key(record['key'])}  {record['driver_type']}  {record['updated_at']}  {one_line(str(session))}")


def _shown_key(key: str) -> str:
    """A thread key as a listing's first column: JSON-quoted also when, shown as it is, it
    would not read back as itself (a blank end, the two spaces that separate the columns, a
    leading quote that makes it look quoted already)."""
    if key != key.strip() or "  " in key or key.startswith('"'):
        return quoted(key)
    return one_line(key)


@threads.command("show")
@click.argument("key")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the outcome object; its result is the record.",
)
@home_option
@click.pass_context
@guarded
def threads_show(ctx: click.Context, key: str, as_json: bool, home: str | None) -> None:
    """The active record of thread KEY (exit 4 when it has none)."""
    from adaptor.threadstore import Query
    from adaptor.threadstore._types import record_to_json

    _check_key(key, "KEY")
    store = _open_store(_store_home(ctx, home))
    record = None
    if store is not None:
        with store:
            record = store.resolve(Query(key=key))
    if record is None:
        raise errors.ThreadNotFoundError(f"no active conversation for thread key {key!r}")
    obj = record_to_json(record)
    if as_json:
        emit_result(obj)
        return
    for name, value in obj.items():
        if isinstance(value, dict):
            value = orjson.dumps(value).decode()
        elif name == "key":
            value = _shown_key(value)
        elif isinstance(value, str):
            value = one_line(value)
        echo(f"{name}: {value}")


# --- status -------------------------------------------------------------------------------------


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON object on stdout: {"ok", "exit_code", "result"} with the status as '
    '"result" (also when no daemon runs: exit 69).',
)
@home_option
@guarded
def status(as_json: bool, home: str | None) -> None:
    """The daemon and its queue; exit 0 while it runs, 69 when it does not."""
    client = Client(home)
    try:
        info, problem = client._status()
    except SpoolNotFoundError as exc:  # a file where the home should be
        if not as_json:
            raise
        # The report still comes, as for a home with no daemon: `jq .result.running` is false.
        fail(exc, as_json=True, result=_status_report(_home.Home.at(client.home)))
    if problem is not None:  # as `adaptord status` says it: running, details unknown
        echo(f"adaptor: {problem}", err=True)
    if as_json:
        if info["running"]:
            emit_result(info)
        else:
            down = DaemonNotRunningError(client.home)
            emit_result(info, exit_code=EXIT_UNAVAILABLE, error=errors.to_wire(down))
    else:
        if info["running"]:
            known = [
                text
                for value, text in (
                    (info["pid"], f"pid {info['pid']}"),
                    (info["workers"], f"{info['workers']} worker{'' if info['workers'] == 1 else 's'}"),
                    (info["started_at"], f"since {info['started_at']}"),
                    (info["cpu"], f"threads on CPU {info['cpu']}"),
                )
                if value is not None
            ]
            echo(f"adaptord running for {one_line(str(info['home']))}" + (f" ({', '.join(known)})" if known else ""))
        else:
            echo(f"adaptord not running for {one_line(str(info['home']))}")
            # What to do, where a script's report parser does not read it (as `run` says it).
            echo(f"adaptor: {DaemonNotRunningError(client.home)}", err=True)
        # Claimed by a daemon that is gone (kill -9, a crash): nothing runs them now; the next
        # start gives them their verdicts or runs them again (on_interrupt).
        state = "running" if info["running"] else "interrupted"
        echo(f"queued: {len(info['queued'])}  {state}: {len(info['in_progress'])}")
        deferred = set(info.get("verdict_deferred") or ())
        for request_id in info["in_progress"]:
            # Finished, its verdict waiting for room on the disk (while a daemon serves).
            shown = "finished" if request_id in deferred and info["running"] else state
            echo(f"  {shown:<8} {request_id}" + ("  (verdict deferred)" if shown == "finished" else ""))
        for request_id in info["queued"]:
            echo(f"  queued   {request_id}")
        if info["recent"]:
            echo("recent verdicts:")
        for verdict in info["recent"]:
            outcome = "ok" if verdict["ok"] else f"exit {verdict['exit_code']} {verdict['code']}"
            echo(f"  {verdict['finished_at']}  {verdict['id']}  {outcome}")
    sys.exit(0 if info["running"] else EXIT_UNAVAILABLE)

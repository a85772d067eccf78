"""The ``adaptor`` command.

Commands that talk to the daemon live in ``_cli_spool`` (submit, wait, events, cancel,
approvals, approve/deny/answer, threads, status) and ``_cli_run`` (run); exit codes follow
``adaptor exit-codes`` everywhere.
"""

from __future__ import annotations

import codecs
import os
import stat
import sys

import click

from adaptor import _cli_common, _cli_run, _cli_spool, errors
from adaptor._cli_common import (
    SIGNAL_EXITS,
    echo,
    emit_json,
    emit_result,
    guard_stderr,
    guard_stdout,
    guarded,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="adaptor", prog_name="adaptor")
def cli() -> None:
    """Run coding agents through one model; talk to the adaptord daemon.

    Every command exits with the codes `adaptor exit-codes` prints (2: usage, 69: no daemon or
    spool) and, with --json, prints one JSON object on stdout (events: one per line).

    \b
    Environment:
      ADAPTORD_HOME   the daemon's home; wins over --home
                      (default: $XDG_STATE_HOME/adaptord, ~/.local/state/adaptord)
      ADAPTOR_DRIVER  run's default --driver
      NO_COLOR        run on a terminal: no faint styling
      TERM=dumb       run on a terminal: no escapes at all, no progress line
    """


@cli.command("exit-codes")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the outcome object; its result is the table."
)
@guarded
def exit_codes(as_json: bool) -> None:
    """Print the exit codes every adaptor command uses, then the exits by a signal."""
    table = (*errors.EXIT_CODES, *SIGNAL_EXITS)
    if as_json:
        emit_result([{"exit_code": code, "meaning": meaning} for code, meaning in table])
        return
    for code, meaning in table:
        echo(f"{code:>4}  {meaning}")


@cli.command("verify-log")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option(
    "--repair",
    "do_repair",
    is_flag=True,
    help="Cut a torn last line (a crash mid-append) first. Never touches damage before it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@guarded
def verify_log(file: str, do_repair: bool, as_json: bool) -> None:
    """Strictly check a session-recorder event log (events/<session>.jsonl).

    Every line must be a complete record with a valid crc, host_seq 1, 2, 3, ... and a known
    event kind. Prints "ok: N records" and exits 0; otherwise prints "corrupt: FILE line L: why"
    on stderr and exits 70 (an infrastructure failure: the file is damaged, see
    `adaptor exit-codes`), as it does when the file cannot be read (a missing file is a usage
    error, exit 2). A symlink is followed; a pipe, or stdin (-), is read as it streams. With --repair, a torn last
    line is cut and the exit is 0 if the file is valid afterwards; corruption before the last
    line is reported and left as it is (exit 70).

    --json prints the outcome object, {"ok", "exit_code", "error" (on failure only), "result"}
    with the result {"records", "repaired"} on failure too: "records" counts the valid records
    (before the bad line, on failure), "repaired" describes what was cut (or null); "error" is
    the failure in the wire form of the error taxonomy.
    """
    # Imported here: the host tools are optional and the core CLI must not depend on them.
    from hosttools import sessionrecorder

    if file == "-":  # `zcat log.jsonl.gz | adaptor verify-log -`, as `events --file -` reads it
        if do_repair:
            raise click.BadParameter("--repair needs the log's own path, not stdin", param_hint="FILE")
        file = "/dev/stdin"
    # The file a symlink names is the one checked and repaired: the user named it.  A pipe
    # (`<(zcat x.jsonl.gz)`) or a device can be read, not cut.
    regular = stat.S_ISREG(os.stat(file).st_mode)
    if regular:
        file = os.path.realpath(file)
        _cli_common.refuse_a_store_log(file, "FILE")
    elif do_repair:
        raise click.BadParameter("--repair needs a regular file (this is a pipe or a device)", param_hint="FILE")
    repaired: dict[str, object] | None = None
    records = 0
    failure: BaseException | None = None
    try:
        try:
            records = sessionrecorder.verify(file)
        except sessionrecorder.JSONLEventLogCorruptError as exc:
            if not do_repair:
                raise
            records = exc.line - 1  # still so when the repair cannot be written (EROFS, EACCES)
            report = sessionrecorder.repair(file)  # raises again unless the damage is a torn tail
            if report is not None:
                repaired = {
                    "line": exc.line,
                    "offset": report.offset,
                    "dropped_bytes": report.dropped_bytes,
                    "dropped_preview": report.dropped_preview,
                }
            records = sessionrecorder.verify(file)
    except (sessionrecorder.JSONLEventLogCorruptError, OSError) as exc:
        failure = exc
        if isinstance(exc, sessionrecorder.JSONLEventLogCorruptError):
            records = exc.line - 1

    if as_json:
        checked = {"records": records, "repaired": repaired}
        if failure is None:
            emit_result(checked)
        else:
            code = errors.exit_code_for(failure)
            emit_result(checked, exit_code=code, error=errors.to_wire(failure))
    else:
        if repaired is not None:
            echo(
                f"repaired: cut a torn line {repaired['line']} "
                f"({repaired['dropped_bytes']} bytes at offset {repaired['offset']})"
            )
        if failure is None:
            echo(f"ok: {records} records")
        elif isinstance(failure, sessionrecorder.JSONLEventLogCorruptError):
            # Only a regular file can be cut: a pipe's torn tail is its source file's to repair.
            hint = " (--repair cuts it)" if failure.why.startswith("torn tail") and regular else ""
            echo(f"corrupt: {file} line {failure.line}: {failure.why}{hint}", err=True)
        else:
            echo(f"error: {file}: {failure}", err=True)
    if failure is not None:
        sys.exit(errors.exit_code_for(failure))


for _command in (
    _cli_run.run,
    _cli_spool.submit,
    _cli_spool.wait,
    _cli_spool.events,
    _cli_spool.cancel,
    _cli_spool.approvals,
    _cli_spool.approve,
    _cli_spool.deny,
    _cli_spool.answer,
    _cli_spool.threads,
    _cli_spool.status,
):
    cli.add_command(_command)
del _command


def main() -> None:
    # Started with stdin, stdout or stderr closed (`<&-`, `>&-`, `2>&-`): as good as /dev/null
    # (stdin then reads as empty, as `</dev/null` does: no traceback from deep inside click).
    if sys.stdin is None:
        sys.stdin = open(os.devnull)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    # Output that cannot be written (a closed pipe, a full disk) ends the command there, before
    # click's own handling (exit 1) or a command's error report could see it.
    guard_stdout()
    guard_stderr()
    _tolerate_narrow_encodings()
    # Not click's standalone mode: a usage error must still honour --json (the error object
    # on stdout, exit 2).
    _cli_common._owns_process = True
    try:
        try:
            code = cli.main(prog_name="adaptor", standalone_mode=False)
        except FileNotFoundError as exc:  # (a relative path click resolves, before the command)
            usage = _cli_common.cwd_gone(exc)
            if usage is None:
                raise
            raise usage from None
    except click.ClickException as exc:
        if "--json" in sys.argv[1:]:
            emit_json({"ok": False, "exit_code": exc.exit_code, "error": _usage_wire(exc)})
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        echo("Aborted!", err=True)
        sys.exit(1)
    finally:
        # Whatever the command, its status is decided once it is over (most have decided it
        # earlier): a signal on the way out must not replace it.
        _cli_common.status_decided()
    sys.exit(code if isinstance(code, int) else 0)


def _usage_wire(exc: click.ClickException) -> dict[str, object]:
    # The message the text report shows (`Missing argument 'ID'.`, `Invalid value for
    # '--timeout': ...`): str(exc) names no option, or the parameter by its Python name
    # (`Missing parameter: request_id`), which no user typed.
    wire = errors.to_wire(exc)
    if exc.__cause__ is None:
        # What click was handling when it refused the value (a StopIteration of its own, the
        # ValueError of float()) tells a script nothing the message does not.
        wire["cause"] = None
    # Encoded through a stand-in, so that the message is scrubbed as every foreign one is.
    wire["message"] = errors.to_wire(errors.ExternalError(wire["type"], exc.format_message()))["message"]
    return wire


def _tolerate_narrow_encodings() -> None:
    # A terminal set to latin-1 (or PYTHONIOENCODING=ascii) cannot show every character an
    # agent writes.  The result must still be printed (escaped where it must), and the exit
    # code stay the run's: a strict stream made a successful run exit 70.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if not callable(reconfigure):
            continue
        if _claims_ascii(getattr(stream, "encoding", None)):
            # What click.echo writes to such a stream anyway: the answer streamed live and the
            # progress line showed `h\xe9llo` where the final text showed `héllo`.
            reconfigure(encoding="utf-8", errors="backslashreplace")
        elif getattr(stream, "errors", None) == "strict":
            reconfigure(errors="backslashreplace")


def _claims_ascii(encoding: str | None) -> bool:
    try:
        return encoding is not None and codecs.lookup(encoding).name == "ascii"
    except LookupError:
        return False

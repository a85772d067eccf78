"""``adaptor run``: build a request from options, run it through the daemon (or in-process with
``--no-daemon``), show it live, print the result and exit with the documented code."""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click
import orjson

from adaptor import _home, _nesting, _redact, drivers, errors, events
from adaptor._cli_common import (
    StopSignal,
    clip,
    compact,
    echo,
    emit_result,
    exiting_after_a_signal,
    fail,
    guarded,
    home_option,
    interrupted,
    interrupts_unwrapped,
    read_request,
    require_daemon,
    shown,
    status_decided,
    stopping_like_ctrl_c,
    telling_when_the_daemon_stops,
)
from adaptor._cli_spool import note_invalid_output, print_text, report_verdict, submit_request
from adaptor.spool import Client, InvalidRequestError

if TYPE_CHECKING:
    from adaptor.result import Result
    from adaptord.config import DaemonConfig

F = TypeVar("F", bound=Callable[..., Any])

# --policy-NAME options: (name, path under "policy", click type, help).  Values are passed on
# unchecked: the SDK owns their domains, so a bad one fails as InvalidPolicyError (exit 3)
# exactly as it would in-process.
_POLICY_OPTIONS: tuple[tuple[str, tuple[str, ...], Any, str], ...] = (
    ("sandbox", ("sandbox",), str, "read_only | workspace_write | unrestricted"),
    ("web-search", ("web_search",), str, "allow | deny"),
    ("browser", ("browser",), str, "allow | deny"),
    (
        "active-execution-timeout",
        ("active_execution_timeout",),
        float,
        "Seconds of active execution (approval waits excluded) before the run is stopped.",
    ),
    ("permission", ("approvals", "permission"), str, "ask | auto_approve | auto_reject"),
    ("plan-review", ("approvals", "plan_review"), str, "ask | auto_approve | auto_reject"),
    ("question", ("approvals", "question"), str, "ask | auto_reject"),
    (
        "approval-timeout",
        ("approvals", "timeout"),
        float,
        "Seconds an approval may stay unanswered.",
    ),
    ("on-timeout", ("approvals", "on_timeout"), str, "abort | continue | retry"),
    ("on-reject", ("approvals", "on_reject"), str, "abort | continue | retry"),
    ("max-retries", ("approvals", "max_retries"), int, "Approval retries before aborting."),
)


def _policy_options(func: F) -> F:
    for name, _, kind, help_text in reversed(_POLICY_OPTIONS):
        option_type: Any = _RequestNumber(kind, unlimited=name == "active-execution-timeout") if kind in (int, float) else kind
        func = click.option(f"--policy-{name}", type=option_type, help=help_text)(func)
    return func


if TYPE_CHECKING:
    _NumberType = click.ParamType[Any]  # (generic only in the newer clicks we also accept)
else:
    _NumberType = click.ParamType


class _RequestNumber(_NumberType):
    """A number a request carries: what JSON cannot hold (NaN, an infinity, a float too big to be
    anything else, an integer past 64 bits) is refused naming the option and what was typed, not
    a place in a request the user never wrote."""

    def __init__(self, kind: type[int] | type[float], *, unlimited: bool = False) -> None:
        self._base: _NumberType = click.INT if kind is int else click.FLOAT
        self.name = self._base.name
        # Leaving the option out is how to say "no limit": say so to whoever typed inf.
        self._unlimited = unlimited

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self._base.convert(value, param, ctx)
        if number != number:
            self.fail(f"{value} is not a number of seconds", param, ctx)
        if _nesting.unwritable_number_at(number) is None:
            return number
        typed = str(value).strip()
        if isinstance(number, int):
            why = _nesting.describe_number(number)
        elif typed.lstrip("+-").lower() in ("inf", "infinity"):
            why = f"{typed}, which JSON cannot hold"
        else:
            why = f"{typed}, too large: it reads as {number!r}, which JSON cannot hold"
        if self._unlimited and number == float("inf"):
            why += " (leave the option out for no limit)"
        self.fail(why, param, ctx)


@click.command()
@click.argument("prompt", required=False)
@click.option(
    "--request",
    "request_file",
    type=click.File("rb"),
    help="Start from this request JSON ('-': stdin); the options below override its fields.",
)
@click.option(
    "--driver",
    type=click.Choice(drivers.NAMES),
    help="The agent driver (default: $ADAPTOR_DRIVER; required unless --request names one).",
)
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, resolve_path=True),
    help="The agent's working directory (default: the current directory).",
)
@click.option("--thread", "thread_key", metavar="KEY", help="Continue (or start) this thread.")
@click.option("--resume-only", is_flag=True, help="With --thread: fail unless it exists.")
@click.option("--fork-from", metavar="KEY", help="With --thread: fork this thread into it.")
@click.option("--model", help="The model, when the driver lets you choose.")
@click.option(
    "--timeout",
    type=_RequestNumber(float, unlimited=True),
    help="Seconds the run may take (from its start) before RunDeadlineExceededError.",
)
@click.option(
    "--schema",
    "schema_file",
    type=click.File("rb"),
    help="JSON Schema file for structured output.",
)
@click.option("--instructions", help="Instructions for the agent.")
@click.option("--append-system-prompt", help="Text appended to the agent's system prompt.")
@_policy_options
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Driver config; VALUE is JSON when it parses (steps=[...], grace_period=2), else a "
    "string (one starting with [ or { must be JSON); KEY may be dotted "
    "(descriptor.sessions.supports_resume=false).  Repeatable.",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Environment for the agent; NAME alone copies it from this environment, which "
    "keeps secrets off the command line.  Never printed.  Repeatable.",
)
@click.option(
    "--metadata", "metadata_items", multiple=True, metavar="KEY=VALUE", help="Repeatable."
)
@click.option("--id", "request_id", help="The request id (default: a new time-sortable id).")
@click.option(
    "--on-interrupt",
    type=click.Choice(["fail", "requeue"]),
    help="If the daemon dies mid-run: fail (default) or run again (at most 3 attempts).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Nothing live; print {"ok", "exit_code", "id", "result", "error"} on stdout.',
)
@click.option("-q", "--quiet", is_flag=True, help="Nothing live; print only the result text.")
@click.option(
    "--no-daemon",
    is_flag=True,
    help="Run in this process with the same request mapping (thread store and driver "
    "defaults of the daemon's home and config file).",
)
@home_option
@guarded
def run(
    prompt: str | None,
    request_file: IO[bytes] | None,
    driver: str | None,
    workspace: str | None,
    thread_key: str | None,
    resume_only: bool,
    fork_from: str | None,
    model: str | None,
    timeout: float | None,
    schema_file: IO[bytes] | None,
    instructions: str | None,
    append_system_prompt: str | None,
    config_items: Sequence[str],
    env_items: Sequence[str],
    metadata_items: Sequence[str],
    request_id: str | None,
    on_interrupt: str | None,
    as_json: bool,
    quiet: bool,
    no_daemon: bool,
    home: str | None,
    **policy: Any,
) -> None:
    """Run PROMPT ('-': read stdin) and print the result text.

    Through the daemon: submits the request, shows its events live and exits with the
    verdict's exit code (`adaptor exit-codes`).  On a terminal the text streams as it comes,
    with one line per tool call and a progress line; piped, only the final text is printed.
    Ctrl-C cancels the request and exits 130.

    \b
    Environment:
      ADAPTORD_HOME   the daemon's home; wins over --home
      ADAPTOR_DRIVER  the default --driver
      NO_COLOR        on a terminal: no faint styling
      TERM=dumb       on a terminal: no escapes at all, no progress line
    """
    readers = [
        name for name, reads in (
            ("PROMPT '-'", prompt == "-"),
            ("--request -", request_file is not None and request_file.name == "<stdin>"),
            ("--schema -", schema_file is not None and schema_file.name == "<stdin>"),
        ) if reads
    ]
    if len(readers) > 1:
        # The first would take it all, and the others would silently read "" (an empty prompt).
        raise click.UsageError(
            f"{' and '.join(readers)} both read stdin; give one of them a file" if len(readers) == 2
            else f"{', '.join(readers[:-1])} and {readers[-1]} all read stdin; give all but one of them a file"
        )
    base = read_request(request_file) if request_file is not None else {}
    if driver is None and "driver" not in base:
        # $ADAPTOR_DRIVER is the default, looked at only when it is used: a --request file
        # naming its driver wins over it, whatever it says (a driver of another version).
        driver = _driver_from_environment()
    request = _build_request(
        base=base,
        prompt=prompt,
        fields={
            "driver": driver,
            "workspace": workspace,
            "model": model,
            "timeout": timeout,
            "instructions": instructions,
            "append_system_prompt": append_system_prompt,
            "id": request_id,
            "on_interrupt": on_interrupt,
        },
        thread=(thread_key, resume_only, fork_from),
        schema=_load_schema(schema_file) if schema_file is not None else None,
        policy={
            path: policy[f"policy_{name.replace('-', '_')}"] for name, path, _, _ in _POLICY_OPTIONS
        },
        config_items=config_items,
        env_items=env_items,
        metadata_items=metadata_items,
    )
    interactive = not (as_json or quiet)
    live = Live(
        stream_text=interactive and sys.stdout.isatty(),
        hints=interactive,
        # TERM=dumb (Emacs' shell, some CI consoles) cannot erase a line: no progress line there.
        spinner=interactive
        and sys.stdout.isatty()
        and sys.stderr.isatty()
        and os.environ.get("TERM") != "dumb",
        label=str(request.get("id") or "") if not no_daemon else "",
        daemon=not no_daemon,
    )
    with stopping_like_ctrl_c():
        if no_daemon:
            _run_in_process(request, home=home, live=live, as_json=as_json)
        else:
            _run_through_daemon(request, home=home, live=live, as_json=as_json)


def _by(stop: KeyboardInterrupt) -> str:
    return f" ({stop})" if isinstance(stop, StopSignal) else ""


def _say_cancelled(text: str) -> None:
    # On a terminal, below the "^C" it echoed (or a streamed line cut short); a log file or a
    # pipe gets the line alone.
    echo(("\n" if sys.stderr.isatty() else "") + text, err=True)


# --- building the request -----------------------------------------------------------------------


def _load_schema(file: IO[bytes]) -> Any:
    data = file.read().removeprefix(codecs.BOM_UTF8)
    try:
        return _nesting.loads_exactly(data)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--schema") from None
    except _nesting.InexactNumberError as exc:
        raise click.BadParameter(str(exc), param_hint="--schema") from None


def _object_field(request: dict[str, Any], name: str) -> dict[str, Any]:
    """The request's ``name`` object, made empty when missing, for options to add to; a
    --request file's value of another type is refused (options cannot add to it)."""
    value = request.setdefault(name, {})
    if not isinstance(value, dict):
        raise click.BadParameter(f"its {name} must be an object", param_hint="--request")
    return value


def _driver_from_environment() -> str | None:
    """``$ADAPTOR_DRIVER``, checked as ``--driver`` is (None: unset or empty)."""
    name = os.environ.get("ADAPTOR_DRIVER") or None
    if name is not None and name not in drivers.NAMES:
        choices = ", ".join(repr(n) for n in drivers.NAMES)
        raise click.BadParameter(f"{name!r} is not one of {choices}.", param_hint="'$ADAPTOR_DRIVER'")
    return name


def _build_request(
    *,
    base: dict[str, Any],
    prompt: str | None,
    fields: dict[str, Any],
    thread: tuple[str | None, bool, str | None],
    schema: Any,
    policy: dict[tuple[str, ...], Any],
    config_items: Sequence[str],
    env_items: Sequence[str],
    metadata_items: Sequence[str],
) -> dict[str, Any]:
    request = dict(base)
    if prompt is not None:
        # Read as UTF-8 whatever the locale or PYTHONIOENCODING say, as --request - is (under
        # PYTHONIOENCODING=ascii a UTF-8 prompt failed with exit 70, latin-1 reached the agent
        # as mojibake); bytes that are no UTF-8 are kept for the request's own check to name.
        request["prompt"] = (
            sys.stdin.buffer.read().decode("utf-8", "surrogateescape").removeprefix("\ufeff")
            if prompt == "-" else prompt
        )
    if "prompt" not in request:
        raise click.UsageError("missing PROMPT (or a --request file with a prompt)")
    request.update({name: value for name, value in fields.items() if value is not None})
    if "driver" not in request:
        raise click.UsageError(
            "--driver is required (or $ADAPTOR_DRIVER, or a --request file naming one)"
        )
    key, resume_only, fork_from = thread
    if resume_only and fork_from is not None:
        raise click.UsageError("--resume-only and --fork-from cannot go together: a fork starts a new thread")
    if key is not None:
        request["thread"] = {"key": key, "resume_only": resume_only, "fork_from": fork_from}
    elif resume_only or fork_from is not None:
        raise click.UsageError("--resume-only and --fork-from need --thread KEY")
    if schema is not None:
        request["schema"] = schema
    given_policy = {path: value for path, value in policy.items() if value is not None}
    if given_policy:
        if request.get("policy") is None:  # ("policy": null is no policy: the options make one)
            request["policy"] = {}
        for path, value in given_policy.items():
            _put(_object_field(request, "policy"), path, value, within="policy")
    config = _object_field(request, "config")
    for key_path, raw in _assignments(config_items, "--config"):
        # Environment values are secrets and always strings: never reinterpreted as JSON,
        # so a numeric-looking one cannot end up quoted in a schema error.  The whole table
        # given as one JSON object (env={"A":"x"}) is JSON, as every object is.
        whole_table = key_path == ("env",) and raw.lstrip().startswith("{")
        value = raw if key_path[0] == "env" and not whole_table else _json_or_text(raw, ".".join(key_path))
        _put(config, key_path, value, within="config")
    if "cwd" not in config and "workspace" not in request:
        # The daemon runs elsewhere; an agent started from a shell works where the shell is,
        # unless the run names its directory (a workspace would win over the config's cwd).
        try:
            request["workspace"] = os.getcwd()
        except FileNotFoundError:  # (asked for even with --workspace given, it failed those too)
            raise click.UsageError(
                "the current directory no longer exists: give the run --workspace DIR, or cd to one"
            ) from None
    for item in env_items:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise click.BadParameter(
                    f"{name} is not set in this environment", param_hint="--env"
                )
            value = os.environ[name]
        if not name:
            raise click.BadParameter("expected NAME or NAME=VALUE", param_hint="--env")
        _put(config, ("env", name), value, within="config")
    if not config:
        del request["config"]
    for key_path, raw in _assignments(metadata_items, "--metadata"):
        _object_field(request, "metadata")[".".join(key_path)] = raw
    try:
        orjson.dumps(request)
    except TypeError as exc:  # argv and stdin undecodable as UTF-8 come as lone surrogates
        if _nesting.unwritable_number_at(request) is not None:
            return request  # an option's integer past 64 bits: refused as a NaN is, below
        where = _nesting.unwritable_text_at(request)
        if where is not None:
            raise click.UsageError(
                f"the request cannot be JSON: its value at {where or '/'} is not UTF-8 (is every "
                "argument, and the prompt read from stdin, UTF-8?)"
            ) from None
        raise click.UsageError(f"the request cannot be JSON: {exc}") from None
    return request


def _assignments(items: Sequence[str], option: str) -> Iterator[tuple[tuple[str, ...], str]]:
    for item in items:
        key, sep, raw = item.partition("=")
        path = tuple(key.split("."))
        if not sep or not all(path):
            raise click.BadParameter(f"expected KEY=VALUE, got {key!r}", param_hint=option)
        yield path, raw


def _json_or_text(raw: str, key: str) -> Any:
    try:
        return _nesting.loads_exactly(raw)
    except _nesting.InexactNumberError as exc:  # 1e400 was taken as the string "1e400"
        raise click.BadParameter(f"{key}{exc.where}: {exc.why}", param_hint="--config") from None
    except orjson.JSONDecodeError as exc:
        if raw.lstrip().startswith(("[", "{")):
            # Meant as JSON (a list, an object) and not JSON: taken as a string, it failed later
            # as "steps: expected a list of steps" for a NaN in it.
            raise click.BadParameter(f"{key}: not valid JSON: {exc}", param_hint="--config") from None
        return raw


def _put(target: dict[str, Any], path: Sequence[str], value: Any, *, within: str) -> None:
    """Set ``within.path`` (``policy.approvals.timeout``) to ``value``, making the objects on the
    way; one of another type on the way (a --request file's, an earlier option's) is refused:
    replaced, what it said would be dropped without a word (a file's approvals policy)."""
    for depth, part in enumerate(path[:-1], start=1):
        child = target.get(part)
        if child is None:  # (null: nothing there)
            child = target[part] = {}
        elif not isinstance(child, dict):
            where = ".".join((within, *path[:depth]))
            raise click.UsageError(
                f"cannot set {'.'.join((within, *path))}: {where} is of type"
                f" {_nesting.json_type(child)} (given by --request or an earlier option), not an object"
            )
        target = child
    target[path[-1]] = value


# --- running --------------------------------------------------------------------------------------


def _run_through_daemon(
    request: dict[str, Any], *, home: str | None, live: Live, as_json: bool
) -> None:
    client = Client(home)
    client._require_spool()
    # Without a daemon nothing would ever write the verdict this command waits for.
    require_daemon(client)
    from hosttools.sessionrecorder import JSONLEventLogCorruptError

    request_id: str | None = None
    try:
        # Inside the try that cancels: a Ctrl-C just after submit returned must cancel too (one
        # within it finds the request taken back by submit itself).
        try:
            request_id = submit_request(client, request)
        except InvalidRequestError as exc:  # refused here as the daemon refuses it: before a run
            given: dict[str, Any] = {"id": request["id"]} if isinstance(request.get("id"), str) else {}
            fail(exc, as_json=as_json, result=None, **given)
        live.label = request_id
        with live, interrupts_unwrapped(), telling_when_the_daemon_stops(
            client, request_id, live.note, ctrl_c="stops waiting and cancels it"
        ):
            try:
                for event in client.events(request_id, follow=True):
                    live.event(event)
            except JSONLEventLogCorruptError as exc:
                # The log is only the live view; the verdict is the outcome.  A thread's log
                # holds its earlier turns too, and a damaged line among them cost every later
                # turn its answer (exit 70 though the run succeeded).
                live.stop_following(f"adaptor: cannot show the run's events ({exc}); waiting for its verdict")
                client._await_verdict(request_id, None)
    except KeyboardInterrupt as stop:
        if request_id is None:
            interrupted(as_json, stop)
        client.cancel(request_id)
        _say_cancelled(f"adaptor: cancelled {request_id}{_by(stop)}")
        interrupted(as_json, stop, id=request_id)
    verdict = client.verdict(request_id)
    assert verdict is not None  # following ends only once the verdict exists
    report_verdict(
        client, verdict, as_json=as_json, text_shown=live.text_complete, quiet=not live.hints
    )


def _run_in_process(
    request: dict[str, Any], *, home: str | None, live: Live, as_json: bool
) -> None:
    # Only this path needs the SDK's request mapping (and the SDK itself); the daemon path
    # leaves it unimported, which keeps `adaptor run` quick to start.
    from adaptor import _request as requests
    from adaptord import config as daemon_config

    request_id = str(request.get("id") or _home.new_request_id())
    if request.get("id") is None:  # none, or null: minted, as submit does for the daemon
        request["id"] = request_id
    try:
        config = daemon_config.load(
            None,
            regular=True,
            why_regular="adaptor run --no-daemon takes its driver tables from it, and a FIFO "
            "would hold the run",
        )
    except daemon_config.ConfigError as exc:
        # adaptord refuses a broken config file as bad usage (exit 2); so does this path.
        fail(exc, as_json=as_json, exit_code=2, secrets=requests.secrets_of(request), id=request_id)
    if config.exposed is not None:
        echo(f"adaptor: warning: {config.exposed}", err=True)  # as adaptord says it at its start
    # The env of the config's table for this driver reaches the agent too; the daemon's own
    # credentials (its A2A tokens) do not, as in the daemon.
    from adaptor.drivers import _process

    _process.withhold_from_agents(config.a2a.credential_variables())
    secrets = requests.secrets_of(request, config.driver_defaults(str(request.get("driver", ""))))
    secrets += config.a2a.credential_values()
    redactor = _redact.Redactor(secrets)
    result: Result | None = None
    error: Exception | None = None
    try:
        result = _execute(
            request, request_id, config=config, home=home, live=live, redactor=redactor, as_json=as_json
        )
    except Exception as exc:
        error = exc
    if isinstance(error, errors.RunError):
        result = error.result
    summary = None if result is None else redactor.value(_result_summary(result))
    if error is not None:
        # A tool named in the config that cannot be loaded is a config error: bad usage too.
        code = 2 if isinstance(error, daemon_config.ConfigError) else None
        fail(error, as_json=as_json, exit_code=code, secrets=secrets, id=request_id, result=summary)
    assert result is not None
    if as_json:
        emit_result(summary, id=request_id)
    else:
        if not live.text_complete:
            print_text(redactor.text(result.text))
        if live.hints:
            note_invalid_output(summary)


def _execute(
    request: dict[str, Any],
    request_id: str,
    *,
    config: DaemonConfig,
    home: str | None,
    live: Live,
    redactor: _redact.Redactor,
    as_json: bool,
) -> Result:
    """What a daemon worker does with the request, in this process: the Result, or raises."""
    from adaptor import _request as requests

    # What submitting it would refuse, then the daemon's own validation: the same request is
    # refused the same way.  (A NaN written out would have read back as null: no limit.)
    try:
        body = _home.request_file_bytes(request)
    except ValueError as exc:
        raise InvalidRequestError([{"path": "", "message": str(exc)}]) from None
    parsed = requests.parse(body, request_id)
    tools = config.load_tools()
    store = None
    if parsed.get("thread"):
        from adaptor.threadstore import JSONLStore

        store = JSONLStore(_home.Home.at(home).threads)
    try:
        call = requests.build(
            parsed,
            driver_defaults=config.driver_defaults(str(parsed["driver"])),
            thread_store=store,
            on_approval=_terminal_approver(live),
            tools=tools,
            skill_provider=config.skill_catalogue(),
        )
        stream = None
        try:
            # Inside the try: the run may ask its question before start() has returned here
            # (Thread.start waits for the new thread, which may run on meanwhile), and a
            # Ctrl-C then must still cancel it (close() does, when there is no stream yet).
            stream = call.start()
            with live, interrupts_unwrapped():
                for event in stream:
                    if redactor:
                        event = events.from_json(redactor.value(events.to_json(event)))
                    live.event(event)
            try:
                return stream.result()
            finally:
                # The run's outcome is in: a signal during the close below or the report
                # must not turn its exit status into 143 (a Ctrl-C before here still cancels).
                status_decided()
        except KeyboardInterrupt as stop:
            exiting_after_a_signal()  # (the close below is then the run's stop at exit)
            if stream is not None:
                stream.cancel()
            _say_cancelled(f"adaptor: cancelled {request_id}{_by(stop)}")  # (as through the daemon)
            interrupted(as_json, stop, id=request_id)
        finally:
            call.close(10.0)
    finally:
        if store is not None:
            store.close()


def _result_summary(result: Result) -> dict[str, Any]:
    """The verdict's ``result`` object for an in-process run (no side files: ``raw`` null)."""
    full = result.to_json()
    keys = ("text", "summary", "model", "provider", "usage", "metadata", "structured")
    return {**{key: full[key] for key in keys}, "raw": None, "run_id": result.run_id}


def _terminal_approver(live: Live) -> Callable[[events.ApprovalRequest], None]:
    """In-process approvals: asked on the terminal; denied when there is none to ask on."""
    interactive = sys.stdin.isatty() and sys.stderr.isatty()

    def handler(request: events.ApprovalRequest) -> None:
        if not interactive:
            request.deny("nobody to ask: adaptor run --no-daemon without a terminal")
            return
        with live.prompting():
            keys = [choice.key for choice in request.choices]
            echo(_asking(request.kind, request.title or request.source, keys), err=True)
            try:
                if request.kind == "question":
                    reply = _ask("  answer (empty: deny): ", request)
                    if reply:
                        request.answer(reply)
                    elif reply is not None:
                        request.deny("no answer")
                else:
                    reply = _ask("  approve? [y/N]: ", request)
                    if reply is not None and reply.lower() in ("y", "yes"):
                        request.approve()
                    elif reply is not None and (reason := _ask("  reason: ", request)) is not None:
                        request.deny(reason)
            except errors.ApprovalResolvedError:
                echo("  too late: the request was already settled", err=True)

    return handler


def _asking(kind: str, title: str, choices: Sequence[str]) -> str:
    """What an approval asks, as ``run`` shows it (on this terminal, or as the hint for a
    daemon run's): its kind and title, and a question's choices on a line of their own."""
    text = f"? {kind}: {title}"
    if kind == "question" and choices:
        text += f"\n  choices: {', '.join(choices)}"
    return text


def _ask(prompt: str, request: events.ApprovalRequest) -> str | None:
    """A line typed on the terminal, or ``None`` once ``request`` was settled meanwhile.

    The question is asked on the run's thread, which a Ctrl-C (delivered to the main thread)
    does not interrupt: a plain ``input()`` kept the run, and the command, waiting for a line
    after the cancel.  So the terminal is polled, and a request cancelled, timed out or
    answered elsewhere ends the wait.
    """
    echo(prompt, err=True, nl=False)
    while not request.settled:
        readable, _, _ = select.select([sys.stdin], [], [], _PROMPT_POLL)
        if readable:
            return sys.stdin.readline().strip()  # "" at the end of input: no answer
    echo("", err=True)
    return None


_PROMPT_POLL = 0.2


# --- live output ----------------------------------------------------------------------------------


def _columns(stream: IO[str]) -> int:
    """The width of the terminal ``stream`` writes to, asked again at each redraw (a resized
    window); 80 when it cannot say."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


def _fit(line: str, columns: int) -> str:
    """``line`` cut to fewer than ``columns`` cells (wide characters take two), "…" ending a cut
    one: the last cell stays free, as a line that fills it wraps on some terminals."""
    room = max(columns - 1, 1)
    cells = 0
    for index, char in enumerate(line):
        cells += 2 if unicodedata.east_asian_width(char) in "WF" else 1
        if cells > room:
            return line[: max(index - 1, 0)] + "…"
    return line


def _dim(text: str) -> str:
    """``text`` shown faint, unless ``NO_COLOR`` asks for no styling (https://no-color.org) or
    ``TERM=dumb`` says the terminal shows none."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return click.style(text, dim=True)


class Live:
    """What ``adaptor run`` shows while a run is live.

    ``stream_text``: assistant text as it streams and one line per tool call, on stdout.
    ``hints``: how to answer an approval, on stderr.  ``spinner``: a progress line on stderr,
    drawn only at the start of an empty line so it never mangles streamed text.
    """

    _FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(
        self, *, stream_text: bool, hints: bool, spinner: bool, label: str, daemon: bool
    ) -> None:
        self.stream_text = stream_text
        self.hints = hints
        self.spinner = spinner
        self.label = label
        self.daemon = daemon
        self._text_shown = False
        self._text_lost = False
        self._phase = "queued" if daemon else "starting"
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._at_line_start = True
        self._spinner_visible = False
        self._paused = False
        self._started = time.monotonic()

    @property
    def text_complete(self) -> bool:
        """Whether the whole text was already streamed (so it need not be printed again)."""
        return self._text_shown and not self._text_lost

    def __enter__(self) -> Live:
        if self.spinner:
            spinner = threading.Thread(target=self._spin, name="adaptor-spinner", daemon=True)
            with contextlib.suppress(RuntimeError):  # no thread to spare: no spinner, that is all
                spinner.start()
                self._thread = spinner
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
        with self._lock:
            self._clear_spinner()
            if not self._at_line_start:
                self._write(sys.stdout, "\n")

    def event(self, event: events.Event) -> None:
        with self._lock:
            self._clear_spinner()
            match event:
                case events.RunStarted():
                    self._phase = "running"
                case events.TextDelta(phase="content") if self.stream_text and event.text:
                    self._write(sys.stdout, shown(event.text))  # a terminal: as echo() shows it
                    self._text_shown = True
                case events.TextDelta(phase="end") if self.stream_text and not self._at_line_start:
                    self._write(sys.stdout, "\n")
                case events.ToolCall(phase="start") if self.stream_text:
                    # One line per call, as the arguments get: a model names tools at will.
                    args = compact(event.args)
                    self._line(sys.stdout, _dim(f"⚙ {clip(event.name)} {args}".rstrip()))
                case events.Notice(kind="approval.requested") if self.hints:
                    self._approval_hint(event)
                case events.Notice(kind="lifecycle") if (
                    self.hints and event.data.get("phase") == "thread.new_session"
                ):
                    # The thread's conversation is left behind (another workspace, say): said
                    # only in the audit log, it went unnoticed by whoever ran the turn.
                    self._line(sys.stderr, f"adaptor: {clip(event.text)}")
                case events.Dropped() if any(kind.startswith("text.") for kind in event.by_kind):
                    self._text_lost = True

    def stop_following(self, why: str) -> None:
        """The events can no longer be read: say why; the text is printed whole at the end."""
        with self._lock:
            self._text_lost = True
        self.note(why)

    def note(self, text: str) -> None:
        """A line for the person at the terminal, on stderr (nothing with ``--quiet``/``--json``)."""
        if not self.hints:
            return
        with self._lock:
            self._clear_spinner()
            self._line(sys.stderr, text)

    def _approval_hint(self, notice: events.Notice) -> None:
        data = notice.data
        if data.get("default_result") != "ask" or not self.daemon:
            return  # settled by policy, or asked on this terminal
        approval_id, kind = data.get("request_id"), str(data.get("kind"))
        how = (
            f"adaptor answer {approval_id} OPTION"
            if kind == "question"
            else f"adaptor approve {approval_id}"
        )
        # What is asked, as in-process runs ask it: without it the person who must decide
        # saw only the id and had to list the approvals elsewhere to learn what it was about.
        choices = [str(key) for key in data.get("choices") or ()]
        asked = _asking(kind, notice.text or str(data.get("source") or ""), choices)
        if sys.stderr.isatty():
            asked = shown(asked)  # the agent's words: they cannot drive the terminal
        self._phase = "waiting for approval"
        self._line(sys.stderr, f"{asked}\n  {how} | adaptor deny {approval_id}")

    @contextmanager
    def prompting(self) -> Iterator[None]:
        """Hold the terminal for a question to the user (the spinner stays away meanwhile).

        The lock is not held while the question waits: a Ctrl-C leaves ``with live`` (which
        takes it) before the run is cancelled, and only the cancel ends the question.
        """
        with self._lock:
            self._clear_spinner()
            if not self._at_line_start:
                self._write(sys.stdout, "\n")
            self._paused = True
        try:
            yield
        finally:
            with self._lock:
                self._paused = False

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(0.1):
            with self._lock:
                if not self._at_line_start or self._paused:
                    continue
                elapsed = int(time.monotonic() - self._started)
                label = f"{self.label} · " if self.label else ""
                line = f"{self._FRAMES[frame % len(self._FRAMES)]} {label}{self._phase} · {elapsed}s"
                # Within the terminal's width: a wrapped line is cleared only in its last row,
                # and every redraw left the rows above it behind (a narrow pane filled up).
                text = f"\r{_fit(line, _columns(sys.stderr))}\x1b[K"
                self._write(sys.stderr, _dim(text))
                self._spinner_visible = True
                frame += 1

    def _clear_spinner(self) -> None:
        if self._spinner_visible:
            self._write(sys.stderr, "\r\x1b[K")
            self._spinner_visible = False

    def _line(self, stream: IO[str], text: str) -> None:
        if not self._at_line_start:
            self._write(sys.stdout, "\n")
        self._write(stream, text + "\n")

    def _write(self, stream: IO[str], text: str) -> None:
        stream.write(text)
        stream.flush()
        if stream is sys.stdout:
            self._at_line_start = text.endswith("\n")

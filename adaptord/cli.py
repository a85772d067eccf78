"""The ``adaptord`` command: serve, status, check."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import ParamSpec

import click
import orjson

from adaptor import _home, skill
from adaptor._cli_common import (
    cwd_gone,
    guard_stderr,
    guard_stdout,
    home_option,
    not_nan,
    note_outcome,
    unguard,
)
from adaptor._one_line import one_line
from adaptord import config as config_module

P = ParamSpec("P")

DRIVER_BINARIES = {
    "claude": "claude",
    "codex": "codex",
    "cursor": "cursor-agent",
    "codebuddy": "codebuddy",
    "gemini": "gemini",
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="adaptor", prog_name="adaptord")
def cli() -> None:
    """The adaptor spool daemon: runs request files dropped into its spool directory.

    \b
    Environment:
      ADAPTORD_HOME    the home; wins over --home
                       (default: $XDG_STATE_HOME/adaptord, ~/.local/state/adaptord)
      XDG_CONFIG_HOME  the config file is $XDG_CONFIG_HOME/adaptord/config.toml
      NOTIFY_SOCKET    serve tells systemd READY and STOPPING (Type=notify)
      WATCHDOG_USEC    serve pings systemd's watchdog (WatchdogSec=)
    """


@cli.command()
@home_option
@click.option("--workers", type=click.IntRange(1, 256), help="Requests run at once (default 4, or the config file's).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file (default: $XDG_CONFIG_HOME/adaptord/config.toml).")
@click.option(
    "--grace",
    type=click.FloatRange(min=0, max=config_module.MAX_GRACE),
    callback=not_nan,
    help=f"Seconds running work may finish after SIGTERM (default 30, at most {config_module.MAX_GRACE}).",
)
@click.option("--a2a", "a2a_listen", metavar="HOST:PORT", help="Also serve the config's [a2a.agents] over A2A (PORT alone: loopback; 0: any free port, logged as a2a.listening url=...).")
def serve(home: str | None, workers: int | None, config_path: str | None, grace: float | None, a2a_listen: str | None) -> None:
    """Run the daemon in the foreground (logs to stderr, one line per fact).

    Exit 0 after a stop (SIGTERM, SIGINT), 2 for a config error or a home others can write
    to, 69 when another adaptord serves the home or it cannot be used, 70 when its --a2a
    listener died or the home's lock file went away while serving (the systemd unit restarts
    on 70, not on 2 or 69).
    """
    from adaptord.daemon import Daemon

    unguard()
    try:
        config = config_module.load(config_path, required=config_path is not None, regular=True)
    except config_module.ConfigError as exc:
        _refusal(config_module.one_line(f"adaptord: {exc}"))
        sys.exit(2)
    listen = None
    if a2a_listen is not None:
        try:
            from adaptord import a2a_bridge
        except ImportError as exc:
            from adaptor.clients.a2a import INSTALL_HINT

            _refusal(
                f"adaptord: --a2a needs the a2a extra, a2a-sdk[http-server] and uvicorn ({exc.name} is "
                f"missing): {INSTALL_HINT}"
            )
            sys.exit(2)
        try:  # refused here, before anything starts: a bad address, no agents, no token off loopback
            listen = a2a_bridge.Listen.parse(a2a_listen)
            a2a_bridge.check(listen, config.a2a)
        except ValueError as exc:
            _refusal(config_module.one_line(f"adaptord: {exc}"))
            sys.exit(2)
    daemon = Daemon(_home.Home.at(home), config, workers=workers, grace=grace, config_path=config_path, a2a=listen)
    try:
        code = daemon.serve()
    except config_module.ConfigError as exc:
        _refusal(config_module.one_line(f"adaptord: {exc}"))
        sys.exit(2)
    daemon.leave(code)


def _refusal(text: str) -> None:
    """Say on stderr why the daemon will not serve: a warning in systemd's journal, as the
    daemon's own reports of a problem are (the unit does not restart on exit 2)."""
    from adaptord import _lifecycle

    click.echo(f"<{_lifecycle.WARNING}>{text}" if _lifecycle.to_journal() else text, err=True)


def _ctrl_c_exits_130(command: Callable[P, None]) -> Callable[P, None]:
    """A Ctrl-C ends ``command`` with 130, as every ``adaptor`` command, not with click's
    "Aborted!" and exit 1 (the status of no outcome of ours)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except KeyboardInterrupt:
            sys.exit(128 + signal.SIGINT)

    return wrapper


# `status --json` prints each of these always, null where it does not apply (no daemon, a
# damaged adaptord.json, no A2A listener): scripts doing `jq .pid` read one shape.
_STATUS_FIELDS = ("pid", "started_at", "workers", "cpu", "version", "a2a_url")


@cli.command()
@_ctrl_c_exits_130
@home_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='One object, every key always present: {"running", "home", "pid", "started_at", '
    '"workers", "cpu", "version", "a2a_url"} (null where it does not apply; "cpu": the CPU the '
    'daemon\'s threads are kept on, one_cpu).',
)
def status(home: str | None, as_json: bool) -> None:
    """Exit 0 while a daemon serves this home, 69 when none does (or this user cannot tell:
    the home is another user's)."""
    paths = _home.Home.at(home)
    try:
        running = _home.daemon_running(paths)
    except _home.ForeignHomeError as exc:
        note_outcome(69)
        click.echo(config_module.one_line(f"adaptord: {exc}"), err=True)
        if as_json:  # "running": null, neither true nor false
            click.echo(orjson.dumps({"running": None, "home": str(paths.root), **dict.fromkeys(_STATUS_FIELDS)}).decode())
        sys.exit(69)
    note_outcome(0 if running else 69)
    info: dict[str, object] = {}
    if running:
        try:
            info = _home.daemon_state(paths)
        except ValueError as exc:
            click.echo(config_module.one_line(f"adaptord: {exc}"), err=True)
    if as_json:
        report = {"running": running, "home": str(paths.root), **{key: info.get(key) for key in _STATUS_FIELDS}}
        click.echo(orjson.dumps(report).decode())
    else:
        pid = info.get("pid")
        click.echo(f"adaptord {'running' if running else 'not running'} for {one_line(str(paths.root))}" + (f" (pid {pid})" if pid else ""))
    sys.exit(0 if running else 69)


@cli.command()
@_ctrl_c_exits_130
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file (default: $XDG_CONFIG_HOME/adaptord/config.toml).")
def check(config_path: str | None) -> None:
    """Validate the config file and report which agent CLIs are on PATH, with versions.

    Exit 2 when the config is refused, names a tool that is no valid tool, names a driver
    command that is not there, or offers a skill that cannot be staged; the exit status is the
    verdict even when the reader goes away (`adaptord check | head -1`).
    """
    ok = True
    # The report is printed once it is whole, with the verdict as the exit status even when
    # the reader goes away first (`adaptord check | head -1`).
    report: list[str] = []
    say = report.append
    config = config_module.DaemonConfig()
    try:
        # A pipe is read only when named (`--config <(...)`): a FIFO at the default path held
        # the check for good, as `serve` and `run --no-daemon` refuse it.
        config = config_module.load(config_path, required=config_path is not None, regular=config_path is None)
        # A config that loads but whose tools do not (no such module) is still checked for its
        # drivers and skills: they were checked as the defaults' ("claude not found on PATH"
        # for a configured /usr/local/bin/claude).
        tools = config.load_tools()
        invalid = config_module.invalid_tools(tools)
        source = config.source or "defaults; no config file"
        if invalid:
            # The daemon serves with such a tool, and every request selecting it fails (exit 3).
            say(f"config: loads, but requests selecting these tools would fail ({source}):")
            for name, why in invalid.items():
                say(f"tools.{name}: not a valid tool: {why}")
            ok = False
        else:
            say(f"config: ok ({source})")
        for name, keys in config_module.shared_tool_names(tools).items():
            shown = ", ".join(f"tools.{key}" for key in keys)
            say(f"{shown}: all serve the tool {name!r}: a request may select only one of them")
        if config.exposed is not None:
            # Served as it is (exit 0 if all else is): a warning, as the daemon's own at start.
            say(f"warning: {config.exposed}")
    except config_module.ConfigError as exc:
        say(config_module.one_line(f"config: {exc}"))
        ok = False
    catalogue = config.skill_catalogue()
    for directory in catalogue.directories if catalogue else ():
        ok = _check_skill_directory(directory, say) and ok
    # The command driver has no binary of its own: only one its table names is looked at, and
    # never run (--version could do anything).
    for driver, binary in {**DRIVER_BINARIES, "command": None}.items():
        configured = config.driver_defaults(driver).get("command")
        if configured is None and binary is None:
            continue
        command = str(configured or binary)
        path = shutil.which(command)
        if path is None:
            missing = "is not an executable file" if os.sep in command else "not found on PATH"
            if configured:
                # Named in the config, unlike a CLI merely not installed: every run of this
                # driver would fail (exit 69), so the config is not ok.
                say(f"{driver}: {command} {missing} (drivers.{driver}.command: every {driver} run would fail)")
                ok = False
            else:
                say(f"{driver}: {command} {missing}")
            continue
        if binary is None:
            say(f"{driver}: {path}")
            continue
        try:
            proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
            version = (proc.stdout or proc.stderr).strip().splitlines()[0] if (proc.stdout or proc.stderr).strip() else "?"
        except (OSError, subprocess.TimeoutExpired) as exc:
            version = f"cannot run --version: {exc}"
        say(f"{driver}: {path} ({version})")
    note_outcome(0 if ok else 2)
    click.echo("\n".join(report))
    sys.exit(0 if ok else 2)


def _check_skill_directory(directory: str, say: Callable[[str], object]) -> bool:
    """Report what ``directory`` offers; False when a skill in it could not be staged.

    Each skill is staged for real (into a scratch folder, with the limits a run has), so what
    is reported is what a request selecting it would meet.
    """
    if not os.path.isdir(directory):
        # Not an error: the folder may be made after the config.
        say(f"skills: {directory} (missing: offers nothing)")
        return True
    offered = skill.Directories([directory]).catalogue()
    failures: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="adaptord-check-") as scratch:
        for index, each in enumerate(offered):
            try:
                skill.materialize([each], os.path.join(scratch, str(index)))
            except skill.SkillMaterializationError as exc:
                failures.append((each.key, str(exc.cause) if exc.cause else str(exc)))
    state = f"{len(offered)} skill(s)"
    if failures:
        state += f", {len(failures)} of them cannot be staged"
    say(f"skills: {directory} ({state})")
    for key, why in failures:
        # Every request selecting it fails (exit 3), as the same skill does in-process.
        say(config_module.one_line(f"skills: {os.path.join(directory, key)}: cannot be staged: {why}"))
    return not failures


def _open_standard_descriptors() -> None:
    """Put /dev/null where stdin, stdout or stderr is closed (``adaptord serve >&- 2>&-``).

    Otherwise the first files the daemon opens take those numbers, and whatever writes to
    "stderr" at the descriptor level (the interpreter's fatal-error report, a library's C code)
    writes into an audit log or a lock file.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if opened != fd:  # not reached: 0, 1 and 2 are taken in order
                os.close(opened)


def main() -> None:
    _open_standard_descriptors()
    # Started with stdout or stderr closed, the interpreter left them None (the descriptors are
    # /dev/null now).  Then, as for every adaptor command: a reader gone (`| head`) ends a
    # command quietly with 0, a full disk says so with 70, a diagnostic that cannot be written
    # is dropped and the exit status stays the command's own.  serve gives them back.
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    guard_stdout("adaptord")
    guard_stderr()
    try:
        cli(prog_name="adaptord")
    except FileNotFoundError as exc:
        usage = cwd_gone(exc)
        if usage is None:
            raise
        usage.show()
        sys.exit(usage.exit_code)

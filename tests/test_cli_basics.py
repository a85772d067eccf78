"""The console scripts are installed and answer as documented."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adaptor import _cli_common, _home, errors, events


def test_exit_codes_table_matches_the_taxonomy() -> None:
    proc = subprocess.run(["adaptor", "exit-codes"], capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    # The spec's table, then the exits by a signal (128 + its number).
    assert [int(line.split()[0]) for line in lines] == [0, 1, 2, 3, 4, 5, 69, 70, 75, 124, 129, 130, 143]
    assert "ThreadBusyError" in lines[8]
    assert [line.split()[1] for line in lines[10:]] == ["SIGHUP", "Ctrl-C", "SIGTERM"]

    as_json = subprocess.run(
        ["adaptor", "exit-codes", "--json"], capture_output=True, text=True, check=True
    )
    outcome = json.loads(as_json.stdout)
    assert outcome["ok"] is True and outcome["exit_code"] == 0
    rows = outcome["result"]
    assert [(r["exit_code"], r["meaning"]) for r in rows] == [*errors.EXIT_CODES, *_cli_common.SIGNAL_EXITS]


def test_the_exit_codes_read_as_errors_md_says() -> None:
    # `adaptor exit-codes` said "SIGTERM (kill, timeout)", where errors.md (and cli.md: plain
    # `timeout` reports its own 124) name `timeout --preserve-status`; errors.md, which says
    # the command prints its table, had other words in the rows of 1 and 4.
    table = (Path(__file__).parent.parent / "docs" / "errors.md").read_text()
    for code, meaning in [*errors.EXIT_CODES, *_cli_common.SIGNAL_EXITS]:
        row = next(line for line in table.splitlines() if line.startswith(f"| {code} |"))
        assert row.split("|")[2].strip().replace("`", "") == meaning, code


def test_both_commands_print_help() -> None:
    for command in ("adaptor", "adaptord"):
        proc = subprocess.run([command, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0
        assert "Usage:" in proc.stdout


def test_an_event_line_of_a_failure_without_a_reason_has_no_empty_field() -> None:
    from adaptor import _cli_common, events

    finished = events.RunFinished(run_id="run_1", failed=True, message="thread is busy")
    assert _cli_common.summary(finished) == "failed: thread is busy"
    finished = events.RunFinished(run_id="run_1", failed=True, reason="agent_error", message="boom")
    assert _cli_common.summary(finished) == "failed: agent_error: boom"


NASTY = "two\nlines\u202eevil\x1b[2J"


@pytest.mark.parametrize(
    "event",
    [
        events.ToolCall(id="c1", name=NASTY, args={"x": 1}, phase="start"),
        events.ToolCall(id="c1", name=NASTY, phase="start"),
        events.ToolCall(id="c1", name=NASTY, result=1, phase="end"),
        events.ToolResult(id=NASTY, result="r"),
        events.TextDelta(message_id=NASTY, phase="start"),
        events.RunStarted(run_id=NASTY),
    ],
    ids=["tool start", "tool start without args", "tool end", "tool result", "message start", "run started"],
)
def test_a_name_the_model_chose_stays_on_its_events_line(event: events.Event) -> None:
    # The one-line summary escaped texts, arguments and results, not a tool's name (nor an id):
    # a name holding a newline split the line (and could fake an event line after it), and its
    # escape sequences reached a terminal through `adaptor events ID | grep tool`.
    line = _cli_common.event_line(1, datetime(2026, 12, 7, tzinfo=UTC), event)
    assert "\n" not in line and "\u202e" not in line and "\x1b" not in line
    assert "two\\nlines\\u202eevil\\x1b[2J" in line


def test_an_event_line_never_carries_a_terminal_control_sequence() -> None:
    # Agent text reached the terminal as it was: a clear-screen or retitling sequence ran.
    from adaptor import _cli_common, events

    text = events.TextDelta(text="a\x1b]0;owned\x07b\x1b[2J\x01c\td\r\n\x9b")
    line = _cli_common.summary(text)
    assert line == "a\\x1b]0;owned\\x07b\\x1b[2J\\x01c\td\\r\\n\\x9b"
    assert not any(ord(ch) < 0x20 and ch != "\t" or 0x7F <= ord(ch) < 0xA0 for ch in line)


def test_a_usage_error_in_json_says_what_the_text_says() -> None:
    # The object's message named the parameter by its Python name (`Missing parameter:
    # request_id`) or named no option at all; a script shows the user the same line as a human gets.
    for args, message in (
        (["wait", "--json"], "Missing argument 'ID'."),
        (["wait", "x", "--timeout", "abc", "--json"], "Invalid value for '--timeout': 'abc' is not a valid float range."),
    ):
        proc = subprocess.run(["adaptor", *args], capture_output=True, text=True)
        assert proc.returncode == 2
        error = json.loads(proc.stdout)["error"]
        assert error["message"] == message and f"Error: {message}" in proc.stderr
        # (Not what click was handling as it refused: a bare StopIteration for a --driver
        # choice, the ValueError of float() for a number.)
        assert error["cause"] is None, error


def test_a_refused_choice_in_json_has_no_cause_of_clicks_own() -> None:
    proc = subprocess.run(["adaptor", "run", "--json", "--driver", "nonsense", "p"], capture_output=True, text=True)
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["message"].startswith("Invalid value for '--driver': 'nonsense' is not one of")
    assert error["cause"] is None, error


def test_a_stderr_that_cannot_be_written_leaves_the_exit_status_alone(tmp_path: Path) -> None:
    # `2>&1 | grep -q x` with the reader gone, or a descriptor open only for reading: the failed
    # report raised, and every such command exited 1, the code of a RunError.
    def stderr_gone() -> int:
        read_end, write_end = os.pipe()
        os.close(read_end)
        return write_end

    def stderr_read_only() -> int:
        return os.open(os.devnull, os.O_RDONLY)

    for make in (stderr_gone, stderr_read_only):
        for args, code in ((["wait"], 2), (["status", "--home", str(tmp_path / "none")], 69)):
            stderr = make()
            try:
                proc = subprocess.run(["adaptor", *args], stdout=subprocess.PIPE, stderr=stderr)
            finally:
                os.close(stderr)
            assert proc.returncode == code, (make.__name__, args)


def test_a_closed_stdin_reads_as_empty(tmp_path: Path) -> None:
    # `adaptor submit <&-` ended in a traceback deep inside click (exit 1), `run -` in an
    # AttributeError reported as an infrastructure failure (exit 70): now as with </dev/null.
    home = tmp_path / "home"
    (home / "spool" / "new").mkdir(parents=True)
    (home / "spool" / "tmp").mkdir()
    for args, code in (
        (["submit"], 2),  # an empty request is no JSON
        (["run", "--request", "-"], 2),
        (["run", "--driver", "script", "-"], 69),  # an empty prompt, and no daemon to run it
    ):
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" <&-', "sh", "adaptor", *args, "--home", str(home)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == code and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_a_relative_xdg_directory_is_ignored_as_the_xdg_spec_asks(tmp_path: Path) -> None:
    # Resolved against the current directory, `adaptord serve` and `adaptor status` started in
    # two directories used two homes (and two config files); now ~/.local/state and ~/.config.
    user = tmp_path / "user"
    cwd = tmp_path / "cwd"
    (cwd / "rel" / "adaptord").mkdir(parents=True)
    (cwd / "rel" / "adaptord" / "config.toml").write_text('workers = "many"\n')
    env = {k: v for k, v in os.environ.items() if k != "ADAPTORD_HOME"}
    env |= {"HOME": str(user), "XDG_STATE_HOME": "rel", "XDG_CONFIG_HOME": "rel"}
    status = subprocess.run(
        ["adaptor", "status", "--json"], capture_output=True, text=True, cwd=cwd, env=env
    )
    assert json.loads(status.stdout)["result"]["home"] == str(user / ".local" / "state" / "adaptord")
    check = subprocess.run(["adaptord", "check"], capture_output=True, text=True, cwd=cwd, env=env)
    assert check.stdout.splitlines()[0] == "config: ok (defaults; no config file)", check.stdout


@pytest.mark.parametrize("home", ["", "me", "./x"])
def test_an_empty_or_relative_home_variable_is_taken_as_unset(tmp_path: Path, home: str) -> None:
    # HOME="" made the home /.local/state/adaptord, at the root; a relative HOME one home per
    # current directory, what a relative XDG_STATE_HOME is ignored for.  Both now mean the
    # user's home from the password database, as an unset HOME does.
    env = {k: v for k, v in os.environ.items() if k not in ("ADAPTORD_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME")}
    env["HOME"] = home
    expected = str(Path(pwd.getpwuid(os.getuid()).pw_dir) / ".local" / "state" / "adaptord")
    for cwd in (tmp_path / "a", tmp_path / "b"):
        cwd.mkdir()
        status = subprocess.run(["adaptor", "status", "--json"], capture_output=True, text=True, cwd=cwd, env=env)
        assert json.loads(status.stdout)["result"]["home"] == expected, status.stdout
    # A "~" in ADAPTORD_HOME is that home too.
    env["ADAPTORD_HOME"] = "~/elsewhere"
    status = subprocess.run(["adaptor", "status", "--json"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert json.loads(status.stdout)["result"]["home"] == str(Path(pwd.getpwuid(os.getuid()).pw_dir) / "elsewhere")


def test_adaptor_home_is_said_to_be_no_home_variable(tmp_path: Path) -> None:
    # Written by analogy with ADAPTOR_DRIVER, it sent every command to the default home
    # without a word ("adaptord not running" there).
    env = {k: v for k, v in os.environ.items() if k != "ADAPTORD_HOME"}
    env.update(ADAPTOR_HOME=str(tmp_path / "meant"), XDG_STATE_HOME=str(tmp_path / "state"))
    said = (f"adaptor: ADAPTOR_HOME is not read; the home is named by ADAPTORD_HOME (the daemon's) or --home, "
            f"else {tmp_path / 'state' / 'adaptord'}\n")
    assert subprocess.run(["adaptor", "threads"], capture_output=True, text=True, env=env).stderr.startswith(said)
    # Nothing to say once the home is named.
    named = subprocess.run(["adaptor", "threads", "--home", str(tmp_path / "h")], capture_output=True, text=True, env=env)
    assert "ADAPTOR_HOME" not in named.stderr


def test_a_home_whose_path_holds_a_newline_or_an_escape_is_shown_on_one_line(tmp_path: Path) -> None:
    # `adaptor status`, `adaptord status` and "adaptord is not running for ..." printed the path
    # as it is: two lines, and an ESC that drove the terminal.
    home = tmp_path / "two\nlines \x1b[31mred"
    env = {k: v for k, v in os.environ.items() if k != "ADAPTORD_HOME"}
    for command in (["adaptor", "status"], ["adaptord", "status"],
                    ["adaptor", "run", "--driver", "script", "go"], ["adaptor", "submit", "-"]):
        proc = subprocess.run([*command, "--home", str(home)], input='{"driver": "script", "prompt": "x"}',
                              capture_output=True, text=True, env=env)
        output = proc.stdout + proc.stderr
        assert "two\\nlines" in output and "\x1b" not in output, (command, output)
        assert not any(line.startswith("lines") for line in output.splitlines()), (command, output)


_SIGNAL_AT_IMPORT = """
import os, sys

class _SignalAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == "click":  # the CLI is being imported: the command has not begun
            sys.meta_path.remove(self)
            os.kill(os.getpid(), int(os.environ["SIGNAL_AT_IMPORT"]))
        return None

sys.meta_path.insert(0, _SignalAtImport())
"""


@pytest.mark.parametrize(("signum", "by"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
@pytest.mark.parametrize("command", [["adaptor"], [sys.executable, "-m", "adaptor"]])
def test_a_signal_while_the_cli_is_imported_ends_it_as_one_a_moment_later_would(
    tmp_path: Path, signum: int, by: str, command: list[str]
) -> None:
    # A Ctrl-C in the first 0.1 s printed a KeyboardInterrupt traceback from inside an import
    # (exit 1), and a SIGTERM ended the command without its --json object.
    (tmp_path / "sitecustomize.py").write_text(_SIGNAL_AT_IMPORT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SIGNAL_AT_IMPORT": str(int(signum)),
           "ADAPTORD_HOME": str(tmp_path / "home")}
    for as_json in (False, True):
        done = subprocess.run([*command, "status", *(["--json"] if as_json else [])],
                              capture_output=True, text=True, env=env, timeout=60)
        assert (done.returncode, done.stderr) == (128 + signum, "")
        if as_json:
            report = json.loads(done.stdout)
            assert (report["exit_code"], report["error"]["type"]) == (128 + signum, "CancelledError")
            assert report["error"]["message"] == f"stopped by {by}"
        else:
            assert done.stdout == ""


@pytest.mark.parametrize("command", [["status"], ["check", "--config", "/nonexistent.toml"]])
def test_adaptord_check_and_status_end_as_a_ctrl_c_would_while_still_importing(
    tmp_path: Path, command: list[str]
) -> None:
    # Noted only for serve: check and status printed an import's KeyboardInterrupt traceback.
    (tmp_path / "sitecustomize.py").write_text(_SIGNAL_AT_IMPORT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SIGNAL_AT_IMPORT": str(int(signal.SIGINT)),
           "ADAPTORD_HOME": str(tmp_path / "home")}
    done = subprocess.run(["adaptord", *command], capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")


@pytest.mark.parametrize("command", [["adaptor", "status", "--json"], ["adaptord", "status"]])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_the_parent_ignores_stays_ignored_while_the_cli_imports(
    tmp_path: Path, command: list[str], signum: int
) -> None:
    # nohup (SIGHUP) and a script's `cmd &` (SIGINT) start a command with them ignored; taken
    # during the import all the same, one ended it (129, 130) where it used to go on.
    (tmp_path / "sitecustomize.py").write_text(_SIGNAL_AT_IMPORT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SIGNAL_AT_IMPORT": str(int(signum)),
           "ADAPTORD_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60,
                          preexec_fn=lambda: signal.signal(signum, signal.SIG_IGN))
    assert done.returncode == 69, (done.stdout, done.stderr)  # no daemon: the command ran


def test_a_ctrl_c_during_adaptord_check_exits_130(tmp_path: Path) -> None:
    # Click's own handling: "Aborted!" and exit 1, the status of no outcome of adaptord's.
    asked = tmp_path / "asked"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"  # takes its time to answer --version
    claude.write_text(f'#!/bin/sh\ntouch "{asked}"\nsleep 30\necho "claude 1.0"\n')
    claude.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "XDG_CONFIG_HOME": str(tmp_path)}
    proc = subprocess.Popen(["adaptord", "check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        for _ in range(600):
            if asked.exists():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (130, b"")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_adaptord_help_version_and_usage_errors_handle_their_output_as_adaptor_does(tmp_path: Path) -> None:
    # Guarded in status and check only: --help to a full disk was a traceback (exit 1), to a
    # reader gone exit 1, and a usage error with stderr unwritable exit 1, not 2.
    for args in (["--help"], ["--version"], ["serve", "--help"], ["check", "--help"]):
        with open("/dev/full", "wb") as full:
            proc = subprocess.run(["adaptord", *args], stdout=full, stderr=subprocess.PIPE)
        assert (proc.returncode, proc.stderr) == (70, b"adaptord: cannot write the output: No space left on device\n")
        gone = subprocess.Popen(["adaptord", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert gone.stdout is not None and gone.stderr is not None
        gone.stdout.close()
        assert (gone.wait(timeout=60), gone.stderr.read()) == (0, b"")
    with open("/dev/full", "wb") as full:
        assert subprocess.run(["adaptord", "nosuch"], stderr=full).returncode == 2
    # A diagnostic that cannot be written is dropped; the report still comes, with its status.
    named = tmp_path / "afile"
    named.touch()
    env = {**os.environ, "ADAPTORD_HOME": str(tmp_path / "home")}
    with open("/dev/full", "wb") as full:
        status = subprocess.run(["adaptord", "status", "--home", str(named)], stdout=subprocess.PIPE, stderr=full, env=env)
    assert (status.returncode, status.stdout) == (69, f"adaptord not running for {tmp_path / 'home'}\n".encode())


def test_help_names_the_exit_codes_and_environment_that_apply() -> None:
    # A scripter reads --help, not docs/: the exits and variables each command answers to.
    expected = {
        ("adaptor",): ("adaptor exit-codes", "ADAPTORD_HOME", "ADAPTOR_DRIVER", "NO_COLOR", "TERM=dumb"),
        ("adaptor", "run"): ("exit-codes", "ADAPTORD_HOME", "ADAPTOR_DRIVER", "NO_COLOR", "TERM=dumb"),
        ("adaptor", "cancel"): ("Exit 2", "69"),
        ("adaptor", "events"): ("Exit 2", "4 for a --thread", "70"),
        ("adaptor", "approvals"): ("69", "no daemon"),
        ("adaptor", "threads"): ("69", "exits 4"),
        ("adaptord",): ("ADAPTORD_HOME", "XDG_CONFIG_HOME", "NOTIFY_SOCKET"),
        ("adaptord", "check"): ("Exit 2",),
        ("adaptord", "serve"): ("Exit 0", "2 for a config error", "69", "70"),
        ("adaptord", "status"): ('"a2a_url"',),  # --json had no help at all
    }
    for command, words in expected.items():
        proc = subprocess.run([*command, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0
        text = " ".join(proc.stdout.split())  # as wrapped for the terminal's width
        for word in words:
            assert word in text, (command, word)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_python_swallowed_is_delivered_again(signum: signal.Signals) -> None:
    # A SIGTERM whose handler ran inside a weakref callback of the import machinery raised its
    # StopSignal where Python ignores exceptions ("Exception ignored in: ..."), and, only the
    # first signal raising, `adaptor run` went on for the whole run (seen in CI).  A Ctrl-C
    # likewise (seen under load: `adaptor run --json` then exited 0 once its agent was done).
    # Here the signal lands in a __del__, another place Python ignores exceptions.
    import time

    class SignalsWhenCollected:
        def __del__(self) -> None:
            signal.pthread_kill(threading.main_thread().ident or 0, signum)
            for _ in range(1000):  # the handler runs between these bytecodes, in here
                pass

    caught: KeyboardInterrupt | None = None
    ctrl_c = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in `adaptor run`
    try:
        with _cli_common.stopping_like_ctrl_c():
            try:
                SignalsWhenCollected()  # collected at once: the handler's raise is swallowed
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    time.sleep(0.01)
            except KeyboardInterrupt as stop:
                caught = stop
    finally:
        signal.signal(signal.SIGINT, ctrl_c)
    if signum == signal.SIGTERM:
        assert isinstance(caught, _cli_common.StopSignal) and caught.signum == signal.SIGTERM
    else:
        assert type(caught) is KeyboardInterrupt


def test_an_error_its_library_raised_again_as_its_own_cause_is_said_once(tmp_path: Path) -> None:
    # filelock raises the IsADirectoryError of its open again, from that one: the same text.
    home = tmp_path / "home"
    (home / "threads" / "store.lock").mkdir(parents=True)
    proc = subprocess.run(
        ["adaptor", "threads", "list", "--home", str(home)], capture_output=True, text=True
    )
    assert proc.returncode == 70
    assert "store.lock" in proc.stderr
    assert "caused by" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_thread_store_that_is_no_folder_is_said_not_read_as_empty(tmp_path: Path) -> None:
    # A file standing where threads/ goes was read as "no threads": nothing listed, exit 0.
    home = tmp_path / "home"
    _home.Home.at(home).ensure()
    (home / "threads").rmdir()
    (home / "threads").write_text("not a store")
    for extra in ([], ["--json"]):
        proc = subprocess.run(["adaptor", "threads", "list", "--home", str(home), *extra], capture_output=True, text=True)
        assert proc.returncode == 70, (extra, proc.stdout, proc.stderr)
        assert "the thread store is not a folder" in proc.stdout + proc.stderr


def test_a_librarys_multi_line_cause_is_said_on_one_line(tmp_path: Path) -> None:
    # jsonschema's SchemaError message goes on to dump the metaschema over a dozen lines.
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": 5}')
    proc = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "script", "--config", 'steps=[{"text": "x"}]',
         "--schema", str(schema), "go"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[1] == (
        "  caused by: jsonschema.exceptions.SchemaError: 5 is not valid under any of the given schemas [...]"
    )


def test_the_version_the_package_reports_is_pyprojects() -> None:
    # adaptor.__version__ (in adaptord.json and the A2A cards) is written by hand: a release
    # bumping pyproject alone left it behind, while `adaptor --version` read the metadata.
    import tomllib

    import adaptor

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert adaptor.__version__ == project["version"]
    shown = subprocess.run(["adaptor", "--version"], capture_output=True, text=True, check=True)
    assert shown.stdout.split()[-1] == project["version"]


def test_events_f_ends_once_its_reader_is_gone_though_nothing_more_comes(tmp_path: Path) -> None:
    # `adaptor events --file log -f | grep -q x` never ended: a reader going away is only
    # seen by a write, and following with nothing new to print writes nothing.
    from adaptor.events import Notice
    from hosttools import sessionrecorder as sr

    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path)) as recorder:
        recorder.record("quiet", Notice(kind="lifecycle", text="only"))
    follower = subprocess.Popen(
        ["adaptor", "events", "--file", str(tmp_path / "quiet.jsonl"), "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert follower.stdout is not None and follower.stderr is not None
    assert b"notice.lifecycle" in follower.stdout.readline()
    follower.stdout.close()
    try:
        assert (follower.wait(timeout=60), follower.stderr.read()) == (0, b"")
    finally:
        follower.kill()


def test_a_deleted_current_directory_matters_only_without_a_workspace(tmp_path: Path) -> None:
    # The current directory was asked for even with --workspace given: a bare
    # "FileNotFoundError: [Errno 2] No such file or directory", exit 70.
    run = 'mkdir gone && cd gone && rmdir ../gone && exec adaptor run --no-daemon --driver script --config \'steps=[{"text": "t"}]\' "$@" x'
    given = subprocess.run(["sh", "-c", run, "sh", "--workspace", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (given.returncode, given.stdout) == (0, "t\n"), given.stderr
    missing = subprocess.run(["sh", "-c", run, "sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2, missing.stderr
    assert "the current directory no longer exists: give the run --workspace DIR" in missing.stderr
    # A relative path from there cannot be resolved: a traceback (click resolves --workspace,
    # adaptord the home) or a bare "[Errno 2] No such file or directory", exit 70.
    gone = "mkdir gone2 && cd gone2 && rmdir ../gone2 && exec \"$@\""
    for command, env in (
        (["adaptor", "run", "--no-daemon", "--driver", "script", "--workspace", "../ws", "x"], {}),
        (["adaptor", "status"], {"ADAPTORD_HOME": "../h"}),
        (["adaptord", "status"], {"ADAPTORD_HOME": "../h"}),
    ):
        proc = subprocess.run(["sh", "-c", gone, "sh", *command], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr)
        assert "the current directory no longer exists, so a relative path cannot be resolved" in proc.stderr


def test_a_config_value_meant_as_json_must_be_json() -> None:
    # A NaN in steps=[...] made the value a string, refused later as "steps: expected a list
    # of steps"; a plain word is still a string.
    bad = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "script", "--config", 'steps=[{"sleep": NaN}]', "x"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "steps: not valid JSON" in bad.stderr, bad.stderr
    good = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "command", "--config", "command=/bin/cat", "echoed"],
        capture_output=True, text=True, timeout=60,
    )
    assert (good.returncode, good.stdout) == (0, "echoed\n"), good.stderr


def test_an_option_value_with_an_integer_past_64_bits_is_refused_naming_it(tmp_path: Path) -> None:
    # --config and --schema read it as the nearest float, silently ({"n":1.8446744073709552e+19}
    # answered), while the same request in a file was refused.
    config = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "script", "--config",
         'steps=[{"output_json": {"n": 18446744073709551616}}]', "x"],
        capture_output=True, text=True, timeout=60,
    )
    assert config.returncode == 2 and "steps/0/output_json/n: an integer outside" in config.stderr, config.stderr
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "maximum": 18446744073709551616}')
    refused = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "script", "--schema", str(schema), "x"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 2 and "/maximum: an integer outside" in refused.stderr, refused.stderr


def test_a_number_past_a_floats_range_is_refused_naming_where_it_is(tmp_path: Path) -> None:
    # orjson refuses 1e400 (or 400 digits) with "number is infinity when parsed as double",
    # naming no place: --config took the value as the string "1e400" (refused later as "expected
    # a number"), --schema and request files said only "not JSON".
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["adaptor", "run", "--no-daemon", "--driver", "script", *args, "x"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    config = run("--config", "grace_period=1e400")
    assert config.returncode == 2 and "grace_period: a number past the range of a float" in config.stderr, config.stderr
    nested = run("--config", 'steps=[{"output_json": {"n": ' + "9" * 400 + "}}]")
    assert nested.returncode == 2 and "steps/0/output_json/n: an integer outside" in nested.stderr, nested.stderr
    (tmp_path / "schema.json").write_text('{"type": "object", "maximum": -1e999}')
    schema = run("--schema", "schema.json")
    assert schema.returncode == 2 and "/maximum: a number past the range of a float" in schema.stderr, schema.stderr
    (tmp_path / "request.json").write_text('{"driver": "script", "prompt": "x", "metadata": {"a/b": [1e400]}}')
    request = subprocess.run(["adaptor", "run", "--no-daemon", "--request", "request.json"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert request.returncode == 2 and "/metadata/a~1b/0: a number past the range" in request.stderr, request.stderr



def test_a_missing_a2a_extra_names_what_to_install_by_names_that_fetch_it(tmp_path: Path) -> None:
    # The hint said pip install 'adaptor[a2a]': on the package index that name is another
    # project (the README says so), which pip fetched instead, torch and CUDA with it.
    program = (
        "import sys\n"
        "sys.modules['a2a'] = None\n"  # what an environment without the a2a extra has
        "from adaptord.cli import main\n"
        f"sys.argv = ['adaptord', 'serve', '--home', {str(tmp_path / 'home')!r}, '--a2a', '127.0.0.1:0']\n"
        "main()\n"
    )
    served = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert served.returncode == 2, served.stderr
    assert "--a2a needs the a2a extra" in served.stderr
    assert "pip install 'a2a-sdk[http-server]~=1.3.0'" in served.stderr and "adaptor[" not in served.stderr
    code = (
        "import sys\nsys.modules['a2a'] = None\nfrom adaptor.clients import a2a\n"
        "try:\n    a2a.Client('http://127.0.0.1:9/card.json')\nexcept ImportError as exc:\n    print(exc)\n"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "the A2A client needs the a2a extra" in said.stdout, said.stderr
    assert "pip install 'a2a-sdk[http-server]~=1.3.0'" in said.stdout and "adaptor[" not in said.stdout

"""The ``adaptor`` CLI against a real ``adaptord serve`` subprocess, as a shell user runs it.

Exit codes, ``--json`` shapes, live output on a terminal versus a pipe, ``events -f``,
approvals answered from another process, ``--no-daemon`` parity, ``| head``.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import functools
import json
import os
import pty
import queue
import re
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor import _home, errors, events, spool
from adaptor.drivers import script as script_driver
from adaptor.spool import Client
from adaptor.threadstore import JSONLStore
from tests.daemon_harness import DaemonProcess
from tests.test_spool_client import (
    PERMISSION,
    QUESTION,
    TIMEOUT,
    Home,
    home,
    pending_approval,
    script,
    threaded,
    wait_until,
)
from tests.unwritable import unwritable

__all__ = ["home"]  # the module-scoped daemon fixture, shared with the Client tests

pytestmark = pytest.mark.slow  # about 40 s: dozens of CLI processes

SECRET = "sk-cli-Tq4Xw8secretvalue"


def steps(*items: dict[str, Any]) -> str:
    return "steps=" + json.dumps(list(items))


def json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines()]


# --- run ------------------------------------------------------------------------------------------


def test_run_prints_only_the_result_text_when_piped(home: Home) -> None:
    done = home.cli(
        "run",
        "--driver",
        "script",
        "--config",
        steps({"text": "hello"}, {"tool_call": {"name": "ls"}}, {"text": "done"}),
        "go",
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")


def test_a_damaged_line_in_a_threads_audit_log_does_not_cost_a_later_turn_its_answer(home: Home) -> None:
    # `run` follows the run's events in the thread's log, which holds every earlier turn: a
    # bad line there ended it with exit 70 and no answer, though the verdict said ok.
    def turn(text: str) -> subprocess.CompletedProcess[str]:
        return home.cli("run", "--driver", "script", "--config", steps({"text": text}),
                        "--config", "session=auto", "--thread", "cli/damaged-log", "go")

    assert turn("first").returncode == 0
    log = home.root / "events" / f"{_home.session_for_thread('cli/damaged-log')}.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[2] = b"X" * len(lines[2])
    log.write_bytes(b"\n".join(lines))
    second = turn("second")
    assert (second.returncode, second.stdout) == (0, "second\n"), second.stderr
    assert "cannot show the run's events" in second.stderr and "line 3" in second.stderr


ANSWER_WITH_ESCAPES = "b\x1b[31mred\nline2"


def test_a_piped_answer_is_the_result_text_byte_for_byte(home: Home) -> None:
    # click.echo stripped ANSI escapes from whatever was not a terminal: `$(adaptor run ...)`
    # got "bred", while --json and the verdict kept the text.
    config = steps({"text": ANSWER_WITH_ESCAPES})
    for extra in ([], ["--no-daemon"]):
        ran = home.cli("run", "--driver", "script", "--config", config, *extra, "go")
        assert (ran.returncode, ran.stdout) == (0, ANSWER_WITH_ESCAPES + "\n"), (extra, ran.stderr)
    request_id = home.client.submit(script({"text": ANSWER_WITH_ESCAPES}))
    waited = home.cli("wait", request_id)
    assert (waited.returncode, waited.stdout) == (0, ANSWER_WITH_ESCAPES + "\n"), waited.stderr


def test_a_terminal_shows_the_answer_with_its_control_characters_escaped(home: Home) -> None:
    # On a terminal the agent's escapes ran (here: red from then on), streamed or printed.
    request_id = home.client.submit(script({"text": ANSWER_WITH_ESCAPES}))
    home.client.wait(request_id, timeout=TIMEOUT)
    for args in (("run", "--driver", "script", "--config", steps({"text": ANSWER_WITH_ESCAPES}), "go"), ("wait", request_id)):
        terminal = _Terminal(*args, env={**home.env(), "TERM": "xterm"})
        try:
            assert terminal.proc.wait(TIMEOUT) == 0
            terminal.wait_for("line2")
        finally:
            terminal.close()
        assert b"b\\x1b[31mred\r\nline2" in terminal.seen, terminal.seen  # the tty's own \r\n
        assert b"\x1b[31m" not in terminal.seen, terminal.seen


def test_run_keeps_the_directory_its_config_names(home: Home, tmp_path: Path) -> None:
    # `adaptor run` filled in the shell's directory as the workspace even when the run named
    # its own with a config cwd, and a workspace wins over a config cwd: `pwd` said the shell's.
    named = tmp_path / "named"
    named.mkdir()
    request_file = tmp_path / "request.json"
    request_file.write_text(json.dumps({"config": {"command": "pwd", "cwd": str(named)}}))
    ways = (["--config", "command=pwd", "--config", f"cwd={named}"], ["--request", str(request_file)])
    for way in ways:
        for extra in ([], ["--no-daemon"]):
            ran = home.cli("run", "--driver", "command", *way, *extra, "go")
            assert (ran.returncode, ran.stdout) == (0, f"{named}\n"), (way, extra, ran.stderr)
    # Without one, the shell's directory, as before.
    ran = home.cli("run", "--driver", "command", "--config", "command=pwd", "go")
    assert (ran.returncode, ran.stdout) == (0, f"{os.getcwd()}\n"), ran.stderr


def test_approvals_show_an_agent_title_on_one_line(home: Home) -> None:
    # A title holding a newline broke the one-line listing; its escapes were stripped to a
    # pipe and ran on a terminal.
    title = "edit main.py\n\x1b[2Jnow"
    request_id = home.client.submit(
        script({"approval": {"kind": "permission", "title": title}}, {"text": "ok"}, policy={"approvals": {"timeout": 60}})
    )
    approval_id = pending_approval(home, request_id)["id"]
    try:
        listed = [line for line in home.cli("approvals").stdout.splitlines() if approval_id in line]
        assert len(listed) == 1 and f"  {orjson.dumps(title).decode()}  " in listed[0], listed
    finally:
        home.client.approve(approval_id)
    assert home.client.wait(request_id, timeout=TIMEOUT).text == "ok"


def test_a_pending_file_the_daemon_did_not_write_is_not_listed(home: Home) -> None:
    # {"id": "x"} put in approvals/pending/ by hand was listed as "x    request None".
    (home.root / "approvals" / "pending" / "x.json").write_bytes(b'{"id": "x"}')
    assert "x" not in [a["id"] for a in home.client.approvals()]
    assert "request None" not in home.cli("approvals").stdout


def test_events_do_not_let_an_agent_reorder_a_line(home: Home) -> None:
    # A right-to-left override in what the agent said was printed as it is: the rest of the
    # line read backwards on a terminal (an approval's title in the live prompt too).
    rid = home.client.submit(script({"text": "rm \u202eevil\u202c \u2067x"}))
    home.client.wait(rid, timeout=TIMEOUT)
    out = home.cli("events", rid).stdout
    assert "rm \\u202eevil\\u202c \\u2067x" in out, out
    assert not any(char in out for char in "\u202e\u202c\u2067")


def test_approvals_show_what_each_choice_means(home: Home) -> None:
    # Only the keys were shown: "choices: pg, lite", the labels and descriptions in --json only.
    choices = [
        {"key": "pg", "label": "PostgreSQL", "description": "a server"},
        {"key": "lite", "label": "SQLite", "description": "one file"},
    ]
    request_id = home.client.submit(
        script({"approval": {"kind": "question", "title": "which database?", "choices": choices}},
               {"text": "ok"}, policy={"approvals": {"timeout": 60, "question": "ask"}})
    )
    approval_id = pending_approval(home, request_id)["id"]
    try:
        listed = home.cli("approvals").stdout.splitlines()
        at = next(i for i, line in enumerate(listed) if approval_id in line)
        assert listed[at + 1 : at + 4] == [
            "    choices:",
            "      pg    PostgreSQL - a server",
            "      lite  SQLite - one file",
        ], listed
    finally:
        home.client.answer(approval_id, "pg")
    assert home.client.wait(request_id, timeout=TIMEOUT).text == "ok"


def test_run_json_shapes(home: Home) -> None:
    ok = home.cli("run", "--driver", "script", "--config", steps({"text": "hi"}), "--json", "go")
    out = orjson.loads(ok.stdout)
    assert ok.returncode == 0 and out["ok"] is True and out["exit_code"] == 0
    assert out["result"]["text"] == "hi" and out["result"]["run_id"].startswith("run_")
    assert out["result"]["raw"]["stdout"] == f"runs/{out['id']}/stdout"

    failed = home.cli(
        "run",
        "--driver",
        "script",
        "--json",
        "--config",
        steps({"text": "partial"}, {"fail": {"message": "boom"}}),
        "go",
    )
    out = orjson.loads(failed.stdout)
    assert failed.returncode == 1 and out["ok"] is False and out["exit_code"] == 1
    assert out["error"]["code"] == "ErrAgentFailed" and out["error"]["reason"] == "agent_error"
    assert out["result"]["text"] == "partial"
    assert "AgentFailedError" in failed.stderr  # human text still goes to stderr


@pytest.mark.parametrize("word", ["result", "summary", "script", "verdict", "adaptord", "stdout", "question"])
def test_an_env_value_that_is_a_word_of_the_records_breaks_nothing(home: Home, word: str) -> None:
    # Every env value of 6 or more characters was replaced wherever it appeared, keys and the
    # daemon's own words included: with X=result the verdict had no "result" (exit 0, no
    # answer), X=summary or X=script (in "transcript") ended in KeyError (exit 70), X=verdict
    # made the verdict's format one no reader takes, X=question an approval nobody may answer.
    request_id = f"req-{word}-{os.getpid()}"
    ran = home.cli(
        "run", "--driver", "script", "--config", steps({"text": f"hello {word}"}), "--env", f"X={word}",
        "--id", request_id, "--json", "go",
    )
    assert ran.returncode == 0, ran.stderr
    out = orjson.loads(ran.stdout)
    assert out["result"]["text"] == f"hello {word}" and out["id"] == request_id
    assert out["result"]["raw"]["stdout"] == f"runs/{request_id}/stdout"
    verdict = orjson.loads((home.root / "verdicts" / f"{request_id}.json").read_bytes())
    assert (verdict["format"], verdict["id"]) == ("adaptord.verdict/1", request_id)
    assert home.client.wait(request_id, timeout=TIMEOUT).text == f"hello {word}"
    status = home.cli("status", "--json")
    assert request_id in status.stdout, status.stdout


def test_an_env_value_naming_an_approval_kind_leaves_the_approval_answerable(home: Home) -> None:
    config = {"env": {"X": "question"}, "steps": [
        {"approval": {"kind": "question", "title": "which?", "choices": ["a", "b"]}}, {"text": "done"},
    ]}
    request_id = home.client.submit({
        "driver": "script", "prompt": "go", "config": config,
        "policy": {"approvals": {"question": "ask", "timeout": TIMEOUT}},
    })
    pending = _wait_for_pending(home, request_id)
    assert pending["approval_kind"] == "question"
    answered = home.cli("answer", pending["id"], "a")
    assert answered.returncode == 0, answered.stderr
    assert home.client.wait(request_id, timeout=TIMEOUT).text == "done"


def _wait_for_pending(home: Home, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for path in (home.root / "approvals" / "pending").glob("*.json"):
            pending: dict[str, Any] = orjson.loads(path.read_bytes())
            if pending.get("request_id") == request_id:
                return pending
        time.sleep(0.05)
    raise AssertionError(f"no pending approval for {request_id}")


def test_the_env_table_given_whole_as_json_is_taken(home: Home) -> None:
    # --config 'env={...}' was kept as one string (env values are never JSON), and refused:
    # '/config/env: "<redacted>" is not of type "object"'.
    secret = "sk-whole-table-123456"
    for extra in ([], ["--no-daemon"]):
        ran = home.cli(
            "run", "--driver", "script", "--config", steps({"text": "ok"}),
            "--config", "env=" + json.dumps({"TOKEN": secret, "PORT": "8080"}), *extra, "--json", "go",
        )
        assert ran.returncode == 0, ran.stderr
        assert orjson.loads(ran.stdout)["result"]["text"] == "ok" and secret not in ran.stdout


def test_a_request_file_with_a_null_id_runs_alike_both_ways(home: Home, tmp_path: Path) -> None:
    # Through the daemon a null id was minted (exit 0); --no-daemon refused it (exit 2).
    path = tmp_path / "request.json"
    path.write_bytes(orjson.dumps({"id": None, "driver": "script", "prompt": "x", "config": {"steps": [{"text": "t"}]}}))
    for extra in ([], ["--no-daemon"]):
        ran = home.cli("run", "--request", str(path), "--json", *extra)
        assert ran.returncode == 0, (extra, ran.stderr)
        out = orjson.loads(ran.stdout)
        assert out["result"]["text"] == "t" and isinstance(out["id"], str) and out["id"]


NO_DAEMON_CASES = {
    "success": (["--config", steps({"text": "fine"})], 0),
    "agent_failed": (["--config", steps({"fail": {"code": "agent_error"}})], 1),
    "unknown_reason": (["--config", steps({"fail": {"code": "quota"}})], 1),
    "schema_violation": (
        ["--config", steps({"output_json": {"b": 1}}), "--schema", "SCHEMA"],
        1,
    ),
    "invalid_policy": (["--config", steps({"text": "x"}), "--policy-sandbox", "bogus"], 3),
    "driver_config": (["--config", steps({"dance": True})], 3),
    "bad_workspace": (["--config", steps({"text": "x"}), "--workspace", "/no/such/dir"], 2),
    "thread_not_found": (
        [
            "--config",
            steps({"text": "x"}),
            "--config",
            "session=auto",
            "--thread",
            "cli/none",
            "--resume-only",
        ],
        4,
    ),
    # A thread failure found after the agent ran is a RunError (it keeps the Result) whose
    # cause is the thread error; errors.md files it under thread state: it exited 1.
    "checkpoint_missing": (["--config", steps({"text": "x"}), "--thread", "cli/no-session"], 4),
    "deadline_before_entry": (["--config", steps({"text": "x"}), "--timeout", "0"], 70),
}


def test_resume_only_with_fork_from_is_a_usage_error(home: Home) -> None:
    # --resume-only was silently ignored: a fork always starts a new thread.
    for extra in ([], ["--no-daemon"]):
        ran = home.cli(
            "run", "--driver", "script", "--config", steps({"text": "x"}),
            "--thread", "k", "--resume-only", "--fork-from", "p", *extra, "go",
        )
        assert ran.returncode == 2 and "cannot go together" in ran.stderr, (extra, ran.stderr)


@pytest.mark.parametrize("name", list(NO_DAEMON_CASES))
def test_run_no_daemon_matches_the_daemon(home: Home, tmp_path: Path, name: str) -> None:
    args, expected = NO_DAEMON_CASES[name]
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "required": ["a"]}')
    args = [str(schema) if a == "SCHEMA" else a for a in args]
    through = home.cli("run", "--driver", "script", *args, "--json", "go")
    inside = home.cli("run", "--driver", "script", *args, "--json", "--no-daemon", "go")
    assert through.returncode == inside.returncode == expected, (through.stderr, inside.stderr)
    a, b = orjson.loads(through.stdout), orjson.loads(inside.stdout)
    assert a["ok"] == b["ok"]
    assert (a.get("error") or {}).get("code") == (b.get("error") or {}).get("code")
    assert (a["result"] or {}).get("text") == (b["result"] or {}).get("text")
    if name in ("success", "agent_failed"):  # the human form too
        plain = [
            home.cli("run", "--driver", "script", *args, *extra, "go")
            for extra in ([], ["--no-daemon"])
        ]
        assert plain[0].stdout == plain[1].stdout and plain[0].returncode == plain[1].returncode


def test_a_thread_another_process_is_running_exits_75_both_ways(home: Home) -> None:
    # The one exit code a retrying script needs (75: try again later) had no run behind it:
    # another owner, here this test's own Agent on the daemon's thread store, holds the lease.
    holder = adaptor.Agent(
        script_driver.Driver(
            script_driver.Config(steps=({"text": "holding"}, {"sleep": 60}), session="auto")
        ),
        thread_store=JSONLStore(home.root / "threads"),
    )
    stream = holder.thread("cli/busy").stream("hold it")
    try:
        for event in stream:
            if isinstance(event, events.TextDelta) and event.phase == "end":
                break
        for extra in ([], ["--no-daemon"]):
            ran = home.cli(
                "run", "--driver", "script", "--config", steps({"text": "x"}),
                "--config", "session=auto", "--thread", "cli/busy", "--json", *extra, "go",
            )
            out = orjson.loads(ran.stdout)
            assert (ran.returncode, out["exit_code"]) == (75, 75), (extra, ran.stderr)
            assert out["error"]["code"] == "ErrThreadBusy", extra
            assert out["error"]["cause"]["code"] == "threadstore.ErrBusy", extra
    finally:
        stream.cancel()
        with contextlib.suppress(errors.RunCancelledError):
            stream.result()
        holder.close()


def test_an_agent_cli_that_is_not_installed_exits_69_both_ways(home: Home, tmp_path: Path) -> None:
    # Only errors.exit_code_for was asked about it; now the CLI, through the daemon and in-process.
    missing = str(tmp_path / "no-such-claude")
    for extra in ([], ["--no-daemon"]):
        ran = home.cli("run", "--driver", "claude", "--config", f"command={missing}", "--json", *extra, "go")
        out = orjson.loads(ran.stdout)
        assert (ran.returncode, out["exit_code"]) == (69, 69), (extra, ran.stderr)
        assert out["error"]["code"] == "RunError" and out["error"]["reason"] == "infrastructure_error"
        assert out["error"]["details"] == {"kind": "binary_not_found", "binary": missing}, extra


def test_run_says_when_return_invalid_kept_invalid_output(home: Home, tmp_path: Path) -> None:
    # Exit 0 and the text alone looked like a valid answer.
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps({
        "prompt": "go", "driver": "script", "config": {"steps": [{"output_json": {"a": "x"}}]},
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "schema_options": {"return_invalid": True},
    }))
    for extra in ([], ["--no-daemon"]):
        ran = home.cli("run", "--request", str(request), *extra)
        assert ran.returncode == 0 and ran.stdout == '{"a":"x"}\n', (extra, ran.stderr)
        assert ran.stderr.splitlines()[-1] == (
            "adaptor: the structured output is invalid (kept by return_invalid): "
            '$.a: "x" is not of type "integer"'
        ), extra
        quiet = home.cli("run", "--request", str(request), "--quiet", *extra)
        assert quiet.returncode == 0 and "invalid" not in quiet.stderr, extra


def test_run_on_a_terminal_streams_text_and_tool_lines(home: Home) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [
            "adaptor",
            "run",
            "--driver",
            "script",
            "--config",
            steps(
                {"text": "first words"},
                {"tool_call": {"name": "grep", "args": {"q": "x"}}},
                {"text": "last words"},
            ),
            "go",
        ],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=home.env(),
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert proc.wait(TIMEOUT) == 0
    text = output.decode()
    assert "first words" in text and "⚙ grep" in text
    assert text.count("last words") == 1  # streamed live, not printed again at the end


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("extra", [[], ["--no-daemon"]])
def test_a_prompt_read_from_stdin_is_utf8_whatever_the_streams_encoding(
    home: Home, tmp_path: Path, encoding: str, extra: list[str]
) -> None:
    # Read in PYTHONIOENCODING's encoding: ascii failed with exit 70 and a bare
    # UnicodeDecodeError, latin-1 handed the agent mojibake.  --request - read UTF-8 already.
    prompt = "prompt ü ✓ 中".encode()
    received = tmp_path / "received"
    ran = subprocess.run(
        ["adaptor", "run", *extra, "--quiet", "--driver", "command", "--config", "command=/bin/sh",
         "--config", f'extra_args=["-c", "cat > {received}"]', "-"],
        input=b"\xef\xbb\xbf" + prompt, capture_output=True, timeout=TIMEOUT,
        env={**home.env(), "PYTHONIOENCODING": encoding},
    )
    assert ran.returncode == 0, ran.stderr
    assert received.read_bytes() == prompt  # (a byte-order mark ahead of it is not the prompt's)


def test_a_terminal_claiming_ascii_gets_the_live_answer_in_utf8_as_the_final_one(home: Home) -> None:
    # The answer streamed live (and the progress line) went through the stream's own ASCII
    # encoder, `h\xe9llo \u2713`, where `run -q`, `wait` and `approvals` print UTF-8 there.
    terminal = _Terminal("run", "--no-daemon", "--driver", "script", "--config", steps({"sleep": 0.5}, {"text": "héllo ✓"}),
                         "go", env={**home.env(), "PYTHONIOENCODING": "ascii", "TERM": "xterm"})
    try:
        assert terminal.proc.wait(TIMEOUT) == 0
        terminal.wait_for("héllo ✓")
        assert b"\\x" not in terminal.seen and b"\\u" not in terminal.seen, terminal.seen
    finally:
        terminal.close()


@pytest.mark.parametrize("columns", [24, 60])
def test_the_progress_line_fits_a_narrow_terminal(home: Home, columns: int) -> None:
    # Wider than the terminal, the line wrapped and "\r" + erase-line cleared only its last
    # row: each redraw (ten a second) left a row behind, a 30-column pane filled in seconds.
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    rid = f"a-long-request-id-{columns}-" + "x" * 40
    proc = subprocess.Popen(
        ["adaptor", "run", "--id", rid, "--driver", "script", "--config", steps({"sleep": 1.5}, {"text": "done"}), "go"],
        stdin=follower, stdout=follower, stderr=follower, env={**home.env(), "TERM": "xterm"},
    )
    os.close(follower)
    output = b""
    while chunk := _read_or_end(leader):
        output += chunk
    os.close(leader)
    assert proc.wait(TIMEOUT) == 0
    frames = re.findall(r"\r([^\r\n]*?)\x1b\[K", output.decode())
    shown = [re.sub(r"\x1b\[[0-9;]*m", "", frame) for frame in frames if frame.strip()]
    assert len(shown) >= 3, output  # it did draw, several times
    assert all(len(frame) < columns for frame in shown), [f for f in shown if len(f) >= columns]
    assert any(frame.endswith("…") for frame in shown) == (columns < 60 + len(rid))


def _read_or_end(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the terminal's other side is closed
        return b""


def test_a_tool_line_stays_one_line_whatever_the_model_names_the_tool(home: Home) -> None:
    # A model names tools at will (a prompt-injected one too): a newline in the name broke the
    # "one line per tool call", and a name of any length was printed whole.
    name = "grep\nrm -rf ~\x1b[2J" + "x" * 500
    config = steps({"tool_call": {"name": name, "args": {"q": "x"}}}, {"text": "done"})
    terminal = _Terminal("run", "--driver", "script", "--config", config, "go",
                         env={**home.env(), "TERM": "xterm"})
    try:
        assert terminal.proc.wait(TIMEOUT) == 0
        terminal.wait_for("done")
    finally:
        terminal.close()
    # (Split at every carriage return: the spinner's frames before it end with one, and how
    # many land in front of the tool line is a matter of timing.)
    tool_line = next(line for line in terminal.seen.split(b"\r") if "⚙".encode() in line)
    assert b"grep\\nrm -rf ~\\x1b[2J" in tool_line and b"\x1b[2J" not in tool_line
    assert len(tool_line) < 300, tool_line


def test_run_without_a_daemon_or_a_spool_exits_69(tmp_path: Path) -> None:
    spool = tmp_path / "home"
    (spool / "spool" / "new").mkdir(parents=True)
    (spool / "spool" / "tmp").mkdir()
    for root in (tmp_path / "missing", spool):
        proc = subprocess.run(
            ["adaptor", "run", "--home", str(root), "--driver", "script", "go"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 69 and str(root) in proc.stderr
        assert "Errno" not in proc.stderr and "None" not in proc.stderr, proc.stderr
    assert list((spool / "spool" / "new").iterdir()) == []  # nothing queued for nobody


def test_usage_errors_exit_2(home: Home) -> None:
    assert home.cli("run", "go").returncode == 2  # no driver
    assert home.cli("run", "--driver", "script", "--config", "nonsense", "go").returncode == 2
    assert home.cli("run", "--driver", "script", "--resume-only", "go").returncode == 2
    assert home.cli("run", "--driver", "nope", "go").returncode == 2
    assert home.cli("events").returncode == 2
    assert home.cli("events", "x", "--thread", "k").returncode == 2
    assert home.cli("events", "--file", "/no/such/log.jsonl").returncode == 2
    assert home.cli("wait", "never-submitted").returncode == 2
    assert home.cli("cancel", "never-submitted").returncode == 2
    # Both from stdin: the request took it all and the prompt was silently "" (exit 0).
    both = home.cli("run", "--request", "-", "-", input=orjson.dumps(script({"text": "x"})).decode())
    assert both.returncode == 2 and "both read stdin" in both.stderr
    # --schema - too: the prompt was silently "" (exit 0), or the schema "not JSON: zero-length".
    schema_too = home.cli("run", "--driver", "script", "--schema", "-", "-", input='{"type": "object"}')
    assert schema_too.returncode == 2 and "PROMPT '-' and --schema - both read stdin" in schema_too.stderr
    all_three = home.cli("run", "--request", "-", "--schema", "-", "-", input="{}")
    assert all_three.returncode == 2 and "--request - and --schema - all read stdin" in all_three.stderr
    # NaN passes FloatRange (it compares false with both bounds): it meant "no limit".
    for args in (["wait", "x", "--timeout", "nan"], ["run", "--timeout", "nan", "--driver", "script", "go"]):
        refused = home.cli(*args)
        assert refused.returncode == 2 and "nan is not a number of seconds" in refused.stderr, args
    # The --json object names the request it was about, on every outcome.
    unknown = home.cli("wait", "never-submitted", "--json")
    assert unknown.returncode == 2 and orjson.loads(unknown.stdout)["id"] == "never-submitted"


# --- submit, wait -------------------------------------------------------------------------------


def test_submit_prints_only_the_id_and_wait_exits_with_the_verdict(
    home: Home, tmp_path: Path
) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(script({"text": "from a file"})))
    submitted = home.cli("submit", str(request))
    request_id = submitted.stdout.strip()
    assert submitted.returncode == 0 and submitted.stdout == request_id + "\n"
    assert _home.REQUEST_ID.fullmatch(request_id)
    waited = home.cli("wait", request_id)
    assert (waited.returncode, waited.stdout) == (0, "from a file\n")
    as_json = orjson.loads(home.cli("wait", request_id, "--json").stdout)
    assert as_json["ok"] is True and as_json["id"] == request_id
    assert as_json["result"]["text"] == "from a file"

    piped = home.cli(
        "submit", input=orjson.dumps({**script({"text": "x"}), "id": "cli-stdin-1"}).decode()
    )
    assert piped.stdout == "cli-stdin-1\n"
    assert home.cli("wait", "cli-stdin-1").returncode == 0
    taken = home.cli("submit", input='{"id": "cli-stdin-1", "driver": "script", "prompt": "x"}')
    assert taken.returncode == 2
    # The one problem is the message: it was printed again on a line of its own.
    assert taken.stderr.count("a request with this id was already submitted") == 1, taken.stderr
    assert home.cli("submit", input="{not json").returncode == 2


def test_submit_and_cancel_print_one_outcome_object_with_json(home: Home, tmp_path: Path) -> None:
    # cli.md: with --json every command except events prints one outcome object; submit and
    # cancel had no such option (exit 2, "No such option").
    submitted = home.cli("submit", "--json", input=orjson.dumps(script({"sleep": 30})).decode())
    out = orjson.loads(submitted.stdout)
    request_id = out["id"]
    assert submitted.returncode == 0 and submitted.stdout.count("\n") == 1
    assert out == {
        "ok": True,
        "exit_code": 0,
        "id": request_id,
        "result": {"id": request_id, "daemon_running": True},
    }
    cancelled = home.cli("cancel", request_id, "--json")
    assert cancelled.returncode == 0
    assert orjson.loads(cancelled.stdout) == {
        "ok": True,
        "exit_code": 0,
        "id": request_id,
        "result": {"id": request_id, "requested": True},
    }
    assert home.cli("wait", request_id).returncode == 1  # RunCancelledError or CancelledError
    again = orjson.loads(home.cli("cancel", request_id, "--json").stdout)
    assert again["result"] == {"id": request_id, "requested": False}
    unknown = home.cli("cancel", "never-submitted", "--json")
    refused = orjson.loads(unknown.stdout)
    assert unknown.returncode == 2 and refused["ok"] is False and refused["id"] == "never-submitted"
    duplicate = home.cli(
        "submit", "--json", input=orjson.dumps({**script({"text": "x"}), "id": request_id}).decode()
    )
    assert duplicate.returncode == 2
    assert orjson.loads(duplicate.stdout)["error"]["code"] == "ErrInvalidRequest"

    idle = tmp_path / "idle"
    (idle / "spool" / "new").mkdir(parents=True)
    (idle / "spool" / "tmp").mkdir()
    queued = Home(idle, home.daemon, home.config_home).cli(
        "submit", "--json", input=orjson.dumps(script({"text": "x"})).decode()
    )
    assert queued.returncode == 0 and queued.stderr == ""
    assert orjson.loads(queued.stdout)["result"]["daemon_running"] is False


def test_schema_rejection_is_exit_2_with_every_problem(home: Home) -> None:
    request_id = home.cli(
        "submit", input='{"driver": "script", "prompt": 3, "extra": 1}'
    ).stdout.strip()
    waited = home.cli("wait", request_id, "--json")
    out = orjson.loads(waited.stdout)
    assert waited.returncode == 2 and out["error"]["code"] == "ErrInvalidRequest"
    assert {e["path"] for e in out["error"]["fields"]["errors"]} == {"", "/prompt"}


def test_wait_timeout_is_124_and_no_daemon_is_69(home: Home, tmp_path: Path) -> None:
    request_id = home.client.submit(script({"sleep": 30}))
    timed_out = home.cli("wait", request_id, "--timeout", "0.2", "--json")
    assert timed_out.returncode == 124
    assert orjson.loads(timed_out.stdout)["exit_code"] == 124
    assert home.cli("cancel", request_id).returncode == 0
    assert home.cli("wait", request_id).returncode == 1  # RunCancelledError

    idle = tmp_path / "idle"
    (idle / "spool" / "new").mkdir(parents=True)
    (idle / "spool" / "tmp").mkdir()
    queued = Home(idle, home.daemon, home.config_home).cli(
        "submit", input=orjson.dumps(script({"text": "x"})).decode()
    )
    assert queued.returncode == 0 and "not running" in queued.stderr
    waited = Home(idle, home.daemon, home.config_home).cli("wait", queued.stdout.strip())
    assert waited.returncode == 69 and "not running" in waited.stderr


# --- events -----------------------------------------------------------------------------------------


def test_events_of_nothing_say_so(home: Home, tmp_path: Path) -> None:
    # A mistyped thread key printed nothing and exited 0, like a thread with no events.
    unknown = home.cli("events", "--thread", "no/such/key")
    assert unknown.returncode == 4 and "no events recorded for thread key" in unknown.stderr
    # Following a request no daemon will run waited forever, without a word.
    stopped = DaemonProcess(tmp_path / "stopped-home").start()
    assert stopped.stop() == 0
    queued = Client(stopped.home.root).submit(script({"text": "never run"}))
    env = {**home.env(), "ADAPTORD_HOME": str(stopped.home.root)}
    follow = subprocess.run(
        ["adaptor", "events", queued, "-f"], capture_output=True, text=True, env=env, timeout=TIMEOUT
    )
    assert follow.returncode == 69 and "not running" in follow.stderr


def test_threads_json_before_the_subcommand_is_the_subcommands_json(home: Home) -> None:
    # `threads --json show K` printed text (nothing on stdout for an unknown key).
    missing = home.cli("threads", "--json", "show", "nosuch")
    assert missing.returncode == 4 and orjson.loads(missing.stdout)["error"]["code"] == "ErrThreadNotFound"
    listed = home.cli("threads", "--json", "list")
    assert listed.returncode == 0 and orjson.loads(listed.stdout) == orjson.loads(home.cli("threads", "list", "--json").stdout)


def test_run_json_of_a_request_refused_before_it_was_queued_has_a_null_result(home: Home) -> None:
    # cli.md: an error before the run started (InvalidRequestError, ...) has "result": null; a
    # request the client refused itself (an id of the daemon's own) had no result key at all.
    for extra, prompt in ((["--id", "adaptord", "go"], ""), (["-"], "x" * 1_100_000)):  # past 1 MiB
        refused = home.cli("run", "--driver", "script", "--config", steps({"text": "x"}), "--json", *extra, input=prompt)
        outcome = orjson.loads(refused.stdout)
        assert refused.returncode == outcome["exit_code"] == 2, refused.stderr
        assert outcome["error"]["code"] == "ErrInvalidRequest" and outcome["result"] is None


def test_events_of_a_request_that_never_ran_say_why(home: Home) -> None:
    # Its verdict names an audit log no event was written to: the command printed nothing.
    refused = home.cli(
        "run", "--driver", "script", "--config", steps({"text": "x"}),
        "--policy-sandbox", "bogus", "--json", "go",
    )
    request_id = orjson.loads(refused.stdout)["id"]
    assert refused.returncode == 3
    shown = home.cli("events", request_id)
    assert (shown.returncode, shown.stdout) == (0, "")
    assert f"request {request_id} recorded no events: it ended before it ran" in shown.stderr
    assert "ErrInvalidPolicy" in shown.stderr
    ran = home.cli("run", "--driver", "script", "--config", steps({"text": "x"}), "--json", "go")
    quiet = home.cli("events", orjson.loads(ran.stdout)["id"])
    assert quiet.returncode == 0 and quiet.stdout and quiet.stderr == ""


def test_events_follow_a_live_run(home: Home) -> None:
    request_id = home.client.submit(
        script(PERMISSION, {"text": "after approval"}, policy={"approvals": {"timeout": 60}})
    )
    follower = subprocess.Popen(
        ["adaptor", "events", request_id, "-f", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=home.env(),
    )
    assert follower.stdout is not None
    lines = []
    for line in follower.stdout:
        lines.append(orjson.loads(line))
        if lines[-1]["event"]["kind"] == "notice.approval.requested":
            break
    # The run is blocked on the approval: whatever follows was read live.
    answered = home.cli("approve", pending_approval(home, request_id)["id"])
    assert answered.returncode == 0, answered.stderr
    # Not communicate(timeout=...): it reads the pipe itself, past what the loop above buffered.
    follower.wait(timeout=TIMEOUT)
    assert follower.stderr is not None
    rest, stderr = follower.stdout.read(), follower.stderr.read()
    assert follower.returncode == 0, stderr
    lines += json_lines(rest)
    assert [set(line) for line in lines] == [{"host_seq", "event"}] * len(lines)
    seqs = [line["host_seq"] for line in lines]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert lines[-1]["event"]["kind"] == "run.finished"
    assert any(line["event"].get("text") == "after approval" for line in lines)


def test_events_views_since_thread_and_file(home: Home) -> None:
    request_id = home.client.submit(threaded("cli/events", {"text": "one"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    human = home.cli("events", request_id)
    assert human.returncode == 0
    first = human.stdout.splitlines()[0].split()
    assert first[0] == "1" and first[2] == "run.started"
    all_seqs = [
        line["host_seq"] for line in json_lines(home.cli("events", request_id, "--json").stdout)
    ]
    later = json_lines(home.cli("events", request_id, "--json", "--since", str(all_seqs[2])).stdout)
    assert [line["host_seq"] for line in later] == all_seqs[3:]

    second = home.client.submit(threaded("cli/events", {"text": "two"}))
    run_ids = {home.client.wait(rid, timeout=TIMEOUT).run_id for rid in (request_id, second)}
    by_thread = json_lines(home.cli("events", "--thread", "cli/events", "--json").stdout)
    assert {line["event"]["meta"]["run_id"] for line in by_thread} == run_ids
    log = home.root / "events" / f"{_home.session_for_thread('cli/events')}.jsonl"
    by_file = json_lines(home.cli("events", "--file", str(log), "--json").stdout)
    assert by_file == by_thread


def test_events_read_a_log_through_a_pipe_or_stdin(tmp_path: Path) -> None:
    # `--file -` and `--file <(zcat log.jsonl.gz)` were refused ("no such file", exit 2), while
    # verify-log reads a pipe.  A pipe is read once, to its end, with -f as well.
    from adaptor.events import TextDelta
    from hosttools import sessionrecorder as sr

    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        for n in range(3):
            recorder.record("sess", TextDelta(text=f"line {n}"))
    log = tmp_path / "events" / "sess.jsonl"
    by_path = subprocess.run(
        ["adaptor", "events", "--file", str(log), "--json"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert by_path.returncode == 0 and len(json_lines(by_path.stdout)) == 3, by_path.stderr
    commands = (
        'adaptor events --file - --json "${@:2}" <"$1"',
        'cat "$1" | adaptor events --file - --json "${@:2}"',
        'adaptor events --file <(cat "$1") --json "${@:2}"',
    )
    for command in commands:
        for follow in ([], ["-f"]):
            piped = subprocess.run(
                ["bash", "-c", command, "bash", str(log), *follow],
                capture_output=True, text=True, timeout=TIMEOUT,
            )
            assert (piped.returncode, piped.stdout) == (0, by_path.stdout), (command, follow, piped.stderr)
    later = subprocess.run(
        ["adaptor", "events", "--file", "-", "--since", "2"],
        input=log.read_text(), capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert [line.split()[0] for line in later.stdout.splitlines()] == ["3"], later.stderr

    # Following a pipe prints each record as its line arrives, and ends when the writer closes it.
    lines = log.read_text().splitlines(keepends=True)
    with subprocess.Popen(
        ["adaptor", "events", "--file", "-", "-f"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as follower:
        assert follower.stdin is not None and follower.stdout is not None
        printed: queue.Queue[str] = queue.Queue()
        output = follower.stdout

        def read() -> None:
            for line in output:
                printed.put(line)

        threading.Thread(target=read, daemon=True).start()
        try:
            follower.stdin.write(lines[0])
            follower.stdin.flush()
            assert printed.get(timeout=TIMEOUT).endswith("line 0\n")  # while the pipe is open
            follower.stdin.write("".join(lines[1:]))
            follower.stdin.close()
            assert follower.wait(timeout=TIMEOUT) == 0
        finally:
            follower.kill()
    assert [printed.get(timeout=TIMEOUT).split()[-1] for _ in lines[1:]] == ["1", "2"]


def test_events_reads_the_log_a_symlink_names(tmp_path: Path) -> None:
    # `events --file link.jsonl` failed with "Too many levels of symbolic links" (exit 70) where
    # verify-log reads the file the link names; so did `--file /dev/stdin` redirected from a file.
    from adaptor.events import TextDelta
    from hosttools import sessionrecorder as sr

    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        for n in range(3):
            recorder.record("sess", TextDelta(text=f"line {n}"))
    log = tmp_path / "events" / "sess.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    by_path = subprocess.run(
        ["adaptor", "events", "--file", str(log), "--json"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert by_path.returncode == 0 and len(json_lines(by_path.stdout)) == 3, by_path.stderr
    by_link = subprocess.run(
        ["adaptor", "events", "--file", str(link), "--json"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert (by_link.returncode, by_link.stdout) == (0, by_path.stdout), by_link.stderr
    with log.open("rb") as stdin:
        by_stdin = subprocess.run(
            ["adaptor", "events", "--file", "/dev/stdin", "--json"],
            stdin=stdin, capture_output=True, text=True, timeout=TIMEOUT,
        )
    assert (by_stdin.returncode, by_stdin.stdout) == (0, by_path.stdout), by_stdin.stderr


def test_a_symlink_in_place_of_a_logs_lock_file_is_read_past_by_every_reader(tmp_path: Path) -> None:
    # Writers never follow a link at <log>.jsonl.lock (they refuse to append), so no append
    # can be in flight: verify-log failed there (ELOOP, exit 70) while `events --file` read on.
    from adaptor.events import TextDelta
    from hosttools import sessionrecorder as sr

    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        for n in range(3):
            recorder.record("sess", TextDelta(text=f"line {n}"))
    log = tmp_path / "events" / "sess.jsonl"
    lock = tmp_path / "events" / "sess.jsonl.lock"
    lock.rename(tmp_path / "elsewhere.lock")
    lock.symlink_to(tmp_path / "elsewhere.lock")
    verified = subprocess.run(["adaptor", "verify-log", str(log)], capture_output=True, text=True, timeout=TIMEOUT)
    assert (verified.returncode, verified.stdout.strip()) == (0, "ok: 3 records"), verified.stderr
    shown = subprocess.run(
        ["adaptor", "events", "--file", str(log), "--json"], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert shown.returncode == 0 and len(json_lines(shown.stdout)) == 3, shown.stderr
    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        assert [r.host_seq for r in recorder.since("sess")] == [1, 2, 3]
        assert [info.key for info in recorder.sessions()] == ["sess"]
        with pytest.raises(OSError, match="symbolic link"):  # still no writer follows it
            recorder.record("sess", TextDelta(text="line 3"))
    assert lock.is_symlink() and sr.verify(log) == 3


def test_events_json_of_a_damaged_log_ends_with_the_error_object(tmp_path: Path) -> None:
    # errors.md: with --json a failure is {"ok": false, ...} on stdout, events included; the
    # records before the bad line come first, and the object is told from them by its keys.
    from adaptor.events import TextDelta
    from hosttools import sessionrecorder as sr

    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path / "events")) as recorder:
        for n in range(4):
            recorder.record("sess", TextDelta(text=f"line {n}"))
    log = tmp_path / "events" / "sess.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"line", b"LINE")  # keeps the old crc
    log.write_bytes(b"".join(lines))
    damaged = subprocess.run(
        ["adaptor", "events", "--file", str(log), "--json"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    *records, last = json_lines(damaged.stdout)
    assert damaged.returncode == 70 and [r["host_seq"] for r in records] == [1, 2]
    assert last["ok"] is False and last["exit_code"] == 70 and "host_seq" not in last
    error = errors.from_wire(last["error"])
    assert isinstance(error, sr.JSONLEventLogCorruptError) and (error.key, error.line) == ("sess", 3)
    assert "corrupt at line 3" in damaged.stderr


def test_events_report_a_torn_last_line_as_the_strict_readers_do(home: Home, tmp_path: Path) -> None:
    # A finished run's log whose last line lost its newline (or was cut mid-line) was shown
    # without that record, exit 0: a script saw a run with no ending and no error.
    request_id = home.client.submit(script({"text": "whole"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    log = home.root / "events" / f"{request_id}.jsonl"
    whole = log.read_bytes()
    count = whole.count(b"\n")
    for cut in (whole[:-1], whole[:-40]):
        log.write_bytes(cut)
        for args in (["events", request_id, "--json"], ["events", "--file", str(log), "--json"]):
            shown = home.cli(*args)
            *records, last = json_lines(shown.stdout)
            assert shown.returncode == 70, (args, shown.stdout, shown.stderr)
            assert [r["host_seq"] for r in records] == list(range(1, count))
            assert last["ok"] is False and "torn tail: unterminated last line" in last["error"]["message"]
    # The same lines whole again: read to the end, exit 0.
    log.write_bytes(whole)
    shown = home.cli("events", request_id, "--json")
    assert shown.returncode == 0 and len(json_lines(shown.stdout)) == count


def test_a_reader_that_is_gone_ends_every_command_quietly(home: Home, tmp_path: Path) -> None:
    # Click's own broken-pipe handling exited 1 (a RunError's code) for exit-codes, verify-log
    # and --help; the commands that caught it themselves exited 0.
    request_id = home.client.submit(threaded("gone-reader", {"text": "answered"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    log = tmp_path / "copy.jsonl"  # a finished log: the daemon writes none of it any more
    log.write_bytes((home.root / "events" / f"{_home.session_for_thread('gone-reader')}.jsonl").read_bytes())
    run = ["run", "--driver", "script", "--config", steps({"text": "hi"})]
    commands = [
        ["exit-codes"], ["exit-codes", "--json"], ["--help"], ["--version"], ["verify-log", str(log)],
        ["verify-log", "--json", str(log)], ["status"], ["approvals", "--json"], ["threads"],
        ["threads", "show", "gone-reader"], ["events", "--file", str(log)], ["events", request_id, "--json"],
        ["wait", request_id], [*run, "go"], [*run, "--json", "go"], [*run, "--no-daemon", "go"],
    ]
    for command in commands:
        reading, writing = os.pipe()
        os.close(reading)  # the reader exited before the first byte
        try:
            proc = subprocess.run(
                ["adaptor", *command], stdout=writing, stderr=subprocess.PIPE, env=home.env(), timeout=TIMEOUT
            )
        finally:
            os.close(writing)
        assert (proc.returncode, proc.stderr) == (0, b""), (command, proc.returncode, proc.stderr[-500:])


def test_head_ends_quietly(home: Home) -> None:
    request_id = home.client.submit(
        script(*({"text": f"line {n} " + "x" * 100} for n in range(400)))
    )
    home.client.wait(request_id, timeout=TIMEOUT)
    for command in (f"adaptor events {request_id}", f"adaptor events {request_id} --json"):
        proc = subprocess.run(
            ["bash", "-c", f'{command} | head -n 1; echo "status=${{PIPESTATUS[0]}}" >&2'],
            capture_output=True,
            text=True,
            env=home.env(),
            timeout=TIMEOUT,
        )
        assert len(proc.stdout.splitlines()) == 1
        assert proc.stderr.strip() == "status=0", proc.stderr


# --- approvals ------------------------------------------------------------------------------------


def test_approve_from_another_process_and_the_exactly_once_errors(home: Home) -> None:
    request_id = home.client.submit(
        script(PERMISSION, {"text": "approved"}, policy={"approvals": {"timeout": 60}})
    )
    approval_id = pending_approval(home, request_id)["id"]
    listed = orjson.loads(home.cli("approvals", "--json").stdout)
    assert listed["ok"] is True and listed["exit_code"] == 0
    assert approval_id in [a["id"] for a in listed["result"]]
    assert approval_id in home.cli("approvals").stdout
    first = home.cli("approve", approval_id, "--json")
    assert first.returncode == 0 and orjson.loads(first.stdout)["ok"] is True
    second = home.cli("approve", approval_id, "--json")
    assert second.returncode == 5
    assert orjson.loads(second.stdout)["error"]["code"] in (
        "ErrApprovalResolved",
        "ErrApprovalExpired",
    )
    assert home.cli("wait", request_id).stdout == "approved\n"

    unknown = home.cli("approve", "no-such-approval", "--json")
    assert unknown.returncode == 5
    assert orjson.loads(unknown.stdout)["error"]["code"] == "ErrApprovalUnavailable"


def test_run_shows_what_an_approval_asks_and_how_to_answer_it(home: Home) -> None:
    # The hint of a daemon run named only the kind and the id: the person who had to decide
    # learnt neither what the agent wanted to do nor a question's choices from it.
    ran = home.cli(
        "run", "--driver", "script",
        "--config", steps(PERMISSION, QUESTION, {"text": "went on"}),
        "--policy-question", "ask", "--policy-approval-timeout", "0.5",
        "--policy-on-timeout", "continue", "go",
    )
    assert (ran.returncode, ran.stdout) == (0, "went on\n"), ran.stderr
    hints = [line for line in ran.stderr.splitlines() if line.startswith(("?", "  "))]
    assert hints[0] == "? permission: edit main.py"
    assert re.fullmatch(r"  adaptor approve (\S+) \| adaptor deny \1", hints[1]), hints
    assert hints[2:4] == ["? question: which one?", "  choices: red, blue"]
    assert re.fullmatch(r"  adaptor answer (\S+) OPTION \| adaptor deny \1", hints[4]), hints


def test_answer_a_question_after_a_kind_mismatch(home: Home) -> None:
    request_id = home.client.submit(
        script(
            QUESTION, {"text": "answered"}, policy={"approvals": {"question": "ask", "timeout": 60}}
        )
    )
    approval_id = pending_approval(home, request_id)["id"]
    mismatch = home.cli("approve", approval_id, "--json")
    assert mismatch.returncode == 5
    assert orjson.loads(mismatch.stdout)["error"]["code"] == "ErrApprovalKindMismatch"
    assert approval_id in [a["id"] for a in home.client.approvals()]  # still open
    empty = home.cli("answer", approval_id, "")
    assert empty.returncode == 2 and "needs an option" in empty.stderr
    with pytest.raises(ValueError, match="needs an option"):
        home.client.answer(approval_id, "")
    # Written by hand, an empty answer is set aside like any response the CLI refuses.
    response = home.root / "approvals" / "responses" / f"{approval_id}.json"
    response.write_text('{"action": "answer", "text": ""}')
    deadline = time.monotonic() + TIMEOUT
    while response.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not response.exists()
    assert list((home.root / "quarantine").glob(f"approval-response-{approval_id}-*"))
    assert approval_id in [a["id"] for a in home.client.approvals()]  # still open
    assert home.cli("answer", approval_id, "blue").returncode == 0
    assert home.cli("wait", request_id).stdout == "answered\n"


def test_deny_with_a_reason(home: Home) -> None:
    request_id = home.client.submit(
        script(PERMISSION, {"text": "never"}, policy={"approvals": {"timeout": 60}})
    )
    denied = home.cli("deny", pending_approval(home, request_id)["id"], "--reason", "not on main")
    assert denied.returncode == 0, denied.stderr
    waited = home.cli("wait", request_id, "--json")
    assert waited.returncode == 1
    assert orjson.loads(waited.stdout)["error"]["code"] == "ErrApprovalDenied"


def test_answer_after_expiry_is_expired(home: Home) -> None:
    request_id = home.client.submit(script(PERMISSION, policy={"approvals": {"timeout": 0.3}}))
    approval_id = pending_approval(home, request_id)["id"]
    assert home.cli("wait", request_id).returncode == 1  # ApprovalTimeoutError
    late = home.cli("approve", approval_id, "--json")
    assert late.returncode == 5
    assert orjson.loads(late.stdout)["error"]["code"] == "ErrApprovalExpired"


def test_a_reason_too_long_for_a_response_file_is_a_usage_error(home: Home) -> None:
    # A reason over 64 KiB was written, then set aside by the daemon: "denied" (exit 0) while
    # the request stayed open, and a later `approve` won too.
    request_id = home.client.submit(
        script(
            QUESTION, {"text": "answered"}, policy={"approvals": {"question": "ask", "timeout": 60}}
        )
    )
    approval_id = pending_approval(home, request_id)["id"]
    too_long = home.cli("deny", approval_id, "--reason", "x" * 64 * 1024)
    assert too_long.returncode == 2, too_long.stderr
    assert "--reason" in too_long.stderr and "65536 bytes" in too_long.stderr
    room = int(re.search(r"at most (\d+) fit", too_long.stderr)[1])  # type: ignore[index]
    with pytest.raises(ValueError, match="too long"):
        home.client.answer(approval_id, "x" * 64 * 1024)
    assert list(home.root.joinpath("approvals", "responses").glob(f"{approval_id}*")) == []
    assert home.cli("answer", approval_id, "blue").returncode == 0  # still open
    assert home.cli("wait", request_id).stdout == "answered\n"

    # The room the message names is exact: a reason that long is acted on.
    request_id = home.client.submit(script(PERMISSION, policy={"approvals": {"timeout": 60}}))
    denied = home.cli("deny", pending_approval(home, request_id)["id"], "--reason", "y" * room)
    assert denied.returncode == 0, denied.stderr
    with pytest.raises(errors.ApprovalDeniedError) as info:
        home.client.wait(request_id, timeout=TIMEOUT)
    assert info.value.details.get("text") == "y" * room


def test_a_reason_or_answer_that_is_not_utf8_is_a_usage_error(home: Home) -> None:
    # It ended in exit 70: "external TypeError: str is not valid UTF-8".
    request_id = home.client.submit(
        script(
            QUESTION, {"text": "answered"}, policy={"approvals": {"question": "ask", "timeout": 60}}
        )
    )
    approval_id = pending_approval(home, request_id)["id"]
    answered = home.cli("answer", approval_id, "caf\udce9")  # the argument b"caf\xe9"
    assert answered.returncode == 2, answered.stderr
    assert "OPTION" in answered.stderr and "not valid UTF-8" in answered.stderr
    denied = home.cli("deny", approval_id, "--reason", "\udcff")
    assert denied.returncode == 2 and "--reason" in denied.stderr
    with pytest.raises(ValueError, match="UTF-8"):
        home.client.deny(approval_id, "caf\udce9")
    assert home.cli("answer", approval_id, "blue").returncode == 0  # still open
    assert home.cli("wait", request_id).stdout == "answered\n"


# --- status, threads, secrets ---------------------------------------------------------------------


def test_status_is_0_while_the_daemon_runs_and_69_when_not(home: Home, tmp_path: Path) -> None:
    up = subprocess.run(
        ["adaptor", "status", "--home", str(home.root), "--json"], capture_output=True, text=True
    )
    outcome = orjson.loads(up.stdout)
    assert up.returncode == 0 and outcome["ok"] is True and outcome["exit_code"] == 0
    info = outcome["result"]
    assert info["running"] is True and info["pid"] == home.daemon.proc.pid  # type: ignore[union-attr]
    assert "adaptord running" in home.cli("status").stdout
    down = subprocess.run(
        ["adaptor", "status", "--home", str(tmp_path)], capture_output=True, text=True
    )
    assert down.returncode == 69 and "not running" in down.stdout
    # ... and says on stderr how to start one, as `run` does (stdout stays the report).
    assert down.stderr == f"adaptor: adaptord is not running for {tmp_path} (start it with `adaptord serve --home " \
        f"{tmp_path}` or `systemctl --user start adaptord`; `adaptor run --no-daemon` runs in-process)\n"
    # --json: the failure envelope, still carrying the report.
    down_json = subprocess.run(
        ["adaptor", "status", "--home", str(tmp_path), "--json"], capture_output=True, text=True
    )
    stopped = orjson.loads(down_json.stdout)
    assert down_json.returncode == 69 and stopped["ok"] is False and stopped["exit_code"] == 69
    assert "not running" in stopped["error"]["message"]
    assert stopped["result"]["running"] is False and stopped["result"]["pid"] is None


def test_status_without_a_daemon_calls_its_claimed_requests_interrupted(tmp_path: Path) -> None:
    # After a kill -9 it listed them as "running" under "adaptord not running".
    daemon = DaemonProcess(tmp_path / "home").start()
    request_id = Client(daemon.home.root).submit(script({"sleep": 300}))
    env = {**os.environ, "ADAPTORD_HOME": str(daemon.home.root)}

    def status() -> str:
        return subprocess.run(["adaptor", "status"], capture_output=True, text=True, env=env).stdout

    wait_until(lambda: f"  running  {request_id}" in status(), "the request to run")
    assert "queued: 0  running: 1" in status()
    daemon.kill9()
    shown = status()
    assert "adaptord not running" in shown and "queued: 0  interrupted: 1" in shown
    assert f"  interrupted {request_id}" in shown and "running  " not in shown


def test_every_command_names_a_missing_daemon_by_its_public_class(tmp_path: Path) -> None:
    # --json said "type": "adaptor._cli_common.DaemonNotRunningError": a private module in the
    # field scripts match on, which no program could import.
    idle = tmp_path / "idle"
    (idle / "spool" / "new").mkdir(parents=True)
    (idle / "spool" / "tmp").mkdir()
    queued = Client(idle).submit(script({"text": "never run"}))
    for command in (
        ["status"], ["wait", queued], ["events", queued, "-f"], ["run", "--driver", "script", "hi"],
    ):
        proc = subprocess.run(
            ["adaptor", *command, "--json", "--home", str(idle)], capture_output=True, text=True, timeout=TIMEOUT
        )
        outcome = orjson.loads(proc.stdout.splitlines()[-1])
        assert proc.returncode == outcome["exit_code"] == 69, (command, proc.stdout, proc.stderr)
        assert outcome["error"]["code"] == "external"
        assert outcome["error"]["type"] == "adaptor.spool.DaemonNotRunningError", command
    assert "DaemonNotRunningError" in spool.__all__
    error = spool.DaemonNotRunningError(idle)
    assert error.home == idle and str(error).startswith(f"adaptord is not running for {idle} ")


def test_status_of_a_file_for_a_home_is_69_as_for_every_other_command(tmp_path: Path) -> None:
    # status exited 70 (NotADirectoryError: .../spool/new) where approvals and wait said 69.
    not_a_home = tmp_path / "file"
    not_a_home.write_text("")
    said = {}
    for command in (["status"], ["status", "--json"], ["approvals"], ["wait", "x"], ["threads", "show", "k"]):
        proc = subprocess.run(
            ["adaptor", *command, "--home", str(not_a_home)], capture_output=True, text=True, timeout=TIMEOUT
        )
        assert proc.returncode == 69, (command, proc.stderr)
        said[command[0], "--json" in command] = proc.stderr.strip()
        if command == ["status", "--json"]:  # its report still comes (`jq .result.running`)
            outcome = orjson.loads(proc.stdout)
            assert outcome["result"]["running"] is False and outcome["result"]["queued"] == []
            assert outcome["error"]["type"] == "adaptor.spool.SpoolNotFoundError"
    assert said["status", False] == said["approvals", False] == said["wait", False] != ""
    assert said["status", False].startswith(f"adaptor: no adaptord spool under {not_a_home}")
    assert "adaptord serve" not in said["status", False]  # it could not start there either


def _status_with_daemon_state(
    tmp_path: Path, content: bytes
) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    """``adaptor status``, ``adaptord status`` and ``adaptor status --json`` of a serving
    daemon whose ``adaptord.json`` holds ``content``; and that file's path."""
    daemon = DaemonProcess(tmp_path / "home").start()
    try:
        daemon.home.daemon_state.write_bytes(content)
        home = ["--home", str(daemon.home.root)]
        shown = [
            subprocess.run([*command, *home], capture_output=True, text=True, timeout=TIMEOUT)
            for command in (["adaptor", "status"], ["adaptord", "status"], ["adaptor", "status", "--json"])
        ]
    finally:
        assert daemon.stop() == 0
    return daemon.home.daemon_state, shown


def test_status_of_a_damaged_daemon_state_says_it_is_unreadable(tmp_path: Path) -> None:
    # It printed "pid None, None workers, since None" and nothing on stderr.
    state, (ours, theirs, _) = _status_with_daemon_state(tmp_path, b'{"pid": 12')
    assert ours.returncode == theirs.returncode == 0, ours.stderr
    assert ours.stdout.splitlines()[0] == f"adaptord running for {tmp_path / 'home'}"
    assert "None" not in ours.stdout
    assert ours.stderr == theirs.stderr.replace("adaptord: ", "adaptor: ", 1)
    assert f"{state} is unreadable" in ours.stderr


def test_status_of_a_daemon_state_of_other_types_says_it_is_damaged(tmp_path: Path) -> None:
    # {"pid": "x", "workers": "y", "started_at": 5} was shown as it was: "pid x, y workers, since 5".
    state, (ours, _, as_json) = _status_with_daemon_state(tmp_path, b'{"pid": "x", "workers": "y", "started_at": 5}')
    assert ours.returncode == 0 and ours.stdout.splitlines()[0] == f"adaptord running for {tmp_path / 'home'}"
    assert f"{state} is damaged (pid, workers, started_at of another type)" in ours.stderr
    assert orjson.loads(as_json.stdout)["result"]["pid"] is None


def test_status_names_one_worker_in_the_singular(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("workers = 1\n")
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    try:
        status = subprocess.run(
            ["adaptor", "status", "--home", str(daemon.home.root)],
            capture_output=True, text=True, timeout=TIMEOUT,
        )
    finally:
        assert daemon.stop() == 0
    assert ", 1 worker, since " in status.stdout.splitlines()[0], status.stdout  # was "1 workers"


def test_threads_list_and_show(home: Home) -> None:
    home.client.run(threaded("cli/threads/a"), timeout=TIMEOUT)
    outcome = orjson.loads(home.cli("threads", "list", "--json").stdout)
    assert outcome["ok"] is True and outcome["exit_code"] == 0
    listed = outcome["result"]
    record = next(r for r in listed if r["key"] == "cli/threads/a")
    assert record["status"] == "active" and record["driver_type"] == "script"
    assert "cli/threads/a" in home.cli("threads").stdout
    assert orjson.loads(home.cli("threads", "--json").stdout)["result"] == listed  # docs: threads [--json]
    shown = home.cli("threads", "show", "cli/threads/a", "--json")
    assert shown.returncode == 0 and orjson.loads(shown.stdout)["result"] == record
    missing = home.cli("threads", "show", "cli/threads/none")
    assert missing.returncode == errors.exit_code_for(errors.ThreadNotFoundError()) == 4
    empty = home.cli("threads", "show", "")
    assert empty.returncode == 2 and "never empty" in empty.stderr
    # One line per thread, whatever the key holds.
    home.client.run(threaded("two\nlines"), timeout=TIMEOUT)
    lines = home.cli("threads").stdout.splitlines()
    assert '"two\\nlines"' in [line.split("  ")[0] for line in lines]
    assert not any(line.startswith("lines") for line in lines)


def test_threads_list_and_show_read_a_store_they_cannot_write(home: Home) -> None:
    # A home that is readable but not writable (a read-only mount, a copy, another user's with
    # group read): both exited 70 ("PermissionError: ... threads/store.lock"), the store's lock
    # file being opened for writing even to read.
    home.client.run(threaded("cli/threads/read-only"), timeout=TIMEOUT)
    listed = orjson.loads(home.cli("threads", "--json").stdout)["result"]
    shown = orjson.loads(home.cli("threads", "show", "cli/threads/read-only", "--json").stdout)["result"]
    store = home.root / "threads"
    with unwritable(*sorted(store.iterdir()), store):
        outcome = home.cli("threads", "--json")
        assert outcome.returncode == 0, outcome.stderr
        assert orjson.loads(outcome.stdout)["result"] == listed
        outcome = home.cli("threads", "show", "cli/threads/read-only", "--json")
        assert outcome.returncode == 0, outcome.stderr
        assert orjson.loads(outcome.stdout)["result"] == shown
        missing = home.cli("threads", "show", "cli/threads/none")
        assert missing.returncode == 4, missing.stderr
        assert "cli/threads/read-only" in home.cli("threads").stdout
    assert home.cli("threads", "show", "cli/threads/read-only").returncode == 0


def test_threads_quote_a_key_that_would_not_read_back_as_itself(home: Home) -> None:
    # Shown as they are, " " was a blank column, "a  b" split into two columns, and a key
    # that starts with a quote looked like another key shown JSON-quoted.
    odd = [" cli/quote/padded ", "cli/quote/two  spaces", '"cli/quote/quoted"', '"cli/quote/nl\\n"']
    plain = "cli/quote/plain key"
    for key in (*odd, plain):
        home.client.run(threaded(key), timeout=TIMEOUT)
    lines = home.cli("threads").stdout.splitlines()
    for key in odd:
        assert any(line.startswith(orjson.dumps(key).decode() + "  script  ") for line in lines), (key, lines)
    assert any(line.startswith(plain + "  script  ") for line in lines)
    shown = home.cli("threads", "show", odd[0]).stdout.splitlines()
    assert 'key: " cli/quote/padded "' in shown

    # A right-to-left override or a zero-width space was quoted but printed as it is inside
    # the quotes: the override still reordered the line on a terminal.
    for key, quoted in (("cli/quote/\u202eevil", '"cli/quote/\\u202eevil"'), ("cli/quote/zero\u200bwidth", '"cli/quote/zero\\u200bwidth"')):
        home.client.run(threaded(key), timeout=TIMEOUT)
        listed = home.cli("threads").stdout.splitlines()
        assert any(line.startswith(quoted + "  script  ") for line in listed), (key, listed)


def test_events_of_an_empty_thread_key_is_a_usage_error(home: Home) -> None:
    # With -f it waited forever for a log no run can write; without, it said exit 4.
    for args in (["--thread", ""], ["--thread", "", "-f"]):
        proc = home.cli("events", *args, timeout=TIMEOUT)
        assert proc.returncode == 2 and "never empty" in proc.stderr, (args, proc.stderr)


def test_a_thread_key_argument_that_is_not_utf8_is_a_usage_error(home: Home) -> None:
    # Bytes that are not UTF-8 reach argv as a lone surrogate ("\udcff" is the byte 0xff).
    # `run --thread` said so (exit 2); `threads show` failed with exit 70 and a ValueError
    # about "Query.key", `events --thread` with exit 70 and a UnicodeEncodeError.
    key = "cli/bytes/\udcff"
    for args in (["threads", "show", key], ["events", "--thread", key], ["events", "--thread", key, "-f"]):
        proc = home.cli(*args, timeout=TIMEOUT)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "a thread key is UTF-8 text" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_threads_of_a_home_that_does_not_exist_is_69_not_an_empty_list(home: Home, tmp_path: Path) -> None:
    # A mistyped --home listed nothing (exit 0) and `show` said the conversation was gone.
    env = {**home.env(), "ADAPTORD_HOME": str(tmp_path / "no-such-home")}
    for args in (["threads"], ["threads", "list", "--json"], ["threads", "show", "k"]):
        proc = subprocess.run(["adaptor", *args], capture_output=True, text=True, env=env, timeout=TIMEOUT)
        assert proc.returncode == 69, (args, proc.stdout, proc.stderr)


def test_short_env_values_are_not_redacted_out_of_error_messages(home: Home, tmp_path: Path) -> None:
    # Values under six characters are configuration (docs/daemon.md), but the error codec got
    # them anyway: with DEBUG=1 and LANG2=e, "exit code 1" read "<redacted>xit cod<redacted>
    # <redacted>" in the verdict, and --no-daemon mangled the placeholder itself.
    failing = tmp_path / "fails.sh"
    failing.write_text(f"#!/bin/sh\necho 'error at line 120: {SECRET}' >&2\nexit 1\n")
    failing.chmod(0o755)
    request = {"driver": "command", "prompt": "x", "workspace": str(tmp_path),
               "config": {"command": str(failing), "env": {"DEBUG": "1", "LANG2": "e", "TOKEN": SECRET}}}
    for extra in ([], ["--no-daemon"]):
        proc = home.cli("run", "--json", *extra, "--request", "-", input=orjson.dumps(request).decode())
        assert proc.returncode == 1, proc.stderr
        message = orjson.loads(proc.stdout)["error"]["message"]
        assert "exit code 1" in message and "error at line 120: <redacted>" in message, message
        assert SECRET not in proc.stdout + proc.stderr


def test_secrets_are_never_printed(home: Home) -> None:
    env = {**home.env(), "CLI_SECRET": SECRET}
    config = steps({"stdout": f"token {SECRET}"}, {"text": f"the secret is {SECRET}"})
    outputs = []
    for extra in ([], ["--json"], ["--no-daemon"], ["--no-daemon", "--json"]):
        proc = subprocess.run(
            [
                "adaptor",
                "run",
                "--driver",
                "script",
                "--config",
                config,
                "--env",
                "CLI_SECRET",
                *extra,
                "go",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 0, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    request_id = orjson.loads(outputs[2])["id"]
    outputs += [
        home.cli("events", request_id, "--json").stdout,
        home.cli("wait", request_id, "--json").stdout,
    ]
    assert all(SECRET not in text for text in outputs)
    assert "<redacted>" in outputs[0]


def test_a_config_file_secret_is_never_printed_by_an_in_process_run(tmp_path: Path) -> None:
    (tmp_path / "adaptord").mkdir()
    (tmp_path / "adaptord" / "config.toml").write_text(
        f'[drivers.command]\nenv = {{API_TOKEN = "{SECRET}"}}\n'
    )
    echo = 'printf "token=%s\\n" "$API_TOKEN"; printf "err %s\\n" "$API_TOKEN" >&2; exit 3'
    request = {"driver": "command", "config": {"command": "/bin/sh", "extra_args": ["-c", echo]}}
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "ADAPTORD_HOME": str(tmp_path / "home")}
    outputs = []
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            ["adaptor", "run", "--no-daemon", "--request", "-", *extra, "go"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            timeout=TIMEOUT,
        )
        assert proc.returncode == 1, proc.stderr  # the agent failed, quoting its token
        outputs += [proc.stdout, proc.stderr]
    assert all(SECRET not in text for text in outputs)
    assert "err <redacted>" in outputs[1] and "err <redacted>" in outputs[2]


def test_approval_of_a_run_interrupted_by_a_crash_is_expired(tmp_path: Path) -> None:
    root = tmp_path / "home"
    daemon = DaemonProcess(root, env={"XDG_CONFIG_HOME": str(tmp_path)}).start()
    client = Client(root)
    request_id = client.submit(
        script({"text": "hi"}, PERMISSION, policy={"approvals": {"timeout": 600}})
    )
    approval_id = pending_approval(Home(root, daemon, tmp_path), request_id)["id"]
    state = root / "runs" / request_id / "state.json"
    wait_until(lambda: orjson.loads(state.read_bytes()).get("entered"), "the run to be entered")
    daemon.kill9()
    restarted = DaemonProcess(root, env={"XDG_CONFIG_HOME": str(tmp_path)}).start()
    try:
        with pytest.raises(errors.RunError):
            client.wait(request_id, timeout=TIMEOUT)  # interrupted: infrastructure_error
        late = Home(root, restarted, tmp_path).cli("approve", approval_id, "--json")
        assert late.returncode == 5
        error = orjson.loads(late.stdout)["error"]
        assert error["code"] == "ErrApprovalExpired"
        # It said only "expired before this response", not why.
        assert error["message"].endswith(
            "expired before this response: adaptord stopped while the run that asked was "
            "going, which ended it"
        )
    finally:
        assert restarted.stop() == 0


def _entered(root: Path, request_id: str) -> None:
    state = root / "runs" / request_id / "state.json"
    wait_until(lambda: orjson.loads(state.read_bytes()).get("entered"), "the run to be entered")


def test_approve_after_the_daemon_was_killed_is_expired(tmp_path: Path) -> None:
    # "approved" (exit 0) with no daemon left to act on it; the next start then counted that
    # response as the winner.
    root = tmp_path / "home"
    daemon = DaemonProcess(root, env={"XDG_CONFIG_HOME": str(tmp_path)}).start()
    user = Home(root, daemon, tmp_path)
    request_id = user.client.submit(script(PERMISSION, policy={"approvals": {"timeout": 600}}))
    approval_id = pending_approval(user, request_id)["id"]
    _entered(root, request_id)
    daemon.kill9()
    late = user.cli("approve", approval_id, "--json")
    assert late.returncode == 5
    assert orjson.loads(late.stdout)["error"]["code"] == "ErrApprovalExpired"
    assert "adaptord is not running" in late.stderr
    assert user.client.approvals() == []
    resolved = orjson.loads((root / "approvals" / "resolved" / f"{approval_id}.json").read_bytes())
    assert resolved["result"] == "expired"
    again = user.cli("deny", approval_id)  # expired for good, and every responder told why
    assert again.returncode == 5 and "adaptord is not running" in again.stderr, again.stderr


@contextlib.contextmanager
def _approve_waiting_on_a_stopped_daemon(
    tmp_path: Path, *options: str
) -> Iterator[tuple[Home, str, str, Path, subprocess.Popen[str]]]:
    """`adaptor approve` of a run's approval, its response written, waiting for a daemon
    stopped (SIGSTOP) off the approvals lock; the daemon goes on after the block.  Yields the
    home, the request and approval ids, the response file and the approving process."""
    root = tmp_path / "home"
    daemon = DaemonProcess(root, env={"XDG_CONFIG_HOME": str(tmp_path)}).start()
    user = Home(root, daemon, tmp_path)
    request_id = user.client.submit(
        script(PERMISSION, {"text": "approved"}, policy={"approvals": {"timeout": 600}})
    )
    approval_id = pending_approval(user, request_id)["id"]
    response = root / "approvals" / "responses" / f"{approval_id}.json"
    daemon.stop_off_the_approvals_lock()
    try:
        approving = subprocess.Popen(["adaptor", "approve", approval_id, *options], env=user.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(response.exists, "the response to be written")
        yield user, request_id, approval_id, response, approving
    finally:
        daemon.signal(signal.SIGCONT)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_approve_takes_its_response_back_when_nothing_took_it(
    tmp_path: Path, how: signal.Signals
) -> None:
    # Ctrl-C while `approve` waited for the daemon (stopped, starved) exited 130 saying
    # nothing, and the response it had written took effect: the run went on approved.
    with _approve_waiting_on_a_stopped_daemon(tmp_path) as (user, request_id, approval_id,
                                                             response, approving):
        approving.send_signal(how)
        _, err = approving.communicate(timeout=TIMEOUT)
        assert approving.returncode == 128 + how, err
        assert not response.exists()
        assert "taken back" in err, err
    assert [a["id"] for a in user.client.approvals()] == [approval_id]  # still open
    assert user.cli("deny", approval_id).returncode == 0
    with pytest.raises(errors.ApprovalDeniedError):
        user.client.wait(request_id, timeout=TIMEOUT)


def test_a_stopped_approve_json_says_which_approval_and_what_became_of_the_response(
    tmp_path: Path,
) -> None:
    # Its object said only "stopped by SIGTERM": neither the approval nor whether the response
    # still stood (stderr said it, which a script reading --json does not read).
    with _approve_waiting_on_a_stopped_daemon(tmp_path, "--json") as (_, _, approval_id, _, approving):
        approving.send_signal(signal.SIGTERM)
        out, err = approving.communicate(timeout=TIMEOUT)
    assert approving.returncode == 128 + signal.SIGTERM, err
    outcome = orjson.loads(out)
    assert (outcome["ok"], outcome["exit_code"]) == (False, 128 + signal.SIGTERM)
    assert outcome["error"]["code"] == "context.Canceled" and "stopped by SIGTERM" in outcome["error"]["message"]
    assert outcome["result"] == {"id": approval_id, "action": "approved", "response": "taken_back"}


def test_a_second_ctrl_c_during_the_take_back_still_says_what_became_of_the_response(
    tmp_path: Path,
) -> None:
    # The take-back waits for the approvals lock (held here, as by a daemon stopped holding
    # it); a second Ctrl-C then left the response in force and said nothing.
    import fcntl

    with _approve_waiting_on_a_stopped_daemon(tmp_path) as (user, _, _, response, approving):
        with open(user.root / "approvals" / "approvals.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            approving.send_signal(signal.SIGINT)
            time.sleep(0.5)
            approving.send_signal(signal.SIGINT)
            _, err = approving.communicate(timeout=TIMEOUT)
        assert approving.returncode == 130, err
        assert response.exists() and "the response stays written" in err, err


@pytest.mark.parametrize("responded", ["after the deadline", "before the deadline, taken after it"])
def test_approve_that_the_deadline_beat_is_expired(tmp_path: Path, responded: str) -> None:
    # After: the pending file's deadline was not checked; with the daemon stopped (SIGSTOP)
    # past it, `approve` said "approved" and the run went on to succeed.  Before: the
    # response went in before the deadline, so `approve` said "approved" (exit 0), but the
    # daemon (stopped here, busy or slow in life) took it after the deadline, which the run
    # had acted on already: it failed with ApprovalTimeoutError.  `approve` now waits for the
    # daemon to hand the response over and reports what the run did with it.
    root = tmp_path / "home"
    daemon = DaemonProcess(root, env={"XDG_CONFIG_HOME": str(tmp_path)}).start()
    user = Home(root, daemon, tmp_path)
    request_id = user.client.submit(
        script(PERMISSION, {"text": "approved"}, policy={"approvals": {"timeout": 4}})
    )
    pending = pending_approval(user, request_id)
    deadline = datetime.fromisoformat(pending["deadline"])
    command = ["adaptor", "approve", pending["id"], "--json"]
    daemon.stop_off_the_approvals_lock()
    try:
        if responded == "after the deadline":
            wait_until(lambda: datetime.now(UTC) > deadline, "the deadline to pass")
        approving = subprocess.Popen(
            command, env=user.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if responded != "after the deadline":
            wait_until(lambda: datetime.now(UTC) > deadline, "the deadline to pass")
            assert approving.poll() is None  # waiting for the daemon to take it
            # A second responder meanwhile was told "already resolved (a response is being
            # handed over)", as if the first one had counted: none can any more.
            second = user.cli("deny", pending["id"], "--json")
            assert second.returncode == 5, second.stderr
            assert orjson.loads(second.stdout)["error"]["code"] == "ErrApprovalExpired", second.stdout
        else:
            approving.wait(TIMEOUT)
    finally:
        daemon.signal(signal.SIGCONT)
    try:
        out, err = approving.communicate(timeout=TIMEOUT)
        assert approving.returncode == 5, (out, err)
        error = orjson.loads(out)["error"]
        assert error["code"] == "ErrApprovalExpired" and "deadline" in error["message"], error
        with pytest.raises(errors.ApprovalTimeoutError):
            user.client.wait(request_id, timeout=TIMEOUT)
        again = user.cli("approve", pending["id"])  # and so is every later responder
        assert again.returncode == 5 and "deadline" in again.stderr, again.stderr
    finally:
        assert daemon.stop() == 0


def _inotify_open(pid: int) -> bool:
    """Whether process ``pid`` watches a folder (its wait for a verdict has begun)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                return True
    return False


def _first_line(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The first line ``process`` writes on stderr, read by a thread of its own."""
    line: queue.Queue[str] = queue.Queue()
    stderr = process.stderr
    assert stderr is not None
    threading.Thread(target=lambda: line.put(stderr.readline()), daemon=True).start()
    return line


def test_run_no_daemon_keeps_the_configs_a2a_credentials_from_its_agent(tmp_path: Path) -> None:
    # As the daemon does: the remote's token, named by the config file, stays out of the
    # agent's environment (an agent printing it showed it) and is redacted if it gets in.
    config_home = tmp_path / "config"
    (config_home / "adaptord").mkdir(parents=True)
    (config_home / "adaptord" / "config.toml").write_text(
        '[a2a.remotes.helper]\ncard_url = "http://127.0.0.1:9/.well-known/agent-card.json"\n'
        'bearer_token_env = "QA_REMOTE_TOKEN"\n'
    )
    token = "remote-cred-0123456789abcdef"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "ADAPTORD_HOME": str(tmp_path / "home"),
           "QA_REMOTE_TOKEN": token}
    show = 'printf "remote=%s\\n" "${QA_REMOTE_TOKEN-unset}"'
    ran = subprocess.run(
        ["adaptor", "run", "--no-daemon", "--driver", "command", "--config", "command=/bin/sh",
         "--config", "extra_args=" + json.dumps(["-c", show]), "go"],
        capture_output=True, text=True, env=env, timeout=TIMEOUT,
    )
    assert (ran.returncode, ran.stdout) == (0, "remote=unset\n"), ran.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_run_and_wait_say_when_the_daemon_stops(tmp_path: Path) -> None:
    config_home = tmp_path / "config"
    config_home.mkdir()
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "ADAPTORD_HOME": str(tmp_path / "home")}
    daemon = DaemonProcess(tmp_path / "home", env=env).start()
    run = subprocess.Popen(
        ["adaptor", "run", "--driver", "script", "--config", steps({"sleep": 120}), "go"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    rid = daemon.wait_for_line("request.started id=").split("id=")[1].split()[0]
    wait = subprocess.Popen(
        ["adaptor", "wait", rid], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    restarted = DaemonProcess(tmp_path / "home", env=env)
    try:
        wait_until(lambda: _inotify_open(run.pid) and _inotify_open(wait.pid), "both clients waiting")
        daemon.kill9()
        # Each client says so within a few seconds, then keeps waiting for the next start,
        # whose verdict (the run was interrupted) it then reports.  It said "keeps its place
        # and runs when the daemon starts again": a running request is not run again.
        stopped = (
            f"adaptord stopped; {rid} was running and does not run again (on_interrupt fail): "
            "the next start gives it its verdict (interrupted)"
        )
        said = {client.pid: _first_line(client) for client in (run, wait)}
        for client, ctrl_c in ((run, "Ctrl-C stops waiting and cancels it"), (wait, f"`adaptor wait {rid}` waits again")):
            line = said[client.pid].get(timeout=TIMEOUT)
            assert stopped in line and ctrl_c in line, line
        restarted.start()
        assert run.wait(timeout=TIMEOUT) == 1 and wait.wait(timeout=TIMEOUT) == 1
        for client in (run, wait):
            # The restart's verdict came before the clients' next look at the daemon: the
            # last word about it was that it had stopped.
            assert client.stderr is not None
            rest = client.stderr.read()
            assert "adaptor: adaptord serves again" in rest, rest
    finally:
        for client in (run, wait):
            if client.poll() is None:
                client.kill()
                client.wait()
        daemon.kill_if_running()
    assert restarted.stop() == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_daemon_stop_notice_says_what_the_next_start_does(tmp_path: Path) -> None:
    # A queued request runs at the next start; a running one with on_interrupt requeue runs
    # again (the one that fails is above).
    config_home = tmp_path / "config"
    config_home.mkdir()
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "ADAPTORD_HOME": str(tmp_path / "home")}
    daemon = DaemonProcess(tmp_path / "home", "--workers", "1", env=env).start()
    again = daemon.submit(script({"sleep": 120}, on_interrupt="requeue"))
    daemon.wait_for_line(f"request.started id={again}")
    queued = daemon.submit(script({"text": "ran after the restart"}))
    daemon.wait_for_line(f"request.queued id={queued}")  # claimed: the one worker is busy
    waits = {
        rid: subprocess.Popen(["adaptor", "wait", rid], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rid in (again, queued)
    }
    said = {rid: _first_line(wait) for rid, wait in waits.items()}
    restarted = DaemonProcess(tmp_path / "home", "--workers", "1", env=env)
    try:
        wait_until(lambda: all(_inotify_open(wait.pid) for wait in waits.values()), "both clients waiting")
        daemon.kill9()
        line = said[again].get(timeout=TIMEOUT)
        assert (
            f"adaptord stopped; {again} was running: the next start runs it again "
            "(on_interrupt requeue, attempt 2 of 3) (Ctrl-C" in line
        ), line
        line = said[queued].get(timeout=TIMEOUT)
        assert f"adaptord stopped; {queued} keeps its place and runs when the daemon starts again" in line, line
        restarted.start()
        restarted.wait_for_line(f"request.started id={again}")  # as said: it runs again
        Client(tmp_path / "home").cancel(again)
        assert waits[again].wait(timeout=TIMEOUT) == 1  # RunCancelledError
        assert waits[queued].wait(timeout=TIMEOUT) == 0
        assert waits[queued].communicate(timeout=TIMEOUT)[0] == "ran after the restart\n"
    finally:
        for wait in waits.values():
            if wait.poll() is None:
                wait.kill()
                wait.wait()
        daemon.kill_if_running()
    assert restarted.stop() == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_events_follow_says_when_the_daemon_stops(tmp_path: Path) -> None:
    # `events ID -f` followed a run whose daemon was killed in silence, as if the agent were
    # only slow.  It says so, as `wait` does, and follows on until a restart gives the verdict.
    config_home = tmp_path / "config"
    config_home.mkdir()
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home), "ADAPTORD_HOME": str(tmp_path / "home")}
    daemon = DaemonProcess(tmp_path / "home", env=env).start()
    rid = daemon.submit(script({"text": "before"}, {"sleep": 120}))
    daemon.wait_for_line(f"request.started id={rid}")
    follower = subprocess.Popen(
        ["adaptor", "events", rid, "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    said = _first_line(follower)
    restarted = DaemonProcess(tmp_path / "home", env=env)
    try:
        assert follower.stdout is not None
        assert "run.started" in follower.stdout.readline()  # it follows the live run
        daemon.kill9()
        line = said.get(timeout=TIMEOUT)
        assert f"adaptord stopped; {rid} was running and does not run again" in line, line
        assert f"`adaptor events {rid} -f` follows again" in line, line
        restarted.start()
        # The restart writes the interrupted run's verdict (and its run.finished): following ends.
        assert follower.wait(timeout=TIMEOUT) == 0  # a few lines: the pipe cannot fill up
        rest = follower.stdout.read()
        assert rest.splitlines()[-1].split()[2] == "run.finished", rest
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        daemon.kill_if_running()
    assert restarted.stop() == 0


def test_a_terminal_that_cannot_show_the_answer_still_gets_it_escaped(home: Home) -> None:
    # A latin-1 terminal and an agent answering with a check mark: the run succeeded.
    env = {**home.env(), "PYTHONIOENCODING": "latin-1"}
    for extra in ([], ["--no-daemon"]):
        proc = subprocess.run(
            ["adaptor", "run", "--driver", "script", "--config", steps({"text": "héllo ✓ 世界"}), *extra, "go"],
            capture_output=True, env=env, timeout=TIMEOUT,
        )
        assert (proc.returncode, proc.stdout) == (0, "héllo \\u2713 \\u4e16\\u754c\n".encode("latin-1")), proc.stderr


def test_a_client_at_its_task_limit_still_gets_its_answer(home: Home) -> None:
    # No thread to spare in the client: no file watcher, no daemon-stop notices; polling only.
    from tests.task_limit import TaskLimit

    command = ["adaptor", "run", "--driver", "script", "--config", steps({"text": "answered"}), "go"]
    with subprocess.Popen(
        ["/bin/sh", "-c", 'read line; exec "$@"', "sh", *command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=home.env(),
    ) as client:
        assert client.stdin is not None
        try:
            with TaskLimit(client.pid) as limit:
                limit.cap()
                out, err = client.communicate(b"\n", timeout=TIMEOUT)
        finally:
            client.kill()
    assert (client.returncode, out) == (0, b"answered\n"), err


def test_a_prompt_that_is_not_utf8_or_too_large_is_refused_alike_with_and_without_the_daemon(
    home: Home,
) -> None:
    config = steps({"text": "ok"})
    for extra in ([], ["--no-daemon"]):
        for prompt, why in ((b"ab\xff", "its value at /prompt is not UTF-8 (is every argument, and the prompt read from stdin, UTF-8?)"), (b"x" * 1_500_000, "larger than 1048576 bytes")):
            proc = subprocess.run(
                ["adaptor", "run", "--driver", "script", "--config", config, *extra, "-"],
                input=prompt, capture_output=True, env=home.env(), timeout=TIMEOUT,
            )
            assert proc.returncode == 2 and why in proc.stderr.decode(), (extra, proc.stderr[-300:])


def test_the_driver_a_request_file_names_wins_over_adaptor_driver(home: Home) -> None:
    # $ADAPTOR_DRIVER is the default --driver: it replaced the file's driver, and the request
    # ran on another agent (script: exit 0, no text) with nothing said.
    request = orjson.dumps({"driver": "command", "prompt": "from the file", "config": {"command": "/bin/cat"}})
    for extra in ([], ["--no-daemon"]):
        for env, driver_option, said in (
            ({"ADAPTOR_DRIVER": "script"}, [], "from the file"),
            # One this version does not know (or spelled otherwise) is never looked at here:
            # click checked it against the choices first, exit 2.
            ({"ADAPTOR_DRIVER": "opencode"}, [], "from the file"),
            ({"ADAPTOR_DRIVER": "Script"}, [], "from the file"),
            ({}, ["--driver", "script"], ""),  # an explicit --driver still overrides the file
        ):
            ran = subprocess.run(
                ["adaptor", "run", "--request", "-", "--json", *driver_option, *extra],
                input=request, capture_output=True, env={**home.env(), **env}, timeout=TIMEOUT,
            )
            out = orjson.loads(ran.stdout)
            assert (ran.returncode, out["result"]["text"]) == (0, said), (extra, env, out)
            assert out["result"]["provider"] == ("command" if said else "script")


def test_an_adaptor_driver_this_version_does_not_know_is_said_when_it_is_used(home: Home) -> None:
    ran = subprocess.run(
        ["adaptor", "run", "--json", "p"], capture_output=True, text=True,
        env={**home.env(), "ADAPTOR_DRIVER": "opencode"}, timeout=TIMEOUT,
    )
    assert ran.returncode == 2
    message = orjson.loads(ran.stdout)["error"]["message"]
    assert message.startswith("Invalid value for '$ADAPTOR_DRIVER': 'opencode' is not one of 'claude'"), message


def test_options_adding_to_a_request_files_field_of_another_type_are_usage_errors(home: Home) -> None:
    # A --policy-* or --metadata option on a file whose policy or metadata is no object failed
    # with an internal TypeError (exit 70); "policy": null, which the schema allows, too.
    cases: tuple[tuple[dict[str, Any], list[str], str], ...] = (
        ({"policy": "strict"}, ["--policy-sandbox", "read_only"], "its policy must be an object"),
        ({"metadata": ["a"]}, ["--metadata", "a=1"], "its metadata must be an object"),
    )
    for fields, option, said in cases:
        request = orjson.dumps({"driver": "script", "prompt": "x", **fields})
        proc = subprocess.run(["adaptor", "run", "--request", "-", "--json", *option],
                              input=request, capture_output=True, env=home.env(), timeout=TIMEOUT)
        out = orjson.loads(proc.stdout)
        assert (proc.returncode, out["error"]["message"]) == (2, f"Invalid value for --request: {said}")
    # One level down the file's value was replaced by an object: its approvals policy (or its
    # env) was dropped without a word, the run went on (exit 0).
    nested: tuple[tuple[dict[str, Any], list[str], str], ...] = (
        ({"policy": {"approvals": "auto_reject"}}, ["--policy-approval-timeout", "30"],
         "cannot set policy.approvals.timeout: policy.approvals is of type string"),
        ({"config": {"env": "FOO=bar"}}, ["--env", "BAZ=1"], "cannot set config.env.BAZ: config.env is of type string"),
        ({}, ["--config", "a=1", "--config", "a.b=2"], "cannot set config.a.b: config.a is of type integer"),
    )
    for fields, option, said in nested:
        for extra in ([], ["--no-daemon"]):
            request = orjson.dumps({"driver": "script", "prompt": "x", **fields})
            proc = subprocess.run(["adaptor", "run", "--request", "-", "--json", *option, *extra],
                                  input=request, capture_output=True, env=home.env(), timeout=TIMEOUT)
            out = orjson.loads(proc.stdout)
            assert proc.returncode == 2 and out["error"]["message"].startswith(said), (option, extra, out)
    no_policy = orjson.dumps({"driver": "script", "prompt": "x", "policy": None, "config": {"steps": [{"text": "ok"}]}})
    ran = subprocess.run(["adaptor", "run", "--request", "-", "--policy-max-retries", "2"],
                         input=no_policy, capture_output=True, env=home.env(), timeout=TIMEOUT)
    assert (ran.returncode, ran.stdout) == (0, b"ok\n"), ran.stderr


def test_a_request_file_run_reads_as_submit_reads_it(home: Home) -> None:
    # `adaptor run --request` called a file that is not JSON a usage error of click's own
    # (`external`, click.exceptions.BadParameter), where `adaptor submit` of the same file is
    # ErrInvalidRequest, and refused the byte-order mark submit accepts.
    request = orjson.dumps({"driver": "script", "prompt": "go", "config": {"steps": [{"text": "bom"}]}})
    for extra in ([], ["--no-daemon"]):
        for data, code in ((b"{not json", "ErrInvalidRequest"), (b"[1]", "ErrInvalidRequest")):
            proc = subprocess.run(
                ["adaptor", "run", "--request", "-", "--json", *extra],
                input=data, capture_output=True, env=home.env(), timeout=TIMEOUT,
            )
            out = orjson.loads(proc.stdout)
            assert (proc.returncode, out["error"]["code"]) == (2, code), (extra, data, out)
        ran = subprocess.run(
            ["adaptor", "run", "--request", "-", *extra],
            input=codecs.BOM_UTF8 + request, capture_output=True, env=home.env(), timeout=TIMEOUT,
        )
        assert (ran.returncode, ran.stdout) == (0, b"bom\n"), (extra, ran.stderr)


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--policy-active-execution-timeout", "nan"], "nan is not a number of seconds"),
        (["--policy-active-execution-timeout", "inf"], "inf, which JSON cannot hold (leave the option out for no limit)"),
        (["--policy-approval-timeout", "-inf"], "-inf, which JSON cannot hold"),
        (["--timeout", "inf"], "inf, which JSON cannot hold (leave the option out for no limit)"),
        # Quoted as typed: it said "inf, which JSON cannot hold" of a 1e400 nobody wrote as inf.
        (["--timeout", "1e400"], "1e400, too large: it reads as inf, which JSON cannot hold (leave the option"),
        (["--policy-approval-timeout", "-1E999"], "-1E999, too large: it reads as -inf, which JSON cannot hold"),
        # It said "the request cannot be JSON: Integer exceeds 64-bit range (is every argument,
        # and the prompt read from stdin, UTF-8?)".
        (["--policy-max-retries", "9" * 23], "99999999999999999999999, outside the integers -2**63 .. 2**64-1"),
    ],
)
def test_an_option_value_json_cannot_hold_is_refused_naming_the_option(
    home: Home, option: list[str], said: str
) -> None:
    # --no-daemon wrote such a request out with orjson (NaN and infinity become null) and ran it
    # with no limit at all, exit 0; later both refused it as "invalid request: <root>: request
    # value at /policy/approvals/max_retries is ...", a place in a file the user never wrote.
    config = steps({"sleep": 0.2}, {"text": "done"})
    for extra in ([], ["--no-daemon"]):
        proc = home.cli("run", "--driver", "script", "--config", config, *option, *extra, "--json", "go")
        out = orjson.loads(proc.stdout)
        assert proc.returncode == 2 and out["error"]["type"] == "click.exceptions.BadParameter", (extra, out)
        assert out["error"]["message"].startswith(f"Invalid value for '{option[0]}': {said}"), (extra, out)


class _Terminal:
    """``adaptor ARGS`` on a pseudo-terminal of its own, read as a user would see it."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self._leader, follower = pty.openpty()
        self.proc = subprocess.Popen(["adaptor", *args], stdin=follower, stdout=follower, stderr=follower, env=env)
        os.close(follower)
        self.seen = b""
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._leader, 4096)
            except OSError:  # EIO: the other side is closed
                chunk = b""
            with self._changed:
                self.seen += chunk
                self._changed.notify_all()
            if not chunk:
                return

    def wait_for(self, text: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: text.encode() in self.seen, TIMEOUT), self.seen[-500:]

    def type(self, line: str) -> None:
        os.write(self._leader, line.encode())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._leader)


def test_run_no_daemon_asks_on_the_terminal_and_ctrl_c_at_the_question_cancels(home: Home) -> None:
    config = steps(PERMISSION, {"text": "edited"})
    command = ("run", "--no-daemon", "--driver", "script", "--policy-permission", "ask", "--config", config, "go")
    terminal = _Terminal(*command, env=home.env())
    try:
        terminal.wait_for("approve? [y/N]: ")
        terminal.type("y\n")
        assert terminal.proc.wait(TIMEOUT) == 0
        terminal.wait_for("edited")
    finally:
        terminal.close()

    terminal = _Terminal(*command, env=home.env())
    try:
        terminal.wait_for("approve? [y/N]: ")
        terminal.proc.send_signal(signal.SIGINT)  # Ctrl-C: the question is on another thread
        assert terminal.proc.wait(TIMEOUT) == 130
        terminal.wait_for("adaptor: cancelled")
        assert b"Traceback" not in terminal.seen and b"Fatal" not in terminal.seen
    finally:
        terminal.close()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_that_cannot_be_written_is_reported_once_with_exit_70(home: Home, tmp_path: Path) -> None:
    # status, threads, events and run reported it as "adaptor: OSError: [Errno 28] ...".
    request_id = home.client.submit(threaded("full-disk", {"text": "answered"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    log = tmp_path / "copy.jsonl"
    log.write_bytes((home.root / "events" / f"{_home.session_for_thread('full-disk')}.jsonl").read_bytes())
    run = ["adaptor", "run", "--driver", "script", "--config", steps({"text": "hi"})]
    commands = (
        ["adaptor", "exit-codes"], ["adaptor", "exit-codes", "--json"], [*run, "--json", "go"], [*run, "go"],
        [*run, "--no-daemon", "go"], ["adaptor", "status"], ["adaptor", "threads"], ["adaptor", "threads", "--json"],
        ["adaptor", "events", "--file", str(log)], ["adaptor", "events", request_id], ["adaptor", "wait", request_id],
        ["adaptor", "verify-log", str(log)], ["adaptor", "approvals", "--json"], ["adaptor", "--help"],
    )
    with open("/dev/full", "wb") as full:
        for command in commands:
            proc = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, env=home.env(), timeout=TIMEOUT)
            assert proc.returncode == 70, (command, proc.stderr)
            assert proc.stderr.decode().strip() == "adaptor: cannot write the output: No space left on device", command
    # submit's id unwritten: the request was queued all the same, which a script must be told.
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(["adaptor", "submit", "-"], input=orjson.dumps(script({"text": "once"})),
                              stdout=full, stderr=subprocess.PIPE, env=home.env(), timeout=TIMEOUT)
    said = proc.stderr.decode().strip()
    assert proc.returncode == 70 and said.endswith(" was queued all the same"), said
    queued = said.removesuffix(" was queued all the same").rsplit(" ", 1)[1]
    assert home.client.wait(queued, timeout=TIMEOUT).text == "once"
    closed = subprocess.run([*run, "go"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=home.env(),
                            timeout=TIMEOUT, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert (closed.returncode, closed.stderr) == (0, b"")  # stdout closed: as good as /dev/null


def test_ctrl_c_with_json_still_prints_the_outcome_object(home: Home, tmp_path: Path) -> None:
    for extra in ([], ["--no-daemon"]):
        started = tmp_path / f"started{len(extra)}"
        agent = f'touch {started}; exec sleep 30'
        proc = subprocess.Popen(
            ["adaptor", "run", "--driver", "command", "--config", "command=/bin/sh",
             "--config", f'extra_args={json.dumps(["-c", agent])}', "--json", *extra, "go"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=home.env(),
        )
        deadline = time.monotonic() + TIMEOUT
        while not started.exists() and time.monotonic() < deadline:  # the agent runs
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
        outcome = orjson.loads(out)
        # (Seen once in CI: exit 70; the outcome and stderr say why, should it come back.)
        assert proc.returncode == 130 and outcome["ok"] is False and outcome["exit_code"] == 130, (
            extra, outcome, err.decode(errors="replace")
        )
        assert outcome["error"]["code"] == errors.CancelledError.code and outcome["id"]


_CTRL_C_IN_A_CLASS = """
import os

if os.environ.get("ADAPTOR_TEST_CTRL_C_IN_A_CLASS"):
    from adaptor import spool

    _enter = spool._Wakeup.__enter__

    class _Interrupts:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    def _enter_once(self):
        # What a Ctrl-C landing while watchdog's classes are being made looks like (Python
        # 3.11 wraps it: "Error calling __set_name__ ..."), once the run has started.
        spool._Wakeup.__enter__ = _enter
        import time
        deadline = time.monotonic() + 30
        while not os.path.exists(os.environ["ADAPTOR_TEST_CTRL_C_IN_A_CLASS"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        class _Defined:
            field = _Interrupts()
        return _enter(self)

    spool._Wakeup.__enter__ = _enter_once
"""


def test_a_ctrl_c_another_exception_wraps_still_cancels_the_run(home: Home, tmp_path: Path) -> None:
    # Seen in CI: a Ctrl-C while `adaptor run` imported watchdog exited 70 ("Error calling
    # __set_name__ on 'Field' instance '_lock' in 'InotifyWatchGroup'", caused by the
    # KeyboardInterrupt), and the run it was about went on.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_CTRL_C_IN_A_CLASS)
    started = tmp_path / "started"
    env = {
        **home.env(),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
        "ADAPTOR_TEST_CTRL_C_IN_A_CLASS": str(started),
    }
    agent = f"touch {started}; exec sleep 30"
    ran = subprocess.run(
        ["adaptor", "run", "--driver", "command", "--config", "command=/bin/sh",
         "--config", f"extra_args={json.dumps(['-c', agent])}", "--json", "go"],
        capture_output=True, env=env, timeout=TIMEOUT,
    )
    outcome = orjson.loads(ran.stdout)
    assert ran.returncode == 130 and outcome["exit_code"] == 130, (outcome, ran.stderr)
    assert outcome["error"]["code"] == errors.CancelledError.code
    with pytest.raises(errors.RunCancelledError):  # the run was cancelled, not left running
        home.client.wait(outcome["id"], timeout=TIMEOUT)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie awaiting its parent's reaping has stopped too.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True


@pytest.mark.parametrize(
    ("stop", "extra"),
    [(signal.SIGTERM, []), (signal.SIGHUP, []), (signal.SIGTERM, ["--no-daemon"]), (signal.SIGHUP, ["--no-daemon"])],
)
def test_sigterm_and_sighup_cancel_the_run_as_ctrl_c_does(
    home: Home, tmp_path: Path, stop: signal.Signals, extra: list[str]
) -> None:
    # `timeout 60 adaptor run ...`, `kill`, a closed terminal: the run must not go on unwatched,
    # and an in-process run must not leave its agent behind.
    pid_file = tmp_path / "agent.pid"
    agent = f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 60"
    command = ["adaptor", "run", "--driver", "command", "--config", "command=/bin/sh",
               "--config", f"extra_args={json.dumps(['-c', agent])}", *extra]
    for as_json in (False, True):
        pid_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [*command, *(["--json"] if as_json else []), "go"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=home.env(),
        )
        wait_until(pid_file.exists, "the agent to start")
        agent_pid = int(pid_file.read_text())
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 128 + stop, err
        assert "cancelled" in err.decode() and stop.name in err.decode()
        assert err.startswith(b"adaptor: cancelled")  # no blank line first: stderr is no terminal
        assert b"Traceback" not in err
        if as_json:
            outcome = orjson.loads(out)
            assert outcome["ok"] is False and outcome["exit_code"] == 128 + stop
            assert outcome["error"]["code"] == errors.CancelledError.code
            assert outcome["error"]["message"] == f"cancelled by {stop.name}"
            request_id = outcome["id"]
            # The line names the run both ways (--no-daemon said only "cancelled (SIGTERM)").
            assert err.decode().startswith(f"adaptor: cancelled {request_id} ({stop.name}")
        if not extra:  # the daemon's run was cancelled, not left running
            if not as_json:
                request_id = err.decode().split("cancelled ", 1)[1].split()[0]
            assert home.cli("wait", request_id).returncode == 1  # RunCancelledError
            verdict = home.client.verdict(request_id)
            assert verdict is not None and verdict["error"]["code"] == errors.RunCancelledError.code
        wait_until(functools.partial(_gone, agent_pid), "the agent to stop")


@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGINT, signal.SIGINT), (signal.SIGINT, signal.SIGTERM), (signal.SIGHUP, signal.SIGINT)],
)
def test_a_second_signal_while_an_in_process_run_stops_kills_its_agent_and_changes_nothing(
    tmp_path: Path, first: signal.Signals, second: signal.Signals
) -> None:
    # The first signal's outcome object was printed, then the wait for an agent slow to stop
    # was cut by the second, which printed another object ("stopped by ...") and exited with
    # its own status: two answers on stdout, and an exit status that contradicted the first.
    pid_file = tmp_path / "agent.pid"
    agent = f"trap '' TERM; echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 60"
    proc = subprocess.Popen(
        ["adaptor", "run", "--no-daemon", "--home", str(tmp_path / "home"), "--json",
         "--driver", "command", "--config", "command=/bin/sh", "--config", "grace_period=60",
         "--config", f"extra_args={json.dumps(['-c', agent])}", "go"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    wait_until(pid_file.exists, "the agent to start")
    agent_pid = int(pid_file.read_text())
    proc.send_signal(first)
    said = proc.stderr.readline().decode()
    assert said.startswith("adaptor: cancelled"), said  # the first signal is being acted on
    assert not _gone(agent_pid)  # ignores SIGTERM: stopping it takes a while
    proc.send_signal(second)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + first, err
    [line] = out.splitlines()
    outcome = orjson.loads(line)
    assert outcome["exit_code"] == 128 + first and outcome["error"]["code"] == errors.CancelledError.code
    assert b"Traceback" not in err
    wait_until(functools.partial(_gone, agent_pid), "the agent to be killed")


@pytest.mark.parametrize("extra", [[], ["--no-daemon"]])
def test_a_thread_turn_that_starts_a_new_session_says_so(home: Home, tmp_path: Path, extra: list[str]) -> None:
    # A turn from another directory (or a submit's turn, then a run's) starts the agent anew,
    # its conversation left behind: said only as a notice in the audit log, exit 0 and a
    # normal answer, so nobody at the terminal knew the agent had forgotten everything.
    key = f"moved-{len(extra)}"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    turn = ["run", *extra, "--driver", "script", "--config", "session=auto", "--thread", key]
    first = home.cli(*turn, "--workspace", str(tmp_path / "a"), "--config", steps({"text": "one"}), "go")
    again = home.cli(*turn, "--workspace", str(tmp_path / "a"), "--config", steps({"text": "two"}), "go")
    moved = home.cli(*turn, "--workspace", str(tmp_path / "b"), "--config", steps({"text": "three"}), "go")
    assert [r.returncode for r in (first, again, moved)] == [0, 0, 0], moved.stderr
    assert "new session" not in first.stderr + again.stderr
    assert moved.stdout == "three\n"
    assert moved.stderr == (
        "adaptor: starting a new session: the stored one does not fit "
        "(its workspace changed since the stored session)\n"
    )
    quiet = home.cli(*turn, "--json", "--workspace", str(tmp_path / "a"), "--config", steps({"text": "x"}), "go")
    assert quiet.returncode == 0 and quiet.stderr == ""  # (--json: the audit log has it)


def test_a_sighup_that_is_ignored_stays_ignored(home: Home, tmp_path: Path) -> None:
    # `nohup adaptor run ...`: the user asked for the run to outlive the terminal.
    proc = subprocess.Popen(
        ["adaptor", "run", "--driver", "command", "--config", "command=/bin/sh",
         "--config", f"extra_args={json.dumps(['-c', 'sleep 0.5; echo done'])}", "go"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=home.env(),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    time.sleep(0.2)  # not a timing assertion: an early SIGHUP is ignored all the same
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert (proc.returncode, out.decode().strip()) == (0, "done"), err



def test_no_color_and_a_dumb_terminal_get_plain_output(home: Home) -> None:
    config = steps({"tool_call": {"name": "grep", "args": {"q": "x"}}}, {"sleep": 0.6}, {"text": "done"})
    shown = {}
    for name, extra_env in (("styled", {}), ("no_color", {"NO_COLOR": "1"}), ("dumb", {"TERM": "dumb"})):
        terminal = _Terminal("run", "--driver", "script", "--config", config, "go",
                             env={**home.env(), "TERM": "xterm", **extra_env})
        try:
            assert terminal.proc.wait(TIMEOUT) == 0
            terminal.wait_for("done")
        finally:
            terminal.close()
        shown[name] = terminal.seen
        assert b"\xe2\x9a\x99 grep" in terminal.seen  # the tool line ("⚙ grep") either way
    dim, erase = b"\x1b[2m", b"\x1b[K"
    assert dim in shown["styled"] and erase in shown["styled"]  # faint tool line, progress line
    assert dim not in shown["no_color"] and erase in shown["no_color"]  # no styling, still progress
    assert b"\x1b[" not in shown["dumb"]  # no escape sequence at all: no progress line


def test_signals_while_run_prints_and_exits_leave_its_exit_status_alone(tmp_path: Path) -> None:
    # `adaptor run` put the default SIGTERM/SIGHUP dispositions back on its way out (and a
    # SIGINT raised KeyboardInterrupt), so a signal landing once the run's outcome was in, while
    # its answer was printed or the process exited, turned the decided 0 into 143, 129 or 130
    # and cut the answer short.  Its answer is larger than a pipe holds: printing it blocks until
    # read, so the signals (sent every millisecond until it is gone) land while it prints too.
    text = "x" * 120_000  # two pipe buffers (64 KiB), within what one argument may hold
    proc = subprocess.Popen(
        ["adaptor", "run", "--no-daemon", "--home", str(tmp_path / "home"), "--driver", "script",
         "--config", steps({"text": text}), "go"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    printed = [proc.stdout.read(1)]  # printing has begun: the exit status is decided
    assert printed == [b"x"], proc.stderr.read().decode()[-2000:]
    reader = threading.Thread(target=lambda: printed.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    sent = 0
    while proc.poll() is None:
        assert time.monotonic() < deadline, "still running after the signals"
        proc.send_signal((signal.SIGTERM, signal.SIGINT, signal.SIGHUP)[sent % 3])
        sent += 1
        time.sleep(0.001)
    reader.join(TIMEOUT)
    stderr = proc.stderr.read().decode()
    assert proc.returncode == 0, stderr[-2000:]
    assert b"".join(printed).rstrip(b"\n") == text.encode()


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for ``signum`` (it is past its start-up)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_verify_log_reading_a_pipe_with_its_json_object(stop: signal.Signals) -> None:
    # verify-log had no guard: a Ctrl-C exited 1 (a RunError's code) with click's "Aborted!",
    # a SIGTERM killed it, neither with its --json object.
    proc = subprocess.Popen(
        ["adaptor", "verify-log", "--json", "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_until(functools.partial(_handles, proc.pid, signal.SIGTERM), "the command's signal handler")
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 128 + stop, (out, err)
    outcome = orjson.loads(out)
    assert (outcome["ok"], outcome["exit_code"]) == (False, 128 + stop)
    assert outcome["error"]["message"] == f"stopped by {'Ctrl-C' if stop == signal.SIGINT else stop.name}"


def test_an_undecodable_id_gets_its_json_object(home: Home) -> None:
    # The id (a lone surrogate from the undecodable argument) went into the object as it was:
    # a TypeError traceback, exit 1, no object.
    for command in ("wait", "cancel", "events"):
        proc = subprocess.run(
            [b"adaptor", command.encode(), b"\xff", b"--json"], capture_output=True, env=home.env(), timeout=TIMEOUT
        )
        outcome = orjson.loads(proc.stdout)
        assert (proc.returncode, outcome["exit_code"], outcome["id"]) == (2, 2, "\\udcff"), (command, proc.stderr)
        assert outcome["error"]["type"] == "adaptor.spool.UnknownRequestError"
    # Any message quoting an undecodable argument or file name got no object either.
    for args, code, said in (
        ([b"events", b"--json", b"--file", b"missing\xff.jsonl"], 2, "no such file: missing\\udcff.jsonl"),
        ([b"status", b"--json", b"x\xff"], 2, "Got unexpected extra argument (x\\udcff)"),
    ):
        proc = subprocess.run([b"adaptor", *args], capture_output=True, env=home.env(), timeout=TIMEOUT)
        outcome = orjson.loads(proc.stdout)
        assert (proc.returncode, outcome["exit_code"]) == (code, code) and said in outcome["error"]["message"], proc.stderr


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_wait_and_events_as_ctrl_c_does(home: Home, stop: signal.Signals) -> None:
    # `timeout 60 adaptor wait ID --json | jq` got no object: the command died by the signal.
    request_id = home.client.submit(script({"sleep": 300}))
    try:
        for args in (["wait", request_id, "--json"], ["events", request_id, "-f", "--json"]):
            proc = subprocess.Popen(
                ["adaptor", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=home.env()
            )
            wait_until(functools.partial(_handles, proc.pid, stop), "the command's signal handler")
            proc.send_signal(stop)
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 128 + stop, (args, out, err)
            outcome = orjson.loads(out.splitlines()[-1])
            assert outcome["ok"] is False and outcome["exit_code"] == 128 + stop
            # Only the waiting stopped: the request was not cancelled.
            assert outcome["error"]["message"] == f"stopped by {stop.name}"
        assert home.cli("status", "--json").stdout.count(request_id) == 1  # still there
        assert not (home.root / "verdicts" / f"{request_id}.json").exists()
    finally:
        home.cli("cancel", request_id)

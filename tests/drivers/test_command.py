"""The ``command`` driver with real small shell scripts: stdin prompt, stdout as the answer,
exit status, environment, timeout and the refusals of everything a plain executable cannot do."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import adaptor
from adaptor import errors
from adaptor.drivers import command
from adaptor.events import ProcessInfo, TextDelta
from adaptor.memory import Store
from adaptor.testing import conformance
from tests.daemon_harness import processes_with_env
from tests.drivers.conftest import group_members
from tests.mounts import tmpfs


@dataclasses.dataclass
class Item:
    name: str
    count: int


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def agent_for(path: str, tmp_path: Path, **fields: object) -> adaptor.Agent:
    return adaptor.Agent(command.Driver(command.Config(path, **fields)),  # type: ignore[arg-type]
                         workspace=str(tmp_path))


def test_raw_streams_keep_carriage_returns_byte_for_byte(tmp_path: Path) -> None:
    # The line reader dropped the \r of every \r\n: raw_streams showed "a\nb\rc".
    path = script(tmp_path, "crlf.sh", "cat >/dev/null\nprintf 'a\\r\\nb\\rc'\nprintf 'x\\r\\ny\\rz\\r\\n' >&2\n")
    with agent_for(path, tmp_path) as agent:
        stream = agent.stream("go")
        deltas = "".join(e.text for e in stream.events() if isinstance(e, TextDelta))
        result = stream.result()
    assert result.raw().stdout == "a\r\nb\rc"
    assert result.raw().stderr == "x\r\ny\rz\r\n"
    # The answer is its stdout as printed, live as in replay.
    assert result.text == deltas == command.replay(b"a\r\nb\rc").output == "a\r\nb\rc"


def test_stdin_prompt_stdout_answer_and_line_deltas(tmp_path: Path) -> None:
    # Upper-cases the prompt and adds a second line naming the working directory.
    path = script(tmp_path, "shout.sh", 'tr a-z A-Z\necho\necho "in $(basename "$PWD")" >&2\n'
                                        'printf "cwd=%s" "$(basename "$PWD")"\n')
    with agent_for(path, tmp_path) as agent:
        stream = agent.stream("say hello", instructions="be loud")
        events = list(stream)
        result = stream.result()
    name = tmp_path.name
    assert result.text == f"BE LOUD\n\nSAY HELLO\ncwd={name}"
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.phase for d in deltas] == ["start", "content", "content", "content", "content", "end"]
    assert [d.text for d in deltas if d.phase == "content"] == [
        "BE LOUD\n", "\n", "SAY HELLO\n", f"cwd={name}"]
    assert len({d.message_id for d in deltas}) == 1
    assert [(i.kind, i.text) for i in result.transcript()] == [
        ("stderr", f"in {name}"), ("assistant", result.text)]
    assert result.raw().stdout == f"BE LOUD\n\nSAY HELLO\ncwd={name}"
    assert result.raw().terminal is None


def test_non_zero_exit_is_an_agent_error_with_the_exit_code(tmp_path: Path) -> None:
    path = script(tmp_path, "fail.sh", 'cat >/dev/null\necho partial\necho "error: disk full" >&2\n'
                                       "exit 3\n")
    with agent_for(path, tmp_path) as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("x")
    assert caught.value.details == {"exit_code": 3, "signal": None}
    assert "exit code 3" in str(caught.value) and "error: disk full" in str(caught.value)
    assert caught.value.result is not None and caught.value.result.text == "partial"


def test_environment_reaches_the_process_but_never_the_events(tmp_path: Path) -> None:
    path = script(tmp_path, "env.sh", 'cat >/dev/null\necho "token length ${#API_TOKEN}"\n')
    config = command.Config(path, env={"API_TOKEN": "s3cret-value"})
    with adaptor.Agent(command.Driver(config), workspace=str(tmp_path)) as agent:
        stream = agent.stream("x")
        events = list(stream)
        result = stream.result()
    assert result.text == "token length 12"
    spawn = next(e for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert "API_TOKEN" in spawn.data["env"]
    assert all("s3cret-value" not in repr(e) for e in events)


def test_timeout_stops_the_whole_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    # The script ignores SIGTERM and leaves a child running: only the group's SIGKILL after the
    # grace period ends both.
    path = script(tmp_path, "stuck.sh", "trap '' TERM\nsleep 30 &\necho started\nwait\n")
    with agent_for(path, tmp_path, grace_period=0.2) as agent:
        stream = agent.stream("x", timeout=1.0)
        events = list(stream)
        with pytest.raises(adaptor.RunDeadlineExceededError) as caught:
            stream.result()
    pid = next(int(e.data["pid"]) for e in events
               if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert group_members(pid) == []
    assert caught.value.result is not None and caught.value.result.raw().stdout == "started\n"


def test_prompt_validated_structured_output(tmp_path: Path) -> None:
    # Echoes a fixed JSON answer; the SDK put the schema instruction in front of the prompt.
    answer = """grep -q "JSON Schema" && echo '{"name": "x", "count": 2}'\n"""
    path = script(tmp_path, "json.sh", answer)
    with agent_for(path, tmp_path) as agent:
        result = agent.run("give", schema=Item)
    assert result.decode(Item) == Item("x", 2)
    assert result.structured is not None and result.structured.source == "prompt_validate"


def test_what_an_executable_cannot_do_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = script(tmp_path, "mark.sh", f"touch {marker}\necho ok\n")
    with agent_for(path, tmp_path) as agent:
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(sandbox="read_only"))
        with pytest.raises(adaptor.HumanDecisionModeUnsupportedError):
            agent.run("x", policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(
                permission="auto_approve")))
        refusals: list[Callable[[], object]] = [
            lambda: agent.run("x", append_system_prompt="be nice"),
            lambda: agent.run("x", model="big"),
        ]
        for refused in refusals:
            with pytest.raises(adaptor.RunError) as caught:
                refused()
            assert caught.value.reason == "unsupported_driver"
    with adaptor.Agent(command.Driver(command.Config(path)), thread_store=Store()) as agent:
        with pytest.raises(adaptor.ThreadIncompatibleError):
            agent.thread("t").run("x")
    assert not marker.exists()  # nothing was started for any of them
    assert command.Driver(command.Config(path)).descriptor().sessions.supports_resume is False


def test_binary_not_found_and_config(tmp_path: Path) -> None:
    with pytest.raises(adaptor.RunError) as caught:
        agent_for(str(tmp_path / "missing"), tmp_path).run("x")
    assert caught.value.details["kind"] == "binary_not_found"
    assert errors.exit_code_for(caught.value) == 69
    config = command.Config.from_dict({"command": "./x.sh", "extra_args": ["-v"],
                                       "env": {"A": "b"}})
    assert config == command.Config("./x.sh", env={"A": "b"}, extra_args=("-v",))
    bad_configs: list[dict[str, object]] = [
        {}, {"command": ""}, {"command": "x", "grace_period": -1}, {"command": "x", "cwd": 1}]
    for bad in bad_configs:
        with pytest.raises((TypeError, ValueError)):
            command.Driver(command.Config.from_dict(bad)).validate_config()
    with pytest.raises(ValueError, match="unknown config key"):
        command.Config.from_dict({"command": "x", "args": []})


def test_a_relative_command_is_found_from_the_workspace_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "review.sh"
    script.write_text("#!/bin/sh\necho reviewed\n")
    script.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(tmp_path)
    with adaptor.Agent(command.Driver(command.Config("./review.sh")), workspace=str(work)) as agent:
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("x")
    # It said "./review.sh: no such file" with ./review.sh right there in the caller's directory.
    assert caught.value.details == {"kind": "binary_not_found", "binary": "./review.sh"}
    assert str(caught.value) == (f"./review.sh: no such file in {work} (a relative command is "
                                 "found from the run's working directory)")
    with adaptor.Agent(command.Driver(command.Config("../review.sh")), workspace=str(work)) as agent:
        assert agent.run("x").text == "reviewed"


def test_replay_keeps_a_partial_last_line() -> None:
    response = command.replay(b"one\ntwo", b"warn\n", 0)
    assert response.output == "one\ntwo" and response.failure is None
    assert response.checkpoint is None
    failed = command.replay(b"", b"", None)
    assert failed.failure is not None and failed.failure.details["signal"] == 15


def test_the_documented_snippet_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "drivers.md").read_text()
    section = docs[docs.index("Wrapping a shell script as an agent"):]
    shell, python = re.findall(r"```(?:sh|python)\n(.*?)```", section, re.DOTALL)[:2]
    subprocess.run(["sh", "-c", shell], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    exec(python, {})
    expected = python.strip().splitlines()[-1].removeprefix("# ")
    assert capsys.readouterr().out == expected + "\n"
    with adaptor.Agent(command.Driver(command.Config("./review.sh"))) as agent:
        with pytest.raises(adaptor.AgentFailedError, match="empty prompt"):
            agent.run("")


def test_conformance(tmp_path: Path) -> None:
    path = script(tmp_path, "hello.sh", 'cat >/dev/null\necho "Hello from a script"\n')
    conformance.run(
        lambda: command.Driver(command.Config(path)),
        stub_driver=lambda stub: command.Driver(command.Config(stub)),
    ).raise_for_failures()


def test_a_missing_workspace_is_told_apart_from_a_missing_binary(tmp_path: Path) -> None:
    # Both fail to start the agent; only the binary is "unavailable" (exit 69).
    gone = tmp_path / "removed-checkout"
    agent = adaptor.Agent(command.Driver(command.Config(command="/bin/cat")), workspace=str(gone))
    with pytest.raises(adaptor.RunError) as caught:
        agent.run("hi")
    assert caught.value.reason == "infrastructure_error"
    assert caught.value.details == {"kind": "workspace_unusable", "workspace": str(gone)}
    assert str(caught.value) == f"/bin/cat: working directory {gone} does not exist"
    assert errors.exit_code_for(caught.value) == 1
    # A NUL in the config's cwd failed as the driver's own error ("driver 'command' raised
    # ValueError", embedded null byte), with no kind.
    nul = adaptor.Agent(command.Driver(command.Config(command="/bin/cat", cwd=f"{tmp_path}\0x")))
    with pytest.raises(adaptor.RunError) as caught:
        nul.run("hi")
    assert caught.value.details == {"kind": "workspace_unusable", "workspace": f"{tmp_path}\\0x"}
    assert str(caught.value) == f"/bin/cat: working directory {tmp_path}\\0x holds a NUL character"


@pytest.mark.parametrize("how", ["finished", "cancelled", "timed out"])
def test_a_process_that_left_the_group_is_stopped_with_the_run(tmp_path: Path, how: str) -> None:
    # Gemini CLI starts its shell tool in a session of its own: signals to the agent's process
    # group never reached it, and a cancelled run's `sleep`, build or server ran on.
    marker = f"escaped-{how.replace(' ', '-')}-{os.getpid()}"
    started = tmp_path / "started"
    script = (f"setsid sleep 300 & echo $! > {started}.tmp; mv {started}.tmp {started}; "
              + ("echo done" if how == "finished" else "exec sleep 300"))
    config = command.Config(command="/bin/sh", extra_args=("-c", script), env={"MARK": marker},
                            grace_period=1.0)
    agent = adaptor.Agent(command.Driver(config), workspace=str(tmp_path))
    if how == "finished":
        assert agent.run("go").text.strip() == "done"
    else:
        stream = agent.stream("go", timeout=2.0 if how == "timed out" else None)
        if how == "cancelled":
            deadline = time.monotonic() + 30
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            stream.cancel()
        with pytest.raises(adaptor.RunError):
            stream.result()
    assert started.exists()
    assert processes_with_env("MARK", marker) == []


def test_a_process_that_keeps_forking_copies_of_itself_is_stopped_with_the_run(tmp_path: Path) -> None:
    # A detached process deaf to SIGTERM that forks a copy of itself and exits every few
    # milliseconds outlived the run: the stop signalled the processes one look had found, each
    # gone by then, its copy another process.
    hopper = str(Path(__file__).resolve().parent.parent / "hopper.py")
    beat = tmp_path / "beat"
    for width in (1, 4):  # one, and several
        env = {"HOPPER_LIFE": "30", "HOPPER_WIDTH": str(width), "HOPPER_BEAT": str(beat)}
        config = command.Config(command=sys.executable, extra_args=(hopper,), env=env, grace_period=0.5)
        assert adaptor.Agent(command.Driver(config), workspace=str(tmp_path)).run("go").text.strip() == "started"
        last = beat.stat().st_mtime_ns
        time.sleep(0.5)
        assert beat.stat().st_mtime_ns == last, f"still hopping (width {width})"


def test_a_detached_process_holding_the_output_does_not_hold_up_a_finished_run(tmp_path: Path) -> None:
    # `setsid server &` without redirecting its output: the pipes stay open after the agent
    # exits.  The run waited the whole grace_period (plus a second) before stopping it, so a
    # run that had answered and exited 0 ended as ErrDeadlineExceeded once its timeout fell
    # inside that wait.
    marker = f"holding-{os.getpid()}"
    config = command.Config(command="/bin/sh", extra_args=("-c", "setsid sleep 300 & echo answer; exit 0"),
                            env={"MARK": marker}, grace_period=60.0)
    agent = adaptor.Agent(command.Driver(config), workspace=str(tmp_path))
    assert agent.run("go", timeout=20).text == "answer"
    assert processes_with_env("MARK", marker) == []


@pytest.mark.parametrize("where", ["in its group", "escaped"])
def test_a_leftover_that_keeps_writing_the_output_does_not_hold_up_a_finished_run(
    tmp_path: Path, where: str
) -> None:
    # A dev server or `tail -f` logging more than ten lines a second to the agent's output:
    # its exit was looked for only when the pipes fell quiet, so the run never ended (without
    # a timeout), or ended at its deadline as ErrDeadlineExceeded though the agent had
    # answered and exited 0; cancel and the deadline did not end it either when it escaped.
    marker = f"chatty-{where.replace(' ', '-')}-{os.getpid()}"
    writer = "sh -c 'while :; do echo tick; sleep 0.02; done'"
    launch = f"setsid {writer} &" if where == "escaped" else f"{writer} &"
    config = command.Config(command="/bin/sh", extra_args=("-c", f"echo answer; {launch} exit 0"),
                            env={"MARK": marker}, grace_period=1.0)
    agent = adaptor.Agent(command.Driver(config), workspace=str(tmp_path))
    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(agent.run("go")), daemon=True)
    runner.start()
    runner.join(30)
    left = processes_with_env("MARK", marker)
    for pid in left:  # (the old code's leftovers: not for the next tests)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not runner.is_alive() and left == []
    [result] = outcome
    assert isinstance(result, adaptor.Result) and result.text.startswith("answer\n")
    going_on = command.Config(command="/bin/sh", extra_args=("-c", f"{launch} exec sleep 300"),
                              env={"MARK": marker}, grace_period=1.0)
    stream = adaptor.Agent(command.Driver(going_on), workspace=str(tmp_path)).stream("go")
    def cancel_at_the_first_tick() -> None:
        for event in stream:
            if isinstance(event, ProcessInfo) and event.text == "tick\n":
                stream.cancel()

    cancelling = threading.Thread(target=cancel_at_the_first_tick, daemon=True)
    cancelling.start()
    cancelling.join(30)
    left = processes_with_env("MARK", marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not cancelling.is_alive() and left == []
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()


def test_a_program_for_another_system_or_an_empty_file_says_so(tmp_path: Path) -> None:
    # A program for another machine (the wrong download of an agent's CLI) and an empty file
    # are refused by exec the same way: not told to add a #! line.
    foreign = tmp_path / "agent-arm64"
    program = bytearray(Path("/bin/true").read_bytes())
    program[18:20] = (0xB7).to_bytes(2, "little")  # e_machine: AArch64
    foreign.write_bytes(program)
    mac = tmp_path / "agent-macos"
    mac.write_bytes(b"\xcf\xfa\xed\xfe" + bytes(60))  # Mach-O, 64 bits
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    copied_venv = tmp_path / "tool.py"  # a script whose interpreter is another machine's
    copied_venv.write_text(f"#!{mac}\nprint('hi')\n")
    foreign_why = "a program built for another system (its architecture or format cannot run here)"
    for binary, why in ((foreign, foreign_why), (mac, foreign_why), (empty, "an empty file, not a program"),
                        (copied_venv, f"its interpreter {mac} is not a program this system can run")):
        binary.chmod(0o755)
        with pytest.raises(adaptor.RunError) as caught:
            adaptor.Agent(command.Driver(command.Config(str(binary)))).run("x")
        assert (str(caught.value), caught.value.details["kind"]) == (f"{binary}: {why}", "binary_not_found")


def test_a_program_on_a_noexec_mount_says_so(tmp_path: Path) -> None:
    # A command on a filesystem mounted noexec (as /tmp often is) was "not executable" though
    # its mode said it was: its user looked at the file, never at the mount.
    with tmpfs(tmp_path / "noexec", "size=1m,noexec") as mounted:
        agent = Path(script(mounted, "agent.sh", "echo hi\n"))
        with pytest.raises(adaptor.RunError) as caught:
            adaptor.Agent(command.Driver(command.Config(str(agent)))).run("x")
        assert str(caught.value) == f"{agent}: not executable: the filesystem it is on is mounted noexec"
        assert caught.value.details["kind"] == "binary_not_found"
        agent.chmod(0o644)  # its mode is then the reason, said as ever
        with pytest.raises(adaptor.RunError) as caught:
            adaptor.Agent(command.Driver(command.Config(str(agent)))).run("x")
        assert str(caught.value) == f"{agent}: not executable"


def test_a_command_line_over_the_system_limit_is_refused_as_an_argument_limit(tmp_path: Path) -> None:
    # claude's --json-schema and codex's developer_instructions carry a schema or an appended
    # prompt inline: over 128 KiB, exec's E2BIG failed the run as the driver's own OSError.
    # The argument is named by position and size, never shown (it may be a prompt).
    marker = tmp_path / "ran"
    huge = "s" * 200_000
    config = command.Config(command="/bin/sh", extra_args=("-c", f"touch {marker}", huge))
    with pytest.raises(adaptor.RunError) as caught:
        adaptor.Agent(command.Driver(config)).run("x")
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details == {"kind": "argument_limit"}
    assert str(caught.value) == ("/bin/sh cannot be started: its argument 3 is 200,000 bytes, over the "
                                 "system's limit of 131,071 bytes for one (E2BIG)")
    assert not marker.exists()
    # One environment variable over the limit was blamed on the total, "10 bytes of arguments".
    config = command.Config(command="/bin/sh", extra_args=("-c", f"touch {marker}"), env={"BIG": "s" * 200_000})
    with pytest.raises(adaptor.RunError) as caught:
        adaptor.Agent(command.Driver(config)).run("x")
    assert caught.value.details == {"kind": "argument_limit"}
    assert str(caught.value) == ("/bin/sh cannot be started: its environment variable BIG is 200,004 bytes, "
                                 "over the system's limit of 131,071 bytes for one (E2BIG)")
    many = command.Config(command="/bin/sh", extra_args=("-c", f"touch {marker}", *["s" * 100_000] * 40))
    with pytest.raises(adaptor.RunError) as caught:
        adaptor.Agent(command.Driver(many)).run("x")
    assert re.fullmatch(r"/bin/sh cannot be started: its command line and environment together \([\d,]+ bytes\) "
                        r"are over the system's limit \(E2BIG\)", str(caught.value)), str(caught.value)
    assert not marker.exists()


def test_a_grace_period_is_at_most_five_minutes(tmp_path: Path) -> None:
    # 1e10 was accepted: an agent ignoring SIGTERM then made the run's timeout and cancel
    # mean nothing, its worker taken for good.
    assert adaptor.Agent(command.Driver(command.Config("/bin/cat", grace_period=300))).run("x").text == "x"
    with pytest.raises(adaptor.InvalidDriverConfigError) as caught:
        adaptor.Agent(command.Driver(command.Config("/bin/cat", grace_period=300.5))).run("x")
    assert str(caught.value.cause) == "grace_period: expected a number of seconds from 0 to 300"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        # exec fails with ENOENT for the interpreter too: "review.sh: no such file" for a file
        # that is right there.
        ("#!/nonexistent/interp -x\necho hi\n", "its interpreter /nonexistent/interp does not exist"),
        # exec's ENOEXEC failed the run as the driver's own error ("driver 'command' raised
        # OSError"), no details: the commonest mistake with a script of one's own.
        ("echo hi\n", "not a program this system can run (a script must begin with a #! line)"),
        # Checked out with Windows line ends: exec looks for "/bin/sh\r"; it said "no such file"
        # of the script that is right there.
        ("#!/bin/sh\r\necho hi\r\n", "its #! line ends in a carriage return (the file has Windows line "
         "ends), so its interpreter is /bin/sh followed by one, which does not exist"),
        # Only when the interpreter is there without the carriage return is that the cause.
        ("#!/nonexistent/sh\r\necho hi\r\n", "its interpreter '/nonexistent/sh\\r' does not exist"),
        # A cut-off path was named as the interpreter that could not run.
        ("#!/" + "d" * 300 + "/python\nprint()\n", "its #! line is longer than the system reads (255 bytes)"),
    ],
)
def test_a_script_exec_cannot_run_says_why(tmp_path: Path, body: str, why: str) -> None:
    script = tmp_path / "review.sh"
    script.write_text(body)
    script.chmod(0o755)
    with pytest.raises(adaptor.RunError) as caught:
        adaptor.Agent(command.Driver(command.Config(str(script)))).run("x")
    assert str(caught.value) == f"{script}: {why}"
    assert caught.value.details == {"kind": "binary_not_found", "binary": str(script)}
    assert errors.exit_code_for(caught.value) == 69


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_copy_of_the_program_does_not_hold_the_agents_input_open(tmp_path: Path) -> None:
    # A program forks (a multiprocessing pool, a prefork server) while a run feeds its agent a
    # prompt.  The copy inherited the write end of the agent's stdin, so the agent never saw
    # the end of its input until the copy exited: the run waited as long as the worker lived.
    path = script(tmp_path, "late-reader.sh",
                  "touch started\nwhile [ ! -e go ]; do sleep 0.02; done\nwc -c\n")
    prompt = "x" * 2_000_000  # far more than a pipe holds: still being fed at the fork
    outcome: dict[str, object] = {}
    with agent_for(path, tmp_path) as agent:
        runner = threading.Thread(target=lambda: outcome.update(result=agent.run(prompt, timeout=120)))
        runner.start()
        for _ in range(3000):
            if (tmp_path / "started").exists():
                break
            time.sleep(0.01)
        worker = os.fork()
        if worker == 0:  # the worker lives on, never touching the SDK
            try:
                time.sleep(300)
            finally:
                os._exit(0)
        try:
            (tmp_path / "go").touch()
            runner.join(90)
            finished = not runner.is_alive()
            worker_alive = os.waitpid(worker, os.WNOHANG) == (0, 0)
        finally:
            os.kill(worker, signal.SIGKILL)
            os.waitpid(worker, 0)
            runner.join()
    assert finished and worker_alive  # the run ended while the worker still lived
    result = outcome["result"]
    assert isinstance(result, adaptor.Result) and result.text.strip() == str(len(prompt))


_EXIT_STATUS_REAPED_ELSEWHERE = """
import signal, sys
import adaptor
from adaptor.drivers import command

# SIGCHLD ignored: the kernel reaps every child at once, and nobody can read its status.
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
with adaptor.Agent(command.Driver(command.Config(sys.argv[1])), workspace=sys.argv[2]) as agent:
    try:
        result = agent.run("go")
    except adaptor.AgentFailedError as exc:
        print("failed:", exc)
    else:
        print("succeeded:", result.text)
"""


def test_an_exit_status_something_else_reaped_is_never_a_success(tmp_path: Path) -> None:
    # With SIGCHLD ignored (or a handler or asyncio child watcher reaping every child), the
    # agent's status is gone before the run looks; subprocess takes it for exit code 0, and
    # a failed agent passed for a successful one.
    path = script(tmp_path, "fails.sh", "cat >/dev/null\necho partial\nexit 3\n")
    shown = subprocess.run(
        [sys.executable, "-c", _EXIT_STATUS_REAPED_ELSEWHERE, path, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert shown.stdout.startswith("failed:"), shown
    assert "exit status unknown: something else in this program reaped the process" in shown.stdout


def _stop_on_sigterm() -> None:
    # The pool initializer docs/sdk.md gives: SIGTERM (Pool.terminate) ends the worker through
    # SystemExit, which cancels its runs, instead of killing it with its agents left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _run_long(path: str, workspace: str, marker: str) -> str:
    agent = adaptor.Agent(command.Driver(command.Config(path, env={"MARK": marker})), workspace=workspace)
    return agent.run("go").text


def test_pool_workers_terminated_mid_run_stop_their_agents_with_the_documented_initializer(
    tmp_path: Path,
) -> None:
    path = script(tmp_path, "long.sh", "cat >/dev/null\nsleep 60\n")
    marker = secrets.token_hex(8)
    with multiprocessing.get_context("fork").Pool(2, initializer=_stop_on_sigterm) as pool:
        for _ in range(2):
            pool.apply_async(_run_long, (path, str(tmp_path), marker))
        for _ in range(3000):  # both agents up (a shell and its sleep each)
            if len(processes_with_env("MARK", marker)) >= 4:
                break
            time.sleep(0.01)
        assert len(processes_with_env("MARK", marker)) >= 4
    # Leaving the block terminated the pool (SIGTERM to each worker).
    for _ in range(300):
        if not processes_with_env("MARK", marker):
            break
        time.sleep(0.1)
    assert processes_with_env("MARK", marker) == []


_AS_PID_ONE = """
import os, sys, time
import adaptor
from adaptor.drivers import command

assert os.getpid() == 1, os.getpid()
agent = adaptor.Agent(command.Driver(command.Config(sys.argv[1])), workspace=sys.argv[2])
for _ in range(5):
    assert agent.run("go").text.strip() == "done"
time.sleep(1)  # every background job those runs left has ended
assert agent.run("go").text.strip() == "done"
states = [open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
          for pid in os.listdir("/proc") if pid.isdigit() and pid != "1"]
print(states.count("Z"))
"""


def test_as_pid_1_the_processes_agents_leave_behind_are_reaped(tmp_path: Path) -> None:
    # `docker run ... adaptord serve` with no init: the program is PID 1, the processes its
    # agents leave behind (a background job) are re-parented to it, and nobody reaped them:
    # two zombies per run piled up against the container's pids.max.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a PID namespace")
    path = script(tmp_path, "background.sh", "cat >/dev/null\n(sleep 0.2 &)\necho done\n")
    shown = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _AS_PID_ONE, path, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    if shown.returncode != 0 and shown.stderr.startswith("unshare:"):
        pytest.skip(f"no PID namespace here: {shown.stderr.strip()}")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "0"


_AS_PID_ONE_WITHOUT_PROC = """
import os, sys
import adaptor
from adaptor import _procfs
from adaptor.drivers import command

assert os.getpid() == 1 and not _procfs.usable()
agent = adaptor.Agent(command.Driver(command.Config(sys.argv[1], grace_period=300)), workspace=sys.argv[2])
for _ in range(3):
    print(agent.run("go").text.strip(), flush=True)
"""


def test_as_pid_1_without_a_proc_of_its_own_a_run_ends_with_its_group(tmp_path: Path) -> None:
    # `unshare --pid --fork` without --mount-proc (a container whose /proc is the host's): the
    # agent's background job, re-parented to PID 1 as it ended, stayed a zombie in the agent's
    # group; with no /proc of its own namespace to tell a zombie, the run took the group for
    # alive and waited out its whole grace period (300 s here) before it ended.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a PID namespace")
    path = script(tmp_path, "background.sh", "cat >/dev/null\n(sleep 0.2 &)\necho done\n")
    try:
        shown = subprocess.run(
            ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", _AS_PID_ONE_WITHOUT_PROC,
             path, str(tmp_path)],
            capture_output=True, text=True, timeout=120,
        )
    except subprocess.TimeoutExpired as stuck:
        raise AssertionError(f"the runs waited out their grace period; said: {stuck.stdout!r}") from None
    if shown.returncode != 0 and shown.stderr.startswith("unshare:"):
        pytest.skip(f"no PID namespace here: {shown.stderr.strip()}")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["done", "done", "done"]


_INTERRUPTED_TWICE = """
import os, sys
import adaptor
from adaptor.drivers import command

agent = adaptor.Agent(command.Driver(command.Config(sys.argv[1], grace_period=120)), workspace=sys.argv[2])
try:
    agent.run("go")
except KeyboardInterrupt:
    pid = int(open(os.path.join(sys.argv[2], "pid")).read())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        print("agent gone", flush=True)
    else:
        print("agent still running", flush=True)
        os.kill(pid, 9)
"""


def test_a_second_ctrl_c_while_run_waits_for_its_cancelled_agent_kills_the_agent(tmp_path: Path) -> None:
    # The first Ctrl-C cancels the run and run() waits for its agent to stop; an agent that
    # takes its SIGTERM for a note and goes on was given its whole grace period (120 s here)
    # even after a second Ctrl-C: the program went on (or exited) with its agent running.
    path = script(tmp_path, "stubborn.sh", (
        'trap \'echo term > "$PWD/term"\' TERM\n'
        'echo $$ > "$PWD/pid.tmp" && mv "$PWD/pid.tmp" "$PWD/pid"\n'
        'cat >/dev/null\n'
        'while :; do sleep 0.05; done\n'
    ))
    program = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_TWICE, path, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        for signalled in (tmp_path / "pid", tmp_path / "term"):  # running; then cancelled, and stubborn
            for _ in range(3000):
                if signalled.exists():
                    break
                assert program.poll() is None, program.communicate()
                time.sleep(0.01)
            program.send_signal(signal.SIGINT)
        said, errors_said = program.communicate(timeout=60)
    finally:
        program.kill()
        program.wait()
    assert said == "agent gone\n", errors_said

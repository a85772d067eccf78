"""The shared runner (adaptor.drivers._process): lines, raw bytes, stdin, process groups."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adaptor.driver import Request
from adaptor.drivers import _process, claude, codex
from adaptor.drivers._process import CannotStart, Child, Spec
from adaptor.events import ProcessInfo
from adaptor.testing import RecordingSink
from tests.drivers.conftest import group_members

FakeExe = Callable[[str, str], str]

# A leader that ignores SIGTERM and starts a grandchild (same group) that ignores it too; both
# would outlive a run whose runner killed only the leader.
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.1)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def _spec(argv: list[str], **changes: object) -> Spec:
    env, names = _process.child_env({"ADAPTOR_TEST_SECRET": "s3cret-value"})
    fields: dict[str, object] = {"argv": argv, "env": env, "env_names": names,
                                 "grace_period": 0.5}
    fields.update(changes)
    return Spec(**fields)  # type: ignore[arg-type]


def _drain(child: Child, sink: RecordingSink) -> list[tuple[str, bytes, bool]]:
    return [(line.stream, line.data, line.partial) for line in child.lines(sink)]


def test_lines_raw_bytes_and_events(fake_exe: FakeExe) -> None:
    exe = fake_exe("talker", """
        import sys
        sys.stdout.write("one\\n{\\"a\\": 1}\\r\\n")
        sys.stdout.flush()
        sys.stderr.write("warn\\n")
        sys.stderr.flush()
        sys.stdout.write("tail without newline")
    """)
    sink = RecordingSink()
    child = Child.start(_spec([exe, "--flag"]), sink)
    lines = _drain(child, sink)
    exit_ = child.finish()
    assert exit_.exit_code == 0 and exit_.signal is None and exit_.clean
    assert ("stdout", b"one", False) in lines
    assert ("stdout", b'{"a": 1}', False) in lines
    assert ("stdout", b"tail without newline", True) in lines
    assert ("stderr", b"warn", False) in lines
    stdout, stderr = child.take_raw()
    # Parsers get lines without their \r\n; the raw streams keep every byte (drivers.md).
    assert stdout == 'one\n{"a": 1}\r\ntail without newline' and stderr == "warn\n"
    spawn = [e for e in sink.events if isinstance(e, ProcessInfo) and e.kind == "spawn"]
    assert len(spawn) == 1
    assert spawn[0].data["argv"] == [exe, "--flag"]
    assert spawn[0].data["env"] == ["ADAPTOR_TEST_SECRET"]
    assert "s3cret-value" not in repr(sink.payloads)  # names only, never values
    chunks = "".join(e.text for e in sink.events if isinstance(e, ProcessInfo) and e.kind == "stdout")
    assert chunks == stdout
    assert "warn" in "".join(e.text for e in sink.events if isinstance(e, ProcessInfo) and e.kind == "stderr")


def test_a_long_line_arriving_in_many_reads_is_joined_once(
    fake_exe: FakeExe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16-byte reads cut a 4 MiB line into 262,144 chunks.  Re-joining and re-splitting the
    # pending line per chunk (as the pump once did) copies and scans it quadratically: about
    # 4 minutes here while holding the GIL, against under a second for joining it once.
    monkeypatch.setattr(_process, "_READ_SIZE", 16)
    exe = fake_exe("long-line", """
        import sys
        write = sys.stdout.buffer.write
        for _ in range(1024):
            write(b"x" * 4096)
        write(b"\\r\\nnext\\n" + b"tail" * 100)
    """)
    sink = RecordingSink()
    child = Child.start(_spec([exe]), sink)
    lines: list[tuple[str, bytes, bool]] = []
    drain = threading.Thread(target=lambda: lines.extend(_drain(child, sink)), daemon=True)
    drain.start()
    drain.join(timeout=60)
    if drain.is_alive():
        child.terminate()
        pytest.fail("a 4 MiB line in 16-byte reads was not through after 60 s")
    assert child.finish().exit_code == 0
    assert lines == [
        ("stdout", b"x" * (4 << 20), False),
        ("stdout", b"next", False),
        ("stdout", b"tail" * 100, True),
    ]


def test_a_child_printing_faster_than_its_driver_reads_waits_and_loses_nothing(
    fake_exe: FakeExe, tmp_path: Path
) -> None:
    # 64 MiB of 1 KiB lines that nobody reads for a while.  The pump once queued all of it in
    # memory (and after a deadline the driver still parsed the whole backlog); now it stops
    # reading at about 2 MiB, the pipe fills and the child waits in its write.
    progress = tmp_path / "written"
    exe = fake_exe("flood", f"""
        import os, sys
        line = b"y" * 1023 + b"\\n"
        for n in range(1, 65537):
            sys.stdout.buffer.write(line)
            if n % 64 == 0:
                sys.stdout.flush()
                with open({str(progress)!r} + ".tmp", "w") as f:
                    f.write(str(n))
                os.replace({str(progress)!r} + ".tmp", {str(progress)!r})
    """)
    sink = RecordingSink()
    child = Child.start(_spec([exe]), sink)
    try:
        seen, still = "", 0
        for _ in range(600):  # the child stalls (or, unbounded, finishes) well within a minute
            time.sleep(0.1)
            now = progress.read_text() if progress.exists() else ""
            still = still + 1 if now == seen else 0
            seen = now
            if still >= 10 or not child.alive:
                break
        assert seen and int(seen) <= 3 * 1024, f"the child wrote {seen} lines that nobody read"
        assert child.alive
        lines = _drain(child, sink)
    finally:
        child.terminate()
        child.finish()
    assert len(lines) == 65536 and set(lines) == {("stdout", b"y" * 1023, False)}


def test_a_child_held_up_by_a_full_backlog_is_not_quiet(fake_exe: FakeExe) -> None:
    # 3 MiB on stderr, then a line on stdout: with the backlog full of stderr the stdout line
    # stays unread in the pipe, and `quiet` (which claude asks before it reuses a kept process
    # for the next turn) said True, so that line would be read as the next turn's.
    exe = fake_exe("stderr-burst", """
        import sys, time
        sys.stderr.write(("e" * 99 + "\\n") * 30000)
        sys.stderr.flush()
        print("STALE", flush=True)
        time.sleep(60)
    """)
    child = Child.start(_spec([exe], stdin="driven"), RecordingSink())
    try:
        for _ in range(600):
            if not child.quiet:
                break
            time.sleep(0.05)
        assert not child.quiet
        # Read on, the line comes: it was there to be read.
        assert any(line.data == b"STALE" for line in child.lines(RecordingSink()) if line.stream == "stdout")
    finally:
        child.terminate()
        _drain(child, RecordingSink())
        child.finish()


def test_a_child_that_began_a_line_after_its_turn_is_not_quiet(fake_exe: FakeExe) -> None:
    # Bytes without their newline were held by the pump, neither queued nor flagged: `quiet`
    # said True, claude reused the process, and its next turn's first line read
    # "STALE-NO-NEWLINE" glued to it.
    exe = fake_exe("half-line", """
        import sys
        sys.stdout.write("TERMINAL\\nSTALE-NO-NEWLINE")
        sys.stdout.flush()
        sys.stdin.read()
    """)
    child = Child.start(_spec([exe], stdin="driven"), RecordingSink())
    try:
        assert next(child.lines(RecordingSink())).data == b"TERMINAL"
        for _ in range(600):
            if not child.quiet:
                break
            time.sleep(0.05)
        assert not child.quiet
    finally:
        child.close_stdin()
        lines = _drain(child, RecordingSink())
        child.finish()
    assert lines == [("stdout", b"STALE-NO-NEWLINE", True)]


def test_stdin_is_closed_or_fed(fake_exe: FakeExe) -> None:
    exe = fake_exe("cat", "import sys\nprint(repr(sys.stdin.read()))\n")
    for stdin, expected in (("closed", b"''"), (b"the prompt", b"'the prompt'")):
        sink = RecordingSink()
        child = Child.start(_spec([exe], stdin=stdin), sink)
        assert [line.data for line in child.lines(sink)] == [expected]
        assert child.finish().exit_code == 0


@pytest.mark.parametrize("capacity", [None, 1 << 20])
def test_a_childs_stdout_pipe_holds_what_its_spec_asks(fake_exe: FakeExe, capacity: int | None) -> None:
    # Gemini CLI 0.61.0 echoes the prompt and exits with what did not fit in the pipe still
    # queued, which is lost: a prompt of a few hundred KB failed as "a malformed stream".  The
    # child asks after reading the prompt, which the runner feeds only once the pipe is set.
    exe = fake_exe("pipe-size", "import fcntl, sys\nsys.stdin.read()\n"
                                "print(fcntl.fcntl(1, fcntl.F_GETPIPE_SZ))\n")
    with open("/proc/sys/fs/pipe-max-size") as f:
        allowed = int(f.read())
    expected = 64 * 1024 if capacity is None else capacity
    if os.geteuid() != 0:
        expected = min(expected, allowed)
    sink = RecordingSink()
    child = Child.start(_spec([exe], stdin=b"the prompt", stdout_capacity=capacity), sink)
    assert [line.data for line in child.lines(sink)] == [str(expected).encode()]
    assert child.finish().exit_code == 0


# Said after "not found on PATH": a daemon's PATH is seldom the shell's that found the binary.
_WHOSE_PATH = (" (the PATH of the process that starts it, which a service's or a daemon's may not share with your "
               "shell: give the driver's command as the binary's full path)")


def test_binary_not_found_is_an_infrastructure_failure(tmp_path: object) -> None:
    with pytest.raises(CannotStart) as caught:
        Child.start(_spec(["adaptor-no-such-binary"]), RecordingSink())
    assert str(caught.value) == "adaptor-no-such-binary not found on PATH" + _WHOSE_PATH
    for module in (claude, codex):
        driver = module.Driver(module.Config(command="adaptor-no-such-binary"))
        response = driver.run(Request(run_id="r", prompt="hi"), RecordingSink())
        assert response.exit_code is None and response.checkpoint is None
        assert response.failure is not None
        assert response.failure.code == "infrastructure_error"
        assert response.failure.message == "adaptor-no-such-binary not found on PATH" + _WHOSE_PATH
        assert dict(response.failure.details) == {"kind": "binary_not_found",
                                                  "binary": "adaptor-no-such-binary"}


def test_a_working_directory_that_cannot_be_used_says_why(tmp_path: Path) -> None:
    # A file as the working directory raised a bare NotADirectoryError ("execution failed").
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for cwd, why in ((a_file, "is not a directory"), (tmp_path / "gone", "does not exist")):
        with pytest.raises(CannotStart) as caught:
            Child.start(_spec(["/bin/cat"], cwd=str(cwd)), RecordingSink())
        assert str(caught.value) == f"/bin/cat: working directory {cwd} {why}"
        # Not the binary's fault: told apart in the failure's details (and so in its exit).
        assert caught.value.details == {"kind": "workspace_unusable", "workspace": str(cwd)}
    # A missing binary in a good directory is still the binary's problem.
    with pytest.raises(CannotStart, match="adaptor-no-such-binary not found on PATH"):
        Child.start(_spec(["adaptor-no-such-binary"], cwd=str(tmp_path)), RecordingSink())


def test_a_missing_binary_named_by_its_path_is_not_said_to_be_missing_from_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "bin" / "claude")
    with pytest.raises(CannotStart) as caught:
        Child.start(_spec([missing]), RecordingSink())
    assert str(caught.value) == f"{missing}: no such file"
    assert caught.value.details == {"kind": "binary_not_found", "binary": missing}


@pytest.mark.parametrize("trigger", ["cancel", "deadline"])
def test_cancel_and_deadline_kill_the_whole_group(fake_exe: FakeExe, trigger: str) -> None:
    exe = fake_exe("stubborn", STUBBORN)
    sink = RecordingSink()
    child = Child.start(_spec([exe]), sink)
    deadline = time.monotonic() + 0.5 if trigger == "deadline" else None
    with child.watch(sink.cancelled, deadline):
        if trigger == "cancel":
            threading.Timer(0.5, sink.cancelled.set).start()
        lines = _drain(child, sink)
        exit_ = child.finish()
    assert ("stdout", b"ready", False) in lines
    # SIGTERM is ignored by both and they never end on their own: only SIGKILL, after the
    # 0.5 s grace, ends them.
    assert exit_.signal == signal.SIGKILL and exit_.exit_code is None
    assert exit_.timed_out is (trigger == "deadline")
    assert exit_.cancelled is (trigger == "cancel")
    assert group_members(child.pid) == []


def test_leftover_grandchild_is_reaped_after_a_normal_exit(fake_exe: FakeExe) -> None:
    # The grandchild keeps stdout open: without the group stop the reader would never see EOF.
    exe = fake_exe("leaver", """
        import os, signal, time
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
        print("bye", flush=True)
    """)
    sink = RecordingSink()
    child = Child.start(_spec([exe]), sink)
    lines = _drain(child, sink)
    exit_ = child.finish()
    # A grandchild left to finish its sleep would have printed a second "bye".
    assert lines == [("stdout", b"bye", False)]
    assert exit_.exit_code == 0
    assert group_members(child.pid) == []


def test_driven_stdin_round_trip(fake_exe: FakeExe) -> None:
    exe = fake_exe("echo", """
        import sys
        for line in sys.stdin:
            print("got " + line.strip(), flush=True)
    """)
    sink = RecordingSink()
    child = Child.start(_spec([exe], stdin="driven"), sink)
    lines = child.lines(sink)
    assert child.send(b"a\n")
    assert next(lines).data == b"got a"
    assert child.send(b"b\n")
    assert next(lines).data == b"got b"
    child.close_stdin()
    assert not child.send(b"late\n")
    assert list(lines) == []
    assert child.finish().exit_code == 0


def test_no_zombie_left(fake_exe: FakeExe) -> None:
    exe = fake_exe("quick", "print('x')\n")
    sink = RecordingSink()
    child = Child.start(_spec([exe]), sink)
    _drain(child, sink)
    child.finish()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # already reaped: not our child any more


_KEEP_AT_THE_TASK_LIMIT = """
import os, sys
from adaptor.drivers import claude
from adaptor.drivers._process import Child, Spec
from adaptor.testing import RecordingSink

env = {"PATH": os.environ["PATH"]}
child = Child.start(Spec(argv=["/bin/cat"], env=env, env_names=[], stdin="driven"), RecordingSink())
live = claude._Live(child, sys.argv[1], "signature")
live.session_id = "s1"
live.turn = "t1"  # the saved turn it made (see claude._TURN_KEY): it would fit
pool = claude._Pool()
print(child.pid, flush=True)
sys.stdin.readline()  # capped: no evictor thread can start
pool.put(live, 60.0)
print("kept" if pool.take("s1", "signature", "t1") is live else "not kept", child.alive, flush=True)
"""


def test_a_process_that_nothing_could_evict_is_not_kept(tmp_path: Path) -> None:
    from tests.task_limit import HeldChild

    private = tmp_path / "private"
    private.mkdir()
    with HeldChild(_KEEP_AT_THE_TASK_LIMIT, str(private)) as host:
        cat = int(host.first_line)
        assert host.limit is not None
        host.limit.cap()
        assert host.step() == b"not kept False\n"
        assert not private.exists()  # the kept process's files went with it
        assert not os.path.exists(f"/proc/{cat}") or "Z" in Path(f"/proc/{cat}/stat").read_text().split()[2]

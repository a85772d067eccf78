"""What a killed daemon leaves behind never gets in the next one's way.

Its agents, still running, are stopped before anything runs again; the thread leases it held
end with it instead of blocking their threads until the TTL runs out; its temporary files
(some hold secrets) are removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adaptor import _home, _procfs, events
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess, identities, marked_processes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.isdir("/proc/self"), reason="leftover agents are found in /proc"
    ),
]


def _wait_until(condition: object, timeout: float = 30.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    yield path
    for pid in marked_processes(path):  # whatever a failed test left behind
        os.kill(pid, signal.SIGKILL)


def _lifecycle_phases(home: Path) -> list[str]:
    recorder = sr.EventRecorder(
        sr.JSONLEventBackend(home / "events"), key_validator=lambda key: None
    )
    phases = []
    for record in recorder.iter_since(_home.DAEMON_SESSION):
        assert isinstance(record.event, events.Notice)
        phases.append(str(record.event.data["phase"]))
    recorder.close()
    return phases


@pytest.mark.parametrize("restart_via", ["the same path", "a symlink"])
def test_a_killed_daemons_agents_are_stopped_before_the_request_runs_again(
    home: Path, tmp_path: Path, restart_via: str
) -> None:
    once = tmp_path / "first-attempt"
    # The first attempt leaves a child and a grandchild running; the second one answers.
    script = f'if [ -e "{once}" ]; then echo second attempt; else touch "{once}"; sleep 300 & sleep 301; fi'
    request = {
        "driver": "command",
        "prompt": "go",
        "config": {"command": "/bin/sh", "extra_args": ["-c", script]},
        "on_interrupt": "requeue",
    }
    daemon = DaemonProcess(home, "--grace", "5").start()
    rid = daemon.submit(request)
    _wait_until(lambda: len(marked_processes(home)) == 3)  # sh, sleep 300, sleep 301
    first = identities(marked_processes(home))
    # The line is printed once the fact is in the lifecycle log, which a kill would lose.
    daemon.wait_for_line(f"request.started id={rid}")
    daemon.kill9()
    assert identities([pid for pid, _ in first]) == first  # the kill alone leaves them running

    again = home
    if restart_via == "a symlink":
        again = tmp_path / "same-home"
        again.symlink_to(home)
    daemon = DaemonProcess(again, "--grace", "5").start()
    line = daemon.wait_for_line("leftovers.stopped")
    assert "processes=3" in line and "killed=0" in line
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["text"] == "second attempt"
    assert not identities([pid for pid, _ in first]) & first
    assert daemon.stop() == 0
    assert marked_processes(home) == []
    phases = _lifecycle_phases(home)
    # Stopped before the interrupted request was looked at again, let alone started.
    assert phases.index("leftovers.stopped") < phases.index("request.interrupted")
    assert phases.count("request.started") == 2


_IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"


def test_only_this_homes_processes_are_stopped_and_one_ignoring_sigterm_is_killed(
    home: Path,
) -> None:
    mine = {**os.environ, "ADAPTORD_OWNER": os.path.realpath(home)}
    other = {**os.environ, "ADAPTORD_OWNER": os.path.realpath(home) + "-other"}
    leader = subprocess.Popen(["sleep", "300"], env=mine, start_new_session=True)
    stubborn = subprocess.Popen(
        [sys.executable, "-c", _IGNORE_TERM],
        env=mine,
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    # Not leading a group: in this test's own group, which must not be signalled.
    member = subprocess.Popen(["sleep", "300"], env=mine)
    unrelated = subprocess.Popen(["sleep", "300"], env=other, start_new_session=True)
    try:
        # 2 s: time enough for the others to end on SIGTERM, however loaded the machine.
        daemon = DaemonProcess(home, "--grace", "2").start()
        line = daemon.wait_for_line("leftovers.stopped")
        assert "processes=3" in line and "killed=1" in line
        assert leader.wait(timeout=30) == -signal.SIGTERM
        assert stubborn.wait(timeout=30) == -signal.SIGKILL
        assert member.wait(timeout=30) == -signal.SIGTERM
        assert unrelated.poll() is None
        assert daemon.stop() == 0
    finally:
        for proc in (leader, stubborn, member, unrelated):
            proc.kill()
            proc.wait(timeout=30)
        if stubborn.stdout is not None:
            stubborn.stdout.close()


def test_a_leftover_that_keeps_forking_copies_of_itself_is_stopped(home: Path, tmp_path: Path) -> None:
    # Processes a killed daemon left that fork a copy of themselves and exit every few
    # milliseconds (each in a session of its own, deaf to SIGTERM) outlived the next start's
    # stop: it signalled the processes one look had found, each gone by then.
    beat = tmp_path / "beat"
    hopper = str(Path(__file__).resolve().parent / "hopper.py")
    env = {**os.environ, "ADAPTORD_OWNER": os.path.realpath(home), "HOPPER_WIDTH": "3", "HOPPER_LIFE": "60",
           "HOPPER_BEAT": str(beat)}
    assert subprocess.run([sys.executable, hopper], env=env, capture_output=True, timeout=60).stdout == b"started\n"
    daemon = DaemonProcess(home, "--grace", "1").start()
    try:
        line = daemon.wait_for_line("leftovers.stopped")
        assert "killed=0" not in line, line
        last = beat.stat().st_mtime_ns
        time.sleep(0.5)
        assert beat.stat().st_mtime_ns == last, "still hopping"
    finally:
        assert daemon.stop() == 0


_HIDDEN_MEMBER = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(300)"
)


def test_a_group_is_killed_even_after_its_marked_leader_ended(home: Path) -> None:
    # The leader ends on SIGTERM; a member that cleared its environment (so carries no mark)
    # ignores it, and only the SIGKILL to the group, sent once the leader is gone, reaches it.
    mine = {**os.environ, "ADAPTORD_OWNER": os.path.realpath(home)}
    script = f"env -i {sys.executable} -c {shlex.quote(_HIDDEN_MEMBER)} & wait"
    leader = subprocess.Popen(
        ["/bin/sh", "-c", script], env=mine, start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert leader.stdout is not None
        member = identities([int(leader.stdout.readline())])
        assert len(member) == 1
        daemon = DaemonProcess(home, "--grace", "2").start()
        line = daemon.wait_for_line("leftovers.stopped")
        assert "processes=1" in line and "killed=1" in line
        assert leader.wait(timeout=30) == -signal.SIGTERM
        assert not identities([pid for pid, _ in member]) & member
        assert daemon.stop() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(timeout=30)
        if leader.stdout is not None:
            leader.stdout.close()


def test_a_start_with_nothing_left_over_records_nothing(home: Path) -> None:
    daemon = DaemonProcess(home).start()
    assert daemon.stop() == 0
    assert "leftovers.stopped" not in _lifecycle_phases(home)


def test_a_killed_daemons_thread_leases_end_with_it(home: Path) -> None:
    thread = {"key": "the thread"}
    steps = [{"text": "working"}, {"sleep": 60}]
    config = {"steps": steps, "session": "auto"}
    daemon = DaemonProcess(home, "--grace", "5").start()
    rid = daemon.submit(
        {
            "driver": "script",
            "prompt": "x",
            "thread": thread,
            "config": config,
            "on_interrupt": "requeue",
        }
    )
    daemon.wait_for_line(f"request.started id={rid}")
    daemon.kill9()  # holding the thread's lease, for five minutes by its TTL

    daemon = DaemonProcess(home, "--grace", "5").start()
    # The turn is not run again (its agent had the prompt: see docs/daemon.md), and the next
    # turn gets the thread at once rather than ThreadBusyError.
    assert daemon.verdict(rid)["error"]["details"]["thread_turn"] is True
    then = daemon.submit(
        {
            "driver": "script",
            "prompt": "x",
            "thread": thread,
            "config": {"steps": [{"text": "next"}], "session": "auto"},
        }
    )
    verdict = daemon.verdict(then)
    assert verdict["ok"], verdict["error"]
    assert daemon.stop() == 0


def _files_holding(text: str, *folders: Path) -> list[Path]:
    """The files under ``folders`` (links not followed) whose content holds ``text``."""
    found = []
    for folder in folders:
        for parent, _, names in os.walk(folder):
            for name in names:
                path = Path(parent, name)
                with contextlib.suppress(OSError):
                    if not path.is_symlink() and text.encode() in path.read_bytes():
                        found.append(path)
    return found


def test_a_killed_daemons_temporary_files_are_removed_once_its_agents_are_stopped(
    home: Path,
) -> None:
    # A run's private folder (here its skills; a claude or codex run's MCP config, or the env
    # file of its MCP servers' secrets) outlived a kill -9 in the system's temporary directory.
    marker = secrets.token_hex(16)
    private = home / "tmp"
    runs_in_system_tmp = os.path.join(tempfile.gettempdir(), "adaptor-private-run-*")
    before = set(glob.glob(runs_in_system_tmp))  # other tests' (the marker is in none of them)
    daemon = DaemonProcess(home, "--workers", "2", "--grace", "5").start()
    sleeper = {"command": "/bin/sh", "extra_args": ["-c", "sleep 300"]}
    agent = daemon.submit({"driver": "command", "prompt": "go", "config": sleeper})
    run = daemon.submit(
        {
            "driver": "script",
            "prompt": "go",
            "skills": [{"key": "notes", "inline": f"# Notes\n\n{marker}\n"}],
            "config": {"steps": [{"sleep": 300}]},
        }
    )
    for rid in (agent, run):
        daemon.wait_for_line(f"request.started id={rid}")
    _wait_until(lambda: marked_processes(home))

    def everywhere() -> list[Path]:
        fresh = sorted(set(glob.glob(runs_in_system_tmp)) - before)
        return _files_holding(marker, private, *map(Path, fresh))

    _wait_until(everywhere)
    made = everywhere()
    daemon.kill9()
    assert everywhere() == made

    daemon = DaemonProcess(home, "--grace", "5").start()  # ready: the clean-up is done
    assert everywhere() == []
    assert all(path.is_relative_to(private) for path in made), made  # never in /tmp
    line = daemon.wait_for_line("tmp.cleared")
    assert "removed=1" in line and "failed" not in line
    assert list(private.iterdir()) == []
    assert daemon.stop() == 0
    phases = _lifecycle_phases(home)
    # Removed only once the agents that may still read them were stopped.
    assert phases.index("leftovers.stopped") < phases.index("tmp.cleared")


def test_the_temporary_files_of_another_home_and_what_a_link_points_at_are_left_alone(
    home: Path, tmp_path: Path
) -> None:
    private = home / "tmp"
    other = DaemonProcess(tmp_path / "other-home").start()
    theirs = tmp_path / "other-home" / "tmp" / "adaptor-private-run-theirs"
    theirs.mkdir(parents=True, exist_ok=True)
    (theirs / "secret").write_text("theirs")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("kept")
    daemon = DaemonProcess(home).start()
    assert daemon.stop() == 0
    assert private.is_dir() and stat.S_IMODE(private.lstat().st_mode) == 0o700  # with the others
    # Leftovers of a daemon of this home: a folder, a file, and links to what is not its own.
    (private / "adaptor-private-claude-left").mkdir()
    (private / "adaptor-private-claude-left" / "mcp.json").write_text("{}")
    (private / "adaptor-private-claude-left" / "link").symlink_to(outside)
    (private / "stray").write_text("x")
    (private / "link").symlink_to(outside)
    daemon = DaemonProcess(home).start()
    assert "removed=3" in daemon.wait_for_line("tmp.cleared")
    assert list(private.iterdir()) == []
    assert (outside / "kept").read_text() == "kept"
    assert (theirs / "secret").read_text() == "theirs"
    assert daemon.stop() == 0
    assert other.stop() == 0

    # A link at the folder's own name: the home is refused, nothing is removed through it.
    shutil.rmtree(private)
    private.symlink_to(outside)
    refused = DaemonProcess(home)
    refused.start(wait_ready=False)
    assert refused.wait_exit() == 2
    assert any("tmp is a symbolic link" in line for line in refused.lines)
    assert (outside / "kept").read_text() == "kept"


# --- PID namespaces: a container restarted on the same home -------------------------------------


def _pid_namespaces_or_skip() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for PID namespaces")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here: {probe.stderr.strip()}")


def _in_a_new_pid_namespace(*, under: str | None) -> list[str]:
    """The prefix that starts the daemon in a PID namespace of its own, as a container does:
    as its first process (``under=None``, a container without init), or as the child of
    ``under`` (a shell command, run through ``sh -c``: the container's init).  The namespace
    ends, and every process in it, when ``unshare`` is killed."""
    new = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if under is None:
        return new
    return [*new, "/bin/sh", "-c", f'"$@" & {under}', "sh"]


def _children(parent: int) -> list[int]:
    found = []
    for pid in _procfs.pids():
        stat = _procfs.stat(pid)
        if stat is not None and stat.ppid == parent and not stat.zombie:
            found.append(pid)
    return found


def _daemon_pid(daemon: DaemonProcess) -> int:
    """The daemon's pid (here, outside its namespace): the process running ``adaptord serve``
    under the daemon's ``unshare``."""
    assert daemon.proc is not None
    wanted = ["-m", "adaptord", "serve", "--home", str(daemon.home.root)]
    pending = [daemon.proc.pid]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if argv[1:6] == wanted:
                return pid
        pending += _children(pid)
    raise AssertionError("the daemon's process was not found")


def _first_attempt_stays(tmp_path: Path) -> dict[str, object]:
    """A request to run again after a crash whose first attempt leaves a child and a grandchild
    working; a second attempt answers."""
    once = tmp_path / "first-attempt"
    script = f'if [ -e "{once}" ]; then echo second attempt; else touch "{once}"; sleep 300 & sleep 301; fi'
    return {
        "driver": "command",
        "prompt": "go",
        "config": {"command": "/bin/sh", "extra_args": ["-c", script]},
        "on_interrupt": "requeue",
    }


def _kill9_in_its_namespace(daemon: DaemonProcess) -> None:
    """``kill -9`` of the daemon alone: its namespace (and so its agents) lives on when it has
    an init of its own, ends with it when the daemon was its first process."""
    pid = _daemon_pid(daemon)
    start = _procfs.stat(pid)
    assert start is not None
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not _procfs.running(pid, start.start))


def _in_a_container_with_an_init(home: Path) -> DaemonProcess:
    """A daemon started in a PID namespace whose first process (its init) outlives it."""
    _pid_namespaces_or_skip()
    return DaemonProcess(home, "--grace", "5", prefix=_in_a_new_pid_namespace(under="exec sleep 600")).start()


def _killed_mid_run(daemon: DaemonProcess, tmp_path: Path) -> tuple[str, set[tuple[int, int]]]:
    """Submit :func:`_first_attempt_stays`'s request and ``kill -9`` the daemon once its agent
    works: the request's id, and its agent's processes (identities) at the kill."""
    rid = daemon.submit(_first_attempt_stays(tmp_path))
    home = daemon.home.root
    _wait_until(lambda: len(marked_processes(home)) == 3)  # sh, sleep 300, sleep 301
    working = identities(marked_processes(home))
    daemon.wait_for_line(f"request.started id={rid}")
    _kill9_in_its_namespace(daemon)
    return rid, working


def _stop_in_its_namespace(daemon: DaemonProcess) -> int:
    os.kill(_daemon_pid(daemon), signal.SIGTERM)
    return daemon.wait_exit()


def test_a_run_whose_agents_another_pid_namespace_hides_is_not_run_again(home: Path, tmp_path: Path) -> None:
    # A container with an init, its daemon killed with kill -9 (its agents live on in that
    # container); the next container on the same home has a PID namespace of its own, whose
    # /proc does not show them.  The request ran again beside its first attempt's agents.
    first_container = _in_a_container_with_an_init(home)
    try:
        rid, first = _killed_mid_run(first_container, tmp_path)
        assert identities([pid for pid, _ in first]) == first

        second_container = DaemonProcess(home, "--grace", "5", prefix=_in_a_new_pid_namespace(under=None)).start()
        verdict = second_container.verdict(rid)
        assert not verdict["ok"]
        error = verdict["error"]
        assert error["code"] == "RunError" and error["reason"] == "infrastructure_error"
        assert error["details"]["interrupted"] and error["details"]["agents_unseen"]
        assert "ran in another PID namespace" in error["message"]
        assert "may still be running, so it was not run again" in error["message"]
        assert "agents_unseen=True" in second_container.wait_for_line(f"request.interrupted id={rid}")
        assert _stop_in_its_namespace(second_container) == 0
        # Not run a second time beside them, and left to their container.
        assert identities([pid for pid, _ in first]) == first
        assert _lifecycle_phases(home).count("request.started") == 1
    finally:
        first_container.kill_if_running()  # its unshare: the first container ends, agents and all
    _wait_until(lambda: marked_processes(home) == [])


@pytest.mark.parametrize("init", ["none", "docker-init"])
def test_a_run_whose_namespace_ended_with_its_daemon_runs_again_in_the_next_one(
    home: Path, tmp_path: Path, init: str
) -> None:
    # A daemon that was its container's first process, or the one child of an init that ends
    # with it (`docker run --init`'s tini): its kill ended the container, every agent with it.
    _pid_namespaces_or_skip()
    if init == "none":
        prefix = _in_a_new_pid_namespace(under=None)
    else:  # a shell under tini's name, waiting for its one child and exiting with it
        tini = tmp_path / init
        tini.symlink_to("/bin/sh")
        prefix = [*_in_a_new_pid_namespace(under=None), str(tini), "-c", '"$@"; exit $?', init]
    first_container = DaemonProcess(home, "--grace", "5", prefix=prefix).start()
    try:
        rid, _ = _killed_mid_run(first_container, tmp_path)
        _wait_until(lambda: marked_processes(home) == [])  # the kernel ended the namespace
        assert first_container.wait_exit() != 0
    finally:
        first_container.kill_if_running()
    second_container = DaemonProcess(home, "--grace", "5", prefix=_in_a_new_pid_namespace(under=None)).start()
    verdict = second_container.verdict(rid)
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["text"] == "second attempt"
    assert _stop_in_its_namespace(second_container) == 0


def test_a_daemon_on_the_host_stops_what_a_containers_killed_daemon_left(home: Path, tmp_path: Path) -> None:
    # The machine's own PID namespace sees every container's processes: found and stopped.
    container = _in_a_container_with_an_init(home)
    try:
        rid, first = _killed_mid_run(container, tmp_path)
        host = DaemonProcess(home, "--grace", "5").start()
        assert "processes=3" in host.wait_for_line("leftovers.stopped")
        verdict = host.verdict(rid)
        assert verdict["ok"], verdict["error"]
        assert verdict["result"]["text"] == "second attempt"
        assert not identities([pid for pid, _ in first]) & first
        assert host.stop() == 0
    finally:
        container.kill_if_running()

"""The daemon keeps its own threads on one CPU; the agent processes it starts get every CPU.

Read from ``/proc`` (``Cpus_allowed_list`` of each of the daemon's threads, and of the agent
process itself, which reports its own), the way ``taskset -p`` would show a user.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from tests.daemon_harness import DaemonProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="one CPU (or no affinity): there is nothing to narrow",
    ),
]

# The agent: a command whose answer is the CPUs it may run on, as the kernel says.
_REPORT = "#!/bin/sh\nexec grep Cpus_allowed_list /proc/self/status\n"


def _cpu_list(text: str) -> set[int]:
    """``0-2,5`` → {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _thread_cpus(pid: int) -> dict[int, set[int]]:
    """Each thread of ``pid`` (by id) and the CPUs it may run on."""
    found: dict[int, set[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # ended meanwhile
            continue
        allowed = re.search(r"^Cpus_allowed_list:\s*(.*)$", status, re.M)
        assert allowed, status
        found[int(tid)] = _cpu_list(allowed[1])
    return found


def _agent_cpus(daemon: DaemonProcess, report: Path) -> set[int]:
    rid = daemon.submit({"driver": "command", "config": {"command": str(report)}, "prompt": "x"})
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]
    text = verdict["result"]["text"]
    assert text.startswith("Cpus_allowed_list:"), text
    return _cpu_list(text.partition(":")[2])


def _ready_cpu(daemon: DaemonProcess) -> int | None:
    found = re.search(r" cpu=(\d+)", daemon.wait_for_line("adaptord: ready"))
    return int(found[1]) if found else None


def _started_fact(daemon: DaemonProcess) -> dict[str, object]:
    """The data of the daemon's ``daemon.started`` fact in its lifecycle log."""
    for line in (daemon.home.events / "adaptord.jsonl").read_bytes().splitlines():
        data = orjson.loads(line)["event"]["data"]
        if data.get("phase") == "daemon.started":
            return data  # type: ignore[no-any-return]
    raise AssertionError("no daemon.started fact")


def _status_cpu(daemon: DaemonProcess) -> int | None:
    """The CPU ``adaptor status`` and ``adaptord status`` say the threads are kept on (they
    must agree, in their JSON and in the human line)."""
    home = str(daemon.home.root)

    def run(*argv: str) -> str:
        proc = subprocess.run([sys.executable, "-m", *argv, "--home", home], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    cpu = orjson.loads(run("adaptor", "status", "--json"))["result"]["cpu"]
    assert orjson.loads(run("adaptord", "status", "--json"))["cpu"] == cpu
    said = re.search(r"threads on CPU (\d+)", run("adaptor", "status").splitlines()[0])
    assert (int(said[1]) if said else None) == cpu
    return cpu  # type: ignore[no-any-return]


@pytest.fixture
def report(tmp_path: Path) -> Path:
    path = tmp_path / "report-cpus.sh"
    path.write_text(_REPORT)
    path.chmod(0o755)
    return path


def test_the_daemons_threads_share_one_cpu_and_its_agents_get_every_cpu(tmp_path: Path, report: Path) -> None:
    allowed = os.sched_getaffinity(0)
    daemon = DaemonProcess(tmp_path / "home", "--workers", "3").start()
    assert daemon.proc is not None
    cpu = _ready_cpu(daemon)
    assert cpu is not None and cpu in allowed, daemon.lines
    assert _started_fact(daemon)["cpu"] == cpu
    assert _status_cpu(daemon) == cpu  # (adaptord.json and status did not say it)
    # The agent, started by a thread kept on that CPU, may use every CPU the daemon was given.
    assert _agent_cpus(daemon, report) == allowed
    assert _agent_cpus(daemon, report) == allowed  # and again, from a reused run thread
    threads = _thread_cpus(daemon.proc.pid)
    # Every thread (main, workers, the run threads that started the agents, the file watcher's,
    # the lifecycle writer) is on that one CPU, also after starting an agent.
    assert {cpus == {cpu} for cpus in threads.values()} == {True}, threads
    assert len(threads) > 3 + 2, threads  # (Python names none of them for the kernel)
    assert daemon.stop() == 0


def test_one_cpu_false_leaves_the_threads_every_cpu_and_a_reload_switches_it(
    tmp_path: Path, report: Path
) -> None:
    allowed = os.sched_getaffinity(0)
    config = tmp_path / "config.toml"
    config.write_text("one_cpu = false\n")
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config)).start()
    assert daemon.proc is not None
    assert _ready_cpu(daemon) is None, daemon.lines
    assert "cpu" not in _started_fact(daemon)  # (absent, not null)
    assert _status_cpu(daemon) is None
    assert _agent_cpus(daemon, report) == allowed
    assert {frozenset(cpus) for cpus in _thread_cpus(daemon.proc.pid).values()} == {frozenset(allowed)}
    # Applied by a reload (SIGHUP), the threads that exist then and those started later.
    assert "config reloaded" in daemon.reload(config, "one_cpu = true\n")
    placed = {frozenset(cpus) for cpus in _thread_cpus(daemon.proc.pid).values()}
    assert len(placed) == 1 and len(next(iter(placed))) == 1 and next(iter(placed)) <= allowed, placed
    assert {_status_cpu(daemon)} == next(iter(placed))  # as the reload placed them
    assert _agent_cpus(daemon, report) == allowed
    assert {frozenset(cpus) for cpus in _thread_cpus(daemon.proc.pid).values()} == placed
    assert "config reloaded" in daemon.reload(config, "one_cpu = false\n")
    assert {frozenset(cpus) for cpus in _thread_cpus(daemon.proc.pid).values()} == {frozenset(allowed)}
    assert _status_cpu(daemon) is None
    # A value that is not a boolean: the reload is refused, what is in effect stays.
    assert "config reload failed" in daemon.reload(config, 'one_cpu = "yes"\n')
    assert "one_cpu must be true or false" in daemon.lines[-1] or any(
        "one_cpu must be true or false" in line for line in daemon.lines
    )
    assert daemon.stop() == 0


def test_a_daemon_given_fewer_cpus_keeps_to_them_and_so_do_its_agents(tmp_path: Path, report: Path) -> None:
    # As `taskset -c` or systemd's CPUAffinity= would start it: the daemon narrows its threads
    # within what it was given, and its agents get exactly that, never the machine's other CPUs.
    allowed = sorted(os.sched_getaffinity(0))
    given = set(allowed[-2:]) if len(allowed) > 2 else {allowed[-1]}
    daemon = DaemonProcess(tmp_path / "home")
    started: list[BaseException] = []

    def start_narrowed() -> None:
        # Set on this thread only: the daemon started from it inherits it, the test does not.
        os.sched_setaffinity(0, given)
        try:
            daemon.start()
        except BaseException as exc:
            started.append(exc)

    starter = threading.Thread(target=start_narrowed)
    starter.start()
    starter.join()
    if started:
        raise started[0]
    assert daemon.proc is not None
    cpu = _ready_cpu(daemon)
    threads = _thread_cpus(daemon.proc.pid)
    if len(given) == 1:  # nothing to narrow: no pin, and no line claiming one
        assert cpu is None, daemon.lines
        assert {frozenset(cpus) for cpus in threads.values()} == {frozenset(given)}, threads
    else:
        assert cpu in given, daemon.lines
        assert {frozenset(cpus) for cpus in threads.values()} == {frozenset({cpu})}, threads
    assert _agent_cpus(daemon, report) == given
    assert daemon.stop() == 0


_REFUSING = """
import os


def _refused(*args):
    raise PermissionError(1, "Operation not permitted")


os.sched_setaffinity = _refused  # as a seccomp filter answers
"""


def test_a_system_that_refuses_the_narrowing_gets_a_line_and_is_served(tmp_path: Path, report: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_REFUSING)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    daemon = DaemonProcess(tmp_path / "home", env={"PYTHONPATH": path}).start()
    assert daemon.proc is not None
    refused = daemon.wait_for_line("cannot keep the threads on one CPU")
    assert "Operation not permitted" in refused
    assert _ready_cpu(daemon) is None  # no CPU named that the threads were not kept to
    assert "cpu" not in _started_fact(daemon)
    allowed = os.sched_getaffinity(0)
    assert _agent_cpus(daemon, report) == allowed
    assert {frozenset(cpus) for cpus in _thread_cpus(daemon.proc.pid).values()} == {frozenset(allowed)}
    assert daemon.stop() == 0

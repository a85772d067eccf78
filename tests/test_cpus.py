"""``adaptor._cpus``: a host's threads kept on one CPU, the processes it starts given them all.

Each case runs in a Python process of its own: narrowing the threads of the test process
itself would slow every later test of its worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="one CPU (or no affinity): there is nothing to narrow",
)

_HOST = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    import orjson
    import adaptor
    from adaptor import _cpus, _schema_checker
    from adaptor.drivers import command

    def threads():
        return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})

    def cpus_of(pid):
        with open(f"/proc/{pid}/status") as handle:
            line = next(l for l in handle if l.startswith("Cpus_allowed_list:"))
        return line.split(":", 1)[1].strip()

    seen = {"allowed": sorted(os.sched_getaffinity(0))}
    early = threading.Thread(target=threading.Event().wait, daemon=True)  # started before
    early.start()
    seen["cpu"] = _cpus.keep_threads_on_one_cpu()
    later = threading.Thread(target=threading.Event().wait, daemon=True)  # started after
    later.start()
    seen["threads"] = threads()
    # A driver's agent (the one process runner) and the schema checker's child.
    agent = adaptor.Agent(command.Driver(command.Config(command=sys.argv[1])), workspace=sys.argv[2])
    seen["agent"] = agent.run("x").text.split(":", 1)[1].strip()
    checker = _schema_checker._Child()
    seen["checker"] = cpus_of(checker.process.pid)
    checker.kill()
    seen["threads_after_starts"] = threads()
    seen["again"] = _cpus.keep_threads_on_one_cpu()  # a second call keeps the first's set
    seen["agent_again"] = agent.run("x").text.split(":", 1)[1].strip()
    # A host tool's handler (a build, a test run) and what it starts get every CPU too.
    from adaptor import tool
    from adaptor.drivers import script

    def report(_: dict) -> str:
        started = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"],
                                 capture_output=True, text=True, check=True).stdout
        seen["tool_child"] = started.split(":", 1)[1].strip()
        seen["tool_thread"] = cpus_of(f"self/task/{threading.get_native_id()}")
        return "ok"

    steps = script.Config(steps=({"call_tool": {"name": "report", "args": {}}}, {"text": "done"}))
    with adaptor.Agent(script.Driver(steps), tools=[tool.define("report", "reports", report)]) as tooled:
        tooled.run("x")
    seen["threads_after_tool"] = threads()
    _cpus.let_threads_use_every_cpu()
    seen["threads_released"] = threads()
    seen["agent_released"] = agent.run("x").text.split(":", 1)[1].strip()
    agent.close()

    # A placement changed (a daemon's reload) while another thread starts a process: that
    # thread is left alone meanwhile and takes the placement in effect once it is done.
    def mine():
        return cpus_of(f"self/task/{threading.get_native_id()}")

    for narrow_first in (True, False):
        (_cpus.keep_threads_on_one_cpu if narrow_first else _cpus.let_threads_use_every_cpu)()
        inside, changed, found = threading.Event(), threading.Event(), {}

        def starter():
            with _cpus.for_children():
                inside.set()
                changed.wait()
                found["child"] = subprocess.run(["grep", "Cpus_allowed_list", "/proc/self/status"],
                                                capture_output=True, text=True).stdout.split()[-1]
            found["after"] = mine()

        worker = threading.Thread(target=starter)
        worker.start()
        inside.wait()
        (_cpus.let_threads_use_every_cpu if narrow_first else _cpus.keep_threads_on_one_cpu)()
        changed.set()
        worker.join()
        seen[f"race_{'off' if narrow_first else 'on'}"] = [found["child"], found["after"], mine()]
    print(orjson.dumps(seen).decode())
    """
)


def _cpu_set(listed: str) -> set[int]:
    cpus: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _listed(cpus: list[int]) -> str:
    """{0, 1, 2} as the kernel lists it: ``0-2``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][-1] == cpu - 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def test_threads_on_one_cpu_and_what_they_start_on_all(tmp_path: Path) -> None:
    report = tmp_path / "report.sh"
    report.write_text("#!/bin/sh\nexec grep Cpus_allowed_list /proc/self/status\n")
    report.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-c", _HOST, str(report), str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = orjson.loads(done.stdout)
    allowed, cpu = seen["allowed"], seen["cpu"]
    assert cpu in allowed
    # Every thread: those that existed before and those started after.
    assert seen["threads"] == [[cpu]]
    # What the threads start gets every CPU; the threads that started them stay on theirs.
    assert seen["agent"] == seen["checker"] == _listed(allowed)
    assert seen["threads_after_starts"] == [[cpu]]
    assert seen["again"] in allowed and seen["agent_again"] == _listed(allowed)
    assert seen["tool_child"] == seen["tool_thread"] == _listed(allowed)
    assert seen["threads_after_tool"] == [[cpu]]
    assert seen["threads_released"] == [allowed]
    assert seen["agent_released"] == _listed(allowed)
    # Switched off while a process was being started: the child got every CPU, and the
    # starting thread ends up where every thread now is (every CPU).
    assert seen["race_off"] == [_listed(allowed)] * 3
    # Switched on meanwhile: the child still got every CPU, the thread then joins the one CPU.
    child, after, main = seen["race_on"]
    assert child == _listed(allowed) and after == main and len(_cpu_set(main)) == 1


_REFUSED = textwrap.dedent(
    """
    import os, threading
    from adaptor import _cpus

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    os.sched_setaffinity = refuse  # as a seccomp filter would answer
    try:
        _cpus.keep_threads_on_one_cpu()
    except PermissionError:
        print("refused")
    with _cpus.for_children():  # nothing narrowed, nothing to widen (refuse would raise)
        pass
    print(sorted(os.sched_getaffinity(0)))
    """
)


def test_narrowing_refused_by_the_system_raises_and_claims_no_cpu() -> None:
    # A daemon then logs that it cannot and serves unnarrowed, rather than naming a CPU.
    done = subprocess.run(
        [sys.executable, "-c", _REFUSED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["refused", str(sorted(os.sched_getaffinity(0)))]

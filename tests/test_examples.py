"""Every example in examples/ runs and prints what its docs promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_python_example(name: str) -> list[str]:
    """The example's stdout lines (it must exit 0)."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120, check=True
    )
    return proc.stdout.splitlines()


def test_quickstart_runs_end_to_end() -> None:
    lines = _run_python_example("quickstart.py")
    assert "tool: Bash" in lines
    assert "approval: permission -> approved" in lines
    assert any(line.startswith("review: approve with 0 issues (run_") for line in lines)
    assert "failed: agent_error: tests broke" in lines


def test_custom_driver_example_runs_and_conforms() -> None:
    # docs/drivers.md's "Writing your own driver" is this file: a driver written with public
    # names only must run, stream, resume a thread, fail typed and pass the conformance suite.
    assert _run_python_example("custom_driver.py") == [
        "run: turn 1: hello",
        "deltas: turn 1: streamed",
        "thread: turn 2: second",
        "failed: agent_error {'exit_code': 3, 'signal': None}",
        "conformance: ok",
    ]


def test_asyncio_example_runs_gathers_and_cancels() -> None:
    assert _run_python_example("asyncio_app.py") == [
        "gathered: ['hello', 'hello', 'hello']",
        "timed out: the slow run was cancelled",
        "closed",
    ]


def _daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    from tests.daemon_harness import DaemonProcess

    return DaemonProcess(tmp_path / "home").start()


def _run_example(name: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        ["bash", str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ADAPTORD_HOME": str(home), **env},
    )


@pytest.mark.slow
def test_start_and_run_shell_example(tmp_path: Path) -> None:
    # The README's quick start: `adaptord serve &` then `adaptor run` at once exited 69 (the
    # daemon was not serving yet).  The example waits for it, runs, and stops it.
    import os

    config = tmp_path / "config"  # no user config file is read
    config.mkdir()
    proc = _run_example("start-and-run.sh", tmp_path / "home", XDG_CONFIG_HOME=str(config))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hi\n"
    assert _not_running(tmp_path / "home")  # the script stopped the daemon it started
    assert os.listdir(tmp_path / "home" / "verdicts")  # the run went through the daemon


def _not_running(home: Path) -> bool:
    import os

    status = subprocess.run(
        ["adaptor", "status", "--home", str(home)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "ADAPTORD_HOME": str(home)},
    )
    return status.returncode == 69


@pytest.mark.slow
def test_submit_and_wait_shell_example(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    proc = _run_example("submit-and-wait.sh", daemon.home.root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello from the spool"
    assert daemon.stop() == 0


@pytest.mark.slow
def test_tail_audit_log_shell_example(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    proc = _run_example("tail-audit-log.sh", daemon.home.root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["tool: Bash", "text: all tests pass", "finished: failed=false"]
    assert daemon.stop() == 0


def test_approve_loop_stops_when_an_answer_fails(tmp_path: Path) -> None:
    # Its exit sat in a pipeline's subshell: the loop tried the same approval every 0.2 s,
    # for ever, hiding the failure (a full disk, a home it cannot write).
    fake = tmp_path / "bin" / "adaptor"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = approvals ]; then\n'
        '  echo \'{"ok": true, "result": [{"id": "a-1", "approval_kind": "permission"}]}\'\n'
        "  exit 0\n"
        "fi\n"
        'echo "adaptor: cannot write the response" >&2\n'
        "exit 70\n"
    )
    fake.chmod(0o755)
    import os

    proc = _run_example("approve-loop.sh", tmp_path / "home", PATH=f"{fake.parent}:{os.environ['PATH']}")
    assert proc.returncode == 1
    assert proc.stderr.count("cannot write the response") == 1


@pytest.mark.slow
def test_approve_loop_shell_example(tmp_path: Path) -> None:
    import time

    import orjson

    daemon = _daemon(tmp_path)
    rid = daemon.submit(
        {
            "driver": "script",
            "prompt": "x",
            "config": {"steps": [{"approval": {"kind": "permission", "title": "edit"}}, {"text": "approved by the loop"}]},
            "policy": {"approvals": {"timeout": 120}},
        }
    )
    deadline = time.monotonic() + 60
    while not list(daemon.home.approvals_pending.glob("*.json")):
        assert time.monotonic() < deadline, "no pending approval appeared"
        time.sleep(0.02)
    proc = _run_example("approve-loop.sh", daemon.home.root, IDLE_ROUNDS="3")
    assert proc.returncode == 0, proc.stderr
    verdict = daemon.verdict(rid)
    assert verdict["ok"] and verdict["result"]["text"] == "approved by the loop"
    assert orjson.loads(daemon.home.verdict(rid).read_bytes())["exit_code"] == 0
    assert daemon.stop() == 0

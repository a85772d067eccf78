"""A real task limit on a running process: a pids cgroup, as systemd's ``TasksMax`` sets one.

Needs a writable pids controller (root, cgroup v1 or v2); the tests that use it skip otherwise.
Every thread and process the capped process starts counts against the limit, so at the cap
``Thread.start`` raises ``RuntimeError("can't start new thread")`` and ``fork`` fails with
``EAGAIN``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType

import pytest

_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def _pids_root() -> Path | None:
    for root in _ROOTS:
        if (root / "cgroup.procs").exists() and (
            root.name == "pids" or "pids" in _read(root / "cgroup.subtree_control")
        ):
            return root
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class TaskLimit:
    """Moves ``pid`` into a cgroup of its own; :meth:`cap` and :meth:`lift` set its limit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        root = _pids_root()
        if root is None:
            pytest.skip("no pids cgroup controller here")
        self._root = root
        self._group = root / f"adaptor-test-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> TaskLimit:
        try:
            self._group.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot make a pids cgroup: {exc}")
        try:
            (self._group / "cgroup.procs").write_text(str(self.pid))
        except OSError as exc:  # a delegated hierarchy may refuse the move
            os.rmdir(self._group)
            pytest.skip(f"cannot move a process into a pids cgroup: {exc}")
        return self

    def cap(self, spare: int = 0) -> None:
        """From now on the process may start only ``spare`` more threads or processes."""
        current = int((self._group / "pids.current").read_text())
        (self._group / "pids.max").write_text(str(current + spare))

    def lift(self) -> None:
        (self._group / "pids.max").write_text("max")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.lift()
        # A process may start another while they are moved out: move until none is left.
        for _ in range(100):
            for line in _read(self._group / "cgroup.procs").split():
                try:
                    (self._root / "cgroup.procs").write_text(line)
                except OSError:  # gone meanwhile
                    pass
            try:
                os.rmdir(self._group)
            except OSError:
                time.sleep(0.01)
            else:
                return


class HeldChild:
    """``python -c SCRIPT ARGS`` in a pids cgroup of its own, talked to a line at a time.

    The script prints a first line once set up (kept in :attr:`first_line`), then reads a line
    before each step; the test caps or lifts :attr:`limit` in between.
    """

    def __init__(self, script: str, *args: str, cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args], cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.first_line = b""
        self.limit: TaskLimit | None = None

    def __enter__(self) -> HeldChild:
        try:
            assert self.proc.stdout is not None
            self.first_line = self.proc.stdout.readline()
            self.limit = TaskLimit(self.proc.pid).__enter__()
        except BaseException:
            self._end()
            raise
        return self

    def step(self) -> bytes:
        """Let the script go on; the next line it prints."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def _end(self) -> None:
        self.proc.kill()
        self.proc.communicate()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.limit is not None:
                self.limit.__exit__(exc_type, exc, tb)
        finally:
            self._end()

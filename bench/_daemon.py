"""A real ``adaptord serve`` subprocess on a scratch home, for the daemon benchmarks.

The same start as ``tests/daemon_harness.py`` (``python -m adaptord serve --home HOME``, ready
when it logs ``adaptord: ready``), plus what a benchmark needs: the daemon's RSS from
``/proc/<pid>/status``, counting its log lines, and an environment that keeps the machine's own
adaptord config out (``XDG_CONFIG_HOME`` points at an empty directory).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from adaptor import _home

READY_TIMEOUT = 60.0


def isolated_env(scratch: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with an empty config directory (no user adaptord config applies)."""
    config = scratch / "xdg-config"
    config.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_CONFIG_HOME": str(config), **(extra or {})}
    env.pop("ADAPTORD_HOME", None)
    return env


class Daemon:
    """``adaptord serve`` on ``home`` until :meth:`stop` (or the ``with`` block's end)."""

    def __init__(self, home: Path, *args: str, env: Mapping[str, str]) -> None:
        self.home = _home.Home.at(home)
        self.args = args
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._changed = threading.Condition()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Daemon:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adaptord", "serve", "--home", str(self.home.root), *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        # The log must be drained, or the daemon blocks once the pipe is full.
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.wait_for("adaptord: ready", timeout=READY_TIMEOUT)
        except BaseException:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def count(self, needle: str) -> int:
        with self._changed:
            return sum(1 for line in self.lines if needle in line)

    def wait_for(self, needle: str, *, count: int = 1, timeout: float = 60.0) -> None:
        """Until ``count`` log lines contain ``needle``; raises with the log's tail if not."""
        deadline = time.monotonic() + timeout
        seen = 0
        checked = 0
        with self._changed:
            while True:
                for line in self.lines[checked:]:
                    seen += needle in line
                checked = len(self.lines)
                if seen >= count:
                    return
                remaining = deadline - time.monotonic()
                exited = self.proc is not None and self.proc.poll() is not None
                if remaining <= 0 or exited:
                    tail = "\n".join(self.lines[-30:])
                    raise RuntimeError(
                        f"adaptord: {seen} of {count} log lines with {needle!r}"
                        f"{' (it exited)' if exited else ''}; log tail:\n{tail}"
                    )
                self._changed.wait(min(remaining, 0.5))

    def rss_bytes(self) -> int:
        """The daemon's resident set size now (``VmRSS``)."""
        with open(f"/proc/{self.pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def stop(self, timeout: float = 120.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(timeout=30)

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()  # a failed benchmark does not wait for a drain
        self.stop()

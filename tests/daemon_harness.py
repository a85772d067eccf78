"""A real ``adaptord serve`` subprocess on a temporary home, driven through files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from adaptor import _home

READY_TIMEOUT = 30.0


class DaemonProcess:
    # Every daemon a test starts, so a failing test cannot leave one running (see conftest).
    started: list[DaemonProcess] = []

    def __init__(
        self,
        home: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        capture_stdout: bool = False,
        prefix: Sequence[str] = (),
    ) -> None:
        """``capture_stdout``: keep all the daemon prints on stdout in :attr:`stdout` (else it
        goes to /dev/null); what it says on stderr is always in :attr:`lines`.  ``prefix``: a
        command the daemon is started through (``setpriv ... --``)."""
        self.home = _home.Home.at(home)
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.capture_stdout = capture_stdout
        self.prefix = tuple(prefix)
        self.stdout = bytearray()
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stdout_reader: threading.Thread | None = None

    def start(self, *, wait_ready: bool = True, held: bool = False) -> DaemonProcess:
        """Start the daemon; ``held``: its process exists but waits for :meth:`let_go` to serve
        (so a test can set the process up first, a task limit say)."""
        argv = [*self.prefix, sys.executable, "-m", "adaptord", "serve", "--home", str(self.home.root), *self.args]
        if held:  # the same process, made the daemon by exec once a line arrives on stdin
            argv = ["/bin/sh", "-c", 'read line; exec "$@"', "sh", *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if held else subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.capture_stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
        )
        DaemonProcess.started.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if self.capture_stdout:
            self._stdout_reader = threading.Thread(target=self._read_stdout, daemon=True)
            self._stdout_reader.start()
        if wait_ready and not held:
            self.wait_for_line("adaptord: ready")
        return self

    def let_go(self) -> None:
        """Let a daemon started ``held`` start serving."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        self.proc.stdin.close()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.stdout += chunk

    def wait_for_line(self, needle: str, timeout: float = READY_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc is not None and self.proc.poll() is not None and not self._pending()):
                    raise AssertionError(f"no log line containing {needle!r}; got:\n" + "\n".join(self.lines))
                self._changed.wait(min(remaining, 0.5))

    def reload(self, config: Path, text: str, timeout: float = READY_TIMEOUT) -> str:
        """Write ``text`` to ``config``, SIGHUP the daemon, and return its next reload line."""
        with self._changed:
            seen = sum("config reload" in line for line in self.lines)
        config.write_text(text)
        self.signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                reloads = [line for line in self.lines if "config reload" in line]
                if len(reloads) > seen:
                    return reloads[seen]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError("no reload line; got:\n" + "\n".join(self.lines))
                self._changed.wait(min(remaining, 0.5))

    def _pending(self) -> bool:
        return False

    def submit(self, request: Mapping[str, Any]) -> str:
        return _home.submit(self.home, request)

    def drop(self, name: str, data: bytes) -> None:
        """Put ``data`` into ``spool/new/<name>`` whole, as a client must (write, then link).

        Writing straight into ``spool/new`` lets the daemon read a file still being written:
        under load it then answers a half-written request ("invalid JSON").
        """
        staged = self.home.spool_tmp / f"drop-{os.urandom(8).hex()}"
        staged.write_bytes(data)
        try:
            os.link(staged, self.home.spool_new / name)
        finally:
            staged.unlink()

    def verdict(self, request_id: str, timeout: float = 60.0) -> dict[str, Any]:
        path = self.home.verdict(request_id)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"no verdict for {request_id}; daemon log:\n" + "\n".join(self.lines))
            time.sleep(0.02)
        return orjson.loads(path.read_bytes())  # type: ignore[no-any-return]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop_off_the_approvals_lock(self) -> None:
        """SIGSTOP the daemon at a moment it does not hold the approvals lock.

        It keeps that lock a few milliseconds after each use, and a run waiting on an approval
        takes it every quarter second to look for responses: stopped holding it, a responder
        waits 10 s for it (another case, tested on its own).  So: stopped, then looked at, and
        let go on and stopped again while it holds the lock.
        """
        import fcntl

        assert self.proc is not None
        with open(self.home.approvals_lock, "a") as probe:
            while True:
                self.proc.send_signal(signal.SIGSTOP)
                _wait_stopped(self.proc.pid)
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self.proc.send_signal(signal.SIGCONT)
                    time.sleep(0.01)
                    continue
                fcntl.flock(probe, fcntl.LOCK_UN)
                return

    def signal_until_gone(self, *signums: int, timeout: float = 60.0) -> int:
        """Send ``signums`` in turn, one every millisecond, until the daemon exits; its status.

        So that one lands in every part of its way out, however short, down to the exit itself.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        sent = 0
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "still running after the signals; got:\n" + "\n".join(self.lines)
            self.proc.send_signal(signums[sent % len(signums)])
            sent += 1
            time.sleep(0.001)
        return self.stop()

    def kill9(self) -> None:
        """SIGKILL, and wait for the process; :attr:`stdout` then holds all it printed (its
        agents do not share that pipe), while ``lines`` may still be read after this."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        if self._stdout_reader is not None:
            self._stdout_reader.join(timeout=10)

    def kill_if_running(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, and the exit status once the daemon is gone and ``lines`` holds all it said.

        (Only here: after a kill -9 its agents may live on holding the stderr pipe open.)
        """
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 60.0) -> int:
        """The exit status once the daemon has gone on its own (or on a signal already sent),
        with ``lines`` holding all it said; sends nothing (a second SIGTERM would end a drain)."""
        assert self.proc is not None
        status = self.proc.wait(timeout=timeout)
        for reader in (self._reader, self._stdout_reader):
            if reader is not None:
                reader.join(timeout=10)
        return status

    def files_holding(self, *secrets: str) -> list[Path]:
        """The files under the home holding any of ``secrets``, looked for once the daemon has
        exited: while it runs, a request's claimed copy (what the request said, secrets and all)
        is removed only after its verdict is written, so it may outlive the verdict a moment."""
        assert self.proc is not None and self.proc.poll() is not None, "stop the daemon first"
        needles = [secret.encode() for secret in secrets]
        holding = []
        for path in self.home.root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(needle in data for needle in needles):
                    holding.append(path)
        return holding


# The /proc readers below stay independent of adaptor._procfs on purpose: they check what the
# daemon's own use of it (leftover agents, lease holders) did.


def marked_processes(home: Path) -> list[int]:
    """Live processes whose environment marks them as started by ``home``'s daemon."""
    return processes_with_env("ADAPTORD_OWNER", os.path.realpath(home))


def processes_with_env(name: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``name=value``, read from ``/proc``."""
    entry = os.fsencode(f"{name}={value}")
    carrying = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if entry in environ.split(b"\0"):
            carrying.append(int(pid))
    return sorted(pid for pid, _ in identities(carrying))


def cmdline(pid: int) -> str:
    """The command line of ``pid``, words joined by spaces (``"?"`` once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def identities(pids: list[int]) -> set[tuple[int, int]]:
    """``(pid, start time)`` of each of these processes still running (not a zombie).

    The start time tells a process from a later one given the same pid: with pids wrapping at
    32768 and a test suite starting thousands of processes, a pid is soon reused.
    """
    found = set()
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] != b"Z":
            found.add((pid, int(fields[19])))
    return found


def _wait_stopped(pid: int) -> None:
    """Return once process ``pid`` is stopped (SIGSTOP is delivered asynchronously)."""
    for _ in range(2000):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop")

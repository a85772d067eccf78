"""/proc is used only when it shows this process's own pid namespace."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from adaptor import _home, _procfs
from adaptor.threadstore import _holder
from adaptord import _leftovers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc")


def test_this_process_is_found_as_itself() -> None:
    assert _procfs.usable()
    me = _procfs.stat(os.getpid())
    assert me is not None and not me.zombie and me.pgid == os.getpgrp()
    assert os.getpid() in set(_procfs.pids())
    child = subprocess.Popen(["sleep", "60"])
    seen = _procfs.stat(child.pid)
    assert seen is not None and seen.pgid == os.getpgrp()
    child.kill()
    child.wait(timeout=30)
    gone = _procfs.stat(child.pid)
    assert gone is None or gone.start != seen.start  # (or its pid is another process's now)


def test_a_proc_of_another_namespace_is_neither_judged_nor_signalled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    owner = _leftovers.owner_mark(tmp_path)
    marked = subprocess.Popen(
        ["sleep", "60"], env={**os.environ, _home.OWNER_VAR: owner}, start_new_session=True
    )
    try:
        # Popen returns once exec has begun, a moment before the kernel has set up the new
        # environment that /proc shows: wait until the process is seen as it is.
        deadline = time.monotonic() + 30
        while [found.pid for found in _leftovers.find(owner)] != [marked.pid]:
            assert time.monotonic() < deadline, "the marked process was never found"
            time.sleep(0.01)
        real_readlink = os.readlink

        def readlink(path: str, *args: object, **kwargs: object) -> str:
            # What /proc/self reads as when /proc belongs to another pid namespace.
            return "1" if path == "/proc/self" else real_readlink(path)

        monkeypatch.setattr(os, "readlink", readlink)
        assert not _procfs.usable()
        assert _leftovers.find(owner) == []
        assert _holder._read_current(os.getpid()) is None  # leases record no holder then
    finally:
        marked.kill()
        marked.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root")
def _execd(pid: int) -> bool:
    """Whether process ``pid`` runs ``sleep`` already (not yet the forked test process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().startswith(b"sleep\0")
    except OSError:
        return False


def test_another_users_process_carrying_our_mark_is_not_ours(tmp_path: Path) -> None:
    # Root reads every user's environment: a root daemon's leftover clean-up signalled another
    # user's process group whose leader carried the home's mark (set by hand).
    owner = _leftovers.owner_mark(tmp_path)
    env = {**os.environ, _home.OWNER_VAR: owner}
    theirs = subprocess.Popen(["sleep", "60"], env=env, user=65534, start_new_session=True)
    ours = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        # Until a child has exec'd, /proc shows its parent's environment, without the mark:
        # a look before then found neither (under load, in a full parallel run).
        give_up = time.monotonic() + 30
        while not all(_execd(proc.pid) for proc in (theirs, ours)) and time.monotonic() < give_up:
            time.sleep(0.02)
        found = {leftover.pid for leftover in _leftovers.find(owner)}
        assert ours.pid in found and theirs.pid not in found
    finally:
        for proc in (theirs, ours):
            proc.kill()
            proc.wait(timeout=30)

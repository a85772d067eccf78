"""What Linux's ``/proc`` says about processes: the few facts the SDK and the daemon rely on.

Without ``/proc`` (another OS) there is no process to be found; callers decide what that means.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessStat:
    state: bytes  # b"R", b"S", b"Z", ...
    pgid: int
    start: int  # clock ticks after boot: with the pid, it names one process, never a later one

    @property
    def zombie(self) -> bool:
        """Ended, not yet reaped: it can do nothing more, and no signal reaches it."""
        return self.state == b"Z"


def usable() -> bool:
    """Whether ``/proc`` shows this process's own pid namespace (so its pids are ours).

    A ``/proc`` mounted from another namespace (a container set up oddly) would name other
    processes by the same numbers; nothing may be judged, let alone signalled, through it.
    """
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def stat(pid: int) -> ProcessStat | None:
    """The process with this pid, or ``None`` if there is none (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after its last ")" do not:
    # state, ppid, pgrp, ... and starttime, field 22 of the line, the 20th after the name.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return ProcessStat(fields[0], int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def pids() -> Iterator[int]:
    """Every pid ``/proc`` lists now (none without it)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)

"""Agent processes a killed daemon left running, found and stopped when the next one starts.

A run's agent CLI runs in a process group of its own, so it does not die with the daemon: after
a ``kill -9`` (or an OOM kill) it goes on working, and a request that is then run again would
have two agents in one workspace.  Every process the daemon starts inherits
``ADAPTORD_OWNER=<home>`` from it (drivers pass the daemon's environment on, and so do the
agents to what they start), so at its next start the daemon finds them in ``/proc`` and stops
them: the whole group of a marked group leader (which takes along members that cleared their
environment), else the marked process alone.  A group is never signalled unless its leader
carries the mark, so neither the daemon's own group nor a shell's job is ever hit.

The scan is exact (the whole ``NAME=value`` entry) and per home, so two daemons on two homes
never touch each other's agents.  It needs Linux's ``/proc`` (of this process's own pid
namespace); elsewhere nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from adaptor import _procfs
from adaptor._home import OWNER_VAR

_POLL: Final = 0.02
_AFTER_KILL: Final = 5.0  # how long SIGKILLed processes may take to disappear


@dataclass(frozen=True)
class Leftover:
    """One marked process: what to signal (its group when it leads one) and how to know it again."""

    pid: int
    pgid: int
    start: int  # /proc start time (clock ticks since boot): a reused pid has another
    leads_group: bool


def owner_mark(home: str | os.PathLike[str]) -> str:
    """The ``ADAPTORD_OWNER`` value for a home: its real path (the same however it is named)."""
    return os.path.realpath(os.fspath(home))


@contextlib.contextmanager
def marking(owner: str) -> Iterator[None]:
    """``ADAPTORD_OWNER=owner`` in this process's environment, so in every child's, for the block."""
    previous = os.environ.get(OWNER_VAR)
    os.environ[OWNER_VAR] = owner
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(OWNER_VAR, None)
        else:
            os.environ[OWNER_VAR] = previous


def find(owner: str) -> list[Leftover]:
    """Processes of this user (other than this one) whose environment holds ``owner``'s mark."""
    if not _procfs.usable():
        return []
    entry = os.fsencode(f"{OWNER_VAR}={owner}")
    return [
        Leftover(pid, stat.pgid, stat.start, leads_group=stat.pgid == pid)
        for pid, stat in _procfs.carrying(entry)
    ]


def stop(leftovers: Sequence[Leftover], grace: float) -> int:
    """SIGTERM each (its group if it leads one), SIGKILL what is left after ``grace`` seconds.

    Returns how many needed the SIGKILL.  Waits until all are gone or ``_AFTER_KILL`` passes
    after the SIGKILL (a process stuck in the kernel cannot be hurried).
    """
    own_group = os.getpgrp()
    _signal_all(leftovers, signal.SIGTERM, own_group)
    remaining = _wait(leftovers, grace)
    if remaining:
        _signal_all(remaining, signal.SIGKILL, own_group)
        _wait(remaining, _AFTER_KILL)
    return len(remaining)


def _signal_all(leftovers: Sequence[Leftover], sig: signal.Signals, own_group: int) -> None:
    for leftover in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if leftover.leads_group and leftover.pgid != own_group:
                # Also once the leader is gone: members that cleared their environment remain.
                if _procfs.group_running(leftover.pgid):
                    os.killpg(leftover.pgid, sig)
            elif _procfs.running(leftover.pid, leftover.start):
                os.kill(leftover.pid, sig)  # (not a later process given the same pid)


def _wait(leftovers: Sequence[Leftover], timeout: float) -> list[Leftover]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [leftover for leftover in leftovers if _alive(leftover)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(_POLL)


def _alive(leftover: Leftover) -> bool:
    if _procfs.running(leftover.pid, leftover.start):
        return True
    # A group leader that is gone may leave members of its group behind.
    return leftover.leads_group and _procfs.group_running(leftover.pgid)

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

``/proc`` shows only the processes of this daemon's PID namespace and of those below it: a
daemon restarted in another container on the same home cannot see (or stop) what the killed
one's runs started, unless that container ended, and its processes with it.  Each run's state
records where its agents run (:func:`where_agents_run`), and :func:`out_of_sight` tells the
next start which interrupted runs it cannot vouch for: those must not run again beside an
agent that may still be working in their workspace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from adaptor import _procfs
from adaptor._home import OWNER_VAR

_POLL: Final = 0.02
_AFTER_KILL: Final = 5.0  # how long SIGKILLed processes may take to disappear

# The kernel's PROC_PID_INIT_INO: the machine's own PID namespace, whose /proc shows every process.
_INITIAL_PID_NAMESPACE: Final = "pid:[4026531836]"
# Inits that exit when their one child does (`docker run --init` runs tini as docker-init;
# podman's is catatonit): the daemon's end is then its namespace's, and the kernel kills every
# process left in a namespace whose first process ends.
_INITS_ENDING_WITH_THEIR_CHILD: Final = frozenset({"tini", "docker-init", "dumb-init", "catatonit"})


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


def stop(owner: str, leftovers: Sequence[Leftover], grace: float) -> tuple[int, int]:
    """SIGTERM each of ``owner``'s ``leftovers`` (its group if it leads one), SIGKILL what is
    left after ``grace`` seconds, and any other process carrying the mark by then (one that
    forks a copy of itself and exits, again and again, is another process at each look).

    Returns how many needed the SIGKILL, and how many of those were found only by the later
    looks (not among ``leftovers``).  Waits until all are gone or ``_AFTER_KILL`` passes
    after the SIGKILL (a process stuck in the kernel cannot be hurried).
    """
    own_group = os.getpgrp()
    _signal_all(leftovers, signal.SIGTERM, own_group)
    remaining = _wait(leftovers, grace)
    if remaining:
        _signal_all(remaining, signal.SIGKILL, own_group)
        _wait(remaining, _AFTER_KILL)  # (first: those killed are not found and counted again)
    others = _procfs.kill_carrying(os.fsencode(f"{OWNER_VAR}={owner}")) if _procfs.usable() else 0
    return len(remaining) + others, others


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


def where_agents_run() -> dict[str, str | bool | None]:
    """What a run's state records of where this daemon's agents run, for :func:`out_of_sight`:
    its PID namespace (``None`` without ``/proc``) and whether that ends with the daemon."""
    return {
        "pid_namespace": _procfs.pid_namespace(),
        "namespace_ends_with_daemon": _namespace_ends_with_this_process(),
    }


def _namespace_ends_with_this_process() -> bool:
    if os.getpid() == 1:
        return True
    if os.getppid() != 1:
        return False
    try:
        with open("/proc/1/cmdline", "rb") as handle:
            init = handle.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(os.fsdecode(init)) in _INITS_ENDING_WITH_THEIR_CHILD


def out_of_sight(recorded: Mapping[str, Any]) -> str | None:
    """Why what an interrupted run started (``recorded``: its run state, see
    :func:`where_agents_run`) may still be running where :func:`find` cannot see it, so that no
    start can stop it; ``None`` when it would have been found, or ended with its namespace."""
    theirs = recorded.get("pid_namespace")
    if not isinstance(theirs, str):
        return None  # started where no /proc told its namespace (as every other process there)
    if recorded.get("namespace_ends_with_daemon") is True:
        return None
    if not _procfs.usable():
        return "this daemon has no /proc of its own PID namespace to look for what it started in"
    ours = _procfs.pid_namespace()
    if ours in (theirs, _INITIAL_PID_NAMESPACE):
        return None
    return f"it ran in another PID namespace ({theirs}), whose processes this daemon's ({ours}) cannot see"

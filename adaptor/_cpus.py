"""Keeping a host's own threads on one CPU while the agent processes it starts keep them all.

A Python process's threads take turns on one interpreter lock, so they never need two CPUs at
once; spread over several, every hand-over of the lock (each system call of a busy thread) wakes
a thread on another CPU, which on a virtual machine costs an interrupt between CPUs.  A daemon
running many short requests spent more than half its CPU time so (measured: pinned to one CPU,
the same work took 40% less CPU and ran 1.4x as fast).  The agent CLIs it starts, and their own
children, are other programs: they must keep the CPUs the host was given, which a thread's
child would otherwise inherit from the thread that started it.

Linux only (``sched_setaffinity``); elsewhere nothing is narrowed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_for_children: frozenset[int] | None = None
"""The CPUs the process had before :func:`keep_threads_on_one_cpu` (``None``: not narrowed)."""


def keep_threads_on_one_cpu() -> int | None:
    """Run every thread of this process, and each one it starts later, on one CPU.

    The CPU is the one the calling thread runs on (the scheduler's choice of an idle one), of
    those the process may use; processes started through :func:`for_children` get all of those.
    Returns the CPU, or ``None`` when there is nothing to narrow (one CPU allowed, or no
    ``sched_setaffinity``).  Called again, it keeps the CPUs the process had the first time.
    """
    global _for_children
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = _for_children if _for_children is not None else frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    cpu = _current_cpu()
    if cpu not in allowed:
        cpu = min(allowed)
    _for_children = allowed
    _set_every_thread({cpu})
    return cpu


def let_threads_use_every_cpu() -> None:
    """Undo :func:`keep_threads_on_one_cpu`: every thread may use the process's CPUs again."""
    global _for_children
    if _for_children is None:
        return
    allowed, _for_children = _for_children, None
    _set_every_thread(allowed)


@contextlib.contextmanager
def for_children() -> Iterator[None]:
    """Around a process start: the child gets the CPUs the process had, not this thread's one.

    A child inherits the CPUs of the thread that starts it; this thread's are widened for the
    start and narrowed again after.  Nothing changes when the threads were not narrowed.
    """
    allowed = _for_children
    own: set[int] | None = None
    if allowed is not None:
        try:
            current = os.sched_getaffinity(0)
            if current != allowed:
                os.sched_setaffinity(0, allowed)
                own = current
        except OSError:  # (a cpuset shrunk since: the child keeps this thread's CPUs)
            own = None
    try:
        yield
    finally:
        if own is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, own)


def _set_every_thread(cpus: set[int] | frozenset[int]) -> None:
    # A thread started meanwhile by one not yet set inherits the old CPUs: look until no
    # thread is new.  Threads that ended meanwhile are simply gone.
    done: set[str] = set()
    while True:
        try:
            fresh = set(os.listdir("/proc/self/task")) - done
        except OSError:  # no /proc: this thread at least, and those it starts
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)
            return
        if not fresh:
            return
        for tid in fresh:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)
        done |= fresh


def _current_cpu() -> int:
    """The CPU the calling thread runs on (``-1`` when ``/proc`` does not say)."""
    try:
        with open("/proc/thread-self/stat", "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
        return int(fields[36])  # field 39 of proc(5), "processor"
    except (OSError, IndexError, ValueError):
        return -1

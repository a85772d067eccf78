"""Keeping a host's own threads on one CPU while the agent processes it starts keep them all.

A Python process's threads take turns on one interpreter lock, so they never need two CPUs at
once; spread over several, every hand-over of the lock (each system call of a busy thread) wakes
a thread on another CPU, which on a virtual machine costs an interrupt between CPUs.  A daemon
running many short requests spent more than half its CPU time so (measured: pinned to one CPU,
the same work took 40% less CPU and ran 1.4x as fast).  The agent CLIs it starts, and their own
children, are other programs, and so are those a host tool starts (a build, a test run): they
must keep the CPUs the host was given, which a thread's child would otherwise inherit from the
thread that started it.

Linux only (``sched_setaffinity``); elsewhere nothing is narrowed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_guard = threading.Lock()
_allowed: frozenset[int] | None = None
"""The CPUs the process had when its threads were first narrowed (``None``: never narrowed)."""
_narrow: frozenset[int] | None = None
"""The one CPU the threads are kept on now (``None``: not narrowed)."""
_widened: dict[int, int] = {}
"""Threads inside :func:`for_children` (native id: how deep), which placements leave alone."""


def keep_threads_on_one_cpu() -> int | None:
    """Run every thread of this process, and each one it starts later, on one CPU.

    The CPU is the one the calling thread runs on (the scheduler's choice of an idle one), of
    those the process may use; processes started inside :func:`for_children` get all of those.
    Returns the CPU, or ``None`` when there is nothing to narrow (one CPU allowed, or no
    ``sched_setaffinity``).  Called again, it keeps the CPUs the process had the first time.
    Raises the ``OSError`` of narrowing the calling thread (a seccomp filter may refuse it);
    nothing is narrowed then.
    """
    global _allowed, _narrow
    if not hasattr(os, "sched_setaffinity"):
        return None
    with _guard:
        allowed = _allowed if _allowed is not None else frozenset(os.sched_getaffinity(0))
        if len(allowed) < 2:
            return None
        cpu = _current_cpu()
        if cpu not in allowed:
            cpu = min(allowed)
        narrow = frozenset({cpu})
        if threading.get_native_id() not in _widened:
            os.sched_setaffinity(0, narrow)  # refused here: no claim of a CPU not kept to
        _allowed, _narrow = allowed, narrow
        _set_every_thread(narrow)
        return cpu


def let_threads_use_every_cpu() -> None:
    """Undo :func:`keep_threads_on_one_cpu`: every thread may use the process's CPUs again."""
    global _narrow
    with _guard:
        if _narrow is None or _allowed is None:
            return
        _narrow = None
        _set_every_thread(_allowed)


@contextlib.contextmanager
def for_children() -> Iterator[None]:
    """Around work that starts other programs (a process start, a host tool's handler): the
    calling thread, and so each process or thread it starts meanwhile, gets the CPUs the
    process had, not the one its threads are kept on.

    Placements made meanwhile (:func:`keep_threads_on_one_cpu`, :func:`let_threads_use_every_cpu`
    from another thread) leave this thread alone; it takes the placement in effect when it
    leaves.  Nothing changes when the threads were never narrowed.
    """
    me = threading.get_native_id()
    with _guard:
        _widened[me] = _widened.get(me, 0) + 1
        if _narrow is not None and _allowed is not None and _widened[me] == 1:
            _place(0, _allowed)
    try:
        yield
    finally:
        with _guard:
            _widened[me] -= 1
            if not _widened[me]:
                del _widened[me]
                if _allowed is not None:
                    _place(0, _narrow if _narrow is not None else _allowed)


def _place(tid: int, cpus: frozenset[int]) -> None:
    # (A cpuset shrunk since, or the thread gone: it keeps the CPUs it has.)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(tid, cpus)


def _set_every_thread(cpus: frozenset[int]) -> None:
    # Called holding _guard.  A thread started meanwhile by one not yet set inherits the old
    # CPUs: look until no thread is new.  Threads inside for_children are left as they are.
    done = {str(tid) for tid in _widened}
    while True:
        try:
            fresh = set(os.listdir("/proc/self/task")) - done
        except OSError:  # no /proc: this thread at least, and those it starts
            _place(0, cpus)
            return
        if not fresh:
            return
        for tid in fresh:
            _place(int(tid), cpus)
        done |= fresh


def _forget_in_child() -> None:
    # A fork while another thread held the guard would leave it held for ever in the child,
    # whose only thread is the forking one.
    global _guard
    _guard = threading.Lock()
    _widened.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _current_cpu() -> int:
    """The CPU the calling thread runs on (``-1`` when ``/proc`` does not say)."""
    try:
        with open("/proc/thread-self/stat", "rb") as handle:
            fields = handle.read().rpartition(b")")[2].split()
        return int(fields[36])  # field 39 of proc(5), "processor"
    except (OSError, IndexError, ValueError):
        return -1

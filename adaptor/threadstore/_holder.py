"""Which process holds a lease, so that a lease whose holder died need not wait out its TTL.

A process killed while it holds a thread's lease (a daemon's ``kill -9``, an OOM kill) can
never use it again, yet until its TTL (five minutes by default) ran out every other run of
that thread got ``ThreadBusyError``.  A lease now records its holder: pid, the process's start
time, its user and its pid namespace.  Another process treats the lease as gone only when it
can be certain: same boot (checked by the caller), same pid namespace (so pid numbers mean the
same process), same user (a ``hidepid`` ``/proc`` hides other users' processes, which must not
look dead), and the pid is gone, is a zombie, or belongs to a process started at another time,
and none of the agent processes it started runs any more.  Those run in sessions of their own
and outlive a ``kill -9`` of their starter; a thread taken over meanwhile had two agents working
on one conversation and one workspace.  They carry their starter's identity in their
environment (``_procfs.STARTER_VAR``).  Anything else (no ``/proc``, another container, another user) leaves the TTL in charge.
Fencing is untouched: the next grant has a new generation and token, which a dead holder could
not have used anyway.
"""

from __future__ import annotations

import os
from typing import Any

from adaptor import _procfs

_mine: tuple[int, dict[str, Any] | None] | None = None  # (pid it was read for, the holder)
# Holders (pid, start) found ended along with every agent they started: looking for those
# agents reads the environment of each of this user's processes, once is enough.
_ended: set[tuple[int, int]] = set()


def current() -> dict[str, Any] | None:
    """This process as a lease records it, or ``None`` where that cannot be told (no /proc)."""
    global _mine
    pid = os.getpid()
    if _mine is None or _mine[0] != pid:  # read again in a forked child
        _mine = (pid, _read_current(pid))
    return _mine[1]


def _read_current(pid: int) -> dict[str, Any] | None:
    if not _procfs.usable():
        return None
    stat = _procfs.stat(pid)
    namespace = _procfs.pid_namespace()
    if stat is None or namespace is None:
        return None
    return {"pid": pid, "start": stat.start, "uid": os.getuid(), "pidns": namespace}


def gone(holder: object) -> bool:
    """Whether the process a lease names as its holder has certainly ended."""
    if type(holder) is not dict:
        return False  # a lease from before holders were recorded
    mine = current()
    if mine is None or holder.get("pidns") != mine["pidns"] or holder.get("uid") != mine["uid"]:
        return False
    pid, start = holder.get("pid"), holder.get("start")
    if type(pid) is not int or type(start) is not int:
        return False
    if pid == mine["pid"]:
        if start == mine["start"]:
            return False  # this very process
    elif _procfs.running(pid, start):
        return False
    if (pid, start) in _ended:
        return True
    if _procfs.started_by_running(pid, start):
        return False  # an agent it started still works on the thread
    # Nothing can carry the mark from now on: only a running carrier could hand it on.
    _ended.add((pid, start))
    return True


def check_json(holder: object) -> None:
    """Raise ``ValueError`` unless ``holder`` (read back from disk) has the shape recorded."""
    if not isinstance(holder, dict):
        raise ValueError("lease holder is not an object")
    for name in ("pid", "start", "uid"):
        if type(holder.get(name)) is not int:
            raise ValueError(f"lease holder field {name!r} is not an integer")
    if not isinstance(holder.get("pidns"), str):
        raise ValueError("lease holder field 'pidns' is not a string")

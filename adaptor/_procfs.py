"""What Linux's ``/proc`` says about processes: the few facts the SDK and the daemon rely on.

Without ``/proc`` (another OS) there is no process to be found; callers decide what that means.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessStat:
    state: bytes  # b"R", b"S", b"Z", ...
    ppid: int
    pgid: int
    session: int
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
    fields = _stat_fields(pid)
    try:
        return ProcessStat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) the process with this pid has used, or ``None``."""
    fields = _stat_fields(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def _stat_fields(pid: int) -> list[bytes]:
    """``/proc/<pid>/stat``'s fields after the command name (none without such a process).

    The name may hold spaces and parentheses; the fields after its last ")" do not: state,
    ppid, pgrp, session, ..., utime and stime (the 12th and 13th), ... and starttime (the 20th).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    return data[data.rfind(b")") + 2 :].split()


_CAP_DAC_OVERRIDE = 1


def overrides_file_modes() -> bool:
    """Whether this process may write a file whatever its mode says (``CAP_DAC_OVERRIDE``, which
    root has unless it was dropped); without ``/proc``, whether it is root."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_DAC_OVERRIDE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0


def pids() -> Iterator[int]:
    """Every pid ``/proc`` lists now (none without it)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def running(pid: int, start: int) -> bool:
    """Whether the process that had ``pid`` and started at ``start`` still runs (a zombie does
    not; nor does a later process given the same pid)."""
    found = stat(pid)
    return found is not None and found.start == start and not found.zombie


def group_running(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` still runs (zombies aside).

    A group outlives its leader while members remain, and its number is not handed to a new
    process meanwhile, so signalling it then reaches only those members.
    """
    return any(found.pgid == pgid and not found.zombie for found in filter(None, map(stat, pids())))


def zombie_children(parent: int, *, outside_session: int) -> list[int]:
    """The pids of ``parent``'s children that have ended and wait to be reaped, of sessions
    other than ``outside_session``."""
    return [pid for pid in pids()
            if (found := stat(pid)) is not None and found.zombie and found.ppid == parent
            and found.session != outside_session]


def environ(pid: int) -> list[bytes] | None:
    """The ``NAME=value`` entries ``pid`` was started with; ``None`` if gone or another user's."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return None


def carrying(entry: bytes) -> list[tuple[int, ProcessStat]]:
    """The running processes of this user (zombies aside, this one aside) whose environment
    holds the ``NAME=value`` ``entry``.

    Only this user's, also for root, who can read everyone's environment: another user's
    process that carries the entry (set by hand, or copied) is not one of ours to signal.
    """
    me, user = os.getpid(), os.geteuid()
    found: list[tuple[int, ProcessStat]] = []
    for pid in pids():
        if pid == me or entry not in (environ(pid) or ()):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != user:
                continue
        except OSError:  # gone meanwhile
            continue
        state = stat(pid)
        if state is not None and not state.zombie:
            found.append((pid, state))
    return found


# Looks at the processes carrying an entry a killing makes at most, and the looks in a row that
# must find nothing for it to end.  A process that lives a few milliseconds before a copy of it
# takes over may be missed by one look (the copy was born after /proc was listed, the listed
# one gone when read); each look takes about a millisecond per hundred processes.
_KILL_LOOKS = 100
_QUIET_LOOKS = 3


def kill_carrying(entry: bytes) -> int:
    """SIGKILL every process of this user whose environment holds ``entry`` (see
    :func:`carrying`), including those it forks meanwhile; returns how many were found.

    One look and a SIGKILL to each process found leaves the copies they forked meanwhile: a
    process that forks a copy of itself and exits, again and again (or several, each in a
    session of its own), outlived every stop.  So each look stops (SIGSTOP) what it finds, and
    its process group with it when every member carries ``entry`` too (the copies it forks are
    born in the group, and a signal to the group reaches those as well), so they fork no more,
    and looks again until looks find nothing new; those are then killed, groups and all.  A
    group holding any process without the entry (this one's, a shell's) is never signalled.
    """
    own_group = os.getpgrp()
    groups: dict[int, bool] = {}  # group: whether to signal it (all its members carry the entry)
    stopped: dict[int, tuple[int, int]] = {}  # pid: (start, group), stopped and not yet killed
    killed: set[tuple[int, int]] = set()
    quiet = 0
    for _ in range(_KILL_LOOKS):
        fresh = [
            (pid, found.start, found.pgid) for pid, found in carrying(entry)
            if stopped.get(pid, (None,))[0] != found.start and (pid, found.start) not in killed
        ]
        if fresh:
            quiet = 0
            for pid, start, group in fresh:
                if group not in groups:
                    groups[group] = group not in (0, own_group) and _all_carry(group, entry)
                if groups[group]:
                    send_group(group, signal.SIGSTOP)
                send(pid, signal.SIGSTOP)
                stopped[pid] = (start, group)
            continue
        quiet += 1
        if stopped:
            _kill_all(stopped, killed, groups)
            stopped = {}
        elif quiet >= _QUIET_LOOKS:
            break
    _kill_all(stopped, killed, groups)  # (out of looks: what was seen is killed all the same)
    return len(killed)


def _all_carry(group: int, entry: bytes) -> bool:
    """Whether every running process of ``group`` holds ``entry`` in its environment."""
    for pid in pids():
        found = stat(pid)
        if found is not None and found.pgid == group and not found.zombie and entry not in (environ(pid) or ()):
            return False
    return True


def _kill_all(stopped: dict[int, tuple[int, int]], killed: set[tuple[int, int]], groups: dict[int, bool]) -> None:
    for group in {group for _, group in stopped.values() if groups.get(group)}:
        send_group(group, signal.SIGKILL)
    for pid, (start, _) in stopped.items():
        if running(pid, start):
            send(pid, signal.SIGKILL)
        killed.add((pid, start))


def send_group(pgid: int, sig: signal.Signals) -> None:
    """``os.killpg``; a group gone, or not this user's, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def send(pid: int, sig: signal.Signals) -> None:
    """``os.kill``; a process gone, or not this user's, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


#: In the environment of every agent CLI the SDK starts, and so of whatever that starts in turn:
#: ``<pid>:<start>`` of the process that started it.  A thread lease outlives its holder while
#: such processes run (see ``adaptor.threadstore._holder``).
STARTER_VAR = "ADAPTOR_STARTED_BY"

#: Set in every agent's environment to a value of its own, which the processes it starts
#: inherit: it finds those that left its process group (a new session: Gemini CLI's shell tool)
#: so they are stopped with it (``adaptor.drivers._process``).
MARK_VAR = "ADAPTOR_RUN_MARK"


def started_by_me() -> dict[str, str]:
    """The :data:`STARTER_VAR` entry naming this process, for a child's environment (none
    without a ``/proc`` of our own, where nobody could look for it)."""
    global _starter
    pid = os.getpid()
    if _starter is None or _starter[0] != pid:  # read once per process (a fork is another)
        found = stat(pid) if usable() else None
        _starter = (pid, {} if found is None else {STARTER_VAR: f"{pid}:{found.start}"})
    return dict(_starter[1])


_starter: tuple[int, dict[str, str]] | None = None


def started_by_running(pid: int, start: int) -> bool:
    """Whether a process that ``(pid, start)`` started (through :func:`started_by_me`), or one
    of theirs, still runs: only this user's can be seen."""
    return bool(carrying(f"{STARTER_VAR}={pid}:{start}".encode()))


def pid_namespace() -> str | None:
    """This process's pid namespace, as ``/proc/self/ns/pid`` names it (``pid:[<inode>]``)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None

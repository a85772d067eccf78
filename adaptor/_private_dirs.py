"""Private temporary folders of runs and drivers, and the removal of those a killed process left.

A run keeps files its agent reads in a ``0700`` folder of the temporary directory (a run's
skills, claude's MCP config and system prompt, codex's file of the MCP servers' secret ``env``
values) and removes it when it is done.  A process killed by ``kill -9``, the OOM killer or a
power loss removes nothing, and in the system's temporary directory nobody else ever would.

So the process that makes a folder holds a ``flock`` on it for as long as the folder is in use,
and the first folder each process makes begins with removing the folders of this kind that
nobody holds any more and that are older than :data:`_UNHELD_AGE`.  A lock tells rather than
a PID: a PID is reused, and another PID namespace (a container sharing ``/tmp``) sees different
ones; a ``flock`` goes with the last descriptor of the process that held it.  The age keeps a
folder in the instant between its creation and its lock out of reach.  (The daemon points the
temporary directory at its home's ``tmp/`` and empties that at each start besides.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Final

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["make", "remove", "removed_unheld", "used"]

_PREFIX: Final = "adaptor-private-"
# The purpose (a word) and mkdtemp's eight random characters: nothing a person names by hand.
_NAME: Final = re.compile(r"adaptor-private-[a-z]+-[a-z0-9_]{8}")
# Older than any folder between its mkdtemp and its flock, however slow the machine.
_UNHELD_AGE: Final = 300.0
_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_mutex = threading.Lock()
_held: dict[str, int] = {}  # folder -> the descriptor its flock is held through
_swept = False


def _new_folder(purpose: str) -> str:
    # mkdtemp's, without its random names: they are made the first time under tempfile's lock,
    # which a fork does not reset (a copy forked then, its first run hung).
    directory = tempfile.gettempdir()
    for _ in range(100):
        path = os.path.join(directory, f"{_PREFIX}{purpose}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no unused name for a private folder", directory)


def _before_fork() -> None:
    # tempfile finds its directory once, under that same lock: looked for before the fork.
    with contextlib.suppress(OSError):
        tempfile.gettempdir()


def _reset_in_forked_copy() -> None:
    global _mutex
    _mutex = threading.Lock()  # perhaps held by a thread the copy does not have


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_reset_in_forked_copy)


def make(purpose: str) -> str:
    """A fresh ``0700`` folder, held until :func:`remove` (``purpose``: a lower-case word)."""
    global _swept
    if not purpose.isalpha() or not purpose.islower():
        raise ValueError(f"purpose must be a lower-case word, not {purpose!r}")
    if not _swept:
        with _mutex:
            if not _swept:
                _swept = True
                with contextlib.suppress(OSError):
                    removed_unheld(tempfile.gettempdir())
    path = _new_folder(purpose)
    try:
        fd = os.open(path, _FLAGS)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    if fcntl is not None:
        with contextlib.suppress(OSError):  # a filesystem without flock: the age still guards
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with _mutex:
        _held[path] = fd
    return path


def remove(path: str) -> None:
    """Remove a folder :func:`make` made, and let go of it."""
    shutil.rmtree(path, ignore_errors=True)
    with _mutex:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def used(purpose: str) -> Iterator[str]:
    """:func:`make` for the length of a ``with`` block."""
    path = make(purpose)
    try:
        yield path
    finally:
        remove(path)


def removed_unheld(folder: str) -> int:
    """Remove the private folders in ``folder`` that this user's processes made and no longer
    hold, once older than :data:`_UNHELD_AGE`; returns how many.  Links are never followed."""
    if fcntl is None:
        return 0
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.name.startswith(_PREFIX) and _NAME.fullmatch(e.name)]
    removed = 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, _FLAGS)
        except OSError:
            continue  # gone already, or a link
        try:
            found = os.fstat(fd)
            if (
                found.st_uid != os.geteuid()
                or not stat.S_ISDIR(found.st_mode)
                or time.time() - found.st_mtime < _UNHELD_AGE
            ):
                continue
            try:
                # Held while removing, so that another process sweeping skips it.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its maker is alive (or the lock cannot be told: left alone)
            shutil.rmtree(path, ignore_errors=True)
            removed += not os.path.lexists(path)
        finally:
            os.close(fd)
    return removed

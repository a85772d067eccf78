"""The daemon's own temporary files: in its home's ``tmp/``, emptied at each start.

Drivers and runs keep private files in folders made by :func:`tempfile.mkdtemp` (claude's MCP
config and system prompt, codex's env file of the MCP servers' secret values, a run's skills)
and remove them when they are done.  A daemon killed by ``kill -9``, the OOM killer or a power
loss removes nothing, and in the system's temporary directory nobody ever would.  So the daemon
points this process's :data:`tempfile.tempdir` at a folder of its home (only Python's
temporary files move: the agents it starts keep their ``TMPDIR``), and at its next start, once
the agents its predecessor left running are stopped (they may still read those files), removes
whatever is in there.  Each home has its own folder, emptied only by the daemon holding that
home's lock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@contextlib.contextmanager
def kept_in(folder: Path) -> Iterator[None]:
    """This process's temporary files made in ``folder`` (``tempfile.tempdir``) for the block."""
    previous = tempfile.tempdir
    tempfile.tempdir = os.fspath(folder)
    try:
        yield
    finally:
        tempfile.tempdir = previous


@dataclass(frozen=True)
class Cleared:
    """What :func:`clear` did: entries removed, entries left, and the first failure's reason."""

    removed: int = 0
    failed: int = 0
    error: OSError | None = None


def clear(folder: Path) -> Cleared:
    """Remove every entry of ``folder``, never following a symbolic link.

    The folder is opened with ``O_NOFOLLOW`` and emptied through that descriptor (links in it
    are removed, not followed, and :func:`shutil.rmtree` on a descriptor is safe against links
    swapped in meanwhile), so a link at the folder's name or in it never takes the removal
    outside the home.  A missing folder holds nothing; an entry that cannot be removed is
    counted and left for the next start.
    """
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Cleared()
    except OSError as exc:  # a link (ELOOP) or a file (ENOTDIR) at its name: not ours to empty
        return Cleared(failed=1, error=exc)
    removed = failed = 0
    first: OSError | None = None
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                failed += 1
                first = first or exc
            else:
                removed += 1
    finally:
        os.close(fd)
    return Cleared(removed, failed, first)

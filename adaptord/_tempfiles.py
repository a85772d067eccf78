"""The daemon's own temporary files: in its home's ``tmp/``, emptied at each start.

Drivers and runs keep private files in folders made by :func:`tempfile.mkdtemp` (claude's MCP
config and system prompt, codex's env file of the MCP servers' secret values, a run's skills)
and remove them when they are done.  A daemon killed by ``kill -9``, the OOM killer or a power
loss removes nothing; in the system's temporary directory only a later process's first run would
(:mod:`adaptor._private_dirs`), and not while the agents the daemon left may read them.  So the daemon
points this process's :data:`tempfile.tempdir` at a folder of its home (only Python's
temporary files move: the agents it starts keep their ``TMPDIR``), and at its next start, once
the agents its predecessor left running are stopped (they may still read those files), removes
whatever is in there.  Each home has its own folder, emptied only by the daemon holding that
home's lock.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from adaptord._retention import remove_entry


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
    """Remove every entry of ``folder`` (links are removed, never followed, as retention
    removes; the folder itself is one of the home's checked folders, never a link).  A missing
    folder holds nothing; an entry that cannot be removed is counted and left for the next
    start.
    """
    try:
        with os.scandir(folder) as entries:
            paths = [entry.path for entry in entries]
    except FileNotFoundError:
        return Cleared()
    except OSError as exc:
        return Cleared(failed=1, error=exc)
    removed = failed = 0
    first: OSError | None = None
    for path in paths:
        try:
            removed += remove_entry(path)
        except OSError as exc:
            failed += 1
            first = first or exc
    return Cleared(removed, failed, first)

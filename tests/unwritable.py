"""Files a test process may read but not write, as on a read-only mount, even as root."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def unwritable(*paths: Path) -> Iterator[None]:
    """``paths`` refuse to be written or to take new entries for the block.

    Root ignores file modes, so as root the immutable attribute (``chattr +i``) stops it
    instead; a filesystem or system that refuses it skips the test, saying why.
    """
    if os.geteuid() != 0:
        modes = [p.stat().st_mode for p in paths]
        for p in paths:
            p.chmod(p.stat().st_mode & ~0o222)
        try:
            yield
        finally:
            for p, mode in zip(paths, modes, strict=True):
                p.chmod(mode)
        return
    made = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make files immutable here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)

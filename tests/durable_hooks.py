"""Intercepting the data syncs and lock releases of ``adaptor._durable``, for tests.

DurableLog syncs an append either with ``write`` + ``fdatasync`` or, when everything before it
is durable already, with one ``pwritev(RWF_DSYNC)`` call.  Tests that fail, gate or count syncs
must see both: :func:`hook_datasyncs` routes each through ``hook(fd)``, the one-call form as a
real ``os.write`` followed by ``hook(fd)`` (so a hook that raises leaves the data written but
not known durable, exactly what a failed ``RWF_DSYNC`` write may leave).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from adaptor import _durable

Hook = Callable[[int], None]


def hook_datasyncs(monkeypatch: pytest.MonkeyPatch, hook: Hook) -> None:
    """Send every data sync DurableLog makes through ``hook(fd)``, which syncs or raises."""

    def write_then_sync(fd: int, data: bytes) -> int:
        written = os.write(fd, data)
        hook(fd)
        return written

    monkeypatch.setattr(_durable, "_datasync", hook)
    monkeypatch.setattr(_durable, "_write_datasync", write_then_sync)


def _within(under: str | os.PathLike[str]) -> Callable[[int], str | None]:
    """A function of ``fd``: its path when the file is the folder ``under`` or inside it, else
    None.

    Counting only those keeps a test's count its own: a thread an earlier test left behind
    may sync files of its own at any moment."""
    folder = os.path.realpath(under)
    prefix = os.path.join(folder, "")

    def path_of(fd: int) -> str | None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        return path if path == folder or path.startswith(prefix) else None

    return path_of


def count_datasyncs(monkeypatch: pytest.MonkeyPatch, under: str | os.PathLike[str]) -> list[int]:
    """Really sync, and list the descriptor of each data sync DurableLog makes from now on of
    a file inside the folder ``under``."""
    path_of = _within(under)
    calls: list[int] = []
    real = _durable._datasync

    def counted(fd: int) -> None:
        if path_of(fd) is not None:
            calls.append(fd)
        real(fd)

    hook_datasyncs(monkeypatch, counted)
    return calls


def record_fsyncs(monkeypatch: pytest.MonkeyPatch, under: str | os.PathLike[str]) -> list[str]:
    """Really sync, and list the path of each ``os.fsync`` made from now on of the folder
    ``under`` or of a file or folder inside it."""
    path_of = _within(under)
    synced: list[str] = []
    real = os.fsync

    def recorded(fd: int) -> None:
        path = path_of(fd)
        if path is not None:
            synced.append(path)
        real(fd)

    monkeypatch.setattr(os, "fsync", recorded)
    return synced


def count_releases(monkeypatch: pytest.MonkeyPatch, lock_file: str | os.PathLike[str]) -> list[str]:
    """List each time this process lets go of the flock on ``lock_file`` from now on.

    Only that file counts: a lock an earlier test left lingering may be let go of by the real
    reaper at any moment, and must not show up here."""
    watched = os.fspath(lock_file)
    released: list[str] = []
    real = _durable._Exclusive._release_file

    def counted(entry: _durable._Exclusive) -> None:
        if entry.path == watched:
            released.append(watched)
        real(entry)

    monkeypatch.setattr(_durable._Exclusive, "_release_file", counted)
    return released


class _Keeper:
    """A reaper that keeps what lingers (so the registry keeps it too) but never lets go."""

    def __init__(self) -> None:
        self.lingering: set[_durable._Exclusive] = set()

    def add(self, entry: _durable._Exclusive) -> None:
        self.lingering.add(entry)

    def forget(self, entry: _durable._Exclusive) -> None:
        self.lingering.discard(entry)


def keep_lingering(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on a lingering flock is let go of only by the next hold or ``release_lingering``
    (or ``close()``), never by the reaper: release what the test took before it ends."""
    monkeypatch.setattr(_durable, "_reaper", _Keeper())


def past_the_maximum_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on every plain hold of a lingering flock finds it held past the maximum (so it
    gives it away, without the yield's sleep) and no continuing hold does; the reaper lets
    nothing go, so only holds decide.  Release what the test took before it ends."""
    monkeypatch.setattr(_durable, "_LINGER_MAX", 0.0)
    monkeypatch.setattr(_durable, "_LINGER_YIELD", 0.0)
    monkeypatch.setattr(_durable, "_LINGER_MAX_CONTINUING", 3600.0)
    keep_lingering(monkeypatch)

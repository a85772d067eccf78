"""Intercepting the data syncs of ``adaptor._durable``, for fault-injection tests.

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


def count_datasyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Really sync, and list the descriptor of every sync made from now on."""
    calls: list[int] = []
    real = _durable._datasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    hook_datasyncs(monkeypatch, counted)
    return calls

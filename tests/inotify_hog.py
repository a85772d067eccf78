"""Use up this user's inotify instances, as a busy workstation's editors and watchers do."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path
from types import TracebackType

import pytest

_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
# Holding more descriptors than this would need a raised RLIMIT_NOFILE: skip instead.
_MOST_HELD = 900


class InotifyHog:
    """Holds inotify instances until the system refuses another one (``EMFILE``).

    The limit is per user, so every process of this user (a daemon the test starts, a client)
    is refused one until :meth:`release`.  The descriptors are this process's own: a killed
    test gives them back.  A test using it is marked ``alone``, so that no test running in
    parallel starts a watcher meanwhile (or frees an instance the test relies on being taken).
    """

    def __init__(self) -> None:
        self._fds: list[int] = []

    def __enter__(self) -> InotifyHog:
        try:
            limit = int(_LIMIT.read_text())
        except (OSError, ValueError):
            pytest.skip("no inotify here")
        if limit > _MOST_HELD:
            pytest.skip(f"fs.inotify.max_user_instances is {limit}: too many to hold")
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        while True:
            fd = libc.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                if ctypes.get_errno() != errno.EMFILE:
                    self.release()
                    raise OSError(ctypes.get_errno(), "inotify_init1 failed")
                break
            self._fds.append(fd)
        return self

    def release(self) -> None:
        while self._fds:
            os.close(self._fds.pop())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

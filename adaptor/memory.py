"""The in-process thread store: the :class:`adaptor.threadstore.Store` contract in memory.

Same state machine and same validation as :class:`adaptor.threadstore.JSONLStore`, so the two
behave identically; nothing survives the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from adaptor.threadstore import FinalizeRequest, Lease, Query, Record
from adaptor.threadstore._state import State, steady_clock
from adaptor.threadstore._types import (
    check_finalize,
    check_lease,
    check_text,
    check_ttl,
    record_from_json,
)

__all__ = ["Store"]

# Leases cannot outlive the process that holds this store, let alone a reboot.
_BOOT_ID = ""


class Store:
    """A thread store for one process; safe to share between threads."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # Leases also expire by the monotonic clock, which no step of the wall clock moves
        # (see adaptor.threadstore._state), unless the caller keeps time itself.
        self._steady = steady_clock(clock, lambda: "this process")
        self._state = State()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"memory.Store(records={len(self._state.records)})"

    def resolve(self, query: Query) -> Record | None:
        if not isinstance(query, Query):
            raise TypeError(f"expected a Query, not {type(query).__name__}")
        with self._lock:
            found = self._state.lookup(query)
            # Rebuilt from the stored JSON form: the caller gets a copy it may mutate freely.
            return None if found is None else record_from_json(found)

    def acquire_lease(self, target: str, owner: str, ttl: float) -> Lease:
        check_text("target", target)
        check_text("owner", owner)
        ttl = check_ttl(ttl)
        with self._lock:
            lease, event = self._state.plan_acquire(target, owner, ttl, self._clock(), _BOOT_ID, steady=self._steady())
            self._state.apply(event)
        return lease

    def renew_lease(self, lease: Lease, ttl: float) -> None:
        check_lease(lease)
        ttl = check_ttl(ttl)
        with self._lock:
            self._state.apply(self._state.plan_renew(lease, ttl, self._clock(), _BOOT_ID, steady=self._steady()))

    def release_lease(self, lease: Lease) -> None:
        check_lease(lease)
        with self._lock:
            event = self._state.plan_release(lease)
            if event is not None:
                self._state.apply(event)

    def finalize(self, request: FinalizeRequest) -> None:
        check_finalize(request)
        with self._lock:
            self._state.apply(self._state.plan_finalize(request, self._clock(), _BOOT_ID, self._steady()))

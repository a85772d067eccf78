"""The daemon's thread store: a ``JSONLStore`` that one failed write does not stop for good."""

from __future__ import annotations

import contextlib
import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from adaptor._durable import RepairReport
from adaptor.threadstore import FinalizeRequest, JSONLStore, Lease, Query, Record

T = TypeVar("T")


class ReopeningStore:
    """The store contract over ``JSONLStore(directory)``, opened afresh after a failed write.

    A ``JSONLStore`` whose write failed (a full disk, say) refuses every later write: only
    reading the files again can tell what reached them, and a new instance is what reads them
    again.  A daemon serves for weeks, so without this one full disk would fail every thread
    run until a restart.  The failing call still raises its error; the calls after it use a
    new instance, and a lease whose release failed is released through it (see
    ``adaptor._thread.release``).
    """

    def __init__(
        self,
        directory: Path,
        *,
        clock: Callable[[], float] = time.time,
        gone: Callable[[], str | None] = lambda: None,
        repaired: Callable[[RepairReport], None] = lambda report: None,
    ) -> None:
        self._directory = directory
        self._clock = clock
        # Why the folder is not the daemon's any more (its home removed or made again by
        # another daemon), if it is not: then nothing is read or written there.
        self._gone = gone
        # Told each crash artifact a write cut from the log, once (storage.md: writers record
        # that they did).
        self._repaired = repaired
        self._repairs_told: dict[JSONLStore, int] = {}
        self._store = JSONLStore(directory, clock=clock)
        self._swap = threading.Lock()
        # Replaced instances, closed with this one: a thread may still be inside one.
        self._retired: list[JSONLStore] = []

    def resolve(self, query: Query) -> Record | None:
        self._refuse_if_gone()
        return self._store.resolve(query)

    def keys(self) -> list[str]:
        """The thread keys with a conversation (see ``JSONLStore.keys``)."""
        self._refuse_if_gone()
        return self._store.keys()

    def acquire_lease(self, target: str, owner: str, ttl: float) -> Lease:
        return self._writing(lambda store: store.acquire_lease(target, owner, ttl))

    def renew_lease(self, lease: Lease, ttl: float) -> None:
        self._writing(lambda store: store.renew_lease(lease, ttl))

    def release_lease(self, lease: Lease) -> None:
        self._writing(lambda store: store.release_lease(lease))

    def finalize(self, request: FinalizeRequest) -> None:
        self._writing(lambda store: store.finalize(request))

    def close(self) -> None:
        with self._swap:
            stores, self._retired = [*self._retired, self._store], []
        if self._gone() is not None:
            # Closing takes the store's lock, whose file it would make in the folder now at
            # that path; the descriptors go with the instances (and the process).
            return
        for store in stores:
            with contextlib.suppress(Exception):
                store.close()

    def _refuse_if_gone(self) -> None:
        why = self._gone()
        if why is not None:
            raise OSError(errno.ENOENT, f"not this daemon's thread store any more: {why}", str(self._directory))

    def _writing(self, call: Callable[[JSONLStore], T]) -> T:
        self._refuse_if_gone()
        store = self._store
        try:
            return call(store)
        except OSError:
            self._reopen(store)
            raise
        finally:
            if store.repair_count:
                self._tell_repairs(store)

    def _tell_repairs(self, store: JSONLStore) -> None:
        with self._swap:
            told = self._repairs_told.get(store, 0)
            cut = store.repairs[told:]
            self._repairs_told[store] = told + len(cut)
        for report in cut:
            self._repaired(report)

    def _reopen(self, failed: JSONLStore) -> None:
        with self._swap:
            if self._store is not failed:
                return  # another thread's failure replaced it already
            try:
                fresh = JSONLStore(self._directory, clock=self._clock)
            except OSError:
                return  # the next failure tries again
            self._retired.append(failed)
            self._store = fresh

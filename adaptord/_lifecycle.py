"""The daemon's lifecycle log (``events/adaptord.jsonl``), group-committed off the request path."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from adaptor import events
from hosttools import sessionrecorder as sr


class LifecycleLog:
    """``events/<session>.jsonl`` for the daemon's own facts, written by one background thread.

    :meth:`record` queues a fact and returns at once.  The writer lingers ``linger`` seconds
    after the first fact of a batch, so it stays off the path of the request that caused the
    fact (it would compete for the GIL) and more facts share the batch; then it records the
    batch through a session recorder that does not sync per append, syncs once (group
    commit), and prints each fact's log line: whoever sees a line finds the record in the
    file.  Nothing is recovered from this log, so nobody waits for it; a power loss can lose
    the last facts not yet synced (the torn tail is repaired by the next append), never a
    request or a verdict.
    """

    def __init__(
        self,
        directory: Path,
        session: str,
        *,
        emit: Callable[[str], None],
        on_error: Callable[[str, BaseException], None],
        on_recovered: Callable[[], None] = lambda: None,
        linger: float = 0.005,
    ) -> None:
        sr.check_contained(session)
        self._directory = directory
        self._session = session
        self._recorder: sr.EventRecorder | None = None
        self._backend: sr.JSONLEventBackend | None = None
        self._emit = emit
        self._on_error = on_error
        self._on_recovered = on_recovered
        self._failing = False  # the last batch failed; reported once until one succeeds
        self._linger = linger
        self._pending: deque[tuple[events.Notice, str]] = deque()
        self._cond = threading.Condition()
        self._queued = 0
        self._done = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="adaptord-lifecycle", daemon=True)
        self._thread.start()

    def record(self, notice: events.Notice, line: str) -> None:
        """Queue ``notice`` for the log and ``line`` for stderr; never blocks on the disk."""
        with self._cond:
            self._pending.append((notice, line))
            self._queued += 1
            if len(self._pending) == 1:  # later facts join the lingering batch quietly
                self._cond.notify_all()

    def barrier(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is written, synced and its line printed."""
        with self._cond:
            target = self._queued
            self._cond.notify_all()  # cut the writer's linger short
            return self._cond.wait_for(lambda: self._done >= target or not self._thread.is_alive(), timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, sync, stop the writer and close the file."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        self._drop_recorder()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if not self._closing and self._linger > 0:
                    self._cond.wait(self._linger)  # woken early only by close or a barrier
                batch = list(self._pending)
                self._pending.clear()
                if not batch and self._closing:
                    return
            self._append([notice for notice, _ in batch])
            for _, line in batch:
                self._emit(line)
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _append(self, notices: list[events.Notice]) -> None:
        try:
            if self._recorder is None or self._backend is None:
                self._backend = sr.JSONLEventBackend(self._directory, sync_on_append=False)
                self._recorder = sr.EventRecorder(self._backend, key_validator=lambda key: None)
            for notice in notices:
                self._recorder.record(self._session, notice)
            self._backend.flush()
        except Exception as exc:  # the audit log must never take the daemon down
            # A backend that failed may refuse every later append (a failed fsync whose lines
            # could not be cut away poisons the key); the next batch starts afresh,
            # re-checking the file's tail first.
            self._drop_recorder()
            if not self._failing:  # a full disk fails every batch: one line, not hundreds
                self._failing = True
                self._on_error("audit log write failed", exc)
            return
        if self._failing:
            self._failing = False
            self._on_recovered()

    def _drop_recorder(self) -> None:
        recorder, self._recorder, self._backend = self._recorder, None, None
        if recorder is not None:
            with contextlib.suppress(Exception):
                recorder.close()

"""``MemoryEventBackend``: the same contract as the JSONL backend, kept in this process."""

from __future__ import annotations

import threading
from collections.abc import Generator
from datetime import datetime

import orjson

from adaptor.events import from_json, to_json

from ._model import EventRecord, JSONLEventBackendClosedError, SessionInfo


class MemoryEventBackend:
    """Records in a dict, for tests and short-lived hosts.  Nothing survives the process.

    Events are stored in their JSON form and rebuilt on load, exactly as a file would hand
    them back: a payload the JSONL backend cannot store fails here too, and a caller mutating
    an event's dicts after recording it cannot rewrite history.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, list[tuple[datetime, bytes]]] = {}
        self._closed = False

    def __repr__(self) -> str:
        return "MemoryEventBackend()"

    def load(self, key: str) -> Generator[EventRecord, None, None]:
        with self._lock:
            self._check_open()
            # A snapshot of references: records appended while the caller iterates are not
            # part of this load, as with a file read up to its size at the start.
            log = list(self._logs.get(key, ()))
        return self._rebuild(log)

    @staticmethod
    def _rebuild(
        log: list[tuple[datetime, bytes]],
    ) -> Generator[EventRecord, None, None]:
        for index, (recorded_at, data) in enumerate(log):
            yield EventRecord(index + 1, recorded_at, from_json(orjson.loads(data)["event"]))

    def append(self, key: str, record: EventRecord) -> EventRecord:
        if record.host_seq != 0:
            raise ValueError(f"the backend allocates host_seq; pass 0, not {record.host_seq}")
        # As a JSONL line holds it: inside the record's object (one level deeper, where
        # orjson's nesting limit applies) with its keys sorted.
        data = orjson.dumps({"event": to_json(record.event)}, option=orjson.OPT_SORT_KEYS)
        with self._lock:
            self._check_open()
            log = self._logs.setdefault(key, [])
            log.append((record.recorded_at, data))
            return EventRecord(len(log), record.recorded_at, record.event)

    def sessions(self) -> list[SessionInfo]:
        with self._lock:
            self._check_open()
            return [
                SessionInfo(key, len(log), log[-1][0]) for key, log in self._logs.items() if log
            ]

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise JSONLEventBackendClosedError(f"{self!r} is closed")

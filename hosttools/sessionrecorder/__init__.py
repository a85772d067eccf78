"""Durable per-session event recording (JSONL) and strict replay.

Public events are recorded under a host-chosen session key and read back by a cursor,
``host_seq``, that is 1, 2, 3, ... per key across any number of runs::

    from hosttools import sessionrecorder as sr

    recorder = sr.EventRecorder(sr.JSONLEventBackend(directory))
    rec = recorder.record("session-1", event)        # EventRecord(host_seq, recorded_at, event)
    recorder.since("session-1", after_host_seq=0)    # strictly greater, ascending
    recorder.sessions()                              # most recent first
    sr.tail(recorder, "session-1", 20); sr.range_(recorder, "session-1", 10, 20)
    recorder.close()

A JSONL log is one framed line per record (``adaptor._durable``)::

    {"crc":...,"event":{...},"host_seq":1,"kind":"text.content","meta":{...},
     "recorded_at":"2026-12-02T10:00:00.000000Z","v":1}

``event`` is ``adaptor.events.to_json(event)``; ``kind`` and ``meta`` repeat its fields for
``jq``.  Reading is strict: any bad line raises :class:`JSONLEventLogCorruptError` with its
1-based line; :func:`repair` cuts a torn tail (a crash artifact) and nothing else, and
:func:`verify` checks a whole file (both behind ``adaptor verify-log``).
"""

from __future__ import annotations

from ._format import repair, verify
from ._jsonl import JSONLEventBackend
from ._memory import MemoryEventBackend
from ._model import (
    KEY_PATTERN,
    EventBackend,
    EventRecord,
    InvalidSessionKeyError,
    JSONLEventBackendClosedError,
    JSONLEventLogCorruptError,
    SessionInfo,
    check_contained,
    default_key_validator,
)
from ._recorder import EventRecorder, KeyValidator, range_, tail

__all__ = [
    "KEY_PATTERN",
    "EventBackend",
    "EventRecord",
    "EventRecorder",
    "InvalidSessionKeyError",
    "JSONLEventBackend",
    "JSONLEventBackendClosedError",
    "JSONLEventLogCorruptError",
    "KeyValidator",
    "MemoryEventBackend",
    "SessionInfo",
    "check_contained",
    "default_key_validator",
    "range_",
    "repair",
    "tail",
    "verify",
]

# Public names report this package as their home (reprs, tracebacks, pickling, docs), not the
# private module that happens to define them.
for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and getattr(_obj, "__module__", "").startswith(__name__ + "."):
        _obj.__module__ = __name__
del _name, _obj

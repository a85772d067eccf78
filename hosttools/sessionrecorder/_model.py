"""Records, the backend protocol, the error classes and the key rules."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from adaptor.errors import AdaptorError
from adaptor.events import Event

_Str = (str,)


class InvalidSessionKeyError(AdaptorError):
    code = "sessionrecorder.ErrInvalidSessionKey"
    default_message = "invalid session key"


class JSONLEventBackendClosedError(AdaptorError):
    code = "sessionrecorder.ErrJSONLEventBackendClosed"
    default_message = "event backend is closed"


class JSONLEventLogCorruptError(AdaptorError):
    """The log for ``key`` is corrupt at 1-based ``line``.

    ``why`` is a short reason (``"bad crc"``, ``"torn tail: unterminated last line"``, ...).  It
    is a diagnostic, not part of the wire contract, so an error rebuilt from the wire has ``""``.
    """

    code = "sessionrecorder.ErrJSONLEventLogCorrupt"
    default_message = "event log is corrupt"
    _fields = {"key": _Str, "line": (int,)}

    why: str = ""

    def __init__(self, key: str, line: int, message: str = "", *, why: str = "") -> None:
        self.key = key
        self.line = line
        if why:
            self.why = why
        default = f"event log {key!r} is corrupt at line {line}"
        super().__init__(message or (f"{default}: {why}" if why else default))


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One recorded event.  ``host_seq`` is 1, 2, 3, ... per session key, across runs."""

    host_seq: int
    recorded_at: datetime
    event: Event


# EventRecord(host_seq, recorded_at, event) without the frozen __init__, which reaches every
# slot through object.__setattr__: the recorder makes two records per append and a replay one
# per line, and the slots' own setters take 3.8k instructions where the __init__ takes 6.0k.
_new_object = object.__new__
_slots = vars(EventRecord)
set_host_seq = _slots["host_seq"].__set__
set_recorded_at = _slots["recorded_at"].__set__
set_event = _slots["event"].__set__


def make_record(host_seq: int, recorded_at: datetime, event: Event) -> EventRecord:
    """``EventRecord(host_seq, recorded_at, event)``, trusted arguments, at less cost."""
    record: EventRecord = _new_object(EventRecord)
    set_host_seq(record, host_seq)
    set_recorded_at(record, recorded_at)
    set_event(record, event)
    return record


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session that has at least one record; ``updated_at`` is its last ``recorded_at``."""

    key: str
    last_host_seq: int
    updated_at: datetime


@runtime_checkable
class EventBackend(Protocol):
    """Where an :class:`~hosttools.sessionrecorder.EventRecorder` keeps records.

    ``append`` allocates ``host_seq`` itself (the argument carries ``0``): only the backend
    sees every writer of a key, including writers in other processes.  ``load`` yields a key's
    records in ``host_seq`` order (nothing for an unknown key) and may do so lazily.  After
    ``close`` every method raises :class:`JSONLEventBackendClosedError`; ``close`` itself is
    idempotent and reports the same outcome to every caller.
    """

    def load(self, key: str) -> Iterable[EventRecord]: ...

    def append(self, key: str, record: EventRecord) -> EventRecord: ...

    def sessions(self) -> list[SessionInfo]: ...

    def close(self) -> None: ...


KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
"""What :func:`default_key_validator` accepts (the whole key must match)."""


def _shown(key: str) -> str:
    # Keys come from hosts and may be huge; an error message should not be.
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


def default_key_validator(key: str) -> None:
    """Accept ``^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$``; raise :class:`InvalidSessionKeyError`."""
    # fullmatch rather than $: "$" also matches before a trailing newline.
    if not isinstance(key, str) or KEY_PATTERN.fullmatch(key) is None:
        raise InvalidSessionKeyError(
            f"invalid session key {_shown(key)}: expected 1-128 characters from "
            "[A-Za-z0-9_-], starting with a letter or digit"
        )


# The longest key whose lock file, ``<key>.jsonl.lock``, fits a file name (255 bytes on every
# common filesystem), counted in the bytes the filesystem sees (UTF-8 here).
_MAX_KEY_BYTES = 255 - len(".jsonl.lock")


def check_contained(key: str) -> None:
    """The JSONL backend's own check: ``<dir>/<key>.jsonl`` must name a file inside ``dir``.

    It runs whatever validator the recorder was given, so a permissive validator cannot turn a
    key into a path outside the directory, nor into a name no file can have (longer than
    244 bytes encoded, or not encodable at all).
    """
    if not isinstance(key, str):
        raise InvalidSessionKeyError(f"session key must be a string, not {type(key).__name__}")
    if (
        key in ("", ".", "..")
        or "/" in key
        or "\\" in key
        or "\0" in key
        or os.path.basename(key) != key
    ):
        raise InvalidSessionKeyError(f"session key {_shown(key)} cannot name a file")
    # A key a file name cannot hold failed deep in open() with a bare OSError (or a
    # UnicodeEncodeError), after since() had answered [] for some of those same keys.
    try:
        size = len(os.fsencode(key))
    except UnicodeEncodeError:
        raise InvalidSessionKeyError(
            f"session key {_shown(key)} cannot name a file: it cannot be encoded"
        ) from None
    if size > _MAX_KEY_BYTES:
        raise InvalidSessionKeyError(
            f"session key {_shown(key)} is too long to name a file: {size} bytes, "
            f"at most {_MAX_KEY_BYTES}"
        )

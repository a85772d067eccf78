"""Durable per-session event recording (JSONL) and strict replay."""

from __future__ import annotations

from adaptor.errors import AdaptorError

_Str = (str,)


class InvalidSessionKeyError(AdaptorError):
    code = "sessionrecorder.ErrInvalidSessionKey"
    default_message = "invalid session key"


class JSONLEventBackendClosedError(AdaptorError):
    code = "sessionrecorder.ErrJSONLEventBackendClosed"
    default_message = "event backend is closed"


class JSONLEventLogCorruptError(AdaptorError):
    """The log for ``key`` is corrupt at 1-based ``line``."""

    code = "sessionrecorder.ErrJSONLEventLogCorrupt"
    default_message = "event log is corrupt"
    _fields = {"key": _Str, "line": (int,)}

    def __init__(self, key: str, line: int, message: str = "") -> None:
        self.key = key
        self.line = line
        super().__init__(message or f"event log {key!r} is corrupt at line {line}")


__all__ = ["InvalidSessionKeyError", "JSONLEventBackendClosedError", "JSONLEventLogCorruptError"]

"""The A2A client (extra ``adaptor[a2a]``).

The error identities live here and import nothing optional, so verdicts carrying them decode
without ``a2a-sdk`` installed.
"""

from __future__ import annotations

from adaptor.errors import AdaptorError

_Str = (str,)
_OptStr = (str, type(None))


class InvalidAgentCardError(AdaptorError):
    code = "a2a.ErrInvalidAgentCard"
    default_message = "invalid agent card"


class ProtocolError(AdaptorError):
    """A malformed response, part or event.  ``raw`` is sanitized: it never holds credentials."""

    code = "a2a.ErrProtocol"
    default_message = "A2A protocol error"
    _fields = {"op": _Str, "reason": _Str, "raw": _OptStr}

    def __init__(
        self, op: str, reason: str, cause: BaseException | None = None, raw: str | None = None
    ) -> None:
        self.op = op
        self.reason = reason
        self.raw = raw
        super().__init__(f"A2A {op}: {reason}", cause=cause)


class UnauthorizedError(AdaptorError):
    code = "a2a.ErrUnauthorized"
    default_message = "the remote agent refused the credentials"


class NotFoundError(AdaptorError):
    code = "a2a.ErrNotFound"
    default_message = "task not found"


class UnsupportedError(AdaptorError):
    code = "a2a.ErrUnsupported"
    default_message = "operation not supported by the remote agent"


class UntrustedOriginError(AdaptorError):
    code = "a2a.ErrUntrustedOrigin"
    default_message = "credentials would cross an untrusted origin"


class StreamRecoveryError(AdaptorError):
    """A stream dropped before its final event and the task could not be recovered."""

    code = "a2a.StreamRecoveryError"
    default_message = "stream could not be recovered"
    _fields = {"task_id": _Str}

    def __init__(self, task_id: str, cause: BaseException | None = None) -> None:
        self.task_id = task_id
        super().__init__(f"stream for task {task_id!r} could not be recovered", cause=cause)

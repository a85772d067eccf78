"""The thread store contract and the durable JSONL store."""

from __future__ import annotations

from adaptor.errors import AdaptorError

_Str = (str,)


class BusyError(AdaptorError):
    """Another owner holds the lease on ``target``."""

    code = "threadstore.ErrBusy"
    exit_code = 75
    default_message = "lease is held by another owner"
    _fields = {"target": _Str}

    def __init__(self, target: str) -> None:
        self.target = target
        super().__init__(f"lease on {target!r} is held by another owner")


class LeaseLostError(AdaptorError):
    code = "threadstore.ErrLeaseLost"
    exit_code = 4
    default_message = "lease lost"
    _fields = {"target": _Str}

    def __init__(self, target: str) -> None:
        self.target = target
        super().__init__(f"lease on {target!r} was lost")


class AlreadyExistsError(AdaptorError):
    code = "threadstore.ErrAlreadyExists"
    exit_code = 4
    default_message = "key already has an active record"
    _fields = {"key": _Str}

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"key {key!r} already has an active record")


__all__ = ["AlreadyExistsError", "BusyError", "LeaseLostError"]

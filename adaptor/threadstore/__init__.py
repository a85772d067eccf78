"""The thread store contract and the durable JSONL store.

A store persists what a stateful Thread needs to resume: one :class:`Record` per provider
session (checkpoint plus compatibility fingerprints), the key index that points a host thread
key at its active record, and leases that keep two runs off one thread.  It is not chat history.

Two implementations share one state machine and pass one contract suite:
:class:`JSONLStore` (plain files, safe across processes, crash-safe) and
:class:`adaptor.memory.Store` (one process).
"""

from __future__ import annotations

from adaptor import _durable
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


class CorruptLogError(_durable.CorruptLogError):
    """A store file is damaged where no crash explains it: ``path``, 1-based ``line``, ``why``.

    Not a Thread error (errors.md lists none for it): an infrastructure failure, which the
    wire form writes as ``external`` with this public name as its ``type``.  Every store
    call raises this class, never the durable layer's base class it specializes.
    """


# Imported after the error classes: the submodules raise them and import them from here.
from adaptor.threadstore._jsonl import JSONLStore  # noqa: E402
from adaptor.threadstore._types import (  # noqa: E402
    FinalizeRequest,
    Lease,
    Query,
    Record,
    Status,
    Store,
)

__all__ = [
    "AlreadyExistsError",
    "BusyError",
    "CorruptLogError",
    "FinalizeRequest",
    "JSONLStore",
    "Lease",
    "LeaseLostError",
    "Query",
    "Record",
    "Status",
    "Store",
]

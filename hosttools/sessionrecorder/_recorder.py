"""``EventRecorder`` and the query helpers that work over any recorder."""

from __future__ import annotations

import collections
import dataclasses
import operator
import sys
import threading
from collections.abc import Callable, Generator, Iterable
from datetime import UTC, datetime
from types import GeneratorType, TracebackType

from adaptor import _options
from adaptor.events import ApprovalRequest, Event, _Event

from . import _format
from ._model import (
    EventBackend,
    EventRecord,
    InvalidSessionKeyError,
    JSONLEventBackendClosedError,
    SessionInfo,
    default_key_validator,
    make_record,
)

KeyValidator = Callable[[str], None]
_KEYS_REMEMBERED = 4096


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _descriptive(event: Event) -> Event:
    # A recorded approval request must never be able to answer the live one: drop the responder
    # from the copy that goes to the backend and back to the caller.
    if isinstance(event, ApprovalRequest) and event._responder is not None:
        return dataclasses.replace(event, _responder=None)
    return event


class EventRecorder:
    """Records public events under host-chosen session keys; reads them back by ``host_seq``.

    ``host_seq`` is allocated by the backend (1, 2, 3, ... per key, across runs and processes
    for the JSONL backend), so a cursor taken from one run stays valid in the next.

    ``key_validator`` replaces :func:`default_key_validator`; it raises to reject a key (any
    exception becomes :class:`InvalidSessionKeyError`).  ``clock`` stamps ``recorded_at`` and
    must return aware datetimes.
    """

    def __init__(
        self,
        backend: EventBackend,
        key_validator: KeyValidator | None = None,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not _options.provides(backend, EventBackend):
            # A directory given as is failed at the first record(), as an AttributeError.
            raise TypeError(
                "backend must be an event backend, e.g. JSONLEventBackend(directory) or "
                f"MemoryEventBackend(), not {type(backend).__name__}"
            )
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        if key_validator is not None and not callable(key_validator):
            # Said now: the first record() would only say "'int' object is not callable".
            raise TypeError(f"key_validator must be callable, not {type(key_validator).__name__}")
        self._backend = backend
        self._validate = key_validator or default_key_validator
        # Keys the default validator accepted already: checking one again is a set lookup.
        self._accepted_keys: set[str] = set()
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._close_error: tuple[BaseException, TracebackType | None] | None = None

    def __repr__(self) -> str:
        return f"EventRecorder({self._backend!r})"

    @property
    def backend(self) -> EventBackend:
        return self._backend

    def record(self, key: str, event: Event) -> EventRecord:
        """Append ``event`` to ``key``'s history and return it as recorded.

        On any failure nothing is recorded and nothing advances: a retry gets the same
        ``host_seq`` the failed attempt would have had.
        """
        if type(key) is not str or key not in self._accepted_keys:
            self._check_key(key)
            self._remember_key(key)
        self._check_open()
        if not isinstance(event, _Event):
            # Said here: the encoder deep down would only say "must be called with a dataclass".
            raise TypeError(f"event must be an adaptor.events event, not {type(event).__name__}")
        unreadable = _format.unreadable(event)
        if unreadable is not None:
            # Written, it made every later record of the key unreadable (the reader refuses it).
            raise ValueError(f"event cannot be recorded: {unreadable}")
        moment = self._clock()
        if not isinstance(moment, datetime):
            raise TypeError(f"the recorder's clock must return a datetime, not {type(moment).__name__}")
        if moment.tzinfo is not UTC:
            # (A tzinfo that gives no offset makes a naive datetime too, which astimezone()
            # would read as the host's local time.)
            if moment.tzinfo is None or moment.utcoffset() is None:
                raise ValueError("the recorder's clock returned a naive datetime; it must be aware")
            moment = moment.astimezone(UTC)
        draft = make_record(0, moment, _descriptive(event))
        return self._backend.append(key, draft)

    def _remember_key(self, key: str) -> None:
        # Only the default validator is known to give the same answer every time.
        if self._validate is default_key_validator:
            if len(self._accepted_keys) >= _KEYS_REMEMBERED:
                self._accepted_keys.clear()
            self._accepted_keys.add(key)

    def iter_since(self, key: str, after_host_seq: int = 0) -> Generator[EventRecord, None, None]:
        """Stream ``key``'s records with ``host_seq > after_host_seq``, ascending.

        The key and the recorder's state are checked now; records are read as the caller
        iterates, in constant memory.  Every record is validated, including those skipped.
        """
        self._check_key(key)
        self._check_open()
        after_host_seq = _cursor("after_host_seq", after_host_seq)
        if after_host_seq < 0:
            raise ValueError(f"after_host_seq must be >= 0, not {after_host_seq}")
        records = self._backend.load(key)
        if after_host_seq == 0 and isinstance(records, GeneratorType):
            # Every record, from a generator the caller can close: no filter to run each through.
            return records
        return _after(records, after_host_seq)

    def since(self, key: str, after_host_seq: int = 0) -> list[EventRecord]:
        """``key``'s records with ``host_seq > after_host_seq`` (0: all), ascending."""
        return list(self.iter_since(key, after_host_seq))

    def sessions(self) -> list[SessionInfo]:
        """Sessions with at least one record, most recently updated first.

        Keys this recorder's validator rejects (stray files in a JSONL directory) are left
        out, so every key listed can be passed back to :meth:`since`.
        """
        self._check_open()
        infos = [info for info in self._backend.sessions() if self._accepts(info.key)]
        infos.sort(key=lambda info: info.key)
        infos.sort(key=lambda info: info.updated_at, reverse=True)  # stable: ties by key
        return infos

    def close(self) -> None:
        """Close the backend, once.  Idempotent; its error is raised to every caller."""
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._backend.close()
                except Exception as exc:
                    self._close_error = (exc, exc.__traceback__)
            if self._close_error is not None:
                error, traceback = self._close_error
                raise error.with_traceback(traceback)

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise JSONLEventBackendClosedError("event recorder is closed")

    def _check_key(self, key: str) -> None:
        if not isinstance(key, str):
            raise InvalidSessionKeyError(f"session key must be a string, not {type(key).__name__}")
        try:
            self._validate(key)
        except InvalidSessionKeyError:
            raise
        except Exception as exc:
            raise InvalidSessionKeyError(f"invalid session key: {exc}", cause=exc) from exc

    def _accepts(self, key: str) -> bool:
        try:
            self._check_key(key)
        except InvalidSessionKeyError:
            return False
        return True


def _after(records: Iterable[EventRecord], after: int) -> Generator[EventRecord, None, None]:
    iterator = iter(records)
    try:
        for record in iterator:
            if record.host_seq > after:
                yield record
    finally:
        # Closing early must release the backend's file now, not whenever GC gets to it.
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _cursor(name: str, value: int) -> int:
    # A host_seq or a count is an integer: "3" or 2.5 must not be compared (or sliced) as one.
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return operator.index(value)


def tail(recorder: EventRecorder, key: str, n: int) -> list[EventRecord]:
    """The last ``n`` records of ``key`` (fewer if it has fewer), ascending."""
    n = _cursor("n", n)
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    records = recorder.iter_since(key)
    if n == 0:
        records.close()
        return []
    # (A deque's length is a C ssize_t: no log holds more records than that anyway.)
    return list(collections.deque(records, maxlen=min(n, sys.maxsize)))


def range_(recorder: EventRecorder, key: str, after: int, to: int) -> list[EventRecord]:
    """Records with ``after < host_seq <= to``, ascending.

    Reading stops at ``to``: lines past it are not read, so damage there goes unnoticed here
    (it is never skipped within the range returned).
    """
    after, to = _cursor("after", after), _cursor("to", to)
    for name, value in (("after", after), ("to", to)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, not {value}")
    records = recorder.iter_since(key, after)
    out: list[EventRecord] = []
    try:
        for record in records:
            if record.host_seq > to:
                break
            out.append(record)
    finally:
        records.close()
    return out

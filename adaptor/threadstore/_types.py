"""Value types of the thread store contract, their validation and their JSON form.

The JSON form is the one both stores share: the JSONL store writes it to disk and the memory
store keeps it in its maps, so a value round-trips through exactly the same code in both and
every resolve returns a fresh copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from adaptor.driver import SessionState

__all__ = [
    "FinalizeRequest",
    "Lease",
    "Query",
    "Record",
    "Status",
    "Store",
]

Status = Literal["active", "archived"]
_STATUSES: tuple[Status, ...] = ("active", "archived")
# Ten years: far beyond any sane lease, well inside what datetime can represent.
MAX_TTL = 10 * 365 * 86400.0


@dataclass(frozen=True)
class Record:
    """One persisted session of a thread: its resume checkpoint and compatibility fingerprints.

    ``id`` is the SDK session id (stable for the life of the session); ``key`` is the host's
    thread key.  Several records may carry one key over time; the key index points at the
    active one.  Timestamps must be timezone-aware; the stores keep them in UTC.
    """

    id: str
    key: str
    status: Status
    driver_type: str
    agent: str
    fingerprint: str
    compatibility_fingerprint: str
    session_codec: str
    state: SessionState | None
    created_at: datetime
    updated_at: datetime

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status must be 'active' or 'archived', not {self.status!r}")
        for name in ("created_at", "updated_at"):
            value = getattr(self, name)
            if not isinstance(value, datetime):
                raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
            # A naive time means a different instant on every machine that reads it back.
            if value.utcoffset() is None:
                raise ValueError(f"{name} must be timezone-aware")


@dataclass(frozen=True)
class Query:
    """Look a record up by ``id`` or by ``key`` (exactly one); archived records stay hidden
    unless ``include_archived``."""

    id: str | None = None
    key: str | None = None
    include_archived: bool = False

    def __post_init__(self) -> None:
        if (self.id is None) == (self.key is None):
            raise ValueError("Query needs exactly one of id and key")
        if self.id is not None:
            check_text("Query.id", self.id)
        else:
            check_text("Query.key", self.key)


@dataclass(frozen=True)
class Lease:
    """A granted lease.  ``token`` is ``"<generation>-<random hex>"``: the generation is the
    fencing number, strictly greater for every new grant the store makes."""

    target: str
    owner: str
    token: str

    @property
    def generation(self) -> int:
        """The fencing generation encoded in :attr:`token`."""
        head, sep, _ = self.token.partition("-")
        if not sep or not (head.isascii() and head.isdigit()):
            raise ValueError(f"token {self.token!r} does not encode a generation")
        return int(head)


@dataclass(frozen=True)
class FinalizeRequest:
    """One atomic commit: save ``record``, optionally archive ``previous_id`` and point ``key``
    at ``record.id``, provided every lease in ``held_leases`` is still held.

    Fork is a finalize with the new key and ``require_key_absent=True``; the parent is not
    touched.
    """

    record: Record
    previous_id: str | None = None
    key: str = ""
    held_leases: tuple[Lease, ...] = ()
    archive_old: bool = False
    rebind_active: bool = False
    require_key_absent: bool = False


@runtime_checkable
class Store(Protocol):
    """What the Thread layer needs from a store: checkpoints, the key index and leases."""

    def resolve(self, query: Query) -> Record | None:
        """The record, or ``None`` when missing (or archived and not asked for)."""
        ...

    def acquire_lease(self, target: str, owner: str, ttl: float) -> Lease:
        """Grant or extend the lease on ``target``; :class:`BusyError` if another owner holds it."""
        ...

    def renew_lease(self, lease: Lease, ttl: float) -> None:
        """Extend a held lease; :class:`LeaseLostError` unless it is still held and unexpired."""
        ...

    def release_lease(self, lease: Lease) -> None:
        """Give a lease up; a lease that is no longer held is ignored."""
        ...

    def finalize(self, request: FinalizeRequest) -> None:
        """Commit ``request`` atomically (:class:`LeaseLostError`, :class:`AlreadyExistsError`)."""
        ...


# --- validation (shared so both stores reject exactly the same input) -------------------------


def check_text(name: str, value: object, *, allow_empty: bool = False) -> str:
    if type(value) is str and value.isascii() and (value or allow_empty):
        return value  # the usual case, decided without encoding (isascii reads a flag)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate cannot be written as JSON; refuse it before anything is changed.
        raise ValueError(f"{name} is not valid Unicode text") from None
    return value


def check_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    if not (math.isfinite(ttl) and 0 < ttl <= MAX_TTL):
        raise ValueError(f"ttl must be a positive number of seconds up to ten years, not {ttl!r}")
    return float(ttl)


def check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise TypeError(f"expected a Lease, not {type(lease).__name__}")
    check_text("Lease.target", lease.target)
    check_text("Lease.owner", lease.owner)
    check_text("Lease.token", lease.token, allow_empty=True)
    return lease


def _check_record(record: object) -> Record:
    if not isinstance(record, Record):
        raise TypeError(f"FinalizeRequest.record must be a Record, not {type(record).__name__}")
    check_text("Record.id", record.id)
    check_text("Record.key", record.key, allow_empty=True)
    for name in (
        "driver_type",
        "agent",
        "fingerprint",
        "compatibility_fingerprint",
        "session_codec",
    ):
        check_text(f"Record.{name}", getattr(record, name), allow_empty=True)
    state = record.state
    if state is not None:
        if not isinstance(state, SessionState):
            raise TypeError(f"Record.state must be a SessionState, not {type(state).__name__}")
        check_text("SessionState.resume_id", state.resume_id, allow_empty=True)
        check_text("SessionState.display_id", state.display_id, allow_empty=True)
        if not isinstance(state.data, Mapping):
            raise TypeError("SessionState.data must be a mapping of str to str")
        for k, v in state.data.items():
            check_text("SessionState.data key", k, allow_empty=True)
            check_text(f"SessionState.data[{k!r}]", v, allow_empty=True)
    return record


def check_finalize(request: object) -> FinalizeRequest:
    """Reject a malformed request with ``TypeError``/``ValueError`` before any lease check."""
    if not isinstance(request, FinalizeRequest):
        raise TypeError(f"expected a FinalizeRequest, not {type(request).__name__}")
    record = _check_record(request.record)
    if request.previous_id is not None:
        check_text("FinalizeRequest.previous_id", request.previous_id)
    key = check_text("FinalizeRequest.key", request.key, allow_empty=True)
    if not isinstance(request.held_leases, tuple | list):
        raise TypeError("FinalizeRequest.held_leases must be a tuple of Lease")
    for lease in request.held_leases:
        check_lease(lease)
    if (request.rebind_active or request.require_key_absent) and not key:
        raise ValueError("rebind_active and require_key_absent need a key")
    # Binding a key to a record filed under another key would make resolve(key=...) return a
    # record whose key disagrees with the query; that is always a caller bug.
    if key and key != record.key:
        raise ValueError(f"FinalizeRequest.key {key!r} differs from record.key {record.key!r}")
    if request.archive_old and request.previous_id == record.id:
        raise ValueError("archive_old would archive the record being saved")
    return request


# --- JSON form --------------------------------------------------------------------------------


def format_time(value: datetime) -> str:
    """UTC, microseconds, ``Z``: sorts as text and reads the same everywhere."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(text: object) -> datetime:
    if not isinstance(text, str) or not text.endswith("Z"):
        raise ValueError(f"bad timestamp {text!r}")
    return datetime.fromisoformat(text)


def time_of(clock_value: float) -> datetime:
    return datetime.fromtimestamp(clock_value, tz=UTC)


def record_to_json(record: Record) -> dict[str, Any]:
    return {
        "id": record.id,
        "key": record.key,
        "status": record.status,
        "driver_type": record.driver_type,
        "agent": record.agent,
        "fingerprint": record.fingerprint,
        "compatibility_fingerprint": record.compatibility_fingerprint,
        "session_codec": record.session_codec,
        "state": None if record.state is None else record.state.to_json(),
        "created_at": format_time(record.created_at),
        "updated_at": format_time(record.updated_at),
    }


def _text_field(obj: Mapping[str, Any], name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        raise ValueError(f"record field {name!r} is not a string")
    return value


_RECORD_TEXT_FIELDS = (
    "id",
    "key",
    "driver_type",
    "agent",
    "fingerprint",
    "compatibility_fingerprint",
    "session_codec",
)


def check_record_json(obj: object) -> None:
    """Raise ``ValueError`` exactly when :func:`record_from_json` would, building nothing.

    Every process replays the records other processes committed; a ``Record`` (frozen
    dataclass, ``SessionState``, two datetimes) per replayed record would cost more than
    parsing its line, and the replay only needs to know that a later resolve cannot fail.
    """
    if not isinstance(obj, Mapping):
        raise ValueError("record is not an object")
    try:
        state = obj["state"]
        # Anything else SessionState.from_json accepts: it applies str() to every value.
        if state is not None and not (
            isinstance(state, Mapping) and isinstance(state.get("data", {}), Mapping)
        ):
            raise ValueError("record state is not an object")
        status = obj["status"]
        if status not in _STATUSES:
            raise ValueError(f"bad record status {status!r}")
        for name in _RECORD_TEXT_FIELDS:
            _text_field(obj, name)
        for name in ("created_at", "updated_at"):
            # Record.__post_init__ refuses a naive time; a "Z" suffix normally rules it out.
            if parse_time(obj[name]).utcoffset() is None:
                raise ValueError(f"{name} must be timezone-aware")
    except KeyError as exc:
        raise ValueError(f"record is missing {exc.args[0]!r}") from None


def record_from_json(obj: object) -> Record:
    """Rebuild a record; ``ValueError`` for anything :func:`record_to_json` cannot have made."""
    check_record_json(obj)
    assert isinstance(obj, Mapping)
    state = obj["state"]
    return Record(
        id=obj["id"],
        key=obj["key"],
        status=obj["status"],
        driver_type=obj["driver_type"],
        agent=obj["agent"],
        fingerprint=obj["fingerprint"],
        compatibility_fingerprint=obj["compatibility_fingerprint"],
        session_codec=obj["session_codec"],
        state=None if state is None else SessionState.from_json(state),
        created_at=parse_time(obj["created_at"]),
        updated_at=parse_time(obj["updated_at"]),
    )

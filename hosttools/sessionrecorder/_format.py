"""The record line, its strict streaming reader, and the file-level ``verify`` and ``repair``.

Framing (crc, the ``host_seq`` sequence, torn tails) is :mod:`adaptor._durable`'s; this module
adds what a line must mean to be an event record, and reads a log only up to the size it had
when no append was in flight, so a reader racing a writer never mistakes the writer's half-done
line for a torn tail.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import typing
from collections.abc import Generator, Iterator
from datetime import datetime
from typing import IO, Any, Literal, TypeAlias

from adaptor import _durable
from adaptor._durable import CorruptLogError, RepairReport, exclusive, unframe
from adaptor.events import format_time, from_json, parse_time, to_json

from ._model import EventRecord, JSONLEventLogCorruptError

StrPath: TypeAlias = "str | os.PathLike[str]"

SEQ_KEY = "host_seq"
FORMAT_VERSION = 1
SUFFIX = ".jsonl"

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BLOCK = 64 * 1024
# Marks a reason as a crash artifact that repair() may cut; see replay().
_TORN = "torn tail: "


def encode(event_record: EventRecord) -> dict[str, Any]:
    """The record as DurableLog appends it (it adds ``v``, ``host_seq`` and ``crc``).

    ``kind`` and ``meta`` are repeated at the top level so ``jq 'select(.kind == ...)'`` and
    friends need not reach into ``event``.
    """
    event = to_json(event_record.event)
    return {
        "recorded_at": format_time(event_record.recorded_at),
        "kind": event["kind"],
        "meta": event["meta"],
        "event": event,
    }


class _LineError(Exception):
    """A line is bad; ``framing`` when the crc/sequence layer (which a crash can tear) failed."""

    def __init__(self, why: str, *, framing: bool) -> None:
        super().__init__(why)
        self.why = why
        self.framing = framing


def _framed(raw: bytes, expected: int | None) -> dict[str, Any]:
    """Check what :mod:`adaptor._durable` checks, with the same verdict on what is torn."""
    if not raw.endswith(b"\n"):
        raise _LineError("unterminated last line", framing=True)
    if raw == b"\n":
        raise _LineError("empty line", framing=True)
    try:
        obj = unframe(raw)
    except ValueError as exc:
        raise _LineError(str(exc), framing=True) from None
    seq = obj.get(SEQ_KEY)
    # bool is an int subclass; true must not pass for host_seq 1.
    if type(seq) is not int:
        raise _LineError(
            f"missing {SEQ_KEY}" if seq is None else f"bad {SEQ_KEY}: {seq!r}", framing=True
        )
    if expected is not None and seq != expected:
        if seq > expected:
            why = f"{SEQ_KEY} gap: expected {expected}, got {seq}"
        elif seq == expected - 1:
            why = f"duplicate {SEQ_KEY} {seq}"
        else:
            why = f"{SEQ_KEY} went backwards: expected {expected}, got {seq}"
        raise _LineError(why, framing=True)
    return obj


def _recorded_at(obj: dict[str, Any]) -> datetime:
    text = obj.get("recorded_at")
    if text is None:
        raise _LineError("missing recorded_at", framing=False)
    try:
        if not isinstance(text, str):
            raise TypeError
        moment = parse_time(text)
    except (TypeError, ValueError):
        raise _LineError(f"bad recorded_at: {text!r:.80}", framing=False) from None
    if moment.tzinfo is None:
        raise _LineError(f"recorded_at has no time zone: {text!r:.80}", framing=False)
    return moment


def _meaning(obj: dict[str, Any]) -> EventRecord:
    version = obj.get("v", FORMAT_VERSION)
    if type(version) is not int or version != FORMAT_VERSION:
        raise _LineError(f"unsupported format version {version!r:.40}", framing=False)
    recorded_at = _recorded_at(obj)
    for name in ("kind", "event"):
        if name not in obj:
            raise _LineError(f"missing {name}", framing=False)
    kind, payload = obj["kind"], obj["event"]
    if not isinstance(payload, dict):
        raise _LineError("event is not an object", framing=False)
    # The top-level copies exist for jq users; a line where they disagree with the event itself
    # was edited or written by something else, and which copy is right cannot be known.
    if kind != payload.get("kind"):
        raise _LineError(f"kind {kind!r:.80} does not match the event's kind", framing=False)
    if "meta" in obj and obj["meta"] != payload.get("meta"):
        raise _LineError("meta does not match the event's meta", framing=False)
    try:
        event = from_json(payload)
    except Exception as exc:  # from_json's decoders raise whatever hostile input provokes
        raise _LineError(f"bad event: {exc}", framing=False) from None
    for name, allowed in _literal_fields(type(event)).items():
        value = getattr(event, name)
        if value not in allowed:
            # from_json takes e.g. "text.sideways" as a TextDelta with phase "sideways"; no
            # writer of this format produces that, so the line is not an event we know.
            raise _LineError(f"bad event: {kind} has {name}={value!r:.80}", framing=False)
    return EventRecord(obj[SEQ_KEY], recorded_at, event)


_LITERALS: dict[type, dict[str, tuple[object, ...]]] = {}


def _literal_fields(cls: type) -> dict[str, tuple[object, ...]]:
    """The event class's fields typed ``Literal[...]``, with their allowed values."""
    found = _LITERALS.get(cls)
    if found is None:
        try:
            # The events module imports Responder for type checking only.
            hints = typing.get_type_hints(cls, localns={"Responder": object})
        except Exception:
            hints = {}  # an annotation we cannot resolve: from_json's own checks must do
        found = _LITERALS[cls] = {
            f.name: typing.get_args(hints[f.name])
            for f in dataclasses.fields(cls)
            if typing.get_origin(hints.get(f.name)) is Literal
        }
    return found


def decode(raw: bytes, expected: int) -> EventRecord:
    """One raw line (with its newline) that must carry ``host_seq == expected``."""
    return _meaning(_framed(raw, expected))


# ---------------------------------------------------------------------------------------------
# Reading


def open_log(path: StrPath) -> IO[bytes]:
    """Open for reading without following a symlink (``FileNotFoundError`` passes through)."""
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    return os.fdopen(fd, "rb", buffering=_BLOCK)


def settled_size(f: IO[bytes], path: StrPath) -> int | None:
    """The file's size at an instant when no DurableLog append was in flight.

    ``None`` (read to the end) when the file never had a writer lock next to it, so no writer
    following the protocol can be racing us.  Checking first keeps a read-only look at a copied
    log from creating a lock file.
    """
    lock = os.fspath(path) + ".lock"
    if not os.path.exists(lock):
        return None
    with exclusive(lock):
        return os.fstat(f.fileno()).st_size


def _lines(f: IO[bytes], limit: int | None) -> Iterator[bytes]:
    if limit is None:
        yield from iter(f.readline, b"")
        return
    while limit > 0:
        raw = f.readline(limit)
        if not raw:
            return  # shorter than the snapshot: a torn tail was cut meanwhile
        limit -= len(raw)
        yield raw


def replay(f: IO[bytes], key: str, limit: int | None) -> Generator[EventRecord, None, None]:
    """Decode every line strictly; the first bad one raises :class:`JSONLEventLogCorruptError`.

    One line of lookahead tells a bad *last* line whose framing failed (what a crash mid-append
    leaves, and what a writer would cut) from corruption; the former's ``why`` says "torn tail".
    Memory is bounded by the two longest adjacent lines, not by the file.
    """
    lines = _lines(f, limit)
    expected = 1
    raw = next(lines, b"")
    while raw:
        upcoming = next(lines, b"")
        try:
            record = decode(raw, expected)
        except _LineError as exc:
            why = _TORN + exc.why if exc.framing and not upcoming else exc.why
            raise JSONLEventLogCorruptError(key, expected, why=why) from None
        yield record
        raw = upcoming
        expected += 1


def load(path: str, key: str) -> Generator[EventRecord, None, None]:
    """Stream ``key``'s records from ``path``; a missing file is an empty history."""
    try:
        f = open_log(path)
    except FileNotFoundError:
        return
    with f:
        yield from replay(f, key, settled_size(f, path))


def _tail_lines(fd: int, size: int) -> list[bytes]:
    """The last two lines of the file (the final one possibly unterminated), read backwards."""
    chunks: list[bytes] = []
    pos = size
    newlines = 0
    # A third newline closes the line before the last two, so both are then complete.
    while pos > 0 and newlines < 3:
        start = max(0, pos - _BLOCK)
        chunk = os.pread(fd, pos - start, start)
        if len(chunk) != pos - start:
            break  # the file shrank under us; what we have is still a tail
        chunks.append(chunk)
        newlines += chunk.count(b"\n")
        pos = start
    parts = b"".join(reversed(chunks)).split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    if pos > 0:
        lines = lines[1:]  # cut by the block boundary
    return lines[-2:]


def last_record(path: str, key: str) -> tuple[int, datetime] | None:
    """``(host_seq, recorded_at)`` of the last record, from the file's tail alone.

    A torn last line is passed over, as the next writer will cut it.  Anything else odd at the
    tail falls back to a strict replay, which raises with the exact line.
    """
    try:
        f = open_log(path)
    except FileNotFoundError:
        return None
    with f:
        lines = _tail_lines(f.fileno(), os.fstat(f.fileno()).st_size)
        try:
            found: dict[str, Any] | None = None
            if len(lines) == 2:
                found = _framed(lines[0], None)
            if lines:
                with contextlib.suppress(_LineError):
                    found = _framed(lines[-1], found[SEQ_KEY] + 1 if found else 1)
            return None if found is None else (found[SEQ_KEY], _recorded_at(found))
        except _LineError:
            pass
        f.seek(0)
        for last in collections.deque(replay(f, key, settled_size(f, path)), maxlen=1):
            return last.host_seq, last.recorded_at
        return None


# ---------------------------------------------------------------------------------------------
# File-level tools


def key_of(path: StrPath) -> str:
    """The session key a log file belongs to: its base name without ``.jsonl``."""
    name = os.path.basename(os.fspath(path))
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) and len(name) > len(SUFFIX) else name


def verify(path: StrPath) -> int:
    """Strictly replay the log at ``path`` and return its record count.

    Raises :class:`JSONLEventLogCorruptError` (with the 1-based line) for any bad line, a torn
    tail included; ``FileNotFoundError`` when there is no file (verifying nothing is a mistake,
    unlike loading a session that never recorded anything).  A writer appending concurrently is
    waited for, not reported.
    """
    name = os.fspath(path)
    with open_log(name) as f:
        count = 0
        for _ in replay(f, key_of(name), settled_size(f, name)):
            count += 1
        return count


def repair(path: StrPath) -> RepairReport | None:
    """Cut a torn tail from the log at ``path``; return what was cut, or ``None``.

    Only a last line whose framing is broken (unterminated, bad JSON or crc, wrong
    ``host_seq``), which is what a crash mid-append leaves, is cut, under the writers' lock.
    Any other problem, including a well-framed last line that is not a valid record, raises
    :class:`JSONLEventLogCorruptError` and leaves the file untouched.  A missing file is
    ``None``.
    """
    name = os.fspath(path)
    key = key_of(name)
    try:
        verify(name)
    except FileNotFoundError:
        return None
    except JSONLEventLogCorruptError as exc:
        if not exc.why.startswith(_TORN):
            raise
    else:
        return None
    try:
        # Re-checks under the lock: a writer may have cut the tail (and appended) meanwhile.
        return _durable.repair(name, seq_key=SEQ_KEY)
    except CorruptLogError as exc:
        raise JSONLEventLogCorruptError(key, exc.line, why=exc.why) from exc

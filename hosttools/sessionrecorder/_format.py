"""The record line, its strict streaming reader, and the file-level ``verify`` and ``repair``.

Framing (crc, the ``host_seq`` sequence, torn tails) is :mod:`adaptor._durable`'s; this module
adds what a line must mean to be an event record, and reads a log only up to the size it had
when no append was in flight, so a reader racing a writer never mistakes the writer's half-done
line for a torn tail.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import io
import os
import stat
import typing
from collections.abc import Generator, Iterator, Sequence
from datetime import datetime
from itertools import repeat
from operator import itemgetter, methodcaller, setitem
from typing import IO, Any, Literal, TypeAlias

from orjson import dumps as _dumps
from orjson import loads as _loads

from adaptor import _durable
from adaptor import events as _events
from adaptor._durable import CorruptLogError, RepairReport, crc32, unframe
from adaptor.events import from_json, parse_time, to_json

from ._model import (
    EventRecord,
    JSONLEventLogCorruptError,
    make_record,
    set_event,
    set_host_seq,
    set_recorded_at,
)

StrPath: TypeAlias = "str | os.PathLike[str]"

SEQ_KEY = "host_seq"
FORMAT_VERSION = 1
SUFFIX = ".jsonl"

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
        "recorded_at": _stamp(event_record.recorded_at),
        "kind": event["kind"],
        "meta": event["meta"],
        "event": event,
    }


# format_time, byte for byte, at a fraction of strftime's cost (once per append).
_stamp = _events._format_time_fast


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
    if "v" not in obj:
        raise _LineError("missing v", framing=False)
    version = obj["v"]
    if type(version) is not int or version != FORMAT_VERSION:
        raise _LineError(f"unsupported format version {version!r:.40}", framing=False)
    recorded_at = _recorded_at(obj)
    for name in ("kind", "meta", "event"):
        if name not in obj:
            raise _LineError(f"missing {name}", framing=False)
    kind, payload = obj["kind"], obj["event"]
    if not isinstance(payload, dict):
        raise _LineError("event is not an object", framing=False)
    if "meta" not in payload:
        raise _LineError("missing the event's meta", framing=False)
    # The top-level copies exist for jq users; a line where they disagree with the event itself
    # was edited or written by something else, and which copy is right cannot be known.
    if kind != payload.get("kind"):
        raise _LineError(f"kind {kind!r:.80} does not match the event's kind", framing=False)
    if obj["meta"] != payload["meta"]:
        raise _LineError("meta does not match the event's meta", framing=False)
    try:
        event = from_json(payload)
    except Exception as exc:  # from_json's decoders raise whatever hostile input provokes
        raise _LineError(f"bad event: {exc}", framing=False) from None
    stray = _stray_literal(event)
    if stray is not None:
        # from_json takes e.g. "text.sideways" as a TextDelta with phase "sideways"; no writer
        # of this format produces that (the recorder refuses it), so the line is not an event
        # we know.
        raise _LineError(f"bad event: {kind} has {stray[0]}={stray[1]!r:.80}", framing=False)
    return EventRecord(obj[SEQ_KEY], recorded_at, event)


def unreadable(event: _events.Event) -> str | None:
    """Why a reader would refuse ``event`` once written (a ``Literal`` field holding a value
    its type does not list: ``TextDelta(phase="delta")``; a meta sequence that is no
    integer), or ``None``.  Refused before it is
    written: every later record of its key would be unreadable after it."""
    sequence = event.meta.sequence
    if not isinstance(sequence, int):  # the reader takes it as int(...): "7x", None, nan fail
        return f"{type(event).__name__}.meta.sequence is {sequence!r:.80}, not an integer"
    stray = _stray_literal(event)
    if stray is None:
        return None
    name, value, allowed = stray
    return f"{type(event).__name__}.{name} is {value!r:.80}, none of {', '.join(map(repr, allowed))}"


def _stray_literal(event: _events.Event) -> tuple[str, object, tuple[object, ...]] | None:
    for name, allowed in _literal_fields(type(event)).items():
        value = getattr(event, name)
        if value not in allowed:
            return name, value, allowed
    return None


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
# Decoding fast
#
# _quick_decode() is the line-by-line shortcut (for the lines of a batch _quick_batch() below
# does not take, in replay() and verify()): it makes decode()'s checks on the
# same parsed object, in the same terms, but only along the path a line this format's writer
# produced takes (the crc read off the raw text, the canonical meta, an event kind with a
# recipe in adaptor.events), and builds the record without the general decoder's overhead.
# Whenever a line strays from that path the answer is None and decode() gives the verdict, so
# errors and their wording are decode()'s alone; a None is never a verdict.
# tests/test_sessionrecorder.py checks both agree on random logs and their corruptions.


_crc32 = crc32
_CRC_OF_BRACE = crc32(b"{")
_MAX_SHAPES = 4096  # kinds are a small set; a hostile log full of made-up ones must not grow this


def _crc_ok(rest: bytes, crc: int) -> bool:
    """Whether ``b"{" + rest`` minus its final newline has CRC-32 ``crc``.

    CRC-32 runs over the bytes in order, so the crc of the text with its newline is the crc of
    the text carried on over one more byte, b"\\n"; and carrying on over a fixed byte maps
    distinct values to distinct values, so comparing the two is comparing the crcs of the text
    alone -- without copying the line to cut its newline off.
    """
    return _crc32(rest, _CRC_OF_BRACE) == _crc32(b"\n", crc)


_new = object.__new__
_fromiso = datetime.fromisoformat
_adopt_event = _events._adopt_from_json
# Per kind, the (attribute, allowed values) checks _meaning() makes on top of from_json, or
# None when they fail for every event of the kind ("text.sideways") or cannot be modelled.
_CHECKS: dict[str, tuple[tuple[str, tuple[object, ...]], ...] | None] = {}
_NOT_YET: Any = object()  # a sentinel: _CHECKS has no entry yet


def _kind_checks(kind: object) -> tuple[tuple[str, tuple[object, ...]], ...] | None:
    if type(kind) is not str:
        return None
    try:
        found = _events._kind_class(kind)
        checks: tuple[tuple[str, tuple[object, ...]], ...] | None = None
        if found is not None:
            cls, folded_name, folded_value = found
            literals = _literal_fields(cls)
            if folded_name not in literals or folded_value in literals[folded_name]:
                checks = tuple(
                    (name, allowed) for name, allowed in literals.items() if name != folded_name
                )
    except Exception:
        checks = None
    if len(_CHECKS) < _MAX_SHAPES:
        _CHECKS[kind] = checks
    return checks


def _quick_decode(line: bytes, expected: int) -> EventRecord | None:
    """``decode(line, expected)`` when this can tell it returns; else None ("ask it").

    ``line`` ends with its newline, which orjson reads as trailing whitespace.
    """
    try:
        obj = _loads(line)
        crc = obj["crc"]  # a TypeError unless obj is a dict (orjson makes no subclasses)
        if type(crc) is not int:
            return None
        # unframe()'s crc_matches_text(), inlined (see _crc_ok()).
        head = b'{"crc":%d,' % crc
        if not line.startswith(head) or not _crc_ok(line[len(head) :], crc):
            return None
        seq = obj[SEQ_KEY]
        if seq != expected or type(seq) is not int:
            return None
        version = obj["v"]
        if version != FORMAT_VERSION or type(version) is not int:
            return None
        text = obj["recorded_at"]
        if type(text) is not str:
            return None
        recorded_at = _fromiso(text.replace("Z", "+00:00"))  # parse_time, inlined
        if recorded_at.tzinfo is None:
            return None
        kind = obj["kind"]
        payload = obj["event"]
        if type(payload) is not dict or payload["kind"] != kind:
            return None
        if obj["meta"] != payload["meta"]:
            return None
        checks = _CHECKS.get(kind, _NOT_YET)
        if checks is _NOT_YET:
            checks = _kind_checks(kind)
        if checks is None:
            return None
        event = _adopt_event(kind, payload)  # payload is ours: the event may keep it
        if event is None:
            return None
        for name, allowed in checks:
            if getattr(event, name) not in allowed:
                return None
    except Exception:
        return None
    return make_record(seq, recorded_at, event)


# A whole batch at once
#
# Even _quick_decode() spends most of its time in the interpreter, one bytecode at a time.
# _quick_batch() makes the same checks column by column over a batch of lines, with map() and
# C-level comparisons doing the per-line work, and builds the records the same way.  It is
# all or nothing: any line that is not plainly a good record (a check fails, an exception, a
# kind without a recipe or with extra checks) makes it return None before anything is built,
# and the caller goes line by line, where decode() has the last word.

_NL = repeat(b"\n")


def _orjson_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """``tuple(keys)``, as the very objects orjson's key cache mostly hands back when parsing
    them, so that comparing and looking them up is mostly comparing pointers."""
    found: tuple[str, ...] = tuple(_loads(_dumps(dict.fromkeys(keys, 0))))
    return found


# The record's keys and the meta's, in the order a canonical (sorted-key) line has them.
_RECORD_KEYS = _orjson_keys(["crc", "event", SEQ_KEY, "kind", "meta", "recorded_at", "v"])
_META_KEYS = _orjson_keys(["run_id", "sequence", "thread_key", "time", "turn_id"])
_get_record = itemgetter(*_RECORD_KEYS)
_get_meta_fields = itemgetter(*_META_KEYS)
_FIVE = {5}
# What orjson writes for a list of ints (bool is "true", a float has "." or "e", an int past 64
# bits is an error) is made of these bytes only, with one "[" per list: a nested list of ints
# passes the first test alone, so _all_ints() makes both.
_INT_TEXT = b"-0123456789,[]"


def _all_ints(text: bytes, lists: int) -> bool:
    """Whether ``text``, orjson's text of ``lists`` lists, holds nothing but ints in them."""
    return not text.translate(None, _INT_TEXT) and text.count(b"[") == lists


_get_sequence_or_0 = methodcaller("get", "sequence", 0)
_get_time_or_empty = methodcaller("get", "time", "")


def _parse_stamps(stamps: Sequence[str]) -> list[datetime] | None:
    """``list(map(parse_time, stamps))`` when every stamp ends in its only "Z", else None.

    That is the layout format_time() writes, and for it ``datetime.fromisoformat`` (which reads
    a trailing "Z" as UTC since Python 3.11) returns what parse_time() does, without
    parse_time's copy of each string.  Checked over one joined string, so per stamp the cost is
    a few bytes scanned: n - 1 NULs in all mean no stamp holds one, so the NULs are exactly
    the joins; then n "Z"s in all and n - 1 "Z\0" pairs plus a final "Z" mean each stamp's
    only "Z" is its last character.  (A stamp holding a NUL must be ruled out by the count:
    fromisoformat() takes "...Z\0Z", which parse_time() refuses.)  A stamp of any other shape
    is not a verdict either way: the batch is left to the line-by-line path (an exception,
    like None, means just that).
    """
    n = len(stamps)
    joined = "\0".join(stamps)  # a TypeError unless every stamp is a str
    if (
        joined.count("\0") != n - 1
        or joined.count("Z") != n
        or joined.count("Z\0") != n - 1
        or not joined.endswith("Z")
    ):
        return None
    return list(map(_fromiso, stamps))


# operator.setitem takes the fast call path; dict.__setitem__ and dict.update would
# each build an argument tuple per line.
_setitem = setitem
_INT = {int}
_DICT = {dict}
_MAX_BATCH_KINDS = 64  # per batch; past that, line by line


class _BatchKind(typing.NamedTuple):
    """What _quick_batch() needs of one event kind (a tuple, so a batch's transpose is cheap)."""

    keys: tuple[str, ...]  # the event's keys once "kind" is popped, as a canonical line has them
    cls: type
    folded_name: str  # the folded field, set on the event's dict (or "meta", see below)
    folded_value: Any
    requires: bool  # from_json needs some key to be present


_BATCH_KINDS: dict[str, _BatchKind | None] = {}


def _batch_kind(kind: object) -> _BatchKind | None:
    """How to build ``kind`` in a batch; None when only the line-by-line path may decide."""
    if type(kind) is not str:
        return None
    found: _BatchKind | None = _BATCH_KINDS.get(kind, _NOT_YET)
    if found is not _NOT_YET:
        return found
    checks = _CHECKS.get(kind, _NOT_YET)
    if checks is _NOT_YET:
        checks = _kind_checks(kind)
    recipe = _events._recipe(kind) if checks == () else None  # no checks beyond the keys
    found = None
    if recipe is not None:
        # A kind without a folded field "folds" a placeholder meta, which the real one
        # replaces: one setitem per line, with no per-line test of which lines fold.
        [(folded_name, folded_value)] = recipe.fixed.items() or [("meta", None)]
        # The batch pops the JSON "kind" off every event; a class with a field of that name
        # gets it back as its folded field (the only way such a class has a recipe).
        if recipe.drop_kind or folded_name == "kind":
            keys = _orjson_keys(sorted(recipe.allowed - {"kind"}))
            found = _BatchKind(keys, recipe.cls, folded_name, folded_value, bool(recipe.required))
    if len(_BATCH_KINDS) < _MAX_SHAPES:
        _BATCH_KINDS[kind] = found
    return found


# The instance-dict setters of the classes the batch builds (their own __dict__ descriptors,
# which object.__setattr__ would find through the class on every call).
_set_meta_dict = vars(_events.EventMeta)["__dict__"].__set__
_set_event_dict = vars(_events._Event)["__dict__"].__set__
_partition = bytes.partition
_COMMA = repeat(b",")
# Lines' heads as the writer makes them, joined with NULs (which no valid JSON text holds).
_HEAD = b'{"crc":'
_NEXT_HEAD = b'\0{"crc":'
_pop = dict.pop  # a TypeError unless given a dict
_getitem = dict.__getitem__
_KIND = repeat("kind")
_META = repeat("meta")


def _quick_batch(lines: list[bytes], expected: int, build: bool) -> list[EventRecord] | None:
    """``[decode(line, expected + i) ...]`` when plainly valid, else None.

    With ``build=False`` only the checks are made (``verify``) and the list is empty.  The
    parsed objects are changed along the way (the events' kinds are popped), which is harmless
    when the answer is None: the line-by-line path parses the lines again.
    """
    n = len(lines)
    if not n:
        return []
    if not lines[-1].endswith(b"\n"):
        return None  # an unterminated last line (only the last can be): decode() says which
    try:
        objs = list(map(_loads, lines))
        # Every key the checks read, one tuple per line (a TypeError unless each is a dict,
        # a KeyError if one lacks any; decode() says which is missing).
        crcs, payloads, seqs, kinds, top_metas, stamps, versions = zip(
            *map(_get_record, objs), strict=True
        )
        crc_text = _dumps(crcs)  # "[<crc>,<crc>,...]", each as b"%d" writes it if an int
        if not _all_ints(crc_text + _dumps(seqs + versions), 2):
            return None
        # Framing: unframe()'s crc_matches_text() and the host_seq sequence.  Split at the
        # first comma, a line is b'{"crc":<crc>' and the text the crc covers (bar its "{");
        # the heads, joined, are compared with all the crcs' text at once (no head holds a
        # NUL, as valid JSON holds none, so the joined texts are equal only head by head).
        heads, _, texts = zip(*map(_partition, lines, _COMMA), strict=True)
        if b"\0".join(heads) != _HEAD + crc_text[1:-1].replace(b",", _NEXT_HEAD):
            return None
        # _crc_ok(), a column at a time.
        if list(map(_crc32, texts, repeat(_CRC_OF_BRACE))) != list(map(_crc32, _NL, crcs)):
            return None
        if seqs != tuple(range(expected, expected + n)):
            return None
        # The record, as _meaning() checks it.
        if versions.count(FORMAT_VERSION) != n:
            return None
        # (A stamp ending in "Z" parses aware or not at all: no tz check needed.)
        moments = _parse_stamps(stamps)
        if moments is None:
            return None
        # The event's kind and meta (a TypeError unless the event is a dict, a KeyError if it
        # lacks either); the kind is popped, as no event class keeps the JSON kind as it is.
        event_kinds = tuple(map(_pop, payloads, _KIND))
        metas = tuple(map(_getitem, payloads, _META))
        if event_kinds != kinds or top_metas != metas:
            return None
        # The event: a kind with a recipe (so nothing to check beyond keys and meta).
        distinct = set(kinds)
        if len(distinct) > _MAX_BATCH_KINDS:
            return None
        how = {}
        for kind in distinct:
            found = _batch_kind(kind)
            if found is None:
                return None
            how[kind] = found
        if build or any(found.requires for found in how.values()):
            # Built events adopt the parsed dicts, so they must be exactly what to_json
            # writes: every key and no other, and the meta _events._quick_meta() accepts
            # (five keys; str, int, str, non-empty str, str).
            # One column per _BatchKind field, each with a value per line.
            keys, classes, names, values, _ = zip(*map(how.__getitem__, kinds), strict=True)
            if tuple(map(tuple, payloads)) != keys:
                return None
            # Five keys, and these five (a TypeError or KeyError for anything but such a dict;
            # their order does not matter, as _events._adopt_from_json() takes any).
            if set(map(len, metas)) != _FIVE:
                return None
            run_ids, sequences, thread_keys, times, turn_ids = zip(
                *map(_get_meta_fields, metas), strict=True
            )
            "".join(run_ids + thread_keys + turn_ids)  # a TypeError unless all are str
            if not _all_ints(_dumps(sequences), 1):
                return None  # (bool is an int subclass, and int() would turn True into 1)
        else:
            # Only a verdict: these kinds' from_json ignores extra keys, defaults missing
            # ones and passes values through, so only the meta can make it fail: a sequence
            # int() refuses or a time parse_time() refuses.  (str() takes anything.)
            if set(map(type, metas)) != _DICT:
                return None
            if set(map(type, map(_get_sequence_or_0, metas))) != _INT:
                return None
            times = tuple(map(_get_time_or_empty, metas))
        # (An empty or non-str time is not a stamp _parse_stamps() takes.)
        meta_times = _parse_stamps(times)
    except Exception:
        return None
    if meta_times is None:
        return None
    if not build:
        return []
    # Everything checked; build as _events._adopt_from_json() does, taking the parsed dicts.
    any(map(_setitem, payloads, names, values))  # the folded field, before the meta
    any(map(_setitem, metas, repeat("time"), meta_times))
    event_metas = list(map(_new, repeat(_events.EventMeta, n)))
    any(map(_set_meta_dict, event_metas, metas))
    any(map(_setitem, payloads, repeat("meta"), event_metas))
    events: list[Any] = list(map(_new, classes))
    any(map(_set_event_dict, events, payloads))
    records = list(map(_new, repeat(EventRecord, n)))
    any(map(set_host_seq, records, seqs))
    any(map(set_recorded_at, records, moments))
    any(map(set_event, records, events))
    return records


# ---------------------------------------------------------------------------------------------
# Reading


def open_log(path: StrPath) -> IO[bytes]:
    """Open a regular file for reading, never through a symlink nor waiting on a FIFO
    (:func:`adaptor._durable.open_for_read`; ``FileNotFoundError`` passes through)."""
    return _durable.open_for_read(path)


def open_stream(path: StrPath) -> IO[bytes] | None:
    """``path`` opened to be read once, as it comes, when it is a pipe or a device
    (``<(zcat x.jsonl.gz)``, /dev/stdin); ``None`` when it is a regular file.

    No writer of this format appends to a pipe, so there is no lock to wait for and nothing to
    reopen; a regular file is opened with :func:`open_log`.  ``FileNotFoundError`` passes
    through.
    """
    if stat.S_ISREG(os.stat(path).st_mode):
        return None
    return open(path, "rb", buffering=_BLOCK)


def settled_size(f: IO[bytes], path: StrPath) -> int | None:
    """The file's size at an instant when no DurableLog append was in flight.

    ``None`` (read to the end) when the file never had a writer lock next to it, or has a
    symbolic link in its place (which writers never follow: they refuse to append), so no
    writer following the protocol can be racing us.  Checking first keeps a read-only look at a
    copied log from creating a lock file.  (Only a log's readers read past such a link: the
    thread store refuses a store whose lock is one, as its writers would.)
    """
    lock = os.fspath(path) + ".lock"
    try:
        found = os.lstat(lock)
    except OSError:
        return None
    if stat.S_ISLNK(found.st_mode):
        return None
    # A lock file this reader may not write (an archive on a read-only mount, logs shared
    # read-only, an immutable file) is flocked through a read-only descriptor, as the writers
    # flock it, so an append in flight by a writer who may write it is still waited out.
    with _durable.held_to_read(lock):
        return os.fstat(f.fileno()).st_size


_CHUNK = 64 * 1024  # big enough to amortize the loop, small enough to keep replay light


def _batches(f: IO[bytes], limit: int | None) -> Iterator[tuple[list[bytes], bool]]:
    """The file's lines, a chunk at a time: ``(lines, more_follows)``.

    ``lines`` are in file order, each with its newline except possibly the file's very last
    line; ``more_follows`` says whether any byte follows the batch's last line (what tells a
    torn tail from corruption), which is why each batch is held back until the next chunk has
    been read.  At most ``limit`` bytes are read.  Memory is bounded by about two chunks plus
    the longest line, not by the file.
    """
    pending: list[bytes] | None = None
    partial: list[bytes] = []  # a line longer than a chunk, kept as pieces to join once
    remaining = limit
    while True:
        if remaining is None:
            chunk = f.read(_CHUNK)
        elif remaining > 0:
            chunk = f.read(min(_CHUNK, remaining))
            remaining -= len(chunk)
        else:
            chunk = b""
        if not chunk:  # end of file, or of the snapshot (shorter if a torn tail was cut)
            rest = b"".join(partial)
            if pending is not None:
                yield pending, bool(rest)
            if rest:
                yield [rest], False
            return
        if pending is not None:
            yield pending, True
            pending = None
        if b"\n" not in chunk:
            partial.append(chunk)
            continue
        # readlines() finds newlines with memchr; bytes.split() tests byte by byte.
        reader = io.BytesIO(chunk)  # shares the chunk's bytes: no copy
        if partial:
            # Only the line the chunk completes is joined; the rest is read in place.
            end = chunk.index(b"\n") + 1
            partial.append(chunk[:end])
            first = b"".join(partial)
            partial.clear()
            reader.seek(end)
            lines = reader.readlines()
            lines.insert(0, first)
        else:
            lines = reader.readlines()
        if not lines[-1].endswith(b"\n"):
            partial.append(lines.pop())
        pending = lines


def replay(f: IO[bytes], key: str, limit: int | None) -> Generator[EventRecord, None, None]:
    """Decode every line strictly; the first bad one raises :class:`JSONLEventLogCorruptError`.

    A bad *last* line whose framing failed (what a crash mid-append leaves, and what a writer
    would cut) is told from corruption by whether anything follows it; the former's ``why``
    says "torn tail".  Memory is bounded by a couple of chunks and the longest line.
    """
    for records in _record_batches(f, key, limit):
        yield from records


def _record_batches(f: IO[bytes], key: str, limit: int | None) -> Iterator[list[EventRecord]]:
    """:func:`replay`'s records a batch at a time (its callers yield them one by one, which
    costs a replay one generator level per record less than delegating to :func:`replay`)."""
    expected = 1
    for lines, more in _batches(f, limit):
        records = _quick_batch(lines, expected, True)
        if records is None:
            records, failure = _line_by_line(lines, expected, key, more)
            if failure is not None:
                yield records  # the good records before a bad line are still delivered first
                raise failure
        yield records
        expected += len(records)


def _line_by_line(
    lines: list[bytes], expected: int, key: str, more: bool
) -> tuple[list[EventRecord], JSONLEventLogCorruptError | None]:
    """A batch _quick_batch() would not take: its records up to the first bad line, if any."""
    records: list[EventRecord] = []
    last = len(lines) - 1
    for index, line in enumerate(lines):
        record = _quick_decode(line, expected + index) if line.endswith(b"\n") else None
        if record is None:
            try:
                record = decode(line, expected + index)
            except _LineError as exc:
                is_last = index == last and not more
                return records, _corrupt(key, expected + index, exc, is_last=is_last, raw=line)
        records.append(record)
    return records, None


def count_valid(f: IO[bytes], key: str, limit: int | None) -> int:
    """What ``sum(1 for _ in replay(...))`` returns, with the same errors, but faster.

    Batches are checked by :func:`_quick_batch` without building event objects, and the lines of
    a batch it does not take by :func:`_quick_decode`; any line they are not sure of goes
    through :func:`decode`, which either accepts it after all or raises the exact error
    :func:`replay` would.
    """
    expected = 1
    for lines, more in _batches(f, limit):
        if _quick_batch(lines, expected, False) is not None:
            expected += len(lines)
            continue
        first = expected
        for line in lines:
            if not (line.endswith(b"\n") and _quick_decode(line, expected) is not None):
                try:
                    decode(line, expected)
                except _LineError as exc:
                    is_last = expected - first == len(lines) - 1 and not more
                    raise _corrupt(key, expected, exc, is_last=is_last, raw=line) from None
            expected += 1
    return expected - 1


def _corrupt(
    key: str, line: int, exc: _LineError, *, is_last: bool, raw: bytes
) -> JSONLEventLogCorruptError:
    why = exc.why
    if exc.framing and is_last:
        # The same verdict as the writer's: only what a crash can leave is a torn tail.
        why = _TORN + why if _durable.may_be_torn(raw) else _durable.not_torn(why, raw)
    return JSONLEventLogCorruptError(key, line, why=why)


def load(path: str, key: str) -> Generator[EventRecord, None, None]:
    """Stream ``key``'s records from ``path``; a missing file is an empty history."""
    try:
        f = open_log(path)
    except FileNotFoundError:
        return
    with f:
        for records in _record_batches(f, key, settled_size(f, path)):
            yield from records


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
                try:
                    found = _framed(lines[-1], found[SEQ_KEY] + 1 if found else 1)
                except _LineError:
                    if not _durable.may_be_torn(lines[-1]):
                        raise  # corruption: the strict replay below names it
            # The whole record, not its time alone: a key listed must be one since() reads.
            return None if found is None else (found[SEQ_KEY], _meaning(found).recorded_at)
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
    text = os.fspath(path)
    if isinstance(text, bytes):  # (verify and repair name the log's key: both look here first)
        raise TypeError("a log's path must be a str or a str path, not bytes")
    name = os.path.basename(text)
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) and len(name) > len(SUFFIX) else name


def verify(path: StrPath) -> int:
    """Strictly replay the log at ``path`` and return its record count.

    Raises :class:`JSONLEventLogCorruptError` (with the 1-based line) for any bad line, a torn
    tail included; ``FileNotFoundError`` when there is no file (verifying nothing is a mistake,
    unlike loading a session that never recorded anything).  A writer appending concurrently is
    waited for, not reported.  A symlink is followed (reading cannot be redirected into harm,
    unlike writing); a pipe or device is read to its end.
    """
    name = os.fspath(path)
    key_of(name)  # (a bytes path: said first, as what it is)
    stream = open_stream(name)
    if stream is not None:
        with stream:
            return count_valid(stream, key_of(name), None)
    # A reader may follow a symlink (writers never do): the file it names is checked, under
    # that file's own writers' lock.
    name = os.path.realpath(name)
    with open_log(name) as f:
        return count_valid(f, key_of(name), settled_size(f, name))


def repair(path: StrPath) -> RepairReport | None:
    """Cut a torn tail from the log at ``path``; return what was cut, or ``None``.

    Only a last line whose framing is broken (unterminated, bad JSON or crc, wrong
    ``host_seq``) and that :func:`adaptor._durable.may_be_torn` (what a crash mid-append
    leaves), is cut, under the writers' lock.  Any other problem, including a well-framed last
    line that is not a valid record or a line that is no record of ours at all, raises
    :class:`JSONLEventLogCorruptError` and leaves the file untouched.  A missing file is
    ``None``.  As with :func:`verify`, a symlink is followed: the file it names is repaired.
    A pipe, a device or a folder cannot be cut: it raises ``OSError`` (``EINVAL``) at once,
    without reading it.
    """
    name = os.fspath(path)
    key_of(name)  # (a bytes path: said first, as what it is)
    # Looked at through the path as given: realpath() cannot name a pipe (/dev/stdin gives
    # "/proc/.../pipe:[123]", which does not exist).
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        # verify() would read a pipe to its end (it is gone then) and the cut would fail.
        raise _durable.ForeignFileError(
            errno.EINVAL, "is not a regular file: only a regular file can be repaired", name
        )
    # The file a symlink names, as verify() checks it: the user named that file.
    name = os.path.realpath(name)
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

"""The one JSON-lines protocol helper every CLI driver's parser builds on.

Both CLIs print one JSON object per stdout line.  The rules shared by every parser (reference
§2.0 step 8) live here so they cannot drift apart:

- blank lines are ignored; stdout lines that do not start with ``{`` are the CLI talking outside
  its protocol and become ``stdout`` transcript items; stderr lines become ``stderr`` items;
- a line that starts with ``{`` but does not parse as a JSON object, a line the stream cut
  short, or any formal event after the terminal one marks the protocol **malformed**, which
  blocks the checkpoint and fails the run unless a more specific failure exists;
- every transcript item is emitted through the sink at the moment it is appended, so the items
  emitted equal ``Response.transcript`` in order.
"""

from __future__ import annotations

import dataclasses
import io
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

import orjson

from adaptor.driver import DecisionRequest, DecisionResponse, EventSink, RunFailure
from adaptor.result import TranscriptItem

__all__ = [
    "Decoded",
    "FailureKind",
    "NullSink",
    "Protocol",
    "as_dict",
    "as_int",
    "as_list",
    "as_str",
    "decode",
    "died_as",
    "lean",
    "line_text",
    "provider_failure",
    "split_lines",
]

_T = TypeVar("_T")

FailureKind = Literal["auth", "rate_limit", "provider_unavailable", "quota", "model_not_found",
                      "context_too_long", ""]
_RETRYABLE: Final = frozenset({"rate_limit", "provider_unavailable"})

# How much of a bad line a diagnostic may quote: enough to recognise it, never a whole payload.
_QUOTE: Final = 80

# Terminal escapes (colours and cursor moves, titles and links) some CLIs print even to a pipe:
# quoted in a message they are noise in a log, and cut short they leave a terminal coloured.
_ESCAPES: Final = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[0-Z\\-_])"
)
# The words of a line that says why a process stopped, among banners and backtraces.
_REASON: Final = re.compile(r"error|panic|fatal", re.IGNORECASE)


@dataclass(frozen=True)
class Decoded:
    kind: Literal["event", "text", "blank", "malformed"]
    event: dict[str, Any] | None = None
    text: str = ""


def decode(line: str | bytes) -> Decoded:
    """Classify one stdout line (without its newline)."""
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    stripped = data.strip()
    if not stripped:
        return Decoded("blank")
    text = line_text(stripped)
    if not stripped.startswith(b"{"):
        return Decoded("text", text=text)
    try:
        value = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        value = _loads_mended(stripped)
        if value is None:
            return Decoded("malformed", text=text)
    if not isinstance(value, dict):
        return Decoded("malformed", text=text)
    return Decoded("event", event=value, text=text)


# In a JSON string: an escaped backslash, a surrogate pair, or a lone surrogate escape.
_SURROGATE_ESCAPES: Final = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)


def _mend_surrogate(match: re.Match[bytes]) -> bytes:
    escape = match.group()
    return b"\\ufffd" if len(escape) == 6 else escape


def _loads_mended(data: bytes) -> Any:
    """``data`` parsed after what orjson refuses but JSON allows is mended; None if still not
    JSON.  Bytes that are not UTF-8 are no JSON at all and stay refused.

    A model makes both: a lone surrogate in its text, which a Node CLI writes as the escape
    ``\\ud800`` (it becomes U+FFFD), and a value nested deeper than the :data:`_READ_DEPTH`
    levels orjson reads (tool arguments, structured output; cut at that depth).  Refused, the
    line would be malformed: a terminal event lost, and the run failed though the CLI did
    nothing wrong.
    """
    if b"\\u" in data:
        data = _SURROGATE_ESCAPES.sub(_mend_surrogate, data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" not in str(exc):
            return None
    try:
        return orjson.loads(_cut_deep(data, _READ_DEPTH))
    except orjson.JSONDecodeError:
        return None


# The deepest arrays and objects orjson reads.
_READ_DEPTH: Final = 1024
# A JSON string (which may hold brackets) or a bracket.
_JSON_TOKENS: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _cut_deep(data: bytes, limit: int) -> bytes:
    """``data`` with each array or object below ``limit`` levels replaced by the string the
    daemon's records use for such a value (see ``_nesting.copy``)."""
    note = f'"<nested deeper than {limit} levels: not kept>"'.encode()
    parts: list[bytes] = []
    kept_from = 0
    cut_at = -1
    level = 0
    for token in _JSON_TOKENS.finditer(data):
        bracket = token.group()
        if bracket in (b"[", b"{"):
            level += 1
            if level == limit + 1:
                cut_at = token.start()
        elif bracket in (b"]", b"}"):
            if level == limit + 1 and cut_at >= 0:
                parts += (data[kept_from:cut_at], note)
                kept_from = token.end()
                cut_at = -1
            level -= 1
    parts.append(data[kept_from:])
    return b"".join(parts)


def split_lines(blob: bytes) -> Iterator[bytes]:
    """The lines ``blob.splitlines()`` finds (each ends at ``\\n``, ``\\r`` or ``\\r\\n``), each
    perhaps still ending in its ``\\n``: for a caller that takes the whitespace around a line
    for nothing, as :func:`decode` does.

    Without a ``\\r`` in ``blob`` (the usual output) the lines are read one at a time from a
    ``BytesIO``, which finds each newline with ``memchr``: several times faster than
    ``splitlines``, which tests every byte.  They are made as they are read, not all at once:
    a caller that is done with each line before the next (a parser) keeps reusing the same
    memory, and no list of every line is left for the garbage collector to walk.
    """
    if b"\r" in blob:
        return iter(blob.splitlines())
    return io.BytesIO(blob)


def line_text(data: bytes) -> str:
    """A line as text: what ``Decoded.text`` holds (the terminal event's ``json``, quotes)."""
    return data.strip().decode("utf-8", "replace")


class Protocol:
    """The parts of one run's parse state every driver has: the transcript, the malformed
    verdict and the terminal event.  A driver's parser feeds it lines and gets events back."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.transcript: list[TranscriptItem] = []
        self.problems: list[str] = []
        self.terminal: dict[str, Any] | None = None
        self.terminal_line = ""
        self._lifecycle_ids: set[str] = set()
        self._last_suffix: dict[str, int] = {}  # base -> the N of the last base~N it gave
        self.stderr_reason = ""
        # The driver stopped the CLI at a malformed line (see _cli.stopped_at_unreadable): the
        # signal that ended it was ours, not the CLI's death.
        self.stopped_unreadable = False

    @property
    def malformed(self) -> bool:
        return bool(self.problems)

    def item(self, item: TranscriptItem) -> None:
        self.transcript.append(item)
        self.sink.emit(item)

    def fresh_id(self, base: str) -> str:
        """A lifecycle id (text, thinking, tool call) not used before in this run: a CLI that
        repeats an id must not reopen a lifecycle that already ended.

        ``base`` itself, else ``base~N`` with the least N >= 2 not used yet.  The ids only
        accumulate, so that N never goes down for a base: the search resumes from the last
        one (a base repeated k times costs k steps in all, not k**2/2)."""
        ids = self._lifecycle_ids
        if base not in ids:
            ids.add(base)
            return base
        n = self._last_suffix.get(base, 1)
        ident = base
        while ident in ids:
            n += 1
            ident = f"{base}~{n}"
        self._last_suffix[base] = n
        ids.add(ident)
        return ident

    def mark_malformed(self, why: str) -> None:
        self.problems.append(why)

    def feed_stdout(self, data: bytes) -> Decoded | None:
        """One stdout line; returns it decoded when it is a formal protocol event."""
        decoded = decode(data)
        if decoded.kind == "blank":
            return None
        if decoded.kind == "text":
            self.item(TranscriptItem(kind="stdout", text=decoded.text))
            return None
        if decoded.kind == "malformed":
            self.mark_malformed(f"unparsable JSON line: {decoded.text[:_QUOTE]!r}")
            return None
        if self.terminal is not None:
            self.mark_malformed(f"event {_type_of(decoded.event)!r} after the terminal event")
        return decoded

    def event(self, data: bytes) -> dict[str, Any] | None:
        """``feed_stdout`` for a parser that needs only the event.

        Such a parser may run ``orjson.loads(data)`` itself first and keep a ``dict`` it gets
        while ``terminal`` is None, coming here only otherwise: ``decode`` gives the same event
        for such a line (it parses the line without the whitespace around it, and JSON allows
        whitespace there), so keep ``decode`` that way."""
        decoded = self.feed_stdout(data)
        return None if decoded is None else decoded.event

    def feed_stderr(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace").rstrip()
        if text:
            self.item(TranscriptItem(kind="stderr", text=text))
            # The CLI's own last word on why it stopped, ignoring backtrace noise and lines of
            # pure decoration (a crash report's "=====" rule).
            reason = _ESCAPES.sub("", text).strip() if "\x1b" in text else text.strip()
            if any(c.isalnum() for c in reason) and (not self.stderr_reason
                                                     or _REASON.search(reason)):
                self.stderr_reason = reason

    def died(self, cli: str, how: str, **details: Any) -> RunFailure:
        """The failure of a process that ended without its terminal event."""
        why = f": {self.stderr_reason[:300]}" if self.stderr_reason else ""
        return RunFailure(code="agent_error", message=f"{cli} ended without a result ({how}){why}",
                          details=details)

    def set_terminal(self, event: dict[str, Any], line: str) -> None:
        self.terminal = event
        self.terminal_line = line


def provider_failure(message: str, kind: FailureKind, **details: Any) -> RunFailure:
    """An ``agent_error`` for a failure the provider reported (drivers.md, failure classes).

    ``kind`` is ``auth``, ``rate_limit``, ``provider_unavailable``, ``quota``,
    ``model_not_found`` or ``context_too_long`` when recognised (only ``rate_limit`` and
    ``provider_unavailable`` are ``retryable``); ``details`` carry the provider's own code and
    status.
    """
    return _classified(message or "the provider reported an error", kind, {}, details)


def died_as(died: RunFailure, kind: FailureKind, **provider: Any) -> RunFailure:
    """The failure of a process that ended without its terminal event (:meth:`Protocol.died`)
    whose last words name a provider failure: classified, with its ``exit_code`` and ``signal``
    kept even when ``None`` (drivers.md promises both keys for every such death)."""
    return _classified(died.message, kind, died.details, provider)


def _classified(message: str, kind: FailureKind, fixed: Mapping[str, Any],
                optional: Mapping[str, Any]) -> RunFailure:
    out: dict[str, Any] = {**fixed, **{k: v for k, v in optional.items() if v is not None}}
    if kind:
        out["kind"] = kind
        out["retryable"] = kind in _RETRYABLE
    return RunFailure(code="agent_error", message=message, details=out)


def _type_of(event: dict[str, Any] | None) -> str:
    value = (event or {}).get("type")
    return value if isinstance(value, str) else "?"


# --- building events cheaply -------------------------------------------------------------------

_new = object.__new__
_FRESH: Final = object()  # "no value given": the field's factory makes one


def lean(cls: type[_T], *given: str, **fixed: Any) -> Callable[..., _T]:
    """``cls(**fields)`` for a frozen dataclass, without its generated ``__init__``: that sets
    each field through ``object.__setattr__`` and builds a fresh ``EventMeta`` per event, which
    is most of what a parser spends per streamed token.

    The constructor returned takes the fields as keywords (required ones required, unknown ones
    refused, like the class) and gives the instance every field, in declaration order, in one
    ``__dict__``: defaults as they are, factory defaults made once when hashable (immutable,
    e.g. the default ``meta``) and per instance otherwise (``metadata={}``).  It is generated
    the way ``dataclasses`` generates ``__init__``, and checked against the class once; a class
    it cannot build exactly (``__slots__``, ``__post_init__``, a non-init field) gets its own
    constructor back.

    With ``given`` field names it takes just those fields, positionally, and gives every other
    one its value in ``fixed`` or its default: for a call site that always builds the same
    shape (``lean(TextDelta, "message_id", "text", phase="content")``, then ``make(ident,
    text)``), which then passes no keywords and fills no defaults per call.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not set(fixed) <= {f.name for f in fields} - set(given) or (fixed and not given):
        raise TypeError(f"lean({cls.__name__}): fixed {sorted(fixed)} are not other fields")
    if (hasattr(cls, "__post_init__") or any("__slots__" in vars(k) for k in cls.__mro__[:-1])
            or not all(f.init and f.name.isidentifier() and not f.name.startswith("_")
                       and f.name not in ("obj", "attrs") for f in fields)):  # the generated code's own names
        return _through_init(cls, given, fixed)
    namespace: dict[str, Any] = {"_cls": cls, "_new": _new, "_FRESH": _FRESH}
    params, fresh, values = [], [], []
    for f in fields:
        name = f.name
        if name in given:
            values.append(name)
        elif name in fixed:
            namespace[f"_d_{name}"] = fixed[name]
            values.append(f"_d_{name}")
        elif f.default is not dataclasses.MISSING:
            namespace[f"_d_{name}"] = f.default
            params.append(f"{name}=_d_{name}")
            values.append(f"_d_{name}" if given else name)
        elif f.default_factory is dataclasses.MISSING:
            if given:
                raise TypeError(f"lean({cls.__name__}): required field {name!r} not given")
            params.insert(0, name)  # keyword-only, so its place does not matter
            values.append(name)
        else:
            value = f.default_factory()
            try:
                hash(value)
            except TypeError:
                namespace[f"_f_{name}"] = f.default_factory
                params.append(f"{name}=_FRESH")
                fresh.append(f"    {name} = _f_{name}()\n" if given else
                             f"    if {name} is _FRESH: {name} = _f_{name}()\n")
                values.append(name)
            else:
                namespace[f"_d_{name}"] = value
                params.append(f"{name}=_d_{name}")
                values.append(f"_d_{name}" if given else name)
    signature = ", ".join(given) if given else f"*, {', '.join(params)}"
    # Filling the instance's own (key-sharing) __dict__ is about twice as fast as giving it a
    # new dict through object.__setattr__.
    attrs = "".join(f"    attrs[{f.name!r}] = {value}\n" for f, value in zip(fields, values, strict=True))
    source = (f"def make({signature}):\n" + "".join(fresh)
              + "    obj = _new(_cls)\n    attrs = obj.__dict__\n" + attrs + "    return obj\n")
    exec(source, namespace)  # from field names only, as dataclasses builds __init__
    make: Callable[..., _T] = namespace["make"]
    if given:
        made, built = make(*[None] * len(given)), cls(**dict.fromkeys(given), **fixed)
    else:
        sample = {f.name: None for f in fields
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        made, built = make(**sample), cls(**sample)
    if vars(made) != vars(built) or list(vars(made)) != list(vars(built)) or made != built:
        return _through_init(cls, given, fixed)
    return make


def _through_init(cls: type[_T], given: tuple[str, ...], fixed: dict[str, Any]) -> Callable[..., _T]:
    """What ``lean(cls, *given, **fixed)`` makes, through the class's own constructor."""
    if not given:
        return cls

    def make(*values: Any) -> _T:
        return cls(**dict(zip(given, values, strict=True)), **fixed)

    return make


# --- reading fields of untrusted events: a wrong type reads as empty, never raises ---------------


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class NullSink:
    """A sink nobody observes: replaying captured output, draining a process being closed."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def emit(self, payload: object) -> None:
        pass

    def request_decision(self, request: DecisionRequest) -> DecisionResponse:
        return DecisionResponse(request_id=request.request_id, result="aborted")

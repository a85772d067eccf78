"""Secret values shown as ``<redacted>``: the one redactor of the run pipeline, the daemon's
records and ``adaptor run``.

Which values are secrets is decided elsewhere (a run's driver config env and inherited
credentials, a request's env and MCP headers); this module only finds them, in every form
they may take in what an agent prints, and replaces them; and, in foreign text, values that look
like credentials (:func:`redact_credentials`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import fractions
import re
import threading
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from adaptor.events import Event

REDACTED = "<redacted>"
MIN_SECRET_LENGTH = 6

_T = TypeVar("_T")


class Redactor:
    """Replaces known secret values in text and values with ``<redacted>``.

    :meth:`value` walks strings, lists, tuples, mappings and dataclass instances (events,
    results, driver responses) and returns the very object it was given when nothing in it
    changed, so a run without secrets in its output pays for the walk only.
    """

    __slots__ = ("secrets",)

    def __init__(self, secrets: Iterable[str], *, min_length: int = MIN_SECRET_LENGTH) -> None:
        # Values this short ("1", "true", a port) are configuration, not credentials, and
        # replacing them everywhere would destroy timestamps and numbers in every record.  A
        # caller whose values are credentials and nothing else (the A2A client's auth headers)
        # may keep shorter ones.
        kept = frozenset(s for s in secrets if isinstance(s, str) and len(s) >= min_length)
        if kept:
            # A value that is a word of the SDK's own records, or part of one ("result",
            # "question", "transcript", "verdict"), hides nothing (every record shows it) and
            # replacing it would break them: a verdict without its "result", an approval of
            # kind "<redacted>" that nobody may answer.
            words = _vocabulary()
            kept = frozenset(s for s in kept if "\0" in s or s not in words)
        self.secrets: tuple[str, ...] = _all_forms(kept) if kept else ()

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, value: str) -> str:
        for secret in self.secrets:
            value = value.replace(secret, REDACTED)
        return value

    def value(self, value: _T) -> _T:
        """``value`` with every secret replaced: the same object when it holds none."""
        if not self.secrets:
            return value
        try:
            redacted: _T = self._value(value)
        except RecursionError:
            # An agent's JSON (tool arguments) may nest deeper than the stack.
            redacted = self._deep(value)
        return redacted

    def _value(self, value: Any) -> Any:
        cls = type(value)
        kind = _KINDS.get(cls)
        if kind is None:
            kind = _kind_of(cls)
        if kind is _SCALAR:
            return value
        if kind is _TEXT:
            # An exact str comes back as the same object from replace() when nothing matched.
            return self.text(value) if cls is str else self._str(value)
        if kind is _MAPPING:
            return self._mapping(value, self._value)
        if kind is _LIST:
            items = [self._value(v) for v in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if kind is _TUPLE:
            items = [self._value(v) for v in value]
            return tuple(items) if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if kind is _OBJECT:
            return self._object(value)
        return self._dataclass(value, self._value)

    def _object(self, value: Any) -> Any:
        """An object this walk cannot rebuild: kept, unless what it shows holds a secret; then
        that, redacted, stands in for it."""
        shown = _shown(value)
        redacted = self.text(shown)
        return value if redacted == shown else redacted

    def _str(self, value: str) -> str:
        redacted = self.text(value)
        # A str subclass (an enum member) is kept unless a secret really was in it.
        return value if redacted == value else redacted

    def _mapping(self, value: Mapping[Any, Any], walk: Callable[[Any], Any]) -> Mapping[Any, Any]:
        # A str key is a name (a record's field, a metadata entry's), never replaced: a
        # secret is a value, and a renamed key broke what reads it ({"<redacted>": ...} for
        # "result").  A key of another type is a value that may show one.
        changed = False
        out: dict[Any, Any] = {}
        for key, item in value.items():
            new_key = key if isinstance(key, str) else walk(key)
            new_item = walk(item)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value

    def _dataclass(self, value: Any, walk: Callable[[Any], Any]) -> Any:
        changes = {}
        cls: type = type(value)
        names = _FIELDS.get(cls)
        if names is None:
            # Fields set by __init__ only: dataclasses.replace refuses the others.
            names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        for name in names:
            item = getattr(value, name)
            new_item = walk(item)
            if new_item is not item:
                changes[name] = new_item
        if not changes:
            return value
        try:
            return dataclasses.replace(value, **changes)
        except Exception:
            # Its own checks refuse the redacted values (an InitVar replace() cannot pass, a
            # __post_init__ that validates a key's shape): what it shows, redacted, stands in.
            return self._str(_shown(value))

    def _deep(self, value: Any) -> Any:
        """:meth:`_value` for values nested deeper than the stack: JSON arrays and objects are
        walked without recursion (always copied), anything else as :meth:`_value` does."""
        if isinstance(value, dict | list):
            return self._json_iteratively(value)
        if isinstance(value, str):
            return self._str(value)
        if isinstance(value, Mapping):
            return self._mapping(value, self._deep)
        if type(value) is tuple:
            return tuple(self._deep(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._dataclass(value, self._deep)
        return self._value(value)

    def _json_iteratively(self, value: dict[Any, Any] | list[Any]) -> Any:
        root: dict[Any, Any] | list[Any] = {} if isinstance(value, dict) else []
        pending: list[tuple[Any, Any]] = [(value, root)]
        # A dict or list met again (a cycle: a user's value holding itself) is not walked
        # again, which went on for ever, its copy growing until memory ran out.
        copied_already = {id(value)}
        while pending:
            source, target = pending.pop()
            items = source.items() if isinstance(source, dict) else enumerate(source)
            for key, child in items:
                if isinstance(child, dict | list) and id(child) in copied_already:
                    copied: Any = _REPEATED
                elif isinstance(child, dict | list):
                    copied_already.add(id(child))
                    copied = {} if isinstance(child, dict) else []
                    pending.append((child, copied))
                else:
                    copied = self._value(child)
                if isinstance(target, dict):
                    target[key if isinstance(key, str) else self._value(key)] = copied  # (see _mapping)
                else:
                    target.append(copied)
        return root


class StreamRedactor:
    """A run's events with the secrets replaced, also those split across the deltas of one
    stream: a model writes a key it read back token by token, each piece harmless alone.

    The text of a stream (an assistant message's or a reasoning block's ``content`` deltas, a
    tool call's ``args_delta``, a subagent's ``delta`` updates) is redacted as one text: a
    delta's end that could begin a secret is held back and goes out with the next delta of its
    stream (redacted with it), or before the stream's next other event (its ``end``), or at
    :meth:`flush`.  Every other event is redacted whole.
    """

    __slots__ = ("_held", "_lock", "_redactor", "_streamed")

    def __init__(self, redactor: Redactor) -> None:
        from adaptor.events import (  # (events imports this module)
            SubagentUpdate,
            TextDelta,
            Thinking,
            ToolCall,
        )

        self._redactor = redactor
        self._lock = threading.Lock()
        # Each streamed event type: its text field, what names one of its streams, and the
        # attribute and value that make an event of it a delta.
        self._streamed: dict[type, tuple[str, str, str, str]] = {
            TextDelta: ("text", "message_id", "phase", "content"),
            Thinking: ("text", "message_id", "phase", "content"),
            ToolCall: ("args_delta", "id", "phase", "content"),
            SubagentUpdate: ("delta", "agent", "kind", "delta"),
        }
        # A stream's held-back text, and its last delta (the template of the one that carries
        # it out).
        self._held: dict[tuple[type, str], tuple[Event, str]] = {}

    def events(self, event: Event) -> list[Event]:
        """What to publish in place of ``event`` (nothing, it, or a held delta first)."""
        how = self._streamed.get(type(event))
        if how is None:
            return [self._redactor.value(event)]
        field, name, marker, is_delta = how
        key = (type(event), getattr(event, name))
        delta = getattr(event, marker, "") == is_delta
        with self._lock:
            held = self._held.pop(key, None)
            if not delta:  # a start or an end: the held text goes out before it
                out = [] if held is None else [_with_text(held[0], field, held[1])]
                return [*out, self._redactor.value(event)]
            text = self._redactor.text((held[1] if held is not None else "") + getattr(event, field))
            keep = _secret_begun_at_end(text, self._redactor.secrets)
            shown = self._redactor.value(_with_text(event, field, ""))
            if keep:
                self._held[key] = (shown, text[-keep:])
                text = text[:-keep]
        return [_with_text(shown, field, text)] if text else []

    def flush(self) -> list[Event]:
        """The text every stream still holds back (its driver has returned)."""
        with self._lock:
            held, self._held = self._held, {}
        return [
            _with_text(template, self._streamed[type(template)][0], text)
            for template, text in held.values()
        ]


def _with_text(event: Event, field: str, text: str) -> Event:
    # Here, not at the top: importing adaptor.errors (which redacts) stays free of the events.
    from adaptor.events import _replaced

    return _replaced(event, **{field: text})


def _secret_begun_at_end(text: str, secrets: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``secrets`` (not whole)."""
    longest = 0
    for secret in secrets:
        # Only an end shorter than the secret can be its beginning, and only one longer than
        # the longest found so far matters.
        start, stop = max(len(text) - len(secret) + 1, 0), len(text) - longest
        at = text.find(secret[0], start, stop)
        while at != -1:
            if secret.startswith(text[at:]):
                longest = len(text) - at
                break
            at = text.find(secret[0], at + 1, stop)
    return longest


# How _value treats a type, found once per type: a run's events are of a dozen types.
_SCALAR, _TEXT, _MAPPING, _LIST, _TUPLE, _DATACLASS, _OBJECT = range(7)
# Values that cannot hold text: kept as they are.  Any other object (a named tuple, a class
# of a user's own in an exception's args) is kept unless what it shows holds a secret.
_PLAIN: tuple[type, ...] = (
    int, float, complex, bool, type(None), datetime.date, datetime.time,
    datetime.timedelta, decimal.Decimal, fractions.Fraction, uuid.UUID, enum.Enum, type,
)
_KINDS: dict[type, int] = {t: _SCALAR for t in (int, float, bool, type(None))}
_KINDS.update({str: _TEXT, dict: _MAPPING, list: _LIST, tuple: _TUPLE})


def _kind_of(cls: type) -> int:
    if issubclass(cls, str):
        kind = _TEXT
    elif issubclass(cls, Mapping):
        kind = _MAPPING
    elif issubclass(cls, list):
        kind = _LIST
    elif dataclasses.is_dataclass(cls):
        kind = _DATACLASS
    elif issubclass(cls, _PLAIN) or cls.__repr__ is object.__repr__:
        # Numbers, datetimes, enums, ...; and objects whose repr() shows no data of theirs
        # (a live approval's responder: <adaptor.approval.Responder object at 0x...>, which
        # an env value "adaptor" would otherwise have turned into a string).
        kind = _SCALAR
    else:  # a tuple subclass (a named tuple: not rebuilt), an object of a user's own, ...
        kind = _OBJECT
    _KINDS[cls] = kind
    return kind


_FIELDS: dict[type, tuple[str, ...]] = {}


@lru_cache(maxsize=64)
def _all_forms(secrets: frozenset[str]) -> tuple[str, ...]:
    # Cached: every run of an Agent has the same secrets, and a daemon's requests mostly share
    # its config's.  Longest first: a secret that contains another is replaced whole.
    return tuple(sorted({form for s in secrets for form in _forms(s)}, key=len, reverse=True))


def _forms(secret: str) -> set[str]:
    """Every text ``secret`` may show up as in what an agent prints or a log holds."""
    # Output is cut into lines (one event, one transcript item each): a key of several lines
    # (a PEM block) must go from each of them too.
    # A value with accents may come back in the other normalization (a tool, a filesystem like
    # macOS's, or a model that decomposes "ü" into "u" and a combining mark).
    pieces = {secret, unicodedata.normalize("NFC", secret), unicodedata.normalize("NFD", secret)}
    if "\n" in secret or "\r" in secret:
        pieces.update(
            part for line in secret.splitlines() for part in (line, line.strip())
            if len(part) >= MIN_SECRET_LENGTH
        )
    forms: set[str] = set()
    for piece in pieces:
        escaped = _escaped(piece)
        forms |= {piece, *escaped}
        # Escaped twice: a model that copies the escaped form (a key with "/" as "\/" out of a
        # JSON file, one with a quote as \") writes it so, and the CLI's JSON line escapes
        # that again.
        for form in escaped - {piece}:
            forms |= _escaped(form)
    return forms


def _escaped(text: str) -> set[str]:
    r"""What ``text`` shows as inside JSON held in a string (a tool's result, a payload an agent
    prints): a value with quotes, backslashes, control or non-ASCII characters appears
    escaped, and serializers differ: upper-case hex (Java's), "\/" (PHP's), "<", ">" and "&"
    as \u escapes (Go's)."""
    import json

    plain = json.dumps(text, ensure_ascii=False)[1:-1]
    ascii_only = json.dumps(text, ensure_ascii=True)[1:-1]
    escaped = {plain, ascii_only, _UNICODE_ESCAPE.sub(lambda m: m[0].upper(), ascii_only)}
    escaped |= {form.replace("/", "\\/") for form in escaped}
    escaped |= {form.translate(_LINE_SEPARATORS) for form in escaped}
    escaped |= {form.translate(_HTML_SAFE) for form in escaped}
    return escaped


_UNICODE_ESCAPE = re.compile(r"(?<=\\u)[0-9a-f]{4}")
_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})
# Go escapes these two always, even where it writes every other character as it is.
_LINE_SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029"})


# Credentials that commonly leak into foreign text (HTTP clients' and remote agents' error
# messages, payloads a remote answered with), whose values nobody gave us to look for.  Each
# pattern's group 1 is what stays in front of ``<redacted>``.
_CREDENTIAL_PATTERNS = (
    # A header's value is the credential, whatever its scheme ("SSWS <token>"), as a line, a
    # mapping's repr or JSON ('"authorization": "..."') shows it.
    re.compile(r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)[^\r\n,;}\"']+"),
    re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,}"),
    # "Basic" is also an English word ("Basic authentication required"): its token must look
    # like base64, with a digit, capital, "+", "/" or "=" after its first character.
    re.compile(r"\b((?i:basic)\s+)[A-Za-z0-9+/](?=[a-z]*[A-Z0-9+/=])[A-Za-z0-9+/]{3,}={0,2}"),
    # A URL's user information ("https://user:password@host").
    re.compile(r"(://)[^/@\s\"']+(?=@)"),
    re.compile(
        r"(?i)\b((?:api[_-]?key|access[_-]?token|auth[_-]?token|token|secret|password|passwd)"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s,;&\"'}]+"
    ),
    re.compile(r"\b(sk-)[A-Za-z0-9_-]{8,}"),
)


def redact_credentials(text: str) -> str:
    """``text`` with credential-looking values (headers, bearer tokens, URL passwords,
    ``token=...``, ``sk-...`` keys) replaced, for text from outside (a foreign exception's
    message, a remote's answer) that may quote credentials no one listed as secrets."""
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def _unredactable(error: BaseException) -> str:
    """What ``error`` says, for its ``args`` when they cannot be redacted in place (something
    in them refuses the redacted values): the text stands in, redacted, so that no secret stays
    for want of a way to replace it."""
    try:
        return str(error)
    except Exception:
        return _shown(error.args)


_REPEATED = "<a dict or list met again: not copied again>"


def _shown(value: object) -> str:
    """``repr(value)``, or a placeholder when its ``__repr__`` raises."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} whose repr() failed>"


def redact_error(error: BaseException, redactor: Redactor) -> None:
    """Replace the secrets in ``error`` and its cause chain, in place: messages, ``args``,
    details, the Result a RunError carries, notes."""
    if not redactor:
        return
    from adaptor import errors

    for node in errors._walk(error):
        try:
            try:
                args = redactor.value(node.args)
            except Exception:  # (see _unredactable)
                args = (redactor.text(_unredactable(node)),)
            if args is not node.args:
                node.args = args
            for name, item in list(vars(node).items()):
                if isinstance(item, BaseException):
                    continue  # the chain's next link: reached by the walk
                try:
                    new_item = redactor.value(item)
                except Exception:
                    new_item = redactor.text(_shown(item))
                if new_item is not item:
                    setattr(node, name, new_item)
            if isinstance(node, OSError):
                # What its str() shows, held outside args and __dict__.
                for name in ("strerror", "filename", "filename2"):
                    item = getattr(node, name)
                    if isinstance(item, str) and redactor.text(item) != item:
                        setattr(node, name, redactor.text(item))
        except (AttributeError, TypeError):
            continue  # a foreign exception whose attributes cannot be set: its type stays visible


# Words of the SDK's records that no Literal-typed field declares.
_RECORD_WORDS: tuple[str, ...] = (
    # Notice kinds, and the kinds of transcript items the built-in drivers write.
    "lifecycle", "approval.requested", "approval.resolved", "transcript.item",
    "assistant", "user", "system", "tool_call", "tool_result", "thinking", "result", "init",
    "failure", "stdout", "stderr",
    # The wire form of an error, a verdict and a run's files.
    "external", "exit_code", "received_at", "started_at", "finished_at", "terminal",
    "transcript.json", "result.json", "terminal.json", "request.json", "state.json",
    REDACTED,
)


@lru_cache(maxsize=1)
def _vocabulary() -> str:
    """The SDK's own words, joined by NULs: the values of its Literal-typed fields (event,
    result and approval kinds and phases), notice and transcript kinds, error codes, class
    names and reasons, driver names, file formats and the words of its records."""
    from adaptor import _home, approval, drivers, errors, events, result

    words: set[str] = set(_RECORD_WORDS)
    words.update(drivers.NAMES)
    words.update(v for k, v in vars(_home).items() if k.endswith("_FORMAT") and isinstance(v, str))
    for module in (events, result, approval):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                continue
            words.update(f.name for f in dataclasses.fields(cls))
            for hint in _type_hints(cls).values():
                words.update(_literal_strings(hint))
    errors._load_leaf_modules()
    for code, cls in errors._REGISTRY.items():
        words.update((code, cls.__name__))
        reason = getattr(cls, "_reason", None)
        if isinstance(reason, str):
            words.add(reason)
    return "\0".join(sorted(words))


def _type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved annotations; a name only a type checker imports stands for ``Any``."""
    import typing

    unknown: dict[str, Any] = {}
    for _ in range(8):
        try:
            return typing.get_type_hints(cls, localns=unknown)
        except NameError as exc:
            if exc.name is None or exc.name in unknown:
                break
            unknown[exc.name] = Any
    return {}


def _literal_strings(hint: Any) -> Iterable[str]:
    """The str values of every ``Literal`` in a type hint (through unions and containers)."""
    import typing

    if typing.get_origin(hint) is typing.Literal:
        return [a for a in typing.get_args(hint) if isinstance(a, str)]
    return [s for arg in typing.get_args(hint) for s in _literal_strings(arg)]

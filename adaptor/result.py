"""The outcome of a run: Result and its layers (raw streams, transcript, structured output)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, cast, overload

import orjson

from adaptor import _nesting

__all__ = [
    "DecodeError",
    "RawStreams",
    "Result",
    "StructuredOutput",
    "TerminalPayload",
    "TranscriptItem",
    "Usage",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Usage:
    """Token usage reported by the provider.  ``Result.usage is None`` when it reported nothing."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float | None = None

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its recursive copy of four numbers cost more than the rest
        # of an event's serialization (every transcript item carries a usage).
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Usage:
        return cls(
            input_tokens=int(obj.get("input_tokens") or 0),
            output_tokens=int(obj.get("output_tokens") or 0),
            cached_input_tokens=int(obj.get("cached_input_tokens") or 0),
            cost_usd=None if obj.get("cost_usd") is None else float(obj["cost_usd"]),
        )

    def __add__(self, other: Usage) -> Usage:
        cost = (
            None
            if self.cost_usd is None and other.cost_usd is None
            else (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        )
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            cost,
        )


@dataclass(frozen=True)
class TerminalPayload:
    """The provider's official terminal event, verbatim."""

    event: str
    json: str


class _Undecoded:
    """Bytes a :class:`RawStreams` text field holds until it is first read."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Text:
    """A text field of :class:`RawStreams` that may be decoded on first read: a parser hands
    over the bytes it read, and a caller that never looks at them (most do not) never pays
    for decoding (and holding) a second copy of a long run's output."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: object | None, owner: type | None = None) -> str:
        if obj is None:
            return ""  # the field's default (dataclasses reads it from the class)
        attrs = obj.__dict__
        value = attrs[self._name]
        if type(value) is _Undecoded:
            value = attrs[self._name] = value.data.decode("utf-8", "replace")
        text: str = value
        return text

    def __set__(self, obj: object, value: str) -> None:
        obj.__dict__[self._name] = value


@dataclass(frozen=True)
class RawStreams:
    """Every byte the agent process printed (decoded as UTF-8 with replacement)."""

    # What a class without __slots__ has; declared so that orjson, which serializes a dataclass
    # straight from its __dict__ unless the class declares __slots__, reads the fields instead
    # (an undecoded field's __dict__ entry is not its value).
    __slots__ = ("__dict__", "__weakref__")

    stdout: str = _Text()  # type: ignore[assignment]
    stderr: str = _Text()  # type: ignore[assignment]
    terminal: TerminalPayload | None = None

    def __getstate__(self) -> dict[str, Any]:  # a copy or a pickle holds the text
        return {"stdout": self.stdout, "stderr": self.stderr, "terminal": self.terminal}


def raw_streams_of(stdout: str | bytes, stderr: str | bytes,
                   terminal: TerminalPayload | None = None) -> RawStreams:
    """``RawStreams`` of what a process printed, given as text or as the bytes it printed;
    bytes are decoded (UTF-8 with replacement) when first read."""
    raw = RawStreams(terminal=terminal)
    attrs = raw.__dict__
    attrs["stdout"] = _Undecoded(stdout) if isinstance(stdout, bytes) else stdout
    attrs["stderr"] = _Undecoded(stderr) if isinstance(stderr, bytes) else stderr
    return raw


@dataclass(frozen=True, kw_only=True)
class TranscriptItem:
    """One normalized item of the provider's official protocol."""

    kind: str
    text: str = ""
    tool_use_id: str = ""
    tool_name: str = ""
    input: Any = None
    is_error: bool = False
    model: str = ""
    session_id: str = ""
    usage: Usage | None = None
    subtype: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it copies recursively, and an agent's tool input can nest
        # deeper than Python's stack.  The names are looked up once: dataclasses.fields() on
        # every item was a fortieth of a busy daemon's time.
        out = {name: getattr(self, name) for name in _TRANSCRIPT_FIELDS}
        out["input"] = _nesting.copy(self.input)
        out["metadata"] = _nesting.copy(self.metadata)
        out["usage"] = None if self.usage is None else self.usage.to_json()
        return out

    def _detached(self) -> TranscriptItem:
        return dataclasses.replace(
            self, input=_nesting.copy(self.input), metadata=_nesting.copy(self.metadata)
        )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TranscriptItem:
        kwargs = {k: v for k, v in obj.items() if k in _TRANSCRIPT_FIELDS}
        if kwargs.get("usage") is not None:
            kwargs["usage"] = Usage.from_json(kwargs["usage"])
        return cls(**kwargs)


_TRANSCRIPT_FIELDS: Final = tuple(f.name for f in dataclasses.fields(TranscriptItem))


@dataclass(frozen=True, kw_only=True)
class StructuredOutput:
    """The validation record of a run that asked for structured output."""

    source: Literal["native", "prompt_validate"]
    valid: bool
    value: Any = None
    errors: tuple[str, ...] = ()
    raw_json: str = ""
    schema_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["errors"] = list(self.errors)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StructuredOutput:
        return cls(
            source=obj["source"],
            valid=bool(obj["valid"]),
            value=obj.get("value"),
            errors=tuple(obj.get("errors") or ()),
            raw_json=obj.get("raw_json") or "",
            schema_hash=obj.get("schema_hash") or "",
        )


class DecodeError(ValueError):
    """``Result.decode`` found no valid value to decode."""


@dataclass(frozen=True, kw_only=True)
class Result:
    """A finished run.  ``text`` is final assistant text only — never raw stdout."""

    run_id: str
    model: str = ""
    provider: str = ""
    text: str = ""
    summary: str = ""
    usage: Usage | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    structured: StructuredOutput | None = None
    _raw: RawStreams = field(default_factory=RawStreams, repr=False)
    _transcript: tuple[TranscriptItem, ...] = field(default=(), repr=False)

    def raw(self) -> RawStreams:
        return self._raw

    def transcript(self) -> list[TranscriptItem]:
        """The normalized items, as copies: changing an item's ``input`` or ``metadata``
        changes neither this Result nor what an earlier or later call returns."""
        return [item._detached() for item in self._transcript]

    @overload
    def decode(self, type_: None = None) -> Any: ...
    @overload
    def decode(self, type_: type[T]) -> T: ...
    @overload
    def decode(self, type_: object) -> Any: ...  # a hint no type[T] holds: `list[int] | None`
    def decode(self, type_: object = None) -> Any:
        """The structured value when a schema was requested, else ``text`` parsed as JSON.

        With a schema it never falls back to ``text``: invalid or missing output raises
        :class:`DecodeError` naming the validation errors.  ``type_`` (a dataclass,
        TypedDict or pydantic model) converts the value; one it does not fit raises
        :class:`DecodeError` too, naming the first mismatch.
        """
        if self.structured is not None:
            if not self.structured.valid:
                problems = "; ".join(self.structured.errors) or "no value"
                raise DecodeError(f"structured output invalid: {problems}")
            value = self.structured.value
        else:
            text = self.text.strip()
            if not text:
                raise DecodeError("result text is empty")
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise DecodeError(f"result text is not JSON: {exc}") from exc
        if type_ is None:
            return value
        from adaptor.schema import _type_name, convert

        try:
            return convert(value, cast("type[Any]", type_))
        except ValueError as exc:
            # One class for "no usable value": ``except DecodeError`` must not let a value of
            # the wrong shape through as a bare ValueError.
            raise DecodeError(f"cannot decode into {_type_name(type_)}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "model": self.model,
            "provider": self.provider,
            "text": self.text,
            "summary": self.summary,
            "usage": None if self.usage is None else self.usage.to_json(),
            "metadata": dict(self.metadata),
            "structured": None if self.structured is None else self.structured.to_json(),
            "raw": {
                "stdout": self._raw.stdout,
                "stderr": self._raw.stderr,
                "terminal": None
                if self._raw.terminal is None
                else dataclasses.asdict(self._raw.terminal),
            },
            "transcript": [item.to_json() for item in self._transcript],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Result:
        if not isinstance(obj, Mapping):  # as events.from_json refuses one
            raise ValueError(f"a Result's JSON form is an object, not {type(obj).__name__}")
        try:
            return cls._from_mapping(obj)
        except (AttributeError, TypeError) as exc:  # a part of the wrong JSON type
            # ValueError, as for every other malformed record (events, the wire form): a
            # reader of a damaged verdict file catches that one.
            raise ValueError(f"malformed Result JSON: {exc}") from exc

    @classmethod
    def _from_mapping(cls, obj: Mapping[str, Any]) -> Result:
        raw = obj.get("raw") or {}
        terminal = raw.get("terminal")
        return cls(
            run_id=obj.get("run_id") or "",
            model=obj.get("model") or "",
            provider=obj.get("provider") or "",
            text=obj.get("text") or "",
            summary=obj.get("summary") or "",
            usage=None if obj.get("usage") is None else Usage.from_json(obj["usage"]),
            metadata=dict(obj.get("metadata") or {}),
            structured=None
            if obj.get("structured") is None
            else StructuredOutput.from_json(obj["structured"]),
            _raw=RawStreams(
                stdout=_text(raw.get("stdout")),
                stderr=_text(raw.get("stderr")),
                terminal=None if terminal is None else TerminalPayload(**terminal),
            ),
            _transcript=tuple(
                TranscriptItem.from_json(item) for item in obj.get("transcript") or ()
            ),
        )

    def _with(self, **changes: Any) -> Result:
        return dataclasses.replace(self, **changes)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


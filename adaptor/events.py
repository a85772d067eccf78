"""The typed event stream: frozen event dataclasses and their JSON form.

Every event carries ``meta`` (run id, thread key, sequence, time, turn id) assigned by the SDK's
broker.  ``event_kind(event)`` is the string used in JSON, in ``Dropped.by_kind`` and in audit
logs (``text.content``, ``notice.lifecycle``, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from adaptor.result import Usage

if TYPE_CHECKING:
    from adaptor.approval import Responder

__all__ = [
    "ApprovalRequest",
    "Choice",
    "Dropped",
    "Event",
    "EventMeta",
    "Notice",
    "ProcessInfo",
    "RunFinished",
    "RunStarted",
    "SubagentUpdate",
    "TextDelta",
    "Thinking",
    "ToolCall",
    "ToolResult",
    "event_kind",
    "from_json",
    "is_droppable",
    "to_json",
]

Phase = Literal["start", "content", "end"]


def format_time(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, e.g. ``2026-12-02T10:00:00.000000Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


_EPOCH = datetime.fromtimestamp(0, UTC)


@dataclass(frozen=True)
class EventMeta:
    run_id: str = ""
    thread_key: str = ""
    sequence: int = 0
    time: datetime = _EPOCH
    turn_id: str = ""


@dataclass(frozen=True, kw_only=True)
class _Event:
    meta: EventMeta = field(default_factory=EventMeta, compare=False)

    _kind_prefix: ClassVar[str]

    def _kind(self) -> str:
        return self._kind_prefix


@dataclass(frozen=True, kw_only=True)
class RunStarted(_Event):
    run_id: str
    thread_id: str = ""
    _kind_prefix: ClassVar[str] = "run.started"


@dataclass(frozen=True, kw_only=True)
class RunFinished(_Event):
    """The last event of every admitted run; mirrors the final outcome (informational)."""

    run_id: str
    thread_id: str = ""
    usage: Usage | None = None
    failed: bool = False
    reason: str = ""
    message: str = ""
    _kind_prefix: ClassVar[str] = "run.finished"


@dataclass(frozen=True, kw_only=True)
class TextDelta(_Event):
    """Assistant text; only the ``content`` phase carries text."""

    message_id: str = ""
    text: str = ""
    phase: Phase = "content"
    _kind_prefix: ClassVar[str] = "text"

    def _kind(self) -> str:
        return f"text.{self.phase}"


@dataclass(frozen=True, kw_only=True)
class Thinking(_Event):
    message_id: str = ""
    text: str = ""
    phase: Phase = "content"
    _kind_prefix: ClassVar[str] = "thinking"

    def _kind(self) -> str:
        return f"thinking.{self.phase}"


@dataclass(frozen=True, kw_only=True)
class ToolCall(_Event):
    """A tool call's lifecycle: ``start`` (name, maybe args), ``content`` (args_delta), ``end``."""

    id: str = ""
    name: str = ""
    args: dict[str, Any] | None = None
    args_delta: str = ""
    result: Any = None
    phase: Phase = "start"
    _kind_prefix: ClassVar[str] = "tool_call"

    def _kind(self) -> str:
        return f"tool_call.{self.phase}"


@dataclass(frozen=True, kw_only=True)
class ToolResult(_Event):
    id: str = ""
    result: Any = None
    is_error: bool = False
    _kind_prefix: ClassVar[str] = "tool_result"


@dataclass(frozen=True, kw_only=True)
class ProcessInfo(_Event):
    """Process facts: ``spawn`` (argv and pid in ``data``; env names only), raw chunks."""

    kind: Literal["spawn", "stdout", "stderr"] = "stdout"
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    _kind_prefix: ClassVar[str] = "process"

    def _kind(self) -> str:
        return f"process.{self.kind}"


@dataclass(frozen=True, kw_only=True)
class Notice(_Event):
    """SDK and driver notices: ``lifecycle``, ``transcript.item``, ``approval.requested``, ..."""

    kind: str = "lifecycle"
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    _kind_prefix: ClassVar[str] = "notice"

    def _kind(self) -> str:
        return f"notice.{self.kind}"


@dataclass(frozen=True, kw_only=True)
class Dropped(_Event):
    """Events lost to backpressure; they still consumed the sequence numbers in the range."""

    count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    first_sequence: int = 0
    last_sequence: int = 0
    reason: str = ""
    _kind_prefix: ClassVar[str] = "dropped"


@dataclass(frozen=True, kw_only=True)
class SubagentUpdate(_Event):
    agent: str = ""
    kind: str = "delta"
    delta: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    _kind_prefix: ClassVar[str] = "subagent"

    def _kind(self) -> str:
        return f"subagent.{self.kind}"


@dataclass(frozen=True)
class Choice:
    key: str
    label: str = ""
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest(_Event):
    """A decision the agent asks for.  Live copies answer through one shared responder.

    ``approve()`` fits ``permission`` and ``plan_review``; ``answer(option)`` fits
    ``question``; ``deny(reason)`` fits every kind.  Exactly one response wins.
    """

    id: str
    run_id: str = ""
    kind: Literal["permission", "plan_review", "question"] = "permission"
    title: str = ""
    source: str = ""
    tool_call_id: str = ""
    choices: tuple[Choice, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = _EPOCH
    deadline: datetime | None = None
    attempt: int = 0
    _responder: Responder | None = field(default=None, repr=False, compare=False)
    _kind_prefix: ClassVar[str] = "approval.requested"

    def approve(self) -> None:
        self._live().approve(self)

    def deny(self, reason: str = "") -> None:
        self._live().deny(self, reason)

    def answer(self, option: str) -> None:
        self._live().answer(self, option)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request is settled by anyone (a response, its deadline, the run's
        end); True when settled.  Useful for hosts that route approvals themselves."""
        return self._live().wait(timeout) is not None

    @property
    def settled(self) -> bool:
        return self._responder is not None and self._responder.outcome is not None

    def _live(self) -> Responder:
        from adaptor.errors import ApprovalUnavailableError

        if self._responder is None:
            raise ApprovalUnavailableError(
                f"approval request {self.id!r} has no live responder (read back from a log?)"
            )
        return self._responder


Event = (
    RunStarted
    | RunFinished
    | TextDelta
    | Thinking
    | ToolCall
    | ToolResult
    | ProcessInfo
    | Notice
    | Dropped
    | SubagentUpdate
    | ApprovalRequest
)

_DROPPABLE_KINDS = frozenset(
    {
        "text.content",
        "thinking.content",
        "tool_call.content",
        "process.stdout",
        "process.stderr",
        "subagent.delta",
    }
)


def event_kind(event: Event) -> str:
    """The JSON ``kind`` of an event, e.g. ``text.content`` or ``notice.transcript.item``."""
    return event._kind()


def is_droppable(event: Event) -> bool:
    """Whether backpressure may drop this event (content deltas and raw process chunks)."""
    return event._kind() in _DROPPABLE_KINDS


def with_meta(event: Event, meta: EventMeta) -> Event:
    """A copy of ``event`` carrying ``meta`` (an ApprovalRequest copy keeps its responder)."""
    return dataclasses.replace(event, meta=meta)


# --- JSON -------------------------------------------------------------------------------------


def _meta_to_json(meta: EventMeta) -> dict[str, Any]:
    return {
        "run_id": meta.run_id,
        "thread_key": meta.thread_key,
        "sequence": meta.sequence,
        "time": format_time(meta.time),
        "turn_id": meta.turn_id,
    }


def _meta_from_json(obj: Mapping[str, Any]) -> EventMeta:
    return EventMeta(
        run_id=str(obj.get("run_id", "")),
        thread_key=str(obj.get("thread_key", "")),
        sequence=int(obj.get("sequence", 0)),
        time=parse_time(obj["time"]) if obj.get("time") else _EPOCH,
        turn_id=str(obj.get("turn_id", "")),
    )


# The discriminating field that is folded into the JSON kind string for each class.
_FOLDED_FIELD: dict[type[_Event], str] = {
    TextDelta: "phase",
    Thinking: "phase",
    ToolCall: "phase",
    ProcessInfo: "kind",
    Notice: "kind",
    SubagentUpdate: "kind",
}

# Fields whose name would collide with the JSON ``kind`` key travel under another name.
_JSON_NAMES: dict[type[_Event], dict[str, str]] = {ApprovalRequest: {"kind": "approval_kind"}}

_BY_PREFIX: dict[str, type[_Event]] = {
    cls._kind_prefix: cls
    for cls in (
        RunStarted,
        RunFinished,
        TextDelta,
        Thinking,
        ToolCall,
        ToolResult,
        ProcessInfo,
        Notice,
        Dropped,
        SubagentUpdate,
        ApprovalRequest,
    )
}

_ENCODERS: dict[str, Callable[[Any], Any]] = {
    "usage": lambda u: None if u is None else u.to_json(),
    "choices": lambda cs: [dataclasses.asdict(c) for c in cs],
    "created_at": format_time,
    "deadline": lambda d: None if d is None else format_time(d),
}
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "usage": lambda u: None if u is None else Usage.from_json(u),
    "choices": lambda cs: tuple(Choice(**c) for c in cs),
    "created_at": parse_time,
    "deadline": lambda d: None if d is None else parse_time(d),
}


def to_json(event: Event) -> dict[str, Any]:
    """The JSON object form of an event (used by audit logs, verdicts and ``--json``)."""
    folded = _FOLDED_FIELD.get(type(event))
    renamed = _JSON_NAMES.get(type(event), {})
    out: dict[str, Any] = {"kind": event._kind(), "meta": _meta_to_json(event.meta)}
    for f in dataclasses.fields(event):
        if f.name in ("meta", "_responder") or f.name == folded:
            continue
        value = getattr(event, f.name)
        encoder = _ENCODERS.get(f.name)
        out[renamed.get(f.name, f.name)] = encoder(value) if encoder else value
    return out


def from_json(obj: Mapping[str, Any]) -> Event:
    """Rebuild an event from :func:`to_json` output.  Raises ``ValueError`` on bad input.

    An ``ApprovalRequest`` read back has no live responder: answering it raises
    ``ApprovalUnavailableError``.
    """
    if not isinstance(obj, Mapping):
        raise ValueError("an event must be a JSON object")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ValueError("event has no kind")
    cls = _BY_PREFIX.get(kind)
    folded_value = None
    if cls is None or cls in _FOLDED_FIELD:
        prefix, _, rest = kind.partition(".")
        cls = _BY_PREFIX.get(prefix)
        if cls is None or not rest or cls not in _FOLDED_FIELD:
            raise ValueError(f"unknown event kind {kind!r}")
        folded_value = rest
    try:
        kwargs: dict[str, Any] = {}
        renamed = _JSON_NAMES.get(cls, {})
        names = {f.name for f in dataclasses.fields(cls)} - {"meta", "_responder"}
        for name in names:
            json_name = renamed.get(name, name)
            if json_name in obj:
                decoder = _DECODERS.get(name)
                kwargs[name] = decoder(obj[json_name]) if decoder else obj[json_name]
        if folded_value is not None:
            kwargs[_FOLDED_FIELD[cls]] = folded_value
        meta = _meta_from_json(obj.get("meta") or {})
        return cls(meta=meta, **kwargs)  # type: ignore[return-value]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed {kind!r} event: {exc}") from exc


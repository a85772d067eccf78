"""The typed event stream: frozen event dataclasses and their JSON form.

Every event carries ``meta`` (run id, thread key, sequence, time, turn id) assigned by the SDK's
broker.  ``event_kind(event)`` is the string used in JSON, in ``Dropped.by_kind`` and in audit
logs (``text.content``, ``notice.lifecycle``, ...).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from adaptor import _nesting, _waiting
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
    # Not strftime("%Y..."): it does not zero-pad a year before 1000, which no reader parses.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


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


# One shared default: EventMeta is frozen and holds only immutable values, and a fresh instance
# per event would cost every event constructor a call.
_NO_META = EventMeta()


@dataclass(frozen=True, kw_only=True)
class _Event:
    meta: EventMeta = field(default=_NO_META, compare=False)

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
        return self._live().wait(_waiting.seconds("timeout", timeout)) is not None

    @property
    def settled(self) -> bool:
        return self._responder is not None and self._responder.outcome is not None

    # The responder is a handle on the live run, not data: a pickled request (a process pool's
    # result, a multiprocessing queue) arrives as one read back from a log does, with none,
    # while copies in this process share it, as dataclasses.replace() copies do.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_responder": None}

    def __copy__(self) -> ApprovalRequest:
        return self._with_state(dict(self.__dict__))

    def __deepcopy__(self, memo: dict[int, Any]) -> ApprovalRequest:
        import copy

        return self._with_state({
            name: value if name == "_responder" else copy.deepcopy(value, memo)
            for name, value in self.__dict__.items()
        })

    def _with_state(self, state: dict[str, Any]) -> ApprovalRequest:
        duplicate: ApprovalRequest = _new(type(self))
        _set(duplicate, "__dict__", state)
        return duplicate

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

# Classes whose __init__ only sets their fields (no __post_init__, no slots, every field an
# init field; tests/test_events.py checks): a copy of their __dict__ is what replace() builds.
_PLAIN_CLASSES: frozenset[type] = frozenset(Event.__args__)

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
    return _replaced(event, meta=meta)


def _replaced(event: Event, **changes: Any) -> Event:
    """``dataclasses.replace(event, **changes)``, several times faster for this module's own
    classes (every event of a run is copied this way two or three times)."""
    cls = type(event)
    if cls not in _PLAIN_CLASSES:  # a subclass may check its fields: its __init__ decides
        return dataclasses.replace(event, **changes)
    fields = event.__dict__.copy()
    fields.update(changes)
    copy: Event = _new(cls)
    _set(copy, "__dict__", fields)
    return copy


# --- JSON -------------------------------------------------------------------------------------


# The whole-second part of recent times, by their fields: the times a process formats mostly
# fall in a few seconds (now, and the meta time of the run), and that part is most of the cost.
_second_texts: dict[tuple[int, int, int, int, int, int], str] = {}


def _format_time_fast(moment: datetime) -> str:
    """:func:`format_time`, byte for byte, without strftime (which costs ~4x as much)."""
    # Most times are UTC already; astimezone would build a copy for nothing.
    utc = moment if moment.tzinfo is UTC else moment.astimezone(UTC)
    key = (utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second)
    prefix = _second_texts.get(key)
    if prefix is None:
        if len(_second_texts) >= 64:
            _second_texts.clear()  # (racing threads may clear twice: harmless)
        prefix = _second_texts[key] = utc.replace(microsecond=0, tzinfo=None).isoformat() + "."
    return f"{prefix}{utc.microsecond:06d}Z"


# The last meta serialized and its JSON: many events share one EventMeta object (the default
# one, or a run's), and the tuple is replaced whole, so threads never see half an update.
_last_meta: tuple[EventMeta | None, dict[str, Any]] = (None, {})


def _meta_to_json(meta: EventMeta) -> dict[str, Any]:
    global _last_meta
    last, encoded = _last_meta
    if last is not meta:
        encoded = {
            "run_id": meta.run_id,
            "thread_key": meta.thread_key,
            "sequence": meta.sequence,
            "time": _format_time_fast(meta.time),
            "turn_id": meta.turn_id,
        }
        _last_meta = (meta, encoded)
    return encoded.copy()  # callers own what they get


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


_CONTAINERS = frozenset({dict, list})


def _container_fields(cls: type) -> frozenset[str]:
    """The fields of an event class whose type admits a dict or a list (``Any`` does)."""
    hints = typing.get_type_hints(cls, localns={"Responder": object})
    return frozenset(f.name for f in dataclasses.fields(cls) if _admits_containers(hints[f.name]))


def _admits_containers(hint: Any) -> bool:
    if hint is Any or hint in _CONTAINERS or typing.get_origin(hint) in _CONTAINERS:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(map(_admits_containers, typing.get_args(hint)))
    return False


_Plan: TypeAlias = tuple[tuple[str, str, Callable[[Any], Any] | None], ...]
# Per event class: (field name, JSON name, encoder) for every field to_json writes, so an event
# costs one dict lookup instead of walking dataclasses.fields() and three tables.  A field that
# may hold a dict or list is "encoded" by copying it; the others (all of a TextDelta's) are not
# touched.
_TO_JSON_PLANS: dict[type, _Plan] = {}


def _to_json_plan(cls: type) -> _Plan:
    folded = _FOLDED_FIELD.get(cls)
    renamed = _JSON_NAMES.get(cls, {})
    containers = _container_fields(cls)
    plan = tuple(
        (
            f.name,
            renamed.get(f.name, f.name),
            _ENCODERS.get(f.name, _nesting.copy_json if f.name in containers else None),
        )
        for f in dataclasses.fields(cls)
        if f.name not in ("meta", "_responder") and f.name != folded
    )
    _TO_JSON_PLANS[cls] = plan
    return plan


def to_json(event: Event) -> dict[str, Any]:
    """The JSON object form of an event (used by audit logs, verdicts and ``--json``).

    The object is the caller's: it shares no dict or list with the event, so changing it
    cannot change the event that every other consumer sees.
    """
    cls = type(event)
    plan = _TO_JSON_PLANS.get(cls)
    if plan is None:
        plan = _to_json_plan(cls)
    out: dict[str, Any] = {"kind": event._kind(), "meta": _meta_to_json(event.meta)}
    for name, json_name, encoder in plan:
        value = getattr(event, name)
        out[json_name] = encoder(value) if encoder is not None else value
    return out


def from_json(obj: Mapping[str, Any]) -> Event:
    """Rebuild an event from :func:`to_json` output.  Raises ``ValueError`` on bad input.

    The event shares no dict or list with ``obj``: changing ``obj`` later leaves it as it is.
    An ``ApprovalRequest`` read back has no live responder: answering it raises
    ``ApprovalUnavailableError``.
    """
    if type(obj) is dict:
        kind = obj.get("kind")
        if type(kind) is str:
            event = _quick_from_json(kind, obj)
            if event is not None:
                return event
    return _from_json(obj)


def _from_json(obj: Mapping[str, Any]) -> Event:
    """The general decoder: any input, every error; :func:`_quick_from_json` is its shortcut."""
    if not isinstance(obj, Mapping):
        raise ValueError("an event must be a JSON object")
    kind = obj.get("kind")
    if not isinstance(kind, str):
        raise ValueError("event has no kind")
    found = _kind_class(kind)
    if found is None:
        raise ValueError(f"unknown event kind {kind!r}")
    cls, folded_name, folded_value = found
    try:
        kwargs: dict[str, Any] = {}
        renamed = _JSON_NAMES.get(cls, {})
        names = {f.name for f in dataclasses.fields(cls)} - {"meta", "_responder"}
        for name in names:
            json_name = renamed.get(name, name)
            if json_name in obj:
                decoder = _DECODERS.get(name)
                value = obj[json_name]
                kwargs[name] = decoder(value) if decoder else _nesting.copy_json(value)
        if folded_name is not None:
            kwargs[folded_name] = folded_value
        meta = _meta_from_json(obj.get("meta") or {})
        return cls(meta=meta, **kwargs)  # type: ignore[return-value]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"malformed {kind!r} event: {exc}") from exc


def _kind_class(kind: str) -> tuple[type[_Event], str | None, str | None] | None:
    """``(class, folded field, its value)`` for a JSON ``kind``, or None for an unknown kind.

    ``text.content`` is ``(TextDelta, "phase", "content")``; ``run.started`` is
    ``(RunStarted, None, None)``.  Log readers use it to resolve a kind as from_json does.
    """
    cls = _BY_PREFIX.get(kind)
    if cls is not None and cls not in _FOLDED_FIELD:
        return cls, None, None
    prefix, dot, rest = kind.partition(".")
    cls = _BY_PREFIX.get(prefix)
    # An empty rest is what to_json writes for an empty folded field (Notice(kind="") is
    # "notice."), so it reads back too.
    if cls is None or not dot or cls not in _FOLDED_FIELD:
        return None
    return cls, _FOLDED_FIELD[cls], rest


# --- Reading events fast ----------------------------------------------------------------------
#
# Replaying an audit log rebuilds millions of events, and a frozen dataclass's __init__ (one
# object.__setattr__ call per field) plus the general decoder's per-field loop cost several
# times what parsing the JSON does.  For the common case -- a plain dict in exactly the shape
# to_json writes, with no field that needs decoding -- the event is built from a per-kind
# recipe: a template dict of the defaults in field order, updated from the JSON object and
# installed as the instance's __dict__.  That is the state __init__ would leave (same values,
# same order); anything outside the recipe's shape (extra or missing keys, a field with a
# decoder, a non-canonical meta) returns None and takes the general path, which decides.
# Only classes whose generated __init__ does nothing but set fields get a recipe (no
# __post_init__, no __slots__, every field in __init__); tests/test_events.py checks that a
# recipe-built event matches the general decoder's for every event class.

_new = object.__new__
_set = object.__setattr__
_fromiso = datetime.fromisoformat
_FACTORY = object()  # a template value: call the field's default_factory
_REQUIRED = object()  # a template value: the JSON must supply this field


@dataclass(frozen=True, slots=True)
class _Recipe:
    cls: type[_Event]
    template: dict[str, Any]  # every field, in field order, with its default or a marker
    allowed: frozenset[str]  # JSON keys the fast path understands
    required: tuple[str, ...]  # JSON keys that must be present
    fixed: dict[str, Any]  # the folded field's value, set last
    drop_kind: bool  # the JSON "kind" is not a field of the class
    factories: tuple[tuple[str, Callable[[], Any]], ...]
    copied: tuple[str, ...]  # fields that may hold the JSON's dicts and lists: copied


_META_TEMPLATE: dict[str, Any] = {
    "run_id": "",
    "thread_key": "",
    "sequence": 0,
    "time": _EPOCH,
    "turn_id": "",
}
_META_KEYS = _META_TEMPLATE.keys()
_UNSEEN: Any = object()  # not in _RECIPES yet
_RECIPES: dict[str, _Recipe | None] = {}
_MAX_RECIPES = 4096  # notice.* kinds are free-form; a hostile log must not grow this forever


def _canonical_meta_time(obj: object) -> datetime | None:
    """The time of a meta in the canonical five-key form to_json writes, parsed; else None."""
    if type(obj) is not dict or obj.keys() != _META_KEYS:
        return None
    text = obj["time"]
    # str() and int() in _meta_from_json return these unchanged only for exact str and int.
    if (
        not (str is type(obj["run_id"]) is type(obj["thread_key"]) is type(obj["turn_id"]))
        or type(text) is not str
        or not text
        or type(obj["sequence"]) is not int
    ):
        return None
    try:
        return _fromiso(text.replace("Z", "+00:00"))  # parse_time, inlined
    except ValueError:
        return None


def _quick_meta(obj: object) -> EventMeta | None:
    """:func:`_meta_from_json` for the canonical five-key form to_json writes; else None."""
    moment = _canonical_meta_time(obj)
    if moment is None:
        return None
    fields = _META_TEMPLATE.copy()
    fields.update(obj)  # type: ignore[call-overload]  # a dict: _canonical_meta_time checked
    fields["time"] = moment
    meta = _new(EventMeta)
    _set(meta, "__dict__", fields)
    return meta


def _quick_from_json(kind: str, obj: dict[str, Any]) -> Event | None:
    """The event :func:`_from_json` would return for ``obj``, or None to ask it."""
    recipe = _RECIPES.get(kind, _UNSEEN)
    if recipe is _UNSEEN:
        recipe = _learn_recipe(kind)
    if recipe is None or not obj.keys() <= recipe.allowed:
        return None
    for name in recipe.required:
        if name not in obj:
            return None
    meta = _quick_meta(obj.get("meta"))
    if meta is None:
        return None
    fields = recipe.template.copy()
    fields.update(obj)  # existing keys keep their (field) order
    fields.update(recipe.fixed)
    fields["meta"] = meta
    if recipe.drop_kind:
        del fields["kind"]
    for name in recipe.copied:
        fields[name] = _nesting.copy_json(fields[name])
    for name, factory in recipe.factories:
        if fields[name] is _FACTORY:
            fields[name] = factory()
    event: Event = _new(recipe.cls)
    _set(event, "__dict__", fields)
    return event


def _recipe(kind: str) -> _Recipe | None:
    """The recipe for ``kind`` (None: no fast path); batch readers build events from it."""
    recipe = _RECIPES.get(kind, _UNSEEN)
    return _learn_recipe(kind) if recipe is _UNSEEN else recipe


def _adopt_from_json(kind: str, obj: dict[str, Any]) -> Event | None:
    """:func:`_quick_from_json` for an ``obj`` the caller hands over (a freshly parsed line).

    The event takes ``obj`` (its ``meta`` dict, its dicts and lists) as its own state instead
    of copying it, so the caller must not use any of them again once an event is returned.
    Only a complete object, with exactly the keys to_json writes, qualifies; nothing is changed
    before that is known.  Returns None (``obj`` untouched) to ask :func:`from_json`.
    """
    recipe = _RECIPES.get(kind, _UNSEEN)
    if recipe is _UNSEEN:
        recipe = _learn_recipe(kind)
    if recipe is None or obj.keys() != recipe.allowed:
        return None
    meta = obj["meta"]
    moment = _canonical_meta_time(meta)
    if moment is None:
        return None
    meta["time"] = moment
    event_meta = _new(EventMeta)
    _set(event_meta, "__dict__", meta)
    obj["meta"] = event_meta
    if recipe.fixed:
        obj.update(recipe.fixed)
    if recipe.drop_kind:
        del obj["kind"]
    event: Event = _new(recipe.cls)
    _set(event, "__dict__", obj)
    return event


def _learn_recipe(kind: str) -> _Recipe | None:
    try:
        recipe = _make_recipe(kind)
    except Exception:
        recipe = None  # anything unexpected: the general path decides
    if len(_RECIPES) < _MAX_RECIPES:
        _RECIPES[kind] = recipe
    return recipe


def _make_recipe(kind: str) -> _Recipe | None:
    found = _kind_class(kind)
    if found is None:
        return None
    cls, folded_name, folded_value = found
    if _JSON_NAMES.get(cls) or hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        return None
    template: dict[str, Any] = {}
    required: list[str] = []
    factories: list[tuple[str, Callable[[], Any]]] = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in _DECODERS:
            return None
        if f.name == "_responder":
            return None  # from_json never reads it from JSON; not modelled
        if f.name == "meta":
            template["meta"] = None  # always set from the JSON's meta
        elif f.default is not dataclasses.MISSING:
            template[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            template[f.name] = _FACTORY
            factories.append((f.name, f.default_factory))
        else:
            template[f.name] = _REQUIRED
            required.append(f.name)
    allowed = set(template) - {folded_name} | {"kind", "meta"}
    return _Recipe(
        cls=cls,
        template=template,
        allowed=frozenset(allowed),
        required=tuple(name for name in required if name != folded_name),
        fixed={folded_name: folded_value} if folded_name is not None else {},
        drop_kind="kind" not in template,
        factories=tuple(factories),
        copied=tuple(sorted(_container_fields(cls))),
    )

"""Events and Results survive their JSON form exactly."""

from __future__ import annotations

import dataclasses
import typing
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptor
from adaptor import _nesting, events
from adaptor.result import (
    RawStreams,
    Result,
    StructuredOutput,
    TerminalPayload,
    TranscriptItem,
    Usage,
)

_text = st.text(max_size=30)
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), _text),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_text, c, max_size=3)),
    max_leaves=10,
)
_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_meta = st.builds(
    events.EventMeta,
    run_id=_text,
    thread_key=_text,
    sequence=st.integers(0, 2**40),
    time=_times,
    turn_id=_text,
)
_phase = st.sampled_from(["start", "content", "end"])
_usage = st.one_of(
    st.none(),
    st.builds(
        Usage,
        input_tokens=st.integers(0, 10**9),
        output_tokens=st.integers(0, 10**9),
        cached_input_tokens=st.integers(0, 10**9),
        cost_usd=st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False)),
    ),
)
_kind_word = st.from_regex(r"([a-z_]{1,10}(\.[a-z_]{1,10})?)?", fullmatch=True)  # "" too: "notice."

EVENTS = st.one_of(
    st.builds(events.RunStarted, meta=_meta, run_id=_text, thread_id=_text),
    st.builds(
        events.RunFinished,
        meta=_meta,
        run_id=_text,
        thread_id=_text,
        usage=_usage,
        failed=st.booleans(),
        reason=_text,
        message=_text,
    ),
    st.builds(events.TextDelta, meta=_meta, message_id=_text, text=_text, phase=_phase),
    st.builds(events.Thinking, meta=_meta, message_id=_text, text=_text, phase=_phase),
    st.builds(
        events.ToolCall,
        meta=_meta,
        id=_text,
        name=_text,
        args=st.one_of(st.none(), st.dictionaries(_text, _json, max_size=3)),
        args_delta=_text,
        result=_json,
        phase=_phase,
    ),
    st.builds(events.ToolResult, meta=_meta, id=_text, result=_json, is_error=st.booleans()),
    st.builds(
        events.ProcessInfo,
        meta=_meta,
        kind=st.sampled_from(["spawn", "stdout", "stderr"]),
        text=_text,
        data=st.dictionaries(_text, _json, max_size=3),
    ),
    st.builds(events.Notice, meta=_meta, kind=_kind_word, text=_text, data=st.dictionaries(_text, _json, max_size=3)),
    st.builds(
        events.Dropped,
        meta=_meta,
        count=st.integers(0, 1000),
        by_kind=st.dictionaries(_kind_word, st.integers(0, 100), max_size=3),
        first_sequence=st.integers(0, 1000),
        last_sequence=st.integers(0, 1000),
        reason=_text,
    ),
    st.builds(
        events.SubagentUpdate,
        meta=_meta,
        agent=_text,
        kind=st.sampled_from(["started", "delta", "finished"]),
        delta=_text,
        data=st.dictionaries(_text, _json, max_size=3),
    ),
    st.builds(
        events.ApprovalRequest,
        meta=_meta,
        id=_text,
        run_id=_text,
        kind=st.sampled_from(["permission", "plan_review", "question"]),
        title=_text,
        source=_text,
        tool_call_id=_text,
        choices=st.lists(st.builds(events.Choice, _text, _text, _text), max_size=3).map(tuple),
        details=st.dictionaries(_text, _json, max_size=3),
        created_at=_times,
        deadline=st.one_of(st.none(), _times),
        attempt=st.integers(0, 10),
    ),
)


@settings(max_examples=400, deadline=None)
@given(EVENTS)
def test_every_event_roundtrips_through_json_bytes(event: Any) -> None:
    obj = events.to_json(event)
    assert obj["kind"] == events.event_kind(event)
    back = events.from_json(orjson.loads(orjson.dumps(obj)))
    assert type(back) is type(event)
    assert back == event
    assert back.meta == event.meta
    assert events.to_json(back) == obj


def _containers(value: Any) -> list[Any]:
    """Every dict and list in ``value``, itself included (without recursion: depth is free)."""
    found: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict | list):
            found.append(item)
            pending.extend(item.values() if isinstance(item, dict) else item)
    return found


def _event_containers(event: Any) -> list[Any]:
    return _containers([getattr(event, f.name) for f in dataclasses.fields(event)])[1:]


def _scribble(value: Any) -> None:
    """Change every dict and list in ``value`` in place, as a careless consumer might."""
    for item in _containers(value):
        if isinstance(item, dict):
            item["scribbled"] = True
        else:
            item.append("scribbled")


def _shared(a: list[Any], b: list[Any]) -> set[int]:
    # Both sides are alive throughout, so equal ids are the same object.
    return {id(x) for x in a} & {id(x) for x in b}


# Every event class, each field that may hold a dict or a list holding some.
CONTAINER_EVENTS: list[Any] = [
    events.ToolCall(id="c", args={"path": "a", "edits": [{"old": "x"}]}, result=[{"ok": True}]),
    events.ToolCall(id="c", phase="end", result={"rows": [[1, 2], []]}),
    events.ToolResult(id="c", result={"content": [{"type": "text", "text": "t"}]}),
    events.ToolResult(id="c", result=[1, [2]]),
    events.ProcessInfo(kind="spawn", data={"argv": ["cli", "-p"], "env": {"names": ["A"]}}),
    events.Notice(kind="transcript.item", data={"item": {"input": {"q": [1]}}}),
    events.Dropped(count=2, by_kind={"text.content": 2}),
    events.SubagentUpdate(agent="a", kind="finished", data={"result": {"files": ["x"]}}),
    events.ApprovalRequest(id="r", details={"tool": {"input": {"cmd": ["rm", "x"]}}}),
]


@pytest.mark.parametrize("event", CONTAINER_EVENTS, ids=events.event_kind)
def test_to_json_shares_no_container_with_the_event(event: Any) -> None:
    before = repr(event)
    out = events.to_json(event)
    assert out == orjson.loads(orjson.dumps(out))  # JSON-shaped data is kept as it is
    assert not _shared(_containers(out), _event_containers(event))
    _scribble(out)
    assert repr(event) == before
    assert events.to_json(event) != out


@pytest.mark.parametrize("path", ["fast", "general"])
@pytest.mark.parametrize("event", CONTAINER_EVENTS, ids=events.event_kind)
def test_from_json_shares_no_container_with_its_input(event: Any, path: str) -> None:
    obj = orjson.loads(orjson.dumps(events.to_json(event)))
    # A dict of the canonical shape takes from_json's shortcut; any other mapping does not.
    back = events.from_json(obj if path == "fast" else MappingProxyType(obj))
    assert back == event
    assert not _shared(_containers(obj), _event_containers(back))
    _scribble(obj)
    assert back == event and repr(back) == repr(event)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_no_event_shares_a_container_with_its_json(event: Any) -> None:
    out = events.to_json(event)
    assert not _shared(_containers(out), _event_containers(event))
    back = events.from_json(out)
    assert not _shared(_containers(out), _event_containers(back))
    _scribble(out)
    assert back == event


def test_to_json_copies_what_nests_deeper_than_the_stack() -> None:
    deep: list[Any] = []
    for _ in range(49_999):
        deep = [deep]  # 50,000 levels
    event = events.ToolCall(id="c", args={"deep": deep})
    copied = events.to_json(event)["args"]["deep"]
    assert _nesting.deeper_than(copied, 49_999) and not _nesting.deeper_than(copied, 50_000)
    assert not _shared(_containers(copied), _containers(deep))


def test_kinds_fold_the_discriminating_field() -> None:
    assert events.event_kind(events.TextDelta(text="x")) == "text.content"
    assert events.event_kind(events.ToolCall(phase="end")) == "tool_call.end"
    assert events.event_kind(events.Notice(kind="transcript.item")) == "notice.transcript.item"
    assert events.event_kind(events.ProcessInfo(kind="stderr")) == "process.stderr"
    assert events.event_kind(events.SubagentUpdate(kind="delta")) == "subagent.delta"
    obj = events.to_json(events.Notice(kind="approval.resolved", text="t"))
    assert "kind" in obj and obj["kind"] == "notice.approval.resolved"
    assert events.from_json(obj) == events.Notice(kind="approval.resolved", text="t")


def test_droppable_set_is_exactly_content_and_raw_chunks() -> None:
    droppable: list[events.Event] = [
        events.TextDelta(phase="content"),
        events.Thinking(phase="content"),
        events.ToolCall(phase="content"),
        events.ProcessInfo(kind="stdout"),
        events.ProcessInfo(kind="stderr"),
        events.SubagentUpdate(kind="delta"),
    ]
    reliable: list[events.Event] = [
        events.TextDelta(phase="start"),
        events.TextDelta(phase="end"),
        events.ToolCall(phase="start"),
        events.ToolResult(),
        events.ProcessInfo(kind="spawn"),
        events.Notice(kind="transcript.item"),
        events.Dropped(),
        events.RunStarted(run_id="r"),
        events.RunFinished(run_id="r"),
        events.SubagentUpdate(kind="finished"),
        events.ApprovalRequest(id="a"),
    ]
    assert all(events.is_droppable(e) for e in droppable)
    assert not any(events.is_droppable(e) for e in reliable)


def test_approval_request_read_back_has_no_responder() -> None:
    req = events.ApprovalRequest(id="run_x-dec-1", kind="permission", title="write")
    back = events.from_json(events.to_json(req))
    assert isinstance(back, events.ApprovalRequest)
    with pytest.raises(adaptor.ApprovalUnavailableError):
        back.approve()
    with pytest.raises(adaptor.ApprovalUnavailableError):
        back.deny("no")


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {},
        {"kind": 3},
        {"kind": "no.such.kind"},
        {"kind": "text"},
        {"kind": "run.started"},  # run_id missing
        {"kind": "run.finished", "run_id": "r", "usage": 5},
        {"kind": "notice.x", "meta": {"time": "not a time"}},
    ],
)
def test_from_json_rejects_malformed_events_with_value_error(bad: Any) -> None:
    with pytest.raises(ValueError):
        events.from_json(bad)


_items = st.builds(
    TranscriptItem,
    kind=st.sampled_from(["assistant", "tool_call", "tool_result", "result"]),
    text=_text,
    tool_use_id=_text,
    tool_name=_text,
    input=_json,
    is_error=st.booleans(),
    usage=_usage,
    metadata=st.dictionaries(_text, _json, max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(
    text=_text,
    usage=_usage,
    transcript=st.lists(_items, max_size=4),
    structured=st.one_of(
        st.none(),
        st.builds(
            StructuredOutput,
            source=st.sampled_from(["native", "prompt_validate"]),
            valid=st.booleans(),
            value=_json,
            errors=st.lists(_text, max_size=2).map(tuple),
        ),
    ),
    terminal=st.one_of(st.none(), st.builds(TerminalPayload, _text, _text)),
)
def test_result_roundtrips_through_json(
    text: str,
    usage: Usage | None,
    transcript: list[TranscriptItem],
    structured: StructuredOutput | None,
    terminal: TerminalPayload | None,
) -> None:
    result = Result(
        run_id="run_0123456789abcdef",
        model="m",
        provider="script",
        text=text,
        usage=usage,
        metadata={"a": "b"},
        structured=structured,
        _raw=RawStreams(stdout="out\n", stderr="err\n", terminal=terminal),
        _transcript=tuple(transcript),
    )
    back = Result.from_json(orjson.loads(orjson.dumps(result.to_json())))
    assert back == result
    assert back.raw() == result.raw()
    assert back.transcript() == result.transcript()


def test_usage_and_transcript_items_serialize_every_field() -> None:
    usage = Usage(input_tokens=1, output_tokens=2, cached_input_tokens=3, cost_usd=0.5)
    assert usage.to_json() == {f.name: getattr(usage, f.name) for f in dataclasses.fields(Usage)}
    item = TranscriptItem(kind="assistant", text="t", usage=usage, input={"a": [1]}, metadata={"m": 1})
    out = item.to_json()
    assert list(out) == [f.name for f in dataclasses.fields(TranscriptItem)]
    assert out["usage"] == usage.to_json() and TranscriptItem.from_json(out) == item
    assert out["input"] is not item.input and out["metadata"] is not item.metadata


@pytest.mark.parametrize("garbage", [None, "x", 3, [1]])
def test_result_from_json_refuses_what_is_no_object(garbage: Any) -> None:
    with pytest.raises(ValueError, match="is an object"):
        Result.from_json(garbage)


@pytest.mark.parametrize(
    "part", [{"usage": "x"}, {"transcript": "zz"}, {"raw": [1]}, {"structured": 5}],
    ids=["usage", "transcript", "raw", "structured"],
)
def test_result_from_json_refuses_a_part_of_the_wrong_type_with_value_error(
    part: dict[str, Any],
) -> None:
    # An AttributeError, where every other malformed record (events, wire forms) is a
    # ValueError: a reader of a damaged verdict file catching that one crashed.
    with pytest.raises(ValueError, match="malformed Result JSON"):
        Result.from_json({"run_id": "r", **part})


def test_decode_never_falls_back_to_text_when_a_schema_was_requested() -> None:
    invalid = Result(
        run_id="r",
        text='{"a": 1}',
        structured=StructuredOutput(source="prompt_validate", valid=False, errors=("/a: bad",)),
    )
    with pytest.raises(ValueError, match="structured output invalid: /a: bad"):
        invalid.decode()
    assert Result(run_id="r", text=' {"a": 1} ').decode() == {"a": 1}
    with pytest.raises(ValueError):
        Result(run_id="r", text="").decode()
    with pytest.raises(ValueError):
        Result(run_id="r", text="not json").decode()


# --- the fast decoding paths agree with the general decoder ----------------------------------


def _outcome(decode: Any, obj: Any) -> tuple[str, Any]:
    """What a decoder makes of ``obj``: its error message, or the event in full (meta, state)."""
    try:
        event = decode(obj)
    except ValueError as exc:
        return "error", str(exc)
    # repr shows meta (compare=False leaves it out of ==) and the times' zones; vars() shows
    # that no attribute was added or left out.
    return "event", (type(event), event, repr(event), vars(event), vars(event.meta))


_mutations = st.one_of(
    st.tuples(st.just("drop"), _text),
    st.tuples(st.just("set"), _text, _json),
    st.tuples(st.just("drop meta"), _text),
    st.tuples(st.just("set meta"), _text, _json),
)
# Names the decoders know, so that drops and overwrites hit real fields as well as strays.
_FIELD_NAMES = st.sampled_from(
    ["kind", "meta", "text", "phase", "data", "id", "args", "usage", "approval_kind", "_responder"]
)
_META_NAMES = st.sampled_from(["run_id", "thread_key", "sequence", "time", "turn_id"])


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.lists(_mutations, max_size=3), st.data())
def test_the_fast_paths_decide_exactly_as_the_general_decoder(
    event: Any, mutations: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    """from_json's shortcut (and the log reader's adopting one) never changes a verdict."""
    obj = orjson.loads(orjson.dumps(events.to_json(event), option=orjson.OPT_SORT_KEYS))
    for mutation in mutations:
        name = data.draw(st.one_of(_FIELD_NAMES, _META_NAMES, st.just(mutation[1])))
        meta = obj.get("meta")
        if mutation[0] == "drop":
            obj.pop(name, None)
        elif mutation[0] == "set":
            obj[name] = mutation[2]
        elif isinstance(meta, dict) and mutation[0] == "drop meta":
            meta.pop(name, None)
        elif isinstance(meta, dict):
            meta[name] = mutation[2]
    before = orjson.dumps(obj)
    expected = _outcome(events._from_json, orjson.loads(before))
    assert _outcome(events.from_json, orjson.loads(before)) == expected
    assert orjson.dumps(obj) == before  # from_json leaves its input alone
    kind = obj.get("kind")
    if isinstance(kind, str):
        adopted = orjson.loads(before)
        event_back = events._adopt_from_json(kind, adopted)
        if event_back is None:
            assert orjson.dumps(adopted) == before  # declined: untouched
        else:
            assert _outcome(lambda _: event_back, None) == expected


@pytest.mark.parametrize(
    "event",
    [
        events.TextDelta(text="x", phase="end"),
        events.Thinking(text="x"),
        events.ToolCall(id="c", args={"a": 1}),
        events.ToolResult(id="c", result=[1]),
        events.ProcessInfo(kind="stderr", text="e"),
        events.Notice(kind="transcript.item", data={"a": 1}),
        events.SubagentUpdate(agent="a", delta="d"),
        events.Dropped(count=1, by_kind={"text.content": 1}),
        events.RunStarted(run_id="r"),
    ],
    ids=events.event_kind,
)
def test_common_kinds_take_the_fast_path(event: Any) -> None:
    """Otherwise the property above would pass vacuously, and replay would be slow."""
    obj = orjson.loads(orjson.dumps(events.to_json(event)))
    quick = events._quick_from_json(obj["kind"], obj)
    assert quick is not None
    assert vars(quick) == vars(events._from_json(obj))
    assert list(vars(quick)) == [f.name for f in dataclasses.fields(quick)]  # __init__'s order
    assert events._adopt_from_json(obj["kind"], obj) is not None


@settings(max_examples=200, deadline=None)
@given(EVENTS, st.sampled_from(["meta", "text", "data"]))
def test_replaced_builds_what_dataclasses_replace_builds(event: Any, name: str) -> None:
    # Every event of a run is copied two or three times (its meta, its redacted text): the
    # fast copy must be exactly the state __init__ leaves, for every class it takes.
    value: Any = events.EventMeta(run_id="r", sequence=7) if name == "meta" else {"x": 1} if name == "data" else "t"
    if name not in {f.name for f in dataclasses.fields(event)}:
        name, value = "meta", events.EventMeta(sequence=3)
    fast, slow = events._replaced(event, **{name: value}), dataclasses.replace(event, **{name: value})
    assert type(fast) is type(slow) and list(vars(fast).items()) == list(vars(slow).items())
    assert fast is not event


def test_replaced_leaves_a_subclass_to_its_own_init() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Checked(events.TextDelta):
        def __post_init__(self) -> None:
            if "secret" in self.text:
                raise ValueError("no secrets here")

    with pytest.raises(ValueError, match="no secrets here"):
        events._replaced(Checked(text="fine"), text="a secret")
    assert events._PLAIN_CLASSES == set(typing.get_args(events.Event))
    for cls in events._PLAIN_CLASSES:
        assert not hasattr(cls, "__post_init__") and "__slots__" not in vars(cls), cls
        assert all(f.init for f in dataclasses.fields(cls)), cls

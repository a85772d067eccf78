"""hosttools.sessionrecorder: the recorder contract on both backends, the JSONL file format,
strict replay, torn tails versus corruption, failure injection, and real processes."""

from __future__ import annotations

import collections
import errno
import json
import logging
import os
import re
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import FrozenInstanceError, dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor import _durable
from adaptor._durable import frame, unframe
from adaptor.approval import Responder
from adaptor.errors import ApprovalUnavailableError
from adaptor.events import (
    ApprovalRequest,
    Choice,
    Dropped,
    Event,
    EventMeta,
    Notice,
    ProcessInfo,
    RunFinished,
    RunStarted,
    SubagentUpdate,
    TextDelta,
    Thinking,
    ToolCall,
    ToolResult,
    event_kind,
    format_time,
    parse_time,
    to_json,
)
from adaptor.result import Usage
from hosttools import sessionrecorder as sr
from hosttools.sessionrecorder import _jsonl
from tests.durable_hooks import count_datasyncs, hook_datasyncs, record_fsyncs
from tests.test_events import EVENTS as EVENT_STRATEGY

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 120
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


class Clock:
    """A deterministic clock: each reading is one second after the previous one."""

    def __init__(self, start: datetime = T0, step: timedelta = timedelta(seconds=1)) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> datetime:
        moment = self.now
        self.now += self.step
        return moment


def _python(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, **kwargs)


def _text(i: int) -> TextDelta:
    return TextDelta(message_id="m", text=f"text {i}")


def _text_of(record: sr.EventRecord) -> str:
    assert isinstance(record.event, TextDelta), record
    return record.event.text


def _seqs(records: list[sr.EventRecord]) -> list[int]:
    return [r.host_seq for r in records]


# --- one contract, both backends -------------------------------------------------------------


@dataclass
class Env:
    """A backend under test and a way to build another on the same storage (a "restart")."""

    name: str
    make: Callable[[], sr.EventBackend]
    root: Path

    def recorder(self, **kwargs: Any) -> sr.EventRecorder:
        return sr.EventRecorder(self.make(), **kwargs)


@pytest.fixture(params=["memory", "jsonl"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    if request.param == "memory":
        return Env("memory", sr.MemoryEventBackend, tmp_path)
    return Env("jsonl", lambda: sr.JSONLEventBackend(tmp_path / "events"), tmp_path)


class _Forwarding:
    """A backend wrapper (logging, metrics) that forwards every method to another."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_backend_forwarding_its_methods_is_taken() -> None:
    # isinstance() against a runtime-checkable Protocol stopped calling __getattr__ in Python
    # 3.12: such a wrapper was refused there ("backend must be an event backend").
    recorder = sr.EventRecorder(_Forwarding(sr.MemoryEventBackend()))
    assert recorder.record("k", TextDelta(text="t")).host_seq == 1
    with pytest.raises(TypeError, match="backend must be an event backend"):
        sr.EventRecorder(_Forwarding(object()))


def test_backends_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(sr.MemoryEventBackend(), sr.EventBackend)
    assert isinstance(sr.JSONLEventBackend(tmp_path), sr.EventBackend)


def test_record_allocates_host_seq_per_key(env: Env) -> None:
    with env.recorder(clock=Clock()) as recorder:
        got = [recorder.record(key, _text(i)) for i, key in enumerate(["ka", "kb", "ka", "kb"])]
        assert [(r.host_seq, _text_of(r)) for r in got] == [
            (1, "text 0"),
            (1, "text 1"),
            (2, "text 2"),
            (2, "text 3"),
        ]
        assert [r.recorded_at for r in got] == [T0 + timedelta(seconds=i) for i in range(4)]
        assert recorder.since("ka") == got[0::2]
        assert recorder.since("kb") == got[1::2]
        # Built without the dataclass __init__ (the cheaper way), still the frozen record.
        assert got[0] == sr.EventRecord(1, T0, got[0].event)
        assert type(got[0]) is sr.EventRecord
        with pytest.raises(FrozenInstanceError):
            got[0].host_seq = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    "event",
    [
        TextDelta(text="x", phase="delta"),  # type: ignore[arg-type]
        ProcessInfo(kind="exit"),  # type: ignore[arg-type]
        ApprovalRequest(id="a1", kind="choice"),  # type: ignore[arg-type]
        TextDelta(text="x", meta=EventMeta(sequence="7x")),  # type: ignore[arg-type]
        TextDelta(text="x", meta=EventMeta(sequence=None)),  # type: ignore[arg-type]
    ],
    ids=["phase", "process-kind", "approval-kind", "sequence-text", "sequence-none"],
)
def test_an_event_no_reader_takes_is_refused_before_it_is_written(env: Env, event: Event) -> None:
    # Acknowledged with a host_seq, it made the key unreadable from that line on (since(),
    # tail(), verify() raised for good, and no repair cuts such a line); the memory backend
    # read it back, against "the same contract".
    with env.recorder() as recorder:
        recorder.record("k", _text(0))
        with pytest.raises(ValueError, match="event cannot be recorded: .* is ('(delta|exit|choice|7x)'|None)"):
            recorder.record("k", event)
        recorder.record("k", _text(1))
        assert [(r.host_seq, _text_of(r)) for r in recorder.since("k")] == [(1, "text 0"), (2, "text 1")]
    if env.name == "jsonl":
        sr.verify(env.root / "events" / "k.jsonl")


@pytest.mark.parametrize("moment", [datetime.min.replace(tzinfo=UTC), datetime(999, 1, 1, tzinfo=UTC)])
def test_times_before_the_year_1000_are_written_as_readers_read_them(env: Env, moment: datetime) -> None:
    # strftime("%Y") wrote year 999 as "999" and year 1 as "1", which fromisoformat refuses:
    # a clock (or an event's meta time) that far back made the key unreadable.
    with env.recorder(clock=lambda: moment) as recorder:
        recorder.record("k", TextDelta(text="x", meta=EventMeta(time=moment)))
        [record] = recorder.since("k")
        assert record.recorded_at == moment and record.event.meta.time == moment
    assert format_time(moment) == f"{moment.year:04d}-01-01T00:00:00.000000Z"
    if env.name == "jsonl":
        sr.verify(env.root / "events" / "k.jsonl")


def test_since_is_strictly_greater_and_ascending(env: Env) -> None:
    with env.recorder() as recorder:
        for i in range(5):
            recorder.record("s", _text(i))
        assert _seqs(recorder.since("s")) == [1, 2, 3, 4, 5]
        assert _seqs(recorder.since("s", 0)) == [1, 2, 3, 4, 5]
        assert _seqs(recorder.since("s", 3)) == [4, 5]
        assert recorder.since("s", 5) == []
        assert recorder.since("s", 99) == []
        assert recorder.since("never-recorded") == []
        assert [_text_of(r) for r in recorder.iter_since("s", 1)] == [
            f"text {i}" for i in range(1, 5)
        ]
        with pytest.raises(ValueError):
            recorder.since("s", -1)


def test_wrong_types_are_named_and_refused(env: Env) -> None:
    # since("s", 1.5) and since("s", True) read as cursors 1.5 and 1, since("s", "2") and
    # tail(r, "s", "3") failed with "'<' not supported between instances of 'str' and 'int'",
    # and record("s", "hello") with "must be called with a dataclass type or instance".
    with env.recorder() as recorder:
        for i in range(3):
            recorder.record("s", _text(i))
        calls: list[tuple[Callable[[], object], str]] = [
            (lambda: recorder.since("s", 1.5), "after_host_seq must be an int, not float"),  # type: ignore[arg-type]
            (lambda: recorder.since("s", True), "after_host_seq must be an int, not bool"),
            (lambda: recorder.iter_since("s", "2"), "after_host_seq must be an int, not str"),  # type: ignore[arg-type]
            (lambda: sr.tail(recorder, "s", "3"), "n must be an int, not str"),  # type: ignore[arg-type]
            (lambda: sr.range_(recorder, "s", 0, 2.0), "to must be an int, not float"),  # type: ignore[arg-type]
            (lambda: sr.range_(recorder, "s", None, 2), "after must be an int, not NoneType"),  # type: ignore[arg-type]
            (lambda: recorder.record("s", "hello"), "event must be an adaptor.events event, not str"),  # type: ignore[arg-type]
            (lambda: recorder.record("s", None), "event must be an adaptor.events event, not NoneType"),  # type: ignore[arg-type]
        ]
        for call, message in calls:
            with pytest.raises(TypeError) as info:
                call()
            assert str(info.value) == message
        assert _seqs(recorder.since("s")) == [1, 2, 3]  # nothing was recorded
        assert _seqs(sr.range_(recorder, "s", 1, 2)) == [2]


def test_constructor_arguments_of_the_wrong_type_are_refused(tmp_path: Path) -> None:
    # sync_on_append="no" was read as yes (it synced), max_open_files="3" failed at the first
    # append with "'<' not supported", and a directory given to EventRecorder in place of a
    # backend was an AttributeError at the first record().
    with pytest.raises(TypeError, match="sync_on_append must be True or False, not str"):
        sr.JSONLEventBackend(tmp_path, "no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_open_files must be an int, not str"):
        sr.JSONLEventBackend(tmp_path, max_open_files="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="directory must be a str or a str path, not bytes"):
        sr.JSONLEventBackend(os.fsencode(tmp_path))  # type: ignore[arg-type]
    for wrong in (str(tmp_path), sr.JSONLEventBackend):
        with pytest.raises(TypeError, match="backend must be an event backend"):
            sr.EventRecorder(wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock must be callable"):
        sr.EventRecorder(sr.MemoryEventBackend(), clock="now")  # type: ignore[arg-type]
    # A validator that is no function was accepted, then every record() failed with
    # "'int' object is not callable"; a clock returning text, with an AttributeError.
    with pytest.raises(TypeError, match="key_validator must be callable, not int"):
        sr.EventRecorder(sr.MemoryEventBackend(), 5)  # type: ignore[arg-type]
    backend = sr.MemoryEventBackend()
    texting = sr.EventRecorder(backend, clock=lambda: "2026-12-05T12:00:00Z")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="the recorder's clock must return a datetime, not str"):
        texting.record("s", _text(0))
    assert texting.since("s") == []


def test_tail_and_range(env: Env) -> None:
    with env.recorder() as recorder:
        for i in range(6):
            recorder.record("s", _text(i))
        assert _seqs(sr.tail(recorder, "s", 2)) == [5, 6]
        assert _seqs(sr.tail(recorder, "s", 1)) == [6]
        assert _seqs(sr.tail(recorder, "s", 10)) == [1, 2, 3, 4, 5, 6]
        assert sr.tail(recorder, "s", 0) == []
        assert sr.tail(recorder, "empty", 3) == []
        assert _seqs(sr.range_(recorder, "s", 2, 4)) == [3, 4]
        assert _seqs(sr.range_(recorder, "s", 0, 1)) == [1]
        assert _seqs(sr.range_(recorder, "s", 4, 100)) == [5, 6]
        assert sr.range_(recorder, "s", 3, 3) == []
        assert sr.range_(recorder, "s", 4, 2) == []
        assert sr.range_(recorder, "s", 6, 9) == []
        with pytest.raises(ValueError):
            sr.tail(recorder, "s", -1)
        with pytest.raises(sr.InvalidSessionKeyError):
            sr.tail(recorder, "../s", 1)
        with pytest.raises(sr.InvalidSessionKeyError):
            sr.range_(recorder, "a/b", 0, 1)


def test_sessions_most_recent_first(env: Env) -> None:
    clock = Clock()
    with env.recorder(clock=clock) as recorder:
        assert recorder.sessions() == []
        for key in ["s1", "s2", "s3", "s2", "s1", "s1"]:
            recorder.record(key, _text(0))
        assert recorder.sessions() == [
            sr.SessionInfo("s1", 3, T0 + timedelta(seconds=5)),
            sr.SessionInfo("s2", 2, T0 + timedelta(seconds=3)),
            sr.SessionInfo("s3", 1, T0 + timedelta(seconds=2)),
        ]


def test_sessions_with_equal_times_are_ordered_by_key(env: Env) -> None:
    with env.recorder(clock=lambda: T0) as recorder:
        for key in ["b", "c", "a"]:
            recorder.record(key, _text(0))
        assert [s.key for s in recorder.sessions()] == ["a", "b", "c"]


@pytest.mark.parametrize("depth", [251, 252])
def test_both_backends_refuse_and_keep_the_same_events(env: Env, depth: int) -> None:
    # The memory backend kept the event alone, the file keeps it inside its record: one level
    # more, so args nested 252 deep were recorded in memory and refused by the file (orjson's
    # nesting limit), and args came back in their own key order from memory, sorted from a file.
    nested: Any = "x"
    for _ in range(depth):
        nested = [nested]
    deep = ToolCall(id="c1", name="t", args={"a": nested}, phase="start")
    ordered = ToolCall(id="c2", name="t", args={"query": 1, "limit": 2, "filters": {"z": 1, "a": 2}}, phase="start")
    with env.recorder() as recorder:
        if depth > 251:
            with pytest.raises(TypeError):
                recorder.record("s", deep)
        else:
            recorder.record("s", deep)
        recorder.record("s", ordered)
        [*_, back] = recorder.since("s")
    assert isinstance(back.event, ToolCall) and back.event.args is not None
    assert list(back.event.args) == ["filters", "limit", "query"] and list(back.event.args["filters"]) == ["a", "z"]


def test_host_seq_continues_after_a_restart(env: Env) -> None:
    if env.name == "memory":
        pytest.skip("a memory backend does not outlive itself")
    with env.recorder() as first:
        for i in range(3):
            first.record("s", _text(i))
    with env.recorder() as second:
        assert second.record("s", _text(3)).host_seq == 4
        assert [_text_of(r) for r in second.since("s", 2)] == ["text 2", "text 3"]
        assert second.sessions()[0].last_host_seq == 4
    with env.recorder() as third:
        assert _seqs(third.since("s")) == [1, 2, 3, 4]


def test_recorded_at_is_utc_and_the_clock_must_be_aware(env: Env) -> None:
    plus_two = datetime(2026, 12, 2, 12, 0, 0, 123456).astimezone()
    with env.recorder(clock=lambda: plus_two) as recorder:
        rec = recorder.record("s", _text(0))
        assert rec.recorded_at == plus_two and rec.recorded_at.tzinfo is UTC
        assert recorder.since("s")[0].recorded_at == plus_two
    with env.recorder(clock=lambda: datetime(2026, 1, 1)) as recorder:
        with pytest.raises(ValueError, match="naive"):
            recorder.record("t", _text(0))
        assert recorder.since("t") == []

    class NoOffset(tzinfo):  # a tzinfo that knows no offset: naive by Python's definition
        def utcoffset(self, dt: datetime | None) -> timedelta | None:
            return None

        def dst(self, dt: datetime | None) -> timedelta | None:
            return None

        def tzname(self, dt: datetime | None) -> str | None:
            return None

    # It was read as the host's local time and recorded shifted by it.
    with env.recorder(clock=lambda: datetime(2026, 1, 1, 12, tzinfo=NoOffset())) as recorder:
        with pytest.raises(ValueError, match="naive"):
            recorder.record("u", _text(0))
        assert recorder.since("u") == []


meta = EventMeta(
    run_id="run-1",
    thread_key="thread/ü",
    sequence=7,
    time=datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC),
    turn_id="turn-1",
)
EVENTS: list[Event] = [
    RunStarted(run_id="run-1", thread_id="th-1", meta=meta),
    RunFinished(
        run_id="run-1",
        thread_id="th-1",
        usage=Usage(input_tokens=1, output_tokens=2, cached_input_tokens=3, cost_usd=0.25),
        failed=True,
        reason="agent_error",
        message="boom",
        meta=meta,
    ),
    RunFinished(run_id="run-2"),
    *[
        TextDelta(message_id="m", text="héllo ✓\n", phase=p, meta=meta)
        for p in ("start", "content", "end")
    ],
    *[Thinking(message_id="m", text="hmm", phase=p) for p in ("start", "content", "end")],
    ToolCall(id="c1", name="bash", args={"cmd": ["ls", "-l"]}, phase="start", meta=meta),
    ToolCall(id="c1", args_delta='{"cm', phase="content"),
    ToolCall(id="c1", result={"ok": True}, phase="end"),
    ToolResult(id="c1", result={"out": [1, 2.5, None, "x"]}, is_error=True),
    ProcessInfo(kind="spawn", data={"argv": ["claude", "-p"], "pid": 42, "env": ["HOME"]}),
    ProcessInfo(kind="stdout", text="out\n"),
    ProcessInfo(kind="stderr", text="err\n"),
    Notice(kind="transcript.item", text="t", data={"nested": {"a": [1]}}),
    Notice(kind="lifecycle", text="started"),
    Dropped(count=3, by_kind={"text.content": 3}, first_sequence=4, last_sequence=6, reason="slow"),
    SubagentUpdate(agent="reviewer", kind="delta", delta="d", data={"k": 1}),
    ApprovalRequest(
        id="ap-1",
        run_id="run-1",
        kind="question",
        title="Pick one",
        source="tool",
        tool_call_id="c1",
        choices=(Choice("y", "Yes", "go ahead"), Choice("n")),
        details={"cmd": "rm -rf build"},
        created_at=datetime(2026, 12, 2, 9, 0, tzinfo=UTC),
        deadline=datetime(2026, 12, 2, 9, 5, tzinfo=UTC),
        attempt=2,
        meta=meta,
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=[event_kind(e) for e in EVENTS])
def test_every_event_class_round_trips_through_a_record(env: Env, event: Event) -> None:
    with env.recorder() as recorder:
        recorder.record("s", event)
        [back] = recorder.since("s")
    assert type(back.event) is type(event)
    assert back.event == event
    assert back.event.meta == event.meta
    assert to_json(back.event) == to_json(event)


def test_recorded_approval_requests_cannot_answer(env: Env) -> None:
    live = ApprovalRequest(id="ap-1", kind="permission", _responder=Responder("permission", ()))
    with env.recorder() as recorder:
        rec = recorder.record("s", live)
        [back] = recorder.since("s")
    for copy in (rec.event, back.event):
        assert isinstance(copy, ApprovalRequest)
        assert copy == live
        with pytest.raises(ApprovalUnavailableError):
            copy.approve()
    assert live._responder is not None  # the caller's own copy stays live


def test_stored_events_are_independent_of_the_callers_objects(env: Env) -> None:
    data: dict[str, Any] = {"a": 1}
    with env.recorder() as recorder:
        recorder.record("s", Notice(kind="x", data=data))
        data["a"] = 2
        assert recorder.since("s")[0].event == Notice(kind="x", data={"a": 1})


def test_an_unserializable_event_records_nothing(env: Env) -> None:
    with env.recorder() as recorder:
        recorder.record("s", _text(0))
        with pytest.raises(TypeError):
            recorder.record("s", ToolResult(id="x", result={1, 2}))
        assert recorder.record("s", _text(1)).host_seq == 2
        assert [_text_of(r) for r in recorder.since("s")] == ["text 0", "text 1"]


def test_backends_allocate_host_seq_themselves(env: Env) -> None:
    backend = env.make()
    with pytest.raises(ValueError, match="allocates"):
        backend.append("s", sr.EventRecord(5, T0, _text(0)))
    assert backend.append("s", sr.EventRecord(0, T0, _text(0))).host_seq == 1
    backend.close()


INVALID_KEYS = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "a\\b",
    "/abs",
    "a" * 129,
    "é",
    "ключ",
    "a b",
    "-lead",
    "_lead",
    "a.b",
    "a\n",
    "a\0b",
    "x/../y",
]


@pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
def test_invalid_keys_are_rejected_and_touch_nothing(env: Env, key: str) -> None:
    before = sorted(env.root.rglob("*"))
    with env.recorder() as recorder:
        with pytest.raises(sr.InvalidSessionKeyError):
            recorder.record(key, _text(0))
        with pytest.raises(sr.InvalidSessionKeyError):
            recorder.since(key)
        with pytest.raises(sr.InvalidSessionKeyError):
            recorder.iter_since(key)  # checked at the call, not at the first next()
        assert recorder.sessions() == []
    assert sorted(env.root.rglob("*")) == before


@pytest.mark.parametrize("key", ["a", "Z", "0", "a" * 128, "A-b_9", "0-_-"])
def test_valid_keys(env: Env, key: str) -> None:
    with env.recorder() as recorder:
        assert recorder.record(key, _text(0)).host_seq == 1
        assert [s.key for s in recorder.sessions()] == [key]


def test_the_validator_is_replaceable(env: Env) -> None:
    def only_upper(key: str) -> None:
        if not key.isupper():
            raise ValueError("keys are upper case here")

    with env.recorder(key_validator=only_upper) as recorder:
        assert recorder.record("ABC", _text(0)).host_seq == 1
        with pytest.raises(sr.InvalidSessionKeyError, match="upper case") as info:
            recorder.record("abc", _text(0))
        assert isinstance(info.value.__cause__, ValueError)
    with env.recorder(key_validator=lambda key: None) as recorder:
        assert recorder.record("with.dots and spaces", _text(0)).host_seq == 1
        with pytest.raises(sr.InvalidSessionKeyError):
            recorder.record(3, _text(0))  # type: ignore[arg-type]


def test_a_custom_validator_is_asked_about_every_record(env: Env) -> None:
    # The default validator's verdicts are remembered; a host's may change over time.
    allowed = {"a"}
    asked: list[str] = []

    def current(key: str) -> None:
        asked.append(key)
        if key not in allowed:
            raise ValueError("not allowed now")

    with env.recorder(key_validator=current) as recorder:
        recorder.record("a", _text(0))
        allowed.clear()
        with pytest.raises(sr.InvalidSessionKeyError, match="not allowed now"):
            recorder.record("a", _text(1))
    assert asked == ["a", "a"]
    with env.recorder() as recorder:
        for _ in range(2):
            with pytest.raises(sr.InvalidSessionKeyError):
                recorder.record("not/a key", _text(0))
        with pytest.raises(sr.InvalidSessionKeyError):
            recorder.record(["s"], _text(0))  # type: ignore[arg-type]


def test_closed_recorder_refuses_everything(env: Env) -> None:
    recorder = env.recorder()
    recorder.record("s", _text(0))
    recorder.close()
    recorder.close()  # idempotent
    for call in (
        lambda: recorder.record("s", _text(1)),
        lambda: recorder.since("s"),
        lambda: recorder.iter_since("s"),
        lambda: recorder.sessions(),
        lambda: sr.tail(recorder, "s", 1),
        lambda: sr.range_(recorder, "s", 0, 1),
    ):
        with pytest.raises(sr.JSONLEventBackendClosedError):
            call()


def test_closed_backend_refuses_everything(env: Env) -> None:
    backend = env.make()
    backend.append("s", sr.EventRecord(0, T0, _text(0)))
    backend.close()
    backend.close()
    for call in (
        lambda: backend.append("s", sr.EventRecord(0, T0, _text(1))),
        lambda: backend.load("s"),
        lambda: backend.sessions(),
    ):
        with pytest.raises(sr.JSONLEventBackendClosedError):
            call()
    # A recorder over a closed backend reports the same.
    with pytest.raises(sr.JSONLEventBackendClosedError):
        sr.EventRecorder(backend).record("s", _text(1))


def test_recorder_closes_its_backend_once() -> None:
    calls = []

    class Counting(sr.MemoryEventBackend):
        def close(self) -> None:
            calls.append(1)
            super().close()

    recorder = sr.EventRecorder(Counting())
    recorder.close()
    recorder.close()
    assert calls == [1]


# --- the JSONL file --------------------------------------------------------------------------


@pytest.fixture
def events_dir(tmp_path: Path) -> Path:
    return tmp_path / "home" / "events"


def _recorder(directory: Path, **kwargs: Any) -> sr.EventRecorder:
    sync = kwargs.pop("sync_on_append", True)
    return sr.EventRecorder(sr.JSONLEventBackend(directory, sync_on_append=sync), **kwargs)


def _fill(directory: Path, key: str, n: int) -> Path:
    with _recorder(directory) as recorder:
        for i in range(n):
            recorder.record(key, _text(i))
    return directory / f"{key}.jsonl"


def test_record_line_format(events_dir: Path) -> None:
    event = TextDelta(message_id="m1", text="hi", meta=meta)
    with _recorder(events_dir, clock=lambda: T0.replace(microsecond=5)) as recorder:
        recorder.record("s", event)
    raw = (events_dir / "s.jsonl").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    line = orjson.loads(raw)
    assert set(line) == {"host_seq", "recorded_at", "kind", "meta", "event", "v", "crc"}
    assert line["host_seq"] == 1
    assert line["recorded_at"] == "2026-12-02T10:00:00.000005Z"
    assert line["kind"] == "text.content"
    assert line["event"] == to_json(event)
    assert line["meta"] == to_json(event)["meta"]
    assert line["v"] == 1
    assert unframe(raw)["crc"] == line["crc"]  # adaptor._durable framing
    assert raw == frame({k: v for k, v in line.items() if k != "crc"})  # sorted keys, one line


def test_files_and_directories_are_private(events_dir: Path) -> None:
    _fill(events_dir, "s", 1)
    assert stat.S_IMODE(events_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(events_dir.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((events_dir / "s.jsonl").stat().st_mode) == 0o600


def test_directory_is_created_lazily_and_must_not_be_a_file(tmp_path: Path) -> None:
    backend = sr.JSONLEventBackend(tmp_path / "a" / "b")
    recorder = sr.EventRecorder(backend)
    assert recorder.since("s") == [] and recorder.sessions() == []
    assert not (tmp_path / "a").exists()
    assert backend.path_for("k") == tmp_path / "a" / "b" / "k.jsonl"
    recorder.close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        sr.JSONLEventBackend(tmp_path / "file")
    assert backend.directory == tmp_path / "a" / "b"


def test_relative_directory_is_resolved_at_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = sr.JSONLEventBackend("events")
    monkeypatch.chdir("/")
    with sr.EventRecorder(backend) as recorder:
        recorder.record("s", _text(0))
    assert (tmp_path / "events" / "s.jsonl").exists()


# The last three are keys no file name can hold: "<key>.jsonl.lock" over 255 bytes (UTF-8),
# or not encodable.  They failed with a bare OSError ("File name too long") or a
# UnicodeEncodeError, some after creating the directory, and since() of some answered [].
@pytest.mark.parametrize(
    "key",
    ["", ".", "..", "../x", "a/b", "a\\b", "/etc/x", "a\0b", "x/..", "k" * 245, "é" * 123, "\ud800"],
)
def test_containment_cannot_be_replaced(tmp_path: Path, key: str) -> None:
    events = tmp_path / "events"
    recorder = _recorder(events, key_validator=lambda key: None)
    with pytest.raises(sr.InvalidSessionKeyError):
        recorder.record(key, _text(0))
    with pytest.raises(sr.InvalidSessionKeyError):
        recorder.since(key)
    recorder.close()
    assert list(tmp_path.iterdir()) == []


def test_the_longest_key_a_file_name_holds_is_recorded(events_dir: Path) -> None:
    key = "k" * 244  # its lock file's name, "<key>.jsonl.lock", is 255 bytes
    with _recorder(events_dir, key_validator=lambda key: None) as recorder:
        assert recorder.record(key, _text(0)).host_seq == 1
        assert _seqs(recorder.since(key)) == [1]
        assert [info.key for info in recorder.sessions()] == [key]
    with pytest.raises(sr.InvalidSessionKeyError, match="too long to name a file: 245 bytes, at most 244"):
        sr.check_contained(key + "k")


def test_records_are_visible_to_tail_f_as_they_happen(events_dir: Path) -> None:
    for sync in (True, False):
        with _recorder(events_dir, sync_on_append=sync) as recorder:
            for i in range(3):
                recorder.record(f"s{sync}", _text(i))
                assert (events_dir / f"s{sync}.jsonl").read_bytes().count(b"\n") == i + 1


def test_first_touch_reads_the_tail_not_the_whole_file(events_dir: Path) -> None:
    path = _fill(events_dir, "s", 5)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"text 1", b"TEXT 1")  # corruption deep in the file
    path.write_bytes(b"".join(lines))
    with _recorder(events_dir) as recorder:
        # An append only checks the last lines, so it proceeds from the tail's host_seq...
        assert recorder.record("s", _text(5)).host_seq == 6
        # ...while a replay is strict.
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            recorder.since("s")
    assert (info.value.key, info.value.line, info.value.why) == ("s", 2, "bad crc")


def test_two_backends_in_one_process_share_the_sequence(events_dir: Path) -> None:
    a, b = _recorder(events_dir), _recorder(events_dir)
    assert [r.record("s", _text(i)).host_seq for i, r in enumerate([a, b, a, a, b])] == [
        1,
        2,
        3,
        4,
        5,
    ]
    assert [_text_of(r) for r in b.since("s")] == [f"text {i}" for i in range(5)]
    a.close()
    b.close()


def test_sessions_ignore_stray_files_and_read_only_tails(events_dir: Path) -> None:
    _fill(events_dir, "good", 2)
    (events_dir / "notes.txt").write_text("hello")
    (events_dir / "sub.jsonl").mkdir()
    (events_dir / "link.jsonl").symlink_to(events_dir / "good.jsonl")
    (events_dir / ".jsonl").write_text("")
    (events_dir / "empty.jsonl").write_bytes(b"")
    odd = _fill(events_dir.parent / "elsewhere", "odd", 1)
    os.rename(odd, events_dir / "has space.jsonl")
    backend = sr.JSONLEventBackend(events_dir)
    # The backend lists every file its containment rule admits; the recorder only keys its
    # validator accepts, so each listed key can be read back.
    assert sorted(s.key for s in backend.sessions()) == ["good", "has space"]
    with sr.EventRecorder(backend) as recorder:
        assert [(s.key, s.last_host_seq) for s in recorder.sessions()] == [("good", 2)]


def test_sessions_pass_over_a_torn_tail_but_not_corruption(events_dir: Path) -> None:
    path = _fill(events_dir, "s", 3)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"crc":12')
    with _recorder(events_dir) as recorder:
        [info] = recorder.sessions()
        assert info.last_host_seq == 3
        with pytest.raises(sr.JSONLEventLogCorruptError) as torn:
            recorder.since("s")
        assert torn.value.line == 4 and torn.value.why.startswith("torn tail")
    lines = whole.splitlines(keepends=True)
    path.write_bytes(lines[0] + b"garbage\n" + lines[2])
    with _recorder(events_dir) as recorder:
        # Left out of the listing (see the next test), still refused by a read.
        assert recorder.sessions() == []
        with pytest.raises(sr.JSONLEventLogCorruptError) as corrupt:
            recorder.since("s")
        assert (corrupt.value.line, corrupt.value.why) == (2, "invalid json")


def _damaged_tail(damage: str) -> tuple[list[bytes], int, str]:
    """A log whose tail last_record() cannot pass over: its lines, the bad line, the why."""
    if damage == "invalid json":
        return [_line(1), b"{not json\n", _line(3)], 2, "invalid json"
    if damage == "bad crc":
        return [_line(1), _line(2).replace(b"text 2", b"text X"), _line(3)], 2, "bad crc"
    if damage == "unknown kind":
        # Framed and timed right: sessions() listed the key that since() then refused.
        bogus = {**to_json(_text(3)), "kind": "bogus.kind"}
        last = _line(3, kind="bogus.kind", event=bogus)
        return [_line(1), _line(2), last], 3, "bad event: unknown event kind 'bogus.kind'"
    # Well framed, so not a torn tail, but not a record either.
    return [_line(1), _line(2), _line(3, recorded_at="nope")], 3, "bad recorded_at: 'nope'"


@pytest.mark.parametrize("damage", ["invalid json", "bad crc", "bad recorded_at", "unknown kind"])
def test_sessions_leave_out_a_corrupt_log_and_list_the_rest(
    events_dir: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(events_dir, "a", 2)
    _fill(events_dir, "c", 1)
    lines, bad_line, why = _damaged_tail(damage)
    (events_dir / "b.jsonl").write_bytes(b"".join(lines))
    with _recorder(events_dir) as recorder:
        with caplog.at_level(logging.WARNING, logger="hosttools.sessionrecorder"):
            listed = recorder.sessions()
        assert sorted((s.key, s.last_host_seq) for s in listed) == [("a", 2), ("c", 1)]
        [warning] = caplog.records
        assert (warning.levelno, warning.name) == (logging.WARNING, "hosttools.sessionrecorder")
        message = warning.getMessage()
        assert f"'b': its event log is corrupt at line {bad_line}: {why}" in message
        assert "text" not in message  # the events' content stays out of the log
        with pytest.raises(sr.JSONLEventLogCorruptError) as corrupt:
            recorder.since("b")
        assert (corrupt.value.key, corrupt.value.line, corrupt.value.why) == ("b", bad_line, why)


def test_sessions_leave_out_a_log_that_cannot_be_read(
    events_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(events_dir, "a", 2)
    lines, _, _ = _damaged_tail("invalid json")
    (events_dir / "b.jsonl").write_bytes(b"".join(lines))
    # The damage sends last_record() to a full replay, which takes the log's lock for a settled
    # size; a lock that is a directory makes that an OSError (chmod 000 would, were we not root).
    (events_dir / "b.jsonl.lock").mkdir()
    with _recorder(events_dir) as recorder:
        with caplog.at_level(logging.WARNING, logger="hosttools.sessionrecorder"):
            assert [s.key for s in recorder.sessions()] == ["a"]
        [warning] = caplog.records
        assert "'b': its event log cannot be read: [Errno 21]" in warning.getMessage()
        with pytest.raises(IsADirectoryError):
            recorder.since("b")


def test_sessions_read_long_lines_at_the_tail(events_dir: Path) -> None:
    with _recorder(events_dir, clock=Clock()) as recorder:
        for i in range(3):
            recorder.record("s", TextDelta(text="x" * 150_000 * (i + 1)))
        assert recorder.sessions() == [sr.SessionInfo("s", 3, T0 + timedelta(seconds=2))]


def test_writer_cuts_a_torn_tail_and_reports_it(events_dir: Path) -> None:
    path = _fill(events_dir, "s", 2)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b'{"host_seq": 3, "ki')
    backend = sr.JSONLEventBackend(events_dir)
    with sr.EventRecorder(backend) as recorder:
        assert recorder.record("s", _text(2)).host_seq == 3
        assert [(r.offset, r.dropped_bytes) for r in backend.repairs] == [(size, 19)]
        assert _seqs(recorder.since("s")) == [1, 2, 3]


def test_writer_refuses_to_append_after_corruption_at_the_tail(events_dir: Path) -> None:
    path = _fill(events_dir, "s", 3)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b"not json\n"
    damaged = b"".join(lines)
    path.write_bytes(damaged)
    with _recorder(events_dir) as recorder:
        for _ in range(2):
            with pytest.raises(sr.JSONLEventLogCorruptError) as info:
                recorder.record("s", _text(3))
            assert (info.value.key, info.value.line) == ("s", 2)
    assert path.read_bytes() == damaged


def test_a_symlinked_log_is_not_followed(events_dir: Path, tmp_path: Path) -> None:
    target = _fill(tmp_path / "other", "t", 1)
    events_dir.mkdir(parents=True)
    (events_dir / "s.jsonl").symlink_to(target)
    with _recorder(events_dir) as recorder:
        with pytest.raises(OSError) as info:
            recorder.since("s")
        assert info.value.errno == errno.ELOOP
        with pytest.raises(OSError):
            recorder.record("s", _text(1))
    assert sr.verify(target) == 1
    # verify() only reads: it checks the file a symlink names (it raised ELOOP before).
    assert sr.verify(events_dir / "s.jsonl") == 1


_FIFO_AS_LOG = """
import errno, json, sys
from adaptor import events
from hosttools import sessionrecorder as sr
recorder = sr.EventRecorder(sr.JSONLEventBackend(sys.argv[1]))
outcomes = []
for step in (lambda: recorder.record("s", events.TextDelta(text="x")), lambda: recorder.since("s")):
    try:
        step()
        outcomes.append("ok")
    except OSError as exc:
        outcomes.append(errno.errorcode[exc.errno] + ": " + exc.strerror)
print(json.dumps(outcomes))
"""


def test_a_fifo_in_place_of_a_log_is_refused_not_waited_on(events_dir: Path) -> None:
    # A FIFO at <key>.jsonl hung record() (its rollback reopened the FIFO read-only, waiting
    # for a writer) and since() (the same open) forever; a daemon's run would never end.
    events_dir.mkdir(parents=True)
    os.mkfifo(events_dir / "s.jsonl")
    proc = subprocess.run(
        [sys.executable, "-c", _FIFO_AS_LOG, str(events_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert orjson.loads(proc.stdout) == ["EINVAL: is not a regular file"] * 2
    assert stat.S_ISFIFO(os.lstat(events_dir / "s.jsonl").st_mode)


def test_repair_follows_a_symlink_and_refuses_a_pipe(tmp_path: Path) -> None:
    # verify() follows a symlink, but repair() of the same path failed with "[Errno 40] Too
    # many levels of symbolic links"; and repair() of a pipe read it to its end first (so
    # nothing was left to check) and then went on as if it were a file.
    log = _fill(tmp_path / "logs", "r", 3)
    whole = log.read_bytes()
    log.write_bytes(whole[:-7])
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    report = sr.repair(link)
    assert report is not None and report.path == str(log)
    assert link.is_symlink() and sr.verify(log) == 2
    reading, writing = os.pipe()
    try:
        with os.fdopen(writing, "wb") as sink:
            sink.write(log.read_bytes())
        with pytest.raises(OSError) as info:
            sr.repair(f"/proc/self/fd/{reading}")
        assert info.value.errno == errno.EINVAL
        assert os.read(reading, 1 << 20) == log.read_bytes()  # not consumed
    finally:
        os.close(reading)


def test_verify_reads_a_pipe(tmp_path: Path) -> None:
    # `adaptor verify-log <(zcat x.jsonl.gz)`: the log arrives through a pipe.
    log = _fill(tmp_path / "logs", "p", 3)
    reading, writing = os.pipe()
    with os.fdopen(writing, "wb") as sink:
        sink.write(log.read_bytes())
    try:
        assert sr.verify(f"/proc/self/fd/{reading}") == 3
    finally:
        os.close(reading)


# --- strict replay: every kind of damage, at its exact line ----------------------------------


def _body(seq: int, **changes: Any) -> dict[str, Any]:
    event = to_json(_text(seq))
    body: dict[str, Any] = {
        "v": 1,
        "host_seq": seq,
        "recorded_at": "2026-12-02T10:00:00.000000Z",
        "kind": event["kind"],
        "meta": event["meta"],
        "event": event,
    }
    for name, value in changes.items():
        if value is _DROP:
            del body[name]
        else:
            body[name] = value
    return body


_DROP = object()


def _line(seq: int, **changes: Any) -> bytes:
    return frame(_body(seq, **changes))


GOOD = [_line(1), _line(2), _line(3)]

DAMAGE: dict[str, tuple[list[bytes], int, str]] = {
    "unterminated last line": (
        [GOOD[0], GOOD[1], GOOD[2][:-1]],
        3,
        "torn tail: unterminated last line",
    ),
    "half a last line": ([GOOD[0], GOOD[1][:30]], 2, "torn tail: unterminated last line"),
    "empty line": ([GOOD[0], b"\n", GOOD[1]], 2, "empty line"),
    "empty last line": ([GOOD[0], b"\n"], 2, "torn tail: empty line"),
    "invalid json": ([GOOD[0], b"{not json\n", GOOD[2]], 2, "invalid json"),
    "not an object": ([GOOD[0], b"[1, 2]\n", GOOD[2]], 2, "not an object"),
    "bad crc": ([GOOD[0], GOOD[1].replace(b"text 2", b"text X"), GOOD[2]], 2, "bad crc"),
    "missing crc": ([GOOD[0], orjson.dumps(_body(2)) + b"\n", GOOD[2]], 2, "missing crc"),
    "first is not 1": ([_line(2), _line(3)], 1, "host_seq gap: expected 1, got 2"),
    "gap": ([GOOD[0], GOOD[2], _line(4)], 2, "host_seq gap: expected 2, got 3"),
    "duplicate": ([GOOD[0], GOOD[1], GOOD[1], _line(3)], 3, "duplicate host_seq 2"),
    "reordered": ([GOOD[0], GOOD[2], GOOD[1]], 2, "host_seq gap: expected 2, got 3"),
    "backwards": ([*GOOD, _line(1), _line(5)], 4, "host_seq went backwards: expected 4, got 1"),
    "missing host_seq": ([GOOD[0], _line(2, host_seq=_DROP), GOOD[2]], 2, "missing host_seq"),
    "bool host_seq": ([_line(1, host_seq=True), GOOD[1]], 1, "bad host_seq: True"),
    "missing recorded_at": (
        [GOOD[0], _line(2, recorded_at=_DROP), GOOD[2]],
        2,
        "missing recorded_at",
    ),
    "bad recorded_at": ([_line(1, recorded_at="yesterday")], 1, "bad recorded_at: 'yesterday'"),
    "naive recorded_at": (
        [_line(1, recorded_at="2026-12-02T10:00:00")],
        1,
        "recorded_at has no time zone",
    ),
    "missing kind": ([GOOD[0], _line(2, kind=_DROP), GOOD[2]], 2, "missing kind"),
    "missing event": ([GOOD[0], _line(2, event=_DROP), GOOD[2]], 2, "missing event"),
    "event not an object": ([_line(1, event="text")], 1, "event is not an object"),
    "unknown kind": (
        [GOOD[0], _line(2, kind="bogus.kind", event={**to_json(_text(2)), "kind": "bogus.kind"})],
        2,
        "bad event: unknown event kind 'bogus.kind'",
    ),
    "unknown phase": (
        [
            GOOD[0],
            _line(2, kind="text.sideways", event={**to_json(_text(2)), "kind": "text.sideways"}),
        ],
        2,
        "bad event: text.sideways has phase='sideways'",
    ),
    "unknown approval kind": (
        [
            _line(
                1,
                kind="approval.requested",
                meta=None,
                event={**to_json(ApprovalRequest(id="a")), "approval_kind": "maybe", "meta": None},
            )
        ],
        1,
        "bad event: approval.requested has kind='maybe'",
    ),
    "kind mismatch": (
        [GOOD[0], _line(2, kind="thinking.content")],
        2,
        "kind 'thinking.content' does not match",
    ),
    "meta mismatch": ([_line(1, meta={"run_id": "other"}), GOOD[1]], 1, "meta does not match"),
    "malformed event": (
        [_line(1, kind="approval.requested", meta=None, event={"kind": "approval.requested", "meta": None})],
        1,
        "bad event: malformed 'approval.requested' event",
    ),
    "future version": ([GOOD[0], _line(2, v=2)], 2, "unsupported format version 2"),
    # Every record carries v (storage.md); a missing one was read as version 1.
    "missing version": ([GOOD[0], _line(2, v=_DROP), GOOD[2]], 2, "missing v"),
    "missing meta": ([GOOD[0], _line(2, meta=_DROP), GOOD[2]], 2, "missing meta"),
    "missing the event's meta": (
        [GOOD[0], _line(2, event={k: v for k, v in to_json(_text(2)).items() if k != "meta"}), GOOD[2]],
        2,
        "missing the event's meta",
    ),
    # The newline between the last two records changed: no torn tail (a crash leaves a prefix
    # of one record), but two whole records, kept.
    "last two run together": (
        [GOOD[0], GOOD[1][:-1] + b" " + GOOD[2]],
        2,
        "invalid json; not a torn record of this log (it holds a whole JSON object and more",
    ),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_every_kind_of_damage_is_reported_at_its_line(events_dir: Path, name: str) -> None:
    lines, line, why = DAMAGE[name]
    events_dir.mkdir(parents=True)
    path = events_dir / "sess.jsonl"
    path.write_bytes(b"".join(lines))
    with _recorder(events_dir) as recorder:
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            recorder.since("sess")
        # The records before the damage are still readable one by one; none is skipped.
        it = recorder.iter_since("sess")
        assert [next(it).host_seq for _ in range(line - 1)] == list(range(1, line))
        with pytest.raises(sr.JSONLEventLogCorruptError):
            next(it)
    err = info.value
    assert (err.key, err.line) == ("sess", line)
    assert err.why.startswith(why), err.why
    assert f"line {line}" in str(err)
    with pytest.raises(sr.JSONLEventLogCorruptError) as again:
        sr.verify(path)
    assert (again.value.key, again.value.line, again.value.why) == ("sess", line, err.why)


def test_crlf_line_endings_are_tolerated(events_dir: Path) -> None:
    events_dir.mkdir(parents=True)
    (events_dir / "s.jsonl").write_bytes(b"".join(line[:-1] + b"\r\n" for line in GOOD))
    with _recorder(events_dir) as recorder:
        assert _seqs(recorder.since("s")) == [1, 2, 3]


def test_missing_file_is_an_empty_history_but_not_verifiable(events_dir: Path) -> None:
    with _recorder(events_dir) as recorder:
        assert recorder.since("nothing") == []
    with pytest.raises(FileNotFoundError):
        sr.verify(events_dir / "nothing.jsonl")
    assert sr.repair(events_dir / "nothing.jsonl") is None
    assert not events_dir.exists()


def test_verify_does_not_create_a_lock_file_for_a_copied_log(tmp_path: Path) -> None:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(b"".join(GOOD))
    assert sr.verify(copy) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.jsonl"]


# --- repair: torn tails only -----------------------------------------------------------------


def test_repair_cuts_a_torn_tail_only(events_dir: Path) -> None:
    path = _fill(events_dir, "s", 3)
    whole = path.read_bytes()
    assert sr.repair(path) is None
    path.write_bytes(whole + b'{"crc": 5, "host')
    report = sr.repair(path)
    assert report is not None
    assert (report.offset, report.dropped_bytes, report.dropped_preview) == (
        len(whole),
        16,
        '{"crc": 5, "host',
    )
    assert path.read_bytes() == whole
    assert sr.verify(path) == 3


@pytest.mark.parametrize(
    "tail",
    [GOOD[2].replace(b"text", b"TEXT"), _line(5), _line(2), b"{}\n", b"\n"],
    ids=["bad crc", "gap", "duplicate", "no crc", "empty"],
)
def test_repair_cuts_a_badly_framed_last_line(events_dir: Path, tail: bytes) -> None:
    events_dir.mkdir(parents=True)
    path = events_dir / "s.jsonl"
    path.write_bytes(GOOD[0] + GOOD[1] + tail)
    report = sr.repair(path)
    assert report is not None and report.offset == len(GOOD[0] + GOOD[1])
    assert sr.verify(path) == 2


@pytest.mark.parametrize("text", [b"my notes, no newline", b"my notes\n"])
def test_a_stray_one_line_file_at_a_keys_path_is_corruption_and_kept(events_dir: Path, text: bytes) -> None:
    # repair() and the first record() under the key emptied such a file as if a crash had torn
    # its only line: a torn write is a prefix of one of our records, which this is not.
    _assert_kept_and_refused(events_dir, "notes", text, line=1, says="not a torn record")


def _assert_kept_and_refused(events_dir: Path, key: str, content: bytes, *, line: int, says: str) -> None:
    """``key``'s log holding ``content`` is corruption at ``line`` to every reader and writer
    (the reason saying ``says``, never "torn"), and stays byte for byte as it is."""
    events_dir.mkdir(parents=True)
    path = events_dir / f"{key}.jsonl"
    path.write_bytes(content)
    attempts: list[Callable[[], object]] = [lambda: sr.repair(path), lambda: sr.verify(path)]
    with _recorder(events_dir) as recorder:
        attempts += [lambda: recorder.record(key, _text(0)), lambda: list(recorder.since(key))]
        for attempt in attempts:
            with pytest.raises(sr.JSONLEventLogCorruptError) as info:
                attempt()
            assert (info.value.key, info.value.line) == (key, line)
            assert not info.value.why.startswith("torn") and says in info.value.why
    assert path.read_bytes() == content


@pytest.mark.parametrize("joint", [b" ", b""], ids=["newline changed", "newline deleted"])
def test_the_last_two_records_run_together_are_kept_and_refused(events_dir: Path, joint: bytes) -> None:
    # The next record() cut such a last line as a torn append: records 2 and 3, acknowledged,
    # were gone and host_seq 2 was handed out again; repair() offered to cut them too.
    damaged = GOOD[0] + GOOD[1][:-1] + joint + GOOD[2]
    _assert_kept_and_refused(events_dir, "s", damaged, line=2, says="lines run together")


def test_repair_refuses_corruption_before_the_tail(events_dir: Path) -> None:
    events_dir.mkdir(parents=True)
    path = events_dir / "s.jsonl"
    damaged = GOOD[0] + b"garbage\n" + GOOD[2] + b'{"torn'
    path.write_bytes(damaged)
    with pytest.raises(sr.JSONLEventLogCorruptError) as info:
        sr.repair(path)
    assert (info.value.key, info.value.line, info.value.why) == ("s", 2, "invalid json")
    assert path.read_bytes() == damaged


def test_repair_refuses_a_well_framed_last_line_that_is_not_a_record(events_dir: Path) -> None:
    events_dir.mkdir(parents=True)
    path = events_dir / "s.jsonl"
    damaged = GOOD[0] + _line(2, kind="no.such", event={"kind": "no.such"})
    path.write_bytes(damaged)
    with pytest.raises(sr.JSONLEventLogCorruptError) as info:
        sr.repair(path)
    assert info.value.line == 2 and not info.value.why.startswith("torn")
    assert path.read_bytes() == damaged


_TEMPLATE: list[bytes] = []


def _template() -> bytes:
    """A real log of twelve records of varied sizes, written once by the recorder."""
    if not _TEMPLATE:
        with tempfile.TemporaryDirectory() as tmp:
            with _recorder(Path(tmp), sync_on_append=False) as recorder:
                for i in range(12):
                    recorder.record("t", TextDelta(text="y" * (i * 37 % 300)))
            _TEMPLATE.append((Path(tmp) / "t.jsonl").read_bytes())
    return _TEMPLATE[0]


@HYPOTHESIS
@given(st.data())
def test_truncation_anywhere_is_valid_or_a_torn_tail_at_the_last_line(data: st.DataObject) -> None:
    whole = _template()
    ends = [m.end() for m in re.finditer(b"\n", whole)]
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    complete = sum(1 for end in ends if end <= cut)
    boundary = ends[complete - 1] if complete else 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(whole[:cut])
        if cut == boundary:
            assert sr.verify(path) == complete
            assert sr.repair(path) is None
        else:
            with pytest.raises(sr.JSONLEventLogCorruptError) as info:
                sr.verify(path)
            assert info.value.line == complete + 1
            assert info.value.why.startswith("torn tail")
            report = sr.repair(path)
            assert report is not None
            assert (report.offset, report.dropped_bytes) == (boundary, cut - boundary)
            assert sr.verify(path) == complete
        with _recorder(Path(tmp)) as recorder:
            assert recorder.record("t", _text(0)).host_seq == complete + 1
            assert len(recorder.since("t")) == complete + 1


@HYPOTHESIS
@given(st.data())
def test_damage_before_the_last_line_is_reported_and_never_repaired(data: st.DataObject) -> None:
    whole = _template()
    ends = [m.end() for m in re.finditer(b"\n", whole)]
    line = data.draw(st.integers(1, len(ends) - 1), label="line")  # never the last line
    start = ends[line - 2] if line > 1 else 0
    # Any byte but the newline: a merged line N-1 would become a (repairable) last line.
    offset = data.draw(st.integers(start, ends[line - 1] - 2), label="offset")
    flip = data.draw(st.integers(1, 255), label="flip")
    damaged = bytearray(whole)
    damaged[offset] ^= flip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(bytes(damaged))
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            sr.verify(path)
        assert info.value.line == line
        assert not info.value.why.startswith("torn")
        with pytest.raises(sr.JSONLEventLogCorruptError):
            sr.repair(path)
        assert path.read_bytes() == bytes(damaged)


# --- the fast readers agree with line-by-line decoding ---------------------------------------
#
# replay() and verify() decode whole batches column by column, or lines on a shortcut, and fall
# back to decode() only when those are unsure.  The reference below is decode() alone, line by
# line, with from_json's general decoder: every log, valid or damaged, must read the same.


def _log_of(events_: list[Event], first: int = 1) -> bytes:
    from hosttools.sessionrecorder import _format

    return b"".join(
        frame(
            {
                **_format.encode(sr.EventRecord(0, T0 + timedelta(microseconds=7 * i), event)),
                "v": 1,
                "host_seq": first + i,
            }
        )
        for i, event in enumerate(events_)
    )


def _object_and_more(raw: bytes) -> bool:
    try:
        _, end = json.JSONDecoder().raw_decode(raw.decode("utf-8", errors="replace"))
    except ValueError:
        return False
    return bool(raw.decode("utf-8", errors="replace")[end:].strip("\x00\r\n"))


def _reference(data: bytes) -> tuple[list[sr.EventRecord], tuple[int, str] | None]:
    """The records decode() accepts line by line, and (line, why) of the first it refuses."""
    from unittest import mock

    from adaptor import events as events_module
    from hosttools.sessionrecorder import _format

    raws = re.findall(b"[^\n]*\n|[^\n]+$", data)
    records: list[sr.EventRecord] = []
    with mock.patch.object(_format, "from_json", events_module._from_json):
        for line, raw in enumerate(raws, 1):
            try:
                records.append(_format.decode(raw, line))
            except _format._LineError as exc:
                if not (exc.framing and line == len(raws)):
                    return records, (line, exc.why)
                # A crash leaves a prefix of a record, zeros or a bare newline; nothing else
                # (a prefix of one record never holds a whole object with more after it).
                if raw[:1] in (b"\x00", b"\n") or (raw[:1] == b"{" and not _object_and_more(raw)):
                    return records, (line, f"torn tail: {exc.why}")
                return records, (line, _durable.not_torn(exc.why, raw))
    return records, None


def _full(record: sr.EventRecord) -> tuple[Any, ...]:
    """A record down to the event's state (vars) and meta, which == leaves out."""
    event = record.event
    return (
        record.host_seq,
        repr(record.recorded_at),
        type(event),
        event,
        repr(event),
        vars(event),
        vars(event.meta),
    )


def _read_all(path: Path) -> tuple[list[sr.EventRecord], tuple[int, str] | None]:
    from hosttools.sessionrecorder import _format

    records: list[sr.EventRecord] = []
    try:
        for record in _format.load(str(path), "t"):
            records.append(record)
    except sr.JSONLEventLogCorruptError as exc:
        assert exc.key == "t"
        return records, (exc.line, exc.why)
    return records, None


def _check_against_reference(path: Path) -> None:
    expected, error = _reference(path.read_bytes())
    got, got_error = _read_all(path)
    assert got_error == error
    assert [_full(r) for r in got] == [_full(r) for r in expected]
    if error is None:
        assert sr.verify(path) == len(expected)
    else:
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            sr.verify(path)
        assert (info.value.line, info.value.why) == error


_CHUNKS = st.sampled_from([1, 7, 300, 4096, 64 * 1024])


@HYPOTHESIS
@given(st.lists(EVENT_STRATEGY, min_size=1, max_size=12), _CHUNKS)
def test_valid_logs_read_exactly_as_decode_reads_them(events_: list[Event], chunk: int) -> None:
    from unittest import mock

    from hosttools.sessionrecorder import _format

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(_format, "_CHUNK", chunk):
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(_log_of(events_))
        _check_against_reference(path)
        assert len(_read_all(path)[0]) == len(events_)


_DAMAGES = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.sampled_from(b'\n {}",:0aZ\\')),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("swap lines"), st.integers(0, 10**6)),
)


@HYPOTHESIS
@given(st.lists(EVENT_STRATEGY, min_size=1, max_size=8), st.lists(_DAMAGES, max_size=2), _CHUNKS)
def test_damaged_logs_fail_exactly_where_decode_fails(
    events_: list[Event], damages: list[tuple[Any, ...]], chunk: int
) -> None:
    from unittest import mock

    from hosttools.sessionrecorder import _format

    data = bytearray(_log_of(events_))
    for damage in damages:
        at = damage[1] % (len(data) + 1)
        if damage[0] == "flip" and at < len(data):
            data[at] ^= damage[2]
        elif damage[0] == "cut":
            del data[at:]
        elif damage[0] == "insert":
            data[at:at] = bytes([damage[2]])
        elif damage[0] == "delete":
            del data[at : at + 1]
        elif damage[0] == "swap lines":
            lines = bytes(data).splitlines(keepends=True)
            if len(lines) > 1:
                i = damage[1] % (len(lines) - 1)
                lines[i], lines[i + 1] = lines[i + 1], lines[i]
                data = bytearray(b"".join(lines))
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(_format, "_CHUNK", chunk):
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(bytes(data))
        if not data:
            assert sr.verify(path) == 0
            return
        _check_against_reference(path)


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from(["", "x", "text.content", "2026-12-02T10:00:00Z", "2026-12-02Z10:00:00Z"]),
    # Fresh containers per draw: st.just({}) would hand every example the same dict, which the
    # test's edits can make contain itself (orjson then hits its recursion limit).
    st.builds(dict),
    st.builds(list),
)
_PLACES = st.sampled_from(["record", "event", "meta", "event meta"])
_NAMES = st.sampled_from(
    ["v", "host_seq", "recorded_at", "kind", "meta", "event", "text", "phase", "data", "id"]
    + ["message_id", "run_id", "thread_key", "sequence", "time", "turn_id", "_responder", "x"]
)


@HYPOTHESIS
@given(
    st.lists(EVENT_STRATEGY, min_size=1, max_size=6),
    st.integers(0, 5),
    st.lists(
        st.tuples(_PLACES, _NAMES, st.one_of(st.just(_DROP), _VALUES)), min_size=1, max_size=3
    ),
)
def test_well_framed_but_wrong_records_fail_exactly_where_decode_fails(
    events_: list[Event], which: int, changes: list[tuple[str, str, Any]]
) -> None:
    """Edits under a valid crc: only the record-level checks can catch these."""
    lines = _log_of(events_).splitlines(keepends=True)
    which %= len(lines)
    body = unframe(lines[which])
    for place, name, value in changes:
        target: Any = {
            "record": body,
            "event": body.get("event"),
            "meta": body.get("meta"),
            "event meta": (body.get("event") or {}).get("meta")
            if isinstance(body.get("event"), dict)
            else None,
        }[place]
        if not isinstance(target, dict):
            continue
        if value is _DROP:
            target.pop(name, None)
        else:
            target[name] = value
    lines[which] = frame(body)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(b"".join(lines))
        _check_against_reference(path)


def test_every_single_byte_flip_fails_at_its_line() -> None:
    """Exhaustively, on a small log of common kinds: each byte, each of a few flips."""
    from hosttools.sessionrecorder import _format

    log = _log_of([EVENTS[i] for i in (3, 9, 12, 14, 17)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        for at in range(len(log)):
            for flip in (0x01, 0x80):
                damaged = bytearray(log)
                damaged[at] ^= flip
                path.write_bytes(bytes(damaged))
                expected, error = _reference(bytes(damaged))
                assert error is not None
                got, got_error = _read_all(path)
                assert got_error == error, (at, flip)
                assert [_full(r) for r in got] == [_full(r) for r in expected]
                with pytest.raises(sr.JSONLEventLogCorruptError) as info:
                    _format.verify(path)
                assert (info.value.line, info.value.why) == error


def test_the_batch_and_line_shortcuts_are_taken_for_common_kinds() -> None:
    """Otherwise the properties above would pass vacuously, and replay would be slow."""
    from hosttools.sessionrecorder import _format

    common = [EVENTS[i] for i in (0, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)]
    lines = _log_of(common).splitlines(keepends=True)
    records = _format._quick_batch(lines, 1, True)
    assert records is not None
    assert [_full(r) for r in records] == [_full(r) for r in _reference(b"".join(lines))[0]]
    assert _format._quick_batch(lines, 1, False) == []
    assert _format._quick_batch(lines, 2, False) is None  # the sequence is checked
    for seq, line in enumerate(lines, 1):
        assert _format._quick_decode(line, seq) is not None


_STAMP_TEXT = st.one_of(
    st.datetimes(
        min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    ).map(format_time),
    st.text(alphabet="0123456789-:T.Z+ W,\0", max_size=32),
    st.sampled_from(
        ["2026-12-02Z", "2026-12-02T10Z", "2026-12-02T10:00:00ZZ", "2026-12-02Z10:00:00Z", ""]
        + ["2026-12-02T10:00:00.000000+00:00", "2026-12-02T10:00:00.000000Z\0Z", "Z"]
    ),
)


@HYPOTHESIS
@given(st.lists(_STAMP_TEXT, min_size=1, max_size=6))
def test_the_batch_stamp_shortcut_parses_exactly_as_parse_time(stamps: list[str]) -> None:
    """_parse_stamps() skips parse_time's Z-replacing copy; it must never differ from it."""
    from hosttools.sessionrecorder import _format

    try:
        got = _format._parse_stamps(stamps)
    except ValueError:
        return  # the batch's caller takes any exception as "ask the line-by-line path"
    if got is None:
        return  # likewise: never a verdict
    assert [(repr(m), m.tzinfo) for m in got] == [
        (repr(parse_time(s)), parse_time(s).tzinfo) for s in stamps
    ]


def test_the_batch_stamp_shortcut_takes_what_format_time_writes() -> None:
    from hosttools.sessionrecorder import _format

    stamps = [format_time(T0 + timedelta(microseconds=i * 37_001)) for i in range(50)]
    assert _format._parse_stamps(stamps) == [parse_time(s) for s in stamps]
    assert _format._parse_stamps([stamps[0], stamps[1][:-1] + "+00:00"]) is None
    # fromisoformat() takes a stamp with a NUL and a second "Z" that parse_time() refuses; with
    # a stamp lacking its "Z" the batch's counts came out right (found by the property test).
    assert _format._parse_stamps([stamps[0][:-1], stamps[1] + "\0Z"]) is None


# --- failures while appending: rollback and poison -------------------------------------------


@pytest.fixture
def started(events_dir: Path) -> tuple[sr.EventRecorder, Path]:
    """A recorder whose key "s" has two records (so the file exists before any injection)."""
    recorder = _recorder(events_dir)
    recorder.record("s", _text(0))
    recorder.record("s", _text(1))
    return recorder, events_dir / "s.jsonl"


def _fail_fsync_on(monkeypatch: pytest.MonkeyPatch, times: int = 1) -> list[int]:
    calls: list[int] = []
    real = _durable._datasync

    def failing(fd: int) -> None:
        calls.append(fd)
        if len(calls) <= times:
            raise OSError(errno.EIO, "injected fsync failure")
        real(fd)

    hook_datasyncs(monkeypatch, failing)
    return calls


def _short_write_on(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    real = os.write
    real_pwritev = os.pwritev
    target = path.stat()

    def short(fd: int, data: Any) -> int:
        if os.path.samestat(os.fstat(fd), target):
            real(fd, bytes(data)[:10])
            raise OSError(errno.ENOSPC, "injected short write")
        return real(fd, data)

    def short_pwritev(fd: int, buffers: Sequence[Any], offset: int, flags: int = 0) -> int:
        # The one-call write-and-sync form (see tests.durable_hooks).
        if os.path.samestat(os.fstat(fd), target):
            return short(fd, b"".join(buffers))
        return real_pwritev(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "write", short)
    monkeypatch.setattr(os, "pwritev", short_pwritev)


def _fail_truncate(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "injected truncate failure")

    monkeypatch.setattr(os, "ftruncate", failing)


def test_failed_fsync_rolls_back_and_the_key_stays_usable(
    started: tuple[sr.EventRecorder, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, path = started
    size = path.stat().st_size
    _fail_fsync_on(monkeypatch)
    with pytest.raises(OSError, match="injected fsync failure"):
        recorder.record("s", _text(2))
    assert path.stat().st_size == size  # the unacknowledged record is gone
    # Nothing advanced: the retry gets the number the failed attempt would have had.
    assert recorder.record("s", _text(3)).host_seq == 3
    assert [_text_of(r) for r in recorder.since("s")] == ["text 0", "text 1", "text 3"]
    recorder.close()


def test_short_write_rolls_back(
    started: tuple[sr.EventRecorder, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder, path = started
    size = path.stat().st_size
    _short_write_on(monkeypatch, path)
    with pytest.raises(OSError, match="short write"):
        recorder.record("s", _text(2))
    monkeypatch.undo()
    assert path.stat().st_size == size
    assert recorder.record("s", _text(3)).host_seq == 3
    assert sr.verify(path) == 3
    recorder.close()


@pytest.mark.parametrize("failure", ["short write", "fsync", "sync of the rollback"])
def test_a_failed_rollback_poisons_the_key(
    started: tuple[sr.EventRecorder, Path], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    recorder, path = started
    if failure == "short write":
        _short_write_on(monkeypatch, path)
        _fail_truncate(monkeypatch)
    elif failure == "fsync":
        _fail_fsync_on(monkeypatch)
        _fail_truncate(monkeypatch)
    else:
        _fail_fsync_on(monkeypatch)

        def fsync_fails(fd: int) -> None:
            raise OSError(errno.EIO, "injected fsync failure of the rollback")

        monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError) as first:
        recorder.record("s", _text(2))
    original = first.value
    assert "injected" in str(original) and "rollback" not in str(original)
    monkeypatch.undo()  # the disk "recovers"; the key stays poisoned regardless

    for call in (
        lambda: recorder.record("s", _text(3)),
        lambda: recorder.since("s"),
        lambda: recorder.iter_since("s"),
        lambda: sr.tail(recorder, "s", 1),
    ):
        with pytest.raises(OSError) as later:
            call()
        assert later.value is original
    # Other keys are unaffected.
    assert recorder.record("other", _text(0)).host_seq == 1
    # Closing reports the poison, to every caller.
    for _ in range(2):
        with pytest.raises(OSError) as at_close:
            recorder.close()
        assert at_close.value is original

    # A new process (here: a new backend) starts from the file: a torn tail is cut and the
    # sequence continues.  A record whose fsync failed but was written whole stays: it is
    # intact, merely unacknowledged (its caller saw the error).
    survivors = ["text 0", "text 1"] + (["text 2"] if failure == "fsync" else [])
    backend = sr.JSONLEventBackend(path.parent)
    with sr.EventRecorder(backend) as fresh:
        assert fresh.record("s", _text(4)).host_seq == len(survivors) + 1
        assert [_text_of(r) for r in fresh.since("s")] == [*survivors, "text 4"]
        assert len(backend.repairs) == (1 if failure == "short write" else 0)


def _descriptors_on(path: Path) -> int:
    return sum(
        os.path.realpath(f"/proc/self/fd/{fd}") == str(path) for fd in os.listdir("/proc/self/fd")
        if os.path.lexists(f"/proc/self/fd/{fd}")
    )


def test_a_key_poisoned_by_a_descriptor_shortage_lets_its_descriptors_go(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Out of descriptors, a buffered key could not open its sync descriptor and was poisoned;
    # a poisoned key was never retired, so it held its log's descriptor for good and a
    # process short of descriptors (the daemon under a low ulimit -n) stayed short.

    backend = sr.JSONLEventBackend(events_dir, sync_on_append=False)
    recorder = sr.EventRecorder(backend)
    shortage = OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    def no_descriptor(log: _durable.DurableLog) -> int:
        raise shortage

    monkeypatch.setattr(_durable.DurableLog, "duplicate_descriptor", no_descriptor)
    assert recorder.record("s", _text(0)).host_seq == 1  # written, not durable: poisoned
    monkeypatch.undo()
    path = (events_dir / "s.jsonl").resolve()
    assert _descriptors_on(path) >= 1
    assert backend.close_idle() == 1
    assert _descriptors_on(path) == 0
    with pytest.raises(OSError) as later:  # the key stays poisoned, as it was
        recorder.record("s", _text(1))
    assert later.value is shortage
    assert recorder.record("other", _text(0)).host_seq == 1


def test_a_failed_sync_in_buffered_mode_poisons_and_is_reported_by_close(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasyncs = _fail_fsync_on(monkeypatch, times=0)
    recorder = _recorder(events_dir, sync_on_append=False)
    for i in range(3):
        recorder.record("s", _text(i))
    assert datasyncs == []  # buffered: no fsync per append

    def fsync_fails(fd: int) -> None:
        raise OSError(errno.EIO, "injected write-back failure")

    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="write-back") as first:
        recorder.close()
    with pytest.raises(OSError) as second:
        recorder.close()
    assert second.value is first.value


def _fail_first_fsync_of(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[str]:
    """Fail the next ``os.fsync`` of ``path`` (as a write-back error would), sync the rest;
    lists the outcome of each of its fsyncs from now on."""
    real = os.fsync
    outcomes: list[str] = []

    def once(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            outcomes.append("failed" if not outcomes else "synced")
            if outcomes == ["failed"]:
                raise OSError(errno.EIO, "injected write-back failure")
        real(fd)

    monkeypatch.setattr(os, "fsync", once)
    return outcomes


def _one_synced_line_then_one_not(
    events_dir: Path,
) -> tuple[sr.JSONLEventBackend, sr.EventRecorder, Path]:
    """A buffered backend whose key ``t`` holds "text 0", flushed, then "text 1", not."""
    backend = sr.JSONLEventBackend(events_dir, sync_on_append=False)
    recorder = sr.EventRecorder(backend)
    recorder.record("t", _text(0))
    backend.flush("t")
    recorder.record("t", _text(1))
    return backend, recorder, events_dir / "t.jsonl"


def test_a_failed_sync_in_buffered_mode_cuts_the_unsynced_lines_and_the_key_goes_on(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key refused every later append and read for the life of the backend, even once the
    # disk was fine again: a daemon recorded no event of that thread's later runs until it was
    # restarted.  And the lines whose sync failed stayed, though the disk may not have them.
    backend, recorder, path = _one_synced_line_then_one_not(events_dir)
    synced_size = len(path.read_bytes().splitlines(keepends=True)[0])
    recorder.record("t", _text(2))
    outcomes = _fail_first_fsync_of(monkeypatch, path)
    with pytest.raises(OSError, match="injected write-back failure"):
        backend.flush("t")
    # The failed sync is not retried: the lines it covered are cut, the cut made durable.
    assert outcomes == ["failed", "synced"]
    assert path.stat().st_size == synced_size
    assert backend.close_idle("t") == 1  # (as the daemon does after a run's verdict)
    assert recorder.record("t", _text(3)).host_seq == 2
    backend.flush("t")
    assert [_text_of(r) for r in recorder.since("t")] == ["text 0", "text 3"]
    assert sr.verify(path) == 2
    recorder.close()


@pytest.mark.parametrize("where", ["after", "among"])
def test_a_failed_sync_does_not_cut_another_writers_lines(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    backend = sr.JSONLEventBackend(events_dir, sync_on_append=False)
    buffered = sr.EventRecorder(backend)
    path = events_dir / "t.jsonl"
    buffered.record("t", _text(0))
    with _recorder(events_dir) as other:
        other.record("t", _text(1))  # after this writer's unsynced line
    if where == "among":
        buffered.record("t", _text(2))  # the file ends with this writer's line again
    size = path.stat().st_size
    _fail_first_fsync_of(monkeypatch, path)
    with pytest.raises(OSError, match="injected") as first:
        backend.flush("t")
    assert path.stat().st_size == size  # nothing cut: the key is poisoned instead
    with pytest.raises(OSError) as later:
        buffered.record("t", _text(3))
    assert later.value is first.value
    assert sr.verify(path) == (3 if where == "among" else 2)


@pytest.mark.parametrize("next_use", ["record", "flush"])
def test_an_evicted_keys_failed_sync_is_reported_once_to_its_next_use(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch, next_use: str
) -> None:
    backend, recorder, path = _one_synced_line_then_one_not(events_dir)
    _fail_first_fsync_of(monkeypatch, path)
    assert backend.close_idle("t") == 1  # its sync fails here, where nobody can be told
    with pytest.raises(OSError, match="injected write-back failure"):
        if next_use == "record":
            recorder.record("t", _text(2))
        else:
            backend.flush("t")
    assert recorder.record("t", _text(3)).host_seq == 2
    backend.flush("t")  # reported once only
    assert [_text_of(r) for r in recorder.since("t")] == ["text 0", "text 3"]
    recorder.close()


def test_buffered_mode_syncs_on_flush_of_all_or_named_keys_and_on_close(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = record_fsyncs(monkeypatch, events_dir)
    backend = sr.JSONLEventBackend(events_dir, sync_on_append=False)
    recorder = sr.EventRecorder(backend)
    for key in ("a", "b", "c"):
        recorder.record(key, _text(0))
    synced.clear()
    backend.flush("b", "never-written")
    assert synced == [str(events_dir / "b.jsonl")]
    backend.flush("b")  # nothing dirty any more
    assert len(synced) == 1
    backend.flush()
    assert sorted(synced[1:]) == [str(events_dir / "a.jsonl"), str(events_dir / "c.jsonl")]
    backend.flush()  # nothing dirty
    assert len(synced) == 3
    recorder.record("a", _text(1))
    recorder.close()
    assert len(synced) == 4


def test_a_bytes_path_or_an_empty_directory_is_said_for_what_it_is(events_dir: Path) -> None:
    # verify(b"...") failed in a string method ("endswith first arg must be bytes"), and
    # JSONLEventBackend("") (an unset variable) put the logs in the current directory.
    for tool in (sr.verify, sr.repair):
        with pytest.raises(TypeError, match="a log's path must be a str or a str path, not bytes"):
            tool(os.fsencode(events_dir / "s.jsonl"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="directory is empty"):
        sr.JSONLEventBackend("")


@pytest.mark.parametrize("keys", [(("a", "b"),), (5,), (None,), (["a", "b"],)], ids=["tuple", "int", "none", "list"])
def test_flush_and_close_idle_refuse_a_key_that_is_no_str(events_dir: Path, keys: tuple[Any, ...]) -> None:
    # flush(("a", "b")) meant flush("a", "b"): skipped as a key never written, it synced
    # nothing and said nothing (a list raised "unhashable type").
    with sr.JSONLEventBackend(events_dir, sync_on_append=False) as backend:
        sr.EventRecorder(backend).record("a", _text(0))
        for call in (backend.flush, backend.close_idle):
            with pytest.raises(TypeError, match="a session key is a str"):
                call(*keys)


# --- concurrency -----------------------------------------------------------------------------


def test_concurrent_threads_are_group_committed(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = sr.JSONLEventBackend(events_dir)
    recorder = sr.EventRecorder(backend)
    recorder.record("s", _text(0))  # the session exists; its writer is idle
    followers = 7
    real = _durable._datasync
    datasyncs: list[int] = []

    def gated(fd: int) -> None:
        datasyncs.append(fd)
        if len(datasyncs) == 1:
            # Hold the first commit until every other writer has queued behind it.
            session = backend._sessions["s"]
            deadline = time.monotonic() + CHILD_TIMEOUT
            while len(session._queue) < followers:
                assert time.monotonic() < deadline, "writers never queued"
                time.sleep(0.001)
        real(fd)

    hook_datasyncs(monkeypatch, gated)
    results: dict[int, sr.EventRecord | BaseException] = {}

    def write(i: int) -> None:
        event: Event = ToolResult(result={1}) if i == 3 else _text(i)
        try:
            results[i] = recorder.record("s", event)
        except BaseException as exc:
            results[i] = exc

    leader = threading.Thread(target=write, args=(0,))
    leader.start()
    while not datasyncs:  # the leader is inside its fsync
        leader.join(0.001)
    threads = [threading.Thread(target=write, args=(i,)) for i in range(1, followers + 1)]
    for t in threads:
        t.start()
    for t in [leader, *threads]:
        t.join(CHILD_TIMEOUT)
    assert isinstance(results.pop(3), TypeError)  # the unserializable one fails alone
    seqs = sorted(r.host_seq for r in results.values() if isinstance(r, sr.EventRecord))
    assert seqs == list(range(2, 2 + followers))
    # One fsync for the leader, one for the six good followers batched together.
    assert len(datasyncs) == 2
    assert len(recorder.since("s")) == 1 + followers  # the first, the leader, six followers
    recorder.close()


def test_many_threads_many_keys(events_dir: Path) -> None:
    backend = sr.JSONLEventBackend(events_dir, max_open_files=3)
    recorder = sr.EventRecorder(backend)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                recorder.record(f"k{(worker + i) % 6}", _text(worker * 1000 + i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    assert errors == []
    total = 0
    for k in range(6):
        records = recorder.since(f"k{k}")
        assert _seqs(records) == list(range(1, len(records) + 1))
        total += len(records)
    assert total == 8 * 40
    recorder.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("sync", [True, False])
def test_idle_sessions_give_back_their_file_descriptors(events_dir: Path, sync: bool) -> None:
    def open_logs() -> int:
        count = 0
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except FileNotFoundError:
                continue
            count += target.startswith(str(events_dir)) and target.endswith(".jsonl")
        return count

    backend = sr.JSONLEventBackend(events_dir, sync_on_append=sync, max_open_files=2)
    with sr.EventRecorder(backend) as recorder:
        for round_ in range(3):
            for k in range(10):
                assert recorder.record(f"k{k}", _text(round_)).host_seq == round_ + 1
                assert open_logs() <= 2 * (1 if sync else 2)
    assert open_logs() == 0
    for k in range(10):
        assert sr.verify(events_dir / f"k{k}.jsonl") == 3


_APPENDER = """
import sys
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
directory, worker, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.stdin.readline()  # start together
with sr.EventRecorder(sr.JSONLEventBackend(directory)) as recorder:
    for i in range(count):
        print(recorder.record("shared", TextDelta(message_id=worker, text=str(i))).host_seq)
"""


def test_two_processes_append_to_one_key(events_dir: Path) -> None:
    count = 150
    procs = [
        _python(
            _APPENDER, str(events_dir), w, str(count), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for w in ("a", "b")
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    acked = {}
    for worker, proc in zip(("a", "b"), procs, strict=True):
        out, _ = proc.communicate(timeout=CHILD_TIMEOUT)
        assert proc.returncode == 0
        acked[worker] = [int(line) for line in out.split()]
    for seqs in acked.values():
        assert len(seqs) == count and seqs == sorted(set(seqs))
    assert sorted(acked["a"] + acked["b"]) == list(range(1, 2 * count + 1))
    with _recorder(events_dir) as recorder:
        records = recorder.since("shared")
    assert sr.verify(events_dir / "shared.jsonl") == 2 * count
    for worker in ("a", "b"):
        mine = [r for r in records if r.event.message_id == worker]  # type: ignore[union-attr]
        assert [r.host_seq for r in mine] == acked[worker]
        assert [_text_of(r) for r in mine] == [str(i) for i in range(count)]


_WRITER = """
import sys
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
with sr.EventRecorder(sr.JSONLEventBackend(sys.argv[1], sync_on_append=False)) as recorder:
    for i in range(int(sys.argv[2])):
        # Lines longer than a page: a reader could otherwise see half of one.
        recorder.record("live", TextDelta(text=str(i) * 7000))
"""


def test_reading_while_another_process_appends_never_sees_a_torn_line(events_dir: Path) -> None:
    proc = _python(_WRITER, str(events_dir), "600")
    try:
        seen = 0
        with _recorder(events_dir) as recorder:
            while True:
                done = proc.poll() is not None
                count = len(recorder.since("live"))
                assert count >= seen
                seen = count
                if done:
                    break
    finally:
        proc.kill()
        proc.wait(timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0
    assert seen == 600


_LOOP = """
import sys
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
recorder = sr.EventRecorder(sr.JSONLEventBackend(sys.argv[1]))
i = 0
while True:
    rec = recorder.record("victim", TextDelta(text="z" * (i * 131 % 5000)))
    print(rec.host_seq, flush=True)
    i += 1
"""


def _acks_until_sigkill(script: str, events_dir: Path, at_least: int) -> list[int]:
    """Run an appender script, SIGKILL it after ``at_least`` acknowledged records; every
    host_seq it printed (each printed only after ``record`` returned)."""
    proc = _python(script, str(events_dir), stdout=subprocess.PIPE)
    acked: list[int] = []
    try:
        assert proc.stdout is not None
        while len(acked) < at_least:
            readable, _, _ = select.select([proc.stdout], [], [], CHILD_TIMEOUT)
            assert readable, "appender never got going"
            line = proc.stdout.readline()
            assert line, "appender died"
            acked.append(int(line))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=CHILD_TIMEOUT)
        # Not communicate(timeout=...): it reads the pipe itself and misses the lines that
        # readline() already buffered, which then looked like records nobody acknowledged.
        rest = proc.stdout.read()
        acked += [int(line) for line in rest.split()]
    finally:
        proc.kill()
        proc.wait(timeout=CHILD_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL
    return acked


def test_sigkill_while_appending_leaves_a_repairable_log(events_dir: Path) -> None:
    acked = _acks_until_sigkill(_LOOP, events_dir, 200)
    assert acked == list(range(1, len(acked) + 1))
    path = events_dir / "victim.jsonl"
    sr.repair(path)  # a torn tail if the kill landed mid-write, else nothing
    count = sr.verify(path)
    # Every acknowledged record survived; at most the one being acknowledged is extra.
    assert len(acked) <= count <= len(acked) + 1
    with _recorder(events_dir) as recorder:
        assert _seqs(recorder.since("victim")) == list(range(1, count + 1))
        assert recorder.record("victim", _text(0)).host_seq == count + 1


# --- memory ----------------------------------------------------------------------------------


def test_replay_streams_in_constant_memory(events_dir: Path) -> None:
    n = 5_000
    with _recorder(events_dir, sync_on_append=False) as recorder:
        for i in range(n):
            recorder.record("big", TextDelta(text=f"{i:08d}" * 250))
    assert (events_dir / "big.jsonl").stat().st_size > 10 * 2**20
    with _recorder(events_dir) as recorder:
        tracemalloc.start()
        try:
            count = collections.deque(enumerate(recorder.iter_since("big"), 1), maxlen=1)[0][0]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count == n
    assert peak < 2**20


def test_an_abandoned_iteration_releases_the_file(events_dir: Path) -> None:
    _fill(events_dir, "s", 3)
    with _recorder(events_dir) as recorder:
        it: Iterator[sr.EventRecord] = recorder.iter_since("s")
        assert next(it).host_seq == 1
        assert isinstance(it, collections.abc.Generator)
        it.close()
        assert _seqs(sr.range_(recorder, "s", 0, 2)) == [1, 2]


# --- group commit and lingering locks ----------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_records_are_acknowledged_only_once_a_sync_covers_them(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = sr.JSONLEventBackend(events_dir)
    recorder = sr.EventRecorder(backend)
    real = _durable._datasync
    durable = {"a": 0, "b": 0}  # bytes of each file that a completed sync covers
    syncs = {"a": 0, "b": 0}
    in_sync = threading.Event()
    release_a = threading.Event()

    def tracked(fd: int) -> None:
        key = os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).removesuffix(".jsonl")
        if key == "a" and syncs["a"] == 0:
            in_sync.set()
            # Key a's first sync stays in flight until key b has committed: one key's sync
            # must never wait for another's (no process-wide lock around fsync).
            assert release_a.wait(CHILD_TIMEOUT)
        size = os.fstat(fd).st_size
        real(fd)
        syncs[key] += 1
        durable[key] = size

    hook_datasyncs(monkeypatch, tracked)
    acked: list[tuple[str, int, int]] = []
    errors: list[BaseException] = []

    def write(key: str, i: int) -> None:
        try:
            rec = recorder.record(key, _text(i))
            acked.append((key, rec.host_seq, durable[key]))
        except BaseException as exc:
            errors.append(exc)

    leader = threading.Thread(target=write, args=("a", 0))
    leader.start()
    assert in_sync.wait(CHILD_TIMEOUT)
    followers = [threading.Thread(target=write, args=("a", i)) for i in range(1, 8)]
    for t in followers:
        t.start()
    session = backend._sessions["a"]
    deadline = time.monotonic() + CHILD_TIMEOUT
    while len(session._queue) < len(followers):  # every follower is waiting on the leader
        assert time.monotonic() < deadline, "writers never queued"
        time.sleep(0.001)
    assert not [a for a in acked if a[0] == "a"]  # nobody on key a is acknowledged before a sync
    write("b", 100)  # key b commits while key a's sync is still in flight
    assert [a[0] for a in acked] == ["b"]
    release_a.set()
    for t in [leader, *followers]:
        t.join(CHILD_TIMEOUT)
    assert errors == []
    assert syncs == {"a": 2, "b": 1}  # the seven followers shared one sync
    for key, seq, covered in acked:
        lines = (events_dir / f"{key}.jsonl").read_bytes().splitlines(keepends=True)
        assert sum(map(len, lines[:seq])) <= covered, (key, seq)
    assert sorted(seq for key, seq, _ in acked if key == "a") == list(range(1, 9))
    assert _seqs(recorder.since("a")) == list(range(1, 9))
    recorder.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_an_append_interrupted_while_it_writes_alone_lets_the_writers_queued_behind_it_go_on(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lone writer writes without the group-commit bookkeeping; interrupted (Ctrl-C reaches
    # the thread in its sync), it must still hand the key over to those that queued meanwhile.
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    real = _durable._datasync
    in_sync = threading.Event()
    followers_queued = threading.Event()
    first = [True]

    def interrupted_once(fd: int) -> None:
        if first[0]:
            first[0] = False
            in_sync.set()
            assert followers_queued.wait(CHILD_TIMEOUT)
            raise KeyboardInterrupt
        real(fd)

    hook_datasyncs(monkeypatch, interrupted_once)
    outcomes: dict[int, object] = {}

    def write(i: int) -> None:
        try:
            outcomes[i] = recorder.record("k", _text(i)).host_seq
        except BaseException as exc:
            outcomes[i] = type(exc)

    lone = threading.Thread(target=write, args=(0,))
    lone.start()
    assert in_sync.wait(CHILD_TIMEOUT)
    followers = [threading.Thread(target=write, args=(i,)) for i in range(1, 4)]
    for t in followers:
        t.start()
    session = recorder._backend._sessions["k"]  # type: ignore[attr-defined]
    deadline = time.monotonic() + CHILD_TIMEOUT
    while len(session._queue) < len(followers):
        assert time.monotonic() < deadline, "writers never queued"
        time.sleep(0.001)
    followers_queued.set()
    for t in [lone, *followers]:
        t.join(CHILD_TIMEOUT)
        assert not t.is_alive(), "a writer queued behind the interrupted one was never served"
    assert outcomes.pop(0) is KeyboardInterrupt
    # The interrupted record's line was written (not known durable); the others follow it.
    assert sorted(outcomes.values()) == [2, 3, 4]  # type: ignore[type-var]
    assert _seqs(recorder.since("k")) == [1, 2, 3, 4]
    assert recorder.record("k", _text(9)).host_seq == 5
    recorder.close()


_APPEND_ONE = """
import sys
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
with sr.EventRecorder(sr.JSONLEventBackend(sys.argv[1])) as recorder:
    print(recorder.record(sys.argv[2], TextDelta(text="from the other process")).host_seq)
"""


def _append_from_another_process(events_dir: Path, key: str) -> int:
    """Record one event on ``key`` from a fresh process; the host_seq it got."""
    other = subprocess.run(
        [sys.executable, "-c", _APPEND_ONE, str(events_dir), key],
        cwd=ROOT,
        capture_output=True,
        timeout=CHILD_TIMEOUT,
        check=True,
    )
    return int(other.stdout)


def test_another_process_can_append_while_this_writer_is_idle(events_dir: Path) -> None:
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    recorder.record("shared", _text(1))  # the key's lock now lingers in this process
    # This process neither calls again nor closes: the lock must be let go on its own.
    assert _append_from_another_process(events_dir, "shared") == 2
    assert recorder.record("shared", _text(3)).host_seq == 3  # notices the other's append
    assert _seqs(recorder.since("shared")) == [1, 2, 3]
    recorder.close()


def test_a_busy_writer_does_not_starve_another_process(events_dir: Path) -> None:
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir, sync_on_append=False))
    stop = threading.Event()
    count = [0]

    def hammer() -> None:  # never idle: only the maximum hold lets the other process in
        while not stop.is_set():
            recorder.record("busy", _text(count[0]))
            count[0] += 1

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        theirs = _append_from_another_process(events_dir, "busy")
    finally:
        stop.set()
        thread.join(CHILD_TIMEOUT)
    assert 1 <= theirs <= count[0] + 1
    assert _seqs(recorder.since("busy")) == list(range(1, count[0] + 2))
    recorder.close()


_BURST = """
import sys, threading
from adaptor.events import TextDelta
from hosttools import sessionrecorder as sr
recorder = sr.EventRecorder(sr.JSONLEventBackend(sys.argv[1]))
out = threading.Lock()
def loop(worker):
    i = 0
    while True:
        rec = recorder.record("burst", TextDelta(text=str(worker) * (i * 131 % 3000)))
        with out:
            print(rec.host_seq, flush=True)
        i += 1
for worker in range(8):
    threading.Thread(target=loop, args=(worker,)).start()
"""


def test_sigkill_mid_burst_of_group_commits_loses_nothing_acknowledged(events_dir: Path) -> None:
    acked = _acks_until_sigkill(_BURST, events_dir, 300)
    assert len(set(acked)) == len(acked)
    path = events_dir / "burst.jsonl"
    sr.repair(path)  # at most a torn tail: the batch being written when the kill landed
    count = sr.verify(path)
    assert max(acked) <= count  # every acknowledged record survived
    with _recorder(events_dir) as recorder:
        assert _seqs(recorder.since("burst")) == list(range(1, count + 1))
        assert recorder.record("burst", _text(0)).host_seq == count + 1


def test_writers_that_keep_recording_keep_sharing_syncs(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A leader that returns and records again at once must not overtake the followers it just
    # woke: that degenerates into one sync per record while eight threads wait in line.
    syncs = count_datasyncs(monkeypatch, events_dir)
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    total = _eight_threads_record_on_one_key(recorder, per_thread=40)
    assert len(syncs) <= total * 3 // 4, f"{len(syncs)} syncs for {total} records"
    recorder.close()


def test_woken_writers_rejoin_one_batch_rather_than_alternating_in_two(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writers woken by a sync come back while the next sync runs; committing whoever has
    # come back at once splits them into two cohorts that alternate, a sync each.  A leader
    # waits (briefly) for the writers of the last batch instead, so they share one sync.
    real = _durable._datasync
    syncs: list[int] = []

    def slow(fd: int) -> None:  # a slow disk: the writers are all back well within a sync
        time.sleep(0.02)
        real(fd)
        syncs.append(fd)

    hook_datasyncs(monkeypatch, slow)
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    writers, per_writer = 4, 8
    start = threading.Barrier(writers)

    def work(worker: int) -> None:
        start.wait(CHILD_TIMEOUT)
        for i in range(per_writer):
            recorder.record("hot", _text(worker * 1000 + i))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    total = writers * per_writer
    assert _seqs(recorder.since("hot")) == list(range(1, total + 1))
    # All four together: 8 syncs plus the first few while they meet; two cohorts: about 16.
    assert len(syncs) <= total * 3 // 8, f"{len(syncs)} syncs for {total} records"
    recorder.close()


def test_records_made_one_at_a_time_never_wait_for_other_writers(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many threads, but never two at once (a pool serving one key in turn): nobody is coming
    # back to share a sync, so a leader waiting for them would only add latency.
    gathered: list[int] = []
    real_gather = _jsonl._Session._gather

    def gather(self: Any, batch: Any, own: Any) -> Any:
        gathered.append(len(batch))
        return real_gather(self, batch, own)

    monkeypatch.setattr(_jsonl._Session, "_gather", gather)
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    turns = [threading.Event() for _ in range(3)]

    def take_turns(me: int) -> None:  # three live threads (distinct idents), in strict turn
        for i in range(4):
            assert turns[me].wait(CHILD_TIMEOUT)
            turns[me].clear()
            recorder.record("turns", _text(i * 3 + me))
            turns[(me + 1) % 3].set()

    threads = [threading.Thread(target=take_turns, args=(me,)) for me in range(3)]
    for t in threads:
        t.start()
    turns[0].set()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    assert _seqs(recorder.since("turns")) == list(range(1, 13))
    assert gathered == []
    recorder.close()


def _eight_threads_record_on_one_key(recorder: sr.EventRecorder, per_thread: int) -> int:
    """Eight threads record ``per_thread`` events each on key "hot"; all of them are there."""

    def work(worker: int) -> None:
        for i in range(per_thread):
            recorder.record("hot", _text(worker * 1000 + i))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    total = 8 * per_thread
    assert _seqs(recorder.since("hot")) == list(range(1, total + 1))
    return total


def test_a_leader_serves_a_bounded_number_of_batches_before_handing_over(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread that finds a key idle keeps committing what queues behind it, but only for
    # so long: its own caller is waiting too.
    batches_per_lead: list[int] = []
    local = threading.local()
    real_lead, real_write = _jsonl._Session._lead, _jsonl._Session._write_batch

    def lead(self: Any, batch: Any, own: Any) -> None:
        local.batches = 0
        real_lead(self, batch, own)
        batches_per_lead.append(local.batches)

    def write(self: Any, batch: Any) -> None:
        local.batches += 1
        real_write(self, batch)

    monkeypatch.setattr(_jsonl._Session, "_lead", lead)
    monkeypatch.setattr(_jsonl._Session, "_write_batch", write)
    recorder = sr.EventRecorder(sr.JSONLEventBackend(events_dir))
    total = _eight_threads_record_on_one_key(recorder, per_thread=60)
    assert max(batches_per_lead) <= _jsonl._BATCHES_PER_LEADER
    assert sum(batches_per_lead) < total  # and batches were shared
    recorder.close()


_OUT_OF_DESCRIPTORS = """
import os, resource, sys
from adaptor import events
from hosttools import sessionrecorder as sr

directory, buffered = sys.argv[1], sys.argv[2] == "buffered"
backend = sr.JSONLEventBackend(directory, sync_on_append=not buffered, max_open_files=1000)
recorder = sr.EventRecorder(backend)
recorder.record("first", events.TextDelta(text="warm-up"))  # the imports' files are open now
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 12, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
for i in range(40):  # far more logs than descriptors left: idle ones must make room
    recorder.record(f"key-{i}", events.TextDelta(text=f"record {i}"))
    recorder.record(f"key-{i // 2}", events.TextDelta(text=f"again {i}"))
backend.flush()
recorder.close()
print("ok")
"""


@pytest.mark.parametrize("mode", ["synced", "buffered"])
def test_a_process_out_of_descriptors_closes_idle_logs_instead_of_failing(tmp_path: Path, mode: str) -> None:
    # max_open_files bounds this backend's own files; the process's limit may be lower still
    # (other files open, a low `ulimit -n`).  Opening a log then failed for good.
    proc = subprocess.run(
        [sys.executable, "-c", _OUT_OF_DESCRIPTORS, str(tmp_path), mode],
        capture_output=True, text=True, timeout=60,
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-2000:]
    recorder = sr.EventRecorder(sr.JSONLEventBackend(tmp_path))
    for i in range(40):
        texts = [getattr(r.event, "text", None) for r in recorder.since(f"key-{i}")]
        expected = [f"record {i}"] + [f"again {j}" for j in (2 * i, 2 * i + 1) if j < 40]
        assert texts == expected


def test_a_log_on_a_read_only_filesystem_can_be_read(tmp_path: Path) -> None:
    # The reader's instant of the writers' lock needs the lock file open for writing: every
    # reader (since, tail, verify, `adaptor verify-log`) failed with EROFS on an archive or a
    # snapshot, only because a writer had left its lock file there.
    import shutil

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only mount needs root")
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with sr.EventRecorder(sr.JSONLEventBackend(mount_point / "logs")) as recorder:
            recorder.record("k", TextDelta(text="kept"))
        assert (mount_point / "logs" / "k.jsonl.lock").exists()
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        with sr.EventRecorder(sr.JSONLEventBackend(mount_point / "logs")) as recorder:
            (record,) = recorder.since("k")
            assert isinstance(record.event, TextDelta) and record.event.text == "kept"
            assert [r.host_seq for r in sr.tail(recorder, "k", 5)] == [1]
        assert sr.verify(mount_point / "logs" / "k.jsonl") == 1
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def test_tail_takes_any_count_an_int_can_hold(env: Env) -> None:
    # OverflowError from 2**63 on: a deque's length is a C ssize_t.
    with env.recorder() as recorder:
        recorder.record("k", _text(1))
        assert [r.host_seq for r in sr.tail(recorder, "k", 10**30)] == [1]


def test_range_names_the_argument_it_refuses(env: Env) -> None:
    # "after_host_seq must be >= 0" for range_'s `after`; a negative `to` gave [] silently.
    with env.recorder() as recorder:
        recorder.record("k", _text(1))
        with pytest.raises(ValueError, match="^after must be >= 0"):
            sr.range_(recorder, "k", -1, 5)
        with pytest.raises(ValueError, match="^to must be >= 0"):
            sr.range_(recorder, "k", 0, -1)


def test_path_for_is_refused_once_closed(tmp_path: Path) -> None:
    backend = sr.JSONLEventBackend(tmp_path)
    assert backend.path_for("k") == tmp_path / "k.jsonl"
    backend.close()
    with pytest.raises(sr.JSONLEventBackendClosedError):
        backend.path_for("k")


def test_a_writer_refuses_to_append_after_a_line_of_another_format_version(tmp_path: Path) -> None:
    # A well-framed last line of a newer format (v 2) passed the writer's tail check, framing
    # only: record() appended after it and acknowledged a record no reader of this version can
    # reach (each calls that line corruption, and repair rightly refuses to cut it).
    recorder = sr.EventRecorder(sr.JSONLEventBackend(tmp_path))
    recorder.record("s", TextDelta(text="one"))
    recorder.close()
    path = tmp_path / "s.jsonl"
    newer = unframe(path.read_bytes().splitlines()[-1])
    newer.pop("crc")
    path.write_bytes(path.read_bytes() + frame({**newer, "host_seq": 2, "v": 2}))
    before = path.read_bytes()
    recorder = sr.EventRecorder(sr.JSONLEventBackend(tmp_path))
    with pytest.raises(sr.JSONLEventLogCorruptError, match="line 2: unsupported format version 2"):
        recorder.record("s", TextDelta(text="never acknowledged"))
    recorder.close()
    assert path.read_bytes() == before


@pytest.mark.parametrize("how", ["replaced", "deleted", "moved away"])
@pytest.mark.parametrize("synced_by", ["flush", "close"])
def test_buffered_appends_are_synced_in_the_file_they_went_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, synced_by: str
) -> None:
    # With sync_on_append=False the key kept syncing the file it had first written: after the
    # log was replaced (a copy put back over it), deleted or moved away, records went to the
    # new file while flush() and close() synced only the old one, and said they were durable.
    backend = sr.JSONLEventBackend(tmp_path, sync_on_append=False)
    recorder = sr.EventRecorder(backend)
    path = tmp_path / "k.jsonl"
    recorder.record("k", TextDelta(text="one"))
    old = path.stat().st_ino
    if how == "replaced":
        copy = tmp_path / "k.copy"
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    elif how == "deleted":
        path.unlink()
    else:
        path.rename(tmp_path / "k.jsonl.1")
    _durable.release_lingering(str(path) + ".lock")  # as any other process might take it now
    recorder.record("k", TextDelta(text="two"))
    new = path.stat().st_ino
    assert new != old and b'"two"' in path.read_bytes()
    synced: list[int] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    if synced_by == "flush":
        backend.flush("k")
        assert new in synced, (synced, old, new)
    recorder.close()
    assert new in synced, (synced, old, new)


def test_a_writer_whose_log_shrank_under_it_never_hands_out_a_sequence_number_again(tmp_path: Path) -> None:
    # A backup put back over the log (or a copytruncate) while a writer had it open: the next
    # record got host_seq 3 again, after 5 had been handed out, and a reader at cursor 5 never
    # saw it.
    recorder = sr.EventRecorder(sr.JSONLEventBackend(tmp_path))
    path = tmp_path / "k.jsonl"
    for text in ("a0", "a1"):
        recorder.record("k", TextDelta(text=text))
    backup = path.read_bytes()
    for text in ("a2", "a3", "a4"):
        recorder.record("k", TextDelta(text=text))
    _durable.release_lingering(str(path) + ".lock")  # as any other process might take it now
    path.write_bytes(backup)
    # Every time: the refusal held for one call, and the next record got host_seq 3.
    for _ in range(3):
        with pytest.raises(sr.JSONLEventLogCorruptError, match="log shrank below acknowledged data"):
            recorder.record("k", TextDelta(text="new"))
    with pytest.raises(sr.JSONLEventLogCorruptError, match="log shrank below acknowledged data"):
        recorder.close()
    assert path.read_bytes() == backup

"""The claude parser's output, pinned: every captured transcript and hundreds of seeded mangled
variants of them must give exactly the events, transcript and Response recorded in
``golden/claude-parse.json``; and its fast paths give what the plain routes give (``replay``
what a live run's line-by-line parse gives, ``split_lines`` what ``splitlines`` gives, ``lean``
constructors what the dataclasses build).

The golden file was written by the parser before its per-line fast path existed (the plain
``decode``/``Decoded`` route with a dataclass constructor per event), so a fast path that
diverges from it in any observable way (an event, a field, the order of metadata keys, the
Response's usage, cost, checkpoint or failure) fails here with the variant's name and seed.

Regenerate only for an intended behaviour change: ``ADAPTOR_WRITE_GOLDEN=1 pytest`` this file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor.driver import OutputSchema, Request, SessionContext, SessionState
from adaptor.drivers import claude
from adaptor.drivers._lines import Protocol, lean, split_lines
from adaptor.drivers._process import Exit, Line
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, Thinking, ToolCall, ToolResult
from adaptor.result import TranscriptItem
from adaptor.testing import RecordingSink
from bench.parse import build_transcript
from tests.drivers.conftest import TRANSCRIPTS, transcript

GOLDEN = Path(__file__).parent / "golden" / "claude-parse.json"
NAMES = sorted(p.stem for p in TRANSCRIPTS.glob("claude-*.jsonl"))
VARIANTS = 30  # seeded mangled variants per transcript

_SCHEMA = OutputSchema(schema={"type": "object", "properties": {"name": {"type": "string"}}})
# A fixed working directory: the checkpoint records it (the caller's cwd by default).
_CWD = "/golden/work"
_REQUESTS: dict[str, Request] = {
    "plain": Request(run_id="golden", prompt="", workspace_cwd=_CWD),
    "schema": Request(run_id="golden", prompt="", output_schema=_SCHEMA, workspace_cwd=_CWD),
    "resume": Request(run_id="golden", prompt="", workspace_cwd=_CWD, session=SessionContext(
        "continue_or_start", SessionState("00000000-0000-4000-8000-000000000000"))),
}
# What a mangled field may become: every JSON type, empty and not.
_ODD_VALUES: list[Any] = [None, True, False, 0, 1, -1, 2**40, 1.5, "", "x", "text", [], [1],
                          ["a", {"type": "text"}], {}, {"type": "text", "text": "t"}]
_WHITESPACE = [b" ", b"\t", b"\r", b"\x0b", b"\x0c", b"  \t"]


def canon(value: Any) -> Any:
    """A JSON-able form that keeps types, field values and key order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"__type": type(value).__name__}
        for f in dataclasses.fields(value):
            if f.name in ("stdout", "stderr") and type(value).__name__ == "RawStreams":
                out[f.name] = hashlib.sha256(getattr(value, f.name).encode()).hexdigest()
            else:
                out[f.name] = canon(getattr(value, f.name))
        return out
    if isinstance(value, dict):
        return {"__dict": [[canon(k), canon(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return {"__" + type(value).__name__: [canon(v) for v in value]}
    if isinstance(value, float | datetime):
        return {"__" + type(value).__name__: repr(value)}
    if value is None or isinstance(value, bool | int | str):
        return value
    return {"__repr": repr(value)}


def observe(stdout: bytes, stderr: bytes, exit_code: int | None, request: Request) -> Any:
    """Everything a replay shows: the payloads emitted in order and the Response (or error)."""
    sink = RecordingSink()
    try:
        response = claude.replay(stdout, stderr, exit_code, sink=sink, request=request)
    except ResumeRejectedError as exc:
        return {"emitted": canon(sink.payloads), "raised": str(exc)}
    return {"emitted": canon(sink.payloads), "response": canon(_without_turn_token(response))}


def _without_turn_token(response: Any) -> Any:
    """``response`` with its checkpoint's turn token (new every turn: see claude._TURN_KEY)
    checked and left out, so the rest can be pinned."""
    checkpoint = response.checkpoint
    if checkpoint is None:
        return response
    data = dict(checkpoint.state.data)
    token = data.pop("turn")
    assert isinstance(token, str) and re.fullmatch(r"[0-9a-f]{16}", token), token
    state = dataclasses.replace(checkpoint.state, data=data)
    return dataclasses.replace(response, checkpoint=dataclasses.replace(checkpoint, state=state))


def _mangle_field(obj: Any, rng: random.Random) -> Any:
    """``obj`` with one randomly chosen nested value replaced by an odd one."""
    if isinstance(obj, dict) and obj and rng.random() < 0.8:
        key = rng.choice(list(obj))
        obj[key] = _mangle_field(obj[key], rng)
        return obj
    if isinstance(obj, list) and obj and rng.random() < 0.8:
        index = rng.randrange(len(obj))
        obj[index] = _mangle_field(obj[index], rng)
        return obj
    return rng.choice(_ODD_VALUES)


def mangled(name: str, seed: int) -> tuple[bytes, bytes, int | None, str]:
    """A deterministic variant of transcript ``name``: its stdout, stderr, exit and request."""
    stdout, stderr, exit_code = transcript(name)
    rng = random.Random(f"{name}/{seed}")
    lines = stdout.splitlines() or [b""]
    err = stderr.splitlines()
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        how = rng.choice(["field", "field", "field", "pad", "truncate", "garbage", "text",
                          "blank", "drop", "duplicate", "badutf8", "stderr", "after"])
        if how == "field":
            try:
                event = orjson.loads(lines[i])
            except orjson.JSONDecodeError:
                continue
            lines[i] = orjson.dumps(_mangle_field(event, rng))
        elif how == "pad":
            lines[i] = rng.choice(_WHITESPACE + [b""]) + lines[i] + rng.choice(_WHITESPACE + [b""])
        elif how == "truncate" and len(lines[i]) > 2:
            lines[i] = lines[i][: rng.randrange(1, len(lines[i]))]
        elif how == "garbage":
            lines.insert(i, b"{" + rng.randbytes(rng.randint(0, 12)).replace(b"\n", b""))
        elif how == "text":
            lines.insert(i, b"npm notice: " + str(seed).encode())
        elif how == "blank":
            lines.insert(i, rng.choice([b"", b"  ", b"\t"]))
        elif how == "drop" and len(lines) > 1:
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "badutf8":
            lines[i] = lines[i].replace(b'"', b'"\xff', 1)
        elif how == "stderr":
            err.insert(rng.randint(0, len(err)), b"Error: no conversation found with session id x")
        elif how == "after":
            lines.append(lines[i])
    request = rng.choice(list(_REQUESTS))
    exit_choice = rng.choice([exit_code, exit_code, 0, 1, None])
    return b"\n".join(lines) + b"\n", b"\n".join(err), exit_choice, request


def _digest(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value)).hexdigest()


def current() -> dict[str, Any]:
    """What the parser gives now: the full observation of each pristine transcript (digests
    under the other requests) and digests of the mangled variants."""
    out: dict[str, Any] = {"pristine": {}, "mangled": {}}
    for name in NAMES:
        stdout, stderr, exit_code = transcript(name)
        for label, request in _REQUESTS.items():
            seen = observe(stdout, stderr, exit_code, request)
            out["pristine"][f"{name}/{label}"] = seen if label == "plain" else _digest(seen)
        for seed in range(VARIANTS):
            stdout, stderr, exit_code, label = mangled(name, seed)
            out["mangled"][f"{name}/{seed}"] = _digest(
                observe(stdout, stderr, exit_code, _REQUESTS[label]))
    out["bench"] = _digest(observe(build_transcript(256 * 1024)[0], b"", 0, _REQUESTS["plain"]))
    return out


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if os.environ.get("ADAPTOR_WRITE_GOLDEN") == "1":
        GOLDEN.write_bytes(orjson.dumps(current()) + b"\n")
    data: dict[str, Any] = orjson.loads(GOLDEN.read_bytes())
    return data


@pytest.mark.parametrize("name", NAMES)
def test_captured_transcripts_parse_as_pinned(golden: dict[str, Any], name: str) -> None:
    stdout, stderr, exit_code = transcript(name)
    for label, request in _REQUESTS.items():
        seen = observe(stdout, stderr, exit_code, request)
        pinned = golden["pristine"][f"{name}/{label}"]
        if label != "plain":
            seen = _digest(seen)
        # Through JSON, so the comparison is of the stored form (a diff shows what changed).
        assert orjson.loads(orjson.dumps(seen)) == pinned, f"{name} with the {label} request"


@pytest.mark.parametrize("name", NAMES)
def test_mangled_transcripts_parse_as_pinned(golden: dict[str, Any], name: str) -> None:
    wrong = []
    for seed in range(VARIANTS):
        stdout, stderr, exit_code, label = mangled(name, seed)
        if _digest(observe(stdout, stderr, exit_code, _REQUESTS[label])) \
                != golden["mangled"][f"{name}/{seed}"]:
            wrong.append(seed)
    assert not wrong, f"{name}: variants {wrong} differ (reproduce with mangled({name!r}, seed))"


def test_the_benchmark_transcript_parses_as_pinned(golden: dict[str, Any]) -> None:
    data = build_transcript(256 * 1024)[0]
    assert _digest(observe(data, b"", 0, _REQUESTS["plain"])) == golden["bench"]


# --- the fast paths against the plain ones they stand for ---------------------------------------

_LINE_PIECES = st.sampled_from([
    b"", b" ", b"\t", b"\x0b", b"\x0c", b"\r", b"\n", b"\r\n", b"{", b"}", b"[1]", b"12", b'"x"',
    b"npm notice", b"\xff", b'{"type":"result","subtype":"success","session_id":"s"}',
    b'{"type":"control_request","request_id":"r","request":{"subtype":"can_use_tool"}}',
    b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hi"}}}',
    b'{"type":"stream_event","event":{"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}}',
])


def _live(stdout: bytes, stderr: bytes, exit_code: int | None) -> Any:
    """What a live run's parser makes of the same output: one ``Line`` per line, newline
    stripped, as the process reader hands them over."""
    sink = RecordingSink()
    parser = claude._Parser(sink, claude._plan(claude.Config(), _REQUESTS["plain"],
                                               persistent_allowed=False))
    for stream, blob in (("stdout", stdout), ("stderr", stderr)):
        for raw in blob.splitlines():
            parser.feed(Line(stream, raw))  # type: ignore[arg-type]
    exit_ = Exit(exit_code=exit_code, signal=None if exit_code is not None else 15)
    response = parser.response(exit_, stdout.decode("utf-8", "replace"),
                               stderr.decode("utf-8", "replace"))
    return {"emitted": canon(sink.payloads), "response": canon(_without_turn_token(response))}


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    inserts=st.lists(st.tuples(st.integers(0, 200), st.lists(_LINE_PIECES, max_size=4)),
                     max_size=6),
    carriage=st.booleans(),
)
def test_replay_parses_as_a_live_run_line_by_line(
    name: str, inserts: list[tuple[int, list[bytes]]], carriage: bool
) -> None:
    stdout, stderr, exit_code = transcript(name)
    lines = stdout.split(b"\n")
    for where, pieces in inserts:
        lines.insert(where % (len(lines) + 1), b"".join(pieces))
    joined = (b"\r\n" if carriage else b"\n").join(lines)
    assert observe(joined, stderr, exit_code, _REQUESTS["plain"]) == _live(joined, stderr,
                                                                            exit_code)


@given(st.lists(st.sampled_from([b"a", b"{}", b" ", b"\n", b"\r", b"\r\n", b"\x0c", b"\x85"]),
                max_size=30))
def test_split_lines_finds_the_lines_splitlines_finds(pieces: list[bytes]) -> None:
    blob = b"".join(pieces)
    # The same lines; a line may keep its "\n", which every reader strips as whitespace.
    assert [line.removesuffix(b"\n") for line in split_lines(blob)] == blob.splitlines()


@pytest.mark.parametrize("cls", [TextDelta, Thinking, ToolCall, ToolResult, TranscriptItem])
def test_lean_constructors_build_what_the_classes_build(cls: type[Any]) -> None:
    make = lean(cls)
    assert make is not cls, f"{cls.__name__} lost its fast constructor"
    names = [f.name for f in dataclasses.fields(cls) if f.name != "meta"]
    for values in ({"kind": "x"} if cls is TranscriptItem else {},
                   {name: f"v-{name}" for name in names}):
        made, built = make(**values), cls(**values)
        assert made == built and vars(made) == vars(built)
        assert list(vars(made)) == list(vars(built))
    if cls is TranscriptItem:
        assert make(kind="a").metadata is not make(kind="b").metadata  # fresh per item
        with pytest.raises(TypeError):
            make(text="no kind")
    with pytest.raises(TypeError):
        make(no_such_field=1)


@pytest.mark.parametrize(("shape", "cls", "given", "fixed"), [
    ("token", TextDelta, ("message_id", "text"), {"phase": "content"}),
    ("block end", Thinking, ("message_id",), {"phase": "end"}),
    ("tool start", ToolCall, ("id", "name", "args"), {"phase": "start"}),
    ("tool result", ToolResult, ("id", "result", "is_error"), {}),
    ("assistant item", TranscriptItem, ("text", "model"), {"kind": "assistant"}),
    ("tool result item", TranscriptItem, ("tool_use_id", "tool_name", "text", "is_error"),
     {"kind": "tool_result"}),
])
def test_shaped_lean_constructors_build_what_the_classes_build(
    shape: str, cls: type[Any], given: tuple[str, ...], fixed: dict[str, Any]
) -> None:
    make = lean(cls, *given, **fixed)
    values = [f"v-{name}" for name in given]
    made, built = make(*values), cls(**dict(zip(given, values, strict=True)), **fixed)
    assert made == built and vars(made) == vars(built), shape
    assert list(vars(made)) == list(vars(built)), shape
    if cls is TranscriptItem:
        assert make(*values).metadata is not made.metadata  # fresh per item
    with pytest.raises(TypeError):
        make(*values, "one too many")
    with pytest.raises(TypeError):
        lean(cls, *given, no_such_field=1)


@given(st.lists(_LINE_PIECES, max_size=5), st.booleans())
def test_a_line_decoded_first_is_what_the_protocol_rules_make_of_it(
    pieces: list[bytes], after_terminal: bool
) -> None:
    line = b"".join(pieces).replace(b"\n", b" ").replace(b"\r", b" ")
    plan = claude._plan(claude.Config(), _REQUESTS["plain"], persistent_allowed=False)
    parser = claude._Parser(RecordingSink(), plan)
    reference = Protocol(RecordingSink())
    if after_terminal:
        terminal = b'{"type":"result","subtype":"success"}'
        parser.feed_stdout(terminal)
        reference.set_terminal({}, "")
    before = len(parser.protocol.transcript)
    returned = parser.feed_stdout(line)
    decoded = reference.feed_stdout(line)
    event = None if decoded is None else decoded.event
    assert returned == (event if (event or {}).get("type") == "control_request" else None)
    # The protocol's own items (text lines); a parsed event may add the parser's items.
    added = [i for i in parser.protocol.transcript[before:] if i.kind == "stdout"]
    assert added == reference.transcript
    assert parser.protocol.problems == reference.problems


def _fresh_id_plain(used: set[str], base: str) -> str:
    ident, n = base, 1
    while ident in used:
        n += 1
        ident = f"{base}~{n}"
    used.add(ident)
    return ident


@given(st.lists(st.sampled_from(["a", "a~2", "a~3", "a~2~2", "b", "b~2", "a~4"]), max_size=40))
def test_fresh_id_gives_the_least_unused_suffix(bases: list[str]) -> None:
    protocol, used = Protocol(RecordingSink()), set[str]()
    for base in bases:
        assert protocol.fresh_id(base) == _fresh_id_plain(used, base)


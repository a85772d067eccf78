"""The claude parser's output, pinned: every captured transcript and hundreds of seeded mangled
variants of them must give exactly the events, transcript and Response recorded in
``golden/claude-parse.json``.

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
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from adaptor.driver import OutputSchema, Request, SessionContext, SessionState
from adaptor.drivers import claude
from adaptor.errors import ResumeRejectedError
from adaptor.testing import RecordingSink
from bench.parse import build_transcript
from tests.drivers.conftest import TRANSCRIPTS, transcript

GOLDEN = Path(__file__).parent / "golden" / "claude-parse.json"
NAMES = sorted(p.stem for p in TRANSCRIPTS.glob("claude-*.jsonl"))
VARIANTS = 30  # seeded mangled variants per transcript

_SCHEMA = OutputSchema(schema={"type": "object", "properties": {"name": {"type": "string"}}})
_REQUESTS: dict[str, Request] = {
    "plain": Request(run_id="golden", prompt=""),
    "schema": Request(run_id="golden", prompt="", output_schema=_SCHEMA),
    "resume": Request(run_id="golden", prompt="", session=SessionContext(
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
    return {"emitted": canon(sink.payloads), "response": canon(response)}


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

"""The benchmarks run and report the agreed JSON shape (at smoke size; no timing is asserted),
and the fast verify path they measure agrees with the full decoder line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor._durable import frame
from bench import BENCHMARKS
from hosttools.sessionrecorder import _format

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600

_FIELDS = {"name", "figure", "unit", "baseline", "ratio", "goal", "met", "cases"}
_CASE_FIELDS = {"case", "figure", "unit", "baseline", "ratio", "goal", "met"}


def _check_shape(result: dict[str, Any], name: str) -> None:
    assert _FIELDS <= result.keys(), sorted(_FIELDS - result.keys())
    assert result["name"] == name
    assert result["quick"] is True
    assert isinstance(result["figure"], int | float)
    assert isinstance(result["unit"], str) and result["unit"]
    assert isinstance(result["goal"], str) and result["goal"]
    assert isinstance(result["met"], bool)
    assert result["cases"], "a benchmark reports at least one case"
    for case in result["cases"]:
        assert _CASE_FIELDS <= case.keys(), sorted(_CASE_FIELDS - case.keys())
        assert isinstance(case["figure"], int | float) and case["figure"] >= 0
        assert case["baseline"] is None or case["baseline"] >= 0
        assert case["ratio"] is None or case["ratio"] >= 0
        assert isinstance(case["met"], bool)
    head = result["cases"][0]
    assert (result["figure"], result["baseline"], result["ratio"]) == (
        head["figure"],
        head["baseline"],
        head["ratio"],
    )
    assert result["met"] == all(case["met"] for case in result["cases"])


# The cases each benchmark reports, with their units (quick sizes: 20 queued requests, not 1,000).
_CASES: dict[str, dict[str, str]] = {
    "pickup": {
        "idle p50": "ms",
        "idle p99": "ms",
        "20 queued p50": "ms",
        "20 queued p99": "ms",
        "sequential p50": "ms",
        "sequential p99": "ms",
        "throughput": "requests/s",
        "RSS idle": "MB",
        "RSS +20 queued": "MB",
        "RSS +40 served": "MB",
    },
    "recorder_append": {
        "1 writer": "events/s",
        "8 threads, 1 key": "events/s",
        "8 threads, 8 keys": "events/s",
        "8 threads, 1 key: least group commit": "events/s",
    },
    "overhead": {"through the daemon": "ms"},
    "parse": {"claude replay": "events/s"},
}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_prints_one_json_line(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", "--dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    _check_shape(result, name)
    if name in _CASES:
        assert {case["case"]: case["unit"] for case in result["cases"]} == _CASES[name]
    if name == "pickup":
        _check_pickup(result, tmp_path)
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone


def _check_pickup(result: dict[str, Any], scratch: Path) -> None:
    for case in result["cases"]:
        if case["unit"] == "ms":  # every latency has its same-link watchdog baseline
            assert case["baseline"] is not None and case["baseline"] > 0
        if case["case"].endswith("p50"):
            assert case["samples"] == result["params"]["probes"][case["case"].rsplit(" ", 1)[0]]
    throughput = next(case for case in result["cases"] if case["case"] == "throughput")
    assert throughput["requests"] == result["params"]["throughput_requests"]
    assert throughput["baseline"] is not None  # the in-process rate of the same request
    # The daemons it started are gone.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert str(scratch) not in ps.stdout


def test_the_least_group_commit_writes_every_line_once_and_shares_syncs(tmp_path: Path) -> None:
    # The reference the recorder's 8-thread figure is read against: a figure of a writer that
    # lost, doubled or never shared lines would be no reference.
    from bench import recorder_append

    path = tmp_path / "least.bin"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    writes: list[bytes] = []
    writer = recorder_append._LeastGroupCommit(fd)
    real = recorder_append._synced_write

    def counted(fd: int, data: bytes) -> None:
        writes.append(data)
        real(fd, data)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(recorder_append, "_synced_write", counted)

            def append_many(thread: int) -> None:
                for i in range(200):
                    writer.append(b"%d-%d\n" % (thread, i))

            threads = [threading.Thread(target=append_many, args=(t,)) for t in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        os.close(fd)
    lines = path.read_bytes().splitlines()
    assert sorted(lines) == sorted(b"%d-%d" % (t, i) for t in range(8) for i in range(200))
    for t in range(8):  # each thread's lines in the order it appended them
        assert [line for line in lines if line.startswith(b"%d-" % t)] == [b"%d-%d" % (t, i) for i in range(200)]
    assert len(writes) < len(lines)  # some write carried several lines


def test_parse_transcript_is_a_clean_claude_run_of_distinct_messages() -> None:
    from bench.parse import _replay, build_transcript, check

    data, count = build_transcript(256 * 1024, seed=1)
    lines = [orjson.loads(line) for line in data.splitlines()]
    assert len(lines) == count and len(data) >= 256 * 1024
    assert lines[0]["subtype"] == "init" and lines[-1]["type"] == "result"
    kinds = {line["type"] for line in lines}
    assert {"system", "stream_event", "assistant", "user", "result"} <= kinds
    tool_ids = [
        block["id"]
        for line in lines
        if line["type"] == "assistant"
        for block in line["message"]["content"]
        if block["type"] == "tool_use"
    ]
    assert len(tool_ids) == len(set(tool_ids)) > 10  # every turn's tool call is new
    emitted, response = _replay(data)
    check(response)  # no malformed line, a final answer
    assert emitted > count // 2
    assert len([item for item in response.transcript if item.kind == "tool_result"]) == len(
        tool_ids
    )
    assert build_transcript(256 * 1024, seed=1) == (data, count)  # deterministic


def test_runner_runs_the_named_benchmarks_and_writes_a_summary(tmp_path: Path) -> None:
    summary = tmp_path / "latest.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "replay",
            "--quick",
            "--dir",
            str(tmp_path / "work"),
            "--results",
            str(summary),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    _check_shape(json.loads(lines[0]), "replay")
    text = summary.read_text()
    for label in ("CPU:", "RAM:", "Bench directory:", "Python:", "| replay | verify |"):
        assert label in text


def test_runner_rejects_an_unknown_name() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "no-such-bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 2
    assert "unknown benchmark" in done.stderr


# --- the fast verify path agrees with decode() ------------------------------------------------
#
# verify() and replay() accept lines through _quick_batch() and _quick_decode() and leave the
# rest to decode(); they must never accept a line decode() rejects.  These lines start from real records and are then mutated in
# the ways hostile or buggy writers would, re-framed so the crc is right (a crc error is the
# easy case) unless the mutation is to the bytes themselves.


def _records() -> list[dict[str, Any]]:
    from datetime import UTC, datetime

    from bench._common import event_mix
    from hosttools.sessionrecorder._model import EventRecord

    t0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    return [_format.encode(EventRecord(0, t0, event)) for event in event_mix(200, seed=3)]


_RECORDS = _records()
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(
        [
            "2026-12-02T10:00:00.000000Z",
            "2026-12-02T10:00:00",
            "garbage",
            "text.end",
            "text.sideways",
            "process.spawn",
            "process.weird",
            "notice.x",
            "run.started",
        ]
    ),
    st.lists(st.integers(-9, 9), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(-9, 9), max_size=2),
)
_TOP = ["v", "recorded_at", "kind", "meta", "event", "host_seq"]
_EVENT = [
    "kind",
    "meta",
    "phase",
    "text",
    "message_id",
    "args",
    "id",
    "name",
    "result",
    "run_id",
    "usage",
    "choices",
    "approval_kind",
    "created_at",
    "deadline",
    "data",
]
_META = ["run_id", "thread_key", "sequence", "time", "turn_id"]


@st.composite
def _lines(draw: st.DrawFn) -> tuple[bytes, int]:
    body = json.loads(json.dumps(draw(st.sampled_from(_RECORDS))))  # a deep copy
    body.update(v=1, host_seq=7)
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["top", "event", "meta", "both-meta"]))
        event = body.get("event")
        target = {
            "top": body,
            "event": event,
            "meta": event.get("meta") if isinstance(event, dict) else None,
            "both-meta": body.get("meta"),
        }[where]
        if not isinstance(target, dict):
            continue  # an earlier mutation replaced or removed it
        names = {"top": _TOP, "event": _EVENT}.get(where, _META)
        name = draw(st.sampled_from(names))
        if draw(st.booleans()):
            target.pop(name, None)
        else:
            target[name] = draw(_VALUES)
    line = frame(body)
    if draw(st.booleans()):
        # Byte-level damage: a flipped or dropped byte, or text after the object.
        at = draw(st.integers(0, len(line) - 2))
        how = draw(st.sampled_from(["flip", "drop", "append"]))
        if how == "flip":
            line = line[:at] + bytes([line[at] ^ 0x01]) + line[at + 1 :]
        elif how == "drop":
            line = line[:at] + line[at + 1 :]
        else:
            line = line[:-1] + b" \n"
    return line, draw(st.sampled_from([7, 7, 6, 8]))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lines())
def test_fast_verify_never_accepts_what_decode_rejects(case: tuple[bytes, int]) -> None:
    line, expected = case
    try:
        decoded = _format.decode(line, expected)
        accepted = True
    except _format._LineError:
        accepted = False
    quick = _format._quick_decode(line, expected)
    if quick is not None:
        assert accepted, line
        assert (quick, repr(quick)) == (decoded, repr(decoded))
    batch = _format._quick_batch([line], expected, True)
    if batch is not None:
        assert accepted, line
        assert [(r, repr(r)) for r in batch] == [(decoded, repr(decoded))]
    if _format._quick_batch([line], expected, False) is not None:
        assert accepted, line


@pytest.mark.parametrize("sequence", [[], [3]])
def test_fast_paths_refuse_a_meta_sequence_that_is_a_list(sequence: object) -> None:
    # Found by the property test above: a list of ints reads, as JSON text, much like an int.
    body = next(body for body in _RECORDS if body["kind"] == "text.content")
    meta = {**body["meta"], "sequence": sequence}
    line = frame(
        {**body, "meta": meta, "event": {**body["event"], "meta": meta}, "v": 1, "host_seq": 7}
    )
    with pytest.raises(_format._LineError):
        _format.decode(line, 7)
    assert _format._quick_decode(line, 7) is None
    assert _format._quick_batch([line], 7, True) is None
    assert _format._quick_batch([line], 7, False) is None


def test_fast_verify_accepts_what_the_recorder_writes() -> None:
    # Otherwise verify would quietly fall back to the slow path for every line.
    for seq, body in enumerate(_RECORDS, 1):
        line = frame({**body, "v": 1, "host_seq": seq})
        assert _format._quick_batch([line], seq, False) == [], body["kind"]
        assert _format._quick_decode(line, seq) is not None, body["kind"]


def test_fast_verify_counts_like_replay(tmp_path: Path) -> None:
    path = tmp_path / "k.jsonl"
    path.write_bytes(
        b"".join(frame({**body, "v": 1, "host_seq": n}) for n, body in enumerate(_RECORDS, 1))
    )
    assert _format.verify(path) == len(_RECORDS)
    with _format.open_log(path) as f:
        assert sum(1 for _ in _format.replay(f, "k", None)) == len(_RECORDS)
    assert orjson.loads(path.read_bytes().splitlines()[0])["host_seq"] == 1

"""The write path's shortcuts produce exactly what the plain code they replace produces.

Each shortcut (per-class to_json plans, the cached meta JSON, the strftime-free time format,
DurableLog skipping the fstat and tail check while nobody else had the lock) is checked against
a straightforward reference, so a fast path that drifts from it fails here.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptor import events
from adaptor._durable import DurableLog, exclusive, frame, repair, scan
from hosttools import sessionrecorder as sr
from hosttools.sessionrecorder import _format
from hosttools.sessionrecorder._model import EventRecord
from tests.test_events import EVENTS


def _reference_to_json(event: Any) -> dict[str, Any]:
    """to_json as it was written before it was made fast: walk the fields, strftime the time."""
    folded = events._FOLDED_FIELD.get(type(event))
    renamed = events._JSON_NAMES.get(type(event), {})
    meta = event.meta
    out: dict[str, Any] = {
        "kind": event._kind(),
        "meta": {
            "run_id": meta.run_id,
            "thread_key": meta.thread_key,
            "sequence": meta.sequence,
            "time": events.format_time(meta.time),
            "turn_id": meta.turn_id,
        },
    }
    for f in dataclasses.fields(event):
        if f.name in ("meta", "_responder") or f.name == folded:
            continue
        value = getattr(event, f.name)
        encoder = events._ENCODERS.get(f.name)
        out[renamed.get(f.name, f.name)] = encoder(value) if encoder else value
    return out


def _reference_line(recorded_at: datetime, event: Any, host_seq: int) -> bytes:
    """The record line by the book: sorted-key JSON, crc over it without the crc key."""
    body = _reference_to_json(event)
    record = {
        "recorded_at": events.format_time(recorded_at),
        "kind": body["kind"],
        "meta": body["meta"],
        "event": body,
        "v": _format.FORMAT_VERSION,
        _format.SEQ_KEY: host_seq,
    }
    record["crc"] = zlib.crc32(orjson.dumps(record, option=orjson.OPT_SORT_KEYS))
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)


_any_times = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone.min]),
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_to_json_matches_the_field_walk(event: Any) -> None:
    assert events.to_json(event) == _reference_to_json(event)
    # Twice: the second call takes the cached plan and (same meta object) the cached meta.
    assert orjson.dumps(events.to_json(event)) == orjson.dumps(_reference_to_json(event))


@settings(max_examples=300, deadline=None)
@given(_any_times)
def test_fast_time_format_is_format_time_byte_for_byte(moment: datetime) -> None:
    assert events._format_time_fast(moment) == events.format_time(moment)
    naive = moment.replace(tzinfo=None)  # read as local time by both
    assert events._format_time_fast(naive) == events.format_time(naive)


def test_cached_meta_json_is_the_callers_own() -> None:
    event = events.TextDelta(meta=events.EventMeta(run_id="r", sequence=1), text="a")
    first = events.to_json(event)
    first["meta"]["run_id"] = "changed"
    assert events.to_json(event)["meta"]["run_id"] == "r"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_any_times, EVENTS), min_size=1, max_size=4))
def test_recorded_lines_are_the_reference_serialization(
    tmp_path_factory: Any, items: list[tuple[datetime, Any]]
) -> None:
    directory = tmp_path_factory.mktemp("rec")
    with sr.JSONLEventBackend(directory, sync_on_append=False) as backend:
        for moment, event in items:
            backend.append("k", EventRecord(0, moment, event))
    lines = (directory / "k.jsonl").read_bytes().splitlines(keepends=True)
    expected = [_reference_line(moment, event, n) for n, (moment, event) in enumerate(items, 1)]
    assert lines == expected


# --- DurableLog: skipping the look at the file ------------------------------------------------


def test_instances_sharing_a_file_in_one_process_keep_the_sequence(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    first, second = DurableLog(path, sync=False), DurableLog(path, sync=False)
    seqs = []
    for i in range(20):
        writer = first if i % 3 else second  # runs of appends by one, then the other
        seqs.append(writer.append({"i": i})["seq"])
    first.close()
    second.close()
    assert seqs == list(range(1, 21))
    assert [record["i"] for _, record in scan(path)] == list(range(20))


def test_a_repair_in_this_process_is_seen_by_a_lingering_writer(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    lock = str(path) + ".lock"
    with DurableLog(path, sync=False) as log:
        log.append({"i": 0})
        with exclusive(lock):  # the flock still lingers: the epoch would not move by itself
            with path.open("ab") as f:
                f.write(frame({"seq": 2})[:-3])
            assert repair(path) is not None
        assert log.append({"i": 1})["seq"] == 2
    assert [seq for seq, _ in scan(path)] == [1, 2]


def test_back_to_back_appends_skip_the_fstat(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "log.jsonl"
    calls: list[int] = []
    real_fstat = os.fstat

    def counting_fstat(fd: int) -> os.stat_result:
        calls.append(fd)
        return real_fstat(fd)

    with DurableLog(path, sync=False) as log:
        log.append({})
        monkeypatch.setattr(os, "fstat", counting_fstat)
        for _ in range(50):
            log.append({})
        monkeypatch.undo()
    # The reaper may let go now and then (a descheduled thread); then the file is looked at.
    assert len(calls) < 25
    assert [seq for seq, _ in scan(path)] == list(range(1, 52))

"""Strictly validated replay of a session-recorder log, against an orjson-per-line loop.

Cases (quality.md, ``replay``):

* ``verify``: ``sessionrecorder.verify(path)``, every line checked (framing, crc, ``host_seq``,
  the record's fields and the event it holds); goal >= 0.5x the baseline's MB/s.
* ``iter_since``: ``EventRecorder.iter_since(key)``, the same checks plus an ``EventRecord`` with
  its event object per line, as a host consumes them; goal >= 0.5x.
* ``peak RSS growth``: the most either of those grew the reader's peak RSS above where it
  started; goal < 64 MB (replay streams; memory must not follow the file's size).

The log is written once per run (200 MB, or a few MB with ``--quick``) from a realistic mix
of events (see :func:`bench._common.event_mix`).  The baseline is ``orjson.loads`` on every line
of the same file.  Each reader runs in a fresh process, after the file is in the page cache,
so RSS is the reader's own and all of them read from memory, not the disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench._common import (
    MB,
    Options,
    at_least,
    below,
    emit,
    event_mix,
    log,
    parse_args,
    peak_rss_bytes,
    result,
    rss_bytes,
    workdir,
)

SUMMARY = (
    "MB/s of strict sessionrecorder replay (verify, iter_since) and its RSS vs orjson per line"
)

KEY = "replay-bench"
_FULL_BYTES = 200 * MB
_QUICK_BYTES = 3 * MB
_MODES = ("orjson", "verify", "iter_since")


def write_log(path: Path, size: int) -> int:
    """Write a valid log of at least ``size`` bytes at ``path``; returns the record count.

    Records are framed by the same code the recorder's writer uses; only the fsync per record
    is skipped, which changes nothing a reader can see.
    """
    from adaptor._durable import frame
    from adaptor.events import format_time
    from hosttools.sessionrecorder import _format
    from hosttools.sessionrecorder._model import EventRecord

    t0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
    bodies = [_format.encode(EventRecord(0, t0, event)) for event in event_mix(4096, seed=7)]
    written = 0
    count = 0
    chunk: list[bytes] = []
    with open(path, "wb") as f:
        while written < size:
            body = bodies[count % len(bodies)]
            count += 1
            stamp = format_time(t0 + timedelta(microseconds=37_001 * count))
            line = frame(
                {**body, "recorded_at": stamp, "v": _format.FORMAT_VERSION, _format.SEQ_KEY: count}
            )
            chunk.append(line)
            written += len(line)
            if len(chunk) >= 4096:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
    return count


# ---------------------------------------------------------------------------------------------
# The readers, each run in a child process


def _read(mode: str, path: Path) -> int:
    if mode == "orjson":
        import orjson

        count = 0
        with open(path, "rb") as f:
            for line in f:
                orjson.loads(line)
                count += 1
        return count
    from hosttools import sessionrecorder as sr

    if mode == "verify":
        return sr.verify(path)
    if mode == "iter_since":
        count = 0
        with sr.EventRecorder(sr.JSONLEventBackend(path.parent)) as recorder:
            for _ in recorder.iter_since(KEY):
                count += 1
        return count
    raise ValueError(f"unknown mode {mode!r}")


def child(mode: str, path: Path) -> dict[str, Any]:
    # Import everything the reader needs first, so RSS growth is the reading alone.
    import orjson  # noqa: F401

    from hosttools import sessionrecorder  # noqa: F401

    start_rss = rss_bytes()
    started = time.perf_counter()
    records = _read(mode, path)
    seconds = time.perf_counter() - started
    return {
        "mode": mode,
        "records": records,
        "seconds": seconds,
        "rss_growth": max(0, peak_rss_bytes() - start_rss),
    }


def _run_child(mode: str, path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.replay", "--child", mode, str(path)],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def run(options: Options) -> dict[str, object]:
    started = time.perf_counter()
    target = _QUICK_BYTES if options.quick else _FULL_BYTES
    rounds = 1 if options.quick else 3
    with workdir(options, "replay") as directory:
        path = directory / f"{KEY}.jsonl"
        records = write_log(path, target)
        size = path.stat().st_size
        log(f"replay: {path}, {size / MB:.1f} MB, {records} records")
        _run_child("orjson", path)  # brings the whole file into the page cache
        best: dict[str, float] = {}
        growth: dict[str, int] = {}
        for _ in range(rounds):
            # Alternating readers share any drift in the machine's load.
            for mode in _MODES:
                got = _run_child(mode, path)
                if got["records"] != records:
                    raise RuntimeError(f"{mode} read {got['records']} records, not {records}")
                best[mode] = max(best.get(mode, 0.0), size / MB / got["seconds"])
                growth[mode] = max(growth.get(mode, 0), got["rss_growth"])
            log("replay: " + ", ".join(f"{m} {v:.1f} MB/s" for m, v in best.items()))
        baseline = best["orjson"]
        worst_mode = max(("verify", "iter_since"), key=lambda m: growth[m])
        cases = [
            at_least("verify", best["verify"], baseline, "MB/s", 0.5),
            at_least("iter_since", best["iter_since"], baseline, "MB/s", 0.5),
            below(
                "peak RSS growth",
                growth[worst_mode] / MB,
                "MB",
                64,
                baseline=growth["orjson"] / MB,
                reader=worst_mode,
            ),
        ]
        params = {
            "log_mb": round(size / MB, 1),
            "records": records,
            "mean_line_bytes": round(size / records),
            "rounds": rounds,
            "best_of": "max MB/s per reader over the rounds",
        }
        return result("replay", cases, options=options, started=started, params=params)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        mode, path = args[1], Path(args[2])
        sys.stdout.write(json.dumps(child(mode, path)) + "\n")
        return 0
    options = parse_args(args, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Durable appends per second through the session recorder, against a raw write+fsync loop.

Cases (quality.md, ``recorder_append``):

* ``1 writer``: one thread calling ``EventRecorder.record`` on one key with
  ``JSONLEventBackend(dir, sync_on_append=True)``; goal >= 0.8x raw.
* ``8 threads, 1 key``: eight threads recording at once on one key through one recorder;
  every call still returns only after its record is fsynced, so the goal of >= 3x raw is
  reachable only by sharing syncs (group commit across writers).
* ``8 threads, 8 keys``: eight threads, each on its own key.  Records in different files cannot
  share a sync, so this case is held to the per-writer goal (>= 0.8x) against the same work
  done raw: eight threads looping write+fsync on eight files.  (Against the single raw loop it
  could only ever be as fast as the filesystem overlaps eight concurrent fsyncs, which is
  about 3x on the disk these figures were first taken on: a goal no writer could be held to.)

The baseline is one thread appending lines of exactly the recorder's line length to a fresh
file opened ``O_APPEND`` with ``os.write`` + ``os.fsync`` per line (eight such threads on eight
files for the 8-key case), measured in the same run on the same directory.

Reported beside them, with no goal: ``8 threads, 1 key: least group commit``, eight threads
appending ready-made lines to one file through a group commit that does nothing else
(:class:`_LeastGroupCommit`: no record to build, no check, no failure handling), against the
same raw loop.  It shows what sharing syncs among threads of this interpreter reaches on this
machine before any record work; the recorder's ``8 threads, 1 key`` is to be read against it
as well as against its 3x.  (A variant with a thread of its own doing every write and sync,
the writers only queueing, measured the same.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from adaptor import _durable
from bench._common import (
    Case,
    Options,
    at_least,
    emit,
    event_mix,
    interleave,
    log,
    loop_meter,
    parse_args,
    result,
    threads_meter,
    workdir,
)

SUMMARY = "durable events/s through sessionrecorder (1 writer; 8 threads on 1 and 8 keys) vs raw write+fsync"

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def _raw_step(fd: int, line: bytes) -> Callable[[], int]:
    def step() -> int:
        os.write(fd, line)
        os.fsync(fd)
        return 1

    return step


class _Waiter:
    """A queued line; ``wake`` is released once it is durable, or with ``batch`` set (the
    queued lines from it on) when its caller is to write them."""

    __slots__ = ("batch", "line", "wake")

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.wake = threading.Lock()
        self.wake.acquire()
        self.batch: list[_Waiter] | None = None


class _LeastGroupCommit:
    """Durable appends of ready-made lines to one file, shared syncs and nothing else.

    The first caller to find the file idle writes its line; whoever calls meanwhile queues and
    sleeps on a lock of its own.  After each synced write the writer wakes the callers it
    wrote for and hands whatever queued meanwhile, as one batch, to the first of them.  A
    reference for the recorder's ``8 threads, 1 key`` case, not a writer to use: no framing,
    no checks, and a failed write leaves its waiters asleep.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mutex = threading.Lock()
        self._queue: list[_Waiter] = []
        self._writing = False

    def append(self, line: bytes) -> None:
        with self._mutex:
            own = _Waiter(line) if self._writing else None
            if own is None:
                self._writing = True
            else:
                self._queue.append(own)
        if own is None:
            lines, served = [line], []
        else:
            own.wake.acquire()
            if own.batch is None:
                return  # written by another caller
            lines, served = [waiter.line for waiter in own.batch], own.batch[1:]
        _synced_write(self._fd, b"".join(lines))
        with self._mutex:
            following, self._queue = self._queue, []
            if not following:
                self._writing = False
        for waiter in served:
            waiter.wake.release()
        if following:
            following[0].batch = following
            following[0].wake.release()


def _synced_write(fd: int, data: bytes) -> None:
    # The recorder's own synced append: one system call where Linux offers it.
    if _durable._RWF_DSYNC is not None:
        _durable._write_datasync(fd, data)
    else:
        os.write(fd, data)
        _durable._datasync(fd)


def _text_events() -> list[object]:
    # Text deltas are most of a run's events; the mix's few-KB tool results would make the
    # per-append overhead look smaller than it is.
    return [e for e in event_mix(64, seed=0) if type(e).__name__ == "TextDelta"]


def line_length(directory: Path) -> int:
    """Mean length of the lines the recorder writes for the events used here."""
    from hosttools import sessionrecorder as sr

    probe = directory / "probe"
    with sr.EventRecorder(sr.JSONLEventBackend(probe, sync_on_append=False)) as recorder:
        for event in _text_events():
            recorder.record("probe", event)  # type: ignore[arg-type]
    data = (probe / "probe.jsonl").read_bytes()
    return max(2, round(len(data) / data.count(b"\n")))


def run(options: Options) -> dict[str, object]:
    from hosttools import sessionrecorder as sr

    started = time.perf_counter()
    with workdir(options, "recorder_append") as directory, contextlib.ExitStack() as stack:
        size = line_length(directory)
        line = b"x" * (size - 1) + b"\n"
        events = _text_events()
        log(f"recorder_append: {directory}, lines of {size} bytes, {options.seconds:g}s per meter")

        def raw_fd(name: str) -> int:
            fd = os.open(directory / name, _FLAGS, 0o600)
            stack.callback(os.close, fd)
            return fd

        recorder = sr.EventRecorder(sr.JSONLEventBackend(directory, sync_on_append=True))
        stack.callback(recorder.close)

        def record_step(key: str, offset: int) -> Callable[[], int]:
            counter = [offset]

            def step() -> int:
                counter[0] += 1
                recorder.record(key, events[counter[0] % len(events)])  # type: ignore[arg-type]
                return 1

            return step

        # The single writer alternates with its baseline every few operations, the threaded
        # cases every 0.1 s (each slice starts fresh threads), so both groups compare figures
        # taken within moments of their baseline.
        single = interleave(
            {
                "raw": loop_meter(_raw_step(raw_fd("raw-1.bin"), line)),
                "one": loop_meter(record_step("one", 0)),
            },
            options.seconds,
            slice_seconds=0.01,
        )
        least = _LeastGroupCommit(raw_fd("least-group-commit.bin"))

        def least_step() -> int:
            least.append(line)
            return 1

        threaded = interleave(
            {
                "raw": loop_meter(_raw_step(raw_fd("raw-2.bin"), line)),
                "least_group_commit": threads_meter([least_step] * 8),
                "eight_one": threads_meter([record_step("shared", i) for i in range(8)]),
                "eight_eight": threads_meter([record_step(f"own-{i}", i) for i in range(8)]),
                "raw_parallel": threads_meter(
                    [_raw_step(raw_fd(f"raw-8-{i}.bin"), line) for i in range(8)]
                ),
            },
            options.seconds,
            slice_seconds=0.1,
        )
        shown = {f"{k} (single)": v for k, v in single.items()}
        shown |= {f"{k} (threaded)": v for k, v in threaded.items()}
        log("recorder_append: " + ", ".join(f"{k} {v:.0f}/s" for k, v in shown.items()))
        cases: list[Case] = [
            at_least("1 writer", single["one"], single["raw"], "events/s", 0.8),
            at_least("8 threads, 1 key", threaded["eight_one"], threaded["raw"], "events/s", 3.0),
            at_least(
                "8 threads, 8 keys",
                threaded["eight_eight"],
                threaded["raw_parallel"],
                "events/s",
                0.8,
                raw_1_thread=round(threaded["raw"], 1),
            ),
            Case(
                "8 threads, 1 key: least group commit",
                threaded["least_group_commit"],
                "events/s",
                threaded["raw"],
                threaded["least_group_commit"] / threaded["raw"] if threaded["raw"] > 0 else None,
                "reported (no goal)",
                True,
            ),
        ]
        params = {
            "line_bytes": size,
            "seconds_per_meter": options.seconds,
            "baseline_sync": "os.fsync",
            "recorder_sync": "os.fdatasync",
        }
        return result("recorder_append", cases, options=options, started=started, params=params)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

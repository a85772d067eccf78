"""Thread-store compare-and-swap cycles per second, against a raw flock+write+fsync loop.

A cycle is what the Thread layer does around a resumed turn: ``acquire_lease`` on the key's
target, ``finalize`` the thread's record with its new session state under that lease (fsynced;
the record keeps its id, as ``adaptor/_thread.py`` does when it resumes), ``release_lease``.
(Until 2026-12-05 every cycle finalized a record with a new id, which no turn does: the store
then grew by a record per cycle, and so did every compaction and every fresh process's first
read.)  Cases (quality.md, ``store_cas``):

* ``1 process``: one ``JSONLStore`` cycling over 16 keys; goal >= 0.5x raw.
* ``4 processes``: four processes with their own ``JSONLStore`` on one directory, each cycling
  over the same 16 keys from a different starting point; a ``BusyError`` (another process holds
  that key right now) moves on to the next key and is counted, not a cycle.  Goal >= 0.5x raw.
  Each slice starts its processes afresh; each reads the store's files before the common
  start, as the single process of the other case did once.

The baseline is the same number of processes looping ``flock`` on one lock file, ``write`` of
one line as long as a finalize line, ``fsync``, unlock: the least a durable, cross-process
store can do per commit.  Baseline and figure alternate in slices so they share the disk's
moods.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._common import (
    Options,
    at_least,
    emit,
    interleave,
    log,
    loop_meter,
    parse_args,
    result,
    workdir,
)

SUMMARY = "thread-store acquire+finalize+release cycles/s (1 and 4 processes, 16 keys) vs raw flock+write+fsync"

KEYS = 16
PROCESSES = 4
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_ROOT = Path(__file__).resolve().parent.parent


def _record(key: str, serial: int) -> Any:
    from adaptor.driver import SessionState
    from adaptor.threadstore import Record

    now = datetime.now(UTC)
    return Record(
        # A resumed turn keeps its thread's record (adaptor/_thread.py: reuse): one per key.
        id=f"rec-{key}",
        key=key,
        status="active",
        driver_type="script",
        agent="agent-1",
        fingerprint="fp-" + "0123456789abcdef" * 4,
        compatibility_fingerprint="cfp-" + "fedcba9876543210" * 4,
        session_codec="script/v1",
        state=SessionState(
            resume_id=f"resume-{serial}", display_id="d", data={"turn": str(serial)}
        ),
        created_at=now,
        updated_at=now,
    )


def store_step(
    directory: Path, start: int, busy: list[int], *, load_now: bool = False
) -> tuple[Callable[[], int], Callable[[], None]]:
    """One cycle per call over the 16 keys, starting at key ``start``; BusyError counts in busy.

    ``load_now``: read the store's files now (snapshot and log), as the first call would.
    """
    from adaptor.threadstore import BusyError, FinalizeRequest, JSONLStore, Query

    store = JSONLStore(directory)
    if load_now:
        store.resolve(Query(key="thread-0"))
    owner = f"bench-{os.getpid()}-{start}"
    state = [start]

    def step() -> int:
        serial = state[0]
        state[0] += 1
        key = f"thread-{serial % KEYS}"
        try:
            lease = store.acquire_lease(f"key:{key}", owner, 60)
        except BusyError:
            busy[0] += 1
            return 0
        try:
            store.finalize(
                FinalizeRequest(
                    record=_record(key, serial), key=key, held_leases=(lease,), rebind_active=True
                )
            )
        finally:
            store.release_lease(lease)
        return 1

    return step, store.close


def raw_step(directory: Path, line: bytes) -> tuple[Callable[[], int], Callable[[], None]]:
    lock = os.open(
        directory / "raw.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600
    )
    fd = os.open(directory / "raw.jsonl", _FLAGS, 0o600)

    def step() -> int:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        return 1

    def close() -> None:
        os.close(fd)
        os.close(lock)

    return step, close


def finalize_line_bytes(directory: Path) -> int:
    """Length of the log line one finalize writes (what a cycle fsyncs)."""
    probe = directory / "probe"
    step, close = store_step(probe, 0, [0])
    try:
        step()
    finally:
        close()
    lines = [line for p in probe.glob("log-*.jsonl") for line in p.read_bytes().splitlines()]
    return max(len(line) + 1 for line in lines if b'"finalize"' in line)


# ---------------------------------------------------------------------------------------------
# Several processes


def _child(
    mode: str, directory: Path, line_bytes: int, index: int, seconds: float
) -> dict[str, int]:
    busy = [0]
    if mode == "store":
        # Loaded before the start, like the interpreter (below): each slice starts fresh
        # processes, and the single process of the other case reads the files only once.
        step, close = store_step(
            directory / "store", index * (KEYS // PROCESSES), busy, load_now=True
        )
    else:
        step, close = raw_step(directory, b"x" * (line_bytes - 1) + b"\n")
    ops = 0
    try:
        # Say we are set up, then wait for the common start instant: on a loaded machine
        # interpreter start-up can take longer than any fixed lead, and a child that starts
        # late would be charged for its imports.
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + seconds
        while time.time() < deadline:
            ops += step()
    finally:
        close()
    return {"ops": ops, "busy": busy[0]}


def processes_meter(
    mode: str, directory: Path, line_bytes: int, totals: dict[str, int]
) -> Callable[[float], tuple[int, float]]:
    """A meter running ``PROCESSES`` child processes in ``mode`` for each slice."""

    def measure(seconds: float) -> tuple[int, float]:
        # Children start together at a wall-clock instant set once all of them are ready,
        # so their interpreter start-up is not timed.
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.store_cas",
                    "--child",
                    mode,
                    str(directory),
                    str(line_bytes),
                    str(i),
                    repr(seconds),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=_ROOT,
            )
            for i in range(PROCESSES)
        ]
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline() != b"ready\n":
                child.wait()
                raise RuntimeError(f"{mode} child failed with exit status {child.returncode}")
        start_at = repr(time.time() + 0.1).encode() + b"\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(start_at)
            child.stdin.close()
        ops = 0
        for child in children:
            assert child.stdout is not None
            out = child.stdout.read()
            child.wait()
            if child.returncode != 0:
                raise RuntimeError(f"{mode} child failed with exit status {child.returncode}")
            got = json.loads(out)
            ops += got["ops"]
            totals["busy"] = totals.get("busy", 0) + got["busy"]
        return ops, seconds

    return measure


def run(options: Options) -> dict[str, object]:
    started = time.perf_counter()
    with workdir(options, "store_cas") as directory, contextlib.ExitStack() as stack:
        size = finalize_line_bytes(directory)
        line = b"x" * (size - 1) + b"\n"
        log(f"store_cas: {directory}, finalize lines of {size} bytes")
        busy = [0]
        store_one, close_store = store_step(directory / "one", 0, busy)
        stack.callback(close_store)
        raw_one, close_raw = raw_step(directory, line)
        stack.callback(close_raw)
        single = interleave(
            {"raw": loop_meter(raw_one), "store": loop_meter(store_one)},
            options.seconds,
            slice_seconds=0.05,
        )
        log(
            f"store_cas: 1 process: raw {single['raw']:.0f}/s, store {single['store']:.0f} cycles/s"
        )
        many_dir = directory / "many"
        many_dir.mkdir()
        totals: dict[str, int] = {}
        many = interleave(
            {
                "raw": processes_meter("raw", many_dir, size, {}),
                "store": processes_meter("store", many_dir, size, totals),
            },
            options.seconds,
            slice_seconds=options.seconds if options.quick else 1.0,
        )
        log(
            f"store_cas: {PROCESSES} processes: raw {many['raw']:.0f}/s, store {many['store']:.0f} cycles/s"
        )
        cases = [
            at_least("1 process", single["store"], single["raw"], "cycles/s", 0.5, busy=busy[0]),
            at_least(
                f"{PROCESSES} processes",
                many["store"],
                many["raw"],
                "cycles/s",
                0.5,
                busy=totals.get("busy", 0),
            ),
        ]
        params = {"keys": KEYS, "finalize_line_bytes": size, "seconds_per_meter": options.seconds}
        return result("store_cas", cases, options=options, started=started, params=params)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        mode, directory, line_bytes, index, seconds = args[1:6]
        got = _child(mode, Path(directory), int(line_bytes), int(index), float(seconds))
        sys.stdout.write(json.dumps(got) + "\n")
        return 0
    options = parse_args(args, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

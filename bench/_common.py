"""Timing, memory and reporting helpers shared by the benchmarks.

Every benchmark reports one JSON object::

    {"name": ..., "unit": ..., "figure": ..., "baseline": ..., "ratio": ..., "goal": ...,
     "met": ..., "cases": [...], "quick": ..., "params": {...}, "seconds": ...}

``figure``/``baseline``/``ratio`` are those of the headline case (the first one); ``goal`` spells
out every case's goal and ``met`` is true only when all cases meet theirs.  Each case carries
the same fields, so a reader that wants one number per configuration finds it there.  A
baseline is always measured in the same process run, on the same disk, right next to the
figure: only the ratio is comparable across machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "MB",
    "Case",
    "Meter",
    "Options",
    "at_least",
    "below",
    "emit",
    "event_mix",
    "interleave",
    "log",
    "loop_meter",
    "machine",
    "parse_args",
    "peak_rss_bytes",
    "result",
    "rss_bytes",
    "threads_meter",
    "workdir",
]

MB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class Options:
    quick: bool
    """Smoke size: seconds in total, figures meaningless; used by the test suite."""
    dir: Path | None
    """Where to put the benchmark's files (a fresh subdirectory is made and removed)."""
    seconds: float
    """How long each timed loop runs."""


def parse_args(argv: Sequence[str] | None, description: str) -> Options:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test size")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory on the disk to measure (default: the system temp dir)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="length of each timed loop (default 3, quick 0.2)",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.2 if args.quick else 3.0)
    return Options(quick=args.quick, dir=args.dir, seconds=seconds)


@contextlib.contextmanager
def workdir(options: Options, name: str) -> Iterator[Path]:
    """A fresh directory for one benchmark's files, removed afterwards."""
    parent = options.dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Timing


Meter = Callable[[float], tuple[int, float]]
"""Runs its workload for about the given seconds; returns (operations done, seconds taken)."""


def loop_meter(step: Callable[[], int]) -> Meter:
    """A meter calling ``step`` (which returns how many operations it did) in a loop."""

    def measure(seconds: float) -> tuple[int, float]:
        ops = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            ops += step()
            now = time.perf_counter()
            if now >= deadline:
                return ops, now - start

    return measure


def threads_meter(steps: Sequence[Callable[[], int]]) -> Meter:
    """A meter running one thread per step until a common deadline.

    The time is the wall time until the last thread stopped: an operation in flight at the
    deadline finishes and counts, as it would in a closed loop.
    """

    def measure(seconds: float) -> tuple[int, float]:
        counts = [0] * len(steps)
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(steps) + 1)
        deadline = 0.0

        def worker(i: int) -> None:
            barrier.wait()
            step = steps[i]
            try:
                while time.perf_counter() < deadline:
                    counts[i] += step()
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(steps))]
        for thread in pool:
            thread.start()
        start = time.perf_counter()
        deadline = start + seconds
        barrier.wait()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        return sum(counts), elapsed

    return measure


def interleave(
    meters: dict[str, Meter], seconds: float, *, slice_seconds: float = 0.25
) -> dict[str, float]:
    """Operations per second of each meter, measured in alternating slices.

    Every meter runs for about ``seconds`` in total, cut into slices that take turns (the order
    rotates each round), so the baseline and the figures share the disk's moods: a virtual
    disk's throughput drifts by 2-3x within a minute, which decides a ratio of separate runs.
    """
    names = list(meters)
    rounds = max(1, round(seconds / slice_seconds))
    each = seconds / rounds
    ops = dict.fromkeys(names, 0)
    spent = dict.fromkeys(names, 0.0)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            done, took = meters[name](each)
            ops[name] += done
            spent[name] += took
    return {name: ops[name] / spent[name] for name in names}


# ---------------------------------------------------------------------------------------------
# Memory


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    """Current resident set size."""
    kib = _status_kib("VmRSS")
    if kib is None:  # not Linux: the peak is the best available approximation
        return peak_rss_bytes()
    return kib * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    kib = _status_kib("VmHWM")
    if kib is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes
    return kib * 1024


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Case:
    """One configuration's figure against its baseline and goal."""

    case: str
    figure: float
    unit: str
    baseline: float | None
    ratio: float | None
    goal: str
    met: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "case": self.case,
            "figure": _round(self.figure),
            "unit": self.unit,
            "baseline": None if self.baseline is None else _round(self.baseline),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "goal": self.goal,
            "met": self.met,
        }
        out.update(self.extra)
        return out


def _round(value: float) -> float:
    return round(value, 3 if abs(value) < 100 else 1)


def at_least(
    case: str, figure: float, baseline: float, unit: str, goal: float, **extra: Any
) -> Case:
    """A case whose goal is ``figure / baseline >= goal``."""
    ratio = figure / baseline if baseline > 0 else float("inf")
    return Case(case, figure, unit, baseline, ratio, f"ratio >= {goal:g}", ratio >= goal, extra)


def below(
    case: str, figure: float, unit: str, limit: float, baseline: float | None = None, **extra: Any
) -> Case:
    """A case whose goal is an absolute ceiling on ``figure`` (the baseline is informative)."""
    ratio = None if baseline is None or baseline <= 0 else figure / baseline
    return Case(
        case, figure, unit, baseline, ratio, f"figure < {limit:g} {unit}", figure < limit, extra
    )


def result(
    name: str,
    cases: Sequence[Case],
    *,
    options: Options,
    started: float,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The benchmark's JSON object; the first case is the headline."""
    if not cases:
        raise ValueError("a benchmark reports at least one case")
    head = cases[0]
    return {
        "name": name,
        "unit": head.unit,
        "figure": _round(head.figure),
        "baseline": None if head.baseline is None else _round(head.baseline),
        "ratio": None if head.ratio is None else round(head.ratio, 3),
        "goal": "; ".join(f"{c.case}: {c.goal}" for c in cases),
        "met": all(c.met for c in cases),
        "cases": [c.to_json() for c in cases],
        "quick": options.quick,
        "params": params or {},
        "seconds": round(time.perf_counter() - started, 1),
    }


def emit(obj: dict[str, Any]) -> None:
    """Print the one JSON line a benchmark reports (stdout carries nothing else)."""
    sys.stdout.write(json.dumps(obj, sort_keys=False) + "\n")
    sys.stdout.flush()


def log(message: str) -> None:
    """Progress for the person watching; stderr, so stdout stays one JSON line."""
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def _unescape_mount(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    return (
        text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def _filesystem(path: Path) -> dict[str, str]:
    """Type, source and options of the mount holding ``path`` (the longest matching mount point)."""
    target = os.path.realpath(path)
    best: dict[str, str] = {}
    best_len = -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 6 or len(tail) < 2:
                    continue
                point = _unescape_mount(fields[4])
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > best_len:
                    best_len = len(point)
                    best = {
                        "mount": point,
                        "type": tail[0],
                        "source": _unescape_mount(tail[1]),
                        "options": fields[5],
                    }
    except OSError:
        pass
    return best or {"type": "unknown"}


def machine(bench_dir: Path) -> dict[str, Any]:
    """What the figures were measured on."""
    ram = _ram_bytes()
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "cores_usable": usable,
        "ram_gib": None if ram is None else round(ram / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "bench_dir": str(bench_dir),
        "filesystem": _filesystem(bench_dir),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


# ---------------------------------------------------------------------------------------------
# Events as a run produces them


def event_mix(count: int, *, seed: int = 0) -> list[Any]:
    """``count`` public events in roughly the proportions of a coding-agent run's audit log.

    Mostly small text deltas, then tool calls with arguments, tool results of a few KB, raw
    process output, thinking and notices; sizes vary so no line length repeats in lockstep.
    Deterministic for a given ``seed``.
    """
    import random
    from datetime import UTC, datetime, timedelta

    from adaptor.events import (
        EventMeta,
        Notice,
        ProcessInfo,
        TextDelta,
        Thinking,
        ToolCall,
        ToolResult,
    )

    rng = random.Random(seed)
    words = (
        "the agent reads the file and then edits function tests pass build module import "
        "error value return config path line change review diff patch commit"
    ).split()
    t0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)

    def prose(n_words: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n_words))

    events: list[Any] = []
    for i in range(count):
        meta = EventMeta(
            run_id="run-7f3a9c2e",
            thread_key="thread-main",
            sequence=i + 1,
            time=t0 + timedelta(milliseconds=37 * i),
            turn_id=f"turn-{i // 200}",
        )
        roll = rng.random()
        if roll < 0.50:
            events.append(
                TextDelta(meta=meta, message_id=f"msg-{i // 40}", text=prose(rng.randint(4, 40)))
            )
        elif roll < 0.62:
            events.append(
                ToolCall(
                    meta=meta,
                    id=f"call-{i}",
                    name=rng.choice(["Read", "Edit", "Bash", "Grep"]),
                    args={
                        "path": f"src/pkg/module_{rng.randint(0, 99)}.py",
                        "pattern": prose(3),
                        "limit": rng.randint(1, 500),
                    },
                )
            )
        elif roll < 0.74:
            body = "\n".join(prose(rng.randint(5, 14)) for _ in range(rng.randint(5, 60)))
            events.append(ToolResult(meta=meta, id=f"call-{i - 1}", result=body))
        elif roll < 0.86:
            events.append(ProcessInfo(meta=meta, kind="stdout", text=prose(rng.randint(10, 120))))
        elif roll < 0.96:
            events.append(
                Thinking(meta=meta, message_id=f"msg-{i // 40}", text=prose(rng.randint(20, 80)))
            )
        else:
            events.append(Notice(meta=meta, kind="lifecycle", text=prose(6), data={"step": i}))
    return events

"""``python -m bench [NAME ...] [--quick] [--dir DIR] [--seconds S] [--results FILE]``.

Runs the named benchmarks (default: every one in :data:`bench.BENCHMARKS`), each in its own
process, echoes the one JSON line each prints, and writes a markdown summary with a
description of the machine to ``bench/results/latest.md`` (or ``--results``).  Exits 1 if a
benchmark failed to run (not if it missed its goal: that is a finding, not an error).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import BENCHMARKS
from bench._common import machine

_ROOT = Path(__file__).resolve().parent.parent
_DEFAULT_RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test sizes")
    parser.add_argument("--dir", type=Path, default=None, help="where benchmarks put their files")
    parser.add_argument("--seconds", type=float, default=None, help="length of each timed loop")
    parser.add_argument("--results", type=Path, default=_DEFAULT_RESULTS, help="markdown summary")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return args


def _run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", f"bench.{name}"]
    if args.quick:
        command.append("--quick")
    if args.dir is not None:
        command += ["--dir", str(args.dir)]
    if args.seconds is not None:
        command += ["--seconds", str(args.seconds)]
    started = time.perf_counter()
    # stderr (progress) passes through to the person watching; stdout is the one JSON line.
    done = subprocess.run(command, cwd=_ROOT, stdout=subprocess.PIPE, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or len(lines) != 1:
        return {
            "name": name,
            "error": f"exit status {done.returncode}, {len(lines)} output line(s)",
            "seconds": round(time.perf_counter() - started, 1),
        }
    parsed: dict[str, Any] = json.loads(lines[0])
    return parsed


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def summary(results: list[dict[str, Any]], info: dict[str, Any], started: datetime) -> str:
    fs = info.get("filesystem", {})
    lines = [
        "# Benchmark results",
        "",
        f"Run {started.strftime('%Y-%m-%d %H:%M UTC')} with `python -m bench"
        + (" --quick" if info.get("quick") else "")
        + "`.  Each figure's baseline was measured in the same run, on the same disk; compare"
        " ratios, not absolute numbers, across machines.",
        "",
        "## Machine",
        "",
        f"- CPU: {info['cpu']}, {info['cores']} cores ({info['cores_usable']} usable)",
        f"- RAM: {info['ram_gib']} GiB",
        f"- OS: {info['os']}",
        f"- Bench directory: `{info['bench_dir']}` on {fs.get('type', 'unknown')}"
        f" (`{fs.get('source', '?')}` mounted at `{fs.get('mount', '?')}`, {fs.get('options', '?')})",
        f"- Python: {info['python']}",
        f"- Load average (1, 5, 15 min) before / after: {info['load_before']} / {info['load_after']}",
        "",
        "## Results",
        "",
        "| benchmark | case | figure | baseline | ratio | goal | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['name']} | – | – | – | – | – | error: {res['error']} |")
            continue
        for case in res.get("cases", []):
            lines.append(
                f"| {res['name']} | {case['case']} | {_fmt(case['figure'])} {case['unit']} "
                f"| {_fmt(case['baseline'])} | {_fmt(case['ratio'])} | {case['goal']} "
                f"| {'yes' if case['met'] else 'no'} |"
            )
    lines += ["", "## Raw output", ""]
    for res in results:
        lines += ["```json", json.dumps(res, indent=2), "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    names = args.names or list(BENCHMARKS)
    started = datetime.now(UTC)
    info = machine(args.dir if args.dir is not None else Path(tempfile.gettempdir()))
    info["quick"] = args.quick
    info["load_before"] = _load()
    results: list[dict[str, Any]] = []
    for name in names:
        res = _run_one(name, args)
        print(json.dumps(res), flush=True)
        results.append(res)
    info["load_after"] = _load()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(summary(results, info, started) + "\n", encoding="utf-8")
    print(f"summary written to {args.results}", file=sys.stderr)
    return 1 if any("error" in res for res in results) else 0


if __name__ == "__main__":
    sys.exit(main())

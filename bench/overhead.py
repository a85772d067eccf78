"""Wall time of ``adaptor run`` through a real daemon against ``adaptor run --no-daemon``.

Case (quality.md, ``overhead``):

* ``through the daemon``: the median wall time of
  ``python -m adaptor run --home HOME --driver script --config 'steps=[{"text":"hi"}]' --quiet hi``
  with an ``adaptord serve`` running on ``HOME``; goal <= 1.2x the baseline + 20 ms.

The baseline is the median of the very same command with ``--no-daemon`` (the request run in
the CLI's own process), measured in the same run: the two commands alternate, so both share
the machine's load, and both pay the interpreter's start and the CLI's imports.  Each command
is a fresh process started from this one; the time is from its start to its exit.  Both see
an empty ``XDG_CONFIG_HOME`` so no adaptord config of the machine applies.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench._common import Case, Options, emit, log, parse_args, result, workdir
from bench._daemon import Daemon, isolated_env

SUMMARY = "wall time of `adaptor run` through adaptord vs `adaptor run --no-daemon` (script driver)"

_FACTOR = 1.2
_SLACK_MS = 20.0
_ARGS = ("--driver", "script", "--config", 'steps=[{"text":"hi"}]', "--quiet", "hi")


def _command(home: Path, *, daemon: bool) -> list[str]:
    command = [sys.executable, "-m", "adaptor", "run", "--home", str(home), *_ARGS]
    if not daemon:
        command.insert(-1, "--no-daemon")
    return command


def _timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds from starting ``command`` to its exit; fails unless it printed ``hi``."""
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    if done.returncode != 0 or done.stdout.strip() != "hi":
        raise RuntimeError(
            f"{' '.join(command)}: exit {done.returncode}, stdout {done.stdout!r}, "
            f"stderr {done.stderr[-2000:]!r}"
        )
    return took


def run(options: Options) -> dict[str, object]:
    started = time.perf_counter()
    runs = 3 if options.quick else 30
    warmup = 1 if options.quick else 2
    with workdir(options, "overhead") as scratch:
        env = isolated_env(scratch)
        home = scratch / "home"
        workspace = scratch / "workspace"
        workspace.mkdir()
        with Daemon(home, env=env):
            commands = {
                "daemon": _command(home, daemon=True),
                "in_process": _command(home, daemon=False),
            }
            times: dict[str, list[float]] = {name: [] for name in commands}
            for i in range(warmup + runs):
                # Alternate, and swap the order every round, so neither side always goes first.
                order = list(commands) if i % 2 == 0 else list(reversed(commands))
                for name in order:
                    took = _timed(commands[name], env, workspace)
                    if i >= warmup:
                        times[name].append(took)
        ms = {name: [t * 1000 for t in values] for name, values in times.items()}
        median = {name: statistics.median(values) for name, values in ms.items()}
        log(
            f"overhead: through the daemon {median['daemon']:.1f} ms, "
            f"in-process {median['in_process']:.1f} ms (medians of {runs})"
        )
        figure, baseline = median["daemon"], median["in_process"]
        limit = _FACTOR * baseline + _SLACK_MS
        cases = [
            Case(
                "through the daemon",
                figure,
                "ms",
                baseline,
                figure / baseline,
                f"figure <= {_FACTOR:g} x baseline + {_SLACK_MS:g} ms",
                figure <= limit,
                {
                    "limit_ms": round(limit, 1),
                    "excess_ms": round(figure - baseline, 1),
                    "min_ms": round(min(ms["daemon"]), 1),
                    "max_ms": round(max(ms["daemon"]), 1),
                    "baseline_min_ms": round(min(ms["in_process"]), 1),
                    "baseline_max_ms": round(max(ms["in_process"]), 1),
                },
            )
        ]
        params = {
            "runs_each": runs,
            "warmup_each": warmup,
            "command": " ".join(["adaptor", "run", "--home", "HOME", *_ARGS]),
            "baseline_flag": "--no-daemon",
            "statistic": "median wall time of the whole command (process start to exit)",
        }
        return result("overhead", cases, options=options, started=started, params=params)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

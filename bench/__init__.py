"""Benchmarks of quality.md, run by hand with ``python -m bench [NAME ...] [--quick]``.

Never part of the test run (``tests/test_bench.py`` only smoke-runs them at a tiny size).

Adding a benchmark: write ``bench/<name>.py`` defining

* ``SUMMARY``: one line saying what it measures and against which baseline, and
* ``main(argv: list[str] | None = None) -> int``: parse the common options with
  :func:`bench._common.parse_args`, run, and print exactly one JSON line with
  :func:`bench._common.emit` (everything else goes to stderr),

then add its name to :data:`BENCHMARKS`.  The runner starts every benchmark as its own
``python -m bench.<name>`` process, so one benchmark's threads, open files and peak memory never
colour the next one's figures.
"""

from __future__ import annotations

BENCHMARKS: tuple[str, ...] = (
    "recorder_append",
    "store_cas",
    "replay",
    "pickup",
    "overhead",
    "parse",
)
"""Registered benchmarks in the order ``python -m bench`` runs them; each is ``bench.<name>``."""

__all__ = ["BENCHMARKS"]

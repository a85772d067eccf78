"""Torn and corrupted files: readers say exactly where, writers repair only torn tails."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess


def _run_once(daemon: DaemonProcess, text: str) -> str:
    rid = daemon.submit({"driver": "script", "prompt": "x", "config": {"steps": [{"text": text}] * 5}})
    assert daemon.verdict(rid)["ok"]
    return rid


@pytest.mark.parametrize("seed", range(6))
def test_truncated_or_corrupted_audit_logs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    daemon = DaemonProcess(tmp_path / "home").start()
    rid = _run_once(daemon, "hello")
    assert daemon.stop() == 0
    log = daemon.home.events / f"{rid}.jsonl"
    data = log.read_bytes()
    lines = data.count(b"\n")
    if seed % 2 == 0:
        cut = rng.randrange(1, len(data) - 1)
        log.write_bytes(data[:cut])
        torn_line = data[:cut].count(b"\n") + 1
        ends_clean = data[:cut].endswith(b"\n")
        verify = subprocess.run([sys.executable, "-m", "adaptor", "verify-log", str(log)], capture_output=True, text=True)
        if ends_clean:
            assert verify.returncode == 0
        else:
            assert verify.returncode == 70
            assert f"line {torn_line}" in verify.stderr
            repaired = subprocess.run(
                [sys.executable, "-m", "adaptor", "verify-log", "--repair", str(log)], capture_output=True, text=True
            )
            assert repaired.returncode == 0, repaired.stderr
            assert sr.verify(log) == torn_line - 1
    else:
        target = rng.randrange(1, lines)  # never the last line: corruption, not a torn write
        offsets = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]
        start = offsets[target - 1]
        position = start + rng.randrange(5, offsets[target] - start - 2)
        corrupted = bytearray(data)
        corrupted[position] = ord("#") if corrupted[position] != ord("#") else ord("%")
        log.write_bytes(bytes(corrupted))
        with pytest.raises(sr.JSONLEventLogCorruptError) as info:
            sr.verify(log)
        assert info.value.line == target
        with pytest.raises(sr.JSONLEventLogCorruptError):
            sr.repair(log)
        assert log.read_bytes() == bytes(corrupted)  # corruption before the tail is never cut

    # the daemon keeps serving on the same home
    again = DaemonProcess(tmp_path / "home").start()
    _run_once(again, "still working")
    assert again.stop() == 0

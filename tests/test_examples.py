"""Every example in examples/ runs and prints what its docs promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_runs_end_to_end() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert "tool: Bash" in lines
    assert "approval: permission -> approved" in lines
    assert any(line.startswith("review: approve with 0 issues (run_") for line in lines)
    assert "failed: agent_error: tests broke" in lines

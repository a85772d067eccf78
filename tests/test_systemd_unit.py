"""The shipped systemd unit matches what adaptord does."""

from __future__ import annotations

import configparser
from pathlib import Path

from adaptord.daemon import _STOP_TAIL

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "adaptord.service"


def test_unit_is_a_notify_service_that_outlives_the_grace_period() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(UNIT)
    service = parser["Service"]
    assert service["Type"] == "notify"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    exec_start = service["ExecStart"].split()
    assert exec_start[0].endswith("/adaptord") and exec_start[1] == "serve"
    grace = float(exec_start[exec_start.index("--grace") + 1])
    # systemd SIGKILLs a drain that overruns TimeoutStopSec, before its verdicts are written.
    assert float(service["TimeoutStopSec"]) > grace + _STOP_TAIL
    assert "69" in service["RestartPreventExitStatus"].split()
    assert parser["Install"]["WantedBy"] == "default.target"

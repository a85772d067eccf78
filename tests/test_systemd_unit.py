"""The shipped systemd unit matches what adaptord does."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
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
    # A hung main loop is restarted; a busy one (a slow fsync) is not taken for hung.
    assert float(service["WatchdogSec"]) >= 120
    assert parser["Install"]["WantedBy"] == "default.target"


def test_the_unit_does_not_restart_a_daemon_that_cannot_start_as_configured(tmp_path: Path) -> None:
    # A config typo (exit 2) was restarted every RestartSec, slower than systemd's start
    # limit notices: the same error in the journal every few seconds, forever.  Like a second
    # instance (69), it needs a person before another start can help.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(UNIT)
    prevented = parser["Service"]["RestartPreventExitStatus"].split()
    config = tmp_path / "config.toml"
    config.write_text("workerz = 2\n")
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir(mode=0o777)
    unsafe.chmod(0o777)
    for args in (["--config", str(config), "--home", str(tmp_path / "home")], ["--home", str(unsafe)]):
        done = subprocess.run(
            [sys.executable, "-m", "adaptord", "serve", *args], capture_output=True, text=True, timeout=60,
            env={**os.environ, "ADAPTORD_HOME": ""},
        )
        assert str(done.returncode) in prevented, (done.returncode, done.stderr)


def _readme_install_commands() -> str:
    """The README's systemd block up to its first systemctl command (which needs a session)."""
    readme = (UNIT.parent.parent / "README.md").read_text()
    block = readme.split("### systemd", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return block.split("systemctl", 1)[0]


def test_the_readme_installs_a_unit_that_starts_the_installed_adaptord(tmp_path: Path) -> None:
    # As written, the README's `cp` failed on a fresh account (no ~/.config/systemd/user) and
    # the unit's ExecStart named ~/.local/bin/adaptord, which a venv install does not make.
    adaptord = shutil.which("adaptord")
    assert adaptord is not None
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _readme_install_commands()],
        cwd=UNIT.parent.parent, env={**os.environ, "HOME": str(tmp_path)}, check=True, timeout=60,
    )
    installed = tmp_path / ".config" / "systemd" / "user" / "adaptord.service"
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment, method-assign]
    parser.read(installed)
    program = parser["Service"]["ExecStart"].split()[0]
    assert os.path.samefile(program, adaptord) and os.access(program, os.X_OK)
    # The user manager's PATH holds only the system's folders: the agent CLIs the shell finds
    # (claude in ~/.local/bin, an nvm folder) were "not found on PATH" in every run, exit 69.
    assert parser["Service"]["Environment"] == f'"PATH={os.environ["PATH"]}"'
    if shutil.which("systemd-analyze") is not None:
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(installed)], capture_output=True, text=True, timeout=60
        )
        assert verify.returncode == 0, verify.stderr
    # Run where adaptord is not on PATH (its venv not active), the recipe wrote a unit whose
    # ExecStart was " serve --grace 30": it stops instead, and writes nothing.
    installed.unlink()
    without = subprocess.run(
        ["bash", "-c", _readme_install_commands()], cwd=UNIT.parent.parent, capture_output=True, text=True,
        env={**os.environ, "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60,
    )
    assert without.returncode != 0 and "adaptord is not on PATH" in without.stderr
    assert not installed.exists()

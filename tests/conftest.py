"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_harness import DaemonProcess


@pytest.fixture(autouse=True, scope="session")
def _no_daemon_outlives_the_session() -> Iterator[None]:
    """Daemons of failed tests (or of module-scoped fixtures) never outlive the test run."""
    yield
    while DaemonProcess.started:
        DaemonProcess.started.pop().kill_if_running()

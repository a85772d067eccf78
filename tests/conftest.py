"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_harness import DaemonProcess


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test() -> Iterator[None]:
    yield
    while DaemonProcess.started:
        DaemonProcess.started.pop().kill_if_running()

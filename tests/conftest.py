"""Suite-wide fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.daemon_harness import DaemonProcess


@pytest.fixture(autouse=True, scope="session")
def _no_home_from_the_shell() -> Iterator[None]:
    """A developer's ADAPTORD_HOME would take precedence over every test's ``--home``."""
    saved = os.environ.pop("ADAPTORD_HOME", None)
    yield
    if saved is not None:
        os.environ["ADAPTORD_HOME"] = saved


@pytest.fixture(autouse=True, scope="session")
def _no_daemon_outlives_the_session() -> Iterator[None]:
    """Daemons of failed tests (or of module-scoped fixtures) never outlive the test run."""
    yield
    while DaemonProcess.started:
        DaemonProcess.started.pop().kill_if_running()

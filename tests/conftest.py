"""Suite-wide fixtures."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.daemon_harness import DaemonProcess


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_reaches_the_tests() -> Iterator[None]:
    """The Ctrl-C tests need SIGINT's default: a shell starts a background job (`.ci/run &`)
    with SIGINT ignored, which every child inherits.  A handler here is reset to the default
    in each program the tests start, so they get Python's KeyboardInterrupt too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


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

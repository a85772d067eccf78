"""Suite-wide fixtures."""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

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
def _files_private_to_their_writer() -> Iterator[None]:
    """The config files the tests write must not be group-writable (the daemon refuses such
    a file), whatever umask the developer's shell has (002 under user private groups)."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


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


# --- parallel runs (pytest-xdist) ---------------------------------------------------------------
#
# A test marked ``alone`` takes a resource all of this user's processes share (every inotify
# instance), so no other test may run meanwhile: each test holds a shared flock for its whole
# protocol (module fixtures set up and torn down with it), an ``alone`` test an exclusive one.
# The exclusive taker first holds a turnstile that every shared taker passes through, so a busy
# worker cannot keep re-taking its shared lock before the waiting one gets its turn.

_MOST_WORKERS = 4  # more concurrent daemons than this make the suite slower, not faster


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own setting, said explicitly, wins
    if config.getoption("capture") == "no":
        return 0  # -s: what tests print reaches the terminal only from this process
    return max(1, min(_MOST_WORKERS, len(os.sched_getaffinity(0))))


def _run_lock_paths(config: pytest.Config) -> tuple[Path, Path] | None:
    if not hasattr(config, "workerinput"):
        return None  # one process runs every test: nothing to share
    # A worker's temporary folder is a folder of the run's own, which pytest cleans up later.
    shared = Path(config.option.basetemp).parent
    return shared / "tests.turnstile", shared / "tests.lock"


_held: dict[str, int] = {}


def _descriptor(path: Path) -> int:
    fd = _held.get(str(path))
    if fd is None:
        fd = _held[str(path)] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return fd


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    paths = _run_lock_paths(item.config)
    if paths is None:
        return (yield)
    turnstile, lock = (_descriptor(path) for path in paths)
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)

"""Blocking waits that a signal can still end on the main thread.

CPython runs a Python signal handler (``KeyboardInterrupt`` for Ctrl-C, ``adaptor run``'s
SIGTERM handler) only when the main thread executes bytecode.  A signal the kernel hands to
another thread, or one that arrives in the instant before the main thread blocks, sets a flag
and wakes nobody: a main thread waiting without a timeout for a run's next event sleeps
through it until that event comes, which for an agent that is thinking (or hung) may be never.
So on the main thread every wait here lasts at most :data:`_SLICE`, and a pending handler runs
between two of them.  Other threads wait as asked: no signal handler can run on them.
"""

from __future__ import annotations

import threading
import time
from typing import Final

_SLICE: Final = 0.1


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def wait_condition(condition: threading.Condition) -> None:
    """One ``condition.wait()`` (the caller holds it and re-checks its predicate after)."""
    condition.wait(_SLICE if _on_main_thread() else None)


def wait_event(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)``, in slices on the main thread."""
    if not _on_main_thread():
        return event.wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is None:
            step = _SLICE
        else:
            step = min(_SLICE, deadline - time.monotonic())
            if step <= 0:
                return event.is_set()
        if event.wait(step):
            return True

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

import numbers
import threading
import time
from typing import Final

_SLICE: Final = 0.1


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def wait_condition(condition: threading.Condition, timeout: float | None = None) -> None:
    """One ``condition.wait(timeout)``, at most a slice on the main thread (the caller holds
    it and re-checks its predicate, and its deadline, after)."""
    if _on_main_thread():
        timeout = _SLICE if timeout is None else min(timeout, _SLICE)
    condition.wait(timeout)


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


def seconds(name: str, value: object) -> float | None:
    """``value`` as the seconds (or ``None``) an argument called ``name`` takes.

    A string from a config file, a ``bool`` or an object is a :class:`TypeError` naming the
    argument (not ``'<' not supported ...`` from deep inside, after something started); NaN,
    which compares false with everything and so would mean "no limit", a :class:`ValueError`.
    The type only is named: a misplaced value may be a secret.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, not {type(value).__name__}")
    if value != value:
        raise ValueError(f"{name} must be a number of seconds or None, not nan")
    return value if isinstance(value, int | float) else float(value)  # (numpy, Fraction)

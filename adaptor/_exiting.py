"""The program's exit, as the runs still going see it.

The SDK's exit handler (``adaptor._run``) cancels every run still going and waits for them to
stop; the process runner (``adaptor.drivers._process``) shortens its agents' grace once the exit
has begun, and ends it at once when that wait was cut short (a second Ctrl-C, a SIGTERM
handler's ``sys.exit``).  Both read the exit's state here, neither knowing the other.
"""

from __future__ import annotations

import time

began: float | None = None
"""``time.monotonic()`` when the interpreter began its exit (None: it has not)."""

cut_short = False
"""Whether the exit's wait for the runs was cut short: their agents are to be killed now."""


def begin() -> None:
    global began
    began = time.monotonic()


def cut_the_wait_short() -> None:
    global cut_short
    cut_short = True

"""The ``adaptor`` command's entry point, and the early signal handling both commands share:
Ctrl-C, SIGTERM and SIGHUP are taken before the CLI is imported.

Importing it (click, the spool client) takes about 0.1 s, during which a Ctrl-C printed a
``KeyboardInterrupt`` traceback from deep inside an import, and SIGTERM or SIGHUP ended the
process without its ``--json`` object.  Noted here, they end the command as they would a
moment later: exit 130 (or 128 + the signal's number), with the object under ``--json``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

_early: list[int] = []
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_Handler = Callable[[int, Any], Any] | int | None


def _note(signum: int, frame: object) -> None:
    _early.append(signum)


def note_signals(*, even_ignored: bool = False) -> dict[int, _Handler]:
    """Note SIGINT, SIGTERM and SIGHUP from now on (see :func:`take_noted`); the handlers they
    had.  A signal the parent left ignored (nohup, a script's ``&`` for SIGINT) stays ignored,
    as the commands themselves leave it, unless ``even_ignored`` (``adaptord serve``, which
    acts on every one of them)."""
    return {
        sig: signal.signal(sig, _note)
        for sig in _SIGNALS
        if even_ignored or signal.getsignal(sig) is not signal.SIG_IGN
    }


def restore(handlers: dict[int, _Handler]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def take_noted() -> list[int]:
    """The signals noted so far, oldest first (and forget them)."""
    noted, _early[:] = list(_early), []
    return noted


def main() -> None:
    previous = note_signals()
    from adaptor import _cli_common, cli

    restore(previous)
    noted = take_noted()
    if noted:
        # Nothing began: stopped as the command would have been, had it started.
        _cli_common.guard_stdout()
        _cli_common.guard_stderr()
        first = noted[0]
        cause = KeyboardInterrupt() if first == signal.SIGINT else _cli_common.StopSignal(first)
        _cli_common.interrupted("--json" in sys.argv[1:], cause, cancelled=False)
    cli.main()

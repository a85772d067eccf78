"""The ``adaptor`` command's entry point: takes Ctrl-C, SIGTERM and SIGHUP before the CLI is
imported.

Importing it (click, the spool client) takes about 0.1 s, during which a Ctrl-C printed a
``KeyboardInterrupt`` traceback from deep inside an import, and SIGTERM or SIGHUP ended the
process without its ``--json`` object.  Noted here, they end the command as they would a
moment later: exit 130 (or 128 + the signal's number), with the object under ``--json``.
"""

from __future__ import annotations

import signal
import sys

_early: list[int] = []
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _note(signum: int, frame: object) -> None:
    _early.append(signum)


def main() -> None:
    # A signal the parent left ignored (nohup, a script's `&` for SIGINT) stays ignored, as
    # the commands themselves leave it.
    previous = {
        sig: signal.signal(sig, _note) for sig in _SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN
    }
    from adaptor import _cli_common, cli

    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if _early:
        # Nothing began: stopped as the command would have been, had it started.
        _cli_common.guard_stdout()
        _cli_common.guard_stderr()
        first = _early[0]
        cause = KeyboardInterrupt() if first == signal.SIGINT else _cli_common.StopSignal(first)
        _cli_common.interrupted("--json" in sys.argv[1:], cause, cancelled=False)
    cli.main()

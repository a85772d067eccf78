"""The ``adaptord`` command's entry point: takes the stop and reload signals of ``serve`` before
anything else is imported.

Importing the daemon (click, the SDK, the config, host tools) takes a few hundred milliseconds,
during which SIGTERM or SIGHUP kept their default action and ended the process without a word
(exit 143 or 129, which a supervisor reads as a crash).  Taken this early, they are noted and
acted on by :meth:`adaptord.daemon.Daemon.serve` once it owns them.  The other commands end at
once with 128 + the signal's number once imported, as they would a moment later.
"""

from __future__ import annotations

import sys

from adaptor import _entry as _early_signals


def take_early_signals() -> list[int]:
    """The signals noted before the daemon took them over, oldest first (and forget them)."""
    return _early_signals.take_noted()


def main() -> None:
    serving = sys.argv[1:2] == ["serve"]
    # serve acts on every one of them once serving; check and status leave a signal the parent
    # ignored (nohup, a script's `&` for SIGINT) ignored.
    previous = _early_signals.note_signals(even_ignored=serving)
    from adaptord.cli import main as cli_main

    if not serving:
        # check, status: nothing began yet, so a signal noted ends them as Ctrl-C would a
        # moment later (exit 130, or 128 + its number), without an import's traceback.
        _early_signals.restore(previous)
        noted = _early_signals.take_noted()
        if noted:
            sys.exit(128 + noted[0])
    cli_main()

"""An agent leaving a process that hops: in a session of its own, deaf to SIGTERM and SIGHUP,
it forks a copy of itself and exits, every ``HOPPER_EVERY`` seconds (``HOPPER_WIDTH`` of them,
each in a session of its own), for ``HOPPER_LIFE`` seconds at most, touching the file
``HOPPER_BEAT`` at each hop (a look at /proc may miss a process that lives milliseconds: the
file's time says whether any still hops).  Prints ``started`` once it hops, then exits: the
run is over, its process is not."""

from __future__ import annotations

import os
import signal
import time


def _hop(ends: float, every: float, beat: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.setsid()
    while time.monotonic() < ends:
        time.sleep(every)
        os.utime(beat)
        if os.fork() != 0:
            os._exit(0)  # the copy goes on
    os._exit(0)


def main() -> None:
    ends = time.monotonic() + float(os.environ.get("HOPPER_LIFE", "60"))
    width = int(os.environ.get("HOPPER_WIDTH", "1"))
    beat = os.environ["HOPPER_BEAT"]
    every = float(os.environ.get("HOPPER_EVERY", "0.02"))
    open(beat, "w").close()
    for _ in range(width):
        if os.fork() == 0:
            os.closerange(0, 3)
            _hop(ends, every, beat)
    time.sleep(0.2)
    print("started", flush=True)


if __name__ == "__main__":
    main()

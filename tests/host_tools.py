"""Host-defined tools the tests serve through the tool gateway.

Importable by a daemon's config file (``[tools] add = "tests.host_tools:add"``) as well as by
in-process tests, so both paths run the very same handler.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from adaptor import tool

REJECTION = "only non-negative numbers, please"


@dataclass
class Add:
    a: int
    b: int


@dataclass
class Sum:
    total: int


def _add(args: Add) -> Sum:
    if args.a < 0 or args.b < 0:
        raise tool.reject("negative", REJECTION)
    return Sum(args.a + args.b)


add = tool.define(
    "add", "Add two non-negative integers", _add, input=Add, output=Sum, revision="1",
    read_only=True, idempotent=True,
)

# A definition that cannot form a tool (no description): a run selecting it is refused with
# InvalidDefinitionError before the driver starts.
undescribed = tool.define("undescribed", "", lambda value: "never runs")


def _explode(args: Add) -> Sum:
    raise RuntimeError("kaboom\nsecond line")


# A handler that raises: the model is told the tool failed; the host's log says so, one line.
explodes = tool.define("explodes", "Always fails", _explode, input=Add, output=Sum, revision="1")


def _linger(args: Add) -> Sum:
    # A handler that leaves work behind: an ordinary (non-daemon) thread, as a poller is.
    threading.Thread(target=time.sleep, args=(300,), name="left-by-a-handler", daemon=False).start()
    return Sum(args.a + args.b)


lingers = tool.define("lingers", "Adds, and leaves a thread running", _linger, input=Add, output=Sum, revision="1")

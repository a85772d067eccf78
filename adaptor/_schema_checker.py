"""Validation of output against a schema, in child processes with a time limit.

Judging an output can take unbounded time, and in process nothing could stop it:

* Python's ``re`` holds the GIL for a whole match, and a ``pattern`` that backtracks
  catastrophically (``^(\\w+\\s?)+$`` against forty word characters and a ``!``) runs for
  hours.  Every thread of the process stops with it: in the daemon, every run, timer, cancel
  and the watcher.
* Subschemas reached by ``$ref`` from several places apply again and again to the same value:
  a chain of twenty ``anyOf`` levels that each refer twice to the next costs 2**20 checks, in
  a schema of a few hundred bytes.  ``uniqueItems`` compares objects pairwise: 20,000 of them
  are 200 million comparisons.  Such a check keeps its thread past any deadline.

So every check runs in a child process, which is killed when the check overruns.  Children are
kept and reused, because starting one costs about 0.2 s of imports (:func:`warm` starts one
ahead of need).  A child serves one check at a time; a check that overruns kills its child.  A
child that cannot be started or fails is reported as :class:`Unavailable`, and the caller
validates in process.

:func:`costly` tells the schemas that can take that long from those that cannot; a caller that
checks often (host tools, once per call) validates the latter in process and spares the IPC.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, BinaryIO, Literal

import orjson

from adaptor import _cpus, _procfs

__all__ = ["CheckTimeout", "Judge", "Unavailable", "costly", "errors_of", "warm"]

#: Who describes the errors: ``"schema"`` as :mod:`adaptor.schema` does (every error, with its
#: message); ``"tool_input"`` and ``"tool_output"`` as :mod:`adaptor.tool` does (at most one,
#: safe for the model or for the logs).
Judge = Literal["schema", "tool_input", "tool_output"]
_JUDGES: dict[str, tuple[str, str]] = {
    "schema": ("adaptor.schema", "_errors_in_process"),
    "tool_input": ("adaptor.tool", "_input_problems"),
    "tool_output": ("adaptor.tool", "_output_problems"),
}

_HEADER = struct.Struct("!I")
_KEEP_IDLE = 4  # children kept for reuse; more concurrent checks start more, then close them
_ALARM_MARGIN = 1.0  # a child's own limit: the parent's, plus this
# How long a new child may take to start (interpreter, imports) before it says it is ready.
# Not part of a check's limit: on a busy machine a start can take seconds, and a valid output
# must not be declared too costly to check because its checker was slow to start.
_START_LIMIT = 60.0
# A check whose child got less CPU time than its limit meanwhile waits on, up to this many times
# the limit (or the caller's own deadline), looking again at least this often.
_STARVED_FOR = 10
_STARVED_POLL = 0.5


class CheckTimeout(Exception):
    """The check did not finish in time; its child was killed."""


class Unavailable(Exception):
    """No child could do the check (it could not start, crashed or reported a failure)."""


class _Gone(Unavailable):
    """The child ended before answering."""


def errors_of(
    schema: dict[str, Any], instance: Any, timeout: float, *, judge: Judge = "schema",
    wall_limit: float | None = None,
) -> list[str]:
    """The validation errors of ``instance``, described as ``judge`` says.

    Raises :class:`CheckTimeout` after ``timeout`` seconds of checking, :class:`Unavailable`
    when no child could answer.  A child that got less than that much CPU time meanwhile (a
    starved machine) is given more, up to ``wall_limit`` seconds in all (the caller's own
    deadline; ``None``: :data:`_STARVED_FOR` times ``timeout``).
    """
    if timeout <= 0:
        raise CheckTimeout()  # (no time left: a child would only be killed)
    try:
        payload = orjson.dumps(
            {"schema": schema, "instance": instance, "limit": timeout, "judge": judge}
        )
    except TypeError as exc:  # (orjson refuses integers beyond 64 bits)
        raise Unavailable(str(exc)) from exc
    child, kept = _take()
    while True:
        try:
            reply = child.ask(payload, timeout, wall_limit)
            break
        except BaseException as exc:
            child.kill()
            if not (kept and isinstance(exc, _Gone)):
                raise
        # A kept child can have died while idle (the OOM killer, a stray signal): start anew.
        child, kept = _Child(), False
    _give_back(child)
    if "errors" not in reply:
        raise Unavailable(str(reply.get("failure", "no answer")))
    found: list[str] = reply["errors"]
    return found


# Keywords whose check can take unbounded time: Python's ``re`` behind the first two, pairwise
# comparison behind ``uniqueItems``, and references, which can apply one subschema to one value
# again and again.  ``format`` is not among them: the validators check no formats (annotation
# only), so no format regex ever runs.
_COSTLY_KEYWORDS = frozenset({"pattern", "patternProperties", "uniqueItems", "$ref", "$dynamicRef"})
# Keywords whose value is not a schema, nor a map or list of schemas: never searched.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required", "type"})
# Keywords whose value maps names (any text, "pattern" included) to schemas.
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})


def costly(schema: Any) -> bool:
    """Whether checking a value against ``schema`` could take unbounded time (see above).

    Without those keywords the cost is bounded by the schema's size times the value's.
    """
    return any(_COSTLY_KEYWORDS.intersection(node) for node in subschemas(schema))


def subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every subschema of ``schema`` (itself included), wherever it sits."""
    # Unknown keywords are searched as if they held schemas: a false alarm costs only IPC.
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            yield node
            for keyword, value in node.items():
                if keyword in _NAMED_SCHEMAS and isinstance(value, dict):
                    stack.extend(value.values())
                elif keyword not in _DATA_KEYWORDS:
                    stack.append(value)


# The folder holding the adaptor package this process runs (a site-packages, a checkout).
_IMPORTED_FROM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child_environment() -> dict[str, str] | None:
    """``None`` (this process's environment) when the checker's own path finds this adaptor
    (installed, or on ``PYTHONPATH``); else this environment with the folder it came from
    (a checkout, an editable install) first on ``PYTHONPATH``, which ``-m`` found only when it
    was the current directory.  Never a site-packages folder: ahead of the standard library,
    a stale backport there (``typing.py``) would shadow it."""
    import site

    given = os.environ.get("PYTHONPATH", "")
    found_anyway = [*site.getsitepackages(), site.getusersitepackages(), *given.split(os.pathsep)]
    if os.path.realpath(_IMPORTED_FROM) in {os.path.realpath(p) for p in found_anyway if p}:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_IMPORTED_FROM, given]))}


class _Child:
    def __init__(self) -> None:
        if getattr(sys, "frozen", False) or not sys.executable:
            # A frozen application's executable is the application itself, not a Python that
            # would run ``-m``: starting it would start another copy of the program.
            raise Unavailable("no Python interpreter to start a schema checker with")
        try:
            with _cpus.for_children():
                self.process = subprocess.Popen(
                    # -P: "-m" would put the current directory first on the child's path, and
                    # that is often an agent's workspace, an untrusted repository whose
                    # orjson.py (or adaptor/) the checker would have imported and run.  The
                    # folder this adaptor was imported from is added where needed.
                    [sys.executable, "-P", "-m", "adaptor._schema_checker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=_child_environment(),
                )
        except OSError as exc:
            raise Unavailable(f"cannot start a schema checker: {exc}") from exc
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout = self.process.stdout.fileno()
        self._ready = False

    def wait_ready(self) -> None:
        """Wait for the child's ready frame (an empty one, sent once its imports are done)."""
        if self._ready:
            return
        try:
            frame = self._read(_HEADER.size, time.monotonic() + _START_LIMIT)
        except CheckTimeout:
            raise Unavailable(f"the schema checker did not start within {_START_LIMIT:g}s") from None
        if _HEADER.unpack(frame) != (0,):
            raise _Gone("schema checker sent something else than its ready frame")
        self._ready = True

    def ask(self, payload: bytes, timeout: float, wall_limit: float | None = None) -> dict[str, Any]:
        self.wait_ready()  # the check's time starts once the child can check
        checked_before = _procfs.cpu_seconds(self.process.pid)
        try:
            self._stdin.write(_HEADER.pack(len(payload)) + payload)
            self._stdin.flush()
        except OSError as exc:
            raise _Gone(f"schema checker gone: {exc}") from exc
        now = time.monotonic()
        deadline = now + timeout
        stop = now + (timeout * _STARVED_FOR if wall_limit is None else max(wall_limit, timeout))

        def starved() -> float | None:
            # The limit is checking time: on a machine too busy to let the child run (a nice 19
            # daemon beside busy loops), a valid output was declared too costly to check.
            checked = _procfs.cpu_seconds(self.process.pid)
            now = time.monotonic()
            if checked is None or checked_before is None or now >= stop:
                return None
            owed = timeout - (checked - checked_before)
            return None if owed <= 0 else min(now + max(owed, _STARVED_POLL), stop)

        header = self._read(_HEADER.size, deadline, starved)
        (size,) = _HEADER.unpack(header)
        reply: dict[str, Any] = orjson.loads(self._read(size, deadline, starved))
        return reply

    def _read(self, size: int, deadline: float, extend: Callable[[], float | None] | None = None) -> bytes:
        """``size`` bytes of the child's answer by ``deadline``, which ``extend`` (asked when it
        passes) may move on; :class:`CheckTimeout` when it passes for good."""
        chunks: list[bytes] = []
        missing = size
        # poll, not select: a busy process's descriptors can number beyond select's 1024.
        poller = select.poll()
        poller.register(self._stdout, select.POLLIN)
        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
                later = None if extend is None else extend()
                if later is None:
                    raise CheckTimeout()
                deadline = later
                continue
            chunk = os.read(self._stdout, min(missing, 1 << 20))
            if not chunk:
                raise _Gone("schema checker ended without an answer")
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        self.close()

    def close(self) -> None:
        """Let the child end (end of input) and reap it."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


_idle: list[_Child] = []
_warming = False
_guard = threading.Lock()
# Notified when a warming child is ready (or failed to start).
_warmed = threading.Condition(_guard)


def _take() -> tuple[_Child, bool]:
    """A child for one check, and whether it was kept from an earlier one.

    One still starting (see :func:`warm`) is waited for rather than started twice: the check
    would wait as long for a child of its own.
    """
    with _guard:
        _warmed.wait_for(lambda: _idle or not _warming, _START_LIMIT)
        if _idle:
            return _idle.pop(), True
    return _Child(), False


def warm() -> None:
    """Start a child in the background unless one is idle or starting, so a check soon after
    (a structured run's, once its agent answers) need not wait for one to start."""
    global _warming
    with _guard:
        if _idle or _warming:
            return
        _warming = True
    try:
        threading.Thread(target=_start_one, name="adaptor-schema-checker-start", daemon=True).start()
    except RuntimeError:  # no thread to spare (a task limit): a check starts its own child
        with _guard:
            _warming = False


def _start_one() -> None:
    global _warming
    child: _Child | None = None
    try:
        child = _Child()
        child.wait_ready()
    except Unavailable:
        if child is not None:
            child.kill()
            child = None
        # the check itself will try again, then validate in process
    finally:
        with _guard:
            _warming = False
            if child is not None and len(_idle) < _KEEP_IDLE:
                _idle.append(child)
                child = None
            _warmed.notify_all()
    if child is not None:
        child.close()


def _give_back(child: _Child) -> None:
    with _guard:
        if len(_idle) < _KEEP_IDLE:
            _idle.append(child)
            return
    child.close()


def _close_idle() -> None:
    with _guard:
        children = list(_idle)
        _idle.clear()
    for child in children:
        child.close()


def _forget_in_child() -> None:
    # A forked process shares the parent's pipes to these children; it must not use them.
    global _guard, _warmed, _warming
    _guard = threading.Lock()
    _warmed = threading.Condition(_guard)
    _idle.clear()
    _warming = False


os.register_at_fork(after_in_child=_forget_in_child)
# The kept children end by themselves when this process's end closes their input; reaping
# them first keeps interpreter shutdown free of "subprocess still running" warnings.
atexit.register(_close_idle)


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The child: answer checks until the parent closes our input."""
    import importlib

    # Ctrl-C in a terminal reaches the whole process group; the parent decides what ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A check never looks at its input again, so a parent that died mid-check (kill -9) would
    # leave this child checking for hours.  The kernel's profiling timer ends it (SIGPROF's
    # default action) once it has used a little more CPU time than the parent allows, whatever
    # the check is doing; CPU time, as the parent counts it (a starved child is waited for).
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    # The judges' modules (jsonschema with them) are imported before the ready frame: a check's
    # limit then counts checking only.
    for module, _ in _JUDGES.values():
        importlib.import_module(module)
    replies.write(_HEADER.pack(0))
    replies.flush()
    validators: dict[bytes, Any] = {}
    while True:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        request = orjson.loads(requests.read(size))
        key = orjson.dumps(request["schema"])
        signal.setitimer(signal.ITIMER_PROF, request["limit"] + _ALARM_MARGIN)
        try:
            module, name = _JUDGES[request.get("judge", "schema")]
            judge = getattr(importlib.import_module(module), name)
            # Every judge validates with adaptor.schema's validator: one cache serves them all.
            found, validators[key] = judge(
                request["schema"], request["instance"], validators.get(key)
            )
            reply: dict[str, Any] = {"errors": found}
        except Exception as exc:
            reply = {"failure": f"{type(exc).__name__}: {exc}"}
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        if len(validators) > 16:
            validators.clear()
        data = orjson.dumps(reply)
        replies.write(_HEADER.pack(len(data)) + data)
        replies.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)

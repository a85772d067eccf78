"""Stream and the event broker: sequencing, backpressure, ``Dropped`` reports.

One broker per run serializes every producer (driver, approvals, SDK notices).  Sequence
numbers are assigned in acceptance order and delivery order equals sequence order.  Content
deltas and raw process chunks may be dropped when the consumer falls behind; every other event
blocks its producer until there is room.  Lost events still consume sequence numbers and are
reported by a ``Dropped`` event.  After cancellation the final ``Dropped`` and ``RunFinished``
go through reserved slots that never wait for the consumer.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from adaptor import _waiting, errors
from adaptor.events import (
    Dropped,
    Event,
    EventMeta,
    RunFinished,
    event_kind,
    is_droppable,
    with_meta,
)

if TYPE_CHECKING:
    from adaptor.result import Result

__all__ = ["Stream"]

_STOP_WAIT = 10.0
_KILL_WAIT = 5.0  # for an agent killed at once to be gone (reaped, its pipes drained)


class _Loss:
    """Sequence numbers reserved for events that never reached the consumer."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.first = 0
        self.last = 0

    def add(self, kind: str, sequence: int) -> None:
        self.by_kind[kind] += 1
        self.first = self.first or sequence
        self.last = sequence

    def __bool__(self) -> bool:
        return bool(self.by_kind)


class Broker:
    """Orders, numbers and buffers the events of one run."""

    def __init__(self, run_id: str, thread_key: str, capacity: int, blocking: bool) -> None:
        self._run_id = run_id
        self._thread_key = thread_key
        self._capacity = max(1, capacity)
        self._blocking = blocking
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        # Held for a whole publish, waiting included: a later event can never overtake a
        # blocked earlier one, so delivery order stays sequence order.
        self._publish_lock = threading.Lock()
        self._sequence = 0
        self._loss = _Loss()
        self._cancelled = False
        self._finished = False
        # Threads with an iterator open on this run (a thread id per open iterator).
        self._readers: Counter[int] = Counter()
        # Set once result() found only its own thread's iterators open: they are not read
        # while it waits, so producers may go past the bound rather than wait for them.
        self._unbounded = False
        self.turn_id = ""

    # -- producers ---------------------------------------------------------------------------

    def publish(self, event: Event, *, deadline: float | None = None) -> bool:
        """Number and enqueue ``event``; False when it was dropped or could not be delivered.

        ``deadline`` (a ``time.monotonic()`` value) bounds how long a reliable event waits.
        """
        with self._publish_lock:
            with self._cond:
                if self._finished:
                    return False
                droppable = is_droppable(event) and not self._blocking
                if self._loss:
                    # The loss report goes first; it waits for room like any reliable event.
                    if not self._wait_for_room(deadline, droppable or self._cancelled):
                        return self._lose(event)
                    self._flush_loss("backpressure")
                numbered = self._number(event)
                if self._wait_for_room(deadline, droppable or self._cancelled):
                    self._append(numbered)
                    return True
                self._loss.add(event_kind(numbered), numbered.meta.sequence)
                return False

    def _lose(self, event: Event) -> bool:
        numbered = self._number(event)
        self._loss.add(event_kind(numbered), numbered.meta.sequence)
        return False

    def _wait_for_room(self, deadline: float | None, nowait: bool) -> bool:
        while len(self._queue) >= self._capacity and not self._unbounded:
            if nowait or self._cancelled:
                return False
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return False
            self._cond.wait(timeout)
        return True

    def _number(self, event: Event) -> Event:
        self._sequence += 1
        meta = EventMeta(
            run_id=self._run_id,
            thread_key=self._thread_key,
            sequence=self._sequence,
            time=datetime.now(UTC),
            turn_id=self.turn_id,
        )
        return with_meta(event, meta)

    def _flush_loss(self, reason: str) -> None:
        loss, self._loss = self._loss, _Loss()
        report = Dropped(
            count=sum(loss.by_kind.values()),
            by_kind=dict(loss.by_kind),
            first_sequence=loss.first,
            last_sequence=loss.last,
            reason=reason,
        )
        self._append(self._number(report))

    def _append(self, event: Event) -> None:
        self._queue.append(event)
        self._cond.notify_all()

    def cancel(self) -> None:
        """Release blocked producers; later events are delivered only if there is room."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def finish(self, make_terminal: Callable[[], RunFinished]) -> None:
        """Deliver the final ``Dropped`` (if any) and ``RunFinished`` through reserved slots."""
        with self._cond:
            cancelled = self._cancelled
        self.cancel()  # (releases producers still blocked on a full buffer)
        with self._publish_lock, self._cond:
            if self._finished:
                return
            terminal = make_terminal()
            if self._loss:
                # Events a run's end left unread were lost to that end (its deadline, a denied
                # approval...), which the final RunFinished names; not to a cancel() it never had.
                self._flush_loss((terminal.reason or "cancelled") if cancelled else "backpressure")
            self._append(self._number(terminal))
            self._finished = True

    # -- the consumer ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Event]:
        reader = threading.get_ident()
        with self._cond:
            self._readers[reader] += 1
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._finished:
                        _waiting.wait_condition(self._cond)
                    if not self._queue:
                        return
                    event = self._queue.popleft()
                    self._cond.notify_all()
                yield event
        finally:
            with self._cond:
                self._readers[reader] -= 1
                if not self._readers[reader]:
                    del self._readers[reader]
                self._cond.notify_all()

    def drain_unread(self) -> None:
        """Block until the run's last event is queued, then drop what nobody is reading.

        Events are dropped only while no iterator is open: those of a thread iterating
        meanwhile (or starting to before the run ends) stay its own.  An iterator this thread
        opened is not read while this thread waits here, but may be later, or from another
        thread (``asyncio.to_thread(next, it)`` hands it from worker to worker): its events
        are kept, and producers go past the buffer's bound rather than wedge on it.  A full
        buffer no iterator is open on is emptied at once, so producers never wedge on it.
        """
        me = threading.get_ident()
        with self._cond:
            while True:
                if not any(thread != me for thread in self._readers):
                    if me in self._readers:
                        if not self._unbounded:
                            self._unbounded = True
                            self._cond.notify_all()
                    elif self._finished or len(self._queue) >= self._capacity:
                        self._queue.clear()
                        self._cond.notify_all()
                if self._finished:
                    return
                _waiting.wait_condition(self._cond)

    @property
    def finished(self) -> bool:
        return self._finished


def _ended(message: str, details: Mapping[str, Any]) -> None:
    """What cancelling a run that has ended does."""


class Stream:
    """A live run: iterate its events, then read ``result()``.

    ``result()`` drains the events nobody reads (those of a thread iterating meanwhile are its
    own), blocks until the run ends and returns the same outcome (or raises the same error)
    on every call.  A consumer that stops iterating early must call ``cancel()``, or use the
    stream as a context manager, whose exit cancels a run still going.
    """

    def __init__(
        self,
        run_id: str,
        broker: Broker | None,
        cancel: Callable[[str, Mapping[str, Any]], None],
        stop_at_once: Callable[[], None] | None = None,
    ) -> None:
        self._run_id = run_id
        self._broker = broker
        self._cancel = cancel
        self._stop_at_once = stop_at_once
        self._done = threading.Event()
        self._result: Result | None = None
        self._error: BaseException | None = None
        self._error_traceback: TracebackType | None = None
        self._error_cause: BaseException | None = None

    @property
    def run_id(self) -> str:
        return self._run_id

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        if self._broker is None:
            return iter(())
        return iter(self._broker)

    def result(self) -> Result:
        if self._broker is not None:
            self._broker.drain_unread()
        _waiting.wait_event(self._done)
        if self._error is not None:
            # From the traceback it was settled with, so one error raised again and again
            # (a host polling result()) does not grow a longer traceback each time; and from
            # the cause it was settled with, so that raised inside an `except` block it does
            # not take that block's exception for its cause (raising sets __context__).
            raise self._error.with_traceback(self._error_traceback) from self._error_cause
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Abort the run (idempotent).  Buffered events stay readable."""
        self._cancel("", {})

    def _cancel_as(self, message: str, details: Mapping[str, Any]) -> None:
        """:meth:`cancel`, the run's ``RunCancelledError`` (and so its ``RunFinished``) saying
        ``message`` with ``details``: for a host cancelling for a reason of its own (the
        daemon's stop), which its audit log and its verdict then tell alike."""
        self._cancel(message, details)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Leaving a ``with agent.stream(...) as stream:`` block ends a run still going: it is
        cancelled and given :data:`_STOP_WAIT` seconds to stop (its agent process with it), so
        a consumer that breaks out of its loop or raises leaves nothing running."""
        self._stop_and_wait()

    def _stop_and_wait(self) -> None:
        """Cancel a run still going and wait up to :data:`_STOP_WAIT` seconds for it to end.

        Interrupted meanwhile (a second Ctrl-C), its agent is killed at once, without the rest
        of its grace period, and waited for a moment longer before the interruption goes on: a
        program exiting on it would otherwise leave the agent running.
        """
        if self._done.is_set():
            return
        self.cancel()  # (which also releases producers waiting on a full buffer)
        try:
            _waiting.wait_event(self._done, _STOP_WAIT)
        except BaseException:
            stop_at_once = self._stop_at_once  # (None once the run has ended meanwhile)
            if stop_at_once is not None:
                stop_at_once()
                with contextlib.suppress(BaseException):  # (a third one goes on at once)
                    _waiting.wait_event(self._done, _KILL_WAIT)
            raise

    def _settle(self, result: Result | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._error_traceback = None if error is None else error.__traceback__
        self._error_cause = None if error is None else errors._next_cause(error)
        self._done.set()
        # A cancel once the run has ended does nothing (the run looks first): letting go of the
        # run's own cancel breaks the cycle stream -> run -> stream, which kept every finished
        # run (its prompt, its options) until a full garbage collection, rare enough that a
        # daemon serving large prompts grew by hundreds of MB.
        self._cancel = _ended
        self._stop_at_once = None

    def _result_for_run(self) -> Result:
        """``result()`` as ``run()`` waits for it, the consumer nobody else can cancel for.

        Interrupted while waiting (Ctrl-C, or anything else raised in this thread), it cancels
        the run and gives it :data:`_STOP_WAIT` seconds to stop before the exception goes on:
        an interpreter exiting next would leave the agent's processes running.
        """
        try:
            return self.result()
        except BaseException:
            self._stop_and_wait()
            raise

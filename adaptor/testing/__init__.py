"""Helpers for testing pipelines and drivers without a real agent CLI.

- :class:`ScriptedDriver` — the ``script`` driver (``adaptor.drivers.script``) built from a list
  of steps, for ``adaptor.Agent(ScriptedDriver([...]))``;
- :class:`RecordingSink` — an ``EventSink`` for calling a driver directly in unit tests;
- :mod:`adaptor.testing.conformance` — the driver conformance suite.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from adaptor.driver import DecisionRequest, DecisionResponse, DecisionResult
from adaptor.driver._spi import check_emitted
from adaptor.drivers import script
from adaptor.events import Event
from adaptor.result import TranscriptItem

__all__ = [
    "Decider",
    "RecordingSink",
    "ScriptedDriver",
    "conformance",
    "decide_always",
    "default_decision",
]

Payload = Event | TranscriptItem
Decider = Callable[[DecisionRequest], DecisionResponse]


class ScriptedDriver(script.Driver):
    """``script.Driver(script.Config(steps=steps, descriptor=descriptor, session=session))``.

    A subclass rather than a factory function so that ``isinstance(d, script.Driver)`` holds
    and the steps read like the rest of a test::

        agent = adaptor.Agent(ScriptedDriver([{"text": "hello"}], session="auto"))
    """

    def __init__(
        self,
        steps: Iterable[Mapping[str, Any]] = (),
        descriptor: Mapping[str, Any] | None = None,
        *,
        session: str | None = None,
    ) -> None:
        super().__init__(script.Config(steps=tuple(steps), session=session, descriptor=descriptor))


def default_decision(request: DecisionRequest) -> DecisionResponse:
    """Approve ``permission``/``plan_review``; answer a ``question`` with its first choice."""
    if request.kind == "question":
        choice = request.choices[0].key if request.choices else ""
        return DecisionResponse(request_id=request.request_id, result="answered", choice=choice)
    return DecisionResponse(request_id=request.request_id, result="approved")


def decide_always(result: DecisionResult, *, choice: str = "", text: str = "") -> Decider:
    """A decider giving the same answer to every request, e.g. ``decide_always("aborted")``."""

    def decide(request: DecisionRequest) -> DecisionResponse:
        return DecisionResponse(
            request_id=request.request_id, result=result, choice=choice, text=text
        )

    return decide


class RecordingSink:
    """An ``EventSink`` that records everything a driver emits, in order.

    ``cancelled`` is a plain ``threading.Event``: set it (from any thread) to cancel the run.
    Decisions are answered by ``decide`` (default: :func:`default_decision`); requests without
    an id get ``decision_1``, ``decision_2``, ... (the SDK names its own
    ``<run_id>-dec-<n>``: a driver must not rely on the form).
    """

    def __init__(self, decide: Decider = default_decision) -> None:
        self.cancelled = threading.Event()
        self._decide = decide
        self._changed = threading.Condition()
        self._payloads: list[Payload] = []
        self._decisions: list[tuple[DecisionRequest, DecisionResponse]] = []
        self._asked = 0

    def emit(self, payload: Payload) -> None:
        check_emitted(payload)
        with self._changed:
            self._payloads.append(payload)
            self._changed.notify_all()

    def request_decision(self, request: DecisionRequest) -> DecisionResponse:
        with self._changed:
            self._asked += 1
            if not request.request_id:
                request = dataclasses.replace(request, request_id=f"decision_{self._asked}")
        # Outside the lock: a decider may block, e.g. waiting for the test thread.
        response = self._decide(request)
        with self._changed:
            self._decisions.append((request, response))
            self._changed.notify_all()
        return response

    @property
    def payloads(self) -> list[Payload]:
        """Every emitted event and transcript item, in emission order."""
        with self._changed:
            return list(self._payloads)

    @property
    def events(self) -> list[Event]:
        return [p for p in self.payloads if not isinstance(p, TranscriptItem)]

    @property
    def transcript(self) -> list[TranscriptItem]:
        return [p for p in self.payloads if isinstance(p, TranscriptItem)]

    @property
    def decisions(self) -> list[tuple[DecisionRequest, DecisionResponse]]:
        """Every decision asked for, with the answer given."""
        with self._changed:
            return list(self._decisions)

    def wait_for(
        self, predicate: Callable[[Sequence[Payload]], bool], timeout: float | None = 10.0
    ) -> bool:
        """Block until ``predicate(payloads)`` holds; ``False`` if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(tuple(self._payloads)), timeout)


# Imported last: the suite drives drivers through RecordingSink, defined above.
from adaptor.testing import conformance  # noqa: E402

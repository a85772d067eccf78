"""Approval requests: the exactly-once responder and the helper handlers.

Routing of a driver's decision request through the run policy lives in the run pipeline
(``adaptor._run``); this module owns what a request *is* and how a response is settled.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from adaptor import _waiting
from adaptor.errors import (
    ApprovalExpiredError,
    ApprovalKindMismatchError,
    ApprovalResolvedError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from adaptor.events import ApprovalRequest

__all__ = ["Outcome", "Responder", "approve_all", "deny_all"]


@dataclass(frozen=True)
class Outcome:
    """How a request was settled."""

    result: Literal["approved", "rejected", "answered", "timed_out", "aborted"]
    choice: str = ""
    text: str = ""
    resolved_at: datetime | None = None


class Responder:
    """The single live responder shared by every copy of one approval request.

    The first settle wins; later responses raise ``ApprovalResolvedError``, or
    ``ApprovalExpiredError`` when the SDK expired the request first or ``expires`` (a
    ``time.monotonic()`` instant) has passed: a response after the deadline never wins, even
    when nothing expired the request yet.  Nor does one after ``run_ends``, the run's own
    deadline, which ends the run however late its timer fires (the request is then
    ``aborted``, not timed out).  Methods never block.
    """

    def __init__(
        self,
        kind: str,
        choice_keys: tuple[str, ...],
        expires: float | None = None,
        run_ends: float | None = None,
    ) -> None:
        self._kind = kind
        self._choice_keys = choice_keys
        self._expires = expires
        self._run_ends = run_ends
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._outcome: Outcome | None = None
        self._expired = False

    # -- responses from the host -------------------------------------------------------------

    def approve(self, request: ApprovalRequest) -> None:
        if self._kind == "question":
            raise ApprovalKindMismatchError(
                f"approval {request.id!r} is a question: answer(option) or deny(reason) it"
            )
        self._settle(request, Outcome("approved"))

    def deny(self, request: ApprovalRequest, reason: str = "") -> None:
        _require_text(request, "deny(reason)", reason)
        self._settle(request, Outcome("rejected", text=reason))

    def answer(self, request: ApprovalRequest, option: str) -> None:
        if self._kind != "question":
            raise ApprovalKindMismatchError(
                f"approval {request.id!r} is a {self._kind} request: approve() or deny() it"
            )
        _require_text(request, "answer(option)", option)
        if not option:
            raise ValueError(f"approval {request.id!r}: an answer needs an option (deny it instead)")
        choice = option if option in self._choice_keys else ""
        self._settle(request, Outcome("answered", choice=choice, text=option))

    @property
    def expired(self) -> bool:
        """Whether the request expired (its deadline, the run's end or cancel) unanswered."""
        return self._expired

    @property
    def overdue(self) -> bool:
        """Whether the deadline has passed (responses from now on lose)."""
        return self._expires is not None and time.monotonic() >= self._expires

    def _settle(self, request: ApprovalRequest, outcome: Outcome) -> None:
        with self._lock:
            if self._outcome is None:
                ends = self._run_ends
                if ends is not None and time.monotonic() >= ends and (self._expires is None or ends <= self._expires):
                    self._expire_locked("aborted")
                elif self.overdue:
                    self._expire_locked("timed_out")
            if self._expired:
                raise ApprovalExpiredError(f"approval {request.id!r} expired before this response")
            if self._outcome is not None:
                raise ApprovalResolvedError(
                    f"approval {request.id!r} was already resolved ({self._outcome.result})"
                )
            self._outcome = Outcome(
                outcome.result, outcome.choice, outcome.text, datetime.now(UTC)
            )
            self._settled.set()

    # -- the SDK side ------------------------------------------------------------------------

    def expire(self, result: Literal["timed_out", "aborted"]) -> Outcome:
        """Expire the request unless a response already won; returns the winning outcome."""
        with self._lock:
            if self._outcome is None:
                self._expire_locked(result)
            assert self._outcome is not None
            return self._outcome

    def _expire_locked(self, result: Literal["timed_out", "aborted"]) -> None:
        self._expired = True
        self._outcome = Outcome(result, resolved_at=datetime.now(UTC))
        self._settled.set()

    def wait(self, timeout: float | None) -> Outcome | None:
        """Wait for a response; None when ``timeout`` passed first.

        The run pipeline expires every open request when the run is cancelled or ends, so
        waiting on the request alone also covers cancellation.
        """
        _waiting.wait_event(self._settled, timeout)
        return self._outcome

    @property
    def outcome(self) -> Outcome | None:
        return self._outcome


def _require_text(request: ApprovalRequest, what: str, value: object) -> None:
    # Checked before anything settles, so the request stays open for a proper response: the
    # value goes to the agent CLI, the resolved notice and ApprovalDeniedError.details as text.
    if not isinstance(value, str):
        raise TypeError(f"approval {request.id!r}: {what} takes a str, not a {type(value).__name__}")


def approve_all(request: ApprovalRequest) -> None:
    """An ``on_approval`` handler: approves permission and plan_review, denies questions."""
    if request.kind == "question":
        request.deny("questions cannot be auto-approved")
    else:
        request.approve()


def deny_all(reason: str = "denied by policy") -> Callable[[ApprovalRequest], None]:
    """An ``on_approval`` handler factory that denies every request with ``reason``."""
    # Checked here: taken as it came, it failed at the run's first approval instead.  (An
    # ApprovalRequest is on_approval=deny_all passed uncalled: the handler it returns makes
    # the run say so.)
    from adaptor.events import ApprovalRequest  # (events imports this module)

    if not isinstance(reason, str | ApprovalRequest):
        raise TypeError(f"deny_all takes a reason (str), not {type(reason).__name__}")

    def handler(request: ApprovalRequest) -> None:
        request.deny(reason)

    return handler

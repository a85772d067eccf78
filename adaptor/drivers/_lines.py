"""The one JSON-lines protocol helper every CLI driver's parser builds on.

Both CLIs print one JSON object per stdout line.  The rules shared by every parser (reference
§2.0 step 8) live here so they cannot drift apart:

- blank lines are ignored; stdout lines that do not start with ``{`` are the CLI talking outside
  its protocol and become ``stdout`` transcript items; stderr lines become ``stderr`` items;
- a line that starts with ``{`` but does not parse as a JSON object, a line the stream cut
  short, or any formal event after the terminal one marks the protocol **malformed**, which
  blocks the checkpoint and fails the run unless a more specific failure exists;
- every transcript item is emitted through the sink at the moment it is appended, so the items
  emitted equal ``Response.transcript`` in order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from adaptor.driver import DecisionRequest, DecisionResponse, EventSink, RunFailure
from adaptor.result import TranscriptItem

__all__ = [
    "Decoded",
    "FailureKind",
    "NullSink",
    "Protocol",
    "as_dict",
    "as_int",
    "as_list",
    "as_str",
    "decode",
    "provider_failure",
]

FailureKind = Literal["auth", "rate_limit", "provider_unavailable", ""]
_RETRYABLE: Final = frozenset({"rate_limit", "provider_unavailable"})

# How much of a bad line a diagnostic may quote: enough to recognise it, never a whole payload.
_QUOTE: Final = 80


@dataclass(frozen=True)
class Decoded:
    kind: Literal["event", "text", "blank", "malformed"]
    event: dict[str, Any] | None = None
    text: str = ""


def decode(line: str | bytes) -> Decoded:
    """Classify one stdout line (without its newline)."""
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    stripped = data.strip()
    if not stripped:
        return Decoded("blank")
    text = stripped.decode("utf-8", "replace")
    if not stripped.startswith(b"{"):
        return Decoded("text", text=text)
    try:
        value = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return Decoded("malformed", text=text)
    if not isinstance(value, dict):
        return Decoded("malformed", text=text)
    return Decoded("event", event=value, text=text)


class Protocol:
    """The parts of one run's parse state every driver has: the transcript, the malformed
    verdict and the terminal event.  A driver's parser feeds it lines and gets events back."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink
        self.transcript: list[TranscriptItem] = []
        self.problems: list[str] = []
        self.terminal: dict[str, Any] | None = None
        self.terminal_line = ""
        self._lifecycle_ids: set[str] = set()
        self.stderr_reason = ""

    @property
    def malformed(self) -> bool:
        return bool(self.problems)

    def item(self, item: TranscriptItem) -> None:
        self.transcript.append(item)
        self.sink.emit(item)

    def fresh_id(self, base: str) -> str:
        """A lifecycle id (text, thinking, tool call) not used before in this run: a CLI that
        repeats an id must not reopen a lifecycle that already ended."""
        ident, n = base, 1
        while ident in self._lifecycle_ids:
            n += 1
            ident = f"{base}~{n}"
        self._lifecycle_ids.add(ident)
        return ident

    def mark_malformed(self, why: str) -> None:
        self.problems.append(why)

    def feed_stdout(self, data: bytes) -> Decoded | None:
        """One stdout line; returns it decoded when it is a formal protocol event."""
        decoded = decode(data)
        if decoded.kind == "blank":
            return None
        if decoded.kind == "text":
            self.item(TranscriptItem(kind="stdout", text=decoded.text))
            return None
        if decoded.kind == "malformed":
            self.mark_malformed(f"unparsable JSON line: {decoded.text[:_QUOTE]!r}")
            return None
        if self.terminal is not None:
            self.mark_malformed(f"event {_type_of(decoded.event)!r} after the terminal event")
        return decoded

    def feed_stderr(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace").rstrip()
        if text:
            self.item(TranscriptItem(kind="stderr", text=text))
            # The CLI's own last word on why it stopped, ignoring backtrace noise.
            if "error" in text.lower() or not self.stderr_reason:
                self.stderr_reason = text

    def died(self, cli: str, how: str, **details: Any) -> RunFailure:
        """The failure of a process that ended without its terminal event."""
        why = f": {self.stderr_reason[:300]}" if self.stderr_reason else ""
        return RunFailure(code="agent_error", message=f"{cli} ended without a result ({how}){why}",
                          details=details)

    def set_terminal(self, event: dict[str, Any], line: str) -> None:
        self.terminal = event
        self.terminal_line = line


def provider_failure(message: str, kind: FailureKind, **details: Any) -> RunFailure:
    """An ``agent_error`` for a failure the provider reported (drivers.md, failure classes).

    ``kind`` is ``auth``, ``rate_limit`` or ``provider_unavailable`` when recognised (the last
    two are ``retryable``); ``details`` carry the provider's own code and status.
    """
    out: dict[str, Any] = {k: v for k, v in details.items() if v is not None}
    if kind:
        out["kind"] = kind
        out["retryable"] = kind in _RETRYABLE
    return RunFailure(code="agent_error", message=message or "the provider reported an error",
                      details=out)


def _type_of(event: dict[str, Any] | None) -> str:
    value = (event or {}).get("type")
    return value if isinstance(value, str) else "?"


# --- reading fields of untrusted events: a wrong type reads as empty, never raises ---------------


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class NullSink:
    """A sink nobody observes: replaying captured output, draining a process being closed."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def emit(self, payload: object) -> None:
        pass

    def request_decision(self, request: DecisionRequest) -> DecisionResponse:
        return DecisionResponse(request_id=request.request_id, result="aborted")

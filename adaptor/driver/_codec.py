"""The session codec built-in CLI drivers share.

Stored parameters are ``{"resume_id", "display_id", "data"}``; ``None`` state and ``{}``
parameters map to each other, the round trip is lossless, and decoding refuses anything that
is not that shape (a thread record written by something else must not resume by accident).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptor.driver._spi import SessionState

__all__ = ["StandardSessionCodec"]


class StandardSessionCodec:
    """The codec named ``name`` (by convention the driver type)."""

    def __init__(self, name: str) -> None:
        if not name:
            raise ValueError("a session codec needs a name")
        self._name = name

    def __repr__(self) -> str:
        return f"StandardSessionCodec({self._name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StandardSessionCodec) and other._name == self._name

    def __hash__(self) -> int:
        return hash((StandardSessionCodec, self._name))

    def name(self) -> str:
        return self._name

    def encode(self, state: SessionState | None) -> dict[str, Any]:
        if state is None:
            return {}
        return {
            "resume_id": state.resume_id,
            "display_id": state.display_id or state.resume_id,
            "data": dict(state.data),
        }

    def decode(self, params: Mapping[str, Any]) -> SessionState | None:
        if not params:
            return None
        resume_id = params.get("resume_id")
        if not isinstance(resume_id, str) or not resume_id:
            raise ValueError(f"{self._name} session parameters need a non-empty resume_id")
        display_id = params.get("display_id") or resume_id
        data = params.get("data") or {}
        if not isinstance(display_id, str) or not isinstance(data, Mapping):
            raise ValueError(f"{self._name} session parameters are malformed")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError(f"{self._name} session data must map strings to strings")
        return SessionState(resume_id=resume_id, display_id=display_id, data=dict(data))

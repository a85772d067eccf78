"""Delegating work to remote A2A agents (the ``a2a`` extra).

::

    from adaptor.clients import a2a

    registry = Registry([RemoteAgentSpec("reviewer", card_url="https://.../agent-card.json",
                                         auth=a2a.BearerTokenFromEnv("REVIEWER_TOKEN"))])
    with Delegator(registry, on_update=leader_sink.emit) as delegator:
        result = delegator.delegate(DelegationRequest("reviewer", "Review this diff"))

A delegation resolves the agent, fetches and validates its card, streams the remote task (or
polls it), recovers dropped streams, cancels the remote task on local cancellation or timeout,
and reports ``SubagentUpdate`` progress.  Every failure is a ``DelegationError`` whose code is
one of ``agent_not_found``, ``agent_unavailable`` (retryable unless the card is invalid),
``configuration_error`` (credentials refused, untrusted origin), ``capability_unsupported``,
``stream_unavailable`` (retryable), ``remote_failed``, ``protocol_error``, ``policy_violation``,
``cancelled`` (retryable when the remote cancelled), ``deadline_exceeded``; its message is a
fixed text, never the remote agent's, and ``metadata["reason"]`` refines the code.  The client
error behind it, if any, is its cause.

Importing this package needs neither ``a2a-sdk`` nor ``httpx`` (``adaptor.errors.from_wire``
loads it to rebuild ``DelegationError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from adaptor.errors import AdaptorError

from ._delegator import (
    CancelSignal,
    DelegationRequest,
    DelegationResult,
    Delegator,
    UpdateSink,
)
from ._registry import Policy, Registry, RemoteAgentSpec
from ._tool import delegate_to_agent


class DelegationError(AdaptorError):
    """A typed remote or business failure of a delegation.

    The class's wire identity is ``a2adelegation.DelegationError``; the instance's own failure
    code (``agent_not_found``, ``remote_failed``, ...) is ``.code`` and travels in
    ``fields.code``.
    """

    code: ClassVar[str] = "a2adelegation.DelegationError"
    default_message = "delegation failed"
    _fields = {
        "code": (str,),
        "retryable": (bool,),
        "remote_status": (str, int, type(None)),
        "metadata": (dict,),
    }

    def __init__(
        self,
        code: str,
        message: str = "",
        retryable: bool = False,
        remote_status: str | int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code  # type: ignore[misc]
        self.retryable = retryable
        self.remote_status = remote_status
        self.metadata = dict(metadata or {})
        super().__init__(message or f"delegation failed: {code}")


__all__ = [
    "CancelSignal",
    "DelegationError",
    "DelegationRequest",
    "DelegationResult",
    "Delegator",
    "Policy",
    "Registry",
    "RemoteAgentSpec",
    "UpdateSink",
    "delegate_to_agent",
]

"""Delegating work to remote A2A agents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from adaptor.errors import AdaptorError


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


__all__ = ["DelegationError"]

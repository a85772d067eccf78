"""The client of the adaptord spool daemon."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from adaptor.errors import AdaptorError


class InvalidRequestError(AdaptorError):
    """A spool request file failed the request schema or could not be read; nothing ran.

    ``errors`` lists ``{"path": ..., "message": ...}`` entries, one per schema violation.
    """

    code = "ErrInvalidRequest"
    exit_code = 2
    default_message = "invalid request"
    _fields = {"errors": (list,)}

    def __init__(self, errors: Sequence[Mapping[str, str]], message: str = "") -> None:
        self.errors = [{"path": str(e["path"]), "message": str(e["message"])} for e in errors]
        if not message:
            first = self.errors[0] if self.errors else None
            message = "invalid request" + (
                f": {first['path'] or '<root>'}: {first['message']}" if first else ""
            )
            if len(self.errors) > 1:
                message += f" (and {len(self.errors) - 1} more)"
        super().__init__(message)

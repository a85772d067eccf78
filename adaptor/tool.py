"""Host-defined tools served to agent CLIs."""

from __future__ import annotations

from adaptor.errors import AdaptorError


class InvalidDefinitionError(AdaptorError):
    """A tool definition cannot form a valid tool; raised before the driver runs."""

    code = "tool.ErrInvalidDefinition"
    exit_code = 3
    default_message = "invalid tool definition"


class InvalidInputError(AdaptorError):
    """The model's arguments fail validation; the model sees a safe message naming no values."""

    code = "tool.ErrInvalidInput"
    default_message = "invalid tool input"


class InvalidOutputError(AdaptorError):
    code = "tool.ErrInvalidOutput"
    default_message = "invalid tool output"

"""MCP server declarations handed to the agent CLI."""

from __future__ import annotations

from adaptor.errors import AdaptorError


class _MCPError(AdaptorError):
    exit_code = 3


class InvalidMCPConfigError(_MCPError):
    code = "ErrInvalidMCPConfig"
    default_message = "invalid MCP server declaration"


class MCPUnsupportedError(_MCPError):
    code = "ErrMCPUnsupported"
    default_message = "the driver does not support MCP servers"


class MCPTransportUnsupportedError(_MCPError):
    code = "ErrMCPTransportUnsupported"
    default_message = "the driver does not support this MCP transport"

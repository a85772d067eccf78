"""MCP server declarations handed to the agent CLI.

::

    from adaptor import mcp

    agent = adaptor.Agent(driver, mcp=[
        mcp.stdio("files", "npx", ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]),
        mcp.http("issues", "https://mcp.example.com/mcp", bearer_token_env="ISSUES_TOKEN"),
    ])

A declaration is kept as given; a run validates the whole set before anything starts, in this
order, first problem wins (no events are emitted for a refusal):

1. every declaration on its own, then duplicates → :class:`InvalidMCPConfigError`: a key must
   match ``[A-Za-z0-9][A-Za-z0-9_-]{0,63}`` and must not be ``"adaptor"`` (the Agent's own tool
   server); the transport must be ``stdio``, ``http`` or ``sse``; ``stdio`` needs a command and
   takes no URL, headers or bearer variable; ``http``/``sse`` need an absolute ``http(s)`` URL
   with a host, no whitespace and a port (if given) from 1 to 65535, take no command, args
   or env, and no two header names that differ only in case; env and bearer variable names are environment variable names; no field a CLI
   expands ``${VAR}`` in (command, args, URL, env, header values, bearer variable) may name
   the tool gateway's ``ADAPTOR_TOOLS_TOKEN_*`` variable; env may not set
   ``ADAPTOR_RUN_MARK`` or ``ADAPTOR_STARTED_BY``, which find a run's processes;
2. the driver declares no MCP support → :class:`MCPUnsupportedError`;
3. a server's transport is not one the driver supports → :class:`MCPTransportUnsupportedError`.

The same checks apply to the Agent's tool gateway (an ``http`` server) when the Agent has
host-defined tools.  Malformed declarations come first so that a broken config is reported
as such on every driver.

Secrets: ``env`` and ``headers`` values and the token behind ``bearer_token_env`` are secrets.
They never appear in a declaration's ``repr``, in events, results or thread fingerprints; the
fingerprint covers keys, transports, commands, args, URLs and the *names* of env variables
and headers.  Put credentials in ``env``/``headers``/``bearer_token_env``, never in ``args``
or the URL.

The validated set reaches the driver as ``Request.mcp``: a tuple of
:class:`adaptor.driver.MCPServerSpec` sorted by key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast
from urllib.parse import unquote, urlsplit

from adaptor import _procfs
from adaptor.driver import Descriptor, canonical_fingerprint
from adaptor.driver._spi import MCPServerSpec, MCPTransport
from adaptor.errors import AdaptorError

__all__ = [
    "RESERVED_ENV_PREFIX",
    "RESERVED_KEY",
    "InvalidMCPConfigError",
    "MCPTransportUnsupportedError",
    "MCPUnsupportedError",
    "Server",
    "fingerprint",
    "from_json",
    "http",
    "sse",
    "stdio",
    "validate",
]

RESERVED_KEY: Final = "adaptor"
"""The key of the Agent's own tool server; user declarations cannot take it."""

RESERVED_ENV_PREFIX: Final = "ADAPTOR_TOOLS_TOKEN_"
"""Prefix of the tool gateway's token variable; declarations may not name or expand it."""

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_TRANSPORTS: Final = ("stdio", "http", "sse")
_FIELDS: Final = (
    "key",
    "transport",
    "command",
    "args",
    "env",
    "url",
    "headers",
    "bearer_token_env",
    "required",
    "required_reason",
)


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


@dataclass(frozen=True, repr=False)
class Server:
    """One MCP server declaration, kept exactly as given (validation happens per run).

    Prefer :func:`stdio`, :func:`http` and :func:`sse`; the fields of the other transport stay
    empty there.
    """

    key: str
    transport: str
    command: str = ""
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token_env: str = ""
    required: bool = False
    required_reason: str = ""

    def __repr__(self) -> str:
        parts = [f"key={self.key!r}", f"transport={self.transport!r}"]
        if self.command or self.args:
            args = list(self.args) if isinstance(self.args, tuple | list) else self.args
            parts += [f"command={self.command!r}", f"args={args!r}"]
        if self.env:
            parts.append(f"env=<{_names(self.env)}>")
        if self.url:
            parts.append(f"url={self.url!r}")
        if self.headers:
            parts.append(f"headers=<{_names(self.headers)}>")
        if self.bearer_token_env:
            parts.append(f"bearer_token_env={self.bearer_token_env!r}")
        if self.required:
            parts.append(f"required_reason={self.required_reason!r}")
        return f"mcp.Server({', '.join(parts)})"


def url_passwords(url: object) -> list[str]:
    """The password of a URL's ``user:password@``, as written and percent-decoded: a secret,
    like a header's value, that no record may show (none for anything else)."""
    if not isinstance(url, str):
        return []
    try:
        written = urlsplit(url.strip()).password
    except ValueError:
        return []
    return sorted({written, unquote(written)}) if written else []


def stdio(
    key: str,
    command: str,
    args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    required: bool = False,
    required_reason: str = "",
) -> Server:
    """A server the CLI starts as a child process speaking MCP on stdin/stdout."""
    return Server(
        key=key,
        transport="stdio",
        command=command,
        args=_kept_sequence(args),
        env=_kept_mapping(env),
        required=required,
        required_reason=required_reason,
    )


def http(
    key: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    bearer_token_env: str | None = None,
    *,
    required: bool = False,
    required_reason: str = "",
) -> Server:
    """A streamable-HTTP server.  ``bearer_token_env`` names the variable holding its token."""
    return _remote("http", key, url, headers, bearer_token_env, required, required_reason)


def sse(
    key: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    bearer_token_env: str | None = None,
    *,
    required: bool = False,
    required_reason: str = "",
) -> Server:
    """A legacy HTTP+SSE server; like :func:`http` otherwise."""
    return _remote("sse", key, url, headers, bearer_token_env, required, required_reason)


def _remote(
    transport: str,
    key: str,
    url: str,
    headers: Mapping[str, str] | None,
    bearer_token_env: str | None,
    required: bool,
    required_reason: str,
) -> Server:
    return Server(
        key=key,
        transport=transport,
        url=url,
        headers=_kept_mapping(headers),
        bearer_token_env=bearer_token_env or "",
        required=required,
        required_reason=required_reason,
    )


def _names(values: object) -> str:
    """The names of an env or headers mapping; never its values, whatever it holds."""
    if not isinstance(values, Mapping):
        return f"not a mapping: {type(values).__name__}"
    return ", ".join(sorted(map(str, values)))


def _kept_sequence(value: Iterable[str]) -> Sequence[str]:
    """``value`` as a tuple, or as given when it is no list: ``tuple("--flag")`` would be six
    one-letter arguments, so a string is kept for validation to refuse."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return value
    return tuple(value)


def _kept_mapping(value: Mapping[str, str] | None) -> Mapping[str, str]:
    """A copy of ``value``, or ``value`` as given when it is no mapping: ``dict(["AB"])`` would
    be ``{"A": "B"}``, so a list is kept for validation to refuse."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else value


def from_json(obj: object, *, where: str = "mcp") -> Server:
    """A declaration from its JSON form (the field names of :class:`Server`).

    Raises :class:`InvalidMCPConfigError` for a value that is not such an object.
    """
    if isinstance(obj, Server):
        return obj
    if not isinstance(obj, Mapping):
        raise InvalidMCPConfigError(f"{where}: expected an MCP server object")
    unknown = sorted(str(k) for k in obj if k not in _FIELDS)
    if unknown:
        raise InvalidMCPConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {
        "key": obj.get("key", ""),
        "transport": obj.get("transport", ""),
        "command": obj.get("command") or "",
        "args": obj.get("args") or (),
        "env": obj.get("env") or {},
        "url": obj.get("url") or "",
        "headers": obj.get("headers") or {},
        "bearer_token_env": obj.get("bearer_token_env") or "",
        "required": obj.get("required", False),
        "required_reason": obj.get("required_reason") or "",
    }
    if isinstance(values["args"], list):
        values["args"] = tuple(values["args"])
    return Server(**values)


def validate(
    servers: Iterable[object] | None, descriptor: Descriptor, *, tools: bool = False
) -> tuple[MCPServerSpec, ...]:
    """The normalized set for ``Request.mcp`` (sorted by key), or the first problem.

    ``tools``: the Agent serves host-defined tools, so the driver must also accept the
    gateway, an ``http`` server.
    """
    declared = [from_json(obj, where=f"mcp[{i}]") for i, obj in enumerate(servers or ())]
    specs: dict[str, MCPServerSpec] = {}
    for position, server in enumerate(declared):
        spec = _normalize(server, f"mcp[{position}]")
        if spec.key in specs:
            raise InvalidMCPConfigError(f"mcp[{position}]: duplicate key {spec.key!r}")
        specs[spec.key] = spec
    if not specs and not tools:
        return ()
    caps = descriptor.mcp
    if not caps.supported:
        what = "MCP servers" if specs else "host-defined tools (served over MCP)"
        raise MCPUnsupportedError(f"driver {descriptor.type!r} does not support {what}")
    for spec in specs.values():
        if not getattr(caps, spec.transport):
            raise MCPTransportUnsupportedError(
                f"driver {descriptor.type!r} does not support {spec.transport} MCP servers "
                f"(server {spec.key!r})"
            )
    if tools and not caps.http:
        raise MCPTransportUnsupportedError(
            f"driver {descriptor.type!r} does not support http MCP servers, which host-defined "
            "tools need"
        )
    return tuple(specs[key] for key in sorted(specs))


def fingerprint(specs: Iterable[MCPServerSpec]) -> str:
    """A stable hash of the set that names env variables and headers but holds no values."""
    view = [
        {
            "key": s.key,
            "transport": s.transport,
            "command": s.command,
            "args": list(s.args),
            "env": sorted(s.env),
            "url": s.url,
            "headers": sorted(h.lower() for h in s.headers),
            "bearer_token_env": s.bearer_token_env,
            "required": s.required,
            "required_reason": s.required_reason,
        }
        for s in sorted(specs, key=lambda s: s.key)
    ]
    return canonical_fingerprint("adaptor/mcp/v1", view, root="MCP")


def _normalize(server: Server, where: str) -> MCPServerSpec:
    key = server.key.strip() if isinstance(server.key, str) else ""
    if not key:
        raise InvalidMCPConfigError(f"{where}: a key is required")
    where = f"{where} ({key!r})"
    if not _KEY.fullmatch(key):
        raise InvalidMCPConfigError(
            f"{where}: a key is 1-64 letters, digits, '_' or '-', starting with a letter or digit"
        )
    if key == RESERVED_KEY:
        raise InvalidMCPConfigError(
            f"{where}: the key {RESERVED_KEY!r} is reserved for the tool gateway"
        )
    transport = server.transport.strip().lower() if isinstance(server.transport, str) else ""
    if transport not in _TRANSPORTS:
        raise InvalidMCPConfigError(f"{where}: unknown transport; use stdio, http or sse")
    command = _string(server.command, where, "command")
    args = _strings(server.args, where)
    env = _names_to_strings(server.env, where, "env", _ENV_NAME)
    marks = sorted(name for name in env if name in (_procfs.MARK_VAR, _procfs.STARTER_VAR))
    if marks:
        # Set to another value, they would hide the server's processes from the run's
        # clean-up (and a thread's lease from its holder check).
        raise InvalidMCPConfigError(
            f"{where}: env {', '.join(marks)} is set by adaptor, to find the run's processes"
        )
    url = _string(server.url, where, "url")
    headers = _names_to_strings(server.headers, where, "headers", _HEADER_NAME)
    bearer = _string(server.bearer_token_env, where, "bearer_token_env")
    if not isinstance(server.required, bool):
        raise InvalidMCPConfigError(f"{where}: required must be true or false")
    reason = _string(server.required_reason, where, "required_reason")
    if transport == "stdio":
        if not command.strip():
            raise InvalidMCPConfigError(f"{where}: a stdio server needs a command")
        wrong = [
            n for n, v in (("url", url), ("headers", headers), ("bearer_token_env", bearer)) if v
        ]
        if wrong:
            raise InvalidMCPConfigError(f"{where}: a stdio server takes no {', '.join(wrong)}")
    else:
        if not url.strip():
            raise InvalidMCPConfigError(f"{where}: an {transport} server needs a URL")
        _check_url(url.strip(), where)
        wrong = [n for n, v in (("command", command), ("args", args), ("env", env)) if v]
        if wrong:
            raise InvalidMCPConfigError(
                f"{where}: an {transport} server takes no {', '.join(wrong)}"
            )
        if bearer and not _ENV_NAME.fullmatch(bearer):
            raise InvalidMCPConfigError(
                f"{where}: bearer_token_env must be an environment variable name"
            )
        folded: dict[str, str] = {}
        for header in headers:
            other = folded.setdefault(header.lower(), header)
            if other != header:
                # Header names ignore case: which value the CLI sends would be its choice.
                raise InvalidMCPConfigError(
                    f"{where}: headers {other!r} and {header!r} are one header (names ignore case)"
                )
        if any(name.lower() == "authorization" for name in headers) and bearer:
            raise InvalidMCPConfigError(
                f"{where}: give either an Authorization header or bearer_token_env, not both"
            )
    # The CLIs expand ${VAR} in these fields: naming the gateway's variable would hand the
    # Agent's tool token to this server, and in a stdio command or args put it in an argv
    # that every local user can read in ps.
    mentioned = [bearer, url, command, *args, *env, *env.values(), *headers.values()]
    if any(RESERVED_ENV_PREFIX in text for text in mentioned):
        raise InvalidMCPConfigError(f"{where}: refers to the tool gateway's token variable")
    return MCPServerSpec(
        key=key,
        transport=cast(MCPTransport, transport),
        command=command.strip(),
        args=args,
        env=env,
        url=url.strip(),
        headers=headers,
        bearer_token_env=bearer,
        required=server.required,
        required_reason=reason.strip(),
    )


def _check_url(url: str, where: str) -> None:
    """An absolute http(s) URL with a host and, if given, a port from 1 to 65535.  A URL the
    CLI cannot connect to would otherwise fail only at run time, as a server that never came up."""
    invalid = InvalidMCPConfigError(
        f"{where}: the URL must be an absolute http(s) URL with a host and a port from 1 to 65535"
    )
    # urlsplit quietly drops tabs and newlines; a space would reach the CLI as is.
    if any(c.isspace() or not c.isprintable() for c in url):
        raise invalid
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError: not a number, or out of 0-65535
    except ValueError:
        raise invalid from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise invalid


def _string(value: object, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidMCPConfigError(f"{where}: {name} must be a string")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise InvalidMCPConfigError(f"{where}: args must be a list of strings")
    if not all(isinstance(item, str) for item in value):
        raise InvalidMCPConfigError(f"{where}: args must be a list of strings")
    return tuple(value)


def _names_to_strings(
    value: object, where: str, name: str, pattern: re.Pattern[str]
) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidMCPConfigError(f"{where}: {name} must map names to strings")
    out: dict[str, str] = {}
    for item_name, item in value.items():
        if not isinstance(item_name, str) or not pattern.fullmatch(item_name):
            # The name is safe to show; the value never is.
            raise InvalidMCPConfigError(f"{where}: {name} has an invalid name {item_name!r}")
        # NUL cannot be in an environment; CR/LF in a header would split the request.
        forbidden = "\0\r\n" if name == "headers" else "\0"
        if not isinstance(item, str) or any(c in item for c in forbidden):
            raise InvalidMCPConfigError(f"{where}: {name}[{item_name!r}] has an invalid value")
        out[item_name] = item
    return out

"""The A2A client (the ``a2a`` extra): a sync facade over the official ``a2a-sdk``.

The SDK does the protocol (card resolution, JSON-RPC and HTTP+JSON transports, the protobuf
types); this module adds what a host needs on top: a blocking API, credential safety across
origins and redirects, one error taxonomy, and recovery of streams that drop before their final
event.

The error identities and the plain-data model below import nothing optional, so verdicts carrying
them decode without ``a2a-sdk`` installed; the SDK (and ``httpx``) are imported on first use.

    client = Client("https://agents.example/.well-known/agent-card.json",
                    auth=BearerTokenFromEnv("REMOTE_TOKEN"))
    task = client.send("Review this diff")
    for event in client.send_stream("..."):
        ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import email.utils
import enum
import functools
import json
import os
import re
import threading
import uuid
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

from adaptor import _options, _waiting, errors
from adaptor._redact import Redactor, redact_credentials, redact_error
from adaptor.errors import AdaptorError

if TYPE_CHECKING:
    import httpx
    from a2a import types as pb
    from a2a.client import AgentCardResolutionError, ClientCallContext
    from a2a.client import Client as SDKClient
    from google.protobuf.message import Message as ProtoMessage

__all__ = [
    "AgentCard",
    "AgentInterface",
    "AgentSkill",
    "Artifact",
    "ArtifactEvent",
    "Auth",
    "BearerTokenFromEnv",
    "Client",
    "EventStream",
    "InvalidAgentCardError",
    "MAX_CARD_BYTES",
    "MAX_RESPONSE_BYTES",
    "Message",
    "MessageEvent",
    "NotFoundError",
    "Part",
    "ProtocolError",
    "StatusEvent",
    "StreamEvent",
    "StreamRecoveryError",
    "Task",
    "TaskEvent",
    "TaskState",
    "TerminalEvent",
    "UnauthorizedError",
    "UnsupportedError",
    "UntrustedOriginError",
    "origin_of",
]

_Str = (str,)
_OptStr = (str, type(None))


class InvalidAgentCardError(AdaptorError):
    code = "a2a.ErrInvalidAgentCard"
    default_message = "invalid agent card"


class ProtocolError(AdaptorError):
    """A malformed response, part or event, or an error answer from the remote that no other
    class covers (``reason`` names it: ``internal_error``, ``remote error -32000``).  ``raw`` is
    sanitized: it never holds credentials."""

    code = "a2a.ErrProtocol"
    default_message = "A2A protocol error"
    _fields = {"op": _Str, "reason": _Str, "raw": _OptStr}

    def __init__(
        self, op: str, reason: str, cause: BaseException | None = None, raw: str | None = None
    ) -> None:
        self.op = op
        self.reason = reason
        self.raw = raw
        super().__init__(f"A2A {op}: {reason}", cause=cause)


class UnauthorizedError(AdaptorError):
    code = "a2a.ErrUnauthorized"
    default_message = "the remote agent refused the credentials"


class NotFoundError(AdaptorError):
    code = "a2a.ErrNotFound"
    default_message = "task not found"


class UnsupportedError(AdaptorError):
    code = "a2a.ErrUnsupported"
    default_message = "operation not supported by the remote agent"


class UntrustedOriginError(AdaptorError):
    code = "a2a.ErrUntrustedOrigin"
    default_message = "credentials would cross an untrusted origin"


class StreamRecoveryError(AdaptorError):
    """A stream dropped before its final event and the task could not be recovered."""

    code = "a2a.StreamRecoveryError"
    default_message = "stream could not be recovered"
    _fields = {"task_id": _Str}

    def __init__(self, task_id: str, cause: BaseException | None = None) -> None:
        self.task_id = task_id
        super().__init__(f"stream for task {task_id!r} could not be recovered", cause=cause)


# --- the plain-data model ---------------------------------------------------------------------


class TaskState(enum.StrEnum):
    """A2A 1.0 task states, spelled without the protocol's ``TASK_STATE_`` prefix."""

    SUBMITTED = "submitted"
    WORKING = "working"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REJECTED = "rejected"
    INPUT_REQUIRED = "input_required"
    AUTH_REQUIRED = "auth_required"

    @property
    def terminal(self) -> bool:
        """The task is over: completed, failed, canceled or rejected."""
        return self in _TERMINAL

    @property
    def interrupted(self) -> bool:
        """The task waits for the caller: input or authorization required."""
        return self in _INTERRUPTED

    @property
    def final(self) -> bool:
        """This execution is over (terminal or interrupted); a stream ends here."""
        return self in _TERMINAL or self in _INTERRUPTED


_TERMINAL = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED}
)
_INTERRUPTED = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Part:
    """One content part; ``kind`` says which of ``text``, ``data``, ``url``, ``raw`` is set."""

    kind: Literal["text", "data", "url", "raw"]
    text: str = ""
    data: Any = None
    url: str = ""
    raw: bytes = b""
    media_type: str = ""
    filename: str = ""
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)


def _join_text(parts: tuple[Part, ...]) -> str:
    return "".join(part.text for part in parts if part.kind == "text")


@dataclass(frozen=True)
class Message:
    message_id: str
    role: Literal["user", "agent", ""]
    parts: tuple[Part, ...] = ()
    context_id: str = ""
    task_id: str = ""
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def text(self) -> str:
        """The text parts, concatenated."""
        return _join_text(self.parts)


@dataclass(frozen=True)
class Artifact:
    artifact_id: str
    name: str = ""
    description: str = ""
    parts: tuple[Part, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def text(self) -> str:
        return _join_text(self.parts)


@dataclass(frozen=True)
class Task:
    """A snapshot of a remote task."""

    id: str
    context_id: str
    state: TaskState
    status_message: Message | None = None
    artifacts: tuple[Artifact, ...] = ()
    history: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def text(self) -> str:
        """The artifacts' text, or the status message's when there are no artifacts."""
        if self.artifacts:
            return "".join(artifact.text for artifact in self.artifacts)
        return self.status_message.text if self.status_message is not None else ""


@dataclass(frozen=True)
class AgentInterface:
    url: str
    binding: str
    protocol_version: str = ""
    tenant: str = ""


@dataclass(frozen=True)
class AgentSkill:
    id: str
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentCard:
    """A validated agent card.  ``raw`` is its ProtoJSON form (it can build another client)."""

    name: str
    interfaces: tuple[AgentInterface, ...]
    description: str = ""
    version: str = ""
    url: str = ""
    streaming: bool = False
    push_notifications: bool = False
    default_input_modes: tuple[str, ...] = ()
    default_output_modes: tuple[str, ...] = ()
    skills: tuple[AgentSkill, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False, repr=False)


# --- stream events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskEvent:
    """A full task snapshot inside a stream: history, not the current outcome."""

    kind: ClassVar[str] = "task"
    task: Task


@dataclass(frozen=True)
class MessageEvent:
    """A bare message reply; it ends the stream."""

    kind: ClassVar[str] = "message"
    message: Message


@dataclass(frozen=True)
class StatusEvent:
    """A non-final status change (final ones arrive as ``TerminalEvent``)."""

    kind: ClassVar[str] = "status"
    task_id: str
    context_id: str
    state: TaskState
    message: Message | None = None


@dataclass(frozen=True)
class ArtifactEvent:
    """An artifact chunk: ``append`` extends the artifact with the same id."""

    kind: ClassVar[str] = "artifact"
    task_id: str
    context_id: str
    artifact: Artifact
    append: bool = False
    last_chunk: bool = False


@dataclass(frozen=True)
class TerminalEvent:
    """The last event of a task stream: ``state`` is final (terminal, or interrupted when the
    remote waits for input or authorization).

    ``recovered`` marks a terminal synthesized after the stream dropped and a fetch of the task
    found it final.  ``task`` is the final snapshot when there is one: the fetched task, or the
    task the stream itself delivered whole in a final state (then the ``TaskEvent`` before this
    one holds it too); None for a final status update.
    """

    kind: ClassVar[str] = "terminal"
    task_id: str
    context_id: str
    state: TaskState
    message: Message | None = None
    recovered: bool = False
    task: Task | None = None


StreamEvent = TaskEvent | MessageEvent | StatusEvent | ArtifactEvent | TerminalEvent


# --- credentials --------------------------------------------------------------------------------


@runtime_checkable
class Auth(Protocol):
    """Credentials added to requests for trusted origins only.

    ``headers()`` is called for every such request (so a rotated secret is picked up) and must
    not cache secret values on the object: reprs and errors never show them.
    """

    def headers(self) -> Mapping[str, str]: ...


_SDK_MODULES = ("httpx", "a2a.client")
# How to install the a2a extra, as pyproject.toml pins it (not 'adaptor[a2a]': that name on the
# package index is another project); the daemon's --a2a refusal says the same.
INSTALL_HINT = (
    "pip install 'a2a-sdk[http-server]~=1.3.0' 'httpx>=0.28.1,<1' 'uvicorn>=0.30' "
    "(from a clone: pip install -e '.[a2a]')"
)


def require_sdk() -> None:
    """Import what the client needs now: without the ``a2a`` extra, an ``ImportError`` that
    names it, rather than a ``ModuleNotFoundError`` at the first call."""
    import importlib

    for name in _SDK_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"the A2A client needs the a2a extra ({exc.name or name} is missing): {INSTALL_HINT}",
                name=exc.name,
            ) from exc


class BearerTokenFromEnv:
    """``Authorization: Bearer <token>`` with the token read from ``os.environ[name]`` at
    request time.  A missing or empty variable fails the request with ``UnauthorizedError``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("BearerTokenFromEnv needs an environment variable name")
        self.name = name

    def headers(self) -> Mapping[str, str]:
        token = os.environ.get(self.name, "")
        if not token:
            raise UnauthorizedError(f"environment variable {self.name!r} holds no bearer token")
        if not (token.isascii() and token.isprintable()):
            # No header can carry it: HTTP's encoding failed deep in the request, taken for the
            # remote's malformed answer, with the token kept in the encoding error.
            raise UnauthorizedError(
                f"environment variable {self.name!r} holds a bearer token that is not printable "
                "ASCII, which no HTTP header can carry; nothing was sent"
            )
        return {"Authorization": f"Bearer {token}"}

    def __repr__(self) -> str:
        return f"BearerTokenFromEnv({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BearerTokenFromEnv) and other.name == self.name

    def __hash__(self) -> int:
        return hash((BearerTokenFromEnv, self.name))


def origin_of(url: str) -> str:
    """The canonical origin of an absolute http(s) URL: lower-cased scheme and host and an
    explicit port (``https://Example.com`` -> ``https://example.com:443``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an absolute http(s) URL: {_strip_userinfo(url)!r}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError(f"invalid port in URL: {_strip_userinfo(url)!r}") from exc
    host = parts.hostname.lower()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _strip_userinfo(url: str) -> str:
    return re.sub(r"(://)[^/@\s]*@", r"\1", url)


# --- the client ---------------------------------------------------------------------------------

_BINDINGS = ("JSONRPC", "HTTP+JSON")
_WELL_KNOWN_CARD_PATH = "/.well-known/agent-card.json"
_CLOSE_TIMEOUT = 5.0
# The most a remote may send as one answer before the client stops reading (docs/a2a.md): an
# agent card, and any other response body or single SSE event (a task snapshot holds its
# artifacts, a delegation's up to 8 MiB by default, as escaped JSON).  Without them one endless
# answer was read whole into memory.
MAX_CARD_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 32 << 20
_MAX_BYTES_EXTENSION = "adaptor.max_bytes"
T = TypeVar("T")


class Client:
    """A blocking A2A client for one remote agent.

    ``agent_card_url`` is where the card is fetched (lazily, on first use); ``card`` (ProtoJSON
    mapping, a validated ``AgentCard`` or an ``a2a.types.AgentCard``) skips the fetch.  Either
    is required; with both, the card is used and the URL only sets the trusted origin.

    ``auth`` credentials go only to the card URL's origin and ``trusted_origins``; they are
    stripped from every request (redirects included) to any other origin, and a card that points
    an interface elsewhere while ``auth`` is set fails discovery with ``UntrustedOriginError``.

    ``timeout`` bounds each unary request as a whole, however slowly the remote answers
    (``send`` waits for the remote task unless ``return_immediately``, so size it for that; the
    card fetch a first call makes counts against that call's bound); each call may bound itself
    with its own ``timeout``.  Streams have no read timeout, bound them with
    ``EventStream.next_event(timeout)``.  Transport failures raise builtin ``ConnectionError``
    and ``TimeoutError``, and so does a remote that answers HTTP 5xx (but 501), 408 or 429:
    ``ConnectionError`` naming the status, with a ``retry_after`` attribute (seconds) when the
    answer's ``Retry-After`` says when to come back.  Everything else is one of this module's
    errors.

    Thread-safe; the SDK runs on one private event-loop thread per client.  ``close()`` it.
    """

    def __init__(
        self,
        agent_card_url: str | None = None,
        *,
        card: Mapping[str, Any] | AgentCard | pb.AgentCard | None = None,
        auth: Auth | None = None,
        trusted_origins: tuple[str, ...] | list[str] = (),
        timeout: float | None = 30.0,
    ) -> None:
        require_sdk()
        if agent_card_url is None and card is None:
            raise ValueError("Client needs an agent_card_url or a card")
        if auth is not None and not _options.provides(auth, Auth):
            raise TypeError("auth must provide headers() (e.g. BearerTokenFromEnv)")
        if agent_card_url is not None and not isinstance(agent_card_url, str):
            raise TypeError(f"agent_card_url must be a str, not {type(agent_card_url).__name__}")
        # A lone string would otherwise be read as one origin per character.
        if isinstance(trusted_origins, str | bytes) or not all(
            isinstance(origin, str) for origin in trusted_origins
        ):
            raise TypeError("trusted_origins must be a list of origin URL strings")
        _check_timeout("timeout", timeout)
        trusted = {origin_of(origin) for origin in trusted_origins}
        if agent_card_url is not None:
            trusted.add(origin_of(agent_card_url))
        self._card_url = agent_card_url
        self._card_input = card
        self._auth = auth
        self._trusted = frozenset(trusted)
        self._timeout = timeout
        self._runner = _LoopThread()
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._discovery = asyncio.Lock()
        self._http: httpx.AsyncClient | None = None
        self._streams: weakref.WeakSet[EventStream] = weakref.WeakSet()
        self._closed = False

    def __repr__(self) -> str:
        where = _strip_userinfo(self._card_url) if self._card_url else "<card>"
        return f"Client({where!r}, auth={self._auth!r}, trusted_origins={sorted(self._trusted)!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations

    def agent_card(self, *, timeout: float | None = None) -> AgentCard:
        """The validated card (fetched on first use, within ``timeout`` or the client's)."""
        _check_timeout("timeout", timeout)
        return self._run(self._bounded("agent_card", timeout, self._ready)).card

    def send(
        self,
        text: str,
        context_id: str | None = None,
        *,
        task_id: str | None = None,
        return_immediately: bool = False,
        timeout: float | None = None,
    ) -> Task:
        """SendMessage; returns the task snapshot (a bare message reply becomes a completed task).

        By default the remote answers when the task is final; with ``return_immediately`` it
        answers at once and the caller polls ``get_task``.  ``timeout`` replaces the client's
        for this call.
        """
        _check_message(text, context_id, task_id)
        _check_timeout("timeout", timeout)
        return self._run(
            self._bounded(
                "send", timeout, lambda: self._send(text, context_id, task_id, return_immediately)
            )
        )

    def send_stream(
        self, text: str, context_id: str | None = None, *, task_id: str | None = None
    ) -> EventStream:
        """SendStreamingMessage; ``UnsupportedError`` when the card does not offer streaming."""
        _check_message(text, context_id, task_id)
        session = self._run(self._bounded("send_stream", None, self._ready))
        if not session.card.streaming:
            raise UnsupportedError("A2A send_stream: the remote agent does not support streaming")
        request = _message_request(text, context_id, task_id, return_immediately=False)
        state = _StreamState(task_id=task_id or "")
        return self._open_stream(
            "send_stream", state, lambda: session.streaming.send_message(request)
        )

    def subscribe(self, task_id: str) -> EventStream:
        """SubscribeToTask: the events of a running task from now on."""
        _check_task_id("subscribe", task_id)
        session = self._run(self._bounded("subscribe", None, self._ready))
        if not session.card.streaming:
            raise UnsupportedError("A2A subscribe: the remote agent does not support streaming")
        from a2a.types import SubscribeToTaskRequest

        request = SubscribeToTaskRequest(id=task_id)
        return self._open_stream(
            "subscribe", _StreamState(task_id=task_id), lambda: session.streaming.subscribe(request)
        )

    def get_task(self, task_id: str, *, timeout: float | None = None) -> Task:
        """GetTask; ``NotFoundError`` when the remote does not know the task."""
        _check_task_id("get_task", task_id)
        _check_timeout("timeout", timeout)
        return self._run(
            self._bounded("get_task", timeout, lambda: self._get_task("get_task", task_id, timeout))
        )

    def cancel_task(self, task_id: str, *, timeout: float | None = None) -> Task:
        """CancelTask; a task that is already terminal is returned as it is."""
        _check_task_id("cancel_task", task_id)
        _check_timeout("timeout", timeout)
        return self._run(
            self._bounded("cancel_task", timeout, lambda: self._cancel_task(task_id, timeout))
        )

    def close(self) -> None:
        """Close open streams, the HTTP client and the loop thread.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for stream in list(self._streams):
            stream.close()
        with contextlib.suppress(Exception):
            self._runner.run(self._aclose(), timeout=_CLOSE_TIMEOUT)
        self._runner.stop()

    # -- sync plumbing

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("the A2A client is closed")
        return self._runner.run(coro)

    def _open_stream(
        self, op: str, state: _StreamState, open_: Callable[[], AsyncIterator[pb.StreamResponse]]
    ) -> EventStream:
        stream = EventStream(self._runner, self._events(op, state, open_), state)
        self._streams.add(stream)
        return stream

    # -- async side (runs on the loop thread)

    async def _bounded(self, op: str, timeout: float | None, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` within ``timeout`` (else the client's) seconds as a whole.

        httpx's timeouts bound each network read: a remote sending a byte now and then held a
        call for as long as it liked.  The SDK's own timeouts stay underneath as a second bound.
        """
        limit = self._timeout if timeout is None else timeout
        if limit is None:
            return await work()
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                return await work()
        except TimeoutError as exc:
            if not bound.expired():
                raise  # the transport's own timeout, already mapped
            raise TimeoutError(f"A2A {op}: timed out after {limit:g} s") from exc

    async def _ready(self) -> _Session:
        async with self._discovery:
            # A failed discovery is not cached: the next call tries again.
            if self._session is None:
                http = self._http_client()
                proto = await self._load_card(http)
                self._session = _Session.create(self._validate_card(proto), proto, http)
            return self._session

    def _http_client(self) -> httpx.AsyncClient:
        if self._http is None:
            import httpx

            timeout = None if self._timeout is None else httpx.Timeout(self._timeout, read=None)
            self._http = httpx.AsyncClient(
                timeout=timeout,
                follow_redirects=True,
                max_redirects=10,
                # Compressed answers would be bounded on what was sent, not on what it inflates
                # to (and an SSE stream's events could not be told apart).
                headers={"Accept-Encoding": "identity"},
                event_hooks={"request": [self._authorize], "response": [_bound_response]},
            )
        return self._http

    async def _authorize(self, request: httpx.Request) -> None:
        # httpx calls this for the first request and again for every redirect hop, so the
        # origin check covers redirects: credentials never reach an origin outside the trusted
        # set, whatever headers httpx carried over from the previous hop.
        for name in ("Authorization", "Proxy-Authorization"):
            request.headers.pop(name, None)
        if self._auth is None:
            return
        if origin_of(str(request.url)) in self._trusted:
            request.headers.update(self._auth.headers())
            return
        with contextlib.suppress(Exception):  # only the names matter here
            for name in self._auth.headers():
                request.headers.pop(name, None)

    async def _load_card(self, http: httpx.AsyncClient) -> pb.AgentCard:
        from a2a.client import A2ACardResolver
        from a2a.client.card_resolver import parse_agent_card
        from a2a.types import AgentCard as ProtoCard

        given = self._card_input
        if given is not None:
            try:
                if isinstance(given, ProtoCard):
                    proto = ProtoCard()
                    proto.CopyFrom(given)
                    return proto
                raw = given.raw if isinstance(given, AgentCard) else given
                # parse_agent_card rewrites legacy (0.3) fields in place: give it a copy.
                return parse_agent_card(copy.deepcopy(dict(raw)))
            except Exception as exc:  # ParseError, TypeError, ...: all mean "not a card"
                raise InvalidAgentCardError(
                    "the given card is not a valid A2A card", cause=exc
                ) from exc
        try:
            assert self._card_url is not None
            base, path = _split_card_url(self._card_url)
            kwargs: dict[str, Any] = {"extensions": {_MAX_BYTES_EXTENSION: MAX_CARD_BYTES}}
            if self._timeout is not None:
                kwargs["timeout"] = self._timeout
            return await A2ACardResolver(http, base, path).get_agent_card(http_kwargs=kwargs)
        except (AdaptorError, asyncio.CancelledError):
            # Ours already (the auth's own UnauthorizedError): raising it "from" itself made it
            # its own cause.
            raise
        except Exception as exc:
            raise self._map("agent_card", exc) from exc

    def _validate_card(self, proto: pb.AgentCard) -> AgentCard:
        from google.protobuf.json_format import MessageToDict

        if not proto.name.strip():
            raise InvalidAgentCardError("agent card has no name")
        interfaces = tuple(
            AgentInterface(
                url=iface.url,
                binding=iface.protocol_binding,
                protocol_version=iface.protocol_version,
                tenant=iface.tenant,
            )
            for iface in proto.supported_interfaces
        )
        usable = [i for i in interfaces if i.binding in _BINDINGS and _is_absolute(i.url)]
        if not usable:
            raise InvalidAgentCardError(
                "agent card has no supported interface (an absolute http(s) URL with a "
                "JSONRPC or HTTP+JSON binding)"
            )
        if self._auth is not None:
            for iface in interfaces:
                if not _is_absolute(iface.url) or origin_of(iface.url) not in self._trusted:
                    raise UntrustedOriginError(
                        "agent card points an interface at an origin outside the trusted "
                        "origins while credentials are configured"
                    )
        caps = proto.capabilities
        return AgentCard(
            name=proto.name,
            interfaces=interfaces,
            description=proto.description,
            version=proto.version,
            url=self._card_url or "",
            streaming=caps.streaming,
            push_notifications=caps.push_notifications,
            default_input_modes=tuple(proto.default_input_modes),
            default_output_modes=tuple(proto.default_output_modes),
            skills=tuple(
                AgentSkill(id=s.id, name=s.name, description=s.description, tags=tuple(s.tags))
                for s in proto.skills
            ),
            raw=MappingProxyType(MessageToDict(proto)),
        )

    async def _send(
        self, text: str, context_id: str | None, task_id: str | None, return_immediately: bool
    ) -> Task:
        session = await self._ready()
        request = _message_request(text, context_id, task_id, return_immediately)
        op = "send"
        responses = session.unary.send_message(request, context=self._call_context(None))
        try:
            async for response in responses:
                payload = response.WhichOneof("payload")
                if payload == "task":
                    return _task(op, response.task, self._secrets())
                if payload == "message":
                    message = _message(op, response.message, self._secrets())
                    return Task(
                        id=message.task_id,
                        context_id=message.context_id,
                        state=TaskState.COMPLETED,
                        status_message=message,
                        history=(message,),
                    )
                raise ProtocolError(op, "response holds neither a task nor a message")
        except (AdaptorError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self._map(op, exc) from exc
        finally:
            await _aclose_quietly(responses)
        raise ProtocolError(op, "empty response")

    async def _get_task(self, op: str, task_id: str, timeout: float | None) -> Task:
        from a2a.types import GetTaskRequest

        session = await self._ready()
        try:
            proto = await session.unary.get_task(
                GetTaskRequest(id=task_id), context=self._call_context(timeout)
            )
        except (AdaptorError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self._map(op, exc) from exc
        return self._answer_for(op, task_id, self._converted(op, functools.partial(_task, op, proto, self._secrets())))

    def _answer_for(self, op: str, task_id: str, task: Task) -> Task:
        """``task``, answered for ``task_id``, unless it is another task: the remote's mistake
        (a stream "recovered" with it ended as if the stream's task had, which went on)."""
        if task.id != task_id:
            raise ProtocolError(
                op, f"answer for another task ({task.id!r:.80}, not {task_id!r:.80})",
                raw=_raw(f"task {task.id}", self._secrets()),
            )
        return task

    async def _cancel_task(self, task_id: str, timeout: float | None) -> Task:
        from a2a.types import CancelTaskRequest
        from a2a.utils.errors import TaskNotCancelableError

        session = await self._ready()
        try:
            proto = await session.unary.cancel_task(
                CancelTaskRequest(id=task_id), context=self._call_context(timeout)
            )
        except (AdaptorError, asyncio.CancelledError):
            raise
        except TaskNotCancelableError as exc:
            _scrub_chain(exc, self._secrets())
            task = await self._get_task("cancel_task", task_id, timeout)
            if task.state.terminal:
                return task
            raise ProtocolError("cancel_task", "task not cancelable", exc) from exc
        except Exception as exc:
            raise self._map("cancel_task", exc) from exc
        return self._answer_for(
            "cancel_task", task_id,
            self._converted("cancel_task", functools.partial(_task, "cancel_task", proto, self._secrets())),
        )

    async def _events(
        self, op: str, state: _StreamState, open_: Callable[[], AsyncIterator[pb.StreamResponse]]
    ) -> AsyncGenerator[StreamEvent, None]:
        dropped: BaseException | None = None
        started = False
        responses = open_()
        try:
            while True:
                try:
                    response = await anext(responses)
                except StopAsyncIteration:
                    dropped = ConnectionError(f"A2A {op}: the stream ended before a final event")
                    break
                except (AdaptorError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    mapped = self._map(op, exc, stream=True)
                    # Only a stream that started can drop; one refused at once (a 429 with its
                    # Retry-After, a 5xx) is that refusal, as for the unary calls.
                    if isinstance(mapped, ConnectionError) and state.task_id and started:
                        dropped = mapped
                        break
                    raise mapped from exc
                started = True
                event = self._converted(op, functools.partial(_stream_event, op, response, self._secrets()))
                other = state.foreign(event)
                if other:
                    # (Taken as the stream's, another task's final event ended it as if the
                    # remote had finished this one, which went on unwatched.)
                    raise ProtocolError(
                        op, f"event of another task ({other!r:.80}, not {state.task_id!r:.80})",
                        raw=_raw(_json(response), self._secrets()),
                    )
                state.observe(event)
                yield event
                if isinstance(event, TerminalEvent | MessageEvent):
                    return
                if isinstance(event, TaskEvent) and event.task.state.final:
                    # A task that arrives whole and final (an agent that answers in one piece)
                    # is the stream's end: the server closes it next.  Read on, that close was
                    # taken for a drop and "recovered" with a fetch the server may not answer.
                    yield _terminal_of(event.task, recovered=False)
                    return
        finally:
            await _aclose_quietly(responses)
        assert dropped is not None
        if not state.task_id:
            raise dropped
        try:
            task = await self._bounded(op, None, lambda: self._get_task(op, state.task_id, None))
        except asyncio.CancelledError:
            raise
        except Exception:
            # The cause is the disconnection (what the caller needs to judge a retry); the
            # failed fetch stays reachable as the context.
            raise StreamRecoveryError(state.task_id, dropped) from dropped
        if not task.state.final:
            raise StreamRecoveryError(state.task_id, dropped) from dropped
        yield _terminal_of(task, recovered=True)

    async def _aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            for sdk_client in (session.unary, session.streaming):
                with contextlib.suppress(Exception):
                    await sdk_client.close()
        if self._http is not None:
            await self._http.aclose()

    # -- helpers

    def _converted(self, op: str, convert: Callable[[], T]) -> T:
        """``convert()``: a response it cannot take (metadata holding a number JSON has no
        value for, ``Infinity``) is the remote's malformed response, as :meth:`_send` says."""
        try:
            return convert()
        except AdaptorError:
            raise
        except Exception as exc:
            raise self._map(op, exc) from exc

    def _call_context(self, timeout: float | None) -> ClientCallContext:
        from a2a.client import ClientCallContext

        return ClientCallContext(timeout=timeout if timeout is not None else self._timeout)

    def _secrets(self) -> tuple[str, ...]:
        if self._auth is None:
            return ()
        try:
            values = list(self._auth.headers().values())
        except Exception:
            return ()
        # The header value and the bare credential after its scheme ("Bearer <token>").
        values += [value.split(None, 1)[1] for value in values if " " in value.strip()]
        return tuple(v for v in values if len(v) >= 4)

    def _map(self, op: str, exc: BaseException, *, stream: bool = False) -> BaseException:
        return _map_error(op, exc, self._secrets(), stream=stream)


class EventStream(Iterator[StreamEvent]):
    """Events of one remote task execution; iterate it, or call ``next_event(timeout)`` to wait
    with a bound.

    The stream stops after the first final event (a ``TerminalEvent`` or a ``MessageEvent``);
    a ``TaskEvent`` whose task is final is followed by its ``TerminalEvent``.
    A stream that drops before it is recovered with one fetch of the task (a ``TerminalEvent``
    with ``recovered=True``) or fails with ``StreamRecoveryError``.  ``close()`` (or leaving a
    ``with`` block) stops reading and releases the connection; it does not cancel the task.
    """

    def __init__(
        self,
        runner: _LoopThread,
        events: AsyncGenerator[StreamEvent, None],
        state: _StreamState,
    ) -> None:
        self._runner = runner
        self._events = events
        self._state = state
        self._pending: concurrent.futures.Future[StreamEvent] | None = None
        self._step_task: asyncio.Task[StreamEvent] | None = None
        self._done = False  # no further event will be delivered
        self._closed = False  # the generator (and its HTTP response) was released
        self._lock = threading.Lock()

    @property
    def task_id(self) -> str:
        """The remote task id, once an event named it."""
        return self._state.task_id

    @property
    def context_id(self) -> str:
        return self._state.context_id

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> StreamEvent:
        event = self.next_event()
        if event is None:
            raise StopIteration
        return event

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def ended(self) -> bool:
        """The stream is over: its final event was delivered, it failed or it was closed."""
        return self._done

    def next_event(self, timeout: float | None = None) -> StreamEvent | None:
        """The next event, or None when none arrived within ``timeout`` seconds (0 polls) or
        the stream has ended (``ended`` tells which).  After a timeout the stream stays usable
        and the next call keeps waiting for the same event.  One consumer at a time."""
        _waiting.seconds("timeout", timeout)  # 0 or less polls; NaN is refused
        with self._lock:
            if self._done:
                return None
            if self._pending is None:
                self._pending = self._runner.submit(self._step())
            pending = self._pending
        try:
            done, _ = concurrent.futures.wait([pending], timeout)
        except BaseException:
            self.close()  # e.g. KeyboardInterrupt: do not leave a read running
            raise
        if not done:
            return None
        with self._lock:
            self._pending = None
        if pending.cancelled():  # closed from another thread meanwhile
            self._done = True
            return None
        try:
            event = pending.result()
        except StopAsyncIteration:
            self._done = True
            return None
        except BaseException:
            self._done = True
            raise
        if isinstance(event, TerminalEvent | MessageEvent):
            self.close()  # the final event: release the connection now, not at GC
        return event

    def close(self) -> None:
        """Stop reading and release the connection.  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = self._done = True
            self._pending = None
        if self._runner.alive:
            with contextlib.suppress(Exception):
                self._runner.run(self._aclose(), timeout=_CLOSE_TIMEOUT)

    async def _step(self) -> StreamEvent:
        self._step_task = asyncio.current_task()
        return await anext(self._events)

    async def _aclose(self) -> None:
        step = self._step_task
        if step is not None and not step.done():
            # An in-flight read must finish before the generator can be closed.
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        await self._events.aclose()


# --- internals ----------------------------------------------------------------------------------


@dataclass
class _StreamState:
    task_id: str = ""
    context_id: str = ""

    def foreign(self, event: StreamEvent) -> str:
        """The task ``event`` names when that is not the stream's task ("": none, or its own)."""
        if isinstance(event, TaskEvent):
            named = event.task.id
        elif isinstance(event, MessageEvent):
            named = event.message.task_id
        else:
            named = event.task_id
        return named if named and self.task_id and named != self.task_id else ""

    def observe(self, event: StreamEvent) -> None:
        if isinstance(event, TaskEvent):
            self.task_id, self.context_id = event.task.id, event.task.context_id
        elif isinstance(event, MessageEvent):
            self.context_id = event.message.context_id or self.context_id
        else:
            self.task_id = event.task_id or self.task_id
            self.context_id = event.context_id or self.context_id


@dataclass
class _Session:
    card: AgentCard
    proto: pb.AgentCard
    unary: SDKClient
    streaming: SDKClient

    @classmethod
    def create(cls, card: AgentCard, proto: pb.AgentCard, http: httpx.AsyncClient) -> _Session:
        from a2a.client import ClientConfig, ClientFactory

        def make(streaming: bool) -> SDKClient:
            config = ClientConfig(
                streaming=streaming,
                httpx_client=http,
                supported_protocol_bindings=list(_BINDINGS),
            )
            try:
                return ClientFactory(config).create(proto)
            except ValueError as exc:
                raise InvalidAgentCardError(
                    "agent card offers no interface this client can use", cause=exc
                ) from exc

        return cls(card=card, proto=proto, unary=make(False), streaming=make(True))


class _LoopThread:
    """One asyncio loop on a daemon thread; the SDK's async clients live on it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._loop is not None and not self._loop.is_closed()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure())

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            # KeyboardInterrupt or a timeout: do not leave the request running on the loop.
            future.cancel()
            raise

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._thread = None
        if loop is None or thread is None:
            return
        # Whatever still runs (a blocked send in another thread) ends with CancelledError
        # instead of waiting forever on a stopped loop, and the async generators still open
        # (the SDK's and httpx's streams) are closed while the loop can run their cleanup.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_wind_down(loop), loop).result(_CLOSE_TIMEOUT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_TIMEOUT)
        if not thread.is_alive():
            loop.close()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="adaptor-a2a-client", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            elif self._thread is None:
                raise RuntimeError("the A2A client is closed")
            return self._loop


async def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    await _cancel_others()
    # A generator collected without being closed schedules its aclose() as a task: without
    # this, the loop stopped with such a task pending ("Task was destroyed but it is
    # pending! ... async_generator_athrow" at exit).
    await loop.shutdown_asyncgens()
    await _cancel_others()


class _ResponseTooLarge(Exception):
    """A remote's answer (or one SSE event of it) over its bound; ``_map_error`` makes it a
    ``ProtocolError``."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        super().__init__(f"{what} larger than {limit} bytes")


async def _bound_response(response: httpx.Response) -> None:
    """httpx's response hook: the body is read through a bounded stream, so an answer over its
    bound fails while it arrives instead of after it was held whole."""
    limit = response.request.extensions.get(_MAX_BYTES_EXTENSION, MAX_RESPONSE_BYTES)
    events = "text/event-stream" in response.headers.get("content-type", "")
    response.stream = _bounded_stream_class()(response.stream, limit, events=events)


@functools.cache
def _bounded_stream_class() -> Callable[..., httpx.AsyncByteStream]:
    import httpx  # httpx checks the type of a response's stream; imported on first use

    class BoundedStream(httpx.AsyncByteStream):
        """A response's raw byte stream that stops at ``limit`` bytes: in all, or, for an SSE
        stream (``events``), since the last event's end (a blank line)."""

        def __init__(self, inner: Any, limit: int, *, events: bool) -> None:
            self._inner = inner
            self._limit = limit
            self._events = events

        async def __aiter__(self) -> AsyncIterator[bytes]:
            held = 0
            tail = b""  # the end of the previous chunk: an event's end may straddle two
            async for chunk in self._inner:
                if self._events:
                    window = tail + chunk
                    ends = [
                        window.rfind(sep) + len(sep) for sep in _SSE_EVENT_ENDS if sep in window
                    ]
                    end = max(ends, default=0)
                    # An end inside the tail was seen with the previous chunk.
                    held = len(window) - end if end > len(tail) else held + len(chunk)
                    tail = window[-3:]
                else:
                    held += len(chunk)
                if held > self._limit:
                    what = "an event" if self._events else "the answer"
                    raise _ResponseTooLarge(self._limit, what)
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    return BoundedStream


# A blank line ends an SSE event, whichever line ending the remote uses.
_SSE_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")


async def _cancel_others() -> None:
    # Cancelling a task can leave others behind (the cleanup it schedules): again, briefly.
    for _ in range(3):
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        if not others:
            return
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


async def _aclose_quietly(iterator: AsyncIterator[Any]) -> None:
    # The SDK types its streams as AsyncIterator; they are async generators holding an HTTP
    # response open until closed.
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


# -- argument checks: a caller's wrong argument is a TypeError or ValueError naming it, never an
# error blamed on the remote agent (a task id of 123 came back as a "malformed response").


def _check_message(text: object, context_id: object, task_id: object) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {type(text).__name__}")
    for name, value in (("context_id", context_id), ("task_id", task_id)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")


def _check_task_id(op: str, task_id: object) -> None:
    if not isinstance(task_id, str | type(None)):
        raise TypeError(f"{op}: the task id must be a str, not {type(task_id).__name__}")
    if not task_id:
        raise ValueError(f"{op} needs a task id")


def _check_timeout(name: str, timeout: object) -> None:
    seconds = _waiting.seconds(name, timeout)
    if seconds is not None and seconds <= 0:
        raise ValueError(f"{name} must be positive or None")


def _split_card_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path if parts.path not in ("", "/") else _WELL_KNOWN_CARD_PATH
    return base, path + (f"?{parts.query}" if parts.query else "")


def _is_absolute(url: str) -> bool:
    try:
        origin_of(url)
    except ValueError:
        return False
    return True


def _message_request(
    text: str, context_id: str | None, task_id: str | None, return_immediately: bool
) -> pb.SendMessageRequest:
    from a2a.types import Message as ProtoMessage
    from a2a.types import Part as ProtoPart
    from a2a.types import Role, SendMessageConfiguration, SendMessageRequest

    message = ProtoMessage(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=[ProtoPart(text=text)],
        context_id=context_id or "",
        task_id=task_id or "",
    )
    return SendMessageRequest(
        message=message,
        configuration=SendMessageConfiguration(return_immediately=return_immediately),
    )


# -- proto -> model


def _json(proto: ProtoMessage) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    found: dict[str, Any] = MessageToDict(proto)
    return found


def _metadata(proto: pb.Part | pb.Message | pb.Artifact | pb.Task) -> Mapping[str, Any]:
    return MappingProxyType(_json(proto.metadata)) if proto.HasField("metadata") else _EMPTY


def _state(op: str, value: int, secrets: tuple[str, ...], what: ProtoMessage) -> TaskState:
    from a2a.types import TaskState as ProtoState

    try:
        name = ProtoState.Name(value)
    except ValueError:
        name = ""
    state = name.removeprefix("TASK_STATE_").lower()
    if state not in TaskState.__members__.values():
        raise ProtocolError(op, "unknown or missing task state", raw=_raw(_json(what), secrets))
    return TaskState(state)


def _part(op: str, proto: pb.Part, secrets: tuple[str, ...]) -> Part:
    kind = proto.WhichOneof("content")
    common: dict[str, Any] = {
        "media_type": proto.media_type,
        "filename": proto.filename,
        "metadata": _metadata(proto),
    }
    if kind == "text":
        return Part(kind="text", text=proto.text, **common)
    if kind == "data":
        from google.protobuf.json_format import MessageToDict

        return Part(kind="data", data=MessageToDict(proto.data), **common)
    if kind == "url":
        return Part(kind="url", url=proto.url, **common)
    if kind == "raw":
        return Part(kind="raw", raw=proto.raw, **common)
    raise ProtocolError(op, "malformed part: no content", raw=_raw(_json(proto), secrets))


def _message(op: str, proto: pb.Message, secrets: tuple[str, ...]) -> Message:
    role = {1: "user", 2: "agent"}.get(int(proto.role), "")
    return Message(
        message_id=proto.message_id,
        role=role,  # type: ignore[arg-type]
        parts=tuple(_part(op, p, secrets) for p in proto.parts),
        context_id=proto.context_id,
        task_id=proto.task_id,
        metadata=_metadata(proto),
    )


def _artifact(op: str, proto: pb.Artifact, secrets: tuple[str, ...]) -> Artifact:
    return Artifact(
        artifact_id=proto.artifact_id,
        name=proto.name,
        description=proto.description,
        parts=tuple(_part(op, p, secrets) for p in proto.parts),
        metadata=_metadata(proto),
    )


def _status_message(op: str, status: pb.TaskStatus, secrets: tuple[str, ...]) -> Message | None:
    return _message(op, status.message, secrets) if status.HasField("message") else None


def _task(op: str, proto: pb.Task, secrets: tuple[str, ...]) -> Task:
    if not proto.id:
        raise ProtocolError(op, "task without an id", raw=_raw(_json(proto), secrets))
    return Task(
        id=proto.id,
        context_id=proto.context_id,
        state=_state(op, proto.status.state, secrets, proto),
        status_message=_status_message(op, proto.status, secrets),
        artifacts=tuple(_artifact(op, a, secrets) for a in proto.artifacts),
        history=tuple(_message(op, m, secrets) for m in proto.history),
        metadata=_metadata(proto),
    )


def _stream_event(op: str, response: pb.StreamResponse, secrets: tuple[str, ...]) -> StreamEvent:
    payload = response.WhichOneof("payload")
    if payload == "task":
        return TaskEvent(task=_task(op, response.task, secrets))
    if payload == "message":
        return MessageEvent(message=_message(op, response.message, secrets))
    if payload == "status_update":
        update = response.status_update
        state = _state(op, update.status.state, secrets, update)
        if not update.task_id:
            raise ProtocolError(
                op, "malformed event: status without a task id", raw=_raw(_json(update), secrets)
            )
        message = _status_message(op, update.status, secrets)
        if state.final:
            return TerminalEvent(
                task_id=update.task_id, context_id=update.context_id, state=state, message=message
            )
        return StatusEvent(
            task_id=update.task_id, context_id=update.context_id, state=state, message=message
        )
    if payload == "artifact_update":
        update = response.artifact_update
        if not update.task_id:
            raise ProtocolError(
                op, "malformed event: artifact without a task id", raw=_raw(_json(update), secrets)
            )
        return ArtifactEvent(
            task_id=update.task_id,
            context_id=update.context_id,
            artifact=_artifact(op, update.artifact, secrets),
            append=update.append,
            last_chunk=update.last_chunk,
        )
    raise ProtocolError(op, "malformed event: empty payload", raw=_raw(_json(response), secrets))


# -- errors

# How the SDK words a JSON-RPC error whose code it has no class for (it keeps no other trace of
# the code); a code that is not an integer makes the answer malformed.
_REMOTE_RPC_ERROR = re.compile(r"JSON-RPC Error (-?\d+): (.*)", re.DOTALL)
_RAW_LIMIT = 2048
# Secrets shorter than the shared minimum are still redacted here: they are the credentials of
# an auth header, never configuration that could look like a number or a word.
_MIN_SECRET_LENGTH = 4


def _redactor(secrets: tuple[str, ...]) -> Redactor:
    return Redactor(secrets, min_length=_MIN_SECRET_LENGTH)


def _raw(value: Any, secrets: tuple[str, ...]) -> str:
    """``value`` as bounded text with credentials removed (for ``ProtocolError.raw``)."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    text = redact_credentials(_redactor(secrets).text(text))
    return text if len(text) <= _RAW_LIMIT else text[:_RAW_LIMIT] + "...(truncated)"


def _scrub_chain(exc: BaseException, secrets: tuple[str, ...]) -> None:
    """Remove ``secrets`` from the SDK exceptions behind ``exc``, in place.

    They become the cause chain of the error raised to the caller, which its wire form,
    tracebacks and logs show; a remote agent that echoes the credential in an error message
    (or a URL carrying one) must not put it there.
    """
    _redact_foreign_chain(exc)
    redactor = _redactor(secrets)
    if not redactor:
        return
    redact_error(exc, redactor)
    for node in errors._walk(exc):
        # An a2a-sdk error's ``data`` is the remote's JSON, which its repr() shows: a secret
        # still in it after redaction (a numeric token, say) takes the whole of it away.
        data = getattr(node, "data", None)
        if data is not None and redactor.text(repr(data)) != repr(data):
            with contextlib.suppress(AttributeError):
                node.data = None  # type: ignore[attr-defined]


def _redact_foreign_chain(exc: BaseException) -> None:
    """Credential-looking text (a URL's ``api_key=...``, a password in it) out of the messages
    of the foreign exceptions behind ``exc``, in place.

    httpx names the URL it failed on (``... for url 'https://host/card?api_key=...'``) and the
    a2a-sdk repeats it: the wire form redacted it, but the exceptions themselves kept it for
    every traceback and ``%r`` in a log.
    """
    for node in errors._walk(exc):
        if isinstance(node, AdaptorError):
            continue
        with contextlib.suppress(AttributeError, TypeError):
            args = tuple(redact_credentials(a) if isinstance(a, str) else a for a in node.args)
            if args != node.args:
                node.args = args
            message = getattr(node, "message", None)  # the a2a-sdk's errors keep it here too
            if isinstance(message, str) and redact_credentials(message) != message:
                node.message = redact_credentials(message)  # type: ignore[attr-defined]


def _terminal_of(task: Task, *, recovered: bool) -> TerminalEvent:
    """The terminal event a final ``task`` snapshot ends its stream with."""
    return TerminalEvent(
        task_id=task.id,
        context_id=task.context_id,
        state=task.state,
        message=task.status_message,
        recovered=recovered,
        task=task,
    )


def _chained(err: BaseException, cause: BaseException) -> BaseException:
    err.__cause__ = cause
    return err


def _map_error(
    op: str, exc: BaseException, secrets: tuple[str, ...], *, stream: bool = False
) -> BaseException:
    """The taxonomy error for an exception raised by the SDK (or httpx beneath it)."""
    import httpx
    from a2a.client.errors import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
    from a2a.utils import errors as sdk
    from google.protobuf.json_format import ParseError

    if isinstance(exc, AdaptorError):
        return exc
    if isinstance(exc, _ResponseTooLarge):
        return ProtocolError(op, f"{exc.what} larger than {exc.limit} bytes", exc)
    _scrub_chain(exc, secrets)
    malformed = "malformed event" if stream else "malformed response"
    if isinstance(exc, RecursionError):
        # JSON nested deeper than the parser, or the SDK's conversion of it, recurses through:
        # what the remote sent, never a failure of the caller's program.
        if op == "agent_card":
            return InvalidAgentCardError("the agent card is nested too deeply to read", cause=exc)
        return ProtocolError(op, f"{malformed}: nested too deeply to read", exc)
    if isinstance(exc, sdk.TaskNotFoundError):
        return NotFoundError(f"A2A {op}: task not found", cause=exc)
    if isinstance(
        exc,
        sdk.UnsupportedOperationError
        | sdk.ContentTypeNotSupportedError
        | sdk.MethodNotFoundError
        | sdk.VersionNotSupportedError
        | sdk.ExtensionSupportRequiredError
        | sdk.PushNotificationNotSupportedError,
    ):
        return UnsupportedError(f"A2A {op}: not supported by the remote agent", cause=exc)
    if isinstance(exc, AgentCardResolutionError):
        return _map_card_error(exc)
    if isinstance(exc, A2AClientTimeoutError):
        return _chained(TimeoutError(f"A2A {op}: timed out"), exc)
    if isinstance(exc, A2AClientError):
        cause = exc.__cause__
        if isinstance(cause, httpx.HTTPStatusError):
            response = cause.response
            return _map_status(
                op, response.status_code, exc, secrets, response.headers.get("Retry-After")
            )
        if isinstance(cause, httpx.TimeoutException):
            return _chained(TimeoutError(f"A2A {op}: timed out"), exc)
        if isinstance(cause, httpx.RequestError):
            return _chained(ConnectionError(f"A2A {op}: connection failed or dropped"), exc)
        remote = _REMOTE_RPC_ERROR.fullmatch(exc.message) if cause is None else None
        if remote is not None:
            # A well-formed JSON-RPC error whose code the SDK has no class for (a server-defined
            # -32000, say): the remote's answer, not a malformed one.
            code, message = remote.groups()
            return ProtocolError(op, f"remote error {code}", exc, _raw(message, secrets))
        return ProtocolError(op, malformed, exc, _raw(str(exc), secrets))
    if isinstance(exc, sdk.A2AError):
        reason = sdk.A2A_ERROR_REASONS.get(type(exc), type(exc).__name__).lower()
        return ProtocolError(op, reason, exc, _raw(f"{exc.message} {exc.data or ''}", secrets))
    if isinstance(exc, httpx.TimeoutException):
        return _chained(TimeoutError(f"A2A {op}: timed out"), exc)
    if isinstance(exc, httpx.RequestError):
        return _chained(ConnectionError(f"A2A {op}: connection failed or dropped"), exc)
    if isinstance(exc, NotImplementedError):
        return UnsupportedError(f"A2A {op}: not supported", cause=exc)
    if isinstance(exc, ParseError | json.JSONDecodeError | ValueError | KeyError | TypeError):
        return ProtocolError(op, malformed, exc, _raw(f"{type(exc).__name__}: {exc}", secrets))
    return exc


def _map_status(
    op: str,
    status: int,
    exc: BaseException,
    secrets: tuple[str, ...],
    retry_after_header: str | None = None,
) -> BaseException:
    if status in (401, 403):
        return UnauthorizedError(f"A2A {op}: HTTP {status}", cause=exc)
    if status == 501:
        return UnsupportedError(f"A2A {op}: not supported by the remote agent (HTTP 501)", cause=exc)
    # A 5xx is the server failing (or a gateway in front of it), whatever its body says: the
    # request may succeed later, like a timeout or a throttled one.
    if status in (408, 429) or 500 <= status <= 599:
        retry_after = _retry_after_seconds(retry_after_header)
        if retry_after is None:
            unavailable = ConnectionError(f"A2A {op}: remote agent unavailable (HTTP {status})")
        else:
            unavailable = ConnectionError(
                f"A2A {op}: remote agent unavailable (HTTP {status}, retry after {retry_after:g} s)"
            )
            # A builtin error has no field for it: an attribute, documented (docs/a2a.md).
            unavailable.retry_after = retry_after  # type: ignore[attr-defined]
        return _chained(unavailable, exc)
    return ProtocolError(op, f"unexpected HTTP status {status}", exc, _raw(str(exc), secrets))


# Longer than this is not a wait a caller would make on the remote's word (a day).
_RETRY_AFTER_MAX = 86400.0


def _retry_after_seconds(header: str | None) -> float | None:
    """Seconds to wait that a ``Retry-After`` header asks for (RFC 9110: delta-seconds or an
    HTTP-date); None for no header or one that says nothing usable."""
    if header is None:
        return None
    text = header.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), _RETRY_AFTER_MAX)
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000": an HTTP-date is GMT all the same
        moment = moment.replace(tzinfo=UTC)
    wait = (moment - datetime.now(UTC)).total_seconds()
    return min(max(round(wait, 3), 0.0), _RETRY_AFTER_MAX)


def _map_card_error(exc: AgentCardResolutionError) -> BaseException:
    import httpx
    from google.protobuf.json_format import ParseError

    status = exc.status_code
    cause = exc.__cause__
    if status in (401, 403):
        return UnauthorizedError(f"A2A agent_card: HTTP {status}", cause=exc)
    if isinstance(cause, ParseError | json.JSONDecodeError):
        return InvalidAgentCardError("the agent card is not a valid A2A card", cause=exc)
    if status in (404, 410):
        return InvalidAgentCardError(f"no agent card at the URL (HTTP {status})", cause=exc)
    if isinstance(cause, httpx.TimeoutException):
        return _chained(TimeoutError("A2A agent_card: timed out"), exc)
    if status is not None and (status in (408, 429) or 500 <= status <= 599):
        # Throttled or failing, as any call may be: the status and its Retry-After are said.
        header = cause.response.headers.get("Retry-After") if isinstance(cause, httpx.HTTPStatusError) else None
        return _map_status("agent_card", status, exc, (), header)
    return _chained(ConnectionError("A2A agent_card: the agent card is unavailable"), exc)

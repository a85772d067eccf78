"""``adaptord serve --a2a HOST:PORT``: the daemon's configured agents as A2A agents.

Each ``[a2a.agents.<key>]`` table of the config file becomes one A2A 1.0 agent, served with the
``a2a-sdk`` server pieces (an ``AgentExecutor``, the SDK's ``DefaultRequestHandler`` over an
in-memory task store, its Starlette card and JSON-RPC routes) by uvicorn in a thread of the
daemon::

    GET  /agents/<key>/.well-known/agent-card.json   the card (public)
    POST /agents/<key>                               JSON-RPC: SendMessage, SendStreamingMessage,
                                                     GetTask, CancelTask, SubscribeToTask
    GET  /.well-known/agent-card.json                the card, when only one agent is configured

A message becomes one run request: the agent's request template with the message text as the
prompt, dropped into the daemon's own spool.  The bridge never runs an agent itself, so bridge
runs get the same validation, verdicts, audit logs, approvals, ordering and crash rules as any
other request; the task's ``metadata["adaptord.request_id"]`` names it.  While the run goes,
the text it records in its audit log is streamed as WORKING status messages (``metadata
["adaptord.progress"] = "text"``); then the verdict decides the end:

- success: COMPLETED with one ``result`` artifact holding the result text;
- failure: FAILED with a fixed text (``<code>: <fixed message> (<error identity>)``) and the
  closed control object ``metadata["agentadaptor.failure"] = {"code", "limit_ms"?}`` on its part
  (codes: ``agent_error``, ``approval_denied``, ``approval_timeout``, ``deadline_exceeded``,
  ``active_execution_timeout``, ``policy_violation``, ``infrastructure_error``); nothing the run
  printed reaches the caller;
- a cancelled run: CANCELED (code ``cancelled``).

``tasks/cancel`` is ``adaptor cancel``: a cancel marker for the request, then the verdict decides
as above (a run that finished first keeps its own outcome).  Tasks live in memory: after a daemon
restart ``tasks/get`` no longer knows them, while their verdicts stay in the home.

Loopback by default; a non-loopback bind refuses to start unless a bearer token is configured,
and with a token every route but the cards needs ``Authorization: Bearer <token>``.

Needs ``a2a-sdk[http-server]`` and ``uvicorn`` (the test extra has both).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import hmac
import ipaddress
import logging
import math
import re
import resource
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Final

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Part,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.types import Message as A2AMessage
from a2a.utils.errors import MethodNotFoundError, UnsupportedOperationError
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

import adaptor
from adaptor import _home, errors, events
from adaptor.spool import Client as SpoolClient
from adaptord._lifecycle import OneLineLogging
from adaptord.config import A2AConfig, ConfigError, ExposedAgent

__all__ = [
    "AGENTS_PREFIX",
    "CARD_PATH",
    "FAILURES",
    "Bridge",
    "Failure",
    "Listen",
    "RequireBearer",
    "ServerThread",
    "SpoolExecutor",
    "agent_card",
    "build_app",
    "build_request",
    "card_path",
    "check",
    "classify",
    "is_loopback",
    "listening_socket",
    "thread_key",
]

CARD_PATH = "/.well-known/agent-card.json"
AGENTS_PREFIX = "/agents"
DEFAULT_HOST = "127.0.0.1"
REQUEST_ID_KEY = "adaptord.request_id"
PROGRESS_KEY = "adaptord.progress"
FAILURE_KEY = "agentadaptor.failure"
CANCEL_WAIT = 20.0
# At a stop: how long the open tasks may take to get their final states to their callers.
_SETTLE_AT_STOP = 5.0
_FINAL_STATES = frozenset(
    {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
     TaskState.TASK_STATE_REJECTED}
)
# The largest request body served: twice a request file's limit, room for a prompt near that
# limit in JSON-RPC's escaping (such a prompt may still be refused, as the request it makes).
MAX_BODY = 2 * _home.MAX_REQUEST_BYTES

_log = logging.getLogger("adaptord.a2a")
_IDENTITY = re.compile(r"[A-Za-z0-9_.]{1,80}")

# The texts callers see for a failed run: fixed per code, whatever the run said.
FAILURES = {
    "agent_error": "the agent run failed",
    "approval_denied": "approval denied",
    "approval_timeout": "approval timed out",
    "deadline_exceeded": "execution deadline exceeded",
    "active_execution_timeout": "active execution budget exhausted",
    "policy_violation": "the run was stopped by its policy",
    "infrastructure_error": "the run could not be carried out",
    "cancelled": "the run was cancelled",
}

Log = Callable[..., None]


def _default_log(fact: str, **fields: Any) -> None:
    _log.warning("%s %s", fact, " ".join(f"{k}={v}" for k, v in fields.items()))


# The libraries serving the bridge log through Python logging, which the daemon does not
# configure: their records reached stderr through logging's last-resort handler, as bare text
# and multi-line tracebacks (a malformed request from any caller printed one), some quoting
# what the caller sent.  asyncio and opentelemetry report for them too: a task of theirs left
# pending ("Task was destroyed but it is pending!"), the SDK's tracing spans closed on it
# ("Failed to detach context"), each with a traceback.
_SERVER_LOGGERS = ("a2a", "uvicorn", "asyncio", "opentelemetry")


# --- where to listen ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listen:
    """``--a2a`` parsed: ``HOST:PORT``, ``[IPv6]:PORT``, or ``PORT`` / ``:PORT`` on loopback."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Listen:
        text = text.strip()
        if text.startswith("["):
            host, sep, port = text[1:].partition("]:")
        else:
            host, sep, port = text.rpartition(":")
            if not sep:
                port = text
        if (text.startswith("[") and not sep) or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"--a2a: expected HOST:PORT (port 0-65535), got {text!r}")
        return cls(host or DEFAULT_HOST, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _resolve(listen: Listen) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    try:
        infos = socket.getaddrinfo(
            listen.host, listen.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(f"--a2a {listen}: cannot resolve the host: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    return family, address


def is_loopback(listen: Listen) -> bool:
    """Whether ``listen`` binds a loopback address (judged on the address actually bound)."""
    address = ipaddress.ip_address(str(_resolve(listen)[1][0]).split("%")[0])
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def check(listen: Listen, config: A2AConfig) -> str | None:
    """Refuse a bridge that must not start; return the bearer token callers need (or None)."""
    if not config.agents:
        raise ConfigError(
            "--a2a: no agents to serve; add [a2a.agents.<name>] tables to the config file"
        )
    token = config.token()
    if token is None and not is_loopback(listen):
        raise ConfigError(
            f"--a2a {listen}: refusing to serve A2A on a non-loopback address without a bearer "
            "token; set [a2a] bearer_token_env (or bearer_token) in the config file"
        )
    return token


def listening_socket(listen: Listen) -> socket.socket:
    # Bound and listening before uvicorn starts: early connections wait in the backlog, so no
    # caller has to poll for readiness, and a taken port fails here, in the caller's thread.
    family, address = _resolve(listen)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def _base_url(sock: socket.socket, public_url: str | None) -> str:
    if public_url:
        return public_url
    host, port = sock.getsockname()[:2]
    address = ipaddress.ip_address(host)
    if address.is_unspecified:
        # A wildcard address names no host a caller could reach; cards need one.
        host = socket.getfqdn()
    elif address.version == 6:
        host = f"[{host}]"
    return f"http://{host}:{port}"


# --- credentials -----------------------------------------------------------------------------------


class RequireBearer:
    """Pure ASGI guard: 401 unless ``Authorization: Bearer <token>``; ``open_paths`` (the cards)
    stay public."""

    def __init__(self, app: ASGIApp, token: str, open_paths: Sequence[str] = (CARD_PATH,)) -> None:
        self.app = app
        self.token = token.encode()
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # nothing is served over websockets
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given_all = [value for name, value in scope["headers"] if name == b"authorization"]
            # Two headers: which one counts would be up to whoever reads them; none does.
            given = given_all[0] if len(given_all) == 1 else b""
            # The scheme is case-insensitive (RFC 9110), the token compared in constant time.
            scheme, _, credentials = given.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials, self.token):
                response = JSONResponse(
                    {"error": "unauthorized"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class LoopbackHostsOnly:
    """Pure ASGI guard for a loopback bind: 400 unless the ``Host`` header names a loopback
    address, ``localhost`` or one of ``names`` (the public URL's host).

    A web page can reach a loopback port only as a host name it controls, resolved to
    127.0.0.1 afterwards (DNS rebinding): the browser then treats the bridge as that page's own
    origin and sends it any request.  Such a request names that host, never these.
    """

    def __init__(self, app: ASGIApp, names: Iterable[str] = ()) -> None:
        self.app = app
        self.names = frozenset(name.lower() for name in names) | {"localhost"}

    def _allowed(self, host_header: bytes | None) -> bool:
        if host_header is None:  # HTTP/1.0 without one: no browser sends that
            return True
        text = host_header.decode("latin-1").strip().lower()
        if text.startswith("["):
            host = text[1 : text.find("]")] if "]" in text else ""
        else:
            host = text.rpartition(":")[0] if ":" in text else text
        if host in self.names:
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(dict(scope["headers"]).get(b"host")):
            response = JSONResponse(
                {"error": "the Host header names no address this server answers on"},
                status_code=400,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class LimitBody:
    """Pure ASGI guard: 413 for a request body over ``limit`` bytes, before anything parses it.

    The a2a-sdk keeps every message in its in-memory task history: without a bound, a caller
    could make the daemon hold (and spool, and quarantine) messages of any size, although a
    request over :data:`adaptor._home.MAX_REQUEST_BYTES` is refused anyway.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) <= self.limit:
                await self.app(scope, receive, send)
            else:
                await self._refuse(scope, receive, send)
            return
        # No declared length (chunked): read it here, up to the limit, then hand it on whole.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {"error": f"request body larger than {self.limit} bytes"}, status_code=413
        )
        await response(scope, receive, send)


# --- serving in a thread ---------------------------------------------------------------------------


class _StartupProbe:
    """Reports the app's lifespan startup outcome (and passes everything through)."""

    def __init__(self, app: ASGIApp, on_startup: Callable[[bool], None]) -> None:
        self.app = app
        self.on_startup = on_startup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def probe(message: Message) -> None:
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                self.on_startup(message["type"] == "lifespan.startup.complete")
            await send(message)

        await self.app(scope, receive, probe)


# Peers the bridge serves at once, whatever they send: each holds a descriptor of the daemon,
# which its runs, logs and spool need too.  Without a bound, a peer that opened connections and
# never finished a request (no token is checked before the headers end) took all of them: no
# request, A2A or spool, ran until it let go.  A quarter of the descriptor limit, at most 256.
_MOST_CONNECTIONS_CAP: Final = 256
# How long a connection may take to send a request's headers (from its start, or from the end
# of its previous response): an unfinished request otherwise holds its connection for ever.
HEADERS_TIMEOUT: Final = 10.0
_BUSY_TEXT: Final = b"too many connections; retry later\n"
_BUSY_REPLY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)


def _connection_bounds() -> tuple[int, int]:
    """How many connections the bridge keeps open at once, and how many it accepts in one go
    (each holds a descriptor until it is turned away), from the descriptor limit: together at
    most three eighths of it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 8 * _MOST_CONNECTIONS_CAP
    # (uvicorn passes its backlog to asyncio, which accepts that many connections per turn
    # of the loop before any is looked at: 2,048 by default.  Running out there, CPython 3.11
    # logged "socket.accept() out of system resource" hundreds of times a second.)
    return max(1, min(_MOST_CONNECTIONS_CAP, soft // 4)), max(1, min(_MOST_CONNECTIONS_CAP // 4, soft // 8))


class _BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a bound on open connections and on the time a request's
    headers may take (uvicorn has neither: its keep-alive timer stops at a request's first byte)."""

    most: int = _MOST_CONNECTIONS_CAP
    headers_timeout: float = HEADERS_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.most:
            transport.write(_BUSY_REPLY)
            transport.close()
            return
        self._await_headers()

    def on_response_complete(self) -> None:
        self._await_headers()  # (before: the next pipelined request may start within)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
        waiting_after = self.cycle
        self._headers_timer = self.loop.call_later(self.headers_timeout, self._headers_late, waiting_after)

    def _headers_late(self, waiting_after: object) -> None:
        # A request whose headers came started a cycle of its own: it is the app's to answer.
        if self.cycle is waiting_after and not self.transport.is_closing():
            self.transport.close()


def _bounded_protocol(most: int, headers_timeout: float) -> type[_BoundedH11Protocol]:
    return type("BoundedH11Protocol", (_BoundedH11Protocol,), {"most": most, "headers_timeout": headers_timeout})


class ServerThread:
    """An ASGI app under uvicorn on an already-listening socket, in a daemon thread with its own
    event loop.

    ``start`` waits for the app's lifespan startup so a broken app fails loudly instead of
    serving nothing.  ``stop`` first runs ``before_stop`` on the server's loop (e.g. draining
    the A2A handlers, whose open SSE streams would otherwise hold uvicorn's graceful shutdown
    until its timeout), then stops uvicorn and closes the socket.  A server that ends on its
    own once started (uvicorn raised, or returned) sets :attr:`died` and calls ``on_death``.
    """

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        *,
        name: str,
        before_stop: Callable[[], Coroutine[Any, Any, object]] | None = None,
        graceful_timeout: int = 5,
        headers_timeout: float = HEADERS_TIMEOUT,
        log: Log = _default_log,
        on_death: Callable[[], None] = lambda: None,
    ) -> None:
        self.sock = sock
        self._before_stop = before_stop
        self._log = log
        self._on_death = on_death
        self._started = threading.Event()
        self._ok = False
        self._stopping = False
        # Why the server ended although nobody stopped it; None while it serves (or was stopped).
        self.died: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        most, burst = _connection_bounds()
        config = uvicorn.Config(
            _StartupProbe(app, self._on_startup),
            lifespan="on",
            log_level="warning",
            log_config=None,  # the daemon owns logging; uvicorn must not reconfigure it
            access_log=False,
            timeout_graceful_shutdown=graceful_timeout,
            http=_bounded_protocol(most, headers_timeout),
            backlog=burst,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _on_startup(self, ok: bool) -> None:
        self._ok = ok
        self._started.set()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self.sock])

        why = "the server stopped serving by itself"
        try:
            asyncio.run(main())
        except BaseException as exc:  # SystemExit too: how uvicorn ends a failed startup
            why = repr(exc)
            self._log("a2a.server_failed", error=why)
        finally:
            self._started.set()  # a server that died early must not leave start() waiting
        if self._ok and not self._stopping:
            self.died = why
            self._on_death()

    def start(self, timeout: float = 15.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout) or not self._ok:
            self.stop()
            raise RuntimeError("the A2A server did not start")

    def stop(self, timeout: float = 15.0) -> None:
        self._stopping = True
        loop = self._loop
        if self._before_stop is not None and loop is not None and self._thread.is_alive():
            drain = self._before_stop()
            try:
                done = asyncio.run_coroutine_threadsafe(drain, loop)
            except RuntimeError:  # the loop has ended already (the server died): nothing to drain
                drain.close()
            else:
                try:
                    done.result(timeout)
                except Exception as exc:  # the server stops anyway; say what was left undone
                    done.cancel()  # not left running on the loop while uvicorn shuts down
                    self._log("a2a.drain_failed", error=repr(exc))
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.sock.close()


# --- cards -----------------------------------------------------------------------------------------


def agent_card(agent: ExposedAgent, base_url: str, *, bearer: bool) -> AgentCard:
    """The card of one served agent; its JSON-RPC interface is ``<base_url>/agents/<key>``."""
    description = agent.description or f"the adaptord agent {agent.key!r}"
    skills = [
        AgentSkill(
            id=str(skill["id"]),
            name=str(skill.get("name") or skill["id"]),
            description=str(skill.get("description") or description),
            tags=[str(tag) for tag in skill.get("tags", ())],
        )
        for skill in agent.skills
    ] or [
        AgentSkill(
            id=agent.key,
            name=agent.name,
            description=description,
            tags=[str(agent.request.get("driver", ""))],
        )
    ]
    card = AgentCard(
        name=agent.name,
        description=description,
        version=adaptor.__version__,
        supported_interfaces=[
            AgentInterface(
                url=f"{base_url}{AGENTS_PREFIX}/{agent.key}",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=skills,
    )
    if bearer:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


# --- failures --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """How a failed run is shown to A2A callers: a closed code, never the run's own words."""

    code: str
    identity: str
    limit_ms: int | None = None

    @property
    def text(self) -> str:
        return f"{self.code}: {FAILURES[self.code]} ({self.identity})"

    @property
    def control(self) -> dict[str, Any]:
        control: dict[str, Any] = {"code": self.code}
        if self.limit_ms is not None:
            control["limit_ms"] = self.limit_ms
        return control


def classify(err: BaseException) -> Failure:
    """The failure code and error identity of a verdict's error (as ``spool.Client.wait``
    rebuilds it)."""
    code = err.wire_code if isinstance(err, errors.AdaptorError) else "external"
    identity = code if _IDENTITY.fullmatch(code) else "unknown"
    run = errors.find(err, errors.RunError)
    limit_ms: int | None = None
    if run is not None:
        kind = run.reason if run.reason in FAILURES else "agent_error"
        limit = run.details.get("limit") if isinstance(run.details, Mapping) else None
        if kind in ("active_execution_timeout", "deadline_exceeded") and isinstance(
            limit, int | float
        ):
            limit_ms = math.ceil(limit * 1000)
    elif errors.find(err, errors.CancelledError) is not None:
        kind = "cancelled"
    elif errors.find(err, errors.DeadlineExceededError) is not None:
        kind = "deadline_exceeded"
    else:
        kind = "infrastructure_error"
    return Failure(kind, identity, limit_ms)


# --- the executor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Outcome:
    result: adaptor.Result | None = None
    error: BaseException | None = None


@dataclass
class _Run:
    """One A2A task's spool request.  ``settled``: its terminal state is published (once)."""

    request_id: str
    updater: TaskUpdater
    settled: bool = False
    cancel_requested: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # Wakes the task's execute (on the loop) once the task is settled from outside it.
    stop_following: Callable[[], None] = lambda: None


def build_request(
    agent: ExposedAgent, prompt: str, task_id: str, context_id: str
) -> dict[str, Any]:
    """The run request for one message: the template, the prompt, and where it came from."""
    request = copy.deepcopy(dict(agent.request))
    request["prompt"] = prompt
    request["metadata"] = {
        **(request.get("metadata") or {}),
        "a2a.agent": agent.key,
        "a2a.task_id": task_id,
        "a2a.context_id": context_id,
    }
    if agent.threads == "per_context" and context_id:
        request["thread"] = {"key": thread_key(agent.key, context_id)}
    return request


# Context ids are the caller's choice: used as they are when they look like ids, otherwise
# (odd characters, great length) replaced by a digest, so a key stays a readable, short name.
_PLAIN_CONTEXT = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def thread_key(agent: str, context_id: str) -> str:
    """The thread that the messages of one A2A context continue: ``a2a/<agent>/<context>``."""
    if _PLAIN_CONTEXT.fullmatch(context_id) is None:
        digest = hashlib.sha256(context_id.encode("utf-8", "surrogatepass")).hexdigest()
        context_id = "sha256-" + digest[:32]
    return f"a2a/{agent}/{context_id}"


def _follow(
    spool: SpoolClient, request_id: str, post: Callable[[str | _Outcome], None], log: Log
) -> None:
    """In a daemon thread: the run's text as its audit log records it, then its outcome.

    A thread of its own rather than the loop's executor: a run left unfinished by a stopping
    daemon never gets a verdict, and an executor thread waiting for one would hold the loop's
    shutdown (and the process's exit) forever.
    """
    try:
        for event in spool.events(request_id, follow=True):
            if isinstance(event, events.TextDelta) and event.phase == "content" and event.text:
                post(event.text)
    except Exception as exc:  # progress is best effort; the verdict below is what counts
        log("a2a: cannot follow a request's events", id=request_id, error=repr(exc))
    try:
        post(_Outcome(result=spool.wait(request_id)))
    except Exception as exc:
        post(_Outcome(error=exc))


def _too_large(request: Mapping[str, Any]) -> str:
    """Why ``request`` is too large for the spool, or "" (what ``submit`` would refuse it for,
    known before the task names a request id that will never be made)."""
    try:
        _home.request_file_bytes({"format": _home.REQUEST_FORMAT, **request})
    except ValueError as exc:  # the only one a message can cause: too large a request
        return f"the message is too large: {exc}"
    return ""


class SpoolExecutor(AgentExecutor):
    """Runs each A2A message as a request through the daemon's spool (see the module doc)."""

    def __init__(
        self,
        agent: ExposedAgent,
        spool: SpoolClient,
        *,
        stopping: Callable[[], bool] = lambda: False,
        cancel_wait: float = CANCEL_WAIT,
        log: Log = _default_log,
    ) -> None:
        self.agent = agent
        self.spool = spool
        self._stopping = stopping
        self._cancel_wait = cancel_wait
        self._log = log
        self._home = _home.Home.at(spool.home)
        self._runs: dict[str, _Run] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        if context.current_task is not None:
            # One message, one run: these tasks never wait for input, so a follow-up message
            # finds its task finished (or queued behind the running message until it is).
            return
        updater = TaskUpdater(event_queue, task_id, context_id)
        prompt = context.get_user_input()
        # Registered under its id before the submission, so a cancel that arrives meanwhile
        # is not lost (see cancel()); the id is in the task's metadata from the start.
        run = _Run(_home.new_request_id(), updater)
        request: dict[str, Any] | None = None
        too_large = ""
        if prompt.strip() and not self._stopping():
            built = build_request(self.agent, prompt, task_id, context_id)
            request = {**built, "id": run.request_id}
            too_large = _too_large(request)
        # No request is made for a message refused here: the task must not name one.
        refused = request is None or bool(too_large)
        # The SDK wants the Task itself before any update about it.
        await event_queue.enqueue_event(
            Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message else [],
                metadata=None if refused else {REQUEST_ID_KEY: run.request_id},
            )
        )
        if not prompt.strip():
            await updater.reject(updater.new_agent_message([Part(text="the message has no text")]))
            return
        if too_large:
            await updater.reject(updater.new_agent_message([Part(text=too_large)]))
            return
        if request is None:
            await self._fail(run, Failure("infrastructure_error", "daemon_stopping"))
            return
        self._runs[task_id] = run
        try:
            try:
                await asyncio.to_thread(self.spool.submit, request)
            except ValueError as exc:  # checked above (_too_large); kept for a spool that differs
                rejected = f"the message is too large: {exc}"
                await updater.reject(updater.new_agent_message([Part(text=rejected)]))
                return
            except Exception as exc:
                self._log("a2a: cannot submit a request", agent=self.agent.key, error=repr(exc))
                await self._fail(run, Failure("infrastructure_error", "spool_unavailable"))
                return
            if run.cancel_requested:
                await asyncio.to_thread(self._request_cancel, run.request_id)
            await updater.start_work()
            async for item in self._progress(run):
                if run.settled:
                    break
                if isinstance(item, str):
                    message = updater.new_agent_message(
                        [Part(text=item)], metadata={PROGRESS_KEY: "text"}
                    )
                    await updater.update_status(TaskState.TASK_STATE_WORKING, message=message)
                else:
                    await self._settle(run, item)
        except asyncio.CancelledError:
            # The SDK cancels this coroutine after tasks/cancel and when the bridge stops: the
            # run must not outlive its task (a request still in the spool is cancelled when the
            # next daemon claims it).
            if not run.settled:
                self._request_cancel(run.request_id)
            raise
        finally:
            self._runs.pop(task_id, None)
            run.done.set()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        run = self._runs.get(task_id)
        if run is None:
            # No run behind the task (its execute has not begun): close it out here.
            await TaskUpdater(event_queue, task_id, context.context_id or "").cancel()
            return
        run.cancel_requested = True
        await asyncio.to_thread(self._request_cancel, run.request_id)
        # The verdict decides the end, published by execute(); waited for here because the SDK
        # cancels execute() as soon as this returns.
        try:
            await asyncio.wait_for(run.done.wait(), self._cancel_wait)
        except TimeoutError:
            await self._fail(run, Failure("cancelled", "context.Canceled"))

    def _request_cancel(self, request_id: str) -> bool:
        """Mark the request for cancelling unless it has its verdict; whether it had one."""
        try:
            if self.spool.verdict(request_id) is not None:
                return True
            _home.request_cancel(self._home, request_id)
        except Exception as exc:
            self._log("a2a: cannot cancel a request", id=request_id, error=repr(exc))
        return False

    async def end_open_tasks(self, deadline: float) -> None:
        """The daemon stopped running requests: give every open task its final state.

        A run with its verdict settles its task as usual (waited for until ``deadline``, a
        ``time.monotonic()`` value); a request without one (queued, or handed back to the
        spool by the drain) is marked for cancelling, so the next start does not run it for a
        caller that is gone, and its task fails with ``infrastructure_error``.
        """
        open_runs = [run for run in self._runs.values() if not run.settled]
        unfinished = await asyncio.to_thread(self._cancel_unfinished, open_runs)
        for run in unfinished:
            await self._fail(run, Failure("infrastructure_error", "daemon_stopping"))
            run.stop_following()  # its execute returns, so the SDK ends the task's stream
        while any(not run.done.is_set() for run in self._runs.values()):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)

    def _cancel_unfinished(self, runs: list[_Run]) -> list[_Run]:
        """Those of ``runs`` without a verdict, each request marked for cancelling."""
        return [run for run in runs if not self._request_cancel(run.request_id)]

    async def _progress(self, run: _Run) -> AsyncIterator[str | _Outcome]:
        """The run's text (coalesced per wake-up), then its outcome."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | _Outcome] = asyncio.Queue()
        request_id = run.request_id
        run.stop_following = lambda: queue.put_nowait(_Outcome())

        def post(item: str | _Outcome) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the bridge stopped
                loop.call_soon_threadsafe(queue.put_nowait, item)

        threading.Thread(
            target=_follow,
            args=(self.spool, request_id, post, self._log),
            name=f"adaptord-a2a-{request_id}",
            daemon=True,
        ).start()
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            text = "".join(item for item in batch if isinstance(item, str))
            if text:
                yield text
            outcome = next((item for item in batch if isinstance(item, _Outcome)), None)
            if outcome is not None:
                yield outcome
                return

    async def _settle(self, run: _Run, outcome: _Outcome) -> None:
        if outcome.error is not None:
            await self._fail(run, classify(outcome.error))
            return
        if run.settled:
            return
        run.settled = True
        text = outcome.result.text if outcome.result is not None else ""
        if text:  # an empty text part is not a valid A2A part
            await run.updater.add_artifact(
                [Part(text=text)],
                artifact_id=f"{run.updater.task_id}-result",
                name="result",
                last_chunk=True,
            )
        await run.updater.complete()

    async def _fail(self, run: _Run, failure: Failure) -> None:
        if run.settled:
            return
        run.settled = True
        message = run.updater.new_agent_message(
            [Part(text=failure.text, metadata={FAILURE_KEY: failure.control})]
        )
        if failure.code == "cancelled":
            await run.updater.cancel(message)
        else:
            await run.updater.failed(message)


# --- the app and the bridge ------------------------------------------------------------------------


class _TaskStore(InMemoryTaskStore):
    """The SDK's in-memory store, keeping only the :data:`KEPT_FINISHED` latest finished tasks.

    The SDK's store keeps every task, with its messages (the caller's prompt) and artifacts,
    for the life of the process: a daemon serving for weeks grew by each task it ever ran,
    some 40 KB for a 20 KB prompt.  A finished task is only there for ``GetTask`` (its
    verdict stays on disk); one still running is never let go.
    """

    def __init__(self, kept_finished: int) -> None:
        super().__init__()
        self._kept_finished = kept_finished
        # Finished tasks, oldest first, with the context their owner is resolved from.
        self._finished: OrderedDict[str, ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await super().save(task, context)
        if task.status.state not in _FINAL_STATES:
            return
        self._finished[task.id] = context
        self._finished.move_to_end(task.id)
        while len(self._finished) > self._kept_finished:
            task_id, saved_by = self._finished.popitem(last=False)
            await super().delete(task_id, saved_by)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._finished.pop(task_id, None)
        await super().delete(task_id, context)


KEPT_FINISHED = 1000
"""Finished A2A tasks kept in memory for ``GetTask`` (docs/a2a.md, "Limits")."""


class _Handler(DefaultRequestHandler):
    """The SDK's handler without ``ListTasks``, refusing messages to a running task at once.

    Knowing a context id is what lets a caller continue a conversation (see docs/a2a.md);
    listing the tasks would hand every caller every context id, prompt and answer.  A message
    naming a task that still runs starts nothing (one message, one run); the SDK held such a
    call until the run ended and then answered with a stale snapshot.  One naming a finished
    task is refused here too, as the SDK would: the SDK set up the task's event queue first
    and left its dispatch task pending, reported with a traceback when it was collected.
    """

    def __init__(self, executor: SpoolExecutor, card: AgentCard) -> None:
        self.executor = executor
        self._tasks = _TaskStore(KEPT_FINISHED)
        super().__init__(agent_executor=executor, task_store=self._tasks, agent_card=card)

    async def _refuse_a_known_task(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        task_id = params.message.task_id
        if not task_id:
            return
        task = await self._tasks.get(task_id, context)
        if task is None:
            return  # the SDK answers not-found
        state = task.status.state
        if state in _FINAL_STATES:
            raise UnsupportedOperationError(
                message=f"Task {task_id} is in terminal state: {TaskState.Name(state)}"
            )
        raise UnsupportedOperationError(
            message=f"task {task_id} is still running; a message to it starts nothing"
        )

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | A2AMessage:
        await self._refuse_a_known_task(params, context)
        result: Task | A2AMessage = await super().on_message_send(params, context)
        return result

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        await self._refuse_a_known_task(params, context)
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise MethodNotFoundError(message="ListTasks is not served by adaptord")



def card_path(key: str) -> str:
    return f"{AGENTS_PREFIX}/{key}{CARD_PATH}"


def build_app(
    agents: Sequence[ExposedAgent],
    base_url: str,
    spool: SpoolClient,
    *,
    token: str | None = None,
    stopping: Callable[[], bool] = lambda: False,
    cancel_wait: float = CANCEL_WAIT,
    log: Log = _default_log,
    loopback_names: Iterable[str] | None = None,
) -> tuple[ASGIApp, list[_Handler]]:
    """One Starlette app serving every agent (see the module doc), and their handlers (drain
    them with ``aclose()`` before stopping the server).  ``loopback_names``: served on a
    loopback address, the host names besides loopback ones a request may name (see
    :class:`LoopbackHostsOnly`)."""
    routes: list[Any] = []
    handlers: list[_Handler] = []
    open_paths: list[str] = []
    for agent in agents:
        card = agent_card(agent, base_url, bearer=token is not None)
        executor = SpoolExecutor(agent, spool, stopping=stopping, cancel_wait=cancel_wait, log=log)
        handler = _Handler(executor, card)
        handlers.append(handler)
        routes += create_agent_card_routes(card, card_url=card_path(agent.key))
        routes += create_jsonrpc_routes(
            handler, rpc_url=f"{AGENTS_PREFIX}/{agent.key}", enable_v0_3_compat=True
        )
        open_paths.append(card_path(agent.key))
        if len(agents) == 1:
            routes += create_agent_card_routes(card)
            open_paths.append(CARD_PATH)
    app: ASGIApp = LimitBody(Starlette(routes=routes), MAX_BODY)
    if token is not None:
        app = RequireBearer(app, token, open_paths)
    if loopback_names is not None:
        app = LoopbackHostsOnly(app, loopback_names)
    return app, handlers


class _InFlight:
    """Counts the HTTP requests being answered, so a stop can wait for their last bytes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._open = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._open += 1
        self._idle.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self._open -= 1
            if not self._open:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> None:
        """Until no request is being answered, or ``timeout`` seconds passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)


class Bridge:
    """The A2A side of ``adaptord serve --a2a``: ``start()`` binds and serves, ``stop()`` drains
    the open tasks and stops.  ``stopping()`` true makes new messages fail at once (the daemon
    no longer claims requests)."""

    def __init__(
        self,
        home: _home.Home,
        config: A2AConfig,
        listen: Listen,
        *,
        stopping: Callable[[], bool] = lambda: False,
        cancel_wait: float = CANCEL_WAIT,
        log: Log = _default_log,
        on_death: Callable[[], None] = lambda: None,
    ) -> None:
        self.home = home
        self.config = config
        self.listen = listen
        self.url = ""
        self._stopping = stopping
        self._cancel_wait = cancel_wait
        self._log = log
        self._on_death = on_death
        self._server: ServerThread | None = None
        self._server_log: OneLineLogging | None = None

    def card_url(self, key: str) -> str:
        return self.url + card_path(key)

    @property
    def died(self) -> str | None:
        """Why the server ended after start-up although :meth:`stop` was not called, or None."""
        server = self._server
        return None if server is None else server.died

    def start(self) -> str:
        """Bind, serve, and return the base URL; ``ConfigError`` when it must not or cannot."""
        token = check(self.listen, self.config)
        try:
            sock = listening_socket(self.listen)
        except OSError as exc:
            raise ConfigError(
                f"--a2a {self.listen}: cannot listen: {exc.strerror or exc}"
            ) from None
        self.url = _base_url(sock, self.config.public_url)
        names = {self.listen.host}
        if self.config.public_url:
            names.add(urllib.parse.urlsplit(self.config.public_url).hostname or "")
        app, handlers = build_app(
            self.config.agents,
            self.url,
            SpoolClient(self.home.root),
            token=token,
            stopping=self._stopping,
            cancel_wait=self._cancel_wait,
            log=self._log,
            loopback_names=names if is_loopback(self.listen) else None,
        )

        in_flight = _InFlight(app)

        async def drain() -> None:
            # Final states first, and the time to send them: closing a handler cuts its
            # tasks' streams off wherever they are.  One budget for all of it, well inside
            # ServerThread.stop's wait, so the handlers are always closed.
            deadline = time.monotonic() + _SETTLE_AT_STOP
            await asyncio.gather(*(h.executor.end_open_tasks(deadline) for h in handlers))
            await in_flight.wait_idle(max(deadline - time.monotonic(), 0.0))
            for handler in handlers:
                await handler.aclose()

        self._server = ServerThread(
            in_flight, sock, name="adaptord-a2a", before_stop=drain, log=self._log, on_death=self._on_death
        )
        if self._log is not _default_log:  # which logs through Python logging itself
            self._server_log = OneLineLogging(self._log, "a2a.server_log", _SERVER_LOGGERS)
            self._server_log.install()
        try:
            self._server.start()
        except RuntimeError as exc:
            self._server = None  # it stopped itself
            self.stop()
            raise ConfigError(f"--a2a {self.listen}: {exc}") from None
        return self.url

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        server_log, self._server_log = self._server_log, None
        if server_log is not None:
            server_log.uninstall()

"""The tool gateway: the Agent's own MCP server for its host-defined tools.

One per Agent, started on the first run that needs it and stopped by ``agent.close()``.  It
serves streamable HTTP on ``127.0.0.1`` at an ephemeral port, path ``/mcp``, in a daemon thread
with its own event loop; every call runs its handler on a thread of its own, so a slow tool, or
one that never returns, never stalls the others (see ``_MAX_HANDLER_THREADS`` for the bound).

Every request must carry ``Authorization: Bearer <secret>``, where the secret is 32 random
bytes made per *run* (:meth:`Gateway.admit`) and refused again once that run is over (a call
arriving between the run's end and then is answered, not run).  Drivers
learn only the *name* of the environment variable holding it
(``ToolsEndpoint.server.bearer_token_env``, random per Agent, so a thread's fingerprint does not
change from run to run); the SDK puts the value into ``Request.env`` so it reaches the CLI's
process without ever being written to argv, a config file, an event or a fingerprint.  Anything
else gets ``401`` before the MCP layer sees it.  The secret also tells which run a call serves:
its handler's :func:`adaptor.tool.cancelled` is that run's.

Tool calls go through :meth:`adaptor.tool.Definition.call`; the gateway publishes no events of
its own (the driver's parser reports the CLI's tool calls).

Needs the ``mcp`` extra (MCP SDK 2.x: ``pip install -e '.[mcp]'`` from a clone).  Without it a run of an
Agent with tools is refused before launch with ``InvalidDefinitionError`` whose cause is the
``ImportError``: the tool set cannot be served, which is a configuration problem of the Agent
(CLI exit code 3), not an infrastructure failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, final

from adaptor import _cpus
from adaptor.driver._spi import MCPServerSpec, ToolsEndpoint
from adaptor.mcp import RESERVED_ENV_PREFIX, RESERVED_KEY
from adaptor.tool import (
    GENERIC_FAILURE,
    CallOutcome,
    Cancellation,
    Definition,
    InvalidDefinitionError,
    _current_cancellation,
    log,
)

if TYPE_CHECKING:
    import anyio

__all__ = ["Admission", "Gateway", "require_sdk"]

HOST: Final = "127.0.0.1"
PATH: Final = "/mcp"
_START_TIMEOUT = 15.0
# How many handler threads of one gateway may be running at once.  A thread cannot be stopped:
# a handler that never returns keeps its thread for the life of the process, also after its
# request was cancelled (the CLI gave up) or its run ended.  anyio's default limiter (40 tokens
# for the whole loop) let such leftovers starve every later call; past this bound a call is
# answered at once with an error result, so the leak stays bounded and the model is told why.
_MAX_HANDLER_THREADS: Final = 256
_TOO_MANY_RUNNING: Final = (
    "this call was not run: the host has too many tool calls still running; try again later"
)
# What close() answers the calls still in flight with, and the calls that arrive while it runs.
_CLOSED_WHILE_RUNNING: Final = CallOutcome(
    text="the host closed its tool server before this call finished; "
    "the tool may still be running, its result is lost",
    is_error=True,
)
_CLOSED_BEFORE_RUNNING: Final = CallOutcome(
    text="this call was not run: the host closed its tool server", is_error=True
)
_CLOSED_BODY: Final = b"the tool server is closed"
# What a call gets whose run ended while its handler ran (only a CLI outliving its run is
# still there to read it): the handler's answer is dropped, as for a call its CLI gave up on.
_RUN_ENDED: Final = CallOutcome(
    text="the run this call was made for has ended; the tool's result was dropped", is_error=True
)
# What a call gets that arrives after its run ended (a CLI still at work while it is stopped).
_NOT_RUN_ENDED: Final = CallOutcome(
    text="this call was not run: the run it was made for has ended", is_error=True
)
_SDK_MODULES: Final = (
    "mcp.types",
    "mcp.server.lowlevel",
    "mcp.server.streamable_http_manager",
    "mcp.server.transport_security",
    "uvicorn",
    "anyio",
    # Imported by the server as it starts: here, so they too are imported whole before a fork
    # (see adaptor._run's _importing_tools).
    "anyio._backends._asyncio",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.off",
)

# The cancellation of the run whose secret the request being served carried (set per request).
_serving: contextvars.ContextVar[Cancellation] = contextvars.ContextVar("adaptor.gateway.run")

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def require_sdk() -> None:
    """Import the MCP SDK now, so a missing extra refuses the run before anything starts."""
    for name in _SDK_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise InvalidDefinitionError(
                # (Not 'adaptor[mcp]': that name on the package index is another project.)
                "host-defined tools need the MCP SDK, the mcp extra: pip install 'mcp>=2,<3' "
                "(from a clone: pip install -e '.[mcp]')",
                cause=exc,
            ) from exc


class Gateway:
    """An authenticated loopback MCP server for one Agent's tools.

    ``start()`` is idempotent and thread-safe; ``close()`` stops the server (idempotent) and
    a closed gateway cannot start again.
    """

    def __init__(
        self, tools: Sequence[Definition], *, max_handler_threads: int = _MAX_HANDLER_THREADS
    ) -> None:
        self._tools = {t.name: t for t in tools}
        self._descriptors = [t.descriptor() for t in tools]
        self.token_env = RESERVED_ENV_PREFIX + secrets.token_hex(8).upper()
        # SHA-256 of each admitted run's "Bearer <secret>" header: looking a presented header up
        # by its digest tells a timing observer nothing about any secret.
        self._admitted: dict[bytes, Cancellation] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._endpoint: ToolsEndpoint | None = None
        self._closed = False
        self._max_handler_threads = max_handler_threads
        self._handler_threads = 0
        self._handler_threads_lock = threading.Lock()
        # Touched only on the gateway's loop: what close() must end before the server stops.
        self._stopping = False
        self._answers: set[asyncio.Future[CallOutcome]] = set()
        self._exchanges: set[_Exchange] = set()

    def admit(self, ended: threading.Event) -> Admission:
        """A secret for one run's CLI; its calls' handlers see ``ended`` as their cancellation.

        The secret is accepted until :meth:`Admission.dismiss`.
        """
        token = secrets.token_urlsafe(32)
        digest = _digest(("Bearer " + token).encode())
        with self._lock:
            self._admitted[digest] = Cancellation(ended)
        return Admission(self, {self.token_env: token}, digest)

    def _dismiss(self, digest: bytes) -> None:
        with self._lock:
            self._admitted.pop(digest, None)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._endpoint else "idle"
        url = self._endpoint.server.url if self._endpoint else ""
        return f"Gateway({state}, tools={sorted(self._tools)!r}, url={url!r})"

    def start(self) -> ToolsEndpoint:
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool gateway is closed")
            if self._endpoint is None:
                self._endpoint = self._start()
            return self._endpoint

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and wait up to ``timeout`` seconds for the server's thread to end.

        Every request in flight gets an answer first (``_stop``), a call still running its
        handler an error result, so none is cut off or waits out uvicorn's graceful timeout.
        """
        with self._lock:
            self._closed = True
            server, loop, thread = self._server, self._loop, self._thread
            self._endpoint = None
        if server is None or loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            loop.call_soon_threadsafe(self._stop, server)
        thread.join(max(timeout, 0.0))

    def _stop(self, server: Any) -> None:
        """On the gateway's loop: end every request in flight, then let uvicorn stop.

        uvicorn gives the requests in flight its graceful timeout, then cancels them and logs
        each as an error with a traceback.  So a call still waiting on its handler is answered
        now (the handler cannot be stopped: it runs on, and its late answer is dropped), a
        request whose body is still coming is refused, and a response that lasts until the
        client leaves is ended.
        """
        self._stopping = True
        for answer in self._answers:
            _settle(answer, _CLOSED_WHILE_RUNNING)
        for exchange in self._exchanges:
            exchange.stop()
        server.should_exit = True  # uvicorn reads it on this loop

    # -- serving ---------------------------------------------------------------------------

    def _start(self) -> ToolsEndpoint:
        import uvicorn

        manager = self._manager()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((HOST, 0))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._asgi_app(manager),
            lifespan="off",
            log_config=None,  # leave the host's logging configuration alone
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                async with manager.run():
                    task = asyncio.ensure_future(server.serve(sockets=[sock]))
                    while not server.started and not task.done():
                        await asyncio.sleep(0.005)
                    ready.set()
                    await task
            except BaseException as exc:
                failure.append(exc)
                raise
            finally:
                ready.set()
                sock.close()

        def run() -> None:
            try:
                asyncio.run(serve())
            except BaseException:  # reported to start() through ``failure``
                pass

        thread = threading.Thread(target=run, name="adaptor-tool-gateway", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread to spare (a task limit): the socket goes with it
            sock.close()
            raise
        if not ready.wait(_START_TIMEOUT) or not server.started:
            server.should_exit = True
            cause = failure[0] if failure else None
            raise RuntimeError("the tool gateway did not start") from cause
        self._server, self._thread = server, thread
        return ToolsEndpoint(
            server=MCPServerSpec(
                key=RESERVED_KEY,
                transport="http",
                url=f"http://{HOST}:{port}{PATH}",
                bearer_token_env=self.token_env,
            ),
            tools=tuple(sorted(self._tools)),
        )

    def _manager(self) -> Any:
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        server: Any = Server(
            RESERVED_KEY, on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )
        return StreamableHTTPSessionManager(
            app=server,
            # Stateless JSON: every call stands alone, so nothing but the calls in flight (and an
            # idle GET stream) lingers for close() to end.
            stateless=True,
            json_response=True,
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=[f"{HOST}:*", "localhost:*"],
                allowed_origins=[f"http://{HOST}:*", "http://localhost:*"],
            ),
        )

    def _asgi_app(self, manager: Any) -> Callable[[_Scope, _Receive, _Send], Awaitable[None]]:
        admitted = self._admitted

        async def app(scope: _Scope, receive: _Receive, send: _Send) -> None:
            if scope["type"] != "http":
                return
            if scope.get("path") != PATH:
                await _plain(send, 404, b"not found")
                return
            presented = b""
            for name, value in scope.get("headers") or ():
                if name.lower() == b"authorization":
                    presented = value
            cancellation = admitted.get(_digest(presented)) if presented else None
            if cancellation is None:
                await _plain(send, 401, b"unauthorized", [(b"www-authenticate", b"Bearer")])
                return
            if self._stopping:
                await _plain(send, 503, _CLOSED_BODY, [(b"connection", b"close")])
                return
            exchange = _Exchange(receive, send)
            self._exchanges.add(exchange)
            serving = _serving.set(cancellation)  # the MCP layer's tasks inherit it
            try:
                with exchange.scope:
                    await manager.handle_request(scope, exchange.receive, exchange.send)
            finally:
                _serving.reset(serving)
                self._exchanges.discard(exchange)
            await exchange.finish()

        return app

    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        from mcp import types

        tools = []
        for d in self._descriptors:
            hints = d.annotations
            annotations = types.ToolAnnotations(
                title=d.title or None,
                read_only_hint=hints.read_only,
                destructive_hint=hints.destructive,
                idempotent_hint=hints.idempotent,
                open_world_hint=hints.open_world,
            )
            output = d.output_schema
            tools.append(
                types.Tool(
                    name=d.name,
                    title=d.title or None,
                    description=d.description,
                    input_schema=dict(d.input_schema),
                    # MCP's structured results are objects; other outputs travel as text.
                    output_schema=dict(output)
                    if output is not None and output.get("type") == "object"
                    else None,
                    annotations=annotations,
                )
            )
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        from mcp import types

        definition = self._tools.get(params.name)
        if definition is None:
            outcome = CallOutcome(text="unknown tool", is_error=True)
        else:
            outcome = await self._run_handler(definition, params.arguments)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=outcome.text)],
            structured_content=dict(outcome.structured) if outcome.structured is not None else None,
            is_error=outcome.is_error,
        )

    async def _run_handler(self, definition: Definition, arguments: Any) -> CallOutcome:
        """``definition.call`` on a thread of its own, awaited without holding a shared token.

        The thread counts against the bound until the handler returns, whatever became of the
        request.  A client that gives up is not noticed here (stateless JSON), so its request
        waits on and the answer is dropped; when the gateway closes, ``_stop`` answers the call
        at once and the handler's answer is dropped too.
        """
        if self._stopping:
            return _CLOSED_BEFORE_RUNNING
        cancellation = _serving.get(None)
        if cancellation is not None and cancellation.is_set():
            return _NOT_RUN_ENDED  # its secret is refused once the run's teardown dismissed it
        if not self._claim_handler_thread():
            return _too_many_running(
                definition, f"{self._max_handler_threads} handler threads are still running"
            )
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[CallOutcome] = loop.create_future()

        def run() -> None:
            if cancellation is not None:  # (in this thread's own context: nothing to reset)
                _current_cancellation.set(cancellation)
            try:
                # A host tool's own work (a build, a test run) gets every CPU of the process,
                # whose own threads a host such as adaptord may keep on one.
                with _cpus.for_children():
                    outcome = definition.call(arguments)
            except BaseException:  # call() contains handler failures; this is a last resort
                log.warning("tool %r failed", definition.name, exc_info=True)
                outcome = CallOutcome(text=GENERIC_FAILURE, is_error=True)
            finally:
                self._release_handler_thread()
            if cancellation is not None and cancellation.is_set():
                outcome = _RUN_ENDED
            with contextlib.suppress(RuntimeError):  # the gateway's loop already ended
                loop.call_soon_threadsafe(_settle, answer, outcome)

        thread = threading.Thread(target=run, name=f"adaptor-tool-{definition.name}", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread to spare (a task limit): the same answer as the bound
            self._release_handler_thread()
            return _too_many_running(definition, "no handler thread could be started")
        self._answers.add(answer)
        try:
            return await answer
        finally:
            self._answers.discard(answer)

    def _claim_handler_thread(self) -> bool:
        with self._handler_threads_lock:
            if self._handler_threads >= self._max_handler_threads:
                return False
            self._handler_threads += 1
            return True

    def _release_handler_thread(self) -> None:
        with self._handler_threads_lock:
            self._handler_threads -= 1


@final
class Admission:
    """One run's way in: the env its CLI needs (secret), until :meth:`dismiss`."""

    __slots__ = ("_digest", "_gateway", "env")

    def __init__(self, gateway: Gateway, env: Mapping[str, str], digest: bytes) -> None:
        self._gateway = gateway
        self._digest = digest
        self.env: Mapping[str, str] = MappingProxyType(dict(env))

    def __repr__(self) -> str:
        return f"Admission({sorted(self.env)!r})"  # names only

    def dismiss(self) -> None:
        """Refuse the secret from now on (idempotent); a call already running goes on."""
        self._gateway._dismiss(self._digest)


def _digest(header: bytes) -> bytes:
    return hashlib.sha256(header).digest()


class _Exchange:
    """One authenticated request in flight, tracked so that ``Gateway._stop`` can end it cleanly.

    ``receive`` and ``send`` wrap the server's to know where the request stands.  Stopped while
    the client is still sending the body, the request is cancelled (``scope``) and refused with
    ``503``.  Stopped after that, a wait for a further message (only a response that lasts until
    the client leaves waits so: the GET event stream) gets ``http.disconnect``, and a response
    left unfinished is ended.  A call waiting on its handler is answered by ``_stop`` itself.
    """

    def __init__(self, receive: _Receive, send: _Send) -> None:
        import anyio

        self._receive, self._send = receive, send
        self.scope = anyio.CancelScope()
        self._listening: anyio.CancelScope | None = None
        self._body_read = False
        self._stopped = False
        self._started = False
        self._ended = False

    def stop(self) -> None:
        self._stopped = True
        if not self._body_read:
            self.scope.cancel()
        elif self._listening is not None:
            self._listening.cancel()

    async def receive(self) -> MutableMapping[str, Any]:
        import anyio

        if not self._stopped:
            self._listening = listening = anyio.CancelScope()
            try:
                with listening:
                    message = await self._receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        self._body_read = True
                    return message
            finally:
                self._listening = None
        return {"type": "http.disconnect"}  # to the application, the server is going away

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self._ended = True
        await self._send(message)

    async def finish(self) -> None:
        """Complete the response ``stop()`` cut short; any other request is left as it is."""
        if not self._stopped:
            return
        if not self._started:
            await _plain(self._send, 503, _CLOSED_BODY, [(b"connection", b"close")])
        elif not self._ended:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})


def _too_many_running(definition: Definition, why: str) -> CallOutcome:
    log.warning("tool %r not run: %s", definition.name, why)
    return CallOutcome(text=_TOO_MANY_RUNNING, is_error=True)


def _settle(answer: asyncio.Future[CallOutcome], outcome: CallOutcome) -> None:
    if not answer.done():  # a cancelled request no longer waits for its answer
        answer.set_result(outcome)


async def _plain(
    send: _Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})

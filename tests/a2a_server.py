"""A real ``a2a-sdk`` server for the A2A tests, built to be reused by the ``adaptord serve --a2a``
bridge tests.

The pieces, each usable alone:

- ``agent_card(base_url, ...)``: a valid A2A 1.0 card whose JSON-RPC interface lives under
  ``base_url``.
- ``build_app(executor, card, ...)``: the SDK's ``DefaultRequestHandler`` over an
  ``InMemoryTaskStore`` mounted with the SDK's card and JSON-RPC Starlette routes; optionally
  guarded by a bearer token, with extra raw routes and a log of the ``Authorization`` headers seen.
- ``serve(make_app)``: uvicorn on 127.0.0.1, ephemeral port, background thread.
- ``ServerProcess``: the same server in a child process, for tests that ``kill -9`` it.
- ``ScriptedExecutor``: an ``AgentExecutor`` whose behaviour is picked by the prompt's first word.

The serving thread (``ServerThread``), the socket (``listening_socket``) and the credential
guard (``RequireBearer``) are the production pieces of ``adaptord serve --a2a``
(``adaptord.a2a_bridge``), so these tests exercise them too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from adaptord.a2a_bridge import Listen, RequireBearer, ServerThread, listening_socket

ROOT = Path(__file__).resolve().parent.parent
CARD_PATH = "/.well-known/agent-card.json"
REST_PREFIX = "/rest"
HOST = "127.0.0.1"


# --- the card -----------------------------------------------------------------------------------


def agent_card(
    base_url: str,
    *,
    name: str = "scripted",
    rpc_path: str = "/",
    streaming: bool = True,
    interface_url: str | None = None,
    binding: str = "JSONRPC",
) -> AgentCard:
    """A card with one 1.0 interface at ``base_url + rpc_path`` (or ``interface_url``); the
    ``HTTP+JSON`` binding is served under ``REST_PREFIX`` by ``build_app``."""
    return AgentCard(
        name=name,
        description="a scripted test agent",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=interface_url or base_url.rstrip("/") + rpc_path,
                protocol_binding=binding,
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )


def card_json(card: AgentCard) -> dict[str, Any]:
    found: dict[str, Any] = MessageToDict(card)
    return found


# --- the executor -------------------------------------------------------------------------------

SECRET_FAILURE_TEXT = "remote says: rm -rf / and token=hunter2"
"""Remote-controlled failure text; delegation errors must never repeat it."""


class ScriptedExecutor(AgentExecutor):
    """Behaviour by the prompt's first word (the rest is the payload):

    ``echo`` (default)  task, WORKING, two artifact chunks ``echo: <payload>``, COMPLETED
    ``message``         a bare agent Message, no task
    ``fail``            WORKING, then FAILED with ``SECRET_FAILURE_TEXT``
    ``reject``          REJECTED
    ``canceled``        the remote cancels on its own
    ``input``           INPUT_REQUIRED with a question
    ``big <n>``         one artifact of ``n`` bytes, COMPLETED
    ``hang``            WORKING, then waits until cancelled (``cancel()`` publishes CANCELED)
    ``late <s>``        says nothing for ``s`` seconds, then as ``hang``
    ``whole``           the task in one piece, already COMPLETED, with an artifact ``<payload>``
    ``tokens <n>``      WORKING, one artifact in ``n`` appended chunks ``t0 t1 ...``, COMPLETED

    Cancellations are recorded so a test can wait for the remote side to have seen one.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.cancelled: list[str] = []
        self.started: list[str] = []

    def wait_cancelled(self, task_id: str, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: task_id in self.cancelled, timeout)

    def wait_started(self, count: int = 1, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.started) >= count, timeout)

    def _record(self, bucket: list[str], task_id: str) -> None:
        with self._cond:
            bucket.append(task_id)
            self._cond.notify_all()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        prompt = context.get_user_input()
        verb, _, payload = prompt.partition(" ")
        task_id, context_id = context.task_id or "", context.context_id or ""
        if verb == "message":
            await event_queue.enqueue_event(
                Message(
                    message_id=f"{task_id}-reply",
                    role=Role.ROLE_AGENT,
                    context_id=context_id,
                    parts=[Part(text=f"message: {payload}")],
                )
            )
            return
        if verb == "whole":
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
                    artifacts=[Artifact(artifact_id=f"{task_id}-out", parts=[Part(text=payload)])],
                )
            )
            return
        updater = TaskUpdater(event_queue, task_id, context_id)
        if verb == "late":
            self._record(self.started, task_id)  # the task exists; its stream names it later
            await asyncio.sleep(float(payload))
            verb = "hang"
        if context.current_task is None:
            # The SDK requires the Task itself before any status or artifact update.
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message] if context.message else [],
                )
            )
        if task_id not in self.started:
            self._record(self.started, task_id)
        await updater.start_work(updater.new_agent_message([Part(text="working")]))
        if verb == "fail":
            await updater.failed(updater.new_agent_message([Part(text=SECRET_FAILURE_TEXT)]))
        elif verb == "reject":
            await updater.reject(updater.new_agent_message([Part(text=SECRET_FAILURE_TEXT)]))
        elif verb == "canceled":
            await updater.cancel()
        elif verb == "input":
            await updater.requires_input(updater.new_agent_message([Part(text="which branch?")]))
        elif verb == "big":
            await updater.add_artifact([Part(text="x" * int(payload or "0"))], name="big")
            await updater.complete()
        elif verb == "tokens":
            count = int(payload or "0")
            for index in range(count):
                await updater.add_artifact(
                    [Part(text=f"t{index} ")],
                    artifact_id=f"{task_id}-out",
                    append=index > 0,
                    last_chunk=index == count - 1,
                )
            await updater.complete()
        elif verb == "hang":
            await asyncio.Event().wait()  # the framework cancels this task on CancelTask
        else:
            artifact_id = f"{task_id}-out"
            text = f"echo: {payload or prompt}"
            half = len(text) // 2
            await updater.add_artifact(
                [Part(text=text[:half])], artifact_id=artifact_id, name="out", last_chunk=False
            )
            await updater.add_artifact(
                [Part(text=text[half:])], artifact_id=artifact_id, append=True, last_chunk=True
            )
            await updater.complete(updater.new_agent_message([Part(text="done")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        self._record(self.cancelled, task_id)
        await TaskUpdater(event_queue, task_id, context.context_id or "").cancel()


# --- the app ------------------------------------------------------------------------------------


@dataclass
class HeaderLog:
    """What ``Authorization`` header (or None) each request carried, by path."""

    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def authorizations(self, path: str | None = None) -> list[str | None]:
        return [auth for p, auth in list(self.seen) if path is None or p == path]


class _LogHeaders:
    def __init__(self, app: ASGIApp, log: HeaderLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            auth = dict(scope["headers"]).get(b"authorization")
            self.log.seen.append((scope["path"], auth.decode() if auth is not None else None))
        await self.app(scope, receive, send)


def build_app(
    executor: AgentExecutor,
    card: AgentCard,
    *,
    bearer_token: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    header_log: HeaderLog | None = None,
    seed: Sequence[Task] = (),
) -> ASGIApp:
    """The SDK's request handler and routes as one ASGI app: the card, JSON-RPC at ``/`` and
    HTTP+JSON under ``REST_PREFIX``.

    ``seed`` tasks are stored before the first request (as if an earlier run of the server had
    finished them).  The handler is drained when the server stops so no executor outlives it.
    """
    store = InMemoryTaskStore()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=store, agent_card=card)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        for task in seed:
            await store.save(task, ServerCallContext())
        yield

    starlette = Starlette(
        routes=[
            *extra_routes,
            *create_agent_card_routes(card),
            *create_jsonrpc_routes(handler, rpc_url="/"),
            # Last: the REST routes include a catch-all "/{tenant}" mount.
            *create_rest_routes(handler, path_prefix=REST_PREFIX),
        ],
        lifespan=lifespan,
    )
    starlette.state.a2a_handler = handler
    app: ASGIApp = starlette
    if bearer_token is not None:
        app = RequireBearer(app, bearer_token)
    if header_log is not None:
        app = _LogHeaders(app, header_log)
    return app


def redirect_route(path: str, target: str, status_code: int = 307) -> BaseRoute:
    """A raw route answering every POST/GET with a redirect to ``target`` (307 keeps the body)."""
    from starlette.routing import Route

    async def endpoint(_: Any) -> Response:
        return Response(status_code=status_code, headers={"Location": target})

    return Route(path, endpoint, methods=["GET", "POST"])


def raw_sse_route(path: str, frames: Sequence[str]) -> BaseRoute:
    """A raw route answering POST with the given SSE ``data:`` payloads, verbatim."""
    from starlette.routing import Route

    async def endpoint(_: Any) -> Response:
        body = "".join(f"data: {frame}\n\n" for frame in frames)
        return Response(body, media_type="text/event-stream")

    return Route(path, endpoint, methods=["POST"])


def another_tasks_end_frames() -> list[str]:
    """SSE payloads of a stream that names task ``t1``, then ends another task."""
    frames = [
        {"task": {"id": "t1", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}},
        {"statusUpdate": {"taskId": "someone-else", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}},
    ]
    return [json.dumps({"jsonrpc": "2.0", "id": "1", "result": frame}) for frame in frames]


def raw_json_route(path: str, body: Any) -> BaseRoute:
    """A raw route answering POST with ``body`` as its JSON document, verbatim."""
    from starlette.routing import Route

    async def endpoint(_: Any) -> Response:
        return Response(json.dumps(body), media_type="application/json")

    return Route(path, endpoint, methods=["POST"])


def status_route(
    path: str,
    status_code: int,
    body: str = "server failure",
    headers: Mapping[str, str] | None = None,
    methods: Sequence[str] = ("POST",),
) -> BaseRoute:
    """A raw route answering every POST (or ``methods``) with ``status_code``, a plain-text
    ``body`` and ``headers``."""
    from starlette.routing import Route

    async def endpoint(_: Any) -> Response:
        return Response(
            body, status_code=status_code, media_type="text/plain", headers=dict(headers or {})
        )

    return Route(path, endpoint, methods=list(methods))


SSE_EVENT_HEAD = (
    b'data: {"jsonrpc": "2.0", "id": 1, "result": {"statusUpdate": {"taskId": "t", '
    b'"contextId": "c", "status": {"state": "TASK_STATE_WORKING", "message": {"messageId": '
    b'"m", "role": "ROLE_AGENT", "parts": [{"text": "'
)
"""The start of an SSE event whose text part a ``Trickle`` can make endless."""


class Trickle:
    """A misbehaving remote's answer: HTTP 200 and ``head``, then ``total`` bytes of ``fill``, one
    every ``interval`` seconds, to every GET and POST at ``path``.

    ``sent`` counts the bytes of the trickle (``fill`` times up to ``total``) sent so far; ``over`` is set when it stopped,
    because all was sent or because the caller went away (Starlette cancels a streaming answer
    when its client disconnects).  A caller that gives up early leaves ``sent`` far below
    ``total``: what the tests check instead of how long anything took.
    """

    def __init__(
        self,
        path: str,
        *,
        total: int = 400,
        interval: float = 0.05,
        fill: bytes = b" ",
        head: bytes = b"",
        media_type: str = "application/json",
    ) -> None:
        self.path = path
        self.total = total
        self.interval = interval
        self.fill = fill
        self.head = head
        self.media_type = media_type
        self.sent = 0
        self.requests = 0
        self.started = threading.Event()  # a request came in
        self.over = threading.Event()

    def route(self) -> BaseRoute:
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        async def body() -> Any:
            try:
                if self.head:
                    yield self.head
                for _ in range(self.total):
                    await asyncio.sleep(self.interval)
                    yield self.fill
                    self.sent += len(self.fill)
            finally:
                self.over.set()

        async def endpoint(_: Any) -> Response:
            self.requests += 1
            self.started.set()
            return StreamingResponse(body(), media_type=self.media_type)

        return Route(self.path, endpoint, methods=["GET", "POST"])

    @classmethod
    def endless(cls, path: str, head: bytes, media_type: str = "application/json") -> Trickle:
        """256 MiB as fast as the client reads it, far beyond any bound a test sets.

        ``sent`` counts what went into the socket, which is more than the client read: the
        loopback buffers take tens of MiB (``tcp_rmem`` up to 32 MiB here, plus ``tcp_wmem``)
        before the server blocks, so a quarter of the whole must dwarf them.  (16 MiB was once
        seen 4.4 MiB "sent" to a client that stopped at 256 KiB.)
        """
        return cls(path, total=4096, interval=0, fill=b"x" * (64 << 10), head=head, media_type=media_type)

    def gave_up_early(self, within: float = 60.0) -> bool:
        """The caller went away after a small part of the trickle (a generous margin)."""
        return self.over.wait(within) and self.sent < self.total * len(self.fill) // 4


# --- serving in a thread ------------------------------------------------------------------------


def _listening_socket(port: int = 0) -> socket.socket:
    return listening_socket(Listen(HOST, port))


@dataclass
class Running:
    base_url: str
    port: int
    app: ASGIApp

    @property
    def card_url(self) -> str:
        return self.base_url + CARD_PATH

    @property
    def origin(self) -> str:
        return self.base_url


@contextlib.contextmanager
def serve(make_app: Callable[[str], ASGIApp]) -> Iterator[Running]:
    """Run ``make_app(base_url)`` under uvicorn on 127.0.0.1 in a daemon thread.

    The SDK handler (if any) is drained before the server stops, so no executor outlives it.
    """
    sock = _listening_socket()
    port = sock.getsockname()[1]
    base_url = f"http://{HOST}:{port}"
    app = make_app(base_url)
    handler = _handler_of(app)
    server = ServerThread(
        app,
        sock,
        name=f"a2a-server-{port}",
        before_stop=handler.aclose if handler is not None else None,
    )
    server.start()
    try:
        yield Running(base_url=base_url, port=port, app=app)
    finally:
        server.stop()


def _handler_of(app: Any) -> Any:
    while app is not None:
        state = getattr(app, "state", None)
        if state is not None and hasattr(state, "a2a_handler"):
            return state.a2a_handler
        app = getattr(app, "app", None)
    return None


def scripted_server(
    *,
    executor: ScriptedExecutor | None = None,
    bearer_token: str | None = None,
    header_log: HeaderLog | None = None,
    streaming: bool = True,
    card_interface_url: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> contextlib.AbstractContextManager[Running]:
    """``serve`` a ``ScriptedExecutor`` behind its own card (the common case)."""
    chosen = executor or ScriptedExecutor()

    def make(base_url: str) -> ASGIApp:
        card = agent_card(base_url, streaming=streaming, interface_url=card_interface_url)
        return build_app(
            chosen,
            card,
            bearer_token=bearer_token,
            header_log=header_log,
            extra_routes=extra_routes,
        )

    return serve(make)


# --- serving in a child process (for kill -9) ---------------------------------------------------


class ServerProcess:
    """A scripted server in a child process on a fixed or ephemeral port.

    ``kill()`` is SIGKILL: open streams see the connection die mid-body.  ``restart(seed=...)``
    starts a new process on the same port whose store already holds ``seed`` tasks.
    """

    def __init__(self, port: int = 0, seed: Sequence[Task] = (), tmp: Path | None = None) -> None:
        self._tmp = tmp
        self.proc: subprocess.Popen[str] | None = None
        self.port = self._start(port, seed)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def card_url(self) -> str:
        return self.base_url + CARD_PATH

    def _start(self, port: int, seed: Sequence[Task]) -> int:
        argv = [sys.executable, "-m", "tests.a2a_server", "--port", str(port)]
        if seed:
            assert self._tmp is not None, "seeding needs a tmp directory"
            seed_file = self._tmp / f"seed-{port}-{len(seed)}.json"
            seed_file.write_text(json.dumps([MessageToDict(task) for task in seed]))
            argv += ["--seed", str(seed_file)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"a2a test server did not start: {line!r}")
        return int(line.split()[1])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start(self.port, ())

    def restart(self, seed: Sequence[Task] = ()) -> None:
        self.kill()
        self._start(self.port, seed)

    def close(self) -> None:
        self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def finished_task(task_id: str, context_id: str, state: str = "TASK_STATE_COMPLETED") -> Task:
    """A stored task in ``state`` (a ``TaskState`` name) with one text artifact, for seeding a
    restarted server."""
    task: Task = ParseDict(
        {
            "id": task_id,
            "contextId": context_id,
            "status": {"state": state},
            "artifacts": [
                {"artifactId": f"{task_id}-out", "parts": [{"text": "finished offline"}]}
            ],
        },
        Task(),
    )
    return task


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=Path)
    args = parser.parse_args(argv)
    seed = (
        [ParseDict(obj, Task()) for obj in json.loads(args.seed.read_text())] if args.seed else []
    )
    sock = _listening_socket(args.port)
    port = sock.getsockname()[1]
    app = build_app(ScriptedExecutor(), agent_card(f"http://{HOST}:{port}"), seed=seed)
    print(f"PORT {port}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    _main()

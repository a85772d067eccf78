"""The HTTP plumbing both mock model servers share: a threaded server on 127.0.0.1, an
ephemeral port, a request log, JSON and chunked SSE replies, and prompt shutdown.

Each mock is stateless like the real APIs' happy path: a reply depends only on the request body
and the mock's current ``scenario``, so resumed sessions and retries need no setup.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class Stop(Exception):
    """Raised inside a handler when the server is shutting down mid-reply."""


class MockServer:
    """Base class: subclasses implement :meth:`handle` for one parsed request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                owner._dispatch(self, None)

            def do_HEAD(self) -> None:
                owner._dispatch(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                owner._dispatch(self, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request log -----------------------------------------------------------------------------

    def logged(self, path_part: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if path_part in r["path"]]

    def _dispatch(self, handler: BaseHTTPRequestHandler, body: dict[str, Any] | None) -> None:
        entry = {
            "method": handler.command,
            "path": handler.path,
            "headers": {k.lower(): v for k, v in handler.headers.items()},
            "body": body,
            "time": time.time(),
        }
        with self._lock:
            self.requests.append(entry)
        try:
            self.handle(Reply(handler, self._stopping), entry)
        except (Stop, BrokenPipeError, ConnectionResetError):
            handler.close_connection = True

    def handle(self, reply: Reply, request: dict[str, Any]) -> None:
        raise NotImplementedError


class Reply:
    """Writes one response: plain JSON, or SSE with chunked transfer encoding."""

    def __init__(self, handler: BaseHTTPRequestHandler, stopping: threading.Event) -> None:
        self._handler = handler
        self._stopping = stopping

    def json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.body(status, json.dumps(obj).encode(), headers=headers)

    def body(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """``data`` as it is, as an ``application/json`` answer (which it may not be)."""
        h = self._handler
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.send_header("request-id", "req_mock")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def sse(self, events: Iterable[tuple[str, Any] | float]) -> None:
        """Stream ``(event name, data)`` pairs; a float in the sequence is a pause (seconds).
        Data given as bytes goes out as it is (not JSON, if so)."""
        h = self._handler
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("cache-control", "no-cache")
        h.send_header("transfer-encoding", "chunked")
        h.send_header("request-id", "req_mock")
        # The connection is closed after the stream (below), so the client must be told: a
        # client that pooled it would send its next request into the closing socket and get
        # ECONNRESET, which a loaded machine made the real claude CLI hit.
        h.send_header("connection", "close")
        h.end_headers()
        for item in events:
            if isinstance(item, float | int):
                self.pause(float(item))
                continue
            name, data = item
            payload = data if isinstance(data, bytes) else json.dumps(data).encode()
            self._chunk(f"event: {name}\ndata: ".encode() + payload + b"\n\n")
        self._chunk(b"")
        h.close_connection = True

    def pause(self, seconds: float) -> None:
        # Wakes early when the server stops, so a test's teardown never waits on a slow reply.
        if self._stopping.wait(seconds):
            raise Stop

    def _chunk(self, data: bytes) -> None:
        w = self._handler.wfile
        w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        w.flush()

"""A WebSocket server on 127.0.0.1 that sends a text frame every few seconds and never closes
its connections: what a watcher of a live event feed sees (test code)."""

from __future__ import annotations

import base64
import hashlib
import socket
import threading
from types import TracebackType

_ACCEPT_MAGIC = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, section 1.3


class TickingWebSocket:
    def __init__(self, every: float = 2.0) -> None:
        self._every = every
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self._listener.getsockname()[1]}/events"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> TickingWebSocket:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stopped.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            key = b""
            for line in request.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"sec-websocket-key":
                    key = value.strip()
            accept = base64.b64encode(hashlib.sha1(key + _ACCEPT_MAGIC).digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            tick = 0
            try:
                while not self._stopped.is_set():
                    tick += 1
                    text = f"event {tick}".encode()
                    conn.sendall(bytes([0x81, len(text)]) + text)  # one unmasked text frame
                    self._stopped.wait(self._every)
            except OSError:
                return

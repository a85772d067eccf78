"""A mock Gemini API (``v1beta``) for running the real ``gemini`` CLI offline (test code).

The CLI reaches it through ``GOOGLE_GEMINI_BASE_URL`` (``shared/reference/real-clis.md`` §5).
Each prompt makes two requests: the model router's classifier call
(``POST /v1beta/models/<m>:generateContent`` with a JSON response schema), answered here with
the smallest value that fits the schema, then the chat turn
(``POST /v1beta/models/<m>:streamGenerateContent?alt=sse``).  ``:countTokens`` answers a fixed
count.

The reply depends only on the request and :attr:`GeminiMock.scenario`:

- an error ``status`` answers every request with that status and a Google API error body
  (``error``, when given, is that body's ``error`` object, e.g. a quota failure);
- when the last turn carries a ``functionResponse``, the reply is the text
  ``"Tool result was: <response JSON>"`` (so a scripted tool turn always ends);
- else ``tool`` makes the model call that function (if the request offers it); otherwise the
  model says ``text``, streamed one word per SSE event.

``delay`` pauses a chat turn before its first event (cancellation tests); ``truncate``,
``end_early`` and ``garbled`` break the stream after its first event (see :class:`Scenario`).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field, replace
from typing import Any

from tests.drivers._mockhttp import MockServer, Reply

DEFAULT_TEXT = "Hello from the mock Gemini server."

_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True)
class Scenario:
    text: str = DEFAULT_TEXT
    tool: tuple[str, dict[str, Any]] | None = None
    status: int | None = None
    error: dict[str, Any] | None = None
    delay: float = 0.0
    # The stream ends after its first chunk, without the chunked body's end: a broken stream.
    truncate: bool = False
    # The stream ends after its first chunk as a whole body does, but without a finishReason.
    end_early: bool = False
    # The stream's second event is not JSON.
    garbled: bool = False
    usage: dict[str, int] = field(
        default_factory=lambda: {"promptTokenCount": 20, "candidatesTokenCount": 6,
                                 "cachedContentTokenCount": 0}
    )


class GeminiMock(MockServer):
    def __init__(self, scenario: Scenario | None = None) -> None:
        super().__init__()
        self.scenario = scenario or Scenario()

    def configure(self, **changes: Any) -> None:
        self.scenario = replace(self.scenario, **changes)

    def chats(self) -> list[dict[str, Any]]:
        """The bodies of every chat turn (``streamGenerateContent``), in order."""
        return [r["body"] for r in self.logged(":streamGenerateContent")]

    def handle(self, reply: Reply, request: dict[str, Any]) -> None:
        path = str(request["path"]).split("?", 1)[0]
        if request["method"] != "POST" or ":" not in path:
            _error(reply, 404, f"no route {path}")
            return
        method = path.rsplit(":", 1)[1]
        scenario = self.scenario
        if scenario.error is not None and scenario.status is not None:
            reply.json(scenario.status, {"error": scenario.error})
            return
        if scenario.status is not None:
            _error(reply, scenario.status, f"mock error {scenario.status}")
            return
        body = request["body"] or {}
        if method == "countTokens":
            reply.json(200, {"totalTokens": scenario.usage["promptTokenCount"]})
        elif method == "generateContent":
            reply.json(200, self._generate(scenario, body))
        elif method == "streamGenerateContent":
            if scenario.delay:
                reply.pause(scenario.delay)
            _DataSSE.of(reply).send(self._stream(scenario, body), truncate=scenario.truncate,
                                    end_early=scenario.end_early, garbled=scenario.garbled)
        else:
            _error(reply, 404, f"no method {method}")

    def _generate(self, scenario: Scenario, body: dict[str, Any]) -> dict[str, Any]:
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        text = json.dumps(smallest(schema)) if schema is not None else scenario.text
        return _chunk([{"text": text}], scenario.usage, final=True)

    def _stream(self, scenario: Scenario, body: dict[str, Any]) -> list[dict[str, Any]]:
        contents = body.get("contents") or []
        last_parts = (contents[-1].get("parts") or []) if contents else []
        answered = [p["functionResponse"] for p in last_parts if "functionResponse" in p]
        if answered:
            text = "Tool result was: " + json.dumps(answered[0].get("response"))
        elif scenario.tool is not None and scenario.tool[0] in _offered(body):
            name, args = scenario.tool
            return [_chunk([{"functionCall": {"name": name, "args": args}}], scenario.usage,
                           final=True)]
        else:
            text = scenario.text
        words = text.split(" ")
        pieces = [w + " " for w in words[:-1]] + [words[-1]]
        return [_chunk([{"text": piece}], scenario.usage, final=i == len(pieces) - 1)
                for i, piece in enumerate(pieces)]


class _DataSSE(Reply):
    """SSE the way Google's API sends it: ``data:`` lines only.  The CLI's parser requires
    every event to start with ``data:``, so the shared helper's ``event:`` lines would break it."""

    @classmethod
    def of(cls, reply: Reply) -> _DataSSE:
        wrapped = cls.__new__(cls)
        wrapped.__dict__.update(vars(reply))
        return wrapped

    def send(self, payloads: list[dict[str, Any]], *, truncate: bool = False,
             end_early: bool = False, garbled: bool = False) -> None:
        h = self._handler
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        h.close_connection = True
        for payload in payloads:
            self._chunk(f"data: {json.dumps(payload)}\r\n\r\n".encode())
            if truncate:
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            if garbled:
                self._chunk(b"data: {not json\r\n\r\n")
            if end_early or garbled:
                break
        self._chunk(b"")


def _chunk(parts: list[dict[str, Any]], usage: dict[str, int], *, final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if final:
        candidate["finishReason"] = "STOP"
    total = usage["promptTokenCount"] + usage["candidatesTokenCount"]
    return {"candidates": [candidate], "usageMetadata": {**usage, "totalTokenCount": total}}


def _offered(body: dict[str, Any]) -> set[str]:
    return {str(d.get("name")) for t in body.get("tools") or []
            for d in t.get("functionDeclarations") or [] if isinstance(d, dict)}


def quota_failure(quota_id: str, limit: int) -> dict[str, Any]:
    """The ``error`` of the Gemini API's 429 for a quota ``quota_id`` names (``...PerDay...``,
    ``...PerMinute...``), whose ``limit`` 0 means the project has none.  Per-minute and daily
    quotas share the message; Gemini CLI tells them apart by the ``QuotaFailure`` detail."""
    metric = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
    message = ("You exceeded your current quota, please check your plan and billing details. "
               "For more information on this error, head to: "
               "https://ai.google.dev/gemini-api/docs/rate-limits.\n"
               f"* Quota exceeded for metric: {metric}, limit: {limit}, model: gemini-2.5-flash\n"
               "Please retry in 1.5s.")
    return {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
            {"quotaMetric": metric, "quotaId": quota_id,
             "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
             "quotaValue": str(limit)}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"},
    ]}


def _error(reply: Reply, status: int, message: str) -> None:
    reply.json(status, {"error": {"code": status, "message": message,
                                  "status": _STATUS_NAMES.get(status, "UNKNOWN")}})


def smallest(schema: Any) -> Any:
    """The smallest value that fits a (simple) JSON schema: enough for the router's classifier."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: smallest(properties[name]) for name in schema.get("required") or properties}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return "simple"

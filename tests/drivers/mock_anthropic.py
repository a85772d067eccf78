"""A mock Anthropic Messages API for running the real ``claude`` CLI offline (test code).

``POST /v1/messages`` answers with SSE when the body says ``stream: true`` and with one JSON
message otherwise (Claude Code falls back to a non-streaming request after a broken stream);
``POST /v1/messages/count_tokens`` answers a fixed count.  What the CLI sends and accepts is
described in ``shared/reference/real-clis.md`` §3.2.

The reply depends only on the request and :attr:`AnthropicMock.scenario`:

- an error ``status`` answers every request with that status and an Anthropic error body
  (``error``, when given, is that body's ``error`` object, e.g. "credit balance is too low"),
  which with ``quote_key`` quotes the request's ``x-api-key`` back (as real providers' 401s do);
- when the last user turn carries a ``tool_result``, the reply is the text
  ``"Tool result was: <result>"`` (so a scripted tool turn always ends);
- else ``structured`` (when the request offers the ``StructuredOutput`` tool) or ``tool`` makes
  the model call that tool; otherwise the model says ``text``;
- ``then`` is a second tool the model calls after ``tool``'s result (before saying the result);
  ``"@plan_file@"`` in a tool input stands for the plan file the CLI's plan-mode instructions
  names (the model writes its plan there, then calls ``ExitPlanMode``).

``delay`` pauses after ``message_start`` (cancellation tests); ``truncate`` cuts the stream
after the first text delta of the answer's last text block (the CLI then retries and falls
back to ``stream: false``; with ``more_text``, a second text block after ``text``, the first
block has ended, and the CLI resumes instead: its request saying so is answered whole);
``truncate_tool`` cuts it after the first piece of a tool call's input.

``subagent`` is what a subagent the model starts with the ``Agent`` tool answers (a request
whose first user turn holds the ``prompt`` of ``tool`` or ``then`` is a subagent's); the model's answer to
the tool's result pauses ``subagent_pause`` seconds halfway, so the subagent ends meanwhile,
and a request whose last user turn is Claude Code's ``<task-notification>`` (the subagent's
outcome, handed to the model in a turn of the CLI's own) gets :data:`FOLLOW_UP_TEXT`.  With
``subagent_tool`` the subagent first calls that tool, its reply pausing ``subagent_wait``
seconds before its first block (so the call comes after the main turn's result), then says
``subagent``.  ``subagent_prompt`` marks a subagent's request when no ``prompt`` in the tool's
input does (a ``Workflow`` script's agents).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from tests.drivers._mockhttp import MockServer, Reply

DEFAULT_TEXT = "Hello from the mock Anthropic server."
FOLLOW_UP_TEXT = "The subagent reported back."

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Scenario:
    text: str = DEFAULT_TEXT
    tool: tuple[str, dict[str, Any]] | None = None
    then: tuple[str, dict[str, Any]] | None = None
    structured: Any = None
    status: int | None = None
    error: dict[str, Any] | None = None
    quote_key: bool = False
    delay: float = 0.0
    truncate: bool = False
    garbled: bool = False  # a stream that turns to garbage after its start; its retry's body no JSON
    truncate_tool: bool = False
    more_text: str | None = None
    subagent: str | None = None
    subagent_pause: float = 1.5
    subagent_tool: tuple[str, dict[str, Any]] | None = None
    subagent_prompt: str | None = None
    subagent_wait: float = 0.0
    usage: dict[str, int] = field(
        default_factory=lambda: {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 3}
    )


class AnthropicMock(MockServer):
    def __init__(self, scenario: Scenario | None = None) -> None:
        super().__init__()
        self.scenario = scenario or Scenario()
        self._ids = itertools.count(1)

    def configure(self, **changes: Any) -> None:
        self.scenario = replace(self.scenario, **changes)

    def messages(self) -> list[dict[str, Any]]:
        """The bodies of every ``/v1/messages`` request, in order."""
        return [r["body"] for r in self.logged("/v1/messages") if "count_tokens" not in r["path"]]

    def handle(self, reply: Reply, request: dict[str, Any]) -> None:
        path = request["path"]
        if request["method"] != "POST":
            reply.json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        if "/v1/messages/count_tokens" in path:
            reply.json(200, {"input_tokens": 12})
            return
        if "/v1/messages" not in path:
            reply.json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        scenario = self.scenario
        if scenario.status is not None:
            kind = _ERROR_TYPES.get(scenario.status, "api_error")
            message = f"mock {kind}"
            if scenario.quote_key:
                message = f"Incorrect API key provided: {request['headers'].get('x-api-key', '')}"
            error = scenario.error or {"type": kind, "message": message}
            reply.json(scenario.status, {"type": "error", "error": error})
            return
        body = request["body"] or {}
        if scenario.garbled:
            if not body.get("stream"):
                reply.body(200, b"{not json")
                return
            start = {"type": "message_start", "message": {
                "id": "msg_garbled", "type": "message", "role": "assistant", "model": "claude-mock", "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}
            reply.sse([("message_start", start), ("content_block_delta", b"{not json at all")])
            return
        pause = wait = 0.0
        if scenario.subagent is not None and scenario.tool is not None:
            blocks, pause, wait = self._subagent_flow(scenario, body)
        else:
            blocks = self._answer(scenario, body)
        message_id = f"msg_mock_{next(self._ids)}"
        model = str(body.get("model") or "claude-mock")
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        if body.get("stream"):
            if scenario.truncate and "cut off mid-stream" in json.dumps((body.get("messages") or [None])[-1]):
                scenario = replace(scenario, truncate=False)  # the CLI's resumption: answered whole
            reply.sse(self._events(scenario, message_id, model, blocks, stop_reason, pause, wait))
        else:
            reply.json(
                200,
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": blocks,
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": dict(scenario.usage),
                },
            )

    def _answer(self, scenario: Scenario, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages") or []
        result = _last_tool_result(messages)
        if result is not None and scenario.then is not None and _tool_results(messages) == 1:
            return [self._tool_use(*_with_plan_file(scenario.then, body))]
        if result is not None:
            return [{"type": "text", "text": f"Tool result was: {result}"}]
        offered = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
        if scenario.structured is not None and "StructuredOutput" in offered:
            return [self._tool_use("StructuredOutput", scenario.structured)]
        if scenario.tool is not None:
            return [self._tool_use(*_with_plan_file(scenario.tool, body))]
        if scenario.more_text is not None:
            return [{"type": "text", "text": scenario.text}, {"type": "text", "text": scenario.more_text}]
        return [{"type": "text", "text": scenario.text}]

    def _subagent_flow(
        self, scenario: Scenario, body: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], float, float]:
        """The reply in the ``subagent`` scenario, its pause halfway through its text and its
        pause before its first block."""
        assert scenario.tool is not None and scenario.subagent is not None
        messages = body.get("messages") or []
        users = [_user_text(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        prompts = [str(t[1].get("prompt")) for t in (scenario.tool, scenario.then) if t is not None]
        prompts += [scenario.subagent_prompt] if scenario.subagent_prompt else []
        if users and any(prompt in users[0] for prompt in prompts):
            if scenario.subagent_tool is not None and _last_tool_result(messages) is None:
                return [self._tool_use(*scenario.subagent_tool)], 0.0, scenario.subagent_wait
            return [{"type": "text", "text": scenario.subagent}], 0.0, 0.0
        if users and "<task-notification>" in users[-1]:
            return [{"type": "text", "text": FOLLOW_UP_TEXT}], 0.0, 0.0
        return self._answer(scenario, body), scenario.subagent_pause, 0.0

    def _tool_use(self, name: str, tool_input: Any) -> dict[str, Any]:
        return {"type": "tool_use", "id": f"toolu_mock_{next(self._ids)}", "name": name, "input": tool_input}

    def _events(
        self,
        scenario: Scenario,
        message_id: str,
        model: str,
        blocks: list[dict[str, Any]],
        stop_reason: str,
        pause: float = 0.0,
        wait: float = 0.0,
    ) -> list[tuple[str, Any] | float]:
        usage = scenario.usage
        out: list[tuple[str, Any] | float] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": message_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {
                            "input_tokens": usage["input_tokens"],
                            "output_tokens": 1,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
                        },
                    },
                },
            ),
            ("ping", {"type": "ping"}),
        ]
        if scenario.delay or wait:
            out.append(scenario.delay + wait)
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": {"type": "text", "text": ""}}))
                pieces = _pieces(block["text"])
                last_text = index == max(i for i, b in enumerate(blocks) if b["type"] == "text")
                for number, piece in enumerate(pieces):
                    out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "text_delta", "text": piece}}))
                    if scenario.truncate and last_text:
                        return out  # the connection ends mid-message
                    if pause and number == len(pieces) // 2 - 1:
                        out.append(pause)
            else:
                start = {**block, "input": {}}
                out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": start}))
                raw = json.dumps(block["input"])
                for piece in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                    out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                        "delta": {"type": "input_json_delta",
                                                                  "partial_json": piece}}))
                    if scenario.truncate_tool:
                        return out  # the connection ends mid-call
            out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        out.append(("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                       "usage": {"output_tokens": usage["output_tokens"]}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words) if w or i == 0]


_PLAN_FILE = re.compile(r"create your plan at (\S+\.md)")


def _with_plan_file(tool: tuple[str, dict[str, Any]], body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``tool`` with ``"@plan_file@"`` replaced by the plan file the request names."""
    found = _PLAN_FILE.search(json.dumps(body))
    if found is None:
        return tool
    name, tool_input = tool
    return name, json.loads(json.dumps(tool_input).replace("@plan_file@", found.group(1)))


def _user_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")


def _tool_results(messages: list[Any]) -> int:
    return sum(
        1
        for message in messages
        if isinstance(message, dict) and message.get("role") == "user"
        and isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )


def _last_tool_result(messages: list[Any]) -> str | None:
    """The text of the last user turn's tool_result, or None when that turn has none."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue  # Claude Code inserts role "system" items; skip them like the API would
        content = message.get("content")
        if not isinstance(content, list):
            return None
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    return "".join(p.get("text", "") for p in inner if isinstance(p, dict))
                return str(inner or "")
        return None
    return None

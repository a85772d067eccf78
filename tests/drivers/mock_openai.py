"""A mock OpenAI Responses API for running the real ``codex`` CLI offline (test code).

``POST /v1/responses`` answers with SSE (codex always streams; a non-streaming body gets one
JSON response).  codex reaches it through a custom ``model_provider`` whose ``base_url`` is
``<url>/v1`` (``shared/reference/real-clis.md`` §4.1-§4.2).

The reply depends only on the request and :attr:`OpenAIMock.scenario`:

- a strict ``text.format`` JSON schema with an object that is not closed or leaves a property
  out of ``required`` gets OpenAI's HTTP 400 ``invalid_json_schema``, as the real API does;
- an error ``status`` answers every request with that status and an OpenAI error body
  (``error``, when given, is that body's ``error`` object, e.g. OpenAI's insufficient_quota);
- when the request's last input item is a tool output, the reply is the text
  ``"Tool output was: <output>"``;
- else a requested ``text.format`` JSON schema gets ``structured`` (JSON-encoded text),
  ``call`` makes the model call that function tool (when the request offers it), ``shell``
  makes it run that command through whichever shell tool the request offers, and otherwise
  the model says ``text``.

``delay`` pauses after ``response.created`` (cancellation and timeout tests).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from tests.drivers._mockhttp import MockServer, Reply

DEFAULT_TEXT = "Hello from the mock OpenAI server."
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


@dataclass(frozen=True)
class Scenario:
    text: str = DEFAULT_TEXT
    shell: str | None = None
    call: tuple[str, dict[str, Any]] | None = None
    structured: Any = None
    status: int | None = None
    error: dict[str, Any] | None = None
    delay: float = 0.0
    usage: dict[str, int] = field(
        default_factory=lambda: {"input_tokens": 20, "cached_tokens": 4, "output_tokens": 6}
    )


class OpenAIMock(MockServer):
    def __init__(self, scenario: Scenario | None = None) -> None:
        super().__init__()
        self.scenario = scenario or Scenario()
        self._ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def configure(self, **changes: Any) -> None:
        self.scenario = replace(self.scenario, **changes)

    def responses(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.logged("/responses") if r["method"] == "POST"]

    def handle(self, reply: Reply, request: dict[str, Any]) -> None:
        path = request["path"]
        if request["method"] == "GET" and path.rstrip("/").endswith("/models"):
            reply.json(200, {"object": "list", "data": []})
            return
        if request["method"] != "POST" or not path.split("?")[0].endswith("/responses"):
            reply.json(404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}})
            return
        scenario = self.scenario
        if scenario.status is not None:
            error = scenario.error or {"message": f"mock error {scenario.status}", "type": "mock_error",
                                       "code": str(scenario.status)}
            reply.json(scenario.status, {"error": error})
            return
        body = request["body"] or {}
        refusal = _strict_schema_refusal(body)
        if refusal is not None:
            reply.json(400, {"error": {"message": refusal, "type": "invalid_request_error",
                                       "param": "text.format.schema", "code": "invalid_json_schema"}})
            return
        item = self._answer(scenario, body)
        response_id = f"resp_mock_{next(self._ids)}"
        usage = scenario.usage
        completed = {
            "id": response_id,
            "object": "response",
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "usage": {
                "input_tokens": usage["input_tokens"],
                "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
                "output_tokens": usage["output_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage["input_tokens"] + usage["output_tokens"],
            },
        }
        if not body.get("stream", True):
            reply.json(200, completed)
            return
        created = {**completed, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str, Any] | float] = [
            ("response.created", {"type": "response.created", "response": created}),
            ("response.in_progress", {"type": "response.in_progress", "response": created}),
        ]
        if scenario.delay:
            events.append(scenario.delay)
        events += _item_events(item)
        events.append(("response.completed", {"type": "response.completed", "response": completed}))
        reply.sse(events)

    def _answer(self, scenario: Scenario, body: dict[str, Any]) -> dict[str, Any]:
        items = body.get("input") or []
        last = items[-1] if items and isinstance(items[-1], dict) else {}
        if last.get("type") in _TOOL_OUTPUTS:
            return self._message(f"Tool output was: {_output_text(last.get('output'))}")
        text_format = (body.get("text") or {}).get("format") or {}
        if text_format.get("type") == "json_schema" and scenario.structured is not None:
            return self._message(json.dumps(scenario.structured))
        call: tuple[str, dict[str, Any]] | None = None
        if scenario.call is not None and scenario.call[0] in _offered(body):
            call = scenario.call
        elif scenario.shell is not None:
            call = _shell_call(body.get("tools") or [], scenario.shell)
        if call is not None:
            name, arguments = call
            return {
                "type": "function_call",
                "id": f"fc_mock_{next(self._ids)}",
                "call_id": f"call_mock_{next(self._ids)}",
                "name": name,
                "arguments": json.dumps(arguments),
                "status": "completed",
            }
        return self._message(scenario.text)

    def _message(self, text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": f"msg_mock_{next(self._ids)}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }


def _item_events(item: dict[str, Any]) -> list[tuple[str, Any] | float]:
    pending = {**item, "status": "in_progress"}
    out: list[tuple[str, Any] | float] = [
        ("response.output_item.added",
         {"type": "response.output_item.added", "output_index": 0, "item": pending}),
    ]
    if item["type"] == "message":
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": []}
        out.append(("response.content_part.added", {"type": "response.content_part.added",
                                                    "item_id": item["id"], "output_index": 0,
                                                    "content_index": 0, "part": part}))
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            out.append(("response.output_text.delta", {"type": "response.output_text.delta",
                                                       "item_id": item["id"], "output_index": 0,
                                                       "content_index": 0, "delta": piece}))
        out.append(("response.output_text.done", {"type": "response.output_text.done",
                                                  "item_id": item["id"], "output_index": 0,
                                                  "content_index": 0, "text": text}))
        out.append(("response.content_part.done", {"type": "response.content_part.done",
                                                  "item_id": item["id"], "output_index": 0,
                                                  "content_index": 0,
                                                  "part": {**part, "text": text}}))
    else:
        out.append(("response.function_call_arguments.done",
                    {"type": "response.function_call_arguments.done", "item_id": item["id"],
                     "output_index": 0, "arguments": item["arguments"]}))
    out.append(("response.output_item.done",
                {"type": "response.output_item.done", "output_index": 0, "item": item}))
    return out


def _shell_call(tools: list[Any], command: str) -> tuple[str, dict[str, Any]] | None:
    """Call whichever shell tool the request offers, shaped by that tool's own schema."""
    by_name = {t.get("name"): t for t in tools if isinstance(t, dict)}
    for name in ("exec_command", "shell_command", "shell"):
        tool = by_name.get(name)
        if tool is None:
            continue
        props = (tool.get("parameters") or {}).get("properties") or {}
        if "cmd" in props:
            return name, {"cmd": command}
        if props.get("command", {}).get("type") == "array":
            return name, {"command": ["bash", "-lc", command]}
        return name, {"command": command}
    return None


def _offered(body: dict[str, Any]) -> set[str]:
    return {str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}


def _output_text(output: Any) -> str:
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return str(output or "")


def _strict_schema_refusal(body: dict[str, Any]) -> str | None:
    """OpenAI's answer to a strict response format outside its strict subset (only the rules
    about objects; the real API has more)."""
    text_format = (body.get("text") or {}).get("format") or {}
    if text_format.get("type") != "json_schema" or not text_format.get("strict"):
        return None
    stack: list[Any] = [text_format.get("schema")]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        properties = node.get("properties")
        if isinstance(properties, dict):
            if node.get("additionalProperties") is not False:
                return ("Invalid schema for response_format 'codex_output_schema': "
                        "'additionalProperties' is required to be supplied and to be false.")
            missing = [k for k in properties if k not in (node.get("required") or [])]
            if missing:
                return ("Invalid schema for response_format 'codex_output_schema': 'required' "
                        "is required to be supplied and to be an array including every key in "
                        f"properties. Missing '{missing[0]}'.")
            stack.extend(properties.values())
        stack.extend(v for k, v in node.items() if k not in ("properties", "enum", "const"))
    return None

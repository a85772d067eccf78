"""Helpers for the MCP, host-tool and skill tests against the real CLIs (test code).

- :func:`echo_server` writes a tiny stdio MCP server (official ``mcp`` SDK) with one tool,
  ``echo``, that prefixes its text with ``$ECHO_PREFIX``; :func:`run`, :func:`spawn` and
  :func:`tool_events` pick a run's events apart.
- :func:`anthropic_tool_results` reads the ``tool_result`` blocks a request to the Anthropic
  mock carried: the proof that a tool's answer reached the next model turn.
- :class:`MCPOpenAIMock` makes codex's model call one MCP tool.  codex defers MCP tools behind
  its client-side ``tool_search`` (shared/reference/real-clis.md §4.2): the model first sends a
  ``tool_search_call``, codex answers with a ``tool_search_output`` listing namespaces
  (``mcp__<server>``), and only then can the model send a ``function_call`` with that
  ``namespace``.  ``read_skill`` instead makes the model ``cat`` the ``SKILL.md`` the developer
  instructions point at, through whichever shell tool codex offers.
- :func:`openai_tool_outputs` reads the ``function_call_output`` items of a Responses request.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import _gateway
from adaptor.events import Event, ProcessInfo, ToolCall, ToolResult
from tests.drivers.mock_openai import OpenAIMock, _output_text, _shell_call

_SKILL_FILE = re.compile(r"\(file: (/[^)\s]*/SKILL\.md)\)")

ECHO_SERVER = '''
    import os
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("echo")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text, prefixed with $ECHO_PREFIX."""
        return os.environ.get("ECHO_PREFIX", "<unset>") + text

    server.run()
'''


def echo_server(tmp_path: Path) -> str:
    path = tmp_path / "echo_server.py"
    path.write_text(textwrap.dedent(ECHO_SERVER))
    return str(path)


def run(agent: adaptor.Agent, prompt: str, **options: Any) -> tuple[adaptor.Result, list[Event]]:
    stream = agent.stream(prompt, **options)
    events = list(stream)
    return stream.result(), events


def admissions(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """The env (token variable: secret) each run was admitted to its Agent's gateway with."""
    seen: list[dict[str, str]] = []
    admit = _gateway.Gateway.admit

    def recording(self: _gateway.Gateway, ended: Any) -> _gateway.Admission:
        admission = admit(self, ended)
        seen.append(dict(admission.env))
        return admission

    monkeypatch.setattr(_gateway.Gateway, "admit", recording)
    return seen


def tool_events(events: list[Event]) -> list[tuple[str, str, object, bool | None]]:
    """(kind, name, result, is_error) of the tool call lifecycle, in order."""
    names = {e.id: e.name for e in events if isinstance(e, ToolCall) and e.name}
    return [("call", e.name, e.phase, None) if isinstance(e, ToolCall)
            else ("result", names.get(e.id, ""), e.result, e.is_error)
            for e in events if isinstance(e, ToolCall | ToolResult)
            if not (isinstance(e, ToolCall) and e.phase == "content")]


def spawn(events: list[Event]) -> ProcessInfo:
    return next(e for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")


def anthropic_tool_results(messages: list[Any]) -> list[tuple[str, bool]]:
    """``(text, is_error)`` of every ``tool_result`` block in a Messages request's turns."""
    found = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                text = ("".join(p.get("text", "") for p in inner if isinstance(p, dict))
                        if isinstance(inner, list) else str(inner or ""))
                found.append((text, block.get("is_error") is True))
    return found


def openai_tool_outputs(body: dict[str, Any]) -> list[str]:
    """The text of every ``function_call_output`` in a Responses request's input."""
    return [_output_text(item.get("output")) for item in body.get("input") or ()
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


def openai_texts(body: dict[str, Any], role: str) -> list[str]:
    """The text parts of every ``role`` message in a Responses request's input."""
    return [part.get("text", "") for item in body.get("input") or ()
            if isinstance(item, dict) and item.get("role") == role
            for part in item.get("content") or () if isinstance(part, dict)]


class MCPOpenAIMock(OpenAIMock):
    """The Responses mock with two more scripted behaviours (set at most one):

    ``mcp_tool = (name, arguments)``: search for the tool, then call it in the namespace the
    search returned (``None`` if codex listed no such tool: the call then fails visibly).
    ``read_skill = True``: run ``cat <SKILL.md>`` for the first skill the request announces.
    Once a tool output arrives the base mock's reply applies: ``"Tool output was: ..."``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mcp_tool: tuple[str, dict[str, Any]] | None = None
        self.read_skill = False

    def _answer(self, scenario: Any, body: dict[str, Any]) -> dict[str, Any]:
        items = body.get("input") or []
        last = items[-1] if items and isinstance(items[-1], dict) else {}
        if last.get("type") == "tool_search_output" and self.mcp_tool is not None:
            name, arguments = self.mcp_tool
            namespace = next((ns.get("name") for ns in last.get("tools") or ()
                              for tool in ns.get("tools") or () if tool.get("name") == name), None)
            return {"type": "function_call", "id": f"fc_mock_{next(self._ids)}",
                    "call_id": f"call_mock_{next(self._ids)}", "name": name,
                    "namespace": namespace, "arguments": json.dumps(arguments),
                    "status": "completed"}
        if last.get("type") not in ("function_call_output", "custom_tool_call_output"):
            if self.mcp_tool is not None:
                return {"type": "tool_search_call", "id": f"ts_mock_{next(self._ids)}",
                        "call_id": f"call_mock_{next(self._ids)}", "execution": "client",
                        "arguments": {"query": self.mcp_tool[0]}, "status": "completed"}
            if self.read_skill:
                found = _SKILL_FILE.search("\n".join(openai_texts(body, "developer")))
                call = _shell_call(body.get("tools") or [], f"cat {found.group(1)}") if found else None
                if call is not None:
                    return {"type": "function_call", "id": f"fc_mock_{next(self._ids)}",
                            "call_id": f"call_mock_{next(self._ids)}", "name": call[0],
                            "arguments": json.dumps(call[1]), "status": "completed"}
        return super()._answer(scenario, body)

"""``delegate_to_agent``: the delegator offered to a local agent as a host tool."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._delegator import DelegationRequest, Delegator

if TYPE_CHECKING:
    from adaptor.tool import Definition

TOOL_NAME = "delegate_to_agent"

_OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent": {"type": "string"},
        "status": {"type": "string"},
        "text": {"type": "string"},
        "remote_task_id": {"type": "string"},
        "remote_context_id": {"type": "string"},
    },
    "required": ["agent", "status", "text"],
}


def input_schema(delegator: Delegator) -> dict[str, Any]:
    """The tool's input: one of the registered agent keys and a prompt."""
    agent: dict[str, Any] = {"type": "string"}
    keys = delegator.registry.keys()
    if keys:
        agent["enum"] = keys
    return {
        "type": "object",
        "properties": {
            "agent": agent,
            "prompt": {"type": "string", "minLength": 1},
            "context_id": {"type": "string"},
        },
        "required": ["agent", "prompt"],
        "additionalProperties": False,
    }


def describe(delegator: Delegator) -> str:
    """The model-facing description: host-configured names only, nothing a remote said."""
    lines = ["Delegate a task to a remote agent and return its output. Agents:"]
    for spec in delegator.registry:
        detail = f": {spec.description}" if spec.description else ""
        lines.append(f"- {spec.key} ({spec.name}){detail}")
    return "\n".join(lines)


def handler(
    delegator: Delegator, *, timeout: float | None = None
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The tool handler: arguments in, a JSON object out.

    A ``DelegationError`` reaches the model as ``tool.reject(code, fixed message)`` so the
    model learns what failed (``agent_unavailable``, ``remote_failed``, ...) and never a remote
    agent's own text; its cause chain stays in the host's logs.  When the run that made the
    call ends first (cancelled, out of time), the remote task is cancelled
    (:func:`adaptor.tool.cancelled`).
    """

    def delegate_to_agent(arguments: Mapping[str, Any]) -> dict[str, Any]:
        from adaptor import tool

        from . import DelegationError

        request = DelegationRequest(
            agent=arguments["agent"],
            prompt=arguments["prompt"],
            context_id=arguments.get("context_id") or None,
            timeout=timeout,
            cancel=tool.cancelled(),
        )
        try:
            result = delegator.delegate(request)
        except DelegationError as err:
            raise tool.reject(err.code, err.message) from err
        return {
            "agent": result.agent,
            "status": result.status.value,
            "text": result.text,
            "remote_task_id": result.remote_task_id,
            "remote_context_id": result.remote_context_id,
        }

    return delegate_to_agent


def delegate_to_agent(
    delegator: Delegator, *, name: str = TOOL_NAME, timeout: float | None = None
) -> Definition:
    """``delegator`` as an ``adaptor.tool`` definition (bind the delegator to the leader run's
    sink first to see ``SubagentUpdate`` progress in that run)."""
    from adaptor import tool

    return tool.define(
        name,
        describe(delegator),
        handler(delegator, timeout=timeout),
        input=input_schema(delegator),
        output=_OUTPUT_SCHEMA,
        title="Delegate to a remote agent",
        revision="1",
        read_only=False,
        open_world=True,
    )

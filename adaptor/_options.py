"""Option scopes and merge rules for Agent construction and per-call options."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adaptor.policy import Policy

if TYPE_CHECKING:
    from adaptor.events import ApprovalRequest
    from adaptor.schema import SchemaOptions


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()

SHARED_OPTIONS = (
    "workspace",
    "model",
    "timeout",
    "policy",
    "instructions",
    "append_system_prompt",
    "metadata",
    "skills",
    "mcp",
    "on_approval",
    "spawn",
)
CALL_ONLY_OPTIONS = ("schema", "schema_options")


@dataclass(frozen=True)
class RunOptions:
    """The effective options of one run (agent defaults merged with call options)."""

    workspace: str | None = None
    model: str | None = None
    timeout: float | None = None
    policy: Policy | None = None
    instructions: str | None = None
    append_system_prompt: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    skills: tuple[Any, ...] = ()
    mcp: tuple[Any, ...] | None = None
    on_approval: Callable[[ApprovalRequest], None] | None = None
    spawn: bool = False
    schema: Any = None
    schema_options: SchemaOptions | None = None

    def merged(self, call: Mapping[str, Any]) -> RunOptions:
        """Call options over agent defaults: skills append, metadata merges per key, call wins."""
        unknown = set(call) - set(SHARED_OPTIONS) - set(CALL_ONLY_OPTIONS)
        if unknown:
            raise TypeError(f"unknown run option(s): {', '.join(sorted(unknown))}")
        changes: dict[str, Any] = {}
        for name, value in call.items():
            if value is UNSET:
                continue
            if name == "skills":
                changes["skills"] = self.skills + _sequence(value or (), "skills")
            elif name == "metadata":
                changes["metadata"] = {**self.metadata, **_metadata(value)}
            elif name == "mcp":
                changes["mcp"] = None if value is None else _sequence(value, "mcp")
            else:
                changes[name] = value
        return dataclasses.replace(self, **changes)


def _sequence(value: Any, name: str) -> tuple[Any, ...]:
    # One skill or server passed bare would fail later as "not iterable", or (a Mapping) be
    # taken apart into its keys.
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(f"{name} takes a list, e.g. {name}=[...], not a {type(value).__name__}")
    return tuple(value)


def _metadata(value: Mapping[str, str] | None) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError("metadata must be a mapping of str to str")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError("metadata must be a mapping of str to str")
    return dict(value)


def defaults(
    *,
    workspace: str | None,
    model: str | None,
    timeout: float | None,
    policy: Policy | None,
    instructions: str | None,
    append_system_prompt: str | None,
    metadata: Mapping[str, str] | None,
    skills: Sequence[Any],
    mcp: Sequence[Any] | None,
    on_approval: Callable[[ApprovalRequest], None] | None,
    spawn: bool,
) -> RunOptions:
    return RunOptions(
        workspace=workspace,
        model=model,
        timeout=timeout,
        policy=policy,
        instructions=instructions,
        append_system_prompt=append_system_prompt,
        metadata=_metadata(metadata),
        skills=_sequence(skills, "skills"),
        mcp=None if mcp is None else _sequence(mcp, "mcp"),
        on_approval=on_approval,
        spawn=spawn,
    )

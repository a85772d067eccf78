"""Option scopes and merge rules for Agent construction and per-call options."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adaptor import _waiting
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
                changes["skills"] = self.skills + sequence(value or (), "skills")
            elif name == "metadata":
                changes["metadata"] = {**self.metadata, **_metadata(value)}
            elif name == "mcp":
                changes["mcp"] = None if value is None else sequence(value, "mcp")
            else:
                changes[name] = _checked(name, value)
        return dataclasses.replace(self, **changes)


def _checked(name: str, value: Any) -> Any:
    """``value`` as the option ``name`` takes it, else a TypeError saying what it takes.

    Taken as it came, a value of the wrong type failed deep inside the run, after it started
    (a dict as ``schema_options``), at the first approval (an ``on_approval`` that cannot be
    called), or not at all (a ``model`` of 5 came back in ``Result.model``).
    """
    if value is None or name == "policy":  # (a policy is checked when the run starts)
        return value
    if name == "timeout":
        return _waiting.seconds("timeout", value)
    if name == "workspace":
        if not isinstance(value, str | os.PathLike) or not isinstance(os.fspath(value), str):
            raise TypeError(f"workspace takes a path (str or os.PathLike) or None, not {kind_of(value)}")
        return os.fspath(value)  # drivers, checkpoints and fingerprints see text only
    if name == "spawn":
        if not isinstance(value, bool):
            # Truthiness would read spawn="no" (a config file's string) as yes.
            raise TypeError(f"spawn takes True or False, not {kind_of(value)}")
    elif name in ("model", "instructions", "append_system_prompt"):
        if not isinstance(value, str):
            raise TypeError(f"{name} takes a str or None, not {kind_of(value)}")
    elif name == "on_approval":
        if not callable(value):
            raise TypeError(
                "on_approval takes a callable(ApprovalRequest) or None, e.g. adaptor.approve_all, "
                f"not {kind_of(value)}"
            )
    elif name == "schema_options":
        from adaptor.schema import SchemaOptions

        if not isinstance(value, SchemaOptions):
            raise TypeError(
                f"schema_options takes adaptor.SchemaOptions(...) or None, not {kind_of(value)}"
            )
    return value


def provides(value: object, protocol: type) -> bool:
    """Whether ``value`` (an instance) has every public method ``protocol`` names, as attributes
    it answers for, its own or forwarded through ``__getattr__``.

    What ``isinstance`` against a runtime-checkable Protocol said up to Python 3.11: from 3.12
    it looks the methods up statically, so a wrapper forwarding them (a logging or metrics
    store around another) passed on 3.11 and was refused on 3.12 and later.
    """
    if isinstance(value, type):
        return False
    names = {
        name
        for cls in protocol.__mro__ if cls.__module__ != "typing" and cls is not object
        for name, member in vars(cls).items() if callable(member) and not name.startswith("_")
    }
    return all(callable(getattr(value, name, None)) for name in names)


def kind_of(value: object) -> str:
    """What a wrong argument is, for its TypeError: the type only (a misplaced value may be a
    secret), or the class itself when a class was passed for an instance."""
    if isinstance(value, type):
        return f"the class {value.__qualname__}"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def sequence(value: Any, name: str) -> tuple[Any, ...]:
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
    workspace: str | os.PathLike[str] | None,
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
        workspace=_checked("workspace", workspace),
        model=_checked("model", model),
        timeout=_checked("timeout", timeout),
        policy=policy,
        instructions=_checked("instructions", instructions),
        append_system_prompt=_checked("append_system_prompt", append_system_prompt),
        metadata=_metadata(metadata),
        skills=sequence(skills, "skills"),
        mcp=None if mcp is None else sequence(mcp, "mcp"),
        on_approval=_checked("on_approval", on_approval),
        spawn=_checked("spawn", spawn),
    )

"""The Driver SPI types: descriptor, request, response, sink and session types."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from adaptor.result import RawStreams, StructuredOutput, TranscriptItem, Usage

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from adaptor.events import Event
    from adaptor.policy import Policy


# --- descriptor ---------------------------------------------------------------------------------


@dataclass
class HumanDecisionSupport:
    ask: bool = False
    auto_approve: bool = False
    auto_reject: bool = False
    retry: bool = False


@dataclass
class QuestionSupport:
    ask: bool = False
    auto_reject: bool = False
    retry: bool = False


@dataclass
class RunPolicyCaps:
    isolation: bool = False
    web_search: bool = False
    browser: bool = False
    permission: HumanDecisionSupport = field(default_factory=HumanDecisionSupport)
    plan_review: HumanDecisionSupport = field(default_factory=HumanDecisionSupport)
    question: QuestionSupport = field(default_factory=QuestionSupport)


@dataclass
class StructuredOutputHITL:
    """Which effective ``ask`` kinds a structured-output mechanism tolerates."""

    permission: bool = False
    plan_review: bool = False
    question: bool = False


@dataclass
class StructuredOutputCaps:
    native: bool = False
    prompt_validate: bool = False
    works_with_streaming: bool = True
    native_hitl: StructuredOutputHITL | None = None
    prompt_validate_hitl: StructuredOutputHITL | None = None
    #: The provider takes a native schema only in its strict subset (OpenAI's strict response
    #: format): every object closed and all its properties required, no ``allOf``/``oneOf``/
    #: ``not``/conditionals.  Other schemas go through the prompt instead of being refused.
    native_strict: bool = False


@dataclass
class SessionCaps:
    supports_resume: bool = False


@dataclass
class SkillCaps:
    supported: bool = False
    mode: Literal["unsupported", "ephemeral", "persistent"] = "unsupported"


@dataclass
class MCPCaps:
    supported: bool = False
    stdio: bool = False
    http: bool = False
    sse: bool = False


@dataclass
class ProcessCaps:
    persistent: bool = False


@dataclass
class SystemPromptCaps:
    append: bool = False


@dataclass
class StreamCaps:
    native: bool = False
    token_level: bool = False
    reasoning: bool = False
    tool_call_args: bool = False


@dataclass
class ModelInfo:
    id: str
    label: str = ""


@dataclass
class Descriptor:
    """What a driver can do.  ``descriptor()`` returns a fresh, equal copy on every call."""

    type: str
    display_name: str
    models: list[ModelInfo] = field(default_factory=list)
    sessions: SessionCaps = field(default_factory=SessionCaps)
    skills: SkillCaps = field(default_factory=SkillCaps)
    mcp: MCPCaps = field(default_factory=MCPCaps)
    instructions: bool = False
    workspace: bool = True
    process: ProcessCaps = field(default_factory=ProcessCaps)
    run_policy_caps: RunPolicyCaps = field(default_factory=RunPolicyCaps)
    structured_output: StructuredOutputCaps = field(default_factory=StructuredOutputCaps)
    system_prompt: SystemPromptCaps = field(default_factory=SystemPromptCaps)
    stream: StreamCaps = field(default_factory=StreamCaps)

    def copy(self) -> Descriptor:
        return copy.deepcopy(self)

    def merged(self, overrides: Mapping[str, Any]) -> Descriptor:
        """A copy with a nested dict of overrides merged field by field."""
        return _merge_dataclass(self.copy(), overrides, "descriptor")


_D = TypeVar("_D", bound="DataclassInstance")


def _merge_dataclass(obj: _D, overrides: Mapping[str, Any], path: str) -> _D:
    if not isinstance(overrides, Mapping):
        raise TypeError(f"{path}: expected an object")
    known = {f.name for f in dataclasses.fields(obj)}
    for key, value in overrides.items():
        if key not in known:
            raise ValueError(f"{path}: unknown field {key!r}")
        current = getattr(obj, key)
        if (
            dataclasses.is_dataclass(current)
            and not isinstance(current, type)
            and isinstance(value, Mapping)
        ):
            _merge_dataclass(current, value, f"{path}.{key}")
        elif current is None and isinstance(value, Mapping):
            hint = {f.name: f.type for f in dataclasses.fields(obj)}[key]
            if "StructuredOutputHITL" in str(hint):
                setattr(obj, key, _merge_dataclass(StructuredOutputHITL(), value, f"{path}.{key}"))
            else:
                raise ValueError(f"{path}.{key}: cannot merge an object here")
        else:
            if dataclasses.is_dataclass(current) or isinstance(value, Mapping):
                raise TypeError(f"{path}.{key}: expected an object")
            if isinstance(current, bool) and not isinstance(value, bool):
                raise TypeError(f"{path}.{key}: expected true or false")
            setattr(obj, key, value)
    return obj


# --- sessions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionState:
    """What a driver needs to resume a provider session."""

    resume_id: str
    display_id: str = ""
    data: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"resume_id": self.resume_id, "display_id": self.display_id, "data": dict(self.data)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SessionState:
        return cls(
            resume_id=str(obj.get("resume_id") or ""),
            display_id=str(obj.get("display_id") or ""),
            data={str(k): str(v) for k, v in (obj.get("data") or {}).items()},
        )


@dataclass(frozen=True)
class Checkpoint:
    state: SessionState
    valid: bool = False


SessionMode = Literal["continue_or_start", "continue_only", "fork", "stateless"]


@dataclass(frozen=True)
class SessionContext:
    mode: SessionMode
    state: SessionState | None = None


class SessionCodec(Protocol):
    """Maps session state to stored parameters and back, losslessly."""

    def name(self) -> str: ...
    def encode(self, state: SessionState | None) -> dict[str, Any]: ...
    def decode(self, params: Mapping[str, Any]) -> SessionState | None: ...


# --- decisions (approvals as the driver sees them) ----------------------------------------------

DecisionKind = Literal["permission", "plan_review", "question"]
DecisionResult = Literal["approved", "rejected", "answered", "timed_out", "aborted"]


@dataclass(frozen=True)
class DecisionChoice:
    key: str
    label: str = ""
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class DecisionRequest:
    kind: DecisionKind
    title: str = ""
    request_id: str = ""
    source: str = ""
    tool_call_id: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    choices: Sequence[DecisionChoice] = ()


@dataclass(frozen=True, kw_only=True)
class DecisionResponse:
    request_id: str
    result: DecisionResult
    choice: str = ""
    text: str = ""


# --- request / response -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OutputSchema:
    """A compiled-ready JSON Schema (draft 2020-12) handed to the driver."""

    schema: Mapping[str, Any]
    name: str = ""
    description: str = ""
    schema_hash: str = ""


# --- skills, MCP servers and host tools, as the driver renders them --------------------------------


@dataclass(frozen=True, kw_only=True)
class ResolvedSkill:
    """One selected skill, already staged on disk for this run.

    ``path`` is an absolute directory holding ``SKILL.md`` and the skill's other files, inside
    ``Request.scratch_dir``; it exists only while ``Driver.run`` runs.  ``runtime_name`` is the
    directory name the CLI should see (``[a-z0-9-]``, at most 64 characters, unique in the
    run): link or copy ``path`` to ``<skills root>/<runtime_name>``.  ``fingerprint`` is a
    content hash of the staged files.
    """

    key: str
    runtime_name: str
    path: str
    required: bool = False
    reason: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    fingerprint: str = ""


MCPTransport = Literal["stdio", "http", "sse"]


@dataclass(frozen=True, kw_only=True)
class MCPServerSpec:
    """One validated MCP server for the CLI to connect to.

    ``stdio`` servers use ``command``/``args``/``env``; ``http`` (streamable HTTP) and ``sse``
    servers use ``url``/``headers``/``bearer_token_env``.  The fields of the other transport
    are empty.  ``env`` and ``headers`` values are secrets: write them only to files readable
    by the current user alone (e.g. under ``Request.scratch_dir``) or pass them through the
    process environment, never into events, argv or logs.  ``bearer_token_env`` names an
    environment variable of the CLI's process whose value is the bearer token (send it as
    ``Authorization: Bearer <value>``); the value itself never appears in the request.
    """

    key: str
    transport: MCPTransport
    command: str = ""
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token_env: str = ""
    required: bool = False
    required_reason: str = ""

    def __repr__(self) -> str:
        # Values of env and headers are secrets; their names are enough to debug with.
        parts = [f"key={self.key!r}", f"transport={self.transport!r}"]
        if self.transport == "stdio":
            parts += [f"command={self.command!r}", f"args={list(self.args)!r}",
                      f"env=<{', '.join(sorted(self.env))}>"]
        else:
            parts += [f"url={self.url!r}", f"headers=<{', '.join(sorted(self.headers))}>",
                      f"bearer_token_env={self.bearer_token_env!r}"]
        return f"MCPServerSpec({', '.join(parts)})"


@dataclass(frozen=True, kw_only=True)
class ToolsEndpoint:
    """The Agent's own MCP server serving its host-defined tools.

    Render ``server`` exactly like an entry of ``Request.mcp`` (an ``http`` server with a
    bearer token in the environment variable ``server.bearer_token_env``, which the SDK puts
    into ``Request.env``).  ``tools`` lists the tool names it serves, for CLIs that need an
    allow-list (e.g. ``mcp__<server.key>__<name>``).  The port and variable name change between
    Agents; they are never part of a session fingerprint.
    """

    server: MCPServerSpec
    tools: Sequence[str] = ()


@dataclass(frozen=True, kw_only=True)
class Request:
    """One fully resolved invocation.  Drivers apply all of it on every run.

    ``skills``, ``mcp`` and ``tools_endpoint`` are validated and normalized by the SDK (sorted
    by key); ``scratch_dir`` is a private (``0700``) directory the SDK creates for a run that
    has any of them and removes after the run, for per-run files such as an MCP config.
    ``env`` holds variables the CLI's process must receive on top of the driver's own (the
    tool gateway's token among them); their values are secrets.
    """

    run_id: str
    prompt: str
    config: Any = None
    workspace_cwd: str | None = None
    session: SessionContext | None = None
    policy: Policy | None = None
    skills: Sequence[ResolvedSkill] = ()
    mcp: Sequence[MCPServerSpec] = ()
    tools_endpoint: ToolsEndpoint | None = None
    scratch_dir: str | None = None
    output_schema: OutputSchema | None = None
    structured_output_source: Literal["native", "prompt_validate", ""] = ""
    spawn: bool = False
    model_override: str = ""
    streaming: bool = True
    append_system_prompt: str | None = None
    instructions: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    deadline: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class RunFailure:
    """A driver-classified failure.  ``code`` is a failure code (``agent_error``, ...)."""

    code: str = "agent_error"
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Response:
    output: str = ""
    raw_streams: RawStreams = field(default_factory=RawStreams)
    transcript: Sequence[TranscriptItem] = ()
    exit_code: int | None = 0
    signal: int | None = None
    timed_out: bool = False
    usage: Usage | None = None
    checkpoint: Checkpoint | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    provider: str = ""
    model: str = ""
    summary: str = ""
    structured_output: StructuredOutput | None = None
    failure: RunFailure | None = None


# --- the sink and the driver --------------------------------------------------------------------


class CancelSignal(Protocol):
    """Set when the SDK wants the run to stop (cancel, deadline, abort, close).

    The SDK's own signal also has ``at_once``, true once the stop is not to wait out the agent's
    grace period (a second Ctrl-C); the shared process runner reads it, and a driver stopping
    processes of its own may too (``getattr(signal, "at_once", False)``: not every signal has it).
    """

    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class EventSink(Protocol):
    """What the SDK hands a driver for one run."""

    @property
    def cancelled(self) -> CancelSignal: ...

    def emit(self, payload: Event | TranscriptItem) -> None:
        """Publish an event (meta is assigned by the SDK) or a transcript item."""
        ...

    def request_decision(self, request: DecisionRequest) -> DecisionResponse:
        """Ask for an approval; blocks until answered, expired or the run is cancelled."""
        ...


def check_emitted(payload: object) -> None:
    """Refuse what ``EventSink.emit`` cannot take, naming it: the SDK's sink and the testing
    kit's ``RecordingSink`` alike, so a driver's unit tests fail where its real runs would."""
    if type(payload) in _EMITTABLE:  # every event of a run passes here: a set lookup
        return
    from adaptor.events import ApprovalRequest, Event

    if isinstance(payload, ApprovalRequest):
        raise TypeError("drivers ask for approvals with sink.request_decision(), not emit()")
    if not isinstance(payload, Event | TranscriptItem):
        raise TypeError(
            "EventSink.emit() takes an event of adaptor.events or an "
            f"adaptor.result.TranscriptItem, not {type(payload).__qualname__}"
        )
    _EMITTABLE.add(type(payload))


# The types check_emitted() accepted: the answer depends on the type alone.
_EMITTABLE: set[type] = set()


@runtime_checkable
class Driver(Protocol):
    def descriptor(self) -> Descriptor: ...
    def validate_config(self, config: object | None = None) -> None: ...
    def run(self, request: Request, sink: EventSink) -> Response: ...

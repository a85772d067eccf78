"""adaptor: run coding-agent CLIs behind one model and one error taxonomy.

Every public name is importable from here, but its module is imported on first use: ``import
adaptor`` costs almost nothing, and the ``adaptor`` command pays only for the modules a command
needs rather than for the whole SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ below imports on demand
    # The public submodules, which __getattr__ serves as attributes after a plain `import
    # adaptor` (`adaptor.memory.Store()`): some were seen only as other modules imported them.
    from adaptor import (
        agent as agent,
    )
    from adaptor import (
        approval as approval,
    )
    from adaptor import (
        driver as driver,
    )
    from adaptor import (
        drivers as drivers,
    )
    from adaptor import (
        errors as errors,
    )
    from adaptor import (
        events as events,
    )
    from adaptor import (
        mcp as mcp,
    )
    from adaptor import (
        memory as memory,
    )
    from adaptor import (
        policy as policy,
    )
    from adaptor import (
        result as result,
    )
    from adaptor import (
        schema as schema,
    )
    from adaptor import (
        skill as skill,
    )
    from adaptor import (
        spool as spool,
    )
    from adaptor import (
        stream as stream,
    )
    from adaptor import (
        testing as testing,
    )
    from adaptor import (
        threadstore as threadstore,
    )
    from adaptor import (
        tool as tool,
    )
    from adaptor.agent import Agent, Runner, Thread
    from adaptor.approval import approve_all, deny_all
    from adaptor.driver import (
        HumanDecisionModeUnsupportedError,
        InvalidDriverConfigError,
        InvalidOutputSchemaError,
        InvalidPolicyError,
        PolicyCapabilityUnsupportedError,
        SessionConfigFingerprintError,
        StructuredOutputUnsupportedError,
    )
    from adaptor.errors import (
        ActiveExecutionTimeoutError,
        AdaptorError,
        AgentClosedError,
        AgentFailedError,
        ApprovalDeniedError,
        ApprovalExpiredError,
        ApprovalKindMismatchError,
        ApprovalResolvedError,
        ApprovalTimeoutError,
        ApprovalUnavailableError,
        CancelledError,
        DeadlineExceededError,
        PolicyViolationError,
        ResumeRejectedError,
        RunCancelledError,
        RunDeadlineExceededError,
        RunError,
        ThreadAlreadyExistsError,
        ThreadBusyError,
        ThreadCheckpointMissingError,
        ThreadIncompatibleError,
        ThreadLeaseLostError,
        ThreadNotFoundError,
        ThreadStoreRequiredError,
    )
    from adaptor.events import (
        ApprovalRequest,
        Choice,
        Dropped,
        Event,
        EventMeta,
        Notice,
        ProcessInfo,
        RunFinished,
        RunStarted,
        SubagentUpdate,
        TextDelta,
        Thinking,
        ToolCall,
        ToolResult,
    )
    from adaptor.mcp import InvalidMCPConfigError, MCPTransportUnsupportedError, MCPUnsupportedError
    from adaptor.policy import ApprovalPolicy, Policy
    from adaptor.result import RawStreams, Result, StructuredOutput, TranscriptItem, Usage
    from adaptor.schema import SchemaOptions, run_as
    from adaptor.skill import (
        SkillKeyConflictError,
        SkillKeyMissingError,
        SkillMaterializationError,
        SkillNotFoundError,
        SkillSourceMissingError,
    )
    from adaptor.spool import InvalidRequestError
    from adaptor.stream import Stream

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "ApprovalPolicy",
    "ApprovalRequest",
    "Choice",
    "Dropped",
    "Event",
    "EventMeta",
    "Notice",
    "Policy",
    "ProcessInfo",
    "RawStreams",
    "Result",
    "RunFinished",
    "RunStarted",
    "Runner",
    "SchemaOptions",
    "Stream",
    "StructuredOutput",
    "SubagentUpdate",
    "TextDelta",
    "Thinking",
    "Thread",
    "ToolCall",
    "ToolResult",
    "TranscriptItem",
    "Usage",
    "approve_all",
    "deny_all",
    "run_as",
    "ActiveExecutionTimeoutError",
    "AdaptorError",
    "AgentClosedError",
    "AgentFailedError",
    "ApprovalDeniedError",
    "ApprovalExpiredError",
    "ApprovalKindMismatchError",
    "ApprovalResolvedError",
    "ApprovalTimeoutError",
    "ApprovalUnavailableError",
    "CancelledError",
    "DeadlineExceededError",
    "HumanDecisionModeUnsupportedError",
    "InvalidDriverConfigError",
    "InvalidMCPConfigError",
    "InvalidOutputSchemaError",
    "InvalidPolicyError",
    "InvalidRequestError",
    "MCPTransportUnsupportedError",
    "MCPUnsupportedError",
    "PolicyCapabilityUnsupportedError",
    "PolicyViolationError",
    "ResumeRejectedError",
    "RunCancelledError",
    "RunDeadlineExceededError",
    "RunError",
    "SessionConfigFingerprintError",
    "SkillKeyConflictError",
    "SkillKeyMissingError",
    "SkillMaterializationError",
    "SkillNotFoundError",
    "SkillSourceMissingError",
    "StructuredOutputUnsupportedError",
    "ThreadAlreadyExistsError",
    "ThreadBusyError",
    "ThreadCheckpointMissingError",
    "ThreadIncompatibleError",
    "ThreadLeaseLostError",
    "ThreadNotFoundError",
    "ThreadStoreRequiredError",
]

# Where each public name is defined.  tests/test_lazy_imports.py holds this, the imports above
# and __all__ to the same names.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "adaptor.agent": ("Agent", "Runner", "Thread"),
    "adaptor.approval": ("approve_all", "deny_all"),
    "adaptor.driver": (
        "HumanDecisionModeUnsupportedError",
        "InvalidDriverConfigError",
        "InvalidOutputSchemaError",
        "InvalidPolicyError",
        "PolicyCapabilityUnsupportedError",
        "SessionConfigFingerprintError",
        "StructuredOutputUnsupportedError",
    ),
    "adaptor.errors": (
        "ActiveExecutionTimeoutError",
        "AdaptorError",
        "AgentClosedError",
        "AgentFailedError",
        "ApprovalDeniedError",
        "ApprovalExpiredError",
        "ApprovalKindMismatchError",
        "ApprovalResolvedError",
        "ApprovalTimeoutError",
        "ApprovalUnavailableError",
        "CancelledError",
        "DeadlineExceededError",
        "PolicyViolationError",
        "ResumeRejectedError",
        "RunCancelledError",
        "RunDeadlineExceededError",
        "RunError",
        "ThreadAlreadyExistsError",
        "ThreadBusyError",
        "ThreadCheckpointMissingError",
        "ThreadIncompatibleError",
        "ThreadLeaseLostError",
        "ThreadNotFoundError",
        "ThreadStoreRequiredError",
    ),
    "adaptor.events": (
        "ApprovalRequest",
        "Choice",
        "Dropped",
        "Event",
        "EventMeta",
        "Notice",
        "ProcessInfo",
        "RunFinished",
        "RunStarted",
        "SubagentUpdate",
        "TextDelta",
        "Thinking",
        "ToolCall",
        "ToolResult",
    ),
    "adaptor.mcp": (
        "InvalidMCPConfigError",
        "MCPTransportUnsupportedError",
        "MCPUnsupportedError",
    ),
    "adaptor.policy": ("ApprovalPolicy", "Policy"),
    "adaptor.result": ("RawStreams", "Result", "StructuredOutput", "TranscriptItem", "Usage"),
    "adaptor.schema": ("SchemaOptions", "run_as"),
    "adaptor.skill": (
        "SkillKeyConflictError",
        "SkillKeyMissingError",
        "SkillMaterializationError",
        "SkillNotFoundError",
        "SkillSourceMissingError",
    ),
    "adaptor.spool": ("InvalidRequestError",),
    "adaptor.stream": ("Stream",),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}

if not TYPE_CHECKING:  # hidden from type checkers, which would otherwise accept any name

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
            globals()[name] = value  # later lookups are plain module attributes
            return value
        if not name.startswith("_"):
            # A public submodule used as an attribute (``adaptor.errors.find``) after a plain
            # ``import adaptor``, as worked when the package imported everything eagerly.
            try:
                return importlib.import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

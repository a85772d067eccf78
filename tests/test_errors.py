"""The error taxonomy: identities, categories, matching and the wire codec."""

from __future__ import annotations

import copy
import enum
import importlib
import pickle
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adaptor
from adaptor import errors, tool
from adaptor.clients import a2a
from adaptor.driver import SessionConfigFingerprintError
from adaptor.drivers import script
from adaptor.schema import compile_schema
from adaptor.spool import InvalidRequestError
from adaptor.threadstore import AlreadyExistsError, BusyError, LeaseLostError
from hosttools import a2adelegation, sessionrecorder


@dataclass(frozen=True)
class Case:
    cls: type[errors.AdaptorError]
    make: Callable[[], errors.AdaptorError]
    code: str
    fields: dict[str, Any]
    category: type[BaseException]
    exit_code: int


def _run_case(cls: type[errors.RunError], code: str, reason: str) -> Case:
    return Case(
        cls,
        lambda: cls("it failed", details={"k": [1, "v"]}),
        code,
        {},
        errors.RunError,
        1,
    )


CASES: list[Case] = [
    Case(
        errors.RunError,
        lambda: errors.RunError("infrastructure_error", "boom", details={"a": 1}),
        "RunError",
        {},
        errors.AdaptorError,
        1,
    ),
    _run_case(errors.ApprovalDeniedError, "ErrApprovalDenied", "approval_denied"),
    _run_case(errors.ApprovalTimeoutError, "ErrApprovalTimeout", "approval_timeout"),
    _run_case(errors.AgentFailedError, "ErrAgentFailed", "agent_error"),
    _run_case(errors.RunCancelledError, "ErrRunCancelled", "cancelled"),
    _run_case(errors.PolicyViolationError, "ErrPolicyViolation", "policy_violation"),
    _run_case(errors.RunDeadlineExceededError, "ErrDeadlineExceeded", "deadline_exceeded"),
    Case(
        errors.ActiveExecutionTimeoutError,
        lambda: errors.ActiveExecutionTimeoutError(2.5),
        "ErrActiveExecutionTimeout",
        {"limit": 2.5},
        errors.RunError,
        1,
    ),
    Case(errors.CancelledError, errors.CancelledError, "context.Canceled", {}, errors.AdaptorError, 70),
    Case(
        errors.DeadlineExceededError,
        errors.DeadlineExceededError,
        "context.DeadlineExceeded",
        {},
        TimeoutError,
        70,
    ),
    Case(errors.AgentClosedError, errors.AgentClosedError, "ErrAgentClosed", {}, errors.AdaptorError, 70),
    Case(
        adaptor.SkillNotFoundError,
        lambda: adaptor.SkillNotFoundError("skill 'x' not found"),
        "ErrSkillNotFound",
        {},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.SkillKeyConflictError,
        lambda: adaptor.SkillKeyConflictError("review", ["dir:/a", "inline"], "content differs"),
        "ErrSkillKeyConflict",
        {"key": "review", "sources": ["dir:/a", "inline"], "detail": "content differs"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.SkillMaterializationError,
        lambda: adaptor.SkillMaterializationError("review", "review-1", OSError("disk full")),
        "ErrSkillMaterializationFailed",
        {"key": "review", "runtime_name": "review-1"},
        errors.AdaptorError,
        3,
    ),
    Case(adaptor.SkillSourceMissingError, adaptor.SkillSourceMissingError, "ErrSkillSourceMissing", {}, errors.AdaptorError, 3),
    Case(adaptor.SkillKeyMissingError, adaptor.SkillKeyMissingError, "ErrSkillKeyMissing", {}, errors.AdaptorError, 3),
    Case(adaptor.InvalidMCPConfigError, adaptor.InvalidMCPConfigError, "ErrInvalidMCPConfig", {}, errors.AdaptorError, 3),
    Case(adaptor.MCPUnsupportedError, adaptor.MCPUnsupportedError, "ErrMCPUnsupported", {}, errors.AdaptorError, 3),
    Case(
        adaptor.MCPTransportUnsupportedError,
        adaptor.MCPTransportUnsupportedError,
        "ErrMCPTransportUnsupported",
        {},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.InvalidOutputSchemaError,
        lambda: adaptor.InvalidOutputSchemaError("not an object schema", ValueError("bad")),
        "ErrInvalidOutputSchema",
        {"reason": "not an object schema"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.StructuredOutputUnsupportedError,
        lambda: adaptor.StructuredOutputUnsupportedError("command", "no mechanism"),
        "ErrStructuredOutputUnsupported",
        {"driver": "command", "reason": "no mechanism"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.InvalidDriverConfigError,
        lambda: adaptor.InvalidDriverConfigError("claude", ValueError("command is empty")),
        "ErrInvalidDriverConfig",
        {"driver": "claude"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.InvalidPolicyError,
        lambda: adaptor.InvalidPolicyError("script", "Policy.Sandbox", "bogus"),
        "ErrInvalidPolicy",
        {"driver": "script", "field": "Policy.Sandbox", "value": "bogus"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.PolicyCapabilityUnsupportedError,
        lambda: adaptor.PolicyCapabilityUnsupportedError("codex", "browser", "allow"),
        "ErrPolicyCapabilityUnsupported",
        {"driver": "codex", "dimension": "browser", "value": "allow"},
        errors.AdaptorError,
        3,
    ),
    Case(
        adaptor.HumanDecisionModeUnsupportedError,
        lambda: adaptor.HumanDecisionModeUnsupportedError("codex", "permission", "ask"),
        "ErrHumanDecisionModeUnsupported",
        {"driver": "codex", "kind": "permission", "mode": "ask"},
        errors.AdaptorError,
        3,
    ),
    Case(
        SessionConfigFingerprintError,
        lambda: SessionConfigFingerprintError("Config.hooks[0]", "function", "callable", "not stable"),
        "SessionConfigFingerprintError",
        {"path": "Config.hooks[0]", "type": "function", "kind": "callable", "why": "not stable"},
        errors.AdaptorError,
        70,
    ),
    Case(
        InvalidRequestError,
        lambda: InvalidRequestError([{"path": "/prompt", "message": "is required"}]),
        "ErrInvalidRequest",
        {"errors": [{"path": "/prompt", "message": "is required"}]},
        errors.AdaptorError,
        2,
    ),
    Case(tool.InvalidDefinitionError, tool.InvalidDefinitionError, "tool.ErrInvalidDefinition", {}, errors.AdaptorError, 3),
    Case(tool.InvalidInputError, tool.InvalidInputError, "tool.ErrInvalidInput", {}, errors.AdaptorError, 70),
    Case(tool.InvalidOutputError, tool.InvalidOutputError, "tool.ErrInvalidOutput", {}, errors.AdaptorError, 70),
    Case(errors.ThreadStoreRequiredError, errors.ThreadStoreRequiredError, "ErrThreadStoreRequired", {}, errors.AdaptorError, 4),
    Case(errors.ThreadNotFoundError, errors.ThreadNotFoundError, "ErrThreadNotFound", {}, errors.AdaptorError, 4),
    Case(errors.ThreadBusyError, errors.ThreadBusyError, "ErrThreadBusy", {}, errors.AdaptorError, 75),
    Case(errors.ThreadIncompatibleError, errors.ThreadIncompatibleError, "ErrThreadIncompatible", {}, errors.AdaptorError, 4),
    Case(errors.ThreadLeaseLostError, errors.ThreadLeaseLostError, "ErrThreadLeaseLost", {}, errors.AdaptorError, 4),
    Case(
        errors.ThreadCheckpointMissingError,
        errors.ThreadCheckpointMissingError,
        "ErrThreadCheckpointMissing",
        {},
        errors.AdaptorError,
        4,
    ),
    Case(errors.ThreadAlreadyExistsError, errors.ThreadAlreadyExistsError, "ErrThreadAlreadyExists", {}, errors.AdaptorError, 4),
    Case(
        errors.ResumeRejectedError,
        lambda: errors.ResumeRejectedError("session not found"),
        "ErrResumeRejected",
        {"reason": "session not found"},
        errors.AdaptorError,
        4,
    ),
    Case(BusyError, lambda: BusyError("t/1"), "threadstore.ErrBusy", {"target": "t/1"}, errors.AdaptorError, 75),
    Case(LeaseLostError, lambda: LeaseLostError("t/1"), "threadstore.ErrLeaseLost", {"target": "t/1"}, errors.AdaptorError, 4),
    Case(AlreadyExistsError, lambda: AlreadyExistsError("k"), "threadstore.ErrAlreadyExists", {"key": "k"}, errors.AdaptorError, 4),
    Case(errors.ApprovalResolvedError, errors.ApprovalResolvedError, "ErrApprovalResolved", {}, errors.AdaptorError, 5),
    Case(errors.ApprovalExpiredError, errors.ApprovalExpiredError, "ErrApprovalExpired", {}, errors.ApprovalResolvedError, 5),
    Case(errors.ApprovalKindMismatchError, errors.ApprovalKindMismatchError, "ErrApprovalKindMismatch", {}, errors.AdaptorError, 5),
    Case(errors.ApprovalUnavailableError, errors.ApprovalUnavailableError, "ErrApprovalUnavailable", {}, errors.AdaptorError, 5),
    Case(a2a.InvalidAgentCardError, a2a.InvalidAgentCardError, "a2a.ErrInvalidAgentCard", {}, errors.AdaptorError, 70),
    Case(
        a2a.ProtocolError,
        lambda: a2a.ProtocolError("send", "malformed event", ValueError("x"), raw='{"kind": 3}'),
        "a2a.ErrProtocol",
        {"op": "send", "reason": "malformed event", "raw": '{"kind": 3}'},
        errors.AdaptorError,
        70,
    ),
    Case(a2a.UnauthorizedError, a2a.UnauthorizedError, "a2a.ErrUnauthorized", {}, errors.AdaptorError, 70),
    Case(a2a.NotFoundError, a2a.NotFoundError, "a2a.ErrNotFound", {}, errors.AdaptorError, 70),
    Case(a2a.UnsupportedError, a2a.UnsupportedError, "a2a.ErrUnsupported", {}, errors.AdaptorError, 70),
    Case(a2a.UntrustedOriginError, a2a.UntrustedOriginError, "a2a.ErrUntrustedOrigin", {}, errors.AdaptorError, 70),
    Case(
        a2a.StreamRecoveryError,
        lambda: a2a.StreamRecoveryError("task-1", ConnectionResetError("reset")),
        "a2a.StreamRecoveryError",
        {"task_id": "task-1"},
        errors.AdaptorError,
        70,
    ),
    Case(
        sessionrecorder.InvalidSessionKeyError,
        sessionrecorder.InvalidSessionKeyError,
        "sessionrecorder.ErrInvalidSessionKey",
        {},
        errors.AdaptorError,
        70,
    ),
    Case(
        sessionrecorder.JSONLEventBackendClosedError,
        sessionrecorder.JSONLEventBackendClosedError,
        "sessionrecorder.ErrJSONLEventBackendClosed",
        {},
        errors.AdaptorError,
        70,
    ),
    Case(
        sessionrecorder.JSONLEventLogCorruptError,
        lambda: sessionrecorder.JSONLEventLogCorruptError("sess-1", 7),
        "sessionrecorder.ErrJSONLEventLogCorrupt",
        {"key": "sess-1", "line": 7},
        errors.AdaptorError,
        70,
    ),
    Case(
        a2adelegation.DelegationError,
        lambda: a2adelegation.DelegationError(
            "agent_unavailable", "remote agent is unavailable", True, "503", {"agent": "rev"}
        ),
        "a2adelegation.DelegationError",
        {"code": "agent_unavailable", "retryable": True, "remote_status": "503", "metadata": {"agent": "rev"}},
        errors.AdaptorError,
        70,
    ),
]

IDS = [c.cls.__name__ for c in CASES]


def _roundtrip(err: BaseException, **kw: Any) -> BaseException:
    wire = orjson.loads(orjson.dumps(errors.to_wire(err)))
    return errors.from_wire(wire, **kw)


def _chain(err: BaseException | None) -> list[tuple[str, str]]:
    out = []
    while err is not None:
        out.append((type(err).__name__, str(err)))
        err = err.__cause__
    return out


def test_details_a_caller_filled_with_python_objects_still_make_a_json_wire_form() -> None:
    import datetime
    import json

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    moment = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.UTC)
    err = adaptor.AgentFailedError(
        "failed",
        details={
            "when": moment,
            "where": Path("/srv/work"),
            "ids": (1, 2),
            "tags": {"a"},
            "raw": b"x",
            "odd": Unprintable(),
            "nested": {3: [moment]},
            "unbounded": [float("nan"), float("-inf"), 1.5],  # no JSON number (json wrote NaN)
        },
    )
    wire = json.loads(json.dumps(errors.to_wire(err), allow_nan=False))  # strict JSON
    assert wire["details"] == {
        "when": "2026-12-05 12:00:00+00:00",
        "where": "/srv/work",
        "ids": [1, 2],
        "tags": ["a"],
        "raw": "b'x'",
        "odd": "<test_details_a_caller_filled_with_python_objects_still_make_a_json_wire_form.<locals>.Unprintable>",
        "nested": {"3": ["2026-12-05 12:00:00+00:00"]},
        "unbounded": ["nan", "-inf", 1.5],
    }
    back = errors.from_wire(wire)
    assert type(back) is adaptor.AgentFailedError and back.details == wire["details"]


def test_a_policy_value_json_has_no_number_for_is_named_in_plain_json() -> None:
    import json

    agent = adaptor.Agent(script.Driver(script.Config(steps=({"text": "a"},))))
    with pytest.raises(adaptor.InvalidPolicyError) as refused:
        agent.run("p", policy=adaptor.Policy(active_execution_timeout=float("nan")))
    wire = json.loads(json.dumps(refused.value.to_wire(), allow_nan=False))
    assert wire["fields"]["value"] == "nan"


def test_every_registered_identity_has_a_case() -> None:
    for name in errors._LEAF_MODULES:
        importlib.import_module(name)
    covered = {c.code for c in CASES} | {"external", "AdaptorError"}
    assert set(errors._REGISTRY) <= covered, set(errors._REGISTRY) - covered


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_pickle_and_deepcopy_keep_every_identity(case: Case) -> None:
    # ProcessPoolExecutor and multiprocessing pickle the errors they pass back; Exception's
    # own reduction called the class with the message alone, which classes with other
    # required arguments refused (TypeError) or misread (a limit formatted from the message).
    err = case.make()
    for copied in (pickle.loads(pickle.dumps(err)), copy.deepcopy(err)):
        assert type(copied) is case.cls
        assert str(copied) == str(err)
        assert copied.fields() == case.fields
        assert errors.to_wire(copied) == errors.to_wire(err)


def test_an_error_whose_cause_does_not_pickle_pickles_with_the_cause_as_the_wire_writes_it() -> None:
    # jsonschema's SchemaError holds lambdas: an invalid schema's error could not be pickled.
    with pytest.raises(adaptor.InvalidOutputSchemaError) as info:
        compile_schema({"type": 5})
    err = info.value
    copied = pickle.loads(pickle.dumps(err))
    assert type(copied) is adaptor.InvalidOutputSchemaError
    assert type(copied.cause) is errors.ExternalError and copied.__cause__ is copied.cause
    assert copied.cause.type_name == "jsonschema.exceptions.SchemaError"
    assert errors.to_wire(copied) == errors.to_wire(err)
    assert type(copy.deepcopy(err).cause).__name__ == "SchemaError"  # no pickling: kept as is

    class Unpicklable(Exception):
        def __init__(self) -> None:
            super().__init__("held a lambda")
            self.hook = lambda: None

    chained = errors.RunError("infrastructure_error", "outer", cause=Unpicklable())
    chained.cause.__cause__ = OSError("inner")  # type: ignore[union-attr]
    back = pickle.loads(pickle.dumps(chained))
    assert str(back.cause) == "held a lambda" and type(back.cause.__cause__) is OSError
    assert errors.to_wire(back) == errors.to_wire(chained)


def test_a_tool_rejection_and_the_invalid_input_error_it_causes_pickle() -> None:
    definition = tool.define(
        "t", "d", lambda arguments: arguments, input={"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    with pytest.raises(tool.InvalidInputError) as info:
        definition.invoke({"n": "seven"})
    back = pickle.loads(pickle.dumps(info.value))  # unpickling raised TypeError
    assert repr(back.__cause__) == repr(info.value.__cause__)
    assert errors.to_wire(back) == errors.to_wire(info.value)
    rejection = pickle.loads(pickle.dumps(tool.reject("not_found", "no such issue")))
    assert (rejection.code, rejection.message) == ("not_found", "no such issue")


def test_the_thread_stores_corrupt_log_error_comes_back_from_the_wire_as_itself() -> None:
    from adaptor.threadstore import CorruptLogError

    for path in ("/home/a/threads/log-000001.jsonl", "/odd: name:7: here/log.jsonl"):
        err = CorruptLogError(path, 12, "bad crc")
        back = errors.from_wire(errors.to_wire(err))
        assert type(back) is CorruptLogError
        assert (back.path, back.line, back.why) == (path, 12, "bad crc")
    # A message of another shape stays a generic external error.
    other = errors.from_wire({"code": "external", "type": "adaptor.threadstore.CorruptLogError",
                              "message": "no line here", "fields": {}, "cause": None})
    assert type(other) is errors.ExternalError


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_construction_fields_category_and_exit_code(case: Case) -> None:
    err = case.make()
    assert type(err) is case.cls
    assert type(err).code == case.code
    assert isinstance(err, errors.AdaptorError)
    assert isinstance(err, case.category)
    assert err.fields() == case.fields
    for name, value in case.fields.items():
        assert getattr(err, name) == value
    assert errors.exit_code_for(err) == case.exit_code
    assert str(err)  # every error says something


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_wire_roundtrip_is_exact(case: Case) -> None:
    err = case.make()
    wire = errors.to_wire(err)
    assert set(wire) >= {"code", "type", "message", "fields", "cause"}
    assert wire["code"] == case.code
    assert wire["type"] == case.cls.__name__
    assert ("reason" in wire) == isinstance(err, errors.RunError)

    back = _roundtrip(err)
    assert type(back) is case.cls
    assert isinstance(back, errors.AdaptorError)
    assert str(back) == str(err)
    assert back.fields() == err.fields()
    assert _chain(back) == _chain(err)
    if isinstance(err, errors.RunError):
        assert isinstance(back, errors.RunError)
        assert back.reason == err.reason
        assert back.details == err.details
    assert errors.to_wire(back) == wire


def test_run_error_hierarchy() -> None:
    assert issubclass(errors.ApprovalExpiredError, errors.ApprovalResolvedError)
    assert issubclass(errors.RunDeadlineExceededError, errors.RunError)
    assert issubclass(errors.RunDeadlineExceededError, TimeoutError)
    assert issubclass(errors.DeadlineExceededError, TimeoutError)
    assert not issubclass(errors.DeadlineExceededError, errors.RunError)
    assert not issubclass(errors.CancelledError, errors.RunError)
    assert errors.ApprovalDeniedError().reason == "approval_denied"
    assert errors.ActiveExecutionTimeoutError(3).reason == "active_execution_timeout"


@pytest.mark.parametrize(
    ("root", "leaf"),
    [
        ("SkillNotFoundError", "adaptor.skill"),
        ("SkillKeyConflictError", "adaptor.skill"),
        ("SkillMaterializationError", "adaptor.skill"),
        ("SkillSourceMissingError", "adaptor.skill"),
        ("SkillKeyMissingError", "adaptor.skill"),
        ("InvalidMCPConfigError", "adaptor.mcp"),
        ("MCPUnsupportedError", "adaptor.mcp"),
        ("MCPTransportUnsupportedError", "adaptor.mcp"),
        ("InvalidOutputSchemaError", "adaptor.driver"),
        ("StructuredOutputUnsupportedError", "adaptor.driver"),
        ("InvalidDriverConfigError", "adaptor.driver"),
        ("InvalidPolicyError", "adaptor.driver"),
        ("PolicyCapabilityUnsupportedError", "adaptor.driver"),
        ("HumanDecisionModeUnsupportedError", "adaptor.driver"),
        ("SessionConfigFingerprintError", "adaptor.driver"),
        ("InvalidRequestError", "adaptor.spool"),
        ("ThreadBusyError", "adaptor.errors"),
        ("RunError", "adaptor.errors"),
    ],
)
def test_root_and_leaf_names_are_the_same_objects(root: str, leaf: str) -> None:
    assert getattr(adaptor, root) is getattr(importlib.import_module(leaf), root)


def test_joined_cause_is_raised_from_and_kept() -> None:
    cause = OSError("disk full")
    err = adaptor.SkillMaterializationError("k", "k-1", cause)
    assert err.cause is cause and err.__cause__ is cause
    assert errors.find(err, OSError) is cause


def test_cause_chain_roundtrip_with_foreign_and_store_errors() -> None:
    store = BusyError("tenant/1")
    busy = errors.ThreadBusyError(cause=store)
    run = errors.RunError("infrastructure_error", "Thread coordination failed", cause=busy)
    wire = errors.to_wire(run)
    assert wire["cause"]["code"] == "ErrThreadBusy"
    assert wire["cause"]["cause"] == {
        "code": "threadstore.ErrBusy",
        "type": "BusyError",
        "message": str(store),
        "fields": {"target": "tenant/1"},
        "cause": None,
    }
    back = _roundtrip(run)
    assert errors.matches(back, errors.ThreadBusyError)
    found = errors.find(back, BusyError)
    assert found is not None and found.target == "tenant/1"


def test_foreign_exceptions_rebuild_as_builtins_or_external() -> None:
    class Weird(Exception):
        pass

    err = errors.AgentFailedError("x", cause=FileNotFoundError("no such file: claude"))
    back = _roundtrip(err)
    assert type(back.__cause__) is FileNotFoundError
    assert str(back.__cause__) == "no such file: claude"

    wire = errors.to_wire(Weird("odd"))
    assert wire["code"] == "external"
    assert wire["type"].endswith("test_foreign_exceptions_rebuild_as_builtins_or_external.<locals>.Weird")
    back2 = errors.from_wire(orjson.loads(orjson.dumps(wire)))
    assert isinstance(back2, errors.ExternalError)
    assert back2.type_name == wire["type"] and str(back2) == "odd"
    assert errors.to_wire(back2) == wire


class _Colour(enum.Enum):
    RED = 1


class _Opaque:
    def __repr__(self) -> str:
        return "<an object of a program's own>"


@pytest.mark.parametrize(
    "cause",
    [KeyError("session_id"), KeyError(3), KeyError("it's"), KeyError(("a", 1)), KeyError("a", "b"),
     KeyError(), LookupError("plain"), KeyError(None), KeyError(frozenset({1})), KeyError(...),
     KeyError(_Colour.RED), KeyError(_Opaque()), KeyError("k" * 5000)],
    ids=lambda cause: repr(cause)[:40],
)
def test_a_builtin_cause_reads_back_with_its_own_message(cause: BaseException) -> None:
    # KeyError's str() is the repr of its key; rebuilt from that message it quoted it again
    # ("'session_id'" came back as "\"'session_id'\""), so a cause read from a verdict
    # differed from the in-process one.
    err = errors.AgentFailedError("x", cause=cause)
    back = _roundtrip(err)
    assert type(back.__cause__) is type(cause)
    assert str(back.__cause__) == str(cause)
    assert errors.to_wire(back) == errors.to_wire(err)


def test_from_wire_attaches_result_to_outer_run_error() -> None:
    sentinel = object()
    back = errors.from_wire(errors.to_wire(errors.AgentFailedError("x")), result=sentinel)  # type: ignore[arg-type]
    assert isinstance(back, errors.AgentFailedError) and back.result is sentinel


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [None, 3, "ErrThreadBusy", [1, 2], b"{}", 1.5, True])
def test_from_wire_rejects_non_objects_with_value_error(garbage: object) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        errors.from_wire(garbage)


def test_unknown_code_keeps_code_and_is_never_a_subclass() -> None:
    back = errors.from_wire({"code": "ErrFromTheFuture", "type": "FutureError", "message": "m"})
    assert type(back) is errors.AdaptorError
    assert back.wire_code == back.code == "ErrFromTheFuture"
    assert errors.to_wire(back)["code"] == "ErrFromTheFuture"
    assert errors.to_wire(back)["type"] == "FutureError"

    run = errors.from_wire({"code": "ErrNew", "reason": "rate_limited", "message": "m", "details": {"x": 1}})
    assert type(run) is errors.RunError
    assert run.reason == "rate_limited" and run.details == {"x": 1} and run.wire_code == run.code == "ErrNew"


@pytest.mark.parametrize(
    "obj",
    [
        {"code": "ErrActiveExecutionTimeout", "reason": "active_execution_timeout", "fields": {"limit": "3"}},
        {"code": "ErrActiveExecutionTimeout", "reason": "active_execution_timeout", "fields": {}},
        {"code": "ErrActiveExecutionTimeout", "reason": "active_execution_timeout", "fields": {"limit": True}},
        {"code": "ErrInvalidPolicy", "fields": {"driver": "x", "field": 3, "value": "v"}},
        {"code": "ErrInvalidPolicy", "fields": "nope"},
        {"code": "threadstore.ErrBusy", "fields": {"target": None}},
        {"code": "ErrApprovalDenied", "reason": "cancelled"},
        {"code": "ErrApprovalDenied"},
        {"code": "ErrThreadBusy", "reason": "approval_denied"},
        {"code": "sessionrecorder.ErrJSONLEventLogCorrupt", "fields": {"key": "k", "line": 1.5}},
    ],
)
def test_known_code_with_wrong_shape_is_generic(obj: dict[str, Any]) -> None:
    back = errors.from_wire(obj)
    assert type(back) in (errors.AdaptorError, errors.RunError)
    assert back.wire_code == back.code == obj["code"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"code": 5, "type": [], "message": {"a": 1}, "fields": [], "cause": "x"},
        {"code": "ErrThreadBusy", "message": None, "cause": 12},
        {"code": "RunError", "reason": 7, "details": "d", "message": 3},
    ],
)
def test_garbage_fields_never_crash(obj: dict[str, Any]) -> None:
    back = errors.from_wire(obj)
    assert isinstance(back, errors.AdaptorError)
    errors.to_wire(back)  # re-encodable


def test_cyclic_and_deep_cause_chains_are_bounded() -> None:
    cyclic: dict[str, Any] = {"code": "ErrThreadBusy", "message": "a"}
    cyclic["cause"] = cyclic
    back = errors.from_wire(cyclic)
    assert isinstance(back, errors.ThreadBusyError) and back.__cause__ is None

    deep: dict[str, Any] = {"code": "ErrThreadBusy", "message": "0", "cause": None}
    node = deep
    for i in range(1, 1000):
        node["cause"] = {"code": "ErrAgentClosed", "message": str(i), "cause": None}
        node = node["cause"]
    back = errors.from_wire(deep)
    assert len(_chain(back)) == errors.FIND_NODE_LIMIT


def test_to_wire_bounds_pathological_python_chains() -> None:
    a = errors.AgentClosedError("a")
    b = errors.AgentClosedError("b")
    a.__cause__, b.__cause__ = b, a
    wire = errors.to_wire(a)
    assert wire["cause"]["message"] == "b" and wire["cause"]["cause"] is None


# --- matching -------------------------------------------------------------------------------


def test_find_walks_cause_context_and_groups() -> None:
    inner = LeaseLostError("k")
    try:
        try:
            raise inner
        except LeaseLostError:
            raise errors.ThreadLeaseLostError() from None  # suppressed context
    except errors.ThreadLeaseLostError as e:
        suppressed = e
    assert errors.find(suppressed, LeaseLostError) is None

    try:
        try:
            raise inner
        except LeaseLostError:
            raise errors.ThreadLeaseLostError()  # implicit context  # noqa: B904
    except errors.ThreadLeaseLostError as e:
        implicit = e
    assert errors.find(implicit, LeaseLostError) is inner

    group = ExceptionGroup("many", [ValueError("v"), errors.ThreadBusyError(cause=BusyError("t"))])
    found = errors.find(group, BusyError)
    assert found is not None and found.target == "t"
    assert errors.matches(group, errors.ThreadBusyError)
    assert not errors.matches(group, errors.RunError)
    assert errors.find(None, ValueError) is None


def test_find_is_depth_first_and_node_bounded() -> None:
    first = errors.ThreadBusyError("first")
    second = errors.ThreadBusyError("second")
    group = ExceptionGroup("g", [ValueError("x"), second])
    group.__cause__ = first
    # depth-first: the cause is visited before the group's members
    assert errors.find(group, errors.ThreadBusyError) is first

    head: BaseException = ValueError("0")
    node = head
    for i in range(1, 150):
        nxt = ValueError(str(i))
        node.__cause__ = nxt
        node = nxt
    node.__cause__ = errors.ThreadBusyError()
    assert not errors.matches(head, errors.ThreadBusyError)  # beyond the 100-node bound


# --- secrets ------------------------------------------------------------------------------------


def test_codec_adds_no_foreign_state_and_redacts_credentials() -> None:
    class HTTPFailure(Exception):
        def __init__(self) -> None:
            super().__init__("request failed: Authorization: Bearer tok-AAAA1234 api_key=sk-zzzzzzzzzzzz")
            self.headers = {"Authorization": "Bearer hidden-header-value"}
            self.env = {"ANTHROPIC_API_KEY": "hidden-env-value"}

    err = errors.AgentFailedError("provider call failed", cause=HTTPFailure())
    text = orjson.dumps(errors.to_wire(err)).decode()
    for secret in ("tok-AAAA1234", "sk-zzzzzzzzzzzz", "hidden-header-value", "hidden-env-value"):
        assert secret not in text
    assert "<redacted>" in text


def test_explicit_secrets_are_redacted_everywhere() -> None:
    err = errors.RunError(
        "infrastructure_error",
        "spawn failed with S3CR3T-VALUE",
        cause=OSError("cannot exec: TOKEN=S3CR3T-VALUE"),
    )
    text = orjson.dumps(errors.to_wire(err, secrets=["S3CR3T-VALUE"])).decode()
    assert "S3CR3T-VALUE" not in text


def test_explicit_secrets_are_redacted_from_details_and_in_their_escaped_forms() -> None:
    # Details were written as they were, and only the raw form of a value was looked for: a
    # message quoting JSON the agent printed shows a key with a quote in it escaped.
    secret = 'pa"ss-S3CR3T'
    said = orjson.dumps({"key": secret}).decode()  # {"key":"pa\"ss-S3CR3T"}
    err = errors.AgentFailedError(f"agent said {said}", details={"stderr": f"key={secret}"})
    assert secret not in str(err)
    wire = errors.to_wire(err, secrets=[secret])
    assert "S3CR3T" not in orjson.dumps(wire).decode()
    assert wire["details"] == {"stderr": "key=<redacted>"}


# --- property tests -------------------------------------------------------------------------

_text = st.text(max_size=40)
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), _text)
_details = st.dictionaries(_text, st.one_of(_json_scalar, st.lists(_json_scalar, max_size=3)), max_size=4)


def _leaf_errors() -> st.SearchStrategy[BaseException]:
    return st.one_of(
        st.builds(errors.ThreadBusyError, _text),
        st.builds(BusyError, _text),
        st.builds(adaptor.InvalidPolicyError, _text, _text, _json_scalar),
        st.builds(adaptor.SkillKeyConflictError, _text, st.lists(_text, max_size=3), _text),
        st.builds(errors.ActiveExecutionTimeoutError, st.floats(0, 1e6), _text, details=_details),
        st.builds(errors.RunError, _text, _text, details=_details),
        st.builds(errors.ApprovalDeniedError, _text, details=_details),
        st.builds(sessionrecorder.JSONLEventLogCorruptError, _text, st.integers(1, 10**9)),
        st.builds(ValueError, _text),
        st.builds(a2adelegation.DelegationError, _text, _text, st.booleans(), st.one_of(st.none(), _text)),
    )


@st.composite
def _chains(draw: st.DrawFn) -> BaseException:
    nodes = draw(st.lists(_leaf_errors(), min_size=1, max_size=5))
    for outer, inner in zip(nodes, nodes[1:], strict=False):
        outer.__cause__ = inner
    return nodes[0]


@settings(max_examples=300, deadline=None)
@given(_chains())
def test_codec_roundtrip_property(err: BaseException) -> None:
    wire = orjson.loads(orjson.dumps(errors.to_wire(err)))
    back = errors.from_wire(wire)
    a, b = err, back
    while a is not None:
        assert b is not None
        assert type(b) is type(a)
        assert str(b) == str(a)
        if isinstance(a, errors.AdaptorError):
            assert isinstance(b, errors.AdaptorError)
            assert b.fields() == a.fields()
        if isinstance(a, errors.RunError):
            assert isinstance(b, errors.RunError)
            assert (b.reason, b.details) == (a.reason, a.details)
        a, b = a.__cause__, b.__cause__  # type: ignore[assignment]
    assert b is None
    assert errors.to_wire(back) == wire


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        _json_scalar,
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_text, children, max_size=4)),
        max_leaves=30,
    )
)
def test_from_wire_never_crashes_on_arbitrary_json(obj: Any) -> None:
    if not isinstance(obj, dict):
        with pytest.raises(ValueError):
            errors.from_wire(obj)
        return
    back = errors.from_wire(obj)
    assert isinstance(back, BaseException)
    errors.to_wire(back)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CASES), st.dictionaries(st.sampled_from(["code", "type", "message", "fields", "reason", "details", "cause"]), _json_scalar))
def test_mutated_wire_forms_never_yield_a_wrong_subclass(case: Case, mutation: dict[str, Any]) -> None:
    wire = {**errors.to_wire(case.make()), **mutation}
    back = errors.from_wire(wire)
    if isinstance(back, errors.AdaptorError) and type(back) not in (errors.AdaptorError, errors.RunError, errors.ExternalError):
        assert type(back).code == wire["code"]
        if type(back)._fields:
            assert back.fields() == wire["fields"]


def test_docs_table_lists_every_identity() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    for case in CASES:
        assert f"`{case.code}`" in text, case.code
        assert case.cls.__name__ in text, case.cls.__name__


@pytest.mark.parametrize(("codes", "status"), [([75, 75, 0], 0), ([75] * 5, 75), ([75, 1], 1), ([2], 2)])
def test_the_documented_busy_retry_script_exits_as_it_says(
    tmp_path: Path, codes: list[int], status: int
) -> None:
    # An `adaptor` that answers with `codes` in turn (and a `sleep` that does not wait) runs
    # the retry loop of docs/errors.md as written.
    text = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    script = re.search(r"```sh\n(for attempt in .*?)```", text, re.S)
    assert script is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "codes").write_text("\n".join(map(str, codes)) + "\n")
    fake = bin_dir / "adaptor"
    fake.write_text(
        f'#!/bin/sh\ncode=$(head -n 1 {tmp_path}/codes)\nsed -i 1d {tmp_path}/codes\nexit "$code"\n'
    )
    (bin_dir / "sleep").write_text("#!/bin/sh\nexit 0\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    done = subprocess.run(
        ["sh", "-c", script.group(1)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == status, done.stderr


def test_find_refuses_what_is_no_exception() -> None:
    # It raised AttributeError ('str' object has no attribute '__cause__') from inside the walk.
    with pytest.raises(TypeError, match="not str"):
        errors.find("boom", errors.RunError)  # type: ignore[arg-type]
    assert errors.find(None, errors.RunError) is None and not errors.matches(None, errors.RunError)


def test_a_run_error_always_has_a_result() -> None:
    # Typed `Result | None` though every run sets it: each documented `err.result.text` needed
    # a None check under mypy --strict.  Made without one, it is an empty Result.
    from adaptor.result import Result

    made = errors.RunError("agent_error", "x")
    rebuilt = errors.from_wire(errors.to_wire(errors.AgentFailedError("boom")))
    assert isinstance(rebuilt, errors.RunError)
    for err in (made, rebuilt):
        assert isinstance(err.result, Result) and err.result.text == ""
    kept = Result(run_id="run_1", text="so far")
    assert errors.from_wire(errors.to_wire(errors.AgentFailedError("boom")), result=kept).result is kept  # type: ignore[attr-defined]


def test_the_callers_secrets_are_redacted_in_every_error_of_the_wire_cause_chain() -> None:
    # Only the outer error was redacted with the secrets given (a mutation that left the causes
    # to the credential-pattern scrub passed every test): a secret that looks like no
    # credential, in a cause two levels down, reached the verdict as it was.
    err = errors.RunError(
        "infrastructure_error", "spawn failed",
        cause=errors.AgentFailedError("agent printed S3CR3T-VALUE", cause=OSError("exec /opt/S3CR3T-VALUE/bin failed")),
    )
    wire = errors.to_wire(err, secrets=["S3CR3T-VALUE"])
    assert "S3CR3T-VALUE" not in orjson.dumps(wire).decode()
    assert wire["cause"]["message"] == "agent printed <redacted>"
    assert "<redacted>" in wire["cause"]["cause"]["message"]


def test_the_exit_codes_with_a_rule_of_their_own() -> None:
    # A missing agent CLI is unavailable (69), not an infrastructure failure (1); a thread's
    # failure found after the driver was entered exits as the thread error (4), not as the
    # RunError that keeps the run's Result (1).
    missing = errors.RunError("infrastructure_error", details={"kind": "binary_not_found"})
    assert errors.exit_code_for(missing) == 69
    for cause in (errors.ThreadCheckpointMissingError(), errors.ThreadBusyError("k")):
        thread_failure = errors.RunError("infrastructure_error", cause=cause)
        assert errors.exit_code_for(thread_failure) == type(cause).exit_code, cause
    assert errors.exit_code_for(errors.ThreadCheckpointMissingError()) == 4
    assert errors.exit_code_for(errors.RunError("infrastructure_error")) == 1
    assert errors.exit_code_for(ValueError("foreign")) == 70

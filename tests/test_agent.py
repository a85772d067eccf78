"""The run pipeline through real runs of the script driver."""

from __future__ import annotations

import dataclasses
import errno
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import adaptor
import adaptor.memory
import adaptor.schema
from adaptor import _run, errors, events, skill
from adaptor.driver import Descriptor, Request, Response
from adaptor.drivers import script
from adaptor.result import Result
from adaptor.testing import ScriptedDriver
from adaptor.threadstore import JSONLStore

PERMISSION = {"approval": {"kind": "permission", "title": "write main.py"}}
QUESTION = {"approval": {"kind": "question", "title": "which one?", "choices": ["a", "b"]}}


def collect(stream: adaptor.Stream) -> list[events.Event]:
    return list(stream)


def kinds(evs: list[events.Event]) -> list[str]:
    return [events.event_kind(e) for e in evs]


def assert_lifecycle(evs: list[events.Event]) -> None:
    assert isinstance(evs[0], events.RunStarted)
    assert isinstance(evs[-1], events.RunFinished)
    assert sum(isinstance(e, events.RunStarted) for e in evs) == 1
    assert sum(isinstance(e, events.RunFinished) for e in evs) == 1
    seqs = [e.meta.sequence for e in evs]
    assert seqs[0] == 1
    assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False))
    # every gap is covered by a Dropped report that precedes the next delivered event
    covered: set[int] = set()
    for e in evs:
        if isinstance(e, events.Dropped):
            covered |= set(range(e.first_sequence, e.last_sequence + 1))
    missing = set(range(1, seqs[-1] + 1)) - set(seqs)
    assert missing <= covered
    run_ids = {e.meta.run_id for e in evs}
    assert len(run_ids) == 1


# --- success and layers -------------------------------------------------------------------


def test_run_returns_final_text_not_stdout() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([{"stdout": "raw noise"}, {"text": "first"}, {"text": "final answer"}])
    )
    result = agent.run("hi")
    assert result.text == "final answer"
    assert result.run_id.startswith("run_") and len(result.run_id) == 20
    assert result.provider == "script"
    assert "raw noise" in result.raw().stdout
    assert "raw noise" not in result.text
    assert [i.kind for i in result.transcript()] == ["assistant", "assistant"]


def test_leaving_a_stream_block_early_ends_the_run() -> None:
    # Without the block, a consumer that broke out of its loop left the run going, and with
    # a small buffer its thread waited for room for ever (until agent.close()).
    steps: list[dict[str, Any]] = [{"tool_call": {"name": "grep"}}] * 20
    steps += [{"sleep": 300}, {"text": "never"}]
    agent = adaptor.Agent(ScriptedDriver(steps), event_buffer=2)
    with agent.stream("go") as stream:
        for index, _ in enumerate(stream):
            if index == 3:
                break
    assert stream._done.is_set()  # the block's exit waited for the run's end
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()
    with pytest.raises(ValueError, match="boom"), agent.stream("go") as raised:
        raise ValueError("boom")
    with pytest.raises((adaptor.CancelledError, adaptor.RunCancelledError)):
        raised.result()
    with adaptor.Agent(ScriptedDriver([{"text": "hi"}])).stream("go") as finished:
        assert finished.result().text == "hi"  # a run that ended is left as it is
    assert finished.result().text == "hi"


def test_a_transcript_item_changed_by_its_caller_changes_nothing_else() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([{"tool_call": {"name": "grep", "args": {"pattern": "x"}, "result": "ok"}}])
    )
    stream = agent.stream("hi")
    published = [e for e in stream if isinstance(e, events.Notice) and e.kind == "transcript.item"]
    result = stream.result()
    first = result.transcript()
    (call,) = [item for item in first if item.kind == "tool_call"]
    call.input["pattern"] = "changed"
    call.metadata["added"] = True
    (again,) = [item for item in result.transcript() if item.kind == "tool_call"]
    assert again.input == {"pattern": "x"} and "added" not in again.metadata
    assert [n.data for n in published] == [i.to_json() for i in result.transcript()]
    assert Result.from_json(result.to_json()) == result


def test_stream_events_are_ordered_and_mirror_the_transcript() -> None:
    agent = adaptor.Agent(
        ScriptedDriver(
            [
                {"thinking": "hmm"},
                {"tool_call": {"name": "Bash", "args": {"cmd": "ls"}, "result": {"out": "a"}}},
                {"text": "done"},
            ]
        )
    )
    stream = agent.stream("go")
    evs = collect(stream)
    result = stream.result()
    assert_lifecycle(evs)
    assert stream.run_id == result.run_id == evs[0].meta.run_id
    items = [e for e in evs if isinstance(e, events.Notice) and e.kind == "transcript.item"]
    assert [n.data for n in items] == [i.to_json() for i in result.transcript()]
    finished = evs[-1]
    assert isinstance(finished, events.RunFinished)
    assert not finished.failed and finished.usage == result.usage
    assert "tool_call.start" in kinds(evs) and "tool_result" in kinds(evs)
    assert stream.result() is result  # same outcome on every call


def test_result_drains_without_iteration_and_run_is_stream_plus_result() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}] * 50), event_buffer=2)
    stream = agent.stream("go")
    assert stream.result().text == "x"
    assert list(stream) == []  # already drained


# --- every RunError identity through real runs ---------------------------------------------


def test_agent_failure_from_a_failure_step_keeps_partial_result() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([{"text": "partial"}, {"fail": {"code": "agent_error", "message": "boom"}}])
    )
    with pytest.raises(adaptor.AgentFailedError) as info:
        agent.run("go")
    err = info.value
    assert err.reason == "agent_error" and "boom" in str(err)
    assert err.result is not None and err.result.text == "partial"
    assert [i.text for i in err.result.transcript()] == ["partial"]


def test_non_zero_exit_can_never_succeed() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "looks fine"}, {"exit": 3}]))
    with pytest.raises(adaptor.AgentFailedError) as info:
        agent.run("go")
    assert info.value.details["exit_code"] == 3
    assert info.value.result is not None


@pytest.mark.parametrize(
    ("code", "cls", "reason"),
    [
        ("decision_rejected", adaptor.ApprovalDeniedError, "approval_denied"),
        ("decision_timeout", adaptor.ApprovalTimeoutError, "approval_timeout"),
        ("", adaptor.AgentFailedError, "agent_error"),
        ("cancelled", adaptor.RunCancelledError, "cancelled"),
        ("policy_error", adaptor.PolicyViolationError, "policy_violation"),
        ("rate_limited", adaptor.RunError, "rate_limited"),
        ("quota_exhausted_v2", adaptor.RunError, "quota_exhausted_v2"),
        # Codes that are the reasons of subclasses, but not mapped driver codes: a driver's
        # "deadline_exceeded" was a RunDeadlineExceededError (a TimeoutError) without the
        # details of the SDK's own deadline, an "active_execution_timeout" one with limit=0.
        ("deadline_exceeded", adaptor.RunError, "deadline_exceeded"),
        ("active_execution_timeout", adaptor.RunError, "active_execution_timeout"),
        ("approval_denied", adaptor.RunError, "approval_denied"),
        ("approval_timeout", adaptor.RunError, "approval_timeout"),
        ("policy_violation", adaptor.RunError, "policy_violation"),
    ],
)
def test_driver_failure_codes_map_to_reasons(code: str, cls: type, reason: str) -> None:
    agent = adaptor.Agent(ScriptedDriver([{"fail": {"code": code, "message": "m"}}]))
    with pytest.raises(adaptor.RunError) as info:
        agent.run("go")
    assert type(info.value) is cls
    assert info.value.reason == reason


def test_unknown_reason_stays_plain_run_error_in_the_terminal_event() -> None:
    stream = adaptor.Agent(ScriptedDriver([{"fail": {"code": "weird"}}])).stream("go")
    evs = collect(stream)
    with pytest.raises(adaptor.RunError):
        stream.result()
    finished = evs[-1]
    assert isinstance(finished, events.RunFinished)
    assert finished.failed and finished.reason == "weird"


def test_cancel_mid_run_is_run_cancelled_with_host_cause() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "started"}, {"sleep": 30}, {"text": "never"}]))
    stream = agent.stream("go")
    seen: list[events.Event] = []
    for event in stream:
        seen.append(event)
        if isinstance(event, events.TextDelta) and event.phase == "end":
            stream.cancel()
            stream.cancel()  # idempotent
    with pytest.raises(adaptor.RunCancelledError) as info:
        stream.result()
    assert isinstance(info.value.cause, adaptor.CancelledError)
    assert adaptor.errors.matches(info.value, adaptor.CancelledError)
    assert_lifecycle(seen)
    assert "never" not in kinds(seen)
    last = seen[-1]
    assert isinstance(last, events.RunFinished) and last.reason == "cancelled"


def test_call_timeout_after_entry_is_run_deadline_exceeded() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"sleep": 30}]))
    with pytest.raises(adaptor.RunDeadlineExceededError) as info:
        agent.run("go", timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value.cause, adaptor.DeadlineExceededError)
    assert info.value.result is not None
    assert info.value.details == {"limit": 0.2}  # which limit ran out, as for the budget


def test_a_driver_stopping_at_the_deadline_before_the_timer_fires_is_the_same_deadline() -> None:
    # A CLI driver's own watch stops its process at the request's deadline, and the driver can
    # return before the pipeline's timer fires (a busy machine): still a deadline, not a failure.
    class StopsAtTheDeadline(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            assert request.deadline is not None
            response = super().run(request, sink)
            return dataclasses.replace(response, exit_code=None, signal=15, timed_out=True)

    seen: list[events.Event] = []
    stream = adaptor.Agent(StopsAtTheDeadline([{"text": "partial"}])).stream("go", timeout=600)
    seen.extend(stream)
    with pytest.raises(adaptor.RunDeadlineExceededError) as info:
        stream.result()
    assert isinstance(info.value.cause, adaptor.DeadlineExceededError)
    assert info.value.result is not None and info.value.result.text == "partial"
    timer = adaptor.Agent(ScriptedDriver([{"sleep": 30}])).stream("go", timeout=0.2)
    timer_events = list(timer)
    with pytest.raises(adaptor.RunDeadlineExceededError):
        timer.result()
    finished, timer_finished = seen[-1], timer_events[-1]
    assert isinstance(finished, events.RunFinished) and isinstance(timer_finished, events.RunFinished)
    assert finished.reason == timer_finished.reason


def test_a_timed_out_response_without_a_run_deadline_stays_an_agent_failure() -> None:
    class TimesOutByItself(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            assert request.deadline is None
            return dataclasses.replace(super().run(request, sink), timed_out=True)

    with pytest.raises(adaptor.AgentFailedError) as info:
        adaptor.Agent(TimesOutByItself([{"text": "x"}])).run("go")
    assert info.value.details["timed_out"] is True


def test_timeout_before_entry_is_plain_deadline_exceeded() -> None:
    stream = adaptor.Agent(ScriptedDriver([{"text": "x"}])).stream("go", timeout=0)
    assert list(stream) == []
    with pytest.raises(adaptor.DeadlineExceededError) as info:
        stream.result()
    assert not isinstance(info.value, adaptor.RunError)


def test_active_execution_budget() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([{"sleep": 30}]), policy=adaptor.Policy(active_execution_timeout=0.2)
    )
    with pytest.raises(adaptor.ActiveExecutionTimeoutError) as info:
        agent.run("go")
    assert info.value.limit == 0.2
    assert info.value.reason == "active_execution_timeout"


def test_driver_exception_is_infrastructure_run_error() -> None:
    class Exploding(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            raise OSError("pipe broke")

    with pytest.raises(adaptor.RunError) as info:
        adaptor.Agent(Exploding([{"text": "x"}])).run("go")
    assert type(info.value) is adaptor.RunError
    assert info.value.reason == "infrastructure_error"
    assert isinstance(info.value.cause, OSError)
    # The message says whose bug it is, and which exception (its text stays in the cause:
    # it may quote what the driver held, and the message reaches events and logs).
    assert str(info.value) == "execution failed: driver 'script' raised OSError"


def test_driver_returning_no_response_is_named_as_the_drivers_bug() -> None:
    # A forgotten ``return`` in a third party's run() failed an assertion with no message.
    class Forgetful(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            super().run(request, sink)
            return None  # type: ignore[return-value]

    stream = adaptor.Agent(Forgetful([{"text": "x"}])).stream("go")
    evs = collect(stream)
    with pytest.raises(adaptor.RunError) as info:
        stream.result()
    assert type(info.value) is adaptor.RunError
    assert info.value.reason == "infrastructure_error"
    assert str(info.value) == (
        "execution failed: driver 'script' returned NoneType from run(), "
        "not an adaptor.driver.Response"
    )
    assert info.value.result is not None and info.value.result.text == ""
    finished = evs[-1]
    assert isinstance(finished, adaptor.RunFinished) and finished.failed


def test_driver_returning_no_response_is_named_even_when_the_run_has_secrets() -> None:
    # Redacting the Response must not turn the driver's bug into a TypeError of the SDK's.
    class Forgetful(script.Driver):
        def run(self, request: Request, sink: Any) -> Response:
            super().run(request, sink)
            return None  # type: ignore[return-value]

    config = script.Config(steps=({"text": "x"},), env={"TOKEN": "secret-value-123"})
    with pytest.raises(adaptor.RunError, match="returned NoneType from run()"):
        adaptor.Agent(Forgetful(config)).run("go")


def test_driver_emitting_something_not_an_event_is_told_what_emit_takes() -> None:
    # A dict passed to sink.emit() failed deep in the event broker with "'dict' object has
    # no attribute '_kind'", which says nothing about the driver's mistake.
    class EmitsADict(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            sink.emit({"kind": "text.content", "text": "hi"})
            return Response(output="hi")

    with pytest.raises(adaptor.RunError) as info:
        adaptor.Agent(EmitsADict([])).run("go")
    assert str(info.value) == "execution failed: driver 'script' raised TypeError"
    assert str(info.value.cause) == (
        "EventSink.emit() takes an event of adaptor.events or an "
        "adaptor.result.TranscriptItem, not dict"
    )


# --- pre-invocation refusals emit no events ---------------------------------------------------


def refused(agent: adaptor.Agent, **opts: Any) -> BaseException:
    stream = agent.stream("go", **opts)
    assert list(stream) == []
    with pytest.raises(adaptor.AdaptorError) as info:
        stream.result()
    assert not isinstance(info.value, adaptor.RunError)
    return info.value


@pytest.mark.parametrize(
    ("policy", "field", "value"),
    [
        (adaptor.Policy(active_execution_timeout=-1, sandbox="bogus"), "Policy.ActiveExecutionTimeout", -1),
        (adaptor.Policy(sandbox="bogus", web_search="bogus"), "Policy.Sandbox", "bogus"),
        (adaptor.Policy(web_search="maybe"), "Policy.WebSearch", "maybe"),
        (adaptor.Policy(browser=True), "Policy.Browser", True),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="yes")), "Policy.Approvals.Permission", "yes"),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(plan_review="ask_me")), "Policy.Approvals.PlanReview", "ask_me"),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="auto_approve")), "Policy.Approvals.Question", "auto_approve"),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_timeout="explode")), "Policy.Approvals.OnTimeout", "explode"),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_reject="")), "Policy.Approvals.OnReject", ""),
        (adaptor.Policy(approvals=adaptor.ApprovalPolicy(max_retries=-1)), "Policy.Approvals.MaxRetries", -1),
    ],
)
def test_invalid_policy_in_documented_order(policy: adaptor.Policy, field: str, value: Any) -> None:
    err = refused(adaptor.Agent(ScriptedDriver([{"text": "x"}])), policy=policy)
    assert isinstance(err, adaptor.InvalidPolicyError)
    assert (err.driver, err.field, err.value) == ("script", field, value)


def test_a_policy_that_is_not_a_policy_is_an_invalid_policy() -> None:
    # A dict (the JSON shape) used to fail with an AttributeError from inside the run.
    err = refused(adaptor.Agent(ScriptedDriver([{"text": "x"}])), policy={"sandbox": "read_only"})
    assert isinstance(err, adaptor.InvalidPolicyError)
    assert (err.field, err.value) == ("Policy", "dict")


@pytest.mark.parametrize(
    ("override", "policy", "dimension"),
    [
        ({"run_policy_caps": {"isolation": False}}, adaptor.Policy(sandbox="read_only"), "sandbox"),
        ({"run_policy_caps": {"web_search": False}}, adaptor.Policy(web_search="deny"), "web_search"),
        ({"run_policy_caps": {"browser": False}}, adaptor.Policy(browser="allow"), "browser"),
    ],
)
def test_capability_unsupported(override: dict[str, Any], policy: adaptor.Policy, dimension: str) -> None:
    err = refused(adaptor.Agent(ScriptedDriver([{"text": "x"}], descriptor=override)), policy=policy)
    assert isinstance(err, adaptor.PolicyCapabilityUnsupportedError)
    assert err.dimension == dimension


def test_inherited_values_are_never_checked_against_capabilities() -> None:
    nothing = {
        "run_policy_caps": {
            "isolation": False,
            "permission": {"ask": False, "auto_approve": False, "auto_reject": False},
            "plan_review": {"ask": False, "auto_approve": False, "auto_reject": False},
            "question": {"ask": False, "auto_reject": False},
        }
    }
    assert adaptor.Agent(ScriptedDriver([{"text": "ok"}], descriptor=nothing)).run("go").text == "ok"


@pytest.mark.parametrize(
    ("approvals", "kind", "mode"),
    [
        (adaptor.ApprovalPolicy(permission="ask", plan_review="ask"), "permission", "ask"),
        (adaptor.ApprovalPolicy(plan_review="auto_approve"), "plan_review", "auto_approve"),
        (adaptor.ApprovalPolicy(question="ask"), "question", "ask"),
    ],
)
def test_human_decision_mode_unsupported(approvals: adaptor.ApprovalPolicy, kind: str, mode: str) -> None:
    override = {
        "run_policy_caps": {
            "permission": {"ask": False},
            "plan_review": {"auto_approve": False, "ask": False},
            "question": {"ask": False},
        }
    }
    err = refused(
        adaptor.Agent(ScriptedDriver([{"text": "x"}], descriptor=override)),
        policy=adaptor.Policy(approvals=approvals),
    )
    assert isinstance(err, adaptor.HumanDecisionModeUnsupportedError)
    assert (err.kind, err.mode) == (kind, mode)


def test_invalid_driver_config_joins_its_cause() -> None:
    err = refused(adaptor.Agent(ScriptedDriver([{"dance": True}])))
    assert isinstance(err, adaptor.InvalidDriverConfigError)
    assert err.driver == "script" and err.cause is not None


def test_invalid_output_schema() -> None:
    err = refused(adaptor.Agent(ScriptedDriver([{"text": "x"}])), schema={"type": 12})
    assert isinstance(err, adaptor.InvalidOutputSchemaError)


def test_structured_output_unsupported() -> None:
    override = {"structured_output": {"native": False, "prompt_validate": False}}
    err = refused(adaptor.Agent(ScriptedDriver([{"text": "x"}], descriptor=override)), schema={"type": "object"})
    assert isinstance(err, adaptor.StructuredOutputUnsupportedError)
    assert err.driver == "script"


def test_closed_agent_refuses_and_close_is_idempotent() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    agent.close()
    agent.close()
    assert isinstance(refused(agent), adaptor.AgentClosedError)


def test_close_cancels_active_runs() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}, {"sleep": 30}]))
    stream = agent.stream("go")
    for event in stream:
        if isinstance(event, events.TextDelta) and event.phase == "end":
            agent.close(timeout=10)
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()


class KeepsProcesses(ScriptedDriver):
    """Records close_processes(); its run goes on until released, whatever the cancel."""

    def __init__(self) -> None:
        super().__init__([{"text": "x"}])
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed: list[float | None] = []

    def run(self, request: Request, sink: Any) -> Response:
        self.entered.set()
        self.release.wait(30)
        return super().run(request, sink)

    def close_processes(self, timeout: float | None = None) -> None:
        self.closed.append(timeout)


def test_a_close_interrupted_while_it_waits_leaves_the_processes_to_the_next_close() -> None:
    # The first close() alone closed the driver's processes: interrupted (Ctrl-C) while it
    # waited for a run, it never did, and every later close() took the agent as closed.
    driver = KeepsProcesses()
    agent = adaptor.Agent(driver)
    stream = agent.stream("go")
    assert driver.entered.wait(10)

    def interrupt_once_waiting() -> None:
        _until(lambda: agent.closed)
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it interrupts the blocked wait

    threading.Thread(target=interrupt_once_waiting, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        agent.close(timeout=60)
    assert driver.closed == []
    driver.release.set()
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()
    agent.close(timeout=10)
    assert len(driver.closed) == 1
    agent.close(timeout=10)
    assert len(driver.closed) == 1  # once done, not again


def test_programmer_errors_raise_immediately() -> None:
    with pytest.raises(TypeError):
        adaptor.Agent(None)  # type: ignore[arg-type]
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    with pytest.raises(TypeError):
        agent.run("go", modle="typo")
    with pytest.raises(TypeError):
        agent.run(None)  # type: ignore[arg-type]


def test_a_driver_class_or_something_not_a_store_is_refused_at_construction(tmp_path: Any) -> None:
    # The class instead of a driver made an Agent whose every run failed as an
    # InvalidDriverConfigError of a driver named "builtins"; a directory given as the store
    # failed every thread run, after its RunStarted, with "AttributeError: 'str' object has no
    # attribute 'acquire_lease'".
    with pytest.raises(TypeError, match=r"ScriptedDriver\(\.\.\.\)"):
        adaptor.Agent(ScriptedDriver)  # type: ignore[arg-type]
    for store in (str(tmp_path), JSONLStore, adaptor.memory):  # a path, a class, a module
        with pytest.raises(TypeError, match="thread_store takes a store"):
            adaptor.Agent(ScriptedDriver([{"text": "x"}]), thread_store=store)  # type: ignore[arg-type]
    adaptor.Agent(ScriptedDriver([{"text": "x"}]), thread_store=JSONLStore(tmp_path / "threads"))


class _Forwarding:
    """A wrapper passing every call on to ``inner`` through ``__getattr__`` (a logging store)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_store_or_skill_provider_forwarding_its_methods_is_taken(tmp_path: Any) -> None:
    # isinstance() against a runtime-checkable Protocol stopped calling __getattr__ in Python
    # 3.12: a wrapper forwarding its methods was refused there ("thread_store takes a store"),
    # taken on 3.11.
    store = _Forwarding(JSONLStore(tmp_path / "threads"))
    skills = _Forwarding(skill.Set({}))
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]), thread_store=store, skill_provider=skills)
    assert agent.thread_store is store and agent.skill_provider is skills
    # One that lacks a method is still refused, as the class of a store is.
    with pytest.raises(TypeError, match="thread_store takes a store"):
        adaptor.Agent(ScriptedDriver([{"text": "x"}]), thread_store=_Forwarding(object()))
    with pytest.raises(TypeError, match="skill_provider needs a get_skills"):
        adaptor.Agent(ScriptedDriver([{"text": "x"}]), skill_provider=_Forwarding(object()))


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("timeout", "30", "timeout must be a number of seconds"),  # (from a config file, unparsed)
        ("timeout", True, "timeout must be a number of seconds"),
        ("on_approval", "approve", "on_approval takes a callable"),
        ("schema_options", {"return_invalid": True}, r"schema_options takes adaptor\.SchemaOptions"),
        ("model", 5, "model takes a str"),
        ("instructions", ["be brief"], "instructions takes a str"),
        ("workspace", 5, "workspace takes a path"),
    ],
)
def test_an_option_of_the_wrong_type_is_a_type_error_at_once(option: str, value: Any, says: str) -> None:
    # They were taken as they came: a timeout of "30" failed with "'<' not supported between
    # instances of 'str' and 'float'", a dict as schema_options with an AttributeError after
    # the run started, a non-callable on_approval only at the run's first approval (as an
    # AgentFailedError), and a model of 5 came back as Result.model == 5.
    if option != "schema_options":  # (a call-only option)
        with pytest.raises(TypeError, match=says):
            adaptor.Agent(ScriptedDriver([{"text": "x"}]), **{option: value})
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    with pytest.raises(TypeError, match=says):
        agent.stream("go", **{option: value})
    with pytest.raises(TypeError, match=says):
        agent.thread("k").stream("go", **{option: value})


@pytest.mark.parametrize(
    ("option", "value", "error", "says"),
    [
        ("event_buffer", "5", TypeError, "event_buffer takes a number of events"),
        ("blocking_events", "no", TypeError, "blocking_events takes True or False"),
        ("spawn", "no", TypeError, "spawn takes True or False"),
        # It was silently read as the default 1024.
        ("event_buffer", 0, ValueError, "event_buffer must be at least 1"),
        ("lease_ttl", "300", TypeError, "lease_ttl must be a number of seconds"),
        ("lease_renewal", float("nan"), ValueError, "lease_renewal must be a number of seconds"),
        # Every store refuses a lease that long: each thread run failed after it started.
        ("lease_ttl", float("inf"), ValueError, r"lease_ttl must be at most ten years \(315,360,000 s\), not inf"),
        ("lease_ttl", 316_224_000, ValueError, "lease_ttl must be at most ten years"),
        # One tool, not a list: "'Definition' object is not iterable".
        ("tools", adaptor.tool.define("t", "d", lambda v: 1), TypeError, "tools takes a list"),
    ],
)
def test_a_construction_option_of_the_wrong_type_is_refused(
    option: str, value: Any, error: type[Exception], says: str
) -> None:
    # "no" (a config file's string) was read as yes; "5" and "300" failed later with
    # "'>' not supported ..."; a NaN lease passed the "must be positive" check.
    with pytest.raises(error, match=says):
        adaptor.Agent(ScriptedDriver([{"text": "x"}]), **{option: value})


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"name": 5}, "SchemaOptions.name takes a str or None, not an int"),
        ({"description": ["d"]}, "SchemaOptions.description takes a str or None, not a list"),
        ({"return_invalid": "no"}, "SchemaOptions.return_invalid takes True or False, not a str"),
    ],
)
def test_schema_options_of_the_wrong_type_are_refused_when_made(options: dict[str, Any], says: str) -> None:
    # A name of 5 failed the run after run.started with a bare AttributeError (outside the
    # taxonomy); return_invalid="no" let invalid output through as a success.
    with pytest.raises(TypeError, match=says):
        adaptor.SchemaOptions(**options)


def test_resume_only_takes_a_bool() -> None:
    # "no" was read as yes: the thread became resume-only and its first run ThreadNotFoundError.
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}], session="auto"), thread_store=adaptor.memory.Store())
    with pytest.raises(TypeError, match="resume_only takes True or False, not a str"):
        agent.thread("k", resume_only="no")  # type: ignore[arg-type]
    assert agent.thread("k", resume_only=False).run("go").text == "x"


def test_close_with_a_wrong_timeout_leaves_the_agent_open() -> None:
    # It was found only after the runs were cancelled and the agent marked closed.
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    for wrong, error in (("10", TypeError), (None, TypeError), (float("nan"), ValueError)):
        with pytest.raises(error, match="timeout"):
            agent.close(wrong)  # type: ignore[arg-type]
        assert not agent.closed
    assert agent.run("go").text == "x"
    agent.close(5)
    assert agent.closed


def test_a_path_workspace_reaches_the_driver_as_text(tmp_path: Any) -> None:
    # A pathlib.Path went to the driver as it was: the script driver's checkpoint then held a
    # Path, and every thread turn failed with "did not prove a resumable checkpoint".
    agent = adaptor.Agent(
        ScriptedDriver([{"text": "x"}], session="auto"),
        thread_store=adaptor.memory.Store(),
        workspace=tmp_path,
    )
    agent.thread("k").run("go")
    assert agent.thread("k").checkpoint().state.data["cwd"] == str(tmp_path)
    # The same folder given as text is the same workspace: the conversation goes on.
    stream = agent.thread("k").stream("again", workspace=str(tmp_path))
    notices = [e for e in stream if isinstance(e, events.Notice)]
    stream.result()
    assert not [n for n in notices if n.data.get("phase") == "thread.new_session"]


def test_agent_and_thread_are_runners_at_runtime() -> None:
    # adaptor.Runner is what a host's helpers take (as run_as does); isinstance() with it
    # raised "Instance and class checks can only be used with @runtime_checkable protocols".
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]), thread_store=adaptor.memory.Store())
    assert isinstance(agent, adaptor.Runner)
    assert isinstance(agent.thread("k"), adaptor.Runner)
    assert not isinstance(agent.stream("go"), adaptor.Runner)


def test_call_options_never_change_agent_defaults() -> None:
    seen: list[Request] = []

    class Capturing(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            seen.append(request)
            return super().run(request, sink)

    agent = adaptor.Agent(Capturing([{"text": "x"}]), model="m1", metadata={"a": "1", "b": "2"})
    agent.run("go", model="m2", metadata={"b": "3"})
    agent.run("go")
    assert seen[0].model_override == "m2" and dict(seen[0].metadata) == {"a": "1", "b": "3"}
    assert seen[1].model_override == "m1" and dict(seen[1].metadata) == {"a": "1", "b": "2"}


# --- approvals ----------------------------------------------------------------------------------


def test_callback_approve_continues_and_emits_notices_not_request_events() -> None:
    requests: list[events.ApprovalRequest] = []

    def handler(req: events.ApprovalRequest) -> None:
        requests.append(req)
        req.approve()
        with pytest.raises(adaptor.ApprovalResolvedError):
            req.approve()

    agent = adaptor.Agent(ScriptedDriver([PERMISSION, {"text": "wrote it"}]), on_approval=handler)
    stream = agent.stream("go")
    evs = collect(stream)
    assert stream.result().text == "wrote it"
    (req,) = requests
    assert req.id == f"{stream.run_id}-dec-1" and req.kind == "permission" and req.title == "write main.py"
    assert req.deadline is not None and req.created_at < req.deadline
    assert not any(isinstance(e, events.ApprovalRequest) for e in evs)
    notices = [e for e in evs if isinstance(e, events.Notice) and e.kind.startswith("approval.")]
    assert [n.kind for n in notices] == ["approval.requested", "approval.resolved"]
    assert notices[1].data["result"] == "approved"


def test_deny_aborts_with_partial_result() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([{"text": "plan"}, PERMISSION, {"text": "never"}]),
        on_approval=adaptor.deny_all("not today"),
    )
    with pytest.raises(adaptor.ApprovalDeniedError) as info:
        agent.run("go")
    err = info.value
    assert err.details["kind"] == "permission" and err.details["text"] == "not today"
    assert [i.text for i in err.result.transcript() if i.kind == "assistant"] == ["plan"]


def test_ask_without_callback_times_out() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "never"}]),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=0.2)),
    )
    with pytest.raises(adaptor.ApprovalTimeoutError):
        agent.run("go")


def test_event_form_request_is_answered_from_the_stream() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "approved path"}]),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=30)),
    )
    stream = agent.stream("go")
    for event in stream:
        if isinstance(event, events.ApprovalRequest):
            event.approve()
    assert stream.result().text == "approved path"


def test_question_answer_kind_mismatch_and_late_responses() -> None:
    captured: list[events.ApprovalRequest] = []

    def handler(req: events.ApprovalRequest) -> None:
        captured.append(req)
        with pytest.raises(adaptor.ApprovalKindMismatchError):
            req.approve()  # the request stays open
        req.answer("b")

    agent = adaptor.Agent(
        ScriptedDriver([QUESTION, {"text": "picked"}]),
        on_approval=handler,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask")),
    )
    stream = agent.stream("go")
    evs = collect(stream)
    assert stream.result().text == "picked"
    resolved = [e for e in evs if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    assert resolved[0].data["result"] == "answered" and resolved[0].data["choice"] == "b"
    # It said only "already resolved": how is what the second responder needs to know.
    with pytest.raises(adaptor.ApprovalResolvedError, match=r"already resolved \(answered\)"):
        captured[0].answer("a")


def test_answer_on_binary_kind_is_a_mismatch() -> None:
    def handler(req: events.ApprovalRequest) -> None:
        with pytest.raises(adaptor.ApprovalKindMismatchError):
            req.answer("yes")
        req.approve()

    agent = adaptor.Agent(ScriptedDriver([PERMISSION, {"text": "ok"}]), on_approval=handler)
    assert agent.run("go").text == "ok"


def test_a_live_approval_request_pickles_as_a_descriptive_one_and_copies_stay_live() -> None:
    import copy
    import pickle

    stream = adaptor.Agent(ScriptedDriver([PERMISSION, {"text": "done"}])).stream("go")
    for event in stream:
        if isinstance(event, events.ApprovalRequest):
            # Pickling raised "cannot pickle '_thread.lock' object" (a process pool, a queue).
            sent = pickle.loads(pickle.dumps(event))
            assert sent == event and not sent.settled
            with pytest.raises(adaptor.ApprovalUnavailableError):
                sent.approve()
            shallow, deep = copy.copy(event), copy.deepcopy(event)
            assert shallow == deep == event and deep.details is not event.details
            deep.approve()  # a copy in this process answers the live request
            assert event.settled
    assert stream.result().text == "done"


def test_expired_request_rejects_late_response() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION]),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=0.2)),
    )
    stream = agent.stream("go")
    held: list[events.ApprovalRequest] = []
    for event in stream:
        if isinstance(event, events.ApprovalRequest):
            held.append(event)
    with pytest.raises(adaptor.ApprovalTimeoutError):
        stream.result()
    with pytest.raises(adaptor.ApprovalExpiredError) as info:
        held[0].approve()
    assert isinstance(info.value, adaptor.ApprovalResolvedError)


def test_a_response_after_the_runs_own_deadline_never_wins() -> None:
    # The request's deadline is the run's (timeout 0.3 s, before the approval's 30 s), but
    # only the approval's was enforced at the response: an approve() in the few milliseconds
    # before the run's timer fired (later still on a busy machine) was taken, and the run
    # succeeded past its timeout.

    for _ in range(10):
        agent = adaptor.Agent(script.Driver(script.Config(steps=({"approval": {"kind": "permission"}}, {"text": "done"}))))
        stream = agent.stream("go", timeout=0.3)
        _approve_just_after_its_deadline(stream, timedelta(microseconds=200))
        with pytest.raises(adaptor.RunDeadlineExceededError):
            stream.result()
        agent.close()


@pytest.mark.parametrize("whose", ["the run's", "the approval's"])
def test_the_deadline_shown_is_never_earlier_than_the_one_enforced(
    whose: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The request's deadline was read off the wall clock first and the enforced one off the
    # monotonic clock after it, so however long the run thread was kept between the two readings
    # (CI once: over 200 us) the enforced instant lay that much after the one shown, and a
    # response after the shown deadline won.  A wall-clock reading that keeps its thread 50 ms
    # stands in for the busy machine.

    class _ReadThenKept(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            reading = datetime.now(tz)
            time.sleep(0.05)
            return reading

    monkeypatch.setattr(_run, "datetime", _ReadThenKept)
    steps = ({"approval": {"kind": "permission"}}, {"text": "done"})
    if whose == "the run's":
        agent = adaptor.Agent(script.Driver(script.Config(steps=steps)))
        stream = agent.stream("go", timeout=0.5)
    else:
        agent = adaptor.Agent(
            script.Driver(script.Config(steps=steps)),
            policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=0.5)),
        )
        stream = agent.stream("go")
    try:
        _approve_just_after_its_deadline(stream, timedelta(microseconds=1))
    finally:
        stream.cancel()
        agent.close()


def _approve_just_after_its_deadline(stream: adaptor.Stream, margin: timedelta) -> None:
    """Approve each request of ``stream`` once ``margin`` past its deadline (as the wall clock
    says, busy-waiting): the approval must lose."""

    for event in stream:
        if isinstance(event, events.ApprovalRequest):
            assert event.deadline is not None
            while datetime.now(UTC) < event.deadline + margin:
                pass
            with pytest.raises(adaptor.ApprovalExpiredError):
                event.approve()


def test_a_callback_waiting_for_a_human_is_told_at_the_deadline_and_late_answers_lose() -> None:
    seen: list[tuple[bool, bool]] = []
    returned = threading.Event()

    def handler(req: events.ApprovalRequest) -> None:
        try:
            req.wait(30)  # a human who never answers; the deadline (0.2 s) must end the wait
            with pytest.raises(adaptor.ApprovalExpiredError):
                req.approve()
            seen.append((req.settled, req.wait(0) is not None))
        finally:
            returned.set()

    with pytest.raises(adaptor.ApprovalTimeoutError):
        _asking_with_a_short_deadline(handler).run("go")
    # The run goes on without a callback still running once its request expired, so it may end
    # before the callback gets this far (seen once under load).
    assert returned.wait(30)
    assert seen == [(True, True)]


def test_a_callback_whose_late_answer_raises_times_the_attempt_out_not_the_run() -> None:
    def handler(req: events.ApprovalRequest) -> None:
        req.wait(30)
        req.approve()  # too late: ApprovalExpiredError, not caught here

    with pytest.raises(adaptor.ApprovalTimeoutError):
        _asking_with_a_short_deadline(handler).run("go")


def _asking_with_a_short_deadline(handler: Any) -> adaptor.Agent:
    return adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "went ahead"}]),
        on_approval=handler,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=0.2)),
    )


def test_a_response_after_the_deadline_loses_even_before_anything_expired_the_request() -> None:
    from adaptor.approval import Responder

    request = events.ApprovalRequest(id="a1", run_id="run_1", kind="permission")
    responder = Responder("permission", (), expires=time.monotonic() - 1)
    with pytest.raises(adaptor.ApprovalExpiredError):
        responder.approve(request)
    assert responder.outcome is not None and responder.outcome.result == "timed_out"
    assert Responder("permission", (), expires=time.monotonic() + 60).outcome is None


def test_an_empty_answer_is_refused_and_the_question_stays_open() -> None:
    def handler(req: events.ApprovalRequest) -> None:
        with pytest.raises(ValueError, match="needs an option"):
            req.answer("")
        req.answer("b")

    agent = adaptor.Agent(
        ScriptedDriver([QUESTION, {"text": "picked"}]),
        on_approval=handler,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask")),
    )
    assert agent.run("go").text == "picked"


def test_a_response_that_is_not_text_is_a_type_error_and_the_request_stays_open() -> None:
    # deny(5) and answer(5) were taken: the agent was sent the int as its reason or answer, and
    # the resolved notice and ApprovalDeniedError.details["text"] carried it.
    def handler(req: events.ApprovalRequest) -> None:
        wrong: list[Callable[[], None]] = [
            lambda: req.deny(None),  # type: ignore[arg-type]
            lambda: req.deny(b"no"),  # type: ignore[arg-type]
            (lambda: req.answer(5)) if req.kind == "question" else (lambda: req.deny(5)),  # type: ignore[arg-type]
        ]
        for respond in wrong:
            with pytest.raises(TypeError, match="takes a str"):
                respond()
        if req.kind == "question":
            req.answer("b")
        else:
            req.approve()

    agent = adaptor.Agent(
        ScriptedDriver([QUESTION, PERMISSION, {"text": "went on"}]),
        on_approval=handler,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask")),
    )
    stream = agent.stream("go")
    resolved = [e.data for e in stream if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    assert stream.result().text == "went on"
    assert [(r["result"], r["choice"]) for r in resolved] == [("answered", "b"), ("approved", "")]


def test_default_question_is_auto_rejected_without_consulting_the_handler() -> None:
    called: list[object] = []
    agent = adaptor.Agent(ScriptedDriver([QUESTION, {"text": "x"}]), on_approval=called.append)
    with pytest.raises(adaptor.ApprovalDeniedError):
        agent.run("go")
    assert called == []


@pytest.mark.parametrize(
    ("mode", "outcome"),
    [("auto_approve", "ok"), ("auto_reject", adaptor.ApprovalDeniedError)],
)
def test_auto_modes_short_circuit(mode: str, outcome: Any) -> None:
    called: list[object] = []
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "ok"}]),
        on_approval=called.append,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission=mode)),
    )
    if outcome == "ok":
        assert agent.run("go").text == "ok"
    else:
        with pytest.raises(outcome):
            agent.run("go")
    assert called == []


def test_approve_all_denies_questions() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, QUESTION, {"text": "x"}]),
        on_approval=adaptor.approve_all,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask")),
    )
    with pytest.raises(adaptor.ApprovalDeniedError) as info:
        agent.run("go")
    assert info.value.details["kind"] == "question"


def test_continue_fallback_lets_the_driver_go_on() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "worked around it"}]),
        on_approval=adaptor.deny_all(),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_reject="continue")),
    )
    assert agent.run("go").text == "worked around it"


def test_timeout_continue_fallback() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "carried on"}]),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(timeout=0.1, on_timeout="continue")),
    )
    assert agent.run("go").text == "carried on"


def test_retry_asks_again_with_new_id_and_attempt() -> None:
    seen: list[events.ApprovalRequest] = []

    def handler(req: events.ApprovalRequest) -> None:
        seen.append(req)
        if req.attempt < 2:
            req.deny("not yet")
        else:
            req.approve()

    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION, {"text": "third time"}]),
        on_approval=handler,
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_reject="retry")),
    )
    assert agent.run("go").text == "third time"
    assert [r.attempt for r in seen] == [0, 1, 2]
    assert len({r.id for r in seen}) == 3


def test_retry_exhaustion_aborts() -> None:
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION]),
        on_approval=adaptor.deny_all(),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_reject="retry", max_retries=2)),
    )
    with pytest.raises(adaptor.ApprovalDeniedError) as info:
        agent.run("go")
    assert info.value.details["attempts"] == 3
    assert str(info.value) == "approval rejected 3 times: retries exhausted; reason: denied by policy"


def test_retry_unsupported_warns_once_and_aborts() -> None:
    override = {"run_policy_caps": {"permission": {"retry": False}}}
    agent = adaptor.Agent(
        ScriptedDriver([PERMISSION], descriptor=override),
        on_approval=adaptor.deny_all(),
        policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(on_reject="retry")),
    )
    stream = agent.stream("go")
    evs = collect(stream)
    with pytest.raises(adaptor.ApprovalDeniedError):
        stream.result()
    warnings = [e for e in evs if isinstance(e, events.Notice) and e.data.get("warning")]
    assert [w.data["warning"] for w in warnings] == ["human_decision_retry_unsupported"]


def test_handler_that_raises_or_does_not_resolve_fails_the_run() -> None:
    def raising(req: events.ApprovalRequest) -> None:
        raise RuntimeError("handler bug")

    with pytest.raises(adaptor.AgentFailedError) as info:
        adaptor.Agent(ScriptedDriver([PERMISSION]), on_approval=raising).run("go")
    assert isinstance(info.value.cause, RuntimeError)

    with pytest.raises(adaptor.AgentFailedError, match="without resolving"):
        adaptor.Agent(ScriptedDriver([PERMISSION]), on_approval=lambda req: None).run("go")

    # deny_all is a factory: passed uncalled, it returns the handler and resolves nothing.
    with pytest.raises(adaptor.AgentFailedError, match=r"it returned a function.*deny_all\("):
        adaptor.Agent(ScriptedDriver([PERMISSION]), on_approval=adaptor.deny_all).run("go")  # type: ignore[arg-type]


def test_a_handler_whose_own_io_fails_fails_the_run_as_infrastructure() -> None:
    # The daemon's handler writes the pending file: on a full disk the verdict blamed the agent
    # (AgentFailedError, agent_error).  errors.md: an I/O error once the driver runs is a
    # RunError with reason infrastructure_error.
    def raising(req: events.ApprovalRequest) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(adaptor.RunError) as info:
        adaptor.Agent(ScriptedDriver([PERMISSION]), on_approval=raising).run("go")
    assert not isinstance(info.value, adaptor.AgentFailedError)
    assert info.value.reason == "infrastructure_error"
    assert isinstance(info.value.cause, OSError)
    assert "approval handler raised OSError" in str(info.value)


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), SystemExit(3)])
def test_a_handler_raising_a_base_exception_fails_the_run_like_any_raising_handler(
    raised: BaseException,
) -> None:
    # Not an Exception: once it unwound through the driver, the run blamed the driver and the
    # request stayed open, a response after the run's end accepted as if it counted.
    asked: list[events.ApprovalRequest] = []

    def raising(req: events.ApprovalRequest) -> None:
        asked.append(req)
        raise raised

    stream = adaptor.Agent(ScriptedDriver([PERMISSION, {"text": "done"}]), on_approval=raising).stream("go")
    evs = collect(stream)
    with pytest.raises(adaptor.AgentFailedError, match="approval handler raised") as info:
        stream.result()
    assert info.value.cause is raised
    # It says what was raised (it said only "approval handler raised").
    assert str(info.value).startswith(f"approval handler raised {type(raised).__name__}"), info.value
    assert_lifecycle(evs)
    resolved = [e for e in evs if isinstance(e, events.Notice) and e.kind == "approval.resolved"]
    assert [e.data["result"] for e in resolved] == ["aborted"]
    with pytest.raises(adaptor.ApprovalExpiredError):
        asked[0].approve()


# --- backpressure -------------------------------------------------------------------------------


class Burst(ScriptedDriver):
    """Prints a burst of raw output before running its script, then says so."""

    def __init__(self, steps: list[dict[str, Any]], lines: int, **kw: Any) -> None:
        super().__init__(steps, **kw)
        self.lines = lines
        self.burst_done = threading.Event()

    def run(self, request: Request, sink: Any) -> Response:
        for i in range(self.lines):
            sink.emit(events.ProcessInfo(kind="stdout", text=f"line {i}\n"))
        self.burst_done.set()
        return super().run(request, sink)


def test_slow_consumer_forces_drops_reported_by_dropped_events() -> None:
    driver = Burst([{"text": "after the burst"}], lines=100)
    stream = adaptor.Agent(driver, event_buffer=4).stream("go")
    assert driver.burst_done.wait(10)  # the consumer has not read anything yet
    evs = collect(stream)
    assert stream.result().text == "after the burst"
    assert_lifecycle(evs)
    dropped = [e for e in evs if isinstance(e, events.Dropped)]
    assert len(dropped) == 1
    report = dropped[0]
    assert report.by_kind == {"process.stdout": report.count}
    # RunStarted, the "driver started" notice and two lines filled the buffer; the other 98
    # lines were lost, in order
    assert (report.count, report.first_sequence, report.last_sequence) == (98, 5, 102)
    assert report.meta.sequence == 103 and report.reason == "backpressure"
    assert sum(d.count for d in dropped) == evs[-1].meta.sequence - len(evs)
    # reliable events after the loss were all delivered
    assert [e.phase for e in evs if isinstance(e, events.TextDelta)] == ["start", "content", "end"]


def test_the_final_dropped_of_a_run_its_deadline_ended_names_the_deadline() -> None:
    # Nobody read while the run went on, so its end left content unread: lost to the deadline,
    # which the RunFinished after it names too, not to a cancel() nobody called.
    steps = [{"text": f"c{i}"} for i in range(50)] + [{"sleep": 30}]
    stream = adaptor.Agent(ScriptedDriver(steps), event_buffer=1).stream("go", timeout=0.5)
    broker = stream._broker
    assert broker is not None
    _until(lambda: broker.finished)
    evs = collect(stream)
    with pytest.raises(adaptor.RunDeadlineExceededError):
        stream.result()
    finished = evs[-1]
    assert isinstance(finished, events.RunFinished) and finished.reason == "deadline_exceeded"
    final = evs[-2]
    assert isinstance(final, events.Dropped) and final.count > 0
    assert final.reason == "deadline_exceeded"
    assert_lifecycle(evs)


def test_blocking_events_never_drop() -> None:
    driver = Burst([{"text": "done"}], lines=100)
    stream = adaptor.Agent(driver, event_buffer=2, blocking_events=True).stream("go")
    evs = collect(stream)
    assert stream.result().text == "done"
    assert sum(isinstance(e, events.ProcessInfo) and e.kind == "stdout" for e in evs) == 100
    assert not any(isinstance(e, events.Dropped) for e in evs)
    assert [e.meta.sequence for e in evs] == list(range(1, len(evs) + 1))


def test_cancel_with_full_buffer_delivers_final_dropped_then_finished() -> None:
    steps = [{"text": f"c{i}"} for i in range(50)] + [{"sleep": 30}]
    agent = adaptor.Agent(ScriptedDriver(steps), event_buffer=1)
    stream = agent.stream("go")
    it = iter(stream)
    first = next(it)
    assert isinstance(first, events.RunStarted)
    broker = stream._broker
    assert broker is not None
    _until(lambda: len(broker._queue) == 1)  # the run entered the driver and filled the buffer
    stream.cancel()  # without draining: reserved slots must still carry the terminal
    rest = list(it)
    assert isinstance(rest[-1], events.RunFinished)
    assert rest[-1].reason == "cancelled"
    assert_lifecycle([first, *rest])
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()


# --- structured output ---------------------------------------------------------------------------


@dataclass
class Verdict:
    ok: bool
    notes: str


def test_native_structured_output_and_decode() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"output_json": {"ok": True, "notes": "fine"}}]))
    result = agent.run("review", schema=Verdict)
    assert result.structured is not None and result.structured.source == "native"
    assert result.decode(Verdict) == Verdict(ok=True, notes="fine")
    value, again = adaptor.run_as(agent, "review", Verdict)
    assert value == Verdict(ok=True, notes="fine") and again.text == result.text


def test_invalid_structured_output_is_a_policy_violation_with_result() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "```json\n{\"ok\": true}\n```"}]))
    with pytest.raises(adaptor.PolicyViolationError) as info:
        agent.run("review", schema=Verdict)
    assert info.value.result is not None and info.value.result.structured is not None
    assert not info.value.result.structured.valid


_BACKTRACKING_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": r"^(\w+\s?)+$"}},
}
# 30 characters: minutes for re in process (a bounded failure on code without the checker).
_BACKTRACKING_OUTPUT = {"name": "a" * 30 + "!"}


def test_a_pattern_check_still_running_at_the_deadline_is_the_run_deadline() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"output_json": _BACKTRACKING_OUTPUT}]))
    with pytest.raises(adaptor.RunDeadlineExceededError) as info:
        agent.run("name it", schema=_BACKTRACKING_SCHEMA, timeout=1.5)
    structured = info.value.result.structured if info.value.result else None
    assert structured is not None and not structured.valid
    assert structured.value == _BACKTRACKING_OUTPUT
    assert "validation did not finish" in structured.errors[0]


def test_a_pattern_check_over_its_limit_is_invalid_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adaptor.schema, "VALIDATION_LIMIT", 0.5)
    agent = adaptor.Agent(ScriptedDriver([{"output_json": _BACKTRACKING_OUTPUT}]))
    with pytest.raises(adaptor.PolicyViolationError, match="validation did not finish within 0.5s"):
        agent.run("name it", schema=_BACKTRACKING_SCHEMA)
    fine = agent_with_output({"name": "two words"}).run("name it", schema=_BACKTRACKING_SCHEMA)
    assert fine.structured is not None and fine.structured.valid


def test_output_nested_too_deeply_is_a_policy_violation_not_a_crash() -> None:
    # Past orjson's 1024 levels, the parser's fallback raised a bare RecursionError.
    for depth in (300, 5000):
        agent = adaptor.Agent(ScriptedDriver([{"text": "[" * depth + "]" * depth}]))
        with pytest.raises(adaptor.PolicyViolationError, match="structured output invalid"):
            agent.run("nest", schema={"type": "array"})


def test_output_with_many_errors_keeps_the_first_twenty() -> None:
    # 100,000 wrong items made 100,000 errors: a 4 MB message, verdict and log line.
    agent = agent_with_output(["x"] * 5000)
    with pytest.raises(adaptor.PolicyViolationError) as info:
        agent.run("count", schema={"type": "array", "items": {"type": "integer"}})
    structured = info.value.result.structured if info.value.result else None
    assert structured is not None and len(structured.errors) == 21
    assert structured.errors[0] == '$[0]: "x" is not of type "integer"'
    assert structured.errors[19].startswith("$[19]: ")
    assert structured.errors[-1] == "… and 4980 more errors"
    assert info.value.details["errors"] == list(structured.errors)
    assert len(str(info.value)) < 1000


def agent_with_output(value: object) -> adaptor.Agent:
    return adaptor.Agent(ScriptedDriver([{"output_json": value}]))


def test_return_invalid_succeeds_and_decode_raises() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"output_json": {"ok": "nope"}}]))
    result = agent.run(
        "review", schema=Verdict, schema_options=adaptor.SchemaOptions(return_invalid=True)
    )
    assert result.structured is not None and not result.structured.valid
    with pytest.raises(ValueError, match="structured output invalid"):
        result.decode()


def test_prompt_validation_mode_instructs_the_prompt() -> None:
    prompts: list[str] = []

    class Capturing(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            prompts.append(request.prompt)
            assert request.structured_output_source == "prompt_validate"
            return super().run(request, sink)

    override = {"structured_output": {"native": False}}
    agent = adaptor.Agent(Capturing([{"output_json": {"ok": True, "notes": ""}}], descriptor=override))
    result = agent.run("review this", schema=Verdict)
    assert result.structured is not None and result.structured.source == "prompt_validate"
    assert "review this" in prompts[0] and '"notes"' in prompts[0]


def test_descriptor_is_a_real_descriptor() -> None:
    assert isinstance(ScriptedDriver([]).descriptor(), Descriptor)


class Counting(ScriptedDriver):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.calls = 0

    def run(self, request: Request, sink: Any) -> Response:
        self.calls += 1
        return super().run(request, sink)


@pytest.mark.parametrize(
    ("steps", "descriptor", "options"),
    [
        ([{"text": "x"}], None, {"policy": adaptor.Policy(sandbox="bogus")}),
        ([{"text": "x"}], {"run_policy_caps": {"browser": False}}, {"policy": adaptor.Policy(browser="deny")}),
        (
            [{"text": "x"}],
            {"run_policy_caps": {"question": {"ask": False}}},
            {"policy": adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask"))},
        ),
        ([{"text": "x"}], None, {"schema": {"type": 12}}),
        ([{"text": "x"}], {"structured_output": {"native": False, "prompt_validate": False}}, {"schema": {}}),
        ([{"bogus_step": 1}], None, {}),
        ([{"text": "x"}], {"no_such_field": 1}, {}),
        ([{"text": "x"}], None, {"timeout": 0}),
    ],
)
def test_pre_invocation_failures_never_call_the_driver(
    steps: list[dict[str, Any]], descriptor: dict[str, Any] | None, options: dict[str, Any]
) -> None:
    driver = Counting(steps, descriptor=descriptor)
    agent = adaptor.Agent(driver)
    with pytest.raises(adaptor.AdaptorError) as info:
        agent.run("go", **options)
    assert not isinstance(info.value, adaptor.RunError)
    stream = agent.stream("go", **options)
    assert list(stream) == []
    with pytest.raises(type(info.value)):
        stream.result()
    assert driver.calls == 0
    agent.close()
    with pytest.raises(adaptor.AgentClosedError):
        agent.run("go")
    assert driver.calls == 0


# --- the threads that run pipelines ---------------------------------------------------------


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


class _Job:
    def __init__(self, ran: list[tuple[int, str]]) -> None:
        self.ran = ran
        self.done = threading.Event()

    def __call__(self) -> None:
        self.ran.append((threading.get_ident(), threading.current_thread().name))
        self.done.set()


def test_an_idle_run_thread_takes_the_next_run_and_keeps_nothing_of_the_last() -> None:
    threads = _run._RunThreads()
    ran: list[tuple[int, str]] = []
    first = _Job(ran)
    threads.start(first, "adaptor-run_1")
    assert first.done.wait(10)
    _until(lambda: threads._idle == 1)
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None  # the idle thread does not keep its last run alive
    second = _Job(ran)
    threads.start(second, "adaptor-run_2")
    assert second.done.wait(10)
    assert ran[0][0] == ran[1][0]  # the same thread, no new one started
    assert [name for _, name in ran] == ["adaptor-run_1", "adaptor-run_2"]


def test_a_finished_run_is_freed_without_waiting_for_the_garbage_collector() -> None:
    # The stream held the run's cancel and the run its stream: every finished run (its prompt,
    # its options, its result) stayed until a full collection, which a daemon makes rarely,
    # so one serving 900 KB prompts grew by hundreds of MB and kept them while idle.
    agent = adaptor.Agent(script.Driver(script.Config(steps=({"text": "ok"},))), workspace=os.getcwd())
    agent.run("warm up")  # (first-use caches)
    gc.collect()
    gc.disable()
    try:
        stream = agent.stream("P" * 100_000)
        assert [e for e in stream if isinstance(e, events.TextDelta) and e.phase == "content"]
        result = stream.result()
        _until(lambda: not _run._unsettled._runs)  # the run's thread is done with it
        ran = weakref.ref(stream), weakref.ref(result)
        del stream, result
        assert [ref() for ref in ran] == [None, None]
    finally:
        gc.enable()
        agent.close()


def test_a_run_thread_idle_past_its_time_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_run, "_IDLE_SECONDS", 0.05)
    threads = _run._RunThreads()
    ran: list[tuple[int, str]] = []
    job = _Job(ran)
    threads.start(job, "adaptor-run_1")
    assert job.done.wait(10)
    _until(lambda: all(t.ident != ran[0][0] for t in threading.enumerate()))
    assert threads._idle == 0
    later = _Job(ran)
    threads.start(later, "adaptor-run_2")  # a new thread, as none is idle
    assert later.done.wait(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_pipelines_on_threads_of_its_own() -> None:
    ran: list[tuple[int, str]] = []
    job = _Job(ran)
    _run._run_threads.start(job, "adaptor-run_parent")
    assert job.done.wait(10)
    _until(lambda: _run._run_threads._idle >= 1)  # the parent now has an idle thread
    pid = os.fork()
    if pid == 0:  # the child has no copy of that thread: a run handed to it would never start
        status = 1
        try:
            child_job = _Job([])
            _run._run_threads.start(child_job, "adaptor-run_child")
            status = 0 if child_job.done.wait(10) else 1
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


_AT_THE_TASK_LIMIT = """
import sys
import adaptor
from adaptor import events
from adaptor.testing import ScriptedDriver

prompts = []

class Recording(ScriptedDriver):
    def run(self, request, sink):
        prompts.append(request.prompt)
        return super().run(request, sink)

agent = adaptor.Agent(Recording([{"text": "hi"}]))
print("ready", flush=True)
sys.stdin.readline()  # capped: not one more thread
stream = agent.stream("first")
seen = [events.event_kind(e) for e in stream]
try:
    stream.result()
except RuntimeError as exc:
    print(" ".join(seen), "|", exc, flush=True)
sys.stdin.readline()  # lifted
print(agent.run("second").text, prompts, flush=True)
"""


def test_a_run_that_gets_no_thread_ends_at_once_and_is_never_run_later() -> None:
    from tests.task_limit import HeldChild

    with HeldChild(_AT_THE_TASK_LIMIT) as child:
        assert child.first_line == b"ready\n" and child.limit is not None
        child.limit.cap()
        seen, _, error = child.step().decode().partition(" | ")
        assert seen == "run.started run.finished"
        assert error.startswith("cannot start a thread for the run (can't start new thread)")
        # Both limits a thread meets are named (an address-space limit was told as a task limit).
        assert "ulimit -u" in error and "ulimit -v" in error, error
        child.limit.lift()
        assert child.step() == b"hi ['second']\n"


@pytest.mark.parametrize("timeout", [3e11, 1e308, float("inf")])
def test_an_approval_timeout_beyond_any_date_is_no_deadline(timeout: float) -> None:
    agent = adaptor.Agent(ScriptedDriver([PERMISSION, {"text": "done"}]))
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask", timeout=timeout))
    seen: list[adaptor.ApprovalRequest] = []

    def approve(request: adaptor.ApprovalRequest) -> None:
        seen.append(request)
        request.approve()

    assert agent.run("go", policy=policy, on_approval=approve).text == "done"
    assert seen[0].deadline is None


# --- waiting on a stream from several places ----------------------------------------------------


def test_a_loss_the_run_ends_on_is_reported_as_backpressure_not_cancelled() -> None:
    # finish() cancels the broker to free blocked producers, and then labelled every loss
    # still pending "cancelled", also on runs nobody cancelled.
    from adaptor.drivers import script

    driver = script.Driver(script.Config(steps=tuple({"stdout": f"line {i}"} for i in range(20))))
    stream = adaptor.Agent(driver, event_buffer=2).stream("go")
    broker = stream._broker
    assert broker is not None
    reading = iter(stream)
    evs = [next(reading)]
    while not isinstance(evs[-1], events.ProcessInfo):  # the spawn: the lines come next
        evs.append(next(reading))
    _until(lambda: broker.finished)  # the run ended with its last lines lost, unread
    evs += list(reading)
    stream.result()
    dropped = [e for e in evs if isinstance(e, events.Dropped)]
    assert dropped and {d.reason for d in dropped} == {"backpressure"}
    assert isinstance(evs[-1], events.RunFinished) and not evs[-1].failed


def test_result_in_another_thread_leaves_the_events_to_the_thread_reading_them() -> None:
    # result() drained the broker itself: a reader in another thread got nothing, not even
    # the RunFinished it must see exactly once.
    steps: list[dict[str, Any]] = [step for i in range(5) for step in ({"sleep": 0.01}, {"text": f"t{i}"})]
    for _ in range(5):
        stream = adaptor.Agent(ScriptedDriver(steps)).stream("go")
        reading = iter(stream)
        evs = [next(reading)]  # a reader is iterating before result() is called
        waiter = threading.Thread(target=stream.result)
        waiter.start()
        evs += list(reading)
        waiter.join(10)
        assert_lifecycle(evs)
        assert [e.text for e in evs if isinstance(e, events.TextDelta) and e.phase == "content"] == [
            f"t{i}" for i in range(5)
        ]


def test_result_raises_the_same_error_with_the_same_traceback_every_time() -> None:
    stream = adaptor.Agent(ScriptedDriver([{"fail": {"message": "broken"}}])).stream("go")
    lengths = []
    for _ in range(4):
        with pytest.raises(adaptor.RunError) as caught:
            stream.result()
        frames, tb = 0, caught.value.__traceback__
        while tb is not None:
            frames, tb = frames + 1, tb.tb_next
        lengths.append(frames)
    assert len(set(lengths)) == 1, lengths  # grew by two frames per call before


def _failing_callback(request: adaptor.ApprovalRequest) -> None:
    raise LookupError("the callback's own failure")


@pytest.mark.parametrize("how", ["plain failure", "failure with a cause"])
def test_result_raised_again_inside_an_except_block_keeps_the_error_s_cause(how: str) -> None:
    # result() raised the one stored error again; raised inside an `except` block it took that
    # block's exception as its __context__, and every holder of the error saw it as its cause
    # (to_wire, errors.find) from then on.
    if how == "plain failure":
        agent = adaptor.Agent(ScriptedDriver([{"exit": 2}]))
        stream = agent.stream("go")
    else:
        policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="ask"))
        agent = adaptor.Agent(ScriptedDriver([{"approval": {"kind": "permission"}}]), policy=policy)
        stream = agent.stream("go", on_approval=_failing_callback)
    with agent, pytest.raises(adaptor.AdaptorError) as caught:
        stream.result()
    first = caught.value
    wire = errors.to_wire(first)
    unrelated: dict[str, int] = {}
    try:
        unrelated["key"]
    except KeyError:
        with pytest.raises(adaptor.AdaptorError) as again:
            stream.result()
    assert again.value is first  # the same error every time
    assert errors.to_wire(again.value) == wire
    assert not errors.matches(first, KeyError)
    assert errors.matches(first, LookupError) is (how == "failure with a cause")


def test_ctrl_c_while_run_waits_cancels_the_run_and_stops_its_process(tmp_path: Any) -> None:
    from adaptor.drivers import command

    pid_file = tmp_path / "pid"
    marker = tmp_path / "side-effect"
    script = f"echo $$ > {pid_file}; sleep 30; : > {marker}"
    agent = adaptor.Agent(command.Driver(command.Config("/bin/sh", extra_args=("-c", script))))

    def interrupt_once_started() -> None:
        _until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it interrupts a blocked wait

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        agent.run("go")
    # The run was cancelled before the exception went on: nothing of it is left running.
    assert not agent._active
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not marker.exists()


_INTERRUPTED_FROM_ANOTHER_THREAD = """
import os, signal, sys, threading, time
import adaptor
from adaptor.drivers import command

pid_file, marker, waiting = sys.argv[1:]
script = f"echo $$ > {pid_file}; sleep 30; : > {marker}"
agent = adaptor.Agent(command.Driver(command.Config("/bin/sh", extra_args=("-c", script))))

def interrupt_from_here_once_started():
    while not (os.path.exists(pid_file) and open(pid_file).read().strip()):
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # handled on this thread

threading.Thread(target=interrupt_from_here_once_started, daemon=True).start()
try:
    if waiting == "run":
        agent.run("go")
    else:
        stream = agent.stream("go")
        try:
            for _ in stream:
                pass
        finally:
            stream.cancel()
except KeyboardInterrupt:
    print("interrupted")
agent.close()
"""


_INTERRUPTED_WHILE_CLOSING = """
import os, signal, sys, threading, time
import adaptor
from adaptor.drivers import command

pid_file, marker = sys.argv[1:]
# It ignores the cancel's SIGTERM (and so does its sleep), for longer than the test waits.
script = f"trap '' TERM; echo $$ > {pid_file}; sleep 5; : > {marker}"
agent = adaptor.Agent(command.Driver(command.Config("/bin/sh", extra_args=("-c", script), grace_period=60)))

def run():
    try:
        agent.run("go")
    except adaptor.RunError:
        pass

def started():
    while not (os.path.exists(pid_file) and open(pid_file).read().strip()):
        time.sleep(0.01)
    return int(open(pid_file).read())

def interrupt_from_here_while_closing():
    started()
    time.sleep(0.5)  # the main thread is waiting in close() by now
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # handled on this thread

threading.Thread(target=run, daemon=True).start()
pid = started()
threading.Thread(target=interrupt_from_here_while_closing, daemon=True).start()
try:
    agent.close(60)
except KeyboardInterrupt:
    print("interrupted")
os.killpg(pid, signal.SIGKILL)
os._exit(0)
"""


def test_ctrl_c_handled_on_another_thread_interrupts_agent_close(tmp_path: Any) -> None:
    # close(timeout) waited for the runs in one wait of the whole timeout: a Ctrl-C the kernel
    # handed to another thread was not seen until the runs had ended (or the timeout passed).
    marker = tmp_path / "side-effect"
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_WHILE_CLOSING, str(tmp_path / "pid"), str(marker)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.stdout == "interrupted\n", proc.stderr
    assert not marker.exists()  # interrupted while the agent slept, not once it was done


@pytest.mark.parametrize("waiting", ["run", "iterating"])
def test_a_signal_handled_on_another_thread_still_interrupts_the_main_threads_wait(
    tmp_path: Any, waiting: str
) -> None:
    # The kernel may hand a process's SIGINT (or adaptor run's SIGTERM) to any thread, and one
    # may land just before the main thread blocks: CPython then runs the handler only when the
    # main thread next executes bytecode.  A main thread blocked until the run's next event slept
    # through Ctrl-C until the agent was done (`adaptor run --no-daemon` ignored a SIGTERM).
    marker = tmp_path / "side-effect"
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_FROM_ANOTHER_THREAD, str(tmp_path / "pid"), str(marker), waiting],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.stdout == "interrupted\n", proc.stderr
    assert not marker.exists()  # interrupted while the agent slept, not once it was done


def test_a_nan_timeout_is_refused_not_no_deadline() -> None:
    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    with pytest.raises(ValueError, match="nan"):
        agent.run("go", timeout=float("nan"))
    with pytest.raises(ValueError, match="nan"):
        adaptor.Agent(ScriptedDriver([{"text": "x"}]), timeout=float("nan")).run("go")


def test_result_after_a_peek_at_the_first_event_still_drains_the_rest() -> None:
    # An iterator this thread left open is not reading: result() must not wait for it, or a
    # run with more events than the buffer holds would wedge (its producers blocked on it).
    # In a child process: in this one, a wedge would hang the suite instead of failing it.
    proc = subprocess.run([sys.executable, "-c", _PEEK_THEN_RESULT], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "last\n"), proc.stderr


_PEEK_THEN_RESULT = """
import adaptor
from adaptor import events
from adaptor.testing import ScriptedDriver

stream = adaptor.Agent(ScriptedDriver([{"text": "a"}] * 30 + [{"text": "last"}]), event_buffer=4).stream("go")
peek = iter(stream)
assert isinstance(next(peek), events.RunStarted)
print(stream.result().transcript()[-1].text)
"""


_LEAVES_MID_STREAM = """
import sys
import adaptor
from adaptor.drivers import command

pid_file, how = sys.argv[1:]
script = f"echo $$ > {pid_file}; echo started; sleep 60"
grace = 2.0
if how == "stubborn":  # ignores SIGTERM, with a grace longer than the exit waits for its runs
    script = f"trap '' TERM; echo $$ > {pid_file}; echo started; while :; do sleep 1; done"
    grace = 300.0
if how == "stubborn-interrupted":  # it notes the SIGTERM, for the test to send its Ctrl-C then
    script = f"trap 'echo > {pid_file}.term' TERM; echo $$ > {pid_file}; echo started; while :; do sleep 1; done"
    grace = 300.0
agent = adaptor.Agent(command.Driver(command.Config("/bin/sh", extra_args=("-c", script), grace_period=grace)))
stream = agent.stream("go")
for event in stream:
    if isinstance(event, adaptor.TextDelta) and "started" in event.text:
        break
if how == "raise":
    raise RuntimeError("the host's own code failed mid-stream")
sys.exit(3)  # the program ends with its run still going
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
    except FileNotFoundError:
        return False
    return line[line.rfind(b")") + 2 :].split()[0] != b"Z"


@pytest.mark.parametrize("how", ["raise", "exit", "stubborn"])
def test_a_program_that_ends_with_its_run_going_stops_the_agent_process(tmp_path: Any, how: str) -> None:
    # Run threads are daemon threads: a program leaving while a run went on (an exception out
    # of its `for event in stream` loop, a sys.exit) left the agent CLI running on its own,
    # still working in the workspace with nobody to read its answer.  One ignoring SIGTERM
    # with a grace_period past the 10 s the exit waits was never sent its SIGKILL.
    pid_file = tmp_path / "pid"
    proc = subprocess.run(
        [sys.executable, "-c", _LEAVES_MID_STREAM, str(pid_file), how],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == (1 if how == "raise" else 3), proc.stderr
    pid = int(pid_file.read_text())
    try:
        assert not _running(pid)
    finally:
        if _running(pid):  # (the agent's process group: its `sleep` too)
            os.killpg(pid, signal.SIGKILL)


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_ctrl_c_during_the_exit_wait_kills_the_agent_at_once(tmp_path: Any) -> None:
    # A second Ctrl-C (or a SIGTERM handler's sys.exit) while the exit waited for the runs to
    # stop cut that wait short: "Exception ignored in atexit callback ... KeyboardInterrupt",
    # and the agent, which ignores SIGTERM, was never sent its SIGKILL.
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEAVES_MID_STREAM, str(pid_file), "stubborn-interrupted"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_for(lambda: os.path.exists(f"{pid_file}.term") or proc.poll() is not None)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    pid = int(pid_file.read_text())
    try:
        _wait_for(lambda: not _running(pid), timeout=10)  # (reaped by init once orphaned)
    finally:
        if _running(pid):
            os.killpg(pid, signal.SIGKILL)


def test_the_sdks_own_reports_emitted_by_a_driver_are_not_passed_on() -> None:
    # A driver's Dropped told the consumer of five events lost that never were; its approval
    # notices, of approvals nobody was asked.
    class Spoofing(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            sink.emit(events.RunStarted(run_id="run_fake"))
            sink.emit(events.Dropped(count=5, first_sequence=1, last_sequence=5))
            sink.emit(events.Notice(kind="approval.resolved", text="approved", data={"result": "approved"}))
            sink.emit(events.Notice(kind="approval.requested", text="edit?"))
            sink.emit(events.Notice(kind="transcript.item", text="fake", data={"kind": "assistant"}))
            sink.emit(events.Notice(kind="driver.progress", text="kept"))
            return super().run(request, sink)

    stream = adaptor.Agent(Spoofing([{"text": "x"}])).stream("go")
    seen = list(stream)
    assert stream.result().text == "x"
    assert [type(e).__name__ for e in seen].count("RunStarted") == 1
    assert not [e for e in seen if isinstance(e, events.Dropped)]
    notices = [e.kind for e in seen if isinstance(e, events.Notice)]
    assert "driver.progress" in notices
    assert not [k for k in notices if k.startswith("approval.")]
    assert not [e for e in seen if isinstance(e, events.Notice) and e.text == "fake"]


def test_deny_all_takes_its_reason_as_text() -> None:
    # deny_all(5) was accepted and failed the run at its first approval (AgentFailedError).
    with pytest.raises(TypeError, match="deny_all takes a reason"):
        adaptor.deny_all(5)  # type: ignore[arg-type]


def test_close_from_a_runs_own_approval_callback_does_not_wait_for_that_run() -> None:
    # The run cannot end before its callback returns: close() waited its whole timeout for it.
    closed = threading.Event()
    agent: adaptor.Agent

    def close_in_callback(request: adaptor.ApprovalRequest) -> None:
        agent.close(timeout=600)
        closed.set()
        request.deny("closing")

    steps: list[dict[str, Any]] = [{"approval": {"kind": "permission", "title": "edit?"}}, {"text": "x"}]
    agent = adaptor.Agent(ScriptedDriver(steps), on_approval=close_in_callback)
    stream = agent.stream("go")
    waiter = threading.Thread(target=lambda: list(stream), daemon=True)
    waiter.start()
    assert closed.wait(60), "close() waited for the run whose callback called it"
    waiter.join(60)
    with pytest.raises(adaptor.RunCancelledError):
        stream.result()
    assert agent.closed


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_callback_waiting_for_a_human_does_not_hold_up_the_runs_end(how: str) -> None:
    # The callback ran on the run's own thread: the run's timeout and cancel() ended it only
    # once the callback returned (12 s later for one waiting 12 s; never for one never
    # answered), though the request had expired long before.
    answered = threading.Event()
    returned = threading.Event()
    seen: list[adaptor.ApprovalRequest] = []

    def waits_for_a_human(request: adaptor.ApprovalRequest) -> None:
        seen.append(request)
        answered.wait(30)
        returned.set()

    steps: list[dict[str, Any]] = [{"approval": {"kind": "permission", "title": "edit?"}}, {"text": "x"}]
    agent = adaptor.Agent(ScriptedDriver(steps), on_approval=waits_for_a_human)
    try:
        if how == "timeout":
            with pytest.raises(adaptor.RunDeadlineExceededError):
                agent.run("go", timeout=0.5)
        else:
            stream = agent.stream("go")
            _wait_for(lambda: bool(seen))
            stream.cancel()
            with pytest.raises(adaptor.RunCancelledError):
                stream.result()
        assert not returned.is_set()  # ended while the callback still waited
        assert seen[0].settled  # and the callback is told it is too late
    finally:
        answered.set()
        agent.close()


def test_a_callback_that_answers_then_goes_on_does_not_hold_up_the_run(caplog: pytest.LogCaptureFixture) -> None:
    # One that approved, then posted to a chat (or waited for a follow-up), held the run
    # until it returned: past its timeout, past cancel(), for ever if it never did.
    later = threading.Event()
    returned = threading.Event()

    def approves_then_goes_on(request: adaptor.ApprovalRequest) -> None:
        request.approve()
        later.wait(30)
        returned.set()

    steps: list[dict[str, Any]] = [{"approval": {"kind": "permission", "title": "edit?"}}, {"text": "done"}]
    agent = adaptor.Agent(ScriptedDriver(steps), on_approval=approves_then_goes_on)
    try:
        assert agent.run("go", timeout=20).text == "done"
        assert not returned.is_set()
    finally:
        later.set()
        agent.close()
    # One that raises right after answering: its answer stands too (the run failed with
    # "approval handler raised" when the raise came before the run's next look).

    # What it raised is said on the adaptor.approval logger, whenever it comes (it was silent).
    raised, never = threading.Event(), threading.Event()

    def approves_then_raises(request: adaptor.ApprovalRequest) -> None:
        request.approve()
        never.wait(0.3 if raised.is_set() else 0)  # a pause, the second time
        raise RuntimeError("after the answer")

    for _ in range(2):  # at once (the run sees it), then after the run went on
        with caplog.at_level("WARNING", logger="adaptor.approval"):
            with adaptor.Agent(ScriptedDriver(steps), on_approval=approves_then_raises) as raising:
                assert raising.run("go", timeout=20).text == "done"
        raised.set()
    deadline = time.monotonic() + 30
    while len([r for r in caplog.records if "after the answer" in r.getMessage()]) < 2:
        assert time.monotonic() < deadline, caplog.records
        time.sleep(0.02)


def test_close_waits_as_long_as_it_takes_with_an_infinite_timeout() -> None:
    # OverflowError half way through closing: runs cancelled, the driver's processes and the
    # tool gateway left up.
    agent = adaptor.Agent(script.Driver(script.Config(steps=({"sleep": 30}, {"text": "done"}))))
    stream = agent.stream("x")
    agent.close(timeout=float("inf"))  # with the run still registered: its wait is what overflowed
    with pytest.raises((adaptor.RunCancelledError, adaptor.CancelledError)):
        stream.result()


def test_a_run_thread_between_runs_is_not_named_after_its_last_run() -> None:
    with adaptor.Agent(script.Driver(script.Config(steps=({"text": "hi"},)))) as agent:
        result = agent.run("x")
        # The run's thread renames itself once run() is over, just after the result is out;
        # before, it idled for 60 s under the ended run's name.
        deadline = time.monotonic() + 10
        while f"adaptor-{result.run_id}" in {t.name for t in threading.enumerate()}:
            assert time.monotonic() < deadline, "a dump still shows the ended run as running"
            time.sleep(0.01)
        assert any(t.name == "adaptor-run-idle" for t in threading.enumerate())


@pytest.mark.parametrize("name", ["script", "claude", "codex", "gemini", "cursor", "codebuddy"])
def test_a_driver_configs_repr_leaves_its_env_values_out(name: str) -> None:
    import importlib

    module = importlib.import_module(f"adaptor.drivers.{name}")
    shown = repr(module.Config(env={"API_KEY": "sk-supersecret"}))
    assert "sk-supersecret" not in shown
    from adaptor.drivers import command

    assert "sk-supersecret" not in repr(command.Config("x", env={"API_KEY": "sk-supersecret"}))


def test_documented_calls_type_check_as_they_run() -> None:
    # Checked by mypy --strict with the rest of the suite (tests/test_static.py): `tools=None`
    # ("no tools") and a hint no type[T] holds were refused by the annotations though they run.
    steps = ({"text": "[1, 2]"},)
    agent = adaptor.Agent(script.Driver(script.Config(steps=steps)), tools=None)
    result = agent.run("x")
    numbers: list[int] | None = result.decode(list[int] | None)
    assert numbers == [1, 2]
    value, _ = adaptor.run_as(agent, "x", list[int] | None)
    assert value == [1, 2]
    try:
        raise adaptor.AgentFailedError("boom")
    except adaptor.RunError as err:
        assert err.result.text == ""  # always a Result: no None check needed


@pytest.mark.parametrize("refused", ["policy", "deadline", "closed"])
def test_a_refusal_made_inside_the_callers_except_block_has_no_cause_of_the_callers(refused: str) -> None:
    # Started as a fallback in an `except KeyError:` block, a run refused before admission took
    # the host's KeyError for its cause: errors.find() found it, the wire carried it, and the
    # same refusal made anywhere else had none.
    agent = adaptor.Agent(
        ScriptedDriver([{"text": "x"}]),
        policy=adaptor.Policy(sandbox="nope") if refused == "policy" else None,
        timeout=0 if refused == "deadline" else None,
    )
    if refused == "closed":
        agent.close()
    settings: dict[str, str] = {}
    try:
        settings["config"]  # the host's own failure, handled below
    except KeyError:
        stream = agent.stream("p")
    with pytest.raises(errors.AdaptorError) as raised:
        stream.result()
    err = raised.value
    assert err.__cause__ is None and not errors.find(err, KeyError), err.__cause__
    assert errors.to_wire(err)["cause"] is None
    with pytest.raises(type(err)) as outside:  # as the same refusal made outside any except block
        agent.run("p")
    assert errors.to_wire(outside.value)["cause"] == errors.to_wire(err)["cause"]


def test_an_iterator_handed_to_another_thread_keeps_its_events_while_its_first_thread_waits_for_the_result() -> None:
    # asyncio.to_thread(next, it) advances one iterator from worker to worker; result() on the
    # worker where the iteration began took it for an iterator nobody read and dropped its
    # events (a silent gap, no RunFinished), even with blocking_events=True.
    steps = [{"text": f"t{i}"} for i in range(200)]
    agent = adaptor.Agent(ScriptedDriver(steps), event_buffer=4, blocking_events=True)
    stream = agent.stream("p")
    it = iter(stream)
    seen = [next(it)]  # the iteration begins in this thread...
    reader = threading.Thread(target=lambda: seen.extend(it))  # ...and goes on in another
    reader.start()
    result = stream.result()  # while this thread waits for the result
    reader.join(60)
    assert not reader.is_alive()
    assert [e.meta.sequence for e in seen] == list(range(1, len(seen) + 1))
    assert isinstance(seen[-1], events.RunFinished) and not any(isinstance(e, events.Dropped) for e in seen)
    assert [e.text for e in seen if isinstance(e, events.TextDelta) and e.text] == [s["text"] for s in steps]
    assert result.text.endswith("t199")
    agent.close()


_FORK_WHILE_A_RUN_IMPORTS_THE_TOOL_SDK = """
import os, sys, threading, time
import adaptor
from adaptor import tool
from adaptor.drivers import script

def agent():
    steps = [{"call_tool": {"name": "echo", "args": {}}}, {"text": "done"}]
    return adaptor.Agent(script.Driver(script.Config(steps=steps)),
                         tools=[tool.define("echo", "Echo", lambda v: "echoed")])

parent = agent()
first = threading.Thread(target=lambda: parent.run("first"))
first.start()
for _ in range(10000):  # until the run imports the MCP SDK
    if "mcp" in sys.modules:
        break
    time.sleep(0.0005)
assert "mcp" in sys.modules and "uvicorn" not in sys.modules, "not forked mid-import"
copy = os.fork()
if copy == 0:
    status = 1
    try:
        status = 0 if agent().run("in the copy").text == "done" else 1
    finally:
        os._exit(status)
ended = []
threading.Thread(target=lambda: ended.append(os.waitpid(copy, 0)[1]), daemon=True).start()
for _ in range(600):
    if ended:
        break
    time.sleep(0.1)
else:
    os.kill(copy, 9)
    sys.exit("the forked copy's run with tools hung")
first.join()
parent.close()
sys.exit(f"the copy's run failed: {ended}" if os.waitstatus_to_exitcode(ended[0]) else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_a_run_imports_the_tool_sdk_leaves_the_copy_able_to_run_tools() -> None:
    # A program's first run with host tools imports the MCP SDK (about a second); forked in
    # that time, the copy inherited the import's module locks held by a thread it does not
    # have, and its own first run with tools hung for ever.  The fork now waits the import out.
    shown = subprocess.run([sys.executable, "-c", _FORK_WHILE_A_RUN_IMPORTS_THE_TOOL_SDK],
                           capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr[-2000:]


_STOPPED_PAST_ITS_DEADLINE = """
import os, signal, sys, threading, time
import adaptor
from adaptor.drivers import script

agent = adaptor.Agent(script.Driver(script.Config(steps=[{"sleep": 0.5}, {"text": "finished"}])))
stopper = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGSTOP))
stopper.start()
try:
    print("ok:", agent.run("go", timeout=1.0).text)
except adaptor.RunDeadlineExceededError:
    print("deadline")
"""


def test_a_run_whose_deadline_passed_while_the_program_was_stopped_fails() -> None:
    # The program is stopped (SIGSTOP, a suspended laptop) mid-run and goes on past the run's
    # deadline: the script driver's own wait and the run's deadline timer then ended together,
    # and when the driver got on first the run succeeded after its deadline (half the trials).
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _STOPPED_PAST_ITS_DEADLINE],
                                 stdout=subprocess.PIPE, text=True)
        try:
            for _ in range(600):  # until it is stopped
                with open(f"/proc/{child.pid}/stat") as stat:
                    if stat.read().rpartition(")")[2].split()[0] == "T":
                        break
                time.sleep(0.01)
            time.sleep(1.5)  # past the deadline while stopped
            os.kill(child.pid, signal.SIGCONT)
            out, _ = child.communicate(timeout=60)
        finally:
            child.kill()
            child.wait()
        assert out.strip() == "deadline", out

"""adaptor.drivers.script: every step kind, session checkpoints, validation and cancellation."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor.driver import (
    DecisionChoice,
    DecisionRequest,
    DecisionResponse,
    DecisionResult,
    InvalidDriverConfigError,
    Request,
    Response,
    RunFailure,
    SessionContext,
    SessionMode,
    SessionState,
)
from adaptor.drivers import script
from adaptor.errors import ResumeRejectedError
from adaptor.events import (
    ApprovalRequest,
    EventMeta,
    ProcessInfo,
    TextDelta,
    Thinking,
    ToolCall,
    ToolResult,
    event_kind,
)
from adaptor.result import TranscriptItem, Usage
from adaptor.testing import RecordingSink, ScriptedDriver, decide_always

AUTO_ID = re.compile(r"^script-[0-9a-f]{16}$")
WAIT = 30.0  # generous bound for conditions that normally hold within milliseconds


def request(
    prompt: str = "do the thing",
    *,
    session: SessionContext | None = None,
    **fields: Any,
) -> Request:
    return Request(run_id="run_0123456789abcdef", prompt=prompt, session=session, **fields)


def play(
    steps: Sequence[Mapping[str, Any]],
    *,
    session: str | None = None,
    descriptor: Mapping[str, Any] | None = None,
    sink: RecordingSink | None = None,
    req: Request | None = None,
) -> tuple[Response, RecordingSink]:
    sink = sink or RecordingSink()
    driver = ScriptedDriver(steps, descriptor, session=session)
    return driver.run(req or request(), sink), sink


def kinds(sink: RecordingSink) -> list[str]:
    return [event_kind(e) for e in sink.events]


def resumed(state_id: str, mode: SessionMode = "continue_or_start") -> SessionContext:
    return SessionContext(mode, SessionState(resume_id=state_id, display_id=state_id))


# --- step kinds ---------------------------------------------------------------------------------


def test_text_step_emits_a_closed_lifecycle_and_an_assistant_item() -> None:
    response, sink = play([{"text": "hello there"}, {"text": "bye"}])

    assert sink.events[1:] == [
        TextDelta(message_id="msg_1", phase="start"),
        TextDelta(message_id="msg_1", text="hello there", phase="content"),
        TextDelta(message_id="msg_1", phase="end"),
        TextDelta(message_id="msg_2", phase="start"),
        TextDelta(message_id="msg_2", text="bye", phase="content"),
        TextDelta(message_id="msg_2", phase="end"),
    ]
    assert sink.transcript == [
        TranscriptItem(kind="assistant", text="hello there"),
        TranscriptItem(kind="assistant", text="bye"),
    ]
    assert list(response.transcript) == sink.transcript
    assert response.output == "bye"
    assert response.usage == Usage(input_tokens=3, output_tokens=3)
    assert (response.exit_code, response.signal, response.failure) == (0, None, None)
    assert (response.provider, response.model) == ("script", "script-1")


def test_spawn_comes_first_and_names_env_variables_only() -> None:
    secret = "s3cr3t-value-never-shown"
    driver = script.Driver(
        script.Config(steps=({"text": "hi"},), env={"API_KEY": secret}, extra_args=("-v",))
    )
    sink = RecordingSink()
    response = driver.run(request(env={"OTHER": secret, "API_KEY": "x"}), sink)

    assert sink.events[0] == ProcessInfo(
        kind="spawn", data={"argv": ["script", "-v"], "env": ["API_KEY", "OTHER"]}
    )
    assert all(secret not in repr(p) for p in sink.payloads)
    assert secret not in repr(response)


def test_thinking_step() -> None:
    response, sink = play([{"thinking": "let me see"}])

    assert sink.events[1:] == [
        Thinking(message_id="msg_1", phase="start"),
        Thinking(message_id="msg_1", text="let me see", phase="content"),
        Thinking(message_id="msg_1", phase="end"),
    ]
    assert sink.transcript == [TranscriptItem(kind="thinking", text="let me see")]
    assert response.output == ""
    assert response.usage == Usage(input_tokens=3, output_tokens=0)


def test_tool_call_step() -> None:
    steps: list[dict[str, Any]] = [
        {"tool_call": {"name": "Bash", "args": {"cmd": "ls"}, "result": {"files": ["a"]}}},
        {"tool_call": {"name": "Read", "result": "no such file", "is_error": True}},
    ]
    response, sink = play(steps)

    assert sink.events[1:] == [
        ToolCall(id="call_1", name="Bash", args={"cmd": "ls"}, phase="start"),
        ToolCall(id="call_1", name="Bash", result={"files": ["a"]}, phase="end"),
        ToolResult(id="call_1", result={"files": ["a"]}),
        ToolCall(id="call_2", name="Read", args={}, phase="start"),
        ToolCall(id="call_2", name="Read", result="no such file", phase="end"),
        ToolResult(id="call_2", result="no such file", is_error=True),
    ]
    assert sink.transcript == [
        TranscriptItem(
            kind="tool_call", tool_use_id="call_1", tool_name="Bash", input={"cmd": "ls"}
        ),
        TranscriptItem(
            kind="tool_result", tool_use_id="call_1", tool_name="Bash", text='{"files":["a"]}'
        ),
        TranscriptItem(kind="tool_call", tool_use_id="call_2", tool_name="Read", input={}),
        TranscriptItem(
            kind="tool_result",
            tool_use_id="call_2",
            tool_name="Read",
            text="no such file",
            is_error=True,
        ),
    ]
    assert list(response.transcript) == sink.transcript


def test_tool_call_events_do_not_share_the_configured_objects() -> None:
    args = {"nested": {"n": 1}}
    driver = ScriptedDriver([{"tool_call": {"name": "T", "args": args}}])
    sink = RecordingSink()
    driver.run(request(), sink)
    start = sink.events[1]
    assert isinstance(start, ToolCall) and start.args is not None
    start.args["nested"]["n"] = 2

    again = RecordingSink()
    driver.run(request(), again)
    assert again.events[1] == ToolCall(id="call_1", name="T", args=args, phase="start")


@pytest.mark.parametrize(
    ("kind", "decision", "choice"),
    [
        ("permission", "approved", ""),
        ("permission", "rejected", ""),
        ("plan_review", "timed_out", ""),
        ("question", "answered", "b"),
    ],
)
def test_approval_records_the_decision_and_goes_on(
    kind: str, decision: DecisionResult, choice: str
) -> None:
    steps: list[dict[str, Any]] = [
        {"approval": {"kind": kind, "title": "May I?", "choices": ["a", {"key": "b"}]}},
        {"text": "after"},
    ]
    sink = RecordingSink(decide_always(decision, choice=choice))
    response, _ = play(steps, sink=sink, session="s1")

    ((asked, answered),) = sink.decisions
    assert asked.kind == kind and asked.title == "May I?" and asked.source == "script"
    assert asked.choices == (DecisionChoice(key="a", label="a"), DecisionChoice(key="b"))
    assert asked.request_id == answered.request_id == "decision_1"
    metadata = {"kind": kind, "result": decision} | ({"choice": choice} if choice else {})
    assert sink.transcript[0] == TranscriptItem(
        kind="system", subtype="decision", text=f"{kind}: {decision}", metadata=metadata
    )
    assert response.output == "after"
    assert response.checkpoint is not None and response.checkpoint.valid


def test_default_recording_sink_answers_a_question_with_its_first_choice() -> None:
    _, sink = play([{"approval": {"kind": "question", "choices": [{"key": "x", "label": "X"}]}}])
    ((_, answer),) = sink.decisions
    assert (answer.result, answer.choice) == ("answered", "x")


def test_aborted_approval_stops_the_script_like_a_cancellation() -> None:
    steps: list[dict[str, Any]] = [
        {"text": "before"},
        {"approval": {"kind": "permission"}},
        {"text": "never"},
    ]
    response, sink = play(steps, sink=RecordingSink(decide_always("aborted")), session="s1")

    assert response.output == "before"
    assert (response.exit_code, response.signal) == (None, signal.SIGTERM.value)
    assert response.failure is None
    assert response.checkpoint is None
    assert response.raw_streams.terminal is None
    assert [item.kind for item in response.transcript] == ["assistant", "system"]
    assert response.transcript[-1].metadata == {"kind": "permission", "result": "aborted"}


def test_stdout_and_stderr_steps_feed_raw_streams_and_chunks() -> None:
    response, sink = play([{"stdout": "one"}, {"stderr": "warn"}, {"stdout": "two"}])

    assert sink.events[1:] == [
        ProcessInfo(kind="stdout", text="one\n"),
        ProcessInfo(kind="stderr", text="warn\n"),
        ProcessInfo(kind="stdout", text="two\n"),
    ]
    assert (response.raw_streams.stdout, response.raw_streams.stderr) == ("one\ntwo\n", "warn\n")
    assert response.output == ""
    assert sink.transcript == []


def test_clean_run_reports_a_terminal_payload() -> None:
    response, _ = play([{"text": "hi"}], session="s1")
    terminal = response.raw_streams.terminal
    assert terminal is not None and terminal.event == "script.finished"
    assert orjson.loads(terminal.json) == {
        "type": "script.finished",
        "session_id": "s1",
        "usage": Usage(input_tokens=3, output_tokens=1).to_json(),
    }


def test_output_json_step_is_emitted_as_text() -> None:
    response, sink = play([{"text": "thinking out loud"}, {"output_json": {"ok": True, "n": [1]}}])

    assert response.output == '{"ok":true,"n":[1]}'
    assert orjson.loads(response.output) == {"ok": True, "n": [1]}
    assert TextDelta(message_id="msg_2", text=response.output) in sink.events
    assert sink.transcript[-1] == TranscriptItem(kind="assistant", text=response.output)


@pytest.mark.parametrize(
    ("depth", "error", "said"),
    [
        (300, InvalidDriverConfigError, "output_json: not encodable as JSON"),
        (1000, ValueError, "nests too deeply"),
    ],
)
def test_output_json_nested_past_what_json_holds_is_a_clear_config_error(
    depth: int, error: type[Exception], said: str
) -> None:
    value: list[Any] = []
    inner = value
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    # Past the recursion limit the constructor's snapshot fails (it used to raise
    # RecursionError); below it, the run's validation does (orjson holds 255 levels).
    with pytest.raises(error, match=said):
        adaptor.Agent(script.Driver(script.Config(steps=({"output_json": value},)))).run("hi")


def test_fail_step_stops_with_the_failure() -> None:
    steps: list[dict[str, Any]] = [
        {"stdout": "partial"},
        {"fail": {"code": "agent_error", "message": "boom", "details": {"kind": "rate_limit"}}},
        {"text": "never"},
    ]
    response, sink = play(steps, session="s1")

    assert response.failure == RunFailure(
        code="agent_error", message="boom", details={"kind": "rate_limit"}
    )
    assert (response.exit_code, response.signal) == (1, None)
    assert response.checkpoint is None
    assert response.raw_streams.terminal is None
    assert response.raw_streams.stdout == "partial\n"
    assert "text.start" not in kinds(sink)


def test_fail_step_defaults_to_agent_error() -> None:
    response, _ = play([{"fail": {}}])
    assert response.failure == RunFailure(code="agent_error")


def test_nonzero_exit_stops_with_agent_error() -> None:
    response, sink = play([{"text": "a"}, {"exit": 3}, {"text": "never"}], session="s1")

    assert response.exit_code == 3
    assert response.failure == RunFailure(
        code="agent_error", message="script exited with status 3", details={"exit_code": 3}
    )
    assert response.output == "a"
    assert response.checkpoint is None
    assert kinds(sink).count("text.start") == 1


def test_exit_zero_keeps_going_and_stays_clean() -> None:
    response, _ = play([{"exit": 0}, {"text": "after"}], session="s1")
    assert (response.exit_code, response.failure, response.output) == (0, None, "after")
    assert response.checkpoint is not None and response.checkpoint.valid


def test_sleep_zero_and_an_empty_script() -> None:
    response, sink = play([{"sleep": 0}])
    assert (response.exit_code, response.signal, response.output) == (0, None, "")
    assert kinds(sink) == ["process.spawn"]
    assert response.usage == Usage(input_tokens=3, output_tokens=0)


def test_no_event_carries_meta() -> None:
    steps: list[dict[str, Any]] = [
        {"thinking": "t"},
        {"text": "x"},
        {"tool_call": {"name": "T"}},
        {"stdout": "o"},
        {"approval": {"kind": "permission"}},
    ]
    _, sink = play(steps)
    assert all(event.meta == EventMeta() for event in sink.events)


# --- cancellation -------------------------------------------------------------------------------


def test_cancel_interrupts_a_sleep() -> None:
    driver = ScriptedDriver([{"text": "started"}, {"sleep": 3600}, {"text": "never"}], session="s1")
    sink = RecordingSink()
    responses: list[Response] = []
    worker = threading.Thread(target=lambda: responses.append(driver.run(request(), sink)))
    worker.start()
    try:
        assert sink.wait_for(lambda ps: TextDelta(message_id="msg_1", phase="end") in ps, WAIT)
    finally:
        sink.cancelled.set()
        worker.join(WAIT)
    assert not worker.is_alive()

    (response,) = responses
    assert (response.exit_code, response.signal) == (None, signal.SIGTERM.value)
    assert response.output == "started"
    assert response.checkpoint is None
    assert response.failure is None
    assert response.raw_streams.terminal is None
    assert kinds(sink).count("text.start") == 1


def test_a_sleep_past_any_timer_waits_for_the_runs_deadline() -> None:
    # 1e10 s is more than a lock's wait takes (threading.TIMEOUT_MAX): it failed the run with
    # OverflowError as an infrastructure error instead of ending at the run's timeout.
    agent = adaptor.Agent(script.Driver(script.Config(steps=({"sleep": 1e10}, {"text": "x"}))))
    with pytest.raises(adaptor.RunDeadlineExceededError):
        agent.run("p", timeout=0.2)


def test_cancelled_before_the_first_step_runs_nothing() -> None:
    sink = RecordingSink()
    sink.cancelled.set()
    response, _ = play([{"text": "never"}], sink=sink, session="s1")
    assert kinds(sink) == ["process.spawn"]
    assert (response.exit_code, response.signal, response.checkpoint) == (
        None,
        signal.SIGTERM.value,
        None,
    )


def test_cancel_while_waiting_for_a_decision_stops_before_the_next_step() -> None:
    def decide_and_cancel(req: DecisionRequest) -> DecisionResponse:
        sink.cancelled.set()
        return DecisionResponse(request_id=req.request_id, result="approved")

    sink = RecordingSink(decide_and_cancel)
    response, _ = play([{"approval": {"kind": "permission"}}, {"text": "never"}], sink=sink)
    assert response.signal == signal.SIGTERM.value
    assert "text.start" not in kinds(sink)


# --- sessions and checkpoints -------------------------------------------------------------------


def test_no_session_means_no_checkpoint() -> None:
    response, _ = play([{"text": "hi"}])
    assert response.checkpoint is None


def test_fixed_session_checkpoint(tmp_path: Path) -> None:
    response, _ = play([{"text": "hi"}], session="sess-1", req=request(workspace_cwd=str(tmp_path)))
    checkpoint = response.checkpoint
    assert checkpoint is not None and checkpoint.valid
    assert checkpoint.state == SessionState(
        resume_id="sess-1", display_id="sess-1", data={"cwd": str(tmp_path)}
    )


def test_an_unusable_workspace_fails_as_a_cli_drivers_would(tmp_path: Path) -> None:
    # It was ignored: a dry run with the script driver passed where every CLI driver fails.
    a_file = tmp_path / "file"
    a_file.write_text("x")
    shut = tmp_path / "shut"
    shut.mkdir(mode=0)
    # (A NUL failed as the driver's own ValueError: os.stat raises that, not OSError.)
    cases = [(tmp_path / "missing", "does not exist"), (a_file, "is not a directory"), (f"{tmp_path}\0x", "holds a NUL character")]
    if os.geteuid() != 0:  # root enters any folder
        cases.append((shut, "cannot be entered (permission denied)"))
    for workspace, problem in cases:
        in_workspace = ScriptedDriver([{"text": "hi"}]), request(workspace_cwd=str(workspace))
        in_cwd = script.Driver(script.Config(steps=({"text": "hi"},), cwd=str(workspace))), request()
        for driver, req in (in_workspace, in_cwd):
            sink = RecordingSink()
            response = driver.run(req, sink)
            assert response.failure is not None and response.failure.code == "infrastructure_error"
            assert response.failure.details == {"kind": "workspace_unusable", "workspace": str(workspace)}
            assert response.failure.message == f"script: working directory {workspace} {problem}"
            assert response.output == "" and not [e for e in sink.events if isinstance(e, TextDelta)]
    agent = adaptor.Agent(ScriptedDriver([{"text": "hi"}]))
    with pytest.raises(adaptor.RunError) as caught:
        agent.run("go", workspace=str(tmp_path / "missing"))
    assert caught.value.reason == "infrastructure_error"
    assert caught.value.details["kind"] == "workspace_unusable"


def test_fixed_session_is_kept_when_forking() -> None:
    response, _ = play(
        [{"text": "hi"}], session="sess-1", req=request(session=resumed("x", "fork"))
    )
    assert response.checkpoint is not None
    assert response.checkpoint.state.resume_id == "sess-1"
    assert response.checkpoint.state.data == {"cwd": ""}


@pytest.mark.parametrize(
    "context",
    [
        None,
        SessionContext("continue_or_start"),
        SessionContext("stateless"),
        resumed("script-parent", "fork"),
    ],
    ids=["no-context", "fresh", "stateless", "fork"],
)
def test_auto_session_gets_a_new_id(context: SessionContext | None) -> None:
    driver = ScriptedDriver([{"text": "hi"}], session="auto")
    ids = set()
    for _ in range(2):
        response = driver.run(request(session=context), RecordingSink())
        assert response.checkpoint is not None and response.checkpoint.valid
        ids.add(response.checkpoint.state.resume_id)
    assert len(ids) == 2
    assert all(AUTO_ID.match(resume_id) for resume_id in ids)
    assert "script-parent" not in ids


@pytest.mark.parametrize("mode", ["continue_or_start", "continue_only"])
def test_auto_session_keeps_the_stored_id_when_continuing(mode: SessionMode) -> None:
    response, _ = play([{"text": "hi"}], session="auto", req=request(session=resumed("s-9", mode)))
    assert response.checkpoint is not None
    assert response.checkpoint.state.resume_id == "s-9"
    assert orjson.loads(response.raw_streams.terminal.json)["session_id"] == "s-9"  # type: ignore[union-attr]


def test_reject_resume_refuses_a_stored_session_before_anything_happens() -> None:
    steps: list[dict[str, Any]] = [{"text": "hi"}, {"reject_resume": "session expired"}]
    sink = RecordingSink()
    with pytest.raises(ResumeRejectedError) as caught:
        play(steps, session="auto", sink=sink, req=request(session=resumed("old")))
    assert caught.value.reason == "session expired"
    assert sink.payloads == []


@pytest.mark.parametrize(
    "context", [None, SessionContext("continue_or_start"), SessionContext("fork")]
)
def test_reject_resume_is_inert_for_fresh_sessions(context: SessionContext | None) -> None:
    steps: list[dict[str, Any]] = [{"reject_resume": "nope"}, {"text": "fresh"}]
    response, _ = play(steps, session="auto", req=request(session=context))
    assert response.output == "fresh"
    assert response.checkpoint is not None and response.checkpoint.valid


def test_session_codec_round_trip() -> None:
    codec = script.Driver().session_codec()
    assert codec is not None and codec.name() == "script"
    assert codec.encode(None) == {} and codec.decode({}) is None
    state = SessionState(resume_id="r", data={"cwd": "/w"})
    params = codec.encode(state)
    assert params == {"resume_id": "r", "display_id": "r", "data": {"cwd": "/w"}}
    assert codec.decode(params) == dataclasses.replace(state, display_id="r")
    with pytest.raises(ValueError):
        codec.decode({"display_id": "no resume id"})


def test_no_codec_and_no_checkpoint_when_resume_is_overridden_off() -> None:
    driver = ScriptedDriver(
        [{"text": "hi"}], {"sessions": {"supports_resume": False}}, session="auto"
    )
    assert driver.session_codec() is None
    response = driver.run(request(), RecordingSink())
    assert response.checkpoint is None
    assert response.raw_streams.terminal is not None


def test_model_override_wins() -> None:
    response, _ = play([{"text": "hi"}], req=request(model_override="big-model"))
    assert response.model == "big-model"


# --- descriptor ---------------------------------------------------------------------------------


def test_default_descriptor() -> None:
    d = script.Driver().descriptor()
    assert (d.type, d.display_name) == ("script", "Script (deterministic, offline)")
    assert d.sessions.supports_resume
    assert (d.skills.supported, d.skills.mode) == (True, "ephemeral")
    assert (d.mcp.supported, d.mcp.stdio, d.mcp.http, d.mcp.sse) == (True, True, True, True)
    assert d.instructions and d.system_prompt.append and not d.process.persistent
    caps = d.run_policy_caps
    assert caps.isolation and caps.web_search and caps.browser
    for support in (caps.permission, caps.plan_review):
        assert support.ask and support.auto_approve and support.auto_reject and support.retry
    assert caps.question.ask and caps.question.auto_reject and caps.question.retry
    so = d.structured_output
    assert so.native and so.prompt_validate and so.works_with_streaming
    assert so.native_hitl is None and so.prompt_validate_hitl is None
    assert d.stream.native and d.stream.token_level and d.stream.reasoning
    assert d.stream.tool_call_args


def test_descriptor_overrides_merge_field_by_field() -> None:
    overrides = {
        "run_policy_caps": {"isolation": False, "question": {"retry": False}},
        "mcp": {"supported": False},
        "structured_output": {"native_hitl": {"permission": True}},
        "models": ["m1", {"id": "m2", "label": "Two"}],
    }
    d = ScriptedDriver([], overrides).descriptor()
    assert not d.run_policy_caps.isolation and d.run_policy_caps.web_search
    assert not d.run_policy_caps.question.retry and d.run_policy_caps.question.ask
    assert not d.mcp.supported and d.mcp.stdio
    assert d.structured_output.native_hitl is not None
    assert d.structured_output.native_hitl.permission
    assert [(m.id, m.label) for m in d.models] == [("m1", ""), ("m2", "Two")]


def test_descriptor_is_a_fresh_copy_each_call() -> None:
    driver = ScriptedDriver([], {"structured_output": {"native_hitl": {"question": True}}})
    first = driver.descriptor()
    first.run_policy_caps.permission.ask = False
    first.models.clear()
    assert first.structured_output.native_hitl is not None
    first.structured_output.native_hitl.question = False
    second = driver.descriptor()
    assert second.run_policy_caps.permission.ask
    assert second.models and second.structured_output.native_hitl is not None
    assert second.structured_output.native_hitl.question


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([["text", "hi"]], r"steps\[0\]: expected an object"),
        ([{}], r"steps\[0\]: expected exactly one"),
        ([{"text": "a", "thinking": "b"}], r"steps\[0\]: expected exactly one"),
        ([{"shout": "hi"}], r"steps\[0\]: unknown step 'shout'"),
        ([{"text": ""}], r"steps\[0\]\.text: expected a non-empty string"),
        ([{"text": 3}], r"steps\[0\]\.text"),
        ([{"thinking": None}], r"steps\[0\]\.thinking"),
        ([{"tool_call": {"args": {}}}], r"tool_call\.name"),
        ([{"tool_call": {"name": "T", "args": [1]}}], r"tool_call\.args"),
        ([{"tool_call": {"name": "T", "is_error": "yes"}}], r"tool_call\.is_error"),
        ([{"tool_call": {"name": "T", "id": "x"}}], r"tool_call: unknown key\(s\) id"),
        ([{"approval": {"kind": "vote"}}], r"approval\.kind"),
        ([{"approval": {"kind": "question", "choices": "ab"}}], r"approval\.choices"),
        ([{"approval": {"kind": "question", "choices": [""]}}], r"choices\[0\]"),
        ([{"approval": {"kind": "question", "choices": [{"label": "x"}]}}], r"choices\[0\]\.key"),
        ([{"sleep": -1}], r"sleep: expected a finite number"),
        ([{"sleep": True}], r"sleep"),
        ([{"sleep": float("inf")}], r"sleep"),
        ([{"stdout": 1}], r"stdout"),
        ([{"fail": "boom"}], r"fail: expected an object"),
        ([{"fail": {"code": 7}}], r"fail\.code"),
        ([{"fail": {"details": 1}}], r"fail\.details"),
        ([{"exit": 256}], r"exit: expected an exit status"),
        ([{"exit": "1"}], r"exit"),
        ([{"exit": False}], r"exit"),
        ([{"output_json": {1: "non-string key"}}], r"output_json: not encodable"),
        ([{"reject_resume": None}], r"reject_resume"),
        ([{"text": "fine"}, {"sleep": "1"}], r"steps\[1\]\.sleep"),
    ],
)
def test_bad_steps_are_rejected(steps: list[Any], message: str) -> None:
    driver = script.Driver(script.Config(steps=tuple(steps)))
    with pytest.raises((TypeError, ValueError), match=message):
        driver.validate_config()
    with pytest.raises((TypeError, ValueError), match=message):
        driver.run(request(), RecordingSink())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (script.Config(session=""), r"session: expected a non-empty string"),
        (script.Config(descriptor={"nope": True}), r"unknown field 'nope'"),
        (script.Config(descriptor={"mcp": {"stdio": "yes"}}), r"descriptor\.mcp\.stdio"),
        (script.Config(descriptor={"type": ""}), r"descriptor\.type"),
        (script.Config(descriptor={"skills": {"mode": "x"}}), r"descriptor\.skills\.mode"),
        (script.Config(descriptor={"models": "m"}), r"descriptor\.models"),
        (script.Config(descriptor=[]), r"descriptor: expected an object"),  # type: ignore[arg-type]
        (script.Config(env={"K": 1}), r"env: the value of K"),  # type: ignore[dict-item]
        (script.Config(extra_args=("a", 1)), r"extra_args"),  # type: ignore[arg-type]
        (script.Config(grace_period=-1), r"grace_period"),
        (script.Config(cwd=3), r"cwd"),  # type: ignore[arg-type]
        (script.Config(steps={"text": "x"}), r"steps: expected a list"),  # type: ignore[arg-type]
    ],
)
def test_bad_config_fields_are_rejected(config: script.Config, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        script.Driver(config).validate_config()


def test_env_values_never_appear_in_validation_errors() -> None:
    config = script.Config(env={"TOKEN": "hunter2"}, grace_period=-1)
    with pytest.raises(ValueError) as caught:
        script.Driver(config).validate_config()
    assert "hunter2" not in str(caught.value)


def test_foreign_config_types_are_rejected() -> None:
    with pytest.raises(TypeError):
        script.Driver().validate_config(object())
    with pytest.raises(TypeError):
        script.Driver(object())  # type: ignore[arg-type]


def test_config_from_dict() -> None:
    config = script.Config.from_dict(
        {"steps": [{"text": "x"}], "session": "auto", "extra_args": ["-q"]}
    )
    assert config == script.Config(steps=({"text": "x"},), session="auto", extra_args=("-q",))
    with pytest.raises(ValueError, match="unknown script config key"):
        script.Config.from_dict({"steps": [], "stpes": []})
    with pytest.raises(TypeError):
        script.Config.from_dict([])  # type: ignore[arg-type]


def test_validate_config_accepts_explicit_configs() -> None:
    driver = script.Driver()
    driver.validate_config(script.Config(steps=({"text": "x"},)))
    driver.validate_config({"steps": [{"text": "x"}]})
    with pytest.raises(ValueError):
        driver.validate_config({"steps": [{"text": ""}]})


def test_request_config_wins_over_the_captured_one() -> None:
    driver = ScriptedDriver([{"text": "captured"}])
    sink = RecordingSink()
    response = driver.run(
        dataclasses.replace(request(), config={"steps": [{"text": "explicit"}]}), sink
    )
    assert response.output == "explicit"
    assert driver.run(request(), RecordingSink()).output == "captured"


def test_driver_snapshots_its_config() -> None:
    steps: list[dict[str, Any]] = [{"text": "original"}]
    overrides: dict[str, Any] = {"mcp": {"supported": True}}
    driver = script.Driver({"steps": steps, "descriptor": overrides})
    steps[0]["text"] = "mutated"
    steps.append({"fail": {}})
    overrides["mcp"]["supported"] = False

    response = driver.run(request(), RecordingSink())
    assert (response.output, response.failure) == ("original", None)
    assert driver.descriptor().mcp.supported


def test_scripted_driver_is_the_script_driver() -> None:
    driver = ScriptedDriver([{"text": "x"}], {"mcp": {"supported": False}}, session="s")
    direct = script.Driver(
        script.Config(steps=({"text": "x"},), session="s", descriptor={"mcp": {"supported": False}})
    )
    assert isinstance(driver, script.Driver)
    assert driver.descriptor() == direct.descriptor()
    assert driver.session_config_fingerprint() == direct.session_config_fingerprint()


def test_close_processes_is_a_harmless_noop() -> None:
    driver = script.Driver()
    driver.close_processes(1.0)
    driver.close_processes()


# --- session config fingerprint -----------------------------------------------------------------


def fingerprint(**fields: Any) -> str:
    return script.Driver(script.Config(**fields)).session_config_fingerprint()


def test_fingerprint_is_stable_and_prefixed() -> None:
    first = fingerprint(session="auto")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first)
    assert fingerprint(session="auto") == first


def test_fingerprint_ignores_steps_env_and_process_settings() -> None:
    base = fingerprint(session="auto", steps=({"text": "a"},), env={"K": "1"})
    assert fingerprint(session="auto", steps=({"fail": {}},), env={"K": "2"}) == base
    assert fingerprint(session="auto", env={"OTHER": "x"}) == base
    assert fingerprint(session="auto", grace_period=9.0, command="x") == base


@pytest.mark.parametrize(
    "change",
    [
        {"session": "fixed"},
        {"session": None},
        {"descriptor": {"mcp": {"supported": False}}},
        {"cwd": "/elsewhere"},
        {"extra_args": ("--flag",)},
    ],
)
def test_fingerprint_covers_session_descriptor_cwd_and_extra_args(change: dict[str, Any]) -> None:
    assert fingerprint(**({"session": "auto"} | change)) != fingerprint(session="auto")


def test_recording_sink_refuses_what_the_sdk_sink_refuses() -> None:
    # A driver unit-tested with RecordingSink passed while the same emit() failed every
    # real run: the kit's sink took anything.
    sink = RecordingSink()
    with pytest.raises(TypeError, match="not dict"):
        sink.emit({"kind": "text.content"})  # type: ignore[arg-type]
    approval = ApprovalRequest(id="a1")
    with pytest.raises(TypeError, match="request_decision"):
        sink.emit(approval)
    assert sink.payloads == []

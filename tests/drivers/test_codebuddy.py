"""The ``codebuddy`` driver end to end through ``adaptor.Agent`` against ``fake_codebuddy.py``, a
fake ``codebuddy`` speaking the documented headless, native-schema and control formats
(format-verified only: the real CLI cannot be installed here)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor.drivers import codebuddy
from adaptor.events import ProcessInfo, TextDelta, ToolCall
from adaptor.memory import Store
from adaptor.testing import conformance
from tests.drivers._fakes import module_cli, records
from tests.drivers.conftest import FakeCLI, group_members

SESSION = "cb-session-1"
MakeAgent = Callable[..., adaptor.Agent]
ASK = adaptor.ApprovalPolicy(permission="ask", on_reject="continue")


@dataclasses.dataclass
class Item:
    name: str
    count: int



@pytest.fixture
def fake(fake_exe: Callable[[str, str], str], tmp_path: Path) -> FakeCLI:
    return module_cli(fake_exe, "codebuddy", "fake_codebuddy", tmp_path / "record.jsonl")


@pytest.fixture
def make_agent(fake: FakeCLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeAgent:
    def make(scenario: str = "text", *, known: str = "", env: dict[str, str] | None = None,
             config: dict[str, Any] | None = None, **options: Any) -> adaptor.Agent:
        # The fake's controls are inherited, not config env: every config env value is a
        # secret of the run, and the session id or scenario name would show as <redacted>.
        child_env = {"FAKE_SCENARIO": scenario, "FAKE_RECORD": str(tmp_path / "record.jsonl"),
                     "FAKE_SESSION_ID": SESSION, "FAKE_KNOWN_SESSIONS": known, **(env or {})}
        for name, value in child_env.items():
            monkeypatch.setenv(name, value)
        driver = codebuddy.Driver(codebuddy.Config(command=fake.path, **(config or {})))
        return adaptor.Agent(driver, workspace=str(tmp_path), **options)

    return make


def spawn_argv(events: list[adaptor.Event]) -> list[str]:
    return next(list(e.data["argv"]) for e in events
                if isinstance(e, ProcessInfo) and e.kind == "spawn")


def test_headless_streaming_argv_and_resume(make_agent: MakeAgent, fake: FakeCLI) -> None:
    store = Store()
    with make_agent(config={"model": "glm-5.2-ioa", "effort": "high"}, thread_store=store,
                    instructions="Be brief.") as agent:
        stream = agent.thread("t").stream("Say hello")
        events = list(stream)
        result = stream.result()
    argv = records(fake, "argv")[0]
    assert argv == ["--print", "--output-format", "stream-json", "--verbose",
                    "--include-partial-messages", "--permission-mode", "default",
                    "--model", "glm-5.2-ioa", "--effort", "high", "--",
                    "Be brief.\n\nSay hello"]
    assert spawn_argv(events)[-1] == "<prompt: 20 characters>"  # the prompt stays out of events
    assert result.text == "Hello from CodeBuddy."
    assert (result.provider, result.model) == ("codebuddy", "glm-5.2-ioa")
    # Token-level deltas from stream_event; the full assistant message does not repeat them.
    deltas = [e.text for e in events if isinstance(e, TextDelta) and e.phase == "content"]
    assert deltas == ["Hello ", "from ", "CodeBuddy. "]
    assert result.usage is not None and (result.usage.input_tokens, result.usage.output_tokens,
                                         result.usage.cached_input_tokens) == (11, 5, 2)
    assert result.usage.cost_usd == pytest.approx(0.001)

    with make_agent(config={"model": "glm-5.2-ioa", "effort": "high"}, thread_store=store,
                    instructions="Be brief.", known=SESSION) as agent:
        assert agent.thread("t").run("again").metadata["session_id"] == SESSION
    argv = records(fake, "argv")[1]
    assert argv[argv.index("--resume") + 1] == SESSION


def test_auto_approve_bypasses_permissions_headless(make_agent: MakeAgent, fake: FakeCLI) -> None:
    auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with make_agent("tool", policy=auto) as agent:
        stream = agent.stream("touch it", append_system_prompt="Be careful.")
        events = list(stream)
        result = stream.result()
    assert result.text == "Tool allowed."
    argv = records(fake, "argv")[0]
    assert argv[argv.index("--permission-mode") + 1] == "bypassPermissions"
    assert argv[argv.index("--append-system-prompt") + 1] == "Be careful."
    assert "Be careful." not in " ".join(spawn_argv(events))
    calls = [(e.phase, e.name) for e in events if isinstance(e, ToolCall)]
    assert calls == [("start", "Bash"), ("end", "Bash")]


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_permission_control_session(make_agent: MakeAgent, fake: FakeCLI, answer: str) -> None:
    asked: list[adaptor.ApprovalRequest] = []

    def decide(request: adaptor.ApprovalRequest) -> None:
        asked.append(request)
        request.approve() if answer == "approve" else request.deny("not today")

    with make_agent("tool", policy=adaptor.Policy(approvals=ASK), on_approval=decide) as agent:
        result = agent.run("please touch made.txt")
    argv = records(fake, "argv")[0]
    assert argv == ["--input-format=stream-json", "--output-format=stream-json", "--verbose",
                    "--permission-mode", "default"]
    assert "CODEBUDDY_CODE_ENTRYPOINT" in records(fake, "env")[0]
    init, user, reply = records(fake, "stdin")
    assert init == {"type": "control_request", "request_id": "agent-adaptor-initialize",
                    "request": {"subtype": "initialize", "hasPrompt": True,
                                "capabilities": {"askUserQuestion": True}}}
    assert user["message"] == {"role": "user", "content": "please touch made.txt"}
    (request,) = asked
    assert (request.kind, request.source, request.title) == ("permission", "codebuddy.bash",
                                                            "Run Bash")
    response = reply["response"]
    assert response["subtype"] == "success" and response["request_id"] == "req_toolu_1"
    if answer == "approve":
        assert response["response"] == {"allowed": True, "tool_use_id": "toolu_1",
                                         "updatedInput": {"command": "touch made.txt"}}
        assert result.text == "Tool allowed."
    else:
        assert response["response"] == {"allowed": False, "tool_use_id": "toolu_1",
                                         "reason": "not today", "interrupt": False}
        assert result.text == "Tool denied."
    assert records(fake, "stdin-rest") == [""]  # stdin was closed after the terminal result
    assert result.metadata["transport"] == "control"


@pytest.mark.parametrize(
    ("permission", "configured", "passed"),
    [
        ("ask", "acceptEdits", "default"),
        ("ask", "bypassPermissions", "default"),
        ("auto_reject", "dontAsk", "default"),
        ("auto_reject", "auto", "default"),
        ("ask", "plan", "plan"),
        ("auto_approve", "acceptEdits", "acceptEdits"),
    ],
)
def test_permission_mode_that_decides_alone_yields_to_an_asking_policy(
    make_agent: MakeAgent, fake: FakeCLI, permission: str, configured: str, passed: str
) -> None:
    # A configured mode that allows or denies without asking went on the control transport's
    # command line as it was: the CLI would never have asked, whatever the run's policy said.
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(
        permission=permission, plan_review="ask", on_reject="continue"))
    with make_agent(policy=policy, config={"permission_mode": configured}) as agent:
        agent.run("hello")
    argv = records(fake, "argv")[0]
    assert argv[0] == "--input-format=stream-json"
    assert argv[argv.index("--permission-mode") + 1] == passed


def test_plan_review_and_question(make_agent: MakeAgent, fake: FakeCLI) -> None:
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(
        permission="auto_approve", plan_review="ask", question="ask"))
    asked: list[adaptor.ApprovalRequest] = []

    def decide(request: adaptor.ApprovalRequest) -> None:
        asked.append(request)
        request.answer("blue") if request.kind == "question" else request.approve()

    with make_agent("plan", policy=policy, on_approval=decide) as agent:
        assert agent.run("plan it").text == "Plan approved."
    with make_agent("question", policy=policy, on_approval=decide) as agent:
        assert agent.run("ask me").text == "You chose {'Which color?': 'blue'}."
    plan, question = asked  # the plan's Write was auto-approved by the policy
    assert plan.kind == "plan_review" and plan.details["plan"] == "# Plan\n1. Do it."
    assert (question.kind, question.title) == ("question", "Which color?")
    assert [c.key for c in question.choices] == ["red", "blue"]


def test_every_question_of_one_call_is_asked(make_agent: MakeAgent) -> None:
    # Only the first of the call's questions was asked.
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(question="ask"))
    asked: list[adaptor.ApprovalRequest] = []

    def decide(request: adaptor.ApprovalRequest) -> None:
        asked.append(request)
        request.answer(request.choices[-1].key)

    with make_agent("questions", policy=policy, on_approval=decide) as agent:
        said = agent.run("ask me").text
    assert said == "You chose {'Which color?': 'blue', 'Which size?': 'large'}, first blue."
    assert [(r.title, r.details["question_index"]) for r in asked] == [
        ("Which color?", 0), ("Which size?", 1)]


def test_denial_that_aborts_stops_the_process(make_agent: MakeAgent) -> None:
    with make_agent("tool", policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(
            permission="ask"))) as agent:
        stream = agent.stream("touch", on_approval=lambda r: r.deny("no"))
        events = list(stream)
        with pytest.raises(adaptor.ApprovalDeniedError):
            stream.result()
    pid = next(int(e.data["pid"]) for e in events
               if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert group_members(pid) == []


def test_native_structured_output(make_agent: MakeAgent, fake: FakeCLI) -> None:
    explicit = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve",
                                                               plan_review="auto_approve"))
    structured = json.dumps({"name": "mock", "count": 3})
    with make_agent(env={"FAKE_STRUCTURED": structured}, policy=explicit) as agent:
        stream = agent.stream("give", schema=Item)
        events = list(stream)
        result = stream.result()
    assert result.decode(Item) == Item("mock", 3)
    assert result.structured is not None and result.structured.source == "native"
    argv = records(fake, "argv")[0]
    assert argv[:4] == ["--print", "--output-format", "json", "--json-schema"]
    assert '"$schema"' not in argv[4] and '"count"' in argv[4]
    assert [e.text for e in events if isinstance(e, TextDelta) and e.phase == "content"] == [
        structured]
    # With the inherited ask defaults the print-mode path is not eligible: prompt-validate.
    with make_agent(env={"FAKE_STRUCTURED": structured}) as agent:
        with pytest.raises(adaptor.PolicyViolationError):
            agent.run("give", schema=Item)  # the fake's plain text is not the JSON asked for
    assert "--json-schema" not in records(fake, "argv")[1]
    assert "JSON Schema" in str(records(fake, "prompt")[1])
    # auto_reject is not an ask, so native stays eligible, but only the control transport can
    # reject: refused rather than dropping either.
    rejecting = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject",
                                                                plan_review="auto_approve"))
    with make_agent(policy=rejecting) as agent, pytest.raises(adaptor.RunError) as caught:
        agent.run("give", schema=Item)
    assert caught.value.reason == "unsupported_driver"
    assert caught.value.details["kind"] == "structured_output_with_control"
    assert len(records(fake, "argv")) == 2


@pytest.mark.parametrize(("status", "kind"), [(429, "rate_limit"), (401, "auth"),
                                              (503, "provider_unavailable")])
def test_api_errors_are_classified(make_agent: MakeAgent, status: int, kind: str) -> None:
    with make_agent("api_error", env={"FAKE_STATUS": str(status)}) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("hi")
    assert caught.value.details["kind"] == kind
    assert caught.value.details["provider_status"] == status


@pytest.mark.parametrize(("status", "error", "kind"), [
    (429, '{"error":{"message":"You exceeded your current quota, please check your plan and '
          'billing details.","type":"insufficient_quota","code":"insufficient_quota"}}', "quota"),
    (400, '{"type":"error","error":{"type":"invalid_request_error","message":"Your credit '
          'balance is too low to access the Anthropic API."}}', "quota"),
    (404, '{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}',
     "model_not_found"),
    (400, '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too '
          'long: 215000 tokens > 200000 maximum"}}', "context_too_long"),
], ids=["insufficient_quota", "credit_balance", "model_not_found", "context_too_long"])
def test_errors_no_retry_mends_have_their_own_kinds(
        make_agent: MakeAgent, status: int, error: str, kind: str) -> None:
    # Classified by status alone, a spent quota (a 429) was a retryable rate_limit and the
    # others had no kind.
    with make_agent("api_error", env={"FAKE_STATUS": str(status), "FAKE_ERROR": error}) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("hi")
    assert caught.value.reason == "agent_error"
    assert (caught.value.details["kind"], caught.value.details["retryable"]) == (kind, False)
    assert caught.value.details["provider_status"] == status


def test_error_frame_malformed_and_missing_terminal(make_agent: MakeAgent) -> None:
    with make_agent("error_frame") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.details["kind"] == "auth"
    assert str(caught.value) == "Invalid API key"
    with make_agent("malformed") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.details["kind"] == "protocol"
    with make_agent("no_terminal") as agent, pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    assert caught.value.details == {"exit_code": 2, "signal": None}
    assert "fatal: stream closed" in str(caught.value)
    assert caught.value.result is not None and caught.value.result.text == "Half an"


def test_an_unreadable_result_on_the_control_transport_ends_the_run(make_agent: MakeAgent) -> None:
    # On the control transport codebuddy waits for stdin to close after its result: a result
    # line we could not read left the run waiting on it until the run's deadline.
    with make_agent("unreadable_result", policy=adaptor.Policy(approvals=ASK)) as agent:
        stream = agent.stream("hi", timeout=60)
        events = list(stream)
        with pytest.raises(adaptor.AgentFailedError) as caught:
            stream.result()
    assert str(caught.value).startswith("codebuddy printed a malformed stream: unparsable JSON")
    assert caught.value.details["kind"] == "protocol"
    pid = next(int(e.data["pid"]) for e in events
               if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert group_members(pid) == []


@pytest.mark.parametrize(("stderr", "kind"), [
    # Numbers that only look like HTTP statuses made a deterministic failure retryable or auth.
    ("Error: config parse error at line 512", None),
    ("Error: tool output exceeded 401 tokens", None),
    ("API Error: 429 rate limited", "rate_limit"),
])
def test_a_death_is_classified_by_what_it_says_and_keeps_both_keys(
        fake_exe: Callable[[str, str], str], stderr: str, kind: str | None) -> None:
    exe = fake_exe("codebuddy", f"import sys\nsys.stderr.write({stderr!r})\nsys.exit(1)\n")
    with adaptor.Agent(codebuddy.Driver(codebuddy.Config(command=exe))) as agent, \
            pytest.raises(adaptor.AgentFailedError) as caught:
        agent.run("hi")
    details = caught.value.details
    assert details.get("kind") == kind
    assert details.get("provider_status") == (429 if kind else None)
    assert (details["exit_code"], details["signal"]) == (1, None)


def test_a_prompt_that_starts_with_a_dash_is_the_prompt(make_agent: MakeAgent,
                                                        fake: FakeCLI) -> None:
    # It travels as the last argument: without "--" the CLI took "- fix..." for an option.
    prompt = "- fix the login bug\n- add a test"
    with make_agent() as agent:
        result = agent.run(prompt)
    assert records(fake, "prompt") == [prompt]
    assert result.text
    assert records(fake, "argv")[0][-2:] == ["--", prompt]


def test_refused_resume_and_fork(make_agent: MakeAgent) -> None:
    store = Store()
    with make_agent(thread_store=store) as agent:
        agent.thread("t").run("hello")
        with pytest.raises(adaptor.ResumeRejectedError, match="cannot fork"):
            agent.thread("t").fork("t2").run("branch")
    with make_agent(thread_store=store) as agent:  # SESSION is not "known" this time
        with pytest.raises(adaptor.ResumeRejectedError) as caught:
            agent.thread("t", resume_only=True).run("again")
    assert "No conversation found with session ID: cb-session-1" in caught.value.reason


def test_argument_limits_are_refused_before_starting(make_agent: MakeAgent, fake: FakeCLI) -> None:
    with make_agent() as agent:
        refusals: list[Callable[[], object]] = [
            lambda: agent.run("p", append_system_prompt="x" * (32 * 1024 + 1)),
            lambda: agent.run("p" * (100 * 1024 + 1)),
        ]
        for refused in refusals:
            with pytest.raises(adaptor.RunError) as caught:
                refused()
            assert caught.value.reason == "unsupported_driver"
    assert records(fake, "argv") == []


def test_conformance(fake: FakeCLI, tmp_path: Path) -> None:
    # The fake knows the session it starts, which RES-01 resumes.
    session = {"FAKE_SESSION_ID": "conformance-1", "FAKE_KNOWN_SESSIONS": "conformance-1"}
    env = {"FAKE_RECORD": str(tmp_path / "record.jsonl"), **session}
    conformance.run(
        lambda: codebuddy.Driver(codebuddy.Config(command=fake.path, env=env)),
        stub_driver=lambda path: codebuddy.Driver(codebuddy.Config(command=path)),
    ).raise_for_failures()

"""The ``gemini`` driver: its parser over captured Gemini CLI 0.61.0 output, its argv through a
fake executable, and the REAL ``gemini`` binary against the mock Gemini API on 127.0.0.1.

The real-binary tests are marked slow and skipped, saying why, when the pinned CLI is not
installed (``.ci/install-clis.sh``).  They run offline the way real-clis.md §5 found works:
a private ``GEMINI_CLI_HOME`` whose ``settings.json`` selects API-key auth and turns telemetry,
usage statistics and update checks off, ``GOOGLE_GEMINI_BASE_URL`` pointing at the mock, and
``GEMINI_CLI_TRUST_WORKSPACE=true``.  ``general.maxAttempts: 1`` and ``retryFetchErrors:
false`` make API and network failures come back at once instead of after minutes of backoff.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor.driver import Request, SessionContext, SessionState
from adaptor.drivers import gemini
from adaptor.events import ProcessInfo, TextDelta, ToolCall, ToolResult
from adaptor.memory import Store
from adaptor.testing import RecordingSink, conformance
from tests.drivers._fakes import records
from tests.drivers.conftest import INSTALL_HINT, FakeCLI, _find_cli, group_members, transcript
from tests.drivers.mock_gemini import DEFAULT_TEXT, GeminiMock, quota_failure

MODEL = "gemini-2.5-flash"  # an explicit model skips the CLI's router request: faster runs



def replay(name: str, **kwargs: Any) -> tuple[adaptor.driver.Response, RecordingSink]:
    stdout, stderr, exit_code = transcript(name)
    sink = RecordingSink()
    return gemini.replay(stdout, stderr, exit_code, sink=sink, **kwargs), sink


# --- the parser over captured output -----------------------------------------------------------


def test_replay_text() -> None:
    response, sink = replay("gemini-text")
    assert response.output == "Hello from the mock Gemini server."
    assert response.failure is None and response.checkpoint is not None
    assert response.checkpoint.state.resume_id == "b52a3186-c9b5-434e-ba50-2ed477b29b10"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 12)
    assert (response.provider, response.model) == ("google", "auto")
    assert response.metadata["models"] == "gemini-3.5-flash-lite,gemini-3.8-flash"
    assert [i.kind for i in response.transcript] == ["init", "user", "assistant", "result",
                                                     "stderr", "stderr"]
    deltas = [e for e in sink.events if isinstance(e, TextDelta)]
    assert [d.phase for d in deltas] == ["start"] + ["content"] * 6 + ["end"]
    assert response.raw_streams.terminal is not None
    assert orjson.loads(response.raw_streams.terminal.json)["status"] == "success"


def test_replay_tool_use_keeps_only_the_text_after_it() -> None:
    response, sink = replay("gemini-shell-yolo")
    assert response.output.startswith('Tool result was: {"output": "<untrusted_context>')
    calls = [e for e in sink.events if isinstance(e, ToolCall)]
    assert [(c.phase, c.name) for c in calls] == [("start", "run_shell_command"),
                                                  ("end", "run_shell_command")]
    assert calls[0].args == {"command": "echo hi", "description": "mock command"}
    assert [(r.result, r.is_error) for r in sink.events if isinstance(r, ToolResult)] == [
        ("hi", False)]


def test_replay_api_error_and_dead_process() -> None:
    response, _ = replay("gemini-err-401")
    assert response.failure is not None and response.exit_code == 145
    assert dict(response.failure.details) == {
        "kind": "auth", "retryable": False, "provider_status": 401, "error_type": "unknown",
        "exit_code": 145}
    assert response.checkpoint is None
    # Killed while retrying a 500 (the capture's harness gave up): no terminal, no checkpoint.
    response, _ = replay("gemini-err-500")
    assert response.failure is not None and response.checkpoint is None
    assert "ended without a result" in response.failure.message
    response, _ = replay("gemini-invalid-flag")
    assert response.failure is not None
    assert response.failure.message.startswith(
        "gemini ended without a result (exit code 1): Unknown arguments: bogus-flag")


def test_replay_output_cut_off_mid_line_says_why() -> None:
    # The CLI exits with what its stdout pipe could not take dropped: after the echo of a prompt
    # over the pipe's size the output ends mid-line, which read as the driver's own fault.
    stdout = (b'{"type":"init","timestamp":"t","session_id":"s","model":"m"}\n'
              b'{"type":"message","timestamp":"t","role":"user","content":"word word wo')
    response = gemini.replay(stdout, b"", 0)
    assert response.failure is not None and response.failure.details["kind"] == "protocol"
    assert "output cut off mid-line" in response.failure.message
    # A line the CLI finished, yet malformed, is its own fault, as before.
    response = gemini.replay(stdout + b"\n", b"", 0)
    assert response.failure is not None
    assert response.failure.message.startswith("gemini printed a malformed stream")


@pytest.mark.parametrize("stderr", [
    b"When using Gemini API, you must specify the GEMINI_API_KEY environment variable.\n"
    b"Update your environment and try again (no reload needed if using .env)!\n",
    b"Invalid auth method selected.\n",
])
def test_the_clis_own_authentication_exit_is_auth(stderr: bytes) -> None:
    # No key (or no auth method) makes the CLI exit 41 before any request, with no result: an
    # agent_error with no kind, where claude's and codex's missing key are "auth".
    response = gemini.replay(b"", stderr, 41)
    assert response.failure is not None and response.failure.code == "agent_error"
    assert dict(response.failure.details) == {"kind": "auth", "retryable": False, "exit_code": 41,
                                              "signal": None}
    assert response.failure.message.startswith("gemini ended without a result (exit code 41): ")
    # Exit 41 is the CLI's; another status with the same words stays unclassified.
    response = gemini.replay(b"", stderr, 1)
    assert response.failure is not None and "kind" not in response.failure.details


def test_a_coloured_refusal_is_quoted_without_its_escapes() -> None:
    # The CLI colours its refusal of an untrusted directory even on a pipe; the message quoted
    # the escape and, cut at 300 characters before the reset, left a terminal red.
    why = ("Gemini CLI is not running in a trusted directory. To proceed, either use "
           "`--skip-trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment variable, or "
           "trust this directory in interactive mode. For more details, see "
           "https://geminicli.com/docs/cli/trusted-folders/#headless-and-automated-environments")
    response = gemini.replay(b"", f"\x1b[31m{why}\x1b[39m\n".encode(), 55)
    assert response.failure is not None
    assert response.failure.message == f"gemini ended without a result (exit code 55): {why[:300]}"
    assert response.transcript[0].text == f"\x1b[31m{why}\x1b[39m"  # the transcript keeps it


def test_a_turn_the_cli_stopped_as_a_loop_is_not_a_success() -> None:
    # Gemini CLI cuts a turn it judges looping (a long repetitive answer), warns, and still
    # ends with status "success": the driver passed the cut answer off as the whole one.
    lines = [{"type": "init", "session_id": "s", "model": "m"},
             {"type": "message", "role": "assistant", "content": "again and again ", "delta": True},
             {"type": "error", "severity": "warning", "message": "Loop detected, stopping execution"},
             {"type": "result", "status": "success", "stats": {}}]
    response = gemini.replay(b"\n".join(orjson.dumps(x) for x in lines), exit_code=0)
    assert response.failure is not None and response.checkpoint is None
    assert response.failure.code == "agent_error"
    assert dict(response.failure.details) == {"kind": "loop_detected"}
    assert response.failure.message == "gemini stopped the turn: Loop detected, stopping execution"
    # Any other warning leaves a success a success.
    lines[2] = {"type": "error", "severity": "warning", "message": "something minor"}
    response = gemini.replay(b"\n".join(orjson.dumps(x) for x in lines), exit_code=0)
    assert response.failure is None and response.checkpoint is not None


def test_status_from_the_exit_code_and_error_events() -> None:
    # A 429 whose message carries no number: the exit status (429 & 0xff) still tells.
    result = {"type": "result", "status": "error",
              "error": {"type": "unknown", "message": "[API Error: Quota exceeded]"}}
    response = gemini.replay(orjson.dumps(result) + b"\n", exit_code=173)
    assert response.failure is not None
    assert response.failure.details["provider_status"] == 429
    assert response.failure.details["kind"] == "rate_limit"
    # An invalid stream ends with an error result that names no error: the error event does.
    lines = [{"type": "init", "session_id": "s", "model": "m"},
             {"type": "error", "severity": "error", "message": "model returned nothing"},
             {"type": "result", "status": "error", "stats": {}}]
    response = gemini.replay(b"\n".join(orjson.dumps(x) for x in lines), exit_code=0)
    assert response.failure is not None and response.failure.message == "model returned nothing"


@pytest.mark.parametrize("extra", [b"{not json\n",
                                   b'{"type":"message","role":"assistant","content":"late"}\n'])
def test_malformed_or_late_lines_block_the_checkpoint(extra: bytes) -> None:
    stdout, stderr, _ = transcript("gemini-text")
    response = gemini.replay(stdout + extra, stderr, 0)
    assert response.checkpoint is None
    assert response.failure is not None and response.failure.details["kind"] == "protocol"


def test_tool_error_result() -> None:
    lines = [{"type": "init", "session_id": "s", "model": "m"},
             {"type": "tool_use", "tool_name": "read_file", "tool_id": "t1",
              "parameters": {"file_path": "/x"}},
             {"type": "tool_result", "tool_id": "t1", "status": "error",
              "error": {"type": "invalid_tool_params", "message": "Path not in workspace"}},
             {"type": "message", "role": "assistant", "content": "Sorry.", "delta": True},
             {"type": "result", "status": "success", "stats": {}}]
    sink = RecordingSink()
    response = gemini.replay(b"\n".join(orjson.dumps(x) for x in lines), sink=sink)
    assert response.output == "Sorry." and response.failure is None
    (result,) = [e for e in sink.events if isinstance(e, ToolResult)]
    assert (result.result, result.is_error) == ("Path not in workspace", True)


def test_resume_refusals() -> None:
    state = SessionState("sid", data={"cwd": "/elsewhere"})
    with pytest.raises(adaptor.ResumeRejectedError, match="working directory changed"):
        gemini.replay(b"", request=Request(run_id="r", prompt="",
                                           session=SessionContext("continue_only", state)))
    with pytest.raises(adaptor.ResumeRejectedError, match="cannot fork"):
        gemini.replay(b"", request=Request(run_id="r", prompt="",
                                           session=SessionContext("fork", state)))
    here = SessionState("sid", data={"cwd": os.getcwd()})
    with pytest.raises(adaptor.ResumeRejectedError, match="Invalid session identifier"):
        gemini.replay(b"", b'Error resuming session: Invalid session identifier "sid".\n', 42,
                      request=Request(run_id="r", prompt="",
                                      session=SessionContext("continue_only", here)))


# --- argv, stdin and refusals through a fake executable -----------------------------------------


def test_argv_stdin_and_policy(fake_cli: Callable[..., FakeCLI], tmp_path: Path) -> None:
    fake = fake_cli("gemini-text")
    config = gemini.Config(command=fake.path, model="m1", home=str(tmp_path / "gh"),
                           approval_mode="auto_edit")
    auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with adaptor.Agent(gemini.Driver(config), workspace=str(tmp_path)) as agent:
        assert agent.run("say hello", instructions="Be brief.").text == DEFAULT_TEXT
        agent.run("say hello", policy=auto, model="m2")
        with pytest.raises(adaptor.HumanDecisionModeUnsupportedError):
            agent.run("x", policy=adaptor.Policy(approvals=adaptor.ApprovalPolicy(
                plan_review="ask")))
        with pytest.raises(adaptor.PolicyCapabilityUnsupportedError):
            agent.run("x", policy=adaptor.Policy(sandbox="read_only"))
        with pytest.raises(adaptor.RunError) as caught:
            agent.run("x", append_system_prompt="Be terse.")
        assert caught.value.reason == "unsupported_driver"
    first, second = records(fake, "argv")
    assert first[1:] == ["-p", "", "-o", "stream-json", "-m", "m1",
                         "--approval-mode", "auto_edit"]
    assert second[1:] == ["-p", "", "-o", "stream-json", "-m", "m2",
                          "--approval-mode", "yolo"]
    assert records(fake, "stdin")[0] == "Be brief.\n\nsay hello"
    assert "GEMINI_CLI_HOME" in records(fake, "env")[0]


# --- the real binary ----------------------------------------------------------------------------

GEMINI_VERSION = "0.61.0"


@pytest.fixture(scope="session")
def gemini_bin() -> str:
    found = _find_cli("ADAPTOR_GEMINI_BIN", f"gemini-cli-{GEMINI_VERSION}", "gemini")
    if found is None:
        pytest.skip(f"gemini {GEMINI_VERSION} not installed: "
                    + INSTALL_HINT.format(var="ADAPTOR_GEMINI_BIN"))
    return found


@pytest.fixture
def mock() -> Iterator[GeminiMock]:
    server = GeminiMock()
    with server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    path = tmp_path / "work"
    path.mkdir()
    return str(path)


@pytest.fixture
def gemini_config(
    gemini_bin: str, mock: GeminiMock, isolated_home: dict[str, str], tmp_path: Path
) -> Callable[..., gemini.Config]:
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True, "maxAttempts": 1,
                    "retryFetchErrors": False},
    }
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))

    def make(base_url: str | None = None, **fields: Any) -> gemini.Config:
        env = {**isolated_home, "GEMINI_API_KEY": "mock-key", "GEMINI_CLI_TRUST_WORKSPACE": "true",
               "GOOGLE_GEMINI_BASE_URL": base_url or mock.url}
        return gemini.Config(command=gemini_bin, env=env, home=str(home), **fields)

    return make


@pytest.mark.slow
def test_real_conformance_with_model_routing(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock
) -> None:
    # No model: the CLI's router first asks the mock to classify the prompt (a JSON-schema
    # request), then streams the chat turn.
    conformance.run(
        lambda: gemini.Driver(gemini_config()),
        stub_driver=lambda path: gemini.Driver(dataclasses.replace(gemini_config(), command=path)),
    ).raise_for_failures()
    # Twice: the run, then the turn resuming its session (RES-01); the stub run asks nothing.
    assert [r["path"].split(":")[-1] for r in mock.requests] == [
        "generateContent", "streamGenerateContent?alt=sse"] * 2


@pytest.mark.slow
def test_real_thread_resume_and_lost_session(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str,
    tmp_path: Path,
) -> None:
    store = Store()
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace,
                       thread_store=store) as agent:
        thread = agent.thread("conversation")
        first = thread.run("say hello")
        mock.configure(text="Resumed reply.")
        stream = thread.stream("say it again")
        events = list(stream)
        second = stream.result()
    session = first.metadata["session_id"]
    assert first.text == DEFAULT_TEXT and second.text == "Resumed reply."
    assert second.metadata["session_id"] == session
    argv = next(e.data["argv"] for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert argv[argv.index("--resume") + 1] == session
    first_turn, second_turn = mock.chats()
    assert len(second_turn["contents"]) > len(first_turn["contents"])  # the history came along
    assert first.usage is not None and first.usage.input_tokens == 20
    assert (first.provider, first.model) == ("google", MODEL)

    chats = glob.glob(str(tmp_path / "gemini-home" / ".gemini" / "tmp" / "*" / "chats" / "*"))
    assert chats, "gemini keeps sessions under GEMINI_CLI_HOME/.gemini/tmp/<project>/chats"
    for path in chats:
        os.remove(path)  # the CLI lost the conversation
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace,
                       thread_store=store) as agent:
        with pytest.raises(adaptor.ResumeRejectedError) as caught:
            agent.thread("conversation", resume_only=True).run("again")
    assert "Error resuming session" in caught.value.reason


@pytest.mark.slow
def test_real_tool_use_with_auto_approve(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # run_shell_command is only offered to the model when the approval mode allows it.
    mock.configure(tool=("run_shell_command", {"command": "echo hi > made.txt; echo done",
                                               "description": "mock command"}))
    auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace,
                       policy=auto) as agent:
        stream = agent.stream("make a file")
        events = list(stream)
        result = stream.result()
    assert Path(workspace, "made.txt").read_text() == "hi\n"
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.phase, c.name) for c in calls] == [("start", "run_shell_command"),
                                                  ("end", "run_shell_command")]
    assert [(r.result, r.is_error) for r in events if isinstance(r, ToolResult)] == [
        ("done", False)]
    assert result.text.startswith("Tool result was:") and "done" in result.text
    kinds = [i.kind for i in result.transcript() if i.kind not in ("stderr", "user")]
    assert kinds == ["init", "tool_call", "tool_result", "assistant", "result"]


@pytest.mark.slow
def test_real_auto_reject_withholds_the_tools_that_need_approval(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # auto_reject wins over the config's yolo: shell and file writes are not offered at all,
    # so nothing is ever asked or rejected at run time (on_reject never applies).
    mock.configure(tool=("write_file", {"file_path": f"{workspace}/made.txt", "content": "hi\n"}))
    strict = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_reject"))
    config = gemini_config(model=MODEL, approval_mode="yolo")
    with adaptor.Agent(gemini.Driver(config), workspace=workspace, policy=strict) as agent:
        stream = agent.stream("make a file")
        events = list(stream)
        result = stream.result()
    argv = next(e.data["argv"] for e in events if isinstance(e, ProcessInfo) and e.kind == "spawn")
    assert argv[argv.index("--approval-mode") + 1] == "default"
    offered = {d["name"] for t in mock.chats()[0]["tools"] for d in t["functionDeclarations"]}
    assert not offered & {"run_shell_command", "write_file", "replace"}
    assert result.text == DEFAULT_TEXT and not Path(workspace, "made.txt").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("status", "kind"), [(401, "auth"), (500, "provider_unavailable")])
def test_real_error_status(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str, status: int,
    kind: str,
) -> None:
    mock.configure(status=status)
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    details = caught.value.details
    assert (details["kind"], details["provider_status"]) == (kind, status)
    assert details["exit_code"] == status & 0xFF  # the CLI exits with the HTTP status
    assert f"mock error {status}" in str(caught.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "error", "kind", "said", "provider_status"),
    [
        (429, quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier", 250), "quota",
         "exhausted your daily quota", 429),
        (429, quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", 0), "quota",
         "limit: 0", 429),
        # The CLI's ModelNotFoundError exits 1: the status is nowhere in what it prints.
        (404, {"code": 404, "message": "models/gemini-2.5-flash is not found for API version "
               "v1beta, or is not supported for generateContent.", "status": "NOT_FOUND"},
         "model_not_found", "models/gemini-2.5-flash is not found", None),
        (400, {"code": 400, "message": "The input token count (1200000) exceeds the maximum "
               "number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"},
         "context_too_long", "exceeds the maximum number of tokens", 400),
    ],
    ids=["daily_quota", "no_quota", "model_not_found", "context_too_long"],
)
def test_real_errors_no_retry_mends_have_their_own_kinds(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str, status: int,
    error: dict[str, Any], kind: str, said: str, provider_status: int | None,
) -> None:
    # A spent quota (which the CLI itself gives up on) was rate_limit, retryable: a script
    # retried it for ever.  An unknown model and a prompt over the context window had no kind.
    mock.configure(status=status, error=error)
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    details = caught.value.details
    assert caught.value.reason == "agent_error"
    assert (details["kind"], details["retryable"], details.get("provider_status")) == (
        kind, False, provider_status)
    assert said in str(caught.value)


@pytest.mark.slow
def test_real_a_per_minute_quota_stays_a_rate_limit(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # Gemini words a per-minute limit as a spent quota ("You exceeded your current quota,
    # please check your plan and billing details"): only the CLI's verdict makes one final.
    mock.configure(status=429,
                   error=quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", 250))
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    assert "exceeded your current quota" in str(caught.value)
    assert (caught.value.details["kind"], caught.value.details["retryable"]) == ("rate_limit", True)


@pytest.mark.slow
def test_real_missing_api_key_is_auth(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    config = gemini_config(model=MODEL)
    env = {k: v for k, v in config.env.items() if k != "GEMINI_API_KEY"}
    with adaptor.Agent(gemini.Driver(dataclasses.replace(config, env=env)),
                       workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    assert (caught.value.details["kind"], caught.value.details["retryable"]) == ("auth", False)
    assert "GEMINI_API_KEY" in str(caught.value)
    assert mock.requests == []  # refused before any request


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["truncate", "end_early", "garbled"])
def test_real_broken_stream_is_provider_unavailable_and_retryable(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str, broken: str
) -> None:
    # The CLI reports a stream cut mid-way as "[API Error: terminated]", exit 1: it was an
    # agent_error with no kind, so hosts retrying on details.retryable gave up (claude and
    # codex say provider_unavailable, retryable, for the same cut).  So were a stream that ends
    # without a finish reason ("Model stream ended without a finish reason.") and one whose
    # event is not JSON ("[API Error: Expected property name or '}' in JSON at position 1 ...]").
    mock.configure(text="a long answer cut short", **{broken: True})
    with adaptor.Agent(gemini.Driver(gemini_config()), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    details = caught.value.details
    assert (details["kind"], details["retryable"]) == ("provider_unavailable", True), details


@pytest.mark.slow
def test_real_prompt_of_a_few_hundred_kb_is_answered(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # The CLI echoes the prompt on stdout and exits with what the pipe could not take still
    # queued: the answer and the result were lost ("a malformed stream", most runs).
    prompt = "word " * 60_000 + "END"
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace) as agent:
        result = agent.run(prompt)
    assert result.text == DEFAULT_TEXT


@pytest.mark.slow
def test_real_prompt_over_the_context_window_is_context_too_long(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # The CLI estimates the prompt would overflow the model's context (256k tokens for this
    # model), calls no model, and says "success" with nothing else: an empty answer passed.
    prompt = "word " * 208_000
    config = gemini_config(model="gemma-4-31b-it")
    with adaptor.Agent(gemini.Driver(config), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run(prompt)
    assert caught.value.details["kind"] == "context_too_long", caught.value.details
    assert mock.chats() == []


def test_real_unreachable_endpoint(
    gemini_config: Callable[..., gemini.Config], workspace: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once the socket closes
    config = gemini_config(base_url=f"http://127.0.0.1:{port}", model=MODEL)
    with adaptor.Agent(gemini.Driver(config), workspace=workspace) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("say hello")
    assert caught.value.details["kind"] == "provider_unavailable"
    assert caught.value.details["retryable"] is True
    assert "fetch failed" in str(caught.value)


@pytest.mark.slow
def test_real_cancel_mid_run_leaves_no_process(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    mock.configure(delay=60.0)  # the chat turn never answers
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace) as agent:
        stream = agent.stream("say hello")
        pid = 0
        for event in stream:
            if isinstance(event, ProcessInfo) and event.kind == "spawn":
                pid = int(event.data["pid"])
            if isinstance(event, ProcessInfo) and '"type":"init"' in event.text:
                stream.cancel()
        with pytest.raises(adaptor.RunCancelledError):
            stream.result()
    assert pid and group_members(pid) == []  # launcher and the re-spawned node both gone


@pytest.mark.slow
def test_real_cancel_stops_the_shell_tool_that_left_the_group(
    gemini_config: Callable[..., gemini.Config], mock: GeminiMock, workspace: str
) -> None:
    # The CLI runs its shell tool in a session of its own, out of reach of the signals to the
    # agent's process group: a cancelled run's command went on (reparented to init).
    started = Path(workspace, "started")
    command = f"touch {started}; exec sleep 313371"
    mock.configure(tool=("run_shell_command", {"command": command, "description": "mock command"}))
    auto = adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission="auto_approve"))
    with adaptor.Agent(gemini.Driver(gemini_config(model=MODEL)), workspace=workspace,
                       policy=auto) as agent:
        stream = agent.stream("run it")
        for event in stream:
            if isinstance(event, ToolCall) and event.phase == "start":
                deadline = time.monotonic() + 30
                while not started.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                stream.cancel()
        with pytest.raises(adaptor.RunCancelledError):
            stream.result()
    assert started.exists()
    left = subprocess.run(["pgrep", "-f", "sleep 313371"], capture_output=True, text=True).stdout.split()
    assert left == []

"""Both parsers over the captured transcripts of the real CLIs, plus mangled variants."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor import _nesting
from adaptor.driver import OutputSchema, Request, Response, SessionContext, SessionState
from adaptor.drivers import claude, codebuddy, codex, cursor, gemini
from adaptor.errors import ResumeRejectedError
from adaptor.events import TextDelta, Thinking, ToolCall, ToolResult
from adaptor.testing import RecordingSink
from tests.drivers.conftest import deepened, transcript

SCHEMA = OutputSchema(schema={"type": "object", "properties": {"name": {"type": "string"},
                                                               "count": {"type": "integer"}},
                              "required": ["name", "count"]})
RESUMING = SessionContext("continue_or_start",
                          SessionState("00000000-0000-4000-8000-000000000000"))


def replay(module: object, name: str, request: Request | None = None) -> tuple[Response, RecordingSink]:
    stdout, stderr, exit_code = transcript(name)
    sink = RecordingSink()
    response = module.replay(stdout, stderr, exit_code, sink=sink, request=request)  # type: ignore[attr-defined]
    return response, sink


def assert_consistent(response: Response, sink: RecordingSink) -> None:
    """The rules every replay keeps, whatever the input."""
    assert list(sink.transcript) == list(response.transcript)
    opened: dict[tuple[str, str], int] = {}
    for event in sink.events:
        if isinstance(event, TextDelta | Thinking):
            key = (type(event).__name__, event.message_id)
            if event.phase == "content":
                assert event.text and opened.get(key) == 1
            else:
                opened[key] = opened.get(key, 0) + (1 if event.phase == "start" else -1)
        elif isinstance(event, ToolCall):
            key = ("tool", event.id)
            if event.phase in ("start", "end"):
                opened[key] = opened.get(key, 0) + (1 if event.phase == "start" else -1)
    assert all(count == 0 for count in opened.values()), opened
    checkpoint = response.checkpoint
    if checkpoint is not None and checkpoint.valid:
        assert response.failure is None and response.exit_code == 0
        assert response.signal is None and not response.timed_out
        assert checkpoint.state.resume_id
        assert response.metadata.get("protocol") != "malformed"
    if response.raw_streams.terminal is not None:
        assert response.output.strip() != response.raw_streams.terminal.json.strip()


# cursor-agent cannot be installed here: its lines as the fake's ``tool`` scenario prints them.
_CURSOR_TOOL = (
    b'{"type":"system","subtype":"init","session_id":"s"}\n'
    b'{"type":"tool_call","subtype":"started","call_id":"c1","session_id":"s",'
    b'"tool_call":{"readToolCall":{"args":{"path":"notes.txt"}}}}\n'
    b'{"type":"result","subtype":"success","is_error":false,"result":"done","session_id":"s"}\n'
)


@pytest.mark.parametrize(
    ("module", "capture", "key"),
    [(claude, "claude-tool-write", "input"), (codex, "codex-mcp", "arguments"),
     (gemini, "gemini-shell-yolo", "parameters"),
     # CodeBuddy Code speaks Claude Code's stream-json.
     (codebuddy, "claude-tool-write", "input"), (cursor, _CURSOR_TOOL, "args")],
    ids=["claude", "codex", "gemini", "codebuddy", "cursor"],
)
def test_tool_arguments_nested_deeper_than_python_recurses(
    module: object, capture: str | bytes, key: str
) -> None:
    # orjson reads 1,024 levels; copy.deepcopy of the arguments gave up near 330 and the
    # parse failed with a RecursionError.
    stdout, stderr, exit_code = (capture, b"", 0) if isinstance(capture, bytes) else transcript(capture)
    sink = RecordingSink()
    response = module.replay(deepened(stdout, key, 1000), stderr, exit_code, sink=sink)  # type: ignore[attr-defined]
    assert response.failure is None
    calls = [e for e in sink.events if isinstance(e, ToolCall) and e.args]
    assert calls and all(e.args and _nesting.deeper_than(e.args["deep"], 999) for e in calls)


def kinds(response: Response) -> list[str]:
    return [item.kind for item in response.transcript]


# --- claude -------------------------------------------------------------------------------------


def test_claude_text() -> None:
    response, sink = replay(claude, "claude-text")
    assert_consistent(response, sink)
    assert response.output == "Hello from the mock Anthropic server."
    assert response.failure is None and response.checkpoint is not None
    assert response.checkpoint.valid
    assert response.checkpoint.state.resume_id == "1015e1df-1450-4cbf-a1da-79cc1a9c7cee"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 7)
    assert response.usage.cost_usd == pytest.approx(0.000188)
    assert (response.provider, response.model) == ("anthropic", "claude-opus-5-5")
    assert kinds(response) == ["init", "assistant", "result"]
    assert response.raw_streams.terminal is not None
    assert response.raw_streams.terminal.event == "result"
    assert orjson.loads(response.raw_streams.terminal.json)["subtype"] == "success"
    texts = [e for e in sink.events if isinstance(e, TextDelta)]
    assert [e.phase for e in texts] == ["start", "content", "end"]


def test_claude_partial_messages_stream_tokens_once() -> None:
    response, sink = replay(claude, "claude-partial")
    assert_consistent(response, sink)
    contents = [e.text for e in sink.events if isinstance(e, TextDelta) and e.phase == "content"]
    assert "".join(contents) == "Hello from the mock Anthropic server."
    assert len(contents) == 6  # token level, and the full assistant line adds no duplicate
    assert response.output == "Hello from the mock Anthropic server."


def test_claude_tool_call() -> None:
    response, sink = replay(claude, "claude-tool-write")
    assert_consistent(response, sink)
    assert kinds(response) == ["init", "tool_call", "tool_result", "assistant", "result"]
    call = response.transcript[1]
    assert call.tool_name == "Write" and call.input["content"] == "hi\n"
    result = response.transcript[2]
    assert result.tool_use_id == call.tool_use_id and not result.is_error
    assert response.output.startswith("Tool result was: File created successfully")
    assert [type(e).__name__ for e in sink.events if isinstance(e, ToolCall | ToolResult)] == [
        "ToolCall", "ToolCall", "ToolResult"]


def test_claude_silent_permission_denial_stays_visible() -> None:
    response, sink = replay(claude, "claude-perm-denied")
    assert_consistent(response, sink)
    assert response.failure is None and response.checkpoint is not None
    denials = orjson.loads(response.metadata["permission_denials"])
    assert denials[0]["tool_name"] == "Bash"
    denied = [i for i in response.transcript if i.subtype == "permission_denied"]
    assert denied and denied[0].tool_name == "Bash" and "needs approval" in denied[0].text
    assert any(i.kind == "tool_result" and i.is_error for i in response.transcript)


@pytest.mark.parametrize(
    ("name", "kind", "retryable", "status"),
    [
        ("claude-err-401", "auth", False, 401),
        ("claude-no-api-key", "auth", False, None),
        ("claude-err-429", "rate_limit", True, 429),
        ("claude-err-500", "provider_unavailable", True, 500),
        ("claude-unreachable", "provider_unavailable", True, None),
    ],
)
def test_claude_api_errors(name: str, kind: str, retryable: bool, status: int | None) -> None:
    response, sink = replay(claude, name)
    assert_consistent(response, sink)
    failure = response.failure
    assert failure is not None and failure.code == "agent_error"
    assert failure.details["kind"] == kind and failure.details["retryable"] is retryable
    assert failure.details.get("provider_status") == status
    assert response.checkpoint is None
    assert response.output == ""  # the synthetic error message is not the model's answer
    assert "failure" in kinds(response)


def test_claude_bad_resume_id() -> None:
    with pytest.raises(ResumeRejectedError) as caught:
        replay(claude, "claude-resume-bad-id", Request(run_id="r", prompt="", session=RESUMING))
    assert "No conversation found" in caught.value.reason
    # Not resuming: the same output is a plain failure, never a resume rejection.
    response, _ = replay(claude, "claude-resume-bad-id")
    assert response.failure is not None and response.failure.code == "agent_error"


def test_claude_resume_keeps_the_session() -> None:
    request = Request(run_id="r", prompt="", session=SessionContext(
        "continue_only", SessionState("1015e1df-1450-4cbf-a1da-79cc1a9c7cee")))
    response, _ = replay(claude, "claude-resume", request)
    assert response.checkpoint is not None and response.checkpoint.valid
    assert response.checkpoint.state.resume_id == "1015e1df-1450-4cbf-a1da-79cc1a9c7cee"
    assert response.output == "Resumed reply."


def test_claude_native_structured_output() -> None:
    request = Request(run_id="r", prompt="", output_schema=SCHEMA,
                      structured_output_source="native")
    response, sink = replay(claude, "claude-json-schema", request)
    assert_consistent(response, sink)
    assert orjson.loads(response.output) == {"name": "mock", "count": 3}
    assert response.structured_output is not None and response.structured_output.valid
    # The CLI says success with structured_output null: the output is then plain final text,
    # which the SDK's own validation rejects.
    response, _ = replay(claude, "claude-json-schema-invalid", request)
    assert response.failure is None
    assert response.structured_output is not None and not response.structured_output.valid
    assert response.output.startswith("Tool result was: Output does not match")


def test_claude_interrupt_is_a_failure() -> None:
    response, sink = replay(claude, "claude-interrupt")
    assert_consistent(response, sink)
    assert response.failure is not None and response.checkpoint is None
    assert response.failure.details["subtype"] == "error_during_execution"


def test_claude_recovered_stream_and_mcp_tool() -> None:
    response, _ = replay(claude, "claude-truncated-stream")
    assert response.failure is None and response.checkpoint is not None
    assert [i.subtype for i in response.transcript if i.kind == "system"] == ["api_retry"]
    response, _ = replay(claude, "claude-mcp")
    call = next(i for i in response.transcript if i.kind == "tool_call")
    result = next(i for i in response.transcript if i.kind == "tool_result")
    assert call.tool_name == "mcp__mock__echo" and result.text == "echo: ping"


def test_claude_two_turns_in_one_stream_are_malformed_for_one_run() -> None:
    response, _ = replay(claude, "claude-stream-input-multiturn")
    assert response.failure is not None and response.failure.details["kind"] == "protocol"
    assert response.checkpoint is None


# --- codex --------------------------------------------------------------------------------------


def test_codex_text() -> None:
    response, sink = replay(codex, "codex-text")
    assert_consistent(response, sink)
    assert response.output == "Hello from the mock OpenAI server."
    assert response.checkpoint is not None and response.checkpoint.valid
    assert response.checkpoint.state.resume_id == "01a2362d-3ecd-7163-ac4a-f9331fbe9570"
    assert response.usage is not None and response.usage.input_tokens == 20
    assert response.raw_streams.terminal is not None
    assert response.raw_streams.terminal.event == "turn.completed"
    assert [k for k in kinds(response) if k != "stderr"] == ["init", "assistant", "result"]
    assert "stderr" in kinds(response)  # codex's PATH-alias warning and stdin note


@pytest.mark.parametrize(
    ("name", "tool", "result", "is_error"),
    [
        ("codex-shell", "shell", "hi\n", False),
        ("codex-patch", "apply_patch", "add /scratch/codex-work/hello.txt", False),
        ("codex-mcp", "mcp__mock__echo", "echo: ping", False),
        ("codex-mcp-needs-approval", "mcp__mock__echo",
         "MCP tool call requires approval, but approval policy is never", True),
    ],
)
def test_codex_tools(name: str, tool: str, result: str, is_error: bool) -> None:
    response, sink = replay(codex, name)
    assert_consistent(response, sink)
    call = next(i for i in response.transcript if i.kind == "tool_call")
    done = next(i for i in response.transcript if i.kind == "tool_result")
    assert call.tool_name == tool and done.text == result and done.is_error is is_error
    assert response.failure is None and response.checkpoint is not None


def test_codex_structured_output_and_resume() -> None:
    request = Request(run_id="r", prompt="", output_schema=SCHEMA,
                      structured_output_source="native")
    response, _ = replay(codex, "codex-output-schema", request)
    assert orjson.loads(response.output) == {"name": "mock", "count": 3}
    request = Request(run_id="r", prompt="", session=SessionContext(
        "continue_or_start", SessionState("01a2362d-3ecd-7163-ac4a-f9331fbe9570")))
    response, _ = replay(codex, "codex-resume", request)
    assert response.checkpoint is not None
    assert response.checkpoint.state.resume_id == "01a2362d-3ecd-7163-ac4a-f9331fbe9570"


def test_codex_bad_resume_id() -> None:
    with pytest.raises(ResumeRejectedError) as caught:
        replay(codex, "codex-resume-bad-id", Request(run_id="r", prompt="", session=RESUMING))
    assert "no rollout found" in caught.value.reason
    response, _ = replay(codex, "codex-resume-bad-id")
    assert response.failure is not None and response.checkpoint is None


@pytest.mark.parametrize(
    ("name", "kind", "retryable"),
    [
        ("codex-err-401", "auth", False),
        ("codex-no-api-key", "auth", False),
        ("codex-err-429", "rate_limit", True),
        ("codex-err-500", "provider_unavailable", True),
        ("codex-truncated-stream", "provider_unavailable", True),
        ("codex-unreachable", "provider_unavailable", True),
    ],
)
def test_codex_failures(name: str, kind: str, retryable: bool) -> None:
    response, sink = replay(codex, name)
    assert_consistent(response, sink)
    assert response.failure is not None and response.failure.code == "agent_error"
    assert response.failure.details["kind"] == kind
    assert response.failure.details["retryable"] is retryable
    assert response.checkpoint is None


def test_codex_warning_items_do_not_fail_the_run() -> None:
    response, _ = replay(codex, "codex-text-unknown-model")
    assert response.failure is None and response.checkpoint is not None
    assert any(i.subtype == "warning" and "Model metadata" in i.text for i in response.transcript)


# --- malformed streams --------------------------------------------------------------------------


@pytest.mark.parametrize(("module", "name"), [(claude, "claude-text"), (codex, "codex-text")])
def test_garbage_json_line_blocks_the_checkpoint(module: object, name: str) -> None:
    stdout, stderr, _ = transcript(name)
    lines = stdout.splitlines()
    mangled = b"\n".join([lines[0], b'{"type": "assistant", "mess', *lines[1:]]) + b"\n"
    response = module.replay(mangled, stderr, 0)  # type: ignore[attr-defined]
    assert response.checkpoint is None
    assert response.failure is not None and response.failure.details["kind"] == "protocol"


@pytest.mark.parametrize(("module", "name"), [(claude, "claude-text"), (codex, "codex-text")])
def test_event_after_the_terminal_is_malformed(module: object, name: str) -> None:
    stdout, stderr, _ = transcript(name)
    response = module.replay(stdout + stdout.splitlines()[-1] + b"\n", stderr, 0)  # type: ignore[attr-defined]
    assert response.checkpoint is None and response.failure is not None


@pytest.mark.parametrize(("module", "name"), [(claude, "claude-text"), (codex, "codex-text")])
def test_plain_text_lines_are_kept_but_harmless(module: object, name: str) -> None:
    stdout, stderr, _ = transcript(name)
    response = module.replay(b"npm notice: something\n" + stdout, stderr, 0)  # type: ignore[attr-defined]
    assert response.failure is None and response.checkpoint is not None
    assert response.transcript[0].kind in ("stdout", "stderr")


SUCCESSES = ["claude-text", "claude-partial", "claude-tool-write", "claude-json-schema",
             "codex-text", "codex-shell", "codex-mcp", "codex-patch"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(SUCCESSES),
    mangles=st.lists(
        st.tuples(st.sampled_from(["truncate", "garbage", "stderr", "drop", "duplicate"]),
                  st.integers(min_value=0, max_value=50), st.binary(max_size=20)),
        min_size=1, max_size=4,
    ),
)
def test_mangled_transcripts_never_crash_or_checkpoint_wrongly(
    name: str, mangles: list[tuple[str, int, bytes]]
) -> None:
    module = claude if name.startswith("claude") else codex
    stdout, stderr, exit_code = transcript(name)
    lines = stdout.splitlines()
    err_lines = stderr.splitlines()
    broke = False
    for how, where, noise in mangles:
        index = where % len(lines)
        if how == "truncate" and len(lines[index]) > 2:
            lines[index] = lines[index][: max(1, len(lines[index]) // 2)]
            broke = True
        elif how == "garbage":
            lines.insert(index, b"{" + noise)
            broke = True
        elif how == "stderr":
            err_lines.insert(where % (len(err_lines) + 1), noise.replace(b"\n", b" "))
        elif how == "drop":
            broke = broke or b'"result"' in lines[index] or b"turn.completed" in lines[index]
            del lines[index]
            if not lines:
                lines = [b""]
        elif how == "duplicate":
            lines.insert(index, lines[index])
            broke = True
    sink = RecordingSink()
    response = module.replay(b"\n".join(lines) + b"\n", b"\n".join(err_lines), exit_code,
                             sink=sink)
    assert_consistent(response, sink)
    if broke and response.checkpoint is not None:
        # Only mangling that left a well-formed stream may still checkpoint: e.g. a truncated
        # line that happens to stay valid JSON, or a duplicate of a non-terminal event.
        assert response.failure is None


@pytest.mark.parametrize(
    ("said", "kind", "status"),
    [
        ("config parse error at line 512", None, None),  # a line number, not a status
        ("unexpected status 503 Service Unavailable", "provider_unavailable", 503),
    ],
)
def test_codex_death_takes_only_a_quoted_status(said: str, kind: str | None, status: int | None) -> None:
    # Any 4xx/5xx-looking number became provider_status (and, before the kinds were mended,
    # the kind): "line 512" read as a server failure.
    stdout = orjson.dumps({"type": "error", "message": said}) + b"\n"
    failure = codex.replay(stdout, b"", 1).failure
    assert failure is not None
    assert (failure.details.get("kind"), failure.details.get("provider_status")) == (kind, status)


@pytest.mark.parametrize(
    ("stdout", "stderr", "kind"),
    [
        (b'{"type":"error","message":"unexpected status 401 Unauthorized: bad key"}\n', b"", "auth"),
        (b"", b"Error: turn/start: turn/start failed: Input exceeds the maximum length of 1048576 "
              b"characters. (code -32602)\n", "context_too_long"),
        (b"", b"Error: something else broke\n", None),
    ],
)
def test_a_classified_codex_death_keeps_its_exit_code_and_signal(
    stdout: bytes, stderr: bytes, kind: str | None
) -> None:
    # drivers.md: a death that is classified keeps both; codex's dropped "signal": None.
    failure = codex.replay(stdout, stderr, 1).failure
    assert failure is not None
    assert (failure.details["exit_code"], failure.details["signal"]) == (1, None), failure.details
    assert failure.details.get("kind") == kind


_RESUMED_TURN = (b'{"type":"thread.started","thread_id":"t1"}\n'
                 b'{"type":"turn.completed","usage":{"input_tokens":60,"cached_input_tokens":12,'
                 b'"output_tokens":18}}\n')


@pytest.mark.parametrize(
    ("stored", "reported"),
    [
        ('{"input_tokens":40,"output_tokens":12,"cached_input_tokens":8}', (20, 6, 4)),
        # Kept from before (none), or changed by hand: the totals as codex said them.
        (None, (60, 18, 12)),
        ("not json", (60, 18, 12)),
        # It reported 1060 input tokens for a turn of 20.
        ('{"input_tokens":-1000,"output_tokens":-1000,"cached_input_tokens":-1000}', (60, 18, 12)),
        ('{"input_tokens":100,"output_tokens":1,"cached_input_tokens":1}', (60, 18, 12)),
    ],
)
def test_a_resumed_codex_turn_reports_what_it_added_to_the_sessions_totals(
    stored: str | None, reported: tuple[int, int, int]
) -> None:
    data = {"cwd": "/"} if stored is None else {"cwd": "/", "usage": stored}
    request = Request(run_id="r", prompt="", workspace_cwd="/",
                      session=SessionContext("continue_or_start", SessionState("t1", data=data)))
    response = codex.replay(_RESUMED_TURN, b"", 0, request=request)
    assert response.usage is not None
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens) == reported
    assert response.checkpoint is not None
    assert orjson.loads(response.checkpoint.state.data["usage"])["input_tokens"] == 60

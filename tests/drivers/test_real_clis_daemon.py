"""The real ``claude`` and ``codex`` binaries driven end to end through a running ``adaptord``.

Marked slow; skipped with a visible reason when the pinned CLIs are not installed
(``.ci/install-clis.sh``).  Requests go through the spool of a real ``adaptord serve``
subprocess (``tests/daemon_harness.py``), with the same isolated environment as
``test_real_clis.py``: per-test HOME, CLAUDE_CONFIG_DIR and CODEX_HOME, the mock model servers
on 127.0.0.1, and the variables that stop all outside traffic.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

import adaptor
from adaptor import _home, errors
from adaptor.events import ProcessInfo, TextDelta, ToolCall, ToolResult
from adaptor.spool import Client
from tests.daemon_harness import DaemonProcess, cmdline
from tests.drivers.conftest import QUIET_CLAUDE, group_members
from tests.drivers.mock_anthropic import AnthropicMock
from tests.drivers.mock_openai import OpenAIMock
from tests.drivers.test_real_clis import closed_port

pytestmark = pytest.mark.slow

TIMEOUT = 120.0
T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

# The in-process tests' ``Item`` dataclass, as a request carries it: a JSON Schema.
ITEM_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["name", "count"],
    "additionalProperties": False,
}


def wait_until(find: Callable[[], T | None], what: str, timeout: float = TIMEOUT) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = find()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "adaptord-home"


@pytest.fixture
def daemon(home: Path) -> Iterator[DaemonProcess]:
    started = DaemonProcess(home, env=QUIET_CLAUDE).start()
    yield started
    # Stopped, not killed: a killed daemon leaves the private folder of each claude process
    # it kept in its home's tmp/ until a daemon starts there again.
    if started.proc is not None and started.proc.poll() is None:
        started.stop()


@pytest.fixture
def claude_request(
    claude_bin: str,
    anthropic: AnthropicMock,
    isolated_home: dict[str, str],
    tmp_path: Path,
    workspace: str,
) -> Callable[..., dict[str, Any]]:
    """A daemon request for the real claude against the Anthropic mock."""

    def make(
        prompt: str, *, base_url: str | None = None, config: dict[str, Any] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        # QUIET_CLAUDE's "0"/"1" values go in the daemon's own environment (the CLI inherits
        # it): the daemon redacts every config.env value as a secret, by substring, from
        # everything it records (see test_short_env_values_corrupt_the_run_log).
        env = {
            **isolated_home,
            "ANTHROPIC_API_KEY": "sk-ant-mock-key",
            "ANTHROPIC_BASE_URL": base_url or anthropic.url,
        }
        config = {
            "command": claude_bin,
            "env": env,
            "config_dir": str(tmp_path / "claude-profile"),
            **(config or {}),
        }
        return {
            "driver": "claude",
            "prompt": prompt,
            "workspace": workspace,
            "config": config,
            **fields,
        }

    return make


@pytest.fixture
def codex_request(
    codex_bin: str,
    openai: OpenAIMock,
    isolated_home: dict[str, str],
    tmp_path: Path,
    workspace: str,
) -> Callable[..., dict[str, Any]]:
    """A daemon request for the real codex against the OpenAI mock."""

    def make(
        prompt: str, *, base_url: str | None = None, config: dict[str, Any] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        provider = (
            f'model_providers.mock={{name="mock",base_url="{base_url or openai.base_url}",'
            'env_key="MOCK_API_KEY",wire_api="responses",request_max_retries=0,'
            "stream_max_retries=0}"
        )
        extra = [
            "-c",
            "model_provider=mock",
            "-c",
            provider,
            "-c",
            "analytics.enabled=false",
            "-c",
            "check_for_update_on_startup=false",
            "--disable",
            "plugins",
        ]
        config = {
            "command": codex_bin,
            "model": "gpt-5.5",
            "home": str(tmp_path / "codex-home"),
            "env": {**isolated_home, "MOCK_API_KEY": "mock-key"},
            "extra_args": extra,
            **(config or {}),
        }
        return {
            "driver": "codex",
            "prompt": prompt,
            "workspace": workspace,
            "config": config,
            **fields,
        }

    return make


def run_ok(home: Path, request: dict[str, Any]) -> tuple[dict[str, Any], adaptor.Result]:
    """Submit, wait for the verdict, and require success; the raw verdict and the Result."""
    client = Client(home)
    request_id = client.submit(request)
    result = client.wait(request_id, timeout=TIMEOUT)
    verdict = client.verdict(request_id)
    assert verdict is not None and verdict["ok"] is True, verdict
    return verdict, result


def failed_verdict(
    verdict: dict[str, Any], expected: type[BaseException], code: str, exit_code: int
) -> None:
    """Check a failed verdict's error identity (docs/errors.md and the exit code)."""
    assert verdict["ok"] is False, verdict
    error = verdict["error"]
    assert (error["code"], error["type"], verdict["exit_code"]) == (code, expected.__name__, exit_code)
    # ``errors.from_wire`` rebuilds the very class the in-process run raises.
    assert type(errors.from_wire(error)) is expected


def run_failed(
    home: Path, request: dict[str, Any], expected: type[E], code: str, exit_code: int = 1
) -> tuple[dict[str, Any], E]:
    """Submit and require that failure; the raw verdict and what ``Client.wait`` raised (a
    RunError with its rebuilt ``result``)."""
    client = Client(home)
    request_id = client.submit(request)
    with pytest.raises(expected) as caught:
        client.wait(request_id, timeout=TIMEOUT)
    verdict = client.verdict(request_id)
    assert verdict is not None
    failed_verdict(verdict, expected, code, exit_code)
    return verdict, caught.value


def thread_log(home: Path, key: str) -> list[dict[str, Any]]:
    path = _home.Home.at(home).events / f"{_home.session_for_thread(key)}.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def request_events(home: Path, request_id: str) -> list[adaptor.Event]:
    """What the audit log recorded for one request, as ``adaptor.events`` objects."""
    return list(Client(home).events(request_id))


def tool_round_trip(
    home: Path, request_id: str
) -> tuple[ToolCall, dict[str, Any], ToolResult, str]:
    """From the audit log: the first tool call, its arguments (whole at the start, or streamed
    as ``args_delta`` pieces), its result (recorded after it) and the assistant text."""
    events = request_events(home, request_id)
    call = next(e for e in events if isinstance(e, ToolCall) and e.phase == "start")
    pieces = [e.args_delta for e in events if isinstance(e, ToolCall) and e.id == call.id]
    args = call.args if call.args is not None else orjson.loads("".join(pieces))
    output = next(e for e in events if isinstance(e, ToolResult) and e.id == call.id)
    assert events.index(call) < events.index(output)
    text = "".join(e.text for e in events if isinstance(e, TextDelta) and e.phase == "content")
    return call, args, output, text


def spawned_group(home: Path, request_id: str) -> int:
    """The process group of the request's CLI (its first process leads a group of its own)."""

    def find() -> int | None:
        for event in request_events(home, request_id):
            if isinstance(event, ProcessInfo) and event.kind == "spawn":
                return int(event.data["pid"])
        return None

    return wait_until(find, f"the CLI spawn of {request_id}")


def processes_under(root: Path) -> list[int]:
    """Live processes whose working directory or environment mentions ``root`` (the test's
    tmp_path: the workspace and the isolated HOME live there, and nothing else uses it)."""
    marker = str(root)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = Path("/proc") / entry
        try:
            stat_line = (proc / "stat").read_bytes()
            if stat_line[stat_line.rfind(b")") + 2 :].split()[0] == b"Z":
                continue  # exited, only waiting to be reaped
            cwd = os.readlink(proc / "cwd")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if cwd.startswith(marker) or marker.encode() in environ:
            found.append(int(entry))
    return found


def assert_nothing_left(root: Path, pgid: int) -> None:
    """No member of the CLI's process group and no other process of this test survives."""

    def left() -> list[int]:
        return sorted(set(group_members(pgid)) | set(processes_under(root)))

    try:
        wait_until(lambda: True if not left() else None, "the CLI's processes to end", timeout=15)
    except AssertionError:
        described = {pid: cmdline(pid) for pid in left()}
        raise AssertionError(f"processes left behind: {described}") from None


def spawn_argvs(records: list[dict[str, Any]]) -> list[list[str]]:
    """The argv of every process.spawn the thread's audit log recorded."""
    argvs = []
    for record in records:
        event = record.get("event") or {}
        if event.get("kind") == "process.spawn":
            argvs.append([str(a) for a in event["data"]["argv"]])
    return argvs


def adaptor_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adaptor", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )


def pending_approval(home: Path, request_id: str) -> dict[str, Any]:
    pending = _home.Home.at(home).approvals_pending

    def find() -> dict[str, Any] | None:
        for path in sorted(pending.glob("*.json")) if pending.exists() else []:
            try:
                obj = orjson.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # being written or already answered
            if isinstance(obj, dict) and obj.get("request_id") == request_id:
                return obj
        return None

    return wait_until(find, f"a pending approval of {request_id}")


# --- claude -------------------------------------------------------------------------------------


def test_claude_text_through_the_daemon(
    daemon: DaemonProcess, home: Path, claude_request: Callable[..., dict[str, Any]]
) -> None:
    verdict, result = run_ok(home, claude_request("say hello"))
    assert result.text == "Hello from the mock Anthropic server."
    assert verdict["exit_code"] == 0
    assert (result.provider, result.model) == ("anthropic", "claude-opus-5-5")
    assert result.usage is not None and result.usage.input_tokens == 12


def test_claude_thread_resumes_across_a_daemon_restart(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    key = "real/claude/restart"
    _, first = run_ok(home, claude_request("first question", thread={"key": key}))
    session = first.metadata["session_id"]
    assert daemon.stop() == 0

    restarted = DaemonProcess(home, env=QUIET_CLAUDE).start()
    try:
        _, second = run_ok(
            home, claude_request("second question", thread={"key": key, "resume_only": True})
        )
    finally:
        restarted.stop()
    assert second.metadata["session_id"] == session
    assert second.metadata["process"] == "spawned"
    argvs = [a for a in spawn_argvs(thread_log(home, key)) if "--resume" in a]
    assert argvs and argvs[-1][argvs[-1].index("--resume") + 1] == session
    # The second request carried the first turn's history.
    sent = anthropic.messages()
    assert len(sent[-1]["messages"]) > len(sent[0]["messages"])


@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
def test_claude_process_reused_across_thread_turns_through_the_daemon(
    stop: str,
    daemon: DaemonProcess,
    home: Path,
    tmp_path: Path,
    anthropic: AnthropicMock,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    key = "real/claude/reuse"
    _, first = run_ok(home, claude_request("first question", thread={"key": key}))
    _, second = run_ok(home, claude_request("second question", thread={"key": key}))
    # Two requests, one CLI process: the second turn went to the process the first one kept.
    assert (first.metadata["process"], second.metadata["process"]) == ("spawned", "reused")
    assert first.metadata["pid"] == second.metadata["pid"]
    assert len(anthropic.messages()[-1]["messages"]) > len(anthropic.messages()[0]["messages"])
    pid = int(second.metadata["pid"])
    assert pid in processes_under(tmp_path)  # kept between the turns
    # The kept process's private folder (for its MCP config, its system prompt) is in the home.
    private = home / "tmp"
    kept = sorted(private.glob("adaptor-private-claude-*"))
    assert len(kept) == 1, kept
    if stop == "sigterm":
        assert daemon.stop() == 0  # the drain stops kept processes, and removes their folders
    else:
        daemon.kill9()  # the kept CLI reads EOF on its stdin and exits by itself
        assert kept[0].is_dir()  # nobody left to remove it...
        restarted = DaemonProcess(home, env=QUIET_CLAUDE).start()  # ...but the next start
        assert restarted.stop() == 0
    assert list(private.iterdir()) == []
    assert_nothing_left(tmp_path, pid)


def test_claude_turn_never_goes_to_a_process_that_missed_the_previous_one(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    # A rotated API key leaves the thread compatible but makes another kept Agent (and claude
    # process pool): its second turn ran in a new process, and the third, with the first key
    # again, went to the first turn's process, whose conversation lacked the second turn.
    key = "real/claude/rotated"

    def turn(prompt: str, api_key: str) -> adaptor.Result:
        request = claude_request(prompt, thread={"key": key})
        request["config"]["env"]["ANTHROPIC_API_KEY"] = api_key
        return run_ok(home, request)[1]

    first = turn("first question", "sk-ant-mock-key")
    second = turn("second question", "sk-ant-rotated-key")
    third = turn("third question", "sk-ant-mock-key")
    assert first.metadata["session_id"] == second.metadata["session_id"] == third.metadata["session_id"]
    assert third.metadata["process"] == "spawned"
    assert "second question" in orjson.dumps(anthropic.messages()[-1]["messages"]).decode()


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_claude_permission_answered_through_the_cli(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    workspace: str,
    claude_request: Callable[..., dict[str, Any]],
    answer: str,
) -> None:
    target = os.path.join(workspace, "perm.txt")
    anthropic.configure(
        tool=("Bash", {"command": f"touch {target}", "description": "Create perm.txt"})
    )
    request = claude_request(
        "please create perm.txt", policy={"approvals": {"permission": "ask", "timeout": 60}}
    )
    client = Client(home)
    request_id = client.submit(request)
    approval = pending_approval(home, request_id)
    assert (approval["approval_kind"], approval["source"], approval["title"]) == (
        "permission",
        "claude.bash",
        "Create perm.txt",
    )
    if answer == "approve":
        answered = adaptor_cli(home, "approve", approval["id"])
    else:
        answered = adaptor_cli(home, "deny", approval["id"], "--reason", "no")
    assert answered.returncode == 0, answered.stderr
    verdict = daemon.verdict(request_id, timeout=TIMEOUT)
    if answer == "approve":
        assert verdict["ok"] is True, verdict
        assert os.path.exists(target)
        assert client.wait(request_id).text == "Tool result was: (Bash completed with no output)"
    else:
        failed_verdict(verdict, adaptor.ApprovalDeniedError, "ErrApprovalDenied", 1)
        assert not os.path.exists(target)


def test_claude_tool_call_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    workspace: str,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    target = os.path.join(workspace, "hello.txt")
    anthropic.configure(tool=("Write", {"file_path": target, "content": "hi\n"}))
    request = claude_request("write hello.txt", config={"permission_mode": "acceptEdits"})
    verdict, result = run_ok(home, request)
    assert Path(target).read_text() == "hi\n"
    assert verdict["result"]["text"].startswith("Tool result was: File created successfully")
    call, args, output, text = tool_round_trip(home, verdict["id"])
    assert call.name == "Write" and args == {"file_path": target, "content": "hi\n"}
    assert not output.is_error and text == result.text
    kinds = [i.kind for i in result.transcript()]
    assert kinds.index("tool_call") < kinds.index("tool_result") < kinds.index("assistant")


def test_a_hostile_claude_answer_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    # Terminal escapes, NUL, "\r", a lone surrogate and lines that look like our own records:
    # the answer arrives as the model gave it (the surrogate as U+FFFD), every record stays
    # one JSON line, and `adaptor events` shows the escapes escaped.  The lone surrogate made
    # claude's result line unparsable: the run waited for its deadline.
    fake = ('{"type":"result","subtype":"success","is_error":false,"result":"FAKE"}\n'
            '{"v":1,"meta":{},"event":{"kind":"run.finished"}} <redacted>')
    anthropic.configure(text=f"a\x1b[2J\x1b]0;title\x07 b\rc\x00d \ud800\n{fake}")
    verdict, result = run_ok(home, claude_request("say something hostile", timeout=90))
    assert result.text == f"a\x1b[2J\x1b]0;title\x07 b\rc\x00d \ufffd\n{fake}"
    for path in _home.Home.at(home).events.glob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            orjson.loads(line)  # what `tail -f | jq` needs
    shown = adaptor_cli(home, "events", verdict["id"])
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\r" not in shown.stdout
    assert "\\x1b[2J\\x1b]0;title\\x07 b\\rc\\x00d" in shown.stdout


def test_claude_unreachable_server_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    tmp_path: Path,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    request = claude_request("say hello", base_url=f"http://127.0.0.1:{closed_port()}")
    verdict, error = run_failed(home, request, adaptor.AgentFailedError, "ErrAgentFailed")
    assert error.details["kind"] == "provider_unavailable" and error.details["retryable"] is True
    assert_nothing_left(tmp_path, spawned_group(home, verdict["id"]))


# --- codex --------------------------------------------------------------------------------------


def test_codex_text_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    openai: OpenAIMock,
    codex_request: Callable[..., dict[str, Any]],
) -> None:
    verdict, result = run_ok(home, codex_request("say hello"))
    assert result.text == "Hello from the mock OpenAI server."
    assert verdict["exit_code"] == 0
    assert (result.provider, result.model) == ("openai", "gpt-5.5")
    assert openai.logged("/v1/responses")[0]["headers"]["authorization"] == "Bearer mock-key"


def test_codex_thread_resumes_across_a_daemon_restart(
    daemon: DaemonProcess,
    home: Path,
    openai: OpenAIMock,
    codex_request: Callable[..., dict[str, Any]],
) -> None:
    key = "real/codex/restart"
    _, first = run_ok(home, codex_request("first", thread={"key": key}))
    thread_id = first.metadata["thread_id"]
    assert daemon.stop() == 0

    restarted = DaemonProcess(home, env=QUIET_CLAUDE).start()
    try:
        _, second = run_ok(home, codex_request("second", thread={"key": key, "resume_only": True}))
    finally:
        restarted.stop()
    assert second.metadata["thread_id"] == thread_id
    first_input, second_input = (len(b["input"]) for b in openai.responses())
    assert second_input > first_input  # the history went along


def test_codex_tool_call_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    openai: OpenAIMock,
    codex_request: Callable[..., dict[str, Any]],
) -> None:
    openai.configure(shell="echo hi")
    request = codex_request(
        "run echo hi", policy={"sandbox": "read_only", "web_search": "deny"}
    )
    verdict, result = run_ok(home, request)
    # The mock echoes what codex sent back to the model: the command's output in a frame.
    final = verdict["result"]["text"]
    assert final.startswith("Tool output was: ") and final.endswith("Output:\nhi\n")
    call, args, output, text = tool_round_trip(home, verdict["id"])
    assert call.name == "shell" and "echo hi" in args["command"]
    assert not output.is_error and text == final
    transcript_output = next(i for i in result.transcript() if i.kind == "tool_result")
    assert transcript_output.text == "hi\n"
    sent = openai.logged("/v1/responses")[0]
    assert '"sandbox_mode":"read-only"' in sent["headers"]["x-codex-turn-metadata"].replace(" ", "")
    assert "web_search" not in {t.get("name") or t.get("type") for t in sent["body"]["tools"]}


def test_codex_unreachable_server_ends_with_the_request_timeout(
    daemon: DaemonProcess,
    home: Path,
    tmp_path: Path,
    codex_request: Callable[..., dict[str, Any]],
) -> None:
    # codex retries an unreachable provider forever: only the run timeout ends it.
    request = codex_request(
        "say hello",
        base_url=f"http://127.0.0.1:{closed_port()}/v1",
        config={"grace_period": 1.0},
        timeout=4,
    )
    verdict, error = run_failed(
        home, request, adaptor.RunDeadlineExceededError, "ErrDeadlineExceeded"
    )
    assert error.result is not None
    assert "network" in error.result.metadata.get("last_error", "")
    assert_nothing_left(tmp_path, spawned_group(home, verdict["id"]))


# --- both CLIs -----------------------------------------------------------------------------------


@dataclasses.dataclass
class RealCLI:
    """What the shared tests need to know about one CLI and its mock model server."""

    name: str
    request: Callable[..., dict[str, Any]]
    mock: AnthropicMock | OpenAIMock
    text: str  # the mock's default answer
    sessions: str  # glob, under tmp_path, of the files where the CLI keeps its conversations
    resume_refusal: str  # what the CLI says about a conversation it lost

    def model_requests(self) -> list[dict[str, Any]]:
        if isinstance(self.mock, AnthropicMock):
            return self.mock.messages()
        return self.mock.responses()


@pytest.fixture(params=["claude", "codex"])
def cli(request: pytest.FixtureRequest) -> RealCLI:
    if request.param == "claude":
        return RealCLI(
            "claude",
            request.getfixturevalue("claude_request"),
            request.getfixturevalue("anthropic"),
            "Hello from the mock Anthropic server.",
            "claude-profile/projects/*/*.jsonl",
            "No conversation found",
        )
    return RealCLI(
        "codex",
        request.getfixturevalue("codex_request"),
        request.getfixturevalue("openai"),
        "Hello from the mock OpenAI server.",
        "codex-home/sessions/**/rollout-*.jsonl",
        "no rollout found",
    )


def test_native_structured_output_through_the_daemon(
    daemon: DaemonProcess, home: Path, cli: RealCLI
) -> None:
    cli.mock.configure(structured={"name": "mock", "count": 3})
    verdict, result = run_ok(home, cli.request("give me structured data", schema=ITEM_SCHEMA))
    structured = verdict["result"]["structured"]
    assert (structured["source"], structured["valid"]) == ("native", True)
    assert structured["value"] == {"name": "mock", "count": 3}
    assert result.decode() == {"name": "mock", "count": 3}

    cli.mock.configure(structured={"name": 5})
    invalid = cli.request("give me structured data", schema=ITEM_SCHEMA)
    verdict, _ = run_failed(home, invalid, adaptor.PolicyViolationError, "ErrPolicyViolation")
    assert verdict["result"]["structured"]["valid"] is False


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [(401, "auth", False), (429, "rate_limit", True), (500, "provider_unavailable", True)],
)
def test_http_error_through_the_daemon(
    daemon: DaemonProcess, home: Path, cli: RealCLI, status: int, kind: str, retryable: bool
) -> None:
    cli.mock.configure(status=status)
    verdict, error = run_failed(
        home, cli.request("say hello"), adaptor.AgentFailedError, "ErrAgentFailed"
    )
    assert error.details["kind"] == kind and error.details["retryable"] is retryable
    # codex words a 5xx as "currently experiencing high demand", without the status.
    if not (cli.name == "codex" and status >= 500):
        assert error.details.get("provider_status") == status
        assert str(status) in verdict["error"]["message"]


def test_bad_resume_id_through_the_daemon(
    daemon: DaemonProcess, home: Path, tmp_path: Path, cli: RealCLI
) -> None:
    key = f"real/{cli.name}/lost"
    run_ok(home, cli.request("first", thread={"key": key}))
    stored = glob.glob(str(tmp_path / cli.sessions), recursive=True)
    assert stored, f"{cli.name} keeps its conversations in {cli.sessions}"
    for path in stored:
        os.remove(path)  # the provider lost the conversation
    # A restart, so that no claude process kept from the first turn still holds it in memory.
    assert daemon.stop() == 0
    restarted = DaemonProcess(home, env=QUIET_CLAUDE).start()
    try:
        lost = cli.request("again", thread={"key": key, "resume_only": True})
        _, error = run_failed(home, lost, adaptor.ResumeRejectedError, "ErrResumeRejected", 4)
        assert cli.resume_refusal in error.reason

        # Continue-or-start (no resume_only) falls back to a fresh conversation and says so.
        _, result = run_ok(home, cli.request("again", thread={"key": key}))
        assert result.text == cli.text
    finally:
        restarted.stop()
    notices = [r["event"] for r in thread_log(home, key) if r["event"]["kind"] == "notice.lifecycle"]
    assert any(n["data"].get("phase") == "thread.resume_rejected" for n in notices), notices


def test_cancel_mid_run_through_the_cli(
    daemon: DaemonProcess, home: Path, tmp_path: Path, cli: RealCLI
) -> None:
    cli.mock.configure(delay=60.0)
    client = Client(home)
    request_id = client.submit(cli.request("say hello slowly"))
    pgid = spawned_group(home, request_id)
    wait_until(lambda: cli.model_requests() or None, "the model request in flight")
    # The /proc scan sees the CLI (so an empty scan afterwards means something).
    assert group_members(pgid) and set(group_members(pgid)) <= set(processes_under(tmp_path))
    if cli.name == "codex":
        assert len(group_members(pgid)) >= 2  # the node launcher and the real codex binary

    cancelled = adaptor_cli(home, "cancel", request_id)
    assert cancelled.returncode == 0, cancelled.stderr
    verdict = daemon.verdict(request_id, timeout=TIMEOUT)
    failed_verdict(verdict, adaptor.RunCancelledError, "ErrRunCancelled", 1)
    with pytest.raises(adaptor.RunCancelledError):
        client.wait(request_id)
    assert_nothing_left(tmp_path, pgid)


# --- short env values are configuration, not secrets --------------------------------------------


def test_short_env_values_do_not_corrupt_the_run_log(
    daemon: DaemonProcess, home: Path, claude_request: Callable[..., dict[str, Any]]
) -> None:
    request = claude_request("say hello")
    request["config"]["env"].update(QUIET_CLAUDE)  # "0" and "1" values, as test_real_clis uses
    _, result = run_ok(home, request)
    assert result.text == "Hello from the mock Anthropic server."

"""The real ``claude`` and ``codex`` binaries driven end to end through a running ``adaptord``.

Marked slow; skipped with a visible reason when the pinned CLIs are not installed
(``.ci/install-clis.sh``).  Requests go through the spool of a real ``adaptord serve``
subprocess (``tests/daemon_harness.py``), with the same isolated environment as
``test_real_clis.py``: per-test HOME, CLAUDE_CONFIG_DIR and CODEX_HOME, the mock model servers
on 127.0.0.1, and the variables that stop all outside traffic.
"""

from __future__ import annotations

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
from adaptor.spool import Client
from tests.daemon_harness import DaemonProcess
from tests.drivers.conftest import QUIET_CLAUDE
from tests.drivers.mock_anthropic import AnthropicMock
from tests.drivers.mock_openai import OpenAIMock

pytestmark = pytest.mark.slow

TIMEOUT = 120.0
T = TypeVar("T")


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
    started.kill_if_running()


@pytest.fixture
def claude_request(
    claude_bin: str,
    anthropic: AnthropicMock,
    isolated_home: dict[str, str],
    tmp_path: Path,
    workspace: str,
) -> Callable[..., dict[str, Any]]:
    """A daemon request for the real claude against the Anthropic mock."""

    def make(prompt: str, **fields: Any) -> dict[str, Any]:
        # QUIET_CLAUDE's "0"/"1" values go in the daemon's own environment (the CLI inherits
        # it): the daemon redacts every config.env value as a secret, by substring, from
        # everything it records (see test_short_env_values_corrupt_the_run_log).
        env = {
            **isolated_home,
            "ANTHROPIC_API_KEY": "sk-ant-mock-key",
            "ANTHROPIC_BASE_URL": anthropic.url,
        }
        config = {"command": claude_bin, "env": env, "config_dir": str(tmp_path / "claude-profile")}
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

    def make(prompt: str, **fields: Any) -> dict[str, Any]:
        provider = (
            f'model_providers.mock={{name="mock",base_url="{openai.base_url}",'
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


def run_failed(home: Path, request: dict[str, Any]) -> tuple[dict[str, Any], BaseException]:
    client = Client(home)
    request_id = client.submit(request)
    with pytest.raises(adaptor.AdaptorError):
        client.wait(request_id, timeout=TIMEOUT)
    verdict = client.verdict(request_id)
    assert verdict is not None and verdict["ok"] is False, verdict
    return verdict, errors.from_wire(verdict["error"])


def thread_log(home: Path, key: str) -> list[dict[str, Any]]:
    path = _home.Home.at(home).events / f"{_home.session_for_thread(key)}.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


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
        assert verdict["ok"] is False, verdict
        assert verdict["error"]["code"] == "ErrApprovalDenied"
        assert verdict["exit_code"] == 1
        assert isinstance(errors.from_wire(verdict["error"]), adaptor.ApprovalDeniedError)
        assert not os.path.exists(target)


def test_claude_401_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    anthropic: AnthropicMock,
    claude_request: Callable[..., dict[str, Any]],
) -> None:
    anthropic.configure(status=401)
    verdict, error = run_failed(home, claude_request("say hello"))
    assert verdict["error"]["code"] == "ErrAgentFailed"
    assert isinstance(error, adaptor.AgentFailedError)
    assert error.details["kind"] == "auth" and error.details["retryable"] is False


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


def test_codex_401_through_the_daemon(
    daemon: DaemonProcess,
    home: Path,
    openai: OpenAIMock,
    codex_request: Callable[..., dict[str, Any]],
) -> None:
    openai.configure(status=401)
    verdict, error = run_failed(home, codex_request("say hello"))
    assert verdict["error"]["code"] == "ErrAgentFailed"
    assert isinstance(error, adaptor.AgentFailedError)
    assert error.details["kind"] == "auth" and error.details["retryable"] is False


# --- short env values are configuration, not secrets --------------------------------------------


def test_short_env_values_do_not_corrupt_the_run_log(
    daemon: DaemonProcess, home: Path, claude_request: Callable[..., dict[str, Any]]
) -> None:
    request = claude_request("say hello")
    request["config"]["env"].update(QUIET_CLAUDE)  # "0" and "1" values, as test_real_clis uses
    _, result = run_ok(home, request)
    assert result.text == "Hello from the mock Anthropic server."

"""Host tools, skills and MCP declarations through a real ``adaptord serve``.

The daemon loads its tools from the config file (``[tools] add = "tests.host_tools:add"``) and a
request selects them by name; the script driver's ``call_tool`` step calls the tool gateway with
the official MCP client, and, when the pinned binary is installed, the real ``claude`` does the
same against the mock Anthropic server.  Refusals keep the SDK's own error identities.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adaptor import events
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess
from tests.host_tools import REJECTION

pytestmark = pytest.mark.slow

pytest.importorskip("mcp", reason="host tools are served over MCP (the mcp extra)")

REPO = Path(__file__).resolve().parent.parent
SECRET = "sk-mcp-header-Zq8Y3vW1secretvalue"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    from tests.drivers.conftest import QUIET_CLAUDE

    config = tmp_path / "config.toml"
    config.write_text('[tools]\nadd = "tests.host_tools:add"\n'
                      'undescribed = "tests.host_tools:undescribed"\n'
                      'explodes = "tests.host_tools:explodes"\n')
    # The config names a test module: the daemon must import it like the test process does.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    # claude's quiet settings come from the daemon's environment, as a deployment sets them.
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "5",
                         env={"PYTHONPATH": path, **QUIET_CLAUDE}).start()
    yield proc
    assert proc.stop() == 0


def audit(daemon: DaemonProcess, request_id: str) -> list[events.Event]:
    backend = sr.JSONLEventBackend(daemon.home.events)
    return [r.event for r in sr.EventRecorder(backend, key_validator=lambda k: None).since(request_id)]


def test_a_request_selects_a_configured_tool_by_name(daemon: DaemonProcess) -> None:
    rid = daemon.submit({
        "driver": "script", "prompt": "add", "tools": ["add"],
        "config": {"steps": [
            {"call_tool": {"name": "add", "args": {"a": 2, "b": 3}}},
            {"call_tool": {"name": "add", "args": {"a": -1, "b": 0}}},
            {"call_tool": {"name": "add", "args": {"a": "SECRET-ARG", "b": 0}}},
            {"text": "done"},
        ]},
    })
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["text"] == "done"
    recorded = audit(daemon, rid)
    spawn = next(e for e in recorded if isinstance(e, events.ProcessInfo) and e.kind == "spawn")
    assert spawn.data["tools"] == ["add"] and spawn.data["mcp"] == ["adaptor"]
    assert any(name.startswith("ADAPTOR_TOOLS_TOKEN_") for name in spawn.data["env"])
    results = [e for e in recorded if isinstance(e, events.ToolResult)]
    assert [(r.result, r.is_error) for r in results[:2]] == [
        ('{"total":5}', False), (REJECTION, True),
    ]
    assert results[2].is_error and "wrong type" in results[2].result
    assert "SECRET-ARG" not in results[2].result  # the safe message echoes no values
    calls = [e for e in recorded if isinstance(e, events.ToolCall) and e.phase == "start"]
    assert [c.name for c in calls] == ["mcp__adaptor__add"] * 3


def test_a_tool_that_raises_is_one_line_of_the_daemons_log(daemon: DaemonProcess) -> None:
    # Its traceback reached stderr through logging's last-resort handler: a dozen lines
    # without the "adaptord: " prefix, one of them the exception's second line.
    rid = daemon.submit({
        "driver": "script", "prompt": "x", "tools": ["explodes"],
        "config": {"steps": [{"call_tool": {"name": "explodes", "args": {"a": 1, "b": 2}}}, {"text": "done"}]},
    })
    assert daemon.verdict(rid)["ok"]
    line = daemon.wait_for_line("library_log")
    assert "logger=adaptor.tool" in line and "error=RuntimeError" in line and "'explodes'" in line, line
    daemon.wait_for_line(f"verdict.written id={rid}")
    assert all(text.startswith("adaptord: ") for text in daemon.lines), daemon.lines
    assert not any("second line" in text or "Traceback" in text for text in daemon.lines)


def test_an_unknown_tool_name_is_an_invalid_request(daemon: DaemonProcess) -> None:
    verdict = daemon.verdict(daemon.submit({"driver": "script", "prompt": "x", "tools": ["nope"]}))
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest"
    assert verdict["error"]["fields"]["errors"] == [
        {"path": "/tools/0", "message": "no host tool 'nope' in the daemon config"}
    ]


@pytest.mark.parametrize(
    ("fields", "code", "exit_code"),
    [
        ({"skills": [{"dir": 5}]}, "ErrInvalidRequest", 2),
        ({"skills": [{"key": "k", "inline": "x", "dir": "/x"}]}, "ErrInvalidRequest", 2),
        ({"skills": [{"key": ""}]}, "ErrSkillKeyMissing", 3),
        ({"skills": [{"key": "not-in-any-catalogue"}]}, "ErrSkillNotFound", 3),
        ({"skills": [{"key": "k", "inline": "one"}, {"key": "k", "inline": "two"}]},
         "ErrSkillKeyConflict", 3),
        ({"skills": [{"dir": "/nonexistent/adaptor-skill"}]}, "ErrSkillMaterializationFailed", 3),
        ({"mcp": ["not an object"]}, "ErrInvalidRequest", 2),  # the request schema's check
        ({"mcp": [{"key": "x", "transport": "stdio", "command": "c", "colour": "red"}]},
         "ErrInvalidMCPConfig", 3),
        ({"mcp": [{"key": "adaptor", "transport": "stdio", "command": "c"}]},
         "ErrInvalidMCPConfig", 3),
        ({"mcp": [{"key": "x", "transport": "stdio", "command": "c"}],
          "config": {"descriptor": {"mcp": {"supported": False}}}}, "ErrMCPUnsupported", 3),
        ({"mcp": [{"key": "x", "transport": "sse", "url": "http://127.0.0.1:9/sse"}],
          "config": {"descriptor": {"mcp": {"sse": False}}}}, "ErrMCPTransportUnsupported", 3),
        ({"tools": ["add"], "config": {"descriptor": {"mcp": {"supported": False}}}},
         "ErrMCPUnsupported", 3),
        ({"tools": ["undescribed"]}, "tool.ErrInvalidDefinition", 3),
    ],
)
def test_refusals_keep_the_sdk_identities(
    daemon: DaemonProcess, fields: dict[str, Any], code: str, exit_code: int
) -> None:
    request = {"driver": "script", "prompt": "x", "config": {"steps": [{"text": "ran"}]}}
    request.update(fields)
    request["config"] = {"steps": [{"text": "ran"}], **fields.get("config", {})}
    verdict = daemon.verdict(daemon.submit(request))
    assert verdict["error"] is not None and verdict["error"]["code"] == code, verdict["error"]
    assert verdict["exit_code"] == exit_code and verdict["result"] is None


def test_mcp_secrets_are_redacted_everywhere(daemon: DaemonProcess) -> None:
    rid = daemon.submit({
        "driver": "script", "prompt": "x", "config": {"steps": [{"text": "ran"}]},
        "mcp": [{"key": "remote", "transport": "http", "url": "http://127.0.0.1:9/mcp",
                 "headers": {"X-Api-Key": SECRET}},
                {"key": "local", "transport": "stdio", "command": "srv", "env": {"TOKEN": SECRET}}],
    })
    verdict = daemon.verdict(rid)
    assert verdict["ok"], verdict["error"]
    spawn = next(e for e in audit(daemon, rid) if isinstance(e, events.ProcessInfo))
    assert spawn.data["mcp"] == ["local", "remote"]
    assert daemon.stop() == 0
    assert daemon.files_holding(SECRET) == []
    kept = orjson.loads((daemon.home.run_dir(rid) / "request.json").read_bytes())
    assert kept["mcp"][0]["headers"] == {"X-Api-Key": "<redacted>"}


def test_claude_calls_a_configured_tool(daemon: DaemonProcess, tmp_path: Path) -> None:
    from tests.drivers.conftest import CLAUDE_VERSION, _find_cli
    from tests.drivers.mock_anthropic import AnthropicMock
    from tests.drivers.mock_tools import anthropic_tool_results

    binary = _find_cli("ADAPTOR_CLAUDE_BIN", f"claude-code-{CLAUDE_VERSION}", "claude")
    if binary is None:
        pytest.skip(f"claude {CLAUDE_VERSION} not installed: run .ci/install-clis.sh")
    workspace = tmp_path / "work"
    workspace.mkdir()
    with AnthropicMock() as mock:
        mock.configure(tool=("mcp__adaptor__add", {"a": 20, "b": 22}))
        env = {"HOME": str(tmp_path), "ANTHROPIC_API_KEY": "sk-ant-mock-key",
               "ANTHROPIC_BASE_URL": mock.url}
        rid = daemon.submit({
            "driver": "claude", "prompt": "add 20 and 22", "tools": ["add"],
            "workspace": str(workspace),
            "config": {"command": binary, "env": env, "config_dir": str(tmp_path / "profile")},
        })
        verdict = daemon.verdict(rid, timeout=120)
        sent = mock.messages()
    assert verdict["ok"], verdict["error"]
    assert verdict["result"]["text"] == 'Tool result was: {"total":42}'
    assert anthropic_tool_results(sent[-1]["messages"]) == [('{"total":42}', False)]
    recorded = audit(daemon, rid)
    call = next(e for e in recorded if isinstance(e, events.ToolCall) and e.phase == "start")
    results = [e for e in recorded if isinstance(e, events.ToolResult)]
    assert call.name == "mcp__adaptor__add"
    assert [(r.id, r.result, r.is_error) for r in results] == [(call.id, '{"total":42}', False)]


def test_check_reports_a_tool_entry_that_is_no_tool_and_serve_warns(daemon: DaemonProcess, tmp_path: Path) -> None:
    # `adaptord check` said "config: ok" for a [tools] entry every request selecting it fails
    # with (a definition without a description, a plain function): it reports each, exit 2.
    config = tmp_path / "check.toml"
    config.write_text('[tools]\nadd = "tests.host_tools:add"\n'
                      'undescribed = "tests.host_tools:undescribed"\n'
                      'plain = "os.path:join"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    checked = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert checked.returncode == 2, checked.stdout
    lines = checked.stdout.splitlines()
    assert any(line.startswith("tools.undescribed: not a valid tool: ") for line in lines), lines
    assert any(line.startswith("tools.plain: not a valid tool: it is a function") for line in lines), lines
    assert not any(line.startswith("tools.add:") for line in lines), lines
    # The daemon serving the fixture's config (with `undescribed`) said so at its start.
    assert any("not a valid tool" in line and "tool=undescribed" in line for line in daemon.lines), daemon.lines


def test_keys_serving_one_tool_name_are_noted_by_check_and_serve(tmp_path: Path) -> None:
    # Two [tools] keys whose definitions share a name were "config: ok", silently: a request
    # selecting both failed with "two tools are named 'add'" (exit 3).
    config = tmp_path / "aliases.toml"
    config.write_text('[tools]\nadd = "tests.host_tools:add"\nplus = "tests.host_tools:add"\n')
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    checked = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )
    assert "tools.add, tools.plus: all serve the tool 'add': a request may select only one of them" in checked.stdout
    assert checked.stdout.startswith("config: ok"), checked.stdout  # each key alone works
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), env=env).start()
    try:
        assert any("tools serving one tool name" in line and "name=add tools=add,plus" in line for line in proc.lines), proc.lines
        one = proc.submit({"driver": "script", "prompt": "x", "config": {"steps": [{"text": "t"}]}, "tools": ["plus"]})
        assert proc.verdict(one)["ok"] is True
        both = proc.submit({"driver": "script", "prompt": "x", "config": {"steps": [{"text": "t"}]}, "tools": ["add", "plus"]})
        assert "two tools are named 'add'" in proc.verdict(both)["error"]["message"]
    finally:
        assert proc.stop() == 0


def test_check_reports_tools_the_missing_mcp_extra_cannot_serve(tmp_path: Path) -> None:
    # Without the MCP SDK `adaptord check` said "config: ok", and every request selecting a
    # configured tool then failed (exit 3).
    config = tmp_path / "check.toml"
    config.write_text('[tools]\nadd = "tests.host_tools:add"\n')
    program = (
        "import sys\n"
        "sys.modules['mcp'] = None\n"  # what a venv without the mcp extra has
        "from adaptord.cli import main\n"
        f"sys.argv = ['adaptord', 'check', '--config', {str(config)!r}]\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    checked = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert "tools.add: not a valid tool: host-defined tools need the MCP SDK, the mcp extra" in checked.stdout
    # What to install, by names that fetch it: 'adaptor[mcp]' on the index is another project.
    assert "pip install 'mcp>=2,<3'" in checked.stdout and "adaptor[" not in checked.stdout


_VERSIONED_TOOL = '''
from adaptor import tool

ver = tool.define("ver", "Which code answers", lambda args: {{"ver": "{version}"}},
                  input={{"type": "object"}}, read_only=True)
'''


def test_a_reload_imports_a_changed_tool_module_afresh_and_refuses_a_broken_one(tmp_path: Path) -> None:
    # The reload kept the module imported at start: the old code answered, and a module that
    # no longer imported was "config reloaded", then refused by the next start (exit 2).
    library = tmp_path / "pylib"
    library.mkdir()
    module = library / "versioned_tools.py"
    config = tmp_path / "config.toml"
    config.write_text('[tools]\nver = "versioned_tools:ver"\n')

    def write(text: str, age: int) -> None:
        module.write_text(text)
        stamp = module.stat().st_mtime + age  # another second: the bytecode cache compares seconds
        os.utime(module, (stamp, stamp))

    write(_VERSIONED_TOOL.format(version="v1"), 0)
    proc = DaemonProcess(tmp_path / "home", "--config", str(config), env={"PYTHONPATH": str(library)}).start()

    def answer() -> str:
        rid = proc.submit({"driver": "script", "prompt": "x", "tools": ["ver"],
                           "config": {"steps": [{"call_tool": {"name": "ver", "args": {}}}, {"text": "done"}]}})
        assert proc.verdict(rid)["ok"]
        [result] = [e.result for e in audit(proc, rid) if isinstance(e, events.ToolResult)]
        return str(orjson.loads(result)["ver"])

    try:
        assert answer() == "v1"
        write(_VERSIONED_TOOL.format(version="v2"), 10)
        assert proc.reload(config, config.read_text()).startswith("adaptord: config reloaded")
        assert answer() == "v2"
        write("def broken(:\n", 20)
        failed = proc.reload(config, config.read_text())
        assert failed.startswith("adaptord: config reload failed") and "SyntaxError" in failed, failed
        assert answer() == "v2"  # the old config, and its module, go on
    finally:
        assert proc.stop() == 0


def test_a_thread_a_handler_left_running_does_not_keep_the_stopped_daemon(tmp_path: Path) -> None:
    # Python's exit waits for every non-daemon thread: after "daemon.stopped" the process lived
    # on, deaf to a second SIGTERM, until the handler's thread ended (systemd: killed, failed).
    config = tmp_path / "config.toml"
    config.write_text('[tools]\nlingers = "tests.host_tools:lingers"\n')
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    daemon = DaemonProcess(tmp_path / "home", "--config", str(config), "--grace", "2", env={"PYTHONPATH": path}).start()
    try:
        rid = daemon.submit({
            "driver": "script", "prompt": "add", "tools": ["lingers"],
            "config": {"steps": [{"call_tool": {"name": "lingers", "args": {"a": 2, "b": 3}}}, {"text": "done"}]},
        })
        assert daemon.verdict(rid)["ok"]
    finally:
        assert daemon.stop(timeout=30) == 0, "\n".join(daemon.lines)
    assert "adaptord: exiting without the threads left running threads=left-by-a-handler" in daemon.lines, daemon.lines

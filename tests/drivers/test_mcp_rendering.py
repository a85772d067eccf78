"""How the claude and codex drivers hand MCP servers, host tools and skills to their CLI, seen
from inside the CLI: a fake executable inspects its command line, the files it points at and its
environment while the run is live, then replays a captured transcript."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import mcp, skill
from adaptor.drivers import claude, codex
from tests.drivers.conftest import HERE, TRANSCRIPTS, transcript

SECRET = "s3cret-header-value"
ENV_SECRET = "it's a $ecret"

INSPECT = """
import json, os, stat, sys
sys.path.insert(0, {here!r})
import fake_cli

args = sys.argv[1:]
seen = {{"env": {{k: os.environ.get(k) for k in {env_names!r}}}}}

def mode(path):
    return oct(stat.S_IMODE(os.stat(path).st_mode))

def after(flag):
    return [args[i + 1] for i, a in enumerate(args) if a == flag]

for path in after("--mcp-config"):
    seen["mcp_config"] = {{"path": path, "mode": mode(path), "dir_mode": mode(os.path.dirname(path)),
                          "content": json.load(open(path))}}
for root in after("--add-dir"):
    skills = os.path.join(root, ".claude", "skills")
    seen["skills"] = {{name: open(os.path.join(skills, name, "SKILL.md")).read()
                      for name in sorted(os.listdir(skills))}}
for value in after("-c"):
    if value.startswith("mcp_servers.") and ".args=" in value:
        listed = json.loads(value.split("=", 1)[1])
        if listed[:1] == ["-c"]:  # the env-file wrapper: the file is listed after the script
            seen["env_file"] = {{"path": listed[2], "mode": mode(listed[2]),
                                "content": open(listed[2]).read()}}
with open({seen_path!r}, "w") as handle:
    json.dump(seen, handle)
sys.exit(fake_cli.main({replay!r} + (["--stdin-protocol"] if {protocol!r} else [])))
"""


def inspecting_cli(
    fake_exe: Callable[[str, str], str], tmp_path: Path, capture: str, *, protocol: bool,
    env_names: tuple[str, ...] = (),
) -> tuple[str, Path]:
    seen = tmp_path / f"seen-{capture}.json"
    _, _, code = transcript(capture)
    replay = [str(tmp_path / "record.jsonl"), str(TRANSCRIPTS / f"{capture}.jsonl"),
              str(TRANSCRIPTS / f"{capture}.stderr"), str(code or 0)]
    body = INSPECT.format(here=str(HERE), env_names=list(env_names), seen_path=str(seen),
                          replay=replay, protocol=protocol)
    return fake_exe(f"fake-{capture}", body), seen


def spawn_data(stream: adaptor.Stream) -> dict[str, Any]:
    return next(e.data for e in stream if isinstance(e, adaptor.ProcessInfo) and e.kind == "spawn")


SERVERS = [
    mcp.stdio("mock", "python3", ["server.py"], env={"API_KEY": ENV_SECRET}, required=True),
    mcp.http("remote", "https://mcp.example.com/mcp", headers={"X-Api-Key": SECRET},
             bearer_token_env="REMOTE_TOKEN"),
    mcp.sse("legacy", "https://mcp.example.com/sse"),
]
STYLE = skill.inline("house-style", "---\ndescription: \"Use for prose.\"\n---\nBe terse.\n")


def test_claude_gets_a_private_mcp_config_and_a_skills_dir(
    fake_exe: Callable[[str, str], str], tmp_path: Path
) -> None:
    command, seen = inspecting_cli(fake_exe, tmp_path, "claude-mcp", protocol=True)
    driver = claude.Driver(claude.Config(command=command, config_dir=str(tmp_path / "profile")))
    with adaptor.Agent(driver, workspace=str(tmp_path), mcp=SERVERS, skills=[STYLE]) as agent:
        stream = agent.stream("hello")
        shown = spawn_data(stream)
        result = stream.result()
    assert result.text  # the replay went through
    inside = json.loads(seen.read_text())
    config = inside["mcp_config"]
    assert (config["mode"], config["dir_mode"]) == ("0o600", "0o700")
    assert config["content"] == {"mcpServers": {
        "legacy": {"type": "sse", "url": "https://mcp.example.com/sse"},
        "mock": {"type": "stdio", "command": "python3", "args": ["server.py"],
                 "env": {"API_KEY": ENV_SECRET}},
        "remote": {"type": "http", "url": "https://mcp.example.com/mcp",
                   "headers": {"X-Api-Key": SECRET, "Authorization": "Bearer ${REMOTE_TOKEN}"}},
    }}
    assert not os.path.exists(config["path"])  # removed with the process
    assert inside["skills"] == {"house-style": STYLE.source.skill_md}  # type: ignore[union-attr]
    # No host tools, so nothing is pre-approved; secrets never reach argv or events.
    assert "--allowedTools" not in shown["argv"]
    assert all(secret not in json.dumps(shown) for secret in (SECRET, ENV_SECRET))


def test_claude_fails_a_run_whose_required_server_is_not_connected(
    fake_exe: Callable[[str, str], str], tmp_path: Path
) -> None:
    # claude-text's init lists no MCP server at all.
    command, _ = inspecting_cli(fake_exe, tmp_path, "claude-text", protocol=True)
    driver = claude.Driver(claude.Config(command=command, config_dir=str(tmp_path / "profile")))
    with adaptor.Agent(driver, workspace=str(tmp_path), mcp=SERVERS[:1]) as agent:
        with pytest.raises(adaptor.AgentFailedError) as caught:
            agent.run("hello")
    assert caught.value.details == {"mcp_servers": {"mock": "missing"}}


def test_codex_gets_overrides_an_env_file_and_a_skills_catalogue(
    fake_exe: Callable[[str, str], str], tmp_path: Path
) -> None:
    command, seen = inspecting_cli(fake_exe, tmp_path, "codex-text", protocol=False,
                                   env_names=("ADAPTOR_MCP_HEADER_1", "API_KEY", "ADAPTOR_RUN_MARK"))
    driver = codex.Driver(codex.Config(command=command, home=str(tmp_path / "codex-home")))
    with adaptor.Agent(driver, workspace=str(tmp_path), mcp=SERVERS[:2],
                       skills=[skill.require(STYLE, "house rules")]) as agent:
        stream = agent.stream("hello")
        shown = spawn_data(stream)
        stream.result()
    argv = shown["argv"]
    inside = json.loads(seen.read_text())
    env_file = inside["env_file"]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c" and "mcp_servers." in argv[i + 1]]
    assert overrides == [
        'mcp_servers.mock.command="/bin/sh"',
        'mcp_servers.mock.args=["-c",". \\"$0\\" && exec \\"$@\\"",'
        f'"{env_file["path"]}","python3","server.py"]',
        'mcp_servers.mock.default_tools_approval_mode="approve"',
        "mcp_servers.mock.required=true",
        'mcp_servers.remote.url="https://mcp.example.com/mcp"',
        'mcp_servers.remote.bearer_token_env_var="REMOTE_TOKEN"',
        'mcp_servers.remote.env_http_headers={"X-Api-Key" = "ADAPTOR_MCP_HEADER_1"}',
        'mcp_servers.remote.default_tools_approval_mode="approve"',
    ]
    assert env_file["mode"] == "0o600"
    # The run's mark goes with the server's env: codex starts servers in sessions of their own
    # and with only the variables it names, so nothing else finds one a cancel left running.
    mark = inside["env"].pop("ADAPTOR_RUN_MARK")
    assert env_file["content"] == f"export API_KEY='it'\"'\"'s a $ecret'\nexport ADAPTOR_RUN_MARK={mark}\n"
    assert not os.path.exists(env_file["path"])
    # The header value travels in the environment only; the server's env only in the file.
    assert inside["env"] == {"ADAPTOR_MCP_HEADER_1": SECRET, "API_KEY": None}
    assert all(secret not in json.dumps(shown) for secret in (SECRET, ENV_SECRET))
    assert "developer_instructions=<" in " ".join(argv)  # shown as a placeholder
    record = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    real_argv = next(r["value"] for r in record if r["kind"] == "argv")
    developer = next(a for a in real_argv if a.startswith("developer_instructions="))
    text = json.loads(developer.split("=", 1)[1])
    assert "## Skills for this run" in text
    assert "- house-style: Use for prose. (file: /" in text and text.endswith(
        "/house-style/SKILL.md) Required: house rules")


@pytest.mark.parametrize(
    ("skill_md", "description"),
    [
        ("---\nname: x\ndescription: plain words\n---\nbody", "plain words"),
        ("---\ndescription: 'quoted: yes'\n---\n", "quoted: yes"),
        ("---\ndescription: |\n  line one\n  line two\nname: x\n---\n", "line one line two"),
        ("# Title\n\nFirst paragraph here.\n", "Title"),
        ("---\nname: x\n---\n\nBody line.\n", "Body line."),
        ("", "(no description)"),
        ("---\ndescription: " + "y" * 2000 + "\n---\n", "y" * 1021 + "..."),
        # Saved by a Windows editor, with a byte order mark before the front matter.
        ("\ufeff---\r\ndescription: with a BOM\r\n---\r\nbody", "with a BOM"),
        ("\ufeff# Title\n", "Title"),
        # Front matter never closed.
        ("---\nname: x\ndescription: never closed\n", "never closed"),
        ("---\n\nJust a rule, then text.\n", "Just a rule, then text."),
        ("---\n", "(no description)"),
    ],
)
def test_codex_skill_descriptions(tmp_path: Path, skill_md: str, description: str) -> None:
    path = tmp_path / "SKILL.md"
    path.write_text(skill_md, encoding="utf-8")
    assert codex._skill_description(str(path)) == description

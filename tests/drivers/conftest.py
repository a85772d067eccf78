"""Fixtures for the driver tests: fake executables, the real CLIs, and isolated homes."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor import errors, events
from adaptor.drivers import claude, codex
from tests.drivers.mock_anthropic import AnthropicMock
from tests.drivers.mock_openai import OpenAIMock

HERE = Path(__file__).resolve().parent
TRANSCRIPTS = HERE / "transcripts"
CLI_CACHE = Path(os.environ.get("ADAPTOR_CLI_CACHE") or Path.home() / ".cache" / "adaptor-clis")
CLAUDE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"
INSTALL_HINT = "run .ci/install-clis.sh (needs npm) or set {var}"


def _find_cli(var: str, package_dir: str, binary: str) -> str | None:
    explicit = os.environ.get(var)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidate = CLI_CACHE / package_dir / "node_modules" / ".bin" / binary
    return str(candidate) if os.access(candidate, os.X_OK) else None


@pytest.fixture(scope="session")
def claude_bin() -> str:
    found = _find_cli("ADAPTOR_CLAUDE_BIN", f"claude-code-{CLAUDE_VERSION}", "claude")
    if found is None:
        pytest.skip(f"claude {CLAUDE_VERSION} not installed: "
                    + INSTALL_HINT.format(var="ADAPTOR_CLAUDE_BIN"))
    return found


@pytest.fixture(scope="session")
def codex_bin() -> str:
    found = _find_cli("ADAPTOR_CODEX_BIN", f"codex-{CODEX_VERSION}", "codex")
    if found is None:
        pytest.skip(f"codex {CODEX_VERSION} not installed: "
                    + INSTALL_HINT.format(var="ADAPTOR_CODEX_BIN"))
    return found


def transcript(name: str) -> tuple[bytes, bytes, int | None]:
    """A capture's stdout, stderr and exit status (None: the harness killed it)."""
    exit_text = (TRANSCRIPTS / f"{name}.exit").read_text().strip()
    return (
        (TRANSCRIPTS / f"{name}.jsonl").read_bytes(),
        (TRANSCRIPTS / f"{name}.stderr").read_bytes(),
        int(exit_text) if exit_text.lstrip("-").isdigit() else None,
    )


def put_placeholder(value: object, key: str) -> bool:
    """Replace every object under ``key`` in ``value`` by ``{"deep": "@deep@"}``; whether any."""
    found = False
    if isinstance(value, dict):
        for name, child in value.items():
            if name == key and isinstance(child, dict):
                value[name] = {"deep": "@deep@"}
                found = True
            else:
                found = put_placeholder(child, key) or found
    elif isinstance(value, list):
        for child in value:
            found = put_placeholder(child, key) or found
    return found


def deepened(raw_lines: bytes, key: str, levels: int) -> bytes:
    """``raw_lines`` (JSON lines) with the objects under ``key`` nested ``levels`` deep.

    orjson reads up to 1,024 levels (so ~1,015 here) but writes only 254, and Python's stack
    takes ~330 levels of recursive copying.
    """
    lines = []
    for raw in raw_lines.splitlines():
        line = orjson.loads(raw)
        if put_placeholder(line, key):
            raw = orjson.dumps(line).replace(b'"@deep@"', b"[" * levels + b"]" * levels)
        lines.append(raw)
    return b"\n".join(lines) + b"\n"


def claude_with_deep_input(directory: Path, levels: int, capture: str = "claude-tool-write") -> str:
    """A ``claude`` stand-in (fake_cli.py, stdin protocol) replaying ``capture`` with every tool
    input (tool calls and permission requests) nested ``levels`` deep; returns its path."""
    stdout = directory / f"{capture}-deep.jsonl"
    stdout.write_bytes(deepened((TRANSCRIPTS / f"{capture}.jsonl").read_bytes(), "input", levels))
    args = [str(directory / f"{capture}-record.jsonl"), str(stdout),
            str(TRANSCRIPTS / f"{capture}.stderr"), "0", "--stdin-protocol"]
    exe = directory / f"claude-{capture}-deep"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(HERE)!r})\n"
                   f"import fake_cli\nsys.exit(fake_cli.main({args!r}))\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.fixture
def fake_exe(tmp_path: Path) -> Callable[[str, str], str]:
    """``fake_exe(name, python_body)`` writes an executable Python script and returns its path."""

    def make(name: str, body: str) -> str:
        path = tmp_path / "bin" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    return make


def shown(evs: list[adaptor.Event], error: BaseException | None, result: adaptor.Result | None) -> str:
    """Everything the run handed out, as text: every event, the error and each link of its
    chain (str, repr, attributes, traceback), its wire form, the Result with its raw streams."""
    parts = [orjson.dumps([events.to_json(e) for e in evs]).decode()]
    if error is not None:
        parts += traceback.format_exception(error)
        parts.append(json.dumps(errors.to_wire(error)))
        node: BaseException | None = error
        while node is not None:
            parts += [str(node), repr(node), repr(node.args), repr(vars(node))]
            node = node.__cause__ or node.__context__
        if isinstance(error, errors.RunError) and result is None:
            result = error.result
    if result is not None:
        raw = result.raw()
        parts += [orjson.dumps(result.to_json()).decode(), raw.stdout, raw.stderr, repr(raw.terminal)]
    return "\n".join(parts)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = (Path("/proc") / entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat_line[stat_line.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


@pytest.fixture
def isolated_home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """HOME, XDG and TMP dirs under the test's tmp_path, so CLIs never touch the user's files."""
    home = tmp_path / "home"
    tmp = tmp_path / "tmp"
    for path in (home, tmp):
        path.mkdir()
    yield {"HOME": str(home), "TMPDIR": str(tmp), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local/share")}


class FakeCLI:
    """A fake executable replaying one transcript; ``records()`` is what it was given."""

    def __init__(self, path: str, record: Path) -> None:
        self.path = path
        self._record = record

    def records(self, kind: str) -> list[Any]:
        if not self._record.exists():
            return []
        import json

        rows = [json.loads(line) for line in self._record.read_text().splitlines()]
        return [row["value"] for row in rows if row["kind"] == kind]


@pytest.fixture
def fake_cli(tmp_path: Path, fake_exe: Callable[[str, str], str]) -> Callable[..., FakeCLI]:
    """``fake_cli("claude-text", stdin_protocol=True)``: a CLI that replays that capture."""
    counter = iter(range(1_000_000))

    def make(name: str, *, stdin_protocol: bool = False, exit_code: int | None = None) -> FakeCLI:
        n = next(counter)
        record = tmp_path / f"record-{n}.jsonl"
        _, _, captured_exit = transcript(name)
        code = exit_code if exit_code is not None else (captured_exit or 0)
        args = [str(record), str(TRANSCRIPTS / f"{name}.jsonl"), str(TRANSCRIPTS / f"{name}.stderr"),
                str(code)] + (["--stdin-protocol"] if stdin_protocol else [])
        body = (f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport fake_cli\n"
                f"sys.exit(fake_cli.main({args!r}))\n")
        return FakeCLI(fake_exe(f"fake-{n}", body), record)

    return make


# --- the real claude and codex against the mock model servers (test_real_clis and friends) ------

QUIET_CLAUDE = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_MAX_RETRIES": "0",  # API failures come back at once instead of after backoff
}


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    path = tmp_path / "work"
    path.mkdir()
    return str(path)


@pytest.fixture
def anthropic() -> Iterator[AnthropicMock]:
    with AnthropicMock() as mock:
        yield mock


@pytest.fixture
def claude_config(
    claude_bin: str, anthropic: AnthropicMock, isolated_home: dict[str, str], tmp_path: Path
) -> Callable[..., claude.Config]:
    def make(base_url: str | None = None, **fields: Any) -> claude.Config:
        env = {**isolated_home, **QUIET_CLAUDE, "ANTHROPIC_API_KEY": "sk-ant-mock-key",
               "ANTHROPIC_BASE_URL": base_url or anthropic.url}
        return claude.Config(command=claude_bin, env=env,
                             config_dir=str(tmp_path / "claude-profile"), **fields)

    return make


@pytest.fixture
def openai() -> Iterator[OpenAIMock]:
    with OpenAIMock() as mock:
        yield mock


@pytest.fixture
def codex_config(
    codex_bin: str, openai: OpenAIMock, isolated_home: dict[str, str], tmp_path: Path
) -> Callable[..., codex.Config]:
    def make(base_url: str | None = None, **fields: Any) -> codex.Config:
        provider = (
            f'model_providers.mock={{name="mock",base_url="{base_url or openai.base_url}",'
            'env_key="MOCK_API_KEY",wire_api="responses",request_max_retries=0,'
            "stream_max_retries=0}"
        )
        extra = ("-c", "model_provider=mock", "-c", provider, "-c", "analytics.enabled=false",
                 "-c", "check_for_update_on_startup=false", "--disable", "plugins")
        return codex.Config(command=codex_bin, model="gpt-5.5", home=str(tmp_path / "codex-home"),
                            env={**isolated_home, "MOCK_API_KEY": "mock-key"}, extra_args=extra,
                            **fields)

    return make

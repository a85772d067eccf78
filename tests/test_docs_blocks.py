"""Every fenced code block in README.md and docs/*.md is checked: the docs promise examples
that actually run.

What every block gets, by its language:

- ``python``: compiles; every name it imports exists, every ``module.attr`` chain rooted at an
  imported module resolves, and a call of such a name binds its arguments to the real signature.
- ``sh``: ``bash -n`` (syntax).
- ``toml``: parses, and passes ``adaptord check --config`` (the daemon's config loader and its
  host tool import).  Paths under ``/home/me`` are the reader's own: the check makes them
  under a temporary directory, and provides the ``mytools.issues`` module the examples name.
- ``json``: parses; a block with ``driver`` and ``prompt`` is a request file and passes the
  request validator the daemon uses.

A marker in an HTML comment on the line just before the fence (invisible once rendered) says
more:

- ``<!-- docs-test: run -->``: the block is run, in order with the file's other run blocks, in
  one temporary directory per file (``ADAPTORD_HOME`` set to one home for all, no user config):
  a python block with ``python``, a sh block with ``bash -e``.  It must exit 0, and the comment
  lines that end a python block (``# Files mentioned: ...``) are what it prints.
- ``<!-- docs-test: run daemon -->``: the same, while a real ``adaptord serve`` serves that home;
  a line that is just ``adaptord serve`` (the daemon the reader starts) is left out.
- ``<!-- docs-test: sketch -->``: a JSON block showing a shape (``"fail | requeue"``), parsed only.

Blocks needing an agent CLI, a network, a systemd session or a user's own files are checked
statically only (the README's systemd install commands are run by ``test_systemd_unit.py``).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*([\w ]+?)\s*-->\s*$")
_MARKS = {"run", "run daemon", "sketch"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    mark: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.groups()
        end = i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        marker = _MARKER.match(lines[i - 1]) if i else None
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        yield Block(path, i + 1, lang, code, marker.group(1) if marker else None)
        i = end + 1


BLOCKS = [block for path in DOCS for block in _blocks(path)]


def _of(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.name) for b in BLOCKS if b.lang in langs]


def test_every_block_is_known() -> None:
    # A new language (or a misspelt marker) would otherwise pass unchecked.
    assert len(BLOCKS) > 40
    for block in BLOCKS:
        assert block.lang in {"python", "sh", "toml", "json", ""}, block.name
        assert block.mark is None or block.mark in _MARKS, block.name
        if block.mark and block.mark.startswith("run"):
            assert block.lang in {"python", "sh"}, block.name


# -- python ------------------------------------------------------------------------------------


def _resolve(node: ast.expr, names: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, object)`` for a name or attribute chain rooted at an imported name."""
    if isinstance(node, ast.Name):
        return (node.id in names, names.get(node.id))
    if isinstance(node, ast.Attribute):
        known, base = _resolve(node.value, names)
        if known:
            assert hasattr(base, node.attr), f"{ast.unparse(node)}: no attribute {node.attr!r}"
            return (True, getattr(base, node.attr))
    return (False, None)


@pytest.mark.parametrize("block", _of("python"))
def test_python_block_uses_real_names(block: Block) -> None:
    tree = ast.parse(compile(block.code, block.name, "exec", ast.PyCF_ONLY_AST))
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = import_module(
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = import_module(node.module)
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    value = import_module(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = value
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            _resolve(node, names)
        elif isinstance(node, ast.Call):
            known, func = _resolve(node.func, names)
            if known and callable(func) and not any(
                isinstance(a, ast.Starred) for a in node.args
            ) and all(k.arg for k in node.keywords):
                try:
                    signature = inspect.signature(func)
                except (TypeError, ValueError):
                    continue
                try:
                    signature.bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
                except TypeError as exc:
                    pytest.fail(f"{block.name}: {ast.unparse(node)}: {exc}")


# -- sh ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("sh"))
def test_sh_block_parses(block: Block) -> None:
    proc = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert proc.returncode == 0, f"{block.name}: {proc.stderr}"


# -- toml: daemon config -----------------------------------------------------------------------

_MYTOOLS = '''\
from dataclasses import dataclass

from adaptor import tool


@dataclass
class IssueQuery:
    number: int


def _lookup(query: IssueQuery) -> dict[str, str]:
    return {"title": f"issue {query.number}"}


lookup = tool.define("lookup_issue", "Fetch an issue by number", _lookup, input=IssueQuery)
'''


def _user_files(tmp: Path) -> dict[str, str]:
    """The environment a reader's config names: their module and directories."""
    package = tmp / "py" / "mytools"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "issues.py").write_text(_MYTOOLS)
    for folder in ("src/project", "skills"):
        (tmp / "me" / folder).mkdir(parents=True)
    return {
        "PYTHONPATH": os.pathsep.join([str(tmp / "py"), str(ROOT)]),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "ADAPTORD_A2A_TOKEN": "a-token-for-the-docs-test",
    }


@pytest.mark.parametrize("block", _of("toml"))
def test_toml_block_is_a_valid_daemon_config(block: Block, tmp_path: Path) -> None:
    tomllib.loads(block.code)
    env = {**os.environ, **_user_files(tmp_path)}
    config = tmp_path / "config.toml"
    config.write_text(block.code.replace("/home/me/", f"{tmp_path}/me/"))
    proc = subprocess.run(
        [sys.executable, "-m", "adaptord", "check", "--config", str(config)],
        capture_output=True, text=True, env=env, timeout=60,
    )
    # Its exit status also says whether the agent CLIs the config names are installed here.
    assert f"config: ok ({config})" in proc.stdout.splitlines(), f"{block.name}: {proc.stdout}"


# -- json --------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", _of("json"))
def test_json_block_parses_and_requests_validate(block: Block) -> None:
    from adaptor import _request

    value = json.loads(block.code)
    if block.mark != "sketch" and isinstance(value, dict) and {"driver", "prompt"} <= value.keys():
        _request.parse(block.code.encode(), "docs-block")


# -- run blocks --------------------------------------------------------------------------------

_DAEMON_LINE = re.compile(r"^adaptord serve\s*(#.*)?$")


def _expected_output(code: str) -> list[str]:
    """The comment lines that end a python block: what it prints."""
    lines = code.rstrip("\n").splitlines()
    shown: list[str] = []
    while lines and lines[-1].startswith("# "):
        shown.insert(0, lines.pop()[2:])
    return shown


def _run(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        code = "\n".join(line for line in block.code.splitlines() if not _DAEMON_LINE.match(line))
        argv = ["bash", "-e", "-c", code]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{block.name} exited {proc.returncode}: {proc.stderr}"
    if block.lang == "python":
        for line in _expected_output(block.code):
            assert line in proc.stdout.splitlines(), f"{block.name}: {line!r} not printed"


_RUN_FILES = sorted({b.path for b in BLOCKS if b.mark in {"run", "run daemon"}})


class _Session:
    """One home, the reader's files and (once a block needs it) one daemon, for every run block:
    a daemon start is most of this module's run time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, **_user_files(root), "ADAPTORD_HOME": str(root / "home")}
        self.daemon: Any = None

    def serve(self) -> None:
        from tests.daemon_harness import DaemonProcess

        if self.daemon is None:
            self.daemon = DaemonProcess(self.root / "home", env=self.env).start()


@pytest.fixture(scope="module")
def _session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Session]:
    session = _Session(tmp_path_factory.mktemp("docs"))
    yield session
    if session.daemon is not None:
        session.daemon.stop()


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in _RUN_FILES])
def test_run_blocks_run(path: Path, tmp_path: Path, _session: _Session) -> None:
    for block in [b for b in BLOCKS if b.path == path and b.mark in {"run", "run daemon"}]:
        if block.mark == "run daemon":
            _session.serve()
        _run(block, tmp_path, _session.env)

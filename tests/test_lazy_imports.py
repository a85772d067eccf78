"""``import adaptor`` imports its modules (and jsonschema) on first use, and the ``adaptor``
command only the modules a command needs: a daemon round trip needs neither the SDK's run
machinery nor the request mapping."""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import pkgutil
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

import pytest

import adaptor

INIT = Path(adaptor.__file__)


def _fresh(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet) and return what it printed."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip()


def test_import_adaptor_imports_no_module_of_the_package() -> None:
    loaded = _fresh(
        "import sys, adaptor\n"
        "print(sorted(m for m in sys.modules if m.startswith(('adaptor.', 'adaptord'))))"
    )
    assert loaded == "[]"


def test_the_cli_runs_without_the_sdk_or_the_request_mapping() -> None:
    out = _fresh(
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from adaptor.cli import cli\n"
        "result = CliRunner().invoke(cli, ['exit-codes', '--json'])\n"
        "print(result.exit_code, *sorted(m for m in sys.modules if m.startswith('adaptor')))"
    ).split()
    exit_code, loaded = out[0], out[1:]
    assert exit_code == "0"
    assert "adaptor.cli" in loaded and "adaptor.spool" in loaded
    for heavy in ("adaptor.agent", "adaptor._run", "adaptor._request", "adaptor.driver"):
        assert heavy not in loaded


def test_jsonschema_loads_with_the_first_schema_not_with_adaptor_or_its_cli() -> None:
    # A quarter of ``import adaptor`` (and of every ``adaptor`` command's start) was jsonschema,
    # which a run without a schema never uses.
    out = _fresh(
        "import sys, adaptor, adaptor.cli\n"
        "before = 'jsonschema' in sys.modules\n"
        "compiled = adaptor.schema.compile_schema({'type': 'object'})\n"
        "print(before, 'jsonschema' in sys.modules, compiled.validate_text('{}', 'native').valid)"
    )
    assert out.split() == ["False", "True", "True"]


def test_every_public_name_resolves_to_its_module_object() -> None:
    fresh = _fresh(
        "import adaptor\n"
        "print(all(getattr(adaptor, n) is getattr(__import__(adaptor._HOMES[n], fromlist=[n]), n)"
        " for n in adaptor.__all__))"
    )
    assert fresh == "True"
    namespace: dict[str, object] = {}
    exec("from adaptor import *", namespace)  # the star import a user may write
    assert {name for name in namespace if not name.startswith("__")} == set(adaptor.__all__)
    assert set(adaptor.__all__) <= set(dir(adaptor))


def test_the_names_for_type_checkers_and_for_run_time_agree() -> None:
    # The TYPE_CHECKING imports (what mypy and IDEs see), the run-time table and __all__ are
    # three lists of the same names; none may drift from the others.
    tree = ast.parse(INIT.read_text())
    checked: dict[str, str] = {}
    submodules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                if statement.module == "adaptor":  # submodules, served as attributes
                    assert all(alias.asname == alias.name for alias in statement.names)
                    submodules.update(alias.name for alias in statement.names)
                    continue
                checked.update({alias.name: statement.module for alias in statement.names})
    assert checked == adaptor._HOMES
    # Every public submodule is seen by type checkers as the attribute it is at run time
    # (`adaptor.memory.Store()` after `import adaptor` was "Module has no attribute" to mypy).
    public = {m.name for m in pkgutil.iter_modules(adaptor.__path__) if not m.name.startswith("_")}
    # (The CLI is no API; adaptor.clients.a2a is imported by its full name.)
    assert submodules == public - {"cli", "clients"}, public
    assert sorted(adaptor.__all__) == sorted(checked)
    assert len(adaptor.__all__) == len(set(adaptor.__all__))


class _BrokenLoader(importlib.abc.Loader):
    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        importlib.import_module("no_such_dependency")


class _BrokenFinder(importlib.abc.MetaPathFinder):
    """Finds ``adaptor.broken_probe``, a submodule whose own import fails."""

    def find_spec(self, name: str, path: object, target: object = None) -> ModuleSpec | None:
        if name != "adaptor.broken_probe":
            return None
        return importlib.util.spec_from_loader(name, _BrokenLoader())


def test_submodules_are_reachable_as_attributes_and_unknown_names_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _fresh("import adaptor; print(adaptor.errors.from_wire.__module__)") == "adaptor.errors"
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        _ = adaptor.no_such_thing  # type: ignore[attr-defined]
    assert not hasattr(adaptor, "no_such_thing")
    assert not hasattr(adaptor, "_no_such_private")
    # A submodule that exists but fails to import says why, rather than "no attribute".
    monkeypatch.setattr(sys, "meta_path", [_BrokenFinder(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        _ = adaptor.broken_probe  # type: ignore[attr-defined]

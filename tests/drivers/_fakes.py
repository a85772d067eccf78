"""Fake CLI executables made from the ``fake_*.py`` modules next to this file (test code)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.drivers.conftest import HERE, FakeCLI


def module_cli(fake_exe: Callable[[str, str], str], name: str, module: str,
               record: Path) -> FakeCLI:
    """An executable ``name`` running ``<module>.main(argv)``; it records into ``record`` when
    its environment has ``FAKE_RECORD`` pointing there."""
    body = (f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport {module}\n"
            f"sys.exit({module}.main(sys.argv[1:]))\n")
    return FakeCLI(fake_exe(name, body), record)


def records(fake: FakeCLI, kind: str) -> list[Any]:
    """What the fake was given, typed loosely: it is JSON read back."""
    return fake.records(kind)

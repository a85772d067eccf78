"""The reliability harness: crash, torn-file, hostile-input, load and secrets scenarios.

Every test here is marked ``slow``; ``pytest -m "not slow"`` skips them.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/torture/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)

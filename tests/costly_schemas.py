"""Output schemas too costly to check in process (test code)."""

from __future__ import annotations

from typing import Any


def doubling_chain(levels: int) -> dict[str, Any]:
    """A few hundred bytes whose every level refers twice to the next: 2**levels checks of a
    value that is no integer (``levels`` = 18 takes about 40 s in process)."""
    defs: dict[str, Any] = {
        f"l{i}": {"anyOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"l{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}

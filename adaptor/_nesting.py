"""How deeply JSON values nest: told and bounded without recursion.

Values from outside (a request file, an agent's output or tool arguments) may nest as deeply as
their parser allows, deeper than Python's stack and than the 254 levels orjson encodes.  Depth
counts arrays and objects: ``[]`` and ``{"a": 1}`` are one level, ``[[]]`` two.
"""

from __future__ import annotations

from typing import Any

__all__ = ["copy", "deeper_than"]


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value``'s arrays and objects nest more than ``limit`` levels deep."""
    pending: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def copy(value: Any, *, depth: int | None = None) -> Any:
    """A deep copy of a JSON value (dicts, lists and immutable scalars).

    With ``depth``, arrays and objects below that many levels are replaced by a note saying so.
    """
    if not isinstance(value, dict | list):
        return value
    note = f"<nested deeper than {depth} levels: not kept>"
    if depth is not None and depth < 1:
        return note
    root: dict[Any, Any] | list[Any] = {} if isinstance(value, dict) else []
    pending: list[tuple[Any, Any, int]] = [(value, root, 1)]
    while pending:
        source, target, level = pending.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            copied = child
            if isinstance(child, dict | list):
                if depth is not None and level >= depth:
                    copied = note
                else:
                    copied = {} if isinstance(child, dict) else []
                    pending.append((child, copied, level + 1))
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
    return root

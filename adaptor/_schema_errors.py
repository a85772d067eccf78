"""jsonschema's error messages with the values they quote written as JSON.

jsonschema words its messages with Python's ``repr()``: ``True is not of type 'string'``,
``None is not one of ['a', 'b']``.  The values come from JSON (a request file, an agent's
output) and the people reading the messages write JSON, so they are shown as JSON:
``true is not of type "string"``, ``null is not one of ["a","b"]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from jsonschema import ValidationError


def message(error: ValidationError) -> str:
    """``error.message`` with each value it quotes, as far as they can be told, in JSON."""
    text = str(error.message)
    rendered: dict[str, str] = {}
    for value in _quoted_values(error):
        try:
            python = repr(value)
            if python in rendered or python not in text:
                continue
            json = orjson.dumps(value).decode()
        except Exception:  # (a value JSON cannot hold: left as jsonschema wrote it)
            continue
        if python != json:
            rendered[python] = json
    if not rendered:
        return text
    # One pass, longest first: a value inside another (a key of the instance) is rewritten
    # once, as part of the longer one.
    pattern = re.compile("|".join(map(re.escape, sorted(rendered, key=len, reverse=True))))
    return pattern.sub(lambda found: rendered[found.group()], text)


def _quoted_values(error: ValidationError) -> Iterator[Any]:
    """What jsonschema's messages quote: the instance and its keys (the unexpected properties
    of ``additionalProperties``), the keyword's value, the schema's ``patternProperties``, the
    value's items and keys (the names of ``required``, the types of ``type``), and one level
    below them (``dependentRequired``)."""
    instance = error.instance
    yield instance
    if isinstance(instance, dict):
        yield from instance
    expected = error.validator_value
    yield expected
    if isinstance(error.schema, dict) and isinstance(error.schema.get("patternProperties"), dict):
        yield from error.schema["patternProperties"]  # (additionalProperties names them)
    for part in _parts(expected):
        yield part
        yield from _parts(part)


def _parts(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        yield from value
        yield from value.values()
    elif isinstance(value, list | tuple):
        yield from value

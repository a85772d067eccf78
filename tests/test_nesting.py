"""JSON nesting depth, told and bounded without recursion (adaptor._nesting)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptor import _nesting

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@given(_JSON, st.integers(min_value=0, max_value=6))
def test_deeper_than_counts_arrays_and_objects(value: Any, limit: int) -> None:
    assert _nesting.deeper_than(value, limit) == (_depth(value) > limit)


@given(_JSON)
def test_a_copy_is_equal_and_shares_no_container(value: Any) -> None:
    copied = _nesting.copy(value)
    assert copied == value
    if isinstance(value, dict | list):
        assert copied is not value
        for key in value if isinstance(value, dict) else range(len(value)):
            if isinstance(value[key], dict | list):
                assert copied[key] is not value[key]


@given(_JSON, st.integers(min_value=1, max_value=4))
def test_a_bounded_copy_cuts_only_below_its_depth(value: Any, depth: int) -> None:
    copied = _nesting.copy(value, depth=depth)
    assert _depth(copied) <= depth
    if _depth(value) <= depth:
        assert copied == value
    else:
        assert f"<nested deeper than {depth} levels: not kept>" in repr(copied)


def test_values_deeper_than_the_python_stack() -> None:
    deep = _nested(50_000)
    assert _nesting.deeper_than(deep, 49_999) and not _nesting.deeper_than(deep, 50_000)
    copied = _nesting.copy(deep)
    assert _nesting.deeper_than(copied, 49_999) and copied is not deep
    cut = _nesting.copy({"a": deep}, depth=3)
    assert cut == {"a": [["<nested deeper than 3 levels: not kept>"]]}
    assert _nesting.copy("scalar", depth=0) == "scalar"
    assert _nesting.copy([1], depth=0) == "<nested deeper than 0 levels: not kept>"


@given(_JSON)
def test_dumps_writes_what_orjson_writes(value: Any) -> None:
    assert _nesting.dumps(value) == orjson.dumps(value)


def test_dumps_writes_deeper_than_orjson() -> None:
    value = {"a": [1, {"b": _nested(600)}, "x"], "c": None}
    text = _nesting.dumps(value)
    assert text == b'{"a":[1,{"b":' + b"[" * 600 + b"]" * 600 + b'},"x"],"c":null}'
    assert _nesting.deeper_than(orjson.loads(text), 601)
    with pytest.raises(orjson.JSONEncodeError):
        _nesting.dumps({"not json": object()})

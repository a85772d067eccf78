"""Structured output: schema compilation, validation, negotiation, instructions, conversion."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional, TypedDict

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

import adaptor._schema_checker
import adaptor.schema
from adaptor import tool
from adaptor.driver import (
    Descriptor,
    HumanDecisionSupport,
    InvalidOutputSchemaError,
    QuestionSupport,
    RunPolicyCaps,
    StructuredOutputCaps,
    StructuredOutputHITL,
    StructuredOutputUnsupportedError,
)
from adaptor.result import DecodeError, Result, StructuredOutput
from adaptor.schema import (
    CompiledSchema,
    SchemaOptions,
    compile_schema,
    convert,
    instruct,
    negotiate,
    run_as,
)
from tests.costly_schemas import doubling_chain

# --- types under test (module level: string annotations resolve against module globals) ------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Point:
    x: float
    y: float


@dataclass
class Shape:
    name: str
    center: Point
    color: Color
    kind: Literal["circle", "square"]
    tags: dict[str, int]
    note: Optional[str] = None  # noqa: UP045 - Optional is part of what is under test
    corners: list[Point] = field(default_factory=list)


@dataclass
class Sized:
    size: Annotated[int, "how big", {"minimum": 0}]
    label: str = field(default="", metadata={"description": "shown to humans"})
    computed: int = field(init=False, default=0)


class Movie(TypedDict):
    title: str
    year: int
    origin: NotRequired[Point]


class Partial(TypedDict, total=False):
    rating: float


@dataclass
class Node:
    value: int
    next: Node | None = None


@dataclass
class Ping:
    pong: Pong


@dataclass
class Pong:
    ping: list[Ping]


@dataclass
class WithCallback:
    callback: Callable[[], int]


@dataclass
class IntKeys:
    counts: dict[int, str]


@dataclass
class WithSet:
    tags: set[str]


@dataclass
class WithBytes:
    blob: bytes


class Opaque:
    pass


@dataclass
class WithOpaque:
    thing: Opaque


@dataclass
class Dangling:
    other: Missing  # type: ignore[name-defined]  # noqa: F821 - unresolvable on purpose


@dataclass(frozen=True)
class Leaf:
    label: str
    weight: float


@dataclass(frozen=True)
class Sample:
    count: int
    ratio: float
    flag: bool
    name: str
    color: Color
    level: Level
    mode: Literal["fast", "slow", 3]
    leaves: list[Leaf]
    scores: dict[str, int]
    pair: tuple[int, str]
    rest: tuple[float, ...]
    maybe: Leaf | None = None
    anything: Any = None


# --- derivation ---------------------------------------------------------------------------------


def test_dataclass_derivation_is_strict_and_reuses_defs() -> None:
    compiled = compile_schema(Shape)
    schema = compiled.schema
    assert compiled.type_ is Shape
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name", "center", "color", "kind", "tags"]
    props = schema["properties"]
    assert props["name"] == {"type": "string"}
    assert props["color"] == {"type": "string", "enum": ["red", "green"]}
    assert props["kind"] == {"type": "string", "enum": ["circle", "square"]}
    assert props["tags"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    # Point is used twice: it goes to $defs once and both places reference it.
    assert props["center"] == {"$ref": "#/$defs/Point"}
    assert props["corners"] == {"type": "array", "items": {"$ref": "#/$defs/Point"}}
    assert schema["$defs"]["Point"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }


def test_single_use_nested_type_is_inlined() -> None:
    schema = compile_schema(Movie).schema
    assert "$defs" not in schema
    assert schema["required"] == ["title", "year"]  # NotRequired seen through the string hint
    assert schema["properties"]["origin"]["properties"]["x"] == {"type": "number"}
    assert schema["additionalProperties"] is False


def test_typeddict_total_false_has_no_required_keys() -> None:
    schema = compile_schema(Partial).schema
    assert schema["required"] == []
    assert schema["properties"] == {"rating": {"type": "number"}}


def test_annotated_metadata_and_field_description() -> None:
    schema = compile_schema(Sized).schema
    assert schema["properties"]["size"] == {
        "type": "integer",
        "description": "how big",
        "minimum": 0,
    }
    assert schema["properties"]["label"]["description"] == "shown to humans"
    assert "computed" not in schema["properties"]  # init=False is not part of the wire shape
    assert schema["required"] == ["size"]


def test_int_enum_literal_mixed_and_tuples() -> None:
    schema = compile_schema(Sample).schema
    props = schema["properties"]
    assert props["level"] == {"type": "integer", "enum": [1, 2]}
    assert props["mode"] == {"enum": ["fast", "slow", 3]}  # mixed kinds: no "type"
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "items": False,
        "minItems": 2,
    }
    assert props["rest"] == {"type": "array", "items": {"type": "number"}}
    assert props["anything"] == {}


def test_non_struct_type_at_the_root() -> None:
    compiled = compile_schema(list[Point])
    assert compiled.schema["type"] == "array"
    assert compiled.schema["items"]["required"] == ["x", "y"]
    assert compiled.type_ is None  # list[Point] is not a class


def test_pydantic_model_and_nesting() -> None:
    base_model: Any = pytest.importorskip("pydantic").BaseModel

    class Inner(base_model):  # type: ignore[misc]  # pydantic, if installed
        a: int

    class Model(base_model):  # type: ignore[misc]  # pydantic, if installed
        inner: Inner
        tags: list[str] = []

    compiled = compile_schema(Model)
    assert compiled.type_ is Model
    assert compiled.schema == Model.model_json_schema()

    @dataclass
    class Holder:
        model: Any

    # A pydantic model nested in a dataclass keeps its own $defs, hoisted to the root.
    Holder.__annotations__["model"] = Model
    holder = compile_schema(Holder).schema
    model_schema = Model.model_json_schema()
    inner_def = model_schema.pop("$defs")["Inner"]
    assert holder["properties"]["model"] == model_schema  # used once: inline
    assert holder["$defs"] == {"Inner": inner_def}
    out = compile_schema(Holder).validate_text('{"model": {"inner": {"a": 1}}}', "native")
    assert out.valid, out.errors
    assert convert(out.value, Holder) == Holder(model=Model(inner=Inner(a=1)))


def test_schema_from_dict_text_and_bytes_agree() -> None:
    doc = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    from_dict = compile_schema(doc)
    from_text = compile_schema(orjson.dumps(doc).decode())
    from_bytes = compile_schema(b"  " + orjson.dumps(doc) + b"\n")
    assert from_dict == from_text == from_bytes
    assert from_dict.type_ is None
    assert compile_schema(from_dict) is from_dict


def test_schema_is_deep_copied() -> None:
    doc: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    compiled = compile_schema(doc)
    doc["properties"]["a"]["type"] = "string"
    assert compiled.schema["properties"]["a"]["type"] == "integer"
    assert compiled.validate_text('{"a": 1}', "native").valid


def test_tuple_values_in_a_schema_dict_become_lists() -> None:
    compiled = compile_schema({"type": "object", "required": ("a",)})
    assert compiled.schema["required"] == ["a"]


def test_schema_hash_is_sha256_of_canonical_json() -> None:
    compiled = compile_schema({"type": "object", "required": ["b", "a"]})
    expected = hashlib.sha256(b'{"required":["b","a"],"type":"object"}').hexdigest()
    assert compiled.schema_hash == f"sha256:{expected}"


def test_schema_hash_stable_across_key_order() -> None:
    a = compile_schema({"type": "object", "properties": {"x": {"type": "string"}, "y": {}}})
    b = compile_schema({"properties": {"y": {}, "x": {"type": "string"}}, "type": "object"})
    assert a.schema_hash == b.schema_hash
    assert a == b and hash(a) == hash(b)


_json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
_json_values = st.recursive(
    _json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


@given(_json_values)
def test_schema_hash_ignores_key_order_for_any_content(data: Any) -> None:
    # Unknown keywords are annotations in draft 2020-12, so any JSON can ride along.
    doc = {"type": "object", "x-data": data, "description": "d"}
    assert compile_schema(doc).schema_hash == compile_schema(_reverse_keys(doc)).schema_hash


# --- schema errors ------------------------------------------------------------------------------


def _schema_error(schema: object) -> InvalidOutputSchemaError:
    with pytest.raises(InvalidOutputSchemaError) as info:
        compile_schema(schema)
    return info.value


@pytest.mark.parametrize("type_", [Node, Ping])
def test_recursive_types_are_rejected(type_: type) -> None:
    error = _schema_error(type_)
    assert error.reason.startswith(f"cannot derive a schema from {__name__}.{type_.__name__}: ")
    assert "recursive type" in error.reason


@pytest.mark.parametrize(
    ("type_", "detail"),
    [
        (WithCallback, "callables"),
        (IntKeys, "keys are strings"),
        (WithSet, "sets are not JSON"),
        (WithBytes, "bytes are not JSON"),
        (WithOpaque, "unsupported class"),
        (bytes, "bytes are not JSON"),
        (Opaque, "unsupported class"),
        (frozenset[int], "sets are not JSON"),
    ],
)
def test_unsupported_shapes_are_rejected(type_: object, detail: str) -> None:
    error = _schema_error(type_)
    assert error.reason.startswith("cannot derive a schema from ")
    assert detail in error.reason
    assert error.cause is None


def test_unsupported_shape_error_names_the_field() -> None:
    assert "$.callback" in _schema_error(WithCallback).reason


def test_unresolvable_type_hint_keeps_the_cause() -> None:
    error = _schema_error(Dangling)
    assert "cannot resolve the type hints" in error.reason
    assert isinstance(error.cause, NameError)
    assert error.__cause__ is error.cause


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"type": ', "malformed schema JSON"),
        ("{'type': 'object'}", "malformed schema JSON"),
        ('{"type": "object"} {"type": "string"}', "unexpected data after the JSON value"),
        (b'{"type": "object"} trailing', "unexpected data after the JSON value"),
    ],
)
def test_malformed_schema_text(text: str | bytes, detail: str) -> None:
    error = _schema_error(text)
    assert detail in error.reason
    assert isinstance(error.cause, ValueError)  # orjson's JSONDecodeError


@pytest.mark.parametrize("text", ["", "   \n", b""])
def test_empty_schema_document(text: str | bytes) -> None:
    assert _schema_error(text).reason == "empty schema document"


def test_non_utf8_schema_bytes() -> None:
    error = _schema_error(b"\xff\xfe")
    assert isinstance(error.cause, UnicodeDecodeError)


@pytest.mark.parametrize("schema", ["[1, 2]", "true", "42", '"object"', [{"type": "string"}]])
def test_non_object_schema(schema: object) -> None:
    assert "must be a JSON object" in _schema_error(schema).reason


@pytest.mark.parametrize(
    "schema",
    [{"type": 12}, {"type": "object", "properties": {"a": {"pattern": "(["}}}, {"minimum": "0"}],
)
def test_uncompilable_schema(schema: dict[str, Any]) -> None:
    error = _schema_error(schema)
    assert "not a valid draft 2020-12 schema" in error.reason
    assert isinstance(error.cause, SchemaError)


def test_an_uncompilable_schema_quotes_its_values_as_json() -> None:
    # It said "'0' is not of type 'number'": the schema was JSON (a request's, a --schema file).
    error = _schema_error({"minimum": "0"})
    assert error.reason == 'not a valid draft 2020-12 schema at $.minimum: "0" is not of type "number"'


@pytest.mark.parametrize(
    "ref",
    ["#/$defs/missing", "https://example.com/remote.json", "#nope"],
)
def test_dangling_reference_fails_at_compile_time(ref: str) -> None:
    schema = {"type": "object", "properties": {"a": {"anyOf": [{"$ref": ref}, {}]}}}
    error = _schema_error(schema)
    assert "unresolvable $ref" in error.reason
    assert isinstance(error.cause, Unresolvable)


def test_internal_references_compile() -> None:
    schema = {
        "$defs": {"n": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/properties/a"}},
    }
    assert compile_schema(schema).validate_text('{"a": 1, "b": 2}', "native").valid


@pytest.mark.parametrize(
    ("schema", "detail"),
    [
        ({"type": "object", "default": datetime(2024, 1, 1)}, "not JSON"),
        ({"type": "number", "maximum": float("nan")}, "not finite"),
        ({1: {"type": "string"}}, "not a string"),
        ({"type": "integer", "maximum": 2**70}, "canonicalized"),
        ({"$schema": "http://json-schema.org/draft-07/schema#"}, "unsupported $schema"),
    ],
)
def test_non_json_or_foreign_schema_dicts(schema: dict[Any, Any], detail: str) -> None:
    assert detail in _schema_error(schema).reason


def test_self_referencing_schema_dict() -> None:
    schema: dict[str, Any] = {"type": "object"}
    schema["not"] = schema
    assert "reference cycle" in _schema_error(schema).reason


def test_draft_2020_12_dialect_is_accepted() -> None:
    compile_schema({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"})


@pytest.mark.parametrize("schema", [None, 42, Point(1, 2)])
def test_values_that_are_not_schemas(schema: object) -> None:
    _schema_error(schema)


# --- validate_text ------------------------------------------------------------------------------

_OBJECT = compile_schema(
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "items": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
)


def test_valid_output_record() -> None:
    out = _OBJECT.validate_text('\n  {"items": ["x"], "a": 1}  \n', "prompt_validate")
    assert out == StructuredOutput(
        source="prompt_validate",
        valid=True,
        value={"items": ["x"], "a": 1},
        errors=(),
        raw_json='{"a":1,"items":["x"]}',
        schema_hash=_OBJECT.schema_hash,
    )


def test_invalid_output_keeps_value_and_sorts_errors_by_path() -> None:
    items: list[Any] = ["ok"] * 11
    items[10] = 1
    items[2] = 2
    text = orjson.dumps({"a": "nope", "items": items, "zzz": True}).decode()
    out = _OBJECT.validate_text(text, "native")
    assert not out.valid
    assert out.value == orjson.loads(text)
    assert out.raw_json
    assert out.errors == (
        # The values as JSON, as the output was written (jsonschema's own words quote
        # Python's repr: 'nope', 'integer').
        '$: Additional properties are not allowed ("zzz" was unexpected)',
        '$.a: "nope" is not of type "integer"',
        '$.items[2]: 2 is not of type "string"',
        '$.items[10]: 1 is not of type "string"',
    )


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_output_is_invalid(text: str) -> None:
    out = _OBJECT.validate_text(text, "native")
    assert out == StructuredOutput(
        source="native",
        valid=False,
        errors=("no structured output",),
        schema_hash=_OBJECT.schema_hash,
    )


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
        'Here you go: {"a": 1}',
        '{"a": 1}\nHope this helps!',
        '{"a": 1} {"a": 2}',
        '{"a": 1',
        '{"a": NaN}',
    ],
)
def test_anything_but_one_bare_json_value_is_invalid(text: str) -> None:
    out = _OBJECT.validate_text(text, "prompt_validate")
    assert not out.valid
    assert out.value is None and out.raw_json == ""
    assert len(out.errors) == 1 and out.errors[0].startswith("output is not a single JSON value")


def test_trailing_data_is_named() -> None:
    out = _OBJECT.validate_text('{"a": 1} garbage', "native")
    assert "unexpected data after the JSON value" in out.errors[0]


def test_long_error_messages_are_truncated() -> None:
    compiled = compile_schema({"type": "string"})
    out = compiled.validate_text(orjson.dumps(["x" * 2000]).decode(), "native")
    assert not out.valid and len(out.errors[0]) < 600


def test_validation_survives_mutating_the_public_schema() -> None:
    compiled = compile_schema({"type": "integer"})
    compiled.schema["type"] = "string"
    assert compiled.validate_text("1", "native").valid


# --- schemas with regular expressions -----------------------------------------------------------

# The classic pattern that backtracks catastrophically: a long word and a "!" take hours.
_BACKTRACKS = r"^(\w+\s?)+$"
_PATTERNED = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": _BACKTRACKS}},
    "patternProperties": {"^x-": {"type": "integer"}},
    "propertyNames": {"pattern": "^[a-z-]+$"},
    "additionalProperties": False,
}
_SLOW = {"name": "a" * 32 + "!"}


@pytest.mark.parametrize(
    ("schema", "text", "said"),
    [
        ({"type": "string"}, "true", '$: true is not of type "string"'),
        ({"type": ["string", "null"]}, "false", '$: false is not of type "string", "null"'),
        ({"enum": ["a", None]}, "null", None),
        ({"enum": ["a", None]}, '"b"', '$: "b" is not one of ["a",null]'),
        ({"const": {"on": True}}, "{}", '$: {"on":true} was expected'),
        ({"required": ["it's"]}, "{}", """$: "it's" is a required property"""),
        ({"items": {"maxLength": 1}}, '["\\u00e9t\\u00e9"]', '$[0]: "été" is too long'),
        ({"not": {"type": "null"}}, "null", '$: null should not be valid under {"type":"null"}'),
        ({"dependentRequired": {"a": ["b"]}}, '{"a": 1}', '$: "b" is a dependency of "a"'),
    ],
)
def test_output_errors_quote_values_as_json(schema: dict[str, Any], text: str, said: str | None) -> None:
    # jsonschema quotes Python's repr (True, None, 'b', {'on': True}): the output was JSON.
    out = compile_schema(schema).validate_text(text, "native")
    assert out.errors == (() if said is None else (said,))


@pytest.mark.parametrize(
    "value",
    [
        {"name": "two words"},
        {"name": "no-dash"},
        {"name": "ok", "x-count": 3},
        {"name": "ok", "x-count": "three"},
        {"name": "ok", "other": 1},
        {"Upper": 1},
    ],
)
def test_a_schema_with_patterns_judges_as_jsonschema_does(value: dict[str, Any]) -> None:
    from jsonschema import Draft202012Validator

    from adaptor import _schema_errors

    expected = sorted(  # (its words, the values quoted as JSON)
        f"{e.json_path}: {_schema_errors.message(e)}"
        for e in Draft202012Validator(_PATTERNED).iter_errors(value)
    )
    out = compile_schema(_PATTERNED).validate_text(orjson.dumps(value).decode(), "native")
    assert sorted(out.errors) == expected
    assert out.valid == (not expected)


def test_a_pattern_that_backtracks_is_cut_off_without_holding_other_threads() -> None:
    compiled = compile_schema(_PATTERNED)
    ticks: list[int] = []
    checking = threading.Event()

    def tick() -> None:
        while checking.is_set():
            ticks.append(1)
            time.sleep(0.01)

    checking.set()
    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        out = compiled.validate_text(orjson.dumps(_SLOW).decode(), "native", timeout=1)
    finally:
        checking.clear()
        ticker.join()
    assert not out.valid and out.value == _SLOW
    assert out.errors == (
        "$: validation did not finish within 1s; the schema is too costly to check against "
        "this output (a pattern that backtracks catastrophically, or subschemas applied again "
        "and again)",
    )
    # Python's re holds the GIL for a whole match: checked in process, nothing else would run
    # (and this one would take minutes).
    assert len(ticks) >= 3
    # The overrunning checker was killed; the next check gets a fresh one.
    assert compiled.validate_text('{"name": "fine again"}', "native").valid


def test_a_checker_imports_nothing_from_the_current_directory(tmp_path: Path) -> None:
    # Started as `python -m adaptor._schema_checker`, the checker had the current directory
    # first on its path: run in a repository holding an orjson.py (or an adaptor/ package),
    # it imported that code and ran it.
    marker = tmp_path / "ran"
    planted = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\nraise ImportError('planted')\n"
    (tmp_path / "orjson.py").write_text(planted)
    (tmp_path / "jsonschema").mkdir()
    (tmp_path / "jsonschema" / "__init__.py").write_text(planted)
    schema = tmp_path / "schema.json"
    schema.write_text(orjson.dumps({"type": "object", "properties": {"n": {"type": "integer"}}}).decode())
    for answer, code in (({"n": 3}, 0), ({"n": "three"}, 1)):
        proc = subprocess.run(
            # (-P: the parent itself must find the real modules; the checker is what is looked at.)
            [sys.executable, "-P", "-m", "adaptor", "run", "--no-daemon", "--home", str(tmp_path / "home"),
             "--driver", "script", "--config", f"steps={orjson.dumps([{'output_json': answer}]).decode()}",
             "--schema", str(schema), "go"],
            cwd=tmp_path, capture_output=True, text=True,
        )
        assert proc.returncode == code, proc.stderr
        assert not marker.exists(), marker.read_text()
    assert "integer" in proc.stderr or "integer" in proc.stdout


def test_a_checker_gets_the_folder_of_this_adaptor_only_where_its_path_lacks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An installed adaptor is found anyway: its site-packages ahead of the standard library
    # would let a stale backport there (typing.py) shadow it.  A checkout is added.
    import site

    monkeypatch.setattr(adaptor._schema_checker, "_IMPORTED_FROM", site.getsitepackages()[0])
    assert adaptor._schema_checker._child_environment() is None
    monkeypatch.setattr(adaptor._schema_checker, "_IMPORTED_FROM", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = adaptor._schema_checker._child_environment()
    assert env is not None and env["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/elsewhere"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert adaptor._schema_checker._child_environment() is None


def test_a_kept_checker_that_died_while_idle_is_replaced() -> None:
    compiled = compile_schema(_PATTERNED)
    assert compiled.validate_text('{"name": "keeps a checker"}', "native").valid
    kept = list(adaptor._schema_checker._idle)
    assert kept
    for child in kept:
        child.process.kill()
        child.process.wait()
    # Still checked by a child (in process, this output would take minutes): cut off.
    out = compiled.validate_text(orjson.dumps(_SLOW).decode(), "native", timeout=1)
    assert out.errors[0].startswith("$: validation did not finish within 1s")


def test_a_checker_works_with_descriptors_beyond_1024(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit ({hard}) stays below 1200")
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        out = compile_schema(_PATTERNED).validate_text('{"name": "x-y"}', "native")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        adaptor._schema_checker._close_idle()  # this test's own children
    assert out.errors == (f'$.name: "x-y" does not match {orjson.dumps(_BACKTRACKS).decode()}',)


def test_no_time_left_is_cut_off_at_once() -> None:
    out = compile_schema(_PATTERNED).validate_text('{"name": "ok"}', "native", timeout=0)
    assert out.errors[0].startswith("$: validation did not finish within 0s")


def test_the_pattern_check_limit_bounds_a_check_without_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adaptor.schema, "VALIDATION_LIMIT", 0.5)
    out = compile_schema(_PATTERNED).validate_text('{"name": "%s!"}' % ("a" * 64), "native")
    assert out.errors[0].startswith("$: validation did not finish within 0.5s")


def test_patterns_are_checked_in_process_when_no_checker_can_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    out = compile_schema(_PATTERNED).validate_text('{"name": "not-a-word"}', "native")
    assert out.errors == (f'$.name: "not-a-word" does not match {orjson.dumps(_BACKTRACKS).decode()}',)


@pytest.mark.parametrize(
    ("schema", "output"),
    [
        # In process: ~40 s (2**18 failing branches); no pattern anywhere.
        (doubling_chain(18), '"not an integer"'),
        # In process: ~45 s of pairwise comparisons of 6,000 objects.
        ({"type": "array", "uniqueItems": True}, orjson.dumps([{"k": i} for i in range(6000)])),
    ],
    ids=["subschemas-applied-again-and-again", "unique-items"],
)
def test_a_costly_schema_without_patterns_is_cut_off_too(schema: dict[str, Any], output: Any) -> None:
    text = output.decode() if isinstance(output, bytes) else output
    out = compile_schema(schema).validate_text(text, "native", timeout=1)
    assert not out.valid and out.value == orjson.loads(text)
    assert out.errors[0].startswith("$: validation did not finish within 1s; the schema is too")


def test_a_frozen_application_checks_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its sys.executable is the application: `-m adaptor._schema_checker` would start it again.
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    out = compile_schema(_PATTERNED).validate_text('{"name": "not-a-word"}', "native")
    assert out.errors == (f'$.name: "not-a-word" does not match {orjson.dumps(_BACKTRACKS).decode()}',)
    assert adaptor._schema_checker._idle == []  # no child was started


def test_a_checkers_start_does_not_count_against_the_checks_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The limit ran from the moment the request was sent to a child just started, so its
    # interpreter and jsonschema imports (a second or more on a busy machine) counted: a valid
    # output was "too costly to check".  A child is ready once it says so; only checking counts.
    # A child that takes 2 s to start, whatever the machine's load, and a limit of 1 s: well
    # above what checking takes, well below the start.
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 2\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    slow.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(slow))
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    try:
        out = compile_schema(_PATTERNED).validate_text('{"name": "fine"}', "native", timeout=1.0)
        assert out.valid, out.errors
    finally:
        adaptor._schema_checker._close_idle()


def test_warm_starts_one_checker_ahead_of_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    try:
        adaptor._schema_checker.warm()
        adaptor._schema_checker.warm()  # one is starting already: no second one
        deadline = time.monotonic() + 30
        while not adaptor._schema_checker._idle and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(adaptor._schema_checker._idle) == 1
        adaptor._schema_checker.warm()  # one is idle: nothing to do
        (child,) = adaptor._schema_checker._idle
        assert compile_schema(_PATTERNED).validate_text('{"name": "warm"}', "native").valid
        assert adaptor._schema_checker._idle == [child]  # that check used the warm one
    finally:
        adaptor._schema_checker._close_idle()


def test_a_check_whose_checker_gets_no_cpu_time_is_not_called_too_costly(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a machine too busy to let the checker run (a nice 19 daemon beside busy loops on one
    # core), every check of a valid output failed "validation did not finish within 10s; the
    # schema is too costly": the limit was wall time.  It is checking time now; here the
    # checker is stopped (SIGSTOP) for three times the limit, as a starved one gets nothing.
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    try:
        adaptor._schema_checker.warm()
        deadline = time.monotonic() + 30
        while not adaptor._schema_checker._idle and time.monotonic() < deadline:
            time.sleep(0.01)
        (child,) = adaptor._schema_checker._idle
        os.kill(child.process.pid, signal.SIGSTOP)
        starved = threading.Timer(3.0, os.kill, (child.process.pid, signal.SIGCONT))
        starved.start()
        try:
            assert adaptor._schema_checker.errors_of({"type": "integer"}, "five", 1.0) == ['$: "five" is not of type "integer"']
        finally:
            starved.join()
        # The caller's own deadline still ends the wait: the run's is never overrun.
        os.kill(child.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(adaptor._schema_checker.CheckTimeout):
                adaptor._schema_checker.errors_of({"type": "integer"}, 5, 0.5, wall_limit=1.0)
        finally:
            with contextlib.suppress(ProcessLookupError):  # (the cut-off check killed it)
                os.kill(child.process.pid, signal.SIGCONT)
    finally:
        adaptor._schema_checker._close_idle()


def test_a_check_right_after_warm_waits_for_the_starting_checker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A structured run whose agent answered at once (the script driver) started a second
    # child while the warm one was still importing: two interpreters for one check.
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    started: list[object] = []
    real = adaptor._schema_checker._Child

    def counted() -> object:
        started.append(None)
        return real()

    monkeypatch.setattr(adaptor._schema_checker, "_Child", counted)
    try:
        adaptor._schema_checker.warm()
        assert compile_schema(_PATTERNED).validate_text('{"name": "soon"}', "native").valid
        assert len(started) == 1
    finally:
        adaptor._schema_checker._close_idle()


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
        {"allOf": [{"$ref": "#"}]},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"not": {"$ref": "#/$defs/a"}}}},
        {"$defs": {"a": {"dependentSchemas": {"x": {"$ref": "#/$defs/a"}}}}, "type": "object"},
        {"$defs": {"a": {"if": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"},
    ],
    ids=["anyOf", "root", "two-steps", "dependentSchemas", "if"],
)
def test_references_that_loop_without_descending_are_refused(schema: dict[str, Any]) -> None:
    # Validation would apply the same subschema to the same value forever (in jsonschema:
    # until the recursion limit, whose RecursionError escaped the run).
    with pytest.raises(InvalidOutputSchemaError, match="leads back to where it started"):
        compile_schema(schema)


def test_recursive_schemas_that_descend_are_fine() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "anyOf": [{"$ref": "#/$defs/leafy"}, {"required": ["children"]}],
            },
            "leafy": {"properties": {"leaf": {"$ref": "#/$defs/node"}}},
        },
        "$ref": "#/$defs/node",
    }
    compiled = compile_schema(tree)
    assert compiled.validate_text('{"children": [{"children": []}]}', "native").valid
    bad = compiled.validate_text('{"children": [{"children": 1}]}', "native")
    assert bad.errors == ('$.children[0].children: 1 is not of type "array"',)


@pytest.mark.parametrize("depth", [129, 300, 1100, 100_000])
def test_output_nested_too_deeply_is_invalid_not_an_exception(depth: int) -> None:
    compiled = compile_schema({"type": "array", "items": {"$ref": "#"}})
    out = compiled.validate_text("[" * depth + "]" * depth, "native")
    assert not out.valid and out.value is None
    assert out.errors[0] in (
        "output nests arrays and objects deeper than 128 levels",
        "output is not a single JSON value: invalid JSON: depth limit exceeded: "
        "line 1 column 1026 (char 1025)",
    )
    assert compiled.validate_text("[" * 128 + "]" * 128, "native").valid


def test_to_output_schema() -> None:
    compiled = compile_schema(Shape)
    out = compiled.to_output_schema(SchemaOptions(name="  shape ", description=" A shape. "))
    assert out.name == "shape" and out.description == "A shape."
    assert out.schema == compiled.schema and out.schema is not compiled.schema
    assert out.schema_hash == compiled.schema_hash
    assert compiled.to_output_schema(SchemaOptions()).name == ""


# --- negotiation --------------------------------------------------------------------------------

_ALL = frozenset({"permission", "plan_review", "question"})
_DEFAULT_ASK = frozenset({"permission", "plan_review"})


def _descriptor(
    *,
    native: bool = True,
    prompt_validate: bool = True,
    streaming: bool = True,
    native_hitl: StructuredOutputHITL | None = None,
    prompt_validate_hitl: StructuredOutputHITL | None = None,
    can_ask: bool = True,
    native_strict: bool = False,
) -> Descriptor:
    decision = HumanDecisionSupport(ask=can_ask)
    return Descriptor(
        type="fake",
        display_name="Fake",
        run_policy_caps=RunPolicyCaps(
            permission=decision, plan_review=decision, question=QuestionSupport(ask=can_ask)
        ),
        structured_output=StructuredOutputCaps(
            native=native,
            prompt_validate=prompt_validate,
            works_with_streaming=streaming,
            native_hitl=native_hitl,
            prompt_validate_hitl=prompt_validate_hitl,
            native_strict=native_strict,
        ),
    )


def _negotiate(
    descriptor: Descriptor,
    ask: frozenset[str] = frozenset(),
    explicit: frozenset[str] = frozenset(),
    streaming: bool = False,
) -> str:
    return negotiate(descriptor, ask_kinds=ask, explicit_ask_kinds=explicit, streaming=streaming)


def test_native_is_preferred() -> None:
    assert _negotiate(_descriptor(), _DEFAULT_ASK) == "native"


def test_prompt_validate_when_native_is_not_offered() -> None:
    assert _negotiate(_descriptor(native=False)) == "prompt_validate"


def test_claude_like_matrix_falls_back_on_inherited_permission_ask() -> None:
    claude = _descriptor(
        native_hitl=StructuredOutputHITL(permission=False, plan_review=True, question=True),
        prompt_validate_hitl=StructuredOutputHITL(permission=True, plan_review=True, question=True),
    )
    assert _negotiate(claude, _DEFAULT_ASK) == "prompt_validate"
    assert _negotiate(claude, frozenset({"plan_review", "question"})) == "native"
    assert _negotiate(claude, frozenset()) == "native"


def test_all_false_matrix_rejects_any_ask() -> None:
    descriptor = _descriptor(native_hitl=StructuredOutputHITL(), prompt_validate=False)
    assert _negotiate(descriptor) == "native"
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        _negotiate(descriptor, frozenset({"question"}), explicit=frozenset({"question"}))
    assert info.value.driver == "fake"
    assert "native: incompatible with ask for question (set explicitly)" in info.value.reason
    assert "prompt_validate: not offered by the driver" in info.value.reason


def test_matrix_requires_run_policy_ask_support() -> None:
    descriptor = _descriptor(
        native_hitl=StructuredOutputHITL(permission=True, plan_review=True, question=True),
        can_ask=False,
    )
    assert _negotiate(descriptor, frozenset({"permission"})) == "prompt_validate"
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        _negotiate(
            _descriptor(
                native_hitl=StructuredOutputHITL(permission=True),
                prompt_validate=False,
                can_ask=False,
            ),
            frozenset({"permission"}),
        )
    assert "driver cannot ask for permission (inherited default)" in info.value.reason


def test_none_matrix_means_no_hitl_restriction() -> None:
    assert _negotiate(_descriptor(can_ask=False), _ALL, explicit=_ALL) == "native"


def test_streaming_restriction() -> None:
    descriptor = _descriptor(streaming=False)
    assert _negotiate(descriptor, streaming=False) == "native"
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        _negotiate(descriptor, streaming=True)
    assert info.value.reason == (
        "native: does not work with the streaming transport; "
        "prompt_validate: does not work with the streaming transport"
    )


def test_native_needs_an_object_root() -> None:
    def pick(schema: object, descriptor: Descriptor) -> str:
        return negotiate(descriptor, ask_kinds=frozenset(), explicit_ask_kinds=frozenset(),
                         streaming=False, schema=compile_schema(schema))

    assert pick({"type": "object"}, _descriptor()) == "native"
    for not_an_object in (list[Point], int, {"properties": {"x": {"type": "integer"}}}):
        assert pick(not_an_object, _descriptor()) == "prompt_validate"
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        pick({"type": "array"}, _descriptor(prompt_validate=False))
    assert info.value.reason == (
        'native: needs a schema whose root is {"type": "object"}; '
        "prompt_validate: not offered by the driver"
    )


@dataclasses.dataclass
class _WithOptional:
    name: str
    note: str = ""


def test_a_strict_provider_gets_only_strict_schemas_natively() -> None:
    # codex sends --output-schema as OpenAI's strict response format, which answers HTTP 400
    # for an optional property or an open object: the run failed instead of using the prompt.
    def pick(schema: object, prompt_validate: bool = True) -> str:
        descriptor = _descriptor(native_strict=True, prompt_validate=prompt_validate)
        return negotiate(descriptor, ask_kinds=frozenset(),
                         explicit_ask_kinds=frozenset(), streaming=False,
                         schema=compile_schema(schema))

    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    assert pick(Point) == pick(closed) == "native"
    nested_open = {**closed, "properties": {"a": {"type": "object", "properties": {}}}}
    for outside in (_WithOptional, {"type": "object"}, {**closed, "required": []},
                    {**closed, "allOf": [{"required": ["a"]}]}, nested_open):
        assert pick(outside) == "prompt_validate", outside
    assert negotiate(_descriptor(), ask_kinds=frozenset(), explicit_ask_kinds=frozenset(),
                     streaming=False, schema=compile_schema(_WithOptional)) == "native"
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        pick(_WithOptional, prompt_validate=False)
    assert info.value.reason == (
        "native: needs a schema in the provider's strict subset (property 'note' is not "
        "required); prompt_validate: not offered by the driver"
    )


def test_unsupported_when_neither_is_offered() -> None:
    with pytest.raises(StructuredOutputUnsupportedError) as info:
        _negotiate(_descriptor(native=False, prompt_validate=False))
    assert info.value.reason == (
        "native: not offered by the driver; prompt_validate: not offered by the driver"
    )


def test_explicit_kinds_count_as_effective() -> None:
    descriptor = _descriptor(native_hitl=StructuredOutputHITL(plan_review=True))
    assert _negotiate(descriptor, explicit=frozenset({"permission"})) == "prompt_validate"


def test_unknown_ask_kind_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown ask kind"):
        _negotiate(_descriptor(), frozenset({"telepathy"}))


# --- instruct -----------------------------------------------------------------------------------


def test_instruct_contains_schema_and_prompt() -> None:
    compiled = compile_schema(Shape)
    text = instruct(
        "Describe a shape.", compiled, SchemaOptions(name="shape", description="A shape")
    )
    head, prompt = text.rsplit("\n\n", 1)
    assert prompt == "Describe a shape."
    assert "exactly one JSON value" in head and "no Markdown code fences" in head
    assert 'named "shape"' in head and "Description: A shape" in head
    schema_text = head[head.index("{") :]
    assert orjson.loads(schema_text) == compiled.schema


def test_instruct_without_name_or_description() -> None:
    text = instruct("p", compile_schema({"type": "object"}), SchemaOptions())
    assert "named" not in text and "Description:" not in text
    assert text.endswith('{\n  "type": "object"\n}\n\np')


# --- convert ------------------------------------------------------------------------------------


def test_convert_round_trips_nested_dataclasses() -> None:
    value = {
        "name": "sq",
        "center": {"x": 0, "y": 1.5},
        "color": "green",
        "kind": "square",
        "tags": {"a": 1},
        "corners": [{"x": 1, "y": 2}],
    }
    shape = convert(value, Shape)
    assert shape == Shape(
        name="sq",
        center=Point(0.0, 1.5),
        color=Color.GREEN,
        kind="square",
        tags={"a": 1},
        note=None,
        corners=[Point(1.0, 2.0)],
    )
    assert isinstance(shape.center.x, float)


def test_convert_typeddict_returns_a_dict_with_converted_values() -> None:
    movie = convert({"title": "T", "year": 1999, "origin": {"x": 1, "y": 2}}, Movie)
    assert movie == {"title": "T", "year": 1999, "origin": Point(1.0, 2.0)}
    assert convert({"title": "T", "year": 1999}, Movie) == {"title": "T", "year": 1999}


def test_convert_pydantic() -> None:
    base_model: Any = pytest.importorskip("pydantic").BaseModel

    class Model(base_model):  # type: ignore[misc]  # pydantic, if installed
        a: int

    assert convert({"a": 1}, Model) == Model(a=1)
    with pytest.raises(ValueError, match="not a valid Model"):
        convert({"a": "x"}, Model)


def test_convert_plain_types() -> None:
    assert convert("s", str) == "s"
    assert convert(3, float) == 3.0 and isinstance(convert(3, float), float)
    assert convert(3.0, int) == 3 and isinstance(convert(3.0, int), int)
    assert convert(True, bool) is True
    assert convert(None, type(None)) is None
    assert convert([1, 2], list) == [1, 2]
    assert convert(2, Level) is Level.HIGH
    assert convert(Point(1, 2), Point) == Point(1, 2)


@pytest.mark.parametrize(
    ("value", "type_", "message"),
    [
        ({"x": 1}, Point, r"\$: missing field\(s\) for Point: \['y'\]"),
        ({"x": 1, "y": 2, "z": 3}, Point, r"unexpected field\(s\) for Point: \['z'\]"),
        ({"x": "1", "y": 2}, Point, r"\$\.x: expected number, got string"),
        ([1], Point, r"\$: expected object, got array"),
        (True, int, "expected integer, got boolean"),
        (1.5, int, "expected integer, got number"),
        (False, float, "expected number, got boolean"),
        (1, str, "expected string, got integer"),
        (1, bool, "expected boolean, got integer"),
        ("blue", Color, "not a value of Color"),
        (True, Level, "not a value of Level"),
        ([1], Movie, "expected object"),
        ({"title": "t"}, Movie, r"missing field\(s\) for Movie: \['year'\]"),
    ],
)
def test_convert_mismatch(value: Any, type_: type, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        convert(value, type_)


def test_convert_nested_mismatch_names_the_path() -> None:
    value: dict[str, Any] = {"name": "n", "center": {"x": 0, "y": 0}, "color": "red"}
    value |= {"kind": "circle"}
    value |= {"tags": {}, "corners": [{"x": 0, "y": 0}, {"x": 0, "y": "no"}]}
    with pytest.raises(ValueError, match=r"\$\.corners\[1\]\.y: expected number"):
        convert(value, Shape)


def test_convert_literal_and_union_rules() -> None:
    with pytest.raises(ValueError, match="is not one of"):
        convert({**_sample_json(), "mode": "medium"}, Sample)
    with pytest.raises(ValueError, match="matches no member of the union"):
        convert({**_sample_json(), "maybe": 1}, Sample)
    assert convert({**_sample_json(), "mode": 3.0}, Sample).mode == 3


def test_convert_union_keeps_a_value_of_one_of_its_own_types() -> None:
    # The arms were tried in declared order, so float | int made every 1 a 1.0.
    float_or_int: Any = float | int
    int_or_float: Any = int | float
    int_or_bool: Any = int | bool
    assert type(convert(1, float_or_int)) is int
    assert type(convert(1.5, float_or_int)) is float
    assert type(convert(1, int_or_float)) is int
    assert convert(True, int_or_bool) is True


def test_a_dataclass_needing_an_init_var_is_refused_as_a_tool_input() -> None:
    # dataclasses.fields() leaves InitVars out: the schema could never ask for one, and no
    # arguments could build the class.
    @dataclass
    class Scaled:
        a: int
        scale: dataclasses.InitVar[int]

        def __post_init__(self, scale: int) -> None:
            self.a *= scale

    @dataclass
    class Defaulted:
        a: int
        scale: dataclasses.InitVar[int] = 2

        def __post_init__(self, scale: int) -> None:
            self.a *= scale

    # A TypeError, outside the taxonomy (and out of tool.define, which never raises).
    with pytest.raises(InvalidOutputSchemaError, match="InitVar field.*scale"):
        compile_schema(Scaled)
    assert "InitVar field" in str(tool.define("t", "d", lambda v: v, input=Scaled).problem)
    assert compile_schema(Defaulted).schema["properties"] == {"a": {"type": "integer"}}
    assert convert({"a": 3}, Defaulted).a == 6


def test_a_schema_nested_past_the_stack_is_an_invalid_output_schema() -> None:
    # RecursionError escaped agent.run() from 122 levels on, below the output depth the
    # checks allow (128).
    document: dict[str, Any] = {"type": "integer"}
    for _ in range(122):
        document = {"type": "array", "items": document}
    with pytest.raises(InvalidOutputSchemaError, match="nested too deeply") as caught:
        compile_schema({"type": "object", "properties": {"x": document}})
    assert isinstance(caught.value.cause, RecursionError)
    hint: Any = int
    for _ in range(200):
        hint = list[hint]
    with pytest.raises(InvalidOutputSchemaError, match="nested too deeply"):
        compile_schema(hint)


def test_convert_tuple_length() -> None:
    with pytest.raises(ValueError, match="expected 2 items, got 3"):
        convert({**_sample_json(), "pair": [1, "a", 2]}, Sample)


def test_convert_unsupported_type() -> None:
    with pytest.raises(TypeError, match="convert does not support"):
        convert(1, frozenset[int])


def test_convert_construction_error_is_a_value_error() -> None:
    @dataclass
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("n must not be negative")

    with pytest.raises(ValueError, match="cannot build Checked: n must not be negative"):
        convert({"n": -1}, Checked)


# --- property: derived schema, validation and conversion agree ---------------------------------

_floats = st.floats(allow_nan=False, allow_infinity=False)
_leaves = st.builds(Leaf, label=st.text(max_size=8), weight=_floats)
_samples = st.builds(
    Sample,
    count=st.integers(-(2**63), 2**63 - 1),
    ratio=_floats,
    flag=st.booleans(),
    name=st.text(),
    color=st.sampled_from(Color),
    level=st.sampled_from(Level),
    mode=st.sampled_from(["fast", "slow", 3]),
    leaves=st.lists(_leaves, max_size=3),
    scores=st.dictionaries(st.text(max_size=5), st.integers(-1000, 1000), max_size=3),
    pair=st.tuples(st.integers(-5, 5), st.text(max_size=3)),
    rest=st.lists(_floats, max_size=3).map(tuple),
    maybe=st.none() | _leaves,
    anything=_json_values,
)


def _to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def _sample_json() -> dict[str, Any]:
    sample = Sample(1, 0.5, True, "n", Color.RED, Level.LOW, "fast", [], {}, (1, "a"), ())
    result: dict[str, Any] = _to_json(sample)
    return result


_SAMPLE_SCHEMA = compile_schema(Sample)


@given(_samples)
def test_derived_schema_accepts_what_convert_round_trips(sample: Sample) -> None:
    text = orjson.dumps(_to_json(sample)).decode()
    out = _SAMPLE_SCHEMA.validate_text(text, "native")
    assert out.valid, out.errors
    assert convert(out.value, Sample) == sample


@given(_samples, st.sampled_from(["count", "color", "leaves", "pair", "mode"]))
def test_derived_schema_rejects_what_convert_rejects(sample: Sample, key: str) -> None:
    broken = _to_json(sample)
    broken[key] = {"unexpected": "object"}
    out = _SAMPLE_SCHEMA.validate_text(orjson.dumps(broken).decode(), "native")
    assert not out.valid
    with pytest.raises(ValueError):
        convert(out.value, Sample)


# --- run_as -------------------------------------------------------------------------------------


class _Runner:
    def __init__(self, structured: StructuredOutput) -> None:
        self.structured = structured
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run(self, prompt: str, **opts: Any) -> Result:
        self.calls.append((prompt, opts))
        return Result(run_id="r1", structured=self.structured)


def _structured(value: Any, valid: bool = True) -> StructuredOutput:
    errors = () if valid else ("$.x: bad",)
    return StructuredOutput(source="native", valid=valid, value=value, errors=errors)


def test_run_as_passes_the_type_as_schema_and_decodes() -> None:
    runner = _Runner(_structured({"x": 1, "y": 2}))
    point, result = run_as(runner, "where?", Point, timeout=3)
    assert point == Point(1.0, 2.0)
    assert result.run_id == "r1"
    assert runner.calls == [("where?", {"schema": Point, "timeout": 3})]


def test_run_as_explicit_schema_wins() -> None:
    runner = _Runner(_structured({"x": 1, "y": 2}))
    explicit: CompiledSchema = compile_schema(Point)
    run_as(runner, "p", Point, schema=explicit)
    assert runner.calls[0][1]["schema"] is explicit


def test_run_as_decode_errors_propagate() -> None:
    with pytest.raises(DecodeError, match=r"\$\.x: bad"):
        run_as(_Runner(_structured(None, valid=False)), "p", Point)
    with pytest.raises(DecodeError, match=r"cannot decode into .*Point: \$: missing field"):
        run_as(_Runner(_structured({"x": 1})), "p", Point)


def test_decode_into_a_type_the_value_does_not_fit_is_a_decode_error() -> None:
    # It was a bare ValueError, which ``except DecodeError`` let through.
    result = Result(run_id="r1", structured=_structured({"x": 1, "y": 2}))
    with pytest.raises(DecodeError, match=r"into list\[int\]: \$: expected array, got object"):
        result.decode(list[int])
    with pytest.raises(DecodeError) as info:
        Result(run_id="r2", text='{"x": "one", "y": 2}').decode(Point)
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value).endswith("$.x: expected number, got string")



_CHECK_AND_WAIT = """
import sys
from adaptor.schema import compile_schema
schema = compile_schema({"properties": {"name": {"pattern": sys.argv[1]}}})
print("checking", flush=True)
schema.validate_text('{"name": "%s!"}' % ("a" * 64), "native", timeout=2)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_checker_whose_parent_died_mid_check_ends_by_itself(tmp_path: Path) -> None:
    from tests.daemon_harness import identities, processes_with_env

    marker = f"checker-{os.getpid()}-{tmp_path.name}"
    parent = subprocess.Popen(
        [sys.executable, "-c", _CHECK_AND_WAIT, _BACKTRACKS],
        env={**os.environ, "ADAPTOR_TEST_MARK": marker},
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None and parent.stdout.readline() == b"checking\n"
    deadline = time.monotonic() + 30
    checkers: set[tuple[int, int]] = set()
    while not checkers and time.monotonic() < deadline:
        mine = [p for p in processes_with_env("ADAPTOR_TEST_MARK", marker) if p != parent.pid]
        checkers = identities(mine)
        time.sleep(0.01)
    assert checkers, "the checker child never showed up"
    parent.kill()  # mid-check: nobody is left to kill the child or close its input
    parent.wait()
    parent.stdout.close()
    # Its own alarm ends it soon after the parent's limit; without it, it would match for hours.
    while identities([pid for pid, _ in checkers]) and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    assert identities([pid for pid, _ in checkers]) == set()

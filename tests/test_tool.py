"""adaptor.tool: definitions, validation kept for later, rejections and the invoke path."""

from __future__ import annotations

import functools
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

import adaptor
import adaptor._schema_checker
from adaptor import errors, tool


@dataclass
class Query:
    number: int
    label: str = ""


@dataclass
class Issue:
    number: int
    title: str


class QueryDict(TypedDict):
    number: int


class QueryModel(pydantic.BaseModel):
    number: int


def lookup(query: Query) -> Issue:
    if query.number == 404:
        raise tool.reject("not_found", "no such issue")
    if query.number == 500:
        raise RuntimeError("database password is hunter2")
    return Issue(query.number, f"issue {query.number}")


def good(**kw: Any) -> tool.Definition:
    return tool.define("lookup_issue", "Fetch an issue", lookup, input=Query, output=Issue, **kw)


# --- definitions ---------------------------------------------------------------------------


def test_a_valid_definition_describes_itself() -> None:
    d = good(title=" Lookup ", revision="7", read_only=True)
    desc = d.descriptor()
    assert d.problem is None
    assert desc.name == "lookup_issue" and desc.title == "Lookup" and desc.revision == "7"
    assert desc.input_schema["type"] == "object"
    assert desc.input_schema["required"] == ["number"]
    assert desc.output_schema is not None and desc.output_schema["type"] == "object"
    assert desc.annotations == tool.Annotations(read_only=True)
    # detached: editing the copy changes nothing
    desc.input_schema["type"] = "string"  # type: ignore[index]
    assert d.descriptor().input_schema["type"] == "object"


@pytest.mark.parametrize(
    "input_",
    [
        Query,
        QueryDict,
        QueryModel,
        {"type": "object", "properties": {"number": {"type": "integer"}}},
    ],
    ids=["dataclass", "typeddict", "pydantic", "schema"],
)
def test_input_kinds(input_: Any) -> None:
    seen: list[Any] = []

    def handler(value: Any) -> str:
        seen.append(value)
        return "ok"

    d = tool.define("t", "d", handler, input=input_)
    assert d.invoke('{"number": 3}') == '"ok"'
    value = seen[0]
    if input_ is Query:
        assert value == Query(3)
    elif input_ is QueryModel:
        assert value == QueryModel(number=3)
    else:
        assert value == {"number": 3}


def test_no_input_means_no_arguments() -> None:
    d = tool.define("now", "the time", lambda v: {"t": 1, "got": v})
    assert orjson.loads(d.invoke(None)) == {"t": 1, "got": {}}
    assert orjson.loads(d.invoke("")) == {"t": 1, "got": {}}
    with pytest.raises(tool.InvalidInputError) as caught:
        d.invoke({"x": "secret-value"})
    assert "secret-value" not in str(caught.value)
    assert '"x"' in str(caught.value)


async def _async_handler(v: Any) -> None:
    return None


class _AsyncCallable:
    """An object whose __call__ is async: accepted, it failed every call ("a coroutine")."""

    async def __call__(self, v: Any) -> None:
        return None


BAD_DEFINITIONS: list[tuple[str, dict[str, Any]]] = [
    ("empty name", {"name": ""}),
    ("name with space", {"name": "a b"}),
    ("name too long", {"name": "a" * 129}),
    ("non-str name", {"name": 7}),
    ("empty description", {"description": "  "}),
    ("handler not callable", {"handler": 3}),
    ("async handler", {"handler": _async_handler}),
    ("object with an async __call__", {"handler": _AsyncCallable()}),
    # Served, these fail every call with the generic message: refused up front instead.
    ("handler without a parameter", {"handler": lambda: "x"}),
    ("handler with two required parameters", {"handler": lambda a, b: "x"}),
    ("handler with keyword-only input", {"handler": lambda *, v: v}),
    ("read_only and destructive", {"read_only": True, "destructive": True}),
    ("non-bool hint", {"idempotent": 1}),
    ("empty revision", {"revision": " "}),
    ("non-object input", {"input": int}),
    ("schema input not object", {"input": {"type": "string"}}),
    ("schema without type", {"input": {"properties": {}}}),
    ("remote ref", {"input": {"type": "object", "properties": {"a": {"$ref": "https://x/y"}}}}),
    (
        "other draft",
        {"input": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}},
    ),
    ("bad output type", {"output": set}),
    ("malformed schema", {"output": {"type": 12}}),
    ("zero result limit", {"max_result_bytes": 0}),
    ("negative result limit", {"max_result_bytes": -1}),
    ("float result limit", {"max_result_bytes": 1e6}),
    ("bool result limit", {"max_result_bytes": True}),
    ("str result limit", {"max_result_bytes": "1MB"}),
]


@pytest.mark.parametrize("what,change", BAD_DEFINITIONS, ids=[b[0] for b in BAD_DEFINITIONS])
def test_invalid_definitions_are_kept_not_raised(what: str, change: dict[str, Any]) -> None:
    args: dict[str, Any] = {"name": "t", "description": "d", "handler": lambda v: v}
    args.update(change)
    d = tool.define(args.pop("name"), args.pop("description"), args.pop("handler"), **args)
    assert isinstance(d.problem, tool.InvalidDefinitionError)
    assert d.problem.code == "tool.ErrInvalidDefinition"
    with pytest.raises(tool.InvalidDefinitionError):
        d.descriptor()
    with pytest.raises(tool.InvalidDefinitionError):
        d.invoke("{}")
    with pytest.raises(tool.InvalidDefinitionError):
        tool.check_catalogue([d])


class _CallableObject:
    def __call__(self, value: Any) -> Any:
        return value


@pytest.mark.parametrize(
    "handler",
    [lambda v, extra=1: v, lambda *args: args[0], _CallableObject(), functools.partial(
        lambda prefix, v: v, "p"), len],
    ids=["default", "varargs", "callable object", "partial", "builtin"],
)
def test_handlers_callable_with_one_argument_are_accepted(handler: Any) -> None:
    assert tool.define("t", "d", handler).problem is None


def test_schema_problems_join_their_cause() -> None:
    d = tool.define(
        "t", "d", lambda v: v, input={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
    )
    assert isinstance(d.problem, tool.InvalidDefinitionError)
    assert isinstance(d.problem.__cause__, adaptor.InvalidOutputSchemaError)


class Tree(pydantic.BaseModel):
    value: int
    children: list[Tree] = []


def test_a_recursive_models_root_ref_is_named_in_the_refusal() -> None:
    # pydantic writes it as {"$defs": ..., "$ref": ...}: refused as if it described no object.
    problem = tool.define("tree", "d", lambda v: v, input=Tree).problem
    assert isinstance(problem, tool.InvalidDefinitionError)
    assert str(problem).endswith(
        'its root is a "$ref" (as pydantic writes a recursive model); write the root object out, '
        'its "$defs" beside it'
    )


def test_catalogue_rejects_duplicates_and_strangers() -> None:
    a = tool.define("a", "d", lambda v: v)
    with pytest.raises(tool.InvalidDefinitionError, match="two tools"):
        tool.check_catalogue([a, tool.define("a", "other", lambda v: v)])
    with pytest.raises(tool.InvalidDefinitionError, match="tools\\[1\\]"):
        tool.check_catalogue([a, {"name": "b"}])
    assert tool.check_catalogue([a]) == (a,)


def test_names_the_agent_would_read_as_one_are_refused() -> None:
    # Claude Code reads "my.tool" and "my_tool" both as mcp__adaptor__my_tool: the model's calls
    # of one reached the other (found with the real CLI), and the second was unreachable.
    for first, second in (("my.tool", "my_tool"), ("my-tool", "my.tool"), ("a_b", "a-b")):
        tools = [tool.define(first, "d", lambda v: v), tool.define(second, "d", lambda v: v)]
        with pytest.raises(tool.InvalidDefinitionError, match="same name for the agent") as caught:
            tool.check_catalogue(tools)
        assert repr(first) in str(caught.value) and repr(second) in str(caught.value)
    distinct = [tool.define("my.tool", "d", lambda v: v), tool.define("my.tools", "d", lambda v: v)]
    assert tool.check_catalogue(distinct) == tuple(distinct)


@given(st.from_regex(r"[A-Za-z0-9_.-]{1,128}", fullmatch=True))
def test_every_pattern_name_is_valid(name: str) -> None:
    assert tool.define(name, "d", lambda v: v).problem is None


@given(st.text(min_size=1, max_size=140).filter(lambda s: not tool.NAME.fullmatch(s)))
def test_every_other_name_is_invalid(name: str) -> None:
    assert isinstance(tool.define(name, "d", lambda v: v).problem, tool.InvalidDefinitionError)


def test_catalogue_fingerprint_covers_revisions_and_schemas() -> None:
    base = tool.catalogue_fingerprint([good(revision="1")])
    assert base == tool.catalogue_fingerprint([good(revision="1")])
    assert base != tool.catalogue_fingerprint([good(revision="2")])
    assert base != tool.catalogue_fingerprint([good(revision="1", read_only=True)])
    other = tool.define("lookup_issue", "Fetch an issue", lookup, input=QueryDict, revision="1")
    assert base != tool.catalogue_fingerprint([other])
    a, b = tool.define("a", "d", lambda v: v), tool.define("b", "d", lambda v: v)
    assert tool.catalogue_fingerprint([a, b]) == tool.catalogue_fingerprint([b, a])


# --- rejections ----------------------------------------------------------------------------


def test_reject_and_as_rejection() -> None:
    err = tool.reject("not_found", "  no such issue ")
    assert tool.as_rejection(err) == ("not_found", "no such issue")
    try:
        try:
            raise err
        except Exception as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert tool.as_rejection(outer) == ("not_found", "no such issue")
    assert tool.as_rejection(ValueError("x")) is None
    assert tool.as_rejection(None) is None


def _crash_while_handling_a_rejection(_: object) -> None:
    try:
        raise tool.reject("bad", "model-visible rejection")
    except Exception:
        raise RuntimeError("cleanup failed")  # noqa: B904 (its __context__ is the rejection)


def _a_rejection_beside_a_crash(_: object) -> None:
    raise ExceptionGroup("tasks", [RuntimeError("crash"), tool.reject("bad", "model-visible rejection")])


@pytest.mark.parametrize("handler", [_crash_while_handling_a_rejection, _a_rejection_beside_a_crash])
def test_a_crash_is_never_taken_for_a_rejection_it_caught_or_sits_beside(
    handler: Callable[[object], None], caplog: pytest.LogCaptureFixture
) -> None:
    # A handler that caught a rejection and then crashed (the rejection its implicit
    # __context__), or whose group held one beside a crash, sent the model the rejection's
    # message and logged nothing: the crash went unseen.  Only an explicit cause counts.
    with caplog.at_level(logging.WARNING, logger="adaptor.tool"):
        outcome = tool.define("t", "d", handler).call({})
    assert (outcome.is_error, outcome.text) == (True, tool.GENERIC_FAILURE)
    [logged] = [r for r in caplog.records if r.name == "adaptor.tool"]
    assert logged.exc_info is not None and logged.exc_info[0] in (RuntimeError, ExceptionGroup)
    with pytest.raises(BaseException) as raised:
        handler(None)
    assert tool.as_rejection(raised.value) is None


@pytest.mark.parametrize(
    "code,message,expected",
    [
        ("", "m", ("rejected", "m")),
        ("bad code", "m", ("rejected", "m")),
        ("x" * 65, "m", ("rejected", "m")),
        ("ok", "", ("ok", "tool request rejected")),
        ("ok", "é" * 2049, ("ok", "tool request rejected")),
        (3, None, ("rejected", "tool request rejected")),
    ],
)
def test_reject_normalizes(code: Any, message: Any, expected: tuple[str, str]) -> None:
    assert tool.as_rejection(tool.reject(code, message)) == expected


def test_rejections_cannot_be_forged() -> None:
    class LookAlike(Exception):
        code = "not_found"
        message = "forged"
        _marker = object()

    assert tool.as_rejection(LookAlike("forged")) is None
    with pytest.raises(TypeError):

        class Sub(type(tool.reject("a", "b"))):  # type: ignore[misc]
            pass

    with pytest.raises(TypeError):
        type(tool.reject("a", "b"))("code", "message", object())
    bare: Any = type(tool.reject("a", "b")).__new__(type(tool.reject("a", "b")))
    bare.code, bare.message = "x", "forged"
    assert tool.as_rejection(bare) is None
    assert "forged" not in tool.define("t", "d", _raiser(LookAlike("forged"))).call({}).text


def _raiser(exc: BaseException) -> Any:
    def handler(value: Any) -> Any:
        raise exc

    return handler


# --- the invoke path -----------------------------------------------------------------------


def test_invoke_returns_json_and_call_the_model_view() -> None:
    d = good()
    assert orjson.loads(d.invoke('{"number": 1}')) == {"number": 1, "title": "issue 1"}
    outcome = d.call({"number": 2})
    assert not outcome.is_error
    assert outcome.structured == {"number": 2, "title": "issue 2"}
    assert orjson.loads(outcome.text) == outcome.structured


def test_string_results_reach_the_model_as_text() -> None:
    outcome = tool.define("t", "d", lambda v: "plain words").call(None)
    assert outcome.text == "plain words" and outcome.structured is None


SECRET = "s3cr3t-value-xyz"


@pytest.mark.parametrize(
    "arguments,fragment",
    [
        ("{not json", "invalid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ('"just a string"', "must be a JSON object"),
        ({"number": SECRET}, 'wrong type at "$.number": expected integer'),
        ({"label": SECRET}, 'missing required field "number"'),
        ({"number": 1, "extra_" + "x" * 100: SECRET}, "invalid field"),
        # Valid JSON objects: "invalid JSON arguments" and "expected number" sent the model
        # looking for the wrong mistake.
        ('{"number": 123456789012345678901234567890}', "cannot be read exactly"),
        ('{"number": 1e400}', "cannot be read exactly"),
        # As the gateway hands them over, parsed by the MCP SDK.
        ({"number": 123456789012345678901234567890}, "cannot be read exactly"),
        ({"number": float("inf")}, "cannot be read exactly"),
    ],
)
def test_invalid_input_is_safe(arguments: Any, fragment: str) -> None:
    d = good()
    with pytest.raises(tool.InvalidInputError) as caught:
        d.invoke(arguments)
    message = str(caught.value)
    assert fragment in message
    assert SECRET not in message
    assert tool.as_rejection(caught.value) == ("invalid_input", message)
    outcome = d.call(arguments)
    assert outcome.is_error and outcome.text == message and SECRET not in outcome.text


def test_arguments_nested_beyond_pythons_stack_are_invalid_input() -> None:
    # jsonschema follows the nesting with Python's stack: a bare RecursionError reached the
    # host's log as a tool failure.
    tree = {"type": "array", "items": {"$ref": "#/$defs/tree"}}
    d = tool.define("t", "d", lambda v: "ok", input={
        "type": "object", "properties": {"tree": tree}, "$defs": {"tree": tree},
    })
    arguments = '{"tree": ' + "[" * 1000 + "]" * 1000 + "}"
    with pytest.raises(tool.InvalidInputError, match="the arguments nest too deeply"):
        d.invoke(arguments)
    outcome = d.call(arguments)
    assert outcome.is_error and "nest too deeply" in outcome.text
    assert d.invoke('{"tree": [[], [[]]]}') == '"ok"'


def test_output_nested_beyond_pythons_stack_is_invalid_output() -> None:
    deep: list[Any] = []
    for _ in range(240):  # orjson writes it; jsonschema's recursion through the tree does not
        deep = [deep]
    # Several subschemas per level: checked in a fresh child process (the schema refers), the
    # stack starts shallow, and one per level would fit in it.
    tree = {"anyOf": [{"type": "array", "items": {"allOf": [{"$ref": "#/$defs/tree"}]}}]}
    d = tool.define("t", "d", lambda v: {"tree": deep}, output={
        "type": "object", "properties": {"tree": tree}, "$defs": {"tree": tree},
    })
    with pytest.raises(tool.InvalidOutputError, match="nested too deeply to check"):
        d.invoke(None)


def test_echoed_field_names_are_bounded_and_escaped() -> None:
    d = good()
    name = "\n" + "é" * 100
    with pytest.raises(tool.InvalidInputError) as caught:
        d.invoke({"number": 1, name: 1})
    message = str(caught.value)
    assert "\n" not in message
    assert len(message) < 200


def test_input_that_cannot_build_the_type_is_safe() -> None:
    @dataclass
    class Positive:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError(f"{self.n} is negative")

    d = tool.define("t", "d", lambda v: v.n, input=Positive)
    with pytest.raises(tool.InvalidInputError) as caught:
        d.invoke({"n": -987654})
    assert "-987654" not in str(caught.value)


def test_invalid_output(caplog: pytest.LogCaptureFixture) -> None:
    d = tool.define("t", "d", lambda v: {"number": "x", "title": SECRET}, output=Issue)
    with pytest.raises(tool.InvalidOutputError) as caught:
        d.invoke({})
    assert SECRET not in str(caught.value)
    with caplog.at_level(logging.WARNING, logger="adaptor.tool"):
        outcome = d.call({})
    assert outcome.is_error and outcome.text == tool.GENERIC_FAILURE
    unencodable = tool.define("t", "d", lambda v: {1, 2})
    with pytest.raises(tool.InvalidOutputError):
        unencodable.invoke({})
    assert unencodable.call({}).text == tool.GENERIC_FAILURE


@dataclass
class _Stats:
    mean: float
    counts: list[int]


@pytest.mark.parametrize(
    ("result", "where"),
    [(float("nan"), "/"), ({"mean": float("inf")}, "/mean"),
     ([1.0, (2.0, float("-inf"))], "/1/1"), (_Stats(float("nan"), [1, None]), "/mean")],  # type: ignore[list-item]
    ids=["nan", "inf in a dict", "-inf in a tuple in a list", "nan in a dataclass"],
)
def test_non_finite_floats_are_invalid_output_not_null(result: Any, where: str) -> None:
    # orjson writes them as null: the model was told "mean": null, the handler's value lost.
    d = tool.define("t", "d", lambda v: result)
    with pytest.raises(tool.InvalidOutputError, match=r"which JSON cannot hold, at " + re.escape(where) + "$"):
        d.invoke({})
    assert d.call({}).text == tool.GENERIC_FAILURE


def test_nulls_and_finite_floats_still_encode() -> None:
    value = {"a": None, "b": [1.5, None, -0.0], "c": _Stats(2.5, [])}
    assert orjson.loads(tool.define("t", "d", lambda v: value).invoke({})) == {
        "a": None, "b": [1.5, None, -0.0], "c": {"mean": 2.5, "counts": []}}


def test_pydantic_results_encode() -> None:
    d = tool.define("t", "d", lambda v: QueryModel(number=4), output=QueryModel)
    assert orjson.loads(d.invoke({})) == {"number": 4}


class _AliasedIssue(pydantic.BaseModel):
    issue_title: str = pydantic.Field(alias="issueTitle")


def test_a_pydantic_result_is_written_under_the_names_its_schema_has() -> None:
    # The output schema names the aliases (model_json_schema), the result was dumped by field
    # name: a handler returning the very model failed every call ("fails its output schema").
    d = tool.define("t", "d", lambda v: _AliasedIssue(issueTitle="slow build"), output=_AliasedIssue)
    assert d.problem is None
    schema = d.descriptor().output_schema
    assert schema is not None and schema["required"] == ["issueTitle"]
    outcome = d.call({})
    assert not outcome.is_error, outcome.text
    assert orjson.loads(outcome.text) == {"issueTitle": "slow build"}


def test_handler_exceptions_become_the_generic_message() -> None:
    outcome = good().call({"number": 500})
    assert outcome.is_error
    assert outcome.text == tool.GENERIC_FAILURE
    assert "hunter2" not in outcome.text
    with pytest.raises(RuntimeError, match="hunter2"):
        good().invoke({"number": 500})


def test_rejections_reach_the_model() -> None:
    outcome = good().call({"number": 404})
    assert outcome.is_error and outcome.text == "no such issue"


# --- the result size limit ----------------------------------------------------------------------


def _returning(result: Any, **kw: Any) -> tool.Definition:
    return tool.define("big", "d", lambda v: result, **kw)


def _assert_too_big(outcome: tool.CallOutcome, size: int, limit: int) -> None:
    assert outcome.is_error and outcome.structured is None
    assert outcome.text == (
        f"the tool's result was {size} bytes, over this tool's limit of {limit} bytes, so it was "
        "not sent; call the tool again asking for less (a narrower query, or one page at a time)"
    )


def test_a_result_of_exactly_the_limit_is_sent_one_byte_more_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _returning("x" * 100, max_result_bytes=100).call(None).text == "x" * 100
    with caplog.at_level(logging.WARNING, logger="adaptor.tool"):
        outcome = _returning(SECRET + "x" * (101 - len(SECRET)), max_result_bytes=100).call(None)
    _assert_too_big(outcome, 101, 100)
    # The log names the tool and the sizes; neither it nor the model sees the result.
    assert [r.getMessage() for r in caplog.records] == [
        "tool 'big' returned 101 bytes, over its limit of 100 bytes: the model got an error "
        "result instead"
    ]
    assert SECRET not in caplog.text and SECRET not in outcome.text


def test_the_limit_counts_utf8_bytes_not_characters() -> None:
    text = "é€😀" * 10  # 2 + 3 + 4 bytes each: 90 bytes in 30 characters
    assert _returning(text, max_result_bytes=90).call(None).text == text
    _assert_too_big(_returning(text, max_result_bytes=89).call(None), 90, 89)


def test_the_limit_counts_json_results_as_sent() -> None:
    value = [{"a": "ü"}, 1.5, None]
    sent = orjson.dumps(value)  # what the text holds: compact JSON, UTF-8
    assert tool.define("t", "d", lambda v: value, max_result_bytes=len(sent)).call(None).text \
        == sent.decode()
    _assert_too_big(_returning(value, max_result_bytes=len(sent) - 1).call(None), len(sent),
                    len(sent) - 1)


def test_structured_content_counts_too() -> None:
    # An object output travels twice: as text and as structured content.
    size = len(orjson.dumps({"number": 1, "title": "issue 1"}))
    outcome = good(max_result_bytes=2 * size).call({"number": 1})
    assert not outcome.is_error and outcome.structured == {"number": 1, "title": "issue 1"}
    _assert_too_big(good(max_result_bytes=2 * size - 1).call({"number": 1}), 2 * size,
                    2 * size - 1)


def test_the_default_limit_is_one_mib() -> None:
    assert tool.MAX_RESULT_BYTES == 1_048_576
    assert _returning("").max_result_bytes == tool.MAX_RESULT_BYTES
    assert not _returning("x" * tool.MAX_RESULT_BYTES).call(None).is_error
    _assert_too_big(_returning("x" * (tool.MAX_RESULT_BYTES + 1)).call(None),
                    tool.MAX_RESULT_BYTES + 1, tool.MAX_RESULT_BYTES)


def test_invoke_is_not_limited() -> None:
    # The limit guards what the model is sent; a host calling invoke itself gets the result.
    assert _returning("x" * 101, max_result_bytes=100).invoke(None) == '"' + "x" * 101 + '"'


# --- schemas costly to check -----------------------------------------------------------------

# The classic pattern that backtracks catastrophically: forty word characters and a "!" take
# hours of Python's re, which holds the GIL all along.
BACKTRACKS = r"^(\w+\s?)+$"
WORDS = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "pattern": BACKTRACKS},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
    },
    "required": ["text"],
    "additionalProperties": False,
}
SLOW_TEXT = "a" * 40 + "!"


def run_alone(tmp_path: Path, script: str) -> str:
    """Run ``script`` in a fresh Python and return its output.

    A check that held the GIL would freeze every thread of the process it runs in, this test's
    watchdog included; from another process it can still be seen, and ended.
    """
    path = tmp_path / "scenario.py"
    path.write_text(textwrap.dedent(script))
    try:
        done = subprocess.run(
            [sys.executable, str(path)], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process froze while checking (or the check was never cut off)")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_arguments_too_costly_to_check_do_not_stop_the_process(tmp_path: Path) -> None:
    out = run_alone(tmp_path, f"""
        import dataclasses, json, sys, threading, time
        from adaptor import tool

        words = tool.define("words", "d", lambda v: v["text"], input={WORDS!r})
        words = dataclasses.replace(words, _check_limit=1.0)
        outcomes = {{}}

        def slow() -> None:
            outcomes["slow"] = words.call({{"text": {SLOW_TEXT!r}}})

        def waiting_on_a_checker(thread: threading.Thread) -> bool:
            frame = sys._current_frames().get(thread.ident)
            while frame is not None:
                if frame.f_code.co_name == "_read" and "_schema_checker" in frame.f_code.co_filename:
                    return True
                frame = frame.f_back
            return False

        judged = threading.Thread(target=slow)
        judged.start()
        # This thread runs on while the slow arguments are being judged...
        while not waiting_on_a_checker(judged):
            assert judged.is_alive(), "judged without a schema checker"
            time.sleep(0.01)
        # ...and so does another call of the same tool.
        outcomes["cheap"] = words.call({{"text": "two words"}})
        judged.join()
        print(json.dumps({{k: dataclasses.asdict(v) for k, v in outcomes.items()}}))
    """)
    outcomes = orjson.loads(out)
    assert outcomes["cheap"] == {"text": "two words", "is_error": False, "structured": None}
    assert outcomes["slow"] == {
        "text": "the arguments could not be checked against the tool's input schema within 1s; "
        "send simpler arguments and retry",
        "is_error": True,
        "structured": None,
    }


def test_output_too_costly_to_check_is_invalid_output(tmp_path: Path) -> None:
    out = run_alone(tmp_path, f"""
        import dataclasses, json
        from adaptor import tool

        words = tool.define("words", "d", lambda v: {{"text": {SLOW_TEXT!r}}}, output={WORDS!r})
        words = dataclasses.replace(words, _check_limit=1.0)
        try:
            words.invoke(None)
        except tool.InvalidOutputError as exc:
            print(json.dumps({{"error": str(exc), "call": dataclasses.asdict(words.call(None))}}))
    """)
    seen = orjson.loads(out)
    assert seen["error"] == (
        "tool 'words' returned output that could not be checked against its output schema "
        "within 1s (a pattern that backtracks catastrophically, or subschemas applied again "
        "and again)"
    )
    assert seen["call"] == {"text": tool.GENERIC_FAILURE, "is_error": True, "structured": None}


@pytest.mark.parametrize("where", ["checker", "in process"])
@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"text": "two words", "code": "ABC"}, None),
        ({"text": "not-a-word"}, 'invalid value at "$.text" (pattern); check the tool\'s '
         "input schema and retry"),
        ({"text": "ok", "code": SECRET}, 'invalid value at "$.code" (pattern); check the '
         "tool's input schema and retry"),
        ({"code": "ABC"}, 'missing required field "text" at "$"; add it and retry'),
        ({"text": 7}, 'wrong type at "$.text": expected string; fix the type and retry'),
        ({"text": "ok", SECRET: 1}, f'invalid field "{SECRET}"; use a declared field name '
         "and retry"),
    ],
)
def test_schemas_with_patterns_judge_calls_as_before(
    monkeypatch: pytest.MonkeyPatch, where: str, arguments: dict[str, Any], expected: str | None
) -> None:
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    if where == "in process":  # no checker can start: the tool validates in process
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    echo = tool.define("echo", "d", lambda v: v, input=WORDS, output=WORDS)
    try:
        if expected is None:
            assert orjson.loads(echo.invoke(arguments)) == arguments
        else:
            with pytest.raises(tool.InvalidInputError) as caught:
                echo.invoke(arguments)
            assert str(caught.value) == expected
        # A checker served the call, and was kept for the next; none could start in process.
        assert len(adaptor._schema_checker._idle) == (where == "checker")
    finally:
        adaptor._schema_checker._close_idle()


@pytest.mark.parametrize("where", ["checker", "in process"])
def test_output_checked_with_patterns_fails_as_before(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    if where == "in process":
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    d = tool.define("t", "d", lambda v: {"text": "ok", "code": SECRET}, output=WORDS)
    try:
        with pytest.raises(tool.InvalidOutputError) as caught:
            d.invoke(None)
    finally:
        adaptor._schema_checker._close_idle()
    assert str(caught.value) == (
        "tool 't' returned output that fails its output schema at $.code (pattern)"
    )


def test_cheap_schemas_are_checked_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adaptor._schema_checker, "_idle", [])
    d = good()
    assert orjson.loads(d.invoke({"number": 3})) == {"number": 3, "title": "issue 3"}
    with pytest.raises(tool.InvalidInputError, match="wrong type"):
        d.invoke({"number": "3"})
    assert adaptor._schema_checker._idle == []  # no checker was started: no IPC per call


@pytest.mark.parametrize(
    ("schema", "costly"),
    [
        ({"type": "object", "properties": {"pattern": {"type": "string"}}}, False),
        ({"type": "string", "enum": [{"pattern": "x"}], "format": "email"}, False),
        ({"type": "object", "$defs": {"uniqueItems": {"type": "array"}}}, False),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}, True),
        ({"type": "object", "patternProperties": {"^x": {}}}, True),
        ({"type": "array", "items": {"anyOf": [{"uniqueItems": True}]}}, True),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}}, True),
    ],
)
def test_which_schemas_are_costly_to_check(schema: dict[str, Any], costly: bool) -> None:
    assert adaptor._schema_checker.costly(schema) is costly


def test_errors_are_in_the_taxonomy() -> None:
    for cls in (tool.InvalidDefinitionError, tool.InvalidInputError, tool.InvalidOutputError):
        rebuilt = errors.from_wire(cls("m").to_wire())
        assert type(rebuilt) is cls
    assert errors.exit_code_for(tool.InvalidDefinitionError()) == 3

"""What a hostile model answer does to a run through the real CLIs (and the daemon).

A provider, or a model an injected prompt steers, can answer anything: text no CLI escapes,
text that looks like our own protocol, tool calls to tools that do not exist.  Each test here
makes the mock model server answer that and checks what the user gets.  Marked slow like the
other real-CLI tests; skipped with a visible reason when the pinned CLIs are not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

import adaptor
from adaptor import _nesting
from adaptor.drivers import claude
from adaptor.drivers._lines import decode
from tests.drivers.mock_anthropic import AnthropicMock

# A run the mock answers at once; generous, and finite so a hang fails instead of waiting.
RUN_TIMEOUT = 90.0


def test_lone_surrogate_escapes_decode_as_replacement_characters() -> None:
    # Valid JSON that orjson refuses: a lone surrogate escape (kept pairs stay pairs, and an
    # escaped backslash before "ud800" is no escape at all).
    line = rb'{"a": "x\ud800y", "b": "\ud83d\ude00\udc00", "c": "\\ud800"}'
    assert decode(line).event == {"a": "x\ufffdy", "b": "\U0001f600\ufffd", "c": "\\ud800"}
    assert decode(b'{"a": "\\ud800\xff"}').kind == "malformed"  # not UTF-8: no JSON at all
    assert decode(rb'{"a": "\ud800"').kind == "malformed"


def nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture
def deep_recursion() -> Iterator[None]:
    """Room for the mock server's json.dumps of a value 1,100 levels deep."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))
    yield
    sys.setrecursionlimit(limit)


def test_a_line_deeper_than_orjson_reads_is_cut_there() -> None:
    # Brackets inside strings are no nesting; the note is the one the daemon's records use.
    line = b'{"s": "[[{\\"", "v": ' + b"[" * 1100 + b'1, {"k": "]]"}' + b"]" * 1100 + b"}"
    event = decode(line).event
    assert event is not None and event["s"] == '[[{"'
    value = event["v"]
    assert _nesting.deeper_than(value, 1022) and not _nesting.deeper_than(value, 1023)
    for _ in range(1023):
        value = value[0]
    assert value == "<nested deeper than 1024 levels: not kept>"


@pytest.mark.slow
def test_claude_answer_with_a_lone_surrogate_ends_the_run(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str
) -> None:
    # claude (Node) writes the model's lone surrogate as the JSON escape "\ud800"; its result
    # line was unparsable to us, so the run never saw its end and waited for the deadline.
    anthropic.configure(text="broken \ud800 text")
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace) as agent:
        result = agent.run("say something broken", timeout=RUN_TIMEOUT)
    assert result.text == "broken \ufffd text"


@pytest.mark.slow
def test_claude_structured_output_nested_past_the_parsers_limit_is_invalid_output(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    deep_recursion: None,
) -> None:
    # The result line carries the structured output: nested deeper than orjson reads, it was
    # malformed, so the run never saw its end and waited on the kept process until its deadline.
    anthropic.configure(structured={"name": "x", "count": 1, "extra": nested(1100)})
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "count": {"type": "integer"}}}
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace) as agent:
        with pytest.raises(adaptor.PolicyViolationError, match="deeper than 128 levels"):
            agent.run("answer deeply", schema=schema, timeout=RUN_TIMEOUT)


@pytest.mark.slow
def test_claude_tool_arguments_nested_past_the_parsers_limit_are_cut(
    claude_config: Callable[..., claude.Config], anthropic: AnthropicMock, workspace: str,
    deep_recursion: None,
) -> None:
    # Such a tool call made the assistant line malformed: the run failed as claude's protocol
    # error ("printed a malformed stream") though the CLI did nothing wrong.
    anthropic.configure(tool=("NoSuchTool", {"x": nested(1100)}))
    with adaptor.Agent(claude.Driver(claude_config()), workspace=workspace) as agent:
        result = agent.run("call a tool deeply", timeout=RUN_TIMEOUT)
    assert "No such tool available: NoSuchTool" in result.text
    assert "protocol" not in result.metadata
    (call,) = [item for item in result.transcript() if item.kind == "tool_call"]
    assert _nesting.deeper_than(call.input, 1000)

"""What a hostile model answer does to a run through the real CLIs (and the daemon).

A provider, or a model an injected prompt steers, can answer anything: text no CLI escapes,
text that looks like our own protocol, tool calls to tools that do not exist.  Each test here
makes the mock model server answer that and checks what the user gets.  Marked slow like the
other real-CLI tests; skipped with a visible reason when the pinned CLIs are not installed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import adaptor
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

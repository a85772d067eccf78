"""The redaction of secret values: raw, and as JSON text holding them shows them."""

from __future__ import annotations

import itertools
import json
from typing import Any, NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from adaptor._redact import MIN_SECRET_LENGTH, REDACTED, Redactor, StreamRedactor, _vocabulary
from adaptor.events import TextDelta, Thinking, ToolCall

# Every character the redacted texts below are made of: a secret (in each of its forms) with
# one character outside this set can only be found in them if a copy was missed.
_REDACTED_TEXT_CHARS = set('{}":,[] 1valuesitraw') | set(REDACTED)


def _findable_only_if_missed(secret: str) -> bool:
    forms = [secret, *(json.dumps(secret, ensure_ascii=a)[1:-1] for a in (False, True))]
    return all(set(form) - _REDACTED_TEXT_CHARS for form in forms)


_secrets = (
    st.text(min_size=MIN_SECRET_LENGTH, max_size=40)
    .filter(_findable_only_if_missed)
    .filter(lambda s: s not in _vocabulary())  # (those are no secrets: see below)
)


def test_a_secret_is_replaced_raw_and_inside_json_text() -> None:
    secret = 'pa"ss\\wörd\tsk-0123456789'
    redactor = Redactor([secret])
    payload = {"echo": secret, "nested": [secret]}
    texts = [
        f"the value {secret} printed",
        json.dumps(payload),  # \u00f6 for the umlaut
        json.dumps(payload, ensure_ascii=False),
    ]
    for text in texts:
        redacted = redactor.text(text)
        assert "sk-0123456789" not in redacted, redacted
        assert REDACTED in redacted
    assert redactor.value({"k": texts}) == {"k": [redactor.text(t) for t in texts]}


def test_values_too_short_to_be_credentials_are_left_alone() -> None:
    short = "x" * (MIN_SECRET_LENGTH - 1)
    assert not Redactor([short])
    assert Redactor([short]).value({"a": short}) == {"a": short}


def test_a_value_that_is_a_word_of_the_sdks_records_is_no_secret() -> None:
    # Such a value (an env setting "result", "question", "transcript") was replaced in every
    # record, in the SDK's own words too: a verdict lost its "result", an approval of kind
    # "question" became one of kind "<redacted>".  Every record shows the word anyway.
    words = ["result", "question", "permission", "script", "verdict", "adaptord.verdict/1", "ErrAgentFailed"]
    secret = "sk-real-0123456789"
    redactor = Redactor([*words, "transcript", secret])
    assert redactor.secrets == (secret,)
    assert redactor.text(f"result: {secret}") == f"result: {REDACTED}"
    assert not Redactor(words)


def test_keys_are_names_never_replaced() -> None:
    secret = "sk-key-0123456789"
    redactor = Redactor([secret])
    assert redactor.value({secret: secret, "a": [{secret: 1}]}) == {secret: REDACTED, "a": [{secret: 1}]}
    deep: Any = {secret: secret}
    for _ in range(5000):
        deep = [deep]
    node = redactor.value(deep)
    for _ in range(5000):
        (node,) = node
    assert node == {secret: REDACTED}


def test_a_secret_the_model_wrote_escaped_is_found_in_a_line_that_escapes_it_again() -> None:
    # A model copying a key out of a JSON file writes it escaped ("/" as "\\/", a quote as
    # \\"); the CLI's own JSON line escapes that again, and only the forms escaped once were
    # looked for: result.text showed <redacted>, raw() stdout and process.stdout the key.
    secret = 'wJalrXUtnFEMI/K7MDENG/bPx"RfiCYEXAMPLEKEY'
    redactor = Redactor([secret])
    once = json.dumps(secret)[1:-1]
    for written in (once, once.replace("/", "\\/"), json.dumps(secret, ensure_ascii=True)[1:-1]):
        for line in (json.dumps({"text": f"key: {written}"}), json.dumps({"text": written}, ensure_ascii=True)):
            redacted = redactor.text(line)
            assert "K7MDENG" not in redacted and REDACTED in redacted, (written, line, redacted)


def test_a_secret_containing_another_is_replaced_whole() -> None:
    inner = "sk-inner-123"
    outer = f"{inner}-and-more"
    assert Redactor([inner, outer]).text(f"[{outer}]") == f"[{REDACTED}]"


@given(secret=_secrets, ascii_only=st.booleans())
def test_no_json_encoding_of_a_secret_survives(secret: str, ascii_only: bool) -> None:
    redactor = Redactor([secret])
    text = json.dumps({"value": secret, "list": [1, secret]}, ensure_ascii=ascii_only)
    redacted = redactor.text(text)
    assert json.dumps(secret, ensure_ascii=ascii_only)[1:-1] not in redacted
    assert secret not in redactor.text(f"raw: {secret}")


def test_a_secret_of_several_lines_goes_from_each_line_printed_alone() -> None:
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG\r\n  9w0BAQEFAASC  \nab\n-----END PRIVATE KEY-----"
    redactor = Redactor([key])
    # The command driver makes one event of each line an agent prints.
    assert redactor.text("MIIEvQIBADANBgkqhkiG") == REDACTED
    assert redactor.text("9w0BAQEFAASC") == REDACTED
    assert redactor.text("line: ab") == "line: ab"  # too short to be told from other text
    assert redactor.text(key) == REDACTED


def test_the_json_escapes_of_other_serializers_are_replaced_too() -> None:
    redactor = Redactor(["contraseña/t&m<x>"])
    for text in (
        '"contrase\\u00F1a/t&m<x>"',  # upper-case hex (Jackson)
        '"contraseña\\/t&m<x>"',  # escaped slash (PHP)
        '"contraseña/t\\u0026m\\u003cx\\u003e"',  # HTML-safe (Go's encoding/json)
        '"contrase\\u00f1a\\/t\\u0026m\\u003cx\\u003e"',
    ):
        assert redactor.text(text) == f'"{REDACTED}"', text


def test_go_escapes_line_separators_where_it_writes_other_characters_as_they_are() -> None:
    # json.Marshal with SetEscapeHTML(false) still writes U+2028 and U+2029 as \u escapes.
    redactor = Redactor(["line\u2028s\u00e9p-secret\u2029<x>"])
    for text in ('"line\\u2028s\u00e9p-secret\\u2029<x>"', '"line\\u2028s\u00e9p-secret\\u2029\\u003cx\\u003e"'):
        assert redactor.text(text) == f'"{REDACTED}"', text


def test_a_secret_comes_back_in_either_unicode_normalization() -> None:
    # A tool or a filesystem (macOS's) may give an accented value back decomposed, "u" and a
    # combining mark for "\u00fc", or composed when it was given decomposed.
    composed, decomposed = "Z\u00fcrich-geheim", "Zu\u0308rich-geheim"
    for secret, printed in ((composed, decomposed), (decomposed, composed)):
        redactor = Redactor([secret])
        assert redactor.text(f"key={printed}") == f"key={REDACTED}"
        assert redactor.text(json.dumps(printed)) == f'"{REDACTED}"'


def test_values_nested_deeper_than_the_stack_are_redacted() -> None:
    secret = "sk-deep-0123456789"
    deep: Any = [secret, {"k": secret}]
    for _ in range(5000):
        deep = [deep]
    event = ToolCall(id="c1", name="Write", args={"deep": deep, "plain": secret})
    redacted = Redactor([secret]).value(event)
    assert redacted.args is not None and redacted.args["plain"] == REDACTED
    node = redacted.args["deep"]
    for _ in range(5000):
        (node,) = node
    assert node == [REDACTED, {"k": REDACTED}]


def test_a_value_holding_itself_is_redacted_without_walking_for_ever() -> None:
    # A handler's exception carrying a dict that holds itself: the walk went round the cycle
    # for ever, its copy growing until memory ran out, and the run never ended.
    secret = "sk-cycle-0123456789"
    cyclic: dict[str, Any] = {"key": secret}
    cyclic["me"] = cyclic
    redacted = Redactor([secret]).value(("refused", cyclic))
    assert redacted[1]["key"] == REDACTED and isinstance(redacted[1]["me"], str)
    assert secret not in repr(redacted)


class _Shape(NamedTuple):
    key: str


class _Slotted:
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"_Slotted(key={self.key!r})"


def test_an_object_the_walk_cannot_rebuild_is_replaced_when_it_shows_a_secret() -> None:
    # A named tuple, an object of a class of one's own and a dict key were kept as they were:
    # repr() of an error holding one showed the key.
    secret = "sk-object-0123456789"
    redactor = Redactor([secret])
    for value in (_Shape(secret), _Slotted(secret), {_Shape(secret): 1}):
        assert secret not in repr(redactor.value(("refused", value))), value
    harmless = (_Shape("notes.txt"), _Slotted("x"))
    assert redactor.value(harmless) is harmless  # nothing shown to hide: kept as it is
    # Bytes, and a key of a dict the walk copies without recursion (a cycle), showed it too.
    cyclic: dict[Any, Any] = {}
    cyclic[(secret,)] = cyclic
    for shown in (b"key " + secret.encode(), cyclic):
        assert secret not in repr(redactor.value(("refused", shown))), shown


def test_an_object_showing_no_data_of_its_own_is_never_replaced() -> None:
    # A live approval's responder shows only its class and address; an env value "adaptor"
    # (six letters: a secret then; now a word of the records, see above, so "roboto" here)
    # turned it into a string, and approve() on the event then failed.
    from adaptor.approval import Responder
    from adaptor.events import ApprovalRequest

    responder = Responder("permission", ("approve",))
    event = ApprovalRequest(id="a1", run_id="r1", kind="permission", title="roboto wants to write", _responder=responder)
    redacted = Redactor(["roboto"]).value(event)
    assert redacted._responder is responder and redacted.title == f"{REDACTED} wants to write"


def test_a_value_without_secrets_is_handed_back_as_it_is() -> None:
    # The run pipeline redacts every event: one holding no secret must cost no copy.
    event = ToolCall(id="c1", name="Write", args={"path": "notes.txt", "lines": ["x", ("y", 1)]})
    assert Redactor(["sk-not-in-it-123"]).value(event) is event
    changed = Redactor(["notes.txt"]).value(event)
    assert changed is not event and changed.args == {"path": REDACTED, "lines": ["x", ("y", 1)]}
    assert event.args == {"path": "notes.txt", "lines": ["x", ("y", 1)]}  # the original is untouched


_SECRET = "sk-ant-api03-Zq81xVt0KEY"


def _cuts(text: str, points: list[int]) -> list[str]:
    at = sorted({p % (len(text) + 1) for p in points} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(at) if b > a]


@given(
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    times=st.integers(1, 3),
    points=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_a_secret_split_across_a_streams_deltas_is_redacted_as_in_the_whole(
    before: str, after: str, times: int, points: list[int]
) -> None:
    # Each delta was redacted alone: a model writing out a key token by token showed it whole
    # once a consumer joined the deltas.
    redactor = Redactor([_SECRET])
    streams = StreamRedactor(redactor)
    whole = before + (_SECRET + " and ") * times + after
    shown: list[Any] = []
    for piece in _cuts(whole, points):
        shown += streams.events(TextDelta(message_id="m", text=piece))
    shown += streams.events(TextDelta(message_id="m", phase="end"))
    assert shown[-1] == TextDelta(message_id="m", phase="end")
    joined = "".join(_texts(shown[:-1]))
    assert joined == redactor.text(whole) and _SECRET not in joined
    assert all(_texts(shown[:-1]))  # no empty content delta


def _texts(shown: list[Any], field: str = "text") -> list[str]:
    return [getattr(e, field) for e in shown]


def test_a_secret_split_across_a_subagents_delta_updates_is_redacted() -> None:
    # A driver of one's own streaming a subagent's output: its delta updates were redacted one
    # by one, so a key in five pieces was whole once joined.
    from adaptor.events import SubagentUpdate

    streams = StreamRedactor(Redactor([_SECRET]))
    shown: list[Any] = []
    for piece in ("the key is sk-a", "nt-api03", "-Zq81x", "Vt0KEY", " ok"):
        shown += streams.events(SubagentUpdate(agent="sub", kind="delta", delta=piece))
    shown += streams.events(SubagentUpdate(agent="sub", kind="finished"))
    assert "".join(e.delta for e in shown) == f"the key is {REDACTED} ok"
    assert shown[-1] == SubagentUpdate(agent="sub", kind="finished")
    streams.events(SubagentUpdate(agent="other", kind="delta", delta="sk-ant-a"))
    assert _texts(streams.flush(), "delta") == ["sk-ant-a"]


def test_held_text_goes_out_with_its_own_stream_or_at_the_flush() -> None:
    streams = StreamRedactor(Redactor([_SECRET]))
    assert _texts(streams.events(Thinking(message_id="r", text="the key: sk-ant"))) == ["the key: "]
    # Another stream in between is not held up, nor given the held text.
    other = streams.events(TextDelta(message_id="m", text="hello"))
    assert other == [TextDelta(message_id="m", text="hello")]
    args = streams.events(ToolCall(id="t1", phase="content", args_delta='{"token": "sk-ant-api'))
    assert _texts(args, "args_delta") == ['{"token": "']
    assert _texts(streams.events(Thinking(message_id="r", text="-api03-Zq81xVt0KEY!"))) == [f"{REDACTED}!"]
    # The driver returned with the tool call's arguments still open: they go out at the flush,
    # as a delta of that call.
    assert streams.flush() == [ToolCall(id="t1", phase="content", args_delta="sk-ant-api")]
    assert streams.flush() == []

"""``RawStreams`` made from the bytes a process printed (decoded on first read) behaves in every
way a user can see like one made from the decoded text."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import weakref

import orjson
import pytest

from adaptor.result import RawStreams, Result, TerminalPayload, raw_streams_of

_OUT = b"plain \xff line\n{\"type\":\"result\"}\n"
_ERR = b"warn\xc3\n"
_TERMINAL = TerminalPayload(event="result", json='{"type":"result"}')


def _pair() -> tuple[RawStreams, RawStreams]:
    lazy = raw_streams_of(_OUT, _ERR, _TERMINAL)
    eager = RawStreams(stdout=_OUT.decode("utf-8", "replace"),
                       stderr=_ERR.decode("utf-8", "replace"), terminal=_TERMINAL)
    return lazy, eager


def test_fields_read_as_the_text_decoded_with_replacement() -> None:
    lazy, eager = _pair()
    assert lazy.stdout == eager.stdout and "\ufffd" in lazy.stdout
    assert lazy.stderr == eager.stderr
    assert lazy.terminal is _TERMINAL
    assert type(lazy) is RawStreams and type(lazy.stdout) is str


@pytest.mark.parametrize("read_first", [False, True])
def test_it_is_equal_and_alike_to_the_eager_one(read_first: bool) -> None:
    lazy, eager = _pair()
    if read_first:
        assert lazy.stdout
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    assert dataclasses.asdict(lazy) == dataclasses.asdict(eager)
    assert dataclasses.astuple(lazy) == dataclasses.astuple(eager)
    assert dataclasses.replace(lazy, stderr="x") == dataclasses.replace(eager, stderr="x")
    assert orjson.dumps(lazy) == orjson.dumps(eager)
    assert copy.copy(lazy) == eager and copy.deepcopy(lazy) == eager
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(lazy, protocol=protocol))
        assert back == eager and vars(back) == vars(eager)
    assert weakref.ref(lazy)() is lazy
    result = Result(run_id="r", _raw=lazy)
    assert result.to_json() == Result(run_id="r", _raw=eager).to_json()
    assert Result.from_json(result.to_json()).raw() == eager


def test_text_is_kept_as_given_and_the_class_is_unchanged() -> None:
    assert raw_streams_of("out", "err") == RawStreams("out", "err")
    assert RawStreams() == RawStreams(stdout="", stderr="", terminal=None)
    assert [f.default for f in dataclasses.fields(RawStreams)] == ["", "", None]
    assert RawStreams.__match_args__ == ("stdout", "stderr", "terminal")
    lazy, _ = _pair()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.stdout = "changed"  # type: ignore[misc]

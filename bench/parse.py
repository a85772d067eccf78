"""Events/s of the claude driver's stream-json parser, against ``orjson.loads`` per line.

Case (quality.md, ``parse``):

* ``claude replay``: ``adaptor.drivers.claude.replay(stdout)`` over a 50 MB transcript (1 MB
  with ``--quick``): the driver's own parser and Response rules, as a live run applies them to
  the CLI's stdout, with a sink that counts what it is handed; goal >= 0.5x the baseline.

"Events" are the transcript's stream-json lines (one JSON event each).  The baseline is
``orjson.loads`` on every line of the same bytes, split the same way (``bytes.splitlines``),
measured in the same process right next to it; both read from memory.  The rounds alternate
and each side's best round counts; each timed round starts after the previous round's result is
dropped and a collection (until session 20 the replay's rounds after the first also paid for
freeing the previous round's transcript: 1-2% of its time).

The transcript is built from captured Claude Code output (``tests/drivers/transcripts``): the
``init`` line of ``claude-partial``, then turns until the size is reached, then its ``result``
line.  A turn is the streamed text message of ``claude-partial`` (``message_start``, a text
block of 3-12 ``text_delta``s, the ``assistant`` line, ``content_block_stop``,
``message_delta``, ``message_stop``) followed by the tool round trip of ``claude-tool-write``
(an ``assistant`` ``tool_use`` and the ``user`` ``tool_result``, whose text is 5-60 lines as
in :func:`bench._common.event_mix`).  Message, tool-use and line
ids are renumbered per turn and the texts vary, so the parser sees a long run of distinct
messages and tool calls, not one repeated.
"""

from __future__ import annotations

import copy
import gc
import random
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench._common import MB, Options, at_least, emit, log, parse_args, result

SUMMARY = "events/s of the claude driver's stream-json parser (replay) vs orjson.loads per line"

_TRANSCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "drivers" / "transcripts"
_FULL_BYTES = 50 * MB
_QUICK_BYTES = 1 * MB
_WORDS = (
    "the agent reads the file and then edits function tests pass build module import error "
    "value return config path line change review diff patch commit"
).split()


def _lines(name: str) -> list[dict[str, Any]]:
    text = (_TRANSCRIPTS / f"{name}.jsonl").read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def _templates() -> dict[str, Any]:
    partial = _lines("claude-partial")
    tool = _lines("claude-tool-write")

    def first(lines: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
        for line in lines:
            if all(_path(line, key) == value for key, value in match.items()):
                return line
        raise LookupError(f"no line with {match}")

    def tool_use(line: dict[str, Any]) -> bool:
        content = _path(line, "message.content") or []
        return any(block.get("type") == "tool_use" for block in content)

    return {
        "init": first(partial, type="system", subtype="init"),
        "status": first(partial, type="system", subtype="status"),
        "message_start": first(partial, **{"type": "stream_event", "event.type": "message_start"}),
        "block_start": first(
            partial, **{"type": "stream_event", "event.type": "content_block_start"}
        ),
        "delta": first(partial, **{"type": "stream_event", "event.type": "content_block_delta"}),
        "assistant_text": first(partial, type="assistant"),
        "block_stop": first(
            partial, **{"type": "stream_event", "event.type": "content_block_stop"}
        ),
        "message_delta": first(partial, **{"type": "stream_event", "event.type": "message_delta"}),
        "message_stop": first(partial, **{"type": "stream_event", "event.type": "message_stop"}),
        "assistant_tool": next(
            line for line in tool if line.get("type") == "assistant" and tool_use(line)
        ),
        "user_result": first(tool, type="user"),
        "result": first(partial, type="result"),
    }


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _turn(
    t: dict[str, Any], k: int, rng: random.Random, *, tool: bool = True
) -> list[dict[str, Any]]:
    """One turn's lines, with ids unique to turn ``k`` (the last turn has no tool call)."""

    def fresh(name: str) -> dict[str, Any]:
        line: dict[str, Any] = copy.deepcopy(t[name])
        if "uuid" in line:
            line["uuid"] = f"{k:08x}-{rng.getrandbits(16):04x}-4000-8000-{rng.getrandbits(48):012x}"
        return line

    text_id = f"msg_{k:012x}{rng.getrandbits(48):012x}"
    tool_msg_id = f"msg_{k:012x}{rng.getrandbits(48):012x}"
    tool_id = f"toolu_{k:012x}{rng.getrandbits(48):012x}"
    pieces = [
        " ".join(rng.choices(_WORDS, k=rng.randint(1, 6))) + " " for _ in range(rng.randint(3, 12))
    ]

    lines = [fresh("status")]
    start = fresh("message_start")
    start["event"]["message"]["id"] = text_id
    start["api_message_id"] = text_id
    lines += [start, fresh("block_start")]
    for piece in pieces:
        delta = fresh("delta")
        delta["event"]["delta"]["text"] = piece
        delta["api_message_id"] = text_id
        lines.append(delta)
    assistant = fresh("assistant_text")
    assistant["message"]["id"] = text_id
    assistant["message"]["content"][0]["text"] = "".join(pieces)
    lines.append(assistant)
    lines += [fresh("block_stop"), fresh("message_delta"), fresh("message_stop")]
    if not tool:
        return lines

    call = fresh("assistant_tool")
    call["message"]["id"] = tool_msg_id
    block = next(b for b in call["message"]["content"] if b.get("type") == "tool_use")
    block["id"] = tool_id
    block["input"] = {
        "file_path": f"/scratch/work/src/module_{k % 97}.py",
        "content": " ".join(rng.choices(_WORDS, k=rng.randint(5, 40))) + "\n",
    }
    reply = fresh("user_result")
    for part in reply["message"]["content"]:
        if part.get("type") == "tool_result":
            part["tool_use_id"] = tool_id
            # A few KB, like the tool results of bench._common.event_mix.
            body = (
                " ".join(rng.choices(_WORDS, k=rng.randint(5, 14)))
                for _ in range(rng.randint(5, 60))
            )
            part["content"] = "\n".join(body)
    reply.pop("tool_result_meta", None)
    return [*lines, call, reply]


def build_transcript(size: int, *, seed: int = 0) -> tuple[bytes, int]:
    """A stream-json transcript of at least ``size`` bytes; returns it and its line count."""
    t = _templates()
    rng = random.Random(seed)
    out = [orjson.dumps(t["init"])]
    total = len(out[0]) + 1
    k = 0
    while total < size:
        for line in _turn(t, k, rng):
            data = orjson.dumps(line)
            out.append(data)
            total += len(data) + 1
        k += 1
    out += [orjson.dumps(line) for line in _turn(t, k, rng, tool=False)]  # the final answer
    out.append(orjson.dumps(t["result"]))
    return b"\n".join(out) + b"\n", len(out)


class _CountingSink:
    """An EventSink that counts what the parser emits (events and transcript items)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.emitted = 0

    def emit(self, payload: object) -> None:
        self.emitted += 1

    def request_decision(self, request: Any) -> Any:
        raise AssertionError("a replayed transcript asks for no decision")


def _baseline(data: bytes) -> int:
    count = 0
    for line in data.splitlines():
        orjson.loads(line)
        count += 1
    return count


def _replay(data: bytes) -> tuple[int, Any]:
    """The claude driver's replay of ``data``: (events and items emitted, the Response)."""
    from adaptor.drivers import claude

    sink = _CountingSink()
    response = claude.replay(data, sink=sink)
    return sink.emitted, response


def check(response: Any) -> None:
    """The replay parsed the transcript as a clean, successful run (no malformed line)."""
    if response.failure is not None:
        raise RuntimeError(f"the replay failed: {response.failure}")
    if not response.output:
        raise RuntimeError("the replay produced no output text")


def run(options: Options) -> dict[str, object]:
    started = time.perf_counter()
    size = _QUICK_BYTES if options.quick else _FULL_BYTES
    rounds = 1 if options.quick else 3
    data, lines = build_transcript(size)
    log(f"parse: transcript of {len(data) / MB:.1f} MB, {lines} lines")
    _replay(build_transcript(64 * 1024)[0])  # imports and first-use costs
    best = {"orjson": 0.0, "replay": 0.0}
    emitted = 0
    response = None
    for _ in range(rounds):
        for mode in ("orjson", "replay"):
            # Each side starts from the same clean heap: the previous round's Response (the
            # whole transcript's items) would otherwise be freed, and walked by the collector,
            # inside this round's timed window.
            response = None
            gc.collect()
            begun = time.perf_counter()
            if mode == "orjson":
                counted = _baseline(data)
                if counted != lines:
                    raise RuntimeError(f"orjson read {counted} lines, not {lines}")
            else:
                emitted, response = _replay(data)
                check(response)
            rate = lines / (time.perf_counter() - begun)
            best[mode] = max(best[mode], rate)
        log(f"parse: orjson {best['orjson']:,.0f} lines/s, replay {best['replay']:,.0f} lines/s")
    cases = [
        at_least(
            "claude replay",
            best["replay"],
            best["orjson"],
            "events/s",
            0.5,
            mb_per_s=round(best["replay"] * len(data) / lines / MB, 1),
            baseline_mb_per_s=round(best["orjson"] * len(data) / lines / MB, 1),
        )
    ]
    params = {
        "transcript_mb": round(len(data) / MB, 1),
        "lines": lines,
        "mean_line_bytes": round(len(data) / lines),
        "public_events_and_items_emitted": emitted,
        "rounds": rounds,
        "best_of": "max events/s per side over the rounds",
        "sources": ["claude-partial.jsonl", "claude-tool-write.jsonl"],
    }
    return result("parse", cases, options=options, started=started, params=params)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())

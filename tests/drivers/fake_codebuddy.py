"""A stand-in for ``codebuddy`` speaking the formats of ``shared/reference/upstream-drivers.md``
§2.4 (test code; the real CLI cannot be installed here).

Started as ``fake_codebuddy.py [codebuddy args...]``.  The transport follows the argv like the
real CLI's would:

- ``--print --output-format stream-json`` (headless): the prompt is the last argument (options
  are parsed like commander.js does: an unknown one before ``--`` fails with exit 1); with
  ``--include-partial-messages`` every text block is also streamed as ``stream_event`` deltas;
- ``--print --output-format json --json-schema S``: one pretty-printed result object with
  ``structured_output`` (``$FAKE_STRUCTURED``, JSON) over several lines;
- ``--input-format=stream-json`` (control): it answers the host's ``initialize`` with a
  ``control_response``, reads the ``user`` frame, asks ``can_use_tool`` where the scenario
  uses a tool, reads the ``control_response`` (``allowed``), and after its ``result`` waits for
  stdin to close.

It appends argv, cwd, environment names and every stdin frame to ``$FAKE_RECORD`` and behaves
as ``$FAKE_SCENARIO`` says (default ``text``): ``text``, ``tool`` (Bash), ``plan`` (a plan
written to ``.codebuddy/plans/`` then ``ExitPlanMode``), ``question`` (``AskUserQuestion``),
``api_error`` (an error ``result`` with ``api_error_status`` ``$FAKE_STATUS``, default 429,
saying ``API Error: <status> <$FAKE_ERROR>``, as Claude Code words the provider's error body),
``error_frame`` (an ``error`` frame, then exit 1), ``malformed``, ``no_terminal``,
``unreadable_result`` (a ``result`` line that is not UTF-8).
A fresh session gets the id ``$FAKE_SESSION_ID`` (default: a random UUID);
``--resume ID`` continues ``ID`` when it is listed in ``$FAKE_KNOWN_SESSIONS``, and otherwise
fails like Claude Code does ("No conversation found", ``error_during_execution``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any


def main(argv: list[str]) -> int:
    scenario = os.environ.get("FAKE_SCENARIO", "text")
    control = "--input-format=stream-json" in argv
    json_mode = "--json-schema" in argv
    partial = "--include-partial-messages" in argv
    _record("argv", argv)
    _record("cwd", os.getcwd())
    _record("env", sorted(os.environ))
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    sid = resume or os.environ.get("FAKE_SESSION_ID") or str(uuid.uuid4())

    def emit(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def read() -> dict[str, Any]:
        line = sys.stdin.readline()
        frame = json.loads(line) if line else {}
        _record("stdin", frame)
        return frame

    if control:
        init = read()
        emit({"type": "control_response", "response": {
            "subtype": "success", "request_id": init.get("request_id"), "response": {}}})
        prompt = str(read().get("message", {}).get("content", ""))
    else:
        positional = _positional(argv)
        if isinstance(positional, str):  # like commander.js, which CodeBuddy's CLI is built on
            print(f"error: unknown option '{positional}'", file=sys.stderr)
            return 1
        prompt = positional[-1] if positional else ""
    _record("prompt", prompt)

    if resume is not None and resume not in os.environ.get("FAKE_KNOWN_SESSIONS", "").split(","):
        message = f"No conversation found with session ID: {resume}"
        print(message, file=sys.stderr)
        emit({"type": "result", "subtype": "error_during_execution", "is_error": True,
              "errors": [message], "session_id": sid, "num_turns": 0})
        return _end(control, 1)

    if not json_mode:
        emit({"type": "system", "subtype": "init", "session_id": sid, "cwd": os.getcwd(),
              "model": "glm-5.2-ioa", "permissionMode": "default", "tools": ["Bash", "Write"]})
    turn = iter(range(1, 100))

    def assistant(*blocks: dict[str, Any]) -> None:
        message_id = f"msg_{next(turn)}"
        if partial and not json_mode:
            emit({"type": "stream_event", "session_id": sid,
                  "event": {"type": "message_start", "message": {"id": message_id}}})
            for index, block in enumerate(blocks):
                if block["type"] != "text":
                    continue
                emit({"type": "stream_event", "session_id": sid, "event": {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}})
                for piece in block["text"].split(" "):
                    emit({"type": "stream_event", "session_id": sid, "event": {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece + " "}}})
                emit({"type": "stream_event", "session_id": sid,
                      "event": {"type": "content_block_stop", "index": index}})
        if not json_mode:
            emit({"type": "assistant", "session_id": sid, "message": {
                "id": message_id, "role": "assistant", "model": "glm-5.2-ioa",
                "content": list(blocks)}})

    def use(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
        """A tool use: asked over the control channel when there is one."""
        ident = f"toolu_{next(turn)}"
        assistant({"type": "tool_use", "id": ident, "name": name, "input": tool_input})
        answer: dict[str, Any] = {"allowed": True, "updatedInput": tool_input}
        if control:
            emit({"type": "control_request", "request_id": f"req_{ident}", "request": {
                "subtype": "can_use_tool", "tool_name": name, "tool_use_id": ident,
                "input": tool_input, "description": f"Run {name}"}})
            answer = read().get("response", {}).get("response", {})
        allowed = answer.get("allowed") is True
        content = "ok" if allowed else str(answer.get("reason", "denied"))
        emit({"type": "user", "session_id": sid, "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": ident, "content": content,
             "is_error": not allowed}]}})
        return answer

    text = "Hello from CodeBuddy."
    if scenario == "tool":
        answer = use("Bash", {"command": "touch made.txt"})
        text = "Tool allowed." if answer.get("allowed") else "Tool denied."
    elif scenario == "plan":
        use("Write", {"file_path": ".codebuddy/plans/p.md", "content": "# Plan\n1. Do it."})
        answer = use("ExitPlanMode", {})
        text = "Plan approved." if answer.get("allowed") else "Plan rejected."
    elif scenario == "question":
        answer = use("AskUserQuestion", {"questions": [{
            "question": "Which color?", "options": [{"label": "red"}, {"label": "blue"}]}]})
        text = f"You chose {answer.get('updatedInput', {}).get('answers', {})}."
    elif scenario == "questions":
        answer = use("AskUserQuestion", {"questions": [
            {"question": "Which color?", "options": [{"label": "red"}, {"label": "blue"}]},
            {"question": "Which size?", "options": [{"label": "small"}, {"label": "large"}]}]})
        updated = answer.get("updatedInput", {})
        text = f"You chose {updated.get('answers', {})}, first {updated.get('choice')}."
    elif scenario == "malformed":
        sys.stdout.write('{"type": "assistant"\n')
    elif scenario == "unreadable_result":
        sys.stdout.buffer.write(b'{"type": "result", "subtype": "success", "is_error": false, '
                                b'"session_id": "' + sid.encode() + b'", "result": "\xff"}\n')
        sys.stdout.flush()
        return _end(control, 0)
    elif scenario == "error_frame":
        emit({"type": "error", "error": {"type": "authentication_error", "status": 401,
                                         "message": "Invalid API key"}})
        return _end(control, 1)
    if scenario == "no_terminal":
        assistant({"type": "text", "text": "Half an"})
        print("fatal: stream closed", file=sys.stderr)
        return _end(control, 2)
    if scenario == "api_error":
        status = int(os.environ.get("FAKE_STATUS", "429"))
        emit({"type": "result", "subtype": "success", "is_error": True, "session_id": sid,
              "result": f"API Error: {status} {os.environ.get('FAKE_ERROR', 'mock error')}",
              "api_error_status": status})
        return _end(control, 1)
    assistant({"type": "text", "text": text})
    result: dict[str, Any] = {
        "type": "result", "subtype": "success", "is_error": False, "session_id": sid,
        "result": text, "num_turns": 1, "stop_reason": "end_turn", "total_cost_usd": 0.001,
        "usage": {"input_tokens": 11, "output_tokens": 5, "cache_read_input_tokens": 2}}
    if json_mode:
        result["structured_output"] = json.loads(os.environ.get("FAKE_STRUCTURED", "null"))
        result["result"] = json.dumps(result["structured_output"])
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return 0
    emit(result)
    return _end(control, 0)


def _end(control: bool, code: int) -> int:
    if control:
        _record("stdin-rest", sys.stdin.read())  # stays up until the host closes stdin
    return code


_VALUED = frozenset({"--output-format", "--input-format", "--json-schema", "--resume",
                     "--permission-mode", "--model", "--effort", "--max-turns",
                     "--append-system-prompt"})
_SWITCHES = frozenset({"--print", "--verbose", "--include-partial-messages"})


def _positional(argv: list[str]) -> list[str] | str:
    """The positional arguments, or the first unknown option: everything after ``--`` is
    positional, anything else starting with ``-`` must be a known option."""
    positional: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            return positional + list(args)
        if arg.startswith("-") and len(arg) > 1:
            flag = arg.split("=", 1)[0]
            if flag in _VALUED and "=" not in arg:
                next(args, None)
            elif flag not in _VALUED and flag not in _SWITCHES:
                return arg
        else:
            positional.append(arg)
    return positional


def _record(kind: str, value: Any) -> None:
    path = os.environ.get("FAKE_RECORD")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"kind": kind, "value": value}) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A stand-in for ``cursor-agent`` printing the stream-json format of
``shared/reference/upstream-drivers.md`` §2.3 (test code; the real CLI cannot be installed here).

Started as ``fake_cursor.py [cursor-agent args...]``.  It appends what it was given (argv, cwd,
environment names, stdin) to ``$FAKE_RECORD`` as ``{"kind", "value"}`` JSON lines (what
``conftest.FakeCLI.records`` reads) and behaves as ``$FAKE_SCENARIO`` says (default ``text``):

``text``            init, the prompt echoed, two assistant deltas, ``result``/``success``
``tool``            a ``readToolCall`` started/completed between two assistant deltas
``tool_failure``    a ``shellToolCall`` completed with a ``failure`` branch
``thinking``        a ``thinking`` event (not part of the protocol's formal core)
``malformed``       a line that starts with ``{`` but is not JSON
``no_terminal``     stops without a ``result`` and exits 1 with a message on stderr
``error_terminal``  ``result``/``success`` with ``is_error: true`` (``$FAKE_ERROR``, default a
                    usage limit), exit 1
``session_change``  a frame whose ``session_id`` differs from the init's
``missing_session`` an assistant frame without ``session_id``
``after_terminal``  an assistant frame after the terminal ``result``
``not_logged_in``   nothing on stdout; stderr asks to log in; exit 1

A fresh chat gets the id ``$FAKE_SESSION_ID`` (default: a random UUID).  ``--resume ID``
continues ``ID`` when it is listed in ``$FAKE_KNOWN_SESSIONS`` (comma
separated); otherwise it fails the way a refused chat would (stderr, exit 1).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any


def main(argv: list[str]) -> int:
    scenario = os.environ.get("FAKE_SCENARIO", "text")
    prompt = sys.stdin.read()
    for kind, value in (("argv", argv), ("cwd", os.getcwd()), ("env", sorted(os.environ)),
                        ("stdin", prompt)):
        _record(kind, value)
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    if resume is not None and resume not in os.environ.get("FAKE_KNOWN_SESSIONS", "").split(","):
        print(f"Error: chat {resume} not found", file=sys.stderr)
        return 1
    if scenario == "not_logged_in":
        print("Error: Authentication required. Please run 'cursor-agent login' first, or set "
              "CURSOR_API_KEY.", file=sys.stderr)
        return 1
    sid = resume or os.environ.get("FAKE_SESSION_ID") or str(uuid.uuid4())
    workspace = argv[argv.index("--workspace") + 1] if "--workspace" in argv else os.getcwd()

    def emit(event: dict[str, Any], session: str | None = sid) -> None:
        if session is not None:
            event = {**event, "session_id": session}
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def say(text: str, session: str | None = sid) -> None:
        emit({"type": "assistant",
              "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}},
             session)

    emit({"type": "system", "subtype": "init", "apiKeySource": "login", "cwd": workspace,
          "model": "GPT-5", "permissionMode": "default"})
    emit({"type": "user", "message": {"role": "user", "content": [{"type": "text",
                                                                   "text": prompt}]}})
    if scenario in ("tool", "tool_failure"):
        say("Let me look. ")
        variant = "readToolCall" if scenario == "tool" else "shellToolCall"
        args = {"path": "notes.txt"} if scenario == "tool" else {"command": "false"}
        result = ({"success": {"content": "the notes", "isEmpty": False}} if scenario == "tool"
                  else {"failure": {"exitCode": 1, "stderr": "boom"}})
        emit({"type": "tool_call", "subtype": "started", "call_id": "call_1",
              "tool_call": {variant: {"args": args}}})
        emit({"type": "tool_call", "subtype": "completed", "call_id": "call_1",
              "tool_call": {variant: {"args": args, "result": result}}})
    if scenario == "thinking":
        emit({"type": "thinking", "subtype": "delta", "text": "hmm"})
    say("Cursor ")
    if scenario == "malformed":
        sys.stdout.write('{"type": "assistant", "message": \n')
    if scenario == "session_change":
        say("says ", session="another-session")
    elif scenario == "missing_session":
        say("says ", session=None)
    else:
        say("says hi.")
    if scenario == "no_terminal":
        print("Error: connection to the model failed: ECONNREFUSED", file=sys.stderr)
        return 1
    is_error = scenario == "error_terminal"
    text = (os.environ.get("FAKE_ERROR", "You've hit your usage limit.") if is_error
            else "Cursor says hi.")
    emit({"type": "result", "subtype": "success", "duration_ms": 12, "is_error": is_error,
          "result": text, "request_id": "req-1"})
    if scenario == "after_terminal":
        say("late")
    return 1 if is_error else 0


def _record(kind: str, value: Any) -> None:
    path = os.environ.get("FAKE_RECORD")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"kind": kind, "value": value}) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

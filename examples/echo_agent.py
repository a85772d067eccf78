#!/usr/bin/env python3
"""A stand-in agent CLI for examples/custom_driver.py: prompt on stdin, JSON lines on stdout.

    echo_agent.py [--resume SESSION_ID] < prompt

It prints ``{"type": "session", "id": ...}``, then ``{"type": "text", "delta": ...}`` lines,
then the terminal ``{"type": "done", "session_id": ..., "text": ..., "usage": {...}}``.
Sessions are files under ``$ECHO_AGENT_HOME``; an unknown one is refused (exit 4, ``session
... not found`` on stderr).  A prompt holding ``fail`` makes it exit 3 with an error.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path


def say(event: dict[str, object]) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    args = sys.argv[1:]
    home = Path(os.environ.get("ECHO_AGENT_HOME", ".echo-agent"))
    home.mkdir(parents=True, exist_ok=True)
    prompt = sys.stdin.read().strip()
    if args[:1] == ["--resume"]:
        session = args[1]
        if not (home / session).exists():
            print(f"error: session {session} not found", file=sys.stderr)
            return 4
        turns = json.loads((home / session).read_text())
    else:
        session, turns = str(uuid.uuid4()), []
    say({"type": "session", "id": session})
    if "fail" in prompt:
        print("error: the model is unavailable (HTTP 503)", file=sys.stderr)
        return 3
    turns.append(prompt)
    answer = f"turn {len(turns)}: {prompt}"
    for word in answer.split(" "):
        say({"type": "text", "delta": word + " "})
    (home / session).write_text(json.dumps(turns))
    say({"type": "done", "session_id": session, "text": answer,
         "usage": {"input": len(prompt), "output": len(answer)}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

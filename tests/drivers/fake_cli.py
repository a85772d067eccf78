"""A stand-in for ``claude`` or ``codex`` that replays a captured transcript (test code).

    fake_cli.py RECORD STDOUT_FILE STDERR_FILE EXIT [--stdin-protocol]

It appends what it was given (argv, cwd, env names, every stdin line) to RECORD as JSON lines,
prints STDERR_FILE then STDOUT_FILE line by line and exits with EXIT.  With
``--stdin-protocol`` it behaves like ``claude --input-format stream-json``: it first reads the
initialize request and the user frame, waits for a ``control_response`` after every
``can_use_tool`` request it prints, and exits only once stdin reaches EOF.
"""

from __future__ import annotations

import json
import os
import sys

import orjson


def main(argv: list[str]) -> int:
    record_path, stdout_path, stderr_path, exit_text, *flags = argv
    protocol = "--stdin-protocol" in flags

    def record(kind: str, value: object) -> None:
        try:
            line = json.dumps({"kind": kind, "value": value})
        except RecursionError:  # (a deeply nested answer: kept as the text it came as)
            line = json.dumps({"kind": kind, "value": "<too deep to record>"})
        with open(record_path, "a") as handle:
            handle.write(line + "\n")

    record("argv", sys.argv)
    record("cwd", os.getcwd())
    record("env", sorted(os.environ))
    if protocol:
        for _ in range(2):  # initialize, then the user frame
            record("stdin", json.loads(sys.stdin.readline()))
    else:
        record("stdin", sys.stdin.read())
    with open(stderr_path) as handle:
        sys.stderr.write(handle.read())
        sys.stderr.flush()
    with open(stdout_path) as handle:
        for line in handle:
            sys.stdout.write(line)
            sys.stdout.flush()
            # orjson: the capture's lines may nest deeper than json's recursion allows.
            event = orjson.loads(line) if line.startswith("{") else {}
            if protocol and event.get("type") == "control_request":
                answer = sys.stdin.readline()
                record("stdin", orjson.loads(answer) if answer else None)
    if protocol:
        record("stdin-rest", sys.stdin.read())  # the CLI stays up until its input ends
    return int(exit_text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

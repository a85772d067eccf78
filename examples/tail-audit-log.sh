#!/usr/bin/env bash
# Submit a request and watch its audit log live with tail -F and jq, like a person would.
set -euo pipefail
home=${ADAPTORD_HOME:-${XDG_STATE_HOME:-$HOME/.local/state}/adaptord}

id=$(adaptor submit - <<'JSON'
{"driver": "script", "prompt": "Fix the tests",
 "config": {"steps": [{"thinking": "reading the failure"},
                      {"tool_call": {"name": "Bash", "args": {"cmd": "pytest -q"}, "result": {"exit": 0}}},
                      {"text": "all tests pass"}]}}
JSON
)

# `adaptor wait` in the background ends when the verdict is written; tail --pid stops following
# then (after printing what is left), so the pipeline ends on its own. tail -F waits for the
# log file to appear.
adaptor wait "$id" > /dev/null &
waiter=$!
# (tail exits non-zero here: the file did not exist when it started)
{ tail -n +1 -F --pid="$waiter" -s 0.2 "$home/events/$id.jsonl" 2> /dev/null || true; } | jq --unbuffered -r '
  if .kind == "tool_call.start" then "tool: \(.event.name)"
  elif .kind == "text.content" then "text: \(.event.text)"
  elif .kind == "run.finished" then "finished: failed=\(.event.failed)"
  else empty end'
wait "$waiter"

#!/usr/bin/env bash
# Drop a request file into the spool by hand (no client library), wait for its verdict and
# print the answer. Works with any adaptord home: ADAPTORD_HOME=/path ./submit-and-wait.sh
set -euo pipefail
home=${ADAPTORD_HOME:-${XDG_STATE_HOME:-$HOME/.local/state}/adaptord}
id="example-$(date +%s)-$$"

# 1. write under spool/tmp, 2. flush it to disk, 3. make it visible under its final name
cat > "$home/spool/tmp/$id.json" <<JSON
{"driver": "script", "prompt": "Say hello",
 "config": {"steps": [{"text": "hello from the spool"}]}}
JSON
sync "$home/spool/tmp/$id.json"
mv "$home/spool/tmp/$id.json" "$home/spool/new/$id.json"

# adaptor wait exits with the verdict's exit code (0 ok, 1 run failed, 3 refused, 124 timeout...)
if adaptor wait "$id" --timeout 60 > /dev/null; then
  jq -r '.result.text' "$home/verdicts/$id.json"
else
  code=$?
  echo "request $id failed with exit code $code:" >&2
  jq -r '.error | "\(.code): \(.message)"' "$home/verdicts/$id.json" >&2
  exit "$code"
fi

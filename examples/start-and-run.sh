#!/usr/bin/env bash
# Start adaptord in the background, wait until it serves its spool, run one request through it,
# and stop it again. ADAPTORD_HOME=/path ./start-and-run.sh uses another home.
set -euo pipefail

adaptord serve &
daemon=$!
# SIGTERM: the daemon finishes or cancels what runs, writes every verdict and exits 0.
trap 'kill "$daemon" 2> /dev/null || true; wait "$daemon" || true' EXIT

# Started in the background, it takes a moment to serve; until then `adaptor run` would exit 69
# ("adaptord is not running"). `adaptor status` exits 0 once it serves, 69 before.
until adaptor status > /dev/null 2>&1; do
  if ! kill -0 "$daemon" 2> /dev/null; then
    echo "adaptord did not start (its stderr above says why)" >&2
    exit 69
  fi
  sleep 0.1
done

adaptor run --driver script --config 'steps=[{"text": "hi"}]' "Say hi"

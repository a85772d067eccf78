#!/usr/bin/env bash
# Start adaptord in the background, wait until `adaptor status` sees it, run one request through
# it, and stop it again. ADAPTORD_HOME=/path ./start-and-run.sh uses another home.
set -euo pipefail

adaptord serve &
daemon=$!
# SIGTERM: the daemon finishes or cancels what runs, writes every verdict and exits 0.
trap 'kill "$daemon" 2> /dev/null || true; wait "$daemon" || true' EXIT

# Started in the background, it first takes its home's lock; until then `adaptor run` would
# exit 69 (no daemon). `adaptor status` exits 0 from that moment on, 69 before. The daemon may
# still be starting then (stopping a predecessor's leftover agents, importing host tools):
# `adaptor run` below then submits its request, which waits in the spool until the daemon
# serves, and the run's answer comes a little later.
until adaptor status > /dev/null 2>&1; do
  if ! kill -0 "$daemon" 2> /dev/null; then
    echo "adaptord did not start (its stderr above says why)" >&2
    exit 69
  fi
  sleep 0.1
done

adaptor run --driver script --config 'steps=[{"text": "hi"}]' "Say hi"

#!/usr/bin/env bash
# Installs the pinned agent CLIs the driver integration tests run (tests/drivers/).
#
# Each package goes into its own npm prefix under a cache directory OUTSIDE the repo:
#   ${ADAPTOR_CLI_CACHE:-$HOME/.cache/adaptor-clis}/<name>-<version>/node_modules/.bin/<binary>
# A prefix whose stamp file exists is reused as is, so running this twice costs nothing.
# The tests look there (or at $ADAPTOR_CLAUDE_BIN / $ADAPTOR_CODEX_BIN / $ADAPTOR_GEMINI_BIN) and
# skip with a visible reason when a binary is missing. This script therefore never fails the
# build: without npm, or when an install fails, it says why and exits 0.
#
# The versions are the ones docs/drivers.md ("Verified against") and the drivers' argv comments
# name; change all three together.
set -uo pipefail

CACHE="${ADAPTOR_CLI_CACHE:-$HOME/.cache/adaptor-clis}"
PACKAGES=(
  "claude-code|@anthropic-ai/claude-code|2.1.332|claude"
  "codex|@openai/codex|0.171.0|codex"
  "gemini-cli|@google/gemini-cli|0.61.0|gemini"
)

say() { printf 'install-clis: %s\n' "$*"; }

if ! command -v npm >/dev/null 2>&1; then
  say "npm is not on PATH; the real-CLI driver tests will be skipped"
  exit 0
fi
if ! mkdir -p "$CACHE" 2>/dev/null; then
  say "cannot create cache directory $CACHE; the real-CLI driver tests will be skipped"
  exit 0
fi

for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r name package version binary <<<"$entry"
  prefix="$CACHE/$name-$version"
  stamp="$prefix/.installed"
  bin="$prefix/node_modules/.bin/$binary"
  if [[ -f "$stamp" && -x "$bin" ]]; then
    say "$package@$version: cached"
  else
    say "$package@$version: installing into $prefix"
    rm -rf "$prefix"
    mkdir -p "$prefix"
    # --no-save and a private prefix keep the repo untouched; the CLIs' telemetry is off during
    # install too. Install scripts must run: claude-code's postinstall links its native binary.
    # gemini-cli is a JS bundle run by the system node, which must be >= 20.
    if DISABLE_TELEMETRY=1 npm install --prefix "$prefix" --no-audit --no-fund --no-save \
        --loglevel=error "$package@$version" >"$prefix/npm.log" 2>&1 && [[ -x "$bin" ]]; then
      date -u +%Y-%m-%dT%H:%M:%SZ >"$stamp"
    else
      say "$package@$version: install FAILED (log: $prefix/npm.log); its tests will be skipped"
      tail -n 20 "$prefix/npm.log" 2>/dev/null | sed 's/^/  npm: /'
      continue
    fi
  fi
  say "$binary -> $bin"
done
exit 0

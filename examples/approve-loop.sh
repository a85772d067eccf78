#!/usr/bin/env bash
# Answer approval requests from a loop: approve permission and plan reviews, deny questions.
# Runs until there has been nothing to answer for IDLE_ROUNDS rounds (or forever with 0).
set -uo pipefail
idle_rounds=${IDLE_ROUNDS:-0}
idle=0
while :; do
  pending=$(adaptor approvals --json | jq -c '.result') || exit $?
  if [ "$(jq 'length' <<<"$pending")" -eq 0 ]; then
    idle=$((idle + 1))
    if [ "$idle_rounds" -gt 0 ] && [ "$idle" -ge "$idle_rounds" ]; then exit 0; fi
    sleep 0.2
    continue
  fi
  idle=0
  # Not `jq ... | while`: the loop would run in a subshell, whose exit would not end the script.
  while read -r approval kind; do
    if [ "$kind" = question ]; then
      adaptor deny "$approval" --reason "no questions from the approve loop"
    else
      adaptor approve "$approval"
    fi
    # exit 5: someone else answered first, or it expired; nothing to do
    case $? in 0|5) ;; *) exit 1 ;; esac
  done < <(jq -r '.[] | "\(.id) \(.approval_kind)"' <<<"$pending")
done

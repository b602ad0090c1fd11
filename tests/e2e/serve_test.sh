#!/usr/bin/env bash
# A long-running source: `deltacast serve` publishes three training steps read from
# stdin to a chain trainer -> a1 -> a2 -> a3. Every step must commit everywhere,
# every store must end byte-identical to the last step, and each agent must have
# joined its parent once (children stay joined between refits).
# Usage: serve_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work serve
write_chain_config serve $((24600 + (RANDOM % 100) * 8)) 1 64KiB 4 30s all 10s
export DELTACAST_TOKEN=serve-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 3 --change-rate 3% --threads 2 >/dev/null
mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0" "$work/run/$n"
  "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 \
    >>"$work/run/$n.log" 2>&1 &
  pids+=($!)
done
printf '%s\n' "$work/steps/step0" "$work/steps/step1" "$work/steps/step2" "$work/steps/step3" |
  "$dc" serve --config "$work/cluster.toml" --state-dir "$work/run/source" --json \
    >"$work/run/serve.json" 2>"$work/run/serve.log"
status=$?
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
check "serve exited $status" test "$status" -eq 0
check "not three reports" bash -c "jq -s 'length' '$work/run/serve.json' | grep -qx 3"
check "a step did not commit everywhere" \
  bash -c "jq -s -e 'all(.[]; .committed and .nodes_decided == 3)' '$work/run/serve.json'"
for n in a1 a2 a3; do
  check "$n is not at step 3" "$dc" verify "$work/run/$n" "$work/steps/step3"
  check "$n joined its parent more than once" \
    bash -c "test \$(grep -c 'joined parent' '$work/run/$n.log') -eq 1"
done
if ((${#failures[@]} == 0)); then
  echo "serve: 3 steps, call to first chunk $(jq -s -r 'map(.call_to_first_chunk_seconds | tostring) | join(" s, ")' "$work/run/serve.json") s"
  echo "serve: 1 passed, 0 failed"
else
  printf 'serve: FAIL: %s\n' "${failures[@]}"
  exit 1
fi

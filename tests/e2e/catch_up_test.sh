#!/usr/bin/env bash
# Catch-up across processes: chain trainer -> a1 -> a2 -> a3, commit policy
# available. a2 is down for two refits (a3 fails over to a1). a2 comes back at
# step 0 and is killed (SIGKILL) part-way through applying the chain of kept deltas;
# restarted, it resumes the chain after the chunks it had journaled. Every store
# must end byte-identical to the last step.
# Usage: catch_up_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work catchup
write_chain_config catchup $((27600 + (RANDOM % 200) * 8)) 1 32KiB 4 30s available 3s
export DELTACAST_TOKEN=catchup-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 4 --change-rate 3% --threads 2 >/dev/null
mkdir -p "$work/run"
for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
agent() {  # node [crash point]
  DELTACAST_CRASH_AT=${2:-} "$dc" agent --config "$work/cluster.toml" --node "$1" --store "$work/run/$1" \
    --threads 1 >>"$work/run/$1.log" 2>&1 &
  pids+=($!)
}
publish() {  # from to
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1" --new "$work/steps/step$2" --json \
    --no-progress --state-dir "$work/run/source" >"$work/run/publish$2.json" 2>>"$work/run/publish.log"
}
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
agent a1
agent a3
publish 0 1
publish 1 2
check "step 2 did not commit without a2" json_holds "$work/run/publish2.json" '.committed == true'
agent a2 agent.catch_up_chunk:3
victim=${pids[-1]}
publish 2 3
for _ in $(seq 1 100); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
check "a2 was not killed during its catch-up" bash -c "! kill -0 $victim"
agent a2
publish 3 4
check "step 4 did not commit on all three" json_holds "$work/run/publish4.json" '.committed == true and .nodes_decided == 3'
for n in a1 a2 a3; do check "$n differs from step 4" "$dc" verify "$work/run/$n" "$work/steps/step4"; done
# By kept deltas only: one catch-up of three, or (when it rejoins while step 4 is
# being published and its parent reports step 2 as committed) two and then one.
check "a2 did not resume its chain of kept deltas" bash -c \
  "grep 'caught up to ' '$work/run/a2.log' | grep -v ': 0 kept deltas' | grep -q 'kept deltas and 0 partitions' &&
   ! grep -q 'kept deltas and [1-9][0-9]* partitions' '$work/run/a2.log'"
if ((${#failures[@]} == 0)); then
  echo "catch-up: a node 2 versions behind, killed mid-chain and restarted, ends bit-exact"
  echo "catch-up: 1 passed, 0 failed"
else
  printf 'catch-up: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

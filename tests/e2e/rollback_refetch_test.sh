#!/usr/bin/env bash
# A rollback that needs base bytes survives its parent link breaking. Chain
# trainer -> a1 -> a2 -> a3 with a3 never started, so a2 fails the refit after the
# connect timeout and it aborts, after a2 applied the delta. The delta is in context
# mode, whose records cannot be reverted without the base, and a2 is killed
# (SIGKILL) as its rollback starts, losing its in-memory undo. Restarted, it must
# fetch base bytes from up the tree; its parent link is broken right after it asks,
# and it must ask again on the next link and end back at the base.
# Usage: rollback_refetch_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work refetch
write_chain_config refetch $((28600 + (RANDOM % 200) * 8)) 1 32KiB 4 30s all 2s
export DELTACAST_TOKEN=refetch-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 3% --threads 2 >/dev/null
mkdir -p "$work/run"
for n in a1 a2; do cp -r "$work/steps/step0" "$work/run/$n"; done
agent() {  # node [env assignment]
  env ${2:-} "$dc" agent --config "$work/cluster.toml" --node "$1" --store "$work/run/$1" --threads 1 \
    >>"$work/run/$1.log" 2>&1 &
  pids+=($!)
}
agent a1
agent a2 DELTACAST_CRASH_AT=agent.abort
victim=${pids[-1]}
"$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" --mode context \
  --json --no-progress --state-dir "$work/run/source" >"$work/run/publish.json" 2>"$work/run/publish.log" &
publisher=$!
pids+=($publisher)
for _ in $(seq 1 200); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
crashed=yes
kill -0 "$victim" 2>/dev/null && crashed=no
agent a2 DELTACAST_FAULT_AT=agent.rollback_link_lost
wait "$publisher"
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
check "a2 was not killed as its rollback started" test "$crashed" = yes
check "the refit did not abort" json_holds "$work/run/publish.json" '.committed == false'
for _ in $(seq 1 100); do [[ -e $work/run/a2/.deltacast/inflight ]] || break; sleep 0.1; done
check "a2 never needed base bytes" grep -q "fault injection: link lost during a rollback" "$work/run/a2.log"
check "a2 did not ask again for the base bytes" grep -q "asking again for [0-9]* requests up the tree" "$work/run/a2.log"
for n in a1 a2; do
  check "$n is not back at the base" "$dc" verify "$work/run/$n" "$work/steps/step0"
  check "$n still has the delta in flight" test ! -e "$work/run/$n/.deltacast/inflight"
done
if ((${#failures[@]} == 0)); then
  echo "rollback-refetch: base bytes asked again after the link broke; back at the base"
  echo "rollback-refetch: 1 passed, 0 failed"
else
  printf 'rollback-refetch: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

#!/usr/bin/env bash
# A relay that restarts after its children failed over must not wait for them.
# Chain trainer -> a1 -> a2 -> a3, policy `available`. The relay a2 is killed
# (SIGKILL) right after it committed, before it confirmed; its child a3 fails over
# to a1 and confirms there. a2 is restarted after that, is told COMMIT again by a1
# and gathers its subtree's confirmations: it must not wait its commit timeout for
# a3, which confirmed elsewhere. The publish must finish well within the commit
# timeout, and the next step must commit everywhere without being held up.
# Usage: failover_regather_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work regather
write_chain_config regather $((26200 + (RANDOM % 150) * 8)) 1 32KiB 4 40s available 6s
export DELTACAST_TOKEN=regather-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 2 --change-rate 3% --threads 2 >/dev/null
mkdir -p "$work/run"
for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
run_agent a1
run_agent a2 DELTACAST_CRASH_AT=agent.committed
victim=${pids[-1]}
run_agent a3
start=$(date +%s.%N)
publish_step 0 1 first &
publisher=$!
pids+=($publisher)
for _ in $(seq 1 200); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
crashed=yes
kill -0 "$victim" 2>/dev/null && crashed=no
for _ in $(seq 1 200); do grep -q "failing over to a1" "$work/run/a3.log" && break; sleep 0.05; done
sleep 0.5  # a3 joins a1 and confirms there
run_agent a2
wait "$publisher"
first_seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
publish_step 1 2 second
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
check "a2 was not killed after it committed" test "$crashed" = yes
check "a3 did not fail over to a1" grep -q "failing over to a1" "$work/run/a3.log"
check "the first refit did not commit" json_holds "$work/run/first.json" '.committed == true'
# Without the fix a2 waits until a3 comes home from a1 (10 s after failing over)
# or its commit timeout; with it, a3's failover time plus a2's rejoin grace (3 s).
check "the first publish took ${first_seconds} s: a2 waited for a child that confirmed elsewhere" \
  awk -v s="$first_seconds" 'BEGIN { exit !(s < 10.5) }'
check "a2 did not stop waiting for a3" grep -q "child a3 is away; it learns the decision" "$work/run/a2.log"
check "a2 waited its commit timeout for confirmations" bash -c "! grep -q 'did not confirm the decision in time' '$work/run/a2.log'"
check "the first refit was not confirmed by every node" json_holds "$work/run/first.json" '.nodes_decided == 3'
check "the next step did not commit everywhere ($(jq -r .abort_reason "$work/run/second.json" 2>/dev/null))" \
  json_holds "$work/run/second.json" '.committed == true and .nodes_decided == 3'
check "the next step took longer than 15 s" json_holds "$work/run/second.json" '.seconds < 15'
for n in a1 a2 a3; do check "$n is not at step 2" "$dc" verify "$work/run/$n" "$work/steps/step2"; done
if ((${#failures[@]} == 0)); then
  echo "failover-regather: first publish ${first_seconds} s, next step $(jq .seconds "$work/run/second.json") s"
  echo "failover-regather: 1 passed, 0 failed"
else
  printf 'failover-regather: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

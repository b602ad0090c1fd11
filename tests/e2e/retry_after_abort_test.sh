#!/usr/bin/env bash
# A refit that aborted because a node stayed away must commit when the trainer
# publishes the same step again. Chain trainer -> a1 -> a2 -> a3, policy `all`.
# The victim (the leaf a3, then the relay a2) is killed (SIGKILL) right after it
# journals its 10th chunk and kept away past the connect timeout, so the refit
# aborts. Restarted, it is told ABORT and rolls back. The same step is then
# published again: it must commit everywhere, bit-exact, and no node may be
# skipped a chunk because of what it said it had applied before its rollback.
# Usage: retry_after_abort_test.sh DELTACAST_BINARY [VICTIM ...]
set -uo pipefail
dc=$1
shift
victims=("$@")
((${#victims[@]})) || victims=(a3 a2)
source "$(dirname "$0")/lib.sh"
start_work retry
write_chain_config retry $((27400 + (RANDOM % 150) * 8)) 1 16KiB 4 30s all 2s
export DELTACAST_TOKEN=retry-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 >/dev/null

wait_settled() {  # node: until nothing is in flight (rolled back) or 10 s
  for _ in $(seq 1 100); do [[ -e $work/run/$1/.deltacast/inflight ]] || return 0; sleep 0.1; done
}

passed=0
failed=0
for victim in "${victims[@]}"; do
  rm -rf "$work/run"
  mkdir -p "$work/run"
  for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
  declare -A pid=()
  for n in a1 a2 a3; do
    crash=()
    [[ $n == "$victim" ]] && crash=(DELTACAST_CRASH_AT=agent.applied:10)
    env "${crash[@]}" "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 \
      >>"$work/run/$n.log" 2>&1 &
    pid[$n]=$!
  done
  pids=("${pid[@]}")
  failures=()
  check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
  publish_step 0 1 first  # the victim dies and stays away: aborts after the connect timeout
  check "the victim was not killed at its 10th journaled chunk" bash -c "! kill -0 ${pid[$victim]} 2>/dev/null"
  check "the first refit did not abort" json_holds "$work/run/first.json" '.committed == false'
  "$dc" agent --config "$work/cluster.toml" --node "$victim" --store "$work/run/$victim" --threads 1 \
    >>"$work/run/$victim.log" 2>&1 &
  pid[$victim]=$!
  pids=("${pid[@]}")
  wait_settled "$victim"
  check "$victim did not roll back after it returned" "$dc" verify "$work/run/$victim" "$work/steps/step0"
  publish_step 0 1 second
  check "the retry did not commit ($(jq -r .abort_reason "$work/run/second.json" 2>/dev/null))" \
    json_holds "$work/run/second.json" '.committed == true and .nodes_decided == 3'
  target=$(jq -r .target_version "$work/run/second.json" 2>/dev/null)
  for n in a1 a2 a3; do
    check "$n differs from the target" "$dc" verify "$work/run/$n" "$work/steps/step1"
    check "$n did not make the target active" grep -q "^active $target " "$work/run/$n/.deltacast/active"
  done
  if ((${#failures[@]} == 0)); then
    passed=$((passed + 1))
    echo "retry-after-abort: $victim away past the connect timeout: ok"
  else
    failed=$((failed + 1))
    printf 'retry-after-abort: %s: FAIL: %s\n' "$victim" "${failures[@]}"
  fi
  for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pid[@]}"; do wait "$p" 2>/dev/null || true; done
done
[[ $failed -eq 0 || -z ${KEEP:-} ]] || echo "logs in $work"
echo "retry-after-abort: $passed passed, $failed failed"
((failed == 0))

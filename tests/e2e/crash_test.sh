#!/usr/bin/env bash
# Fault injection with real processes: a chain trainer -> a1 -> a2 -> a3 on
# loopback. For each crash point (docs/recovery.md) one agent -- the relay a2 or
# the leaf a3 -- is killed there (SIGKILL, from inside, at exactly that point) and
# restarted. The refit must still commit, every store must end byte-identical to
# the target, and the restarted agent must be re-sent little beyond what it had not
# yet applied.
#
# Usage: crash_test.sh DELTACAST_BINARY [POINT ...]   (default: every point)
# Environment: VICTIMS (default "a2 a3"), CHUNK (chunk size, default 64KiB), POLICY,
# CONNECT_TIMEOUT.
# Prints one line per run and a summary line "N passed, M failed".
set -uo pipefail
dc=$1
shift
points=("$@")
((${#points[@]})) || points=(agent.chunk_received:2 apply.mid_partition:3 agent.applied:2 agent.prepared
  agent.commit agent.committed fault:agent.corrupt_chunk:2)
source "$(dirname "$0")/lib.sh"
start_work crash
# Ports below the ephemeral range, so no outgoing connection holds one.
write_chain_config crash $((23200 + (RANDOM % 400) * 8)) 1 "${CHUNK:-64KiB}" 4 60s "${POLICY:-all}" "${CONNECT_TIMEOUT:-20s}"
export DELTACAST_TOKEN=crash-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 >/dev/null
# The publisher chunks deterministically: the same diff tells each chunk's size.
"$dc" diff --base "$work/steps/step0" --new "$work/steps/step1" --out "$work/ref.delta" --chunk-size "${CHUNK:-64KiB}" >/dev/null
"$dc" inspect "$work/ref.delta" --json >"$work/ref.json"
delta_bytes=$(jq '.bytes' "$work/ref.json")

start_agent() {  # node [crash point | fault:point]
  local node=$1 point=${2:-}
  if [[ $point == fault:* ]]; then
    DELTACAST_FAULT_AT=${point#fault:} "$dc" ${VERBOSE:+-v} agent --config "$work/cluster.toml" --node "$node" \
      --store "$work/run/$node" --threads 1 >>"$work/run/$node.log" 2>&1 &
  elif [[ -n $point ]]; then
    DELTACAST_CRASH_AT=$point "$dc" ${VERBOSE:+-v} agent --config "$work/cluster.toml" --node "$node" --store "$work/run/$node" \
      --threads 1 >>"$work/run/$node.log" 2>&1 &
  else
    "$dc" ${VERBOSE:+-v} agent --config "$work/cluster.toml" --node "$node" --store "$work/run/$node" --threads 1 \
      >>"$work/run/$node.log" 2>&1 &
  fi
  echo $!
}

passed=0
failed=0
for victim in ${VICTIMS:-a2 a3}; do
  for point in "${points[@]}"; do
    rm -rf "$work/run"
    mkdir -p "$work/run"
    for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
    declare -A pid=()
    for n in a1 a2 a3; do
      if [[ $n == "$victim" ]]; then pid[$n]=$(start_agent "$n" "$point"); else pid[$n]=$(start_agent "$n"); fi
    done
    pids=("${pid[@]}")
    "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" --json \
      --no-progress >"$work/run/publish.json" 2>"$work/run/publish.log" &
    publisher=$!
    # Wait for the victim to hit its crash point, note what it had journaled, restart it.
    crashed=no
    [[ $point == fault:* ]] && crashed=fault
    for _ in $(seq 1 300); do
      [[ $crashed == fault ]] && break
      if ! kill -0 "${pid[$victim]}" 2>/dev/null; then crashed=yes; break; fi
      sleep 0.05
    done
    applied=0
    [[ -f $work/run/$victim/.deltacast/applied ]] && applied=$(grep -c . "$work/run/$victim/.deltacast/applied")
    needed=$(jq --slurpfile j <(sed -n 's/^applied \([0-9]*\) .*/\1/p' "$work/run/$victim/.deltacast/applied" 2>/dev/null |
      jq -s .) '[.chunks[] | select(.sequence as $s | ($j[0] | index($s)) == null) | .bytes] | add // 0' \
      "$work/ref.json")
    end_bytes=$((delta_bytes - $(jq '[.chunks[].bytes] | add // 0' "$work/ref.json")))
    needed=$((needed + end_bytes))
    # Killed after it committed: it needed nothing more.
    [[ -e $work/run/$victim/.deltacast/inflight || ! -e $work/run/$victim/.deltacast/active ]] || needed=0
    [[ $crashed == yes ]] && pid[$victim]=$(start_agent "$victim")
    pids=("${pid[@]}" "$publisher")
    wait "$publisher"
    status=$?
    verdict=ok
    [[ $crashed != no ]] || verdict="did not crash"
    if [[ $crashed == fault ]]; then
      grep -q "failed its checks" "$work/run/$victim.log" || verdict="the damaged chunk was not detected"
    fi
    [[ $status -eq 0 ]] || verdict="publish exit $status: $(jq -r .abort_reason "$work/run/publish.json" 2>/dev/null)"
    target=$(jq -r .target_version "$work/run/publish.json" 2>/dev/null)
    [[ $verdict != ok ]] || json_holds "$work/run/publish.json" '.nodes_decided == 3' >/dev/null ||
      verdict="only $(jq .nodes_decided "$work/run/publish.json") nodes confirmed the commit"
    for n in a1 a2 a3; do
      "$dc" verify "$work/run/$n" "$work/steps/step1" >/dev/null || verdict="$n differs from the target"
      grep -q "^active $target " "$work/run/$n/.deltacast/active" 2>/dev/null || verdict="$n did not make the target active"
      [[ ! -e $work/run/$n/.deltacast/inflight ]] || verdict="$n still has the delta in flight"
    done
    # No node may be sent a chunk it already had (listed in its HELLO, or already
    # carried by the same link): each counts such bytes in its refit line.
    for n in a1 a2 a3; do
      dup=$(grep -h "refit .* committed" "$work/run/$n.log" | tail -1 | sed -n 's/.*resent \([0-9]*\) B.*/\1/p')
      [[ ${dup:-0} -eq 0 ]] || verdict="$n was sent $dup B it already had"
    done
    # Bytes the restarted victim received (its second life's refit line).
    resent=$(grep -h "refit .* committed" "$work/run/$victim.log" | tail -1 | sed -n 's/.*received \([0-9]*\) B.*/\1/p')
    resent=${resent:-0}
    # A damaged chunk is missed by definition: it and what was in flight behind it
    # are sent again; the run checks detection and the outcome, not the byte count.
    [[ $crashed == fault ]] && needed=$resent
    extra=$(awk -v r="$resent" -v n="$needed" -v d="$delta_bytes" 'BEGIN { printf "%.2f", (r - n) * 100 / d }')
    if [[ $verdict == ok ]] && awk -v e="$extra" 'BEGIN { exit !(e <= 1.0) }'; then
      passed=$((passed + 1))
    else
      [[ $verdict == ok ]] && verdict="re-sent ${extra}% more than missed"
      failed=$((failed + 1))
    fi
    torn=$(grep -c "is torn" "$work/run/$victim.log")
    repair=$(grep -h "refit .* committed" "$work/run/$victim.log" | tail -1 | sed -n 's/.*repair \([0-9]*\) B.*/\1/p')
    printf '%-3s %-26s %-34s journaled=%-2s torn=%s (repair %s B) needed=%-7s re-sent=%-7s extra=%s%% of %s B\n' \
      "$victim" "$point" "$verdict" "$applied" "$torn" "${repair:-0}" "$needed" "$resent" "$extra" "$delta_bytes"
    for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pid[@]}"; do wait "$p" 2>/dev/null || true; done
  done
done
echo "crash: $passed passed, $failed failed"
((failed == 0))

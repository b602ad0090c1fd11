#!/usr/bin/env bash
# A subtree left mid-delta by a dead relay commits that delta when the relay
# resolves it. Chain trainer -> a1 -> a2 -> a3 and a sibling b1 under the trainer,
# policy `available`, connect timeout shorter than the failover time. a1 is killed (SIGKILL) as its 4th chunk arrives,
# before it forwards it: a2 and a3 hold part of the delta (3 chunks; a relay forwards
# a chunk before it applies it, so a crash point in the apply would not bound what
# they got), the trainer excuses a1 after 1.5 s and commits
# without its subtree (b1 PREPARED: a refit with no receiver prepared aborts), and a2 cannot reach the trainer before that publish ends.
# a1 is restarted, and the next step is published: the trainer tells a1 the
# delta committed, a1 catches up and passes COMMIT down, and a2 and a3, which
# never got the rest of the delta, must catch up too instead of waiting for
# chunks that will not come. The step must commit everywhere well within the
# commit timeout.
# Usage: resolve_subtree_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work resolve
port_base=$((25400 + (RANDOM % 100) * 8))
write_chain_config resolve "$port_base" 1 16KiB 4 30s available 1500ms
printf '[[node]]\nid = "b1"\nhost = "127.0.0.1"\nport = %d\nparent = "trainer"\n' \
  $((port_base + 4)) >>"$work/cluster.toml"
export DELTACAST_TOKEN=resolve-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 2 --change-rate 5% --threads 2 >/dev/null
mkdir -p "$work/run"
for n in a1 a2 a3 b1; do cp -r "$work/steps/step0" "$work/run/$n"; done
run_agent a1 DELTACAST_CRASH_AT=agent.chunk_received:4
victim=${pids[-1]}
run_agent a2
run_agent a3
run_agent b1
# Every agent up before the trainer listens, so each joins within its retry interval.
for n in a1 a2 a3 b1; do
  for _ in $(seq 1 100); do grep -q "listening on" "$work/run/$n.log" 2>/dev/null && break; sleep 0.05; done
done
publish_step 0 1 first
crashed=yes
kill -0 "$victim" 2>/dev/null && crashed=no
run_agent a1
sleep 1
publish_step 1 2 second
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
check "a1 was not killed at its 4th chunk" test "$crashed" = yes
check "the first step did not commit without a1's subtree" json_holds "$work/run/first.json" '.committed == true'
check "a2 did not hold part of the delta" grep -q "in flight" "$work/run/a2.log"
check "the next step did not commit everywhere ($(jq -r .abort_reason "$work/run/second.json" 2>/dev/null))" \
  json_holds "$work/run/second.json" '.committed == true and .nodes_decided == 4'
check "the next step took $(jq .seconds "$work/run/second.json" 2>/dev/null) s: a relay waited for its subtree" \
  json_holds "$work/run/second.json" '.seconds < 15'
for n in a1 a2 a3 b1; do
  check "$n is not at step 2" "$dc" verify "$work/run/$n" "$work/steps/step2"
  check "$n waited for the confirmations of a resolved delta" \
    bash -c "! grep -q 'did not confirm the decision in time' '$work/run/$n.log'"
done
if ((${#failures[@]} == 0)); then
  echo "resolve-subtree: the next step took $(jq .seconds "$work/run/second.json") s"
  echo "resolve-subtree: 1 passed, 0 failed"
else
  printf 'resolve-subtree: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

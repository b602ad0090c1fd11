#!/usr/bin/env bash
# A root (`deltacast publish --producers 4`) killed with SIGKILL mid-refit, at its
# crash point after its N-th chunk, while the nodes hold part of the delta; then the
# root and its four producer processes are started again on the same step. The
# restarted root streams the delta anew, numbering chunks as its producers deliver
# them: a node's journaled sequence numbers name the lost stream's chunks, which
# need not be the new stream's (docs/protocol.md, "Chunk identity"). The refit must
# commit, every node be byte-identical to the step by hash with nothing in flight,
# no node sent a chunk it had, and the nodes that held chunks must have dealt with
# the lost stream: a1 (held stopped until the new refit is under way) and the nodes
# below it roll it back at the new BEGIN.
# Usage: root_restart_test.sh DELTACAST_BINARY [CRASH_AFTER_CHUNKS]
set -uo pipefail
dc=$1
crash_after=${2:-12}
source "$(dirname "$0")/lib.sh"
start_work rootrestart
base=$((27400 + (RANDOM % 150) * 8))
write_chain_config rootrestart "$base" 1 16KiB 4 60s all 10s
producer_port=$((base + 5))
export DELTACAST_TOKEN=rootrestart-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 \
  --shards tp=2,pp=2 >/dev/null || { echo "synth failed" >&2; exit 1; }

failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }

mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0" "$work/run/$n"
  run_agent "$n"
done

# refit NAME [CRASH_POINT]: the root and four producers publish step0 -> step1.
refit() {
  local name=$1 crash=${2:-}
  env ${crash:+DELTACAST_CRASH_AT=$crash} "$dc" publish --config "$work/cluster.toml" --producers 4 \
    --listen-producers "127.0.0.1:$producer_port" --state-dir "$work/run/source" --json \
    --no-progress >"$work/run/$name.json" 2>>"$work/run/root.log" &
  local root=$!
  local producers=()
  for r in 0 1 2 3; do
    local stem
    stem=$(printf 'rank-%05d' "$r")
    "$dc" produce --config "$work/cluster.toml" --rank "$r" \
      --layout "$work/steps/step1.shards/$stem.toml" \
      --base "$work/steps/step0.shards/$stem.safetensors" \
      --new "$work/steps/step1.shards/$stem.safetensors" \
      --root "127.0.0.1:$producer_port" --threads 1 --json \
      >"$work/run/$name.$stem.json" 2>>"$work/run/$stem.log" &
    producers+=($!)
  done
  wait "$root"
  local status=$?
  for p in "${producers[@]}"; do wait "$p" 2>/dev/null; done
  return $status
}

refit killed "source.chunk_sent:$crash_after"
killed_status=$?
check "the root was not killed at its crash point (exit $killed_status)" test "$killed_status" -ne 0
# The nodes apply what reached them; then they hold part of the delta, journaled.
sleep 1
held=0
for n in a1 a2 a3; do
  [[ -s $work/run/$n/.deltacast/inflight ]] && held=$((held + 1))
done
check "no node held part of the delta when the root died" test "$held" -gt 0

# a1, the root's child, is held stopped while the root restarts, and let go once the
# new refit is under way: it rejoins while the root waits for it, holding the lost
# stream's chunks (rejoining earlier, it would be told ABORT for them).
a1_pid=${pids[0]}
kill -STOP "$a1_pid"
refit again &
again=$!
for _ in $(seq 1 200); do
  (($(grep -c "refit from 4 producers: target .* known" "$work/run/root.log") >= 2)) && break
  sleep 0.1
done
sleep 0.3
kill -CONT "$a1_pid"
wait "$again"
check "the refit from the restarted root did not commit ($(jq -r .abort_reason "$work/run/again.json" 2>/dev/null))" \
  json_holds "$work/run/again.json" '.committed == true and .nodes_decided == 3'
for n in a1 a2 a3; do
  check "$n differs from step1" "$dc" verify "$work/run/$n" "$work/steps/step1"
  check "$n still has a delta in flight" test ! -e "$work/run/$n/.deltacast/inflight"
done
rolled=$(cat "$work"/run/a*.log | grep -c "anew (stream")
resolved=$(cat "$work"/run/a*.log | grep -c "left in flight is resolved")
check "no node dealt with the lost stream (rolled back: $rolled, resolved: $resolved)" \
  test $((rolled + resolved)) -ge "$held"
check "no node met the new stream holding the lost one's chunks (rolled back: $rolled)" \
  test "$rolled" -ge 1
check "a node was sent a chunk it had: $(grep -ho 'resent [1-9][0-9]* B' "$work"/run/a*.log | head -1)" \
  bash -c "! grep -q 'resent [1-9][0-9]* B' $work/run/a*.log"

if ((${#failures[@]})); then
  printf 'FAIL: %s\n' "${failures[@]}" >&2
  tail -n 20 "$work/run/root.log" >&2
  exit 1
fi
echo "root-restart: $held nodes held part of the delta; rolled back $rolled, resolved $resolved; the restarted root committed bit-exact"

#!/usr/bin/env bash
# Simulated power loss with real processes (docs/recovery.md, "Durability"): a chain
# trainer -> a1 -> a2 -> a3 on loopback. One agent -- the relay a2 or the leaf a3 --
# is killed (SIGKILL, from inside) at a crash point, and then its store's files are
# put back to what a machine crash could leave on disk: the bytes of the last flush
# (a snapshot taken before the refit) with a random subset of the pages written
# since, seeded. Its journal and spool are kept as they are: both are fsynced before
# they count. Restarted, the agent must bring its store to the committed version
# (re-applying from its spool, fetching torn partitions from its parent), the refit
# must commit, and every store must end byte-identical to the target with nothing
# in flight and nothing left unflushed.
#
# Points: mid-delta (chunks journaled, pages not flushed), PREPARED (the whole delta
# applied, nothing flushed), committed (before the write-back).
#
# Usage: power_loss_test.sh DELTACAST_BINARY [SEEDS]   (default SEEDS: 2)
# Environment: VICTIMS (default "a2 a3"), POINTS.
# Prints one line per run and a summary line "N passed, M failed".
set -uo pipefail
dc=$1
seeds=${2:-2}
read -r -a points <<<"${POINTS:-agent.applied:2 agent.prepared agent.committed}"
source "$(dirname "$0")/lib.sh"
start_work power-loss
write_chain_config power-loss $((24800 + (RANDOM % 400) * 8)) 1 64KiB 4 60s all 20s
export DELTACAST_TOKEN=power-loss-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 >/dev/null

# lose_pages SNAPSHOT_DIR STORE_DIR SEED: each 4 KiB page of the store's
# safetensors files that differs from the snapshot keeps its new bytes with
# probability 1/2, else gets the snapshot's back; written in place.
lose_pages() {
  python3 - "$1" "$2" "$3" <<'EOF'
import os, random, sys
snap, store, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
dirty = kept = 0
for name in sorted(os.listdir(snap)):
    if not name.endswith(".safetensors"):
        continue
    old = open(os.path.join(snap, name), "rb").read()
    path = os.path.join(store, name)
    new = bytearray(open(path, "rb").read())
    assert len(old) == len(new)
    for at in range(0, len(new), 4096):
        if old[at:at + 4096] == new[at:at + 4096]:
            continue
        dirty += 1
        if rng.random() < 0.5:
            kept += 1
        else:
            new[at:at + 4096] = old[at:at + 4096]
    with open(path, "r+b") as f:
        f.write(new)
        f.flush()
        os.fsync(f.fileno())
print(f"{kept}/{dirty}")
EOF
}

start_agent() {  # node [crash point]
  local node=$1 point=${2:-}
  DELTACAST_CRASH_AT=$point "$dc" agent --config "$work/cluster.toml" --node "$node" \
    --store "$work/run/$node" --threads 2 >>"$work/run/$node.log" 2>&1 &
  echo $!
}

passed=0
failed=0
for victim in ${VICTIMS:-a2 a3}; do
  for point in "${points[@]}"; do
    for seed in $(seq 1 "$seeds"); do
      rm -rf "$work/run"
      mkdir -p "$work/run"
      for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
      sync
      cp -r "$work/steps/step0" "$work/run/snapshot"  # what the disk holds: the last flush
      declare -A pid=()
      for n in a1 a2 a3; do
        if [[ $n == "$victim" ]]; then pid[$n]=$(start_agent "$n" "$point"); else pid[$n]=$(start_agent "$n"); fi
      done
      pids=("${pid[@]}")
      "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" \
        --json --no-progress >"$work/run/publish.json" 2>"$work/run/publish.log" &
      publisher=$!
      crashed=no
      for _ in $(seq 1 300); do
        if ! kill -0 "${pid[$victim]}" 2>/dev/null; then crashed=yes; break; fi
        sleep 0.05
      done
      lost=-
      if [[ $crashed == yes ]]; then
        lost=$(lose_pages "$work/run/snapshot" "$work/run/$victim" "$seed")
        pid[$victim]=$(start_agent "$victim")
      fi
      pids=("${pid[@]}" "$publisher")
      wait "$publisher"
      status=$?
      # A graceful stop waits for the write-back: nothing may be left unflushed.
      for p in "${pid[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
      for p in "${pid[@]}"; do wait "$p" 2>/dev/null || true; done
      verdict=ok
      [[ $crashed == yes ]] || verdict="did not crash"
      [[ $status -eq 0 ]] || verdict="publish exit $status: $(jq -r .abort_reason "$work/run/publish.json" 2>/dev/null)"
      target=$(jq -r .target_version "$work/run/publish.json" 2>/dev/null)
      for n in a1 a2 a3; do
        "$dc" verify "$work/run/$n" "$work/steps/step1" >/dev/null || verdict="$n differs from the target"
        grep -q "^active $target " "$work/run/$n/.deltacast/active" 2>/dev/null ||
          verdict="$n did not make the target active"
        [[ ! -e $work/run/$n/.deltacast/inflight ]] || verdict="$n still has the delta in flight"
        [[ ! -e $work/run/$n/.deltacast/unflushed ]] || verdict="$n is still noted unflushed"
      done
      torn=$(grep -c "is torn" "$work/run/$victim.log")
      mended=$(grep -h "partitions differ from the committed version" "$work/run/$victim.log" |
        sed -n 's/.*: \([0-9]*\) partitions differ.*/\1/p' | tail -1)
      if [[ $verdict == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
      printf '%-3s %-16s seed %-2s %-40s pages kept %-9s torn on resume %-3s fetched on recovery %s\n' \
        "$victim" "$point" "$seed" "$verdict" "$lost" "$torn" "${mended:-0}"
      [[ $verdict == ok ]] || { [[ -n ${KEEP:-} ]] && cp -r "$work/run" "$work/failed-$victim-$point-$seed"; }
    done
  done
done
echo "power loss: $passed passed, $failed failed"
((failed == 0))

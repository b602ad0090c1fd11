#!/usr/bin/env bash
# ENOSPC: a leaf's store sits on a tmpfs with a few KiB to spare, so spooling the
# delta (journaled before it is applied) runs out of space. The leaf must report it,
# the refit must abort everywhere, and every store must be back at the base with
# nothing in flight. With room made, the next publish commits bit-exact.
# Needs root (it mounts a tmpfs); exits 77 (skipped) otherwise.
# Usage: enospc_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work enospc
write_chain_config enospc $((24800 + (RANDOM % 300) * 8)) 1 64KiB 4 30s
export DELTACAST_TOKEN=enospc-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 >/dev/null
mkdir -p "$work/run" "$work/small"
store_bytes=$(du -sb "$work/steps/step0" | cut -f1)
# Room for the store, its manifest cache and a few KiB: not for the spooled delta.
if ! mount -t tmpfs -o size=$((store_bytes + 96 * 1024)) tmpfs "$work/small" 2>/dev/null; then
  echo "enospc: skipped (cannot mount a tmpfs: needs root)"
  exit 77
fi
finish() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null
  [[ -n ${KEEP:-} ]] && return  # keeps the tmpfs mounted for a look
  umount "$work/small" 2>/dev/null
  cleanup
}
trap finish EXIT
cp -r "$work/steps/step0" "$work/run/a1"
cp -r "$work/steps/step0" "$work/run/a2"
cp -r "$work/steps/step0" "$work/small/a3"
ln -s "$work/small/a3" "$work/run/a3"
for n in a1 a2 a3; do
  "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 >>"$work/run/$n.log" 2>&1 &
  pids+=($!)
done
publish() {
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" --json \
    --no-progress --state-dir "$work/run/source" >"$work/run/publish$1.json" 2>>"$work/run/publish.log"
}
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
publish 1
check "the first refit did not abort" json_holds "$work/run/publish1.json" '.committed == false'
check "the abort reason does not name the full disk" grep -q "No space left on device" "$work/run/publish1.json"
check "a3 did not log the full disk" grep -q "No space left on device" "$work/run/a3.log"
sleep 1  # rollbacks finish after the outcome
for n in a1 a2 a3; do
  for _ in $(seq 1 50); do [[ -e $work/run/$n/.deltacast/inflight ]] || break; sleep 0.1; done
  check "$n is not back at the base" "$dc" verify "$work/run/$n" "$work/steps/step0"
  check "$n still has the delta in flight" test ! -e "$work/run/$n/.deltacast/inflight"
done
# Room made: the same publish commits.
mount -o remount,size=$((store_bytes * 2)) "$work/small"
publish 2
check "the second refit did not commit" json_holds "$work/run/publish2.json" '.committed == true and .nodes_decided == 3'
for n in a1 a2 a3; do check "$n differs from the target" "$dc" verify "$work/run/$n" "$work/steps/step1"; done
if ((${#failures[@]} == 0)); then
  echo "enospc: a full disk under a3's journal aborts the refit cleanly; with room it commits"
  echo "enospc: 1 passed, 0 failed"
else
  printf 'enospc: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

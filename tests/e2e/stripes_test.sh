#!/usr/bin/env bash
# Striped trees end to end (docs/protocol.md, "Stripes"): configs/local-7.toml with
# `[tree] stripes = 2`, the source and seven agents as separate processes on
# loopback; each agent joins its parent in both stripes' trees; two published steps,
# every store byte-identical to each step.
# Usage: stripes_test.sh DELTACAST_BINARY SOURCE_DIR
set -euo pipefail
dc=$1
src=$2
source "$(dirname "$0")/lib.sh"  # json_holds
work=$(mktemp -d /tmp/deltacast-stripes.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The config's ports 7600-7607 moved to a per-run base; two stripes; small chunks
# so each stripe carries several.
base=$((20000 + (RANDOM % 400) * 8))
while IFS= read -r line; do
  if [[ $line =~ ^port\ =\ 760([0-7])$ ]]; then
    echo "port = $((base + BASH_REMATCH[1]))"
  elif [[ $line =~ ^chunk_size ]]; then
    echo 'chunk_size = "256KiB"'
    echo 'stripes = 2'
  else
    echo "$line"
  fi
done <"$src/configs/local-7.toml" >"$work/cluster.toml"
grep -q "^stripes = 2" "$work/cluster.toml"

export DELTACAST_TOKEN=e2e-$RANDOM-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 2 --change-rate 3% --threads 2 >/dev/null
mkdir -p "$work/stores"
for i in 1 2 3 4 5 6 7; do
  cp -r "$work/steps/step0" "$work/stores/a$i"
  "$dc" --json-log agent --config "$work/cluster.toml" --node "a$i" --store "$work/stores/a$i" \
    --threads 1 >>"$work/a$i.log" 2>&1 &
  pids+=($!)
done

for k in 1 2; do
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$((k - 1))" \
    --new "$work/steps/step$k" --json >"$work/publish$k.json"
  json_holds "$work/publish$k.json" \
    '.committed == true and .nodes_decided == 7 and (.nodes | length) == 7' >/dev/null
  for i in 1 2 3 4 5 6 7; do
    "$dc" verify "$work/stores/a$i" "$work/steps/step$k" >/dev/null || {
      echo "FAIL: a$i differs from step$k after publish" >&2
      exit 1
    }
  done
  echo "step $k: committed on 7 agents over 2 stripes, all stores byte-identical"
done
# Every agent joined a parent in stripe 1 too (its listening line names it).
for i in 1 2 3 4 5 6 7; do
  grep -q "stripe 1: parent" "$work/a$i.log" || {
    echo "FAIL: a$i did not plan a stripe-1 parent" >&2
    exit 1
  }
done
echo "every agent joined both stripes"

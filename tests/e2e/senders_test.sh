#!/usr/bin/env bash
# Stripes rooted at sender hosts end to end (docs/protocol.md, "Stripes", "Senders"):
# configs/local-7.toml with two `role = "sender"` nodes and `[tree] stripes = 2`; the
# source, both senders (`deltacast agent` without --store) and seven agents as
# separate processes on loopback. Two published steps commit, every store
# byte-identical to each step; each sender confirmed each refit for all seven nodes
# of its stripe. Then a sender dies (SIGKILL at its crash point) in the middle of a
# third refit (commit policy "available"): its stripe's first level fails over to the
# source and the refit commits byte-identical everywhere.
# Usage: senders_test.sh DELTACAST_BINARY SOURCE_DIR
set -euo pipefail
dc=$1
src=$2
source "$(dirname "$0")/lib.sh"  # json_holds
work=$(mktemp -d /tmp/deltacast-senders.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The config's ports 7600-7607 moved to a per-run base, two senders on base+8 and
# base+9; two stripes; small chunks so each stripe carries several; policy available.
base=$((20000 + (RANDOM % 400) * 10))
while IFS= read -r line; do
  if [[ $line =~ ^port\ =\ 760([0-7])$ ]]; then
    echo "port = $((base + BASH_REMATCH[1]))"
  elif [[ $line =~ ^chunk_size ]]; then
    echo 'chunk_size = "16KiB"'
    echo 'stripes = 2'
  elif [[ $line =~ ^commit_policy ]]; then
    echo 'commit_policy = "available"'
  elif [[ $line =~ ^connect_timeout ]]; then
    echo 'connect_timeout = "2s"'
  else
    echo "$line"
  fi
done <"$src/configs/local-7.toml" >"$work/cluster.toml"
for s in 1 2; do
  printf '\n[[node]]\nid = "s%d"\nhost = "127.0.0.1"\nport = %d\nregion = "local"\nrole = "sender"\n' \
    "$s" $((base + 7 + s)) >>"$work/cluster.toml"
done
grep -q "^stripes = 2" "$work/cluster.toml"

export DELTACAST_TOKEN=e2e-$RANDOM-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 3 --change-rate 3% --threads 2 >/dev/null
# s2 dies (SIGKILL, as kill -9) once it forwarded the first data chunk of its third refit.
"$dc" --json-log agent --config "$work/cluster.toml" --node s1 >>"$work/s1.log" 2>&1 &
pids+=($!)
DELTACAST_CRASH_AT=sender.first_chunk_forwarded:3 \
  "$dc" --json-log agent --config "$work/cluster.toml" --node s2 >>"$work/s2.log" 2>&1 &
pids+=($!)
s2=$!
mkdir -p "$work/stores"
for i in 1 2 3 4 5 6 7; do
  cp -r "$work/steps/step0" "$work/stores/a$i"
  "$dc" --json-log agent --config "$work/cluster.toml" --node "a$i" --store "$work/stores/a$i" \
    --threads 1 >>"$work/a$i.log" 2>&1 &
  pids+=($!)
done

verify_all() {
  for i in 1 2 3 4 5 6 7; do
    "$dc" verify "$work/stores/a$i" "$work/steps/step$1" >/dev/null || {
      echo "FAIL: a$i differs from step$1 after publish" >&2
      exit 1
    }
  done
}

for k in 1 2; do
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$((k - 1))" \
    --new "$work/steps/step$k" --json >"$work/publish$k.json"
  json_holds "$work/publish$k.json" \
    '.committed == true and .nodes_decided == 7 and (.nodes | length) == 7' >/dev/null
  # Several data chunks in each stripe (chunk k travels on stripe k mod 2).
  json_holds "$work/publish$k.json" '.chunks >= 5' >/dev/null
  verify_all "$k"
  echo "step $k: committed on 7 agents over 2 sender-rooted stripes, all stores byte-identical"
done
for s in 1 2; do
  n=$(grep -c "committed by 7 nodes of stripe" "$work/s$s.log" || true)
  [[ $n -eq 2 ]] || {
    echo "FAIL: sender s$s confirmed $n refits for all 7 nodes, not 2" >&2
    exit 1
  }
done
echo "each sender confirmed both refits for its whole stripe"

# Step 3: s2 dies mid-refit (its crash point).
"$dc" publish --config "$work/cluster.toml" --base "$work/steps/step2" \
  --new "$work/steps/step3" --json >"$work/publish3.json"
if kill -0 "$s2" 2>/dev/null; then
  echo "FAIL: sender s2 did not die at its crash point" >&2
  exit 1
fi
json_holds "$work/publish3.json" '.committed == true and (.nodes | length) == 7' >/dev/null
verify_all 3
grep -q "failing over to trainer" "$work"/a*.log || {
  echo "FAIL: no node failed over to the source" >&2
  exit 1
}
echo "step 3: sender s2 killed mid-refit; its stripe failed over; committed byte-identical"

#!/usr/bin/env bash
# Multi-process end-to-end test: the source and seven agents of configs/local-7.toml
# (moved to free ports) as separate processes on loopback, three published steps,
# every store byte-identical to each step, plus a protocol-misuse case (an agent
# with the wrong token is refused, the refit aborts, and stores stay at their base).
# Usage: local_tree_test.sh DELTACAST_BINARY SOURCE_DIR
set -euo pipefail
dc=$1
src=$2
source "$(dirname "$0")/lib.sh"  # json_holds
work=$(mktemp -d /tmp/deltacast-e2e.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The config's ports 7600-7607 moved to a per-run base, so runs do not collide.
base=$((20000 + (RANDOM % 400) * 8))  # below the ephemeral port range
while IFS= read -r line; do
  if [[ $line =~ ^port\ =\ 760([0-7])$ ]]; then
    echo "port = $((base + BASH_REMATCH[1]))"
  else
    echo "$line"
  fi
done <"$src/configs/local-7.toml" >"$work/cluster.toml"
grep -q "port = $((base + 7))" "$work/cluster.toml"

export DELTACAST_TOKEN=e2e-$RANDOM-$RANDOM
"$dc" synth --out "$work/steps" --params 8M --steps 3 --change-rate 3% --threads 2 >/dev/null

start_agents() {
  pids=()
  for i in 1 2 3 4 5 6 7; do
    "$dc" --json-log agent --config "$work/cluster.toml" --node "a$i" --store "$work/stores/a$i" --threads 1 \
      >>"$work/a$i.log" 2>&1 &
    pids+=($!)
  done
}
stop_agents() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

mkdir -p "$work/stores"
for i in 1 2 3 4 5 6 7; do cp -r "$work/steps/step0" "$work/stores/a$i"; done
start_agents

for k in 1 2 3; do
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$((k - 1))" --new "$work/steps/step$k" \
    --json >"$work/publish$k.json"
  json_holds "$work/publish$k.json" '.committed == true and .nodes_decided == 7 and (.nodes | length) == 7' >/dev/null
  for i in 1 2 3 4 5 6 7; do
    "$dc" verify "$work/stores/a$i" "$work/steps/step$k" >/dev/null || {
      echo "FAIL: a$i differs from step$k after publish" >&2
      exit 1
    }
  done
  echo "step $k: committed on 7 agents, all stores byte-identical"
done

# Misuse: a7 restarts with the wrong token. Its parent refuses it, the source
# cannot gather its subtree, the refit does not commit, and nobody's bytes change.
stop_agents
# Short timeouts, read by the agents too: a7's parent reports it away (and why)
# after 3 s, well inside the source's commit timeout.
sed -i 's/connect_timeout = "20s"/connect_timeout = "3s"/; s/commit_timeout = "120s"/commit_timeout = "15s"/' "$work/cluster.toml"
DELTACAST_TOKEN=wrong "$dc" agent --config "$work/cluster.toml" --node a7 --store "$work/stores/a7" >>"$work/a7.log" 2>&1 &
bad=$!
for i in 1 2 3 4 5 6; do
  "$dc" --json-log agent --config "$work/cluster.toml" --node "a$i" --store "$work/stores/a$i" --threads 1 \
    >>"$work/a$i.log" 2>&1 &
  pids+=($!)
done
pids+=($bad)
if "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step3" --new "$work/steps/step3" --json \
  >"$work/bad.json" 2>"$work/bad.err"; then
  # Base = target: an empty delta, but every node must still prepare; without a7 it cannot.
  echo "FAIL: publish committed with a refused node" >&2
  exit 1
fi
grep -q "failed authentication" "$work"/a*.log || {
  echo "FAIL: no log line says a7 failed authentication" >&2
  exit 1
}
# The publish's own report says why a7 is missing, not only the logs.
grep -q "a7' failed authentication (wrong cluster token)" "$work/bad.json" "$work/bad.err" || {
  echo "FAIL: the publish does not say a7 was refused for its token" >&2
  cat "$work/bad.json" "$work/bad.err" >&2
  exit 1
}
for i in 1 2 3 4 5 6 7; do
  "$dc" verify "$work/stores/a$i" "$work/steps/step3" >/dev/null || {
    echo "FAIL: a$i changed during a refused refit" >&2
    exit 1
  }
done
echo "misuse: wrong token refused with a clear log line; nothing applied"

# The audit of a node's directory from outside its agent: clean, then a byte flipped
# in a tensor's bytes is named.
stop_agents
"$dc" audit "$work/stores/a1" >"$work/audit.txt" || {
  echo "FAIL: audit of a1 is not clean" >&2
  cat "$work/audit.txt" >&2
  exit 1
}
file=$(ls "$work"/stores/a1/*.safetensors | head -1)
size=$(stat -c %s "$file")
last=$(od -An -tu1 -j $((size - 1)) -N1 "$file" | tr -d ' ')
printf "\\x$(printf %02x $((last ^ 1)))" | dd of="$file" bs=1 seek=$((size - 1)) conv=notrunc status=none
# (The receivers keep snapshot stores: the directory's files are their first
# snapshot, so the flip is reported as that snapshot's damage, on stderr.)
if "$dc" audit "$work/stores/a1" >"$work/audit.txt" 2>&1; then
  echo "FAIL: audit missed a flipped byte" >&2
  exit 1
fi
grep -q "bits differ in partition" "$work/audit.txt" || {
  echo "FAIL: audit does not name what differs" >&2
  cat "$work/audit.txt" >&2
  exit 1
}
echo "audit: a clean directory passes, a flipped byte is named: $(grep -m1 "bits differ" "$work/audit.txt")"

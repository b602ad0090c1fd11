#!/usr/bin/env bash
# Multi-process end-to-end test of the object-store path: configs/bucket-region.toml
# (moved to free ports) with s3rver on loopback, the agents, `deltacast
# bucket-uplink` and `bucket-downlink` as separate processes; two published steps,
# every store (us-east's through the tree, eu-west's through the bucket) byte-identical
# to each step. Exits 77 (skipped) without s3rver (scripts/setup installs it).
# Usage: bucket_region_test.sh DELTACAST_BINARY SOURCE_DIR
set -euo pipefail
dc=$1
src=$2
s3rver=$src/.deps/node/node_modules/s3rver/bin/s3rver.js
if [[ ! -f $s3rver ]] || ! command -v node >/dev/null; then
  echo "SKIP: s3rver is not installed (scripts/setup installs it into .deps/node)"
  exit 77
fi
source "$(dirname "$0")/lib.sh"  # json_holds
work=$(mktemp -d /tmp/deltacast-bucket-e2e.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

base=$((20000 + (RANDOM % 400) * 20))  # below the ephemeral port range
s3port=$((base + 19))
while IFS= read -r line; do
  if [[ $line =~ ^port\ =\ 7([67])([0-9])0$ ]]; then
    echo "port = $((base + (BASH_REMATCH[1] - 6) * 10 + BASH_REMATCH[2]))"
  elif [[ $line =~ ^endpoint ]]; then
    echo "endpoint = \"http://127.0.0.1:$s3port\""
  elif [[ $line =~ ^commit_policy ]]; then
    echo 'commit_policy = "all"'
  else
    echo "$line"
  fi
done <"$src/configs/bucket-region.toml" >"$work/cluster.toml"
grep -q "port = $((base + 13))" "$work/cluster.toml"

node "$s3rver" -d "$work/s3" -a 127.0.0.1 -p "$s3port" -s --no-vhost-buckets \
  --configure-bucket deltacast >"$work/s3rver.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$s3port") 2>/dev/null && break
  sleep 0.1
done

export DELTACAST_TOKEN=e2e-$RANDOM-$RANDOM
export DELTACAST_S3_ACCESS_KEY=S3RVER DELTACAST_S3_SECRET_KEY=S3RVER
"$dc" synth --out "$work/steps" --params 8M --steps 2 --change-rate 3% --threads 2 >/dev/null
"$dc" plan --config "$work/cluster.toml" >"$work/plan.txt"
grep -q "through the object store (bridge bucket-eu)" "$work/plan.txt"

receivers=(us-1 us-2 eu-gw eu-1 eu-2)
mkdir -p "$work/stores"
for n in "${receivers[@]}"; do
  cp -r "$work/steps/step0" "$work/stores/$n"
  "$dc" --json-log agent --config "$work/cluster.toml" --node "$n" --store "$work/stores/$n" \
    --threads 1 >>"$work/$n.log" 2>&1 &
  pids+=($!)
done
"$dc" bucket-uplink --config "$work/cluster.toml" --node bucket-eu --state "$work/uplink" \
  >>"$work/uplink.log" 2>&1 &
pids+=($!)
"$dc" bucket-downlink --config "$work/cluster.toml" --node bucket-eu --state "$work/downlink" \
  >>"$work/downlink.log" 2>&1 &
pids+=($!)

for k in 1 2; do
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$((k - 1))" \
    --new "$work/steps/step$k" --json >"$work/publish$k.json"
  json_holds "$work/publish$k.json" '.committed == true and (.nodes | length) == 5' >/dev/null
  for n in "${receivers[@]}"; do
    for _ in $(seq 100); do
      "$dc" verify "$work/stores/$n" "$work/steps/step$k" >/dev/null 2>&1 && continue 2
      sleep 0.1
    done
    echo "FAIL: $n differs from step$k after publish" >&2
    exit 1
  done
  echo "step $k: committed on 5 nodes (3 through the bucket), all stores byte-identical"
done
grep -q "the region prepared" "$work/uplink.log"
echo "1 passed, 0 failed"

#!/usr/bin/env bash
# Producer links over TLS with real processes (docs/producers.md, "TLS on producer
# links"): the tree is one region, [security] producer_region puts the producers in
# another, so their links to the root must run TLS. `deltacast certs --producer`
# issues the ranks' certificates; two `deltacast produce` processes publish a step
# through `deltacast publish --producers 2` and every node verifies against it.
# Then a rank whose config leaves producer_region out (so it dials in plaintext)
# is refused: `deltacast produce` exits non-zero naming the reason, the root's
# publish fails naming it too, and no node changes.
# Usage: producer_tls_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work producer-tls
base=$((29800 + (RANDOM % 150) * 8))
write_chain_config producer-tls "$base" 1 64KiB 4 60s all 4s
producer_port=$((base + 5))
export DELTACAST_TOKEN=producer-tls-$RANDOM
"$dc" synth --out "$work/steps" --params 2M --steps 1 --change-rate 3% --threads 2 \
  --shards tp=2 >/dev/null || { echo "synth failed" >&2; exit 1; }

failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }

# The plaintext producer's config, then the cluster's: producers in "eu".
cp "$work/cluster.toml" "$work/plain.toml"
"$dc" certs --config "$work/cluster.toml" --out "$work/certs" --producer rank-00000 \
  --producer rank-00001 >"$work/certs.out" 2>&1 || { cat "$work/certs.out" >&2; exit 1; }
check "certs did not issue rank-00001's certificate" test -s "$work/certs/rank-00001.crt"
security="[security]
producer_region = \"eu\"
ca = \"$work/certs/ca.crt\"
cert = \"$work/certs/{node}.crt\"
key = \"$work/certs/{node}.key\"
[[region]]
name = \"eu\"
wan_bandwidth = \"1Gbit\"
wan_latency = \"1ms\""
printf '%s\n' "$security" >>"$work/cluster.toml"
# The plaintext one names the same files but not producer_region.
printf '%s\n' "$security" | sed '/producer_region/d; /^\[\[region\]\]/,$d' >>"$work/plain.toml"

mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0" "$work/run/$n"
  run_agent "$n"
done

# produce CONFIG RANK NAME: one producer process for RANK, step 0 -> 1.
produce() {
  local stem
  stem=$(printf 'rank-%05d' "$2")
  "$dc" produce --config "$1" --rank "$2" \
    --layout "$work/steps/step1.shards/$stem.toml" \
    --base "$work/steps/step0.shards/$stem.safetensors" \
    --new "$work/steps/step1.shards/$stem.safetensors" \
    --root "127.0.0.1:$producer_port" --threads 1 --json \
    >"$work/run/$3.$stem.json" 2>"$work/run/$3.$stem.log"
}
# root NAME: the root for two producers, in the background ($root).
root() {
  "$dc" publish --config "$work/cluster.toml" --producers 2 \
    --listen-producers "127.0.0.1:$producer_port" --state-dir "$work/run/source" --json \
    --no-progress >"$work/run/$1.json" 2>>"$work/run/root.$1.log" &
  root=$!
}

# Refused: rank 1 dials in plaintext (its config puts it in the root's region).
root refused
produce "$work/cluster.toml" 0 refused &
good=$!
produce "$work/plain.toml" 1 refused
plain_status=$?
wait "$root"
root_status=$?
kill "$good" 2>/dev/null
wait "$good" 2>/dev/null
why="producer 'rank-00001' must connect over TLS with its certificate"
check "the plaintext producer exited 0" test "$plain_status" != 0
check "the plaintext producer did not say why: $(tail -c 300 "$work/run/refused.rank-00001.log")" \
  grep -q "$why" "$work/run/refused.rank-00001.log"
check "the root's publish exited 0 without producer 1" test "$root_status" != 0
check "the root did not name the refusal: $(tail -c 300 "$work/run/root.refused.log")" \
  grep -q "$why" "$work/run/root.refused.log"
for n in a1 a2 a3; do check "$n changed after a refused producer" "$dc" verify "$work/run/$n" "$work/steps/step0"; done

# Both over TLS: the step commits and every node holds it.
root tls
produce "$work/cluster.toml" 0 tls &
first=$!
produce "$work/cluster.toml" 1 tls
wait "$first"
wait "$root"
check "the refit from producers over TLS did not commit ($(jq -r .abort_reason "$work/run/tls.json" 2>/dev/null))" \
  json_holds "$work/run/tls.json" '.committed == true and .nodes_decided == 3 and (.producers | length) == 2'
check "the root did not take the producers over TLS" \
  grep -q "producer rank-00001 joined from .* with TLS" "$work/run/root.tls.log"
for n in a1 a2 a3; do check "$n differs from step1" "$dc" verify "$work/run/$n" "$work/steps/step1"; done

if ((${#failures[@]})); then
  printf 'FAIL: %s\n' "${failures[@]}" >&2
  tail -n 20 "$work/run/root.refused.log" "$work/run/root.tls.log" >&2
  exit 1
fi
echo "producer tls: producers over TLS published, a plaintext one was refused at both ends"

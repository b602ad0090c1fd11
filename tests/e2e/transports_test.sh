#!/usr/bin/env bash
# Per-hop transports across processes: trainer -> a1 over ucx, trainer -> a2 over
# tcp (a2 speaks only tcp), a1 -> a3 preferring ucx but falling back to tcp because
# a1's ucx port is taken. One step is published; every store must be byte-identical
# to it, and the logs must show the backend each hop negotiated and the fallback.
# Usage: transports_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work transports
base=$(free_port_base 12)  # 3 ports per node, none held by another socket
cat >"$work/cluster.toml" <<TOML
[cluster]
name = "transports"
[tree]
fanout = 2
chunk_size = "64KiB"
connect_timeout = "5s"
[transport]
ucx_provider = "tcp"
[[node]]
id = "trainer"
host = "127.0.0.1"
port = $base
role = "source"
transports = ["ucx", "tcp"]
[[node]]
id = "a1"
host = "127.0.0.1"
port = $((base + 3))
uplink = "100Gbit"
transports = ["ucx", "tcp"]
[[node]]
id = "a2"
host = "127.0.0.1"
port = $((base + 6))
transports = ["tcp"]
[[node]]
id = "a3"
host = "127.0.0.1"
port = $((base + 9))
parent = "a1"
transports = ["ucx", "tcp"]
TOML
export DELTACAST_TOKEN=transports-$RANDOM
"$dc" plan --config "$work/cluster.toml" >"$work/plan.txt" || { echo "transports: plan failed"; exit 1; }
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 3% --threads 2 >/dev/null
# Something else holds a1's ucx port (port + 1).
python3 -c "import socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $((base + 4)))); s.listen(); open('$work/squatting', 'w').close()
time.sleep(300)" &
pids+=($!)
for _ in $(seq 1 100); do [[ -e $work/squatting ]] && break; sleep 0.05; done
mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0" "$work/run/$n"
  "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 >>"$work/run/$n.log" 2>&1 &
  pids+=($!)
done
"$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" --json \
  --no-progress --state-dir "$work/run/source" >"$work/run/publish.json" 2>"$work/run/publish.log"
failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }
check "the refit did not commit on all 3" json_holds "$work/run/publish.json" '.committed == true and .nodes_decided == 3'
for n in a1 a2 a3; do check "$n differs from step1" "$dc" verify "$work/run/$n" "$work/steps/step1"; done
check "plan does not show trainer -> a1 via ucx" grep -q "<- trainer .* via ucx (then tcp)" "$work/plan.txt"
check "plan does not show a2 via tcp" grep -q "a2 .*<- trainer .* via tcp " "$work/plan.txt"
check "a1 did not join over ucx" grep -q "joined parent trainer over ucx" "$work/run/a1.log"
check "a2 did not join over tcp" grep -q "joined parent trainer over tcp" "$work/run/a2.log"
check "a1 did not report its ucx listener failing" grep -q "cannot listen over ucx" "$work/run/a1.log"
check "a3 did not log its fallback" grep -q "over tcp after falling back: ucx 127.0.0.1:$((base + 4))" "$work/run/a3.log"
check "a3 did not join a1 over tcp" grep -q "joined parent a1 over tcp" "$work/run/a3.log"
if ((${#failures[@]} == 0)); then
  echo "transports: ucx hop, tcp hop and a ucx -> tcp fallback: all bit-exact"
  echo "transports: 1 passed, 0 failed"
else
  printf 'transports: FAIL: %s\n' "${failures[@]}"
  [[ -n ${KEEP:-} ]] && echo "logs in $work"
  exit 1
fi

#!/usr/bin/env bash
# Kill during rollback: a chain trainer -> a1 -> a2 -> a3 where a3 holds the wrong
# version, so the refit aborts; a2 is killed (SIGKILL) as its rollback starts and
# restarted. Every node must end at its own version before the refit (a1, a2 at
# the base, a3 untouched), with nothing left in flight.
# Usage: abort_crash_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work abort
# Ports below the ephemeral range, so no outgoing connection holds one.
write_chain_config abort $((29000 + (RANDOM % 60) * 8)) 1 32KiB 4 30s
export DELTACAST_TOKEN=abort-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 1 --change-rate 5% --threads 2 >/dev/null
"$dc" synth --out "$work/other" --params 4M --steps 1 --seed 99 --threads 2 >/dev/null
mkdir -p "$work/run"
cp -r "$work/steps/step0" "$work/run/a1"
cp -r "$work/steps/step0" "$work/run/a2"
cp -r "$work/other/step0" "$work/run/a3"  # another model: the refit must abort
agent() { "$dc" agent --config "$work/cluster.toml" --node "$1" --store "$work/run/$1" --threads 1 >>"$work/run/$1.log" 2>&1 & }
agent a1
pids+=($!)
DELTACAST_CRASH_AT=agent.abort "$dc" agent --config "$work/cluster.toml" --node a2 --store "$work/run/a2" \
  --threads 1 >>"$work/run/a2.log" 2>&1 &
victim=$!
agent a3
pids+=($! $victim)
"$dc" publish --config "$work/cluster.toml" --base "$work/steps/step0" --new "$work/steps/step1" --json \
  --no-progress --state-dir "$work/run/source" >"$work/run/publish.json" 2>"$work/run/publish.log" &
publisher=$!
pids+=($publisher)
for _ in $(seq 1 400); do kill -0 "$victim" 2>/dev/null || break; sleep 0.05; done
crashed=yes
kill -0 "$victim" 2>/dev/null && crashed=no
agent a2
pids+=($!)
wait "$publisher"
sleep 1  # let the restarted a2 finish its rollback
verdict=ok
[[ $crashed == yes ]] || verdict="a2 did not crash"
json_holds "$work/run/publish.json" '.committed == false' >/dev/null || verdict="the refit did not abort"
for n in a1 a2; do
  for _ in $(seq 1 100); do [[ -e $work/run/$n/.deltacast/inflight ]] || break; sleep 0.1; done
  "$dc" verify "$work/run/$n" "$work/steps/step0" >/dev/null || verdict="$n is not back at the base"
  [[ ! -e $work/run/$n/.deltacast/inflight ]] || verdict="$n still has the delta in flight"
done
"$dc" verify "$work/run/a3" "$work/other/step0" >/dev/null || verdict="a3 changed"
echo "abort-crash: kill a2 at agent.abort: $verdict"
if [[ $verdict == ok ]]; then echo "abort-crash: 1 passed, 0 failed"; else echo "abort-crash: 0 passed, 1 failed"; exit 1; fi

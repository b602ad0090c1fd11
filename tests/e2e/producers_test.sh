#!/usr/bin/env bash
# Many producers as separate processes: the ranks of a TP=2 x PP=2 job each run
# `deltacast produce` over their own shard pair; `deltacast publish --producers 4`
# is the root of a chain trainer -> a1 -> a2 -> a3. Then a producer is killed
# (SIGKILL at its crash point) while streaming: the refit must abort and every
# node stay byte-identical to the base; with the rank back, the same step commits.
# Also: `deltacast layout check` passes the job's layouts and names the overlap when
# one rank claims another's coordinates; a producer whose previous shard is another
# step's is refused at the root, naming it, and no node changes.
# Usage: producers_test.sh DELTACAST_BINARY
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work producers
base=$((28600 + (RANDOM % 150) * 8))
write_chain_config producers "$base" 1 64KiB 4 60s all 10s
producer_port=$((base + 5))
export DELTACAST_TOKEN=producers-$RANDOM
"$dc" synth --out "$work/steps" --params 6M --steps 2 --change-rate 3% --threads 2 \
  --shards tp=2,pp=2 >/dev/null || { echo "synth failed" >&2; exit 1; }

failures=()
check() { "${@:2}" >/dev/null 2>&1 || failures+=("$1"); }

mkdir -p "$work/run"
for n in a1 a2 a3; do
  cp -r "$work/steps/step0" "$work/run/$n"
  "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 \
    >>"$work/run/$n.log" 2>&1 &
  pids+=($!)
done

check "layout check refused the job's own layouts" "$dc" layout check "$work/steps/step1.shards"
mkdir -p "$work/twin"
cp "$work/steps/step1.shards/"* "$work/twin/"
cp "$work/twin/rank-00000.toml" "$work/twin/rank-00001.toml"  # rank 1 claims rank 0's place
"$dc" layout check "$work/twin" >/dev/null 2>"$work/twin.err"
twin_status=$?
check "layout check did not exit 2 on two ranks with one place ($twin_status)" test "$twin_status" = 2
check "layout check did not name the overlap: $(head -c 300 "$work/twin.err")" \
  grep -q "covered twice" "$work/twin.err"

# refit NAME FROM TO [CRASH_RANK [BASE_DIR [STALE_RANK]]]: the root and four producer
# processes; STALE_RANK compares against step 0's shard instead of FROM's.
refit() {
  local name=$1 from=$2 to=$3 crash_rank=${4:-} base_dir=${5:-} stale_rank=${6:-}
  local extra=()
  [[ -n $base_dir ]] && extra=(--base "$base_dir")
  "$dc" publish --config "$work/cluster.toml" --producers 4 \
    --listen-producers "127.0.0.1:$producer_port" --state-dir "$work/run/source" --json --no-progress \
    "${extra[@]}" >"$work/run/$name.json" 2>>"$work/run/root.log" &
  local root=$!
  local producers=()
  for r in 0 1 2 3; do
    local stem
    stem=$(printf 'rank-%05d' "$r")
    local crash=()
    [[ $r == "$crash_rank" ]] && crash=(DELTACAST_CRASH_AT=producer.streaming)
    local previous=$from
    [[ $r == "$stale_rank" ]] && previous=0
    env "${crash[@]}" "$dc" produce --config "$work/cluster.toml" --rank "$r" \
      --layout "$work/steps/step$to.shards/$stem.toml" \
      --base "$work/steps/step$previous.shards/$stem.safetensors" \
      --new "$work/steps/step$to.shards/$stem.safetensors" \
      --root "127.0.0.1:$producer_port" --threads 1 --json \
      >"$work/run/$name.$stem.json" 2>>"$work/run/$stem.log" &
    producers+=($!)
  done
  wait "$root"
  for p in "${producers[@]}"; do wait "$p" 2>/dev/null; done
}

refit first 0 1
check "the first refit from producers did not commit" \
  json_holds "$work/run/first.json" '.committed == true and .nodes_decided == 3 and (.producers | length) == 4'
check "the producers did not hash their base (the root had no manifest)" \
  json_holds "$work/run/first.json" '.base_from_producers == true'
for n in a1 a2 a3; do check "$n differs from step1" "$dc" verify "$work/run/$n" "$work/steps/step1"; done

refit killed 1 2 2
check "the refit with a killed producer did not abort" \
  json_holds "$work/run/killed.json" '.committed == false and (.abort_reason | test("rank-00002"))'
check "rank 2 was not killed at its crash point" bash -c "! [[ -s $work/run/killed.rank-00002.json ]]"
for n in a1 a2 a3; do
  for _ in $(seq 1 100); do [[ -e $work/run/$n/.deltacast/inflight ]] || break; sleep 0.1; done
  check "$n did not roll back to step1" "$dc" verify "$work/run/$n" "$work/steps/step1"
done

refit stale 1 2 "" "$work/steps/step1" 3
# A fresh root knows no producer's pieces: it names the producers that share the
# partitions that differ (here every partition of rank 3 is shared with rank 2).
check "a producer with step 0 as its previous shard was not refused at the root" \
  grep -Eq "producers? [^(]*rank-00003.* compared against another base" "$work/run/root.log"
check "the refused refit wrote a report" bash -c "! [[ -s $work/run/stale.json ]]"
for n in a1 a2 a3; do check "$n changed after a refused refit" "$dc" verify "$work/run/$n" "$work/steps/step1"; done

refit retry 1 2 "" "$work/steps/step1"
check "the retry did not commit ($(jq -r .abort_reason "$work/run/retry.json" 2>/dev/null))" \
  json_holds "$work/run/retry.json" '.committed == true and .nodes_decided == 3 and .base_from_producers == false'
for n in a1 a2 a3; do check "$n differs from step2" "$dc" verify "$work/run/$n" "$work/steps/step2"; done

if ((${#failures[@]})); then
  printf 'FAIL: %s\n' "${failures[@]}" >&2
  tail -n 20 "$work/run/root.log" >&2
  exit 1
fi
echo "producers: 4 producer processes published, a killed one aborted cleanly, the retry committed"

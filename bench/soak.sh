#!/usr/bin/env bash
# Recovery soak: real agents and a real source on loopback, killed with SIGKILL at
# random moments of a publish, then restarted; the trainer publishes until the step
# commits, then publishes one clean step that must reach every node.
#
# Tree (parents fixed in the config): trainer -> n1 -> n2 -> {n3, n4}, n1 -> n5,
# so n1 and n2 are relays whose children can fail over (to the trainer and to n1).
# Each run draws from the seed:
#   - the commit policy (`all` and `available` alternate),
#   - a victim: the source, a relay or a leaf (relays more often),
#   - how it dies: at a uniformly random moment of the publish (most runs) or at a
#     named crash point (docs/recovery.md),
#   - how long it stays away: briefly, past the connect timeout (under `all` the
#     refit aborts and the step is published again), or, for a relay under
#     `available`, past the failover time so its children attach to their
#     grandparent while it is down, and it restarts while they are there,
#   - sometimes a second victim killed a little later.
#
# Per run it checks: the step commits within 5 publishes (else "never committed"),
# no publish takes longer than HANG seconds (else "hung"), after the faulty step
# every store is exactly at the base or the target (else "torn"), and after the
# clean step every store is bit-exact at it and active (else "lost"). Bytes: every
# node's committed refit line gives what it received and "resent" (chunks it was
# sent though its HELLO listed them or its link had already carried them: must be
# 0); extra = received - needed, where needed is the delta less the chunks the node
# had journaled when the committed publish began (or when it died in it).
#
# Prints one line per run on stderr and a JSON summary on stdout.
# Usage: bench/soak.sh [RUNS] [SEED] [--params 20M] [--chunk 16KiB] [--hang 20]
#   (VICTIMS="trainer n2" narrows who is killed; KEEP_FAILED=1 keeps failed runs' logs)
#   (needs build/bin/deltacast, or the binary in $DELTACAST; ~5-10 s a run)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=30
seed=1
params=20M
chunk=16KiB
hang=20
positional=()
while (($#)); do
  case $1 in
    --params) params=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    --hang) hang=$2; shift 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
((${#positional[@]} > 0)) && runs=${positional[0]}
((${#positional[@]} > 1)) && seed=${positional[1]}
dc=${DELTACAST:-$PWD/build/bin/deltacast}
source tests/e2e/lib.sh
start_work soak
RANDOM=$seed
export DELTACAST_TOKEN=soak-$seed
nodes=(n1 n2 n3 n4 n5)
declare -A parent=([n1]=trainer [n2]=n1 [n3]=n2 [n4]=n2 [n5]=n1)
connect_timeout_s=2

write_config() {  # policy
  local base=$((20000 + (RANDOM % 300) * 20))
  {
    printf '[cluster]\nname = "soak"\n[tree]\nchunk_size = "%s"\nwindow = 4\n' "$chunk"
    printf 'connect_timeout = "%ss"\ncommit_timeout = "30s"\nidle_timeout = "10s"\ncommit_policy = "%s"\n' \
      "$connect_timeout_s" "$1"
    printf '[[node]]\nid = "trainer"\nhost = "127.0.0.1"\nport = %d\nrole = "source"\n' "$base"
    local i=1
    for n in "${nodes[@]}"; do
      printf '[[node]]\nid = "%s"\nhost = "127.0.0.1"\nport = %d\nparent = "%s"\n' "$n" $((base + 3 * i)) "${parent[$n]}"
      i=$((i + 1))
    done
  } >"$work/cluster.toml"
}

"$dc" synth --out "$work/steps" --params "$params" --steps 2 --change-rate 3% --threads 2 >/dev/null
# The source chunks deterministically: the same diff tells each chunk's size.
"$dc" diff --base "$work/steps/step0" --new "$work/steps/step1" --out "$work/ref.delta" --chunk-size "$chunk" >/dev/null
"$dc" inspect "$work/ref.delta" --json >"$work/ref.json"
delta_bytes=$(jq '.bytes' "$work/ref.json")
jq -r '.chunks[] | "\(.sequence) \(.bytes)"' "$work/ref.json" >"$work/chunk_sizes"

declare -A pid=()
start_agent() {  # node [env assignment]
  env ${2:-} "$dc" agent --config "$work/cluster.toml" --node "$1" --store "$work/run/$1" --threads 1 \
    >>"$work/run/$1.log" 2>&1 &
  pid[$1]=$!
}
# Bytes of the delta a node still needs: the delta less the chunks it journaled.
needed_by() {  # node
  local journal=$work/run/$1/.deltacast/applied
  if [[ ! -e $work/run/$1/.deltacast/inflight || ! -f $journal ]]; then echo "$delta_bytes"; return; fi
  sed -n 's/^applied \([0-9]*\) .*/\1/p' "$journal" | sort -u |
    awk -v d="$delta_bytes" 'NR == FNR { size[$1] = $2; next } { d -= size[$1] } END { print d }' "$work/chunk_sizes" -
}
publish() {  # from to name: in the background, as $publisher
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1" --new "$work/steps/step$2" --json \
    --no-progress --state-dir "$work/run/source" >"$work/run/$3.json" 2>>"$work/run/publish.log" &
  publisher=$!
}
elapsed() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }'; }
kill_node() {  # node ("trainer" kills the publisher)
  if [[ $1 == trainer ]]; then kill -9 "$publisher" 2>/dev/null; else kill -9 "${pid[$1]}" 2>/dev/null; fi
}

# Calibrate how long a clean publish runs here, so kill times cover all of it.
write_config all
rm -rf "$work/run" && mkdir -p "$work/run"
for n in "${nodes[@]}"; do cp -r "$work/steps/step0" "$work/run/$n"; start_agent "$n"; done
t0=$(date +%s.%N)
publish 0 1 calibrate
wait "$publisher"
span=$(elapsed "$t0")
for n in "${nodes[@]}"; do kill "${pid[$n]}" 2>/dev/null; done
wait 2>/dev/null
echo "soak: a clean publish takes ${span} s here; delta ${delta_bytes} B" >&2

# Progress lines go to the terminal (fd 3); the shell's notes about the processes
# it killed go to a file.
exec 3>&2 2>>"$work/soak.stderr"
points=(agent.chunk_received agent.apply_flushed agent.applied apply.mid_partition agent.prepared agent.commit
  agent.committed agent.abort)
totals_runs=0 totals_ok=0 torn=0 lost=0 hung=0 never=0 resent_total=0 extra_total=0 needed_total=0 extra_max=0
for ((r = 0; r < runs; r++)); do
  policy=$([[ $((r % 2)) -eq 0 ]] && echo all || echo available)
  write_config "$policy"
  rm -rf "$work/run" && mkdir -p "$work/run"
  # Victims: relays twice as often as the source or a leaf.
  read -r -a pick <<<"${VICTIMS:-trainer n1 n1 n2 n2 n3 n4 n5}"
  victim=${pick[$((RANDOM % ${#pick[@]}))]}
  second=""
  ((RANDOM % 4 == 0)) && second=${pick[$((RANDOM % ${#pick[@]}))]}
  [[ $second == "$victim" ]] && second=""
  how=time
  [[ $victim != trainer && $((RANDOM % 4)) -eq 0 ]] && how=point
  point=${points[$((RANDOM % ${#points[@]}))]}:$((1 + RANDOM % 6))
  case $((RANDOM % 3)) in
    0) away=0.$((RANDOM % 10)) ;;
    1) away=$((connect_timeout_s + 1)).$((RANDOM % 10)) ;;   # past the connect timeout
    2) away=$((3 + connect_timeout_s + RANDOM % 3)).$((RANDOM % 10)) ;;  # past failover (3 s)
  esac
  kill_at=$(awk -v s="$span" -v u="$RANDOM" 'BEGIN { printf "%.3f", 1.2 * s * u / 32768 }')
  for n in "${nodes[@]}"; do
    cp -r "$work/steps/step0" "$work/run/$n"
    if [[ $n == "$victim" && $how == point ]]; then start_agent "$n" "DELTACAST_CRASH_AT=$point"; else start_agent "$n"; fi
  done
  desc="$policy victim=$victim $([[ $how == point ]] && echo "at=$point" || echo "after=${kill_at}s") away=${away}s${second:+ then $second}"
  declare -A needed=()
  for n in "${nodes[@]}"; do needed[$n]=$delta_bytes; done
  verdict=ok
  attempt=1
  t0=$(date +%s.%N)
  publish 0 1 attempt1
  if [[ $how == time ]]; then
    sleep "$kill_at"
    kill_node "$victim"
  else
    for _ in $(seq 1 100); do kill -0 "${pid[$victim]}" 2>/dev/null || break; sleep 0.05; done
    kill -9 "${pid[$victim]}" 2>/dev/null  # its point was not reached: killed now instead
  fi
  [[ $victim != trainer ]] && needed[$victim]=$(needed_by "$victim")
  if [[ -n $second ]]; then
    sleep 0.$((RANDOM % 5))
    kill_node "$second"
    [[ $second != trainer ]] && needed[$second]=$(needed_by "$second")
  fi
  sleep "$away"
  for v in $victim $second; do [[ $v == trainer ]] || start_agent "$v"; done
  wait "$publisher" 2>/dev/null
  if awk -v e="$(elapsed "$t0")" -v h="$hang" 'BEGIN { exit !(e > h) }'; then
    verdict="hung: publish 1 took $(elapsed "$t0") s"
  fi
  while ! json_holds "$work/run/attempt$attempt.json" '.committed == true' >/dev/null 2>&1 && ((attempt < 5)); do
    # After an ABORT every live node rolls back: let that finish before noting what
    # each holds (a node still rolling back would seem to need less than the delta).
    # After a source crash nodes keep the delta until the next publish resolves it.
    if json_holds "$work/run/attempt$attempt.json" '.committed == false'; then
      for _ in $(seq 1 100); do
        busy=0
        for n in "${nodes[@]}"; do
          kill -0 "${pid[$n]}" 2>/dev/null && [[ -e $work/run/$n/.deltacast/inflight ]] && busy=1
        done
        ((busy)) || break
        sleep 0.1
      done
    fi
    attempt=$((attempt + 1))
    sleep 0.5  # then note what each node holds
    for n in "${nodes[@]}"; do needed[$n]=$(needed_by "$n"); done
    t0=$(date +%s.%N)
    publish 0 1 "attempt$attempt"
    wait "$publisher"
    if awk -v e="$(elapsed "$t0")" -v h="$hang" 'BEGIN { exit !(e > h) }'; then
      [[ $verdict == ok ]] && verdict="hung: publish $attempt took $(elapsed "$t0") s"
    fi
  done
  # The refit id as written (a u64: jq would round it to a double).
  committed=""
  json_holds "$work/run/attempt$attempt.json" '.committed == true' &&
    committed=$(grep -o '"refit_id": *[0-9]*' "$work/run/attempt$attempt.json" | grep -o '[0-9]*$')
  if [[ -z $committed ]]; then
    verdict="never committed: $(jq -r .abort_reason "$work/run/attempt$attempt.json" 2>/dev/null)"
    never=$((never + 1))
  fi
  # Never torn: after the faulty step a store with nothing in flight is exactly at
  # the base or the target (one still recovering finishes at the clean step).
  sleep 0.3
  for n in "${nodes[@]}"; do
    [[ -e $work/run/$n/.deltacast/inflight ]] && continue
    "$dc" verify "$work/run/$n" "$work/steps/step1" >/dev/null 2>&1 ||
      "$dc" verify "$work/run/$n" "$work/steps/step0" >/dev/null 2>&1 || { verdict="$n torn"; torn=$((torn + 1)); }
  done
  # Bytes, from each node's committed refit line.
  run_resent=0 run_extra=0 run_needed=0
  if [[ -n $committed ]]; then
    for n in "${nodes[@]}"; do
      # One line per life of the node that finished this refit (a relay that
      # committed, died and re-gathered its confirmations logs it twice).
      lines=$(grep -h "refit $committed committed" "$work/run/$n.log")
      [[ -n $lines ]] || continue  # excused (policy available): it catches up below
      received=$(sed -n 's/.*received \([0-9]*\) B.*/\1/p' <<<"$lines" | awk '{ s += $1 } END { print s + 0 }')
      resent=$(sed -n 's/.* resent \([0-9]*\) B.*/\1/p' <<<"$lines" | awk '{ s += $1 } END { print s + 0 }')
      run_resent=$((run_resent + resent))
      run_extra=$((run_extra + received - needed[$n]))
      run_needed=$((run_needed + needed[$n]))
    done
  fi
  ((run_resent == 0)) || [[ $verdict != ok ]] || verdict="resent $run_resent B a node had"
  # Liveness and no lost version: a clean step reaches every node.
  t0=$(date +%s.%N)
  publish 1 2 clean
  wait "$publisher"
  if ! json_holds "$work/run/clean.json" '.committed == true and .nodes_decided == 5' >/dev/null 2>&1; then
    [[ $verdict == ok ]] && verdict="clean step: $(jq -r '"committed=\(.committed) decided=\(.nodes_decided) \(.abort_reason)"' "$work/run/clean.json" 2>/dev/null)"
    lost=$((lost + 1))
  elif awk -v e="$(elapsed "$t0")" -v h="$hang" 'BEGIN { exit !(e > h) }'; then
    [[ $verdict == ok ]] && verdict="hung: the clean step took $(elapsed "$t0") s"
  fi
  for n in "${nodes[@]}"; do
    "$dc" verify "$work/run/$n" "$work/steps/step2" >/dev/null 2>&1 && continue
    if "$dc" verify "$work/run/$n" "$work/steps/step1" >/dev/null 2>&1 ||
      "$dc" verify "$work/run/$n" "$work/steps/step0" >/dev/null 2>&1; then
      [[ $verdict == ok ]] && verdict="$n not at the clean step"
      lost=$((lost + 1))
    else
      [[ $verdict == ok ]] && verdict="$n torn after the clean step"
      torn=$((torn + 1))
    fi
  done
  [[ $verdict == hung* ]] && hung=$((hung + 1))
  totals_runs=$((totals_runs + 1))
  [[ $verdict == ok ]] && totals_ok=$((totals_ok + 1))
  resent_total=$((resent_total + run_resent))
  extra_total=$((extra_total + run_extra))
  needed_total=$((needed_total + run_needed))
  pct=$(awk -v e="$run_extra" -v d="$delta_bytes" 'BEGIN { printf "%.2f", e * 100 / d }')
  awk -v p="$pct" -v m="$extra_max" 'BEGIN { exit !(p > m) }' && extra_max=$pct
  printf 'run %3d %-62s publishes=%d resent=%d extra=%s B (%s%% of the delta)  %s\n' \
    "$r" "$desc" "$attempt" "$run_resent" "$run_extra" "$pct" "$verdict" >&3
  for n in "${nodes[@]}"; do kill -9 "${pid[$n]}" 2>/dev/null; done
  wait 2>/dev/null
  [[ -z ${KEEP_FAILED:-} || $verdict == ok ]] || cp -r "$work/run" "$work/failed-run-$r"
done
printf '{"benchmark":"soak","seed":%d,"runs":%d,"passed":%d,"torn_states_found":%d,"versions_lost":%d,' \
  "$seed" "$totals_runs" "$totals_ok" "$torn" "$lost"
printf '"hung":%d,"never_committed":%d,"resent_bytes":%d,"extra_bytes":%d,"needed_bytes":%d,' \
  "$hung" "$never" "$resent_total" "$extra_total" "$needed_total"
awk -v e="$extra_total" -v n="$needed_total" -v m="$extra_max" \
  'BEGIN { printf "\"extra_percent_of_needed\":%.3f,\"extra_percent_max_run\":%.2f}\n", (n ? e * 100 / n : 0), m }'

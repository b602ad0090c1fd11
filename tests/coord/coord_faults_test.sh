#!/usr/bin/env bash
# The commit record with real processes and a real etcd (docs/recovery.md, "The
# commit record"): three agents under a source, a standby `deltacast coordinator`,
# and a three-member etcd cluster on loopback. Each scenario loses something and
# then checks that every agent ends at one version, all the same, never torn (each
# store byte-identical to a step, nothing in flight), within a bounded time:
#
#   lost_streaming   the source's machine lost (process killed, state deleted) while
#                    it streams, before any PREPARED: the coordinator aborts.
#   lost_some        a2 crashes before it prepared, the others prepared, then the
#                    source's machine is lost: the coordinator aborts and a1, a3 roll
#                    back; a2 comes back with the next source and rolls back too.
#   lost_all         lost after every node PREPARED, before the decision: abort.
#   lost_recorded    lost after the COMMIT record was written, before any COMMIT
#                    was sent: the nodes commit from the record.
#   etcd_member      one etcd member killed during the refit: it commits.
#   etcd_down        every etcd member unreachable: the refit cannot be announced,
#                    nothing is sent, no commit (fail safe).
# After each, a new source (empty state, as on a new machine) publishes the next
# step, which must commit everywhere: the cluster is not blocked.
#
# Usage: coord_faults_test.sh DELTACAST_BINARY   (ONLY=N runs scenario N alone)
# Prints one line per scenario and "N passed, M failed"; exit 77 without etcd.
set -uo pipefail
dc=$1
here=$(dirname "$0")
source "$here/../e2e/lib.sh"
source "$here/etcd_lib.sh"
[[ -x $etcd_bin ]] || {
  echo "etcd is not installed (scripts/setup installs etcd-server): skipped"
  exit 77
}
start_work coordfaults
etcd_start 3 || {
  echo "etcd did not start"
  exit 1
}
port_base=$(free_port_base 8)
export DELTACAST_TOKEN=coordfaults-$RANDOM
"$dc" synth --out "$work/steps" --params 2M --steps 3 --change-rate 5% --threads 2 >/dev/null

config() {  # scenario name: the chain config plus [coordination] under its own prefix
  write_chain_config coordfaults "$port_base" 3 32KiB 2 20s all 20s
  printf '[coordination]\nendpoints = %s\nprefix = "/faults/%s"\n' "$etcd_endpoints_toml" "$1" \
    >>"$work/cluster.toml"
  printf 'source_timeout = "2s"\nrequest_timeout = "1s"\npoll_interval = "200ms"\n' \
    >>"$work/cluster.toml"
}

publish() {  # from to state-dir [env...]: the report in $work/run/publish.json
  local from=$1 to=$2 state=$3
  shift 3
  env "$@" "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$from" \
    --new "$work/steps/step$to" --json --no-progress --state-dir "$state" \
    >"$work/run/publish.json" 2>>"$work/run/publish.log"
}

publish_bg() {  # from to state-dir: publish in the background; its pid in $source_pid
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1" \
    --new "$work/steps/step$2" --json --no-progress --state-dir "$3" \
    >"$work/run/publish.json" 2>>"$work/run/publish.log" &
  source_pid=$!
  pids+=($source_pid)
}

# settled STEP SECONDS [NODES]: every agent (or those of NODES) holds stepSTEP, active,
# nothing in flight, within SECONDS; else prints what differs.
settled() {
  local step=$1 deadline=$((SECONDS + $2)) nodes=${3:-a1 a2 a3} n why target
  target=$("$dc" manifest "$work/steps/step$step" --json 2>/dev/null | jq -r .version)
  while true; do
    why=""
    for n in $nodes; do
      if [[ -e $work/run/$n/.deltacast/inflight ]]; then
        why+="$n has a delta in flight; "
      elif [[ $step == 0 && ! -e $work/run/$n/.deltacast/active ]]; then
        :  # never refitted: the copy of step0 it started with (checked below)
      elif ! grep -q "^active $target " "$work/run/$n/.deltacast/active" 2>/dev/null; then
        why+="$n is not at step$step; "
      fi
    done
    [[ -n $why ]] || break
    if ((SECONDS >= deadline)); then
      echo "$why"
      return 1
    fi
    sleep 0.2
  done
  for n in $nodes; do
    "$dc" verify "$work/run/$n" "$work/steps/step$step" >/dev/null ||
      why+="$n differs from step$step (torn); "
  done
  [[ -z $why ]] || {
    echo "$why"
    return 1
  }
}

start_agents() {
  local n
  for n in a1 a2 a3; do
    [[ -d $work/run/$n ]] || cp -r "$work/steps/step0" "$work/run/$n"
    run_agent "$n" "${1:-}"
    agent_pid[$n]=$!
  done
}

declare -A agent_pid
passed=0
failed=0
scenarios=(lost_streaming lost_some lost_all lost_recorded etcd_member etcd_down)
[[ -z ${ONLY:-} ]] || scenarios=("${scenarios[$ONLY]}")
for scenario in "${scenarios[@]}"; do
  rm -rf "$work/run"
  mkdir -p "$work/run"
  config "$scenario"
  "$dc" coordinator --config "$work/cluster.toml" --id standby >>"$work/run/coordinator.log" 2>&1 &
  coordinator=$!
  pids+=($coordinator)
  start_agents
  verdict=ok
  settle_nodes="a1 a2 a3"
  started=$SECONDS
  state=$work/run/source
  case $scenario in
    lost_streaming | lost_all | lost_recorded)
      point=source.chunk_sent:2
      [[ $scenario != lost_all ]] || point=source.before_decision
      [[ $scenario != lost_recorded ]] || point=source.decided
      publish 0 1 "$state" DELTACAST_CRASH_AT=$point && verdict="the source was not killed"
      rm -rf "$state"  # its machine is gone
      expect=0
      [[ $scenario != lost_recorded ]] || expect=1
      ;;
    lost_some)
      kill "${agent_pid[a2]}" 2>/dev/null
      wait "${agent_pid[a2]}" 2>/dev/null
      # a2 dies with its first chunk applied, before it could say PREPARED.
      run_agent a2 DELTACAST_CRASH_AT=agent.applied:1
      agent_pid[a2]=$!
      publish_bg 0 1 "$state"
      # Until a2 is dead and a1 and a3 PREPARED (bounded; a miss fails below); the
      # source waits for a2 meanwhile (connect_timeout), so it cannot decide.
      for _ in $(seq 1 300); do
        kill -0 "${agent_pid[a2]}" 2>/dev/null ||
          { grep -qs "prepared with" "$work/run/a1.log" && grep -qs "prepared with" "$work/run/a3.log" &&
            break; }
        sleep 0.1
      done
      kill -0 "${agent_pid[a2]}" 2>/dev/null && verdict="a2 did not crash"
      grep -qs "prepared with" "$work/run/a1.log" || verdict="a1 did not prepare"
      grep -qs "prepared with" "$work/run/a3.log" || verdict="a3 did not prepare"
      kill -9 "$source_pid" 2>/dev/null
      wait "$source_pid" 2>/dev/null
      rm -rf "$state"
      # a2 stays down until a source is back: a node restarted with a delta in flight
      # waits for a source to tell it the outcome (it does not read the record).
      settle_nodes="a1 a3"
      expect=0
      ;;
    etcd_member)
      publish_bg 0 1 "$state"
      sleep 0.3
      etcd_kill 0
      wait "$source_pid" || verdict="the publish failed with one etcd member down"
      expect=1
      ;;
    etcd_down)
      # Unreachable from the start: the refit cannot be announced, nothing is sent.
      etcd_kill_all
      publish 0 1 "$state" && verdict="the publish succeeded without etcd"
      expect=0
      ;;
  esac
  if [[ $verdict == ok ]]; then why=$(settled $expect 30 "$settle_nodes") || verdict=$why; fi
  settle_seconds=$((SECONDS - started))
  if [[ $scenario == lost_some ]]; then
    run_agent a2  # back with its prepared delta, beside the new source
    agent_pid[a2]=$!
  fi
  # The store back (where it was down), a new source on a new machine publishes on.
  etcd_restart_all >/dev/null || verdict="etcd did not come back"
  if [[ $verdict == ok ]]; then
    publish "$expect" $((expect + 1)) "$work/run/source2" ||
      verdict="the next publish failed: $(tail -n 1 "$work/run/publish.log")"
  fi
  if [[ $verdict == ok ]]; then
    why=$(settled $((expect + 1)) 30) || verdict="after the next publish: $why"
  fi
  if [[ $verdict == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  printf '%-15s settled at step%d in %2ds: %s\n' "$scenario" "$expect" "$settle_seconds" "$verdict"
  if [[ $verdict != ok ]]; then  # what each process said last, to read the failure by
    for log in publish a1 a2 a3 coordinator; do
      echo "--- $log.log (last lines)"
      grep -v ' debug ' "$work/run/$log.log" 2>/dev/null | tail -n 12
    done
  fi
  kill "$coordinator" "${agent_pid[@]}" 2>/dev/null
  wait "$coordinator" "${agent_pid[@]}" 2>/dev/null
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]

#!/usr/bin/env bash
# Fault injection at the source: `deltacast publish` is killed (SIGKILL, from a
# crash point) while streaming, after every node PREPARED but before it decided,
# and right after it recorded COMMIT. Then the trainer publishes again, as it would
# after a crash, and every store must end byte-identical to the version that
# publish brings, with no delta left in flight and no committed version lost.
#
# Usage: source_crash_test.sh DELTACAST_BINARY
# Prints one line per scenario and "N passed, M failed".
set -uo pipefail
dc=$1
source "$(dirname "$0")/lib.sh"
start_work srccrash
# Ports below the ephemeral range, so no outgoing connection holds one.
write_chain_config srccrash $((26400 + (RANDOM % 400) * 8)) 2 32KiB 2 60s
export DELTACAST_TOKEN=srccrash-$RANDOM
"$dc" synth --out "$work/steps" --params 4M --steps 2 --change-rate 5% --threads 2 >/dev/null

publish() {  # base new [crash point]
  if [[ -n ${3:-} ]]; then
    DELTACAST_CRASH_AT=$3 "$dc" publish --config "$work/cluster.toml" --base "$1" --new "$2" --json --no-progress \
      --state-dir "$work/run/source" >"$work/run/publish.json" 2>>"$work/run/publish.log"
  else
    "$dc" publish --config "$work/cluster.toml" --base "$1" --new "$2" --json --no-progress \
      --state-dir "$work/run/source" >"$work/run/publish.json" 2>>"$work/run/publish.log"
  fi
}

check() {  # step name -> verdict on stdout
  local step=$1 verdict=ok target
  target=$(jq -r .target_version "$work/run/publish.json" 2>/dev/null)
  json_holds "$work/run/publish.json" '.committed and .nodes_decided == 3' >/dev/null || verdict="final publish did not commit everywhere"
  for n in a1 a2 a3; do
    "$dc" verify "$work/run/$n" "$work/steps/$step" >/dev/null || verdict="$n differs from $step"
    grep -q "^active $target " "$work/run/$n/.deltacast/active" 2>/dev/null || verdict="$n did not make $step active"
    [[ ! -e $work/run/$n/.deltacast/inflight ]] || verdict="$n still has a delta in flight"
  done
  echo "$verdict"
}

passed=0
failed=0
# scenario: crash point, then which delta the trainer publishes next and where it must end
# (source.before_decision then the same delta: every node prepared it, and the relay
# a1 had already passed its END down; the new refit must pass END down again.)
scenarios=("source.chunk_sent:3 step0 step1 step1" "source.before_decision step0 step1 step2"
  "source.decided step0 step1 step2" "source.before_decision step0 step1 step1")
[[ -z ${ONLY:-} ]] || scenarios=("${scenarios[$ONLY]}")
for scenario in "${scenarios[@]}"; do
  read -r point from to final <<<"$scenario"
  rm -rf "$work/run"
  mkdir -p "$work/run"
  for n in a1 a2 a3; do cp -r "$work/steps/step0" "$work/run/$n"; done
  pids=()
  for n in a1 a2 a3; do
    "$dc" agent --config "$work/cluster.toml" --node "$n" --store "$work/run/$n" --threads 1 >>"$work/run/$n.log" 2>&1 &
    pids+=($!)
  done
  publish "$work/steps/$from" "$work/steps/$to" "$point"
  first=$?
  # After the crash the trainer publishes again: the same delta if it never got
  # past streaming, else the next step (the cluster must first settle the old one).
  if [[ $final == "$to" ]]; then
    publish "$work/steps/$from" "$work/steps/$to"
  else
    publish "$work/steps/$to" "$work/steps/$final" 2>/dev/null || true
    # A node that had not learnt the old outcome could not be at step1 yet; the
    # trainer then retries from the version the cluster resolved to.
    if ! json_holds "$work/run/publish.json" .committed >/dev/null 2>&1; then
      publish "$work/steps/$from" "$work/steps/$final"
    fi
  fi
  verdict=$(check "$final")
  [[ $first -ne 0 ]] || verdict="the first publish was not killed"
  resolved=$(grep -h "left in flight is resolved" "$work"/run/a*.log | sed -n 's/.*resolved: //p' | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  if [[ $verdict == ok ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  printf '%-24s then %s -> %s: %-45s resolutions: %s\n' "$point" "$to" "$final" "$verdict" "${resolved:-none}"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
done
echo "source-crash: $passed passed, $failed failed"
((failed == 0))

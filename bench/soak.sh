#!/usr/bin/env bash
# Recovery soak: many seeded kill points. Each run kills the relay or the leaf of
# a chain at a random crash point (and a random occurrence of it), restarts it, and
# checks the outcome (tests/e2e/crash_test.sh does one run). Prints JSON: runs,
# torn states found (a store neither at base nor target afterwards: must be 0),
# versions lost (a node that did not make the committed version active: must be
# 0), and the bytes re-sent beyond what the restarted node had not yet applied, as
# a fraction of the delta (target <= 1 %).
#
# Usage: bench/soak.sh [RUNS] [SEED]   (needs build/bin/deltacast; ~2 s a run)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
seed=${2:-1}
dc=$PWD/build/bin/deltacast
RANDOM=$seed
points=(agent.chunk_received agent.apply_flushed agent.applied apply.mid_partition agent.prepared agent.commit
  agent.committed)
lines=()
for ((r = 0; r < runs; r++)); do
  victim=$([[ $((RANDOM % 2)) -eq 0 ]] && echo a2 || echo a3)
  point=${points[$((RANDOM % ${#points[@]}))]}
  case $point in agent.chunk_received | agent.apply_flushed | agent.applied | apply.mid_partition)
    point="$point:$((1 + RANDOM % 4))" ;;
  esac
  line=$(VICTIMS=$victim tests/e2e/crash_test.sh "$dc" "$point" 2>/dev/null | grep -E "^a[23] ")
  lines+=("$line")
  echo "$line" >&2
done
printf '%s\n' "${lines[@]}" | awk -v runs="$runs" -v seed="$seed" '
  { total++ }
  / ok / { ok++ }
  /differs from the target/ { torn++ }
  /did not make the target active|still has the delta in flight|confirmed the commit/ { lost++ }
  /did not crash/ { nocrash++ }
  { for (i = 1; i <= NF; i++) if ($i ~ /^extra=/) { v = substr($i, 7); sub(/%/, "", v); sum += v; if (v > max) max = v } }
  END {
    printf "{\"benchmark\":\"soak\",\"seed\":%d,\"runs\":%d,\"passed\":%d,\"crash_point_not_reached\":%d,", seed, runs, ok, nocrash
    printf "\"torn_states_found\":%d,\"versions_lost\":%d,", torn, lost
    printf "\"extra_resent_percent_mean\":%.3f,\"extra_resent_percent_max\":%.3f}\n", (total ? sum / total : 0), max
  }'

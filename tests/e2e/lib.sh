# Shared setup of the multi-process fault tests (sourced, not run).
#
# start_work NAME: a scratch directory $work, removed on exit (KEEP=1 keeps it for
#   a look); every process in $pids is killed on exit either way.
# write_chain_config NAME PORT_BASE FANOUT CHUNK WINDOW COMMIT_TIMEOUT [POLICY
#   [CONNECT_TIMEOUT]]: a source "trainer" and agents a1..a3 on loopback, written to
#   $work/cluster.toml. With APPLY=staged in the environment the agents apply staged;
#   with CHECKPOINT=snapshot their stores are snapshot stores (SNAPSHOT_EVERY: their
#   snapshot_every).
# run_agent NODE [ENV=VALUE]: starts agent NODE of $work/cluster.toml in the
#   background on $work/run/NODE (log $work/run/NODE.log), added to $pids.
# publish_step FROM TO NAME: publishes $work/steps/stepFROM -> stepTO with the state
#   in $work/run/source; the report in $work/run/NAME.json.

# free_port_base COUNT: a random base (26000-29184, a multiple of 16) below the
#   ephemeral range such that no TCP socket of this machine, in any state, holds one
#   of base .. base+COUNT-1. UCX's listener refuses a port that a closed connection
#   still holds in TIME_WAIT (a minute after an earlier run on the same ports).
# json_holds FILE FILTER: whether FILE holds JSON for which FILTER is true. Unlike a
#   bare `jq -e` (jq 1.6 exits 0 on empty input), a missing or empty FILE fails.
json_holds() { [[ -s $1 ]] && jq -e "$2" "$1" >/dev/null 2>&1; }

# Agents build their ucx/ofi transports from the cluster config, which names no
# network interface: keep their network providers on loopback (UCX's tcp transport
# otherwise also opens eth0, libfabric's tcp binds outgoing endpoints there).
export UCX_NET_DEVICES=lo FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo

free_port_base() {
  local count=$1 base used
  # Local ports of every socket, from the kernel's tables (hex after the colon).
  used=$(for hex in $(awk 'FNR > 1 { sub(/.*:/, "", $2); print $2 }' /proc/net/tcp \
    /proc/net/tcp6 2>/dev/null); do echo $((16#$hex)); done | sort -un)
  for _ in $(seq 1 100); do
    base=$((26000 + (RANDOM % 200) * 16))
    if ! awk -v b="$base" -v n="$count" '$1 >= b && $1 < b + n { found = 1 } END { exit !found }' \
      <<<"$used"; then
      echo "$base"
      return 0
    fi
  done
  echo "$base"  # all busy: the test will say which port it could not use
}

start_work() {
  work=$(mktemp -d "/tmp/deltacast-$1.XXXXXX")
  pids=()
  trap cleanup EXIT
}

cleanup() {
  exec 3>&2 2>/dev/null  # no "Killed" notes from the shell for the processes below
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -P $$ 2>/dev/null || true  # and any other process this script started
  wait 2>/dev/null || true
  if [[ -n ${KEEP:-} ]]; then echo "kept $work" >&3; else rm -rf "$work"; fi
}

write_chain_config() {
  local name=$1 base=$2 fanout=$3 chunk=$4 window=$5 commit_timeout=$6 policy=${7:-all}
  local connect_timeout=${8:-20s}
  {
    printf '[cluster]\nname = "%s"\n[tree]\nfanout = %d\nchunk_size = "%s"\nwindow = %d\n' \
      "$name" "$fanout" "$chunk" "$window"
    printf 'connect_timeout = "%s"\ncommit_timeout = "%s"\nidle_timeout = "30s"\n' \
      "$connect_timeout" "$commit_timeout"
    printf 'commit_policy = "%s"\n' "$policy"
    printf '[[node]]\nid = "trainer"\nhost = "127.0.0.1"\nport = %d\nrole = "source"\n' "$base"
    for i in 1 2 3; do
      printf '[[node]]\nid = "a%d"\nhost = "127.0.0.1"\nport = %d\n' "$i" $((base + i))
      [[ -z ${APPLY:-} ]] || printf 'apply = "%s"\n' "$APPLY"
      [[ -z ${CHECKPOINT:-} ]] || printf 'checkpoint = "%s"\n' "$CHECKPOINT"
      [[ -z ${SNAPSHOT_EVERY:-} ]] || printf 'snapshot_every = %d\n' "$SNAPSHOT_EVERY"
    done
  } >"$work/cluster.toml"
}

run_agent() {
  env ${2:-} "$dc" agent --config "$work/cluster.toml" --node "$1" --store "$work/run/$1" --threads 1 \
    >>"$work/run/$1.log" 2>&1 &
  pids+=($!)
}

publish_step() {
  "$dc" publish --config "$work/cluster.toml" --base "$work/steps/step$1" --new "$work/steps/step$2" --json \
    --no-progress --state-dir "$work/run/source" >"$work/run/$3.json" 2>>"$work/run/publish.log"
}

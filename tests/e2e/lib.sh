# Shared setup of the multi-process fault tests (sourced, not run).
#
# start_work NAME: a scratch directory $work, removed with every process in
#   $pids on exit (KEEP=1 keeps it for a look).
# write_chain_config NAME PORT_BASE FANOUT CHUNK WINDOW COMMIT_TIMEOUT [POLICY
#   [CONNECT_TIMEOUT]]: a source "trainer" and agents a1..a3 on loopback, written to
#   $work/cluster.toml.

# Agents build their ucx/ofi transports from the cluster config, which names no
# network interface: keep their network providers on loopback (UCX's tcp transport
# otherwise also opens eth0, libfabric's tcp binds outgoing endpoints there).
export UCX_NET_DEVICES=lo FI_TCP_IFACE=lo FI_SOCKETS_IFACE=lo

start_work() {
  work=$(mktemp -d "/tmp/deltacast-$1.XXXXXX")
  pids=()
  [[ -n ${KEEP:-} ]] || trap cleanup EXIT
}

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
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
    for i in 1 2 3; do printf '[[node]]\nid = "a%d"\nhost = "127.0.0.1"\nport = %d\n' "$i" $((base + i)); done
  } >"$work/cluster.toml"
}

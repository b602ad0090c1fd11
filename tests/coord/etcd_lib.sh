# A real etcd cluster on loopback for the shell fault tests (sourced, not run); the
# same cluster tests/coord/etcd_cluster.h starts for the C++ tests. Needs
# tests/e2e/lib.sh sourced first ($work, $pids, free_port_base).
#
# etcd_start N: N members (m0..), logs under $work/etcd, data on /dev/shm (removed on
#   exit; $work/etcd without /dev/shm), client URLs in
#   ${etcd_urls[@]} and "$etcd_endpoints_toml" (a TOML list for [coordination]
#   endpoints); waits until every member reports a leader. Returns 1 (and prints the
#   logs' tails) if not within 20 s; 77 if etcd is not installed.
# etcd_kill I: SIGKILL member I (its data stays). etcd_restart I: start it again on
#   its ports and data and wait until healthy. etcd_kill_all / etcd_restart_all.
# etcd_healthy I: whether member I answers /health with a leader.
# etcd_get_prefix PREFIX: every key under PREFIX with its value, base64-decoded,
#   "key value" per line (from any member that answers).

etcd_bin=/usr/bin/etcd

etcd_start() {
  local n=$1 base i
  [[ -x $etcd_bin ]] || return 77
  base=$(free_port_base $((2 * n)))
  etcd_urls=()
  etcd_peer_ports=()
  etcd_pids=()
  etcd_initial=""
  for ((i = 0; i < n; i++)); do
    etcd_urls+=("http://127.0.0.1:$((base + 2 * i))")
    etcd_peer_ports+=($((base + 2 * i + 1)))
    etcd_initial+="${etcd_initial:+,}m$i=http://127.0.0.1:$((base + 2 * i + 1))"
    etcd_pids+=(0)
  done
  etcd_endpoints_toml="[$(printf '"%s", ' "${etcd_urls[@]}" | sed 's/, $//')]"
  mkdir -p "$work/etcd"
  # The members' data on /dev/shm where there is one: etcd fsyncs every write, and a
  # loaded machine's disk can stall an fsync long enough to lose the leader.
  etcd_data=$work/etcd
  if [[ -w /dev/shm ]] && etcd_data=$(mktemp -d /dev/shm/deltacast-etcd.XXXXXX); then
    trap 'cleanup; rm -rf "$etcd_data"' EXIT
  else
    etcd_data=$work/etcd
  fi
  for ((i = 0; i < n; i++)); do etcd_spawn "$i"; done
  etcd_wait_all
}

etcd_spawn() {
  local i=$1
  "$etcd_bin" --name "m$i" --data-dir "$etcd_data/m$i.data" \
    --listen-client-urls "${etcd_urls[$i]}" --advertise-client-urls "${etcd_urls[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer_ports[$i]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer_ports[$i]}" \
    --initial-cluster "$etcd_initial" --initial-cluster-state new \
    --initial-cluster-token deltacast-test --heartbeat-interval 50 --election-timeout 500 \
    --log-level warn --logger zap >>"$work/etcd/m$i.log" 2>&1 &
  etcd_pids[$i]=$!
  pids+=($!)
}

etcd_healthy() {
  curl -s -m 1 "${etcd_urls[$1]}/health" 2>/dev/null | grep -q '"health":"true"'
}

etcd_wait_all() {
  local deadline=$((SECONDS + 20)) i ok
  while ((SECONDS < deadline)); do
    ok=1
    for i in "${!etcd_urls[@]}"; do
      [[ ${etcd_pids[$i]} != 0 ]] || continue
      if ! kill -0 "${etcd_pids[$i]}" 2>/dev/null; then
        # Not killed by the test: say so (with its log) and start it again.
        echo "etcd m$i exited by itself; restarting it" >&2
        tail -n 5 "$work/etcd/m$i.log" >&2
        etcd_spawn "$i"
      fi
      etcd_healthy "$i" || ok=0
    done
    ((ok)) && return 0
    sleep 0.05
  done
  for i in "${!etcd_urls[@]}"; do echo "--- etcd m$i" >&2; tail -n 15 "$work/etcd/m$i.log" >&2; done
  return 1
}

etcd_kill() {
  local i=$1
  [[ ${etcd_pids[$i]} != 0 ]] || return 0
  kill -9 "${etcd_pids[$i]}" 2>/dev/null || true
  wait "${etcd_pids[$i]}" 2>/dev/null || true
  etcd_pids[$i]=0
}

etcd_restart() {
  [[ ${etcd_pids[$1]} != 0 ]] || etcd_spawn "$1"
  etcd_wait_all
}

etcd_kill_all() {
  local i
  for i in "${!etcd_urls[@]}"; do etcd_kill "$i"; done
}

etcd_restart_all() {
  local i
  for i in "${!etcd_urls[@]}"; do [[ ${etcd_pids[$i]} != 0 ]] || etcd_spawn "$i"; done
  etcd_wait_all
}

etcd_get_prefix() {
  local prefix=$1 end key url answer
  key=$(printf '%s' "$prefix" | base64 -w0)
  # The prefix's range end: its last byte plus one (prefixes here end in "/").
  end=$(printf '%s' "${prefix%?}0" | base64 -w0)
  for url in "${etcd_urls[@]}"; do
    answer=$(curl -s -m 2 -X POST "$url/v3/kv/range" -d "{\"key\":\"$key\",\"range_end\":\"$end\"}") ||
      continue
    jq -r '.kvs[]? | "\(.key | @base64d) \(.value | @base64d)"' <<<"$answer"
    return 0
  done
  return 1
}

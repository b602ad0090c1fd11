// One relay's forwarding path alone (issue 31, part 5), for the fan-out benchmark's
// --relay-forward: a source streams a large, pre-encoded, incompressible delta to ONE
// real NodeAgent, which verifies, spools and applies it and forwards it to two
// children that apply nothing (tests/relay/tree/scripted_child.h: they join, grant
// credit and say PREPARED). The relay runs in a process of its own (forked), so its
// CPU time is its own and `perf record -p` sees it alone. Its forwarding rate is set
// next to iperf3 over the same loopback, one stream and two, measured in the same run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace deltacast::bench::fanout {

struct RelayForwardOptions {
  uint64_t bytes = 0;        // the checkpoint (random bytes from an all-zero base)
  uint64_t chunk_bytes = 0;  // chunk_size of the tree
  int window = 8;
  int repeats = 1;  // runs per row; the median (by forwarding rate) is kept
  size_t apply_threads = 1;
  int iperf_seconds = 3;
  std::string transport = "tcp";
  std::string provider;
  // Where the relay spools on disk (empty: the system temporary directory), and a
  // tmpfs folder for the diagnostic row (empty: that row is skipped).
  std::string spool_dir;
  std::string tmpfs_dir = "/dev/shm";
  bool diagnostics = true;  // the source-only, tmpfs and staged-apply rows
  uint64_t seed = 1;
  // `perf record -g` output for the relay's process in the first "relay" run; empty:
  // no profile.
  std::string perf_file;
};

// iperf3 over 127.0.0.1: `iperf3 -s -1` and `iperf3 -c -P streams -J`, the sum of
// the streams received. {"available": false, ...} when iperf3 is missing or fails.
nlohmann::json RunIperf(int seconds, int streams, std::mt19937& rng);

// The rows (relay with its spool on disk; diagnostics: the source alone, the spool
// on tmpfs, apply staged until the commit) and iperf3 with one and two streams.
nlohmann::json RelayForward(const RelayForwardOptions& o, std::mt19937& rng);

}  // namespace deltacast::bench::fanout

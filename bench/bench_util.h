// Small helpers the benchmark programs share: wall and CPU clocks, and leaving on
// an error.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "deltacast/status.h"

namespace deltacast::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// CPU seconds this process has used (user + system, all threads). Per-core
// throughput is bytes over CPU seconds, which other load on the machine inflates
// less than wall time; in the fan-out benchmark every node is a thread, so this is
// the whole cluster's CPU.
inline double CpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

// A benchmark stops at the first error: `what: status` on stderr, exit code 1.
inline void Check(const Status& status, std::string_view what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(what.size()), what.data(),
               status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Check(Result<T> result, std::string_view what) {
  Check(result.status(), what);
  return std::move(result).value();
}

}  // namespace deltacast::bench

// Small helpers the benchmark programs share: wall and CPU clocks.
#pragma once

#include <sys/resource.h>

#include <chrono>

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

}  // namespace deltacast::bench

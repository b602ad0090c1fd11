// Small helpers the benchmark programs share: wall and CPU clocks, and leaving on
// an error.
#pragma once

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// CPU seconds the calling thread has used: for single-thread kernels, unaffected by
// other threads of the process.
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// The least thread CPU seconds of `reps` runs of `fn`.
inline double BestThreadCpuSeconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - t0);
  }
  return best;
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

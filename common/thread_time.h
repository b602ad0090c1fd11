// ThreadTime: where the calling thread's time went, from the kernel's scheduler
// accounting: on a CPU, waiting for one (runnable, preempted by other work), and
// the rest of the wall time blocked (in the node's apply work: fsync, and writes
// held back while the kernel writes dirty pages to disk).
//
// Thread safety: Now() reads the calling thread's own counters.
#pragma once

#include <chrono>

namespace deltacast {

struct ThreadTime {
  std::chrono::steady_clock::time_point wall;
  double cpu_seconds = 0;       // ran on a CPU
  double runnable_seconds = 0;  // ready to run, waiting for a CPU (0 where not accounted)

  // The calling thread's counters now: /proc/thread-self/schedstat where the kernel
  // keeps it, else the thread's CPU clock (and no wait figure). All zero under a
  // simulated runtime (common/runtime.h).
  static ThreadTime Now();
};

// The time between two readings of one thread, split three ways.
struct ThreadTimeSplit {
  double wall_seconds = 0;
  double cpu_seconds = 0;
  double runnable_seconds = 0;  // waiting for a CPU
  double blocked_seconds = 0;   // neither: waiting for the disk, a lock or a peer
};
ThreadTimeSplit Between(const ThreadTime& start, const ThreadTime& end);

}  // namespace deltacast

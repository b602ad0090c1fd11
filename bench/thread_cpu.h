// The CPU time of each thread of a process, read from /proc, for splitting a
// process's CPU by job: the engine names its threads (NameThisThread in
// common/parallel.h: "dc-loop", "dc-tcp-io", "dc-apply-worker", ...), so the CPU
// two samples differ by, summed per thread name, says which job took it.
//
// Thread safety: SampleThreads reads /proc only; the rest are pure functions.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace deltacast::bench {

struct ThreadSample {
  struct Thread {
    std::string name;
    double cpu_seconds = 0;
  };
  std::map<pid_t, Thread> threads;  // by thread id
  // The whole process, threads that exited included (utime + stime, clock ticks).
  double process_cpu_seconds = 0;
  bool ok = false;  // false: the process is gone (or /proc unreadable)
};

// Every thread of `pid` now: its name and its CPU time (the scheduler's nanosecond
// count where the kernel keeps it, else utime + stime).
ThreadSample SampleThreads(pid_t pid);

// CPU seconds per thread name between `before` and `after`. A thread that started
// in between counts from zero; one that ended in between is missing (its time is in
// process_cpu_seconds only), so the sum can fall short of the process's difference.
std::map<std::string, double> CpuByName(const ThreadSample& before, const ThreadSample& after);

}  // namespace deltacast::bench

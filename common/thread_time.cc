#include "common/thread_time.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/runtime.h"

namespace deltacast {

ThreadTime ThreadTime::Now() {
  ThreadTime t;
  // A simulation's time is its own: no real clock goes into what it reports.
  if (SimRuntime() != nullptr) return t;
  t.wall = std::chrono::steady_clock::now();
  // "<ns on cpu> <ns runnable> <timeslices>\n"
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char text[96];
    const ssize_t n = ::read(fd, text, sizeof(text) - 1);
    ::close(fd);
    unsigned long long run = 0, wait = 0;
    if (n > 0) {
      text[n] = '\0';
      if (std::sscanf(text, "%llu %llu", &run, &wait) == 2) {
        t.cpu_seconds = double(run) * 1e-9;
        t.runnable_seconds = double(wait) * 1e-9;
        return t;
      }
    }
  }
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  t.cpu_seconds = double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  return t;
}

ThreadTimeSplit Between(const ThreadTime& start, const ThreadTime& end) {
  ThreadTimeSplit s;
  s.wall_seconds = std::chrono::duration<double>(end.wall - start.wall).count();
  s.cpu_seconds = std::max(0.0, end.cpu_seconds - start.cpu_seconds);
  s.runnable_seconds = std::max(0.0, end.runnable_seconds - start.runnable_seconds);
  s.blocked_seconds = std::max(0.0, s.wall_seconds - s.cpu_seconds - s.runnable_seconds);
  return s;
}

}  // namespace deltacast

// Runtime: the seam between the engine and real time and threads. The engine reads
// the time through RuntimeClock and runs its event loops, apply workers and
// write-back through the real implementations below, which check SimRuntime():
// null (always, outside the simulator) means today's behaviour exactly
// (steady_clock, one thread per loop); set, every loop, pool and timer becomes a
// queue on that runtime, which runs everything on one thread in an order of its own
// (sim/ runs a discrete-event queue on simulated time, so a run replays from a seed).
//
// The runtime is process-wide: the simulator installs it before it builds any engine
// object and removes it after the last is gone; nothing else runs in that process.
//
// Thread safety: Install/Uninstall with no engine object alive; a Runtime is used
// from the one thread it runs on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "common/thread_annotations.h"

namespace deltacast {

class Runtime {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Runtime() = default;

  virtual TimePoint Now() = 0;
  // A queue of tasks that run in the order they were posted (an event loop, a pool,
  // a timer owner). Ids are never reused.
  virtual uint64_t OpenQueue(const char* kind) = 0;
  // Drops the queue's pending tasks; nothing posted to it runs after this.
  virtual void CloseQueue(uint64_t queue) = 0;
  // Runs `task` soon, after every task posted to `queue` before it. Never inline.
  virtual void Post(uint64_t queue, std::function<void()> task) = 0;
  // Runs `task` at `at` (a timer: not ordered against the queue's posts).
  virtual void PostAt(uint64_t queue, TimePoint at, std::function<void()> task) = 0;
  // For a call that blocks its thread until `done` (Source::Publish waiting for the
  // tree): runs other tasks until done() or `deadline`; returns done(). May not
  // return at all (throws) if the simulator kills the caller's process meanwhile.
  virtual bool RunUntil(TimePoint deadline, const std::function<bool()>& done) = 0;
  // Random ids and nonces: from the simulator's seed.
  virtual uint64_t Random64() = 0;
};

// The installed runtime, or null: real time and threads.
Runtime* SimRuntime();
void InstallSimRuntime(Runtime* runtime);

// A random id, never zero: the runtime's (from the simulator's seed), else the system's.
uint64_t RuntimeRandomId();

// A clock with steady_clock's time points: steady_clock::now(), or the runtime's.
struct RuntimeClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::steady_clock::time_point;
  static constexpr bool is_steady = true;
  static time_point now() {
    Runtime* r = SimRuntime();
    return r ? r->Now() : std::chrono::steady_clock::now();
  }
};

// cv.wait_until(lock, deadline, done) for a thread that blocks on engine state: under
// a runtime, runs tasks (with the lock released) until done() or the deadline.
// Unchecked by the thread-safety analysis: done() needs the caller's mutex, which
// `lock` holds, but the analysis cannot name it through the MutexLock parameter.
template <typename Pred>
bool WaitUntil(CondVar& cv, MutexLock& lock, RuntimeClock::time_point deadline,
               Pred done) NO_THREAD_SAFETY_ANALYSIS {
  Runtime* r = SimRuntime();
  if (!r) return cv.wait_until(lock, deadline, done);
  if (done()) return true;
  lock.Unlock();
  const bool ok = r->RunUntil(deadline, [&]() NO_THREAD_SAFETY_ANALYSIS { return done(); });
  lock.Lock();
  return ok || done();
}

template <typename Pred>
bool WaitFor(CondVar& cv, MutexLock& lock, RuntimeClock::duration timeout, Pred done) {
  if (!SimRuntime()) return cv.wait_for(lock, timeout, done);
  return WaitUntil(cv, lock, RuntimeClock::now() + timeout, done);
}

template <typename Pred>
void Wait(CondVar& cv, MutexLock& lock, Pred done) {
  if (!SimRuntime()) return cv.wait(lock, done);
  (void)WaitUntil(cv, lock, RuntimeClock::time_point::max(), done);
}

}  // namespace deltacast

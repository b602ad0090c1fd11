// Small helpers for running independent work items on several threads.
//
// Thread safety: the functions are reentrant; `fn` must be safe to call concurrently
// for different indices. WorkerPool: Post and ParallelFor from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace deltacast {

// Cores to use when the user says 0 / "all".
size_t DefaultThreadCount();

// Calls fn(i) for i in [0, count) on up to `threads` threads (the caller's thread is
// one of them); blocks until all calls return. Indices are handed out in increasing
// order, one at a time, so uneven items balance.
void ParallelFor(size_t count, size_t threads, const std::function<void(size_t)>& fn);

// A fixed set of threads running posted tasks, first posted first started. Its
// ParallelFor shares items of one call with whichever pool threads are idle, so
// several tasks that each split their work never run more threads than the pool
// has (a chunk of many records and a chunk of one, applied side by side, use every
// core between them and oversubscribe none).
class WorkerPool {
 public:
  // `threads` >= 1. `nice` > 0 lowers the threads' scheduling priority by that much
  // (Linux: per-thread nice), so latency-sensitive threads of the process (event
  // loops forwarding data) get the CPU first when cores are scarce.
  explicit WorkerPool(size_t threads, int nice = 0);
  ~WorkerPool();  // Stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t size() const { return size_; }
  // Queues `task`. Tasks posted after Stop are dropped.
  void Post(std::function<void()> task);
  // Runs the tasks already queued, then joins the threads. Idempotent; must not be
  // called from a pool thread.
  void Stop();

  // Calls fn(i) for i in [0, count): the caller takes items itself and idle pool
  // threads help; blocks until every call returned. Safe to call from a pool thread.
  void ParallelFor(size_t count, const std::function<void(size_t)>& fn);

 private:
  void Run();

  Mutex mu_;
  CondVar wake_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  int nice_ = 0;
  size_t size_ = 0;
  // Under a simulated runtime (common/runtime.h) the pool has no threads: tasks run
  // inline, in Post and ParallelFor, one after another.
  bool inline_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace deltacast

// TaskThread: one thread that runs posted closures in deadline order (FIFO among
// equal deadlines). The inproc backend delivers on it; the fault wrapper times
// delayed and paced sends with it.
//
// Thread safety: all methods are thread-safe. Stop() must not race with the
// destructor.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

namespace deltacast::transport {

class TaskThread {
 public:
  using Clock = std::chrono::steady_clock;

  TaskThread();
  ~TaskThread();  // Stop(/*drain=*/false)
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  // Queues `task` to run as soon as possible / at or after `when`. Returns false,
  // dropping the task, once the thread has stopped.
  bool Post(std::function<void()> task);
  bool PostAt(Clock::time_point when, std::function<void()> task);

  // Stops the thread. With drain, it first runs every queued task, deadline or not,
  // including tasks those tasks post; without, queued tasks are destroyed unrun.
  // Afterwards Post refuses. Joins the thread, except when called on it (then the
  // thread finishes the current task and exits on its own). Idempotent.
  void Stop(bool drain);

  // True when called from this TaskThread's thread.
  bool OnThread() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive *this
};

}  // namespace deltacast::transport

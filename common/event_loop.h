// EventLoop: one thread that runs posted tasks in order, plus a periodic tick.
// A node agent and a publisher each own one, and every transport callback only
// posts to it, so all relay state is touched by that one thread and needs no locks.
//
// Under a simulated runtime (common/runtime.h) there is no thread: the loop is a
// queue of the runtime, ticked at simulated times, and Stop drops what is queued (as
// the process dying would).
//
// Thread safety: Post and Stop are thread-safe; tasks run on the loop thread only.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <thread>

#include "common/runtime.h"
#include "common/thread_annotations.h"

namespace deltacast {

class EventLoop {
 public:
  // `tick` (may be empty) runs on the loop thread about every `period` once
  // Start has been called. `kind` names the loop to a simulator (common/runtime.h)
  // and its thread (NameThisThread).
  explicit EventLoop(std::function<void()> tick = {},
                     std::chrono::milliseconds period = std::chrono::milliseconds(100),
                     const char* kind = "loop");
  ~EventLoop();  // Stop()
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Starts the thread. Tasks posted before run once it starts.
  void Start();
  // Queues `task`; it runs after every task posted before it. Tasks posted after
  // Stop are dropped.
  void Post(std::function<void()> task);
  // Runs the remaining queued tasks, then joins the thread. Idempotent; must not be
  // called from a task.
  void Stop();
  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Run();
  void SimTick();

  std::function<void()> tick_;
  std::chrono::milliseconds period_;
  const char* kind_;
  Mutex mu_;
  CondVar wake_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
  // Simulated: the runtime's queue (0: real thread).
  Runtime* sim_ = nullptr;
  uint64_t queue_ = 0;
  bool started_ = false;
};

}  // namespace deltacast

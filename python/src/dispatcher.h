// Dispatcher: the one thread on which deltacast's callbacks reach Python. The
// engine's threads only queue an event (they never wait for the GIL, so a busy
// interpreter cannot stall a refit); this thread takes the GIL and calls the
// Python callable, in order. An exception in the callable is printed, not raised.
//
// Thread safety: Post from any thread; Stop with the GIL released.
#pragma once

#include <pybind11/pybind11.h>

#include <deque>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace deltacast::python {

class Dispatcher {
 public:
  Dispatcher();
  ~Dispatcher();  // Stop()
  // Queues `call`, which runs with the GIL held on the dispatcher thread.
  void Post(std::function<void()> call);
  // Runs what is queued, then joins the thread. Idempotent; call without the GIL.
  void Stop();

 private:
  void Run();
  Mutex mu_;
  CondVar wake_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace deltacast::python

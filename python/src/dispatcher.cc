#include "dispatcher.h"

#include "common/thread_annotations.h"

namespace deltacast::python {

Dispatcher::Dispatcher() : thread_([this] { Run(); }) {}

Dispatcher::~Dispatcher() { Stop(); }

void Dispatcher::Post(std::function<void()> call) {
  MutexLock lock(mu_);
  if (stopping_) return;
  queue_.push_back(std::move(call));
  wake_.notify_one();
}

void Dispatcher::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Dispatcher::Run() {
  for (;;) {
    std::function<void()> call;
    {
      MutexLock lock(mu_);
      wake_.wait(lock, [&]() REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!Py_IsInitialized()) continue;
    pybind11::gil_scoped_acquire gil;
    try {
      call();
    } catch (pybind11::error_already_set& e) {
      e.discard_as_unraisable("deltacast callback");
    }
    call = nullptr;  // whatever it holds of Python goes with the GIL held
  }
}

}  // namespace deltacast::python

#include "common/parallel.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "common/thread_name.h"

namespace deltacast {

size_t DefaultThreadCount() { return std::max(1u, std::thread::hardware_concurrency()); }

void ParallelFor(size_t count, size_t threads, const std::function<void(size_t)>& fn) {
  threads = std::clamp<size_t>(threads, 1, std::max<size_t>(count, 1));
  if (SimRuntime()) threads = 1;  // no threads in a simulation
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  std::vector<std::jthread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
}

WorkerPool::WorkerPool(size_t threads, int nice) : nice_(nice), inline_(SimRuntime() != nullptr) {
  threads = std::max<size_t>(threads, 1);
  size_ = threads;
  if (inline_) return;
  threads_.reserve(threads);
  for (size_t t = 0; t < threads; ++t) threads_.emplace_back([this] { Run(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Post(std::function<void()> task) {
  if (inline_) {
    bool stopping;
    {
      MutexLock lock(mu_);
      stopping = stopping_;
    }
    if (!stopping) task();
    return;
  }
  MutexLock lock(mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
  wake_.notify_one();
}

void WorkerPool::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Run() {
  NameThisThread("worker");
  if (nice_ > 0) {
    // Best effort: a thread that may not lower its priority runs at the default.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_);
  }
  MutexLock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&]() REQUIRES(mu_) { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and nothing left
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.Unlock();
    task();
    lock.Lock();
  }
}

void WorkerPool::ParallelFor(size_t count, const std::function<void(size_t)>& fn) {
  if (count == 0) return;
  if (inline_) {
    for (size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  // Shared with helpers that may start after this call returned: they then find no
  // item left and never touch `fn`, which lives only as long as this call.
  struct State {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    const std::function<void(size_t)>* fn = nullptr;
    size_t count = 0;
    Mutex mu;
    CondVar all_done;
  };
  auto state = std::make_shared<State>();
  state->fn = &fn;
  state->count = count;
  auto work = [](State& s) {
    for (size_t i = s.next++; i < s.count; i = s.next++) {
      (*s.fn)(i);
      if (s.done.fetch_add(1) + 1 == s.count) {
        MutexLock lock(s.mu);
        s.all_done.notify_all();
      }
    }
  };
  const size_t helpers = std::min(threads_.size(), count) - 1;
  for (size_t h = 0; h < helpers; ++h) Post([state, work] { work(*state); });
  work(*state);
  MutexLock lock(state->mu);
  state->all_done.wait(lock, [&] { return state->done.load() == count; });
}

}  // namespace deltacast

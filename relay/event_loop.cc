#include "relay/event_loop.h"

namespace deltacast::relay {

EventLoop::EventLoop(std::function<void()> tick, std::chrono::milliseconds period)
    : tick_(std::move(tick)), period_(period) {}

void EventLoop::Start() {
  std::lock_guard lock(mu_);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Run(); });
}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Post(std::function<void()> task) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
  wake_.notify_one();
}

void EventLoop::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EventLoop::Run() {
  auto next_tick = std::chrono::steady_clock::now() + period_;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait_until(lock, next_tick, [&] { return stopping_ || !tasks_.empty(); });
    while (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
    if (stopping_) return;
    if (std::chrono::steady_clock::now() >= next_tick) {
      next_tick = std::chrono::steady_clock::now() + period_;
      if (tick_) {
        lock.unlock();
        tick_();
        lock.lock();
      }
    }
  }
}

}  // namespace deltacast::relay

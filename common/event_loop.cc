#include "common/event_loop.h"

#include "common/thread_annotations.h"
#include "common/thread_name.h"

namespace deltacast {

EventLoop::EventLoop(std::function<void()> tick, std::chrono::milliseconds period, const char* kind)
    : tick_(std::move(tick)), period_(period), kind_(kind), sim_(SimRuntime()) {
  if (sim_) queue_ = sim_->OpenQueue(kind);
}

void EventLoop::Start() {
  MutexLock lock(mu_);
  if (sim_) {
    if (started_ || stopping_) return;
    started_ = true;
    for (auto& task : tasks_) sim_->Post(queue_, std::move(task));
    tasks_.clear();
    sim_->PostAt(queue_, sim_->Now() + period_, [this] { SimTick(); });
    return;
  }
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Run(); });
}

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Post(std::function<void()> task) {
  MutexLock lock(mu_);
  if (stopping_) return;
  if (sim_ && started_) return sim_->Post(queue_, std::move(task));
  tasks_.push_back(std::move(task));
  wake_.notify_one();
}

void EventLoop::Stop() {
  std::deque<std::function<void()>> dropped;  // destroyed outside mu_
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.notify_one();
    if (sim_) dropped.swap(tasks_);
  }
  if (sim_) return sim_->CloseQueue(queue_);
  if (thread_.joinable()) thread_.join();
}

void EventLoop::SimTick() {
  if (tick_) tick_();
  MutexLock lock(mu_);
  if (!stopping_) sim_->PostAt(queue_, sim_->Now() + period_, [this] { SimTick(); });
}

void EventLoop::Run() {
  NameThisThread(kind_);
  auto next_tick = std::chrono::steady_clock::now() + period_;
  MutexLock lock(mu_);
  for (;;) {
    wake_.wait_until(lock, next_tick, [&]() REQUIRES(mu_) { return stopping_ || !tasks_.empty(); });
    while (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.Unlock();
      task();
      lock.Lock();
    }
    if (stopping_) return;
    if (std::chrono::steady_clock::now() >= next_tick) {
      next_tick = std::chrono::steady_clock::now() + period_;
      if (tick_) {
        lock.Unlock();
        tick_();
        lock.Lock();
      }
    }
  }
}

}  // namespace deltacast

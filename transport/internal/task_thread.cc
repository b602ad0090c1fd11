#include "transport/internal/task_thread.h"

#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"

namespace deltacast::transport {

struct TaskThread::State {
  Mutex mu;
  CondVar cv;
  // Keyed by (deadline, post order): FIFO among equal deadlines.
  std::map<std::pair<Clock::time_point, uint64_t>, std::function<void()>> tasks GUARDED_BY(mu);
  uint64_t next_order GUARDED_BY(mu) = 0;
  bool stop_requested GUARDED_BY(mu) = false;
  bool drain GUARDED_BY(mu) = false;
  bool stopped GUARDED_BY(mu) = false;  // Post refuses from here on
  std::thread thread;
  std::thread::id thread_id;

  void Loop() {
    MutexLock lock(mu);
    while (true) {
      if (stop_requested && (!drain || tasks.empty())) break;
      if (tasks.empty()) {
        cv.wait(lock);
        continue;
      }
      auto first = tasks.begin();
      if (!(stop_requested && drain) && first->first.first > Clock::now()) {
        cv.wait_until(lock, first->first.first);
        continue;
      }
      std::function<void()> task = std::move(first->second);
      tasks.erase(first);
      lock.Unlock();
      task();
      task = nullptr;  // destroy captures outside the lock as well
      lock.Lock();
    }
    stopped = true;
    auto dropped = std::move(tasks);
    tasks.clear();
    lock.Unlock();
    dropped.clear();
  }
};

TaskThread::TaskThread() : state_(std::make_shared<State>()) {
  MutexLock lock(state_->mu);
  state_->thread = std::thread([state = state_] { state->Loop(); });
  state_->thread_id = state_->thread.get_id();
}

TaskThread::~TaskThread() { Stop(/*drain=*/false); }

bool TaskThread::Post(std::function<void()> task) {
  return PostAt(Clock::time_point::min(), std::move(task));
}

bool TaskThread::PostAt(Clock::time_point when, std::function<void()> task) {
  MutexLock lock(state_->mu);
  if (state_->stopped || (state_->stop_requested && !state_->drain)) return false;
  state_->tasks.emplace(std::make_pair(when, state_->next_order++), std::move(task));
  state_->cv.notify_one();
  return true;
}

void TaskThread::Stop(bool drain) {
  std::thread thread;
  {
    MutexLock lock(state_->mu);
    if (!state_->stop_requested) {
      state_->stop_requested = true;
      state_->drain = drain;
    }
    state_->cv.notify_one();
    thread = std::move(state_->thread);
  }
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();  // the thread holds its own reference to the state
  } else {
    thread.join();
  }
}

bool TaskThread::OnThread() const { return std::this_thread::get_id() == state_->thread_id; }

}  // namespace deltacast::transport

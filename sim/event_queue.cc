#include "sim/event_queue.h"

#include <fmt/core.h>

#include <algorithm>

namespace deltacast::sim {

EventQueue::EventQueue(uint64_t seed, Duration max_post_jitter)
    : rng_(seed),
      max_jitter_(max_post_jitter),
      // Not zero: engine code may treat a zero time point as "never".
      start_(TimePoint(std::chrono::hours(1))),
      now_(start_) {}

uint64_t EventQueue::OpenQueue(const char* kind) {
  const uint64_t id = next_queue_++;
  kinds_[id] = kind;
  if (opening_owner_ >= 0) owners_[id] = opening_owner_;
  return id;
}

int EventQueue::OwnerOf(uint64_t queue) const {
  auto it = owners_.find(queue);
  return it == owners_.end() ? -1 : it->second;
}

int EventQueue::RunningOwner() const { return running_.empty() ? -1 : OwnerOf(running_.back()); }

bool EventQueue::OwnerOnStack(int owner) const {
  for (size_t k = 0; k + 1 < running_.size(); ++k) {
    if (OwnerOf(running_[k]) == owner) return true;
  }
  return false;
}

void EventQueue::CloseOwner(int owner) {
  for (const auto& [queue, o] : owners_) {
    if (o == owner) CloseQueue(queue);
  }
}

bool EventQueue::Busy(uint64_t queue) const {
  if (std::find(running_.begin(), running_.end(), queue) != running_.end()) return true;
  if (waiting_owners_.empty()) return false;
  auto kind = kinds_.find(queue);
  if (kind == kinds_.end() || (kind->second != "apply" && kind->second != "hook")) return false;
  const int owner = OwnerOf(queue);
  for (int waiting : waiting_owners_) {
    if (waiting != owner) return true;
  }
  return false;
}

void EventQueue::Restore() {
  for (auto it = aside_.begin(); it != aside_.end();) {
    if (!Busy(it->queue)) {
      // In their order: their sequence numbers.
      heap_.push(Task{std::max(it->at, now_), it->seq, it->queue, std::move(it->fn)});
      it = aside_.erase(it);
    } else {
      ++it;
    }
  }
}

void EventQueue::SetAsideBusy() {
  if (running_.empty()) return;  // nothing blocked: no queue is busy
  while (!heap_.empty() && Busy(heap_.top().queue)) {
    aside_.push_back(std::move(const_cast<Task&>(heap_.top())));
    heap_.pop();
  }
}

void EventQueue::CloseQueue(uint64_t queue) {
  closed_.insert(queue);
  last_post_.erase(queue);
}

void EventQueue::Push(uint64_t queue, TimePoint at, std::function<void()> fn) {
  if (closed_.count(queue)) return;
  heap_.push(Task{std::max(at, now_), seq_++, queue, std::move(fn)});
  peak_pending_ = std::max(peak_pending_, heap_.size());
}

void EventQueue::Post(uint64_t queue, std::function<void()> task) {
  // A small random delay explores interleavings between queues; a queue's own tasks
  // keep their order.
  Duration jitter{0};
  if (max_jitter_.count() > 0) jitter = Duration(rng_() % (max_jitter_.count() + 1));
  TimePoint at = now_ + jitter;
  auto& last = last_post_[queue];
  at = std::max(at, last);
  last = at;
  Push(queue, at, std::move(task));
}

void EventQueue::PostAt(uint64_t queue, TimePoint at, std::function<void()> task) {
  Push(queue, at, std::move(task));
}

void EventQueue::Fold(uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    hash_ ^= (v >> (8 * i)) & 0xff;
    hash_ *= 1099511628211ull;
  }
}

bool EventQueue::Step() {
  SetAsideBusy();
  while (!heap_.empty()) {
    // The heap's top is const: move the task out through a copy of its handle.
    Task task = std::move(const_cast<Task&>(heap_.top()));
    heap_.pop();
    if (closed_.count(task.queue)) continue;
    if (Busy(task.queue)) {
      aside_.push_back(std::move(task));
      continue;
    }
    if (++tasks_run_ > task_budget_) throw Stuck{"task budget spent (a livelock?)"};
    if (tasks_run_ % 4096 == 0 && std::chrono::steady_clock::now() > wall_limit_) {
      throw Stuck{"more than " + std::to_string(static_cast<int>(wall_limit_seconds_)) +
                  " s of wall time (a livelock?)"};
    }
    now_ = task.at;
    if (now_ > time_limit_) {
      std::string why = "simulated time limit passed";
      if (!waits_.empty()) {
        why += waits_.back() == TimePoint::max()
                   ? " (the source's Publish waits with no deadline: the chunk window)"
                   : " (the source's Publish waits)";
      }
      throw Stuck{why};
    }
    Fold(static_cast<uint64_t>((now_ - start_).count()));
    Fold(task.queue);
    running_.push_back(task.queue);
    struct Leave {
      EventQueue& q;
      ~Leave() {
        q.running_.pop_back();
        q.Restore();
      }
    } leave{*this};
    try {
      task.fn();
    } catch (const Killed&) {
      // Its process was killed while the task waited: the thread is gone.
      if (!closed_.count(task.queue)) throw;
    }
    return true;
  }
  return false;
}

void EventQueue::RunFor(Duration d) {
  const TimePoint until = now_ + d;
  for (;;) {
    SetAsideBusy();
    if (heap_.empty() || heap_.top().at > until) break;
    Step();
  }
  now_ = std::max(now_, until);
}

bool EventQueue::RunUntil(TimePoint deadline, const std::function<bool()>& done) {
  // The driver (outside any task) or a task of a process, whose queue is then busy.
  const bool driver = running_.empty();
  const uint64_t caller = driver ? 0 : running_.back();
  ++blocked_depth_;
  if (driver) ++driver_blocked_;
  if (!driver) waiting_owners_.push_back(OwnerOf(caller));
  waits_.push_back(deadline);
  struct Leave {
    EventQueue& q;
    bool driver;
    ~Leave() {
      --q.blocked_depth_;
      if (driver) --q.driver_blocked_;
      q.waits_.pop_back();
      if (!driver) {
        q.waiting_owners_.pop_back();
        q.Restore();
      }
    }
  } leave{*this, driver};
  for (;;) {
    if (driver && kill_blocked_) {
      kill_blocked_ = false;
      throw Killed{};
    }
    if (!driver && closed_.count(caller)) throw Killed{};
    if (done()) return true;
    SetAsideBusy();
    if (heap_.empty() || heap_.top().at > deadline) {
      if (deadline == TimePoint::max()) throw Stuck{"a blocking wait with nothing left to run"};
      now_ = std::max(now_, deadline);
      return done();
    }
    Step();
  }
}

double EventQueue::Seconds() const { return std::chrono::duration<double>(now_ - start_).count(); }

void EventQueue::Note(const std::string& line) {
  notes_.push_back(fmt::format("[{:10.6f}] {}", Seconds(), line));
  for (char c : line) Fold(static_cast<unsigned char>(c));
}

}  // namespace deltacast::sim

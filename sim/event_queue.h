// EventQueue: the simulator's runtime (common/runtime.h). One thread runs every task
// of every simulated process in the order of (simulated time, sequence number); time
// jumps to the next task, so a run of minutes of simulated time takes as long as its
// work. Every random choice of the run comes from one seeded generator, so a seed
// replays the same order. Each task run is folded into a trace hash (its time, queue
// and kind); the simulator's own events are also kept as readable lines.
//
// Thread safety: none; used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/runtime.h"

namespace deltacast::sim {

// Thrown out of RunUntil when the process blocked in it (the source) is killed.
struct Killed {};
// Thrown when the run is stuck (a blocking wait with nothing left to run) or runs
// away (the task budget is spent): both are liveness failures.
struct Stuck {
  std::string why;
};

class EventQueue final : public Runtime {
 public:
  using Duration = std::chrono::steady_clock::duration;
  explicit EventQueue(uint64_t seed, Duration max_post_jitter = std::chrono::microseconds(20));

  TimePoint Now() override { return now_; }
  uint64_t OpenQueue(const char* kind) override;
  void CloseQueue(uint64_t queue) override;
  void Post(uint64_t queue, std::function<void()> task) override;
  void PostAt(uint64_t queue, TimePoint at, std::function<void()> task) override;
  bool RunUntil(TimePoint deadline, const std::function<bool()>& done) override;
  uint64_t Random64() override { return rng_(); }

  // Runs every task due up to `until`, then sets the clock there.
  void RunFor(Duration d);
  // Runs the next task; false if none is left.
  bool Step();
  // The caller blocked in RunUntil is killed: RunUntil throws Killed once the
  // running task returns.
  void KillBlocked() { kill_blocked_ = true; }
  // The driver (the source's Publish) is blocked in RunUntil, outside any task.
  bool blocked() const { return driver_blocked_ > 0; }

  // Processes: a queue opened while `owner` is set (>= 0) belongs to that process
  // (the simulator sets it around starting one), so that the process can be killed
  // while a task of its is on the stack (below).
  void set_opening_owner(int owner) { opening_owner_ = owner; }
  int OwnerOf(uint64_t queue) const;
  // The process whose task is running now (-1: none or unowned).
  int RunningOwner() const;
  // Whether a task of `owner` is running below the one running now: a task that
  // blocked in RunUntil (an engine thread waiting, e.g. for a pause hook).
  bool OwnerOnStack(int owner) const;
  // Whether any task is running below the one running now.
  bool Nested() const { return running_.size() > 1; }
  // The process dies now: every queue of `owner` is closed. A task of it that waits
  // in RunUntil unwinds with Killed at its next check (Step swallows a Killed out
  // of a task whose queue is closed: the thread died with its process).
  void CloseOwner(int owner);

  std::mt19937_64& rng() { return rng_; }
  double Uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  uint64_t Below(uint64_t n) { return n ? rng_() % n : 0; }
  double Seconds() const;  // simulated seconds since the start

  // A readable line in the trace (with the time), and folded into the hash.
  void Note(const std::string& line);
  const std::vector<std::string>& notes() const { return notes_; }
  uint64_t trace_hash() const { return hash_; }
  uint64_t tasks_run() const { return tasks_run_; }
  size_t pending() const { return heap_.size(); }
  size_t peak_pending() const { return peak_pending_; }
  void set_task_budget(uint64_t n) { task_budget_ = n; }
  // Simulated time past which the run counts as stuck (Stuck is thrown).
  void set_time_limit(Duration d) { time_limit_ = start_ + d; }
  // Wall time, from now, past which the run counts as stuck: a livelock whose tasks
  // are slow (each a file operation) spends the task budget only after many minutes
  // (the --stripes seed 41721 ran ten minutes of wall time without ending).
  void set_wall_limit(std::chrono::steady_clock::duration d) {
    wall_limit_ = std::chrono::steady_clock::now() + d;
    wall_limit_seconds_ = std::chrono::duration<double>(d).count();
  }

 private:
  struct Task {
    TimePoint at;
    uint64_t seq;
    uint64_t queue;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Task& a, const Task& b) const {
      return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    }
  };
  void Push(uint64_t queue, TimePoint at, std::function<void()> fn);
  void Fold(uint64_t v);
  // Moves the tasks at the top of the heap whose queue is busy aside; they go back
  // (Restore) once it is not. A queue is busy while a task of it runs (blocked in
  // RunUntil further down the stack): a queue runs one task at a time, as a thread
  // does. And while a process's task waits in RunUntil (a node waiting for its
  // engine's pause hook), the "apply" and "hook" queues of every other process are
  // busy too: so no other process's wait nests above it and outlasts it (nested
  // waits return last in, first out; its pause would seem to last as long as the
  // other's). Other processes' apply threads wait that long: a pause is ~0-30 ms,
  // one past its timeout ~1-1.5 s.
  void SetAsideBusy();
  bool Busy(uint64_t queue) const;
  void Restore();

  std::mt19937_64 rng_;
  const Duration max_jitter_;
  TimePoint start_, now_;
  uint64_t seq_ = 0;
  uint64_t next_queue_ = 1;
  std::priority_queue<Task, std::vector<Task>, Later> heap_;
  std::set<uint64_t> closed_;
  std::map<uint64_t, TimePoint> last_post_;  // per queue: posts stay in order
  std::map<uint64_t, std::string> kinds_;
  std::vector<std::string> notes_;
  uint64_t hash_ = 1469598103934665603ull;
  uint64_t tasks_run_ = 0;
  uint64_t task_budget_ = 50'000'000;
  size_t peak_pending_ = 0;
  TimePoint time_limit_ = TimePoint::max();
  std::chrono::steady_clock::time_point wall_limit_ = std::chrono::steady_clock::time_point::max();
  double wall_limit_seconds_ = 0;
  int blocked_depth_ = 0;
  int driver_blocked_ = 0;        // RunUntil calls in progress outside any task
  std::vector<TimePoint> waits_;  // deadlines of the RunUntil calls in progress
  bool kill_blocked_ = false;
  std::vector<uint64_t> running_;    // queues of the tasks on the stack, innermost last
  std::vector<int> waiting_owners_;  // owners of the tasks waiting in RunUntil
  std::vector<Task> aside_;          // tasks of busy queues
  std::map<uint64_t, int> owners_;
  int opening_owner_ = -1;
};

}  // namespace deltacast::sim

// EngineModel: the inference engine that serves from a simulated node's weights
// (issue 28). The node calls its hooks around every write to the store
// (relay::EngineHooks); the model's pause takes simulated time (0.1-30 ms) and,
// while the run's faults are on, fails or returns only after the hook timeout as the
// scenario draws, from a generator of its own (a seed replays the same hooks).
//
// Its checks (run.cc calls Fail through `fail`):
// - the store's bytes never change while the engine serves: from its start or a
//   resume to the next pause or the process's death, the store file hashes the same;
// - a resume follows a pause, and if the store was written while paused, finds it
//   whole, at one version; at the end the engine is not left paused;
// - every refit committed under a pause is reported: at the end of a life the node's
//   pause_seconds_total is at least the sum, over the refits it committed, of the
//   time from the pause hook's return to the commit (a lower bound of that pause).
//
// Thread safety: none; runs on the simulator's one thread (the hooks on the node's
// hook loop, a queue of the EventQueue).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>

#include "relay/store/node_store.h"
#include "sim/event_queue.h"

namespace deltacast::sim {

struct EngineCounts {
  uint64_t pauses = 0;        // pause hooks that returned (paused)
  uint64_t failed = 0;        // pause hooks that failed (nothing paused)
  uint64_t hung = 0;          // pause hooks that returned after the timeout
  uint64_t resumes = 0;       // resume hooks
  uint64_t checked = 0;       // times the store was checked unchanged while serving
  uint64_t refits = 0;        // refits committed under a pause
  double paused_seconds = 0;  // from each pause's return to its resume
};

class EngineModel {
 public:
  using FailFn = std::function<void(const std::string&)>;
  // `whole`: whether the store's bytes are now those of one version (any the run
  // published), checked at every resume.
  EngineModel(EventQueue& q, std::string node, std::filesystem::path store, uint64_t seed,
              double fail, double hang, std::chrono::milliseconds timeout, FailFn fail_fn,
              std::function<bool()> whole);

  // The hooks of one life of the node (a new process each start).
  relay::EngineHooks Hooks();
  // Faults (failing and hanging pauses) only while the run's faults are on.
  void set_faults(bool on) { faults_ = on; }
  // Called as a failing or hanging pause hook returns: a fault that acted on the
  // refit until now (the run's time-lost and stall checks count it as one).
  void set_on_fault(std::function<void()> on_fault) { on_fault_ = std::move(on_fault); }
  // The node's process started: the engine serves the store as it is.
  void Started();
  // The process dies now (a kill, a crash point or the end): the store must not have
  // changed while the engine served; the engine goes with the process.
  void Died();
  // On the node's commit callback (NodeStore, on_commit): a refit committed.
  void OnRefitCommit();
  // At the end of a life that was not cut short: the node's reported pauses.
  void CheckReported(double pause_seconds_total);
  bool paused() const { return paused_; }
  const EngineCounts& counts() const { return counts_; }

 private:
  Status Pause(uint64_t life);
  void Resume(uint64_t life);
  uint64_t StoreHash() const;
  void CheckUnchanged(const char* until);

  EventQueue& q_;
  const std::string node_;
  const std::filesystem::path store_;
  std::mt19937_64 rng_;
  const double fail_, hang_;
  const std::chrono::milliseconds timeout_;
  const FailFn fail_fn_;
  const std::function<bool()> whole_;
  std::function<void()> on_fault_;
  bool faults_ = true;
  uint64_t life_ = 0;
  bool paused_ = false;
  std::optional<uint64_t> serving_hash_;  // the store while serving (none: not serving)
  EventQueue::TimePoint pause_called_{}, pause_returned_{};
  uint64_t hash_at_pause_ = 0;
  double reported_lower_bound_ = 0;  // this life's refits: pause call to commit
  EngineCounts counts_;
};

}  // namespace deltacast::sim

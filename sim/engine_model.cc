#include "sim/engine_model.h"

#include <fmt/core.h>

#include "common/file_util.h"
#include "common/hash.h"

namespace deltacast::sim {

EngineModel::EngineModel(EventQueue& q, std::string node, std::filesystem::path store,
                         uint64_t seed, double fail, double hang, std::chrono::milliseconds timeout,
                         FailFn fail_fn, std::function<bool()> whole)
    : q_(q),
      node_(std::move(node)),
      store_(std::move(store)),
      rng_(seed),
      fail_(fail),
      hang_(hang),
      timeout_(timeout),
      fail_fn_(std::move(fail_fn)),
      whole_(std::move(whole)) {}

relay::EngineHooks EngineModel::Hooks() {
  relay::EngineHooks hooks;
  const uint64_t life = life_;
  hooks.pause = [this, life] { return Pause(life); };
  hooks.resume = [this, life] { Resume(life); };
  hooks.timeout = timeout_;
  return hooks;
}

uint64_t EngineModel::StoreHash() const {
  auto bytes = ReadFile(store_, uint64_t{1} << 30);
  return bytes.ok() ? Hash64(*bytes) : 0;
}

void EngineModel::CheckUnchanged(const char* until) {
  if (!serving_hash_) return;
  ++counts_.checked;
  if (StoreHash() != *serving_hash_) {
    fail_fn_(
        fmt::format("{}: its weights changed while its engine served (found {})", node_, until));
    serving_hash_ = StoreHash();  // once per change
  }
}

void EngineModel::Started() {
  ++life_;
  paused_ = false;
  reported_lower_bound_ = 0;
  serving_hash_ = StoreHash();
}

void EngineModel::Died() {
  if (!paused_) CheckUnchanged("as its process died");
  paused_ = false;
  serving_hash_.reset();
}

Status EngineModel::Pause(uint64_t life) {
  if (life != life_) return Status::Aborted("a pause hook of a process that died");
  if (paused_) fail_fn_(node_ + ": its engine was asked to pause while paused");
  CheckUnchanged("at a pause");
  pause_called_ = q_.Now();
  // How long the engine takes to stop reading the weights; a fault: it refuses, or
  // takes longer than the node waits.
  std::uniform_real_distribution<double> u(0, 1);
  double seconds = 0.0001 + u(rng_) * 0.03;
  const double draw = u(rng_);
  const bool hang = faults_ && draw < hang_;
  // A hang refuses in the end half of the time (a late refusal pauses nothing either).
  const bool refuse = faults_ && (hang ? u(rng_) < 0.5 : draw < hang_ + fail_);
  if (hang) seconds = std::chrono::duration<double>(timeout_).count() + 0.01 + u(rng_) * 0.5;
  const auto until = q_.Now() + std::chrono::duration_cast<EventQueue::Duration>(
                                    std::chrono::duration<double>(seconds));
  // The hook blocks its thread (the node's hook loop) that long; the node waits for
  // it at most its timeout. Killed unwinds from here if the process dies meanwhile.
  (void)q_.RunUntil(until, [] { return false; });
  if (life != life_) return Status::Aborted("a pause hook of a process that died");
  // Nothing may have been written while it was pausing either.
  CheckUnchanged("while its engine was pausing");
  q_.Note(fmt::format("{} engine: pause {:.4f} s{}", node_, seconds,
                      refuse ? ", refused"
                      : hang ? ", past the timeout"
                             : ""));
  if ((refuse || hang) && on_fault_) on_fault_();
  if (refuse) {
    ++counts_.failed;
    return Status::Unavailable("the simulated engine refused to pause");
  }
  if (hang) ++counts_.hung;
  ++counts_.pauses;
  paused_ = true;
  pause_returned_ = q_.Now();
  hash_at_pause_ = StoreHash();
  serving_hash_.reset();
  return Status::Ok();
}

void EngineModel::Resume(uint64_t life) {
  if (life != life_) return;
  q_.Note(node_ + " engine: resume");
  if (!paused_) {
    fail_fn_(node_ + ": its engine was resumed while not paused");
    return;
  }
  ++counts_.resumes;
  paused_ = false;
  // Written while paused: the store must be whole again (a resume that only ends
  // a pause in which nothing was written gives back what was served before it).
  if (whole_ && StoreHash() != hash_at_pause_ && !whole_()) {
    fail_fn_(node_ + ": its engine was resumed on weights that are not one version (torn)");
  }
  counts_.paused_seconds += std::chrono::duration<double>(q_.Now() - pause_returned_).count();
  serving_hash_ = StoreHash();
}

void EngineModel::OnRefitCommit() {
  if (!paused_) return;  // nothing written (the node held the target already)
  ++counts_.refits;
  // The node counts a pause from its hook's return (reaching a pause is not time the
  // engine could not serve): from then to this commit is a lower bound of it.
  reported_lower_bound_ += std::chrono::duration<double>(q_.Now() - pause_returned_).count();
}

void EngineModel::CheckReported(double pause_seconds_total) {
  if (pause_seconds_total + 1e-9 < reported_lower_bound_) {
    fail_fn_(fmt::format(
        "{}: reported {:.6f} s of refit pauses, but its engine was paused at least {:.6f} s "
        "for the refits it committed",
        node_, pause_seconds_total, reported_lower_bound_));
  }
}

}  // namespace deltacast::sim

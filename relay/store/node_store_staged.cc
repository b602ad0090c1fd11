// NodeStore's staged apply (node_store.h): chunks checked and decoded while the
// engine serves, written at commit between the engine's hooks.

#include "common/crash_point.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/store/internal/node_store_state.h"
#include "relay/store/node_store.h"

namespace deltacast::relay {
namespace {

// The engine's resume hook, on the hook thread: its errors are logged, never thrown.
void RunResume(const std::function<void()>& resume) {
  try {
    resume();
  } catch (const std::exception& e) {
    log::Error(std::string("the engine's resume hook threw: ") + e.what());
  } catch (...) {
    log::Error("the engine's resume hook threw");
  }
}

}  // namespace

// Staged: checked and decoded, never written; held for the commit (false: staged
// already, or refused). The chunk is durable in the spool and checked before it is
// journaled, so a HELLO after a reconnect lists it and a restart stages it again
// from the spool.
bool NodeStore::StageChunk(apply::DeltaApplier& applier, uint32_t sequence, const TakenChunk& chunk,
                           ApplyResult& result) {
  {
    MutexLock lock(staged_mu_);
    if (refit_->held.contains(sequence)) return false;
  }
  auto staged = applier.StageChunk(chunk.view, staged_budget_);
  if (!staged.ok()) {
    result.status = staged.status();
    result.refused = applier.WasRefused(sequence);
    return false;
  }
  RefitState::Held held{std::make_shared<apply::StagedChunk>(std::move(*staged)), nullptr};
  // The chunk's bytes too, while the budget lasts: the commit then reads nothing.
  const auto size = static_cast<int64_t>(chunk.message->size());
  if (staged_budget_.fetch_sub(size) >= size) {
    held.message = chunk.message;
  } else {
    staged_budget_ += size;
  }
  MutexLock lock(staged_mu_);
  refit_->held.emplace(sequence, std::move(held));
  return true;
}

Status NodeStore::ApplyStaged() {
  // Everything that does not need the weights was done before COMMIT; what is
  // left is the write, the hash of what was written, and the journal's commit.
  RETURN_IF_ERROR(PauseEngine());
  CrashPoint("agent.staged_apply_begin");
  refit_->untouched = false;
  apply::DeltaApplier& applier = *refit_->applier;
  std::map<uint32_t, RefitState::Held> held;
  {
    MutexLock lock(staged_mu_);
    held.swap(refit_->held);
  }
  Status first_error;
  for (auto& [sequence, chunk] : held) {
    transport::Message message = chunk.message;
    if (!message) {
      auto read = refit_->spool ? refit_->spool->Read(sequence)
                                : Result<transport::Message>(Status::Internal("no spool"));
      if (!read.ok()) {
        if (first_error.ok()) first_error = read.status();
        continue;
      }
      message = std::move(*read);
    }
    auto parsed = codec::ParseChunk(ChunkOf(*message));
    Status applied =
        parsed.ok() ? applier.ApplyChunk(*parsed, chunk.records.get()) : parsed.status();
    if (!applied.ok() && first_error.ok()) first_error = applied;
    chunk = {};  // its memory goes as soon as it is written
    CrashPoint("agent.staged_apply");
  }
  const codec::Manifest& target = *refit_->target;
  auto written = applier.Finish(*refit_->summary);
  if (first_error.ok() && written.ok() && written->VersionId() == target.VersionId()) {
    // The weights are the target, verified: the engine serves again while the
    // commit is journaled. A crash before the journal has it finds every partition
    // at the target and commits it from the decision (COMMIT, or this would not
    // run): nothing the engine served from is undone.
    refit_->paused_seconds = ResumeEngine(/*store_at_target=*/true);
    return CommitDelta(target);
  }
  // The store was not all at the base it was staged against (torn partitions, a
  // write that missed its target and was undone): the version is durable by the
  // spool and the decision, so it is committed ahead of the bytes and reconciled.
  log::Warn("the staged apply did not reach the target everywhere (" +
            (first_error.ok() ? written.status() : first_error).ToString() +
            "); committing from the spool and reconciling");
  RETURN_IF_ERROR(KeepInflightDelta());
  return replica_->CommitAhead(target);
}

Status NodeStore::PauseEngine() {
  if (engine_paused_) return Status::Ok();
  RETURN_IF_ERROR(RunPauseHook());
  // The engine stops serving once the hook returns: reaching a pause (a request
  // finishing) is not time it could not serve.
  paused_at_ = RuntimeClock::now();
  engine_paused_ = true;
  return Status::Ok();
}

double NodeStore::ResumeEngine(bool store_at_target) {
  if (!engine_paused_) return 0;
  const double paused = std::chrono::duration<double>(RuntimeClock::now() - paused_at_).count();
  // Not while the store is not known whole: a crash tore it, a commit went ahead of
  // its bytes, or a write that gave up (a catch-up, a rollback, a dropped refit) left
  // a delta in flight over it. The engine stays paused until what mends it succeeds
  // (the reconcile, a catch-up, a rollback: each resumes it), whatever gave up
  // meanwhile. A staged delta not written yet leaves the store whole, and so does one
  // written and verified at its target.
  const bool whole_staged = refit_ && refit_->staged && (refit_->untouched || store_at_target);
  if (replica_->needs_reconcile() || (replica_->inflight() && !whole_staged)) return paused;
  engine_paused_ = false;
  if (options_.hooks.resume) {
    hook_loop_.Post([resume = options_.hooks.resume] { RunResume(resume); });
  }
  return paused;
}

Status NodeStore::RunPauseHook() {
  if (!options_.hooks.pause) return Status::Ok();
  // Through the runtime's wait (common/runtime.h): under the simulator the hook
  // loop is a queue of its and the hook takes simulated time.
  struct Returned {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    Status status GUARDED_BY(mu);
    RuntimeClock::time_point at GUARDED_BY(mu);
  };
  auto returned = std::make_shared<Returned>();
  hook_loop_.Post([pause = options_.hooks.pause, returned] {
    Status status;
    try {
      status = pause();
    } catch (const std::exception& e) {
      status = Status::Internal(std::string("it threw: ") + e.what());
    } catch (...) {
      status = Status::Internal("it threw");
    }
    MutexLock lock(returned->mu);
    returned->status = status;
    returned->at = RuntimeClock::now();
    returned->done = true;
    returned->cv.notify_all();
  });
  const auto deadline = RuntimeClock::now() + options_.hooks.timeout;
  MutexLock lock(returned->mu);
  // Returned in time: by the time it returned (a simulated wait may see it late).
  const bool in_time = WaitUntil(returned->cv, lock, deadline,
                                 [&]() REQUIRES(returned->mu) { return returned->done; }) &&
                       returned->at <= deadline;
  Status status = returned->status;  // final once done: the hook ran once
  lock.Unlock();
  if (!in_time) {
    // It may still pause the engine: resume it once it does (the hook thread runs
    // one hook at a time, in order, so the pause has returned by then), and only if
    // it paused: a late pause that fails paused nothing. Nothing is written.
    if (options_.hooks.resume) {
      hook_loop_.Post([resume = options_.hooks.resume, returned] {
        {
          MutexLock lock(returned->mu);
          if (!returned->done || !returned->status.ok()) return;
        }
        RunResume(resume);
      });
    }
    return Status::Timeout("the engine's pause hook did not return within " +
                           std::to_string(options_.hooks.timeout.count()) +
                           " ms; nothing was written");
  }
  if (!status.ok()) {
    // A pause that failed paused nothing, by its contract; nothing is written.
    return status.WithContext("the engine's pause hook failed; nothing was written");
  }
  return Status::Ok();
}

}  // namespace deltacast::relay

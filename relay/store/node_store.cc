#include "relay/store/node_store.h"

#include <atomic>
#include <chrono>
#include <map>

#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "common/thread_time.h"
#include "relay/store/internal/node_store_state.h"
#include "relay/store/snapshot_store.h"
#include "relay/wire/signing.h"

namespace deltacast::relay {
namespace {

using Clock = RuntimeClock;

// Apply workers run below the event loops' priority: on a busy node the loop that
// forwards a verified chunk to the children gets the CPU before the apply of the
// last one (CFS weight of nice 5 is about a third of nice 0's).
constexpr int kApplyWorkerNice = 5;

// The partitions `chunk` names, as fetches for the bytes `target` gives them.
void AddDiffering(const apply::WeightStore& store, const codec::Manifest& now,
                  const codec::Manifest& target, std::vector<Fetch>& out) {
  for (size_t t = 0; t < target.tensors.size(); ++t) {
    const TensorSpec& info = target.tensors[t];
    const uint64_t per = codec::PartitionElements(info.dtype, target.partition_bytes);
    const uint64_t e = ElementSize(info.dtype);
    for (size_t p = 0; p < target.partition_hashes[t].size(); ++p) {
      if (now.partition_hashes[t][p] == target.partition_hashes[t][p]) continue;
      const uint64_t offset = p * per;
      out.push_back({0, info.name, offset, std::min(per, info.ElementCount() - offset) * e,
                     target.partition_hashes[t][p]});
    }
  }
  (void)store;
}

}  // namespace

NodeStore::NodeStore(std::unique_ptr<apply::Replica> replica, Options options, EventLoop& loop,
                     std::function<void(const Journal&)> on_journal,
                     std::function<void(const CommitEvent&)> on_commit)
    : replica_(std::move(replica)),
      options_(std::move(options)),
      loop_(loop),
      on_journal_(std::move(on_journal)),
      on_commit_(std::move(on_commit)),
      refit_(std::make_unique<RefitState>()),
      write_back_(options_.write_back_delay),
      workers_(std::make_unique<WorkerPool>(std::max<size_t>(1, options_.apply_threads),
                                            kApplyWorkerNice)),
      // Named for the simulator, which runs one node's engine pause at a time.
      hook_loop_({}, std::chrono::milliseconds(100), "hook"),
      apply_loop_({}, std::chrono::milliseconds(100), "apply") {
  options_.apply_threads = workers_->size();
}

NodeStore::~NodeStore() { Stop(); }
void NodeStore::Start() {
  hook_loop_.Start();
  apply_loop_.Start();
}
void NodeStore::Stop() {
  apply_loop_.Stop();
  workers_->Stop();
  // A hook still running is waited for (EngineHooks: a pause that hangs fails its
  // write, but the node can only stop once it returns).
  hook_loop_.Stop();
  // The apply thread is gone: this thread drives the replica now. A write-back that
  // ran to the end clears the journal's note; one still waiting is dropped.
  auto flushed = write_back_.Abandon();
  if (flushed && flushed->status.ok()) (void)replica_->MarkFlushed(flushed->target);
  if (options_.snapshots) options_.snapshots->Stop();
}

NodeStore::Journal NodeStore::journal() const {
  MutexLock lock(journal_mu_);
  return {replica_->version(),        replica_->inflight(),  replica_->prepared(),
          replica_->applied_chunks(), replica_->unflushed(), replica_->needs_reconcile()};
}

// Apply thread: the loop sees the journal change before the completion that follows.
void NodeStore::PostJournal() {
  Reply([this, j = journal()] { on_journal_(j); });
}

apply::ApplyOptions NodeStore::RefitOptions() const {
  apply::ApplyOptions o;
  o.threads = options_.apply_threads;
  // A staged delta is written only after COMMIT, which nothing rolls back (a write
  // cut short is finished, not undone), so it keeps no undo: copying its records'
  // XOR words aside would be most of its pause. On arrival the undo is kept; the
  // spool holds the records, so XOR ones roll back from there, and memory stays
  // bounded by the credit window and scratch whatever the model size.
  o.keep_undo = !refit_->staged;
  o.undo_from_records = true;
  // Durable by the spool: nothing is flushed before PREPARED.
  o.flush_on_finish = false;
  o.pool = workers_.get();
  return o;
}

void NodeStore::WaitForChunks() {
  MutexLock lock(chunks_mu_);
  chunks_done_.wait(lock, [&]() REQUIRES(chunks_mu_) { return chunks_in_flight_ == 0; });
}

Status NodeStore::Settle() {
  auto flushed = write_back_.Join();
  if (!flushed) return Status::Ok();
  if (!flushed->status.ok()) {
    log::Error("write-back of version " + flushed->target.ShortHex() +
               " failed: " + flushed->status.ToString());
    return flushed->status.WithContext("write-back of the last commit");
  }
  MutexLock lock(journal_mu_);
  return replica_->MarkFlushed(flushed->target);
}

// ---- the refit ---------------------------------------------------------------

void NodeStore::BeginRefit(uint64_t id, const codec::DeltaIdentity& identity,
                           const std::array<uint8_t, 32>& manifest_digest,
                           std::shared_ptr<Spool> spool, Done done) {
  apply_loop_.Post([this, id, identity, manifest_digest, spool, done] {
    WaitForChunks();
    *refit_ = RefitState{};
    refit_->id = id;
    refit_->manifest_digest = manifest_digest;
    refit_->staged = options_.mode == topology::ApplyMode::kStaged;
    refit_->spool = spool;
    staged_budget_ = static_cast<int64_t>(options_.staged_memory);
    Status status = Settle();
    if (status.ok() && !replica_->inflight() && !replica_->unflushed()) {
      // The last commit's writes are on disk: its spool is no longer needed.
      Spool::RemoveOthers(options_.spool_dir, identity.target_version);
    }
    if (!status.ok()) {
      // Reported below; nothing is written over pages whose write-back failed.
    } else if (!replica_->inflight() && replica_->version() == identity.target_version) {
      // Already there (a node that committed this version before a restart, or an
      // empty delta): trivially prepared once the END arrives.
      refit_->at_target = true;
    } else {
      const bool resuming = replica_->inflight().has_value();
      // A delta resumed after a restart may have been partly written (a commit's
      // write cut short, pages lost with the machine): it is finished as on
      // arrival, torn partitions repaired before PREPARED, the engine paused all
      // along. Only a delta begun here is staged, and so known to be unwritten.
      refit_->staged = refit_->staged && !resuming;
      refit_->untouched = refit_->staged;
      // Apply-on-arrival writes from the first chunk: an engine sharing the weights
      // is paused from here to the commit or rollback.
      if (!refit_->staged) status = PauseEngine();
      auto applier = status.ok() ? replica_->Begin(identity, RefitOptions())
                                 : Result<std::unique_ptr<apply::DeltaApplier>>(status);
      status = applier.status();
      if (applier.ok()) refit_->applier = std::move(*applier);
      if (applier.ok() && resuming && spool) {
        // The journaled chunks are not sent again, and their writes may have been
        // lost with the machine: apply them again from the spool, by hash.
        for (uint32_t sequence : replica_->applied_chunks()) {
          auto message = spool->Read(sequence);
          auto chunk = message.ok() ? codec::ParseChunk(ChunkOf(**message))
                                    : Result<codec::ChunkView>(message.status());
          Status again = chunk.ok() ? refit_->applier->ApplyChunk(*chunk) : chunk.status();
          if (!again.ok()) {
            log::Warn("journaled chunk " + std::to_string(sequence) +
                      " could not be applied again from the spool: " + again.ToString());
          }
          if (chunk.ok()) {
            for (const auto& r : chunk->records) refit_->changed_tensors.emplace(r.tensor_name);
          }
        }
      }
    }
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::ApplyChunk(uint64_t id, uint32_t sequence, std::shared_ptr<ChunkSlot> chunk,
                           std::shared_ptr<Spool> spool,
                           std::function<void(const ApplyResult&)> done) {
  apply_loop_.Post([this, id, sequence, chunk, spool, done] {
    DispatchChunk(id, sequence, chunk, spool, done);
  });
}

namespace {
// Where the apply thread's time went since `before` (common/thread_time.h).
void SplitTime(const ThreadTime& before, NodeStore::ApplyResult& result) {
  const ThreadTimeSplit split = Between(before, ThreadTime::Now());
  result.cpu_seconds = split.cpu_seconds;
  result.runnable_seconds = split.runnable_seconds;
  result.blocked_seconds = split.blocked_seconds;
}

}  // namespace

void NodeStore::DispatchChunk(uint64_t id, uint32_t sequence, std::shared_ptr<ChunkSlot> chunk,
                              std::shared_ptr<Spool> spool,
                              std::function<void(const ApplyResult&)> done) {
  const bool data = chunk->kind() == codec::ChunkKind::kData;
  if (data && refit_->id == id && refit_->applier && !refit_->at_target) {
    {
      MutexLock lock(chunks_mu_);
      ++chunks_in_flight_;
    }
    apply::DeltaApplier* applier = refit_->applier.get();
    workers_->Post([this, id, applier, sequence, chunk, spool, done] {
      const auto t0 = Clock::now();
      const ThreadTime before = ThreadTime::Now();
      ApplyResult result = ApplyData(*applier, sequence, *chunk, spool.get());
      result.sequence = sequence;
      result.seconds = SecondsSince(t0);
      SplitTime(before, result);
      if (result.status.ok() && result.chunk_applied && end_waits_for_refused_ == id) {
        // Maybe the chunk an END was waiting for: the apply thread checks.
        apply_loop_.Post([this, id, result, done]() mutable {
          WaitForChunks();
          if (refit_->id == id && end_waits_for_refused_ == id && refit_->applier &&
              !refit_->applier->HasRefusedChunks()) {
            end_waits_for_refused_ = 0;
            ApplyResult end = FinishRefit();
            end.sequence = result.sequence;
            end.seconds = result.seconds;
            end.chunk_applied = true;
            result = end;
          }
          Reply([done, result] { done(result); });
        });
      } else {
        Reply([done, result] { done(result); });
      }
      MutexLock lock(chunks_mu_);
      if (--chunks_in_flight_ == 0) chunks_done_.notify_all();
    });
    return;
  }
  // END (or a chunk there is nothing to apply for): after every data chunk before it.
  WaitForChunks();
  const auto t0 = Clock::now();
  const ThreadTime before = ThreadTime::Now();
  ApplyResult result;
  // A chunk is on disk in the spool before it changes any partition.
  Status synced = spool ? spool->Sync() : Status::Ok();
  if (!synced.ok()) {
    result.status = synced;
  } else if (refit_->id != id) {
  } else if (refit_->at_target) {
    result.end = chunk->kind() == codec::ChunkKind::kEnd;
  } else if (refit_->applier) {
    auto taken = TakeChunk(*chunk, sequence, spool.get());
    if (!taken.ok()) {
      result.status = taken.status();
    } else if (taken->view.kind == codec::ChunkKind::kEnd) {
      refit_->summary = taken->view.summary;
      // A refused chunk is fetched again, and this END replayed behind it.
      if (!refit_->applier->HasRefusedChunks()) {
        result = FinishRefit();
      } else {
        end_waits_for_refused_ = id;
      }
    }
  }
  result.sequence = sequence;
  result.seconds = SecondsSince(t0);
  SplitTime(before, result);
  Reply([done, result] { done(result); });
}

// The chunk's message (its buffer if the node still holds it, else from the spool),
// parsed.
Result<NodeStore::TakenChunk> NodeStore::TakeChunk(const ChunkSlot& slot, uint32_t sequence,
                                                   Spool* spool) {
  TakenChunk taken{slot.Take(), {}};
  if (!taken.message) {
    if (!spool) return Status::Internal("a chunk dropped before it was spooled");
    ASSIGN_OR_RETURN(taken.message, spool->Read(sequence));
    ASSIGN_OR_RETURN(taken.view, codec::ParseChunk(ChunkOf(*taken.message)));
    return taken;
  }
  // The node's own buffer, whose checksums it verified on arrival (a slot holds
  // nothing else): hashing its payload again would only cost a pass over it.
  ASSIGN_OR_RETURN(taken.view, codec::ParseVerifiedChunk(ChunkOf(*taken.message)));
  return taken;
}

// A worker, both modes: what the applier made of one data chunk (spooled durably
// first, so the node can always roll back what it applied from the records
// themselves, and redo it after a machine crash), journaled once it is written or
// checked. A restart redoes what the journal lists from the spool, by hash.
NodeStore::ApplyResult NodeStore::ApplyData(apply::DeltaApplier& applier, uint32_t sequence,
                                            const ChunkSlot& slot, Spool* spool) {
  ApplyResult result;
  // Taken before the sync, which may be long: the buffer is still held then, so the
  // apply reads memory rather than the chunk back from the spool (released once
  // forwarded and spooled, the slot would be empty after the sync). Bounded: one
  // chunk per worker.
  auto taken = TakeChunk(slot, sequence, spool);
  if (!taken.ok()) {
    result.status = taken.status();
    return result;
  }
  if (spool) result.status = spool->Sync(sequence);
  if (!result.status.ok()) return result;
  // Written (on arrival) or held checked (staged); false: nothing to journal.
  const bool taken_in = refit_->staged ? StageChunk(applier, sequence, *taken, result)
                                       : WriteChunk(applier, sequence, *taken, result);
  if (!taken_in) return result;
  {
    MutexLock lock(journal_mu_);
    for (const auto& record : taken->view.records) {
      refit_->changed_tensors.emplace(record.tensor_name);
    }
  }
  CrashPoint(refit_->staged ? "agent.staged" : "agent.apply_flushed");
  bool journaled = false;
  if (result.status.ok()) {
    MutexLock lock(journal_mu_);
    if (!replica_->applied_chunks().contains(sequence)) {
      result.status = replica_->RecordApplied(sequence);
      journaled = result.status.ok();
    }
  }
  CrashPoint("agent.applied");
  // So a HELLO after a reconnect lists it, and the parent does not send it again.
  if (journaled) PostJournal();
  result.chunk_applied = true;
  return result;
}

// On arrival: written into the store now (false: journaled already, nothing to do).
bool NodeStore::WriteChunk(apply::DeltaApplier& applier, uint32_t sequence, const TakenChunk& chunk,
                           ApplyResult& result) {
  {
    MutexLock lock(journal_mu_);
    if (replica_->applied_chunks().contains(sequence)) return false;
  }
  result.status = applier.ApplyChunk(chunk.view);
  result.refused = !result.status.ok() && applier.WasRefused(sequence);
  return true;
}

// Apply thread: after END (and after each repair): verify the whole delta.
NodeStore::ApplyResult NodeStore::FinishRefit() {
  ApplyResult result;
  result.end = true;
  const codec::DeltaSummary& summary = *refit_->summary;
  if (!summary.target_layout.IsZero() && summary.target_layout != replica_->store().LayoutId()) {
    result.status = Status::Corrupt("the delta's target layout differs from this store's");
    return result;
  }
  apply::DeltaApplier& applier = *refit_->applier;
  const auto torn = applier.torn();
  if (!torn.empty()) {
    for (const auto& key : torn) {
      const auto index = replica_->store().FindTensor(key.tensor);
      const auto& info = replica_->store().tensors()[*index];
      const uint64_t per = codec::PartitionElements(info.dtype, applier.identity().partition_bytes);
      const uint64_t e = ElementSize(info.dtype);
      result.torn.push_back({0, key.tensor, key.element_offset,
                             std::min(per, info.ElementCount() - key.element_offset) * e,
                             applier.TornTargetHash(key)});
    }
    return result;
  }
  const auto t0 = Clock::now();
  // Staged: the records' target hashes make the target; nothing was written.
  auto target = refit_->staged ? applier.FinishStaged(summary) : applier.Finish(summary);
  result.status = target.status();
  result.applied = applier.report().applied;
  if (refit_->staged && target.ok()) {
    MutexLock lock(staged_mu_);
    result.applied = 0;
    for (const auto& [sequence, held] : refit_->held) result.applied += held.records->held.size();
  }
  result.check_seconds = applier.report().check_seconds;
  result.write_seconds = applier.report().write_seconds;
  const std::array<uint8_t, 32> none{};
  if (target.ok() && refit_->manifest_digest != none &&
      Sha256(target->Serialize()) != refit_->manifest_digest) {
    // BEGIN (signed) named the manifest: the partitions hash to the target id, but
    // the table they make is not the one the source published.
    result.status = Status::Corrupt("the verified target's manifest is not the one BEGIN names");
    return result;
  }
  result.finish_seconds = SecondsSince(t0);
  if (target.ok()) {
    refit_->target = std::move(*target);
    result.status = replica_->RecordPrepared();
    PostJournal();
  }
  return result;
}

void NodeStore::Repair(uint64_t id, apply::PartitionKey key,
                       std::shared_ptr<std::vector<std::byte>> bytes,
                       std::function<void(const ApplyResult&)> done) {
  apply_loop_.Post([this, id, key, bytes, done] {
    WaitForChunks();
    if (refit_->id != id || !refit_->applier) return;
    const Status repaired = refit_->applier->Repair(key, *bytes);
    ApplyResult result;
    result.status = repaired;
    if (repaired.ok() && refit_->applier->torn().empty() && refit_->summary) result = FinishRefit();
    result.repaired = repaired.ok();
    Reply([done, result] { done(result); });
  });
}

void NodeStore::Commit(uint64_t id, CommitDone done) {
  apply_loop_.Post([this, id, done] {
    WaitForChunks();
    CrashPoint("agent.commit");
    if (refit_->id == id && refit_->staged && !refit_->at_target && refit_->target) {
      Status paused = PauseEngine();
      if (!paused.ok()) {
        // Nothing was written: the verified delta stays held (and journaled
        // PREPARED) for Commit(id) again.
        Reply([done, paused, version = replica_->version()] { done(paused, version, {}); });
        return;
      }
    }
    // Durable by the spool and the decision: the store's pages are written back
    // after, off the critical path.
    Status status = refit_->at_target ? Status::Ok()
                    : !refit_->target ? Status::Internal("commit without a verified target")
                    : refit_->staged  ? ApplyStaged()
                                      : CommitDelta(*refit_->target);
    CommitTimes times;
    // Kept paused if the commit went ahead of its bytes (a staged delta over a
    // store a crash left not all at the base): resumed once the reconcile mends them.
    times.pause_seconds = refit_->paused_seconds + ResumeEngine();
    CommitEvent event{
        id, replica_->version(), {refit_->changed_tensors.begin(), refit_->changed_tensors.end()}};
    *refit_ = RefitState{};
    PostJournal();
    CrashPoint("agent.committed");
    if (status.ok() && on_commit_) on_commit_(event);
    if (status.ok() && replica_->unflushed()) {
      write_back_.Start(replica_->store(), replica_->unflushed()->target, [this] {
        apply_loop_.Post([this] {
          if (Settle().ok()) PostJournal();
        });
      });
    }
    Reply([done, status, version = event.version, times] { done(status, version, times); });
  });
}

void NodeStore::CommitPrepared(Outcome done) {
  apply_loop_.Post([this, done] {
    WaitForChunks();
    auto commit = [&]() -> Status {
      if (!replica_->prepared() || !replica_->inflight()) {
        return Status::FailedPrecondition("told to commit a delta it never prepared");
      }
      const apply::InflightDelta delta = *replica_->inflight();
      RETURN_IF_ERROR(KeepInflightDelta());
      // A process that died keeps its writes in the page cache: the store is there.
      Status at_target = replica_->CommitFromStore();
      if (at_target.ok() || at_target.code() != StatusCode::kFailedPrecondition) return at_target;
      // Writes were lost with the machine. PREPARED means every chunk was spooled
      // durably and applied: the target is what the spool's records say it is.
      ASSIGN_OR_RETURN(auto spool, Spool::Open(options_.spool_dir, delta.target,
                                               /*remove_others=*/false));
      ASSIGN_OR_RETURN(codec::Manifest target, replica_->HashStoreNow());
      for (uint32_t sequence : spool->sequences()) {
        ASSIGN_OR_RETURN(transport::Message message, spool->Read(sequence));
        ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(ChunkOf(*message)));
        for (const auto& record : chunk.records) {
          const auto index = replica_->store().FindTensor(std::string(record.tensor_name));
          if (!index) continue;
          const uint64_t per = codec::PartitionElements(replica_->store().tensors()[*index].dtype,
                                                        target.partition_bytes);
          if (record.element_offset / per < target.partition_hashes[*index].size())
            target.partition_hashes[*index][record.element_offset / per] = record.target_hash;
        }
      }
      if (target.VersionId() != delta.target) {
        return Status::FailedPrecondition(
            "the store lost writes and its spool does not hold the whole delta to " +
            delta.target.ShortHex());
      }
      // The reconcile will write the weights: the engine stops serving first and stays
      // paused until they are whole (ResumeEngine). Refused, nothing is committed and
      // the delta stays held; the node says FAILED and writes it later. Unpaused, it
      // confirmed a version its engine did not serve (the simulator's seed 5379).
      RETURN_IF_ERROR(PauseEngine());
      log::Warn("the store is not at the prepared target " + delta.target.ShortHex() +
                " (writes lost with the machine, or a staged delta not written yet); committing "
                "it from the spool, then reconciling");
      return replica_->CommitAhead(target);
    };
    Status status = commit();
    PostJournal();
    Reply([done, status, version = replica_->version()] { done(status, version); });
  });
}

void NodeStore::DropRefit() {
  apply_loop_.Post([this] {
    WaitForChunks();
    *refit_ = RefitState{};
    ResumeEngine();
  });
}

// ---- reconcile ---------------------------------------------------------------

void NodeStore::Reconcile(std::function<void(const Status&, std::vector<Fetch>)> done) {
  apply_loop_.Post([this, done] {
    WaitForChunks();
    std::vector<Fetch> differing;
    auto run = [&]() -> Status {
      if (!replica_->needs_reconcile()) return Status::Ok();
      const apply::InflightDelta delta = *replica_->unflushed();
      RETURN_IF_ERROR(PauseEngine());  // resumed once the store is at the version
      apply::ApplyOptions options;
      options.threads = options_.apply_threads;
      options.pool = workers_.get();
      ASSIGN_OR_RETURN(apply::Reconcile begun, replica_->BeginReconcile(options));
      reconcile_ = std::make_unique<ReconcileState>(ReconcileState{std::move(begun), {}});
      apply::DeltaApplier& applier = *reconcile_->reconcile.applier;
      // What the spool holds of the delta is applied again where the store is at
      // its base; the rest (torn, or no spool) is fetched by hash.
      auto spool = Spool::Open(options_.spool_dir, delta.target, /*remove_others=*/false);
      if (spool.ok()) {
        for (uint32_t sequence : (*spool)->sequences()) {
          auto message = (*spool)->Read(sequence);
          if (!message.ok()) continue;
          auto chunk = codec::ParseChunk(ChunkOf(**message));
          if (!chunk.ok() || chunk->kind != codec::ChunkKind::kData) continue;
          Status again = applier.ApplyChunk(*chunk);
          if (!again.ok())
            log::Warn("reconcile: chunk " + std::to_string(sequence) + ": " + again.ToString());
        }
      }
      const codec::Manifest now = applier.current_manifest();
      AddDiffering(replica_->store(), now, reconcile_->reconcile.target, differing);
      if (differing.empty()) {
        RETURN_IF_ERROR(replica_->FinishReconcile(now));
        reconcile_.reset();
        ResumeEngine();
        return Status::Ok();
      }
      for (const Fetch& f : differing) reconcile_->pending.insert({f.tensor, f.element_offset});
      return Status::Ok();
    };
    Status status = run();
    if (!status.ok()) {
      reconcile_.reset();
      ResumeEngine();
    }
    PostJournal();
    Reply([done, status, differing] { done(status, differing); });
  });
}

void NodeStore::RepairReconciled(apply::PartitionKey key,
                                 std::shared_ptr<std::vector<std::byte>> bytes, PartitionHash hash,
                                 std::function<void(const Status&, bool finished)> done) {
  apply_loop_.Post([this, key, bytes, hash, done] {
    WaitForChunks();
    Status status;
    bool finished = false;
    if (!reconcile_) {
      status = Status::FailedPrecondition("no reconcile in progress");
    } else {
      status = reconcile_->reconcile.applier->WriteVerified(key, *bytes, hash);
      if (status.ok()) reconcile_->pending.erase(key);
      if (status.ok() && reconcile_->pending.empty()) {
        status = replica_->FinishReconcile(reconcile_->reconcile.applier->current_manifest());
        finished = status.ok();
        reconcile_.reset();
        ResumeEngine();
        PostJournal();
      }
    }
    Reply([done, status, finished] { done(status, finished); });
  });
}

// ---- rollback ----------------------------------------------------------------

void NodeStore::Revert(
    std::shared_ptr<Spool> spool,
    std::function<void(Result<std::vector<apply::DeltaApplier::NeedsBase>>)> done) {
  apply_loop_.Post([this, spool, done] {
    WaitForChunks();
    CrashPoint("agent.abort");
    auto revert = [&]() -> Result<std::vector<apply::DeltaApplier::NeedsBase>> {
      std::vector<apply::DeltaApplier::NeedsBase> needs;
      if (!replica_->inflight()) return needs;  // nothing applied: nothing to undo
      // Staged and never written: nothing to undo; FinishRollback drops it.
      if (refit_->untouched) return needs;
      RETURN_IF_ERROR(PauseEngine());  // resumed by FinishRollback
      RETURN_IF_ERROR(replica_->BeginRollback());
      // Best effort: the records below finish the job.
      if (refit_->applier) (void)refit_->applier->Rollback();
      if (!spool) return Status::FailedPrecondition("no spool to roll back from");
      for (uint32_t sequence : spool->sequences()) {
        ASSIGN_OR_RETURN(transport::Message message, spool->Read(sequence));
        ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(ChunkOf(*message)));
        if (chunk.kind != codec::ChunkKind::kData) continue;
        if (!refit_->applier) {
          ASSIGN_OR_RETURN(
              refit_->applier,
              replica_->Begin(chunk.identity, apply::ApplyOptions{options_.apply_threads}));
        }
        RETURN_IF_ERROR(refit_->applier->RevertChunk(chunk, needs));
      }
      return needs;
    };
    auto needs = revert();
    Reply([done, needs = std::move(needs)]() mutable { done(std::move(needs)); });
  });
}

void NodeStore::WriteBase(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                          PartitionHash hash, Done done) {
  apply_loop_.Post([this, key, bytes, hash, done] {
    WaitForChunks();
    Status status = refit_->applier ? refit_->applier->WriteVerified(key, *bytes, hash)
                                    : Status::Internal("rollback without an applier");
    Reply([done, status] { done(status); });
  });
}

void NodeStore::FinishRollback(Status prior, Outcome done) {
  apply_loop_.Post([this, prior, done] {
    WaitForChunks();
    Status status = !prior.ok()         ? prior
                    : refit_->untouched ? replica_->DropUnwritten()
                                        : replica_->FinishAbort();
    *refit_ = RefitState{};
    ResumeEngine();
    PostJournal();
    Reply([done, status, version = replica_->version()] { done(status, version); });
  });
}

// ---- reads for children --------------------------------------------------------

void NodeStore::FindPartition(Fetch fetch,
                              std::function<void(std::optional<std::vector<std::byte>>)> done) {
  apply_loop_.Post([this, fetch, done] {
    WaitForChunks();
    const auto index = replica_->store().FindTensor(fetch.tensor);
    std::optional<std::vector<std::byte>> found;
    if (index) {
      const apply::WeightStore& store = replica_->store();
      const uint64_t size = store.tensors()[*index].ByteSize();
      const uint64_t e = ElementSize(store.tensors()[*index].dtype);
      // Checked without overflow: the offset and length come from the network.
      if (fetch.element_offset <= size / e &&
          fetch.byte_length <= size - fetch.element_offset * e) {
        auto part =
            apply::ReadStoreBytes(store, *index, fetch.element_offset * e, fetch.byte_length);
        if (part.ok() && HashPartition(*part) == fetch.hash) found = std::move(*part);
      }
    }
    Reply([done, found = std::move(found)] { done(found); });
  });
}

}  // namespace deltacast::relay

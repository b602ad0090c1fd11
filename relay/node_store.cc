#include "relay/node_store.h"

#include <chrono>

#include "common/crash_point.h"
#include "relay/node_agent.h"
#include "relay/signing.h"

namespace deltacast::relay {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// The applier of the refit in progress and what it has seen (apply thread).
struct NodeStore::RefitState {
  uint64_t id = 0;
  bool at_target = false;  // the replica already holds the target: nothing to apply
  std::unique_ptr<apply::DeltaApplier> applier;
  std::optional<codec::DeltaSummary> summary;
  std::optional<codec::Manifest> target;
  std::set<std::string> changed_tensors;
  std::array<uint8_t, 32> manifest_digest{};  // all zero: not checked
};

NodeStore::NodeStore(std::unique_ptr<apply::Replica> replica, size_t apply_threads, EventLoop& loop,
                     std::function<void(const Journal&)> on_journal,
                     std::function<void(const CommitEvent&)> on_commit)
    : replica_(std::move(replica)),
      apply_threads_(apply_threads),
      loop_(loop),
      on_journal_(std::move(on_journal)),
      on_commit_(std::move(on_commit)),
      refit_(std::make_unique<RefitState>()) {}

NodeStore::~NodeStore() { Stop(); }
void NodeStore::Start() { apply_loop_.Start(); }
void NodeStore::Stop() { apply_loop_.Stop(); }

NodeStore::Journal NodeStore::journal() const {
  return {replica_->version(), replica_->inflight(), replica_->prepared(),
          replica_->applied_chunks()};
}

// Apply thread: the loop sees the journal change before the completion that follows.
void NodeStore::PostJournal() {
  Reply([this, j = journal()] { on_journal_(j); });
}

// ---- the refit ---------------------------------------------------------------

void NodeStore::BeginRefit(uint64_t id, const codec::DeltaIdentity& identity,
                           const std::array<uint8_t, 32>& manifest_digest, Done done) {
  apply_loop_.Post([this, id, identity, manifest_digest, done] {
    *refit_ = RefitState{};
    refit_->id = id;
    refit_->manifest_digest = manifest_digest;
    Status status;
    if (!replica_->inflight() && replica_->version() == identity.target_version) {
      // Already there (a node that committed this version before a restart, or an
      // empty delta): trivially prepared once the END arrives.
      refit_->at_target = true;
    } else {
      auto applier =
          replica_->Begin(identity, apply::ApplyOptions{apply_threads_, /*keep_undo=*/true});
      status = applier.status();
      if (applier.ok()) refit_->applier = std::move(*applier);
    }
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::ApplyChunk(uint64_t id, uint32_t sequence, transport::Message message,
                           std::shared_ptr<Spool> spool,
                           std::function<void(const ApplyResult&)> done) {
  apply_loop_.Post([this, id, sequence, message, spool, done] {
    const auto t0 = Clock::now();
    // A chunk is on disk in the spool before it changes any partition, so the node
    // can always roll back what it applied from the records themselves.
    Status synced = spool ? spool->Sync() : Status::Ok();
    ApplyResult result;
    if (synced.ok()) {
      result = ApplyOne(id, sequence, message);
    } else {
      result.status = synced;
    }
    result.sequence = sequence;
    result.seconds = SecondsSince(t0);
    Reply([done, result] { done(result); });
  });
}

// Apply thread. Data chunks are flushed and journaled before they count; END
// verifies everything (torn partitions are returned for repair).
NodeStore::ApplyResult NodeStore::ApplyOne(uint64_t id, uint32_t sequence,
                                           const transport::Message& message) {
  ApplyResult result;
  if (refit_->id != id) return result;
  if (refit_->at_target) {
    auto header = codec::PeekChunkHeader(ChunkOf(*message));
    result.end = header.ok() && header->kind == codec::ChunkKind::kEnd;
    return result;
  }
  if (!refit_->applier) return result;
  auto chunk = codec::ParseChunk(ChunkOf(*message));
  if (!chunk.ok()) {
    result.status = chunk.status();
    return result;
  }
  if (chunk->kind == codec::ChunkKind::kEnd) {
    refit_->summary = chunk->summary;
    // A refused chunk is fetched again, and this END replayed behind it.
    if (refit_->applier->HasRefusedChunks()) return result;
    return FinishRefit();
  }
  if (replica_->applied_chunks().contains(sequence)) return result;  // journaled before a restart
  result.status = refit_->applier->ApplyChunk(*chunk);
  result.refused = !result.status.ok() && refit_->applier->WasRefused(sequence);
  for (const auto& record : chunk->records) refit_->changed_tensors.emplace(record.tensor_name);
  if (result.status.ok()) result.status = refit_->applier->FlushApplied();
  CrashPoint("agent.apply_flushed");
  if (result.status.ok()) result.status = replica_->RecordApplied(sequence);
  CrashPoint("agent.applied");
  // So a HELLO after a reconnect lists it, and the parent does not send it again.
  if (result.status.ok()) PostJournal();
  result.chunk_applied = true;
  return result;
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
  auto target = applier.Finish(summary);
  result.status = target.status();
  result.applied = applier.report().applied;
  const std::array<uint8_t, 32> none{};
  if (target.ok() && refit_->manifest_digest != none &&
      Sha256(target->Serialize()) != refit_->manifest_digest) {
    // BEGIN (signed) named the manifest: the partitions hash to the target id, but
    // the table they make is not the one the source published.
    result.status = Status::Corrupt("the verified target's manifest is not the one BEGIN names");
    return result;
  }
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
    if (refit_->id != id || !refit_->applier) return;
    const Status repaired = refit_->applier->Repair(key, *bytes);
    ApplyResult result;
    result.status = repaired;
    if (repaired.ok() && refit_->applier->torn().empty() && refit_->summary) result = FinishRefit();
    result.repaired = repaired.ok();
    Reply([done, result] { done(result); });
  });
}

void NodeStore::Commit(uint64_t id, Outcome done) {
  apply_loop_.Post([this, id, done] {
    CrashPoint("agent.commit");
    Status status = refit_->at_target ? Status::Ok()
                    : refit_->target  ? replica_->Commit(*refit_->target)
                                      : Status::Internal("commit without a verified target");
    CommitEvent event{
        id, replica_->version(), {refit_->changed_tensors.begin(), refit_->changed_tensors.end()}};
    *refit_ = RefitState{};
    PostJournal();
    CrashPoint("agent.committed");
    if (status.ok() && on_commit_) on_commit_(event);
    Reply([done, status, version = event.version] { done(status, version); });
  });
}

void NodeStore::CommitPrepared(Outcome done) {
  apply_loop_.Post([this, done] {
    Status status = replica_->prepared()
                        ? replica_->CommitFromStore()
                        : Status::FailedPrecondition("told to commit a delta it never prepared");
    PostJournal();
    Reply([done, status, version = replica_->version()] { done(status, version); });
  });
}

void NodeStore::DropRefit() {
  apply_loop_.Post([this] { *refit_ = RefitState{}; });
}

// ---- rollback ----------------------------------------------------------------

void NodeStore::Revert(
    std::shared_ptr<Spool> spool,
    std::function<void(Result<std::vector<apply::DeltaApplier::NeedsBase>>)> done) {
  apply_loop_.Post([this, spool, done] {
    CrashPoint("agent.abort");
    auto revert = [&]() -> Result<std::vector<apply::DeltaApplier::NeedsBase>> {
      std::vector<apply::DeltaApplier::NeedsBase> needs;
      if (!replica_->inflight()) return needs;  // nothing applied: nothing to undo
      RETURN_IF_ERROR(replica_->BeginRollback());
      // Best effort: the records below finish the job.
      if (refit_->applier) (void)refit_->applier->Rollback();
      if (!spool) return Status::FailedPrecondition("no spool to roll back from");
      for (uint32_t sequence : spool->sequences()) {
        ASSIGN_OR_RETURN(transport::Message message, spool->Read(sequence));
        ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(ChunkOf(*message)));
        if (chunk.kind != codec::ChunkKind::kData) continue;
        if (!refit_->applier) {
          ASSIGN_OR_RETURN(refit_->applier,
                           replica_->Begin(chunk.identity, apply::ApplyOptions{apply_threads_}));
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
    Status status = refit_->applier ? refit_->applier->WriteVerified(key, *bytes, hash)
                                    : Status::Internal("rollback without an applier");
    Reply([done, status] { done(status); });
  });
}

void NodeStore::FinishRollback(Status prior, Outcome done) {
  apply_loop_.Post([this, prior, done] {
    Status status = prior.ok() ? replica_->FinishAbort() : prior;
    *refit_ = RefitState{};
    PostJournal();
    Reply([done, status, version = replica_->version()] { done(status, version); });
  });
}

// ---- catch-up ----------------------------------------------------------------

void NodeStore::BeginLink(const ChainLink& link,
                          std::function<void(const Status&, std::set<uint32_t>)> done) {
  apply_loop_.Post([this, link, done] {
    auto applier = replica_->Begin({link.base, link.target, link.partition_bytes},
                                   apply::ApplyOptions{apply_threads_});
    std::set<uint32_t> journaled;
    if (applier.ok()) {
      catch_up_applier_ = std::move(*applier);
      journaled = replica_->applied_chunks();
    }
    PostJournal();
    Reply([done, status = applier.status(), journaled] { done(status, journaled); });
  });
}

void NodeStore::ApplyLinkChunk(
    uint32_t sequence, std::shared_ptr<std::vector<std::byte>> message,
    std::function<void(const Status&, std::optional<codec::DeltaSummary>)> done) {
  apply_loop_.Post([this, sequence, message, done] {
    std::optional<codec::DeltaSummary> end;
    Status status;
    auto chunk = codec::ParseChunk(ChunkOf(*message));
    if (!chunk.ok() || !catch_up_applier_) {
      status = chunk.ok() ? Status::Internal("no delta of the chain in progress") : chunk.status();
    } else if (chunk->kind == codec::ChunkKind::kEnd) {
      end = chunk->summary;
    } else {
      status = catch_up_applier_->ApplyChunk(*chunk);
      if (status.ok()) status = catch_up_applier_->FlushApplied();
      if (status.ok()) status = replica_->RecordApplied(sequence);
      if (status.ok()) PostJournal();
      CrashPoint("agent.catch_up_chunk");
    }
    Reply([done, status, end] { done(status, end); });
  });
}

void NodeStore::FinishLink(codec::DeltaSummary summary, Done done) {
  apply_loop_.Post([this, summary, done] {
    auto target = catch_up_applier_ ? catch_up_applier_->Finish(summary)
                                    : Result<codec::Manifest>(Status::Internal("no delta"));
    Status status = target.status();
    if (target.ok()) status = replica_->Commit(*target);
    catch_up_applier_.reset();
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::BeginCatchUp(
    codec::Manifest target,
    std::function<void(const Status&, std::vector<apply::CatchUpPartition>)> done) {
  apply_loop_.Post([this, target = std::move(target), done] {
    auto begun = replica_->BeginCatchUp(target, apply::ApplyOptions{apply_threads_});
    std::vector<apply::CatchUpPartition> parts;
    if (begun.ok()) {
      catch_up_applier_ = std::move(begun->applier);
      parts = std::move(begun->partitions);
    }
    PostJournal();
    Reply([done, status = begun.status(), parts] { done(status, parts); });
  });
}

void NodeStore::WriteCatchUp(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                             PartitionHash hash, Done done) {
  apply_loop_.Post([this, key, bytes, hash, done] {
    // Verified against the hash the manifest gives before a byte is written.
    Status written = catch_up_applier_ ? catch_up_applier_->WriteVerified(key, *bytes, hash)
                                       : Status::Internal("no catch-up in progress");
    CrashPoint("agent.catch_up_partition");
    Reply([done, written] { done(written); });
  });
}

void NodeStore::CommitCatchUp(Done done) {
  apply_loop_.Post([this, done] {
    Status status = replica_->CommitFromStore();
    catch_up_applier_.reset();
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::DropCatchUp() {
  apply_loop_.Post([this] { catch_up_applier_.reset(); });
}

// ---- reads for children --------------------------------------------------------

void NodeStore::FindPartition(Fetch fetch,
                              std::function<void(std::optional<std::vector<std::byte>>)> done) {
  apply_loop_.Post([this, fetch, done] {
    const auto index = replica_->store().FindTensor(fetch.tensor);
    std::optional<std::vector<std::byte>> found;
    if (index) {
      const ByteSpan tensor = replica_->store().TensorData(*index);
      const uint64_t e = ElementSize(replica_->store().tensors()[*index].dtype);
      // Checked without overflow: the offset and length come from the network.
      if (fetch.element_offset <= tensor.size() / e &&
          fetch.byte_length <= tensor.size() - fetch.element_offset * e) {
        const ByteSpan part = tensor.subspan(fetch.element_offset * e, fetch.byte_length);
        if (HashPartition(part) == fetch.hash) found.emplace(part.begin(), part.end());
      }
    }
    Reply([done, found = std::move(found)] { done(found); });
  });
}

}  // namespace deltacast::relay

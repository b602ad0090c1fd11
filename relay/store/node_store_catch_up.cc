// NodeStore's catch-up (relay/tree/catch_up.h drives it): a node that missed versions
// reaches the cluster's by a chain of kept deltas (BeginLink .. FinishLink, each
// link's chunks applied like a refit's) or by partitions (BeginCatchUp .. CommitCatchUp,
// each verified against the target manifest before it is written). All on the
// apply thread, like the refit's work (node_store.cc).
#include <optional>
#include <set>

#include "common/crash_point.h"
#include "common/log.h"
#include "relay/store/node_store.h"
#include "relay/store/spool.h"

namespace deltacast::relay {

void NodeStore::BeginLink(const ChainLink& link,
                          std::function<void(const Status&, std::set<uint32_t>)> done) {
  apply_loop_.Post([this, link, done] {
    WaitForChunks();
    Status settled = Settle();
    if (settled.ok()) settled = PauseEngine();  // resumed when the catch-up ends
    auto applier = settled.ok() ? replica_->Begin({link.base, link.target, link.partition_bytes},
                                                  apply::ApplyOptions{options_.apply_threads})
                                : Result<std::unique_ptr<apply::DeltaApplier>>(settled);
    std::set<uint32_t> journaled;
    if (applier.ok()) {
      catch_up_applier_ = std::move(*applier);
      catch_up_untouched_ = false;  // a chain link: not a catch-up by partitions
      journaled = replica_->applied_chunks();
    }
    if (!journaled.empty()) {
      // Resuming the delta in flight: its journaled chunks were staged and never
      // written, or written and maybe lost with the machine. Applied again from the
      // spool, by hash (written where at base, skipped where at the target); one the
      // spool cannot give is fetched again with the rest.
      auto spool = Spool::Open(options_.spool_dir, link.target, /*remove_others=*/false);
      for (auto it = journaled.begin(); it != journaled.end();) {
        auto message =
            spool.ok() ? (*spool)->Read(*it) : Result<transport::Message>(spool.status());
        auto chunk = message.ok() ? codec::ParseChunk(ChunkOf(**message))
                                  : Result<codec::ChunkView>(message.status());
        Status again = chunk.ok() ? catch_up_applier_->ApplyChunk(*chunk) : chunk.status();
        if (again.ok()) {
          ++it;
          continue;
        }
        log::Warn("catch-up: journaled chunk " + std::to_string(*it) +
                  " could not be applied again from the spool (" + again.ToString() +
                  "); fetching it");
        it = journaled.erase(it);
      }
      if (Status flushed = catch_up_applier_->FlushApplied(); !flushed.ok()) {
        log::Warn("catch-up: " + flushed.ToString());
      }
    }
    PostJournal();
    Reply([done, status = applier.status(), journaled] { done(status, journaled); });
  });
}

void NodeStore::ApplyLinkChunk(
    uint32_t sequence, std::shared_ptr<std::vector<std::byte>> message,
    std::function<void(const Status&, std::optional<codec::DeltaSummary>)> done) {
  apply_loop_.Post([this, sequence, message, done] {
    WaitForChunks();
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
    WaitForChunks();
    auto target = catch_up_applier_ ? catch_up_applier_->Finish(summary)
                                    : Result<codec::Manifest>(Status::Internal("no delta"));
    Status status = target.status();
    if (target.ok()) status = SnapshotBeforeCommit(*target);
    if (status.ok()) status = replica_->Commit(*target);
    catch_up_applier_.reset();
    // A link that failed may have written part of its delta: the engine stays paused
    // until a catch-up or refit that succeeds resumes it.
    if (status.ok()) ResumeEngine();
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::BeginCatchUp(
    codec::Manifest target,
    std::function<void(const Status&, std::vector<apply::CatchUpPartition>)> done) {
  apply_loop_.Post([this, target = std::move(target), done] {
    WaitForChunks();
    Status settled = Settle();
    if (settled.ok()) settled = PauseEngine();  // resumed when the catch-up ends
    const bool clean = !replica_->inflight() && !replica_->needs_reconcile();
    auto begun = settled.ok()
                     ? replica_->BeginCatchUp(target, apply::ApplyOptions{options_.apply_threads})
                     : Result<apply::CatchUp>(settled);
    std::vector<apply::CatchUpPartition> parts;
    if (begun.ok()) {
      catch_up_applier_ = std::move(begun->applier);
      catch_up_untouched_ = clean;
      parts = std::move(begun->partitions);
    }
    PostJournal();
    Reply([done, status = begun.status(), parts] { done(status, parts); });
  });
}

void NodeStore::WriteCatchUp(apply::PartitionKey key, std::shared_ptr<std::vector<std::byte>> bytes,
                             PartitionHash hash, Done done) {
  apply_loop_.Post([this, key, bytes, hash, done] {
    WaitForChunks();
    // Verified against the hash the manifest gives before a byte is written.
    catch_up_untouched_ = false;
    Status written = catch_up_applier_ ? catch_up_applier_->WriteVerified(key, *bytes, hash)
                                       : Status::Internal("no catch-up in progress");
    CrashPoint("agent.catch_up_partition");
    Reply([done, written] { done(written); });
  });
}

void NodeStore::CommitCatchUp(Done done) {
  apply_loop_.Post([this, done] {
    WaitForChunks();
    Status status = SnapshotBeforeCatchUpCommit();
    if (status.ok()) status = replica_->CommitFromStore();
    catch_up_applier_.reset();
    ResumeEngine();
    PostJournal();
    Reply([done, status] { done(status); });
  });
}

void NodeStore::DropCatchUp() {
  apply_loop_.Post([this] {
    WaitForChunks();
    const bool untouched = catch_up_applier_ && catch_up_untouched_;
    catch_up_applier_.reset();
    catch_up_untouched_ = false;
    // What it wrote is left in flight: the engine stays paused until a catch-up or
    // refit that succeeds resumes it. One that wrote nothing over the committed
    // version leaves it as it was: left in flight, its record kept the store from
    // taking a chain of kept deltas from that version ever after (a chain resumes
    // only the delta in flight), and with the root of producers, which serves no
    // partitions, the node stayed behind, paused, to the end (the simulator's
    // --stripes --producers seed 31).
    if (!untouched || !replica_->DropUnwritten().ok()) return;
    ResumeEngine();
    PostJournal();
  });
}

}  // namespace deltacast::relay

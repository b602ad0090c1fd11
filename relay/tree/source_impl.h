// Source::Impl (private to relay/tree): the source's state and its parts. source.cc
// runs a refit (Publish) and the public object; source_children.cc handles the
// children: joins, rejoins and their backlog, the outcome of a delta a child holds,
// its messages and what the source serves. The commit record's side is SourceRecords.
//
// Thread safety: see the class comment.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>

#include "codec/chunk.h"
#include "common/event_loop.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/store/delta_history.h"
#include "relay/store/spool.h"
#include "relay/tree/decision_log.h"
#include "relay/tree/downstream.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/replay.h"
#include "relay/tree/source.h"
#include "relay/tree/source_records.h"
#include "relay/tree/stripe_links.h"
#include "relay/tree/subtree.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "transport/buffer_pool.h"

namespace deltacast::relay {

// BEGIN's begun_at_us: the source's clock now, in microseconds (the wall clock; the
// simulated time under the simulator), never 0 and above `last`, the previous one.
uint64_t SourceBeginTime(uint64_t last);

// Chunk buffers the source keeps idle for its next chunks: a window's worth of 4 MiB
// chunks and more, not a model's.
inline constexpr uint64_t kIdleChunkBufferBytes = uint64_t{64} << 20;

// The source's children in one stripe's tree, and in all of them, as link keys
// (stripe_links.h).
std::vector<std::string> SourceLinks(const topology::StripedPlan& plan, uint32_t stripe);
std::vector<std::string> AllSourceLinks(const topology::StripedPlan& plan);

// State shared between the publishing (calling) thread and the loop thread is
// guarded by mu_; links and queues (Downstream) are the loop thread's.
class Source::Impl {
 public:
  using Clock = RuntimeClock;

  Impl(PublishOptions options, std::unique_ptr<transport::Transport> transport,
       topology::StripedPlan plan)
      : options_(std::move(options)),
        striped_(std::move(plan)),
        plan_(striped_.stripes.front().tree),
        transport_(std::move(transport)),
        // Per process by default: Spool::Open clears other deltas' spools in its folder.
        spool_dir_(options_.spool_dir, "source-spool", options_.config.Source()->id),
        loop_([this] { Tick(); }),
        downstream_(loop_, options_.config.Source()->id, AllSourceLinks(striped_), options_.token,
                    Events(), Downstream::LimitsFrom(options_.config.limits)),
        records_(options_.commit_records, options_.config.name, options_.source_timeout,
                 options_.poll_interval,
                 options_.config.coordination ? options_.config.coordination->keep_records
                                              : topology::CoordinationConfig{}.keep_records) {
    {
      // One Subtree per stripe: the root of each stripe's tree (all in this process).
      MutexLock lock(mu_);
      for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
        subtrees_.push_back(std::make_unique<Subtree>(
            SourceLinks(striped_, s),
            Subtree::Rules{options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                           s == 0 ? "" : "stripe " + std::to_string(s) + ": "},
            SubtreeOwner()));
        // A sender's death fails no refit, whatever the policy: its stripe's first
        // level fails over to this source (docs/protocol.md, "Senders").
        if (!striped_.stripes[s].feeder.empty()) {
          subtrees_.back()->HoldsNoWeights(StripeLinkKey(striped_.stripes[s].root, s));
        }
      }
    }
    downstream_.SetStripes(static_cast<uint32_t>(striped_.stripes.size()));
    downstream_.RequireTls(TlsRequiredFor(options_.config, options_.config.Source()->id));
    std::set<std::string> adoptable;
    for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
      for (const auto& node : striped_.stripes[s].tree.nodes) {
        // A stripe rooted at a sender: its root's children fail over to the source.
        if (node.failover_parent == options_.config.Source()->id) {
          adoptable.insert(StripeLinkKey(node.id, s));
        }
      }
    }
    downstream_.AllowAdoption(std::move(adoptable));
    if (!options_.history_dir.empty() && options_.keep_deltas > 0) {
      history_ = std::make_unique<DeltaHistory>(options_.history_dir, options_.keep_deltas);
    }
    // The cluster's version until the first Publish says it: the last commit logged.
    for (const LoggedDecision& d : ReadDecisions(options_.decision_log)) {
      if (!d.commit) continue;
      if (auto v = Digest128::FromHex(d.target)) active_version_ = *v;
    }
    loop_.Start();
  }

  // A source with a commit record store reads it before anything else (Start, and
  // the next Publish while that has not succeeded): the log is brought up to the
  // records, and so are the version and lineage it gives.
  Status SyncRecords() {
    if (!records_.enabled()) return Status::Ok();
    std::vector<LoggedDecision> uncached;
    Status synced = records_.Sync(options_.decision_log, &uncached);
    if (!synced.ok()) {
      return synced.WithContext(
          "the commit record store could not be read, so this source does not know the "
          "cluster's decisions");
    }
    MutexLock lock(mu_);
    synced_ = true;
    {
      MutexLock log_lock(log_mu_);
      uncached_.insert(uncached_.end(), uncached.begin(), uncached.end());
    }
    const Digest128 logged = LastCommitLogged();
    if (!logged.IsZero() && logged != active_version_) {
      active_version_ = logged;
      active_manifest_.reset();
    }
    return Status::Ok();
  }
  ~Impl() { Stop(); }

  Status Listen() {
    const auto* me = options_.config.Source();
    auto bound = downstream_.Listen(*transport_, me->host + ":" + std::to_string(me->port));
    if (!bound.ok()) return bound.status().WithContext("source cannot listen");
    listen_address_ = *bound;
    log::Info(fmt::format("source {} listening on {}", me->id, *bound));
    return Status::Ok();
  }

  Result<PublishReport> PublishStream(const codec::Manifest& base_manifest,
                                      const codec::Manifest& target_manifest,
                                      const DeltaStream& stream, const apply::WeightStore* base,
                                      const apply::WeightStore* target);

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    transport_->Shutdown();
    loop_.Stop();
    downstream_.CloseAll();
    RetireLastRefit();
    spool_dir_.Release();
  }

  // An empty buffer of at least `capacity` bytes for the encoder's next chunk: one a
  // chunk's message gave back (its pages faulted in already) or a fresh one.
  std::vector<std::byte> TakeChunkBuffer(size_t capacity) {
    std::vector<std::byte> buffer = std::move(*chunk_buffers_->Acquire(capacity));
    buffer.clear();
    return buffer;
  }

  const std::string& listen_address() const { return listen_address_; }
  const PublishOptions& options() const { return options_; }
  // The decisions this source knows: its log, then those the log could not take.
  std::vector<LoggedDecision> Decisions() const REQUIRES(mu_) {
    MutexLock log_lock(log_mu_);
    std::vector<LoggedDecision> all = ReadDecisions(options_.decision_log);
    all.insert(all.end(), uncached_.begin(), uncached_.end());
    return all;
  }
  // Caches a decision the record holds in the log; where the log cannot take it (a
  // full disk) it is kept in memory, since the record, not the log, decided it.
  // Decisions reach the log in the order they were made: while one waits in memory,
  // later ones wait behind it (the log's order is the lineage, and its last COMMIT
  // the active version). Only log_mu_ is held across the log's fsync: the tree's
  // messages, which take mu_, go on meanwhile.
  void CacheDecision(const LoggedDecision& d) EXCLUDES(mu_, log_mu_) {
    MutexLock lock(log_mu_);
    uncached_.push_back(d);
    size_t cached = 0;
    for (; cached < uncached_.size(); ++cached) {
      Status written = RecordDecision(options_.decision_log, uncached_[cached]);
      if (written.ok()) continue;
      log::Warn(
          fmt::format("refit {}: decision not cached in the decision log: {} (kept in memory)",
                      uncached_[cached].refit_id, written.ToString()));
      break;
    }
    uncached_.erase(uncached_.begin(), uncached_.begin() + static_cast<std::ptrdiff_t>(cached));
  }
  // Writes a decision to the log (a source without a commit record store: the log is
  // the decision, so a failure fails the commit).
  Status LogDecision(const LoggedDecision& d) EXCLUDES(mu_, log_mu_) {
    MutexLock lock(log_mu_);
    return RecordDecision(options_.decision_log, d);
  }
  Digest128 LastCommitLogged() const REQUIRES(mu_) {
    Digest128 last;
    for (const LoggedDecision& d : Decisions()) {
      if (!d.commit) continue;
      if (auto v = Digest128::FromHex(d.target)) last = *v;
    }
    return last;
  }
  Digest128 version() {
    MutexLock lock(mu_);
    return active_version_;
  }
  void Announce(const codec::Manifest& manifest) {
    MutexLock lock(mu_);
    SetActive(manifest.VersionId(), manifest.Serialize());
  }

  // The encoder's progress during Publish, on the calling thread.
  void Encoded(uint64_t done, uint64_t total) {
    progress_.encoded_bytes = done;
    progress_.bytes_to_encode = total;
    if (options_.on_progress) options_.on_progress(progress_);
  }

 private:
  // One refit: set up by Publish, kept after it (for the children that rejoin)
  // until the next one begins.
  struct Refit {
    Begin begin;
    std::unique_ptr<Spool> spool;
    // Why the spool lacks chunks (it could not be opened, or a chunk could not be
    // written: a full disk): a child that rejoins cannot be replayed the refit.
    Status spool_error;
    bool begun = false;  // its BEGIN is on its way to the children
    std::optional<MessageType> decision;
    transport::Message decision_message;      // as signed and sent
    std::optional<ChainLink> committed_link;  // set once the decision is COMMIT
    bool failed = false;
    std::string failure;
    size_t held = 0;  // chunks handed to the children and not yet released by all
    // Valid only while Publish runs (the caller's stores and manifests).
    const apply::WeightStore* base = nullptr;
    const apply::WeightStore* target = nullptr;
    std::vector<std::pair<Digest128, std::vector<std::byte>>> manifests;
  };

  // Caller holds mu_: the cluster holds `version` now; the children are told (the
  // manifest only to those not at it: ahead of the first BEGIN on a quarter of a
  // link per child at S = 4, it cost 0.2 s in the link-bound fan-out benchmark).
  void SetActive(const Digest128& version, std::vector<std::byte> manifest) REQUIRES(mu_) {
    active_version_ = version;
    active_manifest_ = std::make_shared<const std::vector<std::byte>>(std::move(manifest));
    loop_.Post([this, version, m = active_manifest_] {
      downstream_.BroadcastActiveVersion(version, ByteSpan(*m));
    });
  }
  Status WaitForChildren(MutexLock& lock) REQUIRES(mu_);
  Subtree& SubtreeOf(const std::string& link) REQUIRES(mu_) {
    return *subtrees_[StripeOfLink(link)];
  }
  template <typename F>
  void ForEachSubtree(F f) REQUIRES(mu_) {
    for (auto& t : subtrees_) f(*t);
  }
  // Every node prepared: every stripe's subtree says so, or the nodes' reports,
  // whichever stripe they came up, name every receiver.
  bool AllPrepared() REQUIRES(mu_);
  // Every stripe's reports, one per node.
  std::vector<NodeReport> Reports() REQUIRES(mu_);
  // Before a refit: the store read (SyncRecords) and the last refit's outcome, if it
  // was left unknown, settled; else the refit must not start.
  Status SettleRecords();
  // The decision of the current refit as it stands in the record (`commit`: the
  // source's); kUnknown when the store did not say.
  StandingDecision DecideOnRecord(const PublishReport& report, bool commit);
  Subtree::Owner SubtreeOwner();
  void Fail(const std::string& why) REQUIRES(mu_);
  void Tick();
  void RetireLastRefit();
  Downstream::Events Events();
  void OnJoined(const std::string& child, const Hello& hello);
  void OnMessage(const std::string& child, MessageType type, ByteSpan bytes);
  // `refused`: set when the child cannot be served this refit here and is left out
  // (the caller refuses its link, outside mu_).
  std::optional<std::vector<Downstream::Outgoing>> Backlog(const std::string& child,
                                                           const Hello& hello, std::string* refused)
      REQUIRES(mu_);
  std::optional<transport::Message> Resolution(const std::string& child, const Digest128& target)
      REQUIRES(mu_);
  static uint64_t UnrecordedAbortId(const Digest128& target);
  void ServeFetch(const std::string& child, ByteSpan bytes);
  void ServeManifest(const std::string& child, ByteSpan bytes);
  void ServeChain(const std::string& child, ByteSpan bytes);
  void ServeDeltaChunk(const std::string& child, ByteSpan bytes);

  const PublishOptions options_;
  const topology::StripedPlan striped_;
  // Stripe 0's tree (the only one when not striped); its root is a sender when the
  // source feeds senders (the source's id is the config's, never plan_.source).
  const topology::TreePlan plan_;
  std::unique_ptr<transport::Transport> transport_;
  std::string listen_address_;
  SpoolDir spool_dir_;                     // released at Stop
  std::unique_ptr<DeltaHistory> history_;  // null: no deltas kept (loop thread and Publish)
  bool stopped_ = false;
  uint64_t last_begun_at_us_ = 0;  // Publish's thread
  PublishProgress progress_;       // the calling thread's, during Publish
  // Chunk messages' buffers, back from the children's queues and the spool; reused
  // for the next chunks (a fresh buffer of a few MiB faults in every page). Bounded.
  const std::shared_ptr<transport::BufferPool> chunk_buffers_ =
      std::make_shared<transport::BufferPool>(kIdleChunkBufferBytes);

  Mutex mu_;
  CondVar cv_;
  // Per stripe; guarded by mu_ (held across their callbacks).
  std::vector<std::unique_ptr<Subtree>> subtrees_ GUARDED_BY(mu_);
  std::optional<Refit> refit_ GUARDED_BY(mu_);  // guarded by mu_: the current or last refit
  // The version the cluster holds (zero: not known yet) and its manifest (null:
  // not known), told to each child that joins (ACTIVE_VERSION); guarded by mu_.
  Digest128 active_version_ GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<std::byte>> active_manifest_ GUARDED_BY(mu_);
  Clock::time_point next_heartbeat_ = Clock::now();
  // With a store: whether it was read since the start, and the refit (its ABORT record)
  // whose outcome the store left unknown; the next Publish settles it first.
  bool synced_ GUARDED_BY(mu_) = false;
  // The decision log's writes and the decisions it could not take (a full disk), in
  // the order they were made; taken after mu_ where both are held.
  mutable Mutex log_mu_ ACQUIRED_AFTER(mu_);
  std::vector<LoggedDecision> uncached_ GUARDED_BY(log_mu_);
  std::optional<CommitRecord> unresolved_ GUARDED_BY(mu_);

  EventLoop loop_;
  Downstream downstream_;
  SourceRecords records_;
};

}  // namespace deltacast::relay

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/log.h"
#include "relay/tree/sender_agent.h"
#include "relay/tree/source_impl.h"

namespace deltacast::relay {

uint64_t SourceBeginTime(uint64_t last) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  // A wall clock, not a steady one: a source restarted (or another host's, after a
  // failover) must number its refits after the dead one's.
  const auto now = SimRuntime() ? RuntimeClock::now().time_since_epoch()
                                : std::chrono::system_clock::now().time_since_epoch();
  return std::max<uint64_t>(static_cast<uint64_t>(duration_cast<microseconds>(now).count()),
                            last + 1);
}

std::vector<std::string> SourceLinks(const topology::StripedPlan& plan, uint32_t stripe) {
  const topology::StripeTree& striped = plan.stripes[stripe];
  // A stripe rooted at a sender: the source feeds its root alone (sender_agent.h).
  if (!striped.feeder.empty()) return {StripeLinkKey(striped.root, stripe)};
  const topology::TreePlan& tree = striped.tree;
  std::vector<std::string> links;
  for (const auto& child : tree.Find(tree.source)->children)
    links.push_back(StripeLinkKey(child, stripe));
  return links;
}

std::vector<std::string> AllSourceLinks(const topology::StripedPlan& plan) {
  std::vector<std::string> links;
  for (uint32_t s = 0; s < plan.stripes.size(); ++s) {
    for (auto& link : SourceLinks(plan, s)) links.push_back(std::move(link));
  }
  return links;
}

Result<PublishReport> Source::Impl::PublishStream(const codec::Manifest& base_manifest,
                                                  const codec::Manifest& target_manifest,
                                                  const DeltaStream& stream,
                                                  const apply::WeightStore* base,
                                                  const apply::WeightStore* target) {
  if (stopped_) {
    return Status::FailedPrecondition(
        "the source is stopped: nothing was sent (start a new Source to publish)");
  }
  PublishReport report;
  report.base_version = base_manifest.VersionId();
  report.target_version = target_manifest.VersionId();
  report.refit_id = RuntimeRandomId();
  const auto call = Clock::now();
  // A replay still queued for a slow child reads the last refit's spool, which
  // RetireLastRefit may delete: drop it first, on the loop (the new BEGIN would drop
  // it anyway). Found by the simulator: a use after free in that replay's loader.
  {
    MutexLock lock(mu_);
    auto dropped = std::make_shared<bool>(false);  // the task may outlive this wait
    loop_.Post([this, dropped] {
      downstream_.DropQueued();  // not under mu_: dropped chunks' callbacks take it
      MutexLock done(mu_);
      *dropped = true;
      cv_.notify_all();
    });
    // Bounded: a stopped loop runs nothing (then nothing reads the spool either).
    if (!WaitFor(cv_, lock, options_.config.tree.connect_timeout, [&] { return *dropped; })) {
      log::Warn("the source's loop did not drop the last refit's queued replays");
    }
  }
  RETURN_IF_ERROR(SettleRecords());
  RetireLastRefit();
  // A stream of its own (docs/protocol.md, "Chunk identity"): what an earlier stream
  // of the same delta left here (a restarted root's state dir) is numbered otherwise.
  Spool::RemoveOthers(spool_dir_.path(), report.target_version);
  auto spool = Spool::OpenEmpty(spool_dir_.path(), report.target_version);
  if (!spool.ok()) {
    log::Warn("no spool (" + spool.status().ToString() +
              "); children that rejoin cannot be replayed to");
  }
  Begin begin{report.refit_id, report.base_version, report.target_version,
              target_manifest.partition_bytes};
  begin.manifest_digest = Sha256(target_manifest.Serialize());
  begin.stream_id = RuntimeRandomId();
  begin.begun_at_us = last_begun_at_us_ = SourceBeginTime(last_begun_at_us_);
  if (options_.signing_key) SignBegin(*options_.signing_key, begin);
  {
    MutexLock lock(mu_);
    refit_.emplace(Refit{});
    refit_->begin = begin;
    if (spool.ok()) {
      refit_->spool = std::move(*spool);
    } else {
      refit_->spool_error = spool.status();
    }
    refit_->base = base;
    refit_->target = target;
    refit_->manifests = {{base_manifest.VersionId(), base_manifest.Serialize()},
                         {target_manifest.VersionId(), target_manifest.Serialize()}};
    if (active_version_ != report.base_version || !active_manifest_) {
      // Children that joined before the version was known here learn it now, ahead
      // of BEGIN, and say what differs.
      SetActive(report.base_version, refit_->manifests.front().second);
    }
    ForEachSubtree([&](Subtree& t) { t.BeginRefit(report.refit_id, Clock::now()); });
    Status joined = WaitForChildren(lock);
    if (joined.ok()) {
      // Announced before the BEGIN goes out, so a coordinator can abort it for good
      // if this source is lost; not announced, not sent.
      lock.Unlock();
      joined = records_.Announce(
          {options_.config.name, report.refit_id, report.base_version, report.target_version, true},
          [this, id = report.refit_id](const CommitRecord& record) {
            // Decided without this source (its announcement lapsed): stop waiting.
            MutexLock decided(mu_);
            if (record.commit || !refit_ || refit_->begin.refit_id != id || refit_->decision) {
              return;
            }
            Fail("the commit record says ABORT, written by " + record.decided_by +
                 " (this source's announcement lapsed)");
          });
      lock.Lock();
    }
    if (!joined.ok()) {
      if (refit_->spool) refit_->spool->Discard();
      refit_.reset();
      ForEachSubtree([](Subtree& t) { t.EndRefit(); });
      return joined;
    }
  }
  const auto start = Clock::now();
  size_t planned_children = 0;
  Spool* spooled = nullptr;  // the refit's, which only this thread replaces
  {
    MutexLock lock(mu_);
    refit_->begun = true;
    for (auto& t : subtrees_) planned_children += t->planned().size();
    spooled = refit_->spool.get();
  }
  loop_.Post([this, begin] {
    downstream_.BeginRefit(begin.refit_id, begin.stream_id);
    downstream_.BroadcastBegin(begin);
  });
  const size_t stripes = striped_.stripes.size();
  log::Info(fmt::format("refit {}: {} -> {} to {} children{}", report.refit_id,
                        report.base_version.ShortHex(), report.target_version.ShortHex(),
                        planned_children,
                        stripes > 1 ? fmt::format(" over {} stripes", stripes) : ""));

  progress_ = PublishProgress{};
  PublishProgress& progress = progress_;
  progress.tensor_bytes = target_manifest.TotalBytes();
  // Each stripe's links have their own window of credit: the source holds up to a
  // window per stripe (chunk k travels on stripe k mod S).
  const size_t window = static_cast<size_t>(options_.config.tree.window) * stripes;
  Status encoded = stream(
      [&](std::vector<std::byte> bytes) -> Status {
        auto header = codec::PeekChunkHeader(ChunkOf(bytes));
        if (!header.ok()) return header.status();
        if (options_.signing_key) RETURN_IF_ERROR(SignChunkMessage(*options_.signing_key, bytes));
        // Its buffer comes back to chunk_buffers_ once every child and the spool are done.
        auto message =
            chunk_buffers_->Wrap(std::make_unique<std::vector<std::byte>>(std::move(bytes)));
        if (spooled) {
          if (Status kept = spooled->Append(header->sequence, *message); !kept.ok()) {
            MutexLock lock(mu_);
            if (refit_->spool_error.ok()) {
              log::Warn(
                  fmt::format("refit {}: chunk {} not spooled ({}); children that rejoin "
                              "cannot be replayed this refit",
                              begin.refit_id, header->sequence, kept.ToString()));
              refit_->spool_error = kept;
            }
          }
        }
        {
          // Hold at most `window` chunks: the slowest child's credit paces encoding.
          // Not forever: a chunk no child releases within the commit timeout fails
          // the refit (the simulator's seed 14094 waited here for good once a relay
          // excused at the start rejoined mid-refit, its child adopted by the source).
          MutexLock lock(mu_);
          const bool room =
              WaitFor(cv_, lock, options_.config.tree.commit_timeout,
                      [&]() REQUIRES(mu_) { return refit_->held < window || refit_->failed; });
          if (!room) Fail("no chunk was released by the children within the commit timeout");
          if (refit_->failed) return Status::Aborted(refit_->failure);
          ++refit_->held;
        }
        loop_.Post([this, message, refit_id = begin.refit_id,
                    ref = Downstream::ChunkRef{header->identity.target_version, header->sequence,
                                               header->kind == codec::ChunkKind::kData}] {
          // Released once every child has it, or dropped unsent: maybe only when the
          // next refit begins (Downstream::BeginRefit drops what is still queued),
          // which must not count against that refit's window (the simulator's seed
          // 119: `held` wrapped below zero and the next publish waited its whole
          // commit timeout for room; the root of seeds 14094, 14818 and 14958).
          downstream_.BroadcastChunk(message, ref, [this, refit_id] {
            MutexLock lock(mu_);
            if (!refit_ || refit_->begin.refit_id != refit_id) return;
            --refit_->held;
            cv_.notify_all();
          });
        });
        CrashPoint("source.chunk_sent");
        if (progress.chunks_sent++ == 0) {
          report.first_chunk_seconds = SecondsSince(start);
          report.call_to_first_chunk_seconds = SecondsSince(call);
        }
        progress.bytes_sent += message->size();
        if (options_.on_progress) options_.on_progress(progress);
        return Status::Ok();
      },
      &report.delta);
  report.stream_seconds = SecondsSince(start);

  bool commit = false;
  {
    MutexLock lock(mu_);
    if (!encoded.ok() && !refit_->failed) Fail(encoded.ToString());
    const bool settled = WaitFor(cv_, lock, options_.config.tree.commit_timeout,
                                 [&]() REQUIRES(mu_) { return refit_->failed || AllPrepared(); });
    if (!settled) Fail("not every node was PREPARED within the commit timeout");
    // Under `available` every subtree can be settled with no node that holds weights
    // in it (every child left out: each FAILED, or each a sender that died before its
    // stripe's first level failed over here). Committing that would change no store
    // yet move this source's version: it aborts, and the nodes that come back are
    // replayed the ABORT.
    if (!refit_->failed && Reports().empty())
      Fail("no receiver PREPARED (every node that holds weights was left out of the refit)");
    commit = !refit_->failed;
    report.abort_reason = refit_->failure;
    report.nodes = Reports();
  }
  report.prepare_seconds = SecondsSince(start);
  CrashPoint("source.before_decision");
  if (records_.enabled()) {
    const StandingDecision standing = DecideOnRecord(report, commit);
    if (standing.kind == StandingDecision::Kind::kUnknown) {
      // Nothing is sent: the nodes stay prepared and follow the record once it is
      // known; the next Publish settles it first.
      MutexLock lock(mu_);
      unresolved_ = CommitRecord{options_.config.name,  report.refit_id, report.base_version,
                                 report.target_version, false,           kDecidedBySource};
      ForEachSubtree([](Subtree& t) { t.EndRefit(); });
      refit_->base = refit_->target = nullptr;
      return Status::Unavailable(
          fmt::format("refit {}: {}; no decision was sent (the nodes stay prepared and follow the "
                      "record; the next publish settles it first)",
                      report.refit_id, standing.why));
    }
    const bool was = commit;
    commit = standing.kind == StandingDecision::Kind::kCommit;
    if (!standing.why.empty() && (was || report.abort_reason.empty())) {
      report.abort_reason = standing.why;
    }
  }
  const LoggedDecision logged{report.refit_id, report.base_version.ToHex(),
                              report.target_version.ToHex(), commit};
  if (records_.enabled()) {
    // The record is the decision; the log only caches it (a restart reads the record).
    CacheDecision(logged);
  } else if (Status recorded = LogDecision(logged); !recorded.ok()) {
    // Without a durable decision the source must not commit anything.
    commit = false;
    report.abort_reason = recorded.ToString();
  }
  CrashPoint("source.decided");
  log::Info(fmt::format("refit {}: decision {}{}", report.refit_id, commit ? "COMMIT" : "ABORT",
                        commit ? "" : " (" + report.abort_reason + ")"));
  Decision d{report.refit_id, report.target_version};
  const MessageType decision = commit ? MessageType::kCommit : MessageType::kAbort;
  if (options_.signing_key) SignDecision(*options_.signing_key, decision, d);
  auto decision_message = transport::MakeMessage(EncodeDecision(decision, d));
  {
    MutexLock lock(mu_);
    refit_->decision = decision;
    refit_->decision_message = decision_message;
    if (commit) {
      refit_->committed_link =
          ChainLink{report.base_version, report.target_version, target_manifest.partition_bytes, 0};
    }
    ForEachSubtree([](Subtree& t) { t.Decided(Clock::now()); });
  }
  loop_.Post([this, decision_message, commit] {
    if (!commit) downstream_.DropQueued();
    downstream_.Broadcast(decision_message);
  });
  records_.Withdraw(report.refit_id);
  {
    MutexLock lock(mu_);
    WaitFor(cv_, lock, options_.config.tree.commit_timeout, [&]() REQUIRES(mu_) {
      bool all = true;
      for (auto& t : subtrees_) all = all && t->confirmed();
      return all;
    });
    // Striped, each node once (NodesConfirmed: a stripe's count can hold a node twice).
    report.nodes_decided = NodesConfirmed(subtrees_);
    for (auto& t : subtrees_) {
      for (const PauseReport& p : t->pauses()) {
        for (NodeReport& n : report.nodes) {
          if (n.node_id != p.node_id) continue;
          n.pause_seconds = p.pause_seconds;
          n.hold_seconds = p.hold_seconds;
        }
      }
    }
    ForEachSubtree([](Subtree& t) { t.EndRefit(); });
    if (commit) {
      active_version_ = report.target_version;
      active_manifest_ =
          std::make_shared<const std::vector<std::byte>>(refit_->manifests.back().second);
    }
    // The caller's stores need not outlive this call.
    refit_->base = refit_->target = nullptr;
    refit_->manifests.clear();
  }
  report.committed = commit;
  report.seconds = SecondsSince(start);
  return report;
}

// Caller holds mu_ (through `lock`).
Status Source::Impl::WaitForChildren(MutexLock& lock) {
  WaitFor(cv_, lock, options_.config.tree.connect_timeout, [&]() REQUIRES(mu_) {
    bool all = true;
    for (auto& t : subtrees_) all = all && t->AllPlannedConnected();
    return all;
  });
  for (auto& t : subtrees_) RETURN_IF_ERROR(t->GoOnWithoutAbsent());
  return Status::Ok();
}

// Caller holds mu_.
bool Source::Impl::AllPrepared() {
  bool all = true;
  for (auto& t : subtrees_) all = all && t->prepared();
  if (subtrees_.size() == 1) return all;
  // A stripe whose sender was left out (Subtree::HoldsNoWeights) is prepared with no
  // node in it until its first level, failed over, joins here: under `all` only
  // reports that name every receiver say they all prepared (with every sender dead,
  // every stripe would be prepared at once).
  bool sender_left_out = false;
  for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
    const topology::StripeTree& stripe = striped_.stripes[s];
    sender_left_out = sender_left_out || (!stripe.feeder.empty() &&
                                          subtrees_[s]->Excused(StripeLinkKey(stripe.root, s)));
  }
  const bool exact = options_.config.tree.commit_policy == topology::CommitPolicy::kAll;
  if (all && !(exact && sender_left_out)) return true;
  std::set<std::string> prepared;
  for (auto& t : subtrees_) {
    for (const NodeReport& n : t->reports()) prepared.insert(n.node_id);
  }
  for (size_t i = 1; i < plan_.nodes.size(); ++i) {
    if (!prepared.contains(plan_.nodes[i].id)) return false;
  }
  return true;
}

// Caller holds mu_.
std::vector<NodeReport> Source::Impl::Reports() { return MergedReports(subtrees_); }

StandingDecision Source::Impl::DecideOnRecord(const PublishReport& report, bool commit) {
  const StandingDecision standing =
      records_.Decide({options_.config.name, report.refit_id, report.base_version,
                       report.target_version, commit, kDecidedBySource},
                      options_.config.tree.commit_timeout);
  if (standing.kind == StandingDecision::Kind::kAbort && commit) {
    log::Warn(fmt::format("refit {}: the source would commit, but {}: aborting", report.refit_id,
                          standing.why));
  }
  return standing;
}

Status Source::Impl::SettleRecords() {
  if (!records_.enabled()) return Status::Ok();
  bool synced = false;
  std::optional<CommitRecord> unresolved;
  {
    MutexLock lock(mu_);
    synced = synced_;
    unresolved = unresolved_;
  }
  if (!synced) RETURN_IF_ERROR(SyncRecords().WithContext("nothing was sent"));
  if (!unresolved) return Status::Ok();
  const StandingDecision standing =
      records_.Resolve(*unresolved, std::chrono::milliseconds(0));  // asked once: fail fast
  if (standing.kind == StandingDecision::Kind::kUnknown) {
    return Status::Unavailable(
        fmt::format("the outcome of refit {} is still unknown ({}); nothing was sent",
                    unresolved->refit_id, standing.why));
  }
  const bool commit = standing.kind == StandingDecision::Kind::kCommit;
  log::Info(fmt::format("refit {}: its outcome is known now: {}", unresolved->refit_id,
                        commit ? "COMMIT" : "ABORT"));
  CacheDecision({unresolved->refit_id, unresolved->base_version.ToHex(),
                 unresolved->target_version.ToHex(), commit});
  MutexLock lock(mu_);
  unresolved_.reset();
  if (!refit_ || refit_->begin.refit_id != unresolved->refit_id) return Status::Ok();
  // Told to the tree as well (signed), for the nodes that have not read the record yet.
  const MessageType type = commit ? MessageType::kCommit : MessageType::kAbort;
  Decision d{unresolved->refit_id, unresolved->target_version};
  if (options_.signing_key) SignDecision(*options_.signing_key, type, d);
  refit_->decision = type;
  refit_->decision_message = transport::MakeMessage(EncodeDecision(type, d));
  if (commit) {
    refit_->committed_link = ChainLink{unresolved->base_version, unresolved->target_version,
                                       refit_->begin.partition_bytes, 0};
    active_version_ = unresolved->target_version;
    if (!refit_->manifests.empty()) {
      active_manifest_ =
          std::make_shared<const std::vector<std::byte>>(refit_->manifests.back().second);
    }
  }
  refit_->manifests.clear();
  loop_.Post([this, m = refit_->decision_message] { downstream_.Broadcast(m); });
  return Status::Ok();
}

// The parent half of the commit is the Subtree's; it runs under mu_.
Subtree::Owner Source::Impl::SubtreeOwner() {
  Subtree::Owner owner;
  // Not under mu_: Downstream completes queued chunks, whose callbacks take mu_.
  owner.leave_out = [this](const std::string& child) {
    loop_.Post([this, child] { downstream_.Excuse(child); });
  };
  owner.fail = [this](const Failed& f, const std::string& why) REQUIRES(mu_) {
    if (f.kind == FailureKind::kBadDelta) {
      log::Error(fmt::format("node '{}' refused the delta: {}", f.node_id, log::Escape(f.reason)));
    }
    Fail(why);
  };
  owner.changed = [this] { cv_.notify_all(); };
  return owner;
}

// Caller holds mu_.
void Source::Impl::Fail(const std::string& why) {
  if (refit_->failed) return;
  refit_->failed = true;
  refit_->failure = why;
  cv_.notify_all();
}

// The last refit's spool: a committed delta whose every chunk was spooled joins the
// history (for nodes that catch up by the chain); anything else is deleted.
void Source::Impl::RetireLastRefit() {
  std::unique_ptr<Spool> spool;
  std::optional<ChainLink> link;
  {
    MutexLock lock(mu_);
    if (!refit_) return;
    spool = std::move(refit_->spool);
    link = refit_->committed_link;
    refit_.reset();
  }
  if (!spool) return;
  const std::vector<uint32_t> sequences = spool->sequences();
  const bool whole = !sequences.empty() && sequences.back() + 1 == sequences.size();
  if (!history_ || !link || !whole) {
    spool->Discard();
    return;
  }
  link->chunks = static_cast<uint32_t>(sequences.size());
  Status kept = history_->Add(std::move(spool), *link);
  if (!kept.ok()) log::Warn("delta not kept for catch-up: " + kept.ToString());
}

// Loop thread: heartbeats; a child away longer than the connect timeout fails the
// refit (policy `all`) or is left out of it (`available`); after the decision, an
// absent child is waited for only up to the connect timeout.
void Source::Impl::Tick() {
  downstream_.Tick(Clock::now());
  if (Clock::now() >= next_heartbeat_) {
    next_heartbeat_ = Clock::now() + options_.config.tree.HeartbeatInterval();
    downstream_.Heartbeat();
  }
  MutexLock lock(mu_);
  if (refit_) ForEachSubtree([](Subtree& t) { t.Tick(Clock::now()); });
}

// ---- the public object ------------------------------------------------------------

Result<std::unique_ptr<Source>> Source::Start(PublishOptions options,
                                              std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::StripedPlan plan, topology::PlanStripes(options.config));
  return Start(std::move(options), std::move(transport), plan);
}

Result<std::unique_ptr<Source>> Source::Start(PublishOptions options,
                                              std::unique_ptr<transport::Transport> transport,
                                              const topology::StripedPlan& plan) {
  if (plan.stripes.empty() || plan.stripes.size() > kMaxStripes) {
    return Status::InvalidArgument(
        fmt::format("a plan of {} stripes (1 to {})", plan.stripes.size(), kMaxStripes));
  }
  const std::string& source = options.config.Source()->id;
  for (const auto& stripe : plan.stripes) {
    // Rooted here, or at a sender node this source feeds (it runs a SenderAgent).
    const bool fed = !stripe.feeder.empty();
    const topology::NodeConfig* root = options.config.FindNode(stripe.root);
    if (stripe.tree.source != stripe.root ||
        (fed ? stripe.feeder != source || !root || root->role != topology::Role::kSender
             : stripe.root != source)) {
      return Status::InvalidArgument(
          "stripe " + std::to_string(stripe.index) + "'s root is '" + stripe.root + "'" +
          (fed ? ", fed by '" + stripe.feeder + "'" : "") + ": a stripe is rooted at the source '" +
          source + "' or at a node with role = \"sender\" that the source feeds");
    }
    RETURN_IF_ERROR(CheckHopSecurity(options.config, TreeWithFeeder(stripe), source));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(transport), plan);
  if (Status synced = impl->SyncRecords(); !synced.ok()) {
    // It listens all the same (children learn nothing from it but its version); the
    // first Publish reads the store again, and fails at once if it still cannot.
    log::Warn(synced.ToString());
  }
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<Source>(new Source(std::move(impl)));
}

Source::Source(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Source::~Source() { Stop(); }
void Source::Stop() {
  if (impl_) impl_->Stop();
}
const std::string& Source::listen_address() const { return impl_->listen_address(); }

Result<PublishReport> Source::Publish(const apply::WeightStore& base,
                                      const codec::Manifest& base_manifest,
                                      const apply::WeightStore& target,
                                      const codec::Manifest& target_manifest) {
  return Publish(base, base_manifest, target, target_manifest, impl_->options().codec);
}

Result<PublishReport> Source::Publish(const apply::WeightStore& base,
                                      const codec::Manifest& base_manifest,
                                      const apply::WeightStore& target,
                                      const codec::Manifest& target_manifest,
                                      const codec::EncodeOptions& codec) {
  codec::DeltaEncoderOptions encoder;
  encoder.codec = codec;
  encoder.chunk_bytes = impl_->options().config.tree.chunk_size;
  encoder.threads = impl_->options().encode_threads;
  // Each chunk is framed as its CHUNK message where it was built (FrameChunk).
  encoder.chunk_headroom = kMessageHeaderBytes;
  encoder.chunk_tailroom = kSignatureBytes;
  // Built in buffers that earlier chunks' messages gave back.
  encoder.chunk_buffer = [this](size_t capacity) { return impl_->TakeChunkBuffer(capacity); };
  // Under the simulator every step runs on its one thread, in the order it sets.
  encoder.on_calling_thread = SimRuntime() != nullptr;
  if (impl_->options().on_progress) {
    encoder.on_progress = [this](uint64_t done, uint64_t total) { impl_->Encoded(done, total); };
  }
  return impl_->PublishStream(
      base_manifest, target_manifest,
      [&](const ChunkMessageSink& sink, codec::DeltaStats* stats) {
        return codec::EncodeDelta(
            base_manifest, target_manifest, apply::RangeReaderOf(base),
            apply::RangeReaderOf(target), target.LayoutId(), encoder,
            [&](std::vector<std::byte>&& chunk) { return sink(FrameChunk(std::move(chunk))); },
            stats);
      },
      &base, &target);
}

Digest128 Source::version() const { return impl_->version(); }
void Source::Announce(const codec::Manifest& manifest) { impl_->Announce(manifest); }

Result<PublishReport> Source::PublishStream(const codec::Manifest& base_manifest,
                                            const codec::Manifest& target_manifest,
                                            const DeltaStream& stream,
                                            const apply::WeightStore* base,
                                            const apply::WeightStore* target) {
  return impl_->PublishStream(base_manifest, target_manifest, stream, base, target);
}

}  // namespace deltacast::relay

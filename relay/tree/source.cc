#include "relay/tree/source.h"

#include <fmt/core.h>
#include <openssl/rand.h>

#include <chrono>
#include <map>
#include <optional>

#include "codec/chunk.h"
#include "common/crash_point.h"
#include "common/elapsed.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/store/delta_history.h"
#include "relay/store/spool.h"
#include "relay/tree/decision_log.h"
#include "relay/tree/downstream.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/replay.h"
#include "relay/tree/stripe_links.h"
#include "relay/tree/subtree.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "transport/transport_set.h"

namespace deltacast::relay {
namespace {

using Clock = RuntimeClock;

uint64_t RandomId() {
  uint64_t id = 0;
  if (Runtime* sim = SimRuntime()) {
    while (id == 0) id = sim->Random64();
    return id;
  }
  while (id == 0) RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id);
  return id;
}

// The source's children in every stripe's tree, as link keys.
std::vector<std::string> SourceLinks(const topology::StripedPlan& plan, uint32_t stripe) {
  const topology::TreePlan& tree = plan.stripes[stripe].tree;
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

}  // namespace

// State shared between the publishing (calling) thread and the loop thread is
// guarded by mu_; links and queues (Downstream) are the loop thread's.
class Source::Impl {
 public:
  Impl(PublishOptions options, std::unique_ptr<transport::Transport> transport,
       topology::StripedPlan plan)
      : options_(std::move(options)),
        striped_(std::move(plan)),
        plan_(striped_.stripes.front().tree),
        transport_(std::move(transport)),
        // Per process by default: Spool::Open clears other deltas' spools in its folder.
        spool_dir_(options_.spool_dir, "source-spool", plan_.source),
        loop_([this] { Tick(); }),
        downstream_(loop_, plan_.source, AllSourceLinks(striped_), options_.token, Events(),
                    Downstream::LimitsFrom(options_.config.limits)) {
    {
      // One Subtree per stripe: the root of each stripe's tree (all in this process).
      MutexLock lock(mu_);
      for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
        subtrees_.push_back(std::make_unique<Subtree>(
            SourceLinks(striped_, s),
            Subtree::Rules{options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                           s == 0 ? "" : "stripe " + std::to_string(s) + ": "},
            SubtreeOwner()));
      }
    }
    downstream_.SetStripes(static_cast<uint32_t>(striped_.stripes.size()));
    downstream_.RequireTls(TlsRequiredFor(options_.config, plan_.source));
    std::set<std::string> adoptable;
    for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
      for (const auto& node : striped_.stripes[s].tree.nodes) {
        if (node.failover_parent == plan_.source) adoptable.insert(StripeLinkKey(node.id, s));
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
  ~Impl() { Stop(); }

  Status Listen() {
    const auto* me = options_.config.Source();
    auto bound = transport_->Listen(
        me->host + ":" + std::to_string(me->port),
        [this](std::unique_ptr<transport::Connection> c) {
          auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
          loop_.Post([this, holder] { downstream_.Accept(std::move(*holder)); });
        });
    if (!bound.ok()) return bound.status().WithContext("source cannot listen");
    listen_address_ = *bound;
    if (auto* set = transport::AsTransportSet(transport_.get())) {
      loop_.Post([this, names = set->Accepting()] { downstream_.SetTransports(names); });
    }
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

  const std::string& listen_address() const { return listen_address_; }
  const PublishOptions& options() const { return options_; }
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

  // Caller holds mu_: the cluster holds `version` now; the children are told.
  void SetActive(const Digest128& version, std::vector<std::byte> manifest) REQUIRES(mu_) {
    active_version_ = version;
    active_manifest_ = std::make_shared<const std::vector<std::byte>>(std::move(manifest));
    loop_.Post([this, m = transport::MakeMessage(EncodeActiveVersion(version, *active_manifest_))] {
      downstream_.Broadcast(m);
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
  Subtree::Owner SubtreeOwner();
  void Fail(const std::string& why) REQUIRES(mu_);
  void Tick();
  void RetireLastRefit();
  Downstream::Events Events();
  void OnJoined(const std::string& child, const Hello& hello);
  void OnMessage(const std::string& child, MessageType type, ByteSpan bytes);
  std::optional<std::vector<Downstream::Outgoing>> Backlog(const std::string& child,
                                                           const Hello& hello) REQUIRES(mu_);
  transport::Message Resolution(const std::string& child, const Digest128& target) const;
  void ServeFetch(const std::string& child, ByteSpan bytes);
  void ServeManifest(const std::string& child, ByteSpan bytes);
  void ServeChain(const std::string& child, ByteSpan bytes);
  void ServeDeltaChunk(const std::string& child, ByteSpan bytes);

  const PublishOptions options_;
  const topology::StripedPlan striped_;
  const topology::TreePlan plan_;  // stripe 0's tree (the only one when not striped)
  std::unique_ptr<transport::Transport> transport_;
  std::string listen_address_;
  SpoolDir spool_dir_;                     // released at Stop
  std::unique_ptr<DeltaHistory> history_;  // null: no deltas kept (loop thread and Publish)
  bool stopped_ = false;
  PublishProgress progress_;  // the calling thread's, during Publish

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

  EventLoop loop_;
  Downstream downstream_;
};

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
  report.refit_id = RandomId();
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
  begin.stream_id = RandomId();
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
        auto message = transport::MakeMessage(std::move(bytes));
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
    commit = !refit_->failed;
    report.abort_reason = refit_->failure;
    report.nodes = Reports();
  }
  report.prepare_seconds = SecondsSince(start);
  CrashPoint("source.before_decision");
  Status recorded = RecordDecision(
      options_.decision_log,
      {report.refit_id, report.base_version.ToHex(), report.target_version.ToHex(), commit});
  if (!recorded.ok()) {
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
  {
    MutexLock lock(mu_);
    WaitFor(cv_, lock, options_.config.tree.commit_timeout, [&]() REQUIRES(mu_) {
      bool all = true;
      for (auto& t : subtrees_) all = all && t->confirmed();
      return all;
    });
    // Each stripe's tree spans every receiver: the count is the best stripe's.
    report.nodes_decided = 0;
    for (auto& t : subtrees_) {
      report.nodes_decided = std::max(report.nodes_decided, t->confirmed_nodes());
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
  if (all || subtrees_.size() == 1) return all;
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
std::vector<NodeReport> Source::Impl::Reports() {
  std::vector<NodeReport> reports;
  std::set<std::string> seen;
  for (auto& t : subtrees_) {
    for (const NodeReport& n : t->reports()) {
      if (seen.insert(n.node_id).second) reports.push_back(n);
    }
  }
  return reports;
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

Downstream::Events Source::Impl::Events() {
  Downstream::Events e;
  e.joined = [this](const std::string& child, const Hello& hello) { OnJoined(child, hello); };
  e.lost = [this](const std::string& child, const Status&) {
    MutexLock lock(mu_);
    SubtreeOf(child).Lost(child, Clock::now());
    cv_.notify_all();
  };
  e.message = [this](const std::string& child, MessageType type, ByteSpan bytes) {
    OnMessage(child, type, bytes);
  };
  e.refused = [this](const std::string& child, const std::string& reason) {
    MutexLock lock(mu_);
    SubtreeOf(child).Refused(child, reason);
  };
  return e;
}

void Source::Impl::OnJoined(const std::string& child, const Hello& hello) {
  const bool adopted = downstream_.IsAdopted(child);
  std::optional<transport::Message> resolution;
  std::optional<std::vector<Downstream::Outgoing>> backlog;
  transport::Message told;
  {
    MutexLock lock(mu_);
    if (adopted) log::Info("adopted " + child + ", whose parent is unreachable");
    SubtreeOf(child).Joined(child, adopted, Clock::now());
    // Told on one link only (stripe 0's): a presumed abort's refit id is drawn
    // anew for each resolution, and a node acts on the first decision it gets.
    const bool other_delta = !hello.inflight_target.IsZero() &&
                             (!refit_ || hello.inflight_target != refit_->begin.target_version);
    if (other_delta && hello.stripe == 0) resolution = Resolution(child, hello.inflight_target);
    if (refit_ && refit_->begun) backlog = Backlog(child, hello);
    const bool same = hello.active_version == active_version_;
    told = transport::MakeMessage(EncodeActiveVersion(
        active_version_, !same && active_manifest_ ? ByteSpan(*active_manifest_) : ByteSpan()));
    cv_.notify_all();
  }
  // Outside mu_: Downstream may complete queued chunks here, and their callbacks
  // take mu_.
  if (hello.stripe == 0) downstream_.SendTo(child, told);  // the node checks stripe 0's only
  if (resolution) downstream_.SendTo(child, *resolution);
  if (backlog) downstream_.Requeue(child, std::move(*backlog));
}

// Caller holds mu_: what a child that (re)joined during or after the refit still
// needs: BEGIN, the spooled chunks it lacks, and the decision if there is one.
std::optional<std::vector<Downstream::Outgoing>> Source::Impl::Backlog(const std::string& child,
                                                                       const Hello& hello) {
  const Begin& begin = refit_->begin;
  std::optional<bool> committed;
  if (refit_->decision) committed = refit_->decision == MessageType::kCommit;
  Subtree& tree = SubtreeOf(child);
  switch (tree.Rejoined(child, hello, begin.target_version, committed)) {
    case Subtree::Rejoin::kDecisionAgain:
      return std::vector<Downstream::Outgoing>{
          Downstream::Outgoing::Control(refit_->decision_message)};
    case Subtree::Rejoin::kNothing:
      return std::nullopt;
    case Subtree::Rejoin::kReplay:
      break;
  }
  if (!refit_->spool_error.ok() && tree.streaming() &&
      !(hello.active_version == begin.target_version && hello.inflight_target.IsZero())) {
    // Its replay would lack chunks: it cannot reach the target from here (found by
    // the simulator: seed 1069, a source whose disk was full). Replayed what there is
    // all the same if it stays: with BEGIN it takes the ABORT and confirms it (seed
    // 758).
    const bool left_out = tree.CannotTakePart(
        child, "child " + child + " rejoined, but the source could not spool the refit's chunks (" +
                   refit_->spool_error.ToString() + ")");
    if (left_out) return std::nullopt;
  }
  Replay replay = ReplayFor(hello, begin, refit_->spool.get(), refit_->decision_message);
  log::Info(fmt::format("child {} rejoined during refit {}: replaying {} chunks it lacks", child,
                        begin.refit_id, replay.chunks));
  return std::move(replay.messages);
}

// A child still holds a delta from an earlier refit in flight. The decision log
// says whether that delta committed; if it has no COMMIT for it, nobody can have
// committed it (decisions are logged before they are sent), so it is aborted. The
// message goes ahead of anything else, so the child resolves it first.
transport::Message Source::Impl::Resolution(const std::string& child,
                                            const Digest128& target) const {
  auto recorded = RecordedDecision(options_.decision_log, target);
  const bool commit = recorded && recorded->commit;
  const uint64_t id = recorded ? recorded->refit_id : RandomId();
  log::Info(fmt::format("child {} holds delta to {} from an earlier refit: {}", child,
                        target.ShortHex(),
                        commit     ? "it was committed"
                        : recorded ? "it was aborted"
                                   : "no decision recorded: abort"));
  const MessageType type = commit ? MessageType::kCommit : MessageType::kAbort;
  Decision d{id, target};
  if (options_.signing_key) SignDecision(*options_.signing_key, type, d);
  return transport::MakeMessage(EncodeDecision(type, d));
}

void Source::Impl::OnMessage(const std::string& child, MessageType type, ByteSpan bytes) {
  switch (type) {
    case MessageType::kFetch:
      return ServeFetch(child, bytes);
    case MessageType::kFetchManifest:
      return ServeManifest(child, bytes);
    case MessageType::kFetchChain:
      return ServeChain(child, bytes);
    case MessageType::kFetchDeltaChunk:
      return ServeDeltaChunk(child, bytes);
    default:
      break;
  }
  MutexLock lock(mu_);
  if (!refit_) return;
  const uint64_t refit_id = refit_->begin.refit_id;
  switch (type) {
    case MessageType::kPrepared: {
      auto p = ParsePrepared(bytes);
      if (p.ok() && p->refit_id == refit_id) SubtreeOf(child).OnPrepared(child, p->nodes);
      break;
    }
    case MessageType::kFailed: {
      auto f = ParseFailed(bytes);
      if (f.ok() && f->refit_id == refit_id) SubtreeOf(child).OnFailed(child, *f);
      break;
    }
    case MessageType::kCommitted:
    case MessageType::kAborted: {
      auto o = ParseOutcome(bytes);
      if (o.ok() && o->refit_id == refit_id)
        SubtreeOf(child).OnConfirmed(child, o->nodes, o->pauses);
      break;
    }
    default:
      break;
  }
}

// ---- what the source serves ---------------------------------------------------

// Loop thread: a FETCH answered from whichever version has the wanted bytes.
void Source::Impl::ServeFetch(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetch(bytes);
  if (!f.ok()) return;
  MutexLock lock(mu_);
  for (const apply::WeightStore* store :
       {refit_ ? refit_->target : nullptr, refit_ ? refit_->base : nullptr}) {
    if (!store) continue;
    const auto index = store->FindTensor(f->tensor);
    if (!index) continue;
    const ByteSpan tensor = store->TensorData(*index);
    const uint64_t e = ElementSize(store->tensors()[*index].dtype);
    // Checked without overflow: the offset and length come from the network.
    if (f->element_offset > tensor.size() / e ||
        f->byte_length > tensor.size() - f->element_offset * e) {
      continue;
    }
    const ByteSpan part = tensor.subspan(f->element_offset * e, f->byte_length);
    if (HashPartition(part) == f->hash) {
      downstream_.SendTo(child, transport::MakeMessage(EncodePartition(f->request_id, true, part)));
      return;
    }
  }
  downstream_.SendTo(child, transport::MakeMessage(EncodePartition(f->request_id, false, {})));
}

// Loop thread: the manifest of the base or the target, for a node catching up from
// a version of this cluster's lineage (a node holding anything else keeps it: it
// fails the refit instead of being overwritten).
void Source::Impl::ServeManifest(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetchManifest(bytes);
  if (!f.ok()) return;
  MutexLock lock(mu_);
  if (refit_ && !refit_->manifests.empty()) {
    const Digest128& base = refit_->manifests.front().first;
    const std::vector<LoggedDecision> decisions = ReadDecisions(options_.decision_log);
    if (InLineage(decisions, base, f->from) && InLineage(decisions, base, f->version)) {
      for (const auto& [version, serialized] : refit_->manifests) {
        if (version != f->version) continue;
        downstream_.SendTo(child,
                           transport::MakeMessage(EncodeManifest(f->request_id, true, serialized)));
        return;
      }
    } else {
      log::Warn(
          fmt::format("{} asks to catch up from {} to {}: not both versions this cluster "
                      "committed",
                      child, f->from.ShortHex(), f->version.ShortHex()));
    }
  }
  downstream_.SendTo(child, transport::MakeMessage(EncodeManifest(f->request_id, false, {})));
}

// Loop thread: which retained deltas lead a catching-up node to `to`.
void Source::Impl::ServeChain(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetchChain(bytes);
  if (!f.ok()) return;
  Chain reply;
  reply.request_id = f->request_id;
  if (history_) reply.links = history_->Chain(f->from, f->to);
  reply.found = !reply.links.empty();
  downstream_.SendTo(child, transport::MakeMessage(EncodeChain(reply)));
}

// Loop thread: one chunk of a retained delta, read from its spool file.
void Source::Impl::ServeDeltaChunk(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetchDeltaChunk(bytes);
  if (!f.ok()) return;
  auto message = history_ ? history_->Read(f->target, f->sequence)
                          : Result<transport::Message>(Status::NotFound("no history"));
  downstream_.SendTo(
      child, transport::MakeMessage(EncodeDeltaChunk(
                 f->request_id, message.ok(), message.ok() ? ByteSpan(**message) : ByteSpan())));
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
  for (const auto& stripe : plan.stripes) {
    if (stripe.root != options.config.Source()->id || stripe.tree.source != stripe.root) {
      return Status::Unsupported("stripe " + std::to_string(stripe.index) + "'s root is '" +
                                 stripe.root + "', not the source '" + options.config.Source()->id +
                                 "': sender nodes that root a stripe are not supported yet");
    }
    RETURN_IF_ERROR(CheckHopSecurity(options.config, stripe.tree, stripe.tree.source));
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(transport), plan);
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
            [&](std::vector<std::byte>&& chunk) { return sink(EncodeChunk(chunk)); }, stats);
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

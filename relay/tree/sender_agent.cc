// SenderAgent (sender_agent.h): one stripe's root on the trainer side. The parts are
// the relay's own: ParentLink (to the source), Downstream (the stripe's children),
// Subtree (their half of the commit), the spool and the replay, UpRequests.
#include "relay/tree/sender_agent.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include <optional>
#include <set>

#include "codec/chunk.h"
#include "common/crash_point.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "relay/store/spool.h"
#include "relay/tree/downstream.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/parent_link.h"
#include "relay/tree/replay.h"
#include "relay/tree/stripe_links.h"
#include "relay/tree/subtree.h"
#include "relay/tree/up_requests.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

int StripeRootedBy(const topology::StripedPlan& plan, const std::string& node_id) {
  for (const auto& stripe : plan.stripes) {
    if (!stripe.feeder.empty() && stripe.root == node_id) return stripe.index;
  }
  return -1;
}

topology::TreePlan TreeWithFeeder(const topology::StripeTree& stripe) {
  topology::TreePlan tree = stripe.tree;
  if (stripe.feeder.empty() || tree.nodes.empty()) return tree;
  topology::PlannedNode feeder;
  feeder.id = stripe.feeder;
  feeder.region = tree.nodes.front().region;
  feeder.children = {stripe.root};
  tree.nodes.front().parent = stripe.feeder;
  tree.nodes.front().transports = stripe.feeder_transports;
  tree.nodes.insert(tree.nodes.begin(), std::move(feeder));
  tree.source = stripe.feeder;
  return tree;
}

namespace {

// The sender as the source's child: its parent the feeder, no failover parent (the
// source is the only one that has its stripe), its children those of its stripe.
topology::PlannedNode SenderNode(const topology::StripeTree& stripe) {
  topology::PlannedNode self = stripe.tree.nodes.front();
  self.parent = stripe.feeder;
  self.failover_parent.reset();
  self.transports = stripe.feeder_transports;
  self.failover_transports.clear();
  return self;
}

std::vector<std::string> ChildLinks(const topology::PlannedNode& self, uint32_t stripe) {
  std::vector<std::string> links;
  for (const auto& child : self.children) links.push_back(StripeLinkKey(child, stripe));
  return links;
}

}  // namespace

class SenderAgent::Impl {
 public:
  using Clock = RuntimeClock;

  Impl(SenderAgentOptions options, std::unique_ptr<transport::Transport> transport,
       const topology::StripedPlan& plan, uint32_t stripe)
      : options_(std::move(options)),
        stripe_(stripe),
        stripes_(static_cast<uint32_t>(plan.stripes.size())),
        self_(SenderNode(plan.stripes[stripe])),
        transport_(std::move(transport)),
        spool_dir_(options_.spool_dir, "sender-spool", options_.node_id),
        loop_([this] { Tick(); }),
        downstream_(loop_, options_.node_id, ChildLinks(self_, stripe), options_.token,
                    DownstreamEvents(), Downstream::LimitsFrom(options_.config.limits)),
        parent_(loop_, options_.config, self_, options_.token, *transport_, ParentEvents()),
        subtree_(
            ChildLinks(self_, stripe),
            Subtree::Rules{options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                           options_.node_id + "#" + std::to_string(stripe) + ": "},
            SubtreeOwner()),
        requests_(parent_, downstream_) {
    std::set<std::string> adoptable;
    for (const auto& node : plan.stripes[stripe].tree.nodes) {
      if (node.failover_parent == options_.node_id) {
        adoptable.insert(StripeLinkKey(node.id, stripe));
      }
    }
    downstream_.AllowAdoption(std::move(adoptable));
    downstream_.SetStripes(stripes_);
    downstream_.RequireTls(TlsRequiredFor(options_.config, options_.node_id));
    loop_.Start();
  }
  ~Impl() { Stop(); }

  Status Listen() {
    const auto* me = options_.config.FindNode(options_.node_id);
    auto bound = downstream_.Listen(*transport_, me->host + ":" + std::to_string(me->port));
    if (!bound.ok()) return bound.status().WithContext("sender cannot listen");
    listen_address_ = *bound;
    log::Info(fmt::format("{}: sender of stripe {} of {}, listening on {}, fed by {}, {} children",
                          options_.node_id, stripe_, stripes_, listen_address_, *self_.parent,
                          self_.children.size()));
    return Status::Ok();
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    transport_->Shutdown();
    loop_.Stop();
    downstream_.CloseAll();
    parent_.Close();
    if (refit_ && refit_->spool) refit_->spool->Discard();
    refit_.reset();
    spool_dir_.Release();
  }

  SenderAgentStats stats() const {
    MutexLock lock(stats_mu_);
    return stats_;
  }
  const std::string& listen_address() const { return listen_address_; }

 private:
  // One refit as the sender sees it.
  struct Refit {
    Begin begin;
    std::shared_ptr<Spool> spool;
    std::set<uint32_t> spooled;  // the chunks taken this refit (spooled unless spool_error)
    Status spool_error;          // a chunk not spooled: children that rejoin cannot be replayed
    bool end_received = false;
    bool first_forwarded = false;  // a data chunk went down
    bool prepared_sent = false;
    std::optional<Failed> failed;         // sent up (a child's, or this sender's)
    std::optional<MessageType> decision;  // the source's, once it came
    transport::Message decision_message;  // as the source signed it
    bool outcome_sent = false;            // COMMITTED / ABORTED went up
    Clock::time_point decided;
  };

  Downstream::Events DownstreamEvents() {
    Downstream::Events e;
    e.joined = [this](const std::string& child, const Hello& hello) {
      OnChildJoined(child, hello);
    };
    e.lost = [this](const std::string& child, const Status&) {
      subtree_.Lost(child, Clock::now());
    };
    e.refused = [this](const std::string& child, const std::string& reason) {
      subtree_.Refused(child, reason);
    };
    e.message = [this](const std::string& child, MessageType type, ByteSpan bytes) {
      OnChildMessage(child, type, bytes);
    };
    return e;
  }

  ParentLink::Events ParentEvents() {
    ParentLink::Events e;
    e.hello = [this] { return MakeHello(); };
    e.joined = [this] {
      requests_.LinkJoined();  // the children's requests that waited for the link
      MutexLock lock(stats_mu_);
      ++stats_.parent_joins;
    };
    e.lost = [this](const Status& why) {
      requests_.LinkLost();
      if (refit_ && !refit_->decision) {
        log::Warn(fmt::format("{}: lost the source during refit {} ({}); will resume on reconnect",
                              options_.node_id, refit_->begin.refit_id, why.ToString()));
      }
    };
    e.refused = [](const Status&) {};
    e.message = [this](MessageType type, const transport::Message& m) { OnParentMessage(type, m); };
    return e;
  }

  Subtree::Owner SubtreeOwner() {
    Subtree::Owner owner;
    owner.leave_out = [this](const std::string& child) { downstream_.Excuse(child); };
    owner.fail = [this](const Failed& failed, const std::string&) { SendFailed(failed); };
    owner.changed = [this] {
      if (!refit_) return;
      if (subtree_.streaming()) return MaybePrepared();
      if (subtree_.deciding()) MaybeOutcome();
    };
    return owner;
  }

  // What the sender holds: no weights (its active version is zero, so a parent never
  // takes it for a node at the target); of its last refit, the chunks it took, so
  // the source replays only those it lacks (and after the decision, BEGIN and the
  // decision alone).
  Hello MakeHello() {
    Hello hello;
    hello.stripe = stripe_;
    hello.stripes = stripes_;
    if (refit_) {
      hello.inflight_base = refit_->begin.base_version;
      hello.inflight_target = refit_->begin.target_version;
      hello.applied_chunks.assign(refit_->spooled.begin(), refit_->spooled.end());
      hello.inflight_stream = refit_->begin.stream_id;
    }
    window_granted_for_ = 0;  // a new link: its window is granted anew
    return hello;
  }

  void GrantWindow() {
    if (!refit_ || window_granted_for_ == refit_->begin.refit_id) return;
    window_granted_for_ = refit_->begin.refit_id;
    parent_.Send(
        EncodeCredit({static_cast<uint32_t>(options_.config.tree.window), refit_->begin.refit_id}));
  }

  bool Trusted(const Status& status, std::string_view what) {
    if (status.ok()) return true;
    log::Error(fmt::format("{}: refusing {} from {}: {}", options_.node_id, what, parent_.current(),
                           status.message()));
    parent_.ProtocolError(status.message());
    return false;
  }

  void OnParentMessage(MessageType type, const transport::Message& message) {
    const ByteSpan bytes(*message);
    switch (type) {
      case MessageType::kBegin:
        return OnBegin(bytes);
      case MessageType::kChunk:
        return OnChunk(message);
      case MessageType::kCommit:
      case MessageType::kAbort:
        return OnDecision(type, message);
      case MessageType::kActiveVersion:
        return OnActiveVersion(message);
      case MessageType::kPartition: {
        auto p = ParsePartition(bytes);
        if (!p.ok()) return parent_.ProtocolError(p.status().message());
        return requests_.OnPartition(*p);
      }
      case MessageType::kManifest:
      case MessageType::kChain:
      case MessageType::kDeltaChunk:
        // Only ever answers to a child's request: the sender asks nothing itself.
        requests_.PassDown(bytes);
        return;
      default:
        return parent_.ProtocolError(std::string(MessageTypeName(type)) +
                                     " is not a message a parent sends");
    }
  }

  // The version the source holds: kept, to tell each child that joins, and passed on.
  void OnActiveVersion(const transport::Message& message) {
    auto v = ParseActiveVersion(*message);
    if (!v.ok()) return parent_.ProtocolError(v.status().message());
    if (v->version != active_version_) active_manifest_.clear();
    active_version_ = v->version;
    if (v->has_manifest) active_manifest_.assign(v->manifest.begin(), v->manifest.end());
    downstream_.Broadcast(message);
  }

  // As a relay tells it: mid-refit nothing settled (zero: the refit checks); else the
  // version the source last said or committed, with its manifest when the child's
  // version differs and the source sent it (after a COMMIT the sender knows the new
  // version's id but not its manifest: the child learns that it differs, not where).
  void TellVersion(const std::string& child, const Hello& hello) {
    if (refit_ && !refit_->decision) {
      downstream_.SendTo(child, transport::MakeMessage(EncodeActiveVersion(Digest128{}, {})));
      return;
    }
    if (active_version_.IsZero()) return;  // told when the source says it
    const bool same = hello.active_version == active_version_;
    downstream_.SendTo(child,
                       transport::MakeMessage(EncodeActiveVersion(
                           active_version_, same ? ByteSpan() : ByteSpan(active_manifest_))));
  }

  void OnBegin(ByteSpan bytes) {
    auto begin = ParseBegin(bytes);
    if (!begin.ok()) return parent_.ProtocolError(begin.status().message());
    if (begin->stripe != stripe_ || begin->stripes != stripes_) {
      return parent_.ProtocolError(
          fmt::format("BEGIN names stripe {} of {}, but this sender roots "
                      "stripe {} of {}",
                      begin->stripe, begin->stripes, stripe_, stripes_));
    }
    if (options_.verify_key && !Trusted(VerifyBegin(*options_.verify_key, *begin), "BEGIN")) return;
    if (refit_ && refit_->begin.refit_id == begin->refit_id) {
      // A replay after this link dropped: what follows is what the spool lacks. The
      // source forgot what this subtree said: say it again.
      GrantWindow();
      if (refit_->failed) parent_.Send(EncodeFailed(*refit_->failed));
      if (!refit_->decision) {
        refit_->prepared_sent = false;
        MaybePrepared();
      }
      return;
    }
    if (refit_ && !refit_->outcome_sent) {
      log::Info(fmt::format("{}: refit {} begins; refit {} ends here without {} confirmations",
                            options_.node_id, begin->refit_id, refit_->begin.refit_id,
                            subtree_.AwaitingConfirmation()));
    }
    if (refit_ && refit_->spool) refit_->spool->Discard();
    refit_.reset();
    subtree_.EndRefit();
    refit_.emplace(Refit{});
    refit_->begin = *begin;
    auto spool = Spool::OpenEmpty(spool_dir_.path(), begin->target_version);
    if (spool.ok()) {
      refit_->spool = std::move(*spool);
      if (Status noted = refit_->spool->RecordStream(begin->stream_id); !noted.ok()) {
        refit_->spool_error = noted;
      }
    } else {
      refit_->spool_error = spool.status();
    }
    if (!refit_->spool_error.ok()) {
      log::Warn(fmt::format("{}: refit {}: no spool ({}); children that rejoin cannot be replayed",
                            options_.node_id, begin->refit_id, refit_->spool_error.ToString()));
    }
    {
      MutexLock lock(stats_mu_);
      ++stats_.refits_begun;
    }
    log::Info(fmt::format("{}: refit {} begins: {} -> {} (stripe {} of {})", options_.node_id,
                          begin->refit_id, begin->base_version.ShortHex(),
                          begin->target_version.ShortHex(), stripe_, stripes_));
    downstream_.BeginRefit(begin->refit_id, begin->stream_id);
    downstream_.BroadcastBegin(*begin);
    subtree_.BeginRefit(begin->refit_id, Clock::now());
    GrantWindow();
  }

  void OnChunk(const transport::Message& message) {
    if (!refit_) return parent_.ProtocolError("CHUNK outside a refit");
    Refit& r = *refit_;
    const uint64_t id = r.begin.refit_id;
    // Checked before it is forwarded or spooled: a damaged chunk is fetched again
    // (dropping the link makes the source replay what the spool lacks).
    Status intact = codec::VerifyChunkChecksums(ChunkOf(*message));
    if (intact.ok() && options_.verify_key) {
      intact = VerifyChunkMessage(*options_.verify_key, *message);
      if (!intact.ok()) {
        CountRefused();
        return (void)Trusted(intact, "a CHUNK");
      }
    }
    auto header = codec::PeekChunkHeader(ChunkOf(*message));
    if (!intact.ok() || !header.ok()) {
      CountRefused();
      log::Warn(fmt::format("{}: a chunk from {} failed its checks ({}); fetching it again",
                            options_.node_id, parent_.current(),
                            (intact.ok() ? header.status() : intact).ToString()));
      return parent_.Drop(Status::Corrupt("damaged chunk"));
    }
    const codec::DeltaIdentity identity{r.begin.base_version, r.begin.target_version,
                                        r.begin.partition_bytes};
    if (header->identity != identity) {
      CountRefused();
      return parent_.ProtocolError(fmt::format(
          "chunk {} names delta {} -> {}, not refit {}'s {} -> {}", header->sequence,
          header->identity.base_version.ShortHex(), header->identity.target_version.ShortHex(), id,
          identity.base_version.ShortHex(), identity.target_version.ShortHex()));
    }
    const bool data = header->kind == codec::ChunkKind::kData;
    if (!StripeCarries(stripe_, stripes_, header->sequence, data)) {
      CountRefused();
      return parent_.ProtocolError(fmt::format("chunk {} travels on stripe {}, not on stripe {}",
                                               header->sequence, header->sequence % stripes_,
                                               stripe_));
    }
    auto release = [this, id] {
      if (refit_ && refit_->begin.refit_id == id) parent_.Send(EncodeCredit({1, id}));
    };
    // A replay of what it took already: its children have it from here.
    if (!r.spooled.insert(header->sequence).second || r.decision) return release();
    {
      MutexLock lock(stats_mu_);
      ++stats_.chunks_received;
      stats_.chunk_bytes_received += message->size() - kMessageHeaderBytes;
    }
    // Forwarded first (the children need nothing of the spool to use it), down this
    // stripe's links; the source's credit comes back once every child was handed it.
    downstream_.BroadcastChunk(message, {header->identity.target_version, header->sequence, data},
                               release, stripe_);
    if (data && !r.first_forwarded) {
      r.first_forwarded = true;
      CrashPoint("sender.first_chunk_forwarded");  // tests/e2e/senders_test.sh
    }
    if (r.spool && r.spool_error.ok()) {
      if (Status kept = r.spool->Append(header->sequence, *message); !kept.ok()) {
        log::Warn(
            fmt::format("{}: refit {}: chunk {} not spooled ({}); children that rejoin "
                        "cannot be replayed this refit",
                        options_.node_id, id, header->sequence, kept.ToString()));
        r.spool_error = kept;
      }
    }
    if (!data) {
      r.end_received = true;
      log::Info(fmt::format("{}: refit {}: END forwarded", options_.node_id, id));
      MaybePrepared();
    }
  }

  void CountRefused() {
    MutexLock lock(stats_mu_);
    ++stats_.chunks_refused;
  }

  void OnDecision(MessageType type, const transport::Message& message) {
    auto d = ParseDecision(*message);
    if (!d.ok()) return parent_.ProtocolError(d.status().message());
    if (options_.verify_key &&
        !Trusted(VerifyDecision(*options_.verify_key, type, *d), MessageTypeName(type))) {
      return;
    }
    const MessageType confirm =
        type == MessageType::kCommit ? MessageType::kCommitted : MessageType::kAborted;
    if (!refit_ || refit_->begin.refit_id != d->refit_id) {
      // A refit this sender never began (it restarted after it was decided): nothing
      // of it here, and no node below it learns it from here.
      parent_.Send(EncodeOutcome(confirm, {d->refit_id, 0, {}}));
      return;
    }
    Refit& r = *refit_;
    if (r.decision) {
      // Again (this link was replayed the refit): confirm again if it was confirmed.
      if (r.outcome_sent) SendOutcome();
      return;
    }
    r.decision = type;
    r.decision_message = message;
    if (type == MessageType::kCommit && active_version_ != d->target_version) {
      active_version_ = d->target_version;
      active_manifest_.clear();
    }
    r.decided = Clock::now();
    log::Info(
        fmt::format("{}: refit {}: {}", options_.node_id, d->refit_id, MessageTypeName(type)));
    subtree_.Decided(Clock::now());
    if (type == MessageType::kAbort) downstream_.DropQueued();
    downstream_.Broadcast(message);
    MaybeOutcome();
  }

  void SendFailed(const Failed& failed) {
    if (!refit_ || refit_->failed) return;
    refit_->failed = failed;
    subtree_.FailedHere();
    parent_.Send(EncodeFailed(failed));
  }

  // PREPARED up once the END went down and the subtree prepared: the aggregate of the
  // stripe's tree, without this sender (it verified nothing).
  void MaybePrepared() {
    Refit& r = *refit_;
    if (r.prepared_sent || r.decision || !r.end_received || !subtree_.prepared()) return;
    r.prepared_sent = true;
    Prepared prepared{r.begin.refit_id, subtree_.reports()};
    parent_.Send(EncodePrepared(prepared));
    log::Info(fmt::format("{}: refit {}: stripe {} prepared with {} nodes", options_.node_id,
                          r.begin.refit_id, stripe_, prepared.nodes.size()));
  }

  void MaybeOutcome() {
    Refit& r = *refit_;
    if (!r.decision || r.outcome_sent || !subtree_.confirmed()) return;
    r.outcome_sent = true;
    {
      MutexLock lock(stats_mu_);
      (*r.decision == MessageType::kCommit ? stats_.refits_committed : stats_.refits_aborted)++;
      if (*r.decision == MessageType::kCommit) stats_.last_committed_refit = r.begin.refit_id;
    }
    SendOutcome();
    log::Info(fmt::format("{}: refit {} {} by {} nodes of stripe {}", options_.node_id,
                          r.begin.refit_id,
                          *r.decision == MessageType::kCommit ? "committed" : "aborted",
                          subtree_.confirmed_nodes(), stripe_));
  }

  void SendOutcome() {
    Refit& r = *refit_;
    const bool committed = *r.decision == MessageType::kCommit;
    Outcome outcome{r.begin.refit_id, subtree_.confirmed_nodes(), subtree_.pauses()};
    parent_.Send(
        EncodeOutcome(committed ? MessageType::kCommitted : MessageType::kAborted, outcome));
  }

  void OnChildJoined(const std::string& child, const Hello& hello) {
    const bool adopted = downstream_.IsAdopted(child);
    subtree_.Joined(child, adopted, Clock::now());
    {
      MutexLock lock(stats_mu_);
      ++stats_.children_joined;
    }
    if (hello.stripe == 0) TellVersion(child, hello);  // a node checks stripe 0's parent's
    if (adopted) log::Info(fmt::format("{}: adopted {}", options_.node_id, child));
    if (!refit_) return;
    Refit& r = *refit_;
    std::optional<bool> decided;
    if (r.decision) decided = *r.decision == MessageType::kCommit;
    switch (subtree_.Rejoined(child, hello, r.begin.target_version, decided)) {
      case Subtree::Rejoin::kDecisionAgain:
        return downstream_.Requeue(child, {Downstream::Outgoing::Control(r.decision_message)});
      case Subtree::Rejoin::kNothing:
        return MaybeOutcome();
      case Subtree::Rejoin::kReplay:
        break;
    }
    if (!r.spool_error.ok() && !r.decision &&
        !(hello.active_version == r.begin.target_version && hello.inflight_target.IsZero())) {
      const bool left_out = subtree_.CannotTakePart(
          child, "child " + child + " rejoined, but sender " + options_.node_id +
                     " could not spool the refit's chunks (" + r.spool_error.ToString() + ")");
      if (left_out) return;
    }
    Replay replay = ReplayFor(hello, r.begin, r.spool, r.decision_message);
    log::Info(fmt::format("{}: child {} rejoined during refit {}: replaying {} chunks it lacks",
                          options_.node_id, child, r.begin.refit_id, replay.chunks));
    downstream_.Requeue(child, std::move(replay.messages));
  }

  void OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes) {
    switch (type) {
      case MessageType::kFetch: {
        auto f = ParseFetch(bytes);
        if (!f.ok()) return;
        CountForwarded();
        return requests_.ForwardFetch(child, *f);
      }
      case MessageType::kFetchManifest:
      case MessageType::kFetchChain:
      case MessageType::kFetchDeltaChunk:
        CountForwarded();
        return requests_.RouteUp(child, type, bytes);
      default:
        break;
    }
    if (!refit_) return;
    const uint64_t id = refit_->begin.refit_id;
    switch (type) {
      case MessageType::kPrepared: {
        auto p = ParsePrepared(bytes);
        if (p.ok() && p->refit_id == id) subtree_.OnPrepared(child, p->nodes);
        return;
      }
      case MessageType::kFailed: {
        auto f = ParseFailed(bytes);
        if (f.ok() && f->refit_id == id) subtree_.OnFailed(child, *f);
        return;
      }
      case MessageType::kCommitted:
      case MessageType::kAborted: {
        auto o = ParseOutcome(bytes);
        if (o.ok() && o->refit_id == id) subtree_.OnConfirmed(child, o->nodes, o->pauses);
        return;
      }
      default:
        return;
    }
  }

  void CountForwarded() {
    MutexLock lock(stats_mu_);
    ++stats_.requests_forwarded;
  }

  void Tick() {
    if (stopped_) return;
    const auto now = Clock::now();
    downstream_.Tick(now);
    parent_.Tick(now, !refit_ || refit_->outcome_sent);
    requests_.Tick(now);
    if (now >= next_heartbeat_) {
      next_heartbeat_ = now + options_.config.tree.HeartbeatInterval();
      downstream_.Heartbeat();
    }
    if (!refit_ || refit_->outcome_sent) return;
    subtree_.Tick(now);
    if (refit_->decision && !refit_->outcome_sent &&
        now - refit_->decided > options_.config.tree.commit_timeout) {
      const std::vector<std::string> awaiting = subtree_.Unconfirmed();
      log::Warn(fmt::format("{}: refit {}: {} children did not confirm the decision in time: {}",
                            options_.node_id, refit_->begin.refit_id, awaiting.size(),
                            fmt::join(awaiting, ", ")));
      refit_->outcome_sent = true;
      SendOutcome();
    }
  }

  SenderAgentOptions options_;
  const uint32_t stripe_;
  const uint32_t stripes_;
  const topology::PlannedNode self_;  // ParentLink keeps a reference
  std::unique_ptr<transport::Transport> transport_;
  std::string listen_address_;
  std::atomic<bool> stopped_{false};
  SpoolDir spool_dir_;

  // Loop-thread state.
  std::optional<Refit> refit_;
  uint64_t window_granted_for_ = 0;  // the refit the current link was granted its window for
  Digest128 active_version_;         // what the source last said it holds
  std::vector<std::byte> active_manifest_;
  Clock::time_point next_heartbeat_ = Clock::now();

  mutable Mutex stats_mu_;
  SenderAgentStats stats_ GUARDED_BY(stats_mu_);

  // The parts; the loop is stopped first.
  EventLoop loop_;
  Downstream downstream_;
  ParentLink parent_;
  Subtree subtree_;
  UpRequests requests_;
};

Result<std::unique_ptr<SenderAgent>> SenderAgent::Start(
    SenderAgentOptions options, std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::StripedPlan plan, topology::PlanStripes(options.config));
  return Start(std::move(options), std::move(transport), plan);
}

Result<std::unique_ptr<SenderAgent>> SenderAgent::Start(
    SenderAgentOptions options, std::unique_ptr<transport::Transport> transport,
    const topology::StripedPlan& plan) {
  const topology::NodeConfig* node = options.config.FindNode(options.node_id);
  if (!node) {
    return Status::InvalidArgument("node '" + options.node_id + "' is not in " +
                                   options.config.source_file.string());
  }
  if (node->role != topology::Role::kSender) {
    return Status::InvalidArgument("node '" + options.node_id +
                                   "' is not a sender (role = \"sender\"); run it as a receiver");
  }
  const int stripe = StripeRootedBy(plan, options.node_id);
  if (stripe < 0) {
    return Status::InvalidArgument(fmt::format(
        "sender '{}' roots no stripe of the plan ({} stripes: senders beyond [tree] stripes, "
        "or with stripes = 1, relay as receivers)",
        options.node_id, plan.stripes.size()));
  }
  const topology::StripeTree& tree = plan.stripes[static_cast<size_t>(stripe)];
  if (tree.feeder != options.config.Source()->id) {
    return Status::InvalidArgument("stripe " + std::to_string(stripe) + " is fed by '" +
                                   tree.feeder + "', not the source");
  }
  RETURN_IF_ERROR(CheckHopSecurity(options.config, TreeWithFeeder(tree), options.node_id));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(transport), plan,
                                     static_cast<uint32_t>(stripe));
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<SenderAgent>(new SenderAgent(std::move(impl)));
}

SenderAgent::SenderAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SenderAgent::~SenderAgent() { Stop(); }
void SenderAgent::Stop() {
  if (impl_) impl_->Stop();
}
SenderAgentStats SenderAgent::stats() const { return impl_->stats(); }
const std::string& SenderAgent::listen_address() const { return impl_->listen_address(); }

}  // namespace deltacast::relay

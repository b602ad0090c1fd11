// NodeAgent: construction, message routing and the tick. The refit itself is in
// node_refit.cc and node_outcome.cc; the parts are their own classes (node_impl.h).
#include "relay/tree/node_agent.h"

#include <fmt/core.h>
#include <fmt/format.h>

#include "common/log.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"
#include "relay/tree/node_impl.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/sender_agent.h"
#include "relay/tree/stripe_links.h"

namespace deltacast::relay {

namespace {

// How long after a failed recovery of the store it is tried again.
constexpr auto kRecoveryRetry = std::chrono::milliseconds(1000);

NodeStore::Options StoreOptions(const NodeAgentOptions& options,
                                const std::filesystem::path& spool_dir) {
  NodeStore::Options o;
  o.apply_threads = options.apply_threads ? options.apply_threads : DefaultThreadCount();
  o.spool_dir = spool_dir;
  o.write_back_delay = options.write_back_delay;
  if (const topology::NodeConfig* self = options.config.FindNode(options.node_id)) {
    o.mode = self->apply_mode;
    o.staged_memory = self->staged_memory;
  }
  o.hooks = options.engine_hooks;
  o.snapshots = options.snapshots;
  return o;
}

// This node's children in every stripe's tree, as link keys.
std::vector<std::string> ChildLinks(const std::vector<topology::PlannedNode>& selves) {
  std::vector<std::string> links;
  for (uint32_t s = 0; s < selves.size(); ++s) {
    for (const auto& child : selves[s].children) links.push_back(StripeLinkKey(child, s));
  }
  return links;
}

std::vector<topology::PlannedNode> SelvesIn(const topology::StripedPlan& plan,
                                            const std::string& id) {
  std::vector<topology::PlannedNode> selves;
  for (const auto& stripe : plan.stripes) selves.push_back(*stripe.tree.Find(id));
  return selves;
}

}  // namespace

std::vector<std::unique_ptr<Subtree>> NodeAgent::Impl::MakeSubtrees() {
  std::vector<std::unique_ptr<Subtree>> trees;
  for (uint32_t s = 0; s < selves_.size(); ++s) {
    std::vector<std::string> links;
    for (const auto& child : selves_[s].children) links.push_back(StripeLinkKey(child, s));
    trees.push_back(std::make_unique<Subtree>(
        links,
        Subtree::Rules{options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                       options_.node_id + (s == 0 ? "" : "#" + std::to_string(s)) + ": "},
        SubtreeOwner()));
  }
  return trees;
}

std::vector<std::unique_ptr<ParentLink>> NodeAgent::Impl::MakeParents() {
  std::vector<std::unique_ptr<ParentLink>> parents;
  for (uint32_t s = 0; s < selves_.size(); ++s) {
    parents.push_back(std::make_unique<ParentLink>(loop_, options_.config, selves_[s],
                                                   options_.token, *transport_, ParentEvents(s)));
  }
  return parents;
}

UpLink NodeAgent::Impl::MakeUpLink() {
  std::vector<ParentLink*> links;
  for (auto& p : parents_) links.push_back(p.get());
  return UpLink(std::move(links), [this](uint32_t stripe, bool again) {
    MutexLock lock(stats_mu_);
    ++stats_.stripe_up_requests[stripe];
    stats_.up_requests_resent += again;
  });
}

NodeAgent::Impl::Impl(NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
                      std::unique_ptr<transport::Transport> transport, topology::StripedPlan plan)
    : options_(std::move(options)),
      striped_(std::move(plan)),
      plan_(striped_.stripes.front().tree),
      self_(*plan_.Find(options_.node_id)),
      selves_(SelvesIn(striped_, options_.node_id)),
      transport_(std::move(transport)),
      // The configured folder, else one per process (a store without a directory
      // does not survive a restart, and neither need its spool; per process, so
      // agents of several processes never share one).
      spool_dir_(options_.spool_dir, "spool", options_.node_id),
      loop_([this] { Tick(); }),
      store_(
          std::move(replica), StoreOptions(options_, spool_dir_.path()), loop_,
          [this](const NodeStore::Journal& j) { OnJournal(j); }, options_.on_commit),
      downstream_(loop_, options_.node_id, ChildLinks(selves_), options_.token, DownstreamEvents(),
                  Downstream::LimitsFrom(options_.config.limits)),
      parents_(MakeParents()),
      parent_(*parents_.front()),
      subtrees_(MakeSubtrees()),
      up_(MakeUpLink()),
      requests_(up_, downstream_),
      catch_up_(options_.node_id, requests_, store_, journal_,
                [this](const CatchUp::Result& r) { OnCatchUpFinished(r); }),
      rollback_(
          options_.node_id, up_, requests_, store_,
          [this](uint64_t id, const Status& s, const Digest128& v) { OnLocalOutcome(id, s, v); }),
      recovery_(options_.node_id, requests_, store_,
                [this](const Status& s, uint64_t fetched) { OnRecovered(s, fetched); }) {
  {
    MutexLock lock(stats_mu_);
    for (auto* counts : {&stats_.stripe_chunks, &stats_.stripe_chunk_bytes_resent,
                         &stats_.stripe_parent_joins, &stats_.stripe_up_requests}) {
      counts->assign(stripes(), 0);
    }
  }
  std::set<std::string> adoptable;
  for (uint32_t s = 0; s < striped_.stripes.size(); ++s) {
    for (const auto& node : striped_.stripes[s].tree.nodes) {
      if (node.failover_parent == options_.node_id) adoptable.insert(StripeLinkKey(node.id, s));
    }
  }
  downstream_.AllowAdoption(std::move(adoptable));
  downstream_.SetStripes(stripes());
  begin_on_.assign(stripes(), 0);
  window_on_.assign(stripes(), 0);
  stale_on_.assign(stripes(), 0);
  chunk_of_.assign(stripes(), 0);
  shed_by_.assign(stripes(), {});
  received_on_link_.assign(stripes(), {});
  downstream_.RequireTls(TlsRequiredFor(options_.config, options_.node_id));
  catch_up_.SetVerifyKey(options_.verify_key.get());
  catch_up_.SetProgress(options_.on_catch_up_progress);
  options_.spool_dir = spool_dir_.path();
  journal_ = store_.journal();
  stats_.version = journal_.version;
  if (options_.commit_records) {
    records_loop_ =
        std::make_unique<EventLoop>(nullptr, std::chrono::milliseconds(1000), "records");
    records_loop_->Start();
  }
  store_.Start();
  loop_.Start();
  loop_.Post([this] { OnJournal(journal_); });
}

void NodeAgent::Impl::OnJournal(const NodeStore::Journal& journal) {
  journal_ = journal;
  {
    MutexLock lock(stats_mu_);
    stats_.store_unflushed = journal_.unflushed.has_value();
    stats_.store_mending = journal_.needs_reconcile;
  }
  // A restart found the last commit's writes possibly lost, or a commit was made
  // ahead of the bytes: mend the store before anything else uses it.
  // (Not while a catch-up runs: it replaces the reconcile, and its start clears the
  // note; one that fails leaves the note, and the recovery starts after it.)
  if (journal_.needs_reconcile && !recovery_.active() && !catch_up_.active()) recovery_.Start();
}

void NodeAgent::Impl::OnRecovered(const Status& status, uint64_t fetched) {
  if (status.ok()) {
    MutexLock lock(stats_mu_);
    ++stats_.stores_recovered;
    stats_.partitions_recovered += fetched;
  } else {
    log::Error(
        fmt::format("{}: the store stays unchecked; refits will fail here until it is "
                    "recovered ({}); trying again in {} ms",
                    options_.node_id, status.ToString(), kRecoveryRetry.count()));
    recovery_retry_at_ = Clock::now() + kRecoveryRetry;
  }
  for (AwaitingRecovery& d : std::exchange(decisions_awaiting_recovery_, {})) {
    loop_.Post([this, stripe = d.stripe, type = d.type, bytes = std::move(d.message)] {
      OnDecision(stripe, type, bytes);
    });
  }
  RunDeferredBegin();
}

NodeAgent::Impl::~Impl() { Stop(); }

Status NodeAgent::Impl::Listen() {
  const auto* me = options_.config.FindNode(options_.node_id);
  auto bound = downstream_.Listen(*transport_, me->host + ":" + std::to_string(me->port));
  if (!bound.ok()) return bound.status();
  listen_address_ = *bound;
  const auto* parent = options_.config.FindNode(*self_.parent);
  std::string striped;
  for (uint32_t s = 1; s < selves_.size(); ++s) {
    striped += fmt::format("; stripe {}: parent {}, {} children", s, *selves_[s].parent,
                           selves_[s].children.size());
  }
  log::Info(fmt::format(
      "{}: listening on {}, parent {} at {}:{}, {} children{}, version {}{}", options_.node_id,
      listen_address_, *self_.parent, parent->host, parent->port, self_.children.size(), striped,
      journal_.version.ShortHex(),
      journal_.inflight
          ? fmt::format(", delta {} -> {} in flight ({} chunks applied{})",
                        journal_.inflight->base.ShortHex(), journal_.inflight->target.ShortHex(),
                        journal_.applied.size(), journal_.prepared ? ", prepared" : "")
          : ""));
  return Status::Ok();
}

void NodeAgent::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  transport_->Shutdown();
  if (records_loop_) records_loop_->Stop();
  loop_.Stop();
  store_.Stop();
  downstream_.CloseAll();
  for (auto& p : parents_) p->Close();
  refit_.reset();  // closes the spool
  spool_dir_.Release();
}

NodeAgentStats NodeAgent::Impl::stats() const {
  MutexLock lock(stats_mu_);
  return stats_;
}

// ---- links ------------------------------------------------------------------

Downstream::Events NodeAgent::Impl::DownstreamEvents() {
  Downstream::Events e;
  e.joined = [this](const std::string& child, const Hello& hello) { OnChildJoined(child, hello); };
  e.lost = [this](const std::string& child, const Status&) { OnChildLost(child); };
  e.refused = [this](const std::string& child, const std::string& reason) {
    subtree(StripeOfLink(child)).Refused(child, reason);
  };
  e.message = [this](const std::string& child, MessageType type, ByteSpan m) {
    OnChildMessage(child, type, m);
  };
  return e;
}

ParentLink::Events NodeAgent::Impl::ParentEvents(uint32_t stripe) {
  ParentLink::Events e;
  e.hello = [this, stripe] { return MakeHello(stripe); };
  e.joined = [this, stripe] { OnParentJoined(stripe); };
  e.lost = [this, stripe](const Status& why) { OnParentLost(stripe, why); };
  e.refused = [this, stripe](const Status& why) {
    join_.Refused(parents_[stripe]->current(), why);
  };
  e.shed = [this, stripe](const std::string& parent, uint64_t refit_id) {
    shed_by_[stripe][parent] = refit_id;
    // Welcomed, then refused (the source does so): no parent served the stripe meanwhile.
    if (parents_[stripe]->joined()) stripe_away_since_[stripe] = stripe_away_before_join_[stripe];
  };
  e.message = [this, stripe](MessageType type, const transport::Message& m) {
    OnParentMessage(stripe, type, m);
  };
  return e;
}

void NodeAgent::Impl::NewRefit() {
  refit_.emplace(Refit{});
  refit_->prepared_on.assign(stripes(), 0);
  refit_->outcome_on.assign(stripes(), 0);
}

void NodeAgent::Impl::SendUpAll(const std::vector<std::byte>& bytes) {
  for (auto& p : parents_) p->Send(bytes);
}

void NodeAgent::Impl::GrantWindow(uint32_t stripe) {
  if (!refit_ || window_on_[stripe] == refit_->id) return;
  window_on_[stripe] = refit_->id;
  parents_[stripe]->Send(
      EncodeCredit({static_cast<uint32_t>(options_.config.tree.window), refit_->id}));
}

// What this node holds, for the HELLO that answers a parent's CHALLENGE. A new
// link starts counting what it carries from here.
Hello NodeAgent::Impl::MakeHello(uint32_t stripe) {
  Hello hello;
  hello.stripe = stripe;
  hello.stripes = stripes();
  hello.active_version = journal_.version;
  if (journal_.inflight) {
    hello.inflight_base = journal_.inflight->base;
    hello.inflight_target = journal_.inflight->target;
    hello.prepared = journal_.prepared;
    hello.applied_chunks.assign(journal_.applied.begin(), journal_.applied.end());
    hello.inflight_stream = Spool::StreamOf(options_.spool_dir, journal_.inflight->target);
  }
  // The journal this thread saw lags the apply thread: chunks of the refit streaming
  // here that it took count as held too. Left out, a parent that this node joined
  // mid-refit sent them again (the simulator's --stripes seed 80881: re-sent bytes
  // over 1 %).
  const bool streaming =
      refit_ && refit_->phase == Phase::kStreaming && refit_->begin.refit_id == refit_->id;
  if (streaming && !refit_->data_taken.empty() &&
      (!journal_.inflight || (journal_.inflight->base == refit_->identity.base_version &&
                              journal_.inflight->target == refit_->identity.target_version))) {
    hello.inflight_base = refit_->identity.base_version;
    hello.inflight_target = refit_->identity.target_version;
    hello.inflight_stream = refit_->begin.stream_id;
    std::set<uint32_t> held(hello.applied_chunks.begin(), hello.applied_chunks.end());
    held.insert(refit_->data_taken.begin(), refit_->data_taken.end());
    hello.applied_chunks.assign(held.begin(), held.end());
  }
  claimed_ = {hello.inflight_target,
              std::set<uint32_t>(hello.applied_chunks.begin(), hello.applied_chunks.end()),
              hello.inflight_stream};
  received_on_link_[stripe].clear();
  // A new link: the parent grants it nothing of what the old one was granted.
  begin_on_[stripe] = window_on_[stripe] = stale_on_[stripe] = 0;
  return hello;
}

bool NodeAgent::Impl::OtherParentJoined(uint32_t except) const {
  for (uint32_t s = 0; s < parents_.size(); ++s) {
    if (s != except && parents_[s]->joined()) return true;
  }
  return false;
}

void NodeAgent::Impl::OnParentJoined(uint32_t stripe) {
  stripe_away_before_join_[stripe] = stripe_away_since_[stripe];
  stripe_away_since_[stripe].reset();
  shed_by_[stripe].erase(parents_[stripe]->current());  // it takes this node again
  {
    MutexLock lock(stats_mu_);
    ++stats_.parent_joins;
    ++stats_.stripe_parent_joins[stripe];
  }
  // The first link up (of any stripe) joins the node to the tree; the join check
  // runs on the first ACTIVE_VERSION that follows, whichever stripe's parent says it.
  if (!OtherParentJoined(stripe)) join_.Joined(parents_[stripe]->current());
  // Requests up the tree that waited for a parent go now.
  if (const size_t sent = requests_.LinkJoined()) {
    log::Info(fmt::format("{}: asking again for {} requests up the tree, of {}", options_.node_id,
                          sent, up_.current()));
  }
}

void NodeAgent::Impl::OnParentLost(uint32_t stripe, const Status& why) {
  if (!stripe_away_since_[stripe]) stripe_away_since_[stripe] = Clock::now();
  // What was asked on this link goes to another joined parent (or waits for one).
  const UpRequests::Moved moved = requests_.LinkLost(stripe);
  if (moved.again > 0) {
    log::Info(fmt::format("{}: asking again for {} requests up the tree, of {} (stripe {})",
                          options_.node_id, moved.again, up_.current(), up_.Chosen()));
  }
  if (moved.waiting > 0) {
    log::Info(fmt::format("{}: {} requests up the tree wait for a parent to join", options_.node_id,
                          moved.waiting));
  }
  if (stripe == version_stripe_) version_stripe_ = UpLink::kNone;  // the next to say it
  if (refit_ && refit_->phase == Phase::kStreaming) {
    // The delta stays in flight and journaled: when the parent (or its replacement)
    // is back, the refit resumes with only what is missing; a PREPARED node learns
    // the outcome then. Nothing is guessed.
    log::Warn(fmt::format(
        "{}: lost parent{} during refit {} ({}); will resume on reconnect", options_.node_id,
        stripes() > 1 ? " of stripe " + std::to_string(stripe) : "", refit_->id, why.ToString()));
  }
}

void NodeAgent::Impl::OnParentMessage(uint32_t stripe, MessageType type,
                                      const transport::Message& message) {
  const ByteSpan bytes(*message);
  switch (type) {
    case MessageType::kBegin: {
      auto begin = ParseBegin(bytes);
      if (!begin.ok()) return parents_[stripe]->ProtocolError(begin.status().message());
      if (begin->stripe != stripe || begin->stripes != stripes()) {
        return parents_[stripe]->ProtocolError(
            fmt::format("BEGIN names stripe {} of {} on the link of stripe {} of {}", begin->stripe,
                        begin->stripes, stripe, stripes()));
      }
      begin_on_[stripe] = begin->refit_id;
      stale_on_[stripe] = 0;
      // Every stripe carries the refit's BEGIN: one refit, counted once.
      if (begin->refit_id != last_parent_begin_) {
        last_parent_begin_ = begin->refit_id;
        ++parent_begins_;
      }
      return OnBegin(bytes);
    }
    case MessageType::kChunk:
      chunk_of_[stripe] = begin_on_[stripe];
      return OnChunk(stripe, message);
    case MessageType::kCommit:
    case MessageType::kAbort:
      return OnDecision(stripe, type, bytes);
    default:
      break;
  }
  // The rest: the join check, and answers to what this node asked up the tree (on
  // whichever stripe's link the request went).
  ParentLink& up = *parents_[stripe];
  switch (type) {
    case MessageType::kActiveVersion:
      // Every stripe's parent says it (after WELCOME; a source again when it learns
      // the version): the check follows the first stripe that did.
      if (version_stripe_ != UpLink::kNone && version_stripe_ != stripe) return;
      version_stripe_ = stripe;
      return OnParentVersion(stripe, bytes);
    case MessageType::kPartition: {
      auto p = ParsePartition(bytes);
      if (!p.ok()) return up.ProtocolError(p.status().message());
      return requests_.OnPartition(*p);
    }
    case MessageType::kManifest:
    case MessageType::kChain:
    case MessageType::kDeltaChunk: {
      // Passed down if routed for a child, else an answer to this node's catch-up.
      if (requests_.PassDown(bytes)) return;
      if (type == MessageType::kChain) {
        auto chain = ParseChain(bytes);
        if (!chain.ok()) return up.ProtocolError(chain.status().message());
        return catch_up_.OnChain(*chain);
      }
      auto reply = type == MessageType::kManifest ? ParseManifest(bytes) : ParseDeltaChunk(bytes);
      if (!reply.ok()) return up.ProtocolError(reply.status().message());
      return type == MessageType::kManifest ? catch_up_.OnManifest(*reply)
                                            : catch_up_.OnDeltaChunk(*reply);
    }
    default:
      return up.ProtocolError(std::string(MessageTypeName(type)) +
                              " is not a message a parent sends");
  }
}

// A lost child is waited for: it rejoins and resumes. Only if it stays away longer
// than the connect timeout does FAILED go up (Tick).
void NodeAgent::Impl::OnChildLost(const std::string& child) {
  child_holds_.erase(child);
  subtree(StripeOfLink(child)).Lost(child, Clock::now());
}

void NodeAgent::Impl::OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes) {
  switch (type) {
    case MessageType::kFetch:
      return OnChildFetch(child, bytes);
    case MessageType::kFetchManifest:
    case MessageType::kFetchChain:
    case MessageType::kFetchDeltaChunk:
      return requests_.RouteUp(child, type, bytes);
    case MessageType::kPrepared:
      return OnChildPrepared(child, bytes);
    case MessageType::kFailed:
      return OnChildFailed(child, bytes);
    case MessageType::kCommitted:
    case MessageType::kAborted:
      return OnChildConfirmed(child, bytes);
    default:
      return;
  }
}

// A child's FETCH: served from our store if the partition there has the wanted
// bytes, else passed up.
void NodeAgent::Impl::OnChildFetch(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetch(bytes);
  if (!f.ok()) return;
  store_.FindPartition(*f, [this, child, fetch = *f](std::optional<std::vector<std::byte>> found) {
    if (found) {
      downstream_.SendTo(child,
                         transport::MakeMessage(EncodePartition(fetch.request_id, true, *found)));
      return;
    }
    requests_.ForwardFetch(child, fetch);
  });
}

void NodeAgent::Impl::OnCatchUpFinished(const CatchUp::Result& finished) {
  CatchUp::Result r = finished;
  if (!r.status.ok() && !journal_.inflight && journal_.version == r.to) {
    // It failed, but the node holds the version it went for: reached meanwhile by
    // other means (the delta in flight committed from the spool once its parent's
    // COMMIT came, which left the catch-up "no delta in flight"). Counted as failed,
    // the refit whose base that is went on without this node, whose FAILED had not
    // reached every stripe's parent, and one waited its commit timeout (the
    // simulator's --stripes seed 24732).
    log::Info(fmt::format("{}: at {} anyway: the catch-up's failure ({}) does not matter",
                          options_.node_id, r.to.ShortHex(), r.status.ToString()));
    r.status = Status::Ok();
  }
  if (r.status.ok()) {
    MutexLock lock(stats_mu_);
    stats_.partitions_caught_up += r.partitions;
    stats_.deltas_caught_up += r.deltas;
    stats_.catch_up_bytes += r.bytes;
  } else {
    catch_up_failed_refit_ = r.refit_id;
    catch_up_failure_ = r.status;
  }
  if (journal_.needs_reconcile && !recovery_.active()) recovery_.Start();
  // The refit it resolved may have been replaced meanwhile (the delta held from before
  // was resolved first): its outcome is moot then, and the BEGIN waiting behind the
  // catch-up runs now. Handed to OnLocalOutcome, which drops another refit's outcome,
  // that BEGIN waited for good (the simulator's --stripes seed 79868).
  if (r.resolving && refit_ && refit_->id == r.refit_id) {
    return OnLocalOutcome(r.refit_id, r.status, journal_.version);
  }
  RunDeferredBegin();
}

// A BEGIN that waits (behind the store's recovery, a resolution or a catch-up). One
// that replaces another refit's BEGIN drops the decisions held for that refit: the
// parent has moved on, and they would run after the new BEGIN as if they were its
// own (the simulator's seed 9368 with --coord: a relay mending its store held a lost
// source's COMMIT of a refit it had committed, then a restarted source's BEGIN; the
// COMMIT ran after that BEGIN, took the refit's place, and the publish waited its
// commit timeout for this node).
void NodeAgent::Impl::DeferBegin(ByteSpan begin) {
  auto incoming = ParseBegin(begin);
  std::erase_if(deferred_decisions_, [&](const std::pair<uint32_t, transport::Message>& held) {
    auto d = ParseDecision(ByteSpan(*held.second));
    return !incoming.ok() || !d.ok() || d->refit_id != incoming->refit_id;
  });
  deferred_begin_.assign(begin.begin(), begin.end());
}

void NodeAgent::Impl::RunDeferredBegin() {
  if (deferred_begin_.empty()) return;
  std::vector<std::byte> begin = std::move(deferred_begin_);
  deferred_begin_.clear();
  std::vector<std::pair<uint32_t, transport::Message>> decisions = std::move(deferred_decisions_);
  deferred_decisions_.clear();
  // Run after what the loop holds already, unless a newer BEGIN from the parent is
  // among it: the parent has moved on, and this one, deferred again, would take the
  // newer one's place (the simulator's seed 8561: a failed catch-up re-ran a BEGIN
  // its parent had aborted after the next refit's BEGIN and ABORT had come, and the
  // parent waited its commit timeout for that refit's confirmation).
  const uint64_t begins = parent_begins_;
  loop_.Post([this, begin, begins] {
    if (parent_begins_ == begins) OnBegin(begin);
  });
  // After it, as they came (a BEGIN deferred again defers them again).
  for (auto& [stripe, d] : decisions) {
    loop_.Post([this, stripe = stripe, d = d, begins] {
      if (parent_begins_ != begins) return;  // of the superseded BEGIN's refit
      auto type = PeekType(ByteSpan(*d));
      if (type.ok()) OnParentMessage(stripe, *type, d);
    });
  }
}

// ---- the tick -----------------------------------------------------------------

void NodeAgent::Impl::Tick() {
  if (stopped_) return;
  const auto now = Clock::now();
  downstream_.Tick(now);
  for (auto& p : parents_) p->Tick(now, !refit_ || refit_->phase == Phase::kDone);
  if (now >= next_heartbeat_) {
    next_heartbeat_ = now + options_.config.tree.HeartbeatInterval();
    downstream_.Heartbeat();
  }
  recovery_.Tick(now);
  requests_.Tick(now);
  if (recovery_retry_at_ && now >= *recovery_retry_at_ &&
      (!refit_ || refit_->phase == Phase::kDone)) {
    recovery_retry_at_.reset();
    if (journal_.needs_reconcile && !recovery_.active() && !catch_up_.active()) recovery_.Start();
  }
  PollHeldRecord(now);
  GiveUpOnAwayStripe(now);
  ShedChildrenIfLeftOut();
  if (!refit_) return;
  PollRecord(now);
  if (!refit_) return;
  ForEachSubtree([&](Subtree& t) {
    if (refit_) t.Tick(now);
  });
  if (refit_ && (refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting)) {
    if (refit_->local_outcome_done && now - refit_->decided > options_.config.tree.commit_timeout) {
      std::vector<std::string> awaiting;
      ForEachSubtree([&](Subtree& t) {
        for (auto& c : t.Unconfirmed()) awaiting.push_back(std::move(c));
      });
      log::Warn(fmt::format("{}: refit {}: {} children did not confirm the decision in time: {}",
                            options_.node_id, refit_->id, awaiting.size(),
                            fmt::join(awaiting, ", ")));
      ReportOutcome();
    }
  }
}

// ---- memory accounting ----------------------------------------------------------

void NodeAgent::Impl::HoldChunk(size_t bytes) {
  held_bytes_ += bytes;
  MutexLock lock(stats_mu_);
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
}

// ---- the public object ------------------------------------------------------------

Result<std::unique_ptr<NodeAgent>> NodeAgent::Start(
    NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
    std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::StripedPlan striped, topology::PlanStripes(options.config));
  return Start(std::move(options), std::move(replica), std::move(transport), striped);
}

Result<std::unique_ptr<NodeAgent>> NodeAgent::Start(NodeAgentOptions options,
                                                    std::unique_ptr<apply::Replica> replica,
                                                    std::unique_ptr<transport::Transport> transport,
                                                    const topology::StripedPlan& striped) {
  if (striped.stripes.empty() || striped.stripes.size() > kMaxStripes) {
    return Status::InvalidArgument(
        fmt::format("a plan of {} stripes (1 to {})", striped.stripes.size(), kMaxStripes));
  }
  if (StripeRootedBy(striped, options.node_id) >= 0) {
    return Status::InvalidArgument("node '" + options.node_id +
                                   "' is a sender that roots a stripe: it holds no weights and "
                                   "runs as a SenderAgent (`deltacast agent` starts one)");
  }
  const topology::TreePlan& plan = striped.stripes.front().tree;
  const topology::PlannedNode* self = plan.Find(options.node_id);
  if (!self)
    return Status::NotFound("node '" + options.node_id + "' is not in " +
                            options.config.source_file.string());
  if (!self->parent)
    return Status::InvalidArgument("node '" + options.node_id +
                                   "' is the source; run `deltacast publish` there");
  for (const auto& stripe : striped.stripes) {
    // Rooted at the source, or at a sender the source feeds (relay/tree/sender_agent.h).
    const std::string& source = options.config.Source()->id;
    const bool fed = !stripe.feeder.empty();
    if ((fed ? stripe.feeder : stripe.root) != source || stripe.tree.source != stripe.root) {
      return Status::InvalidArgument("stripe " + std::to_string(stripe.index) + "'s root '" +
                                     stripe.root + "' is neither the source '" + source +
                                     "' nor a sender it feeds");
    }
    if (!stripe.tree.Find(options.node_id)) {
      return Status::InvalidArgument("node '" + options.node_id + "' is not in stripe " +
                                     std::to_string(stripe.index) + "'s tree");
    }
  }
  for (const auto& stripe : striped.stripes) {
    RETURN_IF_ERROR(CheckHopSecurity(options.config, stripe.tree, options.node_id));
  }
  auto impl =
      std::make_unique<Impl>(std::move(options), std::move(replica), std::move(transport), striped);
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<NodeAgent>(new NodeAgent(std::move(impl)));
}

NodeAgent::NodeAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeAgent::~NodeAgent() { Stop(); }
void NodeAgent::Stop() {
  if (impl_) impl_->Stop();
}
NodeAgentStats NodeAgent::stats() const { return impl_->stats(); }
JoinCheck::State NodeAgent::WaitForJoin(std::chrono::milliseconds timeout) const {
  return impl_->join_check().Wait(timeout);
}
Result<NodeStore::Check> NodeAgent::Verify() { return impl_->Verify(); }
const std::string& NodeAgent::listen_address() const { return impl_->listen_address(); }

}  // namespace deltacast::relay

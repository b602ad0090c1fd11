// NodeAgent: construction, message routing and the tick. The refit itself is in
// node_refit.cc and node_outcome.cc; the parts are their own classes (node_impl.h).
#include "relay/tree/node_agent.h"

#include <fmt/core.h>

#include "common/log.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"
#include "relay/tree/node_impl.h"
#include "relay/tree/node_transports.h"
#include "transport/transport_set.h"

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

}  // namespace

NodeAgent::Impl::Impl(NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
                      std::unique_ptr<transport::Transport> transport, topology::TreePlan plan)
    : options_(std::move(options)),
      plan_(std::move(plan)),
      self_(*plan_.Find(options_.node_id)),
      transport_(std::move(transport)),
      // The configured folder, else one per process (a store without a directory
      // does not survive a restart, and neither need its spool; per process, so
      // agents of several processes never share one).
      spool_dir_(options_.spool_dir, "spool", options_.node_id),
      loop_([this] { Tick(); }),
      store_(
          std::move(replica), StoreOptions(options_, spool_dir_.path()), loop_,
          [this](const NodeStore::Journal& j) { OnJournal(j); }, options_.on_commit),
      downstream_(loop_, options_.node_id, self_.children, options_.token, DownstreamEvents(),
                  Downstream::LimitsFrom(options_.config.limits)),
      parent_(loop_, options_.config, self_, options_.token, *transport_, ParentEvents()),
      subtree_(self_.children,
               {options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                options_.node_id + ": "},
               SubtreeOwner()),
      requests_(parent_, downstream_),
      catch_up_(options_.node_id, parent_, requests_, store_, journal_,
                [this](const CatchUp::Result& r) { OnCatchUpFinished(r); }),
      rollback_(
          options_.node_id, parent_, requests_, store_,
          [this](uint64_t id, const Status& s, const Digest128& v) { OnLocalOutcome(id, s, v); }),
      recovery_(options_.node_id, parent_, requests_, store_,
                [this](const Status& s, uint64_t fetched) { OnRecovered(s, fetched); }) {
  std::set<std::string> adoptable;
  for (const auto& node : plan_.nodes) {
    if (node.failover_parent == options_.node_id) adoptable.insert(node.id);
  }
  downstream_.AllowAdoption(std::move(adoptable));
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
  if (deferred_decision_) {
    auto [type, bytes] = std::move(*deferred_decision_);
    deferred_decision_.reset();
    loop_.Post([this, type = type, bytes = bytes] { OnDecision(type, bytes); });
  }
  RunDeferredBegin();
}

NodeAgent::Impl::~Impl() { Stop(); }

Status NodeAgent::Impl::Listen() {
  const auto* me = options_.config.FindNode(options_.node_id);
  auto bound = transport_->Listen(
      me->host + ":" + std::to_string(me->port), [this](std::unique_ptr<transport::Connection> c) {
        // Tasks must be copyable; the holder carries the move-only link.
        auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
        loop_.Post([this, holder] { downstream_.Accept(std::move(*holder)); });
      });
  if (!bound.ok()) return bound.status();
  listen_address_ = *bound;
  if (auto* set = transport::AsTransportSet(transport_.get())) {
    loop_.Post([this, names = set->Accepting()] { downstream_.SetTransports(names); });
  }
  const auto* parent = options_.config.FindNode(*self_.parent);
  log::Info(fmt::format(
      "{}: listening on {}, parent {} at {}:{}, {} children, version {}{}", options_.node_id,
      listen_address_, *self_.parent, parent->host, parent->port, self_.children.size(),
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
  parent_.Close();
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
    subtree_.Refused(child, reason);
  };
  e.message = [this](const std::string& child, MessageType type, ByteSpan m) {
    OnChildMessage(child, type, m);
  };
  return e;
}

ParentLink::Events NodeAgent::Impl::ParentEvents() {
  ParentLink::Events e;
  e.hello = [this] { return MakeHello(); };
  e.joined = [this] { OnParentJoined(); };
  e.lost = [this](const Status& why) { OnParentLost(why); };
  e.refused = [this](const Status& why) { join_.Refused(parent_.current(), why); };
  e.message = [this](MessageType type, const transport::Message& m) { OnParentMessage(type, m); };
  return e;
}

// What this node holds, for the HELLO that answers a parent's CHALLENGE. A new
// link starts counting what it carries from here.
Hello NodeAgent::Impl::MakeHello() {
  Hello hello;
  hello.active_version = journal_.version;
  if (journal_.inflight) {
    hello.inflight_base = journal_.inflight->base;
    hello.inflight_target = journal_.inflight->target;
    hello.prepared = journal_.prepared;
    hello.applied_chunks.assign(journal_.applied.begin(), journal_.applied.end());
    hello.inflight_stream = Spool::StreamOf(options_.spool_dir, journal_.inflight->target);
  }
  claimed_ = {hello.inflight_target, journal_.inflight ? journal_.applied : std::set<uint32_t>{}};
  received_on_link_.clear();
  return hello;
}

void NodeAgent::Impl::OnParentJoined() {
  {
    MutexLock lock(stats_mu_);
    ++stats_.parent_joins;
  }
  join_.Joined(parent_.current());
  if (catch_up_.active()) loop_.Post([this] { catch_up_.Pump(); });
  loop_.Post([this] { rollback_.AskAgain(); });
  loop_.Post([this] { recovery_.AskAgain(); });
}

void NodeAgent::Impl::OnParentLost(const Status& why) {
  requests_.LinkLost();
  catch_up_.LinkLost();
  if (refit_ && refit_->phase == Phase::kStreaming) {
    // The delta stays in flight and journaled: when the parent (or its replacement)
    // is back, the refit resumes with only what is missing; a PREPARED node learns
    // the outcome then. Nothing is guessed.
    log::Warn(fmt::format("{}: lost parent during refit {} ({}); will resume on reconnect",
                          options_.node_id, refit_->id, why.ToString()));
  }
}

void NodeAgent::Impl::OnParentMessage(MessageType type, const transport::Message& message) {
  const ByteSpan bytes(*message);
  switch (type) {
    case MessageType::kBegin:
      ++parent_begins_;
      return OnBegin(bytes);
    case MessageType::kChunk:
      return OnChunk(message);
    case MessageType::kCommit:
    case MessageType::kAbort:
      return OnDecision(type, bytes);
    case MessageType::kActiveVersion:
      return OnParentVersion(bytes);
    case MessageType::kPartition: {
      auto p = ParsePartition(bytes);
      if (!p.ok()) return parent_.ProtocolError(p.status().message());
      return requests_.OnPartition(*p);
    }
    case MessageType::kManifest:
    case MessageType::kChain:
    case MessageType::kDeltaChunk: {
      // Passed down if routed for a child, else an answer to this node's catch-up.
      if (requests_.PassDown(bytes)) return;
      if (type == MessageType::kChain) {
        auto chain = ParseChain(bytes);
        if (!chain.ok()) return parent_.ProtocolError(chain.status().message());
        return catch_up_.OnChain(*chain);
      }
      auto reply = type == MessageType::kManifest ? ParseManifest(bytes) : ParseDeltaChunk(bytes);
      if (!reply.ok()) return parent_.ProtocolError(reply.status().message());
      return type == MessageType::kManifest ? catch_up_.OnManifest(*reply)
                                            : catch_up_.OnDeltaChunk(*reply);
    }
    default:
      return parent_.ProtocolError(std::string(MessageTypeName(type)) +
                                   " is not a message a parent sends");
  }
}

// A lost child is waited for: it rejoins and resumes. Only if it stays away longer
// than the connect timeout does FAILED go up (Tick).
void NodeAgent::Impl::OnChildLost(const std::string& child) {
  child_holds_.erase(child);
  subtree_.Lost(child, Clock::now());
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

void NodeAgent::Impl::OnCatchUpFinished(const CatchUp::Result& r) {
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
  if (r.resolving) return OnLocalOutcome(r.refit_id, r.status, journal_.version);
  RunDeferredBegin();
}

void NodeAgent::Impl::RunDeferredBegin() {
  if (deferred_begin_.empty()) return;
  std::vector<std::byte> begin = std::move(deferred_begin_);
  deferred_begin_.clear();
  std::vector<transport::Message> decisions = std::move(deferred_decisions_);
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
  for (auto& d : decisions) {
    loop_.Post([this, d, begins] {
      if (parent_begins_ != begins) return;  // of the superseded BEGIN's refit
      auto type = PeekType(ByteSpan(*d));
      if (type.ok()) OnParentMessage(*type, d);
    });
  }
}

// ---- the tick -----------------------------------------------------------------

void NodeAgent::Impl::Tick() {
  if (stopped_) return;
  const auto now = Clock::now();
  downstream_.Tick(now);
  parent_.Tick(now, !refit_ || refit_->phase == Phase::kDone);
  if (now >= next_heartbeat_) {
    next_heartbeat_ = now + options_.config.tree.HeartbeatInterval();
    downstream_.Heartbeat();
  }
  recovery_.Tick(now);
  if (recovery_retry_at_ && now >= *recovery_retry_at_ &&
      (!refit_ || refit_->phase == Phase::kDone)) {
    recovery_retry_at_.reset();
    if (journal_.needs_reconcile && !recovery_.active() && !catch_up_.active()) recovery_.Start();
  }
  if (!refit_) return;
  PollRecord(now);
  if (!refit_) return;
  subtree_.Tick(now);
  if (refit_ && (refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting)) {
    if (refit_->local_outcome_done && now - refit_->decided > options_.config.tree.commit_timeout) {
      log::Warn(fmt::format("{}: refit {}: {} children did not confirm the decision in time",
                            options_.node_id, refit_->id, subtree_.AwaitingConfirmation()));
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
  ASSIGN_OR_RETURN(topology::TreePlan plan, topology::PlanTree(options.config));
  const topology::PlannedNode* self = plan.Find(options.node_id);
  if (!self)
    return Status::NotFound("node '" + options.node_id + "' is not in " +
                            options.config.source_file.string());
  if (!self->parent)
    return Status::InvalidArgument("node '" + options.node_id +
                                   "' is the source; run `deltacast publish` there");
  RETURN_IF_ERROR(CheckHopSecurity(options.config, plan, options.node_id));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(replica), std::move(transport),
                                     std::move(plan));
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

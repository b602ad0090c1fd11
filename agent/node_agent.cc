#include "agent/node_agent.h"

#include <fmt/core.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "agent/downstream.h"
#include "agent/event_loop.h"
#include "agent/protocol.h"
#include "codec/chunk.h"
#include "common/log.h"
#include "topology/tree_plan.h"

namespace deltacast::agent {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

// All relay state lives on loop_ (one thread); everything that touches the
// replica (begin, apply, finish, commit, abort) runs in order on apply_loop_.
class NodeAgent::Impl {
 public:
  Impl(NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
       std::unique_ptr<transport::Transport> transport, topology::TreePlan plan)
      : options_(std::move(options)),
        plan_(std::move(plan)),
        self_(*plan_.Find(options_.node_id)),
        replica_(std::move(replica)),
        transport_(std::move(transport)),
        loop_([this] { Tick(); }),
        downstream_(loop_, options_.node_id, self_.children, options_.token, DownstreamEvents()) {
    const auto* parent = options_.config.FindNode(*self_.parent);
    parent_address_ = parent->host + ":" + std::to_string(parent->port);
    version_ = replica_->version();
    apply_loop_.Start();
    loop_.Start();
  }

  Status Listen() {
    const auto* me = options_.config.FindNode(options_.node_id);
    auto bound = transport_->Listen(me->host + ":" + std::to_string(me->port),
                                    [this](std::unique_ptr<transport::Connection> c) {
                                      // Tasks must be copyable; the holder carries the move-only link.
                                      auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
                                      loop_.Post([this, holder] { downstream_.Accept(std::move(*holder)); });
                                    });
    if (!bound.ok()) return bound.status();
    listen_address_ = *bound;
    log::Info(fmt::format("{}: listening on {}, parent {} at {}, {} children, version {}", options_.node_id,
                          listen_address_, *self_.parent, parent_address_, self_.children.size(),
                          version_.ShortHex()));
    return Status::Ok();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    transport_->Shutdown();
    loop_.Stop();
    apply_loop_.Stop();
    downstream_.CloseAll();
  }

  NodeAgentStats stats() const {
    std::lock_guard lock(stats_mu_);
    return stats_;
  }
  const std::string& listen_address() const { return listen_address_; }

 private:
  enum class Phase { kStreaming, kCommitting, kAborting, kDone };

  // One refit as this node sees it (loop thread only).
  struct Refit {
    uint64_t id = 0;
    codec::DeltaIdentity identity;
    Phase phase = Phase::kStreaming;
    Status local_error;             // why this node cannot reach the target
    bool local_prepared = false;
    bool prepared_sent = false;
    bool failed_sent = false;
    std::set<std::string> prepared_children;
    std::vector<NodeReport> reports;
    bool local_outcome_done = false;
    std::set<std::string> outcome_children;
    uint32_t outcome_nodes = 0;
    Clock::time_point start = Clock::now();
    Clock::time_point decided;  // when COMMIT or ABORT arrived
    double apply_seconds = 0;
    uint64_t chunk_bytes = 0;
    uint64_t chunks = 0;
    uint64_t partitions_applied = 0;
  };

  // What the apply thread owns for the current refit.
  struct ApplyState {
    uint64_t refit_id = 0;
    std::unique_ptr<apply::DeltaApplier> applier;
    std::optional<codec::Manifest> target;
    std::set<std::string> changed_tensors;
  };

  Downstream::Events DownstreamEvents() {
    Downstream::Events e;
    e.joined = [](const std::string&) {};
    e.lost = [this](const std::string& child, const Status& why) { OnChildLost(child, why); };
    e.message = [this](const std::string& child, MessageType type, ByteSpan m) { OnChildMessage(child, type, m); };
    return e;
  }

  // ---- parent link -------------------------------------------------------

  void Tick() {
    if (stopped_) return;
    const auto now = Clock::now();
    if (!parent_ && !connecting_ && now >= next_connect_) {
      connecting_ = true;
      transport_->Connect(parent_address_, [this](Result<std::unique_ptr<transport::Connection>> r) {
        auto shared = std::make_shared<Result<std::unique_ptr<transport::Connection>>>(std::move(r));
        loop_.Post([this, shared] { OnParentConnected(std::move(*shared)); });
      });
    }
    if (now >= next_heartbeat_) {
      next_heartbeat_ = now + std::chrono::seconds(1);
      if (parent_ && joined_) parent_->Send(transport::MakeMessage(EncodeHeartbeat()));
      downstream_.Heartbeat();
    }
    if (refit_ && (refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting) &&
        refit_->local_outcome_done && now - refit_->decided > options_.config.tree.commit_timeout) {
      log::Warn(fmt::format("{}: refit {}: children {} did not confirm the decision in time", options_.node_id,
                            refit_->id, refit_->outcome_children.size()));
      refit_->outcome_children.clear();
      ReportOutcome();
    }
    if (refit_ && refit_->phase == Phase::kStreaming && !refit_->failed_sent &&
        now - refit_->start > options_.config.tree.connect_timeout && !downstream_.AllConnected()) {
      std::string missing;
      for (const auto& c : downstream_.Missing()) missing += (missing.empty() ? "" : ", ") + c;
      SendFailed(Failed{refit_->id, options_.node_id, "children did not join within the connect timeout: " + missing});
    }
    if (parent_ && now - last_from_parent_ > options_.config.tree.idle_timeout) {
      log::Warn(fmt::format("{}: parent {} silent for {} ms; reconnecting", options_.node_id, *self_.parent,
                            options_.config.tree.idle_timeout.count()));
      DropParent(Status::Timeout("parent idle"));
    }
  }

  void OnParentConnected(Result<std::unique_ptr<transport::Connection>> result) {
    connecting_ = false;
    if (!result.ok()) {
      next_connect_ = Clock::now() + backoff_;
      // Short ceiling: a publisher only listens while it publishes, and its children
      // should join within a tick or two of it starting.
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
      return;
    }
    backoff_ = std::chrono::milliseconds(100);
    parent_ = std::move(*result);
    const uint64_t serial = ++parent_serial_;
    last_from_parent_ = Clock::now();
    parent_->Start(
        [this, serial](transport::Message m) { loop_.Post([this, serial, m] { OnParentMessage(serial, m); }); },
        [this, serial](Status s) {
          loop_.Post([this, serial, s] {
            if (serial == parent_serial_ && parent_) DropParent(s.ok() ? Status::Unavailable("parent closed the link") : s);
          });
        });
  }

  void DropParent(const Status& why) {
    if (parent_) parent_->Close();
    parent_.reset();
    joined_ = false;
    next_connect_ = Clock::now() + backoff_;
    if (refit_ && refit_->phase == Phase::kStreaming && !refit_->prepared_sent) {
      // Nobody will finish this refit for us: roll back (presumed abort).
      log::Warn(fmt::format("{}: lost parent during refit {} ({}); rolling back", options_.node_id, refit_->id,
                            why.ToString()));
      StartAbort();
    } else if (refit_ && refit_->phase == Phase::kStreaming) {
      log::Warn(fmt::format("{}: lost parent after PREPARED for refit {}; in doubt, keeping the base active",
                            options_.node_id, refit_->id));
    }
  }

  void SendUp(std::vector<std::byte> bytes) {
    if (parent_ && joined_) parent_->Send(transport::MakeMessage(std::move(bytes)));
  }

  void ProtocolError(const std::string& what) {
    log::Error(fmt::format("{}: protocol error from parent {}: {}; closing the link", options_.node_id,
                           *self_.parent, what));
    if (parent_) parent_->Send(transport::MakeMessage(EncodeRefuse({what})));
    DropParent(Status::Corrupt(what));
  }

  void OnParentMessage(uint64_t serial, const transport::Message& message) {
    if (serial != parent_serial_ || !parent_) return;
    last_from_parent_ = Clock::now();
    const ByteSpan bytes(*message);
    auto type = PeekType(bytes);
    if (!type.ok()) return ProtocolError(type.status().message());
    if (!joined_ && *type != MessageType::kChallenge && *type != MessageType::kWelcome &&
        *type != MessageType::kRefuse) {
      return ProtocolError(std::string(MessageTypeName(*type)) + " before the handshake finished");
    }
    switch (*type) {
      case MessageType::kChallenge: {
        auto c = ParseChallenge(bytes);
        if (!c.ok()) return ProtocolError(c.status().message());
        if (c->parent_id != *self_.parent) {
          return ProtocolError("the node at " + parent_address_ + " is '" + c->parent_id + "', not my parent '" +
                               *self_.parent + "'");
        }
        Hello hello{options_.node_id, HelloProof(options_.token, c->nonce, options_.node_id, c->parent_id), version_};
        parent_->Send(transport::MakeMessage(EncodeHello(hello)));
        return;
      }
      case MessageType::kWelcome:
        joined_ = true;
        log::Info(fmt::format("{}: joined parent {}", options_.node_id, *self_.parent));
        return;
      case MessageType::kRefuse: {
        auto r = ParseRefuse(bytes);
        log::Error(fmt::format("{}: parent {} refused us: {}", options_.node_id, *self_.parent,
                               r.ok() ? r->reason : r.status().message()));
        backoff_ = std::chrono::milliseconds(2000);
        return DropParent(Status::Unavailable("refused"));
      }
      case MessageType::kBegin:
        return OnBegin(bytes);
      case MessageType::kChunk:
        return OnChunk(message);
      case MessageType::kCommit:
      case MessageType::kAbort:
        return OnDecision(*type, bytes);
      case MessageType::kHeartbeat:
        return;
      default:
        return ProtocolError(std::string(MessageTypeName(*type)) + " is not a message a parent sends");
    }
  }

  // ---- refit: streaming ----------------------------------------------------

  void OnBegin(ByteSpan bytes) {
    auto begin = ParseBegin(bytes);
    if (!begin.ok()) return ProtocolError(begin.status().message());
    if (refit_ && refit_->id == begin->refit_id) return;  // a duplicate
    if (refit_ && refit_->phase != Phase::kDone) {
      return ProtocolError("BEGIN of refit " + std::to_string(begin->refit_id) + " while refit " +
                           std::to_string(refit_->id) + " is unfinished");
    }
    refit_.emplace();
    refit_->id = begin->refit_id;
    refit_->identity = {begin->base_version, begin->target_version, begin->partition_bytes};
    log::Info(fmt::format("{}: refit {} begins: {} -> {}", options_.node_id, refit_->id,
                          begin->base_version.ShortHex(), begin->target_version.ShortHex()));
    downstream_.ResetCredits();
    downstream_.Broadcast(transport::MakeMessage(EncodeBegin(*begin)), false);
    const uint64_t id = refit_->id;
    const codec::DeltaIdentity identity = refit_->identity;
    apply_loop_.Post([this, id, identity] {
      apply_ = ApplyState{};
      apply_.refit_id = id;
      auto applier = replica_->Begin(identity, apply::ApplyOptions{options_.apply_threads, /*keep_undo=*/true});
      Status status = applier.ok() ? Status::Ok() : applier.status();
      if (applier.ok()) apply_.applier = std::move(*applier);
      loop_.Post([this, id, status] {
        if (!status.ok()) LocalFailure(id, status);
      });
    });
    SendUp(EncodeCredit({static_cast<uint32_t>(options_.config.tree.window)}));
  }

  void OnChunk(const transport::Message& message) {
    if (!refit_ || refit_->phase != Phase::kStreaming) return ProtocolError("CHUNK outside a refit");
    Refit& r = *refit_;
    ++r.chunks;
    r.chunk_bytes += message->size() - kMessageHeaderBytes;
    HoldChunk(message->size());
    // Released once applied here AND handed to every child: only then does this
    // node have room for another, so only then does the parent get credit.
    auto pending = std::make_shared<int>(2);
    const uint64_t id = r.id;
    const size_t size = message->size();
    auto release = [this, pending, id, size] {
      if (--*pending > 0) return;
      ReleaseChunk(size);
      if (refit_ && refit_->id == id && refit_->phase == Phase::kStreaming) SendUp(EncodeCredit({1}));
    };
    downstream_.Broadcast(message, true, release);
    apply_loop_.Post([this, message, id, release] {
      Status status;
      bool end = false;
      uint64_t applied = 0;
      double seconds = 0;
      const auto t0 = Clock::now();
      if (apply_.refit_id == id && apply_.applier) {
        auto chunk = codec::ParseChunk(Body(*message));
        if (!chunk.ok()) {
          status = chunk.status();
        } else if (chunk->kind == codec::ChunkKind::kEnd) {
          end = true;
          auto target = apply_.applier->Finish(chunk->summary);
          if (target.ok() && !chunk->summary.target_layout.IsZero() &&
              chunk->summary.target_layout != replica_->store().LayoutId()) {
            target = Status::Corrupt("the delta's target layout differs from this store's");
          }
          if (target.ok()) apply_.target = std::move(*target);
          status = target.status();
          applied = apply_.applier->report().applied;
        } else {
          status = apply_.applier->ApplyChunk(*chunk);
          for (const auto& record : chunk->records) apply_.changed_tensors.emplace(record.tensor_name);
        }
      }
      seconds = SecondsSince(t0);
      {
        std::lock_guard lock(stats_mu_);
        ++stats_.chunks_received;
      }
      loop_.Post([this, id, status, end, applied, seconds, release] {
        release();
        OnChunkApplied(id, status, end, applied, seconds);
      });
    });
  }

  void OnChunkApplied(uint64_t id, const Status& status, bool end, uint64_t applied, double seconds) {
    if (!refit_ || refit_->id != id) return;
    refit_->apply_seconds += seconds;
    if (!status.ok()) return LocalFailure(id, status);
    if (end && refit_->local_error.ok()) {
      refit_->local_prepared = true;
      refit_->partitions_applied = applied;
      MaybePrepared();
    }
  }

  void LocalFailure(uint64_t id, const Status& status) {
    if (!refit_ || refit_->id != id || !refit_->local_error.ok()) return;
    refit_->local_error = status;
    log::Error(fmt::format("{}: refit {} cannot reach the target: {}", options_.node_id, id, status.ToString()));
    SendFailed(Failed{id, options_.node_id, status.ToString()});
  }

  void SendFailed(const Failed& failed) {
    if (!refit_ || refit_->failed_sent) return;
    refit_->failed_sent = true;
    SendUp(EncodeFailed(failed));
  }

  void MaybePrepared() {
    Refit& r = *refit_;
    if (r.prepared_sent || !r.local_prepared || !r.local_error.ok()) return;
    if (r.prepared_children.size() < self_.children.size()) return;
    r.prepared_sent = true;
    Prepared prepared{r.id, r.reports};
    prepared.nodes.push_back({options_.node_id, r.chunk_bytes, SecondsSince(r.start), r.partitions_applied});
    SendUp(EncodePrepared(prepared));
  }

  // ---- children ------------------------------------------------------------

  void OnChildLost(const std::string& child, const Status& why) {
    if (!refit_ || refit_->phase != Phase::kStreaming) return;
    SendFailed(Failed{refit_->id, child, "lost link to '" + child + "': " + why.ToString()});
  }

  void OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes) {
    if (!refit_) return;
    Refit& r = *refit_;
    switch (type) {
      case MessageType::kPrepared: {
        auto p = ParsePrepared(bytes);
        if (!p.ok() || p->refit_id != r.id) return;
        if (r.prepared_children.insert(child).second) {
          r.reports.insert(r.reports.end(), p->nodes.begin(), p->nodes.end());
        }
        return MaybePrepared();
      }
      case MessageType::kFailed: {
        auto f = ParseFailed(bytes);
        if (!f.ok() || f->refit_id != r.id) return;
        return SendFailed(*f);
      }
      case MessageType::kCommitted:
      case MessageType::kAborted: {
        auto o = ParseOutcome(bytes);
        if (!o.ok() || o->refit_id != r.id) return;
        if (r.outcome_children.insert(child).second) r.outcome_nodes += o->nodes;
        return MaybeOutcome();
      }
      default:
        return;
    }
  }

  // ---- refit: decision ----------------------------------------------------

  void OnDecision(MessageType type, ByteSpan bytes) {
    auto d = ParseDecision(bytes);
    if (!d.ok()) return ProtocolError(d.status().message());
    if (!refit_ || refit_->id != d->refit_id) return ProtocolError("decision for an unknown refit");
    Refit& r = *refit_;
    if (r.phase != Phase::kStreaming) return;  // a duplicate
    if (type == MessageType::kCommit) {
      if (!r.prepared_sent) return ProtocolError("COMMIT before this node was PREPARED");
      r.phase = Phase::kCommitting;
      r.decided = Clock::now();
      downstream_.Broadcast(transport::MakeMessage(EncodeDecision(MessageType::kCommit, *d)), false);
      const uint64_t id = r.id;
      apply_loop_.Post([this, id] {
        Status status = apply_.target ? replica_->Commit(*apply_.target)
                                      : Status::Internal("commit without a verified target");
        CommitEvent event{id, replica_->version(), {apply_.changed_tensors.begin(), apply_.changed_tensors.end()}};
        apply_ = ApplyState{};
        if (status.ok() && options_.on_commit) options_.on_commit(event);
        loop_.Post([this, id, status, version = event.version] { OnLocalOutcome(id, status, version); });
      });
      return;
    }
    StartAbort();
  }

  void StartAbort() {
    Refit& r = *refit_;
    if (r.phase == Phase::kAborting) return;
    r.phase = Phase::kAborting;
    r.decided = Clock::now();
    downstream_.DropQueued();
    downstream_.Broadcast(transport::MakeMessage(EncodeDecision(MessageType::kAbort, {r.id, r.identity.target_version})), false);
    const uint64_t id = r.id;
    apply_loop_.Post([this, id] {
      Status status = apply_.applier ? replica_->Abort(*apply_.applier) : Status::Ok();
      apply_ = ApplyState{};
      loop_.Post([this, id, status, version = replica_->version()] { OnLocalOutcome(id, status, version); });
    });
  }

  void OnLocalOutcome(uint64_t id, const Status& status, const Digest128& version) {
    if (!refit_ || refit_->id != id) return;
    if (!status.ok()) {
      log::Error(fmt::format("{}: refit {}: {} failed locally: {}", options_.node_id, id,
                             refit_->phase == Phase::kCommitting ? "commit" : "rollback", status.ToString()));
    }
    version_ = version;
    refit_->local_outcome_done = true;
    MaybeOutcome();
  }

  void MaybeOutcome() {
    Refit& r = *refit_;
    if (!r.local_outcome_done || r.phase == Phase::kDone) return;
    if (r.outcome_children.size() < downstream_.expected() && !(r.phase == Phase::kAborting && !downstream_.AllConnected())) {
      return;
    }
    ReportOutcome();
  }

  void ReportOutcome() {
    Refit& r = *refit_;
    if (r.phase == Phase::kDone) return;
    const bool committed = r.phase == Phase::kCommitting;
    SendUp(EncodeOutcome(committed ? MessageType::kCommitted : MessageType::kAborted, {r.id, 1 + r.outcome_nodes}));
    r.phase = Phase::kDone;
    {
      std::lock_guard lock(stats_mu_);
      (committed ? stats_.refits_committed : stats_.refits_aborted)++;
      stats_.version = version_;
    }
    log::Info(fmt::format(
        "{}: refit {} {}: version {}, received {:.2f} MiB in {} chunks, {} partitions applied, apply {:.2f} s, "
        "total {:.2f} s, peak held {:.2f} MiB, {} children",
        options_.node_id, r.id, committed ? "committed" : "aborted", version_.ShortHex(),
        double(r.chunk_bytes) / (1 << 20), r.chunks, r.partitions_applied, r.apply_seconds, SecondsSince(r.start),
        double(stats().peak_held_bytes) / (1 << 20), self_.children.size()));
  }

  // ---- memory accounting --------------------------------------------------

  void HoldChunk(size_t bytes) {
    held_bytes_ += bytes;
    std::lock_guard lock(stats_mu_);
    stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held_bytes_);
  }
  void ReleaseChunk(size_t bytes) { held_bytes_ -= bytes; }

  NodeAgentOptions options_;
  topology::TreePlan plan_;
  topology::PlannedNode self_;
  std::unique_ptr<apply::Replica> replica_;
  std::unique_ptr<transport::Transport> transport_;
  std::string parent_address_;
  std::string listen_address_;

  // Loop-thread state.
  std::unique_ptr<transport::Connection> parent_;
  uint64_t parent_serial_ = 0;
  bool connecting_ = false;
  bool joined_ = false;
  Clock::time_point next_connect_ = Clock::now();
  Clock::time_point next_heartbeat_ = Clock::now();
  Clock::time_point last_from_parent_ = Clock::now();
  std::chrono::milliseconds backoff_{100};
  std::optional<Refit> refit_;
  Digest128 version_;
  uint64_t held_bytes_ = 0;

  ApplyState apply_;  // apply-thread state

  mutable std::mutex stats_mu_;
  NodeAgentStats stats_;
  std::atomic<bool> stopped_{false};

  // Declared last: constructed after, and stopped before, everything they use.
  EventLoop apply_loop_;
  EventLoop loop_;
  Downstream downstream_;
};

Result<std::unique_ptr<NodeAgent>> NodeAgent::Start(NodeAgentOptions options, std::unique_ptr<apply::Replica> replica,
                                                    std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::TreePlan plan, topology::PlanTree(options.config));
  const topology::PlannedNode* self = plan.Find(options.node_id);
  if (!self) return Status::NotFound("node '" + options.node_id + "' is not in " + options.config.source_file.string());
  if (!self->parent) return Status::InvalidArgument("node '" + options.node_id + "' is the source; run `deltacast publish` there");
  auto impl = std::make_unique<Impl>(std::move(options), std::move(replica), std::move(transport), std::move(plan));
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<NodeAgent>(new NodeAgent(std::move(impl)));
}

NodeAgent::NodeAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeAgent::~NodeAgent() { Stop(); }
void NodeAgent::Stop() {
  if (impl_) impl_->Stop();
}
NodeAgentStats NodeAgent::stats() const { return impl_->stats(); }
const std::string& NodeAgent::listen_address() const { return impl_->listen_address(); }

}  // namespace deltacast::agent

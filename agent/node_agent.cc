#include "agent/node_agent.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "agent/downstream.h"
#include "agent/event_loop.h"
#include "agent/protocol.h"
#include "agent/spool.h"
#include "codec/chunk.h"
#include "common/crash_point.h"
#include "common/log.h"
#include "topology/tree_plan.h"
#include "transport/transport_set.h"

namespace deltacast::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Partitions a catching-up node has requested at once: enough to keep a long path
// busy, few enough that the replies (each a partition) stay small in memory.
constexpr size_t kCatchUpWindow = 16;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// All relay state lives on loop_ (one thread); everything that touches the
// replica (begin, apply, finish, repair, commit, abort) runs in order on apply_loop_.
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
    current_parent_ = *self_.parent;
    parent_address_ = AddressOf(current_parent_);
    std::set<std::string> adoptable;
    for (const auto& node : plan_.nodes) {
      if (node.failover_parent == options_.node_id) adoptable.insert(node.id);
    }
    downstream_.AllowAdoption(std::move(adoptable));
    owns_spool_dir_ = options_.spool_dir.empty();
    if (options_.spool_dir.empty()) {
      // A store without a directory does not survive a restart, and neither need
      // its spool: per process, so agents of several processes never share one.
      options_.spool_dir =
          std::filesystem::temp_directory_path() /
          ("deltacast-spool-" + options_.node_id + "-" + std::to_string(::getpid()));
    }
    journal_ = Journal{replica_->version(), replica_->inflight(), replica_->prepared(),
                       replica_->applied_chunks()};
    apply_loop_.Start();
    loop_.Start();
  }

  Status Listen() {
    const auto* me = options_.config.FindNode(options_.node_id);
    auto bound = transport_->Listen(
        me->host + ":" + std::to_string(me->port),
        [this](std::unique_ptr<transport::Connection> c) {
          // Tasks must be copyable; the holder carries the move-only link.
          auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
          loop_.Post([this, holder] { downstream_.Accept(std::move(*holder)); });
        });
    if (!bound.ok()) return bound.status();
    listen_address_ = *bound;
    if (auto* set = transport::AsTransportSet(transport_.get())) {
      loop_.Post([this, names = set->Accepting()] { downstream_.SetTransports(names); });
    }
    log::Info(fmt::format(
        "{}: listening on {}, parent {} at {}, {} children, version {}{}", options_.node_id,
        listen_address_, *self_.parent, parent_address_, self_.children.size(),
        journal_.version.ShortHex(),
        journal_.inflight
            ? fmt::format(", delta {} -> {} in flight ({} chunks applied{})",
                          journal_.inflight->base.ShortHex(), journal_.inflight->target.ShortHex(),
                          journal_.applied.size(), journal_.prepared ? ", prepared" : "")
            : ""));
    return Status::Ok();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    transport_->Shutdown();
    loop_.Stop();
    apply_loop_.Stop();
    downstream_.CloseAll();
    refit_.reset();  // closes the spool
    if (owns_spool_dir_) {
      std::error_code ec;
      std::filesystem::remove_all(options_.spool_dir, ec);
    }
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
    Begin begin;
    codec::DeltaIdentity identity;
    Phase phase = Phase::kStreaming;
    Status local_error;  // why this node cannot reach the target
    bool local_prepared = false;
    bool end_received = false;  // the END chunk came: every chunk the parent sends came
    bool resolution = false;    // resolving an earlier refit's delta; there is no BEGIN
    bool prepared_sent = false;
    bool failed_sent = false;
    std::optional<MessageType> pending_decision;  // arrived before we had prepared
    std::set<std::string> prepared_children;
    std::set<std::string>
        excused;  // away children the version does not wait for (policy available)
    std::vector<NodeReport> reports;
    bool local_outcome_done = false;
    std::set<std::string> outcome_children;
    // After the decision: children away, each waited for until its deadline, then
    // left to learn the decision when it is back (not_waited).
    std::map<std::string, Clock::time_point> away_until;
    std::set<std::string> not_waited;
    uint32_t outcome_nodes = 0;
    Clock::time_point start = Clock::now();
    Clock::time_point decided;
    double apply_seconds = 0;
    uint64_t chunk_bytes = 0;
    uint64_t resent_bytes = 0;  // of chunk_bytes: chunks this node had already
    uint64_t chunks = 0;
    uint64_t partitions_applied = 0;
    uint64_t repair_bytes = 0;  // literal partition bytes fetched for torn partitions
    // Every chunk received, durably before it is applied: for replays to children
    // that rejoin, and so this node can roll the delta back from its own records.
    std::shared_ptr<Spool> spool;
  };

  // What the replica's journal says, mirrored for the loop thread (HELLO).
  struct Journal {
    Digest128 version;
    std::optional<apply::InflightDelta> inflight;
    bool prepared = false;
    std::set<uint32_t> applied;
  };

  // What the apply thread owns for the current refit.
  struct ApplyState {
    uint64_t refit_id = 0;
    bool at_target = false;  // the replica already holds the target: nothing to apply
    std::unique_ptr<apply::DeltaApplier> applier;
    std::optional<codec::DeltaSummary> summary;
    std::optional<codec::Manifest> target;
    std::set<std::string> changed_tensors;
  };

  // A FETCH this node forwarded up for a child (relays), or sent for itself.
  struct PendingFetch {
    std::string child;  // empty: for ourselves
    uint64_t child_request = 0;
    apply::PartitionKey key;
    uint64_t refit_id = 0;
    PartitionHash hash{};  // what the bytes must hash to (rollback, catch-up)
    bool for_rollback = false;
    bool for_catch_up = false;
    uint64_t byte_length = 0;  // to ask again after a reconnect (catch-up, rollback)
  };

  // This node missed versions the cluster committed (it was down for one or more
  // refits, or died mid-delta and the delta committed without it): it is brought to
  // the committed version `to` by overwriting each partition that differs with the
  // bytes of `to`, fetched up the tree like a repair. Loop thread.
  struct CatchUpState {
    Digest128 to;
    uint64_t refit_id = 0;   // the refit it unblocks
    bool resolving = false;  // ends a Resolve (else a deferred BEGIN follows)
    // First choice: the chain of deltas the source kept, applied in order.
    uint64_t chain_request = 0;  // outstanding FETCH_CHAIN; 0: none
    bool chain_answered = false;
    bool chain_mode = false;
    std::vector<ChainLink> links;
    size_t link = 0;                              // the delta being applied
    std::set<uint32_t> missing;                   // asked for on a link that dropped
    std::map<uint64_t, uint32_t> pending_chunks;  // request -> sequence
    uint32_t chunks_done = 0;                     // applied, journaled or END
    std::optional<codec::DeltaSummary> end;       // links[link]'s END
    uint32_t deltas = 0;                          // links applied
    // Otherwise: every partition that differs from the target's manifest.
    uint64_t manifest_request = 0;  // outstanding FETCH_MANIFEST; 0: none
    bool have_manifest = false;
    std::deque<apply::CatchUpPartition> queue;  // not yet asked for
    size_t outstanding = 0;
    size_t total = 0;
    size_t written = 0;
    uint64_t bytes = 0;
    Clock::time_point start;
  };

  Downstream::Events DownstreamEvents() {
    Downstream::Events e;
    e.joined = [this](const std::string& child, const Hello& hello) {
      OnChildJoined(child, hello);
    };
    e.lost = [this](const std::string& child, const Status& why) { OnChildLost(child, why); };
    e.message = [this](const std::string& child, MessageType type, ByteSpan m) {
      OnChildMessage(child, type, m);
    };
    return e;
  }

  std::string AddressOf(const std::string& id) const {
    const auto* node = options_.config.FindNode(id);
    return node->host + ":" + std::to_string(node->port);
  }

  // Which parent to dial next: the planned one, or (after it has been unreachable
  // for kFailoverAfter) the failover parent from the plan; back to the planned one
  // when the failover parent is unreachable too, and between refits (so it is home
  // for the next version).
  void ChooseParent(Clock::time_point now) {
    // Only with commit policy `available`: under `all` a dead relay fails the
    // refit anyway, and a relay that comes back must find its children at home.
    if (!self_.failover_parent ||
        options_.config.tree.commit_policy != topology::CommitPolicy::kAvailable) {
      return;
    }
    const bool on_primary = current_parent_ == *self_.parent;
    if (on_primary && parent_lost_at_ && now - *parent_lost_at_ > kFailoverAfter) {
      current_parent_ = *self_.failover_parent;
      next_primary_try_ = now + std::chrono::seconds(10);  // stay a while before trying home
      log::Warn(fmt::format("{}: parent {} unreachable; failing over to {}", options_.node_id,
                            *self_.parent, current_parent_));
    } else if (!on_primary && parent_lost_at_ && now - *parent_lost_at_ > 2 * kFailoverAfter) {
      current_parent_ = *self_.parent;
      parent_lost_at_ = now;
    }
    parent_address_ = AddressOf(current_parent_);
  }

  // Apply thread: mirrors the replica's journal for the loop thread.
  void SnapshotJournal() {
    Journal j{replica_->version(), replica_->inflight(), replica_->prepared(),
              replica_->applied_chunks()};
    loop_.Post([this, j] { journal_ = j; });
  }

  // ---- parent link -------------------------------------------------------

  void Tick() {
    if (stopped_) return;
    const auto now = Clock::now();
    if (parent_ && joined_ && current_parent_ != *self_.parent && now >= next_primary_try_ &&
        (!refit_ || refit_->phase == Phase::kDone)) {
      // Between refits, try to go home to the planned parent.
      next_primary_try_ = now + std::chrono::seconds(10);
      log::Info(fmt::format("{}: leaving failover parent {} to rejoin {}", options_.node_id,
                            current_parent_, *self_.parent));
      DropParent(Status::Ok());
      current_parent_ = *self_.parent;
      parent_address_ = AddressOf(current_parent_);
      parent_lost_at_ = now;
    }
    if (!parent_ && !connecting_ && now >= next_connect_) {
      ChooseParent(now);
      connecting_ = true;
      DialParent();
    }
    if (now >= next_heartbeat_) {
      next_heartbeat_ = now + std::chrono::seconds(1);
      if (parent_ && joined_) parent_->Send(transport::MakeMessage(EncodeHeartbeat()));
      downstream_.Heartbeat();
    }
    if (refit_ && refit_->phase == Phase::kStreaming) {
      for (auto it = missing_since_.begin(); it != missing_since_.end(); ++it) {
        if (now - it->second <= options_.config.tree.connect_timeout) continue;
        // Once the refit failed here, chunks queued for an absent child only hold
        // our parent's credit (and the next refit behind them): let it go too.
        if (options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable ||
            refit_->failed_sent) {
          // It does not block the version: it catches up from our spool when it
          // is back (OnChildJoined replays the refit and its decision).
          log::Warn(fmt::format(
              "{}: child {} is away; refit {} goes on without it ({})", options_.node_id, it->first,
              refit_->id,
              refit_->failed_sent ? "the refit failed here anyway" : "commit policy available"));
          refit_->excused.insert(it->first);
          downstream_.Excuse(it->first);
          missing_since_.erase(it);
          MaybePrepared();
          break;
        }
        SendFailed(
            Failed{refit_->id, it->first,
                   "child '" + it->first + "' has been away longer than the connect timeout"});
        break;
      }
    }
    if (refit_ && (refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting)) {
      GiveUpOnAwayChildren(now);
    }
    if (refit_ && (refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting) &&
        refit_->local_outcome_done && now - refit_->decided > options_.config.tree.commit_timeout) {
      log::Warn(fmt::format("{}: refit {}: children {} did not confirm the decision in time",
                            options_.node_id, refit_->id, refit_->outcome_children.size()));
      ReportOutcome();
    }
    if (parent_ && now - last_from_parent_ > options_.config.tree.idle_timeout) {
      log::Warn(fmt::format("{}: parent {} silent for {} ms; reconnecting", options_.node_id,
                            *self_.parent, options_.config.tree.idle_timeout.count()));
      DropParent(Status::Timeout("parent idle"));
    }
  }

  // The transports of the hop to the parent being dialled, preference order.
  const std::vector<std::string>& HopTransports() const {
    return current_parent_ == *self_.parent ? self_.transports : self_.failover_transports;
  }

  // Dials current_parent_: along the hop's transports when the agent has several
  // backends (falling back in order), else over its one backend.
  void DialParent() {
    auto on_done = [this](Result<std::unique_ptr<transport::Connection>> r,
                          const std::string& backend) {
      auto shared = std::make_shared<Result<std::unique_ptr<transport::Connection>>>(std::move(r));
      loop_.Post([this, shared, backend] { OnParentConnected(std::move(*shared), backend); });
    };
    if (auto* set = transport::AsTransportSet(transport_.get())) {
      const topology::NodeConfig* parent = options_.config.FindNode(current_parent_);
      set->ConnectFirst(parent->host, parent->port, HopTransports(), on_done);
      return;
    }
    transport_->Connect(parent_address_, [on_done, backend = transport_->capabilities().backend](
                                             Result<std::unique_ptr<transport::Connection>> r) {
      on_done(std::move(r), backend);
    });
  }

  void OnParentConnected(Result<std::unique_ptr<transport::Connection>> result,
                         const std::string& backend) {
    connecting_ = false;
    if (!result.ok()) {
      if (!parent_lost_at_) parent_lost_at_ = Clock::now();  // unreachable since now
      next_connect_ = Clock::now() + backoff_;
      // Short ceiling: a publisher only listens while it publishes, and its children
      // should join within a tick or two of it starting.
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
      return;
    }
    backoff_ = std::chrono::milliseconds(100);
    parent_ = std::move(*result);
    parent_backend_ = backend;
    const uint64_t serial = ++parent_serial_;
    last_from_parent_ = Clock::now();
    parent_->Start(
        [this, serial](transport::Message m) {
          loop_.Post([this, serial, m] { OnParentMessage(serial, m); });
        },
        [this, serial](Status s) {
          loop_.Post([this, serial, s] {
            if (serial == parent_serial_ && parent_)
              DropParent(s.ok() ? Status::Unavailable("parent closed the link") : s);
          });
        });
  }

  void DropParent(const Status& why) {
    if (parent_) parent_->Close();
    parent_.reset();
    joined_ = false;
    if (!parent_lost_at_) parent_lost_at_ = Clock::now();
    next_connect_ = Clock::now() + backoff_;
    for (auto it = fetches_.begin(); it != fetches_.end();) {
      // A rollback waiting for base bytes asks again on the next link.
      if (it->second.for_rollback) lost_base_fetches_.push_back(it->second);
      if (it->second.for_catch_up && catch_up_) {
        // Asked again on the next link.
        catch_up_->queue.push_front({it->second.key, it->second.byte_length, it->second.hash});
        --catch_up_->outstanding;
      }
      // Answer children's forwarded FETCHes: this path is gone; they may ask again.
      if (!it->second.child.empty()) {
        downstream_.SendTo(it->second.child, transport::MakeMessage(EncodePartition(
                                                 it->second.child_request, false, {})));
      }
      it = fetches_.erase(it);
    }
    for (const auto& [request, asker] : routed_) {
      downstream_.SendTo(asker.child,
                         transport::MakeMessage(NotFoundReply(asker.type, asker.child_request)));
    }
    routed_.clear();
    if (catch_up_) {
      // Asked again on the next link.
      CatchUpState& c = *catch_up_;
      c.manifest_request = 0;
      c.chain_request = 0;
      for (const auto& [request, sequence] : c.pending_chunks) c.missing.insert(sequence);
      c.pending_chunks.clear();
      if (c.chain_mode) c.outstanding = 0;
    }
    if (refit_ && refit_->phase == Phase::kStreaming) {
      // The delta stays in flight and journaled: when the parent (or its
      // replacement) is back, the refit resumes with only what is missing; a
      // PREPARED node learns the outcome then. Nothing is guessed.
      log::Warn(fmt::format("{}: lost parent during refit {} ({}); will resume on reconnect",
                            options_.node_id, refit_->id, why.ToString()));
    }
  }

  void SendUp(std::vector<std::byte> bytes) {
    if (parent_ && joined_) parent_->Send(transport::MakeMessage(std::move(bytes)));
  }

  void ProtocolError(const std::string& what) {
    log::Error(fmt::format("{}: protocol error from parent {}: {}; closing the link",
                           options_.node_id, *self_.parent, what));
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
        if (c->parent_id != current_parent_) {
          return ProtocolError("the node at " + parent_address_ + " is '" + c->parent_id +
                               "', not the parent I dialled, '" + current_parent_ + "'");
        }
        Hello hello;
        hello.node_id = options_.node_id;
        hello.proof = HelloProof(options_.token, c->nonce, options_.node_id, c->parent_id);
        hello.active_version = journal_.version;
        if (journal_.inflight) {
          hello.inflight_base = journal_.inflight->base;
          hello.inflight_target = journal_.inflight->target;
          hello.prepared = journal_.prepared;
          hello.applied_chunks.assign(journal_.applied.begin(), journal_.applied.end());
        }
        claimed_ = {hello.inflight_target,
                    journal_.inflight ? journal_.applied : std::set<uint32_t>{}};
        received_on_link_.clear();
        hello.transport = parent_backend_;
        hello.transports = HopTransports();
        parent_->Send(transport::MakeMessage(EncodeHello(hello)));
        return;
      }
      case MessageType::kWelcome:
        joined_ = true;
        parent_lost_at_.reset();
        {
          std::lock_guard lock(stats_mu_);
          ++stats_.parent_joins;
        }
        if (catch_up_) loop_.Post([this] { PumpCatchUp(); });
        if (!lost_base_fetches_.empty()) loop_.Post([this] { RefetchBaseBytes(); });
        log::Info(fmt::format("{}: joined parent {} over {}{}", options_.node_id, current_parent_,
                              parent_backend_,
                              current_parent_ == *self_.parent ? "" : " (failover)"));
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
      case MessageType::kPartition:
        return OnPartition(bytes);
      case MessageType::kManifest:
      case MessageType::kChain:
      case MessageType::kDeltaChunk:
        return OnReply(*type, message);
      case MessageType::kHeartbeat:
        return;
      default:
        return ProtocolError(std::string(MessageTypeName(*type)) +
                             " is not a message a parent sends");
    }
  }

  // ---- refit: streaming ----------------------------------------------------

  void OnBegin(ByteSpan bytes) {
    auto begin = ParseBegin(bytes);
    if (!begin.ok()) return ProtocolError(begin.status().message());
    if (refit_ && refit_->id == begin->refit_id &&
        !(refit_->phase == Phase::kDone && !committed_last_)) {
      // A replay after a reconnect: what follows is what we lack.
      SendUp(EncodeCredit({static_cast<uint32_t>(options_.config.tree.window), refit_->id}));
      if (refit_->phase == Phase::kStreaming) {
        refit_->prepared_sent = false;
      } else {
        // We committed this refit (with our whole subtree) before our parent
        // restarted: more than prepared; say so, and confirm when it commits.
        Prepared prepared{refit_->id, refit_->reports};
        prepared.nodes.push_back({options_.node_id, refit_->chunk_bytes,
                                  SecondsSince(refit_->start), refit_->partitions_applied});
        SendUp(EncodePrepared(prepared));
      }
      return;
    }
    if (refit_ && refit_->phase != Phase::kDone && refit_->phase != Phase::kStreaming &&
        refit_->local_outcome_done) {
      // Decided and done here; only confirmations from below are outstanding. The
      // parent has moved on (it begins a refit only after the last one ended), so
      // waiting longer would only hold this one up: report what we have.
      log::Info(fmt::format("{}: refit {} begins; reporting refit {} without {} confirmations",
                            options_.node_id, begin->refit_id, refit_->id,
                            Missing(refit_->outcome_children, *refit_)));
      ReportOutcome();
    }
    if (refit_ && refit_->phase != Phase::kDone && refit_->phase != Phase::kStreaming) {
      // The previous delta is still being committed or rolled back (a source that
      // restarted resolves it right before beginning the next): begin after it.
      deferred_begin_.assign(bytes.begin(), bytes.end());
      return;
    }
    if (catch_up_ || Behind(*begin)) {
      // First reach the base everybody else holds; the BEGIN runs after.
      deferred_begin_.assign(bytes.begin(), bytes.end());
      if (!catch_up_) StartCatchUp(begin->base_version, begin->refit_id, /*resolving=*/false);
      return;
    }
    refit_.emplace();
    refit_->id = begin->refit_id;
    refit_->begin = *begin;
    received_on_link_.clear();
    refit_->identity = {begin->base_version, begin->target_version, begin->partition_bytes};
    auto spool = Spool::Open(options_.spool_dir, begin->target_version);
    if (spool.ok()) {
      refit_->spool = std::move(*spool);
    } else {
      LocalFailure(refit_->id, spool.status().WithContext("spool"));
    }
    log::Info(fmt::format("{}: refit {} begins: {} -> {}", options_.node_id, refit_->id,
                          begin->base_version.ShortHex(), begin->target_version.ShortHex()));
    downstream_.BeginRefit(begin->refit_id);
    downstream_.Broadcast(transport::MakeMessage(EncodeBegin(*begin)));
    missing_since_.clear();
    for (const auto& child : downstream_.Missing()) missing_since_[child] = Clock::now();
    const uint64_t id = refit_->id;
    const codec::DeltaIdentity identity = refit_->identity;
    apply_loop_.Post([this, id, identity] {
      apply_ = ApplyState{};
      apply_.refit_id = id;
      Status status;
      if (!replica_->inflight() && replica_->version() == identity.target_version) {
        // Already there (a node that committed this version before a restart, or
        // an empty delta): trivially prepared once the END arrives; its subtree
        // is still checked as usual.
        apply_.at_target = true;
      } else {
        auto applier = replica_->Begin(
            identity, apply::ApplyOptions{options_.apply_threads, /*keep_undo=*/true});
        status = applier.status();
        if (applier.ok()) apply_.applier = std::move(*applier);
      }
      SnapshotJournal();
      loop_.Post([this, id, status] {
        if (!status.ok()) LocalFailure(id, status);
      });
    });
    SendUp(EncodeCredit({static_cast<uint32_t>(options_.config.tree.window), begin->refit_id}));
  }

  void OnChunk(const transport::Message& received) {
    if (refit_ && refit_->phase == Phase::kAborting) {
      // A replay of the refit this node is rolling back (it rejoined): not needed,
      // but its credit keeps the parent's queue, and the decision behind it, moving.
      return SendUp(EncodeCredit({1, refit_->id}));
    }
    if (!refit_) return ProtocolError("CHUNK outside a refit");
    Refit& r = *refit_;
    transport::Message message = received;
    if (FaultPoint("agent.corrupt_chunk")) {  // fault-injection tests: a bit flipped in transit
      auto copy = std::make_shared<std::vector<std::byte>>(*received);
      (*copy)[copy->size() - 1] ^= std::byte{0x10};
      message = copy;
    }
    // Verified before it is forwarded, spooled or applied: a damaged chunk is
    // fetched again (reconnecting makes the parent replay what we lack), never used.
    Status intact = codec::VerifyChunkChecksums(Body(*message));
    auto header = codec::PeekChunkHeader(Body(*message));
    if (!intact.ok() || !header.ok()) {
      log::Warn(fmt::format("{}: a chunk from {} failed its checks ({}); fetching it again",
                            options_.node_id, *self_.parent,
                            (intact.ok() ? header.status() : intact).ToString()));
      ++refetches_;
      return DropParent(Status::Corrupt("damaged chunk"));
    }
    ++r.chunks;
    if (header->kind == codec::ChunkKind::kEnd) r.end_received = true;
    const uint64_t payload = message->size() - kMessageHeaderBytes;
    r.chunk_bytes += payload;
    const bool had_it = (header->identity.target_version == claimed_.target &&
                         claimed_.applied.contains(header->sequence)) ||
                        !received_on_link_.insert(header->sequence).second;
    if (had_it) {
      r.resent_bytes += payload;
      log::Warn(fmt::format("{}: chunk {} of refit {} sent again, though this node had it",
                            options_.node_id, header->sequence, r.id));
    }
    {
      std::lock_guard lock(stats_mu_);
      stats_.chunk_bytes_received += payload;
      if (had_it) stats_.chunk_bytes_resent += payload;
    }
    CrashPoint("agent.chunk_received");
    bool spooled = true;
    if (r.spool) {
      // Into the page cache here, so forwarding waits for no disk; the apply
      // thread makes it durable before the chunk's partitions are touched.
      Status appended = r.spool->Append(header->sequence, *message);
      if (!appended.ok()) {
        spooled = false;
        LocalFailure(r.id, appended.WithContext("spool"));
      }
    }
    HoldChunk(message->size());
    // Released once applied here AND handed to every child: only then does this
    // node have room for another, so only then does the parent get credit.
    auto pending = std::make_shared<int>(2);
    const uint64_t id = r.id;
    const size_t size = message->size();
    auto release = [this, pending, id, size] {
      if (--*pending > 0) return;
      ReleaseChunk(size);
      // Credit is owed whatever the phase: a replay to a node that already finished
      // this refit still has a decision queued behind its chunks.
      if (refit_ && refit_->id == id) SendUp(EncodeCredit({1, id}));
    };
    downstream_.BroadcastChunk(message, {header->identity.target_version, header->sequence},
                               release);
    if (!spooled) return release();  // never applied unless it can be undone from the spool
    const uint32_t sequence = header->sequence;
    apply_loop_.Post([this, message, id, sequence, release, spool = r.spool] {
      const auto t0 = Clock::now();
      // A chunk is on disk in the spool before it changes any partition, so this
      // node can always roll back what it applied from the records themselves.
      Status synced = spool ? spool->Sync() : Status::Ok();
      ApplyResult result;
      if (synced.ok()) {
        result = ApplyOne(id, sequence, message);
      } else {
        result.status = synced;
      }
      result.seconds = SecondsSince(t0);
      loop_.Post([this, id, result, release] {
        release();
        OnChunkApplied(id, result);
      });
    });
  }

  struct ApplyResult {
    Status status;
    bool end = false;
    bool refused = false;  // failed the applier's check before write: fetch it again
    uint64_t applied = 0;
    double seconds = 0;
    std::vector<apply::PartitionKey> torn;  // END only: partitions to repair
    std::vector<PartitionHash> torn_hashes;
    std::vector<uint64_t> torn_lengths;
  };

  // Apply thread: one chunk. Data chunks are flushed and journaled before we
  // count them; END verifies everything (torn partitions are returned for repair).
  ApplyResult ApplyOne(uint64_t id, uint32_t sequence, const transport::Message& message) {
    ApplyResult result;
    if (apply_.refit_id != id) return result;
    if (apply_.at_target) {
      auto header = codec::PeekChunkHeader(Body(*message));
      result.end = header.ok() && header->kind == codec::ChunkKind::kEnd;
      return result;
    }
    if (!apply_.applier) return result;
    auto chunk = codec::ParseChunk(Body(*message));
    if (!chunk.ok()) {
      result.status = chunk.status();
      return result;
    }
    if (chunk->kind == codec::ChunkKind::kEnd) {
      apply_.summary = chunk->summary;
      // A refused chunk is fetched again, and this END replayed behind it.
      if (apply_.applier->HasRefusedChunks()) return result;
      result.end = true;
      return FinishRefit();
    }
    if (replica_->applied_chunks().contains(sequence)) return result;  // journaled before a restart
    result.status = apply_.applier->ApplyChunk(*chunk);
    result.refused = !result.status.ok() && apply_.applier->WasRefused(sequence);
    for (const auto& record : chunk->records) apply_.changed_tensors.emplace(record.tensor_name);
    if (result.status.ok()) result.status = apply_.applier->FlushApplied();
    CrashPoint("agent.apply_flushed");
    if (result.status.ok()) result.status = replica_->RecordApplied(sequence);
    CrashPoint("agent.applied");
    // So a HELLO after a reconnect lists it, and the parent does not send it again.
    if (result.status.ok()) SnapshotJournal();
    std::lock_guard lock(stats_mu_);
    ++stats_.chunks_received;
    return result;
  }

  // Apply thread: after END (and after each repair): verify the whole delta.
  ApplyResult FinishRefit() {
    ApplyResult result;
    result.end = true;
    const codec::DeltaSummary& summary = *apply_.summary;
    if (!summary.target_layout.IsZero() && summary.target_layout != replica_->store().LayoutId()) {
      result.status = Status::Corrupt("the delta's target layout differs from this store's");
      return result;
    }
    auto torn = apply_.applier->torn();
    if (!torn.empty()) {
      for (const auto& key : torn) {
        const auto index = replica_->store().FindTensor(key.tensor);
        const auto& info = replica_->store().tensors()[*index];
        const uint64_t per =
            codec::PartitionElements(info.dtype, apply_.applier->identity().partition_bytes);
        const uint64_t e = ElementSize(info.dtype);
        result.torn.push_back(key);
        result.torn_hashes.push_back(apply_.applier->TornTargetHash(key));
        result.torn_lengths.push_back(std::min(per, info.ElementCount() - key.element_offset) * e);
      }
      return result;
    }
    auto target = apply_.applier->Finish(summary);
    result.status = target.status();
    result.applied = apply_.applier->report().applied;
    if (target.ok()) {
      apply_.target = std::move(*target);
      result.status = replica_->RecordPrepared();
      SnapshotJournal();
    }
    return result;
  }

  void OnChunkApplied(uint64_t id, const ApplyResult& result) {
    if (!refit_ || refit_->id != id) return;
    refit_->apply_seconds += result.seconds;
    if (result.refused) {
      // Well-formed but wrong records: treated like a damaged chunk, never applied.
      log::Warn(fmt::format("{}: {}; fetching the chunk again", options_.node_id,
                            result.status.ToString()));
      ++refetches_;
      return DropParent(Status::Corrupt("refused chunk"));
    }
    if (!result.status.ok()) return LocalFailure(id, result.status);
    if (!result.torn.empty()) return RequestRepairs(result);
    if (result.end && refit_->local_error.ok()) {
      refit_->local_prepared = true;
      refit_->partitions_applied = result.applied;
      MaybePrepared();
    }
  }

  // ---- repair: torn partitions get literal target bytes from up the tree ----

  void RequestRepairs(const ApplyResult& result) {
    for (size_t i = 0; i < result.torn.size(); ++i) {
      const uint64_t request = next_fetch_++;
      fetches_[request] = PendingFetch{"", 0, result.torn[i]};
      log::Warn(fmt::format("{}: partition '{}' at element {} is torn; fetching its target bytes",
                            options_.node_id, result.torn[i].tensor,
                            result.torn[i].element_offset));
      SendUp(EncodeFetch({request, result.torn[i].tensor, result.torn[i].element_offset,
                          result.torn_lengths[i], result.torn_hashes[i]}));
    }
  }

  void OnPartition(ByteSpan bytes) {
    auto p = ParsePartition(bytes);
    if (!p.ok()) return ProtocolError(p.status().message());
    auto it = fetches_.find(p->request_id);
    if (it == fetches_.end()) return;
    PendingFetch fetch = it->second;
    fetches_.erase(it);
    if (!fetch.child.empty()) {  // a relay passing an answer down
      downstream_.SendTo(fetch.child, transport::MakeMessage(EncodePartition(fetch.child_request,
                                                                             p->found, p->bytes)));
      return;
    }
    if (fetch.for_rollback) return OnBaseBytes(fetch, *p);
    if (fetch.for_catch_up) return OnCatchUpBytes(fetch, *p);
    if (!refit_) return;
    refit_->repair_bytes += p->bytes.size();
    if (!p->found)
      return LocalFailure(refit_->id,
                          Status::Unavailable("no node up the tree has the bytes to repair '" +
                                              fetch.key.tensor + "'"));
    auto owned = std::make_shared<std::vector<std::byte>>(p->bytes.begin(), p->bytes.end());
    const uint64_t id = refit_->id;
    apply_loop_.Post([this, id, owned, key = fetch.key] {
      if (apply_.refit_id != id || !apply_.applier) return;
      ApplyResult result;
      result.status = apply_.applier->Repair(key, *owned);
      if (result.status.ok()) {
        std::lock_guard lock(stats_mu_);
        ++stats_.partitions_repaired;
      }
      if (result.status.ok() && apply_.applier->torn().empty() && apply_.summary)
        result = FinishRefit();
      loop_.Post([this, id, result] { OnChunkApplied(id, result); });
    });
  }

  // A child's FETCH: serve it from our store if the partition there has the
  // wanted bytes, else pass it up.
  void OnChildFetch(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetch(bytes);
    if (!f.ok()) return;
    auto fetch = *f;
    apply_loop_.Post([this, child, fetch] {
      const auto index = replica_->store().FindTensor(fetch.tensor);
      std::optional<std::vector<std::byte>> found;
      if (index) {
        const ByteSpan tensor = replica_->store().TensorData(*index);
        const uint64_t e = ElementSize(replica_->store().tensors()[*index].dtype);
        if (fetch.element_offset * e + fetch.byte_length <= tensor.size()) {
          const ByteSpan part = tensor.subspan(fetch.element_offset * e, fetch.byte_length);
          if (HashPartition(part) == fetch.hash) found.emplace(part.begin(), part.end());
        }
      }
      loop_.Post([this, child, fetch, found = std::move(found)] {
        if (found) {
          downstream_.SendTo(
              child, transport::MakeMessage(EncodePartition(fetch.request_id, true, *found)));
          return;
        }
        const uint64_t request = next_fetch_++;
        fetches_[request] =
            PendingFetch{child, fetch.request_id, {fetch.tensor, fetch.element_offset}};
        Fetch up = fetch;
        up.request_id = request;
        SendUp(EncodeFetch(up));
      });
    });
  }

  // ---- requests routed to the source ------------------------------------------

  // A child's FETCH_MANIFEST / FETCH_CHAIN / FETCH_DELTA_CHUNK goes up to the
  // source, the only node that knows the cluster's history; renumbered on the way.
  void RouteUp(const std::string& child, MessageType type, ByteSpan bytes) {
    const uint64_t child_request = RequestIdOf(bytes);
    if (!parent_ || !joined_) {
      downstream_.SendTo(child, transport::MakeMessage(NotFoundReply(type, child_request)));
      return;
    }
    const uint64_t request = next_fetch_++;
    routed_[request] = Routed{child, child_request, type};
    SendUp(WithRequestId(bytes, request));
  }

  static std::vector<std::byte> NotFoundReply(MessageType request_type, uint64_t request_id) {
    switch (request_type) {
      case MessageType::kFetchChain: {
        Chain none;
        none.request_id = request_id;
        return EncodeChain(none);
      }
      case MessageType::kFetchDeltaChunk:
        return EncodeDeltaChunk(request_id, false, {});
      default:
        return EncodeManifest(request_id, false, {});
    }
  }

  // MANIFEST / CHAIN / DELTA_CHUNK from the parent: passed down if routed for a
  // child, else an answer to this node's own catch-up.
  void OnReply(MessageType type, const transport::Message& message) {
    const ByteSpan bytes(*message);
    if (auto it = routed_.find(RequestIdOf(bytes)); it != routed_.end()) {
      downstream_.SendTo(it->second.child,
                         transport::MakeMessage(WithRequestId(bytes, it->second.child_request)));
      routed_.erase(it);
      return;
    }
    if (type == MessageType::kManifest) return OnManifest(bytes);
    if (type == MessageType::kChain) return OnChain(bytes);
    return OnDeltaChunk(message);
  }

  // ---- catch-up: reaching a committed version this node missed ----------------

  // Whether this node holds neither the refit's base nor its target, nor the refit
  // itself in flight: it missed a version the cluster committed.
  bool Behind(const Begin& b) const {
    if (catch_up_failed_refit_ == b.refit_id) return false;  // tried: let BEGIN report it
    if (journal_.inflight) {
      return !(journal_.inflight->base == b.base_version &&
               journal_.inflight->target == b.target_version);
    }
    return journal_.version != b.base_version && journal_.version != b.target_version;
  }

  void StartCatchUp(const Digest128& to, uint64_t refit_id, bool resolving) {
    catch_up_.emplace();
    catch_up_->to = to;
    catch_up_->refit_id = refit_id;
    catch_up_->resolving = resolving;
    catch_up_->start = Clock::now();
    log::Warn(fmt::format(
        "{}: holds {}{} but the cluster committed {}: catching up (by the deltas the source "
        "kept, else by the partitions that differ)",
        options_.node_id, journal_.version.ShortHex(),
        journal_.inflight
            ? " (with a delta to " + journal_.inflight->target.ShortHex() + " left in flight)"
            : "",
        to.ShortHex()));
    PumpCatchUp();
  }

  // Asks for the chain; then keeps kCatchUpWindow chunks of it, or (without a
  // chain) the manifest and then kCatchUpWindow partitions, requested.
  void PumpCatchUp() {
    if (!catch_up_ || !parent_ || !joined_) return;
    CatchUpState& c = *catch_up_;
    if (!c.chain_answered) {
      if (c.chain_request == 0) {
        c.chain_request = next_fetch_++;
        SendUp(EncodeFetchChain({c.chain_request, journal_.version, c.to}));
      }
      return;
    }
    if (c.chain_mode) return PumpChain();
    if (!c.have_manifest) {
      if (c.manifest_request == 0) {
        c.manifest_request = next_fetch_++;
        SendUp(EncodeFetchManifest({c.manifest_request, c.to, journal_.version}));
      }
      return;
    }
    while (c.outstanding < kCatchUpWindow && !c.queue.empty()) {
      const apply::CatchUpPartition part = c.queue.front();
      c.queue.pop_front();
      const uint64_t request = next_fetch_++;
      PendingFetch fetch;
      fetch.key = part.key;
      fetch.hash = part.target_hash;
      fetch.byte_length = part.byte_length;
      fetch.for_catch_up = true;
      fetches_[request] = fetch;
      ++c.outstanding;
      SendUp(EncodeFetch(
          {request, part.key.tensor, part.key.element_offset, part.byte_length, part.target_hash}));
    }
  }

  void OnChain(ByteSpan bytes) {
    auto chain = ParseChain(bytes);
    if (!chain.ok()) return ProtocolError(chain.status().message());
    if (!catch_up_ || chain->request_id != catch_up_->chain_request) return;
    CatchUpState& c = *catch_up_;
    c.chain_request = 0;
    c.chain_answered = true;
    // A delta left in flight is resumed only if it is the chain's first.
    const bool usable =
        chain->found && !chain->links.empty() && chain->links.front().base == journal_.version &&
        chain->links.back().target == c.to &&
        (!journal_.inflight || (journal_.inflight->base == chain->links.front().base &&
                                journal_.inflight->target == chain->links.front().target));
    if (!usable) {
      log::Info(
          fmt::format("{}: no chain of kept deltas from {} to {}: fetching the partitions "
                      "that differ",
                      options_.node_id, journal_.version.ShortHex(), c.to.ShortHex()));
      return PumpCatchUp();
    }
    c.chain_mode = true;
    c.links = chain->links;
    log::Info(fmt::format("{}: catching up by a chain of {} kept deltas", options_.node_id,
                          c.links.size()));
    StartLink(0);
  }

  // Begins (or resumes) applying delta `i` of the chain.
  void StartLink(size_t i) {
    CatchUpState& c = *catch_up_;
    c.link = i;
    c.missing.clear();
    c.pending_chunks.clear();
    c.outstanding = 0;
    c.chunks_done = 0;
    c.end.reset();
    const ChainLink link = c.links[i];
    apply_loop_.Post([this, link] {
      auto applier = replica_->Begin({link.base, link.target, link.partition_bytes},
                                     apply::ApplyOptions{options_.apply_threads});
      std::set<uint32_t> journaled;
      if (applier.ok()) {
        catch_up_applier_ = std::move(*applier);
        journaled = replica_->applied_chunks();
      }
      SnapshotJournal();
      loop_.Post([this, status = applier.status(), journaled] {
        if (!catch_up_ || !catch_up_->chain_mode) return;
        if (!status.ok()) return FallBackToPartitions(status);
        // Chunks applied before a restart are not fetched again.
        CatchUpState& c = *catch_up_;
        for (uint32_t s = 0; s < c.links[c.link].chunks; ++s) {
          if (!journaled.contains(s)) c.missing.insert(s);
        }
        c.chunks_done = static_cast<uint32_t>(c.links[c.link].chunks - c.missing.size());
        PumpChain();
      });
    });
  }

  void PumpChain() {
    if (!parent_ || !joined_) return;  // asked for on the next link (WELCOME)
    CatchUpState& c = *catch_up_;
    const ChainLink& link = c.links[c.link];
    while (c.outstanding < kCatchUpWindow && !c.missing.empty()) {
      const uint32_t sequence = *c.missing.begin();
      c.missing.erase(c.missing.begin());
      const uint64_t request = next_fetch_++;
      c.pending_chunks[request] = sequence;
      ++c.outstanding;
      SendUp(EncodeFetchDeltaChunk({request, link.target, sequence}));
    }
  }

  void OnDeltaChunk(const transport::Message& message) {
    auto reply = ParseDeltaChunk(*message);
    if (!reply.ok()) return ProtocolError(reply.status().message());
    if (!catch_up_ || !catch_up_->chain_mode) return;
    CatchUpState& c = *catch_up_;
    auto it = c.pending_chunks.find(reply->request_id);
    if (it == c.pending_chunks.end()) return;
    const uint32_t sequence = it->second;
    c.pending_chunks.erase(it);
    --c.outstanding;
    const ChainLink link = c.links[c.link];
    if (!reply->found) {
      return FallBackToPartitions(
          Status::Unavailable(fmt::format("the source no longer keeps chunk {} of the delta to {}",
                                          sequence, link.target.ShortHex())));
    }
    // A chunk is checked before it is used: whole, of this delta, the one asked for.
    const ByteSpan chunk_message = reply->bytes;
    auto type = PeekType(chunk_message);
    Status intact = type.ok() && *type == MessageType::kChunk
                        ? codec::VerifyChunkChecksums(Body(chunk_message))
                        : Status::Corrupt("a DELTA_CHUNK that holds no CHUNK");
    auto header = intact.ok() ? codec::PeekChunkHeader(Body(chunk_message))
                              : Result<codec::ChunkHeader>(intact);
    if (!header.ok() || header->sequence != sequence ||
        header->identity.target_version != link.target ||
        header->identity.base_version != link.base) {
      return FallBackToPartitions(Status::Corrupt(fmt::format(
          "chunk {} of the kept delta to {} failed its checks{}", sequence, link.target.ShortHex(),
          header.ok() ? "" : ": " + header.status().message())));
    }
    c.bytes += chunk_message.size();
    auto owned =
        std::make_shared<std::vector<std::byte>>(chunk_message.begin(), chunk_message.end());
    apply_loop_.Post([this, owned, sequence] {
      std::optional<codec::DeltaSummary> end;
      Status status;
      auto chunk = codec::ParseChunk(Body(*owned));
      if (!chunk.ok() || !catch_up_applier_) {
        status =
            chunk.ok() ? Status::Internal("no delta of the chain in progress") : chunk.status();
      } else if (chunk->kind == codec::ChunkKind::kEnd) {
        end = chunk->summary;
      } else {
        status = catch_up_applier_->ApplyChunk(*chunk);
        if (status.ok()) status = catch_up_applier_->FlushApplied();
        if (status.ok()) status = replica_->RecordApplied(sequence);
        if (status.ok()) SnapshotJournal();
        CrashPoint("agent.catch_up_chunk");
      }
      loop_.Post([this, status, end] { OnChainChunkApplied(status, end); });
    });
    PumpChain();
  }

  void OnChainChunkApplied(const Status& status, const std::optional<codec::DeltaSummary>& end) {
    if (!catch_up_ || !catch_up_->chain_mode) return;
    if (!status.ok()) return FallBackToPartitions(status);
    CatchUpState& c = *catch_up_;
    ++c.chunks_done;
    if (end) c.end = end;
    if (c.chunks_done == c.links[c.link].chunks && c.end) FinishLink();
  }

  // Every chunk of the delta applied: verify it whole, make it active, go on.
  void FinishLink() {
    const codec::DeltaSummary summary = *catch_up_->end;
    apply_loop_.Post([this, summary] {
      Status status;
      auto target = catch_up_applier_ ? catch_up_applier_->Finish(summary)
                                      : Result<codec::Manifest>(Status::Internal("no delta"));
      status = target.status();
      if (target.ok()) status = replica_->Commit(*target);
      catch_up_applier_.reset();
      SnapshotJournal();
      loop_.Post([this, status] {
        if (!catch_up_ || !catch_up_->chain_mode) return;
        if (!status.ok()) return FallBackToPartitions(status);
        CatchUpState& c = *catch_up_;
        ++c.deltas;
        if (c.link + 1 < c.links.size()) return StartLink(c.link + 1);
        FinishCatchUp(Status::Ok());
      });
    });
  }

  // The chain cannot finish (a delta no longer kept, a torn partition, a damaged
  // chunk): overwrite what differs instead, from wherever the store stands now.
  void FallBackToPartitions(const Status& why) {
    CatchUpState& c = *catch_up_;
    log::Warn(
        fmt::format("{}: catch-up by the chain of deltas stopped ({}); fetching the "
                    "partitions that differ instead",
                    options_.node_id, why.ToString()));
    c.chain_mode = false;
    c.pending_chunks.clear();
    c.missing.clear();
    c.outstanding = 0;
    apply_loop_.Post([this] { catch_up_applier_.reset(); });
    PumpCatchUp();
  }

  void OnManifest(ByteSpan bytes) {
    auto m = ParseManifest(bytes);
    if (!m.ok()) return ProtocolError(m.status().message());
    if (!catch_up_ || m->request_id != catch_up_->manifest_request) return;
    catch_up_->manifest_request = 0;
    const Digest128 to = catch_up_->to;
    if (!m->found) {
      return FinishCatchUp(Status::Unavailable(
          "the source does not serve version " + to.ShortHex() + " to a node at " +
          journal_.version.ShortHex() +
          " (not a version this cluster committed, or no source is publishing)"));
    }
    auto manifest = codec::Manifest::Parse(m->bytes);
    if (!manifest.ok() || manifest->VersionId() != to) {
      return FinishCatchUp(Status::Corrupt(
          "the parent answered with a manifest that is not version " + to.ShortHex() +
          (manifest.ok() ? " (it is " + manifest->VersionId().ShortHex() + ")"
                         : ": " + manifest.status().message())));
    }
    catch_up_->have_manifest = true;
    apply_loop_.Post([this, target = std::move(*manifest)] {
      auto begun = replica_->BeginCatchUp(target, apply::ApplyOptions{options_.apply_threads});
      std::vector<apply::CatchUpPartition> parts;
      if (begun.ok()) {
        catch_up_applier_ = std::move(begun->applier);
        parts = std::move(begun->partitions);
      }
      SnapshotJournal();
      loop_.Post([this, status = begun.status(), parts] {
        if (!catch_up_) return;
        if (!status.ok()) return FinishCatchUp(status);
        catch_up_->total = parts.size();
        catch_up_->queue.assign(parts.begin(), parts.end());
        log::Info(fmt::format("{}: {} partitions differ from {}", options_.node_id, parts.size(),
                              catch_up_->to.ShortHex()));
        if (parts.empty()) return CommitCatchUp();
        PumpCatchUp();
      });
    });
  }

  void OnCatchUpBytes(const PendingFetch& fetch, const PartitionData& data) {
    if (!catch_up_) return;
    --catch_up_->outstanding;
    if (!data.found) {
      return FinishCatchUp(Status::Unavailable(
          fmt::format("no node up the tree has partition '{}' at element {} of version {}",
                      fetch.key.tensor, fetch.key.element_offset, catch_up_->to.ShortHex())));
    }
    catch_up_->bytes += data.bytes.size();
    auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
    apply_loop_.Post([this, owned, fetch] {
      // Verified against the hash the manifest gives before a byte is written.
      Status written = catch_up_applier_
                           ? catch_up_applier_->WriteVerified(fetch.key, *owned, fetch.hash)
                           : Status::Internal("no catch-up in progress");
      CrashPoint("agent.catch_up_partition");
      loop_.Post([this, written] {
        if (!catch_up_) return;
        if (!written.ok()) return FinishCatchUp(written.WithContext("catch-up"));
        if (++catch_up_->written == catch_up_->total) CommitCatchUp();
      });
    });
    PumpCatchUp();
  }

  // Every differing partition written: the store must now hash to the target.
  void CommitCatchUp() {
    apply_loop_.Post([this] {
      Status status = replica_->CommitFromStore();
      catch_up_applier_.reset();
      SnapshotJournal();
      loop_.Post([this, status] { FinishCatchUp(status); });
    });
  }

  void FinishCatchUp(const Status& status) {
    if (!catch_up_) return;
    const CatchUpState c = std::move(*catch_up_);
    catch_up_.reset();
    std::erase_if(fetches_, [](const auto& entry) { return entry.second.for_catch_up; });
    if (status.ok()) {
      log::Info(fmt::format(
          "{}: caught up to {}: {} kept deltas and {} partitions, {:.2f} MiB fetched in {:.2f} s",
          options_.node_id, c.to.ShortHex(), c.deltas, c.written, double(c.bytes) / (1 << 20),
          SecondsSince(c.start)));
      std::lock_guard lock(stats_mu_);
      stats_.partitions_caught_up += c.written;
      stats_.deltas_caught_up += c.deltas;
      stats_.catch_up_bytes += c.bytes;
    } else {
      log::Error(fmt::format("{}: catch-up to {} failed: {}", options_.node_id, c.to.ShortHex(),
                             status.ToString()));
      catch_up_failed_refit_ = c.refit_id;
      apply_loop_.Post([this] { catch_up_applier_.reset(); });
    }
    if (c.resolving) return OnLocalOutcome(c.refit_id, status, journal_.version);
    if (!deferred_begin_.empty()) {
      const std::vector<std::byte> begin = std::move(deferred_begin_);
      deferred_begin_.clear();
      loop_.Post([this, begin] { OnBegin(begin); });
    }
  }

  void LocalFailure(uint64_t id, const Status& status) {
    if (!refit_ || refit_->id != id || !refit_->local_error.ok()) return;
    refit_->local_error = status;
    log::Error(fmt::format("{}: refit {} cannot reach the target: {}", options_.node_id, id,
                           status.ToString()));
    SendFailed(Failed{id, options_.node_id, status.ToString()});
  }

  void SendFailed(const Failed& failed) {
    if (!refit_ || refit_->failed_sent) return;
    refit_->failed_sent = true;
    SendUp(EncodeFailed(failed));
  }

  // Children the refit still waits for: planned ones neither in `done` nor
  // excused, and adopted ones connected now that are not in `done`.
  size_t Missing(const std::set<std::string>& done, const Refit& r) const {
    size_t missing = 0;
    for (const auto& c : self_.children) {
      missing += !done.contains(c) && !r.excused.contains(c) && !r.not_waited.contains(c);
    }
    for (const auto& c : adopted_) missing += !done.contains(c);
    return missing;
  }

  void MaybePrepared() {
    Refit& r = *refit_;
    if (r.prepared_sent || !r.local_prepared || !r.local_error.ok()) return;
    if (Missing(r.prepared_children, r) > 0 && r.phase == Phase::kStreaming) return;
    r.prepared_sent = true;
    Prepared prepared{r.id, r.reports};
    prepared.nodes.push_back(
        {options_.node_id, r.chunk_bytes, SecondsSince(r.start), r.partitions_applied});
    SendUp(EncodePrepared(prepared));
    CrashPoint("agent.prepared");
    if (r.pending_decision) {
      const MessageType decision = *r.pending_decision;
      r.pending_decision.reset();
      Decide(decision);
    }
  }

  // ---- children ------------------------------------------------------------

  // A child (re)joined. If it missed part of the current refit, queue for it:
  // BEGIN, the spooled chunks it has not applied, and the decision if one was made.
  void OnChildJoined(const std::string& child, const Hello& hello) {
    missing_since_.erase(child);
    if (downstream_.IsAdopted(child)) {
      adopted_.insert(child);
      log::Info(
          fmt::format("{}: adopted {}, whose parent is unreachable", options_.node_id, child));
    }
    if (!refit_) return;
    Refit& r = *refit_;
    r.away_until.erase(child);
    if (r.resolution) {
      if (hello.inflight_target == r.identity.target_version) {
        const MessageType decision =
            r.phase == Phase::kCommitting || (r.phase == Phase::kDone && committed_last_)
                ? MessageType::kCommit
                : MessageType::kAbort;
        downstream_.Requeue(child,
                            {Downstream::Outgoing::Control(transport::MakeMessage(
                                EncodeDecision(decision, {r.id, r.identity.target_version})))});
      }
      return;
    }
    const bool same_delta = hello.inflight_target == r.identity.target_version;
    if (!same_delta && hello.active_version == r.identity.target_version &&
        (r.phase == Phase::kCommitting || (r.phase == Phase::kDone && committed_last_))) {
      // It committed, then lost the link before confirming: COMMIT again makes it
      // gather its subtree's confirmations and answer.
      downstream_.Requeue(
          child, {Downstream::Outgoing::Control(transport::MakeMessage(
                     EncodeDecision(MessageType::kCommit, {r.id, r.identity.target_version})))});
      return;
    }
    if (!same_delta && r.phase == Phase::kDone && !committed_last_) return;  // nothing to undo
    std::vector<Downstream::Outgoing> backlog;
    backlog.push_back(Downstream::Outgoing::Control(transport::MakeMessage(EncodeBegin(r.begin))));
    const std::set<uint32_t> applied(hello.applied_chunks.begin(), hello.applied_chunks.end());
    uint64_t replayed = 0;
    if (r.spool) {
      for (uint32_t sequence : r.spool->sequences()) {
        if (same_delta && applied.contains(sequence)) continue;
        Spool* spool = r.spool.get();
        backlog.push_back(
            Downstream::Outgoing::Chunk([spool, sequence] { return spool->Read(sequence); },
                                        {r.identity.target_version, sequence}));
        ++replayed;
      }
    }
    if (r.phase == Phase::kCommitting || r.phase == Phase::kDone) {
      if (r.phase == Phase::kDone && !committed_last_) {
        backlog.push_back(Downstream::Outgoing::Control(transport::MakeMessage(
            EncodeDecision(MessageType::kAbort, {r.id, r.identity.target_version}))));
      } else {
        backlog.push_back(Downstream::Outgoing::Control(transport::MakeMessage(
            EncodeDecision(MessageType::kCommit, {r.id, r.identity.target_version}))));
      }
    } else if (r.phase == Phase::kAborting) {
      backlog.push_back(Downstream::Outgoing::Control(transport::MakeMessage(
          EncodeDecision(MessageType::kAbort, {r.id, r.identity.target_version}))));
    }
    log::Info(fmt::format("{}: child {} rejoined during refit {}: replaying {} chunks it lacks",
                          options_.node_id, child, r.id, replayed));
    r.prepared_children.erase(child);
    downstream_.Requeue(child, std::move(backlog));
  }

  // A lost child is waited for: it rejoins and resumes. Only if it stays away
  // longer than the connect timeout does FAILED go up (Tick).
  void OnChildLost(const std::string& child, const Status& why) {
    (void)why;
    if (adopted_.erase(child)) {
      if (refit_) MaybePrepared();
      return;  // not ours to wait for
    }
    if (!refit_) return;
    if (refit_->phase == Phase::kStreaming) missing_since_[child] = Clock::now();
    if ((refit_->phase == Phase::kCommitting || refit_->phase == Phase::kAborting) &&
        !refit_->outcome_children.contains(child)) {
      // Like the source: waited for up to the connect timeout to rejoin and confirm.
      refit_->away_until[child] = Clock::now() + options_.config.tree.connect_timeout;
    }
  }

  // After a decision: planned children that are not connected are waited for
  // until `grace` from now, then learn the decision when they are back.
  void AwaitAbsentChildren(std::chrono::milliseconds grace) {
    Refit& r = *refit_;
    for (const auto& child : downstream_.Missing()) {
      if (!r.excused.contains(child) && !r.outcome_children.contains(child))
        r.away_until[child] = Clock::now() + grace;
    }
  }

  void GiveUpOnAwayChildren(Clock::time_point now) {
    Refit& r = *refit_;
    bool gave_up = false;
    for (auto it = r.away_until.begin(); it != r.away_until.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      log::Warn(
          fmt::format("{}: child {} is away; it learns the decision of refit {} when it is back",
                      options_.node_id, it->first, r.id));
      r.not_waited.insert(it->first);
      it = r.away_until.erase(it);
      gave_up = true;
    }
    if (gave_up) MaybeOutcome();
  }

  void OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes) {
    if (type == MessageType::kFetch) return OnChildFetch(child, bytes);
    if (type == MessageType::kFetchManifest || type == MessageType::kFetchChain ||
        type == MessageType::kFetchDeltaChunk) {
      return RouteUp(child, type, bytes);
    }
    if (!refit_) return;
    Refit& r = *refit_;
    switch (type) {
      case MessageType::kPrepared: {
        auto p = ParsePrepared(bytes);
        if (!p.ok() || p->refit_id != r.id) return;
        if (r.prepared_children.insert(child).second) {
          std::erase_if(r.reports, [&](const NodeReport& n) {
            return std::any_of(p->nodes.begin(), p->nodes.end(),
                               [&](const NodeReport& m) { return m.node_id == n.node_id; });
          });
          r.reports.insert(r.reports.end(), p->nodes.begin(), p->nodes.end());
        }
        return MaybePrepared();
      }
      case MessageType::kFailed: {
        auto f = ParseFailed(bytes);
        if (!f.ok() || f->refit_id != r.id) return;
        if (options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable &&
            f->node_id == child && r.phase == Phase::kStreaming) {
          // Like an absent child: the version goes on without it (and its subtree),
          // which catches up at a later refit. Its own log says why it failed.
          log::Warn(
              fmt::format("{}: child {} cannot reach the target ({}); refit {} goes on "
                          "without it (commit policy available)",
                          options_.node_id, child, f->reason, r.id));
          r.excused.insert(child);
          downstream_.Excuse(child);
          missing_since_.erase(child);
          return MaybePrepared();
        }
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
    if (type == MessageType::kCommit && journal_.version == d->target_version &&
        !journal_.inflight) {
      if (refit_ && refit_->id == d->refit_id && refit_->phase == Phase::kDone) {
        // A repeated COMMIT: confirm again.
        SendUp(EncodeOutcome(MessageType::kCommitted, {d->refit_id, 1 + refit_->outcome_nodes}));
        return;
      }
      if (!refit_ || refit_->id != d->refit_id) {
        // We committed before a restart and never confirmed: our subtree's
        // confirmations were lost with us, so gather them again.
        refit_.emplace();
        refit_->id = d->refit_id;
        refit_->identity.target_version = d->target_version;
        refit_->phase = Phase::kCommitting;
        refit_->decided = Clock::now();
        refit_->local_outcome_done = true;
        {
          std::lock_guard lock(stats_mu_);
          stats_.version = journal_.version;
        }
        downstream_.Broadcast(transport::MakeMessage(EncodeDecision(MessageType::kCommit, *d)));
        // Our children's links died with our previous life: one that is not back
        // within the time a child keeps trying us has failed over (and confirmed
        // there) or is down, and learns the decision when it is back.
        AwaitAbsentChildren(kFailoverAfter);
        MaybeOutcome();
        return;
      }
    }
    if (!refit_ || refit_->id != d->refit_id) {
      if (journal_.inflight && journal_.inflight->target == d->target_version)
        return Resolve(type, *d);
      log::Debug(fmt::format("{}: ignoring {} of refit {}, which is not ours", options_.node_id,
                             MessageTypeName(type), d->refit_id));
      return;
    }
    Refit& r = *refit_;
    if (r.phase != Phase::kStreaming) return;  // a duplicate
    if (type == MessageType::kCommit && !r.prepared_sent) {
      // Replayed right behind the chunks we lacked: decide once they are applied.
      if (r.end_received) {
        r.pending_decision = type;
        return;
      }
      // Every chunk the parent sends comes before its decision, and the END did
      // not: the parent resolved a delta it does not hold whole (it was down
      // while the refit committed). Reach the target the way Resolve does.
      return CommitByCatchingUp(*d);
    }
    Decide(type);
  }

  // The delta of the current refit committed, but this node cannot finish it from
  // the chunks its parent has: it tells its children and catches up to the target
  // (by the kept deltas, else by the partitions that differ).
  void CommitByCatchingUp(const Decision& d) {
    Refit& r = *refit_;
    log::Warn(fmt::format(
        "{}: refit {} committed, but not every chunk of it reached this node; catching up",
        options_.node_id, r.id));
    r.phase = Phase::kCommitting;
    r.decided = Clock::now();
    r.resolution = true;  // a child that rejoins is sent the decision, not the delta
    downstream_.DropQueued();
    downstream_.Broadcast(transport::MakeMessage(EncodeDecision(MessageType::kCommit, d)));
    AwaitAbsentChildren(options_.config.tree.connect_timeout);
    apply_loop_.Post([this] { apply_ = ApplyState{}; });  // the catch-up resumes the delta
    if (!catch_up_) return StartCatchUp(d.target_version, r.id, /*resolving=*/true);
    catch_up_->refit_id = r.id;
    catch_up_->resolving = true;
  }

  // The outcome of a delta this node had in flight from an earlier refit (it
  // restarted, or the source died before deciding): commit it if the source
  // committed it, else roll it back (presumed abort). Children in the same state
  // learn it from us. A BEGIN that arrives meanwhile waits (OnBegin).
  void Resolve(MessageType type, const Decision& d) {
    log::Info(fmt::format("{}: delta {} -> {} left in flight is resolved: {}", options_.node_id,
                          journal_.inflight->base.ShortHex(), d.target_version.ShortHex(),
                          MessageTypeName(type)));
    refit_.emplace();
    refit_->id = d.refit_id;
    refit_->identity = {journal_.inflight->base, d.target_version, 0};
    refit_->decided = Clock::now();
    refit_->resolution = true;
    downstream_.DropQueued();
    downstream_.Broadcast(transport::MakeMessage(EncodeDecision(type, d)));
    AwaitAbsentChildren(options_.config.tree.connect_timeout);
    const uint64_t id = d.refit_id;
    if (type == MessageType::kCommit && !journal_.prepared) {
      // It committed without us: reach it by fetching what differs.
      refit_->phase = Phase::kCommitting;
      if (!catch_up_) return StartCatchUp(d.target_version, id, /*resolving=*/true);
      // Already catching up (to this version or past it): report when it is done.
      catch_up_->refit_id = id;
      catch_up_->resolving = true;
      return;
    }
    if (type == MessageType::kCommit) {
      refit_->phase = Phase::kCommitting;
      apply_loop_.Post([this, id] {
        Status status =
            replica_->prepared()
                ? replica_->CommitFromStore()
                : Status::FailedPrecondition("told to commit a delta it never prepared");
        SnapshotJournal();
        loop_.Post([this, id, status, version = replica_->version()] {
          OnLocalOutcome(id, status, version);
        });
      });
      return;
    }
    refit_->phase = Phase::kAborting;
    auto spool = Spool::Open(options_.spool_dir, d.target_version);
    RollBack(id, spool.ok() ? std::shared_ptr<Spool>(std::move(*spool)) : nullptr);
  }

  void Decide(MessageType type) {
    Refit& r = *refit_;
    if (type == MessageType::kCommit) {
      r.phase = Phase::kCommitting;
      r.decided = Clock::now();
      downstream_.Broadcast(transport::MakeMessage(
          EncodeDecision(MessageType::kCommit, {r.id, r.identity.target_version})));
      AwaitAbsentChildren(options_.config.tree.connect_timeout);
      const uint64_t id = r.id;
      apply_loop_.Post([this, id] {
        CrashPoint("agent.commit");
        Status status = apply_.at_target ? Status::Ok()
                        : apply_.target  ? replica_->Commit(*apply_.target)
                                         : Status::Internal("commit without a verified target");
        CommitEvent event{id,
                          replica_->version(),
                          {apply_.changed_tensors.begin(), apply_.changed_tensors.end()}};
        apply_ = ApplyState{};
        SnapshotJournal();
        CrashPoint("agent.committed");
        if (status.ok() && options_.on_commit) options_.on_commit(event);
        loop_.Post(
            [this, id, status, version = event.version] { OnLocalOutcome(id, status, version); });
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
    downstream_.Broadcast(transport::MakeMessage(
        EncodeDecision(MessageType::kAbort, {r.id, r.identity.target_version})));
    AwaitAbsentChildren(options_.config.tree.connect_timeout);
    RollBack(r.id, r.spool);
  }

  // Returns the replica to the base of its in-flight delta: first the in-memory
  // undo of this run, then the delta's own records from the spool (which also
  // covers what a previous run applied), then base bytes fetched from up the tree
  // for whatever neither could restore. Reports through OnLocalOutcome(id, ...).
  void RollBack(uint64_t id, std::shared_ptr<Spool> spool) {
    apply_loop_.Post([this, id, spool] {
      CrashPoint("agent.abort");
      auto needs = RevertFromSpool(spool);
      if (!needs.ok() || needs->empty()) return FinishRollback(id, needs.status());
      loop_.Post([this, id, needs = *needs] {
        for (const auto& n : needs) {
          const uint64_t request = next_fetch_++;
          PendingFetch fetch{"", 0, n.key, id, n.base_hash, true};
          fetch.byte_length = n.byte_length;
          fetches_[request] = fetch;
          ++base_fetches_outstanding_;
          SendUp(EncodeFetch(
              {request, n.key.tensor, n.key.element_offset, n.byte_length, n.base_hash}));
        }
        // Fault-injection tests: the parent link breaks while base bytes are awaited.
        if (FaultPoint("agent.rollback_link_lost")) {
          log::Warn(
              fmt::format("{}: fault injection: link lost during a rollback", options_.node_id));
          DropParent(Status::Unavailable("fault injection: link lost during a rollback"));
        }
      });
    });
  }

  // Apply thread.
  Result<std::vector<apply::DeltaApplier::NeedsBase>> RevertFromSpool(
      const std::shared_ptr<Spool>& spool) {
    std::vector<apply::DeltaApplier::NeedsBase> needs;
    if (!replica_->inflight()) return needs;  // nothing applied: nothing to undo
    RETURN_IF_ERROR(replica_->BeginRollback());
    if (apply_.applier)
      (void)apply_.applier->Rollback();  // best effort: the records below finish the job
    if (!spool) return Status::FailedPrecondition("no spool to roll back from");
    for (uint32_t sequence : spool->sequences()) {
      ASSIGN_OR_RETURN(transport::Message message, spool->Read(sequence));
      ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(Body(*message)));
      if (chunk.kind != codec::ChunkKind::kData) continue;
      if (!apply_.applier) {
        ASSIGN_OR_RETURN(
            apply_.applier,
            replica_->Begin(chunk.identity, apply::ApplyOptions{options_.apply_threads}));
      }
      RETURN_IF_ERROR(apply_.applier->RevertChunk(chunk, needs));
    }
    return needs;
  }

  // Apply thread: the last step of a rollback.
  void FinishRollback(uint64_t id, Status status) {
    if (status.ok()) status = replica_->FinishAbort();
    apply_ = ApplyState{};
    SnapshotJournal();
    loop_.Post(
        [this, id, status, version = replica_->version()] { OnLocalOutcome(id, status, version); });
  }

  // Loop thread: base bytes for a rollback arrived.
  void OnBaseBytes(const PendingFetch& fetch, const PartitionData& data) {
    auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
    const bool found = data.found;
    const bool last = --base_fetches_outstanding_ == 0;
    apply_loop_.Post([this, fetch, owned, found, last] {
      Status status = !found ? Status::Unavailable("no node up the tree has the base bytes of '" +
                                                   fetch.key.tensor + "'")
                      : apply_.applier
                          ? apply_.applier->WriteVerified(fetch.key, *owned, fetch.hash)
                          : Status::Internal("rollback without an applier");
      if (!status.ok()) rollback_error_ = status;
      if (last) {
        Status result = rollback_error_;
        rollback_error_ = Status::Ok();
        FinishRollback(fetch.refit_id, result);
      }
    });
  }

  // After a reconnect: the base bytes a rollback was still waiting for.
  void RefetchBaseBytes() {
    if (!parent_ || !joined_) return;
    log::Info(fmt::format("{}: asking again for {} partitions' base bytes for the rollback",
                          options_.node_id, lost_base_fetches_.size()));
    for (const PendingFetch& fetch : lost_base_fetches_) {
      const uint64_t request = next_fetch_++;
      fetches_[request] = fetch;
      SendUp(EncodeFetch(
          {request, fetch.key.tensor, fetch.key.element_offset, fetch.byte_length, fetch.hash}));
    }
    lost_base_fetches_.clear();
  }

  void OnLocalOutcome(uint64_t id, const Status& status, const Digest128& version) {
    if (!refit_ || refit_->id != id) return;
    if (!status.ok()) {
      log::Error(fmt::format("{}: refit {}: {} failed locally: {}", options_.node_id, id,
                             refit_->phase == Phase::kCommitting ? "commit" : "rollback",
                             status.ToString()));
    }
    refit_->local_outcome_done = true;
    claimed_ = {};  // committed or rolled back: what it had applied of the delta is moot
    {
      std::lock_guard lock(stats_mu_);
      stats_.version = version;
    }
    MaybeOutcome();
  }

  void MaybeOutcome() {
    Refit& r = *refit_;
    if (!r.local_outcome_done || r.phase == Phase::kDone) return;
    // The next refit's BEGIN is waiting: the parent has moved on (see OnBegin).
    if (!deferred_begin_.empty()) return ReportOutcome();
    if (Missing(r.outcome_children, r) > 0 &&
        !(r.phase == Phase::kAborting && !downstream_.AllConnected())) {
      return;
    }
    ReportOutcome();
  }

  void ReportOutcome() {
    Refit& r = *refit_;
    if (r.phase == Phase::kDone) return;
    const bool committed = r.phase == Phase::kCommitting;
    committed_last_ = committed;
    r.phase = Phase::kDone;
    // Counted before the parent hears it, so stats() agrees with what the source reports.
    const NodeAgentStats s = [&] {
      std::lock_guard lock(stats_mu_);
      (committed ? stats_.refits_committed : stats_.refits_aborted)++;
      return stats_;
    }();
    SendUp(EncodeOutcome(committed ? MessageType::kCommitted : MessageType::kAborted,
                         {r.id, 1 + r.outcome_nodes}));
    if (!deferred_begin_.empty()) {
      const std::vector<std::byte> begin = std::move(deferred_begin_);
      deferred_begin_.clear();
      loop_.Post([this, begin] { OnBegin(begin); });
    }
    log::Info(fmt::format(
        "{}: refit {} {}: version {}, received {} B ({:.2f} MiB) in {} chunks, resent {} B, "
        "refetched {}, repair {} B, {} partitions applied, apply {:.2f} s, total {:.2f} s, peak "
        "held {:.2f} MiB, {} children",
        options_.node_id, r.id, committed ? "committed" : "aborted", s.version.ShortHex(),
        r.chunk_bytes, double(r.chunk_bytes) / (1 << 20), r.chunks, r.resent_bytes, refetches_,
        r.repair_bytes, r.partitions_applied, r.apply_seconds, SecondsSince(r.start),
        double(s.peak_held_bytes) / (1 << 20), self_.children.size()));
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
  std::string parent_address_;  // of current_parent_
  std::string parent_backend_;  // the backend the parent link runs over
  std::string listen_address_;
  static constexpr std::chrono::milliseconds kFailoverAfter{3000};

  // Loop-thread state.
  std::unique_ptr<transport::Connection> parent_;
  std::string current_parent_;  // the planned parent, or its failover parent
  std::optional<Clock::time_point> parent_lost_at_;
  Clock::time_point next_primary_try_ = Clock::now();
  std::set<std::string> adopted_;  // grandchildren attached here because their parent died
  uint64_t parent_serial_ = 0;
  bool connecting_ = false;
  bool joined_ = false;
  Clock::time_point next_connect_ = Clock::now();
  Clock::time_point next_heartbeat_ = Clock::now();
  Clock::time_point last_from_parent_ = Clock::now();
  std::chrono::milliseconds backoff_{100};
  std::optional<Refit> refit_;
  bool committed_last_ = false;
  std::vector<std::byte> deferred_begin_;  // a BEGIN that arrived while resolving
  Journal journal_;
  std::map<uint64_t, PendingFetch> fetches_;
  // Requests passed up for children: our request id -> who asked.
  struct Routed {
    std::string child;
    uint64_t child_request = 0;
    MessageType type = MessageType::kFetchManifest;
  };
  std::map<uint64_t, Routed> routed_;
  std::optional<CatchUpState> catch_up_;
  std::unique_ptr<apply::DeltaApplier> catch_up_applier_;  // apply thread
  uint64_t catch_up_failed_refit_ = 0;  // its BEGIN then runs (and fails) as usual
  uint64_t next_fetch_ = 1;
  size_t base_fetches_outstanding_ = 0;
  std::vector<PendingFetch> lost_base_fetches_;  // a rollback's, from a link that dropped
  Status rollback_error_;                        // apply thread
  uint64_t held_bytes_ = 0;
  uint64_t refetches_ = 0;                                  // damaged chunks fetched again
  std::map<std::string, Clock::time_point> missing_since_;  // children absent during a refit
  // What the last HELLO said this node had applied, so chunks a parent sends
  // anyway are counted (stats_.chunk_bytes_resent), and what the current parent
  // link has carried in this refit.
  struct Claimed {
    Digest128 target;
    std::set<uint32_t> applied;
  };
  Claimed claimed_;
  std::set<uint32_t> received_on_link_;

  ApplyState apply_;  // apply-thread state

  mutable std::mutex stats_mu_;
  NodeAgentStats stats_;
  std::atomic<bool> stopped_{false};
  bool owns_spool_dir_ = false;  // a per-process temporary directory, removed on Stop

  // Declared last: constructed after, and stopped before, everything they use.
  EventLoop apply_loop_;
  EventLoop loop_;
  Downstream downstream_;
};

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
const std::string& NodeAgent::listen_address() const { return impl_->listen_address(); }

}  // namespace deltacast::agent

#include "agent/publisher.h"

#include <fmt/core.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "agent/delta_history.h"
#include "agent/downstream.h"
#include "agent/event_loop.h"
#include "agent/spool.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "codec/chunk.h"
#include "common/crash_point.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/parallel.h"
#include "topology/tree_plan.h"
#include "transport/transport_set.h"

namespace deltacast::agent {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Appends the decision before it is sent, so it survives a crash of the source
// before any node hears it.
Status RecordDecision(const std::filesystem::path& path, const std::string& line) {
  if (path.empty()) return Status::Ok();
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  return AppendLineDurably(path, line);
}

// One line of the decision log: "refit ID BASE TARGET COMMIT|ABORT" (hex versions).
struct LoggedDecision {
  uint64_t refit_id = 0;
  std::string base, target;
  bool commit = false;
};

// Every decision in the log, oldest first; none if it cannot be read.
std::vector<LoggedDecision> ReadDecisions(const std::filesystem::path& log) {
  std::vector<LoggedDecision> out;
  auto bytes = ReadFile(log, uint64_t{64} << 20);
  if (!bytes.ok()) return out;
  std::istringstream lines{std::string(AsChars(*bytes))};
  std::string word, decision;
  LoggedDecision d;
  while (lines >> word >> d.refit_id >> d.base >> d.target >> decision) {
    if (word != "refit") continue;
    d.commit = decision == "COMMIT";
    out.push_back(d);
  }
  return out;
}

// The decision recorded for the delta to `target`, if any: (refit id, COMMIT?).
std::optional<std::pair<uint64_t, bool>> RecordedDecision(const std::filesystem::path& log,
                                                          const Digest128& target) {
  std::optional<std::pair<uint64_t, bool>> found;
  for (const LoggedDecision& d : ReadDecisions(log)) {
    if (d.target == target.ToHex()) found = std::pair{d.refit_id, d.commit};
  }
  return found;
}

// Whether `version` is one this cluster committed: the base of its first committed
// refit (where the cluster started) or the target of any committed refit, per the
// decision log; with nothing committed yet, only the current base. A base the
// trainer published from that never committed (an aborted target) is not.
bool InLineage(const std::vector<LoggedDecision>& decisions, const Digest128& base,
               const Digest128& version) {
  const std::string hex = version.ToHex();
  bool committed_any = false;
  for (const LoggedDecision& d : decisions) {
    if (!d.commit) continue;
    if ((!committed_any && d.base == hex) || d.target == hex) return true;
    committed_any = true;
  }
  return !committed_any && version == base;
}

// The source's side of one refit. State shared between the encoding (calling)
// thread and the loop thread is guarded by mu_.
class Publication {
 public:
  Publication(const PublishOptions& options, std::vector<std::string> children,
              const apply::WeightStore& base, const apply::WeightStore& target,
              const Digest128& target_version)
      : options_(options),
        children_(children.begin(), children.end()),
        base_(base),
        target_(target),
        target_version_(target_version),
        loop_([this] { Tick(); }),
        downstream_(loop_, options.config.Source()->id, std::move(children), options.token,
                    Events()) {
    if (!options.history_dir.empty() && options.keep_deltas > 0) {
      history_ = std::make_unique<DeltaHistory>(options.history_dir, options.keep_deltas);
    }
  }

  // Grandchildren whose parent died may attach here (failover, policy available).
  void AllowAdoption(std::set<std::string> ids) { downstream_.AllowAdoption(std::move(ids)); }

  // The manifests a catching-up node may ask for (FETCH_MANIFEST). Call before Listen.
  void ServeManifests(const codec::Manifest& base, const codec::Manifest& target) {
    manifests_ = {{base.VersionId(), base.Serialize()}, {target.VersionId(), target.Serialize()}};
  }

  ~Publication() { Stop(); }

  Status Listen(transport::Transport& transport) {
    transport_ = &transport;
    loop_.Start();
    const auto* me = options_.config.Source();
    auto bound = transport.Listen(
        me->host + ":" + std::to_string(me->port),
        [this](std::unique_ptr<transport::Connection> c) {
          auto holder = std::make_shared<std::unique_ptr<transport::Connection>>(std::move(c));
          loop_.Post([this, holder] { downstream_.Accept(std::move(*holder)); });
        });
    if (!bound.ok()) return bound.status().WithContext("source cannot listen");
    if (auto* set = transport::AsTransportSet(&transport)) {
      loop_.Post([this, names = set->Accepting()] { downstream_.SetTransports(names); });
    }
    log::Info(fmt::format("source {} listening on {}", me->id, *bound));
    return Status::Ok();
  }

  Status WaitForChildren() {
    std::unique_lock lock(mu_);
    const bool all = cv_.wait_for(lock, options_.config.tree.connect_timeout,
                                  [&] { return joined_.size() == children_.size(); });
    if (all) return Status::Ok();
    std::string missing;
    for (const auto& c : children_) {
      if (!joined_.contains(c)) missing += (missing.empty() ? "" : ", ") + c;
    }
    if (options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable &&
        (!joined_.empty() || !adopted_.empty())) {
      log::Warn(
          "children did not join; the refit goes on without them (commit policy available): " +
          missing);
      for (const auto& c : children_) {
        if (joined_.contains(c)) continue;
        excused_.insert(c);
        loop_.Post([this, c] { downstream_.Excuse(c); });
      }
      return Status::Ok();
    }
    return Status::Unavailable("children did not join within " +
                               std::to_string(options_.config.tree.connect_timeout.count()) +
                               " ms: " + missing);
  }

  PublishReport Run(const apply::WeightStore& base, const codec::Manifest& base_manifest,
                    const apply::WeightStore& target, const codec::Manifest& target_manifest) {
    PublishReport report;
    report.base_version = base_manifest.VersionId();
    report.target_version = target_manifest.VersionId();
    uint64_t refit_id = 0;
    RAND_bytes(reinterpret_cast<unsigned char*>(&refit_id), sizeof refit_id);
    // Per process by default: Spool::Open clears other deltas' spools in its folder.
    if (options_.spool_dir.empty()) {
      own_spool_dir_ = std::filesystem::temp_directory_path() /
                       ("deltacast-source-spool-" + std::to_string(::getpid()));
    }
    const auto spool_dir = own_spool_dir_.empty() ? options_.spool_dir : own_spool_dir_;
    auto spool = Spool::Open(spool_dir, report.target_version);
    if (spool.ok()) {
      spool_ = std::move(*spool);
    } else {
      log::Warn("no spool (" + spool.status().ToString() +
                "); children that rejoin cannot be replayed to");
    }
    const auto start = Clock::now();
    const Begin begin{refit_id, report.base_version, report.target_version,
                      target_manifest.partition_bytes};
    {
      std::lock_guard lock(mu_);
      refit_id_ = refit_id;
      begin_ = begin;
    }
    report.refit_id = refit_id_;
    loop_.Post([this, begin] {
      downstream_.BeginRefit(begin.refit_id);
      downstream_.Broadcast(transport::MakeMessage(EncodeBegin(begin)));
    });
    log::Info(fmt::format("refit {}: {} -> {} to {} children", refit_id_,
                          report.base_version.ShortHex(), report.target_version.ShortHex(),
                          children_.size()));

    codec::DeltaEncoderOptions encoder;
    encoder.codec = options_.codec;
    encoder.chunk_bytes = options_.config.tree.chunk_size;
    encoder.threads = options_.encode_threads;
    PublishProgress progress;
    progress.tensor_bytes = target_manifest.TotalBytes();
    const size_t window = static_cast<size_t>(options_.config.tree.window);
    Status encoded = codec::EncodeDelta(
        base_manifest, target_manifest, [&](size_t i) { return base.TensorData(i); },
        [&](size_t i) { return target.TensorData(i); }, target.LayoutId(), encoder,
        [&](std::vector<std::byte>&& chunk) -> Status {
          auto message = transport::MakeMessage(EncodeChunk(chunk));
          auto header = codec::PeekChunkHeader(chunk);
          if (!header.ok()) return header.status();
          if (spool_) (void)spool_->Append(header->sequence, *message);
          {
            // Hold at most `window` chunks: the slowest child's credit paces encoding.
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return held_ < window || failed_; });
            if (failed_) return Status::Aborted(failure_);
            ++held_;
          }
          loop_.Post([this, message, sequence = header->sequence,
                      target = header->identity.target_version] {
            downstream_.BroadcastChunk(message, {target, sequence}, [this] {
              std::lock_guard lock(mu_);
              --held_;
              cv_.notify_all();
            });
          });
          CrashPoint("source.chunk_sent");
          if (progress.chunks_sent++ == 0) report.first_chunk_seconds = SecondsSince(start);
          progress.bytes_sent += message->size();
          if (options_.on_progress) options_.on_progress(progress);
          return Status::Ok();
        },
        &report.delta);
    report.stream_seconds = SecondsSince(start);

    bool commit = false;
    {
      std::unique_lock lock(mu_);
      if (!encoded.ok() && !failed_) Fail(encoded.ToString());
      const bool settled = cv_.wait_for(lock, options_.config.tree.commit_timeout,
                                        [&] { return failed_ || Missing(prepared_) == 0; });
      if (!settled) Fail("not every node was PREPARED within the commit timeout");
      commit = !failed_;
      report.abort_reason = failure_;
      report.nodes = reports_;
    }
    report.prepare_seconds = SecondsSince(start);
    CrashPoint("source.before_decision");
    const std::string decision = commit ? "COMMIT" : "ABORT";
    Status recorded =
        RecordDecision(options_.decision_log,
                       fmt::format("refit {} {} {} {}", refit_id_, report.base_version.ToHex(),
                                   report.target_version.ToHex(), decision));
    if (!recorded.ok()) {
      // Without a durable decision the source must not commit anything.
      commit = false;
      report.abort_reason = recorded.ToString();
    }
    CrashPoint("source.decided");
    log::Info(fmt::format("refit {}: decision {}{}", refit_id_, commit ? "COMMIT" : "ABORT",
                          commit ? "" : " (" + report.abort_reason + ")"));
    const Decision d{refit_id_, report.target_version};
    {
      std::lock_guard lock(mu_);
      decision_ = commit ? MessageType::kCommit : MessageType::kAbort;
    }
    if (commit) {
      committed_link_ =
          ChainLink{report.base_version, report.target_version, target_manifest.partition_bytes, 0};
    }
    loop_.Post([this, d, commit] {
      if (!commit) downstream_.DropQueued();
      downstream_.Broadcast(transport::MakeMessage(
          EncodeDecision(commit ? MessageType::kCommit : MessageType::kAbort, d)));
    });
    {
      std::unique_lock lock(mu_);
      deciding_ = true;
      cv_.wait_for(lock, options_.config.tree.commit_timeout,
                   [&] { return Missing(outcomes_) == 0; });
      report.nodes_decided = outcome_nodes_;
    }
    report.committed = commit;
    report.seconds = SecondsSince(start);
    return report;
  }

  void Stop() {
    if (spool_) RetainOrDiscardSpool();
    if (!own_spool_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(own_spool_dir_, ec);
    }
    if (transport_) transport_->Shutdown();
    loop_.Stop();
    downstream_.CloseAll();
  }

 private:
  // Loop thread: heartbeats, and a child that stays away longer than the connect
  // timeout fails the refit.
  void Tick() {
    if (Clock::now() >= next_heartbeat_) {
      next_heartbeat_ = Clock::now() + std::chrono::seconds(1);
      downstream_.Heartbeat();
    }
    std::lock_guard lock(mu_);
    if (refit_id_ == 0) return;
    if (deciding_) {
      // A child that lost its link after the decision usually rejoins at once and
      // confirms; one away longer than the connect timeout learns it when it is back.
      for (auto it = away_after_decision_.begin(); it != away_after_decision_.end();) {
        if (Clock::now() - it->second <= options_.config.tree.connect_timeout) {
          ++it;
          continue;
        }
        log::Warn(
            fmt::format("child {} is away; it learns the decision when it is back", it->first));
        outcomes_.insert(it->first);
        it = away_after_decision_.erase(it);
        cv_.notify_all();
      }
      return;
    }
    for (auto it = missing_since_.begin(); it != missing_since_.end(); ++it) {
      if (Clock::now() - it->second <= options_.config.tree.connect_timeout) continue;
      if (options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable) {
        log::Warn(fmt::format(
            "child {} is away; the refit goes on without it (commit policy available)", it->first));
        excused_.insert(it->first);
        const std::string child = it->first;
        loop_.Post([this, child] { downstream_.Excuse(child); });
        missing_since_.erase(it);
        cv_.notify_all();
        return;
      }
      Fail("child '" + it->first + "' has been away longer than the connect timeout");
      return;
    }
  }

  // Caller holds mu_: what a child that (re)joined mid-refit still needs: BEGIN,
  // the spooled chunks it has not applied, and the decision if there is one.
  // The caller hands it to Downstream::Requeue after releasing mu_.
  std::vector<Downstream::Outgoing> Backlog(const std::string& child, const Hello& hello) {
    if (hello.active_version == begin_.target_version && hello.inflight_target.IsZero() &&
        decision_ == MessageType::kCommit) {
      // It committed, then lost the link before confirming: COMMIT again makes it
      // gather its subtree's confirmations and answer.
      return {Downstream::Outgoing::Control(
          transport::MakeMessage(EncodeDecision(*decision_, {refit_id_, begin_.target_version})))};
    }
    std::vector<Downstream::Outgoing> backlog;
    backlog.push_back(Downstream::Outgoing::Control(transport::MakeMessage(EncodeBegin(begin_))));
    const bool same_delta = hello.inflight_target == begin_.target_version;
    const std::set<uint32_t> applied(hello.applied_chunks.begin(), hello.applied_chunks.end());
    size_t replayed = 0;
    if (spool_) {
      for (uint32_t sequence : spool_->sequences()) {
        if (same_delta && applied.contains(sequence)) continue;
        Spool* spool = spool_.get();
        backlog.push_back(
            Downstream::Outgoing::Chunk([spool, sequence] { return spool->Read(sequence); },
                                        {begin_.target_version, sequence}));
        ++replayed;
      }
    }
    if (decision_) {
      backlog.push_back(Downstream::Outgoing::Control(
          transport::MakeMessage(EncodeDecision(*decision_, {refit_id_, begin_.target_version}))));
    }
    log::Info(fmt::format("child {} rejoined during refit {}: replaying {} chunks it lacks", child,
                          refit_id_, replayed));
    prepared_.erase(child);
    return backlog;
  }

  // A child still holds a delta from an earlier refit in flight. The decision log
  // says whether that delta committed; if it has no COMMIT for it, nobody can have
  // committed it (decisions are logged before they are sent), so it is aborted.
  // The message goes ahead of anything else, so the child resolves it first.
  transport::Message Resolution(const std::string& child, const Digest128& target) const {
    auto recorded = RecordedDecision(options_.decision_log, target);
    const bool commit = recorded && recorded->second;
    uint64_t id = recorded ? recorded->first : 0;
    if (id == 0) RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id);
    log::Info(fmt::format("child {} holds delta to {} from an earlier refit: {}", child,
                          target.ShortHex(),
                          commit     ? "it was committed"
                          : recorded ? "it was aborted"
                                     : "no decision recorded: abort"));
    return transport::MakeMessage(
        EncodeDecision(commit ? MessageType::kCommit : MessageType::kAbort, {id, target}));
  }

  // A committed delta whose every chunk was spooled joins the history; anything
  // else is deleted.
  void RetainOrDiscardSpool() {
    const std::vector<uint32_t> sequences = spool_->sequences();
    const bool whole = !sequences.empty() && sequences.back() + 1 == sequences.size();
    if (!history_ || !committed_link_ || !whole) {
      spool_->Discard();
      spool_.reset();
      return;
    }
    ChainLink link = *committed_link_;
    link.chunks = static_cast<uint32_t>(sequences.size());
    Status kept = history_->Add(std::move(spool_), link);
    if (!kept.ok()) log::Warn("delta not kept for catch-up: " + kept.ToString());
  }

  // Loop thread: which retained deltas lead a catching-up node to `to`.
  void ServeChain(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetchChain(bytes);
    if (!f.ok()) return;
    Chain reply;
    reply.request_id = f->request_id;
    if (history_) reply.links = history_->Chain(f->from, f->to);
    reply.found = !reply.links.empty();
    downstream_.SendTo(child, transport::MakeMessage(EncodeChain(reply)));
  }

  // Loop thread: one chunk of a retained delta, read from its spool file.
  void ServeDeltaChunk(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetchDeltaChunk(bytes);
    if (!f.ok()) return;
    auto message = history_ ? history_->Read(f->target, f->sequence)
                            : Result<transport::Message>(Status::NotFound("no history"));
    downstream_.SendTo(
        child, transport::MakeMessage(EncodeDeltaChunk(
                   f->request_id, message.ok(), message.ok() ? ByteSpan(**message) : ByteSpan())));
  }

  // Loop thread: the manifest of the base or the target, for a node catching up
  // from a version of this cluster's lineage (a node holding anything else keeps
  // it: it fails the refit instead of being overwritten).
  void ServeManifest(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetchManifest(bytes);
    if (!f.ok()) return;
    const Digest128& base = manifests_.front().first;
    const std::vector<LoggedDecision> decisions = ReadDecisions(options_.decision_log);
    if (!InLineage(decisions, base, f->from) || !InLineage(decisions, base, f->version)) {
      log::Warn(
          fmt::format("{} asks to catch up from {} to {}: not both versions this cluster "
                      "committed",
                      child, f->from.ShortHex(), f->version.ShortHex()));
      downstream_.SendTo(child, transport::MakeMessage(EncodeManifest(f->request_id, false, {})));
      return;
    }
    for (const auto& [version, serialized] : manifests_) {
      if (version == f->version) {
        downstream_.SendTo(child,
                           transport::MakeMessage(EncodeManifest(f->request_id, true, serialized)));
        return;
      }
    }
    downstream_.SendTo(child, transport::MakeMessage(EncodeManifest(f->request_id, false, {})));
  }

  // Loop thread: serves a FETCH from whichever version has the wanted bytes.
  void ServeFetch(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetch(bytes);
    if (!f.ok()) return;
    for (const apply::WeightStore* store : {&target_, &base_}) {
      const auto index = store->FindTensor(f->tensor);
      if (!index) continue;
      const ByteSpan tensor = store->TensorData(*index);
      const uint64_t e = ElementSize(store->tensors()[*index].dtype);
      if (f->element_offset * e + f->byte_length > tensor.size()) continue;
      const ByteSpan part = tensor.subspan(f->element_offset * e, f->byte_length);
      if (HashPartition(part) == f->hash) {
        downstream_.SendTo(child,
                           transport::MakeMessage(EncodePartition(f->request_id, true, part)));
        return;
      }
    }
    downstream_.SendTo(child, transport::MakeMessage(EncodePartition(f->request_id, false, {})));
  }

  Downstream::Events Events() {
    Downstream::Events e;
    e.joined = [this](const std::string& child, const Hello& hello) {
      const bool adopted = downstream_.IsAdopted(child);
      bool resolve = false;
      std::optional<std::vector<Downstream::Outgoing>> backlog;
      {
        std::lock_guard lock(mu_);
        if (adopted) {
          adopted_.insert(child);
          log::Info("adopted " + child + ", whose parent is unreachable");
        } else {
          joined_.insert(child);
        }
        missing_since_.erase(child);
        away_after_decision_.erase(child);
        resolve = !hello.inflight_target.IsZero() && hello.inflight_target != target_version_;
        if (refit_id_ != 0) backlog = Backlog(child, hello);
        cv_.notify_all();
      }
      // Outside mu_: Downstream may complete queued chunks here, and their callbacks
      // take mu_.
      if (resolve) downstream_.SendTo(child, Resolution(child, hello.inflight_target));
      if (backlog) downstream_.Requeue(child, std::move(*backlog));
    };
    e.lost = [this](const std::string& child, const Status&) {
      std::lock_guard lock(mu_);
      if (adopted_.erase(child)) {  // not ours to wait for
        cv_.notify_all();
        return;
      }
      joined_.erase(child);
      // Waited for: it may come back and resume (Tick bounds the wait).
      if (refit_id_ != 0 && !deciding_) missing_since_[child] = Clock::now();
      if (deciding_ && !outcomes_.contains(child)) away_after_decision_[child] = Clock::now();
      cv_.notify_all();
    };
    e.message = [this](const std::string& child, MessageType type, ByteSpan bytes) {
      if (type == MessageType::kFetch) return ServeFetch(child, bytes);
      if (type == MessageType::kFetchManifest) return ServeManifest(child, bytes);
      if (type == MessageType::kFetchChain) return ServeChain(child, bytes);
      if (type == MessageType::kFetchDeltaChunk) return ServeDeltaChunk(child, bytes);
      std::lock_guard lock(mu_);
      switch (type) {
        case MessageType::kPrepared: {
          auto p = ParsePrepared(bytes);
          if (p.ok() && p->refit_id == refit_id_ && prepared_.insert(child).second) {
            reports_.insert(reports_.end(), p->nodes.begin(), p->nodes.end());
          }
          break;
        }
        case MessageType::kFailed: {
          auto f = ParseFailed(bytes);
          if (!f.ok() || f->refit_id != refit_id_) break;
          if (options_.config.tree.commit_policy == topology::CommitPolicy::kAvailable &&
              f->node_id == child && !deciding_) {
            // Like an absent child (commit policy available): the version goes on
            // without it and its subtree; they catch up at a later refit.
            log::Warn(
                fmt::format("child {} cannot reach the target ({}); the refit goes on "
                            "without it (commit policy available)",
                            child, f->reason));
            excused_.insert(child);
            loop_.Post([this, child] { downstream_.Excuse(child); });
            break;
          }
          Fail("node '" + f->node_id + "': " + f->reason);
          break;
        }
        case MessageType::kCommitted:
        case MessageType::kAborted: {
          auto o = ParseOutcome(bytes);
          if (o.ok() && o->refit_id == refit_id_ && outcomes_.insert(child).second)
            outcome_nodes_ += o->nodes;
          break;
        }
        default:
          break;
      }
      cv_.notify_all();
    };
    return e;
  }

  // Caller holds mu_: children the refit still waits for: planned ones neither
  // in `done` nor excused, and adopted ones connected now that are not in `done`.
  size_t Missing(const std::set<std::string>& done) const {
    size_t missing = 0;
    for (const auto& c : children_) missing += !done.contains(c) && !excused_.contains(c);
    for (const auto& c : adopted_) missing += !done.contains(c);
    return missing;
  }

  // Caller holds mu_.
  void Fail(const std::string& why) {
    if (failed_) return;
    failed_ = true;
    failure_ = why;
    cv_.notify_all();
  }

  const PublishOptions& options_;
  std::set<std::string> children_;
  const apply::WeightStore& base_;
  const apply::WeightStore& target_;
  const Digest128 target_version_;  // what this publication brings
  transport::Transport* transport_ = nullptr;
  std::vector<std::pair<Digest128, std::vector<std::byte>>> manifests_;  // set before Listen
  std::unique_ptr<Spool> spool_;
  std::filesystem::path own_spool_dir_;    // the default spool folder, removed at Stop
  std::unique_ptr<DeltaHistory> history_;  // null: no deltas kept
  // Children whose link dropped after the decision, before they confirmed it.
  std::map<std::string, Clock::time_point> away_after_decision_;
  std::optional<ChainLink> committed_link_;  // set once the decision is COMMIT
  Begin begin_;
  std::optional<MessageType> decision_;
  std::map<std::string, Clock::time_point> missing_since_;
  std::set<std::string> excused_;  // away children the version does not wait for (policy available)
  std::set<std::string> adopted_;  // grandchildren attached here because their parent died
  Clock::time_point next_heartbeat_ = Clock::now();

  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> joined_;
  std::set<std::string> prepared_;
  std::set<std::string> outcomes_;
  std::vector<NodeReport> reports_;
  uint32_t outcome_nodes_ = 0;
  size_t held_ = 0;
  bool failed_ = false;
  bool deciding_ = false;
  std::string failure_;
  uint64_t refit_id_ = 0;

  EventLoop loop_;
  Downstream downstream_;
};

}  // namespace

Result<PublishReport> Publish(const PublishOptions& options, const apply::WeightStore& base,
                              const codec::Manifest& base_manifest,
                              const apply::WeightStore& target,
                              const codec::Manifest& target_manifest,
                              std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::TreePlan plan, topology::PlanTree(options.config));
  const topology::PlannedNode* source = plan.Find(plan.source);
  Publication publication(options, source->children, base, target, target_manifest.VersionId());
  std::set<std::string> adoptable;
  for (const auto& node : plan.nodes) {
    if (node.failover_parent == plan.source) adoptable.insert(node.id);
  }
  publication.AllowAdoption(std::move(adoptable));
  publication.ServeManifests(base_manifest, target_manifest);
  RETURN_IF_ERROR(publication.Listen(*transport));
  RETURN_IF_ERROR(publication.WaitForChildren());
  PublishReport report = publication.Run(base, base_manifest, target, target_manifest);
  publication.Stop();
  return report;
}

Result<PublishReport> PublishCheckpoints(const PublishOptions& options,
                                         const std::filesystem::path& base_dir,
                                         const std::filesystem::path& new_dir,
                                         std::unique_ptr<transport::Transport> transport) {
  using Access = apply::CheckpointDirStore::Access;
  auto base = apply::CheckpointDirStore::Open(base_dir, Access::kReadOnly);
  if (!base.ok()) return base.status().WithContext("base checkpoint");
  auto target = apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly);
  if (!target.ok()) return target.status().WithContext("new checkpoint");
  if ((*base)->LayoutId() != (*target)->LayoutId()) {
    return Status::Unsupported(
        "the checkpoints differ in file layout; a delta carries tensor bytes only");
  }
  const size_t threads = options.encode_threads ? options.encode_threads : DefaultThreadCount();
  ASSIGN_OR_RETURN(auto base_manifest, apply::CheckpointState(base_dir).LoadOrComputeManifest(
                                           **base, codec::kDefaultPartitionBytes, threads));
  ASSIGN_OR_RETURN(auto target_manifest, apply::CheckpointState(new_dir).LoadOrComputeManifest(
                                             **target, codec::kDefaultPartitionBytes, threads));
  return Publish(options, **base, base_manifest, **target, target_manifest, std::move(transport));
}

}  // namespace deltacast::agent

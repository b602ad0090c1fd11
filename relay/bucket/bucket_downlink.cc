// BucketDownlink: the region side of a bucket bridge (docs/object-store.md). It
// listens as the bridge node for its planned children (the region's gateway), and
// plays their parent from the bucket: it follows `head` to each refit's BEGIN,
// fetches the chunks in parallel as they appear (a 404 is "not yet"), checks each
// (codec checksums, the source's signature, the seal once there is one) and sends
// them down in order, unchanged. It writes the children's PREPARED / FAILED /
// COMMITTED / ABORTED as objects and sends the source's decision down once it is in
// the bucket and names this refit. Catch-up requests are answered from the kept
// chain; FETCH and FETCH_MANIFEST go up to the source through the bucket
// (relay/bucket/bucket_requests.h).
//
// Striped trees (docs/protocol.md, "Stripes"): the bridge node is its children's
// parent in every stripe's tree, so the downlink takes their links of every stripe
// (keyed "child#s", relay/tree/stripe_links.h) and sends chunk k only on stripe
// k mod S's links, BEGIN, the END and the decision on every link. It keeps a
// Subtree per stripe, as a node does, and writes one PREPARED (every stripe's
// subtree prepared) and one outcome for the bucket, whose objects are the same
// whatever S is.
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>

#include "codec/chunk.h"
#include "common/event_loop.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/thread_annotations.h"
#include "objstore/bucket_layout.h"
#include "relay/bucket/bucket_bridge.h"
#include "relay/bucket/bucket_requests.h"
#include "relay/bucket/internal/bucket_io.h"
#include "relay/bucket/internal/poll_backoff.h"
#include "relay/store/spool.h"
#include "relay/tree/downstream.h"
#include "relay/tree/replay.h"
#include "relay/tree/stripe_links.h"
#include "relay/tree/subtree.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"

namespace deltacast::relay {

class BucketDownlink::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(BucketBridgeOptions options, std::unique_ptr<objstore::S3Client> s3,
       std::unique_ptr<transport::Transport> transport, topology::StripedPlan plan)
      : options_(std::move(options)),
        plan_(std::move(plan)),
        subtrees_(MakeSubtrees()),
        transport_(std::move(transport)),
        layout_(options_.prefix, options_.node_id),
        spool_dir_(options_.spool_dir, "downlink", options_.node_id),
        io_(std::move(s3), options_.parallel, stopped_, "bucket downlink " + options_.node_id),
        head_backoff_(options_.poll, options_.poll_max),
        loop_([this] { Tick(); }, std::min(options_.poll, std::chrono::milliseconds(100))),
        downstream_(loop_, options_.node_id, ChildLinks(), options_.token, DownstreamEvents(),
                    Downstream::LimitsFrom(options_.config.limits)),
        requests_(io_, layout_, loop_, downstream_, options_) {
    downstream_.SetStripes(stripes());
    downstream_.RequireTls(TlsRequiredFor(options_.config, options_.node_id));
  }
  ~Impl() { Stop(); }

  Status Listen() {
    const auto* me = options_.config.FindNode(options_.node_id);
    auto bound = downstream_.Listen(*transport_, me->host + ":" + std::to_string(me->port));
    if (!bound.ok()) return bound.status().WithContext("bucket downlink cannot listen");
    listen_address_ = *bound;
    loop_.Start();
    log::Info(fmt::format("bucket downlink {} listening on {}", options_.node_id, *bound));
    return Status::Ok();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    transport_->Shutdown();
    io_.Stop();
    loop_.Stop();
    downstream_.CloseAll();
    spool_dir_.Release();
  }

  BucketBridgeStats stats() const { return io_.Stats(); }
  const std::string& listen_address() const { return listen_address_; }

 private:
  uint32_t stripes() const { return static_cast<uint32_t>(plan_.stripes.size()); }
  Subtree& subtree(uint32_t stripe) { return *subtrees_[stripe]; }
  Subtree& SubtreeOf(const std::string& link) { return subtree(StripeOfLink(link)); }
  template <typename F>
  void ForEachSubtree(F f) {
    for (auto& t : subtrees_) f(*t);
  }
  template <typename F>
  bool AllSubtrees(F f) const {
    for (const auto& t : subtrees_) {
      if (!f(*t)) return false;
    }
    return true;
  }

  // This node's children in stripe s's tree, as link keys.
  std::vector<std::string> ChildLinksOf(uint32_t s) const {
    std::vector<std::string> links;
    for (const auto& child : plan_.stripes[s].tree.Find(options_.node_id)->children) {
      links.push_back(StripeLinkKey(child, s));
    }
    return links;
  }
  std::vector<std::string> ChildLinks() const {
    std::vector<std::string> links;
    for (uint32_t s = 0; s < stripes(); ++s) {
      for (auto& link : ChildLinksOf(s)) links.push_back(std::move(link));
    }
    return links;
  }
  std::vector<std::unique_ptr<Subtree>> MakeSubtrees() {
    std::vector<std::unique_ptr<Subtree>> trees;
    for (uint32_t s = 0; s < stripes(); ++s) {
      trees.push_back(std::make_unique<Subtree>(
          ChildLinksOf(s),
          Subtree::Rules{options_.config.tree.commit_policy, options_.config.tree.connect_timeout,
                         "bucket downlink " + options_.node_id +
                             (s == 0 ? "" : "#" + std::to_string(s)) + ": "},
          SubtreeOwner()));
    }
    return trees;
  }

  struct Refit {
    explicit Refit(const BucketBridgeOptions& o)
        : chunk_backoff(o.poll, o.poll_max), control_backoff(o.poll, o.poll_max) {}
    uint64_t id = 0;
    uint64_t generation = 0;
    Begin begin;
    std::unique_ptr<Spool> spool;
    uint32_t next_fetch = 0;                       // the next sequence never asked for
    std::set<uint32_t> in_flight;                  // GETs outstanding
    std::set<uint32_t> again;                      // to ask for again at the next poll
    std::map<uint32_t, transport::Message> ready;  // checked, waiting for their turn
    uint32_t next_send = 0;
    std::optional<uint32_t> end_sequence;
    size_t held = 0;        // sent down, not yet handed to every child
    bool frontier = false;  // a GET found nothing yet: no new sequences until the next poll
    // After the frontier, a poll GETs one chunk (the lowest asked for again), not
    // every one in flight: the rest follow once it is there.
    bool probe = false;
    std::optional<uint32_t> probe_seq;      // that GET, in flight
    internal::PollBackoff chunk_backoff;    // news: a chunk arrived
    internal::PollBackoff control_backoff;  // news: seal, decision, or PREPARED written
    Clock::time_point next_chunk_poll = Clock::now();
    std::map<uint32_t, int> failures;
    std::set<uint32_t> refetch_asked;
    std::optional<objstore::Seal> seal;
    std::optional<MessageType> decision;
    transport::Message decision_message;
    bool stale_logged = false;
    bool prepared_written = false;
    bool failed_written = false;
    bool outcome_written = false;
    bool polling = false;
    Clock::time_point next_poll = Clock::now();
  };

  Downstream::Events DownstreamEvents() {
    Downstream::Events e;
    e.joined = [this](const std::string& child, const Hello& hello) {
      SubtreeOf(child).Joined(child, false, Clock::now());
      OnJoined(child, hello);
    };
    e.lost = [this](const std::string& child, const Status&) {
      SubtreeOf(child).Lost(child, Clock::now());
    };
    e.message = [this](const std::string& child, MessageType type, ByteSpan bytes) {
      OnChildMessage(child, type, bytes);
    };
    return e;
  }

  void Tick() {
    if (stopped_) return;
    const auto now = Clock::now();
    downstream_.Tick(now);
    if (now >= next_heartbeat_) {
      next_heartbeat_ = now + options_.config.tree.HeartbeatInterval();
      downstream_.Heartbeat();
    }
    requests_.Tick(now);
    // Always following head: the source begins a refit only once the last one
    // ended (or timed out), so a new head means this refit is over here too.
    if (!polling_head_ && now >= next_head_poll_) PollHead(now);
    if (!refit_) return;
    Refit& r = *refit_;
    ForEachSubtree([&](Subtree& t) { t.Tick(now); });
    if (r.frontier && !r.probe_seq && now >= r.next_chunk_poll) {
      r.frontier = false;  // a new round of "is it there yet?"
      r.probe = true;
      Pump();
    }
    if (!r.polling && now >= r.next_poll) PollRefit(now);
  }

  // ---- following head to each refit --------------------------------------------

  void PollHead(Clock::time_point now) {
    polling_head_ = true;
    // Within a refit, head only tells that the source moved on: ask less often.
    // Between refits, back off from the last one's end.
    const bool busy = refit_ && !(refit_->decision && refit_->outcome_written);
    next_head_poll_ =
        now + (busy ? std::min(5 * options_.poll, options_.poll_max) : head_backoff_.Next(now));
    io_.Run([this] {
      std::optional<std::vector<std::byte>> begin;
      uint64_t id = 0;
      if (auto head = io_.GetIfThere(layout_.Head())) {
        auto parsed = objstore::ParseHead(AsChars(*head));
        if (parsed.ok()) {
          id = *parsed;
          if (id != last_head_.load()) begin = io_.GetIfThere(layout_.Begin(id));
        }
      }
      loop_.Post([this, id, begin = std::move(begin)] {
        polling_head_ = false;
        if (begin) OnBeginObject(id, *begin);
      });
    });
  }

  void OnBeginObject(uint64_t id, const std::vector<std::byte>& bytes) {
    if (refit_ && refit_->id == id) return;
    if (refit_ && !(refit_->decision && refit_->outcome_written)) {
      log::Warn(fmt::format("bucket downlink {}: refit {} begins before refit {} ended here",
                            options_.node_id, id, refit_->id));
    }
    auto begin = ParseBegin(bytes);
    Status trusted = begin.ok() ? Status::Ok() : begin.status();
    if (trusted.ok() && begin->refit_id != id) trusted = Status::Corrupt("names another refit");
    if (trusted.ok() && options_.verify_key) trusted = VerifyBegin(*options_.verify_key, *begin);
    if (!trusted.ok()) return io_.BadObject(layout_.Begin(id), trusted.ToString());
    last_head_ = id;
    refit_.emplace(options_);
    refit_->id = id;
    refit_->generation = ++generation_;
    refit_->begin = *begin;
    Spool::RemoveOthers(spool_dir_.path(), begin->target_version);
    std::error_code ec;
    std::filesystem::create_directories(spool_dir_.path(), ec);
    auto spool = Spool::OpenEmpty(spool_dir_.path(), begin->target_version);
    if (spool.ok()) refit_->spool = std::move(*spool);
    io_.Count([](BucketBridgeStats& s) { ++s.refits; });
    log::Info(fmt::format("bucket downlink {}: refit {} begins: {} -> {}", options_.node_id, id,
                          begin->base_version.ShortHex(), begin->target_version.ShortHex()));
    const auto now = Clock::now();
    ForEachSubtree([&](Subtree& t) { t.BeginRefit(id, now); });
    downstream_.BeginRefit(id, begin->stream_id);
    // Each link's copy names its stripe (not signed: one signed BEGIN serves all).
    downstream_.BroadcastBegin(*begin);
    Pump();
  }

  // ---- chunks: parallel GETs, delivered in order ---------------------------------

  size_t Budget() const { return 2 * static_cast<size_t>(options_.config.tree.window); }

  void Pump() {
    if (!refit_ || refit_->decision == MessageType::kAbort) return;
    Refit& r = *refit_;
    auto room = [&] {
      return r.in_flight.size() < options_.parallel &&
             r.in_flight.size() + r.ready.size() + r.held < Budget();
    };
    while (room() && !r.frontier && !r.probe_seq) {
      uint32_t seq;
      if (!r.again.empty()) {
        seq = *r.again.begin();
        r.again.erase(r.again.begin());
      } else if (!r.end_sequence || r.next_fetch <= *r.end_sequence) {
        seq = r.next_fetch++;
      } else {
        break;
      }
      if (r.end_sequence && seq > *r.end_sequence) continue;
      Fetch(seq);
      if (r.probe) r.probe_seq = seq;
    }
  }

  void Fetch(uint32_t seq) {
    Refit& r = *refit_;
    r.in_flight.insert(seq);
    const uint64_t id = r.id, gen = r.generation;
    io_.Run([this, id, gen, seq] {
      auto got = io_.client().Get(layout_.Chunk(id, seq));
      if (got.ok()) {
        io_.Count([&](BucketBridgeStats& s) {
          ++s.objects_read;
          s.bytes_read += got->size();
        });
      }
      loop_.Post([this, gen, seq, got = std::move(got)]() mutable {
        OnChunkObject(gen, seq, std::move(got));
      });
    });
  }

  // Whether the object read as chunk `seq` is that chunk of this refit, intact.
  Status CheckChunk(const Refit& r, uint32_t seq, ByteSpan bytes) const {
    auto type = PeekType(bytes);
    if (!type.ok()) return type.status();
    if (*type != MessageType::kChunk) return Status::Corrupt("not a CHUNK message");
    RETURN_IF_ERROR(codec::VerifyChunkChecksums(ChunkOf(bytes)));
    auto header = codec::PeekChunkHeader(ChunkOf(bytes));
    if (!header.ok()) return header.status();
    if (header->sequence != seq || header->identity.target_version != r.begin.target_version) {
      return Status::Corrupt(fmt::format("holds chunk {} of delta {}", header->sequence,
                                         header->identity.target_version.ShortHex()));
    }
    if (options_.verify_key) RETURN_IF_ERROR(VerifyChunkMessage(*options_.verify_key, bytes));
    if (r.seal && seq < r.seal->chunks.size()) {
      const auto& e = r.seal->chunks[seq];
      if (e.bytes != bytes.size() || e.hash != Hash64(bytes)) {
        return Status::Corrupt("does not match the seal's length and hash");
      }
    }
    return Status::Ok();
  }

  void OnChunkObject(uint64_t gen, uint32_t seq, Result<std::vector<std::byte>> got) {
    if (!refit_ || refit_->generation != gen) return;
    Refit& r = *refit_;
    r.in_flight.erase(seq);
    const bool was_probe = r.probe_seq == seq;
    if (was_probe) r.probe_seq.reset();
    if (r.end_sequence && seq > *r.end_sequence) return Pump();
    // A 404 is "not written yet", unless the seal lists the chunk: then it is lost.
    const bool sealed_chunk = r.seal && seq < r.seal->chunks.size();
    const StatusCode code = got.ok() ? StatusCode::kOk : got.status().code();
    if (code != StatusCode::kOk && code != StatusCode::kCorrupt &&
        !(code == StatusCode::kNotFound && sealed_chunk)) {
      // Not there yet, or the server is away: ask again at the next poll.
      if (code != StatusCode::kNotFound) io_.Retried(got.status(), 0);
      r.again.insert(seq);
      AtFrontier(r);
      return;
    }
    Status intact = got.ok() ? CheckChunk(r, seq, *got) : got.status();
    if (!intact.ok()) {
      io_.BadObject(layout_.Chunk(r.id, seq), intact.ToString());
      r.again.insert(seq);
      AtFrontier(r);
      if (++r.failures[seq] >= 2 && r.refetch_asked.insert(seq).second) {
        // Twice wrong: not a write in progress. The uplink writes it again.
        io_.Put(layout_.Refetch(r.id, seq), transport::MakeMessage({}), {}, &loop_);
      }
      return;
    }
    auto message = transport::MakeMessage(std::move(*got));
    auto header = codec::PeekChunkHeader(ChunkOf(*message));
    if (header->kind == codec::ChunkKind::kEnd) r.end_sequence = seq;
    r.ready.emplace(seq, std::move(message));
    r.chunk_backoff.Reset(Clock::now());
    if (was_probe) {
      // The frontier moved: fetch what follows at full width again.
      r.probe = false;
      r.frontier = false;
    }
    Deliver();
    Pump();
  }

  // A chunk was not there: no new GETs until the next chunk poll.
  void AtFrontier(Refit& r) {
    if (r.frontier) return;
    r.frontier = true;
    const auto now = Clock::now();
    r.next_chunk_poll = now + r.chunk_backoff.Next(now);
  }

  void Deliver() {
    Refit& r = *refit_;
    while (!r.ready.empty() && r.ready.begin()->first == r.next_send) {
      auto message = std::move(r.ready.begin()->second);
      r.ready.erase(r.ready.begin());
      const uint32_t seq = r.next_send++;
      if (r.spool) (void)r.spool->Append(seq, *message);
      ++r.held;
      const uint64_t gen = r.generation;
      // A data chunk goes down its stripe's links only, the END down every link.
      const bool data = !(r.end_sequence && seq == *r.end_sequence);
      downstream_.BroadcastChunk(message, {r.begin.target_version, seq, data}, [this, gen] {
        if (!refit_ || refit_->generation != gen) return;
        --refit_->held;
        Pump();
      });
    }
  }

  // ---- the decision and the seal --------------------------------------------------

  void PollRefit(Clock::time_point now) {
    Refit& r = *refit_;
    const bool want_seal = !r.seal;
    const bool want_decision = !r.decision && r.prepared_written;
    const bool want_abort = !r.decision && !r.prepared_written;  // an early ABORT
    if (!want_seal && !want_decision && !want_abort) return;
    r.polling = true;
    r.next_poll = now + r.control_backoff.Next(now);
    const uint64_t id = r.id, gen = r.generation;
    io_.Run([this, id, gen, want_seal] {
      std::optional<std::vector<std::byte>> seal, decision;
      if (want_seal) seal = io_.GetIfThere(layout_.Sealed(id));
      decision = io_.GetIfThere(layout_.Decision(id));
      loop_.Post([this, gen, seal = std::move(seal), decision = std::move(decision)] {
        if (!refit_ || refit_->generation != gen) return;
        refit_->polling = false;
        if (seal || decision) refit_->control_backoff.Reset(Clock::now());
        if (seal) OnSeal(*seal);
        if (decision) OnDecisionObject(*decision);
      });
    });
  }

  void OnSeal(const std::vector<std::byte>& bytes) {
    Refit& r = *refit_;
    auto seal = objstore::ParseSeal(AsChars(bytes));
    if (!seal.ok() || seal->refit_id != r.id) {
      return io_.BadObject(layout_.Sealed(r.id),
                           seal.ok() ? "names another refit" : seal.status().ToString());
    }
    r.seal = std::move(*seal);
    if (!r.seal->chunks.empty()) r.end_sequence = static_cast<uint32_t>(r.seal->chunks.size() - 1);
  }

  void OnDecisionObject(const std::vector<std::byte>& bytes) {
    Refit& r = *refit_;
    auto type = PeekType(bytes);
    auto d = ParseDecision(bytes);
    Status valid = !type.ok() ? type.status() : !d.ok() ? d.status() : Status::Ok();
    if (valid.ok() && (d->refit_id != r.id || d->target_version != r.begin.target_version)) {
      // A decision object of an earlier refit (docs/object-store.md, step 5).
      io_.Count([](BucketBridgeStats& s) { ++s.stale_decisions; });
      if (!r.stale_logged) {
        r.stale_logged = true;
        log::Warn(fmt::format(
            "bucket downlink {}: the decision object of refit {} is stale (it decides refit {} "
            "to {}); ignored, waiting for this refit's",
            options_.node_id, r.id, d->refit_id, d->target_version.ShortHex()));
      }
      return;
    }
    if (valid.ok() && options_.verify_key) valid = VerifyDecision(*options_.verify_key, *type, *d);
    if (!valid.ok()) return io_.BadObject(layout_.Decision(r.id), valid.ToString());
    r.decision = *type;
    r.decision_message = transport::MakeMessage(bytes);
    log::Info(fmt::format("bucket downlink {}: refit {}: {}", options_.node_id, r.id,
                          *type == MessageType::kCommit ? "COMMIT" : "ABORT"));
    if (*type == MessageType::kAbort) downstream_.DropQueued();
    downstream_.Broadcast(r.decision_message);
    const auto now = Clock::now();
    ForEachSubtree([&](Subtree& t) { t.Decided(now); });
    MaybeOutcome();  // every child may be excused
  }

  // ---- what the children say ------------------------------------------------------

  void OnJoined(const std::string& child, const Hello& hello) {
    if (!refit_) return;
    const Refit& r = *refit_;
    std::optional<bool> committed;
    if (r.decision) committed = r.decision == MessageType::kCommit;
    switch (SubtreeOf(child).Rejoined(child, hello, r.begin.target_version, committed)) {
      case Subtree::Rejoin::kDecisionAgain:
        return downstream_.Requeue(child, {Downstream::Outgoing::Control(r.decision_message)});
      case Subtree::Rejoin::kNothing:
        return;
      case Subtree::Rejoin::kReplay:
        break;
    }
    Replay replay = ReplayFor(hello, r.begin, r.spool.get(), r.decision_message);
    log::Info(fmt::format("bucket downlink {}: child {} joined during refit {}: {} chunks queued",
                          options_.node_id, child, r.id, replay.chunks));
    downstream_.Requeue(child, std::move(replay.messages));
  }

  void OnChildMessage(const std::string& child, MessageType type, ByteSpan bytes) {
    switch (type) {
      case MessageType::kFetchChain:
        return ServeChain(child, bytes);
      case MessageType::kFetchDeltaChunk:
        return ServeDeltaChunk(child, bytes);
      case MessageType::kFetchManifest:
        // Only the source has manifests and partition bytes: up through the bucket.
        if (ParseFetchManifest(bytes).ok()) requests_.Submit(child, type, bytes);
        return;
      case MessageType::kFetch:
        if (ParseFetch(bytes).ok()) requests_.Submit(child, type, bytes);
        return;
      default:
        break;
    }
    if (!refit_) return;
    Refit& r = *refit_;
    switch (type) {
      case MessageType::kPrepared: {
        auto p = ParsePrepared(bytes);
        if (!p.ok() || p->refit_id != r.id) return;
        return SubtreeOf(child).OnPrepared(child, p->nodes);
      }
      case MessageType::kFailed: {
        auto f = ParseFailed(bytes);
        if (f.ok() && f->refit_id == r.id) SubtreeOf(child).OnFailed(child, *f);
        return;
      }
      case MessageType::kCommitted:
      case MessageType::kAborted: {
        auto o = ParseOutcome(bytes);
        if (!o.ok() || o->refit_id != r.id || !r.decision) return;
        return SubtreeOf(child).OnConfirmed(child, o->nodes, o->pauses);
      }
      default:
        return;
    }
  }

  // The parent half of the commit is the Subtree's; the downlink acts on what it
  // reports, as a node does.
  Subtree::Owner SubtreeOwner() {
    Subtree::Owner owner;
    owner.leave_out = [this](const std::string& child) { downstream_.Excuse(child); };
    owner.fail = [this](const Failed& f, const std::string&) { WriteFailed(f); };
    owner.changed = [this] {
      if (!refit_) return;
      // Every stripe's subtree is in the same phase.
      if (subtree(0).streaming()) return MaybePrepared();
      if (subtree(0).deciding()) MaybeOutcome();
    };
    return owner;
  }

  // One PREPARED for every node below once no child is awaited in any stripe. If
  // every child was excused, nothing below takes part: FAILED in the bridge's name,
  // which the source excuses in turn under policy `available`.
  void MaybePrepared() {
    Refit& r = *refit_;
    if (r.prepared_written || r.failed_written ||
        !AllSubtrees([](const Subtree& t) { return t.prepared(); })) {
      return;
    }
    const std::vector<NodeReport> reports = MergedReports(subtrees_);
    if (reports.empty()) {
      return WriteFailed(Failed{r.id, options_.node_id,
                                "no node below bridge '" + options_.node_id +
                                    "' takes part (every child away or failed)"});
    }
    Prepared all{r.id, reports};
    r.prepared_written = true;
    r.control_backoff.Reset(Clock::now());  // the decision is next
    log::Info(fmt::format("bucket downlink {}: refit {}: prepared ({} nodes)", options_.node_id,
                          r.id, all.nodes.size()));
    io_.Put(layout_.Prepared(r.id), transport::MakeMessage(EncodePrepared(all)), {}, &loop_);
  }

  void WriteFailed(const Failed& f) {
    Refit& r = *refit_;
    if (r.failed_written || r.decision) return;  // after PREPARED too, as a node
    r.failed_written = true;
    ForEachSubtree([](Subtree& t) { t.FailedHere(); });
    r.control_backoff.Reset(Clock::now());  // an ABORT is next
    io_.Put(layout_.Failed(r.id), transport::MakeMessage(EncodeFailed(f)), {}, &loop_);
  }

  // One COMMITTED / ABORTED for everything below once no child is awaited (an away
  // one learns the decision when it is back).
  void MaybeOutcome() {
    Refit& r = *refit_;
    if (!r.decision || r.outcome_written ||
        !AllSubtrees([](const Subtree& t) { return t.confirmed(); })) {
      return;
    }
    const MessageType type =
        *r.decision == MessageType::kCommit ? MessageType::kCommitted : MessageType::kAborted;
    r.outcome_written = true;
    // A node confirms in every stripe it is in: each counted once (NodesConfirmed).
    const uint32_t confirmed = NodesConfirmed(subtrees_);
    const std::vector<PauseReport> pauses = MergedPauses(subtrees_);
    // The refit's requests are counted once its last PUT is acknowledged, so before
    // the uplink can read the outcome and the source report the refit.
    io_.Run([this, id = r.id,
             body = transport::MakeMessage(EncodeOutcome(type, {r.id, confirmed, pauses}))] {
      if (io_.PutNow(layout_.Outcome(id), *body)) io_.EndRefit(id);
    });
    ForEachSubtree([](Subtree& t) { t.EndRefit(); });
    head_backoff_.Reset(Clock::now());  // a next refit may follow at once
  }

  // The kept refits leading from `from` to `to`, from the bucket's chain.
  static std::vector<objstore::KeptRefit> PathOf(const std::vector<objstore::KeptRefit>& chain,
                                                 const Digest128& from, const Digest128& to) {
    for (size_t start = 0; start < chain.size(); ++start) {
      if (chain[start].base != from) continue;
      std::vector<objstore::KeptRefit> path;
      for (size_t i = start; i < chain.size(); ++i) {
        if (!path.empty() && chain[i].base != path.back().target) break;
        path.push_back(chain[i]);
        if (chain[i].target == to) return path;
      }
    }
    return {};
  }

  void ServeChain(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetchChain(bytes);
    if (!f.ok()) return;
    io_.Run([this, child, f = *f] {
      Chain reply;
      reply.request_id = f.request_id;
      if (auto text = io_.GetRetrying(layout_.Chain())) {
        if (auto chain = objstore::ParseChain(AsChars(*text)); chain.ok()) {
          for (const auto& k : PathOf(*chain, f.from, f.to)) {
            reply.links.push_back({k.base, k.target, k.partition_bytes, k.chunks});
            MutexLock lock(chain_mu_);
            kept_by_target_[k.target.ToHex()] = k.refit_id;
          }
        }
      }
      reply.found = !reply.links.empty();
      loop_.Post([this, child, reply] {
        downstream_.SendTo(child, transport::MakeMessage(EncodeChain(reply)));
      });
    });
  }

  void ServeDeltaChunk(const std::string& child, ByteSpan bytes) {
    auto f = ParseFetchDeltaChunk(bytes);
    if (!f.ok()) return;
    io_.Run([this, child, f = *f] {
      std::optional<uint64_t> id;
      {
        MutexLock lock(chain_mu_);
        auto it = kept_by_target_.find(f.target.ToHex());
        if (it != kept_by_target_.end()) id = it->second;
      }
      std::optional<std::vector<std::byte>> chunk;
      if (id) chunk = io_.GetRetrying(layout_.Chunk(*id, f.sequence));
      // The node checks the chunk itself (checksums, signature) and asks again.
      auto reply = transport::MakeMessage(
          EncodeDeltaChunk(f.request_id, chunk.has_value(), chunk ? ByteSpan(*chunk) : ByteSpan()));
      loop_.Post([this, child, reply] { downstream_.SendTo(child, reply); });
    });
  }

  BucketBridgeOptions options_;
  const topology::StripedPlan plan_;
  std::vector<std::unique_ptr<Subtree>> subtrees_;  // per stripe; loop thread
  std::unique_ptr<transport::Transport> transport_;
  const objstore::BucketLayout layout_;
  std::string listen_address_;
  SpoolDir spool_dir_;

  // Loop thread.
  std::optional<Refit> refit_;
  uint64_t generation_ = 0;
  bool polling_head_ = false;
  Clock::time_point next_head_poll_ = Clock::now();
  Clock::time_point next_heartbeat_ = Clock::now();
  std::atomic<uint64_t> last_head_{0};  // the refit head named when last begun

  Mutex chain_mu_;
  std::map<std::string, uint64_t> kept_by_target_
      GUARDED_BY(chain_mu_);  // target hex -> refit id (pool threads)

  std::atomic<bool> stopped_{false};
  internal::BucketIo io_;
  internal::PollBackoff head_backoff_;  // news: a refit ended (the next may follow)
  EventLoop loop_;
  Downstream downstream_;
  BucketRequestsDown requests_;  // loop thread
};

Result<std::unique_ptr<BucketDownlink>> BucketDownlink::Start(
    BucketBridgeOptions options, std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::StripedPlan plan,
                   internal::PlanBridgeHalf(options, "bucket downlink"));
  ASSIGN_OR_RETURN(auto s3, objstore::S3Client::Create(options.s3));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(s3), std::move(transport),
                                     std::move(plan));
  RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<BucketDownlink>(new BucketDownlink(std::move(impl)));
}

BucketDownlink::BucketDownlink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BucketDownlink::~BucketDownlink() { Stop(); }
void BucketDownlink::Stop() {
  if (impl_) impl_->Stop();
}
BucketBridgeStats BucketDownlink::stats() const { return impl_->stats(); }
const std::string& BucketDownlink::listen_address() const { return impl_->listen_address(); }

}  // namespace deltacast::relay

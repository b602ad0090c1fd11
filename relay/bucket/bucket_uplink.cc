// BucketUplink: the source side of a bucket bridge (docs/object-store.md). It joins
// the source as the bridge node over an ordinary ParentLink and turns what it is
// sent into objects: BEGIN, each CHUNK (credit back once its PUT is acknowledged),
// the seal after END, the decision and the kept chain. What the region reports
// (PREPARED, FAILED, COMMITTED, ABORTED) it polls for and sends up, and the
// region's FETCH / FETCH_MANIFEST requests too (relay/bucket/bucket_requests.h).
//
// Striped trees (docs/protocol.md, "Stripes"): the bridge node is the source's
// child in every stripe's tree, so the uplink joins on one link per stripe and
// takes each stripe's chunks from it (credit back on the link a chunk came on). The
// bucket holds one refit as before: each chunk is written once (the END, which
// comes on every stripe, too), and what the region reports goes up every stripe.
#include <fmt/core.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "codec/chunk.h"
#include "common/event_loop.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/parallel.h"
#include "objstore/bucket_layout.h"
#include "relay/bucket/bucket_bridge.h"
#include "relay/bucket/bucket_requests.h"
#include "relay/bucket/internal/bucket_io.h"
#include "relay/bucket/internal/poll_backoff.h"
#include "relay/store/spool.h"
#include "relay/tree/parent_link.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"

namespace deltacast::relay {

class BucketUplink::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(BucketBridgeOptions options, std::unique_ptr<objstore::S3Client> s3,
       std::unique_ptr<transport::Transport> transport, topology::StripedPlan plan)
      : options_(std::move(options)),
        plan_(std::move(plan)),
        selves_(SelvesIn(plan_, options_.node_id)),
        transport_(std::move(transport)),
        layout_(options_.prefix, options_.node_id),
        spool_dir_(options_.spool_dir, "uplink", options_.node_id),
        io_(std::move(s3), options_.parallel, stopped_, "bucket uplink " + options_.node_id),
        backoff_(options_.poll, options_.poll_max),
        loop_([this] { Tick(); }, std::min(options_.poll, std::chrono::milliseconds(100))),
        parents_(MakeParents()),
        requests_(io_, layout_, loop_, *parents_.front(), options_) {}
  ~Impl() { Stop(); }

  Status Init() {
    // The chain kept so far: the version this bridge (and its region) last committed.
    auto chain = io_.client().Get(layout_.Chain());
    if (chain.ok()) {
      auto parsed = objstore::ParseChain(AsChars(*chain));
      if (!parsed.ok()) return parsed.status().WithContext(layout_.Chain());
      chain_ = std::move(*parsed);
      if (!chain_.empty()) active_ = chain_.back().target;
    } else if (chain.status().code() != StatusCode::kNotFound) {
      return chain.status().WithContext("bucket uplink " + options_.node_id);
    }
    loop_.Start();
    return Status::Ok();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    transport_->Shutdown();
    io_.Stop();
    loop_.Stop();
    for (auto& parent : parents_) parent->Close();
    spool_dir_.Release();
  }

  BucketBridgeStats stats() const { return io_.Stats(); }

 private:
  struct Refit {
    uint64_t id = 0;
    Begin begin;
    uint64_t generation = 0;
    std::unique_ptr<Spool> spool;
    std::set<uint32_t> writing;                      // PUT in flight
    std::map<uint32_t, objstore::SealEntry> stored;  // PUT acknowledged
    std::optional<uint32_t> end_sequence;
    bool sealed = false;
    bool prepared_sent = false;
    bool failed_sent = false;
    bool decided = false;  // the decision came (its PUT may be in flight)
    bool decision_stored = false;
    bool outcome_sent = false;
    std::set<uint32_t> refetching;
  };

  static std::vector<topology::PlannedNode> SelvesIn(const topology::StripedPlan& plan,
                                                     const std::string& id) {
    std::vector<topology::PlannedNode> selves;
    for (const auto& stripe : plan.stripes) selves.push_back(*stripe.tree.Find(id));
    return selves;
  }

  // One link per stripe (ParentLink keeps a reference to selves_[s]).
  std::vector<std::unique_ptr<ParentLink>> MakeParents() {
    std::vector<std::unique_ptr<ParentLink>> parents;
    for (uint32_t s = 0; s < selves_.size(); ++s) {
      parents.push_back(std::make_unique<ParentLink>(loop_, options_.config, selves_[s],
                                                     options_.token, *transport_, ParentEvents(s)));
    }
    return parents;
  }
  uint32_t stripes() const { return static_cast<uint32_t>(selves_.size()); }

  ParentLink::Events ParentEvents(uint32_t stripe) {
    ParentLink::Events e;
    e.hello = [this, stripe] { return MakeHello(stripe); };
    e.joined = [this, stripe] {
      log::Info(fmt::format("bucket uplink {}: joined {}{}", options_.node_id,
                            parents_[stripe]->current(),
                            stripes() > 1 ? " in stripe " + std::to_string(stripe) : ""));
    };
    // Requests go up stripe 0's link (BucketRequestsUp).
    e.lost = [this, stripe](const Status&) {
      if (stripe == 0) requests_.LinkLost();
    };
    e.message = [this, stripe](MessageType type, const transport::Message& m) {
      OnMessage(stripe, type, m);
    };
    return e;
  }

  // What the region reports goes up every stripe: the source waits for each
  // stripe's subtree, and the bridge is in every one.
  void SendUpAll(const std::vector<std::byte>& bytes) {
    for (auto& parent : parents_) parent->Send(bytes);
  }

  Hello MakeHello(uint32_t stripe) const {
    Hello h;
    h.stripe = stripe;
    h.stripes = stripes();
    h.active_version = active_;
    if (refit_ && !refit_->decided) {
      // What is in the bucket counts as applied: the parent replays only the rest.
      h.inflight_base = refit_->begin.base_version;
      h.inflight_target = refit_->begin.target_version;
      h.prepared = refit_->prepared_sent;
      h.inflight_stream = refit_->begin.stream_id;
      for (const auto& [seq, entry] : refit_->stored) h.applied_chunks.push_back(seq);
    }
    return h;
  }

  void OnMessage(uint32_t stripe, MessageType type, const transport::Message& m) {
    switch (type) {
      case MessageType::kBegin:
        return OnBegin(stripe, m);
      case MessageType::kChunk:
        return OnChunk(stripe, m);
      case MessageType::kCommit:
      case MessageType::kAbort:
        return OnDecision(stripe, type, m);
      case MessageType::kPartition:
      case MessageType::kManifest:
        (void)requests_.OnAnswer(*m);  // a region's request's answer
        return;
      default:
        return;  // answers to requests this bridge never makes
    }
  }

  // Credit goes back on the link the chunks came on: each has its own window.
  void Credit(uint32_t stripe, uint32_t chunks) {
    if (refit_) parents_[stripe]->Send(EncodeCredit({chunks, refit_->id}));
  }

  void OnBegin(uint32_t stripe, const transport::Message& m) {
    auto begin = ParseBegin(*m);
    if (!begin.ok()) return parents_[stripe]->ProtocolError(begin.status().message());
    if (refit_ && refit_->id == begin->refit_id) {
      // Another stripe's copy, or a replay after a reconnect: what follows on this
      // link is what the bucket lacks of its stripe.
      return Credit(stripe, static_cast<uint32_t>(options_.config.tree.window));
    }
    if (refit_ && !refit_->decided) {
      log::Warn(fmt::format("bucket uplink {}: refit {} begins before refit {} was decided",
                            options_.node_id, begin->refit_id, refit_->id));
    }
    refit_.emplace(Refit{});
    refit_->id = begin->refit_id;
    refit_->begin = *begin;
    refit_->generation = ++generation_;
    Spool::RemoveOthers(spool_dir_.path(), begin->target_version);
    std::error_code ec;
    std::filesystem::create_directories(spool_dir_.path(), ec);
    auto spool = Spool::OpenEmpty(spool_dir_.path(), begin->target_version);
    if (spool.ok()) {
      refit_->spool = std::move(*spool);
    } else {
      log::Warn(
          fmt::format("bucket uplink {}: no spool ({}); a chunk missing from the bucket "
                      "cannot be written again",
                      options_.node_id, spool.status().ToString()));
    }
    io_.Count([](BucketBridgeStats& s) { ++s.refits; });
    log::Info(fmt::format("bucket uplink {}: refit {} begins: {} -> {}", options_.node_id,
                          begin->refit_id, begin->base_version.ShortHex(),
                          begin->target_version.ShortHex()));
    const uint64_t id = refit_->id;
    // Side by side (one round trip, not two): a reader that finds `head` before
    // `begin` takes the 404 as "not yet" and asks again.
    io_.Put(layout_.Begin(id), m, {}, &loop_);
    io_.Put(layout_.Head(), transport::MakeMessage(internal::ToBytes(objstore::EncodeHead(id))), {},
            &loop_);
    Credit(stripe, static_cast<uint32_t>(options_.config.tree.window));
  }

  void OnChunk(uint32_t stripe, const transport::Message& m) {
    if (!refit_) return parents_[stripe]->ProtocolError("CHUNK outside a refit");
    auto header = codec::PeekChunkHeader(ChunkOf(*m));
    if (!header.ok() || header->identity.target_version != refit_->begin.target_version) {
      // The source checked what it signed; a bridge never alters or drops what
      // passes, but it must not file a chunk of another delta under this refit.
      log::Warn(fmt::format("bucket uplink {}: a CHUNK not of refit {}: dropped", options_.node_id,
                            refit_->id));
      return Credit(stripe, 1);
    }
    const uint32_t seq = header->sequence;
    if (header->kind == codec::ChunkKind::kEnd) refit_->end_sequence = seq;
    // The END comes on every stripe: written once, credited on each.
    if (refit_->stored.contains(seq) || !refit_->writing.insert(seq).second) {
      return Credit(stripe, 1);
    }
    if (refit_->spool) (void)refit_->spool->Append(seq, *m);
    const uint64_t gen = refit_->generation;
    const uint64_t hash = Hash64(*m);
    const uint64_t bytes = m->size();
    io_.Put(
        layout_.Chunk(refit_->id, seq), m,
        [this, gen, seq, hash, bytes, stripe] {
          if (!refit_ || refit_->generation != gen) return;
          refit_->writing.erase(seq);
          refit_->stored[seq] = {seq, bytes, hash};
          Credit(stripe, 1);
          MaybeSeal();
        },
        &loop_);
  }

  void MaybeSeal() {
    Refit& r = *refit_;
    if (r.sealed || !r.end_sequence || r.stored.size() != *r.end_sequence + 1) return;
    r.sealed = true;
    backoff_.Reset(Clock::now());  // every chunk is in: the region's PREPARED is next
    objstore::Seal seal{r.id, {}};
    for (const auto& [seq, entry] : r.stored) seal.chunks.push_back(entry);
    io_.Put(layout_.Sealed(r.id),
            transport::MakeMessage(internal::ToBytes(objstore::EncodeSeal(seal))), {}, &loop_);
  }

  // The decision comes on every stripe: the first copy is acted on.
  void OnDecision(uint32_t stripe, MessageType type, const transport::Message& m) {
    auto d = ParseDecision(*m);
    if (!d.ok()) return parents_[stripe]->ProtocolError(d.status().message());
    const uint64_t id = d->refit_id;
    if (!refit_ || refit_->id != id) {
      // The outcome of a refit this bridge lost track of (it restarted): the
      // region's downlink reads it all the same.
      io_.Put(layout_.Decision(id), m, {}, &loop_);
      return;
    }
    if (refit_->decided) return;
    refit_->decided = true;
    const uint64_t gen = refit_->generation;
    const bool commit = type == MessageType::kCommit;
    log::Info(fmt::format("bucket uplink {}: refit {}: {}", options_.node_id, id,
                          commit ? "COMMIT" : "ABORT"));
    io_.Put(
        layout_.Decision(id), m,
        [this, gen, commit] {
          if (!refit_ || refit_->generation != gen) return;
          refit_->decision_stored = true;
          backoff_.Reset(Clock::now());  // the region's outcome is next
          if (commit) KeepCommitted();
        },
        &loop_);
  }

  // The committed refit joins the chain; refits beyond keep_refits go.
  void KeepCommitted() {
    Refit& r = *refit_;
    active_ = r.begin.target_version;
    if (!r.end_sequence) return;  // a resolution: this bridge does not hold the delta
    chain_.push_back({r.begin.base_version, r.begin.target_version, r.begin.partition_bytes,
                      *r.end_sequence + 1, r.id});
    std::vector<uint64_t> dropped;
    while (chain_.size() > options_.keep_refits) {
      dropped.push_back(chain_.front().refit_id);
      chain_.erase(chain_.begin());
    }
    io_.Put(
        layout_.Chain(), transport::MakeMessage(internal::ToBytes(objstore::EncodeChain(chain_))),
        [this, dropped] {
          for (uint64_t old : dropped) io_.DeleteFolder(layout_.Refit(old));
        },
        &loop_);
  }

  void Tick() {
    if (stopped_) return;
    const auto now = Clock::now();
    for (auto& parent : parents_) parent->Tick(now, !refit_ || refit_->decided);
    // The source serves partitions and manifests only while a refit runs.
    requests_.Tick(now, refit_ && !refit_->outcome_sent);
    if (!refit_ || polls_in_flight_ >= kPollsInFlight || now < next_poll_) return;
    Refit& r = *refit_;
    // Once the region prepared it needs no refetch (it has every chunk): only a
    // late FAILED (as a node forwards one) and the outcome are left to wait for.
    const bool want_prepared = !r.decided && !r.prepared_sent && !r.failed_sent;
    const bool want_failed = !r.decided && !r.failed_sent;
    const bool want_outcome = r.decision_stored && !r.outcome_sent;
    if (!want_failed && !want_outcome) return;
    ++polls_in_flight_;
    // While chunks stream, PREPARED cannot come (the region lacks the END) and
    // FAILED or a refetch are rare: those polls back off.
    next_poll_ = now + backoff_.Next(now);
    const uint64_t id = r.id, gen = r.generation;
    // The reads run side by side: each crosses the WAN when the bucket sits in
    // the region, and the region's PREPARED waits on the slowest of them.
    auto poll = std::make_shared<Poll>();
    auto left = std::make_shared<std::atomic<int>>(want_prepared ? 3 : 1);
    auto done = [this, gen, poll, left] {
      if (--*left == 0) loop_.Post([this, gen, poll] { OnPoll(gen, *poll); });
    };
    if (want_prepared) {
      io_.Run([this, id, poll, done] {
        poll->prepared = io_.GetIfThere(layout_.Prepared(id));
        done();
      });
      io_.Run([this, id, poll, done] {
        auto refetch = io_.client().List(layout_.RefetchFolder(id));
        if (refetch.ok()) {
          for (const auto& o : *refetch) {
            auto seq = objstore::BucketLayout::SequenceOf(o.key);
            if (seq.ok()) poll->refetch.push_back(*seq);
          }
        }
        done();
      });
    }
    if (want_failed) {
      io_.Run([this, id, poll, done] {
        poll->failed = io_.GetIfThere(layout_.Failed(id));
        done();
      });
    } else {
      io_.Run([this, id, poll, done] {
        poll->outcome = io_.GetIfThere(layout_.Outcome(id));
        done();
      });
    }
  }

  struct Poll {
    std::optional<std::vector<std::byte>> prepared, failed, outcome;
    std::vector<uint32_t> refetch;
  };

  void OnPoll(uint64_t gen, const Poll& poll) {
    --polls_in_flight_;
    if (!refit_ || refit_->generation != gen) return;
    Refit& r = *refit_;
    if (poll.prepared && !r.prepared_sent && !r.decided) {
      auto p = ParsePrepared(*poll.prepared);
      if (p.ok() && p->refit_id == r.id) {
        r.prepared_sent = true;
        log::Info(fmt::format("bucket uplink {}: refit {}: the region prepared ({} nodes)",
                              options_.node_id, r.id, p->nodes.size()));
        SendUpAll(*poll.prepared);
      } else {
        io_.BadObject(layout_.Prepared(r.id),
                      p.ok() ? "names another refit" : p.status().ToString());
      }
    }
    if (poll.failed && !r.failed_sent && !r.decided) {
      auto f = ParseFailed(*poll.failed);
      if (f.ok() && f->refit_id == r.id) {
        r.failed_sent = true;
        SendUpAll(*poll.failed);
      } else {
        io_.BadObject(layout_.Failed(r.id), f.ok() ? "names another refit" : f.status().ToString());
      }
    }
    if (!poll.refetch.empty()) backoff_.Reset(Clock::now());
    for (uint32_t seq : poll.refetch) Rewrite(seq);
    if (poll.outcome && !r.outcome_sent) {
      auto type = PeekType(*poll.outcome);
      auto o = ParseOutcome(*poll.outcome);
      if (o.ok() && o->refit_id == r.id && type.ok()) {
        r.outcome_sent = true;
        io_.EndRefit(r.id);  // counted before the source can report the refit
        SendUpAll(*poll.outcome);
      } else {
        io_.BadObject(layout_.Outcome(r.id),
                      o.ok() ? "names another refit" : o.status().ToString());
      }
    }
  }

  // A downlink found chunk `seq` missing or damaged in the bucket: write it again
  // from the spool, then clear the request.
  void Rewrite(uint32_t seq) {
    Refit& r = *refit_;
    if (!r.spool || !r.refetching.insert(seq).second) return;
    auto message = r.spool->Read(seq);
    if (!message.ok()) {
      r.refetching.erase(seq);
      return;
    }
    log::Warn(
        fmt::format("bucket uplink {}: refit {}: chunk {} was missing or damaged in the "
                    "bucket; writing it again",
                    options_.node_id, r.id, seq));
    io_.Count([](BucketBridgeStats& s) { ++s.refetches; });
    const uint64_t id = r.id, gen = r.generation;
    io_.Put(
        layout_.Chunk(id, seq), *message,
        [this, id, gen, seq] {
          io_.Delete(layout_.Refetch(id, seq));
          if (refit_ && refit_->generation == gen) refit_->refetching.erase(seq);
        },
        &loop_);
  }

  BucketBridgeOptions options_;
  const topology::StripedPlan plan_;
  // This node in each stripe's tree (never resized: the ParentLinks keep references).
  const std::vector<topology::PlannedNode> selves_;
  std::unique_ptr<transport::Transport> transport_;
  const objstore::BucketLayout layout_;
  SpoolDir spool_dir_;

  // Loop thread.
  std::optional<Refit> refit_;
  std::vector<objstore::KeptRefit> chain_;
  Digest128 active_;
  uint64_t generation_ = 0;
  // Polls overlap: a poll's reads take a round trip to the bucket (across the WAN
  // when it sits in the region), and a new one starts every `poll` regardless, so
  // what the region wrote is seen about a one-way delay after it landed.
  static constexpr int kPollsInFlight = 4;
  int polls_in_flight_ = 0;
  Clock::time_point next_poll_ = Clock::now();

  std::atomic<bool> stopped_{false};
  // Declared last but one and last: the loop stops first (Stop), the pool before it.
  internal::BucketIo io_;
  internal::PollBackoff backoff_;  // of the polls for the region's reports
  EventLoop loop_;
  std::vector<std::unique_ptr<ParentLink>> parents_;  // per stripe
  BucketRequestsUp requests_;                         // loop thread; up stripe 0's link
};

Result<std::unique_ptr<BucketUplink>> BucketUplink::Start(
    BucketBridgeOptions options, std::unique_ptr<transport::Transport> transport) {
  ASSIGN_OR_RETURN(topology::StripedPlan plan, internal::PlanBridgeHalf(options, "bucket uplink"));
  ASSIGN_OR_RETURN(auto s3, objstore::S3Client::Create(options.s3));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(s3), std::move(transport),
                                     std::move(plan));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<BucketUplink>(new BucketUplink(std::move(impl)));
}

BucketUplink::BucketUplink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BucketUplink::~BucketUplink() { Stop(); }
void BucketUplink::Stop() {
  if (impl_) impl_->Stop();
}
BucketBridgeStats BucketUplink::stats() const { return impl_->stats(); }

}  // namespace deltacast::relay

// The source's children (source_impl.h): joins and rejoins with what each still
// needs, the outcome of a delta a child holds from an earlier refit, the children's
// messages, and what the source serves them (bytes, manifests, kept deltas).
#include <fmt/core.h>

#include "common/log.h"
#include "relay/tree/source_impl.h"

namespace deltacast::relay {

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
  std::string refused;  // left out of the refit here: why
  uint64_t refit_id = 0;
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
    if (refit_ && refit_->begun) {
      backlog = Backlog(child, hello, &refused);
      refit_id = refit_->begin.refit_id;
    }
    const bool same = hello.active_version == active_version_;
    told = transport::MakeMessage(EncodeActiveVersion(
        active_version_, !same && active_manifest_ ? ByteSpan(*active_manifest_) : ByteSpan()));
    cv_.notify_all();
  }
  // Outside mu_: Downstream may complete queued chunks here, and their callbacks
  // take mu_.
  // On every stripe's link: the node checks the first it gets after it joined
  // (whichever of its stripes joined first), so the check never waits on one stripe.
  if (!refused.empty()) {
    // Said outright, naming the refit, so that the child gives this stripe up at once
    // if its other parent there cannot serve it either (NodeAgent::ShedByEveryParent),
    // rather than sit joined to a parent that sends it nothing.
    return downstream_.RefuseForRefit(child, refused, refit_id);
  }
  downstream_.SendTo(child, told);
  if (resolution) downstream_.SendTo(child, *resolution);
  if (backlog) downstream_.Requeue(child, std::move(*backlog));
}

// Caller holds mu_: what a child that (re)joined during or after the refit still
// needs: BEGIN, the spooled chunks it lacks, and the decision if there is one.
std::optional<std::vector<Downstream::Outgoing>> Source::Impl::Backlog(const std::string& child,
                                                                       const Hello& hello,
                                                                       std::string* refused) {
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
    const std::string why = "child " + child +
                            " rejoined, but the source could not spool the refit's chunks (" +
                            refit_->spool_error.ToString() + ")";
    if (tree.CannotTakePart(child, why)) {
      // Striped only: with one tree the child has no other stripe to fail for.
      if (striped_.stripes.size() > 1)
        *refused = "the source cannot replay refit " + std::to_string(begin.refit_id) +
                   " (it could not spool its chunks)";
      return std::nullopt;
    }
  }
  Replay replay = ReplayFor(hello, begin, refit_->spool.get(), refit_->decision_message);
  log::Info(fmt::format("child {} rejoined during refit {}: replaying {} chunks it lacks", child,
                        begin.refit_id, replay.chunks));
  return std::move(replay.messages);
}

// The ABORT of a delta to `target` that no decision names has no refit id of its own:
// one derived from the target, so that every child told it, and every path it takes
// across stripes, carries one decision. A fresh random id per child made three
// ABORTs of one delta, and relays that held it resolved each as new, passed it down
// and were passed the others back, without end (the simulator's --stripes seed
// 41721: half a million resolutions a minute).
uint64_t Source::Impl::UnrecordedAbortId(const Digest128& target) {
  const uint64_t id = Hash64(
      ByteSpan(reinterpret_cast<const std::byte*>(target.bytes.data()), target.bytes.size()));
  return id == 0 ? 1 : id;
}

// A child still holds a delta from an earlier refit in flight. The decision log
// says whether that delta committed; if it has no COMMIT for it, nobody can have
// committed it (decisions are logged before they are sent), so it is aborted. With a
// commit record store the log is only a cache: a delta it does not know is looked up
// in the records (a refit still undecided there is aborted by compare-and-set first),
// and with the store out of reach nothing is said (the child follows the record later).
// The message goes ahead of anything else, so the child resolves it first.
std::optional<transport::Message> Source::Impl::Resolution(const std::string& child,
                                                           const Digest128& target) {
  std::optional<LoggedDecision> recorded;
  for (const LoggedDecision& d : Decisions()) {
    if (d.target == target.ToHex()) recorded = d;
  }
  if (!recorded && records_.enabled()) {
    auto found = records_.ForTarget(target);
    if (!found.ok()) {
      log::Warn(
          fmt::format("child {} holds delta to {}, and the commit record store cannot say "
                      "its outcome now: {}",
                      child, target.ShortHex(), found.status().ToString()));
      return std::nullopt;
    }
    if (*found) {
      recorded = LoggedDecision{(*found)->refit_id, (*found)->base_version.ToHex(),
                                (*found)->target_version.ToHex(), (*found)->commit};
    }
  }
  const bool commit = recorded && recorded->commit;
  const uint64_t id = recorded ? recorded->refit_id : UnrecordedAbortId(target);
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
// fails the refit instead of being overwritten). Only while this source holds that
// version's bytes to serve the partitions it lists: a root that relays producers'
// pieces holds none, and a node that began catching up by partitions from it was
// left half way, its delta in flight no longer the first of the chain of kept deltas
// that would have taken it there (the simulator's --producers seed 439).
void Source::Impl::ServeManifest(const std::string& child, ByteSpan bytes) {
  auto f = ParseFetchManifest(bytes);
  if (!f.ok()) return;
  MutexLock lock(mu_);
  if (refit_ && !refit_->manifests.empty() && refit_->base && refit_->target) {
    const Digest128& base = refit_->manifests.front().first;
    const std::vector<LoggedDecision> decisions = Decisions();
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

}  // namespace deltacast::relay

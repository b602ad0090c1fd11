// --stripes (issue 31; docs/simulation.md, "Striped trees"): the run's config has
// [tree] stripes = S; faults on one stripe's link between a node and its parent
// (the simulated network tells a node's stripe links apart by their HELLO), kills of
// nodes interior in one stripe and a leaf in another; and the checkers that watch
// every message on a stripe link: chunks only on their stripe's tree, never twice
// on one link within a refit, PREPARED only after every stripe's END, and each
// node's upload.
#include <set>

#include "codec/chunk.h"
#include "relay/tree/stripe_links.h"
#include "relay/wire/protocol.h"
#include "sim/run_internal.h"
#include "topology/stripe_plan.h"

namespace deltacast::sim {

std::vector<int> MixedStripeNodes(const Scenario& s) {
  auto config = topology::ParseClusterConfig(internal::ConfigToml(s), "sim.toml");
  if (!config.ok()) return {};
  auto plan = topology::PlanStripes(*config);
  if (!plan.ok()) return {};
  std::vector<int> mixed;
  for (int i = 1; i <= s.nodes; ++i) {
    bool interior = false, leaf = false;
    for (const topology::StripeTree& t : plan->stripes) {
      const topology::PlannedNode* n = t.tree.Find(internal::Name(i));
      if (!n) continue;
      (n->children.empty() ? leaf : interior) = true;
    }
    if (interior && leaf) mixed.push_back(i);
  }
  return mixed;
}

namespace internal {

// What the checkers remember of the run's stripe links.
struct Run::StripeWatch {
  // (stripe, child) -> the parents the plan allows it there: planned and failover.
  std::map<std::pair<int, std::string>, std::set<std::string>> parents;
  std::map<uint64_t, uint64_t> refit_sent;  // link id -> the refit of the last BEGIN sent on it
  std::map<uint64_t, Digest128> targets;    // refit id -> target
  // (link id, refit, sequence, END?) of every chunk sent on a link.
  std::set<std::tuple<uint64_t, uint64_t, uint32_t, bool>> sent;
  // (node, target) -> the stripes whose END of the delta to it reached it (any
  // incarnation; a delta streamed again under another refit id counts too).
  std::map<std::pair<std::string, Digest128>, std::set<int>> ends;
  // (node, target) it said in a HELLO it had PREPARED (a restart; its ENDs may have
  // come to the process before).
  std::set<std::pair<std::string, Digest128>> prepared_hello;
  // (node, refit) whose COMMIT reached it: it may say PREPARED again, "more than
  // prepared", when a parent that restarted begins that refit again.
  std::set<std::pair<std::string, uint64_t>> commit_got;
  std::set<std::pair<uint64_t, uint32_t>> source_chunks;  // (refit, sequence) counted once
  std::map<std::string, uint64_t> upload;                 // CHUNK bytes each process sent
};

void Run::SetupStripes() {
  if (s_.striping.stripes <= 0) return;
  watch_ = std::make_shared<StripeWatch>();
  r_.stripes.stripes = s_.striping.stripes;
  auto plan = topology::PlanStripes(config_);
  if (!plan.ok()) throw std::runtime_error(plan.status().ToString());
  if (static_cast<int>(plan->stripes.size()) != s_.striping.stripes) {
    throw std::runtime_error(fmt::format("the plan has {} stripes, the config says {}",
                                         plan->stripes.size(), s_.striping.stripes));
  }
  for (const topology::StripeTree& t : plan->stripes) {
    for (const topology::PlannedNode& n : t.tree.nodes) {
      auto& allowed = watch_->parents[{t.index, n.id}];
      if (n.parent) allowed.insert(*n.parent);
      if (n.failover_parent) allowed.insert(*n.failover_parent);
    }
  }
  net_.set_observer([this](const LinkEvent& e) { ObserveLink(e); });
}

void Run::ScheduleStripeFaults(int publish) {
  for (size_t k = 0; k < s_.striping.faults.size(); ++k) {
    const StripeFault f = s_.striping.faults[k];
    // --drop numbers them after the scenario's other faults.
    if (f.publish != publish || o_.drop_faults.count(s_.faults.size() + k)) continue;
    q_.PostAt(driver_,
              q_.Now() + std::chrono::duration_cast<EventQueue::Duration>(
                             std::chrono::duration<double>(f.at)),
              [this, k, f] { InjectStripe(s_.faults.size() + k, f); });
  }
}

void Run::InjectStripe(size_t index, const StripeFault& f) {
  if (!faults_on_) return;
  ++r_.stripes.faults[static_cast<size_t>(f.kind)];
  if (f.kind == StripeFaultKind::kKillMixedNode) {
    // The node's kill as any other (Inject notes it, restarts it, counts the time),
    // counted here rather than as a kill-node fault.
    q_.Note(fmt::format("fault {}: {} (interior in a stripe, a leaf in another)", index,
                        StripeFaultName(f.kind)));
    Fault kill{f.publish, f.at, FaultKind::kKillNode, f.node, 0, f.seconds, f.power, 0};
    Inject(index, kill);
    --r_.faults[static_cast<size_t>(FaultKind::kKillNode)];
    return;
  }
  const auto secs =
      std::chrono::duration_cast<EventQueue::Duration>(std::chrono::duration<double>(f.seconds));
  q_.Note(fmt::format("fault {}: {} {} stripe {}{}", index, StripeFaultName(f.kind), Name(f.node),
                      f.stripe,
                      f.seconds > 0 ? fmt::format(" for {:.3f}s", f.seconds) : std::string()));
  ++faults_begun_;
  quiet_from_ = std::max(quiet_from_, q_.Now() + secs + kRecovery);
  disturbed_until_ = std::max(disturbed_until_, q_.Now() + secs);
  switch (f.kind) {
    case StripeFaultKind::kCutLink:
      return net_.CutStripeLink(Name(f.node), f.stripe, secs);
    case StripeFaultKind::kResetLink:
      return net_.ResetStripeLink(Name(f.node), f.stripe);
    case StripeFaultKind::kStallLink:
      return net_.StallStripeLink(Name(f.node), f.stripe, secs);
    case StripeFaultKind::kKillMixedNode:
      return;
  }
}

// Every message on a link (SimNetwork's observer): must post nothing and draw nothing,
// so that watching leaves the run as it was.
void Run::ObserveLink(const LinkEvent& e) {
  const LinkInfo& link = e.link;
  if (link.stripe < 0) return;  // before its HELLO
  StripeWatch& w = *watch_;
  if (r_.failures.size() > 50) return;  // enough said (a livelock repeats itself)
  const ByteSpan bytes(e.message.data(), e.message.size());
  auto type = relay::PeekType(bytes);
  if (!type.ok()) return;
  const bool down = e.from == link.parent;
  if (*type == relay::MessageType::kBegin) {
    auto begin = relay::ParseBegin(bytes);
    if (!begin.ok()) return;
    w.targets[begin->refit_id] = begin->target_version;
    if (!e.delivered) w.refit_sent[link.id] = begin->refit_id;
    if (!e.delivered && static_cast<int>(begin->stripe) != link.stripe) {
      Fail(fmt::format("stripes: {} sent a BEGIN for stripe {} on {}'s stripe-{} link", e.from,
                       begin->stripe, e.to, link.stripe));
    }
    return;
  }
  if (*type == relay::MessageType::kChunk && down) {
    auto parts = relay::SplitChunkMessage(bytes);
    if (!parts.ok()) return;
    auto header = codec::PeekChunkHeader(parts->chunk);
    if (!header.ok()) return;
    const bool data = header->kind == codec::ChunkKind::kData;
    if (e.delivered) {
      // By the delta's target (the chunk names it): a replay on a new link may bring
      // the END with no BEGIN before it.
      if (!data) w.ends[{e.to, header->identity.target_version}].insert(link.stripe);
      return;
    }
    ++r_.stripes.chunks_checked;
    const std::string where =
        fmt::format("{} -> {} (stripe {} of {})", e.from, e.to, link.stripe, link.stripes);
    if (!relay::StripeCarries(static_cast<uint32_t>(link.stripe),
                              static_cast<uint32_t>(link.stripes), header->sequence, data)) {
      Fail(fmt::format("stripes: chunk {} sent on {}, which does not carry it", header->sequence,
                       where));
    }
    auto allowed = w.parents.find({link.stripe, e.to});
    if (allowed == w.parents.end() || !allowed->second.count(e.from)) {
      Fail(fmt::format("stripes: chunk {} sent on {}, an edge of no stripe-{} tree",
                       header->sequence, where, link.stripe));
    }
    auto refit = w.refit_sent.find(link.id);
    const uint64_t refit_id = refit == w.refit_sent.end() ? 0 : refit->second;
    if (!w.sent.insert({link.id, refit_id, header->sequence, data}).second) {
      Fail(fmt::format("stripes: chunk {}{} of refit {} sent twice on one link {}",
                       header->sequence, data ? "" : " (END)", refit_id, where));
    }
    w.upload[e.from] += e.message.size();
    if (e.from == "src" && w.source_chunks.insert({refit_id, header->sequence}).second) {
      r_.stripes.delta_bytes += e.message.size();
    }
    return;
  }
  if (*type == relay::MessageType::kCommit && e.delivered && down) {
    auto decision = relay::ParseDecision(bytes);
    if (decision.ok()) w.commit_got.insert({e.to, decision->refit_id});
    return;
  }
  if (e.delivered || e.from != link.child) return;
  if (*type == relay::MessageType::kHello) {
    auto hello = relay::ParseHello(bytes);
    if (hello.ok() && hello->prepared) w.prepared_hello.insert({e.from, hello->inflight_target});
    return;
  }
  if (*type == relay::MessageType::kPrepared) {
    auto prepared = relay::ParsePrepared(bytes);
    if (!prepared.ok()) return;
    ++r_.stripes.prepared_checked;
    const auto target = w.targets.find(prepared->refit_id);
    const auto ends =
        target == w.targets.end() ? w.ends.end() : w.ends.find({e.from, target->second});
    const size_t got = ends == w.ends.end() ? 0 : ends->second.size();
    if (got == static_cast<size_t>(link.stripes)) return;
    if (target != w.targets.end() && w.prepared_hello.count({e.from, target->second})) return;
    if (w.commit_got.count({e.from, prepared->refit_id})) return;
    Fail(
        fmt::format("stripes: {} sent PREPARED for refit {} up stripe {} with the END of {} of "
                    "{} stripes",
                    e.from, prepared->refit_id, link.stripe, got, link.stripes));
  }
}

void Run::StripeFinalChecks() {
  if (!watch_) return;
  net_.set_observer(nullptr);
  r_.stripes.upload_bytes.assign(s_.nodes + 1, 0);
  for (int p = 0; p <= s_.nodes; ++p) {
    auto it = watch_->upload.find(Name(p));
    if (it != watch_->upload.end()) r_.stripes.upload_bytes[p] = it->second;
  }
}

}  // namespace internal
}  // namespace deltacast::sim

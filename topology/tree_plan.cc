#include "topology/tree_plan.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <utility>

#include "topology/internal/plan_tree.h"

namespace deltacast::topology {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The parts of the plan that do not depend on the fanout. Nodes are named by their
// index in config.nodes.
struct Layout {
  const ClusterConfig* config = nullptr;
  size_t source = 0;
  std::vector<size_t> source_region;  // planned, below the source; fastest first
  // Per other region, by name: its planned nodes, fastest first (the gateway).
  std::map<std::string_view, std::vector<size_t>> other_regions;
  std::vector<std::pair<size_t, size_t>> manual;  // (node, its configured parent)
};

Layout MakeLayout(const ClusterConfig& config) {
  Layout layout;
  layout.config = &config;
  const std::vector<NodeConfig>& nodes = config.nodes;
  std::map<std::string_view, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) {
    index.emplace(nodes[i].id, i);
    if (nodes[i].role == Role::kSource) layout.source = i;
  }
  const std::string& source_region = nodes[layout.source].region;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (i == layout.source) continue;
    if (nodes[i].parent) {
      layout.manual.emplace_back(i, index.at(*nodes[i].parent));
    } else if (nodes[i].region == source_region) {
      layout.source_region.push_back(i);
    } else {
      layout.other_regions[nodes[i].region].push_back(i);
    }
  }
  auto faster_first = [&](size_t a, size_t b) { return FasterFirst(nodes[a], nodes[b]); };
  std::sort(layout.source_region.begin(), layout.source_region.end(), faster_first);
  for (auto& [name, members] : layout.other_regions) {
    std::sort(members.begin(), members.end(), faster_first);
    // A region that lists gateway candidates enters through the fastest of them.
    const auto gateway =
        std::find_if(members.begin(), members.end(), [&](size_t m) { return nodes[m].gateway; });
    if (gateway != members.end()) std::rotate(members.begin(), gateway, gateway + 1);
  }
  return layout;
}

// The largest k that still changes the tree: beyond it every region is a star.
int MaxUsefulFanout(const Layout& layout) {
  size_t most = layout.source_region.size();
  for (const auto& [name, members] : layout.other_regions) {
    most = std::max(most, members.size() - 1);  // the gateway is the root
  }
  return static_cast<int>(std::max<size_t>(most, 1));
}

// A lower bound on T(plan) for fanout k, to stop the "auto" search early: every
// region root with m planned members has at least min(k, m) children sharing its
// uplink, so some node receives the whole delta no faster than uplink / min(k, m).
// It never decreases as k grows.
double LowerBoundSeconds(const Layout& layout, int fanout, uint64_t delta_bytes) {
  const std::vector<NodeConfig>& nodes = layout.config->nodes;
  const double bits = static_cast<double>(delta_bytes) * 8.0;
  const size_t k = static_cast<size_t>(fanout);
  double bound = 0;
  if (!layout.source_region.empty()) {
    const double share = static_cast<double>(std::min(k, layout.source_region.size()));
    bound = bits * share / nodes[layout.source].uplink_bps;
  }
  for (const auto& [name, members] : layout.other_regions) {
    if (members.size() < 2) continue;
    const double share = static_cast<double>(std::min(k, members.size() - 1));
    bound = std::max(bound, bits * share / nodes[members.front()].uplink_bps);
  }
  return bound;
}

// Hangs `members[1..]` below `members[0]` as a k-ary tree filled breadth-first:
// position p (root = 0) has children at p*k+1 .. p*k+k.
void FillKary(const std::vector<size_t>& members, size_t k, std::vector<size_t>& parent_of) {
  for (size_t p = 1; p < members.size(); ++p) parent_of[members[p]] = members[(p - 1) / k];
}

Result<TreePlan> Build(const Layout& layout, int fanout) {
  const ClusterConfig& config = *layout.config;
  const std::vector<NodeConfig>& nodes = config.nodes;
  const size_t k = static_cast<size_t>(fanout);
  std::vector<size_t> parent_of(nodes.size(), kNoParent);

  std::vector<size_t> source_tree = {layout.source};
  source_tree.insert(source_tree.end(), layout.source_region.begin(), layout.source_region.end());
  FillKary(source_tree, k, parent_of);
  for (const auto& [name, members] : layout.other_regions) {
    parent_of[members.front()] = layout.source;
    FillKary(members, k, parent_of);
  }
  for (const auto& [node, parent] : layout.manual) parent_of[node] = parent;

  const std::vector<std::vector<size_t>> children_of = ChildrenFastestFirst(config, parent_of);
  const TreeConfig& tree = config.tree;
  const double hop_latency_s = static_cast<double>(tree.hop_latency.count()) / 1000.0;
  // Bits a link may have unacknowledged; with the round trip it caps the link's rate.
  const double window_bits =
      static_cast<double>(tree.window) * static_cast<double>(tree.chunk_size) * 8.0;
  auto hop = [&](size_t child, size_t parent) {
    const NodeConfig& n = nodes[child];
    HopRate link{nodes[parent].uplink_bps / static_cast<double>(children_of[parent].size()),
                 hop_latency_s};
    if (nodes[parent].region != n.region) {
      // The source's own region may have no [[region]] entry (only a manual parent
      // leads back into it); then its WAN is not modelled.
      if (const RegionConfig* r = config.FindRegion(n.region)) {
        link.bps = std::min(link.bps, r->FlowCapBps());  // one flow: <= wan_bps
        link.latency_s += static_cast<double>(r->wan_latency.count()) / 1000.0;
      }
    }
    if (link.latency_s > 0) link.bps = std::min(link.bps, window_bits / (2.0 * link.latency_s));
    return link;
  };
  ASSIGN_OR_RETURN(TreePlan plan, WalkTree(config, parent_of, layout.source,
                                           /*root_failover=*/nullptr, fanout, std::nullopt, hop));
  if (plan.nodes.size() != nodes.size()) {
    // ValidateClusterConfig rules out unreachable nodes, so this is a planner bug.
    return Status::Internal("tree plan reached " + std::to_string(plan.nodes.size()) + " of " +
                            std::to_string(nodes.size()) + " nodes");
  }
  return plan;
}

}  // namespace

const PlannedNode* TreePlan::Find(std::string_view id) const {
  for (const PlannedNode& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

double TreePlan::PredictSecondsTo(const PlannedNode& node, uint64_t delta_bytes) const {
  if (node.depth == 0) return 0.0;
  // A delta smaller than a chunk fills the pipeline with just itself.
  const double chunk = static_cast<double>(std::min(chunk_size, delta_bytes));
  const double bytes = static_cast<double>(delta_bytes) + node.depth * chunk;
  return bytes / (node.path_bps / 8.0) + node.path_latency_s;
}

const PlannedNode& TreePlan::SlowestNode(uint64_t delta_bytes) const {
  const PlannedNode* slowest = &nodes.front();
  double worst = 0;
  for (const PlannedNode& n : nodes) {
    const double t = PredictSecondsTo(n, delta_bytes);
    if (t > worst) {
      worst = t;
      slowest = &n;
    }
  }
  return *slowest;
}

double TreePlan::PredictSeconds(uint64_t delta_bytes) const {
  if (nodes.empty()) return 0.0;
  return PredictSecondsTo(SlowestNode(delta_bytes), delta_bytes);
}

Result<TreePlan> PlanTreeWithFanout(const ClusterConfig& config, int fanout) {
  if (fanout < 1) {
    return Status::InvalidArgument("fanout " + std::to_string(fanout) + " must be >= 1");
  }
  RETURN_IF_ERROR(ValidateClusterConfig(config));
  return Build(MakeLayout(config), fanout);
}

Result<TreePlan> PlanTree(const ClusterConfig& config) {
  RETURN_IF_ERROR(ValidateClusterConfig(config));
  const Layout layout = MakeLayout(config);
  if (config.tree.fanout) return Build(layout, *config.tree.fanout);

  // Every k's prediction, until the lower bound shows no larger k can come within
  // the tie tolerance of the best.
  std::vector<double> seconds;  // seconds[k - 1]
  double best = kInfinity;
  const int max_fanout = MaxUsefulFanout(layout);
  for (int k = 1; k <= max_fanout; ++k) {
    if (LowerBoundSeconds(layout, k, kAutoFanoutReferenceBytes) >
        best * (1 + kFanoutTieTolerance)) {
      break;
    }
    ASSIGN_OR_RETURN(TreePlan plan, Build(layout, k));
    seconds.push_back(plan.PredictSeconds(kAutoFanoutReferenceBytes));
    best = std::min(best, seconds.back());
  }
  int chosen = 1;
  while (seconds[chosen - 1] > best * (1 + kFanoutTieTolerance)) ++chosen;
  ASSIGN_OR_RETURN(TreePlan plan, Build(layout, chosen));
  plan.fanout_auto = true;
  return plan;
}

Digest128 TreePlan::Fingerprint() const {
  Hasher128 h;
  h.UpdateString("deltacast-tree-plan-v1");
  h.UpdateValue<uint64_t>(nodes.size());
  for (const PlannedNode& n : nodes) {
    h.UpdateString(n.id);
    h.UpdateString(n.parent.value_or(""));
    h.UpdateString(n.failover_parent.value_or(""));
  }
  return h.Finish();
}

}  // namespace deltacast::topology

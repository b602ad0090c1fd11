// The planners' shared steps (topology/internal/plan_tree.h).
#include "topology/internal/plan_tree.h"

#include <algorithm>
#include <deque>
#include <string>

namespace deltacast::topology {

bool FasterFirst(const NodeConfig& a, const NodeConfig& b) {
  if (a.uplink_bps != b.uplink_bps) return a.uplink_bps > b.uplink_bps;
  return a.id < b.id;
}

Status NoCommonTransport(const ClusterConfig& config, const NodeConfig& parent,
                         const NodeConfig& child, std::string_view edge,
                         std::optional<int> stripe) {
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& t : v) out += (out.empty() ? "" : ", ") + t;
    return "[" + out + "]";
  };
  const std::string tree = stripe ? "stripe " + std::to_string(*stripe) + "'s " : "the ";
  return Status::InvalidArgument(
      config.source_file.string() + ": " + tree + std::string(edge) + "edge " + parent.id + " -> " +
      child.id + " has no transport both ends list (after [[link]] rules): " + parent.id +
      " lists " + list(parent.transports) + ", " + child.id + " lists " + list(child.transports));
}

std::vector<std::vector<size_t>> ChildrenFastestFirst(const ClusterConfig& config,
                                                      const std::vector<size_t>& parent_of) {
  const std::vector<NodeConfig>& nodes = config.nodes;
  std::vector<std::vector<size_t>> children_of(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (parent_of[i] != kNoParent) children_of[parent_of[i]].push_back(i);
  }
  for (std::vector<size_t>& children : children_of) {
    std::sort(children.begin(), children.end(),
              [&](size_t a, size_t b) { return FasterFirst(nodes[a], nodes[b]); });
  }
  return children_of;
}

Result<TreePlan> WalkTree(const ClusterConfig& config, const std::vector<size_t>& parent_of,
                          size_t root, const NodeConfig* root_failover, int fanout,
                          std::optional<int> stripe,
                          const std::function<HopRate(size_t child, size_t parent)>& hop) {
  const std::vector<NodeConfig>& nodes = config.nodes;
  const std::vector<std::vector<size_t>> children_of = ChildrenFastestFirst(config, parent_of);
  TreePlan plan;
  plan.source = nodes[root].id;
  plan.fanout_used = fanout;
  plan.chunk_size = config.tree.chunk_size;
  plan.nodes.reserve(nodes.size());
  std::vector<size_t> position(nodes.size(), kNoParent);  // node -> index in plan.nodes
  std::deque<size_t> queue = {root};
  while (!queue.empty()) {
    const size_t i = queue.front();
    queue.pop_front();
    const NodeConfig& n = nodes[i];
    PlannedNode p;
    p.id = n.id;
    p.region = n.region;
    p.manual_parent = n.parent.has_value();
    p.path_bps = std::numeric_limits<double>::infinity();
    if (i != root && parent_of[i] != kNoParent) {
      const NodeConfig& parent = nodes[parent_of[i]];
      const PlannedNode& pp = plan.nodes[position[parent_of[i]]];
      p.parent = parent.id;
      p.transports = HopTransports(config, parent, n);
      if (p.transports.empty()) return NoCommonTransport(config, parent, n, "", stripe);
      const NodeConfig* failover = pp.parent ? config.FindNode(*pp.parent) : root_failover;
      if (failover != nullptr) {
        p.failover_parent = failover->id;
        p.failover_transports = HopTransports(config, *failover, n);
        if (p.failover_transports.empty()) {
          return NoCommonTransport(config, *failover, n, "failover ", stripe);
        }
      }
      p.depth = pp.depth + 1;
      p.crosses_wan = parent.region != n.region;
      const HopRate link = hop(i, parent_of[i]);
      p.link_bps = link.bps;
      p.link_latency_s = link.latency_s;
      p.path_bps = std::min(pp.path_bps, p.link_bps);
      p.path_latency_s = pp.path_latency_s + p.link_latency_s;
    }
    for (size_t c : children_of[i]) {
      p.children.push_back(nodes[c].id);
      queue.push_back(c);
    }
    position[i] = plan.nodes.size();
    plan.nodes.push_back(std::move(p));
  }
  return plan;
}

}  // namespace deltacast::topology

#include "topology/plan_format.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "topology/units.h"

namespace deltacast::topology {
namespace {

std::string Join(const std::vector<std::string>& items) {
  if (items.empty()) return "-";
  std::string out;
  for (const std::string& s : items) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

std::string Address(const NodeConfig& n) {
  // Bracket IPv6 literals so the port stays unambiguous.
  const bool v6 = n.host.find(':') != std::string::npos;
  return (v6 ? "[" + n.host + "]" : n.host) + ":" + std::to_string(n.port);
}

struct RegionSummary {
  std::string name;
  size_t nodes = 0;
  std::vector<std::string> gateways;  // nodes entered over a WAN edge
  const RegionConfig* config = nullptr;
};

// Regions by name, the source's first.
std::vector<RegionSummary> SummarizeRegions(const TreePlan& plan, const ClusterConfig& config) {
  const PlannedNode* source = plan.Find(plan.source);
  std::map<std::string, RegionSummary> by_name;
  for (const PlannedNode& n : plan.nodes) {
    RegionSummary& r = by_name[n.region];
    r.name = n.region;
    r.config = config.FindRegion(n.region);
    ++r.nodes;
    if (n.crosses_wan) r.gateways.push_back(n.id);
  }
  std::vector<RegionSummary> out;
  out.push_back(by_name.at(source->region));
  for (auto& [name, r] : by_name) {
    if (name != source->region) out.push_back(std::move(r));
  }
  return out;
}

// "ucx (then tcp)": the transport a hop uses and what it falls back to.
std::string JoinFallbacks(const std::vector<std::string>& transports) {
  if (transports.empty()) return "-";
  std::string out = transports[0];
  for (size_t i = 1; i < transports.size(); ++i) {
    out += (i == 1 ? " (then " : ", then ") + transports[i];
  }
  return transports.size() > 1 ? out + ")" : out;
}

void AppendNode(const TreePlan& plan, const ClusterConfig& config, uint64_t delta_bytes,
                const std::map<std::string_view, const PlannedNode*>& by_id, const PlannedNode& n,
                std::string& out) {
  const NodeConfig* nc = config.FindNode(n.id);
  out += std::string(static_cast<size_t>(n.depth) * 2, ' ');
  out += n.id + "  [" + n.region + "]  " + Address(*nc) + "  uplink " +
         FormatBandwidth(nc->uplink_bps);
  if (!n.parent) {
    out += "  source";
  } else {
    out += "  <- " + *n.parent + " " + FormatBandwidth(n.link_bps);
    if (n.crosses_wan) {
      const RegionConfig* r = config.FindRegion(n.region);
      out += " WAN";
      if (r != nullptr) out += " +" + FormatDuration(r->wan_latency);
    }
    if (n.manual_parent) out += " (manual)";
    if (IsBridge(config, n.id)) {
      // The hop into a bridge node is the bucket (docs/object-store.md).
      out += " via bucket " + config.objstore->bucket + " at " + config.objstore->endpoint;
    } else {
      out += " via " + JoinFallbacks(n.transports);
    }
    if (HopUsesTls(config, *config.FindNode(*n.parent), *nc)) out += " +TLS";
    out += "  failover " + n.failover_parent.value_or("-");
    if (n.failover_parent) {
      out += " via " + JoinFallbacks(n.failover_transports);
      if (HopUsesTls(config, *config.FindNode(*n.failover_parent), *nc)) out += " +TLS";
    }
  }
  out += "  children " + Join(n.children);
  if (n.parent) out += "  done " + FormatSeconds(plan.PredictSecondsTo(n, delta_bytes));
  out += "\n";
  for (const std::string& c : n.children) {
    AppendNode(plan, config, delta_bytes, by_id, *by_id.at(c), out);
  }
}

}  // namespace

std::string FormatPlanText(const TreePlan& plan, const ClusterConfig& config,
                           uint64_t delta_bytes) {
  std::string out;
  const std::vector<RegionSummary> regions = SummarizeRegions(plan, config);
  out += "cluster \"" + config.name + "\"";
  if (!config.source_file.empty()) out += " (" + config.source_file.string() + ")";
  out += ": " + std::to_string(plan.nodes.size()) + " nodes in " + std::to_string(regions.size()) +
         (regions.size() == 1 ? " region" : " regions") + ", source " + plan.source + "\n";
  out += "fanout " + std::to_string(plan.fanout_used);
  if (plan.fanout_auto) {
    out += " (auto, best for a " + FormatSize(kAutoFanoutReferenceBytes) + " delta)";
  }
  out += ", chunk " + FormatSize(config.tree.chunk_size) + ", window " +
         std::to_string(config.tree.window) + ", hop latency " +
         FormatDuration(config.tree.hop_latency) + ", commit policy " +
         std::string(CommitPolicyName(config.tree.commit_policy)) + "\n";
  out += "regions:\n";
  for (const RegionSummary& r : regions) {
    out += "  " + r.name + ": " + std::to_string(r.nodes) + (r.nodes == 1 ? " node" : " nodes");
    if (r.name == regions.front().name) {
      out += " (source region)";
    } else if (r.config != nullptr) {
      out += ", WAN in " + FormatBandwidth(r.config->wan_bps) + " +" +
             FormatDuration(r.config->wan_latency);
    }
    if (!r.gateways.empty()) {
      out += (r.gateways.size() == 1 ? ", gateway " : ", WAN entries ") + Join(r.gateways);
    }
    std::vector<std::string> bridges;
    for (const PlannedNode& n : plan.nodes) {
      if (n.region == r.name && IsBridge(config, n.id)) bridges.push_back(n.id);
    }
    if (!bridges.empty()) out += ", through the object store (bridge " + Join(bridges) + ")";
    out += "\n";
  }
  if (config.objstore) {
    const ObjectStoreConfig& o = *config.objstore;
    out += "object store: bucket " + o.bucket + " at " + o.endpoint + ", keys under " + o.prefix +
           "/, bridges " + Join(o.bridges) + "\n";
    if (Status s = CheckBridgePlan(config, plan); !s.ok())
      out += "  WARNING: " + s.message() + "\n";
  }
  const PlannedNode& slowest = plan.SlowestNode(delta_bytes);
  out += "predicted refit for a " + FormatSize(delta_bytes) +
         " delta: " + FormatSeconds(plan.PredictSeconds(delta_bytes));
  if (slowest.parent) {
    out += " (slowest: " + slowest.id + ", depth " + std::to_string(slowest.depth) +
           ", bottleneck " + FormatBandwidth(slowest.path_bps) + ")";
  }
  out += "\n\n";

  std::map<std::string_view, const PlannedNode*> by_id;
  for (const PlannedNode& n : plan.nodes) by_id.emplace(n.id, &n);
  AppendNode(plan, config, delta_bytes, by_id, plan.nodes.front(), out);
  return out;
}

// Keys: cluster, config, source, fanout, fanout_auto, reference_delta_bytes (auto
// only), chunk_size, window, hop_latency_ms, commit_policy, delta_bytes,
// predicted_seconds, slowest_node, regions[{name, nodes, source_region, wan_bps,
// wan_latency_ms, gateways, bucket_bridges}], objstore ({endpoint, bucket, prefix, bridges} or
// null), nodes[{id, region, host, port, role, uplink_bps, parent, children,
// failover_parent, transports, failover_transports, depth, crosses_wan, manual_parent,
// bucket_bridge, link_bps, link_latency_ms, path_bps, predicted_seconds}] in breadth-first order.
// Absent parents and unmodelled WAN figures are null.
std::string FormatPlanJson(const TreePlan& plan, const ClusterConfig& config,
                           uint64_t delta_bytes) {
  using nlohmann::json;
  auto optional_string = [](const std::optional<std::string>& s) -> json {
    return s ? json(*s) : json(nullptr);
  };
  json out;
  out["cluster"] = config.name;
  out["config"] = config.source_file.string();
  out["source"] = plan.source;
  out["fanout"] = plan.fanout_used;
  out["fanout_auto"] = plan.fanout_auto;
  if (plan.fanout_auto) out["reference_delta_bytes"] = kAutoFanoutReferenceBytes;
  out["chunk_size"] = config.tree.chunk_size;
  out["window"] = config.tree.window;
  out["hop_latency_ms"] = config.tree.hop_latency.count();
  out["commit_policy"] = CommitPolicyName(config.tree.commit_policy);
  out["delta_bytes"] = delta_bytes;
  out["predicted_seconds"] = plan.PredictSeconds(delta_bytes);
  out["slowest_node"] = plan.SlowestNode(delta_bytes).id;

  json regions = json::array();
  const std::vector<RegionSummary> summaries = SummarizeRegions(plan, config);
  for (const RegionSummary& r : summaries) {
    json j;
    j["name"] = r.name;
    j["nodes"] = r.nodes;
    j["source_region"] = r.name == summaries.front().name;
    j["wan_bps"] = r.config ? json(r.config->wan_bps) : json(nullptr);
    j["wan_latency_ms"] = r.config ? json(r.config->wan_latency.count()) : json(nullptr);
    j["gateways"] = r.gateways;
    json bridges = json::array();
    for (const PlannedNode& n : plan.nodes) {
      if (n.region == r.name && IsBridge(config, n.id)) bridges.push_back(n.id);
    }
    j["bucket_bridges"] = std::move(bridges);
    regions.push_back(std::move(j));
  }
  out["regions"] = std::move(regions);
  if (config.objstore) {
    const ObjectStoreConfig& o = *config.objstore;
    out["objstore"] = {{"endpoint", o.endpoint},
                       {"bucket", o.bucket},
                       {"prefix", o.prefix},
                       {"bridges", o.bridges}};
  } else {
    out["objstore"] = nullptr;
  }

  json nodes = json::array();
  for (const PlannedNode& n : plan.nodes) {
    const NodeConfig* nc = config.FindNode(n.id);
    json j;
    j["id"] = n.id;
    j["region"] = n.region;
    j["host"] = nc->host;
    j["port"] = nc->port;
    j["role"] = RoleName(nc->role);
    j["uplink_bps"] = nc->uplink_bps;
    j["parent"] = optional_string(n.parent);
    j["children"] = n.children;
    j["failover_parent"] = optional_string(n.failover_parent);
    j["transports"] = n.transports;
    j["failover_transports"] = n.failover_transports;
    j["tls"] = n.parent && HopUsesTls(config, *config.FindNode(*n.parent), *nc);
    j["depth"] = n.depth;
    j["crosses_wan"] = n.crosses_wan;
    j["manual_parent"] = n.manual_parent;
    j["bucket_bridge"] = IsBridge(config, n.id);
    j["link_bps"] = n.link_bps;
    j["link_latency_ms"] = n.link_latency_s * 1000.0;
    // JSON has no infinity: the source's path is unconstrained.
    j["path_bps"] = std::isfinite(n.path_bps) ? json(n.path_bps) : json(nullptr);
    j["predicted_seconds"] = plan.PredictSecondsTo(n, delta_bytes);
    nodes.push_back(std::move(j));
  }
  out["nodes"] = std::move(nodes);
  return out.dump(2);
}

}  // namespace deltacast::topology

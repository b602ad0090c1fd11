#include "topology/plan_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
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

// The model's time until a node has what its tree carries.
using SecondsTo = std::function<double(const PlannedNode&)>;

void AppendNode(const SecondsTo& seconds_to, const ClusterConfig& config,
                const std::map<std::string_view, const PlannedNode*>& by_id, const PlannedNode& n,
                std::string& out) {
  const NodeConfig* nc = config.FindNode(n.id);
  out += std::string(static_cast<size_t>(n.depth) * 2, ' ');
  out += n.id + "  [" + n.region + "]  " + Address(*nc) + "  uplink " +
         FormatBandwidth(nc->uplink_bps);
  if (!n.parent) {
    out += nc->role == Role::kSource ? "  source" : "  root";
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
  if (n.parent) out += "  done " + FormatSeconds(seconds_to(n));
  out += "\n";
  for (const std::string& c : n.children) AppendNode(seconds_to, config, by_id, *by_id.at(c), out);
}

void AppendTree(const TreePlan& plan, const ClusterConfig& config, const SecondsTo& seconds_to,
                std::string& out) {
  std::map<std::string_view, const PlannedNode*> by_id;
  for (const PlannedNode& n : plan.nodes) by_id.emplace(n.id, &n);
  AppendNode(seconds_to, config, by_id, plan.nodes.front(), out);
}

nlohmann::json NodeJson(const PlannedNode& n, const ClusterConfig& config, double seconds) {
  using nlohmann::json;
  auto optional_string = [](const std::optional<std::string>& s) -> json {
    return s ? json(*s) : json(nullptr);
  };
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
  // JSON has no infinity: the root's path is unconstrained.
  j["path_bps"] = std::isfinite(n.path_bps) ? json(n.path_bps) : json(nullptr);
  j["predicted_seconds"] = seconds;
  return j;
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
  AppendTree(
      plan, config, [&](const PlannedNode& n) { return plan.PredictSecondsTo(n, delta_bytes); },
      out);
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
    nodes.push_back(NodeJson(n, config, plan.PredictSecondsTo(n, delta_bytes)));
  }
  out["nodes"] = std::move(nodes);
  return out.dump(2);
}

namespace {

// "snd0 1.00, snd1 1.00, ...": shares, largest first then by id, six to a line.
std::string FormatShares(const std::map<std::string, double>& shares) {
  std::vector<std::pair<std::string, double>> sorted(shares.begin(), shares.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (size_t i = 0; i < sorted.size(); ++i) {
    char share[32];
    std::snprintf(share, sizeof share, "%.2f", sorted[i].second);
    out += (i % 6 == 0 ? "\n  " : ", ") + sorted[i].first + " " + share;
  }
  return out + "\n";
}

std::string UploadLine(const StripedPlan& plan) {
  return "upload per refit, in deltas (a stripe is 1/" + std::to_string(plan.stripes.size()) +
         "):" + FormatShares(plan.UploadShare());
}

// Per region of the first stripe's tree: the node each stripe enters it by.
std::map<std::string, std::vector<std::string>> GatewaysByStripe(const StripedPlan& plan) {
  std::map<std::string, std::vector<std::string>> entries;
  for (const StripeTree& st : plan.stripes) {
    for (const PlannedNode& n : st.tree.nodes) {
      if (!n.crosses_wan) continue;
      auto& list = entries[n.region];
      list.resize(plan.stripes.size());
      list[static_cast<size_t>(st.index)] +=
          (list[static_cast<size_t>(st.index)].empty() ? "" : "+") + n.id;
    }
  }
  return entries;
}

// The stripe and node that finish last.
std::pair<int, const PlannedNode*> Slowest(const StripedPlan& plan, uint64_t delta_bytes) {
  std::pair<int, const PlannedNode*> slowest = {0, &plan.stripes.front().tree.nodes.front()};
  double worst = 0;
  for (const StripeTree& st : plan.stripes) {
    for (const PlannedNode& n : st.tree.nodes) {
      const double t = plan.PredictSecondsTo(st.index, n, delta_bytes);
      if (t > worst) {
        worst = t;
        slowest = {st.index, &n};
      }
    }
  }
  return slowest;
}

}  // namespace

std::string FormatStripedPlanText(const StripedPlan& plan, const ClusterConfig& config,
                                  uint64_t delta_bytes) {
  if (plan.stripes.size() == 1 && plan.stripes[0].feeder.empty()) {
    return FormatPlanText(plan.stripes[0].tree, config, delta_bytes) + "\nstripes 1" +
           (plan.stripes_auto ? " (auto)" : "") + ": the single tree above\n" + UploadLine(plan);
  }
  const TreePlan& first = plan.stripes.front().tree;
  std::string out = "cluster \"" + config.name + "\"";
  if (!config.source_file.empty()) out += " (" + config.source_file.string() + ")";
  out += ": " + std::to_string(config.nodes.size()) + " nodes, source " + plan.source + "\n";
  out += "stripes " + std::to_string(plan.stripes.size());
  if (plan.stripes_auto) out += " (auto: senders, capped by the gateways a region lists)";
  out += ", chunk k in stripe k mod " + std::to_string(plan.stripes.size()) + ", fanout " +
         std::to_string(first.fanout_used);
  if (first.fanout_auto) {
    out += " (auto, best for a " + FormatSize(kAutoFanoutReferenceBytes) + " delta)";
  }
  out += ", chunk " + FormatSize(config.tree.chunk_size) + ", window " +
         std::to_string(config.tree.window) + ", hop latency " +
         FormatDuration(config.tree.hop_latency) + ", commit policy " +
         std::string(CommitPolicyName(config.tree.commit_policy)) + ", fingerprint " +
         plan.Fingerprint().ShortHex() + "\n";
  out += "regions:\n";
  const std::map<std::string, std::vector<std::string>> entries = GatewaysByStripe(plan);
  for (const RegionSummary& r : SummarizeRegions(first, config)) {
    out += "  " + r.name + ": " + std::to_string(r.nodes) + (r.nodes == 1 ? " node" : " nodes");
    if (r.name == first.nodes.front().region) {
      out += " of the trees (source region)";
    } else if (r.config != nullptr) {
      out += ", WAN in " + FormatBandwidth(r.config->wan_bps) + " +" +
             FormatDuration(r.config->wan_latency) + ", per flow " +
             FormatBandwidth(r.config->FlowCapBps());
    }
    if (const auto it = entries.find(r.name); it != entries.end()) {
      out += ", entered by stripe";
      for (size_t s = 0; s < it->second.size(); ++s) {
        out += (s == 0 ? " " : ", ") + std::to_string(s) + ": " +
               (it->second[s].empty() ? "-" : it->second[s]);
      }
    }
    out += "\n";
  }
  const auto [slow_stripe, slow_node] = Slowest(plan, delta_bytes);
  out += "predicted refit for a " + FormatSize(delta_bytes) + " delta (" +
         FormatSize(plan.StripeBytes(delta_bytes)) +
         " per stripe): " + FormatSeconds(plan.PredictSeconds(delta_bytes)) +
         " (slowest: " + slow_node->id + " in stripe " + std::to_string(slow_stripe) + ", depth " +
         std::to_string(slow_node->depth) + ", bottleneck " +
         FormatBandwidth(std::min(slow_node->path_bps,
                                  plan.stripes[static_cast<size_t>(slow_stripe)].feeder.empty()
                                      ? slow_node->path_bps
                                      : plan.stripes[static_cast<size_t>(slow_stripe)].feed_bps)) +
         ")\n";
  out += UploadLine(plan);
  for (const StripeTree& st : plan.stripes) {
    out += "\nstripe " + std::to_string(st.index) + ": root " + st.root;
    if (!st.feeder.empty()) {
      out += ", fed by " + st.feeder + " at " + FormatBandwidth(st.feed_bps) + " via " +
             JoinFallbacks(st.feeder_transports);
    }
    out += ", fingerprint " + st.tree.Fingerprint().ShortHex() + "\n";
    AppendTree(
        st.tree, config,
        [&](const PlannedNode& n) { return plan.PredictSecondsTo(st.index, n, delta_bytes); }, out);
  }
  return out;
}

std::string FormatStripedPlanJson(const StripedPlan& plan, const ClusterConfig& config,
                                  uint64_t delta_bytes) {
  using nlohmann::json;
  json shares = json::object();
  for (const auto& [id, share] : plan.UploadShare()) shares[id] = share;
  if (plan.stripes.size() == 1 && plan.stripes[0].feeder.empty()) {
    json out = json::parse(FormatPlanJson(plan.stripes[0].tree, config, delta_bytes));
    out["stripe_count"] = 1;
    out["stripes_auto"] = plan.stripes_auto;
    out["fingerprint"] = plan.Fingerprint().ToHex();
    out["upload_share"] = std::move(shares);
    return out.dump(2);
  }
  json out;
  out["cluster"] = config.name;
  out["config"] = config.source_file.string();
  out["source"] = plan.source;
  out["stripe_count"] = plan.stripes.size();
  out["stripes_auto"] = plan.stripes_auto;
  out["fingerprint"] = plan.Fingerprint().ToHex();
  out["chunk_size"] = config.tree.chunk_size;
  out["window"] = config.tree.window;
  out["hop_latency_ms"] = config.tree.hop_latency.count();
  out["commit_policy"] = CommitPolicyName(config.tree.commit_policy);
  out["delta_bytes"] = delta_bytes;
  out["stripe_bytes"] = plan.StripeBytes(delta_bytes);
  out["predicted_seconds"] = plan.PredictSeconds(delta_bytes);
  const auto [slow_stripe, slow_node] = Slowest(plan, delta_bytes);
  out["slowest"] = {{"stripe", slow_stripe}, {"node", slow_node->id}};
  out["upload_share"] = std::move(shares);

  const TreePlan& first = plan.stripes.front().tree;
  const std::map<std::string, std::vector<std::string>> entries = GatewaysByStripe(plan);
  json regions = json::array();
  for (const RegionSummary& r : SummarizeRegions(first, config)) {
    json j;
    j["name"] = r.name;
    j["nodes"] = r.nodes;
    j["source_region"] = r.name == first.nodes.front().region;
    j["wan_bps"] = r.config ? json(r.config->wan_bps) : json(nullptr);
    j["flow_bps"] = r.config ? json(r.config->FlowCapBps()) : json(nullptr);
    j["wan_latency_ms"] = r.config ? json(r.config->wan_latency.count()) : json(nullptr);
    const auto it = entries.find(r.name);
    j["gateways"] = it == entries.end() ? json::array() : json(it->second);
    regions.push_back(std::move(j));
  }
  out["regions"] = std::move(regions);

  json stripes = json::array();
  for (const StripeTree& st : plan.stripes) {
    json j;
    j["index"] = st.index;
    j["root"] = st.root;
    j["feeder"] = st.feeder.empty() ? json(nullptr) : json(st.feeder);
    j["feeder_transports"] = st.feeder_transports;
    j["feed_bps"] = st.feeder.empty() ? json(nullptr) : json(st.feed_bps);
    j["fanout"] = st.tree.fanout_used;
    j["fanout_auto"] = st.tree.fanout_auto;
    j["fingerprint"] = st.tree.Fingerprint().ToHex();
    double worst = 0;
    json nodes = json::array();
    for (const PlannedNode& n : st.tree.nodes) {
      const double t = plan.PredictSecondsTo(st.index, n, delta_bytes);
      worst = std::max(worst, t);
      nodes.push_back(NodeJson(n, config, t));
    }
    j["predicted_seconds"] = worst;
    j["nodes"] = std::move(nodes);
    stripes.push_back(std::move(j));
  }
  out["stripes"] = std::move(stripes);
  return out.dump(2);
}

}  // namespace deltacast::topology

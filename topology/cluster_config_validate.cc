// ValidateClusterConfig: the checks across a whole parsed config (ids, listeners,
// regions, links, manual parents), each error naming the entry and its line.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "topology/cluster_config.h"
#include "topology/internal/config_text.h"
#include "topology/objstore_config.h"
#include "topology/units.h"

namespace deltacast::topology {
namespace {

using internal::IsValidEnvName;
using internal::IsValidId;
using internal::kMaxFanout;
using internal::kMaxStripes;
using internal::kMaxWindow;
using internal::LowerAscii;
using internal::Quoted;

// "file:line: message", or "file: message" when the line is unknown (built in code).
Status ConfigError(const ClusterConfig& config, int line, std::string_view message) {
  std::string where = config.source_file.empty() ? "cluster config" : config.source_file.string();
  if (line > 0) where += ":" + std::to_string(line);
  return Status::InvalidArgument(where + ": " + std::string(message));
}

std::string NodeName(const NodeConfig& n) { return "[[node]] " + Quoted(n.id); }

// Manual parents: each must name another existing node, the source has none, and
// following them from any node must end at a node the planner places (one without a
// manual parent, or the source), never loop.
Status ValidateParents(const ClusterConfig& config) {
  std::map<std::string_view, const NodeConfig*> by_id;
  for (const NodeConfig& n : config.nodes) by_id.emplace(n.id, &n);
  for (const NodeConfig& n : config.nodes) {
    if (!n.parent) continue;
    const int line = n.parent_line > 0 ? n.parent_line : n.line;
    if (n.role == Role::kSource) {
      return ConfigError(config, line,
                         NodeName(n) + " is the source and cannot have a parent (parent = " +
                             Quoted(*n.parent) + ")");
    }
    if (*n.parent == n.id) {
      return ConfigError(
          config, line, NodeName(n) + ": parent = " + Quoted(*n.parent) + " names the node itself");
    }
    if (by_id.find(*n.parent) == by_id.end()) {
      return ConfigError(
          config, line,
          NodeName(n) + ": parent = " + Quoted(*n.parent) + " is not a node in this config");
    }
  }
  // Walk each chain of manual parents. Chains that loop are reported first, at the
  // first (in file order) node on the loop, so the message names the loop itself.
  Status unreachable = Status::Ok();
  for (const NodeConfig& n : config.nodes) {
    std::vector<const NodeConfig*> chain;
    std::set<std::string_view> seen;
    const NodeConfig* at = &n;
    while (at->parent && seen.insert(at->id).second) {
      chain.push_back(at);
      at = by_id.at(*at->parent);
    }
    if (!at->parent) continue;  // reached a planned node or the source
    // `at` is the first repeated node: the loop is the chain from `at` onwards.
    if (at == &n) {
      std::string path;
      for (const NodeConfig* c : chain) path += c->id + " -> ";
      path += n.id;
      return ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                         NodeName(n) + ": parent = " + Quoted(*n.parent) +
                             " makes a cycle of manual parents: " + path);
    }
    if (unreachable.ok()) {
      std::string path;
      for (const NodeConfig* c : chain) path += c->id + " -> ";
      path += at->id;
      unreachable = ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                                NodeName(n) + " (parent = " + Quoted(*n.parent) +
                                    ") is not reachable from the source: its parent chain " + path +
                                    " loops");
    }
  }
  return unreachable;
}

Status ValidateLinks(const ClusterConfig& config,
                     const std::map<std::string_view, const RegionConfig*>& regions) {
  for (const LinkRule& rule : config.links) {
    for (const std::string& selector : {rule.from, rule.to}) {
      if (selector == "*") continue;
      if (selector.starts_with("region:")) {
        const std::string_view region = std::string_view(selector).substr(7);
        const bool known = regions.contains(region) ||
                           std::any_of(config.nodes.begin(), config.nodes.end(),
                                       [&](const NodeConfig& n) { return n.region == region; });
        if (!known) {
          return ConfigError(config, rule.line,
                             "[[link]] " + Quoted(selector) + " names no region of any node");
        }
      } else if (config.FindNode(selector) == nullptr) {
        return ConfigError(
            config, rule.line,
            "[[link]] " + Quoted(selector) + " is not a node id (or \"region:NAME\", or \"*\")");
      }
    }
    if (rule.transports.empty()) {
      return ConfigError(config, rule.line, "[[link]] transports must not be empty");
    }
    for (const std::string& t : rule.transports) {
      const auto& known = KnownTransports();
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        return ConfigError(config, rule.line, "[[link]] unknown transport " + Quoted(t));
      }
    }
  }
  return Status::Ok();
}

// Senders, gateways and the stripe count (topology/stripe_plan.h): a sender is a
// trainer-side host fed by the source over its LAN, so it sits in the source's region
// and has no manual parent; a gateway is where a stripe enters a remote region, so it
// is a receiver outside the source's region whose parent the planner picks.
Status ValidateStripeRoles(const ClusterConfig& config, const NodeConfig& source) {
  int senders = 0;
  for (const NodeConfig& n : config.nodes) {
    if (n.role == Role::kSender) {
      ++senders;
      if (n.region != source.region) {
        return ConfigError(config, n.line,
                           NodeName(n) + " has role = \"sender\" but region = " + Quoted(n.region) +
                               ": a sender is fed by the source over its LAN "
                               "and must be in the source's region (" +
                               Quoted(source.region) + ")");
      }
      if (n.parent) {
        return ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                           NodeName(n) + " has role = \"sender\" and parent = " +
                               Quoted(*n.parent) + ": a sender's parent is always the source");
      }
    }
    if (!n.gateway) continue;
    if (n.role != Role::kReceiver) {
      return ConfigError(config, n.line,
                         NodeName(n) + " has gateway = true but role = \"" +
                             std::string(RoleName(n.role)) + "\": only receivers are gateways");
    }
    if (n.region == source.region) {
      return ConfigError(config, n.line,
                         NodeName(n) + " has gateway = true but is in the source's region (" +
                             Quoted(n.region) +
                             "): a gateway is where the WAN enters a remote "
                             "region");
    }
    if (n.parent) {
      return ConfigError(config, n.parent_line > 0 ? n.parent_line : n.line,
                         NodeName(n) + " has gateway = true and a manual parent = " +
                             Quoted(*n.parent) + ": the planner picks a gateway's parent");
    }
  }
  if (const std::optional<int>& s = config.tree.stripes) {
    if (*s < 1 || *s > kMaxStripes) {
      return ConfigError(config, config.tree.stripes_line,
                         "[tree] stripes = " + std::to_string(*s) + " is out of range [1, " +
                             std::to_string(kMaxStripes) + "]");
    }
    if (senders > 0 && *s > senders) {
      return ConfigError(config, config.tree.stripes_line,
                         "[tree] stripes = " + std::to_string(*s) + " but only " +
                             std::to_string(senders) + " node" + (senders == 1 ? "" : "s") +
                             " have role = \"sender\": each stripe needs its own sender to "
                             "root it (list more senders, or lower stripes)");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateClusterConfig(const ClusterConfig& config) {
  if (config.name.empty()) return ConfigError(config, 0, "[cluster] name must not be empty");
  if (!IsValidEnvName(config.auth_token_env)) {
    return ConfigError(config, 0,
                       "[cluster] auth_token_env = " + Quoted(config.auth_token_env) +
                           " is not an environment variable name");
  }
  const TreeConfig& tree = config.tree;
  if (tree.fanout && (*tree.fanout < 1 || *tree.fanout > kMaxFanout)) {
    return ConfigError(config, 0,
                       "[tree] fanout = " + std::to_string(*tree.fanout) + " is out of range [1, " +
                           std::to_string(kMaxFanout) + "]");
  }
  if (tree.window < 1 || tree.window > kMaxWindow) {
    return ConfigError(config, 0,
                       "[tree] window = " + std::to_string(tree.window) + " is out of range [1, " +
                           std::to_string(kMaxWindow) + "]");
  }
  if (tree.chunk_size < kMinChunkSize || tree.chunk_size > kMaxChunkSize) {
    return ConfigError(
        config, 0, "[tree] chunk_size = " + std::to_string(tree.chunk_size) + " is out of range");
  }
  if (tree.hop_latency.count() < 0 || tree.connect_timeout.count() <= 0 ||
      tree.idle_timeout.count() <= 0 || tree.commit_timeout.count() <= 0) {
    return ConfigError(config, 0, "[tree] latencies must be >= 0 and timeouts > 0");
  }

  if (config.nodes.empty()) return ConfigError(config, 0, "no [[node]] entries");
  std::map<std::string_view, const NodeConfig*> ids;
  std::map<std::string, std::string> listeners;  // host:port -> which node and transport
  const NodeConfig* source = nullptr;
  for (const NodeConfig& n : config.nodes) {
    if (!IsValidId(n.id)) {
      return ConfigError(config, n.line,
                         "[[node]] id = " + Quoted(n.id) + " is not a valid node id");
    }
    if (auto [it, inserted] = ids.emplace(n.id, &n); !inserted) {
      return ConfigError(config, n.line,
                         "[[node]] id = " + Quoted(n.id) + " is already used by the node at line " +
                             std::to_string(it->second->line));
    }
    if (n.host.empty()) return ConfigError(config, n.line, NodeName(n) + ": host is empty");
    if (n.port == 0) return ConfigError(config, n.line, NodeName(n) + ": port 0 is not allowed");
    // Host names are case-insensitive; "localhost" vs "127.0.0.1" is beyond a config
    // check and surfaces as a bind error instead. Each transport listens on its own
    // port (port + offset), and no two listeners may share one.
    for (const std::string& t : n.transports) {
      const uint32_t port = uint32_t{n.port} + TransportPortOffset(t);
      if (port > 65535) {
        return ConfigError(config, n.line,
                           NodeName(n) + ": port " + std::to_string(n.port) + " + " +
                               std::to_string(TransportPortOffset(t)) + " for its " + t +
                               " listener is above 65535");
      }
      const std::string address = LowerAscii(n.host) + ":" + std::to_string(port);
      const std::string what = NodeName(n) + " (" + t + ")";
      if (auto [it, inserted] = listeners.emplace(address, what); !inserted) {
        return ConfigError(config, n.line,
                           what + ": host:port " + n.host + ":" + std::to_string(port) +
                               " is already used by " + it->second +
                               " (a node listens on port + 1 for ucx, port + 2 for ofi)");
      }
    }
    if (!(n.uplink_bps > 0) || !std::isfinite(n.uplink_bps)) {
      return ConfigError(config, n.line, NodeName(n) + ": uplink must be greater than zero");
    }
    if (n.transports.empty()) {
      return ConfigError(config, n.line, NodeName(n) + ": transports must not be empty");
    }
    for (const std::string& t : n.transports) {
      const auto& known = KnownTransports();
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        return ConfigError(config, n.line, NodeName(n) + ": unknown transport " + Quoted(t));
      }
    }
    if (n.role == Role::kSource) {
      if (source != nullptr) {
        return ConfigError(config, n.line,
                           NodeName(n) + " has role = \"source\" but " + NodeName(*source) +
                               " (line " + std::to_string(source->line) +
                               ") is already the source; a cluster has exactly one source");
      }
      source = &n;
    }
  }
  if (source == nullptr) {
    return ConfigError(config, 0, "no [[node]] has role = \"source\"; exactly one must");
  }

  std::map<std::string_view, const RegionConfig*> regions;
  for (const RegionConfig& r : config.regions) {
    if (!IsValidId(r.name)) {
      return ConfigError(config, r.line, "[[region]] name = " + Quoted(r.name) + " is not valid");
    }
    if (auto [it, inserted] = regions.emplace(r.name, &r); !inserted) {
      return ConfigError(config, r.line,
                         "[[region]] name = " + Quoted(r.name) + " is already declared at line " +
                             std::to_string(it->second->line));
    }
    if (!(r.wan_bps > 0) || !std::isfinite(r.wan_bps) || r.wan_latency.count() < 0) {
      return ConfigError(
          config, r.line,
          "[[region]] " + Quoted(r.name) + ": wan_bandwidth must be > 0 and wan_latency >= 0");
    }
    if (!(r.flow_bps >= 0) || !std::isfinite(r.flow_bps)) {  // 0: no per-flow cap
      return ConfigError(config, r.line,
                         "[[region]] " + Quoted(r.name) + ": flow_bandwidth must be > 0");
    }
  }
  std::set<std::string_view> used_regions;
  for (const NodeConfig& n : config.nodes) {
    if (!IsValidId(n.region)) {
      return ConfigError(config, n.line,
                         NodeName(n) + ": region = " + Quoted(n.region) + " is not a valid name");
    }
    used_regions.insert(n.region);
    if (n.region != source->region && regions.find(n.region) == regions.end()) {
      return ConfigError(config, n.line,
                         NodeName(n) + ": region = " + Quoted(n.region) +
                             " is not the source's region (" + Quoted(source->region) +
                             ") and has no [[region]] entry giving its wan_bandwidth and "
                             "wan_latency");
    }
  }
  // Producers sit in a region too (for tls = "cross-region"): the source's or a
  // declared one, so a misspelled name is caught rather than quietly encrypting.
  if (const std::string& p = config.security.producer_region; !p.empty()) {
    if (p != source->region && regions.find(p) == regions.end()) {
      return ConfigError(config, config.security.line,
                         "[security] producer_region = " + Quoted(p) +
                             " is not the source's region (" + Quoted(source->region) +
                             ") nor a [[region]] entry");
    }
    used_regions.insert(p);
  }
  for (const RegionConfig& r : config.regions) {
    if (used_regions.count(r.name) == 0) {
      return ConfigError(config, r.line,
                         "[[region]] name = " + Quoted(r.name) +
                             " is not used by any [[node]] (a misspelled region name?)");
    }
  }
  RETURN_IF_ERROR(ValidateLinks(config, regions));
  RETURN_IF_ERROR(ValidateStripeRoles(config, *source));
  RETURN_IF_ERROR(ValidateObjectStoreConfig(config));
  return ValidateParents(config);
}

}  // namespace deltacast::topology

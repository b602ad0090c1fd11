// PlanStripes: the shape of every stripe's tree and the striped model
// (topology/stripe_plan.h says what both are and why).
#include "topology/stripe_plan.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "topology/internal/config_text.h"
#include "topology/internal/plan_tree.h"

namespace deltacast::topology {
namespace {

constexpr size_t kNone = kNoParent;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// One region's planned receivers and how they split into the stripes' groups.
struct RegionPart {
  bool remote = false;
  std::vector<size_t> members;              // fastest first
  std::vector<size_t> gateways;             // remote only: candidates, fastest first
  std::vector<std::vector<size_t>> groups;  // per stripe, fastest first
};

// What does not depend on the fanout. Nodes are named by their index in config.nodes.
struct Layout {
  const ClusterConfig* config = nullptr;
  int stripes = 1;
  size_t source = 0;
  std::vector<size_t> roots;        // per stripe
  bool fed = false;                 // roots are senders that the source feeds
  std::vector<RegionPart> regions;  // the source's region first, then by name
  // Per region, per stripe: [subtree root, group, everyone else] (StripeOrder).
  std::vector<std::vector<std::vector<size_t>>> orders;
  std::vector<std::pair<size_t, size_t>> manual;  // (node, its configured parent)
};

// Splits `members` (fastest first) into `stripes` groups; group j starts with
// seeds[j] when there is one, every other member joins the smallest group.
std::vector<std::vector<size_t>> SplitGroups(const std::vector<size_t>& members,
                                             const std::vector<size_t>& seeds, int stripes) {
  std::vector<std::vector<size_t>> groups(static_cast<size_t>(stripes));
  const size_t seeded = std::min(seeds.size(), groups.size());
  for (size_t j = 0; j < seeded; ++j) groups[j].push_back(seeds[j]);
  for (size_t m : members) {
    if (std::find(seeds.begin(), seeds.begin() + static_cast<std::ptrdiff_t>(seeded), m) !=
        seeds.begin() + static_cast<std::ptrdiff_t>(seeded)) {
      continue;
    }
    auto smallest =
        std::min_element(groups.begin(), groups.end(),
                         [](const auto& a, const auto& b) { return a.size() < b.size(); });
    smallest->push_back(m);
  }
  return groups;
}

std::vector<size_t> StripeOrder(const Layout& layout, const RegionPart& part, int s);

// Whether `part`'s subtree root in each stripe is one of its members, a child of
// the stripe's root: in a remote region (its gateway), and at home when the source
// roots every stripe itself. The source then sends each stripe to one head, as
// SplitStream's source does, so its uplink carries one copy of the delta in all,
// not k copies (k children in each of S stripes, each 1/S of the delta).
bool HangsBelowRoot(const Layout& layout, const RegionPart& part) {
  return part.remote || !layout.fed;
}

Layout MakeLayout(const ClusterConfig& config, int stripes) {
  Layout layout;
  layout.config = &config;
  layout.stripes = stripes;
  const std::vector<NodeConfig>& nodes = config.nodes;
  auto faster_first = [&](size_t a, size_t b) { return FasterFirst(nodes[a], nodes[b]); };
  std::map<std::string_view, size_t> index;
  std::vector<size_t> senders;
  for (size_t i = 0; i < nodes.size(); ++i) {
    index.emplace(nodes[i].id, i);
    if (nodes[i].role == Role::kSource) layout.source = i;
    if (nodes[i].role == Role::kSender) senders.push_back(i);
  }
  std::sort(senders.begin(), senders.end(), faster_first);
  layout.fed = !senders.empty();
  for (int s = 0; s < stripes; ++s) {
    layout.roots.push_back(layout.fed ? senders[static_cast<size_t>(s)] : layout.source);
  }

  const std::string& source_region = nodes[layout.source].region;
  RegionPart home;
  std::map<std::string_view, RegionPart> remote;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].role != Role::kReceiver) continue;
    if (nodes[i].parent) {
      layout.manual.emplace_back(i, index.at(*nodes[i].parent));
    } else if (nodes[i].region == source_region) {
      home.members.push_back(i);
    } else {
      remote[nodes[i].region].members.push_back(i);
    }
  }
  std::sort(home.members.begin(), home.members.end(), faster_first);
  home.groups = SplitGroups(home.members, {}, stripes);
  layout.regions.push_back(std::move(home));
  for (auto& [name, part] : remote) {
    part.remote = true;
    std::sort(part.members.begin(), part.members.end(), faster_first);
    for (size_t m : part.members) {
      if (nodes[m].gateway) part.gateways.push_back(m);
    }
    if (part.gateways.empty()) part.gateways.push_back(part.members.front());
    part.groups = SplitGroups(part.members, part.gateways, stripes);
    layout.regions.push_back(std::move(part));
  }
  for (const RegionPart& part : layout.regions) {
    auto& orders = layout.orders.emplace_back();
    if (part.members.empty()) continue;
    for (int s = 0; s < stripes; ++s) orders.push_back(StripeOrder(layout, part, s));
  }
  return layout;
}

// The subtree root of `part` in stripe `s`, and the order its k-ary fill takes:
// [subtree root, group s, everyone else].
std::vector<size_t> StripeOrder(const Layout& layout, const RegionPart& part, int s) {
  const size_t si = static_cast<size_t>(s);
  size_t top = layout.roots[si];
  if (part.remote) {
    top = part.gateways[si % part.gateways.size()];
  } else if (HangsBelowRoot(layout, part)) {
    // Group s's fastest member; with fewer members than stripes some groups are
    // empty and their stripes take heads round-robin.
    top =
        part.groups[si].empty() ? part.members[si % part.members.size()] : part.groups[si].front();
  }
  std::vector<size_t> order = {top};
  for (size_t m : part.groups[si]) {
    if (m != top) order.push_back(m);
  }
  for (size_t m : part.members) {
    if (m == top) continue;
    if (std::find(part.groups[si].begin(), part.groups[si].end(), m) != part.groups[si].end()) {
      continue;
    }
    order.push_back(m);
  }
  return order;
}

// The edges of region r's subtrees in all stripes together.
size_t RegionEdges(const Layout& layout, size_t r) {
  size_t edges = 0;
  for (const std::vector<size_t>& order : layout.orders[r]) edges += order.size() - 1;
  return edges;
}

// The largest fanout that changes a balanced tree: from a region's edges in all
// stripes on, its subtree roots take every child of their stripes and each subtree
// is a star. (A subtree root of several stripes, a region's only gateway, needs that
// much room before its stripes' subtrees flatten: a smaller bound missed the plans
// where a WAN flow's cap, not the uplinks, is the bottleneck and depth decides.)
int MaxUsefulFanout(const Layout& layout) {
  size_t most = 1;
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    most = std::max(most, RegionEdges(layout, r));
  }
  return static_cast<int>(most);
}

// Every stripe's parent of every node (kNone: not in that stripe's tree, or its root).
using Shape = std::vector<std::vector<size_t>>;

// A manual parent is kept in every stripe; one outside a stripe's tree (the feeding
// source, another stripe's sender) is replaced by the stripe's root.
void AddManualParents(const Layout& layout, Shape& shape) {
  const std::vector<NodeConfig>& nodes = layout.config->nodes;
  for (size_t s = 0; s < shape.size(); ++s) {
    const size_t root = layout.roots[s];
    for (const auto& [node, parent] : layout.manual) {
      const bool in_tree = parent == root || nodes[parent].role == Role::kReceiver;
      shape[s][node] = in_tree ? parent : root;
    }
  }
}

// A configured fanout (used as is): each region's k-ary fill of its stripe order.
Shape KaryShape(const Layout& layout, int fanout) {
  const size_t k = static_cast<size_t>(fanout);
  Shape shape(static_cast<size_t>(layout.stripes),
              std::vector<size_t>(layout.config->nodes.size(), kNone));
  for (int s = 0; s < layout.stripes; ++s) {
    std::vector<size_t>& parent_of = shape[static_cast<size_t>(s)];
    const size_t root = layout.roots[static_cast<size_t>(s)];
    for (size_t r = 0; r < layout.regions.size(); ++r) {
      if (layout.orders[r].empty()) continue;
      const std::vector<size_t>& order = layout.orders[r][static_cast<size_t>(s)];
      if (HangsBelowRoot(layout, layout.regions[r])) parent_of[order.front()] = root;
      for (size_t p = 1; p < order.size(); ++p) parent_of[order[p]] = order[(p - 1) / k];
    }
  }
  AddManualParents(layout, shape);
  return shape;
}

// Each stripe's subtree of `part` as parent links in `parent_of`: `fill` is the order
// (relays first, each with at least one child), `children[i]` what fill[i] sends.
void FillBreadthFirst(const std::vector<size_t>& fill, const std::vector<size_t>& children,
                      std::vector<size_t>& parent_of) {
  size_t q = 0, used = 0;
  for (size_t p = 1; p < fill.size(); ++p) {
    if (used == children[q]) {
      ++q;
      used = 0;
    }
    parent_of[fill[p]] = fill[q];
    ++used;
  }
}

// fanout = "auto": every node sends at most `fanout` children in all stripes together
// (see the header, "Balanced fill"). nullopt when that cannot cover every stripe.
std::optional<Shape> BalancedShape(const Layout& layout, int fanout) {
  const std::vector<NodeConfig>& nodes = layout.config->nodes;
  const size_t k = static_cast<size_t>(fanout);
  const size_t stripes = static_cast<size_t>(layout.stripes);
  Shape shape(stripes, std::vector<size_t>(nodes.size(), kNone));
  std::vector<size_t> load(nodes.size(), 0);  // children in all stripes
  auto spare = [&](size_t m) { return load[m] < k ? k - load[m] : size_t{0}; };
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const RegionPart& part = layout.regions[r];
    const auto& orders = layout.orders[r];
    if (orders.empty()) continue;
    // Per stripe: the relays in fill order, what each sends, and the edges not yet
    // given (every node of the order but its first needs a parent).
    std::vector<std::vector<size_t>> relays(stripes), children(stripes);
    std::vector<size_t> missing(stripes);
    auto give = [&](size_t s, size_t m, size_t n) {
      if (n == 0) return;
      const auto at = std::find(relays[s].begin(), relays[s].end(), m);
      if (at == relays[s].end()) {
        relays[s].push_back(m);
        children[s].push_back(n);
      } else {
        children[s][static_cast<size_t>(at - relays[s].begin())] += n;
      }
      load[m] += n;
      missing[s] -= n;
    };
    // The subtree root sends its stripe's first child, whatever else it does.
    for (size_t s = 0; s < stripes; ++s) {
      missing[s] = orders[s].size() - 1;
      if (missing[s] > 0) give(s, orders[s].front(), 1);
    }
    for (size_t s = 0; s < stripes; ++s) {
      if (load[orders[s].front()] > k) return std::nullopt;
    }
    // Group s relays stripe s (the order's [subtree root, group s] prefix).
    for (size_t s = 0; s < stripes; ++s) {
      const std::vector<size_t>& group = part.groups[s];
      const size_t own =
          1 + group.size() -
          static_cast<size_t>(std::count(group.begin(), group.end(), orders[s].front()));
      for (size_t i = 0; i < own && missing[s] > 0; ++i) {
        give(s, orders[s][i], std::min(spare(orders[s][i]), missing[s]));
      }
    }
    // A stripe whose group cannot cover it borrows the spare children of the other
    // groups' members: those that relay in the fewest stripes first (a node that
    // relays nowhere before one that relays its own stripe), then the most spare, so
    // a node is interior in a second stripe only where it must be.
    std::vector<size_t> interior(nodes.size(), 0);
    for (size_t s = 0; s < stripes; ++s) {
      for (size_t m : relays[s]) ++interior[m];
    }
    for (size_t s = 0; s < stripes; ++s) {
      if (missing[s] == 0) continue;
      std::vector<size_t> lenders;
      for (size_t m : part.members) {
        if (spare(m) > 0 && std::find(relays[s].begin(), relays[s].end(), m) == relays[s].end()) {
          lenders.push_back(m);
        }
      }
      std::stable_sort(lenders.begin(), lenders.end(), [&](size_t a, size_t b) {
        return interior[a] != interior[b] ? interior[a] < interior[b] : spare(a) > spare(b);
      });
      for (size_t m : lenders) {
        if (missing[s] == 0) break;
        give(s, m, std::min(spare(m), missing[s]));
        ++interior[m];
      }
      if (missing[s] > 0) return std::nullopt;
    }
    for (size_t s = 0; s < stripes; ++s) {
      std::vector<size_t> fill = relays[s];
      if (fill.empty()) fill.push_back(orders[s].front());
      for (size_t m : orders[s]) {
        if (std::find(fill.begin(), fill.end(), m) == fill.end()) fill.push_back(m);
      }
      if (HangsBelowRoot(layout, part)) shape[s][fill.front()] = layout.roots[s];
      FillBreadthFirst(fill, children[s], shape[s]);
    }
  }
  AddManualParents(layout, shape);
  return shape;
}

// The smallest fanout whose balanced fill covers every stripe. Below
// ceil(edges / uploaders) of some region none can; at the sum of a region's edges
// its subtree roots alone can, so the search ends.
int LowestBalancedFanout(const Layout& layout) {
  size_t lowest = 1, highest = 1;
  for (size_t r = 0; r < layout.regions.size(); ++r) {
    const size_t edges = RegionEdges(layout, r);
    if (edges == 0) continue;
    const size_t uploaders = layout.regions[r].members.size() +
                             (HangsBelowRoot(layout, layout.regions[r]) ? 0 : layout.roots.size());
    lowest = std::max(lowest, (edges + uploaders - 1) / uploaders);
    highest = std::max(highest, edges);
  }
  size_t k = lowest;
  while (k < highest && !BalancedShape(layout, static_cast<int>(k))) ++k;
  return static_cast<int>(k);
}

// The shape at `fanout`: the balanced fill, or the k-ary one (also when no balanced
// fill fits in `fanout`).
Shape MakeShape(const Layout& layout, int fanout, bool balanced) {
  if (balanced) {
    if (std::optional<Shape> shape = BalancedShape(layout, fanout)) return std::move(*shape);
  }
  return KaryShape(layout, fanout);
}

// The striped model's rates for a shape (see the header): per stripe, per node, the
// edge from its parent; and each stripe's feed.
struct Rates {
  std::vector<std::vector<double>> link_bps;
  std::vector<std::vector<double>> link_latency_s;
  double feed_bps = kInfinity;
  double feed_latency_s = 0;
};

Rates ModelRates(const Layout& layout, const Shape& shape) {
  const ClusterConfig& config = *layout.config;
  const std::vector<NodeConfig>& nodes = config.nodes;
  const double hop_latency_s = static_cast<double>(config.tree.hop_latency.count()) / 1000.0;
  const double window_bits =
      static_cast<double>(config.tree.window) * static_cast<double>(config.tree.chunk_size) * 8.0;
  auto window_cap = [&](double bps, double latency_s) {
    return latency_s > 0 ? std::min(bps, window_bits / (2.0 * latency_s)) : bps;
  };

  std::vector<double> flows(nodes.size(), 0.0);               // flows each node sends, all stripes
  std::map<std::string_view, std::vector<bool>> wan_stripes;  // region -> stripes crossing in
  for (size_t s = 0; s < shape.size(); ++s) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const size_t p = shape[s][i];
      if (p == kNone) continue;
      flows[p] += 1;
      if (nodes[p].region != nodes[i].region) {
        auto& crossing = wan_stripes[nodes[i].region];
        crossing.resize(shape.size(), false);
        crossing[s] = true;
      }
    }
  }
  Rates rates;
  if (layout.fed) {
    flows[layout.source] += static_cast<double>(layout.stripes);
    rates.feed_latency_s = hop_latency_s;
    rates.feed_bps =
        window_cap(nodes[layout.source].uplink_bps / flows[layout.source], hop_latency_s);
  }
  rates.link_bps.assign(shape.size(), std::vector<double>(nodes.size(), 0.0));
  rates.link_latency_s.assign(shape.size(), std::vector<double>(nodes.size(), 0.0));
  for (size_t s = 0; s < shape.size(); ++s) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const size_t p = shape[s][i];
      if (p == kNone) continue;
      double bps = nodes[p].uplink_bps / flows[p];
      double latency_s = hop_latency_s;
      if (nodes[p].region != nodes[i].region) {
        if (const RegionConfig* r = config.FindRegion(nodes[i].region)) {
          const auto& crossing = wan_stripes[nodes[i].region];
          const double sharing =
              static_cast<double>(std::count(crossing.begin(), crossing.end(), true));
          bps = std::min({bps, r->FlowCapBps(), r->wan_bps / sharing});
          latency_s += static_cast<double>(r->wan_latency.count()) / 1000.0;
        }
      }
      rates.link_bps[s][i] = window_cap(bps, latency_s);
      rates.link_latency_s[s][i] = latency_s;
    }
  }
  return rates;
}

uint64_t StripeBytesFor(uint64_t delta_bytes, int stripes) {
  const uint64_t s = static_cast<uint64_t>(stripes);
  return delta_bytes / s + (delta_bytes % s != 0 ? 1 : 0);
}

// T(node, stripe) of the header's model, from the node's path figures.
// `fed`: the stripe's root is fed over a link of feed_bps / feed_latency_s.
double SecondsTo(int depth, double path_bps, double path_latency_s, bool fed, double feed_bps,
                 double feed_latency_s, uint64_t stripe_bytes, uint64_t chunk_size) {
  if (depth == 0) return 0.0;
  const double chunk = static_cast<double>(std::min(chunk_size, stripe_bytes));
  const double hops = depth + (fed ? 1 : 0);
  const double bps = fed ? std::min(path_bps, feed_bps) : path_bps;
  return (static_cast<double>(stripe_bytes) + hops * chunk) / (bps / 8.0) + path_latency_s +
         (fed ? feed_latency_s : 0.0);
}

// A lower bound on T(plan) for fanout k, to end the "auto" search early: each
// subtree root with m nodes below it sends at least min(k, m) flows in all (the
// balanced fill gives it its stripe's first children up to k in all stripes), so
// some node gets its stripe no faster than uplink / min(k, m). It never decreases
// as k grows.
double LowerBoundSeconds(const Layout& layout, int fanout, uint64_t delta_bytes) {
  const std::vector<NodeConfig>& nodes = layout.config->nodes;
  const double bits = static_cast<double>(StripeBytesFor(delta_bytes, layout.stripes)) * 8.0;
  const size_t k = static_cast<size_t>(fanout);
  double bound = 0;
  for (const auto& orders : layout.orders) {
    for (const std::vector<size_t>& order : orders) {
      if (order.size() < 2) continue;
      const double share = static_cast<double>(std::min(k, order.size() - 1));
      bound = std::max(bound, bits * share / nodes[order.front()].uplink_bps);
    }
  }
  return bound;
}

// T(plan) for a shape without building its TreePlans (the fanout search).
double PredictShape(const Layout& layout, const Shape& shape, const Rates& rates,
                    uint64_t delta_bytes) {
  const std::vector<NodeConfig>& nodes = layout.config->nodes;
  const uint64_t stripe_bytes = StripeBytesFor(delta_bytes, layout.stripes);
  double worst = 0;
  for (size_t s = 0; s < shape.size(); ++s) {
    std::vector<std::vector<size_t>> children(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (shape[s][i] != kNone) children[shape[s][i]].push_back(i);
    }
    struct At {
      size_t node;
      int depth;
      double path_bps, path_latency_s;
    };
    std::deque<At> queue = {{layout.roots[s], 0, kInfinity, 0.0}};
    while (!queue.empty()) {
      const At at = queue.front();
      queue.pop_front();
      worst = std::max(
          worst, SecondsTo(at.depth, at.path_bps, at.path_latency_s, layout.fed, rates.feed_bps,
                           rates.feed_latency_s, stripe_bytes, layout.config->tree.chunk_size));
      for (size_t c : children[at.node]) {
        queue.push_back({c, at.depth + 1, std::min(at.path_bps, rates.link_bps[s][c]),
                         at.path_latency_s + rates.link_latency_s[s][c]});
      }
    }
  }
  return worst;
}

// One stripe's TreePlan from the shape, with the striped rates.
Result<TreePlan> BuildTree(const Layout& layout, const Shape& shape, const Rates& rates, int stripe,
                           int fanout) {
  const ClusterConfig& config = *layout.config;
  const std::vector<NodeConfig>& nodes = config.nodes;
  const size_t s = static_cast<size_t>(stripe);
  const size_t root = layout.roots[s];
  const NodeConfig* feeder = layout.fed ? &nodes[layout.source] : nullptr;
  return WalkTree(config, shape[s], root, feeder, fanout, stripe, [&](size_t child, size_t) {
    return HopRate{rates.link_bps[s][child], rates.link_latency_s[s][child]};
  });
}

Result<StripedPlan> Materialize(const Layout& layout, int fanout, bool fanout_auto, bool balanced) {
  const ClusterConfig& config = *layout.config;
  const std::vector<NodeConfig>& nodes = config.nodes;
  const Shape shape = MakeShape(layout, fanout, balanced);
  const Rates rates = ModelRates(layout, shape);
  StripedPlan plan;
  plan.source = nodes[layout.source].id;
  size_t expected = 1;  // the root, and every receiver
  for (const NodeConfig& n : nodes) expected += n.role == Role::kReceiver;
  for (int s = 0; s < layout.stripes; ++s) {
    StripeTree stripe;
    stripe.index = s;
    const NodeConfig& root = nodes[layout.roots[static_cast<size_t>(s)]];
    stripe.root = root.id;
    ASSIGN_OR_RETURN(stripe.tree, BuildTree(layout, shape, rates, s, fanout));
    stripe.tree.fanout_auto = fanout_auto;
    if (stripe.tree.nodes.size() != expected) {
      return Status::Internal("stripe " + std::to_string(s) + "'s tree reached " +
                              std::to_string(stripe.tree.nodes.size()) + " of " +
                              std::to_string(expected) + " nodes");
    }
    if (layout.fed) {
      const NodeConfig& source = nodes[layout.source];
      stripe.feeder = source.id;
      stripe.feeder_transports = HopTransports(config, source, root);
      if (stripe.feeder_transports.empty()) {
        return NoCommonTransport(config, source, root, "feed ", s);
      }
      stripe.feed_bps = rates.feed_bps;
      stripe.feed_latency_s = rates.feed_latency_s;
    }
    plan.stripes.push_back(std::move(stripe));
  }
  return plan;
}

Status CheckStripeCount(const ClusterConfig& config, int stripes) {
  ClusterConfig copy = config;
  copy.tree.stripes = stripes;
  return ValidateClusterConfig(copy);
}

}  // namespace

int AutoStripeCount(const ClusterConfig& config) {
  int senders = 0;
  for (const NodeConfig& n : config.nodes) senders += n.role == Role::kSender;
  int stripes = std::max(senders, 1);
  const NodeConfig* source = config.Source();
  std::map<std::string_view, int> gateways;
  for (const NodeConfig& n : config.nodes) {
    if (n.gateway && n.role == Role::kReceiver && !n.parent &&
        (source == nullptr || n.region != source->region)) {
      ++gateways[n.region];
    }
  }
  for (const auto& [region, count] : gateways) {
    if (count >= 2) stripes = std::min(stripes, count);
  }
  return std::min(stripes, internal::kMaxStripes);
}

Result<StripedPlan> PlanStripesWithCount(const ClusterConfig& config, int stripes) {
  if (stripes < 1 || stripes > internal::kMaxStripes) {
    return Status::InvalidArgument(
        (config.source_file.empty() ? std::string("cluster config") : config.source_file.string()) +
        ": stripes = " + std::to_string(stripes) + " is out of range [1, " +
        std::to_string(internal::kMaxStripes) + "]");
  }
  RETURN_IF_ERROR(CheckStripeCount(config, stripes));
  if (stripes == 1) {
    // Exactly today's tree: the same plan, rates and fingerprint.
    ASSIGN_OR_RETURN(TreePlan tree, PlanTree(config));
    StripedPlan plan;
    plan.source = tree.source;
    StripeTree stripe;
    stripe.root = tree.source;
    stripe.tree = std::move(tree);
    plan.stripes.push_back(std::move(stripe));
    return plan;
  }
  const Layout layout = MakeLayout(config, stripes);
  if (config.tree.fanout) return Materialize(layout, *config.tree.fanout, false, false);

  // Every k from the lowest the balanced fill can serve up, the balanced fill and the
  // k-ary one at each; the first within the tie tolerance of the best, balanced
  // before k-ary at the same k. Where the uplinks bind, the balanced fill wins (its
  // busiest uplink sends the fewest flows); where a WAN flow's cap binds, the uplinks
  // do not matter and the k-ary fill's shallower subtrees can be a little faster.
  struct Candidate {
    int fanout;
    bool balanced;
    double seconds;
  };
  const int lowest = LowestBalancedFanout(layout);
  const int highest = std::max(lowest, MaxUsefulFanout(layout));
  double best = kInfinity;
  std::vector<Candidate> candidates;
  for (int k = lowest; k <= highest; ++k) {
    if (LowerBoundSeconds(layout, k, kAutoFanoutReferenceBytes) >
        best * (1 + kFanoutTieTolerance)) {
      break;
    }
    for (const bool balanced : {true, false}) {
      const Shape shape = MakeShape(layout, k, balanced);
      const double seconds =
          PredictShape(layout, shape, ModelRates(layout, shape), kAutoFanoutReferenceBytes);
      candidates.push_back({k, balanced, seconds});
      best = std::min(best, seconds);
    }
  }
  for (const Candidate& c : candidates) {
    if (c.seconds <= best * (1 + kFanoutTieTolerance)) {
      return Materialize(layout, c.fanout, true, c.balanced);
    }
  }
  return Status::Internal("no fanout was searched");
}

Result<StripedPlan> PlanStripes(const ClusterConfig& config) {
  RETURN_IF_ERROR(ValidateClusterConfig(config));
  const bool automatic = !config.tree.stripes.has_value();
  ASSIGN_OR_RETURN(
      StripedPlan plan,
      PlanStripesWithCount(config, config.tree.stripes.value_or(AutoStripeCount(config))));
  plan.stripes_auto = automatic;
  return plan;
}

uint64_t StripedPlan::StripeBytes(uint64_t delta_bytes) const {
  return StripeBytesFor(delta_bytes, static_cast<int>(stripes.size()));
}

double StripedPlan::PredictSecondsTo(int stripe, const PlannedNode& node,
                                     uint64_t delta_bytes) const {
  const StripeTree& st = stripes.at(static_cast<size_t>(stripe));
  return SecondsTo(node.depth, node.path_bps, node.path_latency_s, !st.feeder.empty(), st.feed_bps,
                   st.feed_latency_s, StripeBytes(delta_bytes), st.tree.chunk_size);
}

double StripedPlan::PredictSeconds(uint64_t delta_bytes) const {
  double worst = 0;
  for (const StripeTree& st : stripes) {
    for (const PlannedNode& n : st.tree.nodes) {
      worst = std::max(worst, PredictSecondsTo(st.index, n, delta_bytes));
    }
  }
  return worst;
}

std::map<std::string, double> StripedPlan::UploadShare() const {
  std::map<std::string, double> share;
  const double per_stripe = 1.0 / static_cast<double>(stripes.size());
  for (const StripeTree& st : stripes) {
    if (!st.feeder.empty()) share[st.feeder] += per_stripe;
    for (const PlannedNode& n : st.tree.nodes) {
      share[n.id] += per_stripe * static_cast<double>(n.children.size());
    }
  }
  return share;
}

Digest128 StripedPlan::Fingerprint() const {
  if (stripes.size() == 1 && stripes.front().feeder.empty()) {
    return stripes.front().tree.Fingerprint();
  }
  Hasher128 h;
  h.UpdateString("deltacast-striped-plan-v1");
  h.UpdateValue<uint64_t>(stripes.size());
  for (const StripeTree& st : stripes) {
    h.UpdateValue<uint64_t>(static_cast<uint64_t>(st.index));
    h.UpdateString(st.root);
    h.UpdateString(st.feeder);
    const Digest128 tree = st.tree.Fingerprint();
    h.Update(ByteSpan(reinterpret_cast<const std::byte*>(tree.bytes.data()), tree.bytes.size()));
  }
  return h.Finish();
}

}  // namespace deltacast::topology

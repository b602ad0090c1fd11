// Striped relay trees (issue 31; docs/architecture.md, "Striped trees"): the delta's
// chunks are split into S stripes, and each stripe crosses its own tree over the
// same receivers, from its own root on the trainer side. Planned so that each
// receiver is interior in at most one stripe's tree where it can be, and the WAN
// edges of different stripes land on different gateway hosts of a region when it
// lists several: the WAN carries S flows and every node's uplink about one copy.
//
// S = 1 is exactly today's tree (PlanTree), so a config that says nothing about
// stripes plans and behaves as before. Like PlanTree, the plan depends only on the
// config's content; every agent and the publisher plan it and must agree.
//
// Roots. With nodes of role "sender" (trainer-side hosts in the source's region),
// stripe i is rooted at the i-th sender (uplink descending, then id) and the source
// feeds each root its stripe over the LAN (StripeTree::feeder); senders beyond S
// are left out of every tree. Without senders every stripe is rooted at the source
// itself: S roots in one process over S links. Senders and (when it feeds senders)
// the source are in no stripe's TreePlan; every receiver is in every one.
//
// S: [tree] stripes, or for "auto" the number of senders (1 without any), capped by
// the fewest gateway candidates of any remote region that lists several. With S = 1
// the single stripe is PlanTree's plan (senders, if any, relay inside it like any
// node of the source's region), whatever else the config says.
//
// Shape for S > 1 (SplitStream's rule). Per region, the planned receivers (no manual
// parent), uplink descending then id, are split into S groups: in a remote region
// group j starts with gateway candidate j (the nodes with gateway = true, or the
// region's fastest node when it lists none), and every other member joins the
// smallest group (ties: lowest index). In stripe i a region hangs below its subtree
// root, filled breadth-first from the order [subtree root, group i, everyone else],
// so group i relays and the others are leaves. The subtree root is gateway candidate
// i mod G in a remote region, a child of the stripe's root; in the source's region it
// is the stripe's root when that is a sender, and when the source roots every stripe
// itself it is group i's fastest member, the source's one child there in stripe i:
// the source sends each stripe once, so its uplink carries one copy of the delta in
// all (with k children in each stripe it would carry k).
//
// Balanced fill (fanout "auto"). k bounds the children a node sends in all stripes
// together, so its upload is at most k / S deltas: each subtree root sends its
// stripe's first child; group i's members (the subtree root first) then take stripe
// i's children, up to k each in all; a stripe whose group is still short (a group of
// 7 under 31 receivers at S = 4 and k = 4: 28 of 30) borrows the spare children of
// other groups' members, the most spare first, so a receiver is interior in a
// second stripe only where its own group cannot cover one, and no one exceeds k.
// Each stripe's relays come first in its breadth-first fill, in that order. With
// the source rooting every stripe over N receivers in one region the stripes have
// S (N - 1) edges among N receivers, so no plan does better than
// ceil(S (N - 1) / N) / S deltas on its busiest receiver; the balanced fill reaches
// it at that k (tests/topology/stripe_plan_test.cc checks S = 2..5, N = 7..64).
// "auto" searches k from the smallest whose balanced fill covers every stripe up to
// the largest that changes a tree (a region's edges in all stripes), the balanced
// and the k-ary fill at each, and keeps the first whose PredictSeconds for
// kAutoFanoutReferenceBytes is within kFanoutTieTolerance of the best (smaller k
// first, balanced before k-ary): where the uplinks bind the balanced fill wins;
// where a WAN flow's cap binds the uplinks do not matter and the k-ary fill's
// shallower subtrees can be faster. A configured
// fanout is used as is: the k-ary fill of the same orders, k children per relay in
// each stripe (the simulator's scenarios and the engine's tests plan with it). A
// manual parent is kept in every stripe (a parent that is not in a stripe's tree,
// the feeding source or another stripe's sender, becomes that stripe's root).
// Failover parent: the grandparent in the stripe; the root's children fail over to
// the feeder when there is one.
//
// Model (tree_plan.h's pipelined cut-through model, with the flows of all stripes
// sharing the caps). A stripe carries D_s = ceil(D / S) bytes in chunks of
// c = min(chunk_size, D_s). Every edge of every stripe is a flow:
//   edge bps = min(parent uplink / flows the parent sends in all stripes (children,
//                  plus the S feeds when it is the feeding source),
//                  on a WAN edge: the child region's flow_bandwidth and its
//                  wan_bandwidth / stripes that cross into the region,
//                  window * chunk_size * 8 / (2 * edge latency))
//   feed bps = the same for the source -> sender edge (a LAN hop: hop_latency)
//   T(node, stripe) = (D_s + (depth + fed) * c) / (min(path bps, feed bps) / 8)
//                     + path latency (+ hop_latency when fed)
//   T(plan) = max over stripes and nodes.
// For S = 1 this is exactly TreePlan's model (one stripe, no feed, one flow per
// WAN crossing). Each stripe's TreePlan holds these striped rates in link_bps and
// path_bps, so its own PredictSeconds(D_s) is that stripe's time without the feed.
//
// Thread safety: StripedPlan is a value; PlanStripes is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {

struct StripeTree {
  int index = 0;     // 0 .. S-1
  std::string root;  // the node that sends this stripe: the source, or a sender node
  TreePlan tree;     // over every receiver; tree.nodes[0] is `root`
  // The node that sends `root` this stripe: the source when `root` is a sender, else
  // empty. The edge is not in `tree`; it is a LAN hop of the source's region.
  std::string feeder;
  std::vector<std::string> feeder_transports;  // HopTransports(feeder -> root)
  double feed_bps = 0;                         // the model's rate of that edge
  double feed_latency_s = 0;
};

struct StripedPlan {
  std::vector<StripeTree> stripes;  // S >= 1, by index
  std::string source;               // the config's source
  bool stripes_auto = false;        // S was picked by the planner ([tree] stripes = "auto")

  // The stripe that carries a refit's chunk `chunk` (its sequence number): k mod S, as
  // the engine sends them (docs/protocol.md, "Stripes").
  int StripeOf(uint64_t chunk) const { return static_cast<int>(chunk % stripes.size()); }
  // Predicted bytes each node uploads per refit, as a multiple of the delta's size
  // (single tree: an interior node k x, a leaf 0; striped: about 1 x each). Every
  // node of any stripe (and the feeding source) has an entry; stripes count 1/S each.
  std::map<std::string, double> UploadShare() const;
  // The model's time until every node has every stripe of a `delta_bytes` delta,
  // under the per-node and per-flow caps of the config.
  double PredictSeconds(uint64_t delta_bytes) const;
  // The model's time until `node` has its stripe `stripe` (0 for a stripe's root).
  double PredictSecondsTo(int stripe, const PlannedNode& node, uint64_t delta_bytes) const;
  // The bytes of a `delta_bytes` delta the model gives each stripe: ceil(D / S).
  uint64_t StripeBytes(uint64_t delta_bytes) const;
  // A digest of every stripe's tree (TreePlan::Fingerprint in stripe order). With
  // S = 1 it is the single tree's TreePlan::Fingerprint, as agents compared before.
  Digest128 Fingerprint() const;
};

// Plans the stripes for a config: validates it as PlanTree does; S from the config
// ([tree] stripes) or picked by the planner. kInvalidArgument names what is wrong.
Result<StripedPlan> PlanStripes(const ClusterConfig& config);

// The same with S forced to `stripes`, whatever the config says (for comparisons:
// "what would 4 stripes cost?"). kInvalidArgument when the config cannot serve it
// (below 1, above 64, more than its senders).
Result<StripedPlan> PlanStripesWithCount(const ClusterConfig& config, int stripes);

// The S that [tree] stripes = "auto" picks for a valid config (see the header).
int AutoStripeCount(const ClusterConfig& config);

}  // namespace deltacast::topology

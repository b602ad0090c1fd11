#include "topology/tree_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "topology/cluster_config.h"
#include "topology/plan_format.h"

namespace deltacast::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

ClusterConfig ParseOrDie(const std::string& text) {
  Result<ClusterConfig> r = ParseClusterConfig(text, "plan_test.toml");
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  return r.ok() ? *r : ClusterConfig{};
}

TreePlan PlanOrDie(const ClusterConfig& config) {
  Result<TreePlan> r = PlanTree(config);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : TreePlan{};
}

std::optional<std::string> ParentOf(const TreePlan& plan, const std::string& id) {
  const PlannedNode* n = plan.Find(id);
  EXPECT_NE(n, nullptr) << id;
  return n ? n->parent : std::nullopt;
}

// A small config builder: [tree] lines, regions, then nodes, each a TOML fragment.
struct ConfigText {
  std::string tree;
  std::vector<std::string> regions;
  std::vector<std::string> nodes;

  void Region(const std::string& name, const std::string& bandwidth, const std::string& latency) {
    regions.push_back("[[region]]\nname = \"" + name + "\"\nwan_bandwidth = \"" + bandwidth +
                      "\"\nwan_latency = \"" + latency + "\"\n");
  }
  void Node(const std::string& id, const std::string& region, const std::string& uplink,
            bool source = false, const std::string& parent = "") {
    std::string s = "[[node]]\nid = \"" + id + "\"\nhost = \"" + id + ".example\"\nport = 7600\n";
    s += "region = \"" + region + "\"\nuplink = \"" + uplink + "\"\n";
    if (source) s += "role = \"source\"\n";
    if (!parent.empty()) s += "parent = \"" + parent + "\"\n";
    nodes.push_back(s);
  }
  // Entries in the given orders (indices into regions / nodes).
  std::string Render(const std::vector<size_t>& region_order,
                     const std::vector<size_t>& node_order) const {
    std::string out = "[cluster]\nname = \"gen\"\n\n[tree]\n" + tree + "\n";
    for (size_t i : region_order) out += regions[i] + "\n";
    for (size_t i : node_order) out += nodes[i] + "\n";
    return out;
  }
  std::string Render() const {
    std::vector<size_t> r(regions.size()), n(nodes.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = i;
    for (size_t i = 0; i < n.size(); ++i) n[i] = i;
    return Render(r, n);
  }
};

// Invariants every plan must satisfy, whatever the config.
void CheckInvariants(const ClusterConfig& config, const TreePlan& plan) {
  ASSERT_EQ(plan.nodes.size(), config.nodes.size());
  ASSERT_FALSE(plan.nodes.empty());
  EXPECT_EQ(plan.nodes[0].id, plan.source);
  EXPECT_EQ(plan.source, config.Source()->id);
  EXPECT_FALSE(plan.nodes[0].parent.has_value());
  EXPECT_FALSE(plan.nodes[0].failover_parent.has_value());
  EXPECT_EQ(plan.nodes[0].depth, 0);

  std::map<std::string, size_t> position;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    EXPECT_TRUE(position.emplace(plan.nodes[i].id, i).second) << "duplicate " << plan.nodes[i].id;
  }
  for (const NodeConfig& n : config.nodes) EXPECT_EQ(position.count(n.id), 1u) << n.id;

  // Reached exactly once from the source, walking children.
  std::map<std::string, int> visits;
  std::vector<std::string> stack = {plan.source};
  while (!stack.empty() && visits.size() <= plan.nodes.size()) {
    const std::string id = stack.back();
    stack.pop_back();
    if (++visits[id] > 1) break;
    for (const std::string& c : plan.Find(id)->children) stack.push_back(c);
  }
  EXPECT_EQ(visits.size(), plan.nodes.size());
  for (const auto& [id, count] : visits) EXPECT_EQ(count, 1) << id;

  size_t edges = 0;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const PlannedNode& n = plan.nodes[i];
    const NodeConfig* nc = config.FindNode(n.id);
    EXPECT_EQ(n.region, nc->region);
    edges += n.children.size();
    if (i > 0) {
      EXPECT_GE(n.depth, plan.nodes[i - 1].depth) << "not breadth-first";
    }
    // No cycles: parents lead to the source within N steps.
    const PlannedNode* at = &n;
    for (size_t steps = 0; at->parent && steps <= plan.nodes.size(); ++steps) {
      at = plan.Find(*at->parent);
    }
    EXPECT_EQ(at->id, plan.source) << n.id;
    if (!n.parent) continue;

    const PlannedNode* parent = plan.Find(*n.parent);
    ASSERT_NE(parent, nullptr);
    EXPECT_LT(position[parent->id], i) << "parent after child";
    EXPECT_EQ(std::count(parent->children.begin(), parent->children.end(), n.id), 1);
    EXPECT_EQ(n.depth, parent->depth + 1);
    EXPECT_EQ(n.crosses_wan, parent->region != n.region);
    // The edge never gets more than the parent's uplink split over its children.
    const double share = config.FindNode(parent->id)->uplink_bps / parent->children.size();
    EXPECT_GT(n.link_bps, 0);
    EXPECT_LE(n.link_bps, share * (1 + 1e-12)) << n.id;
    EXPECT_LE(n.path_bps, n.link_bps);

    // Failover: the grandparent; none below the source; never itself or a descendant.
    EXPECT_EQ(n.failover_parent, parent->parent) << n.id;
    if (n.failover_parent) {
      EXPECT_NE(*n.failover_parent, n.id);
      std::vector<std::string> below = n.children;
      while (!below.empty()) {
        const std::string d = below.back();
        below.pop_back();
        EXPECT_NE(d, *n.failover_parent) << n.id;
        for (const std::string& c : plan.Find(d)->children) below.push_back(c);
      }
    }
    // Manual overrides win.
    EXPECT_EQ(n.manual_parent, nc->parent.has_value());
    if (nc->parent) {
      EXPECT_EQ(*n.parent, *nc->parent);
    }
    // Children are listed fastest first, then by id.
    for (size_t c = 1; c < n.children.size(); ++c) {
      const NodeConfig* a = config.FindNode(n.children[c - 1]);
      const NodeConfig* b = config.FindNode(n.children[c]);
      EXPECT_TRUE(a->uplink_bps > b->uplink_bps ||
                  (a->uplink_bps == b->uplink_bps && a->id < b->id));
    }
  }
  EXPECT_EQ(edges, plan.nodes.size() - 1);

  const double total = plan.PredictSeconds(kGiB);
  EXPECT_TRUE(std::isfinite(total));
  for (const PlannedNode& n : plan.nodes) EXPECT_LE(plan.PredictSecondsTo(n, kGiB), total);
}

// The region rules, for configs without manual parents.
void CheckRegionRules(const ClusterConfig& config, const TreePlan& plan) {
  const NodeConfig* source = config.Source();
  std::map<std::string, std::vector<const PlannedNode*>> entries;  // WAN edges per region
  std::map<std::string, std::vector<const NodeConfig*>> members;
  for (const NodeConfig& n : config.nodes) members[n.region].push_back(&n);
  for (const PlannedNode& n : plan.nodes) {
    if (n.crosses_wan) entries[n.region].push_back(&n);
  }
  for (auto& [region, nodes] : members) {
    if (region == source->region) {
      EXPECT_EQ(entries.count(region), 0u) << "WAN edge into the source's region";
      continue;
    }
    ASSERT_EQ(entries[region].size(), 1u) << region;
    const PlannedNode* gateway = entries[region][0];
    EXPECT_EQ(gateway->parent, source->id);
    std::sort(nodes.begin(), nodes.end(), [](const NodeConfig* a, const NodeConfig* b) {
      return a->uplink_bps != b->uplink_bps ? a->uplink_bps > b->uplink_bps : a->id < b->id;
    });
    EXPECT_EQ(gateway->id, nodes.front()->id) << "gateway is not the fastest, smallest id";
    const RegionConfig* r = config.FindRegion(region);
    EXPECT_LE(gateway->link_bps, r->wan_bps);
  }
  // A k-ary fill: nobody relays to more than k nodes of its own region.
  for (const PlannedNode& n : plan.nodes) {
    const auto in_region =
        std::count_if(n.children.begin(), n.children.end(),
                      [&](const std::string& c) { return plan.Find(c)->region == n.region; });
    EXPECT_LE(in_region, plan.fanout_used) << n.id;
  }
}

struct Generated {
  ConfigText text;
  size_t region_count = 0;
};

// A random valid config: 1-64 nodes, 1-5 regions, uplinks drawn with many ties.
Generated Generate(uint32_t seed, bool manual_parents) {
  std::mt19937 rng(seed);
  auto pick = [&](const auto& options) { return options[rng() % options.size()]; };
  const std::vector<std::string> region_names = {"us-east", "eu-west", "ap-south", "sa-east",
                                                 "af-south"};
  const std::vector<std::string> uplinks = {"800Mbit", "1Gbit",  "10Gbit", "10Gbit",
                                            "25Gbit",  "40Gbit", "100Gbit"};
  const std::vector<std::string> wan_bandwidths = {"100Mbit", "1Gbit", "5Gbit", "20Gbit"};
  const std::vector<std::string> latencies = {"0ms", "10ms", "40ms", "95ms", "200ms"};

  Generated g;
  const size_t region_count = 1 + rng() % 5;
  const size_t node_count = 1 + rng() % 64;
  std::vector<std::string> regions(region_names.begin(), region_names.end());
  std::shuffle(regions.begin(), regions.end(), rng);
  regions.resize(region_count);

  g.text.tree =
      "fanout = " + (rng() % 2 ? std::string("\"auto\"") : std::to_string(1 + rng() % 6)) +
      "\nchunk_size = \"" + pick(std::vector<std::string>{"1MiB", "4MiB", "16MiB"}) +
      "\"\nwindow = " + std::to_string(1 + rng() % 16) + "\nhop_latency = \"" +
      std::to_string(rng() % 6) + "ms\"\n";

  std::vector<std::string> ids;
  std::set<std::string> used_regions;
  std::set<std::string> taken;
  for (size_t i = 0; i < node_count; ++i) {
    std::string id;
    do {
      id = "n" + std::to_string(rng() % 1000);
    } while (!taken.insert(id).second);
    ids.push_back(id);
  }
  // Manual parents point at a node earlier in a random order that starts at the
  // source, so they never form a cycle.
  std::vector<size_t> order(node_count);
  for (size_t i = 0; i < node_count; ++i) order[i] = i;
  std::shuffle(order.begin() + 1, order.end(), rng);
  std::map<size_t, std::string> parent;
  if (manual_parents) {
    for (size_t k = 1; k < node_count; ++k) {
      if (rng() % 5 == 0) parent[order[k]] = ids[order[rng() % k]];
    }
  }
  for (size_t i = 0; i < node_count; ++i) {
    const std::string region = i == 0 ? regions[0] : regions[rng() % region_count];
    used_regions.insert(region);
    g.text.Node(ids[i], region, pick(uplinks), i == 0, parent.count(i) ? parent[i] : "");
  }
  for (const std::string& r : regions) {
    // The source's region may be declared or not; others must be, if used.
    if (!used_regions.count(r)) continue;
    if (r == regions[0] && rng() % 2) continue;
    g.text.Region(r, pick(wan_bandwidths), pick(latencies));
  }
  g.region_count = used_regions.size();
  return g;
}

TEST(TreePlanTest, GeneratedConfigsKeepEveryInvariant) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const bool manual = seed % 3 == 0;
    const Generated g = Generate(seed, manual);
    const ClusterConfig config = ParseOrDie(g.text.Render());
    const TreePlan plan = PlanOrDie(config);
    CheckInvariants(config, plan);
    if (!manual) CheckRegionRules(config, plan);
    if (HasFailure()) {
      ADD_FAILURE() << g.text.Render() << FormatPlanText(plan, config, kGiB);
      return;
    }
  }
}

TEST(TreePlanTest, PlanDoesNotDependOnFileOrder) {
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Generated g = Generate(seed, seed % 2 == 0);
    const ClusterConfig config = ParseOrDie(g.text.Render());
    const std::string expected = FormatPlanJson(PlanOrDie(config), config, 40 * kGiB);
    std::mt19937 rng(seed * 7919);
    for (int round = 0; round < 3; ++round) {
      std::vector<size_t> r(g.text.regions.size()), n(g.text.nodes.size());
      for (size_t i = 0; i < r.size(); ++i) r[i] = i;
      for (size_t i = 0; i < n.size(); ++i) n[i] = i;
      std::shuffle(r.begin(), r.end(), rng);
      std::shuffle(n.begin(), n.end(), rng);
      const ClusterConfig shuffled = ParseOrDie(g.text.Render(r, n));
      EXPECT_EQ(FormatPlanJson(PlanOrDie(shuffled), shuffled, 40 * kGiB), expected);
    }
  }
}

TEST(TreePlanTest, AutoFanoutIsNeverWorseThanAFixedOne) {
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Generated g = Generate(seed, seed % 4 == 0);
    g.text.tree = "fanout = \"auto\"\nwindow = 16\n";
    const ClusterConfig config = ParseOrDie(g.text.Render());
    const TreePlan automatic = PlanOrDie(config);
    EXPECT_TRUE(automatic.fanout_auto);
    const double best = automatic.PredictSeconds(kAutoFanoutReferenceBytes);
    const int n = static_cast<int>(config.nodes.size());
    for (int k : {1, 2, 3, 4, n, n + 5}) {
      Result<TreePlan> fixed = PlanTreeWithFanout(config, k);
      ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
      EXPECT_EQ(fixed->fanout_used, k);
      EXPECT_FALSE(fixed->fanout_auto);
      EXPECT_LE(best, fixed->PredictSeconds(kAutoFanoutReferenceBytes) * (1 + kFanoutTieTolerance))
          << "k=" << k;
    }
    // The search stops early on a lower bound; it must still find the smallest k
    // within the tie tolerance of the best.
    std::vector<double> seconds;
    for (int k = 1; k <= n; ++k) {
      seconds.push_back(PlanTreeWithFanout(config, k)->PredictSeconds(kAutoFanoutReferenceBytes));
    }
    const double min_seconds = *std::min_element(seconds.begin(), seconds.end());
    int expected = 1;
    while (seconds[expected - 1] > min_seconds * (1 + kFanoutTieTolerance)) ++expected;
    EXPECT_EQ(automatic.fanout_used, expected);
    EXPECT_EQ(best, seconds[expected - 1]);
  }
}

TEST(TreePlanTest, SingleNodeCluster) {
  ConfigText t;
  t.Node("trainer", "here", "10Gbit", true);
  const ClusterConfig config = ParseOrDie(t.Render());
  const TreePlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.nodes.size(), 1u);
  EXPECT_EQ(plan.fanout_used, 1);
  EXPECT_EQ(plan.PredictSeconds(kGiB), 0.0);
  EXPECT_EQ(&plan.SlowestNode(kGiB), &plan.nodes[0]);
}

ConfigText EightEqualNodes(const std::string& fanout) {
  ConfigText t;
  t.tree = "fanout = " + fanout + "\n";
  t.Node("trainer", "local", "10Gbit", true);
  // Listed out of order on purpose: ids decide among equal uplinks.
  for (int i : {5, 2, 7, 1, 3, 6, 4}) t.Node("a" + std::to_string(i), "local", "10Gbit");
  return t;
}

std::string EightEqualNodesText(const std::string& fanout) {
  return EightEqualNodes(fanout).Render();
}

TEST(TreePlanTest, FixedFanoutFillsBreadthFirst) {
  const ClusterConfig config = ParseOrDie(EightEqualNodes("2").Render());
  const TreePlan plan = PlanOrDie(config);
  EXPECT_EQ(plan.fanout_used, 2);
  EXPECT_FALSE(plan.fanout_auto);
  EXPECT_THAT(plan.Find("trainer")->children, ElementsAre("a1", "a2"));
  EXPECT_THAT(plan.Find("a1")->children, ElementsAre("a3", "a4"));
  EXPECT_THAT(plan.Find("a2")->children, ElementsAre("a5", "a6"));
  EXPECT_THAT(plan.Find("a3")->children, ElementsAre("a7"));
  std::vector<std::string> bfs;
  for (const PlannedNode& n : plan.nodes) bfs.push_back(n.id);
  EXPECT_THAT(bfs, ElementsAre("trainer", "a1", "a2", "a3", "a4", "a5", "a6", "a7"));
  EXPECT_DOUBLE_EQ(plan.Find("a1")->link_bps, 5e9);
  EXPECT_DOUBLE_EQ(plan.Find("a4")->link_bps, 5e9);
  EXPECT_DOUBLE_EQ(plan.Find("a7")->link_bps, 10e9);
  EXPECT_EQ(plan.Find("a7")->depth, 3);
  EXPECT_EQ(plan.Find("a7")->failover_parent, "a1");
  EXPECT_EQ(plan.Find("a3")->failover_parent, "trainer");
  EXPECT_FALSE(plan.Find("a1")->failover_parent.has_value());
  CheckInvariants(config, plan);
}

TEST(TreePlanTest, AutoFanoutPrefersAChainOnEqualFastLinks) {
  // Pipelined cut-through: each hop costs about one chunk time, while splitting an
  // uplink over k children costs a factor k on the whole delta.
  const ClusterConfig config = ParseOrDie(EightEqualNodes("\"auto\"").Render());
  const TreePlan plan = PlanOrDie(config);
  EXPECT_EQ(plan.fanout_used, 1);
  EXPECT_TRUE(plan.fanout_auto);
  EXPECT_EQ(ParentOf(plan, "a1"), "trainer");
  for (int i = 2; i <= 7; ++i) {
    EXPECT_EQ(ParentOf(plan, "a" + std::to_string(i)), "a" + std::to_string(i - 1));
  }
  // (1 GiB + 7 chunks) / 10 Gbit/s + 7 hops of 1 ms.
  const double expected = (double(kGiB) + 7.0 * 4 * kMiB) / (10e9 / 8) + 0.007;
  EXPECT_NEAR(plan.PredictSeconds(kGiB), expected, 1e-12);
  EXPECT_EQ(plan.SlowestNode(kGiB).id, "a7");
}

TEST(TreePlanTest, AutoFanoutSpreadsWhenHopsAreExpensive) {
  // With 500 ms per hop, depth costs more than the uplink split does.
  ConfigText t = EightEqualNodes("\"auto\"");
  t.tree += "hop_latency = \"500ms\"\nwindow = 4096\n";
  const TreePlan plan = PlanOrDie(ParseOrDie(t.Render()));
  EXPECT_GT(plan.fanout_used, 1);
  const ClusterConfig config = ParseOrDie(t.Render());
  EXPECT_LT(plan.PredictSeconds(kGiB), PlanTreeWithFanout(config, 1)->PredictSeconds(kGiB));
}

TEST(TreePlanTest, FasterUplinksRelay) {
  ConfigText t;
  t.tree = "fanout = 2\n";
  t.Node("src", "r", "100Gbit", true);
  t.Node("slow1", "r", "1Gbit");
  t.Node("slow2", "r", "1Gbit");
  t.Node("fast", "r", "40Gbit");
  t.Node("mid", "r", "10Gbit");
  t.Node("slow3", "r", "1Gbit");
  const TreePlan plan = PlanOrDie(ParseOrDie(t.Render()));
  EXPECT_THAT(plan.Find("src")->children, ElementsAre("fast", "mid"));
  EXPECT_THAT(plan.Find("fast")->children, ElementsAre("slow1", "slow2"));
  EXPECT_THAT(plan.Find("mid")->children, ElementsAre("slow3"));
  EXPECT_DOUBLE_EQ(plan.Find("slow1")->link_bps, 20e9);
  EXPECT_DOUBLE_EQ(plan.Find("slow1")->path_bps, 20e9);
}

TEST(TreePlanTest, OneGatewayPerRegion) {
  ConfigText t;
  t.tree = "fanout = 2\nwindow = 4096\n";
  t.Region("eu", "1Gbit", "80ms");
  t.Node("trainer", "us", "30Gbit", true);
  t.Node("us1", "us", "10Gbit");
  t.Node("eu-b", "eu", "25Gbit");
  t.Node("eu-c", "eu", "10Gbit");
  t.Node("eu-a", "eu", "25Gbit");  // ties with eu-b; the smaller id wins
  t.Node("eu-d", "eu", "10Gbit");
  const ClusterConfig config = ParseOrDie(t.Render());
  const TreePlan plan = PlanOrDie(config);
  EXPECT_THAT(plan.Find("trainer")->children, ElementsAre("eu-a", "us1"));
  const PlannedNode* gateway = plan.Find("eu-a");
  EXPECT_TRUE(gateway->crosses_wan);
  EXPECT_DOUBLE_EQ(gateway->link_bps, 1e9);  // min(30G / 2 children, 1 Gbit WAN)
  EXPECT_NEAR(gateway->link_latency_s, 0.081, 1e-12);
  EXPECT_THAT(gateway->children, ElementsAre("eu-b", "eu-c"));
  EXPECT_THAT(plan.Find("eu-b")->children, ElementsAre("eu-d"));
  EXPECT_FALSE(plan.Find("eu-b")->crosses_wan);
  EXPECT_EQ(plan.Find("eu-b")->failover_parent, "trainer");
  EXPECT_EQ(plan.Find("eu-d")->failover_parent, "eu-a");
  EXPECT_DOUBLE_EQ(plan.Find("us1")->link_bps, 15e9);
  EXPECT_DOUBLE_EQ(plan.Find("eu-d")->path_bps, 1e9);
  EXPECT_NEAR(plan.Find("eu-d")->path_latency_s, 0.083, 1e-12);
  CheckInvariants(config, plan);
  CheckRegionRules(config, plan);
}

TEST(TreePlanTest, SourceEgressIsSharedWithGateways) {
  ConfigText t;
  t.tree = "fanout = 1\n";
  t.Region("eu", "100Gbit", "0ms");
  t.Region("ap", "100Gbit", "0ms");
  t.Node("s", "us", "30Gbit", true);
  t.Node("u1", "us", "10Gbit");
  t.Node("u2", "us", "10Gbit");
  t.Node("e1", "eu", "10Gbit");
  t.Node("p1", "ap", "10Gbit");
  const TreePlan plan = PlanOrDie(ParseOrDie(t.Render()));
  EXPECT_THAT(plan.Find("s")->children, ElementsAre("e1", "p1", "u1"));
  for (const char* id : {"e1", "p1", "u1"}) EXPECT_DOUBLE_EQ(plan.Find(id)->link_bps, 10e9);
  EXPECT_EQ(ParentOf(plan, "u2"), "u1");
}

TEST(TreePlanTest, CreditWindowCapsLongLinks) {
  ConfigText t;
  t.tree = "window = 1\nchunk_size = \"1MiB\"\nhop_latency = \"0ms\"\n";
  t.Region("far", "10Gbit", "100ms");
  t.Node("s", "near", "10Gbit", true);
  t.Node("f", "far", "10Gbit");
  const TreePlan plan = PlanOrDie(ParseOrDie(t.Render()));
  // One 1 MiB chunk per 200 ms round trip.
  EXPECT_NEAR(plan.Find("f")->link_bps, 8.0 * kMiB / 0.2, 1e-3);
}

TEST(TreePlanTest, PredictionFollowsTheModel) {
  ConfigText t;
  t.tree = "chunk_size = \"4MiB\"\nhop_latency = \"1ms\"\n";
  t.Node("s", "r", "8Gbit", true);
  t.Node("a", "r", "8Gbit");
  const TreePlan plan = PlanOrDie(ParseOrDie(t.Render()));
  EXPECT_NEAR(plan.PredictSeconds(kGiB), (double(kGiB) + 4.0 * kMiB) / 1e9 + 0.001, 1e-12);
  // A delta smaller than a chunk fills the pipeline with itself only.
  EXPECT_NEAR(plan.PredictSeconds(1000), 2000 / 1e9 + 0.001, 1e-12);
  EXPECT_NEAR(plan.PredictSeconds(0), 0.001, 1e-12);
  EXPECT_LT(plan.PredictSeconds(kGiB), plan.PredictSeconds(2 * kGiB));
}

TEST(TreePlanTest, ManualParentsWin) {
  ConfigText t;
  t.tree = "fanout = 2\n";
  t.Region("eu", "1Gbit", "80ms");
  t.Node("trainer", "us", "10Gbit", true);
  t.Node("us1", "us", "10Gbit");
  t.Node("us2", "us", "10Gbit");
  t.Node("eu-fast", "eu", "100Gbit", false, "us2");  // not the gateway: manual
  t.Node("eu-1", "eu", "10Gbit");
  t.Node("eu-2", "eu", "10Gbit");
  t.Node("leaf", "us", "1Gbit", false, "eu-fast");  // back into the source region
  const ClusterConfig config = ParseOrDie(t.Render());
  const TreePlan plan = PlanOrDie(config);
  CheckInvariants(config, plan);
  const PlannedNode* fast = plan.Find("eu-fast");
  EXPECT_EQ(fast->parent, "us2");
  EXPECT_TRUE(fast->manual_parent);
  EXPECT_TRUE(fast->crosses_wan);
  EXPECT_LE(fast->link_bps, 1e9);
  EXPECT_EQ(fast->failover_parent, "trainer");
  EXPECT_EQ(ParentOf(plan, "eu-1"), "trainer");  // the planned gateway
  EXPECT_EQ(ParentOf(plan, "eu-2"), "eu-1");
  const PlannedNode* leaf = plan.Find("leaf");
  EXPECT_EQ(leaf->parent, "eu-fast");
  EXPECT_TRUE(leaf->crosses_wan);  // the source's region has no [[region]] entry: uplink only
  EXPECT_DOUBLE_EQ(leaf->link_bps, 100e9);
  EXPECT_EQ(leaf->failover_parent, "us2");
  EXPECT_EQ(leaf->depth, 3);
}

TEST(TreePlanTest, InvalidInputIsRefused) {
  ClusterConfig config = ParseOrDie(EightEqualNodes("2").Render());
  EXPECT_EQ(PlanTreeWithFanout(config, 0).status().code(), StatusCode::kInvalidArgument);
  config.nodes[0].role = Role::kReceiver;  // no source left
  Result<TreePlan> r = PlanTree(config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("source"));
}

TEST(TreePlanTest, FingerprintFollowsTheShape) {
  const Generated g = Generate(42, true);
  const ClusterConfig config = ParseOrDie(g.text.Render());
  const TreePlan plan = PlanOrDie(config);
  std::vector<size_t> r(g.text.regions.size()), n(g.text.nodes.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = i;
  for (size_t i = 0; i < n.size(); ++i) n[i] = n.size() - 1 - i;
  const ClusterConfig reversed = ParseOrDie(g.text.Render(r, n));
  EXPECT_EQ(PlanOrDie(reversed).Fingerprint(), plan.Fingerprint());

  const ClusterConfig chain = ParseOrDie(EightEqualNodesText("1"));
  const ClusterConfig binary = ParseOrDie(EightEqualNodesText("2"));
  EXPECT_NE(PlanOrDie(chain).Fingerprint(), PlanOrDie(binary).Fingerprint());
  EXPECT_FALSE(PlanOrDie(chain).Fingerprint().IsZero());
}

}  // namespace
}  // namespace deltacast::topology

#include "topology/stripe_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "topology/cluster_config.h"
#include "topology/objstore_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;

ClusterConfig ParseOrDie(const std::string& text) {
  Result<ClusterConfig> r = ParseClusterConfig(text, "stripe_test.toml");
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n" << text;
  return r.ok() ? *r : ClusterConfig{};
}

StripedPlan PlanOrDie(const ClusterConfig& config) {
  Result<StripedPlan> r = PlanStripes(config);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : StripedPlan{};
}

// [cluster], [tree] lines, then TOML fragments for regions and nodes.
struct ConfigText {
  std::string tree;
  std::vector<std::string> entries;

  void Region(const std::string& name, const std::string& wan, const std::string& latency,
              const std::string& flow = "") {
    std::string s = "[[region]]\nname = \"" + name + "\"\nwan_bandwidth = \"" + wan +
                    "\"\nwan_latency = \"" + latency + "\"\n";
    if (!flow.empty()) s += "flow_bandwidth = \"" + flow + "\"\n";
    entries.push_back(s);
  }
  void Node(const std::string& id, const std::string& region, const std::string& uplink,
            const std::string& extra = "") {
    entries.push_back("[[node]]\nid = \"" + id + "\"\nhost = \"" + id +
                      ".example\"\nport = 7600\nregion = \"" + region + "\"\nuplink = \"" + uplink +
                      "\"\n" + extra);
  }
  std::string Render() const {
    std::string out = "[cluster]\nname = \"stripes\"\n\n[tree]\n" + tree + "\n";
    for (const std::string& e : entries) out += e + "\n";
    return out;
  }
};

// A trainer region with a source and `senders` senders; two remote regions of
// `per_region` receivers each, `gateways` of them gateway candidates.
ConfigText TwoRegions(int senders, int per_region, int gateways, const std::string& flow = "") {
  ConfigText c;
  c.Region("eu", "40Gbit", "40ms", flow);
  c.Region("ap", "40Gbit", "90ms", flow);
  c.Node("src", "us", "10Gbit", "role = \"source\"\n");
  for (int s = 0; s < senders; ++s) {
    c.Node("snd" + std::to_string(s), "us", "10Gbit", "role = \"sender\"\n");
  }
  for (const std::string region : {"eu", "ap"}) {
    for (int i = 0; i < per_region; ++i) {
      char id[32];
      std::snprintf(id, sizeof id, "%s%02d", region.c_str(), i);
      c.Node(id, region, "10Gbit", i < gateways ? "gateway = true\n" : "");
    }
  }
  return c;
}

void ExpectSameTree(const TreePlan& a, const TreePlan& b) {
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.fanout_used, b.fanout_used);
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    EXPECT_EQ(a.nodes[i].id, b.nodes[i].id);
    EXPECT_EQ(a.nodes[i].parent, b.nodes[i].parent);
    EXPECT_EQ(a.nodes[i].failover_parent, b.nodes[i].failover_parent);
    EXPECT_EQ(a.nodes[i].children, b.nodes[i].children);
    EXPECT_EQ(a.nodes[i].link_bps, b.nodes[i].link_bps);
  }
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
}

void ExpectSingleStripeIsPlanTree(const ClusterConfig& config) {
  const TreePlan tree = *PlanTree(config);
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 1u);
  EXPECT_TRUE(plan.stripes_auto);
  EXPECT_EQ(plan.stripes[0].root, tree.source);
  EXPECT_TRUE(plan.stripes[0].feeder.empty());
  ExpectSameTree(plan.stripes[0].tree, tree);
  EXPECT_EQ(plan.Fingerprint(), tree.Fingerprint());
  EXPECT_EQ(plan.PredictSeconds(kGiB), tree.PredictSeconds(kGiB));
  EXPECT_EQ(plan.PredictSeconds(4096), tree.PredictSeconds(4096));
  for (uint64_t p = 0; p < 5; ++p) EXPECT_EQ(plan.StripeOf(p), 0);
  // One tree: a node uploads one copy per child.
  for (const auto& [id, share] : plan.UploadShare()) {
    EXPECT_EQ(share, static_cast<double>(tree.Find(id)->children.size())) << id;
  }
}

TEST(StripePlanTest, EveryExampleConfigPlansOneStripeAsBefore) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DELTACAST_CONFIGS_DIR)) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("\n[cluster]") == std::string::npos) continue;  // not a cluster config
    SCOPED_TRACE(entry.path().string());
    Result<ClusterConfig> config = LoadClusterConfig(entry.path());
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(AutoStripeCount(*config), 1);
    ExpectSingleStripeIsPlanTree(*config);
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(StripePlanTest, GeneratedConfigsWithoutSendersPlanOneStripeAsBefore) {
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::vector<std::string> uplinks = {"1Gbit", "10Gbit", "10Gbit", "25Gbit", "100Gbit"};
    const std::vector<std::string> regions = {"us", "eu", "ap"};
    ConfigText c;
    c.tree = rng() % 2 ? "fanout = \"auto\"\n" : "fanout = " + std::to_string(1 + rng() % 5) + "\n";
    const int nodes = 1 + static_cast<int>(rng() % 40);
    std::set<std::string> used;
    for (int i = 0; i < nodes; ++i) {
      const std::string region = i == 0 ? "us" : regions[rng() % regions.size()];
      used.insert(region);
      std::string extra = i == 0 ? "role = \"source\"\n" : "";
      // Gateways without senders leave S at 1; the single tree enters by the fastest.
      if (i > 0 && region != "us" && rng() % 4 == 0) extra += "gateway = true\n";
      c.Node("n" + std::to_string(i), region, uplinks[rng() % uplinks.size()], extra);
    }
    for (const std::string r : {"eu", "ap"}) {
      if (used.count(r)) c.Region(r, "5Gbit", "40ms", rng() % 2 ? "1Gbit" : "");
    }
    const ClusterConfig config = ParseOrDie(c.Render());
    ASSERT_EQ(AutoStripeCount(config), 1);
    ExpectSingleStripeIsPlanTree(config);
    if (HasFailure()) return;
  }
}

// Every stripe's tree: its root first, every receiver once, parents before
// children, failover parents never below the node, the striped rates in place.
void CheckStripes(const ClusterConfig& config, const StripedPlan& plan) {
  std::set<std::string> receivers;
  for (const NodeConfig& n : config.nodes) {
    if (n.role == Role::kReceiver) receivers.insert(n.id);
  }
  const std::map<std::string, double> upload = plan.UploadShare();
  for (const StripeTree& st : plan.stripes) {
    SCOPED_TRACE("stripe " + std::to_string(st.index));
    const TreePlan& t = st.tree;
    ASSERT_EQ(t.nodes.size(), receivers.size() + 1);
    EXPECT_EQ(t.nodes[0].id, st.root);
    EXPECT_EQ(t.source, st.root);
    EXPECT_FALSE(t.nodes[0].parent.has_value());
    std::set<std::string> seen = {st.root};
    for (size_t i = 1; i < t.nodes.size(); ++i) {
      const PlannedNode& n = t.nodes[i];
      EXPECT_TRUE(receivers.count(n.id)) << n.id;
      EXPECT_TRUE(seen.insert(n.id).second) << n.id << " twice";
      ASSERT_TRUE(n.parent.has_value());
      const PlannedNode* parent = t.Find(*n.parent);
      ASSERT_NE(parent, nullptr);
      EXPECT_TRUE(seen.count(parent->id)) << "parent after child";
      EXPECT_EQ(std::count(parent->children.begin(), parent->children.end(), n.id), 1);
      EXPECT_EQ(n.depth, parent->depth + 1);
      EXPECT_EQ(n.crosses_wan, parent->region != n.region);
      EXPECT_GT(n.link_bps, 0);
      // A parent's egress is shared by every flow it sends in every stripe.
      const double uplink = config.FindNode(parent->id)->uplink_bps;
      const double flows = upload.at(parent->id) * static_cast<double>(plan.stripes.size());
      EXPECT_LE(n.link_bps, uplink / flows * (1 + 1e-12)) << n.id;
      if (n.crosses_wan) {
        EXPECT_LE(n.link_bps, config.FindRegion(n.region)->FlowCapBps()) << n.id;
      }
      EXPECT_EQ(n.failover_parent, parent->parent      ? parent->parent
                                   : st.feeder.empty() ? std::nullopt
                                                       : std::optional<std::string>(st.feeder));
      if (n.failover_parent) {
        std::vector<std::string> below = n.children;
        while (!below.empty()) {
          const std::string d = below.back();
          below.pop_back();
          EXPECT_NE(d, *n.failover_parent);
          for (const std::string& c : t.Find(d)->children) below.push_back(c);
        }
      }
    }
  }
  const double total = plan.PredictSeconds(kGiB);
  EXPECT_TRUE(std::isfinite(total));
  EXPECT_GT(total, 0);
}

// The stripes each receiver relays in.
std::map<std::string, int> InteriorCounts(const StripedPlan& plan) {
  std::map<std::string, int> interior;
  for (const StripeTree& st : plan.stripes) {
    for (size_t i = 1; i < st.tree.nodes.size(); ++i) {
      if (!st.tree.nodes[i].children.empty()) ++interior[st.tree.nodes[i].id];
    }
  }
  return interior;
}

double MaxShare(const StripedPlan& plan) {
  double most = 0;
  for (const auto& [id, share] : plan.UploadShare()) most = std::max(most, share);
  return most;
}

TEST(StripePlanTest, FourSendersFourGatewaysSpreadTheLoad) {
  const ClusterConfig config = ParseOrDie(TwoRegions(4, 16, 4).Render());
  EXPECT_EQ(AutoStripeCount(config), 4);
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 4u);
  EXPECT_TRUE(plan.stripes_auto);
  CheckStripes(config, plan);
  std::set<std::string> roots;
  for (const StripeTree& st : plan.stripes) {
    EXPECT_EQ(st.feeder, "src");
    EXPECT_EQ(config.FindNode(st.root)->role, Role::kSender);
    roots.insert(st.root);
  }
  EXPECT_EQ(roots.size(), 4u);

  // SplitStream: every receiver relays in at most one stripe.
  for (const auto& [id, count] : InteriorCounts(plan)) EXPECT_LE(count, 1) << id;

  // The stripes enter each region through 4 different gateways, one WAN edge each.
  for (const std::string region : {"eu", "ap"}) {
    std::set<std::string> entered;
    for (const StripeTree& st : plan.stripes) {
      int edges = 0;
      for (const PlannedNode& n : st.tree.nodes) {
        if (n.region != region || !n.crosses_wan) continue;
        ++edges;
        EXPECT_TRUE(config.FindNode(n.id)->gateway) << n.id;
        entered.insert(n.id);
      }
      EXPECT_EQ(edges, 1) << region;
    }
    EXPECT_EQ(entered.size(), 4u) << region;
  }

  // Every uplink carries about one copy; the single tree's relays carry k copies.
  EXPECT_LE(MaxShare(plan), 1.3);
  const StripedPlan single = *PlanStripesWithCount(config, 1);
  ASSERT_EQ(single.stripes.size(), 1u);
  int k = 0;
  for (const PlannedNode& n : single.stripes[0].tree.nodes) {
    k = std::max(k, static_cast<int>(n.children.size()));
  }
  EXPECT_EQ(MaxShare(single), static_cast<double>(k));
  EXPECT_GT(MaxShare(single), 1.3);
  // Stripes take chunks round-robin.
  EXPECT_EQ(plan.StripeOf(0), 0);
  EXPECT_EQ(plan.StripeOf(5), 1);
  EXPECT_EQ(plan.StripeOf(11), 3);
}

TEST(StripePlanTest, StripesFromTheSourceAloneStayDisjoint) {
  ConfigText c = TwoRegions(0, 16, 4);
  c.tree = "stripes = 4\n";
  const ClusterConfig config = ParseOrDie(c.Render());
  EXPECT_EQ(AutoStripeCount(config), 1);  // no senders: auto stays at one stripe
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 4u);
  EXPECT_FALSE(plan.stripes_auto);
  CheckStripes(config, plan);
  for (const StripeTree& st : plan.stripes) {
    EXPECT_EQ(st.root, "src");
    EXPECT_TRUE(st.feeder.empty());
  }
  for (const auto& [id, count] : InteriorCounts(plan)) EXPECT_LE(count, 1) << id;
  EXPECT_LE(MaxShare(plan) - plan.UploadShare().at("src"), 1.3);  // receivers
}

// The fan-out benchmark's cluster: the source and N receivers in one region, equal
// uplinks, no senders. The source roots every stripe, and sends each stripe to one
// head (SplitStream's source), so its uplink carries one copy of the delta, not k.
TEST(StripePlanTest, ASourceRootingEveryStripeSendsEachStripeOnce) {
  // (receivers, stripes, the busiest uplink's copies, receivers interior in 2 stripes)
  for (const auto& [receivers, stripes, most, borrowed] :
       std::vector<std::tuple<int, int, double, int>>{
           {7, 2, 1.0, 0}, {31, 2, 1.0, 0}, {31, 4, 1.0, 1}}) {
    SCOPED_TRACE(std::to_string(receivers) + " receivers, " + std::to_string(stripes) + " stripes");
    ConfigText c;
    c.tree = "stripes = " + std::to_string(stripes) + "\n";
    c.Node("src", "us", "10Mbit", "role = \"source\"\n");
    for (int i = 1; i <= receivers; ++i) {
      char id[16];
      std::snprintf(id, sizeof id, "n%02d", i);
      c.Node(id, "us", "10Mbit");
    }
    const ClusterConfig config = ParseOrDie(c.Render());
    const StripedPlan plan = PlanOrDie(config);
    ASSERT_EQ(plan.stripes.size(), static_cast<size_t>(stripes));
    CheckStripes(config, plan);
    std::set<std::string> heads;
    for (const StripeTree& st : plan.stripes) {
      ASSERT_EQ(st.tree.nodes[0].children.size(), 1u);  // one head per stripe
      heads.insert(st.tree.nodes[0].children[0]);
    }
    EXPECT_EQ(heads.size(), static_cast<size_t>(stripes));  // a different head in each
    EXPECT_EQ(plan.UploadShare().at("src"), 1.0);
    int twice = 0;
    for (const auto& [id, count] : InteriorCounts(plan)) {
      EXPECT_LE(count, 2) << id;
      twice += count == 2;
    }
    // 31 = 1 + 2 + 4 + 8 + 16 under each of 2 heads: every receiver's share is at
    // most 1. With 4 stripes the groups are 8, 8, 8 and 7; at 4 children each in
    // all, the group of 7 relays 28 of its stripe's 30 edges and one member of a
    // group of 8 with 2 to spare relays the other 2: still one copy each.
    EXPECT_LE(MaxShare(plan), most);
    EXPECT_EQ(twice, borrowed);
    // The busiest uplink sends `most` copies; the plan's time is that plus a few
    // chunk times of pipeline fill (a 1 GiB delta in 4 MiB chunks: 5 hops, 2 %).
    const double one_copy = 8.0 * kGiB / 10e6;
    EXPECT_LT(plan.PredictSeconds(kGiB), one_copy * most * 1.1);
    // and beats the single tree (a chain: 31 hops of fill)
    EXPECT_LT(plan.PredictSeconds(kGiB), PlanStripesWithCount(config, 1)->PredictSeconds(kGiB));
  }
}

TEST(StripePlanTest, PerFlowCapMakesStripesFaster) {
  // A WAN flow gets 1 Gbit/s of a 40 Gbit/s region link; uplinks are 10 Gbit/s.
  const ClusterConfig config = ParseOrDie(TwoRegions(4, 16, 4, "1Gbit").Render());
  const StripedPlan one = *PlanStripesWithCount(config, 1);
  const StripedPlan four = PlanOrDie(config);
  ASSERT_EQ(four.stripes.size(), 4u);
  const double t1 = one.PredictSeconds(8 * kGiB);
  const double t4 = four.PredictSeconds(8 * kGiB);
  // One flow: 8 GiB over 1 Gbit/s is ~69 s; four flows on four gateways, ~17 s.
  EXPECT_GT(t1, 8.0 * kGiB * 8 / 1e9);
  EXPECT_LT(t4 * 3.5, t1) << t1 << " vs " << t4;
  // The cap is in the single tree's model too: its gateway edge is at 1 Gbit/s.
  for (const PlannedNode& n : one.stripes[0].tree.nodes) {
    if (n.crosses_wan) {
      EXPECT_EQ(n.link_bps, 1e9) << n.id;
    }
  }
}

TEST(StripePlanTest, RegionWanIsSharedByItsStripes) {
  // No per-flow cap; a 4 Gbit/s region link is split between the 4 stripes entering.
  ConfigText c = TwoRegions(4, 8, 4);
  c.entries[0] = "[[region]]\nname = \"eu\"\nwan_bandwidth = \"4Gbit\"\nwan_latency = \"0ms\"\n";
  c.tree = "hop_latency = \"0ms\"\n";
  const StripedPlan plan = PlanOrDie(ParseOrDie(c.Render()));
  ASSERT_EQ(plan.stripes.size(), 4u);
  for (const StripeTree& st : plan.stripes) {
    for (const PlannedNode& n : st.tree.nodes) {
      if (n.crosses_wan && n.region == "eu") {
        EXPECT_EQ(n.link_bps, 1e9) << n.id;
      }
    }
  }
}

TEST(StripePlanTest, SameConfigInAnyOrderPlansTheSame) {
  ConfigText c = TwoRegions(3, 9, 3, "2Gbit");
  const ClusterConfig config = ParseOrDie(c.Render());
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 3u);
  std::mt19937 rng(7);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(c.entries.begin(), c.entries.end(), rng);
    const StripedPlan shuffled = PlanOrDie(ParseOrDie(c.Render()));
    EXPECT_EQ(shuffled.Fingerprint(), plan.Fingerprint());
    EXPECT_EQ(shuffled.PredictSeconds(kGiB), plan.PredictSeconds(kGiB));
  }
  EXPECT_NE(plan.Fingerprint(), PlanStripesWithCount(config, 2)->Fingerprint());
  EXPECT_NE(plan.Fingerprint(), PlanStripesWithCount(config, 1)->Fingerprint());
}

TEST(StripePlanTest, AutoStripeCountFollowsSendersAndGateways) {
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(4, 8, 4).Render())), 4);
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(4, 8, 2).Render())), 2);  // capped
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(4, 8, 0).Render())), 4);  // none listed
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(4, 8, 1).Render())), 4);  // one listed
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(2, 8, 4).Render())), 2);
  EXPECT_EQ(AutoStripeCount(ParseOrDie(TwoRegions(0, 8, 4).Render())), 1);
  // Two senders and one gateway per region: both stripes enter through it.
  const ClusterConfig config = ParseOrDie(TwoRegions(2, 8, 1).Render());
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 2u);
  CheckStripes(config, plan);
  for (const StripeTree& st : plan.stripes) {
    for (const PlannedNode& n : st.tree.nodes) {
      if (n.crosses_wan) {
        EXPECT_TRUE(n.id == "eu00" || n.id == "ap00") << n.id;
      }
    }
  }
}

TEST(StripePlanTest, SingleTreeEntersByTheFastestListedGateway) {
  ConfigText c;
  c.Region("eu", "10Gbit", "40ms");
  c.Node("src", "us", "10Gbit", "role = \"source\"\n");
  c.Node("fast", "eu", "100Gbit");
  c.Node("slow-gw", "eu", "1Gbit", "gateway = true\n");
  c.Node("mid-gw", "eu", "10Gbit", "gateway = true\n");
  const TreePlan tree = *PlanTree(ParseOrDie(c.Render()));
  EXPECT_EQ(tree.Find("mid-gw")->parent, "src");
  EXPECT_TRUE(tree.Find("mid-gw")->crosses_wan);
  EXPECT_EQ(tree.Find("fast")->parent, "mid-gw");
  EXPECT_FALSE(tree.Find("fast")->crosses_wan);
}

TEST(StripePlanTest, ManualParentsAreKeptInEveryStripe) {
  ConfigText c = TwoRegions(2, 6, 2);
  c.Node("m1", "eu", "1Gbit", "parent = \"eu03\"\n");
  c.Node("m2", "us", "1Gbit", "parent = \"src\"\n");
  const ClusterConfig config = ParseOrDie(c.Render());
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 2u);
  CheckStripes(config, plan);
  for (const StripeTree& st : plan.stripes) {
    EXPECT_EQ(st.tree.Find("m1")->parent, "eu03");
    EXPECT_TRUE(st.tree.Find("m1")->manual_parent);
    EXPECT_EQ(st.tree.Find("m2")->parent, st.root);  // the source feeds, the root sends
  }
}

TEST(StripePlanTest, GeneratedStripedConfigsKeepTheInvariants) {
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int senders = static_cast<int>(rng() % 5);
    ConfigText c = TwoRegions(senders, 1 + static_cast<int>(rng() % 20),
                              static_cast<int>(rng() % 5), rng() % 2 ? "1Gbit" : "");
    if (senders == 0 || rng() % 3 == 0)
      c.tree += "stripes = " + std::to_string(1 + rng() % 4) + "\n";
    if (rng() % 3 == 0) c.tree += "fanout = " + std::to_string(1 + rng() % 6) + "\n";
    if (senders > 0 && c.tree.find("stripes = ") != std::string::npos) {
      const int s = std::stoi(c.tree.substr(c.tree.find("stripes = ") + 10));
      if (s > senders) continue;  // refused, tested below
    }
    const ClusterConfig config = ParseOrDie(c.Render());
    const StripedPlan plan = PlanOrDie(config);
    if (plan.stripes.size() > 1) CheckStripes(config, plan);
    // "auto" fanout never loses to a fixed one the search could have picked.
    if (!config.tree.fanout && plan.stripes.size() > 1) {
      ClusterConfig fixed = config;
      for (int k = plan.stripes[0].tree.fanout_used; k <= 8; ++k) {
        fixed.tree.fanout = k;
        EXPECT_LE(plan.PredictSeconds(kAutoFanoutReferenceBytes),
                  PlanOrDie(fixed).PredictSeconds(kAutoFanoutReferenceBytes) * (1 + 1e-9))
            << k;
      }
    }
    if (HasFailure()) return;
  }
}

void ExpectRefused(const std::string& text, const std::string& message) {
  Result<ClusterConfig> r = ParseClusterConfig(text, "stripe_test.toml");
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(message));
}

TEST(StripePlanTest, InvalidStripeCountsAndRolesAreRefused) {
  ConfigText c = TwoRegions(2, 4, 2);
  c.tree = "stripes = 3\n";
  ExpectRefused(c.Render(), "[tree] stripes = 3 but only 2 nodes have role = \"sender\"");
  c.tree = "stripes = 0\n";
  ExpectRefused(c.Render(), "[tree] stripes = 0 is out of range [1, 64]");
  c.tree = "stripes = 65\n";
  ExpectRefused(c.Render(), "[tree] stripes = 65 is out of range [1, 64]");
  c.tree = "stripes = \"many\"\n";
  ExpectRefused(c.Render(), "[tree] stripes = \"many\": must be \"auto\" or an integer >= 1");

  const ClusterConfig config = ParseOrDie(TwoRegions(2, 4, 2).Render());
  for (int bad : {0, -1, 3, 65}) {
    Result<StripedPlan> r = PlanStripesWithCount(config, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("stripes = " + std::to_string(bad)));
  }
  ClusterConfig in_code = config;
  in_code.tree.stripes = 3;
  EXPECT_THAT(PlanStripes(in_code).status().message(), HasSubstr("only 2 nodes"));

  ConfigText gateway_home = TwoRegions(0, 2, 0);
  gateway_home.Node("g", "us", "1Gbit", "gateway = true\n");
  ExpectRefused(gateway_home.Render(), "[[node]] \"g\" has gateway = true but is in the source's");
  ConfigText sender_away = TwoRegions(0, 2, 0);
  sender_away.Node("s", "eu", "1Gbit", "role = \"sender\"\n");
  ExpectRefused(sender_away.Render(), "must be in the source's region (\"us\")");
  ConfigText sender_parent = TwoRegions(1, 2, 0);
  sender_parent.Node("s2", "us", "1Gbit", "role = \"sender\"\nparent = \"snd0\"\n");
  ExpectRefused(sender_parent.Render(), "a sender's parent is always the source");
  ConfigText gateway_parent = TwoRegions(0, 2, 0);
  gateway_parent.Node("g", "eu", "1Gbit", "gateway = true\nparent = \"eu00\"\n");
  ExpectRefused(gateway_parent.Render(), "the planner picks a gateway's parent");
  ConfigText gateway_type = TwoRegions(0, 2, 0);
  gateway_type.Node("g", "eu", "1Gbit", "gateway = \"yes\"\n");
  ExpectRefused(gateway_type.Render(), "gateway must be true or false");
  ConfigText role = TwoRegions(0, 2, 0);
  role.Node("r", "eu", "1Gbit", "role = \"relay\"\n");
  ExpectRefused(role.Render(), "must be \"source\", \"receiver\" or \"sender\"");
  ConfigText flow = TwoRegions(0, 2, 0, "0bit");
  ExpectRefused(flow.Render(), "flow_bandwidth");
}

// A bucket bridge serves striped trees (docs/object-store.md, "Striped trees"): the
// example with stripes = 2 plans the bridge in every stripe, under the source,
// with the same children (their manual parents), and CheckBridgePlan accepts each.
TEST(StripePlanTest, BucketBridgeIsInEveryStripeWithItsChildren) {
  const std::filesystem::path example =
      std::filesystem::path(DELTACAST_CONFIGS_DIR) / "bucket-region.toml";
  std::ifstream in(example);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string tree = "[tree]\n";
  const size_t at = text.find(tree);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + tree.size(), "stripes = 2\n");
  const ClusterConfig config = ParseOrDie(text);
  const StripedPlan plan = PlanOrDie(config);
  ASSERT_EQ(plan.stripes.size(), 2u);
  for (const StripeTree& st : plan.stripes) {
    SCOPED_TRACE("stripe " + std::to_string(st.index));
    const PlannedNode* bridge = st.tree.Find("bucket-eu");
    ASSERT_NE(bridge, nullptr);
    EXPECT_EQ(bridge->parent, "trainer");
    EXPECT_EQ(bridge->children, std::vector<std::string>{"eu-gw"});
    EXPECT_TRUE(CheckBridgePlan(config, st.tree).ok());
  }
}

}  // namespace
}  // namespace deltacast::topology

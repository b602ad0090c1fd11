// The balanced fill of fanout = "auto" (topology/stripe_plan.h, "Balanced fill"):
// no receiver uploads more than the least any plan could give its busiest one,
// every receiver is in every stripe once, and the trees stay shallow.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

std::string NodeToml(const std::string& id, const std::string& region, const std::string& extra) {
  return "[[node]]\nid = \"" + id + "\"\nhost = \"" + id + ".example\"\nport = 7600\nregion = \"" +
         region + "\"\nuplink = \"10Mbit\"\n" + extra + "\n";
}

std::string ReceiverId(const std::string& prefix, int i) {
  char id[32];
  std::snprintf(id, sizeof id, "%s%02d", prefix.c_str(), i);
  return id;
}

// The fan-out benchmark's cluster: a source and n receivers in one region, equal
// uplinks, no senders, so the source roots every stripe.
std::vector<std::string> OneRegion(int n) {
  std::vector<std::string> entries = {NodeToml("src", "us", "role = \"source\"\n")};
  for (int i = 1; i <= n; ++i) entries.push_back(NodeToml(ReceiverId("n", i), "us", ""));
  return entries;
}

ClusterConfig Parse(const std::string& tree, const std::vector<std::string>& entries) {
  std::string text = "[cluster]\nname = \"balance\"\n\n[tree]\n" + tree + "\n";
  for (const std::string& e : entries) text += e;
  Result<ClusterConfig> r = ParseClusterConfig(text, "balance.toml");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ClusterConfig{};
}

// Children each node sends in all stripes, and its deepest depth in any stripe.
struct Load {
  std::map<std::string, int> children;
  std::map<std::string, int> interior;  // stripes the node relays in
  int depth = 0;
};

// Checks that every stripe's tree holds every receiver once, below its parent, and
// sums the load.
Load CheckAndLoad(const ClusterConfig& config, const StripedPlan& plan) {
  std::set<std::string> receivers;
  for (const NodeConfig& n : config.nodes) {
    if (n.role == Role::kReceiver) receivers.insert(n.id);
  }
  Load load;
  for (const StripeTree& st : plan.stripes) {
    SCOPED_TRACE("stripe " + std::to_string(st.index));
    EXPECT_EQ(st.tree.nodes.size(), receivers.size() + 1);
    std::set<std::string> seen;
    size_t edges = 0;
    for (const PlannedNode& n : st.tree.nodes) {
      EXPECT_TRUE(seen.insert(n.id).second) << n.id << " twice";
      if (n.parent) {
        const PlannedNode* parent = st.tree.Find(*n.parent);
        EXPECT_NE(parent, nullptr) << n.id;
        if (parent != nullptr) {
          EXPECT_EQ(n.depth, parent->depth + 1) << n.id;
        }
      }
      edges += n.children.size();
      load.children[n.id] += static_cast<int>(n.children.size());
      if (n.parent && !n.children.empty()) ++load.interior[n.id];
      load.depth = std::max(load.depth, n.depth);
    }
    EXPECT_EQ(edges, receivers.size());
    for (const std::string& r : receivers) EXPECT_TRUE(seen.count(r)) << r << " missing";
  }
  return load;
}

// The least any plan can give its busiest receiver when the source sends each stripe
// to one head: S (N - 1) edges among N receivers, in children (each 1/S of a delta).
int LeastBusiest(int stripes, int receivers) {
  return (stripes * (receivers - 1) + receivers - 1) / receivers;
}

TEST(StripeBalanceTest, NoReceiverUploadsMoreThanTheLeastPossible) {
  for (int stripes = 2; stripes <= 5; ++stripes) {
    for (int n = 7; n <= 64; ++n) {
      SCOPED_TRACE(std::to_string(n) + " receivers, " + std::to_string(stripes) + " stripes");
      const ClusterConfig config =
          Parse("stripes = " + std::to_string(stripes) + "\n", OneRegion(n));
      Result<StripedPlan> plan = PlanStripes(config);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      ASSERT_EQ(plan->stripes.size(), static_cast<size_t>(stripes));
      const Load load = CheckAndLoad(config, *plan);
      const int least = LeastBusiest(stripes, n);
      int busiest = 0;
      for (const auto& [id, children] : load.children) {
        if (id != "src") busiest = std::max(busiest, children);
      }
      EXPECT_EQ(busiest, least);
      EXPECT_EQ(load.children.at("src"), stripes);  // one head per stripe: one copy
      EXPECT_EQ(plan->UploadShare().at("src"), 1.0);
      // A receiver relays a second stripe only for a group too small to cover its
      // own (group j holds n / S receivers, one more for j < n % S, and `least`
      // children each): none when every group can; else at most one more stripe per
      // short one, and no more such receivers than the children the groups lack.
      int short_stripes = 0, lacking = 0, twice = 0, most = 0;
      for (int j = 0; j < stripes; ++j) {
        const int covered = (n / stripes + (j < n % stripes ? 1 : 0)) * least;
        short_stripes += covered < n - 1;
        lacking += std::max(0, n - 1 - covered);
      }
      for (const auto& [id, count] : load.interior) {
        twice += count > 1;
        most = std::max(most, count);
      }
      EXPECT_LE(most, 1 + short_stripes);
      EXPECT_LE(twice, lacking);
      // Shallow: the head, then a tree of `least`-ary relays, plus a level for the
      // relays a short group borrows.
      const int k = std::max(2, least);
      const int levels = static_cast<int>(std::ceil(std::log(n) / std::log(k) - 1e-9));
      EXPECT_LE(load.depth, 2 + levels) << "fanout " << plan->stripes[0].tree.fanout_used;
      if (HasFailure()) return;
    }
  }
}

// The case: 31 receivers, 4 stripes. Groups of 8, 8, 8, 7: the group of 7
// relays 28 of its stripe's 30 edges, one member of a full group the other 2, and
// no receiver sends more than one copy.
TEST(StripeBalanceTest, ThirtyOneReceiversFourStripesSendOneCopyEach) {
  const ClusterConfig config = Parse("stripes = 4\n", OneRegion(31));
  const StripedPlan plan = *PlanStripes(config);
  const Load load = CheckAndLoad(config, plan);
  EXPECT_EQ(plan.stripes[0].tree.fanout_used, 4);
  int idle = 0, twice = 0;
  for (const auto& [id, share] : plan.UploadShare()) {
    EXPECT_LE(share, 1.0) << id;
    idle += share == 0;
  }
  for (const auto& [id, count] : load.interior) twice += count == 2;
  EXPECT_EQ(twice, 1);
  // 120 edges over 31 receivers at 4 each: the last of each full group has 2
  // children to spare, one lends them to the group of 7: no receiver is idle.
  EXPECT_EQ(idle, 0);
  EXPECT_LE(load.depth, 4);
  // The model: every flow at a quarter of a 10 Mbit/s uplink, each stripe a quarter
  // of the delta, so one copy's time plus a few chunks of fill (4 hops of 4 MiB
  // chunks behind a 256 MiB stripe: 6 %).
  const uint64_t delta = uint64_t{1} << 30;
  EXPECT_LT(plan.PredictSeconds(delta), 8.0 * static_cast<double>(delta) / 10e6 * 1.1);
}

// Every agent plans the same: the config in any order gives the same fingerprint.
TEST(StripeBalanceTest, SameConfigInAnyOrderPlansTheSame) {
  std::vector<std::string> entries = OneRegion(31);
  const Digest128 fingerprint = PlanStripes(Parse("stripes = 4\n", entries))->Fingerprint();
  std::mt19937 rng(31);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(entries.begin(), entries.end(), rng);
    EXPECT_EQ(PlanStripes(Parse("stripes = 4\n", entries))->Fingerprint(), fingerprint);
  }
}

// Remote regions: the stripes enter through distinct gateways and the region's
// receivers are balanced below them as at home; senders root the stripes.
TEST(StripeBalanceTest, RemoteRegionsBalanceBelowTheirGateways) {
  for (int gateways : {1, 2, 4}) {
    for (int n : {7, 13, 31}) {
      SCOPED_TRACE(std::to_string(n) + " per region, " + std::to_string(gateways) + " gateways");
      std::vector<std::string> entries = {
          "[[region]]\nname = \"eu\"\nwan_bandwidth = \"40Mbit\"\nwan_latency = \"40ms\"\n\n",
          "[[region]]\nname = \"ap\"\nwan_bandwidth = \"40Mbit\"\nwan_latency = \"90ms\"\n\n",
          NodeToml("src", "us", "role = \"source\"\n")};
      for (int s = 0; s < 4; ++s) {
        entries.push_back(NodeToml("snd" + std::to_string(s), "us", "role = \"sender\"\n"));
      }
      for (const std::string region : {"eu", "ap"}) {
        for (int i = 0; i < n; ++i) {
          entries.push_back(
              NodeToml(ReceiverId(region, i), region, i < gateways ? "gateway = true\n" : ""));
        }
      }
      const ClusterConfig config = Parse("stripes = 4\n", entries);
      Result<StripedPlan> plan = PlanStripes(config);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      const Load load = CheckAndLoad(config, *plan);
      for (const auto& [id, children] : load.children) {
        if (config.FindNode(id)->role == Role::kReceiver) {
          EXPECT_LE(children, LeastBusiest(4, n)) << id;
        }
      }
      for (const std::string region : {"eu", "ap"}) {
        std::set<std::string> entered;
        for (const StripeTree& st : plan->stripes) {
          for (const PlannedNode& node : st.tree.nodes) {
            if (node.region == region && node.crosses_wan) {
              EXPECT_TRUE(gateways == 0 || config.FindNode(node.id)->gateway) << node.id;
              entered.insert(node.id);
            }
          }
        }
        EXPECT_EQ(entered.size(), static_cast<size_t>(gateways)) << region;
      }
      if (HasFailure()) return;
    }
  }
}

// A configured fanout keeps the k-ary fill: k children per relay in each stripe.
TEST(StripeBalanceTest, ConfiguredFanoutIsUsedAsIs) {
  const ClusterConfig config = Parse("stripes = 4\nfanout = 5\n", OneRegion(31));
  const StripedPlan plan = *PlanStripes(config);
  CheckAndLoad(config, plan);
  for (const StripeTree& st : plan.stripes) {
    EXPECT_EQ(st.tree.fanout_used, 5);
    int relays_of_five = 0;
    for (size_t i = 1; i < st.tree.nodes.size(); ++i) {
      relays_of_five += st.tree.nodes[i].children.size() == 5;
    }
    EXPECT_EQ(relays_of_five, 6);  // 30 below the head: 6 relays of 5
  }
}

}  // namespace
}  // namespace deltacast::topology

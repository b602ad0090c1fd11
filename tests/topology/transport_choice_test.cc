// Per-hop transport choice: [transport] settings, [[link]] rules, listener ports per
// backend, HopTransports and the plan's transports per edge.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "topology/cluster_config.h"
#include "topology/plan_format.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Source "src" and "a1" in region a; "b1", "b2" in region b (b1 is b's gateway).
std::string TwoRegions(const std::string& extra, const std::string& b2_transports) {
  return R"([cluster]
name = "t"
[tree]
fanout = 1
[[region]]
name = "b"
wan_bandwidth = "1Gbit"
wan_latency = "10ms"
[[node]]
id = "src"
host = "h0"
port = 7000
region = "a"
role = "source"
transports = ["ucx", "ofi", "tcp"]
[[node]]
id = "a1"
host = "h1"
port = 7000
transports = ["ucx", "tcp"]
[[node]]
id = "b1"
host = "h2"
port = 7000
region = "b"
uplink = "100Gbit"
transports = ["ofi", "ucx", "tcp"]
[[node]]
id = "b2"
host = "h3"
port = 7000
region = "b"
transports = )" +
         b2_transports + "\n" + extra;
}

ClusterConfig Parse(const std::string& text) {
  auto r = ParseClusterConfig(text, "t.toml");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ClusterConfig{};
}

std::vector<std::string> Hop(const ClusterConfig& c, const std::string& parent,
                             const std::string& child) {
  return HopTransports(c, *c.FindNode(parent), *c.FindNode(child));
}

TEST(TransportChoiceTest, ChildPreferenceFilteredByWhatTheParentSpeaks) {
  const ClusterConfig c = Parse(TwoRegions("", R"(["ofi", "tcp"])"));
  EXPECT_THAT(Hop(c, "src", "a1"), ElementsAre("ucx", "tcp"));
  EXPECT_THAT(Hop(c, "src", "b1"), ElementsAre("ofi", "ucx", "tcp"));
  EXPECT_THAT(Hop(c, "b1", "b2"), ElementsAre("ofi", "tcp"));
  EXPECT_THAT(Hop(c, "a1", "b2"), ElementsAre("tcp"));  // a1 has no ofi
}

TEST(TransportChoiceTest, FirstMatchingLinkRuleWins) {
  const ClusterConfig c = Parse(TwoRegions(R"(
[[link]]
from = "src"
to = "region:b"
scope = "intra-region"
transports = ["ucx"]
[[link]]
scope = "cross-region"
transports = ["tcp"]
[[link]]
to = "b2"
transports = ["ucx", "tcp"]
[transport]
ucx_provider = "shm"
ofi_provider = "tcp;ofi_rxm"
)",
                                           R"(["ofi", "ucx", "tcp"])"));
  // src -> b1 crosses regions: rule 1 is intra-region only, rule 2 applies.
  EXPECT_THAT(Hop(c, "src", "b1"), ElementsAre("tcp"));
  EXPECT_THAT(Hop(c, "b1", "b2"), ElementsAre("ucx", "tcp"));   // rule 3
  EXPECT_THAT(Hop(c, "src", "a1"), ElementsAre("ucx", "tcp"));  // no rule: a1's list
  EXPECT_EQ(c.transport.ucx_provider, "shm");
  EXPECT_EQ(c.transport.ofi_provider, "tcp;ofi_rxm");
  ASSERT_EQ(c.links.size(), 3u);
  EXPECT_EQ(c.links[0].scope, LinkScope::kIntraRegion);
  EXPECT_GT(c.links[0].line, 0);
}

TEST(TransportChoiceTest, PlanCarriesTheTransportsOfEveryEdgeAndShowsThem) {
  const ClusterConfig c = Parse(TwoRegions(R"(
[[link]]
scope = "cross-region"
transports = ["tcp"]
)",
                                           R"(["ucx", "tcp"])"));
  auto plan = PlanTree(c);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const PlannedNode* b1 = plan->Find("b1");
  const PlannedNode* b2 = plan->Find("b2");
  ASSERT_TRUE(b1 && b2);
  EXPECT_THAT(b1->transports, ElementsAre("tcp"));
  EXPECT_THAT(b1->failover_transports, IsEmpty());  // the source's child has no failover
  EXPECT_EQ(b2->parent, "b1");
  EXPECT_THAT(b2->transports, ElementsAre("ucx", "tcp"));
  EXPECT_THAT(b2->failover_transports, ElementsAre("tcp"));  // to src, across regions
  const std::string text = FormatPlanText(*plan, c, 1 << 20);
  EXPECT_THAT(text, HasSubstr("<- b1 "));
  EXPECT_THAT(text, HasSubstr("via ucx (then tcp)  failover src via tcp"));
  const auto json = nlohmann::json::parse(FormatPlanJson(*plan, c, 1 << 20));
  EXPECT_EQ(json["nodes"][3]["id"], "b2");
  EXPECT_EQ(json["nodes"][3]["transports"], nlohmann::json({"ucx", "tcp"}));
  EXPECT_EQ(json["nodes"][3]["failover_transports"], nlohmann::json({"tcp"}));
}

TEST(TransportChoiceTest, EdgeWithoutACommonTransportIsRefusedByThePlanner) {
  // b2 speaks only ofi: so do its parent b1 and its failover parent src.
  const ClusterConfig c = Parse(TwoRegions("", R"(["ofi"])"));
  auto plan = PlanTree(c);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // A rule that allows only ucx to b2, which does not speak it.
  const ClusterConfig bad = Parse(TwoRegions(R"(
[[link]]
to = "b2"
transports = ["ucx"]
)",
                                             R"(["ofi", "tcp"])"));
  auto refused = PlanTree(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("b1 -> b2 has no transport both ends list"));
  EXPECT_THAT(refused.status().message(), HasSubstr("b2 lists [ofi, tcp]"));
}

TEST(TransportChoiceTest, EachBackendListensOnItsOwnPort) {
  EXPECT_EQ(TransportPortOffset("tcp"), 0);
  EXPECT_EQ(TransportPortOffset("ucx"), 1);
  EXPECT_EQ(TransportPortOffset("ofi"), 2);
  // a1's ucx listener (7001) collides with a node on 7001 of the same host.
  const std::string clash = std::string(R"([cluster]
name = "t"
[[node]]
id = "src"
host = "h"
port = 7000
role = "source"
transports = ["ucx", "tcp"]
[[node]]
id = "r"
host = "h"
port = 7001
)");
  auto r = ParseClusterConfig(clash, "t.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("t.toml:9:"));
  EXPECT_THAT(r.status().message(), HasSubstr("h:7001 is already used by [[node]] \"src\" (ucx)"));
  auto high = ParseClusterConfig(R"([cluster]
name = "t"
[[node]]
id = "src"
host = "h"
port = 65535
role = "source"
transports = ["ofi"]
)",
                                 "t.toml");
  ASSERT_FALSE(high.ok());
  EXPECT_THAT(high.status().message(), HasSubstr("above 65535"));
}

TEST(TransportChoiceTest, BadLinkRulesAndTransportSettingsAreNamed) {
  auto error = [](const std::string& extra) {
    auto r = ParseClusterConfig(TwoRegions(extra, R"(["tcp"])"), "t.toml");
    EXPECT_FALSE(r.ok()) << extra;
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_THAT(error("[[link]]\nto = \"nobody\"\ntransports = [\"tcp\"]\n"),
              HasSubstr("[[link]] \"nobody\" is not a node id"));
  EXPECT_THAT(error("[[link]]\nfrom = \"region:mars\"\ntransports = [\"tcp\"]\n"),
              HasSubstr("\"region:mars\" names no region"));
  EXPECT_THAT(error("[[link]]\nscope = \"wan\"\ntransports = [\"tcp\"]\n"),
              HasSubstr("[[link]] scope = \"wan\": must be"));
  EXPECT_THAT(error("[[link]]\nscope = \"any\"\n"),
              HasSubstr("missing required key \"transports\""));
  EXPECT_THAT(error("[[link]]\ntransports = [\"rdma\"]\n"),
              HasSubstr("unknown transport \"rdma\""));
  EXPECT_THAT(error("[[link]]\ntransports = []\n"), HasSubstr("must not be empty"));
  EXPECT_THAT(error("[transport]\nucx_tls = \"tcp\"\n"),
              HasSubstr("unknown key \"ucx_tls\" in [transport]"));
  EXPECT_THAT(error("[transport]\nofi_provider = 3\n"), HasSubstr("must be a string"));
}

}  // namespace
}  // namespace deltacast::topology

#include "topology/plan_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kDelta = uint64_t{40} << 30;

struct Loaded {
  ClusterConfig config;
  TreePlan plan;
};

Loaded Load(const char* name) {
  Result<ClusterConfig> config =
      LoadClusterConfig(std::filesystem::path(DELTACAST_CONFIGS_DIR) / name);
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  Result<TreePlan> plan = PlanTree(*config);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return {*config, *plan};
}

TEST(PlanFormatTest, TextDrawsTheTreeWithIndentation) {
  const Loaded l = Load("three-regions.toml");
  const std::string text = FormatPlanText(l.plan, l.config, kDelta);
  EXPECT_THAT(text, HasSubstr("cluster \"three-regions\""));
  EXPECT_THAT(text, HasSubstr("predicted refit for a 40 GiB delta"));
  EXPECT_THAT(text, HasSubstr("eu-west: 6 nodes, WAN in 5 Gbit/s +40ms, gateway euw-3"));
  EXPECT_THAT(text, HasSubstr("(auto, best for a 1 GiB delta)"));
  // One line per node, indented two spaces per level, in depth-first order.
  std::istringstream lines(text.substr(text.find("\n\n") + 2));
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    const size_t indent = line.find_first_not_of(' ');
    const std::string id = line.substr(indent, line.find(' ', indent) - indent);
    const PlannedNode* n = l.plan.Find(id);
    ASSERT_NE(n, nullptr) << line;
    EXPECT_EQ(indent, static_cast<size_t>(n->depth) * 2) << line;
    EXPECT_EQ(line.find(" WAN") != std::string::npos, n->crosses_wan) << line;
    if (n->parent) {
      EXPECT_THAT(line, HasSubstr("<- " + *n->parent));
    }
    ++count;
  }
  EXPECT_EQ(count, static_cast<int>(l.plan.nodes.size()));
}

TEST(PlanFormatTest, JsonCarriesEveryField) {
  const Loaded l = Load("three-regions.toml");
  const nlohmann::json j = nlohmann::json::parse(FormatPlanJson(l.plan, l.config, kDelta));
  EXPECT_EQ(j["cluster"], "three-regions");
  EXPECT_EQ(j["source"], "trainer");
  EXPECT_EQ(j["fanout"], l.plan.fanout_used);
  EXPECT_EQ(j["fanout_auto"], true);
  EXPECT_EQ(j["delta_bytes"], kDelta);
  EXPECT_DOUBLE_EQ(j["predicted_seconds"].get<double>(), l.plan.PredictSeconds(kDelta));
  ASSERT_EQ(j["regions"].size(), 3u);
  EXPECT_EQ(j["regions"][0]["name"], "us-east");
  EXPECT_EQ(j["regions"][0]["source_region"], true);
  EXPECT_TRUE(j["regions"][0]["wan_bps"].is_null());
  ASSERT_EQ(j["nodes"].size(), l.plan.nodes.size());
  EXPECT_TRUE(j["nodes"][0]["parent"].is_null());
  EXPECT_TRUE(j["nodes"][0]["path_bps"].is_null());
  EXPECT_EQ(j["nodes"][0]["role"], "source");
  for (size_t i = 0; i < l.plan.nodes.size(); ++i) {
    const PlannedNode& n = l.plan.nodes[i];
    const nlohmann::json& jn = j["nodes"][i];
    EXPECT_EQ(jn["id"], n.id);
    EXPECT_EQ(jn["children"].get<std::vector<std::string>>(), n.children);
    EXPECT_EQ(jn["crosses_wan"], n.crosses_wan);
    EXPECT_EQ(jn["depth"], n.depth);
    EXPECT_DOUBLE_EQ(jn["link_bps"].get<double>(), n.link_bps);
    if (n.failover_parent) {
      EXPECT_EQ(jn["failover_parent"], *n.failover_parent);
    } else {
      EXPECT_TRUE(jn["failover_parent"].is_null());
    }
  }
}

TEST(PlanFormatTest, LocalSevenIsAChain) {
  const Loaded l = Load("local-7.toml");
  const std::string text = FormatPlanText(l.plan, l.config, kDelta);
  EXPECT_THAT(text, HasSubstr("8 nodes in 1 region, source trainer"));
  EXPECT_THAT(text, HasSubstr("              a7  [local]  127.0.0.1:7607"));
  EXPECT_THAT(text, HasSubstr("slowest: a7, depth 7"));
}

}  // namespace
}  // namespace deltacast::topology

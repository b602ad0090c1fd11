// `deltacast plan` for striped plans: every stripe's tree, the upload per node and
// the predicted time under the caps, as text and as JSON.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "topology/cluster_config.h"
#include "topology/plan_format.h"
#include "topology/stripe_plan.h"

namespace deltacast::topology {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kDelta = uint64_t{8} << 30;

// A source and 4 senders in "us"; 8 receivers in "eu", 4 of them gateways, each
// WAN flow capped at 1 Gbit/s.
std::string StripedConfig() {
  std::string text =
      "[cluster]\nname = \"striped\"\n[[region]]\nname = \"eu\"\nwan_bandwidth = \"40Gbit\"\n"
      "wan_latency = \"40ms\"\nflow_bandwidth = \"1Gbit\"\n";
  auto node = [&](const std::string& id, const std::string& region, const std::string& extra) {
    text += "[[node]]\nid = \"" + id + "\"\nhost = \"" + id +
            ".example\"\nport = 7600\nregion = \"" + region + "\"\n" + extra;
  };
  node("src", "us", "role = \"source\"\n");
  for (int s = 0; s < 4; ++s) node("snd" + std::to_string(s), "us", "role = \"sender\"\n");
  for (int i = 0; i < 8; ++i) node("eu" + std::to_string(i), "eu", i < 4 ? "gateway = true\n" : "");
  return text;
}

TEST(StripeFormatTest, TextShowsEveryStripeTheUploadAndTheCaps) {
  const ClusterConfig config = *ParseClusterConfig(StripedConfig(), "striped.toml");
  const StripedPlan plan = *PlanStripes(config);
  ASSERT_EQ(plan.stripes.size(), 4u);
  const std::string text = FormatStripedPlanText(plan, config, kDelta);
  EXPECT_THAT(text, HasSubstr("stripes 4 (auto"));
  EXPECT_THAT(text, HasSubstr("eu: 8 nodes, WAN in 40 Gbit/s +40ms, per flow 1 Gbit/s, entered by "
                              "stripe 0: eu0, 1: eu1, 2: eu2, 3: eu3"));
  EXPECT_THAT(text, HasSubstr("predicted refit for a 8 GiB delta (2 GiB per stripe): "));
  EXPECT_THAT(text, HasSubstr("upload per refit, in deltas (a stripe is 1/4):"));
  EXPECT_THAT(text, HasSubstr("src 1.00"));
  for (int s = 0; s < 4; ++s) {
    const std::string snd = "snd" + std::to_string(s);
    EXPECT_THAT(text, HasSubstr("stripe " + std::to_string(s) + ": root " + snd + ", fed by src"));
    EXPECT_THAT(text, HasSubstr("\n" + snd + "  [us]"));  // each tree drawn from its root
  }
  EXPECT_THAT(text,
              HasSubstr("  eu2  [eu]  eu2.example:7600  uplink 10 Gbit/s  <- snd2 1 Gbit/s WAN"));
}

TEST(StripeFormatTest, JsonHasEveryStripeAndTheShares) {
  const ClusterConfig config = *ParseClusterConfig(StripedConfig(), "striped.toml");
  const StripedPlan plan = *PlanStripes(config);
  const auto j = nlohmann::json::parse(FormatStripedPlanJson(plan, config, kDelta));
  EXPECT_EQ(j["stripe_count"], 4);
  EXPECT_EQ(j["stripes_auto"], true);
  EXPECT_EQ(j["fingerprint"], plan.Fingerprint().ToHex());
  EXPECT_EQ(j["stripe_bytes"], kDelta / 4);
  EXPECT_DOUBLE_EQ(j["predicted_seconds"].get<double>(), plan.PredictSeconds(kDelta));
  ASSERT_EQ(j["stripes"].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    const auto& st = j["stripes"][s];
    EXPECT_EQ(st["root"], "snd" + std::to_string(s));
    EXPECT_EQ(st["feeder"], "src");
    EXPECT_EQ(st["nodes"].size(), 9u);  // the root and the 8 receivers
    EXPECT_EQ(j["regions"][1]["gateways"][s], "eu" + std::to_string(s));
  }
  EXPECT_EQ(j["regions"][1]["flow_bps"], 1e9);
  const std::map<std::string, double> shares = plan.UploadShare();
  ASSERT_EQ(j["upload_share"].size(), shares.size());
  for (const auto& [id, share] : shares) EXPECT_EQ(j["upload_share"][id], share) << id;
  EXPECT_EQ(j["upload_share"]["src"], 1.0);  // it feeds each sender a quarter
}

TEST(StripeFormatTest, OneStripeIsTheSingleTreesPlanPlusShares) {
  for (const char* name : {"local-7.toml", "three-regions.toml", "bucket-region.toml"}) {
    SCOPED_TRACE(name);
    const ClusterConfig config =
        *LoadClusterConfig(std::filesystem::path(DELTACAST_CONFIGS_DIR) / name);
    const TreePlan tree = *PlanTree(config);
    const StripedPlan plan = *PlanStripes(config);
    const std::string text = FormatStripedPlanText(plan, config, kDelta);
    EXPECT_THAT(text, StartsWith(FormatPlanText(tree, config, kDelta)));
    EXPECT_THAT(text, HasSubstr("stripes 1 (auto): the single tree above"));
    auto single = nlohmann::json::parse(FormatPlanJson(tree, config, kDelta));
    auto striped = nlohmann::json::parse(FormatStripedPlanJson(plan, config, kDelta));
    EXPECT_EQ(striped["stripe_count"], 1);
    EXPECT_EQ(striped["fingerprint"], tree.Fingerprint().ToHex());
    EXPECT_EQ(striped["upload_share"][tree.source], tree.nodes[0].children.size());
    for (const char* added : {"stripe_count", "stripes_auto", "fingerprint", "upload_share"}) {
      striped.erase(added);
    }
    EXPECT_EQ(striped, single);
  }
}

}  // namespace
}  // namespace deltacast::topology

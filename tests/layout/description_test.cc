// Layout descriptions are validated like the cluster config: every error names
// FILE:LINE, unknown keys are refused with the nearest known key.
#include "layout/description.h"

#include <gtest/gtest.h>

namespace deltacast::layout {
namespace {

constexpr char kGood[] = R"([layout]
canonical = "canonical.json"

[model]
hidden = 64
heads = 8
kv_heads = 2
head_dim = 8
layers = 4

[mesh]
tp = 2
pp = 2

[rank]
tp = 1
pp = 1
dp = 0
ep = 0

[[tensor]]
local = "decoder.layers.{layer}.self_attention.linear_qkv.weight"
kind = "qkv"
canonical = ["model.layers.{layer}.q", "model.layers.{layer}.k", "model.layers.{layer}.v"]
)";

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(LayoutDescription, ParsesAGoodFile) {
  auto d = ParseLayout(kGood, "rank3.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->mesh.tp, 2u);
  EXPECT_EQ(d->rank.tp, 1u);
  EXPECT_EQ(d->LayerOffset(), 2u);
  ASSERT_EQ(d->rules.size(), 1u);
  EXPECT_EQ(d->rules[0].kind, Kind::kQkv);
  EXPECT_EQ(d->rules[0].line, 21);
  EXPECT_EQ(d->canonical, "canonical.json");
}

TEST(LayoutDescription, SyntaxErrorNamesFileLineAndColumn) {
  auto d = ParseLayout(Replace(kGood, "tp = 2", "tp = = 2"), "rank3.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(d.status().message().starts_with("rank3.toml:12:")) << d.status().message();
  EXPECT_NE(d.status().message().find("TOML syntax error"), std::string::npos);
}

TEST(LayoutDescription, UnknownKeyIsRefusedWithASuggestion) {
  auto d = ParseLayout(Replace(kGood, "kind = \"qkv\"", "knd = \"qkv\""), "rank3.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.status().message().starts_with("rank3.toml:23:")) << d.status().message();
  EXPECT_NE(d.status().message().find("did you mean \"kind\""), std::string::npos);
}

TEST(LayoutDescription, RankOutsideTheMeshIsRefused) {
  auto d = ParseLayout(Replace(kGood, "tp = 1", "tp = 2"), "rank3.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.status().message().starts_with("rank3.toml:16:")) << d.status().message();
  EXPECT_NE(d.status().message().find("[rank] tp = 2 is out of range [0, 1]"), std::string::npos);
}

TEST(LayoutDescription, WrongPartCountAndKindAreRefused) {
  auto d = ParseLayout(Replace(kGood, "\"model.layers.{layer}.v\"", ""), "r.toml");
  ASSERT_FALSE(d.ok());
  auto d2 = ParseLayout(Replace(kGood, "\"qkv\"", "\"fused\""), "r.toml");
  ASSERT_FALSE(d2.ok());
  EXPECT_NE(d2.status().message().find("must be one of"), std::string::npos);
  EXPECT_TRUE(d2.status().message().starts_with("r.toml:23:")) << d2.status().message();
}

TEST(LayoutDescription, MissingSectionIsNamed) {
  auto d = ParseLayout(Replace(kGood, "[mesh]", "[mesh_]"), "r.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("mesh_"), std::string::npos) << d.status().message();
}

TEST(LayoutDescription, ExpertRuleNeedsExperts) {
  auto d = ParseLayout(Replace(kGood, "linear_qkv.weight\"", "experts.{expert}.w\""), "r.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("experts is not set"), std::string::npos)
      << d.status().message();
}

TEST(LayoutDescription, ABlockScaleGridNeedsAKindThatSplitsIt) {
  auto d =
      ParseLayout(Replace(kGood, "kind = \"qkv\"", "kind = \"qkv_heads\"\nblock = 128"), "r.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->rules[0].block, 128u);
  auto replicated = ParseLayout(
      Replace(
          Replace(kGood, "kind = \"qkv\"", "kind = \"replicated\"\nblock = 128"),
          "[\"model.layers.{layer}.q\", \"model.layers.{layer}.k\", \"model.layers.{layer}.v\"]",
          "\"model.layers.{layer}.q\""),
      "r.toml");
  ASSERT_FALSE(replicated.ok());
  EXPECT_TRUE(replicated.status().message().starts_with("r.toml:24:"))
      << replicated.status().message();
  EXPECT_NE(replicated.status().message().find("block = 128 needs kind"), std::string::npos);
  auto zero =
      ParseLayout(Replace(kGood, "kind = \"qkv\"", "kind = \"qkv_heads\"\nblock = 0"), "r.toml");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("block must be an integer"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::layout

// The engine plan generator (layout/engine.h) and the format it writes: config.json
// read or refused by key, settings the engines refuse refused by name, and the
// generated plans checked mechanically against an independent sharder of vLLM's and
// SGLang's layouts (tests/layout/engine_reference.h): every GPU's parameters, filled
// with iota values by the sharder, must map back onto exactly the canonical elements
// they hold, and the GPUs together must hold every canonical element.
#include "layout/engine.h"

#include <gtest/gtest.h>

#include "layout/description.h"
#include "layout/placement.h"
#include "tests/layout/engine_reference.h"

namespace deltacast::layout {
namespace {

using testing::EngineModel;
using testing::EngineRun;
using testing::EngineSharder;

Result<std::vector<std::string>> Generate(const EngineModel& m, const EngineRun& r) {
  ASSIGN_OR_RETURN(HfConfig c, ParseHfConfig(m.ConfigJson(), "config.json"));
  return EngineLayouts(c, {*ParseEngine(r.engine), r.tp, r.dp, r.ep}, "canonical.json");
}

std::string Error(const Result<std::vector<std::string>>& r) {
  return r.ok() ? "" : r.status().message();
}

TEST(EngineConfig, ReadsTheKeysThatShapeTheModel) {
  auto c = ParseHfConfig(
      R"({"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
          "num_hidden_layers": 24, "tie_word_embeddings": true})",
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 64u);  // hidden / heads when absent
  EXPECT_TRUE(c->qkv_bias);     // Qwen2's attention always has QKV biases
  EXPECT_TRUE(c->tied);
  EXPECT_FALSE(c->qk_norm);
}

TEST(EngineConfig, AMissingOrBadKeyIsNamed) {
  auto c = ParseHfConfig(R"({"hidden_size": 64, "num_attention_heads": 8})", "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cfg.json: \"num_hidden_layers\" is missing"),
            std::string::npos)
      << c.status().message();
  c = ParseHfConfig(R"({"hidden_size": -4})", "cfg.json");
  EXPECT_NE(c.status().message().find("\"hidden_size\" must be a positive integer, not -4"),
            std::string::npos)
      << c.status().message();
  c = ParseHfConfig(R"({"n_routed_experts": 64})", "cfg.json");
  EXPECT_NE(c.status().message().find("n_routed_experts"), std::string::npos);
  EXPECT_FALSE(ParseHfConfig("[1, 2]", "cfg.json").ok());
}

TEST(EngineLayouts, SettingsTheEnginesRefuseAreRefusedByName) {
  EngineModel m;  // 8 heads, 2 KV heads
  EngineModel odd = m;
  odd.heads = 12;
  odd.kv_heads = 3;
  EXPECT_NE(Error(Generate(odd, {"vllm", 4, 1, 1}))
                .find("num_key_value_heads = 3 < tp = 4: each KV head would be replicated on tp "
                      "/ num_key_value_heads = 4 / 3 GPUs, which is not whole"),
            std::string::npos)
      << Error(Generate(odd, {"vllm", 4, 1, 1}));
  EXPECT_NE(Error(Generate(m, {"vllm", 3, 1, 1})).find("num_attention_heads = 8"),
            std::string::npos);
  EngineModel moe = m;
  moe.model_type = "qwen2_moe";
  moe.experts = 4;
  EXPECT_NE(Error(Generate(moe, {"vllm", 2, 1, 4})).find("vllm: ep = 4"), std::string::npos);
  EXPECT_NE(Error(Generate(moe, {"sglang", 4, 2, 1})).find("sglang: dp = 2"), std::string::npos);
  EXPECT_NE(Error(Generate(moe, {"sglang", 4, 1, 3})).find("does not divide by ep = 3"),
            std::string::npos);
  EXPECT_NE(Error(Generate(m, {"vllm", 2, 1, 2})).find("no experts"), std::string::npos);
  EXPECT_TRUE(Generate(moe, {"sglang", 4, 1, 2}).ok());
}

// A hand-written qkv_heads rule whose replication factor is not whole is refused
// when expanded, naming the parameter.
TEST(EngineLayouts, AQkvHeadsRuleWithAFractionalReplicationIsRefused) {
  const std::string toml =
      "[layout]\ncanonical = \"c.json\"\n[model]\nhidden = 8\nheads = 12\nkv_heads = 3\n"
      "head_dim = 2\nlayers = 1\n[mesh]\ntp = 4\n[rank]\ntp = 1\npp = 0\ndp = 0\nep = 0\n"
      "[[tensor]]\nlocal = \"qkv\"\nkind = \"qkv_heads\"\ncanonical = [\"q\", \"k\", \"v\"]\n";
  auto d = ParseLayout(toml, "gpu-1.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const std::vector<TensorSpec> canonical = {
      {"q", DType::kBF16, {24, 8}}, {"k", DType::kBF16, {6, 8}}, {"v", DType::kBF16, {6, 8}}};
  auto map = ExpandPlacement(*d, canonical, {{"qkv", DType::kBF16, {7, 8}}}, PlacementUse::kLoad);
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("gpu-1.toml:16: local 'qkv': KV replication factor 4 / 3 "
                                        "is not whole"),
            std::string::npos)
      << map.status().message();
}

TEST(EngineLayouts, ARankWhoseEpCoordinateDisagreesWithTheGridIsRefused) {
  const std::string toml =
      "[layout]\ncanonical = \"c.json\"\n[model]\nhidden = 8\nheads = 2\nkv_heads = 2\n"
      "head_dim = 4\nlayers = 1\nexperts = 4\n[mesh]\ntp = 4\nep = 2\netp = 2\n"
      "ep_from = \"tp_dp\"\n[rank]\ntp = 3\npp = 0\ndp = 0\nep = 0\n"
      "[[tensor]]\nlocal = \"x\"\nkind = \"replicated\"\ncanonical = \"x\"\n";
  auto d = ParseLayout(toml, "gpu-3.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("is EP rank 1"), std::string::npos) << d.status().message();
}

struct Case {
  std::string name;
  EngineModel model;
  EngineRun run;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class EngineIota : public ::testing::TestWithParam<Case> {};

// Every GPU's parameters, as the sharder fills them with canonical iota values,
// map through the generated plan back onto exactly those canonical elements, every
// replica too; the scan maps cover each canonical element once.
TEST_P(EngineIota, EveryElementOfEveryGpuMapsBackToItsCanonicalIndex) {
  const Case& c = GetParam();
  auto texts = Generate(c.model, c.run);
  ASSERT_TRUE(texts.ok()) << texts.status().ToString();
  ASSERT_EQ(texts->size(), c.run.Gpus());
  const auto canonical = testing::EngineCanonical(c.model);
  std::vector<TensorSpec> table;
  for (const auto& t : canonical) table.push_back(t.spec);
  EngineSharder sharder(c.model, c.run, canonical);
  std::vector<PlacementMap> scans;
  uint64_t replica_elements = 0;
  for (uint64_t g = 0; g < c.run.Gpus(); ++g) {
    auto d = ParseLayout((*texts)[g], "gpu-" + std::to_string(g) + ".toml");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    const auto gpu = sharder.Gpu(g);
    std::vector<TensorSpec> locals;
    for (const auto& t : gpu) locals.push_back(t.spec);
    auto expected = ExpectedLocals(*d, table);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    EXPECT_EQ(expected->size(), gpu.size()) << "GPU " << g;
    for (const ExpectedLocal& x : *expected) {
      auto it = std::find_if(gpu.begin(), gpu.end(),
                             [&](const testing::Tensor& t) { return t.spec.name == x.name; });
      ASSERT_NE(it, gpu.end()) << x.name;
      EXPECT_EQ(x.shape, it->spec.shape) << x.name;
    }
    auto load = ExpandPlacement(*d, table, locals, PlacementUse::kLoad);
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    for (uint32_t l = 0; l < gpu.size(); ++l) {
      ASSERT_NE(load->locals()[l].role, Role::kUnmatched) << gpu[l].spec.name;
      uint64_t mapped = 0;
      for (const layout::Run& r : load->RunsOf(l)) {
        for (uint64_t row = 0; row < r.count; ++row) {
          for (uint64_t i = 0; i < r.len; ++i) {
            const uint64_t src = r.src + row * r.src_stride + i;
            const uint64_t dst = r.dst + row * r.dst_stride + i;
            ASSERT_EQ(gpu[l].values[src], testing::Iota(r.canonical, dst))
                << "GPU " << g << " " << gpu[l].spec.name << " element " << src;
          }
        }
        mapped += r.Elements();
        if (r.copy != 0) replica_elements += r.Elements();
      }
      // Every element but vocabulary padding is mapped.
      uint64_t held = 0;
      for (int64_t v : gpu[l].values) held += v != testing::kPadding;
      EXPECT_EQ(mapped, held) << "GPU " << g << " " << gpu[l].spec.name;
    }
    auto scan = ExpandPlacement(*d, table, locals);
    ASSERT_TRUE(scan.ok()) << scan.status().ToString();
    scans.push_back(std::move(*scan));
  }
  std::vector<const PlacementMap*> maps;
  for (const auto& m : scans) maps.push_back(&m);
  const Status coverage = CheckCoverage(maps);
  EXPECT_TRUE(coverage.ok()) << coverage.ToString();
  if (c.model.kv_heads < c.run.tp || c.run.dp > 1) {
    EXPECT_GT(replica_elements, 0u);  // replicated KV heads (or dp replicas) are load runs too
  }
}

INSTANTIATE_TEST_SUITE_P(
    Engines, EngineIota,
    ::testing::Values(
        Case{"VllmQwen2Tp4", EngineModel{}, {"vllm", 4, 1, 1}},
        Case{"VllmQwen2Tp8OneHeadEach", EngineModel{}, {"vllm", 8, 1, 1}},
        Case{"SglangLlamaTp2", EngineModel{"llama", 32, 8, 4, 4, 24, 50, 2}, {"sglang", 2, 1, 1}},
        Case{"VllmQwen2Tp2Dp2", EngineModel{}, {"vllm", 2, 2, 1}},
        Case{"SglangQwen2MoeTp4Ep2",
             EngineModel{"qwen2_moe", 32, 8, 2, 4, 24, 50, 2, 4, 8, 16},
             {"sglang", 4, 1, 2}},
        Case{"SglangQwen3MoeTp4Ep4",
             EngineModel{"qwen3_moe", 32, 8, 2, 4, 24, 50, 2, 8, 8, 0},
             {"sglang", 4, 1, 4}},
        Case{"VllmQwen2MoeTp2Dp2Ep4",
             EngineModel{"qwen2_moe", 32, 8, 2, 4, 24, 50, 2, 4, 8, 16},
             {"vllm", 2, 2, 4}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace deltacast::layout

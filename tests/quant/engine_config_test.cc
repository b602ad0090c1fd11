// config.json's quantization_config as the engine-plan generator reads it: block
// FP8 gives each linear a scale-grid rule; what has no generated plan, and FP8
// splits the engines would refuse, are refused naming the key or the size.
#include "quant/engine_config.h"

#include <gtest/gtest.h>

#include <string>

#include "layout/engine.h"

namespace deltacast::quant {
namespace {

// A Qwen2-7B-shaped config.json with `quantization` as its quantization_config
// (none when empty).
std::string Config(const std::string& quantization, uint64_t intermediate = 18944) {
  std::string j = R"({"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
    "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 152064,
    "intermediate_size": )" +
                  std::to_string(intermediate);
  if (!quantization.empty()) j += R"(, "quantization_config": )" + quantization;
  return j + "}";
}

constexpr const char* kBlockFp8 =
    R"({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"]})";

TEST(EngineConfigTest, BlockFp8GivesEveryLinearItsScaleGridRule) {
  auto c = ParseEngineConfig(Config(kBlockFp8), "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->fp8_block, 128u);
  auto plans = layout::EngineLayouts(*c, {layout::Engine::kVllm, 4, 1, 1}, "canonical.json");
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  const std::string& plan = plans->front();
  for (const char* local :
       {"self_attn.qkv_proj.weight_scale_inv", "self_attn.o_proj.weight_scale_inv",
        "mlp.gate_up_proj.weight_scale_inv", "mlp.down_proj.weight_scale_inv"}) {
    EXPECT_NE(plan.find(std::string("local = \"model.layers.{layer}.") + local + "\""),
              std::string::npos)
        << local;
  }
  EXPECT_NE(plan.find("block = 128"), std::string::npos);
  EXPECT_EQ(plan.find("embed_tokens.weight_scale_inv"), std::string::npos);

  auto bf16 = ParseEngineConfig(Config(""), "config.json");
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->fp8_block, 0u);
  auto plain = layout::EngineLayouts(*bf16, {layout::Engine::kVllm, 4, 1, 1}, "canonical.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->front().find("scale_inv"), std::string::npos);
}

TEST(EngineConfigTest, QuantizationsWithoutGeneratedPlansAreRefusedNamingTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"quant_method": "awq", "bits": 4})", "quant_method \"awq\""},
      {R"({"quant_method": "fp8", "activation_scheme": "static"})", "weight_block_size"},
      {R"({"quant_method": "fp8", "weight_block_size": [1, 128]})", "weight_block_size"},
      {R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})",
       "fmt \"e5m2\""},
      {R"({"quant_method": "fp8", "weight_block_size": [128, 128],
           "modules_to_not_convert": ["model.layers.3.self_attn.q_proj"]})",
       "model.layers.3.self_attn.q_proj"},
  };
  for (const auto& [quantization, named] : cases) {
    auto c = ParseEngineConfig(Config(quantization), "config.json");
    ASSERT_FALSE(c.ok()) << quantization;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(named), std::string::npos) << c.status().ToString();
    EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
  }
}

TEST(EngineConfigTest, AnFp8SplitThatCutsAScaleBlockIsRefusedNamingTheSize) {
  // 18944 / 2 = 9472 = 74 blocks of 128: fine; (18944 + 128) / 2 = 9536 is not.
  auto c = ParseEngineConfig(Config(kBlockFp8), "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(layout::EngineLayouts(*c, {layout::Engine::kVllm, 2, 1, 1}, "c.json").ok());
  auto odd = ParseEngineConfig(Config(kBlockFp8, 18944 + 128), "config.json");
  ASSERT_TRUE(odd.ok());
  auto refused = layout::EngineLayouts(*odd, {layout::Engine::kVllm, 2, 1, 1}, "c.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("(intermediate_size / tp) = 9536"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("[128, 128]"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::quant

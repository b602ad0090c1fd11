// Serving descriptions: parsing (every error names FILE:LINE), planning the served
// checkpoint from the canonical tensors, and checking a receiver's FP8 checkpoint;
// every refusal names the tensor at fault.
#include "quant/serving.h"

#include <gtest/gtest.h>

namespace deltacast::quant {
namespace {


constexpr char kGood[] = R"([serving]
scheme = "fp8_e4m3_block128"
quantize = ["model.layers.*.weight"]
not_converted = ["*norm.weight", "*.mlp.gate.weight"]
)";

std::vector<TensorSpec> Canonical() {
  return {
      {"model.embed_tokens.weight", DType::kBF16, {1000, 64}},
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {64}},
      {"model.layers.0.self_attn.q_proj.weight", DType::kBF16, {300, 64}},
      {"model.layers.0.mlp.gate.weight", DType::kBF16, {8, 64}},
      {"model.layers.0.mlp.down_proj.weight", DType::kBF16, {64, 129}},
      {"lm_head.weight", DType::kBF16, {1000, 64}},
  };
}

ServingDescription Good() {
  auto d = ParseServing(kGood, "serving.toml");
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return *d;
}

void ExpectError(const Status& s, std::initializer_list<std::string_view> parts) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (std::string_view p : parts) {
    EXPECT_NE(s.message().find(p), std::string::npos) << "'" << p << "' not in: " << s.message();
  }
}

TEST(ParseServing, Good) {
  const ServingDescription d = Good();
  ASSERT_NE(d.scheme, nullptr);
  EXPECT_EQ(d.scheme->name, "fp8_e4m3_block128");
  EXPECT_EQ(d.quantize, (std::vector<std::string>{"model.layers.*.weight"}));
  EXPECT_EQ(d.not_converted.size(), 2u);
}

TEST(ParseServing, TheExampleConfigParses) {
  auto d = LoadServing(std::filesystem::path(DELTACAST_SOURCE_DIR) / "configs/serving-fp8.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->scheme->name, "fp8_e4m3_block128");
  auto plan = PlanServing(*d, Canonical());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(LoadServing("/nonexistent/serving.toml").status().code(), StatusCode::kNotFound);
}

TEST(ParseServing, Refusals) {
  ExpectError(
      ParseServing("[serving]\nscheme = \"fp8_e4m3_block64\"\nquantize = [\"*\"]\n", "s.toml")
          .status(),
      {"s.toml:2:", "unknown scheme 'fp8_e4m3_block64'", "fp8_e4m3_block128_ue8m0"});
  ExpectError(ParseServing("[serving]\nquantize = [\"*\"]\n", "s.toml").status(),
              {"s.toml:1:", "missing required key 'scheme'"});
  ExpectError(ParseServing("[serving]\nscheme = \"fp8_e4m3_block128\"\n", "s.toml").status(),
              {"missing required key 'quantize'"});
  ExpectError(
      ParseServing("[serving]\nscheme = \"fp8_e4m3_block128\"\nquantize = []\n", "s.toml").status(),
      {"s.toml:3:", "empty"});
  ExpectError(
      ParseServing("[serving]\nscheme = \"fp8_e4m3_block128\"\nquantize = \"*\"\n", "s.toml")
          .status(),
      {"s.toml:3:", "array of strings"});
  ExpectError(
      ParseServing("[serving]\nscheme = \"fp8_e4m3_block128\"\nquantize = [\"*\"]\n"
                   "not_convert = [\"x\"]\n",
                   "s.toml")
          .status(),
      {"s.toml:4:", "unknown key \"not_convert\" in [serving]", "did you mean \"not_converted\""});
  ExpectError(ParseServing("[serving]\nscheme = \"fp8_e4m3_block128\"\nquantize = [\"*\"]\n"
                           "[layout]\ncanonical = \"x\"\n",
                           "s.toml")
                  .status(),
              {"unknown table 'layout'"});
  ExpectError(ParseServing("[serving\n", "s.toml").status(), {"s.toml:1:"});
  ExpectError(ParseServing("scheme = 1\n", "s.toml").status(), {"unknown table 'scheme'"});
}

TEST(PlanServing, QuantizesMatchesAndKeepsTheRest) {
  auto plan = PlanServing(Good(), Canonical());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 6u);
  EXPECT_FALSE((*plan)[0].quantized());  // embeddings: no pattern
  EXPECT_FALSE((*plan)[1].quantized());  // norm: 1-D and listed as not converted
  const ServedTensor& q = (*plan)[2];
  ASSERT_TRUE(q.quantized());
  EXPECT_EQ(q.weight.dtype, DType::kF8E4M3);
  EXPECT_EQ(q.weight.shape, (std::vector<uint64_t>{300, 64}));
  EXPECT_EQ(q.scale.name, "model.layers.0.self_attn.q_proj.weight_scale_inv");
  EXPECT_EQ(q.scale.dtype, DType::kF32);
  EXPECT_EQ(q.scale.shape, (std::vector<uint64_t>{3, 1}));
  EXPECT_FALSE((*plan)[3].quantized());  // the router
  EXPECT_EQ((*plan)[4].scale.shape, (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE((*plan)[5].quantized());
}

TEST(PlanServing, RefusesATensorThatIsNot2D) {
  ServingDescription d = Good();
  d.not_converted = {"*.mlp.gate.weight"};  // the norm is now listed as FP8
  ExpectError(PlanServing(d, Canonical()).status(),
              {"'model.layers.0.input_layernorm.weight'", "[64]", "2-D", "not_converted"});
}

TEST(PlanServing, RefusesANonBf16Tensor) {
  std::vector<TensorSpec> c = Canonical();
  c[2].dtype = DType::kF32;
  ExpectError(PlanServing(Good(), c).status(), {"'model.layers.0.self_attn.q_proj.weight'", "F32"});
}

TEST(PlanServing, RefusesAPatternThatMatchesNothing) {
  ServingDescription d = Good();
  d.quantize.push_back("model.layer.*.weight");
  ExpectError(PlanServing(d, Canonical()).status(), {"'model.layer.*.weight'", "matches no"});
}

TEST(PlanServing, RefusesAScaleNameThatIsTaken) {
  std::vector<TensorSpec> c = Canonical();
  c.push_back({"model.layers.0.self_attn.q_proj.weight_scale_inv", DType::kF32, {3, 1}});
  ServingDescription d = Good();
  d.not_converted.push_back("*_scale_inv");
  ExpectError(PlanServing(d, c).status(), {"'model.layers.0.self_attn.q_proj.weight_scale_inv'"});
}

// What the receiver's checkpoint should hold for Good() on Canonical().
std::vector<TensorSpec> ServedCheckpoint() {
  return {
      {"model.embed_tokens.weight", DType::kBF16, {1000, 64}},
      {"model.layers.0.input_layernorm.weight", DType::kBF16, {64}},
      {"model.layers.0.self_attn.q_proj.weight", DType::kF8E4M3, {300, 64}},
      {"model.layers.0.self_attn.q_proj.weight_scale_inv", DType::kF32, {3, 1}},
      {"model.layers.0.mlp.gate.weight", DType::kBF16, {8, 64}},
      {"model.layers.0.mlp.down_proj.weight", DType::kF8E4M3, {64, 129}},
      {"model.layers.0.mlp.down_proj.weight_scale_inv", DType::kF32, {1, 2}},
      {"lm_head.weight", DType::kBF16, {1000, 64}},
  };
}

QuantizationConfig Receiver() {
  auto c = ParseQuantizationConfig(
      R"({"model_type": "qwen3", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
          "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})",
      "config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

TEST(CheckServedCheckpoint, AcceptsTheMatchingCheckpoint) {
  auto plan = PlanServing(Good(), Canonical());
  ASSERT_TRUE(plan.ok());
  const Status s = CheckServedCheckpoint(*plan, ServedCheckpoint(), Receiver());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(CheckServedCheckpoint, RefusesAScaleOfTheWrongShapeOrDtype) {
  auto plan = PlanServing(Good(), Canonical());
  ASSERT_TRUE(plan.ok());
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt[6].shape = {1, 1};  // what 64 x 256 blocks would give
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"scale tensor 'model.layers.0.mlp.down_proj.weight_scale_inv'", "[1, 1]", "[1, 2]"});
  ckpt = ServedCheckpoint();
  ckpt[3].dtype = DType::kBF16;
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"'model.layers.0.self_attn.q_proj.weight_scale_inv'", "BF16", "expected F32"});
  ckpt = ServedCheckpoint();
  ckpt.erase(ckpt.begin() + 3);
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"lacks scale tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv'"});
}

TEST(CheckServedCheckpoint, RefusesWeightsThatDiffer) {
  auto plan = PlanServing(Good(), Canonical());
  ASSERT_TRUE(plan.ok());
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt[2].dtype = DType::kBF16;  // the receiver serves q_proj unquantized
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"FP8 weight 'model.layers.0.self_attn.q_proj.weight'", "expected F8_E4M3"});
  ckpt = ServedCheckpoint();
  ckpt[4].dtype = DType::kF8E4M3;  // the receiver quantized the router
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"tensor 'model.layers.0.mlp.gate.weight'"});
  ckpt = ServedCheckpoint();
  ckpt.push_back({"model.layers.0.mlp.gate.weight_scale_inv", DType::kF32, {1, 1}});
  ExpectError(CheckServedCheckpoint(*plan, ckpt, Receiver()),
              {"'model.layers.0.mlp.gate.weight_scale_inv'", "does not make"});
}

TEST(CheckServedCheckpoint, RefusesABlockSizeOrFormatTheReceiverDoesNotUse) {
  auto plan = PlanServing(Good(), Canonical());
  ASSERT_TRUE(plan.ok());
  QuantizationConfig r = Receiver();
  r.weight_block_size = {64, 64};
  ExpectError(CheckServedCheckpoint(*plan, ServedCheckpoint(), r),
              {"weight_block_size [64, 64]", "fp8_e4m3_block128", "[128, 128]"});
  r = Receiver();
  r.weight_block_size.clear();  // per-tensor FP8
  ExpectError(CheckServedCheckpoint(*plan, ServedCheckpoint(), r), {"weight_block_size []"});
  r = Receiver();
  r.scale_fmt = "ue8m0";
  ExpectError(CheckServedCheckpoint(*plan, ServedCheckpoint(), r), {"scale_fmt 'ue8m0'"});
  r = Receiver();
  r.fmt = "e5m2";
  ExpectError(CheckServedCheckpoint(*plan, ServedCheckpoint(), r), {"fmt 'e5m2'"});
}

TEST(CheckFp8Checkpoint, AcceptsAConsistentCheckpointOfAnyBlockSize) {
  Status s = CheckFp8Checkpoint(ServedCheckpoint(), Receiver());
  EXPECT_TRUE(s.ok()) << s.ToString();
  // 64 x 64 blocks: no scheme row has them, the scales say so and agree.
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt[3].shape = {5, 1};
  ckpt[6].shape = {1, 3};
  QuantizationConfig r = Receiver();
  r.weight_block_size = {64, 64};
  s = CheckFp8Checkpoint(ckpt, r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Not block-scaled FP8: nothing to check.
  r.quant_method = "awq";
  EXPECT_TRUE(CheckFp8Checkpoint(ServedCheckpoint(), r).ok());
  r = Receiver();
  r.weight_block_size.clear();
  EXPECT_TRUE(CheckFp8Checkpoint(ServedCheckpoint(), r).ok());
}

TEST(CheckFp8Checkpoint, RefusesScalesThatDoNotMatchTheConfigsBlockSize) {
  QuantizationConfig r = Receiver();
  r.weight_block_size = {64, 64};  // config.json says 64, the scales are of 128 blocks
  ExpectError(CheckFp8Checkpoint(ServedCheckpoint(), r),
              {"scale tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv'", "F32 [3, 1]",
               "expected F32 [5, 1]"});
  r.weight_block_size = {128, 0};
  ExpectError(CheckFp8Checkpoint(ServedCheckpoint(), r), {"weight_block_size [128, 0]"});
  r = Receiver();
  r.fmt = "e5m2";
  ExpectError(CheckFp8Checkpoint(ServedCheckpoint(), r), {"fmt 'e5m2'"});
}

TEST(CheckFp8Checkpoint, RefusesAScaleMissingOrOfTheWrongDtype) {
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt.erase(ckpt.begin() + 6);
  ExpectError(CheckFp8Checkpoint(ckpt, Receiver()),
              {"lacks scale tensor 'model.layers.0.mlp.down_proj.weight_scale_inv'"});
  ckpt = ServedCheckpoint();
  ckpt[3].dtype = DType::kBF16;
  ExpectError(CheckFp8Checkpoint(ckpt, Receiver()),
              {"'model.layers.0.self_attn.q_proj.weight_scale_inv'", "BF16", "expected F32"});
}

TEST(CheckFp8Checkpoint, RefusesAScaleWithoutAnFp8Weight) {
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt[2].dtype = DType::kBF16;
  ExpectError(CheckFp8Checkpoint(ckpt, Receiver()),
              {"scale tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv'",
               "'model.layers.0.self_attn.q_proj.weight' is BF16"});
  ckpt = ServedCheckpoint();
  ckpt.push_back({"model.layers.0.mlp.up_proj.weight_scale_inv", DType::kF32, {1, 1}});
  ExpectError(CheckFp8Checkpoint(ckpt, Receiver()),
              {"'model.layers.0.mlp.up_proj.weight_scale_inv'", "is missing"});
}

TEST(CheckFp8Checkpoint, RefusesAnFp8WeightThatIsNot2DOrNotConverted) {
  std::vector<TensorSpec> ckpt = ServedCheckpoint();
  ckpt[1].dtype = DType::kF8E4M3;  // a 1-D norm stored as FP8
  ExpectError(CheckFp8Checkpoint(ckpt, Receiver()),
              {"FP8 weight 'model.layers.0.input_layernorm.weight'", "[64]", "2-D"});
  QuantizationConfig r = Receiver();
  r.modules_to_not_convert = {"lm_head", "model.layers.0.mlp.down_proj"};
  ExpectError(CheckFp8Checkpoint(ServedCheckpoint(), r),
              {"'model.layers.0.mlp.down_proj.weight'", "modules_to_not_convert"});
}

TEST(QuantizationConfig, RoundTripsThroughConfigJson) {
  ServingDescription d = Good();
  d.scheme = FindFp8Scheme("fp8_e4m3_block128_ue8m0");
  auto plan = PlanServing(d, Canonical());
  ASSERT_TRUE(plan.ok());
  const std::string json = QuantizationConfigJson(*plan);
  auto c = ParseQuantizationConfig("{\"quantization_config\": " + json + "}", "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->quant_method, "fp8");
  EXPECT_EQ(c->fmt, "e4m3");
  EXPECT_EQ(c->weight_block_size, (std::vector<uint64_t>{128, 128}));
  EXPECT_EQ(c->scale_fmt, "ue8m0");
  EXPECT_EQ(c->modules_to_not_convert,
            (std::vector<std::string>{"model.embed_tokens", "model.layers.0.mlp.gate", "lm_head"}));
  EXPECT_TRUE(CheckServedCheckpoint(*plan, ServedCheckpoint(), *c).ok());
}

TEST(QuantizationConfig, Refusals) {
  EXPECT_EQ(ParseQuantizationConfig("{}", "c.json").status().code(), StatusCode::kNotFound);
  ExpectError(
      ParseQuantizationConfig("{\"quantization_config\": {\"weight_block_size\": 128}}", "c.json")
          .status(),
      {"c.json", "weight_block_size must be a list"});
  ExpectError(ParseQuantizationConfig("{\"quantization_config\": {\"fmt\": 3}}", "c.json").status(),
              {"fmt must be a string"});
  ExpectError(ParseQuantizationConfig("not json", "c.json").status(), {"c.json"});
}

}  // namespace
}  // namespace deltacast::quant

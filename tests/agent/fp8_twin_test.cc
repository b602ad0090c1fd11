// FP8 serving twins on disk: the twin holds the quantizer's bytes and the kept
// tensors' bytes, and a step that cannot be served (a NaN, a tensor the plan
// refuses) leaves the previous twin as it was and nothing half-written.
#include "agent/fp8_twin.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "apply/checkpoint_dir.h"
#include "apply/safetensors.h"
#include "common/file_util.h"
#include "common/hash.h"
#include "quant/fp8_quantizer.h"
#include "tests/temp_dir.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;
constexpr char kLinear[] = "model.layers.0.mlp.up_proj.weight";
constexpr char kNorm[] = "model.layers.0.post_attention_layernorm.weight";
constexpr uint64_t kRows = 130, kCols = 200;

uint16_t Bf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

void WriteSource(const fs::path& dir, const std::vector<uint16_t>& linear) {
  fs::create_directories(dir);
  const std::vector<TensorSpec> tensors = {{kLinear, DType::kBF16, {kRows, kCols}},
                                           {kNorm, DType::kBF16, {kCols}}};
  std::vector<uint16_t> norm(kCols, Bf16(1.0f));
  auto writer = apply::SafetensorsWriter::Create(dir / "model.safetensors", tensors);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_TRUE((*writer)->Append(std::as_bytes(std::span(linear))).ok());
  ASSERT_TRUE((*writer)->Append(std::as_bytes(std::span(norm))).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
}

std::vector<uint16_t> Weights(float scale) {
  std::vector<uint16_t> w(kRows * kCols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = Bf16(scale * static_cast<float>(i % 97) - 0.3f);
  return w;
}

uint64_t DirHash(const fs::path& dir) {
  uint64_t h = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto bytes = ReadFile(e.path(), 1 << 24);
    EXPECT_TRUE(bytes.ok());
    h ^= Hash64(*bytes) * 31 + std::hash<std::string>{}(e.path().filename().string());
  }
  return h;
}

TEST(Fp8Twin, HoldsTheQuantizersBytes) {
  test_util::TempDir tmp("fp8twin");
  const std::vector<uint16_t> w = Weights(0.01f);
  WriteSource(tmp.path() / "step0", w);
  const Status s =
      WriteFp8Twin(tmp.path() / "step0", tmp.path() / "step0-fp8", DefaultFp8Serving(), 2);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto twin = apply::CheckpointDirStore::Open(tmp.path() / "step0-fp8",
                                              apply::CheckpointDirStore::Access::kReadOnly);
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  auto want =
      quant::QuantizeFp8(*quant::FindFp8Scheme("fp8_e4m3_block128"), kLinear, w, kRows, kCols);
  ASSERT_TRUE(want.ok());
  int seen = 0;
  for (size_t i = 0; i < (*twin)->tensors().size(); ++i) {
    const auto& t = (*twin)->tensors()[i];
    const ByteSpan data = (*twin)->TensorData(i);
    if (t.name == kLinear) {
      EXPECT_EQ(t.dtype, DType::kF8E4M3);
      ASSERT_EQ(data.size(), want->weight.size());
      EXPECT_EQ(std::memcmp(data.data(), want->weight.data(), data.size()), 0);
      ++seen;
    } else if (t.name == std::string(kLinear) + "_scale_inv") {
      EXPECT_EQ(t.shape, (std::vector<uint64_t>{2, 2}));
      ASSERT_EQ(data.size(), want->scale_inv.size() * 4);
      EXPECT_EQ(std::memcmp(data.data(), want->scale_inv.data(), data.size()), 0);
      ++seen;
    } else {
      EXPECT_EQ(t.name, kNorm);
      EXPECT_EQ(t.dtype, DType::kBF16);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 3);
  EXPECT_TRUE(fs::exists(tmp.path() / "step0-fp8" / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(tmp.path() / "step0-fp8" / "config.json"));
}

TEST(Fp8Twin, AStepThatCannotBeServedLeavesThePreviousTwin) {
  test_util::TempDir tmp("fp8twin");
  WriteSource(tmp.path() / "src", Weights(0.01f));
  const fs::path twin = tmp.path() / "twin";
  ASSERT_TRUE(WriteFp8Twin(tmp.path() / "src", twin, DefaultFp8Serving(), 1).ok());
  const uint64_t before = DirHash(twin);

  std::vector<uint16_t> bad = Weights(0.02f);
  bad[129 * kCols + 7] = 0x7FC0;  // NaN
  fs::remove_all(tmp.path() / "src");
  WriteSource(tmp.path() / "src", bad);
  Status s = WriteFp8Twin(tmp.path() / "src", twin, DefaultFp8Serving(), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(kLinear), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("[129, 7]"), std::string::npos) << s.ToString();
  EXPECT_EQ(DirHash(twin), before);
  EXPECT_FALSE(fs::exists(tmp.path() / "twin.partial"));

  // A description that lists the 1-D norm as FP8 is refused before anything is written.
  quant::ServingDescription d = DefaultFp8Serving();
  d.not_converted.clear();
  s = WriteFp8Twin(tmp.path() / "src", tmp.path() / "other", d, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(kNorm), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(tmp.path() / "other"));
  EXPECT_FALSE(fs::exists(tmp.path() / "other.partial"));
}

// config.json's quantization_config edited by `edit`.
void EditQuantizationConfig(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto bytes = ReadFile(dir / "config.json", 1 << 20);
  ASSERT_TRUE(bytes.ok());
  nlohmann::json config = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  edit(config["quantization_config"]);
  ASSERT_TRUE(WriteFile(dir / "config.json", AsBytes(config.dump(2))).ok());
}

TEST(CheckFp8CheckpointDir, AcceptsTwinsAndCheckpointsWithoutFp8) {
  test_util::TempDir tmp("fp8check");
  WriteSource(tmp.path() / "src", Weights(0.01f));
  ASSERT_TRUE(WriteFp8Twin(tmp.path() / "src", tmp.path() / "twin", DefaultFp8Serving(), 1).ok());
  Status s = CheckFp8CheckpointDir(tmp.path() / "twin");
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = CheckFp8CheckpointDir(tmp.path() / "src");  // BF16, no config.json
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = CheckFp8Versions(tmp.path() / "twin", tmp.path() / "twin");
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = CheckFp8Versions(tmp.path() / "src", tmp.path() / "src");
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(CheckFp8CheckpointDir, RefusesABlockSizeTheScalesDoNotUse) {
  test_util::TempDir tmp("fp8check");
  WriteSource(tmp.path() / "src", Weights(0.01f));
  const fs::path twin = tmp.path() / "twin";
  ASSERT_TRUE(WriteFp8Twin(tmp.path() / "src", twin, DefaultFp8Serving(), 1).ok());
  EditQuantizationConfig(twin, [](nlohmann::json& q) { q["weight_block_size"] = {64, 64}; });
  const Status s = CheckFp8CheckpointDir(twin);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // 130 x 200 in 64 x 64 blocks is 3 x 4 scales; the twin has 2 x 2.
  for (const char* part :
       {"model.layers.0.mlp.up_proj.weight_scale_inv", "[2, 2]", "[3, 4]", "config.json", "twin"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " not in " << s.ToString();
  }
}

TEST(CheckFp8CheckpointDir, RefusesAWeightListedAsNotConverted) {
  test_util::TempDir tmp("fp8check");
  WriteSource(tmp.path() / "src", Weights(0.01f));
  const fs::path twin = tmp.path() / "twin";
  ASSERT_TRUE(WriteFp8Twin(tmp.path() / "src", twin, DefaultFp8Serving(), 1).ok());
  EditQuantizationConfig(twin, [](nlohmann::json& q) {
    q["modules_to_not_convert"].push_back("model.layers.0.mlp.up_proj");
  });
  const Status s = CheckFp8CheckpointDir(twin);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(kLinear), std::string::npos) << s.ToString();
}

TEST(CheckFp8Versions, RefusesReceiversOfAnotherFormat) {
  test_util::TempDir tmp("fp8check");
  WriteSource(tmp.path() / "src", Weights(0.01f));
  const fs::path twin = tmp.path() / "twin", ue8m0 = tmp.path() / "ue8m0";
  ASSERT_TRUE(WriteFp8Twin(tmp.path() / "src", twin, DefaultFp8Serving(), 1).ok());
  ASSERT_TRUE(
      WriteFp8Twin(tmp.path() / "src", ue8m0, DefaultFp8Serving("fp8_e4m3_block128_ue8m0"), 1)
          .ok());
  Status s = CheckFp8Versions(ue8m0, twin);  // the nodes hold UE8M0 scales
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("scale_fmt 'ue8m0'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("scale_fmt ''"), std::string::npos) << s.ToString();
  s = CheckFp8Versions(tmp.path() / "src", twin);  // the nodes hold BF16
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no quantization_config"), std::string::npos) << s.ToString();
  // An inconsistent receiver is named before the two are compared.
  EditQuantizationConfig(ue8m0, [](nlohmann::json& q) { q["weight_block_size"] = {128, 64}; });
  s = CheckFp8Versions(ue8m0, twin);
  EXPECT_NE(s.message().find("ue8m0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("weight_scale_inv"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace deltacast::agent

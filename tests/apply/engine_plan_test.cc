// Generated engine load plans, end to end: from a checkpoint's config.json and an
// engine's parallel settings, layout::EngineLayouts writes each GPU's plan; a
// planned store over the engine's parameters (built by an independent sharder,
// tests/layout/engine_reference.h) takes a whole refit, and every GPU's parameters
// must equal the sharder's output of the target step byte for byte.
//
// Built twice like planned_store_test.cc: host memories (deltacast_apply_tests) and
// CUDA memories (deltacast_gpu_tests, label `gpu`), which skip without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "apply/planned_store.h"
#include "apply/replica.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "layout/engine.h"
#include "quant/engine_config.h"
#include "tests/layout/engine_reference.h"

namespace deltacast::apply {
namespace {

using layout::testing::EngineModel;
using layout::testing::EngineRun;
using layout::testing::EngineSharder;
using Tensors = std::vector<layout::testing::Tensor>;

constexpr uint64_t kPartitionBytes = 512;
constexpr std::string_view kMemory = DELTACAST_TEST_MEMORY;  // "host" or "cuda"

std::unique_ptr<device::PieceMemory> NewMemory(uint64_t gpu) {
  if (kMemory == "host") return device::NewHostPieceMemory("gpu" + std::to_string(gpu));
  auto memory = device::NewCudaPieceMemory(static_cast<int>(gpu % device::CudaDeviceCount()));
  EXPECT_TRUE(memory.ok()) << memory.status().ToString();
  return memory.ok() ? std::move(*memory) : nullptr;
}

ByteSpan BytesOf(const std::vector<int64_t>& v) {
  return ByteSpan(reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(int64_t));
}

std::unique_ptr<HostStore> StoreOf(const Tensors& tensors) {
  std::vector<TensorSpec> infos;
  for (const auto& t : tensors) infos.push_back({t.spec.name, t.spec.dtype, t.spec.shape});
  auto store = HostStore::Create(infos);
  EXPECT_TRUE(store.ok());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto span = (*store)->MutableTensorData(*(*store)->FindTensor(tensors[i].spec.name));
    std::memcpy(span->data(), tensors[i].values.data(), span->size());
  }
  return std::move(*store);
}

codec::Manifest Manifest(const WeightStore& s) {
  auto m = HashWeightStore(s, kPartitionBytes, 1);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : codec::Manifest{};
}

struct Case {
  std::string name;
  EngineModel model;
  EngineRun run;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases;
  EngineModel qwen2;  // 8 heads, 2 KV heads, QKV biases
  cases.push_back({"VllmQwen2Tp4ReplicatedKv", qwen2, {"vllm", 4, 1, 1}});
  EngineModel tied = qwen2;
  tied.tied = true;
  cases.push_back({"SglangQwen2Tp4TiedReplicatedKv", tied, {"sglang", 4, 1, 1}});
  EngineModel llama;
  llama.model_type = "llama";
  llama.kv_heads = 4;
  cases.push_back({"VllmLlamaTp2SplitKv", llama, {"vllm", 2, 1, 1}});
  EngineModel qwen3;
  qwen3.model_type = "qwen3";
  cases.push_back({"VllmQwen3Tp8QkNorm", qwen3, {"vllm", 8, 1, 1}});
  EngineModel moe;
  moe.model_type = "qwen2_moe";
  moe.experts = 4;
  moe.shared_ffn = 16;
  cases.push_back({"SglangQwen2MoeTp4Ep2SharedExpert", moe, {"sglang", 4, 1, 2}});
  cases.push_back({"VllmQwen2MoeTp2Dp2Ep4SharedExpert", moe, {"vllm", 2, 2, 4}});
  cases.push_back({"VllmQwen2MoeTp2Dp2ExpertsSplit", moe, {"vllm", 2, 2, 1}});
  // Block-FP8 serving weights: every linear's scale grid beside it (blocks of 2 in
  // these small models; a head of 4 rows is 2 grid rows, a replicated KV head's
  // grid rows replicated with it).
  EngineModel fp8 = qwen2;
  fp8.fp8_block = 2;
  cases.push_back({"VllmQwen2Fp8Tp4ReplicatedKv", fp8, {"vllm", 4, 1, 1}});
  EngineModel fp8_qwen3 = qwen3;
  fp8_qwen3.fp8_block = 2;
  cases.push_back({"SglangQwen3Fp8Tp2", fp8_qwen3, {"sglang", 2, 1, 1}});
  EngineModel fp8_moe = moe;
  fp8_moe.fp8_block = 2;
  cases.push_back({"VllmQwen2MoeFp8Tp2Dp2Ep4SharedExpert", fp8_moe, {"vllm", 2, 2, 4}});
  cases.push_back({"VllmQwen2MoeFp8Tp2Dp2ExpertsSplit", fp8_moe, {"vllm", 2, 2, 1}});
  cases.push_back({"SglangQwen2MoeFp8Tp4Ep2SharedExpert", fp8_moe, {"sglang", 4, 1, 2}});
  // Two heads per block (head_dim 4, blocks of 8): each GPU's q, k and v rows are
  // still whole blocks, as the engines require.
  EngineModel fp8_wide = llama;
  fp8_wide.ffn = 32;
  fp8_wide.fp8_block = 8;
  cases.push_back({"VllmLlamaFp8Tp2TwoHeadsPerBlock", fp8_wide, {"vllm", 2, 1, 1}});
  return cases;
}

class EnginePlanTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (kMemory == "cuda" && device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    const Case& c = GetParam();
    base_ = layout::testing::EngineCanonical(c.model);
    target_ = base_;
    std::mt19937_64 rng(23);
    for (auto& t : target_) {
      const bool dense = t.spec.name == "model.norm.weight";
      for (auto& v : t.values) {
        if (dense || rng() % 33 == 0) v ^= static_cast<int64_t>(rng() | 1);
      }
    }
    for (const auto& t : base_) canonical_.push_back(t.spec);
    base_store_ = StoreOf(base_);
    target_store_ = StoreOf(target_);
    base_manifest_ = Manifest(*base_store_);
    target_manifest_ = Manifest(*target_store_);
    identity_ = {base_manifest_.VersionId(), target_manifest_.VersionId(), kPartitionBytes};
    codec::DeltaEncoderOptions options;
    options.chunk_bytes = 2048;
    options.threads = 1;
    ASSERT_TRUE(codec::EncodeDelta(
                    base_manifest_, target_manifest_,
                    [&](size_t i) { return base_store_->TensorData(i); },
                    [&](size_t i) { return target_store_->TensorData(i); }, Digest128{}, options,
                    [&](std::vector<std::byte>&& chunk) {
                      chunks_.push_back(std::move(chunk));
                      return Status::Ok();
                    })
                    .ok());
    for (const auto& chunk : chunks_) views_.push_back(*codec::ParseChunk(chunk));
    summary_ = views_.back().summary;
    views_.pop_back();
  }

  // The generated plan of every GPU.
  std::vector<layout::LayoutDescription> Plans() {
    const Case& c = GetParam();
    auto config = quant::ParseEngineConfig(c.model.ConfigJson(), "config.json");
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    layout::EngineParallel p{*layout::ParseEngine(c.run.engine), c.run.tp, c.run.dp, c.run.ep};
    auto texts = layout::EngineLayouts(*config, p, "canonical.json");
    EXPECT_TRUE(texts.ok()) << texts.status().ToString();
    std::vector<layout::LayoutDescription> plans;
    for (size_t g = 0; texts.ok() && g < texts->size(); ++g) {
      auto d = layout::ParseLayout((*texts)[g], "gpu-" + std::to_string(g) + ".toml");
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      if (d.ok()) plans.push_back(std::move(*d));
    }
    return plans;
  }

  Tensors base_, target_;
  std::vector<TensorSpec> canonical_;
  std::unique_ptr<HostStore> base_store_, target_store_;
  codec::Manifest base_manifest_, target_manifest_;
  codec::DeltaIdentity identity_;
  std::vector<std::vector<std::byte>> chunks_;
  std::vector<codec::ChunkView> views_;
  codec::DeltaSummary summary_;
};

TEST_P(EnginePlanTest, ARefitLeavesEveryGpuAsTheSharderHoldsTheTarget) {
  const Case& c = GetParam();
  const std::vector<layout::LayoutDescription> plans = Plans();
  ASSERT_EQ(plans.size(), c.run.Gpus());
  EngineSharder base(c.model, c.run, base_);
  std::vector<PlannedStore::PartSpec> parts;
  std::vector<Tensors> engine;
  for (uint64_t g = 0; g < c.run.Gpus(); ++g) {
    PlannedStore::PartSpec part;
    part.memory = NewMemory(g);
    ASSERT_NE(part.memory, nullptr);
    part.layout = plans[g];
    engine.push_back(base.Gpu(g));
    for (const auto& t : engine.back()) part.locals.push_back(t.spec);
    parts.push_back(std::move(part));
  }
  auto created = PlannedStore::Create(canonical_, std::move(parts));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  PlannedStore* store = created->get();
  for (uint64_t g = 0; g < c.run.Gpus(); ++g) {
    for (size_t l = 0; l < engine[g].size(); ++l) {
      ASSERT_TRUE(store->WriteLocal(g, l, BytesOf(engine[g][l].values)).ok());
    }
  }
  // The GPUs' pieces hash to the checkpoint's manifest, replicas included.
  ASSERT_EQ(Manifest(*store).VersionId(), base_manifest_.VersionId());

  auto replica = Replica::ForStore(std::move(*created), kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok()) << replica.status().ToString();
  ApplyOptions options;
  options.threads = 2;
  auto applier = (*replica)->Begin(identity_, options);
  ASSERT_TRUE(applier.ok()) << applier.status().ToString();
  for (const auto& v : views_) ASSERT_TRUE((*applier)->ApplyChunk(v).ok());
  auto done = (*applier)->Finish(summary_);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ASSERT_TRUE((*replica)->Commit(*done).ok());
  EXPECT_EQ((*replica)->version(), target_manifest_.VersionId());

  EngineSharder want(c.model, c.run, target_);
  for (uint64_t g = 0; g < c.run.Gpus(); ++g) {
    const Tensors shard = want.Gpu(g);
    ASSERT_EQ(shard.size(), engine[g].size());
    for (size_t l = 0; l < shard.size(); ++l) {
      std::vector<int64_t> got(shard[l].values.size());
      ASSERT_TRUE(store
                      ->ReadLocal(g, l,
                                  MutableByteSpan(reinterpret_cast<std::byte*>(got.data()),
                                                  got.size() * sizeof(int64_t)))
                      .ok());
      // Padding rows of a vocabulary (kPadding in both) are never written.
      EXPECT_EQ(got, shard[l].values) << "GPU " << g << " " << shard[l].spec.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, EnginePlanTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace deltacast::apply

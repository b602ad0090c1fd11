// The trainer side of FP8 serving weights: shares that hold blocks in part make,
// after the amax exchange, exactly the bytes the whole-tensor quantizer makes, and
// the one-checkpoint source's FP8 delta has the twins' manifests.
#include "relay/producers/fp8_share.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <map>
#include <random>

#include "agent/fp8_twin.h"
#include "apply/host_store.h"
#include "codec/manifest.h"
#include "quant/fp8_quantizer.h"
#include "relay/producers/fp8_delta.h"

namespace deltacast::relay {
namespace {

constexpr char kLinear[] = "model.layers.0.mlp.up_proj.weight";
constexpr char kNorm[] = "model.layers.0.input_layernorm.weight";
constexpr char kEmbed[] = "model.embed_tokens.weight";
constexpr uint64_t kRows = 300, kCols = 260;

uint16_t Bf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

std::vector<uint16_t> RandomBf16(uint64_t n, uint32_t seed, float scale = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) v = Bf16(normal(rng));
  return out;
}

// A training step: ~3% of the elements move by one BF16 ulp or so.
std::vector<uint16_t> Step(std::vector<uint16_t> v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint64_t> pick(0, v.size() - 1);
  for (uint64_t k = 0; k < v.size() * 3 / 100; ++k) v[pick(rng)] ^= 1 + (k % 3);
  return v;
}

quant::ServingDescription Serving() { return agent::DefaultFp8Serving(); }

std::vector<TensorSpec> Canonical() {
  return {{kEmbed, DType::kBF16, {50, 64}},
          {kNorm, DType::kBF16, {kCols}},
          {kLinear, DType::kBF16, {kRows, kCols}}};
}

// The canonical FP8 image of one version, assembled from every share's image.
struct Assembled {
  std::map<std::string, std::vector<std::byte>> bytes;
  std::map<std::string, std::vector<int>> writes;  // per element, how many shares wrote it
};

void Assemble(const Fp8Share& share, bool target, Assembled& out) {
  const layout::PlacementMap& map = share.map();
  const ShareInput in = share.Input();
  for (const layout::Run& r : map.runs()) {
    const TensorSpec& t = map.canonical()[r.canonical];
    const uint64_t e = ElementSize(t.dtype);
    auto& bytes = out.bytes[t.name];
    auto& writes = out.writes[t.name];
    bytes.resize(t.ElementCount() * e);
    writes.resize(t.ElementCount());
    const ByteSpan local = target ? in.target(r.local) : in.base(r.local);
    for (uint64_t i = 0; i < r.count; ++i) {
      std::memcpy(bytes.data() + (r.dst + i * r.dst_stride) * e,
                  local.data() + (r.src + i * r.src_stride) * e, r.len * e);
      for (uint64_t j = 0; j < r.len; ++j) ++writes[r.dst + i * r.dst_stride + j];
    }
  }
}

TEST(Fp8ShareTest, SplitBlocksAfterTheExchangeMatchTheWholeTensorQuantizer) {
  const std::vector<TensorSpec> canonical = Canonical();
  std::map<std::string, std::vector<uint16_t>> base, target;
  base[kEmbed] = RandomBf16(50 * 64, 1);
  base[kNorm] = RandomBf16(kCols, 2);
  base[kLinear] = RandomBf16(kRows * kCols, 3);
  // An outlier that only one share holds: the block's other pieces must use it.
  base[kLinear][150 * kCols + 140] = Bf16(3.0f);
  for (const auto& [name, v] : base) target[name] = Step(v, 7);
  target[kLinear][20 * kCols + 30] = Bf16(-5.0f);

  // Three shares cut the linear weight at flat offsets inside blocks (a row cut in
  // the middle of a block column, like FSDP's flat chunks), the rest whole.
  const uint64_t cut1 = 150 * kCols + 77, cut2 = 151 * kCols + 200;
  const std::vector<std::vector<layout::ElementRange>> ranges = {
      {{kLinear, 0, cut1}, {kEmbed, 0, 50 * 64}},
      {{kLinear, cut1, cut2}, {kNorm, 0, kCols}},
      {{kLinear, cut2, kRows * kCols}}};
  auto plan = quant::PlanServing(Serving(), canonical);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<layout::PlacementMap> maps;
  for (size_t s = 0; s < ranges.size(); ++s) {
    auto map = layout::MapRanges(canonical, ranges[s], "share " + std::to_string(s));
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    maps.push_back(std::move(*map));
  }
  std::vector<std::unique_ptr<Fp8Share>> shares;
  std::vector<std::vector<SplitBlockAmax>> split;
  for (size_t s = 0; s < maps.size(); ++s) {
    ShareInput in;
    in.map = &maps[s];
    const auto bytes_of = [&maps, s](const std::map<std::string, std::vector<uint16_t>>& v,
                                     uint32_t local) -> ByteSpan {
      const layout::Run& r = maps[s].RunsOf(local)[0];
      const auto& all = v.at(maps[s].canonical()[r.canonical].name);
      return std::as_bytes(std::span(all)).subspan(r.dst * 2, r.len * 2);
    };
    in.base = [&, bytes_of](uint32_t local) { return bytes_of(base, local); };
    in.target = [&, bytes_of](uint32_t local) { return bytes_of(target, local); };
    auto share = Fp8Share::Plan(in, *plan);
    ASSERT_TRUE(share.ok()) << share.status().ToString();
    ASSERT_TRUE((*share)->ComputeAmaxes(2).ok());
    split.push_back((*share)->SplitBlocks());
    shares.push_back(std::move(*share));
  }
  EXPECT_EQ(shares[0]->Quantize(1).code(), StatusCode::kFailedPrecondition)
      << "a split block quantized without the exchange";
  const std::vector<SplitBlockAmax> reduced = ReduceSplitAmaxes(split);
  ASSERT_FALSE(reduced.empty());
  bool raised = false;  // the exchange changed some share's amax
  for (size_t s = 0; s < shares.size(); ++s) {
    std::vector<SplitBlockAmax> mine;
    for (const SplitBlockAmax& a : split[s]) {
      for (const SplitBlockAmax& r : reduced) {
        if (r.tensor != a.tensor || r.block != a.block) continue;
        mine.push_back(r);
        raised = raised || r.base > a.base || r.target > a.target;
      }
    }
    ASSERT_TRUE(shares[s]->SetSplitAmaxes(mine).ok());
    ASSERT_TRUE(shares[s]->Quantize(2).ok());
  }
  EXPECT_TRUE(raised);

  for (const bool at_target : {false, true}) {
    Assembled got;
    for (const auto& share : shares) Assemble(*share, at_target, got);
    const auto& bf16 = at_target ? target : base;
    auto want = quant::QuantizeFp8(*quant::FindFp8Scheme("fp8_e4m3_block128"), kLinear,
                                   bf16.at(kLinear), kRows, kCols);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(0, std::memcmp(got.bytes[kLinear].data(), want->weight.data(), kRows * kCols))
        << "FP8 bytes differ, target " << at_target;
    const std::string scale = std::string(kLinear) + "_scale_inv";
    ASSERT_EQ(got.bytes[scale].size(), want->scale_inv.size() * 4);
    EXPECT_EQ(0, std::memcmp(got.bytes[scale].data(), want->scale_inv.data(),
                             want->scale_inv.size() * 4));
    for (const auto& [name, writes] : got.writes) {
      for (size_t i = 0; i < writes.size(); ++i) {
        ASSERT_EQ(writes[i], 1) << name << " element " << i << " written " << writes[i] << " times";
      }
    }
    EXPECT_EQ(0, std::memcmp(got.bytes[kNorm].data(), bf16.at(kNorm).data(), kCols * 2));
  }

  // The next step: share 0 starts from its image (what the receivers hold), the
  // others lost theirs (restarted) and quantize the base again with the exchanged
  // amaxes, to which share 0 still contributes its base pieces.
  std::map<std::string, std::vector<uint16_t>> next;
  for (const auto& [name, v] : target) next[name] = Step(v, 8);
  next[kLinear][150 * kCols + 200] = Bf16(7.0f);
  std::vector<std::unique_ptr<Fp8Share>> again;
  split.clear();
  for (size_t s = 0; s < maps.size(); ++s) {
    ShareInput in;
    in.map = &maps[s];
    const auto bytes_of = [&maps, s](const std::map<std::string, std::vector<uint16_t>>& v,
                                     uint32_t local) -> ByteSpan {
      const layout::Run& r = maps[s].RunsOf(local)[0];
      const auto& all = v.at(maps[s].canonical()[r.canonical].name);
      return std::as_bytes(std::span(all)).subspan(r.dst * 2, r.len * 2);
    };
    in.base = [&, bytes_of](uint32_t local) { return bytes_of(target, local); };
    in.target = [&, bytes_of](uint32_t local) { return bytes_of(next, local); };
    auto share = Fp8Share::Plan(in, *plan);
    ASSERT_TRUE(share.ok());
    if (s == 0) {
      ASSERT_TRUE((*share)->TakeBaseFrom(*shares[0]).ok());
    }
    ASSERT_TRUE((*share)->ComputeAmaxes(1).ok());
    split.push_back((*share)->SplitBlocks());
    again.push_back(std::move(*share));
  }
  EXPECT_TRUE(again[0]->stats().base_kept);
  const std::vector<SplitBlockAmax> reduced2 = ReduceSplitAmaxes(split);
  for (size_t s = 0; s < again.size(); ++s) {
    std::vector<SplitBlockAmax> mine;
    for (const SplitBlockAmax& a : split[s]) {
      for (const SplitBlockAmax& r : reduced2) {
        if (r.tensor == a.tensor && r.block == a.block) mine.push_back(r);
      }
    }
    ASSERT_TRUE(again[s]->SetSplitAmaxes(mine).ok());
    ASSERT_TRUE(again[s]->Quantize(1).ok());
  }
  for (const bool at_target : {false, true}) {
    Assembled got;
    for (const auto& share : again) Assemble(*share, at_target, got);
    auto want = quant::QuantizeFp8(*quant::FindFp8Scheme("fp8_e4m3_block128"), kLinear,
                                   (at_target ? next : target).at(kLinear), kRows, kCols);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(0, std::memcmp(got.bytes[kLinear].data(), want->weight.data(), kRows * kCols))
        << "after reuse, FP8 bytes differ, target " << at_target;
    const std::string scale = std::string(kLinear) + "_scale_inv";
    EXPECT_EQ(0, std::memcmp(got.bytes[scale].data(), want->scale_inv.data(),
                             want->scale_inv.size() * 4));
  }
}

// Two BF16 versions as stores; the twins of each, as synth --fp8 makes them.
struct Versions {
  std::unique_ptr<apply::HostStore> base, target;
};

Versions MakeVersions(bool nan_in_target = false) {
  std::vector<TensorSpec> infos;
  for (const auto& t : Canonical()) infos.push_back({t.name, t.dtype, t.shape});
  Versions v;
  v.base = std::move(*apply::HostStore::Create(infos));
  v.target = std::move(*apply::HostStore::Create(infos));
  for (size_t i = 0; i < infos.size(); ++i) {
    const uint64_t n =
        infos[i].shape.size() == 1 ? infos[i].shape[0] : infos[i].shape[0] * infos[i].shape[1];
    const std::vector<uint16_t> b = RandomBf16(n, 10 + i);
    std::vector<uint16_t> t = Step(b, 20 + i);
    if (nan_in_target && infos[i].name == kLinear) t[5 * kCols + 7] = 0x7FC0;
    std::memcpy(v.base->MutableTensorData(i)->data(), b.data(), n * 2);
    std::memcpy(v.target->MutableTensorData(i)->data(), t.data(), n * 2);
  }
  return v;
}

codec::Manifest TwinManifest(const apply::WeightStore& bf16) {
  auto plan = agent::PlanFp8Twin(Serving(), bf16.tensors());
  auto twin = agent::QuantizeStore(bf16, *plan, 1);
  const apply::HostStore& t = **twin;
  return codec::ComputeManifest(
      t.tensors(), [&](size_t i) { return t.TensorData(i); }, codec::kDefaultPartitionBytes, 1);
}

TEST(Fp8DeltaTest, ManifestsAreTheTwinsWhateverTheGroups) {
  const Versions v = MakeVersions();
  const Digest128 base = TwinManifest(*v.base).VersionId();
  const Digest128 target = TwinManifest(*v.target).VersionId();
  ASSERT_NE(base, target);
  for (const uint64_t group_bytes : {uint64_t{1}, uint64_t{1} << 30}) {
    ShareEncodeOptions options;
    options.threads = 2;
    auto delta = EncodeFp8Delta(*v.base, *v.target, Serving(), options, group_bytes);
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    EXPECT_EQ(delta->base.VersionId(), base) << "group bytes " << group_bytes;
    EXPECT_EQ(delta->target.VersionId(), target) << "group bytes " << group_bytes;
    EXPECT_EQ(delta->stats.groups, group_bytes == 1 ? 3u : 1u);
    EXPECT_FALSE(delta->chunks.empty());
    EXPECT_EQ(delta->stats.quantized_bf16_bytes, kRows * kCols * 2);
  }
}

TEST(Fp8DeltaTest, ANonFiniteElementIsRefusedNamingIt) {
  const Versions v = MakeVersions(/*nan_in_target=*/true);
  auto delta = EncodeFp8Delta(*v.base, *v.target, Serving(), ShareEncodeOptions{});
  ASSERT_FALSE(delta.ok());
  const std::string message = delta.status().ToString();
  EXPECT_NE(message.find(std::string("'") + kLinear + "' element [5, 7] of the new version is NaN"),
            std::string::npos)
      << message;
}

TEST(Fp8DeltaTest, ADescriptionThatDoesNotFitIsRefusedNamingTheTensor) {
  const Versions v = MakeVersions();
  quant::ServingDescription serving = Serving();
  serving.not_converted.clear();  // the norm (1-D) would be quantized
  auto delta = EncodeFp8Delta(*v.base, *v.target, serving, ShareEncodeOptions{});
  ASSERT_FALSE(delta.ok());
  EXPECT_NE(delta.status().ToString().find(kNorm), std::string::npos) << delta.status().ToString();
}

}  // namespace
}  // namespace deltacast::relay

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

namespace banded {

// A share holding a rectangle of the linear weight as a packed local tensor, as a
// TP rank holds a column-parallel slice: one run of `rows` rows at canonical-row
// strides.
struct Rect {
  uint64_t row0, rows, col0, cols;
};

struct RectShares {
  std::vector<layout::PlacementMap> maps;
  // Per share, the local bytes of each version (kept alive for the ShareInputs).
  std::vector<std::vector<uint16_t>> base, target;
};

std::vector<uint16_t> Cut(const std::vector<uint16_t>& whole, const Rect& r) {
  std::vector<uint16_t> out;
  for (uint64_t i = 0; i < r.rows; ++i) {
    const auto row = whole.begin() + static_cast<long>((r.row0 + i) * kCols + r.col0);
    out.insert(out.end(), row, row + static_cast<long>(r.cols));
  }
  return out;
}

RectShares MakeShares(const std::vector<Rect>& rects) {
  RectShares out;
  const std::vector<TensorSpec> canonical = {{kLinear, DType::kBF16, {kRows, kCols}}};
  for (size_t s = 0; s < rects.size(); ++s) {
    const Rect& r = rects[s];
    layout::Run run;
    run.src_stride = r.cols;
    run.dst = r.row0 * kCols + r.col0;
    run.dst_stride = kCols;
    run.count = r.rows;
    run.len = r.cols;
    auto map = layout::MapRuns(
        "rect " + std::to_string(s), canonical,
        {{{"slice", DType::kBF16, {r.rows, r.cols}}, layout::Role::kProjected, 0}}, {run});
    EXPECT_TRUE(map.ok()) << map.status().ToString();
    out.maps.push_back(std::move(*map));
  }
  return out;
}

// Plans, takes amaxes, exchanges and quantizes every share (share 0 from `previous`
// when given); the first error of any step.
Status RunShares(RectShares& rs, const std::vector<Rect>& rects, const std::vector<uint16_t>& base,
                 const std::vector<uint16_t>& target, std::vector<std::unique_ptr<Fp8Share>>& out,
                 Fp8Share* previous = nullptr) {
  auto plan = quant::PlanServing(
      quant::ServingDescription{.source = "test",
                                .scheme = quant::FindFp8Scheme("fp8_e4m3_block128"),
                                .quantize = {"*"},
                                .not_converted = {}},
      rs.maps[0].canonical());
  RETURN_IF_ERROR(plan.status());
  rs.base.clear();
  rs.target.clear();
  for (const Rect& r : rects) {
    rs.base.push_back(Cut(base, r));
    rs.target.push_back(Cut(target, r));
  }
  out.clear();
  std::vector<std::vector<SplitBlockAmax>> split;
  for (size_t s = 0; s < rects.size(); ++s) {
    ShareInput in;
    in.map = &rs.maps[s];
    in.base = [&rs, s](uint32_t) { return ByteSpan(std::as_bytes(std::span(rs.base[s]))); };
    in.target = [&rs, s](uint32_t) { return ByteSpan(std::as_bytes(std::span(rs.target[s]))); };
    ASSIGN_OR_RETURN(auto share, Fp8Share::Plan(in, *plan));
    if (s == 0 && previous != nullptr) RETURN_IF_ERROR(share->TakeBaseFrom(*previous));
    RETURN_IF_ERROR(share->ComputeAmaxes(1));
    split.push_back(share->SplitBlocks());
    out.push_back(std::move(share));
  }
  const std::vector<SplitBlockAmax> reduced = ReduceSplitAmaxes(split);
  for (size_t s = 0; s < out.size(); ++s) {
    std::vector<SplitBlockAmax> mine;
    for (const SplitBlockAmax& a : split[s]) {
      for (const SplitBlockAmax& r : reduced) {
        if (r.tensor == a.tensor && r.block == a.block) mine.push_back(r);
      }
    }
    RETURN_IF_ERROR(out[s]->SetSplitAmaxes(mine));
    RETURN_IF_ERROR(out[s]->Quantize(1));
  }
  return Status::Ok();
}

void ExpectWholeTensorBytes(const std::vector<std::unique_ptr<Fp8Share>>& shares, bool at_target,
                            const std::vector<uint16_t>& bf16, const std::string& label) {
  Assembled got;
  for (const auto& share : shares) Assemble(*share, at_target, got);
  auto want =
      quant::QuantizeFp8(*quant::FindFp8Scheme("fp8_e4m3_block128"), kLinear, bf16, kRows, kCols);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(0, std::memcmp(got.bytes[kLinear].data(), want->weight.data(), kRows * kCols))
      << label << ": FP8 bytes differ";
  const std::string scale = std::string(kLinear) + "_scale_inv";
  ASSERT_EQ(got.bytes[scale].size(), want->scale_inv.size() * 4) << label;
  EXPECT_EQ(
      0, std::memcmp(got.bytes[scale].data(), want->scale_inv.data(), want->scale_inv.size() * 4))
      << label << ": scales differ";
  for (const auto& [name, writes] : got.writes) {
    for (size_t i = 0; i < writes.size(); ++i) {
      ASSERT_EQ(writes[i], 1) << label << ": " << name << " element " << i;
    }
  }
}

// Column cuts inside blocks (a TP rank's slice) and a row cut inside a block row:
// whole blocks (edge blocks cut short among them) and split ones (exchanged) make
// the whole-tensor quantizer's
// bytes and scales, on a first refit, a steady one from the committed image, with
// zero blocks (signed zeros) and outliers in whole blocks.
TEST(Fp8ShareTest, ColumnSlicesMatchTheWholeTensorQuantizer) {
  // Blocks are 128 x 128 over [300, 260]: block rows 0-127, 128-255, 256-299 (edge),
  // block columns 0-127, 128-255, 256-259 (edge).
  const std::vector<Rect> rects = {
      {0, kRows, 0, 140},     // block column 0 whole, 128-139 of column 1
      {0, 200, 140, 120},     // column 2's block row 0 whole, the rest split
      {200, 100, 140, 120}};  // the edge block (2, 2) whole
  RectShares rs = MakeShares(rects);
  std::vector<uint16_t> base = RandomBf16(kRows * kCols, 21), target;
  for (uint64_t r = 0; r < 128; ++r) {
    for (uint64_t c = 0; c < 128; ++c) base[r * kCols + c] = (r + c) % 7 ? 0x0000 : 0x8000;
  }
  base[140 * kCols + 5] = Bf16(2.5f);     // an outlier in a whole block of share 0
  base[270 * kCols + 258] = Bf16(-4.0f);  // in the whole edge block of share 2
  target = Step(base, 22);
  for (uint64_t r = 256; r < kRows; ++r) {
    for (uint64_t c = 256; c < kCols; ++c) target[r * kCols + c] = 0;  // a zero edge block
  }
  target[130 * kCols + 200] = Bf16(6.0f);  // a split block's outlier (share 1)

  std::vector<std::unique_ptr<Fp8Share>> first;
  Status s = RunShares(rs, rects, base, target, first);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(first[0]->stats().split_blocks, 0u);
  ExpectWholeTensorBytes(first, false, base, "first refit, previous version");
  ExpectWholeTensorBytes(first, true, target, "first refit, new version");

  const std::vector<uint16_t> next = Step(target, 23);
  std::vector<std::unique_ptr<Fp8Share>> steady;
  s = RunShares(rs, rects, target, next, steady, first[0].get());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(steady[0]->stats().base_kept);
  ExpectWholeTensorBytes(steady, false, target, "steady refit, previous version");
  ExpectWholeTensorBytes(steady, true, next, "steady refit, new version");
}

// A NaN or Inf is refused naming the element and the version, in a whole block as
// in a split one, whole edge blocks included.
TEST(Fp8ShareTest, NonFiniteInWholeAndSplitBlocksIsRefusedNamingTheElement) {
  const std::vector<Rect> rects = {{0, kRows, 0, 140}, {0, kRows, 140, 120}};
  RectShares rs = MakeShares(rects);
  const std::vector<uint16_t> base = RandomBf16(kRows * kCols, 31);
  struct Case {
    uint64_t row, col;
    uint16_t bits;
    bool in_base;
    const char* what;
  };
  for (const Case& c : {Case{5, 7, 0x7FC0, false, "NaN"},         // whole block (0, 0)
                        Case{260, 258, 0xFF80, true, "-Inf"},     // whole edge block (2, 2)
                        Case{100, 130, 0x7F80, false, "Inf"}}) {  // split block (0, 1)
    std::vector<uint16_t> v0 = base, v1 = Step(base, 32);
    (c.in_base ? v0 : v1)[c.row * kCols + c.col] = c.bits;
    std::vector<std::unique_ptr<Fp8Share>> shares;
    const Status s = RunShares(rs, rects, v0, v1, shares);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.what;
    const std::string want = "element [" + std::to_string(c.row) + ", " + std::to_string(c.col) +
                             "] of the " + (c.in_base ? "previous" : "new") + " version is " +
                             c.what;
    EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString() << "\nwant: " << want;
  }
}

}  // namespace banded
}  // namespace
}  // namespace deltacast::relay

// A planned store: canonical tensors held by two GPU memories in a Megatron-style
// TP = 2 layout (fused QKV, fused gate/up, vocabulary-parallel embedding, row-split
// projections, replicated norms). The shards and the expected bytes come from
// tests/layout/reference.h, an element-loop reference independent of layout/.
//
// Built twice: with host memories (deltacast_apply_tests) and with CUDA memories
// (deltacast_gpu_tests, label `gpu`: two memories on one device when it has one
// GPU), which skip when no device is usable. DELTACAST_TEST_MEMORY says which.
#include "apply/planned_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "codec/change_detect.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "codec/partition_codec.h"
#include "common/hash.h"
#include "tests/layout/reference.h"

namespace deltacast::apply {
namespace {

using layout::testing::Job;
using layout::testing::Rank;
using layout::testing::Reference;
using Tensors = std::vector<layout::testing::Tensor>;

constexpr uint64_t kPartitionBytes = 512;  // 64 I64 elements: partitions cross split boundaries
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

class PlannedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kMemory == "cuda" && device::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device here";
    }
    job_.tp = 2;
    job_.layers = 2;
    base_ = layout::testing::CanonicalTensors(job_);
    target_ = base_;
    std::mt19937_64 rng(7);
    for (auto& t : target_) {
      // ~3 % of elements change their bits; one norm changes everywhere (a dense record).
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
                    [&](std::vector<std::byte>&& c) {
                      chunks_.push_back(std::move(c));
                      return Status::Ok();
                    })
                    .ok());
    for (const auto& c : chunks_) views_.push_back(*codec::ParseChunk(c));
    summary_ = views_.back().summary;
    views_.pop_back();
    ASSERT_GE(views_.size(), 3u);
  }

  static codec::Manifest Manifest(const WeightStore& s) {
    auto m = HashWeightStore(s, kPartitionBytes, 1);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : codec::Manifest{};
  }

  // A planned store over two host memories, loaded with `canonical`'s shards.
  std::unique_ptr<PlannedStore> MakeStore(const Tensors& canonical) {
    Reference ref(job_, canonical);
    std::vector<PlannedStore::PartSpec> parts;
    for (uint64_t tp = 0; tp < job_.tp; ++tp) {
      PlannedStore::PartSpec part;
      part.memory = NewMemory(tp);
      auto d = layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml");
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      part.layout = *d;
      for (const auto& t : ref.Shard(Rank{tp, 0, 0, 0})) part.locals.push_back(t.spec);
      parts.push_back(std::move(part));
    }
    auto store = PlannedStore::Create(canonical_, std::move(parts));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    Load(**store, canonical);
    return std::move(*store);
  }

  // Writes `canonical`'s shards (padding included) into each part's parameters.
  void Load(PlannedStore& store, const Tensors& canonical) {
    Reference ref(job_, canonical);
    for (uint64_t tp = 0; tp < job_.tp; ++tp) {
      const auto shard = ref.Shard(Rank{tp, 0, 0, 0});
      for (size_t l = 0; l < shard.size(); ++l) {
        ASSERT_TRUE(store.WriteLocal(tp, l, BytesOf(shard[l].values)).ok());
      }
    }
  }

  // Flips a bit of element `element` of parameter `local` on `part`, behind the
  // store's back.
  static void FlipElement(PlannedStore& store, size_t part, size_t local, uint64_t element) {
    const TensorSpec& spec = store.plan(part).locals()[local].spec;
    std::vector<int64_t> values(spec.ElementCount());
    const MutableByteSpan bytes(reinterpret_cast<std::byte*>(values.data()),
                                values.size() * sizeof(int64_t));
    ASSERT_TRUE(store.ReadLocal(part, local, bytes).ok());
    values[element] ^= 0x40;
    ASSERT_TRUE(store.WriteLocal(part, local, bytes).ok());
  }

  // Every parameter of every part equals the reference shard of `canonical`.
  void ExpectShards(PlannedStore& store, const Tensors& canonical) {
    Reference ref(job_, canonical);
    for (uint64_t tp = 0; tp < job_.tp; ++tp) {
      const auto shard = ref.Shard(Rank{tp, 0, 0, 0});
      for (size_t l = 0; l < shard.size(); ++l) {
        std::vector<std::byte> got(shard[l].values.size() * sizeof(int64_t));
        ASSERT_TRUE(store.ReadLocal(tp, l, got).ok());
        EXPECT_EQ(Hash128(got), Hash128(BytesOf(shard[l].values)))
            << "tp " << tp << " " << shard[l].spec.name;
      }
    }
  }

  Job job_;
  Tensors base_, target_;
  std::vector<TensorSpec> canonical_;
  std::unique_ptr<HostStore> base_store_, target_store_;
  codec::Manifest base_manifest_, target_manifest_;
  codec::DeltaIdentity identity_;
  std::vector<std::vector<std::byte>> chunks_;
  std::vector<codec::ChunkView> views_;
  codec::DeltaSummary summary_;
};

TEST_F(PlannedStoreTest, PiecesOnTwoGpusHashToTheCanonicalManifest) {
  auto store = MakeStore(base_);
  EXPECT_EQ(Manifest(*store).VersionId(), base_manifest_.VersionId());
  auto target = MakeStore(target_);
  EXPECT_EQ(Manifest(*target).VersionId(), target_manifest_.VersionId());
}

TEST_F(PlannedStoreTest, AppliesADeltaInPlaceOnEveryGpu) {
  auto planned = MakeStore(base_);
  PlannedStore* store = planned.get();
  const std::byte* qkv_address = store->local_address(1, 1);
  auto replica = Replica::ForStore(std::move(planned), kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  ASSERT_EQ((*replica)->version(), base_manifest_.VersionId());
  ApplyOptions options;
  options.threads = 2;
  options.store_at_manifest = true;
  auto applier = (*replica)->Begin(identity_, options);
  ASSERT_TRUE(applier.ok()) << applier.status().ToString();
  for (const auto& v : views_) ASSERT_TRUE((*applier)->ApplyChunk(v).ok());
  auto done = (*applier)->Finish(summary_);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ASSERT_TRUE((*replica)->Commit(*done).ok());
  EXPECT_EQ((*replica)->version(), target_manifest_.VersionId());
  ExpectShards(*store, target_);
  EXPECT_EQ(store->local_address(1, 1), qkv_address);  // written in place
  // Applying again is a no-op (every partition at target).
  EXPECT_EQ(Manifest(*store).VersionId(), target_manifest_.VersionId());
}

TEST_F(PlannedStoreTest, RollsBackEveryGpuToTheBase) {
  auto planned = MakeStore(base_);
  PlannedStore* store = planned.get();
  auto replica = Replica::ForStore(std::move(planned), kPartitionBytes, 1);
  ASSERT_TRUE(replica.ok());
  ApplyOptions options;
  options.keep_undo = true;
  auto applier = (*replica)->Begin(identity_, options);
  ASSERT_TRUE(applier.ok());
  for (const auto& v : views_) ASSERT_TRUE((*applier)->ApplyChunk(v).ok());
  ASSERT_TRUE((*applier)->Rollback().ok());
  ExpectShards(*store, base_);
  EXPECT_EQ(Manifest(*store).VersionId(), base_manifest_.VersionId());
}

TEST_F(PlannedStoreTest, RevertsFromTheRecordsWithoutUndo) {
  auto store = MakeStore(base_);
  DeltaApplier applier(*store, base_manifest_, identity_, {});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  std::vector<DeltaApplier::NeedsBase> needs_base;
  for (const auto& v : views_) ASSERT_TRUE(applier.RevertChunk(v, needs_base).ok());
  // Records that need their base to decode (overwrite, literal) cannot revert alone.
  for (const auto& n : needs_base) {
    const size_t t = *base_store_->FindTensor(n.key.tensor);
    const uint64_t e = ElementSize(base_store_->tensors()[t].dtype);
    auto bytes = ReadStoreBytes(*base_store_, t, n.key.element_offset * e, n.byte_length);
    ASSERT_TRUE(applier.WriteVerified(n.key, *bytes, n.base_hash).ok());
  }
  ExpectShards(*store, base_);
}

TEST_F(PlannedStoreTest, ATornPieceOnOneGpuIsFoundAndRepaired) {
  auto store = MakeStore(base_);
  // Behind the store's back, one element of a partition the delta changes (K of
  // layer 1, in a GPU's fused QKV) flips (a crash mid-write on one GPU):
  // that canonical partition is at neither version.
  const std::string k_proj = "model.layers.1.self_attn.k_proj.weight";
  const auto canonical = static_cast<uint32_t>(*store->FindTensor(k_proj));
  std::optional<uint64_t> changed;
  for (const auto& v : views_) {
    for (const auto& r : v.records) {
      if (r.tensor_name == k_proj && !changed) changed = r.element_offset;
    }
  }
  ASSERT_TRUE(changed.has_value());
  size_t gpu = 0;
  auto pieces = store->plan(gpu).ShardPieces(canonical, *changed, *changed + 64);
  if (pieces.empty()) pieces = store->plan(++gpu).ShardPieces(canonical, *changed, *changed + 64);
  ASSERT_FALSE(pieces.empty());
  EXPECT_EQ(store->plan(gpu).locals()[pieces[0].local].spec.name,
            "decoder.layers.1.self_attention.linear_qkv.weight");
  FlipElement(*store, gpu, pieces[0].local, pieces[0].src);
  DeltaApplier applier(*store, base_manifest_, identity_, {});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  ASSERT_EQ(applier.torn().size(), 1u);
  EXPECT_FALSE(applier.Finish(summary_).ok());
  const PartitionKey key = applier.torn()[0];
  ASSERT_TRUE(applier.RepairFrom(*target_store_, key).ok());
  auto done = applier.Finish(summary_);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ExpectShards(*store, target_);
}

TEST_F(PlannedStoreTest, AReplicaThatDisagreesReadsAsTorn) {
  auto store = MakeStore(base_);
  // input_layernorm is replicated on both GPUs; change GPU 0's copy only.
  const auto& locals = store->plan(0).locals();
  size_t norm = 0;
  while (locals[norm].spec.name != "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight")
    ++norm;
  const size_t t = *store->FindTensor("model.layers.0.input_layernorm.weight");
  const PartitionHash before = *store->HashPartition(t, 0, store->tensors()[t].ByteSize());
  FlipElement(*store, 0, norm, 0);
  const PartitionHash after = *store->HashPartition(t, 0, store->tensors()[t].ByteSize());
  EXPECT_NE(after, before);
  EXPECT_NE(after, before ^ HashPiece(ByteSpan(reinterpret_cast<const std::byte*>("\x01"), 1), 0));
}

TEST_F(PlannedStoreTest, PositionsOutOfOrderAreRefusedWithNothingWritten) {
  auto store = MakeStore(base_);
  const size_t t = *store->FindTensor("model.layers.0.self_attn.q_proj.weight");
  codec::DecodedRecord bad;
  bad.changes.element_size = 8;
  bad.changes.positions = {9, 3};
  bad.changes.xors.assign(16, std::byte{0xff});
  const PartitionAccess::Patch patch{t, 0, kPartitionBytes, &bad};
  PartitionHash after;
  const Status s = store->ApplyPatches({&patch, 1}, {&after, 1});
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  ExpectShards(*store, base_);
}

TEST_F(PlannedStoreTest, RegisteredBuffersArePatchedWhereTheyAre) {
  if (kMemory != "host") GTEST_SKIP() << "the engine's buffers here are host vectors";
  Reference ref(job_, base_);
  std::vector<PlannedStore::PartSpec> parts;
  std::vector<std::vector<int64_t>> engine;  // the engine's own parameter buffers
  std::vector<size_t> first_of_part;
  for (uint64_t tp = 0; tp < job_.tp; ++tp) {
    PlannedStore::PartSpec part;
    part.memory = device::NewHostPieceMemory();
    part.layout = *layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml");
    first_of_part.push_back(engine.size());
    for (auto& t : ref.Shard(Rank{tp, 0, 0, 0})) {
      part.locals.push_back(t.spec);
      engine.push_back(std::move(t.values));
    }
    parts.push_back(std::move(part));
  }
  for (uint64_t tp = 0; tp < job_.tp; ++tp) {
    for (size_t l = 0; l < parts[tp].locals.size(); ++l) {
      parts[tp].addresses.push_back(
          reinterpret_cast<std::byte*>(engine[first_of_part[tp] + l].data()));
    }
  }
  auto store = PlannedStore::Create(canonical_, std::move(parts));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  DeltaApplier applier(**store, base_manifest_, identity_, {});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  ASSERT_TRUE(applier.Finish(summary_).ok());
  Reference want(job_, target_);
  for (uint64_t tp = 0; tp < job_.tp; ++tp) {
    const auto shard = want.Shard(Rank{tp, 0, 0, 0});
    for (size_t l = 0; l < shard.size(); ++l)
      EXPECT_EQ(engine[first_of_part[tp] + l], shard[l].values) << shard[l].spec.name;
  }
}

TEST_F(PlannedStoreTest, APlanThatMissesAParameterIsRefused) {
  Reference ref(job_, base_);
  std::vector<PlannedStore::PartSpec> parts;
  for (uint64_t tp = 0; tp < job_.tp; ++tp) {
    PlannedStore::PartSpec part;
    part.memory = NewMemory(tp);
    part.layout = *layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml");
    for (const auto& t : ref.Shard(Rank{tp, 0, 0, 0})) part.locals.push_back(t.spec);
    if (tp == 1) part.locals.push_back({"engine.extra.bias", DType::kI64, {4}});
    parts.push_back(std::move(part));
  }
  auto store = PlannedStore::Create(canonical_, std::move(parts));
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("engine.extra.bias"), std::string::npos)
      << store.status().ToString();
}

// The memory itself checks positions before it writes (on a GPU, in a kernel).
TEST_F(PlannedStoreTest, MemoryRefusesPositionsOutOfOrderWithNothingWritten) {
  auto memory = NewMemory(0);
  ASSERT_NE(memory, nullptr);
  std::vector<std::byte> bytes(256, std::byte{0x11});
  auto buffer = memory->Allocate(bytes.size());
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(memory->Write(*buffer, bytes).ok());
  device::PatchBatch batch;
  device::PatchSegment s;
  s.run = {reinterpret_cast<unsigned char*>(*buffer), 0, 0, 64, 1, 0, 0};
  s.element_size = 4;
  s.count = 3;
  batch.positions = {1, 7, 7};  // repeated
  batch.words.assign(12, std::byte{0xff});
  batch.segments.push_back(s);
  Status refused = memory->Patch(batch);  // a GPU reports it at Sync
  if (refused.ok()) refused = memory->Sync();
  EXPECT_EQ(refused.code(), StatusCode::kCorrupt);
  std::vector<std::byte> after(bytes.size());
  ASSERT_TRUE(memory->Read(*buffer, after).ok());
  EXPECT_EQ(after, bytes);
  batch.positions = {1, 7, 9};
  ASSERT_TRUE(memory->Patch(batch).ok());
  ASSERT_TRUE(memory->Sync().ok());
  ASSERT_TRUE(memory->Read(*buffer, after).ok());
  EXPECT_EQ(after[7 * 4], std::byte{0xee});
  EXPECT_EQ(after[8 * 4], std::byte{0x11});
}

// The memory finds a shard's changed elements where they lie (on a GPU by a CUB
// selection): the same positions and XOR words as the host's change detection.
TEST_F(PlannedStoreTest, MemoryFindsTheHostsChanges) {
  auto memory = NewMemory(0);
  ASSERT_NE(memory, nullptr);
  std::mt19937_64 rng(13);
  for (uint32_t e : {1u, 2u, 4u, 8u}) {
    const uint64_t count = 50'000 + rng() % 1000;
    std::vector<std::byte> a(count * e), b;
    for (auto& x : a) x = std::byte(static_cast<uint8_t>(rng()));
    b = a;
    for (uint64_t i = 0; i < count; ++i) {
      if (rng() % 31 == 0) b[i * e + rng() % e] ^= std::byte{0x10};
    }
    auto base = memory->Allocate(a.size());
    auto target = memory->Allocate(b.size());
    ASSERT_TRUE(base.ok() && target.ok());
    ASSERT_TRUE(memory->Write(*base, a).ok());
    ASSERT_TRUE(memory->Write(*target, b).ok());
    device::ChangeList got;
    ASSERT_TRUE(memory->FindChanges(*base, *target, count, e, got).ok());
    codec::SparseChanges want;
    codec::FindChanges(a, b, e, want);
    ASSERT_EQ(got.positions.size(), want.positions.size()) << "element size " << e;
    for (size_t i = 0; i < want.positions.size(); ++i)
      ASSERT_EQ(got.positions[i], want.positions[i]);
    EXPECT_EQ(got.xors, want.xors);
  }
}

// The memory's hash of runs where they lie gives the host's bits: random bytes, every
// element size, odd offsets and tail lengths.
TEST_F(PlannedStoreTest, MemoryHashesGiveTheHostsBits) {
  auto memory = NewMemory(0);
  ASSERT_NE(memory, nullptr);
  std::mt19937_64 rng(11);
  std::vector<std::byte> bytes(1 << 16);
  for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng()));
  auto buffer = memory->Allocate(bytes.size());
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(memory->Write(*buffer, bytes).ok());
  std::vector<device::HashSegment> segments;
  std::vector<PartitionHash> want(64);
  for (uint32_t slot = 0; slot < want.size(); ++slot) {
    const uint32_t e = 1u << (slot % 4);
    device::PlacedRun run;
    run.base = reinterpret_cast<unsigned char*>(*buffer);
    run.len = 1 + rng() % 700;
    run.rows = 1 + rng() % 4;
    run.src_stride = run.len + rng() % 50;
    run.dst_stride = run.len + rng() % 90;
    run.src = rng() % 300;
    run.part_dst = rng() % 77;
    ASSERT_LE((run.src + (run.rows - 1) * run.src_stride + run.len) * e, bytes.size());
    segments.push_back({run, e, slot});
    const StridedRun host{run.rows, run.len * e, run.src_stride * e, run.part_dst * e,
                          run.dst_stride * e};
    want[slot] = HashStridedRun(bytes.data() + run.src * e, host);
  }
  std::vector<PartitionHash> got(want.size());
  ASSERT_TRUE(memory->Hash(segments, got).ok());
  EXPECT_EQ(got, want);
}

// The parts' parameters registered by address in each part's memory (on a GPU,
// device buffers), with `spoil` applied to the addresses before the store is made.
Result<std::unique_ptr<PlannedStore>> RegisteredStore(
    const Job& job, const Tensors& canonical, const std::vector<TensorSpec>& specs,
    const std::function<void(std::vector<std::vector<std::byte*>>&)>& spoil) {
  Reference ref(job, canonical);
  std::vector<PlannedStore::PartSpec> parts;
  std::vector<std::vector<std::byte*>> addresses;
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    PlannedStore::PartSpec part;
    part.memory = NewMemory(tp);
    part.layout = *layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml");
    addresses.emplace_back();
    const auto shard = ref.Shard(Rank{tp, 0, 0, 0});
    // Every buffer as large as the largest parameter and then some: an address moved
    // into another buffer or by a few bytes stays inside an allocation.
    uint64_t room = 0;
    for (const auto& t : shard) room = std::max<uint64_t>(room, t.values.size() * sizeof(int64_t));
    for (const auto& t : shard) {
      part.locals.push_back(t.spec);
      auto buffer = part.memory->Allocate(room + 16);
      EXPECT_TRUE(buffer.ok());
      EXPECT_TRUE(part.memory->Write(*buffer, BytesOf(t.values)).ok());
      addresses.back().push_back(*buffer);
    }
    parts.push_back(std::move(part));
  }
  spoil(addresses);
  for (uint64_t tp = 0; tp < job.tp; ++tp) parts[tp].addresses = addresses[tp];
  return PlannedStore::Create(specs, std::move(parts));
}

// The engine's own buffers (in the memory the store patches: on a GPU, device
// memory the store did not allocate) are patched where they are.
TEST_F(PlannedStoreTest, RegisteredDeviceBuffersArePatchedWhereTheyAre) {
  auto store = RegisteredStore(job_, base_, canonical_, [](auto&) {});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(Manifest(**store).VersionId(), base_manifest_.VersionId());
  DeltaApplier applier(**store, base_manifest_, identity_, {});
  for (const auto& v : views_) ASSERT_TRUE(applier.ApplyChunk(v).ok());
  ASSERT_TRUE(applier.Finish(summary_).ok());
  ExpectShards(**store, target_);
}

// Tied weights registered twice (two parameters at one address): one mask applied
// twice cancels, so the store refuses them before anything runs.
TEST_F(PlannedStoreTest, OverlappingRegisteredBuffersAreRefused) {
  std::string second;
  auto store = RegisteredStore(job_, base_, canonical_, [&](auto& addresses) {
    addresses[1][1] = addresses[1][0] + 8;  // inside the first parameter
  });
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("overlap"), std::string::npos)
      << store.status().ToString();
}

TEST_F(PlannedStoreTest, MisalignedRegisteredBuffersAreRefused) {
  auto store = RegisteredStore(job_, base_, canonical_,
                               [&](auto& addresses) { addresses[0][2] += 4; });  // I64 at +4
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("aligned"), std::string::npos)
      << store.status().ToString();
}

// A memory whose hashes fail (as a CUDA error would): the failure reaches the caller,
// and no manifest of made-up hashes is ever built.
class FailingHashes final : public device::PieceMemory {
 public:
  explicit FailingHashes(std::unique_ptr<device::PieceMemory> inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  Result<std::byte*> Allocate(uint64_t bytes) override { return inner_->Allocate(bytes); }
  Status CheckRegion(const std::byte* p, uint64_t bytes, uint32_t alignment) override {
    return inner_->CheckRegion(p, bytes, alignment);
  }
  Status AwaitStream(uintptr_t stream) override { return inner_->AwaitStream(stream); }
  Status Patch(const device::PatchBatch& batch) override { return inner_->Patch(batch); }
  Status Sync() override { return inner_->Sync(); }
  Status QueueHashes(std::span<const device::HashSegment>, size_t) override {
    return Status::Internal(name() + ": an illegal memory access was encountered (injected)");
  }
  Status CollectHashes(std::span<PartitionHash>) override { return Status::Ok(); }
  Status FindChanges(const std::byte* base, const std::byte* target, uint64_t count,
                     uint32_t element_size, device::ChangeList& out) override {
    return inner_->FindChanges(base, target, count, element_size, out);
  }
  Status ReadRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                  uint64_t width, uint64_t rows) override {
    return inner_->ReadRows(src, src_pitch, dst, dst_pitch, width, rows);
  }
  Status WriteRows(const std::byte* src, uint64_t src_pitch, std::byte* dst, uint64_t dst_pitch,
                   uint64_t width, uint64_t rows) override {
    return inner_->WriteRows(src, src_pitch, dst, dst_pitch, width, rows);
  }

 private:
  std::unique_ptr<device::PieceMemory> inner_;
};

TEST_F(PlannedStoreTest, AHashThatFailsNeverBecomesAManifest) {
  Reference ref(job_, base_);
  std::vector<PlannedStore::PartSpec> parts;
  for (uint64_t tp = 0; tp < job_.tp; ++tp) {
    PlannedStore::PartSpec part;
    part.memory = NewMemory(tp);
    if (tp == 1) part.memory = std::make_unique<FailingHashes>(std::move(part.memory));
    part.layout = *layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml");
    for (const auto& t : ref.Shard(Rank{tp, 0, 0, 0})) part.locals.push_back(t.spec);
    parts.push_back(std::move(part));
  }
  auto store = PlannedStore::Create(canonical_, std::move(parts));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Load(**store, base_);
  auto manifest = HashWeightStore(**store, kPartitionBytes, 1);
  ASSERT_FALSE(manifest.ok());
  EXPECT_NE(manifest.status().message().find("illegal memory access"), std::string::npos);
  auto replica = Replica::ForStore(std::move(*store), kPartitionBytes, 1);
  EXPECT_FALSE(replica.ok());
}

}  // namespace
}  // namespace deltacast::apply

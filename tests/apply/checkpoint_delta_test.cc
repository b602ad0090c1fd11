#include "apply/checkpoint_delta.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/delta_file.h"
#include "apply/replica.h"
#include "apply/safetensors.h"
#include "codec/chunk.h"
#include "codec/manifest.h"
#include "codec/partition.h"
#include "common/file_util.h"
#include "common/hash.h"
#include "tests/apply/test_util.h"

namespace deltacast::apply {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using ::deltacast::apply::testing::ScratchDir;
using ::testing::HasSubstr;
using Outcome = PatchResult::Outcome;

constexpr uint64_t kPartitionBytes = 4096;
constexpr std::string_view kShard1 = "model-00001-of-00002.safetensors";
constexpr std::string_view kShard2 = "model-00002-of-00002.safetensors";

// Tensor name -> bytes: one version of the model.
using Contents = std::map<std::string, Bytes>;

// File name -> bytes of every regular file directly in `dir` (.deltacast/ aside).
std::map<std::string, std::string> ReadFiles(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    out[entry.path().filename().string()] = testing::ReadAll(entry.path());
  }
  return out;
}

void CopyCheckpoint(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from)) {
    if (entry.is_regular_file()) fs::copy_file(entry.path(), to / entry.path().filename());
  }
}

uint16_t ToBf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

// Where each partition of a directory stands relative to two versions.
enum class At { kBase, kTarget, kNeither };

std::map<std::pair<std::string, uint64_t>, At> PartitionStates(const fs::path& dir,
                                                               const fs::path& base,
                                                               const fs::path& target) {
  using Access = CheckpointDirStore::Access;
  std::map<std::pair<std::string, uint64_t>, At> out;
  auto now = CheckpointDirStore::Open(dir, Access::kReadOnly);
  auto a = CheckpointDirStore::Open(base, Access::kReadOnly);
  auto b = CheckpointDirStore::Open(target, Access::kReadOnly);
  EXPECT_TRUE(now.ok() && a.ok() && b.ok());
  if (!now.ok() || !a.ok() || !b.ok()) return out;
  for (const codec::PartitionRef& p : codec::PartitionTensors((*now)->tensors(), kPartitionBytes)) {
    const uint64_t e = ElementSize((*now)->tensors()[p.tensor].dtype);
    auto part = [&](const WeightStore& s) {
      return s.TensorData(p.tensor).subspan(p.element_offset * e, p.element_count * e);
    };
    const ByteSpan x = part(**now), y = part(**a), z = part(**b);
    const At at = std::equal(x.begin(), x.end(), z.begin())   ? At::kTarget
                  : std::equal(x.begin(), x.end(), y.begin()) ? At::kBase
                                                              : At::kNeither;
    out[{(*now)->tensors()[p.tensor].name, p.element_offset}] = at;
  }
  return out;
}

class CheckpointDeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    files_ = {
        {std::string(kShard1),
         {{"model.embed_tokens.weight", DType::kBF16, {64, 96}},  // 12 KiB: 3 partitions
          {"model.layers.0.bias", DType::kF32, {33}},
          {"model.layers.0.mask", DType::kBool, {17}},
          {"model.layers.0.scale", DType::kF8E4M3, {100}}}},
        {std::string(kShard2),
         {{"lm_head.weight", DType::kF16, {40, 50}},
          {"model.norm.weight", DType::kF32, {64}},
          {"model.step", DType::kI64, {3}},
          {"model.counts", DType::kU16, {10}}}},
    };
    std::mt19937_64 rng(1234);
    v0_ = RandomVersion(rng);
    v1_ = Evolve(v0_, rng);
    v2_ = RandomVersion(rng);
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(Dir("v0"), v0_));
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(Dir("v1"), v1_));
    ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(Dir("v2"), v2_));
  }

  fs::path Dir(std::string_view name) const { return scratch_.path() / name; }

  // Weights that look like a trained model's: small normal values.
  Contents RandomVersion(std::mt19937_64& rng) const {
    Contents out;
    std::normal_distribution<float> weight(0.0f, 0.02f);
    for (const auto& [file, tensors] : files_) {
      for (const auto& t : tensors) {
        Bytes bytes(t.ByteSize());
        if (t.dtype == DType::kBF16) {
          for (size_t i = 0; i < bytes.size(); i += 2) {
            StoreLE<uint16_t>(&bytes[i], ToBf16(weight(rng)));
          }
        } else if (t.dtype == DType::kBool) {
          for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng() % 2));
        } else {
          for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(rng()));
        }
        out[t.name] = std::move(bytes);
      }
    }
    return out;
  }

  // One optimizer step's worth of change: +-1 ulp on a few percent of the BF16
  // embedding (its middle partition untouched), a re-initialised head, a counter.
  Contents Evolve(const Contents& from, std::mt19937_64& rng) const {
    Contents out = from;
    Bytes& emb = out["model.embed_tokens.weight"];
    for (size_t i = 0; i < emb.size() / 2; ++i) {
      if (i >= 2048 && i < 4096) continue;  // partition 1 (elements 2048..4095)
      if (rng() % 100 >= 3) continue;
      const uint16_t w = LoadLE<uint16_t>(&emb[2 * i]);
      StoreLE<uint16_t>(&emb[2 * i], static_cast<uint16_t>((w & 0x7FFF) == 0 ? w + 1
                                                           : rng() % 2       ? w + 1
                                                                             : w - 1));
    }
    for (auto& b : out["lm_head.weight"]) b = std::byte(static_cast<uint8_t>(rng()));
    out["model.layers.0.bias"][5] ^= std::byte{0x01};
    out["model.layers.0.scale"][99] ^= std::byte{0x80};
    out["model.step"][8] ^= std::byte{0x01};
    return out;
  }

  // Two shards and an index, as Hugging Face saves a sharded model.
  void WriteCheckpoint(const fs::path& dir, const Contents& contents,
                       const std::string& format = "pt") const {
    fs::create_directories(dir);
    std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
    bool first = true;
    for (const auto& [file, tensors] : files_) {
      auto writer = SafetensorsWriter::Create(dir / file, tensors, {{"format", format}});
      ASSERT_TRUE(writer.ok()) << writer.status().ToString();
      for (const auto& t : tensors) {
        ASSERT_TRUE((*writer)->Append(contents.at(t.name)).ok());
        index += (first ? "\"" : ", \"") + t.name + "\": \"" + file + "\"";
        first = false;
      }
      ASSERT_TRUE((*writer)->Finish().ok());
    }
    index += "}}";
    ASSERT_TRUE(WriteFile(dir / kCheckpointIndexFileName, AsBytes(index)).ok());
  }

  DiffOptions Options(codec::CodecMode mode = codec::CodecMode::kFast) const {
    DiffOptions options;
    options.partition_bytes = kPartitionBytes;
    options.encoder.chunk_bytes = 256;  // about one record a chunk
    options.encoder.threads = 2;
    options.encoder.codec.mode = mode;
    return options;
  }

  // The delta v0 -> v1 in `name`.
  DiffResult Diff(const fs::path& out, const DiffOptions& options) {
    auto result = DiffCheckpoints(Dir("v0"), Dir("v1"), out, options);
    EXPECT_TRUE(result.ok()) << result.status().ToString();
    return result.ok() ? *result : DiffResult{};
  }

  static Result<PatchResult> Patch(const fs::path& dir, const fs::path& delta,
                                   const fs::path& repair_from = {}) {
    PatchOptions options;
    options.threads = 2;
    options.repair_from = repair_from;
    return PatchCheckpoint(dir, delta, options);
  }

  // The chunks of a delta file, as stored.
  static std::vector<Bytes> ReadChunks(const fs::path& delta) {
    std::vector<Bytes> out;
    auto reader = DeltaFileReader::Open(delta);
    EXPECT_TRUE(reader.ok());
    if (!reader.ok()) return out;
    while (true) {
      auto next = (*reader)->Next();
      EXPECT_TRUE(next.ok()) << next.status().ToString();
      if (!next.ok() || !next->has_value()) break;
      out.push_back(std::move(**next));
    }
    return out;
  }

  static void WriteChunks(const fs::path& delta, const std::vector<Bytes>& chunks) {
    auto writer = DeltaFileWriter::Create(delta);
    ASSERT_TRUE(writer.ok());
    for (const Bytes& c : chunks) ASSERT_TRUE((*writer)->Append(c).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }

  // `dir` is byte-identical to v1 and says so in .deltacast/active.
  void ExpectAtTarget(const fs::path& dir, const codec::DeltaIdentity& identity) {
    const auto got = ReadFiles(dir);
    const auto want = ReadFiles(Dir("v1"));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, bytes] : want) {
      ASSERT_EQ(got.count(name), 1u) << name;
      EXPECT_TRUE(got.at(name) == bytes) << name << " differs from the target";
    }
    CheckpointState state(dir);
    auto active = state.ReadActive();
    ASSERT_TRUE(active.ok()) << active.status().ToString();
    ASSERT_TRUE(active->has_value());
    EXPECT_EQ(**active, identity.target_version);
    auto inflight = state.ReadInflight();
    ASSERT_TRUE(inflight.ok());
    EXPECT_FALSE(inflight->has_value()) << "inflight left behind after success";
  }

  // Version id of a directory, hashed from scratch.
  static Digest128 VersionOf(const fs::path& dir) {
    auto store = CheckpointDirStore::Open(dir, CheckpointDirStore::Access::kReadOnly);
    EXPECT_TRUE(store.ok());
    return codec::ComputeManifest((*store)->tensors(),
                                  [&](size_t i) { return (*store)->TensorData(i); },
                                  kPartitionBytes, 1)
        .VersionId();
  }

  std::vector<std::pair<std::string, std::vector<TensorSpec>>> files_;
  Contents v0_, v1_, v2_;
  ScratchDir scratch_;
};

TEST_F(CheckpointDeltaTest, DiffThenPatchIsByteIdentical) {
  const fs::path delta = Dir("v0-v1.delta");
  const DiffResult diff = Diff(delta, Options());
  EXPECT_EQ(diff.identity.base_version, VersionOf(Dir("v0")));
  EXPECT_EQ(diff.identity.target_version, VersionOf(Dir("v1")));
  EXPECT_EQ(diff.identity.partition_bytes, kPartitionBytes);
  EXPECT_GT(diff.stats.chunks, 3u);
  // The embedding's untouched partition and the unchanged tensors are not in the delta.
  EXPECT_EQ(diff.stats.changed_partitions, 2u + 1u + 1u + 1u + 1u);

  CopyCheckpoint(Dir("v0"), Dir("work"));
  auto patched = Patch(Dir("work"), delta);
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ(patched->outcome, Outcome::kApplied);
  EXPECT_EQ(patched->identity, diff.identity);
  EXPECT_EQ(patched->report.applied, diff.stats.changed_partitions);
  EXPECT_TRUE(patched->report.torn.empty());
  ExpectAtTarget(Dir("work"), diff.identity);
  EXPECT_EQ(VersionOf(Dir("work")), diff.identity.target_version);
}

// A patch that crashed after applying `chunks` (data chunks only): the delta is in
// flight and those partitions are at target; the process "dies" without finishing.
void ApplyThenCrash(const fs::path& dir, const std::vector<Bytes>& chunks) {
  auto first = codec::ParseChunk(chunks.front());
  ASSERT_TRUE(first.ok());
  auto replica = Replica::OpenCheckpointDir(dir, first->identity.partition_bytes, 1);
  ASSERT_TRUE(replica.ok()) << replica.status().ToString();
  auto applier = (*replica)->Begin(first->identity, ApplyOptions{1});
  ASSERT_TRUE(applier.ok()) << applier.status().ToString();
  for (const auto& bytes : chunks) {
    auto chunk = codec::ParseChunk(bytes);
    ASSERT_TRUE(chunk.ok());
    ASSERT_TRUE((*applier)->ApplyChunk(*chunk).ok());
  }
  // Make what was applied durable, as the agent does before it dies.
  auto& store = (*replica)->store();
  for (size_t t = 0; t < store.tensors().size(); ++t) {
    ASSERT_TRUE(store.Flush(t, 0, store.tensors()[t].ByteSize()).ok());
  }
}

TEST_F(CheckpointDeltaTest, PatchingAgainIsAlreadyAtTargetAndWritesNothing) {
  const fs::path delta = Dir("v0-v1.delta");
  const DiffResult diff = Diff(delta, Options());
  CopyCheckpoint(Dir("v0"), Dir("work"));
  ASSERT_TRUE(Patch(Dir("work"), delta).ok());
  const auto before = ReadFiles(Dir("work"));
  auto again = Patch(Dir("work"), delta);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->outcome, Outcome::kAlreadyAtTarget);
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
  ExpectAtTarget(Dir("work"), diff.identity);

  // A fresh copy of the target (no cached manifest) is recognised as well.
  CopyCheckpoint(Dir("v1"), Dir("fresh"));
  const auto fresh_before = ReadFiles(Dir("fresh"));
  auto fresh = Patch(Dir("fresh"), delta);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(fresh->outcome, Outcome::kAlreadyAtTarget);
  EXPECT_TRUE(ReadFiles(Dir("fresh")) == fresh_before);
  EXPECT_FALSE(CheckpointState(Dir("fresh")).ReadInflight()->has_value());
}

TEST_F(CheckpointDeltaTest, UnrelatedVersionIsRefusedAndUnchanged) {
  const fs::path delta = Dir("v0-v1.delta");
  Diff(delta, Options());
  CopyCheckpoint(Dir("v2"), Dir("work"));
  const auto before = ReadFiles(Dir("work"));
  auto patched = Patch(Dir("work"), delta);
  ASSERT_FALSE(patched.ok());
  EXPECT_EQ(patched.status().code(), StatusCode::kVersionMismatch) << patched.status().ToString();
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
  CheckpointState state(Dir("work"));
  EXPECT_FALSE(state.ReadInflight()->has_value());
  EXPECT_FALSE(state.ReadActive()->has_value());
}

TEST_F(CheckpointDeltaTest, InterruptedPatchResumes) {
  const fs::path delta = Dir("v0-v1.delta");
  const DiffResult diff = Diff(delta, Options());
  const std::vector<Bytes> chunks = ReadChunks(delta);
  ASSERT_GE(chunks.size(), 4u);
  const size_t k = chunks.size() / 2;  // data chunks 0..k-1, no END
  // A delta file cut short is refused whole, before anything is written.
  const fs::path partial = Dir("partial.delta");
  WriteChunks(partial,
              std::vector<Bytes>(chunks.begin(), chunks.begin() + static_cast<ptrdiff_t>(k)));
  CopyCheckpoint(Dir("v0"), Dir("work"));
  auto refused = Patch(Dir("work"), partial);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(refused.status().message(), HasSubstr("without an END chunk"));
  EXPECT_TRUE(ReadFiles(Dir("work")) == ReadFiles(Dir("v0")));

  // A patch that died after k chunks leaves the delta in flight.
  ASSERT_NO_FATAL_FAILURE(ApplyThenCrash(
      Dir("work"), std::vector<Bytes>(chunks.begin(), chunks.begin() + static_cast<ptrdiff_t>(k))));
  auto inflight = CheckpointState(Dir("work")).ReadInflight();
  ASSERT_TRUE(inflight.ok() && inflight->has_value());
  EXPECT_EQ(**inflight, (InflightDelta{diff.identity.base_version, diff.identity.target_version}));
  // Mid-way: some partitions at target, the rest at base, none torn.
  size_t at_base = 0;
  for (const auto& [key, at] : PartitionStates(Dir("work"), Dir("v0"), Dir("v1"))) {
    EXPECT_NE(at, At::kNeither) << key.first << " at " << key.second;
    at_base += at == At::kBase;
  }
  EXPECT_GT(at_base, 0u);
  EXPECT_FALSE(ReadFiles(Dir("work")) == ReadFiles(Dir("v0"))) << "nothing was applied";
  EXPECT_FALSE(ReadFiles(Dir("work")) == ReadFiles(Dir("v1"))) << "everything was applied";

  // Another delta cannot start while this one is unfinished.
  ASSERT_TRUE(DiffCheckpoints(Dir("v0"), Dir("v2"), Dir("v0-v2.delta"), Options()).ok());
  const auto mid = ReadFiles(Dir("work"));
  auto other = Patch(Dir("work"), Dir("v0-v2.delta"));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("unfinished"));
  EXPECT_TRUE(ReadFiles(Dir("work")) == mid);

  auto resumed = Patch(Dir("work"), delta);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->outcome, Outcome::kResumed);
  EXPECT_GT(resumed->report.already_at_target, 0u);
  EXPECT_EQ(resumed->report.applied + resumed->report.already_at_target,
            diff.stats.changed_partitions);
  ExpectAtTarget(Dir("work"), diff.identity);
}

TEST_F(CheckpointDeltaTest, TornPartitionFailsThePatchUntilRepaired) {
  const fs::path delta = Dir("v0-v1.delta");
  const DiffResult diff = Diff(delta, Options());
  const std::vector<Bytes> chunks = ReadChunks(delta);
  ASSERT_GE(chunks.size(), 3u);
  CopyCheckpoint(Dir("v0"), Dir("work"));
  ASSERT_NO_FATAL_FAILURE(ApplyThenCrash(Dir("work"), {chunks[0]}));

  // Tear a partition that a later chunk patches: it is at base, so flip two bytes.
  auto later = codec::ParseChunk(chunks[chunks.size() - 2]);
  ASSERT_TRUE(later.ok());
  const codec::PartitionRecord& record = later->records.back();
  const std::string torn_name(record.tensor_name);
  auto layout = ReadCheckpointLayout(Dir("work"));
  ASSERT_TRUE(layout.ok());
  const CheckpointTensor* where = nullptr;
  for (const auto& t : layout->tensors) {
    if (t.info.name == torn_name) where = &t;
  }
  ASSERT_NE(where, nullptr);
  const fs::path file = Dir("work") / layout->files[where->file].name;
  auto bytes = ReadFile(file);
  ASSERT_TRUE(bytes.ok());
  const size_t at = where->file_offset + record.element_offset * ElementSize(record.dtype);
  (*bytes)[at] ^= std::byte{0x21};
  (*bytes)[at + 1] ^= std::byte{0x12};
  ASSERT_TRUE(WriteFile(file, *bytes).ok());
  const std::pair<std::string, uint64_t> torn_key{torn_name, record.element_offset};

  auto failed = Patch(Dir("work"), delta);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition) << failed.status().ToString();
  EXPECT_THAT(failed.status().message(),
              HasSubstr("'" + torn_name + "' at element " + std::to_string(record.element_offset)));
  // Everything else is at target; the torn partition is exactly as it was torn.
  for (const auto& [key, state] : PartitionStates(Dir("work"), Dir("v0"), Dir("v1"))) {
    EXPECT_EQ(state, key == torn_key ? At::kNeither : At::kTarget)
        << key.first << " at " << key.second;
  }
  auto after = ReadFile(file);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)[at], (*bytes)[at]);
  EXPECT_EQ((*after)[at + 1], (*bytes)[at + 1]);
  EXPECT_FALSE(CheckpointState(Dir("work")).ReadActive()->has_value());

  // A repair source at the wrong version cannot fix it.
  auto wrong_source = Patch(Dir("work"), delta, Dir("v2"));
  ASSERT_FALSE(wrong_source.ok());
  EXPECT_EQ(wrong_source.status().code(), StatusCode::kCorrupt) << wrong_source.status().ToString();

  auto repaired = Patch(Dir("work"), delta, Dir("v1"));
  ASSERT_TRUE(repaired.ok()) << repaired.status().ToString();
  EXPECT_EQ(repaired->outcome, Outcome::kResumed);
  ExpectAtTarget(Dir("work"), diff.identity);
}

TEST_F(CheckpointDeltaTest, CorruptedDeltaFileChangesNothing) {
  DiffOptions options = Options();
  options.encoder.chunk_bytes = 1ull << 20;  // the whole delta in one data chunk
  const fs::path delta = Dir("v0-v1.delta");
  Diff(delta, options);
  ASSERT_EQ(ReadChunks(delta).size(), 2u);
  auto bytes = ReadFile(delta);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= std::byte{0x01};
  const fs::path corrupt = Dir("corrupt.delta");
  ASSERT_TRUE(WriteFile(corrupt, *bytes).ok());

  CopyCheckpoint(Dir("v0"), Dir("work"));
  const auto before = ReadFiles(Dir("work"));
  auto patched = Patch(Dir("work"), corrupt);
  ASSERT_FALSE(patched.ok());
  EXPECT_EQ(patched.status().code(), StatusCode::kCorrupt) << patched.status().ToString();
  EXPECT_THAT(patched.status().message(), HasSubstr("checksum"));
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
  EXPECT_FALSE(CheckpointState(Dir("work")).ReadInflight()->has_value());

  // Cut short inside the data chunk: also refused before anything is written.
  bytes->resize(bytes->size() / 2);
  ASSERT_TRUE(WriteFile(corrupt, *bytes).ok());
  auto truncated = Patch(Dir("work"), corrupt);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(truncated.status().message(), HasSubstr("truncated"));
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
}

// The whole file is validated first: a chunk corrupt late in the delta is refused
// before the chunks ahead of it are applied.
TEST_F(CheckpointDeltaTest, CorruptChunkLaterInTheDeltaChangesNothing) {
  const fs::path delta = Dir("v0-v1.delta");
  const DiffResult diff = Diff(delta, Options());
  std::vector<Bytes> chunks = ReadChunks(delta);
  ASSERT_GE(chunks.size(), 3u);
  Bytes& victim = chunks[chunks.size() - 2];
  victim[victim.size() - 3] ^= std::byte{0x40};
  const fs::path corrupt = Dir("corrupt.delta");
  WriteChunks(corrupt, chunks);

  CopyCheckpoint(Dir("v0"), Dir("work"));
  const auto before = ReadFiles(Dir("work"));
  auto patched = Patch(Dir("work"), corrupt);
  ASSERT_FALSE(patched.ok());
  EXPECT_EQ(patched.status().code(), StatusCode::kCorrupt) << patched.status().ToString();
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
  EXPECT_FALSE(CheckpointState(Dir("work")).ReadInflight()->has_value());

  auto good = Patch(Dir("work"), delta);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->outcome, Outcome::kApplied);
  ExpectAtTarget(Dir("work"), diff.identity);
}

TEST_F(CheckpointDeltaTest, DifferentLayoutsAreUnsupported) {
  // Same tensors, but a safetensors header differs (its metadata).
  ASSERT_NO_FATAL_FAILURE(WriteCheckpoint(Dir("np"), v1_, "np"));
  auto diff = DiffCheckpoints(Dir("v0"), Dir("np"), Dir("x.delta"), Options());
  ASSERT_FALSE(diff.ok());
  EXPECT_EQ(diff.status().code(), StatusCode::kUnsupported) << diff.status().ToString();
  EXPECT_THAT(diff.status().message(), HasSubstr("differ in file layout"));

  // Same files and headers, but the index differs.
  CopyCheckpoint(Dir("v1"), Dir("index"));
  auto index = ReadFile(Dir("index") / kCheckpointIndexFileName);
  ASSERT_TRUE(index.ok());
  std::string text(AsChars(*index));
  text.replace(text.find("\"total_size\": 0"), 15, "\"total_size\": 1");
  ASSERT_TRUE(WriteFile(Dir("index") / kCheckpointIndexFileName, AsBytes(text)).ok());
  auto by_index = DiffCheckpoints(Dir("v0"), Dir("index"), Dir("y.delta"), Options());
  ASSERT_FALSE(by_index.ok());
  EXPECT_EQ(by_index.status().code(), StatusCode::kUnsupported);
}

// The same tensors split into files differently have the same version id but not
// the target's layout, so the patch cannot make the directory byte-identical to the
// target and fails. The layout is only known from the END chunk, after the data
// chunks were applied, so the tensor bytes are left mid-patch (never torn).
TEST_F(CheckpointDeltaTest, SameTensorsInAnotherFileLayoutIsRefused) {
  const fs::path delta = Dir("v0-v1.delta");
  Diff(delta, Options());
  std::vector<TensorSpec> all;
  for (const auto& [file, tensors] : files_) all.insert(all.end(), tensors.begin(), tensors.end());
  fs::create_directories(Dir("single"));
  {
    auto writer = SafetensorsWriter::Create(Dir("single") / "model.safetensors", all);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const auto& t : all) ASSERT_TRUE((*writer)->Append(v0_.at(t.name)).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  ASSERT_EQ(VersionOf(Dir("single")), VersionOf(Dir("v0")));
  auto patched = Patch(Dir("single"), delta);
  ASSERT_FALSE(patched.ok());
  EXPECT_EQ(patched.status().code(), StatusCode::kCorrupt) << patched.status().ToString();
  EXPECT_THAT(patched.status().message(), HasSubstr("layout"));
  EXPECT_FALSE(CheckpointState(Dir("single")).ReadActive()->has_value());
  auto store = CheckpointDirStore::Open(Dir("single"), CheckpointDirStore::Access::kReadOnly);
  ASSERT_TRUE(store.ok());
  for (size_t i = 0; i < (*store)->tensors().size(); ++i) {
    const std::string& name = (*store)->tensors()[i].name;
    const ByteSpan now = (*store)->TensorData(i);
    EXPECT_TRUE(std::equal(now.begin(), now.end(), v0_.at(name).begin()) ||
                std::equal(now.begin(), now.end(), v1_.at(name).begin()))
        << name;
  }
}

TEST_F(CheckpointDeltaTest, ContextModeRoundTripsBitExactly) {
  const fs::path delta = Dir("v0-v1.context.delta");
  const DiffResult diff = Diff(delta, Options(codec::CodecMode::kContext));
  EXPECT_GT(diff.stats.records_by_encoding[static_cast<size_t>(codec::Encoding::kContextXor)], 0u)
      << "the context coder never won, so this test would not exercise it";
  CopyCheckpoint(Dir("v0"), Dir("work"));
  auto patched = Patch(Dir("work"), delta);
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ(patched->outcome, Outcome::kApplied);
  ExpectAtTarget(Dir("work"), diff.identity);
}

}  // namespace
}  // namespace deltacast::apply

namespace deltacast::apply {
namespace {

// Writes `parts` of the catch-up with the bytes `target` has there.
void WriteParts(CatchUp& catch_up, const WeightStore& target,
                const std::vector<CatchUpPartition>& parts) {
  for (const CatchUpPartition& p : parts) {
    const auto index = target.FindTensor(p.key.tensor);
    ASSERT_TRUE(index.has_value());
    const uint64_t e = ElementSize(target.tensors()[*index].dtype);
    const ByteSpan bytes =
        target.TensorData(*index).subspan(p.key.element_offset * e, p.byte_length);
    ASSERT_TRUE(catch_up.applier->WriteVerified(p.key, bytes, p.target_hash).ok());
  }
}

TEST_F(CheckpointDeltaTest, CatchUpReachesAMissedVersionFromAMixAndResumesAfterACrash) {
  // "work" was at v0 and died mid-way through v0 -> v1; the cluster has since
  // committed v2. It catches up to v2 by overwriting the partitions that differ.
  const fs::path delta = Dir("v0-v1.delta");
  Diff(delta, Options());
  const std::vector<Bytes> chunks = ReadChunks(delta);
  CopyCheckpoint(Dir("v0"), Dir("work"));
  ASSERT_NO_FATAL_FAILURE(ApplyThenCrash(Dir("work"), {chunks[0]}));
  auto v2 = Replica::OpenCheckpointDir(Dir("v2"), kPartitionBytes, 1);
  ASSERT_TRUE(v2.ok());
  const codec::Manifest target = (*v2)->manifest();

  size_t total = 0;
  {
    auto work = Replica::OpenCheckpointDir(Dir("work"), kPartitionBytes, 1);
    ASSERT_TRUE(work.ok());
    ASSERT_TRUE((*work)->inflight().has_value());
    auto catch_up = (*work)->BeginCatchUp(target, ApplyOptions{1});
    ASSERT_TRUE(catch_up.ok()) << catch_up.status().ToString();
    total = catch_up->partitions.size();
    ASSERT_GE(total, 2u);
    // Half written, then the process dies.
    const std::vector<CatchUpPartition> half(catch_up->partitions.begin(),
                                             catch_up->partitions.begin() + total / 2);
    ASSERT_NO_FATAL_FAILURE(WriteParts(*catch_up, (*v2)->store(), half));
  }
  auto work = Replica::OpenCheckpointDir(Dir("work"), kPartitionBytes, 1);
  ASSERT_TRUE(work.ok());
  ASSERT_TRUE((*work)->inflight().has_value());
  EXPECT_EQ((*work)->inflight()->target, target.VersionId());
  EXPECT_TRUE((*work)->applied_chunks().empty());  // the old delta's marks are gone
  auto resumed = (*work)->BeginCatchUp(target, ApplyOptions{1});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->partitions.size(), total - total / 2);
  // Not there yet: committing now is refused and changes nothing.
  EXPECT_EQ((*work)->CommitFromStore().code(), StatusCode::kFailedPrecondition);
  // Bytes that do not hash to what the target says are refused, nothing written.
  const CatchUpPartition& first = resumed->partitions.front();
  const std::vector<std::byte> wrong(first.byte_length, std::byte{1});
  EXPECT_EQ(resumed->applier->WriteVerified(first.key, wrong, first.target_hash).code(),
            StatusCode::kCorrupt);
  ASSERT_NO_FATAL_FAILURE(WriteParts(*resumed, (*v2)->store(), resumed->partitions));
  ASSERT_TRUE((*work)->CommitFromStore().ok());
  EXPECT_EQ((*work)->version(), target.VersionId());
  EXPECT_FALSE((*work)->inflight().has_value());
  EXPECT_TRUE(ReadFiles(Dir("work")) == ReadFiles(Dir("v2")));
}

TEST_F(CheckpointDeltaTest, CatchUpToADifferentLayoutIsRefusedAndWritesNothing) {
  CopyCheckpoint(Dir("v0"), Dir("work"));
  const auto before = ReadFiles(Dir("work"));
  auto work = Replica::OpenCheckpointDir(Dir("work"), kPartitionBytes, 1);
  ASSERT_TRUE(work.ok());
  codec::Manifest other = (*work)->manifest();
  other.tensors.back().name += ".renamed";
  auto refused = (*work)->BeginCatchUp(other, ApplyOptions{1});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("tensor table differs"));
  EXPECT_FALSE((*work)->inflight().has_value());
  EXPECT_TRUE(ReadFiles(Dir("work")) == before);
}

// The manifest cache of an older build (format 1: xxh3-64 partition hashes) or of an
// unknown format is never read: the checkpoint is hashed again and the cache
// rewritten. A poisoned hash in each stale cache shows it was not used; the same
// poison in a current-format cache whose stamps match is used, as a cache should be.
TEST_F(CheckpointDeltaTest, ManifestCacheOfAnotherFormatIsHashedAgainNeverRead) {
  const fs::path dir = Dir("v0");
  const fs::path cache = dir / kStateDirName / "manifest.bin";
  codec::Manifest fresh;
  {
    auto replica = Replica::OpenCheckpointDir(dir, kPartitionBytes, 1);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    fresh = (*replica)->manifest();
  }
  auto written = ReadFile(cache);
  ASSERT_TRUE(written.ok());
  const Bytes current = *written;
  ASSERT_EQ(LoadLE<uint32_t>(current.data()), 0x4D434344u);  // "DCCM"
  ASSERT_EQ(LoadLE<uint16_t>(current.data() + 4), 2u);
  // The embedded manifest starts with "DCMF"; its checksum sits before the cache's.
  size_t manifest_at = 8;
  while (manifest_at + 4 <= current.size() &&
         LoadLE<uint32_t>(current.data() + manifest_at) != 0x464D4344u) {
    ++manifest_at;
  }
  ASSERT_LT(manifest_at, current.size());
  auto reseal = [](Bytes& b, size_t manifest) {
    StoreLE<uint64_t>(b.data() + b.size() - 16,
                      Hash64(ByteSpan(b).subspan(manifest, b.size() - 16 - manifest)));
    StoreLE<uint64_t>(b.data() + b.size() - 8, Hash64(ByteSpan(b).first(b.size() - 8)));
  };
  auto poisoned = [&](const Bytes& from, size_t manifest) {
    Bytes b = from;
    b[b.size() - 17] ^= std::byte{1};  // the last partition hash
    reseal(b, manifest);
    return b;
  };
  auto reopen = [&]() {
    auto replica = Replica::OpenCheckpointDir(dir, kPartitionBytes, 1);
    EXPECT_TRUE(replica.ok()) << replica.status().ToString();
    return replica.ok() ? (*replica)->manifest() : codec::Manifest{};
  };

  // Format 1's layout: "DCCC", then the file stamps with no version field.
  Bytes v1(current.begin() + 4, current.end());
  StoreLE<uint32_t>(v1.data(), 0x43434344u);
  Bytes unknown = current;
  StoreLE<uint16_t>(unknown.data() + 4, 3);
  Bytes old_manifest = current;
  StoreLE<uint16_t>(old_manifest.data() + manifest_at + 4, 1);
  const std::vector<std::pair<std::string, Bytes>> stale = {
      {"format 1", poisoned(v1, manifest_at - 4)},
      {"format 3", poisoned(unknown, manifest_at)},
      {"manifest format 1", poisoned(old_manifest, manifest_at)}};
  for (const auto& [what, bytes] : stale) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(WriteFileAtomic(cache, bytes).ok());
    const codec::Manifest m = reopen();
    EXPECT_EQ(m.partition_hashes, fresh.partition_hashes);
    EXPECT_EQ(m.VersionId(), fresh.VersionId());
    auto rewritten = ReadFile(cache);
    ASSERT_TRUE(rewritten.ok());
    EXPECT_TRUE(*rewritten == current) << "the cache was not rewritten in the current format";
  }
  // Control: the same poison in a current cache is trusted.
  ASSERT_TRUE(WriteFileAtomic(cache, poisoned(current, manifest_at)).ok());
  EXPECT_NE(reopen().partition_hashes, fresh.partition_hashes);
}

}  // namespace
}  // namespace deltacast::apply

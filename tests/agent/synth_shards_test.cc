// The reference sharder of `deltacast synth --shards` against layout/: every rank's
// layout file expands against its shard's header, the ranks cover every canonical
// element exactly once, and converting the shards through the runs (value
// transforms included) gives the canonical checkpoint byte for byte.
#include "agent/synth_shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "layout/values.h"
#include "relay/producers/shard_input.h"
#include "tests/temp_dir.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

// Converts every rank's shard of `step` to canonical tensors through its layout and
// compares them with the step's checkpoint.
void CheckStep(const fs::path& step, uint64_t ranks) {
  const fs::path dir = ShardDirOf(step);
  std::vector<std::unique_ptr<relay::ShardFile>> files;
  std::vector<relay::RankPlacement> placements;
  for (uint64_t r = 0; r < ranks; ++r) {
    auto file = relay::ShardFile::Open(dir / (RankFileStem(r) + ".safetensors"));
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    auto p = relay::LoadRankPlacement(dir / (RankFileStem(r) + ".toml"), (*file)->tensors());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    files.push_back(std::move(*file));
    placements.push_back(std::move(*p));
  }
  ASSERT_FALSE(fs::exists(dir / (RankFileStem(ranks) + ".toml")));
  std::vector<const layout::PlacementMap*> maps;
  for (const auto& p : placements) maps.push_back(&p.map);
  Status covered = layout::CheckCoverage(maps);
  ASSERT_TRUE(covered.ok()) << covered.ToString();

  auto store = apply::CheckpointDirStore::Open(step, apply::CheckpointDirStore::Access::kReadOnly);
  ASSERT_TRUE(store.ok());
  const auto& canonical = placements[0].canonical;
  ASSERT_EQ(canonical, (*store)->tensors());
  std::vector<std::vector<std::byte>> rebuilt;
  for (const auto& t : canonical) rebuilt.emplace_back(t.ByteSize(), std::byte{0xAB});
  for (size_t r = 0; r < ranks; ++r) {
    const auto& map = placements[r].map;
    for (const layout::Run& run : map.runs()) {
      const auto& local = map.locals()[run.local].spec;
      const ByteSpan src = files[r]->TensorData(run.local);
      const DType to = canonical[run.canonical].dtype;
      const size_t a = ElementSize(local.dtype), b = ElementSize(to);
      for (uint64_t i = 0; i < run.count; ++i) {
        layout::TransformValues(
            run.value, local.dtype, src.data() + (run.src + i * run.src_stride) * a, to,
            rebuilt[run.canonical].data() + (run.dst + i * run.dst_stride) * b, run.len);
      }
    }
  }
  for (size_t c = 0; c < canonical.size(); ++c) {
    const ByteSpan want = (*store)->TensorData(c);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), rebuilt[c].begin()))
        << canonical[c].name << " differs after converting the shards";
  }
}

SynthOptions Small(const fs::path& dir, const std::string& shards, uint64_t experts = 0) {
  SynthOptions o;
  o.out_dir = dir;
  o.params = 3'000'000;
  o.steps = 1;
  o.seed = 5;
  o.threads = 2;
  o.experts = experts;
  o.shards = *ParseShardSpec(shards);
  return o;
}

TEST(SynthShards, MegatronTensorPipelineAndDataParallel) {
  test_util::TempDir dir{"synth_shards_test"};
  SynthOptions o = Small(dir.path(), "tp=2,pp=2,dp=2");
  o.params = 5'000'000;  // 4 layers: 2 stages of 2
  auto report = Synthesize(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->shard_ranks, 8);
  for (int k = 0; k <= 1; ++k) CheckStep(dir.path() / ("step" + std::to_string(k)), 8);
  // Data-parallel replicas share their bytes.
  const fs::path s = ShardDirOf(dir.path() / "step1");
  EXPECT_TRUE(fs::equivalent(s / "rank-00000.safetensors", s / "rank-00002.safetensors"));
}

TEST(SynthShards, UnevenPipelineStages) {
  test_util::TempDir dir{"synth_shards_test"};
  auto report = Synthesize(Small(dir.path(), "pp=2"));  // 3 layers: stages of 1 and 2
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->layers, 3);
  CheckStep(dir.path() / "step1", 2);
}

TEST(SynthShards, ExpertParallelMoe) {
  test_util::TempDir dir{"synth_shards_test"};
  auto report = Synthesize(Small(dir.path(), "ep=2,tp=2", 4));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  CheckStep(dir.path() / "step1", 4);
}

TEST(SynthShards, Fsdp2) {
  test_util::TempDir dir{"synth_shards_test"};
  auto report = Synthesize(Small(dir.path(), "fsdp=3"));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  CheckStep(dir.path() / "step1", 3);
}

TEST(SynthShards, SpecParsing) {
  EXPECT_TRUE(ParseShardSpec("tp=2,pp=2").ok());
  EXPECT_EQ(ParseShardSpec("tp=4")->tp, 4u);
  EXPECT_FALSE(ParseShardSpec("tp=2,tp=2").ok());
  EXPECT_FALSE(ParseShardSpec("xp=2").ok());
  EXPECT_FALSE(ParseShardSpec("tp=0").ok());
  EXPECT_FALSE(ParseShardSpec("fsdp=2,tp=2").ok());
  EXPECT_FALSE(ParseShardSpec("tp").ok());
}

TEST(SynthShards, RefusesASplitTheModelCannotTake) {
  test_util::TempDir dir{"synth_shards_test"};
  auto report = Synthesize(Small(dir.path(), "ep=2"));  // a dense model has no experts
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("experts"), std::string::npos);
}

}  // namespace
}  // namespace deltacast::agent

// Iota tests (../shared/LAYOUTS.md, "Checking a layout mechanically"): canonical
// tensors filled with their own global indices are sharded by the independent
// reference in reference.h; every rank's description is expanded with layout/, and
// its runs must put every index back into its canonical place exactly once, in both
// directions.
#include "layout/placement.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/layout/reference.h"

namespace deltacast::layout {
namespace {

using testing::AllRanks;
using testing::Job;
using testing::Rank;
using testing::Reference;
using testing::Tensor;
// gtest's Test::Run hides the type inside TEST bodies.
using StridedRun = Run;

struct Expanded {
  std::vector<std::vector<Tensor>> shards;
  std::vector<PlacementMap> maps;
};

std::vector<TensorSpec> Specs(const std::vector<Tensor>& tensors) {
  std::vector<TensorSpec> out;
  for (const auto& t : tensors) out.push_back(t.spec);
  return out;
}

Expanded ExpandAll(const Job& job, const std::vector<Tensor>& canonical) {
  Reference ref(job, canonical);
  Expanded out;
  for (const Rank& r : AllRanks(job)) {
    out.shards.push_back(ref.Shard(r));
    auto d = ParseLayout(ref.LayoutToml(r), "rank.toml");
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    auto map = ExpandPlacement(*d, Specs(canonical), Specs(out.shards.back()));
    EXPECT_TRUE(map.ok()) << map.status().ToString();
    out.maps.push_back(std::move(*map));
  }
  return out;
}

// Scatters every rank's shard through its runs into fresh canonical tensors and
// checks each element arrives exactly once with its own index; then checks the
// other direction (ShardPieces) and single-element projection.
void CheckIota(const Job& job) {
  const std::vector<Tensor> canonical = testing::CanonicalTensors(job);
  Expanded e = ExpandAll(job, canonical);
  ASSERT_EQ(e.maps.size(), AllRanks(job).size());
  std::vector<const PlacementMap*> maps;
  for (const auto& m : e.maps) maps.push_back(&m);
  ASSERT_TRUE(CheckCoverage(maps).ok()) << CheckCoverage(maps).ToString();

  std::vector<std::vector<int64_t>> rebuilt(canonical.size());
  std::vector<std::vector<int>> hits(canonical.size());
  for (size_t c = 0; c < canonical.size(); ++c) {
    rebuilt[c].assign(canonical[c].values.size(), testing::kPadding);
    hits[c].assign(canonical[c].values.size(), 0);
  }
  for (size_t m = 0; m < e.maps.size(); ++m) {
    const PlacementMap& map = e.maps[m];
    ASSERT_EQ(map.canonical(), Specs(canonical));
    for (const Run& run : map.runs()) {
      const Tensor& local = e.shards[m][run.local];
      for (uint64_t i = 0; i < run.count; ++i) {
        for (uint64_t k = 0; k < run.len; ++k) {
          const uint64_t src = run.src + i * run.src_stride + k;
          const uint64_t dst = run.dst + i * run.dst_stride + k;
          ASSERT_LT(src, local.values.size());
          ASSERT_LT(dst, rebuilt[run.canonical].size());
          rebuilt[run.canonical][dst] = local.values[src];
          hits[run.canonical][dst]++;
          auto p = map.ToCanonical(run.local, src);
          ASSERT_TRUE(p.has_value());
          EXPECT_EQ(p->canonical, run.canonical);
          EXPECT_EQ(p->element, dst);
        }
      }
    }
  }
  for (size_t c = 0; c < canonical.size(); ++c) {
    for (size_t i = 0; i < canonical[c].values.size(); ++i) {
      ASSERT_EQ(hits[c][i], 1) << canonical[c].spec.name << " element " << i;
      ASSERT_EQ(rebuilt[c][i], canonical[c].values[i]) << canonical[c].spec.name << " " << i;
    }
  }
  // Canonical -> shard: windows like partitions (odd size, so they cut rows).
  for (size_t c = 0; c < canonical.size(); ++c) {
    const uint64_t n = canonical[c].values.size();
    for (uint64_t begin = 0; begin < n; begin += 37) {
      const uint64_t end = std::min(n, begin + 37);
      uint64_t covered = 0;
      for (size_t m = 0; m < e.maps.size(); ++m) {
        for (const Run& piece : e.maps[m].ShardPieces(static_cast<uint32_t>(c), begin, end)) {
          for (uint64_t i = 0; i < piece.count; ++i) {
            for (uint64_t k = 0; k < piece.len; ++k) {
              const uint64_t dst = piece.dst + i * piece.dst_stride + k;
              ASSERT_GE(dst, begin);
              ASSERT_LT(dst, end);
              EXPECT_EQ(e.shards[m][piece.local].values[piece.src + i * piece.src_stride + k],
                        canonical[c].values[dst]);
              ++covered;
            }
          }
        }
      }
      ASSERT_EQ(covered, end - begin) << canonical[c].spec.name << " [" << begin << ", " << end;
    }
  }
}

TEST(PlacementIota, ColumnRowQkvGateUpReplicatedPipelineAndData) {
  Job j;  // kv_heads 4 >= tp 2: whole groups per rank
  j.tp = 2;
  j.pp = 2;
  j.dp = 2;
  CheckIota(j);
}

TEST(PlacementIota, FusedQkvIsThreeStridedRunsAndRowSplitOne) {
  Job j;
  j.heads = 8;
  j.kv_heads = 4;  // 2 groups per rank at tp 2
  j.tp = 2;
  const auto canonical = testing::CanonicalTensors(j);
  Expanded e = ExpandAll(j, canonical);
  const PlacementMap& map = e.maps[1];
  for (uint32_t t = 0; t < map.locals().size(); ++t) {
    const std::string& name = map.locals()[t].spec.name;
    if (name == "decoder.layers.0.self_attention.linear_qkv.weight") {
      ASSERT_EQ(map.RunsOf(t).size(), 3u);
      for (const auto& r : map.RunsOf(t)) EXPECT_EQ(r.count, 2u);
    }
    if (name == "decoder.layers.0.self_attention.linear_proj.weight") {
      ASSERT_EQ(map.RunsOf(t).size(), 1u);
      EXPECT_EQ(map.RunsOf(t)[0].count, j.hidden);
    }
  }
}

TEST(PlacementIota, FusedQkvWithFewerGroupsThanRanks) {
  Job j;
  j.heads = 8;
  j.kv_heads = 2;
  j.tp = 4;  // each rank holds part of one group: up to 3 runs
  j.ffn = 32;
  j.hidden = 32;
  CheckIota(j);
}

TEST(PlacementIota, PaddedVocabularyIsClipped) {
  Job j;
  j.vocab = 50;  // padded to 64 over tp 2 with multiple 8 * 2
  j.pad = 8;
  j.tp = 2;
  CheckIota(j);
  j.vocab = 37;
  j.tp =
      4;  // the last rank holds only padding rows beyond 37? 37 -> 64, per 16: rank 2 rows 32..36
  CheckIota(j);
}

TEST(PlacementIota, GatheredResidualHasOneHolder) {
  Job j;
  j.gathered = true;
  j.tp = 2;
  j.pp = 2;
  j.dp = 2;
  CheckIota(j);
  // The holder's map marks it residual: it is never a projection of bits.
  const auto canonical = testing::CanonicalTensors(j);
  Expanded e = ExpandAll(j, canonical);
  bool found = false;
  for (const auto& m : e.maps) {
    for (const auto& t : m.locals()) {
      if (t.spec.name == "gathered.rope.scale" && t.role == Role::kGathered) found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(PlacementIota, TiedEmbeddingsHaveOneOwner) {
  Job j;
  j.tied = true;
  j.tp = 2;
  j.pp = 2;
  CheckIota(j);
}

TEST(PlacementIota, ExpertParallelPerExpertTensors) {
  Job j;
  j.experts = 4;
  j.ep = 2;
  j.tp = 2;
  j.pp = 2;
  CheckIota(j);
}

TEST(PlacementIota, ExpertParallelStackedTensors) {
  Job j;
  j.experts = 4;
  j.ep = 2;
  j.stacked_down = true;
  j.dp = 2;
  CheckIota(j);
}

TEST(PlacementIota, Fsdp2DimZeroChunks) {
  Job j;
  j.fsdp2 = true;
  j.dp = 3;  // uneven chunks
  j.hidden = 20;
  j.vocab = 13;
  CheckIota(j);
}

TEST(PlacementIota, FlatBufferOwnedRanges) {
  Job j;
  j.flat = true;
  j.dp = 3;
  j.flat_align = 4;
  CheckIota(j);
}

// ---- what a wrong layout says ----------------------------------------------

Result<PlacementMap> ExpandRank0(const Job& j, const std::string& toml) {
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  auto d = ParseLayout(toml, "bad.toml");
  if (!d.ok()) return d.status();
  return ExpandPlacement(*d, Specs(canonical), Specs(ref.Shard({})));
}

TEST(PlacementErrors, GapNamesTheTensor) {
  Job j;
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  std::string toml = ref.LayoutToml({});
  // Drop the row-split rule of o_proj: the local tensor is unmatched (not guessed),
  // and coverage names the canonical tensor left out.
  const std::string rule =
      "\n[[tensor]]\nlocal = \"decoder.layers.{layer}.self_attention.linear_proj.weight\"\nkind = "
      "\"row\"\ncanonical = [\"model.layers.{layer}.self_attn.o_proj.weight\"]\n";
  ASSERT_NE(toml.find(rule), std::string::npos);
  toml.erase(toml.find(rule), rule.size());
  auto map = ExpandRank0(j, toml);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  bool unmatched = false;
  for (const auto& t : map->locals()) unmatched |= t.role == Role::kUnmatched;
  EXPECT_TRUE(unmatched);
  const PlacementMap* maps[] = {&*map};
  Status s = CheckCoverage(maps);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.layers.0.self_attn.o_proj.weight"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("covered by no rank"), std::string::npos) << s.message();
}

TEST(PlacementErrors, OverlapNamesTensorAndBothRules) {
  Job j;
  j.tied = true;
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  std::string toml = ref.LayoutToml({});
  // A tied copy declared as a second owner.
  const std::string tied = "kind = \"tied\"";
  toml.replace(toml.find(tied), tied.size(), "kind = \"column\"");
  auto map = ExpandRank0(j, toml);
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("'model.embed_tokens.weight'"), std::string::npos)
      << map.status().message();
  EXPECT_NE(map.status().message().find("covered twice"), std::string::npos);
  EXPECT_NE(map.status().message().find("rule at line"), std::string::npos);
}

TEST(PlacementErrors, CrossRankOverlap) {
  // Two ranks both claiming the same replicated tensor: coverage names both.
  Job j;
  j.tp = 2;
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  std::vector<PlacementMap> maps;
  for (uint64_t r = 0; r < 2; ++r) {
    std::string toml = ref.LayoutToml({r, 0, 0, 0});
    // Every rank thinks it is tp rank 0 for the norm: declare it column-split of 1.
    auto d = ParseLayout(toml, "rank" + std::to_string(r) + ".toml");
    ASSERT_TRUE(d.ok());
    d->mesh.tp = 2;
    for (auto& rule : d->rules) {
      if (rule.kind == Kind::kReplicated) rule.kind = Kind::kGathered;  // no scanner choice
    }
    auto m = ExpandPlacement(*d, Specs(canonical), Specs(ref.Shard({r, 0, 0, 0})));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    maps.push_back(std::move(*m));
  }
  const PlacementMap* ptrs[] = {&maps[0], &maps[1]};
  Status s = CheckCoverage(ptrs);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("covered twice"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank0.toml"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank1.toml"), std::string::npos) << s.message();
  // The same verdict from the ranks' canonical runs alone (what a root has), with
  // the names it gives them.
  const CanonicalRuns runs[] = {CanonicalRunsOf(maps[0], "producer a: " + maps[0].name()),
                                CanonicalRunsOf(maps[1], "producer b: " + maps[1].name())};
  Status from_runs = CheckCoverage(maps[0].canonical(), runs);
  ASSERT_FALSE(from_runs.ok());
  EXPECT_NE(from_runs.message().find("covered twice"), std::string::npos) << from_runs.message();
  EXPECT_NE(from_runs.message().find("producer b: rank1.toml"), std::string::npos)
      << from_runs.message();
}

TEST(PlacementErrors, CanonicalRunsFromAnotherProcessMustLieInsideTheirTensor) {
  Job j;
  j.tp = 2;
  const auto canonical = testing::CanonicalTensors(j);
  Expanded e = ExpandAll(j, canonical);
  std::vector<CanonicalRuns> ranks;
  for (size_t r = 0; r < e.maps.size(); ++r) {
    ranks.push_back(CanonicalRunsOf(e.maps[r], "rank " + std::to_string(r)));
  }
  ASSERT_EQ(ranks.size(), 2u);
  const auto& specs = e.maps[0].canonical();
  ASSERT_TRUE(CheckCoverage(specs, ranks).ok()) << CheckCoverage(specs, ranks).ToString();
  // A peer's run that reaches past its tensor, or rows that overlap each other, is
  // refused naming the rank, before any row is expanded.
  for (int damage = 0; damage < 3; ++damage) {
    auto bad = ranks;
    layout::Run& run = bad[1].runs[0];
    if (damage == 0) run.dst = specs[run.canonical].ElementCount();
    if (damage == 1) run.canonical = static_cast<uint32_t>(specs.size());
    if (damage == 2) {
      run.count = 2;
      run.dst_stride = run.len == 1 ? 0 : run.len - 1;
    }
    Status s = CheckCoverage(specs, bad);
    ASSERT_FALSE(s.ok()) << "damage " << damage;
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  }
}

TEST(PlacementErrors, WrongShapeNamesRuleAndShapes) {
  Job j;
  j.tp = 2;
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  std::string toml = ref.LayoutToml({});
  // Claim tp = 1 while the shard was cut for tp = 2.
  toml.replace(toml.find("tp = 2"), 6, "tp = 1");
  auto d = ParseLayout(toml, "bad.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto map = ExpandPlacement(*d, Specs(canonical), Specs(ref.Shard({})));
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("bad.toml:"), std::string::npos);
  EXPECT_NE(map.status().message().find("has shape"), std::string::npos) << map.status().message();
}

TEST(PlacementErrors, DtypeChangeWithoutValueTransformIsRefused) {
  std::vector<TensorSpec> canonical = {{"norm.weight", DType::kBF16, {8}}};
  std::vector<TensorSpec> local = {{"norm_zc", DType::kF32, {8}}};
  const std::string base =
      "[layout]\ncanonical = \"c.json\"\n[model]\nhidden = 8\nheads = 1\nkv_heads = 1\n"
      "head_dim = 8\nlayers = 1\n[mesh]\n[rank]\ntp = 0\npp = 0\ndp = 0\nep = 0\n"
      "[[tensor]]\nlocal = \"norm_zc\"\nkind = \"replicated\"\ncanonical = \"norm.weight\"\n";
  auto d = ParseLayout(base, "n.toml");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto map = ExpandPlacement(*d, canonical, local);
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("residual"), std::string::npos);
  auto d2 = ParseLayout(base + "value = \"add_one\"\n", "n.toml");
  ASSERT_TRUE(d2.ok()) << d2.status().ToString();
  auto map2 = ExpandPlacement(*d2, canonical, local);
  ASSERT_TRUE(map2.ok()) << map2.status().ToString();
  EXPECT_EQ(map2->locals()[0].role, Role::kResidual);
  ASSERT_EQ(map2->runs().size(), 1u);
  EXPECT_EQ(map2->runs()[0].value, Value::kAddOne);
}

TEST(PlacementErrors, UnknownCanonicalNameIsNamed) {
  Job j;
  const auto canonical = testing::CanonicalTensors(j);
  Reference ref(j, canonical);
  std::string toml = ref.LayoutToml({});
  toml.replace(toml.find("self_attn.o_proj.weight"), 23, "self_attn.out_proj.weight");
  auto map = ExpandRank0(j, toml);
  ASSERT_FALSE(map.ok());
  EXPECT_NE(map.status().message().find("model.layers.0.self_attn.out_proj.weight"),
            std::string::npos)
      << map.status().message();
  EXPECT_NE(map.status().message().find("canonical table does not have"), std::string::npos);
}

TEST(Runs, ClipRowsCutsPartialFirstAndLastRows) {
  // Rows of 4 every 10, 5 rows: [0,4) [10,14) [20,24) [30,34) [40,44); clip [2, 32).
  auto pieces = ClipRows(0, 10, 4, 5, 2, 32);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].first_row, 0u);
  EXPECT_EQ(pieces[0].offset, 2u);
  EXPECT_EQ(pieces[0].len, 2u);
  EXPECT_EQ(pieces[1].first_row, 1u);
  EXPECT_EQ(pieces[1].rows, 2u);
  EXPECT_EQ(pieces[2].first_row, 3u);
  EXPECT_EQ(pieces[2].len, 2u);
  EXPECT_TRUE(ClipRows(0, 10, 4, 5, 4, 10).empty());  // between rows
  EXPECT_EQ(ClipRows(0, 10, 4, 5, 0, 100).size(), 1u);
}

TEST(Runs, CoalesceMergesStridedAndContiguousRows) {
  std::vector<StridedRun> runs;
  for (uint64_t i = 0; i < 4; ++i) {
    StridedRun r;
    r.src = i * 8;
    r.dst = 100 + i * 20;
    r.count = 1;
    r.len = 8;
    runs.push_back(r);
  }
  Coalesce(runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 4u);
  EXPECT_EQ(runs[0].src_stride, 8u);
  EXPECT_EQ(runs[0].dst_stride, 20u);
}

}  // namespace
}  // namespace deltacast::layout

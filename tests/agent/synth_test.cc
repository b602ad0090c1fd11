#include "agent/synth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "apply/safetensors.h"
#include "common/file_util.h"
#include "common/hash.h"
#include "tests/temp_dir.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;

// A scratch directory removed when the test ends.
SynthOptions SmallOptions(const fs::path& dir) {
  SynthOptions o;
  o.out_dir = dir;
  o.params = 3'000'000;
  o.steps = 2;
  o.change_rate = 0.03;
  o.seed = 7;
  o.threads = 2;
  return o;
}

std::vector<fs::path> ShardFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

nlohmann::json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Hash of every file in a step directory, by name.
std::map<std::string, std::string> HashDir(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    auto bytes = ReadFile(e.path());
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    out[e.path().filename().string()] = Hash128(*bytes).ToHex();
  }
  return out;
}

// All BF16 values of a step, in canonical tensor order.
std::vector<uint16_t> LoadStep(const fs::path& dir) {
  std::map<std::string, std::vector<uint16_t>> by_name;
  for (const auto& file : ShardFiles(dir)) {
    auto header = apply::ReadSafetensorsHeader(file);
    EXPECT_TRUE(header.ok()) << header.status().ToString();
    auto bytes = ReadFile(file);
    EXPECT_TRUE(bytes.ok());
    for (const auto& e : header->entries) {
      std::vector<uint16_t> v((e.data_end - e.data_begin) / 2);
      std::memcpy(v.data(), bytes->data() + header->data_section_offset + e.data_begin,
                  v.size() * 2);
      by_name[e.info.name] = std::move(v);
    }
  }
  std::vector<uint16_t> all;
  for (auto& [name, v] : by_name) all.insert(all.end(), v.begin(), v.end());
  return all;
}

TEST(ParseParamCountTest, AcceptsSuffixesAndPlainCounts) {
  EXPECT_EQ(*ParseParamCount("500M"), 500'000'000u);
  EXPECT_EQ(*ParseParamCount("1.5B"), 1'500'000'000u);
  EXPECT_EQ(*ParseParamCount("7b"), 7'000'000'000u);
  EXPECT_EQ(*ParseParamCount("2000000"), 2'000'000u);
  EXPECT_EQ(*ParseParamCount("750k"), 750'000u);
  EXPECT_EQ(*ParseParamCount("2m"), 2'000'000u);
  EXPECT_EQ(*ParseParamCount("1T"), 1'000'000'000'000u);
  EXPECT_EQ(*ParseParamCount(" 3M "), 3'000'000u);
  EXPECT_EQ(*ParseParamCount("0.3B"), 300'000'000u);
  EXPECT_EQ(*ParseParamCount("1.1b"), 1'100'000'000u);
}

TEST(ParseParamCountTest, RejectsGarbage) {
  for (const char* bad : {"", "M", "abc", "-5M", "1.5", "5X", "5MB", "1e9", "inf", "nan", "0",
                          "1..5B", "1.2.3M", "0.0000001k"}) {
    auto r = ParseParamCount(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(ParseRateTest, AcceptsFractionsAndPercentages) {
  EXPECT_DOUBLE_EQ(*ParseRate("3%"), 0.03);
  EXPECT_DOUBLE_EQ(*ParseRate("0.03"), 0.03);
  EXPECT_DOUBLE_EQ(*ParseRate("12.5%"), 0.125);
  EXPECT_DOUBLE_EQ(*ParseRate(".1"), 0.1);
  EXPECT_DOUBLE_EQ(*ParseRate("0"), 0.0);
}

TEST(ParseRateTest, RejectsGarbage) {
  for (const char* bad : {"", "%", "-1%", "abc", "3%%", "150%", "1.5", "3 %x", "nan", "1e-2"}) {
    EXPECT_FALSE(ParseRate(bad).ok()) << "'" << bad << "'";
  }
}

TEST(FloatToBf16Test, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between 0x3f80 and 0x3f81: ties go to even.
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  // A NaN whose payload sits only in the low bits must not turn into infinity.
  const uint16_t nan = FloatToBf16(std::bit_cast<float>(0x7f800001u));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0xffffffffu)), 0xffff);
}

TEST(SynthTest, WritesValidShardedCheckpointsWithIdenticalLayouts) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  auto report = Synthesize(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();

  EXPECT_NEAR(static_cast<double>(report->params), 3e6, 3e6 * 0.03);
  EXPECT_GE(report->layers, 2);
  EXPECT_GE(report->shards, 2);
  ASSERT_EQ(report->measured_change_rate.size(), 2u);
  ASSERT_EQ(report->step_stats.size(), 2u);

  // The Llama tensor set, with GQA-capable k/v shapes and untied lm_head.
  std::map<std::string, TensorSpec> tensors;
  uint64_t params = 0;
  for (const auto& t : report->tensors) {
    tensors[t.name] = t;
    params += t.ElementCount();
    EXPECT_EQ(t.dtype, DType::kBF16);
  }
  EXPECT_EQ(params, report->params);
  const uint64_t h = report->hidden;
  ASSERT_TRUE(tensors.count("model.embed_tokens.weight"));
  EXPECT_EQ(tensors["model.embed_tokens.weight"].shape, (std::vector<uint64_t>{report->vocab, h}));
  EXPECT_EQ(tensors["lm_head.weight"].shape, (std::vector<uint64_t>{report->vocab, h}));
  EXPECT_EQ(tensors["model.norm.weight"].shape, (std::vector<uint64_t>{h}));
  for (int i = 0; i < report->layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      EXPECT_TRUE(tensors.count(p + n)) << p + n;
    }
    EXPECT_EQ(tensors[p + "mlp.down_proj.weight"].shape,
              (std::vector<uint64_t>{h, report->intermediate}));
    EXPECT_EQ(tensors[p + "self_attn.k_proj.weight"].shape[1], h);
  }
  EXPECT_EQ(tensors.size(), 3u + 9u * report->layers);

  std::vector<apply::SafetensorsHeader> step0_headers;
  std::vector<std::vector<std::byte>> step0_header_bytes;
  for (int k = 0; k <= o.steps; ++k) {
    const fs::path dir = tmp.path() / ("step" + std::to_string(k));
    const auto files = ShardFiles(dir);
    ASSERT_EQ(static_cast<int>(files.size()), report->shards);
    for (size_t f = 0; f < files.size(); ++f) {
      char expected[64];
      std::snprintf(expected, sizeof(expected), "model-%05zu-of-%05d.safetensors", f + 1,
                    report->shards);
      EXPECT_EQ(files[f].filename().string(), expected);
    }

    // The index maps every tensor to the file that holds it.
    const nlohmann::json index = ReadJson(dir / "model.safetensors.index.json");
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 2 * report->params);
    EXPECT_EQ(index["weight_map"].size(), tensors.size());
    std::map<std::string, std::string> seen;
    uint64_t bytes = 0;
    for (size_t f = 0; f < files.size(); ++f) {
      auto header = apply::ReadSafetensorsHeader(files[f]);
      ASSERT_TRUE(header.ok()) << header.status().ToString();
      EXPECT_EQ(header->metadata.at("format"), "pt");
      EXPECT_EQ(fs::file_size(files[f]),
                header->data_section_offset + header->entries.back().data_end);
      bytes += fs::file_size(files[f]);
      for (const auto& e : header->entries) {
        EXPECT_EQ(e.info, tensors[e.info.name]);
        seen[e.info.name] = files[f].filename().string();
      }
      // Same header bytes in every step: only tensor data may differ.
      auto file = ReadFile(files[f]);
      ASSERT_TRUE(file.ok());
      std::vector<std::byte> head(file->begin(), file->begin() + header->data_section_offset);
      if (k == 0) {
        step0_header_bytes.push_back(head);
      } else {
        EXPECT_EQ(head, step0_header_bytes[f]) << files[f];
      }
    }
    EXPECT_EQ(bytes, report->bytes_per_checkpoint);
    ASSERT_EQ(seen.size(), tensors.size());
    for (const auto& [name, file] : seen) EXPECT_EQ(index["weight_map"][name], file) << name;

    const nlohmann::json config = ReadJson(dir / "config.json");
    EXPECT_EQ(config["hidden_size"].get<uint64_t>(), h);
    EXPECT_EQ(config["num_hidden_layers"].get<int>(), report->layers);
    EXPECT_EQ(config["vocab_size"].get<uint64_t>(), report->vocab);
  }
}

TEST(SynthTest, SameSeedSameBytesOnAnyThreadCount) {
  test_util::TempDir a{"synth_test"}, b{"synth_test"}, c{"synth_test"};
  SynthOptions o = SmallOptions(a.path());
  o.threads = 1;
  ASSERT_TRUE(Synthesize(o).ok());
  o.out_dir = b.path();
  o.threads = 3;
  auto rb = Synthesize(o);
  ASSERT_TRUE(rb.ok());
  o.out_dir = c.path();
  o.seed = 8;
  ASSERT_TRUE(Synthesize(o).ok());
  for (int k = 0; k <= o.steps; ++k) {
    const std::string step = "step" + std::to_string(k);
    const auto ha = HashDir(a.path() / step);
    EXPECT_EQ(ha, HashDir(b.path() / step)) << step;
    // Another seed changes every shard but no header.
    const auto hc = HashDir(c.path() / step);
    for (const auto& [name, hash] : ha) {
      if (name.ends_with(".safetensors")) {
        EXPECT_NE(hash, hc.at(name)) << name;
      } else {
        EXPECT_EQ(hash, hc.at(name)) << name;
      }
    }
  }
}

TEST(SynthTest, OverwritesAnEarlierRunAndDropsItsStaleShards) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  o.max_shard_bytes = 1 << 20;  // many small shards
  auto first = Synthesize(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  o.max_shard_bytes = 0;
  auto second = Synthesize(o);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_GT(first->shards, second->shards);
  EXPECT_EQ(static_cast<int>(ShardFiles(tmp.path() / "step1").size()), second->shards);
  test_util::TempDir fresh{"synth_test"};
  o.out_dir = fresh.path();
  ASSERT_TRUE(Synthesize(o).ok());
  EXPECT_EQ(HashDir(tmp.path() / "step1"), HashDir(fresh.path() / "step1"));
}

TEST(SynthTest, ValuesDoNotDependOnSharding) {
  test_util::TempDir a{"synth_test"}, b{"synth_test"};
  SynthOptions o = SmallOptions(a.path());
  o.steps = 1;
  ASSERT_TRUE(Synthesize(o).ok());
  o.out_dir = b.path();
  o.max_shard_bytes = 1 << 20;
  ASSERT_TRUE(Synthesize(o).ok());
  EXPECT_EQ(LoadStep(a.path() / "step1"), LoadStep(b.path() / "step1"));
}

// Measures what the files hold (not what the report says) and checks both.
void ExpectChangeRate(double target) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  o.params = 4'000'000;
  o.change_rate = target;
  o.steps = 2;
  auto report = Synthesize(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GT(report->lr, 0);
  std::vector<uint16_t> prev = LoadStep(tmp.path() / "step0");
  ASSERT_EQ(prev.size(), report->params);
  for (int k = 1; k <= o.steps; ++k) {
    const std::vector<uint16_t> cur = LoadStep(tmp.path() / ("step" + std::to_string(k)));
    ASSERT_EQ(cur.size(), prev.size());
    uint64_t changed = 0;
    for (size_t i = 0; i < cur.size(); ++i) changed += cur[i] != prev[i];
    const double rate = static_cast<double>(changed) / static_cast<double>(cur.size());
    EXPECT_NEAR(rate, target, 0.1 * target) << "step " << k;
    EXPECT_EQ(report->step_stats[k - 1].changed, changed);
    EXPECT_DOUBLE_EQ(report->measured_change_rate[k - 1], rate);
    prev = cur;
  }
}

TEST(SynthTest, CalibratedChangeRateThreePercent) { ExpectChangeRate(0.03); }
TEST(SynthTest, CalibratedChangeRateTenPercent) { ExpectChangeRate(0.10); }

TEST(SynthTest, ExplicitLearningRateIsUsed) {
  test_util::TempDir a{"synth_test"}, b{"synth_test"};
  SynthOptions o = SmallOptions(a.path());
  o.steps = 1;
  o.lr = 1e-6;
  auto low = Synthesize(o);
  ASSERT_TRUE(low.ok());
  EXPECT_EQ(low->lr, 1e-6);
  o.out_dir = b.path();
  o.lr = 1e-5;
  auto high = Synthesize(o);
  ASSERT_TRUE(high.ok());
  EXPECT_GT(high->measured_change_rate[0], 3 * low->measured_change_rate[0]);
}

// The shape of real BF16 step deltas (TOOLCHAIN-NOTES.md): mostly one-ULP moves,
// low-bit carry-run XOR values, rare sign flips, and Adam's direction persistence.
TEST(SynthTest, StepStatisticsLookLikeRealTraining) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  o.params = 4'000'000;
  o.steps = 3;
  auto report = Synthesize(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  for (int k = 1; k <= o.steps; ++k) {
    const SynthStepStats& s = report->step_stats[k - 1];
    const double changed = static_cast<double>(s.changed);
    EXPECT_GT(s.one_ulp / changed, 0.80) << "step " << k;
    EXPECT_GT(s.xor_low_run / changed, 0.75) << "step " << k;
    EXPECT_LT(s.sign_flips / changed, 0.005) << "step " << k;
    if (k >= 2) {
      const double p_repeat = s.repeats / static_cast<double>(s.prev_changed);
      const double p_fresh =
          (changed - s.repeats) / static_cast<double>(report->params - s.prev_changed);
      EXPECT_GT(p_repeat, 4 * p_fresh) << "step " << k;
      EXPECT_GT(s.repeats_same_direction / static_cast<double>(s.repeats), 0.85);
    }
  }
}

TEST(SynthTest, RejectsBadOptionsBeforeWriting) {
  test_util::TempDir tmp{"synth_test"};
  auto expect_invalid = [&](SynthOptions o, const char* what) {
    auto r = Synthesize(o);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_FALSE(r.status().message().empty());
  };
  SynthOptions o = SmallOptions(tmp.path() / "out");
  SynthOptions bad = o;
  bad.params = 1000;
  expect_invalid(bad, "tiny params");
  bad = o;
  bad.params = 10'000'000'000'000;
  expect_invalid(bad, "huge params");
  bad = o;
  bad.steps = 0;
  expect_invalid(bad, "no steps");
  bad = o;
  bad.change_rate = 0.9;
  expect_invalid(bad, "change rate too high");
  bad = o;
  bad.change_rate = 0.0001;
  expect_invalid(bad, "change rate too low");
  bad = o;
  bad.lr = -1;
  expect_invalid(bad, "negative lr");
  bad = o;
  bad.embedding_share = 0.9;
  expect_invalid(bad, "embedding share too high");
  bad = o;
  bad.out_dir.clear();
  expect_invalid(bad, "no directory");
  EXPECT_FALSE(fs::exists(tmp.path() / "out"));

  // An explicit lr makes the change rate irrelevant.
  bad = o;
  bad.change_rate = 0.9;
  bad.lr = 1e-6;
  bad.steps = 1;
  EXPECT_TRUE(Synthesize(bad).ok());
}

TEST(SynthTest, UnwritableDirectoryIsAnIoError) {
  test_util::TempDir tmp{"synth_test"};
  // A regular file where the output directory should be.
  const fs::path file = tmp.path() / "file";
  ASSERT_TRUE(WriteFile(file, AsBytes("x")).ok());
  SynthOptions o = SmallOptions(file / "out");
  auto r = Synthesize(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("file"), std::string::npos) << r.status().ToString();
}

TEST(SynthTest, TinyModelsStillHaveTwoLayersAndTwoFiles) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  o.params = kMinSynthParams;
  o.steps = 1;
  auto r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(r->layers, 2);
  EXPECT_GE(r->shards, 2);
  EXPECT_NEAR(static_cast<double>(r->params), 1e6, 0.05e6);
}

// A small model with a large one's proportions: embeddings and LM head take the share
// asked for, and the parameter count stays on target.
TEST(SynthTest, EmbeddingShareSetsTheVocabulary) {
  test_util::TempDir tmp{"synth_test"};
  SynthOptions o = SmallOptions(tmp.path());
  o.params = 20'000'000;
  o.steps = 1;
  o.embedding_share = 0.03;
  auto r = Synthesize(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double share = 2.0 * static_cast<double>(r->vocab * r->hidden) / r->params;
  EXPECT_NEAR(share, 0.03, 0.006) << "vocab " << r->vocab << " hidden " << r->hidden;
  EXPECT_NEAR(static_cast<double>(r->params), 20e6, 0.02 * 20e6);
}

}  // namespace
}  // namespace deltacast::agent

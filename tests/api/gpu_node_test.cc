// Node::StartOnGpus through libdeltacast.so: an engine whose two GPUs hold a
// Megatron-style TP = 2 layout of the model (fused QKV and gate/up, vocabulary-
// parallel embedding, replicated norms) receives a published step next to a plain
// host node; both end bit-exact. The GPUs here are host memories (device = -1), as on
// machines without one; the same path drives CUDA memories (deltacast_gpu_tests).
// The shards come from tests/layout/reference.h, independent of deltacast's layout code.
#include <deltacast/deltacast.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "tests/layout/reference.h"

namespace {

namespace fs = std::filesystem;
using deltacast::layout::testing::Job;
using deltacast::layout::testing::Rank;
using deltacast::layout::testing::Reference;
using Tensors = std::vector<deltacast::layout::testing::Tensor>;

std::string Toml(int base_port) {
  return "[cluster]\nname = \"gpus\"\n[tree]\nconnect_timeout = \"3s\"\n"
         "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base_port) +
         "\nrole = \"source\"\n[[node]]\nid = \"engine\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base_port + 3) +
         "\n[[node]]\nid = \"plain\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base_port + 6) + "\n";
}

int BasePort() { return 31400 + static_cast<int>(::getpid() % 300) * 10; }

std::vector<deltacast::TensorView> Views(Tensors& tensors) {
  std::vector<deltacast::TensorView> v;
  for (auto& t : tensors) {
    v.push_back({{t.spec.name, t.spec.dtype, t.spec.shape},
                 std::span<std::byte>(reinterpret_cast<std::byte*>(t.values.data()),
                                      t.values.size() * sizeof(int64_t))});
  }
  return v;
}

TEST(ApiGpuNode, AnEngineOnTwoGpusReceivesAStepBitExact) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = fs::path(::testing::TempDir()) / ("gpu_node_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Job job;
  job.tp = 2;
  job.layers = 2;
  job.hidden = 64;
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  {
    std::ofstream table(dir / "canonical.json");
    table << "{\"tensors\": [";
    for (size_t i = 0; i < trainer.size(); ++i) {
      table << (i ? ", " : "") << "{\"name\": \"" << trainer[i].spec.name
            << "\", \"dtype\": \"I64\", \"shape\": [";
      for (size_t d = 0; d < trainer[i].spec.shape.size(); ++d)
        table << (d ? ", " : "") << trainer[i].spec.shape[d];
      table << "]}";
    }
    table << "]}\n";
  }
  // The engine's parameters: each GPU's shard of the current version.
  Reference ref(job, trainer);
  std::vector<Tensors> engine;
  std::vector<deltacast::GpuWeights> gpus;
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const fs::path layout = dir / ("rank" + std::to_string(tp) + ".toml");
    std::ofstream(layout) << ref.LayoutToml(Rank{tp, 0, 0, 0});
    engine.push_back(ref.Shard(Rank{tp, 0, 0, 0}));
  }
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    gpus.push_back({-1, dir / ("rank" + std::to_string(tp) + ".toml"), Views(engine[tp])});
  }
  Tensors plain = trainer;

  auto config = deltacast::Config::Parse(Toml(BasePort()), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  deltacast::NodeOptions options;
  options.token = "gpu-token";
  options.apply_threads = 1;
  options.node_id = "engine";
  auto engine_node = deltacast::Node::StartOnGpus(*config, options, gpus);
  ASSERT_TRUE(engine_node.ok()) << engine_node.status().ToString();
  options.node_id = "plain";
  auto plain_node = deltacast::Node::Start(*config, options, Views(plain));
  ASSERT_TRUE(plain_node.ok()) << plain_node.status().ToString();

  deltacast::SourceOptions source_options;
  source_options.token = "gpu-token";
  auto source = deltacast::Source::Start(*config, source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  Tensors previous = trainer;
  std::mt19937_64 rng(17);
  for (auto& t : trainer) {
    for (auto& v : t.values) {
      if (rng() % 30 == 0) v ^= static_cast<int64_t>(rng() | 1);
    }
  }
  auto report = (*source)->Publish(Views(previous), Views(trainer));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ((*engine_node)->stats().version, report->target_version);

  Reference want(job, trainer);
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const Tensors shard = want.Shard(Rank{tp, 0, 0, 0});
    ASSERT_EQ(shard.size(), engine[tp].size());
    for (size_t l = 0; l < shard.size(); ++l) {
      EXPECT_EQ(engine[tp][l].values, shard[l].values) << "GPU " << tp << " " << shard[l].spec.name;
    }
  }
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].values, trainer[i].values);
  (*source)->Stop();
  (*engine_node)->Stop();
  (*plain_node)->Stop();
  fs::remove_all(dir);
}

}  // namespace

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
#include <thread>

#include "tests/layout/engine_reference.h"
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

// Below the kernel's ephemeral range (32768+), where an outgoing connection may hold
// the port, and apart from the other tests' ranges.
int BasePort() { return 12000 + static_cast<int>(::getpid() % 300) * 10; }

std::vector<deltacast::TensorView> Views(Tensors& tensors) {
  std::vector<deltacast::TensorView> v;
  for (auto& t : tensors) {
    v.push_back({{t.spec.name, t.spec.dtype, t.spec.shape},
                 std::span<std::byte>(reinterpret_cast<std::byte*>(t.values.data()),
                                      t.values.size() * sizeof(int64_t))});
  }
  return v;
}

// The canonical table file the layouts name.
void WriteCanonicalTable(const fs::path& path, const Tensors& tensors) {
  std::ofstream table(path);
  table << "{\"tensors\": [";
  for (size_t i = 0; i < tensors.size(); ++i) {
    table << (i ? ", " : "") << "{\"name\": \"" << tensors[i].spec.name
          << "\", \"dtype\": \"I64\", \"shape\": [";
    for (size_t d = 0; d < tensors[i].spec.shape.size(); ++d)
      table << (d ? ", " : "") << tensors[i].spec.shape[d];
    table << "]}";
  }
  table << "]}\n";
}

// The engine: each GPU's shard of `canonical` in `engine` (its parameters), one
// layout file per GPU in `dir`; the "GPUs" are host memory (device -1).
std::vector<deltacast::GpuWeights> EngineGpus(const fs::path& dir, const Job& job,
                                              const Tensors& canonical,
                                              std::vector<Tensors>& engine) {
  Reference ref(job, canonical);
  engine.clear();
  for (uint64_t tp = 0; tp < job.tp; ++tp) engine.push_back(ref.Shard(Rank{tp, 0, 0, 0}));
  std::vector<deltacast::GpuWeights> gpus;
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const fs::path layout = dir / ("rank" + std::to_string(tp) + ".toml");
    std::ofstream(layout) << ref.LayoutToml(Rank{tp, 0, 0, 0});
    gpus.push_back({-1, layout, Views(engine[tp])});
  }
  return gpus;
}

// Every GPU of the engine holds its shard of `canonical`.
void ExpectShards(const Job& job, const Tensors& canonical, const std::vector<Tensors>& engine) {
  Reference want(job, canonical);
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const Tensors shard = want.Shard(Rank{tp, 0, 0, 0});
    ASSERT_EQ(shard.size(), engine[tp].size());
    for (size_t l = 0; l < shard.size(); ++l) {
      EXPECT_EQ(engine[tp][l].values, shard[l].values) << "GPU " << tp << " " << shard[l].spec.name;
    }
  }
}

// ~3 % of the elements change their bits.
void TrainingStep(Tensors& tensors, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& t : tensors) {
    for (auto& v : t.values) {
      if (rng() % 30 == 0) v ^= static_cast<int64_t>(rng() | 1);
    }
  }
}

// The receivers: "engine" on the GPUs, "plain" over host tensors.
struct Fleet {
  std::unique_ptr<deltacast::Node> engine, plain;
  void Start(const deltacast::Config& config, const std::vector<deltacast::GpuWeights>& gpus,
             Tensors& plain_tensors) {
    deltacast::NodeOptions options;
    options.token = "gpu-token";
    options.apply_threads = 1;
    options.node_id = "engine";
    auto e = deltacast::Node::StartOnGpus(config, options, gpus);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine = std::move(*e);
    options.node_id = "plain";
    auto p = deltacast::Node::Start(config, options, Views(plain_tensors));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    plain = std::move(*p);
  }
  void Stop() {
    if (engine) engine->Stop();
    if (plain) plain->Stop();
  }
};

TEST(ApiGpuNode, AnEngineOnTwoGpusReceivesAStepBitExact) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = fs::path(::testing::TempDir()) / ("gpu_node_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Job job;
  job.tp = 2;
  job.layers = 2;
  job.hidden = 64;
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  // The engine's parameters: each GPU's shard of the current version.
  std::vector<Tensors> engine;
  const std::vector<deltacast::GpuWeights> gpus = EngineGpus(dir, job, trainer, engine);
  Tensors plain = trainer;

  auto config = deltacast::Config::Parse(Toml(BasePort()), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*config, gpus, plain));

  deltacast::SourceOptions source_options;
  source_options.token = "gpu-token";
  auto source = deltacast::Source::Start(*config, source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  Tensors previous = trainer;
  TrainingStep(trainer, 17);
  auto report = (*source)->Publish(Views(previous), Views(trainer));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_EQ(fleet.engine->stats().version, report->target_version);

  ExpectShards(job, trainer, engine);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].values, trainer[i].values);
  (*source)->Stop();
  fleet.Stop();
  fs::remove_all(dir);
}

// Both ends on GPUs: two producers (one serving from "GPU" memory through
// ServeFromGpu, one from host memory) make each version at a root, and the engine's
// two GPUs receive it. device = -1 runs the GPU path over host memory.
TEST(ApiGpuNode, ProducersServingFromGpuMemoryReachAnEngineOnGpus) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = fs::path(::testing::TempDir()) / ("gpu_prod_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Job job;
  job.tp = 2;
  job.layers = 2;
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  std::vector<Tensors> engine;
  const std::vector<deltacast::GpuWeights> gpus = EngineGpus(dir, job, trainer, engine);
  auto config = deltacast::Config::Parse(Toml(BasePort() + 1), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Tensors plain = trainer;
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*config, gpus, plain));

  deltacast::RootOptions root_options;
  root_options.token = "gpu-token";
  root_options.producers = 2;
  root_options.producer_address = "127.0.0.1:0";
  auto root = deltacast::Root::Start(*config, root_options);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  std::vector<deltacast::TensorSpec> model;
  for (const auto& t : trainer) model.push_back({t.spec.name, t.spec.dtype, t.spec.shape});

  Tensors previous = trainer;
  TrainingStep(trainer, 19);
  // Producer 0 owns the first half of the tensors (by name), producer 1 the rest.
  std::vector<deltacast::ProduceReport> produced(2);
  std::vector<std::thread> producers;
  for (int p = 0; p < 2; ++p) {
    producers.emplace_back([&, p] {
      deltacast::ProducerOptions o;
      o.token = "gpu-token";
      o.id = "rank-" + std::to_string(p);
      o.root_address = (*root)->producer_address();
      o.encode_threads = 1;
      auto producer = deltacast::Producer::Connect(*config, o, model);
      ASSERT_TRUE(producer.ok()) << producer.status().ToString();
      auto all_base = Views(previous), all_target = Views(trainer);
      const size_t half = all_base.size() / 2;
      const size_t from = p == 0 ? 0 : half, to = p == 0 ? half : all_base.size();
      std::vector<deltacast::TensorView> base(all_base.begin() + from, all_base.begin() + to);
      std::vector<deltacast::TensorView> target(all_target.begin() + from, all_target.begin() + to);
      auto report =
          p == 0 ? (*producer)->ServeFromGpu(-1, base, target) : (*producer)->Serve(base, target);
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      produced[p] = *report;
    });
  }
  auto report = (*root)->Publish();
  for (auto& t : producers) t.join();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;
  EXPECT_TRUE(produced[0].committed);
  EXPECT_GT(produced[0].changed_elements, 0u);

  ExpectShards(job, trainer, engine);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].values, trainer[i].values);
  (*root)->Stop();
  fleet.Stop();
  fs::remove_all(dir);
}

// The engine path as an embedder takes it: WriteEngineLayouts from the
// checkpoint's config.json (vLLM, tensor parallel 4, each of the 2 KV heads on two
// GPUs), the engine's own parameters (built by an independent sharder of vLLM's
// layout), Node::StartOnGpus, one published step: every GPU bit-exact.
TEST(ApiGpuNode, GeneratedVllmPlansTakeAStepOntoEveryGpu) {
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = fs::path(::testing::TempDir()) / ("gpu_vllm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  deltacast::layout::testing::EngineModel model;  // Qwen2-shaped: QKV biases
  const deltacast::layout::testing::EngineRun run{"vllm", 4, 1, 1};
  Tensors trainer = deltacast::layout::testing::EngineCanonical(model);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  std::ofstream(dir / "config.json") << model.ConfigJson();
  deltacast::EngineLayoutOptions options;
  options.config = dir / "config.json";
  options.canonical = dir / "canonical.json";
  options.out_dir = dir / "plans";
  options.tp = 4;
  auto plans = deltacast::WriteEngineLayouts(options);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  ASSERT_EQ(plans->size(), 4u);

  std::vector<Tensors> engine;
  std::vector<deltacast::GpuWeights> gpus;
  deltacast::layout::testing::EngineSharder base(model, run, trainer);
  for (uint64_t g = 0; g < 4; ++g) engine.push_back(base.Gpu(g));
  for (uint64_t g = 0; g < 4; ++g) gpus.push_back({-1, (*plans)[g], Views(engine[g])});

  auto config = deltacast::Config::Parse(Toml(BasePort() + 2), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Tensors plain = trainer;
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*config, gpus, plain));
  deltacast::SourceOptions source_options;
  source_options.token = "gpu-token";
  auto source = deltacast::Source::Start(*config, source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  Tensors previous = trainer;
  TrainingStep(trainer, 29);
  auto report = (*source)->Publish(Views(previous), Views(trainer));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_TRUE(report->committed) << report->abort_reason;

  deltacast::layout::testing::EngineSharder want(model, run, trainer);
  for (uint64_t g = 0; g < 4; ++g) {
    const Tensors shard = want.Gpu(g);
    for (size_t l = 0; l < shard.size(); ++l) {
      EXPECT_EQ(engine[g][l].values, shard[l].values) << "GPU " << g << " " << shard[l].spec.name;
    }
  }
  (*source)->Stop();
  fleet.Stop();
  fs::remove_all(dir);
}

}  // namespace

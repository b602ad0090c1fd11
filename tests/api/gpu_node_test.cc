// Node::StartOnGpus through libdeltacast.so: an engine whose two GPUs hold a
// Megatron-style TP = 2 layout of the model (fused QKV and gate/up, vocabulary-
// parallel embedding, replicated norms) receives published steps next to a plain
// host node; both end bit-exact, a piece torn behind the node's back is repaired, and
// a bad registration is refused with the weights untouched. Built twice: with the
// "GPUs" in host memory (device -1, deltacast_api_tests: what machines without a GPU
// run) and with them in CUDA device 0's memory (deltacast_gpu_api_tests, label
// `gpu`: two memories on one device; skipped without a device), where every tensor
// is copied back and compared with the reference.
// The shards come from tests/layout/reference.h, independent of deltacast's layout code.
#include <deltacast/deltacast.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "tests/layout/engine_reference.h"
#include "tests/layout/reference.h"

#if DELTACAST_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace {

// Where the engine's "GPUs" keep their parameters: -1 host memory, 0 CUDA device 0.
constexpr int kDevice = DELTACAST_TEST_DEVICE;

#if DELTACAST_TEST_CUDA
bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}
#define SKIP_WITHOUT_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device here"
#else
#define SKIP_WITHOUT_DEVICE()
#endif

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

// The engine's parameters: each GPU's shard, in host vectors (kDevice -1) or in
// device buffers (kDevice 0) that the engine, not deltacast, allocated.
class Engine {
 public:
  ~Engine() { Free(); }
  // Loads each GPU's shard of `canonical` and writes one layout file per GPU in `dir`.
  std::vector<deltacast::GpuWeights> Load(const fs::path& dir, const Job& job,
                                          const Tensors& canonical) {
    Free();
    Reference ref(job, canonical);
    for (uint64_t tp = 0; tp < job.tp; ++tp) host_.push_back(ref.Shard(Rank{tp, 0, 0, 0}));
    std::vector<deltacast::GpuWeights> gpus;
    for (uint64_t tp = 0; tp < job.tp; ++tp) {
      const fs::path layout = dir / ("rank" + std::to_string(tp) + ".toml");
      std::ofstream(layout) << ref.LayoutToml(Rank{tp, 0, 0, 0});
      gpus.push_back({kDevice, layout, Place(host_[tp])});
    }
    return gpus;
  }
  // Each GPU's parameters as they are now (copied back from the device).
  std::vector<Tensors> Now() {
    std::vector<Tensors> out = host_;
#if DELTACAST_TEST_CUDA
    size_t k = 0;
    for (auto& shard : out) {
      for (auto& t : shard) {
        EXPECT_EQ(cudaMemcpy(t.values.data(), device_[k++], t.values.size() * sizeof(int64_t),
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
    }
#endif
    return out;
  }
  // Flips bit 6 of element `element` of parameter `local` on GPU `gpu`, behind the
  // node's back (as a stray engine write would).
  void Flip(size_t gpu, size_t local, size_t element) {
#if DELTACAST_TEST_CUDA
    size_t k = local;
    for (size_t g = 0; g < gpu; ++g) k += host_[g].size();
    int64_t v = 0;
    auto* at = static_cast<std::byte*>(device_[k]) + element * sizeof(int64_t);
    ASSERT_EQ(cudaMemcpy(&v, at, sizeof(v), cudaMemcpyDeviceToHost), cudaSuccess);
    v ^= 0x40;
    ASSERT_EQ(cudaMemcpy(at, &v, sizeof(v), cudaMemcpyHostToDevice), cudaSuccess);
#else
    host_[gpu][local].values[element] ^= 0x40;
#endif
  }

 private:
  std::vector<deltacast::TensorView> Place(Tensors& tensors) {
#if DELTACAST_TEST_CUDA
    std::vector<deltacast::TensorView> v;
    for (auto& t : tensors) {
      const size_t bytes = t.values.size() * sizeof(int64_t);
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(p, t.values.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      device_.push_back(p);
      v.push_back({{t.spec.name, t.spec.dtype, t.spec.shape},
                   std::span<std::byte>(static_cast<std::byte*>(p), bytes)});
    }
    return v;
#else
    return Views(tensors);
#endif
  }
  void Free() {
#if DELTACAST_TEST_CUDA
    for (void* p : device_) cudaFree(p);
    device_.clear();
#endif
    host_.clear();
  }
  std::vector<Tensors> host_;  // each GPU's shard (the parameters themselves on the host)
  std::vector<void*> device_;  // every GPU's parameters in order (CUDA)
};

// Every GPU of the engine holds its shard of `canonical`, every tensor compared whole.
void ExpectShards(const Job& job, const Tensors& canonical, Engine& engine) {
  Reference want(job, canonical);
  const std::vector<Tensors> now = engine.Now();
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const Tensors shard = want.Shard(Rank{tp, 0, 0, 0});
    ASSERT_EQ(shard.size(), now[tp].size());
    for (size_t l = 0; l < shard.size(); ++l) {
      EXPECT_EQ(now[tp][l].values, shard[l].values) << "GPU " << tp << " " << shard[l].spec.name;
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

fs::path TestDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

Job SmallJob() {
  Job job;
  job.tp = 2;
  job.layers = 2;
  job.hidden = 64;
  return job;
}

// Two steps published in turn; after each, every GPU's parameters are the step's
// shards, and a piece torn behind the node's back between them is repaired.
TEST(ApiGpuNode, AnEngineOnTwoGpusReceivesStepsBitExact) {
  SKIP_WITHOUT_DEVICE();
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = TestDir("gpu_node");
  const Job job = SmallJob();
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  Engine engine;
  const std::vector<deltacast::GpuWeights> gpus = engine.Load(dir, job, trainer);
  Tensors plain = trainer;

  auto config = deltacast::Config::Parse(Toml(BasePort()), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  Fleet fleet;
  ASSERT_NO_FATAL_FAILURE(fleet.Start(*config, gpus, plain));

  deltacast::SourceOptions source_options;
  source_options.token = "gpu-token";
  auto source = deltacast::Source::Start(*config, source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  for (uint64_t step = 1; step <= 2; ++step) {
    if (step == 2) engine.Flip(1, 0, 3);  // torn: repaired from the tree
    Tensors previous = trainer;
    TrainingStep(trainer, 17 + step);
    auto report = (*source)->Publish(Views(previous), Views(trainer));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << "step " << step << ": " << report->abort_reason;
    EXPECT_EQ(fleet.engine->stats().version, report->target_version);
    ExpectShards(job, trainer, engine);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].values, trainer[i].values);
  }
  EXPECT_GE(fleet.engine->stats().partitions_repaired, 1u);
  // The audit re-hashes every GPU's pieces: clean now, and it finds a flipped bit.
  auto audit = fleet.engine->Verify();
  ASSERT_TRUE(audit.ok()) << audit.status().ToString();
  EXPECT_TRUE(audit->ok()) << audit->summary;
  EXPECT_EQ(audit->version, fleet.engine->stats().version);
  engine.Flip(0, 0, 1);
  audit = fleet.engine->Verify();
  ASSERT_TRUE(audit.ok()) << audit.status().ToString();
  ASSERT_EQ(audit->mismatches.size(), 1u) << audit->summary;
  EXPECT_NE(audit->mismatches[0].what.find("bits differ"), std::string::npos) << audit->summary;
  (*source)->Stop();
  fleet.Stop();
  fs::remove_all(dir);
}

// Staged apply on GPUs (docs/serving.md): while each step streams and prepares, the
// engine's parameters stay at the base, as the pause hook finds them; the write comes
// at COMMIT, between the hooks, and every GPU then holds the step bit-exact.
TEST(ApiGpuNode, AStagedEngineOnGpusIsWrittenOnlyBetweenItsHooks) {
  SKIP_WITHOUT_DEVICE();
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = TestDir("gpu_staged");
  const Job job = SmallJob();
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  Engine engine;
  const std::vector<deltacast::GpuWeights> gpus = engine.Load(dir, job, trainer);
  auto config = deltacast::Config::Parse(Toml(BasePort()), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();

  Tensors base = trainer;
  std::atomic<int> pauses{0}, resumes{0};
  std::atomic<bool> base_at_pause{true};
  deltacast::NodeOptions options;
  options.token = "gpu-token";
  options.apply_threads = 1;
  options.node_id = "engine";
  options.apply_mode = "staged";
  options.pause_engine = [&]() -> deltacast::Status {
    ++pauses;
    // Read back from the "GPUs": nothing of the step may be there yet.
    Reference want(job, base);
    const std::vector<Tensors> now = engine.Now();
    for (uint64_t tp = 0; tp < job.tp; ++tp) {
      const Tensors shard = want.Shard(Rank{tp, 0, 0, 0});
      for (size_t l = 0; l < shard.size(); ++l) {
        if (now[tp][l].values != shard[l].values) base_at_pause = false;
      }
    }
    return deltacast::Status::Ok();
  };
  options.resume_engine = [&] { ++resumes; };
  auto node = deltacast::Node::StartOnGpus(*config, options, gpus);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  Tensors plain = trainer;
  options = {};
  options.token = "gpu-token";
  options.apply_threads = 1;
  options.node_id = "plain";
  auto plain_node = deltacast::Node::Start(*config, options, Views(plain));
  ASSERT_TRUE(plain_node.ok()) << plain_node.status().ToString();

  deltacast::SourceOptions source_options;
  source_options.token = "gpu-token";
  auto source = deltacast::Source::Start(*config, source_options);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  for (uint64_t step = 1; step <= 2; ++step) {
    base = trainer;
    TrainingStep(trainer, 31 + step);
    auto report = (*source)->Publish(Views(base), Views(trainer));
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    ASSERT_TRUE(report->committed) << "step " << step << ": " << report->abort_reason;
    EXPECT_EQ(pauses, static_cast<int>(step));
    EXPECT_TRUE(base_at_pause) << "step " << step << " was written before COMMIT";
    ExpectShards(job, trainer, engine);
  }
  auto audit = (*node)->Verify();
  ASSERT_TRUE(audit.ok()) << audit.status().ToString();
  EXPECT_TRUE(audit->ok()) << audit->summary;
  (*source)->Stop();
  (*node)->Stop();
  (*plain_node)->Stop();
  EXPECT_EQ(resumes, 2);
  fs::remove_all(dir);
}

// Both ends on GPUs: two producers (one serving from "GPU" memory through
// ServeFromGpu, one from host memory) make each version at a root, and the engine's
// two GPUs receive it.
TEST(ApiGpuNode, ProducersServingFromGpuMemoryReachAnEngineOnGpus) {
  SKIP_WITHOUT_DEVICE();
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = TestDir("gpu_prod");
  Job job = SmallJob();
  job.hidden = 128;
  Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  Engine engine;
  const std::vector<deltacast::GpuWeights> gpus = engine.Load(dir, job, trainer);
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
  // Producer 0 owns the first half of the tensors (by name) and holds both versions in
  // "GPU" memory (on a device: a trainer's own device buffers); producer 1 the rest.
  const size_t half = trainer.size() / 2;
  Tensors gpu_base(previous.begin(), previous.begin() + half);
  Tensors gpu_target(trainer.begin(), trainer.begin() + half);
  std::vector<deltacast::TensorView> device_base, device_target;
  auto place = [&](Tensors& host, std::vector<deltacast::TensorView>& views,
                   std::vector<void*>& owned) {
    views = Views(host);
#if DELTACAST_TEST_CUDA
    for (auto& v : views) {
      void* p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, v.bytes.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(p, v.bytes.data(), v.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
      owned.push_back(p);
      v.bytes = std::span<std::byte>(static_cast<std::byte*>(p), v.bytes.size());
    }
#else
    (void)owned;
#endif
  };
  std::vector<void*> owned;
  ASSERT_NO_FATAL_FAILURE(place(gpu_base, device_base, owned));
  ASSERT_NO_FATAL_FAILURE(place(gpu_target, device_target, owned));

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
      std::vector<deltacast::TensorView> base(all_base.begin() + half, all_base.end());
      std::vector<deltacast::TensorView> target(all_target.begin() + half, all_target.end());
      auto report = p == 0 ? (*producer)->ServeFromGpu(kDevice, device_base, device_target)
                           : (*producer)->Serve(base, target);
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
#if DELTACAST_TEST_CUDA
  for (void* p : owned) cudaFree(p);
#endif
  fs::remove_all(dir);
}

// Bad registrations are refused before anything touches the weights: tied weights
// (one buffer registered as two parameters) and a misaligned parameter.
TEST(ApiGpuNode, BadRegistrationsAreRefusedWithTheWeightsUntouched) {
  SKIP_WITHOUT_DEVICE();
  deltacast::SetLogLevel(deltacast::LogLevel::kWarn);
  const fs::path dir = TestDir("gpu_bad");
  const Job job = SmallJob();
  const Tensors trainer = deltacast::layout::testing::CanonicalTensors(job);
  WriteCanonicalTable(dir / "canonical.json", trainer);
  auto config = deltacast::Config::Parse(Toml(BasePort() + 2), "gpus.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  deltacast::NodeOptions options;
  options.token = "gpu-token";
  options.node_id = "engine";
  Engine engine;
  const std::vector<Tensors> before = [&] {
    engine.Load(dir, job, trainer);
    return engine.Now();
  }();
  struct Case {
    const char* what;
    const char* says;
    std::function<void(std::vector<deltacast::GpuWeights>&)> spoil;
  };
  const std::vector<Case> cases = {
      {"tied", "overlap",
       [](auto& gpus) {
         auto& p = gpus[1].parameters;
         // The smaller of two parameters placed inside the larger one.
         size_t big = 0, small = 1;
         if (p[small].bytes.size() > p[big].bytes.size()) std::swap(big, small);
         p[small].bytes = p[big].bytes.subspan(0, p[small].bytes.size());
       }},
      {"misaligned", "aligned",
       [](auto& gpus) {
         // Four bytes on: I64 elements off their 8-byte boundary (refused before any
         // byte is read).
         auto& t = gpus[0].parameters[1];
         t.bytes = std::span<std::byte>(t.bytes.data() + 4, t.bytes.size());
       }},
  };
  for (const Case& c : cases) {
    std::vector<deltacast::GpuWeights> gpus = engine.Load(dir, job, trainer);
    c.spoil(gpus);
    auto node = deltacast::Node::StartOnGpus(*config, options, gpus);
    ASSERT_FALSE(node.ok()) << c.what;
    EXPECT_EQ(node.status().code(), deltacast::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(node.status().message().find(c.says), std::string::npos)
        << c.what << ": " << node.status().ToString();
    const std::vector<Tensors> after = engine.Now();
    for (size_t g = 0; g < after.size(); ++g) {
      for (size_t l = 0; l < after[g].size(); ++l)
        EXPECT_EQ(after[g][l].values, before[g][l].values) << c.what;
    }
  }
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

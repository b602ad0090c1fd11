// The GPU end of the pipe: applying a step into weights held by GPU memories through
// a load plan, finding a trainer shard's changes on the GPU, the staging ring's
// overlap, and a whole refit over loopback into a TP = 2 engine. With --device -1 the
// same code runs over host memory (what CI machines without a GPU can measure).
//
// The model is a Llama-shaped job (tests/layout/reference.h: fused QKV and gate/up,
// vocabulary-parallel embedding, replicated norms) with I64 elements; ~3 % of them
// change their bits per step.
//
// Usage: deltacast_bench_gpu [--device 0] [--hidden 1024] [--layers 4] [--out FILE]
// Prints JSON (and writes it to --out).
#include <fmt/core.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "apply/delta_applier.h"
#include "apply/device/piece_memory.h"
#include "apply/host_store.h"
#include "apply/planned_store.h"
#include "apply/replica.h"
#include "bench/bench_util.h"
#include "codec/chunk.h"
#include "codec/delta_encoder.h"
#include "common/hash.h"
#include "common/log.h"
#include "relay/node_agent.h"
#include "relay/source.h"
#include "tests/layout/reference.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"

namespace dc = deltacast;
using dc::bench::Clock;
using dc::bench::Seconds;
using dc::layout::testing::Job;
using dc::layout::testing::Rank;
using dc::layout::testing::Reference;
using deltacast::bench::Check;
using Tensors = std::vector<dc::layout::testing::Tensor>;

namespace {

dc::ByteSpan BytesOf(const std::vector<int64_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(int64_t)};
}

std::unique_ptr<dc::apply::HostStore> StoreOf(const Tensors& tensors) {
  std::vector<dc::codec::TensorInfo> infos;
  for (const auto& t : tensors) infos.push_back({t.spec.name, t.spec.dtype, t.spec.shape});
  auto store = Check(dc::apply::HostStore::Create(infos), "store");
  for (const auto& t : tensors) {
    auto span = Check(store->MutableTensorData(*store->FindTensor(t.spec.name)), "span");
    std::memcpy(span.data(), t.values.data(), span.size());
  }
  return store;
}

std::unique_ptr<dc::apply::device::PieceMemory> NewMemory(int device, size_t gpu) {
  if (device < 0) return dc::apply::device::NewHostPieceMemory("host" + std::to_string(gpu));
  const int count = dc::apply::device::CudaDeviceCount();
  return Check(dc::apply::device::NewCudaPieceMemory((device + static_cast<int>(gpu)) % count),
               "cuda memory");
}

// A planned store of `tp` GPUs holding `canonical`'s shards.
std::unique_ptr<dc::apply::PlannedStore> Planned(const Job& job, const Tensors& canonical,
                                                 int device) {
  Reference ref(job, canonical);
  std::vector<dc::layout::TensorSpec> specs;
  for (const auto& t : canonical) specs.push_back(t.spec);
  std::vector<dc::apply::PlannedStore::PartSpec> parts;
  std::vector<Tensors> shards;
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    dc::apply::PlannedStore::PartSpec part;
    part.memory = NewMemory(device, tp);
    part.layout =
        Check(dc::layout::ParseLayout(ref.LayoutToml(Rank{tp, 0, 0, 0}), "rank.toml"), "layout");
    shards.push_back(ref.Shard(Rank{tp, 0, 0, 0}));
    for (const auto& t : shards.back()) part.locals.push_back(t.spec);
    parts.push_back(std::move(part));
  }
  auto store = Check(dc::apply::PlannedStore::Create(specs, std::move(parts)), "planned store");
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    for (size_t l = 0; l < shards[tp].size(); ++l)
      Check(store->WriteLocal(tp, l, BytesOf(shards[tp][l].values)), "load");
  }
  return store;
}

// Whether every GPU of `store` holds its shard of `canonical`.
bool AtShards(dc::apply::PlannedStore& store, const Job& job, const Tensors& canonical) {
  Reference ref(job, canonical);
  for (uint64_t tp = 0; tp < job.tp; ++tp) {
    const Tensors shard = ref.Shard(Rank{tp, 0, 0, 0});
    for (size_t l = 0; l < shard.size(); ++l) {
      std::vector<std::byte> got(shard[l].values.size() * sizeof(int64_t));
      Check(store.ReadLocal(tp, l, got), "read");
      if (dc::Hash128(got) != dc::Hash128(BytesOf(shard[l].values))) return false;
    }
  }
  return true;
}

uint64_t ModelBytes(const Tensors& t) {
  uint64_t n = 0;
  for (const auto& x : t) n += x.values.size() * sizeof(int64_t);
  return n;
}

std::string ClusterToml() {
  const int base = 15000 + static_cast<int>(::getpid() % 300) * 10;  // below ephemeral ports
  return "[cluster]\nname = \"gpu-bench\"\n[tree]\nchunk_size = \"1MiB\"\nwindow = 16\n"
         "connect_timeout = \"10s\"\ncommit_timeout = \"120s\"\n"
         "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
         std::to_string(base) + "\nrole = \"source\"\n[[node]]\nid = \"engine\"\nhost = " +
         "\"127.0.0.1\"\nport = " + std::to_string(base + 1) + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Apply into GPU weights through a load plan"};
  int device = 0;
  std::string out;
  Job job;
  job.hidden = 1024;
  job.heads = 16;
  job.kv_heads = 8;
  job.head_dim = 64;
  job.ffn = 4096;
  job.vocab = 32000;
  job.layers = 4;
  app.add_option("--device", device, "first CUDA device; -1: host memory");
  app.add_option("--hidden", job.hidden, "hidden size (heads * head_dim = hidden)");
  app.add_option("--layers", job.layers, "decoder layers");
  app.add_option("--out", out, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  dc::log::SetLevel(dc::log::Level::kWarn);
  job.head_dim = job.hidden / job.heads;
  job.ffn = job.hidden * 4;
  if (device >= 0 && dc::apply::device::CudaDeviceCount() == 0) {
    std::cerr << "no CUDA device here (run with --device -1 for host memory)\n";
    return 2;
  }

  // Two versions of the canonical model and the delta between them.
  Tensors base = dc::layout::testing::CanonicalTensors(job);
  Tensors target = base;
  std::mt19937_64 rng(5);
  for (auto& t : target) {
    for (auto& v : t.values) {
      if (rng() % 100 < 3) v ^= static_cast<int64_t>(rng() | 1);
    }
  }
  const uint64_t model_bytes = ModelBytes(base);
  auto base_store = StoreOf(base), target_store = StoreOf(target);
  const auto base_manifest =
      dc::apply::HashWeightStore(*base_store, dc::codec::kDefaultPartitionBytes, 0);
  const auto target_manifest =
      dc::apply::HashWeightStore(*target_store, dc::codec::kDefaultPartitionBytes, 0);
  const dc::codec::DeltaIdentity identity{base_manifest.VersionId(), target_manifest.VersionId(),
                                          dc::codec::kDefaultPartitionBytes};
  std::vector<std::vector<std::byte>> chunks;
  dc::codec::DeltaEncoderOptions encode;
  Check(dc::codec::EncodeDelta(
            base_manifest, target_manifest, [&](size_t i) { return base_store->TensorData(i); },
            [&](size_t i) { return target_store->TensorData(i); }, dc::Digest128{}, encode,
            [&](std::vector<std::byte>&& c) {
              chunks.push_back(std::move(c));
              return dc::Status::Ok();
            }),
        "encode");
  uint64_t delta_bytes = 0;
  for (const auto& c : chunks) delta_bytes += c.size();

  nlohmann::json result = {{"benchmark", "gpu"},
                           {"memory", device < 0 ? "host" : "cuda"},
                           {"model_bytes", model_bytes},
                           {"delta_bytes", delta_bytes},
                           {"change_rate", 0.03}};
  double copy_gbps = 0;
  if (device >= 0) {
    auto facts = Check(dc::apply::device::MeasureCudaDevice(device, uint64_t{1} << 30), "device");
    copy_gbps = facts.copy_gbps;
    result["device"] = facts.name;
    result["device_copy_gbps"] = copy_gbps;
    result["cuda_devices"] = dc::apply::device::CudaDeviceCount();
  }

  // Apply: chunk by chunk through the applier, TP = 1 and TP = 2.
  nlohmann::json apply = nlohmann::json::object();
  for (uint64_t tp : {uint64_t{1}, uint64_t{2}}) {
    Job j = job;
    j.tp = tp;
    auto store = Planned(j, base, device);
    dc::apply::ApplyOptions options;
    options.store_at_manifest = true;
    dc::apply::DeltaApplier applier(*store, base_manifest, identity, options);
    std::vector<dc::codec::ChunkView> views;
    for (const auto& c : chunks) views.push_back(Check(dc::codec::ParseChunk(c), "chunk"));
    const auto start = Clock::now();
    for (size_t i = 0; i + 1 < views.size(); ++i) Check(applier.ApplyChunk(views[i]), "apply");
    Check(applier.Finish(views.back().summary).status(), "finish");
    const double seconds = Seconds(start);
    const bool exact = AtShards(*store, j, target);
    nlohmann::json r = {{"seconds", seconds},
                        {"model_gbps", double(model_bytes) / seconds / 1e9},
                        {"bit_exact", exact}};
    if (copy_gbps > 0) {
      // One pass over the model reads and writes it: model_bytes * 2 at copy speed.
      r["seconds_of_one_copy_pass"] = 2.0 * double(model_bytes) / (copy_gbps * 1e9);
    }
    apply["tp" + std::to_string(tp)] = r;
  }
  result["apply"] = apply;

  // A trainer shard's changes found on the device: the largest tensor, both versions.
  {
    size_t largest = 0;
    for (size_t i = 1; i < base.size(); ++i) {
      if (base[i].values.size() > base[largest].values.size()) largest = i;
    }
    auto memory = NewMemory(device, 0);
    const dc::ByteSpan a = BytesOf(base[largest].values), b = BytesOf(target[largest].values);
    auto da = Check(memory->Allocate(a.size()), "alloc");
    auto db = Check(memory->Allocate(b.size()), "alloc");
    Check(memory->Write(da, a), "write");
    Check(memory->Write(db, b), "write");
    dc::apply::device::ChangeList changes;
    Check(memory->FindChanges(da, db, base[largest].values.size(), 8, changes), "warm");
    const auto start = Clock::now();
    constexpr int kRounds = 5;
    for (int i = 0; i < kRounds; ++i)
      Check(memory->FindChanges(da, db, base[largest].values.size(), 8, changes), "find");
    const double seconds = Seconds(start) / kRounds;
    result["find_changes"] = {{"tensor_bytes", a.size()},
                              {"changes", changes.positions.size()},
                              {"gbps_of_one_version", double(a.size()) / seconds / 1e9},
                              {"bytes_to_host", changes.positions.size() * 16}};
  }

  // Staging: dense patches of 64 MiB queued back to back (the ring overlaps the next
  // copy with this kernel) against the same patches waited for one by one.
  {
    constexpr uint64_t kBytes = uint64_t{64} << 20;
    constexpr int kBatches = 8;
    auto memory = NewMemory(device, 0);
    auto buffer = Check(memory->Allocate(kBytes), "alloc");
    dc::apply::device::PatchBatch batch;
    dc::apply::device::PatchSegment s;
    s.run = {reinterpret_cast<unsigned char*>(buffer), 0, 0, kBytes / 8, 1, 0, 0};
    s.kind = dc::apply::device::kDenseXor;
    s.element_size = 8;
    batch.segments.push_back(s);
    batch.dense.assign(kBytes, std::byte{0x5a});
    nlohmann::json staging = nlohmann::json::object();
    for (const bool queued : {false, true}) {
      const auto start = Clock::now();
      for (int i = 0; i < kBatches; ++i) {
        Check(memory->Patch(batch), "patch");
        if (!queued) Check(memory->Sync(), "sync");
      }
      Check(memory->Sync(), "sync");
      staging[queued ? "queued_gbps" : "one_by_one_gbps"] =
          double(kBytes) * kBatches / Seconds(start) / 1e9;
    }
    result["staging"] = staging;
  }

  // A whole refit over loopback: a source and one engine node on two GPUs (TP = 2;
  // two memories of one device when it has one).
  {
    Job j = job;
    j.tp = 2;
    auto config = Check(dc::topology::ParseClusterConfig(ClusterToml(), "gpu-bench.toml"), "cfg");
    auto planned = Planned(j, base, device);
    dc::apply::PlannedStore* store = planned.get();
    auto replica = Check(
        dc::apply::Replica::ForStore(std::move(planned), dc::codec::kDefaultPartitionBytes, 0),
        "replica");
    dc::relay::NodeAgentOptions node;
    node.config = config;
    node.node_id = "engine";
    node.token = "gpu-bench";
    auto agent = Check(dc::relay::NodeAgent::Start(std::move(node), std::move(replica),
                                                   Check(dc::transport::MakeTcpTransport(), "tcp")),
                       "agent");
    dc::relay::PublishOptions options;
    options.config = config;
    options.token = "gpu-bench";
    auto source = Check(
        dc::relay::Source::Start(options, Check(dc::transport::MakeTcpTransport(), "tcp")), "src");
    const auto start = Clock::now();
    auto report = Check(source->Publish(*base_store, base_manifest, *target_store, target_manifest),
                        "publish");
    const double seconds = Seconds(start);
    source->Stop();
    agent->Stop();
    result["refit_tp2"] = {{"seconds", seconds},
                           {"committed", report.committed},
                           {"bit_exact", AtShards(*store, j, target)},
                           {"delta_bytes", report.delta.delta_bytes}};
  }

  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}

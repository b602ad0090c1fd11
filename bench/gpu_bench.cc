// The GPU end of the pipe, phase by phase, each phase's JSON line printed (and
// appended to --out) the moment it finishes, so one failing phase loses no figure:
//
//   device            the device's own copy bandwidth (read + write) and read
//                     bandwidth, measured here: what every ratio below divides by
//   apply_kernels     sparse-XOR patches of a 3 % delta into a --bytes buffer of BF16,
//                     one batch per 64 partitions (PieceMemory::Patch): the time of
//                     one copy pass of the buffer over the apply time (target >= 0.5)
//   hash              the partition hash of the buffer, every 4 MiB partition in one
//                     call: hash GB/s over read GB/s (target >= 0.5)
//   compare_compact   a producer's shard (two versions of the buffer) compared and
//                     its changes compacted (PieceMemory::FindChanges): the bytes
//                     read over the time, over copy GB/s (target >= 0.5)
//   apply_tp1/tp2     a Llama-shaped model's delta through the applier into a planned
//                     store (host decode included), bit-exact check
//   staging           dense patches queued back to back against one by one
//   refit_tp2         a whole refit over loopback into a TP = 2 engine
//
// With --device -1 the same code runs over host memory (what machines without a GPU
// can check; the ratios are then against memcpy).
//
// Usage: deltacast_bench_gpu [--device 0] [--bytes 4G] [--hidden 1024] [--layers 4]
//                            [--out FILE.jsonl]
#include <fmt/core.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

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
#include "common/partition_hash.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
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
  std::vector<dc::TensorSpec> infos;
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
  std::vector<dc::TensorSpec> specs;
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

// A phase that failed: its line says why, and the next phase runs.
struct PhaseError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <typename T>
T Must(dc::Result<T> r, const std::string& what) {
  if (!r.ok()) throw PhaseError(what + ": " + r.status().ToString());
  return std::move(r).value();
}
void Must(const dc::Status& s, const std::string& what) {
  if (!s.ok()) throw PhaseError(what + ": " + s.ToString());
}

// Prints each phase's line as it finishes, and appends it to the --out file.
class Phases {
 public:
  explicit Phases(std::string out) : out_(std::move(out)) {
    if (!out_.empty()) std::ofstream(out_, std::ios::trunc);
  }
  void Run(const std::string& name, const std::function<nlohmann::json()>& phase) {
    nlohmann::json line;
    const auto start = Clock::now();
    try {
      line = phase();
    } catch (const std::exception& e) {
      line = {{"error", e.what()}};
      failed_ = true;
    }
    line["phase"] = name;
    line["phase_seconds"] = Seconds(start);
    const std::string text = line.dump();
    std::cout << text << std::endl;  // flushed: a later crash loses nothing printed
    if (!out_.empty()) std::ofstream(out_, std::ios::app) << text << std::endl;
  }
  bool failed() const { return failed_; }

 private:
  std::string out_;
  bool failed_ = false;
};

// A 3 % sparse-XOR delta of a buffer of BF16 elements, one batch per 64 partitions
// of 4 MiB, each partition one segment (what the planned store sends per chunk).
std::vector<dc::apply::device::PatchBatch> SparseDelta(std::byte* buffer, uint64_t bytes,
                                                       uint64_t* entries) {
  constexpr uint64_t kPartition = uint64_t{4} << 20, kElements = kPartition / 2;
  constexpr uint64_t kPartitionsPerBatch = 64;
  std::vector<dc::apply::device::PatchBatch> batches;
  std::mt19937_64 rng(9);
  *entries = 0;
  for (uint64_t p = 0; p * kPartition < bytes; ++p) {
    if (p % kPartitionsPerBatch == 0) batches.emplace_back();
    auto& batch = batches.back();
    const uint64_t elements = std::min(kPartition, bytes - p * kPartition) / 2;
    dc::apply::device::PatchSegment s;
    s.run = {reinterpret_cast<unsigned char*>(buffer), 0, 0, elements, 1, p * kElements, 0};
    s.kind = dc::apply::device::kSparseXor;
    s.element_size = 2;
    s.first = batch.positions.size();
    s.word_offset = batch.words.size();
    // Gaps of 1..66 elements: ~3 % of them change, positions near uniform.
    for (uint64_t e = rng() % 33; e < elements; e += 1 + rng() % 66) {
      batch.positions.push_back(static_cast<uint32_t>(e));
      const uint16_t x = static_cast<uint16_t>(1 + rng() % 15);  // low mantissa bits
      batch.words.push_back(std::byte(x & 0xff));
      batch.words.push_back(std::byte(x >> 8));
    }
    s.count = batch.positions.size() - s.first;
    *entries += s.count;
    batch.segments.push_back(s);
  }
  return batches;
}

// Hash segments of every 4 MiB partition of a buffer, one slot each.
std::vector<dc::apply::device::HashSegment> Partitions(std::byte* buffer, uint64_t bytes) {
  constexpr uint64_t kPartition = uint64_t{4} << 20;
  std::vector<dc::apply::device::HashSegment> out;
  for (uint64_t p = 0; p * kPartition < bytes; ++p) {
    const uint64_t len = std::min(kPartition, bytes - p * kPartition);
    out.push_back({{reinterpret_cast<unsigned char*>(buffer), 0, 0, len, 1, p * kPartition, 0},
                   1,
                   static_cast<uint32_t>(p)});
  }
  return out;
}

// The host's memcpy bandwidth (read + write), for --device -1.
double HostCopyGbps(uint64_t bytes) {
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
  std::memcpy(b.data(), a.data(), bytes);
  const auto start = Clock::now();
  for (int i = 0; i < 3; ++i) std::memcpy(b.data(), a.data(), bytes);
  return 2.0 * double(bytes) * 3 / Seconds(start) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Apply, hash and compare in GPU memory, against the device's own bandwidth"};
  int device = 0;
  std::string out;
  std::string bytes_text;
  Job job;
  job.hidden = 1024;
  job.heads = 16;
  job.kv_heads = 8;
  job.head_dim = 64;
  job.ffn = 4096;
  job.vocab = 32000;
  job.layers = 4;
  app.add_option("--device", device, "first CUDA device; -1: host memory");
  app.add_option("--bytes", bytes_text, "buffer of the kernel phases (default 4G; host 256M)");
  app.add_option("--hidden", job.hidden, "hidden size (heads * head_dim = hidden)");
  app.add_option("--layers", job.layers, "decoder layers");
  app.add_option("--out", out, "also append each phase's JSON line here");
  CLI11_PARSE(app, argc, argv);
  dc::log::SetLevel(dc::log::Level::kWarn);
  job.head_dim = job.hidden / job.heads;
  job.ffn = job.hidden * 4;
  if (device >= 0 && dc::apply::device::CudaDeviceCount() == 0) {
    std::cerr << "no CUDA device here (run with --device -1 for host memory)\n";
    return 2;
  }
  uint64_t bytes = device < 0 ? uint64_t{256} << 20 : uint64_t{4} << 30;
  if (!bytes_text.empty()) {
    const char unit = bytes_text.back();
    bytes = std::stoull(bytes_text);
    if (unit == 'G' || unit == 'g') bytes <<= 30;
    if (unit == 'M' || unit == 'm') bytes <<= 20;
  }
  bytes = std::max<uint64_t>(bytes / 16 * 16, 16);
  Phases phases(out);

  // The device's own bandwidths: what every ratio divides by.
  double copy_gbps = 0, read_gbps = 0;
  phases.Run("device", [&] {
    nlohmann::json r = {{"memory", device < 0 ? "host" : "cuda"}, {"bytes", bytes}};
    if (device < 0) {
      copy_gbps = HostCopyGbps(bytes);
      read_gbps = copy_gbps / 2;  // memcpy reads half its traffic
    } else {
      auto facts = Must(dc::apply::device::MeasureCudaDevice(device, bytes), "measure");
      copy_gbps = facts.copy_gbps;
      read_gbps = facts.read_gbps;
      r["device"] = facts.name;
      r["cuda_devices"] = dc::apply::device::CudaDeviceCount();
    }
    r["copy_gbps"] = copy_gbps;
    r["read_gbps"] = read_gbps;
    return r;
  });

  // The kernel phases share one memory and its buffers.
  std::unique_ptr<dc::apply::device::PieceMemory> memory;
  std::byte* weights = nullptr;
  std::byte* previous = nullptr;
  std::vector<dc::apply::device::PatchBatch> delta;
  uint64_t entries = 0;
  phases.Run("apply_kernels", [&] {
    memory = NewMemory(device, 0);
    weights = Must(memory->Allocate(bytes), "allocate");
    previous = Must(memory->Allocate(bytes), "allocate");
    std::vector<std::byte> fill(std::min<uint64_t>(bytes, uint64_t{64} << 20));
    std::mt19937_64 rng(3);
    for (auto& b : fill) b = std::byte(static_cast<uint8_t>(rng()));
    for (uint64_t at = 0; at < bytes; at += fill.size()) {
      const uint64_t n = std::min<uint64_t>(fill.size(), bytes - at);
      Must(memory->Write(weights + at, dc::ByteSpan(fill.data(), n)), "fill");
      Must(memory->Write(previous + at, dc::ByteSpan(fill.data(), n)), "fill");
    }
    delta = SparseDelta(weights, bytes, &entries);
    const auto hash_before = Partitions(weights, bytes);
    std::vector<dc::PartitionHash> before(hash_before.size()), after(hash_before.size());
    Must(memory->Hash(hash_before, before), "hash");
    // Warm (the staging ring's buffers grow once), then timed; four applications
    // in all restore the buffer, which the hash checks.
    for (const auto& b : delta) Must(memory->Patch(b), "patch");
    Must(memory->Sync(), "sync");
    const auto start = Clock::now();
    for (const auto& b : delta) Must(memory->Patch(b), "patch");
    Must(memory->Sync(), "sync");
    const double seconds = Seconds(start);
    for (int round = 0; round < 2; ++round) {
      for (const auto& b : delta) Must(memory->Patch(b), "patch");
    }
    Must(memory->Sync(), "sync");
    Must(memory->Hash(hash_before, after), "hash");
    const double copy_pass = 2.0 * double(bytes) / (copy_gbps * 1e9);
    // What crosses to the device (positions and words, staged through pinned host
    // memory): at 3 % of BF16 elements ~9 % of the buffer's size, which bounds the
    // apply by the host-to-device link, not by device memory.
    uint64_t payload = 0;
    for (const auto& b : delta) payload += b.positions.size() * 4 + b.words.size();
    return nlohmann::json{{"bytes", bytes},
                          {"payload_bytes", payload},
                          {"payload_gbps", double(payload) / seconds / 1e9},
                          {"entries", entries},
                          {"change_rate", double(entries) * 2 / double(bytes)},
                          {"batches", delta.size()},
                          {"seconds", seconds},
                          {"buffer_gbps", double(bytes) / seconds / 1e9},
                          {"seconds_of_one_copy_pass", copy_pass},
                          {"ratio_to_copy", copy_pass / seconds},
                          {"target", 0.5},
                          {"restored_by_hash", before == after}};
  });

  phases.Run("hash", [&] {
    if (!memory) throw PhaseError("no buffer (apply_kernels failed)");
    const auto segments = Partitions(weights, bytes);
    std::vector<dc::PartitionHash> got(segments.size());
    Must(memory->Hash(segments, got), "warm");
    constexpr int kRounds = 3;
    const auto start = Clock::now();
    for (int i = 0; i < kRounds; ++i) {
      std::fill(got.begin(), got.end(), dc::PartitionHash{});
      Must(memory->Hash(segments, got), "hash");
    }
    const double seconds = Seconds(start) / kRounds;
    // The first partition's bits against the host's hash of the same bytes.
    std::vector<std::byte> first(segments[0].run.len);
    Must(memory->Read(weights, first), "read");
    const dc::PartitionHash host =
        dc::HashStridedRun(first.data(), dc::StridedRun{1, first.size(), 0, 0, 0});
    const double gbps = double(bytes) / seconds / 1e9;
    return nlohmann::json{{"bytes", bytes},
                          {"partitions", segments.size()},
                          {"seconds", seconds},
                          {"gbps", gbps},
                          {"ratio_to_read", gbps / read_gbps},
                          {"target", 0.5},
                          {"first_partition_matches_host", host == got[0]}};
  });

  phases.Run("compare_compact", [&] {
    if (!memory) throw PhaseError("no buffer (apply_kernels failed)");
    // `weights` differs from `previous` by the delta once more.
    for (const auto& b : delta) Must(memory->Patch(b), "patch");
    Must(memory->Sync(), "sync");
    dc::apply::device::ChangeList changes;
    Must(memory->FindChanges(previous, weights, bytes / 2, 2, changes), "warm");
    constexpr int kRounds = 3;
    const auto start = Clock::now();
    for (int i = 0; i < kRounds; ++i)
      Must(memory->FindChanges(previous, weights, bytes / 2, 2, changes), "find");
    const double seconds = Seconds(start) / kRounds;
    const double gbps = 2.0 * double(bytes) / seconds / 1e9;  // both versions read
    return nlohmann::json{{"bytes_per_version", bytes},
                          {"changes", changes.positions.size()},
                          {"changes_expected", entries},
                          {"seconds", seconds},
                          {"read_gbps", gbps},
                          {"ratio_to_copy", gbps / copy_gbps},
                          {"target", 0.5},
                          {"bytes_to_host", changes.positions.size() * 10}};
  });
  memory.reset();
  delta.clear();

  // Two versions of a Llama-shaped canonical model and the delta between them.
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
  const auto base_manifest = Check(
      dc::apply::HashWeightStore(*base_store, dc::codec::kDefaultPartitionBytes, 0), "manifest");
  const auto target_manifest = Check(
      dc::apply::HashWeightStore(*target_store, dc::codec::kDefaultPartitionBytes, 0), "manifest");
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

  // Apply: chunk by chunk through the applier, TP = 1 and TP = 2.
  for (uint64_t tp : {uint64_t{1}, uint64_t{2}}) {
    phases.Run("apply_tp" + std::to_string(tp), [&] {
      Job j = job;
      j.tp = tp;
      auto store = Planned(j, base, device);
      dc::apply::ApplyOptions options;
      options.store_at_manifest = true;
      dc::apply::DeltaApplier applier(*store, base_manifest, identity, options);
      std::vector<dc::codec::ChunkView> views;
      for (const auto& c : chunks) views.push_back(Must(dc::codec::ParseChunk(c), "chunk"));
      const auto start = Clock::now();
      for (size_t i = 0; i + 1 < views.size(); ++i) Must(applier.ApplyChunk(views[i]), "apply");
      Must(applier.Finish(views.back().summary).status(), "finish");
      const double seconds = Seconds(start);
      const double copy_pass = 2.0 * double(model_bytes) / (copy_gbps * 1e9);
      return nlohmann::json{{"model_bytes", model_bytes},
                            {"delta_bytes", delta_bytes},
                            {"seconds", seconds},
                            {"model_gbps", double(model_bytes) / seconds / 1e9},
                            {"ratio_to_copy", copy_pass / seconds},
                            {"bit_exact", AtShards(*store, j, target)}};
    });
  }

  // Staging: dense patches of 64 MiB queued back to back (the ring overlaps the next
  // copy with this kernel) against the same patches waited for one by one.
  phases.Run("staging", [&] {
    constexpr uint64_t kBytes = uint64_t{64} << 20;
    constexpr int kBatches = 8;
    auto memory = NewMemory(device, 0);
    auto buffer = Must(memory->Allocate(kBytes), "alloc");
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
        Must(memory->Patch(batch), "patch");
        if (!queued) Must(memory->Sync(), "sync");
      }
      Must(memory->Sync(), "sync");
      staging[queued ? "queued_gbps" : "one_by_one_gbps"] =
          double(kBytes) * kBatches / Seconds(start) / 1e9;
    }
    return staging;
  });

  // A whole refit over loopback: a source and one engine node on two GPUs (TP = 2;
  // two memories of one device when it has one).
  phases.Run("refit_tp2", [&] {
    Job j = job;
    j.tp = 2;
    auto config = Must(dc::topology::ParseClusterConfig(ClusterToml(), "gpu-bench.toml"), "cfg");
    auto planned = Planned(j, base, device);
    dc::apply::PlannedStore* store = planned.get();
    auto replica =
        Must(dc::apply::Replica::ForStore(std::move(planned), dc::codec::kDefaultPartitionBytes, 0),
             "replica");
    dc::relay::NodeAgentOptions node;
    node.config = config;
    node.node_id = "engine";
    node.token = "gpu-bench";
    auto agent = Must(dc::relay::NodeAgent::Start(std::move(node), std::move(replica),
                                                  Must(dc::transport::MakeTcpTransport(), "tcp")),
                      "agent");
    dc::relay::PublishOptions options;
    options.config = config;
    options.token = "gpu-bench";
    auto source = Must(
        dc::relay::Source::Start(options, Must(dc::transport::MakeTcpTransport(), "tcp")), "src");
    const auto start = Clock::now();
    auto report = Must(source->Publish(*base_store, base_manifest, *target_store, target_manifest),
                       "publish");
    const double seconds = Seconds(start);
    source->Stop();
    agent->Stop();
    return nlohmann::json{{"seconds", seconds},
                          {"committed", report.committed},
                          {"bit_exact", AtShards(*store, j, target)},
                          {"delta_bytes", report.delta.delta_bytes}};
  });
  return phases.failed() ? 1 : 0;
}

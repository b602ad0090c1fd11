// deltacast_bench_producers: many producers on the trainer against one encoder and
// against gather-then-compare, on the same synthetic job (docs/producers.md).
//
// It synthesizes one Llama-shaped BF16 checkpoint pair (step0 -> step1) and the
// training shards of the same pair for 1, 2 and 4 ranks (tp=1; tp=2; tp=2,pp=2),
// loads everything into memory (a trainer's weights are in memory; page faults of
// mapped files would dominate), and measures, one core at a time:
// - single-producer fast encode: today's EncodeDelta and a whole-checkpoint
//   producer (relay/producers/shard_encoder.h) over the canonical pair, GB of checkpoint per
//   CPU second (manifests known: the steady state of a long-lived trainer);
// - per N: CPU seconds per checkpoint GB of all N producers (each on one core),
//   the wall time with the N producers on parallel threads, the base hash pass a
//   first refit adds, the root's merge CPU per delta byte next to a memcpy of the
//   same bytes, each producer's peak memory (forked, before anything is loaded),
//   and that the merged delta takes the canonical base to the canonical target;
// - per N, gather-then-compare on the same job (each rank's shard converted to
//   canonical tensors and compared, as NeMo RL's export does): CPU of conversion,
//   target hashing and EncodeDelta, and the bytes moved between ranks when
//   canonical partitions are owned round-robin, against the projection's bytes
//   sent to the root.
// Prints one JSON document (and writes it to --out).
#include <fmt/core.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "layout/values.h"
#include "relay/producers/merge.h"
#include "relay/producers/shard_encoder.h"
#include "relay/producers/shard_input.h"
#include "relay/wire/protocol.h"

namespace dc = deltacast;
using deltacast::bench::Check;
namespace fs = std::filesystem;
using deltacast::bench::Clock;
using deltacast::bench::Seconds;
using nlohmann::json;

namespace {

constexpr uint64_t kPartitionBytes = dc::codec::kDefaultPartitionBytes;
constexpr uint64_t kChunkBytes = 4ull << 20;

// Process CPU seconds, to the nanosecond (getrusage can be tick-grained, too coarse
// for the root's few milliseconds of merging).
double Cpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// One rank's two shard versions, in memory.
struct Rank {
  std::vector<std::vector<std::byte>> base, target;
  dc::relay::RankPlacement placement;
  dc::relay::ShareInput Input() const {
    return {&placement.map, [this](uint32_t i) { return dc::ByteSpan(base[i]); },
            [this](uint32_t i) { return dc::ByteSpan(target[i]); }};
  }
  uint64_t Bytes() const {
    uint64_t n = 0;
    for (const auto& t : target) n += t.size();
    return n;
  }
};

std::vector<std::byte> Load(dc::ByteSpan s) { return {s.begin(), s.end()}; }

std::unique_ptr<Rank> LoadRank(const fs::path& job, uint64_t r) {
  auto rank = std::make_unique<Rank>();
  const std::string stem = dc::agent::RankFileStem(r);
  auto base = Check(
      dc::relay::ShardFile::Open(dc::agent::ShardDirOf(job / "step0") / (stem + ".safetensors")),
      "open base shard");
  auto target = Check(
      dc::relay::ShardFile::Open(dc::agent::ShardDirOf(job / "step1") / (stem + ".safetensors")),
      "open new shard");
  for (size_t i = 0; i < target->tensors().size(); ++i) {
    rank->base.push_back(Load(base->TensorData(i)));
    rank->target.push_back(Load(target->TensorData(i)));
  }
  rank->placement =
      Check(dc::relay::LoadRankPlacement(dc::agent::ShardDirOf(job / "step1") / (stem + ".toml"),
                                         target->tensors()),
            "placement");
  return rank;
}

std::vector<dc::PartitionHash> WholeBaseHashes(const std::vector<dc::relay::PartitionShare>& cov,
                                               const dc::codec::Manifest& base) {
  std::vector<dc::PartitionHash> out;
  for (const auto& c : cov) {
    out.push_back(c.Whole() ? base.partition_hashes[c.tensor][c.partition] : dc::PartitionHash{});
  }
  return out;
}

dc::relay::ShareEncodeOptions OneCore() {
  dc::relay::ShareEncodeOptions o;
  o.partition_bytes = kPartitionBytes;
  o.chunk_bytes = kChunkBytes;
  o.threads = 1;
  return o;
}

// The peak RSS of a child that loads and encodes rank `r` of `job` alone.
json ForkedProducerMemory(const fs::path& job, uint64_t r,
                          const dc::codec::Manifest& base_manifest_for_child) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    // The shard files mapped, as `deltacast produce` holds them: the previous shard
    // is the producer's baseline, the new one stands for the trainer's weights.
    const std::string stem = dc::agent::RankFileStem(r);
    auto base = Check(
        dc::relay::ShardFile::Open(dc::agent::ShardDirOf(job / "step0") / (stem + ".safetensors")),
        "open base shard");
    auto target = Check(
        dc::relay::ShardFile::Open(dc::agent::ShardDirOf(job / "step1") / (stem + ".safetensors")),
        "open new shard");
    auto placement =
        Check(dc::relay::LoadRankPlacement(dc::agent::ShardDirOf(job / "step1") / (stem + ".toml"),
                                           target->tensors()),
              "placement");
    dc::relay::ShareInput input{&placement.map, [&](uint32_t i) { return base->TensorData(i); },
                                [&](uint32_t i) { return target->TensorData(i); }};
    uint64_t shard_bytes = 0;
    for (size_t i = 0; i < target->tensors().size(); ++i)
      shard_bytes += target->TensorData(i).size();
    const auto cov = dc::relay::ShareCoverage(placement.map, kPartitionBytes);
    auto share = dc::relay::EncodeShare(input, cov, WholeBaseHashes(cov, base_manifest_for_child),
                                        OneCore());
    uint64_t held = 0;
    if (share.ok()) {
      for (const auto& c : share->chunks) held += c.size();
      for (const auto& p : share->pieces) held += p.encoded.payload.size();
    }
    const uint64_t values[3] = {shard_bytes, held, static_cast<uint64_t>(before.ru_maxrss)};
    (void)!write(fds[1], values, sizeof values);
    _exit(share.ok() ? 0 : 1);
  }
  close(fds[1]);
  uint64_t values[3] = {};
  (void)!read(fds[0], values, sizeof values);
  close(fds[0]);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  return {{"rank", r},
          {"shard_bytes", values[0]},
          {"encoded_bytes_held", values[1]},
          {"peak_rss_bytes", static_cast<uint64_t>(usage.ru_maxrss) * 1024},
          {"rss_before_load_bytes", values[2] * 1024}};
}

fs::path EnsureJob(const fs::path& dir, const std::string& params, const std::string& shards,
                   uint64_t seed, double rate) {
  const fs::path job = dir / ("shards-" + shards);
  if (fs::exists(dc::agent::ShardDirOf(job / "step1") / "rank-00000.toml")) return job;
  dc::agent::SynthOptions o;
  o.out_dir = job;
  o.params = Check(dc::agent::ParseParamCount(params), "params");
  o.steps = 1;
  o.change_rate = rate;
  o.seed = seed;
  o.shards = Check(dc::agent::ParseShardSpec(shards), "shards");
  fmt::print(stderr, "synthesizing {} ({})\n", job.string(), shards);
  Check(dc::agent::Synthesize(o), "synth");
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast producers benchmark"};
  std::string params = "500M", out_path;
  fs::path dir = "build/bench-producers";
  uint64_t seed = 3;
  double rate = 0.03;
  app.add_option("--params", params, "Model size")->capture_default_str();
  app.add_option("--change-rate", rate, "Fraction of elements changed per step")
      ->capture_default_str();
  app.add_option("--dir", dir, "Where the synthetic jobs live (kept between runs)")
      ->capture_default_str();
  app.add_option("--seed", seed, "Synthesis seed")->capture_default_str();
  app.add_option("--out", out_path, "Also write the JSON here");
  int single_repeats = 1;
  bool single_only = false;
  app.add_option("--single-repeats", single_repeats,
                 "Run the single-producer encode this many times (the best counts)");
  app.add_flag("--single-only", single_only, "Only the single-producer measurement (profiling)");
  CLI11_PARSE(app, argc, argv);

  const std::vector<std::pair<uint64_t, std::string>> jobs = {
      {1, "tp=1"}, {2, "tp=2"}, {4, "tp=2,pp=2"}};
  std::vector<fs::path> job_dirs;
  for (const auto& [n, spec] : jobs) job_dirs.push_back(EnsureJob(dir, params, spec, seed, rate));

  // The canonical pair (every job has the same one: same seed and size).
  using Access = dc::apply::CheckpointDirStore::Access;
  auto base_dir =
      Check(dc::apply::CheckpointDirStore::Open(job_dirs[0] / "step0", Access::kReadOnly), "step0");
  auto target_dir =
      Check(dc::apply::CheckpointDirStore::Open(job_dirs[0] / "step1", Access::kReadOnly), "step1");
  const auto t0 = Clock::now();
  const dc::codec::Manifest base_manifest = dc::codec::ComputeManifest(
      base_dir->tensors(), [&](size_t i) { return base_dir->TensorData(i); }, kPartitionBytes, 2);
  const dc::codec::Manifest target_manifest = dc::codec::ComputeManifest(
      target_dir->tensors(), [&](size_t i) { return target_dir->TensorData(i); }, kPartitionBytes,
      2);
  (void)t0;
  const double gb = double(target_manifest.TotalBytes()) / 1e9;

  // Memory first, forked before anything large is loaded here.
  json memory = json::object();
  for (size_t j = 0; j < jobs.size() && !single_only; ++j) {
    json per = json::array();
    for (uint64_t r = 0; r < jobs[j].first; ++r)
      per.push_back(ForkedProducerMemory(job_dirs[j], r, base_manifest));
    memory[std::to_string(jobs[j].first)] = per;
  }

  auto base_store = Check(dc::apply::HostStore::CopyOf(*base_dir), "copy step0");
  auto target_store = Check(dc::apply::HostStore::CopyOf(*target_dir), "copy step1");
  base_dir.reset();
  target_dir.reset();

  // The physical limit of the moment: reading both versions and comparing them,
  // one core (memory bandwidth is shared with whatever else runs here).
  double compare_gbps = 0;
  {
    const double c = Cpu();
    uint64_t acc = 0;
    for (size_t t = 0; t < target_store->tensors().size(); ++t) {
      const dc::ByteSpan x = base_store->TensorData(t), y = target_store->TensorData(t);
      const size_t words = x.size() / 8;
      const auto* p = reinterpret_cast<const uint64_t*>(x.data());
      const auto* q = reinterpret_cast<const uint64_t*>(y.data());
      for (size_t i = 0; i < words; ++i) acc |= p[i] ^ q[i];
    }
    compare_gbps = gb / (Cpu() - c);
    if (acc == 0) fmt::print(stderr, "(no change at all)\n");
  }

  // (a) Single-producer fast encode over the canonical pair.
  json single;
  {
    dc::codec::DeltaEncoderOptions e;
    e.threads = 1;
    e.chunk_bytes = kChunkBytes;
    dc::codec::DeltaStats stats;
    const double cpu = Cpu();
    Check(dc::codec::EncodeDelta(
              base_manifest, target_manifest, [&](size_t i) { return base_store->TensorData(i); },
              [&](size_t i) { return target_store->TensorData(i); }, {}, e,
              [](std::vector<std::byte>&&) { return dc::Status::Ok(); }, &stats),
          "EncodeDelta");
    const double encode_cpu = Cpu() - cpu;
    const double hash_start = Cpu();
    (void)dc::codec::ComputeManifest(
        target_store->tensors(), [&](size_t i) { return target_store->TensorData(i); },
        kPartitionBytes, 1);
    const double hash_cpu = Cpu() - hash_start;

    std::vector<dc::TensorSpec> specs = dc::relay::ToSpecs(target_store->tensors());
    auto whole = Check(dc::layout::MapWhole(specs, {}), "MapWhole");
    dc::relay::ShareInput input{&whole, [&](uint32_t i) { return base_store->TensorData(i); },
                                [&](uint32_t i) { return target_store->TensorData(i); }};
    const auto cov = dc::relay::ShareCoverage(whole, kPartitionBytes);
    const auto whole_hashes = WholeBaseHashes(cov, base_manifest);
    double producer_cpu = 1e30;
    dc::relay::EncodedShare share;
    for (int k = 0; k < std::max(1, single_repeats); ++k) {
      const double pcpu = Cpu();
      share = Check(dc::relay::EncodeShare(input, cov, whole_hashes, OneCore()), "EncodeShare");
      producer_cpu = std::min(producer_cpu, Cpu() - pcpu);
    }
    single = {{"checkpoint_bytes", target_manifest.TotalBytes()},
              {"compare_two_arrays_gb_per_cpu_s", compare_gbps},
              {"delta_bytes", stats.delta_bytes},
              {"encode_delta_gb_per_cpu_s", gb / encode_cpu},
              {"encode_delta_plus_target_hash_gb_per_cpu_s", gb / (encode_cpu + hash_cpu)},
              {"whole_checkpoint_producer_gb_per_cpu_s", gb / producer_cpu},
              {"producer_chunk_bytes", share.stats.chunk_bytes},
              {"target_ge_3_gb_per_s_per_core", gb / producer_cpu >= 3.0}};
    fmt::print(stderr, "single producer: EncodeDelta {:.2f} GB/s/core, producer {:.2f} GB/s/core\n",
               gb / encode_cpu, gb / producer_cpu);
  }

  json per_n = json::array();
  for (size_t j = 0; j < jobs.size() && !single_only; ++j) {
    const uint64_t n = jobs[j].first;
    std::vector<std::unique_ptr<Rank>> ranks;
    for (uint64_t r = 0; r < n; ++r) ranks.push_back(LoadRank(job_dirs[j], r));
    std::vector<dc::relay::ShareReport> reports(n);
    std::vector<dc::relay::EncodedShare> shares(n);
    std::vector<std::vector<dc::PartitionHash>> hashes(n);
    double encode_cpu = 0, hash_cpu = 0;
    uint64_t sent = 0, shard_bytes = 0;
    for (uint64_t r = 0; r < n; ++r) {
      reports[r].producer = dc::agent::RankFileStem(r);
      reports[r].coverage = dc::relay::ShareCoverage(ranks[r]->placement.map, kPartitionBytes);
      hashes[r] = WholeBaseHashes(reports[r].coverage, base_manifest);
      double c = Cpu();
      (void)dc::relay::HashShare(ranks[r]->Input(), reports[r].coverage, kPartitionBytes, 1);
      hash_cpu += Cpu() - c;
      c = Cpu();
      shares[r] = Check(
          dc::relay::EncodeShare(ranks[r]->Input(), reports[r].coverage, hashes[r], OneCore()),
          "EncodeShare");
      encode_cpu += Cpu() - c;
      reports[r].changes = shares[r].changes;
      sent += shares[r].stats.chunk_bytes + shares[r].stats.piece_bytes;
      shard_bytes += ranks[r]->Bytes();
    }
    // Wall time: the N producers side by side, one thread each.
    const auto wall_start = Clock::now();
    {
      std::vector<std::thread> threads;
      for (uint64_t r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
          (void)dc::relay::EncodeShare(ranks[r]->Input(), reports[r].coverage, hashes[r],
                                       OneCore());
        });
      }
      for (auto& t : threads) t.join();
    }
    const double wall = Seconds(wall_start);

    // The root's merge, messages as they would arrive (one copy of each chunk).
    std::vector<const dc::relay::ShareReport*> rp;
    for (const auto& r : reports) rp.push_back(&r);
    auto target = Check(dc::relay::CombineTargetManifest(base_manifest, rp), "target manifest");
    std::vector<dc::transport::Message> merged;
    uint64_t merged_bytes = 0;
    const double mcpu = Cpu();
    dc::relay::DeltaMerger merger(base_manifest, target, kChunkBytes,
                                  [&](std::vector<std::byte> m) {
                                    merged_bytes += m.size();
                                    merged.push_back(dc::transport::MakeMessage(std::move(m)));
                                    return dc::Status::Ok();
                                  });
    merger.ExpectPieces(rp);
    uint64_t changed = 0;
    for (uint64_t r = 0; r < n; ++r) {
      for (const auto& c : shares[r].chunks) Check(merger.AddChunk(c), "AddChunk");
      for (const auto& p : shares[r].pieces) {
        const dc::codec::PieceView v{p.encoded.encoding, p.encoded.entropy, p.encoded.change_count,
                                     p.encoded.raw_size, p.encoded.payload};
        Check(merger.AddPiece(p.tensor, p.partition, v, nullptr), "AddPiece");
      }
      changed += shares[r].stats.changed_elements;
    }
    dc::codec::DeltaStats stats;
    Check(merger.Finish(changed, &stats), "merge");
    const double merge_cpu = Cpu() - mcpu;
    // One copy of the same bytes, as the root makes it: each message into a buffer
    // of its own (fresh memory, as the merger's CHUNK messages are).
    const double copy_cpu_start = Cpu();
    {
      std::vector<std::vector<std::byte>> copies;
      for (const auto& m : merged) {
        std::vector<std::byte> v;
        v.reserve(m->size());
        v.insert(v.end(), m->begin(), m->end());
        copies.push_back(std::move(v));
      }
    }
    const double copy_cpu = Cpu() - copy_cpu_start;
    // Bit-exact: the merged delta takes the canonical base to the canonical target.
    auto replica = Check(dc::apply::HostStore::CopyOf(*base_store), "copy base");
    dc::apply::DeltaApplier applier(*replica, base_manifest, merger.identity());
    for (size_t i = 0; i + 1 < merged.size(); ++i) {
      auto view =
          Check(dc::codec::ParseChunk(dc::relay::ChunkOf(dc::ByteSpan(*merged[i]))), "parse");
      Check(applier.ApplyChunk(view), "apply");
    }
    auto end =
        Check(dc::codec::ParseChunk(dc::relay::ChunkOf(dc::ByteSpan(*merged.back()))), "end");
    const auto reached = Check(applier.Finish(end.summary), "finish");
    const bool exact = reached.VersionId() == target_manifest.VersionId() &&
                       target.VersionId() == target_manifest.VersionId();
    replica.reset();

    // Gather-then-compare on the same ranks: convert every rank's new shard into the
    // canonical tensors (the export), hash the target, compare with EncodeDelta.
    auto gathered = Check(dc::apply::HostStore::CopyOf(*base_store), "copy for gather");
    uint64_t moved = 0;
    const double gcpu = Cpu();
    for (uint64_t r = 0; r < n; ++r) {
      const auto& map = ranks[r]->placement.map;
      for (const auto& run : map.runs()) {
        const auto& local = map.locals()[run.local].spec;
        const uint64_t e = dc::ElementSize(local.dtype);
        auto dst = Check(gathered->MutableTensorData(run.canonical), "gather dst");
        const uint64_t ce = dc::ElementSize(map.canonical()[run.canonical].dtype);
        const uint64_t per =
            dc::codec::PartitionElements(map.canonical()[run.canonical].dtype, kPartitionBytes);
        for (uint64_t i = 0; i < run.count; ++i) {
          const std::byte* src =
              ranks[r]->target[run.local].data() + (run.src + i * run.src_stride) * e;
          const uint64_t d = run.dst + i * run.dst_stride;
          dc::layout::TransformValues(run.value, local.dtype, src,
                                      map.canonical()[run.canonical].dtype, dst.data() + d * ce,
                                      run.len);
          // Round-robin owners of canonical partitions: bytes held by another rank move.
          if ((d / per + run.canonical) % n != r) moved += run.len * ce;
        }
      }
    }
    const dc::codec::Manifest gathered_manifest = dc::codec::ComputeManifest(
        gathered->tensors(), [&](size_t i) { return gathered->TensorData(i); }, kPartitionBytes, 1);
    dc::codec::DeltaEncoderOptions e;
    e.threads = 1;
    e.chunk_bytes = kChunkBytes;
    Check(dc::codec::EncodeDelta(
              base_manifest, gathered_manifest, [&](size_t i) { return base_store->TensorData(i); },
              [&](size_t i) { return gathered->TensorData(i); }, {}, e,
              [](std::vector<std::byte>&&) { return dc::Status::Ok(); }),
          "EncodeDelta (gathered)");
    const double gather_cpu = Cpu() - gcpu;
    const bool gather_exact = gathered_manifest.VersionId() == target_manifest.VersionId();
    gathered.reset();

    per_n.push_back({
        {"producers", n},
        {"shards", jobs[j].second},
        {"shard_bytes_total", shard_bytes},
        {"encode_cpu_s", encode_cpu},
        {"encode_cpu_s_per_checkpoint_gb", encode_cpu / gb},
        {"encode_wall_s_parallel", wall},
        {"first_refit_base_hash_cpu_s", hash_cpu},
        {"delta_bytes", stats.delta_bytes},
        {"pieces_records",
         stats.records_by_encoding[static_cast<size_t>(dc::codec::Encoding::kPieces)]},
        {"root_merge_cpu_s", merge_cpu},
        {"root_merge_ns_per_delta_byte", merge_cpu * 1e9 / double(merged_bytes)},
        {"memcpy_ns_per_delta_byte", copy_cpu * 1e9 / double(merged_bytes)},
        {"bit_exact", exact},
        {"bytes_sent_to_root", sent},
        {"gather_then_compare",
         {{"cpu_s", gather_cpu},
          {"cpu_s_per_checkpoint_gb", gather_cpu / gb},
          {"bytes_moved_between_ranks", moved},
          {"bit_exact", gather_exact}}},
        {"memory", memory[std::to_string(n)]},
    });
    fmt::print(
        stderr,
        "N={}: {:.3f} CPU s/GB (wall {:.2f} s), root {:.3f} ns/B (memcpy {:.3f}), gather {:.3f} "
        "CPU s/GB, moved {:.0f} MB vs {:.1f} MB sent\n",
        n, encode_cpu / gb, wall, merge_cpu * 1e9 / double(merged_bytes),
        copy_cpu * 1e9 / double(merged_bytes), gather_cpu / gb, moved / 1e6, sent / 1e6);
  }

  json doc = {{"benchmark", "producers"},
              {"command", "build/bin/deltacast_bench_producers --params " + params},
              {"params", params},
              {"change_rate", rate},
              {"cores", std::thread::hardware_concurrency()},
              {"checkpoint_bytes", target_manifest.TotalBytes()},
              {"single_producer", single},
              {"producers", per_n}};
  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

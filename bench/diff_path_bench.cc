// deltacast_bench_diff: the encode speed a user sees from `deltacast diff` (and the
// one-shot `deltacast publish`, which encodes through the same reader), one thread,
// against the engine's own figure, on one synthetic checkpoint pair.
//
// It synthesizes a Llama-shaped BF16 checkpoint pair (step0 -> step1, 3 % of
// elements changed by default; kept in --dir) and measures, each with one encoder
// thread, page cache warm unless it says cold, the best of --runs:
// - `read_pread`: every changed partition of both versions copied with pread, one
//   128 KiB tile at a time into two reused buffers (what the encoder does before it
//   compares each tile), nothing else: the floor of the path;
// - `encode_in_memory`: EncodeDelta over both versions loaded into memory (the
//   producers benchmark's figure: the engine without its input);
// - `find_changes_in_memory`: the change detection alone over the same changed
//   partitions in memory, a 128 KiB tile at a time;
// - `memcpy_one_version` / `memcmp_one_version_pair`: the machine's ceilings in the
//   same run, one version copied whole, and compared whole with that copy;
// - `encode_via_mapping`: EncodeDelta reading the files through their mappings,
//   faulted in a page at a time (the path `deltacast diff` took before ReadRange);
// - `encode_via_pread`: EncodeDelta through ReadRange's default path, pread tile by
//   tile (the path it takes now);
// - `encode_via_populated_mapping`: EncodeDelta through ReadRange's ReadPath::kMap,
//   views of the mapping populated with one madvise per partition;
// - `hash_via_mapping` / `hash_via_pread`: the manifest of one version, one thread,
//   by either path (a first diff of a new checkpoint hashes it);
// - `diff_command`: `deltacast diff --threads 1 --mode fast --json` run as a
//   process: its own encode_gbps, and the process's wall time (startup included);
//   `diff_command_map`: the same with DELTACAST_CHECKPOINT_READS=map;
//   `diff_command_cold`: the same after dropping both checkpoints' pages from the
//   page cache (posix_fadvise DONTNEED), so the reads go to the disk; each with the
//   CPU seconds of the process (and of the shell popen starts);
// - `process_startup_seconds`: `deltacast --version`, the process alone.
// Every figure is GB of checkpoint (one version's tensor bytes) per second, wall
// time, with the CPU seconds beside it. Prints one JSON document (and writes --out).
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "codec/change_detect.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"

namespace dc = deltacast;
namespace fs = std::filesystem;
using dc::bench::Check;
using dc::bench::Clock;
using dc::bench::CpuSeconds;
using dc::bench::Seconds;
using nlohmann::json;

namespace {

using Access = dc::apply::CheckpointDirStore::Access;
using ReadPath = dc::apply::CheckpointDirStore::ReadPath;

struct Timed {
  double wall = 1e30;
  double cpu = 0;
};

// The best wall time of `runs` runs of `fn`, with that run's CPU seconds.
Timed Best(int runs, const std::function<void()>& fn) {
  Timed best;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    const double c0 = CpuSeconds();
    fn();
    const double wall = Seconds(t0);
    if (wall < best.wall) best = {wall, CpuSeconds() - c0};
  }
  return best;
}

json Figure(const Timed& t, uint64_t bytes) {
  return {{"seconds", t.wall},
          {"cpu_seconds", t.cpu},
          {"gb_per_s", double(bytes) / t.wall / 1e9},
          {"gb_per_cpu_s", t.cpu > 0 ? double(bytes) / t.cpu / 1e9 : 0.0}};
}

// Drops `dir`'s checkpoint files from the page cache (clean pages only: they were
// written long before).
void DropFromPageCache(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// CPU seconds of this process's children that have been waited for.
double ChildrenCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

// Runs `command`, returns its stdout and wall seconds.
std::pair<std::string, double> RunCommand(const std::string& command) {
  const auto t0 = Clock::now();
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) Check(dc::Status::IoError("popen " + command), "run");
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  const double wall = Seconds(t0);
  if (status != 0) Check(dc::Status::Internal(command + " failed"), "run");
  return {out, wall};
}

dc::Status Discard(std::vector<std::byte>&&) { return dc::Status::Ok(); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast diff-path benchmark"};
  std::string params = "500M", out_path;
  fs::path dir = "build/bench-diff";
  double rate = 0.03;
  int runs = 3;
  app.add_option("--params", params, "Model size")->capture_default_str();
  app.add_option("--change-rate", rate, "Fraction of elements changed")->capture_default_str();
  app.add_option("--dir", dir, "Where the checkpoint pair is (made if missing)")
      ->capture_default_str();
  app.add_option("--runs", runs, "Runs per figure (the best is kept)")->capture_default_str();
  app.add_option("--out", out_path, "Also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  const fs::path self = fs::canonical("/proc/self/exe").parent_path();
  const fs::path binary = self / "deltacast";

  const fs::path base_dir = dir / "step0", new_dir = dir / "step1";
  if (!fs::exists(new_dir)) {
    dc::agent::SynthOptions o;
    o.out_dir = dir;
    o.params = Check(dc::agent::ParseParamCount(params), "params");
    o.steps = 1;
    o.change_rate = rate;
    fmt::print(stderr, "synthesizing {}\n", dir.string());
    Check(dc::agent::Synthesize(o), "synth");
  }
  // Manifests cached (the steady state: a checkpoint is hashed once).
  auto open = [](const fs::path& d) {
    auto store = Check(dc::apply::CheckpointDirStore::Open(d, Access::kReadOnly), "open");
    auto manifest = Check(dc::apply::CheckpointState(d).LoadOrComputeManifest(
                              *store, dc::codec::kDefaultPartitionBytes, 2),
                          "manifest");
    return std::pair{std::move(store), std::move(manifest)};
  };
  auto [base_store, base_manifest] = open(base_dir);
  auto [new_store, new_manifest] = open(new_dir);
  const uint64_t bytes = new_manifest.TotalBytes();
  dc::codec::DeltaEncoderOptions encoder;
  encoder.threads = 1;
  dc::codec::DeltaStats stats;

  json out{{"benchmark", "diff_path"},
           {"command", "build/bin/deltacast_bench_diff --params " + params},
           {"checkpoint_bytes", bytes},
           {"threads", 1},
           {"runs", runs}};

  // Warm the page cache with both versions.
  Check(dc::codec::ComputeManifest(base_store->tensors(), dc::apply::RangeReaderOf(*base_store),
                                   base_manifest.partition_bytes, 1),
        "warm");
  Check(dc::codec::ComputeManifest(new_store->tensors(), dc::apply::RangeReaderOf(*new_store),
                                   new_manifest.partition_bytes, 1),
        "warm");

  // Reading alone: every partition the encoder reads, from either version.
  std::vector<dc::codec::PartitionRef> changed;
  for (const auto& p :
       dc::codec::PartitionTensors(new_manifest.tensors, new_manifest.partition_bytes)) {
    const uint64_t i =
        p.element_offset / dc::codec::PartitionElements(new_manifest.tensors[p.tensor].dtype,
                                                        new_manifest.partition_bytes);
    if (base_manifest.partition_hashes[p.tensor][i] != new_manifest.partition_hashes[p.tensor][i])
      changed.push_back(p);
  }
  out["read_pread"] =
      Figure(Best(runs,
                  [&] {
                    constexpr uint64_t kTile = uint64_t{128} << 10;
                    std::vector<std::byte> a(kTile), b(kTile);
                    for (const auto& p : changed) {
                      const uint64_t e = dc::ElementSize(new_manifest.tensors[p.tensor].dtype);
                      const uint64_t offset = p.element_offset * e, length = p.element_count * e;
                      for (uint64_t at = 0; at < length; at += kTile) {
                        const uint64_t n = std::min(kTile, length - at);
                        Check(base_store->ReadRange(p.tensor, offset + at, n, a), "read");
                        Check(new_store->ReadRange(p.tensor, offset + at, n, b), "read");
                      }
                    }
                  }),
             bytes);

  {
    auto base_mem = Check(dc::apply::HostStore::CopyOf(*base_store), "copy");
    auto new_mem = Check(dc::apply::HostStore::CopyOf(*new_store), "copy");
    // Ceilings of this machine, in the same run: one version copied whole (memcpy
    // into a buffer faulted in beforehand) and compared whole with that copy (memcmp
    // of equal bytes reads both to the end): what one thread moves through memory.
    {
      std::vector<std::byte> copy(bytes, std::byte{1});
      out["memcpy_one_version"] =
          Figure(Best(runs,
                      [&] {
                        uint64_t at = 0;
                        for (size_t t = 0; t < new_mem->tensors().size(); ++t) {
                          const auto span = new_mem->TensorData(t);
                          std::memcpy(copy.data() + at, span.data(), span.size());
                          at += span.size();
                        }
                      }),
                 bytes);
      int sign = 0;
      out["memcmp_one_version_pair"] =
          Figure(Best(runs,
                      [&] {
                        uint64_t at = 0;
                        for (size_t t = 0; t < new_mem->tensors().size(); ++t) {
                          const auto span = new_mem->TensorData(t);
                          sign |= std::memcmp(copy.data() + at, span.data(), span.size());
                          at += span.size();
                        }
                      }),
                 bytes);
      Check(sign == 0 ? dc::Status::Ok() : dc::Status::Internal("copy differs"), "memcmp");
    }
    // The change detection alone, every changed partition of both versions where they
    // lie in memory, one 128 KiB tile at a time as the encoder compares copied tiles.
    {
      dc::codec::SparseChanges changes;
      out["find_changes_in_memory"] =
          Figure(Best(runs,
                      [&] {
                        constexpr uint64_t kTile = uint64_t{128} << 10;
                        for (const auto& p : changed) {
                          const auto dtype = new_manifest.tensors[p.tensor].dtype;
                          const auto e = static_cast<uint32_t>(dc::ElementSize(dtype));
                          const auto x = base_mem->TensorData(p.tensor).subspan(
                              p.element_offset * e, p.element_count * e);
                          const auto y = new_mem->TensorData(p.tensor).subspan(p.element_offset * e,
                                                                               p.element_count * e);
                          changes.clear();
                          for (uint64_t at = 0; at < x.size(); at += kTile) {
                            const uint64_t n = std::min(kTile, x.size() - at);
                            dc::codec::FindChangesAppend(x.subspan(at, n), y.subspan(at, n), e,
                                                         static_cast<uint32_t>(at / e), changes);
                          }
                        }
                      }),
                 bytes);
    }
    out["encode_in_memory"] =
        Figure(Best(runs,
                    [&] {
                      Check(dc::codec::EncodeDelta(
                                base_manifest, new_manifest,
                                [&](size_t i) { return base_mem->TensorData(i); },
                                [&](size_t i) { return new_mem->TensorData(i); }, {}, encoder,
                                Discard, &stats),
                            "encode");
                    }),
               bytes);
  }
  // Through the mapping: fresh mappings every run, as each command has.
  out["encode_via_mapping"] = Figure(
      Best(runs,
           [&] {
             auto a =
                 Check(dc::apply::CheckpointDirStore::Open(base_dir, Access::kReadOnly), "open");
             auto b =
                 Check(dc::apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly), "open");
             Check(dc::codec::EncodeDelta(
                       base_manifest, new_manifest, [&](size_t i) { return a->TensorData(i); },
                       [&](size_t i) { return b->TensorData(i); }, {}, encoder, Discard, &stats),
                   "encode");
           }),
      bytes);
  out["encode_via_pread"] = Figure(
      Best(runs,
           [&] {
             auto a =
                 Check(dc::apply::CheckpointDirStore::Open(base_dir, Access::kReadOnly), "open");
             auto b =
                 Check(dc::apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly), "open");
             Check(
                 dc::codec::EncodeDelta(base_manifest, new_manifest, dc::apply::RangeReaderOf(*a),
                                        dc::apply::RangeReaderOf(*b), {}, encoder, Discard, &stats),
                 "encode");
           }),
      bytes);
  out["encode_via_populated_mapping"] = Figure(
      Best(runs,
           [&] {
             auto a =
                 Check(dc::apply::CheckpointDirStore::Open(base_dir, Access::kReadOnly), "open");
             auto b =
                 Check(dc::apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly), "open");
             a->set_read_path(ReadPath::kMap);
             b->set_read_path(ReadPath::kMap);
             Check(
                 dc::codec::EncodeDelta(base_manifest, new_manifest, dc::apply::RangeReaderOf(*a),
                                        dc::apply::RangeReaderOf(*b), {}, encoder, Discard, &stats),
                 "encode");
           }),
      bytes);
  out["delta_bytes"] = stats.delta_bytes;
  out["changed_partitions"] = stats.changed_partitions;
  out["partitions"] = stats.partitions;

  out["hash_via_mapping"] =
      Figure(Best(runs,
                  [&] {
                    auto b = Check(dc::apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly),
                                   "open");
                    (void)dc::codec::ComputeManifest(
                        b->tensors(), [&](size_t i) { return b->TensorData(i); },
                        new_manifest.partition_bytes, 1);
                  }),
             bytes);
  out["hash_via_pread"] =
      Figure(Best(runs,
                  [&] {
                    auto b = Check(dc::apply::CheckpointDirStore::Open(new_dir, Access::kReadOnly),
                                   "open");
                    Check(dc::codec::ComputeManifest(b->tensors(), dc::apply::RangeReaderOf(*b),
                                                     new_manifest.partition_bytes, 1),
                          "hash");
                  }),
             bytes);

  // The command itself, as a user runs it. Nothing of this process maps the files any
  // more (mapped pages would stay in the page cache of a cold run).
  base_store.reset();
  new_store.reset();
  const std::string diff = binary.string() + " diff --base " + base_dir.string() + " --new " +
                           new_dir.string() + " --out " + (dir / "bench.delta").string() +
                           " --threads 1 --mode fast --json";
  const std::string version = binary.string() + " --version";
  auto command = [&](bool cold, const std::string& env) {
    double best_wall = 1e30;
    json best;
    for (int i = 0; i < runs; ++i) {
      if (cold) {
        DropFromPageCache(base_dir);
        DropFromPageCache(new_dir);
      }
      const double cpu0 = ChildrenCpuSeconds();
      auto [text, wall] = RunCommand(env + diff);
      const double cpu = ChildrenCpuSeconds() - cpu0;  // the shell's and the command's
      if (wall < best_wall) {
        best_wall = wall;
        const json reported = json::parse(text);
        best = {{"process_seconds", wall},
                {"process_cpu_seconds", cpu},
                {"process_gb_per_s", double(bytes) / wall / 1e9},
                {"encode_seconds", reported["encode_seconds"]},
                {"encode_gbps", reported["encode_gbps"]},
                {"manifest_seconds", reported["manifest_seconds"]}};
      }
    }
    return best;
  };
  out["diff_command_line"] = diff;
  out["diff_command_map"] = command(false, "DELTACAST_CHECKPOINT_READS=map ");
  out["diff_command"] = command(false, "");
  out["diff_command_cold"] = command(true, "");
  double startup = 1e30;
  for (int i = 0; i < runs; ++i) startup = std::min(startup, RunCommand(version).second);
  out["process_startup_seconds"] = startup;

  const std::string text = out.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

// deltacast_bench_codec: delta size and codec speed on synthetic training steps.
//
// For each change rate it synthesizes a base checkpoint and one step, then measures
// on that pair: the order-0 entropy of the actual changes (the yardstick: gap
// entropy + XOR-value entropy from the pair's own histograms), fast- and
// context-mode delta sizes, sparse-XOR vs overwrite vs dense-XOR sizes, single-core
// encode and decode+apply throughput, all-core encode throughput, and the peers
// `zstd --patch-from` and `xdelta3` on the same safetensors files when installed.
// Prints one JSON document (and writes it to --out).
#include <fmt/core.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "bench/step_pair.h"
#include "codec/change_detect.h"
#include "codec/delta_encoder.h"
#include "common/parallel.h"

namespace dc = deltacast;
using deltacast::bench::Check;
using deltacast::bench::Clock;
using deltacast::bench::CpuSeconds;
using deltacast::bench::Seconds;
using deltacast::bench::SynthesizeStepPair;
using nlohmann::json;

namespace {

int g_zstd_level = deltacast::codec::EncodeOptions{}.zstd_level;  // --zstd-level

struct Histogram {
  std::unordered_map<uint64_t, uint64_t> counts;
  uint64_t total = 0;
  void Add(uint64_t v) {
    ++counts[v];
    ++total;
  }
  // Order-0 entropy of the whole sequence, in bits.
  double Bits() const {
    double bits = 0;
    for (const auto& [v, c] : counts) bits -= double(c) * std::log2(double(c) / double(total));
    return bits;
  }
};

struct PairSizes {
  uint64_t changes = 0;
  double entropy_bytes = 0;
  uint64_t sparse_xor = 0, overwrite = 0, dense_xor = 0;
};

// Walks every partition of the pair once: entropy histograms and per-encoding sizes.
PairSizes MeasurePair(const dc::apply::WeightStore& a, const dc::apply::WeightStore& b,
                      const dc::codec::Manifest& manifest) {
  PairSizes out;
  Histogram gaps, xors;
  dc::codec::CodecScratch scratch;
  dc::codec::SparseChanges changes;
  dc::codec::EncodeOptions options;
  for (const auto& p : dc::codec::PartitionTensors(manifest.tensors, manifest.partition_bytes)) {
    const auto& info = manifest.tensors[p.tensor];
    const uint32_t e = static_cast<uint32_t>(dc::ElementSize(info.dtype));
    const auto base = a.TensorData(p.tensor).subspan(p.element_offset * e, p.element_count * e);
    const auto target = b.TensorData(p.tensor).subspan(p.element_offset * e, p.element_count * e);
    dc::codec::FindChanges(base, target, e, changes);
    if (changes.size() == 0) continue;
    uint64_t next = 0;
    for (size_t i = 0; i < changes.size(); ++i) {
      gaps.Add(changes.positions[i] - next);
      next = changes.positions[i] + 1;
      uint64_t x = 0;
      std::memcpy(&x, changes.xors.data() + i * e, e);
      xors.Add(x);
    }
    out.changes += changes.size();
    using dc::codec::Encoding;
    for (auto [encoding, total] : {std::pair{Encoding::kSparseXor, &out.sparse_xor},
                                   std::pair{Encoding::kOverwrite, &out.overwrite},
                                   std::pair{Encoding::kDenseXor, &out.dense_xor}}) {
      auto encoded = Check(dc::codec::EncodePartitionAs(encoding, info.dtype, base, target, changes,
                                                        options, scratch),
                           "encode");
      *total += encoded.payload.size();
    }
  }
  out.entropy_bytes = (gaps.Bits() + xors.Bits()) / 8;
  return out;
}

struct CodecRun {
  uint64_t delta_bytes = 0;
  double encode_seconds = 0;
  double encode_cpu_seconds = 0;
  double apply_seconds = 0;  // one pass: partitions at base are not hashed before
  double apply_cpu_seconds = 0;
  double hash_first_apply_seconds = 0;  // every partition hashed before it is patched
  double hash_first_apply_cpu_seconds = 0;
  bool bit_exact = false;
  json encodings;
};

// Encodes base->target with `threads`, then applies it single-threaded to an
// in-memory copy of the base and checks the result's version id.
CodecRun RunCodec(const dc::apply::WeightStore& a, const dc::apply::WeightStore& b,
                  const dc::codec::Manifest& ma, const dc::codec::Manifest& mb,
                  dc::codec::CodecMode mode, size_t threads, bool apply) {
  CodecRun run;
  std::vector<std::vector<std::byte>> chunks;
  dc::codec::DeltaEncoderOptions options;
  options.codec.mode = mode;
  options.codec.zstd_level = g_zstd_level;
  options.threads = threads;
  dc::codec::DeltaStats stats;
  const double cpu0 = CpuSeconds();
  auto status = dc::codec::EncodeDelta(
      ma, mb, [&](size_t i) { return a.TensorData(i); }, [&](size_t i) { return b.TensorData(i); },
      b.LayoutId(), options,
      [&](std::vector<std::byte>&& c) {
        chunks.push_back(std::move(c));
        return dc::Status::Ok();
      },
      &stats);
  if (!status.ok()) {
    fmt::print(stderr, "encode: {}\n", status.ToString());
    std::exit(1);
  }
  run.encode_cpu_seconds = CpuSeconds() - cpu0;
  run.delta_bytes = stats.delta_bytes;
  run.encode_seconds = stats.seconds;
  run.encodings = json::object();
  for (uint8_t e = 1; e <= dc::codec::kMaxEncoding; ++e) {
    if (stats.records_by_encoding[e]) {
      run.encodings[std::string(dc::codec::EncodingName(static_cast<dc::codec::Encoding>(e)))] =
          stats.records_by_encoding[e];
    }
  }
  if (!apply) return run;

  // One pass (the manifest vouched for, as a node whose journal says it is cleanly
  // at the base), then with every partition hashed first (as after a crash).
  run.bit_exact = true;
  for (const bool one_pass : {true, false}) {
    auto store = Check(dc::apply::HostStore::CopyOf(a), "copy base");
    // Touch the copy once so page faults are not charged to apply.
    for (size_t t = 0; t < store->tensors().size(); ++t) (void)dc::Hash64(store->TensorData(t));
    dc::apply::ApplyOptions apply_options;
    apply_options.threads = 1;
    apply_options.store_at_manifest = one_pass;
    dc::apply::DeltaApplier applier(
        *store, ma, {ma.VersionId(), mb.VersionId(), ma.partition_bytes}, apply_options);
    const auto start = Clock::now();
    const double apply_cpu0 = CpuSeconds();
    dc::codec::DeltaSummary summary;
    for (const auto& bytes : chunks) {
      auto chunk = Check(dc::codec::ParseChunk(bytes), "parse chunk");
      if (chunk.kind == dc::codec::ChunkKind::kEnd) {
        summary = chunk.summary;
        continue;
      }
      auto s = applier.ApplyChunk(chunk);
      if (!s.ok()) {
        fmt::print(stderr, "apply: {}\n", s.ToString());
        std::exit(1);
      }
    }
    auto target = applier.Finish(summary);
    (one_pass ? run.apply_seconds : run.hash_first_apply_seconds) = Seconds(start);
    (one_pass ? run.apply_cpu_seconds : run.hash_first_apply_cpu_seconds) =
        CpuSeconds() - apply_cpu0;
    // Bit-exact: the store itself hashes to the target version, not only the
    // applier's bookkeeping.
    const auto stored = dc::codec::ComputeManifest(
        store->tensors(), [&](size_t i) { return store->TensorData(i); }, ma.partition_bytes, 1);
    run.bit_exact = run.bit_exact && target.ok() && target->VersionId() == mb.VersionId() &&
                    stored.VersionId() == mb.VersionId();
  }
  return run;
}

// Runs a peer tool on every safetensors file pair; total output bytes and seconds.
json RunPeer(const std::string& tool, const dc::apply::CheckpointLayout& layout,
             const std::filesystem::path& base, const std::filesystem::path& target,
             const std::filesystem::path& scratch) {
  if (std::system(("command -v " + tool + " >/dev/null 2>&1").c_str()) != 0)
    return {{"available", false}};
  uint64_t bytes = 0;
  const auto start = Clock::now();
  for (const auto& file : layout.files) {
    const auto out = scratch / (file.name + "." + tool);
    std::string cmd =
        tool == "zstd"
            ? fmt::format("zstd -q -f -T1 --long=31 --patch-from='{}' '{}' -o '{}'",
                          (base / file.name).string(), (target / file.name).string(), out.string())
            : fmt::format("xdelta3 -f -e -s '{}' '{}' '{}'", (base / file.name).string(),
                          (target / file.name).string(), out.string());
    if (std::system(cmd.c_str()) != 0) return {{"available", true}, {"error", "failed: " + cmd}};
    bytes += std::filesystem::file_size(out);
    std::filesystem::remove(out);
  }
  return {{"available", true}, {"bytes", bytes}, {"seconds", Seconds(start)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast codec benchmark"};
  std::string params_text = "100M", out_path;
  std::vector<std::string> rates_text = {"1%", "3%", "5%", "10%"};
  std::filesystem::path work = std::filesystem::temp_directory_path() / "deltacast-bench-codec";
  bool peers = true;
  uint64_t seed = 1;
  app.add_option("--params", params_text, "Model size per pair")->capture_default_str();
  app.add_option("--rates", rates_text, "Change rates")->capture_default_str();
  app.add_option("--work-dir", work, "Scratch directory (removed afterwards)")
      ->capture_default_str();
  app.add_option("--out", out_path, "Also write the JSON here");
  app.add_option("--seed", seed, "Synthesis seed")->capture_default_str();
  app.add_option("--zstd-level", g_zstd_level, "zstd level of the fast mode (negative: faster)")
      ->capture_default_str();
  app.add_flag("!--no-peers", peers, "Skip zstd --patch-from and xdelta3");
  CLI11_PARSE(app, argc, argv);
  const uint64_t params = Check(dc::agent::ParseParamCount(params_text), "--params");
  const size_t cores = dc::DefaultThreadCount();

  json results = json::array();
  for (const auto& rate_text : rates_text) {
    const double rate = Check(dc::agent::ParseRate(rate_text), "--rates");
    auto pair = SynthesizeStepPair(work, params, rate, seed);
    const auto& a = pair.base;
    const auto& b = pair.target;

    const auto t0 = Clock::now();
    auto ma = dc::codec::ComputeManifest(
        a->tensors(), [&](size_t i) { return a->TensorData(i); }, dc::codec::kDefaultPartitionBytes,
        1);
    const double manifest_seconds = Seconds(t0);
    auto mb = dc::codec::ComputeManifest(
        b->tensors(), [&](size_t i) { return b->TensorData(i); }, dc::codec::kDefaultPartitionBytes,
        1);
    const double gb = double(ma.TotalBytes()) / 1e9;
    const PairSizes sizes = MeasurePair(*a, *b, ma);
    const CodecRun fast = RunCodec(*a, *b, ma, mb, dc::codec::CodecMode::kFast, 1, true);
    const CodecRun fast_all = RunCodec(*a, *b, ma, mb, dc::codec::CodecMode::kFast, cores, false);
    const CodecRun context = RunCodec(*a, *b, ma, mb, dc::codec::CodecMode::kContext, 1, true);

    json row = {
        {"change_rate_target", rate},
        {"params", ma.TotalBytes() / 2},
        {"checkpoint_bytes", ma.TotalBytes()},
        {"changed_elements", sizes.changes},
        {"change_rate_measured", double(sizes.changes) / double(ma.TotalBytes() / 2)},
        {"order0_entropy_bytes", sizes.entropy_bytes},
        {"fast",
         {{"delta_bytes", fast.delta_bytes},
          {"bits_per_param", 8.0 * fast.delta_bytes / double(ma.TotalBytes() / 2)},
          {"ratio_to_entropy", fast.delta_bytes / sizes.entropy_bytes},
          {"encode_gbps_per_core", gb / fast.encode_cpu_seconds},
          {"encode_gbps_one_thread_wall", gb / fast.encode_seconds},
          {"encode_gbps_all_cores_wall", gb / fast_all.encode_seconds},
          {"decode_apply_gbps_per_core", gb / fast.apply_cpu_seconds},
          {"decode_apply_gbps_one_thread_wall", gb / fast.apply_seconds},
          {"decode_apply_hash_first_gbps_per_core", gb / fast.hash_first_apply_cpu_seconds},
          {"bit_exact", fast.bit_exact},
          {"records_by_encoding", fast.encodings}}},
        {"context",
         {{"delta_bytes", context.delta_bytes},
          {"bits_per_param", 8.0 * context.delta_bytes / double(ma.TotalBytes() / 2)},
          {"ratio_to_entropy", context.delta_bytes / sizes.entropy_bytes},
          {"encode_gbps_per_core", gb / context.encode_cpu_seconds},
          {"decode_apply_gbps_per_core", gb / context.apply_cpu_seconds},
          {"decode_apply_hash_first_gbps_per_core", gb / context.hash_first_apply_cpu_seconds},
          {"bit_exact", context.bit_exact},
          {"records_by_encoding", context.encodings}}},
        {"sparse_xor_payload_bytes", sizes.sparse_xor},
        {"overwrite_payload_bytes", sizes.overwrite},
        {"xor_to_overwrite_ratio", double(sizes.sparse_xor) / double(sizes.overwrite)},
        {"context_xor_to_overwrite_ratio", double(context.delta_bytes) / double(sizes.overwrite)},
        {"dense_xor_zstd_bytes", sizes.dense_xor},
        {"manifest_gbps_per_core", gb / manifest_seconds},
    };
    row["targets"] = {
        {"fast_size_le_1_10_entropy", row["fast"]["ratio_to_entropy"].get<double>() <= 1.10},
        {"fast_encode_ge_3_gbps", row["fast"]["encode_gbps_per_core"].get<double>() >= 3.0},
        {"fast_decode_apply_ge_5_gbps",
         row["fast"]["decode_apply_gbps_per_core"].get<double>() >= 5.0},
        {"context_size_le_0_80_entropy", row["context"]["ratio_to_entropy"].get<double>() <= 0.80},
        {"context_encode_ge_0_3_gbps", row["context"]["encode_gbps_per_core"].get<double>() >= 0.3},
        {"xor_le_0_45_overwrite", row["xor_to_overwrite_ratio"].get<double>() <= 0.45},
        {"context_xor_le_0_45_overwrite",
         row["context_xor_to_overwrite_ratio"].get<double>() <= 0.45},
    };
    if (peers) {
      row["zstd_patch_from"] = RunPeer("zstd", a->layout(), work / "step0", work / "step1", work);
      row["xdelta3"] = RunPeer("xdelta3", a->layout(), work / "step0", work / "step1", work);
    }
    fmt::print(
        stderr,
        "rate {}: fast {:.3f}x entropy, context {:.3f}x, encode {:.2f} GB/s, apply {:.2f} GB/s "
        "(hash first {:.2f})\n",
        rate_text, row["fast"]["ratio_to_entropy"].get<double>(),
        row["context"]["ratio_to_entropy"].get<double>(),
        row["fast"]["encode_gbps_per_core"].get<double>(),
        row["fast"]["decode_apply_gbps_per_core"].get<double>(),
        row["fast"]["decode_apply_hash_first_gbps_per_core"].get<double>());
    results.push_back(row);
  }
  std::filesystem::remove_all(work);
  json doc = {
      {"benchmark", "codec"}, {"cores", cores}, {"params", params_text}, {"results", results}};
  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

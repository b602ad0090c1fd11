// deltacast_bench_fp8: FP8 serving deltas against BF16 deltas of the same steps
// (issue 29, docs/fp8.md).
//
// For each change rate: `synth` makes a Llama-shaped BF16 checkpoint and one
// AdamW-like step (FP32 masters rounded to BF16, agent/synth.h); both are quantized
// to their FP8 serving twins by synth's default serving description (decoder
// linears in the scheme given, norms, router, embeddings and LM head kept BF16).
// On the same pair it measures, in one run: the delta bytes of the BF16 step and of
// the FP8 twin step in fast and context mode; the fraction of BF16 elements and of
// FP8 bytes (and scales) that changed; bit_exact: the FP8 delta applied to a copy of
// the previous twin hashes to the quantizer's own twin of the new step (every
// partition and the version id); and the quantizer's speed, one thread, in GB/s of
// BF16 input (the AVX2 loops and the baseline ones), plus the producer's speed with
// quantization included (quantize + fast encode of the FP8 twin, CPU time). The
// tensors kept BF16 (embeddings, LM head, norms, router) change alike in both steps;
// their delta, encoded alone, is reported so the quantized tensors' own ratio shows.
// The producer path (relay/producers/fp8_share.h, docs/fp8.md "Producers"), on the same step
// written as a TP-split training job's shards (--tp; the MLP's TP cut falls inside
// 128 x 128 blocks when intermediate / tp is not a multiple of 128): per rank,
// one thread, the amax pass, the split-amax exchange (SPLIT_AMAXES messages, in
// process), quantizing both versions and the fast encode of the FP8 image, in CPU
// seconds per BF16 byte of the rank's new shard (best of --producer-reps) and in
// wall time (the least wall; one thread, so per core), on a first refit (both
// versions quantized) and on a steady one (from the committed image); and the
// exchange's bytes against gathering the split blocks' elements.
// Prints one JSON document (and writes it to --out).
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "agent/fp8_twin.h"
#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/delta_applier.h"
#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "bench/step_pair.h"
#include "codec/delta_encoder.h"
#include "common/parallel.h"
#include "quant/fp8_quantizer.h"
#include "relay/producers/fp8_share.h"
#include "relay/producers/shard_input.h"
#include "relay/producers/split_amax_exchange.h"

namespace dc = deltacast;
using deltacast::bench::Check;
using deltacast::bench::Clock;
using deltacast::bench::Seconds;
using deltacast::bench::SynthesizeStepPair;
using deltacast::bench::ThreadCpuSeconds;
using nlohmann::json;

namespace {

struct CodecRun {
  uint64_t delta_bytes = 0;
  double encode_cpu_seconds = 0;
  bool bit_exact = false;
};

// Encodes a->b on one thread; with `apply`, applies it to a copy of `a` and checks
// that the copy hashes to b's manifest.
CodecRun RunCodec(const dc::apply::WeightStore& a, const dc::apply::WeightStore& b,
                  dc::codec::CodecMode mode, bool apply) {
  const auto ma = dc::codec::ComputeManifest(
      a.tensors(), [&](size_t i) { return a.TensorData(i); }, dc::codec::kDefaultPartitionBytes, 1);
  const auto mb = dc::codec::ComputeManifest(
      b.tensors(), [&](size_t i) { return b.TensorData(i); }, dc::codec::kDefaultPartitionBytes, 1);
  CodecRun run;
  std::vector<std::vector<std::byte>> chunks;
  dc::codec::DeltaEncoderOptions options;
  options.codec.mode = mode;
  options.threads = 1;
  dc::codec::DeltaStats stats;
  const double cpu0 = ThreadCpuSeconds();
  Check(dc::codec::EncodeDelta(
            ma, mb, [&](size_t i) { return a.TensorData(i); },
            [&](size_t i) { return b.TensorData(i); }, b.LayoutId(), options,
            [&](std::vector<std::byte>&& c) {
              chunks.push_back(std::move(c));
              return dc::Status::Ok();
            },
            &stats),
        "encode");
  run.encode_cpu_seconds = ThreadCpuSeconds() - cpu0;
  run.delta_bytes = stats.delta_bytes;
  if (!apply) return run;
  auto store = Check(dc::apply::HostStore::CopyOf(a), "copy base");
  dc::apply::ApplyOptions apply_options;
  apply_options.threads = 1;
  dc::apply::DeltaApplier applier(*store, ma, {ma.VersionId(), mb.VersionId(), ma.partition_bytes},
                                  apply_options);
  dc::codec::DeltaSummary summary;
  for (const auto& bytes : chunks) {
    auto chunk = Check(dc::codec::ParseChunk(bytes), "parse chunk");
    if (chunk.kind == dc::codec::ChunkKind::kEnd) {
      summary = chunk.summary;
      continue;
    }
    Check(applier.ApplyChunk(chunk), "apply");
  }
  auto target = applier.Finish(summary);
  const auto stored = dc::codec::ComputeManifest(
      store->tensors(), [&](size_t i) { return store->TensorData(i); }, ma.partition_bytes, 1);
  run.bit_exact = target.ok() && target->VersionId() == mb.VersionId() &&
                  stored.VersionId() == mb.VersionId() &&
                  stored.partition_hashes == mb.partition_hashes;
  return run;
}

// Elements (of `dtype` width) whose bits differ between two stores with the same
// tensors, over the tensors `use` selects.
std::pair<uint64_t, uint64_t> Changed(const dc::apply::WeightStore& a,
                                      const dc::apply::WeightStore& b,
                                      const std::function<bool(const dc::TensorSpec&)>& use) {
  uint64_t changed = 0, total = 0;
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto& t = a.tensors()[i];
    if (!use(t)) continue;
    const size_t w = dc::ElementSize(t.dtype);
    const auto x = a.TensorData(i), y = b.TensorData(i);
    for (size_t e = 0; e < x.size(); e += w) changed += std::memcmp(&x[e], &y[e], w) != 0;
    total += x.size() / w;
  }
  return {changed, total};
}

// One thread quantizing every quantized tensor of `bf16`: CPU seconds and BF16 bytes.
std::pair<double, uint64_t> TimeQuantizer(const dc::apply::WeightStore& bf16,
                                          const std::vector<dc::quant::ServedTensor>& plan,
                                          dc::quant::Fp8CpuLoops loops) {
  dc::quant::LimitFp8CpuPath(loops);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < bf16.tensors().size(); ++i) index[bf16.tensors()[i].name] = i;
  std::vector<uint8_t> weight;
  std::vector<float> scale;
  double seconds = 0;
  uint64_t bytes = 0;
  for (const auto& s : plan) {
    if (!s.quantized()) continue;
    const auto data = bf16.TensorData(index.at(s.canonical.name));
    const uint64_t rows = s.canonical.shape[0], cols = s.canonical.shape[1];
    weight.resize(rows * cols);
    scale.resize(s.scale.ElementCount());
    const std::span<const uint16_t> in(reinterpret_cast<const uint16_t*>(data.data()), rows * cols);
    const double t0 = ThreadCpuSeconds();
    Check(dc::quant::QuantizeFp8(*s.scheme, s.canonical.name, in, rows, cols, weight, scale),
          "quantize");
    seconds += ThreadCpuSeconds() - t0;
    bytes += data.size();
  }
  dc::quant::ForceFp8BaselinePath(false);
  return {seconds, bytes};
}

// A store borrowing the tensors of `store` that `use` selects (encode only).
std::unique_ptr<dc::apply::HostStore> Subset(
    dc::apply::HostStore& store, const std::function<bool(const dc::TensorSpec&)>& use) {
  std::vector<std::pair<dc::TensorSpec, dc::MutableByteSpan>> tensors;
  for (size_t i = 0; i < store.tensors().size(); ++i) {
    if (use(store.tensors()[i])) {
      tensors.emplace_back(store.tensors()[i], Check(store.MutableTensorData(i), "tensor data"));
    }
  }
  return Check(dc::apply::HostStore::Borrow(std::move(tensors)), "subset");
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// A TP-split job's ranks over step0's and step1's shards under `work`.
struct Rank {
  std::unique_ptr<dc::relay::ShardFile> steps[2];
  dc::relay::RankPlacement placement;
  std::unique_ptr<dc::relay::Fp8Share> image;  // the last pass's
};

struct ProducerPass {
  double amax_cpu = 0, quantize_cpu = 0, encode_cpu = 0;
  double wall = 0;  // the same work's wall time (one thread: wall per core)
  uint64_t delta_bytes = 0, quantized = 0;
  dc::relay::SplitAmaxStats exchange;
};

// One refit of every rank, step `from` -> `to`, one thread each, as relay::Producer
// runs it (the exchange in process). With `reuse`, each rank starts from its last
// pass's image (a producer's committed image); `encode` false stops after quantizing.
ProducerPass Pass(std::vector<Rank>& rs, int from, int to,
                  const dc::quant::ServingDescription& serving, bool reuse, bool encode) {
  namespace relay = dc::relay;
  ProducerPass out;
  relay::SplitAmaxExchange exchange(rs.size());
  std::vector<std::unique_ptr<relay::Fp8Share>> shares(rs.size());
  for (size_t r = 0; r < rs.size(); ++r) {
    Rank& k = rs[r];
    relay::ShareInput in{&k.placement.map,
                         [&k, from](uint32_t i) { return k.steps[from]->TensorData(i); },
                         [&k, to](uint32_t i) { return k.steps[to]->TensorData(i); }};
    auto plan = Check(dc::quant::PlanServing(serving, k.placement.map.canonical()), "plan");
    const double t0 = ProcessCpuSeconds();
    const auto w0 = Clock::now();
    shares[r] = Check(relay::Fp8Share::Plan(in, std::move(plan)), "fp8 share");
    if (reuse) Check(shares[r]->TakeBaseFrom(*k.image), "reuse the image");
    Check(shares[r]->ComputeAmaxes(1), "amaxes");
    const auto message = relay::EncodeSplitAmaxes({1, shares[r]->SplitBlocks()});
    out.amax_cpu += ProcessCpuSeconds() - t0;
    out.wall += Seconds(w0);
    Check(exchange.Add(dc::agent::RankFileStem(r), Check(relay::ParseSplitAmaxes(message), "parse"),
                       message.size()),
          "exchange");
  }
  const auto answers = exchange.Answers(1);
  out.exchange = exchange.stats();
  for (size_t r = 0; r < rs.size(); ++r) {
    relay::Fp8Share& share = *shares[r];
    const auto answer =
        Check(relay::ParseSplitAmaxes(answers.at(dc::agent::RankFileStem(r))), "answer");
    const double t0 = ProcessCpuSeconds();
    const auto w0 = Clock::now();
    Check(share.SetSplitAmaxes(answer.blocks), "set amaxes");
    Check(share.Quantize(1), "quantize");
    out.quantize_cpu += ProcessCpuSeconds() - t0;
    out.wall += Seconds(w0);
    out.quantized += share.stats().quantized_bf16_bytes;
    if (encode) {
      const relay::ShareInput image = share.Input();
      const auto coverage = relay::ShareCoverage(*image.map, dc::codec::kDefaultPartitionBytes);
      // The root sends the base hashes (it knows the base): not the producer's work.
      const auto pieces = Check(
          relay::HashShare(image, coverage, dc::codec::kDefaultPartitionBytes, 1), "hash base");
      std::vector<dc::PartitionHash> hashes(coverage.size());
      for (size_t i = 0; i < coverage.size(); ++i) {
        const auto& t = image.map->canonical()[coverage[i].tensor];
        hashes[i] = dc::CombinePieces(std::span(&pieces[i], 1),
                                      coverage[i].length * dc::ElementSize(t.dtype));
      }
      relay::ShareEncodeOptions options;
      options.threads = 1;
      const double t1 = ProcessCpuSeconds();
      const auto w1 = Clock::now();
      auto encoded = Check(relay::EncodeShare(image, coverage, hashes, options), "encode share");
      out.encode_cpu += ProcessCpuSeconds() - t1;
      out.wall += Seconds(w1);
      out.delta_bytes += encoded.stats.chunk_bytes + encoded.stats.piece_bytes;
    }
    rs[r].image = std::move(shares[r]);
  }
  return out;
}

json PassJson(const ProducerPass& p, uint64_t shard_bytes) {
  const double cpu = p.amax_cpu + p.quantize_cpu + p.encode_cpu;
  return {{"amax_cpu_seconds", p.amax_cpu},
          {"quantize_cpu_seconds", p.quantize_cpu},
          {"encode_cpu_seconds", p.encode_cpu},
          {"quantized_bf16_bytes", p.quantized},
          {"producer_gbps_per_core_bf16_input", double(shard_bytes) / 1e9 / cpu},
          {"cpu_seconds_per_gb_bf16_input", cpu / (double(shard_bytes) / 1e9)},
          {"wall_seconds", p.wall},
          {"producer_gbps_per_core_wall", double(shard_bytes) / 1e9 / p.wall},
          {"delta_bytes_before_merge", p.delta_bytes}};
}

// The producers of step0 -> step1's shards under `work`: a first refit (both
// versions quantized) and a steady one (starting from the committed image of the
// previous refit, as a long-lived relay::Producer does).
json RunProducers(const std::filesystem::path& work, uint64_t ranks,
                  const dc::quant::ServingDescription& serving, int reps) {
  std::vector<Rank> rs(ranks);
  uint64_t shard_bytes = 0;
  for (uint64_t r = 0; r < ranks; ++r) {
    const std::string stem = dc::agent::RankFileStem(r);
    Rank& k = rs[r];
    for (int step = 0; step < 2; ++step) {
      k.steps[step] = Check(
          dc::relay::ShardFile::Open(dc::agent::ShardDirOf(work / ("step" + std::to_string(step))) /
                                     (stem + ".safetensors")),
          "shard");
    }
    k.placement =
        Check(dc::relay::LoadRankPlacement(dc::agent::ShardDirOf(work / "step1") / (stem + ".toml"),
                                           k.steps[1]->tensors()),
              "placement");
    // A trainer's shards are in memory: fault the mapped files in before timing.
    uint64_t touched = 0;
    for (size_t i = 0; i < k.steps[1]->tensors().size(); ++i) {
      shard_bytes += k.steps[1]->TensorData(i).size();
      for (const auto& f : k.steps) {
        const auto data = f->TensorData(i);
        for (size_t b = 0; b < data.size(); b += 4096) touched += uint8_t(data[b]);
      }
    }
    if (touched == 1) fmt::print(stderr, " ");  // keeps the loop
  }
  // Best of three (least CPU): the machine may be shared.
  const auto cpu = [](const ProducerPass& p) { return p.amax_cpu + p.quantize_cpu + p.encode_cpu; };
  ProducerPass first, steady;
  double first_wall = 0, steady_wall = 0;  // the least wall, whichever pass had it
  for (int rep = 0; rep < reps; ++rep) {
    const ProducerPass f = Pass(rs, 0, 1, serving, false, true);
    if (rep == 0 || cpu(f) < cpu(first)) first = f;
    if (rep == 0 || f.wall < first_wall) first_wall = f.wall;
    (void)Pass(rs, 1, 0, serving, false, false);  // the committed image of step 0
    const ProducerPass s = Pass(rs, 0, 1, serving, true, true);
    if (rep == 0 || cpu(s) < cpu(steady)) steady = s;
    if (rep == 0 || s.wall < steady_wall) steady_wall = s.wall;
  }
  const double gb = double(shard_bytes) / 1e9;
  const auto& x = first.exchange;
  return {{"ranks", ranks},
          {"new_shard_bf16_bytes", shard_bytes},
          {"first_refit", PassJson(first, shard_bytes)},
          {"steady_refit", PassJson(steady, shard_bytes)},
          {"producer_gbps_per_core_bf16_input",
           PassJson(steady, shard_bytes)["producer_gbps_per_core_bf16_input"]},
          {"producer_cpu_seconds_per_gb_bf16_input", cpu(steady) / gb},
          {"producer_gbps_per_core_wall", gb / steady_wall},
          {"first_refit_gbps_per_core_wall", gb / first_wall},
          {"split_blocks", x.split_blocks},
          {"split_block_pieces", x.pieces},
          {"split_amax_exchange_bytes", x.exchange_bytes},
          {"split_blocks_gather_bytes", x.gather_bytes},
          {"steady_split_amax_exchange_bytes", steady.exchange.exchange_bytes}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast FP8 serving delta benchmark"};
  std::string params_text = "100M", out_path, scheme = "fp8_e4m3_block128";
  std::vector<std::string> rates_text = {"1%", "2.29%", "3%"};
  std::filesystem::path work = std::filesystem::temp_directory_path() / "deltacast-bench-fp8";
  uint64_t seed = 1, tp = 4;
  int producer_reps = 3;
  std::vector<double> embedding_shares = {0};
  app.add_option("--params", params_text, "Model size")->capture_default_str();
  app.add_option("--tp", tp, "TP degree of the producers' shards (0: no producer run)")
      ->capture_default_str();
  app.add_option("--producer-reps", producer_reps, "Producer passes to take the best of")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rates", rates_text, "BF16 change rates of the step")->capture_default_str();
  app.add_option("--scheme", scheme, "FP8 scheme (quant/fp8_scheme.cc)")->capture_default_str();
  app.add_option("--work-dir", work, "Scratch directory (removed afterwards)")
      ->capture_default_str();
  app.add_option("--out", out_path, "Also write the JSON here");
  app.add_option("--seed", seed, "Synthesis seed")->capture_default_str();
  app.add_option("--embedding-shares", embedding_shares,
                 "Shares of the model in embeddings + LM head (kept BF16) to synthesize; "
                 "0: synth's default shape (a quarter at this size)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const uint64_t params = Check(dc::agent::ParseParamCount(params_text), "--params");
  const size_t cores = dc::DefaultThreadCount();
  const auto serving = dc::agent::DefaultFp8Serving(scheme);
  if (serving.scheme == nullptr) {
    fmt::print(stderr, "unknown scheme {} (known: {})\n", scheme, dc::quant::Fp8SchemeNames());
    return 2;
  }

  json results = json::array();
  for (const double embedding_share : embedding_shares)
    for (const auto& rate_text : rates_text) {
      const double rate = Check(dc::agent::ParseRate(rate_text), "--rates");
      dc::agent::ShardSpec shards;
      if (tp > 0) shards = Check(dc::agent::ParseShardSpec("tp=" + std::to_string(tp)), "--tp");
      auto pair = SynthesizeStepPair(work, params, rate, seed, shards, embedding_share);
      const auto& report = pair.report;
      const auto& a = pair.base;
      const auto& b = pair.target;
      const auto plan = Check(dc::agent::PlanFp8Twin(serving, a->tensors()), "plan");
      auto fa = Check(dc::agent::QuantizeStore(*a, plan, cores), "quantize step0");
      auto fb = Check(dc::agent::QuantizeStore(*b, plan, cores), "quantize step1");

      std::set<std::string> quantized;
      for (const auto& s : plan) {
        if (s.quantized()) quantized.insert(s.canonical.name);
      }
      const auto all = [](const dc::TensorSpec&) { return true; };
      const auto bf16_all = Changed(*a, *b, all);
      const auto bf16_q =
          Changed(*a, *b, [&](const auto& t) { return quantized.contains(t.name); });
      const auto fp8_w =
          Changed(*fa, *fb, [](const auto& t) { return t.dtype == dc::DType::kF8E4M3; });
      const auto fp8_s =
          Changed(*fa, *fb, [](const auto& t) { return t.name.ends_with("_scale_inv"); });
      const auto fp8_kept =
          Changed(*fa, *fb, [](const auto& t) { return t.dtype == dc::DType::kBF16; });

      using dc::quant::Fp8CpuLoops;
      const auto [avx_s, q_bytes] = TimeQuantizer(*b, plan, Fp8CpuLoops::kAvx512);
      const auto [avx2_s, q_bytes2] = TimeQuantizer(*b, plan, Fp8CpuLoops::kAvx2);
      const auto [base_s, q_bytes3] = TimeQuantizer(*b, plan, Fp8CpuLoops::kBaseline);
      (void)q_bytes2;
      (void)q_bytes3;

      // The tensors kept BF16 change alike in both deltas; their own delta, encoded
      // alone, splits each twin delta into its kept and its quantized part.
      const auto kept = [](const dc::TensorSpec& t) { return t.dtype == dc::DType::kBF16; };
      auto kept_a = Subset(*fa, kept), kept_b = Subset(*fb, kept);

      json modes = json::array();
      for (const auto mode : {dc::codec::CodecMode::kFast, dc::codec::CodecMode::kContext}) {
        const CodecRun bf = RunCodec(*a, *b, mode, false);
        const CodecRun f8 = RunCodec(*fa, *fb, mode, true);
        const CodecRun kp = RunCodec(*kept_a, *kept_b, mode, false);
        const bool fast = mode == dc::codec::CodecMode::kFast;
        json m = {{"mode", fast ? "fast" : "context"},
                  {"bf16_delta_bytes", bf.delta_bytes},
                  {"fp8_delta_bytes", f8.delta_bytes},
                  {"fp8_to_bf16", double(f8.delta_bytes) / double(bf.delta_bytes)},
                  {"fp8_le_0_2_bf16", double(f8.delta_bytes) <= 0.2 * double(bf.delta_bytes)},
                  {"bit_exact", f8.bit_exact},
                  {"kept_bf16_delta_bytes", kp.delta_bytes},
                  {"fp8_to_bf16_quantized_tensors",
                   double(f8.delta_bytes - std::min(f8.delta_bytes, kp.delta_bytes)) /
                       double(bf.delta_bytes - std::min(bf.delta_bytes, kp.delta_bytes))},
                  {"fp8_encode_cpu_seconds", f8.encode_cpu_seconds}};
        if (fast) {
          // The producer's work per BF16 byte: quantize the step, then encode the twin.
          m["producer_gbps_per_core_bf16_input"] =
              double(q_bytes) / 1e9 / (avx_s + f8.encode_cpu_seconds);
        }
        modes.push_back(m);
      }
      json row = {
          {"change_rate_target", rate},
          {"params", report.params},
          {"embedding_share_asked", embedding_share},
          {"vocab", report.vocab},
          {"kept_bf16_share", 1.0 - double(q_bytes) / double(uint64_t{report.params} * 2)},
          {"lr", report.lr},
          {"bf16_changed_fraction", double(bf16_all.first) / double(bf16_all.second)},
          {"bf16_changed_fraction_quantized_tensors", double(bf16_q.first) / double(bf16_q.second)},
          {"fp8_changed_fraction", double(fp8_w.first) / double(fp8_w.second)},
          {"fp8_scales_changed", fp8_s.first},
          {"fp8_scales", fp8_s.second},
          {"kept_bf16_changed_fraction",
           fp8_kept.second ? double(fp8_kept.first) / double(fp8_kept.second) : 0.0},
          {"bf16_checkpoint_bytes", uint64_t{report.params} * 2},
          {"quantized_bf16_bytes", q_bytes},
          {"quantizer_gbps_per_core", double(q_bytes) / 1e9 / avx_s},
          {"quantizer_path", std::string(dc::quant::Fp8CpuPath())},
          {"quantizer_avx2_gbps_per_core", double(q_bytes) / 1e9 / avx2_s},
          {"quantizer_baseline_gbps_per_core", double(q_bytes) / 1e9 / base_s},
          {"modes", modes},
      };
      if (tp > 0) {
        row["producers"] = RunProducers(work, shards.Ranks(), serving, producer_reps);
        row["producers"]["tp"] = tp;
        const auto& pr = row["producers"];
        fmt::print(stderr,
                   "rate {}: {} producers (tp={}): {:.2f} GB/s/core of new BF16 shard from the "
                   "committed image by CPU time ({:.3f} CPU s/GB; {:.2f} by wall; {:.2f} on a "
                   "first refit); {} split blocks, {} B exchanged vs {} B to gather\n",
                   rate_text, shards.Ranks(), tp,
                   pr["steady_refit"]["producer_gbps_per_core_bf16_input"].get<double>(),
                   pr["producer_cpu_seconds_per_gb_bf16_input"].get<double>(),
                   pr["producer_gbps_per_core_wall"].get<double>(),
                   pr["first_refit"]["producer_gbps_per_core_bf16_input"].get<double>(),
                   pr["split_blocks"].get<uint64_t>(),
                   pr["split_amax_exchange_bytes"].get<uint64_t>(),
                   pr["split_blocks_gather_bytes"].get<uint64_t>());
      }
      fmt::print(stderr,
                 "rate {} (kept BF16 {:.1f}% of the model): BF16 {:.3f}% changed, FP8 {:.3f}% of "
                 "bytes, {} of {} scales; fast {:.3f}x "
                 "BF16, context {:.3f}x (quantized tensors alone: {:.3f}x, {:.3f}x); quantizer "
                 "{:.2f} GB/s/core ({} ), baseline {:.2f}\n",
                 rate_text, 100 * row["kept_bf16_share"].get<double>(),
                 100 * row["bf16_changed_fraction"].get<double>(),
                 100 * row["fp8_changed_fraction"].get<double>(), fp8_s.first, fp8_s.second,
                 modes[0]["fp8_to_bf16"].get<double>(), modes[1]["fp8_to_bf16"].get<double>(),
                 modes[0]["fp8_to_bf16_quantized_tensors"].get<double>(),
                 modes[1]["fp8_to_bf16_quantized_tensors"].get<double>(),
                 row["quantizer_gbps_per_core"].get<double>(), dc::quant::Fp8CpuPath(),
                 row["quantizer_baseline_gbps_per_core"].get<double>());
      results.push_back(row);
    }
  std::filesystem::remove_all(work);
  json doc = {{"benchmark", "fp8"},
              {"cores", cores},
              {"params", params_text},
              {"scheme", scheme},
              {"serving_quantize", serving.quantize},
              {"serving_not_converted", serving.not_converted},
              {"results", results}};
  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

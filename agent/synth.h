// `deltacast synth`: synthetic Llama-shaped BF16 checkpoints and the training steps
// that follow them, for benchmarks and tests that need realistic deltas without a
// trainer.
//
// A run writes out_dir/step0 .. out_dir/stepN. Each is a Hugging Face checkpoint
// directory (model-0000K-of-0000N.safetensors, model.safetensors.index.json,
// config.json) with the same files and headers in every step; only tensor bytes
// differ. Step 0 is the initial weights; each later step is one AdamW update of FP32
// master weights (persistent per-element gradient bias plus noise, Adam moments
// started at steady state), stored as BF16 by round-to-nearest-even, which is how
// real checkpoints change: few elements flip, mostly by one unit in the last place.
//
// Output depends only on the options other than `threads` and `out_dir`: the same
// seed gives byte-identical files on any number of threads.
//
// Thread safety: the functions are thread-safe; concurrent Synthesize calls must not
// share an out_dir.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string_view>
#include <vector>

#include "agent/synth_shards.h"
#include "common/dtype.h"
#include "common/status.h"
#include "deltacast/tensor.h"

namespace deltacast::agent {

struct SynthOptions {
  std::filesystem::path out_dir;  // writes out_dir/step0 .. out_dir/stepN
  uint64_t params = 500'000'000;  // target parameter count (result within a few %)
  int steps = 3;
  // Target fraction of BF16 elements whose bits change per step; ignored if lr > 0.
  double change_rate = 0.03;
  double lr = 0;  // explicit learning rate; 0 = calibrate from change_rate
  uint64_t seed = 1;
  size_t threads = 0;            // 0 = all cores
  uint64_t max_shard_bytes = 0;  // 0 = automatic (always at least 2 files)
  // > 0: a mixture-of-experts MLP in every layer (a router and this many experts,
  // each with intermediate / experts rows), as in Qwen-MoE / OLMoE checkpoints.
  uint64_t experts = 0;
  // Share of the parameters in the embeddings and the LM head (both kept BF16 in an
  // FP8 serving twin). 0: the default shape's (about a quarter, vocabulary at most
  // 32000, so a few percent from 7B up). Else in [0.001, 0.5]: a small model with a
  // large model's proportions (Llama-3-70B: 0.03, DeepSeek-V3: 0.003).
  double embedding_share = 0;
  // Also write the training job's shards for every step (synth_shards.h).
  ShardSpec shards;
  // Called on the calling thread as the checkpoints' bytes are computed: BF16
  // bytes of every step done so far, and in all. Optional.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

// Accepted ranges, checked by Synthesize before it writes anything.
inline constexpr uint64_t kMinSynthParams = 1'000'000;
inline constexpr uint64_t kMaxSynthParams = 1'000'000'000'000;
inline constexpr int kMaxSynthSteps = 100;
inline constexpr double kMinSynthChangeRate = 0.001;
inline constexpr double kMaxSynthChangeRate = 0.5;

// What changed between step k-1 and step k, counted over every BF16 element.
struct SynthStepStats {
  uint64_t changed = 0;                 // elements whose bits differ from step k-1
  uint64_t one_ulp = 0;                 // changed by exactly one unit in the last place
  uint64_t xor_low_run = 0;             // XOR with the old bits is 0x1, 0x3, 0x7 or 0xf
  uint64_t sign_flips = 0;              // the sign bit changed
  uint64_t prev_changed = 0;            // elements that also changed in step k-1 (k >= 2)
  uint64_t repeats = 0;                 // changed in both step k-1 and step k (k >= 2)
  uint64_t repeats_same_direction = 0;  // of those, moved the same way both times
};

struct SynthReport {
  // Canonical model order (embeddings, layer by layer, final norm, lm_head).
  std::vector<TensorSpec> tensors;
  uint64_t params = 0;                       // exact element count of `tensors`
  double lr = 0;                             // the learning rate used (given or calibrated)
  std::vector<double> measured_change_rate;  // per step 1..N: changed / params
  std::vector<SynthStepStats> step_stats;    // per step 1..N
  uint64_t bytes_per_checkpoint = 0;         // sum of the .safetensors file sizes
  int layers = 0;
  uint64_t hidden = 0;
  uint64_t intermediate = 0;
  uint64_t vocab = 0;
  uint64_t heads = 0;
  uint64_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t experts = 0;
  int shards = 0;
  int shard_ranks = 0;  // training-job ranks written per step (0: none)
};

// Rounds to BF16 the way torch's .to(torch.bfloat16) does: to nearest, ties to
// even, by bit manipulation. NaNs stay NaN (quiet bit set) instead of carrying into
// the exponent; overflow rounds to infinity.
inline uint16_t FloatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Parses a parameter count: "500M", "1.5B", "7b", "2000000", "750k", "1T".
Result<uint64_t> ParseParamCount(std::string_view text);

// Parses a fraction: "3%" or "0.03". Must lie in [0, 1].
Result<double> ParseRate(std::string_view text);

// Writes the checkpoints. Blocks; uses `threads` worker threads plus one writer.
// Memory is about 5 + 2 * (steps + 1) MiB per thread, whatever `params` is. Existing step
// directories are reused: files with the names it writes are replaced and stale
// shards of an earlier run (model-*-of-*.safetensors) are removed. On failure the
// step directories hold partial output and the Status names the file or option.
Result<SynthReport> Synthesize(const SynthOptions& options);

}  // namespace deltacast::agent

// The reference sharder of `deltacast synth --shards`: what a Megatron-style
// training job holds of a synthetic checkpoint, one safetensors file per rank, so
// producers can be run and tested against real shards without a trainer.
//
// It is written from ../shared/LAYOUTS.md with element loops and does not use
// layout/ (it is what layout/ is checked against). For a step directory STEP it
// writes STEP.shards/:
//   rank-RRRRR.safetensors  the rank's tensors with Megatron names: fused
//                           linear_qkv (per KV group [q heads; k; v], split on dim
//                           0) and linear_fc1 ([gate_r; up_r]), row-split
//                           linear_proj / linear_fc2, padded vocabulary
//                           (multiple of 128 * tp), layer norms stored zero-centred
//                           in F32 (residual: canonical = bf16(local + 1)), local
//                           layer and expert indices; with fsdp=W instead the
//                           Hugging Face tensors chunked on dim 0 over W ranks
//                           (FSDP2, torch.chunk).
//   rank-RRRRR.toml         the rank's layout description (docs/layout.md)
//   canonical.json          the canonical tensor table, from the step's headers
// Data-parallel replicas are hard links to one file. Rank R = tp + tp_size * (ep +
// ep_size * (dp + dp_size * pp)).
//
// Thread safety: functions are thread-safe for distinct directories.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/status.h"

namespace deltacast::agent {

struct ShardSpec {
  uint64_t tp = 1, pp = 1, dp = 1, ep = 1;
  uint64_t fsdp = 0;  // > 0: FSDP2 over this many ranks (tp, pp, ep must be 1)
  bool requested = false;

  uint64_t Ranks() const { return fsdp > 0 ? fsdp : tp * pp * dp * ep; }
};

// "tp=2,pp=2", "ep=2,tp=2", "fsdp=4", "dp=2". Every axis at most once, each >= 1.
Result<ShardSpec> ParseShardSpec(std::string_view text);

struct ShardModel {
  uint64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, layers = 0;
  uint64_t intermediate = 0, vocab = 0, experts = 0;
  uint64_t vocab_pad_multiple = 128;
};

// Writes step_dir.shards/ (replacing it) from the canonical checkpoint in step_dir.
// kInvalidArgument when the model does not split that way (naming the dim).
Status WriteShards(const std::filesystem::path& step_dir, const ShardModel& model,
                   const ShardSpec& spec);

// The shard directory of a step directory: "DIR/step1" -> "DIR/step1.shards".
std::filesystem::path ShardDirOf(const std::filesystem::path& step_dir);
std::string RankFileStem(uint64_t rank);  // "rank-00003"

}  // namespace deltacast::agent

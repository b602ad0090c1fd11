// Load plans for inference engines: from a Hugging Face checkpoint's config.json
// and an engine's parallel settings, the layout description (description.h) of
// every GPU, so a node patches the engine's own parameters (named as the engine
// names them: vLLM's and SGLang's `qkv_proj`, `gate_up_proj`, `experts.w13_weight`)
// with no hand-written layout file. docs/layout.md, "Engine layouts", gives each
// rule and where in the engines' source it comes from.
//
// Covered: the dense Llama / Qwen2 / Qwen3 family (fused QKV with or without
// biases, KV heads split or replicated, fused gate/up, row-parallel o_proj and
// down_proj, padded vocabulary-parallel embedding and LM head, tied embeddings,
// replicated norms and q/k norms) and Qwen-style MoE (FusedMoE's stacked local
// experts, expert parallelism, a shared expert and its gate, the router), in BF16
// or with block-scaled FP8 linears (their `weight_scale_inv` grids beside them).
//
// Thread safety: values and pure functions; WriteEngineLayouts writes files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deltacast::layout {

enum class Engine : uint8_t { kVllm, kSglang };
std::optional<Engine> ParseEngine(std::string_view name);  // "vllm" | "sglang"
std::string_view EngineName(Engine engine);

// What the plans need from config.json.
struct HfConfig {
  std::string model_type;
  uint64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, layers = 0, vocab = 0;
  uint64_t intermediate = 0;  // dense MLP (0: every layer is MoE)
  uint64_t experts = 0, moe_intermediate = 0, shared_expert_intermediate = 0;
  bool tied = false;      // tie_word_embeddings: the engine's LM head is the embedding
  bool qkv_bias = false;  // attention_bias, or Qwen2's fixed QKV bias
  bool qk_norm = false;   // Qwen3: per-head RMSNorm of q and k, replicated
  // Block-scaled FP8 serving weights (config.json's quantization_config, which
  // quant::ParseEngineConfig reads): every decoder linear's weight has a
  // `weight_scale_inv` grid of fp8_block x fp8_block blocks, placed by its weight's
  // rule. 0: no quantized weights.
  uint64_t fp8_block = 0;
};

// Parses config.json text; kInvalidArgument naming the key for a missing or bad one.
// Its quantization_config is quant::ParseEngineConfig's (quant/engine_config.h).
Result<HfConfig> ParseHfConfig(std::string_view json, std::string_view source);

// The engine's parallel settings. vLLM: tp x dp GPUs (--tensor-parallel-size,
// --data-parallel-size); ep is 1, or tp x dp with --enable-expert-parallel (its MoE
// layers then hold whole experts). SGLang: tp GPUs (--tp), ep dividing tp (--ep;
// experts split over tp / ep within each EP group); dp 1.
struct EngineParallel {
  Engine engine = Engine::kVllm;
  uint64_t tp = 1, dp = 1, ep = 1;
  uint64_t Gpus() const { return tp * dp; }
};

// One layout description (TOML text) per GPU; GPU g is dp rank g / tp, tp rank
// g % tp (the engines' rank order). `canonical` is written as the files'
// [layout] canonical: the checkpoint directory or canonical.json, relative to
// where the files will lie. kInvalidArgument naming the setting and the dimension
// that does not divide (a KV replication factor, heads, sizes, experts, vocabulary).
Result<std::vector<std::string>> EngineLayouts(const HfConfig& config, const EngineParallel& p,
                                               std::string_view canonical);

// Writes EngineLayouts to `out_dir`/gpu-<g>.toml (created if missing), with
// `canonical` made relative to `out_dir`; returns the paths in GPU order.
Result<std::vector<std::filesystem::path>> WriteEngineLayouts(
    const HfConfig& config, const EngineParallel& p, const std::filesystem::path& canonical,
    const std::filesystem::path& out_dir);

}  // namespace deltacast::layout

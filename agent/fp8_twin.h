// FP8 serving twins: the checkpoint an FP8-serving fleet loads, made from a BF16
// checkpoint by a serving description (quant/serving.h) and the reference block
// quantizer (quant/fp8_quantizer.h). `deltacast synth --fp8` writes one per step,
// and bench/fp8_bench.cc encodes deltas between them.
//
// A twin directory holds the BF16 checkpoint's files under the same names, each with
// the same tensors in the same order, except that every quantized tensor is stored
// as E4M3 and followed by its `_scale_inv` tensor; model.safetensors.index.json maps
// every tensor, and config.json is the source's with "quantization_config" added, so
// vLLM, SGLang and transformers load it natively.
//
// Thread safety: the functions are thread-safe; concurrent writes must not share an
// output directory.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include "apply/host_store.h"
#include "apply/weight_store.h"
#include "common/status.h"
#include "quant/serving.h"

namespace deltacast::agent {

// The serving description synth uses for its Llama-shaped checkpoints: every
// linear weight of the decoder layers in fp8_e4m3_block128 (the scheme may be
// replaced); norms, the router, the embeddings and the LM head stay BF16.
quant::ServingDescription DefaultFp8Serving(std::string_view scheme = "fp8_e4m3_block128");

// The serving plan of a store's tensors (PlanServing's errors).
Result<std::vector<quant::ServedTensor>> PlanFp8Twin(const quant::ServingDescription& serving,
                                                     const std::vector<TensorSpec>& tensors);

// The twin in memory: a HostStore holding the plan's served tensors (weights, then
// each quantized weight's scale after it), quantized on `threads` threads. Errors
// name the tensor (a non-finite element, a plan that does not match the store).
Result<std::unique_ptr<apply::HostStore>> QuantizeStore(
    const apply::WeightStore& bf16, const std::vector<quant::ServedTensor>& plan, size_t threads);

// Writes the twin of the checkpoint directory `bf16_dir` to `out_dir`, one source
// file at a time, under `out_dir`.partial, renamed to `out_dir` (replacing it) only
// when whole: on error (the plan's, or a non-finite element naming its tensor)
// `out_dir` is as it was.
Status WriteFp8Twin(const std::filesystem::path& bf16_dir, const std::filesystem::path& out_dir,
                    const quant::ServingDescription& serving, size_t threads);

// Receivers checked at the door: when `dir`'s config.json has a block-scaled FP8
// quantization_config, reads the directory's tensor table (headers only) and runs
// quant::CheckFp8Checkpoint on it; errors name the directory and the tensor. Ok
// when there is no config.json, it is not JSON, or it has no such config. Writes
// nothing. Called by `agent` before its store is opened, by `audit`, and by
// `publish` / `serve` on the versions they send.
Status CheckFp8CheckpointDir(const std::filesystem::path& dir);

// `publish`'s check of the receivers' checkpoint (`base`, what the nodes hold)
// against the one it sends (`target`): each on its own (CheckFp8CheckpointDir),
// then their quantization_configs must agree on quant_method, fmt,
// weight_block_size and scale_fmt (the message names both values). The tensor
// tables are compared later by the publisher's file-layout check.
Status CheckFp8Versions(const std::filesystem::path& base, const std::filesystem::path& target);

}  // namespace deltacast::agent

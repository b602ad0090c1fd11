// Serving descriptions: which canonical (BF16, as trained) tensors the inference
// fleet serves quantized, and with which scheme (fp8_scheme.h). A TOML file beside
// the layout descriptions (docs/fp8.md has the reference):
//
//   [serving]
//   scheme = "fp8_e4m3_block128"     # a row of the scheme table
//   quantize = ["model.layers.*.weight"]
//   not_converted = ["*norm.weight", "*.mlp.gate.weight"]
//
// `quantize` and `not_converted` are fnmatch(3) patterns over canonical tensor
// names ("*" matches dots too). A tensor matching `not_converted` stays as trained;
// else one matching `quantize` is served as `name` in the scheme's element type
// plus `name` + "_scale_inv" (the Hugging Face FP8 layout, with config.json's
// quantization_config); everything else stays as trained.
//
// Errors are kInvalidArgument. Parse errors start with "FILE:LINE:"; plan and
// check errors name the tensor (and the scale tensor) at fault.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "layout/placement.h"
#include "quant/fp8_scheme.h"

namespace deltacast::quant {

struct ServingDescription {
  std::string source;  // file name, for messages
  const Fp8Scheme* scheme = nullptr;
  std::vector<std::string> quantize;
  std::vector<std::string> not_converted;
};

Result<ServingDescription> ParseServing(std::string_view toml, std::string_view source_name);
// kNotFound / kIoError when the file cannot be read.
Result<ServingDescription> LoadServing(const std::filesystem::path& path);

// One tensor of the served checkpoint, from one canonical tensor.
struct ServedTensor {
  TensorSpec canonical;               // as trained
  const Fp8Scheme* scheme = nullptr;  // nullptr: served as trained
  TensorSpec weight;                  // served: the canonical tensor, or its FP8 image
  TensorSpec scale;                   // FP8 only: name + "_scale_inv", scheme.ScaleShape
  bool quantized() const { return scheme != nullptr; }
};

// The served checkpoint's tensors, in canonical order. Refuses, naming the tensor:
// one to quantize that is not 2-D or not BF16, or whose scale name is taken by a
// canonical tensor; and a `quantize` pattern that matches no tensor (a typo would
// otherwise serve BF16 silently).
Result<std::vector<ServedTensor>> PlanServing(const ServingDescription& description,
                                              std::span<const TensorSpec> canonical);

// What a receiver's config.json says about its FP8 checkpoint.
struct QuantizationConfig {
  std::string quant_method;                 // "fp8"
  std::string fmt;                          // "e4m3"
  std::vector<uint64_t> weight_block_size;  // [rows, cols]
  std::string scale_fmt;                    // "" (FP32 scales) or "ue8m0"
  std::vector<std::string> modules_to_not_convert;
};

// Reads config.json's "quantization_config" (kNotFound naming the file when it has
// none; kInvalidArgument for a field of the wrong type).
Result<QuantizationConfig> ParseQuantizationConfig(std::string_view config_json,
                                                   std::string_view source_name);
// The "quantization_config" object a native loader expects for `plan`, as JSON
// text: quant_method, fmt, activation_scheme "dynamic", weight_block_size,
// scale_fmt (ue8m0 schemes) and modules_to_not_convert (the 2-D tensors kept).
std::string QuantizationConfigJson(std::span<const ServedTensor> plan);

// Checks a receiver's FP8 checkpoint (its tensor table and quantization_config)
// against `plan` before anything is sent or written. Refuses, naming the tensor:
// a weight missing or of another dtype or shape; a scale missing, of another dtype,
// or of a shape that is not [ceil(rows / block), ceil(cols / block)]; a kept
// tensor that differs; a tensor the plan does not serve. Refuses a block size,
// element format or scale format the receiver's checkpoint does not use.
Status CheckServedCheckpoint(std::span<const ServedTensor> plan,
                             std::span<const TensorSpec> checkpoint,
                             const QuantizationConfig& receiver);

// Checks an FP8 checkpoint on its own, where no serving plan is at hand (a node's
// checkpoint directory at start, `deltacast audit`, `publish`'s two directories):
// the plan is read back from the checkpoint (every tensor of the config's element
// type is a quantized weight; its scheme's geometry is the config's
// weight_block_size, so block sizes no scheme row has are checked too) and
// CheckServedCheckpoint runs against it. Refuses, naming the tensor: an FP8 weight
// that is not 2-D, or whose module modules_to_not_convert lists; a weight's scale
// missing, not F32, or not [ceil(rows / block), ceil(cols / block)]; a
// `_scale_inv` tensor with no FP8 weight. Refuses an fmt other than e4m3 and a
// weight_block_size that is not two positive integers. A quant_method other than
// "fp8", or an fp8 config without weight_block_size (per-tensor scales, another
// naming), is not checked: Ok.
Status CheckFp8Checkpoint(std::span<const TensorSpec> checkpoint, const QuantizationConfig& config);

}  // namespace deltacast::quant

// Layout descriptions: how one training rank holds the canonical checkpoint's
// tensors (../shared/LAYOUTS.md, "Describing a layout"). A description is a TOML
// file per rank: the model dims, the mesh, this rank's coordinates and rules per
// local tensor-name pattern. placement.h expands it, against the canonical tensor
// table (from the checkpoint's safetensors headers, never from formulas) and the
// rank's own tensor table (from its shard's header), into strided runs.
//
// Format (docs/layout.md has the full reference and an example):
//   [layout]   canonical (path of the canonical tensor table, relative to the file)
//   [model]    hidden, heads, kv_heads, head_dim, layers; experts, vocab_pad_multiple
//   [mesh]     tp, pp, dp, ep, etp (1 or tp; any with ep_from), fsdp ("none" | "fsdp2" |
//              "flat"), ep_from ("dp" | "tp_dp")
//   [rank]     tp, pp, dp, ep; layer_offset (default pp * layers / mesh.pp)
//   [[tensor]] local (pattern), kind, canonical (pattern or list), value, pad, split,
//              expert, block
//   [[flat]]   local, dtype, params (local names in buffer order), align
// Patterns: "{layer}" and "{expert}" match decimal indices (the local index, mapped
// to the global one by the stage offset and the EP rank), "*" matches any text that
// the canonical pattern repeats.
//
// Every error is kInvalidArgument and starts with "FILE:LINE:"; unknown keys are
// refused (with the nearest known key suggested).
//
// Thread safety: a LayoutDescription is a value; the parsers are thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace deltacast::layout {

// How a rule places a TP-local tensor in canonical coordinates.
enum class Kind : uint8_t {
  kColumn,      // split on dim 0 over tp (embeddings, lm_head, plain linears)
  kRow,         // split on dim 1 over tp (o_proj, down_proj)
  kReplicated,  // every tp rank holds all of it; one scanner
  kQkv,         // fused [q_g; k_g; v_g] per KV group, then split on dim 0 (GQA)
  kGateUp,      // each rank holds [gate_r; up_r]: split, then fused
  kQkvHeads,    // inference engines: each rank holds [its q heads; its kv heads' k; v],
                // a KV head replicated on tp / kv_heads ranks when kv_heads < tp
  kTied,        // a copy of a tensor another rule owns: never scanned
  kGathered,    // the whole canonical tensor, gathered for this rank: residual
};
std::string_view KindName(Kind kind);

// What a rule does to values. Anything but plain bits is residual: the producer
// computes the canonical values of its own elements and sends overwrite records.
enum class Value : uint8_t {
  kBits,    // canonical bits are the local bits
  kCast,    // canonical = round(local) to the canonical dtype (F32/BF16/F16)
  kAddOne,  // canonical = round(local + 1): zero-centred RMSNorm gamma
};
std::string_view ValueName(Value value);

enum class SplitMode : uint8_t {
  kEven,  // the dim must divide by the axis size
  kCeil,  // torch.chunk: ceil(n / size) per rank, the last ones shorter or empty
};

enum class Fsdp : uint8_t {
  kNone,
  kFsdp2,  // every parameter chunked on dim 0 over the dp ranks (torch.chunk)
  kFlat,   // parameters flattened into buffers, each dp rank owning one range
};

struct ModelDims {
  uint64_t hidden = 0;
  uint64_t heads = 0;
  uint64_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t layers = 0;
  uint64_t experts = 0;
  uint64_t vocab_pad_multiple = 1;  // Megatron's make_vocab_size_divisible_by
};

// Where the expert-parallel ranks come from.
enum class EpFrom : uint8_t {
  kDp,    // an axis of its own (Megatron: carved from data parallel); non-expert
          // tensors are replicated over it
  kTpDp,  // inference engines: the tp x dp GPUs themselves form the experts' ep x etp
          // grid (flat = dp * tp + tp_rank; ep = flat / etp, etp rank = flat % etp)
};

enum class VocabPad : uint8_t {
  kNone,
  kMegatron,  // rows padded to a multiple of vocab_pad_multiple * tp, then split
  kEngine,    // rows padded to a multiple of vocab_pad_multiple, then split evenly
              // (vLLM's and SGLang's VocabParallelEmbedding / ParallelLMHead)
};

struct Mesh {
  uint64_t tp = 1, pp = 1, dp = 1, ep = 1, etp = 1;
  Fsdp fsdp = Fsdp::kNone;
  EpFrom ep_from = EpFrom::kDp;
  uint64_t Ranks() const { return tp * pp * dp * (ep_from == EpFrom::kDp ? ep : 1); }
};

struct RankCoords {
  uint64_t tp = 0, pp = 0, dp = 0, ep = 0;
  int64_t layer_offset = -1;  // -1: pp * layers / mesh.pp
};

// This rank's coordinate on the expert tensor-parallel axis.
uint64_t ExpertTpCoord(const Mesh& mesh, const RankCoords& rank);

struct Rule {
  std::string local;  // pattern of the local tensor name
  Kind kind = Kind::kColumn;
  std::vector<std::string> canonical;  // patterns: 3 for qkv, 2 for gate_up, else 1
  Value value = Value::kBits;
  SplitMode split = SplitMode::kEven;
  VocabPad pad = VocabPad::kNone;  // column split of a padded vocabulary, clipped at its rows
  bool expert = false;             // an expert tensor: sharded over ep, split over etp
  // A block-scale grid (FP8 `weight_scale_inv`): each element stands for a block x
  // block square of its weight, so a head is head_dim / block rows (qkv_heads); the
  // other kinds split the grid as they split any tensor. 1: an ordinary tensor.
  uint64_t block = 1;
  int line = 0;
};

struct FlatBuffer {
  std::string local;  // the rank's slice of the buffer, a 1-D tensor
  DType dtype = DType::kBF16;
  std::vector<std::string> params;  // local (TP-local) parameter names, in buffer order
  uint64_t align = 1;               // elements: each parameter starts at a multiple
  int line = 0;
};

struct LayoutDescription {
  std::string source;               // file name, for messages
  std::filesystem::path canonical;  // the canonical tensor table, as written
  ModelDims model;
  Mesh mesh;
  RankCoords rank;
  std::vector<Rule> rules;  // first match wins
  std::vector<FlatBuffer> flats;

  // FILE:LINE: prefix for messages about a line of this description.
  std::string Where(int line) const;
  uint64_t LayerOffset() const;
  // "tp=1 pp=0 dp=0 ep=0"
  std::string RankName() const;
};

// Parses TOML text. Checks every key, type and range, and that the rank lies inside
// the mesh; checks needing the tensor tables are placement.h's.
Result<LayoutDescription> ParseLayout(std::string_view toml, std::string_view source_name);
// Reads and parses a file (kNotFound / kIoError when it cannot be read).
Result<LayoutDescription> LoadLayout(const std::filesystem::path& path);

}  // namespace deltacast::layout

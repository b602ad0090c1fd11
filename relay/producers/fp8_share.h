// A share in FP8 serving coordinates (docs/fp8.md, "Producers"): the FP8 image of
// a BF16 share (relay/producers/shard_encoder.h) under a serving plan, quantized where the
// share lies, so the shard encoder ships XOR records on FP8 bytes and scale
// records in the FP8 checkpoint's canonical coordinates.
//
// The only thing a block needs from outside one share is its amax. A block the
// share holds whole is quantized here; a block it holds in part (a TP cut inside a
// 128 x 128 block) needs the max of every holder's partial amax (one 16-bit |x| per
// piece and version), exchanged through the root (SplitBlocks -> max-reduce ->
// SetSplitAmaxes). Each holder then quantizes its own elements; the block's scale
// is written by the share that holds the block's first (top-left) element, so
// exactly one share writes it when the shares cover the tensor exactly.
//
// The image's map: the BF16 share's locals keep their runs into tensors served as
// trained (their bytes are the BF16 ones, not copied); each run into a quantized
// tensor becomes a local of its own holding that run's FP8 bytes packed; and each
// quantized tensor whose scales the share writes gets a local holding the scale
// tensor's F32 values, with runs over the scales it owns.
//
// Thread safety: one thread drives a share; the passes run their own workers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "layout/placement.h"
#include "quant/serving.h"
#include "relay/producers/shard_encoder.h"

namespace deltacast::relay {

// A block that the share holds in part, with its partial amax (BF16 |x| bits) of
// the previous and the new version; after the exchange, the max over every share.
struct SplitBlockAmax {
  uint32_t tensor = 0;  // index into the BF16 canonical table
  uint64_t block = 0;   // row-major index in the tensor's block grid
  uint16_t base = 0;
  uint16_t target = 0;
  uint64_t elements = 0;  // of the block in this piece (what a gather would move)
  bool operator==(const SplitBlockAmax&) const = default;
};

struct Fp8ShareStats {
  uint64_t quantized_bf16_bytes = 0;  // BF16 bytes of one version that were quantized
  uint64_t blocks = 0;                // blocks the share holds elements of
  uint64_t split_blocks = 0;          // of them, held in part
  uint64_t split_elements = 0;        // elements of split blocks held here
  uint64_t scales_written = 0;        // scales this share owns
  bool base_kept = false;             // the previous image was reused (TakeBaseFrom)
  double amax_seconds = 0;
  double quantize_seconds = 0;
};

// The FP8 canonical table a plan serves: each served weight and each scale,
// sorted by name (a placement map's and a manifest's order).
std::vector<TensorSpec> Fp8CanonicalTable(std::span<const quant::ServedTensor> plan);

class Fp8Share {
 public:
  // `bf16` (its map and the bytes behind it) must outlive the share. `plan` is
  // quant::PlanServing over bf16.map->canonical(), in that order. kUnsupported for a
  // share in device memory or a run that reaches a quantized tensor through a value
  // transform (naming the tensor).
  static Result<std::unique_ptr<Fp8Share>> Plan(const ShareInput& bf16,
                                                std::vector<quant::ServedTensor> plan);
  ~Fp8Share();

  // Reuses `previous`'s new version (the image of the last committed refit, what
  // the receivers hold) as this share's previous version: neither its amaxes nor
  // its bytes are computed again, and the delta starts from the receivers' bytes.
  // Call before ComputeAmaxes. kFailedPrecondition, changing nothing, when
  // `previous` is not quantized or its map differs; `previous` is spent otherwise.
  Status TakeBaseFrom(Fp8Share& previous);

  // Pass 1: the partial amax of every block held, in both versions (the new one
  // only when the base was kept). An Inf or NaN
  // element is refused naming the tensor, the element and the version.
  Status ComputeAmaxes(size_t threads);
  // The blocks held in part, with their partial amaxes (after ComputeAmaxes).
  std::vector<SplitBlockAmax> SplitBlocks() const;
  // The exchange's result for the blocks SplitBlocks lists. kInvalidArgument for a
  // block not split here, or a max below this share's own partial amax.
  Status SetSplitAmaxes(std::span<const SplitBlockAmax> reduced);
  // Pass 2: quantizes both versions into the image. kFailedPrecondition when a
  // split block has no reduced amax.
  Status Quantize(size_t threads);

  // The image: its map (over Fp8CanonicalTable) and, after Quantize, its bytes.
  const layout::PlacementMap& map() const;
  ShareInput Input() const;
  const Fp8ShareStats& stats() const;

  struct State;

 private:
  explicit Fp8Share(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Max-reduces every share's split blocks (the root's step): one entry per block,
// the max of each version's partial amaxes.
std::vector<SplitBlockAmax> ReduceSplitAmaxes(std::span<const std::vector<SplitBlockAmax>> shares);

}  // namespace deltacast::relay

// The one-checkpoint source's FP8 delta (docs/fp8.md, "Trainer side"): a trainer
// holding two BF16 versions ships the delta between their FP8 serving twins
// without writing either twin. Both versions are quantized a group of whole
// tensors at a time (relay/producers/fp8_share.h: every block whole, no exchange), each
// group's FP8 images compared and encoded by the shard encoder and dropped, so
// memory is one group's images plus the encoded delta. The twins' manifests (and
// so their version ids) are combined from the groups' partition hash pieces
// (relay/producers/merge.h), as the root combines its producers'.
//
// Thread safety: the functions block the calling thread and run their own workers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "apply/weight_store.h"
#include "codec/manifest.h"
#include "quant/serving.h"
#include "relay/producers/shard_encoder.h"
#include "relay/tree/publisher.h"
#include "relay/tree/source.h"

namespace deltacast::relay {

struct Fp8DeltaStats {
  uint64_t bf16_bytes = 0;            // tensor bytes of one BF16 version
  uint64_t quantized_bf16_bytes = 0;  // of them, quantized
  uint64_t changed_elements = 0;      // FP8 bytes, scales and kept BF16 elements
  uint64_t groups = 0;
  double quantize_seconds = 0;  // amax and quantize passes, both versions
  double encode_seconds = 0;    // hash, compare and encode of the images
  double seconds = 0;
};

struct Fp8Delta {
  codec::Manifest base, target;                // the two twins'
  std::vector<std::vector<std::byte>> chunks;  // data chunks, identity not stamped
  Fp8DeltaStats stats;
};

// Encodes the delta between the FP8 twins of `base` and `target` (BF16 stores
// with the same tensors) under `serving`, `group_bytes` of BF16 tensors at a time
// (a larger tensor is a group of its own). Refused before anything is encoded:
// tensors that differ between the versions, and PlanServing's errors (naming the
// tensor). A non-finite element fails it, naming the tensor, element and version.
Result<Fp8Delta> EncodeFp8Delta(const apply::WeightStore& base, const apply::WeightStore& target,
                                const quant::ServingDescription& serving,
                                const ShareEncodeOptions& options,
                                uint64_t group_bytes = 256ull << 20);

// Publishes an encoded FP8 delta through `source` (Source::PublishStream).
Result<PublishReport> PublishFp8Delta(Source& source, const Fp8Delta& delta, uint64_t chunk_bytes);

// The FP8 delta of two BF16 checkpoint directories laid out alike, published
// through a running `source` (the Source API's PublishCheckpoints with a serving
// description). The report's bf16_* fields name the BF16 versions it was made from.
Result<PublishReport> PublishCheckpointsFp8(Source& source, const std::filesystem::path& base_dir,
                                            const std::filesystem::path& new_dir,
                                            const quant::ServingDescription& serving,
                                            const ShareEncodeOptions& options);

// `publish --serving`: the same as the config's source, started for this publish.
Result<PublishReport> PublishCheckpointsFp8(const PublishOptions& options,
                                            const std::filesystem::path& base_dir,
                                            const std::filesystem::path& new_dir,
                                            const quant::ServingDescription& serving,
                                            std::unique_ptr<transport::Transport> transport);

}  // namespace deltacast::relay

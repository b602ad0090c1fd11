// Tensors as deltacast sees them: a canonical name (the Hugging Face checkpoint's),
// an element type, a shape, and the bytes, row-major, in memory the caller owns.
// deltacast reads and writes those bytes in place and never reinterprets them.
// TensorSpec is also the one description of a tensor inside deltacast (the codec's
// canonical tensors, the layouts' shard tensors): canonical coordinates are (tensor
// name, element index), so nothing on the wire depends on how a checkpoint is split
// into files or how a trainer shards it.
//
// Thread safety: plain values; the bytes they point to must not be changed by the
// caller while a Publish reads them or a Node may write them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deltacast/dtype.h"

namespace deltacast {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> shape;
  uint64_t ElementCount() const;
  uint64_t ByteSize() const;
  bool operator==(const TensorSpec&) const = default;
};

// A tensor in the caller's memory. For a Node the bytes are patched in place, so
// their address never changes (CUDA graphs and engines that keep pointers rely on it).
struct TensorView {
  TensorSpec spec;
  std::span<std::byte> bytes;  // exactly spec.ByteSize() bytes
};

}  // namespace deltacast

// What the codec knows about a tensor: its canonical name, element type and shape.
// Canonical coordinates are (tensor name, element index); nothing on the wire depends
// on how a checkpoint is split into files or how a trainer shards it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace deltacast::codec {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;

  uint64_t ElementCount() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
  uint64_t ByteSize() const { return ElementCount() * ElementSize(dtype); }
  bool operator==(const TensorInfo&) const = default;
};

}  // namespace deltacast::codec

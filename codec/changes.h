// SparseChanges: the changed elements of one partition, in a form every encoding
// can be built from and decoded into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deltacast::codec {

// Positions are element indices within the partition, strictly increasing. XOR
// words (target ^ base) are stored element_size bytes each, in the element's own
// (little-endian) byte order, so xors[i * element_size + b] is byte b of change i.
// A position whose XOR word is zero is never listed.
struct SparseChanges {
  uint32_t element_size = 1;
  std::vector<uint32_t> positions;
  std::vector<std::byte> xors;

  size_t size() const { return positions.size(); }
  void clear() {
    positions.clear();
    xors.clear();
  }
};

}  // namespace deltacast::codec

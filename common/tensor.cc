// The public TensorSpec's sizes, here so that every module (the codec, layouts, the
// API) shares the one definition.
#include "common/dtype.h"
#include "deltacast/tensor.h"

namespace deltacast {

uint64_t TensorSpec::ElementCount() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t TensorSpec::ByteSize() const { return ElementCount() * ElementSize(dtype); }

}  // namespace deltacast

#include "codec/change_detect.h"

#include <cassert>

#include "codec/internal/change_detect_kernel.h"

namespace deltacast::codec {
namespace internal {
#if defined(__x86_64__)
void FindChangesAvx2(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out);
#endif
}  // namespace internal

namespace {

uint64_t DiffMaskScalar(const std::byte* a, const std::byte* b) {
  uint64_t mask = 0;
  for (size_t i = 0; i < internal::kBlock; ++i) mask |= static_cast<uint64_t>(a[i] != b[i]) << i;
  return mask;
}

bool HasAvx2() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return has;
#else
  return false;
#endif
}

}  // namespace

void FindChanges(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out) {
  assert(base.size() == target.size() && base.size() % element_size == 0);
  out.element_size = element_size;
  out.clear();
#if defined(__x86_64__)
  if (HasAvx2()) return internal::FindChangesAvx2(base, target, element_size, out);
#endif
  internal::FindChangesDispatch<DiffMaskScalar>(base, target, element_size, out);
}

}  // namespace deltacast::codec

#include "codec/change_detect.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <string_view>

#include "codec/internal/change_detect_kernel.h"

namespace deltacast::codec {
namespace internal {
#if defined(__x86_64__)
void FindChangesAvx2(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                     SparseChanges& out);
bool FindChangesAvx512(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                       SparseChanges& out);
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

// DELTACAST_CHANGE_DETECT=avx2|portable lowers the kernel (tests, benchmarks).
bool HasAvx512() {
#if defined(__x86_64__)
  static const bool has = [] {
    const char* lower = std::getenv("DELTACAST_CHANGE_DETECT");
    if (lower != nullptr && *lower != '\0') return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi2");
  }();
  return has;
#else
  return false;
#endif
}

bool PortableOnly() {
  static const bool portable = [] {
    const char* lower = std::getenv("DELTACAST_CHANGE_DETECT");
    return lower != nullptr && std::string_view(lower) == "portable";
  }();
  return portable;
}

}  // namespace

void FindChanges(ByteSpan base, ByteSpan target, uint32_t element_size, SparseChanges& out) {
  out.clear();
  FindChangesAppend(base, target, element_size, 0, out);
}

void FindChangesAppend(ByteSpan base, ByteSpan target, uint32_t element_size,
                       uint32_t first_position, SparseChanges& out) {
  assert(base.size() == target.size() && base.size() % element_size == 0);
  out.element_size = element_size;
#if defined(__x86_64__)
  if (HasAvx512() && internal::FindChangesAvx512(base, target, element_size, first_position, out)) {
    return;
  }
  if (HasAvx2() && !PortableOnly()) {
    return internal::FindChangesAvx2(base, target, element_size, first_position, out);
  }
#endif
  internal::FindChangesDispatch<DiffMaskScalar>(base, target, element_size, first_position, out);
}

PartitionHash FindChangesHashingBase(ByteSpan base, ByteSpan target, uint32_t element_size,
                                     uint64_t hash_offset, SparseChanges& out) {
  // 64 KiB of each version per tile: both fit in L2 with room to spare.
  constexpr size_t kTileBytes = size_t{64} << 10;
  if (base.size() <= kTileBytes) {
    FindChanges(base, target, element_size, out);
    return HashPiece(base, hash_offset);
  }
  out.element_size = element_size;
  out.clear();
  PartitionHash sum;
  for (size_t at = 0; at < base.size(); at += kTileBytes) {
    const size_t n = std::min(kTileBytes, base.size() - at);  // a multiple of the element
    FindChangesAppend(base.subspan(at, n), target.subspan(at, n), element_size,
                      static_cast<uint32_t>(at / element_size), out);
    sum ^= HashPiece(base.subspan(at, n), hash_offset + at);
  }
  return sum;
}

}  // namespace deltacast::codec

// AVX2 build of the change-detection kernel; compiled with -mavx2 -mpopcnt (see
// codec/CMakeLists.txt) and called only when the CPU has AVX2.
#include <immintrin.h>

#include "codec/internal/change_detect_kernel.h"

namespace deltacast::codec::internal {
namespace {

// Bit i set when byte i of the 64-byte blocks differs.
inline uint64_t DiffMaskAvx2(const std::byte* a, const std::byte* b) {
  const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
  const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
  const uint32_t eq0 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a0, b0)));
  const uint32_t eq1 = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(a1, b1)));
  return ~(static_cast<uint64_t>(eq1) << 32 | eq0);
}

}  // namespace

void FindChangesAvx2(ByteSpan base, ByteSpan target, uint32_t element_size, uint32_t first,
                     SparseChanges& out) {
  FindChangesDispatch<DiffMaskAvx2>(base, target, element_size, first, out);
}

}  // namespace deltacast::codec::internal

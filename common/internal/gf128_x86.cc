// The carry-less multiply block loops (gf128_kernels.h) for x86-64. Each function
// carries its own target attribute, so this file builds for baseline x86-64 and the
// wide instructions run only where the CPU reports them (nothing here is inline in a
// header, so no copy compiled for a wider target can be picked up elsewhere).
#include <cstring>

#include "common/internal/gf128_kernels.h"
#include "common/internal/mask_kernel.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass _mm256_undefined_*() (self-initialised on purpose)
// as the merge source of unmasked extracts, which -Wmaybe-uninitialized misreads.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define DC_PCLMUL __attribute__((target("pclmul,sse4.1")))
#define DC_VPCLMUL \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx2,vpclmulqdq,pclmul,sse4.1")))

namespace deltacast::gf128::internal {
namespace {

// How far ahead of the loads to prefetch: the hardware prefetcher alone leaves the
// loop waiting on memory for part of every group when the data comes from DRAM.
constexpr int kPrefetchBytes = 2048;

DC_PCLMUL inline __m128i Load(Gf128 v) {
  return _mm_set_epi64x(static_cast<long long>(v.hi), static_cast<long long>(v.lo));
}
DC_PCLMUL inline Gf128 Store(__m128i v) {
  Gf128 r;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&r), v);
  return r;
}
DC_PCLMUL inline __m128i LoadBlock(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// hi * x^128 + lo modulo x^128 + x^7 + x^2 + x + 1: fold the top 64 bits down by 64
// (x^192 = x^64 * 0x87), then the next 64 by 128 (x^128 = 0x87). Each product with
// 0x87 is at most 71 bits, so two steps leave 128.
DC_PCLMUL inline __m128i Reduce(__m128i lo, __m128i hi) {
  const __m128i r = _mm_set_epi64x(0, 0x87);
  const __m128i t = _mm_clmulepi64_si128(hi, r, 0x01);
  lo = _mm_xor_si128(lo, _mm_slli_si128(t, 8));
  hi = _mm_xor_si128(hi, _mm_srli_si128(t, 8));
  return _mm_xor_si128(lo, _mm_clmulepi64_si128(hi, r, 0x00));
}

// Unreduced 256-bit sums of products: lo, hi, and the middle (cross) terms.
struct Acc {
  __m128i lo, hi, mid;
};
DC_PCLMUL inline void MulAcc(Acc& a, __m128i x, __m128i k) {
  a.lo = _mm_xor_si128(a.lo, _mm_clmulepi64_si128(x, k, 0x00));
  a.hi = _mm_xor_si128(a.hi, _mm_clmulepi64_si128(x, k, 0x11));
  a.mid = _mm_xor_si128(
      a.mid, _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x01), _mm_clmulepi64_si128(x, k, 0x10)));
}
DC_PCLMUL inline __m128i Finish(const Acc& a) {
  return Reduce(_mm_xor_si128(a.lo, _mm_slli_si128(a.mid, 8)),
                _mm_xor_si128(a.hi, _mm_srli_si128(a.mid, 8)));
}
DC_PCLMUL inline __m128i MulX(__m128i x, __m128i k) {
  Acc a{_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
  MulAcc(a, x, k);
  return Finish(a);
}

// Groups of 8 blocks, one reduction each: y' = (y + M_0) beta^8 + M_1 beta^7 + ... +
// M_7 beta. Then single blocks. Advances p and n.
DC_PCLMUL inline __m128i Groups8(__m128i y, const std::byte*& p, size_t& n, const Powers& pw) {
  __m128i k[8];
  for (int i = 0; i < 8; ++i) k[i] = Load(pw.beta_desc[24 + i]);
  while (n >= 8) {
    // The blocks' products first, y's last: the loop-carried chain is then one
    // product, one XOR and the reduction.
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + 64, _MM_HINT_T0);
    Acc a{_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    for (int i = 1; i < 8; ++i) MulAcc(a, LoadBlock(p + 16 * i), k[i]);
    MulAcc(a, _mm_xor_si128(y, LoadBlock(p)), k[0]);
    y = Finish(a);
    p += 128;
    n -= 8;
  }
  while (n > 0) {
    y = MulX(_mm_xor_si128(y, LoadBlock(p)), k[7]);
    p += 16;
    --n;
  }
  return y;
}

DC_VPCLMUL inline __m128i Fold(__m512i v) {
  const __m256i a = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}
DC_VPCLMUL inline __m512i Xor3(__m512i a, __m512i b, __m512i c) {
  return _mm512_ternarylogic_epi64(a, b, c, 0x96);
}

struct PclmulBackend {
  struct Acc {
    __m128i low, high;  // products with the power's low and high 64 bits
  };
  DC_PCLMUL static Acc Zero() { return {_mm_setzero_si128(), _mm_setzero_si128()}; }
  DC_PCLMUL static void Accumulate(Acc& a, uint64_t value, const Gf128& power) {
    const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(value));
    const __m128i p = Load(power);
    a.low = _mm_xor_si128(a.low, _mm_clmulepi64_si128(v, p, 0x00));
    a.high = _mm_xor_si128(a.high, _mm_clmulepi64_si128(v, p, 0x10));
  }
  DC_PCLMUL static Gf128 Finish(const Acc& a) {
    return Store(
        Reduce(_mm_xor_si128(a.low, _mm_slli_si128(a.high, 8)), _mm_srli_si128(a.high, 8)));
  }
  DC_PCLMUL static Gf128 Mul(Gf128 a, Gf128 b) { return Store(MulX(Load(a), Load(b))); }
};

}  // namespace

bool CpuHasPclmul() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}

bool CpuHasVpclmul() {
  __builtin_cpu_init();
  return CpuHasPclmul() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("vpclmulqdq");
}

DC_PCLMUL Gf128 MulPclmul(Gf128 a, Gf128 b) { return Store(MulX(Load(a), Load(b))); }

// flatten: the backend's members inline here, where PCLMULQDQ is allowed.
__attribute__((target("pclmul,sse4.1"), flatten)) Gf128 MaskPclmul(const uint32_t* positions,
                                                                   size_t count,
                                                                   const std::byte* words,
                                                                   uint32_t element_size) {
  return MaskKernel<PclmulBackend>(positions, count, words, element_size);
}

DC_PCLMUL Gf128 HornerPclmul(Gf128 y, const std::byte* blocks, size_t count) {
  return Store(Groups8(Load(y), blocks, count, GetPowers()));
}

// 32 blocks (512 bytes) per reduction: blocks 4i..4i+3 sit in the lanes of one zmm
// and are multiplied by beta^(32-4i) .. beta^(29-4i); y is multiplied by beta^32 on
// its own, so the loop-carried chain is one product and one reduction long while the
// 32 block products of the next group proceed in parallel.
DC_VPCLMUL Gf128 HornerVpclmul(Gf128 y0, const std::byte* p, size_t n) {
  const Powers& pw = GetPowers();
  __m128i y = Load(y0);
  if (n >= 32) {
    __m512i k[8];
    for (int i = 0; i < 8; ++i) k[i] = _mm512_loadu_si512(&pw.beta_desc[4 * i]);
    const __m128i k32 = Load(pw.beta_desc[0]);
    do {
      for (int i = 0; i < 8; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + 64 * i, _MM_HINT_T0);
      }
      __m512i m = _mm512_loadu_si512(p);
      __m512i lo = _mm512_clmulepi64_epi128(m, k[0], 0x00);
      __m512i hi = _mm512_clmulepi64_epi128(m, k[0], 0x11);
      __m512i mid = _mm512_xor_si512(_mm512_clmulepi64_epi128(m, k[0], 0x01),
                                     _mm512_clmulepi64_epi128(m, k[0], 0x10));
      for (int i = 1; i < 8; ++i) {
        m = _mm512_loadu_si512(p + 64 * i);
        lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(m, k[i], 0x00));
        hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(m, k[i], 0x11));
        mid = Xor3(mid, _mm512_clmulepi64_epi128(m, k[i], 0x01),
                   _mm512_clmulepi64_epi128(m, k[i], 0x10));
      }
      Acc a{Fold(lo), Fold(hi), Fold(mid)};
      MulAcc(a, y, k32);
      y = Finish(a);
      p += 512;
      n -= 32;
    } while (n >= 32);
  }
  return Store(Groups8(y, p, n, pw));
}

}  // namespace deltacast::gf128::internal

#else  // not x86-64: the portable loop only

namespace deltacast::gf128::internal {
bool CpuHasPclmul() { return false; }
bool CpuHasVpclmul() { return false; }
Gf128 MulPclmul(Gf128 a, Gf128 b) { return MulPortable(a, b); }
Gf128 MaskPclmul(const uint32_t* positions, size_t count, const std::byte* words,
                 uint32_t element_size) {
  return MaskPortable(positions, count, words, element_size);
}
Gf128 HornerPclmul(Gf128 y, const std::byte* p, size_t n) { return HornerPortable(y, p, n); }
Gf128 HornerVpclmul(Gf128 y, const std::byte* p, size_t n) { return HornerPortable(y, p, n); }
}  // namespace deltacast::gf128::internal

#endif

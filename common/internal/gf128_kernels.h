// The block loops behind common/partition_hash.h, one per carry-less multiply the
// CPU may have. Each computes the same function (docs/wire-format.md, "Partition
// hash", implementation note):
//
//   Horner(y, M_0..M_{n-1}) = y * beta^n + sum_j M_j * beta^(n-j),   beta = alpha^-1
//
// i.e. n steps of y = (y + M_j) * beta, reading forward. A run of blocks whose first
// block is partition block c then contributes alpha^(c+n+1) * Horner(0, ...).
//
// Thread safety: pure functions; the power tables are built once, thread-safely.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/gf128.h"

namespace deltacast::gf128::internal {

struct Powers {
  Gf128 beta;
  // beta_desc[i] = beta^(32 - i): the last 16 entries are beta^16 .. beta^1, the
  // last 8 beta^8 .. beta^1, in the order the blocks of a group are multiplied.
  Gf128 beta_desc[32];
  // alpha[l][j] = alpha^(j * 256^l), so alpha^k for k < 2^32 is at most 4 of them.
  Gf128 alpha[4][256];
  Gf128 alpha_2_32;  // alpha^(2^32)
  // qword[2j] = alpha^j, qword[2j+1] = x^64 * alpha^j: the power of 64-bit word
  // 2j or 2j+1 of a 256-block mask window (mask_kernel.h).
  Gf128 qword[512];
};
const Powers& GetPowers();

using HornerFn = Gf128 (*)(Gf128 y, const std::byte* blocks, size_t count);
using MulFn = Gf128 (*)(Gf128 a, Gf128 b);

using MaskFn = Gf128 (*)(const uint32_t* positions, size_t count, const std::byte* words,
                         uint32_t element_size);

Gf128 HornerPortable(Gf128 y, const std::byte* blocks, size_t count);
Gf128 MulPortable(Gf128 a, Gf128 b);
Gf128 MaskPortable(const uint32_t* positions, size_t count, const std::byte* words,
                   uint32_t element_size);

// Only call these where CpuHasPclmul / CpuHasVpclmul say so.
bool CpuHasPclmul();
bool CpuHasVpclmul();
Gf128 HornerPclmul(Gf128 y, const std::byte* blocks, size_t count);
Gf128 HornerVpclmul(Gf128 y, const std::byte* blocks, size_t count);
Gf128 MulPclmul(Gf128 a, Gf128 b);
Gf128 MaskPclmul(const uint32_t* positions, size_t count, const std::byte* words,
                 uint32_t element_size);

}  // namespace deltacast::gf128::internal

#include "common/partition_hash.h"

#include <cstdlib>
#include <cstring>

#include "common/gf128.h"
#include "common/internal/gf128_kernels.h"
#include "common/internal/mask_kernel.h"

namespace deltacast {
namespace gf = gf128;
namespace gi = gf128::internal;

namespace gf128::internal {

Gf128 MulPortable(Gf128 a, Gf128 b) { return Mul(a, b); }

Gf128 HornerPortable(Gf128 y, const std::byte* blocks, size_t count) {
  const Gf128 beta = GetPowers().beta;
  for (size_t j = 0; j < count; ++j) {
    const Gf128 m{LoadLE<uint64_t>(blocks + 16 * j), LoadLE<uint64_t>(blocks + 16 * j + 8)};
    y = Mul(Xor(y, m), beta);
  }
  return y;
}

namespace {

struct PortableBackend {
  struct Acc {
    Gf128 low, high;
  };
  static Acc Zero() { return {}; }
  static void Accumulate(Acc& a, uint64_t value, const Gf128& power) {
    a.low = Xor(a.low, Clmul64(value, power.lo));
    a.high = Xor(a.high, Clmul64(value, power.hi));
  }
  static Gf128 Finish(const Acc& a) {
    return Reduce({a.low.lo, a.low.hi ^ a.high.lo}, {a.high.hi, 0});
  }
  static Gf128 Mul(Gf128 a, Gf128 b) { return gf128::Mul(a, b); }
};

Powers BuildPowers() {
  const MulFn mul = CpuHasPclmul() ? MulPclmul : MulPortable;
  Powers p;
  p.beta = Inverse(kAlpha);
  Gf128 b = p.beta;
  for (int k = 1; k <= 32; ++k) {
    p.beta_desc[32 - k] = b;
    b = mul(b, p.beta);
  }
  Gf128 step = kAlpha;  // alpha^(256^l)
  for (int l = 0; l < 4; ++l) {
    Gf128 v = kOne;
    for (int j = 0; j < 256; ++j) {
      p.alpha[l][j] = v;
      v = mul(v, step);
    }
    step = v;  // alpha^(256^(l+1))
  }
  p.alpha_2_32 = step;
  const Gf128 x64{0, 1};
  for (int j = 0; j < 256; ++j) {
    p.qword[2 * j] = p.alpha[0][j];
    p.qword[2 * j + 1] = mul(p.alpha[0][j], x64);
  }
  return p;
}
}  // namespace

Gf128 MaskPortable(const uint32_t* positions, size_t count, const std::byte* words,
                   uint32_t element_size) {
  return MaskKernel<PortableBackend>(positions, count, words, element_size);
}

const Powers& GetPowers() {
  static const Powers powers = BuildPowers();
  return powers;
}

}  // namespace gf128::internal

namespace {

struct Ops {
  gi::HornerFn horner;
  gi::MulFn mul;
  gi::MaskFn mask;
};

Ops OpsFor(HashPath path) {
  switch (path) {
    case HashPath::kVpclmul:
      return {gi::HornerVpclmul, gi::MulPclmul, gi::MaskPclmul};
    case HashPath::kPclmul:
      return {gi::HornerPclmul, gi::MulPclmul, gi::MaskPclmul};
    case HashPath::kPortable:
      break;
  }
  return {gi::HornerPortable, gi::MulPortable, gi::MaskPortable};
}

HashPath DetectPath() {
  HashPath best = gi::CpuHasVpclmul()  ? HashPath::kVpclmul
                  : gi::CpuHasPclmul() ? HashPath::kPclmul
                                       : HashPath::kPortable;
  if (const char* forced = std::getenv("DELTACAST_HASH_PATH")) {
    for (HashPath p : {HashPath::kPortable, HashPath::kPclmul, HashPath::kVpclmul}) {
      if (HashPathName(p) == forced && p <= best) return p;
    }
  }
  return best;
}

const Ops& ActiveOps() {
  static const Ops ops = OpsFor(ActiveHashPath());
  return ops;
}

PartitionHash ToHash(gf::Gf128 v) { return {v.lo, v.hi}; }

// alpha^k from the tables (as AlphaPowWith in mask_kernel.h, with the path's multiply).
gf::Gf128 AlphaPow(const Ops& ops, uint64_t k) {
  const gi::Powers& pw = gi::GetPowers();
  gf::Gf128 r = pw.alpha[0][k & 255];
  for (int l = 1; l < 4; ++l) {
    const uint64_t digit = (k >> (8 * l)) & 255;
    if (digit != 0) r = ops.mul(r, pw.alpha[l][digit]);
  }
  if (k >> 32) {
    gf::Gf128 base = pw.alpha_2_32;
    for (uint64_t rest = k >> 32; rest != 0; rest >>= 1) {
      if (rest & 1) r = ops.mul(r, base);
      base = ops.mul(base, base);
    }
  }
  return r;
}

// Horner over the blocks `n` bytes at byte `offset` touch, partial first and last
// blocks zero-filled: returns y with contribution alpha^(*end) * y, where *end is
// the last touched block's index + 2 (gf128_kernels.h).
gf::Gf128 PieceY(const Ops& ops, const std::byte* p, uint64_t n, uint64_t offset, uint64_t* end) {
  *end = (offset + n - 1) / 16 + 2;
  const gf::Gf128 beta = gi::GetPowers().beta;
  gf::Gf128 y;
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  const unsigned shift = static_cast<unsigned>(offset % 16);
  if (shift != 0) {
    const unsigned k = static_cast<unsigned>(n < 16 - shift ? n : 16 - shift);
    y = ops.mul(gf::PlaceBytes(bytes, k, shift), beta);
    bytes += k;
    n -= k;
  }
  const uint64_t full = n / 16;
  if (full > 0) {
    y = ops.horner(y, reinterpret_cast<const std::byte*>(bytes), full);
    bytes += 16 * full;
    n -= 16 * full;
  }
  if (n > 0) y = ops.mul(gf::Xor(y, gf::PlaceBytes(bytes, static_cast<unsigned>(n), 0)), beta);
  return y;
}

PartitionHash Piece(const Ops& ops, ByteSpan bytes, uint64_t offset) {
  if (bytes.empty()) return {};
  uint64_t end;
  const gf::Gf128 y = PieceY(ops, bytes.data(), bytes.size(), offset, &end);
  return ToHash(ops.mul(y, AlphaPow(ops, end)));
}

// Rows last to first, Horner with the gap between consecutive rows' end powers:
// T = T * alpha^(end_{r+1} - end_r) + y_r, then alpha^(end_0). Gaps take at most two
// values, so their powers are cached.
PartitionHash Run(const Ops& ops, const std::byte* src, const StridedRun& run) {
  if (run.count == 0 || run.row_bytes == 0) return {};
  gf::Gf128 t;
  uint64_t next_end = 0;
  uint64_t cached_gap[2] = {~0ull, ~0ull};
  gf::Gf128 cached_pow[2];
  for (uint64_t r = run.count; r-- > 0;) {
    uint64_t end;
    const gf::Gf128 y = PieceY(ops, src + r * run.src_stride, run.row_bytes,
                               run.dst_offset + r * run.dst_stride, &end);
    if (r + 1 < run.count) {
      const uint64_t gap = next_end - end;
      int slot = cached_gap[0] == gap ? 0 : cached_gap[1] == gap ? 1 : -1;
      if (slot < 0) {
        slot = cached_gap[0] == ~0ull ? 0 : 1;
        cached_gap[slot] = gap;
        cached_pow[slot] = AlphaPow(ops, gap);
      }
      t = ops.mul(t, cached_pow[slot]);
    }
    t = gf::Xor(t, y);
    next_end = end;
  }
  return ToHash(ops.mul(t, AlphaPow(ops, next_end)));
}

PartitionHash Mask(const Ops& ops, std::span<const uint32_t> positions, const std::byte* words,
                   uint32_t element_size) {
  return ToHash(ops.mask(positions.data(), positions.size(), words, element_size));
}

}  // namespace

std::string PartitionHash::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::byte bytes[kBytes];
  Store(bytes);
  std::string out;
  out.reserve(2 * kBytes);
  for (std::byte b : bytes) {
    out.push_back(kHex[static_cast<uint8_t>(b) >> 4]);
    out.push_back(kHex[static_cast<uint8_t>(b) & 15]);
  }
  return out;
}

std::optional<PartitionHash> PartitionHash::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kBytes) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::byte bytes[kBytes];
  for (size_t i = 0; i < kBytes; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    bytes[i] = std::byte(static_cast<uint8_t>(hi << 4 | lo));
  }
  return Load(bytes);
}

HashPath ActiveHashPath() {
  static const HashPath path = DetectPath();
  return path;
}

std::string_view HashPathName(HashPath path) {
  switch (path) {
    case HashPath::kPortable:
      return "portable";
    case HashPath::kPclmul:
      return "pclmul";
    case HashPath::kVpclmul:
      return "vpclmul";
  }
  return "unknown";
}

bool HashPathSupported(HashPath path) {
  switch (path) {
    case HashPath::kPortable:
      return true;
    case HashPath::kPclmul:
      return gi::CpuHasPclmul();
    case HashPath::kVpclmul:
      return gi::CpuHasVpclmul();
  }
  return false;
}

PartitionHash PartitionLengthTerm(uint64_t byte_length) {
  return ToHash(gf::LengthTerm(byte_length));
}

PartitionHash HashPartition(ByteSpan bytes) {
  return PartitionLengthTerm(bytes.size()) ^ Piece(ActiveOps(), bytes, 0);
}

PartitionHash HashPiece(ByteSpan bytes, uint64_t offset) {
  return Piece(ActiveOps(), bytes, offset);
}

PartitionHash CombinePieces(std::span<const PartitionHash> pieces, uint64_t byte_length) {
  PartitionHash h = PartitionLengthTerm(byte_length);
  for (const PartitionHash& p : pieces) h ^= p;
  return h;
}

PartitionHash HashStridedRun(const std::byte* src, const StridedRun& run) {
  return Run(ActiveOps(), src, run);
}

PartitionHash HashSparseMask(std::span<const uint32_t> positions, const std::byte* words,
                             uint32_t element_size) {
  return Mask(ActiveOps(), positions, words, element_size);
}

PartitionHash HashPieceOn(HashPath path, ByteSpan bytes, uint64_t offset) {
  return Piece(OpsFor(path), bytes, offset);
}

PartitionHash HashStridedRunOn(HashPath path, const std::byte* src, const StridedRun& run) {
  return Run(OpsFor(path), src, run);
}

PartitionHash HashSparseMaskOn(HashPath path, std::span<const uint32_t> positions,
                               const std::byte* words, uint32_t element_size) {
  return Mask(OpsFor(path), positions, words, element_size);
}

}  // namespace deltacast

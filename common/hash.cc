#include "common/hash.h"

#define XXH_STATIC_LINKING_ONLY  // exposes XXH3_state_t so Hasher128 can hold one
#include <xxhash.h>
// The shared libxxhash picks the widest SIMD (SSE2, AVX2, AVX-512) at run time;
// hashing runs on every partition twice per apply, so that choice matters.
#include <xxh_x86dispatch.h>

namespace deltacast {

uint64_t Hash64(ByteSpan data) { return XXH3_64bits_dispatch(data.data(), data.size()); }

namespace {
Digest128 FromCanonical(XXH128_hash_t h) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, h);
  Digest128 d;
  std::memcpy(d.bytes.data(), canonical.digest, 16);
  return d;
}
}  // namespace

Digest128 Hash128(ByteSpan data) {
  return FromCanonical(XXH3_128bits_dispatch(data.data(), data.size()));
}

bool Digest128::IsZero() const {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

std::string Digest128::ToHex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::optional<Digest128> Digest128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Digest128 d;
  for (size_t i = 0; i < 16; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return d;
}

struct Hasher128::State {
  XXH3_state_t xxh;
};

Hasher128::Hasher128() : state_(std::make_unique<State>()) { XXH3_128bits_reset(&state_->xxh); }
Hasher128::~Hasher128() = default;
Hasher128::Hasher128(Hasher128&&) noexcept = default;
Hasher128& Hasher128::operator=(Hasher128&&) noexcept = default;

void Hasher128::Update(ByteSpan data) {
  XXH3_128bits_update_dispatch(&state_->xxh, data.data(), data.size());
}

void Hasher128::UpdateString(std::string_view s) {
  UpdateValue<uint64_t>(s.size());
  Update(AsBytes(s));
}

Digest128 Hasher128::Finish() const { return FromCanonical(XXH3_128bits_digest(&state_->xxh)); }

}  // namespace deltacast

// Content hashes: xxh3-64 checksums of chunks and files, xxh3-128 for version ids.
// Partition hashes are the composable hash of common/partition_hash.h.
//
// xxh3 is not cryptographic: it detects corruption and identifies versions; the
// relay's auth token (not these hashes) is what keeps out a peer that lies on purpose.
//
// Thread safety: free functions are thread-safe; a Hasher128 is used by one thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/bytes.h"

namespace deltacast {

uint64_t Hash64(ByteSpan data);

// A 128-bit digest; identifies a checkpoint version (see apply/manifest.h).
struct Digest128 {
  std::array<uint8_t, 16> bytes{};

  auto operator<=>(const Digest128&) const = default;
  bool IsZero() const;
  // 32 lowercase hex characters.
  std::string ToHex() const;
  // The first 12 hex characters, for logs and tables.
  std::string ShortHex() const { return ToHex().substr(0, 12); }
  static std::optional<Digest128> FromHex(std::string_view hex);
};

Digest128 Hash128(ByteSpan data);

// Incremental xxh3-128 over a sequence of updates.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(Hasher128&&) noexcept;
  Hasher128& operator=(Hasher128&&) noexcept;

  void Update(ByteSpan data);
  template <typename T>
  void UpdateValue(T v) {
    std::byte buf[sizeof(T)];
    StoreLE(buf, v);
    Update(ByteSpan(buf, sizeof(T)));
  }
  // Length-prefixed, so ("ab","c") and ("a","bc") hash differently.
  void UpdateString(std::string_view s);
  Digest128 Finish() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace deltacast

// Byte spans and bounds-checked little-endian reading and writing.
//
// Every multi-byte integer deltacast puts on disk or on the wire is little-endian
// (docs/wire-format.md). ByteReader never reads past its span: each read reports
// failure instead, so parsers validate lengths by construction.
//
// Thread safety: ByteReader and ByteWriter are not thread-safe; use one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deltacast {

using ByteSpan = std::span<const std::byte>;
using MutableByteSpan = std::span<std::byte>;

inline ByteSpan AsBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
inline std::string_view AsChars(ByteSpan b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

template <typename T>
inline T LoadLE(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  return v;
}
template <typename T>
inline void StoreLE(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Appends little-endian values to a growing byte vector.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>& out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    StoreLE(out_.data() + at, v);
  }
  void PutBytes(ByteSpan b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void PutString(std::string_view s) { PutBytes(AsBytes(s)); }
  // LEB128: 7 bits a byte, high bit set on all but the last.
  void PutVarint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(std::byte(static_cast<uint8_t>(v) | 0x80));
      v >>= 7;
    }
    out_.push_back(std::byte(static_cast<uint8_t>(v)));
  }
  size_t size() const { return out_.size(); }

 private:
  std::vector<std::byte>& out_;
};

// Reads little-endian values from a span; every read checks the remaining length.
class ByteReader {
 public:
  explicit ByteReader(ByteSpan in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    v = LoadLE<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, ByteSpan& out) {
    if (in_.size() - pos_ < n) return false;
    out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // Rejects encodings longer than 10 bytes or that overflow 64 bits.
  bool GetVarint(uint64_t& v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= in_.size()) return false;
      const auto byte = static_cast<uint8_t>(in_[pos_++]);
      if (shift == 63 && byte > 1) return false;
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        v = result;
        return true;
      }
    }
    return false;
  }
  size_t position() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }
  ByteSpan rest() const { return in_.subspan(pos_); }

 private:
  ByteSpan in_;
  size_t pos_ = 0;
};

}  // namespace deltacast

// Shared by the relay protocol's encoders and parsers (relay/wire/protocol.cc,
// relay/wire/handshake.cc, relay/producers/producer_protocol.cc): the message header,
// length-prefixed strings and digests, and a reader that checks every field against the bytes that
// remain.
//
// Thread safety: values and pure functions.
#pragma once

#include <array>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/bytes.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay::internal {

inline std::vector<std::byte> Header(MessageType type) {
  std::vector<std::byte> out(kMessageHeaderBytes);
  WriteMessageHeader(type, out.data());
  return out;
}

inline void PutString(ByteWriter& w, std::string_view s) {
  w.Put<uint16_t>(static_cast<uint16_t>(s.size()));
  w.PutString(s);
}

inline void PutDigest(ByteWriter& w, const Digest128& d) {
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
}

inline void PutHash(ByteWriter& w, const PartitionHash& h) {
  w.Put<uint64_t>(h.lo);
  w.Put<uint64_t>(h.hi);
}

template <size_t N>
inline void PutArray(ByteWriter& w, const std::array<uint8_t, N>& a) {
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(a.data()), N));
}

// Reads a message body of one expected type, field by field, with one error text.
class BodyReader {
 public:
  BodyReader(ByteSpan message, MessageType type) : type_(type), r_(message) {}

  Status Open() {
    ASSIGN_OR_RETURN(MessageType got, PeekType(r_.rest()));
    if (got != type_) {
      return Status::Corrupt("expected " + std::string(MessageTypeName(type_)) + ", got " +
                             std::string(MessageTypeName(got)));
    }
    ByteSpan header;
    (void)r_.GetBytes(kMessageHeaderBytes, header);
    return Status::Ok();
  }
  template <typename T>
  bool Get(T& v) {
    return ok_ = ok_ && r_.Get(v);
  }
  bool GetString(std::string& s, size_t max) {
    uint16_t n;
    ByteSpan b;
    ok_ = ok_ && r_.Get(n) && n <= max && r_.GetBytes(n, b);
    if (ok_) s.assign(AsChars(b));
    return ok_;
  }
  template <size_t N>
  bool GetArray(std::array<uint8_t, N>& a) {
    ByteSpan b;
    ok_ = ok_ && r_.GetBytes(N, b);
    if (ok_) std::memcpy(a.data(), b.data(), N);
    return ok_;
  }
  bool GetDigest(Digest128& d) { return GetArray(d.bytes); }
  bool GetHash(PartitionHash& h) { return Get(h.lo) && Get(h.hi); }
  // A count of items of at least `item_bytes` each: refused when they cannot fit.
  bool GetCount(uint64_t& n, uint64_t item_bytes) {
    ok_ = ok_ && r_.Get(n) && (item_bytes == 0 || n <= r_.remaining() / item_bytes);
    if (!ok_) n = 0;
    return ok_;
  }
  // The stripe a message names, last in its body (BEGIN, HELLO): read as one byte
  // each, stripe and stripe count. Absent (truncated), Close says so; a count of 0
  // or past kMaxStripes, or a stripe past the count, is refused here.
  Status GetStripe(uint32_t& stripe, uint32_t& stripes) {
    uint8_t index = 0;
    uint8_t count = 0;
    if (!Get(index) || !Get(count)) return Status::Ok();
    if (count == 0 || count > kMaxStripes || index >= count) {
      return Status::Corrupt(std::string(MessageTypeName(type_)) + " names stripe " +
                             std::to_string(index) + " of " + std::to_string(count));
    }
    stripe = index;
    stripes = count;
    return Status::Ok();
  }
  // Marks the message bad (a flag or a value out of range); Close then fails.
  bool Fail() { return ok_ = false; }
  // Everything left, e.g. an embedded chunk.
  ByteSpan Rest() {
    ByteSpan b;
    (void)r_.GetBytes(r_.remaining(), b);
    return b;
  }
  bool GetSpan(uint64_t n, ByteSpan& out) {
    // A length from the wire may exceed size_t on no platform we build for, but
    // compare before narrowing anyway.
    return ok_ = ok_ && n <= r_.remaining() && r_.GetBytes(static_cast<size_t>(n), out);
  }
  size_t remaining() const { return r_.remaining(); }
  Status Close() {
    if (!ok_)
      return Status::Corrupt(std::string(MessageTypeName(type_)) +
                             " message is truncated or has a field out of range");
    if (r_.remaining() != 0) {
      return Status::Corrupt(std::string(MessageTypeName(type_)) + " message has " +
                             std::to_string(r_.remaining()) + " trailing bytes");
    }
    return Status::Ok();
  }

 private:
  MessageType type_;
  ByteReader r_;
  bool ok_ = true;
};

// Opens a message of `type`, reads its fields into a T with read(r, m) (which may
// return an error of its own: a count or a flag out of range), and rejects
// truncation and trailing bytes.
template <typename T, typename ReadFields>
Result<T> ParseBody(ByteSpan message, MessageType type, ReadFields read) {
  BodyReader r(message, type);
  RETURN_IF_ERROR(r.Open());
  T m;
  if constexpr (std::is_void_v<std::invoke_result_t<ReadFields&, BodyReader&, T&>>) {
    read(r, m);
  } else {
    RETURN_IF_ERROR(read(r, m));
  }
  RETURN_IF_ERROR(r.Close());
  return m;
}

}  // namespace deltacast::relay::internal

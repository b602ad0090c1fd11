// Signed versions (docs/protocol.md, "Signed versions"): the source signs each
// refit's BEGIN, every CHUNK and its decisions with an Ed25519 key, and every node
// checks them against the source's public key before it applies or commits, so a
// relay (or whoever took a relay's address, token in hand) can forward the source's
// messages but not make its own.
//
// What is signed is a label, then the message's fields (SignedBytes* below), never
// raw message bytes: the same signature cannot be taken for another message type.
// Chunks are signed over the SHA-256 of the codec chunk, so verifying costs one
// hash of the chunk plus one Ed25519 verification.
//
// Thread safety: SigningKey and VerifyKey are immutable once made; Sign and Verify
// may run on any number of threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/bytes.h"
#include "common/status.h"
#include "relay/wire/protocol.h"

namespace deltacast::relay {

using Sha256Digest = std::array<uint8_t, 32>;
Sha256Digest Sha256(ByteSpan bytes);

class SigningKey;

class VerifyKey {
 public:
  // Reads a PEM public key (SubjectPublicKeyInfo, Ed25519). kNotFound, kIoError, or
  // kInvalidArgument for anything but an Ed25519 public key.
  static Result<VerifyKey> Load(const std::filesystem::path& path);
  bool Verify(ByteSpan signed_bytes, const Signature& signature) const;
  // Writes the key as PEM (mode 0644).
  Status Write(const std::filesystem::path& path) const;

 private:
  friend class SigningKey;
  explicit VerifyKey(std::shared_ptr<void> key) : key_(std::move(key)) {}
  std::shared_ptr<void> key_;  // EVP_PKEY, kept out of this header
};

class SigningKey {
 public:
  static Result<SigningKey> Generate();
  // Reads a PEM private key (PKCS#8, Ed25519).
  static Result<SigningKey> Load(const std::filesystem::path& path);
  Signature Sign(ByteSpan signed_bytes) const;
  VerifyKey Public() const;
  // Writes the private key as PEM (mode 0600: only its owner may read it).
  Status Write(const std::filesystem::path& path) const;

 private:
  explicit SigningKey(std::shared_ptr<void> key) : key_(std::move(key)) {}
  std::shared_ptr<void> key_;  // EVP_PKEY
};

// What the signature of each signed message covers.
std::vector<std::byte> SignedBytesOfBegin(const Begin& begin);
std::vector<std::byte> SignedBytesOfDecision(MessageType type, const Decision& decision);
std::vector<std::byte> SignedBytesOfChunk(ByteSpan codec_chunk);

// The source's side: fills in the signature.
void SignBegin(const SigningKey& key, Begin& begin);
void SignDecision(const SigningKey& key, MessageType type, Decision& decision);
// A CHUNK message for `codec_chunk`, signed (unsigned with a null key).
std::vector<std::byte> EncodeSignedChunk(const SigningKey* key, ByteSpan codec_chunk);
// Signs a whole CHUNK message in place: writes the signature over its codec chunk
// into its last kSignatureBytes. kCorrupt (and `chunk_message` unchanged) unless it
// is a CHUNK message with room for one.
Status SignChunkMessage(const SigningKey& key, std::vector<std::byte>& chunk_message);

// A node's side: kPermissionDenied naming what failed.
Status VerifyBegin(const VerifyKey& key, const Begin& begin);
Status VerifyDecision(const VerifyKey& key, MessageType type, const Decision& decision);
Status VerifyChunkMessage(const VerifyKey& key, ByteSpan chunk_message);

}  // namespace deltacast::relay

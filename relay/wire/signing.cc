#include "relay/wire/signing.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/disk_seam.h"
#include "common/file_util.h"

namespace deltacast::relay {
namespace {

constexpr uint64_t kMaxKeyFileBytes = 64 << 10;

std::shared_ptr<void> Own(EVP_PKEY* key) {
  return std::shared_ptr<void>(key, [](void* k) { EVP_PKEY_free(static_cast<EVP_PKEY*>(k)); });
}
EVP_PKEY* Raw(const std::shared_ptr<void>& key) { return static_cast<EVP_PKEY*>(key.get()); }

std::vector<std::byte> Labelled(std::string_view label) {
  std::vector<std::byte> out;
  ByteWriter w(out);
  w.PutString(label);
  w.Put<uint8_t>(0);
  return out;
}

void PutDigest(ByteWriter& w, const Digest128& d) {
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(d.bytes.data()), d.bytes.size()));
}

Result<EVP_PKEY*> ReadPem(const std::filesystem::path& path, bool private_key) {
  ASSIGN_OR_RETURN(std::vector<std::byte> pem, ReadFile(path, kMaxKeyFileBytes));
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (!bio) return Status::ResourceExhausted("cannot allocate a BIO");
  EVP_PKEY* key = private_key ? PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr)
                              : PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  const std::string what = private_key ? "an Ed25519 private key" : "an Ed25519 public key";
  if (!key) return Status::InvalidArgument(path.string() + " is not a PEM file holding " + what);
  if (EVP_PKEY_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return Status::InvalidArgument(path.string() + " holds a key, but not " + what);
  }
  return key;
}

Status WritePem(const std::filesystem::path& path, EVP_PKEY* key, bool private_key) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, private_key ? 0600 : 0644);
  if (fd < 0) return Status::FromErrno(errno, "creating " + path.string());
  disk::Created(path);
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    return Status::FromErrno(errno, "opening " + path.string());
  }
  const int ok = private_key ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr)
                             : PEM_write_PUBKEY(f, key);
  const bool flushed = std::fflush(f) == 0 && ::fsync(fd) == 0;
  std::fclose(f);
  if (ok != 1 || !flushed) return Status::IoError("writing " + path.string());
  disk::Synced(path);
  return Status::Ok();
}

}  // namespace

Sha256Digest Sha256(ByteSpan bytes) {
  Sha256Digest out{};
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), out.data());
  return out;
}

Result<VerifyKey> VerifyKey::Load(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(EVP_PKEY * key, ReadPem(path, /*private_key=*/false));
  return VerifyKey(Own(key));
}

bool VerifyKey::Verify(ByteSpan signed_bytes, const Signature& signature) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) return false;
  // Ed25519 takes no digest: the message goes in whole (it is short: a label and
  // fields, or a chunk's SHA-256).
  bool ok = EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, Raw(key_)) == 1 &&
            EVP_DigestVerify(ctx, signature.data(), signature.size(),
                             reinterpret_cast<const unsigned char*>(signed_bytes.data()),
                             signed_bytes.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

Status VerifyKey::Write(const std::filesystem::path& path) const {
  return WritePem(path, Raw(key_), /*private_key=*/false);
}

Result<SigningKey> SigningKey::Generate() {
  EVP_PKEY* key = nullptr;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool ok = ctx && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) return Status::Internal("OpenSSL could not generate an Ed25519 key");
  return SigningKey(Own(key));
}

Result<SigningKey> SigningKey::Load(const std::filesystem::path& path) {
  ASSIGN_OR_RETURN(EVP_PKEY * key, ReadPem(path, /*private_key=*/true));
  return SigningKey(Own(key));
}

Signature SigningKey::Sign(ByteSpan signed_bytes) const {
  Signature signature{};
  size_t length = signature.size();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, Raw(key_)) == 1 &&
                  EVP_DigestSign(ctx, signature.data(), &length,
                                 reinterpret_cast<const unsigned char*>(signed_bytes.data()),
                                 signed_bytes.size()) == 1;
  EVP_MD_CTX_free(ctx);
  // Signing with a valid in-memory Ed25519 key cannot fail but for memory: an
  // all-zero signature then fails every verification, which is the safe side.
  if (!ok) signature.fill(0);
  return signature;
}

VerifyKey SigningKey::Public() const {
  unsigned char raw[32];
  size_t length = sizeof raw;
  EVP_PKEY_get_raw_public_key(Raw(key_), raw, &length);
  return VerifyKey(Own(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw, sizeof raw)));
}

Status SigningKey::Write(const std::filesystem::path& path) const {
  return WritePem(path, Raw(key_), /*private_key=*/true);
}

std::vector<std::byte> SignedBytesOfBegin(const Begin& begin) {
  // v9: the stream id is signed too (a forged one would make nodes roll back); v12:
  // the time it began (a forged one would make nodes drop the live refit as stale).
  auto out = Labelled("deltacast-v12 BEGIN");
  ByteWriter w(out);
  w.Put<uint64_t>(begin.refit_id);
  PutDigest(w, begin.base_version);
  PutDigest(w, begin.target_version);
  w.Put<uint64_t>(begin.partition_bytes);
  w.PutBytes(ByteSpan(reinterpret_cast<const std::byte*>(begin.manifest_digest.data()),
                      begin.manifest_digest.size()));
  w.Put<uint64_t>(begin.stream_id);
  w.Put<uint64_t>(begin.begun_at_us);
  return out;
}

std::vector<std::byte> SignedBytesOfDecision(MessageType type, const Decision& decision) {
  auto out = Labelled(type == MessageType::kCommit ? "deltacast-v3 COMMIT" : "deltacast-v3 ABORT");
  ByteWriter w(out);
  w.Put<uint64_t>(decision.refit_id);
  PutDigest(w, decision.target_version);
  return out;
}

std::vector<std::byte> SignedBytesOfChunk(ByteSpan codec_chunk) {
  auto out = Labelled("deltacast-v3 CHUNK");
  const Sha256Digest digest = Sha256(codec_chunk);
  out.insert(out.end(), reinterpret_cast<const std::byte*>(digest.data()),
             reinterpret_cast<const std::byte*>(digest.data()) + digest.size());
  return out;
}

void SignBegin(const SigningKey& key, Begin& begin) {
  begin.signature = key.Sign(SignedBytesOfBegin(begin));
}

void SignDecision(const SigningKey& key, MessageType type, Decision& decision) {
  decision.signature = key.Sign(SignedBytesOfDecision(type, decision));
}

std::vector<std::byte> EncodeSignedChunk(const SigningKey* key, ByteSpan codec_chunk) {
  Signature signature{};
  if (key) signature = key->Sign(SignedBytesOfChunk(codec_chunk));
  return EncodeChunk(codec_chunk, signature);
}

Status SignChunkMessage(const SigningKey& key, std::vector<std::byte>& chunk_message) {
  ASSIGN_OR_RETURN(ChunkParts parts, SplitChunkMessage(chunk_message));
  const Signature signature = key.Sign(SignedBytesOfChunk(parts.chunk));
  std::memcpy(chunk_message.data() + chunk_message.size() - kSignatureBytes, signature.data(),
              kSignatureBytes);
  return Status::Ok();
}

Status VerifyBegin(const VerifyKey& key, const Begin& begin) {
  if (!key.Verify(SignedBytesOfBegin(begin), begin.signature)) {
    return Status::PermissionDenied("BEGIN of refit " + std::to_string(begin.refit_id) +
                                    " is not signed by the source's key");
  }
  return Status::Ok();
}

Status VerifyDecision(const VerifyKey& key, MessageType type, const Decision& decision) {
  if (!key.Verify(SignedBytesOfDecision(type, decision), decision.signature)) {
    return Status::PermissionDenied(std::string(MessageTypeName(type)) + " of refit " +
                                    std::to_string(decision.refit_id) +
                                    " is not signed by the source's key");
  }
  return Status::Ok();
}

Status VerifyChunkMessage(const VerifyKey& key, ByteSpan chunk_message) {
  auto parts = SplitChunkMessage(chunk_message);
  if (!parts.ok()) return parts.status();
  if (!key.Verify(SignedBytesOfChunk(parts->chunk), parts->signature)) {
    return Status::PermissionDenied("a CHUNK is not signed by the source's key");
  }
  return Status::Ok();
}

}  // namespace deltacast::relay

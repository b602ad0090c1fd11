// The object-store path's key layout and its small text objects (head, seal,
// chain), as docs/object-store.md specifies them (version 1). Pure functions over
// values; every parser names what is wrong with the object it refuses (kCorrupt).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/hash.h"
#include "common/status.h"

namespace deltacast::objstore {

inline constexpr int kLayoutVersion = 1;

// The keys of one bridge node's objects: `prefix`/`bridge`/...
class BucketLayout {
 public:
  BucketLayout(std::string prefix, std::string bridge);
  std::string Head() const;
  std::string Chain() const;
  std::string RefitsFolder() const;            // every refit's folder is under it
  std::string Refit(uint64_t refit_id) const;  // the folder, ending in '/'
  std::string Begin(uint64_t refit_id) const;
  std::string ChunksFolder(uint64_t refit_id) const;
  std::string Chunk(uint64_t refit_id, uint32_t sequence) const;
  std::string Manifest(uint64_t refit_id) const;
  std::string Sealed(uint64_t refit_id) const;
  std::string Prepared(uint64_t refit_id) const;
  std::string Failed(uint64_t refit_id) const;
  std::string Decision(uint64_t refit_id) const;
  std::string Outcome(uint64_t refit_id) const;
  std::string RefetchFolder(uint64_t refit_id) const;
  std::string Refetch(uint64_t refit_id, uint32_t sequence) const;
  // The request channel (docs/object-store.md, "Requests through the bucket"): a
  // child's FETCH / FETCH_MANIFEST the downlink passes up, and the source's answer.
  std::string RequestsFolder() const;
  std::string Request(uint64_t request_id) const;
  std::string AnswersFolder() const;
  std::string Answer(uint64_t request_id) const;
  // The sequence a Chunk or Refetch key ends in; kCorrupt if it does not.
  static Result<uint32_t> SequenceOf(std::string_view key);
  // The request id a Request or Answer key ends in; kCorrupt if it does not.
  static Result<uint64_t> RequestIdOf(std::string_view key);

 private:
  std::string root_;  // "prefix/bridge/"
};

// `head`: the refit in progress, or the last one decided.
std::string EncodeHead(uint64_t refit_id);
Result<uint64_t> ParseHead(std::string_view text);

// `sealed`: every chunk of the refit was written (END included).
struct SealEntry {
  uint32_t sequence = 0;
  uint64_t bytes = 0;
  uint64_t hash = 0;  // Hash64 (xxh3-64) of the CHUNK message
};
struct Seal {
  uint64_t refit_id = 0;
  std::vector<SealEntry> chunks;  // sequences 0 .. n-1, in order
};
std::string EncodeSeal(const Seal& seal);
// Also checks that the sequences run 0 .. n-1 without a gap.
Result<Seal> ParseSeal(std::string_view text);

// `chain`: the committed refits kept for catch-up, oldest first.
struct KeptRefit {
  Digest128 base;
  Digest128 target;
  uint64_t partition_bytes = 0;
  uint32_t chunks = 0;  // data chunks and END
  uint64_t refit_id = 0;
};
std::string EncodeChain(const std::vector<KeptRefit>& chain);
Result<std::vector<KeptRefit>> ParseChain(std::string_view text);

}  // namespace deltacast::objstore

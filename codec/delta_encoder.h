// The streaming delta encoder: compares two versions partition by partition on
// several threads and emits chunks in canonical order as soon as each one fills, so
// the first chunk is on its way long before the last partition is compared.
//
// Thread safety: EncodeDelta runs its own worker threads and calls `sink` from the
// calling thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "codec/chunk.h"
#include "codec/manifest.h"
#include "codec/partition_codec.h"
#include "codec/range_reader.h"
#include "common/bytes.h"
#include "common/status.h"

namespace deltacast::codec {

inline constexpr uint64_t kDefaultChunkBytes = 4ull << 20;

struct DeltaEncoderOptions {
  EncodeOptions codec;
  // A chunk is emitted once it holds at least this many bytes (and it always holds
  // at least one whole record).
  uint64_t chunk_bytes = kDefaultChunkBytes;
  size_t threads = 0;  // 0 = all cores
  // Encode on the calling thread, one partition before each is taken, with no worker
  // thread: for a caller whose every step must run on its own thread in a fixed
  // order (the simulator). `threads` is then ignored.
  bool on_calling_thread = false;
  // Called on the calling thread before the first partition and after each one is
  // encoded: tensor bytes of the changed partitions encoded so far, and in all
  // (unchanged partitions are skipped unread). Optional; for progress bars.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> on_progress;
  // Bytes left free before every chunk handed to the sink, data and END alike, and
  // room reserved after it: a caller frames each chunk as a message in the chunk's
  // own buffer instead of copying it into a new one.
  size_t chunk_headroom = 0;
  size_t chunk_tailroom = 0;
  // Where each data chunk is built: an empty buffer of at least `capacity` bytes,
  // called when a chunk is begun (a caller that keeps chunks hands back the buffers
  // of those it is done with: their pages are faulted in, where a fresh buffer of a
  // few MiB faults every page). Optional: by default a chunk the sink did not keep,
  // else a fresh buffer.
  std::function<std::vector<std::byte>(size_t capacity)> chunk_buffer;
};

struct DeltaStats {
  uint64_t tensor_bytes = 0;
  uint64_t total_elements = 0;
  uint64_t partitions = 0;
  uint64_t changed_partitions = 0;
  uint64_t changed_elements = 0;
  uint64_t delta_bytes = 0;  // every chunk byte, headers included
  uint64_t chunks = 0;       // including the END chunk
  std::array<uint64_t, kMaxEncoding + 1> records_by_encoding{};
  std::array<uint64_t, kMaxEncoding + 1> payload_bytes_by_encoding{};
  double seconds = 0;
};

// Receives each finished chunk in order (after DeltaEncoderOptions::chunk_headroom
// bytes). A non-OK status stops the encoder, which then returns that status. A sink
// that does not keep the chunk (leaves it in place) lends its buffer to the next one.
using ChunkSink = std::function<Status(std::vector<std::byte>&& chunk)>;

// Encodes the delta from `base` to `target`; *_data(i) returns tensor i's bytes.
// The two manifests must have the same tensor table and partition size; partitions
// whose hashes match are skipped without reading their bytes. Blocks until the END
// chunk has been handed to `sink`.
Status EncodeDelta(const Manifest& base, const Manifest& target,
                   const std::function<ByteSpan(size_t)>& base_data,
                   const std::function<ByteSpan(size_t)>& target_data,
                   const Digest128& target_layout, const DeltaEncoderOptions& options,
                   const ChunkSink& sink, DeltaStats* stats = nullptr);

// The same, reading each changed partition of either version through a RangeReader:
// each encoder thread has buffers of its own for readers that copy (a view is
// compared where it lies). A read error stops the encoder, which returns it, naming the
// tensor; chunks already handed to `sink` stay handed.
Status EncodeDelta(const Manifest& base, const Manifest& target, const RangeReader& read_base,
                   const RangeReader& read_target, const Digest128& target_layout,
                   const DeltaEncoderOptions& options, const ChunkSink& sink,
                   DeltaStats* stats = nullptr);

}  // namespace deltacast::codec

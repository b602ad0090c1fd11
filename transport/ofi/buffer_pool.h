// Receive buffers for the ofi backend, recycled: a received message is handed to
// on_message as a Message whose deleter returns the vector to the pool, so the
// next message of the same size lands in already-faulted-in memory instead of a
// fresh zero-filled allocation (16 MiB chunks: ~3 ms of page faults each).
// Only exact sizes are reused (chunks of one stream are mostly equal-sized);
// buffers under 64 KiB are not pooled (malloc is cheap there).
//
// Thread safety: all methods are thread-safe; Messages may outlive the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport::ofi {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(uint64_t max_cached_bytes = uint64_t{256} << 20)
      : max_cached_bytes_(max_cached_bytes) {}

  // A vector of exactly `size` bytes (contents unspecified).
  std::unique_ptr<std::vector<std::byte>> Acquire(size_t size);

  // Makes the Message handed to the application; its last owner returns the bytes
  // here (or frees them when the pool is gone).
  Message Wrap(std::unique_ptr<std::vector<std::byte>> bytes);

  uint64_t cached_bytes() const;

 private:
  static constexpr size_t kMinPooledBytes = 64 * 1024;
  static constexpr size_t kMaxPerSize = 8;
  void Return(std::vector<std::byte>* bytes);

  const uint64_t max_cached_bytes_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::unique_ptr<std::vector<std::byte>>>> free_;
  uint64_t cached_bytes_ = 0;
};

}  // namespace deltacast::transport::ofi

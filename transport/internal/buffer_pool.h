// BufferPool: recycles receive buffers so that the hot path neither allocates,
// zero-fills nor page-faults fresh memory for every message (tcp, ucx), and so that
// buffers UCX has registered (its registration cache keys on address ranges) are
// reused.
//
// A received message is handed to the application as a Message whose deleter gives
// the vector back to the pool when the last reference drops; the deleter holds the
// pool weakly, so messages may outlive the pool (then they are simply freed).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/transport.h"

namespace deltacast::transport {

using Buffer = std::unique_ptr<std::vector<std::byte>>;

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_idle_bytes` of capacity waiting for reuse.
  explicit BufferPool(uint64_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}

  // A buffer of exactly `size` bytes (contents unspecified). Throws std::bad_alloc.
  Buffer Acquire(size_t size);

  // Gives a buffer back (or frees it when the pool is full).
  void Release(Buffer buffer);

  // Turns a filled buffer into a Message that returns to this pool when released.
  Message Wrap(Buffer buffer);

  // Acquire(size) already wrapped: fill it, then hand it out as a Message.
  std::shared_ptr<std::vector<std::byte>> AcquireShared(size_t size);

  uint64_t idle_bytes() const;

 private:
  const uint64_t max_idle_bytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, Buffer> idle_;  // by capacity
  uint64_t idle_bytes_ = 0;
};

}  // namespace deltacast::transport

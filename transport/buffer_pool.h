// BufferPool: recycles receive buffers so that the hot path neither allocates,
// zero-fills nor page-faults fresh memory for every message (tcp, ucx), and so that
// buffers UCX has registered (its registration cache keys on address ranges) are
// reused.
//
// It gives memory back: a buffer idle longer than `max_idle_time` is freed (on the
// next Acquire, Release or Trim), and the allocator is then asked to return freed
// pages to the system, so one connection's burst of large messages does not stay
// resident after it ends.
//
// A received message is handed to the application as a Message whose deleter gives
// the vector back to the pool when the last reference drops; the deleter holds the
// pool weakly, so messages may outlive the pool (then they are simply freed).
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/thread_annotations.h"
#include "transport/transport.h"

namespace deltacast::transport {

using Buffer = std::unique_ptr<std::vector<std::byte>>;

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  using Clock = std::chrono::steady_clock;

  // Keeps at most `max_idle_bytes` of capacity waiting for reuse, each buffer for at
  // most `max_idle_time`.
  explicit BufferPool(uint64_t max_idle_bytes,
                      std::chrono::milliseconds max_idle_time = std::chrono::milliseconds(2000))
      : max_idle_bytes_(max_idle_bytes), max_idle_time_(max_idle_time) {}

  // A buffer of exactly `size` bytes (contents unspecified). Throws std::bad_alloc.
  Buffer Acquire(size_t size);

  // Gives a buffer back (or frees it when the pool is full).
  void Release(Buffer buffer);

  // Turns a filled buffer into a Message that returns to this pool when released.
  Message Wrap(Buffer buffer);

  // Acquire(size) already wrapped: fill it, then hand it out as a Message.
  std::shared_ptr<std::vector<std::byte>> AcquireShared(size_t size);

  // Frees the buffers idle longer than max_idle_time as of `now`. Returns the bytes
  // freed. Call it periodically when no Acquire or Release may come for a while.
  uint64_t Trim(Clock::time_point now = Clock::now());

  uint64_t idle_bytes() const;

 private:
  struct Idle {
    Buffer buffer;
    Clock::time_point since;
  };
  // Caller holds mu_; moves expired buffers into `freed` (destroyed outside the lock).
  void ExpireLocked(Clock::time_point now, std::vector<Buffer>& freed) REQUIRES(mu_);

  const uint64_t max_idle_bytes_;
  const std::chrono::milliseconds max_idle_time_;
  mutable Mutex mu_;
  std::multimap<size_t, Idle> idle_ GUARDED_BY(mu_);  // by capacity
  uint64_t idle_bytes_ GUARDED_BY(mu_) = 0;
};

}  // namespace deltacast::transport

// Receive buffers for the ofi backend, recycled: a received message is handed to
// on_message as a Message whose deleter returns the vector to the pool, so the
// next message of the same size lands in already-faulted-in memory instead of a
// fresh zero-filled allocation (16 MiB chunks: ~3 ms of page faults each).
// Only exact sizes are reused (chunks of one stream are mostly equal-sized);
// unregistered buffers under 64 KiB are not pooled (malloc is cheap there).
//
// Registration (when the transport registers memory, ofi_transport.h): a buffer
// is registered once, when first allocated, and keeps its MR while it is posted,
// while the application holds its Message (DescOf finds it, so forwarding a
// received Message costs no registration) and while it waits in the pool: the
// deleter returns bytes and MR together. The MR is closed before its bytes are
// freed, always on the progress thread (the domain is FI_THREAD_DOMAIN): a
// buffer the pool cannot keep waits in a retired list until CloseRetired, and
// CloseRegistrations (teardown, before the domain closes) closes every MR the
// pool knows, including those of Messages still held by the application.
//
// Thread safety: Acquire(size), Wrap, the Message deleter and cached_bytes are
// thread-safe; AcquireRegistered, DescOf, CloseRetired and CloseRegistrations
// run on the progress thread only. Messages may outlive the pool.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "transport/ofi/mr_cache.h"
#include "transport/transport.h"

namespace deltacast::transport::ofi {

// A receive buffer and, when registered, its MR (closed before the bytes go).
struct PooledBuffer {
  std::unique_ptr<std::vector<std::byte>> bytes;  // first: destroyed after the MR
  MemoryRegion mr;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(uint64_t max_cached_bytes = uint64_t{256} << 20)
      : max_cached_bytes_(max_cached_bytes) {}

  // Buffers from AcquireRegistered are registered through `register_fn`, which
  // must stay usable until CloseRegistrations. Call before any Acquire.
  void EnableRegistration(MrCache::RegisterFn register_fn) { register_ = std::move(register_fn); }

  // A vector of exactly `size` bytes (contents unspecified), not registered.
  PooledBuffer Acquire(size_t size);
  // The same, registered (a pooled buffer keeps its MR; a new one is registered).
  // A registration failure is returned; nothing is leaked.
  Result<PooledBuffer> AcquireRegistered(size_t size);

  // Makes the Message handed to the application; its last owner returns the bytes
  // (and MR) here, or frees them when the pool is gone.
  Message Wrap(PooledBuffer buffer);

  // The descriptor of a Message this pool handed out and that is still held
  // (`data`, `size` = its bytes), or null. Valid while that Message is held.
  void* DescOf(const std::byte* data, size_t size);
  // Closes the MRs of buffers the pool could not keep.
  void CloseRetired();
  // Closes every MR the pool knows and stops registering; later returns keep no MR.
  void CloseRegistrations();

  uint64_t cached_bytes() const;
  uint64_t forwarded_sends() const { return forwarded_sends_.load(std::memory_order_relaxed); }
  uint64_t registrations() const { return registrations_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kMinPooledBytes = 64 * 1024;
  static constexpr size_t kMaxPerSize = 8;
  void Return(std::vector<std::byte>* bytes);
  std::unique_ptr<std::vector<std::byte>> TakeFree(size_t size, MemoryRegion* mr);

  const uint64_t max_cached_bytes_;
  MrCache::RegisterFn register_;
  mutable Mutex mu_;
  std::map<size_t, std::vector<PooledBuffer>> free_ GUARDED_BY(mu_);
  struct Lent {
    size_t size;
    MemoryRegion mr;
  };
  std::unordered_map<const std::byte*, Lent> lent_
      GUARDED_BY(mu_);                                 // registered, held by the application
  std::vector<PooledBuffer> retired_ GUARDED_BY(mu_);  // MR to close on the progress thread
  uint64_t cached_bytes_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> forwarded_sends_{0};
  std::atomic<uint64_t> registrations_{0};
};

}  // namespace deltacast::transport::ofi

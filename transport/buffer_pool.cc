#include "transport/buffer_pool.h"

#include "common/large_buffer.h"
#include "common/thread_annotations.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <utility>

namespace deltacast::transport {
namespace {

// glibc serves large blocks from its heap once a freed mmap'd block has raised its
// dynamic mmap threshold, and a freed heap block stays resident until trimmed.
// Release what was freed, but only when it was worth a system call.
void GiveBackToSystem(uint64_t freed_bytes) {
#if defined(__GLIBC__)
  if (freed_bytes >= (uint64_t{1} << 20)) malloc_trim(0);
#else
  (void)freed_bytes;
#endif
}

}  // namespace

void BufferPool::ExpireLocked(Clock::time_point now, std::vector<Buffer>& freed) {
  for (auto it = idle_.begin(); it != idle_.end();) {
    if (now - it->second.since < max_idle_time_) {
      ++it;
      continue;
    }
    idle_bytes_ -= it->first;
    freed.push_back(std::move(it->second.buffer));
    it = idle_.erase(it);
  }
}

Buffer BufferPool::Acquire(size_t size) {
  std::vector<Buffer> freed;
  Buffer reused;
  {
    MutexLock lock(mu_);
    ExpireLocked(Clock::now(), freed);
    auto it = idle_.lower_bound(size);
    // Reuse only a buffer that is not much larger than asked: a 64 MiB buffer
    // serving a 1 KiB message would pin the memory for nothing.
    if (it != idle_.end() && it->first <= 2 * size + 4096) {
      reused = std::move(it->second.buffer);
      idle_bytes_ -= it->first;
      idle_.erase(it);
    }
  }
  uint64_t bytes = 0;
  for (const auto& b : freed) bytes += b->capacity();
  freed.clear();
  GiveBackToSystem(bytes);
  if (reused) {
    reused->resize(size);  // within capacity: no reallocation
    return reused;
  }
  return NewLargeBuffer(size);
}

void BufferPool::Release(Buffer buffer) {
  if (!buffer) return;
  const size_t capacity = buffer->capacity();
  std::vector<Buffer> freed;
  {
    MutexLock lock(mu_);
    const auto now = Clock::now();
    ExpireLocked(now, freed);
    if (capacity == 0 || idle_bytes_ + capacity > max_idle_bytes_) {
      // Freed, not trimmed: on a busy link the next message reuses the memory, and
      // trimming on every message would cost a heap walk each.
      buffer.reset();
    } else {
      idle_bytes_ += capacity;
      idle_.emplace(capacity, Idle{std::move(buffer), now});
    }
  }
  uint64_t bytes = 0;
  for (const auto& b : freed) bytes += b->capacity();
  freed.clear();
  GiveBackToSystem(bytes);
}

uint64_t BufferPool::Trim(Clock::time_point now) {
  std::vector<Buffer> freed;
  {
    MutexLock lock(mu_);
    ExpireLocked(now, freed);
  }
  uint64_t bytes = 0;
  for (const auto& b : freed) bytes += b->capacity();
  freed.clear();
  GiveBackToSystem(bytes);
  return bytes;
}

Message BufferPool::Wrap(Buffer buffer) {
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return Message(buffer.release(), [pool](const std::vector<std::byte>* raw) {
    Buffer owned(const_cast<std::vector<std::byte>*>(raw));
    if (auto p = pool.lock()) p->Release(std::move(owned));
  });
}

std::shared_ptr<std::vector<std::byte>> BufferPool::AcquireShared(size_t size) {
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<std::vector<std::byte>>(Acquire(size).release(),
                                                 [pool](std::vector<std::byte>* raw) {
                                                   Buffer owned(raw);
                                                   if (auto p = pool.lock())
                                                     p->Release(std::move(owned));
                                                 });
}

uint64_t BufferPool::idle_bytes() const {
  MutexLock lock(mu_);
  return idle_bytes_;
}

}  // namespace deltacast::transport

#include "transport/internal/buffer_pool.h"

#include <utility>

namespace deltacast::transport {

Buffer BufferPool::Acquire(size_t size) {
  {
    std::lock_guard lock(mu_);
    auto it = idle_.lower_bound(size);
    // Reuse only a buffer that is not much larger than asked: a 64 MiB buffer
    // serving a 1 KiB message would pin the memory for nothing.
    if (it != idle_.end() && it->first <= 2 * size + 4096) {
      Buffer buffer = std::move(it->second);
      idle_bytes_ -= it->first;
      idle_.erase(it);
      buffer->resize(size);  // within capacity: no reallocation
      return buffer;
    }
  }
  return std::make_unique<std::vector<std::byte>>(size);
}

void BufferPool::Release(Buffer buffer) {
  if (!buffer) return;
  const size_t capacity = buffer->capacity();
  std::lock_guard lock(mu_);
  if (capacity == 0 || idle_bytes_ + capacity > max_idle_bytes_) return;  // freed here
  idle_bytes_ += capacity;
  idle_.emplace(capacity, std::move(buffer));
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
  std::lock_guard lock(mu_);
  return idle_bytes_;
}

}  // namespace deltacast::transport

#include "transport/ofi/buffer_pool.h"

namespace deltacast::transport::ofi {

std::unique_ptr<std::vector<std::byte>> BufferPool::Acquire(size_t size) {
  if (size >= kMinPooledBytes) {
    std::lock_guard lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      auto bytes = std::move(it->second.back());
      it->second.pop_back();
      cached_bytes_ -= size;
      return bytes;
    }
  }
  return std::make_unique<std::vector<std::byte>>(size);
}

Message BufferPool::Wrap(std::unique_ptr<std::vector<std::byte>> bytes) {
  if (bytes->size() < kMinPooledBytes) {
    return Message(std::move(bytes));
  }
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return Message(bytes.release(), [pool](const std::vector<std::byte>* v) {
    auto* owned = const_cast<std::vector<std::byte>*>(v);
    if (auto alive = pool.lock()) {
      alive->Return(owned);
    } else {
      delete owned;
    }
  });
}

void BufferPool::Return(std::vector<std::byte>* bytes) {
  std::unique_ptr<std::vector<std::byte>> owned(bytes);
  std::lock_guard lock(mu_);
  auto& list = free_[owned->size()];
  if (list.size() >= kMaxPerSize || cached_bytes_ + owned->size() > max_cached_bytes_) return;
  cached_bytes_ += owned->size();
  list.push_back(std::move(owned));
}

uint64_t BufferPool::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

}  // namespace deltacast::transport::ofi

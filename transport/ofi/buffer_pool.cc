#include "transport/ofi/buffer_pool.h"

#include "common/thread_annotations.h"

namespace deltacast::transport::ofi {

std::unique_ptr<std::vector<std::byte>> BufferPool::TakeFree(size_t size, MemoryRegion* mr) {
  MutexLock lock(mu_);
  auto it = free_.find(size);
  if (it == free_.end() || it->second.empty()) return nullptr;
  PooledBuffer buffer = std::move(it->second.back());
  it->second.pop_back();
  cached_bytes_ -= size;
  *mr = std::move(buffer.mr);
  return std::move(buffer.bytes);
}

PooledBuffer BufferPool::Acquire(size_t size) {
  PooledBuffer buffer;
  if (size >= kMinPooledBytes) buffer.bytes = TakeFree(size, &buffer.mr);
  // An MR is closed only on the progress thread: an unregistered buffer is wanted
  // here, so keep it attached (it is harmless) rather than close it on this thread.
  if (!buffer.bytes) buffer.bytes = std::make_unique<std::vector<std::byte>>(size);
  return buffer;
}

Result<PooledBuffer> BufferPool::AcquireRegistered(size_t size) {
  CloseRetired();
  PooledBuffer buffer;
  buffer.bytes = TakeFree(size, &buffer.mr);
  if (!buffer.bytes) buffer.bytes = std::make_unique<std::vector<std::byte>>(size);
  if (!buffer.mr && register_) {
    auto mr = register_(buffer.bytes->data(), buffer.bytes->size());
    if (!mr.ok()) return mr.status();
    buffer.mr = std::move(mr).value();
    registrations_.fetch_add(1, std::memory_order_relaxed);
  }
  return buffer;
}

Message BufferPool::Wrap(PooledBuffer buffer) {
  if (buffer.bytes->size() < kMinPooledBytes && !buffer.mr) {
    return Message(std::move(buffer.bytes));
  }
  if (buffer.mr) {
    MutexLock lock(mu_);
    lent_[buffer.bytes->data()] = Lent{buffer.bytes->size(), std::move(buffer.mr)};
  }
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return Message(buffer.bytes.release(), [pool](const std::vector<std::byte>* v) {
    auto* owned = const_cast<std::vector<std::byte>*>(v);
    if (auto alive = pool.lock()) {
      alive->Return(owned);
    } else {
      delete owned;  // the pool closed every MR before it went (CloseRegistrations)
    }
  });
}

void* BufferPool::DescOf(const std::byte* data, size_t size) {
  MutexLock lock(mu_);
  auto it = lent_.find(data);
  if (it == lent_.end() || it->second.size != size) return nullptr;
  forwarded_sends_.fetch_add(1, std::memory_order_relaxed);
  return it->second.mr.desc();
}

void BufferPool::Return(std::vector<std::byte>* bytes) {
  PooledBuffer buffer;
  buffer.bytes.reset(bytes);
  MutexLock lock(mu_);
  if (auto it = lent_.find(bytes->data()); it != lent_.end()) {
    buffer.mr = std::move(it->second.mr);
    lent_.erase(it);
  }
  const size_t size = bytes->size();
  auto& list = free_[size];
  if (list.size() >= kMaxPerSize || cached_bytes_ + size > max_cached_bytes_) {
    if (buffer.mr) retired_.push_back(std::move(buffer));  // not on this thread
    return;
  }
  cached_bytes_ += size;
  list.push_back(std::move(buffer));
}

void BufferPool::CloseRetired() {
  std::vector<PooledBuffer> retired;
  {
    MutexLock lock(mu_);
    retired.swap(retired_);
  }
}

void BufferPool::CloseRegistrations() {
  std::map<size_t, std::vector<PooledBuffer>> free;
  std::unordered_map<const std::byte*, Lent> lent;
  std::vector<PooledBuffer> retired;
  {
    MutexLock lock(mu_);
    register_ = nullptr;
    free.swap(free_);
    lent.swap(lent_);
    retired.swap(retired_);
    cached_bytes_ = 0;
  }
}

uint64_t BufferPool::cached_bytes() const {
  MutexLock lock(mu_);
  return cached_bytes_;
}

}  // namespace deltacast::transport::ofi

#include "transport/ofi/mr_cache.h"

namespace deltacast::transport::ofi {

Result<std::shared_ptr<const Registration>> MrCache::Get(const Message& message) {
  const Key key{message->data(), message->size()};
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    // The entry holds its Message, so these bytes are still that Message's.
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    hits_.fetch_add(1, std::memory_order_relaxed);
    return it->second.registration;
  }
  auto mr = register_(message->data(), message->size());
  if (!mr.ok()) return mr.status();
  misses_.fetch_add(1, std::memory_order_relaxed);
  auto registration =
      std::make_shared<const Registration>(Registration{message, std::move(mr).value()});
  if (message->size() > max_bytes_) return registration;
  if (bytes_ + message->size() > max_bytes_) ReleaseUnused();
  while (bytes_ + message->size() > max_bytes_ && !lru_.empty()) {
    evictions_.fetch_add(1, std::memory_order_relaxed);
    Erase(entries_.find(lru_.back()));
  }
  lru_.push_front(key);
  entries_.emplace(key, Entry{registration, lru_.begin()});
  bytes_ += message->size();
  entries_count_.store(entries_.size(), std::memory_order_relaxed);
  cached_bytes_.store(bytes_, std::memory_order_relaxed);
  return registration;
}

bool MrCache::Unused(const Entry& entry) {
  // Both counts are stable at 1: only this thread could copy either pointer.
  return entry.registration.use_count() == 1 && entry.registration->message.use_count() == 1;
}

void MrCache::Release(const std::byte* data, size_t size) {
  auto it = entries_.find({data, size});
  if (it == entries_.end() || !Unused(it->second)) return;
  released_.fetch_add(1, std::memory_order_relaxed);
  Erase(it);
}

void MrCache::ReleaseUnused() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (Unused(it->second)) {
      released_.fetch_add(1, std::memory_order_relaxed);
      Erase(it);
    }
    it = next;
  }
}

void MrCache::Clear() {
  while (!entries_.empty()) Erase(entries_.begin());
}

void MrCache::Erase(std::map<Key, Entry>::iterator it) {
  bytes_ -= it->first.second;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  entries_count_.store(entries_.size(), std::memory_order_relaxed);
  cached_bytes_.store(bytes_, std::memory_order_relaxed);
}

MrCacheStats MrCache::stats() const {
  MrCacheStats s;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  s.evictions = evictions_.load(std::memory_order_relaxed);
  s.released = released_.load(std::memory_order_relaxed);
  s.entries = entries_count_.load(std::memory_order_relaxed);
  s.cached_bytes = cached_bytes_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace deltacast::transport::ofi

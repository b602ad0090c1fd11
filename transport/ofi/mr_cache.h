// The send-side registration cache of the ofi backend: the memory registration
// (fi_mr_reg) covering a caller's Message, reused while the same Message is sent
// again, so a relay forwarding one Message to several children, or a caller
// resending the same buffers, registers each buffer once and not once per send.
//
// Key: (address, length) of the Message's bytes. Lifetime: the classic danger of
// a registration cache is a stale entry: the buffer is freed, a new one is
// allocated at the same address, and the old registration (pinning the old
// pages on verbs/efa) is handed out for it. Here that cannot happen because an
// entry holds a reference to the Message it registered (Registration::message):
// while the entry exists the bytes cannot be freed, so no other live buffer can
// have the same address, and a key hit is the very same memory. The MR is closed
// before that reference is dropped (member order), so a registration never
// outlives its memory. The price is that the cache may keep a Message alive
// after its caller let go; it lets go as soon as it can tell nobody else holds
// it: ReleaseUnused() (each timer tick, and before evicting for space) drops
// entries whose Registration and Message are held by the cache alone (nobody can
// send those bytes again, so they can never hit), and Release(key) does the same
// for one entry right after its send completed. In-flight sends hold the
// Registration (shared_ptr: its lifetime is shared by the cache and every send
// of that Message in flight), so evicting an entry never closes an MR a posted
// send still uses.
//
// Eviction: LRU by last use, bounded by max_bytes of registered Messages. A
// Message larger than max_bytes is registered for its sends alone and not
// cached. Messages received by this transport and forwarded never get here: they
// carry the registration of their pooled buffer (buffer_pool.h).
//
// Thread safety: none; the progress thread owns the cache (it calls fi_mr_reg
// and fi_close on an FI_THREAD_DOMAIN domain). stats() may be read from any
// thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <utility>

#include "common/status.h"
#include "transport/ofi/fabric.h"
#include "transport/transport.h"

namespace deltacast::transport::ofi {

// A registered Message. Destruction closes the MR, then drops the Message.
struct Registration {
  Message message;  // first: destroyed last, after the MR
  MemoryRegion mr;
};

struct MrCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;     // each one a fi_mr_reg
  uint64_t evictions = 0;  // dropped for space (LRU), not counting released ones
  uint64_t released = 0;   // dropped because nobody else held the Message any more
  uint64_t entries = 0;
  uint64_t cached_bytes = 0;
};

class MrCache {
 public:
  using RegisterFn = std::function<Result<MemoryRegion>(const void* data, size_t size)>;

  // `register_fn` makes a registration (Fabric::Register); it must stay usable
  // for the cache's lifetime. Entries are dropped (MRs closed) by the destructor,
  // which must run before the domain closes.
  MrCache(uint64_t max_bytes, RegisterFn register_fn)
      : max_bytes_(max_bytes), register_(std::move(register_fn)) {}
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // The registration of `message` (non-null, non-empty): a cached one, or a new
  // one (cached unless larger than max_bytes). Keep the returned pointer until
  // the operation using its descriptor completed. A registration failure is
  // returned and changes nothing.
  Result<std::shared_ptr<const Registration>> Get(const Message& message);

  // Drops the entry for `message`'s bytes if only the cache still holds it.
  void Release(const std::byte* data, size_t size);
  // Drops every entry only the cache still holds.
  void ReleaseUnused();
  // Drops every entry (in-flight holders keep theirs).
  void Clear();

  MrCacheStats stats() const;

 private:
  using Key = std::pair<const std::byte*, size_t>;
  struct Entry {
    std::shared_ptr<const Registration> registration;
    std::list<Key>::iterator lru;  // position in lru_ (front = most recent)
  };
  static bool Unused(const Entry& entry);
  void Erase(std::map<Key, Entry>::iterator it);

  const uint64_t max_bytes_;
  const RegisterFn register_;
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;
  uint64_t bytes_ = 0;
  std::atomic<uint64_t> hits_{0}, misses_{0}, evictions_{0}, released_{0}, entries_count_{0},
      cached_bytes_{0};
};

}  // namespace deltacast::transport::ofi

// Which link waits in a handshake when a listener's slots for handshakes are all
// taken: the admission rule shared by the transport's accept side
// (transport/tcp/tcp_accept.cc, its own hello) and the relay's listeners
// (relay/wire/internal/handshake_limits.h: the tree's and the root's producers'), so no
// set of addresses that never finish a handshake can keep the others out.
//
// Thread safety: pure functions; a ProvenHosts is its owner's (one thread, or under
// the owner's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace deltacast {

// Addresses that completed the handshake lately (the last `capacity` distinct
// ones): a listener's children and producers, which a flood from addresses that
// never complete it must not displace.
class ProvenHosts {
 public:
  explicit ProvenHosts(size_t capacity = 1024) : capacity_(capacity) {}
  void Add(const std::string& host) {
    if (hosts_.contains(host)) return;
    hosts_.insert(host);
    order_.push_back(host);
    if (order_.size() > capacity_) {
      hosts_.erase(order_.front());
      order_.pop_front();
    }
  }
  bool Contains(const std::string& host) const { return hosts_.contains(host); }

 private:
  size_t capacity_;
  std::set<std::string> hosts_;
  std::deque<std::string> order_;
};

// What a listener does with a link just accepted, given the links still in the
// handshake that may give their slot up (`pending`: serial -> an entry with a
// `host` member; serials grow with age, so the smallest is the oldest) and how many
// slots are taken in all (`total`; default: pending.size()).
//
// The rule (docs/protocol.md, "Limits"; docs/transport.md): a link whose address
// already holds `max_pending_per_address` handshakes is refused. Otherwise, while fewer than
// `max_pending` wait, it is admitted. When all `max_pending` slots are taken, one
// pending link gives its slot up: the oldest of the address holding the most,
// among addresses that have not completed a handshake lately if any is pending
// (`proven`), ties to the address whose oldest link is oldest, provided that
// address holds more pending links than the newcomer's, or is unproven where the
// newcomer's is proven; else the newcomer is refused. So links that never finish
// the handshake, from however many addresses, cannot keep a slot from an address
// holding fewer of them, nor from one that completed a handshake before: a child
// is admitted, and keeps its slot until its HELLO (one round trip) unless
// `max_pending` newer links arrive first from addresses holding as few as it does
// (none can displace a proven child's link while an unproven one is pending).
struct HandshakeAdmission {
  bool admit = false;
  std::optional<uint64_t> evict;  // the pending link to close first (admit is true)
  // Refused: the cap that refused it ("max_handshakes_per_address" or
  // "max_pending_handshakes") and the count that met it.
  const char* refused_by = nullptr;
  size_t count = 0;
};

template <typename Pending>
HandshakeAdmission AdmitHandshake(const std::map<uint64_t, Pending>& pending,
                                  const std::string& host, size_t max_pending,
                                  size_t max_pending_per_address, const ProvenHosts& proven,
                                  std::optional<size_t> total = std::nullopt) {
  const size_t taken = total.value_or(pending.size());
  struct Tally {
    size_t links = 0;
    uint64_t oldest = 0;
    bool proven = false;
  };
  std::map<std::string, Tally> by_host;
  for (const auto& [serial, p] : pending) {
    Tally& t = by_host[p.host];
    if (t.links++ == 0) {
      t.oldest = serial;  // the map runs from the oldest serial up
      t.proven = proven.Contains(p.host);
    }
  }
  const auto own = by_host.find(host);
  const size_t from_host = own == by_host.end() ? 0 : own->second.links;
  if (from_host >= max_pending_per_address)
    return {false, std::nullopt, "max_handshakes_per_address", from_host};
  if (taken < max_pending) return {true, std::nullopt, nullptr, 0};
  auto before = [](const Tally& a, const Tally& b) {  // a is the likelier victim
    if (a.proven != b.proven) return !a.proven;
    if (a.links != b.links) return a.links > b.links;
    return a.oldest < b.oldest;
  };
  const Tally* victim = nullptr;
  for (const auto& [h, t] : by_host) {
    if (!victim || before(t, *victim)) victim = &t;
  }
  const bool newcomer_proven = proven.Contains(host);
  if (victim && (victim->links > from_host || (!victim->proven && newcomer_proven)))
    return {true, victim->oldest, nullptr, 0};
  return {false, std::nullopt, "max_pending_handshakes", taken};
}

}  // namespace deltacast

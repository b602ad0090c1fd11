// UpLink: which parent answers a node's requests up the tree (docs/protocol.md,
// "Stripes"): FETCH for repair, rollback and recovery bytes, catch-up's
// FETCH_CHAIN / FETCH_MANIFEST / FETCH_DELTA_CHUNK, and children's requests routed
// up. The one home of the rule: stripe 0's parent when it is joined, else the
// joined parent of the lowest stripe.
//
// Why that order: any joined parent can answer (each serves from its store or passes
// the request up to the source, on any stripe's link), so the choice is only about
// being predictable: a fixed first choice keeps S = 1 exactly as before, and sends a
// node's requests one way while every link is up (its logs and its parent's cache of
// partitions show one path). The lowest joined stripe next, for the same reason.
//
// Owns nothing but the choice and the count of what it sent: the ParentLinks are the
// node's. Requests in flight are the UpRequests' (they remember the stripe each went
// on and send it again here when that link drops).
//
// A child's request routed up goes on the stripe it came on while that parent is
// joined (SendOn): each stripe's tree leads up to the source, while a path that
// changes stripes can come back to where it was (UpRequests counts its hops).
//
// Thread safety: the node's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "relay/tree/parent_link.h"

namespace deltacast::relay {

class UpLink {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  // Called for each request sent: the stripe it went on, and whether it is one sent
  // again because the link it went on first dropped.
  using Counted = std::function<void(uint32_t stripe, bool again)>;

  // `parents`: one per stripe, stripe 0 first; they must outlive this object.
  UpLink(std::vector<ParentLink*> parents, Counted counted)
      : parents_(std::move(parents)), counted_(std::move(counted)) {}

  // The stripe whose parent answers now; kNone when no parent is joined. `unless`: a
  // node whose link is not chosen (a child's request routed up never goes to that
  // child, which is this node's parent in another stripe after a failover: it came
  // straight back, and the two passed it to each other until their caps on routed
  // requests answered "not found", 10 s later: the simulator's --stripes seed 50).
  uint32_t Chosen(const std::string& unless = {}) const {
    for (uint32_t s = 0; s < parents_.size(); ++s) {
      if (parents_[s]->joined() && (unless.empty() || parents_[s]->current() != unless)) return s;
    }
    return kNone;
  }
  // The same, skipping every parent in `skip` (UpRequests: the child a request came
  // from, and the parents that answered it "not found").
  uint32_t Chosen(const std::set<std::string>& skip) const {
    for (uint32_t s = 0; s < parents_.size(); ++s) {
      if (Usable(s, skip)) return s;
    }
    return kNone;
  }
  bool joined() const { return Chosen() != kNone; }
  // The parent the link of `stripe` is to now.
  std::string ParentOf(uint32_t stripe) const {
    return stripe < parents_.size() ? parents_[stripe]->current() : std::string();
  }
  // The parent that answers now ("" when none is joined).
  std::string current() const {
    const uint32_t s = Chosen();
    return s == kNone ? std::string() : parents_[s]->current();
  }
  // Sends a request to the parent that answers now (not `unless`); returns the stripe
  // it went on, or kNone (nothing sent) when no such parent is joined.
  uint32_t Send(std::vector<std::byte> bytes, bool again = false, const std::string& unless = {}) {
    return Send(std::move(bytes), again,
                unless.empty() ? std::set<std::string>{} : std::set<std::string>{unless});
  }
  uint32_t Send(std::vector<std::byte> bytes, bool again, const std::set<std::string>& skip) {
    return SendVia(Chosen(skip), std::move(bytes), again);
  }
  // Sends a request on `stripe`'s link if its parent is joined and not in `skip`;
  // returns `stripe`, or kNone (nothing sent). A node with one link (a sender, whose
  // children's links are keyed by the stripe it roots) sends it on that link.
  uint32_t SendOn(uint32_t stripe, std::vector<std::byte> bytes, bool again,
                  const std::set<std::string>& skip) {
    if (parents_.size() == 1) stripe = 0;
    const bool usable = stripe < parents_.size() && Usable(stripe, skip);
    return SendVia(usable ? stripe : kNone, std::move(bytes), again);
  }
  // Drops the link that answers now (fault injection).
  void Drop(const Status& why) {
    const uint32_t s = Chosen();
    if (s != kNone) parents_[s]->Drop(why);
  }

 private:
  // Whether `stripe`'s parent is joined and not in `skip`.
  bool Usable(uint32_t stripe, const std::set<std::string>& skip) const {
    return parents_[stripe]->joined() && !skip.contains(parents_[stripe]->current());
  }
  // Sends on `stripe`'s link and counts it; kNone sends nothing. Returns `stripe`.
  uint32_t SendVia(uint32_t stripe, std::vector<std::byte> bytes, bool again) {
    if (stripe == kNone) return kNone;
    parents_[stripe]->Send(std::move(bytes));
    if (counted_) counted_(stripe, again);
    return stripe;
  }

  std::vector<ParentLink*> parents_;
  Counted counted_;
};

}  // namespace deltacast::relay

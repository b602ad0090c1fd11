// StoreRecovery: brings a node's store back to its committed version after a
// restart found the journal's note that the last commit's writes might not all be on
// disk (docs/recovery.md, "Durability"): NodeStore::Reconcile re-hashes the store
// and re-applies that delta from the spool; what still differs (torn pages, or no
// spool) is fetched by hash from up the tree and written verified. Until it is done
// the node takes part in no refit (its BEGIN waits, as for a catch-up).
//
// Bytes asked for on a link that dropped are asked again (UpRequests: of another
// joined parent, or the next to join); bytes no node up the tree has (between refits the source may
// hold only the newest version) are asked again every few seconds.
//
// Owns: the recovery in progress (the fetches outstanding).
//
// Thread safety: the node's loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/runtime.h"
#include "relay/store/node_store.h"
#include "relay/tree/up_requests.h"

namespace deltacast::relay {

class StoreRecovery {
 public:
  using Clock = RuntimeClock;

  // Everything given must outlive this object. `finished` runs once the store is
  // at its committed version again (or the recovery failed: the status says why),
  // with the number of partitions fetched for it.
  using Finished = std::function<void(const Status&, uint64_t fetched)>;
  StoreRecovery(std::string node_id, UpRequests& requests, NodeStore& store, Finished finished);

  bool active() const { return active_; }
  void Start();
  // Asks again for bytes nobody had, once their retry time came.
  void Tick(Clock::time_point now);
  // Gives the recovery up, for a catch-up to a newer version (the tree moved past the
  // committed version, whose torn partitions may be nowhere now): `finished` is not
  // called; answers still on their way are ignored.
  void Abandon();

 private:
  void Ask(const Fetch& fetch);
  void OnBytes(const Fetch& fetch, const PartitionData& data);
  void Finish(const Status& status);

  const std::string node_id_;
  UpRequests& requests_;
  NodeStore& store_;
  Finished finished_;
  bool active_ = false;
  uint64_t fetched_ = 0;
  uint64_t generation_ = 0;  // so answers to an earlier recovery are ignored
  std::vector<std::pair<Clock::time_point, Fetch>> retry_;  // nobody had them
};

}  // namespace deltacast::relay

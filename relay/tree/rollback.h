// Rollback: returns a node's replica to the base of the delta in flight after an
// ABORT (docs/recovery.md, "Rollback"): first the in-memory undo of this run, then
// the delta's own records from the node's spool (XOR is self-inverse, so a
// partition at target is reverted and verified against the base hash), then base
// bytes fetched by hash from up the tree for whatever neither could restore (a link
// that drops is UpRequests' to mend: it asks another joined parent, or the next).
//
// Owns: the rollback in progress (its refit, the base fetches outstanding, the
// first error). The owner learns the outcome from `finished`.
//
// Thread safety: the node's loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relay/store/node_store.h"
#include "relay/store/spool.h"
#include "relay/tree/up_link.h"
#include "relay/tree/up_requests.h"

namespace deltacast::relay {

class Rollback {
 public:
  using Finished =
      std::function<void(uint64_t refit_id, const Status& status, const Digest128& version)>;

  // Everything given must outlive this object.
  Rollback(std::string node_id, UpLink& up, UpRequests& requests, NodeStore& store,
           Finished finished);

  // Rolls refit `refit_id`'s delta back, from `spool` (the delta's chunks as this
  // node received them; null if it has none).
  void Start(uint64_t refit_id, std::shared_ptr<Spool> spool);

 private:
  void Ask(const Fetch& fetch);
  void OnBaseBytes(const Fetch& fetch, const PartitionData& data);

  const std::string node_id_;
  UpLink& up_;  // only to drop it (fault injection)
  UpRequests& requests_;
  NodeStore& store_;
  Finished finished_;
  uint64_t refit_id_ = 0;
  size_t outstanding_ = 0;  // base partitions not yet written
  Status error_;            // the first base write that failed
};

}  // namespace deltacast::relay

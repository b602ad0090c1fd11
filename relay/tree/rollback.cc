#include "relay/tree/rollback.h"

#include <fmt/core.h>

#include "common/crash_point.h"
#include "common/log.h"

namespace deltacast::relay {

Rollback::Rollback(std::string node_id, UpLink& up, UpRequests& requests, NodeStore& store,
                   Finished finished)
    : node_id_(std::move(node_id)),
      up_(up),
      requests_(requests),
      store_(store),
      finished_(std::move(finished)) {}

void Rollback::Start(uint64_t refit_id, std::shared_ptr<Spool> spool) {
  refit_id_ = refit_id;
  outstanding_ = 0;
  error_ = Status::Ok();
  store_.Revert(std::move(spool), [this, refit_id](auto needs) {
    if (!needs.ok() || needs->empty()) {
      return store_.FinishRollback(
          needs.status(),
          [this, refit_id](const Status& s, const Digest128& v) { finished_(refit_id, s, v); });
    }
    for (const auto& n : *needs) {
      ++outstanding_;
      Ask({0, n.key.tensor, n.key.element_offset, n.byte_length, n.base_hash});
    }
    // Fault-injection tests: the parent link breaks while base bytes are awaited.
    if (FaultPoint("agent.rollback_link_lost")) {
      log::Warn(fmt::format("{}: fault injection: link lost during a rollback", node_id_));
      up_.Drop(Status::Unavailable("fault injection: link lost during a rollback"));
    }
  });
}

void Rollback::Ask(const Fetch& fetch) {
  // With no parent joined (a node that settled a held delta from the commit record
  // while its parent is away: the simulator's --coord seed 1566) the request waits in
  // UpRequests for a parent to join.
  const uint64_t refit_id = refit_id_;
  requests_.FetchPartition(fetch, [this, fetch, refit_id](const PartitionData& data) {
    if (refit_id == refit_id_) OnBaseBytes(fetch, data);
  });
}

void Rollback::OnBaseBytes(const Fetch& fetch, const PartitionData& data) {
  const uint64_t refit_id = refit_id_;
  auto written = [this, refit_id](const Status& status) {
    if (refit_id != refit_id_) return;
    if (!status.ok() && error_.ok()) error_ = status;
    if (--outstanding_ > 0) return;
    store_.FinishRollback(error_, [this, refit_id](const Status& s, const Digest128& v) {
      finished_(refit_id, s, v);
    });
  };
  if (!data.found) {
    return written(
        Status::Unavailable("no node up the tree has the base bytes of '" + fetch.tensor + "'"));
  }
  auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
  store_.WriteBase({fetch.tensor, fetch.element_offset}, owned, fetch.hash, written);
}

}  // namespace deltacast::relay

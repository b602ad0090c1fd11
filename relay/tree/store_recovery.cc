#include "relay/tree/store_recovery.h"

#include <fmt/core.h>

#include "common/log.h"

namespace deltacast::relay {
namespace {
// Between refits the bytes of the committed version may be nowhere up the tree (a
// one-shot source has exited): ask again at this pace until a refit brings them.
constexpr auto kRetryAfter = std::chrono::seconds(2);
}  // namespace

StoreRecovery::StoreRecovery(std::string node_id, UpRequests& requests, NodeStore& store,
                             Finished finished)
    : node_id_(std::move(node_id)),
      requests_(requests),
      store_(store),
      finished_(std::move(finished)) {}

void StoreRecovery::Start() {
  if (active_) return;
  active_ = true;
  fetched_ = 0;
  const uint64_t generation = ++generation_;
  retry_.clear();
  log::Warn(fmt::format("{}: the last commit's writes may not all be on disk; checking the store",
                        node_id_));
  store_.Reconcile([this, generation](const Status& status, std::vector<Fetch> differing) {
    if (generation != generation_) return;
    if (!status.ok() || differing.empty()) return Finish(status);
    log::Warn(fmt::format("{}: {} partitions differ from the committed version; fetching them",
                          node_id_, differing.size()));
    for (const Fetch& f : differing) Ask(f);
  });
}

void StoreRecovery::Ask(const Fetch& fetch) {
  const uint64_t generation = generation_;
  requests_.FetchPartition(fetch, [this, fetch, generation](const PartitionData& data) {
    if (generation == generation_) OnBytes(fetch, data);
  });
}

void StoreRecovery::Tick(Clock::time_point now) {
  if (!active_ || retry_.empty()) return;
  std::vector<Fetch> due;
  std::erase_if(retry_, [&](const auto& r) {
    if (r.first > now) return false;
    due.push_back(r.second);
    return true;
  });
  for (const Fetch& f : due) Ask(f);
}

void StoreRecovery::OnBytes(const Fetch& fetch, const PartitionData& data) {
  if (!data.found) {
    retry_.emplace_back(Clock::now() + kRetryAfter, fetch);
    return;
  }
  auto owned = std::make_shared<std::vector<std::byte>>(data.bytes.begin(), data.bytes.end());
  const uint64_t generation = generation_;
  store_.RepairReconciled({fetch.tensor, fetch.element_offset}, owned, fetch.hash,
                          [this, fetch, generation](const Status& status, bool finished) {
                            if (generation != generation_) return;
                            if (!status.ok()) {
                              // Bytes that fail their hash: ask again, later.
                              log::Warn(fmt::format("{}: recovery of '{}': {}", node_id_,
                                                    fetch.tensor, status.ToString()));
                              retry_.emplace_back(Clock::now() + kRetryAfter, fetch);
                              return;
                            }
                            ++fetched_;
                            if (finished) Finish(Status::Ok());
                          });
}

void StoreRecovery::Abandon() {
  if (!active_) return;
  active_ = false;
  ++generation_;
  retry_.clear();
}

void StoreRecovery::Finish(const Status& status) {
  active_ = false;
  ++generation_;
  retry_.clear();
  if (status.ok()) {
    log::Info(fmt::format("{}: the store is at its committed version again", node_id_));
  } else {
    log::Error(fmt::format("{}: cannot recover the store: {}", node_id_, status.ToString()));
  }
  finished_(status, fetched_);
}

}  // namespace deltacast::relay

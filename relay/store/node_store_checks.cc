// NodeStore's checks of the weights against a version: the manifest a parent sends
// a joining child, that child's comparison, and the on-demand audit (Verify). All
// run on the apply thread, after the chunks in flight, so none reads a partition
// mid-write.
#include "relay/store/node_store.h"

namespace deltacast::relay {
namespace {

uint64_t PartitionCount(const codec::Manifest& m) {
  uint64_t n = 0;
  for (const auto& t : m.partition_hashes) n += t.size();
  return n;
}

}  // namespace

void NodeStore::ActiveManifest(
    std::function<void(Digest128, std::shared_ptr<const std::vector<std::byte>>)> done) {
  apply_loop_.Post([this, done] {
    WaitForChunks();
    std::shared_ptr<const std::vector<std::byte>> serialized;
    if (!replica_->inflight()) {
      serialized = std::make_shared<const std::vector<std::byte>>(replica_->manifest().Serialize());
    }
    Reply([done, version = replica_->version(), serialized] { done(version, serialized); });
  });
}

void NodeStore::CompareWith(codec::Manifest reference, std::function<void(Result<Check>)> done) {
  apply_loop_.Post([this, reference = std::move(reference), done] {
    WaitForChunks();
    Result<Check> result =
        Status::FailedPrecondition("a delta is in flight: the weights are compared between refits");
    if (!replica_->inflight()) {
      const codec::Manifest& mine = replica_->manifest();
      result = Check{replica_->version(), mine.tensors.size(), PartitionCount(mine),
                     codec::DiffManifests(reference, mine)};
    }
    Reply([done, result = std::move(result)] { done(result); });
  });
}

void NodeStore::Verify(std::function<void(Result<Check>)> done) {
  apply_loop_.Post([this, done] {
    WaitForChunks();
    Result<Check> result = Status::FailedPrecondition(
        "a delta is in flight: verify between refits, once it committed or rolled back");
    if (!replica_->inflight()) {
      auto now = replica_->HashStoreNow();
      if (!now.ok()) {
        result = now.status().WithContext("hashing the weights");
      } else {
        const codec::Manifest& active = replica_->manifest();
        result = Check{replica_->version(), active.tensors.size(), PartitionCount(active),
                       codec::DiffManifests(active, *now)};
      }
    }
    Reply([done, result = std::move(result)] { done(result); });
  });
}

}  // namespace deltacast::relay

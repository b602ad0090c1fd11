// CatchUp: brings a node that missed versions the cluster committed (it was down
// for one or more refits, or died mid-delta and that delta committed without it)
// to the committed version `to` (docs/recovery.md, "Catch-up"). First choice: the
// chain of deltas the source kept, applied in order and journaled chunk by chunk;
// otherwise (no chain, a chunk no longer kept, a torn partition) every partition
// that differs from `to`'s manifest, overwritten with bytes fetched by hash up the
// tree. Every request travels up to the source, which answers only for versions of
// its lineage; it goes by UpRequests, which sends it again to another joined parent
// if the link it went on drops (or when one joins), so a lost link never fails a
// catch-up.
//
// Owns: the catch-up's progress (chain, link, chunks or partitions in flight,
// bytes). It reads the node's journal mirror and drives the node's store; the
// owner learns the result from `finished`.
//
// Thread safety: the node's loop thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "relay/store/node_store.h"
#include "relay/tree/up_requests.h"
#include "relay/wire/protocol.h"
#include "relay/wire/signing.h"

namespace deltacast::relay {

// One catch-up in progress (CatchUp::State). At namespace scope, not nested: clang
// 15 cannot default-construct a nested struct with member initializers inside the
// std::optional of its enclosing class.
struct CatchUpState {
  Digest128 to;
  uint64_t refit_id = 0;
  bool resolving = false;
  // First choice: the chain of deltas the source kept, applied in order.
  uint64_t chain_request = 0;  // outstanding FETCH_CHAIN; 0: none
  bool chain_answered = false;
  bool chain_mode = false;
  std::vector<ChainLink> links;
  size_t link = 0;                              // the delta being applied
  std::set<uint32_t> missing;                   // chunks not asked for (yet, or again)
  std::map<uint64_t, uint32_t> pending_chunks;  // request -> sequence
  uint32_t chunks_done = 0;                     // applied, journaled or END
  std::optional<codec::DeltaSummary> end;       // links[link]'s END
  uint32_t deltas = 0;                          // links applied
  // Otherwise: every partition that differs from the target's manifest.
  uint64_t manifest_request = 0;  // outstanding FETCH_MANIFEST; 0: none
  bool have_manifest = false;
  std::deque<apply::CatchUpPartition> queue;  // not yet asked for
  size_t outstanding = 0;
  size_t total = 0;
  size_t written = 0;
  uint64_t bytes = 0;
  std::chrono::steady_clock::time_point start;
};

// How far a catch-up has come (CatchUp::SetProgress).
struct CatchUpProgress {
  Digest128 to;
  bool by_chain = false;  // applying kept deltas; else overwriting differing partitions
  uint64_t done = 0;      // chunks applied over the whole chain, or partitions written
  uint64_t total = 0;     // chunks of the whole chain, or partitions that differ; 0: unknown
  bool finished = false;  // the catch-up's last report (it succeeded or failed)
};

class CatchUp {
 public:
  struct Result {
    Digest128 to;
    uint64_t refit_id = 0;
    bool resolving = false;  // it ends a Resolve (else a deferred BEGIN follows)
    Status status;
    uint32_t deltas = 0;      // kept deltas applied
    uint64_t partitions = 0;  // partitions overwritten
    uint64_t bytes = 0;       // fetched
  };

  // Everything given must outlive this object. `journal` is the node's mirror of
  // its replica's journal (kept current by the node).
  CatchUp(std::string node_id, UpRequests& requests, NodeStore& store,
          const NodeStore::Journal& journal, std::function<void(const Result&)> finished);

  bool active() const { return state_.has_value(); }
  const Digest128& to() const { return state_->to; }
  // The source's key: chunks of kept deltas must carry its signature (null: none
  // checked). `key` must outlive this object.
  void SetVerifyKey(const VerifyKey* key) { verify_key_ = key; }
  // Called on the loop thread as chunks or partitions land (for a progress bar);
  // empty: none.
  void SetProgress(std::function<void(const CatchUpProgress&)> progress) {
    progress_ = std::move(progress);
  }

  // Starts reaching `to` for refit `refit_id`.
  void Start(const Digest128& to, uint64_t refit_id, bool resolving);
  // A catch-up already running now ends (also) refit `refit_id`'s resolution.
  void Resolves(uint64_t refit_id);

  // Sends what the catch-up may have in flight now.
  void Pump();
  // Answers from the parent (parsed by the node).
  void OnChain(const Chain& chain);
  void OnManifest(const PartitionData& reply);
  void OnDeltaChunk(const PartitionData& reply);

 private:
  // Partitions or chunks requested at once: enough to keep a long path busy, few
  // enough that the replies stay small in memory.
  static constexpr size_t kWindow = 16;

  using State = CatchUpState;

  void StartLink(size_t i);
  void PumpChain();
  void OnLinkChunkApplied(const Status& status, const std::optional<codec::DeltaSummary>& end);
  void FinishLink();
  void FallBackToPartitions(const Status& why);
  void OnPartitionBytes(const apply::CatchUpPartition& part, const PartitionData& data);
  void Commit();
  void Finish(const Status& status);
  void ReportProgress(bool finished = false) const;

  const std::string node_id_;
  UpRequests& requests_;
  NodeStore& store_;
  const NodeStore::Journal& journal_;
  std::function<void(const Result&)> finished_;
  std::optional<State> state_;
  uint64_t generation_ = 0;  // completions of an earlier catch-up are ignored
  const VerifyKey* verify_key_ = nullptr;
  std::function<void(const CatchUpProgress&)> progress_;
};

}  // namespace deltacast::relay

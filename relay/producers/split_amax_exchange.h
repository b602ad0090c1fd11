// The root's side of the FP8 amax exchange (docs/fp8.md, "Producers"): producers
// serving FP8 send, before COVERAGE, the partial amaxes of the blocks they hold in
// part (SPLIT_AMAXES); once every producer's list is in, the root answers each
// with the max over all pieces of the blocks it listed. This is where a split
// block's pieces meet: one 16-bit |x| per piece and version, never its elements.
//
// Thread safety: used by the root's refit thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "relay/producers/fp8_share.h"
#include "relay/producers/producer_protocol.h"

namespace deltacast::relay {

struct SplitAmaxStats {
  uint64_t producers = 0;       // that sent SPLIT_AMAXES
  uint64_t split_blocks = 0;    // distinct blocks held in part
  uint64_t pieces = 0;          // their pieces, over every producer
  uint64_t exchange_bytes = 0;  // SPLIT_AMAXES messages, up and down
  // What gathering the split blocks' elements instead would move: each block's
  // pieces but its largest, BF16, both versions.
  uint64_t gather_bytes = 0;
};

class SplitAmaxExchange {
 public:
  explicit SplitAmaxExchange(size_t producers) : producers_(producers) {}

  // A producer's SPLIT_AMAXES (`bytes`: the message's size). kInvalidArgument for
  // a second one from the same producer. True once every producer's is in.
  Result<bool> Add(const std::string& producer, SplitAmaxes message, uint64_t bytes);
  // Once complete: each producer's answer (SPLIT_AMAXES with the reduced amaxes
  // of the blocks it listed), counted in stats().exchange_bytes.
  std::map<std::string, std::vector<std::byte>> Answers(uint64_t refit_id);

  bool started() const { return !lists_.empty(); }
  bool Has(const std::string& producer) const { return lists_.count(producer) > 0; }
  const SplitAmaxStats& stats() const { return stats_; }

 private:
  const size_t producers_;
  std::map<std::string, std::vector<SplitBlockAmax>> lists_;
  SplitAmaxStats stats_;
};

}  // namespace deltacast::relay

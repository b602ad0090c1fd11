#include "relay/producers/split_amax_exchange.h"

#include <algorithm>

namespace deltacast::relay {

Result<bool> SplitAmaxExchange::Add(const std::string& producer, SplitAmaxes message,
                                    uint64_t bytes) {
  if (!lists_.emplace(producer, std::move(message.blocks)).second) {
    return Status::InvalidArgument("producer " + producer + " sent SPLIT_AMAXES twice");
  }
  ++stats_.producers;
  stats_.exchange_bytes += bytes;
  return lists_.size() == producers_;
}

std::map<std::string, std::vector<std::byte>> SplitAmaxExchange::Answers(uint64_t refit_id) {
  std::vector<std::vector<SplitBlockAmax>> all;
  for (const auto& [id, list] : lists_) all.push_back(list);
  const std::vector<SplitBlockAmax> reduced = ReduceSplitAmaxes(all);
  std::map<std::pair<uint32_t, uint64_t>, const SplitBlockAmax*> by_block;
  for (const SplitBlockAmax& r : reduced) by_block[{r.tensor, r.block}] = &r;
  // The gather alternative: per block, every piece but the largest, 2 bytes an
  // element, both versions.
  std::map<std::pair<uint32_t, uint64_t>, std::pair<uint64_t, uint64_t>> sizes;  // sum, max
  for (const auto& list : all) {
    for (const SplitBlockAmax& a : list) {
      auto& [sum, max] = sizes[{a.tensor, a.block}];
      sum += a.elements;
      max = std::max(max, a.elements);
      ++stats_.pieces;
    }
  }
  stats_.split_blocks = reduced.size();
  for (const auto& [key, s] : sizes) stats_.gather_bytes += (s.first - s.second) * 2 * 2;
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [id, list] : lists_) {
    SplitAmaxes answer;
    answer.refit_id = refit_id;
    for (const SplitBlockAmax& a : list) answer.blocks.push_back(*by_block.at({a.tensor, a.block}));
    out[id] = EncodeSplitAmaxes(answer);
    stats_.exchange_bytes += out[id].size();
  }
  return out;
}

}  // namespace deltacast::relay

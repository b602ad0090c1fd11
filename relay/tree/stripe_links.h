// Striped trees (docs/protocol.md, "Stripes"): a node joins its parent in every
// stripe's tree, one link each, and a parent serves children of every stripe it is
// interior in over one listener. A parent names each child link by a key: the
// child's id for stripe 0 (so a single tree's links are named as before), "id#s"
// for stripe s > 0 ('#' is not a node id character, so keys never collide with ids).
//
// Chunk k of a refit travels on stripe k mod S; the END travels on every stripe, so
// each stripe's END tells a node that this stripe's chunks have all come (a link
// delivers in order): stripe s carries the data chunks k < n with k mod S = s (n is
// the END's data chunk count), then the END.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace deltacast::relay {

inline std::string StripeLinkKey(const std::string& node, uint32_t stripe) {
  return stripe == 0 ? node : node + "#" + std::to_string(stripe);
}
inline std::string NodeOfLink(const std::string& key) { return key.substr(0, key.find('#')); }
inline uint32_t StripeOfLink(const std::string& key) {
  const size_t hash = key.find('#');
  return hash == std::string::npos ? 0 : static_cast<uint32_t>(std::stoul(key.substr(hash + 1)));
}
// Whether stripe `stripe` of `stripes` carries chunk `sequence` (`data`: not the END).
inline bool StripeCarries(uint32_t stripe, uint32_t stripes, uint32_t sequence, bool data) {
  return !data || stripes <= 1 || sequence % stripes == stripe;
}
// How many chunks stripe `stripe` of `stripes` carries of a delta of `data_chunks`
// data chunks, its END included.
inline uint64_t StripeChunkCount(uint32_t stripe, uint32_t stripes, uint64_t data_chunks) {
  if (stripes <= 1) return data_chunks + 1;
  return data_chunks / stripes + (stripe < data_chunks % stripes ? 1 : 0) + 1;
}

}  // namespace deltacast::relay

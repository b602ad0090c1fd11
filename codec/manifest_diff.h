// ManifestDiff: where two manifests of the same model differ, tensor by tensor, in
// terms a user can act on: a tensor missing or extra, another dtype or shape, or
// the runs of partitions whose bits differ. Nodes use it to say which weights are
// wrong when they join (their manifest against the parent's) and to audit what
// landed (Node::Verify: the store hashed now against its active version).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codec/manifest.h"

namespace deltacast::codec {

struct TensorDifference {
  enum class Kind { kMissing, kExtra, kDtype, kShape, kBits };
  Kind kind = Kind::kBits;
  std::string name;
  std::string expected;  // kDtype / kShape: what the reference has, e.g. "bf16", "[4, 8]"
  std::string actual;    // what the checked side has
  // kBits: runs [first, last] of partitions whose hashes differ, ascending.
  std::vector<std::pair<uint64_t, uint64_t>> partition_runs;
  uint64_t partitions = 0;  // kBits: the tensor's partition count

  uint64_t DifferingPartitions() const;
  // What differs, e.g. "bits differ in partitions 3..5, 9 (4 of 12)".
  std::string Detail() const;
  // One line with the name: "'w': " + Detail().
  std::string Describe() const;
};

struct ManifestDiff {
  // Set when the partition sizes differ: then partitions cannot be compared, and
  // only the tensor tables are.
  bool partition_bytes_differ = false;
  uint64_t expected_partition_bytes = 0, actual_partition_bytes = 0;
  std::vector<TensorDifference> tensors;  // by name

  bool empty() const { return !partition_bytes_differ && tensors.empty(); }
  // A summary of at most `max_tensors` lines (and how many more there are).
  std::string Describe(size_t max_tensors = 8) const;
};

// How `actual` differs from `expected` (the reference).
ManifestDiff DiffManifests(const Manifest& expected, const Manifest& actual);

}  // namespace deltacast::codec

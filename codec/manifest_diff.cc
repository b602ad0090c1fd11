#include "codec/manifest_diff.h"

#include <algorithm>
#include <map>

namespace deltacast::codec {
namespace {

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string Quoted(const std::string& name) { return "'" + name + "'"; }

// Partitions whose hashes differ, as ascending runs.
std::vector<std::pair<uint64_t, uint64_t>> DifferingRuns(const std::vector<PartitionHash>& a,
                                                         const std::vector<PartitionHash>& b) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const bool same = i < a.size() && i < b.size() && a[i] == b[i];
    if (same) continue;
    if (!runs.empty() && runs.back().second + 1 == i) {
      runs.back().second = i;
    } else {
      runs.emplace_back(i, i);
    }
  }
  return runs;
}

}  // namespace

uint64_t TensorDifference::DifferingPartitions() const {
  uint64_t n = 0;
  for (const auto& [first, last] : partition_runs) n += last - first + 1;
  return n;
}

std::string TensorDifference::Detail() const {
  switch (kind) {
    case Kind::kMissing:
      return "missing";
    case Kind::kExtra:
      return "not in the reference (an extra or renamed tensor)";
    case Kind::kDtype:
      return "dtype " + actual + ", expected " + expected;
    case Kind::kShape:
      return "shape " + actual + ", expected " + expected;
    case Kind::kBits:
      break;
  }
  std::string runs;
  constexpr size_t kMaxRuns = 6;
  for (size_t i = 0; i < partition_runs.size() && i < kMaxRuns; ++i) {
    const auto& [first, last] = partition_runs[i];
    runs += (i ? ", " : "") + std::to_string(first) +
            (first == last ? "" : ".." + std::to_string(last));
  }
  if (partition_runs.size() > kMaxRuns) runs += ", ...";
  return std::string("bits differ in partition") + (DifferingPartitions() == 1 ? " " : "s ") +
         runs + " (" + std::to_string(DifferingPartitions()) + " of " + std::to_string(partitions) +
         ")";
}

std::string TensorDifference::Describe() const { return Quoted(name) + ": " + Detail(); }

std::string ManifestDiff::Describe(size_t max_tensors) const {
  if (empty()) return "no difference";
  std::string out;
  if (partition_bytes_differ) {
    out = "partition size " + std::to_string(actual_partition_bytes) + " bytes, expected " +
          std::to_string(expected_partition_bytes) + " (partitions not compared)";
  }
  for (size_t i = 0; i < tensors.size() && i < max_tensors; ++i) {
    out += (out.empty() ? "" : "; ") + tensors[i].Describe();
  }
  if (tensors.size() > max_tensors) {
    out += "; and " + std::to_string(tensors.size() - max_tensors) + " more tensors";
  }
  return out;
}

ManifestDiff DiffManifests(const Manifest& expected, const Manifest& actual) {
  ManifestDiff diff;
  diff.expected_partition_bytes = expected.partition_bytes;
  diff.actual_partition_bytes = actual.partition_bytes;
  diff.partition_bytes_differ = expected.partition_bytes != actual.partition_bytes;
  std::map<std::string, size_t> theirs;
  for (size_t i = 0; i < actual.tensors.size(); ++i) theirs.emplace(actual.tensors[i].name, i);
  for (size_t i = 0; i < expected.tensors.size(); ++i) {
    const TensorSpec& want = expected.tensors[i];
    TensorDifference d;
    d.name = want.name;
    auto it = theirs.find(want.name);
    if (it == theirs.end()) {
      d.kind = TensorDifference::Kind::kMissing;
      diff.tensors.push_back(std::move(d));
      continue;
    }
    const size_t j = it->second;
    theirs.erase(it);
    const TensorSpec& have = actual.tensors[j];
    if (have.dtype != want.dtype) {
      d.kind = TensorDifference::Kind::kDtype;
      d.expected = std::string(DTypeName(want.dtype));
      d.actual = std::string(DTypeName(have.dtype));
    } else if (have.shape != want.shape) {
      d.kind = TensorDifference::Kind::kShape;
      d.expected = ShapeText(want.shape);
      d.actual = ShapeText(have.shape);
    } else if (!diff.partition_bytes_differ && i < expected.partition_hashes.size() &&
               j < actual.partition_hashes.size()) {
      d.partition_runs = DifferingRuns(expected.partition_hashes[i], actual.partition_hashes[j]);
      if (d.partition_runs.empty()) continue;
      d.partitions = expected.partition_hashes[i].size();
    } else {
      continue;
    }
    diff.tensors.push_back(std::move(d));
  }
  for (const auto& [name, j] : theirs) {
    TensorDifference d;
    d.kind = TensorDifference::Kind::kExtra;
    d.name = name;
    diff.tensors.push_back(std::move(d));
  }
  std::sort(diff.tensors.begin(), diff.tensors.end(),
            [](const TensorDifference& a, const TensorDifference& b) { return a.name < b.name; });
  return diff;
}

}  // namespace deltacast::codec

// Versions for the object-store tests and benchmark: a chain of BF16 models, each a
// given share of elements away from the one before, held in memory and lent to a
// HostStore. No test framework: bench/bucket_bench.cc uses it too.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "apply/host_store.h"
#include "codec/manifest.h"

namespace deltacast::relay::bucket_test {

struct Versions {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<std::vector<std::byte>>> v;  // v[k][tensor]
};

// `count` versions of three BF16 tensors of `elements` each, from `seed`; each
// flips the low bit of about `rate_percent` % of the elements of the one before.
inline Versions MakeVersions(uint64_t elements, int count, uint32_t seed, int rate_percent = 3) {
  Versions out;
  std::mt19937 rng(seed);
  std::vector<std::vector<std::byte>> base;
  for (int t = 0; t < 3; ++t) {
    out.tensors.push_back({"layer" + std::to_string(t) + ".weight", DType::kBF16, {elements}});
    std::vector<std::byte> b(elements * 2);
    for (auto& x : b) x = std::byte(rng());
    base.push_back(std::move(b));
  }
  out.v.push_back(base);
  for (int k = 1; k < count; ++k) {
    auto next = out.v.back();
    for (auto& t : next) {
      for (uint64_t i = 0; i < elements; ++i) {
        if (static_cast<int>(rng() % 100) < rate_percent) t[2 * i] ^= std::byte{1};
      }
    }
    out.v.push_back(std::move(next));
  }
  return out;
}

inline std::unique_ptr<apply::WeightStore> Borrow(const std::vector<TensorSpec>& tensors,
                                                  std::vector<std::vector<std::byte>>& buffers) {
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

}  // namespace deltacast::relay::bucket_test

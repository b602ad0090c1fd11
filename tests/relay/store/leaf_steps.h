// Steps for tests of a leaf's store across restarts (power_loss_test.cc,
// snapshot_store_test.cc): three BF16 tensors of kElements, version 0 at random and
// each next one with ~3 % of the elements one unit apart, in partitions of two 4 KiB
// pages (a partition whose pages were half written back is torn, neither version).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "apply/host_store.h"
#include "codec/manifest.h"
#include "common/file_util.h"

namespace deltacast::relay::leaf_steps {

using Bytes = std::vector<std::byte>;
using Tensors = std::vector<Bytes>;

inline constexpr uint64_t kPartitionBytes = 8 << 10;
inline constexpr uint64_t kElements = 1 << 16;  // per BF16 tensor: 128 KiB, 16 partitions

inline std::vector<TensorSpec> TensorTable() {
  std::vector<TensorSpec> t;
  for (int i = 0; i < 3; ++i)
    t.push_back({"layer" + std::to_string(i) + ".weight", DType::kBF16, {kElements}});
  return t;
}

inline std::vector<Tensors> MakeSteps(int steps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensors> out(1);
  for (int i = 0; i < 3; ++i) {
    Bytes b(kElements * 2);
    for (auto& x : b) x = std::byte(rng());
    out[0].push_back(std::move(b));
  }
  for (int s = 1; s < steps; ++s) {
    Tensors next = out.back();
    for (auto& t : next) {
      for (uint64_t e = 0; e < kElements; ++e) {
        if (rng() % 100 < 3) t[2 * e] ^= std::byte{1};
      }
    }
    out.push_back(std::move(next));
  }
  return out;
}

// A host store over `buffers` (the source's weights, or an expected version).
inline std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers) {
  const auto tensors = TensorTable();
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

inline codec::Manifest ManifestOf(const apply::WeightStore& store) {
  return codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

inline Bytes ReadAll(const std::filesystem::path& path) {
  auto bytes = ReadFile(path, uint64_t{1} << 30);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : Bytes{};
}

}  // namespace deltacast::relay::leaf_steps

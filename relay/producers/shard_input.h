// What a producer reads from files: the canonical tensor table, a training rank's
// shard (one safetensors file, mapped read-only) and its placement map.
//
// Thread safety: a ShardFile is immutable once open; const use from any thread.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "common/bytes.h"
#include "common/dtype.h"
#include "common/status.h"
#include "deltacast/tensor.h"
#include "layout/placement.h"

namespace deltacast::relay {

// The canonical tensor table, sorted by name: from a JSON file {"tensors": [{"name",
// "dtype", "shape"}]} (what `deltacast synth --shards` writes from the checkpoint's
// headers) or from a checkpoint directory's safetensors headers. kCorrupt naming the
// entry for a malformed file.
Result<std::vector<TensorSpec>> LoadCanonicalTable(const std::filesystem::path& path);

std::vector<TensorSpec> ToSpecs(const std::vector<TensorSpec>& tensors);

// One safetensors file mapped read-only (MAP_PRIVATE: a trainer overwriting the file
// while we read is its bug, but it cannot corrupt what we already compared).
class ShardFile {
 public:
  static Result<std::unique_ptr<ShardFile>> Open(const std::filesystem::path& path);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  // In the file's order.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  ByteSpan TensorData(size_t index) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  ShardFile() = default;
  std::filesystem::path path_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> offsets_;  // absolute, per tensor
  void* map_ = nullptr;
  uint64_t size_ = 0;
};

// A rank's placement: its layout file (whose [layout] canonical path is relative to
// it) expanded against the canonical table and the shard's tensors.
struct RankPlacement {
  layout::PlacementMap map;
  std::vector<TensorSpec> canonical;  // sorted by name, as map.canonical()
};
Result<RankPlacement> LoadRankPlacement(const std::filesystem::path& layout_file,
                                        const std::vector<TensorSpec>& shard_tensors);

}  // namespace deltacast::relay

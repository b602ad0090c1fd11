// Partition hash throughput on one core, beside xxh3 on the same buffer.
//
//   deltacast_bench_hash [--json] [--mib N] [--partition-mib N] [--reps N]
//
// The buffer (default 256 MiB, larger than the caches, like a checkpoint) is hashed
// as consecutive partitions (default 4 MiB) on one thread, on every carry-less
// multiply path the CPU has; throughput is bytes over the thread's CPU time, best of
// --reps. Also measured: a 1 MiB buffer that stays in cache, the O(changed words)
// mask hash of a 3 % BF16 change, and a row-parallel shard's strided run.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "common/hash.h"
#include "common/partition_hash.h"

namespace dc = deltacast;

namespace {

using deltacast::bench::BestThreadCpuSeconds;

volatile uint64_t g_sink = 0;

// GB/s of hashing `buf` as partitions of `part` bytes with `hash`.
double Rate(const std::vector<std::byte>& buf, size_t part, int reps,
            const std::function<uint64_t(dc::ByteSpan)>& hash) {
  const double s = BestThreadCpuSeconds(reps, [&] {
    uint64_t acc = 0;
    for (size_t at = 0; at < buf.size(); at += part) {
      acc ^= hash(dc::ByteSpan(buf).subspan(at, std::min(part, buf.size() - at)));
    }
    g_sink = g_sink + acc;
  });
  return double(buf.size()) / s / 1e9;
}

uint64_t Fold(const dc::PartitionHash& h) { return h.lo ^ h.hi; }

std::function<uint64_t(dc::ByteSpan)> OnPath(dc::HashPath path) {
  return [path](dc::ByteSpan b) {
    return Fold(dc::PartitionLengthTerm(b.size()) ^ dc::HashPieceOn(path, b, 0));
  };
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  size_t mib = 256, partition_mib = 4;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> size_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--mib") {
      mib = std::max<size_t>(1, value());
    } else if (a == "--partition-mib") {
      partition_mib = std::max<size_t>(1, value());
    } else if (a == "--reps") {
      reps = static_cast<int>(std::max<size_t>(1, value()));
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--mib N] [--partition-mib N] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  const size_t part = partition_mib << 20;
  std::vector<std::byte> buf(mib << 20);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) dc::StoreLE<uint64_t>(buf.data() + i, rng());

  const dc::HashPath active = dc::ActiveHashPath();
  const auto xxh3 = [](dc::ByteSpan b) { return dc::Hash64(b); };
  const double xxh3_rate = Rate(buf, part, reps, xxh3);
  const double active_rate = Rate(buf, part, reps, OnPath(active));

  std::string paths;
  for (dc::HashPath p : {dc::HashPath::kPortable, dc::HashPath::kPclmul, dc::HashPath::kVpclmul}) {
    if (!dc::HashPathSupported(p)) continue;
    // The portable loop is ~100x slower: a slice of the buffer is enough.
    std::vector<std::byte> slice(
        p == dc::HashPath::kPortable ? std::min<size_t>(buf.size(), 8 << 20) : 0);
    if (!slice.empty()) std::memcpy(slice.data(), buf.data(), slice.size());
    const double r = Rate(slice.empty() ? buf : slice, part, slice.empty() ? reps : 1, OnPath(p));
    paths += (paths.empty() ? "" : ", ") + std::string("\"") + std::string(dc::HashPathName(p)) +
             "\": " + std::to_string(r);
  }

  // In cache: 1 MiB hashed 64 times per repetition.
  std::vector<std::byte> small(buf.begin(), buf.begin() + std::min<size_t>(buf.size(), 1 << 20));
  auto in_cache = [&](const std::function<uint64_t(dc::ByteSpan)>& hash) {
    const double s = BestThreadCpuSeconds(reps, [&] {
      uint64_t acc = 0;
      for (int i = 0; i < 64; ++i) acc ^= hash(small);
      g_sink = g_sink + acc;
    });
    return 64.0 * double(small.size()) / s / 1e9;
  };
  const double cache_active = in_cache(OnPath(active));
  const double cache_xxh3 = in_cache(xxh3);

  // Mask: 3 % of the BF16 elements of one partition change (uniform positions).
  const uint32_t elements = static_cast<uint32_t>(std::min(part, buf.size()) / 2);
  std::vector<uint32_t> positions;
  for (uint32_t i = 0; i < elements; ++i) {
    if (rng() % 100 < 3) positions.push_back(i);
  }
  std::vector<std::byte> words(positions.size() * 2, std::byte{1});
  const double mask_s = BestThreadCpuSeconds(
      reps * 4, [&] { g_sink = g_sink + Fold(dc::HashSparseMask(positions, words.data(), 2)); });

  // A row-parallel shard: rows of 2 KiB (1024 BF16) at a canonical stride of 8 KiB.
  const size_t row = 2048, rows = std::min(part, buf.size()) / row;
  const dc::StridedRun run{rows, row, row, 2048, 4 * row};
  const double run_s = BestThreadCpuSeconds(
      reps, [&] { g_sink = g_sink + Fold(dc::HashStridedRun(buf.data(), run)); });

  if (json) {
    std::printf(
        "{\"bench\": \"hash\", \"dispatch\": \"%s\", \"buffer_bytes\": %zu, "
        "\"partition_bytes\": %zu, \"gb_per_s_per_core\": %.3f, "
        "\"xxh3_64_gb_per_s_per_core\": %.3f, \"paths_gb_per_s_per_core\": {%s}, "
        "\"in_cache_1mib\": {\"gb_per_s_per_core\": %.3f, \"xxh3_64_gb_per_s_per_core\": %.3f}, "
        "\"mask_3pct_bf16\": {\"changes\": %zu, \"microseconds\": %.1f, "
        "\"million_changes_per_s\": %.1f, \"partition_gb_per_s_equivalent\": %.3f}, "
        "\"strided_run\": {\"row_bytes\": %zu, \"rows\": %zu, \"gb_per_s_per_core\": %.3f}}\n",
        std::string(dc::HashPathName(active)).c_str(), buf.size(), part, active_rate, xxh3_rate,
        paths.c_str(), cache_active, cache_xxh3, positions.size(), mask_s * 1e6,
        double(positions.size()) / mask_s / 1e6, double(elements) * 2 / mask_s / 1e9, row, rows,
        double(row * rows) / run_s / 1e9);
  } else {
    std::printf("dispatch %s, %zu MiB in %zu MiB partitions, one core\n",
                std::string(dc::HashPathName(active)).c_str(), mib, partition_mib);
    std::printf("  partition hash %.2f GB/s, xxh3-64 %.2f GB/s (paths: %s)\n", active_rate,
                xxh3_rate, paths.c_str());
    std::printf("  in cache (1 MiB): partition hash %.2f GB/s, xxh3-64 %.2f GB/s\n", cache_active,
                cache_xxh3);
    std::printf("  mask of %zu changes: %.1f us (%.1f M changes/s)\n", positions.size(),
                mask_s * 1e6, double(positions.size()) / mask_s / 1e6);
    std::printf("  strided run of %zu rows x %zu B: %.2f GB/s\n", rows, row,
                double(row * rows) / run_s / 1e9);
  }
  return 0;
}

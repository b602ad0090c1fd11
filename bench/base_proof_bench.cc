// What a producer's base proof costs (docs/producers.md, "What is trusted"): the
// compare pass alone, the compare with the base hashed tile by tile in the same pass
// (codec::FindChangesHashingBase, what producers run), and the compare followed by a
// separate hash pass, on one core, in one run.
//
//   deltacast_bench_base_proof [--mib N] [--rate R] [--reps N] [--json FILE]
//
// The pair is a realistic BF16 AdamW step (bench/realistic_step.h) of N MiB per
// version (default 512, larger than the caches), cut into 4 MiB partitions as a
// producer's shard is. Throughput is bytes of one version over the thread's CPU time,
// best of --reps.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/realistic_step.h"
#include "codec/change_detect.h"
#include "common/partition_hash.h"

namespace dc = deltacast;

namespace {

using deltacast::bench::BestThreadCpuSeconds;

volatile uint64_t g_sink = 0;

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 512;
  double rate = 0.03;
  int reps = 3;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--mib N] [--rate R] [--reps N] [--json FILE]\n", argv[0]);
      return 2;
    }
    const char* v = argv[++i];
    if (a == "--mib") {
      mib = std::max<size_t>(4, std::strtoull(v, nullptr, 10));
    } else if (a == "--rate") {
      rate = std::strtod(v, nullptr);
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(v));
    } else if (a == "--json") {
      json = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const size_t n = (mib << 20) / 2;
  const auto elements = dc::bench::DrawElements(7, n, /*norm_like=*/false);
  std::vector<uint16_t> base, target;
  dc::bench::StepBf16(elements, dc::bench::CalibrateLr(rate), base, target);
  const dc::ByteSpan a(reinterpret_cast<const std::byte*>(base.data()), n * 2);
  const dc::ByteSpan b(reinterpret_cast<const std::byte*>(target.data()), n * 2);
  constexpr size_t kPartition = size_t{4} << 20;
  dc::codec::SparseChanges changes;
  uint64_t changed = 0;

  auto each_partition = [&](const std::function<uint64_t(dc::ByteSpan, dc::ByteSpan)>& f) {
    uint64_t acc = 0;
    for (size_t at = 0; at < a.size(); at += kPartition) {
      const size_t len = std::min(kPartition, a.size() - at);
      acc += f(a.subspan(at, len), b.subspan(at, len));
    }
    g_sink = g_sink + acc;
  };
  const double compare = BestThreadCpuSeconds(reps, [&] {
    changed = 0;
    each_partition([&](dc::ByteSpan x, dc::ByteSpan y) {
      dc::codec::FindChanges(x, y, 2, changes);
      changed += changes.size();
      return changes.size();
    });
  });
  const double fused = BestThreadCpuSeconds(reps, [&] {
    each_partition([&](dc::ByteSpan x, dc::ByteSpan y) {
      const dc::PartitionHash h = dc::codec::FindChangesHashingBase(x, y, 2, 0, changes);
      return changes.size() + h.lo;
    });
  });
  const double separate = BestThreadCpuSeconds(reps, [&] {
    each_partition([&](dc::ByteSpan x, dc::ByteSpan y) {
      dc::codec::FindChanges(x, y, 2, changes);
      return changes.size() + dc::HashPiece(x, 0).lo;
    });
  });
  const double gb = double(a.size()) / 1e9;
  char out[1024];
  std::snprintf(out, sizeof out,
                "{\"bench\": \"base_proof\", \"command\": \"build/bin/deltacast_bench_base_proof "
                "--mib %zu --rate %g\", \"version_bytes\": %zu, \"change_rate\": %.4f, "
                "\"compare_gb_per_s_per_core\": %.3f, "
                "\"compare_hashing_base_gb_per_s_per_core\": %.3f, "
                "\"compare_then_hash_gb_per_s_per_core\": %.3f, "
                "\"fused_over_compare_cpu\": %.3f, \"separate_over_compare_cpu\": %.3f}\n",
                mib, rate, a.size(), double(changed) / double(n), gb / compare, gb / fused,
                gb / separate, fused / compare, separate / compare);
  std::fputs(out, stdout);
  if (!json.empty()) std::ofstream(json) << out;
  return 0;
}

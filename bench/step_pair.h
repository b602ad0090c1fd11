// One synthetic step pair for the benchmarks that compare two versions: `deltacast
// synth`'s step0 (the base) and step1 (at `rate`), written to `work` (emptied
// first) and opened read-only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "bench/bench_util.h"

namespace deltacast::bench {

struct StepPair {
  agent::SynthReport report;
  std::unique_ptr<apply::CheckpointDirStore> base, target;
};

// `shards`: also write each step's training shards (synth --shards).
inline StepPair SynthesizeStepPair(const std::filesystem::path& work, uint64_t params, double rate,
                                   uint64_t seed, const agent::ShardSpec& shards = {},
                                   double embedding_share = 0) {
  std::filesystem::remove_all(work);
  agent::SynthOptions synth;
  synth.out_dir = work;
  synth.params = params;
  synth.steps = 1;
  synth.change_rate = rate;
  synth.seed = seed;
  synth.shards = shards;
  synth.embedding_share = embedding_share;
  StepPair pair;
  pair.report = Check(agent::Synthesize(synth), "synth");
  using Access = apply::CheckpointDirStore::Access;
  pair.base =
      Check(apply::CheckpointDirStore::Open(work / "step0", Access::kReadOnly), "open step0");
  pair.target =
      Check(apply::CheckpointDirStore::Open(work / "step1", Access::kReadOnly), "open step1");
  return pair;
}

}  // namespace deltacast::bench

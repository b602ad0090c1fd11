// The fan-out benchmark's clusters (bench/fanout_bench.cc): the synthetic model and
// its checkpoints in memory, and one scenario's cluster of NodeAgents on loopback,
// each link paced per the uplink model, refitted once and checked bit-exact.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "apply/weight_store.h"
#include "bench/realistic_step.h"
#include "codec/manifest.h"

namespace deltacast::bench::fanout {

// The simulated model: tensor table and, per tensor, each element's master weight
// and update direction (realistic_step.h). A version is its BF16 image after a
// step of some learning rate.
struct SyntheticModel {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<bench::ElementStep>> elements;  // parallel to tensors
};

// A checkpoint held in memory: the store the source reads (and the receivers copy),
// its manifest, and Hash64 of every tensor by name for the bit-exactness check.
struct Checkpoint {
  std::vector<std::vector<std::byte>> buffers;  // what `store` borrows; empty if it owns
  std::unique_ptr<apply::WeightStore> store;
  codec::Manifest manifest;
  std::map<std::string, uint64_t> tensor_hashes;
};

enum class UplinkModel { kShared, kPerConnection, kUncapped };

struct Scenario {
  std::string topology;  // "single", "star", "chain", "tree", "striped"
  int receivers = 1;
  std::optional<int> fanout;  // nullopt: "auto", the planner's choice
  UplinkModel model = UplinkModel::kShared;
  bool full = false;                 // the whole target from an all-zero base
  std::vector<std::string> aliases;  // other scenario names that plan the same tree
  int stripes = 1;  // trees the delta is split over ([tree] stripes; "striped" only)
};

struct ClusterParams {
  double link_bytes_per_second = 0;  // 0 with kUncapped
  uint64_t chunk_bytes = 0;
  uint64_t partition_bytes = 0;
  int window = 8;
  size_t encode_threads = 0;
  size_t apply_threads = 1;
  std::string transport = "tcp";  // a transport/factory.h backend name
  std::string provider;           // its provider ("" = the library's choice)
};

struct RunResult {
  Scenario scenario;
  double change_rate = 0;
  int fanout_used = 0;
  int depth = 0;                            // deepest receiver
  double source_link_bytes_per_second = 0;  // the cap on each source -> child link
  uint64_t delta_bytes = 0;
  uint64_t checkpoint_bytes = 0;
  uint64_t chunks = 0;
  uint64_t changed_elements = 0;
  double seconds = 0;          // BEGIN to every node committed (PublishReport::seconds)
  double prepare_seconds = 0;  // BEGIN to every node PREPARED
  double stream_seconds = 0;   // BEGIN to the END chunk handed to the source's children
  double first_chunk_seconds = 0;
  bool tree_joined = false;    // every receiver had joined every stripe's parent before the publish
  double planner_seconds = 0;  // the tree planner's model for this delta
  double cpu_seconds = 0;      // the whole process, over the publish call
  double wall_seconds = 0;     // the publish call, children joining included
  uint64_t peak_held_bytes = 0;
  int attempts = 0;
  int stats_lagged = 0;     // agents whose stats showed the commit only after Publish returned
  double load_average = 0;  // the machine's 1-minute load average when the run started
  std::vector<double> samples_seconds;  // every repeat's seconds (this run is their median)
  int max_children = 0;                 // the largest fanout of any node in the plan
  int stripes = 1;                      // the trees the plan split the delta over
  // The most copies of the delta any node's uplink sends under the plan: its
  // children summed over the stripes, over the number of stripes.
  double max_upload_copies = 0;
  // Bytes of CHUNK messages each node sent ("src" and the receivers): its uplink's
  // share of the refit (docs/protocol.md, "Stripes").
  std::map<std::string, uint64_t> upload_bytes;
};

// The model's tensors and per-element steps, drawn from `seed` (realistic_step.h).
SyntheticModel DrawModel(uint64_t params, uint64_t seed);
// Hash64 of every tensor of `store`, by name.
std::map<std::string, uint64_t> TensorHashes(const apply::WeightStore& store);
// The model's BF16 image after one step of learning rate `lr` (0: the base).
Checkpoint StepCheckpoint(const SyntheticModel& model, double lr, uint64_t partition_bytes);
// All-zero tensors: the base of a "full" transfer, where every partition changes.
Checkpoint ZeroCheckpoint(const std::vector<TensorSpec>& tensors, uint64_t partition_bytes);
// Random bytes, which the entropy stage cannot shrink.
Checkpoint RandomCheckpoint(uint64_t bytes, uint64_t seed, uint64_t partition_bytes);

std::string_view UplinkModelName(UplinkModel m);
// The cluster config: "src" and receivers "n01".."nNN" on consecutive ports of
// 127.0.0.1 from `base_port`; fanout 0 = the planner's choice.
// `stripes` > 1: `[tree] stripes` (striped trees).
std::string ConfigToml(int receivers, int fanout, int base_port, const ClusterParams& p,
                       int stripes = 1);
// The machine's 1-minute load average (-1 if unknown).
double LoadAverage();
std::string ScenarioName(const Scenario& s);

// One fresh cluster on loopback, one refit base -> target, checked bit-exact (dies
// on any mismatch).
RunResult RunCluster(const Scenario& s, const ClusterParams& p, const Checkpoint& base,
                     const Checkpoint& target, std::mt19937& rng);
// Runs `s` `repeats` times, each on a fresh cluster, keeps the run with the median
// seconds and prints it.
RunResult RunMedian(const Scenario& s, const ClusterParams& p, const Checkpoint& base,
                    const Checkpoint& target, double rate, int repeats, std::mt19937& rng);

// The least time the links allow for `r`'s delta.
double UplinkLowerBound(const RunResult& r, double link);
void PrintRun(const RunResult& r, double link);

[[noreturn]] void Die(const std::string& what);

}  // namespace deltacast::bench::fanout

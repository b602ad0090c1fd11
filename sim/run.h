// One simulated run: a source and N nodes in this process on an EventQueue, over a
// SimNetwork, with their stores, spools, journals and decision log in real files
// under a temporary directory of the run. The scenario's workload is published
// under its faults; then the faults stop, everything is healed and restarted, and a
// last publish must commit everywhere. Checkers run after every publish and at the
// end (checkers.md lists them).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "sim/engine_model.h"
#include "sim/scenario.h"
#include "sim/sim_network.h"

namespace deltacast::sim {

struct RunOptions {
  std::set<size_t> drop_faults;  // indices into Scenario::faults left out (shrinking)
  bool engine_log = false;       // the engine's own log lines to stderr
  bool engine_debug = false;     // ... its debug lines too
  std::filesystem::path dir;     // where the run's files go; empty: a temporary one
  // Checker self-test: flips one byte of n1's store file behind the engine's back
  // once the workload is done; the run must then fail the bit-exact check.
  bool sabotage = false;
  // Disk checker self-test: the source's power losses also lose its decision log, as
  // a disk that broke its promise would; the run must then fail the durability check.
  bool sabotage_disk = false;
  // Snapshot checker self-test: flips one byte of n1's current snapshot (n1 must be a
  // snapshot node) once the workload is done; the run must fail the disk check.
  bool sabotage_snapshot = false;
};

struct RunResult {
  std::vector<std::string> failures;  // empty: every checker passed
  bool ok() const { return failures.empty(); }
  uint64_t trace_hash = 0;
  uint64_t tasks = 0;
  double sim_seconds = 0;
  int publishes = 0;                           // attempted, liveness ones included
  int committed = 0;                           // versions the source committed
  int node_refits = 0;                         // versions committed on nodes (each node counted)
  std::array<uint64_t, kFaultKinds> faults{};  // injected, per kind
  uint64_t power_losses = 0;                   // kills that were power losses
  uint64_t enospc_writes = 0;                  // writes a full disk refused
  uint64_t trainer_faults = 0;                 // publishes with a trainer fault
  uint64_t trainer_refused = 0;                // refits the root refused before sending
  NetworkCounts net;
  uint64_t chunk_bytes = 0, resent_bytes = 0;
  uint64_t peak_held_bytes = 0;
  size_t peak_pending_tasks = 0;
  // Staged apply and engines (issue 28): nodes of each kind, the engines' hooks
  // summed over the nodes, crash points reached, and the pause the nodes reported.
  int staged_nodes = 0, engine_nodes = 0;
  EngineCounts engine;
  uint64_t crashes = 0;
  // --restream: publishes streamed again after their source was killed mid-stream,
  // and the nodes that rolled back what they held of the lost stream first.
  uint64_t restreams = 0, stream_rollbacks = 0;
  double pause_seconds = 0;
  // Snapshot stores (relay/store/snapshot_store.h): nodes with one, the snapshots they
  // built and switched to (catch-ups' included), the bytes those wrote, and the
  // partitions they repaired from the tree while applying (counted, not judged).
  struct SnapshotCounts {
    int nodes = 0;
    uint64_t built = 0, bytes_written = 0, repaired = 0;
    uint64_t killed_building = 0;  // kills (crash points included) that found a build running
  } snapshots;
  // --coord: sources lost per stage (SourceLossStage), store faults, and the records
  // that stood at the end (the coordinator's ABORTs among them).
  struct CoordCounts {
    std::array<uint64_t, kSourceLossStages> sources_lost{};
    uint64_t store_down = 0, answers_lost = 0, answer_lost_then_down = 0;
    uint64_t commit_records = 0, abort_records = 0, coordinator_aborts = 0;
    uint64_t unknown_outcomes = 0;  // publishes that ended with the outcome unknown
    // Deltas nodes held from before a restart, settled from the record (no parent
    // decided them within the source timeout).
    uint64_t held_settled_from_record = 0;
  } coord;
  // --stripes: S, the stripe faults injected per kind (StripeFaultKind), what the
  // checkers looked at, and each process's upload: the CHUNK bytes it sent down stripe
  // links ([0] the source, [i] n<i>), against one copy of every refit the source
  // streamed (delta_bytes: each of its chunks counted once).
  struct StripeCounts {
    int stripes = 0;
    std::array<uint64_t, kStripeFaultKinds> faults{};
    uint64_t chunks_checked = 0, prepared_checked = 0;
    std::vector<uint64_t> upload_bytes;
    uint64_t delta_bytes = 0;
  } stripes;
  std::vector<std::string> trace;  // readable: the run's own events
};

RunResult RunScenario(const Scenario& scenario, const RunOptions& options = {});

}  // namespace deltacast::sim

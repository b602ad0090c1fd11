// Scenario: everything a simulated run does, drawn from its seed before it starts:
// the tree, the commit policy, the workload (how many publishes, how much each
// changes) and the faults with their simulated times. A schedule can be replayed
// with some of its faults left out (shrinking).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace deltacast::sim {

enum class FaultKind {
  kReset,       // every link between two processes breaks
  kStall,       // links between two processes send nothing for a while
  kPartition,   // two processes cannot reach each other for a while
  kLoss,        // segment loss (retransmission delays) on every link for a while
  kKillNode,    // a node's process dies; it restarts later from its disk
  kKillSource,  // the source's process dies (mid-publish or not); it restarts later
  kLateJoin,    // a node that was never started starts (a late joiner)
  kFullDisk,    // a process's disk refuses writes (ENOSPC) for a while
  kOutage,      // a node's process dies and stays away longer than the commit timeout
  kCrashAt,     // a node dies the next time it passes a crash point (kCrashPoints)
};
inline constexpr int kFaultKinds = 10;
// The places a kCrashAt fault kills a node (common/crash_point.h; docs/recovery.md):
// between PREPARED and the decision, as the COMMIT comes, inside a staged commit's
// apply (before its first write, between chunks), right after the commit, and as a
// staged chunk is held.
inline constexpr const char* kCrashPoints[] = {"agent.prepared",           "agent.commit",
                                               "agent.staged_apply_begin", "agent.staged_apply",
                                               "agent.committed",          "agent.staged"};
inline constexpr int kCrashPointCount = 6;
const char* FaultName(FaultKind kind);

struct Fault {
  int publish = 0;  // during which publish of the workload
  double at = 0;    // simulated seconds after that publish starts
  FaultKind kind{};
  int a = 0, b = 0;    // processes: 0 = source, i = node n<i>
  double seconds = 0;  // how long it lasts (kill: until the restart)
  bool power = false;  // a kill: the machine loses power (unsynced writes are lost)
  int point = 0;       // kCrashAt: index into kCrashPoints
};

// How a node applies a delta, and the inference engine serving from its weights
// (issue 28; the run models it: sim/run.cc, "Engines").
struct NodeEngine {
  bool staged = false;        // [[node]] apply = "staged"
  bool engine = false;        // an engine that is paused around every write (EngineHooks)
  bool small_memory = false;  // staged_memory of 24 KiB: the commit reads chunks back
};

// A trainer's mistake in one publish of a run with producers (sim/trainer.h).
enum class TrainerFaultKind { kNone, kStaleBase, kCorruptBase, kOverlap };
const char* TrainerFaultName(TrainerFaultKind kind);
struct TrainerFault {
  TrainerFaultKind kind = TrainerFaultKind::kNone;
  int rank = 1;  // the trainer rank at fault (1..3)
};

struct Scenario {
  uint64_t seed = 0;
  int nodes = 3;
  int fanout = 2;
  bool policy_available = false;
  size_t keep_deltas = 4;
  int write_back_ms = 0;
  int publishes = 6;                 // under faults, before the liveness check
  std::vector<double> change_rates;  // per publish, fraction of elements changed
  std::vector<double> gaps;          // simulated seconds before each publish
  std::set<int> late;                // nodes that start only at their kLateJoin
  std::vector<Fault> faults;         // by time
  // The delta comes from this many producers through the root's checks and merge
  // (0: the single-checkpoint source), with a trainer fault per publish.
  int producers = 0;
  std::vector<TrainerFault> trainer_faults;
  // Per node ([i] for n<i>; [0] unused): apply mode and engine. An engine's pause
  // hook fails with `hook_fail`, or returns only after its timeout with `hook_hang`.
  std::vector<NodeEngine> engines;
  double hook_fail = 0, hook_hang = 0;
  std::string Describe() const;
};

// Draws a scenario from `seed`. `intensity` scales the number of faults (0: none).
// With `disk` false no kill is a power loss, no disk fills and no outage is drawn
// (the schedules the simulator drew before it simulated the disk: the same seed
// gives the same faults). With `outages` false no outage is drawn (the schedules
// from before outages: every other fault of a seed is the same either way).
// With `producers`, the delta comes from producers and about one publish in four has
// a trainer fault; those are drawn from a generator of their own, so the rest of
// the schedule is the seed's as without. With `staged` (deltacast_sim's default),
// each node applies on arrival or staged, with or without an engine, and kCrashAt
// faults are added; drawn from a generator of their own too, so `staged` false gives
// the schedules of before (the seeds kept as tests were found so).
Scenario DrawScenario(uint64_t seed, double intensity = 1.0, bool disk = true, bool outages = true,
                      bool producers = false, bool staged = false);

}  // namespace deltacast::sim

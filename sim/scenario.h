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
// staged chunk is held. Then a snapshot store's (relay/store/snapshot_store.h): the
// committed delta kept in the chain before `active`; inside a build (the chain
// applied in memory, between the blocks it writes, the folder sealed, renamed);
// right after the switch (the pointer rewritten) and after the chain is trimmed.
inline constexpr const char* kCrashPoints[] = {
    "agent.prepared",     "agent.commit",     "agent.staged_apply_begin",
    "agent.staged_apply", "agent.committed",  "agent.staged",
    "snapshot.kept",      "snapshot.applied", "snapshot.copy_block",
    "snapshot.flushed",   "snapshot.renamed", "snapshot.switched",
    "snapshot.dropped"};
// The first ones, which the staged draw picks from (its schedules stay as they were).
inline constexpr int kCrashPointCount = 6;
// The ones the snapshot draw picks from for a snapshot node: the refit's points any
// node passes (not the staged ones), then the snapshot store's.
inline constexpr int kSnapshotCrashPoints[] = {0, 1, 4, 6, 7, 8, 8, 8, 9, 10, 11, 12};
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

// A node whose checkpoint is a snapshot store ([[node]] checkpoint = "snapshot";
// relay/store/snapshot_store.h), with a policy that builds and switches snapshots often.
struct NodeSnapshots {
  bool on = false;
  uint32_t every = 0;          // snapshot_every: refits in the chain
  uint32_t chain_percent = 0;  // snapshot_chain_percent: of the model
  uint64_t rate = 0;           // snapshot_rate: bytes per second a build writes
};

// A trainer's mistake in one publish of a run with producers (sim/trainer.h).
enum class TrainerFaultKind { kNone, kStaleBase, kCorruptBase, kOverlap };
const char* TrainerFaultName(TrainerFaultKind kind);
struct TrainerFault {
  TrainerFaultKind kind = TrainerFaultKind::kNone;
  int rank = 1;  // the trainer rank at fault (1..3)
};

// deltacast_sim --coord (issue 32; docs/simulation.md, "The commit record"): the
// commit record store (InMemoryCommitRecords on simulated time), a standby
// coordinator, and these faults, drawn from a generator of their own after the rest
// of the scenario (so without --coord every seed replays as before).
enum class CoordFaultKind {
  kLoseSource,   // the source's machine is lost: killed and its state directory deleted
  kStoreDown,    // the store answers nothing (kUnavailable) for a while
  kAnswersLost,  // the store writes but its answers to Decide are lost (kTimeout) for a while
  // The store takes the next decision, loses its answer and is then unreachable for
  // longer than the commit timeout: the source cannot learn its outcome in time.
  kAnswerLostThenDown,
};
// When a kLoseSource fault strikes its publish: early in it (no node PREPARED yet, as a
// rule), midway (some), at the crash point after every node PREPARED and before the
// decision, or at the one after the record was written and before any COMMIT was sent.
enum class SourceLossStage { kEarly, kMidway, kAllPrepared, kRecordWritten };
inline constexpr int kSourceLossStages = 4;
const char* SourceLossStageName(SourceLossStage stage);
struct CoordFault {
  int publish = 0;
  double at = 0;  // simulated seconds after that publish starts (kEarly, kMidway, store faults)
  CoordFaultKind kind{};
  SourceLossStage stage{};
  double seconds = 0;  // a store fault: how long; a lost source: until its restart
};
struct Coordination {
  bool on = false;
  std::vector<CoordFault> faults;
};

// deltacast_sim --stripes (issue 31; docs/simulation.md, "Striped trees"): the run's
// config has [tree] stripes = S (2..4, at most the node count), and these faults,
// drawn from a generator of their own after the rest of the scenario (so without
// --stripes every seed replays as before, and every other fault keeps its --drop
// index).
enum class StripeFaultKind {
  kCutLink,    // the link between a node and its parent in one stripe is cut for a while
  kResetLink,  // ... breaks once
  kStallLink,  // ... sends nothing for a while
  // A node interior in one stripe and a leaf in another is killed mid-refit.
  kKillMixedNode,
};
inline constexpr int kStripeFaultKinds = 4;
const char* StripeFaultName(StripeFaultKind kind);
struct StripeFault {
  int publish = 0;
  double at = 0;  // simulated seconds after that publish starts
  StripeFaultKind kind{};
  int node = 0;        // the child of the link, or the node killed
  int stripe = 0;      // the link's stripe
  double seconds = 0;  // how long (a kill: until the restart)
  bool power = false;  // a kill: a power loss
};
struct Striping {
  int stripes = 0;  // 0: not striped (one tree)
  std::vector<StripeFault> faults;
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
  // deltacast_sim --restream (not drawn: a mode, like --producers): every publish
  // under faults has its source killed after streaming its data chunks, before END
  // (the nodes hold part of the delta), and the restarted source publishes the
  // same delta again, its data chunks in another (seeded) order and numbered anew,
  // as a root restarted mid-refit does (docs/protocol.md, "Chunk identity").
  // Single-checkpoint source only.
  bool restream = false;
  // Per node ([i] for n<i>; [0] unused): apply mode and engine. An engine's pause
  // hook fails with `hook_fail`, or returns only after its timeout with `hook_hang`.
  std::vector<NodeEngine> engines;
  double hook_fail = 0, hook_hang = 0;
  // Per node ([i] for n<i>; [0] unused): a snapshot store, or in place.
  std::vector<NodeSnapshots> snapshots;
  // --coord: the commit record store, the coordinator and their faults.
  Coordination coordination;
  // --stripes: the stripe count and the stripe faults.
  Striping striping;
  std::string Describe() const;
};

// --coord: turns the commit record store on for `s` and draws its faults from a
// generator of its own (every other part of the scenario stays as drawn): about one
// publish in two loses its source at one of the four stages, and some publishes see
// the store down or its answers lost.
void DrawCoordination(Scenario& s);

// --stripes: draws S (2..4, at most the node count) and the stripe faults for `s`
// from a generator of their own, scaled by `intensity` (0: none).
void DrawStriping(Scenario& s, double intensity);
// The nodes interior in one stripe's tree and a leaf in another's, for `s`'s config
// (run_stripes.cc plans it); kills of them are drawn from these.
std::vector<int> MixedStripeNodes(const Scenario& s);

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
// With `snapshots` (deltacast_sim's default), some nodes without an engine keep
// their checkpoint as a snapshot store, and kCrashAt and kill faults aimed at them
// are added (listed after the others, so every other fault keeps its index for
// --drop); drawn from a generator of their own too.
Scenario DrawScenario(uint64_t seed, double intensity = 1.0, bool disk = true, bool outages = true,
                      bool producers = false, bool staged = false, bool snapshots = false);

}  // namespace deltacast::sim

// The simulator's run (run.h), split by job: run.cc sets up, starts and publishes;
// run_faults.cc injects faults and kills; run_checks.cc holds the checkers.
// Internal to sim/.
#pragma once

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <optional>
#include <string_view>

#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "apply/safetensors.h"
#include "codec/manifest.h"
#include "common/crash_point.h"
#include "common/file_util.h"
#include "common/log.h"
#include "relay/store/snapshot_store.h"
#include "relay/tree/commit_record_memory.h"
#include "relay/tree/coordinator.h"
#include "relay/tree/decision_log.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "sim/engine_model.h"
#include "sim/run.h"
#include "sim/sim_disk.h"
#include "sim/trainer.h"
#include "topology/cluster_config.h"

namespace deltacast::sim::internal {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using Tensors = std::vector<Bytes>;

inline constexpr char kToken[] = "sim-token";
inline constexpr uint64_t kPartitionBytes = 8 << 10;
inline constexpr uint64_t kElements = 1 << 15;  // per BF16 tensor: 64 KiB, 8 partitions
inline constexpr int kWindow = 4;
inline constexpr uint64_t kChunkBytes = 16 << 10;
// Once the faults stop and everything is back: how long the tree may take to settle,
// and how long the next publish may take to commit everywhere.
inline constexpr auto kSettle = std::chrono::seconds(8);
inline constexpr double kLivenessSeconds = 30;
// A publish that starts with every process up and no fault acting, and sees none,
// must finish within this (policy `all` waits 3 s for a late joiner; every timeout of
// the tree is shorter than this).
inline constexpr double kStallSeconds = 10;
inline constexpr auto kRecovery = std::chrono::seconds(8);
// A publish that a fault disturbed must finish within this once the last fault acting
// on it has ended (a partition healed, a killed process restarted): time to notice
// (the idle timeout, 4 s), to reconnect (backoff up to 2 s) and to finish the refit.
// The tree's own bounds on waiting for an away child (the connect timeout, 3 s) fit in
// it; a wait for the commit timeout (20 s) does not.
inline constexpr double kLostSeconds = 10;
// How long a node waits for its engine's pause hook (EngineHooks::timeout).
inline constexpr auto kHookTimeout = std::chrono::milliseconds(1000);
// How much a snapshot build writes per step: the model's ~200 KiB in a dozen steps.
inline constexpr uint64_t kSnapshotBlockBytes = 16 << 10;
// --coord: the announcement's time to live (a node reads the record after as long
// without a decision) and how often the nodes and the coordinator read the store.
inline constexpr auto kSourceTimeout = std::chrono::milliseconds(1500);
inline constexpr auto kRecordPoll = std::chrono::milliseconds(250);

std::vector<TensorSpec> Table();
std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers);
codec::Manifest ManifestOf(const Tensors& t);
std::string ConfigToml(const Scenario& s);
std::string Name(int process);

class Run {
 public:
  Run(const Scenario& s, const RunOptions& o)
      : s_(s),
        o_(o),
        q_(s.seed),
        net_(q_),
        disk_(s.seed),
        driver_(q_.OpenQueue("driver")),
        work_rng_(s.seed) {}

  RunResult Go();

 private:
  struct Node {
    int i = 0;
    fs::path dir;
    std::unique_ptr<relay::NodeAgent> agent;
    bool joined = false;  // started at least once (late joiners start later)
    int last_commit = 0;  // lineage index of the last version it committed
    bool restart_pending = false;
    // Restarted after a power loss that left its last commit's writes unflushed: its
    // bytes are torn until the recovery finishes (stats().stores_recovered).
    bool reconciling = false;
    std::unique_ptr<EngineModel> engine;  // the inference engine serving from it, if any
    bool dying = false;                   // killed at a crash point; the kill unwinds first
    // A snapshot store's (relay/store/snapshot_store.h), while the agent runs: the store,
    // and the weights it serves (in memory: its files hold the snapshot, not the
    // version), owned by the agent's replica.
    std::shared_ptr<relay::SnapshotStore> snapshots;
    const apply::WeightStore* live = nullptr;
  };

  void Fail(const std::string& why_in) {
    const std::string why = Scrub(why_in);
    q_.Note("CHECK FAILED: " + why);
    r_.failures.push_back(why);
  }
  // An engine message for the trace: the run's directory (its name holds the pid)
  // written as $RUN, so that the trace replays in another process too.
  std::string Scrub(std::string text) const {
    const std::string dir = dir_.string();
    for (size_t at = 0; !dir.empty() && (at = text.find(dir, at)) != std::string::npos;)
      text.replace(at, dir.size(), "$RUN");
    return text;
  }
  std::optional<int> IndexOf(const Digest128& v) const {
    auto it = index_.find(v);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }
  bool LoggedCommit(const Digest128& v) const {
    if (records_) return RecordedCommit(v);  // --coord: the record decides, the log caches
    auto d = relay::RecordedDecision(decision_log_, v);
    return d && d->commit;
  }
  // --coord (run_coord.cc): a COMMIT record of the cluster to `v` stands.
  bool RecordedCommit(const Digest128& v) const;

  void Setup();
  bool IsSnapshotNode(int i) const {
    return i < static_cast<int>(s_.snapshots.size()) && s_.snapshots[i].on;
  }
  // The node's checkpoint opened as its config says (a snapshot store or in place).
  Result<relay::SnapshotStore::Opened> OpenStore(const Node& n);
  void StartNode(Node& n);
  void StopNode(Node& n, const char* why);
  void StartSource();
  void OnCommit(int i, const relay::CommitEvent& e);
  void Inject(size_t index, const Fault& f);
  fs::path DirOf(int process) const { return process == 0 ? dir_ / "src" : nodes_[process].dir; }
  void LosePower(int process);
  void CheckDiskNotCut(int process);
  // A node dies where it stands (a kCrashAt fault reached, or killed while a task of its
  // waits on the stack): its disk is cut now, its tasks never run again, and it is
  // stopped once the stack has unwound.
  void KillInPlace(int i, bool power, double restart_seconds, const std::string& why);
  void FinishKill(int i, bool power, double restart_seconds, std::string why);
  static void OnCrashPoint(std::string_view name, void* run);
  struct ArmedCrash {
    size_t index;
    Fault fault;
  };
  std::vector<ArmedCrash> armed_;  // kCrashAt faults waiting for their point
  void ScheduleFaults(int publish);
  // --coord (run_coord.cc): the store and the coordinator, their faults, the source's
  // machine lost (killed, its state directory gone), and the record's checkers.
  void SetupCoordination();
  void ScheduleCoordFaults(int publish);
  void InjectCoord(const CoordFault& f);
  void LoseSource(const CoordFault& f);
  void WipeSource();
  void OnSourceCrashPoint(std::string_view name);
  // A child of the source killed and restarted while the source is away for long
  // (past the coordinator's ABORT): it holds the delta in flight with no parent to
  // decide it, and settles it from the record.
  void KillSourceChildWhileLost(const CoordFault& f);
  void OnOutcome(int i, uint64_t refit_id, const Digest128& target, bool committed);
  void CoordFinalChecks();
  // --stripes (run_stripes.cc): the stripe faults and the checkers on stripe links.
  struct StripeWatch;
  void SetupStripes();
  void ScheduleStripeFaults(int publish);
  void InjectStripe(size_t index, const StripeFault& f);
  void ObserveLink(const LinkEvent& e);
  void StripeFinalChecks();
  std::shared_ptr<StripeWatch> watch_;  // null without --stripes
  // `index`: the publish's place in the workload (-1: the liveness publish).
  void Publish(int index, double rate, bool liveness);
  Tensors Mutate(const Tensors& base, double rate);
  // --restream (run_restream.cc): base -> target as the source's encoder makes it,
  // the data chunks in a seeded order and renumbered when `renumber`; with
  // `kill_before_end` the source dies (Killed) once the data chunks are sent and
  // the nodes have had time to apply them, before the END.
  relay::Source::DeltaStream RestreamStream(const Tensors& base, const Tensors& target,
                                            bool renumber, bool kill_before_end);
  void CheckBytes(const Node& n, const Digest128& version, const char* when);
  // Tensor by tensor (by name), `tensor(name)`'s bytes against `version`'s.
  void CheckTensors(int i, const Digest128& version, const char* when,
                    const std::function<std::optional<ByteSpan>(const std::string&)>& tensor);
  // A snapshot node's committed version as its disk rebuilds it (snapshot + chain).
  void CheckSnapshotDisk(const Node& n, const Digest128& version, const char* when);
  // Whether the node's store holds exactly one version the run published.
  bool StoreIsAVersion(const Node& n);
  void HealAndRestart();
  void CheckTimeLost(EventQueue::TimePoint started, bool disturbed);
  void Sabotage();
  void FinalChecks();

  const Scenario s_;
  const RunOptions o_;
  EventQueue q_;
  SimNetwork net_;
  SimDisk disk_;
  const uint64_t driver_;
  std::mt19937_64 work_rng_;
  fs::path dir_;
  bool own_dir_ = false;
  fs::path decision_log_;
  topology::ClusterConfig config_;
  std::vector<Node> nodes_;  // [0] unused: node i is nodes_[i]
  std::unique_ptr<relay::Source> source_;
  std::unique_ptr<SimTrainer> trainer_;  // with producers
  bool source_restart_pending_ = false;
  bool source_power_loss_ = false;  // the source is being killed by a power loss
  bool faults_on_ = true;
  std::map<Digest128, Tensors> versions_;
  std::vector<Digest128> lineage_;  // committed versions, in order; [0] the start
  std::map<Digest128, int> index_;
  std::optional<Digest128> pending_;  // the target being published
  // --restream: the delta (base, target) whose stream the source was killed in, to
  // publish again.
  std::optional<std::pair<Digest128, Digest128>> restream_;
  // --coord: the store (null without --coord), the standby coordinator, a source loss
  // armed for a crash point of the source, the source being lost (its state goes
  // once its Publish has unwound), and which store fault is the latest.
  std::shared_ptr<relay::InMemoryCommitRecords> records_;
  std::unique_ptr<relay::StandbyCoordinator> coordinator_;
  std::optional<CoordFault> armed_loss_;
  bool source_lost_ = false;
  uint64_t store_fault_gen_ = 0;
  // Faults that began to act so far: injected, a crash point reached, a pause hook
  // that failed or hung (a publish that saw one is checked for time lost, not stalls).
  uint64_t faults_begun_ = 0;
  EventQueue::TimePoint quiet_from_{};  // no fault acts on the tree from then on
  // The latest end of a fault so far: a link healed, a killed process restarted.
  EventQueue::TimePoint disturbed_until_{};
  RunResult r_;
};

}  // namespace deltacast::sim::internal

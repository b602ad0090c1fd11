#include "sim/run.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <map>
#include <optional>

#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "apply/safetensors.h"
#include "codec/manifest.h"
#include "common/crash_point.h"
#include "common/file_util.h"
#include "common/log.h"
#include "relay/decision_log.h"
#include "relay/node_agent.h"
#include "relay/source.h"
#include "sim/engine_model.h"
#include "sim/sim_disk.h"
#include "sim/trainer.h"
#include "topology/cluster_config.h"

namespace deltacast::sim {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;
using Tensors = std::vector<Bytes>;

constexpr char kToken[] = "sim-token";
constexpr uint64_t kPartitionBytes = 8 << 10;
constexpr uint64_t kElements = 1 << 15;  // per BF16 tensor: 64 KiB, 8 partitions
constexpr int kWindow = 4;
constexpr uint64_t kChunkBytes = 16 << 10;
// Once the faults stop and everything is back: how long the tree may take to settle,
// and how long the next publish may take to commit everywhere.
constexpr auto kSettle = std::chrono::seconds(8);
constexpr double kLivenessSeconds = 30;
// A publish that starts with every process up and no fault acting, and sees none,
// must finish within this (policy `all` waits 3 s for a late joiner; every timeout of
// the tree is shorter than this).
constexpr double kStallSeconds = 10;
constexpr auto kRecovery = std::chrono::seconds(8);
// A publish that a fault disturbed must finish within this once the last fault acting
// on it has ended (a partition healed, a killed process restarted): time to notice
// (the idle timeout, 4 s), to reconnect (backoff up to 2 s) and to finish the refit.
// The tree's own bounds on waiting for an away child (the connect timeout, 3 s) fit in
// it; a wait for the commit timeout (20 s) does not.
constexpr double kLostSeconds = 10;
// How long a node waits for its engine's pause hook (EngineHooks::timeout).
constexpr auto kHookTimeout = std::chrono::milliseconds(1000);

std::vector<codec::TensorInfo> Table() {
  std::vector<codec::TensorInfo> t;
  for (int i = 0; i < 3; ++i)
    t.push_back({"layer" + std::to_string(i) + ".weight", DType::kBF16, {kElements}});
  t.push_back({"norm.weight", DType::kF32, {64}});
  return t;
}

std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers) {
  const auto tensors = Table();
  std::vector<std::pair<codec::TensorInfo, MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], MutableByteSpan(buffers[i]));
  return std::move(*apply::HostStore::Borrow(std::move(spans)));
}

codec::Manifest ManifestOf(const Tensors& t) {
  return codec::ComputeManifest(
      Table(), [&](size_t i) { return ByteSpan(t[i]); }, kPartitionBytes, 1);
}

std::string ConfigToml(const Scenario& s) {
  std::string toml = fmt::format(
      "[cluster]\nname = \"sim\"\n\n[tree]\nfanout = {}\nchunk_size = \"16KiB\"\nwindow = {}\n"
      "connect_timeout = \"3s\"\nidle_timeout = \"4s\"\ncommit_timeout = \"20s\"\n"
      "commit_policy = \"{}\"\n\n[[node]]\nid = \"src\"\nhost = \"sim\"\nport = 1\n"
      "region = \"r\"\nrole = \"source\"\n",
      s.fanout, kWindow, s.policy_available ? "available" : "all");
  for (int i = 1; i <= s.nodes; ++i) {
    toml += fmt::format(
        "\n[[node]]\nid = \"n{}\"\nhost = \"sim\"\nport = {}\nregion = \"r\"\nrole = "
        "\"receiver\"\n",
        i, 1 + 3 * i);
    const NodeEngine e = i < static_cast<int>(s.engines.size()) ? s.engines[i] : NodeEngine{};
    if (e.staged) toml += "apply = \"staged\"\n";
    if (e.small_memory) toml += "staged_memory = \"24KiB\"\n";
  }
  return toml;
}

std::string Name(int process) { return process == 0 ? "src" : "n" + std::to_string(process); }

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
    auto d = relay::RecordedDecision(decision_log_, v);
    return d && d->commit;
  }

  void Setup();
  void StartNode(Node& n);
  void StopNode(Node& n, const char* why);
  void StartSource();
  void OnCommit(int i, const relay::CommitEvent& e);
  void Inject(size_t index, const Fault& f);
  fs::path DirOf(int process) const { return process == 0 ? dir_ / "src" : nodes_[process].dir; }
  void LosePower(int process);
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
  // `index`: the publish's place in the workload (-1: the liveness publish).
  void Publish(int index, double rate, bool liveness);
  Tensors Mutate(const Tensors& base, double rate);
  void CheckBytes(const Node& n, const Digest128& version, const char* when);
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
  std::optional<Digest128> pending_;    // the target being published
  uint64_t injected_ = 0;               // faults injected so far
  EventQueue::TimePoint quiet_from_{};  // no fault acts on the tree from then on
  // The latest end of a fault so far: a link healed, a killed process restarted.
  EventQueue::TimePoint disturbed_until_{};
  RunResult r_;
};

void Run::Setup() {
  if (o_.dir.empty()) {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           fmt::format("deltacast-sim-{}-{}-{}", ::getpid(), s_.seed, counter++);
    own_dir_ = true;
  } else {
    dir_ = o_.dir;
  }
  fs::remove_all(dir_);
  fs::create_directories(dir_ / "src");
  decision_log_ = dir_ / "src" / "decisions.log";
  auto config = topology::ParseClusterConfig(ConfigToml(s_), "sim.toml");
  if (!config.ok()) throw std::runtime_error(config.status().ToString());
  config_ = *config;

  Tensors v0;
  for (const auto& t : Table()) {
    Bytes b(t.ElementCount() * ElementSize(t.dtype));
    for (auto& x : b) x = std::byte(work_rng_());
    v0.push_back(std::move(b));
  }
  const Digest128 id0 = ManifestOf(v0).VersionId();
  versions_[id0] = v0;
  lineage_.push_back(id0);
  index_[id0] = 0;

  nodes_.resize(s_.nodes + 1);
  for (int i = 1; i <= s_.nodes; ++i) {
    Node& n = nodes_[i];
    n.i = i;
    n.dir = dir_ / Name(i);
    fs::create_directories(n.dir);
    auto writer = apply::SafetensorsWriter::Create(n.dir / "model.safetensors", Table());
    if (!writer.ok()) throw std::runtime_error(writer.status().ToString());
    for (const Bytes& t : v0) (void)(*writer)->Append(t);
    if (Status st = (*writer)->Finish(); !st.ok()) throw std::runtime_error(st.ToString());
  }
  for (int i = 1; i <= s_.nodes; ++i) {
    if (i >= static_cast<int>(s_.engines.size()) || !s_.engines[i].engine) continue;
    nodes_[i].engine = std::make_unique<EngineModel>(
        q_, Name(i), nodes_[i].dir / "model.safetensors", s_.seed * 0x9FB21C651E98DF25ull + i,
        s_.hook_fail, s_.hook_hang, kHookTimeout, [this](const std::string& why) { Fail(why); },
        [this, i] { return StoreIsAVersion(nodes_[i]); });
  }
  for (int p = 0; p <= s_.nodes; ++p) disk_.Adopt(DirOf(p));
  if (s_.producers > 0)
    trainer_ = std::make_unique<SimTrainer>(Table(), kPartitionBytes, kChunkBytes);
}

void Run::StartNode(Node& n) {
  n.restart_pending = false;
  if (n.agent) return;
  auto replica = apply::Replica::OpenCheckpointDir(n.dir, kPartitionBytes, 1);
  if (!replica.ok()) {
    Fail(Name(n.i) + " cannot reopen its store: " + replica.status().ToString());
    return;
  }
  const Digest128 v = (*replica)->version();
  n.reconciling = (*replica)->needs_reconcile();
  const auto idx = IndexOf(v);
  if (!idx) {
    // Maybe the version being published right now, committed before the kill.
    if (!(pending_ && *pending_ == v && LoggedCommit(v))) {
      Fail(Name(n.i) + " restarted at version " + v.ShortHex() + ", which was never committed");
    }
  } else if (*idx < n.last_commit) {
    Fail(
        fmt::format("{} restarted at version #{} after committing #{}: a committed version "
                    "was lost",
                    Name(n.i), *idx, n.last_commit));
  }
  relay::NodeAgentOptions options;
  options.config = config_;
  options.node_id = Name(n.i);
  options.token = kToken;
  options.apply_threads = 1;
  options.spool_dir = n.dir / apply::kStateDirName / "spool";
  options.write_back_delay = std::chrono::milliseconds(s_.write_back_ms);
  options.on_commit = [this, i = n.i](const relay::CommitEvent& e) { OnCommit(i, e); };
  if (n.engine) {
    n.engine->Started();
    options.engine_hooks = n.engine->Hooks();
  }
  // Every queue the node opens is its own: it can be killed while one waits.
  q_.set_opening_owner(n.i);
  auto agent = relay::NodeAgent::Start(std::move(options), std::move(*replica),
                                       net_.MakeTransport(Name(n.i)));
  q_.set_opening_owner(-1);
  if (!agent.ok()) {
    Fail(Name(n.i) + " cannot start: " + agent.status().ToString());
    return;
  }
  n.agent = std::move(*agent);
  n.joined = true;
  disturbed_until_ = std::max(disturbed_until_, q_.Now());
  q_.Note(fmt::format("start {} at version {}", Name(n.i), v.ShortHex()));
}

void Run::StopNode(Node& n, const char* why) {
  if (!n.agent) return;
  const relay::NodeAgentStats st = n.agent->stats();
  r_.chunk_bytes += st.chunk_bytes_received;
  r_.resent_bytes += st.chunk_bytes_resent;
  r_.peak_held_bytes = std::max(r_.peak_held_bytes, st.peak_held_bytes);
  r_.pause_seconds += st.pause_seconds_total;
  if (n.engine) n.engine->Died();
  n.agent->Stop();
  n.agent.reset();
  q_.Note(fmt::format("{} {}", why, Name(n.i)));
}

void Run::StartSource() {
  source_restart_pending_ = false;
  if (source_) return;
  relay::PublishOptions options;
  options.config = config_;
  options.token = kToken;
  options.encode_threads = 1;
  options.decision_log = decision_log_;
  options.spool_dir = dir_ / "src" / "spool";
  options.history_dir = dir_ / "src" / "history";
  options.keep_deltas = s_.keep_deltas;
  q_.set_opening_owner(0);
  auto source = relay::Source::Start(std::move(options), net_.MakeTransport("src"));
  q_.set_opening_owner(-1);
  if (!source.ok()) {
    Fail("source cannot start: " + source.status().ToString());
    return;
  }
  source_ = std::move(*source);
  disturbed_until_ = std::max(disturbed_until_, q_.Now());
  q_.Note("start src");
}

// On the node's apply queue, right after its replica committed.
void Run::OnCommit(int i, const relay::CommitEvent& e) {
  Node& n = nodes_[i];
  ++r_.node_refits;
  if (!LoggedCommit(e.version)) {
    Fail(fmt::format("{} committed version {}, for which the source logged no COMMIT", Name(i),
                     e.version.ShortHex()));
    return;
  }
  int idx = 0;
  if (auto known = IndexOf(e.version)) {
    idx = *known;
  } else if (pending_ && *pending_ == e.version) {
    idx = static_cast<int>(lineage_.size());
  } else {
    Fail(Name(i) + " committed a version outside the lineage: " + e.version.ShortHex());
    return;
  }
  if (idx < n.last_commit) {
    Fail(fmt::format("{} committed version #{} after #{}: went back", Name(i), idx, n.last_commit));
  }
  n.last_commit = idx;
  if (n.engine) n.engine->OnRefitCommit();
  q_.Note(fmt::format("{} committed #{} ({})", Name(i), idx, e.version.ShortHex()));
}

Tensors Run::Mutate(const Tensors& base, double rate) {
  Tensors t = base;
  std::uniform_real_distribution<double> u(0, 1);
  bool any = false;
  for (size_t k = 0; k + 1 < t.size(); ++k) {  // the BF16 tensors; the norm stays
    for (uint64_t e = 0; e < kElements; ++e) {
      if (u(work_rng_) >= rate) continue;
      any = true;
      // Mostly the last mantissa bit, sometimes more, rarely the sign.
      const uint64_t r = work_rng_() % 100;
      if (r < 85)
        t[k][2 * e] ^= std::byte{1};
      else if (r < 99)
        t[k][2 * e] ^= std::byte(1 + work_rng_() % 15);
      else
        t[k][2 * e + 1] ^= std::byte{0x80};
    }
  }
  if (!any) t[0][0] ^= std::byte{1};
  return t;
}

void Run::CheckBytes(const Node& n, const Digest128& version, const char* when) {
  const fs::path file = n.dir / "model.safetensors";
  auto header = apply::ReadSafetensorsHeader(file);
  auto bytes = ReadFile(file, uint64_t{1} << 30);
  if (!header.ok() || !bytes.ok()) {
    Fail(fmt::format("{} ({}): cannot read its store", Name(n.i), when));
    return;
  }
  const Tensors& want = versions_.at(version);
  const auto table = Table();
  for (const auto& entry : header->entries) {
    size_t t = 0;
    while (t < table.size() && table[t].name != entry.info.name) ++t;
    if (t == table.size()) continue;
    const uint64_t begin = header->data_section_offset + entry.data_begin;
    const ByteSpan got(bytes->data() + begin, entry.data_end - entry.data_begin);
    if (got.size() != want[t].size() || Hash64(got) != Hash64(want[t])) {
      Fail(fmt::format("{} ({}): tensor {} is not bit-exact at version {}", Name(n.i), when,
                       entry.info.name, version.ShortHex()));
    }
  }
}

bool Run::StoreIsAVersion(const Node& n) {
  auto header = apply::ReadSafetensorsHeader(n.dir / "model.safetensors");
  auto bytes = ReadFile(n.dir / "model.safetensors", uint64_t{1} << 30);
  if (!header.ok() || !bytes.ok()) return false;
  const auto table = Table();
  std::vector<uint64_t> got(table.size());
  for (const auto& entry : header->entries) {
    size_t t = 0;
    while (t < table.size() && table[t].name != entry.info.name) ++t;
    if (t == table.size()) continue;
    got[t] = Hash64(ByteSpan(bytes->data() + header->data_section_offset + entry.data_begin,
                             entry.data_end - entry.data_begin));
  }
  for (const auto& [version, tensors] : versions_) {
    bool same = true;
    for (size_t t = 0; same && t < tensors.size(); ++t) same = Hash64(tensors[t]) == got[t];
    if (same) return true;
  }
  return false;
}

void Run::Inject(size_t index, const Fault& f) {
  if (!faults_on_) return;
  const std::string a = Name(f.a), b = Name(f.b);
  const auto secs =
      std::chrono::duration_cast<EventQueue::Duration>(std::chrono::duration<double>(f.seconds));
  q_.Note(fmt::format(
      "fault {}: {}{} {}{}{}", index, f.power ? "power-loss " : "", FaultName(f.kind), a,
      f.kind <= FaultKind::kPartition ? "-" + b : std::string(),
      f.kind == FaultKind::kCrashAt ? std::string(" at ") + kCrashPoints[f.point] + " (armed)"
                                    : std::string()));
  ++r_.faults[static_cast<size_t>(f.kind)];
  ++injected_;
  // The tree may take the fault's time plus a rejoin to settle.
  quiet_from_ = std::max(quiet_from_, q_.Now() + secs + kRecovery);
  // An outage disturbs only as it begins: the tree must route around a node that
  // stays away within its bounded waits (an away child fails or is excused after
  // the connect timeout, and after a decision is waited for only that long), not
  // wait for it to come back. Its restart disturbs again (StartNode).
  // A crash point disturbs when it is reached (KillInPlace).
  const bool instant = f.kind == FaultKind::kReset || f.kind == FaultKind::kLateJoin ||
                       f.kind == FaultKind::kOutage || f.kind == FaultKind::kCrashAt;
  disturbed_until_ =
      std::max(disturbed_until_, q_.Now() + (instant ? EventQueue::Duration{} : secs));
  switch (f.kind) {
    case FaultKind::kReset:
      return net_.ResetLinks(a, b);
    case FaultKind::kStall:
      return net_.StallLinks(a, b, secs);
    case FaultKind::kPartition:
      return net_.Partition(a, b, secs);
    case FaultKind::kLoss:
      net_.set_loss_probability(0.05);
      q_.PostAt(driver_, q_.Now() + secs, [this] { net_.set_loss_probability(0); });
      return;
    case FaultKind::kKillNode:
    case FaultKind::kOutage: {
      Node& n = nodes_[f.a];
      if (!n.agent || n.dying) return;
      if (q_.OwnerOnStack(f.a)) {
        // A task of it waits below this one (its pause hook): it unwinds first.
        return KillInPlace(f.a, f.power, f.seconds, "kill");
      }
      if (f.power) disk_.Cut(n.dir);  // its destructors write nothing durable
      StopNode(n, "kill");
      if (f.power) LosePower(f.a);
      n.restart_pending = true;
      q_.PostAt(driver_, q_.Now() + secs, [this, i = f.a] {
        if (nodes_[i].restart_pending) StartNode(nodes_[i]);
      });
      return;
    }
    case FaultKind::kKillSource:
      if (!source_) return;
      if (f.power) disk_.Cut(dir_ / "src");
      if (q_.blocked()) {
        // A node's task waiting above Publish (a pause hook) returns first: the
        // source's own tasks stop now.
        if (q_.Nested()) q_.CloseOwner(0);
        q_.KillBlocked();  // Publish unwinds; the source goes there
        source_power_loss_ = f.power;
      } else {
        source_.reset();
        q_.Note("kill src");
        if (f.power) LosePower(0);
      }
      source_restart_pending_ = true;
      q_.PostAt(driver_, q_.Now() + secs, [this] {
        if (source_restart_pending_) StartSource();
      });
      return;
    case FaultKind::kLateJoin:
      if (!nodes_[f.a].joined) StartNode(nodes_[f.a]);
      return;
    case FaultKind::kCrashAt:
      armed_.push_back({index, f});
      return;
    case FaultKind::kFullDisk:
      disk_.SetFull(DirOf(f.a), true);
      q_.PostAt(driver_, q_.Now() + secs, [this, p = f.a] {
        if (disk_.full(DirOf(p))) q_.Note("disk of " + Name(p) + " has space again");
        disk_.SetFull(DirOf(p), false);
      });
      return;
  }
}

void Run::KillInPlace(int i, bool power, double restart_seconds, const std::string& why) {
  Node& n = nodes_[i];
  n.dying = true;
  if (power) disk_.Cut(n.dir);  // nothing it does from now on is durable
  if (n.engine) n.engine->Died();
  q_.CloseOwner(i);  // none of its tasks runs again
  disturbed_until_ = std::max(disturbed_until_, q_.Now());
  q_.Note(fmt::format("{}{} {} where it stands", power ? "power-loss " : "", why, Name(i)));
  FinishKill(i, power, restart_seconds, why);
}

// The rest of a kill in place, once no task of the node is on the stack.
void Run::FinishKill(int i, bool power, double restart_seconds, std::string why) {
  if (q_.RunningOwner() == i || q_.OwnerOnStack(i)) {
    q_.PostAt(driver_, q_.Now() + std::chrono::milliseconds(1),
              [=, this] { FinishKill(i, power, restart_seconds, why); });
    return;
  }
  Node& n = nodes_[i];
  n.dying = false;
  StopNode(n, why.c_str());
  if (power) LosePower(i);
  n.restart_pending = true;
  const auto secs = std::chrono::duration_cast<EventQueue::Duration>(
      std::chrono::duration<double>(restart_seconds));
  disturbed_until_ = std::max(disturbed_until_, q_.Now() + secs);
  q_.PostAt(driver_, q_.Now() + secs, [this, i] {
    if (nodes_[i].restart_pending) StartNode(nodes_[i]);
  });
}

// The crash-point seam (common/crash_point.h): a node whose kCrashAt fault is armed
// for this point dies here; the throw unwinds its task (EventQueue::Step).
void Run::OnCrashPoint(std::string_view name, void* self) {
  Run& run = *static_cast<Run*>(self);
  const int i = run.q_.RunningOwner();
  if (i <= 0 || !run.faults_on_) return;
  Node& n = run.nodes_[i];
  if (!n.agent || n.dying) return;
  for (auto it = run.armed_.begin(); it != run.armed_.end(); ++it) {
    if (it->fault.a != i || name != kCrashPoints[it->fault.point]) continue;
    const ArmedCrash armed = *it;
    run.armed_.erase(it);
    ++run.r_.crashes;
    run.q_.Note(fmt::format("fault {}: {} reached {}", armed.index, Name(i), name));
    run.KillInPlace(i, armed.fault.power, armed.fault.seconds, "crash");
    throw Killed{};
  }
}

// The process `process` is dead and its machine lost power: its directory becomes
// what the crash left. The decisions the source fsynced must all be there.
void Run::LosePower(int process) {
  const PowerLossReport rep = disk_.PowerLoss(DirOf(process));
  ++r_.power_losses;
  q_.Note(fmt::format("power loss {}: {}", Name(process), rep.Describe()));
  if (process != 0) return;
  if (o_.sabotage_disk) {
    std::error_code ec;
    fs::remove(decision_log_, ec);
    q_.Note("sabotage: the source's decision log lost with the power");
  }
  for (size_t k = 1; k < lineage_.size(); ++k) {
    if (!LoggedCommit(lineage_[k])) {
      Fail(fmt::format("the source's power loss lost the COMMIT of #{} ({}) from its decision log",
                       k, lineage_[k].ShortHex()));
    }
  }
}

// The faults of workload publish `publish`, timed from now (its start).
void Run::ScheduleFaults(int publish) {
  for (size_t k = 0; k < s_.faults.size(); ++k) {
    const Fault f = s_.faults[k];
    if (f.publish != publish || o_.drop_faults.count(k)) continue;
    q_.PostAt(driver_,
              q_.Now() + std::chrono::duration_cast<EventQueue::Duration>(
                             std::chrono::duration<double>(f.at)),
              [this, k, f] { Inject(k, f); });
  }
}

void Run::Publish(int index, double rate, bool liveness) {
  // A dead source restarts on its own schedule; wait for it.
  while (!source_) {
    if (!source_restart_pending_) StartSource();
    if (!source_ && !source_restart_pending_) return;  // it cannot start (a failure)
    if (!source_) q_.RunFor(std::chrono::milliseconds(100));
  }
  const Digest128 base = lineage_.back();
  Tensors base_bytes = versions_.at(base);
  Tensors target_bytes = Mutate(base_bytes, rate);
  const codec::Manifest base_manifest = ManifestOf(base_bytes);
  const codec::Manifest target_manifest = ManifestOf(target_bytes);
  const Digest128 target = target_manifest.VersionId();
  versions_[target] = target_bytes;
  pending_ = target;
  ++r_.publishes;
  q_.Note(fmt::format("publish #{} {} -> {} ({:.4f} % changed){}", lineage_.size(), base.ShortHex(),
                      target.ShortHex(), 100 * rate, liveness ? " [liveness]" : ""));
  if (trainer_) {
    // The producers compare their shares and the root checks them, as it knows the
    // tree's version (the last committed one); a refusal sends nothing.
    const TrainerFault fault = index >= 0 ? s_.trainer_faults[index] : TrainerFault{};
    if (fault.kind != TrainerFaultKind::kNone) ++r_.trainer_faults;
    const Tensors stale = lineage_.size() >= 2 ? versions_.at(lineage_[lineage_.size() - 2])
                                               : Mutate(base_bytes, 0.01);
    Status produced = trainer_->Produce(base_manifest, base_bytes, target_bytes, stale, fault);
    if (fault.kind != TrainerFaultKind::kNone) {
      q_.Note(
          fmt::format("trainer fault: {} at rank {}", TrainerFaultName(fault.kind), fault.rank));
    }
    if (!produced.ok()) {
      q_.Note(Scrub("refused at the root: " + produced.ToString()));
      if (fault.kind == TrainerFaultKind::kNone || liveness) {
        Fail("the root refused a correct trainer's refit: " + produced.ToString());
      }
      ++r_.trainer_refused;
      pending_.reset();
      return;
    }
  }
  auto base_store = Borrow(base_bytes);
  auto target_store = Borrow(target_bytes);
  const double t0 = q_.Seconds();
  const EventQueue::TimePoint started = q_.Now();
  const uint64_t injected_before = injected_;
  bool quiet = q_.Now() >= quiet_from_;
  for (int i = 1; i <= s_.nodes; ++i) quiet &= !nodes_[i].joined || nodes_[i].agent != nullptr;
  std::optional<Result<relay::PublishReport>> report;
  try {
    report = trainer_
                 ? source_->PublishStream(
                       trainer_->base(), trainer_->target(),
                       [this](const relay::Source::ChunkMessageSink& sink,
                              codec::DeltaStats* stats) { return trainer_->Stream(sink, stats); })
                 : source_->Publish(*base_store, base_manifest, *target_store, target_manifest);
  } catch (const Killed&) {
    source_.reset();
    q_.Note("kill src (while publishing)");
    if (std::exchange(source_power_loss_, false)) LosePower(0);
  }
  const bool committed = LoggedCommit(target);
  if (committed && trainer_) trainer_->Committed();
  if (committed) {
    index_[target] = static_cast<int>(lineage_.size());
    lineage_.push_back(target);
    ++r_.committed;
  }
  pending_.reset();
  if (!report) {
    if (liveness) Fail("liveness: the source died during the liveness publish");
    return;
  }
  if (quiet && injected_ == injected_before && q_.Seconds() - t0 > kStallSeconds) {
    Fail(fmt::format("stall: a publish with every process up and no fault acting took {:.1f} s",
                     q_.Seconds() - t0));
  }
  CheckTimeLost(started, injected_ != injected_before || !quiet);
  if (!report->ok()) {
    q_.Note(Scrub("publish failed: " + report->status().ToString()));
    if (liveness) Fail("liveness: publish failed: " + report->status().ToString());
    return;
  }
  const relay::PublishReport& rep = **report;
  if (rep.committed && rep.target_version != target) {
    // What the trainer's step is, bit for bit, against what the tree committed.
    Fail(fmt::format("bit-exact: the source committed version {}, not the trainer's step {}",
                     rep.target_version.ShortHex(), target.ShortHex()));
  }
  q_.Note(Scrub(fmt::format("publish {} in {:.3f} s, {} nodes decided{}",
                            rep.committed ? "COMMITTED" : "ABORTED", q_.Seconds() - t0,
                            rep.nodes_decided, rep.committed ? "" : ": " + rep.abort_reason)));
  if (rep.committed != committed) {
    Fail(fmt::format("the report says {} but the decision log says {}",
                     rep.committed ? "committed" : "aborted", committed ? "COMMIT" : "not"));
  }
  if (liveness) {
    if (!rep.committed) Fail("liveness: the publish after the faults aborted: " + rep.abort_reason);
    if (rep.nodes_decided != static_cast<uint32_t>(s_.nodes)) {
      Fail(fmt::format("liveness: {} of {} nodes confirmed the decision", rep.nodes_decided,
                       s_.nodes));
    }
    if (q_.Seconds() - t0 > kLivenessSeconds) {
      Fail(fmt::format("liveness: the publish took {:.1f} s of simulated time", q_.Seconds() - t0));
    }
  }
  if (!rep.committed) return;
  // Every live node that says it is at the version holds its bytes.
  for (int i = 1; i <= s_.nodes; ++i) {
    Node& n = nodes_[i];
    if (!n.agent) continue;
    const relay::NodeAgentStats st = n.agent->stats();
    if (st.version != target) continue;
    if (n.reconciling && st.stores_recovered == 0) continue;  // it has not confirmed
    // Committed ahead of its bytes (a staged delta over a store a crash tore) and
    // mending them with its engine paused: the engine checks them whole at resume.
    if (st.store_unflushed && n.engine && n.engine->paused()) continue;
    CheckBytes(n, target, "after a commit");
  }
}

// A disturbed publish may take as long as its faults last, and then kLostSeconds.
void Run::CheckTimeLost(EventQueue::TimePoint started, bool disturbed) {
  if (!disturbed) return;
  using Secs = std::chrono::duration<double>;
  const double lost = Secs(q_.Now() - std::max(started, disturbed_until_)).count();
  if (lost > kLostSeconds) {
    Fail(
        fmt::format("time lost: a publish took {:.1f} s, {:.1f} s of it after its last fault "
                    "ended",
                    Secs(q_.Now() - started).count(), lost));
  }
}

void Run::Sabotage() {
  const fs::path file = nodes_[1].dir / "model.safetensors";
  auto header = apply::ReadSafetensorsHeader(file);
  if (!header.ok()) return;
  const int fd = ::open(file.c_str(), O_RDWR);
  if (fd < 0) return;
  // The last byte of the norm, which no delta changes: no refit rewrites it, so
  // only the checkers can notice.
  const off_t at =
      static_cast<off_t>(header->data_section_offset + header->entries.back().data_end - 1);
  std::byte b{};
  if (::pread(fd, &b, 1, at) == 1) {
    b ^= std::byte{0xff};
    (void)::pwrite(fd, &b, 1, at);
  }
  ::close(fd);
  q_.Note("sabotage: one byte of n1's store changed behind the engine's back");
}

void Run::HealAndRestart() {
  faults_on_ = false;
  armed_.clear();
  for (auto& n : nodes_) {
    if (n.engine) n.engine->set_faults(false);
  }
  net_.Heal();
  for (int p = 0; p <= s_.nodes; ++p) disk_.SetFull(DirOf(p), false);
  q_.Note("faults stop; heal and restart everything");
  if (!source_) StartSource();
  for (int i = 1; i <= s_.nodes; ++i) {
    if (!nodes_[i].agent) StartNode(nodes_[i]);
  }
  q_.RunFor(kSettle);
}

void Run::FinalChecks() {
  const Digest128 last = lineage_.back();
  for (int i = 1; i <= s_.nodes; ++i) {
    Node& n = nodes_[i];
    if (!n.agent) {
      Fail(Name(i) + " is not running at the end");
      continue;
    }
    const relay::NodeAgentStats st = n.agent->stats();
    if (st.version != last) {
      Fail(fmt::format("{} is at {} at the end, not the last committed {}", Name(i),
                       st.version.ShortHex(), last.ShortHex()));
    }
    if (n.engine) {
      if (n.engine->paused()) Fail(Name(i) + ": its engine is still paused at the end");
      n.engine->CheckReported(st.pause_seconds_total);
    }
    StopNode(n, "stop");
    CheckBytes(n, last, "at the end");
    auto replica = apply::Replica::OpenCheckpointDir(n.dir, kPartitionBytes, 1);
    if (!replica.ok()) {
      Fail(Name(i) + " cannot reopen its store at the end: " + replica.status().ToString());
    } else if ((*replica)->version() != last || (*replica)->inflight()) {
      Fail(Name(i) + " journal at the end is not at the last version with nothing in flight");
    }
  }
  source_.reset();
  const uint64_t held_bound = (kWindow + 2) * 2 * kChunkBytes;
  if (r_.peak_held_bytes > held_bound) {
    Fail(fmt::format("memory: a node held {} chunk bytes at once (bound {})", r_.peak_held_bytes,
                     held_bound));
  }
  if (r_.chunk_bytes > 0 && r_.resent_bytes * 100 > r_.chunk_bytes) {
    Fail(fmt::format("{} of {} chunk bytes were re-sent to nodes that had them (> 1 %)",
                     r_.resent_bytes, r_.chunk_bytes));
  }
}

RunResult Run::Go() {
  log::SetLevel(o_.engine_log ? log::Level::kInfo : log::Level::kOff);
  Setup();
  q_.set_time_limit(std::chrono::seconds(120 * s_.publishes + 600));
  InstallSimRuntime(&q_);
  InstallSimDisk(&disk_);
  InstallCrashPointHandler(&Run::OnCrashPoint, this);
  try {
    StartSource();
    for (int i = 1; i <= s_.nodes; ++i) {
      if (!s_.late.count(i)) StartNode(nodes_[i]);
    }
    for (int p = 0; p < s_.publishes; ++p) {
      q_.RunFor(std::chrono::duration_cast<EventQueue::Duration>(
          std::chrono::duration<double>(s_.gaps[p])));
      ScheduleFaults(p);
      Publish(p, s_.change_rates[p], false);
    }
    if (o_.sabotage) Sabotage();
    HealAndRestart();
    Publish(-1, 0.01, true);
    q_.RunFor(std::chrono::seconds(2));
    FinalChecks();
  } catch (const Stuck& stuck) {
    Fail("liveness: the run is stuck: " + stuck.why);
  } catch (const Killed&) {
    Fail("internal: a kill escaped the publish");
  }
  // Everything engine-side goes before the runtime.
  source_.reset();
  for (auto& n : nodes_) {
    if (n.agent) {
      n.agent->Stop();
      n.agent.reset();
    }
  }
  InstallCrashPointHandler(nullptr, nullptr);
  InstallSimDisk(nullptr);
  InstallSimRuntime(nullptr);
  for (const auto& n : nodes_) {
    if (!n.engine) continue;
    const EngineCounts& c = n.engine->counts();
    r_.engine.pauses += c.pauses;
    r_.engine.failed += c.failed;
    r_.engine.hung += c.hung;
    r_.engine.resumes += c.resumes;
    r_.engine.checked += c.checked;
    r_.engine.refits += c.refits;
    r_.engine.paused_seconds += c.paused_seconds;
  }
  for (int i = 1; i < static_cast<int>(s_.engines.size()); ++i) {
    r_.staged_nodes += s_.engines[i].staged;
    r_.engine_nodes += s_.engines[i].engine;
  }
  for (const std::string& gap : disk_.TakeErrors()) Fail(gap);
  r_.enospc_writes = disk_.refused_writes();
  r_.trace_hash = q_.trace_hash();
  r_.tasks = q_.tasks_run();
  r_.sim_seconds = q_.Seconds();
  r_.net = net_.counts();
  r_.peak_pending_tasks = q_.peak_pending();
  r_.trace = q_.notes();
  if (own_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  return r_;
}

}  // namespace

RunResult RunScenario(const Scenario& scenario, const RunOptions& options) {
  Run run(scenario, options);
  return run.Go();
}

}  // namespace deltacast::sim

// The run's faults (run_internal.h): injecting them, kills in place, crash points, power loss.
#include "sim/run_internal.h"

namespace deltacast::sim::internal {

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
  ++faults_begun_;
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
      if (n.snapshots && n.snapshots->building()) ++r_.snapshots.killed_building;
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
        // A second kill while the first unwinds is the same death: a power loss either
        // brought stays (forgotten, the disk stayed cut and the restarted source's
        // fsyncs counted for nothing: striped seed 71215).
        source_power_loss_ = source_power_loss_ || f.power;
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
  if (n.snapshots && n.snapshots->building()) ++r_.snapshots.killed_building;
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
  // A kill that finishes after the faults stopped (it began at the instant they did,
  // its task on the stack) comes back at once: HealAndRestart saw it still running
  // and restarted nothing (--coord seed 38406: n2 stayed down to the end).
  if (!faults_on_) restart_seconds = 0;
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
  if (name.starts_with("source.")) return run.OnSourceCrashPoint(name);  // --coord
  const int i = run.q_.RunningOwner();
  if (i <= 0 || !run.faults_on_) return;
  Node& n = run.nodes_[i];
  if (!n.agent || n.dying) return;
  for (auto it = run.armed_.begin(); it != run.armed_.end(); ++it) {
    if (it->fault.a != i || name != kCrashPoints[it->fault.point]) continue;
    const ArmedCrash armed = *it;
    run.armed_.erase(it);
    ++run.r_.crashes;
    // Armed before, it acts now, on the publish under way (a crash reached mid-publish
    // was taken for a stall: the --stripes seed 19751).
    ++run.faults_begun_;
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
}  // namespace deltacast::sim::internal

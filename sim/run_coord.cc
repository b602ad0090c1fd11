// --coord (issue 32; docs/simulation.md, "The commit record"): the commit record
// store on simulated time (InMemoryCommitRecords), a standby coordinator in the
// simulated cluster, the source's machine lost at every stage of a refit (killed and
// its state directory gone), the store down or losing its answers, and the checkers
// that hold the tree to the record.
#include "sim/run_internal.h"
#include "topology/stripe_plan.h"

namespace deltacast::sim::internal {

namespace {
constexpr char kCoordinatorId[] = "standby";
// A source away this long comes back after the coordinator decided (the 2-8 s draw).
constexpr double kLongSourceLoss = 2.0;
// When the source's child is killed after the source is lost, and how long it stays down.
constexpr double kChildKillAfter = 0.2;
constexpr double kChildDownFor = 0.3;
}  // namespace

bool Run::RecordedCommit(const Digest128& v) const {
  for (const relay::CommitRecord& r : records_->All()) {
    if (r.commit && r.cluster == config_.name && r.target_version == v) return true;
  }
  return false;
}

void Run::SetupCoordination() {
  if (!records_) return;
  // A process of its own (owner -1: no fault kills it; the store's faults reach it).
  q_.set_opening_owner(-1);
  coordinator_ = std::make_unique<relay::StandbyCoordinator>(records_, config_.name, kCoordinatorId,
                                                             kRecordPoll);
  coordinator_->Start();
  q_.Note("start coordinator:standby");
}

void Run::ScheduleCoordFaults(int publish) {
  armed_loss_.reset();  // a stage its publish never reached lapses
  for (const CoordFault& f : s_.coordination.faults) {
    if (f.publish != publish) continue;
    if (f.kind == CoordFaultKind::kLoseSource &&
        (f.stage == SourceLossStage::kAllPrepared || f.stage == SourceLossStage::kRecordWritten)) {
      armed_loss_ = f;
      continue;
    }
    q_.PostAt(driver_,
              q_.Now() + std::chrono::duration_cast<EventQueue::Duration>(
                             std::chrono::duration<double>(f.at)),
              [this, f] { InjectCoord(f); });
  }
}

void Run::InjectCoord(const CoordFault& f) {
  if (!faults_on_) return;
  const auto secs =
      std::chrono::duration_cast<EventQueue::Duration>(std::chrono::duration<double>(f.seconds));
  ++faults_begun_;
  quiet_from_ = std::max(quiet_from_, q_.Now() + secs + kRecovery);
  disturbed_until_ = std::max(disturbed_until_, q_.Now() + secs);
  if (f.kind == CoordFaultKind::kLoseSource) return LoseSource(f);
  using StoreFault = relay::InMemoryCommitRecords::Fault;
  const bool down = f.kind == CoordFaultKind::kStoreDown;
  const bool then_down = f.kind == CoordFaultKind::kAnswerLostThenDown;
  ++(down        ? r_.coord.store_down
     : then_down ? r_.coord.answer_lost_then_down
                 : r_.coord.answers_lost);
  records_->SetFault(down        ? StoreFault::kUnavailable
                     : then_down ? StoreFault::kOutcomeLostThenUnavailable
                                 : StoreFault::kOutcomeLost);
  q_.Note(fmt::format("coord fault: the store {} for {:.2f} s",
                      down        ? "is down"
                      : then_down ? "loses its next answer to Decide and is then down"
                                  : "loses its answers to Decide",
                      f.seconds));
  const uint64_t gen = ++store_fault_gen_;
  q_.PostAt(driver_, q_.Now() + secs, [this, gen] {
    if (gen != store_fault_gen_) return;  // a later fault holds the store now
    records_->SetFault(relay::InMemoryCommitRecords::Fault::kNone);
    q_.Note("coord: the store answers again");
  });
}

// The source's machine goes: the process now (its Publish unwinds first if it is
// blocked in one), its state directory once it is gone; it comes back, empty, later.
void Run::LoseSource(const CoordFault& f) {
  if (!source_) return;
  ++r_.coord.sources_lost[static_cast<size_t>(f.stage)];
  q_.Note(
      fmt::format("coord fault: the source's machine is lost ({})", SourceLossStageName(f.stage)));
  disk_.Cut(dir_ / "src");
  if (q_.blocked()) {
    if (q_.Nested()) q_.CloseOwner(0);
    q_.KillBlocked();
    source_lost_ = true;
  } else {
    source_.reset();
    q_.Note("kill src");
    WipeSource();
  }
  source_restart_pending_ = true;
  const auto secs =
      std::chrono::duration_cast<EventQueue::Duration>(std::chrono::duration<double>(f.seconds));
  disturbed_until_ = std::max(disturbed_until_, q_.Now() + secs);
  q_.PostAt(driver_, q_.Now() + secs, [this] {
    if (source_restart_pending_) StartSource();
  });
  KillSourceChildWhileLost(f);
}

void Run::KillSourceChildWhileLost(const CoordFault& f) {
  // Only a loss long enough for the record to be the one to settle it, and past the
  // point where the children may hold the delta.
  if (f.seconds < kLongSourceLoss || f.stage == SourceLossStage::kEarly) return;
  auto striped = topology::PlanStripes(config_);
  if (!striped.ok()) return;
  const topology::TreePlan& plan = striped->stripes.front().tree;
  std::vector<int> children;
  for (int i = 1; i < static_cast<int>(nodes_.size()); ++i) {
    const topology::PlannedNode* p = plan.Find(Name(i));
    if (p && p->parent && *p->parent == plan.source) children.push_back(i);
  }
  if (children.empty()) return;
  // Chosen without a draw of its own: the other faults' schedule stays as it was.
  const int i = children[static_cast<size_t>(f.publish) % children.size()];
  const auto after = std::chrono::duration_cast<EventQueue::Duration>(
      std::chrono::duration<double>(kChildKillAfter));
  quiet_from_ = std::max(quiet_from_, q_.Now() + after +
                                          std::chrono::duration_cast<EventQueue::Duration>(
                                              std::chrono::duration<double>(kChildDownFor)) +
                                          kRecovery);
  q_.PostAt(driver_, q_.Now() + after, [this, i] {
    Node& n = nodes_[i];
    if (!faults_on_ || !n.agent || n.dying || !source_restart_pending_) return;
    ++faults_begun_;
    KillInPlace(i, /*power=*/false, kChildDownFor, "kill (the source away)");
  });
}

void Run::WipeSource() {
  disk_.Replace(dir_ / "src");
  q_.Note("the source's state directory is gone with its machine");
}

// A source loss armed for one of the source's crash points: the source dies there,
// on its publishing thread (the throw unwinds Publish).
void Run::OnSourceCrashPoint(std::string_view name) {
  if (!faults_on_ || !armed_loss_ || !source_) return;
  const char* point = armed_loss_->stage == SourceLossStage::kAllPrepared ? "source.before_decision"
                                                                          : "source.decided";
  if (name != point) return;
  const CoordFault f = *armed_loss_;
  armed_loss_.reset();
  ++faults_begun_;
  ++r_.coord.sources_lost[static_cast<size_t>(f.stage)];
  quiet_from_ = std::max(quiet_from_, q_.Now() + kRecovery);
  q_.Note(fmt::format("coord fault: the source's machine is lost at {} ({})", name,
                      SourceLossStageName(f.stage)));
  disk_.Cut(dir_ / "src");
  source_lost_ = true;
  source_restart_pending_ = true;
  const auto secs =
      std::chrono::duration_cast<EventQueue::Duration>(std::chrono::duration<double>(f.seconds));
  disturbed_until_ = std::max(disturbed_until_, q_.Now() + secs);
  q_.PostAt(driver_, q_.Now() + secs, [this] {
    if (source_restart_pending_) StartSource();
  });
  KillSourceChildWhileLost(f);
  throw Killed{};
}

// A node reports a refit's outcome: it must be the record's. No COMMIT without a
// COMMIT record, no abort of a refit whose record is COMMIT.
void Run::OnOutcome(int i, uint64_t refit_id, const Digest128& target, bool committed) {
  std::optional<relay::CommitRecord> record;
  for (const relay::CommitRecord& r : records_->All()) {
    if (r.refit_id == refit_id) record = r;
  }
  if (committed && !(record && record->commit)) {
    Fail(fmt::format("{} committed refit {} (to {}) with no COMMIT record", Name(i), refit_id,
                     target.ShortHex()));
  }
  if (!committed && record && record->commit) {
    Fail(fmt::format("{} aborted refit {} (to {}), whose record is COMMIT", Name(i), refit_id,
                     target.ShortHex()));
  }
}

void Run::CoordFinalChecks() {
  for (const relay::CommitRecord& r : records_->All()) {
    ++(r.commit ? r_.coord.commit_records : r_.coord.abort_records);
    const bool by_coordinator = r.decided_by.rfind("coordinator:", 0) == 0;
    if (by_coordinator) ++r_.coord.coordinator_aborts;
    if (by_coordinator && r.commit)
      Fail("the coordinator wrote a COMMIT: refit " + std::to_string(r.refit_id));
    if (r.commit && !IndexOf(r.target_version)) {
      Fail(fmt::format("refit {} has a COMMIT record to {}, which is not in the lineage",
                       r.refit_id, r.target_version.ShortHex()));
    }
  }
  for (size_t k = 1; k < lineage_.size(); ++k) {
    if (!RecordedCommit(lineage_[k])) {
      Fail(fmt::format("version #{} ({}) committed with no COMMIT record", k,
                       lineage_[k].ShortHex()));
    }
  }
}

}  // namespace deltacast::sim::internal

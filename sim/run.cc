#include "relay/tree/setup.h"
#include "sim/run_internal.h"

namespace deltacast::sim {
namespace internal {

std::vector<TensorSpec> Table() {
  std::vector<TensorSpec> t;
  for (int i = 0; i < 3; ++i)
    t.push_back({"layer" + std::to_string(i) + ".weight", DType::kBF16, {kElements}});
  t.push_back({"norm.weight", DType::kF32, {64}});
  return t;
}

std::unique_ptr<apply::WeightStore> Borrow(Tensors& buffers) {
  const auto tensors = Table();
  std::vector<std::pair<TensorSpec, MutableByteSpan>> spans;
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
  if (s.striping.stripes > 0) {
    toml.insert(toml.find("\n\n[[node]]"), fmt::format("\nstripes = {}", s.striping.stripes));
  }
  for (int i = 1; i <= s.nodes; ++i) {
    toml += fmt::format(
        "\n[[node]]\nid = \"n{}\"\nhost = \"sim\"\nport = {}\nregion = \"r\"\nrole = "
        "\"receiver\"\n",
        i, 1 + 3 * i);
    const NodeEngine e = i < static_cast<int>(s.engines.size()) ? s.engines[i] : NodeEngine{};
    if (e.staged) toml += "apply = \"staged\"\n";
    if (e.small_memory) toml += "staged_memory = \"24KiB\"\n";
    const NodeSnapshots sn =
        i < static_cast<int>(s.snapshots.size()) ? s.snapshots[i] : NodeSnapshots{};
    if (sn.on) {
      toml += fmt::format(
          "checkpoint = \"snapshot\"\nsnapshot_every = {}\nsnapshot_chain_percent = {}\n"
          "snapshot_rate = \"{}\"\n",
          sn.every, sn.chain_percent, sn.rate);
    }
  }
  return toml;
}

std::string Name(int process) { return process == 0 ? "src" : "n" + std::to_string(process); }

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
  {
    relay::PublishOptions state;  // where the source keeps its decisions
    state.UseStateDir(dir_ / "src");
    decision_log_ = state.decision_log;
  }
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
    // A refused or hung pause is a fault like any other: the refit may take its time,
    // then kLostSeconds (the --stripes seed 11869 was failed for 10.4 s, 1.3 s of which
    // went to a hook that hung out the node's timeout after the last other fault).
    nodes_[i].engine->set_on_fault([this] {
      ++faults_begun_;
      disturbed_until_ = std::max(disturbed_until_, q_.Now());
    });
  }
  for (int p = 0; p <= s_.nodes; ++p) disk_.Adopt(DirOf(p));
  if (s_.coordination.on) records_ = std::make_shared<relay::InMemoryCommitRecords>(config_.name);
  if (s_.producers > 0)
    trainer_ = std::make_unique<SimTrainer>(Table(), kPartitionBytes, kChunkBytes);
}

Result<relay::SnapshotStore::Opened> Run::OpenStore(const Node& n) {
  const topology::NodeConfig& node = *config_.FindNode(Name(n.i));
  if (node.checkpoint != topology::CheckpointMode::kSnapshot) {
    return relay::OpenNodeCheckpoint(n.dir, node, kPartitionBytes, 1);
  }
  // OpenNodeCheckpoint's policy, in small blocks: a build spans many steps.
  relay::SnapshotPolicy policy;
  policy.every = node.snapshot_every;
  policy.chain_percent = node.snapshot_chain_percent;
  policy.rate = node.snapshot_rate;
  policy.block_bytes = kSnapshotBlockBytes;
  return relay::SnapshotStore::Open(n.dir, kPartitionBytes, 1, policy);
}

// A process starts on a disk whose power loss was applied: one still cut (a kill that
// cut it and never lost the power) would make every fsync of the new process count for
// nothing, and the durability checks fail the engine for the simulator's slip.
void Run::CheckDiskNotCut(int process) {
  if (disk_.cut(DirOf(process))) {
    Fail(fmt::format("simulator: {} starts on a disk still cut by an earlier kill", Name(process)));
  }
}

void Run::StartNode(Node& n) {
  n.restart_pending = false;
  if (n.agent) return;
  CheckDiskNotCut(n.i);
  // A snapshot store's build queue is the node's: it dies with it.
  q_.set_opening_owner(n.i);
  auto opened = OpenStore(n);
  q_.set_opening_owner(-1);
  if (!opened.ok()) {
    // A snapshot store's open writes (its first snapshot, the chain's index): on a
    // full disk the process exits with ENOSPC, and its supervisor starts it again.
    const bool no_space =
        opened.status().message().find("No space left on device") != std::string::npos;
    if (no_space && disk_.full(n.dir)) {
      q_.Note(Scrub(Name(n.i) + " cannot start (its disk is full), again in 1 s: " +
                    opened.status().ToString()));
      n.restart_pending = true;
      q_.PostAt(driver_, q_.Now() + std::chrono::seconds(1), [this, i = n.i] {
        if (nodes_[i].restart_pending) StartNode(nodes_[i]);
      });
      return;
    }
    Fail(Name(n.i) + " cannot reopen its store: " + opened.status().ToString());
    return;
  }
  std::unique_ptr<apply::Replica>& replica = opened->replica;
  const Digest128 v = replica->version();
  n.reconciling = replica->needs_reconcile();
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
  if (opened->store) {
    // Its snapshot and chain rebuilt the version in memory: bit-exact at once, and
    // with nothing to mend from the tree (its files count only once synced).
    n.snapshots = opened->store;
    n.live = &replica->store();
    if (n.reconciling) Fail(Name(n.i) + " (a snapshot store) reopened with its store to mend");
    if (versions_.count(v)) CheckBytes(n, v, "as it reopened");
  }
  relay::NodeAgentOptions options;
  options.config = config_;
  options.node_id = Name(n.i);
  options.token = kToken;
  options.apply_threads = 1;
  options.spool_dir = n.dir / apply::kStateDirName / "spool";
  options.write_back_delay = std::chrono::milliseconds(s_.write_back_ms);
  options.on_commit = [this, i = n.i](const relay::CommitEvent& e) { OnCommit(i, e); };
  options.snapshots = opened->store;
  if (records_) {
    options.commit_records = records_;
    options.source_timeout = kSourceTimeout;
    options.poll_interval = kRecordPoll;
    options.on_outcome = [this, i = n.i](uint64_t id, const Digest128& target, bool committed) {
      OnOutcome(i, id, target, committed);
    };
  }
  if (n.engine) {
    n.engine->Started();
    options.engine_hooks = n.engine->Hooks();
  }
  // Every queue the node opens is its own: it can be killed while one waits.
  q_.set_opening_owner(n.i);
  auto agent = relay::StartConfiguredNode(
      std::move(options),
      relay::NodeParts::Weights(std::move(replica), net_.MakeTransport(Name(n.i))));
  q_.set_opening_owner(-1);
  if (!agent.ok()) {
    n.snapshots.reset();
    n.live = nullptr;
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
  r_.stream_rollbacks += st.stream_rollbacks;
  r_.coord.held_settled_from_record += st.held_settled_from_record;
  r_.peak_held_bytes = std::max(r_.peak_held_bytes, st.peak_held_bytes);
  r_.pause_seconds += st.pause_seconds_total;
  if (n.engine) n.engine->Died();
  n.agent->Stop();
  n.agent.reset();
  if (n.snapshots) {
    const relay::SnapshotStore::Stats ss = n.snapshots->stats();
    r_.snapshots.built += ss.snapshots_built;
    r_.snapshots.bytes_written += ss.snapshot_bytes_written;
    r_.snapshots.repaired += st.partitions_repaired;
    // A snapshot store's disk holds its committed version whole: a recovery that
    // fetched partitions from the tree found its bytes wrong.
    if (st.partitions_recovered > 0) {
      Fail(
          fmt::format("{} (a snapshot store) fetched {} partitions from the tree to mend its "
                      "store",
                      Name(n.i), st.partitions_recovered));
    }
  }
  n.snapshots.reset();
  n.live = nullptr;
  q_.Note(fmt::format("{} {}", why, Name(n.i)));
}

void Run::StartSource() {
  source_restart_pending_ = false;
  if (source_) return;
  CheckDiskNotCut(0);
  relay::PublishOptions options;
  options.config = config_;
  options.token = kToken;
  options.encode_threads = 1;
  options.UseStateDir(dir_ / "src");
  options.keep_deltas = s_.keep_deltas;
  if (records_) {
    options.commit_records = records_;
    options.source_timeout = kSourceTimeout;
    options.poll_interval = kRecordPoll;
  }
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
  // --restream: the delta the killed source was streaming, again (its base is still
  // the tree's: nothing of it was decided).
  const bool restreaming = restream_ && restream_->first == base && !trainer_;
  Tensors target_bytes = restreaming ? versions_.at(restream_->second) : Mutate(base_bytes, rate);
  restream_.reset();
  const bool kill_mid_stream = s_.restream && !trainer_ && !liveness && !restreaming;
  if (restreaming) ++r_.restreams;
  const codec::Manifest base_manifest = ManifestOf(base_bytes);
  const codec::Manifest target_manifest = ManifestOf(target_bytes);
  const Digest128 target = target_manifest.VersionId();
  versions_[target] = target_bytes;
  pending_ = target;
  ++r_.publishes;
  q_.Note(fmt::format("publish #{} {} -> {} ({}){}", lineage_.size(), base.ShortHex(),
                      target.ShortHex(),
                      restreaming ? "the same delta again, renumbered [restream]"
                                  : fmt::format("{:.4f} % changed", 100 * rate),
                      liveness ? " [liveness]" : ""));
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
  const uint64_t begun_before = faults_begun_;
  bool quiet = q_.Now() >= quiet_from_;
  for (int i = 1; i <= s_.nodes; ++i) quiet &= !nodes_[i].joined || nodes_[i].agent != nullptr;
  std::optional<Result<relay::PublishReport>> report;
  try {
    if (trainer_) {
      report = source_->PublishStream(
          trainer_->base(), trainer_->target(),
          [this](const relay::Source::ChunkMessageSink& sink, codec::DeltaStats* stats) {
            return trainer_->Stream(sink, stats);
          });
    } else if (s_.restream) {
      if (kill_mid_stream) restream_.emplace(base, target);
      report = source_->PublishStream(
          base_manifest, target_manifest,
          RestreamStream(base_bytes, target_bytes, restreaming, kill_mid_stream), base_store.get(),
          target_store.get());
    } else {
      report = source_->Publish(*base_store, base_manifest, *target_store, target_manifest);
    }
  } catch (const Killed&) {
    source_.reset();
    q_.Note("kill src (while publishing)");
    if (std::exchange(source_power_loss_, false)) LosePower(0);
    if (std::exchange(source_lost_, false)) WipeSource();
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
  if (quiet && faults_begun_ == begun_before && q_.Seconds() - t0 > kStallSeconds) {
    Fail(fmt::format("stall: a publish with every process up and no fault acting took {:.1f} s",
                     q_.Seconds() - t0));
  }
  CheckTimeLost(started, faults_begun_ != begun_before || !quiet);
  if (!report->ok()) {
    q_.Note(Scrub("publish failed: " + report->status().ToString()));
    if (report->status().message().find("no decision was sent") != std::string::npos) {
      ++r_.coord.unknown_outcomes;
    }
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
    // Committed from its spool over a store a power loss tore, and fetching the
    // partitions the spool could not mend: it confirms nothing until they are in
    // (the --stripes seed 118807 checked it mid-way).
    if (st.store_mending) continue;
    // Committed ahead of its bytes (a staged delta over a store a crash tore) and
    // mending them with its engine paused: the engine checks them whole at resume.
    if (st.store_unflushed && n.engine && n.engine->paused()) continue;
    CheckBytes(n, target, "after a commit");
  }
}

void Run::HealAndRestart() {
  faults_on_ = false;
  armed_.clear();
  for (auto& n : nodes_) {
    if (n.engine) n.engine->set_faults(false);
  }
  net_.Heal();
  for (int p = 0; p <= s_.nodes; ++p) disk_.SetFull(DirOf(p), false);
  armed_loss_.reset();
  if (records_) records_->SetFault(relay::InMemoryCommitRecords::Fault::kNone);
  q_.Note("faults stop; heal and restart everything");
  if (!source_) StartSource();
  for (int i = 1; i <= s_.nodes; ++i) {
    if (!nodes_[i].agent) StartNode(nodes_[i]);
  }
  q_.RunFor(kSettle);
}

RunResult Run::Go() {
  log::SetLevel(o_.engine_debug ? log::Level::kDebug
                : o_.engine_log ? log::Level::kInfo
                                : log::Level::kOff);
  Setup();
  q_.set_time_limit(std::chrono::seconds(120 * s_.publishes + 600));
  // --stripes: a livelock there (seed 235: nodes switching between two refits their
  // stripe parents replay) burns tasks at one instant; a run takes 5-100 thousand.
  if (s_.striping.stripes > 0) q_.set_task_budget(2'000'000);
  // A run takes well under a second of wall time, a few on a busy machine.
  q_.set_wall_limit(std::chrono::seconds(300));
  InstallSimRuntime(&q_);
  InstallSimDisk(&disk_);
  InstallCrashPointHandler(&Run::OnCrashPoint, this);
  try {
    SetupCoordination();
    SetupStripes();
    StartSource();
    for (int i = 1; i <= s_.nodes; ++i) {
      if (!s_.late.count(i)) StartNode(nodes_[i]);
    }
    for (int p = 0; p < s_.publishes; ++p) {
      q_.RunFor(std::chrono::duration_cast<EventQueue::Duration>(
          std::chrono::duration<double>(s_.gaps[p])));
      ScheduleFaults(p);
      if (records_) ScheduleCoordFaults(p);
      if (watch_) ScheduleStripeFaults(p);
      Publish(p, s_.change_rates[p], false);
    }
    if (o_.sabotage || o_.sabotage_snapshot) Sabotage();
    HealAndRestart();
    Publish(-1, 0.01, true);
    q_.RunFor(std::chrono::seconds(2));
    FinalChecks();
    if (records_) CoordFinalChecks();
    StripeFinalChecks();
  } catch (const Stuck& stuck) {
    Fail("liveness: the run is stuck: " + stuck.why);
  } catch (const Killed&) {
    Fail("internal: a kill escaped the publish");
  }
  // Everything engine-side goes before the runtime.
  coordinator_.reset();
  source_.reset();
  for (auto& n : nodes_) {
    if (n.agent) {
      n.agent->Stop();
      n.agent.reset();
    }
    n.snapshots.reset();
    n.live = nullptr;
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
  for (int i = 1; i <= s_.nodes; ++i) r_.snapshots.nodes += IsSnapshotNode(i);
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

}  // namespace internal

RunResult RunScenario(const Scenario& scenario, const RunOptions& options) {
  internal::Run run(scenario, options);
  return run.Go();
}

}  // namespace deltacast::sim

#include "relay/store/snapshot_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "apply/checkpoint_state.h"
#include "apply/delta_applier.h"
#include "codec/chunk.h"
#include "codec/manifest_diff.h"
#include "common/crash_point.h"
#include "common/disk_seam.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/parallel.h"
#include "common/thread_annotations.h"
#include "relay/store/checkpoint_writer.h"

namespace deltacast::relay {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSnapshotsDirName = "snapshots";
constexpr std::string_view kChainDirName = "chain";
constexpr std::string_view kBuildingSuffix = ".building";
// A directory written all at once goes in blocks of this size.
constexpr uint64_t kBlockBytes = uint64_t{8} << 20;
constexpr uint64_t kSyncEveryBlocks = 8;  // a paced copy syncs every 8 blocks

fs::path StateDir(const fs::path& dir) { return dir / apply::kStateDirName; }
fs::path PointerPath(const fs::path& dir) { return StateDir(dir) / apply::kSnapshotPointerName; }
fs::path SnapshotsDir(const fs::path& dir) { return StateDir(dir) / kSnapshotsDirName; }
fs::path ChainDir(const fs::path& dir) { return StateDir(dir) / kChainDirName; }

Result<std::optional<Digest128>> ReadPointer(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(PointerPath(dir), ec)) return std::optional<Digest128>();
  ASSIGN_OR_RETURN(auto bytes, ReadFile(PointerPath(dir), 4096));
  std::string text(AsChars(bytes));
  constexpr std::string_view kTag = "snapshot ";
  if (text.size() != kTag.size() + 32 + 1 || !text.starts_with(kTag) || text.back() != '\n') {
    return Status::Corrupt(PointerPath(dir).string() + " is malformed");
  }
  auto version = Digest128::FromHex(text.substr(kTag.size(), 32));
  if (!version) return Status::Corrupt(PointerPath(dir).string() + " is malformed");
  return std::optional<Digest128>(*version);
}

Status WritePointer(const fs::path& dir, const Digest128& version) {
  const std::string text = "snapshot " + version.ToHex() + "\n";
  return WriteFileAtomic(PointerPath(dir), AsBytes(text));
}

// When `done` bytes copied since `start` at most `rate` bytes per second (0: any) may
// be followed by more.
RuntimeClock::time_point PacedUntil(RuntimeClock::time_point start, uint64_t done, uint64_t rate) {
  if (rate == 0) return start;
  return start + std::chrono::duration_cast<RuntimeClock::duration>(
                     std::chrono::duration<double>(double(done) / double(rate)));
}

// Removes `path` and all in it, and tells the disk.
void RemoveAll(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  disk::Removed(path);
}

// Applies one committed delta of the chain, read from its file, to `store` (at
// `current`'s bytes); returns the target's manifest, checked against the link.
Result<codec::Manifest> ReplayLink(apply::WeightStore& store, codec::Manifest current,
                                   const DeltaHistory& chain, const ChainLink& link,
                                   size_t threads) {
  apply::ApplyOptions options;
  options.threads = threads;
  options.store_at_manifest = true;  // the snapshot, then each link's verified target
  options.flush_on_finish = false;   // the chain on disk is what makes it durable
  std::unique_ptr<apply::DeltaApplier> applier;
  std::optional<codec::DeltaSummary> summary;
  const std::string what =
      "the chain's delta " + link.base.ShortHex() + " -> " + link.target.ShortHex();
  for (uint32_t sequence = 0; sequence < link.chunks; ++sequence) {
    auto message = chain.Read(link.target, sequence);
    if (!message.ok())
      return message.status().WithContext(what + ", chunk " + std::to_string(sequence));
    ASSIGN_OR_RETURN(codec::ChunkView chunk, codec::ParseChunk(ChunkOf(**message)));
    if (chunk.identity.base_version != link.base || chunk.identity.target_version != link.target) {
      return Status::Corrupt(what + ": chunk " + std::to_string(sequence) +
                             " belongs to another delta");
    }
    if (!applier) {
      applier = std::make_unique<apply::DeltaApplier>(store, current, chunk.identity, options);
    }
    if (chunk.kind == codec::ChunkKind::kEnd) {
      summary = chunk.summary;
      continue;
    }
    if (Status s = applier->ApplyChunk(chunk); !s.ok()) return s.WithContext(what);
  }
  if (!summary || !applier) return Status::Corrupt(what + " has no END chunk");
  auto target = applier->Finish(*summary);
  if (!target.ok()) return target.status().WithContext(what);
  if (target->VersionId() != link.target) {
    return Status::Corrupt(what + " replayed to " + target->VersionId().ShortHex());
  }
  return target;
}

// The snapshot at `version` in `dir`'s store, mapped with `access`, and its manifest.
struct MappedSnapshot {
  std::unique_ptr<apply::CheckpointDirStore> store;
  codec::Manifest manifest;
};
Result<MappedSnapshot> MapSnapshot(const fs::path& folder, const Digest128& version,
                                   apply::CheckpointDirStore::Access access,
                                   uint64_t partition_bytes, size_t threads) {
  MappedSnapshot s;
  ASSIGN_OR_RETURN(s.store, apply::CheckpointDirStore::Open(folder, access));
  apply::CheckpointState state(folder);
  // What the name promises, read before a re-hash replaces the cache: a snapshot
  // whose bytes changed under it is reported tensor by tensor.
  ASSIGN_OR_RETURN(std::optional<codec::Manifest> promised,
                   state.LoadManifestOf(version, partition_bytes));
  ASSIGN_OR_RETURN(s.manifest, state.LoadOrComputeManifest(*s.store, partition_bytes, threads));
  if (s.manifest.VersionId() != version) {
    std::string what = folder.string() + " holds version " + s.manifest.VersionId().ShortHex() +
                       ", not its name's " + version.ShortHex();
    if (promised) what += ": " + codec::DiffManifests(*promised, s.manifest).Describe();
    return Status::Corrupt(what);
  }
  return s;
}

// The first snapshot: `dir`'s own files, hard-linked (copied where they cannot be).
Result<Digest128> MakeFirstSnapshot(const fs::path& dir, uint64_t partition_bytes, size_t threads) {
  apply::CheckpointState journal(dir);
  ASSIGN_OR_RETURN(auto inflight, journal.ReadInflight());
  ASSIGN_OR_RETURN(auto unflushed, journal.ReadUnflushed());
  if (inflight || unflushed) {
    return Status::FailedPrecondition(
        dir.string() +
        " has a delta in flight or a commit not written back: start it in place "
        "once to finish, then as a snapshot store");
  }
  ASSIGN_OR_RETURN(auto files, apply::CheckpointDirStore::Open(
                                   dir, apply::CheckpointDirStore::Access::kReadOnly));
  ASSIGN_OR_RETURN(codec::Manifest manifest,
                   journal.LoadOrComputeManifest(*files, partition_bytes, threads));
  const Digest128 version = manifest.VersionId();
  const fs::path folder = SnapshotsDir(dir) / version.ToHex();
  std::error_code ec;
  RemoveAll(folder);
  RETURN_IF_ERROR(CreateDirectoriesDurably(folder));
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;  // .deltacast/ and other folders
    RETURN_IF_ERROR(LinkOrCopyDurably(entry.path(), folder / entry.path().filename()));
  }
  if (ec) return Status::IoError("list " + dir.string() + ": " + ec.message());
  RETURN_IF_ERROR(FsyncDirectory(folder));
  ASSIGN_OR_RETURN(auto linked, apply::CheckpointDirStore::Open(
                                    folder, apply::CheckpointDirStore::Access::kReadOnly));
  RETURN_IF_ERROR(apply::CheckpointState(folder).SaveManifest(*linked, manifest));
  // No active version is written: as in place, a store that never committed has none
  // (Rebuild takes the snapshot's).
  RETURN_IF_ERROR(WritePointer(dir, version));
  return version;
}

// What a snapshot store's disk says: the snapshot mapped privately, and the chain
// from it to the committed version replayed.
struct Rebuilt {
  MappedSnapshot weights;
  Digest128 snapshot;
  Digest128 active;
  bool active_written = false;  // false: the store never committed (`active` is the snapshot's)
  std::optional<apply::InflightDelta> inflight;
};
Result<Rebuilt> Rebuild(const fs::path& dir, const DeltaHistory& chain, uint64_t partition_bytes,
                        size_t threads) {
  Rebuilt r;
  ASSIGN_OR_RETURN(std::optional<Digest128> pointer, ReadPointer(dir));
  if (!pointer) return Status::FailedPrecondition(dir.string() + " is not a snapshot store");
  r.snapshot = *pointer;
  apply::CheckpointState journal(dir);
  ASSIGN_OR_RETURN(std::optional<Digest128> active, journal.ReadActive());
  ASSIGN_OR_RETURN(r.inflight, journal.ReadInflight());
  r.active = active.value_or(r.snapshot);
  r.active_written = active.has_value();
  ASSIGN_OR_RETURN(r.weights, MapSnapshot(SnapshotsDir(dir) / r.snapshot.ToHex(), r.snapshot,
                                          apply::CheckpointDirStore::Access::kPrivate,
                                          partition_bytes, threads));
  if (r.active == r.snapshot) return r;
  const std::vector<ChainLink> links = chain.Chain(r.snapshot, r.active);
  if (links.empty()) {
    if (r.inflight && r.inflight->target == r.snapshot) return r;  // Open finishes the commit
    return Status::Corrupt(dir.string() + ": the snapshot at " + r.snapshot.ShortHex() +
                           " and the chain do not reach the committed version " +
                           r.active.ShortHex() + " (a file of " + ChainDir(dir).string() +
                           " is missing)");
  }
  for (const ChainLink& link : links) {
    ASSIGN_OR_RETURN(r.weights.manifest, ReplayLink(*r.weights.store, std::move(r.weights.manifest),
                                                    chain, link, threads));
  }
  return r;
}

uint64_t ModelBytes(const apply::WeightStore& store) {
  uint64_t bytes = 0;
  for (const TensorSpec& t : store.tensors()) bytes += t.ByteSize();
  return bytes;
}

}  // namespace

bool SnapshotStore::IsSnapshotStore(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(PointerPath(dir), ec);
}

Result<SnapshotStore::Opened> SnapshotStore::Open(const fs::path& dir, uint64_t partition_bytes,
                                                  size_t threads, SnapshotPolicy policy) {
  threads = threads ? threads : DefaultThreadCount();
  if (!IsSnapshotStore(dir))
    RETURN_IF_ERROR(MakeFirstSnapshot(dir, partition_bytes, threads).status());
  DeltaHistory chain(ChainDir(dir), SIZE_MAX);
  ASSIGN_OR_RETURN(Rebuilt r, Rebuild(dir, chain, partition_bytes, threads));
  apply::CheckpointState journal(dir);
  // Cut short after a catch-up's snapshot switch, before the active version: the
  // snapshot was written from the verified target, so the commit stands. A store
  // that had never committed has no `active` to differ from the snapshot: its
  // catch-up in flight to the snapshot's version tells.
  const bool switched_for_catch_up = r.inflight && r.inflight->target == r.snapshot;
  if ((r.active != r.snapshot && chain.Chain(r.snapshot, r.active).empty()) ||
      (!r.active_written && switched_for_catch_up)) {
    RETURN_IF_ERROR(journal.WriteActive(r.snapshot));
    RETURN_IF_ERROR(journal.ClearInflight());
    r.active = r.snapshot;
    r.inflight.reset();
  }
  // The chain keeps what leads to the committed version, and a link past it that a
  // commit cut short before `active` kept for the delta still in flight.
  const Digest128 keep_to = r.inflight && !chain.Chain(r.snapshot, r.inflight->target).empty()
                                ? r.inflight->target
                                : r.active;
  RETURN_IF_ERROR(chain.Retain(r.snapshot, keep_to));
  // Folders of older snapshots and builds cut short.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(SnapshotsDir(dir), ec)) {
    if (entry.path().filename() == r.snapshot.ToHex()) continue;
    fs::remove_all(entry.path(), ec);
    disk::Removed(entry.path());
  }
  const uint64_t model_bytes = ModelBytes(*r.weights.store);
  ASSIGN_OR_RETURN(auto replica,
                   apply::Replica::OpenOverJournal(std::move(r.weights.store), dir,
                                                   std::move(r.weights.manifest), threads));
  Opened opened;
  opened.replica = std::move(replica);
  opened.store = std::shared_ptr<SnapshotStore>(
      new SnapshotStore(dir, partition_bytes, threads, policy, r.snapshot, model_bytes));
  return opened;
}

Result<std::unique_ptr<apply::CheckpointDirStore>> SnapshotStore::OpenCommitted(
    const fs::path& dir, uint64_t partition_bytes, size_t threads, codec::Manifest& manifest) {
  threads = threads ? threads : DefaultThreadCount();
  DeltaHistory chain(ChainDir(dir), SIZE_MAX);
  ASSIGN_OR_RETURN(Rebuilt r, Rebuild(dir, chain, partition_bytes, threads));
  if (r.active != r.weights.manifest.VersionId()) {
    return Status::FailedPrecondition(dir.string() + ": a commit to " + r.active.ShortHex() +
                                      " was cut short; start its node once to finish it");
  }
  manifest = std::move(r.weights.manifest);
  return std::move(r.weights.store);
}

Result<uint64_t> SnapshotStore::WriteDirectory(const apply::CheckpointDirStore& weights,
                                               const fs::path& out, uint64_t rate) {
  ASSIGN_OR_RETURN(auto writer, CheckpointWriter::Create(weights, out, kBlockBytes,
                                                         rate != 0 ? kSyncEveryBlocks : 0));
  const auto start = std::chrono::steady_clock::now();
  while (!writer->done()) {
    RETURN_IF_ERROR(writer->Next().status());
    if (rate != 0) std::this_thread::sleep_until(PacedUntil(start, writer->written(), rate));
  }
  RETURN_IF_ERROR(writer->Finish());
  return writer->written();
}

SnapshotStore::SnapshotStore(fs::path dir, uint64_t partition_bytes, size_t threads,
                             SnapshotPolicy policy, Digest128 snapshot, uint64_t model_bytes)
    : dir_(std::move(dir)),
      partition_bytes_(partition_bytes),
      threads_(threads),
      policy_(policy),
      model_bytes_(model_bytes),
      mapped_(snapshot),
      chain_(ChainDir(dir_), SIZE_MAX),
      snapshot_(snapshot),
      sim_(SimRuntime()) {
  if (sim_) queue_ = sim_->OpenQueue("snapshot");
}

SnapshotStore::~SnapshotStore() {
  Stop();
  if (sim_) sim_->CloseQueue(queue_);
}

fs::path SnapshotStore::SnapshotDir(const Digest128& version) const {
  return SnapshotsDir(dir_) / version.ToHex();
}

Status SnapshotStore::Keep(const fs::path& spool_file, const ChainLink& link) {
  MutexLock lock(mu_);
  // Back to a version the snapshot and chain already reach (a rollback to an earlier
  // step): nothing to keep. Its file name is taken by the older link, which stays.
  if (link.target == snapshot_ || !chain_.Chain(snapshot_, link.target).empty()) {
    return Status::Ok();
  }
  return chain_.AddFile(spool_file, link);
}

struct SnapshotStore::BuildJob {
  explicit BuildJob(const Digest128& target) : target(target), started(RuntimeClock::now()) {}
  enum class Phase { kApply, kWrite, kSeal, kSwitch };
  const Digest128 target;
  const RuntimeClock::time_point started;
  Phase phase = Phase::kApply;
  // The old snapshot, privately mapped, with the chain applied (kApply on).
  std::unique_ptr<apply::CheckpointDirStore> weights;
  codec::Manifest manifest;
  fs::path building;
  std::unique_ptr<CheckpointWriter> writer;
  RuntimeClock::time_point write_started;
  uint64_t written = 0;
};

void SnapshotStore::MaybeBuild(const Digest128& committed) {
  if (!policy_.background || building_.load()) return;
  Digest128 snapshot;
  {
    MutexLock lock(mu_);
    snapshot = snapshot_;
  }
  const size_t links = chain_.Chain(snapshot, committed).size();
  const bool by_count = policy_.every != 0 && links >= policy_.every;
  const bool by_size = policy_.chain_percent != 0 &&
                       chain_.FileBytes() * 100 >= uint64_t{policy_.chain_percent} * model_bytes_;
  if (links == 0 || !(by_count || by_size)) return;
  building_ = true;
  if (sim_) {
    job_ = std::make_unique<BuildJob>(committed);
    PostStep(++generation_, sim_->Now());
    return;
  }
  if (build_.joinable()) build_.join();  // the last one, finished
  build_ = std::thread([this, committed] {
    BuildJob job(committed);
    Status built = RunBuild(job);
    if (!built.ok() && built.code() != StatusCode::kAborted) {
      log::Warn("snapshot at " + committed.ShortHex() + " not built: " + built.ToString());
    }
    building_ = false;
  });
}

void SnapshotStore::PostStep(uint64_t generation, RuntimeClock::time_point at) {
  sim_->PostAt(queue_, at, [this, generation] {
    if (!job_ || generation != generation_) return;  // dropped, or run to its end inline
    auto next = BuildStep(*job_);
    if (!next.ok()) return EndSimBuild(next.status());
    if (!*next) return EndSimBuild(Status::Ok());
    PostStep(generation, **next);
  });
}

void SnapshotStore::EndSimBuild(const Status& status) {
  if (!status.ok() && status.code() != StatusCode::kAborted && job_) {
    log::Warn("snapshot at " + job_->target.ShortHex() + " not built: " + status.ToString());
  }
  job_.reset();
  building_ = false;
}

Status SnapshotStore::RunBuild(BuildJob& job) {
  for (;;) {
    if (stop_) return Status::Aborted("stopped");
    ASSIGN_OR_RETURN(std::optional<RuntimeClock::time_point> next, BuildStep(job));
    if (!next) return Status::Ok();
    if (!sim_) std::this_thread::sleep_until(*next);
  }
}

Status SnapshotStore::BuildNow(const Digest128& committed) {
  WaitForBuild();
  BuildJob job(committed);
  return RunBuild(job);
}

void SnapshotStore::WaitForBuild() {
  if (sim_) {
    if (!job_) return;
    // The steps left, now: a thread waiting for a build takes no simulated time.
    Status built = RunBuild(*job_);
    return EndSimBuild(built);
  }
  if (build_.joinable()) build_.join();
}

void SnapshotStore::Stop() {
  if (sim_) {
    if (job_) EndSimBuild(Status::Aborted("stopped"));
    return;
  }
  stop_ = true;
  WaitForBuild();
  stop_ = false;
}

Result<std::optional<RuntimeClock::time_point>> SnapshotStore::BuildStep(BuildJob& job) {
  using Phase = BuildJob::Phase;
  switch (job.phase) {
    case Phase::kApply: {
      Digest128 from;
      {
        MutexLock lock(mu_);
        from = snapshot_;
      }
      if (from == job.target) return std::optional<RuntimeClock::time_point>();
      const std::vector<ChainLink> links = chain_.Chain(from, job.target);
      if (links.empty()) {
        return Status::FailedPrecondition("the chain does not lead from " + from.ShortHex() +
                                          " to " + job.target.ShortHex());
      }
      // The old snapshot mapped privately (never the live weights, which the next
      // refit may be patching), the chain applied to it in memory, then written out
      // once at the paced rate: each byte of the new snapshot reaches the disk once.
      ASSIGN_OR_RETURN(MappedSnapshot next, MapSnapshot(SnapshotDir(from), from,
                                                        apply::CheckpointDirStore::Access::kPrivate,
                                                        partition_bytes_, threads_));
      for (const ChainLink& link : links) {
        if (stop_) return Status::Aborted("stopped");
        ASSIGN_OR_RETURN(next.manifest,
                         ReplayLink(*next.store, std::move(next.manifest), chain_, link, 1));
      }
      CrashPoint("snapshot.applied");
      job.weights = std::move(next.store);
      job.manifest = std::move(next.manifest);
      job.building = SnapshotsDir(dir_) / (job.target.ToHex() + std::string(kBuildingSuffix));
      RemoveAll(job.building);
      ASSIGN_OR_RETURN(job.writer,
                       CheckpointWriter::Create(*job.weights, job.building, policy_.block_bytes,
                                                policy_.rate != 0 ? kSyncEveryBlocks : 0));
      job.write_started = RuntimeClock::now();
      job.phase = Phase::kWrite;
      return std::optional(RuntimeClock::now());
    }
    case Phase::kWrite: {
      ASSIGN_OR_RETURN(uint64_t n, job.writer->Next());
      job.written += n;
      if (job.writer->done()) job.phase = Phase::kSeal;
      return std::optional(PacedUntil(job.write_started, job.written, policy_.rate));
    }
    case Phase::kSeal: {
      RETURN_IF_ERROR(job.writer->Finish());
      job.writer.reset();
      job.weights.reset();
      {
        ASSIGN_OR_RETURN(auto files,
                         apply::CheckpointDirStore::Open(
                             job.building, apply::CheckpointDirStore::Access::kReadOnly));
        RETURN_IF_ERROR(apply::CheckpointState(job.building).SaveManifest(*files, job.manifest));
      }
      RETURN_IF_ERROR(FsyncDirectory(job.building));
      CrashPoint("snapshot.flushed");
      const fs::path done = SnapshotDir(job.target);
      RemoveAll(done);
      std::error_code ec;
      fs::rename(job.building, done, ec);
      if (ec) return Status::IoError("rename " + job.building.string() + ": " + ec.message());
      disk::Renamed(job.building, done);
      RETURN_IF_ERROR(FsyncDirectory(SnapshotsDir(dir_)));
      CrashPoint("snapshot.renamed");
      job.phase = Phase::kSwitch;
      return std::optional(RuntimeClock::now());
    }
    case Phase::kSwitch: {
      RETURN_IF_ERROR(Switch(job.target));
      MutexLock lock(mu_);
      ++stats_.snapshots_built;
      stats_.snapshot_bytes_written += job.written;
      stats_.last_build_seconds =
          std::chrono::duration<double>(RuntimeClock::now() - job.started).count();
      return std::optional<RuntimeClock::time_point>();
    }
  }
  return Status::Internal("a snapshot build in no phase");
}

Status SnapshotStore::Switch(const Digest128& version) {
  MutexLock lock(mu_);
  // The switch: from here a restart maps `version`'s folder.
  RETURN_IF_ERROR(WritePointer(dir_, version));
  CrashPoint("snapshot.switched");
  const Digest128 old = snapshot_;
  snapshot_ = version;
  // The links the new snapshot holds go; those committed since stay. A chain that
  // does not lead from it (a catch-up's snapshot) goes whole.
  const std::vector<ChainLink> links = chain_.links();
  const Digest128 newest = links.empty() ? version : links.back().target;
  const bool leads = newest == version || !chain_.Chain(version, newest).empty();
  RETURN_IF_ERROR(chain_.Retain(version, leads ? newest : version));
  CrashPoint("snapshot.dropped");
  // The folder the live weights map stays until the next open: their file names
  // stamp the journal's manifest cache, and a catch-up's snapshot reads its headers.
  if (old != mapped_ && old != version) RemoveAll(SnapshotDir(old));
  return Status::Ok();
}

Status SnapshotStore::SnapshotFrom(const apply::CheckpointDirStore& live,
                                   const codec::Manifest& manifest) {
  WaitForBuild();
  const Digest128 version = manifest.VersionId();
  {
    // Already the snapshot (a catch-up by the chain wrote it, then one by partitions
    // reached the same version): rewriting it would replace the folder in use.
    MutexLock lock(mu_);
    if (snapshot_ == version) return Status::Ok();
  }
  const fs::path building = SnapshotsDir(dir_) / (version.ToHex() + std::string(kBuildingSuffix));
  RemoveAll(building);
  ASSIGN_OR_RETURN(uint64_t written, WriteDirectory(live, building, 0));
  {
    ASSIGN_OR_RETURN(auto files, apply::CheckpointDirStore::Open(
                                     building, apply::CheckpointDirStore::Access::kReadOnly));
    RETURN_IF_ERROR(apply::CheckpointState(building).SaveManifest(*files, manifest));
  }
  RETURN_IF_ERROR(FsyncDirectory(building));
  const fs::path done = SnapshotDir(version);
  RemoveAll(done);
  std::error_code ec;
  fs::rename(building, done, ec);
  if (ec) return Status::IoError("rename " + building.string() + ": " + ec.message());
  disk::Renamed(building, done);
  RETURN_IF_ERROR(FsyncDirectory(SnapshotsDir(dir_)));
  RETURN_IF_ERROR(Switch(version));
  MutexLock lock(mu_);
  ++stats_.snapshots_built;
  stats_.snapshot_bytes_written += written;
  return Status::Ok();
}

SnapshotStore::Stats SnapshotStore::stats() const {
  MutexLock lock(mu_);
  Stats s = stats_;
  s.snapshot = snapshot_;
  s.chain_links = chain_.links().size();
  s.chain_bytes = chain_.FileBytes();
  return s;
}

Result<SnapshotStore::Opened> OpenNodeCheckpoint(const fs::path& dir,
                                                 const topology::NodeConfig& node,
                                                 uint64_t partition_bytes, size_t threads) {
  if (node.checkpoint == topology::CheckpointMode::kSnapshot) {
    SnapshotPolicy policy;
    policy.every = node.snapshot_every;
    policy.chain_percent = node.snapshot_chain_percent;
    policy.rate = node.snapshot_rate;
    return SnapshotStore::Open(dir, partition_bytes, threads, policy);
  }
  SnapshotStore::Opened opened;
  ASSIGN_OR_RETURN(opened.replica,
                   apply::Replica::OpenCheckpointDir(dir, partition_bytes, threads));
  return opened;
}

}  // namespace deltacast::relay

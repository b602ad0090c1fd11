// The run's checkers (run_internal.h): bytes, versions, time lost, the end.
#include "sim/run_internal.h"

namespace deltacast::sim::internal {

void Run::CheckTensors(int i, const Digest128& version, const char* when,
                       const std::function<std::optional<ByteSpan>(const std::string&)>& tensor) {
  const Tensors& want = versions_.at(version);
  const auto table = Table();
  for (size_t t = 0; t < table.size(); ++t) {
    const std::optional<ByteSpan> got = tensor(table[t].name);
    if (!got) continue;
    if (got->size() != want[t].size() || Hash64(*got) != Hash64(want[t])) {
      Fail(fmt::format("{} ({}): tensor {} is not bit-exact at version {}", Name(i), when,
                       table[t].name, version.ShortHex()));
    }
  }
}

void Run::CheckBytes(const Node& n, const Digest128& version, const char* when) {
  if (IsSnapshotNode(n.i)) {
    if (!n.live) return CheckSnapshotDisk(n, version, when);
    // The weights it serves: in memory, the snapshot patched by the chain.
    const apply::WeightStore& live = *n.live;
    return CheckTensors(n.i, version, when, [&](const std::string& name) {
      std::optional<ByteSpan> bytes;
      for (size_t k = 0; k < live.tensors().size(); ++k) {
        if (live.tensors()[k].name == name) bytes = live.TensorData(k);
      }
      return bytes;
    });
  }
  const fs::path file = n.dir / "model.safetensors";
  auto header = apply::ReadSafetensorsHeader(file);
  auto bytes = ReadFile(file, uint64_t{1} << 30);
  if (!header.ok() || !bytes.ok()) {
    Fail(fmt::format("{} ({}): cannot read its store", Name(n.i), when));
    return;
  }
  CheckTensors(n.i, version, when, [&](const std::string& name) {
    std::optional<ByteSpan> got;
    for (const auto& entry : header->entries) {
      if (entry.info.name != name) continue;
      const uint64_t begin = header->data_section_offset + entry.data_begin;
      got = ByteSpan(bytes->data() + begin, entry.data_end - entry.data_begin);
    }
    return got;
  });
}

void Run::CheckSnapshotDisk(const Node& n, const Digest128& version, const char* when) {
  codec::Manifest manifest;
  auto store = relay::SnapshotStore::OpenCommitted(n.dir, kPartitionBytes, 1, manifest);
  if (!store.ok()) {
    Fail(fmt::format("{} ({}): its snapshot and chain do not rebuild its version: {}", Name(n.i),
                     when, store.status().ToString()));
    return;
  }
  if (manifest.VersionId() != version) {
    Fail(fmt::format("{} ({}): its snapshot and chain rebuild version {}, not {}", Name(n.i), when,
                     manifest.VersionId().ShortHex(), version.ShortHex()));
    return;
  }
  const apply::WeightStore& rebuilt = **store;
  CheckTensors(n.i, version, when, [&](const std::string& name) {
    std::optional<ByteSpan> bytes;
    for (size_t k = 0; k < rebuilt.tensors().size(); ++k) {
      if (rebuilt.tensors()[k].name == name) bytes = rebuilt.TensorData(k);
    }
    return bytes;
  });
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
  fs::path file = nodes_[1].dir / "model.safetensors";
  if (o_.sabotage_snapshot) {
    // The current snapshot's file (the pointer: "snapshot <hex>").
    auto pointer = ReadFile(nodes_[1].dir / apply::kStateDirName / "snapshot", 4096);
    if (!pointer.ok() || pointer->size() < 9 + 32) return;
    const std::string hex(AsChars(*pointer).substr(9, 32));
    file = nodes_[1].dir / apply::kStateDirName / "snapshots" / hex / "model.safetensors";
  }
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
  q_.Note(o_.sabotage_snapshot
              ? "sabotage: one byte of n1's snapshot changed behind its store"
              : "sabotage: one byte of n1's store changed behind the engine's back");
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
    if (IsSnapshotNode(i)) CheckBytes(n, last, "at the end, served");
    StopNode(n, "stop");
    CheckBytes(n, last, "at the end");
    if (IsSnapshotNode(i)) {
      auto inflight = apply::CheckpointState(n.dir).ReadInflight();
      if (!inflight.ok() || *inflight) {
        Fail(Name(i) + " journal at the end has a delta in flight (or cannot be read)");
      }
      continue;
    }
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

}  // namespace deltacast::sim::internal

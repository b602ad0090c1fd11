// deltacast_bench_store: what a node's checkpoint store writes to disk per refit,
// in place against a snapshot store (relay/store/snapshot_store.h), and how long a refit
// cycle takes on each against the same store on tmpfs.
//
// One source and one leaf in this process (in-process transport). The leaf's store
// is a checkpoint directory of --model-mib MiB of BF16 tensors; each refit changes
// --change-percent of the elements by one unit. Per refit it measures: the publish
// (BEGIN to every node decided), the wait for the store's write-back (in place: the
// next refit's BEGIN would wait for it), and the bytes this process caused to be
// written to storage (/proc/self/io write_bytes: the leaf's spool, journal, manifest,
// the chain, and an in-place store's dirty pages; the source spools on tmpfs, which
// is not counted). A snapshot store's snapshot build runs once at the end, measured
// apart, and is amortised over the refits the default policy puts between two.
//
// Usage: deltacast_bench_store [--model-mib N] [--refits N] [--change-percent P]
//        [--disk-dir DIR] [--tmpfs-dir DIR] [--json]
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/safetensors.h"
#include "bench/bench_util.h"
#include "codec/manifest.h"
#include "relay/store/snapshot_store.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "topology/cluster_config.h"
#include "transport/inproc/inproc_transport.h"

namespace dc = deltacast;
namespace fs = std::filesystem;
using dc::bench::Check;
using json = nlohmann::json;

namespace {

constexpr char kToken[] = "bench-store";
constexpr uint64_t kTensorBytes = uint64_t{64} << 20;

constexpr char kConfig[] = R"(
[cluster]
name = "bench-store"
[tree]
fanout = 1
chunk_size = "4MiB"
window = 8
connect_timeout = "30s"
idle_timeout = "60s"
commit_timeout = "300s"
[[node]]
id = "src"
host = "mem"
port = 1
role = "source"
[[node]]
id = "leaf"
host = "mem"
port = 2
role = "receiver"
)";

uint64_t WriteBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return 0;
}

// The model: tensors of kTensorBytes, one version in memory at a time.
struct Model {
  std::vector<dc::TensorSpec> table;
  std::vector<std::vector<std::byte>> bytes;
};

Model MakeModel(uint64_t mib) {
  Model m;
  const uint64_t tensors = std::max<uint64_t>(1, (mib << 20) / kTensorBytes);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < tensors; ++i) {
    m.table.push_back(
        {"layer" + std::to_string(1000 + i) + ".weight", dc::DType::kBF16, {kTensorBytes / 2}});
    std::vector<std::byte> b(kTensorBytes);
    for (size_t at = 0; at < b.size(); at += 8) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      std::memcpy(b.data() + at, &state, 8);
    }
    m.bytes.push_back(std::move(b));
  }
  return m;
}

// The next step: `percent` of the elements one unit apart (the same for every mode).
void Step(Model& m, double percent, uint64_t seed) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  const auto threshold = static_cast<uint64_t>(percent / 100.0 * double(UINT32_MAX));
  for (auto& t : m.bytes) {
    for (size_t e = 0; e < t.size(); e += 2) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      if ((state & 0xffffffff) < threshold) t[e] ^= std::byte{1};
    }
  }
}

std::unique_ptr<dc::apply::WeightStore> Borrow(Model& m) {
  std::vector<std::pair<dc::TensorSpec, dc::MutableByteSpan>> spans;
  for (size_t i = 0; i < m.table.size(); ++i) spans.emplace_back(m.table[i], m.bytes[i]);
  return std::move(*dc::apply::HostStore::Borrow(std::move(spans)));
}

dc::codec::Manifest ManifestOf(const dc::apply::WeightStore& s) {
  return dc::codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, dc::codec::kDefaultPartitionBytes, 2);
}

struct Options {
  uint64_t model_mib = 1024;
  int refits = 5;
  double change_percent = 3;
  fs::path disk_dir = "/var/tmp/deltacast-bench-store";
  fs::path tmpfs_dir = "/dev/shm/deltacast-bench-store";
  bool json = false;
};

json RunMode(const Options& o, const std::string& name, const fs::path& root, bool snapshot) {
  const fs::path dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  Model model = MakeModel(o.model_mib);
  {
    auto writer = dc::apply::SafetensorsWriter::Create(dir / "model.safetensors", model.table);
    Check(writer.status(), "create checkpoint");
    for (const auto& t : model.bytes) Check((*writer)->Append(t), "write checkpoint");
    Check((*writer)->Finish(), "finish checkpoint");
  }
  ::sync();
  auto config = dc::topology::ParseClusterConfig(kConfig, "bench-store.toml");
  Check(config.status(), "config");
  auto network = std::make_shared<dc::transport::InprocNetwork>();
  const auto open_started = dc::bench::Clock::now();
  dc::relay::SnapshotStore::Opened opened;
  if (snapshot) {
    dc::relay::SnapshotPolicy policy;
    policy.background = false;  // built once at the end, measured apart
    auto s = dc::relay::SnapshotStore::Open(dir, dc::codec::kDefaultPartitionBytes, 0, policy);
    Check(s.status(), "open snapshot store");
    opened = std::move(*s);
  } else {
    auto r = dc::apply::Replica::OpenCheckpointDir(dir, dc::codec::kDefaultPartitionBytes, 0);
    Check(r.status(), "open store");
    opened.replica = std::move(*r);
  }
  const double open_seconds = dc::bench::Seconds(open_started);
  dc::relay::NodeAgentOptions agent_options;
  agent_options.config = *config;
  agent_options.node_id = "leaf";
  agent_options.token = kToken;
  agent_options.apply_threads = 2;
  agent_options.spool_dir = dir / dc::apply::kStateDirName / "spool";
  agent_options.snapshots = opened.store;
  auto agent = dc::relay::NodeAgent::Start(std::move(agent_options), std::move(opened.replica),
                                           dc::transport::MakeInprocTransport(network));
  Check(agent.status(), "start leaf");

  json refits = json::array();
  uint64_t total_written = 0, total_delta = 0;
  double total_cycle = 0;
  for (int k = 0; k < o.refits; ++k) {
    Model next = model;
    Step(next, o.change_percent, static_cast<uint64_t>(k + 1));
    auto base = Borrow(model);
    auto target = Borrow(next);
    const auto bm = ManifestOf(*base);
    const auto tm = ManifestOf(*target);
    dc::relay::PublishOptions publish;
    publish.config = *config;
    publish.token = kToken;
    publish.encode_threads = 2;
    publish.spool_dir = o.tmpfs_dir / "source-spool";
    const uint64_t io0 = WriteBytes();
    const auto started = dc::bench::Clock::now();
    auto report = dc::relay::Publish(publish, *base, bm, *target, tm,
                                     dc::transport::MakeInprocTransport(network));
    Check(report.status(), "publish");
    if (!report->committed) Check(dc::Status::Aborted(report->abort_reason), "publish");
    const double publish_seconds = dc::bench::Seconds(started);
    // In place, the next BEGIN waits for the write-back: part of the cycle.
    while ((*agent)->stats().store_unflushed)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const double cycle = dc::bench::Seconds(started);
    const uint64_t written = WriteBytes() - io0;
    total_written += written;
    total_delta += report->delta.delta_bytes;
    total_cycle += cycle;
    refits.push_back({{"delta_bytes", report->delta.delta_bytes},
                      {"disk_write_bytes", written},
                      {"write_over_delta", double(written) / double(report->delta.delta_bytes)},
                      {"publish_seconds", publish_seconds},
                      {"cycle_seconds", cycle}});
    model = std::move(next);
  }
  json out{{"mode", name},
           {"dir", dir.string()},
           {"open_seconds", open_seconds},
           {"refits", refits},
           {"mean_disk_write_bytes", total_written / uint64_t(o.refits)},
           {"mean_delta_bytes", total_delta / uint64_t(o.refits)},
           {"write_over_delta", double(total_written) / double(total_delta)},
           {"mean_cycle_seconds", total_cycle / o.refits}};
  if (opened.store) {
    // One snapshot at the last version, measured apart, amortised over the refits the
    // default policy lets the chain hold (by count, or by size: whichever comes first).
    const uint64_t io0 = WriteBytes();
    const auto started = dc::bench::Clock::now();
    Check(opened.store->BuildNow((*agent)->stats().version), "snapshot build");
    const double seconds = dc::bench::Seconds(started);
    const uint64_t written = WriteBytes() - io0;
    const double mean_delta = double(total_delta) / o.refits;
    const double by_size = double(dc::topology::kDefaultSnapshotChainPercent) / 100.0 *
                           double(o.model_mib << 20) / mean_delta;
    const double per =
        std::min<double>(dc::topology::kDefaultSnapshotEvery, std::max(1.0, by_size));
    out["snapshot"] = {{"disk_write_bytes", written},
                       {"seconds", seconds},
                       {"rate_limit_bytes_per_s", dc::topology::kDefaultSnapshotRate},
                       {"refits_between_snapshots_by_default", per},
                       {"amortised_bytes_per_refit", double(written) / per},
                       {"write_over_delta_with_snapshots",
                        (double(total_written) / o.refits + double(written) / per) / mean_delta}};
  }
  (*agent)->Stop();
  agent->reset();
  opened.store.reset();
  fs::remove_all(dir);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"What a node's checkpoint store writes per refit: in place vs snapshot + chain"};
  app.add_option("--model-mib", o.model_mib, "Model size in MiB (64 MiB tensors)");
  app.add_option("--refits", o.refits, "Refits per mode");
  app.add_option("--change-percent", o.change_percent, "Elements changed per refit (%)");
  app.add_option("--disk-dir", o.disk_dir, "A folder on the disk under test");
  app.add_option("--tmpfs-dir", o.tmpfs_dir, "A folder on tmpfs");
  app.add_flag("--json", o.json, "JSON only");
  CLI11_PARSE(app, argc, argv);
  fs::create_directories(o.tmpfs_dir);
  json modes = json::array();
  modes.push_back(RunMode(o, "in-place-disk", o.disk_dir, false));
  modes.push_back(RunMode(o, "snapshot-disk", o.disk_dir, true));
  modes.push_back(RunMode(o, "in-place-tmpfs", o.tmpfs_dir, false));
  fs::remove_all(o.tmpfs_dir);
  const double tmpfs = modes[2]["mean_cycle_seconds"].get<double>();
  json out{
      {"bench", "store"},
      {"model_bytes", o.model_mib << 20},
      {"change_percent", o.change_percent},
      {"refits", o.refits},
      {"modes", modes},
      {"snapshot_disk_cycle_over_tmpfs", modes[1]["mean_cycle_seconds"].get<double>() / tmpfs},
      {"in_place_disk_cycle_over_tmpfs", modes[0]["mean_cycle_seconds"].get<double>() / tmpfs}};
  // The 1T projection (README): 2 TB of BF16 on one 3 GB/s NVMe, with the disk bytes per
  // model byte measured here (a snapshot store's amortised snapshot included).
  constexpr double kModel = 2e12, kNvme = 3e9;
  const double model = double(o.model_mib << 20);
  const double in_place = modes[0]["mean_disk_write_bytes"].get<double>() / model;
  const json& snap = modes[1];
  const double snapshot = (snap["mean_disk_write_bytes"].get<double>() +
                           snap["snapshot"]["amortised_bytes_per_refit"].get<double>()) /
                          model;
  out["projection_1t_3gbps_nvme"] = {
      {"model_bytes", kModel},
      {"in_place_disk_seconds_per_refit", in_place * kModel / kNvme},
      {"snapshot_disk_seconds_per_refit", snapshot * kModel / kNvme},
      {"in_place_refits_per_hour_disk_bound", 3600 / (in_place * kModel / kNvme)},
      {"snapshot_refits_per_hour_disk_bound", 3600 / (snapshot * kModel / kNvme)}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

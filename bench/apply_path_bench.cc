// deltacast_bench_apply: one agent's whole refit path, against DESIGN.md's "Node
// apply" targets (>= 5 GB/s of checkpoint per core on a host-memory store; a refit
// with a disk-backed store <= 1.2 x the same refit with a memory store).
//
// A source in this process (a Publish over TCP on loopback, the version pair of
// `deltacast synth`) streams one 3 % step to one agent in a child process: the
// agent receives, verifies and spools each chunk, applies and verifies it, prepares
// and commits; then its store is written back (checkpoint stores). The agent's
// store is host memory (the base copied into HostStore buffers), a checkpoint
// directory on tmpfs, or one on disk, with 1 and 2 apply threads.
//
// Per run: the agent process's CPU seconds from ready to commit (so "GB/s per
// core" is checkpoint bytes over them: the source's CPU is not in it), the refit's
// wall time (BEGIN to the last outcome, and BEGIN to the agent's verified target),
// the write-back after the commit, and the agent's anonymous memory: at ready and
// its peak during the refit. Beyond the weights (anonymous for a host store,
// file-backed for a checkpoint directory) that is the apply path's own memory, and
// it is measured at two model sizes. Every run is checked bit-exact: the agent's
// store hashes to the target version.
//
// The serving pause (docs/serving.md): with --apply staged the agent checks the
// delta while it streams and writes it only at COMMIT; each run reports how long its
// weights were being written (pause_seconds: on-arrival, the first write to the
// commit; staged, the commit's write), next to the refit time and, for staged runs,
// the on-arrival run's write time of the same delta (the apply itself), for each
// delta kind (--modes fast,context).
//
// Usage: deltacast_bench_apply [--params 500M] [--small-params 125M] [--out FILE]
//   [--apply on-arrival,staged] [--modes fast,context]
// Prints one JSON document (and writes it to --out).
#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/synth.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "bench/bench_util.h"
#include "codec/manifest.h"
#include "common/file_util.h"
#include "common/log.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "topology/cluster_config.h"
#include "topology/units.h"
#include "transport/tcp/tcp_transport.h"

extern char** environ;

namespace dc = deltacast;
using deltacast::bench::Check;
namespace fs = std::filesystem;
using dc::bench::Clock;
using dc::bench::CpuSeconds;
using dc::bench::Seconds;
using nlohmann::json;

namespace {

constexpr char kToken[] = "apply-bench-token";

[[noreturn]] void Die(const std::string& what) {
  fmt::print(stderr, "apply bench: {}\n", what);
  std::exit(1);
}

std::string ConfigToml(int port, const std::string& chunk, const std::string& apply) {
  return fmt::format(
      "[cluster]\nname = \"apply-bench\"\n[tree]\nfanout = 1\nchunk_size = \"{}\"\nwindow = 8\n"
      "connect_timeout = \"20s\"\ncommit_timeout = \"120s\"\n"
      "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = {}\nrole = \"source\"\n"
      "[[node]]\nid = \"a1\"\nhost = \"127.0.0.1\"\nport = {}\nrole = \"receiver\"\n"
      "apply = \"{}\"\n",
      chunk, port, port + 1, apply);
}

// Anonymous resident memory of this process (heap, stacks: not the file-backed
// pages of a mapped checkpoint), from /proc/self/status.
uint64_t RssAnonBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

void Say(const json& j) {
  std::string line = j.dump() + "\n";
  (void)!::write(1, line.data(), line.size());
}

// ---- the agent, in a child process ----------------------------------------------

struct ChildArgs {
  std::string kind;  // host | dir
  fs::path store;    // host: the base checkpoint to copy in; dir: the store directory
  fs::path spool;
  fs::path config;
  size_t threads = 1;
};

int ChildMain(const ChildArgs& a) {
  dc::log::SetLevel(dc::log::Level::kWarn);
  auto toml = Check(dc::ReadFile(a.config, 1 << 20), "read config");
  auto config =
      Check(dc::topology::ParseClusterConfig(std::string(dc::AsChars(toml)), a.config.string()),
            "config");
  std::unique_ptr<dc::apply::Replica> replica;
  if (a.kind == "host") {
    auto src = Check(dc::apply::CheckpointDirStore::Open(
                         a.store, dc::apply::CheckpointDirStore::Access::kReadOnly),
                     "open base");
    auto host = Check(dc::apply::HostStore::CopyOf(*src), "copy base");
    replica = Check(
        dc::apply::Replica::ForStore(std::move(host), dc::codec::kDefaultPartitionBytes, a.threads),
        "replica");
  } else {
    replica = Check(dc::apply::Replica::OpenCheckpointDir(
                        a.store, dc::codec::kDefaultPartitionBytes, a.threads),
                    "replica");
  }
  dc::apply::Replica* raw_replica = replica.get();

  std::mutex mu;
  std::condition_variable cv;
  bool committed = false;
  double commit_cpu = 0;
  Clock::time_point commit_time;
  std::atomic<uint64_t> rss_peak{0};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling) {
      rss_peak = std::max<uint64_t>(rss_peak, RssAnonBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  dc::relay::NodeAgentOptions options;
  options.config = config;
  options.node_id = "a1";
  options.token = kToken;
  options.apply_threads = a.threads;
  options.spool_dir = a.spool;
  options.on_commit = [&](const dc::relay::CommitEvent&) {
    std::lock_guard lock(mu);
    commit_cpu = CpuSeconds();
    commit_time = Clock::now();
    committed = true;
    cv.notify_all();
  };
  auto agent = Check(dc::relay::NodeAgent::Start(std::move(options), std::move(replica),
                                                 Check(dc::transport::MakeTcpTransport(), "tcp")),
                     "agent");
  const uint64_t rss_ready = RssAnonBytes();
  rss_peak = rss_ready;
  const double cpu_ready = CpuSeconds();
  Say({{"ready", true}});
  {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::minutes(5), [&] { return committed; })) Die("no commit");
  }
  const uint64_t rss_refit_peak = rss_peak;
  // The write-back after the commit (checkpoint stores; nothing for host memory).
  while (agent->stats().store_unflushed && Seconds(commit_time) < 300)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const double flushed_after = Seconds(commit_time);
  const double cpu_flushed = CpuSeconds();
  sampling = false;
  sampler.join();
  std::string line;
  std::getline(std::cin, line);  // "stop"
  agent->Stop();
  const auto& store = raw_replica->store();
  const auto manifest = dc::codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); },
      dc::codec::kDefaultPartitionBytes, 2);
  Say({{"refit_cpu_seconds", commit_cpu - cpu_ready},
       {"write_back_cpu_seconds", cpu_flushed - commit_cpu},
       {"write_back_seconds", flushed_after},
       {"rss_anon_ready_bytes", rss_ready},
       {"rss_anon_peak_bytes", rss_refit_peak},
       {"store_version", manifest.VersionId().ToHex()}});
  return 0;
}

// ---- the parent -------------------------------------------------------------------

struct Model {
  fs::path base, target;
  uint64_t bytes = 0;
  dc::codec::Manifest base_manifest, target_manifest;
  // The versions as the source reads them: checkpoint directories for checkpoint
  // stores, host copies (no file layout) for a host-memory store.
  std::unique_ptr<dc::apply::WeightStore> base_dir, target_dir, base_host, target_host;
};

Model Synthesize(const fs::path& dir, uint64_t params, double rate) {
  Model m;
  m.base = dir / "step0";
  m.target = dir / "step1";
  if (!fs::exists(m.target / "model.safetensors.index.json")) {
    fs::remove_all(dir);
    dc::agent::SynthOptions synth;
    synth.out_dir = dir;
    synth.params = params;
    synth.steps = 1;
    synth.change_rate = rate;
    (void)Check(dc::agent::Synthesize(synth), "synth");
  }
  using Access = dc::apply::CheckpointDirStore::Access;
  for (auto [path, manifest] :
       {std::pair{m.base, &m.base_manifest}, {m.target, &m.target_manifest}}) {
    auto store = Check(dc::apply::CheckpointDirStore::Open(path, Access::kReadOnly), "open");
    *manifest = Check(dc::apply::CheckpointState(path).LoadOrComputeManifest(
                          *store, dc::codec::kDefaultPartitionBytes, 2),
                      "manifest");
  }
  m.bytes = m.base_manifest.TotalBytes();
  m.base_dir = Check(dc::apply::CheckpointDirStore::Open(m.base, Access::kReadOnly), "open base");
  m.target_dir =
      Check(dc::apply::CheckpointDirStore::Open(m.target, Access::kReadOnly), "open target");
  m.base_host = Check(dc::apply::HostStore::CopyOf(*m.base_dir), "copy base");
  m.target_host = Check(dc::apply::HostStore::CopyOf(*m.target_dir), "copy target");
  return m;
}

// A child agent: its stdin (we write "stop") and stdout (JSON lines).
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  int in = -1;
  json Next() {
    char* line = nullptr;
    size_t cap = 0;
    if (getline(&line, &cap, out) < 0) Die("the agent process ended early");
    json j = json::parse(line);
    free(line);
    return j;
  }
};

Child Spawn(const std::vector<std::string>& args) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) Die("pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  posix_spawn_file_actions_addclose(&actions, from_child[0]);
  std::vector<std::string> all = {"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ) != 0)
    Die("spawn the agent");
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  c.in = to_child[1];
  c.out = fdopen(from_child[0], "r");
  return c;
}

struct RunSpec {
  std::string store;  // host | tmpfs | disk
  size_t threads = 1;
  std::string apply = "on-arrival";  // | staged
  std::string mode = "fast";         // the delta's kind: fast | context
};

json RunOne(const Model& m, const RunSpec& spec, const fs::path& work, const fs::path& disk,
            const std::string& chunk, std::mt19937& rng) {
  const fs::path root = (spec.store == "disk" ? disk : work) / "run";
  fs::remove_all(root);
  fs::create_directories(root);
  fs::path store_dir = m.base;  // host: copied into memory by the child
  if (spec.store != "host") {
    store_dir = root / "store";
    fs::copy(m.base, store_dir, fs::copy_options::recursive);
  }
  // The store's pages start clean, as an agent's between refits.
  ::sync();
  const int port = std::uniform_int_distribution<int>(20000, 29000)(rng) * 2;
  const fs::path config_path = root / "cluster.toml";
  const std::string toml = ConfigToml(port, chunk, spec.apply);
  std::ofstream(config_path) << toml;
  auto config = Check(dc::topology::ParseClusterConfig(toml, "apply-bench"), "config");
  const fs::path spool =
      spec.store == "host" ? root / "spool" : store_dir / dc::apply::kStateDirName / "spool";
  Child child = Spawn({"--child", spec.store == "host" ? "host" : "dir", store_dir.string(),
                       spool.string(), config_path.string(), std::to_string(spec.threads)});
  if (!child.Next().value("ready", false)) Die("agent not ready");
  pid_t perf = -1;
  // APPLY_BENCH_PERF=FILE profiles the agent process during the refit (perf record).
  if (const char* perf_out = std::getenv("APPLY_BENCH_PERF")) {
    std::vector<std::string> args = {
        "perf",        "record", "-F",     "4000", "--call-graph",
        "dwarf,16384", "-o",     perf_out, "-p",   std::to_string(child.pid)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawnp(&perf, "perf", nullptr, nullptr, argv.data(), environ);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }

  const bool host = spec.store == "host";
  dc::relay::PublishOptions options;
  options.config = config;
  options.token = kToken;
  options.spool_dir = root / "source-spool";
  options.codec.mode =
      spec.mode == "context" ? dc::codec::CodecMode::kContext : dc::codec::CodecMode::kFast;
  auto published = dc::relay::Publish(options, host ? *m.base_host : *m.base_dir, m.base_manifest,
                                      host ? *m.target_host : *m.target_dir, m.target_manifest,
                                      Check(dc::transport::MakeTcpTransport(), "tcp"));
  if (!published.ok() || !published->committed || published->nodes.size() != 1) {
    ::kill(child.pid, SIGKILL);
    Die("not committed: " +
        (published.ok() ? published->abort_reason : published.status().ToString()));
  }
  const dc::relay::PublishReport& report = *published;
  if (perf > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(perf, SIGINT);
    waitpid(perf, nullptr, 0);
  }
  (void)!::write(child.in, "stop\n", 5);
  const json agent = child.Next();
  int status = 0;
  waitpid(child.pid, &status, 0);
  fclose(child.out);
  close(child.in);
  const bool bit_exact =
      agent.value("store_version", "") == report.target_version.ToHex() && status == 0;
  if (!bit_exact) Die(spec.store + ": the agent's store is not at the target version");
  fs::remove_all(root);

  const double cpu = agent["refit_cpu_seconds"].get<double>();
  const double gb = double(m.bytes) / 1e9;
  const uint64_t weights_anon = spec.store == "host" ? m.bytes : 0;
  const uint64_t peak = agent["rss_anon_peak_bytes"].get<uint64_t>();
  const dc::relay::NodeReport& node = report.nodes[0];
  return {{"store", spec.store},
          {"apply_threads", spec.threads},
          {"apply", spec.apply},
          {"delta_kind", spec.mode},
          {"pause_seconds", node.pause_seconds},
          {"prepared_hold_seconds", node.hold_seconds},
          {"agent_write_seconds", node.write_seconds},
          {"agent_check_seconds", node.check_seconds},
          {"checkpoint_bytes", m.bytes},
          {"delta_bytes", report.delta.delta_bytes},
          {"chunks", report.delta.chunks},
          {"agent_cpu_seconds", cpu},
          {"gb_per_s_per_core", gb / cpu},
          {"refit_seconds", report.seconds},
          {"agent_verified_seconds", report.nodes[0].apply_seconds},
          {"source_stream_seconds", report.stream_seconds},
          {"gb_per_s_wall", gb / report.seconds},
          {"write_back_seconds_after_commit", agent["write_back_seconds"]},
          {"rss_anon_ready_bytes", agent["rss_anon_ready_bytes"]},
          {"rss_anon_peak_bytes", peak},
          {"rss_anon_beyond_weights_peak_bytes", peak > weights_anon ? peak - weights_anon : 0},
          {"bit_exact", bit_exact}};
}

const json* Find(const json& runs, const std::string& store, size_t threads, uint64_t bytes,
                 const std::string& apply = "on-arrival", const std::string& mode = "fast") {
  for (const auto& r : runs) {
    if (r["store"] == store && r["apply_threads"] == threads && r["checkpoint_bytes"] == bytes &&
        r["apply"] == apply && r["delta_kind"] == mode)
      return &r;
  }
  return nullptr;
}

// What an engine stops for, per store and delta kind: on-arrival against staged.
json PauseSummary(const json& runs, size_t threads, uint64_t bytes) {
  json out = json::object();
  for (const auto& staged : runs) {
    if (staged["apply"] != "staged" || staged["apply_threads"] != threads ||
        staged["checkpoint_bytes"] != bytes)
      continue;
    const std::string store = staged["store"], mode = staged["delta_kind"];
    json s{{"staged_pause_seconds", staged["pause_seconds"]},
           {"staged_refit_seconds", staged["refit_seconds"]},
           {"staged_pause_over_refit",
            staged["pause_seconds"].get<double>() / staged["refit_seconds"].get<double>()}};
    if (const json* arrival = Find(runs, store, threads, bytes, "on-arrival", mode)) {
      const double write = (*arrival)["agent_write_seconds"].get<double>();
      s["on_arrival_pause_seconds"] = (*arrival)["pause_seconds"];
      s["on_arrival_refit_seconds"] = (*arrival)["refit_seconds"];
      s["on_arrival_write_seconds"] = write;
      s["staged_pause_over_on_arrival_pause"] =
          staged["pause_seconds"].get<double>() / (*arrival)["pause_seconds"].get<double>();
      // Target: the pause is the apply itself (+ 10 %).
      s["staged_pause_over_apply_write"] = staged["pause_seconds"].get<double>() / write;
      s["meets_pause_le_apply_plus_10pct"] = staged["pause_seconds"].get<double>() <= 1.1 * write;
    }
    out[store + "_" + mode] = s;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--child") {
    return ChildMain({argv[2], argv[3], argv[4], argv[5], std::stoul(argv[6])});
  }
  CLI::App app{"One agent's whole refit path: host memory, tmpfs and disk stores"};
  std::string params_text = "500M", small_text = "125M", rate_text = "3%", chunk = "4MiB", out;
  fs::path work = "/dev/shm/deltacast-apply-bench";
  fs::path disk = "/var/tmp/deltacast-apply-bench";
  std::vector<std::string> stores = {"host", "tmpfs", "disk"};
  std::vector<size_t> threads = {1, 2};
  std::vector<std::string> applies = {"on-arrival"}, modes = {"fast"};
  int repeats = 1;
  bool keep = false;
  app.add_option("--params", params_text, "Model size (the demo's is 500M)")->capture_default_str();
  app.add_option("--small-params", small_text,
                 "Second model size, for memory beyond the weights (host and tmpfs stores; "
                 "0: none)")
      ->capture_default_str();
  app.add_option("--rate", rate_text, "Change rate of the step")->capture_default_str();
  app.add_option("--chunk", chunk, "Chunk size")->capture_default_str();
  app.add_option("--stores", stores, "Stores: host, tmpfs, disk")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--threads", threads, "Apply thread counts")->capture_default_str();
  app.add_option("--apply", applies, "Apply modes: on-arrival, staged")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--modes", modes, "Delta kinds (encoder modes): fast, context")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Runs per point; the one of median refit time is kept")
      ->capture_default_str();
  app.add_option("--work-dir", work, "tmpfs folder for the versions and tmpfs stores")
      ->capture_default_str();
  app.add_option("--disk-dir", disk, "Disk folder for the disk stores")->capture_default_str();
  app.add_flag("--keep", keep, "Keep the synthesized versions for the next run");
  app.add_option("--out", out, "Also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  dc::log::SetLevel(dc::log::Level::kWarn);
  const double rate = Check(dc::agent::ParseRate(rate_text), "--rate");
  std::mt19937 rng(std::random_device{}());

  json runs = json::array();
  auto measure = [&](const Model& m, const RunSpec& spec) {
    std::vector<json> tries;
    for (int r = 0; r < repeats; ++r) {
      tries.push_back(RunOne(m, spec, work, disk, chunk, rng));
      fmt::print(stderr,
                 "{:>6} {} thread(s) {:.2f} GB {} {}: {:.2f} GB/s/core, refit {:.3f} s, "
                 "pause {:.3f} s\n",
                 spec.store, spec.threads, double(m.bytes) / 1e9, spec.apply, spec.mode,
                 tries.back()["gb_per_s_per_core"].get<double>(),
                 tries.back()["refit_seconds"].get<double>(),
                 tries.back()["pause_seconds"].get<double>());
    }
    std::sort(tries.begin(), tries.end(), [](const json& a, const json& b) {
      return a["refit_seconds"].get<double>() < b["refit_seconds"].get<double>();
    });
    runs.push_back(tries[tries.size() / 2]);
  };
  const uint64_t params = Check(dc::agent::ParseParamCount(params_text), "--params");
  const Model big = Synthesize(work / ("model-" + params_text), params, rate);
  for (const auto& store : stores) {
    for (size_t t : threads) {
      for (const auto& mode : modes) {
        for (const auto& apply : applies) measure(big, {store, t, apply, mode});
      }
    }
  }
  std::optional<Model> small;
  if (small_text != "0") {
    const uint64_t small_params = Check(dc::agent::ParseParamCount(small_text), "--small-params");
    small = Synthesize(work / ("model-" + small_text), small_params, rate);
    for (const std::string store : {"host", "tmpfs"}) measure(*small, {store, 1});
  }

  json summary = json::object();
  for (size_t t : threads) {
    const json* host = Find(runs, "host", t, big.bytes);
    const json* tmpfs = Find(runs, "tmpfs", t, big.bytes);
    const json* disk_run = Find(runs, "disk", t, big.bytes);
    json s;
    if (host) {
      s["host_gb_per_s_per_core"] = (*host)["gb_per_s_per_core"];
      s["host_meets_5_gb_per_s_per_core"] = (*host)["gb_per_s_per_core"].get<double>() >= 5.0;
    }
    auto ratio = [](const json* a, const json* b) {
      return (*a)["refit_seconds"].get<double>() / (*b)["refit_seconds"].get<double>();
    };
    if (disk_run && host) {
      s["disk_over_host_refit"] = ratio(disk_run, host);
      s["disk_over_host_meets_1_2"] = ratio(disk_run, host) <= 1.2;
    }
    if (disk_run && tmpfs) s["disk_over_tmpfs_refit"] = ratio(disk_run, tmpfs);
    if (tmpfs && host) s["tmpfs_over_host_refit"] = ratio(tmpfs, host);
    const json pauses = PauseSummary(runs, t, big.bytes);
    if (!pauses.empty()) s["serving_pause"] = pauses;
    summary[fmt::format("threads_{}", t)] = s;
  }
  if (small) {
    json mem = json::object();
    for (const std::string store : {"host", "tmpfs"}) {
      const json* a = Find(runs, store, 1, small->bytes);
      const json* b = Find(runs, store, 1, big.bytes);
      if (!a || !b) continue;
      mem[store] = {
          {"small_checkpoint_bytes", small->bytes},
          {"small_beyond_weights_peak_bytes", (*a)["rss_anon_beyond_weights_peak_bytes"]},
          {"large_checkpoint_bytes", big.bytes},
          {"large_beyond_weights_peak_bytes", (*b)["rss_anon_beyond_weights_peak_bytes"]}};
    }
    summary["memory_beyond_weights"] = mem;
  }
  json doc = {{"benchmark", "apply_path"},
              {"command", "build/bin/deltacast_bench_apply"},
              {"cores", std::thread::hardware_concurrency()},
              {"change_rate", rate},
              {"chunk", chunk},
              {"runs", runs},
              {"summary", summary}};
  if (!keep) {
    fs::remove_all(work);
  }
  fs::remove_all(disk);
  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}

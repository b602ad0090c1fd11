#include "bench/relay_forward.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "apply/host_store.h"
#include "apply/replica.h"
#include "bench/bench_util.h"
#include "bench/fanout_cluster.h"
#include "bench/thread_cpu.h"
#include "codec/delta_encoder.h"
#include "common/parallel.h"
#include "relay/store/spool.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "relay/wire/protocol.h"
#include "tests/relay/tree/scripted_child.h"
#include "topology/cluster_config.h"
#include "transport/factory.h"

extern char** environ;

namespace dc = deltacast;
using nlohmann::json;

namespace deltacast::bench::fanout {
namespace {

constexpr char kToken[] = "relay-forward-bench-token";

// ---- iperf3 -----------------------------------------------------------------------

// A child process started by this benchmark (iperf3 -s), stopped by its pid.
struct ChildProcess {
  pid_t pid = -1;
  ~ChildProcess() { Reap(); }
  void Reap() {
    if (pid <= 0) return;
    const pid_t child = pid;
    pid = -1;
    // iperf3 -s -1 exits after one test; a server that never got its client is killed.
    for (int i = 0; i < 50; ++i) {
      if (waitpid(child, nullptr, WNOHANG) == child) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(child, SIGTERM);
    waitpid(child, nullptr, 0);
  }
};

// CPU seconds of this process's children that have exited and been waited for
// (their own waited-for children included: iperf3 -c under popen's shell).
double ChildrenCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

}  // namespace

json RunIperf(int seconds, int streams, std::mt19937& rng) {
  if (std::system("command -v iperf3 >/dev/null 2>&1") != 0) {
    return {{"available", false}, {"note", "iperf3 not installed; relay throughput has no peer"}};
  }
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string port = std::to_string(std::uniform_int_distribution<int>(30000, 60000)(rng));
    const double children_cpu0 = ChildrenCpuSeconds();
    ChildProcess server;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> args = {"iperf3", "-s", "-1", "-p", port};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawnp(&server.pid, "iperf3", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return {{"available", false}, {"note", "cannot start iperf3 -s"}};
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::string cmd = fmt::format("iperf3 -c 127.0.0.1 -p {} -t {} -P {} -J 2>/dev/null",
                                        port, seconds, std::max(1, streams));
    FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) return {{"available", false}, {"note", "cannot run iperf3 -c"}};
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    pclose(pipe);
    const json doc = json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.contains("end") || !doc["end"].contains("sum_received"))
      continue;
    const double bps = doc["end"]["sum_received"]["bits_per_second"].get<double>();
    json j = {{"available", true},
              {"seconds", seconds},
              {"streams", std::max(1, streams)},
              {"bits_per_second", bps},
              {"bytes_per_second", bps / 8}};
    if (doc["end"].contains("cpu_utilization_percent"))
      j["cpu_utilization_percent"] = doc["end"]["cpu_utilization_percent"];
    // Both ends' CPU per GB received, from the kernel's accounting of the two
    // processes once they exited (iperf3's own percentages came out far below it
    // here): two socket copies per byte, the client's send and the server's receive.
    server.Reap();
    const double cpu = ChildrenCpuSeconds() - children_cpu0;
    const double bytes = doc["end"]["sum_received"].value("bytes", 0.0);
    j["cpu_seconds"] = cpu;
    j["cores_used"] = cpu / doc["end"]["sum_received"].value("seconds", double(seconds));
    if (bytes > 0) j["cpu_seconds_per_gb"] = cpu / (bytes / 1e9);
    return j;
  }
  return {{"available", false}, {"note", "iperf3 ran but gave no result (port in use?)"}};
}

namespace {

// ---- the delta, encoded once ------------------------------------------------------

// Every CHUNK message of the delta zero -> target, as the source streams them: the
// encoder's cost is paid before the clock starts, so the source only copies, spools
// and sends (the relay, not the encoder, is what is measured).
struct EncodedDelta {
  std::vector<std::vector<std::byte>> messages;
  dc::codec::DeltaStats stats;
  uint64_t wire_bytes = 0;
};

EncodedDelta Encode(const Checkpoint& base, const Checkpoint& target, uint64_t chunk_bytes) {
  EncodedDelta d;
  dc::codec::DeltaEncoderOptions options;
  options.chunk_bytes = chunk_bytes;
  Check(
      dc::codec::EncodeDelta(
          base.manifest, target.manifest, [&](size_t i) { return base.store->TensorData(i); },
          [&](size_t i) { return target.store->TensorData(i); }, target.store->LayoutId(), options,
          [&](std::vector<std::byte>&& chunk) {
            d.messages.push_back(dc::relay::EncodeChunk(chunk));
            d.wire_bytes += d.messages.back().size();
            return dc::Status::Ok();
          },
          &d.stats),
      "encode");
  return d;
}

// ---- one row ------------------------------------------------------------------------

struct Row {
  std::string name;
  bool relay = true;          // src -> n01 (NodeAgent) -> {n02, n03}; else src -> n01 (scripted)
  std::string spool_dir;      // the relay's
  bool staged_apply = false;  // [[node]] apply = "staged" on the relay
  std::string note;
};

std::string RowToml(const Row& row, const RelayForwardOptions& o, int base_port) {
  std::string toml = "[cluster]\nname = \"relay-forward-bench\"\n\n[tree]\n";
  toml += fmt::format("chunk_size = \"{}B\"\nwindow = {}\n", o.chunk_bytes, o.window);
  toml += "connect_timeout = \"20s\"\nidle_timeout = \"60s\"\ncommit_timeout = \"300s\"\n";
  toml += "default_uplink = \"10Gbit\"\n";
  auto node = [&](const std::string& id, int port, const char* role, const char* parent,
                  bool staged) {
    toml += fmt::format(
        "\n[[node]]\nid = \"{}\"\nhost = \"127.0.0.1\"\nport = {}\nregion = \"local\"\nrole = "
        "\"{}\"\n",
        id, port, role);
    if (parent) toml += fmt::format("parent = \"{}\"\n", parent);
    if (staged) toml += "apply = \"staged\"\n";
  };
  node("src", base_port, "source", nullptr, false);
  if (!row.relay) {
    node("n01", base_port + 1, "receiver", "src", false);
    return toml;
  }
  node("n01", base_port + 1, "receiver", "src", row.staged_apply);
  node("n02", base_port + 2, "receiver", "n01", false);
  node("n03", base_port + 3, "receiver", "n01", false);
  return toml;
}

std::unique_ptr<dc::transport::Transport> MakeLink(const RelayForwardOptions& o) {
  dc::transport::TransportOptions options;
  options.provider = o.provider;
  options.net_device = "lo";
  return Check(dc::transport::MakeTransport(o.transport, options), "transport");
}

struct RowResult {
  double forward_seconds = 0;  // the source's first chunk to every child holding END
  double prepare_seconds = 0;
  double seconds = 0;
  double cpu_seconds = 0;        // this process: the source and the children
  double relay_cpu_seconds = 0;  // the relay's process, start to stop
  uint64_t relay_peak_held_bytes = 0;
  bool committed = false;
  // The relay's CPU by phase (bench/thread_cpu.h): fork to listening (the harness
  // copies the base and builds the replica), the forwarding window (the source's
  // first chunk to the last child holding END), from there to the commit decided at
  // the source, and the rest (the harness's bit-exactness hash, stopping).
  double relay_setup_cpu_seconds = 0;
  double relay_window_cpu_seconds = 0;
  double relay_to_commit_cpu_seconds = 0;
  double relay_check_cpu_seconds = 0;
  std::map<std::string, double> relay_window_by_thread;
  // This process (the source, both children, the harness) over the same window.
  double local_window_cpu_seconds = 0;
  std::map<std::string, double> local_window_by_thread;
};

// Both processes' threads at one moment.
struct Samples {
  ThreadSample relay, local;
  static Samples Take(pid_t relay_pid) {
    return {relay_pid > 0 ? SampleThreads(relay_pid) : ThreadSample{}, SampleThreads(::getpid())};
  }
};

// Waits (on its own thread) until `child` holds every chunk up to END, and notes when.
struct ChildWatch {
  std::thread thread;
  std::atomic<bool> done{false};
  Clock::time_point at;
};

// What the relay's process says on its pipe: once started (or not: a port taken),
// then once it committed and checked its bytes.
struct RelayReport {
  int32_t started = 0;  // 1: listening; 0: cannot start (other ports are tried)
  int32_t bit_exact = 0;
  uint64_t peak_held_bytes = 0;
};

bool ReadAll(int fd, void* out, size_t n) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got, n -= static_cast<size_t>(got);
  }
  return true;
}

// The relay in a process of its own (as deployed, and so `perf record -p` profiles it
// alone). Forked before this process starts any thread of the row: the child builds
// its own agent. Returns the child's pid (the pipe's read end in `fd`), or -1.
pid_t ForkRelay(const dc::topology::ClusterConfig& config, const RelayForwardOptions& o,
                const std::filesystem::path& spool_dir, const Checkpoint& zero,
                const Checkpoint& target, int& fd) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) Die("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) Die("fork");
  if (pid > 0) {
    ::close(pipe_fds[1]);
    fd = pipe_fds[0];
    return pid;
  }
  ::close(pipe_fds[0]);
  const int out = pipe_fds[1];
  RelayReport report;
  auto say = [&] { (void)!::write(out, &report, sizeof report); };
  auto store = Check(dc::apply::HostStore::CopyOf(*zero.store), "copy base");
  const dc::apply::WeightStore* relay_store = store.get();
  auto replica = Check(dc::apply::Replica::ForStore(std::move(store), zero.manifest.partition_bytes,
                                                    dc::DefaultThreadCount()),
                       "replica");
  dc::relay::NodeAgentOptions options;
  options.config = config;
  options.node_id = "n01";
  options.token = kToken;
  options.apply_threads = o.apply_threads;
  options.spool_dir = spool_dir;
  auto relay = dc::relay::NodeAgent::Start(std::move(options), std::move(replica), MakeLink(o));
  if (!relay.ok()) {
    say();
    ::_exit(0);
  }
  report.started = 1;
  say();
  const auto deadline = Clock::now() + std::chrono::minutes(5);
  while ((*relay)->stats().refits_committed == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto stats = (*relay)->stats();
  report.bit_exact = stats.refits_committed == 1 && stats.version == target.manifest.VersionId() &&
                     TensorHashes(*relay_store) == target.tensor_hashes;
  report.peak_held_bytes = stats.peak_held_bytes;
  (*relay)->Stop();
  say();
  ::_exit(0);
}

// `perf record -g` on the relay's process while it forwards (--forward-perf).
struct PerfRecord {
  pid_t pid = -1;
  PerfRecord(pid_t target, const std::string& out_file) {
    if (out_file.empty()) return;
    // Frame pointers by default; RELAY_FORWARD_PERF_DWARF=1 unwinds by DWARF (user
    // stacks through code built without frame pointers; much larger files).
    const char* dwarf = std::getenv("RELAY_FORWARD_PERF_DWARF");
    const std::string graph =
        dwarf && std::string(dwarf) == "1" ? "--call-graph=dwarf,16384" : "-g";
    std::vector<std::string> args = {"perf", "record", graph, "-q",
                                     "-o",   out_file, "-p",  std::to_string(target)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid, "perf", nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // perf attaches
  }
  void Stop() {
    if (pid <= 0) return;
    kill(pid, SIGINT);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~PerfRecord() { Stop(); }
};

RowResult RunRow(const Row& row, const RelayForwardOptions& o, const Checkpoint& zero,
                 const Checkpoint& target, const EncodedDelta& delta, std::mt19937& rng,
                 const std::string& perf_file) {
  for (int attempt = 1; attempt <= 8; ++attempt) {
    const int base_port = std::uniform_int_distribution<int>(30000, 32000)(rng);
    const auto config =
        Check(dc::topology::ParseClusterConfig(RowToml(row, o, base_port), "relay-forward.toml"),
              "config");
    const std::filesystem::path spool_root =
        (row.spool_dir.empty() ? std::filesystem::temp_directory_path()
                               : std::filesystem::path(row.spool_dir)) /
        fmt::format("deltacast-relay-forward-{}", getpid());
    const std::filesystem::path source_spool =
        std::filesystem::temp_directory_path() / fmt::format("deltacast-relay-src-{}", getpid());
    pid_t relay = -1;
    int relay_fd = -1;
    if (row.relay) {
      relay = ForkRelay(config, o, spool_root / "n01", zero, target, relay_fd);
      RelayReport started;
      if (!ReadAll(relay_fd, &started, sizeof started)) Die(row.name + ": the relay died");
      if (!started.started) {
        ::close(relay_fd);
        waitpid(relay, nullptr, 0);
        continue;  // a port taken: other ports
      }
    }
    const ThreadSample relay_started = relay > 0 ? SampleThreads(relay) : ThreadSample{};
    auto stop_relay = [&] {
      if (relay <= 0) return;
      kill(relay, SIGKILL);
      waitpid(relay, nullptr, 0);
      ::close(relay_fd);
      relay = -1;
    };
    std::vector<std::unique_ptr<dc::test_util::ScriptedChild>> children;
    bool ports_ok = true;
    for (const char* id :
         row.relay ? std::vector<const char*>{"n02", "n03"} : std::vector<const char*>{"n01"}) {
      auto child =
          dc::test_util::ScriptedChild::Start(config, id, kToken, dc::Digest128{}, MakeLink(o), {});
      if (!child.ok()) {
        ports_ok = false;
        break;
      }
      children.push_back(std::move(*child));
    }
    if (!ports_ok) {
      stop_relay();
      continue;
    }
    dc::relay::PublishOptions options;
    options.config = config;
    options.token = kToken;
    options.spool_dir = source_spool;
    auto source = dc::relay::Source::Start(options, MakeLink(o));
    if (!source.ok()) {
      stop_relay();
      continue;
    }
    for (auto& c : children) {
      if (!c->Wait([](const dc::test_util::ChildRecord& r) { return r.joins >= 1; },
                   std::chrono::seconds(20)))
        Die(row.name + ": a child did not join");
    }
    std::vector<std::unique_ptr<ChildWatch>> watches;
    // The window's end: sampled by the watch that sees the last child hold END.
    Samples at_end;
    std::atomic<size_t> watching{children.size()};
    for (auto& c : children) {
      auto w = std::make_unique<ChildWatch>();
      ChildWatch* raw = w.get();
      dc::test_util::ScriptedChild* child = c.get();
      w->thread = std::thread([raw, child, &at_end, &watching, relay] {
        raw->done = child->Wait([](const dc::test_util::ChildRecord& r) { return r.AllChunks(); },
                                std::chrono::minutes(5));
        raw->at = Clock::now();
        if (--watching == 0) at_end = Samples::Take(relay);
      });
      watches.push_back(std::move(w));
    }
    auto perf = std::make_unique<PerfRecord>(relay, row.relay ? perf_file : std::string());
    Clock::time_point first{};
    Samples at_first;
    const double cpu0 = CpuSeconds();
    auto report = (*source)->PublishStream(
        zero.manifest, target.manifest,
        [&](const dc::relay::Source::ChunkMessageSink& sink, dc::codec::DeltaStats* stats) {
          at_first = Samples::Take(relay);
          first = Clock::now();
          for (const auto& m : delta.messages) RETURN_IF_ERROR(sink(m));
          *stats = delta.stats;
          return dc::Status::Ok();
        },
        zero.store.get(), target.store.get());
    const ThreadSample relay_decided = relay > 0 ? SampleThreads(relay) : ThreadSample{};
    RowResult r;
    r.cpu_seconds = CpuSeconds() - cpu0;
    for (auto& w : watches) w->thread.join();
    perf->Stop();
    for (auto& w : watches) {
      if (!w->done) Die(row.name + ": a child did not get every chunk");
      r.forward_seconds =
          std::max(r.forward_seconds, std::chrono::duration<double>(w->at - first).count());
    }
    if (!report.ok()) Die(row.name + ": publish failed: " + report.status().ToString());
    r.committed = report->committed;
    if (!r.committed) Die(row.name + ": not committed: " + report->abort_reason);
    r.prepare_seconds = report->prepare_seconds;
    r.seconds = report->seconds;
    if (relay > 0) {
      // The relay applied what it forwarded: its bytes must be the target's.
      RelayReport done;
      if (!ReadAll(relay_fd, &done, sizeof done)) Die(row.name + ": the relay died");
      if (!done.bit_exact) Die(row.name + ": the relay does not hold the target's bytes");
      r.relay_peak_held_bytes = done.peak_held_bytes;
      int status = 0;
      rusage usage{};
      wait4(relay, &status, 0, &usage);
      ::close(relay_fd);
      relay = -1;
      auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
      r.relay_cpu_seconds = secs(usage.ru_utime) + secs(usage.ru_stime);
      if (relay_started.ok && at_first.relay.ok && at_end.relay.ok && relay_decided.ok) {
        r.relay_setup_cpu_seconds = relay_started.process_cpu_seconds;
        r.relay_window_cpu_seconds =
            at_end.relay.process_cpu_seconds - at_first.relay.process_cpu_seconds;
        r.relay_to_commit_cpu_seconds =
            relay_decided.process_cpu_seconds - at_end.relay.process_cpu_seconds;
        r.relay_check_cpu_seconds = r.relay_cpu_seconds - relay_decided.process_cpu_seconds;
        r.relay_window_by_thread = CpuByName(at_first.relay, at_end.relay);
      }
    }
    r.local_window_cpu_seconds =
        at_end.local.process_cpu_seconds - at_first.local.process_cpu_seconds;
    r.local_window_by_thread = CpuByName(at_first.local, at_end.local);
    (*source)->Stop();
    children.clear();
    std::error_code ignored;
    std::filesystem::remove_all(spool_root, ignored);
    std::filesystem::remove_all(source_spool, ignored);
    return r;
  }
  Die(row.name + ": no free ports after 8 attempts");
}

json RowJson(const Row& row, const RowResult& r, const EncodedDelta& delta, const json& iperf1,
             const json& iperf2, const std::vector<double>& samples) {
  const double per_child = double(delta.wire_bytes) / r.forward_seconds;
  json j = {
      {"row", row.name},
      {"topology", row.relay ? "src -> n01 (relay, NodeAgent) -> {n02, n03} (scripted)"
                             : "src -> n01 (scripted): no relay"},
      {"relay_spool", row.relay
                          ? (row.spool_dir.empty() ? std::filesystem::temp_directory_path().string()
                                                   : row.spool_dir)
                          : ""},
      {"relay_apply", row.relay ? (row.staged_apply ? "staged" : "on-arrival") : ""},
      // Which path the relay's spool appends took there (relay/store/spool.h).
      {"relay_spool_writes", !row.relay ? ""
                             : dc::relay::Spool::DirectWritesWork(
                                   row.spool_dir.empty() ? std::filesystem::temp_directory_path()
                                                         : std::filesystem::path(row.spool_dir))
                                 ? "direct (O_DIRECT)"
                                 : "buffered (page cache)"},
      {"note", row.note},
      {"wire_bytes", delta.wire_bytes},
      {"forward_seconds", r.forward_seconds},
      {"forward_seconds_samples", samples},
      {"forward_bytes_per_second_per_child", per_child},
      {"prepare_seconds", r.prepare_seconds},
      {"seconds", r.seconds},
      {"cpu_seconds", r.cpu_seconds},
      {"relay_cpu_seconds", r.relay_cpu_seconds},
      {"relay_cpu_seconds_per_gb_forwarded",
       row.relay ? r.relay_cpu_seconds / (double(delta.wire_bytes) / 1e9) : 0.0},
      {"relay_peak_held_bytes", r.relay_peak_held_bytes},
      {"committed", r.committed},
      {"bit_exact", row.relay}};
  if (iperf1.value("available", false)) {
    j["ratio_to_iperf3_one_stream"] = per_child / iperf1["bytes_per_second"].get<double>();
  }
  if (row.relay && r.relay_window_cpu_seconds > 0) {
    // Per GB forwarded (each child receives every byte once): the relay's CPU in the
    // forwarding window, in total and per thread (docs/architecture.md, "What one
    // relay's forwarding costs", says which thread does what).
    const double gb = double(delta.wire_bytes) / 1e9;
    j["relay_cpu_seconds_setup"] = r.relay_setup_cpu_seconds;
    j["relay_cpu_seconds_forwarding"] = r.relay_window_cpu_seconds;
    j["relay_cpu_seconds_forwarding_to_commit"] = r.relay_to_commit_cpu_seconds;
    j["relay_cpu_seconds_check_and_stop"] = r.relay_check_cpu_seconds;
    j["relay_cpu_seconds_per_gb_forwarding"] = r.relay_window_cpu_seconds / gb;
    json by_thread = json::object();
    double busiest = 0;
    for (const auto& [name, secs] : r.relay_window_by_thread) {
      if (secs <= 0) continue;
      by_thread[name] = secs / gb;
      busiest = std::max(busiest, secs / gb);
    }
    j["relay_cpu_seconds_per_gb_forwarding_by_thread"] = by_thread;
    // What one core given to the relay alone would forward at, its CPU per byte as
    // measured; and with a core per thread, the busiest thread's bound.
    j["relay_bytes_per_second_one_core"] = 1e9 / (r.relay_window_cpu_seconds / gb);
    if (busiest > 0) j["relay_bytes_per_second_one_core_per_thread"] = 1e9 / busiest;
    json local = json::object();
    for (const auto& [name, secs] : r.local_window_by_thread) {
      if (secs > 0) local[name] = secs / gb;
    }
    j["source_and_children_cpu_seconds_per_gb_forwarding"] = r.local_window_cpu_seconds / gb;
    j["source_and_children_cpu_seconds_per_gb_forwarding_by_thread"] = local;
    const double all = (r.relay_window_cpu_seconds + r.local_window_cpu_seconds) / gb;
    j["all_cpu_seconds_per_gb_forwarding"] = all;
    // Were every core of this machine busy with the bench alone, at that CPU per
    // byte, no faster per child than this; and as a fraction of one iperf3 stream.
    const double bound = double(dc::DefaultThreadCount()) * 1e9 / all;
    j["cpu_bound_bytes_per_second_per_child"] = bound;
    if (iperf1.value("available", false))
      j["cpu_bound_ratio_to_iperf3_one_stream"] = bound / iperf1["bytes_per_second"].get<double>();
  }
  if (row.relay && iperf2.value("available", false)) {
    // The relay's egress (two children) against two iperf3 streams.
    j["egress_ratio_to_iperf3_two_streams"] =
        2 * per_child / iperf2["bytes_per_second"].get<double>();
  }
  return j;
}

}  // namespace

json RelayForward(const RelayForwardOptions& o, std::mt19937& rng) {
  const uint64_t partition_bytes =
      std::min<uint64_t>(o.chunk_bytes, dc::codec::kDefaultPartitionBytes);
  fmt::print(stderr, "relay forward: {} B of random bytes, {} B chunks, window {}\n", o.bytes,
             o.chunk_bytes, o.window);
  const Checkpoint target = RandomCheckpoint(o.bytes, o.seed + 11, partition_bytes);
  const Checkpoint zero = ZeroCheckpoint(target.store->tensors(), partition_bytes);
  const EncodedDelta delta = Encode(zero, target, o.chunk_bytes);

  std::vector<Row> rows = {
      {"relay", true, o.spool_dir, false, "the measured row: spool on the disk, apply on arrival"}};
  if (o.diagnostics) {
    rows.push_back({"diagnostic_source_only", false, "", false,
                    "no relay: the source straight to one scripted child, the harness's ceiling "
                    "on this machine"});
    if (!o.tmpfs_dir.empty() && std::filesystem::is_directory(o.tmpfs_dir)) {
      rows.push_back({"diagnostic_spool_tmpfs", true, o.tmpfs_dir, false,
                      "the relay's spool on tmpfs: fdatasync costs nothing"});
    }
    rows.push_back({"diagnostic_apply_staged", true, o.spool_dir, true,
                    "the relay's apply deferred to the commit ([[node]] apply = \"staged\"): "
                    "forwarding without the apply competing for the cores"});
  }
  const json iperf1 = RunIperf(o.iperf_seconds, 1, rng);
  const json iperf2 = RunIperf(o.iperf_seconds, 2, rng);
  json results = json::array();
  for (const Row& row : rows) {
    std::vector<RowResult> runs;
    for (int i = 0; i < std::max(1, o.repeats); ++i)
      runs.push_back(RunRow(row, o, zero, target, delta, rng,
                            row.name == "relay" && i == 0 ? o.perf_file : std::string()));
    std::sort(runs.begin(), runs.end(),
              [](const auto& a, const auto& b) { return a.forward_seconds < b.forward_seconds; });
    std::vector<double> samples;
    for (const auto& r : runs) samples.push_back(r.forward_seconds);
    const RowResult& median = runs[runs.size() / 2];
    results.push_back(RowJson(row, median, delta, iperf1, iperf2, samples));
    fmt::print(stderr,
               "relay forward {:<24}: {:7.1f} MB/s per child ({:.2f} s, cpu {:.2f} s here, {:.2f} "
               "s relay, {:.2f} s of it forwarding)\n",
               row.name, double(delta.wire_bytes) / median.forward_seconds / 1e6,
               median.forward_seconds, median.cpu_seconds, median.relay_cpu_seconds,
               median.relay_window_cpu_seconds);
  }
  json j = {
      {"data", "random bytes from an all-zero base (literal records), encoded before the clock"},
      {"checkpoint_bytes", target.manifest.TotalBytes()},
      {"wire_bytes", delta.wire_bytes},
      {"chunk_bytes", o.chunk_bytes},
      {"chunks", delta.messages.size()},
      {"window", o.window},
      {"transport", o.transport},
      {"provider", o.provider},
      {"apply_threads", o.apply_threads},
      {"repeats", o.repeats},
      {"cores", dc::DefaultThreadCount()},
      {"forward_seconds_definition",
       "the source's first chunk handed to its sink to the last child holding every chunk up "
       "to END; forward_bytes_per_second_per_child = wire_bytes / forward_seconds"},
      // Socket copies per byte each child receives, counted from the topology: the
      // source's send, the relay's receive, its two sends, the children's two
      // receives; iperf3 does two (a send and a receive).
      {"socket_copies_per_forwarded_byte", 6},
      {"iperf3_socket_copies_per_byte", 2},
      {"iperf3_one_stream", iperf1},
      {"iperf3_two_streams", iperf2},
      {"rows", results}};
  if (!results.empty() && results[0].contains("ratio_to_iperf3_one_stream")) {
    j["ratio_to_iperf3_one_stream"] = results[0]["ratio_to_iperf3_one_stream"];
    j["meets_target"] = results[0]["ratio_to_iperf3_one_stream"].get<double>() >= 0.5;
  }
  return j;
}

}  // namespace deltacast::bench::fanout

// The object-store path against the relay tree on the same WAN hop: a source and a
// same-region node, and a two-node remote region (gateway eu1, eu2 below it), all in
// this process over tcp on loopback. The WAN is one deltacast_delay_proxy holding
// each direction --wan-ms (this kernel has no netem; no bandwidth limit: loopback).
//   tree:   eu1 dials the source through the proxy.
//   bucket: eu1 dials a bucket downlink (local, as on the gateway's host), which reads
//           an s3rver in the region; the uplink beside the source writes into it
//           through the proxy (the bucket's PUTs and polls cross the WAN).
// Per refit: the source's report (call to committed everywhere, to every node
// PREPARED), the delta's bytes, and the bytes that crossed the WAN (proxy counters).
// Every node's bytes are checked by hash against the target after each refit.
//
// Usage: deltacast_bench_bucket [--elements 4194304] [--refits 3] [--wan-ms 40]
//   [--chunk 256KiB] [--out bench/results/bucket.json]   (needs scripts/setup's s3rver)
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "codec/manifest.h"
#include "common/log.h"
#include "relay/bucket/bucket_bridge.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/source.h"
#include "tests/objstore/s3rver.h"
#include "tests/relay/bucket/bucket_versions.h"
#include "tests/temp_dir.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"

namespace dc = deltacast;
using deltacast::relay::bucket_test::Borrow;
using deltacast::relay::bucket_test::MakeVersions;
using deltacast::relay::bucket_test::Versions;
using nlohmann::json;

namespace {

constexpr char kToken[] = "bucket-bench";
constexpr uint64_t kPartitionBytes = 64 << 10;
const char* const kNodes[] = {"us1", "eu1", "eu2"};

// What must not outlive a failed run: the s3rver process (std::exit skips destructors).
dc::test_util::S3rver* g_server = nullptr;
pid_t g_proxy = -1;

[[noreturn]] void Die(const std::string& why) {
  std::cerr << why << "\n";
  if (g_server) g_server->Stop();
  if (g_proxy > 0) ::kill(g_proxy, SIGTERM);
  std::exit(1);
}

template <typename T>
T Check(dc::Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(*r);
}

struct Ports {
  // Below the ephemeral range (32768+), where s3rver and curl take their ports.
  int base = 21000 + static_cast<int>(::getpid() % 400) * 20;
  int src() const { return base; }
  int us1() const { return base + 1; }
  int bridge() const { return base + 2; }
  int eu1() const { return base + 3; }
  int eu2() const { return base + 4; }
  int wan_to_src() const { return base + 5; }
  int wan_to_bucket() const { return base + 6; }
};

std::string Node(const std::string& id, int port, const std::string& region, const char* role,
                 const std::string& parent) {
  return fmt::format(
      "[[node]]\nid = \"{}\"\nhost = \"127.0.0.1\"\nport = {}\nregion = \"{}\"\nrole = \"{}\"\n{}",
      id, port, region, role, parent.empty() ? "" : "parent = \"" + parent + "\"\n");
}

// [objstore] poll_max (--poll-max; "10ms", the poll, is polling without backoff).
std::string g_poll_max = "250ms";
int g_idle_seconds = 5;  // after the refits: the polls of idle bridges

// `src_port`: where this copy's nodes dial the source (the proxy, for eu1's copy).
std::string ClusterToml(bool bucket, const Ports& p, int src_port, const std::string& chunk,
                        const std::string& endpoint) {
  std::string t = fmt::format(
      "[cluster]\nname = \"bucket-bench\"\n[tree]\nfanout = 2\nchunk_size = \"{}\"\nwindow = 8\n"
      "connect_timeout = \"20s\"\ncommit_timeout = \"120s\"\n[security]\ntls = \"none\"\n"
      "[[region]]\nname = \"eu\"\nwan_bandwidth = \"1Gbit\"\nwan_latency = \"40ms\"\n",
      chunk);
  t += Node("src", src_port, "us", "source", "");
  t += Node("us1", p.us1(), "us", "receiver", "src");
  if (bucket) {
    t += Node("bucket-eu", p.bridge(), "eu", "receiver", "src");
    t += Node("eu1", p.eu1(), "eu", "receiver", "bucket-eu");
    t += fmt::format(
        "[objstore]\nendpoint = \"{}\"\nbucket = \"deltacast\"\nbridges = "
        "[\"bucket-eu\"]\npoll = \"10ms\"\npoll_max = \"{}\"\n",
        endpoint, g_poll_max);
  } else {
    t += Node("eu1", p.eu1(), "eu", "receiver", "src");
  }
  t += Node("eu2", p.eu2(), "eu", "receiver", "eu1");
  return t;
}

dc::topology::ClusterConfig Config(const std::string& toml) {
  return Check(dc::topology::ParseClusterConfig(toml, "bucket-bench.toml"), "config");
}

dc::codec::Manifest ManifestOf(const dc::apply::WeightStore& store) {
  return dc::codec::ComputeManifest(
      store.tensors(), [&](size_t i) { return store.TensorData(i); }, kPartitionBytes, 1);
}

std::unique_ptr<dc::transport::Transport> Tcp() {
  return Check(dc::transport::MakeTcpTransport(), "tcp transport");
}

// One deltacast_delay_proxy process; its byte counters are read when it stops.
class Proxy {
 public:
  Proxy(const std::string& binary, const std::vector<std::string>& maps, std::string stats)
      : stats_(std::move(stats)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<std::string> args = {binary};
      for (const auto& m : maps) {
        args.push_back("--map");
        args.push_back(m);
      }
      args.push_back("--stats");
      args.push_back(stats_);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    g_proxy = pid_;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  // Bytes forwarded, both directions, all maps.
  uint64_t Stop() {
    g_proxy = -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    std::ifstream in(stats_);
    json j = json::parse(in, nullptr, false);
    uint64_t total = 0;
    if (j.is_array()) {
      for (const auto& m : j)
        total += m.value("bytes_to_target", 0ull) + m.value("bytes_to_client", 0ull);
    }
    return total;
  }

 private:
  std::string stats_;
  pid_t pid_ = -1;
};

json Requests(const dc::objstore::RequestCounts& r) {
  return {{"get", r.get},      {"get_missing", r.get_missing},
          {"put", r.put},      {"list", r.list},
          {"head", r.head},    {"delete", r.del},
          {"total", r.Total()}};
}

json RunMode(bool bucket, Versions& v, int refits, int wan_ms, const std::string& chunk,
             const std::string& proxy_binary, dc::test_util::S3rver& s3, const std::string& tmp) {
  Ports p;
  if (bucket) p.base += 10;  // the tree mode's listeners may linger a moment
  const std::string s3_port = s3.endpoint().substr(s3.endpoint().rfind(':') + 1);
  Proxy proxy(proxy_binary,
              {fmt::format("127.0.0.1:{}=127.0.0.1:{}/{}", p.wan_to_src(), p.src(), wan_ms),
               fmt::format("127.0.0.1:{}=127.0.0.1:{}/{}", p.wan_to_bucket(), s3_port, wan_ms)},
              tmp + (bucket ? "/proxy-bucket.json" : "/proxy-tree.json"));
  const std::string local = s3.endpoint();
  const std::string across = fmt::format("http://127.0.0.1:{}", p.wan_to_bucket());
  auto config = Config(ClusterToml(bucket, p, p.src(), chunk, local));

  std::vector<std::vector<std::vector<std::byte>>> stores(3, v.v[0]);
  std::vector<std::unique_ptr<dc::relay::NodeAgent>> agents;
  for (int i = 0; i < 3; ++i) {
    dc::relay::NodeAgentOptions o;
    // eu1 reaches the source across the WAN (tree mode): its copy names the proxy.
    o.config =
        (!bucket && i == 1) ? Config(ClusterToml(false, p, p.wan_to_src(), chunk, local)) : config;
    o.node_id = kNodes[i];
    o.token = kToken;
    o.apply_threads = 1;
    auto replica = Check(
        dc::apply::Replica::ForStore(Borrow(v.tensors, stores[i]), kPartitionBytes, 1), "replica");
    agents.push_back(
        Check(dc::relay::NodeAgent::Start(std::move(o), std::move(replica), Tcp()), "agent"));
  }
  std::unique_ptr<dc::relay::BucketUplink> uplink;
  std::unique_ptr<dc::relay::BucketDownlink> downlink;
  if (bucket) {
    dc::relay::BucketBridgeOptions b;
    b.config = config;
    b.node_id = "bucket-eu";
    b.token = kToken;
    b.s3 = {
        .endpoint = across, .bucket = "deltacast", .access_key = "S3RVER", .secret_key = "S3RVER"};
    b.prefix = "bench";
    b.poll = config.objstore->poll;
    b.poll_max = config.objstore->poll_max;
    uplink = Check(dc::relay::BucketUplink::Start(b, Tcp()), "uplink");
    b.s3.endpoint = local;
    downlink = Check(dc::relay::BucketDownlink::Start(b, Tcp()), "downlink");
  }
  dc::relay::PublishOptions po;
  po.config = config;
  po.token = kToken;
  auto source = Check(dc::relay::Source::Start(std::move(po), Tcp()), "source");

  json runs = json::array();
  std::vector<double> seconds;
  std::vector<uint64_t> requests;
  for (int k = 0; k < refits; ++k) {
    auto base = Borrow(v.tensors, v.v[k]);
    auto target = Borrow(v.tensors, v.v[k + 1]);
    auto report =
        Check(source->Publish(*base, ManifestOf(*base), *target, ManifestOf(*target)), "publish");
    if (!report.committed) Die("refit did not commit: " + report.abort_reason);
    // Commits are reported to the source before every node's callback ran.
    for (int i = 0; i < 3; ++i) {
      for (int tries = 0; agents[i]->stats().version != report.target_version && tries < 500;
           ++tries)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      for (size_t t = 0; t < v.tensors.size(); ++t) {
        if (dc::Hash64(stores[i][t]) != dc::Hash64(v.v[k + 1][t])) {
          Die(std::string(kNodes[i]) + " is not at the target after refit " + std::to_string(k));
        }
      }
    }
    seconds.push_back(report.seconds);
    json run = {{"seconds", report.seconds},
                {"prepare_seconds", report.prepare_seconds},
                {"first_chunk_seconds", report.first_chunk_seconds},
                {"delta_bytes", report.delta.delta_bytes},
                {"chunks", report.delta.chunks}};
    if (uplink) {
      // Each half counts a refit's requests at its end (both before the source's
      // report), the polls since the refit before included.
      run["s3_requests"] = {{"uplink", Requests(uplink->stats().last_refit_requests)},
                            {"downlink", Requests(downlink->stats().last_refit_requests)}};
      requests.push_back(uplink->stats().last_refit_requests.Total() +
                         downlink->stats().last_refit_requests.Total());
    }
    runs.push_back(std::move(run));
  }
  // Between refits the bridges only poll: what that costs a second.
  json idle;
  if (uplink) {
    auto total = [&] {
      return uplink->stats().requests.Total() + downlink->stats().requests.Total();
    };
    const uint64_t before = total();
    std::this_thread::sleep_for(std::chrono::seconds(g_idle_seconds));
    idle = {{"seconds", g_idle_seconds},
            {"s3_requests_per_second", double(total() - before) / g_idle_seconds}};
  }
  source->Stop();
  if (uplink) uplink->Stop();
  if (downlink) downlink->Stop();
  for (auto& a : agents) a->Stop();
  const uint64_t wan = proxy.Stop();
  std::sort(seconds.begin(), seconds.end());
  json out = {{"refits", runs},
              {"median_seconds", seconds[seconds.size() / 2]},
              {"wan_bytes", wan},
              {"wan_bytes_per_refit", wan / static_cast<uint64_t>(refits)}};
  if (uplink) {
    const auto s = uplink->stats();
    out["uplink"] = {{"objects_written", s.objects_written},
                     {"bytes_written", s.bytes_written},
                     {"retries", s.retries}};
    const auto d = downlink->stats();
    out["downlink"] = {{"objects_read", d.objects_read}, {"bytes_read", d.bytes_read}};
    out["uplink"]["s3_requests"] = Requests(s.requests);
    out["downlink"]["s3_requests"] = Requests(d.requests);
    std::sort(requests.begin(), requests.end());
    out["median_s3_requests_per_refit"] = requests[requests.size() / 2];
    out["idle"] = idle;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The object-store path against the relay tree over one delayed WAN hop"};
  uint64_t elements = 4 << 20;
  int refits = 3, wan_ms = 40, rate = 3;
  std::string chunk = "256KiB", out_path;
  app.add_option("--elements", elements, "BF16 elements per tensor (3 tensors)");
  app.add_option("--refits", refits, "Refits per mode");
  app.add_option("--wan-ms", wan_ms, "One-way WAN latency (each direction)");
  app.add_option("--rate", rate, "Percent of elements changed per step");
  app.add_option("--chunk", chunk, "Chunk size");
  app.add_option("--out", out_path, "Also write the JSON here");
  app.add_option("--poll-max", g_poll_max, "[objstore] poll_max (10ms: no backoff)");
  app.add_option("--idle-seconds", g_idle_seconds, "Idle time measured after the refits")
      ->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  if (!dc::test_util::S3rver::Available()) {
    std::cerr << dc::test_util::S3rver::kSkipMessage << "\n";
    return 77;
  }
  dc::log::SetLevel(dc::log::Level::kWarn);
  dc::test_util::TempDir tmp("bucket-bench");
  dc::test_util::S3rver s3(tmp.path() / "s3");
  g_server = &s3;
  if (!s3.Start()) {
    std::cerr << "s3rver did not start\n";
    return 1;
  }
  {
    auto client = Check(dc::objstore::S3Client::Create({.endpoint = s3.endpoint(),
                                                        .bucket = "deltacast",
                                                        .access_key = "S3RVER",
                                                        .secret_key = "S3RVER"}),
                        "s3");
    if (dc::Status s = client->CreateBucket(); !s.ok()) Die(s.ToString());
  }
  const std::string proxy =
      (std::filesystem::path(argv[0]).parent_path() / "deltacast_delay_proxy").string();
  Versions v = MakeVersions(elements, refits + 1, /*seed=*/7, rate);
  json out = {
      {"bench", "bucket_vs_tree"},
      {"model_bytes", elements * 2 * 3},
      {"rate_percent", rate},
      {"wan_ms", wan_ms},
      {"chunk", chunk},
      {"server", "s3rver 3.7.1 on loopback"},
      {"command", fmt::format("build/bin/deltacast_bench_bucket --elements {} --refits {} "
                              "--wan-ms {} --rate {} --chunk {} --poll-max {} --idle-seconds {}",
                              elements, refits, wan_ms, rate, chunk, g_poll_max, g_idle_seconds)},
      {"poll", "10ms"},
      {"poll_max", g_poll_max}};
  out["tree"] = RunMode(false, v, refits, wan_ms, chunk, proxy, s3, tmp.path().string());
  out["bucket"] = RunMode(true, v, refits, wan_ms, chunk, proxy, s3, tmp.path().string());
  const std::string text = out.dump(2);
  std::cout << text << "\n";
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

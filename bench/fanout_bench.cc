// deltacast_bench_fanout: the relay tree over real TCP on loopback, with every
// link paced to a fixed rate, against the limits DESIGN.md sets ("Relay").
//
// One process runs a Publisher and N NodeAgents, each with its own TCP transport
// wrapped by the fault transport's bandwidth cap, and in-memory HostStores. The
// weights are simulated BF16 training steps (bench/realistic_step.h) at several
// change rates. For every scenario (star, chain, planner tree, fanout-2 tree; a
// delta refit or a full-checkpoint transfer) a fresh cluster refits once and every
// receiver's tensors are hashed against the target: a mismatch aborts the run.
//
// Uplink model. The fault wrapper paces each connection on its own; it has no cap
// shared by a transport's connections. A node's real uplink is shared by its
// children, so by default ("shared") a node with k children gets each child link
// capped at rate / k: the same total uplink, split fairly, which is also what the
// planner's model assumes. "per_connection" caps every link at the full rate
// whatever the fanout, which overstates the uplink of any node with k > 1 children
// (a star's source by N times); it is run for comparison.
//
// Each scenario runs --repeats times on fresh clusters and the median run is kept.
// A link-bound check repeats the largest N on slower links with small chunks:
// the regime of DESIGN.md's 1.2x target (a delta of hundreds of chunks on links
// slow enough that per-hop processing is small beside the transfer), which a
// 50 MB model at 200 Mbit/s does not reach.
//
// --relay-throughput adds an uncapped source -> n01 -> n02 chain moving a large
// full checkpoint, next to a single iperf3 stream on the same loopback and to the
// source's encoder alone on the same pair.
//
// Striped trees (issue 31 parts 3-4; docs/protocol.md, "Stripes"): at the summary
// rate every N > 1 also runs the planner's trees with `[tree] stripes = S` for each S
// of --stripes ("striped(S)"), and so does the link-bound check, whose summary holds
// "stripedS_N_over_single" against the 1.1 x target. Every run reports each
// node's upload per refit (bytes of the CHUNK messages it sent) over the delta's
// size, "upload_share": a single tree's interior nodes send k copies and its leaves
// none; striped, about one each. "summary.upload_share" sets the planner's single
// tree beside the striped trees at the largest N. The planner's default ("auto") is
// one stripe here, as the cluster has no sender nodes ("planner_default_stripes").
//
// --relay-forward measures one relay's forwarding path alone (bench/relay_forward.h):
// a pre-encoded delta from the source to ONE relay that forwards it to two children,
// next to iperf3 with one and two streams.
//
// Prints one JSON document (and writes it to --out).
#include <fmt/core.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/synth.h"
#include "apply/host_store.h"
#include "apply/replica.h"
#include "bench/bench_util.h"
#include "bench/fanout_cluster.h"
#include "bench/realistic_step.h"
#include "bench/relay_forward.h"
#include "codec/delta_encoder.h"
#include "codec/manifest.h"
#include "common/log.h"
#include "common/parallel.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "topology/cluster_config.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "topology/units.h"
#include "transport/factory.h"
#include "transport/fault_transport.h"

namespace dc = deltacast;
using deltacast::bench::Check;
using deltacast::bench::Clock;
using deltacast::bench::CpuSeconds;
using deltacast::bench::Seconds;
using nlohmann::json;

namespace {

using namespace deltacast::bench::fanout;

// ---- options -------------------------------------------------------------

struct BenchOptions {
  uint64_t params = 0;
  std::vector<double> rates;        // for N below large_n
  std::vector<double> large_rates;  // for N >= large_n
  int large_n = 15;
  std::vector<int> receivers;
  double link_bytes_per_second = 0;
  uint64_t chunk_bytes = 0;
  uint64_t partition_bytes = 0;
  int window = 8;
  double summary_rate = 0;
  bool full = true;
  std::vector<int> full_receivers;
  int per_connection_n = 0;  // N that also runs the per-connection uplink model; 0 = none
  bool link_bound = true;
  double link_bound_bytes_per_second = 0;
  uint64_t link_bound_chunk_bytes = 0;
  uint64_t link_bound_partition_bytes = 0;
  int repeats = 3;
  std::vector<int> stripes = {2, 4};  // the striped runs' [tree] stripes (values > 1)
  size_t encode_threads = 0;
  size_t apply_threads = 1;
  uint64_t seed = 1;
  // --relay-throughput
  bool relay_throughput = false;
  bool fanout = true;
  uint64_t relay_bytes = 0;
  uint64_t relay_chunk_bytes = 0;
  int iperf_seconds = 3;
  std::string transport = "tcp";
  std::string provider;
  // --relay-forward
  bool relay_forward = false;
  RelayForwardOptions forward;
};

// The parameters every scenario takes from the command line as they are.
ClusterParams CommonParams(const BenchOptions& o) {
  ClusterParams p;
  p.window = o.window;
  p.encode_threads = o.encode_threads;
  p.apply_threads = o.apply_threads;
  p.transport = o.transport;
  p.provider = o.provider;
  return p;
}

// ---- the scenario matrix -----------------------------------------------------

// The fanout the planner would use for `s` (without starting anything).
int PlannedFanout(const Scenario& s, const ClusterParams& p) {
  const auto config =
      Check(dc::topology::ParseClusterConfig(
                ConfigToml(s.receivers, s.fanout.value_or(0), 40000, p), "fanout-bench.toml"),
            "config");
  return Check(dc::topology::PlanTree(config), "plan").fanout_used;
}

// The planner's striped trees for N receivers ([tree] stripes = S).
Scenario Striped(int n, int stripes) {
  return Scenario{"striped", n, std::nullopt, UplinkModel::kShared, false, {}, stripes};
}

// Star, chain, the planner's tree and the fanout-2 tree for N receivers, each
// distinct tree once (a scenario planning the same tree as an earlier one becomes
// its alias).
std::vector<Scenario> ScenariosFor(int n, UplinkModel model, const ClusterParams& p) {
  if (n == 1) return {Scenario{"single", 1, 1, model, false, {}, 1}};
  std::vector<Scenario> candidates = {Scenario{"star", n, n, model, false, {}, 1},
                                      Scenario{"chain", n, 1, model, false, {}, 1},
                                      Scenario{"tree", n, std::nullopt, model, false, {}, 1},
                                      Scenario{"tree", n, 2, model, false, {}, 1}};
  std::vector<Scenario> out;
  std::vector<int> fanouts;
  for (auto& c : candidates) {
    const int f = PlannedFanout(c, p);
    auto same = std::find(fanouts.begin(), fanouts.end(), f);
    if (same != fanouts.end()) {
      out[same - fanouts.begin()].aliases.push_back(ScenarioName(c));
      continue;
    }
    fanouts.push_back(f);
    out.push_back(std::move(c));
  }
  return out;
}

bool Matches(const RunResult& r, const std::string& name, int n, bool full, UplinkModel model) {
  if (r.scenario.receivers != n || r.scenario.full != full || r.scenario.model != model)
    return false;
  if (ScenarioName(r.scenario) == name) return true;
  return std::find(r.scenario.aliases.begin(), r.scenario.aliases.end(), name) !=
         r.scenario.aliases.end();
}

const RunResult* Find(const std::vector<RunResult>& runs, const std::string& name, int n,
                      double rate, bool full, UplinkModel model = UplinkModel::kShared) {
  for (const auto& r : runs) {
    if (r.change_rate == rate && Matches(r, n == 1 ? "single" : name, n, full, model)) return &r;
  }
  return nullptr;
}

json RunJson(const RunResult& r, const std::vector<RunResult>& runs, double link) {
  const RunResult* single = Find(runs, "single", 1, r.change_rate, r.scenario.full);
  const double lower_bound = double(r.delta_bytes) / link;
  json j = {
      {"topology", ScenarioName(r.scenario)},
      {"same_tree_as", r.scenario.aliases},
      {"receivers", r.scenario.receivers},
      {"fanout_used", r.fanout_used},
      {"depth", r.depth},
      {"uplink_model", UplinkModelName(r.scenario.model)},
      {"source_link_bytes_per_second", r.source_link_bytes_per_second},
      {"transfer", r.scenario.full ? "full" : "delta"},
      {"change_rate", r.change_rate},
      {"changed_elements", r.changed_elements},
      {"delta_bytes", r.delta_bytes},
      {"checkpoint_bytes", r.checkpoint_bytes},
      {"chunks", r.chunks},
      {"seconds", r.seconds},
      {"prepare_seconds", r.prepare_seconds},
      {"stream_seconds", r.stream_seconds},
      {"first_chunk_seconds", r.first_chunk_seconds},
      {"tree_joined_before_publish", r.tree_joined},
      {"lower_bound_seconds", lower_bound},
      {"ratio_to_lower_bound", r.seconds / lower_bound},
      {"uplink_lower_bound_seconds", UplinkLowerBound(r, link)},
      {"ratio_to_uplink_lower_bound", r.seconds / UplinkLowerBound(r, link)},
      {"planner_model_seconds", r.planner_seconds},
      {"relay_peak_held_bytes", r.peak_held_bytes},
      {"cpu_seconds", r.cpu_seconds},
      {"publish_wall_seconds", r.wall_seconds},
      {"cpu_cores_busy", r.cpu_seconds / r.wall_seconds},
      {"agents_with_lagging_stats", r.stats_lagged},
      {"load_average_1m", r.load_average},
      {"samples_seconds", r.samples_seconds},
      {"bit_exact", true},
      {"stripes", r.stripes},
  };
  // Each node's upload per refit over the delta's size (issue 31 part 4): a single
  // tree's interior nodes send k copies and its leaves none; striped, about one each.
  json share = json::object();
  double most = 0, least = 1e300;
  int idle = 0;
  for (const auto& [id, bytes] : r.upload_bytes) {
    const double x = r.delta_bytes ? double(bytes) / double(r.delta_bytes) : 0;
    share[id] = x;
    if (id == "src") continue;
    most = std::max(most, x);
    least = std::min(least, x);
    idle += bytes == 0;
  }
  j["upload_share"] = share;
  j["upload_share_receivers_max"] = most;
  j["upload_share_receivers_min"] = r.upload_bytes.size() > 1 ? least : 0;
  j["receivers_uploading_nothing"] = idle;
  if (single) {
    j["ratio_to_single"] = r.seconds / single->seconds;
    j["prepare_ratio_to_single"] = r.prepare_seconds / single->prepare_seconds;
  }
  return j;
}

// ---- summaries -------------------------------------------------------------

json Ratio(const RunResult* a, const RunResult* single, double target, const std::string& note) {
  if (!a || !single) return {{"available", false}};
  json j = {{"seconds", a->seconds},
            {"single_seconds", single->seconds},
            {"ratio", a->seconds / single->seconds},
            {"prepare_ratio", a->prepare_seconds / single->prepare_seconds},
            {"change_rate", a->change_rate},
            {"fanout_used", a->fanout_used},
            {"depth", a->depth},
            {"cpu_cores_busy", a->cpu_seconds / a->wall_seconds},
            {"note", note}};
  if (target > 0) j["meets_target"] = a->seconds / single->seconds <= target;
  return j;
}

// Tree and star against one receiver, at the largest N and `rate`.
json TreeAndStar(const std::vector<RunResult>& runs, int n, double rate, bool per_connection) {
  json s = json::object();
  const RunResult* single = Find(runs, "single", 1, rate, false);
  s[fmt::format("tree{}_over_single", n)] =
      Ratio(Find(runs, "tree(auto)", n, rate, false), single, 1.2,
            "the planner's tree, shared uplinks; target <= 1.2");
  s[fmt::format("tree{}_fanout2_over_single", n)] =
      Ratio(Find(runs, "tree(2)", n, rate, false), single, 0,
            "fanout 2, shared uplinks: each child link gets rate/2");
  if (const RunResult* star = Find(runs, "star", n, rate, false)) {
    s[fmt::format("star{}_over_single", n)] =
        Ratio(star, single, 0,
              fmt::format("the source's uplink shared by {} children; ~{} expected", n, n));
  }
  if (per_connection) {
    s[fmt::format("star{}_per_connection_over_single", n)] =
        Ratio(Find(runs, "star", n, rate, false, UplinkModel::kPerConnection), single, 0,
              "every link capped on its own: overstates the source's uplink N times");
    s[fmt::format("tree{}_fanout2_per_connection_over_single", n)] =
        Ratio(Find(runs, "tree(2)", n, rate, false, UplinkModel::kPerConnection), single, 0,
              "every link capped on its own: overstates each relay's uplink 2 times");
  }
  return s;
}

// Each hop of a chain should add about one chunk-time (mean chunk / link rate).
json ChainHops(const std::vector<RunResult>& runs, const std::vector<int>& receivers, double rate,
               double link) {
  json hops = json::array();
  const RunResult* one = Find(runs, "single", 1, rate, false);
  for (int n : receivers) {
    const RunResult* chain = Find(runs, "chain", n, rate, false);
    if (n == 1 || !chain || !one) continue;
    const double per_hop = (chain->seconds - one->seconds) / double(n - 1);
    const double mean_chunk =
        double(chain->delta_bytes) / double(std::max<uint64_t>(1, chain->chunks - 1));
    const double chunk_time = mean_chunk / link;
    hops.push_back({{"receivers", n},
                    {"change_rate", rate},
                    {"seconds_added_per_hop", per_hop},
                    {"mean_chunk_bytes", mean_chunk},
                    {"chunk_seconds", chunk_time},
                    {"per_hop_over_chunk_time", per_hop / chunk_time}});
  }
  return hops;
}

json DeltaVsFull(const std::vector<RunResult>& runs, const BenchOptions& o) {
  json full = json::array();
  for (int n : o.full_receivers) {
    const RunResult* f = Find(runs, "tree(auto)", n, o.summary_rate, true);
    const RunResult* d = Find(runs, "tree(auto)", n, o.summary_rate, false);
    if (!f || !d) continue;
    const double speedup = f->seconds / d->seconds;
    const double byte_ratio = double(f->delta_bytes) / double(d->delta_bytes);
    full.push_back({{"receivers", n},
                    {"change_rate", o.summary_rate},
                    {"full_bytes", f->delta_bytes},
                    {"delta_bytes", d->delta_bytes},
                    {"byte_ratio", byte_ratio},
                    {"full_seconds", f->seconds},
                    {"delta_seconds", d->seconds},
                    {"speedup", speedup},
                    {"speedup_over_byte_ratio", speedup / byte_ratio},
                    {"meets_target", speedup >= byte_ratio}});
  }
  return full;
}

// Issue 31 part 4: each receiver's upload per refit over the delta size, the
// planner's single tree against each count of striped trees in `stripes`, N receivers.
json UploadShares(const std::vector<RunResult>& runs, int n, double rate,
                  const std::vector<int>& stripes) {
  auto shares = [&](const RunResult* r) -> json {
    if (!r) return {{"available", false}};
    double most = 0, least = 1e300;
    int idle = 0;
    for (const auto& [id, bytes] : r->upload_bytes) {
      if (id == "src") continue;
      const double x = double(bytes) / double(std::max<uint64_t>(1, r->delta_bytes));
      most = std::max(most, x);
      least = std::min(least, x);
      idle += bytes == 0;
    }
    return {{"topology", ScenarioName(r->scenario)},
            {"stripes", r->stripes},
            {"seconds", r->seconds},
            {"receivers_max", most},
            {"receivers_min", least},
            {"receivers_uploading_nothing", idle},
            {"source", double(r->upload_bytes.count("src") ? r->upload_bytes.at("src") : 0) /
                           double(std::max<uint64_t>(1, r->delta_bytes))}};
  };
  json striped = json::array();
  for (int k : stripes)
    striped.push_back(shares(Find(runs, "striped(" + std::to_string(k) + ")", n, rate, false)));
  return {{"receivers", n},
          {"single_tree", shares(Find(runs, "tree(auto)", n, rate, false))},
          {"striped", striped}};
}

// Striped trees against one receiver at N receivers, one entry per stripe count.
void StripedRatios(json& s, const std::vector<RunResult>& runs, int n, double rate,
                   const std::vector<int>& stripes, double target) {
  const RunResult* single = Find(runs, "single", 1, rate, false);
  for (int k : stripes) {
    s[fmt::format("striped{}_{}_over_single", k, n)] =
        Ratio(Find(runs, fmt::format("striped({})", k), n, rate, false), single, target,
              fmt::format("the planner's {} striped trees, shared uplinks{}", k,
                          target > 0 ? fmt::format("; target <= {}", target) : ""));
  }
}

json Summaries(const std::vector<RunResult>& runs, const BenchOptions& o) {
  const int big = o.receivers.back();
  json s = TreeAndStar(runs, big, o.summary_rate, o.per_connection_n == big);
  s["chain_seconds_per_hop"] =
      ChainHops(runs, o.receivers, o.summary_rate, o.link_bytes_per_second);
  s["delta_vs_full"] = DeltaVsFull(runs, o);
  s["upload_share"] = UploadShares(runs, big, o.summary_rate, o.stripes);
  StripedRatios(s, runs, big, o.summary_rate, o.stripes, 0);
  return s;
}

// ---- the link-bound check -------------------------------------------------------

// The 1.2x target assumes a delta of many chunks on links slow enough that each
// hop's fixed processing is small next to the transfer (1 GiB in 4 MiB chunks at
// 10 Gbit/s: 256 chunks, ~0.9 s). At the default rate a 50 MB model's delta takes
// ~40 ms, less than 31 hops of processing on 2 shared cores; so the largest N is
// also run on slower links with small chunks, a scaled copy of that regime.
// Scaling the chunk down does not scale a node's CPU per chunk down, and here all
// 32 nodes share 2 cores: at 10 Mbit the 31-receiver refit of 256 chunks took ~3.2
// CPU s against 0.93 s of wire time (3.4 cores' worth), so that run measured the
// machine's cores, not the links. At 2 Mbit (4.7 s of wire time) the same refit
// needs about one core: the default.
json LinkBound(const BenchOptions& o, const SyntheticModel& model, std::mt19937& rng) {
  ClusterParams p = CommonParams(o);
  p.link_bytes_per_second = o.link_bound_bytes_per_second;
  p.chunk_bytes = o.link_bound_chunk_bytes;
  p.partition_bytes = o.link_bound_partition_bytes;
  const Checkpoint base = StepCheckpoint(model, 0, p.partition_bytes);
  const Checkpoint target =
      StepCheckpoint(model, dc::bench::CalibrateLr(o.summary_rate), p.partition_bytes);
  const int n = o.receivers.back();
  std::vector<RunResult> runs;
  auto run = [&](const Scenario& s) {
    runs.push_back(RunMedian(s, p, base, target, o.summary_rate, o.repeats, rng));
  };
  run(ScenariosFor(1, UplinkModel::kShared, p).front());
  for (const auto& s : ScenariosFor(n, UplinkModel::kShared, p)) {
    // The star is left out: ~N x the single time is long here and is shown above.
    if (s.topology != "star") run(s);
  }
  for (int k : o.stripes) run(Striped(n, k));
  json results = json::array();
  for (const auto& r : runs) results.push_back(RunJson(r, runs, p.link_bytes_per_second));
  json j = {{"link_rate_bytes_per_second", p.link_bytes_per_second},
            {"chunk_bytes", p.chunk_bytes},
            {"partition_bytes", p.partition_bytes},
            {"change_rate", o.summary_rate},
            {"results", results},
            {"summary", TreeAndStar(runs, n, o.summary_rate, false)}};
  j["summary"]["chain_seconds_per_hop"] =
      ChainHops(runs, {1, n}, o.summary_rate, p.link_bytes_per_second);
  j["summary"]["upload_share"] = UploadShares(runs, n, o.summary_rate, o.stripes);
  // Issue 31 part 3: striped, 31 receivers <= 1.1 x one receiver on the link-bound check.
  StripedRatios(j["summary"], runs, n, o.summary_rate, o.stripes, 1.1);
  return j;
}

// ---- relay throughput ----------------------------------------------------------

// The source's encoder alone on the same pair (chunks dropped): the ceiling the
// encoder puts on the relay when both share the same cores.
double EncoderOnlyBytesPerSecond(const Checkpoint& base, const Checkpoint& target,
                                 const ClusterParams& p) {
  dc::codec::DeltaEncoderOptions options;
  options.chunk_bytes = p.chunk_bytes;
  options.threads = p.encode_threads;
  dc::codec::DeltaStats stats;
  const auto t0 = Clock::now();
  auto status = dc::codec::EncodeDelta(
      base.manifest, target.manifest, [&](size_t i) { return base.store->TensorData(i); },
      [&](size_t i) { return target.store->TensorData(i); }, target.store->LayoutId(), options,
      [](std::vector<std::byte>&&) { return dc::Status::Ok(); }, &stats);
  if (!status.ok()) Die("encode: " + status.ToString());
  return double(stats.delta_bytes) / Seconds(t0);
}

json RelayThroughput(const BenchOptions& o, std::mt19937& rng) {
  ClusterParams p = CommonParams(o);
  p.link_bytes_per_second = 0;
  p.chunk_bytes = o.relay_chunk_bytes;
  p.partition_bytes = std::min<uint64_t>(o.relay_chunk_bytes, dc::codec::kDefaultPartitionBytes);
  fmt::print(stderr, "relay throughput: {} B full checkpoint over source -> n01 -> n02, uncapped\n",
             o.relay_bytes);
  const Checkpoint target = RandomCheckpoint(o.relay_bytes, o.seed + 7, p.partition_bytes);
  const Checkpoint zero = ZeroCheckpoint(target.store->tensors(), p.partition_bytes);
  const Scenario s{"chain", 2, 1, UplinkModel::kUncapped, true, {}, 1};
  const RunResult r = RunMedian(s, p, zero, target, 1, 1, rng);
  const double encoder_only = EncoderOnlyBytesPerSecond(zero, target, p);
  const json iperf = RunIperf(o.iperf_seconds, 1, rng);
  const double wire_rate = double(r.delta_bytes) / r.prepare_seconds;
  json j = {{"topology", "chain source -> n01 -> n02, uncapped loopback TCP (no fault wrapper)"},
            {"data",
             "random bytes from an all-zero base: literal records the entropy stage cannot shrink"},
            {"checkpoint_bytes", r.checkpoint_bytes},
            {"wire_bytes", r.delta_bytes},
            {"chunk_bytes", o.relay_chunk_bytes},
            {"chunks", r.chunks},
            {"seconds", r.seconds},
            {"prepare_seconds", r.prepare_seconds},
            {"stream_seconds", r.stream_seconds},
            {"checkpoint_bytes_per_second", double(r.checkpoint_bytes) / r.prepare_seconds},
            {"wire_bytes_per_second", wire_rate},
            {"encoder_only_bytes_per_second", encoder_only},
            {"ratio_to_encoder_only", wire_rate / encoder_only},
            {"cpu_seconds", r.cpu_seconds},
            {"cpu_cores_busy", r.cpu_seconds / r.wall_seconds},
            {"relay_peak_held_bytes", r.peak_held_bytes},
            {"bit_exact", true},
            {"iperf3", iperf}};
  if (iperf.value("available", false)) {
    const double ratio = wire_rate / iperf["bytes_per_second"].get<double>();
    j["ratio_to_iperf3"] = ratio;
    j["meets_target"] = ratio >= 0.70;
  }
  fmt::print(stderr,
             "relay throughput: {:.1f} MB/s on the wire ({:.2f} s, {:.2f} cores busy); encoder "
             "alone {:.1f} MB/s; "
             "iperf3 {}\n",
             wire_rate / 1e6, r.prepare_seconds, r.cpu_seconds / r.wall_seconds, encoder_only / 1e6,
             iperf.value("available", false)
                 ? fmt::format("{:.1f} MB/s", iperf["bytes_per_second"].get<double>() / 1e6)
                 : std::string("n/a"));
  return j;
}

// ---- main ----------------------------------------------------------------------

std::vector<double> ParseRates(const std::vector<std::string>& texts, const char* flag) {
  std::vector<double> out;
  for (const auto& t : texts) out.push_back(Check(dc::agent::ParseRate(t), flag));
  return out;
}

bool Contains(const std::vector<double>& v, double x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// All fan-out runs at one change rate: each receiver count in `ns`, each
// distinct topology, the per-connection comparison and the full transfers where
// they apply.
void RunRate(const BenchOptions& o, const ClusterParams& p, const SyntheticModel& model,
             const Checkpoint& base, double rate, const std::vector<int>& ns,
             std::vector<RunResult>& runs, std::mt19937& rng) {
  const Checkpoint target = StepCheckpoint(model, dc::bench::CalibrateLr(rate), p.partition_bytes);
  auto run = [&](const Scenario& s, const Checkpoint& from, int repeats) {
    runs.push_back(RunMedian(s, p, from, target, rate, repeats, rng));
  };
  for (int n : ns) {
    for (const auto& s : ScenariosFor(n, UplinkModel::kShared, p)) run(s, base, o.repeats);
    if (n > 1 && rate == o.summary_rate) {
      for (int k : o.stripes) run(Striped(n, k), base, o.repeats);
    }
    if (n == o.per_connection_n && n > 1 && rate == o.summary_rate) {
      for (const auto& s : ScenariosFor(n, UplinkModel::kPerConnection, p)) {
        if (s.fanout && *s.fanout > 1)
          run(s, base, o.repeats);  // a chain is the same under both models
      }
    }
  }
  if (!o.full || rate != o.summary_rate) return;
  const Checkpoint zero = ZeroCheckpoint(model.tensors, p.partition_bytes);
  for (int n : o.full_receivers) {
    for (auto s : ScenariosFor(n, UplinkModel::kShared, p)) {
      const bool planner_tree =
          ScenarioName(s) == "tree(auto)" ||
          std::find(s.aliases.begin(), s.aliases.end(), "tree(auto)") != s.aliases.end();
      if (n > 1 && !planner_tree) continue;  // full transfers only over the planner's tree
      s.full = true;
      run(s, zero, 1);  // link-bound and long: one run is steady
    }
  }
}

ClusterParams FanoutParams(const BenchOptions& o) {
  ClusterParams p = CommonParams(o);
  p.link_bytes_per_second = o.link_bytes_per_second;
  p.chunk_bytes = o.chunk_bytes;
  p.partition_bytes = o.partition_bytes;
  return p;
}

// The S that `[tree] stripes = "auto"` (the default) picks for the bench's cluster
// at its largest N: the number of sender nodes, and the bench has none.
int DefaultStripes(const BenchOptions& o) {
  const auto config =
      Check(dc::topology::ParseClusterConfig(
                ConfigToml(o.receivers.back(), 0, 40000, FanoutParams(o)), "fanout-bench.toml"),
            "config");
  return dc::topology::AutoStripeCount(config);
}

json DocHeader(const BenchOptions& o, const std::string& link_text) {
  return {
      {"benchmark", "fanout"},
      {"cores", dc::DefaultThreadCount()},
      {"params", o.params},
      {"link_rate", link_text},
      {"link_rate_bytes_per_second", o.link_bytes_per_second},
      {"chunk_bytes", o.chunk_bytes},
      {"partition_bytes", o.partition_bytes},
      {"window", o.window},
      {"summary_rate", o.summary_rate},
      {"repeats", o.repeats},
      {"transport", o.transport},
      {"provider", o.provider},
      {"stripes", o.stripes},
      {"planner_default_stripes", DefaultStripes(o)},
      {"transport_setup",
       "loopback 127.0.0.1, one transport per node, each wrapped by WrapWithFaults with a "
       "bandwidth cap"},
      {"uplink_models",
       {{"shared",
         "the default: a node with k children caps each child link at rate/k. WrapWithFaults "
         "paces each connection on its own and has no cap shared by a transport's connections, "
         "so one uplink split fairly is modelled this way; the tree planner assumes the same"},
        {"per_connection",
         "every connection capped at the full rate whatever the fanout (WrapWithFaults as is): "
         "overstates the uplink of a node with k > 1 children k times, a star's source N times"}}},
      {"data",
       "simulated BF16 AdamW steps (bench/realistic_step.h); full = the target sent from an "
       "all-zero base"},
      {"seconds_definition",
       "seconds = PublishReport::seconds, BEGIN to every node committed; prepare_seconds: BEGIN "
       "to every node PREPARED; cpu_seconds: the whole process (every node) over the publish "
       "call; cpu_cores_busy = cpu_seconds / that call's wall time, out of `cores`"}};
}

// The fan-out matrix: every rate, every N, every distinct topology; then the
// summaries and the link-bound check.
void FanoutRuns(const BenchOptions& o, std::mt19937& rng, json& doc) {
  const ClusterParams p = FanoutParams(o);
  fmt::print(stderr, "drawing a {}-parameter model\n", o.params);
  const SyntheticModel model = DrawModel(o.params, o.seed);
  const Checkpoint base = StepCheckpoint(model, 0, o.partition_bytes);
  std::vector<double> rates = o.rates;
  for (double r : o.large_rates) {
    if (!Contains(rates, r)) rates.push_back(r);
  }
  if (!Contains(rates, o.summary_rate)) rates.push_back(o.summary_rate);
  std::vector<RunResult> runs;
  for (double rate : rates) {
    std::vector<int> ns;
    for (int n : o.receivers) {
      const bool listed = Contains(n < o.large_n ? o.rates : o.large_rates, rate);
      if (n == 1 || rate == o.summary_rate || listed) ns.push_back(n);
    }
    RunRate(o, p, model, base, rate, ns, runs, rng);
  }
  json results = json::array();
  for (const auto& r : runs) results.push_back(RunJson(r, runs, o.link_bytes_per_second));
  doc["results"] = results;
  doc["summary"] = Summaries(runs, o);
  if (o.link_bound) doc["link_bound"] = LinkBound(o, model, rng);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast relay fan-out benchmark"};
  BenchOptions o;
  std::string params_text = "25M", link_text = "200Mbit", chunk_text = "32KiB",
              partition_text = "256KiB", summary_rate_text = "3%", relay_text = "512MiB",
              relay_chunk_text = "4MiB", link_bound_text = "2Mbit", link_bound_chunk_text = "4KiB",
              link_bound_partition_text = "64KiB", out_path;
  std::vector<std::string> rate_texts = {"1%", "3%", "5%"}, large_rate_texts = {"1%", "3%", "5%"};
  o.receivers = {1, 3, 7, 15, 31};
  o.full_receivers = {1, 7};
  o.per_connection_n = 31;
  bool quick = false, verbose = false, no_full = false, no_link_bound = false;
  app.add_option("--params", params_text, "Model size (BF16 parameters)")->capture_default_str();
  app.add_option("--rates", rate_texts, "Change rates for N below --large-n")
      ->capture_default_str();
  app.add_option("--large-n", o.large_n, "From this many receivers on, run only --large-rates")
      ->capture_default_str();
  app.add_option("--large-rates", large_rate_texts, "Change rates for N >= --large-n")
      ->capture_default_str();
  app.add_option("--receivers", o.receivers, "Receiver counts")->capture_default_str();
  app.add_option("--link-rate", link_text, "Rate of every node's uplink (e.g. 200Mbit, 25MB/s)")
      ->capture_default_str();
  app.add_option("--chunk", chunk_text, "Chunk size")->capture_default_str();
  app.add_option("--partition", partition_text,
                 "Partition size (a record never spans two; chunks hold whole records)")
      ->capture_default_str();
  app.add_option("--window", o.window, "Chunks in flight per link")->capture_default_str();
  app.add_option("--summary-rate", summary_rate_text,
                 "Change rate of the summaries, the per-connection runs, the full transfers and "
                 "the link-bound check")
      ->capture_default_str();
  app.add_option("--full-receivers", o.full_receivers, "Receiver counts of the full transfers")
      ->capture_default_str();
  app.add_flag("--no-full", no_full, "Skip the full-checkpoint transfers");
  app.add_option(
         "--per-connection-n", o.per_connection_n,
         "Receiver count that also runs star and fanout 2 with per-connection caps (0: none)")
      ->capture_default_str();
  app.add_flag("--no-link-bound", no_link_bound, "Skip the link-bound check of the largest N");
  app.add_option("--link-bound-rate", link_bound_text, "Link rate of the link-bound check")
      ->capture_default_str();
  app.add_option("--link-bound-chunk", link_bound_chunk_text, "Chunk size of the link-bound check")
      ->capture_default_str();
  app.add_option("--link-bound-partition", link_bound_partition_text,
                 "Partition size of the link-bound check")
      ->capture_default_str();
  app.add_option("--repeats", o.repeats, "Fresh clusters per scenario; the median run is reported")
      ->capture_default_str();
  app.add_option("--stripes", o.stripes,
                 "Stripe counts of the striped runs ([tree] stripes) at the summary rate and in "
                 "the link-bound check (1: none)")
      ->capture_default_str();
  app.add_option("--encode-threads", o.encode_threads, "Source encoder threads (0: all cores)")
      ->capture_default_str();
  app.add_option("--apply-threads", o.apply_threads, "Apply threads per receiver")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Synthesis seed")->capture_default_str();
  app.add_flag("--quick", quick, "N in {1, 7}, one rate (3%), no link-bound check: a CI-speed run");
  app.add_flag("--relay-throughput", o.relay_throughput,
               "Also measure uncapped relay throughput against iperf3");
  app.add_flag("!--no-fanout", o.fanout,
               "Skip the fan-out runs (with --relay-throughput or --relay-forward: only those)");
  app.add_option("--relay-size", relay_text, "Checkpoint size of the throughput run")
      ->capture_default_str();
  app.add_option("--relay-chunk", relay_chunk_text, "Chunk size of the throughput run")
      ->capture_default_str();
  app.add_option("--iperf-seconds", o.iperf_seconds, "Length of the iperf3 run")
      ->capture_default_str();
  app.add_option("--transport", o.transport, "Backend of every link: tcp, ucx or ofi")
      ->capture_default_str();
  app.add_option("--provider", o.provider,
                 "The backend's provider (ucx: e.g. tcp or shm; ofi: e.g. \"tcp;ofi_rxm\" or shm)");
  std::string forward_text = "512MiB";
  bool no_forward_diagnostics = false;
  app.add_flag("--relay-forward", o.relay_forward,
               "Also measure one relay's forwarding path alone (to two children) against "
               "iperf3 with one and two streams");
  app.add_option("--forward-size", forward_text, "Checkpoint size of the --relay-forward run")
      ->capture_default_str();
  app.add_option("--forward-repeats", o.forward.repeats,
                 "Runs per --relay-forward row; the median is kept")
      ->capture_default_str();
  app.add_option("--forward-spool-dir", o.forward.spool_dir,
                 "Where the relay of --relay-forward spools (default: the temporary directory)");
  app.add_option("--forward-tmpfs-dir", o.forward.tmpfs_dir,
                 "A tmpfs folder for the diagnostic row with the spool in memory (\"\": none)")
      ->capture_default_str();
  app.add_option("--forward-perf", o.forward.perf_file,
                 "Run `perf record -g` on the relay's process in the first --relay-forward run, "
                 "into this file");
  app.add_flag("--no-forward-diagnostics", no_forward_diagnostics,
               "--relay-forward: only the measured row (no source-only, tmpfs, staged rows)");
  app.add_option("--out", out_path, "Also write the JSON here");
  app.add_flag("-v,--verbose", verbose, "Log the agents (info level)");
  CLI11_PARSE(app, argc, argv);
  dc::log::SetLevel(verbose ? dc::log::Level::kInfo : dc::log::Level::kWarn);

  if (quick) {
    o.receivers = {1, 7};
    rate_texts = {"3%"};
    large_rate_texts = {"3%"};
    summary_rate_text = "3%";
    o.per_connection_n = 7;
    no_link_bound = true;
    o.repeats = 1;
  }
  o.params = Check(dc::agent::ParseParamCount(params_text), "--params");
  o.rates = ParseRates(rate_texts, "--rates");
  o.large_rates = ParseRates(large_rate_texts, "--large-rates");
  o.full = !no_full;
  o.link_bound = !no_link_bound;
  o.summary_rate = Check(dc::agent::ParseRate(summary_rate_text), "--summary-rate");
  o.link_bytes_per_second = Check(dc::topology::ParseBandwidth(link_text), "--link-rate") / 8;
  o.chunk_bytes = Check(dc::topology::ParseSize(chunk_text), "--chunk");
  o.partition_bytes = Check(dc::topology::ParseSize(partition_text), "--partition");
  o.link_bound_bytes_per_second =
      Check(dc::topology::ParseBandwidth(link_bound_text), "--link-bound-rate") / 8;
  o.link_bound_chunk_bytes =
      Check(dc::topology::ParseSize(link_bound_chunk_text), "--link-bound-chunk");
  o.link_bound_partition_bytes =
      Check(dc::topology::ParseSize(link_bound_partition_text), "--link-bound-partition");
  o.relay_bytes = Check(dc::topology::ParseSize(relay_text), "--relay-size");
  o.relay_chunk_bytes = Check(dc::topology::ParseSize(relay_chunk_text), "--relay-chunk");
  o.forward.bytes = Check(dc::topology::ParseSize(forward_text), "--forward-size");
  o.forward.chunk_bytes = o.relay_chunk_bytes;
  o.forward.window = o.window;
  o.forward.apply_threads = o.apply_threads;
  o.forward.iperf_seconds = o.iperf_seconds;
  o.forward.transport = o.transport;
  o.forward.provider = o.provider;
  o.forward.seed = o.seed;
  o.forward.diagnostics = !no_forward_diagnostics;
  if (std::any_of(o.stripes.begin(), o.stripes.end(), [](int k) { return k < 1 || k > 64; }))
    Die("--stripes: each count must be 1-64");
  std::erase_if(o.stripes, [](int k) { return k == 1; });  // 1: the single tree, run anyway
  if (o.receivers.empty() || *std::min_element(o.receivers.begin(), o.receivers.end()) < 1) {
    Die("--receivers: need N >= 1");
  }
  if (std::find(o.receivers.begin(), o.receivers.end(), 1) == o.receivers.end())
    o.receivers.push_back(1);
  std::sort(o.receivers.begin(), o.receivers.end());

  std::mt19937 rng(std::random_device{}());
  const double load_start = LoadAverage();
  const auto start = Clock::now();
  const double cpu_start = CpuSeconds();
  json doc = DocHeader(o, link_text);
  if (o.fanout) FanoutRuns(o, rng, doc);
  if (o.relay_throughput) doc["relay_throughput"] = RelayThroughput(o, rng);
  if (o.relay_forward) doc["relay_forward"] = RelayForward(o.forward, rng);
  doc["total_seconds"] = Seconds(start);
  doc["total_cpu_seconds"] = CpuSeconds() - cpu_start;
  doc["load_average_1m"] = {{"start", load_start}, {"end", LoadAverage()}};

  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

// Refit latency of small deltas: a source and seven receivers in this process over
// tcp on loopback (host-memory stores), publishing a run of small training steps,
// first with a one-shot publish per step (listen, wait for the children to re-dial
// and authenticate, stream, commit, stop), then with one long-lived Source whose
// children stay joined. Per step it measures the time from the publish call to the
// first chunk handed to the source's children, and to the call's return (the
// version committed everywhere): the cost a trainer pays per step on top of the wire.
//
// Usage: deltacast_bench_refit [--steps 8] [--elements 1048576] [--out FILE]
// Prints JSON (and writes it to --out).
#include <fmt/core.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "apply/host_store.h"
#include "bench/bench_util.h"
#include "codec/manifest.h"
#include "common/log.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/publisher.h"
#include "relay/tree/source.h"
#include "topology/cluster_config.h"
#include "transport/tcp/tcp_transport.h"

namespace dc = deltacast;
using dc::bench::Clock;
using dc::bench::Seconds;
using deltacast::bench::Check;

namespace {

constexpr int kReceivers = 7;
constexpr char kToken[] = "refit-latency-bench";

std::string ClusterToml() {
  const int base = 30600 + static_cast<int>(::getpid() % 300) * 10;
  std::string toml =
      "[cluster]\nname = \"refit-latency\"\n[tree]\nfanout = 2\nchunk_size = \"256KiB\"\n"
      "window = 8\nconnect_timeout = \"10s\"\ncommit_timeout = \"30s\"\n"
      "[[node]]\nid = \"trainer\"\nhost = \"127.0.0.1\"\nport = " +
      std::to_string(base) + "\nrole = \"source\"\n";
  for (int i = 1; i <= kReceivers; ++i) {
    toml += "[[node]]\nid = \"a" + std::to_string(i) +
            "\"\nhost = \"127.0.0.1\"\nport = " + std::to_string(base + i) + "\n";
  }
  return toml;
}

using Buffers = std::vector<std::vector<std::byte>>;

std::unique_ptr<dc::apply::WeightStore> Over(const std::vector<dc::TensorSpec>& tensors,
                                             Buffers& buffers) {
  std::vector<std::pair<dc::TensorSpec, dc::MutableByteSpan>> spans;
  for (size_t i = 0; i < tensors.size(); ++i)
    spans.emplace_back(tensors[i], dc::MutableByteSpan(buffers[i]));
  return Check(dc::apply::HostStore::Borrow(std::move(spans)), "store");
}

dc::codec::Manifest ManifestOf(const dc::apply::WeightStore& s) {
  return dc::codec::ComputeManifest(
      s.tensors(), [&](size_t i) { return s.TensorData(i); }, dc::codec::kDefaultPartitionBytes, 1);
}

// The next training step: ~3% of the BF16 elements move by one unit in the last place.
Buffers NextStep(const Buffers& step, std::mt19937& rng) {
  Buffers next = step;
  for (auto& t : next) {
    for (size_t i = 0; i < t.size(); i += 2) {
      if (rng() % 100 < 3) t[i] ^= std::byte{1};
    }
  }
  return next;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Refit latency of small deltas through seven local receivers"};
  int steps = 8;
  uint64_t elements = uint64_t{1} << 20;
  std::string out;
  app.add_option("--steps", steps, "training steps published");
  app.add_option("--elements", elements, "BF16 elements per tensor (4 tensors)");
  app.add_option("--out", out, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  dc::log::SetLevel(dc::log::Level::kWarn);

  std::vector<dc::TensorSpec> tensors;
  for (int t = 0; t < 4; ++t)
    tensors.push_back({"layers." + std::to_string(t) + ".weight", dc::DType::kBF16, {elements}});
  std::mt19937 rng(11);
  std::vector<Buffers> versions(1);
  for (const auto& t : tensors) {
    std::vector<std::byte> bytes(t.ByteSize());
    for (auto& b : bytes) b = std::byte(rng());
    versions[0].push_back(std::move(bytes));
  }
  for (int s = 0; s < steps; ++s) versions.push_back(NextStep(versions.back(), rng));

  auto config =
      Check(dc::topology::ParseClusterConfig(ClusterToml(), "refit-latency.toml"), "config");
  std::vector<Buffers> stores(kReceivers, versions[0]);
  std::vector<std::unique_ptr<dc::relay::NodeAgent>> agents;
  for (int i = 0; i < kReceivers; ++i) {
    dc::relay::NodeAgentOptions options;
    options.config = config;
    options.node_id = "a" + std::to_string(i + 1);
    options.token = kToken;
    options.apply_threads = 1;
    auto replica = Check(dc::apply::Replica::ForStore(Over(tensors, stores[i]),
                                                      dc::codec::kDefaultPartitionBytes, 1),
                         "replica");
    agents.push_back(
        Check(dc::relay::NodeAgent::Start(std::move(options), std::move(replica),
                                          Check(dc::transport::MakeTcpTransport(), "tcp")),
              "agent"));
  }

  // The one-shot mode takes the receivers from step 0 to step N; the long-lived
  // mode brings them back from N to 0: deltas of the same sizes.
  bool all_committed = true, bit_exact = true;
  uint64_t delta_bytes = 0;
  nlohmann::json modes = nlohmann::json::object();
  for (const bool long_lived : {false, true}) {
    std::unique_ptr<dc::relay::Source> source;
    dc::relay::PublishOptions options;
    options.config = config;
    options.token = kToken;
    options.encode_threads = 1;
    double first = -1;
    Clock::time_point call;
    options.on_progress = [&](const dc::relay::PublishProgress& p) {
      if (p.chunks_sent == 1) first = Seconds(call);
    };
    if (long_lived) {
      source =
          Check(dc::relay::Source::Start(options, Check(dc::transport::MakeTcpTransport(), "tcp")),
                "source");
    }
    nlohmann::json per_step = nlohmann::json::array();
    std::vector<double> first_chunk, refit;
    for (int s = 0; s < steps; ++s) {
      const int from = long_lived ? steps - s : s;
      const int to = long_lived ? steps - s - 1 : s + 1;
      auto base = Over(tensors, versions[from]);
      auto target = Over(tensors, versions[to]);
      const auto base_manifest = ManifestOf(*base);
      const auto target_manifest = ManifestOf(*target);
      first = -1;
      call = Clock::now();
      auto report =
          long_lived
              ? Check(source->Publish(*base, base_manifest, *target, target_manifest), "publish")
              : Check(dc::relay::Publish(options, *base, base_manifest, *target, target_manifest,
                                         Check(dc::transport::MakeTcpTransport(), "tcp")),
                      "publish");
      const double seconds = Seconds(call);
      all_committed = all_committed && report.committed && report.nodes_decided == kReceivers;
      for (const auto& store : stores) bit_exact = bit_exact && store == versions[to];
      delta_bytes = report.delta.delta_bytes;
      first_chunk.push_back(first);
      refit.push_back(seconds);
      per_step.push_back({{"first_chunk_seconds", first},
                          {"refit_seconds", seconds},
                          {"delta_bytes", report.delta.delta_bytes},
                          {"committed", report.committed}});
    }
    if (source) source->Stop();
    modes[long_lived ? "long_lived_source" : "one_shot_publish"] = {
        {"first_chunk_seconds_median", Median(first_chunk)},
        {"refit_seconds_median", Median(refit)},
        {"per_step", per_step}};
  }
  for (auto& a : agents) a->Stop();

  const double one_shot = modes["one_shot_publish"]["refit_seconds_median"];
  const double kept = modes["long_lived_source"]["refit_seconds_median"];
  const double one_shot_first = modes["one_shot_publish"]["first_chunk_seconds_median"];
  const double kept_first = modes["long_lived_source"]["first_chunk_seconds_median"];
  nlohmann::json result = {
      {"benchmark", "refit_latency"},
      {"receivers", kReceivers},
      {"transport", "tcp loopback"},
      {"model_bytes", 4 * elements * 2},
      {"delta_bytes", delta_bytes},
      {"steps", steps},
      {"one_shot_publish", modes["one_shot_publish"]},
      {"long_lived_source", modes["long_lived_source"]},
      {"first_chunk_ratio_long_lived_over_one_shot", kept_first / one_shot_first},
      {"refit_ratio_long_lived_over_one_shot", kept / one_shot},
      {"all_committed", all_committed},
      {"bit_exact", bit_exact},
  };
  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return all_committed && bit_exact ? 0 : 1;
}

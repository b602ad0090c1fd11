#include "agent/produce_commands.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/commands.h"
#include "agent/synth_shards.h"
#include "apply/checkpoint_dir.h"
#include "apply/checkpoint_state.h"
#include "apply/safetensors.h"
#include "common/log.h"
#include "relay/producers/producer.h"
#include "relay/producers/root.h"
#include "relay/producers/shard_input.h"
#include "relay/tree/node_transports.h"

namespace deltacast::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int Fail(const Status& status) {
  fmt::print(stderr, "deltacast: {}\n", status.ToString());
  return kExitFailure;
}

// One rank's shard pair and its placement, from files.
struct LocalShare {
  std::unique_ptr<relay::ShardFile> base, target;
  relay::RankPlacement placement;
  relay::ShareInput Input() const {
    return {&placement.map, [this](uint32_t i) { return base->TensorData(i); },
            [this](uint32_t i) { return target->TensorData(i); }};
  }
};

Result<std::unique_ptr<LocalShare>> LoadShare(const fs::path& layout, const fs::path& base,
                                              const fs::path& target) {
  auto share = std::make_unique<LocalShare>();
  auto b = relay::ShardFile::Open(base);
  if (!b.ok()) return b.status().WithContext("base shard");
  auto t = relay::ShardFile::Open(target);
  if (!t.ok()) return t.status().WithContext("new shard");
  if ((*b)->tensors() != (*t)->tensors()) {
    return Status::InvalidArgument("shards " + base.string() + " and " + target.string() +
                                   " hold different tensors: a delta carries tensor bytes only");
  }
  share->base = std::move(*b);
  share->target = std::move(*t);
  ASSIGN_OR_RETURN(share->placement, relay::LoadRankPlacement(layout, share->target->tensors()));
  return share;
}

// Producer links are plain tcp on the trainer's network, under the same [limits]
// before authentication as the tree's links.
json Fp8Json(const relay::ProduceReport& r) {
  if (!r.fp8) return nullptr;
  return {{"quantized_bf16_bytes", r.fp8_stats.quantized_bf16_bytes},
          {"blocks", r.fp8_stats.blocks},
          {"split_blocks", r.fp8_stats.split_blocks},
          {"split_elements", r.fp8_stats.split_elements},
          {"scales_written", r.fp8_stats.scales_written},
          {"amax_seconds", r.fp8_stats.amax_seconds},
          {"quantize_seconds", r.fp8_stats.quantize_seconds},
          {"amax_bytes", r.amax_bytes}};
}

// The serving description a producer quantizes under, if any.
Result<std::optional<quant::ServingDescription>> LoadServingOf(const fs::path& path) {
  if (path.empty()) return std::optional<quant::ServingDescription>();
  ASSIGN_OR_RETURN(quant::ServingDescription d, quant::LoadServing(path));
  return std::optional<quant::ServingDescription>(std::move(d));
}

json ProduceJson(const relay::ProduceReport& r) {
  return {{"fp8", Fp8Json(r)},
          {"refit_id", r.refit_id},
          {"committed", r.committed},
          {"reason", r.reason},
          {"partitions", r.partitions},
          {"hashed_base", r.hashed_base},
          {"local_bytes", r.stats.local_bytes},
          {"changed_elements", r.stats.changed_elements},
          {"records", r.stats.records},
          {"chunk_bytes", r.stats.chunk_bytes},
          {"piece_bytes", r.stats.piece_bytes},
          {"messages", r.messages},
          {"sent_bytes", r.sent_bytes},
          {"hash_seconds", r.hash_seconds},
          {"encode_seconds", r.encode_seconds},
          {"seconds", r.seconds}};
}

}  // namespace

int RunProduce(const ProduceArgs& args) {
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  auto share = LoadShare(args.layout, args.base, args.target);
  if (!share.ok()) return Fail(share.status());
  auto serving = LoadServingOf(args.serving);
  if (!serving.ok()) return Fail(serving.status());
  auto transport = relay::MakeProducerTransport(*config, RankFileStem(args.rank));
  if (!transport.ok()) return Fail(transport.status());
  relay::ProducerOptions options;
  options.id = RankFileStem(args.rank);
  options.tls = topology::ProducerLinksUseTls(*config);
  options.root_address = args.root.empty() ? relay::DefaultProducerAddress(*config) : args.root;
  options.root_id = config->Source()->id;
  options.token = *token;
  options.codec = args.codec;
  options.threads = args.threads;
  options.connect_timeout = config->tree.connect_timeout * 3;
  options.refit_timeout = config->tree.commit_timeout * 2;
  options.serving = std::move(*serving);
  auto producer = relay::Producer::Connect(std::move(options), std::move(*transport));
  if (!producer.ok()) return Fail(producer.status());
  auto report = (*producer)->Serve((*share)->Input());
  if (!report.ok()) return Fail(report.status());
  if (args.json) {
    fmt::print("{}\n", ProduceJson(*report).dump(2));
  } else {
    fmt::print(
        "producer {}: refit {} {}; {} partitions, {:.1f} MiB compared in {:.2f} s, {} changed "
        "elements, {:.2f} MiB sent\n",
        RankFileStem(args.rank), report->refit_id, report->committed ? "COMMITTED" : "ABORTED",
        report->partitions, double(report->stats.local_bytes) / (1 << 20), report->encode_seconds,
        report->stats.changed_elements, double(report->sent_bytes) / (1 << 20));
  }
  return report->committed ? kExitOk : kExitFailure;
}

int RunPublishFromProducers(const PublishArgs& args, const ProducersArgs& p) {
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  const bool local = !p.new_shards.empty();
  auto serving = LoadServingOf(args.serving);
  if (!serving.ok()) return Fail(serving.status());
  // The local producers, one per rank file of the shard directories.
  std::vector<std::unique_ptr<LocalShare>> shares;
  if (local) {
    for (uint64_t r = 0; fs::exists(p.new_shards / (RankFileStem(r) + ".toml")); ++r) {
      const std::string stem = RankFileStem(r);
      auto share =
          LoadShare(p.new_shards / (stem + ".toml"), p.base_shards / (stem + ".safetensors"),
                    p.new_shards / (stem + ".safetensors"));
      if (!share.ok()) return Fail(share.status().WithContext("rank " + std::to_string(r)));
      shares.push_back(std::move(*share));
    }
    if (shares.empty()) {
      return Fail(Status::NotFound("no rank-00000.toml in " + p.new_shards.string()));
    }
  }
  auto tree = relay::MakeNodeTransports(*config, *config->Source());
  if (!tree.ok()) return Fail(tree.status());
  auto producer_transport = relay::MakeProducerTransport(*config, config->Source()->id);
  if (!producer_transport.ok()) return Fail(producer_transport.status());
  relay::RootOptions options;
  auto publish = MakePublishOptions(args, *config, *token, local ? p.new_shards : args.config);
  if (!publish.ok()) return Fail(publish.status());
  options.publish = std::move(*publish);
  options.producers = local ? shares.size() : p.producers;
  options.producer_address = !p.listen.empty() ? p.listen
                             : local           ? "127.0.0.1:0"
                                               : relay::DefaultProducerAddress(*config);
  options.join_timeout = config->tree.connect_timeout * 3;
  options.produce_timeout = config->tree.commit_timeout;
  const auto bar = AttachPublishProgress(args, options.publish);
  auto root =
      relay::Root::Start(std::move(options), std::move(*tree), std::move(*producer_transport));
  if (!root.ok()) return Fail(root.status());

  std::optional<codec::Manifest> base;
  if (!args.base.empty()) {
    auto store =
        apply::CheckpointDirStore::Open(args.base, apply::CheckpointDirStore::Access::kReadOnly);
    if (!store.ok()) return Fail(store.status().WithContext("base checkpoint"));
    auto m = apply::CheckpointState(args.base).LoadOrComputeManifest(
        **store, codec::kDefaultPartitionBytes, args.threads ? args.threads : 1);
    if (!m.ok()) return Fail(m.status());
    base = std::move(*m);
  }
  std::vector<std::thread> threads;
  std::vector<Status> served(shares.size());
  std::vector<relay::ProduceReport> produced(shares.size());
  const size_t per_producer_threads =
      std::max<size_t>(1, (args.threads ? args.threads : std::thread::hardware_concurrency()) /
                              std::max<size_t>(1, shares.size()));
  for (size_t r = 0; r < shares.size(); ++r) {
    threads.emplace_back([&, r] {
      relay::ProducerOptions o;
      o.id = RankFileStem(r);
      o.root_address = (*root)->producer_address();
      o.root_id = config->Source()->id;
      o.token = *token;
      o.codec = args.codec;
      o.threads = per_producer_threads;
      o.refit_timeout = config->tree.commit_timeout * 2;
      o.serving = *serving;
      o.tls = topology::ProducerLinksUseTls(*config);
      auto t = relay::MakeProducerTransport(*config, o.id);
      if (!t.ok()) {
        served[r] = t.status();
        return;
      }
      auto producer = relay::Producer::Connect(std::move(o), std::move(*t));
      if (!producer.ok()) {
        served[r] = producer.status();
        return;
      }
      auto report = (*producer)->Serve(shares[r]->Input());
      served[r] = report.ok() ? Status::Ok() : report.status();
      if (report.ok()) produced[r] = *report;
    });
  }
  auto report = (*root)->Publish(base ? &*base : nullptr);
  for (auto& t : threads) t.join();
  (*root)->Stop();
  bar->Finish();
  for (size_t r = 0; r < served.size(); ++r) {
    if (!served[r].ok())
      log::Warn("local producer " + RankFileStem(r) + ": " + served[r].ToString());
  }
  if (!report.ok()) return Fail(report.status());
  json producers = json::array();
  for (const auto& s : report->producers) {
    json fp8 = nullptr;
    for (size_t r = 0; r < produced.size(); ++r) {
      if (RankFileStem(r) == s.id) fp8 = Fp8Json(produced[r]);
    }
    producers.push_back({{"id", s.id},
                         {"fp8", fp8},
                         {"partitions", s.partitions},
                         {"whole_changes", s.whole_changes},
                         {"piece_changes", s.piece_changes},
                         {"local_bytes", s.local_bytes},
                         {"encode_seconds", s.encode_seconds}});
  }
  json extra{{"producers", producers},
             {"base_from_producers", report->base_from_producers},
             {"coverage_seconds", report->coverage_seconds},
             {"produce_seconds", report->produce_seconds},
             {"merge_cpu_seconds", report->merge_cpu_seconds},
             {"merged_bytes", report->merged_bytes}};
  if (report->fp8.producers > 0) {
    // Where split blocks' pieces meet: the root, by partial amaxes (docs/fp8.md).
    extra["fp8_exchange"] = {{"producers", report->fp8.producers},
                             {"split_blocks", report->fp8.split_blocks},
                             {"pieces", report->fp8.pieces},
                             {"exchange_bytes", report->fp8.exchange_bytes},
                             {"gather_bytes", report->fp8.gather_bytes}};
  }
  if (!args.json) {
    fmt::print(
        "{} producers; target known after {:.3f} s (coverage {:.3f} s); root merge {:.3f} "
        "CPU s for {:.2f} MiB\n",
        report->producers.size(), report->produce_seconds, report->coverage_seconds,
        report->merge_cpu_seconds, double(report->merged_bytes) / (1 << 20));
    if (report->fp8.producers > 0) {
      fmt::print(
          "FP8: {} blocks split across producers ({} pieces): {} B of partial amaxes exchanged "
          "through the root, against {} B to gather their elements\n",
          report->fp8.split_blocks, report->fp8.pieces, report->fp8.exchange_bytes,
          report->fp8.gather_bytes);
    }
  }
  return ReportPublish(report->publish, args.json, extra.dump());
}

int RunLayoutCheck(const LayoutCheckArgs& args) {
  std::vector<fs::path> files;
  for (const fs::path& p : args.layouts) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      files.push_back(p);
      continue;
    }
    std::vector<fs::path> ranks;
    for (const auto& e : fs::directory_iterator(p, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("rank-") && e.path().extension() == ".toml") ranks.push_back(e.path());
    }
    if (ranks.empty()) return Fail(Status::NotFound("no rank-*.toml in " + p.string()));
    std::sort(ranks.begin(), ranks.end());
    files.insert(files.end(), ranks.begin(), ranks.end());
  }
  if (files.empty()) return Fail(Status::InvalidArgument("no layout files to check"));
  std::vector<relay::RankPlacement> ranks;
  for (const fs::path& layout : files) {
    const fs::path dir = args.shard_dir.empty() ? layout.parent_path() : args.shard_dir;
    const fs::path shard = dir / (layout.stem().string() + ".safetensors");
    auto header = apply::ReadSafetensorsHeader(shard);
    if (!header.ok()) return Fail(header.status().WithContext("the shard of " + layout.string()));
    std::vector<TensorSpec> tensors;
    for (const auto& e : header->entries) tensors.push_back(e.info);
    auto placement = relay::LoadRankPlacement(layout, tensors);
    if (!placement.ok()) {
      fmt::print(stderr, "deltacast layout check: {}\n", placement.status().ToString());
      return kExitDiffers;
    }
    ranks.push_back(std::move(*placement));
  }
  std::vector<const layout::PlacementMap*> maps;
  for (const auto& r : ranks) maps.push_back(&r.map);
  const Status covered = layout::CheckCoverage(maps);
  const size_t tensors = ranks.front().map.canonical().size();
  if (args.json) {
    fmt::print("{}\n", json{{"ranks", ranks.size()},
                            {"canonical_tensors", tensors},
                            {"exact", covered.ok()},
                            {"error", covered.ok() ? "" : covered.ToString()}}
                           .dump(2));
  } else if (covered.ok()) {
    fmt::print("{} ranks cover every element of the {} canonical tensors exactly once\n",
               ranks.size(), tensors);
  } else {
    fmt::print(stderr, "deltacast layout check: {}\n", covered.ToString());
  }
  return covered.ok() ? kExitOk : kExitDiffers;
}

}  // namespace deltacast::agent

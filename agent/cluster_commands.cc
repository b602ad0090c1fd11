#include "agent/cluster_commands.h"

#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "agent/commands.h"
#include "agent/coordinator_command.h"
#include "agent/fp8_twin.h"
#include "apply/checkpoint_state.h"
#include "common/log.h"
#include "relay/bucket/bucket_bridge.h"
#include "relay/producers/fp8_delta.h"
#include "relay/store/snapshot_store.h"
#include "relay/tree/catch_up.h"
#include "relay/tree/configured_keys.h"
#include "relay/tree/node_agent.h"
#include "relay/tree/node_transports.h"
#include "relay/tree/publisher.h"
#include "relay/tree/sender_agent.h"
#include "relay/tree/setup.h"
#include "relay/tree/source.h"
#include "topology/plan_format.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"
#include "transport/tcp/tls_certs.h"

namespace deltacast::agent {
namespace {

using nlohmann::json;

int Fail(const Status& status) {
  fmt::print(stderr, "deltacast: {}\n", status.ToString());
  return kExitFailure;
}

// Blocks SIGINT and SIGTERM in every thread (call before starting any), then
// waits for one of them.
class SignalWaiter {
 public:
  SignalWaiter() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  }
  int Wait() {
    int signal = 0;
    sigwait(&set_, &signal);
    return signal;
  }

 private:
  sigset_t set_;
};

}  // namespace

int RunPlan(const PlanArgs& args) {
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto plan = args.stripes > 0 ? topology::PlanStripesWithCount(*config, args.stripes)
                               : topology::PlanStripes(*config);
  if (!plan.ok()) return Fail(plan.status());
  fmt::print("{}\n", args.json ? topology::FormatStripedPlanJson(*plan, *config, args.delta_bytes)
                               : topology::FormatStripedPlanText(*plan, *config, args.delta_bytes));
  return kExitOk;
}

namespace {

// The config's keys for signed versions (relay/wire/signing.h).
Result<std::shared_ptr<const relay::VerifyKey>> LoadVerifyKey(const topology::ClusterConfig& c) {
  return relay::LoadConfiguredVerifyKey(c);
}

// `path` as the config should name it: relative to the config's directory.
std::string ConfigRelative(const std::filesystem::path& path, const std::filesystem::path& config) {
  const auto base = std::filesystem::absolute(config).parent_path();
  const auto full = std::filesystem::absolute(path).lexically_normal();
  const auto relative = full.lexically_relative(base);
  return relative.empty() || *relative.begin() == ".." ? full.string() : relative.string();
}

}  // namespace

int RunCerts(const CertsArgs& args) {
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  std::vector<std::string> ids;
  for (const auto& n : config->nodes) ids.push_back(n.id);
  for (const auto& p : args.producers) {
    if (config->FindNode(p)) {
      return Fail(Status::InvalidArgument("producer id '" + p +
                                          "' is a node's id: a producer "
                                          "with it could stand for that node"));
    }
    ids.push_back(p);
  }
  auto files = transport::WriteClusterCertificates(args.out, ids, args.days);
  if (!files.ok()) return Fail(files.status());
  const auto signing = args.out / "signing.key", verify = args.out / "signing.pub";
  if (std::filesystem::exists(signing) && std::filesystem::exists(verify)) {
    files->kept.push_back(signing);
  } else {
    auto key = relay::SigningKey::Generate();
    if (!key.ok()) return Fail(key.status());
    if (Status s = key->Write(signing); !s.ok()) return Fail(s);
    if (Status s = key->Public().Write(verify); !s.ok()) return Fail(s);
    files->written.push_back(signing);
    files->written.push_back(verify);
  }
  fmt::print("wrote {} files, kept {} in {}\n", files->written.size(), files->kept.size(),
             args.out.string());
  fmt::print(
      "give each node its NODE.key (and only its own), every node ca.crt, its NODE.crt and "
      "signing.pub; each producer named with --producer its ID.key, ID.crt and ca.crt; "
      "signing.key stays on the trainer, ca.key off the cluster.\n"
      "add to {}:\n\n[security]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n"
      "signing_key = \"{}\"   # read by the source only\nverify_key = \"{}\"\n",
      args.config.string(), ConfigRelative(args.out / "ca.crt", args.config),
      ConfigRelative(args.out / "{node}.crt", args.config),
      ConfigRelative(args.out / "{node}.key", args.config), ConfigRelative(signing, args.config),
      ConfigRelative(verify, args.config));
  return kExitOk;
}

namespace {

// A progress bar for each catch-up, on a terminal (relay::CatchUpProgress; called
// on the node's loop thread, so it only redraws a line).
std::function<void(const relay::CatchUpProgress&)> CatchUpProgressBar() {
  struct Bar {
    std::unique_ptr<progress::Progress> progress;
    bool by_chain = false;
  };
  auto bar = std::make_shared<Bar>();
  return [bar](const relay::CatchUpProgress& p) {
    if (bar->progress && bar->by_chain != p.by_chain) bar->progress.reset();  // fell back
    if (!bar->progress) {
      progress::Options options;
      options.label = "catch-up";
      options.unit = progress::Unit::kItems;
      options.item_name = p.by_chain ? "chunks of kept deltas" : "partitions";
      bar->progress = progress::Progress::ForTerminal(std::move(options));
      bar->by_chain = p.by_chain;
    }
    bar->progress->SetTotal(p.total);
    bar->progress->Set(p.done);
    if (p.finished) bar->progress.reset();  // Finish()
  };
}

}  // namespace

namespace {

// A sender that roots a stripe (relay/tree/sender_agent.h): no weights; `--store`, if
// given, is where it spools its stripe's chunks.
int RunSender(const AgentArgs& args, const topology::ClusterConfig& config, std::string token,
              SignalWaiter& signals) {
  relay::SenderAgentOptions options;
  options.config = config;
  options.node_id = args.node;
  options.token = std::move(token);
  if (!args.store.empty()) options.spool_dir = args.store / "spool";
  auto sender = relay::StartConfiguredSender(std::move(options));
  if (!sender.ok()) return Fail(sender.status());
  const int signal = signals.Wait();
  log::Info(fmt::format("{}: stopping on signal {}", args.node, signal));
  (*sender)->Stop();
  return kExitOk;
}

}  // namespace

int RunAgent(const AgentArgs& args) {
  SignalWaiter signals;
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  if (const topology::NodeConfig* node = config->FindNode(args.node);
      node && node->role == topology::Role::kSender) {
    auto plan = topology::PlanStripes(*config);
    if (!plan.ok()) return Fail(plan.status());
    // With one stripe a sender relays inside the tree like a receiver (it needs a store).
    if (relay::StripeRootedBy(*plan, args.node) >= 0) {
      return RunSender(args, *config, std::move(*token), signals);
    }
  }
  if (args.store.empty()) {
    return Fail(Status::InvalidArgument(
        "node '" + args.node + "' holds weights: give its checkpoint directory (--store)"));
  }
  // An FP8 store that does not hold together is refused before anything is written.
  if (Status fp8 = CheckFp8CheckpointDir(args.store); !fp8.ok()) return Fail(fp8);
  relay::NodeAgentOptions options;
  options.config = *config;
  options.node_id = args.node;
  options.token = *token;
  options.apply_threads = args.threads;
  if (Status records = AttachCommitRecords(*config, options); !records.ok()) return Fail(records);
  if (args.progress) options.on_catch_up_progress = CatchUpProgressBar();
  auto agent =
      relay::StartConfiguredNode(std::move(options), relay::NodeParts::Checkpoint(args.store));
  if (!agent.ok()) return Fail(agent.status());
  const int signal = signals.Wait();
  log::Info(fmt::format("{}: stopping on signal {}", args.node, signal));
  (*agent)->Stop();
  return kExitOk;
}

int RunBucketBridge(const BucketBridgeArgs& args) {
  SignalWaiter signals;
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  auto options = relay::BridgeOptionsFromConfig(*config, args.node, *token);
  if (!options.ok()) return Fail(options.status());
  auto verify_key = LoadVerifyKey(*config);
  if (!verify_key.ok()) return Fail(verify_key.status());
  options->verify_key = *verify_key;
  options->spool_dir = args.state;
  auto transport = relay::MakeNodeTransports(*config, *config->FindNode(args.node));
  if (!transport.ok()) return Fail(transport.status());
  const char* half = args.uplink ? "uplink" : "downlink";
  std::unique_ptr<relay::BucketUplink> up;
  std::unique_ptr<relay::BucketDownlink> down;
  if (args.uplink) {
    auto started = relay::BucketUplink::Start(std::move(*options), std::move(*transport));
    if (!started.ok()) return Fail(started.status());
    up = std::move(*started);
  } else {
    auto started = relay::BucketDownlink::Start(std::move(*options), std::move(*transport));
    if (!started.ok()) return Fail(started.status());
    down = std::move(*started);
  }
  const int signal = signals.Wait();
  log::Info(fmt::format("bucket {} {}: stopping on signal {}", half, args.node, signal));
  if (up) up->Stop();
  if (down) down->Stop();
  return kExitOk;
}

namespace {

// The source's options from the command line (and its signing key, when [security]
// names one); its state (decision log, spool, kept deltas) under `state`.
Result<relay::PublishOptions> SourceOptions(const topology::ClusterConfig& config,
                                            std::string token, const codec::EncodeOptions& codec,
                                            size_t threads, const std::filesystem::path& state,
                                            size_t keep_deltas) {
  ASSIGN_OR_RETURN(relay::PublishOptions options,
                   relay::ConfiguredPublishOptions(config, std::move(token), state, keep_deltas));
  options.codec = codec;
  options.encode_threads = threads;
  RETURN_IF_ERROR(AttachCommitRecords(config, options));
  return options;
}

// `extra` (JSON only): more keys for the report (the producers' figures).
void PrintReport(const relay::PublishReport& r, bool as_json, const json& extra = json::object()) {
  const double full = double(r.delta.tensor_bytes);
  if (as_json) {
    json nodes = json::array();
    for (const auto& n : r.nodes) {
      nodes.push_back({{"node", n.node_id},
                       {"delta_bytes", n.chunk_bytes},
                       {"apply_seconds", n.apply_seconds},
                       {"partitions_applied", n.partitions_applied},
                       {"receive_seconds", n.receive_seconds},
                       {"check_seconds", n.check_seconds},
                       {"write_seconds", n.write_seconds},
                       {"apply_cpu_seconds", n.apply_cpu_seconds},
                       {"cpu_wait_seconds", n.cpu_wait_seconds},
                       {"disk_wait_seconds", n.disk_wait_seconds},
                       // Its engine paused for the writes, and the verified delta held
                       // before the decision (docs/serving.md).
                       {"pause_seconds", n.pause_seconds},
                       {"prepared_hold_seconds", n.hold_seconds}});
    }
    json out{{"committed", r.committed},
             {"abort_reason", r.abort_reason},
             {"refit_id", r.refit_id},
             {"base_version", r.base_version.ToHex()},
             {"target_version", r.target_version.ToHex()},
             {"delta_bytes", r.delta.delta_bytes},
             {"checkpoint_bytes", r.delta.tensor_bytes},
             {"chunks", r.delta.chunks},
             {"seconds", r.seconds},
             {"first_chunk_seconds", r.first_chunk_seconds},
             {"call_to_first_chunk_seconds", r.call_to_first_chunk_seconds},
             {"stream_seconds", r.stream_seconds},
             {"prepare_seconds", r.prepare_seconds},
             // Every node PREPARED to the last confirmation: the decision logged
             // durably, sent down, committed and confirmed up.
             {"commit_seconds", std::max(0.0, r.seconds - r.prepare_seconds)},
             {"encode_seconds", r.delta.seconds},
             {"encode_gbps", r.delta.seconds > 0 ? full / r.delta.seconds / 1e9 : 0.0},
             {"effective_gbps", full / r.seconds / 1e9},
             {"nodes_decided", r.nodes_decided},
             {"nodes", nodes}};
    if (!r.bf16_target_version.IsZero()) {
      out["bf16_base_version"] = r.bf16_base_version.ToHex();
      out["bf16_target_version"] = r.bf16_target_version.ToHex();
    }
    out.update(extra);
    fmt::print("{}\n", out.dump(2));
    std::fflush(stdout);
    return;
  }
  fmt::print("refit {} {}: {} -> {}\n", r.refit_id, r.committed ? "COMMITTED" : "ABORTED",
             r.base_version.ShortHex(), r.target_version.ShortHex());
  if (!r.committed) fmt::print("  reason: {}\n", r.abort_reason);
  if (!r.bf16_target_version.IsZero()) {
    fmt::print("  FP8 serving twins of BF16 {} -> {}\n", r.bf16_base_version.ShortHex(),
               r.bf16_target_version.ShortHex());
  }
  fmt::print("  delta {:.2f} MiB for a {:.2f} MiB checkpoint ({:.2f}%), {} chunks\n",
             double(r.delta.delta_bytes) / (1 << 20), full / (1 << 20),
             100.0 * double(r.delta.delta_bytes) / std::max(full, 1.0), r.delta.chunks);
  fmt::print(
      "  first chunk out after {:.3f} s, stream {:.2f} s, all prepared {:.2f} s, done {:.2f} s "
      "(effective {:.2f} GB/s of checkpoint)\n",
      r.first_chunk_seconds, r.stream_seconds, r.prepare_seconds, r.seconds,
      full / r.seconds / 1e9);
  fmt::print("  {} nodes confirmed the decision\n", r.nodes_decided);
  for (const auto& n : r.nodes) {
    fmt::print(
        "    {:<16} received {:>9.2f} MiB, {:>5} partitions, prepared after {:.2f} s (receive "
        "{:.2f} s; check {:.2f} s, write {:.2f} s; CPU {:.2f} s, waiting for a CPU {:.2f} s, "
        "for the disk {:.2f} s); writes paused it {:.3f} s\n",
        n.node_id, double(n.chunk_bytes) / (1 << 20), n.partitions_applied, n.apply_seconds,
        n.receive_seconds, n.check_seconds, n.write_seconds, n.apply_cpu_seconds,
        n.cpu_wait_seconds, n.disk_wait_seconds, n.pause_seconds);
  }
  std::fflush(stdout);
}

// What the source needs from its config: the config, the token, its transports.
struct SourceSetup {
  topology::ClusterConfig config;
  std::string token;
  std::unique_ptr<transport::Transport> transport;
};
Result<SourceSetup> SetUpSource(const std::filesystem::path& config_path) {
  SourceSetup s;
  ASSIGN_OR_RETURN(s.config, topology::LoadClusterConfig(config_path));
  ASSIGN_OR_RETURN(s.token, topology::ReadAuthToken(s.config));
  ASSIGN_OR_RETURN(s.transport, relay::MakeNodeTransports(s.config, *s.config.Source()));
  return s;
}

}  // namespace

int RunPublish(const PublishArgs& args) {
  auto setup = SetUpSource(args.config);
  if (!setup.ok()) return Fail(setup.status());
  auto& [config, token, transport] = *setup;
  auto source_options = MakePublishOptions(args, config, token, args.target);
  if (!source_options.ok()) return Fail(source_options.status());
  relay::PublishOptions& options = *source_options;
  if (Status fp8 = CheckFp8Versions(args.base, args.target); !fp8.ok()) return Fail(fp8);
  std::optional<quant::ServingDescription> serving;
  if (!args.serving.empty()) {
    auto loaded = quant::LoadServing(args.serving);
    if (!loaded.ok()) return Fail(loaded.status());
    serving = std::move(*loaded);
  }
  const auto bar = AttachPublishProgress(args, options);
  auto report =
      serving ? relay::PublishCheckpointsFp8(options, args.base, args.target, *serving,
                                             std::move(transport))
              : relay::PublishCheckpoints(options, args.base, args.target, std::move(transport));
  bar->Finish();
  if (!report.ok()) return Fail(report.status());
  PrintReport(*report, args.json);
  return report->committed ? kExitOk : kExitFailure;
}

Result<relay::PublishOptions> MakePublishOptions(const PublishArgs& args,
                                                 const topology::ClusterConfig& config,
                                                 const std::string& token,
                                                 const std::filesystem::path& new_version) {
  std::filesystem::path target = std::filesystem::absolute(new_version).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();
  const std::filesystem::path state =
      args.state_dir.empty() ? target.parent_path() / ".deltacast-source" : args.state_dir;
  return SourceOptions(config, token, args.codec, args.threads, state, args.keep_deltas);
}

std::shared_ptr<progress::Progress> AttachPublishProgress(const PublishArgs& args,
                                                          relay::PublishOptions& options) {
  std::shared_ptr<progress::Progress> bar =
      progress::Progress::ForTerminal("publish", args.progress && !args.json);
  if (bar->enabled()) {
    // Encoding the delta here: how much of the checkpoint's change is encoded (and
    // so streamed: the window holds the encoder to the slowest child). From
    // producers: the bytes sent, total unknown.
    options.on_progress = [bar](const relay::PublishProgress& p) {
      if (p.bytes_to_encode > 0) {
        bar->SetTotal(p.bytes_to_encode);
        bar->Set(p.encoded_bytes);
      } else {
        bar->Set(p.bytes_sent);
      }
    };
  }
  return bar;
}

int ReportPublish(const relay::PublishReport& report, bool as_json, const std::string& extra_json) {
  PrintReport(report, as_json, extra_json.empty() ? json::object() : json::parse(extra_json));
  return report.committed ? kExitOk : kExitFailure;
}

int RunServe(const ServeArgs& args) {
  auto setup = SetUpSource(args.config);
  if (!setup.ok()) return Fail(setup.status());
  auto& [config, token, transport] = *setup;
  auto options =
      SourceOptions(config, token, args.codec, args.threads, args.state_dir, args.keep_deltas);
  if (!options.ok()) return Fail(options.status());
  auto source = relay::Source::Start(std::move(*options), std::move(transport));
  if (!source.ok()) return Fail(source.status());
  // The first line names the version the cluster holds; each later one is published
  // from the version before it (the last one that committed).
  std::optional<relay::CheckpointVersion> current;
  std::string current_dir;
  bool all_committed = true;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    // "DIR" or "DIR fast|context": this version's codec mode.
    codec::EncodeOptions codec = args.codec;
    if (const auto space = line.rfind(' '); space != std::string::npos) {
      const std::string mode = line.substr(space + 1);
      if (mode == "fast" || mode == "context") {
        codec.mode = mode == "fast" ? codec::CodecMode::kFast : codec::CodecMode::kContext;
        line.resize(space);
      }
    }
    if (Status fp8 = current ? CheckFp8Versions(current_dir, line) : CheckFp8CheckpointDir(line);
        !fp8.ok()) {
      fmt::print(stderr, "deltacast serve: {}: {}\n", line, fp8.ToString());
      all_committed = false;
      continue;
    }
    auto next = relay::OpenCheckpointVersion(line, args.threads);
    if (!next.ok()) {
      fmt::print(stderr, "deltacast serve: {}: {}\n", line, next.status().ToString());
      all_committed = false;
      continue;
    }
    if (!current) {
      log::Info(fmt::format("serve: the cluster is at {} ({})",
                            next->manifest.VersionId().ShortHex(), line));
      current = std::move(*next);
      current_dir = line;
      continue;
    }
    if (Status same = relay::SameFileLayout(*current, *next); !same.ok()) {
      fmt::print(stderr, "deltacast serve: {}: {}\n", line, same.ToString());
      all_committed = false;
      continue;
    }
    auto report =
        (*source)->Publish(*current->store, current->manifest, *next->store, next->manifest, codec);
    if (!report.ok()) {
      fmt::print(stderr, "deltacast serve: {}: {}\n", line, report.status().ToString());
      all_committed = false;
      continue;
    }
    PrintReport(*report, args.json);
    all_committed = all_committed && report->committed;
    if (report->committed) {
      current = std::move(*next);
      current_dir = line;
    }
  }
  (*source)->Stop();
  return all_committed ? kExitOk : kExitFailure;
}

}  // namespace deltacast::agent

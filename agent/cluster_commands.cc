#include "agent/cluster_commands.h"

#include <fmt/core.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "agent/commands.h"
#include "apply/checkpoint_state.h"
#include "common/log.h"
#include "relay/node_agent.h"
#include "relay/node_transports.h"
#include "relay/publisher.h"
#include "topology/plan_format.h"
#include "topology/tree_plan.h"

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
  auto plan = topology::PlanTree(*config);
  if (!plan.ok()) return Fail(plan.status());
  fmt::print("{}\n", args.json ? topology::FormatPlanJson(*plan, *config, args.delta_bytes)
                               : topology::FormatPlanText(*plan, *config, args.delta_bytes));
  return kExitOk;
}

int RunAgent(const AgentArgs& args) {
  SignalWaiter signals;
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  auto replica =
      apply::Replica::OpenCheckpointDir(args.store, codec::kDefaultPartitionBytes, args.threads);
  if (!replica.ok()) return Fail(replica.status().WithContext("store " + args.store.string()));
  if ((*replica)->inflight()) {
    log::Warn(fmt::format(
        "{}: store {} has an unfinished delta {} -> {}; it resumes when the source resends it",
        args.node, args.store.string(), (*replica)->inflight()->base.ShortHex(),
        (*replica)->inflight()->target.ShortHex()));
  }
  const topology::NodeConfig* node = config->FindNode(args.node);
  if (node == nullptr) {
    return Fail(
        Status::InvalidArgument("node '" + args.node + "' is not in " + args.config.string()));
  }
  auto transport = relay::MakeNodeTransports(*config, *node);
  if (!transport.ok()) return Fail(transport.status());
  relay::NodeAgentOptions options;
  options.config = *config;
  options.node_id = args.node;
  options.token = *token;
  options.apply_threads = args.threads;
  options.spool_dir = args.store / apply::kStateDirName / "spool";
  auto agent =
      relay::NodeAgent::Start(std::move(options), std::move(*replica), std::move(*transport));
  if (!agent.ok()) return Fail(agent.status());
  const int signal = signals.Wait();
  log::Info(fmt::format("{}: stopping on signal {}", args.node, signal));
  (*agent)->Stop();
  return kExitOk;
}

relay::PublishOptions MakePublishOptions(const PublishArgs& args,
                                         const topology::ClusterConfig& config,
                                         const std::string& token,
                                         const std::filesystem::path& new_version) {
  relay::PublishOptions options;
  options.config = config;
  options.token = token;
  options.codec = args.codec;
  options.encode_threads = args.threads;
  std::filesystem::path target = std::filesystem::absolute(new_version).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "step1/"
  const std::filesystem::path state =
      args.state_dir.empty() ? target.parent_path() / ".deltacast-source" : args.state_dir;
  options.decision_log = state / "decisions.log";
  options.spool_dir = state / "spool";
  options.history_dir = state / "history";
  options.keep_deltas = args.keep_deltas;
  const bool tty = args.progress && !args.json && ::isatty(STDERR_FILENO);
  if (tty) {
    options.on_progress = [](const relay::PublishProgress& p) {
      fmt::print(stderr, "\r  streaming: {} chunks, {:.1f} MiB sent", p.chunks_sent,
                 double(p.bytes_sent) / (1 << 20));
    };
  }
  return options;
}

int ReportPublish(const relay::PublishReport& r, bool json_out, const std::string& extra_json) {
  const double full = double(r.delta.tensor_bytes);
  if (json_out) {
    json nodes = json::array();
    for (const auto& n : r.nodes) {
      nodes.push_back({{"node", n.node_id},
                       {"delta_bytes", n.chunk_bytes},
                       {"apply_seconds", n.apply_seconds},
                       {"partitions_applied", n.partitions_applied}});
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
             {"stream_seconds", r.stream_seconds},
             {"prepare_seconds", r.prepare_seconds},
             {"effective_gbps", full / r.seconds / 1e9},
             {"nodes_decided", r.nodes_decided},
             {"nodes", nodes}};
    if (!extra_json.empty()) out.update(json::parse(extra_json));
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("refit {} {}: {} -> {}\n", r.refit_id, r.committed ? "COMMITTED" : "ABORTED",
               r.base_version.ShortHex(), r.target_version.ShortHex());
    if (!r.committed) fmt::print("  reason: {}\n", r.abort_reason);
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
      fmt::print("    {:<16} received {:>9.2f} MiB, {:>5} partitions, prepared after {:.2f} s\n",
                 n.node_id, double(n.chunk_bytes) / (1 << 20), n.partitions_applied,
                 n.apply_seconds);
    }
  }
  return r.committed ? kExitOk : kExitFailure;
}

int RunPublish(const PublishArgs& args) {
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto token = topology::ReadAuthToken(*config);
  if (!token.ok()) return Fail(token.status());
  auto transport = relay::MakeNodeTransports(*config, *config->Source());
  if (!transport.ok()) return Fail(transport.status());
  relay::PublishOptions options = MakePublishOptions(args, *config, *token, args.target);
  const bool tty = options.on_progress != nullptr;
  auto report = relay::PublishCheckpoints(options, args.base, args.target, std::move(*transport));
  if (tty) fmt::print(stderr, "\n");
  if (!report.ok()) return Fail(report.status());
  return ReportPublish(*report, args.json, "");
}

}  // namespace deltacast::agent

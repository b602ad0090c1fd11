#include "agent/coordinator_command.h"

#include <fmt/core.h>
#include <signal.h>

#include <iostream>

#include "agent/commands.h"
#include "common/log.h"
#include "coord/etcd_commit_records.h"
#include "relay/tree/coordinator.h"

namespace deltacast::agent {
namespace {

int Fail(const Status& status) {
  std::cerr << "deltacast: " << status.ToString() << "\n";
  return kExitFailure;
}

template <typename Options>
Status Attach(const topology::ClusterConfig& config, Options& options) {
  if (!config.coordination) return Status::Ok();
  ASSIGN_OR_RETURN(options.commit_records, coord::MakeCommitRecordStore(config));
  options.source_timeout = config.coordination->source_timeout;
  options.poll_interval = config.coordination->poll_interval;
  return Status::Ok();
}

}  // namespace

Status AttachCommitRecords(const topology::ClusterConfig& config, relay::PublishOptions& options) {
  return Attach(config, options);
}

Status AttachCommitRecords(const topology::ClusterConfig& config,
                           relay::NodeAgentOptions& options) {
  return Attach(config, options);
}

int RunCoordinator(const CoordinatorArgs& args) {
  // SIGINT and SIGTERM blocked in every thread before any starts, then waited for.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto config = topology::LoadClusterConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  if (!config->coordination) {
    return Fail(Status::InvalidArgument(args.config.string() +
                                        ": no [coordination] table: a coordinator needs the "
                                        "commit record store"));
  }
  if (args.id.empty()) return Fail(Status::InvalidArgument("--id must not be empty"));
  auto store = coord::MakeCommitRecordStore(*config);
  if (!store.ok()) return Fail(store.status());
  relay::StandbyCoordinator coordinator(*store, config->name, args.id,
                                        config->coordination->poll_interval);
  coordinator.Start();  // it logs what it watches
  int signal = 0;
  sigwait(&set, &signal);
  coordinator.Stop();
  const relay::CoordinatorStats stats = coordinator.stats();
  log::Info(fmt::format("coordinator {}: stopping on signal {} ({} polls, {} failed, {} aborts)",
                        args.id, signal, stats.polls, stats.poll_failures, stats.aborts_written));
  return kExitOk;
}

}  // namespace deltacast::agent

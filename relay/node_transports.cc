#include "relay/node_transports.h"

#include <fmt/core.h>

#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "transport/factory.h"
#include "transport/transport_set.h"

namespace deltacast::relay {

Result<std::unique_ptr<transport::Transport>> MakeNodeTransports(
    const topology::ClusterConfig& config, const topology::NodeConfig& node) {
  std::vector<transport::TransportSet::Member> members;
  std::string failures;
  for (const std::string& name : node.transports) {
    transport::TransportOptions options;
    options.connect_timeout = config.tree.connect_timeout;
    const topology::LimitsConfig& limits = config.limits;
    options.handshake_max_message_bytes = limits.handshake_max_message;
    options.max_pending_handshakes = static_cast<size_t>(limits.max_pending_handshakes);
    options.max_handshakes_per_address = static_cast<size_t>(limits.max_handshakes_per_address);
    options.max_links_per_address = static_cast<size_t>(limits.max_connections_per_address);
    options.receive_pool_bytes = limits.receive_pool;
    options.receive_pool_idle = limits.receive_pool_idle;
    if (name == "ucx") options.provider = config.transport.ucx_provider;
    if (name == "ofi") options.provider = config.transport.ofi_provider;
    auto made = name == "inproc" ? Result<std::unique_ptr<transport::Transport>>(
                                       Status::InvalidArgument("inproc exists only inside tests"))
                                 : transport::MakeTransport(name, options);
    if (!made.ok()) {
      failures += (failures.empty() ? "" : "; ") + name + ": " + made.status().ToString();
      log::Warn(fmt::format("{}: transport {} cannot start here ({}); going on without it", node.id,
                            name, made.status().ToString()));
      continue;
    }
    members.push_back({name, std::move(made).value(), topology::TransportPortOffset(name)});
  }
  if (members.empty()) {
    return Status::Unavailable("node '" + node.id +
                               "': none of its transports can start: " + failures);
  }
  return std::unique_ptr<transport::Transport>(
      std::make_unique<transport::TransportSet>(std::move(members)));
}

}  // namespace deltacast::relay

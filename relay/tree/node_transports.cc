#include "relay/tree/node_transports.h"

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "transport/factory.h"
#include "transport/transport_set.h"

namespace deltacast::relay {
namespace {

// Which [security] rule encrypts a link between these regions, for messages.
std::string WhyTls(const topology::ClusterConfig& config, const std::string& from,
                   const std::string& to) {
  return config.security.tls == topology::TlsHops::kAll
             ? "[security] tls = \"all\""
             : fmt::format("it crosses regions ({} -> {}) and [security] tls = \"cross-region\"{}",
                           from, to, config.security.line ? "" : " (the default)");
}

}  // namespace

void ApplyLimits(const topology::LimitsConfig& limits, transport::TransportOptions& options) {
  options.handshake_max_message_bytes = limits.handshake_max_message;
  options.max_pending_handshakes = static_cast<size_t>(limits.max_pending_handshakes);
  options.max_handshakes_per_address = static_cast<size_t>(limits.max_handshakes_per_address);
  options.max_links_per_address = static_cast<size_t>(limits.max_connections_per_address);
  options.receive_pool_bytes = limits.receive_pool;
  options.receive_pool_idle = limits.receive_pool_idle;
}

transport::TransportOptions ConfiguredTransportOptions(const topology::ClusterConfig& config,
                                                       std::string_view backend,
                                                       std::string_view identity, size_t backends) {
  transport::TransportOptions options;
  // A child may have to try each of its backends in turn before one connects; its
  // parent waits connect_timeout for it in all, so each try gets a share. (It also
  // bounds how long an accepted socket may take over its transport handshake.)
  options.connect_timeout = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(1000),
      config.tree.connect_timeout / static_cast<int64_t>(std::max<size_t>(1, backends)));
  ApplyLimits(config.limits, options);
  if (backend == "tcp" && config.security.tls_files()) {
    options.tls = transport::TlsFiles{config.security.ca, config.security.CertFor(identity),
                                      config.security.KeyFor(identity)};
  }
  if (backend == "ucx") options.provider = config.transport.ucx_provider;
  if (backend == "ofi") options.provider = config.transport.ofi_provider;
  return options;
}

Result<std::unique_ptr<transport::Transport>> MakeProducerTransport(
    const topology::ClusterConfig& config, const std::string& identity) {
  RETURN_IF_ERROR(CheckProducerLinkSecurity(config));
  auto made =
      transport::MakeTransport("tcp", ConfiguredTransportOptions(config, "tcp", identity, 1));
  if (!made.ok()) return made.status().WithContext("the producer link of '" + identity + "'");
  return made;
}

Result<std::unique_ptr<transport::Transport>> MakeNodeTransports(
    const topology::ClusterConfig& config, const topology::NodeConfig& node) {
  std::vector<transport::TransportSet::Member> members;
  std::string failures;
  for (const std::string& name : node.transports) {
    const transport::TransportOptions options =
        ConfiguredTransportOptions(config, name, node.id, node.transports.size());
    auto made = name == "inproc" ? Result<std::unique_ptr<transport::Transport>>(
                                       Status::InvalidArgument("inproc exists only inside tests"))
                                 : transport::MakeTransport(name, options);
    if (!made.ok() && options.tls) {
      // Certificates that do not load are a configuration error, not a backend to
      // do without: hops that need TLS would fail anyway, later and less clearly.
      return made.status().WithContext("node '" + node.id + "'");
    }
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

Status CheckHopSecurity(const topology::ClusterConfig& config, const topology::TreePlan& plan,
                        const std::string& node_id) {
  const topology::PlannedNode* self = plan.Find(node_id);
  if (!self) return Status::NotFound("node '" + node_id + "' is not in the plan");
  struct Hop {
    std::string parent, child;
    const std::vector<std::string>* transports;
  };
  std::vector<Hop> hops;
  if (self->parent) hops.push_back({*self->parent, node_id, &self->transports});
  if (self->failover_parent) {
    hops.push_back({*self->failover_parent, node_id, &self->failover_transports});
  }
  for (const auto& n : plan.nodes) {
    if (n.parent == node_id) hops.push_back({node_id, n.id, &n.transports});
    if (n.failover_parent == node_id) hops.push_back({node_id, n.id, &n.failover_transports});
  }
  const topology::SecurityConfig& security = config.security;
  for (const Hop& hop : hops) {
    const topology::NodeConfig* parent = config.FindNode(hop.parent);
    const topology::NodeConfig* child = config.FindNode(hop.child);
    if (!topology::HopUsesTls(config, *parent, *child)) continue;
    const std::string why = WhyTls(config, parent->region, child->region);
    if (!security.tls_files()) {
      return Status::FailedPrecondition(fmt::format(
          "{}: the hop {} -> {} must run TLS ({}), but [security] names no ca, cert and key: "
          "run `deltacast certs --config {} --out DIR` and name its files in [security], or "
          "set [security] tls = \"none\" to send weights over that hop in plaintext",
          config.source_file.string(), hop.parent, hop.child, why, config.source_file.string()));
    }
    if (std::find(hop.transports->begin(), hop.transports->end(), "tcp") == hop.transports->end()) {
      return Status::FailedPrecondition(fmt::format(
          "{}: the hop {} -> {} must run TLS ({}), which only tcp carries, but the hop's "
          "transports do not include tcp (check [[link]] rules and the nodes' transports)",
          config.source_file.string(), hop.parent, hop.child, why));
    }
  }
  return Status::Ok();
}

Status CheckProducerLinkSecurity(const topology::ClusterConfig& config) {
  if (!topology::ProducerLinksUseTls(config) || config.security.tls_files()) return Status::Ok();
  const std::string source = config.Source() ? config.Source()->region : "";
  return Status::FailedPrecondition(fmt::format(
      "{}: the links between producers and the root must run TLS ({}), but [security] names "
      "no ca, cert and key: run `deltacast certs --config {} --out DIR --producer ID ...` and "
      "name its files in [security], set [security] producer_region to the source's region "
      "if the producers share its network, or set [security] tls = \"none\"",
      config.source_file.string(), WhyTls(config, source, topology::ProducerRegion(config)),
      config.source_file.string()));
}

}  // namespace deltacast::relay

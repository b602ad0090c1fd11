// The transports an agent (or the publisher) runs on: one backend per name in its
// node's `transports` list, gathered in a TransportSet so that each hop dials the
// first backend both ends list and falls back along the list.
//
// Thread safety: a plain function; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"
#include "transport/factory.h"
#include "transport/transport.h"

namespace deltacast::relay {

// The config's [limits] on what an unauthenticated peer may cost, into `options`.
void ApplyLimits(const topology::LimitsConfig& limits, transport::TransportOptions& options);

// Makes every backend `node` lists, with the config's [transport] providers. A backend
// that cannot start here (e.g. UCX finds no usable device) is left out with a warning
// naming why, as long as one remains; with none left, the error lists every reason.
// "inproc" is refused: it only exists inside a test process.
Result<std::unique_ptr<transport::Transport>> MakeNodeTransports(
    const topology::ClusterConfig& config, const topology::NodeConfig& node);

// The options of backend `backend`, one of `backends` the process runs, for the
// process whose certificate names `identity` (a node id, or a producer id): the
// config's [limits], its [transport] provider, a share of [tree] connect_timeout,
// and for tcp with [security] files, TLS with that identity's certificate and key.
// The one place the config becomes transport options: nodes, the root and
// producers all start from it.
transport::TransportOptions ConfiguredTransportOptions(const topology::ClusterConfig& config,
                                                       std::string_view backend,
                                                       std::string_view identity, size_t backends);

// The link between producers and the root (docs/producers.md): tcp, as
// ConfiguredTransportOptions makes it for `identity` (the producer's id on a
// producer, the source's on the root). kFailedPrecondition when [security]
// encrypts producer links but names no certificates (CheckProducerLinkSecurity);
// certificate files that do not load fail with the path.
Result<std::unique_ptr<transport::Transport>> MakeProducerTransport(
    const topology::ClusterConfig& config, const std::string& identity);

// Whether producer links that [security] encrypts (topology::ProducerLinksUseTls)
// can be: kFailedPrecondition naming the rule and the ways out when no TLS files
// are named.
Status CheckProducerLinkSecurity(const topology::ClusterConfig& config);

// Whether every hop of `node_id` in `plan` that [security] tls encrypts can be: the
// config names TLS files, and tcp (the one backend that carries TLS) is among the
// hop's transports. kFailedPrecondition naming the hop and the way out otherwise.
// A node checks it before it starts, so a cross-region link is never plaintext by
// mistake.
Status CheckHopSecurity(const topology::ClusterConfig& config, const topology::TreePlan& plan,
                        const std::string& node_id);

}  // namespace deltacast::relay

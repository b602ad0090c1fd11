#include "topology/internal/security_config.h"

#include <algorithm>
#include <span>
#include <string>

#include "topology/config_keys.h"
#include "topology/internal/section_parser.h"
#include "topology/units.h"

namespace deltacast::topology {

std::string_view TlsHopsName(TlsHops hops) {
  switch (hops) {
    case TlsHops::kNone:
      return "none";
    case TlsHops::kCrossRegion:
      return "cross-region";
    case TlsHops::kAll:
      return "all";
  }
  return "?";
}

namespace {

std::filesystem::path ForNode(const std::filesystem::path& pattern, std::string_view node_id) {
  std::string s = pattern.string();
  for (size_t at = s.find("{node}"); at != std::string::npos; at = s.find("{node}", at)) {
    s.replace(at, 6, node_id);
    at += node_id.size();
  }
  return s;
}

}  // namespace

std::filesystem::path SecurityConfig::CertFor(std::string_view node_id) const {
  return ForNode(cert, node_id);
}
std::filesystem::path SecurityConfig::KeyFor(std::string_view node_id) const {
  return ForNode(key, node_id);
}

bool HopUsesTls(const ClusterConfig& config, const NodeConfig& parent, const NodeConfig& child) {
  switch (config.security.tls) {
    case TlsHops::kNone:
      return false;
    case TlsHops::kAll:
      return true;
    case TlsHops::kCrossRegion:
      return parent.region != child.region;
  }
  return false;
}

std::string ProducerRegion(const ClusterConfig& config) {
  if (!config.security.producer_region.empty()) return config.security.producer_region;
  const NodeConfig* source = config.Source();
  return source ? source->region : std::string();
}

bool ProducerLinksUseTls(const ClusterConfig& config) {
  const NodeConfig* source = config.Source();
  if (!source) return config.security.tls == TlsHops::kAll;
  NodeConfig producer = *source;  // the hop's other end, as a node of ProducerRegion
  producer.region = ProducerRegion(config);
  return HopUsesTls(config, *source, producer);
}

namespace internal {
namespace {

Status ParseLimits(const toml::table& t, std::string_view source, LimitsConfig& limits) {
  SectionParser p(source, "[limits]");
  RETURN_IF_ERROR(p.CheckKeys(t, ConfigKeyNames("limits")));
  RETURN_IF_ERROR(p.Duration(t, "handshake_timeout", limits.handshake_timeout));
  RETURN_IF_ERROR(p.Int(t, "max_pending_handshakes", 1, 1 << 20, limits.max_pending_handshakes));
  RETURN_IF_ERROR(
      p.Int(t, "max_handshakes_per_address", 1, 1 << 20, limits.max_handshakes_per_address));
  RETURN_IF_ERROR(
      p.Int(t, "max_connections_per_address", 1, 1 << 20, limits.max_connections_per_address));
  // The floor fits the largest CHALLENGE / HELLO / WELCOME (docs/protocol.md).
  RETURN_IF_ERROR(p.Size(t, "handshake_max_message", uint64_t{80} << 10, uint64_t{1} << 30,
                         limits.handshake_max_message));
  RETURN_IF_ERROR(p.Size(t, "receive_pool", 0, uint64_t{64} << 30, limits.receive_pool));
  RETURN_IF_ERROR(p.Duration(t, "receive_pool_idle", limits.receive_pool_idle));
  if (limits.max_handshakes_per_address > limits.max_pending_handshakes) {
    return p.Error(
        t,
        "max_handshakes_per_address = " + std::to_string(limits.max_handshakes_per_address) +
            " exceeds max_pending_handshakes = " + std::to_string(limits.max_pending_handshakes));
  }
  return Status::Ok();
}

Status ParseSecurity(const toml::table& t, std::string_view source, SecurityConfig& security) {
  SectionParser p(source, "[security]");
  RETURN_IF_ERROR(p.CheckKeys(t, ConfigKeyNames("security")));
  security.line = static_cast<int>(t.source().begin.line);
  if (const toml::node* n = t.get("tls")) {
    ASSIGN_OR_RETURN(std::string hops, p.String(*n, "tls"));
    if (hops == "none") {
      security.tls = TlsHops::kNone;
    } else if (hops == "cross-region") {
      security.tls = TlsHops::kCrossRegion;
    } else if (hops == "all") {
      security.tls = TlsHops::kAll;
    } else {
      return p.Error(*n, "tls = \"" + hops + "\": must be \"cross-region\", \"all\" or \"none\"");
    }
  }
  const std::filesystem::path dir = std::filesystem::path(source).parent_path();
  RETURN_IF_ERROR(p.Path(t, "ca", dir, security.ca));
  RETURN_IF_ERROR(p.Path(t, "cert", dir, security.cert));
  RETURN_IF_ERROR(p.Path(t, "key", dir, security.key));
  RETURN_IF_ERROR(p.Path(t, "signing_key", dir, security.signing_key));
  RETURN_IF_ERROR(p.Path(t, "verify_key", dir, security.verify_key));
  if (const toml::node* n = t.get("producer_region")) {
    ASSIGN_OR_RETURN(security.producer_region, p.String(*n, "producer_region"));
    if (security.producer_region.empty()) {
      return p.Error(*n,
                     "producer_region = \"\": name a region, or leave the key out for the "
                     "source's");
    }
  }
  const int named = !security.ca.empty() + !security.cert.empty() + !security.key.empty();
  if (named != 0 && named != 3) {
    return p.Error(t, "names some of ca, cert and key but not all three: TLS needs each");
  }
  if (!security.signing_key.empty() && security.verify_key.empty()) {
    return p.Error(t, "names signing_key without verify_key: nodes could not check signatures");
  }
  return Status::Ok();
}

}  // namespace

Status ParseLimitsAndSecurity(const toml::table& root, std::string_view source_name,
                              ClusterConfig& config) {
  if (const toml::node* n = root.get("limits")) {
    const toml::table* t = n->as_table();
    if (!t) {
      return Status::InvalidArgument(std::string(source_name) + ":" +
                                     std::to_string(n->source().begin.line) +
                                     ": \"limits\" must be a table [limits]");
    }
    RETURN_IF_ERROR(ParseLimits(*t, source_name, config.limits));
  }
  if (const toml::node* n = root.get("security")) {
    const toml::table* t = n->as_table();
    if (!t) {
      return Status::InvalidArgument(std::string(source_name) + ":" +
                                     std::to_string(n->source().begin.line) +
                                     ": \"security\" must be a table [security]");
    }
    RETURN_IF_ERROR(ParseSecurity(*t, source_name, config.security));
  }
  return Status::Ok();
}

}  // namespace internal
}  // namespace deltacast::topology

// The TLS identity checks of a joining link (docs/protocol.md, "TLS"), shared by the
// tree (relay/tree/downstream.cc, relay/tree/parent_link.cc) and the producers' links
// (relay/producers/producer_hub.cc, relay/producers/producer.cc), so both hold peers to the same
// rule: over TLS a peer's certificate (its CN, Connection::PeerIdentity()) must name the id it
// claims, and a link the config encrypts must have come over TLS.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/log.h"
#include "common/status.h"

namespace deltacast::relay {

// The accepting side: a peer announcing itself as `claimed_id` ("node 'n2'",
// "producer 'rank-00001'": `kind` is "node" or "producer"). `rule` says which
// [security] rule encrypts the link, for the refusal.
inline Status CheckJoiningIdentity(const std::string& identity, std::string_view kind,
                                   const std::string& claimed_id, bool tls_required,
                                   std::string_view rule) {
  const std::string who = std::string(kind) + " '" + log::Escape(claimed_id) + "'";
  if (!identity.empty() && identity != claimed_id) {
    return Status::PermissionDenied(who + " presented the certificate of '" +
                                    log::Escape(identity) + "'");
  }
  if (identity.empty() && tls_required) {
    return Status::PermissionDenied(who + " must connect over TLS with its certificate (" +
                                    std::string(rule) + "); it came without");
  }
  return Status::Ok();
}

// The dialling side: the peer it dialled must be `expected_id`. `link` names the
// link for the refusal ("the hop src -> n1", "the producer link rank-00000 -> root").
inline Status CheckDialledIdentity(const std::string& identity, const std::string& expected_id,
                                   bool tls_required, std::string_view link) {
  if (!identity.empty() && identity != expected_id) {
    return Status::PermissionDenied("its certificate is that of '" + log::Escape(identity) +
                                    "', not of '" + expected_id + "'");
  }
  if (identity.empty() && tls_required) {
    return Status::PermissionDenied(std::string(link) +
                                    " must run TLS ([security] tls), but this link does not");
  }
  return Status::Ok();
}

}  // namespace deltacast::relay

// The signing keys a cluster config's [security] table names, loaded for the
// source (signing_key) and the nodes (verify_key): what the CLI and the public API
// hand to relay::PublishOptions and relay::NodeAgentOptions. Kept apart from
// relay/wire/signing.h, which knows no config (the protocol fuzz target links it alone).
//
// Thread safety: plain functions; thread-safe.
#pragma once

#include <memory>

#include "common/status.h"
#include "relay/wire/signing.h"
#include "topology/cluster_config.h"

namespace deltacast::relay {

// The keys the config's [security] table names. Null when it names no verify_key
// (versions go unsigned and unchecked). For the source, kFailedPrecondition when
// verify_key is named without signing_key or the two are not one pair.
Result<std::shared_ptr<const VerifyKey>> LoadConfiguredVerifyKey(const topology::ClusterConfig& c);
Result<std::shared_ptr<const SigningKey>> LoadConfiguredSigningKey(
    const topology::ClusterConfig& c);

}  // namespace deltacast::relay

#include "relay/tree/configured_keys.h"

#include <string>

namespace deltacast::relay {

Result<std::shared_ptr<const VerifyKey>> LoadConfiguredVerifyKey(const topology::ClusterConfig& c) {
  if (c.security.verify_key.empty()) return std::shared_ptr<const VerifyKey>();
  auto key = VerifyKey::Load(c.security.verify_key);
  if (!key.ok()) return key.status().WithContext("[security] verify_key");
  return std::make_shared<const VerifyKey>(std::move(*key));
}

Result<std::shared_ptr<const SigningKey>> LoadConfiguredSigningKey(
    const topology::ClusterConfig& c) {
  if (c.security.verify_key.empty()) return std::shared_ptr<const SigningKey>();
  if (c.security.signing_key.empty()) {
    return Status::FailedPrecondition(
        c.source_file.string() +
        ": [security] names verify_key, so every node checks the source's signatures, but no "
        "signing_key: the source cannot sign");
  }
  auto key = SigningKey::Load(c.security.signing_key);
  if (!key.ok()) return key.status().WithContext("[security] signing_key");
  ASSIGN_OR_RETURN(auto verify, LoadConfiguredVerifyKey(c));
  const auto probe = AsBytes("deltacast key check");
  if (!verify->Verify(probe, key->Sign(probe))) {
    return Status::FailedPrecondition("[security] signing_key " + c.security.signing_key.string() +
                                      " is not the private half of verify_key " +
                                      c.security.verify_key.string());
  }
  return std::make_shared<const SigningKey>(std::move(*key));
}

}  // namespace deltacast::relay

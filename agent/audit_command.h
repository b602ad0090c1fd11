// `deltacast audit DIR`: a node's checkpoint directory against the version it holds
// active (what its agent last committed), from outside the agent: every partition
// is hashed now and compared with the cached manifest of that version, and each
// tensor that differs is named (codec/manifest_diff.h). The in-process form is
// Node::Verify.
//
// Thread safety: one call at a time; it runs its own hashing threads.
#pragma once

#include <cstddef>
#include <filesystem>

namespace deltacast::agent {

struct AuditArgs {
  std::filesystem::path dir;
  size_t threads = 0;  // 0: all cores
  bool json = false;
};
// kExitOk when the directory holds its active version, kExitDiffers when not,
// kExitFailure when it cannot be audited (not a node's directory, a delta in flight).
int RunAudit(const AuditArgs& args);

}  // namespace deltacast::agent

// JoinCheck: what a node learned when it joined its parent, for its user. Whether
// the parent let it in (a refusal names why: a wrong cluster token, another node's
// certificate, a parent that could not prove the token) and whether its weights are
// the version the parent holds: the parent says its version after WELCOME
// (ACTIVE_VERSION), with its manifest when they differ, and the node names the
// tensors and partitions that differ (docs/protocol.md, "Checks at the door"). A
// node behind on the cluster's own chain still catches up at the next refit as
// before; this only says so early. Nothing is written from what the parent sends.
//
// Thread safety: the setters run on the node's loop thread; Current, Wait and
// NoteFor from any thread.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "codec/manifest_diff.h"
#include "common/hash.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace deltacast::relay {

class JoinCheck {
 public:
  struct State {
    bool joined = false;   // a link to the parent completed its handshake
    bool checked = false;  // the parent said its version, and the weights were compared
    std::string parent;
    Digest128 parent_version;  // zero: the parent does not know the cluster's version yet
    Digest128 own_version;
    std::optional<codec::ManifestDiff> differences;  // versions differ and the manifest came
    // Ok: joined, and the weights are the parent's version (or it had none to say).
    // PermissionDenied: refused at the door. FailedPrecondition: the weights differ.
    // Unavailable: not joined (yet).
    Status status = Status::Unavailable("not joined to its parent yet");
  };

  // The parent refused this node, or this node refused the parent.
  void Refused(const std::string& parent, const Status& why);
  // The parent's WELCOME came: the version check follows.
  void Joined(const std::string& parent);
  // The parent holds `parent_version`; this node `own_version`; `differences` when
  // they differ and the parent sent its manifest.
  void Told(const std::string& parent, const Digest128& parent_version,
            const Digest128& own_version, std::optional<codec::ManifestDiff> differences);

  State Current() const;
  // Waits until the first version check is done or the node was refused, at most
  // `timeout`; returns the state then.
  State Wait(std::chrono::milliseconds timeout) const;
  // For a FAILED that begins from `base`: what the check found, if it compared the
  // weights against `base` and they differ ("" otherwise).
  std::string NoteFor(const Digest128& base) const;

 private:
  mutable Mutex mu_;
  mutable CondVar changed_;
  State state_ GUARDED_BY(mu_);
  bool settled_ GUARDED_BY(mu_) = false;  // a check or a refusal happened
};

}  // namespace deltacast::relay

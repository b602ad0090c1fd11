#include "relay/tree/join_check.h"

#include "common/thread_annotations.h"

namespace deltacast::relay {

void JoinCheck::Refused(const std::string& parent, const Status& why) {
  MutexLock lock(mu_);
  state_.joined = false;
  state_.parent = parent;
  state_.status = why;
  settled_ = true;
  changed_.notify_all();
}

void JoinCheck::Joined(const std::string& parent) {
  MutexLock lock(mu_);
  state_.joined = true;
  state_.parent = parent;
  // A refusal is over; an earlier check stands until the parent says its version.
  if (state_.status.code() == StatusCode::kPermissionDenied ||
      state_.status.code() == StatusCode::kUnavailable) {
    state_.status = Status::Ok();
  }
  changed_.notify_all();
}

void JoinCheck::Told(const std::string& parent, const Digest128& parent_version,
                     const Digest128& own_version, std::optional<codec::ManifestDiff> differences) {
  MutexLock lock(mu_);
  state_.checked = true;
  state_.parent = parent;
  state_.parent_version = parent_version;
  state_.own_version = own_version;
  state_.differences = std::move(differences);
  if (parent_version.IsZero() || parent_version == own_version) {
    state_.status = Status::Ok();
  } else {
    std::string what = state_.differences
                           ? "; " + state_.differences->Describe()
                           : "; the parent sent no manifest to compare (it is mid-refit)";
    state_.status = Status::FailedPrecondition(
        "this node's weights are version " + own_version.ShortHex() + ", not version " +
        parent_version.ShortHex() + " that its parent '" + parent + "' holds" + what +
        " (weights of an earlier version of this cluster catch up at the next refit; any "
        "others make it fail)");
  }
  settled_ = true;
  changed_.notify_all();
}

JoinCheck::State JoinCheck::Current() const {
  MutexLock lock(mu_);
  return state_;
}

JoinCheck::State JoinCheck::Wait(std::chrono::milliseconds timeout) const {
  MutexLock lock(mu_);
  changed_.wait_for(lock, timeout, [&]() REQUIRES(mu_) { return settled_; });
  return state_;
}

std::string JoinCheck::NoteFor(const Digest128& base) const {
  MutexLock lock(mu_);
  if (!state_.checked || state_.parent_version != base || !state_.differences ||
      state_.differences->empty()) {
    return "";
  }
  return "; at join its weights differed from " + base.ShortHex() + ": " +
         state_.differences->Describe();
}

}  // namespace deltacast::relay

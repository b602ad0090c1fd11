// A relay node's checks of weights against versions: at the door (what a parent
// tells a child that joins, and what the child makes of it) and on demand (Verify).
// The rest of the node is node_agent.cc (wiring), node_refit.cc and node_outcome.cc.
#include <fmt/core.h>

#include <future>

#include "common/log.h"
#include "relay/tree/node_impl.h"

namespace deltacast::relay {

void NodeAgent::Impl::TellVersion(const std::string& child, const Hello& hello) {
  if (journal_.inflight || catch_up_.active() || (refit_ && refit_->phase != Phase::kDone)) {
    // Mid-refit the versions move (a child may be ahead of this node for a moment):
    // nothing settled to check against; the refit itself checks.
    downstream_.SendTo(child, transport::MakeMessage(EncodeActiveVersion(Digest128{}, {})));
    return;
  }
  const Digest128 mine = journal_.version;
  if (hello.active_version == mine) {
    downstream_.SendTo(child, transport::MakeMessage(EncodeActiveVersion(mine, {})));
    return;
  }
  // The child holds another version: it gets the manifest, to name what differs.
  store_.ActiveManifest(
      [this, child](Digest128 version, std::shared_ptr<const std::vector<std::byte>> manifest) {
        downstream_.SendTo(child, transport::MakeMessage(EncodeActiveVersion(
                                      version, manifest ? ByteSpan(*manifest) : ByteSpan())));
      });
}

void NodeAgent::Impl::OnParentVersion(uint32_t stripe, ByteSpan bytes) {
  ParentLink& up = *parents_[stripe];
  auto told = ParseActiveVersion(bytes);
  if (!told.ok()) return up.ProtocolError(told.status().message());
  const std::string parent = up.current();
  Digest128 theirs = told->version;
  const Digest128 mine = journal_.version;
  // A delta of its own in flight between those versions: the refit settles it.
  if (journal_.inflight &&
      (theirs == journal_.inflight->base || theirs == journal_.inflight->target)) {
    theirs = Digest128{};
  }
  auto report = [this](const JoinCheck::State& state) {
    if (state.status.ok()) {
      log::Info(fmt::format("{}: its weights are version {}, as its parent {} holds",
                            options_.node_id, state.own_version.ShortHex(), state.parent));
    } else {
      log::Warn(fmt::format("{}: {}", options_.node_id, state.status.message()));
    }
  };
  if (theirs.IsZero() || theirs == mine || !told->has_manifest) {
    join_.Told(parent, theirs, mine, std::nullopt);
    return report(join_.Current());
  }
  auto manifest = codec::Manifest::Parse(told->manifest);
  if (!manifest.ok()) {
    return up.ProtocolError("ACTIVE_VERSION manifest: " + manifest.status().message());
  }
  store_.CompareWith(std::move(*manifest),
                     [this, parent, theirs, mine, report](Result<NodeStore::Check> check) {
                       if (check.ok()) {
                         join_.Told(parent, theirs, check->version, std::move(check->diff));
                       } else {
                         join_.Told(parent, theirs, mine, std::nullopt);
                       }
                       report(join_.Current());
                     });
}

Result<NodeStore::Check> NodeAgent::Impl::Verify() {
  if (stopped_) return Status::FailedPrecondition("the node is stopped");
  auto result = std::make_shared<std::promise<Result<NodeStore::Check>>>();
  auto future = result->get_future();
  loop_.Post([this, result] {
    store_.Verify(
        [result](Result<NodeStore::Check> check) { result->set_value(std::move(check)); });
  });
  try {
    return future.get();
  } catch (const std::future_error&) {  // the node stopped: its loops dropped the task
    return Status::Aborted("the node stopped while verifying");
  }
}

}  // namespace deltacast::relay

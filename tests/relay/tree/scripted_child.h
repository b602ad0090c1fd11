// ScriptedChild: a stand-in for a relay node below a parent under test, for tests of
// the parent half of the two-phase commit. It joins its planned parent through the
// real ParentLink (CHALLENGE / HELLO with the token / WELCOME, heartbeats, the
// parent's idle timeout), grants credit as a node does (the window on each BEGIN, one
// per chunk), records what it receives, and answers as its ChildScript says: it may
// join late or never, drop its link at a stage and stay away (or come back), say
// PREPARED or FAILED, and confirm the decision or say FAILED to it. It applies
// nothing: PREPARED only says that every chunk sequence 0..END came.
//
// Thread safety: the child runs on its own EventLoop thread; record() and Wait from
// any thread. Script triggers run on that loop thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "common/event_loop.h"
#include "common/hash.h"
#include "relay/tree/parent_link.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"
#include "transport/transport.h"

namespace deltacast::test_util {

// Where a child drops its link (then stays away unless ChildScript::rejoin_when).
enum class DropAt {
  kNever,
  kBegin,       // on receiving BEGIN
  kFirstChunk,  // on receiving its first CHUNK of the refit
  kPrepared,    // once the parent took its PREPARED (else closing would withdraw it)
};
// What it says while streaming.
enum class StreamAnswer {
  kPrepared,  // PREPARED once every chunk up to END came
  kFailed,    // FAILED (kind kNode, naming itself) on its first chunk
};
// What it says to the decision.
enum class DecisionAnswer {
  kConfirm,  // COMMITTED / ABORTED for itself
  kFailed,   // FAILED naming itself (it cannot reach the decided version)
};

struct ChildScript {
  // Polled on every tick while the child has never joined: it dials once this holds.
  // Null: it never joins.
  std::function<bool()> join_when = [] { return true; };
  DropAt drop_at = DropAt::kNever;
  // Polled while it is away after the drop: it dials again once this holds. Null:
  // it stays away.
  std::function<bool()> rejoin_when{};
  // Polled once it could say PREPARED: it does once this holds. Null: at once.
  std::function<bool()> prepare_when{};
  StreamAnswer stream = StreamAnswer::kPrepared;
  DecisionAnswer decision = DecisionAnswer::kConfirm;
  std::string reason = "scripted failure";
};

// What the child received and said (the current refit: a new refit id resets it).
struct ChildRecord {
  int joins = 0;  // WELCOMEs: 1 + rejoins
  // ACTIVE_VERSIONs received since it started, and of them those with a manifest.
  int versions_told = 0;
  int manifests_told = 0;
  int begins = 0;  // BEGINs received (a replay after a rejoin sends it again)
  uint64_t refit_id = 0;
  std::set<uint32_t> chunks;    // sequences received
  std::optional<uint32_t> end;  // the END chunk's sequence, once it came
  bool dropped = false;         // it dropped its link as scripted
  bool prepared_sent = false;
  bool failed_sent = false;  // while streaming or to the decision
  std::optional<relay::MessageType> decision;
  bool confirmed_sent = false;

  // Every sequence 0..END came.
  bool AllChunks() const { return end && chunks.size() == *end + 1 && *chunks.rbegin() == *end; }
};

class ScriptedChild {
 public:
  // Starts child `id`, a planned receiver of `config` (its parent is the node under
  // test); `active_version` is what its HELLO says it holds (zero: nothing known). It
  // joins as the script says. kNotFound if the plan has no such receiver.
  static Result<std::unique_ptr<ScriptedChild>> Start(
      const topology::ClusterConfig& config, const std::string& id, std::string token,
      Digest128 active_version, std::unique_ptr<transport::Transport> transport,
      ChildScript script);
  ~ScriptedChild();  // Stop()
  ScriptedChild(const ScriptedChild&) = delete;
  ScriptedChild& operator=(const ScriptedChild&) = delete;

  // Closes the link and joins the loop thread. Idempotent.
  void Stop();
  const std::string& id() const { return id_; }
  ChildRecord record() const;
  // Blocks until `done(record())` holds or `timeout` passes; whether it held.
  bool Wait(const std::function<bool(const ChildRecord&)>& done,
            std::chrono::milliseconds timeout) const;

 private:
  ScriptedChild(const topology::ClusterConfig& config, topology::TreePlan plan, size_t self,
                std::string token, Digest128 active_version,
                std::unique_ptr<transport::Transport> transport, ChildScript script);
  relay::ParentLink::Events LinkEvents();
  void Tick();
  void OnMessage(relay::MessageType type, const transport::Message& message);
  void OnBegin(ByteSpan bytes);
  void OnChunk(ByteSpan bytes);
  void OnDecision(relay::MessageType type, ByteSpan bytes);
  void MaybePrepared();
  void SendFailed();
  void DropLink();
  // Runs `change` on the record under the lock and wakes the waiters.
  void Update(const std::function<void(ChildRecord&)>& change);

  const topology::ClusterConfig config_;
  const topology::TreePlan plan_;
  const topology::PlannedNode& self_;  // in plan_
  const std::string id_;
  const Digest128 active_version_;
  const ChildScript script_;
  class UntakenCounter;
  UntakenCounter* counter_;  // owned by transport_
  std::unique_ptr<transport::Transport> transport_;

  // Loop thread.
  bool dialing_ = false;   // the link is ticked: it dials, keeps alive, rejoins
  bool drop_due_ = false;  // DropAt::kPrepared: drop once what it sent was taken

  std::atomic<bool> stopped_{false};  // Stop (any thread) and the loop's tick

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  ChildRecord record_;  // guarded by mu_

  // Declared last, so destroyed first (Stop has joined the loop by then): the link
  // uses the loop and transport_.
  EventLoop loop_;
  relay::ParentLink parent_;
};

}  // namespace deltacast::test_util

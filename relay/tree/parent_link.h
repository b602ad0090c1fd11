// ParentLink: a relay node's link to its parent. It dials the planned parent (or,
// with commit policy `available`, after the parent has been unreachable for
// kFailoverAfter, the failover parent from the plan; back home between refits),
// answers the parent's CHALLENGE with a HELLO that proves the cluster token, checks
// that the parent's WELCOME proves it too (and, over TLS, that the parent's
// certificate names it), drops a link whose handshake takes longer than
// [limits] handshake_timeout, keeps
// the link alive with heartbeats, drops it after `idle_timeout` of silence (no
// bytes: a message still arriving is not silence), and
// reconnects with backoff. Messages after the handshake go to the owner.
//
// Owns: the connection, which parent it is dialling, backoff and failover timers.
// The owner builds the HELLO (what the node holds) and decides what a lost link
// means for its refit.
//
// Thread safety: everything runs on the owner's EventLoop thread; transport
// callbacks only post to it. Events are called on that thread, never from inside
// Send.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "common/runtime.h"
#include "relay/tree/refusing_links.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"
#include "topology/tree_plan.h"
#include "transport/transport.h"

namespace deltacast::relay {

class ParentLink {
 public:
  using Clock = RuntimeClock;
  // How long a node keeps trying its planned parent before it dials its failover
  // parent (policy `available`, or a planned parent that is a sender).
  static constexpr std::chrono::milliseconds kFailoverAfter{3000};

  struct Events {
    // The HELLO answering a CHALLENGE: what this node holds (node id, proof,
    // transport fields are filled in here).
    std::function<Hello()> hello;
    std::function<void()> joined;  // WELCOME: messages flow
    // The link dropped (closed, refused, idle, a protocol error): the node
    // reconnects by itself.
    std::function<void(const Status& why)> lost;
    // Refused at the door (before `lost`, if a link was up): the parent refused this
    // node (REFUSE: a wrong token, another node's certificate), or this node refused
    // the parent (it could not prove the token; a TLS identity that is not its).
    std::function<void(const Status& why)> refused;
    // The parent dialled (`parent`) refused this node because it cannot serve refit
    // `refit_id` on this link's stripe (it is left out of it; before `refused`). With
    // policy `available` the link fails over at once when that parent is the
    // planned one: waiting out kFailoverAfter would only delay the replay.
    std::function<void(const std::string& parent, uint64_t refit_id)> shed;
    // Any message after the handshake but HEARTBEAT; valid during the call.
    std::function<void(MessageType type, const transport::Message& message)> message;
  };

  // `loop`, `config`, `self` and `transport` must outlive this object.
  ParentLink(EventLoop& loop, const topology::ClusterConfig& config,
             const topology::PlannedNode& self, std::string token, transport::Transport& transport,
             Events events);
  ~ParentLink();

  // Dials when disconnected and due, sends the heartbeat, drops a silent link, and
  // between refits leaves a failover parent to go home.
  void Tick(Clock::time_point now, bool between_refits);
  // Sends `bytes` to the parent; dropped unless the handshake is done.
  void Send(std::vector<std::byte> bytes);
  // Closes the link; it is dialled again after the backoff.
  void Drop(const Status& why);
  // Tells the parent what was wrong (REFUSE) and drops the link.
  void ProtocolError(const std::string& what);
  void Close();

  bool joined() const { return joined_; }
  // The parent dialled now: the planned one or its failover parent.
  const std::string& current() const { return current_; }
  bool on_failover() const { return current_ != *self_.parent; }

 private:
  void ChooseParent(Clock::time_point now);
  void Dial();
  void OnConnected(Result<std::unique_ptr<transport::Connection>> result,
                   const std::string& backend);
  void OnMessage(uint64_t serial, const transport::Message& message);
  // After the link closed: when to dial again, and the owner's lost event.
  void Lost(bool had_link, const Status& why);
  // Sends REFUSE, closes the link once it is out, and reports it lost with `why`.
  void RefuseAndClose(const std::string& reason, const Status& why);
  const std::vector<std::string>& HopTransports() const;
  // The link's TLS identity (if any) is current_, and TLS is there if the hop needs it.
  Status CheckParentIdentity() const;
  std::string AddressOf(const std::string& id) const;

  EventLoop& loop_;
  const topology::ClusterConfig& config_;
  const topology::PlannedNode& self_;
  const std::string token_;
  transport::Transport& transport_;
  Events events_;

  std::unique_ptr<transport::Connection> link_;
  // Parents refused: closed once their REFUSE is out, or at the handshake timeout.
  RefusingLinks refusing_{loop_};
  std::string current_;                                // the planned parent, or its failover parent
  std::string address_;                                // of current_
  std::string backend_;                                // the backend the link runs over
  std::optional<Clock::time_point> lost_at_;           // unreachable since
  std::optional<Clock::time_point> lost_before_join_;  // lost_at_ when the link last joined
  Clock::time_point next_primary_try_ = Clock::now();
  Clock::time_point next_connect_ = Clock::now();
  Clock::time_point next_heartbeat_ = Clock::now();
  Clock::time_point last_heard_ = Clock::now();
  Clock::time_point connected_at_ = Clock::now();
  bool challenged_ = false;         // this link's CHALLENGE came (and was answered)
  std::string last_connect_error_;  // of the last failed dial, to log each reason once
  std::array<uint8_t, kNonceBytes> parent_nonce_{};
  std::array<uint8_t, kNonceBytes> child_nonce_{};
  std::chrono::milliseconds backoff_{100};
  uint64_t serial_ = 0;
  bool connecting_ = false;
  bool joined_ = false;
};

}  // namespace deltacast::relay

// Downstream: a relay-tree node's links to its children. It authenticates each
// child (CHALLENGE / HELLO / WELCOME), forwards messages to every child in order,
// holds CHUNK messages back until that child has granted credit (so a slow child
// bounds, rather than grows, what this node holds), and reports what children say.
//
// Expected children that are not connected yet get their messages queued, so a
// child that joins late still receives the whole refit in order; the queue is
// bounded by the credit window the parent grants this node.
//
// Striped trees (relay/tree/stripe_links.h): children are links, named by their key
// (the child's id for stripe 0, "id#s" for stripe s); a HELLO says which stripe it
// joins. A data chunk goes only to the links of its stripe (k mod S), the END and
// control messages to every link.
//
// Thread safety: everything runs on the owner's EventLoop thread; transport
// callbacks only post to that loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/event_loop.h"
#include "relay/tree/refusing_links.h"
#include "relay/wire/internal/handshake_limits.h"
#include "relay/wire/protocol.h"
#include "topology/cluster_config.h"
#include "transport/transport.h"

namespace deltacast::relay {

class Downstream {
 public:
  using Limits = HandshakeLimits;
  static Limits LimitsFrom(const topology::LimitsConfig& config);

  struct Events {
    // A child passed the handshake; `hello` says what it holds, so the owner can
    // Requeue what it lacks.
    std::function<void(const std::string& child, const Hello& hello)> joined;
    std::function<void(const std::string& child, const Status& why)> lost;
    // A planned child's HELLO was refused (a wrong token proof, another node's
    // certificate, a backend this node does not speak): why, for the reports that
    // name the children that did not join. Also a child that refused this node as
    // its parent (its REFUSE: this node's WELCOME did not prove the token).
    std::function<void(const std::string& child, const std::string& reason)> refused;
    // PREPARED, FAILED, COMMITTED, ABORTED, FETCH from a child (HELLO, CREDIT and
    // HEARTBEAT are handled here). The span is valid during the call only.
    std::function<void(const std::string& child, MessageType type, ByteSpan message)> message;
  };

  // `loop` and this object must outlive every connection handed to Accept.
  // `children` are link keys (StripeLinkKey); events name children by key too.
  Downstream(EventLoop& loop, std::string self_id, std::vector<std::string> children,
             std::string token, Events events, Limits limits = {});

  // How many stripes the refit is split into (default 1: one tree). A HELLO that
  // names another count, or a stripe beyond it, is refused.
  void SetStripes(uint32_t stripes) { stripes_ = stripes; }
  uint32_t stripes() const { return stripes_; }
  ~Downstream();

  // Links that may join as adopted children (keys): grandchildren whose own parent
  // in that stripe died (this node is their failover parent there). An adopted child is served like
  // any other while it is connected and forgotten when it leaves.
  void AllowAdoption(std::set<std::string> ids) { adoptable_ = std::move(ids); }
  bool IsAdopted(const std::string& id) const;

  // The backends this node listens on. A child whose HELLO names another is
  // refused; one that fell back from its first choice is logged. Empty: no check
  // (a single-backend transport).
  void SetTransports(std::vector<std::string> names) { transports_ = std::move(names); }

  // Which children must come over TLS with their own certificate
  // (transport::Connection::PeerIdentity() equal to their id): the hops the config
  // encrypts. Empty predicate: none. A child presenting a certificate is always
  // checked against its id, required or not.
  void RequireTls(std::function<bool(const std::string& child)> required) {
    tls_required_ = std::move(required);
  }

  // Listens on `address` ("host:port") over `transport`: each link accepted there is
  // handed to Accept on the loop thread, and SetTransports names the backends of a
  // transport set. Returns the address bound. `transport` must outlive the listener
  // (its Shutdown stops it).
  Result<std::string> Listen(transport::Transport& transport, const std::string& address);

  // Takes a freshly accepted connection and starts the handshake. Must be called on
  // the loop thread. Beyond the pending-handshake caps it is refused at once, or
  // takes the slot of the oldest pending link of a more represented address
  // (AdmitHandshake, relay/wire/internal/handshake_limits.h), which is closed.
  void Accept(std::unique_ptr<transport::Connection> connection);

  // Drops handshakes older than the handshake timeout. Call every tick.
  void Tick(std::chrono::steady_clock::time_point now);
  size_t pending_handshakes() const { return handshakes_.size(); }

  // Queues the control message `message` (not a CHUNK) for every expected child
  // (a decision, COMMIT or ABORT, for an excused child that is connected too).
  // `done` runs once every child was handed the message or is gone.
  void Broadcast(transport::Message message, std::function<void()> done = {});
  // BEGIN for every expected child, each naming the stripe of its link.
  void BroadcastBegin(Begin begin);
  // ACTIVE_VERSION `version` for every expected child, with `manifest` only to the
  // children not known to hold that version (by their HELLO and the COMMITs sent
  // them): the manifest, 16 bytes a partition of the model, would hold up what
  // follows it on a capped link, and a child at the version ignores it.
  void BroadcastActiveVersion(const Digest128& version, ByteSpan manifest);

  // Which chunk of which delta a CHUNK message carries.
  struct ChunkRef {
    Digest128 target;
    uint32_t sequence = 0;
    // A data chunk (not the END, which a child at the target still needs to prepare).
    bool data = true;
  };

  // Like Broadcast for a CHUNK, but skips every child that already has it: its
  // HELLO said it applied that chunk, or this link already carries it (queued or
  // sent). So a child is sent each chunk it lacks once per link, whether it comes
  // from a replay or from the parent's stream (docs/recovery.md).
  // `stripe`: only to that stripe's links (a relay forwards a stripe's END down that
  // stripe alone); else to every link that carries the chunk.
  void BroadcastChunk(transport::Message message, const ChunkRef& chunk,
                      std::function<void()> done = {},
                      std::optional<uint32_t> stripe = std::nullopt);

  // One message for a child's queue: either the bytes, or a loader that reads them
  // (from a spool) only when the message is about to be sent. `chunk` is set for
  // CHUNK messages.
  struct Outgoing {
    transport::Message message;
    std::function<Result<transport::Message>()> load;
    std::optional<ChunkRef> chunk;

    static Outgoing Control(transport::Message m) { return {std::move(m), nullptr, std::nullopt}; }
    static Outgoing Chunk(std::function<Result<transport::Message>()> load, ChunkRef chunk) {
      return {nullptr, std::move(load), chunk};
    }
  };
  // Replaces everything queued for `child` (completing it) with `backlog`: what a
  // child that rejoined mid-refit still needs, in order.
  void Requeue(const std::string& child, std::vector<Outgoing> backlog);
  // Queues `held` (chunks, in order) for every connected child, each chunk only to
  // the children that lack it (by their HELLO and this link): a node that resumes a
  // delta after a restart holds chunks its parent will not send again, so they are
  // never forwarded live.
  void QueueHeld(const std::vector<Outgoing>& held);

  // Sends a control message to one child now, outside its queue (PARTITION
  // answers). Dropped if the child is not connected.
  void SendTo(const std::string& child, transport::Message message);

  // Stops queueing for `child` until it joins again, completing what was queued:
  // the refit goes on without it (commit policy `available`) and it is replayed
  // what it lacks when it is back.
  void Excuse(const std::string& child);

  // This node cannot take part in refit `refit_id` and its parents stop streaming to
  // it (striped, policy `available`): its children on the stripes in `stripes` (those
  // whose END it lacks) would wait for chunks that never come while their other
  // stripes' parents wait for them. With `reason` set, each connected child link of
  // those stripes is sent REFUSE naming the refit and closed once it is out, and
  // their HELLOs are refused alike, so the children fail over to their failover
  // parents at once, which replay them the refit (or, shed there too, give it up:
  // NodeAgent). nullopt: every child is welcome again.
  void Shed(std::optional<std::string> reason, std::set<uint32_t> stripes = {},
            uint64_t refit_id = 0);
  bool shedding() const { return shedding_.has_value(); }
  // `child` cannot be served refit `refit_id` here (the source could not spool it):
  // its link is sent REFUSE naming the refit and closed once that is out, as Shed
  // does. Nothing if it is not connected.
  void RefuseForRefit(const std::string& child, const std::string& reason, uint64_t refit_id);
  // This node will send no more of refit `refit_id` (it failed it, and moved on
  // without it): each connected child link whose last BEGIN out named that refit and
  // whose END did not follow is refused as RefuseForRefit does, so that the child
  // fails over there instead of waiting for the rest.
  void RefuseLinksMidRefit(uint64_t refit_id, const std::string& reason);

  // A refit begins (call before broadcasting its BEGIN): every child grants a
  // fresh window of credit, and credit for any other refit is ignored from now on;
  // whatever is still queued for an earlier refit is dropped (completing its
  // callbacks); a connected child excused from the last refit takes part again.
  // `stream_id` (BEGIN's) numbers its chunks: what a child's HELLO says it applied
  // counts only for the stream it names.
  void BeginRefit(uint64_t refit_id, uint64_t stream_id);
  // Drops everything queued (completing it) — after a decision nothing more is owed.
  void DropQueued();

  bool AllConnected() const;
  // Whether every link of stripe `stripe` is connected.
  bool AllConnected(uint32_t stripe) const;
  std::vector<std::string> Missing() const;
  // Planned children (adopted ones are not expected).
  size_t expected() const;
  // Bytes of messages queued here and not yet handed to a child's transport.
  uint64_t queued_bytes() const { return queued_bytes_; }
  void Heartbeat();
  void CloseAll();

 private:
  struct Fanout {
    size_t remaining = 0;
    std::function<void()> done;
  };
  struct Pending {
    transport::Message message;
    std::function<Result<transport::Message>()> load;  // when message is null
    std::optional<ChunkRef> chunk;                     // set for CHUNK messages
    std::shared_ptr<Fanout> fanout;
  };
  // The chunks of one delta a child has: what its HELLO said it applied, and what
  // its current link carries in this refit (queued or handed to the transport).
  // What it applied is forgotten when the child is sent a decision for that delta
  // (it commits or rolls back, so that no longer counts) and replaced by its next
  // HELLO; what the link carried is forgotten when a new refit begins.
  //
  // A child whose HELLO said it is at a delta's target already (it committed that
  // version through another parent) has every data chunk of it: forwarding them
  // would only make it forward them again to children that have them too.
  // A chunk is named by its delta's target, the stream that numbered it and its
  // sequence: the HELLO's applied chunks count only while the refit streams the
  // stream they were numbered by (`stream`; a restarted root numbers the same delta
  // otherwise). What the link carries is this refit's, so this stream's.
  struct ChunkBook {
    Digest128 target;            // the delta whose chunks `carried` counts
    std::set<uint32_t> carried;  // queued for it or sent on this link
    Digest128 active;            // its active version: its HELLO, then each COMMIT sent it
    // What its HELLO said it holds in flight: that delta's target, the chunks it
    // applied and the stream that numbered them. Kept while the link carries another
    // delta's chunks (a lagging parent's replay of an older refit): forgotten then, a
    // later refit of the held delta sent the child chunks it had (the simulator's
    // --stripes seeds 53857, 56687 re-sent more than 1 % of their bytes).
    Digest128 held;
    std::set<uint32_t> applied;
    uint64_t stream = 0;
    bool Has(const ChunkRef& c, uint64_t current_stream) const {
      if (c.data && !c.target.IsZero() && c.target == active) return true;
      if (c.target == held && stream == current_stream && applied.contains(c.sequence)) return true;
      return c.target == target && carried.contains(c.sequence);
    }
    void Note(const ChunkRef& c) {
      if (c.target != target) {
        target = c.target;
        carried.clear();
      }
      carried.insert(c.sequence);
    }
    void Unnote(const ChunkRef& c) {
      if (c.target == target) carried.erase(c.sequence);
    }
  };
  struct Child {
    uint32_t stripe = 0;  // the stripe this link belongs to (from its key)
    std::unique_ptr<transport::Connection> connection;
    ChunkBook chunks;
    uint64_t serial = 0;
    int64_t credits = 0;
    bool excused = false;  // nothing is queued for it until it joins again
    bool adopted = false;  // not a planned child: joined because its parent died
    uint64_t begun = 0;    // the refit the last BEGIN handed to this link named
    bool end_out = false;  // and whether an END was handed to it after that BEGIN
    std::deque<Pending> queue;
    // Handed to the connection, transport not done with it yet. Completed by its
    // on_sent, or by Lose: a destroyed connection drops pending on_sent handlers.
    std::map<uint64_t, std::shared_ptr<Pending>> in_flight;
  };
  struct Handshake {
    std::unique_ptr<transport::Connection> connection;
    std::array<uint8_t, kNonceBytes> nonce{};
    std::string host;  // the peer's address without its port: the per-address cap
    std::chrono::steady_clock::time_point deadline;
  };

  // Queues a control message for every expected child, chosen per child.
  void QueueForEach(const std::function<transport::Message(const Child&)>& message_for);
  void OnMessage(uint64_t serial, transport::Message message);
  void OnClosed(uint64_t serial, const Status& status);
  void OnHello(uint64_t serial, ByteSpan message);
  // Whether the link's TLS identity (if any) is `id`, and TLS where it is required.
  Status CheckIdentity(const transport::Connection& connection, const std::string& id) const;
  // Whether the child came over a backend this node speaks; logs a fallback.
  Status CheckTransport(const Hello& hello) const;
  // Logs `reason` and refuses the link with it (RefuseThenClose).
  void Refuse(std::unique_ptr<transport::Connection> connection, const std::string& reason);
  // Sends `refuse` and closes the link once it is out: closing at once aborts the
  // queued send (transport.h), and the peer would see the close without the reason.
  // Closed by Tick at the handshake timeout if the REFUSE is still not out by then.
  void RefuseThenClose(std::unique_ptr<transport::Connection> connection,
                       const relay::Refuse& refuse);
  // A joined child broke the protocol: lost, and refused with `reason`.
  void RefuseChild(const std::string& id, const std::string& reason);
  // A peer (`id`: a joined child; empty: a link in its handshake) sent REFUSE: logs
  // and returns why, and tells `refused` for a child.
  std::string ChildRefused(transport::Connection& connection, const std::string& id,
                           ByteSpan message);
  void Pump(Child& child);
  void Complete(Pending& pending);
  // Completes everything queued for `child` that was never sent.
  void DropUnsent(Child& child);
  // A decision for the delta `chunks` describes ends what the child's HELLO said.
  void NoteSent(Child& child, const transport::Message& message);
  void Lose(const std::string& id, const Status& why);
  Child* BySerial(uint64_t serial, std::string* id);
  // Whether `child`'s link carries `chunk` (its stripe's data chunks, and the END).
  bool Carries(const Child& child, const ChunkRef& chunk) const;
  std::string ChildId(const Child& child) const;

  EventLoop& loop_;
  std::string self_id_;
  std::string token_;
  Events events_;
  Limits limits_;
  std::function<bool(const std::string&)> tls_required_;
  std::map<std::string, Child> children_;
  std::map<uint64_t, Handshake> handshakes_;
  ProvenHosts proven_;  // addresses whose children completed the handshake lately
  std::set<std::string> adoptable_;
  std::optional<std::string> shedding_;  // Shed: why the children of shed_stripes_ are refused
  std::set<uint32_t> shed_stripes_;
  uint64_t shed_refit_ = 0;  // the refit a Shed leaves this node out of
  // Links refused and closed once their REFUSE is out (RefuseThenClose), or at the
  // handshake timeout if it is not out by then.
  RefusingLinks refusing_{loop_};
  std::vector<std::string> transports_;
  uint32_t stripes_ = 1;
  uint64_t refit_id_ = 0;   // the refit credit counts for
  uint64_t stream_id_ = 0;  // the stream that numbers that refit's chunks
  uint64_t next_serial_ = 1;
  uint64_t next_send_ = 1;
  uint64_t queued_bytes_ = 0;
  uint64_t refused_over_caps_ = 0;  // connections refused by the pending-handshake caps
  uint64_t evicted_over_caps_ = 0;  // pending handshakes dropped for a newcomer
};

// The RequireTls predicate for node `self_id`'s children under `config`: whether the
// hop self -> child runs TLS ([security] tls).
std::function<bool(const std::string& child)> TlsRequiredFor(const topology::ClusterConfig& config,
                                                             const std::string& self_id);

}  // namespace deltacast::relay

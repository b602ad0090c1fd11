// ProducerHub: the root's links to its producers. It accepts them on their own
// listener (the trainer's network, apart from the tree's), authenticates them with
// the tree's handshake and under its limits (docs/protocol.md, "Handshake":
// CHALLENGE with a fresh nonce, HELLO proving the cluster token for this producer
// id and the root's id, WELCOME proving it back over the producer's nonce; REFUSE
// for a wrong proof, a certificate that is not the producer's own or no TLS where
// [security] encrypts producer links, a second link of a joined id, or more
// producers than expected; a link that has not sent a valid HELLO within the handshake timeout is
// dropped, and beyond the pending-handshake caps a new link is closed at once), and
// queues what they say, in arrival order, for the root's refit thread.
//
// Thread safety: all methods are thread-safe; transport callbacks only queue. A
// thread of its own drops handshakes that time out.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "relay/wire/internal/handshake_limits.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay {

class ProducerHub {
 public:
  // The per-address cap is raised to `capacity` when lower: local producers all
  // dial from one address and may all be in their handshake at once.
  ProducerHub(std::string root_id, std::string token, size_t capacity, HandshakeLimits limits = {});
  ~ProducerHub();  // Close()

  // Whether every producer must come over TLS with its own certificate
  // (Connection::PeerIdentity() equal to its id), as the tree's listener requires of
  // a child on an encrypted hop (relay/wire/internal/peer_identity.h): where [security]
  // encrypts producer links (topology::ProducerLinksUseTls). Without, a producer that
  // does come over TLS must still show its own certificate. Call before Listen.
  void RequireTls(bool required);

  // Listens on `address` of `transport` (which must outlive the hub); returns the
  // bound address.
  Result<std::string> Listen(transport::Transport& transport, const std::string& address);

  // Blocks until `count` producers are joined; kUnavailable naming how many did and
  // the latest refusals (a producer without TLS where it is required, say).
  Status WaitFor(size_t count, std::chrono::milliseconds timeout);
  std::vector<std::string> Joined() const;  // sorted

  // Sends to one producer; dropped if it is not joined.
  void Send(const std::string& producer, std::vector<std::byte> bytes);

  // What a producer said, or that it is gone (message null, `lost` says why).
  struct Event {
    std::string producer;
    transport::Message message;
    Status lost;
  };
  // The next event (HEARTBEATs dropped); kTimeout after `timeout`.
  Result<Event> Next(std::chrono::milliseconds timeout);
  // Drops queued events (of an earlier refit).
  void DropEvents();

  // Closes every link and stops the timeout thread. Not from a transport callback.
  void Close();

  size_t pending_handshakes() const;

 private:
  struct Pending {
    std::unique_ptr<transport::Connection> connection;
    std::array<uint8_t, kNonceBytes> nonce{};
    std::string host;  // the peer's address without its port: the per-address cap
    std::chrono::steady_clock::time_point deadline;
  };
  // Drops handshakes past their deadline until Close.
  void ReapLoop();
  void OnAccept(std::unique_ptr<transport::Connection> connection);
  void OnMessage(uint64_t serial, transport::Message message);
  void OnClosed(uint64_t serial, const Status& status);
  // Sends REFUSE and closes the link once it is sent (caller holds mu_).
  void Refuse(uint64_t serial, std::unique_ptr<transport::Connection> c, const std::string& why)
      REQUIRES(mu_);

  const std::string root_id_;
  const std::string token_;
  const size_t capacity_;
  const HandshakeLimits limits_;
  mutable Mutex mu_;
  CondVar cv_;
  CondVar reap_cv_;
  std::thread reaper_;
  bool tls_required_ GUARDED_BY(mu_) = false;
  // The latest refusals (newest last), which WaitFor's error lists.
  static constexpr size_t kRefusalsKept = 4;
  std::deque<std::string> refusals_ GUARDED_BY(mu_);
  uint64_t refused_over_caps_ GUARDED_BY(mu_) = 0;
  uint64_t evicted_over_caps_ GUARDED_BY(mu_) = 0;  // pending handshakes dropped for a newcomer
  uint64_t next_serial_ GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Pending> pending_ GUARDED_BY(mu_);  // handshakes in progress
  ProvenHosts proven_ GUARDED_BY(mu_);  // addresses whose producers completed the handshake lately
  // Refused links, kept until their REFUSE is on its way (closing at once could
  // drop it).
  std::map<uint64_t, std::unique_ptr<transport::Connection>> refused_ GUARDED_BY(mu_);
  struct Link {
    uint64_t serial = 0;
    std::unique_ptr<transport::Connection> connection;
  };
  std::map<std::string, Link> producers_ GUARDED_BY(mu_);
  std::deque<Event> events_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace deltacast::relay

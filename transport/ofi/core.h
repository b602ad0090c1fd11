// The ofi backend's core: the state of one transport (its libfabric resources,
// endpoints, links and posted operations) and the progress thread that owns it.
// Split by job: core_progress.cc (the loop, posting, completions), core_connect.cc
// (endpoints, Listen, Connect), core_links.cc (the per-link state machine:
// announce/grant/deliver, close and liveness). Protocol: wire.h and
// docs/transport.md "ofi".
//
// Thread safety: Post, Listen, Connect and Shutdown are thread-safe; everything
// else runs on the progress thread only (Link fields say which are shared).
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "transport/internal/handler_gate.h"
#include "transport/ofi/buffer_pool.h"
#include "transport/ofi/fabric.h"
#include "transport/ofi/mr_cache.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/ofi/wire.h"

namespace deltacast::transport::ofi {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr size_t kControlRecvsPerEndpoint = 64;
// Messages of one link announced (RTS or inline kData) and not yet answered
// (CTS): bounds what a receiver that has not started holds for that link.
inline constexpr size_t kMaxAnnouncedPerLink = 64;
// Bytes of posted receives per link; a single larger message is still granted alone.
inline constexpr uint64_t kGrantBudgetBytes = uint64_t{256} << 20;
// A RTS this far ahead of the next expected message is corrupt.
inline constexpr uint64_t kMaxSeqAhead = uint64_t{1} << 20;
// Spin this long on the CQ after the last work before blocking.
inline constexpr auto kSpinTime = std::chrono::microseconds(50);
// How long Shutdown waits for its ABORT messages to leave.
inline constexpr auto kShutdownFlush = milliseconds(200);
// Registered control send buffers kept for reuse (each kControlBufferBytes).
inline constexpr size_t kMaxFreeControlBuffers = 256;

struct EndpointState;

enum class OpKind : uint8_t { kControlRecv, kControlSend, kDataSend, kDataRecv };

// One posted libfabric operation; its address is the operation context.
struct Op {
  fi_context2 context;  // first member: libfabric may use it (FI_CONTEXT2 mode)
  OpKind kind = OpKind::kControlSend;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint32_t link_id = 0;     // the local link it serves; 0 once that link ended
  uint32_t connect_id = 0;  // a CONNECT's pending connect
  uint64_t seq = 0;
  uint64_t tag = 0;
  std::vector<std::byte> control;  // control message bytes (send or receive buffer)
  Message message;                 // kDataSend: the bytes being sent
  PooledBuffer receive;            // kDataRecv: the buffer being filled (and its MR)
  // Registration (only when the core registers memory): the descriptor passed
  // with the buffer, and what keeps it valid until the op is gone.
  void* desc = nullptr;
  MemoryRegion control_mr;                           // covers `control`'s capacity
  std::shared_ptr<const Registration> registration;  // kDataSend from the MrCache
  int post_error = 0;  // a registration failed: the post fails with this (FI_E*)
};

// A registered control send buffer waiting for reuse.
struct ControlBuffer {
  std::vector<std::byte> bytes;  // capacity kControlBufferBytes; first: freed after the MR
  MemoryRegion mr;
};

struct EndpointState {
  std::unique_ptr<Endpoint> endpoint;
  AcceptHandler on_accept;                               // set for listeners
  std::unordered_map<std::string, fi_addr_t> addresses;  // peer name (raw bytes) -> AV entry
  std::unordered_map<fi_addr_t, std::string> names;      // the reverse
};

// Everything of a torn-down transport that libfabric may still point into.
struct Resources {
  std::unique_ptr<Fabric> fabric;  // destroyed last
  std::vector<std::unique_ptr<EndpointState>> endpoints;
  std::vector<std::unique_ptr<Op>> ops;
};
// shm peers inside this process (tests; a node with two transports): shm maps a
// peer's region by name and touches it on send and during progress, so closing an
// endpoint while another transport of the process still sends to it crashes in
// the provider. Names of this process's endpoints are tracked here: closing takes
// the lock exclusively, sends and CQ reads of shm transports share it, a send to
// a local name that is gone fails like a refused connection, and torn-down shm
// resources wait in the graveyard until the process's last shm transport is done.
struct LocalNames {
  SharedMutex mu;
  std::unordered_set<std::string> live GUARDED_BY(mu);
  std::unordered_set<std::string> ever GUARDED_BY(mu);
  int live_cores GUARDED_BY(mu) = 0;                // shm transports of this process not torn down
  std::vector<Resources> graveyard GUARDED_BY(mu);  // torn down while others were live
};
LocalNames& Local();

struct PendingSend {
  uint64_t seq = 0;
  Message message;
  SendHandler on_sent;
  uint64_t bytes = 0;  // counted in queued_bytes
  bool announced = false;
  bool done = false;
  Status status;
};

struct Incoming {
  uint64_t size = 0;
  bool granted = false;
  bool complete = false;  // inline messages arrive complete
  Op* op = nullptr;       // the posted receive while granted and not complete
  PooledBuffer bytes;
};

// One logical link. Fields below the atomics are touched only on the progress thread.
struct Link {
  uint32_t id = 0;
  uint32_t remote_id = 0;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  std::string peer_address;
  HandlerGate gate;
  std::atomic<uint64_t> queued_bytes{0};

  bool started = false;
  bool authenticated = false;  // Connection::Authenticated() was called
  MessageHandler on_message;
  CloseHandler on_closed;

  std::deque<PendingSend> sends;  // by seq, front = oldest whose on_sent has not run
  uint64_t next_send_seq = 0;
  size_t unanswered = 0;  // RTS/kData sent, CTS not yet received
  uint64_t sent_ok = 0;   // messages whose on_sent ran OK

  std::map<uint64_t, Incoming> incoming;
  uint64_t announced_by_peer = 0;  // 1 + highest seq the peer announced
  uint64_t next_grant = 0;
  uint64_t next_deliver = 0;
  uint64_t granted_bytes = 0;

  bool peer_ended = false;  // GOODBYE or ABORT received
  Status peer_status;
  uint64_t peer_count = 0;

  bool ended = false;
  Status final_status;
  Status late_status;  // what sends issued after the end complete with
  bool close_reported = false;
  std::vector<SendHandler> late_sends;  // their on_sent runs after on_closed

  Clock::time_point last_heard;
  Clock::time_point last_said;
};

struct PendingConnect {
  ConnectHandler on_done;
  std::string address;
  EndpointState* endpoint = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  Clock::time_point deadline;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const OfiOptions& options, std::unique_ptr<Fabric> fabric);
  ~Core();

  Capabilities caps;

  void StartThread();
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept);
  void Connect(const std::string& address, ConnectHandler on_done);
  void Shutdown();
  OfiStats Stats() const;

  // Queues `fn` for the progress thread; false (fn dropped) once shut down.
  bool Post(std::function<void()> fn);
  bool OnThread() const { return std::this_thread::get_id() == thread_id_; }

  // Progress-thread side of the Connection methods.
  void StartLink(const std::shared_ptr<Link>& link, MessageHandler on_message,
                 CloseHandler on_closed);
  void SendOnLink(const std::shared_ptr<Link>& link, Message message, SendHandler on_sent,
                  Status precheck);
  void CloseLink(const std::shared_ptr<Link>& link, bool abort);
  void AuthenticateLink(const std::shared_ptr<Link>& link);

  // Tests only (progress thread): asks the provider to cancel every data receive
  // this core has outstanding, links untouched, as tcp;ofi_rxm does by itself
  // when a peer's connection drops under a rendezvous read (FI_ECANCELED).
  // Returns how many receives it asked about.
  size_t CancelDataReceivesForTest();

 private:
  void Loop();
  bool RunCommands();
  int DrainCompletions();
  bool RetryBlocked();
  void TickTimers();
  void WaitForWork(int idle_waits);
  bool FailDeferred();
  void ShutdownOnThread();
  void Teardown();

  Result<std::string> ListenOnThread(const std::string& address, AcceptHandler on_accept);
  void ConnectOnThread(const std::string& address, ConnectHandler on_done);
  Result<EndpointState*> ClientEndpoint();
  Result<EndpointState*> AddEndpoint(const char* node, const char* service,
                                     bool exact_name = false);
  Result<fi_addr_t> AddressOf(EndpointState* endpoint, const std::vector<std::byte>& name);

  // Posting: ops that meet -FI_EAGAIN wait in blocked_ (in order) and are retried.
  void Submit(Op* op);
  void Unblock(Op* op);
  int PostOp(Op* op);
  // Registration: puts encoded control bytes into a registered buffer when the
  // core registers memory; finds or makes the registration of a data send; frees
  // an op, recycling its control buffer and releasing its cache entry.
  void FillControl(Op* op, std::vector<std::byte> encoded);
  void AttachSendRegistration(Op* op);
  void FreeOp(Op* op);
  Result<MemoryRegion> Register(const void* data, size_t size);
  void SendControl(EndpointState* endpoint, fi_addr_t peer, const ControlHeader& header,
                   uint32_t link_id, std::span<const std::byte> payload = {},
                   uint32_t connect_id = 0);
  void SendControl(Link& link, ControlType type, uint64_t seq = 0, uint64_t value = 0);

  void OnCompletion(Op* op, size_t len);
  void OnError(Op* op, const fi_cq_err_entry& error);
  void OnControl(Op* op, size_t len);
  void OnConnect(EndpointState* endpoint, const ControlHeader& header,
                 std::span<const std::byte> name);
  void OnAccept(const ControlHeader& header);
  Link* LinkFor(const Op* op, const ControlHeader& header);

  void Announce(Link& link);
  void OnCts(Link& link, uint64_t seq);
  void FinishSends(Link& link);
  // A message announced (RTS) or, with `inline_bytes`, arrived whole (kData).
  void OnRts(Link& link, uint64_t seq, uint64_t size,
             std::optional<std::span<const std::byte>> inline_bytes);
  void Grant(Link& link);
  void Deliver(Link& link);
  void MaybeEndAfterPeer(Link& link);
  void FailConnect(uint32_t connect_id, Status status);
  // Ends the link: pending sends fail with `send_status`, the peer is told
  // (GOODBYE/ABORT) unless `notify` is empty, on_closed(final) runs once started.
  void EndLink(Link& link, Status final_status, Status send_status,
               std::optional<ControlType> notify);
  void ReportClose(Link& link);
  Link* FindLink(uint32_t id);
  uint32_t NewId();

  template <typename F>
  void RunHandler(Link& link, F&& fn) {
    link.gate.Run(std::forward<F>(fn));
  }

  const OfiOptions options_;
  std::unique_ptr<Fabric> fabric_;
  std::shared_ptr<BufferPool> pool_;
  int wake_fd_ = -1;
  const bool named_;  // FI_ADDR_STR endpoints (shm): see LocalNames
  // Descriptors are passed with every buffer: the provider needs FI_MR_LOCAL, or
  // OfiRegistration::kAlways.
  const bool mr_required_;
  const bool register_;
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> control_registrations_{0};
  std::unique_ptr<MrCache> mr_cache_;        // progress thread; cleared (MRs closed) at teardown
  std::vector<ControlBuffer> control_free_;  // progress thread

  Mutex mu_;  // guards the command queue and the flags next to it
  std::deque<std::function<void()>> commands_ GUARDED_BY(mu_);
  bool accepting_ GUARDED_BY(mu_) = true;
  bool shutdown_requested_ GUARDED_BY(mu_) = false;
  bool sleeping_ GUARDED_BY(mu_) = false;

  Mutex join_mu_;
  std::thread thread_ GUARDED_BY(join_mu_);
  std::thread::id thread_id_;

  // Progress thread only.
  bool stopping_ = false;
  std::vector<std::unique_ptr<EndpointState>> endpoints_;
  EndpointState* client_endpoint_ = nullptr;
  std::unordered_map<uint32_t, std::shared_ptr<Link>> links_;
  std::unordered_map<uint32_t, PendingConnect> connects_;
  struct Abandoned {
    EndpointState* endpoint;
    fi_addr_t peer;
    Clock::time_point since;
  };
  std::unordered_map<uint32_t, Abandoned> abandoned_;  // connects that failed, by id
  std::unordered_set<Op*> ops_;                        // every op posted or blocked, owned here
  // Ops that met -FI_EAGAIN, per (endpoint, peer): order matters only per peer,
  // and a peer that cannot take sends (rxm reconnecting, a dead shm name) must not
  // hold up the others.
  std::map<std::pair<EndpointState*, fi_addr_t>, std::deque<Op*>> blocked_;
  // Ops whose registration failed: they fail from the loop, never inside Submit.
  std::vector<Op*> failed_;
  uint32_t next_id_;
  Clock::time_point next_tick_;
};

}  // namespace deltacast::transport::ofi

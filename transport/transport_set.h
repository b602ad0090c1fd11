// TransportSet: several backends behind one Transport. A node listens on every
// backend it speaks (each on its own port: the node's port + the backend's offset)
// and dials a peer over the first backend of the hop's preference list that
// connects, falling back to the next and logging why.
//
// Thread safety: thread-safe, as transport.h requires. Handlers run on the member
// backends' threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace deltacast::transport {

class TransportSet final : public Transport {
 public:
  struct Member {
    std::string name;  // "tcp", "ucx", "ofi"
    std::unique_ptr<Transport> transport;
    uint16_t port_offset = 0;  // listens on the node's port + this
    bool accepting = true;     // false once its Listen failed
  };
  // The connection and the name of the backend it runs over, or every backend's error.
  using ConnectFirstHandler =
      std::function<void(Result<std::unique_ptr<Connection>>, const std::string& backend)>;

  // At least one member; names unique. The first member is the default for Connect.
  explicit TransportSet(std::vector<Member> members);
  ~TransportSet() override;

  // backend "set(ucx,tcp)"; host memory; the smallest max_message_bytes of the members.
  const Capabilities& capabilities() const override { return caps_; }

  // Listens on every member at host:(port + its offset) and returns "host:port". With
  // port 0 the first member picks the port and the others add their offsets to it.
  // A member that cannot listen is left out of Accepting() with a warning (its peers
  // fall back to another backend); fails only when no member can listen.
  Result<std::string> Listen(const std::string& address, AcceptHandler on_accept) override;

  // "name://host:port" dials member `name` at exactly that address; a plain
  // "host:port" dials the first member.
  void Connect(const std::string& address, ConnectHandler on_done) override;

  // Dials host:(base_port + offset) over each backend of `backends` in order until one
  // connects. Backends not in the set are skipped. on_done runs once, on a backend's
  // thread (inline only when none of `backends` is in the set). With `tls`, only tcp
  // is dialled, over TLS ("tls://host:port"); the others are skipped.
  void ConnectFirst(const std::string& host, uint16_t base_port, std::vector<std::string> backends,
                    ConnectFirstHandler on_done, bool tls = false);

  void Shutdown() override;

  bool Has(std::string_view name) const;
  std::vector<std::string> Names() const;
  // The members peers can reach this node over: those listening (all, before Listen).
  std::vector<std::string> Accepting() const;

 private:
  struct Attempt;
  void TryNext(const std::shared_ptr<Attempt>& attempt);
  const Member* Find(std::string_view name) const;

  std::vector<Member> members_;
  Capabilities caps_;
};

// The set behind `transport`, or nullptr when it is a single backend.
TransportSet* AsTransportSet(Transport* transport);

}  // namespace deltacast::transport

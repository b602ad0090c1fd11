#include "transport/factory.h"

#include <string>

#include "transport/ofi/ofi_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace deltacast::transport {

const std::vector<std::string_view>& BackendNames() {
  static const std::vector<std::string_view> names = {"tcp", "ucx", "ofi"};
  return names;
}

Result<std::unique_ptr<Transport>> MakeTransport(std::string_view backend,
                                                 const TransportOptions& options) {
  if (backend == "tcp") {
    if (!options.provider.empty()) {
      return Status::InvalidArgument("tcp has no providers, got \"" + options.provider + "\"");
    }
    TcpOptions tcp;
    tcp.max_message_bytes = options.max_message_bytes;
    tcp.connect_timeout = options.connect_timeout;
    tcp.handshake_max_message_bytes = options.handshake_max_message_bytes;
    tcp.max_pending_handshakes = options.max_pending_handshakes;
    tcp.max_handshakes_per_address = options.max_handshakes_per_address;
    tcp.max_links_per_address = options.max_links_per_address;
    tcp.receive_pool_bytes = options.receive_pool_bytes;
    tcp.receive_pool_idle = options.receive_pool_idle;
    tcp.tls = options.tls;
    return MakeTcpTransport(tcp);
  }
  if (backend == "ucx") {
    UcxOptions ucx;
    ucx.max_message_bytes = options.max_message_bytes;
    ucx.tls = options.provider;  // "tcp", "shm", "" or a UCX_TLS list
    ucx.connect_timeout = options.connect_timeout;
    ucx.net_devices = options.net_device;
    ucx.handshake_max_message_bytes = options.handshake_max_message_bytes;
    return MakeUcxTransport(ucx);
  }
  if (backend == "ofi") {
    OfiOptions ofi;
    ofi.max_message_bytes = options.max_message_bytes;
    ofi.provider = options.provider;
    ofi.connect_timeout = options.connect_timeout;
    ofi.net_device = options.net_device;
    ofi.handshake_max_message_bytes = options.handshake_max_message_bytes;
    return MakeOfiTransport(ofi);
  }
  return Status::InvalidArgument("unknown transport backend \"" + std::string(backend) +
                                 "\" (known: tcp, ucx, ofi)");
}

}  // namespace deltacast::transport

// MakeOfiTransport: validates options, opens the fabric, starts the core.
#include "transport/ofi/ofi_transport.h"

#include <mutex>

#include "common/log.h"
#include "transport/internal/core_transport.h"
#include "transport/ofi/core.h"

namespace deltacast::transport {
namespace {

// The shared facade plus stats().
class OfiTransportImpl final : public internal::CoreTransport<ofi::Core, OfiTransport> {
 public:
  using CoreTransport::CoreTransport;
  OfiStats stats() const override { return core().Stats(); }
};

}  // namespace

OfiTransport* AsOfiTransport(Transport* transport) {
  return dynamic_cast<OfiTransport*>(transport);
}
const OfiTransport* AsOfiTransport(const Transport* transport) {
  return dynamic_cast<const OfiTransport*>(transport);
}

Result<std::unique_ptr<Transport>> MakeOfiTransport(const OfiOptions& options) {
  if (options.max_message_bytes == 0) {
    return Status::InvalidArgument("ofi: max_message_bytes must be positive");
  }
  if (options.connect_timeout <= std::chrono::milliseconds(0) ||
      options.peer_timeout < std::chrono::milliseconds(20)) {
    return Status::InvalidArgument("ofi: connect_timeout must be positive, peer_timeout >= 20 ms");
  }
  if (!options.net_device.empty()) {
    auto address = ofi::InterfaceAddress(options.net_device);
    if (!address.ok()) return address.status();
  }
  auto fabric = ofi::Fabric::Open(options.provider);
  if (!fabric.ok()) return fabric.status();
  log::Debug("ofi: provider " + (*fabric)->provider_name() + ", idle progress " +
             ((*fabric)->wait_fd() >= 0 ? "blocks on the CQ wait fd" : "backs off (no wait fd)") +
             ((*fabric)->needs_local_mr() ? ", requires local memory registration" : ""));
  static std::once_flag logged;
  std::call_once(logged, [&] {
    auto hmem = ofi::GetRdmInfo((*fabric)->provider_name(), nullptr, nullptr, false, FI_HMEM);
    log::Info("ofi: provider " + (*fabric)->provider_name() +
              (hmem.ok() ? " reports FI_HMEM" : " has no FI_HMEM") +
              "; CUDA device memory is not supported by this backend here (host memory only)");
  });
  auto core = std::make_shared<ofi::Core>(options, std::move(fabric).value());
  core->StartThread();
  return std::unique_ptr<Transport>(std::make_unique<OfiTransportImpl>(std::move(core)));
}

}  // namespace deltacast::transport

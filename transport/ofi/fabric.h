// libfabric resources of one ofi transport, as RAII handles: the fabric, domain
// and completion queue (Fabric) and the RDM endpoints with their address vectors
// (Endpoint). Also the one function mapping libfabric errors to Status.
//
// Private to transport/ofi: with libfabric.h, the only header that includes
// rdma/fabric.h.
// Thread safety: none. Opened on any thread, then used only by the transport's
// progress thread (the domain is opened FI_THREAD_DOMAIN).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "transport/ofi/libfabric.h"

namespace deltacast::transport::ofi {

// `rc` is a negative libfabric error code (-FI_E*); `what` says what failed.
Status OfiStatus(int rc, std::string_view what);

struct InfoDeleter {
  void operator()(fi_info* info) const { libfabric::FreeInfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// The first FI_EP_RDM info of `provider` ("" = any) with what this backend needs
// (FI_MSG | FI_TAGGED). With `node`/`service` and `source`, the endpoint binds there.
Result<InfoPtr> GetRdmInfo(const std::string& provider, const char* node, const char* service,
                           bool source, uint64_t extra_caps = 0);

// The numeric address of network interface `device` (its IPv4 one if it has one,
// else IPv6), e.g. "127.0.0.1" for "lo"; kInvalidArgument when there is none.
Result<std::string> InterfaceAddress(const std::string& device);

// One registered memory region (fi_mr_reg), closed on destruction. Move-only.
// The memory it covers must outlive it, and it must be destroyed before the
// domain it was registered with (Fabric), on the thread that owns the domain.
class MemoryRegion {
 public:
  MemoryRegion() = default;
  explicit MemoryRegion(fid_mr* mr) : mr_(mr) {}
  ~MemoryRegion() { Reset(); }
  MemoryRegion(MemoryRegion&& other) noexcept : mr_(std::exchange(other.mr_, nullptr)) {}
  MemoryRegion& operator=(MemoryRegion&& other) noexcept {
    if (this != &other) {
      Reset();
      mr_ = std::exchange(other.mr_, nullptr);
    }
    return *this;
  }
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  explicit operator bool() const { return mr_ != nullptr; }
  // The descriptor data transfers over this memory pass (null when empty).
  void* desc() const { return mr_ ? fi_mr_desc(mr_) : nullptr; }
  void Reset() {
    if (mr_) fi_close(&mr_->fid);
    mr_ = nullptr;
  }

 private:
  fid_mr* mr_ = nullptr;
};

class Fabric {
 public:
  // kInvalidArgument naming `provider` when libfabric has no such RDM provider.
  static Result<std::unique_ptr<Fabric>> Open(const std::string& provider);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const fi_info& info() const { return *info_; }
  fid_domain* domain() const { return domain_; }
  fid_cq* cq() const { return cq_; }
  fid_fabric* fabric() const { return fabric_; }
  // The CQ's wait fd, or -1 when the provider has no FI_WAIT_FD (then poll with backoff).
  int wait_fd() const { return wait_fd_; }
  // Local buffers must be registered (FI_MR_LOCAL) and their descriptors passed.
  bool needs_local_mr() const { return (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0; }
  std::string provider_name() const { return info_->fabric_attr->prov_name; }
  // Registers [data, data + size) for local sends and receives (FI_SEND | FI_RECV)
  // with this domain; a failure is returned as Status and leaves nothing behind.
  // Counted in registrations().
  Result<MemoryRegion> Register(const void* data, size_t size);
  uint64_t registrations() const { return registrations_.load(std::memory_order_relaxed); }

 private:
  Fabric() = default;
  InfoPtr info_;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  int wait_fd_ = -1;
  uint64_t next_key_ = 1;                   // unique requested keys (ignored under FI_MR_PROV_KEY)
  std::atomic<uint64_t> registrations_{0};  // read by stats from any thread
};

class Endpoint {
 public:
  // Opens an enabled endpoint with its own address vector, bound to node:service
  // when given (FI_SOURCE), else wherever the provider puts it. exact_name
  // (FI_ADDR_STR providers): the endpoint's name is `node` itself; shm otherwise
  // decorates it (fi_shm://NODE:uid:index, the index unknowable to a peer).
  static Result<std::unique_ptr<Endpoint>> Open(Fabric& fabric, const char* node,
                                                const char* service, bool exact_name = false);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  fid_ep* ep() const { return ep_; }
  fid_av* av() const { return av_; }
  const std::vector<std::byte>& name() const { return name_; }
  uint32_t addr_format() const { return addr_format_; }

 private:
  Endpoint() = default;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;
  std::vector<std::byte> name_;
  uint32_t addr_format_ = 0;
};

// An endpoint name as deltacast prints addresses: "host:port" for socket
// addresses, the name itself for FI_ADDR_STR (shm). Empty when unknown.
std::string NameToAddress(uint32_t addr_format, const std::vector<std::byte>& name);

}  // namespace deltacast::transport::ofi

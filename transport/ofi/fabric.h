// libfabric resources of one ofi transport, as RAII handles: the fabric, domain
// and completion queue (Fabric) and the RDM endpoints with their address vectors
// (Endpoint). Also the one function mapping libfabric errors to Status.
//
// Private to transport/ofi: this is the only header that includes rdma/fabric.h.
// Thread safety: none. Opened on any thread, then used only by the transport's
// progress thread (the domain is opened FI_THREAD_DOMAIN).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deltacast::transport::ofi {

// `rc` is a negative libfabric error code (-FI_E*); `what` says what failed.
Status OfiStatus(int rc, std::string_view what);

struct InfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// The first FI_EP_RDM info of `provider` ("" = any) with what this backend needs
// (FI_MSG | FI_TAGGED). With `node`/`service` and `source`, the endpoint binds there.
Result<InfoPtr> GetRdmInfo(const std::string& provider, const char* node, const char* service,
                           bool source, uint64_t extra_caps = 0);

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

 private:
  Fabric() = default;
  InfoPtr info_;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  int wait_fd_ = -1;
};

class Endpoint {
 public:
  // Opens an enabled endpoint with its own address vector, bound to node:service
  // when given (FI_SOURCE), else wherever the provider puts it.
  static Result<std::unique_ptr<Endpoint>> Open(Fabric& fabric, const char* node,
                                                const char* service);
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

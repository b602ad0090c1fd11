#include "transport/ofi/fabric.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <cerrno>
#include <cstring>

#include "transport/internal/address.h"

namespace deltacast::transport::ofi {

Status OfiStatus(int rc, std::string_view what) {
  const int err = rc < 0 ? -rc : rc;
  std::string message = std::string(what) + ": " + libfabric::StrError(err);
  switch (err) {
    case FI_ECANCELED:
      return Status::Aborted(std::move(message));
    case FI_ETIMEDOUT:
      return Status::Timeout(std::move(message));
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_EADDRNOTAVAIL:
    case FI_EIO:
    case FI_EREMOTEIO:
      return Status::Unavailable(std::move(message));
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      return Status::Unsupported(std::move(message));
    case FI_EINVAL:
    case FI_EBADF:
      return Status::InvalidArgument(std::move(message));
    case FI_ENOMEM:
    case FI_ENOSPC:
      return Status::ResourceExhausted(std::move(message));
    case FI_ETRUNC:
    case FI_EMSGSIZE:
      return Status::Corrupt(std::move(message));
    case FI_EADDRINUSE:
      return Status::FailedPrecondition(std::move(message));
    default:
      return Status::IoError(std::move(message));
  }
}

Result<std::string> InterfaceAddress(const std::string& device) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Status::IoError("getifaddrs: " + std::string(strerror(errno)));
  std::string v4, v6;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || device != it->ifa_name) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    std::string& slot = family == AF_INET ? v4 : v6;
    if (!slot.empty()) continue;
    char host[NI_MAXHOST];
    const socklen_t length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(it->ifa_addr, length, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0) {
      slot = host;
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return Status::InvalidArgument("ofi: no network interface \"" + device +
                                 "\" with an address here");
}

Result<InfoPtr> GetRdmInfo(const std::string& provider, const char* node, const char* service,
                           bool source, uint64_t extra_caps) {
  RETURN_IF_ERROR(libfabric::Load());
  InfoPtr hints(libfabric::DupInfo(nullptr));  // fi_allocinfo()
  if (!hints) return Status::ResourceExhausted("fi_allocinfo");
  hints->caps = FI_MSG | FI_TAGGED | extra_caps;
  hints->ep_attr->type = FI_EP_RDM;
  // Every operation context we pass is an OpContext, which starts with fi_context2.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // FI_MR_LOCAL: when the provider says so, every buffer handed to a data
  // transfer is registered and its descriptor passed (ofi_transport.h,
  // "Registration"). The others cost nothing: the backend registers only
  // allocated memory and never hands out remote keys. Not FI_MR_ENDPOINT (MRs
  // would have to be bound to each endpoint) nor FI_MR_RAW/FI_MR_MMU_NOTIFY.
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  // Control messages of a link must arrive in send order.
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* info = nullptr;
  const int rc = libfabric::GetInfo(FI_VERSION(1, 17), node, service, source ? FI_SOURCE : 0,
                                    hints.get(), &info);
  if (rc != 0) {
    Status status = OfiStatus(rc, "fi_getinfo(provider \"" + provider + "\")");
    if (rc == -FI_ENODATA) {
      return Status::InvalidArgument("libfabric has no FI_EP_RDM provider \"" + provider +
                                     "\" usable here (fi_info -l lists them)");
    }
    return status;
  }
  return InfoPtr(info);
}

Result<std::unique_ptr<Fabric>> Fabric::Open(const std::string& provider) {
  auto info = GetRdmInfo(provider, nullptr, nullptr, false);
  if (!info.ok()) return info.status();
  std::unique_ptr<Fabric> f(new Fabric());
  f->info_ = std::move(info).value();
  int rc = libfabric::Fabric(f->info_->fabric_attr, &f->fabric_, nullptr);
  if (rc != 0) return OfiStatus(rc, "fi_fabric");
  rc = fi_domain(f->fabric_, f->info_.get(), &f->domain_, nullptr);
  if (rc != 0) return OfiStatus(rc, "fi_domain");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.size = 4096;
  cq_attr.wait_obj = FI_WAIT_FD;
  rc = fi_cq_open(f->domain_, &cq_attr, &f->cq_, nullptr);
  if (rc == 0) {
    if (fi_control(&f->cq_->fid, FI_GETWAIT, &f->wait_fd_) != 0) f->wait_fd_ = -1;
  } else {
    // No wait fd here: the progress thread backs off instead of blocking.
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(f->domain_, &cq_attr, &f->cq_, nullptr);
    if (rc != 0) return OfiStatus(rc, "fi_cq_open");
  }
  return f;
}

Result<MemoryRegion> Fabric::Register(const void* data, size_t size) {
  fid_mr* mr = nullptr;
  const int rc = fi_mr_reg(domain_, data, size, FI_SEND | FI_RECV, 0, next_key_++, 0, &mr, nullptr);
  if (rc != 0) return OfiStatus(rc, "fi_mr_reg of " + std::to_string(size) + " bytes");
  registrations_.fetch_add(1, std::memory_order_relaxed);
  return MemoryRegion(mr);
}

Fabric::~Fabric() {
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
}

Result<std::unique_ptr<Endpoint>> Endpoint::Open(Fabric& fabric, const char* node,
                                                 const char* service, bool exact_name) {
  InfoPtr own;
  const fi_info* info = &fabric.info();
  if (node || service) {
    auto bound = GetRdmInfo(fabric.provider_name(), node, service, /*source=*/true);
    if (!bound.ok()) return bound.status();
    own = std::move(bound).value();
    if (exact_name && node && own->addr_format == FI_ADDR_STR) {
      // shm names an endpoint as given unless the name has its fi_shm:// prefix.
      free(own->src_addr);
      own->src_addr = strdup(node);
      own->src_addrlen = std::strlen(node) + 1;
    }
    info = own.get();
  }
  std::unique_ptr<Endpoint> e(new Endpoint());
  e->addr_format_ = info->addr_format;
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_MAP;
  int rc = fi_av_open(fabric.domain(), &av_attr, &e->av_, nullptr);
  if (rc != 0) return OfiStatus(rc, "fi_av_open");
  rc = fi_endpoint(fabric.domain(), const_cast<fi_info*>(info), &e->ep_, nullptr);
  if (rc != 0) return OfiStatus(rc, "fi_endpoint");
  rc = fi_ep_bind(e->ep_, &e->av_->fid, 0);
  if (rc != 0) return OfiStatus(rc, "fi_ep_bind(av)");
  rc = fi_ep_bind(e->ep_, &fabric.cq()->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return OfiStatus(rc, "fi_ep_bind(cq)");
  rc = fi_enable(e->ep_);
  if (rc != 0) return OfiStatus(rc, "fi_enable");
  size_t len = 0;
  rc = fi_getname(&e->ep_->fid, nullptr, &len);
  if (rc != -FI_ETOOSMALL && rc != 0) return OfiStatus(rc, "fi_getname");
  e->name_.resize(len);
  rc = fi_getname(&e->ep_->fid, e->name_.data(), &len);
  if (rc != 0) return OfiStatus(rc, "fi_getname");
  e->name_.resize(len);
  return e;
}

Endpoint::~Endpoint() {
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
}

std::string NameToAddress(uint32_t addr_format, const std::vector<std::byte>& name) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr_format == FI_SOCKADDR_IN && name.size() >= sizeof(sockaddr_in)) {
    sockaddr_in sin;
    std::memcpy(&sin, name.data(), sizeof(sin));
    inet_ntop(AF_INET, &sin.sin_addr, host, sizeof(host));
    return JoinHostPort(host, ntohs(sin.sin_port));
  }
  if (addr_format == FI_SOCKADDR_IN6 && name.size() >= sizeof(sockaddr_in6)) {
    sockaddr_in6 sin6;
    std::memcpy(&sin6, name.data(), sizeof(sin6));
    inet_ntop(AF_INET6, &sin6.sin6_addr, host, sizeof(host));
    return JoinHostPort(host, ntohs(sin6.sin6_port));
  }
  if (addr_format == FI_ADDR_STR) {
    std::string s(reinterpret_cast<const char*>(name.data()), name.size());
    s.resize(std::strlen(s.c_str()));
    return s;
  }
  return {};
}

}  // namespace deltacast::transport::ofi

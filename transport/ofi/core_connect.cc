// Endpoints, Listen and Connect (CONNECT/ACCEPT).
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <optional>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "transport/internal/address.h"
#include "transport/ofi/connection.h"
#include "transport/ofi/core.h"

namespace deltacast::transport::ofi {

// ---------------------------------------------------------------------------
// Endpoints, Listen, Connect.

namespace {

// shm endpoint names: a "host:port" with a non-zero port (what agents listen on
// and connect to, from the cluster config) stands for a name derived from host
// and port, the same on both sides; any other string is a name as given.
std::optional<std::string> ShmNameOfHostPort(const std::string& address) {
  if (address.find("://") != std::string::npos) return std::nullopt;
  auto host_port = ParseHostPort(address);
  if (!host_port.ok() || host_port->port == 0 || host_port->host.empty()) return std::nullopt;
  std::string name = "deltacast-hp-";
  for (char c : host_port->host) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-';
    name += plain ? c : '_';
  }
  return name + "-" + std::to_string(host_port->port);
}

}  // namespace

Result<EndpointState*> Core::AddEndpoint(const char* node, const char* service, bool exact_name) {
  auto endpoint = Endpoint::Open(*fabric_, node, service, exact_name);
  if (!endpoint.ok()) return endpoint.status();
  auto state = std::make_unique<EndpointState>();
  state->endpoint = std::move(endpoint).value();
  EndpointState* raw = state.get();
  if (named_) {
    const auto& name = raw->endpoint->name();
    LocalNames& local = Local();
    WriterMutexLock lock(local.mu);
    local.live.emplace(reinterpret_cast<const char*>(name.data()), name.size());
    local.ever.emplace(reinterpret_cast<const char*>(name.data()), name.size());
  }
  endpoints_.push_back(std::move(state));
  for (size_t i = 0; i < kControlRecvsPerEndpoint; ++i) {
    Op* op = new Op();
    op->kind = OpKind::kControlRecv;
    op->endpoint = raw;
    op->control.resize(kControlBufferBytes);
    if (register_) {
      // Registered once: the same buffer is reposted after every message.
      auto mr = Register(op->control.data(), op->control.size());
      if (!mr.ok()) {
        delete op;
        return Status(mr.status().code(),
                      "registering control receive buffers: " + mr.status().message());
      }
      op->control_mr = std::move(mr).value();
      control_registrations_.fetch_add(1, std::memory_order_relaxed);
      op->desc = op->control_mr.desc();
    }
    ops_.insert(op);
    Submit(op);
  }
  return raw;
}

Result<EndpointState*> Core::ClientEndpoint() {
  if (client_endpoint_) return client_endpoint_;
  // Peers answer to this endpoint's name: without net_device the provider picks
  // its address (tcp: the first non-loopback interface, even to reach 127.0.0.1).
  Result<EndpointState*> endpoint = Status::Internal("unset");
  if (!named_ && !options_.net_device.empty()) {
    ASSIGN_OR_RETURN(std::string node, InterfaceAddress(options_.net_device));
    endpoint = AddEndpoint(node.c_str(), "0");
  } else {
    endpoint = AddEndpoint(nullptr, nullptr);
  }
  if (!endpoint.ok()) return endpoint.status();
  client_endpoint_ = *endpoint;
  return client_endpoint_;
}

Result<fi_addr_t> Core::AddressOf(EndpointState* endpoint, const std::vector<std::byte>& name) {
  const std::string key(reinterpret_cast<const char*>(name.data()), name.size());
  auto it = endpoint->addresses.find(key);
  if (it != endpoint->addresses.end()) return it->second;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int rc = fi_av_insert(endpoint->endpoint->av(), name.data(), 1, &addr, 0, nullptr);
  if (rc != 1) return OfiStatus(rc < 0 ? rc : -FI_EADDRNOTAVAIL, "fi_av_insert");
  endpoint->addresses.emplace(key, addr);
  endpoint->names.emplace(addr, key);
  return addr;
}

Result<std::string> Core::Listen(const std::string& address, AcceptHandler on_accept) {
  if (OnThread()) return ListenOnThread(address, std::move(on_accept));
  auto promise = std::make_shared<std::promise<Result<std::string>>>();
  auto future = promise->get_future();
  if (!Post([this, promise, address, a = std::move(on_accept)]() mutable {
        promise->set_value(ListenOnThread(address, std::move(a)));
      })) {
    return Status::FailedPrecondition("ofi transport is shut down");
  }
  return future.get();
}

Result<std::string> Core::ListenOnThread(const std::string& address, AcceptHandler on_accept) {
  if (stopping_) return Status::FailedPrecondition("ofi transport is shut down");
  Result<EndpointState*> endpoint = Status::Internal("unset");
  if (fabric_->info().addr_format == FI_ADDR_STR) {
    // Named endpoints (shm): the address is the name; "" or a ":0" suffix picks one.
    const auto mapped = ShmNameOfHostPort(address);
    std::string name = mapped.value_or(address);
    if (mapped) {
      // A config address is one listener, as a port is for tcp.
      LocalNames& local = Local();
      ReaderMutexLock lock(local.mu);
      for (const auto& live : local.live) {
        if (std::string_view(live.c_str()) == name) {
          return Status::FailedPrecondition("listening on \"" + address + "\": shm name " + name +
                                            " is in use in this process");
        }
      }
    }
    if (name.empty() || name.ends_with(":0")) {
      static std::atomic<uint64_t> counter{0};
      name = (name.empty() ? std::string("deltacast") : name.substr(0, name.size() - 2)) + "-" +
             std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(NewId());
    }
    endpoint = AddEndpoint(name.c_str(), nullptr, /*exact_name=*/mapped.has_value());
  } else {
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return host_port.status();
    const std::string service = std::to_string(host_port->port);
    endpoint = AddEndpoint(host_port->host.c_str(), service.c_str());
  }
  if (!endpoint.ok()) {
    return Status(endpoint.status().code(),
                  "listening on \"" + address + "\": " + endpoint.status().message());
  }
  (*endpoint)->on_accept = std::move(on_accept);
  std::string bound =
      NameToAddress((*endpoint)->endpoint->addr_format(), (*endpoint)->endpoint->name());
  if (bound.empty()) return Status::Internal("ofi: cannot print the bound endpoint name");
  return bound;
}

void Core::Connect(const std::string& address, ConnectHandler on_done) {
  Post([this, address, d = std::move(on_done)]() mutable {
    ConnectOnThread(address, std::move(d));
  });
}

void Core::ConnectOnThread(const std::string& address, ConnectHandler on_done) {
  if (stopping_) return on_done(Status::Aborted("transport shut down"));
  auto endpoint = ClientEndpoint();
  if (!endpoint.ok()) return on_done(endpoint.status());
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if ((*endpoint)->endpoint->addr_format() == FI_ADDR_STR) {
    // What Listen returns for a name; a "host:port" maps as in Listen.
    std::vector<std::byte> name(address.size() + 1);
    std::memcpy(name.data(), address.c_str(), address.size() + 1);
    if (auto mapped = ShmNameOfHostPort(address)) {
      // The listener's endpoint has exactly this name (ListenOnThread).
      name.assign(mapped->size() + 1, std::byte{0});
      std::memcpy(name.data(), mapped->data(), mapped->size());
    }
    auto addr = AddressOf(*endpoint, name);
    if (!addr.ok()) return on_done(Status::Unavailable(addr.status().message()));
    peer = *addr;
  } else {
    auto host_port = ParseHostPort(address);
    if (!host_port.ok()) return on_done(host_port.status());
    const std::string service = std::to_string(host_port->port);
    const int rc = fi_av_insertsvc((*endpoint)->endpoint->av(), host_port->host.c_str(),
                                   service.c_str(), &peer, 0, nullptr);
    if (rc != 1) {
      return on_done(Status::Unavailable(
          OfiStatus(rc < 0 ? rc : -FI_EADDRNOTAVAIL, "resolving " + address).message()));
    }
  }
  const uint32_t id = NewId();
  connects_[id] = PendingConnect{std::move(on_done), address, *endpoint, peer,
                                 Clock::now() + options_.connect_timeout};
  ControlHeader header;
  header.type = ControlType::kConnect;
  header.src_id = id;
  const auto& name = (*endpoint)->endpoint->name();
  SendControl(*endpoint, peer, header, 0, name, id);
}

void Core::FailConnect(uint32_t connect_id, Status status) {
  auto it = connects_.find(connect_id);
  if (it == connects_.end()) return;
  ConnectHandler on_done = std::move(it->second.on_done);
  abandoned_[connect_id] = {it->second.endpoint, it->second.peer, Clock::now()};
  connects_.erase(it);
  // A CONNECT the provider never took would be retried forever: drop it.
  std::vector<Op*> stale;
  for (Op* op : ops_) {
    if (op->connect_id == connect_id) op->connect_id = 0;
  }
  for (auto& [key, queue] : blocked_) {
    for (Op* op : queue) {
      if (op->kind == OpKind::kControlSend && op->connect_id == 0 && op->link_id == 0 &&
          DecodeControl(op->control)->type == ControlType::kConnect) {
        stale.push_back(op);
      }
    }
  }
  for (Op* op : stale) {
    Unblock(op);
    ops_.erase(op);
    FreeOp(op);
  }
  on_done(std::move(status));
}

}  // namespace deltacast::transport::ofi

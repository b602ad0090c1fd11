#include "transport/transport.h"

#include <optional>
#include <utility>

#include "common/thread_annotations.h"
#include "transport/internal/address.h"

namespace deltacast::transport {

Result<HostPort> ParseHostPort(std::string_view address) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("address \"" + std::string(address) + "\": " + std::string(why) +
                                   " (expected host:port or [ipv6]:port)");
  };
  std::string_view host;
  std::string_view port;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    host = address.substr(1, close - 1);
    if (close + 1 >= address.size() || address[close + 1] != ':') return bad("no port");
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    host = address.substr(0, colon);
    if (host.find(':') != std::string_view::npos) return bad("IPv6 hosts need brackets");
    port = address.substr(colon + 1);
  }
  if (host.empty()) return bad("empty host");
  if (port.empty() || port.size() > 5) return bad("bad port");
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return bad("bad port");
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535) return bad("port out of range");
  return HostPort{std::string(host), static_cast<uint16_t>(value)};
}

std::string JoinHostPort(std::string_view host, uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out + ":" + std::to_string(port);
}

std::string_view MemoryTypeName(MemoryType type) {
  switch (type) {
    case MemoryType::kHost:
      return "host";
    case MemoryType::kCudaDevice:
      return "cuda";
  }
  return "unknown";
}

Status Connection::SendRegion(const MemoryRegion& region, SendHandler on_sent) {
  if (region.type != MemoryType::kHost) {
    // No backend built here moves device memory; one that can overrides this.
    return Status::Unsupported(std::string(MemoryTypeName(region.type)) +
                               " memory cannot be sent directly over this connection's backend "
                               "(not in its capabilities().memory_types); stage it through host "
                               "memory");
  }
  if (region.data == nullptr && region.size > 0) {
    return Status::InvalidArgument("host region with no data");
  }
  const auto* bytes = static_cast<const std::byte*>(region.data);
  Send(MakeMessage(std::vector<std::byte>(bytes, bytes + region.size)), std::move(on_sent));
  return Status::Ok();
}

Result<std::unique_ptr<Connection>> ConnectBlocking(Transport& transport,
                                                    const std::string& address,
                                                    std::chrono::milliseconds timeout) {
  // Shared with the handler, which may run after this function gave up.
  struct Waiter {
    Mutex mu;
    CondVar cv;
    std::optional<Result<std::unique_ptr<Connection>>> result GUARDED_BY(mu);
    bool abandoned GUARDED_BY(mu) = false;
  };
  auto waiter = std::make_shared<Waiter>();
  transport.Connect(address, [waiter](Result<std::unique_ptr<Connection>> result) {
    MutexLock lock(waiter->mu);
    if (waiter->abandoned) {
      lock.Unlock();
      return;  // `result` (a late connection) is destroyed here, closing it
    }
    waiter->result.emplace(std::move(result));
    waiter->cv.notify_all();
  });
  MutexLock lock(waiter->mu);
  if (!waiter->cv.wait_for(lock, timeout,
                           [&]() REQUIRES(waiter->mu) { return waiter->result.has_value(); })) {
    waiter->abandoned = true;
    return Status::Timeout("connecting to " + address + ": no answer within " +
                           std::to_string(timeout.count()) + " ms");
  }
  return std::move(*waiter->result);
}

}  // namespace deltacast::transport

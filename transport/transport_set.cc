#include "transport/transport_set.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "transport/internal/address.h"

namespace deltacast::transport {

// One ConnectFirst call: the backends left to try and the errors so far.
struct TransportSet::Attempt {
  std::string host;
  uint16_t base_port = 0;
  std::vector<std::string> backends;
  bool tls = false;
  size_t next = 0;
  std::string errors;
  ConnectFirstHandler on_done;
};

TransportSet::TransportSet(std::vector<Member> members) : members_(std::move(members)) {
  caps_.backend = "set(";
  caps_.memory_types = {MemoryType::kHost};
  caps_.max_message_bytes = UINT64_MAX;
  for (const Member& m : members_) {
    caps_.backend += (&m == &members_.front() ? "" : ",") + m.name;
    caps_.max_message_bytes =
        std::min(caps_.max_message_bytes, m.transport->capabilities().max_message_bytes);
    caps_.ordered = caps_.ordered && m.transport->capabilities().ordered;
  }
  caps_.backend += ")";
}

TransportSet::~TransportSet() { Shutdown(); }

const TransportSet::Member* TransportSet::Find(std::string_view name) const {
  for (const Member& m : members_) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

bool TransportSet::Has(std::string_view name) const { return Find(name) != nullptr; }

std::vector<std::string> TransportSet::Names() const {
  std::vector<std::string> names;
  for (const Member& m : members_) names.push_back(m.name);
  return names;
}

Result<std::string> TransportSet::Listen(const std::string& address, AcceptHandler on_accept) {
  ASSIGN_OR_RETURN(HostPort where, ParseHostPort(address));
  uint16_t base = where.port;
  std::string failures;
  bool any = false;
  for (Member& m : members_) {
    // The handler is shared: accepted links of every backend go to the same place.
    const uint32_t port = base == 0 ? 0 : uint32_t{base} + m.port_offset;
    Result<std::string> bound = Status::InvalidArgument("listen port above 65535");
    if (port <= 65535) {
      bound = m.transport->Listen(JoinHostPort(where.host, static_cast<uint16_t>(port)), on_accept);
    }
    if (!bound.ok()) {
      m.accepting = false;
      const std::string why = m.name + " on " + where.host + ":" + std::to_string(port) + ": " +
                              bound.status().ToString();
      failures += (failures.empty() ? "" : "; ") + why;
      log::Warn("transport: cannot listen over " + why + "; peers fall back to another backend");
      continue;
    }
    any = true;
    if (base == 0) {
      ASSIGN_OR_RETURN(HostPort got, ParseHostPort(*bound));
      base = static_cast<uint16_t>(got.port - m.port_offset);
    }
  }
  if (!any) return Status::Unavailable("no transport can listen: " + failures);
  return JoinHostPort(where.host, base);
}

void TransportSet::Connect(const std::string& address, ConnectHandler on_done) {
  const size_t scheme = address.find("://");
  if (scheme == std::string::npos) return members_.front().transport->Connect(address, on_done);
  const Member* m = Find(std::string_view(address).substr(0, scheme));
  if (m == nullptr) {
    // Never inline: answer through the first member's threads with a connect that
    // fails as a malformed address does.
    const std::string name = address.substr(0, scheme);
    return members_.front().transport->Connect(
        "", [name, on_done](Result<std::unique_ptr<Connection>>) {
          on_done(Status::InvalidArgument("no transport \"" + name + "\" in this set"));
        });
  }
  m->transport->Connect(address.substr(scheme + 3), std::move(on_done));
}

void TransportSet::ConnectFirst(const std::string& host, uint16_t base_port,
                                std::vector<std::string> backends, ConnectFirstHandler on_done,
                                bool tls) {
  auto attempt = std::make_shared<Attempt>();
  attempt->host = host;
  attempt->base_port = base_port;
  attempt->backends = std::move(backends);
  attempt->tls = tls;
  attempt->on_done = std::move(on_done);
  TryNext(attempt);
}

// Dials attempt->backends[next...] until one connects; each failure moves on.
void TransportSet::TryNext(const std::shared_ptr<Attempt>& attempt) {
  while (attempt->next < attempt->backends.size()) {
    const std::string& name = attempt->backends[attempt->next++];
    const Member* m = Find(name);
    if (m == nullptr) {
      attempt->errors += (attempt->errors.empty() ? "" : "; ") + name + ": not enabled here";
      continue;
    }
    if (attempt->tls && name != "tcp") {
      // Only tcp carries TLS; a hop that must be encrypted never falls back to
      // another backend in plaintext.
      attempt->errors += (attempt->errors.empty() ? "" : "; ") + name + ": cannot carry TLS";
      continue;
    }
    const uint32_t port = uint32_t{attempt->base_port} + m->port_offset;
    const std::string address =
        (attempt->tls ? "tls://" : "") + JoinHostPort(attempt->host, static_cast<uint16_t>(port));
    // The set outlives the call: after Shutdown no member's handler runs.
    m->transport->Connect(address,
                          [this, attempt, name, address](Result<std::unique_ptr<Connection>> r) {
                            if (r.ok()) {
                              // A fallback is worth a line; retries that all fail are the caller's
                              // to report.
                              if (!attempt->errors.empty()) {
                                log::Warn("transport: connected to " + address + " over " + name +
                                          " after falling back: " + attempt->errors);
                              }
                              return attempt->on_done(std::move(r), name);
                            }
                            attempt->errors += (attempt->errors.empty() ? "" : "; ") + name + " " +
                                               address + ": " + r.status().ToString();
                            TryNext(attempt);
                          });
    return;
  }
  attempt->on_done(Status::Unavailable("no transport connected to " + attempt->host + ": " +
                                       (attempt->errors.empty() ? "none to try" : attempt->errors)),
                   "");
}

std::vector<std::string> TransportSet::Accepting() const {
  std::vector<std::string> names;
  for (const Member& m : members_) {
    if (m.accepting) names.push_back(m.name);
  }
  return names;
}

void TransportSet::Shutdown() {
  for (Member& m : members_) m.transport->Shutdown();
}

TransportSet* AsTransportSet(Transport* transport) {
  return dynamic_cast<TransportSet*>(transport);
}

}  // namespace deltacast::transport

// "host:port" addresses as deltacast configs and Listen/Connect spell them.
//
// Thread safety: free functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace deltacast::transport {

struct HostPort {
  std::string host;  // name, IPv4 literal or IPv6 literal (without brackets)
  uint16_t port = 0;
};

// Parses "host:port", "[ipv6]:port". The host must be non-empty and the port a
// decimal number in 0..65535; anything else is kInvalidArgument naming the input.
Result<HostPort> ParseHostPort(std::string_view address);

// The inverse: brackets an IPv6 literal ("[::1]:80").
std::string JoinHostPort(std::string_view host, uint16_t port);

}  // namespace deltacast::transport

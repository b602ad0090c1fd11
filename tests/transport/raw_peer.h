// A peer that speaks the tcp transport's framing by hand over a plain socket, the
// way an attacker's script does: it can stop anywhere, announce any frame, and
// connect from any loopback address (127.0.0.2 is not 127.0.0.1 to the listener).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "transport/tcp/frame.h"

namespace deltacast::transport::testutil {

class RawPeer {
 public:
  // Connects from `source_ip` (port chosen by the kernel) to 127.0.0.1:`port`.
  RawPeer(uint16_t port, const std::string& source_ip = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, source_ip.c_str(), &local.sin_addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      Fail();
      return;
    }
    sockaddr_in remote{};
    remote.sin_family = AF_INET;
    remote.sin_port = htons(port);
    remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
      Fail();
      return;
    }
  }
  ~RawPeer() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;

  bool connected() const { return fd_ >= 0; }

  // The transport handshake of a one-stream link; true once the acceptor acked it.
  bool Hello() {
    std::array<std::byte, kFrameHeaderSize + kHelloSize> out{};
    EncodeFrameHeader({FrameType::kHello, kHelloSize, 0},
                      std::span<std::byte, kFrameHeaderSize>(out.data(), kFrameHeaderSize));
    EncodeHello({std::random_device{}(), 0, 1, 0},
                std::span<std::byte, kHelloSize>(out.data() + kFrameHeaderSize, kHelloSize));
    if (!Write(out.data(), out.size())) return false;
    std::array<std::byte, kFrameHeaderSize + kHelloSize> ack{};
    return Read(ack.data(), ack.size(), 2000);
  }
  // A data frame header announcing `length` bytes (sequence = next_sequence_).
  bool AnnounceFrame(uint64_t length) {
    std::array<std::byte, kFrameHeaderSize> header{};
    EncodeFrameHeader({FrameType::kData, length, next_sequence_++}, header);
    return Write(header.data(), header.size());
  }
  bool SendFrame(const std::vector<std::byte>& payload) {
    return AnnounceFrame(payload.size()) && Write(payload.data(), payload.size());
  }
  bool Write(const void* data, size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
      if (n <= 0) return false;
      p += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }
  bool Read(void* data, size_t size, int timeout_ms) {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
      const ssize_t n = ::recv(fd_, p, size, 0);
      if (n <= 0) return false;
      p += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }
  // Whether the listener closed this socket within `timeout_ms` (EOF or reset),
  // reading and discarding whatever it sent first.
  bool ClosedByPeer(int timeout_ms) {
    char buf[4096];
    for (;;) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
  }

 private:
  void Fail() {
    ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  uint64_t next_sequence_ = 0;
};

// Resident memory of this process, from /proc/self/statm.
inline uint64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  std::fclose(f);
  return uint64_t{resident} * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace deltacast::transport::testutil

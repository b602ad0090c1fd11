// S3rver: an s3rver (npm) process for tests, on 127.0.0.1 with a free port and a
// data folder the test owns (docs/object-store.md, "The server in tests").
// scripts/setup installs it into .deps/node; Available() is false without it (or
// without node), and tests then GTEST_SKIP with a message naming scripts/setup.
//
// Thread safety: one thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

namespace deltacast::test_util {

class S3rver {
 public:
  static constexpr const char* kSkipMessage =
      "s3rver is not installed (scripts/setup installs it into .deps/node): object-store test "
      "skipped";
  static std::filesystem::path Script() {
    return std::filesystem::path(DELTACAST_SOURCE_DIR) /
           ".deps/node/node_modules/s3rver/bin/s3rver.js";
  }
  static bool Available() {
    return std::filesystem::exists(Script()) && std::filesystem::exists("/usr/bin/node");
  }

  explicit S3rver(std::filesystem::path dir) : dir_(std::move(dir)) {}
  ~S3rver() { Stop(); }
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  // Starts it (on the port it had, after a Stop) and waits until it accepts
  // connections; false if it does not within 20 s.
  bool Start() {
    if (port_ == 0) port_ = FreePort();
    std::filesystem::create_directories(dir_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string script = Script().string(), dir = dir_.string(),
                        port = std::to_string(port_);
      ::execl("/usr/bin/node", "node", script.c_str(), "-d", dir.c_str(), "-a", "127.0.0.1", "-p",
              port.c_str(), "-s", "--no-vhost-buckets", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (Accepts()) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // Kills it (SIGKILL: as a crash) and reaps it; the data folder stays.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::filesystem::path& dir() const { return dir_; }
  // Where s3rver keeps an object's bytes (its file store).
  std::filesystem::path ObjectFile(const std::string& bucket, const std::string& key) const {
    return dir_ / bucket / (key + "._S3rver_object");
  }

 private:
  static int FreePort() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  bool Accepts() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }

  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace deltacast::test_util

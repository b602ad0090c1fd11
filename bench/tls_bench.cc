// TLS against plaintext on tcp links, loopback: what encrypting a hop costs.
//
// Each point runs the receiver in a forked child (two processes, as two nodes
// would be) over a fresh link: the sender keeps --window-bytes queued (the relay's
// credit window) until --bytes have gone, the receiver answers when it has them
// all. Per-core figures are bytes over the CPU seconds each process used for the
// transfer (user + system, from getrusage), which other load on this shared
// machine inflates less than wall time. Also: the time to set up a link (Connect
// to accepted, TLS handshake and the transport's hello included), median of 20.
//
// Usage: deltacast_bench_tls [--sizes 1MiB,4MiB,16MiB] [--bytes 1GiB]
//        [--window-bytes 32MiB] [--out FILE]
#include <fmt/core.h>
#include <openssl/crypto.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "topology/units.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tls_certs.h"

namespace dc = deltacast;
namespace fs = std::filesystem;
using dc::bench::Clock;
using dc::bench::CpuSeconds;
using dc::bench::Seconds;
using nlohmann::json;

namespace {

struct Result {
  double wall_seconds = 0;
  double sender_cpu = 0;
  double receiver_cpu = 0;
};

std::unique_ptr<dc::transport::Transport> Make(const fs::path& certs, const std::string& node,
                                               bool tls) {
  dc::transport::TcpOptions options;
  if (tls)
    options.tls =
        dc::transport::TlsFiles{certs / "ca.crt", certs / (node + ".crt"), certs / (node + ".key")};
  auto t = dc::transport::MakeTcpTransport(options);
  if (!t.ok()) {
    fmt::print(stderr, "{}\n", t.status().ToString());
    std::exit(1);
  }
  return std::move(*t);
}

// Child: listens, reports its port on `out`, receives `total` bytes, reports its
// CPU seconds for them, exits.
[[noreturn]] void Receive(const fs::path& certs, bool tls, uint64_t total, int out) {
  auto server = Make(certs, "server", tls);
  std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<dc::transport::Connection> link;
  std::atomic<uint64_t> received{0};
  auto bound = server->Listen("127.0.0.1:0", [&](std::unique_ptr<dc::transport::Connection> c) {
    std::lock_guard lock(mu);
    link = std::move(c);
    cv.notify_all();
  });
  const uint16_t port = static_cast<uint16_t>(std::stoi(bound->substr(bound->rfind(':') + 1)));
  (void)!::write(out, &port, sizeof port);
  for (;;) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return link != nullptr; });
    }
    double cpu0 = CpuSeconds();
    link->Authenticated();
    link->Start(
        [&](dc::transport::Message m) {
          if (received.fetch_add(m->size()) + m->size() >= total) {
            const double cpu = CpuSeconds() - cpu0;
            const uint8_t done = 1;
            (void)!::write(out, &done, 1);
            (void)!::write(out, &cpu, sizeof cpu);
            received = 0;
            cpu0 = CpuSeconds();
          }
        },
        [](dc::Status) {});
    std::unique_lock lock(mu);
    cv.wait(lock);  // until the parent kills us
  }
}

Result Throughput(const fs::path& certs, bool tls, uint64_t size, uint64_t total, uint64_t window) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) std::exit(1);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    Receive(certs, tls, total, pipe_fds[1]);
  }
  ::close(pipe_fds[1]);
  uint16_t port = 0;
  (void)!::read(pipe_fds[0], &port, sizeof port);
  auto client = Make(certs, "client", tls);
  auto link = dc::transport::ConnectBlocking(
      *client, std::string(tls ? "tls://" : "") + "127.0.0.1:" + std::to_string(port),
      std::chrono::seconds(10));
  if (!link.ok()) {
    fmt::print(stderr, "{}\n", link.status().ToString());
    std::exit(1);
  }
  (*link)->Authenticated();
  (*link)->Start([](dc::transport::Message) {}, [](dc::Status) {});
  auto message = dc::transport::MakeMessage(std::vector<std::byte>(size, std::byte{0x5a}));
  const uint64_t count = (total + size - 1) / size;
  const uint64_t in_flight = std::max<uint64_t>(1, window / size);
  std::atomic<uint64_t> sent{0};
  std::function<void(dc::Status)> next;
  dc::transport::Connection* c = link->get();
  next = [&](dc::Status) {
    if (sent.fetch_add(1) < count) c->Send(message, next);
  };
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < in_flight && i < count; ++i) {
    sent.fetch_add(1);
    c->Send(message, next);
  }
  uint8_t done = 0;
  Result r;
  (void)!::read(pipe_fds[0], &done, 1);
  (void)!::read(pipe_fds[0], &r.receiver_cpu, sizeof r.receiver_cpu);
  r.wall_seconds = Seconds(t0);
  r.sender_cpu = CpuSeconds() - cpu0;
  (*link)->Close();
  link->reset();
  client->Shutdown();
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(pipe_fds[0]);
  return r;
}

double SetupSeconds(const fs::path& certs, bool tls) {
  auto server = Make(certs, "server", tls);
  auto client = Make(certs, "client", tls);
  std::mutex mu;
  std::condition_variable cv;
  int accepted = 0;
  auto bound = server->Listen("127.0.0.1:0", [&](std::unique_ptr<dc::transport::Connection>) {
    std::lock_guard lock(mu);
    ++accepted;
    cv.notify_all();
  });
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    auto link = dc::transport::ConnectBlocking(*client, (tls ? "tls://" : "") + *bound,
                                               std::chrono::seconds(10));
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return accepted > i; });
    times.push_back(Seconds(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("TLS against plaintext on tcp links, loopback");
  std::string sizes_text = "1MiB,4MiB,16MiB", bytes_text = "1GiB", window_text = "32MiB";
  std::string out_path;
  app.add_option("--sizes", sizes_text)->capture_default_str();
  app.add_option("--bytes", bytes_text, "Bytes sent per point")->capture_default_str();
  app.add_option("--window-bytes", window_text)->capture_default_str();
  app.add_option("--out", out_path, "Write the JSON here too");
  CLI11_PARSE(app, argc, argv);
  const uint64_t total = *dc::topology::ParseSize(bytes_text);
  const uint64_t window = *dc::topology::ParseSize(window_text);
  std::vector<uint64_t> sizes;
  std::stringstream ss(sizes_text);
  for (std::string s; std::getline(ss, s, ',');) sizes.push_back(*dc::topology::ParseSize(s));

  const fs::path certs =
      fs::temp_directory_path() / ("deltacast-tls-bench-" + std::to_string(::getpid()));
  if (auto w = dc::transport::WriteClusterCertificates(certs, {"server", "client"}); !w.ok()) {
    fmt::print(stderr, "{}\n", w.status().ToString());
    return 1;
  }
  json points = json::array();
  for (uint64_t size : sizes) {
    json point{{"message_bytes", size}, {"bytes", total}};
    for (const bool tls : {false, true}) {
      const Result r = Throughput(certs, tls, size, total, window);
      const json figures{{"wall_seconds", r.wall_seconds},
                         {"gb_per_s", double(total) / r.wall_seconds / 1e9},
                         {"sender_cpu_seconds", r.sender_cpu},
                         {"receiver_cpu_seconds", r.receiver_cpu},
                         {"sender_gb_per_cpu_s", double(total) / r.sender_cpu / 1e9},
                         {"receiver_gb_per_cpu_s", double(total) / r.receiver_cpu / 1e9}};
      point[tls ? "tls" : "plaintext"] = figures;
      fmt::print(stderr,
                 "{:>9} {:<9} {:6.2f} GB/s  sender {:5.2f} GB/cpu-s  receiver {:5.2f} GB/cpu-s\n",
                 dc::topology::FormatSize(size), tls ? "tls" : "plaintext",
                 double(total) / r.wall_seconds / 1e9, double(total) / r.sender_cpu / 1e9,
                 double(total) / r.receiver_cpu / 1e9);
    }
    point["tls_over_plaintext_wall"] =
        point["tls"]["gb_per_s"].get<double>() / point["plaintext"]["gb_per_s"].get<double>();
    points.push_back(point);
  }
  const double plain_setup = SetupSeconds(certs, false), tls_setup = SetupSeconds(certs, true);
  json report{{"benchmark", "tls"},
              {"openssl", OpenSSL_version(OPENSSL_VERSION)},
              {"cipher_suite_preferred", "TLS_AES_128_GCM_SHA256"},
              {"window_bytes", window},
              {"points", points},
              {"link_setup_seconds", {{"plaintext", plain_setup}, {"tls", tls_setup}}}};
  std::error_code ec;
  fs::remove_all(certs, ec);
  const std::string text = report.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

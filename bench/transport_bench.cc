// Transport benchmark: throughput and per-hop latency of each deltacast backend on
// loopback, for chunk-sized messages, next to the peer tools on the same provider:
// iperf3 (tcp), ucx_perftest ucp_am_bw / ucp_am_lat (ucx), fi_pingpong (ofi).
//
// Every point runs the receiver in a forked child process (as the peer tools do: two
// processes, each with its own progress thread), over a fresh connection:
//   throughput: the sender keeps --window-bytes queued (32 MiB: the relay's default
//               credit window, 8 chunks of 4 MiB), i.e. max(1, window / size)
//               messages, the next Send issued from an on_sent handler; the receiver
//               answers once it has all of them; bytes / (first Send -> that answer).
//   latency:    ping-pong of one message of the size; one-way = round trip / 2.
// Peer tools run with the same size. ucx_perftest's "MB/s" is MiB/s; fi_pingpong's
// MB/sec is 10^6 B/s and its usec/xfer is one way. fi_pingpong is a ping-pong
// (one message in flight), so it is compared with our ping-pong, not our window.
//
// Usage: deltacast_bench_transport [--backends tcp,ucx:tcp,ucx:shm,ofi:tcp;ofi_rxm,ofi:shm]
//        [--sizes 1MiB,4MiB,16MiB] [--bytes 256MiB] [--window-bytes 32MiB] [--out FILE]
#include <fmt/core.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/bytes.h"
#include "topology/units.h"
#include "transport/factory.h"

namespace dc = deltacast;
using dc::bench::Clock;
using dc::bench::Seconds;
using nlohmann::json;

namespace {

struct BackendSpec {
  std::string name;      // tcp, ucx, ofi
  std::string provider;  // "" = library's choice
  std::string Label() const { return provider.empty() ? name : name + ":" + provider; }
};

BackendSpec ParseSpec(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return {text, ""};
  return {text.substr(0, colon), text.substr(colon + 1)};
}

std::unique_ptr<dc::transport::Transport> Make(const BackendSpec& spec) {
  dc::transport::TransportOptions options;
  options.provider = spec.provider;
  options.net_device = "lo";  // a loopback benchmark: nothing leaves lo
  auto t = dc::transport::MakeTransport(spec.name, options);
  if (!t.ok()) {
    fmt::print(stderr, "transport bench: {}: {}\n", spec.Label(), t.status().ToString());
    return nullptr;
  }
  return std::move(t).value();
}

// The first message of a connection tells the receiver what to do.
enum class Mode : uint8_t { kThroughput = 1, kPingPong = 2 };

std::vector<std::byte> Command(Mode mode, uint64_t count) {
  std::vector<std::byte> out(9);
  out[0] = std::byte(mode);
  dc::StoreLE<uint64_t>(out.data() + 1, count);
  return out;
}

// A waitable counter for handlers running on transport threads.
class Signal {
 public:
  void Add(uint64_t n = 1) {
    std::lock_guard lock(mu_);
    count_ += n;
    cv_.notify_all();
  }
  bool WaitFor(uint64_t n, std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
};

// The receiver, in the child: accepts one connection and serves its command.
[[noreturn]] void ServeOnce(const BackendSpec& spec, int address_pipe) {
  auto transport = Make(spec);
  if (!transport) _exit(2);
  std::unique_ptr<dc::transport::Connection> link;
  Signal accepted, finished;
  std::mutex mu;
  auto address =
      transport->Listen("127.0.0.1:0", [&](std::unique_ptr<dc::transport::Connection> c) {
        std::lock_guard lock(mu);
        if (!link) {
          link = std::move(c);
          accepted.Add();
        }
      });
  if (!address.ok()) _exit(3);
  const std::string line = *address + "\n";
  if (write(address_pipe, line.data(), line.size()) != ssize_t(line.size())) _exit(4);
  close(address_pipe);
  if (!accepted.WaitFor(1, std::chrono::seconds(30))) _exit(5);
  Mode mode{};
  uint64_t expected = 0, received = 0;
  dc::transport::Connection* c = link.get();
  c->Start(
      [&, c](dc::transport::Message m) {
        if (expected == 0) {
          mode = Mode(std::to_integer<uint8_t>((*m)[0]));
          expected = dc::LoadLE<uint64_t>(m->data() + 1);
          return;
        }
        ++received;
        if (mode == Mode::kPingPong) {
          c->Send(m);  // echo the very buffer
        } else if (received == expected) {
          c->Send(dc::transport::MakeMessage(std::vector<std::byte>(1)));
        }
      },
      [&](dc::Status) { finished.Add(); });
  finished.WaitFor(1, std::chrono::seconds(300));
  transport->Shutdown();
  _exit(0);
}

// Forks the receiver; returns its pid and the address it listens on.
std::pair<pid_t, std::string> StartReceiver(const BackendSpec& spec) {
  int fds[2];
  if (pipe(fds) != 0) return {-1, ""};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    ServeOnce(spec, fds[1]);
  }
  close(fds[1]);
  std::string address;
  char ch;
  while (read(fds[0], &ch, 1) == 1 && ch != '\n') address += ch;
  close(fds[0]);
  return {pid, address};
}

void StopReceiver(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

struct Point {
  bool ok = false;
  double value = 0;  // bytes/s or seconds
  std::string error;
};

// One connection to a fresh receiver; `body` runs the measurement on it.
template <typename Body>
Point WithLink(const BackendSpec& spec, Body body) {
  auto [pid, address] = StartReceiver(spec);
  if (pid <= 0 || address.empty()) {
    if (pid > 0) StopReceiver(pid);
    return {false, 0, "the receiver did not start"};
  }
  Point point;
  {
    auto transport = Make(spec);
    if (!transport) {
      StopReceiver(pid);
      return {false, 0, "cannot make the sender's transport"};
    }
    auto link = dc::transport::ConnectBlocking(*transport, address, std::chrono::seconds(20));
    if (!link.ok()) {
      point = {false, 0, link.status().ToString()};
    } else {
      point = body(**link);
      (*link)->Close();
    }
    transport->Shutdown();
  }
  StopReceiver(pid);
  return point;
}

Point Throughput(const BackendSpec& spec, uint64_t size, uint64_t count, int window) {
  return WithLink(spec, [&](dc::transport::Connection& link) {
    Signal answered;
    link.Start([&](dc::transport::Message) { answered.Add(); }, [](dc::Status) {});
    const auto payload = dc::transport::MakeMessage(std::vector<std::byte>(size, std::byte{7}));
    std::atomic<uint64_t> issued{0};
    std::atomic<bool> failed{false};
    // Each completion issues the next message: `window` stay queued.
    std::function<void(dc::Status)> next = [&](dc::Status s) {
      if (!s.ok()) failed = true;
      if (failed || issued.fetch_add(1) >= count) return;
      link.Send(payload, next);
    };
    link.Send(dc::transport::MakeMessage(Command(Mode::kThroughput, count)));
    const auto t0 = Clock::now();
    for (int i = 0; i < window && issued.fetch_add(1) < count; ++i) link.Send(payload, next);
    if (!answered.WaitFor(1, std::chrono::seconds(300)) || failed) {
      return Point{false, 0, "no answer from the receiver"};
    }
    return Point{true, double(size * count) / Seconds(t0), ""};
  });
}

Point Latency(const BackendSpec& spec, uint64_t size, uint64_t iterations) {
  return WithLink(spec, [&](dc::transport::Connection& link) {
    Signal echoed;
    link.Start([&](dc::transport::Message) { echoed.Add(); }, [](dc::Status) {});
    const auto payload = dc::transport::MakeMessage(std::vector<std::byte>(size, std::byte{7}));
    link.Send(dc::transport::MakeMessage(Command(Mode::kPingPong, iterations + 1)));
    link.Send(payload);  // warm-up round
    if (!echoed.WaitFor(1, std::chrono::seconds(60))) return Point{false, 0, "no echo"};
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < iterations; ++i) {
      link.Send(payload);
      if (!echoed.WaitFor(i + 2, std::chrono::seconds(60))) return Point{false, 0, "no echo"};
    }
    return Point{true, Seconds(t0) / double(2 * iterations), ""};
  });
}

// ---- peer tools ------------------------------------------------------------------

// Runs `server` in the background and `client` in the foreground in one shell;
// returns the client's stdout.
std::string RunPair(const std::string& server, const std::string& client) {
  const std::string script = "(" + server + ") >/dev/null 2>&1 & sleep 1; " + client +
                             " 2>/dev/null; kill $! 2>/dev/null; wait";
  const std::string cmd = "sh -c '" + script + "'";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return "";
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  pclose(pipe);
  return out;
}

int PeerPort() {
  static int port = 20000 + (getpid() % 5000) * 2;
  return port += 3;
}

// UCX_TLS for ucx_perftest (which exchanges addresses out of band, so shm needs no
// sockaddr transport).
std::string UcxEnv(const std::string& provider) {
  std::string tls = provider.empty() ? "all" : provider == "shm" ? "sm,self" : provider;
  return "UCX_TLS=" + tls + " UCX_NET_DEVICES=lo";
}

// The "Final:" row of ucx_perftest: column 6 is the overall bandwidth (MiB/s),
// column 4 the overall latency (usec).
std::optional<std::vector<double>> UcxFinal(const std::string& out) {
  const size_t at = out.find("Final:");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream row(out.substr(at + 6));
  std::vector<double> v(8);
  for (double& x : v) {
    if (!(row >> x)) return std::nullopt;
  }
  return v;
}

json PeerUcx(const std::string& provider, uint64_t size, uint64_t count) {
  json j = {{"tool", "ucx_perftest"}};
  for (const char* test : {"ucp_am_bw", "ucp_am_lat"}) {
    const std::string args =
        fmt::format("-t {} -s {} -n {} -p {}", test, size,
                    std::string(test).ends_with("bw") ? count : 50, PeerPort());
    const std::string env = UcxEnv(provider);
    const std::string out =
        RunPair(env + " ucx_perftest " + args, env + " ucx_perftest 127.0.0.1 " + args);
    auto final_row = UcxFinal(out);
    if (!final_row) {
      j[test] = {{"ok", false},
                 {"output_tail", out.substr(out.size() > 300 ? out.size() - 300 : 0)}};
      continue;
    }
    if (std::string(test).ends_with("bw")) {
      j[test] = {{"ok", true}, {"bytes_per_second", (*final_row)[5] * 1048576.0}};
    } else {
      j[test] = {{"ok", true}, {"one_way_seconds", (*final_row)[3] * 1e-6}};
    }
    j[test]["command"] = env + " ucx_perftest [127.0.0.1] " + args;
  }
  return j;
}

json PeerFiPingpong(const std::string& provider, uint64_t size) {
  const int port = PeerPort();
  const std::string prov = provider.empty() ? "tcp;ofi_rxm" : provider;
  const std::string args = fmt::format("-p \"{}\" -e rdm -S {} -I 50", prov, size);
  // Loopback only, as our own transports (net_device "lo"): tcp's RDM endpoints
  // otherwise bind the first external interface.
  const std::string env = "FI_TCP_IFACE=lo";
  const std::string out =
      RunPair(fmt::format("{} fi_pingpong {} -B {}", env, args, port),
              fmt::format("{} fi_pingpong {} -P {} 127.0.0.1", env, args, port));
  // "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec": the data row follows.
  std::regex row(R"((\S+)\s+(\d+)\s+=?(\d+)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+))");
  std::smatch m;
  json j = {{"tool", "fi_pingpong"},
            {"command", env + " fi_pingpong " + args + " [-P port 127.0.0.1]"}};
  if (!std::regex_search(out, m, row)) {
    j["ok"] = false;
    j["output_tail"] = out.substr(out.size() > 300 ? out.size() - 300 : 0);
    return j;
  }
  j["ok"] = true;
  j["pingpong_bytes_per_second"] = std::stod(m[6]) * 1e6;
  j["one_way_seconds"] = std::stod(m[7]) * 1e-6;
  return j;
}

// iperf3 writes at most 1 MiB per call; on a byte stream the write size is all that
// differs, so larger messages are compared with 1 MiB writes.
json PeerIperf(uint64_t size) {
  size = std::min<uint64_t>(size, 1 << 20);
  const int port = PeerPort();
  const std::string out =
      RunPair(fmt::format("iperf3 -s -1 -p {}", port),
              fmt::format("iperf3 -c 127.0.0.1 -p {} -l {} -t 3 -J", port, size));
  const json doc = json::parse(out, nullptr, false);
  json j = {{"tool", "iperf3"}, {"command", fmt::format("iperf3 -c 127.0.0.1 -l {} -t 3", size)}};
  if (doc.is_discarded() || !doc.contains("end") || !doc["end"].contains("sum_received")) {
    j["ok"] = false;
    return j;
  }
  j["ok"] = true;
  j["bytes_per_second"] = doc["end"]["sum_received"]["bits_per_second"].get<double>() / 8;
  return j;
}

double Ratio(double ours, const json& peer, const char* key) {
  if (!peer.value("ok", false) || !peer.contains(key)) return 0;
  const double theirs = peer[key].get<double>();
  return theirs > 0 ? ours / theirs : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"deltacast transport benchmark"};
  std::vector<std::string> backends = {"tcp", "ucx:tcp", "ucx:shm", "ofi:tcp;ofi_rxm", "ofi:shm"};
  std::vector<std::string> size_texts = {"1MiB", "4MiB", "16MiB"};
  std::string bytes_text = "256MiB";
  std::string window_text = "32MiB";
  int latency_iterations = 30;
  bool peers = true;
  std::string out_path;
  app.add_option("--backends", backends, "backend[:provider] list")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--sizes", size_texts, "Message sizes")->delimiter(',')->capture_default_str();
  app.add_option("--bytes", bytes_text, "Bytes per throughput point")->capture_default_str();
  app.add_option("--window-bytes", window_text, "Bytes queued in the throughput run")
      ->capture_default_str();
  app.add_option("--latency-iterations", latency_iterations, "Ping-pong rounds")
      ->capture_default_str();
  app.add_flag("!--no-peers", peers, "Skip the peer tools");
  app.add_option("--out", out_path, "Also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  auto window_bytes = dc::topology::ParseSize(window_text);
  if (!window_bytes.ok()) {
    fmt::print(stderr, "--window-bytes: {}\n", window_bytes.status().ToString());
    return 2;
  }
  auto total = dc::topology::ParseSize(bytes_text);
  if (!total.ok()) {
    fmt::print(stderr, "--bytes: {}\n", total.status().ToString());
    return 2;
  }
  std::vector<uint64_t> sizes;
  for (const auto& t : size_texts) {
    auto s = dc::topology::ParseSize(t);
    if (!s.ok() || *s == 0) {
      fmt::print(stderr, "--sizes: bad size \"{}\"\n", t);
      return 2;
    }
    sizes.push_back(*s);
  }
  signal(SIGPIPE, SIG_IGN);

  json results = json::array();
  for (const std::string& text : backends) {
    const BackendSpec spec = ParseSpec(text);
    for (uint64_t size : sizes) {
      const uint64_t count = std::max<uint64_t>(8, *total / size);
      const int window = static_cast<int>(std::max<uint64_t>(1, *window_bytes / size));
      const Point bw = Throughput(spec, size, count, window);
      const Point lat = Latency(spec, size, latency_iterations);
      json r = {{"backend", spec.name},
                {"provider", spec.provider},
                {"message_bytes", size},
                {"messages", count},
                {"window", window}};
      r["throughput"] = bw.ok ? json{{"bytes_per_second", bw.value}} : json{{"error", bw.error}};
      r["latency"] = lat.ok ? json{{"one_way_seconds", lat.value},
                                   {"pingpong_bytes_per_second", double(size) / lat.value}}
                            : json{{"error", lat.error}};
      if (peers) {
        if (spec.name == "tcp") {
          r["peer"] = PeerIperf(size);
          if (bw.ok && r["peer"]["ok"]) {
            r["throughput_ratio"] = Ratio(bw.value, r["peer"], "bytes_per_second");
          }
        } else if (spec.name == "ucx") {
          r["peer"] = PeerUcx(spec.provider, size, std::min<uint64_t>(count, 200));
          if (bw.ok && r["peer"]["ucp_am_bw"].value("ok", false)) {
            r["throughput_ratio"] = Ratio(bw.value, r["peer"]["ucp_am_bw"], "bytes_per_second");
          }
          if (lat.ok && r["peer"]["ucp_am_lat"].value("ok", false)) {
            r["latency_ratio"] = Ratio(lat.value, r["peer"]["ucp_am_lat"], "one_way_seconds");
          }
        } else if (spec.name == "ofi") {
          r["peer"] = PeerFiPingpong(spec.provider, size);
          if (lat.ok && r["peer"]["ok"]) {
            r["pingpong_ratio"] =
                Ratio(double(size) / lat.value, r["peer"], "pingpong_bytes_per_second");
          }
        }
      }
      fmt::print(stderr, "{:<18} {:>9} B  throughput {:>9.1f} MB/s  one-way {:>8.3f} ms{}\n",
                 spec.Label(), size, bw.ok ? bw.value / 1e6 : 0.0, lat.ok ? lat.value * 1e3 : 0.0,
                 r.contains("throughput_ratio")
                     ? fmt::format("  vs peer {:.2f}", r["throughput_ratio"].get<double>())
                 : r.contains("pingpong_ratio") ? fmt::format("  ping-pong vs fi_pingpong {:.2f}",
                                                              r["pingpong_ratio"].get<double>())
                                                : std::string());
      results.push_back(std::move(r));
    }
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const json doc = {
      {"benchmark", "transport"},
      {"window_bytes", *window_bytes},
      {"host", host},
      {"cores", std::thread::hardware_concurrency()},
      {"method",
       "receiver in a forked child, fresh connection per point; throughput = bytes / time from "
       "the first send to the receiver's answer after the last message, window_bytes / size "
       "messages queued (at least 1); "
       "latency = ping-pong round trip / 2; ratios = ours / peer tool on the same provider "
       "(latency_ratio > 1 means slower)"},
      {"results", results}};
  const std::string text = doc.dump(2);
  fmt::print("{}\n", text);
  if (!out_path.empty()) std::ofstream(out_path) << text << "\n";
  return 0;
}

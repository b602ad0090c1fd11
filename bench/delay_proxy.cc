// A userspace TCP delay proxy: the one-way latency of a WAN link, which this
// machine's kernel cannot add (no netem). Each --map listens on an address and
// forwards every connection to a target, holding the bytes of each direction for
// DELAY ms before writing them on (bandwidth is shaped elsewhere, by tc). Used by
// scripts/bench-regions between network namespaces.
//
// Usage: deltacast_delay_proxy --map LISTEN_IP:PORT=TARGET_IP:PORT/DELAY_MS ...
//   [--stats FILE]  (on SIGTERM/SIGINT, JSON of the bytes forwarded per map)
#include <utility>  // before Asio (TOOLCHAIN-NOTES)

#include <boost/asio.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadBytes = 64 << 10;
constexpr size_t kMaxHeldBytes = 64 << 20;  // per direction: then reading pauses

struct Map {
  tcp::endpoint listen, target;
  std::chrono::milliseconds delay{0};
  uint64_t bytes_to_target = 0, bytes_to_client = 0;
  std::string text;
};

tcp::endpoint Endpoint(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) throw std::runtime_error("no port in '" + s + "'");
  return {asio::ip::make_address(s.substr(0, colon)),
          static_cast<unsigned short>(std::stoi(s.substr(colon + 1)))};
}

Map ParseMap(const std::string& text) {
  const auto eq = text.find('=');
  const auto slash = text.rfind('/');
  if (eq == std::string::npos || slash == std::string::npos || slash < eq)
    throw std::runtime_error("--map wants LISTEN=TARGET/DELAY_MS, got '" + text + "'");
  Map m;
  m.listen = Endpoint(text.substr(0, eq));
  m.target = Endpoint(text.substr(eq + 1, slash - eq - 1));
  m.delay = std::chrono::milliseconds(std::stoi(text.substr(slash + 1)));
  m.text = text;
  return m;
}

// One direction of one connection: read, hold each piece until its time, write.
class Pump : public std::enable_shared_from_this<Pump> {
 public:
  Pump(std::shared_ptr<tcp::socket> from, std::shared_ptr<tcp::socket> to,
       std::chrono::milliseconds delay, uint64_t* counter)
      : from_(std::move(from)), to_(std::move(to)), delay_(delay), counter_(counter),
        timer_(from_->get_executor()) {}

  void Start() { Read(); }

 private:
  struct Piece {
    Clock::time_point due;
    std::vector<char> bytes;
  };

  void Read() {
    if (reading_ || held_ > kMaxHeldBytes || done_) return;
    reading_ = true;
    auto buffer = std::make_shared<std::vector<char>>(kReadBytes);
    from_->async_read_some(asio::buffer(*buffer), [self = shared_from_this(), buffer](
                                                      boost::system::error_code ec, size_t n) {
      self->reading_ = false;
      if (ec) {
        self->done_ = true;  // the writer closes the other side once what is held is out
        if (self->queue_.empty() && !self->writing_) self->Finish();
        return;
      }
      buffer->resize(n);
      self->held_ += n;
      self->queue_.push_back({Clock::now() + self->delay_, std::move(*buffer)});
      self->Schedule();
      self->Read();
    });
  }

  void Schedule() {
    if (writing_ || queue_.empty()) return;
    writing_ = true;
    timer_.expires_at(queue_.front().due);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code) {
      asio::async_write(*self->to_, asio::buffer(self->queue_.front().bytes),
                        [self](boost::system::error_code ec, size_t n) {
                          self->writing_ = false;
                          if (ec) {
                            self->Finish();
                            return;
                          }
                          *self->counter_ += n;
                          self->held_ -= n;
                          self->queue_.pop_front();
                          if (self->queue_.empty() && self->done_) return self->Finish();
                          self->Schedule();
                          self->Read();
                        });
    });
  }

  void Finish() {
    boost::system::error_code ignored;
    to_->shutdown(tcp::socket::shutdown_send, ignored);
    from_->shutdown(tcp::socket::shutdown_receive, ignored);
  }

  std::shared_ptr<tcp::socket> from_, to_;
  std::chrono::milliseconds delay_;
  uint64_t* counter_;
  asio::steady_timer timer_;
  std::deque<Piece> queue_;
  size_t held_ = 0;
  bool reading_ = false, writing_ = false, done_ = false;
};

void Accept(tcp::acceptor& acceptor, Map& map) {
  acceptor.async_accept([&acceptor, &map](boost::system::error_code ec, tcp::socket socket) {
    if (!ec) {
      auto client = std::make_shared<tcp::socket>(std::move(socket));
      auto target = std::make_shared<tcp::socket>(acceptor.get_executor());
      // A local port of its own (bind, then connect): connect() alone may give two
      // connections to different targets one port, and scripts/bench-regions tells
      // WAN flows apart by the proxy's port.
      boost::system::error_code bind_ec;
      target->open(map.target.protocol(), bind_ec);
      if (!bind_ec) target->bind(tcp::endpoint(map.target.protocol(), 0), bind_ec);
      // On an error `client` is dropped here, closed: the dialler sees a refusal.
      if (!bind_ec) {
        target->async_connect(map.target, [client, target, &map](boost::system::error_code ec) {
          if (ec) return;  // dropping `client` closes it: the dialler sees a refusal
          client->set_option(tcp::no_delay(true));
          target->set_option(tcp::no_delay(true));
          std::make_shared<Pump>(client, target, map.delay, &map.bytes_to_target)->Start();
          std::make_shared<Pump>(target, client, map.delay, &map.bytes_to_client)->Start();
        });
      }
    }
    Accept(acceptor, map);
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Map> maps;
  std::string stats;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--map" && i + 1 < argc) {
        maps.push_back(ParseMap(argv[++i]));
      } else if (arg == "--stats" && i + 1 < argc) {
        stats = argv[++i];
      } else {
        throw std::runtime_error("unknown argument '" + arg + "'");
      }
    }
    if (maps.empty()) throw std::runtime_error("no --map given");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltacast_delay_proxy: %s\nusage: %s --map LISTEN_IP:PORT=TARGET_IP:PORT/DELAY_MS ... [--stats FILE]\n",
                 e.what(), argv[0]);
    return 2;
  }
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;
  for (auto& map : maps) {
    auto acceptor = std::make_unique<tcp::acceptor>(io);
    acceptor->open(map.listen.protocol());
    acceptor->set_option(tcp::acceptor::reuse_address(true));
    boost::system::error_code ec;
    acceptor->bind(map.listen, ec);
    if (ec) {
      std::fprintf(stderr, "deltacast_delay_proxy: cannot listen on %s: %s\n",
                   map.text.c_str(), ec.message().c_str());
      return 1;
    }
    acceptor->listen();
    Accept(*acceptor, map);
    acceptors.push_back(std::move(acceptor));
  }
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int) { io.stop(); });
  io.run();
  if (!stats.empty()) {
    std::ofstream out(stats);
    out << "[";
    for (size_t i = 0; i < maps.size(); ++i) {
      out << (i ? ",\n" : "\n") << "{\"map\":\"" << maps[i].text
          << "\",\"bytes_to_target\":" << maps[i].bytes_to_target
          << ",\"bytes_to_client\":" << maps[i].bytes_to_client << "}";
    }
    out << "\n]\n";
  }
  return 0;
}

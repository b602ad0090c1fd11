// Links this node refused, kept until their REFUSE is out so the peer learns why
// (closing at once aborts the queued send, transport.h), but not forever: a peer that
// reads nothing is closed at its deadline. Downstream's refused children and
// ParentLink's refused parents. Everything runs on the owner's EventLoop thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "common/event_loop.h"
#include "relay/wire/protocol.h"
#include "transport/transport.h"

namespace deltacast::relay {

class RefusingLinks {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  explicit RefusingLinks(EventLoop& loop) : loop_(loop) {}
  RefusingLinks(const RefusingLinks&) = delete;
  RefusingLinks& operator=(const RefusingLinks&) = delete;

  // Sends `refuse` on `connection`; closes it once that is out, or at `deadline`.
  void Refuse(std::unique_ptr<transport::Connection> connection, const relay::Refuse& refuse,
              TimePoint deadline) {
    transport::Connection* link = connection.get();
    links_.push_back({std::move(connection), deadline});
    link->Send(transport::MakeMessage(EncodeRefuse(refuse)), [this, link](Status) {
      loop_.Post([this, link] {
        auto it = std::find_if(links_.begin(), links_.end(),
                               [&](const Refusing& r) { return r.connection.get() == link; });
        if (it == links_.end()) return;
        it->connection->Close();
        links_.erase(it);
      });
    });
  }

  // Closes the links whose REFUSE is not out by `now`, telling `on_expired` of each.
  void Expire(TimePoint now, const std::function<void(transport::Connection&)>& on_expired = {}) {
    std::erase_if(links_, [&](Refusing& r) {
      if (now < r.deadline) return false;
      if (on_expired) on_expired(*r.connection);
      r.connection->Close();
      return true;
    });
  }

  void CloseAll() {
    for (auto& r : links_) r.connection->Close();
    links_.clear();
  }

 private:
  struct Refusing {
    std::unique_ptr<transport::Connection> connection;
    TimePoint deadline;
  };
  EventLoop& loop_;
  std::vector<Refusing> links_;
};

}  // namespace deltacast::relay

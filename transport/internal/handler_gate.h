// HandlerGate: lets a connection's destructor promise that none of its user
// handlers runs after it returns.
//
// Every user handler is invoked through Run(); Close() makes later Run() calls no-ops
// and waits until handlers already running on other threads return. A handler that
// destroys its own connection calls Close() from inside Run(): Close() does not wait
// for the calling thread's own handler, which finishes after Close() returns.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace deltacast::transport {

class HandlerGate {
 public:
  // Runs fn() unless the gate is closed; returns whether it ran.
  template <typename F>
  bool Run(F&& fn) {
    {
      std::lock_guard lock(mu_);
      if (closed_) return false;
      running_.push_back(std::this_thread::get_id());
    }
    struct Leave {
      HandlerGate* gate;
      ~Leave() { gate->Exit(); }
    } leave{this};
    std::forward<F>(fn)();
    return true;
  }

  // Blocks until no handler runs on another thread; later Run() calls do nothing.
  void Close() {
    const std::thread::id self = std::this_thread::get_id();
    std::unique_lock lock(mu_);
    closed_ = true;
    cv_.wait(lock, [&] {
      return std::all_of(running_.begin(), running_.end(),
                         [&](std::thread::id id) { return id == self; });
    });
  }

  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }

 private:
  void Exit() {
    std::lock_guard lock(mu_);
    running_.erase(std::find(running_.begin(), running_.end(), std::this_thread::get_id()));
    cv_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<std::thread::id> running_;  // one entry per handler now running
};

}  // namespace deltacast::transport

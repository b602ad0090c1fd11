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
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"

namespace deltacast::transport {

class HandlerGate {
 public:
  // Runs fn() unless the gate is closed; returns whether it ran.
  template <typename F>
  bool Run(F&& fn) {
    {
      MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    closed_ = true;
    cv_.wait(lock, [&]() REQUIRES(mu_) {
      return std::all_of(running_.begin(), running_.end(),
                         [&](std::thread::id id) { return id == self; });
    });
  }

  bool closed() const {
    MutexLock lock(mu_);
    return closed_;
  }

 private:
  void Exit() {
    MutexLock lock(mu_);
    running_.erase(std::find(running_.begin(), running_.end(), std::this_thread::get_id()));
    cv_.notify_all();
  }

  mutable Mutex mu_;
  CondVar cv_;
  bool closed_ GUARDED_BY(mu_) = false;
  std::vector<std::thread::id> running_ GUARDED_BY(mu_);  // one entry per handler now running
};

}  // namespace deltacast::transport

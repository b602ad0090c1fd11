// PollBackoff: how long a bucket bridge half waits before asking the bucket again
// for an object it expects (docs/object-store.md, "Polling"). At `base` for a while
// after news (Reset: an object arrived, or the protocol step that makes one due,
// such as PREPARED written, so a decision is next); then each empty poll doubles the
// wait up to `max`. On a real S3 every poll is a billed request; this keeps an idle
// bridge to a few a second and the refit's own steps at `base`.
//
// Thread safety: none (one per poll loop, on the bridge's event loop).
#pragma once

#include <algorithm>
#include <chrono>

namespace deltacast::relay::internal {

class PollBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  // How long polls stay at `base` after news: long enough for the next protocol
  // step across a WAN (a few round trips), short next to the time between refits.
  static constexpr std::chrono::milliseconds kHot{2000};

  PollBackoff(std::chrono::milliseconds base, std::chrono::milliseconds max)
      : base_(base), max_(std::max(base, max)), wait_(base_) {}

  void Reset(Clock::time_point now) {
    news_ = now;
    wait_ = base_;
  }
  // The wait before the next poll, when the one made at `now` found nothing new.
  std::chrono::milliseconds Next(Clock::time_point now) {
    if (now - news_ < kHot) return base_;
    wait_ = std::min(max_, wait_ * 2);
    return wait_;
  }

 private:
  const std::chrono::milliseconds base_, max_;
  std::chrono::milliseconds wait_;
  Clock::time_point news_ = Clock::now();
};

}  // namespace deltacast::relay::internal

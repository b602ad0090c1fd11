// SecondsSince: how long ago `t` was, in seconds, on the clock `t` was read from.
// RuntimeClock by default (simulated time under the simulator, steady_clock
// elsewhere); code that times itself on steady_clock names it.
//
// Thread safety: pure.
#pragma once

#include <chrono>

#include "common/runtime.h"

namespace deltacast {

template <class Clock = RuntimeClock>
double SecondsSince(typename Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace deltacast

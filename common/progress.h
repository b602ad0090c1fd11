// Progress: a progress bar for long work (synth, diff, publish, catch-up), one line
// redrawn in place on a terminal:
//
//   encode   [##########..........]  52%  498.0/958.0 MiB  412.3 MiB/s  ETA 1s
//
// It draws only where a person watches: ForTerminal gives a Progress that is off
// unless stderr is a terminal (and the caller did not ask for JSON), so pipes, logs
// and --json output never see it. Redraws are rate-limited (at most one per
// `min_interval`; updates in between cost an atomic add), the line is cleared before
// a log line is written (common/log.cc calls WithTerminalLine), and it draws with
// plain "\r" and ANSI erase-line, nothing beyond what any terminal understands.
//
// Thread safety: Add, Set and SetTotal may be called from any thread at once; a
// redraw runs on whichever thread is due, never two at once. Finish and the
// destructor must not race with updates from other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/thread_annotations.h"

namespace deltacast::progress {

enum class Unit {
  kBytes,  // shown as KiB, MiB, GiB, with a rate
  kItems,  // shown as counts of `item_name`
};

struct Options {
  std::string label;   // what is being done: "encode", "synth"
  uint64_t total = 0;  // 0: unknown (no bar, no percentage, no ETA)
  Unit unit = Unit::kBytes;
  std::string item_name;  // kItems: "partitions", "steps"
  std::chrono::milliseconds min_interval{100};
  int width = 80;  // columns the line may use (the terminal's, for ForTerminal)
};

class Progress {
 public:
  using Sink = std::function<void(std::string_view)>;
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // Draws on stderr, or does nothing when `enabled` is false or stderr is not a
  // terminal. Never null.
  static std::unique_ptr<Progress> ForTerminal(Options options, bool enabled = true);
  // The same for a byte count labelled `label`.
  static std::unique_ptr<Progress> ForTerminal(std::string_view label, bool enabled = true);

  // Draws through `sink` (each call gets the text to write: "\r", the line, an
  // erase-to-end-of-line; Finish adds "\n"); an empty sink makes it a no-op.
  // `clock` (default: steady_clock) paces the redraws and the rate, both counted
  // from the first update.
  Progress(Options options, Sink sink, Clock clock = {});
  ~Progress();  // Finish()

  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return static_cast<bool>(sink_); }

  void Add(uint64_t n);
  void Set(uint64_t done);
  void SetTotal(uint64_t total);
  // Draws the final state (its rate and time as of the last update) and ends the
  // line, if anything was drawn; later updates are ignored. Idempotent.
  void Finish();

  // The line for `done` of `total` after `seconds` (no "\r", at most
  // options.width - 1 columns).
  static std::string Render(const Options& options, uint64_t done, uint64_t total, double seconds);

 private:
  void MaybeDraw();
  // Nanoseconds from the start (which the first call sets) to `now`.
  int64_t SinceStart(std::chrono::steady_clock::time_point now);

  Options options_;
  Sink sink_;
  Clock clock_;
  // The first update's time (the work's start, not the bar's), in clock ticks since
  // the clock's epoch; kNotStarted before it.
  static constexpr int64_t kNotStarted = INT64_MIN;
  std::atomic<int64_t> start_ns_{kNotStarted};
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> total_;
  std::atomic<int64_t> next_draw_ns_{0};    // since the start; earliest next redraw
  std::atomic<int64_t> last_update_ns_{0};  // since the start
  std::atomic<bool> finished_{false};
  Mutex draw_mu_;
  bool drawn_ GUARDED_BY(draw_mu_) = false;  // guarded by draw_mu_
};

// Runs `write` (which writes whole lines to stderr) with any progress line on the
// terminal cleared first; the bar is drawn again at its next update. What
// common/log.cc wraps every log line in. Thread-safe.
void WithTerminalLine(const std::function<void()>& write);

}  // namespace deltacast::progress

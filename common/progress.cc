#include "common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/thread_annotations.h"

namespace deltacast::progress {
namespace {

// The stderr line shared by every bar drawn on the terminal and the log.
Mutex g_terminal_mu;
bool g_line_drawn GUARDED_BY(g_terminal_mu) = false;  // guarded by g_terminal_mu
std::atomic<int> g_terminal_bars{0};                  // bars drawing on stderr now

void WriteStderr(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

int TerminalWidth() {
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col >= 20) return size.ws_col;
  return 80;
}

std::string Fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// A binary unit for `bytes`: its scale and name.
std::pair<double, const char*> ByteUnit(double bytes) {
  if (bytes >= double(uint64_t{1} << 30)) return {double(uint64_t{1} << 30), "GiB"};
  if (bytes >= double(uint64_t{1} << 20)) return {double(uint64_t{1} << 20), "MiB"};
  if (bytes >= 1024) return {1024.0, "KiB"};
  return {1.0, "B"};
}

std::string Bytes(double bytes) {
  const auto [scale, unit] = ByteUnit(bytes);
  return Fixed(bytes / scale, scale == 1.0 ? 0 : 1) + " " + unit;
}

std::string Duration(double seconds) {
  if (seconds < 9.95) return Fixed(std::max(seconds, 0.0), 1) + "s";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return std::to_string(s) + "s";
  const int64_t m = s / 60;
  std::string out = std::to_string(m) + "m";
  if (m < 60) return out + (s % 60 < 10 ? "0" : "") + std::to_string(s % 60) + "s";
  return std::to_string(m / 60) + "h" + (m % 60 < 10 ? "0" : "") + std::to_string(m % 60) + "m";
}

int64_t Nanos(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

std::unique_ptr<Progress> Progress::ForTerminal(Options options, bool enabled) {
  Sink sink;
  if (enabled && ::isatty(STDERR_FILENO)) {
    options.width = TerminalWidth();
    sink = [](std::string_view text) {
      MutexLock lock(g_terminal_mu);
      WriteStderr(text);
      g_line_drawn = !text.ends_with('\n');
    };
  }
  return std::make_unique<Progress>(std::move(options), std::move(sink));
}

std::unique_ptr<Progress> Progress::ForTerminal(std::string_view label, bool enabled) {
  Options options;
  options.label = std::string(label);
  return ForTerminal(std::move(options), enabled);
}

Progress::Progress(Options options, Sink sink, Clock clock)
    : options_(std::move(options)),
      sink_(std::move(sink)),
      clock_(clock ? std::move(clock) : [] { return std::chrono::steady_clock::now(); }),
      total_(options_.total) {
  if (sink_) g_terminal_bars.fetch_add(1);
}

Progress::~Progress() {
  Finish();
  if (sink_) g_terminal_bars.fetch_sub(1);
}

void Progress::Add(uint64_t n) {
  if (!sink_) return;
  done_.fetch_add(n, std::memory_order_relaxed);
  MaybeDraw();
}

void Progress::Set(uint64_t done) {
  if (!sink_) return;
  done_.store(done, std::memory_order_relaxed);
  MaybeDraw();
}

void Progress::SetTotal(uint64_t total) {
  if (!sink_) return;
  total_.store(total, std::memory_order_relaxed);
  MaybeDraw();
}

void Progress::Finish() {
  if (!sink_ || finished_.load()) return;
  MutexLock lock(draw_mu_);
  if (finished_.exchange(true)) return;
  if (!drawn_) return;  // nothing on the terminal to complete (it failed early, or was quick)
  // The rate and time of the work itself, up to its last update, not of whatever the
  // caller did before it called Finish.
  const double seconds = double(last_update_ns_.load()) / 1e9;
  sink_("\r" + Render(options_, done_.load(), total_.load(), seconds) + "\x1b[K\n");
}

void Progress::MaybeDraw() {
  if (finished_.load(std::memory_order_relaxed)) return;
  const auto now = clock_();
  const int64_t since_start = SinceStart(now);
  last_update_ns_.store(since_start, std::memory_order_relaxed);
  if (since_start < next_draw_ns_.load(std::memory_order_relaxed)) return;
  // One redraw at a time; an update that finds one under way skips its own.
  if (!draw_mu_.try_lock()) return;
  MutexLock lock(draw_mu_, std::adopt_lock);
  if (finished_.load()) return;
  if (since_start < next_draw_ns_.load()) return;
  next_draw_ns_.store(since_start + Nanos(options_.min_interval));
  const double seconds = double(since_start) / 1e9;
  sink_("\r" + Render(options_, done_.load(), total_.load(), seconds) + "\x1b[K");
  drawn_ = true;
}

int64_t Progress::SinceStart(std::chrono::steady_clock::time_point now) {
  const int64_t ns = Nanos(now.time_since_epoch());
  int64_t start = kNotStarted;
  if (start_ns_.compare_exchange_strong(start, ns)) return 0;
  return ns - start;
}

std::string Progress::Render(const Options& options, uint64_t done, uint64_t total,
                             double seconds) {
  if (total > 0) done = std::min(done, total);
  std::string amounts;
  double rate = seconds > 0 ? double(done) / seconds : 0;
  if (options.unit == Unit::kBytes) {
    if (total > 0) {
      const auto [scale, unit] = ByteUnit(double(total));
      const int decimals = scale == 1.0 ? 0 : 1;
      amounts = Fixed(double(done) / scale, decimals) + "/" +
                Fixed(double(total) / scale, decimals) + " " + unit;
    } else {
      amounts = Bytes(double(done));
    }
    if (seconds > 0 && done > 0) amounts += "  " + Bytes(rate) + "/s";
  } else {
    amounts = std::to_string(done) + (total > 0 ? "/" + std::to_string(total) : "");
    if (!options.item_name.empty()) amounts += " " + options.item_name;
  }
  std::string tail;
  if (total > 0 && done >= total) {
    tail = "  in " + Duration(seconds);
  } else if (total > 0 && done > 0 && rate > 0) {
    tail = "  ETA " + Duration(double(total - done) / rate);
  }
  std::string label = options.label;
  if (label.size() < 8) label.resize(8, ' ');
  std::string line = label;
  const std::string right = "  " + amounts + tail;
  if (total > 0) {
    const uint64_t percent = done * 100 / total;
    const std::string pct = (percent < 10    ? "  "
                             : percent < 100 ? " "
                                             : "") +
                            std::to_string(percent) + "%";
    // The figures' usual width is kept free, so the bar does not jump as they grow.
    const int room = options.width - 1 - int(label.size()) - 4 - int(pct.size()) -
                     std::max(int(right.size()), 42);
    const int bar = std::min(room, 40);
    if (bar >= 10) {
      const int filled = static_cast<int>(double(done) / double(total) * bar);
      line += " [" + std::string(filled, '#') + std::string(bar - filled, '.') + "]";
    }
    line += " " + pct;
  }
  line += right;
  if (options.width > 1 && line.size() > size_t(options.width - 1)) line.resize(options.width - 1);
  return line;
}

void WithTerminalLine(const std::function<void()>& write) {
  if (g_terminal_bars.load(std::memory_order_relaxed) == 0) {
    write();
    return;
  }
  MutexLock lock(g_terminal_mu);
  if (g_line_drawn) {
    WriteStderr("\r\x1b[K");
    g_line_drawn = false;
  }
  write();
}

}  // namespace deltacast::progress

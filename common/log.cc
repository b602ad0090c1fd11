#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include "common/progress.h"

namespace deltacast::log {
namespace {

std::atomic<bool> g_json{false};

spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("deltacast");
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    return l;
  }();
  return *logger;
}

std::string JsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// A line never holds a control character: whatever a caller forgot to Escape
// cannot break it in two.
std::string WithoutControls(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void Write(spdlog::level::level_enum level, std::string_view raw) {
  auto& logger = Logger();
  if (!logger.should_log(level)) return;
  const std::string message = WithoutControls(raw);
  // A progress bar on the terminal is cleared first, so the line stays whole.
  progress::WithTerminalLine([&] {
    if (g_json.load(std::memory_order_relaxed)) {
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      logger.log(level, "{{\"ts_us\":{},\"level\":\"{}\",\"msg\":\"{}\"}}",
                 std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
                 spdlog::level::to_string_view(level), JsonEscape(message));
    } else {
      logger.log(level, "{}", message);
    }
  });
}

}  // namespace

std::string Escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20 || u >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void SetLevel(Level level) {
  static constexpr spdlog::level::level_enum kMap[] = {spdlog::level::debug, spdlog::level::info,
                                                       spdlog::level::warn, spdlog::level::err,
                                                       spdlog::level::off};
  Logger().set_level(kMap[static_cast<int>(level)]);
}

void SetJson(bool json) {
  g_json = json;
  Logger().set_pattern(json ? "%v" : "%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
}

void Debug(std::string_view m) { Write(spdlog::level::debug, m); }
void Info(std::string_view m) { Write(spdlog::level::info, m); }
void Warn(std::string_view m) { Write(spdlog::level::warn, m); }
void Error(std::string_view m) { Write(spdlog::level::err, m); }

}  // namespace deltacast::log

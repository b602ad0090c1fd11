// Process-wide logging. A thin front over spdlog, kept out of this header so that
// widely included code does not pay spdlog's compile time.
//
// Thread safety: all functions are thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace deltacast::log {

enum class Level { kDebug, kInfo, kWarn, kError, kOff };

void SetLevel(Level level);
// One JSON object per line ({"ts":..,"level":..,"msg":..}) instead of text.
void SetJson(bool json);

// `s` with every byte outside printable ASCII written as \xNN and '\' as "\\": how
// a string a peer chose (a node id, a reason, a tensor name, file contents) goes
// into a log line, so it can neither start a forged line nor send terminal escapes.
// Every line is also stripped of control characters when written (defense in
// depth), but only Escape keeps the result unambiguous.
std::string Escape(std::string_view s);

void Debug(std::string_view message);
void Info(std::string_view message);
void Warn(std::string_view message);
void Error(std::string_view message);

}  // namespace deltacast::log

// Process-wide logging. A thin front over spdlog, kept out of this header so that
// widely included code does not pay spdlog's compile time.
//
// Thread safety: all functions are thread-safe.
#pragma once

#include <string_view>

namespace deltacast::log {

enum class Level { kDebug, kInfo, kWarn, kError, kOff };

void SetLevel(Level level);
// One JSON object per line ({"ts":..,"level":..,"msg":..}) instead of text.
void SetJson(bool json);

void Debug(std::string_view message);
void Info(std::string_view message);
void Warn(std::string_view message);
void Error(std::string_view message);

}  // namespace deltacast::log

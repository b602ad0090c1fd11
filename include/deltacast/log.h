// Where deltacast's log lines go: stderr, one line each, at this level or above
// (default: info).
//
// Thread safety: thread-safe; takes effect for lines logged after the call.
#pragma once

namespace deltacast {

enum class LogLevel { kDebug, kInfo, kWarn, kError, kOff };
void SetLogLevel(LogLevel level);

}  // namespace deltacast

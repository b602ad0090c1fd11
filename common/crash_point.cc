#include "common/crash_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace deltacast {
namespace {

struct Target {
  std::string name;
  long count = 1;
};

// NAME or NAME:N from `variable`; nullptr when unset. Never freed: read once.
const Target* Parse(const char* variable) {
  const char* env = std::getenv(variable);
  if (!env || !*env) return nullptr;
  auto* t = new Target;
  std::string spec(env);
  const auto colon = spec.rfind(':');
  if (colon != std::string::npos) {
    t->count = std::max(1L, std::strtol(spec.c_str() + colon + 1, nullptr, 10));
    spec.resize(colon);
  }
  t->name = spec;
  return t;
}

const Target* Configured() {
  static const Target* target = Parse("DELTACAST_CRASH_AT");
  return target;
}

std::atomic<CrashPointHandler> handler{nullptr};
std::atomic<void*> handler_context{nullptr};

}  // namespace

void InstallCrashPointHandler(CrashPointHandler h, void* context) {
  handler_context.store(context, std::memory_order_relaxed);
  handler.store(h, std::memory_order_relaxed);
}

void CrashPoint(std::string_view name) {
  if (CrashPointHandler h = handler.load(std::memory_order_relaxed)) {
    h(name, handler_context.load(std::memory_order_relaxed));
  }
  const Target* target = Configured();
  if (!target || name != target->name) return;
  static std::atomic<long> passes{0};
  if (++passes < target->count) return;
  // What a crash leaves behind: whatever reached the page cache, nothing else.
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);
}

bool FaultPoint(std::string_view name) {
  static const Target* target = Parse("DELTACAST_FAULT_AT");
  if (!target || name != target->name) return false;
  static std::atomic<long> passes{0};
  return ++passes == target->count;
}

}  // namespace deltacast

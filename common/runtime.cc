#include "common/runtime.h"

#include <atomic>

namespace deltacast {
namespace {
std::atomic<Runtime*> installed{nullptr};
}  // namespace

Runtime* SimRuntime() { return installed.load(std::memory_order_relaxed); }
void InstallSimRuntime(Runtime* runtime) { installed.store(runtime); }

}  // namespace deltacast

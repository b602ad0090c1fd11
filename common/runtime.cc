#include "common/runtime.h"

#include <atomic>
#include <random>

namespace deltacast {
namespace {
std::atomic<Runtime*> installed{nullptr};
}  // namespace

Runtime* SimRuntime() { return installed.load(std::memory_order_relaxed); }
void InstallSimRuntime(Runtime* runtime) { installed.store(runtime); }

uint64_t RuntimeRandomId() {
  Runtime* sim = SimRuntime();
  std::random_device system;
  uint64_t id = 0;
  while (id == 0) id = sim ? sim->Random64() : (uint64_t{system()} << 32) ^ system();
  return id;
}

}  // namespace deltacast

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
  uint64_t id = 0;
  if (Runtime* sim = SimRuntime()) {
    while (id == 0) id = sim->Random64();
    return id;
  }
  std::random_device system;  // opened only outside the simulator
  while (id == 0) id = (uint64_t{system()} << 32) ^ system();
  return id;
}

}  // namespace deltacast

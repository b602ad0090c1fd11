#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace deltacast {

size_t DefaultThreadCount() { return std::max(1u, std::thread::hardware_concurrency()); }

void ParallelFor(size_t count, size_t threads, const std::function<void(size_t)>& fn) {
  threads = std::clamp<size_t>(threads, 1, std::max<size_t>(count, 1));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  std::vector<std::jthread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
}

}  // namespace deltacast

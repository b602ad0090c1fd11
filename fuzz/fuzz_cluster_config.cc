// The cluster config parser (TOML via toml++, then validation and tree planning):
// every agent reads it before anything else.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "topology/cluster_config.h"
#include "topology/tree_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = deltacast::topology::ParseClusterConfig(text, "fuzz.toml");
  if (config.ok()) (void)deltacast::topology::PlanTree(*config);
  return 0;
}

// The cluster config parser (TOML via toml++, then validation, tree and stripe planning):
// every agent reads it before anything else. A config it accepts must also explain
// (`deltacast config --explain`), and what explain writes must parse back to the
// same effective config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "topology/cluster_config.h"
#include "topology/config_explain.h"
#include "topology/stripe_plan.h"
#include "topology/tree_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace topology = deltacast::topology;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = topology::ParseClusterConfig(text, "/fuzz/fuzz.toml");
  if (!config.ok()) return 0;
  auto tree = topology::PlanTree(*config);
  auto striped = topology::PlanStripes(*config);
  // One stripe is the single tree itself.
  if (tree.ok() && striped.ok() && striped->stripes.size() == 1 &&
      striped->Fingerprint() != tree->Fingerprint()) {
    std::abort();
  }
  auto explained =
      topology::ExplainClusterConfig(text, "/fuzz/fuzz.toml", topology::ExplainFormat::kToml);
  if (!explained.ok()) std::abort();  // it parsed once
  auto again =
      topology::ExplainClusterConfig(*explained, "/fuzz/fuzz.toml", topology::ExplainFormat::kToml);
  if (!again.ok()) std::abort();  // explain wrote something the parser refuses
  (void)topology::ExplainClusterConfig(text, "/fuzz/fuzz.toml", topology::ExplainFormat::kJson);
  return 0;
}

#include "sim/shrink.h"

namespace deltacast::sim {

Shrunk ShrinkFaults(const Scenario& scenario, RunResult failing, int max_runs) {
  Shrunk out;
  out.result = std::move(failing);
  bool progress = true;
  while (progress && out.runs < max_runs) {
    progress = false;
    for (size_t k = 0; k < scenario.faults.size() && out.runs < max_runs; ++k) {
      if (out.dropped.count(k)) continue;
      RunOptions options;
      options.drop_faults = out.dropped;
      options.drop_faults.insert(k);
      RunResult r = RunScenario(scenario, options);
      ++out.runs;
      if (!r.ok()) {
        out.dropped = options.drop_faults;
        out.result = std::move(r);
        progress = true;
      }
    }
  }
  return out;
}

}  // namespace deltacast::sim

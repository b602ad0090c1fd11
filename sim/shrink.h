// Shrinking a failing schedule: leaves faults out one at a time and keeps each
// removal after which the run still fails, until no single fault can go.
#pragma once

#include <set>

#include "sim/run.h"

namespace deltacast::sim {

struct Shrunk {
  std::set<size_t> dropped;  // faults left out
  RunResult result;          // of the smallest failing schedule
  int runs = 0;
};

// `failing` is the result of the full schedule (must have failed).
Shrunk ShrinkFaults(const Scenario& scenario, RunResult failing, int max_runs = 64);

}  // namespace deltacast::sim

// A root killed mid-refit while the nodes hold part of the delta, restarted, and
// the same delta streamed again numbered otherwise (deltacast_sim --restream;
// docs/protocol.md, "Chunk identity"): every checker passes, and the nodes did
// meet the lost stream's chunks (they rolled them back rather than take their
// sequence numbers for the new stream's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "sim/run.h"
#include "sim/scenario.h"

namespace deltacast::sim {
namespace {

const bool kShm = [] {
  if (::access("/dev/shm", W_OK) == 0) ::setenv("TMPDIR", "/dev/shm", /*overwrite=*/0);
  return true;
}();

Scenario Restream(uint64_t seed, double intensity) {
  Scenario s = DrawScenario(seed, intensity, /*disk=*/true, /*outages=*/true, /*producers=*/false,
                            /*staged=*/true, /*snapshots=*/true);
  s.restream = true;
  return s;
}

TEST(SimRestreamTest, ARootKilledMidRefitAndRestreamedEndsBitExactEverywhere) {
  uint64_t restreams = 0, rollbacks = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    // Without other faults: every kill lands after the data chunks, with every node up.
    const RunResult r = RunScenario(Restream(seed, 0));
    ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << r.failures.front();
    restreams += r.restreams;
    rollbacks += r.stream_rollbacks;
  }
  EXPECT_GT(restreams, 0u);
  EXPECT_GT(rollbacks, 0u) << "no node held part of a lost stream when it was streamed again";
}

TEST(SimRestreamTest, UnderTheSeedsFaultsToo) {
  uint64_t restreams = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const RunResult r = RunScenario(Restream(seed, 1.0));
    ASSERT_TRUE(r.ok()) << "seed " << seed << ": " << r.failures.front();
    restreams += r.restreams;
  }
  EXPECT_GT(restreams, 0u);
}

}  // namespace
}  // namespace deltacast::sim

// The simulator's runs with producers (sim/trainer.h): the delta comes from four
// ranks through the root's checks and merge. A correct trainer commits every
// publish bit-exact; each trainer fault (a stale or corrupt previous shard, a rank
// that claims another's rows) is refused at the root before anything is sent, and
// the run's checkers stay green. docs/simulation.md says at which seed the bit-exact
// checker finds each fault when the root's checks are reverted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <set>

#include "sim/run.h"
#include "sim/scenario.h"

namespace deltacast::sim {
namespace {

const bool kShm = [] {
  if (::access("/dev/shm", W_OK) == 0) ::setenv("TMPDIR", "/dev/shm", /*overwrite=*/0);
  return true;
}();

TEST(SimTrainerTest, ProducersWithoutFaultsCommitEveryPublishBitExact) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Scenario s = DrawScenario(seed, 0, true, true, /*producers=*/true);
    ASSERT_EQ(s.producers, 4);
    const RunResult r = RunScenario(s);
    EXPECT_TRUE(r.ok()) << "seed " << seed << ": " << r.failures.front();
    EXPECT_EQ(r.trainer_faults, 0u);
    if (s.late.empty()) {
      EXPECT_EQ(r.committed, r.publishes) << "seed " << seed;
    }
  }
}

TEST(SimTrainerTest, EveryKindOfTrainerFaultIsRefusedAtTheRootUnderNetworkFaults) {
  std::set<TrainerFaultKind> seen;
  for (uint64_t seed = 1; seed <= 40 && seen.size() < 3; ++seed) {
    const Scenario s = DrawScenario(seed, 1.0, true, true, /*producers=*/true);
    const RunResult r = RunScenario(s);
    EXPECT_TRUE(r.ok()) << "seed " << seed << ": " << r.failures.front();
    EXPECT_EQ(r.trainer_refused, r.trainer_faults) << "seed " << seed;
    for (const TrainerFault& f : s.trainer_faults) {
      if (f.kind != TrainerFaultKind::kNone) seen.insert(f.kind);
    }
  }
  EXPECT_EQ(seen.size(), 3u) << "not every kind of trainer fault was drawn";
}

}  // namespace
}  // namespace deltacast::sim
